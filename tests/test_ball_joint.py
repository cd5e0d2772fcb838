"""Ball (spherical) joints: against Pinocchio's ``JointModelSpherical`` and MuJoCo's ``ball`` joint.

The same random tree -- ball joints at the root, mid-chain and on a branch, beside revolute and
prismatic joints, with and without a floating base -- is built in Pinocchio from the same numbers;
forward kinematics, Jacobians, the mass matrix, RNEA and ABA (both methods, small and large
batches, both eager frames) agree to 1e-10 (float64). Both use ``(qx, qy, qz, qw)`` quaternions and
child-frame angular velocities, so the coordinates are compared unchanged. An MJCF with a free root
and a chain of ball joints is loaded by :func:`diffmech.load_mjcf` and compared with ``mj_fullM``,
``qfrc_bias`` and ``qacc`` (contacts off) to 1e-9. Gradients by ``gradcheck`` (the configuration
along the tangent space through ``integrate``), a free-swinging ball pendulum's energy over a
rollout, sampling, and what is refused (native kernels, URDF export, springs).
"""

from __future__ import annotations

import math

import mujoco
import numpy as np
import pinocchio as pin
import pytest
import torch

import diffmech
from diffmech import spatial
from diffmech.dynamics import kernels, set_eager_frame
from diffmech.dynamics.kernels import NativeUnavailable
from diffmech.errors import DiffmechError, ModelError
from diffmech.model.mjcf import diffmech_acc_to_mjcf, diffmech_state_to_mjcf, mjcf_state_to_diffmech
from diffmech.model.spec import JointSpec, LinkSpec, RobotSpec
from diffmech.sim import rollout

DT = torch.float64
TOL = 1e-10


def _spec(seed: int = 0) -> RobotSpec:
    rng = np.random.default_rng(seed)

    def link(name):
        A = rng.standard_normal((3, 3))
        inertia = 0.1 * (A @ A.T + 0.1 * np.eye(3))
        return LinkSpec(name, mass=float(rng.uniform(0.5, 2.0)), com=tuple(rng.uniform(-0.2, 0.2, 3)),
                        inertia=tuple(map(tuple, inertia)))

    def joint(name, kind, parent, child):
        axis = tuple(rng.standard_normal(3)) if kind != "ball" else (1.0, 0.0, 0.0)
        return JointSpec(name, kind, parent, child, xyz=tuple(rng.uniform(-0.3, 0.3, 3)),
                         rpy=tuple(rng.uniform(-1.0, 1.0, 3)), axis=axis)

    links = [link(n) for n in ("base", "a", "b", "c", "d", "e", "f")]
    joints = [joint("j1", "ball", "base", "a"), joint("j2", "revolute", "a", "b"), joint("j3", "ball", "b", "c"),
              joint("j4", "prismatic", "base", "d"), joint("j5", "ball", "d", "e"), joint("j6", "fixed", "e", "f")]
    return RobotSpec("balls", links, joints)


def _pinocchio(spec: RobotSpec, floating: bool):
    """The same tree in Pinocchio: ``(model, {link name: joint id}, {link name: placement in its joint})``."""
    model = pin.Model()
    model.gravity = pin.Motion(np.array([*spec.gravity, 0.0, 0.0, 0.0]))
    links = {link.name: link for link in spec.links}

    def inertia(name):
        link = links[name]
        return pin.Inertia(link.mass, np.array(link.com), np.array(link.inertia))

    root = spec.links[0].name
    ids, offset = {root: 0}, {root: pin.SE3.Identity()}
    if floating:
        ids[root] = model.addJoint(0, pin.JointModelFreeFlyer(), pin.SE3.Identity(), "root")
        model.appendBodyToJoint(ids[root], inertia(root), pin.SE3.Identity())
    for j in spec.joints:
        placement = offset[j.parent] * pin.SE3(spatial.rpy_to_matrix(torch.tensor(j.rpy, dtype=DT)).numpy(),
                                               np.array(j.xyz))
        if j.type == "fixed":
            ids[j.child], offset[j.child] = ids[j.parent], placement
            model.appendBodyToJoint(ids[j.child], inertia(j.child), placement)
            continue
        axis = np.array(j.axis) / np.linalg.norm(j.axis)
        if j.type == "ball":
            jm = pin.JointModelSpherical()
        elif j.type == "revolute":
            jm = pin.JointModelRevoluteUnaligned(axis)
        else:
            jm = pin.JointModelPrismaticUnaligned(axis)
        ids[j.child] = model.addJoint(ids[j.parent], jm, placement, j.name)
        offset[j.child] = pin.SE3.Identity()
        model.appendBodyToJoint(ids[j.child], inertia(j.child), pin.SE3.Identity())
    return model, ids, offset


