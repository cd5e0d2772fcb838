"""``benchmarks/bench_contact_pile.py`` runs end to end on a small pile, and its two diffmech paths
(free bodies together, per model) simulate the same pile."""

from __future__ import annotations

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_small_pile():
    spec = importlib.util.spec_from_file_location("bench_contact_pile",
                                                  os.path.join(ROOT, "benchmarks", "bench_contact_pile.py"))
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rep = bench.main(["--bodies", "3", "--steps", "5", "--repeats", "1", "--per-model", "--no-write"])
    (row,) = rep["rows"]
    assert row["bodies"] == 3 and row["forward_ms_per_step"] > 0 and row["backward_ms_per_step"] > 0
    assert row["per_model_forward_ms_per_step"] > 0
    together = bench.time_diffmech(3, 5, True, 1)["final_z_min"]
    per_model = bench.time_diffmech(3, 5, False, 1)["final_z_min"]
    assert abs(together - per_model) < 1e-12
    text = "\n".join(bench.markdown(rep))
    assert text.startswith(bench.MARK_START) and "| 3 |" in text
