"""Batched rotation, SE(3) and 6-D spatial algebra over torch tensors.

Conventions (shared by the whole library):

* Spatial motion vectors are ``(..., 6)`` ordered ``(linear; angular)``, spatial force vectors
  ``(force; torque)`` -- the order Pinocchio uses, so Jacobian rows read (linear; angular).
* A placement ``(R, p)`` of frame B in frame A maps B-coordinates to A-coordinates:
  ``x_A = R x_B + p``. Homogeneous matrices ``T_a_b`` are ``(..., 4, 4)``.
* Quaternions are ``(x, y, z, w)`` (Pinocchio's and SciPy's order), unit norm.

All functions are pure and broadcast over leading dimensions.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from .errors import OptionError

__all__ = [
    "skew",
    "rpy_to_matrix",
    "matrix_to_rpy",
    "axis_angle_to_matrix",
    "quat_to_matrix",
    "matrix_to_quat",
    "quat_multiply",
    "so3_exp",
    "se3_exp",
    "so3_log",
    "so3_jlog",
    "se3_log",
    "se3_log_matrix",
    "pose_error",
    "homogeneous",
    "motion_action",
    "motion_action_inverse",
    "motion_cross",
    "force_cross",
    "spatial_inertia",
]


def skew(v: Tensor) -> Tensor:
    """Cross-product matrix: ``skew(v) @ w == cross(v, w)``. ``(..., 3) -> (..., 3, 3)``."""
    x, y, z = v.unbind(-1)
    o = torch.zeros_like(x)
    return torch.stack([o, -z, y, z, o, -x, -y, x, o], dim=-1).reshape(*v.shape[:-1], 3, 3)


def rpy_to_matrix(rpy: Tensor) -> Tensor:
    """URDF roll-pitch-yaw (fixed axes X, Y, Z) to a rotation ``Rz(yaw) Ry(pitch) Rx(roll)``.

    ``(..., 3) -> (..., 3, 3)``.
    """
    r, p, y = rpy.unbind(-1)
    cr, sr, cp, sp, cy, sy = r.cos(), r.sin(), p.cos(), p.sin(), y.cos(), y.sin()
    rows = [
        cy * cp, cy * sp * sr - sy * cr, cy * sp * cr + sy * sr,
        sy * cp, sy * sp * sr + cy * cr, sy * sp * cr - cy * sr,
        -sp, cp * sr, cp * cr,
    ]
    return torch.stack(rows, dim=-1).reshape(*rpy.shape[:-1], 3, 3)


def matrix_to_rpy(R: Tensor) -> Tensor:
    """Inverse of :func:`rpy_to_matrix` (yaw set to zero at gimbal lock). ``(..., 3, 3) -> (..., 3)``."""
    sp = (-R[..., 2, 0]).clamp(-1.0, 1.0)
    pitch = torch.asin(sp)
    cp = torch.sqrt(R[..., 2, 1] ** 2 + R[..., 2, 2] ** 2)
    locked = cp < 1e-10
    roll = torch.where(locked, torch.atan2(-R[..., 1, 2], R[..., 1, 1]), torch.atan2(R[..., 2, 1], R[..., 2, 2]))
    yaw = torch.where(locked, torch.zeros_like(pitch), torch.atan2(R[..., 1, 0], R[..., 0, 0]))
    return torch.stack([roll, pitch, yaw], dim=-1)


def axis_angle_to_matrix(axis: Tensor, angle: Tensor) -> Tensor:
    """Rodrigues' formula for a unit ``axis (..., 3)`` and ``angle (...)`` in radians -> ``(..., 3, 3)``."""
    K = skew(axis)
    s = angle.sin()[..., None, None]
    c = angle.cos()[..., None, None]
    eye = torch.eye(3, dtype=K.dtype, device=K.device)
    return eye + s * K + (1 - c) * (K @ K)


