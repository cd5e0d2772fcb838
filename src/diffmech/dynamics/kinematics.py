"""Forward kinematics, frame Jacobians, centre of mass and configuration integration."""

from __future__ import annotations

import torch
from torch import Tensor

from .. import spatial
from ..errors import OptionError, ShapeError
from ..model.parameters import RobotParameters
from ..model.tree import KinematicTree
from . import threads
from ._common import TreeState, as_state, bind, generalized_force, joint_q, masks, tree_state
from .free_flyer import free_flyer_integrate, quaternion_step
from .kernels import default_native

__all__ = ["forward_kinematics", "link_pose", "jacobian", "poses_and_world_jacobians", "center_of_mass", "integrate",
           "link_placements", "advance_floating_base", "integrate_flat"]

FRAMES = ("world_aligned", "local", "world")


def link_placements(tree: KinematicTree, ts: TreeState) -> tuple[Tensor, Tensor]:
    """World placements of every link: ``(B, n_links, 3, 3), (B, n_links, 3)`` (batch-first)."""
    mt = ts.mt
    B = ts.R.shape[-1]
    lb = tree.tables(ts.R.dtype, ts.R.device).link_body
    if tree.nb == 0:  # a static model (no body): every link is fixed to the world, placed by its offset
        R = mt.link_R.expand(B, -1, -1, -1)
        return R, mt.link_p.expand(B, -1, -1)
    R_b = ts.R.permute(3, 0, 1, 2)[:, lb.clamp_min(0)]  # (B, nl, 3, 3)
    p_b = ts.p.permute(2, 0, 1)[:, lb.clamp_min(0)]
    if tree.world_links:  # links fixed to the world keep their offset as their world placement
        world = lb < 0
        eye = torch.eye(3, dtype=ts.R.dtype, device=ts.R.device)
        R_b = torch.where(world[:, None, None], eye, R_b)
        p_b = torch.where(world[:, None], torch.zeros_like(p_b), p_b)
    R = R_b @ mt.link_R
    p = p_b + (R_b @ mt.link_p[..., None])[..., 0]
    assert R.shape[0] == B
    return R, p


@threads.decided
def forward_kinematics(robot: RobotParameters, q: Tensor, *, form: str = "matrix"):
    """World poses of all links.

    Args:
        q: (..., nq) configuration.
        form: how each pose comes back (see :func:`link_pose`): ``"matrix"`` (default),
            ``"pos_quat"`` or ``"pos_rot"``.

    Returns:
        ``"matrix"``: (..., n_links, 4, 4) homogeneous transforms ``T_world_link`` in
        ``robot.link_names`` order; ``"pos_quat"``: ``(pos (..., n_links, 3), quat (..., n_links, 4))``
        with quaternions ``(x, y, z, w)``, ``w >= 0``; ``"pos_rot"``: ``(pos, R (..., n_links, 3, 3))``.
    """
    _check_form(form)
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    out = default_native(robot, "kinematics", flat, True, False)
    if out is not None:
        T = out[:, :16 * robot.n_links].view(-1, robot.n_links, 4, 4)
        if form == "matrix":
            return T.reshape(*batch, robot.n_links, 4, 4)
        R, p = T[..., :3, :3], T[..., :3, 3]
    else:
        tree, mt = bind(robot, flat[0])
        R, p = link_placements(tree, tree_state(tree, mt, joint_q(tree, flat[0])))
    return _as_form(R.reshape(*batch, robot.n_links, 3, 3), p.reshape(*batch, robot.n_links, 3), form)


@threads.decided
def link_pose(robot: RobotParameters, q: Tensor, link: str | int, *, form: str = "matrix"):
    """World pose of one link.

    Args:
        q: (..., nq) configuration.
        link: link name or index.
        form: ``"matrix"`` (default): ``T_world_link (..., 4, 4)``; ``"pos_quat"``: the link origin
            ``pos (..., 3)`` (m, world frame) and its orientation ``quat (..., 4)`` as ``(x, y, z, w)``
            with ``w >= 0``; ``"pos_rot"``: ``pos (..., 3)`` and the rotation ``R (..., 3, 3)``.
    """
    _check_form(form)
    li = robot.tree.link(link)
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    R, p = _one_link(tree, tree_state(tree, mt, joint_q(tree, flat[0])), li)
    return _as_form(R.reshape(*batch, 3, 3), p.reshape(*batch, 3), form)


