"""Bad input raises a diffmech error (``diffmech.errors``) whose message names the culprit.

Every check asserts the exception class *and* that the offending file, link, joint, tensor or
option appears in the message, so a bare torch/lxml traceback or a vague message fails.
"""

from __future__ import annotations

import contextlib
import warnings

import pytest
import torch

import diffmech
from diffmech.errors import DiffmechError, ModelError, OptionError, ShapeError, URDFError

DT = torch.float64

_INERTIAL = (
    '<inertial><mass value="{mass}"/>'
    '<inertia ixx="{ixx}" ixy="0" ixz="0" iyy="0.02" iyz="0" izz="0.03"/></inertial>'
)


def link(name: str, mass: float | str = 1.0, ixx: float = 0.01, inertial: bool = True) -> str:
    body = _INERTIAL.format(mass=mass, ixx=ixx) if inertial else ""
    return f'<link name="{name}">{body}</link>'


def joint(name: str, parent: str, child: str, type: str = "revolute", axis: str = "0 0 1", extra: str = "") -> str:
    limit = '<limit lower="-1" upper="1" effort="10" velocity="2"/>' if type in ("revolute", "prismatic") else ""
    return (
        f'<joint name="{name}" type="{type}"><parent link="{parent}"/><child link="{child}"/>'
        f'<origin xyz="0 0 0.2" rpy="0 0 0"/><axis xyz="{axis}"/>{limit}{extra}</joint>'
    )


def robot_xml(*parts: str, name: str = "probe") -> str:
    return f'<?xml version="1.0"?>\n<robot name="{name}">' + "".join(parts) + "</robot>"


# shoulder -elbow_joint-> forearm -wrist_joint-> hand
GOOD = robot_xml(
    link("shoulder"), link("forearm"), link("hand"),
    joint("elbow_joint", "shoulder", "forearm"), joint("wrist_joint", "forearm", "hand", axis="0 1 0"),
)


@contextlib.contextmanager
def raises(exc: type[Exception], *fragments: str):
    """Like ``pytest.raises`` but also requires each fragment verbatim in the message."""
    with pytest.raises(exc) as info:
        yield info
    assert isinstance(info.value, DiffmechError)
    msg = str(info.value)
    for frag in fragments:
        assert frag in msg, f"{frag!r} not in message: {msg!r}"


@pytest.fixture(scope="module")
def arm():
    return diffmech.load_urdf(GOOD)


@pytest.fixture
def state(arm):
    z = torch.zeros(arm.nq, dtype=DT)
    return z, z.clone(), z.clone()


def test_good_model_loads(arm):
    # Sanity: the fixture the shape tests rely on is valid and has the expected layout.
    assert arm.link_names == ["shoulder", "forearm", "hand"]
    assert arm.joint_names == ["elbow_joint", "wrist_joint"]
    assert arm.nq == arm.nv == 2


def test_error_hierarchy():
    assert issubclass(URDFError, ModelError) and issubclass(ModelError, DiffmechError)
    assert issubclass(ShapeError, DiffmechError)
    # Callers catching ValueError keep working.
    assert issubclass(ModelError, ValueError) and issubclass(ShapeError, ValueError)


# ---------------------------------------------------------------- files and XML
def test_nonexistent_file(tmp_path):
    path = tmp_path / "missing_robot.urdf"
    with raises(URDFError, str(path)):
        diffmech.load_urdf(path)


def test_empty_file_is_malformed_xml(tmp_path):
    path = tmp_path / "empty_robot.urdf"
    path.write_text("")
    with raises(URDFError, str(path), "malformed XML"):
        diffmech.load_urdf(path)


def test_text_that_is_not_xml(tmp_path):
    path = tmp_path / "prose.urdf"
    path.write_text("this is not a robot description")
    with raises(URDFError, str(path)):
        diffmech.load_urdf(path)


_BROKEN_XML = {
    # a closing tag that does not match its opening tag
    "mismatched_tag": GOOD.replace("</link>", "</lnk>", 1),
    # the document stops before </robot>
    "truncated": GOOD[: GOOD.rindex("</robot>")],
    # junk after the root element
    "trailing_junk": GOOD + "<junk>",
}


