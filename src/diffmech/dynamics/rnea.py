"""Inverse dynamics by the Recursive Newton-Euler Algorithm (Featherstone 2008, ch. 5).

Written in world-aligned axes: velocities and accelerations of all bodies are sums over ancestor
joints (one masked matrix product at the world origin, then moved to each body's origin), each
body's force is formed about its own origin, and the joint forces are sums over subtrees of forces
moved to the joint's body along short levers (:mod:`._local`), so each sweep of the textbook
recursion is a few batched operations over all bodies at once.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from . import threads
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
    motion_cross,
    tree_state,
    tree_sum,
    velocity_of_dofs,
)
from ._jacobian import com_jacobians, one_thread, rnea_jac, use_jacobians
from ._local import ComInertia, com_forces, com_inertia, local_columns, subtree_forces, tables_of
from ._world import rnea_world_bl, world_frame
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
    if tree.nv == 0:  # a static model: no joint force
        return q.new_zeros(q.shape[0], 0)
    if ts is None and not world_frame() and use_jacobians(q):
        with one_thread():
            tau = rnea_jac(tree, mt, com_jacobians(tree, mt, q), v, a, f_ext)
        return add_passive(tree, mt, tau.transpose(0, 1), q.transpose(0, 1), v.transpose(0, 1), -1.0).transpose(0, 1) \
            if passive else tau
    if ts is None:
        ts = tree_state(tree, mt, q, centered=not world_frame())
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
    inertia: ComInertia | RigidInertia | None = None,
) -> Tensor:
    """Batch-last RNEA: ``qT (nq, B), vT (nv, B), aT (nv, B) -> tau (nv, B)``.

    ``aT=None`` stands for zero accelerations (the bias forces ``h``); ``inertia`` is
    ``com_inertia(tree, ts)`` (``world_inertia(ts)`` in the world frame, see
    :func:`~diffmech.dynamics.set_eager_frame`) when the caller already has it. ``ts`` should be
    centered (``tree_state(..., centered=True)``) for float32 accuracy far from the origin.
    """
    if world_frame():
        return rnea_world_bl(tree, ts, qT, vT, aT, f_ext, passive, inertia)
    mt = ts.mt
    S = ts.S  # (nv, 6, B) at the world origin
    ci = com_inertia(tree, ts) if inertia is None else inertia
    lt = tables_of(tree, vT)
    mask_bd, _ = masks(tree, vT)
    Sv = S * vT[:, None]
    V_O = tree_sum(mask_bd, Sv)
    # Each column moves with its body: d/dt S_d = V_body(d) x S_d (without a floating base DoF d is body d).
    c = motion_cross(velocity_of_dofs(tree, V_O), Sv)
    A_O = tree_sum(mask_bd, c if aT is None else torch.addcmul(c, S, aT[:, None])) + gravity_acceleration(mt)
    f, n = com_forces(tree, ts, ci, V_O, A_O, f_ext)
    Fs = subtree_forces(ci, f, n, lt)  # (nb, 6, B) about each body's origin
    if tree.nfree:
        Fs = Fs[tree.tables(vT.dtype, vT.device).dof_body]
    tau = (local_columns(ts, lt) * Fs).sum(1)  # project subtree forces on each joint, (nv, B)
    if passive:
        tau = add_passive(tree, mt, tau, qT, vT, -1.0)
    return tau


@threads.decided
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


@threads.decided
def bias_forces(robot: RobotParameters, q: Tensor, v: Tensor, *, passive: bool = True) -> Tensor:
    """``h(q, v) = C(q, v) v + g(q) (- tau_passive)``, ``(..., nv)``: RNEA with zero acceleration."""
    flat, batch = as_state(robot, [("q", q, robot.nq), ("v", v, robot.nv)])
    qf, vf = flat
    # the inverse-dynamics kernel at zero acceleration, where one is built (see kernels.set_native)
    out = default_native(robot, "inverse_dynamics", [qf, vf, torch.zeros_like(vf)], passive, False)
    if out is not None:
        return out.reshape(*batch, robot.nv)
    tree, mt = bind(robot, qf)
    h = rnea_flat(tree, mt, joint_q(tree, qf), joint_v(tree, vf), None, passive=passive)
    return generalized_force(tree, h).reshape(*batch, robot.nv)


@threads.decided
def generalized_gravity(robot: RobotParameters, q: Tensor) -> Tensor:
    """Gravity torques ``g(q) (..., nv)``: RNEA at rest, without springs or damping."""
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    qf = joint_q(tree, flat[0])
    z = qf.new_zeros(qf.shape[0], tree.nv)
    return generalized_force(tree, rnea_flat(tree, mt, qf, z, None, passive=False)).reshape(*batch, robot.nv)
