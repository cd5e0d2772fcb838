"""Static models (a URDF without a moving joint: ``nq = nv = 0``) and MJCF static geoms as fixed
obstacles of a :class:`~diffmech.sim.Scene`.

Oracles: Pinocchio (``nq``/``nv`` and the links' placements of joint-less URDFs), analytic rest
heights and contact forces, MuJoCo's ``mj_step`` (rest height on an MJCF static box, up to its soft
contact's penetration, computed from ``solref``/``solimp``) and central differences at two step sizes.
"""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import pytest
import torch

import diffmech
from diffmech.dynamics.kernels import native_mode
from diffmech.errors import ModelError
from diffmech.model import systems
from diffmech.sim import Scene, contact_step, rollout

pin = pytest.importorskip("pinocchio")
pybullet_data = pytest.importorskip("pybullet_data")

F64 = dict(dtype=torch.float64)
DATA = pybullet_data.getDataPath()
TABLE = os.path.join(DATA, "table", "table.urdf")  # one link, a box 1.5 x 1 x 0.05 centred at z = 0.6
TABLE_TOP = 0.6 + 0.025
PLANE = os.path.join(DATA, "plane.urdf")  # one link, a box 200 x 200 x 10 centred at z = -5

# A joint-less tree of three links: fixed joints with offsets and rotations (a ramp on a stand).
RAMP = """<robot name="ramp">
  <link name="stand"><collision><origin xyz="0 0 0.1"/><geometry><box size="1 1 0.2"/></geometry></collision></link>
  <link name="slope"><collision><geometry><box size="1 0.5 0.02"/></geometry></collision></link>
  <link name="marker"/>
  <joint name="stand_slope" type="fixed"><parent link="stand"/><child link="slope"/>
    <origin xyz="0.1 -0.2 0.4" rpy="0.1 0.3 -0.2"/></joint>
  <joint name="slope_marker" type="fixed"><parent link="slope"/><child link="marker"/>
    <origin xyz="0.5 0 0.01" rpy="0 0 1.0"/></joint>
</robot>"""

# A one-DoF arm: a massive rod along +x turning about +y at height H, a sphere of radius R at its tip.
H, L, R, C, M = 0.5, 0.5, 0.05, 0.25, 1.0
ARM = f"""<robot name="arm">
  <link name="base"><inertial><mass value="1"/><inertia ixx="1" iyy="1" izz="1" ixy="0" ixz="0" iyz="0"/></inertial>
  </link>
  <link name="arm"><inertial><origin xyz="{C} 0 0"/><mass value="{M}"/>
    <inertia ixx="1e-3" iyy="0.02" izz="0.02" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision><origin xyz="{L} 0 0"/><geometry><sphere radius="{R}"/></geometry></collision></link>
  <joint name="shoulder" type="continuous"><parent link="base"/><child link="arm"/>
    <origin xyz="0 0 {H}"/><axis xyz="0 1 0"/></joint>
</robot>"""
TH = math.pi / 6  # the arm's angle below the horizontal when its tip rests on the block
TOP = H - L * math.sin(TH) - R  # the block's top
BLOCK = f"""<robot name="block"><link name="block">
  <collision><origin xyz="{L * math.cos(TH)} 0 {TOP / 2}"/><geometry><box size="0.3 0.3 {TOP}"/></geometry></collision>
</link></robot>"""


def _load(path_or_xml):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # massless base links, meshes of visuals
        return diffmech.load_urdf(path_or_xml)


def _pin_placements(path: str) -> tuple[pin.Model, dict]:
    model = pin.buildModelFromUrdf(path)
    data = model.createData()
    pin.framesForwardKinematics(model, data, np.zeros(model.nq))
    return model, {f.name: data.oMf[i].homogeneous for i, f in enumerate(model.frames) if f.type == pin.BODY}


