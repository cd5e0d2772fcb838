"""Pinocchio as a reference for diffmech's rigid-body algorithms.

:class:`PinOracle` builds the Pinocchio model of the same URDF and translates states and results
between the two conventions, matching joints by name:

* Pinocchio numbers joints depth-first and stores a continuous joint as two coordinates
  ``(cos, sin)``; diffmech stores one angle per moving joint in ``robot.joint_names`` order.
* With a floating base both put the free-flyer first: ``q[:7] = (x, y, z, qx, qy, qz, qw)``,
  ``v[:6] = (linear; angular)`` in the base frame.
* diffmech's ``f_ext`` is one wrench per *link*, world-aligned axes, torque about the link
  origin; Pinocchio's is one wrench per *joint* in the joint's local frame, torque about the
  joint origin. Links merged into one body by fixed joints share a joint, so their wrenches add;
  links fixed to the world carry no joint and are dropped (a wrench on them does no work).
* Pinocchio keeps the inertia of links fixed to the world (the root link of a fixed-base robot
  and anything welded to it) in ``model.inertias[0]`` and leaves it out of ``centerOfMass`` and
  ``computePotentialEnergy``; diffmech counts every link. :meth:`PinOracle.center_of_mass` and
  :meth:`PinOracle.potential_energy` add that inertia back.

All methods take and return NumPy arrays of ONE state in diffmech's layout; loop over a batch.
"""

from __future__ import annotations

import numpy as np
import pytest

pin = pytest.importorskip("pinocchio")

FRAMES = {"world_aligned": "LOCAL_WORLD_ALIGNED", "local": "LOCAL", "world": "WORLD"}


def pinocchio_model(path, floating_base: bool = False, mimic: bool = False):
    """Pinocchio's model of the URDF file ``path``.

    ``floating_base``: a free-flyer root joint (``q[:7] = (x, y, z, qx, qy, qz, qw)``).
    ``mimic``: build ``<mimic>`` joints as Pinocchio's ``JointModelMimic`` (Pinocchio >= 3.4;
    measured with 4.1). Without it a mimic joint is an independent joint. With it the mimicking
    joint has no coordinate of its own: ``nq``/``nv`` drop by one per mimic joint, and its angle is
    ``scaling * q[mimicked] + offset`` (URDF multiplier and offset: ``model.joints[i].extract()``
    gives ``.scaling``/``.offset``). Then ``forwardKinematics``, ``rnea``, ``crba``,
    ``nonLinearEffects``, ``computeGeneralizedGravity``, ``centerOfMass``, ``jacobianCenterOfMass``,
    ``computeFrameJacobian`` and ``getJointJacobian`` work in the reduced coordinates
    (``G^T tau``, ``G^T M G``, ``J G`` of the model without mimic, ``G = dv_full/dv``);
    ``computeJointJacobians`` fills ``data.J`` with ``model.nvExtended`` columns (one per joint,
    mimic columns pre-scaled); ``aba``, ``computeMinverse``, ``computeRNEADerivatives``,
    ``computeABADerivatives`` and ``forwardDynamics`` raise ``RuntimeError`` -- use
    :func:`pin_forward_dynamics`.
    """
    args = (pin.JointModelFreeFlyer(),) if floating_base else ()
    return pin.buildModelFromUrdf(str(path), *args, mimic=mimic)


def has_mimic(model) -> bool:
    """Whether a Pinocchio model has ``JointModelMimic`` joints."""
    return len(model.mimicking_joints) > 0


def pin_forward_dynamics(model, data, q, v, tau) -> np.ndarray:
    """Joint accelerations by ``aba``, or by ``M^-1 (tau - nle)`` where ``aba`` refuses mimic joints."""
    if not has_mimic(model):
        return pin.aba(model, data, q, v, tau)
    M = pin.crba(model, data, q)
    M = np.triu(M) + np.triu(M, 1).T
    return np.linalg.solve(M, tau - pin.nonLinearEffects(model, data, q, v))


