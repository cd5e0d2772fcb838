"""Forward and backward time of rollouts driven by a policy (issue 9, section 5).

Loss ``sum of squared q over all T + 1 states`` of a rollout of the iiwa (``diff_robot_data``
``iiwa7.urdf``, float64, dt = 1e-3 s, from a random configuration at rest), and its gradient with
respect to the initial state and the policy's parameters, for

* integrators ``semi_implicit_euler`` and ``rk4``,
* one robot and ten robots as one batch,
* two policies: an MLP ``tau = W2 tanh(W1 [q, v] + b1) + b2`` (64 hidden units) and a linear
  feedback ``tau = K (q_ref - q) - D v + b`` (``K, D`` full ``nv x nv`` matrices),
* and, as the reference the issue compares with, the same rollout with a torque tensor ``(T, nv)``
  (gradient w.r.t. the initial state and the torques).

Every cell runs ``adjoint="checkpoint"`` (the default): the forward time is the rollout call, the
backward time the ``backward()`` of the loss; each is the median of ``--repeats`` runs after one
warm-up run. Before timing, each cell's gradient is checked against ``adjoint="autograd"`` (the
relative difference is recorded).

Usage::

    python benchmarks/bench_policy_rollout.py            # full run (~10 min), writes JSON + BENCHMARKS.md
    python benchmarks/bench_policy_rollout.py --quick    # T = 40, batch 1, writes nothing
    python benchmarks/bench_policy_rollout.py --render benchmarks/results/policy_rollout.json
    # the recorded comparison: the code before this benchmark's change, then the current code
    git archive dd898de src | tar -x -C /tmp/before
    BENCH_THREADS=1 DIFFMECH_SRC=/tmp/before/src python benchmarks/bench_policy_rollout.py --commit dd898de \
        --json /tmp/before.json --markdown none
    BENCH_THREADS=1 python benchmarks/bench_policy_rollout.py --before /tmp/before.json

Threads: ``torch.set_num_threads(BENCH_THREADS)`` (default 2; at batch 1 and 10 every operation is tiny
and on a loaded machine a second thread mostly waits, so the recorded run uses 1).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import warnings

import torch
from torch import nn

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
# DIFFMECH_SRC: another checkout's src/ (the "before" run of a comparison).
sys.path.insert(0, os.environ.get("DIFFMECH_SRC", os.path.join(ROOT, "src")))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _markdown, when imported by a test

import diffmech  # noqa: E402
from diffmech.sim import rollout  # noqa: E402

THREADS = int(os.environ.get("BENCH_THREADS", "2"))
DT = 1e-3
import _machine  # noqa: E402
from _markdown import replace_section  # noqa: E402

MARK_START, MARK_END = "<!-- bench_policy_rollout:start -->", "<!-- bench_policy_rollout:end -->"
CONTROLS = ("torques", "mlp", "linear")
LABEL = {"torques": "torque tensor", "mlp": "MLP policy", "linear": "linear feedback"}


class MLP(nn.Module):
    """``tau = W2 tanh(W1 [q, v] + b1) + b2``."""

    def __init__(self, nq: int, nv: int, hidden: int = 64, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = nn.Linear(nq + nv, hidden, dtype=torch.float64)
        self.l2 = nn.Linear(hidden, nv, dtype=torch.float64)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g, dtype=torch.float64) / p.shape[-1] ** 0.5)

    def forward(self, t, q, v):
        return self.l2(torch.tanh(self.l1(torch.cat([q, v], -1))))


class Linear(nn.Module):
    """``tau = K (q_ref - q) - D v + b``."""

    def __init__(self, nq: int, nv: int, seed: int = 0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.K = nn.Parameter(torch.eye(nv, nq, dtype=torch.float64) * 5.0)
        self.D = nn.Parameter(torch.eye(nv, dtype=torch.float64) * 0.5)
        self.q_ref = nn.Parameter(0.1 * torch.randn(nq, generator=g, dtype=torch.float64))
        self.b = nn.Parameter(torch.zeros(nv, dtype=torch.float64))

    def forward(self, t, q, v):
        return (self.q_ref - q) @ self.K.T - v @ self.D.T + self.b


def load_iiwa():
    import diff_robot_data

    path = os.path.join(list(diff_robot_data.__path__)[0], "kuka_iiwa/urdf/iiwa7.urdf")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diffmech.load_urdf(path)


def make_cell(robot, control: str, batch: int, T: int):
    g = torch.Generator().manual_seed(1)
    q0 = robot.random_configuration(batch, generator=g).requires_grad_(True)
    v0 = torch.zeros(batch, robot.nv, dtype=torch.float64, requires_grad=True)
    if control == "torques":
        tau = (0.1 * torch.randn(batch, T, robot.nv, generator=g, dtype=torch.float64)).requires_grad_(True)
        leaves = [q0, v0, tau]
    else:
        tau = MLP(robot.nq, robot.nv) if control == "mlp" else Linear(robot.nq, robot.nv)
        leaves = [q0, v0, *tau.parameters()]
    return q0, v0, tau, leaves


def run_once(robot, q0, v0, tau, leaves, T, integrator, adjoint="checkpoint"):
    t0 = time.perf_counter()
    q, _ = rollout(robot, q0, v0, tau, DT, integrator=integrator, steps=T, adjoint=adjoint)
    loss = q.square().sum()
    t1 = time.perf_counter()
    grads = torch.autograd.grad(loss, leaves)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, loss.item(), grads


def measure(robot, control, batch, integrator, T, repeats) -> dict:
    q0, v0, tau, leaves = make_cell(robot, control, batch, T)
    _, _, loss_ag, g_ag = run_once(robot, q0, v0, tau, leaves, T, integrator, adjoint="autograd")
    fwd, bwd = [], []
    for i in range(repeats + 1):
        f, b, loss, g = run_once(robot, q0, v0, tau, leaves, T, integrator)
        if i:  # the first run warms up
            fwd.append(f)
            bwd.append(b)
    scale = max(max(x.abs().max().item() for x in g_ag), 1e-300)
    err = max((a - b).abs().max().item() for a, b in zip(g, g_ag)) / scale
    return {"control": control, "batch": batch, "integrator": integrator, "T": T,
            "forward_s": statistics.median(fwd), "backward_s": statistics.median(bwd),
            "forward_all_s": fwd, "backward_all_s": bwd, "loss": loss,
            "loss_rel_diff_vs_autograd": abs(loss - loss_ag) / max(abs(loss_ag), 1e-300),
            "grad_rel_diff_vs_autograd": err}


def machine() -> dict:
    return _machine.machine(ROOT, THREADS, ["src"])


def markdown(report: dict) -> str:
    m = report["machine"]
    lines = [MARK_START, "## Policy rollouts (gradients through a policy)", "",
             "Forward and backward time of `rollout(..., adjoint=\"checkpoint\")` on the iiwa (`iiwa7.urdf`, float64, "
             f"dt = {DT:g} s, T = {report['T']} steps from a random configuration at rest), loss = sum of squared q "
             "over all states, gradient w.r.t. the initial state and the controls: a torque tensor (T x nv), an MLP "
             "policy `W2 tanh(W1 [q, v] + b1) + b2` (64 hidden units) or a linear feedback `K (q_ref - q) - D v + b` "
             "(their parameters). Times are medians of "
             f"{report['repeats']} runs after a warm-up; every cell's gradient matches `adjoint=\"autograd\"` to "
             f"{max(c['grad_rel_diff_vs_autograd'] for c in report['cells']):.1e} (relative to its largest entry).",
             "",
             f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, `torch.set_num_threads({m['threads']})`, "
             f"Python {m['python']}, commit {m['commit']}, {m['date']}. Load average during the run: "
             f"{report['load_before'][0]:.1f} -> {report['load_after'][0]:.1f}.",
             "",
             "Command: `python benchmarks/bench_policy_rollout.py` (the comparison: see its docstring). "
             "Raw data: `benchmarks/results/policy_rollout.json`. One thread: at batch 1 and 10 every operation is "
             "tiny, and on this loaded machine a second thread mostly waits (10x slower rollouts were seen with 2); "
             "with other jobs running, single timings vary by up to 30 %, hence the fastest runs beside the medians.",
             "",
             "With a policy, the reverse pass now takes the step Jacobians of many steps from one batched call (as "
             "for a torque tensor) plus one VJP of the policy per step; the robot's learnable parameters (none here) "
             "get one batched VJP per chunk of steps. RK4 with a torque tensor gains too: its step Jacobians come "
             "from autograd through the step on the stored accelerations instead of a rebuilt graph per step.",
             ""]
    prev = report.get("before")
    head = "| integrator | batch | controls | forward (s) | backward (s) | backward / forward |"
    sep = "|---|---:|---|---:|---:|---:|"
    if prev:
        head += " backward before (s) | forward before (s) |"
        sep += "---:|---:|"
    lines += [head, sep]

    def cell(c, key):
        return f"{c[key]:.3f} ({min(c[key.replace('_s', '_all_s')]):.3f})"

    for c in report["cells"]:
        row = (f"| {c['integrator']} | {c['batch']} | {LABEL[c['control']]} | {cell(c, 'forward_s')} | "
               f"{cell(c, 'backward_s')} | {c['backward_s'] / c['forward_s']:.2f} |")
        if prev:
            old = next((p for p in prev["cells"] if all(p[k] == c[k] for k in ("integrator", "batch", "control"))),
                       None)
            row += f" {cell(old, 'backward_s')} | {cell(old, 'forward_s')} |" if old else " n/a | n/a |"
        lines.append(row)
    lines += ["", "Each time: the median (the fastest) of the timed runs."]
    if prev:
        lines += ["", f"*before*: the same cells measured just before at commit {prev['machine']['commit']} "
                      f"({prev['machine']['date']}, load {prev['load_before'][0]:.1f} -> {prev['load_after'][0]:.1f}), "
                      "where a policy's reverse pass rebuilt each step's graph and differentiated it with autograd."]
    lines += ["", MARK_END]
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    """Replace this benchmark's section of ``path`` between its markers (append if absent)."""
    replace_section(path, section, MARK_START, MARK_END)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="T = 40, batch 1, one repeat; writes nothing by default")
    ap.add_argument("--T", type=int, default=None, help="steps (default 400)")
    ap.add_argument("--repeats", type=int, default=None, help="timed runs per cell (default 5)")
    ap.add_argument("--batches", default=None, help="comma-separated batch sizes (default 1,10)")
    ap.add_argument("--integrators", default="semi_implicit_euler,rk4")
    ap.add_argument("--controls", default=",".join(CONTROLS))
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/policy_rollout.json)")
    ap.add_argument("--markdown", default=None, help="markdown file to update (default BENCHMARKS.md); 'none' skips")
    ap.add_argument("--before", default=None, help="a results file of an earlier run to show beside this one")
    ap.add_argument("--render", metavar="JSON", default=None, help="only rewrite the markdown from a results file")
    ap.add_argument("--commit", default=None, help="commit of the measured code (DIFFMECH_SRC)")
    args = ap.parse_args(argv)
    md_path = args.markdown or ("none" if args.quick else os.path.join(ROOT, "BENCHMARKS.md"))
    if args.render:
        with open(args.render) as f:
            report = json.load(f)
        update_markdown(md_path if md_path != "none" else os.path.join(ROOT, "BENCHMARKS.md"), markdown(report))
        return report
    torch.set_num_threads(THREADS)
    T = args.T or (40 if args.quick else 400)
    repeats = args.repeats or (1 if args.quick else 5)
    batches = [int(b) for b in (args.batches or ("1" if args.quick else "1,10")).split(",")]
    robot = load_iiwa()
    load_before = os.getloadavg()
    cells = []
    for integrator in args.integrators.split(","):
        for batch in batches:
            for control in args.controls.split(","):
                c = measure(robot, control, batch, integrator, T, repeats)
                print(f"{integrator:20s} x{batch:<3d} {LABEL[control]:16s} fwd {c['forward_s']:.3f} s  "
                      f"bwd {c['backward_s']:.3f} s  ratio {c['backward_s'] / c['forward_s']:.2f}  "
                      f"grad diff vs autograd {c['grad_rel_diff_vs_autograd']:.1e}", flush=True)
                cells.append(c)
    info = machine()
    if args.commit:
        info["commit"] = args.commit
    report = {"machine": info, "T": T, "dt": DT, "repeats": repeats, "load_before": load_before,
              "load_after": os.getloadavg(), "cells": cells}
    if args.before:
        with open(args.before) as f:
            report["before"] = json.load(f)
    json_path = args.json or ("none" if args.quick else os.path.join(HERE, "results", "policy_rollout.json"))
    if json_path != "none":
        with open(json_path, "w") as f:
            json.dump(report, f, indent=1)
    if md_path != "none":
        update_markdown(md_path, markdown(report))
    return report


if __name__ == "__main__":
    main()