@functools.cache
def _quat_matrix_table(dtype: torch.dtype, device: torch.device) -> tuple[Tensor, Tensor]:
    """``(16, 9)`` coefficients of the products ``q_i q_j`` and the constant ``(9,)`` in the entries of
    :func:`quat_to_matrix` (row-major)."""
    C = torch.zeros(4, 4, 9, dtype=torch.float64)
    x, y, z, w = range(4)
    terms = {0: [(y, y, -2), (z, z, -2)], 1: [(x, y, 2), (z, w, -2)], 2: [(x, z, 2), (y, w, 2)],
             3: [(x, y, 2), (z, w, 2)], 4: [(x, x, -2), (z, z, -2)], 5: [(y, z, 2), (x, w, -2)],
             6: [(x, z, 2), (y, w, -2)], 7: [(y, z, 2), (x, w, 2)], 8: [(x, x, -2), (y, y, -2)]}
    for k, ts in terms.items():
        for i, j, c in ts:
            C[i, j, k] += c
    one = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 0, 1], dtype=torch.float64)
    return C.reshape(16, 9).to(dtype=dtype, device=device), one.to(dtype=dtype, device=device)


def quat_to_matrix(quat: Tensor) -> Tensor:
    """Unit quaternion ``(x, y, z, w)`` to rotation matrix. ``(..., 4) -> (..., 3, 3)``.

    ``R_00 = 1 - 2 (y^2 + z^2)``, ``R_01 = 2 (x y - z w)``, ... as fixed combinations of the products
    ``q_i q_j``: three operators (an outer product, a ``16 x 9`` product, a constant) instead of
    forty, which is what a simulation step of one robot pays for (per-operator overhead)."""
    C, one = _quat_matrix_table(quat.dtype, quat.device)
    Q = (quat[..., :, None] * quat[..., None, :]).flatten(-2)
    return torch.addmm(one, Q.reshape(-1, 16), C).reshape(*quat.shape[:-1], 3, 3)


def matrix_to_quat(R: Tensor) -> Tensor:
    """Rotation matrix to unit quaternion ``(x, y, z, w)`` with ``w >= 0``. ``(..., 3, 3) -> (..., 4)``.

    Shepperd's method: picks the largest of the four candidate pivots, so it is accurate for
    every rotation.
    """
    m = R
    tr = m[..., 0, 0] + m[..., 1, 1] + m[..., 2, 2]
    cands = torch.stack([tr, m[..., 0, 0], m[..., 1, 1], m[..., 2, 2]], dim=-1)
    k = cands.argmax(dim=-1)
    # Four solutions, each well conditioned when its pivot is the largest.
    s0 = torch.sqrt((1 + tr).clamp_min(1e-30)) * 2
    q0 = torch.stack([(m[..., 2, 1] - m[..., 1, 2]) / s0, (m[..., 0, 2] - m[..., 2, 0]) / s0,
                      (m[..., 1, 0] - m[..., 0, 1]) / s0, 0.25 * s0], -1)
    s1 = torch.sqrt((1 + m[..., 0, 0] - m[..., 1, 1] - m[..., 2, 2]).clamp_min(1e-30)) * 2
    q1 = torch.stack([0.25 * s1, (m[..., 0, 1] + m[..., 1, 0]) / s1,
                      (m[..., 0, 2] + m[..., 2, 0]) / s1, (m[..., 2, 1] - m[..., 1, 2]) / s1], -1)
    s2 = torch.sqrt((1 + m[..., 1, 1] - m[..., 0, 0] - m[..., 2, 2]).clamp_min(1e-30)) * 2
    q2 = torch.stack([(m[..., 0, 1] + m[..., 1, 0]) / s2, 0.25 * s2,
                      (m[..., 1, 2] + m[..., 2, 1]) / s2, (m[..., 0, 2] - m[..., 2, 0]) / s2], -1)
    s3 = torch.sqrt((1 + m[..., 2, 2] - m[..., 0, 0] - m[..., 1, 1]).clamp_min(1e-30)) * 2
    q3 = torch.stack([(m[..., 0, 2] + m[..., 2, 0]) / s3, (m[..., 1, 2] + m[..., 2, 1]) / s3,
                      0.25 * s3, (m[..., 1, 0] - m[..., 0, 1]) / s3], -1)
    q = torch.stack([q0, q1, q2, q3], dim=-2)
    q = torch.gather(q, -2, k[..., None, None].expand(*k.shape, 1, 4)).squeeze(-2)
    return q * torch.where(q[..., 3:] < 0, -1.0, 1.0).to(q.dtype)