@pytest.mark.parametrize("which", ["table", "plane", "ramp"])
def test_static_urdf_matches_pinocchio(which, tmp_path):
    path = {"table": TABLE, "plane": PLANE}.get(which)
    if path is None:
        path = str(tmp_path / "ramp.urdf")
        with open(path, "w") as f:
            f.write(RAMP)
    robot = _load(path)
    model, placements = _pin_placements(path)
    assert (robot.nq, robot.nv) == (model.nq, model.nv) == (0, 0)
    assert robot.tree.nb == 0 and list(robot.joint_names) == []
    T = robot.forward_kinematics(torch.zeros(0, **F64))  # (n_links, 4, 4)
    assert set(placements) == set(robot.link_names)
    for i, link in enumerate(robot.link_names):
        np.testing.assert_allclose(T[i].numpy(), placements[link], rtol=0, atol=1e-14)
    # batched: the same placements for every element
    Tb = robot.forward_kinematics(torch.zeros(2, 3, 0, **F64))
    assert Tb.shape == (2, 3, robot.n_links, 4, 4) and torch.equal(Tb, T.expand_as(Tb))


def test_static_model_dynamics_are_empty():
    """Every joint-space quantity of a static model is empty (no DoF); kinetic energy is zero; the
    kinematic ones (poses) are those of the fixed links; a rollout of it alone is refused."""
    robot = _load(RAMP)
    for batch in ((), (4,), (2, 3)):
        q = torch.zeros(*batch, 0, **F64)
        assert robot.inverse_dynamics(q, q, q).shape == (*batch, 0)
        assert robot.bias_forces(q, q).shape == (*batch, 0)
        assert robot.generalized_gravity(q).shape == (*batch, 0)
        assert robot.mass_matrix(q).shape == (*batch, 0, 0)
        assert robot.forward_dynamics(q, q, q).shape == (*batch, 0)
        assert robot.jacobian(q, "slope").shape == (*batch, 6, 0)
        assert robot.integrate(q, q, 0.01).shape == (*batch, 0)
        ke = robot.kinetic_energy(q, q)
        assert ke.shape == batch and bool((ke == 0).all())
        T = robot.link_pose(q, "marker")
        assert T.shape == (*batch, 4, 4)
    assert robot.neutral_configuration().shape == (0,)
    assert robot.random_configuration(5).shape == (5, 0)
    with pytest.raises(diffmech.errors.ShapeError):
        robot.forward_kinematics(torch.zeros(3, **F64))  # nq = 0: a (..., 0) configuration
    q = torch.zeros(0, **F64)
    with pytest.raises(ModelError, match="static model .* nothing to integrate"):  # a rollout alone: meaningless
        rollout(robot, q, q, torch.zeros(5, 0, **F64), 0.01)


def _table_scene(**kw):
    table = _load(TABLE)
    ball = systems.sphere(radius=0.1, mass=1.0, name="ball")
    box = systems.box(size=(0.2, 0.3, 0.2), mass=2.0, name="box")
    return Scene({"ball": ball, "table": table, "box": box}, **kw)


def test_scene_layout_with_a_static_model():
    scene = _table_scene()
    assert scene.static == ["table"]
    assert scene.nq == 14 and scene.nv == 12
    assert scene.slices["table"] == slice(7, 7) and scene.vslices["table"] == slice(6, 6)
    assert scene.neutral_configuration().shape == (14,)
    assert scene.random_configuration(3).shape == (3, 14)
    q = scene.neutral_configuration()
    assert scene.split(q)["table"].shape == (0,)
    q = scene.place_on_ground(q)  # the free bodies only: the table stays where it is
    assert torch.allclose(q[2], torch.tensor(0.1, **F64)) and torch.allclose(q[9], torch.tensor(0.1, **F64))
    with pytest.raises(ModelError, match="fixed base"):
        scene.place_on_ground(q, "table")
    assert "table" not in scene.penetration(q)  # an obstacle may reach into the ground
    depth, link = scene.penetration(q, "table")["table"]  # asked for by name: its lowest point, z = 0.575
    assert float(depth) == 0.0 and link == "baseLink"
    from diffmech.sim.render import scene_lines

    assert "table" in dict(scene_lines(scene, q))
    with pytest.raises(ModelError, match="every model is static"):
        Scene({"table": _load(TABLE)})
    info = {}
    with native_mode("auto"):  # the native ground route serves one model alone; it says why not
        contact_step(scene, q[None], torch.zeros(1, 12, **F64), torch.zeros(1, 12, **F64), 0.01, info)
    assert info["route"] == "torch: 3 models in the scene"


