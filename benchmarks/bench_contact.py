"""Contact rollouts: time per step (forward, backward) and memory kept for the backward pass,
``adjoint="checkpoint"`` vs ``adjoint="autograd"``, and MuJoCo on the same scene.

Scenes: ``scenes.laikago`` (a 25.6 kg quadruped standing on four toe spheres, joints held by the
scene's spring-dampers; one robot, and ten in one batch) and ``scenes.racecar`` (the braked car).
The loss is the chassis' final ``x + z`` summed over the batch; its gradient is taken w.r.t. every
commanded torque and the drives' stiffness (laikago) or the friction (racecar). Memory: the bytes
of the tensors autograd saves for the backward pass (``torch.autograd.graph.saved_tensors_hooks``;
for the checkpointed rollout these are the stored states and warm-start impulses it keeps itself,
its ``saved_state_bytes`` stat), not the process's resident set. Both adjoints run interleaved,
one thread, medians of ``--repeats``; the PGS sweeps run in C (the default).

Peer, in the same run: MuJoCo (the ``mujoco`` package) on the same quadruped -- the same URDF with
the same toe spheres as its only collision geometry, a free joint, position actuators with the same
gains, the ``implicitfast`` integrator, dt 1e-3 -- ``mj_step`` per step (looped over the batch) and
``mjd_transitionFD`` (centred finite differences of one step w.r.t. state and controls), the cost
per step of a finite-difference gradient of a rollout. Seed (C++, one robot, Table 1-3): forward
0.2 ms and backward 1.2 ms per step.

Writes ``benchmarks/results/bench_contact.json`` and a section of BENCHMARKS.md.

    python benchmarks/bench_contact.py                         # about 15 minutes on 2 busy cores
    python benchmarks/bench_contact.py --steps 50,200 --batch 1 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _markdown import replace_section  # noqa: E402
from diffmech.sim import rollout, scenes  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact:start -->", "<!-- bench_contact:end -->"
SEED_FWD_MS, SEED_BWD_MS = 0.2, 1.2


def build(scene_name: str, batch: int):
    p = torch.tensor(1000.0 if scene_name == "laikago" else 0.3, dtype=torch.float64, requires_grad=True)
    if scene_name == "laikago":
        scene, q0, v0 = scenes.laikago(1, stiffness=p)
    else:
        scene, q0, v0 = scenes.racecar(p)
    return scene, q0.expand(batch, -1).clone(), v0.expand(batch, -1).clone(), p


def run(scene_name: str, adjoint: str, T: int, batch: int, dt: float = 1e-3) -> dict:
    scene, q0, v0, p = build(scene_name, batch)
    tau = torch.zeros(batch, T, scene.nv, dtype=torch.float64, requires_grad=True)
    saved = [0]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    st: dict = {}
    t0 = time.perf_counter()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        qs, vs = rollout(scene, q0, v0, tau, dt, adjoint=adjoint, stats=st)
    t1 = time.perf_counter()
    loss = (qs[:, -1, 0] + qs[:, -1, 2]).sum()
    loss.backward()
    t2 = time.perf_counter()
    if adjoint == "checkpoint":  # the Function keeps the states and warm starts itself
        saved[0] += st["saved_state_bytes"]
    return {"forward_ms_per_step": 1e3 * (t1 - t0) / T, "backward_ms_per_step": 1e3 * (t2 - t1) / T,
            "saved_bytes": saved[0], "param_grad": float(p.grad), "final_z": float(qs[0, -1, 2].detach())}


def mujoco_laikago(stiffness=1000.0, damping=20.0, dt=1e-3):
    """The laikago of ``scenes.laikago`` as a MuJoCo model, or ``None`` without ``mujoco``."""
    try:
        import mujoco
        import pybullet_data
        from lxml import etree
    except ImportError:
        return None
    path = os.path.join(pybullet_data.getDataPath(), "laikago", "laikago_toes_zup.urdf")
    root = etree.parse(path).getroot()
    for link in root.findall("link"):
        for el in list(link):
            if el.tag in ("visual", "contact") or (el.tag == "collision" and el.find("geometry/mesh") is not None):
                link.remove(el)
    mj = etree.SubElement(root, "mujoco")
    etree.SubElement(mj, "compiler", discardvisual="true", fusestatic="false", balanceinertia="false")
    spec = mujoco.MjSpec.from_string(etree.tostring(root).decode())
    spec.worldbody.bodies[0].add_freejoint()
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[5, 5, 0.1])
    spec.option.timestep = dt
    spec.option.integrator = mujoco.mjtIntegrator.mjINT_IMPLICITFAST
    for j in spec.joints:
        if j.type == mujoco.mjtJoint.mjJNT_HINGE:
            a = spec.add_actuator()
            a.trntype = mujoco.mjtTrn.mjTRN_JOINT
            a.target = j.name
            a.set_to_position(kp=stiffness, kv=damping)
    m = spec.compile()
    return mujoco, m


def run_mujoco(T: int, batch: int) -> dict | None:
    got = mujoco_laikago()
    if got is None:
        return None
    import numpy as np

    mujoco, m = got
    datas = []
    for _ in range(batch):
        d = mujoco.MjData(m)
        d.qpos[2] = 0.518
        mujoco.mj_forward(m, d)
        datas.append(d)
    t0 = time.perf_counter()
    for _ in range(T):
        for d in datas:
            mujoco.mj_step(m, d)
    t1 = time.perf_counter()
    n = 2 * m.nv + m.na
    A, B = np.zeros((n, n)), np.zeros((n, m.nu))
    reps = max(1, min(T, 200))
    t2 = time.perf_counter()
    for _ in range(reps):
        for d in datas:
            mujoco.mjd_transitionFD(m, d, 1e-6, 1, A, B, None, None)
    t3 = time.perf_counter()
    return {"step_ms_per_step": 1e3 * (t1 - t0) / T, "fd_ms_per_step": 1e3 * (t3 - t2) / reps,
            "final_z": float(datas[0].qpos[2]), "version": mujoco.__version__}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scene", choices=("laikago", "racecar"), default="laikago")
    ap.add_argument("--steps", default="50,500,5000")
    ap.add_argument("--batch", default="1,10")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    load0 = os.getloadavg()
    t_start = time.perf_counter()
    for adj in ("checkpoint", "autograd"):  # one-time costs (the solver's kernel, first calls) off the clock
        run(args.scene, adj, 5, 1)
    if args.scene == "laikago":
        run_mujoco(5, 1)
    rows = []
    for batch in [int(x) for x in args.batch.split(",")]:
        for T in [int(x) for x in args.steps.split(",")]:
            cell = {"checkpoint": [], "autograd": []}
            for _ in range(args.repeats):
                for adj in ("checkpoint", "autograd"):
                    cell[adj].append(run(args.scene, adj, T, batch))
            row = {"batch": batch, "T": T}
            for adj, runs in cell.items():
                row[adj] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
            row["grad_agree"] = abs(row["checkpoint"]["param_grad"] - row["autograd"]["param_grad"]) / max(
                abs(row["autograd"]["param_grad"]), 1e-300)
            row["mujoco"] = run_mujoco(T, batch) if args.scene == "laikago" else None
            rows.append(row)
            c, a, mj = row["checkpoint"], row["autograd"], row["mujoco"]
            print(f"B={batch} T={T}: checkpoint fwd {c['forward_ms_per_step']:.2f} bwd {c['backward_ms_per_step']:.2f} "
                  f"ms/step, saved {c['saved_bytes'] / 1e6:.3f} MB; autograd fwd {a['forward_ms_per_step']:.2f} "
                  f"bwd {a['backward_ms_per_step']:.2f} ms/step, saved {a['saved_bytes'] / 1e6:.1f} MB; "
                  f"grads agree to {row['grad_agree']:.1e}"
                  + (f"; mujoco step {mj['step_ms_per_step']:.3f} fd {mj['fd_ms_per_step']:.2f} ms/step" if mj else ""),
                  flush=True)
    rep = {"scene": args.scene, "rows": rows, "load_before": load0, "load_after": os.getloadavg(),
           "wall_s": time.perf_counter() - t_start, "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "torch": torch.__version__, "python": platform.python_version(),
           "args": " ".join(sys.argv[1:] if argv is None else argv)}
    if not args.no_write:
        path = os.path.join(ROOT, "benchmarks", "results", "bench_contact.json")
        with open(path, "w") as f:
            json.dump(rep, f, indent=2)
        replace_section(os.path.join(ROOT, "BENCHMARKS.md"), "\n".join(markdown(rep)), MARK_START, MARK_END)
    return rep


def markdown(rep: dict) -> list[str]:
    load0 = rep["load_before"]
    lines = [MARK_START, "## Contact rollouts", "",
             f"_Generated by `python benchmarks/bench_contact.py{(' ' + rep['args']) if rep['args'] else ''}` on "
             f"{rep['date']} ({rep['wall_s']:.0f} s); torch {rep['torch']}, one thread, 2 cores shared with other "
             f"jobs; load average at the start {load0[0]:.1f}, at the end {rep['load_after'][0]:.1f}._", "",
             f"Scene `scenes.{rep['scene']}`, dt 1e-3, float64, zero commanded torque; loss: the chassis' final "
             "x + z summed over the batch, gradient w.r.t. every torque and the drives' stiffness (laikago) or "
             "the friction (racecar). Saved = bytes kept for the backward pass. Per robot = the step's time "
             "divided by the batch. MuJoCo: the same quadruped (same URDF, the toe spheres as its only "
             "collision geometry, position actuators with the same gains, `implicitfast`), `mj_step` looped "
             "over the batch, and `mjd_transitionFD` (one step's derivatives by centred differences: what "
             "a finite-difference gradient of a rollout costs per step). Seed (C++, one robot): forward "
             f"{SEED_FWD_MS} and backward {SEED_BWD_MS} ms per step.", "",
             "| robots | steps | ckpt fwd ms/step | ckpt bwd ms/step | bwd/fwd | ckpt saved (MB) | autograd fwd "
             "| autograd bwd | autograd saved (MB) | ckpt fwd+bwd per robot (ms) | vs seed (1.4 ms) "
             "| MuJoCo mj_step per robot (ms) | MuJoCo FD derivs per robot (ms) | ckpt fwd+bwd / MuJoCo FD "
             "| grad diff (rel) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        c, a, mj, B = r["checkpoint"], r["autograd"], r.get("mujoco"), r["batch"]
        both = (c["forward_ms_per_step"] + c["backward_ms_per_step"]) / B
        mj_cells = (f"{mj['step_ms_per_step'] / B:.3f} | {mj['fd_ms_per_step'] / B:.2f} | "
                    f"{both / (mj['fd_ms_per_step'] / B):.1f}x" if mj else "- | - | -")
        lines.append(f"| {B} | {r['T']} | {c['forward_ms_per_step']:.2f} | {c['backward_ms_per_step']:.2f} | "
                     f"{c['backward_ms_per_step'] / c['forward_ms_per_step']:.1f} | {c['saved_bytes'] / 1e6:.3f} | "
                     f"{a['forward_ms_per_step']:.2f} | {a['backward_ms_per_step']:.2f} | "
                     f"{a['saved_bytes'] / 1e6:.1f} | {both:.2f} | {both / (SEED_FWD_MS + SEED_BWD_MS):.1f}x | "
                     f"{mj_cells} | {r['grad_agree']:.1e} |")
    lines += ["", "Not measured yet: MJX (`jax.grad` through `mjx.step`), `mujoco-torch`.", MARK_END]
    return lines


if __name__ == "__main__":
    main()
