"""Smoke test of ``benchmarks/bench_eigen.py``: the reference-style step it times integrates the same
closed loop as diffmech, its markdown block is replaced in place with the targets' verdicts, and
(slow) ``--quick`` runs end to end and writes the files it is pointed at.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_eigen.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_eigen", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _report(bench, converged: bool) -> dict:
    step = {"median_s": 0.1, "min_s": 0.09, "n": 3, "cpu_median_s": 0.08}
    cell = {"diffmech": step, "diffmech plain autograd": {**step, "median_s": 0.9},
            "reference-style": {**step, "median_s": 0.6, "cpu_median_s": 0.48}}
    cv = {"config": "main-fast", "method": "midpoint", "lr": 1e-2, "gamma": 0.998, "polish_from": 0.1, "steps": 150,
          "polish": {"iterations": 3, "seconds": 5.0, "grid_points": 201, "method": "rk4"},
          "train_s": 100.0 if converged else 300.0, "train_cpu_s": 40.0, "wall_s": 130.0, "converged": converged,
          "ee_error_half_period": 0.004 if converged else 0.02, "periodicity_error": 0.05, "p_half_norm": 0.01,
          "symmetry_error_q": 0.02, "line_shaped": False, "effort": 600.0,
          "newton_mean_iterations": 2.0, "newton_fallbacks": 0}
    return {"machine": {"cpu": "cpu", "cores": 2, "torch": "2", "threads": 1, "python": "3", "commit": "abc",
                        "date": "today"},
            "agreement": 1e-7, "steps": {"100": cell}, "memory": [], "converge": cv,
            "load_before": [0.5, 0.5, 0.5], "load_after": [0.6, 0.5, 0.5], "wall_s": 10.0, "args": "",
            "targets": [{"target": "step", "measured": "6.0x", "met": True},
                        {"target": "converge", "measured": "x", "met": converged}]}


@pytest.mark.slow
def test_reference_step_integrates_the_same_closed_loop(bench):
    # float32, same parameters: the hand-written double pendulum and diffmech's core agree to round-off
    assert bench.agreement(grid_points=20) < 1e-5


def test_grid_label_counts_the_inserted_half_period_point(bench):
    from diffmech.control.flow import code_grid

    for g in (20, 21, 100, 200):
        assert bench.grid_label(g) == code_grid(g).numel()


@pytest.mark.parametrize("converged", [True, False])
def test_markdown_block_replaced_in_place(bench, tmp_path, converged):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"# Benchmarks\n\n## Before\n\nkeep me\n\n{bench.MARK_START}\nOLD\n{bench.MARK_END}\n\n"
                  "## After\n\nkeep\n")
    rep = _report(bench, converged)
    bench.update_markdown(str(md), bench.markdown(rep))
    text = md.read_text()
    assert "OLD" not in text and text.count(bench.MARK_START) == 1 and text.count(bench.MARK_END) == 1
    assert text.index("## Before") < text.index(bench.MARK_START) < text.index("## After")
    assert "| 101 | 100 (90) | 900 (90) | 600 (90) | 6.0x | 9.0x | 80 / 480 | 6.0x |" in text
    assert ("| converge | x | met |" if converged else "| converge | x | NOT met |") in text
    assert ("- converged:" if converged else "- NOT converged:") in text


def test_markdown_section_appended_when_missing(bench, tmp_path):
    md = tmp_path / "B.md"
    md.write_text("# Benchmarks\n\n## Something else\n")
    bench.update_markdown(str(md), f"{bench.MARK_START}\nX\n{bench.MARK_END}")
    bench.update_markdown(str(md), f"{bench.MARK_START}\nY\n{bench.MARK_END}")
    text = md.read_text()
    assert text.startswith("# Benchmarks\n\n## Something else\n")
    assert text.count("## Eigenmode learning (seed 001)") == 1 and "\nY\n" in text and "\nX\n" not in text


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n")
    out = tmp_path / "eigen.json"
    env = {**os.environ, "PYTHONPATH": os.path.join(ROOT, "src")}
    proc = subprocess.run([sys.executable, SCRIPT, "--quick", "--json", str(out), "--markdown", str(md)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rep = json.loads(out.read_text())
    cell = rep["steps"]["20"]
    assert set(cell) == {"diffmech", "diffmech plain autograd", "reference-style"}
    assert all(c["median_s"] > 0 for c in cell.values())
    assert rep["agreement"] < 1e-5
    (t,) = rep["targets"]
    ratio = cell["reference-style"]["median_s"] / cell["diffmech"]["median_s"]
    assert t["met"] == (ratio >= 5) and "21-point grid" in t["target"]
    text = md.read_text()
    assert text.count("<!-- bench_eigen:start -->") == 1 and text.count("<!-- bench_eigen:end -->") == 1
    assert f"| {t['target']} | {t['measured']} | {'met' if t['met'] else 'NOT met'} |" in text
