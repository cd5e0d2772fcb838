"""The largest step at which a fixed-step integrator stays stable for a robot's linearized dynamics."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..dynamics.free_flyer import free_flyer_vjp
from ..errors import OptionError, ShapeError, SimulationError
from ..robot import RobotModel
from ._step_jacobians import dynamics_jacobians
from .integrators import (
    RK4,
    ExplicitEuler,
    ExplicitMidpoint,
    Integrator,
    SemiImplicitEuler,
    VariationalMidpoint,
    get_integrator,
)

__all__ = ["stable_dt", "linearized_dynamics"]


def linearized_dynamics(robot: RobotModel, q: Tensor, v: Tensor | None = None, *, passive: bool = True) -> Tensor:
    """State matrices ``A (N, 2 nv, 2 nv)`` of the dynamics linearized about ``N`` states.

    ``d/dt (dq, dv) = A (dq, dv)`` for small deviations ``dq`` (tangent coordinates: a floating
    base's configuration moves as ``q (+) dq``) and ``dv`` from the motion through ``(q, v)`` with
    zero acceleration, i.e. under the joint forces ``tau = ID(q, v, 0)`` that hold it:
    ``A = [[0, I], [-M^{-1} dID/dq, -M^{-1} dID/dv]]`` at ``qdd = 0``. At ``v = 0`` the lower blocks
    are ``-M^{-1} (dg/dq + K)`` (gravity's and the springs' stiffness, ``K = diag(stiffness)``) and
    ``-M^{-1} D`` (``D = diag(damping)``); with ``v`` they include the velocity-dependent
    (Coriolis, centrifugal) terms. Springs and damping count only when ``passive``.

    Args:
        q: (N, nq) configurations.
        v: (N, nv) velocities (default zero).

    Returns:
        (N, 2 nv, 2 nv) float64.
    """
    q = q.to(torch.float64)
    N, nq, nv = q.shape[0], robot.nq, robot.nv
    v = q.new_zeros(N, nv) if v is None else v.to(torch.float64)
    Minv, JR = dynamics_jacobians(robot, passive, q, v, q.new_zeros(N, nv))
    JRq, JRv = JR[..., :nq], JR[..., nq:]
    if robot.floating_base:
        # d/d dq of ID(q (+) dq) at dq = 0: the configuration cotangents through the exponential map.
        rows_q = q[:, None].expand(N, nv, nq).reshape(-1, nq)
        _, JRq = free_flyer_vjp(rows_q, rows_q.new_zeros(N * nv, nv), JRq.reshape(-1, nq))
        JRq = JRq.reshape(N, nv, nv)
    A = q.new_zeros(N, 2 * nv, 2 * nv)
    A[:, :nv, nv:] = torch.eye(nv, dtype=q.dtype, device=q.device)
    A[:, nv:, :nv] = -Minv @ JRq
    A[:, nv:, nv:] = -Minv @ JRv
    return A


def _semi_implicit_matrix(A: Tensor, h: Tensor) -> Tensor:
    """Semi-implicit Euler's one-step map of ``x' = A x`` at steps ``h (G, M, 1, 1)``: ``(G, M, 2n, 2n)``."""
    n = A.shape[-1] // 2
    eye = torch.eye(2 * n, dtype=A.dtype, device=A.device)
    hA = h * A
    # v1 = v + h (Aq dq + Av v), then dq1 = dq + h v1 (the upper right block of A maps v to dq').
    lower = eye[n:] + hA[..., n:, :]
    upper = eye[:n] + hA[..., :n, n:] @ lower
    return torch.cat([upper, lower], dim=-2)


# Explicit Runge-Kutta schemes: their one-step map of x' = A x is R(hA) with R the Taylor polynomial
# of exp of this degree, so every eigenvalue lam of A maps to R(h lam).
_RK_DEGREE = {ExplicitEuler: 1, ExplicitMidpoint: 2, RK4: 4}


def _stable_steps(integ: Integrator, A: Tensor, tol: float) -> Tensor:
    """Per state ``(N,)``: the largest stable ``h`` (see :func:`stable_dt`)."""
    A = A.cpu()  # small dense eigenproblems
    N, n2 = A.shape[0], A.shape[-1]
    n = n2 // 2
    lam = torch.linalg.eigvals(A)  # (N, 2n)
    rate = lam.abs().amax(-1)  # (N,) the fastest rate, 1/s
    out = torch.full((N,), math.inf, dtype=A.dtype)
    live = rate > 0
    if not bool(live.any()):
        return out
    A, lam, rate = A[live], lam[live], rate[live]
    degree = _RK_DEGREE.get(type(integ))
    if degree is not None:
        coef = [1.0 / math.factorial(j) for j in range(degree + 1)]

        def fails(h: Tensor) -> Tensor:  # h (G, M): (G, M) whether step h is unstable
            z = h[..., None] * lam  # (G, M, 2n): each mode on its own
            R = sum(c * z**j for j, c in enumerate(coef))
            bound = torch.exp(2.0 * z.real).clamp_min(1.0) * (1.0 + tol)
            return (R.abs() > bound).any(-1)
    else:
        growth = lam.real.amax(-1).clamp_min(0.0)  # the exact flow's fastest exponential growth
        # Balance the blocks (dq scaled by the rate) so that eigenvalues near 1 are computed accurately.
        Ab = A.clone()
        Ab[:, :n, n:] *= rate[:, None, None]
        Ab[:, n:, :n] /= rate[:, None, None]
        # The partitioned map mixes the modes: a fast mode's instability may hide under a growing
        # mode's allowance, so the step is also capped at 2 / |lam| for the modes that do not grow
        # (the exact limit of a decaying or oscillating scalar mode).
        steady = lam.real <= 1e-9 * lam.abs()
        cap = 2.0 / torch.where(steady, lam.abs(), torch.zeros_like(rate)[:, None]).amax(-1)

        def fails(h: Tensor) -> Tensor:
            rho = torch.linalg.eigvals(_semi_implicit_matrix(Ab, h[..., None, None])).abs().amax(-1)
            return (rho > torch.exp(2.0 * h * growth) * (1.0 + tol)) | (h > cap)

    grid = torch.logspace(-5, 3, 97, dtype=A.dtype)[:, None] / rate  # (G, M)
    bad = fails(grid)
    G = grid.shape[0]
    first = torch.where(bad.any(0), bad.to(torch.int64).argmax(0), torch.full_like(rate, G, dtype=torch.int64))
    idx = torch.arange(rate.shape[0])
    hi = torch.where(first < G, grid[first.clamp_max(G - 1), idx], torch.full_like(rate, math.inf))
    lo = torch.where(first > 0, grid[(first - 1).clamp_min(0), idx], torch.zeros_like(rate))
    finite = torch.isfinite(hi)
    for _ in range(60):
        mid = torch.where(finite, 0.5 * (lo + hi), lo)
        f = fails(mid[None])[0]
        hi = torch.where(finite & f, mid, hi)
        lo = torch.where(finite & ~f, mid, lo)
    out[live] = torch.where(finite, lo, hi)
    return out


def stable_dt(
    robot: RobotModel,
    q: Tensor | None = None,
    v: Tensor | None = None,
    *,
    integrator: str | Integrator = "semi_implicit_euler",
    passive: bool = True,
    samples: int = 8,
    safety: float = 0.5,
    tol: float = 1e-6,
    generator: torch.Generator | None = None,
) -> float:
    """Suggest a time step, s, at which ``integrator`` is stable for ``robot``.

    What it computes, exactly: the dynamics are linearized about each given state (about the
    motion through ``(q, v)`` with zero acceleration, see :func:`linearized_dynamics`):
    ``d/dt (dq, dv) = A (dq, dv)``. At ``v = 0`` the eigenvalues of ``A`` are ``-zeta w +- i w sqrt(1 -
    zeta^2)`` for the natural frequencies ``w`` (``w^2`` the eigenvalues of ``M(q)^{-1} (dg/dq + K)``,
    with gravity's stiffness ``dg/dq`` and the joint springs ``K``) and the damping ``D``; the
    fastest natural period is ``2 pi / max w``. It then finds the largest ``h`` at which the
    integrator's one-step map ``Phi(h)`` of this linear system amplifies no mode more than the
    exact flow allows, and returns ``safety`` times the smallest such ``h`` over the states:

    * ``"euler"``, ``"midpoint"``, ``"rk4"``: ``Phi(h) = R(hA)`` with ``R`` the Taylor polynomial of
      ``exp`` of degree 1, 2, 4, so each eigenvalue ``lam`` of ``A`` is a mode of its own; the
      condition is ``|R(h lam)| <= max(1, |exp(2 h lam)|) (1 + tol)`` for every ``lam`` (a mode that
      does not grow must not be amplified; one that grows, about an unstable equilibrium or in
      fast motion, at most at twice its rate, which leaves room for a scheme's error on it).
    * ``"semi_implicit_euler"`` (a partitioned map: ``v`` first, then ``q`` with the new ``v``):
      ``rho(Phi(h)) <= rho(exp(2 h A)) (1 + tol)`` for the spectral radii, and ``h <= 2 / |lam|``
      for every ``lam`` that does not grow (the exact limit of a decaying or oscillating mode,
      which a growing mode's allowance could otherwise hide).

    Known cases: an undamped oscillator of frequency ``w`` gives ``2 / w`` for
    ``"semi_implicit_euler"`` (a period of ``pi`` steps) and ``2 sqrt(2) / w`` for ``"rk4"``; a
    damped joint of inertia ``I`` and damping ``d`` (no spring) gives ``2 I / d`` for the Euler
    schemes and the midpoint rule and ``2.785 I / d`` for ``"rk4"``. ``"euler"`` and ``"midpoint"``
    amplify undamped oscillations at any step, so for them ``tol`` decides (``"euler"``:
    ``h <= sqrt(2 tol) / w``). ``"variational_midpoint"`` is stable at any step for the linear
    system: ``inf`` (the convergence of its Newton solve is the practical limit).

    This is a linear analysis: for fast motion pass the velocity ``v`` (the linearization then
    includes the velocity-dependent forces, which is what limits the step of a fast-spinning arm);
    contacts and other forces not in the model are not covered. :func:`diffmech.sim.rollout`
    quotes this function at the last state before a divergence.

    Args:
        robot: the model.
        q: (..., nq) configurations; default: the neutral configuration and ``samples - 1`` random
            ones (:meth:`~diffmech.RobotModel.random_configuration`).
        v: (..., nv) velocities broadcasting with ``q``; default zero.
        integrator: a name of :data:`diffmech.sim.INTEGRATORS` or an integrator instance.
        passive: include the joint springs and damping.
        samples: configurations drawn when ``q`` is None.
        safety: the fraction of the stability limit returned (1 returns the limit itself).
        tol: the per-step growth tolerated beyond the exact flow's (rounding, and the schemes
            that amplify undamped oscillations at any step).
        generator: for the random configurations.

    Returns:
        The suggested ``dt`` (s); ``inf`` when nothing in the linearization limits it.

    Raises:
        OptionError: an integrator without a stability analysis here.
        ShapeError: ``q`` or ``v`` of the wrong shape.
        SimulationError: the linearization at a given state is not finite.
    """
    integ = get_integrator(integrator)
    if not (safety > 0 and math.isfinite(safety)) or not tol >= 0:
        raise OptionError(f"stable_dt: safety must be positive and finite and tol >= 0, got {safety}, {tol}")
    if not isinstance(integ, (ExplicitEuler, SemiImplicitEuler, ExplicitMidpoint, RK4, VariationalMidpoint)):
        raise OptionError(f"stable_dt: no stability analysis for integrator {integ!r}")
    if q is None:
        if samples < 1:
            raise OptionError(f"stable_dt: samples must be >= 1, got {samples}")
        q = torch.cat([robot.neutral_configuration()[None],
                       robot.random_configuration(samples - 1, generator=generator)])
    for name, t, n in (("q", q, robot.nq), ("v", v, robot.nv)):
        if t is not None and (not isinstance(t, Tensor) or t.dim() < 1 or t.shape[-1] != n):
            raise ShapeError(f"stable_dt: '{name}' must be a tensor (..., {n}), got "
                             f"{tuple(t.shape) if isinstance(t, Tensor) else type(t).__name__}")
    if isinstance(integ, VariationalMidpoint):
        return math.inf
    with torch.no_grad():
        if v is not None:
            batch = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1])
            v = v.expand(*batch, robot.nv).reshape(-1, robot.nv)
            q = q.expand(*batch, robot.nq).reshape(-1, robot.nq)
        else:
            q = q.reshape(-1, robot.nq)
        A = linearized_dynamics(robot, q, v, passive=passive)
        if not bool(torch.isfinite(A).all()):
            raise SimulationError("stable_dt: the dynamics linearized at the given state are not finite (a state so "
                                  "extreme that its derivatives overflow)")
        h = _stable_steps(integ, A, tol)
    return safety * float(h.min())
