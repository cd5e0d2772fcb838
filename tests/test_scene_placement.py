"""``Scene.place_on_ground``, ``Scene.penetration``, ``warn_initial_penetration`` and the scene's
input checks (restitution in [0, 1], the solver's name).

Oracles: the contact step's own deepest penetration (``info["penetration"]``) and the toe spheres'
centres from ``link_pose`` for the Laikago; closed forms for free bodies (a box's lowest corner is
``sum_i |R[2, i]| h_i`` below its centre, a capsule's lowest point ``|R[2, 2]| L / 2 + r``, a
cylinder's ``|a_z| L / 2 + r sqrt(1 - a_z^2)``), with rotation matrices built here from the
quaternion by the textbook formula.
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import torch

from diffmech import load_urdf
from diffmech.dynamics.kinematics import link_pose
from diffmech.errors import ModelError, OptionError, ShapeError
from diffmech.model import systems
from diffmech.model.collision import Shape, set_collision_shapes
from diffmech.sim.contact_step import contact_step
from diffmech.sim.scene import PENETRATION_WARNING, Scene, warn_initial_penetration

F64 = torch.float64


def _rot(quat) -> np.ndarray:
    """Rotation matrix of a unit quaternion ``(x, y, z, w)``."""
    x, y, z, w = (float(c) for c in quat)
    return np.array([[1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
                     [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
                     [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]])


def _quat(gen: torch.Generator, dtype=F64) -> torch.Tensor:
    u = torch.randn(4, generator=gen, dtype=F64)
    return (u / u.norm()).to(dtype)


def _laikago(dtype=F64):
    from diffmech.sim import scenes
    return scenes.laikago(1, dtype=dtype)


def _tilted_laikago(q0: torch.Tensor, gen: torch.Generator, dz: float) -> torch.Tensor:
    q = q0.clone()
    axis = torch.tensor([0.3, -0.8, 0.2], dtype=F64)
    axis = axis / axis.norm()
    ang = 0.25
    q[3:7] = torch.cat([math.sin(ang / 2) * axis, torch.tensor([math.cos(ang / 2)], dtype=F64)]).to(q.dtype)
    q[7:] = q0[7:] + (0.4 * (torch.rand(12, generator=gen, dtype=F64) - 0.5)).to(q.dtype)
    q[2] = q0[2] + dz
    return q


def _toe_gap(scene, q: torch.Tensor) -> float:
    """Lowest toe sphere's height above the ground: ``link_pose`` of each toe, minus its radius."""
    m = scene.models["laikago0"]
    gaps = [float(link_pose(m, q[scene.slices["laikago0"]], link, form="pos_rot")[0][2]) - shapes[0].size[0]
            for link, shapes in scene.shapes["laikago0"].items()]
    assert len(gaps) == 4
    return min(gaps)


def _step_penetration(scene, q: torch.Tensor) -> float:
    info = {}
    v = torch.zeros(scene.nv, dtype=q.dtype)
    contact_step(scene, q, v, torch.zeros_like(v), 1e-3, info)
    return info["penetration"]


@pytest.mark.parametrize("dz", [0.3, -0.2])
def test_laikago_lands_with_its_lowest_toe_on_the_ground(dz):
    scene, q0, _ = _laikago()
    gen = torch.Generator().manual_seed(7)
    q = _tilted_laikago(q0, gen, dz)
    before = q.clone()
    placed = scene.place_on_ground(q)
    assert torch.equal(q, before)  # q itself untouched
    changed = (placed != q).nonzero()[:, 0].tolist()
    assert changed == [2]  # only the base height moves
    assert abs(_toe_gap(scene, placed)) < 1e-12
    assert _toe_gap(scene, q) == pytest.approx(float(q[2] - placed[2]), abs=1e-12)
    # the contact code's view: nothing inside the ground, and 0.1 mm inside once lowered by 0.1 mm
    assert _step_penetration(scene, placed) < 1e-12
    lower = placed.clone()
    lower[2] -= 1e-4
    assert _step_penetration(scene, lower) == pytest.approx(1e-4, abs=1e-12)
    depth, link = scene.penetration(placed)["laikago0"]
    assert float(depth) < 1e-12 and link.startswith("toe")
    if dz < 0:
        depth, link = scene.penetration(q)["laikago0"]
        assert float(depth) == pytest.approx(-_toe_gap(scene, q), abs=1e-12)
        assert float(depth) == pytest.approx(_step_penetration(scene, q), abs=1e-12)


def test_laikago_in_float32_and_its_gradient():
    scene, q0, _ = _laikago(torch.float32)
    q = _tilted_laikago(q0, torch.Generator().manual_seed(3), 0.3)
    assert q.dtype == torch.float32
    placed = scene.place_on_ground(q)
    assert placed.dtype == torch.float32
    assert abs(_toe_gap(scene, placed)) < 1e-5

    scene, q0, _ = _laikago()
    q = _tilted_laikago(q0, torch.Generator().manual_seed(3), -0.2).requires_grad_(True)
    torch.autograd.gradcheck(lambda x: scene.place_on_ground(x)[..., 2], (q,))
    (g,) = torch.autograd.grad(scene.place_on_ground(q)[2], q)
    assert g[2] == 0 and g[7:].abs().sum() > 0  # independent of the old height, not of the joints


