"""Jacobians of forward dynamics and of whole integration steps at stored states, batched.

The reverse pass of :func:`diffmech.sim.rollout` needs, per step, the transposed Jacobian of
``x_{k+1} = step(x_k, u_k)``. These depend only on the stored states and the recorded
accelerations, so the Jacobians of many steps come from one batched call; only a small matrix
product per step stays sequential (see :func:`diffmech.sim.rollout`). The forward-dynamics
Jacobians are those of the implicit-function theorem at a known ``qdd``: ``d qdd / d tau = M^{-1}``
and ``d qdd / d(q, v) = -M^{-1} d RNEA / d(q, v)`` at fixed acceleration (hand-written RNEA VJP).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from torch import Tensor

from ..dynamics._common import RigidInertia, TreeState, tree_state, world_inertia
from ..dynamics.aba import _lu_apply, forward_dynamics_flat
from ..dynamics.crba import crba_flat
from ..dynamics.rnea_vjp import rnea_state_vjp, rnea_vjp_bl
from ..robot import RobotModel
from .integrators import Integrator

__all__ = ["dynamics_vjp", "dynamics_jacobians", "vjp_from_jacobians", "rows", "step_jacobians"]


def dynamics_vjp(robot: RobotModel, passive: bool, q: Tensor, v: Tensor, qdd: Tensor, g: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor]:
    """VJP of forward dynamics at a known ``qdd``, by hand (no graph; no ``f_ext``, no parameter):
    ``lam = M^{-1} g`` is the cotangent of ``tau``, and ``q``, ``v`` get the RNEA VJP with ``-lam``.
    One kinematic pass serves the mass matrix and the VJP. Returns ``(qbar (B, nq), vbar, lam)``."""
    tree, mt = robot.tree, robot.model_tensors(q.dtype, q.device)
    ts = tree_state(tree, mt, q)
    inertia = world_inertia(ts)
    # LU without error checks (as forward dynamics): a mass matrix is never singular.
    LU, piv, _ = torch.linalg.lu_factor_ex(crba_flat(tree, mt, q, ts, inertia))
    lam = _lu_apply(LU, piv, g)
    gq, gv, _ = rnea_state_vjp(tree, q, v, qdd, -lam, passive, ts, inertia)
    return gq, gv, lam


def dynamics_jacobians(robot: RobotModel, passive: bool, q: Tensor, v: Tensor, qdd: Tensor) -> tuple[Tensor, Tensor]:
    """Per-state Jacobians of forward dynamics at known ``qdd``, for ``q (N, nq), v, qdd (N, nv)``.

    Returns ``Minv (N, nv, nv)`` (``d qdd / d tau``) and ``JR (N, nv, nq + nv)``, the Jacobian of
    RNEA w.r.t. ``(q, v)`` at fixed acceleration (``d qdd / d(q, v) = -Minv JR``), the latter from the
    hand-written RNEA VJP of the ``nv`` unit cotangents of every state in one batched call.
    """
    N, nq, nv = q.shape[0], robot.nq, robot.nv
    tree, mt = robot.tree, robot.model_tensors(q.dtype, q.device)
    ts = tree_state(tree, mt, q)
    inertia = world_inertia(ts)
    LU, piv, _ = torch.linalg.lu_factor_ex(crba_flat(tree, mt, q, ts, inertia))
    eye = torch.eye(nv, dtype=q.dtype, device=q.device)
    Minv = torch.linalg.lu_solve(LU, piv, eye.expand(N, nv, nv))
    # nv copies of every state, batch-last: row i * N + j is unit cotangent i at state j.
    rep = _repeat_last(nv)
    ts_r = TreeState(R=rep(ts.R), p=rep(ts.p), S=rep(ts.S), mt=ts.mt)
    in_r = RigidInertia(m=inertia.m, h=rep(inertia.h), I=rep(inertia.I),
                        full=None if inertia.full is None else rep(inertia.full))
    lam = eye.repeat_interleave(N, dim=1)  # (nv, nv * N)
    qbar, vbar, _, _ = rnea_vjp_bl(tree, ts_r, rep(q.T), rep(v.T), rep(qdd.T), lam, passive, in_r)
    JR = torch.cat([qbar, vbar]).reshape(nq + nv, nv, N).permute(2, 1, 0)
    return Minv, JR


def _repeat_last(k: int) -> Callable[[Tensor], Tensor]:
    return lambda t: t.repeat(*([1] * (t.dim() - 1)), k)


def rows(t: Tensor, m: int) -> Tensor:
    """``t (N, ...)`` repeated as ``m`` consecutive blocks: ``(m * N, ...)``."""
    return t[None].expand(m, *t.shape).reshape(m * t.shape[0], *t.shape[1:])


def vjp_from_jacobians(Minv: Tensor, JR: Tensor, q: Tensor | None, v: Tensor | None, qdd: Tensor | None, g: Tensor
                       ) -> tuple[Tensor, Tensor, Tensor]:
    """The forward-dynamics VJP of :func:`dynamics_vjp` from per-state Jacobians ``Minv (N, nv, nv)``,
    ``JR (N, nv, nq + nv)``, for ``g (m * N, nv)``: block ``i`` of the rows at the ``N`` states
    (``q, v, qdd`` are not read; the signature is that of ``dynamics_vjp``'s partial)."""
    N, nv = Minv.shape[0], Minv.shape[1]
    nq = JR.shape[-1] - nv
    lam = (Minv @ g.reshape(-1, N, nv, 1))[..., 0]
    out = -(lam[..., None, :] @ JR)[..., 0, :]
    return out[..., :nq].reshape(-1, nq), out[..., nq:].reshape(-1, nv), lam.reshape(-1, nv)


class _JacobianDynamics(torch.autograd.Function):
    """Forward dynamics of ``m`` row blocks of ``N`` states whose value is known: the forward returns
    ``qdd``, the backward applies the precomputed Jacobians ``Minv, JR`` of the ``N`` states to
    every block (:func:`vjp_from_jacobians`)."""

    @staticmethod
    def forward(ctx, q, v, tau, qdd, Minv, JR):
        ctx.Minv, ctx.JR = Minv, JR
        return qdd.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        qb, vb, tb = vjp_from_jacobians(ctx.Minv, ctx.JR, None, None, None, g)
        return qb, vb, tb, None, None, None


def step_jacobians(robot: RobotModel, integ: Integrator, passive: bool, dt: float, q: Tensor, v: Tensor, u: Tensor,
                   acc: Tensor | None) -> Tensor:
    """Transposed Jacobians of one explicit step at ``N`` stored states, ``(N, m, nq + 2 nv)``.

    Row ``i`` of entry ``j`` is the gradient of output ``i`` of ``(q1, v1)`` (``m = nq + nv``) w.r.t.
    ``(q, v, u)`` at state ``j``: ``(qbar, vbar, ubar) = lam @ J`` for a cotangent ``lam (1, m)``.

    Args:
        q, v, u: ``(N, nq)``, ``(N, nv)``, ``(N, nv)`` states and controls (no ``f_ext``).
        acc: ``(accel_calls, N, nv)`` the step's recorded forward-dynamics values, or ``None``
            (recomputed here, one batched call per stage).

    Integrators with a hand-written reverse step (``hand_vjp``) apply it to the ``m`` unit
    cotangents of every state at once, with the dynamics Jacobians standing in for the dynamics;
    the others are differentiated by autograd through :meth:`Integrator.step_flat` on ``m``
    copies of the rows, with the dynamics replaced by their values and Jacobians (one batched
    :func:`dynamics_jacobians` call per stage). Either way no dynamics run under autograd.
    """
    N, nq, nv = q.shape[0], robot.nq, robot.nv
    m = nq + nv
    eye = torch.eye(m, dtype=q.dtype, device=q.device)
    basis = eye[:, None].expand(m, N, m).reshape(-1, m)
    if integ.hand_vjp:
        if acc is None:  # the Euler integrators evaluate the dynamics once, at the step's own state
            with torch.no_grad():
                acc = forward_dynamics_flat(robot.tree, robot.model_tensors(q.dtype, q.device), q, v, u, None, passive,
                                            "auto", False)[None]
        dyn = functools.partial(vjp_from_jacobians, *dynamics_jacobians(robot, passive, q, v, acc[0]))
        gq, gv, gu = integ.step_vjp_flat(robot, rows(q, m), rows(v, m), rows(acc.transpose(0, 1), m).transpose(0, 1),
                                         dt, basis[:, :nq], basis[:, nq:], dyn)
    else:
        stage = [0]

        def accel(qs, vs, taus, f_ext):
            i = stage[0]
            stage[0] += 1
            q0, v0 = qs[:N].detach(), vs[:N].detach()
            if acc is not None:
                a = acc[i]
            else:
                with torch.no_grad():
                    a = forward_dynamics_flat(robot.tree, robot.model_tensors(q.dtype, q.device), q0, v0,
                                              taus[:N].detach(), None, passive, "auto", False)
            Minv, JR = dynamics_jacobians(robot, passive, q0, v0, a)
            return _JacobianDynamics.apply(qs, vs, taus, rows(a, m), Minv, JR)

        with torch.enable_grad():
            qr, vr, ur = (rows(t, m).detach().requires_grad_(True) for t in (q, v, u))
            q1, v1 = integ.step_flat(robot, qr, vr, ur, dt, None, passive, accel=accel)
            gq, gv, gu = torch.autograd.grad((q1, v1), (qr, vr, ur), (basis[:, :nq], basis[:, nq:]), allow_unused=True)
        gu = torch.zeros_like(ur) if gu is None else gu
    return torch.cat([gq, gv, gu], dim=-1).reshape(m, N, -1).transpose(0, 1)
