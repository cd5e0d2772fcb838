"""Time ``Scene(solver="mujoco")``'s step (:mod:`diffmech.sim.soft_step`) against MuJoCo on gymnasium's Ant.

The Ant (``ant.xml``: RK4, 4 forward evaluations per step, condim-3 contacts with the floor, joint
limits) is stepped from the same states by

* diffmech: 16 steps of :func:`diffmech.sim.contact_step` in a loop, each step's ``info["lam"]``
  starting the next step's solver (as :func:`diffmech.sim.rollout` does), float64, at 1 and 64
  environments; "fwd" without autograd, "fwd+bwd" with the controls requiring grad and
  ``q_final.sum().backward()`` after the 16 steps;
* MuJoCo: ``mujoco.mj_step`` in a Python loop over the environments and steps, and at 64
  environments also ``mujoco.rollout.rollout`` (one thread, one ``MjData``).

The states: ``qpos0`` plus noise, dropped and run under random controls with ``mj_step`` until the
feet touch the floor (every environment has contacts); the same random controls drive both.
Times are CPU time of the process (``time.process_time``, less sensitive than wall time to
other work on a shared machine) per environment-step (s), the fastest of a few calls in a
process, medians over repetitions (processes); the ratios are diffmech's time over MuJoCo's.
``torch.set_num_threads(1)``; ``mujoco.rollout`` with one thread.

``--baseline-src DIR`` also times another checkout's package (``DIR`` holds ``diffmech/``, e.g. a
``git archive`` of an earlier commit's ``src``), each repetition running the current package and
the baseline one after the other in fresh processes, so the two see the same machine load.

    python benchmarks/bench_soft_step.py --quick      # seconds, writes nothing
    python benchmarks/bench_soft_step.py              # writes benchmarks/results/soft_step.json
    python benchmarks/bench_soft_step.py --baseline-src /tmp/base/src --reps 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 16


def _worker(batches: list[int], steps: int, modes: list[str]) -> dict:
    """Times of one process (the package on ``sys.path``): ``{"B/mode": s per env-step}``."""
    import warnings

    import gymnasium
    import mujoco
    import torch

    from diffmech.sim import Scene

    torch.set_num_threads(1)
    path = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", "ant.xml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scene = Scene.from_mjcf(path)
    m = mujoco.MjModel.from_xml_path(path)
    out: dict = {}
    for B in batches:
        out.update(_one(B, scene, m, steps, modes))
    return out


def _one(B: int, scene, m, steps: int, modes: list[str]) -> dict:
    """The times of ``B`` Ant environments (see :func:`_worker`)."""
    import mujoco
    import mujoco.rollout
    import numpy as np
    import torch

    from diffmech.model.mjcf import actuator_forces, mjcf_state_to_diffmech
    from diffmech.sim import contact_step

    out: dict = {}
    rng = np.random.default_rng(B)
    datas = []
    for b in range(B):
        d = mujoco.MjData(m)
        d.qpos[:] = m.qpos0 + 0.05 * rng.standard_normal(m.nq)
        d.qpos[2], d.qpos[3:7] = 0.55, (1.0, 0.0, 0.0, 0.0)
        d.qvel[:] = 0.1 * rng.standard_normal(m.nv)
        for _ in range(150 + 7 * (b % 8)):
            d.ctrl[:] = rng.uniform(-1.0, 1.0, m.nu)
            mujoco.mj_step(m, d)
        datas.append(d)
    ctrl = rng.uniform(-1.0, 1.0, (B, steps, m.nu))
    qs, vs = zip(*(mjcf_state_to_diffmech(scene, d.qpos.copy(), d.qvel.copy()) for d in datas))
    q0, v0 = torch.stack(qs), torch.stack(vs)
    ctrl_t = torch.as_tensor(ctrl)
    state0 = np.stack([np.concatenate([[d.time], d.qpos, d.qvel, d.act]) for d in datas])
    dt = m.opt.timestep

    def soft(backward: bool) -> None:
        q, v, warm = q0, v0, None
        with torch.set_grad_enabled(backward):
            c = ctrl_t.clone().requires_grad_(backward)
            for t in range(steps):
                info: dict = {}
                tau = actuator_forces(scene, c[:, t], q, v)
                q, v = contact_step(scene, q, v, tau, dt, info, warm=warm)
                warm = info["lam"]
            if backward:
                q.sum().backward()

    work = [mujoco.MjData(m) for _ in datas]

    def mj_loop() -> None:
        for b, (d0, d) in enumerate(zip(datas, work)):
            d.qpos[:], d.qvel[:] = d0.qpos, d0.qvel
            d.qacc_warmstart[:] = d0.qacc_warmstart
            for t in range(steps):
                d.ctrl[:] = ctrl[b, t]
                mujoco.mj_step(m, d)

    d_roll = mujoco.MjData(m)

    def mj_rollout() -> None:
        mujoco.rollout.rollout(m, d_roll, state0, ctrl, control_spec=int(mujoco.mjtState.mjSTATE_CTRL))

    def timed(fn, reps: int) -> float:
        fn()  # warm-up (caches, first-call costs)
        ts = []
        for _ in range(reps):
            t0 = time.process_time()
            fn()
            ts.append(time.process_time() - t0)
        return min(ts) / (B * steps)

    for mode in modes:
        out[f"{B}/{mode}"] = timed(lambda bw=(mode == "fwd+bwd"): soft(bw), 2)
    out[f"{B}/mj_step"] = timed(mj_loop, 3)
    if B > 1:
        out[f"{B}/mujoco.rollout"] = timed(mj_rollout, 3)
    return out


def _run(src: str, batches: list[int], steps: int, modes: list[str]) -> dict:
    env = dict(os.environ, PYTHONPATH=src + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", "--batches", ",".join(map(str, batches)),
           "--steps", str(steps), "--modes", ",".join(modes)]
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if res.returncode:
        raise SystemExit(f"worker ({src}) failed:\n{res.stderr[-4000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 and 4 environments, 4 steps, one repetition; no file")
    ap.add_argument("--reps", type=int, default=3, help="repetitions (fresh processes) per package")
    ap.add_argument("--baseline-src", default="", help="another package's src directory to time alongside")
    ap.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "soft_step.json"))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--batches", default="1,64")
    ap.add_argument("--steps", type=int, default=STEPS)
    ap.add_argument("--modes", default="fwd,fwd+bwd")
    a = ap.parse_args()
    batches = [int(b) for b in a.batches.split(",")]
    modes = a.modes.split(",")
    if a.worker:
        print(json.dumps(_worker(batches, a.steps, modes)))
        return
    if a.quick:
        batches, a.steps, a.reps = [1, 4], 4, 1
    srcs = {"current": os.path.join(ROOT, "src")}
    if a.baseline_src:
        srcs["baseline"] = os.path.abspath(a.baseline_src)
    runs: dict[str, list[dict]] = {k: [] for k in srcs}
    for _ in range(a.reps):  # interleaved: each repetition runs every package once
        for k, src in srcs.items():
            runs[k].append(_run(src, batches, a.steps, modes))
    med = {k: {c: statistics.median(r[c] for r in rs) for c in rs[0]} for k, rs in runs.items()}
    cur = med["current"]
    head = f"{'envs':>5} {'what':<10} {'diffmech s/env-step':>20} {'/ mj_step':>10} {'/ rollout':>10}"
    if "baseline" in med:
        head += f" {'baseline s/env-step':>20} {'speed-up':>9}"
    print(f"Ant (ant.xml, RK4), float64, {a.steps} steps, median of {a.reps} repetition(s), torch 1 thread")
    print(head)
    rows = []
    for B in batches:
        mj = cur[f"{B}/mj_step"]
        ro = cur.get(f"{B}/mujoco.rollout")
        for mode in modes:
            t = cur[f"{B}/{mode}"]
            row = {"envs": B, "what": mode, "diffmech_s": t, "mj_step_s": mj, "ratio_mj_step": t / mj,
                   "mujoco_rollout_s": ro, "ratio_rollout": t / ro if ro else None}
            line = f"{B:>5} {mode:<10} {t:>20.3e} {t / mj:>10.0f} {(f'{t / ro:.0f}' if ro else '-'):>10}"
            if "baseline" in med:
                tb = med["baseline"][f"{B}/{mode}"]
                row.update(baseline_s=tb, speedup=tb / t)
                line += f" {tb:>20.3e} {tb / t:>9.2f}"
            rows.append(row)
            print(line)
        print(f"{B:>5} {'mj_step':<10} {mj:>20.3e}" + (f"   mujoco.rollout {ro:.3e}" if ro else ""))
    if a.quick:
        return
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from _machine import machine

    os.makedirs(os.path.dirname(a.json), exist_ok=True)
    with open(a.json, "w") as f:
        json.dump({"machine": machine(ROOT, 1, ["src/diffmech/sim/soft_step.py", "src/diffmech/contact"]),
                   "steps": a.steps, "reps": a.reps, "baseline_src": a.baseline_src or None, "rows": rows,
                   "raw": runs}, f, indent=1)
    print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
