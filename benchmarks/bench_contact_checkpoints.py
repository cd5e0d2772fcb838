"""Memory of a contact rollout's gradient vs its horizon: dense checkpoints (every state kept, the
default) against a fixed number of checkpoints (``checkpoint_every = ceil(T / c)``, the segments
recomputed in the backward pass), on ``scenes.laikago`` (one quadruped, and ten in one batch).

Kept: the bytes the checkpointed rollout keeps for the backward pass (states and the contact
solver's warm starts of the kept steps, its ``saved_state_bytes`` stat). Segment: the largest run
of states the backward pass recomputes and holds at once (``backward_segment_bytes``). Peak = kept +
segment + one step's graph (the same for both, not counted). The trajectory the rollout returns is
the caller's (``(T + 1) x state``) and not counted: a loss on the final state lets it go. The
gradient w.r.t. every torque and the drives' stiffness is compared between the two (it must be
equal bit for bit). Both variants run interleaved in each cell, one thread, float64, dt 1e-3.

    python benchmarks/bench_contact_checkpoints.py                     # 50, 500, 5000 steps; 1 and 10 robots
    python benchmarks/bench_contact_checkpoints.py --steps 50,500 --batch 1 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import resource
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _machine  # noqa: E402
import bench_contact  # noqa: E402
from _markdown import generated_by, replace_section  # noqa: E402
from diffmech.sim import rollout, scenes  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact_checkpoints:start -->", "<!-- bench_contact_checkpoints:end -->"


def run(T: int, batch: int, every: int, dt: float = 1e-3) -> dict:
    p = torch.tensor(1000.0, dtype=torch.float64, requires_grad=True)
    scene, q0, v0 = scenes.laikago(1, stiffness=p)
    q0, v0 = q0.expand(batch, -1).clone(), v0.expand(batch, -1).clone()
    tau = torch.zeros(batch, T, scene.nv, dtype=torch.float64, requires_grad=True)
    st: dict = {}
    t0 = time.perf_counter()
    qs, _ = rollout(scene, q0, v0, tau, dt, checkpoint_every=every, stats=st)
    t1 = time.perf_counter()
    (qs[:, -1, 0] + qs[:, -1, 2]).sum().backward()
    t2 = time.perf_counter()
    return {"every": every, "forward_ms_per_step": 1e3 * (t1 - t0) / T, "backward_ms_per_step": 1e3 * (t2 - t1) / T,
            "kept_bytes": st["saved_state_bytes"], "segment_bytes": st["backward_segment_bytes"],
            "grad_p": p.grad.clone(), "grad_tau": tau.grad.clone()}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", default="50,500,5000")
    ap.add_argument("--batch", default="1,10")
    ap.add_argument("--checkpoints", type=int, default=100, help="c: checkpoints kept by the sparse variant")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    bench_contact.prepare_kernels()
    load0, t_start = os.getloadavg(), time.perf_counter()
    run(5, 1, 1)
    run(5, 1, 2)  # first calls (the solver's kernel) off the clock
    rows = []
    for batch in [int(x) for x in args.batch.split(",")]:
        for T in sorted(int(x) for x in args.steps.split(",")):
            every = math.ceil(T / args.checkpoints)
            dense, sparse = run(T, batch, 1), run(T, batch, every)
            same = bool(torch.equal(dense["grad_p"], sparse["grad_p"]) and torch.equal(dense["grad_tau"],
                                                                                     sparse["grad_tau"]))
            row = {"batch": batch, "T": T, "same_gradient": same}
            for name, r in (("dense", dense), ("sparse", sparse)):
                row[name] = {k: v for k, v in r.items() if not k.startswith("grad")}
            row["process_peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e3
            rows.append(row)
            print(f"B={batch} T={T} (process peak RSS so far {row['process_peak_rss_mb']:.0f} MB): " + "; ".join(
                f"{n} (every {r['every']}) fwd {r['forward_ms_per_step']:.2f} bwd {r['backward_ms_per_step']:.2f} "
                f"ms/step kept {r['kept_bytes'] / 1e6:.3f} MB segment {r['segment_bytes'] / 1e6:.3f} MB"
                for n, r in (("dense", row["dense"]), ("sparse", row["sparse"]))) + f"; same gradient {same}",
                flush=True)
    rep = {"rows": rows, "checkpoints": args.checkpoints, "load_before": load0, "load_after": os.getloadavg(),
           "wall_s": time.perf_counter() - t_start,
           "machine": _machine.machine(ROOT, 1, ["src/diffmech", "benchmarks/bench_contact_checkpoints.py"]),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
           "args": " ".join(sys.argv[1:] if argv is None else argv)}
    text = "\n".join(markdown(rep))
    print(text)
    if not args.no_write:
        with open(os.path.join(ROOT, "benchmarks", "results", "bench_contact_checkpoints.json"), "w") as f:
            json.dump(rep, f, indent=2)
        replace_section(os.path.join(ROOT, "BENCHMARKS.md"), text, MARK_START, MARK_END)
    return rep


def markdown(rep: dict) -> list[str]:
    c = rep["checkpoints"]
    lines = [MARK_START, "## Contact rollouts: memory vs horizon (sparse checkpoints)", "",
             generated_by("bench_contact_checkpoints.py", rep), "",
             f"Native kernels for the robot's mass matrix, bias forces, link kinematics and floating-base update "
             "(`diffmech.dynamics.kernels.prepare`). "
             "`scenes.laikago`, dt 1e-3, float64, zero commanded torque, loss = the chassis' final x + z; gradient "
             f"w.r.t. every torque and the drives' stiffness. *dense*: `checkpoint_every=1` (the default: every "
             f"state kept, they are the returned trajectory); *sparse*: `checkpoint_every = ceil(T / {c})` ({c} "
             f"checkpoints; the backward pass recomputes each segment without a graph, then walks it back). Kept: "
             f"states and warm-start impulses kept for the backward pass; segment: the recomputed states held at "
             f"once; peak = kept + segment. x500: the peak at this horizon over the peak at 500 steps, same batch. "
             f"Same gradient: the two variants' gradients compared bit for bit.", "",
             "| robots | steps | dense fwd ms/step | dense bwd ms/step | dense bwd/fwd | dense kept (MB) | dense x500 "
             "| sparse every | sparse fwd ms/step | sparse bwd ms/step | sparse bwd/fwd | sparse kept (MB) "
             "| sparse segment (MB) | sparse peak (MB) | sparse x500 | sparse bwd / dense bwd | same gradient |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|:--|"]
    ref = {(r["batch"]): r for r in rep["rows"] if r["T"] == 500}
    for r in rep["rows"]:
        d, s = r["dense"], r["sparse"]
        peak = s["kept_bytes"] + s["segment_bytes"]
        base = ref.get(r["batch"])
        xd = f"{d['kept_bytes'] / base['dense']['kept_bytes']:.2f}" if base else "-"
        xs = (f"{peak / (base['sparse']['kept_bytes'] + base['sparse']['segment_bytes']):.2f}" if base else "-")
        lines.append(
            f"| {r['batch']} | {r['T']} | {d['forward_ms_per_step']:.2f} | {d['backward_ms_per_step']:.2f} | "
            f"{d['backward_ms_per_step'] / d['forward_ms_per_step']:.2f} | {d['kept_bytes'] / 1e6:.3f} | {xd} | "
            f"{s['every']} | {s['forward_ms_per_step']:.2f} | {s['backward_ms_per_step']:.2f} | "
            f"{s['backward_ms_per_step'] / s['forward_ms_per_step']:.2f} | {s['kept_bytes'] / 1e6:.3f} | "
            f"{s['segment_bytes'] / 1e6:.3f} | {peak / 1e6:.3f} | {xs} | "
            f"{s['backward_ms_per_step'] / d['backward_ms_per_step']:.2f} | {'yes' if r['same_gradient'] else 'NO'} |")
    lines += ["", "Raw data: `benchmarks/results/bench_contact_checkpoints.json`.", MARK_END]
    return lines


if __name__ == "__main__":
    main()