def _free(kind: str):
    if kind == "box":
        return systems.box((0.4, 0.2, 0.1), 1.0, name="b")
    if kind == "capsule":
        return systems.capsule(0.05, 0.3, 1.0, name="b")
    if kind == "sphere":
        return systems.sphere(0.07, 1.0, name="b")
    body = systems.box((0.1, 0.1, 0.1), 1.0, name="b")
    set_collision_shapes(body, "body", Shape("cylinder", (0.06, 0.25)))
    return body


def _analytic_height(kind: str, R: np.ndarray) -> float:
    """Height of the centre of a body resting on the ground at rotation ``R``."""
    if kind == "box":
        return float(np.abs(R[2]) @ np.array([0.2, 0.1, 0.05]))
    if kind == "capsule":
        return abs(R[2, 2]) * 0.15 + 0.05
    if kind == "sphere":
        return 0.07
    return abs(R[2, 2]) * 0.125 + 0.06 * math.sqrt(max(0.0, 1 - R[2, 2] ** 2))


@pytest.mark.parametrize("kind", ["box", "capsule", "sphere", "cylinder"])
def test_free_bodies_land_on_their_lowest_point(kind):
    scene = Scene([_free(kind)])
    gen = torch.Generator().manual_seed(11)
    heights = [0.5, -0.2, 2.0]
    q = torch.zeros(3, 7, dtype=F64)
    for i, h in enumerate(heights):
        q[i, :2] = torch.randn(2, generator=gen, dtype=F64)
        q[i, 2] = h
        q[i, 3:] = _quat(gen)
    placed = scene.place_on_ground(q)
    assert placed.shape == (3, 7)
    assert torch.equal(placed[:, [0, 1, 3, 4, 5, 6]], q[:, [0, 1, 3, 4, 5, 6]])
    for i in range(3):
        assert float(placed[i, 2]) == pytest.approx(_analytic_height(kind, _rot(q[i, 3:])), abs=1e-12)
    depth, link = scene.penetration(placed)["b"]
    assert depth.shape == (3,) and float(depth.max()) < 1e-12 and link == ["body"] * 3
    # upright, flat: the closed form at the identity, and a finite gradient (ties, a cylinder's rim)
    upright = torch.tensor([0.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0], dtype=F64, requires_grad=True)
    z = scene.place_on_ground(upright)[2]
    assert float(z.detach()) == pytest.approx(_analytic_height(kind, np.eye(3)), abs=1e-12)
    (g,) = torch.autograd.grad(z, upright)
    assert torch.isfinite(g).all() and g[2] == 0
    if kind != "sphere":  # a tilted body: the height's gradient w.r.t. the quaternion
        qt = q[0].clone().requires_grad_(True)
        torch.autograd.gradcheck(lambda x: scene.place_on_ground(x)[2], (qt,))


def test_batch_shapes_shape_offsets_and_float32():
    box = systems.box((0.4, 0.2, 0.1), 1.0, name="b", dtype=torch.float32)
    scene = Scene([box])
    gen = torch.Generator().manual_seed(5)
    q = torch.zeros(2, 3, 7, dtype=torch.float32)
    q[..., 3:] = torch.stack([torch.stack([_quat(gen, torch.float32) for _ in range(3)]) for _ in range(2)])
    q[..., 2] = torch.rand(2, 3, generator=gen) - 0.5
    placed = scene.place_on_ground(q)
    assert placed.shape == (2, 3, 7) and placed.dtype == torch.float32
    for i in range(2):
        for j in range(3):
            want = _analytic_height("box", _rot(q[i, j, 3:].double()))
            assert float(placed[i, j, 2]) == pytest.approx(want, abs=1e-6)
    # the racecar: a chassis box and four cylinders turned by rpy on offset links, built standing
    from diffmech.sim import scenes
    car, q0, _ = scenes.racecar()
    q = q0.clone()
    q[2] = 3.0
    assert float(car.place_on_ground(q)[2]) == pytest.approx(float(q0[2]), abs=1e-12)


