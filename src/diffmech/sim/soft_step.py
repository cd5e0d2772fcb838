"""One time step of a :class:`~diffmech.sim.Scene` built with ``solver="mujoco"``, as MuJoCo's ``mj_step``.

Each forward evaluation (one per step with ``Euler`` and ``implicitfast``, four with ``RK4``) does what
``mj_forward`` does for the rigid-body part of a scene:

1. the joint-space mass matrix ``M`` (diffmech's CRBA plus ``diag(armature)``) and the smooth force
   ``qfrc_smooth = tau + passive - bias``: springs ``-k (q - springref)`` and dampers ``-b v``
   (``passive``), Coriolis, centrifugal and gravity forces by diffmech's RNEA (``bias``);
2. the geoms' world poses from forward kinematics and their contacts
   (:func:`diffmech.contact.soft_collide.collide`), the Jacobians of each contact point (the
   velocity of geom2's body relative to geom1's, world axes, translation and rotation);
3. the constraint rows of the contacts, the joint limits and the dofs' friction loss, with
   MuJoCo's impedance from ``solref`` / ``solimp`` (:mod:`diffmech.contact.soft_constraints`), and
   the constrained acceleration ``qacc`` by the primal Newton method
   (:func:`diffmech.contact.soft_solver.solve`).

The step then integrates as ``mj_step``'s integrator does: ``Euler`` (semi-implicit: ``v1 = v +
h qacc``, ``q1 = q (+) h v1``, with the dampers implicit through ``M + h diag(damping)`` unless the
file disables ``eulerdamp``); ``RK4`` (MuJoCo's tableau; the positions of each stage moved by
``mj_integratePos``, a floating base's orientation from the stages' angular velocities mapped into
the tangent space at the step's start by ``dexp^-1``, as MuJoCo 4 does); ``implicitfast`` (the
same linear solve as Euler's implicit damping: exact for motor actuators, whose forces do not
depend on the velocity).

Coordinates. Inside the step the velocity is MuJoCo's ``qvel``: a floating base's linear velocity in
the world frame and its angular velocity in the body frame, its orientation advanced by the
quaternion exponential ``quat * exp(h w / 2)``. The scene's state (in and out) is diffmech's, whose
base linear velocity is in the body frame (:func:`diffmech.model.mjcf.mjcf_state_to_diffmech`): the
step converts at entry and exit. The mass matrix, the bias and the Jacobians are diffmech's, mapped
into MuJoCo's coordinates by ``qvel = T(q) v`` (``T`` rotates the base's linear part into the world):
``M_mj = T M T^T``, ``J_mj = J T^T``, ``bias_mj = T bias - M_mj c`` with ``c = w x v_lin`` (world
axes), the acceleration of the base origin that a body-frame constant velocity has.

Everything is torch, differentiable by autograd; the solver's Newton iterations run without a graph
and its result is differentiated implicitly at the solution (see :mod:`diffmech.contact.soft_solver`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..dynamics import kernels
from ..dynamics.kinematics import poses_and_world_jacobians
from ..errors import ModelError, SimulationError

__all__ = ["MujocoOptions", "options_from_mjmodel", "default_options", "soft_step", "ROUTE", "INTEGRATORS"]

ROUTE = "torch: mujoco solver"
INTEGRATORS = ("euler", "rk4", "implicit", "implicitfast")
_INTEGRATOR_NAMES = {0: "euler", 1: "rk4", 2: "implicit", 3: "implicitfast"}
_DSBL_CONSTRAINT, _DSBL_EQUALITY, _DSBL_FRICTIONLOSS, _DSBL_LIMIT, _DSBL_CONTACT = 1, 2, 4, 8, 16
_DSBL_EULERDAMP = 1 << 15  # mjDSBL_EULERDAMP
_DSBL_WARMSTART, _DSBL_REFSAFE = 1 << 9, 1 << 12  # mjDSBL_WARMSTART, mjDSBL_REFSAFE
_DEFAULT_SOLREF = (0.02, 1.0)
_DEFAULT_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)
_RK4_A = ((0.5,), (0.0, 0.5), (0.0, 0.0, 1.0))
_RK4_B = (1.0 / 6.0, 1.0 / 3.0, 1.0 / 3.0, 1.0 / 6.0)


@dataclass
class MujocoOptions:
    """What a ``solver="mujoco"`` scene's step needs of MuJoCo's compiled model (``scene.mujoco``).

    Per-dof arrays are in the scene's ``v`` order (``(nv,)``), per-limit arrays have one row per
    limited hinge or slide joint (``(L, ...)``). Units: s, N s/m or N m s/rad (damping), kg or kg m^2
    (armature), N or N m (friction loss).

    Attributes:
        timestep: ``<option timestep>`` (s), the ``dt`` the file was made for.
        integrator: ``"euler"``, ``"rk4"``, ``"implicit"`` or ``"implicitfast"``.
        cone: ``"pyramidal"`` or ``"elliptic"``. impratio: friction-to-normal impedance ratio.
        tolerance, iterations: the Newton solver's stopping rule; meaninertia: MuJoCo's
            ``stat.meaninertia`` (the mean diagonal of ``M`` at ``qpos0``), which scales the rule.
        disableflags: MuJoCo's ``opt.disableflags`` bits.
        damping: every dof's damping (for Euler's implicit damping). damping_extra: the part of it
            the models' joints do not hold (applied here as ``-damping_extra * qvel``; the models'
            own joint damping is in their passive forces).
        armature, frictionloss, invweight0: per dof (``dof_armature``, ``dof_frictionloss``,
            ``dof_invweight0``). solreffriction ``(nv, 2)``, solimpfriction ``(nv, 5)``.
        stiffness, springref: drive springs not held by the models (``(nv,)``, code-built scenes'
            ``drives``), force ``stiffness * (springref - q)`` on joint dofs.
        limit_dof, limit_q: ``(L,)`` the limited joints' indices in ``v`` and ``q``.
        limit_range, limit_solref, limit_solimp, limit_margin: per limited joint, ``(L, 2)`` (rad or
            m), ``(L, 2)``, ``(L, 5)`` and ``(L,)``.
        geoms: the collision geoms (:class:`diffmech.contact.soft_geoms.GeomTable`), None until built.
        fluid: the file's fluid forces (:class:`diffmech.sim.soft_fluid.InertiaBoxFluid`) or None.
    """

    timestep: float = 0.002
    integrator: str = "euler"
    cone: str = "pyramidal"
    impratio: float = 1.0
    tolerance: float = 1e-8
    iterations: int = 100
    disableflags: int = 0
    damping: np.ndarray = field(default_factory=lambda: np.zeros(0))
    damping_extra: np.ndarray = field(default_factory=lambda: np.zeros(0))
    armature: np.ndarray = field(default_factory=lambda: np.zeros(0))
    frictionloss: np.ndarray = field(default_factory=lambda: np.zeros(0))
    invweight0: np.ndarray = field(default_factory=lambda: np.zeros(0))
    solreffriction: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    solimpfriction: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))
    stiffness: np.ndarray = field(default_factory=lambda: np.zeros(0))
    springref: np.ndarray = field(default_factory=lambda: np.zeros(0))
    limit_dof: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    limit_q: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    limit_range: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    limit_solref: np.ndarray = field(default_factory=lambda: np.zeros((0, 2)))
    limit_solimp: np.ndarray = field(default_factory=lambda: np.zeros((0, 5)))
    limit_margin: np.ndarray = field(default_factory=lambda: np.zeros(0))
    meaninertia: float = 1.0
    solver: str = "newton"  # <option solver>: "newton", "cg" (solved by Newton: the same minimiser) or "pgs"
    geoms: object = None
    fluid: object = None
    _tensors: dict = field(default_factory=dict, repr=False)

    def tensors(self, dtype: torch.dtype, device) -> dict[str, Tensor]:
        """The arrays as tensors of ``dtype`` on ``device`` (kept per dtype and device)."""
        key = (dtype, str(device))
        got = self._tensors.get(key)
        if got is None:
            names = ("damping", "damping_extra", "armature", "frictionloss", "invweight0", "solreffriction",
                     "solimpfriction", "stiffness", "springref", "limit_range", "limit_solref", "limit_solimp",
                     "limit_margin")
            got = {n: torch.as_tensor(np.asarray(getattr(self, n), dtype=np.float64), dtype=dtype, device=device)
                   for n in names}
            got["limit_dof"] = torch.as_tensor(self.limit_dof, dtype=torch.long, device=device)
            got["limit_q"] = torch.as_tensor(self.limit_q, dtype=torch.long, device=device)
            self._tensors[key] = got
        return got


def _check_integrator(name: str, where: str) -> str:
    if name not in INTEGRATORS:
        raise ModelError(f"{where}: integrator {name!r} is not one diffmech's mujoco solver has ({INTEGRATORS})")
    if name == "implicit":
        raise ModelError(f"{where}: the 'implicit' integrator (with the Coriolis terms' velocity derivative) is not "
                         "supported by the mujoco solver; use Euler, RK4 or implicitfast")
    return name


def options_from_mjmodel(m, scene, src: str = "<mjcf>") -> MujocoOptions:
    """:class:`MujocoOptions` of a compiled ``mujoco.MjModel`` ``m`` for ``scene`` (built from it by
    :meth:`~diffmech.sim.Scene.from_mjcf`): the options and the per-dof and per-limit constants,
    reordered into the scene's ``q`` / ``v``.

    Raises:
        ModelError: what the step does not reproduce: the ``implicit`` integrator, a spring on a free
            joint (ball joints are refused by the step itself, see :func:`soft_step`).
    """
    from ..model.mjcf import _index

    qi, vi = _index(scene)
    opt = m.opt
    integ = _check_integrator(_INTEGRATOR_NAMES.get(int(opt.integrator), str(opt.integrator)), src)
    solver = {0: "pgs", 1: "cg"}.get(int(opt.solver), "newton")  # mjSOL_PGS 0, mjSOL_CG 1, mjSOL_NEWTON 2
    if solver == "cg":
        warn(f"{src}: <option solver=\"CG\">: solved by Newton's method, which reaches the same minimiser of "
             "the strictly convex cost; trajectories agree with mj_step's to about the tolerance")
    cone = "pyramidal" if int(opt.cone) == 0 else "elliptic"
    flags = int(opt.disableflags)
    vi_a = np.asarray(vi, dtype=np.int64)
    damping = np.asarray(m.dof_damping, dtype=np.float64)[vi_a]
    if flags & (1 << 6):  # mjDSBL_DAMPER
        damping = np.zeros_like(damping)
    frictionloss = np.asarray(m.dof_frictionloss, dtype=np.float64)[vi_a]
    limit_dof, limit_q, rng, sref, simp, marg = [], [], [], [], [], []
    for j in range(m.njnt):
        t = int(m.jnt_type[j])
        if t == 0 and m.jnt_stiffness[j] != 0 and not flags & (1 << 5):
            raise ModelError(f"{src}: free joint {j} has a spring (stiffness {float(m.jnt_stiffness[j]):g}); the "
                             "mujoco solver does not have free-joint springs")
        if not m.jnt_limited[j] or t in (0, 1):  # free: no limit; ball: the step refuses ball joints
            continue
        limit_dof.append(vi.index(int(m.jnt_dofadr[j])))
        limit_q.append(qi.index(int(m.jnt_qposadr[j])))
        rng.append(np.asarray(m.jnt_range[j], dtype=np.float64))
        sref.append(np.asarray(m.jnt_solref[j], dtype=np.float64))
        simp.append(np.asarray(m.jnt_solimp[j], dtype=np.float64))
        marg.append(float(m.jnt_margin[j]))
    nv = len(vi)
    return MujocoOptions(
        timestep=float(opt.timestep), integrator=integ, cone=cone, impratio=float(opt.impratio),
        tolerance=float(opt.tolerance), iterations=int(opt.iterations), disableflags=flags,
        meaninertia=float(m.stat.meaninertia), solver=solver,
        damping=damping, damping_extra=damping.copy(),  # the scene's models hold no damping (scene=True)
        armature=np.asarray(m.dof_armature, dtype=np.float64)[vi_a], frictionloss=frictionloss,
        invweight0=np.asarray(m.dof_invweight0, dtype=np.float64)[vi_a],
        solreffriction=np.asarray(m.dof_solref, dtype=np.float64)[vi_a].reshape(nv, 2),
        solimpfriction=np.asarray(m.dof_solimp, dtype=np.float64)[vi_a].reshape(nv, 5),
        stiffness=np.zeros(nv), springref=np.zeros(nv),
        limit_dof=np.asarray(limit_dof, dtype=np.int64), limit_q=np.asarray(limit_q, dtype=np.int64),
        limit_range=np.asarray(rng, dtype=np.float64).reshape(-1, 2),
        limit_solref=np.asarray(sref, dtype=np.float64).reshape(-1, 2),
        limit_solimp=np.asarray(simp, dtype=np.float64).reshape(-1, 5),
        limit_margin=np.asarray(marg, dtype=np.float64))


def default_options(scene) -> MujocoOptions:
    """:class:`MujocoOptions` of a scene built in code with ``solver="mujoco"``: MuJoCo's defaults
    (Euler, pyramidal cones, ``solref (0.02, 1)``, ``solimp (0.9, 0.95, 0.001, 0.5, 2)``, tolerance
    ``1e-8``, 100 iterations); damping, armature and springs from the scene's ``drives`` and the
    models' joints; joint limits (with ``Scene(limits=True)``) from the models' finite position
    limits; no friction loss; ``dof_invweight0`` as MuJoCo's compiler computes it, from the mass
    matrix at the neutral configuration."""
    nv = scene.nv
    damping, extra, arm = np.zeros(nv), np.zeros(nv), np.zeros(nv)
    kp, ref = np.zeros(nv), np.zeros(nv)
    limit_dof, limit_q, rng = [], [], []
    invw = np.zeros(nv)
    trace = 0.0
    for n in scene.names:
        m = scene.models[n]
        if n in scene.static:
            continue
        if m.tree.n_ball:  # the step refuses it (see _Layout); nothing to read here
            continue
        sv, sq = scene.vslices[n], scene.slices[n]
        off_v, off_q = (6, 7) if m.floating_base else (0, 0)
        nj = m.nv - off_v
        with torch.no_grad():
            mt = m.model_tensors()
            damping[sv.start + off_v:sv.stop] = mt.damping.detach().cpu().double().numpy()[:nj]
            if n in scene.drives:
                k, d, r, a = (t.detach().cpu().double().numpy() for t in scene.drives[n])
                damping[sv.start + off_v:sv.stop] += d
                extra[sv.start + off_v:sv.stop] = d
                arm[sv.start + off_v:sv.stop] = a
                kp[sv.start + off_v:sv.stop] = k
                ref[sv.start + off_v:sv.stop] = r
            if scene.limits:
                lim = m.joint_limits()
                lo, hi = lim["lower"].detach().cpu().double().numpy(), lim["upper"].detach().cpu().double().numpy()
                for j in range(nj):
                    if math.isfinite(lo[j]) and math.isfinite(hi[j]):
                        limit_dof.append(sv.start + off_v + j)
                        limit_q.append(sq.start + off_q + j)
                        rng.append((lo[j], hi[j]))
            q0 = m.neutral_configuration()
            M = m.mass_matrix(q0).double().cpu().numpy() + np.diag(arm[sv])
            Minv = np.linalg.inv(M)
            trace += float(np.trace(M))
            d = np.diag(Minv).copy()
            if m.floating_base:  # MuJoCo averages a free joint's three translational and three rotational dofs
                d[:3], d[3:6] = d[:3].mean(), d[3:6].mean()
            invw[sv] = d
    L = len(limit_dof)
    opts = MujocoOptions(
        damping=damping, damping_extra=extra, armature=arm, frictionloss=np.zeros(nv), invweight0=invw,
        solreffriction=np.tile(_DEFAULT_SOLREF, (nv, 1)), solimpfriction=np.tile(_DEFAULT_SOLIMP, (nv, 1)),
        stiffness=kp, springref=ref, limit_dof=np.asarray(limit_dof, dtype=np.int64),
        limit_q=np.asarray(limit_q, dtype=np.int64), limit_range=np.asarray(rng, dtype=np.float64).reshape(L, 2),
        limit_solref=np.tile(_DEFAULT_SOLREF, (L, 1)), limit_solimp=np.tile(_DEFAULT_SOLIMP, (L, 1)),
        limit_margin=np.zeros(L), meaninertia=trace / max(1, nv))
    return opts


# ------------------------------------------------------------------ coordinates
class _Layout:
    """Where each moving model's coordinates are, and its floating base if any."""

    def __init__(self, scene):
        self.parts = []  # (name, q slice, v slice)
        self.bases = []  # (q start of the quaternion (x, y, z, w), v start of the base)
        for n in scene.names:
            if n in scene.static:
                continue
            m = scene.models[n]
            if m.tree.n_ball:
                raise ModelError(f"Scene(solver='mujoco'): model {n!r} has ball joints, which the mujoco solver "
                                 "does not have; build the scene with solver='pgs'")
            self.parts.append((n, scene.slices[n], scene.vslices[n]))
            if m.floating_base:
                self.bases.append((scene.slices[n].start + 3, scene.vslices[n].start))


