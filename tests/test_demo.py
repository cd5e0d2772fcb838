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
    assert cli.main(["demo", "--out", str(tmp_path), "--robots", "pendulum", "--tol", "-1", "--no-plots",
                     "--no-progress"]) == 1


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
