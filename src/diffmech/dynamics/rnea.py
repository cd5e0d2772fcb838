"""Inverse dynamics by the Recursive Newton-Euler Algorithm (Featherstone 2008, ch. 5).

Written in the world frame: velocities and accelerations of all bodies are sums over ancestor
joints and the joint forces sums over subtrees, so each sweep of the textbook recursion is one
masked matrix product over all bodies.
"""

from __future__ import annotations

from torch import Tensor

from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from ._common import (
    RigidInertia,
    TreeState,
    add_passive,
    as_state,
    bind,
    f_ext_entry,
    generalized_force,
    gravity_acceleration,
    joint_q,
    joint_v,
    masks,
    tree_state,
    tree_sum,
    velocity_terms,
)
from .kernels import default_native

__all__ = ["rnea", "inverse_dynamics", "bias_forces", "generalized_gravity", "rnea_flat", "rnea_bl"]


def rnea_flat(
    tree: KinematicTree,
    mt: ModelTensors,
    q: Tensor,
    v: Tensor,
    a: Tensor | None,
    f_ext: Tensor | None = None,
    passive: bool = True,
    ts: TreeState | None = None,
) -> Tensor:
    """RNEA on flat batches in joint space: ``q (B, nq), v (B, nv), a (B, nv) | None,
    f_ext (B, n_links, 6) -> (B, nv)`` (sizes of ``tree``; the generalised coordinates too unless
    the tree has mimic joints, see :func:`~diffmech.dynamics._common.joint_q`)."""
    if ts is None:
        ts = tree_state(tree, mt, q)
    aT = None if a is None else a.transpose(0, 1)
    return rnea_bl(tree, ts, q.transpose(0, 1), v.transpose(0, 1), aT, f_ext, passive).transpose(0, 1)


def rnea_bl(
    tree: KinematicTree,
    ts: TreeState,
    qT: Tensor,
    vT: Tensor,
    aT: Tensor | None,
    f_ext: Tensor | None,
    passive: bool,
    inertia: RigidInertia | None = None,
) -> Tensor:
    """Batch-last RNEA: ``qT (nq, B), vT (nv, B), aT (nv, B) -> tau (nv, B)``.

    ``aT=None`` stands for zero accelerations (the bias forces ``h``); ``inertia`` is
    ``world_inertia(ts)`` when the caller already has it.
    """
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


def rnea(
    robot: RobotParameters,
    q: Tensor,
    v: Tensor,
    a: Tensor,
    *,
    f_ext: Tensor | None = None,
    passive: bool = True,
) -> Tensor:
    """Inverse dynamics: the joint forces that produce accelerations ``a``.

    ``tau = M(q) a + C(q, v) v + g(q) - J^T f_ext - tau_passive(q, v)``. The same function as
    :meth:`diffmech.RobotModel.inverse_dynamics` and :func:`diffmech.inverse_dynamics`.

    Args:
        robot: the robot.
        q: (..., nq) configuration.
        v: (..., nv) joint velocities.
        a: (..., nv) joint accelerations.
        f_ext: optional (..., n_links, 6) external force; torque (N; N m) on each link, in
            world-aligned axes, torque about the link origin.
        passive: subtract the model's joint damping and spring forces (``False``: the bare
            rigid-body terms, as Pinocchio's ``rnea``).

    Returns:
        (..., nv) joint forces (N m or N); the batch shape is the broadcast of the inputs'.
    """
    flat, batch = as_state(
        robot, [("q", q, robot.nq), ("v", v, robot.nv), ("a", a, robot.nv), f_ext_entry(robot, f_ext)]
    )
    out = default_native(robot, "inverse_dynamics", flat, passive, f_ext is not None)
    if out is not None:
        return out.reshape(*batch, robot.nv)
    tree, mt = bind(robot, flat[0])
    q, v, a = joint_q(tree, flat[0]), joint_v(tree, flat[1]), joint_v(tree, flat[2])
    tau = rnea_flat(tree, mt, q, v, a, f_ext=flat[3] if f_ext is not None else None, passive=passive)
    return generalized_force(tree, tau).reshape(*batch, robot.nv)


inverse_dynamics = rnea


def bias_forces(robot: RobotParameters, q: Tensor, v: Tensor, *, passive: bool = True) -> Tensor:
    """``h(q, v) = C(q, v) v + g(q) (- tau_passive)``, ``(..., nv)``: RNEA with zero acceleration."""
    flat, batch = as_state(robot, [("q", q, robot.nq), ("v", v, robot.nv)])
    qf, vf = flat
    tree, mt = bind(robot, qf)
    h = rnea_flat(tree, mt, joint_q(tree, qf), joint_v(tree, vf), None, passive=passive)
    return generalized_force(tree, h).reshape(*batch, robot.nv)


def generalized_gravity(robot: RobotParameters, q: Tensor) -> Tensor:
    """Gravity torques ``g(q) (..., nv)``: RNEA at rest, without springs or damping."""
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    qf = joint_q(tree, flat[0])
    z = qf.new_zeros(qf.shape[0], tree.nv)
    return generalized_force(tree, rnea_flat(tree, mt, qf, z, None, passive=False)).reshape(*batch, robot.nv)
