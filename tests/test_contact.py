"""Frictional contact (issue 10): scenes of free bodies and robots, checked against analytic
mechanics, conservation laws, finite differences and MuJoCo. float64 throughout."""

from __future__ import annotations

import math
import warnings

import pytest
import torch

import diffmech
from diffmech.errors import DiffmechError
from diffmech.model import systems
from diffmech.model.collision import Shape, collision_shapes, set_collision_shapes
from diffmech.model.spec import JointSpec, LinkSpec, RobotSpec
from diffmech.sim import Scene, rollout


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    # What users get by default: the solver's sweeps in C (the suite otherwise runs with native
    # kernels off; tests/test_pgs.py checks the C sweeps against the torch ones).
    from diffmech.contact import pgs_native

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)

G = 9.81
F64 = torch.float64


def _state(scene, **place):
    """Neutral scene state with the named free bodies' centres at the given (x, y, z)."""
    q = scene.neutral_configuration().clone()
    for name, xyz in place.items():
        q[scene.slices[name]][:3] = torch.tensor(xyz, dtype=F64)
    return q, torch.zeros(scene.nv, dtype=F64)


def _zeros(scene, T):
    return torch.zeros(T, scene.nv, dtype=F64)


def test_ball_drop_comes_to_rest_on_the_plane():
    scene = Scene([systems.sphere(0.1, 1.0, name="ball")], restitution=0.0)
    q0, v0 = _state(scene, ball=(0.0, 0.0, 0.4))
    st: dict = {}
    Q, V = rollout(scene, q0, v0, _zeros(scene, 600), 1e-3, stats=st)
    pen = 0.1 - Q[:, 2].min()
    # hard contact: the impact step puts the ball on the plane, and it stays (measured: 0 m, 0 m/s)
    assert pen < 1e-12 and abs(float(Q[-1, 2]) - 0.1) < 1e-12
    assert V[-1].abs().max() < 1e-12
    assert st["contact_penetration_max"] < 1e-12


@pytest.mark.parametrize("e", [0.3, 0.5, 0.8])
def test_restitution_rebound_speed(e):
    scene = Scene([systems.sphere(0.05, 0.5, name="ball")], restitution=e)
    q0, v0 = _state(scene, ball=(0.0, 0.0, 0.3))
    Q, V = rollout(scene, q0, v0, _zeros(scene, 400), 1e-3)
    vz = V[:, 2]
    k = int(torch.argmax((vz > 0).to(torch.int8)))  # first step moving up: the bounce
    impact, rebound = -float(vz[k - 1]), float(vz[k])
    assert impact > 1.5
    # Newton's restitution law is what the contact step imposes: exact to rounding (measured 2e-16)
    assert rebound == pytest.approx(e * impact, rel=1e-12)


def _braking_distance(v0: float, a: float, dt: float) -> float:
    """Where semi-implicit Euler stops a body sliding at ``v0`` and decelerated at ``a``: ``v_k = v0 -
    k a dt`` while positive, then 0, and ``x = dt sum_k v_k`` (the continuous ``v0^2 / (2 a)`` less
    about ``v0 dt / 2``)."""
    k = int(v0 / (a * dt))
    return dt * (k * v0 - a * dt * k * (k + 1) / 2)


@pytest.mark.parametrize("mu", [0.3, 0.5, 0.8])
def test_sliding_box_stopping_distance(mu):
    scene = Scene([systems.box((0.2, 0.2, 0.2), 1.0, name="box")], friction=mu)
    q0, v0 = _state(scene, box=(0.0, 0.0, 0.1))
    v0[0] = 1.0
    T = int(1.0 / (mu * G) / 1e-3) + 60
    Q, V = rollout(scene, q0, v0, _zeros(scene, T), 1e-3)
    # the discrete closed form holds to rounding (measured 5e-16 m); the continuous v0^2 / (2 mu g)
    # is 0.3 % to 0.8 % (mu g dt / v0) further
    assert abs(float(Q[-1, 0]) - _braking_distance(1.0, mu * G, 1e-3)) < 1e-12
    assert float(Q[-1, 0]) == pytest.approx(1.0 / (2 * mu * G), rel=mu * G * 1e-3)
    assert V[-1, :3].abs().max() < 1e-12  # stopped, not creeping (measured 6e-15 m/s)
    assert abs(float(Q[-1, 2]) - 0.1) < 1e-12  # and not sunk (measured 3e-17 m)


