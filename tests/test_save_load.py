"""Saving, loading and exporting a robot: ``state_dict`` across learnable layouts, ``torch.save``/pickling
of parametrized models, and ``RobotModel.to_urdf``.

Oracles: the trained model itself (a loaded or copied model must give its dynamics: inverse
dynamics with the passive terms, mass matrix, forward kinematics of every link, forward dynamics);
for the URDF export also Pinocchio (``rnea``/``crba`` of Pinocchio's model of the exported file
against diffmech, and against Pinocchio's model of the source file) and PyBullet (number of joints,
each link's mass, centre of mass and inertia as PyBullet reads them).
"""

from __future__ import annotations

import copy
import io
import os
import pickle
import warnings
import xml.etree.ElementTree as ET

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn.utils import parametrize

import diffmech
from conftest import ROBOTS, get_robot, random_state, robot_path
from diffmech.errors import ModelError
from diffmech.model import systems
from diffmech.model.params import (
    PositiveScalar,
    SymmetricPositiveDefinite,
    make_link_inertial_learnable,
)

F64 = torch.float64

# What each test robot makes learnable: parameter -> link (joint parameters: the link's parent joint).
LEARN = {
    "iiwa": {"mass": "iiwa_link_3", "inertia": "iiwa_link_3", "com": "iiwa_link_4", "origin_xyz": "iiwa_link_2",
             "damping": "iiwa_link_2", "consistent": "iiwa_link_5", "independent": "iiwa_link_6"},
    "floating_pair": {"mass": "arm_link", "inertia": "arm_link", "com": "leg_link", "origin_xyz": "arm_link",
                      "damping": "leg_link", "consistent": "torso", "independent": "marker"},
}

# Mimic robots of test_mimic.py: key -> (package, path in it).
MIMIC = {
    "panda_gripper": ("diff_robot_data", "panda_description/urdf/panda.urdf"),
    "xarm_gripper": ("pybullet_data", "xarm/xarm6_with_gripper.urdf"),
}
EXPORT = ["iiwa", "panda", "oblique_chain", "prismatic_mix", "branching_tree", "floating_pair", "humanoid",
          *MIMIC]


def _source(key: str) -> tuple[str, bool]:
    """URDF path and floating_base of a test robot (conftest ROBOTS or a mimic robot)."""
    if key in ROBOTS:
        return robot_path(key), ROBOTS[key][2]
    pkg, rel = MIMIC[key]
    if pkg == "diff_robot_data":
        root = list(pytest.importorskip("diff_robot_data").__path__)[0]
    else:
        root = pytest.importorskip("pybullet_data").getDataPath()
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        pytest.skip(f"{rel} not installed")
    return path, False


def _load(path, floating_base=False) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no <inertial>.*")
        warnings.filterwarnings("ignore", message=".*ignoring <visual>/<collision> geometry.*")
        return diffmech.load_urdf(path, floating_base=floating_base)


def _fresh(key: str) -> diffmech.RobotModel:
    """A freshly loaded float64 model of robot ``key``."""
    return _load(*_source(key))


def _learnable(robot: diffmech.RobotModel, key: str) -> diffmech.RobotModel:
    """``robot`` with parameters made learnable every way there is (see :data:`LEARN`)."""
    links = LEARN[key]
    robot.make_link_param_learnable(links["mass"], "mass", PositiveScalar())
    robot.make_link_param_learnable(links["inertia"], "inertia", SymmetricPositiveDefinite())
    robot.make_link_param_learnable(links["com"], "com")
    robot.make_link_param_learnable(links["origin_xyz"], "origin_xyz")
    robot.make_link_param_learnable(links["damping"], "damping", PositiveScalar())
    make_link_inertial_learnable(robot, links["consistent"], "physically_consistent")
    make_link_inertial_learnable(robot, links["independent"], "independent")
    return robot


