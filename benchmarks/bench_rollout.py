"""Memory and time of gradients through rollouts: the seed's Tables 1-3 (issue 3, section 4).

For T in 50, 100, 500, 1000, 2000, 5000 steps (semi-implicit Euler, dt = 1e-3 s, float64) it
measures the peak resident-memory growth, the forward time per step and the backward time per
step of the loss ``sum of squared q over all T + 1 states`` and its gradient with respect to the
initial state and the torques, for

* ``checkpoint``: ``diffmech.sim.rollout(..., adjoint="checkpoint")`` (states stored, each
  reverse step recomputed from its state: by hand for these Euler steps, with the step
  Jacobians batched over time while ``batch x (nq + nv) x nv <= TIME_BATCHED_MAX_WORK``);
* ``autograd``: ``diffmech.sim.rollout(..., adjoint="autograd")`` (graph of the whole loop);
* ``DRM``: differentiable-robot-model's ``compute_forward_dynamics`` in the same semi-implicit
  Euler loop under plain autograd (fixed base only),

on (a) the iiwa (``diff_robot_data`` ``iiwa7.urdf``, one robot, zero torques from a random
configuration at rest) and (b) the floating-base laikago (``pybullet_data``
``laikago/laikago_toes_zup.urdf``, zero torques, no contacts, small random initial joint angles
and velocities), one robot and ten robots as one batch. It also measures the checkpoint interval
``k`` in {1, 10, 100} at T = 2000 on the iiwa (memory vs recompute, seed 002 supplement B).

Every cell runs in a fresh process (``_rollout_worker.py``) whose peak-RSS counter is reset after
a warm-up, so memory kept by earlier cells cannot hide a later cell's growth. A series (robot,
batch, method) skips its larger T once a cell took longer than ``--budget`` seconds, or when the
linear extrapolation of the last cell exceeds twice the budget or ``--mem-cap-gb``. The cells of
one T are cross-checked: every method must give the same loss and final state.

Usage::

    python benchmarks/bench_rollout.py            # full run (~1 h on 2 busy cores), writes JSON + BENCHMARKS.md
    python benchmarks/bench_rollout.py --quick    # T in {50, 100}, iiwa only, one process, < 1 min

Threads: ``torch.set_num_threads(2)`` in every worker.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "_rollout_worker.py")

T_FULL = (50, 100, 500, 1000, 2000, 5000)
T_QUICK = (50, 100)
THREADS = 2
# (robot, batch, methods); differentiable-robot-model has no floating base.
CONFIGS_FULL = [
    ("iiwa", 1, ("checkpoint", "compiled", "autograd", "drm")),
    ("laikago", 1, ("checkpoint", "compiled", "autograd")),
    ("laikago", 10, ("checkpoint", "compiled", "autograd")),
]
CONFIGS_QUICK = [("iiwa", 1, ("checkpoint", "autograd", "drm"))]
K_FULL, K_T_FULL = (1, 10, 100), 2000
# One-thread reruns of a few cells: at batch 1 the ops are tiny and a second thread mostly waits.
THREAD_CELLS = [("iiwa", 1, 2000), ("laikago", 10, 500)]
K_QUICK, K_T_QUICK = (1, 10), 100
T_TARGET = 2000  # the targets are stated at 2000 steps

LABEL = {"checkpoint": "diffmech checkpoint", "compiled": "diffmech checkpoint, compiled",
         "autograd": "diffmech autograd", "drm": "DRM autograd"}
import _machine  # noqa: E402
from _markdown import replace_section  # noqa: E402

MARK_START, MARK_END = "<!-- bench_rollout:start -->", "<!-- bench_rollout:end -->"
MiB = 2.0**20


# ----------------------------------------------------------------------------- running cells
def run_worker(cells: list[dict], timeout: float) -> list[dict]:
    """Run ``cells`` in one fresh worker process; a failed cell becomes ``{"error": ...}``."""
    try:
        p = subprocess.run([sys.executable, WORKER, json.dumps(cells)], capture_output=True, text=True,
                           timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return [{**c, "error": f"timed out after {timeout:.0f} s"} for c in cells]
    out = [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or len(out) != len(cells):
        tail = (p.stderr.strip().splitlines() or ["(no stderr)"])[-1]
        reason = "killed (out of memory?)" if p.returncode in (-9, 137) else f"exit {p.returncode}: {tail}"
        out += [{**c, "error": reason} for c in cells[len(out):]]
    return out


def total_s(r: dict) -> float:
    return r["forward_s"] + r["backward_s"]


def skip_reason(prev: dict | None, T: int, budget: float, mem_cap: float) -> str | None:
    """Why a series should not run ``T`` steps after its previous cell ``prev`` (None: run it)."""
    if prev is None:
        return None
    if "error" in prev:
        return f"skipped (smaller T failed: {prev['error']})"
    if "skipped" in prev:
        return prev["skipped"]
    took = total_s(prev)
    if took > budget:
        return f"skipped (T={prev['T']} took {took:.0f} s > budget {budget:.0f} s)"
    scale = T / prev["T"]
    if took * scale > 2 * budget:
        return f"skipped (predicted {took * scale:.0f} s > 2 x budget {budget:.0f} s)"
    mem = max(prev["peak_growth_bytes"], 0) * scale
    if mem > mem_cap:
        return f"skipped (predicted {mem / 2**30:.1f} GiB > cap {mem_cap / 2**30:.0f} GiB)"
    return None


def run_series(robot: str, batch: int, method: str, Ts, budget: float, mem_cap: float, log,
               k: int = 1) -> list[dict]:
    if method == "compiled":
        # Compiling takes about a minute per process: one process runs the whole series (the peak
        # counter is still reset per cell; these rollouts keep only their states).
        cfgs = [{"method": method, "robot": robot, "batch": batch, "T": T, "k": k, "threads": THREADS} for T in Ts]
        out = run_worker(cfgs, timeout=max(6 * budget, 600))
        for r in out:
            log(r)
        return out
    out, prev = [], None
    for T in Ts:
        cfg = {"method": method, "robot": robot, "batch": batch, "T": T, "k": k, "threads": THREADS}
        why = skip_reason(prev, T, budget, mem_cap)
        if why is not None:
            r = {**cfg, "skipped": why}
        else:
            r = run_worker([cfg], timeout=max(6 * budget, 120))[0]
        log(r)
        out.append(r)
        prev = r
    return out


# ----------------------------------------------------------------------------- analysis
def ok(r: dict | None) -> bool:
    return r is not None and "error" not in r and "skipped" not in r


def find(results: list[dict], **kw) -> dict | None:
    for r in results:
        if all(r.get(a) == b for a, b in kw.items()):
            return r
    return None


def linear_fit(points: list[tuple[float, float]]) -> tuple[float, float] | None:
    """Least-squares ``y = a + b x`` (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    return my - b * mx, b


def at_T(results: list[dict], robot: str, batch: int, method: str, T: int, key) -> tuple[float | None, bool]:
    """``key(cell)`` at ``T`` measured, else extrapolated linearly in T from the measured cells.

    Returns ``(value, extrapolated)``; ``(None, False)`` without data.
    """
    r = find(results, robot=robot, batch=batch, method=method, T=T, k=1)
    if ok(r):
        return key(r), False
    pts = [(c["T"], key(c)) for c in results
           if c.get("robot") == robot and c.get("batch") == batch and c.get("method") == method
           and c.get("k", 1) == 1 and ok(c) and c["T"] >= 100]
    fit = linear_fit(pts)
    if fit is None:
        return None, False
    return fit[0] + fit[1] * T, True


def consistency(results: list[dict]) -> float:
    """Largest relative disagreement of loss and final state between methods on the same cell."""
    worst = 0.0
    groups: dict = {}
    for r in results:
        if ok(r):
            groups.setdefault((r["robot"], r["batch"], r["T"]), []).append(r)
    for rs in groups.values():
        ref = rs[0]
        for r in rs[1:]:
            worst = max(worst, abs(r["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-300),
                        abs(r["grad_norm"] - ref["grad_norm"]) / max(abs(ref["grad_norm"]), 1e-300),
                        max(abs(a - b) for a, b in zip(r["q_last"], ref["q_last"])))
    return worst


def targets(results: list[dict], kres: list[dict], T_t: int) -> list[dict]:
    """Evaluate the issue's targets at ``T_t`` steps (extrapolating peers that were skipped)."""
    rows = []

    def row(name, value, target, met, note=""):
        rows.append({"target": name, "measured": value, "goal": target, "met": met, "note": note})

    mem = lambda r: max(r["peak_growth_bytes"], 0)  # noqa: E731
    ck_mem, _ = at_T(results, "iiwa", 1, "checkpoint", T_t, mem)
    drm_mem, drm_mem_x = at_T(results, "iiwa", 1, "drm", T_t, mem)
    if ck_mem is not None and drm_mem:
        ratio = ck_mem / drm_mem
        row(f"iiwa: peak memory at {T_t} steps, checkpoint / DRM autograd", f"{100 * ratio:.3f} %", "<= 1 %",
            ratio <= 0.01, f"{ck_mem / MiB:.2f} MiB vs {drm_mem / MiB:.0f} MiB"
            + (" (DRM extrapolated linearly in T)" if drm_mem_x else ""))
    else:
        row(f"iiwa: peak memory at {T_t} steps, checkpoint / DRM autograd", "n/a", "<= 1 %", None, "missing cells")
    ag_mem, ag_mem_x = at_T(results, "iiwa", 1, "autograd", T_t, mem)
    if ck_mem is not None and ag_mem:
        row(f"iiwa: peak memory at {T_t} steps, checkpoint / diffmech autograd", f"{100 * ck_mem / ag_mem:.3f} %",
            "(reported)", None, f"{ag_mem / MiB:.1f} MiB for autograd" + (" (extrapolated)" if ag_mem_x else ""))

    drm_t, drm_t_x = at_T(results, "iiwa", 1, "drm", T_t, total_s)
    ag_t, ag_t_x = at_T(results, "iiwa", 1, "autograd", T_t, total_s)
    for ck in ("checkpoint", "compiled"):
        ck_t, _ = at_T(results, "iiwa", 1, ck, T_t, total_s)
        if ck_t and drm_t:
            row(f"iiwa: forward+backward at {T_t} steps, DRM autograd / {LABEL[ck]}", f"{drm_t / ck_t:.1f}x",
                ">= 10x", drm_t / ck_t >= 10,
                f"{drm_t:.1f} s vs {ck_t:.1f} s" + (" (DRM extrapolated)" if drm_t_x else ""))
        if ck_t and ag_t:
            row(f"iiwa: forward+backward at {T_t} steps, diffmech autograd / {LABEL[ck]}", f"{ag_t / ck_t:.2f}x",
                "> 1x", ag_t / ck_t > 1,
                f"{ag_t:.1f} s vs {ck_t:.1f} s" + (" (autograd extrapolated)" if ag_t_x else ""))

    for robot, batch in (("iiwa", 1), ("laikago", 1), ("laikago", 10)):
        for ck in ("checkpoint", "compiled"):
            cells = [r for r in results if r.get("robot") == robot and r.get("batch") == batch
                     and r.get("method") == ck and r.get("k", 1) == 1 and ok(r)]
            if not cells:
                continue
            ratios = [r["backward_s"] / r["forward_s"] for r in cells]
            per_step = [r["backward_s"] / r["T"] for r in cells if r["T"] >= 100]
            row(f"{robot} x{batch}: {LABEL[ck]}, backward / forward per step (all T)",
                f"{min(ratios):.2f} - {max(ratios):.2f}", "<= 3", max(ratios) <= 3,
                "CPU-time ratio " + ", ".join(f"{r['backward_cpu_s'] / r['forward_cpu_s']:.2f}" for r in cells))
            if len(per_step) >= 2:
                flat = max(per_step) / min(per_step)
                row(f"{robot} x{batch}: {LABEL[ck]}, backward per step, max / min over T >= 100", f"{flat:.2f}",
                    "flat (<= 1.5)", flat <= 1.5,
                    "ms/step " + ", ".join(f"{1e3 * p:.2f}" for p in per_step))

    for method in ("checkpoint", "compiled", "autograd"):
        T_b = max((r["T"] for r in results if r.get("robot") == "laikago" and r.get("method") == method
                   and ok(r) and ok(find(results, robot="laikago", batch=1, method=method, T=r["T"], k=1))
                   and ok(find(results, robot="laikago", batch=10, method=method, T=r["T"], k=1))), default=None)
        if T_b is None:
            continue
        one = find(results, robot="laikago", batch=1, method=method, T=T_b, k=1)
        ten = find(results, robot="laikago", batch=10, method=method, T=T_b, k=1)
        ratio = total_s(ten) / total_s(one)
        row(f"laikago {LABEL[method]}: time of 10 robots in one batch / 1 robot (T={T_b})", f"{ratio:.2f}x",
            "well under 10x (<= 5x)", ratio <= 5, f"per robot {ratio / 10:.2f} of one robot's cost")

    k1 = find(kres, k=1)
    for r in kres:
        if ok(r) and ok(k1) and r["k"] != 1:
            row(f"iiwa: checkpoint k={r['k']} vs k=1 at T={r['T']}: time, saved states",
                f"{total_s(r) / total_s(k1):.2f}x time", "(trade-off, reported)", None,
                f"saved states {r['saved_state_bytes'] / 1024:.1f} KiB vs {k1['saved_state_bytes'] / 1024:.1f} KiB, "
                f"{r['recomputed_steps']} steps recomputed")
    return rows


# ----------------------------------------------------------------------------- output
def machine() -> dict:
    import torch

    model = _machine.cpu_model()
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=ROOT, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        commit = ""
    import hashlib

    # The tree may be ahead of the commit: fingerprint the files that decide these timings.
    files = ["src/diffmech/sim/rollout.py", "src/diffmech/sim/integrators.py", "src/diffmech/dynamics/aba.py",
             "src/diffmech/dynamics/rnea.py", "src/diffmech/dynamics/crba.py", "src/diffmech/model/robot.py"]
    code = {}
    for f in files:
        try:
            with open(os.path.join(ROOT, f), "rb") as fh:
                code[f] = hashlib.sha1(fh.read()).hexdigest()[:12]
        except OSError:
            code[f] = "missing"
    dirty = subprocess.run(["git", "status", "--porcelain", "--", *files], capture_output=True, text=True,
                           cwd=ROOT, timeout=10).stdout.strip() != ""
    return {"cpu": model, "cores": os.cpu_count(), "torch": torch.__version__, "threads": THREADS,
            "python": platform.python_version(), "commit": commit + ("+dirty" if dirty else ""), "code_sha1": code,
            "date": datetime.datetime.now().isoformat(timespec="seconds")}


def _cell_text(r: dict | None, what: str) -> str:
    if r is None:
        return ""
    if "skipped" in r:
        return "skipped"
    if "error" in r:
        return "failed"
    if what == "mem":
        return f"{max(r['peak_growth_bytes'], 0) / MiB:.2f}"
    if what == "fwd":
        return f"{1e3 * r['forward_s'] / r['T']:.2f}"
    if what == "bwd":
        return f"{1e3 * r['backward_s'] / r['T']:.2f}"
    raise ValueError(what)


def thread_table(results: list[dict], tcells: list[dict]) -> str:
    lines = ["**Threads (diffmech checkpoint): 2 threads vs 1 thread, ms/step (wall; CPU)**", "",
             "| robot | T | fwd, 2 threads | bwd, 2 threads | fwd, 1 thread | bwd, 1 thread |",
             "|---|---:|---:|---:|---:|---:|"]
    for r1 in tcells:
        r2 = find(results, robot=r1["robot"], batch=r1["batch"], method="checkpoint", T=r1["T"], k=1)
        cols = []
        for r in (r2, r1):
            if ok(r):
                cols += [f"{1e3 * r[f'{p}_s'] / r['T']:.2f}; {1e3 * r[f'{p}_cpu_s'] / r['T']:.2f}"
                         for p in ("forward", "backward")]
            else:
                cols += ["n/a", "n/a"]
        lines.append(f"| {r1['robot']} x{r1['batch']} | {r1['T']} | " + " | ".join(cols) + " |")
    return "\n".join(lines) + "\n"


def tables(results: list[dict], kres: list[dict], configs, Ts) -> str:
    lines = []
    titles = {"mem": "Table 1: peak resident-memory growth (MiB)", "fwd": "Table 2: forward time per step (ms)",
              "bwd": "Table 3: backward time per step (ms)"}
    for what, title in titles.items():
        lines += [f"**{title}**", "", "| robot | method | " + " | ".join(f"T={T}" for T in Ts) + " |",
                  "|---|---|" + "---:|" * len(Ts)]
        for robot, batch, methods in configs:
            for m in methods:
                cells = [_cell_text(find(results, robot=robot, batch=batch, method=m, T=T, k=1), what) for T in Ts]
                lines.append(f"| {robot} x{batch} | {LABEL[m]} | " + " | ".join(cells) + " |")
        lines.append("")
    if kres:
        T_k = kres[0]["T"]
        lines += [f"**Checkpoint interval k (iiwa x1, T={T_k})**", "",
                  "| k | peak growth (MiB) | saved states (KiB) | forward ms/step | backward ms/step "
                  "| recomputed steps |",
                  "|---:|---:|---:|---:|---:|---:|"]
        for r in kres:
            if ok(r):
                lines.append(f"| {r['k']} | {_cell_text(r, 'mem')} | {r['saved_state_bytes'] / 1024:.1f} | "
                             f"{_cell_text(r, 'fwd')} | {_cell_text(r, 'bwd')} | {r['recomputed_steps']} |")
            else:
                lines.append(f"| {r['k']} | {r.get('skipped', r.get('error'))} | | | | |")
        lines.append("")
    return "\n".join(lines)


def target_table(rows: list[dict]) -> str:
    lines = ["| target | measured | goal | met | note |", "|---|---:|---|---|---|"]
    for r in rows:
        met = {True: "yes", False: "**no**", None: "-"}[r["met"]]
        lines.append(f"| {r['target']} | {r['measured']} | {r['goal']} | {met} | {r['note']} |")
    return "\n".join(lines)


def _warmups(cells: list[dict]) -> str:
    seen = {}
    for r in cells:
        if r.get("method") == "compiled" and ok(r) and "warmup_s" in r:
            seen.setdefault(f"{r['robot']} x{r['batch']}", r["warmup_s"])
    return ", ".join(f"{k} {v:.0f} s" for k, v in seen.items()) or "n/a"


def markdown(report: dict, configs, Ts) -> str:
    m = report["machine"]
    skipped = [f"{r['robot']} x{r['batch']} {LABEL[r['method']]} T={r['T']}: {r['skipped'].removeprefix('skipped ')}"
               for r in report["cells"] if "skipped" in r]
    failed = sorted({f"{r['robot']} x{r['batch']} {r['method']} T={r['T']}: {r['error']}"
                     for r in report["cells"] + report["k_cells"] + report["thread_cells"] if "error" in r})
    lines = [
        MARK_START,
        "## Differentiable simulation (rollout gradients)",
        "",
        "Gradient of `sum of squared q over all T+1 states` w.r.t. the initial state and the torques "
        "(T x nv), semi-implicit Euler, dt = 1e-3 s, float64, no contacts. "
        "*diffmech checkpoint*: `diffmech.sim.rollout(..., adjoint=\"checkpoint\")` (its reverse steps are "
        "written by hand; iiwa x1 (14 rows per step) and laikago x1 (37) take the time-batched reverse, which "
        "gets the step Jacobians of up to 4 MiB of states in one batched call; laikago x10 (370 rows) the "
        "sequential one); *diffmech autograd*: "
        "`adjoint=\"autograd\"`; *DRM autograd*: differentiable-robot-model's `compute_forward_dynamics` "
        "(float64, joint damping on) in the same Euler loop under plain autograd (DRM has no floating base, so "
        "laikago rows have no DRM). iiwa: `iiwa7.urdf` from diff_robot_data, zero torques from a random "
        "configuration at rest. laikago: `laikago/laikago_toes_zup.urdf`, floating base, zero torques, small "
        "random initial joint angles and velocities; x10 = ten robots as one batch.",
        "",
        "Memory is the peak resident-set growth of the timed forward + backward in a fresh process per cell "
        "(peak counter reset after a warm-up; `VmHWM - VmRSS`). Times are wall-clock per simulated step, the "
        "median of repeated runs in that process when one forward + backward takes under 1 s (up to 7 runs; "
        "the memory is the first run's); "
        f"a series skips larger T once a cell exceeds the budget of {report['budget_s']:.0f} s or is predicted "
        f"to exceed twice that or {report['mem_cap_gib']:.0f} GiB. All methods agree on every common cell to "
        f"{report['consistency']:.1e} (loss, gradient norm, final state).",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, `torch.set_num_threads({m['threads']})`, "
        f"Python {m['python']}, commit {m['commit'] or '?'}, {m['date']}. Load average during the run: "
        f"{report['load_before'][0]:.1f} -> {report['load_after'][0]:.1f}."
        + (" **The simulation/dynamics sources changed during this run: cells mix code versions.**"
           if report.get("code_changed_during_run") else ""),
        "",
        # The benchmark's own two threads account for a load average of about 2.
        ("> Measured while other jobs loaded the 2 cores (load average above 2.5 at the start or the end): wall "
         "times are inflated and noisy; the CPU-time columns in `benchmarks/results/bench_rollout.json` are "
         "less affected.\n" if max(report["load_before"][0], report["load_after"][0]) > 2.5 else ""),
        "*diffmech checkpoint, compiled*: `rollout(..., compile=True)`: the forward step is one "
        "`torch.compile`'d function, and so is the reverse step's VJP for laikago x10 "
        "(`diffmech.sim.compiled_step`); iiwa x1 and laikago x1 take the time-batched reverse as above "
        "(accelerations recomputed in batches, since the compiled step records none); compiled once per process "
        "and batch size before the timed run (first-call seconds: " + _warmups(report["cells"]) + "); its "
        "cells of one robot/batch run in one process, so each pays the compilation once.",
        "",
        "Two threads on tiny operations: at one robot per batch every operation works on a few 3-vectors and "
        "7x7 matrices; an operation that PyTorch parallelises then waits for the second thread, and on a loaded "
        "machine that wait can cost milliseconds. The *Threads* table reruns a few checkpoint cells with "
        "`torch.set_num_threads(1)` to show how much of the time is that wait.",
        "",
        f"Command: `{report['command']}` (`--quick` for the smoke test). Raw data: "
        "`benchmarks/results/bench_rollout.json`.",
        "",
        tables(report["cells"], report["k_cells"], configs, Ts),
        thread_table(report["cells"], report["thread_cells"]) if report["thread_cells"] else "",
        "**Targets**",
        "",
        target_table(report["targets"]),
        "",
    ]
    growth = []
    for robot, batch, methods in configs:
        for meth in methods:
            cs = sorted((c for c in report["cells"] if c.get("robot") == robot and c.get("batch") == batch
                         and c.get("method") == meth and ok(c) and c["T"] >= 100), key=lambda c: c["T"])
            if len(cs) >= 2:
                f = (cs[-1]["backward_s"] / cs[-1]["T"]) / (cs[0]["backward_s"] / cs[0]["T"])
                if f > 3:
                    growth.append(f"{robot} x{batch} {LABEL[meth]}: x{f:.0f} from T={cs[0]['T']} to T={cs[-1]['T']}")
    if growth:
        lines += ["Backward time per step that grows with T (the total then grows faster than linearly): "
                  + "; ".join(growth) + ".", ""]
    if skipped:
        lines += ["Skipped cells: " + "; ".join(skipped) + ".", ""]
    if failed:
        lines += ["Failed cells: " + "; ".join(failed) + ".", ""]
    lines.append(MARK_END)
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    """Replace this benchmark's section of ``path`` between its markers (append if absent)."""
    replace_section(path, section, MARK_START, MARK_END)


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T in {50, 100}, iiwa only, cells in one process")
    ap.add_argument("--budget", type=float, default=300.0, help="per-cell time budget, s (default 300)")
    ap.add_argument("--mem-cap-gb", type=float, default=8.0, help="skip cells predicted above this, GiB")
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/bench_rollout[_quick].json)")
    ap.add_argument("--markdown", default=None,
                    help="markdown file to update (default BENCHMARKS.md; none with --quick); 'none' skips")
    ap.add_argument("--render", metavar="JSON", default=None,
                    help="only rewrite the markdown section from a results file of an earlier run")
    ap.add_argument("--T", type=int, nargs="+", default=None,
                    help="override the step counts (the k study and thread cells then use at most max(T))")
    args = ap.parse_args(argv)
    if args.render:
        with open(args.render) as f:
            report = json.load(f)
        report.setdefault("thread_cells", [])
        Ts_r = tuple(sorted({c["T"] for c in report["cells"]}))
        configs_r = []
        for c in report["cells"]:
            key = (c["robot"], c["batch"])
            if key not in [(a, b) for a, b, _ in configs_r]:
                configs_r.append((*key, tuple(dict.fromkeys(x["method"] for x in report["cells"]
                                                            if (x["robot"], x["batch"]) == key))))
        md_path = args.markdown if args.markdown not in (None, "none") else os.path.join(ROOT, "BENCHMARKS.md")
        update_markdown(md_path, markdown(report, configs_r, Ts_r))
        print(f"updated {md_path} from {args.render}")
        return report

    Ts = tuple(args.T) if args.T else (T_QUICK if args.quick else T_FULL)
    configs = CONFIGS_QUICK if args.quick else CONFIGS_FULL
    Ks, T_k = (K_QUICK, K_T_QUICK) if args.quick else (K_FULL, K_T_FULL)
    T_k = min(T_k, max(Ts))
    json_path = args.json or os.path.join(HERE, "results", "bench_rollout_quick.json" if args.quick
                                          else "bench_rollout.json")
    md_path = args.markdown
    if md_path is None:
        md_path = "none" if args.quick else os.path.join(ROOT, "BENCHMARKS.md")
    mem_cap = args.mem_cap_gb * 2**30
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    code_before = machine()["code_sha1"]

    def log(r):
        head = (f"{r['robot']:8s} x{r['batch']:<2d} {LABEL[r['method']]:20s} T={r['T']:<5d} k={r.get('k', 1):<3d} "
                f"threads={r.get('threads', THREADS)}")
        if ok(r):
            print(f"{head} mem {max(r['peak_growth_bytes'], 0) / MiB:9.2f} MiB  "
                  f"fwd {1e3 * r['forward_s'] / r['T']:7.2f} ms/step  "
                  f"bwd {1e3 * r['backward_s'] / r['T']:7.2f} ms/step", flush=True)
        else:
            print(f"{head} {r.get('skipped') or 'FAILED: ' + r['error']}", flush=True)

    tcells: list[dict] = []
    if args.quick:
        # One process for every cell: the interpreter and torch start once (the smoke test's budget).
        cells = [{"method": m, "robot": robot, "batch": b, "T": T, "k": 1, "threads": THREADS}
                 for robot, b, methods in configs for m in methods for T in Ts]
        cells += [{"method": "checkpoint", "robot": "iiwa", "batch": 1, "T": T_k, "k": k, "threads": THREADS}
                  for k in Ks if k != 1]
        out = run_worker(cells, timeout=max(6 * args.budget, 120))
        for r in out:
            log(r)
        results = [r for r in out if r.get("k", 1) == 1]
        kres = [find(results, robot="iiwa", batch=1, method="checkpoint", T=T_k)] + [r for r in out if r["k"] != 1]
    else:
        results = []
        for robot, b, methods in configs:
            for m in methods:
                results += run_series(robot, b, m, Ts, args.budget, mem_cap, log)
        kres = []
        for k in Ks:
            r = find(results, robot="iiwa", batch=1, method="checkpoint", T=T_k, k=1) if k == 1 else None
            if r is None:
                r = run_worker([{"method": "checkpoint", "robot": "iiwa", "batch": 1, "T": T_k, "k": k,
                                 "threads": THREADS}], timeout=max(6 * args.budget, 120))[0]
                log(r)
            kres.append(r)
        for robot, b, T in THREAD_CELLS:
            T = max([t for t in Ts if t <= T] or [min(Ts)])
            r = run_worker([{"method": "checkpoint", "robot": robot, "batch": b, "T": T, "k": 1, "threads": 1}],
                           timeout=max(6 * args.budget, 120))[0]
            log(r)
            tcells.append(r)

    cmd = "python benchmarks/bench_rollout.py" + (" --quick" if args.quick else "")
    if not args.quick and args.budget != 300.0:
        cmd += f" --budget {args.budget:g}"
    if args.T:
        cmd += " --T " + " ".join(map(str, args.T))
    mach = machine()
    report = {
        "machine": mach, "code_sha1_start": code_before, "code_changed_during_run": mach["code_sha1"] != code_before,
        "command": cmd,
        "quick": args.quick, "budget_s": args.budget,
        "mem_cap_gib": args.mem_cap_gb, "dt": 1e-3, "integrator": "semi_implicit_euler", "dtype": "float64",
        "load_before": load_before, "load_after": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
        "consistency": consistency(results + [r for r in kres if r is not None] + tcells),
        "cells": results, "k_cells": [r for r in kres if r is not None], "thread_cells": tcells,
    }
    T_t = T_TARGET if T_TARGET in Ts else max(Ts)
    report["targets"] = targets(results, report["k_cells"], T_t)
    report["target_T"] = T_t

    print()
    print(tables(results, report["k_cells"], configs, Ts))
    if tcells:
        print(thread_table(results, tcells))
    print(f"Targets at T={T_t}" + (" (quick mode: the issue states them at T=2000)" if args.quick else ""))
    print(target_table(report["targets"]))
    print(f"\nmethods agree to {report['consistency']:.1e}; total {report['wall_s']:.0f} s")

    os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1, default=lambda x: None if isinstance(x, float) and math.isnan(x) else x)
    print(f"wrote {json_path}")
    if md_path != "none":
        update_markdown(md_path, markdown(report, configs, Ts))
        print(f"updated {md_path}")
    return report


if __name__ == "__main__":
    main()
