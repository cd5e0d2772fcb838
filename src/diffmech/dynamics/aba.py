"""Forward dynamics: the Articulated Body Algorithm (Featherstone 2008, §7.3) and its fast gradient.

ABA is written in the world frame, so articulated inertias pass from child to parent without any
coordinate transform; bodies of one depth are processed together. ``forward_dynamics`` wraps it
with the cheap backward of the implicit function theorem: since ``ID(q, v, qdd, theta) = tau``,
for a cotangent ``g`` of ``qdd``, ``lam = M^{-1} g`` is the cotangent of ``tau`` and the
cotangents of ``q``, ``v``, ``f_ext`` and every model parameter are the VJP of RNEA with ``-lam``
(at the solved ``qdd``). The forward pass then keeps no graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import spatial
from ..errors import ShapeError
from ..model.robot import ModelTensors, RobotModel
from ._common import (
    as_state, external_body_forces, f_ext_entry, gravity_acceleration, masks, passive_forces, tree_state,
    world_inertia,
)
from .crba import crba_flat
from .rnea import rnea_flat

__all__ = ["aba", "forward_dynamics", "aba_flat", "forward_dynamics_flat"]

METHODS = ("aba", "crba")


def aba_flat(
    model: RobotModel,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    f_ext: Tensor | None = None,
    passive: bool = True,
    mt: ModelTensors | None = None,
) -> Tensor:
    """ABA on flat batches: ``q (B, nq), v (B, nv), tau (B, nv) -> qdd (B, nv)``."""
    ts = tree_state(model, q, mt)
    mt = ts.mt
    S = ts.S
    Iw = world_inertia(ts)
    mask_bd, _, _ = masks(model, q)
    V = mask_bd @ (S * v[..., None])
    c = spatial.motion_cross(V[:, model.dof_body], S) * v[..., None]  # (B, nv, 6) velocity-product accel.
    pA_all = spatial.force_cross(V, (Iw @ V[..., None])[..., 0])
    if f_ext is not None:
        pA_all = pA_all - external_body_forces(model, ts, f_ext)
    if passive:
        tau = tau + passive_forces(model, mt, q, v)
    IA = list(Iw.unbind(1))
    pA = list(pA_all.unbind(1))
    off = model._nfree
    dof0 = 6 * off - off  # dof of one-DoF body b is b + dof0
    saved = []
    for idx, par in reversed(model._levels):
        if off and idx == [0]:
            continue
        dofs = [b + dof0 for b in idx]
        if len(idx) == 1:
            Il, pl = IA[idx[0]][:, None], pA[idx[0]][:, None]
            Sl, cl, tl = S[:, dofs[0], None], c[:, dofs[0], None], tau[:, dofs[0], None]
        else:
            Il, pl = torch.stack([IA[b] for b in idx], 1), torch.stack([pA[b] for b in idx], 1)
            Sl, cl, tl = S[:, dofs], c[:, dofs], tau[:, dofs]
        U = (Il @ Sl[..., None])[..., 0]  # (B, k, 6)
        D = (Sl * U).sum(-1)  # (B, k)
        u = tl - (Sl * pl).sum(-1)
        Ia = Il - U[..., :, None] * (U / D[..., None])[..., None, :]
        pa = pl + (Ia @ cl[..., None])[..., 0] + U * (u / D)[..., None]
        for k, p in enumerate(par):
            if p >= 0:
                IA[p] = IA[p] + Ia[:, k]
                pA[p] = pA[p] + pa[:, k]
        saved.append((idx, par, U, D, u, Sl, cl))

    a_world = gravity_acceleration(mt).expand(q.shape[0], 6)
    A: list[Tensor] = [None] * model.nb  # type: ignore[list-item]
    qdd: list[Tensor] = [None] * model.nv  # type: ignore[list-item]
    if off:
        S0 = S[:, :6].transpose(-1, -2)  # columns are the six base DoFs
        U0 = IA[0] @ S0
        D0 = S0.transpose(-1, -2) @ U0
        u0 = tau[:, :6] - (S0.transpose(-1, -2) @ pA[0][..., None])[..., 0]
        rhs = u0 - (U0.transpose(-1, -2) @ a_world[..., None])[..., 0]
        qdd0 = torch.linalg.solve(D0, rhs)
        A[0] = a_world + (S0 @ qdd0[..., None])[..., 0]
        qdd[:6] = list(qdd0.unbind(-1))
    for idx, par, U, D, u, Sl, cl in reversed(saved):
        if len(idx) == 1:
            ap = (A[par[0]] if par[0] >= 0 else a_world)[:, None]
        else:
            ap = torch.stack([A[p] if p >= 0 else a_world for p in par], 1)
        ql = (u - (U * (ap + cl)).sum(-1)) / D
        Al = ap + cl + Sl * ql[..., None]
        for k, b in enumerate(idx):
            A[b] = Al[:, k]
            qdd[b + dof0] = ql[:, k]
    return torch.stack(qdd, -1)


def _solve_crba(model, q, v, tau, f_ext, passive, mt):
    ts = tree_state(model, q, mt)
    M = crba_flat(model, q, ts)
    h = rnea_flat(model, q, v, torch.zeros_like(v), f_ext, passive, ts=ts)
    L = torch.linalg.cholesky(M)
    return torch.cholesky_solve((tau - h)[..., None], L)[..., 0]


def _solve(model, method, q, v, tau, f_ext, passive, mt):
    if method == "aba":
        return aba_flat(model, q, v, tau, f_ext, passive, mt)
    return _solve_crba(model, q, v, tau, f_ext, passive, mt)


class _ForwardDynamics(torch.autograd.Function):
    """Forward dynamics whose backward is one ``M^{-1}`` solve plus one RNEA VJP."""

    @staticmethod
    def forward(ctx, model, method, passive, q, v, tau, f_ext, *mt_fields):
        mt = ModelTensors(*mt_fields)
        qdd = _solve(model, method, q, v, tau, f_ext, passive, mt)
        ctx.model, ctx.passive = model, passive
        ctx.has_f_ext = f_ext is not None
        ctx.save_for_backward(q, v, qdd, f_ext if f_ext is not None else q.new_empty(0), *mt_fields)
        return qdd

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, v, qdd, f_ext, *mt_fields = ctx.saved_tensors
        f_ext = f_ext if ctx.has_f_ext else None
        model = ctx.model
        needs = ctx.needs_input_grad
        mt = ModelTensors(*mt_fields)
        M = crba_flat(model, q, tree_state(model, q, mt))
        lam = torch.cholesky_solve(g[..., None], torch.linalg.cholesky(M))[..., 0]
        # Inputs of RNEA that need a cotangent: q, v, f_ext, then the model tensors.
        leaves = [q, v, f_ext, *mt_fields]
        flags = [needs[3], needs[4], needs[6] and f_ext is not None, *needs[7:]]
        wanted = [i for i, f in enumerate(flags) if f]
        grads = [None] * len(leaves)
        if wanted:
            with torch.enable_grad():
                inputs = [t.detach().requires_grad_(True) if flags[i] else t for i, t in enumerate(leaves)]
                tau_id = rnea_flat(
                    model, inputs[0], inputs[1], qdd, inputs[2], ctx.passive, mt=ModelTensors(*inputs[3:])
                )
                got = torch.autograd.grad(tau_id, [inputs[i] for i in wanted], grad_outputs=-lam, allow_unused=True)
            for i, gi in zip(wanted, got):
                grads[i] = gi
        g_tau = lam if needs[5] else None
        return (None, None, None, grads[0], grads[1], g_tau, grads[2], *grads[3:])


def forward_dynamics_flat(
    model: RobotModel,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    f_ext: Tensor | None = None,
    passive: bool = True,
    method: str = "aba",
    fast_grad: bool = True,
) -> Tensor:
    """:func:`forward_dynamics` on flat batches ``(B, n)`` (no shape checks)."""
    if method not in METHODS:
        raise ShapeError(f"forward_dynamics: unknown method '{method}'; choose from {METHODS}")
    mt = model.model_tensors(q.dtype, q.device)
    if not fast_grad or not torch.is_grad_enabled():
        return _solve(model, method, q, v, tau, f_ext, passive, mt)
    ins = [q, v, tau, f_ext, *mt]
    if not any(t is not None and t.requires_grad for t in ins):
        return _solve(model, method, q, v, tau, f_ext, passive, mt)
    return _ForwardDynamics.apply(model, method, passive, q, v, tau, f_ext, *mt)


def forward_dynamics(
    model: RobotModel,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    *,
    f_ext: Tensor | None = None,
    passive: bool = True,
    method: str = "aba",
    fast_grad: bool = True,
) -> Tensor:
    """Joint accelerations ``qdd = M^{-1} (tau + tau_passive + J^T f_ext - h)``.

    Args:
        model: the robot.
        q: (..., nq) configuration.
        v: (..., nv) joint velocities.
        tau: (..., nv) applied joint forces (zero entries on a floating base for an unactuated base).
        f_ext: optional (..., n_links, 6) external force; torque on each link, world-aligned axes,
            torque about the link origin.
        passive: include the model's joint damping and springs.
        method: ``"aba"`` (Articulated Body Algorithm, default) or ``"crba"`` (mass matrix and a
            batched Cholesky solve; often faster for short chains on CPU, see BENCHMARKS.md).
        fast_grad: use the implicit-function-theorem backward (one ``M^{-1}`` solve + one RNEA
            VJP; first-order gradients only). ``False`` backpropagates through the algorithm itself
            (needed for higher-order derivatives).

    Returns:
        (..., nv) accelerations in the inputs' dtype and device.
    """
    flat, batch = as_state(
        model, [("q", q, model.nq), ("v", v, model.nv), ("tau", tau, model.nv), f_ext_entry(model, f_ext)]
    )
    fe = flat[3] if f_ext is not None else None
    qdd = forward_dynamics_flat(model, flat[0], flat[1], flat[2], fe, passive, method, fast_grad)
    return qdd.reshape(*batch, model.nv)


def aba(model: RobotModel, q: Tensor, v: Tensor, tau: Tensor, *, f_ext: Tensor | None = None,
        passive: bool = True) -> Tensor:
    """Forward dynamics by ABA with plain autograd (see :func:`forward_dynamics` for the options)."""
    return forward_dynamics(model, q, v, tau, f_ext=f_ext, passive=passive, method="aba", fast_grad=False)
