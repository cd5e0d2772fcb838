"""MJCF loading against MuJoCo itself: gymnasium's task files compiled by ``mujoco`` are the oracle.

For every gymnasium model without ball joints, at seeded random states: the mass matrix against
``mj_fullM`` (less ``diag(dof_armature)``, which a RobotModel does not hold), the bias forces
against ``qfrc_bias`` and the forward dynamics against ``qacc`` with contacts, constraints and
fluid forces disabled and armature zeroed in the oracle (damping and springs kept: both sides have
them). A free joint's velocity frames differ (MuJoCo: world-frame linear velocity), so the
comparison maps diffmech's quantities through ``v_mj = T v``: ``M_mj = T^-T M T^-1`` and
``h_mj = T^-T h - M_mj c`` with ``c`` the velocity-product part of the free joint's acceleration.
"""

from __future__ import annotations

import os
import warnings

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

import diffmech
from diffmech.errors import DiffmechError
from diffmech.model.mjcf import (
    actuator_forces,
    diffmech_acc_to_mjcf,
    diffmech_state_to_mjcf,
    mjcf_state_to_diffmech,
)
from diffmech.sim import Scene, rollout

ASSETS = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")
MODELS = ["ant", "half_cheetah", "hopper", "walker2d", "humanoid", "humanoidstandup", "swimmer", "reacher",
          "pusher", "inverted_pendulum", "inverted_double_pendulum"]
RTOL = 1e-9


@pytest.fixture(autouse=True)
def _mujoco_log_elsewhere(tmp_path, monkeypatch):
    # MuJoCo appends its compiler warnings (half_cheetah's deprecated settotalmass) to MUJOCO_LOG.TXT
    # in the working directory
    monkeypatch.chdir(tmp_path)


def _load(name: str) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # humanoid's inert tendons, swimmer's fluid, sites: tested below
        return diffmech.load_mjcf(os.path.join(ASSETS, f"{name}.xml"))


def _oracle(name: str):
    m = mujoco.MjModel.from_xml_path(os.path.join(ASSETS, f"{name}.xml"))
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    m.opt.density, m.opt.viscosity = 0.0, 0.0
    return m, mujoco.MjData(m)


def _random_state(m, rng):
    qpos = m.qpos0 + 0.6 * rng.standard_normal(m.nq)
    for j in range(m.njnt):
        if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_FREE:
            a = m.jnt_qposadr[j]
            quat = rng.standard_normal(4)
            qpos[a + 3:a + 7] = quat / np.linalg.norm(quat)
    return qpos, rng.standard_normal(m.nv)


def _velocity_map(robot, m, q) -> np.ndarray:
    """``(m.nv, robot.nv)`` matrix ``T`` with ``qvel = T v``."""
    vi = robot.meta["mjcf"]["qvel_index"]
    T = np.zeros((m.nv, robot.nv))
    T[vi, range(robot.nv)] = 1.0
    if robot.floating_base:
        x, y, z, w = q[3:7].tolist()
        R = np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
                      [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
                      [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)]])
        T[np.ix_(vi[:3], range(3))] = R
    return T


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1e-12, np.abs(np.asarray(b)).max()))


