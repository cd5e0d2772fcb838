"""Batched fixed-step integrators for ``M(q) qdd + h(q, v) = tau``.

Every integrator is a small strategy object with one public signature::

    q_next, v_next = integrator(robot, q, v, tau, dt, f_ext=None, passive=True)

with ``q (..., nq)``, ``v (..., nv)``, ``tau (..., nv)`` (held constant over the step),
``f_ext (..., n_links, 6)`` (link force; torque, world-aligned axes, torque about the link origin,
held constant over the step) and ``dt`` in seconds. ``passive`` includes the joint damping and
springs of the model. :meth:`Integrator.step_flat` is the same map on flat ``(B, n)`` tensors
without shape checks, for loops such as :func:`diffmech.sim.rollout`.

Configurations move on the manifold through :func:`diffmech.integrate`, so a floating base keeps
a unit quaternion. The base velocity of a floating base is a body twist (Pinocchio's free-flyer
convention); the Runge-Kutta schemes combine stage twists as Runge-Kutta-Munthe-Kaas methods
(the stage twists are corrected by the inverse differential of the exponential), which keeps
their classical order on SE(3).

Integrators (``INTEGRATORS``):

=======================  =====  ===================================================
name                     order  per step
=======================  =====  ===================================================
``euler``                1      1 ABA; ``q`` advanced with the old velocity
``semi_implicit_euler``  1      1 ABA; ``v`` first, then ``q`` with the new ``v``
``midpoint``             2      2 ABA (explicit midpoint, RK2)
``rk4``                  4      4 ABA (classical Runge-Kutta)
``variational_midpoint`` 2      Newton solve of the discrete Euler-Lagrange equations
=======================  =====  ===================================================
"""

from __future__ import annotations

import abc
import math
from collections.abc import Callable

import torch
from torch import Tensor

from .. import spatial
from ..dynamics import kinematics as _kin
from ..dynamics.aba import forward_dynamics_flat
from ..dynamics.rnea import rnea_flat
from ..errors import ModelError, ShapeError
from ..implicit import newton_solve
from ..model.robot import RobotModel

__all__ = [
    "Integrator", "ExplicitEuler", "SemiImplicitEuler", "ExplicitMidpoint", "RK4", "VariationalMidpoint",
    "INTEGRATORS", "get_integrator",
]


def _accel(robot: RobotModel, q: Tensor, v: Tensor, tau: Tensor, f_ext: Tensor | None, passive: bool,
           accel: Callable | None = None) -> Tensor:
    if accel is not None:
        return accel(q, v, tau, f_ext)
    # ABA forward, one M^{-1} solve + one RNEA VJP backward (implicit function theorem).
    return forward_dynamics_flat(robot, q, v, tau, f_ext, passive, "aba", True)


def _advance(robot: RobotModel, q: Tensor, v: Tensor, dt: float) -> Tensor:
    """Flat ``q (B, nq)`` moved with constant velocity ``v (B, nv)`` for ``dt`` (on the manifold)."""
    if not robot.floating_base:
        return q + dt * v
    return _kin.integrate(robot, q, v, dt)


def _flatten(robot: RobotModel, entries: list) -> tuple[list[Tensor], tuple[int, ...]]:
    """Check ``(name, tensor, trailing shape)`` entries, broadcast their batch shapes, flatten to ``(B, ...)``."""
    ref = entries[0][1]
    for name, t, trailing in entries:
        if not isinstance(t, Tensor):
            raise ShapeError(f"{robot.name}: '{name}' must be a tensor, got {type(t).__name__}")
        if not t.dtype.is_floating_point or t.dtype != ref.dtype or t.device != ref.device:
            raise ShapeError(
                f"{robot.name}: '{name}' is {t.dtype} on {t.device}; expected floating point like q "
                f"({ref.dtype} on {ref.device})"
            )
        k = len(trailing)
        if t.dim() < k or tuple(t.shape[t.dim() - k:]) != trailing:
            raise ShapeError(f"{robot.name}: '{name}' must have shape (..., {', '.join(map(str, trailing))}), "
                             f"got {tuple(t.shape)}")
    try:
        batch = tuple(torch.broadcast_shapes(*(t.shape[:t.dim() - len(tr)] for _, t, tr in entries)))
    except RuntimeError:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t, _ in entries)
        raise ShapeError(f"{robot.name}: the batch shapes of {shapes} do not broadcast") from None
    B = math.prod(batch)
    return [t.expand(*batch, *tr).reshape(B, *tr) for _, t, tr in entries], batch