def _layout(scene) -> _Layout:
    got = scene.__dict__.get("_soft_layout")
    if got is None:
        got = scene.__dict__["_soft_layout"] = _Layout(scene)
    return got


def _quat_matrix(quat: Tensor) -> Tensor:
    """Rotation matrices ``(..., 3, 3)`` of quaternions ``(..., 4)`` in ``(x, y, z, w)`` order,
    normalised first (MuJoCo normalises before use)."""
    quat = quat / quat.norm(dim=-1, keepdim=True)
    x, y, z, w = quat.unbind(-1)
    return torch.stack([
        1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y),
        2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x),
        2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)], -1).reshape(*quat.shape[:-1], 3, 3)


def _base_rotations(lay: _Layout, q: Tensor) -> list[Tensor]:
    """The floating bases' orientations ``(B, 3, 3)`` at ``q``; the last ``q``'s are kept (a forward
    evaluation rotates many quantities at one configuration)."""
    last = lay.__dict__.get("last_R")
    if last is not None and last[0] is q and last[1] == q._version:  # the same tensor, not written since
        return last[2]
    Rs = [_quat_matrix(q[:, iq:iq + 4]) for iq, _ in lay.bases]
    lay.__dict__["last_R"] = (q, q._version, Rs)
    return Rs


def _rotate_bases(lay: _Layout, q: Tensor, x: Tensor, inverse: bool, dim: int = -1) -> Tensor:
    """``x`` with each floating base's linear block (3 entries at the base's ``v`` start along
    ``dim``) multiplied by ``R`` (``inverse``: ``R^T``), ``R`` the base orientation of ``q (B, nq)``.
    ``x`` is ``(B, nv)`` (``dim=-1``) or ``(B, nv, n)`` (``dim=-2``: rows)."""
    if not lay.bases:
        return x
    parts, at = [], 0
    for (_, iv), R in zip(lay.bases, _base_rotations(lay, q)):
        Rm = R.transpose(-1, -2) if inverse else R
        if dim == -1:
            parts += [x[:, at:iv], (Rm @ x[:, iv:iv + 3, None])[..., 0]]
        else:
            parts += [x[:, at:iv], Rm @ x[:, iv:iv + 3]]
        at = iv + 3
    parts.append(x[:, at:] if dim == -1 else x[:, at:])
    return torch.cat(parts, 1)


