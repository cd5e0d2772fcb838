"""Spatial quantities about points on the robot: the numerics of RNEA, CRBA and ABA.

The sums over ancestors and subtrees of :mod:`._common` are exact at the world origin, but a
product of two world-origin quantities cancels large terms: a body ``|p|`` from the origin has
the inertia ``m |p|^2`` there, which swamps its rotational inertia (``0.4`` against ``1e-3`` kg m^2
for the iiwa's last link), and a joint force ``S_d . F`` subtracts moments of size ``|p| |f|``.
In float32 that leaves three or four significant digits of the mass matrix's smallest entries
and of forward dynamics. So the products here are formed about points on the robot, with short
levers only, and the rounding error of every result scales with the robot's own size, not with
its distance from the origin:

* positions are those of a world translated so that body 0 sits at the origin
  (``tree_state(..., centered=True)``); the dynamics do not change under a translation;
* each body's inertia is kept about its centre of mass (mass, COM, rotational inertia about the
  COM, world-aligned axes: :func:`com_inertia`), so that its force is ``m a_c`` and its moment
  about the COM ``I_c alpha + w x I_c w``;
* motions are summed over ancestors at the origin (one masked product) and taken to a point
  ``x`` by ``(v + w x x; w)``, which is linear in ``x`` and costs no significant digits;
* a force reaches the origin ``o_a`` of an ancestor along the lever ``c_b - o_a`` between two
  points of one robot (one product per pair of bodies, then a sum: :class:`~._common.LocalTables`),
  and is projected on joint ``a`` there.

ABA keeps each body's spatial inertia about the body's own origin (:func:`body_inertia`) and
passes articulated inertias to the parent by a pure translation (:class:`Shift`, :func:`translate_inertia`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..model.tree import KinematicTree
from ._common import (
    SMALL_SUM,
    LocalTables,
    RigidInertia,
    TreeState,
    cross,
    force_cross,
    local_constants,
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


class ComInertia(NamedTuple):
    """Body inertias in centre-of-mass form, world-aligned axes (batch-last)."""

    m: Tensor  # (nb, 1) mass
    off: Tensor  # (nb, 3, B) centre of mass minus body origin
    c: Tensor  # (nb, 3, B) centre of mass
    Ic: Tensor  # (nb, 3, 3, B) rotational inertia about the centre of mass
    s: Tensor  # (npairs, 3, B) levers: the descendant's centre of mass minus the ancestor's origin


def com_inertia(tree: KinematicTree, ts: TreeState) -> ComInertia:
    """The bodies' inertias about their centres of mass (massless bodies: COM at the origin)."""
    c_loc, Ic_loc, _ = local_constants(tree, ts.mt)
    if small_batch(ts.R):
        R = ts.R.permute(0, 3, 1, 2)  # (nb, B, 3, 3)
        off = (R @ c_loc[:, None, :, None])[..., 0].permute(0, 2, 1)
        Ic = (R @ Ic_loc[:, None] @ R.transpose(-1, -2)).permute(0, 2, 3, 1)
    else:
        off = mv(ts.R, c_loc[..., None])
        Ic = mm(mm(ts.R, Ic_loc[..., None]), ts.R.transpose(1, 2))
    lt = tables_of(tree, off)
    # The origins' difference is exactly zero for a body and itself, so its own lever keeps all
    # the digits of its COM offset.
    s = off.index_select(0, lt.desc) + (ts.p.index_select(0, lt.desc) - ts.p.index_select(0, lt.anc))
    return ComInertia(m=ts.mt.body_mass[:, None], off=off, c=ts.p + off, Ic=Ic, s=s)


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


def segment_sum(x: Tensor, index: Tensor, n: int, mask: Tensor | None) -> Tensor:
    """``y[i] = sum_{k: index[k] = i} x[k]`` (``i < n``) for ``x (k, ..., B)``; ``mask (n, k)`` is the
    same sum as a 0/1 matrix, or ``None`` (large trees keep none). Small sums take the mask
    (:func:`~._common.tree_sum`), others ``index_add`` (one pass over ``x`` instead of a product with a
    mostly-zero matrix)."""
    if mask is not None and n * x.numel() <= SMALL_SUM and not torch.compiler.is_compiling():
        return tree_sum(mask, x)
    return x.new_zeros(n, *x.shape[1:]).index_add_(0, index, x)


