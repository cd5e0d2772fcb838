"""`diffmech kernels build|list` and the announcement of long kernel builds."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import pytest

from diffmech.cli import main
from diffmech.dynamics import kernel_store


def _cli(args, cache):
    env = dict(os.environ, DIFFMECH_CACHE_DIR=str(cache))
    return subprocess.run([sys.executable, "-m", "diffmech", *args], capture_output=True, text=True, env=env,
                          timeout=600)


def test_kernels_build_scene_then_list(tmp_path):
    """A fresh process builds the golf scene's kernels into an empty cache; `list` shows exactly those;
    a second build finds them all stored and builds none."""
    first = _cli(["kernels", "build", "golf"], tmp_path)
    assert first.returncode == 0, first.stderr
    head = first.stdout.splitlines()[0]
    n_built = int(head.split(": ")[1].split()[0])
    assert n_built >= 8, first.stdout  # two trees x (kinematics, mass matrix, bias, advance) x (value, vjp)
    built = {ln.strip() for ln in first.stdout.splitlines()[1:]}
    listed = _cli(["kernels", "list", "--json"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert {r["name"] for r in rows} == built
    assert all(r["size"] > 0 and r["compile_seconds"] >= 0 for r in rows)
    again = _cli(["kernels", "build", "golf"], tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("golf: 0 kernels built"), again.stdout


def test_kernels_build_bad_targets(tmp_path, capsys):
    assert main(["kernels", "build", "no_such_scene"]) == 1
    err = capsys.readouterr().err
    assert "no_such_scene" in err and "laikago" in err and "Traceback" not in err
    assert main(["kernels", "build", str(tmp_path / "missing.urdf")]) == 1
    assert "missing.urdf" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["kernels", "build", "golf", "--dtype", "float16"])


def test_a_long_build_is_announced_while_it_runs(tmp_path, monkeypatch, caplog):
    """A build still running after ANNOUNCE_AFTER seconds logs its start on `diffmech.kernels`, and its
    end with the time it took; a short one logs nothing."""
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path))
    source = "double kernel(double x) { return 2 * x; }\n"

    def slow_build(tag):
        def build():
            time.sleep(0.5)
            return f"/* {tag} */\n" + source, {}
        return build

    caplog.set_level(logging.INFO, logger="diffmech")
    monkeypatch.setattr(kernel_store, "ANNOUNCE_AFTER", 0.1)
    kernel_store.load_kernel(f"announce-test-{time.time_ns()}", slow_build("slow"), name="doubler")
    lines = [r.getMessage() for r in caplog.records if r.name == "diffmech.kernels"]
    assert any(ln.startswith("building native kernel 'doubler'") for ln in lines), lines
    assert any("'doubler' built in" in ln for ln in lines), lines
    caplog.clear()
    monkeypatch.setattr(kernel_store, "ANNOUNCE_AFTER", 30.0)
    kernel_store.load_kernel(f"announce-test-{time.time_ns()}", slow_build("quick"), name="doubler")
    assert not [r for r in caplog.records if r.name == "diffmech.kernels"]
