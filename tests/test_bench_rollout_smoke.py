"""Smoke tests of ``benchmarks/bench_rollout.py`` and its worker.

The fast tests run one short worker process (checkpoint and autograd cells on the iiwa) and the
pure parts of the driver (skip rules, target evaluation, markdown section update). The slow test
runs the whole ``--quick`` mode (T in {50, 100}, iiwa, including differentiable-robot-model).
"""

from __future__ import annotations

import os
import sys

import pytest

pytest.importorskip("diff_robot_data")

BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
sys.path.insert(0, BENCH)

import bench_rollout as br  # noqa: E402


def test_worker_cells_agree_and_checkpoint_saves_memory():
    cells = [{"method": m, "robot": "iiwa", "batch": 1, "T": 40, "k": k, "threads": 2}
             for m, k in (("checkpoint", 1), ("autograd", 1), ("checkpoint", 8))]
    out = br.run_worker(cells, timeout=300)
    assert all("error" not in r for r in out), out
    ck, ag, ck8 = out
    for r in out:
        assert r["finite"] and r["forward_s"] > 0 and r["backward_s"] > 0
        assert r["memory_method"] == "VmHWM after clear_refs" or sys.platform != "linux"
    # Same loss, gradient and final state whatever the adjoint or checkpoint interval.
    assert ck["loss"] == pytest.approx(ag["loss"], rel=1e-12)
    assert ck["grad_norm"] == pytest.approx(ag["grad_norm"], rel=1e-10)
    assert ck8["grad_norm"] == pytest.approx(ag["grad_norm"], rel=1e-10)
    assert max(abs(a - b) for a, b in zip(ck["q_last"], ag["q_last"])) < 1e-12
    assert br.consistency(out) < 1e-9
    # The checkpointed forward keeps at least the (T + 1) x (nq + nv) states; every 8th state
    # with k = 8 (plus whatever per-step record the rollout adds), and recomputes the rest.
    assert ck["saved_state_bytes"] >= 41 * 14 * 8
    assert (40 // 8 + 1) * 14 * 8 <= ck8["saved_state_bytes"] < ck["saved_state_bytes"]
    assert ck8["recomputed_steps"] == 40


def _cell(method, T, mem_mib, fwd, bwd, robot="iiwa", batch=1, **kw):
    return {"method": method, "robot": robot, "batch": batch, "T": T, "k": 1, "forward_s": fwd * T,
            "backward_s": bwd * T, "forward_cpu_s": fwd * T, "backward_cpu_s": bwd * T,
            "peak_growth_bytes": int(mem_mib * br.MiB), "loss": 1.0, "grad_norm": 1.0, "q_last": [0.0], **kw}


def test_skip_rules():
    assert br.skip_reason(None, 100, 10, 2**30) is None
    slow = _cell("drm", 100, 1, 0.06, 0.06)  # 12 s
    assert "budget" in br.skip_reason(slow, 500, 10, 2**30)
    fast = _cell("drm", 100, 1, 0.01, 0.01)  # 2 s -> 10 s at T=500: within 2 x budget
    assert br.skip_reason(fast, 500, 10, 2**40) is None
    assert "predicted" in br.skip_reason(fast, 5000, 10, 2**40)  # 100 s > 20 s
    big = _cell("drm", 100, 300, 0.001, 0.001)  # 300 MiB at T=100 -> 15 GiB at T=5000
    assert "GiB" in br.skip_reason(big, 5000, 1e9, 8 * 2**30)
    assert br.skip_reason({"skipped": "skipped (x)"}, 500, 10, 1) == "skipped (x)"


def test_targets_extrapolate_and_judge():
    results = []
    for T in (100, 500, 1000):
        results += [_cell("checkpoint", T, 0.1, 0.002, 0.005), _cell("autograd", T, 0.04 * T, 0.002, 0.004),
                    _cell("drm", T, 2.9 * T, 0.03, 0.05)]
    results += [{"method": "drm", "robot": "iiwa", "batch": 1, "T": 2000, "k": 1, "skipped": "skipped (x)"}]
    results += [_cell("checkpoint", 2000, 0.1, 0.002, 0.005), _cell("autograd", 2000, 80, 0.002, 0.004)]
    rows = br.targets(results, [], 2000)

    def row(*words):
        return next(r for r in rows if all(w in r["target"] for w in words))

    mem = row("peak memory", "DRM")
    assert mem["met"] and "extrapolated" in mem["note"]
    assert mem["measured"].startswith("0.00")  # 0.1 MiB vs ~5800 MiB
    speed = row("forward+backward", "DRM")
    assert speed["met"] and speed["measured"] == "11.4x"  # 0.08 s/step vs 0.007 s/step
    own = row("forward+backward", "diffmech autograd")
    assert not own["met"]  # autograd is faster in these synthetic numbers
    ratio = row("backward / forward")
    assert ratio["met"] and ratio["measured"] == "2.50 - 2.50"


def test_markdown_section_replaced_in_place(tmp_path):
    md = tmp_path / "BENCHMARKS.md"
    md.write_text(f"# Benchmarks\n\n## Other\nkeep me\n\n{br.MARK_START}\nold\n{br.MARK_END}\n\n## Tail\nkeep too\n")
    br.update_markdown(str(md), f"{br.MARK_START}\nnew\n{br.MARK_END}")
    text = md.read_text()
    assert "new" in text and "old" not in text and "keep me" in text and "keep too" in text
    assert text.count(br.MARK_START) == 1
    fresh = tmp_path / "NEW.md"
    br.update_markdown(str(fresh), f"{br.MARK_START}\nx\n{br.MARK_END}")
    assert fresh.read_text().startswith("# Benchmarks\n") and br.MARK_END in fresh.read_text()


@pytest.mark.slow
def test_quick_mode_end_to_end(tmp_path):
    pytest.importorskip("differentiable_robot_model")
    out = tmp_path / "quick.json"
    report = br.main(["--quick", "--json", str(out), "--markdown", "none"])
    assert out.stat().st_size > 0
    cells = report["cells"]
    assert len(cells) == 6 and all(br.ok(c) for c in cells)
    assert report["consistency"] < 1e-9
    for T in (50, 100):
        mem = {m: br.find(cells, method=m, T=T)["peak_growth_bytes"] for m in ("checkpoint", "autograd", "drm")}
        # At 50-100 steps diffmech's growth (both adjoints) is below the allocator's granularity
        # once warm, so their order is noise; the checkpoint-vs-autograd claim is measured at
        # T=2000 by the full run. Here: both are a small fraction of DRM's.
        assert max(mem["checkpoint"], mem["autograd"]) < 0.05 * mem["drm"]
    assert any(r["target"].startswith("iiwa: peak memory") for r in report["targets"])