@pytest.mark.parametrize("ratio", [0.5, 0.9, 1.5, 2.0])
def test_push_against_static_friction(ratio):
    mu, m = 0.5, 2.0
    scene = Scene([systems.box((0.2, 0.2, 0.2), m, name="box")], friction=mu)
    q0, v0 = _state(scene, box=(0.0, 0.0, 0.1))
    T, dt = 300, 1e-3
    tau = _zeros(scene, T)
    F = ratio * mu * m * G
    tau[:, 0] = F  # a horizontal force through the centre of mass (body x = world x here)
    Q, V = rollout(scene, q0, v0, tau, dt)
    if ratio < 1:
        assert Q[:, 0].abs().max() < 1e-14  # measured 2e-18 m
    else:
        a = (F - mu * m * G) / m
        assert float(V[-1, 0]) == pytest.approx(a * T * dt, rel=1e-12)  # exact: measured 6e-15


def test_friction_acts_on_both_bodies_of_a_pair():
    ball, box = systems.sphere(0.05, 0.3, name="ball"), systems.box((0.6, 0.6, 0.1), 2.0, name="box")
    scene = Scene([box, ball], friction=0.6, pairs={("box", "ground"): {"friction": 0.0}})
    q0, v0 = _state(scene, box=(0.0, 0.0, 0.05), ball=(0.0, 0.0, 0.15))
    v0[scene.vslices["ball"]][0] = 1.5  # the ball slides on the box
    Q, V = rollout(scene, q0, v0, _zeros(scene, 300), 1e-3)
    from diffmech.spatial import quat_to_matrix

    def world_v(i):  # a free body's base velocity is in its own frame: rotate to the world
        return (quat_to_matrix(Q[:, 7 * i + 3:7 * i + 7]) @ V[:, 6 * i:6 * i + 3, None])[..., 0]

    px = 2.0 * world_v(0)[:, :2] + 0.3 * world_v(1)[:, :2]
    assert (px - px[0]).abs().max() < 1e-9
    assert float(world_v(0)[-1, 0]) > 0.05  # the box was dragged along


@pytest.mark.slow
def test_stack_of_three_boxes_rests_for_ten_seconds():
    """Equal boxes, so corners of neighbours meet edge on edge (the degenerate case of the box-box
    footprint test); the solver is warm-started from the previous step's impulses."""
    boxes = {f"b{i}": systems.box((0.3, 0.3, 0.2), 1.0, name=f"b{i}") for i in range(3)}
    scene = Scene(boxes, friction=0.8)
    q0, v0 = _state(scene, b0=(0.0, 0.0, 0.1), b1=(0.0, 0.0, 0.3), b2=(0.0, 0.0, 0.5))
    dt, T = 0.01, 1000
    Q, V = rollout(scene, q0, v0, _zeros(scene, T), dt)
    z = Q[:, [2, 9, 16]]
    assert (z - z[0]).abs().max() < 1e-3
    ke = sum(0.5 * (V[:, 6 * i:6 * i + 3] ** 2).sum(-1) + 0.5 * 0.0108 * (V[:, 6 * i + 3:6 * i + 6] ** 2).sum(-1)
             for i in range(3))
    # the first step settles the stack (its solve starts cold); after that no jitter grows
    assert ke.max() < 1e-4 and ke[100:].max() < 1e-8 and ke[-100:].max() <= ke[100:200].max()
    energy = ke + G * z.sum(-1)
    # and the energy does not increase, beyond what the solver's tolerance allows: impulses of about
    # m g dt = 0.1 N s met to 1e-9 relative move a box by ~1e-12 m a step, ~1e-9 m over the 900
    # steps, i.e. ~3e-8 J of potential energy for the stack (measured: 3.5e-9 J, C sweeps)
    assert energy[100:].max() <= energy[100] + 3e-8


def _limited_pendulum(lower, upper):
    spec = RobotSpec("arm", [LinkSpec("base"), LinkSpec("link", mass=1.0, com=(0.0, 0.0, -0.5),
                                                     inertia=((0.01, 0, 0), (0, 0.01, 0), (0, 0, 0.01)))],
                     [JointSpec("j", "revolute", "base", "link", axis=(0.0, 1.0, 0.0), lower=lower, upper=upper)])
    return diffmech.RobotModel(spec)


