"""Smoke test of ``benchmarks/bench_eager_accuracy.py``: its accuracy figure is the float32 error it
names (checked against a direct computation), its timings have the expected cells, and its
markdown block is replaced in place."""

from __future__ import annotations

import copy
import importlib.util
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_eager_accuracy.py")


@pytest.fixture(scope="module")
def bench():
    pytest.importorskip("diff_robot_data")
    spec = importlib.util.spec_from_file_location("bench_eager_accuracy", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_accuracy_is_the_float32_error(bench):
    robot = bench.load("iiwa")
    got = bench.accuracy(robot, n=6, seed=2)
    assert set(got) == {"model64", "model32"} and set(got["model64"]) == set(bench.QUANTITIES)
    x32 = {k: t.float() for k, t in bench.random_inputs(robot, 6, seed=2).items()}
    ref = robot.mass_matrix(x32["q"].double()).flatten(1)
    m32 = copy.deepcopy(robot).to(torch.float32).mass_matrix(x32["q"]).flatten(1)
    direct = float(((m32.double() - ref).abs().amax(-1) / ref.abs().amax(-1)).max())
    assert got["model32"]["M"] == pytest.approx(direct, rel=1e-12)
    assert all(0 < e < 1e-5 for route in got.values() for e in route.values())


def test_timings_and_markdown(bench, tmp_path):
    robot = bench.load("iiwa")
    cells = bench.timings(robot, [1], budget=0.0)
    assert set(cells) == {"1"} and set(cells["1"]) == set(bench.TIMED)
    assert all(c["min_s"] > 0 and c["median_s"] >= c["min_s"] for c in cells["1"].values())
    run = {"commit": "abc", "threads": 2, "machine": "test", "accuracy": {"iiwa": bench.accuracy(robot, n=2)},
           "timing": {"iiwa": cells}}
    md = tmp_path / "B.md"
    md.write_text("# B\n\nkeep\n\n<!-- eager_accuracy:start -->\nOLD\n<!-- eager_accuracy:end -->\n\nkeep too\n")
    bench.write_markdown(md, bench.render({"runs": {"x": run, "y": run}}))
    text = md.read_text()
    assert "OLD" not in text and text.count("keep") == 2
    assert "| iiwa | model32 | FD-aba |" in text and "| iiwa | 1 | FD+grad |" in text and "y/x" in text
