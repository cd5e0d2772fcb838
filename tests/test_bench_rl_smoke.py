"""``benchmarks/bench_rl.py``: MuJoCo's n-link pendulum built there follows the same dynamics as
``diffmech.rl.NLinkReach`` (the oracle of the comparison), and ``--quick`` runs end to end into the
files it is pointed at."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_rl.py")

pytest.importorskip("mujoco")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_rl", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("links", [1, 3])
def test_mujoco_pendulum_follows_the_same_dynamics(bench, links):
    a = bench.agreement(links, 100)
    # float64 on both sides; the swing is chaotic, so allow the round-off to grow along the episode
    assert a["max_abs_q_diff_10"] < 1e-12 and a["max_abs_q_diff"] < 1e-9


def test_quick_run_writes_results_and_markdown(bench, tmp_path):
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\nintro\n")
    out = tmp_path / "r.json"
    bench.main(["--quick", "--json", str(out), "--markdown", str(md)])
    data = json.loads(out.read_text())
    assert [(c["links"], c["batch"]) for c in data["cells"]] == [(2, 1), (2, 64)]
    for c in data["cells"]:
        assert c["grad_steps_per_s"] > 0 and c["mujoco_steps_per_s"] > 0
        best = max(c["mujoco_steps_per_s"], c["mujoco_1_steps_per_s"])
        assert c["mujoco_over_grad"] == pytest.approx(best / c["grad_steps_per_s"])
    ant = data["ant_cells"]
    assert [c["batch"] for c in ant] == [1] and ant[0]["grad_steps_per_s"] > 0 and ant[0]["mujoco_steps_per_s"] > 0
    assert data["ant_agreement"]["max_abs_dq_before_contact"] < 1e-12
    text = md.read_text()
    assert "### The Ant" in text and "4096 Ants not measured" in text
    assert text.startswith("# Benchmarks\n\nintro\n") and bench.MARK_START in text and bench.MARK_END in text
    assert "| 2 | 64 |" in text
    bench.main(["--from-json", str(out), "--markdown", str(md)])
    assert md.read_text().count(bench.MARK_START) == 1
