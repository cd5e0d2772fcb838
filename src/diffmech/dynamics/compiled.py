"""Compiled batch evaluation of the rigid-body algorithms, with a compiled backward.

Without a graph (``torch.no_grad()``, or inputs that need no gradient), on the CPU, the algorithm
runs as a native kernel: its lane program (:mod:`.lanes`: the per-state algorithm on ``(B,)``
lanes, body-local frames) compiled to C by :mod:`.native` -- one vectorised loop over the batch
with every intermediate in registers, any batch size, a few seconds to build, cached on disk.
Measured on the iiwa (float64, 2 threads, BENCHMARKS.md): inverse dynamics 7.2x and forward
dynamics 6.2x the states per second of Pinocchio's batch API at 16384 states, 3.8x and 2.9x at 1024. Forward dynamics
with gradients w.r.t. ``(q, v, tau)`` only (no learnable model parameter) runs natively too: its
backward is the kernel of ABA's reverse mode (:func:`.native.vjp_program`), which recomputes the
forward pass per state in registers, so only the inputs are saved.

Other gradients (inverse dynamics, mass matrix, learnable parameters, devices other than the CPU)
use torch.compile: it fuses the batch-last elementwise code of :mod:`.aba` and :mod:`.rnea` into a
few loops, and cutting a large batch into cache-sized chunks keeps the working set in cache. Each
chunk has the same shape (the last one is padded), so one compiled graph serves every batch size at
or above the chunk size. For forward dynamics with no learnable model parameter (without native
kernels), the compiled forward also returns ABA's articulated-body factors and kinematics, and
the compiled backward is ``M^{-1}`` from the factors plus the hand-written RNEA VJP
(:mod:`.rnea_vjp`). Otherwise a differentiable call runs the compiled function with autograd on,
so torch.compile traces the joint forward-backward graph once per pattern of inputs that need a
gradient; when the value is already known (a rollout replaying a recorded step), the backward is a
separate compiled ``torch.func.vjp`` of the algorithm.
The model's parameters enter as the :class:`~diffmech.model.robot.ModelTensors` fields, computed
eagerly outside the compiled region (so learnable parameters and their parametrizations keep their
ordinary autograd graph), and the compiled VJP returns the cotangents of those fields.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..errors import OptionError, ShapeError
from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from ._common import RigidInertia, TreeState, world_inertia
from .aba import _aba, aba_flat, apply_inverse_mass, factor_tensors, factors_from
from .crba import crba_flat
from .lanes import aba_lanes, crba_lanes, rnea_lanes
from .native import LaneKernel, NativeUnavailable, vjp_program
from .rnea import rnea_flat
from .rnea_vjp import rnea_vjp_bl

__all__ = ["compiled", "CompiledDynamics", "DEFAULT_CHUNK"]

# Rows per compiled call. Measured on the iiwa at batch 16384 (float64, 2 threads, separate processes
# with diffmech.perf.tune_allocator): forward dynamics 1024 rows 544k-634k states/s, 2048 rows
# 743k-839k, 4096 rows 573k; inverse dynamics 807k (1024) vs 878k (2048).
DEFAULT_CHUNK = 2048


def _fd(tree, mt, passive, q, v, u):
    return aba_flat(tree, mt, q, v, u, None, passive)


def _id(tree, mt, passive, q, v, a):
    return rnea_flat(tree, mt, q, v, a, None, passive)


def _mm(tree, mt, passive, q):
    return crba_flat(tree, mt, q)


def _fd_saving(tree: KinematicTree, mt, passive, q, v, u):
    """ABA's value and what its hand-written backward needs (see :func:`_fd_backward`): the
    world-frame columns ``S``, the world inertias ``(h, I)``, the base orientation (floating base)
    and the articulated-body factors."""
    qdd, factors = _aba(tree, mt, q, v, u, None, passive, small=False)
    ts, _ = factors.kinematics
    inertia = world_inertia(ts)  # what the RNEA VJP reads
    base = [ts.R[0]] if tree.nfree else []
    return (qdd, ts.S, inertia.h, inertia.I, *base, *factor_tensors(factors))


def _fd_backward(tree: KinematicTree, mt, passive, q, v, qdd, g, S, h, I, *rest):
    """Cotangents ``(qbar, vbar, taubar)`` of ABA at a known ``qdd``: ``taubar = M^{-1} g`` from the
    saved articulated-body factors, then the hand-written RNEA VJP with ``-taubar``."""
    base, factors = (rest[:1], rest[1:]) if tree.nfree else ((), rest)
    ts = TreeState(R=base[0][None] if base else None, p=None, S=S, mt=mt)  # what the backward reads
    inertia = RigidInertia(m=mt.body_mass[:, None], h=h, I=I)
    lam = apply_inverse_mass(tree, factors_from(tree, ts, list(factors)), g)
    got = rnea_vjp_bl(tree, ts, q.transpose(0, 1), v.transpose(0, 1), qdd.transpose(0, 1),
                      -lam.transpose(0, 1), passive, inertia)
    return got.q.transpose(0, 1), got.v.transpose(0, 1), lam


def _lane_program(tree: KinematicTree, algorithm: str, passive: bool) -> Callable[..., Tensor]:
    """``algorithm`` as a lane program of ``(*state (rows, B), *model tensors)``."""
    if algorithm == "forward_dynamics":
        return lambda q, v, u, *mt: aba_lanes(tree, ModelTensors(*mt), q, v, u, passive)
    if algorithm == "inverse_dynamics":
        return lambda q, v, a, *mt: rnea_lanes(tree, ModelTensors(*mt), q, v, a, passive)
    return lambda q, *mt: crba_lanes(tree, ModelTensors(*mt), q)


_ALGORITHMS: dict[str, tuple[int, Callable]] = {
    "forward_dynamics": (3, _fd),
    "inverse_dynamics": (3, _id),
    "mass_matrix": (1, _mm),
}


def kernel_input(t: Tensor, detach: bool = True) -> Tensor:
    """``t`` detached, with row-major strides (a copy only if needed).

    The compiled graphs are specialised to their inputs' strides and ``requires_grad`` flags: a
    view such as ``Q[:, k]`` of a trajectory would otherwise make torch.compile recompile for each
    trajectory length, and silently fall back to eager mode once its recompilation limit is
    reached. The kernels are pure functions (their backward is a kernel too), so no graph is lost;
    ``detach=False`` keeps the graph (the copy, if any, is differentiable).
    """
    if detach:
        t = t.detach()
    expected, acc = [], 1
    for n in reversed(t.shape):
        expected.append(acc)
        acc *= n
    if tuple(reversed(expected)) == t.stride():
        return t
    return t.clone(memory_format=torch.contiguous_format)


class CompiledDynamics:
    """A compiled rigid-body algorithm on flat batches, differentiable through a compiled VJP.

    Call it like the algorithm (``f(q, v, tau) -> qdd`` etc.); see :func:`compiled`.
    """

    def __init__(self, model: RobotParameters, algorithm: str, chunk: int | None, compile: bool, passive: bool,
                 compile_options: dict, native: bool | None = None):
        if algorithm not in _ALGORITHMS:
            raise OptionError(f"compiled: unknown algorithm {algorithm!r}; choose from {sorted(_ALGORITHMS)}")
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ShapeError(f"compiled: chunk must be a positive integer or None, got {chunk!r}")
        self.model, self.algorithm, self.chunk, self.passive = model, algorithm, chunk, bool(passive)
        self.compiled = bool(compile)
        # Native kernels serve the evaluation without a graph (see evaluate); None: when available.
        self.native = self.compiled if native is None else bool(native)
        self._kernels: dict[tuple[torch.dtype, bool], LaneKernel | None] = {}
        self.n_args, fn = _ALGORITHMS[algorithm]
        self.sizes = [model.nq, model.nv, model.nv][: self.n_args]
        n = self.n_args
        passive = self.passive
        tree = model.tree

        def forward(*tensors: Tensor) -> Tensor:
            return fn(tree, ModelTensors(*tensors[n:]), passive, *tensors[:n])

        def vjp(*tensors: Tensor, needs: tuple[bool, ...]) -> tuple[Tensor, ...]:
            prim, g = tensors[:-1], tensors[-1]
            idx = [i for i, f in enumerate(needs) if f]

            def f(*diff: Tensor) -> Tensor:
                full = list(prim)
                for i, d in zip(idx, diff):
                    full[i] = d
                return fn(tree, ModelTensors(*full[n:]), passive, *full[:n])

            _, pull = torch.func.vjp(f, *[prim[i] for i in idx])
            return pull(g)

        def fd_saving(*tensors: Tensor) -> tuple[Tensor, ...]:
            return _fd_saving(tree, ModelTensors(*tensors[3:]), passive, *tensors[:3])

        def fd_backward(*tensors: Tensor, n_factors: int) -> tuple[Tensor, Tensor, Tensor]:
            q, v, qdd, g = tensors[:4]
            factors, mt = tensors[4:4 + n_factors], tensors[4 + n_factors:]
            return _fd_backward(tree, ModelTensors(*mt), passive, q, v, qdd, g, *factors)

        compile_options.setdefault("dynamic", False)
        wrap = (lambda f: torch.compile(f, **compile_options)) if compile else (lambda f: f)
        self._forward = wrap(forward)
        self._vjp = wrap(vjp)
        self._fd_saving = wrap(fd_saving)
        self._fd_backward = wrap(fd_backward)

    # ------------------------------------------------------------------ evaluation
    def _pieces(self, B: int) -> list[tuple[int, int]]:
        if self.chunk is None or B <= self.chunk:
            return [(0, B)]
        return [(s, min(s + self.chunk, B)) for s in range(0, B, self.chunk)]

    def _pad(self, t: Tensor, s: int, e: int) -> Tensor:
        """Rows ``s:e`` of ``t``, padded to the chunk size with copies of the last row."""
        part = t[s:e]
        if self.chunk is not None and e - s < self.chunk and t.shape[0] > self.chunk:
            part = torch.cat([part, part[-1:].expand(self.chunk - (e - s), *part.shape[1:])])
        return part

    def kernel(self, dtype: torch.dtype, vjp: bool = False) -> LaneKernel | None:
        """The native kernel of this algorithm for ``dtype`` (built on first use, then cached on
        disk), or ``None`` where there is none (no C compiler, an unsupported dtype). ``vjp``: the
        kernel of its reverse mode, ``(*inputs, g) -> cotangents of the inputs`` (batch-first,
        concatenated)."""
        key = (dtype, vjp)
        if key not in self._kernels:
            try:
                mt = self.model.model_tensors(dtype, "cpu")
                program = _lane_program(self.model.tree, self.algorithm, self.passive)
                rows = self.sizes
                if vjp:
                    program = vjp_program(program, self.n_args)
                    rows = [*rows, self.model.nv]
                self._kernels[key] = LaneKernel(program, rows, list(mt), dtype)
            except NativeUnavailable as err:
                warnings.warn(f"compiled {self.algorithm}: no native kernel ({err}); using torch.compile", stacklevel=3)
                self._kernels[key] = None
        return self._kernels[key]

    def native_ok(self, args: Sequence[Tensor], mt: Sequence[Tensor], vjp: bool = False) -> LaneKernel | None:
        """The native kernel for these inputs, if this function uses native kernels and one exists."""
        if not self.native or args[0].device.type != "cpu":
            return None
        if vjp and (self.algorithm != "forward_dynamics" or any(t.requires_grad for t in mt)
                    or self.kernel(args[0].dtype) is None):
            return None
        return self.kernel(args[0].dtype, vjp)

    def evaluate(self, args: Sequence[Tensor], mt: Sequence[Tensor]) -> Tensor:
        """The algorithm's value without a graph: the native kernel on the CPU (any batch size),
        else the compiled torch function, chunk by chunk."""
        B = args[0].shape[0]
        kernel = self.native_ok(args, mt)
        if kernel is not None:
            return kernel(args, mt)
        with torch.no_grad():
            mt = [kernel_input(t) for t in mt]
            outs = [self._forward(*[kernel_input(self._pad(a, s, e)) for a in args], *mt)[: e - s]
                    for s, e in self._pieces(B)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def pullback(self, args: Sequence[Tensor], mt: Sequence[Tensor], g: Tensor,
                 needs: Sequence[bool]) -> list[Tensor | None]:
        """Cotangents of ``(*args, *mt)`` for the output cotangent ``g`` (``None`` where not needed);
        the model-tensor cotangents are summed over the batch."""
        needs = tuple(bool(x) for x in needs)
        out: list[Tensor | None] = [None] * len(needs)
        if not any(needs):
            return out
        n, B = self.n_args, args[0].shape[0]
        idx = [i for i, f in enumerate(needs) if f]
        arg_parts: dict[int, list[Tensor]] = {i: [] for i in idx if i < n}
        mt = [kernel_input(t) for t in mt]
        for s, e in self._pieces(B):
            gp = g[s:e]
            if self.chunk is not None and e - s < self.chunk and B > self.chunk:
                # Padded rows get a zero cotangent: they add nothing to the parameter cotangents.
                gp = torch.cat([gp, gp.new_zeros(self.chunk - (e - s), *gp.shape[1:])])
            got = self._vjp(*[kernel_input(self._pad(a, s, e)) for a in args], *mt, kernel_input(gp),
                            needs=needs)
            for i, gi in zip(idx, got):
                if i < n:
                    arg_parts[i].append(gi[: e - s])
                else:
                    out[i] = gi if out[i] is None else out[i] + gi
        for i, parts in arg_parts.items():
            out[i] = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out

    def evaluate_differentiable(self, args: Sequence[Tensor], mt: Sequence[Tensor]) -> Tensor:
        """The algorithm's value with its graph, chunk by chunk. With autograd on, torch.compile
        traces the joint forward and backward graph (AOTAutograd): the backward is compiled as
        well and reuses the forward's intermediates instead of recomputing the algorithm."""
        B = args[0].shape[0]
        mt = [kernel_input(t, detach=False) for t in mt]
        outs = [self._forward(*[kernel_input(self._pad(a, s, e), detach=False) for a in args], *mt)[: e - s]
                for s, e in self._pieces(B)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def apply(self, args: Sequence[Tensor], mt: Sequence[Tensor], value: Tensor | None = None) -> Tensor:
        """Evaluate with autograd support; ``value``, if given, is the already known output (its
        backward is then the compiled VJP kernel at ``args``, which recomputes the algorithm)."""
        tensors = [*args, *mt]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            if value is None and self.native_ok(args, mt, vjp=True) is not None:
                return _NativeDynamics.apply(self, tuple(mt), *args)
            if value is None and self.algorithm == "forward_dynamics" and not any(t.requires_grad for t in mt):
                return _CompiledForwardDynamics.apply(self, tuple(mt), *args)
            if value is None:
                return self.evaluate_differentiable(args, mt)
            return _Compiled.apply(self, value, *tensors)
        return value if value is not None else self.evaluate(args, mt)

    def check(self, args: Sequence[Tensor]) -> None:
        if len(args) != self.n_args:
            raise ShapeError(f"compiled {self.algorithm}: expected {self.n_args} tensors, got {len(args)}")
        ref = args[0]
        for name, t, n in zip(("q", "v", "u"), args, self.sizes):
            if not isinstance(t, Tensor):
                raise ShapeError(f"compiled {self.algorithm}: '{name}' must be a tensor, got {type(t).__name__}")
            if t.dim() != 2 or t.shape[1] != n:
                raise ShapeError(
                    f"compiled {self.algorithm}: '{name}' must have shape (B, {n}), got {tuple(t.shape)}")
            if t.shape[0] != ref.shape[0] or t.dtype != ref.dtype or t.device != ref.device:
                raise ShapeError(
                    f"compiled {self.algorithm}: '{name}' is {tuple(t.shape)} {t.dtype} on {t.device} but 'q' is "
                    f"{tuple(ref.shape)} {ref.dtype} on {ref.device}; pass one batch size, dtype and device")

    def __call__(self, *args: Tensor) -> Tensor:
        self.check(args)
        mt = self.model.model_tensors(args[0].dtype, args[0].device)
        return self.apply(args, tuple(mt))

    def __repr__(self) -> str:
        return f"CompiledDynamics({self.model.name!r}, {self.algorithm!r}, chunk={self.chunk})"


class _NativeDynamics(torch.autograd.Function):
    """Forward dynamics by native kernels: the value by the ABA kernel, the cotangents of
    ``(q, v, tau)`` by the kernel of ABA's reverse mode, which recomputes the forward pass per
    state in registers (only the inputs are saved). Used when no model tensor needs a gradient."""

    @staticmethod
    def forward(ctx, dyn: CompiledDynamics, mt: tuple, q: Tensor, v: Tensor, tau: Tensor) -> Tensor:
        ctx.dyn, ctx.mt = dyn, mt
        ctx.save_for_backward(q, v, tau)
        return dyn.kernel(q.dtype)((q, v, tau), mt)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        q, v, tau = ctx.saved_tensors
        model = ctx.dyn.model
        got = ctx.dyn.kernel(q.dtype, vjp=True)((q, v, tau, g), ctx.mt)
        gq, gv, gtau = got.split([model.nq, model.nv, model.nv], dim=1)
        needs = ctx.needs_input_grad
        return (None, None, gq if needs[2] else None, gv if needs[3] else None, gtau if needs[4] else None)


class _CompiledForwardDynamics(torch.autograd.Function):
    """Forward dynamics whose compiled forward keeps the articulated-body factors, and whose
    compiled backward is ``M^{-1}`` from those factors plus the hand-written RNEA VJP (no
    recomputation of ABA, no autograd graph of it). Used when no model tensor needs a gradient."""

    @staticmethod
    def forward(ctx, dyn: CompiledDynamics, mt: tuple, q: Tensor, v: Tensor, tau: Tensor) -> Tensor:
        mt = [kernel_input(t) for t in mt]
        chunks, outs = [], []
        for s, e in dyn._pieces(q.shape[0]):
            ins = [kernel_input(dyn._pad(a, s, e)) for a in (q, v, tau)]
            qdd, *factors = dyn._fd_saving(*ins, *mt)
            chunks.append((s, e, ins[0], ins[1], qdd, factors))
            outs.append(qdd[: e - s])
        ctx.dyn, ctx.mt, ctx.chunks = dyn, mt, chunks
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        dyn, B = ctx.dyn, g.shape[0]
        parts: list[list[Tensor]] = [[], [], []]
        for s, e, q, v, qdd, factors in ctx.chunks:
            gp = g[s:e]
            if dyn.chunk is not None and e - s < dyn.chunk and B > dyn.chunk:
                gp = torch.cat([gp, gp.new_zeros(dyn.chunk - (e - s), *gp.shape[1:])])
            got = dyn._fd_backward(q, v, qdd, kernel_input(gp), *factors, *ctx.mt, n_factors=len(factors))
            for i in range(3):
                parts[i].append(got[i][: e - s])
        grads = [p[0] if len(p) == 1 else torch.cat(p) for p in parts]
        needs = ctx.needs_input_grad
        return (None, None, *[gi if needs[2 + i] else None for i, gi in enumerate(grads)])


class _Compiled(torch.autograd.Function):
    """A known value whose backward is the compiled VJP kernel at the saved inputs."""

    @staticmethod
    def forward(ctx, dyn: CompiledDynamics, value: Tensor, *tensors: Tensor) -> Tensor:
        ctx.dyn = dyn
        ctx.save_for_backward(*tensors)
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        dyn = ctx.dyn
        tensors = ctx.saved_tensors
        grads = dyn.pullback(tensors[: dyn.n_args], tensors[dyn.n_args:], g, ctx.needs_input_grad[2:])
        return (None, None, *grads)


def compiled(
    model: RobotParameters,
    algorithm: str = "forward_dynamics",
    *,
    chunk: int | None = DEFAULT_CHUNK,
    compile: bool = True,
    passive: bool = True,
    native: bool | None = None,
    **compile_options,
) -> CompiledDynamics:
    """A compiled function evaluating ``algorithm`` on flat batches, with a compiled backward.

    Args:
        model: the robot (its parameters are read at every call, so learnable parameters work and
            receive gradients).
        algorithm: ``"forward_dynamics"`` (``f(q, v, tau) -> qdd``, by ABA), ``"inverse_dynamics"``
            (``f(q, v, a) -> tau``) or ``"mass_matrix"`` (``f(q) -> M``).
        chunk: batch rows per compiled call; larger batches are split (the last piece padded), so
            one graph is compiled. ``None`` compiles each batch size as it comes.
        compile: ``False`` keeps the chunking and the VJP backward but runs eagerly (for
            comparison and debugging).
        passive: include the model's joint damping and springs (as the eager methods).
        native: on the CPU, evaluate without a graph (``torch.no_grad()``, or inputs that need no
            gradient) by a native kernel (:mod:`.native`: the algorithm's lane program compiled to
            C by the system's C compiler, any batch size, a few seconds to build, cached on disk);
            forward dynamics with gradients w.r.t. the state and torques only also by the native
            kernel of its reverse mode (built by the first differentiable call, ~30 s for the
            iiwa). ``None`` (default): when ``compile`` is true and a C compiler is found; without
            one, a warning and torch.compile.
        **compile_options: passed to ``torch.compile`` (default ``dynamic=False``).

    Returns:
        A :class:`CompiledDynamics`: a function of flat ``(B, n)`` tensors (one dtype, device and
        batch size) returning ``(B, nv)`` (``(B, nv, nv)`` for the mass matrix). Gradients w.r.t.
        the inputs and the model's parameters come from the compiled backward of the algorithm
        (first order only: a second backward raises). The first call for a new shape, and the first
        differentiable call for a new pattern of inputs needing gradients, compile (tens of seconds
        on CPU; later processes reuse torch's on-disk cache).
    """
    return CompiledDynamics(model, algorithm, chunk, compile, passive, dict(compile_options), native)