@pytest.mark.parametrize("kind", sorted(_BROKEN_XML))
def test_malformed_xml_file(tmp_path, kind):
    path = tmp_path / f"{kind}.urdf"
    path.write_text(_BROKEN_XML[kind])
    with raises(URDFError, str(path), "malformed XML"):
        diffmech.load_urdf(path)


def test_malformed_xml_string():
    with raises(URDFError, "<urdf string>", "malformed XML"):
        diffmech.load_urdf(_BROKEN_XML["mismatched_tag"])


def test_non_numeric_mass():
    xml = GOOD.replace(link("forearm"), link("forearm", mass="heavy"))
    with raises(URDFError, "forearm", "heavy"):
        diffmech.load_urdf(xml)


# ---------------------------------------------------------------- topology
def test_joint_names_missing_link():
    xml = robot_xml(link("shoulder"), link("forearm"), joint("elbow_joint", "shoulder", "ghost_link"))
    with raises(ModelError, "elbow_joint", "ghost_link"):
        diffmech.load_urdf(xml)


def test_missing_parent_link():
    xml = robot_xml(link("shoulder"), link("forearm"), joint("elbow_joint", "phantom_base", "forearm"))
    with raises(ModelError, "elbow_joint", "phantom_base"):
        diffmech.load_urdf(xml)


def test_two_roots():
    xml = robot_xml(link("shoulder"), link("forearm"), link("island"), joint("elbow_joint", "shoulder", "forearm"))
    with raises(ModelError, "shoulder", "island"):
        diffmech.load_urdf(xml)


def test_cycle_below_a_root():
    xml = robot_xml(
        link("shoulder"), link("upper"), link("lower"),
        joint("j_up", "lower", "upper"), joint("j_down", "upper", "lower"),
    )
    with raises(ModelError, "cycle", "upper", "lower"):
        diffmech.load_urdf(xml)


def test_cycle_without_root_names_its_links():
    xml = robot_xml(
        link("upper"), link("lower"), joint("j_up", "lower", "upper"), joint("j_down", "upper", "lower"),
    )
    with raises(ModelError, "cycle", "upper", "lower"):
        diffmech.load_urdf(xml)


def test_cycle_without_root_is_a_model_error():
    # What works today for the root-less cycle: the right class and the word "cycle".
    xml = robot_xml(
        link("upper"), link("lower"), joint("j_up", "lower", "upper"), joint("j_down", "upper", "lower"),
    )
    with raises(ModelError, "cycle"):
        diffmech.load_urdf(xml)


def test_link_with_two_parents():
    xml = robot_xml(
        link("shoulder"), link("forearm"), link("hand"),
        joint("elbow_joint", "shoulder", "forearm"), joint("wrist_joint", "forearm", "hand"),
        joint("shortcut_joint", "shoulder", "hand"),
    )
    with raises(ModelError, "hand", "wrist_joint", "shortcut_joint"):
        diffmech.load_urdf(xml)


def test_duplicate_link_names():
    xml = robot_xml(link("shoulder"), link("forearm"), link("forearm"), joint("elbow_joint", "shoulder", "forearm"))
    with raises(ModelError, "duplicate", "forearm"):
        diffmech.load_urdf(xml)


def test_duplicate_joint_names_in_spec():
    # Via RobotSpec: a URDF parser may already collapse duplicate names.
    spec = diffmech.parse_urdf(GOOD)
    spec.joints[1].name = spec.joints[0].name
    with raises(ModelError, "duplicate", "elbow_joint"):
        diffmech.RobotModel(spec)


@pytest.mark.parametrize("jtype", ["planar", "floating"])
def test_unknown_joint_type_urdf(jtype):
    xml = GOOD.replace('name="wrist_joint" type="revolute"', f'name="wrist_joint" type="{jtype}"')
    with raises(URDFError, "wrist_joint", jtype):
        diffmech.load_urdf(xml)