class PinOracle:
    """Pinocchio model of ``path`` laid out like ``robot`` (a :class:`diffmech.RobotModel`)."""

    def __init__(self, robot, path: str, mimic: bool | None = None):
        self.robot = robot
        fb = robot.floating_base
        # diffmech's generalised coordinates leave mimic joints out, as Pinocchio's JointModelMimic does
        mimic = robot.tree.coords is not None if mimic is None else mimic
        self.model = pinocchio_model(path, floating_base=fb, mimic=mimic)
        self.model.gravity.linear = robot.gravity.detach().cpu().double().numpy()
        m = self.model
        if m.nv != robot.nv:
            raise AssertionError(f"Pinocchio has nv={m.nv}, diffmech {robot.nv}")
        self._qs, self._vs = (7, 6) if fb else (0, 0)  # free-flyer coordinates come first in both
        # (pin idx_q, pin nq, pin idx_v) of each diffmech joint, in diffmech order
        self._jmap = []
        for name in robot.joint_names:
            jid = m.getJointId(name)
            if jid >= m.njoints:
                raise AssertionError(f"joint '{name}' not in the Pinocchio model")
            j = m.joints[jid]
            self._jmap.append((j.idx_q, j.nq, j.idx_v))
        # P maps diffmech v to Pinocchio v: v_pin = P v
        P = np.zeros((m.nv, robot.nv))
        if fb:
            P[:6, :6] = np.eye(6)
        for k, (_, _, iv) in enumerate(self._jmap):
            P[iv, self._vs + k] = 1.0
        self.P = P
        self.link_frame = {}
        for ln in robot.link_names:
            fid = m.getFrameId(ln, pin.BODY)
            if fid >= len(m.frames):
                raise AssertionError(f"link '{ln}' has no BODY frame in the Pinocchio model")
            self.link_frame[ln] = fid
        self._offset_frames: dict[tuple, int] = {}
        self.data = m.createData()

    # ------------------------------------------------------------------ state mapping
    def q(self, q: np.ndarray) -> np.ndarray:
        """diffmech ``q (nq,)`` -> Pinocchio ``q``."""
        out = np.zeros(self.model.nq)
        out[: self._qs] = q[: self._qs]
        for k, (iq, nq, _) in enumerate(self._jmap):
            x = q[self._qs + k]
            if nq == 2:
                out[iq : iq + 2] = (np.cos(x), np.sin(x))
            else:
                out[iq] = x
        return out

    def q_back(self, qp: np.ndarray) -> np.ndarray:
        """Pinocchio ``q`` -> diffmech ``q`` (continuous angles in ``(-pi, pi]``)."""
        out = np.zeros(self.robot.nq)
        out[: self._qs] = qp[: self._qs]
        for k, (iq, nq, _) in enumerate(self._jmap):
            out[self._qs + k] = np.arctan2(qp[iq + 1], qp[iq]) if nq == 2 else qp[iq]
        return out

    def v(self, v: np.ndarray) -> np.ndarray:
        """diffmech ``v``/``a``/``tau (nv,)`` -> Pinocchio order."""
        return self.P @ v

    def v_back(self, vp: np.ndarray) -> np.ndarray:
        """Pinocchio ``(nv,)`` -> diffmech order."""
        return self.P.T @ vp

    def _kinematics(self, q: np.ndarray) -> np.ndarray:
        qp = self.q(q)
        pin.forwardKinematics(self.model, self.data, qp)
        pin.updateFramePlacements(self.model, self.data)
        return qp

    def fext(self, q: np.ndarray, f_ext: np.ndarray):
        """diffmech ``f_ext (n_links, 6)`` at ``q`` -> Pinocchio's per-joint local wrenches."""
        self._kinematics(q)
        m, d = self.model, self.data
        out = [np.zeros(6) for _ in range(m.njoints)]
        for i, ln in enumerate(self.robot.link_names):
            fid = self.link_frame[ln]
            jid = m.frames[fid].parentJoint
            if jid == 0:
                continue
            f, n = f_ext[i, :3], f_ext[i, 3:]
            R, p = d.oMi[jid].rotation, d.oMi[jid].translation
            n_joint = n + np.cross(d.oMf[fid].translation - p, f)  # move the torque to the joint origin
            out[jid] += np.concatenate([R.T @ f, R.T @ n_joint])
        fs = pin.StdVec_Force()
        for w in out:
            fs.append(pin.Force(w[:3], w[3:]))
        return fs

    # ------------------------------------------------------------------ kinematics
    def forward_kinematics(self, q: np.ndarray) -> np.ndarray:
        """``(n_links, 4, 4)`` world poses of the links' BODY frames."""
        self._kinematics(q)
        return np.stack([self.data.oMf[self.link_frame[ln]].homogeneous for ln in self.robot.link_names])

    def _offset_frame(self, link: str, offset) -> int:
        key = (link, tuple(float(x) for x in offset))
        if key not in self._offset_frames:
            m = self.model
            fid = self.link_frame[link]
            f = m.frames[fid]
            shift = pin.SE3(np.eye(3), np.asarray(offset, dtype=float))
            name = f"{link}__offset{len(self._offset_frames)}"
            self._offset_frames[key] = m.addFrame(
                pin.Frame(name, f.parentJoint, fid, f.placement * shift, pin.FrameType.OP_FRAME)
            )
            self.data = m.createData()
        return self._offset_frames[key]

    def jacobian(self, q: np.ndarray, link: str, frame: str = "world_aligned", offset=None) -> np.ndarray:
        """Frame Jacobian ``(6, nv)`` (rows linear; angular) in diffmech's column order.

        ``offset (3,)``: use a frame rigidly attached to ``link``, translated by ``offset`` in
        link coordinates (Pinocchio's Jacobian of that frame).
        """
        fid = self.link_frame[link] if offset is None else self._offset_frame(link, offset)
        ref = getattr(pin.ReferenceFrame, FRAMES[frame])
        J = pin.computeFrameJacobian(self.model, self.data, self.q(q), fid, ref)
        return J @ self.P

    def center_of_mass(self, q: np.ndarray) -> np.ndarray:
        """Centre of mass of all links, world-fixed ones included, ``(3,)``."""
        com = pin.centerOfMass(self.model, self.data, self.q(q))
        m_moving = self.data.mass[0]
        I0 = self.model.inertias[0]  # links fixed to the world, in world coordinates
        return (m_moving * com + I0.mass * I0.lever) / (m_moving + I0.mass)

    def world_fixed_mass(self) -> float:
        return float(self.model.inertias[0].mass)

    # ------------------------------------------------------------------ dynamics
    def rnea(self, q, v, a, f_ext=None) -> np.ndarray:
        args = [self.model, self.data, self.q(q), self.v(v), self.v(a)]
        if f_ext is not None:
            args.append(self.fext(q, f_ext))
        return self.v_back(pin.rnea(*args))

    def crba(self, q) -> np.ndarray:
        M = pin.crba(self.model, self.data, self.q(q))
        M = np.triu(M) + np.triu(M, 1).T  # Pinocchio fills the upper triangle only
        return self.P.T @ M @ self.P

    def aba(self, q, v, tau, f_ext=None) -> np.ndarray:
        if has_mimic(self.model):
            assert f_ext is None, "Pinocchio's aba refuses mimic joints; no f_ext in the substitute"
            return self.v_back(pin_forward_dynamics(self.model, self.data, self.q(q), self.v(v), self.v(tau)))
        args = [self.model, self.data, self.q(q), self.v(v), self.v(tau)]
        if f_ext is not None:
            args.append(self.fext(q, f_ext))
        return self.v_back(pin.aba(*args))

    def kinetic_energy(self, q, v) -> float:
        return float(pin.computeKineticEnergy(self.model, self.data, self.q(q), self.v(v)))

    def potential_energy(self, q) -> float:
        """Gravity potential ``-sum m g.c`` of all links, world-fixed ones included."""
        U = float(pin.computePotentialEnergy(self.model, self.data, self.q(q)))
        I0 = self.model.inertias[0]
        return U - I0.mass * float(self.model.gravity.linear @ I0.lever)

    def integrate(self, q, v, dt: float = 1.0) -> np.ndarray:
        """Pinocchio's ``integrate(q, v dt)`` in diffmech's layout."""
        return self.q_back(pin.integrate(self.model, self.q(q), self.v(v) * dt))


def rel_err(actual, expected, per: int = 1) -> float:
    """Max over samples of ``max|actual - expected| / max|expected|`` (per-sample scale).

    ``per``: number of leading (batch) dimensions that index samples.
    """
    a = np.asarray(actual, dtype=float)
    e = np.asarray(expected, dtype=float)
    assert a.shape == e.shape, (a.shape, e.shape)
    a = a.reshape(*a.shape[:per], -1)
    e = e.reshape(*e.shape[:per], -1)
    scale = np.maximum(np.abs(e).max(-1), 1e-12)
    return float((np.abs(a - e).max(-1) / scale).max())
