"""Bad input gets one clear error (issue 35, items 2, 3 and 10): every way parameter values enter a
model obeys the rules of :mod:`diffmech.model.validate`, and the dynamics' inputs are checked as
``docs/conventions.md`` says."""

from __future__ import annotations

import copy
import math
import os
import warnings

import pytest
import torch
from torch import nn

import diffmech
from conftest import get_robot
from diffmech.errors import DiffmechError, ModelError, ShapeError
from diffmech.model import systems
from diffmech.model.validate import MAX_MAGNITUDE

_INERTIAL = ('<inertial><origin xyz="0.1 0 0"/><mass value="{m}"/>'
             '<inertia ixx="{i}" ixy="0" ixz="0" iyy="{i}" iyz="0" izz="{i}"/></inertial>')


def _arm(*, leaf: str = _INERTIAL.format(m=1, i=0.01), leaf_joint: str = "revolute", lower: str = "-1",
         extra: str = "", middle: str = _INERTIAL.format(m=1, i=0.01), xyz: str = "0 0 0.2") -> str:
    """A two-joint arm 'base' -> 'upper' -> 'hand' with the given pieces."""
    return f"""<robot name="arm"><link name="base">{_INERTIAL.format(m=1, i=0.01)}</link>
<joint name="shoulder" type="revolute"><parent link="base"/><child link="upper"/><axis xyz="0 0 1"/>
<limit lower="{lower}" upper="1" effort="1" velocity="1"/></joint>
<link name="upper">{middle}</link>
<joint name="wrist" type="{leaf_joint}"><parent link="upper"/><child link="hand"/><origin xyz="{xyz}"/>
<axis xyz="0 1 0"/><limit lower="-1" upper="1" effort="1" velocity="1"/>{extra}</joint>
<link name="hand">{leaf}</link></robot>"""


def _load(xml: str, **kw) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "no <inertial>" is warned about by design
        return diffmech.load_urdf(xml, **kw)


def _refused(xml: str, *fragments: str, **kw) -> str:
    with pytest.raises(ModelError) as info:
        _load(xml, **kw)
    for f in fragments:
        assert f in str(info.value), f"{f!r} not in {str(info.value)!r}"
    return str(info.value)


def _finite_dynamics(robot: diffmech.RobotModel) -> None:
    g = torch.Generator().manual_seed(0)
    q = robot.random_configuration(4, generator=g)
    v, tau = torch.randn(4, robot.nv, generator=g, dtype=robot.dtype), torch.randn(4, robot.nv, dtype=robot.dtype)
    for out in (robot.forward_dynamics(q, v, tau), robot.inverse_dynamics(q, v, tau), robot.mass_matrix(q)):
        assert torch.isfinite(out).all()


# ---------------------------------------------------------------- item 2: models that load must simulate
def test_a_sound_arm_loads_and_simulates():
    _finite_dynamics(_load(_arm()))


def test_singular_inertia_on_a_floating_base_is_refused_by_link_and_value():
    import pybullet_data  # a required test oracle (the test extra): missing, it fails

    path = os.path.join(pybullet_data.getDataPath(), "random_urdfs", "000", "000.urdf")
    msg = _refused(path, "floating base's angular velocity z", "'random_obj_000'", "inertia diagonal [1.0, 1.0, 0.0]",
                   floating_base=True)
    assert path in msg


def test_a_massless_leaf_on_a_revolute_joint_is_refused():
    _refused(_arm(leaf=""), "joint 'wrist' moves no mass or inertia", "'hand' (mass 0")


def test_a_massless_leaf_on_a_fixed_joint_loads():
    robot = _load(_arm(leaf="", leaf_joint="fixed"))
    assert robot.nv == 1
    _finite_dynamics(robot)


def test_a_massless_link_carrying_mass_loads():
    _finite_dynamics(_load(_arm(middle="")))  # 'upper' is massless but 'hand' hangs off it


def test_coaxial_joints_joined_by_a_massless_link_are_refused():
    # the wrist turns about the shoulder's axis, through it: a massless 'upper' cannot tell them apart
    xml = _arm(middle="", xyz="0 0 0").replace('<axis xyz="0 1 0"/>', '<axis xyz="0 0 1"/>')
    _refused(xml, "mass matrix is singular", "joint 'shoulder'", "joint 'wrist'")


@pytest.mark.parametrize("extra, fragments", [
    ('<mimic joint="shoulder" multiplier="nan"/>', ("joint 'wrist'", "<mimic multiplier> is NaN")),
    ('<mimic joint="shoulder" offset="inf"/>', ("joint 'wrist'", "<mimic offset> is inf")),
    ('<dynamics damping="-0.5"/>', ("joint 'wrist'", "damping -0.5 is negative")),
])
def test_bad_joint_numbers_are_refused(extra, fragments):
    _refused(_arm(extra=extra), *fragments)