def _errors(robot, m, d, seed: int, n: int = 3) -> tuple[float, float, float]:
    """Largest relative errors of the mass matrix, the bias forces and the forward dynamics (with a
    random applied force, the joints' damping and springs) at ``n`` random states; ``m`` without
    contacts and constraints."""
    rng = np.random.default_rng(seed)
    eM = eh = ea = 0.0
    arm = m.dof_armature.copy()
    for _ in range(n):
        d.qpos[:], d.qvel[:] = _random_state(m, rng)
        d.qfrc_applied[:] = rng.standard_normal(m.nv)
        m.dof_armature[:] = arm
        mujoco.mj_setConst(m, d)  # MuJoCo precomputes the constant mass of "simple" bodies (pusher's object)
        mujoco.mj_forward(m, d)
        M_mj = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, M_mj)
        M_mj -= np.diag(m.dof_armature)
        q, v = mjcf_state_to_diffmech(robot, d.qpos.copy(), d.qvel.copy())
        T = _velocity_map(robot, m, q)
        Ti = np.linalg.inv(T)
        M = Ti.T @ robot.mass_matrix(q).numpy() @ Ti
        eM = max(eM, float(np.abs(M - M_mj).max() / np.abs(M_mj).max()))
        c = diffmech_acc_to_mjcf(robot, q, v, torch.zeros(robot.nv, dtype=torch.float64)).numpy()
        h = Ti.T @ robot.bias_forces(q, v, passive=False).numpy() - M_mj @ c
        eh = max(eh, _rel(h, d.qfrc_bias))
        # forward dynamics: armature is not part of a RobotModel (a scene adds it as a drive)
        m.dof_armature[:] = 0.0
        mujoco.mj_setConst(m, d)
        mujoco.mj_forward(m, d)
        a = robot.forward_dynamics(q, v, torch.from_numpy(T.T @ d.qfrc_applied))  # the same power
        ea = max(ea, _rel(diffmech_acc_to_mjcf(robot, q, v, a).numpy(), d.qacc))
        passive = robot.bias_forces(q, v, passive=False).numpy() - robot.bias_forces(q, v).numpy()
        ea = max(ea, _rel(passive, T.T @ d.qfrc_passive))
    m.dof_armature[:] = arm
    return eM, eh, ea


@pytest.mark.parametrize("name", MODELS)
def test_dynamics_against_mujoco(name):
    robot = _load(name)
    m, d = _oracle(name)
    assert (robot.nq, robot.nv) == (m.nq, m.nv)
    eM, eh, ea = _errors(robot, m, d, seed=7)
    print(f"{name}: mass matrix {eM:.1e}, bias {eh:.1e}, qacc {ea:.1e}")
    assert eM <= RTOL and eh <= RTOL and ea <= RTOL, (name, eM, eh, ea)


_FEATURES = """<mujoco>
  <compiler angle="degree"/>
  <option gravity="0.3 -1 -9"/>
  <worldbody>
    <body name="base" pos="0.1 0.2 0.3" euler="10 20 30">
      <joint name="j0" type="hinge" axis="0 0.6 0.8" pos="0.05 -0.02 0.1" ref="30" damping="0.3"
             stiffness="2" springref="10" range="-90 90"/>
      <joint name="j0b" type="slide" axis="1 1 0" ref="0.2"/>
      <inertial pos="0.1 0 0.02" quat="0.9 0.1 0.3 0.2" mass="1.5" diaginertia="0.1 0.08 0.05"/>
      <body name="mid" pos="0.4 0 0" quat="0.7 0 0.7 0.1">
        <joint name="j1" type="hinge" axis="1 0 0" pos="0 0.1 0"/>
        <joint name="j2" type="hinge" axis="0 0 1" pos="0.03 0 -0.05" ref="-45"/>
        <inertial pos="0 0.05 0.1" mass="0.7" fullinertia="0.02 0.03 0.04 0.001 -0.002 0.003"/>
        <body name="welded" pos="0.1 0.1 0" euler="0 90 0">
          <geom type="box" size="0.05 0.1 0.02" mass="0.3"/>
          <body name="tip" pos="0 0 0.2">
            <joint name="j3" type="slide" axis="0 1 0" pos="1 2 3"/>
            <geom type="sphere" size="0.05" mass="0.2" pos="0.01 0.02 0.03"/>
          </body>
        </body>
      </body>
      <body name="side" pos="-0.2 0 0">
        <joint name="j4" type="hinge" axis="0 1 0" armature="0.1"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03"/>
      </body>
    </body>
    <body name="free" pos="1 0 1">
      <joint name="j5" type="hinge" axis="1 0 0"/>
      <geom type="cylinder" size="0.1 0.2"/>
    </body>
  </worldbody>
</mujoco>"""