def test_bodies_come_to_rest_on_the_table():
    """A sphere (radius 0.1) and a box (height 0.2) dropped on the table top (z = 0.625) rest with
    their centres at 0.725; the table is not pushed (it has no state) and the ground is never touched."""
    scene = _table_scene()
    q0 = torch.tensor([0.3, 0.2, 0.8, 0, 0, 0, 1, -0.3, -0.2, 0.78, 0, 0, 0, 1], **F64)
    v0 = torch.zeros(12, **F64)
    Q, V = rollout(scene, q0, v0, torch.zeros(60, 12, **F64), 0.005)
    want = TABLE_TOP + 0.1
    # measured: heights 0 and 4e-16 m off, velocities 1.2e-13, horizontal drift 4.4e-13 m
    assert abs(float(Q[-1, 2]) - want) < 1e-12 and abs(float(Q[-1, 9]) - want) < 1e-12
    assert float(V[-1].abs().max()) < 1e-11
    np.testing.assert_allclose(Q[-1, [0, 1, 7, 8]].numpy(), [0.3, 0.2, -0.3, -0.2], rtol=0, atol=1e-11)


def test_gradient_wrt_an_obstacle_size():
    """The table top's dimensions as a differentiable ``sizes`` entry: a sphere resting on it sits at
    ``0.6 + lz / 2 + r``, so the gradient of its height is ``(0, 0, 1/2)``, and central differences
    at two step sizes agree."""
    table, ball = _load(TABLE), systems.sphere(radius=0.1, mass=1.0, name="ball")
    size = torch.tensor([1.5, 1.0, 0.05], **F64, requires_grad=True)
    scene = Scene({"ball": ball, "table": table}, sizes={("table", "baseLink"): size})
    # 0.5 mm above the top: at rest after 2 of the 10 steps
    q0, v0, tau = torch.tensor([0.0, 0, 0.7255, 0, 0, 0, 1], **F64), torch.zeros(6, **F64), torch.zeros(10, 6, **F64)
    Q, _ = rollout(scene, q0, v0, tau, 0.005)
    (g,) = torch.autograd.grad(Q[-1, 2], size)
    np.testing.assert_allclose(g.numpy(), [0.0, 0.0, 0.5], rtol=0, atol=1e-12)  # measured: exact
    with torch.no_grad():
        for h in (1e-6, 1e-5):
            fd = []
            for i in (0, 2):  # a horizontal side (no effect) and the height
                e = torch.zeros(3, **F64)
                e[i] = h
                scene.shape_sizes[("table", "baseLink", 0)] = size + e
                a = rollout(scene, q0, v0, tau, 0.005)[0][-1, 2]
                scene.shape_sizes[("table", "baseLink", 0)] = size - e
                b = rollout(scene, q0, v0, tau, 0.005)[0][-1, 2]
                fd.append(float(a - b) / (2 * h))
            np.testing.assert_allclose(fd, g.numpy()[[0, 2]], rtol=0, atol=5e-10)  # measured 4.1e-11 (rounding / h)


def test_plane_urdf_is_a_floor():
    """pybullet's ``plane.urdf`` (a 10 m thick box below z = 0) as the only floor (no ground)."""
    plane = _load(PLANE)
    ball = systems.sphere(radius=0.05, mass=0.5, name="ball")
    scene = Scene({"plane": plane, "ball": ball}, ground=False)
    q = torch.tensor([0.0, 0.0, 0.1, 0, 0, 0, 1], **F64)
    Q, _ = rollout(scene, q, torch.zeros(6, **F64), torch.zeros(50, 6, **F64), 0.005)
    assert abs(float(Q[-1, 2]) - 0.05) < 1e-12  # measured 2.4e-16