@pytest.fixture(params=[False, True], ids=["fixed", "floating"])
def pair(request):
    spec = _spec()
    robot = diffmech.RobotModel(spec, floating_base=request.param, dtype=DT)
    model, ids, offset = _pinocchio(spec, request.param)
    assert (robot.nq, robot.nv) == (model.nq, model.nv)
    return robot, model, ids, offset


def _state(robot, B: int, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(B, generator=g)
    return q, torch.randn(B, robot.nv, generator=g, dtype=DT), torch.randn(B, robot.nv, generator=g, dtype=DT)


def test_layout_and_sampling():
    robot = diffmech.RobotModel(_spec(), floating_base=True, dtype=DT)
    assert (robot.nq, robot.nv) == (7 + 4 + 1 + 4 + 1 + 4, 6 + 3 + 1 + 3 + 1 + 3)
    assert robot.joint_names == ["j1", "j2", "j3", "j4", "j5"]
    assert robot.joint_types == ["ball", "revolute", "ball", "prismatic", "ball"]
    q0 = robot.neutral_configuration()
    assert q0[7:11].tolist() == [0, 0, 0, 1] and q0[12:16].tolist() == [0, 0, 0, 1]
    T = robot.forward_kinematics(q0)
    q = robot.random_configuration(2000, generator=torch.Generator().manual_seed(0))
    quats = [q[:, 7:11], q[:, 12:16], q[:, 17:21]]
    for quat in quats:
        assert torch.allclose(quat.norm(dim=-1), torch.ones(2000, dtype=DT), atol=1e-14)
    # uniform over rotations: E[qi^2] = 1/4 for every component
    assert torch.allclose(quats[0].square().mean(0), torch.full((4,), 0.25, dtype=DT), atol=0.03)
    assert T.shape == (robot.n_links, 4, 4)


def test_cone_sampling():
    spec = _spec()
    spec.joints[0].upper = 0.5  # a cone of half a radian on j1
    robot = diffmech.RobotModel(spec, dtype=DT)
    q = robot.random_configuration(4000, generator=torch.Generator().manual_seed(3))
    angle = 2 * torch.atan2(q[:, :3].norm(dim=-1), q[:, 3].abs())
    assert float(angle.max()) <= 0.5 + 1e-12
    # uniform over the rotations within the cone: P(angle <= t) = (t - sin t) / (a - sin a)
    t = 0.35
    assert abs(float((angle <= t).to(DT).mean()) - (t - math.sin(t)) / (0.5 - math.sin(0.5))) < 0.03
    assert robot.joint_limits()["upper"][0] == 0.5


@pytest.mark.parametrize("B", [3, 80])
@pytest.mark.parametrize("frame", ["local", "world"])
def test_dynamics_against_pinocchio(pair, B, frame):
    robot, model, _, _ = pair
    data = model.createData()
    q, v, a = _state(robot, B)
    tau = torch.randn(B, robot.nv, generator=torch.Generator().manual_seed(5), dtype=DT)
    old = set_eager_frame(frame)
    try:
        M, h = robot.mass_matrix(q), robot.inverse_dynamics(q, v, a)
        qdd = {m: robot.forward_dynamics(q, v, tau, method=m) for m in ("aba", "crba")}
    finally:
        set_eager_frame(old)
    err = 0.0
    for i in range(0, B, max(1, B // 5)):
        qi, vi = q[i].numpy(), v[i].numpy()
        Mp = pin.crba(model, data, qi)
        Mp = np.triu(Mp) + np.triu(Mp, 1).T
        err = max(err, np.abs(M[i].numpy() - Mp).max(),
                  np.abs(h[i].numpy() - pin.rnea(model, data, qi, vi, a[i].numpy())).max())
        ap = pin.aba(model, data, qi, vi, tau[i].numpy())
        err = max(err, *(np.abs(x[i].numpy() - ap).max() / max(1.0, np.abs(ap).max()) for x in qdd.values()))
    assert err < TOL, err


def test_kinematics_against_pinocchio(pair):
    robot, model, ids, offset = pair
    data = model.createData()
    q, v, _ = _state(robot, 4)
    T = robot.forward_kinematics(q)
    for i in range(4):
        qi = q[i].numpy()
        pin.forwardKinematics(model, data, qi, v[i].numpy())
        pin.computeJointJacobians(model, data, qi)
        for name in robot.link_names:
            li = robot.link_names.index(name)
            X = data.oMi[ids[name]] * offset[name]
            assert np.abs(T[i, li, :3, :3].numpy() - X.rotation).max() < TOL
            assert np.abs(T[i, li, :3, 3].numpy() - X.translation).max() < TOL
            # the Jacobian of the link origin, world-aligned, against Pinocchio's of the joint moved there
            Jp = pin.getJointJacobian(model, data, ids[name], pin.ReferenceFrame.WORLD)
            lin = Jp[:3] - np.cross(X.translation, Jp[3:].T).T  # world-origin linear rows -> link origin
            J = robot.jacobian(q[i], name).numpy()
            assert np.abs(J - np.vstack([lin, Jp[3:]])).max() < TOL, name


def test_integrate_is_the_exponential_map():
    robot = diffmech.RobotModel(_spec(), floating_base=True, dtype=DT)
    model, _, _ = _pinocchio(_spec(), True)
    q, v, _ = _state(robot, 5)
    for dt in (1e-3, 0.7, 3.0):  # small angles take the series, large ones the closed forms
        q1 = robot.integrate(q, v, dt)
        for i in range(5):
            ref = pin.integrate(model, q[i].numpy(), dt * v[i].numpy())
            # the same rotations (a quaternion and its negative are one orientation)
            for s in (slice(3, 7), slice(7, 11), slice(12, 16), slice(17, 21)):
                dot = abs(float(np.dot(q1[i, s].numpy(), ref[s])))
                assert abs(dot - 1) < 1e-12
            assert np.abs(q1[i, [0, 1, 2, 11, 16]].numpy() - ref[[0, 1, 2, 11, 16]]).max() < 1e-12
        assert torch.allclose(q1[:, 7:11].norm(dim=-1), torch.ones(5, dtype=DT), atol=1e-14)


# ------------------------------------------------------------------ MuJoCo
_MJCF = """<mujoco>
  <option gravity="0.2 -0.4 -9.81"/>
  <worldbody>
    <body name="torso" pos="0 0 1">
      <freejoint name="root"/>
      <geom type="box" size="0.2 0.1 0.05" mass="3"/>
      <body name="l1" pos="0.25 0 0" quat="0.9 0.1 0.3 0.2">
        <joint name="b1" type="ball" pos="0 0 0.05" damping="0.3"/>
        <geom type="capsule" fromto="0 0 0 0.3 0 0" size="0.04" mass="1"/>
        <body name="l2" pos="0.3 0 0">
          <joint name="b2" type="ball" range="0 60" damping="0.1"/>
          <inertial pos="0.1 0.02 -0.01" mass="0.8" fullinertia="0.02 0.03 0.04 0.001 -0.002 0.003"/>
          <body name="l3" pos="0.25 0.05 0" euler="10 20 30">
            <joint name="h" type="hinge" axis="0 1 0"/>
            <joint name="b3" type="ball" pos="0.02 0 0"/>
            <geom type="sphere" size="0.05" pos="0.1 0 0" mass="0.5"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>"""


def _mujoco_pair(tmp_path):
    path = tmp_path / "balls.xml"
    path.write_text(_MJCF)
    robot = diffmech.load_mjcf(path)
    m = mujoco.MjModel.from_xml_path(str(path))
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_CONTACT) | int(mujoco.mjtDisableBit.mjDSBL_CONSTRAINT)
    return robot, m, mujoco.MjData(m)


def _rel(a, b) -> float:
    return float(np.abs(np.asarray(a) - np.asarray(b)).max() / max(1e-12, np.abs(np.asarray(b)).max()))


def test_mjcf_against_mujoco(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    robot, m, d = _mujoco_pair(tmp_path)
    assert (robot.nq, robot.nv) == (m.nq, m.nv)
    assert robot.joint_types == ["ball", "ball", "continuous", "ball"]
    assert robot.joint_limits()["upper"][1] == pytest.approx(math.radians(60))
    rng = np.random.default_rng(11)
    eM = eh = ea = 0.0
    for _ in range(4):
        qpos = rng.standard_normal(m.nq)
        for j in range(m.njnt):
            kind = int(m.jnt_type[j])
            if kind in (int(mujoco.mjtJoint.mjJNT_FREE), int(mujoco.mjtJoint.mjJNT_BALL)):
                a = int(m.jnt_qposadr[j]) + (3 if kind == int(mujoco.mjtJoint.mjJNT_FREE) else 0)
                qpos[a:a + 4] /= np.linalg.norm(qpos[a:a + 4])
        d.qpos[:], d.qvel[:] = qpos, rng.standard_normal(m.nv)
        d.qfrc_applied[:] = rng.standard_normal(m.nv)
        mujoco.mj_forward(m, d)
        M_mj = np.zeros((m.nv, m.nv))
        mujoco.mj_fullM(m, d, M_mj)
        q, v = mjcf_state_to_diffmech(robot, d.qpos.copy(), d.qvel.copy())
        qpos2, qvel2 = diffmech_state_to_mjcf(robot, q, v)
        assert np.abs(qpos2.numpy() - d.qpos).max() < 1e-14 and np.abs(qvel2.numpy() - d.qvel).max() < 1e-14
        # v_mj = T v: only the free joint's linear velocity changes frame
        x, y, z, w = q[3:7].tolist()
        R = spatial.quat_to_matrix(torch.tensor([x, y, z, w], dtype=DT)).numpy()
        T = np.eye(m.nv)
        T[:3, :3] = R
        Ti = np.linalg.inv(T)
        M = Ti.T @ robot.mass_matrix(q).numpy() @ Ti
        eM = max(eM, _rel(M, M_mj))
        c = diffmech_acc_to_mjcf(robot, q, v, torch.zeros(robot.nv, dtype=DT)).numpy()
        eh = max(eh, _rel(Ti.T @ robot.bias_forces(q, v, passive=False).numpy() - M_mj @ c, d.qfrc_bias))
        for method in ("aba", "crba"):
            acc = robot.forward_dynamics(q, v, torch.from_numpy(T.T @ d.qfrc_applied), method=method)
            ea = max(ea, _rel(diffmech_acc_to_mjcf(robot, q, v, acc).numpy(), d.qacc))
        passive = robot.bias_forces(q, v, passive=False).numpy() - robot.bias_forces(q, v).numpy()
        ea = max(ea, _rel(passive, T.T @ d.qfrc_passive))
    print(f"ball MJCF vs MuJoCo: mass matrix {eM:.1e}, bias {eh:.1e}, qacc {ea:.1e}")
    assert eM < 1e-9 and eh < 1e-9 and ea < 1e-9, (eM, eh, ea)


def test_mjcf_ball_spring_refused(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "spring.xml"
    path.write_text(_MJCF.replace('damping="0.3"', 'stiffness="2"'))
    with pytest.raises(DiffmechError, match="b1.*spring"):
        diffmech.load_mjcf(path)


# ------------------------------------------------------------------ gradients
@pytest.mark.parametrize("floating", [False, True])
def test_forward_dynamics_gradcheck(floating):
    robot = diffmech.RobotModel(_spec(2), floating_base=floating, dtype=DT)
    q, v, tau = _state(robot, 1, seed=4)

    def fd(dq, v, tau, fast):
        return robot.forward_dynamics(robot.integrate(q, dq), v, tau, fast_grad=fast)

    dq = torch.zeros(1, robot.nv, dtype=DT, requires_grad=True)
    v, tau = v.requires_grad_(True), tau.requires_grad_(True)
    for fast, eps in ((True, 1e-6), (True, 1e-5), (False, 1e-6)):
        assert torch.autograd.gradcheck(lambda *x, fast=fast: fd(*x, fast), (dq, v, tau), eps=eps,
                                        atol=1e-5 * (eps / 1e-6),
                                        rtol=1e-4)
    # RNEA and the mass matrix through the quaternion coordinates themselves
    qr = q.clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda q: robot.inverse_dynamics(q, v.detach(), tau.detach()), (qr,),
                                    eps=1e-6, atol=1e-5)
    assert torch.autograd.gradcheck(lambda q: robot.mass_matrix(q), (qr,), eps=1e-6, atol=1e-5)


def test_rollout_gradient_matches_finite_differences():
    robot = diffmech.RobotModel(_spec(1), dtype=DT)
    q0, v0, _ = _state(robot, 1, seed=8)
    tau = 0.1 * torch.randn(1, 5, robot.nv, generator=torch.Generator().manual_seed(2), dtype=DT)

    def loss(v0):
        Q, V = rollout(robot, q0, v0, tau, 0.01, integrator="rk4")
        return torch.cat([Q[..., -1, :], V[..., -1, :]], -1)

    assert torch.autograd.gradcheck(loss, (v0.requires_grad_(True),), eps=1e-6, atol=1e-6)


# ------------------------------------------------------------------ rollouts
def _pendulum() -> diffmech.RobotModel:
    links = [LinkSpec("world"), LinkSpec("bob", mass=1.3, com=(0.1, 0.05, -0.6),
                                         inertia=((0.02, 0.001, 0.0), (0.001, 0.03, 0.002), (0.0, 0.002, 0.01)))]
    joints = [JointSpec("ball", "ball", "world", "bob", xyz=(0.0, 0.0, 1.0), rpy=(0.2, -0.1, 0.3))]
    return diffmech.RobotModel(RobotSpec("spherical_pendulum", links, joints), dtype=DT)


@pytest.mark.parametrize("integrator,dt,tol", [("rk4", 2e-3, 1e-8), ("semi_implicit_euler", 1e-3, 5e-3)])
def test_pendulum_energy_and_unit_quaternion(integrator, dt, tol):
    robot = _pendulum()
    q0 = torch.tensor([0.3, -0.5, 0.2, 0.8], dtype=DT)
    q0 = q0 / q0.norm()
    v0 = torch.tensor([1.5, -2.0, 3.0], dtype=DT)
    steps = 1000
    Q, V = rollout(robot, q0, v0, torch.zeros(steps, 3, dtype=DT), dt, integrator=integrator)
    E = robot.kinetic_energy(Q, V) + robot.potential_energy(Q)
    drift = float((E - E[0]).abs().max() / E[0].abs().clamp_min(1.0))
    assert drift < tol, drift
    assert float((Q.norm(dim=-1) - 1).abs().max()) < 1e-13
    # it moves: the pendulum swings through a sizeable angle
    assert float((Q - Q[0]).norm(dim=-1).max()) > 0.3


def test_damping_acts_per_component():
    robot = _pendulum()
    robot.joint_params("ball").damping = torch.tensor(0.7, dtype=DT)
    q = robot.random_configuration(3, generator=torch.Generator().manual_seed(0))
    v = torch.randn(3, 3, dtype=DT)
    passive = robot.bias_forces(q, v, passive=False) - robot.bias_forces(q, v)
    assert torch.allclose(passive, -0.7 * v, atol=1e-13)


# ------------------------------------------------------------------ what is refused
def test_native_kernels_refuse_ball_joints():
    robot = diffmech.RobotModel(_spec(), dtype=DT)
    with pytest.raises(NativeUnavailable, match="ball joints"):
        kernels.prepare(robot, algorithms=("mass_matrix",), gradients=False)
    q, v, tau = _state(robot, 2)
    # the default route falls back to torch (and agrees with the crba route)
    assert torch.allclose(robot.forward_dynamics(q, v, tau), robot.forward_dynamics(q, v, tau, method="crba"),
                          atol=1e-10)


def test_urdf_export_names_the_ball_joint(tmp_path):
    robot = diffmech.RobotModel(_spec(), dtype=DT)
    with pytest.raises(ModelError, match="'j1' is a ball joint"):
        robot.to_urdf(tmp_path / "out.urdf")


def test_bad_ball_specs():
    spec = _spec()
    spec.joints[0].stiffness = 1.0
    with pytest.raises(ModelError, match="j1.*stiffness"):
        diffmech.RobotModel(spec)
    spec = _spec()
    spec.joints[1].mimic = ("j4", 1.0, 0.0)
    with pytest.raises(ModelError, match="mimic.*ball"):
        diffmech.RobotModel(spec)



def test_inverse_kinematics_refuses_ball_joints(tmp_path):
    """The solver steps coordinates as angles: a tree with a ball joint is refused, naming the joint."""
    path = tmp_path / "arm.xml"
    path.write_text("""<mujoco><worldbody><body name="upper"><joint name="shoulder" type="ball"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.04"/>
      <body name="lower" pos="0 0 -0.3"><joint name="elbow" type="hinge" axis="0 1 0"/>
      <geom type="capsule" fromto="0 0 0 0 0 -0.3" size="0.03"/></body></body></worldbody></mujoco>""")
    robot = diffmech.load_mjcf(str(path))
    with pytest.raises(diffmech.errors.ModelError, match="ball joints .*'shoulder'"):
        diffmech.inverse_kinematics(robot, robot.link_names[-1], torch.eye(4, dtype=torch.float64))