def test_joint_features_against_mujoco(tmp_path):
    """Hinge ``ref`` and ``pos``, body orientations, several joints in a body, a welded body, a
    rotated and a full inertia, several top-level trees, springs, damping and gravity."""
    path = tmp_path / "features.xml"
    path.write_text(_FEATURES)
    robot = diffmech.load_mjcf(path)
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    d = mujoco.MjData(m)
    assert list(robot.joint_names) == [f"j{i}" for i in (0, "0b", 1, 2, 3, 4, 5)]
    eM, eh, ea = _errors(robot, m, d, seed=1)
    assert eM <= RTOL and eh <= RTOL and ea <= RTOL, (eM, eh, ea)
    # poses: each body's frame is its link's frame moved by minus its last joint's anchor
    d.qpos[:] = _random_state(m, np.random.default_rng(2))[0]
    mujoco.mj_forward(m, d)
    p, R = robot.forward_kinematics(mjcf_state_to_diffmech(robot, d.qpos.copy())[0], form="pos_rot")
    for b in range(1, m.nbody):
        i = robot.link_names.index(m.body(b).name)
        anchor = np.zeros(3)
        if m.body_jntnum[b]:
            j = m.body_jntadr[b] + m.body_jntnum[b] - 1
            anchor = m.jnt_pos[j] if m.jnt_type[j] == mujoco.mjtJoint.mjJNT_HINGE else anchor
        assert np.allclose(p[i].numpy(), d.xpos[b] + d.xmat[b].reshape(3, 3) @ anchor, atol=1e-12), m.body(b).name
        assert np.allclose(R[i].numpy(), d.xmat[b].reshape(3, 3), atol=1e-12), m.body(b).name


def test_state_round_trip_and_layout():
    robot = _load("ant")
    m, d = _oracle("ant")
    rng = np.random.default_rng(3)
    qpos, qvel = _random_state(m, rng)
    q, v = mjcf_state_to_diffmech(robot, qpos, qvel)
    assert torch.allclose(q[3:7], torch.tensor([*qpos[4:7], qpos[3]], dtype=torch.float64))
    qpos2, qvel2 = diffmech_state_to_mjcf(robot, q, v)
    assert np.allclose(qpos2.numpy(), qpos, atol=1e-14) and np.allclose(qvel2.numpy(), qvel, atol=1e-14)
    # the base's linear velocity is the body frame's: world velocity of the torso origin, rotated
    d.qpos[:], d.qvel[:] = qpos, qvel
    mujoco.mj_forward(m, d)
    vel = np.zeros(6)
    mujoco.mj_objectVelocity(m, d, mujoco.mjtObj.mjOBJ_BODY, m.body("torso").id, vel, 1)  # local frame
    assert np.allclose(v[:3].numpy(), vel[3:], atol=1e-12) and np.allclose(v[3:6].numpy(), vel[:3], atol=1e-12)
    # joints in MuJoCo's order, same names; armature kept aside
    assert list(robot.joint_names) == [m.joint(j).name for j in range(1, m.njnt)]
    assert robot.meta["mjcf"]["armature"] == [1.0] * 8


def test_collision_shapes_and_actuators():
    robot = _load("ant")
    shapes = diffmech.model.collision.collision_shapes(robot)
    assert shapes["torso"][0].kind == "sphere" and shapes["torso"][0].size == (0.25,)
    assert all(s.kind == "capsule" for link, ss in shapes.items() if link != "torso" for s in ss)
    m, d = _oracle("ant")
    ctrl = np.linspace(-1.5, 1.5, m.nu)
    d.ctrl[:] = ctrl
    mujoco.mj_forward(m, d)
    tau = actuator_forces(robot, ctrl)
    assert np.allclose(tau.numpy(), d.qfrc_actuator, atol=1e-12)  # ctrl clipped to [-1, 1], gear 150


def test_warnings_name_what_is_ignored():
    with pytest.warns(UserWarning, match="left_hipknee"):
        diffmech.load_mjcf(os.path.join(ASSETS, "humanoid.xml"))
    with pytest.warns(UserWarning, match="fluid"):
        diffmech.load_mjcf(os.path.join(ASSETS, "swimmer.xml"))


_ARM = """<mujoco>
  <worldbody>
    <body name="upper">
      <joint name="shoulder" type="{kind}"/>
      <geom type="capsule" size="0.05" fromto="0 0 0 0.3 0 0"/>
      <site name="s1" pos="0.1 0 0"/>
      <body name="lower" pos="0.3 0 0">
        <joint name="elbow" type="hinge" axis="0 1 0"/>
        <geom type="ellipsoid" size="0.1 0.05 0.05"/>
        <site name="s2" pos="0.2 0 0"/>
      </body>
    </body>
  </worldbody>
  {extra}
</mujoco>"""


def _write(tmp_path, kind="hinge", extra=""):
    path = tmp_path / "arm.xml"
    path.write_text(_ARM.format(kind=kind, extra=extra))
    return path


