"""Joint-space inertia matrix by the Composite Rigid Body Algorithm (Featherstone 2008, §6.2).

The composite inertia seen by joint ``e``, about the origin of its body (world-aligned axes), is
the sum of the inertias of the bodies it moves, each moved there along its lever (one masked
product over the pairs of bodies); ``M[d, e] = S_d . (Ic_e S_e)`` for every joint ``d`` at or above
``e``, with the force ``Ic_e S_e`` moved to ``d``'s body (:mod:`._local`). Only those pairs are
computed, then scattered into the symmetric matrix.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from . import threads
from ._common import (
    LocalTables,
    RigidInertia,
    TreeState,
    as_state,
    bind,
    cross,
    generalized_mass,
    joint_q,
    mv,
    tree_state,
    tree_sum,
)
from ._jacobian import com_jacobians, mass_matrix_jac, one_thread, use_jacobians
from ._local import ComInertia, com_inertia, local_columns, segment_sum, tables_of
from ._world import crba_world_bl, world_frame
from .kernels import default_native

__all__ = ["crba", "mass_matrix", "crba_flat"]


def crba_flat(tree: KinematicTree, mt: ModelTensors, q: Tensor, ts: TreeState | None = None,
              inertia: RigidInertia | None = None) -> Tensor:
    """CRBA on a flat batch in joint space: ``q (B, nq) -> M (B, nv, nv)`` (sizes of ``tree``).

    ``ts`` (the kinematic pass, centered for float32 accuracy far from the origin) is reused when
    the caller already has it; so is ``inertia`` (``world_inertia(ts)``) in the world frame (see
    :func:`~diffmech.dynamics.set_eager_frame`), which alone uses it.
    """
    if tree.nv == 0:  # a static model: an empty mass matrix
        return q.new_zeros(q.shape[0], 0, 0)
    world = world_frame()
    if ts is None and not world and use_jacobians(q):
        with one_thread():
            return mass_matrix_jac(com_jacobians(tree, mt, q))
    if ts is None:
        ts = tree_state(tree, mt, q, centered=not world)
    if world:
        return crba_world_bl(tree, ts, inertia)
    return crba_bl(tree, ts, com_inertia(tree, ts))


def crba_bl(tree: KinematicTree, ts: TreeState, ci: ComInertia) -> Tensor:
    """CRBA from a kinematic pass ``ts`` and the body inertias ``ci = com_inertia(tree, ts)`` ->
    ``M (B, nv, nv)``."""
    S = ts.S
    lt = tables_of(tree, S)
    tb = tree.tables(S.dtype, S.device)
    j0, nf = tree.v_joint_start, tree.nfree
    local = tree.any_prismatic or nf  # whether some columns have a linear part at their body's origin
    Sl = local_columns(ts, lt) if local else None
    # F_j = Ic_j S_j about the origin o_j of joint j's body, summed over the bodies b of its
    # subtree: b's centre of mass moves with v = lin_j + w_j x s (s = c_b - o_j), so b's force is
    # f = m v and its moment about o_j is s x f + I_c w_j. Formed as s x (m (w x s)), each
    # parallel-axis term keeps its digits even where |w x s| is much smaller than |s|.
    w = S[j0:, 3:]  # angular parts: the same at every point
    wp = w.index_select(0, lt.jp_joint)
    sp = ci.s.index_select(0, lt.jp_pair) if nf else ci.s  # without a floating base, every pair is a joint's
    vp = cross(wp, sp)
    if tree.any_prismatic:
        vp = vp + Sl[j0:, :3].index_select(0, lt.jp_joint)
    fp = ci.m.index_select(0, lt.jp_body)[..., None] * vp
    Fp = segment_sum(torch.cat([fp, cross(sp, fp)], dim=1), lt.jp_joint, tree.nj, lt.jp_sum)  # (nj, 6, B)
    f = Fp[:, :3]
    n = Fp[:, 3:] + mv(tree_sum(tb.mask_db[j0:], ci.Ic), w)  # + I_c summed over the subtree
    if nf:
        # The base carries the whole robot: its composite inertia about its origin o_0 (0 when
        # centered), each body's moved there. Its entries are large, so no digits are lost.
        # About o_0 a body adds I_c + m (|s|^2 1 - s s^T), s = c - o_0 (the levers of pairs (0, b)).
        s0 = ci.s.index_select(0, lt.base_pairs)
        ms = ci.m[..., None] * s0
        W = (ms[:, :, None] * s0[:, None, :]).sum(0)
        I0 = ci.Ic.sum(0) - W + W.diagonal(0, 0, 1).sum(-1)[None, None] * lt.eye3[..., None]
        Ic0 = RigidInertia(m=ci.m.sum(0, keepdim=True), h=ms.sum(0, keepdim=True), I=I0[None])
        F = torch.cat([Ic0.apply(Sl[:6]), torch.cat([f, n], dim=1)])  # (nv, 6, B)
        near = (Sl.index_select(0, lt.near_d) * F.index_select(0, lt.near_e)).sum(1)
        p = ts.p.index_select(0, tb.dof_body)
        f, n = F[:, :3], F[:, 3:]
    else:
        # M[d, e] = S_d . F_e. DoFs of one body (here: d = e) meet at its origin.
        near = (w * n).sum(1)
        if tree.any_prismatic:
            near = near + (Sl[:, :3] * f).sum(1)
        p = ts.p
    if not lt.far_d.numel():
        return symmetric(tree, lt, near)
    # Others at the world origin, where the moments cancel only as much as the lever between the
    # two bodies does (its rounding is that of the positions either way).
    F_O = torch.cat([f, n + cross(p, f)], dim=1)
    far = (S.index_select(0, lt.far_d) * F_O.index_select(0, lt.far_e)).sum(1)
    return symmetric(tree, lt, torch.cat([far, near]))


def symmetric(tree: KinematicTree, lt: LocalTables, vals: Tensor) -> Tensor:
    """``(B, nv, nv)`` symmetric matrix from its values ``vals (far + near, B)`` at the CRBA pairs."""
    nv = tree.nv
    # One gather from the values and a zero row, for every batch size: no product with a mostly-zero
    # (nv * nv, npairs) matrix (O(nv^4) memory on a chain, and BLAS threads it, see
    # _common.SMALL_SUM), no in-place copy (which vmap cannot batch); its backward is one index_add.
    M = torch.nn.functional.pad(vals, (0, 0, 0, 1)).index_select(0, lt.crba_gather)  # (nv * nv, B)
    return M.transpose(0, 1).reshape(-1, nv, nv)


@threads.decided
def crba(robot: RobotParameters, q: Tensor) -> Tensor:
    """Mass matrix ``M(q)``; the same function as :meth:`diffmech.RobotModel.mass_matrix`.

    Args:
        robot: the robot.
        q: (..., nq) configuration.

    Returns:
        (..., nv, nv) symmetric positive definite joint-space inertia (kg m^2, kg).
    """
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    M = default_native(robot, "mass_matrix", flat, True, False)
    if M is not None:
        return M.reshape(*batch, robot.nv, robot.nv)
    tree, mt = bind(robot, flat[0])
    M = generalized_mass(tree, crba_flat(tree, mt, joint_q(tree, flat[0])))
    return M.reshape(*batch, robot.nv, robot.nv)


mass_matrix = crba
