"""A robot with box feet on the ground: its contact rollout on the native route against the torch route.

Scene: ``tests/assets/box_feet.urdf`` (a floating body on two hinged legs with box feet, a cylinder on
its back; 8 DoF, 32 balls: 8 corners per box, 16 rim points), drives on the hips, friction 0.6, the
robot dropped 1 cm onto its feet, sliding at 0.4 m/s, a constant hip torque; ``T`` steps of 2 ms, loss
the base's final x + z, forward + backward (``torch.autograd.grad`` w.r.t. the torques and the left
foot's learnable box size), float64, one thread. Routes:

* ``native``: ``DIFFMECH_NATIVE`` auto after :func:`~diffmech.sim.prepare_ground_kernels` (each step
  and its reverse one call of the C driver, :mod:`diffmech.sim._ground_rollout`);
* ``torch step``: the same mode with the native ground route switched off (what a box-footed robot got
  before the route took boxes: ``"torch: box shapes"``; the dynamics and the contact solve still in C);
* ``torch``: ``native_mode("never")``, everything in torch.

Timing: rounds of adjacent blocks, one per route, the ratio of each round's times; the median over
rounds (and the lowest and highest round).

    python benchmarks/bench_box_ground.py --rounds 3 --steps 200
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

import diffmech  # noqa: E402
from diffmech.dynamics import kernels  # noqa: E402
from diffmech.sim import Scene, prepare_ground_kernels, rollout  # noqa: E402

F64 = torch.float64
URDF = os.path.join(ROOT, "tests", "assets", "box_feet.urdf")
rt = importlib.import_module("diffmech.sim.route")


def _scene(size):
    robot = diffmech.load_urdf(URDF, floating_base=True)
    return Scene([robot], friction=0.6, sizes={("boxfeet", "left"): size},
                 drives={"boxfeet": {"stiffness": 40.0, "damping": 1.5, "armature": 0.01}})


def _run(route: str, steps: int, batch: int) -> tuple[float, str]:
    """Seconds of one rollout's forward and backward pass, and the route it took."""
    size = torch.tensor([0.08, 0.05, 0.02], dtype=F64, requires_grad=True)
    scene = _scene(size)
    q = scene.neutral_configuration().expand(batch, -1).clone()
    q[:, 2] = 0.22
    v = torch.zeros(batch, scene.nv, dtype=F64)
    v[:, 0] = 0.4
    tau = torch.zeros(batch, steps, scene.nv, dtype=F64)
    tau[:, :, 6:] = 0.3
    tau.requires_grad_(True)
    stats: dict = {}
    saved = rt.ground_plan, rt.ground_stepper
    if route == "torch step":
        rt.ground_plan = rt.ground_stepper = lambda *a, **k: None
    try:
        with kernels.native_mode("never" if route == "torch" else "auto"):
            t0 = time.perf_counter()
            Q, _ = rollout(scene, q, v, tau, 2e-3, stats=stats)
            torch.autograd.grad((Q[:, -1, 0] + Q[:, -1, 2]).sum(), (tau, size))
            return time.perf_counter() - t0, stats["route"]
    finally:
        rt.ground_plan, rt.ground_stepper = saved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--json", default=None, help="write the raw times there")
    args = ap.parse_args()
    torch.set_num_threads(1)
    with kernels.native_mode("build"):
        prepare_ground_kernels(_scene(torch.tensor([0.08, 0.05, 0.02], dtype=F64)))
    routes = ("native", "torch step", "torch")
    _run("native", 10, args.batch)  # warm-up: kernels loaded, steppers made
    times: dict = {r: [] for r in routes}
    names: dict = {}
    for k in range(args.rounds):
        for r in routes[k % 3:] + routes[:k % 3]:
            s, names[r] = _run(r, args.steps, args.batch)
            times[r].append(s)
    out = {"steps": args.steps, "batch": args.batch, "rounds": args.rounds, "load": os.getloadavg(), "routes": {}}
    for r in routes:
        ms = 1e3 * statistics.median(times[r]) / args.steps
        ratio = [t / n for t, n in zip(times[r], times["native"])]
        out["routes"][r] = {"route": names[r], "seconds": times[r], "ms_per_step": ms,
                            "x_native": statistics.median(ratio), "x_native_rounds": [min(ratio), max(ratio)]}
        print(f"{r:10s} ({names[r]}): {ms:.3f} ms / step forward + backward, {statistics.median(ratio):.1f}x native "
              f"(rounds {min(ratio):.1f}-{max(ratio):.1f})")
    print(f"load average {os.getloadavg()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
