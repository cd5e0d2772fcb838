"""Input checking and the world-frame kinematic pass shared by every algorithm.

All algorithms work in the world frame with spatial vectors at the world origin (Featherstone's
"Plucker coordinates at the origin"): each joint contributes a world-frame motion subspace column
``S_d``, and a body's velocity is the sum of the columns of the joints above it. Sums over
ancestors or over subtrees then become one matrix product with a constant 0/1 mask, so RNEA and
CRBA are a handful of batched operations over all bodies at once; only the pose composition (and
ABA) walk the tree, level by level, processing bodies of one depth together.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .. import spatial
from ..errors import ShapeError
from ..model.robot import ModelTensors, RobotModel


def as_state(model: RobotModel, named: list) -> tuple[list[Tensor], tuple[int, ...]]:
    """Validate and broadcast state tensors, then flatten their batch dimensions.

    Args:
        named: ``(name, tensor, trailing)`` triples, ``trailing`` the expected last dimension
            (an int) or trailing shape (a tuple); ``None`` entries are skipped.

    Returns:
        The tensors reshaped to ``(B, *trailing)`` in one dtype/device, and the common batch shape.
    """
    named = [x for x in named if x is not None]
    tensors = [(n, t, (k,) if isinstance(k, int) else tuple(k)) for n, t, k in named if t is not None]
    ref = next((t for _, t, _ in tensors if isinstance(t, Tensor)), None)
    dtype = ref.dtype if ref is not None else model.dtype
    device = ref.device if ref is not None else model.device
    out = []
    for name, t, k in tensors:
        if not isinstance(t, Tensor):
            try:
                t = torch.as_tensor(t, dtype=dtype, device=device)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ShapeError(f"{model.name}: '{name}' cannot be converted to a tensor: {e}") from None
        if not t.dtype.is_floating_point:
            raise ShapeError(f"{model.name}: '{name}' must be a floating-point tensor, got dtype {t.dtype}")
        if t.dtype != dtype:
            raise ShapeError(
                f"{model.name}: '{name}' has dtype {t.dtype} but '{tensors[0][0]}' has {dtype}; "
                "pass all state tensors in one dtype"
            )
        if t.device != device:
            raise ShapeError(
                f"{model.name}: '{name}' is on {t.device} but '{tensors[0][0]}' is on {device}; "
                "pass all state tensors on one device"
            )
        if t.dim() < len(k) or tuple(t.shape[t.dim() - len(k):]) != k:
            want = ", ".join(map(str, k))
            raise ShapeError(f"{model.name}: '{name}' must have shape (..., {want}), got {tuple(t.shape)}")
        out.append((name, t, k))
    if device.type != model.device.type:
        raise ShapeError(
            f"{model.name}: inputs are on {device} but the model is on {model.device}; call model.to({device.type!r})"
        )
    try:
        batch = torch.broadcast_shapes(*[t.shape[: t.dim() - len(k)] for _, t, k in out])
    except RuntimeError:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t, _ in out)
        raise ShapeError(f"{model.name}: batch dimensions do not broadcast: {shapes}") from None
    flat = [t.expand(*batch, *k).reshape(-1, *k) for _, t, k in out]
    return flat, tuple(batch)


class TreeState(NamedTuple):
    """World-frame kinematic quantities for a flat batch ``B``."""

    R: Tensor  # (B, nb, 3, 3) body orientations in the world
    p: Tensor  # (B, nb, 3) body origins in the world
    S: Tensor  # (B, nv, 6) motion subspace columns, world frame at the origin
    mt: ModelTensors


def body_placements(model: RobotModel, mt: ModelTensors, q: Tensor) -> tuple[Tensor, Tensor]:
    """World placements of all bodies. ``q (B, nq) -> R (B, nb, 3, 3), p (B, nb, 3)``."""
    B = q.shape[0]
    qj = q[:, model._q_joint_start:]
    s = qj.sin()[..., None, None]
    c = qj.cos()[..., None, None]
    eye = torch.eye(3, dtype=q.dtype, device=q.device)
    R_joint = eye + s * mt.K + (1 - c) * mt.KK  # (B, nj, 3, 3), identity for prismatic
    R_loc = mt.R_tree @ R_joint
    p_loc = mt.p_tree + (mt.R_tree @ (mt.lin_axis * qj[..., None])[..., None])[..., 0]
    Rs: list[Tensor] = [None] * model.nb  # type: ignore[list-item]
    ps: list[Tensor] = [None] * model.nb  # type: ignore[list-item]
    off = model._nfree
    if off:
        Rs[0] = spatial.quat_to_matrix(q[:, 3:7])
        ps[0] = q[:, :3]
    for idx, par in model._levels:
        if off and idx == [0]:
            continue
        if len(idx) == 1:
            b, pb = idx[0], par[0]
            Rl, pl = R_loc[:, b - off], p_loc[:, b - off]
            if pb < 0:
                Rs[b], ps[b] = Rl, pl
            else:
                Rs[b] = Rs[pb] @ Rl
                ps[b] = ps[pb] + (Rs[pb] @ pl[..., None])[..., 0]
            continue
        jl = [b - off for b in idx]
        Rl, pl = R_loc[:, jl], p_loc[:, jl]
        if par[0] < 0:  # all bodies at depth 0 hang from the world
            Rn, pn = Rl, pl
        else:
            Rp = torch.stack([Rs[b] for b in par], 1)
            pp = torch.stack([ps[b] for b in par], 1)
            Rn = Rp @ Rl
            pn = pp + (Rp @ pl[..., None])[..., 0]
        for k, b in enumerate(idx):
            Rs[b], ps[b] = Rn[:, k], pn[:, k]
    if B == 0:
        return (torch.zeros(0, model.nb, 3, 3, dtype=q.dtype, device=q.device),
                torch.zeros(0, model.nb, 3, dtype=q.dtype, device=q.device))
    return torch.stack(Rs, 1), torch.stack(ps, 1)


def tree_state(model: RobotModel, q: Tensor, mt: ModelTensors | None = None) -> TreeState:
    """Body placements and world-frame motion subspaces for ``q (B, nq)``."""
    if mt is None:
        mt = model.model_tensors(q.dtype, q.device)
    R, p = body_placements(model, mt, q)
    off = model._nfree
    Rj, pj = R[:, off:], p[:, off:]
    w_rot = (Rj @ mt.rot_axis[..., None])[..., 0]
    w_lin = (Rj @ mt.lin_axis[..., None])[..., 0]
    # A revolute axis through p with direction w moves the world origin with velocity p x w.
    S = torch.cat([torch.linalg.cross(pj, w_rot) + w_lin, w_rot], dim=-1)
    if off:
        S = torch.cat([spatial.motion_action(R[:, 0], p[:, 0]).transpose(-1, -2), S], dim=1)
    return TreeState(R=R, p=p, S=S, mt=mt)


def world_inertia(ts: TreeState) -> Tensor:
    """Spatial inertias of all bodies in the world frame at the origin, ``(B, nb, 6, 6)``."""
    Xinv = spatial.motion_action_inverse(ts.R, ts.p)
    return Xinv.transpose(-1, -2) @ ts.mt.I_body @ Xinv


def masks(model: RobotModel, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(mask_bd (nb, nv), mask_strict (nv, nv), mask_same (nv, nv))`` in ``like``'s dtype."""
    kw = dict(dtype=like.dtype, device=like.device)
    return model._mask_bd.to(**kw), model._mask_strict.to(**kw), model._mask_same.to(**kw)