def test_several_models_and_which_are_placed():
    ball = systems.sphere(0.1, 1.0, name="ball")
    crate = systems.box((0.2, 0.2, 0.2), 1.0, name="crate")
    arm = systems.pendulum()
    set_collision_shapes(arm, arm.link_names[-1], Shape("sphere", (0.05,)))
    ghost = systems.sphere(0.1, 1.0, name="ghost")
    set_collision_shapes(ghost, "body", None)
    scene = Scene({"ball": ball, "crate": crate, "arm": arm, "ghost": ghost})
    q = scene.neutral_configuration().clone()
    for n, z in (("ball", 1.0), ("crate", -1.0), ("ghost", 5.0)):
        q[scene.slices[n].start + 2] = z
    zs = {n: scene.slices[n].start + 2 for n in ("ball", "crate", "ghost")}
    placed = scene.place_on_ground(q)  # the floating models with shapes
    assert float(placed[zs["ball"]]) == pytest.approx(0.1, abs=1e-15)
    assert float(placed[zs["crate"]]) == pytest.approx(0.1, abs=1e-15)
    assert float(placed[zs["ghost"]]) == 5.0
    only = scene.place_on_ground(q, "crate")
    assert float(only[zs["ball"]]) == 1.0 and float(only[zs["crate"]]) == pytest.approx(0.1, abs=1e-15)
    both = scene.place_on_ground(q, ["crate", "ball"])
    assert torch.equal(both, placed)

    with pytest.raises(ModelError, match="'arm'.*fixed base"):
        scene.place_on_ground(q, "arm")
    with pytest.raises(ModelError, match="'ghost'.*no collision shapes"):
        scene.place_on_ground(q, ["ball", "ghost"])
    with pytest.raises(ModelError, match=r"'robot'.*\['ball', 'crate', 'arm', 'ghost'\]"):
        scene.place_on_ground(q, "robot")
    with pytest.raises(ShapeError, match=r"q of shape \(5, 21\)"):
        scene.place_on_ground(torch.zeros(5, scene.nq - 1, dtype=F64))
    with pytest.raises(ShapeError, match=r"q.*\(\)"):
        scene.place_on_ground(torch.tensor(0.0, dtype=F64))
    with pytest.raises(ShapeError, match="q"):
        scene.place_on_ground(torch.zeros(scene.nq, dtype=torch.long))
    with pytest.raises(ModelError, match="no model"):
        Scene({"arm": systems.pendulum()}).place_on_ground(torch.zeros(1, dtype=F64))
    pen = scene.penetration(q)
    assert set(pen) == {"ball", "crate", "arm"}  # every model with shapes, fixed-base ones too
    assert float(pen["crate"][0]) == pytest.approx(1.1) and pen["crate"][1] == "body"
    assert float(pen["ball"][0]) == 0.0


def test_warn_initial_penetration():
    scene, q0, _ = _laikago()
    q = _tilted_laikago(q0, torch.Generator().manual_seed(1), -0.2)
    with pytest.warns(RuntimeWarning) as rec:
        out = warn_initial_penetration(scene, q)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert "'laikago0'" in msg and "link 'toe" in msg and "place_on_ground" in msg
    assert set(out) == {"laikago0"} and out["laikago0"] > 0.15
    # a batch: one warning, naming the deepest element
    with pytest.warns(RuntimeWarning) as rec:
        warn_initial_penetration(scene, torch.stack([scene.place_on_ground(q), q]))
    assert len(rec) == 1 and "batch element (1,)" in str(rec[0].message)
    # silent: on the ground, or less deep than the threshold
    shallow = scene.place_on_ground(q)
    shallow[2] -= 0.5 * PENETRATION_WARNING
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert warn_initial_penetration(scene, scene.place_on_ground(q)) == {}
        assert warn_initial_penetration(scene, shallow) == {}
    with pytest.warns(RuntimeWarning, match="'laikago0'"):
        warn_initial_penetration(scene, shallow, threshold=0.1 * PENETRATION_WARNING)
    with pytest.raises(ModelError, match="threshold"):
        warn_initial_penetration(scene, q, threshold=-1.0)


def test_restitution_and_solver_are_checked():
    ball = systems.sphere(0.1, 1.0, name="ball")
    for bad in (1.5, -0.1, float("nan"), float("inf"), torch.tensor(1.5, dtype=F64)):
        with pytest.raises(ModelError, match=r"restitution.*(1\.5|-0\.1|nan|inf)"):
            Scene(ball, restitution=bad)
        with pytest.raises(ModelError, match=r"restitution.*(1\.5|-0\.1|nan|inf)"):
            Scene(ball, pairs={("ball", "ground"): {"restitution": bad}})
    for ok in (0.0, 1.0, torch.tensor(0.3, dtype=F64)):
        Scene(ball, restitution=ok, pairs={("ball", "ground"): {"restitution": ok}})
    urdf = """<robot name="crate"><link name="body"><contact><restitution value="{}"/></contact><inertial>
    <mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial><collision>
    <geometry><box size="0.2 0.2 0.2"/></geometry></collision></link></robot>"""
    with pytest.raises(ModelError, match=r"'crate'.*'body'.*1\.5"):
        Scene([load_urdf(urdf.format(1.5), floating_base=True)])
    Scene([load_urdf(urdf.format(1.0), floating_base=True)])
    with pytest.raises(OptionError, match="unknown solver 'newton'"):
        Scene(ball, solver="newton")


def test_a_rollout_that_starts_inside_the_ground_warns_once():
    """The rollout checks its initial state once per scene: 0.2 m into the ground warns, naming the model and
    the toe; the same scene's later rollouts say nothing more."""
    from diffmech.sim import rollout, scenes

    scene, q0, v0 = scenes.laikago(1)
    q = q0.clone()
    q[2] -= 0.2
    tau = torch.zeros(2, scene.nv, dtype=torch.float64)
    with pytest.warns(RuntimeWarning, match=r"laikago0.*toe"):
        rollout(scene, q, v0, tau, 1e-3)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        rollout(scene, q, v0, tau, 1e-3)