def _quat_step(quat: Tensor, w: Tensor, h: float) -> Tensor:
    """MuJoCo's ``mju_quatIntegrate``: ``normalize(quat) * exp(h w / 2)`` for quaternions ``(B, 4)``
    in ``(x, y, z, w)`` order and body-frame angular velocities ``w (B, 3)``; the exponential's
    series near ``w = 0`` keeps the gradient finite there."""
    quat = quat / quat.norm(dim=-1, keepdim=True)
    u = w * h
    t2 = (u * u).sum(-1, keepdim=True)
    small = t2 < 1e-12
    t = torch.where(small, torch.ones_like(t2), t2).sqrt()
    s = torch.where(small, 0.5 - t2 / 48.0, torch.sin(0.5 * t) / t)  # sin(t/2) / t
    c = torch.where(small, 1.0 - t2 / 8.0, torch.cos(0.5 * t))
    r, rw = u * s, c
    p, pw = quat[:, :3], quat[:, 3:]
    xyz = pw * r + rw * p + torch.linalg.cross(p, r, dim=-1)
    ww = pw * rw - (p * r).sum(-1, keepdim=True)
    return torch.cat([xyz, ww], -1)


def _integrate_pos(lay: _Layout, q: Tensor, qvel: Tensor, h: float) -> Tensor:
    """MuJoCo's ``mj_integratePos`` on diffmech's ``q (B, nq)`` with MuJoCo's ``qvel (B, nv)``: a
    floating base's position by ``h`` times its world-frame velocity, its orientation by
    :func:`_quat_step`; joints ``q + h qvel``."""
    if not lay.bases:
        return _joint_add(lay, q, qvel, h)
    out = _joint_add(lay, q, qvel, h)
    parts, at = [], 0
    for iq, iv in lay.bases:
        pos = q[:, iq - 3:iq] + h * qvel[:, iv:iv + 3]
        quat = _quat_step(q[:, iq:iq + 4], qvel[:, iv + 3:iv + 6], h)
        parts += [out[:, at:iq - 3], pos, quat]
        at = iq + 4
    parts.append(out[:, at:])
    return torch.cat(parts, 1)