def _train(robot: diffmech.RobotModel, steps: int = 3) -> diffmech.RobotModel:
    """A few signed-gradient steps towards random torques (Adam's first steps, without importing
    torch.optim's compiler machinery): every learnable tensor moves."""
    params = [p for p in robot.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    q, v, a, _ = random_state(robot, (8,), seed=21)
    target = torch.randn(8, robot.nv, generator=torch.Generator().manual_seed(22), dtype=F64)
    for _ in range(steps):
        loss = (robot.inverse_dynamics(q, v, a) - target).square().mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(0.03 * g.sign())
    assert all(not torch.equal(p.detach(), b) for p, b in zip(params, before))
    return robot


def _state(robot: diffmech.RobotModel, seed: int, dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Seeded ``(q, v, a)`` drawn in float64 whatever the model's dtype (``random_configuration``
    draws in the model's dtype, so a float32 model would get other states), cast to ``dtype``."""
    g = torch.Generator().manual_seed(seed)
    lo, hi = robot.position_lower.cpu(), robot.position_upper.cpu()
    lo = torch.where(torch.isfinite(lo), lo, -torch.pi)
    hi = torch.where(torch.isfinite(hi), hi, torch.pi)
    q = lo + (hi - lo) * torch.rand(4, robot.nj, generator=g, dtype=F64)
    if robot.floating_base:
        quat = torch.randn(4, 4, generator=g, dtype=F64)
        q = torch.cat([torch.rand(4, 3, generator=g, dtype=F64), quat / quat.norm(dim=-1, keepdim=True), q], -1)
    v, a = torch.randn(2, 4, robot.nv, generator=g, dtype=F64)
    return q.to(dtype), v.to(dtype), a.to(dtype)


def _dynamics(robot: diffmech.RobotModel, seed: int = 5, dtype=F64) -> dict[str, torch.Tensor]:
    q, v, a = _state(robot, seed, dtype)
    with torch.no_grad():
        return {
            "inverse_dynamics": robot.inverse_dynamics(q, v, a),
            "mass_matrix": robot.mass_matrix(q),
            "forward_kinematics": robot.forward_kinematics(q),
        }


def _tau(robot: diffmech.RobotModel, dtype=F64) -> dict[str, torch.Tensor]:
    """The inverse dynamics alone (the cheap check)."""
    with torch.no_grad():
        return {"inverse_dynamics": robot.inverse_dynamics(*_state(robot, 5, dtype))}


def _assert_same(got: dict, ref: dict, tol: float = 1e-12) -> None:
    for name in ref:
        torch.testing.assert_close(got[name], ref[name], rtol=tol, atol=tol, msg=lambda m, n=name: f"{n}: {m}")


def _assert_differ(got: dict, ref: dict) -> None:
    assert (got["inverse_dynamics"] - ref["inverse_dynamics"]).abs().max() > 1e-3


# ---------------------------------------------------------------------------- state_dict
def test_a_trained_state_dict_loads_into_a_fresh_model(tmp_path):
    """The reported failure: parametrization and inertial-source keys into a plain model."""
    trained = _train(_learnable(_fresh("iiwa"), "iiwa"))
    fresh = _fresh("iiwa")
    _assert_differ(_dynamics(fresh), _dynamics(trained))  # also fills the fresh model's caches
    torch.save(trained.state_dict(), tmp_path / "trained.pt")
    fresh.load_state_dict(torch.load(tmp_path / "trained.pt"))  # strict
    _assert_same(_dynamics(fresh), _dynamics(trained))
    # the values, not the learnability
    assert not any(p.requires_grad for p in fresh.parameters())
    src = trained.link_params("iiwa_link_5").inertial_source
    m, c, inertia = src()
    lp = fresh.link_params("iiwa_link_5")
    assert torch.equal(lp.mass, m.detach()) and torch.equal(lp.com, c.detach())
    assert torch.equal(lp.inertia, inertia.detach())


def test_the_same_learnable_layout_restores_the_raw_tensors_exactly():
    trained = _train(_learnable(_fresh("iiwa"), "iiwa"))
    other = _learnable(_fresh("iiwa"), "iiwa")
    other.load_state_dict(trained.state_dict())
    named = dict(other.named_parameters())
    assert list(named) == [n for n, _ in trained.named_parameters()]
    for name, p in trained.named_parameters():
        assert torch.equal(named[name], p), name
        assert named[name].requires_grad
    _assert_same(_dynamics(other), _dynamics(trained), tol=0.0)
    q, v, a, _ = random_state(other, (3,), seed=2)
    other.inverse_dynamics(q, v, a).square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in other.parameters() if p.requires_grad)


def test_plain_values_load_into_a_learnable_model():
    """Identified values in a plain model (no learnable parameter) into a model made learnable:
    parametrizations get their raw tensors from the values (right_inverse), sources theirs
    (set_inertial), and the model stays trainable."""
    values = _fresh("iiwa")
    with torch.no_grad():
        for i, lp in enumerate(values.links):
            lp.mass.mul_(1.0 + 0.05 * i)
            lp.com.add_(0.003 * i)
        for jp in values.joints:
            jp.damping.add_(0.2)
            jp.origin_xyz.add_(0.001)
    learnable = _learnable(_fresh("iiwa"), "iiwa")
    learnable.load_state_dict(values.state_dict())
    _assert_same(_dynamics(learnable), _dynamics(values))
    assert sum(p.requires_grad for p in learnable.parameters()) == 9
    _train(learnable, steps=1)


def test_a_different_parametrization_gets_the_values():
    trained = _train(_learnable(_fresh("iiwa"), "iiwa"))
    other = _fresh("iiwa")
    other.make_link_param_learnable("iiwa_link_3", "mass", PositiveScalar(min_value=0.5))
    other.make_link_param_learnable("iiwa_link_3", "inertia", SymmetricPositiveDefinite(diag="softplus"))
    make_link_inertial_learnable(other, "iiwa_link_5", "independent")  # trained: physically consistent
    other.load_state_dict(trained.state_dict())
    _assert_same(_dynamics(other), _dynamics(trained))
    # the trained link 6 (independent parameters) has left the physically consistent set
    consistent = _fresh("iiwa")
    make_link_inertial_learnable(consistent, "iiwa_link_6", "physically_consistent")
    with pytest.raises(ModelError, match=r'loading "links\.6\.mass": .*triangle inequality'):
        consistent.load_state_dict(trained.state_dict())


def test_the_values_survive_a_model_wrapped_in_another_module():
    class Wrapper(nn.Module):
        def __init__(self, robot):
            super().__init__()
            self.robot = robot

    trained = Wrapper(_train(_learnable(_fresh("iiwa"), "iiwa")))
    fresh = Wrapper(_fresh("iiwa"))
    fresh.load_state_dict(trained.state_dict())
    assert "robot.links.3.mass" in trained.state_dict()
    _assert_same(_dynamics(fresh.robot), _dynamics(trained.robot))


def test_a_float32_state_dict_into_a_float64_model():
    trained = _train(_learnable(_fresh("iiwa"), "iiwa")).to(torch.float32)
    fresh = _fresh("iiwa")
    fresh.load_state_dict(trained.state_dict())
    ref = {k: t.double() for k, t in _dynamics(trained, dtype=torch.float32).items()}
    _assert_same(_dynamics(fresh), ref, tol=2e-5)


def test_a_value_outside_the_receivers_range_is_named():
    light = _fresh("iiwa")
    with torch.no_grad():
        light.link_params("iiwa_link_3").mass.fill_(0.2)
    bounded = _fresh("iiwa")
    bounded.make_link_param_learnable("iiwa_link_3", "mass", PositiveScalar(min_value=1.0))
    with pytest.raises(ModelError, match=r'"links\.3\.mass".*PositiveScalar'):
        bounded.load_state_dict(light.state_dict())


def test_strict_mismatches_name_the_key():
    iiwa, panda, chain = _fresh("iiwa"), _fresh("panda"), _fresh("oblique_chain")
    with pytest.raises(RuntimeError, match=r'(Missing|Unexpected) key\(s\).*"(links|joints)\.\d+\.\w+"'):
        chain.load_state_dict(iiwa.state_dict())
    # the same tree shape (nine links, eight joints): the link names tell the robots apart
    with pytest.raises(RuntimeError, match=r"link_names: the state dict is of another robot \(link 0 is "
                                           r"'iiwa_link_0', in panda 'panda_link0'\)"):
        panda.load_state_dict(iiwa.state_dict())
    panda.load_state_dict(iiwa.state_dict(), strict=False)
    assert torch.equal(panda.link_params(3).mass, iiwa.link_params(3).mass)
    # a state dict without the value of a parametrized parameter (written by hand, say)
    sd = _learnable(_fresh("iiwa"), "iiwa").state_dict()
    del sd["links.3.mass"], sd["links.5.com"]
    with pytest.raises(RuntimeError, match=r'(?s)Missing key\(s\) in state_dict: "links\.3\.mass", "links\.5\.com"'
                                           r'.*Unexpected key\(s\).*"links\.3\.parametrizations\.mass\.original"'):
        _fresh("iiwa").load_state_dict(sd)
    result = _fresh("iiwa").load_state_dict(sd, strict=False)
    assert result.missing_keys == ["links.3.mass", "links.5.com"]
    assert "links.5.inertial_source.theta" in result.unexpected_keys


# ---------------------------------------------------------------------------- torch.save, pickle, deepcopy
def _save_load(robot, how: str, tmp_path):
    if how == "torch.save":
        torch.save(robot, tmp_path / "robot.pt")
        return torch.load(tmp_path / "robot.pt", weights_only=False)
    if how == "pickle":
        return pickle.loads(pickle.dumps(robot))
    return copy.deepcopy(robot)


@pytest.mark.parametrize("how", ["torch.save", "pickle", "deepcopy"])
@pytest.mark.parametrize("key", ["iiwa", "floating_pair"])
def test_a_learnable_float32_model_survives_saving(key, how, tmp_path):
    robot = _train(_learnable(_fresh(key), key)).to(torch.float32)
    ref = _dynamics(robot, dtype=torch.float32)
    loaded = _save_load(robot, how, tmp_path)
    assert loaded.dtype == torch.float32 and loaded.floating_base == robot.floating_base
    _assert_same(_dynamics(loaded, dtype=torch.float32), ref, tol=0.0)
    # same learnable tensors, same parametrizations
    assert [(n, p.requires_grad) for n, p in loaded.named_parameters()] == \
        [(n, p.requires_grad) for n, p in robot.named_parameters()]
    for (_, p), (_, p2) in zip(robot.named_parameters(), loaded.named_parameters()):
        assert torch.equal(p, p2) and p is not p2
    mass_link = loaded.link_params(LEARN[key]["mass"])
    assert parametrize.is_parametrized(mass_link, "mass")
    assert isinstance(mass_link.parametrizations.mass[0], PositiveScalar)
    # trainable, independent of the original, and its changes are seen
    loaded.inverse_dynamics(*_state(loaded, 1, torch.float32)).square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in loaded.parameters() if p.requires_grad)
    with torch.no_grad():
        mass_link.parametrizations.mass.original.add_(1.0)
        loaded.link_params(LEARN[key]["com"]).com.fill_(0.0)
    ref = {"inverse_dynamics": ref["inverse_dynamics"]}
    _assert_same(_tau(robot, torch.float32), ref, tol=0.0)
    _assert_differ(_tau(loaded, torch.float32), ref)
    # the loaded model saves again
    again = _save_load(loaded, how, tmp_path)
    _assert_same(_tau(again, torch.float32), _tau(loaded, torch.float32), tol=0.0)


