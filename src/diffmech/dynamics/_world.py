"""RNEA and CRBA with every spatial quantity at the world origin: the formulation before :mod:`._local`.

Kept as an option (:func:`set_eager_frame`): it issues fewer operators where ABA at a few
dozen states or a floating-base mass matrix at a few states is bound by their count, and is as
exact in float64, but in float32 it loses digits in proportion to the squared distance of the
bodies from the world origin (:mod:`._local` explains why). ABA's world-frame variant lives in
:func:`.aba._aba` (the same sweeps without the shifts between bodies).
"""

from __future__ import annotations

import os

from torch import Tensor

from ..errors import OptionError
from ..model.tree import KinematicTree, symmetric_from_pairs
from ._common import (
    RigidInertia,
    TreeState,
    add_passive,
    gravity_acceleration,
    masks,
    mv_small,
    tree_sum,
    velocity_terms,
    world_inertia,
)

FRAMES = ("local", "world")
_frame = [os.environ.get("DIFFMECH_EAGER_FRAME", "local")]
if _frame[0] not in FRAMES:
    raise OptionError(f"DIFFMECH_EAGER_FRAME={_frame[0]!r}: choose from {FRAMES}")


def set_eager_frame(frame: str) -> str:
    """Choose where the batch-last algorithms (RNEA, CRBA, ABA) form their spatial products;
    returns the previous choice. The default can be set with the environment variable
    ``DIFFMECH_EAGER_FRAME``.

    Args:
        frame: ``"local"`` (default): about points on the robot, float32 results within about
            1e-5 of float64 wherever the robot is; ``"world"``: at the world origin, fewer
            operators (faster where a call is bound by their count: ABA at a few dozen states,
            a floating base's mass matrix at a few), float32 errors growing with the squared
            distance of the bodies from the origin (1e-4 to 1e-2 in forward dynamics on the
            robots measured in BENCHMARKS.md).
    """
    if frame not in FRAMES:
        raise OptionError(f"set_eager_frame: unknown frame {frame!r}; choose from {FRAMES}")
    old, _frame[0] = _frame[0], frame
    return old


def world_frame() -> bool:
    """Whether the algorithms run in the world frame (see :func:`set_eager_frame`)."""
    return _frame[0] == "world"


def rnea_world_bl(tree: KinematicTree, ts: TreeState, qT: Tensor, vT: Tensor, aT: Tensor | None,
                  f_ext: Tensor | None, passive: bool, inertia: RigidInertia | None = None) -> Tensor:
    """:func:`.rnea.rnea_bl` at the world origin (``inertia``: ``world_inertia(ts)``)."""
    mt = ts.mt
    S = ts.S  # (nv, 6, B)
    vt = velocity_terms(tree, ts, vT, f_ext, inertia)
    mask_bd, mask_db = masks(tree, vT)
    A = tree_sum(mask_bd, vt.c if aT is None else S * aT[:, None] + vt.c) + gravity_acceleration(mt)
    F = vt.inertia.apply(A) + vt.bias
    tau = (S * tree_sum(mask_db, F)).sum(1)  # project subtree forces on each joint, (nv, B)
    if passive:
        tau = add_passive(tree, mt, tau, qT, vT, -1.0)
    return tau


def crba_world_bl(tree: KinematicTree, ts: TreeState, inertia: RigidInertia | None = None) -> Tensor:
    """:func:`.crba.crba_bl` at the world origin (``inertia``: ``world_inertia(ts)``)."""
    S = ts.S
    if inertia is None:
        inertia = world_inertia(ts)
    _, mask_db = masks(tree, S)
    if inertia.full is not None:  # small batch: sum the 6x6 matrices, one product with S
        F = mv_small(tree_sum(mask_db, inertia.full), S)  # (nv, 6, B)
    else:
        composite = RigidInertia(m=mask_db @ inertia.m, h=tree_sum(mask_db, inertia.h), I=tree_sum(mask_db, inertia.I))
        F = composite.apply(S)
    tb = tree.tables(S.dtype, S.device)
    vals = (S[tb.crba_d] * F[tb.crba_e]).sum(1)  # (npairs, B)
    return symmetric_from_pairs(tb, vals)