def test_arm_falling_onto_its_joint_limit_stops_there():
    arm = _limited_pendulum(0.3, 1.2)
    scene = Scene([arm], ground=False)
    q0 = torch.tensor([1.0], dtype=F64)
    Q, V = rollout(scene, q0, torch.zeros(1, dtype=F64), _zeros(scene, 1500), 1e-3)
    # a hard limit: the arm stops on it in the step it reaches it (measured: 0 rad, 0 rad/s)
    assert float(Q[:, 0].min()) > 0.3 - 1e-12
    assert float(Q[-1, 0]) == pytest.approx(0.3, abs=1e-12)
    assert abs(float(V[-1, 0])) < 1e-12
    # without limits it swings through
    Q2, _ = rollout(Scene([arm], ground=False, limits=False), q0, torch.zeros(1, dtype=F64), _zeros(scene, 1500), 1e-3)
    assert float(Q2[:, 0].min()) < 0.0


def test_robot_model_with_contact_true_is_a_one_model_scene():
    ball = systems.sphere(0.1, 1.0, name="ball")
    q0 = ball.neutral_configuration().clone()
    q0[2] = 0.3
    Q, _ = rollout(ball, q0, torch.zeros(6, dtype=F64), torch.zeros(400, 6, dtype=F64), 1e-3, contact=True)
    assert abs(float(Q[-1, 2]) - 0.1) < 1e-12  # measured 0


# ------------------------------------------------------------------ gradients
def _fd(f, x: torch.Tensor, eps=1e-6):
    g = torch.zeros_like(x)
    for i in range(x.numel()):
        d = torch.zeros_like(x)
        d.view(-1)[i] = eps
        g.view(-1)[i] = (f(x + d) - f(x - d)) / (2 * eps)
    return g


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_gradients_match_finite_differences_sliding(adjoint):
    box = systems.box((0.2, 0.2, 0.2), 1.0, name="box")
    box.make_link_param_learnable("body", "mass")

    def run(mu, v0x, tau00, model=box, adj=adjoint):
        scene = Scene([model], friction=mu)
        q0, v0 = _state(scene, box=(0.0, 0.0, 0.1))
        v0 = v0.clone()
        v0[0] = v0x
        tau = _zeros(scene, 80)
        tau = torch.cat([tau[:1] + torch.nn.functional.pad(tau00.reshape(1), (0, 5)), tau[1:]])
        Q, V = rollout(scene, q0, v0, tau, 1e-3, adjoint=adj)
        return Q[-1, 0] + 0.3 * V[-1, 0]

    mu = torch.tensor(0.4, dtype=F64, requires_grad=True)
    v0x = torch.tensor(1.0, dtype=F64, requires_grad=True)
    t00 = torch.tensor(0.5, dtype=F64, requires_grad=True)
    run(mu, v0x, t00).backward()
    with torch.no_grad():
        assert float(mu.grad) == pytest.approx(float(_fd(lambda m: run(m, v0x, t00), mu.detach())), rel=1e-5)
        assert float(v0x.grad) == pytest.approx(float(_fd(lambda v: run(mu, v, t00), v0x.detach())), rel=1e-5)
        assert float(t00.grad) == pytest.approx(float(_fd(lambda t: run(mu, v0x, t), t00.detach())), rel=1e-5)
    g_mass = float(box.link_params("body").mass.grad)
    with torch.no_grad():
        vals = [float(run(mu, v0x, t00, systems.box((0.2, 0.2, 0.2), 1.0 + s * 1e-6, name="box"))) for s in (1, -1)]
    assert g_mass == pytest.approx((vals[0] - vals[1]) / 2e-6, rel=1e-5)
    # the mass enters only through the first step's push (semi-implicit Euler: it moves the box for all T steps)
    assert g_mass == pytest.approx(-0.5 * 1e-3 * (80e-3 + 0.3), rel=1e-6)


def test_gradients_match_finite_differences_bounce():
    ball = systems.sphere(0.05, 0.5, name="ball")

    def run(e, z0, vx):
        scene = Scene([ball], restitution=e, friction=0.3)
        q0, v0 = _state(scene, ball=(0.0, 0.0, 0.0))
        q0 = torch.cat([q0[:2], z0.reshape(1), q0[3:]])
        v0 = torch.cat([vx.reshape(1), v0[1:]])
        Q, V = rollout(scene, q0, v0, _zeros(scene, 300), 1e-3)
        return Q[-1, 2] + 0.5 * Q[-1, 0]

    e = torch.tensor(0.6, dtype=F64, requires_grad=True)
    z0 = torch.tensor(0.25, dtype=F64, requires_grad=True)
    vx = torch.tensor(0.4, dtype=F64, requires_grad=True)
    run(e, z0, vx).backward()
    with torch.no_grad():
        assert float(e.grad) == pytest.approx(float(_fd(lambda x: run(x, z0, vx), e.detach())), rel=1e-4)
        assert float(z0.grad) == pytest.approx(float(_fd(lambda x: run(e, x, vx), z0.detach(), 1e-7)), rel=1e-3)
        assert float(vx.grad) == pytest.approx(float(_fd(lambda x: run(e, z0, x), vx.detach())), rel=1e-4)
    assert e.grad > 0  # a bouncier ball ends higher