def test_a_saved_plain_model_sees_later_changes(tmp_path):
    robot = _fresh("floating_pair")
    _dynamics(robot)  # caches filled before saving
    loaded = _save_load(robot, "torch.save", tmp_path)
    with torch.no_grad():
        loaded.link_params("arm_link").mass.mul_(2.0)
    changed = copy.deepcopy(robot)
    with torch.no_grad():
        changed.link_params("arm_link").mass.mul_(2.0)
    _assert_same(_dynamics(loaded), _dynamics(changed), tol=0.0)


# ---------------------------------------------------------------------------- to_urdf
def _export(robot, tmp_path, name="exported.urdf") -> str:
    out = os.path.join(tmp_path, name)
    text = robot.to_urdf(out)
    with open(out, encoding="utf-8") as f:
        assert f.read() == text
    return out


@pytest.mark.parametrize("key", EXPORT)
def test_the_export_reloads_to_the_same_model(key, tmp_path):
    path, fb = _source(key)
    robot = _load(path, fb)
    out = _export(robot, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # massless links carry explicit zeros: no warning on re-loading
        back = diffmech.load_urdf(out, floating_base=fb)
    assert back.link_names == robot.link_names and back.all_joint_names == robot.all_joint_names
    assert back.joint_names == robot.joint_names and back.tree.joint_kinds == robot.tree.joint_kinds
    assert back.tree.coords == robot.tree.coords  # mimic joints
    for name in ("position_lower", "position_upper", "velocity_limit", "effort_limit"):
        assert torch.equal(getattr(back, name), getattr(robot, name)), name
    raw, raw_back = robot.raw_parameters(), back.raw_parameters()
    for kind in ("mass", "com", "inertia", "origin_xyz", "damping", "friction"):
        assert torch.equal(getattr(raw_back, kind), getattr(raw, kind)), kind
    _assert_same(_dynamics(back), _dynamics(robot))
    if fb:
        assert "floating_base=True" in open(out).read()


def _pin_check(robot, path, out) -> None:
    """Pinocchio's model of the exported file ``out`` against diffmech's ``robot`` and against
    Pinocchio's model of ``path`` (None: the source differs from ``robot``)."""
    from oracle import PinOracle, rel_err

    exported = PinOracle(robot, out)
    q, v, a, _ = random_state(robot, (3,), seed=9)
    qn, vn, an = q.numpy(), v.numpy(), a.numpy()
    tau = [exported.rnea(*s) for s in zip(qn, vn, an)]
    M = [exported.crba(x) for x in qn]
    with torch.no_grad():
        assert rel_err(robot.inverse_dynamics(q, v, a, passive=False).numpy(), np.stack(tau)) < 1e-10
        assert rel_err(robot.mass_matrix(q).numpy(), np.stack(M)) < 1e-10
    if path is not None:
        source = PinOracle(robot, path)
        assert rel_err(np.stack(tau), np.stack([source.rnea(*s) for s in zip(qn, vn, an)])) < 1e-12
        assert rel_err(np.stack(M), np.stack([source.crba(x) for x in qn])) < 1e-12


@pytest.mark.parametrize("key", EXPORT)
def test_pinocchio_loads_the_export(key, tmp_path):
    pytest.importorskip("pinocchio")
    path, fb = _source(key)
    robot = _load(path, fb)
    _pin_check(robot, path, _export(robot, tmp_path))


def _pybullet_check(robot, out) -> None:
    """PyBullet loads ``out`` with every joint, and each link's mass, centre of mass and inertia."""
    p = pytest.importorskip("pybullet")
    cid = p.connect(p.DIRECT)
    try:
        body = p.loadURDF(out, useFixedBase=not robot.floating_base, flags=p.URDF_USE_INERTIA_FROM_FILE,
                          physicsClientId=cid)
        n = p.getNumJoints(body, physicsClientId=cid)
        assert n == len(robot.all_joint_names)
        names = [p.getBodyInfo(body, physicsClientId=cid)[0].decode()]
        names += [p.getJointInfo(body, i, physicsClientId=cid)[12].decode() for i in range(n)]
        assert sorted(names) == sorted(robot.link_names)
        with torch.no_grad():
            raw = robot.raw_parameters()
        for i, link in enumerate(names):
            if i == 0 and not robot.floating_base:
                continue  # PyBullet gives a fixed base no mass
            info = p.getDynamicsInfo(body, i - 1, physicsClientId=cid)
            k = robot.link_names.index(link)
            mass, com, inertia = float(raw.mass[k]), raw.com[k].numpy(), raw.inertia[k].numpy()
            R = np.array(p.getMatrixFromQuaternion(info[4])).reshape(3, 3)
            assert info[0] == pytest.approx(mass, rel=1e-12, abs=1e-15), link
            np.testing.assert_allclose(info[3], com, atol=1e-12, err_msg=link)
            # PyBullet sets an inertia that breaks the triangle inequality of the principal moments to zero
            e = np.linalg.eigvalsh(0.5 * (inertia + inertia.T))
            margin, scale = e[0] + e[1] - e[2], max(1e-12, np.abs(e).max())
            if abs(margin) < 1e-9 * scale:
                continue  # on the edge: either reading is right
            expected = inertia if margin > 0 else np.zeros((3, 3))
            np.testing.assert_allclose(R @ np.diag(info[2]) @ R.T, expected, atol=1e-9 * scale, err_msg=link)
    finally:
        p.disconnect(cid)


@pytest.mark.parametrize("key", EXPORT)
def test_pybullet_loads_the_export(key, tmp_path):
    path, fb = _source(key)
    robot = _load(path, fb)
    _pybullet_check(robot, _export(robot, tmp_path))


def test_identified_parameters_are_what_is_written(tmp_path):
    robot = _train(_learnable(_fresh("iiwa"), "iiwa"))  # masses, inertias, COMs, an origin, a damping moved
    out = _export(robot, tmp_path)
    back = diffmech.load_urdf(out)
    _assert_same(_dynamics(back), _dynamics(robot))
    _assert_differ(_dynamics(back), _dynamics(get_robot("iiwa")))
    _pin_check(robot, None, out)
    _pybullet_check(robot, out)
    # a float32 model writes its float32 values exactly
    robot32 = copy.deepcopy(robot).to(torch.float32)
    back32 = diffmech.load_urdf(_export(robot32, tmp_path, "exported32.urdf"))
    raw32, raw_back = robot32.raw_parameters(), back32.raw_parameters()
    for kind in ("mass", "com", "origin_xyz", "damping"):
        assert torch.equal(getattr(raw_back, kind), getattr(raw32, kind).detach().double()), kind
    sym = 0.5 * (raw32.inertia + raw32.inertia.mT).detach().double()
    assert torch.equal(raw_back.inertia, sym)


def _geometry(root: ET.Element) -> dict[str, list[str]]:
    """Tags and geometry kinds of each link's ``<visual>``/``<collision>`` elements."""
    return {link.get("name"): [f"{el.tag}/{el.find('geometry')[0].tag}" for el in link
                               if el.tag in ("visual", "collision")] for link in root.findall("link")}


@pytest.mark.parametrize("key", ["iiwa", "panda_gripper", "xarm_gripper"])
def test_visual_and_collision_elements_are_kept_with_valid_mesh_paths(key, tmp_path):
    path, fb = _source(key)
    out = _export(_load(path, fb), tmp_path)
    src, exp = ET.parse(path).getroot(), ET.parse(out).getroot()
    assert _geometry(exp) == _geometry(src)
    assert {m.get("name") for m in exp.findall("material")} == {m.get("name") for m in src.findall("material")}
    meshes = [m.get("filename") for m in exp.iter("mesh")]
    assert meshes and all(os.path.isabs(f) and os.path.isfile(f) for f in meshes), meshes


def test_mesh_paths_are_resolved_against_the_source_file(tmp_path):
    pkg = tmp_path / "pkg"
    (pkg / "urdf").mkdir(parents=True)
    (pkg / "meshes").mkdir()
    for f in (pkg / "meshes" / "up.stl", pkg / "urdf" / "here.stl"):
        f.write_text("solid s\nendsolid s\n")
    geometry = {"../meshes/up.stl": str(pkg / "meshes" / "up.stl"),  # relative to the file
                "here.stl": str(pkg / "urdf" / "here.stl"),
                "meshes/up.stl": str(pkg / "meshes" / "up.stl"),  # found in a parent, as PyBullet does
                "package://pkg/meshes/up.stl": str(pkg / "meshes" / "up.stl"),
                "package://elsewhere/x.stl": "package://elsewhere/x.stl"}  # not found: kept
    visuals = "".join(f'<visual><geometry><mesh filename="{f}"/></geometry></visual>' for f in geometry)
    (pkg / "urdf" / "r.urdf").write_text(
        f"""<robot name="r"><link name="a">{visuals}<inertial><mass value="1"/>
        <inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial></link>
        <joint name="j" type="continuous"><parent link="a"/><child link="b"/><axis xyz="0 0 1"/></joint>
        <link name="b"><inertial><origin xyz="0.1 0 0"/><mass value="1"/>
        <inertia ixx="1" ixy="0" ixz="0" iyy="1" iyz="0" izz="1"/></inertial></link></robot>""")
    robot = diffmech.load_urdf(pkg / "urdf" / "r.urdf")
    (tmp_path / "out").mkdir()
    out = _export(robot, tmp_path / "out")
    written = [m.get("filename") for m in ET.parse(out).getroot().iter("mesh")]
    assert written == list(geometry.values())


def test_built_models_springs_and_gravity(tmp_path):
    """Models without a URDF export too; what URDF cannot say (springs, gravity) is warned about."""
    cart = systems.cartpole(damping=(0.3, 0.1))  # a prismatic joint without limits
    back = diffmech.load_urdf(_export(cart, tmp_path, "cart.urdf"))
    _assert_same(_dynamics(back), _dynamics(cart))
    pend = systems.double_pendulum(stiffness=(2.0, 0.0), rest=(0.1, 0.0), gravity=3.7)
    with pytest.warns(UserWarning) as record:
        out = _export(pend, tmp_path, "pend.urdf")
    messages = " ".join(str(w.message) for w in record)
    assert "joint1' (stiffness 2.0)" in messages and "gravity" in messages
    assert all(w.filename == __file__ for w in record)  # warnings point at the user's line
    back = diffmech.load_urdf(out, gravity=(0.0, 0.0, -3.7))
    q, v, a, _ = random_state(pend, (3,), seed=1)
    torch.testing.assert_close(back.inverse_dynamics(q, v, a, passive=False),
                               pend.inverse_dynamics(q, v, a, passive=False), rtol=1e-12, atol=1e-12)


def test_unphysical_parameters_are_refused_by_name(tmp_path):
    robot = copy.deepcopy(get_robot("iiwa"))
    with torch.no_grad():
        robot.link_params("iiwa_link_3").mass.fill_(-1.0)
    with pytest.raises(ModelError, match="link 'iiwa_link_3': mass -1.0 is negative; cannot write a URDF that loads"):
        robot.to_urdf()
    robot = copy.deepcopy(get_robot("iiwa"))
    with torch.no_grad():
        robot.link_params("iiwa_link_4").inertia[0, 0] = -0.5
    with pytest.raises(ModelError, match="link 'iiwa_link_4'.*not positive semi-definite"):
        robot.to_urdf()
    robot = copy.deepcopy(get_robot("iiwa"))
    with torch.no_grad():
        robot.joint_params("iiwa_joint_2").origin_xyz[1] = float("nan")
    with pytest.raises(ModelError, match=r"joint 'iiwa_joint_2': origin xyz\[1\] is NaN; cannot write a URDF"):
        robot.to_urdf(os.path.join(tmp_path, "never.urdf"))
    assert not os.path.exists(os.path.join(tmp_path, "never.urdf"))
    robot = copy.deepcopy(get_robot("iiwa"))
    with torch.no_grad():
        robot.joint_params("iiwa_joint_5").damping.fill_(-0.5)
    with pytest.raises(ModelError, match="joint 'iiwa_joint_5': damping -0.5 is negative"):
        robot.to_urdf()
    robot = copy.deepcopy(get_robot("iiwa"))
    with torch.no_grad():
        robot.link_params("iiwa_link_2").com[2] = 1e12
    with pytest.raises(ModelError, match=r"link 'iiwa_link_2': centre of mass\[2\] 1000000000000.0 exceeds 1e\+09"):
        robot.to_urdf()


def test_to_urdf_returns_the_text_without_a_path():
    text = get_robot("oblique_chain").to_urdf()
    back = diffmech.load_urdf(text)
    _assert_same(_dynamics(back), _dynamics(get_robot("oblique_chain")))
    assert io.StringIO(text).readline().startswith("<?xml")


@pytest.mark.slow
def test_every_corpus_robot_exports(tmp_path):
    """Every URDF of pybullet_data and diff_robot_data that diffmech loads: the export re-loads to the
    same model (1e-12), Pinocchio's model of it matches Pinocchio's model of the source (where
    Pinocchio loads the source) and PyBullet loads it with every joint (where PyBullet loads the
    source)."""
    p = pytest.importorskip("pybullet")
    from oracle import PinOracle, rel_err
    from test_urdf_corpus import corpus

    exported = pinocchio = pybullet = 0
    cid = p.connect(p.DIRECT)
    try:
        for label, path in corpus().items():
            try:
                robot = _load(path)
            except ModelError:
                continue  # refused (test_urdf_corpus says why)
            out = _export(robot, tmp_path, f"{exported}.urdf")  # PyBullet caches files by name
            back = _load(out)
            _assert_same(_dynamics(back), _dynamics(robot))
            try:
                source = PinOracle(robot, path)
            except Exception:  # noqa: BLE001 -- Pinocchio refuses the source file (test_urdf_corpus)
                source = None
            if source is not None:
                mine = PinOracle(robot, out)
                q, v, a, _ = random_state(robot, (2,), seed=3)
                for x, y, z in zip(q.numpy(), v.numpy(), a.numpy()):
                    if robot.nv == 0:  # a static model (nq = 0): its fixed placements are what it holds
                        fk = mine.forward_kinematics(x), source.forward_kinematics(x)
                        assert rel_err(*fk, per=0) < 1e-12, label
                        continue
                    assert rel_err(mine.rnea(x, y, z), source.rnea(x, y, z), per=0) < 1e-12, label
                    assert rel_err(mine.crba(x), source.crba(x), per=0) < 1e-12, label
                pinocchio += 1
            try:
                p.removeBody(p.loadURDF(path, useFixedBase=True, physicsClientId=cid), physicsClientId=cid)
            except p.error:
                pass  # PyBullet refuses the source too (a mesh file the source names is missing)
            else:
                body = p.loadURDF(out, useFixedBase=True, physicsClientId=cid)
                assert p.getNumJoints(body, physicsClientId=cid) == len(robot.all_joint_names), label
                p.removeBody(body, physicsClientId=cid)
                pybullet += 1
            exported += 1
    finally:
        p.disconnect(cid)
    assert exported >= 40 and pinocchio >= 40 and pybullet >= 40, (exported, pinocchio, pybullet)  # 50, 50, 49 measured