def _joint_maps(lay: _Layout, device) -> tuple[Tensor, Tensor]:
    """Indices ``(q, v)`` of every joint coordinate of the scene (floating bases left out), long."""
    idx = lay.__dict__.get("joint_index")
    if idx is None:
        qs, vs = [], []
        for _, sq, sv in lay.parts:
            base = any(iq == sq.start + 3 for iq, _ in lay.bases)
            oq, ov = (7, 6) if base else (0, 0)
            qs += list(range(sq.start + oq, sq.stop))
            vs += list(range(sv.start + ov, sv.stop))
        idx = lay.__dict__["joint_index"] = (torch.tensor(qs, dtype=torch.long), torch.tensor(vs, dtype=torch.long))
    return idx[0].to(device), idx[1].to(device)


def _joint_add(lay: _Layout, q: Tensor, qvel: Tensor, h: float) -> Tensor:
    """``q`` with every joint coordinate moved by ``h qvel`` (floating bases left as they are)."""
    qi, vi = _joint_maps(lay, q.device)
    if qi.numel() == 0:
        return q
    return q.index_add(1, qi, h * qvel.index_select(1, vi))


def _tangent(lay: _Layout, qvel: Tensor, theta: Tensor) -> Tensor:
    """``qvel (B, nv)`` with each floating base's body-frame angular velocity ``w`` replaced by the
    rate of the rotation vector ``Theta`` (the base's rotation since the step's start, ``theta``'s
    angular block) that turns at ``w``: ``dexp^-1``, ``w + Theta x w / 2 + k Theta x (Theta x w)``
    with ``k = (1 - (t / 2) cot(t / 2)) / t^2``, ``t = |Theta|``; what MuJoCo's RK4 combines the stages'
    orientations with (translations and joints are vectors: unchanged)."""
    if not lay.bases:
        return qvel
    parts, at = [], 0
    for _, iv in lay.bases:
        T, w = theta[:, iv + 3:iv + 6], qvel[:, iv + 3:iv + 6]
        t2 = (T * T).sum(-1, keepdim=True)
        small = t2 < 1e-8
        t = torch.where(small, torch.ones_like(t2), t2).sqrt()
        t2s = torch.where(small, torch.ones_like(t2), t2)
        k = torch.where(small, 1.0 / 12.0 + t2 / 720.0, (1.0 - 0.5 * t / torch.tan(0.5 * t)) / t2s)
        Txw = torch.linalg.cross(T, w, dim=-1)
        parts += [qvel[:, at:iv + 3], w + 0.5 * Txw + k * torch.linalg.cross(T, Txw, dim=-1)]
        at = iv + 6
    parts.append(qvel[:, at:])
    return torch.cat(parts, 1)