def test_arm_presses_on_a_static_block():
    """A one-DoF arm pushed down by a joint torque onto a static block settles with its tip sphere on
    the block's top (angle ``TH``), the normal impulse per step balancing gravity and the torque:
    ``N = (m g c cos TH + tau) / (L cos TH)`` (frictionless pair: the tangential impulse is zero)."""
    arm, block = _load(ARM), _load(BLOCK)
    scene = Scene({"arm": arm, "block": block}, pairs={("arm", "block"): {"friction": 0.0}})
    dt, tau = 0.002, 0.3
    q, v = torch.tensor([TH - 0.05], **F64), torch.zeros(1, **F64)
    info: dict = {}
    for _ in range(100):  # at rest from step 50 on
        q, v = contact_step(scene, q, v, torch.tensor([tau], **F64), dt, info, warm=info.get("lam"))
    assert abs(float(q[0]) - TH) < 1e-12  # measured 1.1e-16
    assert abs(float(v[0])) < 1e-12  # measured 3.2e-15
    (key, lam), = info["lam"].items()
    N = (M * 9.81 * C * math.cos(TH) + tau) / (L * math.cos(TH))
    assert abs(float(lam[0, 0]) / dt - N) < 1e-12 * N  # measured 1.6e-16 relative
    assert float(lam[0, 1:].abs().max()) == 0.0


@pytest.mark.slow
def test_gradients_through_a_static_contact():
    """The arm falls onto the block with restitution 0.5 and bounces: the gradient of the final
    angle and velocity w.r.t. the initial state and the arm's mass (a learnable parameter) equals
    central differences at two step sizes."""
    arm, block = _load(ARM), _load(BLOCK)
    arm.make_link_param_learnable("arm", "mass")
    (mass,) = [p for p in arm.parameters() if p.requires_grad]
    scene = Scene({"arm": arm, "block": block}, restitution=0.5, bounce_speed=1e-3)
    dt, T = 0.002, 30
    tau = torch.full((T, 1), 0.2, **F64)
    q0 = torch.tensor([TH - 0.05], **F64, requires_grad=True)
    v0 = torch.tensor([1.0], **F64, requires_grad=True)

    def loss(Q, V):
        return Q[..., -1, 0] + 0.1 * V[..., -1, 0]

    Q, V = rollout(scene, q0, v0, tau, dt)
    assert float(Q[:, 0].detach().max()) > TH - 0.01 and float(V[:, 0].detach().min()) < -0.1  # it hit and bounced
    g = torch.autograd.grad(loss(Q, V), [q0, v0, mass])
    for h in (1e-6, 1e-5):
        with torch.no_grad():
            e = torch.tensor([[h, 0], [-h, 0], [0, h], [0, -h]], **F64)  # the state's four in one batch
            Qb, Vb = rollout(scene, q0.detach() + e[:, :1], v0.detach() + e[:, 1:], tau, dt)
            lb = loss(Qb, Vb)
            fd = [float(lb[0] - lb[1]) / (2 * h), float(lb[2] - lb[3]) / (2 * h)]
            m0 = mass.detach().clone()
            mass.copy_(m0 + h)
            a = loss(*rollout(scene, q0, v0, tau, dt))
            mass.copy_(m0 - h)
            b = loss(*rollout(scene, q0, v0, tau, dt))
            mass.copy_(m0)
            fd.append(float(a - b) / (2 * h))
        # measured: 1.8e-8 relative at most, alike at both step sizes (the solver's tolerance, not truncation)
        np.testing.assert_allclose([float(x) for x in g], fd, rtol=1e-7, atol=0)


MJCF = """<mujoco model="drop">
  <option timestep="0.002"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" friction="0.8"/>
    <geom name="block" type="box" pos="0 0 0.2" size="0.3 0.3 0.2"/>
    <body name="shelf" pos="1 0 0.5"><geom name="shelf_box" type="box" size="0.2 0.2 0.05"/></body>
    <body name="ball" pos="0.05 0.02 0.52">
      <freejoint/>
      <geom name="ball_geom" type="sphere" size="0.1" mass="1"/>
    </body>
  </worldbody>
</mujoco>"""


