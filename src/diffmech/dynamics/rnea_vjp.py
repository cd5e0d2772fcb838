"""The reverse-mode derivative (VJP) of inverse dynamics, written by hand.

The backward pass of forward dynamics (and of every simulated step) is a VJP of RNEA. Autograd
records every small operation of RNEA and replays each one backwards; this module runs one
forward sweep for the intermediates and one backward sweep, in the world frame, with masked
sums over subtrees and ancestors as in :mod:`.rnea`.

Derivation (world frame, spatial vectors at the origin; ``x`` motion cross, ``x*`` force cross).
RNEA computes ``V = sum_anc S v``, ``c_d = V_d x (S_d v_d)``, ``A = sum_anc (S a + c) + a_g``,
``F = I A + V x* (I V)``, ``tau_d = S_d . sum_sub F``. For a cotangent ``lam`` of ``tau``:

* ``Fbar_j = sum_{d above j} lam_d S_d``; ``Abar = I Fbar``;
  ``Vbar = -Fbar x* (I V) - I (V x Fbar) + (S v) x* cbar``; ``cbar_d = sum_sub Abar``;
* ``abar_d = S_d . cbar_d``; ``vbar_d = S_d . (sum_sub Vbar - V_d x* cbar_d)``;
* the configuration enters only through the world-frame columns ``S_d`` and inertias ``I_j``,
  which move with their body: ``dS_d/dq_k = S_k x S_d`` and ``dI_j/dq_k = S_k x* I_j - I_j S_k x``
  for ``k`` above them. With ``(x x y) . f = x . (y x* f)`` every such term is ``S_k`` dotted
  with a force, so ``qbar_k = S_k . sum_sub (G + S x* Sbar)`` where
  ``G = -Fbar x* (I A) - A x* (I Fbar) + W x* (I V) + V x* (I W)``, ``W = V x Fbar``, and
  ``Sbar_d = lam_d sum_sub F + a_d cbar_d + v_d (sum_sub Vbar - V_d x* cbar_d)``.

Floating base: its six DoFs share body 0, so the per-DoF terms ``(S v) x* cbar`` and
``S x* Sbar`` are summed over a body's DoFs before the subtree sums, and ``V`` in ``c_d`` is the
velocity of DoF ``d``'s body. The base cotangent comes out in the tangent space (the derivative
along the base's own columns ``S_0..5``, a body twist ``(g_lin; g_ang)``); it maps to the
coordinates as ``pbar = R g_lin`` and ``quatbar = 2 quat * (g_ang, 0) / |quat|`` (Hamilton product),
exact because the kinematics normalise the quaternion (no radial component).

External forces ``f_l`` (force ``f``, torque ``t``, world axes, at link origin ``o_l``) enter as
``F_j -= sum_l (f; t + o_l x f)`` over the links of body ``j``. Their cotangent is the velocity of
``o_l`` in the motion ``Fbar_j`` (negated): ``fbar = -(Fbar_lin + Fbar_ang x o_l)``,
``tbar = -Fbar_ang``; the point ``o_l`` moves with its body, which adds to ``G`` the wrench of the
force ``f x Fbar_ang`` applied at ``o_l`` (negated).

Scope: cotangents of ``q``, ``v``, ``a`` and ``f_ext``. Callers use autograd for learnable model
parameters.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..model.tree import KinematicTree
from ._common import (
    RigidInertia,
    TreeState,
    cross,
    force_cross,
    gravity_acceleration,
    link_origins,
    masks,
    motion_cross,
    tree_state,
    tree_sum,
    world_inertia,
)

__all__ = ["rnea_vjp_bl", "rnea_state_vjp", "RneaCotangents"]


class RneaCotangents(NamedTuple):
    """Cotangents of RNEA's inputs (batch-last): ``q (nq, B)``, ``v (nv, B)``, ``a (nv, B)`` and,
    with external forces, ``f_ext (B, n_links, 6)`` (batch-first, as the input)."""

    q: Tensor
    v: Tensor
    a: Tensor
    f_ext: Tensor | None


def rnea_vjp_bl(
    tree: KinematicTree,
    ts: TreeState,
    qT: Tensor,
    vT: Tensor,
    aT: Tensor,
    lamT: Tensor,
    passive: bool,
    inertia: RigidInertia | None = None,
    f_ext: Tensor | None = None,
) -> RneaCotangents:
    """Cotangents of RNEA's inputs for a cotangent ``lamT (nv, B)`` of its output (batch-last).

    Args:
        ts: the kinematic pass at ``qT (nq, B)``.
        vT, aT: (nv, B) velocities and accelerations (a floating base: body twist first).
        passive: whether the RNEA being differentiated includes the joint damping and springs.
        inertia: ``world_inertia(ts)`` if the caller has it.
        f_ext: the external forces ``(B, n_links, 6)`` of the RNEA being differentiated, if any.
    """
    if tree.n_ball:
        return _rnea_vjp_autograd(tree, ts, qT, vT, aT, lamT, passive, f_ext)
    mt = ts.mt
    S = ts.S  # (nv, 6, B)
    free = bool(tree.nfree)
    I = inertia if inertia is not None else world_inertia(ts)
    mask_bd, mask_db = masks(tree, vT)
    # Forward sweep: the intermediates of RNEA.
    Sv = S * vT[:, None]
    V = tree_sum(mask_bd, Sv)
    Vd = _per_dof(V) if free else V  # velocity of each DoF's body
    c = motion_cross(Vd, Sv)
    A = tree_sum(mask_bd, S * aT[:, None] + c) + gravity_acceleration(mt)
    IV = I.apply(V)
    IA = I.apply(A)
    F = IA + force_cross(V, IV)
    if f_ext is not None:
        keep, body, origin = link_origins(tree, ts, f_ext)  # origin: (k, 3, B)
        fl = f_ext[:, keep].permute(1, 2, 0)  # (k, 6, B)
        fw = torch.cat([fl[:, :3], fl[:, 3:] + cross(origin, fl[:, :3])], dim=1)
        F = F - torch.zeros_like(F).index_add(0, body, fw)
    Fc = tree_sum(mask_db, F)  # subtree forces
    # Backward sweep.
    Fbar = tree_sum(mask_bd, S * lamT[:, None])
    Abar = I.apply(Fbar)
    W = motion_cross(V, Fbar)
    IW = I.apply(W)
    cbar = tree_sum(mask_db, Abar)
    sbar = -force_cross(Vd, cbar)  # cotangent of S_d v_d through c_d
    Vbar = _per_body(force_cross(Sv, cbar), free) - force_cross(Fbar, IV) - IW
    Vc = tree_sum(mask_db, Vbar) + sbar
    abar = (S * cbar).sum(1)
    vbar = (S * Vc).sum(1)
    Sbar = lamT[:, None] * Fc + aT[:, None] * cbar + vT[:, None] * Vc
    G = force_cross(W, IV) + force_cross(V, IW) - force_cross(Fbar, IA) - force_cross(A, Abar)
    fbar = None
    if f_ext is not None:
        Fb = Fbar[body]  # (k, 6, B): the motion Fbar of each link's body
        lin_o = Fb[:, :3] + cross(Fb[:, 3:], origin)
        fbar = f_ext.new_zeros(f_ext.shape).index_copy(
            1, keep, -torch.cat([lin_o, Fb[:, 3:]], dim=1).permute(2, 0, 1))
        g = cross(fl[:, :3], Fb[:, 3:])  # f x Fbar_ang, applied at the moving point o
        G = G - torch.zeros_like(G).index_add(0, body, torch.cat([g, cross(origin, g)], dim=1))
    qbar = (S * tree_sum(mask_db, G + _per_body(force_cross(S, Sbar), free))).sum(1)  # tangent space
    if passive:  # tau includes + damping v + stiffness (q - rest) on the joints
        j = tree.v_joint_start
        lam_j = lamT[j:]
        vbar = torch.cat([vbar[:j], torch.addcmul(vbar[j:], mt.damping[:, None], lam_j)]) if free else \
            torch.addcmul(vbar, mt.damping[:, None], lam_j)
        qbar = torch.cat([qbar[:j], torch.addcmul(qbar[j:], mt.stiffness[:, None], lam_j)]) if free else \
            torch.addcmul(qbar, mt.stiffness[:, None], lam_j)
    if free:
        qbar = torch.cat([_base_coordinates_cotangent(ts, qT[3:7], qbar[:6]), qbar[6:]])
    return RneaCotangents(qbar, vbar, abar, fbar)


def _rnea_vjp_autograd(tree: KinematicTree, ts: TreeState, qT: Tensor, vT: Tensor, aT: Tensor, lamT: Tensor,
                       passive: bool, f_ext: Tensor | None) -> RneaCotangents:
    """:func:`rnea_vjp_bl` by autograd through RNEA, for trees with ball joints: the derivation above
    moves each column with its own body, while a ball's three columns all turn with its last body
    (and its quaternion needs its own map to the tangent space)."""
    from .rnea import rnea_bl

    with torch.enable_grad():
        ins = [t.detach().requires_grad_(True) for t in (qT, vT, aT)]
        fe = None if f_ext is None else f_ext.detach().requires_grad_(True)
        ts_q = tree_state(tree, ts.mt, ins[0], batch_last=True, centered=True)
        tau = rnea_bl(tree, ts_q, ins[0], ins[1], ins[2], fe, passive)
        got = torch.autograd.grad(tau, ins + ([fe] if fe is not None else []), lamT, allow_unused=True)
    got = [torch.zeros_like(x) if g is None else g for g, x in zip(got, ins + ([fe] if fe is not None else []))]
    return RneaCotangents(got[0], got[1], got[2], got[3] if fe is not None else None)


def _per_dof(x: Tensor) -> Tensor:
    """Floating base: a per-body ``(nb, ...)`` tensor at each DoF's body ``(nv, ...)`` (six base DoFs, one body)."""
    return torch.cat([x[:1].expand(6, *x.shape[1:]), x[1:]])


