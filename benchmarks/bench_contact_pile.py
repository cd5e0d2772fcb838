"""Scenes of many free bodies: cost of a step and of its gradient as the number of bodies grows,
against MuJoCo on the same pile.

Scene: ``K`` solid spheres (radius 5 cm, 0.2 kg, friction 0.5) on a 7-wide grid 12 cm apart, at
rest 0 to 2 cm above the ground (they settle and touch it), K = 10, 25, 50; 100 steps of dt 1e-3,
float64, zero torque, one environment. diffmech: forward ms per step (``rollout``), backward ms per
step (``backward()`` of the last state's sum through the checkpointed adjoint). The free bodies
are stepped together in closed form (``contact_step._free_body_dynamics``); ``--per-model`` also
times the per-model rigid-body algorithms (the path before that), on the same scenes in the same
run. MuJoCo: the same spheres as free bodies with a plane (its default soft contacts, ``Euler``,
dt 1e-3): ``mj_step`` and ``mjd_transitionFD`` (centred differences of one step) ms per step,
one thread.

    python benchmarks/bench_contact_pile.py                 # BENCHMARKS.md + results/bench_contact_pile.json
    python benchmarks/bench_contact_pile.py --bodies 10 --steps 20 --no-write   # seconds
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _machine  # noqa: E402
from _markdown import generated_by, replace_section  # noqa: E402
from diffmech.model import systems  # noqa: E402
from diffmech.sim import Scene, rollout  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact_pile:start -->", "<!-- bench_contact_pile:end -->"
RADIUS, MASS, SPACING, FRICTION = 0.05, 0.2, 0.12, 0.5


def positions(K: int) -> list[tuple[float, float, float]]:
    return [(SPACING * (i % 7), SPACING * (i // 7), RADIUS + 0.01 * (i % 3)) for i in range(K)]


def pile(K: int):
    scene = Scene([systems.sphere(RADIUS, MASS, name=f"b{i}") for i in range(K)], friction=FRICTION)
    q = scene.neutral_configuration().clone()
    for i, xyz in enumerate(positions(K)):
        q[scene.slices[f"b{i}"]][:3] = torch.tensor(xyz, dtype=torch.float64)
    return scene, q, torch.zeros(scene.nv, dtype=torch.float64)


def time_diffmech(K: int, T: int, together: bool, repeats: int) -> dict:
    cs = importlib.import_module("diffmech.sim.contact_step")
    original = cs._free_bodies
    if not together:
        cs._free_bodies = lambda scene: []
    try:
        scene, q, v = pile(K)
        best = None
        for _ in range(repeats):
            tau = torch.zeros(T, scene.nv, dtype=torch.float64, requires_grad=True)
            st: dict = {}
            t0 = time.perf_counter()
            Q, V = rollout(scene, q, v, tau, 1e-3, stats=st)
            t1 = time.perf_counter()
            Q[-1].sum().backward()
            t2 = time.perf_counter()
            cell = (1e3 * (t1 - t0) / T, 1e3 * (t2 - t1) / T)
            best = cell if best is None or sum(cell) < sum(best) else best
        return {"forward_ms_per_step": best[0], "backward_ms_per_step": best[1],
                "contacts_last_step": st.get("contact_candidates"),
                "final_z_min": Q[-1].reshape(-1)[2::7].min().item()}
    finally:
        cs._free_bodies = original


def time_mujoco(K: int, T: int) -> dict | None:
    try:
        import mujoco
        import numpy as np
    except ImportError:
        return None
    spec = mujoco.MjSpec()
    spec.option.timestep = 1e-3
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_EULER
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[5, 5, 0.1], friction=[FRICTION, 0.005, 1e-4])
    for i, xyz in enumerate(positions(K)):
        b = spec.worldbody.add_body(name=f"b{i}", pos=list(xyz))
        b.add_freejoint()
        b.add_geom(type=mujoco.mjtGeom.mjGEOM_SPHERE, size=[RADIUS, 0, 0], mass=MASS,
                   friction=[FRICTION, 0.005, 1e-4])
    m = spec.compile()
    d = mujoco.MjData(m)
    mujoco.mj_forward(m, d)
    t0 = time.perf_counter()
    for _ in range(T):
        mujoco.mj_step(m, d)
    t1 = time.perf_counter()
    n = 2 * m.nv + m.na
    A, B = np.zeros((n, n)), np.zeros((n, m.nu))
    reps = max(1, min(T, 20))
    t2 = time.perf_counter()
    for _ in range(reps):
        mujoco.mjd_transitionFD(m, d, 1e-6, 1, A, B, None, None)
    t3 = time.perf_counter()
    return {"step_ms": 1e3 * (t1 - t0) / T, "fd_ms": 1e3 * (t3 - t2) / reps, "version": mujoco.__version__}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bodies", default="10,25,50")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--per-model", action="store_true", help="also time the per-model path (same run)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load0, t_start = os.getloadavg(), time.perf_counter()
    time_diffmech(2, 3, True, 1)  # first calls off the clock
    rows = []
    for K in [int(k) for k in args.bodies.split(",")]:
        row = {"bodies": K, "T": args.steps, **time_diffmech(K, args.steps, True, args.repeats)}
        if args.per_model:
            pm = time_diffmech(K, args.steps, False, args.repeats)
            row.update(per_model_forward_ms_per_step=pm["forward_ms_per_step"],
                       per_model_backward_ms_per_step=pm["backward_ms_per_step"])
        mj = time_mujoco(K, args.steps)
        if mj:
            row.update(mujoco_step_ms=mj["step_ms"], mujoco_fd_ms=mj["fd_ms"], mujoco=mj["version"])
        rows.append(row)
        print(f"K={K}: fwd {row['forward_ms_per_step']:.1f} bwd {row['backward_ms_per_step']:.1f} ms/step"
              + (f" (per model {row['per_model_forward_ms_per_step']:.1f} / "
                 f"{row['per_model_backward_ms_per_step']:.1f})"
                 if args.per_model else "")
              + (f"; MuJoCo step {row['mujoco_step_ms']:.3f}, FD {row['mujoco_fd_ms']:.2f} ms" if mj else ""),
              flush=True)
    rep = {"rows": rows, "load_before": load0, "load_after": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
           "machine": _machine.machine(ROOT, 1, ["src/diffmech", "benchmarks/bench_contact_pile.py"]),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
           "args": " ".join(sys.argv[1:] if argv is None else argv)}
    text = "\n".join(markdown(rep))
    print(text)
    if not args.no_write:
        with open(os.path.join(ROOT, "benchmarks", "results", "bench_contact_pile.json"), "w") as f:
            json.dump(rep, f, indent=2)
        replace_section(os.path.join(ROOT, "BENCHMARKS.md"), text, MARK_START, MARK_END)
    return rep


def markdown(rep: dict) -> list[str]:
    per_model = "per_model_forward_ms_per_step" in rep["rows"][0]
    lines = [MARK_START, "## Contact rollouts: piles of free bodies", "",
             generated_by("bench_contact_pile.py", rep), "",
             f"K spheres (r {RADIUS} m, {MASS} kg, friction {FRICTION}) settling on the ground, one environment, "
             "dt 1e-3, float64. diffmech: forward and backward (checkpointed adjoint) ms per step, the free bodies "
             "stepped together in closed form" + ("; *per model*: the rigid-body algorithms called per body, "
                                                   "same scenes, same run" if per_model else "")
             + ". MuJoCo: the same spheres and plane (soft contacts, Euler), `mj_step` and `mjd_transitionFD` "
             "(one step's derivatives by centred differences) ms per step, one thread.", "",
             "| bodies | fwd ms/step | bwd ms/step | fwd + bwd per body (ms) | "
             + ("per model fwd / bwd | " if per_model else "")
             + "MuJoCo mj_step ms | MuJoCo FD ms | fwd + bwd / MuJoCo FD |",
             "|---:|---:|---:|---:|" + ("---:|" if per_model else "") + "---:|---:|---:|"]
    for r in rep["rows"]:
        tot = r["forward_ms_per_step"] + r["backward_ms_per_step"]
        fd = r.get("mujoco_fd_ms")
        lines.append(f"| {r['bodies']} | {r['forward_ms_per_step']:.1f} | {r['backward_ms_per_step']:.1f} | "
                     f"{tot / r['bodies']:.2f} | "
                     + (f"{r['per_model_forward_ms_per_step']:.1f} / {r['per_model_backward_ms_per_step']:.1f} | "
                        if per_model else "")
                     + (f"{r['mujoco_step_ms']:.3f} | {fd:.2f} | {tot / fd:.1f}x |" if fd else "- | - | - |"))
    lines += ["", "Raw data: `benchmarks/results/bench_contact_pile.json`.", MARK_END]
    return lines


if __name__ == "__main__":
    main()
