"""The command line beyond the demo: ``--version``, ``info``, and lazy subpackages of ``import diffmech``."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

import diffmech
from conftest import robot_path
from diffmech.cli import main


def test_version():
    res = subprocess.run([sys.executable, "-m", "diffmech", "--version"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == f"diffmech {diffmech.__version__} (torch {torch.__version__})"


def test_info_table_and_json(capsys):
    path = robot_path("prismatic_mix")
    assert main(["info", path]) == 0
    out = capsys.readouterr().out
    robot = diffmech.load_urdf(path)
    assert robot.name in out and f"{robot.nq}/{robot.nv}" in out
    assert main(["info", path, "--json", "--batch", "4"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert (row["name"], row["nq"], row["nv"], row["floating_base"]) == (robot.name, robot.nq, robot.nv, False)
    assert row["total_mass"] == pytest.approx(float(robot.summary()["total_mass"]))
    # the round trip fd(id(a)) = a, computed here
    assert row["roundtrip"]["batch"] == 4 and row["roundtrip"]["max_rel_err"] < 1e-10


def test_info_floating_base(capsys):
    assert main(["info", robot_path("floating_pair"), "--floating-base", "--json"]) == 0
    row = json.loads(capsys.readouterr().out)
    assert row["floating_base"] and row["nq"] == row["nv"] + 1
    # the values: the total mass is the URDF's link masses summed (read here with ElementTree), and the
    # floating base's inverse/forward dynamics round trip closes
    import xml.etree.ElementTree as ET

    masses = [float(m.get("value")) for m in ET.parse(robot_path("floating_pair")).getroot().iter("mass")]
    assert len(masses) >= 2 and row["total_mass"] == pytest.approx(sum(masses), rel=1e-12)
    assert row["roundtrip"]["max_rel_err"] < 1e-10


def test_info_errors(tmp_path, capsys):
    assert main(["info", str(tmp_path / "missing.urdf")]) == 1
    assert "missing.urdf" in capsys.readouterr().err
    bad = tmp_path / "bad.urdf"
    bad.write_text("<robot name='x'><link name='a'/><joint name='j' type='revolute'><parent link='a'/>"
                   "<child link='nope'/></joint></robot>")
    assert main(["info", str(bad)]) == 1
    assert "diffmech info: error" in capsys.readouterr().err


def test_subpackages_without_their_own_import():
    code = ("import diffmech; print(diffmech.perf.__name__, diffmech.learn.__name__, diffmech.control.__name__, "
            "diffmech.implicit.__name__, diffmech.spatial.__name__)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert res.stdout.split() == ["diffmech.perf", "diffmech.learn", "diffmech.control", "diffmech.implicit",
                                  "diffmech.spatial"]
    with pytest.raises(AttributeError, match="no_such_thing"):
        diffmech.no_such_thing  # noqa: B018