def test_unknown_joint_type_spec():
    spec = diffmech.parse_urdf(GOOD)
    spec.joints[1].type = "spherical"
    with raises(ModelError, "wrist_joint", "spherical"):
        diffmech.RobotModel(spec)


def test_mimic_joint_loads_with_one_coordinate_less():
    xml = GOOD.replace(
        'name="wrist_joint" type="revolute"><parent link="forearm"/>',
        'name="wrist_joint" type="revolute"><mimic joint="elbow_joint" multiplier="2"/><parent link="forearm"/>',
    )
    robot = diffmech.load_urdf(xml)
    assert "wrist_joint" not in robot.joint_names and robot.nv == robot.tree.nv - 1


def test_mimic_cycle():
    xml = GOOD.replace(
        'name="wrist_joint" type="revolute"><parent link="forearm"/>',
        'name="wrist_joint" type="revolute"><mimic joint="elbow_joint"/><parent link="forearm"/>',
    ).replace(
        'name="elbow_joint" type="revolute"><parent link="shoulder"/>',
        'name="elbow_joint" type="revolute"><mimic joint="wrist_joint"/><parent link="shoulder"/>',
    )
    assert xml.count("<mimic") == 2, "fixture changed"
    with raises(ModelError, "cycle", "wrist_joint", "elbow_joint"):
        diffmech.load_urdf(xml)


@pytest.mark.parametrize("axis", ["0 0 0", "nan 0 1"])
def test_zero_or_invalid_joint_axis(axis):
    xml = GOOD.replace(joint("wrist_joint", "forearm", "hand", axis="0 1 0"), joint("wrist_joint", "forearm", "hand",
                                                                                    axis=axis))
    with raises(ModelError, "wrist_joint", "axis"):
        diffmech.load_urdf(xml)


def test_inverted_joint_limits():
    xml = GOOD.replace('<limit lower="-1" upper="1"', '<limit lower="1" upper="-1"', 1)
    with raises(ModelError, "elbow_joint", "limit"):
        diffmech.load_urdf(xml)


def test_robot_without_moving_joint():
    """A static model (as Pinocchio builds it; tests/test_static_obstacles.py has the rest)."""
    xml = robot_xml(link("shoulder"), link("forearm"), joint("weld", "shoulder", "forearm", type="fixed"))
    robot = diffmech.load_urdf(xml)
    assert (robot.nq, robot.nv, robot.tree.nb) == (0, 0, 0)


# ---------------------------------------------------------------- inertial data
@pytest.mark.parametrize("mass", [-1.5, "nan", "inf"])
def test_invalid_mass(mass):
    xml = GOOD.replace(link("forearm"), link("forearm", mass=mass))
    with raises(ModelError, "forearm", "mass"):
        diffmech.load_urdf(xml)


def test_inertia_not_positive_semidefinite_urdf():
    xml = GOOD.replace(link("hand"), link("hand", ixx=-0.5))
    with raises(ModelError, "hand", "positive"):
        diffmech.load_urdf(xml)


def test_inertia_not_symmetric_spec():
    # URDF stores six numbers so cannot express this; a RobotSpec can.
    spec = diffmech.parse_urdf(GOOD)
    spec.links[2].inertia = ((0.01, 0.002, 0.0), (0.0, 0.02, 0.0), (0.0, 0.0, 0.03))
    with raises(ModelError, "hand", "symmetric"):
        diffmech.RobotModel(spec)


def test_inertia_not_finite_spec():
    spec = diffmech.parse_urdf(GOOD)
    spec.links[1].inertia = ((float("nan"), 0.0, 0.0), (0.0, 0.02, 0.0), (0.0, 0.0, 0.03))
    with raises(ModelError, "forearm", "inertia"):
        diffmech.RobotModel(spec)


def test_link_without_inertial_warns_with_its_name():
    # welded: a massless link on a moving joint is refused (tests/test_validation.py)
    xml = robot_xml(link("shoulder"), link("forearm"), link("hand", inertial=False),
                    joint("elbow_joint", "shoulder", "forearm"), joint("wrist_joint", "forearm", "hand", type="fixed"))
    with pytest.warns(UserWarning, match="'hand' has no <inertial>"):
        robot = diffmech.load_urdf(xml)
    assert float(robot.link_params("hand").mass) == 0.0


