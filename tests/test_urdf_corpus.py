"""diffmech loads the URDF files Pinocchio loads, and matches Pinocchio's dynamics on each.

The corpus is every ``*.urdf`` of ``pybullet_data`` and ``diff_robot_data``. A file Pinocchio
refuses is skipped with urdfdom's reason; a file Pinocchio loads must either load in diffmech and
match RNEA, CRBA and ABA (float64, seeded random states, fixed base; floating base too for the
legged robots) or be refused the way :data:`EXPECTED_REFUSALS` says. Robots without a moving joint
(objects, scenery) load as static models, ``nq = nv = 0`` as in Pinocchio. The default run checks the
files of :data:`DEFAULT`; the whole corpus is ``-m slow``.

Then the loader's tolerance for what urdfdom and PyBullet accept: an XML declaration with version
"0.0", white space before it, undeclared namespace prefixes, geometry diffmech does not read.
"""

from __future__ import annotations

import contextlib
import gc
import glob
import os
import sys
import tempfile
import time
import warnings

import numpy as np
import pytest
import torch

import diffmech
from conftest import random_state
from diffmech.errors import ModelError, URDFError

pin = pytest.importorskip("pinocchio")
from oracle import PinOracle, has_mimic, pin_forward_dynamics, pinocchio_model, rel_err  # noqa: E402

TOL = 1e-9
N_STATES = 3

# diffmech refuses these files although Pinocchio loads them: label -> (error, message fragment, why).
EXPECTED_REFUSALS: dict[str, tuple[type[Exception], str, str]] = {
    # lower > upper is PyBullet's way to write an unlimited joint; diffmech refuses inverted limits.
    "pybullet_data/cube_no_rotation.urdf": (ModelError, "lower limit", "joint limits lower > upper"),
}

# Labels under these folders are also compared with a floating base.
FLOATING_DIRS = ("pybullet_data/quadruped/", "pybullet_data/a1/", "pybullet_data/aliengo/",
                 "pybullet_data/laikago/", "pybullet_data/mini_cheetah/")

# The default run: one file for each way a file can go -> the outcome it must have (a prefix).
DEFAULT = {
    "pybullet_data/quadruped/quadruped.urdf": "matched, floating base too",  # <?xml version="0.0" ?>
    "pybullet_data/differential/diff_ring.urdf": "matched",  # white space before the declaration; continuous
    "diff_robot_data/fetch_description/urdf/fetch.urdf": "matched",  # <sensor:camera>, no namespace declaration
    "pybullet_data/r2d2.urdf": "matched",  # continuous and prismatic joints
    "pybullet_data/xarm/xarm6_with_gripper.urdf": "matched",  # mimic joints (Pinocchio built with mimic=True)
    "pybullet_data/plane_implicit.urdf": "static: no moving joint",  # <plane> geometry is ignored
    "pybullet_data/quadruped/microtaur/microtaur.urdf": "pinocchio refuses: Parser found 4 elements",
}


def _roots() -> dict[str, str]:
    roots = {}
    with contextlib.suppress(ImportError):
        import pybullet_data

        roots["pybullet_data"] = pybullet_data.getDataPath()
    with contextlib.suppress(ImportError):
        import diff_robot_data

        roots["diff_robot_data"] = list(diff_robot_data.__path__)[0]
    return roots


def corpus() -> dict[str, str]:
    """label (``package/relative/path.urdf``) -> absolute path, for every URDF of the data packages."""
    files = {}
    for pkg, root in _roots().items():
        for path in glob.glob(os.path.join(root, "**", "*.urdf"), recursive=True):
            files[f"{pkg}/{os.path.relpath(path, root)}"] = path
    return dict(sorted(files.items()))


