"""Threads: small and medium calls with torch's two threads, before and after diffmech's thread decision.

The workload is the one the pipeline issue measured: 10 x (inverse + forward dynamics) of
``diffmech.compat.drm.DifferentiableKUKAiiwa`` (7 DoF, float32, the torch code: ``DIFFMECH_NATIVE=never``)
at batches 1, 64, 1024 and 16384, and the backward of a 200-step checkpointed rollout of a 5-link
pendulum at batch 64. Each is timed with torch set to 2 threads under ``DIFFMECH_THREADS=torch`` (the
setting left alone: the behaviour before the decision) and ``auto`` (the default), with the machine as it
is and with two busy-looping processes added (``--burners``, a loaded machine), in alternating rounds of
adjacent blocks; the table gives the fastest block of each and the ratio torch / auto. The one-minute
load average at the start of each condition is recorded beside it.

    python benchmarks/bench_threads.py                 # results/threads.json + BENCHMARKS.md (~3 min)
    python benchmarks/bench_threads.py --markdown none --json /tmp/t.json
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
os.environ["DIFFMECH_NATIVE"] = "never"

import torch  # noqa: E402

import diffmech  # noqa: E402
from _machine import commit, cpu_model  # noqa: E402
from _markdown import replace_section  # noqa: E402
from diffmech.compat.drm import DifferentiableKUKAiiwa  # noqa: E402
from diffmech.dynamics import threads  # noqa: E402

MARK_START, MARK_END = "<!-- bench_threads:start -->", "<!-- bench_threads:end -->"


def _burn(stop):
    while not stop.is_set():
        pass


def _workloads():
    torch.manual_seed(0)
    kuka = DifferentiableKUKAiiwa()
    out = {}
    for B in (1, 64, 1024, 16384):
        q, v, a = (torch.rand(B, 7) for _ in range(3))

        def dyn(q=q, v=v, a=a):
            for _ in range(10):
                tau = kuka.compute_inverse_dynamics(q, v, a)
                kuka.compute_forward_dynamics(q, v, tau)

        out[f"kuka id+fd x10, batch {B}"] = dyn
    pend = diffmech.systems.n_link_pendulum(5)
    g = torch.Generator().manual_seed(0)
    q0, v0 = torch.randn(64, 5, generator=g, dtype=torch.float64), torch.zeros(64, 5, dtype=torch.float64)
    tau = torch.zeros(64, 200, 5, dtype=torch.float64, requires_grad=True)

    def roll():
        Q, _ = diffmech.sim.rollout(pend, q0, v0, tau, 1e-3)
        torch.autograd.grad(Q[:, -1].sum(), tau)

    out["pendulum rollout 200 steps + backward, batch 64"] = roll
    return out


def _time(fn, reps: int) -> float:
    fn()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


def measure(rounds: int, burners: int) -> dict:
    torch.set_num_threads(2)
    work = _workloads()
    result = {}
    for loaded in (False, True):
        stop = mp.Event()
        procs = [mp.Process(target=_burn, args=(stop,), daemon=True) for _ in range(burners if loaded else 0)]
        for p in procs:
            p.start()
        time.sleep(1.0 if procs else 0.0)
        cond = "loaded" if loaded else "as is"
        load = os.getloadavg()[0]
        for name, fn in work.items():
            best = {"torch": float("inf"), "auto": float("inf")}
            for _ in range(rounds):
                for pol in ("torch", "auto"):
                    threads.set_threads(pol)
                    best[pol] = min(best[pol], _time(fn, 3))
            threads.set_threads("auto")
            result.setdefault(cond, {"load_average": load, "rows": {}})["rows"][name] = {
                "torch_s": best["torch"], "auto_s": best["auto"], "ratio": best["torch"] / best["auto"]}
            print(f"{cond:7s} {name:50s} torch {best['torch'] * 1e3:9.2f} ms  auto {best['auto'] * 1e3:9.2f} ms  "
                  f"{best['torch'] / best['auto']:6.1f}x", flush=True)
        stop.set()
        for p in procs:
            p.join()
    return result


def markdown(res: dict) -> str:
    lines = [MARK_START, "", "### Threads (`benchmarks/bench_threads.py`)", "",
             f"`{res['command']}` on {res['machine']} ({res['cores']} cores), commit {res['commit']}; torch at 2 "
             "threads, `DIFFMECH_NATIVE=never`. `torch`: diffmech leaves torch's thread count alone (the "
             "behaviour before the decision); `auto`: the default decision of `diffmech.dynamics.threads`. "
             "Fastest of alternating blocks; ratio = torch / auto (above 1: the decision is faster). `loaded`: two "
             "busy-looping processes added; the load average is read as each condition starts and lags by "
             "about a minute.", "",
             "| condition (1-min load average) | workload | torch | auto | torch / auto |", "|---|---|---|---|---|"]
    for cond, block in res["conditions"].items():
        for name, r in block["rows"].items():
            lines.append(f"| {cond} ({block['load_average']:.1f}) | {name} | {r['torch_s'] * 1e3:.2f} ms | "
                         f"{r['auto_s'] * 1e3:.2f} ms | {r['ratio']:.1f}x |")
    lines += ["", MARK_END]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--burners", type=int, default=2)
    ap.add_argument("--json", default=os.path.join(HERE, "results", "threads.json"))
    ap.add_argument("--markdown", default=os.path.join(ROOT, "BENCHMARKS.md"), help="file to update, or 'none'")
    args = ap.parse_args()
    command = " ".join(["python benchmarks/bench_threads.py", *sys.argv[1:]])
    res = {"command": command,
           "machine": cpu_model(), "cores": os.cpu_count(), "torch": torch.__version__,
           "commit": commit(ROOT, ["src"]), "conditions": measure(args.rounds, args.burners)}
    with open(args.json, "w") as f:
        json.dump(res, f, indent=1)
    if args.markdown != "none":
        replace_section(args.markdown, markdown(res), MARK_START, MARK_END)


if __name__ == "__main__":
    main()