def test_links_with_inertial_do_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        diffmech.load_urdf(GOOD)


def test_non_floating_dtype():
    with raises(ModelError, "int64"):
        diffmech.load_urdf(GOOD, dtype=torch.int64)


def test_load_urdf_bad_gravity():
    with raises(ModelError, "gravity", "(2,)"):
        diffmech.load_urdf(GOOD, gravity=(0.0, -9.81))


def test_set_gravity_bad_shape(arm):
    with raises(ModelError, "gravity", "(2,)"):
        arm.set_gravity([0.0, -9.81])


# ---------------------------------------------------------------- state tensors
def test_wrong_q_length(arm):
    with raises(ShapeError, "'q'", "(3,)", f"(..., {arm.nq})"):
        arm.mass_matrix(torch.zeros(3, dtype=DT))


@pytest.mark.parametrize("method", ["forward_kinematics", "generalized_gravity", "center_of_mass", "potential_energy"])
def test_wrong_q_length_every_algorithm(arm, method):
    with raises(ShapeError, "'q'", "(4, 5)"):
        getattr(arm, method)(torch.zeros(4, 5, dtype=DT))


def test_wrong_v_length(arm, state):
    q, _, a = state
    with raises(ShapeError, "'v'", "(5,)"):
        arm.inverse_dynamics(q, torch.zeros(5, dtype=DT), a)


def test_wrong_tau_length(arm, state):
    q, v, _ = state
    with raises(ShapeError, "'tau'", "(2, 1)"):
        arm.forward_dynamics(q, v, torch.zeros(2, 1, dtype=DT))


def test_scalar_q(arm):
    with raises(ShapeError, "'q'", "()"):
        arm.mass_matrix(torch.tensor(0.0, dtype=DT))


def test_integer_q(arm):
    with raises(ShapeError, "'q'", "int64"):
        arm.forward_kinematics(torch.zeros(arm.nq, dtype=torch.long))


def test_unconvertible_q(arm):
    with raises(ShapeError, "'q'"):
        arm.forward_kinematics("elbow up")


def test_mismatched_dtype(arm, state):
    q, v, a = state
    with raises(ShapeError, "'v'", "float32", "'q'", "float64"):
        arm.inverse_dynamics(q, v.float(), a)


def test_mismatched_dtype_forward_dynamics(arm, state):
    q, v, tau = state
    with raises(ShapeError, "'tau'", "float32"):
        arm.forward_dynamics(q, v, tau.float())


def test_mismatched_device_between_inputs(arm, state):
    q, v, a = state
    with raises(ShapeError, "'v'", "meta", "'q'", "cpu"):
        arm.inverse_dynamics(q, v.to("meta"), a)