def com_forces(tree: KinematicTree, ts: TreeState, ci: ComInertia, V_O: Tensor, A_O: Tensor,
               f_ext: Tensor | None) -> tuple[Tensor, Tensor]:
    """Net force ``f (nb, 3, B)`` on each body and its moment ``n (nb, 3, B)`` about the body's
    centre of mass, for body velocities and spatial accelerations ``V_O, A_O (nb, 6, B)`` at the
    world origin, minus the external link forces ``f_ext (B, n_links, 6)``."""
    w, al = V_O[:, 3:], A_O[:, 3:]
    v_c = V_O[:, :3] + cross(w, ci.c)  # velocity of the centre of mass
    a_c = A_O[:, :3] + cross(al, ci.c) + cross(w, v_c)  # its (classical) acceleration
    f = ci.m[..., None] * a_c
    Iw = mv(ci.Ic[:, None], torch.stack([al, w], 1))  # (nb, 2, 3, B): I_c alpha, I_c w
    n = Iw[:, 0] + cross(w, Iw[:, 1])
    if f_ext is not None:
        fe, ne = external_forces(tree, ts, f_ext, ci.off)
        f, n = f - fe, n - ne
    return f, n


def external_forces(tree: KinematicTree, ts: TreeState, f_ext: Tensor, off: Tensor | None = None
                    ) -> tuple[Tensor, Tensor]:
    """Link forces ``f_ext (B, n_links, 6)`` (force; torque about the link origin, world axes),
    summed per body: force ``(nb, 3, B)`` and moment ``(nb, 3, B)`` about each body's origin, or
    about the points ``off`` from it (world-fixed links are dropped)."""
    tb = tree.tables(f_ext.dtype, f_ext.device)
    keep, body = tb.moving_links, tb.moving_link_body
    lever = mv(ts.R.index_select(0, body), ts.mt.link_p[keep][..., None])  # link origin - body origin
    if off is not None:
        lever = lever - off.index_select(0, body)
    f = f_ext[:, keep].permute(1, 2, 0)  # (k, 6, B)
    fw = torch.cat([f[:, :3], f[:, 3:] + cross(lever, f[:, :3])], dim=1)
    out = torch.zeros(tree.nb, 6, f_ext.shape[0], dtype=f_ext.dtype, device=f_ext.device).index_add(0, body, fw)
    return out[:, :3], out[:, 3:]


def subtree_forces(ci: ComInertia, f: Tensor, n: Tensor, lt: LocalTables) -> Tensor:
    """The sum of the forces ``(f; n) (nb, 3, B)`` (moments about the centres of mass) over each
    body's subtree, about that body's origin: ``(nb, 6, B)``."""
    F = torch.cat([f, n], dim=1).index_select(0, lt.desc)
    fd = F[:, :3]
    return segment_sum(torch.cat([fd, F[:, 3:] + cross(ci.s, fd)], dim=1), lt.anc, f.shape[0], lt.sum_anc)


class LocalTerms(NamedTuple):
    """What ABA derives from the velocities, about each body's origin (batch-last)."""

    inertia: RigidInertia  # body inertias about their origins
    Sl: Tensor  # (nv, 6, B) motion columns at their body's origin
    V: Tensor  # (nb, 6, B) body velocities at their origins
    bias: Tensor  # (nb, 6, B) V x* I V minus the external forces


def local_terms(tree: KinematicTree, ts: TreeState, vT: Tensor, f_ext: Tensor | None) -> LocalTerms:
    """Body velocities and bias forces about the body origins for ``vT (nv, B)``."""
    inertia = body_inertia(ts)
    mask_bd, _ = masks(tree, vT)
    V = at_points(tree_sum(mask_bd, ts.S * vT[:, None]), ts.p)
    bias = force_cross(V, inertia.apply(V))
    if f_ext is not None:
        bias = bias - torch.cat(external_forces(tree, ts, f_ext), dim=1)
    return LocalTerms(inertia, local_columns(ts, tables_of(tree, vT)), V, bias)


