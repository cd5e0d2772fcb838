"""Compiled, chunked batch evaluation of the rigid-body algorithms.

Eager PyTorch pays a fixed cost per operation and, at large batches, streams every intermediate
through memory. ``torch.compile`` fuses the batch-last elementwise code into a few loops, and
cutting a large batch into cache-sized chunks keeps the working set in cache. Each chunk has the
same shape (the last one is padded), so one compiled graph serves every batch size at or above the
chunk size. Measured figures are in BENCHMARKS.md.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..errors import ShapeError
from ..model.robot import RobotModel
from .aba import forward_dynamics_flat
from .crba import crba_flat
from .rnea import rnea_flat

__all__ = ["compiled"]

_ALGORITHMS = {
    "forward_dynamics": (3, lambda m, q, v, u: forward_dynamics_flat(m, q, v, u)),
    "inverse_dynamics": (3, lambda m, q, v, u: rnea_flat(m, q, v, u)),
    "mass_matrix": (1, lambda m, q: crba_flat(m, q)),
}


def compiled(
    model: RobotModel,
    algorithm: str = "forward_dynamics",
    *,
    chunk: int | None = 1024,
    compile: bool = True,
    **compile_options,
) -> Callable[..., Tensor]:
    """A compiled function evaluating ``algorithm`` on flat batches.

    Args:
        model: the robot (its parameters are read at every call, so learnable parameters work).
        algorithm: ``"forward_dynamics"`` (``f(q, v, tau) -> qdd``), ``"inverse_dynamics"``
            (``f(q, v, a) -> tau``) or ``"mass_matrix"`` (``f(q) -> M``).
        chunk: batch rows per compiled call; larger batches are split (the last piece padded), so
            one graph is compiled. ``None`` compiles each batch size as it comes.
        compile: ``False`` keeps the chunking but runs eagerly (for comparison and debugging).
        **compile_options: passed to ``torch.compile`` (default ``dynamic=False``).

    Returns:
        A function of flat ``(B, n)`` tensors returning ``(B, nv)`` (``(B, nv, nv)`` for the mass
        matrix). The first call for a new shape compiles (tens of seconds on CPU).
    """
    if algorithm not in _ALGORITHMS:
        raise ShapeError(f"compiled: unknown algorithm '{algorithm}'; choose from {sorted(_ALGORITHMS)}")
    n_args, fn = _ALGORITHMS[algorithm]
    sizes = [model.nq, model.nv, model.nv][:n_args]
    compile_options.setdefault("dynamic", False)

    def body(*args: Tensor) -> Tensor:
        return fn(model, *args)

    run = torch.compile(body, **compile_options) if compile else body

    def call(*args: Tensor) -> Tensor:
        if len(args) != n_args:
            raise ShapeError(f"compiled {algorithm}: expected {n_args} tensors, got {len(args)}")
        for name, t, n in zip(("q", "v", "u"), args, sizes):
            if t.dim() != 2 or t.shape[1] != n:
                raise ShapeError(f"compiled {algorithm}: '{name}' must have shape (B, {n}), got {tuple(t.shape)}")
        B = args[0].shape[0]
        if chunk is None or B <= chunk:
            return run(*args)
        outs = []
        for start in range(0, B, chunk):
            part = [t[start:start + chunk] for t in args]
            rows = part[0].shape[0]
            if rows < chunk:  # pad with copies of the last row so the compiled shape is reused
                part = [torch.cat([t, t[-1:].expand(chunk - rows, -1)]) for t in part]
                outs.append(run(*part)[:rows])
            else:
                outs.append(run(*part))
        return torch.cat(outs)

    return call
