"""Smoke test of ``benchmarks/bench_drm_compat.py``: ``--quick`` runs DRM's three example loops on
differentiable-robot-model and on the facade, and writes the files and the markdown block it is pointed at."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_drm_compat.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_drm_compat", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_writes_results_and_markdown(bench, tmp_path):
    pytest.importorskip("differentiable_robot_model")
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\nintro\n")
    out = tmp_path / "r.json"
    bench.main(["--quick", "--json", str(out), "--markdown", str(md)])
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"id", "fd", "fk"}
    for loop, r in data["results"].items():
        assert set(r) == {"drm", "facade"}
        assert r["drm"]["steps"] == r["facade"]["steps"] > 0
        assert r["facade"]["wall_s"] > 0
        # same data, same seeds, same parametrizations: the same first loss (forward dynamics
        # differs by DRM's use of the non-symmetric part of the random inertia)
        if loop != "fd":
            assert r["facade"]["losses"][0] == pytest.approx(r["drm"]["losses"][0], rel=1e-3)
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n") and bench.MARK_START in text and bench.MARK_END in text
    assert "| inverse dynamics (`learn_dynamics_iiwa`) |" in text
    bench.main(["--from-json", str(out), "--markdown", str(md)])
    assert md.read_text().count(bench.MARK_START) == 1