def _base_coriolis(lay: _Layout, q: Tensor, qvel: Tensor) -> Tensor:
    """``c (B, nv)``: on each floating base's linear rows ``w x v_lin`` (world axes: ``R w_body``
    crossed with the world-frame ``v_lin``), zero elsewhere; ``qacc = T a + c`` maps diffmech's
    acceleration ``a`` to MuJoCo's."""
    c = torch.zeros_like(qvel)
    for (_, iv), R in zip(lay.bases, _base_rotations(lay, q)):
        ww = (R @ qvel[:, iv + 3:iv + 6, None])[..., 0]
        c = c.index_copy(1, torch.arange(iv, iv + 3, device=q.device),
                         torch.linalg.cross(ww, qvel[:, iv:iv + 3], dim=-1))
    return c


# ------------------------------------------------------------------ one forward evaluation
def _mass_and_bias(scene, lay: _Layout, q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Block-diagonal rigid-body mass matrix ``(B, nv, nv)`` and bias ``C v + g - springs - model
    damping`` ``(B, nv)`` in diffmech's coordinates (static models: no block)."""
    B, nv = q.shape[0], scene.nv
    blocks, hs = [], []
    for n, sq, sv in lay.parts:
        m = scene.models[n]
        blocks.append((sv, m.mass_matrix(q[:, sq])))
        hs.append((sv, m.bias_forces(q[:, sq], v[:, sv])))
    if len(blocks) == 1 and blocks[0][0].start == 0 and blocks[0][0].stop == nv:
        return blocks[0][1], hs[0][1]
    M = q.new_zeros(B, nv, nv)
    h = q.new_zeros(B, nv)
    for (sv, Mb), (_, hb) in zip(blocks, hs):
        M = _place(M, Mb, sv)
        h = torch.cat([h[:, :sv.start], hb, h[:, sv.stop:]], 1)
    return M, h


def _place(M: Tensor, Mb: Tensor, sv: slice) -> Tensor:
    """``M`` with its diagonal block ``sv`` replaced by ``Mb`` (out of place, differentiable)."""
    nv = M.shape[-1]
    return M + torch.nn.functional.pad(Mb, (sv.start, nv - sv.stop, sv.start, nv - sv.stop))


def _geom_plan(scene, table, dtype: torch.dtype, device) -> dict:
    """How the table's geoms are placed, kept on the table per dtype and device: per moving model
    its links, its geoms, their links' indices among the model's links (``li``) and among the
    links asked of it (``pi``) and their poses in the link frames; the world geoms' poses; the
    permutation from that grouped order back to the table's (None when it is the table's)."""
    cache = table.__dict__.setdefault("_soft_cache", {})
    key = (dtype, str(device))
    plan = cache.get(key)
    if plan is not None:
        return plan
    pose = torch.as_tensor(np.asarray(table.pose, dtype=np.float64), dtype=dtype, device=device)  # (G, 4, 4)
    G = pose.shape[0]
    by_model: dict[str, list[int]] = {}
    for g in range(G):
        if table.model[g] is not None:
            by_model.setdefault(table.model[g], []).append(g)
    groups, order = [], []
    for n, gs in by_model.items():
        m = scene.models[n]
        links = list(dict.fromkeys(table.link[g] for g in gs))
        li = torch.tensor([m.link_names.index(table.link[g]) for g in gs], dtype=torch.long, device=device)
        pi = torch.tensor([links.index(table.link[g]) for g in gs], dtype=torch.long, device=device)
        groups.append((n, links, li, pi, pose[gs]))
        order += gs
    world = [g for g in range(G) if table.model[g] is None]
    order += world
    inv = None if order == list(range(G)) else torch.as_tensor(np.argsort(order), dtype=torch.long, device=device)
    plan = {"groups": groups, "world": pose[world] if world else None, "inv": inv,
            "invweight": torch.as_tensor(np.asarray(table.invweight, dtype=np.float64), dtype=dtype, device=device)}
    cache[key] = plan
    return plan


def _geom_kinematics(scene, lay: _Layout, table, q: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """World poses of the table's geoms, ``pos (B, G, 3)``, ``rot (B, G, 3, 3)``, and the spatial
    Jacobians of their bodies ``(B, G, 6, nv)`` (rows: linear velocity of the point at the world
    origin, then angular velocity, world axes; diffmech's ``v`` coordinates; zero for world geoms)."""
    B, nv = q.shape[0], scene.nv
    plan = _geom_plan(scene, table, q.dtype, q.device)
    Ts, Js = [], []
    for n, links, li, pi, pose in plan["groups"]:  # one kinematics pass per model serves all its geoms
        m = scene.models[n]
        T_all, J_l = poses_and_world_jacobians(m, q[:, scene.slices[n]], links)
        sv = scene.vslices[n]
        Ts.append(T_all.index_select(1, li) @ pose)
        Js.append(torch.nn.functional.pad(J_l, (sv.start, nv - sv.stop)).index_select(1, pi))
    if plan["world"] is not None:
        w = plan["world"]
        Ts.append(w.expand(B, *w.shape))
        Js.append(q.new_zeros(B, w.shape[0], 6, nv))
    T = Ts[0] if len(Ts) == 1 else torch.cat(Ts, 1)
    J = Js[0] if len(Js) == 1 else torch.cat(Js, 1)
    if plan["inv"] is not None:
        T, J = T.index_select(1, plan["inv"]), J.index_select(1, plan["inv"])
    return T[..., :3, 3], T[..., :3, :3], J


def _soft_modules():
    try:
        from ..contact import soft_collide, soft_constraints, soft_solver
    except ImportError as e:  # the modules of the constraint rows, the solver and the collisions
        raise ModelError(f"Scene(solver='mujoco'): {e}; the mujoco solver needs diffmech.contact.soft_constraints, "
                         "soft_solver and soft_collide") from None
    return soft_collide, soft_constraints, soft_solver


def _geom_table(scene):
    opts = scene.mujoco
    if opts.geoms is None:
        from ..contact.soft_geoms import geom_table_default

        opts.geoms = geom_table_default(scene)
    return opts.geoms


def _forward(scene, lay: _Layout, q: Tensor, qvel: Tensor, tau_mj: Tensor, dt: float,
             warmstart: Tensor | None = None) -> dict:
    """One forward evaluation at ``(q, qvel)`` (diffmech's ``q``, MuJoCo's ``qvel``): ``qacc``, the
    full mass matrix ``M`` (armature included), ``qfrc_smooth`` and the constraint data."""
    opts = scene.mujoco
    cst = opts.tensors(q.dtype, q.device)
    v = _rotate_bases(lay, q, qvel, inverse=True)
    M_dm, h_dm = _mass_and_bias(scene, lay, q, v)
    M_r = _rotate_bases(lay, q, _rotate_bases(lay, q, M_dm, False, dim=-2).transpose(1, 2), False, dim=-2)
    M_r = M_r.transpose(1, 2)  # T M T^T
    c = _base_coriolis(lay, q, qvel)
    bias = _rotate_bases(lay, q, h_dm, False) - (M_r @ c[..., None])[..., 0]
    M = M_r + torch.diag_embed(cst["armature"]).expand_as(M_r)
    f = tau_mj - bias - cst["damping_extra"] * qvel
    if bool((cst["stiffness"] != 0).any()):
        jq, jv = _joint_maps(lay, q.device)
        f = f.index_add(1, jv, (cst["stiffness"][jv] * (cst["springref"][jv] - q.index_select(1, jq))))
    if opts.fluid is not None:  # MuJoCo's passive fluid forces, computed in diffmech's v coordinates
        f = f + _rotate_bases(lay, q, opts.fluid.forces(q, v), False)
    out = {"M": M, "qfrc_smooth": f, "q": q, "v": v}
    rows = _rows(scene, lay, q, qvel, dt, out)
    if rows is not None and not bool(rows.exists.any()):  # no row in any environment: the smooth acceleration
        out["rows_inactive"] = rows
        rows = None
    if rows is None:
        L, info = torch.linalg.cholesky_ex(M)
        if bool(info.any()):
            raise SimulationError("soft_step: the mass matrix is not positive definite")
        out["qacc"] = torch.cholesky_solve(f[..., None], L)[..., 0]
        out["force"] = None
        out["rows"] = out.pop("rows_inactive", None)
        return out
    _, _, soft_solver = _soft_modules()
    # MuJoCo's convergence test scales by 1 / (meaninertia nv), meaninertia the model's (at qpos0)
    scale = torch.full((q.shape[0],), 1.0 / (opts.meaninertia * max(1, scene.nv)), dtype=q.dtype, device=q.device)
    solve, kw = soft_solver.solve, {}
    if opts.solver == "pgs":  # MuJoCo's PGS, unconverged as mj_step's (it scales its test per island itself)
        from ..contact import soft_pgs
        solve, scale = soft_pgs.solve, None
        kw["order"] = soft_pgs.mujoco_row_order(opts.geoms, out.get("contacts"), rows.kind.shape[0])
        kw["islands"] = not opts.disableflags & (1 << 18)  # mjDSBL_ISLAND: one problem of all rows
    qacc, force, sinfo = solve(M, f, rows, tol=opts.tolerance, iterations=opts.iterations,
                               warmstart=warmstart, scale=scale, **kw)
    out.update(qacc=qacc, force=force, rows=rows, solver=sinfo)
    return out


def _rows(scene, lay: _Layout, q: Tensor, qvel: Tensor, dt: float, out: dict):
    """The constraint rows at ``(q, qvel)`` (contacts, joint limits, friction loss), or None when
    there are none in any environment; the contacts go to ``out["contacts"]``."""
    opts = scene.mujoco
    flags = opts.disableflags
    if flags & _DSBL_CONSTRAINT:
        return None
    cst = opts.tensors(q.dtype, q.device)
    parts = []
    want_contact = not flags & _DSBL_CONTACT and _has_pairs(scene)
    want_limit = not flags & _DSBL_LIMIT and len(opts.limit_dof) and scene.limits
    want_floss = not flags & _DSBL_FRICTIONLOSS and bool((opts.frictionloss > 0).any())
    if not (want_contact or want_limit or want_floss):
        return None
    soft_collide, soft_constraints, _ = _soft_modules()
    if want_floss:  # MuJoCo's order: friction loss, limits, contacts
        parts.append(_frictionloss_rows(soft_constraints, cst, qvel, dt, _refsafe(opts)))
    if want_limit:
        parts.append(_limit_rows(soft_constraints, cst, q, qvel, dt, _refsafe(opts)))
    if want_contact:
        table = _geom_table(scene)
        pos, rot, Jg = _geom_kinematics(scene, lay, table, q)
        con = soft_collide.collide(table, pos, rot)
        out["contacts"] = con
        if con.pos.shape[1]:
            Jt, Jr = _contact_jacobians(con, Jg)
            # J_mj = J T^T: T rotates the rows of J^T
            Jt, Jr = (_rotate_bases(lay, q, J.flatten(1, 2).transpose(1, 2), False, dim=-2)
                      .transpose(1, 2).unflatten(1, J.shape[1:3]) for J in (Jt, Jr))
            plan = _geom_plan(scene, table, q.dtype, q.device)
            iw = plan["invweight"]
            static = plan.setdefault(("contact_rows", float(dt)), {}) if opts.cone == "pyramidal" else None
            parts.append(soft_constraints.contact_rows(con, Jt, Jr, qvel, iw[con.geom1], iw[con.geom2], dt,
                                                       cone=opts.cone, impratio=opts.impratio, static=static,
                                                       refsafe=_refsafe(opts)))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else soft_constraints.cat_rows(*parts)


def _has_pairs(scene) -> bool:
    table = _geom_table(scene)
    return len(table.pairs) > 0


def _contact_jacobians(con, Jg: Tensor) -> tuple[Tensor, Tensor]:
    """Translational and rotational Jacobians ``(B, K, 3, nv)`` of geom2's body relative to geom1's
    at the contact points (world axes), from the bodies' spatial Jacobians ``Jg (B, G, 6, nv)``."""
    J1, J2 = Jg[:, con.geom1], Jg[:, con.geom2]  # (B, K, 6, nv)
    dJ = J2 - J1
    lin, ang = dJ[..., :3, :], dJ[..., 3:, :]
    x = con.pos  # the point's velocity: J_lin v + (J_ang v) x x = (J_lin - [x]x J_ang) v
    Jt = lin - torch.linalg.cross(x[..., None].expand_as(ang), ang, dim=-2)
    return Jt, ang


def _refsafe(opts) -> bool:
    """MuJoCo keeps solref time constants at least ``2 dt`` unless ``refsafe`` is disabled."""
    return not opts.disableflags & _DSBL_REFSAFE


def _limit_rows(sc, cst: dict, q: Tensor, qvel: Tensor, dt: float, refsafe: bool = True):
    """Rows of the limited joints (:func:`diffmech.contact.soft_constraints.limit_rows`)."""
    dof = cst["limit_dof"]
    static = cst.setdefault(("limit_rows", qvel.shape[-1], float(dt), refsafe), {})  # the state-independent parts
    return sc.limit_rows(q.index_select(1, cst["limit_q"]), qvel, dof, cst["limit_range"], cst["limit_margin"],
                         cst["limit_solref"], cst["limit_solimp"], cst["invweight0"][dof], dt, static=static,
                         refsafe=refsafe)


def _frictionloss_rows(sc, cst: dict, qvel: Tensor, dt: float, refsafe: bool = True):
    """Rows of the dofs with friction loss (:func:`diffmech.contact.soft_constraints.frictionloss_rows`)."""
    dof = (cst["frictionloss"] > 0).nonzero()[:, 0]
    return sc.frictionloss_rows(qvel, dof, cst["frictionloss"][dof], cst["solreffriction"][dof],
                                cst["solimpfriction"][dof], cst["invweight0"][dof], dt, refsafe=refsafe)


# ------------------------------------------------------------------ the step
def soft_step(scene, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict | None = None,
              warm: dict | None = None) -> tuple[Tensor, Tensor]:
    """Advance ``(q (B, nq), v (B, nv))`` (diffmech's coordinates) by ``dt`` under joint forces
    ``tau (B, nv)`` as MuJoCo's ``mj_step`` (see the module docstring); ``tau`` is held over the
    step (the four evaluations of RK4 see the same ``tau``).

    ``info`` receives ``route`` (``"torch: mujoco solver"``) and ``soft``: ``{"contacts": the
    :class:`~diffmech.contact.soft_collide.SoftContacts` (None without contacts), "force": the
    constraint forces (B, R) (None without rows), "rows": the :class:`Rows`, "q", "v": the state
    (diffmech's) of the last forward evaluation, "qacc": its MuJoCo acceleration}``, and ``lam``
    (``{"qacc": the last forward evaluation's MuJoCo acceleration (B, nv)}``, no graph) and
    ``fallbacks`` (0), which a rollout reads. ``warm``: an earlier step's ``info["lam"]``; its
    ``qacc`` starts the Newton solver of every forward evaluation of this step where its cost is
    lower than the smooth acceleration's (MuJoCo's ``qacc_warmstart``, which ``mj_step`` saves
    the same way). The result depends on the start only within the solver's tolerance; the
    checkpointed rollout passes the same starts again when it recomputes a step.

    Raises:
        NativeRouteError: under ``DIFFMECH_NATIVE=require`` (this is a torch route).
        ModelError: a scene the step cannot run (ball joints, missing modules).
        SimulationError: a mass matrix that is not positive definite.
    """
    kernels.leave_native("contact_step", "mujoco solver")
    if info is None:
        info = {}
    info["route"] = ROUTE
    lay = _layout(scene)
    opts = scene.mujoco
    h = float(dt)
    tau_mj = _rotate_bases(lay, q, tau, False)
    qvel = _rotate_bases(lay, q, v, False)
    ws = warm.get("qacc") if isinstance(warm, dict) else None
    if ws is not None and (ws.shape != qvel.shape or ws.dtype != qvel.dtype or opts.disableflags & _DSBL_WARMSTART):
        ws = None  # another batch: no start
    ev = _forward(scene, lay, q, qvel, tau_mj, h, ws)
    if opts.integrator == "rk4":
        # MuJoCo's tableau; a stage's position is q (+) h sum_j A_ij K_j, where K_j is stage j's velocity, its
        # floating bases' angular part mapped into the tangent space at q (Munthe-Kaas, see _tangent)
        K, F = [qvel], [ev["qacc"]]
        for i in range(1, 4):
            a = _RK4_A[i - 1]
            dq = sum(a[j] * K[j] for j in range(i) if a[j])
            dv = sum(a[j] * F[j] for j in range(i) if a[j])
            qi = _integrate_pos(lay, q, dq, h)
            vi = qvel + h * dv
            ev = _forward(scene, lay, qi, vi, _rotate_bases(lay, qi, tau, False), h, ws)
            K.append(_tangent(lay, vi, h * dq))
            F.append(ev["qacc"])
        qvel1 = qvel + h * sum(b * f for b, f in zip(_RK4_B, F))
        q1 = _integrate_pos(lay, q, sum(b * k for b, k in zip(_RK4_B, K)), h)
    else:
        qacc = ev["qacc"]
        cst = opts.tensors(q.dtype, q.device)
        # Euler: implicit damping unless eulerdamp is disabled; implicitfast: always (its velocity derivative)
        skip = opts.disableflags & (1 << 6) or (opts.integrator == "euler" and opts.disableflags & _DSBL_EULERDAMP)
        damp = not skip and bool((cst["damping"] > 0).any())
        if damp:  # implicit damping: (M + h D) qacc = qfrc_smooth + qfrc_constraint = M qacc_constrained
            M = ev["M"]
            rhs = (M @ qacc[..., None])[..., 0]
            qacc = torch.linalg.solve(M + h * torch.diag_embed(cst["damping"]), rhs)
        qvel1 = qvel + h * qacc
        q1 = _integrate_pos(lay, q, qvel1, h)
    v1 = _rotate_bases(lay, q1, qvel1, True)
    lay.__dict__.pop("last_R", None)  # no tensor of this step stays on the scene (copies, pickling)
    if not bool(torch.isfinite(q1).all() & torch.isfinite(v1).all()):
        raise SimulationError("soft_step: the state became non-finite (try a smaller dt)")
    info["soft"] = {"contacts": ev.get("contacts"), "force": ev["force"], "rows": ev["rows"],
                    "q": ev["q"], "v": ev["v"], "qacc": ev["qacc"]}
    info["lam"] = {"qacc": ev["qacc"].detach()}
    info["fallbacks"] = 0
    if ev.get("solver"):
        info["solver"] = ev["solver"]
    return q1, v1