# ------------------------------------------------------------------ geometry and scene API
def test_pairs_of_every_supported_kind_meet_at_the_right_distance():
    from diffmech.contact import geometry as geo

    eye = torch.eye(3, dtype=F64)[None]
    p0 = torch.zeros(1, 3, dtype=F64)
    p1 = torch.tensor([[0.0, 0.0, 0.5]], dtype=F64)
    assert float(geo.sphere_sphere(p1, 0.1, p0, 0.2).phi) == pytest.approx(0.2)
    assert float(geo.sphere_box(p1, 0.1, eye, p0, (0.4, 0.4, 0.4)).phi) == pytest.approx(0.2)
    assert float(geo.sphere_capsule(p1, 0.1, eye, p0, (0.05, 0.4)).phi) == pytest.approx(0.5 - 0.1 - 0.2 - 0.05)
    rx = torch.tensor([[[1.0, 0, 0], [0, 0, -1], [0, 1, 0]]], dtype=F64)  # capsule axis along y
    cc = geo.capsule_capsule(eye, p1, (0.05, 0.2), rx, p0, (0.05, 1.0))
    assert float(cc.phi.min()) == pytest.approx(0.5 - 0.1 - 0.05 - 0.05)
    bb = geo.box_box(eye, p1, (0.2, 0.2, 0.2), eye, p0, (1.0, 1.0, 0.4))
    assert float(bb.phi.min()) == pytest.approx(0.5 - 0.1 - 0.2)
    assert torch.allclose(bb.normal[0, bb.phi[0].argmin()], torch.tensor([0.0, 0, 1], dtype=F64))
    cb = geo.capsule_box(rx, p1, (0.05, 0.4), eye, p0, (1.0, 1.0, 0.4))
    assert float(cb.phi.min()) == pytest.approx(0.5 - 0.05 - 0.2)
    pl = geo.plane_candidates("cylinder", (0.1, 0.3), eye, p1)
    assert float(pl.phi.min()) == pytest.approx(0.5 - 0.15)


def test_scene_layout_and_errors():
    a, b = systems.sphere(0.1, 1.0, name="a"), systems.box((0.1, 0.1, 0.1), 1.0, name="b")
    arm = _limited_pendulum(-1.0, 1.0)
    scene = Scene({"a": a, "arm": arm, "b": b})
    assert (scene.nq, scene.nv) == (15, 13)
    assert scene.slices["arm"] == slice(7, 8) and scene.vslices["b"] == slice(7, 13)
    assert scene.random_configuration(4, 2).shape == (4, 2, 15)
    assert scene.coefficients("a", "ground") == (0.5, 0.0)
    with pytest.raises(DiffmechError, match="unique"):
        Scene([a, systems.sphere(0.1, 1.0, name="a")])
    with pytest.raises(DiffmechError, match="unknown model 'c'"):
        Scene([a, b], pairs={("a", "c"): {"friction": 0.1}})
    with pytest.raises(DiffmechError, match="non-negative"):
        Scene([a], friction=-0.1)
    with pytest.raises(DiffmechError, match="nq=15"):
        rollout(scene, torch.zeros(14, dtype=F64), torch.zeros(13, dtype=F64), torch.zeros(3, 13, dtype=F64), 1e-3)