def test_a_nan_limit_is_refused():
    _refused(_arm(lower="nan"), "joint 'shoulder'", "<limit lower> is NaN")


@pytest.mark.parametrize("value", ["1e15", "1e300", "-1e20"])
def test_numbers_that_overflow_are_refused(value):
    _refused(_arm(leaf=_INERTIAL.format(m=value, i=0.01)), "link 'hand'", "<mass value>", "exceeds 1e+09")
    _refused(_arm(xyz=f"0 {value} 0"), "joint 'wrist'", "<origin xyz>[1]", "exceeds")


def test_infinite_limits_mean_no_limit():
    robot = _load(_arm().replace('lower="-1" upper="1" effort="1" velocity="1"', 'lower="-inf" upper="inf" '
                                 'effort="inf" velocity="inf"', 1))
    assert math.isinf(float(robot.position_lower[0]))
    _finite_dynamics(robot)


def test_a_non_positive_semi_definite_inertia_is_refused():
    leaf = _INERTIAL.format(m=1, i=0.01).replace('izz="0.01"', 'izz="-0.01"')
    _refused(_arm(leaf=leaf), "link 'hand'", "not positive semi-definite")


def test_the_builders_and_mjcf_take_the_same_rules(tmp_path):
    # the builders check their own arguments; what they (or anyone) build goes through the rules
    from diffmech.model.spec import JointSpec, LinkSpec, RobotSpec

    bad = RobotSpec("built", [LinkSpec("a", 1.0, inertia=((1, 0, 0), (0, 1, 0), (0, 0, 1))), LinkSpec("b", -1.0)],
                    [JointSpec("j", "revolute", "a", "b")])
    with pytest.raises(ModelError, match="<memory>: link 'b': mass -1.0 is negative"):
        diffmech.RobotModel(bad)
    bad.links[1].mass = 1.0
    bad.joints.append(JointSpec("k", "revolute", "b", "c", mimic=("j", math.nan, 0.0)))
    bad.links.append(LinkSpec("c", 1.0, com=(0.1, 0, 0)))
    with pytest.raises(ModelError, match="<memory>: joint 'k': mimic multiplier is NaN"):
        diffmech.RobotModel(bad)
    from diffmech.model.mjcf import load_mjcf  # MuJoCo's compiler: a required test oracle

    path = tmp_path / "coax.xml"  # MuJoCo compiles it (its floor is 1e-15); the mass matrix is singular
    path.write_text("""<mujoco model="coax"><worldbody><body name="a" pos="0 0 1"><joint name="j1" axis="0 0 1"/>
      <inertial pos="0 0 0" mass="1e-13" diaginertia="1e-13 1e-13 1e-13"/>
      <body name="b" pos="0 0 0.1"><joint name="j2" axis="0 0 1"/>
      <inertial pos="0.1 0 0" mass="1" diaginertia="0.01 0.01 0.01"/></body></body></worldbody></mujoco>""")
    with pytest.raises(ModelError, match="mass matrix is singular.*joint 'j1' and joint 'j2'"):
        load_mjcf(path)


# ---------------------------------------------------------------- item 3: load_state_dict
def _iiwa() -> diffmech.RobotModel:
    return copy.deepcopy(get_robot("iiwa"))


@pytest.mark.parametrize("key, value, fragment", [
    ("links.3.mass", torch.tensor(-1.0, dtype=torch.float64), "link 'iiwa_link_3': mass -1.0 is negative"),
    ("links.4.inertia", torch.diag(torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)),
     "link 'iiwa_link_4': inertia is not positive semi-definite"),
    ("joints.1.origin_xyz", torch.tensor([0.0, math.nan, 0.0], dtype=torch.float64), "origin xyz[1] is NaN"),
])
def test_load_state_dict_refuses_what_the_loader_refuses_and_keeps_the_model(key, value, fragment):
    robot = _iiwa()
    before = {k: t.clone() for k, t in robot.state_dict().items()}
    sd = robot.state_dict()
    sd = {k: t.clone() for k, t in sd.items()}
    sd[key] = value
    with pytest.raises(ModelError, match="load_state_dict") as info:
        robot.load_state_dict(sd)
    assert fragment in str(info.value)
    for k, t in robot.state_dict().items():
        assert torch.equal(t, before[k]), k
    _finite_dynamics(robot)


def test_load_state_dict_refuses_a_massless_moving_leaf():
    robot = _iiwa()
    sd = {k: t.clone() for k, t in robot.state_dict().items()}
    leaf = robot.link_names.index("iiwa_link_7")
    sd[f"links.{leaf}.mass"].zero_()
    sd[f"links.{leaf}.inertia"].zero_()
    for k in range(leaf + 1, robot.n_links):  # what hangs off link 7 (the flange, fixed) too
        sd[f"links.{k}.mass"].zero_()
        sd[f"links.{k}.inertia"].zero_()
    with pytest.raises(ModelError, match="joint 'iiwa_joint_7' moves no mass or inertia"):
        robot.load_state_dict(sd)


