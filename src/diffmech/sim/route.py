"""Which implementation runs a contact step or a contact rollout, decided in one place, and what a
solve that stopped short says.

Routes (the strings ``contact_step(..., info=d)`` and ``rollout(..., stats=d)`` put in ``d["route"]``):

* ``"native"``: the native implementation. For :func:`~diffmech.sim.rollout` with the checkpointed
  adjoint, every step and its reverse in C (:mod:`._ground_rollout`), policies and the robot's
  learnable parameters included (their cotangents from the kernels' reverse mode, pulled back through
  autograd once per backward pass). For :func:`~diffmech.sim.contact_step`, one autograd node over the
  same C calls (a replayed step: the step's first stage in one kernel and the contact problem in C,
  with a hand-written reverse pass).
* ``"torch: <why>"``: the torch implementation (the reference), and why the native one cannot run:
  ``"torch: mujoco solver"`` (``Scene(solver="mujoco")``, :mod:`diffmech.sim.soft_step`),
  ``"torch: cuda"``, ``"torch: float16"``, ``"torch: torch.func transform"``, ``"torch: 2 models in the
  scene"``, ``"torch: self-collision"``, ``"torch: kernels not built (...)"``, ``"torch: adjoint='autograd'"``,
  ``"torch: native kernels off (DIFFMECH_NATIVE=never)"``...

Under ``DIFFMECH_NATIVE=require`` (or ``diffmech.dynamics.kernels.set_native("require")``) a call that
would take a torch route raises :class:`~diffmech.errors.NativeRouteError` with that reason instead.
"""

from __future__ import annotations

import math
import warnings

from torch import Tensor

from ..dynamics import kernels
from ._ground_rollout import GroundStepper, ground_stepper, native_step
from ._ground_step import MAX_BALL_STATES, ground_plan, ground_stage
from .scene import Scene

__all__ = ["rollout_route", "step_route", "warn_unconverged", "NATIVE"]

NATIVE = "native"


def _torch(what: str, why: str) -> str:
    kernels.leave_native(what, why)
    return f"torch: {why}"


def rollout_route(scene: Scene, q0: Tensor, dt: float, adjoint: str) -> tuple[GroundStepper | None, str]:
    """The stepper of a rollout of ``scene`` from ``q0 (B, nq)`` (``None``: :func:`~diffmech.sim.contact_step`
    under the adjoint's recomputation) and the route's name. Call it with grad mode on: which of the
    robot's tensors require grad decides the reverse mode the stepper builds."""
    if scene.solver == "mujoco":  # MuJoCo's soft step exists in torch only (diffmech.sim.soft_step)
        return None, _torch("rollout", "mujoco solver")
    if adjoint == "autograd":
        return None, _torch("rollout", "adjoint='autograd'")
    why: list[str] = []
    stepper = ground_stepper(scene, q0, dt, why)
    if stepper is None:
        return None, _torch("rollout", why[0] if why else "scene")
    return stepper, NATIVE


def step_route(scene: Scene, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict, warm, replay
               ) -> tuple[Tensor, Tensor] | None:
    """A contact step by a native route where one serves it, its route's name in ``info["route"]``; ``None``
    where the torch step must run (``info["route"]`` then says why; raises under ``DIFFMECH_NATIVE=require``).

    Native routes, in order: the stepper's C calls as one autograd node (:func:`._ground_rollout.native_step`:
    any batch size, policies and learnable parameters through ordinary autograd); for a replayed step (the
    checkpointed adjoint's recomputation, see :func:`~diffmech.sim.contact_step`) or where that node cannot
    run (a joint limit that requires grad), the step's first stage in one kernel with the torch code's
    contact selection and the solve in C (up to :data:`._ground_step.MAX_BALL_STATES` balls x states)."""
    why: list[str] = []
    plan = ground_plan(scene, q, None, why)
    if plan is not None:
        if replay is None:
            got = native_step(scene, plan, q, v, tau, dt, info, warm)
            if got is not None:
                info["route"] = NATIVE
                return got
        if q.shape[0] * len(plan.links) <= MAX_BALL_STATES:
            stage = ground_stage(scene, plan, q, v, tau, dt)
            if stage is not None:
                info["route"] = NATIVE
                from .contact_step import _ground_step

                return _ground_step(scene, plan, stage, q, v, dt, info, warm, replay)
            why.append("learnable parameters: kernels not built (set_native('build') or `diffmech kernels build`)")
        else:
            why.append(f"batch ({q.shape[0]} x {len(plan.links)} balls > {MAX_BALL_STATES}) for a replayed step")
    info["route"] = _torch("contact_step", why[0] if why else "scene")
    return None


def warn_unconverged(scene: Scene, info: dict, where: str) -> None:
    """Warn once per scene that a contact solve stopped short (``info`` of a step with ``unconverged >
    0`` and a relative residual above ``sqrt(scene.tol)``): the impulses then break the contact
    conditions by ``violation`` m/s and the step's implicit gradient is not the derivative of what was
    simulated. Below ``sqrt(tol)`` the count in ``info`` / ``stats`` records it without a warning: a
    statically indeterminate contact set (a box flat on the ground, its four corners penetrating by
    different depths) has contact targets no rigid motion meets exactly, and every method tried
    (sweeps, semismooth Newton, SciPy's least squares from many starts) stalls at a residual of about
    1e-6 there, a violation of about 1e-7 m/s."""
    if not info.get("unconverged") or scene.__dict__.get("_warned_unconverged"):
        return
    if not info["residual"] > math.sqrt(scene.tol):
        return
    scene.__dict__["_warned_unconverged"] = True
    warnings.warn(f"{where}: the contact solve stopped short in {info['unconverged']} environment(s): residual "
                  f"{info['residual']:.3g} (relative, tolerance {scene.tol:g}), contact conditions violated by "
                  f"{info['violation']:.3g} m/s; the step and its gradient are not exact there (raise "
                  "Scene(iterations=...) or reduce dt). Counted in info['unconverged'] / "
                  "stats['contact_unconverged']; warned once per scene.", RuntimeWarning, stacklevel=3)
