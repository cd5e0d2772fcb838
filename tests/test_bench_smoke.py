"""Smoke test of ``benchmarks/bench_dynamics.py --quick``: it runs, its JSON has the expected shape,
the peers it times compute the same quantities as diffmech, and the markdown block is replaced in
place without touching the rest of BENCHMARKS.md.

The script runs in a subprocess because it sets the torch thread count and, for the float64
differentiable-robot-model peer, swaps torch's default dtype while that peer runs.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "benchmarks", "bench_dynamics.py")
ALGOS = {"fk", "jac", "rnea", "crba", "aba", "grad"}


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_dynamics", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.path.insert(0, os.path.dirname(SCRIPT))
    try:
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(os.path.dirname(SCRIPT))
    return mod


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    pytest.importorskip("diff_robot_data")
    d = tmp_path_factory.mktemp("bench")
    md = d / "BENCHMARKS.md"
    md.write_text("# Benchmarks\n\n## Other section\n\nkeep me\n\n## Rigid-body core\n\n"
                  "<!-- bench_dynamics:start -->\nOLD TABLE\n<!-- bench_dynamics:end -->\n\n## Later\n\nkeep me too\n")
    out = d / "bench.json"
    proc = subprocess.run(
        [sys.executable, SCRIPT, "--quick", "--json", str(out), "--markdown", str(md)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), md.read_text(), proc.stdout


def test_json_has_expected_keys(quick_run):
    result, _, _ = quick_run
    assert set(result) == {"meta", "results", "ratios", "targets", "agreement"}
    meta = result["meta"]
    for key in ("cpu", "cores", "threads", "versions", "date", "command", "elapsed_s"):
        assert key in meta, key
    assert meta["threads"] == 2 and meta["torch_threads"] == 2
    for rec in result["results"]:
        assert {"robot", "dtype", "batch", "algo", "impl", "status", "note"} <= set(rec)
        if rec["status"] == "ok":
            assert rec["seconds"] > 0 and rec["states_per_s"] == pytest.approx(rec["batch"] / rec["seconds"])
    timed = {r["algo"] for r in result["results"] if r["impl"] == "diffmech" and r["status"] == "ok"}
    assert timed == ALGOS
    assert {r["batch"] for r in result["results"]} == {1, 8}
    for t in result["targets"]:
        assert {"target", "batch", "value", "threshold", "met"} <= set(t)
    # batch 1 is in the quick run, so the latency target has a verdict
    latency = [t for t in result["targets"] if t["kind"] == "time"]
    assert latency and all(t["met"] in (True, False) for t in latency)


def test_ratios_are_consistent(quick_run):
    result, _, _ = quick_run
    rate = {(r["robot"], r["dtype"], r["batch"], r["algo"], r["impl"]): r["states_per_s"]
            for r in result["results"] if "states_per_s" in r}
    assert result["ratios"], "no peer was timed"
    for x in result["ratios"]:
        key = (x["robot"], x["dtype"], x["batch"], x["algo"])
        assert x["ratio"] == pytest.approx(rate[(*key, "diffmech")] / rate[(*key, x["peer"])])


def test_peers_compute_the_same_quantities(quick_run):
    result, _, _ = quick_run
    agree = result["agreement"]["iiwa/float64"]
    if importlib.util.find_spec("pinocchio") is not None:
        assert max(agree["pinocchio"].values()) < 1e-8, agree["pinocchio"]
    if importlib.util.find_spec("differentiable_robot_model") is not None:
        # float64 through the dtype redirection; float32 parameters would show up as ~1e-6
        assert max(agree["drm"].values()) < 1e-8, agree["drm"]


def test_markdown_block_replaced_in_place(quick_run):
    _, text, _ = quick_run
    assert "OLD TABLE" not in text
    assert text.count("<!-- bench_dynamics:start -->") == 1 and text.count("<!-- bench_dynamics:end -->") == 1
    assert "keep me\n" in text and "keep me too" in text
    assert text.index("## Other section") < text.index("<!-- bench_dynamics:start -->") < text.index("## Later")
    assert "### Targets (iiwa, float64, 2 threads)" in text and "#### iiwa, float64" in text


def test_markdown_section_appended_when_missing(tmp_path):
    mod = _load_script()
    p = tmp_path / "B.md"
    p.write_text("# Benchmarks\n\n## Something else\n")
    block = f"{mod.START}\nX\n{mod.END}"
    mod.write_markdown(p, block, {})
    mod.write_markdown(p, f"{mod.START}\nY\n{mod.END}", {})
    text = p.read_text()
    assert text.startswith("# Benchmarks\n\n## Something else\n")
    assert text.count(mod.SECTION_TITLE) == 1 and "\nY\n" in text and "\nX\n" not in text


def test_from_json_rerenders_without_measuring(quick_run, tmp_path):
    result, _, _ = quick_run
    src = tmp_path / "r.json"
    src.write_text(json.dumps(result))
    md = tmp_path / "B.md"
    mod = _load_script()
    again = mod.main(["--from-json", str(src), "--markdown", str(md)])
    assert again == result
    text = md.read_text()
    assert text.startswith("# Benchmarks") and "#### iiwa, float64" in text
    assert result["meta"]["command"] in text