FORMS = ("matrix", "pos_quat", "pos_rot")


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise OptionError(f"unknown pose form {form!r}; choose from {FORMS}")


def _as_form(R: Tensor, p: Tensor, form: str):
    if form == "matrix":
        return spatial.homogeneous(R, p)
    if form == "pos_quat":
        return p, spatial.matrix_to_quat(R)
    return p, R


def _one_link(tree: KinematicTree, ts: TreeState, li: int) -> tuple[Tensor, Tensor]:
    """Placement of link ``li``: ``(B, 3, 3), (B, 3)``."""
    b = tree.link_body[li]
    Rl, pl = ts.mt.link_R[li], ts.mt.link_p[li]
    B = ts.R.shape[-1]
    if b < 0:
        return Rl.expand(B, 3, 3), pl.expand(B, 3)
    R_b, p_b = ts.R[b].permute(2, 0, 1), ts.p[b].transpose(0, 1)
    return R_b @ Rl, p_b + (R_b @ pl[..., None])[..., 0]


@threads.decided
def jacobian(
    robot: RobotParameters,
    q: Tensor,
    link: str | int,
    *,
    frame: str = "world_aligned",
    point: Tensor | None = None,
) -> Tensor:
    """Geometric Jacobian of a link: ``(v; w) = J(q) qd``.

    Args:
        q: (..., nq) configuration.
        link: link name or index.
        frame: ``"world_aligned"`` (default; world axes, velocity of the link origin -- Pinocchio's
            LOCAL_WORLD_ALIGNED), ``"local"`` (link axes, link origin -- Pinocchio's LOCAL) or
            ``"world"`` (spatial velocity at the world origin -- Pinocchio's WORLD).
        point: optional (..., 3) offset of the point on the link, in link coordinates, whose
            velocity the linear rows give (``world_aligned`` and ``local`` only).

    Returns:
        (..., 6, nv) with rows (linear; angular).
    """
    if frame not in FRAMES:
        raise OptionError(f"jacobian: unknown frame {frame!r}; choose from {FRAMES}")
    li = robot.tree.link(link)
    entries = [("q", q, robot.nq)]
    if point is not None:
        if frame == "world":
            raise OptionError("jacobian: 'point' has no meaning with frame='world'")
        entries.append(("point", point, 3))
    flat, batch = as_state(robot, entries)
    tree, mt = bind(robot, flat[0])
    qf = joint_q(tree, flat[0])
    ts = tree_state(tree, mt, qf)
    R, p = _one_link(tree, ts, li)
    mask_bd, _ = masks(tree, qf)
    b = tree.link_body[li]
    S = ts.S.permute(2, 0, 1)  # (B, nv, 6)
    S = S * (mask_bd[b][:, None] if b >= 0 else 0.0)  # columns that move the link
    if point is not None:
        p = p + (R @ flat[1][..., None])[..., 0]
    if frame == "world":
        J = S
    else:
        lin = S[..., :3] + torch.linalg.cross(S[..., 3:], p[:, None].expand_as(S[..., 3:]))
        J = torch.cat([lin, S[..., 3:]], dim=-1)
        if frame == "local":
            Rt = R.transpose(-1, -2)[:, None]
            J = torch.cat([(Rt @ J[..., :3, None])[..., 0], (Rt @ J[..., 3:, None])[..., 0]], dim=-1)
    return generalized_force(tree, J.transpose(-1, -2)).reshape(*batch, 6, robot.nv)