def test_collision_shapes_from_urdf_and_set_by_hand():
    urdf = """<robot name="r"><link name="a"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1"
    ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="0 0 0.1"/><geometry><sphere radius="0.05"/></geometry></collision>
    <collision><geometry><box size="0.1 0.2 0.3"/></geometry></collision>
    <collision><geometry><mesh filename="x.stl"/></geometry></collision></link>
    <link name="b"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial>
    </link><joint name="j" type="revolute"><parent link="a"/><child link="b"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1" effort="1" velocity="1"/></joint></robot>"""
    robot = diffmech.load_urdf(urdf)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        shapes = collision_shapes(robot)
    assert [s.kind for s in shapes["a"]] == ["sphere", "box"]
    assert shapes["a"][0].xyz == (0.0, 0.0, 0.1) and shapes["a"][1].size == (0.1, 0.2, 0.3)
    assert any("mesh" in str(x.message) and "'a'" in str(x.message) for x in w)
    set_collision_shapes(robot, "b", Shape("capsule", (0.02, 0.3)))
    assert collision_shapes(robot)["b"][0].kind == "capsule"
    with pytest.raises(DiffmechError, match="no link named"):
        set_collision_shapes(robot, "zz", Shape("sphere", (1.0,)))
    with pytest.raises(DiffmechError, match="size"):
        Shape("box", (1.0, 2.0))


# ------------------------------------------------------------------ MuJoCo
def _mujoco_run(xml, qpos, qvel, steps):
    mujoco = pytest.importorskip("mujoco")
    m = mujoco.MjModel.from_xml_string(xml)
    d = mujoco.MjData(m)
    d.qpos[:] = qpos
    d.qvel[:] = qvel
    out = []
    for _ in range(steps):
        mujoco.mj_step(m, d)
        out.append(d.qpos.copy())
    import numpy as np

    return np.array(out)


_MJ = """<mujoco><option timestep="0.001" cone="elliptic" impratio="1"/><worldbody>
<geom type="plane" size="5 5 0.1" friction="{mu} 0 0"/>
<body pos="0 0 0"><freejoint/>{geom}</body></worldbody></mujoco>"""


def test_against_mujoco_ball_drop():
    """Both rest the ball on the plane; MuJoCo's soft contact lets it sink by its constraint
    compliance (solref 0.02 s): a fraction of a millimetre, the difference asserted below."""
    xml = _MJ.format(mu=0.5, geom='<geom type="sphere" size="0.1" mass="1"/>')
    mj = _mujoco_run(xml, [0, 0, 0.4, 1, 0, 0, 0], [0] * 6, 600)
    scene = Scene([systems.sphere(0.1, 1.0, name="ball")])
    q0, v0 = _state(scene, ball=(0.0, 0.0, 0.4))
    Q, _ = rollout(scene, q0, v0, _zeros(scene, 600), 1e-3)
    z = Q[1:, 2].numpy()
    assert abs(z[-1] - mj[-1, 2]) < 5e-4  # MuJoCo's ball rests 3.7e-4 m lower (measured, mujoco 3)
    import numpy as np

    falling = mj[:, 2] > 0.11  # identical free fall (both semi-implicit Euler) before the impact
    assert np.abs(z[falling] - mj[falling, 2]).max() < 1e-12  # measured 0


def test_against_mujoco_sliding_box():
    """Stopping distance of a box pushed at 1 m/s; MuJoCo's elliptic cone with soft constraints
    lets the box creep slightly during deceleration, so the two differ by 0.2 %."""
    mu = 0.5
    xml = _MJ.format(mu=mu, geom=f'<geom type="box" size="0.1 0.1 0.1" mass="1" friction="{mu} 0 0"/>')
    mj = _mujoco_run(xml, [0, 0, 0.1, 1, 0, 0, 0], [1, 0, 0, 0, 0, 0], 400)
    scene = Scene([systems.box((0.2, 0.2, 0.2), 1.0, name="box")], friction=mu)
    q0, v0 = _state(scene, box=(0.0, 0.0, 0.1))
    v0[0] = 1.0
    Q, _ = rollout(scene, q0, v0, _zeros(scene, 400), 1e-3)
    assert abs(float(Q[-1, 0]) - _braking_distance(1.0, mu * G, 1e-3)) < 1e-12  # measured 2e-16 m
    # MuJoCo's box slides 0.21 % further (measured; its trajectory differs by at most 2.4e-4 m)
    assert mj[-1, 0] == pytest.approx(float(Q[-1, 0]), rel=5e-3)


