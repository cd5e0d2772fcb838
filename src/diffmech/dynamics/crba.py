"""Joint-space inertia matrix by the Composite Rigid Body Algorithm (Featherstone 2008, §6.2).

World-frame form: the composite inertia seen by joint ``e`` is the sum of the world inertias of
the bodies it moves (one masked product), and ``M[d, e] = S_d . (Ic_e S_e)`` for every joint ``d``
at or above ``e``.
"""

from __future__ import annotations

from torch import Tensor

from ..model.robot import RobotModel
from ._common import TreeState, as_state, masks, tree_state, world_inertia

__all__ = ["crba", "crba_flat"]


def crba_flat(model: RobotModel, q: Tensor, ts: TreeState | None = None) -> Tensor:
    """CRBA on a flat batch: ``q (B, nq) -> M (B, nv, nv)``."""
    if ts is None:
        ts = tree_state(model, q)
    Iw = world_inertia(ts)
    mask_bd, strict, same = masks(model, q)
    B, nb = Iw.shape[:2]
    Ic = (mask_bd.transpose(0, 1) @ Iw.reshape(B, nb, 36)).reshape(B, model.nv, 6, 6)
    F = (Ic @ ts.S[..., None])[..., 0]  # (B, nv, 6)
    P = ts.S @ F.transpose(-1, -2)  # P[d, e] = S_d . Ic_e S_e
    upper = P * strict
    return upper + upper.transpose(-1, -2) + P * same


def crba(model: RobotModel, q: Tensor) -> Tensor:
    """Mass matrix ``M(q)``.

    Args:
        model: the robot.
        q: (..., nq) configuration.

    Returns:
        (..., nv, nv) symmetric positive definite joint-space inertia (kg m^2, kg).
    """
    flat, batch = as_state(model, [("q", q, model.nq)])
    return crba_flat(model, flat[0]).reshape(*batch, model.nv, model.nv)