@threads.decided
def poses_and_world_jacobians(robot: RobotParameters, q: Tensor, links) -> tuple[Tensor, Tensor]:
    """World poses of all links and ``frame="world"`` Jacobians of some, from one kinematics pass.

    What a contact step needs for several touching links at once (one :func:`jacobian` call per
    link would repeat the kinematics each time). The velocity of a point ``x`` (world coordinates)
    fixed to link ``i`` is ``J[..., i, :3, :] qd + (J[..., i, 3:, :] qd) x x``.

    Args:
        q: (..., nq) configuration.
        links: sequence of link names or indices.

    Returns:
        ``(T (..., n_links, 4, 4), J (..., len(links), 6, nv))``: ``T_world_link`` in
        ``robot.link_names`` order and, per link asked, the spatial velocity Jacobian at the world
        origin in world axes (rows linear; angular).
    """
    idx = [robot.tree.link(link) for link in links]
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree = robot.tree
    out = default_native(robot, "kinematics", flat, True, False)
    if out is None:
        _, mt = bind(robot, flat[0])
        out = kinematics_flat(tree, mt, joint_q(tree, flat[0]))
    nl, B = tree.n_links, out.shape[0]
    T = out[:, :16 * nl].view(B, nl, 4, 4)
    S = out[:, 16 * nl:].view(B, tree.nv, 6).transpose(1, 2)  # (B, 6, nv of the tree)
    J = S[:, None] * _link_rows(tree, idx, out)[None, :, None, :]  # (B, L, 6, nv of the tree)
    return T.reshape(*batch, nl, 4, 4), generalized_force(tree, J).reshape(*batch, len(idx), 6, robot.nv)


_LINK_ROWS: dict = {}


def _link_rows(tree: KinematicTree, idx: list[int], like: Tensor) -> Tensor:
    """``(L, nv)``: which of the tree's DoFs move each link of ``idx`` (zero rows for world-fixed links);
    a constant of the tree, kept per tree, links, dtype and device."""
    key = (tree.structure_hash, tree.nv, tuple(tree.link_body[i] for i in idx), like.dtype, like.device)
    got = _LINK_ROWS.get(key)
    if got is None:
        mask_bd, _ = masks(tree, like)
        body = torch.tensor([tree.link_body[i] for i in idx], dtype=torch.long, device=like.device)
        got = _LINK_ROWS[key] = torch.cat([mask_bd, mask_bd.new_zeros(1, mask_bd.shape[-1])])[body]  # -1: zeros
    return got


def kinematics_flat(tree: KinematicTree, mt, qf: Tensor) -> Tensor:
    """The torch code's link transforms and world motion subspaces in the native kinematics kernel's
    layout (:func:`~diffmech.dynamics.lanes.kinematics_lanes`): ``qf (B, tree.nq) -> (B, 16 n_links + 6 nv)``."""
    ts = tree_state(tree, mt, qf)
    R, p = link_placements(tree, ts)
    T = spatial.homogeneous(R, p)  # (B, nl, 4, 4)
    S = ts.S.permute(2, 0, 1)  # (B, nv, 6)
    return torch.cat([T.flatten(1), S.flatten(1)], 1)


@threads.decided
def center_of_mass(robot: RobotParameters, q: Tensor) -> Tensor:
    """Centre of mass of all links (world-fixed ones included) in the world, ``(..., 3)`` m."""
    flat, batch = as_state(robot, [("q", q, robot.nq)])
    tree, mt = bind(robot, flat[0])
    R, p = link_placements(tree, tree_state(tree, mt, joint_q(tree, flat[0])))
    c = p + (R @ mt.link_com[..., None])[..., 0]
    m = mt.link_mass
    return ((m[:, None] * c).sum(-2) / m.sum()).reshape(*batch, 3)


def integrate(model: RobotParameters, q: Tensor, v: Tensor, dt: float | Tensor = 1.0) -> Tensor:
    """Configuration after moving with constant velocity ``v`` for ``dt`` seconds.

    Joints: ``q + v dt``. Floating base: ``T_next = T exp(v_base dt)`` (``v_base`` in the base
    frame, Pinocchio's ``integrate``), with the quaternion kept unit norm (and normalised before
    use, so a drifted input quaternion stands for its orientation); see :mod:`.free_flyer`.

    Args:
        q: (..., nq); v: (..., nv); dt: scalar or tensor broadcastable to the batch.

    Returns:
        (..., nq).
    """
    flat, batch = as_state(model, [("q", q, model.nq), ("v", v, model.nv)])
    qf, vf = flat
    dt = torch.as_tensor(dt, dtype=qf.dtype, device=qf.device)
    if dt.dim() > 0:
        try:
            dt = dt.expand(*batch).reshape(-1, 1)
        except RuntimeError:
            raise ShapeError(
                f"{model.name}: 'dt' of shape {tuple(dt.shape)} does not broadcast to the batch shape {batch}"
            ) from None
    return integrate_flat(model.tree, qf, vf * dt).reshape(*batch, model.nq)