def _per_body(x: Tensor, free: bool) -> Tensor:
    """Sum a per-DoF ``(nv, ...)`` tensor over each body's DoFs -> ``(nb, ...)``."""
    return torch.cat([x[:6].sum(0, keepdim=True), x[6:]]) if free else x


def _base_coordinates_cotangent(ts: TreeState, quat: Tensor, g: Tensor) -> Tensor:
    """Map a base tangent cotangent ``g (6, B)`` (derivative along the base's body twist) to its
    coordinates ``(x, y, z, qx, qy, qz, qw)`` -> ``(7, B)``.

    A unit translation along base axis ``i`` moves the position by ``R e_i``; a unit rotation about
    it multiplies the quaternion on the right by ``(e_i / 2, 1)``. The quaternion enters the
    kinematics normalised, so its cotangent is tangent to the sphere and scales with ``1/|quat|``.
    """
    R0 = ts.R[0]  # (3, 3, B)
    pbar = (R0 * g[None, :3]).sum(1)
    n = quat.norm(dim=0, keepdim=True)
    u, w = quat[:3] / n, quat[3:] / n
    ga = g[3:]
    scale = 2.0 / n
    vec = (w * ga + cross(u, ga)) * scale
    real = -(u * ga).sum(0, keepdim=True) * scale
    return torch.cat([pbar, vec, real])


def rnea_state_vjp(
    tree: KinematicTree,
    q: Tensor,
    v: Tensor,
    a: Tensor,
    lam: Tensor,
    passive: bool,
    ts: TreeState,
    inertia: RigidInertia | None = None,
    f_ext: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """Batch-first :func:`rnea_vjp_bl` for backward passes: ``q (B, nq), v, a, lam (B, nv) ->
    (qbar (B, nq), vbar (B, nv), f_ext bar (B, n_links, 6) or None)``, with no graph (inputs are
    detached); ``ts`` is the kinematic pass at ``q``."""
    q, v, a = q.detach(), v.detach(), a.detach()
    f_ext = None if f_ext is None else f_ext.detach()
    got = rnea_vjp_bl(tree, ts, q.transpose(0, 1), v.transpose(0, 1), a.transpose(0, 1), lam.transpose(0, 1),
                      passive, inertia, f_ext)
    return got.q.transpose(0, 1), got.v.transpose(0, 1), got.f_ext