def _dexpinv(robot: RobotModel, omega: Tensor, k: Tensor, terms: int) -> Tensor:
    """Body-twist stage derivative for Munthe-Kaas methods on the floating base.

    With ``T(t) = T0 exp(Omega(t))`` and body twist ``V = T^{-1} dT/dt``,
    ``dOmega/dt = dexp^{-1}_{-Omega}(V) = V + 1/2 [Omega, V] + 1/12 [Omega, [Omega, V]] + ...``;
    ``terms`` brackets are kept (an RK method of order p needs p - 2). Joint coordinates are
    Euclidean and pass through unchanged.
    """
    if not robot.floating_base or terms == 0:
        return k
    w, kb = omega[:, :6], k[:, :6]
    ad1 = spatial.motion_cross(w, kb)
    out = kb + 0.5 * ad1
    if terms > 1:
        out = out + spatial.motion_cross(w, ad1) / 12.0
    return torch.cat([out, k[:, 6:]], dim=-1)


class Integrator(abc.ABC):
    """Base class: a fixed-step integrator.

    Attributes:
        name: key in :data:`INTEGRATORS`.
        order: global order of accuracy for smooth dynamics.
        implicit: whether a step solves an equation (Newton through :mod:`diffmech.implicit`).
        supports_floating_base: whether floating-base robots are accepted.
        accel_calls: forward-dynamics evaluations per step (through ``accel``) that determine the
            step; 0 for the variational integrator, whose predictor only seeds Newton.
    """

    name = "integrator"
    order = 0
    implicit = False
    supports_floating_base = True
    accel_calls = 0  # forward-dynamics evaluations per step whose values a recomputed step can reuse

    def __call__(
        self,
        robot: RobotModel,
        q: Tensor,
        v: Tensor,
        tau: Tensor,
        dt: float,
        *,
        f_ext: Tensor | None = None,
        passive: bool = True,
    ) -> tuple[Tensor, Tensor]:
        """One step ``(q, v) -> (q_next, v_next)``.

        Args:
            robot: the model.
            q: (..., nq) configuration.
            v: (..., nv) velocity (base twist in the base frame for a floating base).
            tau: (..., nv) joint forces, constant over the step.
            dt: step, s.
            f_ext: optional (..., n_links, 6) link forces; torques (world-aligned axes, torque
                about the link origin), constant over the step.
            passive: include joint damping and springs.

        Returns:
            ``q_next (..., nq)``, ``v_next (..., nv)`` with the broadcast batch shape.
        """
        self.check_robot(robot)
        entries = [("q", q, (robot.nq,)), ("v", v, (robot.nv,)), ("tau", tau, (robot.nv,))]
        if f_ext is not None:
            entries.append(("f_ext", f_ext, (robot.n_links, 6)))
        flat, batch = _flatten(robot, entries)
        fe = flat[3] if f_ext is not None else None
        q1, v1 = self.step_flat(robot, flat[0], flat[1], flat[2], float(dt), fe, passive)
        return q1.reshape(*batch, robot.nq), v1.reshape(*batch, robot.nv)

    step = __call__

    def check_robot(self, robot: RobotModel) -> None:
        """Raise :class:`~diffmech.errors.ModelError` if this integrator cannot simulate ``robot``."""
        if robot.floating_base and not self.supports_floating_base:
            raise ModelError(
                f"integrator '{self.name}' supports fixed-base robots only; '{robot.name}' has a floating base "
                "(use 'semi_implicit_euler', 'euler', 'midpoint' or 'rk4')"
            )

    @abc.abstractmethod
    def step_flat(
        self,
        robot: RobotModel,
        q: Tensor,
        v: Tensor,
        tau: Tensor,
        dt: float,
        f_ext: Tensor | None = None,
        passive: bool = True,
        *,
        context: str = "",
        hint: Tensor | None = None,
        accel: Callable | None = None,
    ) -> tuple[Tensor, Tensor]:
        """One step on flat tensors ``q (B, nq), v (B, nv), tau (B, nv), f_ext (B, n_links, 6)``.

        No shape checks. ``context`` names the step in error messages of implicit integrators;
        ``hint`` is an optional guess of ``q_next (B, nq)`` (e.g. the stored next state when a
        step is recomputed), used as the Newton start by implicit integrators and ignored by
        explicit ones. ``accel(q, v, tau, f_ext) -> qdd (B, nv)`` replaces the forward dynamics
        (called ``accel_calls`` times per step, in a fixed order); :func:`diffmech.sim.rollout`
        uses it to record the accelerations of the forward pass and replay them in the backward.
        """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class ExplicitEuler(Integrator):
    """Explicit (forward) Euler: ``q' = q (+) v dt``, ``v' = v + a(q, v) dt``. First order; gains energy."""

    name = "euler"
    order = 1
    accel_calls = 1

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        a = _accel(robot, q, v, tau, f_ext, passive, accel)
        return _advance(robot, q, v, dt), v + dt * a