def integrate_flat(tree: KinematicTree, q: Tensor, dv: Tensor) -> Tensor:
    """:func:`integrate` on flat ``q (B, nq)`` by ``dv (B, nv)`` (velocity times time step): the
    floating base on SE(3), each ball joint's quaternion by ``quat * exp(w dt / 2)`` (angular velocity
    in its child frame), the other joints ``q + dv``."""
    if not tree.n_ball:
        return free_flyer_integrate(q, dv) if tree.nfree else q + dv
    tb = tree.tables(q.dtype, q.device)
    B = q.shape[0]
    quat = q.index_select(1, tb.ball_q).reshape(B * tree.n_ball, 4)
    w = dv.index_select(1, tb.ball_v).reshape(B * tree.n_ball, 3)
    out = q.index_copy(1, tb.ball_q, quaternion_step(quat, w).reshape(B, 4 * tree.n_ball))
    if tb.scalar_q.numel():
        out = out.index_add(1, tb.scalar_q, dv.index_select(1, tb.scalar_v))
    if tree.nfree:
        out = torch.cat([free_flyer_integrate(q[:, :7], dv[:, :6]), out[:, 7:]], 1)
    return out


def advance_flat(q: Tensor, v: Tensor, dt, tree: KinematicTree | None = None) -> Tensor:
    """:func:`advance_floating_base` in torch code on flat ``q (B, nq), v (B, nv)`` (``dt``: a float or
    ``(B, 1)``) -> ``(B, nq + nv)``; what the native ``advance`` kernel computes. ``tree``: needed
    where it has ball joints (their quaternions turn on the sphere)."""
    Rk = spatial.quat_to_matrix(q[:, 3:7] / q[:, 3:7].norm(dim=-1, keepdim=True))
    vw = (Rk @ v[:, :3, None])[..., 0]
    dv = torch.cat([torch.zeros_like(vw), v[:, 3:]], -1) * dt
    rot = integrate_flat(tree, q, dv) if tree is not None and tree.n_ball else free_flyer_integrate(q, dv)
    q1 = torch.cat([q[:, :3] + dt * vw, rot[:, 3:]], -1)
    R1 = spatial.quat_to_matrix(q1[:, 3:7])
    return torch.cat([q1, (R1.transpose(-1, -2) @ vw[..., None])[..., 0], v[:, 3:]], -1)


def advance_floating_base(robot: RobotParameters, q: Tensor, v: Tensor, dt: float) -> tuple[Tensor, Tensor]:
    """Positions after a time step of a floating-base robot whose base velocity is held in the base
    frame of the step's start: the contact step's update (:func:`diffmech.sim.contact_step`).

    The base moves by ``dt R_k v_lin`` in world axes and turns by ``dt w`` (body frame), the joints by
    ``dt v_j``, and the base's linear velocity is re-expressed in the new base frame
    (``R_1^T R_k v_lin``): a symplectic Euler step of the world-frame translation. On the CPU by the
    native ``advance`` kernel once built for the tree (:func:`diffmech.dynamics.kernels.prepare`), for
    rotations below one radian per step.

    Args:
        q: (B, nq) configuration; v: (B, nv) velocity at the step's end (base twist in the base frame
            of the step's start); dt: s.

    Returns:
        ``(q1 (B, nq), v1 (B, nv))``.
    """
    from .lanes import SERIES_BELOW

    flat, batch = as_state(robot, [("q", q, robot.nq), ("v", v, robot.nv)])
    qf, vf = flat
    out = None
    with torch.no_grad():
        small = float(vf[:, 3:6].square().sum(-1).amax()) * dt * dt < SERIES_BELOW if qf.shape[0] else False
    if small:
        out = default_native(robot, "advance", [qf, vf, qf.new_full((qf.shape[0], 1), dt)], True, False)
    if out is None:
        out = advance_flat(qf, vf, dt, robot.tree)
    return out[:, :robot.nq].reshape(*batch, robot.nq), out[:, robot.nq:].reshape(*batch, robot.nv)
