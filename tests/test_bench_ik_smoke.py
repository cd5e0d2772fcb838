"""Smoke test of ``benchmarks/bench_ik.py``: ``--quick`` runs end to end (diffmech and, where installed,
Pinocchio's CLIK loop on 20 Panda targets) and writes the files and the markdown block it is pointed at."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_ik.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_ik", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_writes_results_and_markdown(bench, tmp_path):
    pytest.importorskip("diff_robot_data")
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\nintro\n")
    out = tmp_path / "r.json"
    rep = bench.main(["--quick", "--json", str(out), "--markdown", str(md)])
    data = json.loads(out.read_text())
    d = data["results"]["diffmech_f64"]
    assert d["n"] == 20 and d["solved"] >= 0.95 and d["within_limits"]
    assert d["max_position_error_solved"] <= 1.001e-4
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n") and bench.MARK_START in text and bench.MARK_END in text
    assert "| diffmech `solve_ik`, float64 |" in text
    if "pinocchio_clik" in rep["results"]:
        assert rep["pin_check"]["position"] <= 1.001e-4
        assert "Pinocchio CLIK loop" in text
    # re-rendering from the JSON replaces the block in place
    bench.main(["--from-json", str(out), "--markdown", str(md)])
    assert md.read_text().count(bench.MARK_START) == 1