class SemiImplicitEuler(Integrator):
    """Semi-implicit (symplectic) Euler: ``v' = v + a(q, v) dt``, then ``q' = q (+) v' dt``.

    First order; symplectic for separable conservative systems (bounded energy error at small dt).
    """

    name = "semi_implicit_euler"
    order = 1
    accel_calls = 1

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        v1 = v + dt * _accel(robot, q, v, tau, f_ext, passive, accel)
        return _advance(robot, q, v1, dt), v1


class ExplicitMidpoint(Integrator):
    """Explicit midpoint rule (RK2): derivatives at the state reached after half an Euler step."""

    name = "midpoint"
    order = 2
    accel_calls = 2

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        a0 = _accel(robot, q, v, tau, f_ext, passive, accel)
        qh = _advance(robot, q, v, 0.5 * dt)
        vh = v + (0.5 * dt) * a0
        ah = _accel(robot, qh, vh, tau, f_ext, passive, accel)
        return _advance(robot, q, vh, dt), v + dt * ah


class RK4(Integrator):
    """Classical fourth-order Runge-Kutta (Munthe-Kaas form on a floating base)."""

    name = "rk4"
    order = 4
    accel_calls = 4

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        h = 0.5 * dt
        k1, a1 = v, _accel(robot, q, v, tau, f_ext, passive, accel)
        v2 = v + h * a1
        om2 = h * k1
        a2 = _accel(robot, _advance(robot, q, om2, 1.0), v2, tau, f_ext, passive, accel)
        k2 = _dexpinv(robot, om2, v2, 2)
        v3 = v + h * a2
        om3 = h * k2
        a3 = _accel(robot, _advance(robot, q, om3, 1.0), v3, tau, f_ext, passive, accel)
        k3 = _dexpinv(robot, om3, v3, 2)
        v4 = v + dt * a3
        om4 = dt * k3
        a4 = _accel(robot, _advance(robot, q, om4, 1.0), v4, tau, f_ext, passive, accel)
        k4 = _dexpinv(robot, om4, v4, 2)
        c = dt / 6.0
        q1 = _advance(robot, q, c * (k1 + 2 * k2 + 2 * k3 + k4), 1.0)
        v1 = v + c * (a1 + 2 * a2 + 2 * a3 + a4)
        return q1, v1


