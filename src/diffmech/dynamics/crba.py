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
from ._common import RigidInertia, TreeState, as_state, bind, cross, tree_state
from ._local import body_inertia, composite_inertia, levers, local_columns, tables_of

__all__ = ["crba", "mass_matrix", "crba_flat"]


def crba_flat(tree: KinematicTree, mt: ModelTensors, q: Tensor, ts: TreeState | None = None,
              inertia: RigidInertia | None = None) -> Tensor:
    """CRBA on a flat batch: ``q (B, nq) -> M (B, nv, nv)``.

    ``ts`` (the kinematic pass, centered for float32 accuracy far from the origin) is reused when
    the caller already has it; ``inertia`` is accepted for compatibility and not used.
    """
    if ts is None:
        ts = tree_state(tree, mt, q, centered=True)
    return crba_bl(tree, ts, body_inertia(ts))


def crba_bl(tree: KinematicTree, ts: TreeState, inertia: RigidInertia) -> Tensor:
    """CRBA from a kinematic pass ``ts`` and the body inertias about the body origins
    (``body_inertia(ts)``) -> ``M (B, nv, nv)``."""
    q = ts.S
    lt = tables_of(tree, q)
    tb = tree.tables(q.dtype, q.device)
    r = levers(ts, lt)
    Ic = composite_inertia(inertia, r, lt)
    if tree.nfree:
        Ic = RigidInertia(m=Ic.m[tb.dof_body], h=Ic.h[tb.dof_body], I=Ic.I[tb.dof_body])
    Sl = local_columns(ts, lt)
    F = Ic.apply(Sl)  # (nv, 6, B) about each DoF's body origin
    # M[d, e] = S_d . F_e with F_e moved from e's body to d's along their lever.
    Fe = F[tb.crba_e]
    r = torch.cat([r.new_zeros(1, 3, r.shape[-1]), r])[lt.crba_lever]
    Sd = Sl[tb.crba_d]
    vals = (Sd[:, :3] * Fe[:, :3]).sum(1) + (Sd[:, 3:] * (Fe[:, 3:] + cross(r, Fe[:, :3]))).sum(1)  # (npairs, B)
    M = tb.crba_scatter @ vals  # (nv * nv, B)
    return M.transpose(0, 1).reshape(-1, tree.nv, tree.nv)


def crba(robot: RobotParameters, q: Tensor) -> Tensor:
    """Mass matrix ``M(q)``; the same function as :meth:`diffmech.RobotModel.mass_matrix`.

    Args:
        robot: the robot.
        q: (..., nq) configuration.

    Returns:
        (..., nv, nv) symmetric positive definite joint-space inertia (kg m^2, kg).
    """
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    return crba_flat(tree, mt, flat[0]).reshape(*batch, robot.nv, robot.nv)


mass_matrix = crba