def test_inputs_on_other_device_than_model(arm, state):
    q, v, a = state
    with raises(ShapeError, "meta", "cpu", "model"):
        arm.inverse_dynamics(q.to("meta"), v.to("meta"), a.to("meta"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_mismatched_device_cuda(arm, state):
    q, v, a = state
    with raises(ShapeError, "'v'", "cuda"):
        arm.inverse_dynamics(q, v.cuda(), a)


def test_non_broadcastable_batches(arm):
    q = torch.zeros(3, arm.nq, dtype=DT)
    v = torch.zeros(4, arm.nv, dtype=DT)
    with raises(ShapeError, "broadcast", "q (3, 2)", "v (4, 2)"):
        arm.inverse_dynamics(q, v, torch.zeros(arm.nv, dtype=DT))


def test_non_broadcastable_batches_forward_dynamics(arm):
    q = torch.zeros(2, 1, arm.nq, dtype=DT)
    tau = torch.zeros(3, 4, arm.nv, dtype=DT)
    with raises(ShapeError, "broadcast", "tau (3, 4, 2)"):
        arm.forward_dynamics(q, torch.zeros(arm.nv, dtype=DT), tau)


def test_integrate_dt_not_broadcastable(arm):
    q = torch.zeros(2, arm.nq, dtype=DT)
    with raises(ShapeError, "dt", "(3,)"):
        arm.integrate(q, torch.zeros_like(q), torch.zeros(3, dtype=DT))


# ---------------------------------------------------------------- names and options
@pytest.mark.parametrize("call", ["jacobian", "link_pose"])
def test_unknown_link(arm, state, call):
    with raises(ModelError, "gripper_tip", "hand"):  # the message lists the available links
        getattr(arm, call)(state[0], "gripper_tip")


def test_link_index_out_of_range(arm, state):
    with raises(ModelError, "17", "out of range"):
        arm.jacobian(state[0], 17)


def test_unknown_frame(arm, state):
    with raises(OptionError, "body_fixed", "world_aligned"):
        arm.jacobian(state[0], "hand", frame="body_fixed")


def test_point_with_world_frame(arm, state):
    with raises(OptionError, "point", "world"):
        arm.jacobian(state[0], "hand", frame="world", point=torch.zeros(3, dtype=DT))


def test_point_wrong_shape(arm, state):
    with raises(ShapeError, "'point'", "(2,)"):
        arm.jacobian(state[0], "hand", point=torch.zeros(2, dtype=DT))


def test_unknown_forward_dynamics_method(arm, state):
    with raises(OptionError, "featherstone", "aba", "crba"):
        arm.forward_dynamics(*state, method="featherstone")


def test_f_ext_wrong_trailing_shape(arm, state):
    with raises(ShapeError, "'f_ext'", f"(..., {arm.n_links}, 6)", f"({arm.n_links}, 3)"):
        arm.forward_dynamics(*state, f_ext=torch.zeros(arm.n_links, 3, dtype=DT))


def test_f_ext_wrong_link_count(arm, state):
    with raises(ShapeError, "'f_ext'", f"({arm.n_links - 1}, 6)"):
        arm.inverse_dynamics(*state, f_ext=torch.zeros(arm.n_links - 1, 6, dtype=DT))


def test_f_ext_flat_vector(arm, state):
    # A common mistake: one wrench for the whole robot instead of one per link.
    with raises(ShapeError, "'f_ext'", "(6,)"):
        arm.forward_dynamics(*state, f_ext=torch.zeros(6, dtype=DT))


def test_f_ext_batch_not_broadcastable(arm):
    q = torch.zeros(2, arm.nq, dtype=DT)
    f = torch.zeros(3, arm.n_links, 6, dtype=DT)
    with raises(ShapeError, "broadcast", "f_ext (3, 3, 6)"):
        arm.inverse_dynamics(q, q, q, f_ext=f)


def test_unknown_parameter_name():
    robot = diffmech.load_urdf(GOOD)
    with raises(ModelError, "colour", "mass"):  # the message lists the valid names
        robot.make_link_param_learnable("forearm", "colour")


def test_learnable_parameter_of_unknown_link():
    robot = diffmech.load_urdf(GOOD)
    with raises(ModelError, "gripper_tip"):
        robot.make_link_param_learnable("gripper_tip", "mass")


def test_joint_parameter_of_root_link():
    robot = diffmech.load_urdf(GOOD)
    with raises(ModelError, "shoulder", "damping"):
        robot.make_link_param_learnable("shoulder", "damping")


def test_freeze_unknown_parameter():
    robot = diffmech.load_urdf(GOOD)
    with raises(ModelError, "colour"):
        robot.freeze_link_param("forearm", "colour")


def test_unknown_joint_params(arm):
    with raises(ModelError, "knee_joint", "elbow_joint"):
        arm.joint_params("knee_joint")


def test_warnings_point_at_the_callers_line():
    xml = robot_xml(
        '<link name="a"/>', link("b"), joint("j", "a", "b"),
    )
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        diffmech.load_urdf(xml)
        diffmech.RobotModel(diffmech.parse_urdf(xml))
    msgs = [x for x in w if "no <inertial>" in str(x.message)]
    assert len(msgs) == 2 and all(x.filename == __file__ for x in msgs), [(x.filename, x.lineno) for x in msgs]
