"""Spatial quantities about each body's own origin: the numerics of RNEA, CRBA and ABA.

The sums over ancestors and subtrees of :mod:`._common` are exact at the world origin, but a
product of two world-origin quantities cancels large terms: a body ``|p|`` from the origin has
the inertia ``m |p|^2`` there, which swamps its rotational inertia (``0.4`` against ``1e-3`` kg m^2
for the iiwa's last link), and a joint force ``S_d . F`` subtracts moments of size ``|p| |f|``.
In float32 that leaves three or four significant digits of the mass matrix's smallest entries
and of forward dynamics. So every inertia here is kept about its body's origin ``o_b`` (world-
aligned axes), motions are moved to the point where they meet an inertia, and forces to the joint
on which they are projected, along *levers* between two bodies of one robot: differences of body
positions in the world translated so that body 0 sits at the origin (``tree_state(...,
centered=True)``; the dynamics do not change under a translation of the world). Products are
thus formed with small levers only, and the rounding error of every result scales with the
robot's own size, not with its distance from the origin.

Motions are still summed over ancestors at the origin (one masked product, as before) and then
moved to each body's origin, ``X(p) (v; w) = (v + w x p; w)``: that move is linear in ``p`` and
costs no significant digits. Forces move from a body to an ancestor's origin along the lever
``r = o_b - o_a``: ``(f; n) -> (f; n + r x f)``, one product per pair of bodies (the pairs of
:class:`~._common.LocalTables`), then a masked sum. Composite inertias are sums over the same pairs
of body inertias moved by ``r``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..model.tree import KinematicTree
from ._common import (
    LocalTables,
    RigidInertia,
    TreeState,
    cross,
    force_cross,
    local_tables,
    masks,
    mm,
    mv,
    small_batch,
    tree_sum,
)


def tables_of(tree: KinematicTree, like: Tensor) -> LocalTables:
    return local_tables(tree, like.dtype, like.device)


def local_columns(ts: TreeState, lt: LocalTables) -> Tensor:
    """Motion subspace columns ``(nv, 6, B)`` at the origin of each DoF's own body (world axes):
    ``(0; w)`` for a revolute joint, ``(axis; 0)`` for a prismatic one, the base frame's axes."""
    return ts.S * lt.local_mask


def at_points(X: Tensor, p: Tensor) -> Tensor:
    """World-origin motions ``X (n, 6, B)`` at the points ``p (n, 3, B)``: ``(v + w x p; w)``."""
    ang = X[:, 3:]
    return torch.cat([X[:, :3] + cross(ang, p), ang], dim=1)


def levers(ts: TreeState, lt: LocalTables) -> Tensor:
    """``o_desc - o_anc (npairs, 3, B)`` for the body pairs of ``lt``."""
    return ts.p[lt.desc] - ts.p[lt.anc]


def body_inertia(ts: TreeState) -> RigidInertia:
    """Spatial inertia of each body about its own origin, world-aligned axes."""
    mt = ts.mt
    m = mt.body_mass[:, None]  # (nb, 1)
    if small_batch(ts.R):
        R = ts.R.permute(0, 3, 1, 2)  # (nb, B, 3, 3)
        h = R @ mt.body_h[:, None, :, None]  # (nb, B, 3, 1)
        I = R @ mt.body_I[:, None] @ R.transpose(-1, -2)
        eye = torch.eye(3, dtype=R.dtype, device=R.device)
        h_skew = torch.linalg.cross(h, eye.expand(1, 1, 3, 3), dim=-2)  # column i is h x e_i
        m_eye = (m[..., None, None] * eye).expand_as(I)
        full = torch.cat([torch.cat([m_eye, -h_skew], -1), torch.cat([h_skew, I], -1)], -2)  # (nb, B, 6, 6)
        return RigidInertia(m=m, h=h[..., 0].permute(0, 2, 1), I=I.permute(0, 2, 3, 1), full=full.permute(0, 2, 3, 1))
    h = mv(ts.R, mt.body_h[..., None])
    I = mm(mm(ts.R, mt.body_I[..., None]), ts.R.transpose(1, 2))
    return RigidInertia(m=m, h=h, I=I)


def translated(m: Tensor, h: Tensor, I: Tensor, r: Tensor) -> tuple[Tensor, Tensor]:
    """First moment and rotational inertia ``(h', I')`` of rigid inertias ``(m (n, 1), h (n, 3, B),
    I (n, 3, 3, B))`` about a point ``r (n, 3, B)`` behind their reference point.

    With ``h' = h + m r`` and ``W = h' r^T + r h^T``: ``I' = I + tr(W) 1 - W``.
    """
    h2 = torch.addcmul(h, m[..., None], r)
    W = h2[:, :, None] * r[:, None, :] + r[:, :, None] * h[:, None, :]
    tr = W.diagonal(0, 1, 2).sum(-1)  # (n, B)
    eye = torch.eye(3, dtype=I.dtype, device=I.device)[:, :, None]
    return h2, torch.addcmul(I - W, tr[:, None, None], eye)


