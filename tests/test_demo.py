"""The demo / command line end to end on a small subset of robots."""

import importlib.util
import json
import math
import subprocess
import sys

import pytest

from diffmech import cli, demo
from diffmech.demo import RobotEntry, RoundTripError, available_robots, format_table, run_demo

HAVE_DRD = importlib.util.find_spec("diff_robot_data") is not None


def _check_report(out, names):
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] and report["failures"] == []
    assert list(report["robots"]) == names
    for name in names:
        rec = report["robots"][name]
        png = out / rec["plot"]
        assert png.exists() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        sw = rec["sweep"]
        assert len(sw["s"]) == len(sw["mass_matrix_cond"]) == len(sw["gravity"]) == report["points"]
        assert len(sw["q"][0]) == rec["nq"] and len(sw["gravity"][0]) == rec["nv"]
        assert min(sw["mass_matrix_cond"]) >= 1.0
        assert rec["roundtrip"]["max_rel_err"] < 1e-8 and rec["roundtrip"]["batch"] == report["batch"]
    return report


def test_cli_demo_writes_report_and_plots(tmp_path, capsys):
    names = ["pendulum", "iiwa"] if HAVE_DRD else ["pendulum", "cartpole"]
    out = tmp_path / "demo"
    code = cli.main(["demo", "--out", str(out), "--robots", ",".join(names), "--batch", "16", "--points", "11",
                     "--no-progress"])
    assert code == 0
    report = _check_report(out, names)
    printed = capsys.readouterr().out
    for name in names:
        assert name in printed
    # The pendulum's gravity torque along the sweep is m g l sin(q) for the 1 kg, 1 m default.
    pend = report["robots"]["pendulum"]
    for q, g in zip(pend["sweep"]["q"], pend["sweep"]["gravity"]):
        assert abs(g[0] - 9.81 * math.sin(q[0])) < 1e-12
    if HAVE_DRD:
        iiwa = report["robots"]["iiwa"]
        assert (iiwa["nq"], iiwa["nv"], iiwa["links"]) == (7, 7, 9)


def test_demo_floating_base_and_bundled_systems(tmp_path):
    names = ["double_pendulum", "acrobot"]
    if importlib.util.find_spec("pybullet_data") is not None:
        names.append("laikago")
    report = run_demo(tmp_path, names, batch=8, points=5, progress=False, echo=False)
    _check_report(tmp_path, names)
    if "laikago" in names:
        rec = report["robots"]["laikago"]
        assert rec["floating_base"] and rec["nq"] == rec["nv"] + 1
        assert rec["sweep"]["q"][0][3:7] == [0.0, 0.0, 0.0, 1.0]  # base held at identity (x, y, z, w)
    table = format_table(report["robots"])
    assert table.splitlines()[0].split()[0] == "robot" and len(table.splitlines()) == len(names) + 2


def test_demo_fails_loudly_on_a_broken_round_trip(tmp_path):
    # A negative tolerance cannot be met: the report is still written, then the error is raised.
    with pytest.raises(RoundTripError, match="pendulum"):
        run_demo(tmp_path, ["pendulum"], batch=4, points=3, tol=-1.0, plots=False, progress=False, echo=False)
    report = json.loads((tmp_path / "report.json").read_text())
    assert not report["ok"] and report["failures"]
    # through the CLI: a tolerance below rounding cannot be met either (exit 1); a negative one is a usage error
    assert cli.main(["demo", "--out", str(tmp_path), "--robots", "double_pendulum", "--tol", "1e-300", "--no-plots",
                     "--no-progress", "--batch", "4", "--points", "3"]) == 1
    with pytest.raises(SystemExit) as exit_:
        cli.main(["demo", "--out", str(tmp_path), "--tol", "-1"])
    assert exit_.value.code == 2


def test_demo_rejects_unknown_robot(tmp_path, capsys):
    assert cli.main(["demo", "--out", str(tmp_path), "--robots", "pendulum,nonsense", "--no-progress"]) == 1
    assert "nonsense" in capsys.readouterr().err


def test_demo_list(capsys):
    assert cli.main(["demo", "--list"]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in available_robots())


