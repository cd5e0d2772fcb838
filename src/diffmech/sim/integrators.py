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
from typing import NamedTuple

import torch
from torch import Tensor

from .. import spatial
from ..dynamics._common import (
    RigidInertia,
    external_body_forces,
    force_cross,
    gravity_acceleration,
    masks,
    motion_cross,
    passive_forces,
    tree_state,
    tree_sum,
    velocity_of_dofs,
    world_inertia,
)
from ..dynamics.aba import forward_dynamics_flat
from ..dynamics.free_flyer import free_flyer_integrate, free_flyer_vjp
from ..dynamics.kinematics import integrate_flat
from ..errors import ModelError, OptionError, ShapeError
from ..implicit import newton_solve
from ..model.parameters import ModelTensors
from ..model.tree import symmetric_from_pairs
from ..robot import RobotModel

__all__ = [
    "Integrator", "ExplicitEuler", "SemiImplicitEuler", "ExplicitMidpoint", "RK4", "VariationalMidpoint",
    "INTEGRATORS", "get_integrator",
]


def check_dt(dt, who: str) -> float:
    """``dt`` as a float; :class:`~diffmech.errors.ShapeError` naming ``who`` unless it is a positive
    finite number of seconds (zero freezes a trajectory, a negative one runs it backwards)."""
    try:
        x = math.nan if isinstance(dt, (bool, str, bytes)) else float(dt)
    except (TypeError, ValueError, RuntimeError):
        x = math.nan
    if not (math.isfinite(x) and x > 0):
        raise ShapeError(f"{who}: dt must be a positive finite number of seconds, got {dt!r}")
    return x


def _accel(robot: RobotModel, q: Tensor, v: Tensor, tau: Tensor, f_ext: Tensor | None, passive: bool,
           accel: Callable | None = None) -> Tensor:
    if accel is not None:
        return accel(q, v, tau, f_ext)
    # ABA forward, one M^{-1} solve + one RNEA VJP backward (implicit function theorem).
    return forward_dynamics_flat(robot.tree, robot.model_tensors(q.dtype, q.device), q, v, tau, f_ext, passive,
                                 "auto", True)


def _advance(robot: RobotModel, q: Tensor, v: Tensor, dt: float) -> Tensor:
    """Flat ``q (B, nq)`` moved with constant velocity ``v (B, nv)`` for ``dt`` (on the manifold)."""
    if robot.tree.n_ball:
        return integrate_flat(robot.tree, q, dt * v)
    if not robot.floating_base:
        return q + dt * v
    return free_flyer_integrate(q, dt * v)


