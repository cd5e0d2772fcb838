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

Scope: fixed-base robots without external forces, cotangents of ``q``, ``v`` and ``a`` only.
Callers fall back to autograd otherwise (a floating base's quaternion coordinates, ``f_ext``,
learnable model parameters).
"""

from __future__ import annotations

from torch import Tensor

from ..model.robot import RobotModel
from ._common import (
    RigidInertia,
    TreeState,
    force_cross,
    gravity_acceleration,
    masks,
    motion_cross,
    tree_state,
    tree_sum,
    world_inertia,
)

__all__ = ["rnea_vjp_supported", "rnea_vjp_bl", "rnea_state_vjp"]


def rnea_vjp_supported(model: RobotModel, f_ext: Tensor | None) -> bool:
    """Whether :func:`rnea_vjp_bl` covers this call (else use autograd)."""
    return not model._nfree and f_ext is None


def rnea_vjp_bl(
    model: RobotModel,
    ts: TreeState,
    qT: Tensor,
    vT: Tensor,
    aT: Tensor,
    lamT: Tensor,
    passive: bool,
    inertia: RigidInertia | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Cotangents of RNEA's inputs for a cotangent ``lamT (nv, B)`` of its output (batch-last).

    Args:
        ts: the kinematic pass at ``qT (nq, B)`` (fixed base: ``nq = nv = n_bodies``).
        vT, aT: (nv, B) velocities and accelerations.
        passive: whether the RNEA being differentiated includes the joint damping and springs.
        inertia: ``world_inertia(ts)`` if the caller has it.

    Returns:
        ``(qbar, vbar, abar)``, each (nv, B).
    """
    mt = ts.mt
    S = ts.S  # (nv, 6, B); fixed base: DoF d moves body d
    I = inertia if inertia is not None else world_inertia(ts)
    mask_bd, mask_db = masks(model, vT)
    # Forward sweep: the intermediates of RNEA.
    Sv = S * vT[:, None]
    V = tree_sum(mask_bd, Sv)
    c = motion_cross(V, Sv)
    A = tree_sum(mask_bd, S * aT[:, None] + c) + gravity_acceleration(mt)
    IV = I.apply(V)
    IA = I.apply(A)
    Fc = tree_sum(mask_db, IA + force_cross(V, IV))  # subtree forces
    # Backward sweep.
    Fbar = tree_sum(mask_bd, S * lamT[:, None])
    Abar = I.apply(Fbar)
    W = motion_cross(V, Fbar)
    IW = I.apply(W)
    cbar = tree_sum(mask_db, Abar)
    sbar = -force_cross(V, cbar)  # cotangent of S_d v_d through c_d
    Vbar = force_cross(Sv, cbar) - force_cross(Fbar, IV) - IW
    Vc = tree_sum(mask_db, Vbar) + sbar
    abar = (S * cbar).sum(1)
    vbar = (S * Vc).sum(1)
    Sbar = lamT[:, None] * Fc + aT[:, None] * cbar + vT[:, None] * Vc
    G = force_cross(W, IV) + force_cross(V, IW) - force_cross(Fbar, IA) - force_cross(A, Abar)
    qbar = (S * tree_sum(mask_db, G + force_cross(S, Sbar))).sum(1)
    if passive:  # tau includes + damping v + stiffness (q - rest)
        vbar = vbar + mt.damping[:, None] * lamT
        qbar = qbar + mt.stiffness[:, None] * lamT
    return qbar, vbar, abar


def rnea_state_vjp(
    model: RobotModel,
    q: Tensor,
    v: Tensor,
    a: Tensor,
    lam: Tensor,
    passive: bool,
    ts: TreeState | None = None,
    inertia: RigidInertia | None = None,
) -> tuple[Tensor, Tensor]:
    """Batch-first :func:`rnea_vjp_bl` for backward passes: ``q (B, nq), v, a, lam (B, nv) ->
    (qbar, vbar)``, each (B, nv), with no graph (inputs are detached)."""
    q, v, a = q.detach(), v.detach(), a.detach()
    if ts is None:
        ts = tree_state(model, q)
    qbar, vbar, _ = rnea_vjp_bl(model, ts, q.transpose(0, 1), v.transpose(0, 1), a.transpose(0, 1),
                                lam.transpose(0, 1), passive, inertia)
    return qbar.transpose(0, 1), vbar.transpose(0, 1)