class Shift(NamedTuple):
    """The translations from bodies to their parents' origins, ``r = o_b - o_parent (..., 3, B)``;
    for small batches also as motion transforms ``X = [[1, -[r]], [0, 1]] (..., B, 6, 6)``
    (batched matrix products then replace a dozen elementwise operations)."""

    r: Tensor
    X: Tensor | None = None

    def select(self, idx: Tensor | int) -> Shift:
        """The shifts of some bodies: an index (a single body drops the body dimension) or a
        long tensor of bodies."""
        if isinstance(idx, int):
            return Shift(self.r[idx], None if self.X is None else self.X[idx])
        return Shift(self.r.index_select(0, idx), None if self.X is None else self.X.index_select(0, idx))

    def force_up(self, f: Tensor) -> Tensor:
        """Forces ``(..., 6, B)`` about the bodies' origins, about their parents' origins."""
        if self.X is not None:
            return (self.X.transpose(-1, -2) @ f.movedim(-1, -2)[..., None])[..., 0].movedim(-2, -1)
        fl = f[..., :3, :]
        return torch.cat([fl, f[..., 3:, :] + cross(self.r, fl)], dim=-2)

    def motion_down(self, a: Tensor) -> Tensor:
        """Motions ``(..., 6, B)`` at the parents' origins, at the bodies' origins."""
        if self.X is not None:
            return (self.X @ a.movedim(-1, -2)[..., None])[..., 0].movedim(-2, -1)
        w = a[..., 3:, :]
        return torch.cat([a[..., :3, :] + cross(w, self.r), w], dim=-2)

    def inertia_up(self, Ia: Tensor) -> Tensor:
        """A symmetric ``(..., 6, 6, B)`` inertia about the bodies' origins, about their parents':
        ``X^T Ia X``."""
        if self.X is not None:
            return (self.X.transpose(-1, -2) @ Ia.movedim(-1, -3) @ self.X).movedim(-3, -1)
        return translate_inertia(Ia, self.r)


# Largest batch for which ABA takes the batch-first path of batched 6x6 matrix products
# (:func:`~.aba._aba_small`): its operators cost the same up to a few dozen states.
ABA_MATRIX_MAX_BATCH = 8


def parent_shifts(tree: KinematicTree, ts: TreeState, matrices: bool | None = None) -> Shift:
    """:class:`Shift` of every body (zero for bodies hanging from the world), with the
    transforms ``X`` where ``matrices`` (default: for batches up to ``ABA_MATRIX_MAX_BATCH``)."""
    p = ts.p
    r = p - p.index_select(0, tables_of(tree, p).parent)
    if matrices is None:
        matrices = p.shape[-1] <= ABA_MATRIX_MAX_BATCH and not torch.compiler.is_compiling()
    if not matrices:
        return Shift(r)
    rb = r.permute(0, 2, 1)  # (nb, B, 3)
    eye = torch.eye(3, dtype=p.dtype, device=p.device)
    skew = torch.linalg.cross(rb[..., :, None].expand(*rb.shape, 3), eye.expand(*rb.shape, 3), dim=-2)  # [r]
    top = torch.cat([eye.expand_as(skew), -skew], dim=-1)
    bottom = torch.cat([torch.zeros_like(skew), eye.expand_as(skew)], dim=-1)
    return Shift(r, torch.cat([top, bottom], dim=-2))


def skew_mul(r: Tensor, M: Tensor) -> Tensor:
    """``[r] M`` for ``r (..., 3, B)`` and ``M (..., 3, 3, B)``: ``r`` crossed with each column."""
    if r.shape[-1] < 256:
        return torch.linalg.cross(r.unsqueeze(-2), M, dim=-3)
    rx, ry, rz = r.unsqueeze(-2).unbind(-3)  # (..., 1, B)
    Mx, My, Mz = M.unbind(-3)  # rows (..., 3, B)
    return torch.stack([torch.addcmul(ry * Mz, rz, My, value=-1), torch.addcmul(rz * Mx, rx, Mz, value=-1),
                        torch.addcmul(rx * My, ry, Mx, value=-1)], dim=-3)


def translate_inertia(Ia: Tensor, r: Tensor) -> Tensor:
    """A symmetric ``(..., 6, 6, B)`` inertia about a point ``o``, moved to the point ``o - r``
    (``r (..., 3, B)``): ``X^T Ia X`` with ``X = 1 + N``, ``N = [[0, -[r]], [0, 0]]``.

    ``N^T Ia = K``, the matrix whose lower rows are ``[r]`` times the upper rows ``[A | Bm]`` of
    ``Ia`` and whose upper rows are zero, so ``X^T Ia X = Ia + K + K^T + N^T Ia N`` with
    ``N^T Ia N = [[0, 0], [0, [r] ([r] A)^T]]``."""
    P = skew_mul(r, Ia[..., :3, :, :])  # (..., 3, 6, B): [r] [A | Bm]
    T3 = skew_mul(r, P[..., :, :3, :].transpose(-3, -2))
    out = Ia.clone()  # then three in-place additions touch only the blocks that change
    lower = out.narrow(-3, 3, 3)
    lower.add_(P)
    out.narrow(-2, 3, 3).add_(P.transpose(-3, -2))
    lower.narrow(-2, 3, 3).add_(T3)
    return out