def test_against_mujoco_falling_capsule():
    """A capsule dropped tilted lands and lies flat: final height equals the radius in both."""
    xml = _MJ.format(mu=0.5, geom='<geom type="capsule" size="0.05 0.15" mass="1"/>')
    ang = 0.3
    quat_wxyz = [math.cos(ang / 2), math.sin(ang / 2), 0, 0]
    mj = _mujoco_run(xml, [0, 0, 0.4] + quat_wxyz, [0] * 6, 1500)
    scene = Scene([systems.capsule(0.05, 0.3, 1.0, name="cap")])
    q0, v0 = _state(scene, cap=(0.0, 0.0, 0.4))
    q0[3:7] = torch.tensor([math.sin(ang / 2), 0, 0, math.cos(ang / 2)], dtype=F64)
    Q, V = rollout(scene, q0, v0, _zeros(scene, 1500), 1e-3)
    assert float(Q[-1, 2]) == pytest.approx(0.05, abs=1e-12)  # measured 3e-17 m
    # MuJoCo's soft contact lets the capsule sink 2.1e-4 m (measured, mujoco 3)
    assert mj[-1, 2] == pytest.approx(float(Q[-1, 2]), abs=5e-4)
    assert V[-1].abs().max() < 1e-10  # measured 1e-13


def test_policy_gradients_checkpoint_equal_autograd():
    """An nn.Module policy ``tau = f(t, q, v)`` pushing a sliding box: the checkpointed backward (which
    evaluates the policy again at every stored state) gives autograd's gradients; a batch of two
    environments."""
    torch.manual_seed(0)
    box = systems.box((0.2, 0.2, 0.2), 1.0, name="box")
    scene = Scene([box], friction=0.5)
    policy = torch.nn.Sequential(torch.nn.Linear(13, 6)).double()
    q0, v0 = _state(scene, box=(0.0, 0.0, 0.1))
    q0 = torch.stack([q0, q0])
    v0 = torch.stack([v0, v0])
    v0[1, 0] = 0.5

    def pol(t, q, v):
        return 3.0 * torch.tanh(policy(torch.cat([q, v], -1))) * torch.tensor([1.0, 1.0, 0, 0, 0, 0], dtype=F64)

    grads = []
    for adj in ("checkpoint", "autograd"):
        policy.zero_grad()
        Q, V = rollout(scene, q0, v0, pol, 1e-3, steps=60, adjoint=adj, params=list(policy.parameters()))
        (Q[:, -1, 0].sum() + V[:, -1, 1].sum()).backward()
        grads.append([p.grad.clone() for p in policy.parameters()])
    for a, b in zip(*grads):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-12)
    assert grads[0][0].abs().sum() > 0
    with pytest.raises(DiffmechError, match="params="):
        rollout(scene, q0, v0, pol, 1e-3, steps=5)


def test_urdf_contact_friction_applies_where_pairs_do_not():
    # A box described in URDF with <contact><lateral_friction value="0.2"/>: sliding at v0 it stops
    # after v0^2 / (2 * 0.2 g), not with the scene's 0.8; a pairs entry overrides the URDF.
    urdf = """<robot name="crate"><link name="body"><contact><lateral_friction value="0.2"/>
    <restitution value="0.1"/></contact><inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01"
    izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial><collision><geometry><box size="0.2 0.2 0.2"/>
    </geometry></collision></link></robot>"""
    from diffmech.model.collision import contact_coefficients

    box = diffmech.load_urdf(urdf, floating_base=True)
    assert contact_coefficients(box) == {"body": {"friction": 0.2, "restitution": 0.1}}
    for pairs, mu in ((None, 0.2), ({("crate", "ground"): {"friction": 0.5}}, 0.5)):
        scene = Scene([box], friction=0.8, pairs=pairs)
        assert scene.coefficients("crate", "ground", "body", None)[0] == mu
        q0, v0 = _state(scene, crate=(0.0, 0.0, 0.1))
        v0 = v0.clone()
        v0[0] = 1.0
        Q, _ = rollout(scene, q0, v0, _zeros(scene, 800), 1e-3)
        assert abs(float(Q[-1, 0]) - _braking_distance(1.0, mu * G, 1e-3)) < 1e-12  # measured 6e-16 m
    bad = urdf.replace('value="0.2"', 'value="-1"')
    with pytest.raises(DiffmechError, match="lateral_friction"):
        contact_coefficients(diffmech.load_urdf(bad, floating_base=True))