def gravity_acceleration(mt: ModelTensors) -> Tensor:
    """Spatial acceleration of the world that stands in for gravity, ``(6,)``: ``(-g; 0)``."""
    return torch.cat([-mt.gravity, torch.zeros_like(mt.gravity)])


def passive_forces(model: RobotModel, mt: ModelTensors, q: Tensor, v: Tensor) -> Tensor:
    """Joint damping and spring forces ``(B, nv)`` acting *on* the joints (zero on the base)."""
    qj = q[:, model._q_joint_start:]
    vj = v[:, model._v_joint_start:]
    tj = -mt.damping * vj - mt.stiffness * (qj - mt.rest)
    if model._nfree:
        tj = torch.cat([torch.zeros_like(v[:, :6]), tj], dim=-1)
    return tj


def external_body_forces(model: RobotModel, ts: TreeState, f_ext: Tensor) -> Tensor:
    """Map link forces to world-origin body forces.

    Args:
        f_ext: (B, n_links, 6) force; torque (N; N m) applied to each link, world-aligned axes,
            torque taken about the link origin.

    Returns:
        (B, nb, 6) spatial forces at the world origin, summed per body (links fixed to the world
        are dropped: they cannot move).
    """
    mt = ts.mt
    lb = torch.tensor(model.link_body, device=f_ext.device)
    keep = (lb >= 0).nonzero()[:, 0]
    body = lb[keep]
    R_b, p_b = ts.R[:, body], ts.p[:, body]
    origin = p_b + (R_b @ mt.link_p[keep][..., None])[..., 0]
    f = f_ext[:, keep]
    torque = f[..., 3:] + torch.linalg.cross(origin, f[..., :3])
    fw = torch.cat([f[..., :3], torque], dim=-1)
    out = torch.zeros(f_ext.shape[0], model.nb, 6, dtype=f_ext.dtype, device=f_ext.device)
    return out.index_add(1, body, fw)


def f_ext_entry(model: RobotModel, f_ext) -> tuple | None:
    """The :func:`as_state` entry of an optional ``f_ext (..., n_links, 6)``."""
    return None if f_ext is None else ("f_ext", f_ext, (model.n_links, 6))