class VariationalMidpoint(Integrator):
    """Variational midpoint integrator (discrete mechanics; Marsden & West 2001).

    Discrete Lagrangian ``L_d(q0, q1) = dt L((q0 + q1)/2, (q1 - q0)/dt)`` with ``L = T(q, v) - U(q)``:
    ``T`` is :meth:`~diffmech.RobotModel.kinetic_energy` (its gradient by one reverse pass) and
    ``U`` :meth:`~diffmech.RobotModel.potential_energy` (gravity, plus the joint springs when
    ``passive``), whose gradient ``g(q) + k (q - rest)`` is taken from inverse dynamics at rest.
    Non-conservative forces enter by the discrete Lagrange-d'Alembert principle with midpoint
    forcing ``F^- = F^+ = dt/2 f(q_m, v_m)``, ``f = tau - damping v_m + J(q_m)^T f_ext``. One step
    maps ``(q_k, p_k)`` to ``(q_{k+1}, p_{k+1})`` by

        ``p_k + D1 L_d(q_k, q_{k+1}) + F^- = 0``   (solved for ``q_{k+1}``),
        ``p_{k+1} = D2 L_d(q_k, q_{k+1}) + F^+``   (discrete Legendre transform),

    with ``p = M(q) v`` translating to and from the velocity state. The unknown of the Newton
    solve is the midpoint velocity ``v_m = (q_{k+1} - q_k)/dt`` (better conditioned than
    ``q_{k+1}`` when ``dt`` is small); the solve goes through :func:`diffmech.implicit.newton_solve`,
    so the backward pass of a step costs one transposed linear solve plus one VJP, and robot
    parameters receive gradients through ``adjoint_params``. Second order, symplectic: the energy
    error stays bounded and momenta of cyclic coordinates are conserved to the solver tolerance.

    Restricted to fixed-base robots (the discrete Lagrangian uses the vector difference of
    configurations; a floating base would need its Lie-group form): a floating-base robot raises
    :class:`~diffmech.errors.ModelError`.

    Cost: a step evaluates the residual (one kinetic-energy gradient and one RNEA) about four to
    five times, plus two mass matrices and the explicit predictor: some 15 times a semi-implicit
    Euler step.

    Args:
        rtol: Newton tolerance relative to the size of the momentum balance,
            ``|r|_inf <= rtol (1 + |p_k|_inf + dt (|tau|_inf + |g(q_k) + k (q_k - rest) - J^T f_ext|_inf))``.
            Conserved momenta drift by at most the residual per step; rounding sets a floor near
            ``1e-15`` times that scale.
        max_iter: Newton iterations per step before :class:`~diffmech.errors.ConvergenceError`.
        jacobian: the matrix the forward iterations start from, at the explicit predictor (which
            lies ``O(dt^2)`` from the root): ``"approx"`` (default), ``-(M(q_m) + dt/2 diag(damping))``,
            one mass matrix; or ``"exact"``, ``n`` reverse passes through the Lagrangian's
            gradient. Either way an iteration that fails to halve the residual switches to the
            exact Jacobian, and the backward pass uses the exact Jacobian at the root.
        update: how the iterations refresh that matrix (see :func:`~diffmech.implicit.newton_solve`):
            ``"broyden"`` (default: rank-one secant updates, no extra evaluations), ``"chord"``
            or ``"newton"``.
    """

    name = "variational_midpoint"
    order = 2
    implicit = True
    supports_floating_base = False

    def __init__(self, rtol: float = 1e-13, max_iter: int = 30, jacobian: str = "approx", update: str = "broyden"):
        if jacobian not in ("approx", "exact"):
            raise ShapeError(f"VariationalMidpoint: jacobian must be 'approx' or 'exact', got {jacobian!r}")
        if update not in ("broyden", "chord", "newton"):
            raise ShapeError(f"VariationalMidpoint: update must be 'broyden', 'chord' or 'newton', got {update!r}")
        self.rtol = float(rtol)
        self.max_iter = int(max_iter)
        self.jacobian = jacobian
        self.update = update

    def __repr__(self) -> str:
        return (f"VariationalMidpoint(rtol={self.rtol:g}, max_iter={self.max_iter}, jacobian={self.jacobian!r}, "
                f"update={self.update!r})")

    @staticmethod
    def _damping(robot: RobotModel, like: Tensor) -> Tensor:
        if not robot.joint_names:
            return like.new_zeros(0)
        return torch.stack([robot.joint_params(n).damping for n in robot.joint_names]).to(like)

    def residual(self, robot: RobotModel, dt: float, passive: bool):
        """The discrete Euler-Lagrange residual on flat batches, with its Jacobians.

        Returns ``(fn, terms, jacobian, approx_jacobian)``:
        ``fn(v_m, q0, p0, tau, damping[, f_ext]) = p0 + D1 L_d(q0, q0 + dt v_m) + F^-``, where
        ``D1 L_d + F^- = dt/2 (dT/dq - dU/dq + f) - dT/dv`` at the midpoint ``(q_m, v_m)``;
        ``terms(...)`` returns the two parts ``(dt/2 (dT/dq - dU/dq + f), dT/dv)``;
        ``jacobian`` is the exact ``dr/dv_m (B, n, n)`` (``n`` reverse passes through the
        Lagrangian's gradient), ``approx_jacobian`` its leading part ``-(M(q_m) + dt/2 diag(d))``.
        ``dT/dq`` and ``dT/dv = M v`` come from one reverse pass through the kinetic energy;
        ``dU/dq - J^T f_ext`` (gravity, springs, external forces) is inverse dynamics at rest.
        """
        cache: dict = {}

        def terms(vm, q0, tau, damping, f_ext=None):
            qm = q0 + (0.5 * dt) * vm
            # A differentiable result is needed when the caller records a graph through the inputs
            # or the model's parameters: the kinetic energy's gradient is then built with create_graph.
            create = torch.is_grad_enabled() and (
                qm.requires_grad or vm.requires_grad or any(p.requires_grad for p in robot.parameters())
            )
            if not create and cache.get("x") is vm:  # the root of an untaped solve: reuse its evaluation
                return cache["terms"]
            with torch.enable_grad():
                # Fresh nodes: qm depends on vm, and the partials dT/dq, dT/dv are wanted.
                qg = qm.clone() if qm.requires_grad else qm.detach().requires_grad_(True)
                vg = vm.clone() if vm.requires_grad else vm.detach().requires_grad_(True)
                dt_dq, dt_dv = torch.autograd.grad(robot.kinetic_energy(qg, vg).sum(), (qg, vg), create_graph=create)
            zero = torch.zeros_like(vm)
            # Inverse dynamics at rest: g(q) + k (q - rest) - J^T f_ext (damping vanishes at v = 0).
            rest = rnea_flat(robot, qm, zero, zero, f_ext, passive)
            force = tau - damping * vm if passive else tau
            out = ((0.5 * dt) * (dt_dq - rest + force), dt_dv)
            if not create:
                cache["x"], cache["terms"] = vm, out
            return out

        def fn(vm, q0, p0, tau, damping, *f_ext):
            half, dt_dv = terms(vm, q0, tau, damping, f_ext[0] if f_ext else None)
            return p0 + half - dt_dv

        def jacobian(vm, *params):
            with torch.enable_grad():
                x = vm.detach().requires_grad_(True)
                r = fn(x, *(p.detach() for p in params))
                n = x.shape[-1]
                rows = [torch.autograd.grad(r[..., i].sum(), x, retain_graph=i < n - 1)[0] for i in range(n)]
            return torch.stack(rows, -2)

        def approx_jacobian(vm, q0, p0, tau, damping, *f_ext):
            M = robot.mass_matrix(q0 + (0.5 * dt) * vm)
            if passive:
                M = M + torch.diag_embed((0.5 * dt) * damping.expand_as(vm))
            return -M

        return fn, terms, jacobian, approx_jacobian

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        self.check_robot(robot)
        damping = self._damping(robot, q)
        M0 = robot.mass_matrix(q)
        p0 = (M0 @ v[..., None])[..., 0]
        fn, terms, jac, approx = self.residual(robot, dt, passive)
        with torch.no_grad():
            if hint is not None:
                x0 = (hint - q) / dt
            else:
                # Explicit predictor: the midpoint velocity of a constant-acceleration step.
                x0 = v + (0.5 * dt) * _accel(robot, q, v, tau, f_ext, passive, accel)
            # Tolerance relative to the terms of the momentum balance (their rounding sets the floor).
            zero = torch.zeros_like(v)
            rest = rnea_flat(robot, q, zero, zero, f_ext, passive)
            scale = 1.0 + p0.abs().amax(-1) + dt * (tau.abs().amax(-1) + rest.abs().amax(-1))
            tol = self.rtol * scale
        params = (q, p0, tau, damping) + ((f_ext,) if f_ext is not None else ())
        adjoint = tuple(p for p in robot.parameters() if p.requires_grad) if torch.is_grad_enabled() else ()
        vm = newton_solve(fn, x0, params, adjoint_params=adjoint, tol=tol, max_iter=self.max_iter, jacobian=jac,
                          approx_jacobian=approx if self.jacobian == "approx" else None, update=self.update,
                          context=context or "variational_midpoint step")
        q1 = q + dt * vm
        half, dt_dv = terms(vm, q, tau, damping, f_ext)
        p1 = dt_dv + half  # D2 L_d + F^+
        L1, info = torch.linalg.cholesky_ex(robot.mass_matrix(q1))
        if bool(info.any()):
            raise ModelError(f"{context or 'variational_midpoint step'}: the mass matrix of '{robot.name}' is not "
                             "positive definite (massless subtree?)")
        v1 = torch.cholesky_solve(p1[..., None], L1)[..., 0]
        return q1, v1


INTEGRATORS: dict[str, Integrator] = {
    "euler": ExplicitEuler(),
    "semi_implicit_euler": SemiImplicitEuler(),
    "rk4": RK4(),
    "midpoint": ExplicitMidpoint(),
    "variational_midpoint": VariationalMidpoint(),
}


def get_integrator(integrator: str | Integrator | Callable) -> Integrator:
    """Resolve a name of :data:`INTEGRATORS` (or pass an :class:`Integrator` through)."""
    if isinstance(integrator, Integrator):
        return integrator
    if isinstance(integrator, str):
        if integrator not in INTEGRATORS:
            raise ShapeError(f"unknown integrator '{integrator}'; choose from {sorted(INTEGRATORS)}")
        return INTEGRATORS[integrator]
    raise ShapeError(f"integrator must be a name from {sorted(INTEGRATORS)} or an Integrator, got {integrator!r}")