def test_drives_hold_a_pendulum_at_the_spring_equilibrium_and_their_gains_get_gradients():
    # A one-link pendulum (no contact) under gravity held by a joint spring kp: at rest where
    # kp (q_ref - q) = m g l sin(q) (the static balance, solved by Newton here), stable at dt 1e-2
    # even with kp 1e5 (implicit in the velocity); d q_final / d kp against central differences.
    m, l, g = 1.0, 0.5, 9.81
    links = [LinkSpec("base"), LinkSpec("arm", mass=m, com=(0.0, 0.0, -l), inertia=((1e-3, 0, 0), (0, 1e-3, 0),
                                                                                 (0, 0, 1e-3)))]
    joints = [JointSpec("j", "continuous", "base", "arm", axis=(0.0, 1.0, 0.0))]
    arm = diffmech.RobotModel(RobotSpec("arm", links, joints), dtype=F64)

    def final(kp, ref=0.5, kd=2.0, T=3000, dt=1e-3):
        scene = Scene([arm], ground=False, drives={"arm": {"stiffness": kp, "damping": kd, "target": [ref]}})
        Q, _ = rollout(scene, torch.zeros(1, dtype=F64), torch.zeros(1, dtype=F64), _zeros(scene, T), dt)
        return Q[-1, 0]

    kp = torch.tensor(20.0, dtype=F64, requires_grad=True)
    q = final(kp)
    x = torch.tensor(0.3, dtype=F64)
    for _ in range(50):  # kp (0.5 - x) = m g l sin x
        x = x - (20.0 * (0.5 - x) - m * g * l * torch.sin(x)) / (-20.0 - m * g * l * torch.cos(x))
    assert q.item() == pytest.approx(float(x), abs=1e-6)
    q.backward()
    with torch.no_grad():
        fd = (final(torch.tensor(20.0 + 1e-4, dtype=F64)) - final(torch.tensor(20.0 - 1e-4, dtype=F64))) / 2e-4
    assert float(kp.grad) == pytest.approx(float(fd), rel=1e-5)
    stiff = final(1e5, kd=0.0, T=300, dt=1e-2)  # explicit springs would blow up here
    assert float(stiff) == pytest.approx(0.5, abs=1e-3)
    with pytest.raises(DiffmechError, match="stiffness"):
        Scene([arm], drives={"arm": {"stiffness": [1.0, 2.0]}})
    with pytest.raises(DiffmechError, match="no model"):
        Scene([arm], drives={"leg": {"stiffness": 1.0}})


def test_free_bodies_together_equal_the_per_model_path(monkeypatch):
    """Two or more free bodies are stepped together in closed form (contact_step._free_body_dynamics);
    the states and every gradient (states, torques, a learnable mass, the inertia) equal those of the
    rigid-body algorithms called per model, with an off-centre mass and a full inertia matrix."""
    import importlib

    cs = importlib.import_module("diffmech.sim.contact_step")  # the module (diffmech.sim exports the function)

    def build():
        box = systems.box((0.3, 0.2, 0.1), 1.3, name="box")
        with torch.no_grad():
            lp = box.link_params("body")
            lp.com.copy_(torch.tensor([0.02, -0.01, 0.015], dtype=F64))
            extra = [[0.002, 0.0005, -0.0003], [0.0005, 0.001, 0.0002], [-0.0003, 0.0002, 0.003]]
            lp.inertia.add_(torch.tensor(extra, dtype=F64))
        box.make_link_param_learnable("body", "mass")
        box.make_link_param_learnable("body", "inertia")
        return Scene([box, systems.sphere(0.05, 0.4, name="ball"), systems.capsule(0.03, 0.2, 0.3, name="rod")],
                     friction=0.4, restitution=0.3)

    original, use = cs._free_bodies, [True]
    monkeypatch.setattr(cs, "_free_bodies", lambda scene: original(scene) if use[0] else [])

    def run(together: bool):
        use[0] = together
        scene = build()
        assert bool(cs._free_bodies(scene)) == together
        q0, v0 = _state(scene, box=(0.0, 0.0, 0.07), ball=(0.05, 0.02, 0.25), rod=(0.4, 0.0, 0.2))
        v0 = v0.clone()
        v0[scene.vslices["box"]] = torch.tensor([0.4, -0.1, 0.0, 0.5, 1.0, -2.0], dtype=F64)
        v0[scene.vslices["rod"]] = torch.tensor([-0.3, 0.2, 0.1, 3.0, 0.0, 1.0], dtype=F64)
        v0.requires_grad_(True)
        tau = (0.1 * torch.randn(120, scene.nv, generator=torch.Generator().manual_seed(0), dtype=F64)
               ).requires_grad_(True)
        Q, V = rollout(scene, q0, v0, tau, 2e-3)
        loss = Q[-1].square().sum() + V[-1].square().sum()
        lp = scene.models["box"].link_params("body")
        return (Q.detach(), V.detach(), *torch.autograd.grad(loss, [v0, tau, lp.mass, lp.inertia]))

    per_model, together = run(False), run(True)
    for name, a, b in zip(("Q", "V", "dv0", "dtau", "dmass", "dinertia"), together, per_model):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10, msg=lambda m, name=name: f"{name}: {m}")


