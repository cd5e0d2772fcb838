"""CRBA and RNEA for small batches, by the bodies' centre-of-mass Jacobians.

At a handful of states the eager algorithms pay per operator, not per flop. With the Jacobian
``J_b (6, nv)`` of every body's centre of mass (linear rows: the velocity of the COM; angular
rows: the body's angular velocity; zero for DoFs that do not move the body) all bodies' terms are
a few batched products over one dense ``(B, nb * 6, nv)`` tensor:

* ``M = sum_b J_b^T G_b J_b`` with ``G_b = diag(m_b 1, I_c,b)`` about the COM;
* ``tau = sum_b J_b^T F_b`` with ``F_b = (m_b (a_c - g); I_c alpha + w x I_c w)``, the body's
  force and its moment about its COM; the accelerations are ``J a + Jdot v``.

Every column is formed about a point of the robot with a short lever (``w_d x (c_b - o_d)``, the
joint axis through the origin ``o_d`` of its body), so float32 keeps its digits far from the world
origin as in :mod:`._local`. ``Jdot v`` is summed over the DoFs in the same way: for a body ``b``
and a DoF ``d`` above it, ``d/dt (w_d v_d) = (w_bd x w_d) v_d`` (an axis turns with the body
``bd`` that carries it) and ``d/dt (c_b - o_d) = v_c,b - v_o,d``.

The kinematic pass is fused in: each joint's placement is one ``4 x 4`` matrix
``H0 + sin q H1 + (1 - cos q) H2`` (constants per model), composed by pointer jumping.
Kinematic quantities are body-major ``(nb, B, ...)``, the Jacobian batch-first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import Tensor

from ..model.parameters import ModelTensors
from ..model.tree import KinematicTree
from ._common import TreeState, ball_rotations, joint_angles, local_constants, mm, per_model, quat_to_matrix_bl
from ._local import external_forces
from .threads import one_thread  # noqa: F401  (re-exported: the algorithms import it from here)


@dataclass(frozen=True)
class JacobianTables:
    """Index tables of the Jacobian formulation, for the ``k`` pairs ``(b, d)`` of a body ``b``
    and a DoF ``d`` that moves it.

    Attributes:
        dof: (k,) long, ``d``.
        desc, anc: (k,) long, ``b`` and the body that carries ``d``'s axis.
        pos: (k,) long, ``b * nv + d``.
        dof_body: (nv,) long, the body of each DoF (``None`` when DoF ``d`` is body ``d``).
        world: (1, 1, 4, 4) the identity, the world's placement for pointer jumping.
        e33: (1, 1, 4, 4) zero but for a ``1`` in the corner (of a homogeneous transform).
        jumps: the rows of :attr:`~diffmech.model.tree.TreeTables.jumps`.
    """

    dof: Tensor
    desc: Tensor
    anc: Tensor
    pos: Tensor
    dof_body: Tensor | None
    world: Tensor
    e33: Tensor
    jumps: tuple


# Batches up to this size take this formulation in eager mode (see ``use_jacobians``).
JACOBIAN_MAX_BATCH = 8
# ... when ``B nq^2`` is at most this: its mass matrix costs ``6 nb nv^2`` products per state, against
# O(npairs) <= O(nv^2) for the elementwise formulation. Measured on serial chains (2 shared cores, float64):
# the Jacobian formulation is the faster up to about 70-90 DoFs at one state and 30 at eight (the mass
# matrix, inverse and forward dynamics alike); 4x slower at 128 DoFs and eight states.
JACOBIAN_MAX_WORK = 8192


def use_jacobians(q: Tensor) -> bool:
    """Whether the eager algorithms take the Jacobian formulation for ``q (B, nq)``: small batches of
    robots with not too many DoFs, outside compiled code (which pays per flop, and whose backward the
    tests cover on the elementwise formulation)."""
    B = q.shape[0]
    return B <= JACOBIAN_MAX_BATCH and B * q.shape[-1] ** 2 <= JACOBIAN_MAX_WORK and not torch.compiler.is_compiling()


# MKL splits even a 7 x 42 x 7 product over its threads, which then wait for a descheduled worker
# whenever other processes keep the cores busy (measured on 2 shared cores: forward dynamics at batch 1
# spent 1.6 of 2 ms in such waits); the formulation's products are small enough that one thread is also
# faster on an idle machine. The setting itself lives in diffmech.dynamics.threads.


def jacobian_tables(tree: KinematicTree, dtype: torch.dtype, device: torch.device) -> JacobianTables:
    """The :class:`JacobianTables` of ``tree`` (built once per tree, dtype and device)."""
    return tree.derived(("jacobian", dtype, device), lambda: _make_jacobian_tables(tree, dtype, device))


def _make_jacobian_tables(tree: KinematicTree, dtype: torch.dtype, device: torch.device) -> JacobianTables:
    nb, nv, par, db = tree.nb, tree.nv, tree.body_parent, tree.dof_body
    pairs = []
    for b in range(nb):
        above = set()
        a = b
        while a >= 0:
            above.add(a)
            a = par[a]
        pairs += [(b, d) for d in range(nv) if db[d] in above]
    long = lambda x: torch.tensor(x, dtype=torch.long, device=device).reshape(-1)  # noqa: E731
    return JacobianTables(
        dof=long([d for _, d in pairs]), desc=long([b for b, _ in pairs]), anc=long([db[d] for _, d in pairs]),
        pos=long([b * nv + d for b, d in pairs]),
        # the body whose motion turns each DoF's axis (a ball's three turn with its last body)
        dof_body=tree.tables(dtype, device).c_body if tree.n_ball else (long(db) if tree.nfree else None),
        world=torch.eye(4, dtype=dtype, device=device)[None, None],
        e33=torch.nn.functional.pad(torch.ones(1, 1, 1, 1, dtype=dtype, device=device), (3, 0, 3, 0)),
        jumps=tuple(long(row) for row in tree.jumps),
    )


class ComJacobians(NamedTuple):
    """The COM Jacobians and what the dynamics need besides.

    Attributes:
        J: (B, nb * 6, nv) rows ``6 b .. 6 b + 2``: the velocity of body ``b``'s COM, ``6 b + 3 ..``:
            its angular velocity, per unit velocity of each DoF.
        w: (nv, B, 3) the angular part of each DoF's column (zero for translations).
        lin: (nv, B, 3) | None, the linear part at the DoF's body origin (translations only).
        s: (k, B, 3) levers ``c_b - o_bd`` of the pairs of :class:`JacobianTables`.
        T: (nb, B, 4, 4) body placements, p: (nb, B, 3) body origins, in the world translated so
            that body 0 sits at the origin (see :func:`~._common.body_placements`).
        off: (nb, B, 3) COM minus body origin; Ic: (nb, B, 3, 3) rotational inertia about the COM;
        m: (nb, 1, 1) masses (world-aligned axes throughout).
    """

    J: Tensor
    w: Tensor
    lin: Tensor | None
    s: Tensor
    T: Tensor
    p: Tensor
    off: Tensor
    Ic: Tensor
    m: Tensor


class _Constants(NamedTuple):
    """Per-model constants of the fused kinematic pass."""

    H: Tensor  # (3 or 4, nj, 1, 4, 4): placement = (H0 + H2) + sin q H1 - cos q H2 (+ q H3 if prismatic)
    V: Tensor  # (nb, 4, 3 or 4) homogeneous columns: revolute axis, COM, origin (, prismatic axis), body frame
    Ic: Tensor  # (nb, 4, 4) rotational inertia about the COM, body axes, in the upper-left block
    m: Tensor  # (nb, 1, 1) masses


def _constants(tree: KinematicTree, mt: ModelTensors) -> _Constants:
    def build() -> _Constants:
        lc = local_constants(tree, mt)
        pad = torch.nn.functional.pad
        zero = torch.zeros_like(lc.p_tree)
        blocks = [torch.cat([mt.A0[..., 0] + mt.A2[..., 0], lc.p_tree], -1), torch.cat([mt.A1[..., 0], zero], -1),
                  torch.cat([mt.A2[..., 0], zero], -1)]
        if tree.any_prismatic:
            blocks.append(torch.cat([torch.zeros_like(mt.A0[..., 0]), mt.lin_dir], -1))
        H = pad(torch.stack(blocks), (0, 0, 0, 1))  # (k, nj, 4, 4), bottom rows zero
        H = H + pad(lc.p_tree.new_ones(1, 1, 1, 1), (3, 0, 3, 0, 0, 0, 0, len(blocks) - 1))  # H0's corner 1
        cols = [pad(mt.rot_axis, (0, 0, 0, 1, tree.nfree, 0)), pad(lc.c_loc[..., None], (0, 0, 0, 1)),
                pad(lc.c_loc.new_ones(1, 1, 1), (0, 0, 3, 0)).expand(tree.nb, 4, 1)]
        if tree.any_prismatic:
            cols.append(pad(mt.lin_axis, (0, 0, 0, 1, tree.nfree, 0)))
        return _Constants(H=H[:, :, None], V=torch.cat(cols, -1), Ic=pad(lc.Ic_loc, (0, 1, 0, 1)),
                          m=mt.body_mass[:, None, None])

    return per_model("jacobian", (mt.A0, mt.A1, mt.A2, mt.lin_dir, mt.p_tree, mt.rot_axis, mt.lin_axis,
                                  mt.body_h, mt.body_mass, mt.body_I), build)


def com_jacobians(tree: KinematicTree, mt: ModelTensors, q: Tensor) -> ComJacobians:
    """:class:`ComJacobians` at ``q (B, nq)`` (joint space of ``tree``)."""
    jt = jacobian_tables(tree, q.dtype, q.device)
    k = _constants(tree, mt)
    B, nb, nv, nf = q.shape[0], tree.nb, tree.nv, tree.nfree
    qj = joint_angles(tree, q.transpose(0, 1)).reshape(tree.nj, B, 1, 1)
    T = torch.addcmul(torch.addcmul(k.H[0], qj.sin(), k.H[1]), qj.cos(), k.H[2], value=-1.0)  # (nj, B, 4, 4)
    if tree.n_ball:
        first = tree.tables(q.dtype, q.device).ball_first
        Rb = mm(mt.A0.index_select(0, first), ball_rotations(tree, q.transpose(0, 1))).permute(0, 3, 1, 2)
        Tb = T.index_select(0, first)
        T = T.index_copy(0, first, torch.cat([torch.cat([Rb, Tb[..., :3, 3:]], -1), Tb[..., 3:, :]], -2))
    if tree.any_prismatic:
        T = torch.addcmul(T, qj, k.H[3])
    parts = [T, jt.world.expand(1, B, 4, 4)]
    if nf:
        # The base at the origin of the centered world.
        R0 = quat_to_matrix_bl(q[:, 3:7].transpose(0, 1)).permute(2, 0, 1)  # (B, 3, 3)
        parts.insert(0, torch.nn.functional.pad(R0, (0, 1, 0, 1))[None] + jt.e33)
    T = torch.cat(parts)  # (nb + 1, B, 4, 4), the last the world
    # torch.bmm on 3-D views throughout: matmul's broadcasting costs twice the product here.
    for anc in jt.jumps:
        T = torch.bmm(T.index_select(0, anc).view(-1, 4, 4), T.view(-1, 4, 4)).view(nb + 1, B, 4, 4)
    T = T[:-1]
    # One product places every body's axis, COM and origin (and prismatic axis) in the world.
    X = torch.bmm(T.view(nb, B * 4, 4), k.V).view(nb, B, 4, -1)[..., :3, :].unbind(-1)  # each (nb, B, 3)
    w, off, p = X[0], X[1], X[2]
    lin = X[3] if tree.any_prismatic else None
    if nf:
        w = w[1:]
        cols = R0.permute(2, 0, 1)  # (3 axes, B, 3): the base frame's axes
        z = torch.zeros_like(cols)
        w = torch.cat([z, cols, w])
        lin = torch.cat([cols, z, lin[1:] if lin is not None else torch.zeros_like(w[6:])])
    TI = torch.bmm(T.view(nb, B * 4, 4), k.Ic).view(nb * B, 4, 4)
    Ic = torch.bmm(TI, T.view(nb * B, 4, 4).transpose(1, 2)).view(nb, B, 4, 4)[..., :3, :3]  # (nb, B, 3, 3)
    # c_b - o_a: the COM offset plus the difference of two origins (exactly zero for a == b).
    s = off.index_select(0, jt.desc) + (p.index_select(0, jt.desc) - p.index_select(0, jt.anc))  # (k, B, 3)
    wk = w.index_select(0, jt.dof)
    col = torch.linalg.cross(wk, s, dim=-1)
    if lin is not None:
        # A translation's column is the same at every point; no other has a linear part at its
        # own body's origin.
        col = col + lin.index_select(0, jt.dof)
    pairs = torch.cat([col, wk], -1)  # (k, B, 6)
    # A scatter, not a product with a 0/1 matrix: BLAS threads products this size, and on a loaded
    # machine each threaded call waits for a descheduled worker (see _common.SMALL_SUM).
    J = pairs.new_zeros(nb * nv, B, 6).index_add(0, jt.pos, pairs).view(nb, nv, B, 6)
    J = J.permute(2, 0, 3, 1).reshape(B, nb * 6, nv)
    return ComJacobians(J=J, w=w, lin=lin, s=s, T=T, p=p, off=off, Ic=Ic, m=k.m)


def mass_matrix_jac(cj: ComJacobians, symmetric: bool = True) -> Tensor:
    """``M = sum_b J_b^T diag(m_b 1, I_c,b) J_b``: ``(B, nv, nv)``; ``symmetric=False`` leaves
    the rounding asymmetry of the product (for a solve)."""
    B, rows, nv = cj.J.shape
    Jb = cj.J.view(B, rows // 6, 6, nv)
    GJ = torch.cat([cj.m * Jb[:, :, :3], cj.Ic.transpose(0, 1) @ Jb[:, :, 3:]], 2).view(B, rows, nv)
    A = torch.bmm(cj.J.transpose(1, 2), GJ)
    return 0.5 * (A + A.transpose(1, 2)) if symmetric else A


def rnea_jac(tree: KinematicTree, mt: ModelTensors, cj: ComJacobians, v: Tensor, a: Tensor | None,
             f_ext: Tensor | None) -> Tensor:
    """Joint forces ``(B, nv)`` for velocities ``v (B, nv)`` and accelerations ``a (B, nv)``
    (``None``: zero) and link forces ``f_ext (B, n_links, 6)``, without the passive terms."""
    return torch.bmm(cj.J.transpose(1, 2), body_forces_jac(tree, mt, cj, v, a, f_ext))[..., 0]


def body_forces_jac(tree: KinematicTree, mt: ModelTensors, cj: ComJacobians, v: Tensor, a: Tensor | None,
                    f_ext: Tensor | None) -> Tensor:
    """The force and moment about its COM that each body needs, ``(B, nb * 6, 1)`` in the rows
    of ``cj.J`` (the joint forces are ``J^T F``); arguments as :func:`rnea_jac`."""
    jt = jacobian_tables(tree, v.dtype, v.device)
    B, rows, nv = cj.J.shape
    nb = rows // 6
    V = torch.bmm(cj.J, v[..., None]).view(B, nb, 6).transpose(0, 1)  # (nb, B, 6)
    vc, om = V[..., :3], V[..., 3:]
    om_d = om if jt.dof_body is None else om.index_select(0, jt.dof_body)  # the body carrying each axis
    vo = vc - torch.linalg.cross(om, cj.off, dim=-1)  # velocity of each body's origin
    vo_d = vo if jt.dof_body is None else vo.index_select(0, jt.dof_body)
    wv = cj.w * v.transpose(0, 1)[..., None]  # (nv, B, 3)
    # Per DoF: the turning of its axis, d/dt (w_d v_d) = u, and the part -(w_d v_d) x v_o,d of the
    # lever's rate (its v_c part sums to w_b x v_c,b over the DoFs above b).
    uv = torch.linalg.cross(torch.stack([om_d, vo_d]), wv.expand(2, -1, -1, -1), dim=-1)  # (2, nv, B, 3)
    u, t = uv[0], uv[1]
    if cj.lin is not None:
        t = t + torch.linalg.cross(om_d, cj.lin, dim=-1) * v.transpose(0, 1)[..., None]
    # Summed over the DoFs above each body, with (d/dt w_d v_d) x (c_b - o_d) of each pair.
    ut = torch.cat([u, t], -1).index_select(0, jt.dof)  # (k, B, 6)
    pairs = torch.cat([ut, torch.linalg.cross(ut[..., :3], cj.s, dim=-1)], -1)
    sums = pairs.new_zeros(nb, B, 9).index_add(0, jt.desc, pairs)
    alpha = sums[..., :3]
    a_c = sums[..., 3:6] + sums[..., 6:] + torch.linalg.cross(om, vc, dim=-1)
    if a is not None:
        Ja = torch.bmm(cj.J, a[..., None]).view(B, nb, 6).transpose(0, 1)
        a_c, alpha = a_c + Ja[..., :3], alpha + Ja[..., 3:]
    f = cj.m * (a_c - mt.gravity)
    Iw = torch.bmm(cj.Ic.view(nb * B, 3, 3), torch.stack([alpha, om], -1).view(nb * B, 3, 2)).view(nb, B, 3, 2)
    n = Iw[..., 0] + torch.linalg.cross(om, Iw[..., 1], dim=-1)
    F = torch.cat([f, n], -1)  # (nb, B, 6)
    if f_ext is not None:
        ts = TreeState(R=cj.T[..., :3, :3].permute(0, 2, 3, 1), p=cj.p.permute(0, 2, 1), S=None, mt=mt)
        fe, ne = external_forces(tree, ts, f_ext, cj.off.permute(0, 2, 1))  # (nb, 3, B) each
        F = F - torch.cat([fe, ne], 1).permute(0, 2, 1)
    return F.transpose(0, 1).reshape(B, rows, 1)
