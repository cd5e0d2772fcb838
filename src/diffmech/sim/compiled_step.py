"""One explicit integration step and its VJP, each compiled into one function.

The checkpoint adjoint needs, per step and in reverse order, the VJP of ``x_{k+1} = step(x_k, u_k,
theta)`` at a stored state. When the controls are a tensor (no policy), that VJP is a pure function
of ``(q_k, v_k, u_k, theta, adjoint)``: it is traced once with ``torch.func.vjp`` and compiled, so a
reverse step is one call, with no autograd graph to rebuild and no per-operation overhead. Autograd
through the whole loop cannot be compiled this way: its graph spans every step.

The model's parameters enter as the :class:`~diffmech.model.parameters.ModelTensors` fields; the rollout
sums their cotangents over the steps and maps them to the parameters with one VJP at the end.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..dynamics.aba import aba_flat
from ..dynamics.compiled import kernel_input
from ..model.parameters import ModelTensors
from ..robot import RobotModel
from .integrators import Integrator

__all__ = ["CompiledStep"]


class CompiledStep:
    """``step(q, v, u, mt) -> (q1, v1)`` and its VJP for one robot, integrator, ``dt`` and ``passive``.

    Args:
        compile: ``False`` runs the same functions eagerly (tests, debugging).
    """

    def __init__(self, robot: RobotModel, integ: Integrator, dt: float, passive: bool, compile: bool = True,
                 **compile_options):
        self.robot, self.integ, self.dt, self.passive = robot, integ, float(dt), bool(passive)
        tree = robot.tree

        def step(q: Tensor, v: Tensor, u: Tensor, *mt_fields: Tensor) -> tuple[Tensor, Tensor]:
            mt = ModelTensors(*mt_fields)

            def accel(q_, v_, tau_, f_ext_):
                return aba_flat(tree, mt, q_, v_, tau_, None, passive)

            return integ.step_flat(robot, q, v, u, dt, None, passive, accel=accel)

        def vjp(q: Tensor, v: Tensor, u: Tensor, *rest: Tensor, needs: tuple[bool, ...]) -> tuple[Tensor, ...]:
            mt_fields, aq, av = rest[:-2], rest[-2], rest[-1]
            prim = (q, v, u, *mt_fields)
            idx = [i for i, f in enumerate(needs) if f]

            def f(*diff: Tensor) -> tuple[Tensor, Tensor]:
                full = list(prim)
                for i, d in zip(idx, diff):
                    full[i] = d
                return step(*full)

            out, pull = torch.func.vjp(f, *[prim[i] for i in idx])
            return out, pull((aq, av))

        compile_options.setdefault("dynamic", False)
        self._step = torch.compile(step, **compile_options) if compile else step
        self._vjp = torch.compile(vjp, **compile_options) if compile else vjp

    def step(self, q: Tensor, v: Tensor, u: Tensor, mt: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
        """The next state ``(q1 (B, nq), v1 (B, nv))`` (no graph)."""
        with torch.no_grad():
            return self._step(kernel_input(q), kernel_input(v), kernel_input(u), *[kernel_input(t) for t in mt])

    def vjp(self, q: Tensor, v: Tensor, u: Tensor, mt: Sequence[Tensor], aq: Tensor, av: Tensor,
            needs: Sequence[bool]) -> list[Tensor | None]:
        """Cotangents of ``(q, v, u, *mt)`` for the cotangents ``(aq, av)`` of the next state
        (``None`` where ``needs`` is false); the model-tensor cotangents are summed over the batch."""
        needs = tuple(bool(x) for x in needs)
        out: list[Tensor | None] = [None] * len(needs)
        idx = [i for i, f in enumerate(needs) if f]
        if not idx:
            return out
        q, v, u, aq, av = (kernel_input(t) for t in (q, v, u, aq, av))
        _, got = self._vjp(q, v, u, *[kernel_input(t) for t in mt], aq, av, needs=needs)
        for i, gi in zip(idx, got):
            out[i] = gi
        return out