def test_contact_step_any_batch_shape_and_bad_shapes():
    """``diffmech.sim.contact_step`` takes ``(..., n)`` like the rest of the library: an unbatched state
    and a (2, 3) batch give the rows of the flattened call; a wrong width is a ShapeError naming it."""
    from diffmech.errors import ShapeError
    from diffmech.sim import contact_step

    scene = Scene([systems.sphere(0.1, 1.0, name="ball"), systems.box((0.2, 0.3, 0.1), 2.0, name="crate")])
    q, v = _state(scene, ball=(0.0, 0.0, 0.095), crate=(0.5, 0.0, 0.049))
    v[scene.slices["ball"]][0] = 0.3
    g = torch.Generator().manual_seed(0)
    Q = q.expand(2, 3, -1).clone()
    V = v + 0.1 * torch.rand(2, 3, scene.nv, generator=g, dtype=F64)
    tau = torch.rand(2, 3, scene.nv, generator=g, dtype=F64)
    q1, v1 = contact_step(scene, Q.reshape(6, -1), V.reshape(6, -1), tau.reshape(6, -1), 1e-3)
    q2, v2 = contact_step(scene, Q, V, tau, 1e-3)
    assert q2.shape == (2, 3, scene.nq) and v2.shape == (2, 3, scene.nv)
    torch.testing.assert_close(q2.reshape(6, -1), q1, rtol=0, atol=1e-14)
    torch.testing.assert_close(v2.reshape(6, -1), v1, rtol=0, atol=1e-14)
    q3, v3 = contact_step(scene, Q[1, 2], V[1, 2], tau[1, 2], 1e-3)  # unbatched
    assert q3.shape == (scene.nq,)
    torch.testing.assert_close(v3, v1[5], rtol=0, atol=1e-14)
    with pytest.raises(ShapeError, match="tau"):
        contact_step(scene, Q, V, tau[..., :-1], 1e-3)
    with pytest.raises(ShapeError, match="broadcast"):
        contact_step(scene, Q, V, tau[:, :2], 1e-3)


def test_batched_ground_candidates_equal_the_narrow_phase_shape_by_shape():
    """The contact step tests the spheres and capsules near the ground in one batched pass per kind:
    the same gaps and points as :func:`geometry.plane_candidates` shape by shape, with shape offsets
    (rpy, xyz) in their links and sizes given as tensors that receive gradients."""
    import importlib

    from diffmech.contact import geometry as geo

    cs = importlib.import_module("diffmech.sim.contact_step")
    g = torch.Generator().manual_seed(3)
    B, N = 5, 6
    R = torch.linalg.qr(torch.randn(B, N, 3, 3, dtype=F64, generator=g))[0]
    p = torch.randn(B, N, 3, dtype=F64, generator=g) * 0.1 + torch.tensor([0.0, 0.0, 0.1], dtype=F64)
    size_t = torch.tensor([0.04, 0.3], dtype=F64, requires_grad=True)
    kinds = ["sphere", "capsule", "sphere", "capsule", "box", "capsule"]
    sizes = [(0.05,), (0.03, 0.2), (0.02,), size_t, (0.1, 0.2, 0.05), (0.01, 0.5)]
    items = [("m", f"l{i}", Shape(k, tuple(float(x) for x in (s.detach() if isinstance(s, torch.Tensor) else s))),
              s, 1.0, i) for i, (k, s) in enumerate(zip(kinds, sizes))]
    got = cs._ground_candidates(items, list(range(N)), R, p)
    want = {i: geo.plane_candidates(kinds[i], sizes[i], R[:, i], p[:, i]) for i in range(N)}
    at = 0
    for i, count in zip([k[0] for k in got.keys], got.counts):
        assert count == want[i].phi.shape[1]
        torch.testing.assert_close(got.phi[:, at:at + count], want[i].phi, rtol=0, atol=1e-15)
        torch.testing.assert_close(got.point[:, at:at + count], want[i].point, rtol=0, atol=1e-15)
        at += count
    assert at == got.phi.shape[1] and sorted(k[0] for k in got.keys) == list(range(N))
    g1 = torch.autograd.grad(got.phi.sum(), size_t)[0]
    g2 = torch.autograd.grad(want[3].phi.sum(), size_t)[0]
    torch.testing.assert_close(g1, g2, rtol=0, atol=1e-15)