def composite_inertia(I: RigidInertia, r: Tensor, lt: LocalTables) -> RigidInertia:
    """Inertia of each body's subtree about the body's origin (world axes)."""
    if not lt.npairs:
        return I
    d = lt.desc
    m_p = I.m[d]
    h_p, I_p = translated(m_p, I.h[d], I.I[d], r)
    return RigidInertia(m=I.m + lt.sum_anc @ m_p, h=I.h + tree_sum(lt.sum_anc, h_p), I=I.I + tree_sum(lt.sum_anc, I_p))


def subtree_forces(F: Tensor, r: Tensor, lt: LocalTables) -> Tensor:
    """Sum of the forces ``F (nb, 6, B)`` (each about its body's origin) over each body's
    subtree, about that body's origin."""
    if not lt.npairs:
        return F
    G = F[lt.desc]
    Gf = G[:, :3]
    moved = torch.cat([Gf, G[:, 3:] + cross(r, Gf)], dim=1)
    return F + tree_sum(lt.sum_anc, moved)


def external_forces(tree: KinematicTree, ts: TreeState, f_ext: Tensor) -> Tensor:
    """Link forces ``f_ext (B, n_links, 6)`` (force; torque about the link origin, world axes) as
    forces about the body origins, summed per body ``(nb, 6, B)`` (world-fixed links dropped)."""
    tb = tree.tables(f_ext.dtype, f_ext.device)
    keep, body = tb.moving_links, tb.moving_link_body
    lever = mv(ts.R[body], ts.mt.link_p[keep][..., None])  # link origin - body origin
    f = f_ext[:, keep].permute(1, 2, 0)  # (k, 6, B)
    fw = torch.cat([f[:, :3], f[:, 3:] + cross(lever, f[:, :3])], dim=1)
    out = torch.zeros(tree.nb, 6, f_ext.shape[0], dtype=f_ext.dtype, device=f_ext.device)
    return out.index_add(0, body, fw)


class LocalTerms(NamedTuple):
    """What RNEA and ABA derive from the velocities, about each body's origin (batch-last)."""

    inertia: RigidInertia  # body inertias about their origins
    Sl: Tensor  # (nv, 6, B) motion columns at their body's origin
    V_origin: Tensor  # (nb, 6, B) body velocities at the world origin
    V: Tensor  # (nb, 6, B) body velocities at their origins
    bias: Tensor  # (nb, 6, B) V x* I V minus the external forces


def local_terms(tree: KinematicTree, ts: TreeState, vT: Tensor, f_ext: Tensor | None,
                inertia: RigidInertia | None = None) -> LocalTerms:
    """Body velocities and bias forces about the body origins for ``vT (nv, B)``."""
    if inertia is None:
        inertia = body_inertia(ts)
    lt = tables_of(tree, vT)
    mask_bd, _ = masks(tree, vT)
    V_O = tree_sum(mask_bd, ts.S * vT[:, None])
    V = at_points(V_O, ts.p)
    bias = force_cross(V, inertia.apply(V))
    if f_ext is not None:
        bias = bias - external_forces(tree, ts, f_ext)
    return LocalTerms(inertia, local_columns(ts, lt), V_O, V, bias)


def translate_articulated(Ia: Tensor, r: Tensor) -> Tensor:
    """A symmetric ``(..., 6, 6, B)`` inertia about a point ``o`` moved to the point ``o - r``
    (``r (..., 3, B)``): ``X^T Ia X`` with ``X = [[1, -[r]], [0, 1]]``.

    In blocks ``[[A, Bm], [Bm^T, C]]``: ``A`` stays; ``Bm' = Bm + ([r] A)^T``;
    ``C' = C + [r] Bm + ([r] Bm)^T + [r] ([r] A)^T``.
    """
    A = Ia[..., :3, :3, :]
    Bm = Ia[..., :3, 3:, :]
    C = Ia[..., 3:, 3:, :]
    rc = r.unsqueeze(-2)  # (..., 3, 1, B): crossed with every column
    T1t = torch.linalg.cross(rc, A, dim=-3).transpose(-3, -2)  # ([r] A)^T
    T2 = torch.linalg.cross(rc, Bm, dim=-3)
    B2 = Bm + T1t
    C2 = C + T2 + T2.transpose(-3, -2) + torch.linalg.cross(rc, T1t, dim=-3)
    return torch.cat([torch.cat([A, B2], dim=-2), torch.cat([B2.transpose(-3, -2), C2], dim=-2)], dim=-3)


def force_to_parent(f: Tensor, r: Tensor) -> Tensor:
    """Forces ``(..., 6, B)`` about a point ``o`` taken about ``o - r``: ``(f; n + r x f)``."""
    fl = f[..., :3, :]
    return torch.cat([fl, f[..., 3:, :] + cross(r, fl)], dim=-2)


def motion_to_child(a: Tensor, r: Tensor) -> Tensor:
    """Motions ``(..., 6, B)`` at a point ``o`` seen at ``o + r``: ``(v + w x r; w)``."""
    w = a[..., 3:, :]
    return torch.cat([a[..., :3, :] + cross(w, r), w], dim=-2)

