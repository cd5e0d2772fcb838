"""``benchmarks/bench_gpu.py``: ``--quick`` runs every part end to end (on the CPU standing in for the
accelerator where there is no GPU) and the recorded results re-render into the markdown section."""

from __future__ import annotations

import importlib.util
import json
import os

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_gpu.py")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_quick_run_measures_every_part(bench):
    pytest.importorskip("diff_robot_data")
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    rep = bench.main(["--quick", "--device", dev, "--no-native"])  # no kernel build: seconds
    for part in ("core", "learn", "contact", "rl"):
        rows = rep[part]
        assert rows, part
        assert all(r.get("seconds", r.get("per_robot_ms", 0)) > 0 for r in rows if not r.get("skipped")), part
    assert {r["algo"] for r in rep["core"]} == set(bench.ALGOS)
    text = "\n".join(bench.markdown(rep))
    assert text.startswith(bench.MARK_START) and text.endswith(bench.MARK_END)


def test_recorded_results_render(bench, tmp_path):
    path = os.path.join(ROOT, "benchmarks", "results", "bench_gpu.json")
    with open(path) as f:
        rep = json.load(f)
    md = tmp_path / "B.md"
    bench.main(["--from-json", path, "--markdown", str(md)])
    text = md.read_text()
    assert rep["device_name"] in text and "| iiwa | float64 | FD |" in text
    # the section in BENCHMARKS.md is the rendering of the recorded file
    section = text[text.index(bench.MARK_START):text.index(bench.MARK_END)]
    with open(os.path.join(ROOT, "BENCHMARKS.md")) as f:
        assert section in f.read()