def _mujoco_penetration(g: float, timestep: float) -> float:
    """MuJoCo's resting penetration of one contact under gravity ``g`` with the default ``solref =
    (0.02, 1)`` and ``solimp = (0.9, 0.95, 0.001, 0.5, 2)``: at rest the constraint's acceleration
    ``a1 = d a_ref + (1 - d) a0`` is zero with ``a_ref = -k r`` and ``a0 = -g``, so ``r = (1 - d) g /
    (d k)``, ``k = d / (dwidth^2 timeconst^2 dampratio^2)``, ``d = d(r)`` the impedance (MuJoCo's docs,
    "Solver parameters"); solved by bisection."""
    d0, dw, width, mid, power = 0.9, 0.95, 0.001, 0.5, 2.0
    tc = max(0.02, 2 * timestep)

    def d(r):
        x = min(r / width, 1.0)
        y = x ** power / mid ** (power - 1) if x <= mid else 1 - (1 - x) ** power / (1 - mid) ** (power - 1)
        return d0 + y * (dw - d0)

    def f(r):
        dd = d(r)
        return r - (1 - dd) * g / (dd * dd / (dw * dw * tc * tc))

    lo, hi = 0.0, width
    for _ in range(200):
        m = 0.5 * (lo + hi)
        lo, hi = (m, hi) if f(m) < 0 else (lo, m)
    return 0.5 * (lo + hi)


def test_mjcf_static_geoms_are_obstacles(tmp_path):
    """``Scene.from_mjcf``: the world's box and the joint-less body ``shelf`` are one static model;
    a ball dropped on the box rests on its top (z = 0.4 + 0.1) where MuJoCo's ``mj_step`` rests it
    lower by its soft contact's penetration ``r`` (3.67e-4 m with the default solref/solimp, see
    :func:`_mujoco_penetration`): diffmech's hard contact rests the ball ``r`` higher than MuJoCo."""
    mujoco = pytest.importorskip("mujoco")
    path = tmp_path / "drop.xml"
    path.write_text(MJCF)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: every static geom is used
        scene = Scene.from_mjcf(path, solver="pgs")  # diffmech's hard contact
    assert scene.static == ["static"] and scene.ground
    shapes = scene.shapes["static"]
    assert sorted(shapes) == ["shelf", "world"]
    assert shapes["world"][0].kind == "box" and shapes["world"][0].size == (0.6, 0.6, 0.4)
    T = scene.models["static"].link_pose(torch.zeros(0, **F64), "shelf")
    np.testing.assert_allclose(T[:3, 3].numpy(), [1.0, 0.0, 0.5], atol=1e-15)

    m = mujoco.MjModel.from_xml_path(str(path))
    d = mujoco.MjData(m)
    for _ in range(500):  # at rest (|qvel| ~ 1e-11) from before step 500
        mujoco.mj_step(m, d)
    r = _mujoco_penetration(9.81, m.opt.timestep)
    # measured: MuJoCo's height and 0.5 - r agree to 7.7e-14 m; r = 3.67e-4 m
    assert abs(d.qpos[2] - (0.5 - r)) < 1e-12 and 3e-4 < r < 4e-4
    q = torch.tensor([0.05, 0.02, 0.52, 0, 0, 0, 1], **F64)
    Q, _ = rollout(scene, q, torch.zeros(6, **F64), torch.zeros(60, 6, **F64), scene.timestep)  # at rest by step 40
    assert abs(float(Q[-1, 2]) - 0.5) < 1e-12  # measured 0
    np.testing.assert_allclose(Q[-1, :2].numpy(), d.qpos[:2], atol=1e-9)


def test_mjcf_unsupported_static_geom_warns(tmp_path):
    path = tmp_path / "tilted.xml"
    path.write_text(MJCF.replace('<geom name="block"', '<geom name="wall" type="plane" size="1 1 0.1" pos="2 0 1" '
                                 'zaxis="1 0 0"/>\n    <geom name="block"'))
    with pytest.warns(UserWarning, match=r"static geoms .*plane: \['wall'\]"):
        scene = Scene.from_mjcf(path)
    assert sorted(scene.shapes["static"]) == ["shelf", "world"]
