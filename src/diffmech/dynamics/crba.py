"""Joint-space inertia matrix by the Composite Rigid Body Algorithm (Featherstone 2008, §6.2).

World-frame form: the composite inertia seen by joint ``e`` is the sum of the world inertias of
the bodies it moves (one masked product), and ``M[d, e] = S_d . (Ic_e S_e)`` for every joint ``d``
at or above ``e``; only those pairs are computed, then scattered into the symmetric matrix.
"""

from __future__ import annotations

from torch import Tensor

from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from ._common import (
    RigidInertia,
    TreeState,
    as_state,
    bind,
    generalized_mass,
    joint_q,
    masks,
    mv_small,
    tree_state,
    tree_sum,
    world_inertia,
)
from .kernels import default_native

__all__ = ["crba", "mass_matrix", "crba_flat"]


def crba_flat(tree: KinematicTree, mt: ModelTensors, q: Tensor, ts: TreeState | None = None,
              inertia: RigidInertia | None = None) -> Tensor:
    """CRBA on a flat batch in joint space: ``q (B, nq) -> M (B, nv, nv)`` (sizes of ``tree``).

    ``ts`` and ``inertia`` (``world_inertia(ts)``) are reused when the caller already has them.
    """
    if ts is None:
        ts = tree_state(tree, mt, q)
    if inertia is None:
        inertia = world_inertia(ts)
    _, mask_db = masks(tree, q)
    if inertia.full is not None:  # small batch: sum the 6x6 matrices, one product with S
        F = mv_small(tree_sum(mask_db, inertia.full), ts.S)  # (nv, 6, B)
    else:
        composite = RigidInertia(
            m=mask_db @ inertia.m, h=tree_sum(mask_db, inertia.h), I=tree_sum(mask_db, inertia.I)
        )
        F = composite.apply(ts.S)
    tb = tree.tables(q.dtype, q.device)
    vals = (ts.S[tb.crba_d] * F[tb.crba_e]).sum(1)  # (npairs, B)
    M = tree_sum(tb.crba_scatter, vals)  # (nv * nv, B)
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
    M = default_native(robot, "mass_matrix", flat, True, False)
    if M is not None:
        return M.reshape(*batch, robot.nv, robot.nv)
    tree, mt = bind(robot, flat[0])
    M = generalized_mass(tree, crba_flat(tree, mt, joint_q(tree, flat[0])))
    return M.reshape(*batch, robot.nv, robot.nv)


mass_matrix = crba