def _advance_vjp(robot: RobotModel, q: Tensor, v: Tensor, dt: float, g: Tensor) -> tuple[Tensor, Tensor]:
    """Cotangents ``(qbar (B, nq), vbar (B, nv))`` of :func:`_advance` for ``g (B, nq)``, no graph."""
    if robot.tree.n_ball:  # the quaternion steps of ball joints: by autograd
        with torch.enable_grad():
            q_, v_ = q.detach().requires_grad_(True), v.detach().requires_grad_(True)
            qbar, vbar = torch.autograd.grad(integrate_flat(robot.tree, q_, dt * v_), (q_, v_), g)
        return qbar, vbar
    if not robot.floating_base:
        return g, dt * g
    qbar, dvbar = free_flyer_vjp(q, dt * v, g)
    return qbar, dt * dvbar


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
    Euclidean and pass through unchanged; a ball joint's angular velocity takes the same series on
    SO(3), ``k + 1/2 Omega x k + 1/12 Omega x (Omega x k)``.
    """
    if not (robot.floating_base or robot.tree.n_ball) or terms == 0:
        return k
    if robot.tree.n_ball:
        tb = robot.tree.tables(k.dtype, k.device)
        B, n = k.shape[0], robot.tree.n_ball
        w = omega.index_select(1, tb.ball_v).reshape(B, n, 3)
        kb = k.index_select(1, tb.ball_v).reshape(B, n, 3)
        ad1 = torch.linalg.cross(w, kb, dim=-1)
        out = kb + 0.5 * ad1
        if terms > 1:
            out = out + torch.linalg.cross(w, ad1, dim=-1) / 12.0
        k = k.index_copy(1, tb.ball_v, out.reshape(B, 3 * n))
        if not robot.floating_base:
            return k
    w, kb = omega[:, :6], k[:, :6]
    ad1 = spatial.motion_cross(w, kb)
    out = kb + 0.5 * ad1
    if terms > 1:
        out = out + spatial.motion_cross(w, ad1) / 12.0
    return torch.cat([out, k[:, 6:]], dim=-1)


class _Configuration:
    """The configuration-dependent part of a kinematic pass at ``q (B, nq)``: body placements and
    world inertias, and on demand the composite inertias and ``M(q)`` (as
    :func:`~diffmech.dynamics.crba.crba_flat`, from the same inertias)."""

    def __init__(self, robot: RobotModel, q: Tensor, mt: ModelTensors | None = None):
        self.robot, self.q = robot, q
        self.tree = tree = robot.tree
        self.mt = robot.model_tensors(q.dtype, q.device) if mt is None else mt
        self.ts = tree_state(tree, self.mt, q)
        self.inertia = world_inertia(self.ts)
        self.mask_bd, self.mask_db = masks(tree, q)
        self.tables = tree.tables(q.dtype, q.device)
        self._composite: tuple[RigidInertia, Tensor] | None = None

    def composite(self) -> tuple[RigidInertia, Tensor]:
        """Composite inertias ``Ic`` of the subtrees of the joints and ``Ic S (nv, 6, B)``."""
        if self._composite is None:
            I, mask_db = self.inertia, self.mask_db
            Ic = RigidInertia(m=mask_db @ I.m, h=tree_sum(mask_db, I.h), I=tree_sum(mask_db, I.I))
            self._composite = Ic, Ic.apply(self.ts.S)
        return self._composite

    def symmetric(self, vals: Tensor) -> Tensor:
        """``(B, nv, nv)`` symmetric matrix from its values ``(npairs, B)`` at the CRBA pairs (``d`` at
        or above ``e``)."""
        return symmetric_from_pairs(self.tables, vals)  # one gather: no O(nv^4) placement table

    def mass(self) -> Tensor:
        """``M(q) (B, nv, nv)``: ``M[d, e] = S_d . Ic_e S_e``."""
        tb = self.tables
        _, IcS = self.composite()
        return self.symmetric((self.ts.S[tb.crba_d] * IcS[tb.crba_e]).sum(1))


class _LagrangianPass:
    """The Lagrangian's derivatives at one point ``(q, v (B, nv))`` of a fixed-base robot, from one
    kinematic pass over a :class:`_Configuration` at ``q``.

    No reverse-mode AD: the forward Newton iterations of the variational integrator record
    nothing, and with inputs that require grad the values are ordinary differentiable expressions.
    Varying ``q_e`` moves the subtree of joint ``e`` rigidly with the world-frame twist ``S_e``:
    its world inertias change by ``S_e x* I - I S_e x`` and the columns below ``e`` by
    ``S_e x S_f``. With ``H_e`` the momentum of the subtree of ``e``, ``Ic_e`` its composite
    inertia and ``Sdot_e = V_body(e) x S_e``, this gives exactly

        ``dT/dv_e = S_e . H_e`` (``= (M v)_e``),   ``dT/dq_e = Sdot_e . H_e``,

    and, for ``d`` at or above ``e`` (other pairs vanish), with ``Y_e = Ic_e Sdot_e + S_e x* H_e``
    and the gravity acceleration ``a_g``:

        ``K = d(M v)/dq``:  ``K[d, e] = S_d . Y_e``,  ``K[e, d] = Sdot_d . Ic_e S_e``,
        ``d^2T/dq^2[d, e] = Sdot_d . Y_e``,   ``d^2U_g/dq^2[d, e] = (a_g x S_d) . Ic_e S_e`` (both symmetric).

    Attributes (batch-first):
        dT_dq, dT_dv: (B, nv) partials of the kinetic energy.
        rest: (B, nv) ``dU/dq - J^T f_ext = g(q) + k (q - rest) - J^T f_ext`` (springs when
            ``passive``), i.e. inverse dynamics at rest.
    """

    def __init__(self, conf: _Configuration, v: Tensor, f_ext: Tensor | None, passive: bool):
        self.conf, self.passive = conf, passive
        robot, mt, ts, inertia = conf.robot, conf.mt, conf.ts, conf.inertia
        S = ts.S  # (nv, 6, B)
        self.vT = vT = v.transpose(0, 1)
        self.V = V = tree_sum(conf.mask_bd, S * vT[:, None])  # (nb, 6, B) body velocities
        # d/dt S_d = V_body(d) x S_d (without a floating base, DoF d is body d).
        self.Sdot = motion_cross(velocity_of_dofs(robot.tree, V), S)  # (nv, 6, B)
        self.IV = inertia.apply(V)
        # The forces that hold every body at rest against gravity, I a_g with a_g = (-g; 0):
        # (-m g; h x -g), written out (a fifth of the operations of inertia.apply).
        g = mt.gravity[:, None].expand_as(inertia.h)
        F_rest = torch.cat([-inertia.m[..., None] * g, torch.linalg.cross(g, inertia.h, dim=-2)], 1)
        self.ext = external_body_forces(robot.tree, ts, f_ext) if f_ext is not None else None
        if self.ext is not None:
            F_rest = F_rest - self.ext
        sub = tree_sum(conf.mask_db, torch.cat([self.IV, F_rest], 1))  # subtree sums, (nv, 12, B)
        self.H = sub[:, :6]
        self.dT_dv = (S * self.H).sum(1).transpose(0, 1)
        self.dT_dq = (self.Sdot * self.H).sum(1).transpose(0, 1)
        rest = (S * sub[:, 6:]).sum(1).transpose(0, 1)
        if passive:  # the springs' potential (fixed base: every coordinate is a joint's)
            rest = rest + mt.stiffness * (conf.q - mt.rest)
        self.rest = rest

    def bias(self) -> Tensor:
        """``(B, nv)`` inverse dynamics at zero acceleration, ``C(q, v) v + g(q) - J^T f_ext`` (minus
        the damping and spring forces when ``passive``): RNEA on this pass's velocities."""
        conf = self.conf
        A = tree_sum(conf.mask_bd, self.Sdot * self.vT[:, None]) + gravity_acceleration(conf.mt)
        F = conf.inertia.apply(A) + force_cross(self.V, self.IV)
        if self.ext is not None:
            F = F - self.ext
        h = (conf.ts.S * tree_sum(conf.mask_db, F)).sum(1)
        if self.passive:
            h = h - passive_forces(conf.tree, conf.mt, conf.q.transpose(0, 1), self.vT)
        return h.transpose(0, 1)

    def second_derivatives(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(K, d^2T/dq^2, d^2U/dq^2)``, each ``(B, nv, nv)``, with ``K = d(M(q) v)/dq``.

        ``U`` is gravity plus the joint springs (when ``passive``); the external forces' change
        with ``q`` is not included.
        """
        conf = self.conf
        robot = conf.robot
        S, Sdot = conf.ts.S, self.Sdot
        Ic, IcS = conf.composite()
        d, e = conf.tables.crba_d, conf.tables.crba_e
        Y = (Ic.apply(Sdot) + force_cross(S, self.H))[e]  # (npairs, 6, B)
        B = Y.shape[-1]
        # K[e, d] first: for d = e both values agree, and K[d, e] overwrites it.
        K = Y.new_zeros(robot.nv, robot.nv, B).index_put((e, d), (Sdot[d] * IcS[e]).sum(1))
        K = K.index_put((d, e), (S[d] * Y).sum(1)).permute(2, 0, 1)
        T_qq = conf.symmetric((Sdot[d] * Y).sum(1))
        # a_g x S_d = (-g x w_d; 0) for the angular part w_d of S_d.
        w = S[:, 3:]
        g_w = torch.linalg.cross(conf.mt.gravity[:, None].expand_as(w), w, dim=-2)
        U_qq = conf.symmetric(-(g_w[d] * IcS[e, :3]).sum(1))
        if self.passive and robot.nj:
            U_qq = U_qq + torch.diag_embed(conf.mt.stiffness.expand(B, robot.nv))
        return K, T_qq, U_qq


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
    # Integrators with ``hand_vjp`` also define ``step_vjp_flat(robot, q, v, accels, dt, gq1, gv1,
    # dynamics_vjp) -> (qbar, vbar, taubar)``: the reverse step by hand, with no graph, for cotangents
    # ``gq1 (B, nq), gv1 (B, nv)`` of the step's outputs; ``accels (accel_calls, B, nv)`` are the
    # step's recorded forward-dynamics values and ``dynamics_vjp(q, v, qdd, g) -> (qbar, vbar, taubar)``
    # the forward-dynamics VJP at one of them. :func:`diffmech.sim.rollout` replays the others under autograd.
    hand_vjp = False

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
        dt = check_dt(dt, f"integrator '{self.name}'")
        entries = [("q", q, (robot.nq,)), ("v", v, (robot.nv,)), ("tau", tau, (robot.nv,))]
        if f_ext is not None:
            entries.append(("f_ext", f_ext, (robot.n_links, 6)))
        flat, batch = _flatten(robot, entries)
        fe = flat[3] if f_ext is not None else None
        q1, v1 = self.step_flat(robot, flat[0], flat[1], flat[2], dt, fe, passive)
        return q1.reshape(*batch, robot.nq), v1.reshape(*batch, robot.nv)

    step = __call__

    def check_robot(self, robot: RobotModel) -> None:
        """Raise :class:`~diffmech.errors.ModelError` if this integrator cannot simulate ``robot``."""
        if robot.tree.nb == 0:
            raise ModelError(f"'{robot.name}' is a static model (no moving joint and no floating base: nq = nv = 0): "
                             "nothing to integrate; use it as a fixed obstacle in a diffmech.sim.Scene")
        if self.implicit and robot.tree.coords is not None:
            raise ModelError(f"integrator '{self.name}' does not support mimic joints ('{robot.name}' has some); "
                             "use 'semi_implicit_euler', 'euler', 'midpoint' or 'rk4'")
        if self.implicit and robot.tree.n_ball:
            raise ModelError(f"integrator '{self.name}' does not support ball joints ('{robot.name}' has some); "
                             "use 'semi_implicit_euler', 'euler', 'midpoint' or 'rk4'")
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
    hand_vjp = True

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        a = _accel(robot, q, v, tau, f_ext, passive, accel)
        return _advance(robot, q, v, dt), v + dt * a

    def step_vjp_flat(self, robot, q, v, accels, dt, gq1, gv1, dynamics_vjp):
        gq, gv = _advance_vjp(robot, q, v, dt, gq1)
        gq_d, gv_d, g_tau = dynamics_vjp(q, v, accels[0], dt * gv1)
        return gq + gq_d, gv + gv1 + gv_d, g_tau


class SemiImplicitEuler(Integrator):
    """Semi-implicit (symplectic) Euler: ``v' = v + a(q, v) dt``, then ``q' = q (+) v' dt``.

    First order; symplectic for separable conservative systems (bounded energy error at small dt).
    """

    name = "semi_implicit_euler"
    order = 1
    accel_calls = 1
    hand_vjp = True

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        v1 = v + dt * _accel(robot, q, v, tau, f_ext, passive, accel)
        return _advance(robot, q, v1, dt), v1

    def step_vjp_flat(self, robot, q, v, accels, dt, gq1, gv1, dynamics_vjp):
        a = accels[0]
        gq, gv_adv = _advance_vjp(robot, q, v + dt * a, dt, gq1)
        gv1 = gv1 + gv_adv
        gq_d, gv_d, g_tau = dynamics_vjp(q, v, a, dt * gv1)
        return gq + gq_d, gv1 + gv_d, g_tau


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


class _Carry(NamedTuple):
    """What an untaped variational step leaves for a next step that starts from its result."""

    q: Tensor  # (B, nq) the returned configuration
    v: Tensor  # (B, nv) the returned velocity
    versions: tuple[int, int]  # of q and v when returned (an in-place change voids the carry)
    dt: float
    passive: bool
    conf: _Configuration  # the pass at q (its mass matrix included)
    chol: Tensor  # (B, nv, nv) Cholesky factor of M(q)
    errors: tuple[Tensor, ...]  # (B, nv) errors v_m - x_0 of the latest explicit predictors, newest first


# Polynomial extrapolation of a sequence from its last n values (newest first), n = 1, 2, 3.
_EXTRAPOLATION = {1: (1.0,), 2: (2.0, -1.0), 3: (3.0, -3.0, 1.0)}
_HISTORY = 3  # predictor errors kept


class VariationalMidpoint(Integrator):
    """Variational midpoint integrator (discrete mechanics; Marsden & West 2001).

    Discrete Lagrangian ``L_d(q0, q1) = dt L((q0 + q1)/2, (q1 - q0)/dt)`` with ``L = T(q, v) - U(q)``:
    ``T`` is :meth:`~diffmech.RobotModel.kinetic_energy` and ``U``
    :meth:`~diffmech.RobotModel.potential_energy` (gravity, plus the joint springs when
    ``passive``). Their gradients ``dT/dq``, ``dT/dv = M v`` and ``g(q) + k (q - rest)`` (inverse
    dynamics at rest), and the residual's Jacobian, come in closed form from one kinematic pass
    per evaluation (no reverse-mode AD; see :class:`_LagrangianPass`).
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

    Cost: Newton starts from the explicit predictor with the residual's Jacobian there (exact
    without external forces), so a step typically takes two or three residual evaluations of one
    kinematic pass each, plus one pass at ``q_k`` (momentum, predictor, tolerance) and one mass
    matrix at ``q_{k+1}``: some three semi-implicit Euler steps. Consecutive steps are cheaper:
    when a step without a graph starts from the tensors the previous step of this instance
    returned (unchanged, same robot, parameters, ``dt`` and ``passive``; as in
    :func:`diffmech.sim.rollout`), it reuses that step's pass at ``q_k`` and mass-matrix factor and
    corrects the predictor by extrapolating its errors over the last three steps (``O(dt^2)`` to
    ``O(dt^5)``), which usually leaves two residual evaluations. Only the Newton start changes,
    so results agree with an isolated step to the solver tolerance.

    Args:
        rtol: Newton tolerance relative to the size of the momentum balance,
            ``|r|_inf <= rtol (1 + |p_k|_inf + dt (|tau|_inf + |g(q_k) + k (q_k - rest) - J^T f_ext|_inf))``.
            Conserved momenta drift by at most the residual per step; rounding sets a floor near
            ``1e-15`` times that scale.
        max_iter: Newton iterations per step before :class:`~diffmech.errors.ConvergenceError`.
        jacobian: the matrix the forward iterations start from, at the predictor (which lies
            ``O(dt^2)`` from the root): ``"approx"`` (default), the closed form
            ``-(M + dt/2 diag(damping)) + dt/2 (K^T - K) + dt^2/4 (d^2T/dq^2 - d^2U/dq^2)`` at the
            midpoint (``K = d(M v)/dq``; it leaves out only the change of ``J^T f_ext`` with ``q``);
            or ``"exact"``, ``n`` reverse passes through the residual. Either way an iteration
            that fails to halve the residual switches to the exact Jacobian, and the backward pass
            uses the exact Jacobian at the root.
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
            raise OptionError(f"VariationalMidpoint: jacobian must be 'approx' or 'exact', got {jacobian!r}")
        if update not in ("broyden", "chord", "newton"):
            raise OptionError(f"VariationalMidpoint: update must be 'broyden', 'chord' or 'newton', got {update!r}")
        self.rtol = float(rtol)
        self.max_iter = int(max_iter)
        self.jacobian = jacobian
        self.update = update
        self._carry: _Carry | None = None

    def __repr__(self) -> str:
        return (f"VariationalMidpoint(rtol={self.rtol:g}, max_iter={self.max_iter}, jacobian={self.jacobian!r}, "
                f"update={self.update!r})")

    @staticmethod
    def _damping(robot: RobotModel, like: Tensor) -> Tensor:
        if not robot.joint_names:
            return like.new_zeros(0)
        return torch.stack([robot.joint_params(n).damping for n in robot.joint_names]).to(like)

    def residual(self, robot: RobotModel, dt: float, passive: bool, *, mt: ModelTensors | None = None):
        """The discrete Euler-Lagrange residual on flat batches, with its Jacobians.

        Returns ``(fn, terms, jacobian, approx_jacobian)``:
        ``fn(v_m, q0, p0, tau, damping[, f_ext]) = p0 + D1 L_d(q0, q0 + dt v_m) + F^-``, where
        ``D1 L_d + F^- = dt/2 (dT/dq - dU/dq + f) - dT/dv`` at the midpoint ``(q_m, v_m)``;
        ``terms(...)`` returns the two parts ``(dt/2 (dT/dq - dU/dq + f), dT/dv)``;
        ``jacobian`` is the exact ``dr/dv_m (B, n, n)`` (``n`` reverse passes through the
        residual), ``approx_jacobian`` the same in closed form without the change of
        ``J^T f_ext`` with ``q`` (exact when there are no external forces):
        ``-(M + dt/2 diag(d)) + dt/2 (K^T - K) + dt^2/4 (d^2T/dq^2 - d^2U/dq^2)`` at the midpoint,
        ``K = d(M v)/dq``.

        ``dT/dq``, ``dT/dv = M v`` and ``dU/dq - J^T f_ext`` (gravity, springs, external forces:
        inverse dynamics at rest) come from one kinematic pass (:class:`_LagrangianPass`), without
        reverse-mode AD; they are differentiable expressions, so the backward pass of
        :func:`~diffmech.implicit.newton_solve` differentiates them directly. ``mt`` (the model's
        tensors, without a graph) is reused by the evaluations that autograd does not record.
        """
        cache: dict = {"mt": mt}

        def tracked(*tensors) -> bool:
            """Whether autograd records through this evaluation (then it is neither cached nor reused)."""
            if not torch.is_grad_enabled():
                return False
            if any(t is not None and t.requires_grad for t in tensors):
                return True
            if "learnable" not in cache:
                cache["learnable"] = any(p.requires_grad for p in robot.parameters())
            return cache["learnable"]

        def evaluate(vm, q0, tau, damping, f_ext):
            taped = tracked(vm, q0, tau, damping, f_ext)
            # The last untaped evaluation is kept: the root of a solve and the approximate Jacobian
            # at its start point reuse it.
            if not taped and cache.get("x") is vm:
                return cache["pass"], cache["terms"]
            lp = _LagrangianPass(_Configuration(robot, q0 + (0.5 * dt) * vm, None if taped else cache["mt"]), vm, f_ext,
                                 passive)
            force = tau - damping * vm if passive else tau
            out = ((0.5 * dt) * (lp.dT_dq - lp.rest + force), lp.dT_dv)
            if not taped:
                cache.update(x=vm, terms=out, mt=lp.conf.mt)
                cache["pass"] = lp
            return lp, out

        def terms(vm, q0, tau, damping, f_ext=None):
            return evaluate(vm, q0, tau, damping, f_ext)[1]

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
            lp = evaluate(vm, q0, tau, damping, f_ext[0] if f_ext else None)[0]
            K, T_qq, U_qq = lp.second_derivatives()
            J = (0.5 * dt) * (K.transpose(-1, -2) - K) + (0.25 * dt * dt) * (T_qq - U_qq) - lp.conf.mass()
            if passive:
                J = J - torch.diag_embed((0.5 * dt) * damping.expand_as(vm))
            return J

        return fn, terms, jacobian, approx_jacobian

    def _continuation(self, robot: RobotModel, q: Tensor, v: Tensor, dt: float, passive: bool,
                      mt: ModelTensors) -> _Carry | None:
        """The carry of the previous step if this step starts from its result, unchanged."""
        c = self._carry
        if c is None or c.q is not q or c.v is not v or (q._version, v._version) != c.versions:
            return None
        if c.conf.robot is not robot or c.conf.mt is not mt or c.dt != dt or c.passive != passive:
            return None  # another model, changed parameters, or another step
        return c

    def step_flat(self, robot, q, v, tau, dt, f_ext=None, passive=True, *, context="", hint=None, accel=None):
        self.check_robot(robot)
        damping = self._damping(robot, q)
        grad = torch.is_grad_enabled()
        adjoint = tuple(p for p in robot.parameters() if p.requires_grad) if grad else ()
        taped = grad and (bool(adjoint) or any(t is not None and t.requires_grad for t in (q, v, tau, f_ext)))
        # Without a graph the model's tensors are fetched once per step (their cache check is not free).
        mt = None if taped else robot.model_tensors(q.dtype, q.device)
        carry = None if taped else self._continuation(robot, q, v, dt, passive, mt)
        self._carry = None
        fn, terms, jac, approx = self.residual(robot, dt, passive, mt=mt)
        conf = carry.conf if carry is not None else _Configuration(robot, q, mt)
        start = _LagrangianPass(conf, v, f_ext, passive)
        p0 = start.dT_dv  # M(q_k) v_k
        explicit = None
        with torch.no_grad():
            if hint is not None:
                x0 = (hint - q) / dt
            else:
                # Explicit predictor: the midpoint velocity of a constant-acceleration step. The
                # acceleration M^{-1} (tau - h) reuses the pass at q_k (equal to ABA's to rounding).
                if accel is not None:
                    a = accel(q, v, tau, f_ext)
                else:
                    L0 = carry.chol if carry is not None else torch.linalg.cholesky_ex(conf.mass())[0]
                    a = torch.cholesky_solve((tau - start.bias())[..., None], L0)[..., 0]
                x0 = explicit = v + (0.5 * dt) * a
                if carry is not None and carry.errors:
                    # The predictor's error varies smoothly along a trajectory (with smooth controls):
                    # extrapolate it from the previous steps, O(dt^2) -> O(dt^{2+n}) with n of them.
                    x0 = x0 + sum(c * e for c, e in zip(_EXTRAPOLATION[len(carry.errors)], carry.errors))
            # Tolerance relative to the terms of the momentum balance (their rounding sets the floor).
            scale = 1.0 + p0.abs().amax(-1) + dt * (tau.abs().amax(-1) + start.rest.abs().amax(-1))
            tol = self.rtol * scale
        params = (q, p0, tau, damping) + ((f_ext,) if f_ext is not None else ())
        vm = newton_solve(fn, x0, params, adjoint_params=adjoint, tol=tol, max_iter=self.max_iter, jacobian=jac,
                          approx_jacobian=approx if self.jacobian == "approx" else None, update=self.update,
                          context=context or "variational_midpoint step")
        q1 = q + dt * vm
        half, dt_dv = terms(vm, q, tau, damping, f_ext)
        p1 = dt_dv + half  # D2 L_d + F^+
        conf1 = _Configuration(robot, q1, mt)
        L1, info = torch.linalg.cholesky_ex(conf1.mass())
        if bool(info.any()):
            raise ModelError(f"{context or 'variational_midpoint step'}: the mass matrix of '{robot.name}' is not "
                             "positive definite (massless subtree?)")
        v1 = torch.cholesky_solve(p1[..., None], L1)[..., 0]
        if not taped and explicit is not None:
            errors = (vm - explicit,) + (carry.errors[:_HISTORY - 1] if carry is not None else ())
            self._carry = _Carry(q1, v1, (q1._version, v1._version), dt, passive, conf1, L1, errors)
        return q1, v1

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_carry": None}


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
            raise OptionError(f"unknown integrator {integrator!r}; choose from {sorted(INTEGRATORS)}")
        return INTEGRATORS[integrator]
    raise OptionError(f"integrator must be a name from {sorted(INTEGRATORS)} or an Integrator, got {integrator!r}")