def test_python_dash_m_entry_point():
    res = subprocess.run([sys.executable, "-m", "diffmech", "demo", "--list"], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr
    assert "pendulum" in res.stdout and "cartpole" in res.stdout


def test_demo_skips_robots_whose_package_is_missing(tmp_path, monkeypatch, capsys):
    def fake():
        def never():
            raise AssertionError("a robot whose package is missing must not be built")

        known = dict(available_robots())
        known["ghost"] = RobotEntry("ghost", "diffmech_no_such_package", never, "not installed")
        return known

    monkeypatch.setattr(demo, "available_robots", fake)
    report = run_demo(tmp_path, ["ghost", "pendulum"], batch=4, points=3, plots=False, progress=False)
    assert list(report["robots"]) == ["pendulum"]
    assert "diffmech_no_such_package" in report["skipped"]["ghost"]
    assert "skipped ghost" in capsys.readouterr().out


# massless links on moving joints are refused (docs/conventions.md, "Model validity"): the moving ones weigh
_MASS = '<inertial><mass value="0.1"/><inertia ixx="1e-3" iyy="1e-3" izz="1e-3" ixy="0" ixz="0" iyz="0"/></inertial>'
GRIPPER_ARM = f"""<robot name="gripper_arm">
  <link name="base"/><link name="l1">{_MASS}</link><link name="l2">{_MASS}</link><link name="hand"/>
  <link name="left">{_MASS}</link><link name="right">{_MASS}</link>
  <joint name="shoulder" type="revolute"><parent link="base"/><child link="l1"/><axis xyz="0 0 1"/>
    <limit lower="-1" upper="1"/></joint>
  <joint name="elbow" type="revolute"><parent link="l1"/><child link="l2"/><origin xyz="0.5 0 0"/>
    <axis xyz="0 1 0"/><limit lower="-1" upper="1"/></joint>
  <joint name="wrist" type="fixed"><parent link="l2"/><child link="hand"/><origin xyz="0.4 0 0"/></joint>
  <joint name="left_finger" type="prismatic"><parent link="hand"/><child link="left"/><axis xyz="0 1 0"/>
    <limit lower="0" upper="0.04"/></joint>
  <joint name="right_finger" type="prismatic"><parent link="hand"/><child link="right"/><axis xyz="0 -1 0"/>
    <limit lower="0" upper="0.04"/></joint>
</robot>"""


def test_joint_groups_follow_the_limbs():
    import warnings

    from diffmech import load_urdf
    from diffmech.demo import joint_groups
    from diffmech.model import systems

    assert joint_groups(systems.cartpole()) == [("1: slider ... hinge", [0, 1])]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arm = load_urdf(GRIPPER_ARM)
    # The arm above the hand is one chain; each finger branches off the hand (through a fixed joint).
    assert joint_groups(arm) == [("1: shoulder ... elbow", [0, 1]), ("left finger", [2]), ("right finger", [3])]
    known = available_robots()
    if known["allegro"].available():
        groups = joint_groups(known["allegro"].build())
        assert [len(i) for _, i in groups] == [4, 4, 4, 4]
        assert sorted(j for _, i in groups for j in i) == list(range(16))
    if known["laikago"].available():
        groups = joint_groups(known["laikago"].build())
        assert [(label, len(i)) for label, i in groups] == [("FR", 3), ("FL", 3), ("RR", 3), ("RL", 3)]


@pytest.mark.skipif(importlib.util.find_spec("pybullet_data") is None, reason="pybullet_data not installed")
def test_sweep_figure_panels_per_leg_and_wrench_in_units():
    robot = available_robots()["laikago"].build()
    fig = demo.sweep_figure("laikago", robot, demo.sweep(robot, 5))
    fig.canvas.draw()
    titles = {ax.get_title(loc="left"): ax for ax in fig.axes}
    force = titles["base gravity wrench: force (base frame)"]
    torque = titles["base gravity wrench: torque (base frame)"]
    assert force.get_ylabel() == "force [N]" and torque.get_ylabel() == "torque [N m]"
    # The base is held against gravity by F_z = m g, no lateral force (identity orientation).
    fx, fy, fz = (line.get_ydata() for line in force.get_lines())
    assert max(abs(fx).max(), abs(fy).max()) < 1e-9
    assert [t.get_text() for t in force.get_legend().get_texts()] == ["F_x", "F_y", "F_z"]
    assert min(fz) == pytest.approx(9.81 * float(robot.total_mass()), rel=1e-6) and max(fz) == pytest.approx(min(fz))
    legs = [titles[f"gravity torque, limb {leg}"] for leg in ("FR", "FL", "RR", "RL")]
    for ax in legs + [force, torque]:
        # Each legend sits beside its panel, not on it.
        assert ax.get_legend().get_window_extent().x0 >= ax.get_window_extent().x1
    assert [len(ax.get_lines()) for ax in legs] == [3, 3, 3, 3]