def test_load_state_dict_of_a_wrapping_module_is_checked_too():
    class Wrapper(nn.Module):
        def __init__(self, robot):
            super().__init__()
            self.robot = robot

    outer = Wrapper(_iiwa())
    sd = {k: t.clone() for k, t in outer.state_dict().items()}
    sd["robot.links.3.mass"] = torch.tensor(-2.0, dtype=torch.float64)
    with pytest.raises(ModelError, match="mass -2.0 is negative"):
        outer.load_state_dict(sd)
    assert float(outer.robot.link_params(3).mass) > 0


def test_a_valid_state_dict_still_loads():
    robot, other = _iiwa(), _iiwa()
    with torch.no_grad():
        other.link_params(3).mass.mul_(1.5)
    robot.load_state_dict(other.state_dict())
    assert float(robot.link_params(3).mass) == float(other.link_params(3).mass)


# ---------------------------------------------------------------- make_link_param_learnable's initial value
class _Negative(nn.Module):
    def forward(self, x):
        return -x.abs() - 1.0


class _NanSource(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = nn.Parameter(torch.tensor(float("nan"), dtype=torch.float64))

    def forward(self):
        return self.p


def test_a_parametrization_that_starts_unphysical_is_refused_and_the_model_kept():
    robot = _iiwa()
    link = robot.link_names[3]
    mass = float(robot.link_params(link).mass)
    with pytest.raises(ModelError, match=f"link '{link}': mass -[0-9.]+ is negative"):
        robot.make_link_param_learnable(link, "mass", _Negative())
    assert not robot.learnable_parameters()
    assert float(robot.link_params(link).mass) == mass
    with pytest.raises(ModelError, match=f"initial value of learnable 'mass'.*link '{link}'.*NaN"):
        robot.make_link_param_learnable(link, "mass", _NanSource())
    _finite_dynamics(robot)


# ---------------------------------------------------------------- item 10: inputs
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_inputs_are_named(dtype):
    robot = get_robot("iiwa")
    z = torch.zeros(robot.nv, dtype=dtype)
    for call in (lambda: robot.forward_dynamics(z, z, z), lambda: robot.inverse_dynamics(z, z, z),
                 lambda: robot.mass_matrix(z), lambda: robot.forward_dynamics(z[None], z[None], z[None])):
        with pytest.raises(ShapeError, match=f"'q' has dtype {dtype}.*float32 or float64"):
            call()


def test_non_finite_inputs_propagate_by_default_and_are_named_on_request():
    from diffmech.dynamics import check_finite_inputs

    robot = get_robot("iiwa")
    z = torch.zeros(robot.nv, dtype=torch.float64)
    v = z.clone()
    v[2] = math.inf
    assert not check_finite_inputs()
    assert not torch.isfinite(robot.forward_dynamics(z, v, z)).all()  # documented: NaN in, NaN out
    try:
        check_finite_inputs(True)
        for call in (lambda: robot.forward_dynamics(z, v, z), lambda: robot.inverse_dynamics(z, v, z)):
            with pytest.raises(ShapeError, match="'v' is not finite: inf at batch element 0, entry 2"):
                call()
        with pytest.raises(ShapeError, match="'q' is not finite: nan"):
            robot.mass_matrix(torch.full((2, 3, robot.nq), math.nan, dtype=torch.float64))
        assert torch.isfinite(robot.forward_dynamics(z, z, z)).all()
    finally:
        check_finite_inputs(False)


@pytest.mark.parametrize("dt", [0.0, -0.01, math.nan, math.inf, "0.01", True])
def test_a_step_refuses_a_bad_dt(dt):
    from diffmech.sim.integrators import get_integrator

    robot = systems.double_pendulum()
    z = torch.zeros(2, dtype=torch.float64)
    with pytest.raises(ShapeError, match="dt must be a positive finite number"):
        get_integrator("semi_implicit_euler")(robot, z, z, z, dt)


def test_contact_step_refuses_a_bad_dt():
    from diffmech.sim.contact_step import contact_step
    from diffmech.sim.scene import Scene

    scene = Scene([systems.box((0.2, 0.2, 0.2), 1.0, name="box")])
    q = torch.zeros(1, scene.nq, dtype=torch.float64)
    q[:, 6] = 1.0
    q[:, 2] = 0.5
    v = torch.zeros(1, scene.nv, dtype=torch.float64)
    contact_step(scene, q, v, v, 1e-3)
    for dt in (0.0, -1e-3, math.nan):
        with pytest.raises(DiffmechError, match="contact_step: dt must be a positive finite number"):
            contact_step(scene, q, v, v, dt)


def test_magnitude_bound_is_the_documented_one():
    assert MAX_MAGNITUDE == 1e9
