"""Kinetic and potential energy."""

from __future__ import annotations

from torch import Tensor

from ..model.parameters import RobotParameters
from ._common import as_state, bind, joint_angles, joint_q, joint_v, masks, tree_state, tree_sum, world_inertia
from .kinematics import link_placements

__all__ = ["kinetic_energy", "potential_energy"]


def kinetic_energy(robot: RobotParameters, q: Tensor, v: Tensor) -> Tensor:
    """``T = 1/2 v^T M(q) v`` as a sum over bodies, ``(...)`` J."""
    flat, batch = as_state(robot, [("q", q, robot.nq), ("v", v, robot.nv)])
    tree, mt = bind(robot, flat[0])
    qf, vf = joint_q(tree, flat[0]), joint_v(tree, flat[1])
    ts = tree_state(tree, mt, qf)
    mask_bd, _ = masks(tree, qf)
    V = tree_sum(mask_bd, ts.S * vf.transpose(0, 1)[:, None])  # (nb, 6, B)
    return 0.5 * (V * world_inertia(ts).apply(V)).sum((0, 1)).reshape(batch)


def potential_energy(robot: RobotParameters, q: Tensor, *, passive: bool = True) -> Tensor:
    """Gravitational energy ``-sum m_i g . c_i`` (plus joint springs ``1/2 k (q - rest)^2`` when
    ``passive``), ``(...)`` J; zero at the world origin."""
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    qf = joint_q(tree, flat[0])
    ts = tree_state(tree, mt, qf)
    R, p = link_placements(tree, ts)
    c = p + (R @ mt.link_com[..., None])[..., 0]
    U = -(mt.link_mass[:, None] * c * mt.gravity).sum((-1, -2))
    if passive and tree.nj:
        dq = joint_angles(tree, qf.transpose(0, 1)).transpose(0, 1) - mt.rest
        U = U + 0.5 * (mt.stiffness * dq * dq).sum(-1)
    return U.reshape(batch)