@contextlib.contextmanager
def _stderr_to(buf: list[str]):
    """Collect what C++ code writes to file descriptor 2 (urdfdom says there why it refuses a file)."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            buf.append(tmp.read().decode(errors="replace"))


def pinocchio_load(path: str):
    """``(model, None)``, or ``(None, why)`` when Pinocchio refuses ``path`` (urdfdom's first error line)."""
    err: list[str] = []
    try:
        with _stderr_to(err):
            return pinocchio_model(path), None
    except Exception as e:  # Pinocchio raises ValueError / RuntimeError with a generic message
        lines = [ln.strip() for ln in "".join(err).splitlines() if ln.strip().startswith("Error:")]
        return None, lines[0].removeprefix("Error:").strip() if lines else f"{type(e).__name__}: {e}"


def _load(path: str, floating_base: bool) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        # massless links and ignored geometry are expected in this corpus; the focused tests check the warnings
        warnings.simplefilter("ignore", UserWarning)
        return diffmech.load_urdf(path, floating_base=floating_base)


def _expect_refusal(label: str, path: str, exc: type[Exception], fragment: str) -> None:
    try:
        _load(path, floating_base=False)
    except exc as e:
        assert fragment in str(e), f"{label}: refused, but not for the expected reason: {e}"
        return
    except Exception as e:
        raise AssertionError(f"{label}: expected {exc.__name__} ({fragment!r}), got {type(e).__name__}: {e}") from e
    raise AssertionError(f"{label}: diffmech now loads it; remove it from the list of expected refusals")


def _match(label: str, path: str, floating_base: bool) -> dict[str, float]:
    """diffmech's RNEA, CRBA and ABA against Pinocchio's on N_STATES seeded random states; the errors."""
    what = f"{label} ({'floating' if floating_base else 'fixed'} base)"
    try:
        robot = _load(path, floating_base)
    except Exception as e:
        raise AssertionError(f"{what}: Pinocchio loads it, diffmech refuses: {type(e).__name__}: {e}") from e
    oracle = PinOracle(robot, path)
    q, v, a, _ = random_state(robot, (N_STATES,), seed=7)
    qn, vn, an = q.numpy(), v.numpy(), a.numpy()
    checks = {
        "rnea": (robot.inverse_dynamics(q, v, a, passive=False), [oracle.rnea(*s) for s in zip(qn, vn, an)]),
        "crba": (robot.mass_matrix(q), [oracle.crba(x) for x in qn]),
        "aba": (robot.forward_dynamics(q, v, a, passive=False), [oracle.aba(*s) for s in zip(qn, vn, an)]),
    }
    errors = {}
    for name, (got, ref) in checks.items():
        errors[name] = rel_err(got.detach().numpy(), np.stack(ref))
        assert errors[name] < TOL, f"{what}: {name} differs from Pinocchio by {errors[name]:.1e} (relative)"
    return errors


def check_file(label: str, path: str, errors: dict[str, tuple[float, str]] | None = None) -> str:
    """Check one corpus file; returns "pinocchio refuses: ...", "expected refusal: ..." or "matched ...".

    ``errors``: updated with the largest relative error of each algorithm and the file it came from.
    """
    model, reason = pinocchio_load(path)
    if model is None:
        return f"pinocchio refuses: {reason}"
    if label in EXPECTED_REFUSALS:
        exc, fragment, why = EXPECTED_REFUSALS[label]
        _expect_refusal(label, path, exc, fragment)
        return f"expected refusal: {why}"
    if model.nv == 0:  # scenery: a static model (tests/test_static_obstacles.py checks its placements)
        robot = _load(path, floating_base=False)
        assert (robot.nq, robot.nv) == (model.nq, 0), f"{label}: nq {robot.nq}, nv {robot.nv}; Pinocchio {model.nq}, 0"
        return "static: no moving joint"
    bases = [False, True] if label.startswith(FLOATING_DIRS) else [False]
    for fb in bases:
        for name, err in _match(label, path, floating_base=fb).items():
            if errors is not None and err >= errors.get(name, (-1.0, ""))[0]:
                errors[name] = (err, label)
    return "matched, floating base too" if len(bases) == 2 else "matched"


@pytest.fixture(scope="module")
def files() -> dict[str, str]:
    found = corpus()
    if not found:
        pytest.skip("neither pybullet_data nor diff_robot_data is installed")
    return found


@pytest.mark.parametrize("label", list(DEFAULT))
def test_representative_file(files, label):
    if label.split("/")[0] not in _roots():
        pytest.skip(f"{label.split('/')[0]} is not installed")
    assert label in files, f"{label} is not in the installed data package: update DEFAULT"
    outcome = check_file(label, files[label])
    assert outcome.startswith(DEFAULT[label]), outcome


@pytest.mark.slow
def test_whole_corpus(files):
    outcomes: dict[str, str] = {}
    errors: dict[str, tuple[float, str]] = {}
    failures: list[str] = []
    seconds: dict[str, float] = {}
    for label, path in files.items():
        t0 = time.perf_counter()
        try:
            outcomes[label] = check_file(label, path, errors)
        except AssertionError as e:
            failures.append(str(e))
            outcomes[label] = "failed"
        seconds[label] = time.perf_counter() - t0
    pin_refused = {k: v for k, v in outcomes.items() if v.startswith("pinocchio refuses")}
    refused = [k for k, v in outcomes.items() if v.startswith("expected refusal")]
    matched = [k for k, v in outcomes.items() if v.startswith("matched")]
    print(f"\nURDF corpus: {len(files)} files found, {len(files) - len(pin_refused)} loaded by Pinocchio, "
          f"{len(matched)} matched ({sum(v.endswith('too') for v in outcomes.values())} with a floating base too), "
          f"{len(refused)} expected refusals, "
          f"{sum(v.startswith('static') for v in outcomes.values())} static (without a moving joint), "
          f"{len(failures)} failed")
    for name, (err, label) in errors.items():
        print(f"  largest {name} error {err:.1e} ({label})")
    for label, why in pin_refused.items():
        print(f"  {label}: {why}")
    for label in sorted(seconds, key=seconds.get, reverse=True)[:5]:
        print(f"  slowest: {label} {seconds[label]:.2f} s ({outcomes[label]})")
    roots = _roots()
    stale = [k for k in EXPECTED_REFUSALS if k.split("/")[0] in roots and k not in files]
    assert not stale, f"listed as expected refusals but not found: {stale}"
    assert not failures, "\n".join(failures)
    assert matched, "no file of the corpus was compared with Pinocchio"


# ---------------------------------------------------------------- what urdfdom and PyBullet accept
_LINK = ('<link name="{0}"><inertial><mass value="1"/>'
         '<inertia ixx="0.01" ixy="0" ixz="0" iyy="0.02" iyz="0" izz="0.03"/></inertial>{1}</link>')
_JOINT = ('<joint name="{0}" type="revolute"><parent link="{1}"/><child link="{2}"/>'
          '<origin xyz="0 0 0.2"/><axis xyz="0 1 0"/>{3}<limit lower="-1" upper="1" effort="5" velocity="2"/></joint>')


def arm_xml(base_extra: str = "", tip_extra: str = "", mimic: str = "", declaration: str = "") -> str:
    """base -j1-> mid -j2-> tip, with extra XML inside the links and a <mimic> inside j2."""
    return (declaration + '<robot name="probe">' + _LINK.format("base", base_extra) + _LINK.format("mid", "")
            + _LINK.format("tip", tip_extra) + _JOINT.format("j1", "base", "mid", "")
            + _JOINT.format("j2", "mid", "tip", mimic) + "</robot>")


@pytest.mark.parametrize("declaration", ['<?xml version="0.0" ?>\n', '\n  <?xml version="1.0"?>\n',
                                         "\ufeff<?xml version='0.0' encoding='utf-8'?>"])
def test_xml_declarations_urdfdom_accepts(tmp_path, declaration):
    path = tmp_path / "arm.urdf"
    path.write_bytes(arm_xml(declaration=declaration).encode("utf-8"))
    robot = diffmech.load_urdf(path)
    assert robot.joint_names == ["j1", "j2"]


def test_version_zero_still_checks_the_syntax(tmp_path):
    # libxml2 stops reporting errors after an unknown version in recover mode: the check must still run
    path = tmp_path / "truncated.urdf"
    text = arm_xml(declaration='<?xml version="0.0" ?>')
    path.write_text(text[: text.rindex("</robot>")])
    with pytest.raises(URDFError, match="malformed XML") as info:
        diffmech.load_urdf(path)
    assert str(path) in str(info.value)


def test_undeclared_namespace_prefix_is_an_extension():
    xml = arm_xml(tip_extra='<sensor:camera name="rgb"><sensor:fov>1.0</sensor:fov></sensor:camera>')
    assert diffmech.load_urdf(xml).link_names == ["base", "mid", "tip"]
    # but only that: the rest is checked strictly (libxml2 alone misses the junk after an undeclared prefix)
    for broken in (xml.replace("</robot>", "</robt>"), xml + "<junk>", xml[:-1]):
        with pytest.raises(URDFError, match="malformed XML"):
            diffmech.load_urdf(broken)


_PLANE = '<collision><geometry><plane normal="0 0 1"/></geometry></collision>'
_CAPSULE = '<visual><geometry><capsule radius="0.1" length="0.3"/></geometry></visual>'
_BOX = '<collision><geometry><box size="0.1 0.1 0.1"/></geometry></collision>'


def test_unknown_geometry_loads_with_one_warning_naming_the_links():
    xml = arm_xml(base_extra=_PLANE + _BOX, tip_extra=_CAPSULE + _PLANE)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        robot = diffmech.load_urdf(xml)
    ours = [w for w in caught if "geometry" in str(w.message)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    msg = str(ours[0].message)
    assert ours[0].category is UserWarning
    for frag in ("<urdf string>", "<plane>", "<capsule>", "'base'", "'tip'"):
        assert frag in msg, msg
    assert "'mid'" not in msg
    assert ours[0].filename == __file__  # stacklevel: the line that called load_urdf
    # dynamics are those of the same file without the unknown geometry
    ref = diffmech.load_urdf(arm_xml(base_extra=_BOX))
    q = robot.random_configuration(4, generator=torch.Generator().manual_seed(0))
    assert np.array_equal(robot.mass_matrix(q).numpy(), ref.mass_matrix(q).numpy())


def test_parse_urdf_warning_points_at_its_caller():
    with pytest.warns(UserWarning, match="<plane>") as rec:
        spec = diffmech.parse_urdf(arm_xml(base_extra=_PLANE))
    assert rec[0].filename == __file__
    assert [j.name for j in spec.joints] == ["j1", "j2"]


def test_empty_geometry_is_ignored_too():
    with pytest.warns(UserWarning, match="empty <geometry>.*'mid'"):
        diffmech.load_urdf(arm_xml().replace('<link name="mid">', '<link name="mid"><visual><geometry/></visual>'))


def test_wrong_count_of_numbers_names_the_joint():
    xml = arm_xml().replace('<origin xyz="0 0 0.2"/>', '<origin xyz="0 0 0.2" rpy="0 1.5 0 0"/>', 1)
    with pytest.raises(URDFError, match=r"j1.*<origin rpy> has 4 numbers, expected 3"):
        diffmech.load_urdf(xml)


def test_no_resource_warning(tmp_path):
    path = tmp_path / "arm.urdf"
    path.write_text(arm_xml())
    # recorded, not turned into errors: a ResourceWarning is issued while the file object is
    # deallocated, where an exception could not reach this test
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ResourceWarning)
        diffmech.load_urdf(path)
        diffmech.parse_urdf(path)
        gc.collect()
    assert not [str(w.message) for w in caught if w.category is ResourceWarning]


def test_rpy_near_a_right_angle_is_exact():
    # pybullet_data writes pi/2 as "1.5708"; asin(-R[2, 0]) lost half the digits of such a pitch
    pitch = 1.5707963
    spec = diffmech.parse_urdf(arm_xml().replace('<origin xyz="0 0 0.2"/>', f'<origin rpy="0.3 {pitch} -0.2"/>', 1))
    R = spec.joints[0].rpy
    assert abs(R[1] - pitch) < 1e-13, R


# ---------------------------------------------------------------- mimic joints
def test_mimic_is_parsed():
    spec = diffmech.parse_urdf(arm_xml(mimic='<mimic joint="j1" multiplier="-0.5" offset="0.1"/>'))
    j1, j2 = spec.joints
    assert j1.mimic is None
    assert j2.mimic == ("j1", -0.5, 0.1)
    spec = diffmech.parse_urdf(arm_xml(mimic='<mimic joint="j1"/>'))
    assert spec.joints[1].mimic == ("j1", 1.0, 0.0)  # URDF's defaults


def test_mimic_joint_matches_pinocchio(tmp_path):
    path = tmp_path / "arm.urdf"
    path.write_text(arm_xml(mimic='<mimic joint="j1" multiplier="2" offset="0.3"/>'))
    robot = diffmech.load_urdf(path)
    assert robot.nq == robot.nv == 1 and robot.joint_names == ["j1"]
    assert check_file("arm with a mimic joint", str(path)) == "matched"


@pytest.mark.parametrize("mimic, fragment", [
    ('<mimic joint="ghost"/>', "'ghost'"),
    ('<mimic joint="j2"/>', "'j2'"),
    ('<mimic multiplier="2"/>', "names no joint"),
    ('<mimic joint="j1" multiplier="two"/>', "'two'"),
])
def test_bad_mimic_names_the_joint(mimic, fragment):
    with pytest.raises(URDFError, match="j2") as info:
        diffmech.parse_urdf(arm_xml(mimic=mimic))
    assert fragment in str(info.value)


def test_pinocchio_mimic_model_is_the_constrained_model(tmp_path):
    """The oracle that mimic support will be tested against: Pinocchio's ``mimic=True`` model equals
    the model without mimic joints restricted to ``q_j2 = m q_j1 + c`` (``G^T tau``, ``G^T M G``)."""
    m_, c_ = -0.5, 0.1
    path = tmp_path / "mimic_arm.urdf"
    path.write_text(arm_xml(mimic=f'<mimic joint="j1" multiplier="{m_}" offset="{c_}"/>'))
    full, red = pinocchio_model(path), pinocchio_model(path, mimic=True)
    assert (full.nq, full.nv, red.nq, red.nv) == (2, 2, 1, 1) and has_mimic(red) and not has_mimic(full)
    mim = red.joints[red.getJointId("j2")].extract()
    assert (mim.scaling, mim.offset) == (m_, c_)
    df, dr = full.createData(), red.createData()
    G = np.array([[1.0], [m_]])
    rng = np.random.default_rng(0)
    for _ in range(3):
        q, v, a, tau = rng.standard_normal((4, 1))
        qf, vf, af = np.array([q[0], m_ * q[0] + c_]), G @ v, G @ a
        Mf = pin.crba(full, df, qf)
        Mf = np.triu(Mf) + np.triu(Mf, 1).T
        assert rel_err(pin.rnea(red, dr, q, v, a), G.T @ pin.rnea(full, df, qf, vf, af), per=0) < TOL
        assert rel_err(pin.crba(red, dr, q), G.T @ Mf @ G, per=0) < TOL
        ref = np.linalg.solve(G.T @ Mf @ G, tau - G.T @ pin.nonLinearEffects(full, df, qf, vf))
        assert rel_err(pin_forward_dynamics(red, dr, q, v, tau), ref, per=0) < TOL
    with pytest.raises(RuntimeError, match="Mimic"):  # why pin_forward_dynamics exists
        pin.aba(red, dr, q, v, tau)