def test_bad_input(tmp_path):
    with pytest.raises(DiffmechError, match="no such MJCF file"):
        diffmech.load_mjcf(tmp_path / "missing.xml")
    tendon = '<tendon><spatial name="cable" stiffness="10"><site site="s1"/><site site="s2"/></spatial></tendon>'
    with pytest.raises(DiffmechError, match="cable"):
        diffmech.load_mjcf(_write(tmp_path, extra=tendon))
    with pytest.raises(DiffmechError, match="shoulder.*spring"):  # ball joints load (tests/test_ball_joint.py)
        diffmech.load_mjcf(_write(tmp_path, kind='ball" stiffness="1'))
    eq = '<equality><joint name="couple" joint1="shoulder" joint2="elbow"/></equality>'
    with pytest.raises(DiffmechError, match="couple"):
        diffmech.load_mjcf(_write(tmp_path, extra=eq))
    (tmp_path / "broken.xml").write_text("<mujoco><worldbody><body></worldbody></mujoco>")
    with pytest.raises(DiffmechError, match="cannot compile"):
        diffmech.load_mjcf(tmp_path / "broken.xml")
    two = ('<mujoco><worldbody><body name="box"><freejoint name="float"/><geom type="box" size=".1 .1 .1"/></body>'
           '<body name="arm"><joint name="hinge"/><geom type="sphere" size=".1"/></body></worldbody></mujoco>')
    (tmp_path / "two.xml").write_text(two)
    with pytest.raises(DiffmechError, match="'box'.*Scene.from_mjcf"):
        diffmech.load_mjcf(tmp_path / "two.xml")
    assert Scene.from_mjcf(tmp_path / "two.xml").names == ["box", "arm"]
    with pytest.warns(UserWarning) as record:
        robot = diffmech.load_mjcf(_write(tmp_path))
    messages = [str(w.message) for w in record]
    assert any("ellipsoid" in w and "geom" in w for w in messages)  # not used for contact
    assert any("site(s) ['s1', 's2']" in w for w in messages)
    assert list(robot.joint_names) == ["shoulder", "elbow"] and not robot.floating_base


def test_scene_from_mjcf_builds_and_steps():
    scene = Scene.from_mjcf(os.path.join(ASSETS, "ant.xml"), solver="pgs")  # its drives: the PGS scene's
    assert scene.names == ["ant"] and scene.ground and scene.timestep == 0.01
    assert float(scene.friction) == 1.0 and not scene.self_collision
    robot = scene.model("ant")
    assert torch.all(robot.model_tensors().damping == 0)  # damping is the scene's implicit drive
    assert torch.allclose(scene.drives["ant"][1], torch.ones(8, dtype=torch.float64))  # damping
    q0 = scene.neutral_configuration().clone()
    q0[2] = 0.75
    q0[8::2] = 0.6  # ankles inside their limits
    v0 = torch.zeros(scene.nv, dtype=torch.float64)
    tau = torch.zeros(20, scene.nv, dtype=torch.float64)
    Q, V = rollout(scene, q0, v0, tau, scene.timestep)
    assert Q.shape[-1] == scene.nq and torch.isfinite(Q).all() and torch.isfinite(V).all()
    assert float(Q[-1, 2]) < 0.75  # it falls


def test_scene_several_trees():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scene = Scene.from_mjcf(os.path.join(ASSETS, "reacher.xml"))
    assert scene.names == ["body0", "target"] and scene.nq == 4 and not scene.ground
    m = mujoco.MjModel.from_xml_path(os.path.join(ASSETS, "reacher.xml"))
    qpos, qvel = _random_state(m, np.random.default_rng(0))
    q, v = mjcf_state_to_diffmech(scene, qpos, qvel)
    qpos2, qvel2 = diffmech_state_to_mjcf(scene, q, v)
    assert np.array_equal(qpos2.numpy(), qpos) and np.array_equal(qvel2.numpy(), qvel)
    d = mujoco.MjData(m)
    d.qpos[:], d.qvel[:], d.ctrl[:] = qpos, qvel, (0.5, -2.0)
    mujoco.mj_forward(m, d)
    assert np.allclose(actuator_forces(scene, d.ctrl).numpy(), d.qfrc_actuator, atol=1e-12)