def quat_multiply(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product ``a * b`` of ``(x, y, z, w)`` quaternions. ``(..., 4)``."""
    av, aw = a[..., :3], a[..., 3:]
    bv, bw = b[..., :3], b[..., 3:]
    v = aw * bv + bw * av + torch.cross(av, bv, dim=-1)
    w = aw * bw - (av * bv).sum(-1, keepdim=True)
    return torch.cat([v, w], dim=-1)


def _sinc_terms(theta2: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``sin(t)/t``, ``(1-cos t)/t^2``, ``(t - sin t)/t^3`` with Taylor series near zero."""
    small = theta2 < 1e-8
    safe = torch.where(small, torch.ones_like(theta2), theta2)
    t = safe.sqrt()
    a = torch.where(small, 1 - theta2 / 6, t.sin() / t)
    b = torch.where(small, 0.5 - theta2 / 24, (1 - t.cos()) / safe)
    c = torch.where(small, 1.0 / 6 - theta2 / 120, (t - t.sin()) / (safe * t))
    return a, b, c


def so3_exp(w: Tensor) -> Tensor:
    """Rotation matrix ``exp(skew(w))`` for a rotation vector ``w (..., 3)`` (smooth at zero)."""
    a, b, _ = _sinc_terms((w * w).sum(-1))
    K = skew(w)
    eye = torch.eye(3, dtype=w.dtype, device=w.device)
    return eye + a[..., None, None] * K + b[..., None, None] * (K @ K)


def se3_exp(nu: Tensor) -> tuple[Tensor, Tensor]:
    """Exponential of a twist ``nu = (v; w) (..., 6)`` expressed in the moving frame.

    Returns the displacement ``(R (..., 3, 3), p (..., 3))`` after unit time of constant body
    twist ``nu`` (Pinocchio's ``exp6``).
    """
    v, w = nu[..., :3], nu[..., 3:]
    a, b, c = _sinc_terms((w * w).sum(-1))
    K = skew(w)
    KK = K @ K
    eye = torch.eye(3, dtype=nu.dtype, device=nu.device)
    R = eye + a[..., None, None] * K + b[..., None, None] * KK
    V = eye + b[..., None, None] * K + c[..., None, None] * KK
    return R, (V @ v[..., None])[..., 0]


def so3_log(R: Tensor) -> Tensor:
    """Rotation vector ``w`` with ``so3_exp(w) == R``, ``|w|`` in ``[0, pi]``. ``(..., 3, 3) -> (..., 3)``.

    ``w = t / sin(t) * vee(R - R^T) / 2`` with ``t = atan2(|vee(R - R^T)| / 2, (tr R - 1) / 2)``;
    a series near the identity (smooth value and gradient there), and near ``t = pi``, where
    ``sin t`` loses the axis to rounding, the axis from the symmetric part
    ``(R + R^T) / 2 - cos(t) I = (1 - cos t) a a^T``. Pinocchio's ``log3``.
    """
    c = 0.5 * (torch.diagonal(R, dim1=-2, dim2=-1).sum(-1) - 1)
    K = R - R.transpose(-1, -2)
    v = 0.5 * torch.stack([K[..., 2, 1], K[..., 0, 2], K[..., 1, 0]], -1)
    s2 = (v * v).sum(-1)
    near_id = s2 < 1e-10
    s = torch.where(near_id, torch.ones_like(s2), s2).sqrt()
    pos = s2 > 0  # the exact sin(t), with a finite gradient at 0 (exactly the identity or pi)
    t = torch.atan2(torch.where(pos, torch.where(pos, s2, torch.ones_like(s2)).sqrt(), torch.zeros_like(s2)), c)
    regular = torch.where(near_id, 1 + s2 / 6 + 0.075 * s2 * s2, t / s)[..., None] * v
    near_pi = (c < 0) & (s2 < 1e-2)
    if not torch.compiler.is_compiling() and not bool(near_pi.any()):
        return regular
    # near pi: the column of the symmetric part with the largest diagonal, signed like v
    eye = torch.eye(3, dtype=R.dtype, device=R.device)
    Bs = 0.5 * (R + R.transpose(-1, -2)) - c[..., None, None] * eye
    i = torch.diagonal(Bs, dim1=-2, dim2=-1).argmax(-1)
    col = torch.gather(Bs, -1, i[..., None, None].expand(*i.shape, 3, 1))[..., 0]
    axis = col / col.norm(dim=-1, keepdim=True).clamp_min(1e-30)
    axis = torch.where((axis * v).sum(-1, keepdim=True) < 0, -axis, axis)
    return torch.where(near_pi[..., None], t[..., None] * axis, regular)


def _jlog_coeff(w: Tensor) -> Tensor:
    """``1/t^2 - (1 + cos t) / (2 t sin t)`` for ``t = |w|`` (series near zero; finite up to pi)."""
    t2 = (w * w).sum(-1)
    small = t2 < 1e-6
    safe = torch.where(small, torch.ones_like(t2), t2)
    t = safe.sqrt()
    half = 0.5 * t
    # (1 + cos t) / sin t = cot(t/2): finite at t = pi, where sin t vanishes
    big = 1 / safe - torch.cos(half) / (torch.sin(half) * 2 * t)
    return torch.where(small, 1.0 / 12 + t2 / 720 + t2 * t2 / 30240, big)


def so3_jlog(w: Tensor) -> Tensor:
    """Inverse right Jacobian of SO(3) at the rotation vector ``w (..., 3)``, ``(..., 3, 3)``.

    ``so3_log(so3_exp(w) @ so3_exp(d)) = w + so3_jlog(w) @ d + O(|d|^2)``: how the logarithm of a
    rotation moves when the rotation is perturbed on the right by a small rotation vector ``d``
    (Pinocchio's ``Jlog3``). Equals ``I + [w]/2 + c(|w|) [w]^2``; its transpose is the inverse left
    Jacobian, ``I - [w]/2 + c [w]^2``. Valid for ``|w| < 2 pi`` (singular at ``2 pi``).
    """
    K = skew(w)
    eye = torch.eye(3, dtype=w.dtype, device=w.device)
    return eye + 0.5 * K + _jlog_coeff(w)[..., None, None] * (K @ K)


def se3_log(R: Tensor, p: Tensor) -> Tensor:
    """Twist ``nu = (v; w) (..., 6)`` with ``se3_exp(nu) == (R, p)``: the inverse of :func:`se3_exp`.

    ``w = so3_log(R)`` and ``v = V(w)^-1 p`` with ``V`` the left Jacobian of SO(3)
    (Pinocchio's ``log6``, linear part first).

    Args:
        R: (..., 3, 3) rotation.
        p: (..., 3) translation.
    """
    w = so3_log(R)
    K = skew(w)
    eye = torch.eye(3, dtype=R.dtype, device=R.device)
    V_inv = eye - 0.5 * K + _jlog_coeff(w)[..., None, None] * (K @ K)
    return torch.cat([(V_inv @ p[..., None])[..., 0], w], dim=-1)


def se3_log_matrix(T: Tensor) -> Tensor:
    """:func:`se3_log` of a homogeneous transform: ``T (..., 4, 4) -> nu = (v; w) (..., 6)``."""
    return se3_log(T[..., :3, :3], T[..., :3, 3])


def pose_error(T: Tensor, T_target: Tensor, *, frame: str = "local") -> Tensor:
    """The SE(3) error that takes pose ``T`` to ``T_target``, ``(..., 6)`` as ``(linear; angular)``.

    ``frame="local"`` (default): the twist ``log(T^-1 T_target)`` in the axes and at the origin of
    ``T`` -- Pinocchio's ``log6(T.actInv(T_target))``; ``se3_exp`` of it, applied on the right of
    ``T``, gives ``T_target``. ``frame="split"``: the world-frame position difference
    ``p_target - p`` and the world-frame rotation vector ``so3_log(R_target R^T)`` (what inverse
    kinematics drives to zero; not a twist, but each half has the units one expects, m and rad).
    Both vanish exactly when the poses are equal and are differentiable w.r.t. both poses.

    Args:
        T: (..., 4, 4) current pose(s).
        T_target: (..., 4, 4) desired pose(s); broadcasts against ``T``.
        frame: ``"local"`` or ``"split"``.
    """
    R, p = T[..., :3, :3], T[..., :3, 3]
    Rt, pt = T_target[..., :3, :3], T_target[..., :3, 3]
    if frame == "local":
        RT = R.transpose(-1, -2)
        return se3_log(RT @ Rt, (RT @ (pt - p)[..., None])[..., 0])
    if frame == "split":
        return torch.cat([pt - p, so3_log(Rt @ R.transpose(-1, -2))], dim=-1)
    raise OptionError(f"pose_error: unknown frame {frame!r}; choose from ('local', 'split')")


def homogeneous(R: Tensor, p: Tensor) -> Tensor:
    """Stack ``R (..., 3, 3)`` and ``p (..., 3)`` into ``(..., 4, 4)``."""
    top = torch.cat([R, p[..., None]], dim=-1)
    bottom = torch.zeros(*top.shape[:-2], 1, 4, dtype=R.dtype, device=R.device)
    bottom[..., 0, 3] = 1
    return torch.cat([top, bottom], dim=-2)


def motion_action(R: Tensor, p: Tensor) -> Tensor:
    """6x6 matrix mapping motion vectors from frame B to frame A for the placement ``(R, p)`` of B in A.

    ``[[R, skew(p) R], [0, R]]`` in (linear; angular) order. The force map is its inverse transpose.
    """
    top = torch.cat([R, skew(p) @ R], dim=-1)
    bottom = torch.cat([torch.zeros_like(R), R], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def motion_action_inverse(R: Tensor, p: Tensor) -> Tensor:
    """Inverse of :func:`motion_action`: ``[[R^T, -R^T skew(p)], [0, R^T]]``."""
    Rt = R.transpose(-1, -2)
    top = torch.cat([Rt, -Rt @ skew(p)], dim=-1)
    bottom = torch.cat([torch.zeros_like(R), Rt], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def motion_cross(v: Tensor, m: Tensor) -> Tensor:
    """Spatial cross product of motions ``v x m``, both ``(..., 6)`` in (linear; angular) order."""
    vl, va = v[..., :3], v[..., 3:]
    ml, ma = m[..., :3], m[..., 3:]
    lin = torch.linalg.cross(va, ml) + torch.linalg.cross(vl, ma)
    return torch.cat([lin, torch.linalg.cross(va, ma)], dim=-1)


def force_cross(v: Tensor, f: Tensor) -> Tensor:
    """Spatial cross product of a motion with a force ``v x* f`` (``(..., 6)`` each)."""
    vl, va = v[..., :3], v[..., 3:]
    fl, fa = f[..., :3], f[..., 3:]
    ang = torch.linalg.cross(va, fa) + torch.linalg.cross(vl, fl)
    return torch.cat([torch.linalg.cross(va, fl), ang], dim=-1)


def spatial_inertia(mass: Tensor, com: Tensor, inertia_com: Tensor) -> Tensor:
    """6x6 spatial inertia at a frame's origin, (linear; angular) order.

    Args:
        mass: (...) mass in kg.
        com: (..., 3) centre of mass in the frame, m.
        inertia_com: (..., 3, 3) rotational inertia about the centre of mass, axes of the frame, kg m^2.

    Returns:
        (..., 6, 6) ``[[m 1, -m [c]], [m [c], I_c - m [c]^2]]``.
    """
    m = mass[..., None, None]
    C = skew(com)
    eye = torch.eye(3, dtype=com.dtype, device=com.device)
    top = torch.cat([m * eye.expand_as(C), -m * C], dim=-1)
    bottom = torch.cat([m * C, inertia_com - m * (C @ C)], dim=-1)
    return torch.cat([top, bottom], dim=-2)
