"""Cost of a contact rollout's gradient per robot as the batch grows, against MuJoCo's
finite-difference derivatives (whose cost per robot does not shrink with a batch).

Scene ``scenes.laikago`` (one quadruped standing on its toe spheres, joint spring-dampers), copies
in one batch of ``B`` independent environments; ``T`` steps of dt 1e-3, float64, zero commanded
torque, loss = the chassis' final ``x + z`` summed over the batch, gradient w.r.t. every torque
and the drives' stiffness by the checkpointed adjoint (dense checkpoints). Per robot-step = the
rollout's forward + backward time / (B T). MuJoCo (the model of ``bench_contact.py``): ``mj_step``
and ``mjd_transitionFD`` (centred differences of one step w.r.t. state and controls: what a
finite-difference gradient of a rollout costs per step, before the chain of products) per robot
and step, measured on ``min(B, --mujoco-robots)`` robots, since MuJoCo steps robots one after
another (its cost per robot does not depend on ``B``). One thread each, in the same run.

    python benchmarks/bench_contact_batch.py                        # B = 1 ... 1024, T = 100
    python benchmarks/bench_contact_batch.py --batch 1,64 --steps 50 --no-write
    python benchmarks/bench_contact_batch.py --device cuda --batch 1,64,1024,4096 --steps 50 \
        --json benchmarks/results/bench_contact_batch_cuda.json   # diffmech on a GPU, MuJoCo on one core
"""

from __future__ import annotations

import argparse
import datetime
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
import bench_contact  # noqa: E402
from _markdown import generated_by, replace_section  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact_batch:start -->", "<!-- bench_contact_batch:end -->"
SEED_MS = bench_contact.SEED_FWD_MS + bench_contact.SEED_BWD_MS


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", default="1,4,16,64,256,1024")
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--mujoco-robots", type=int, default=16)
    ap.add_argument("--device", default="cpu", help="diffmech's torch device (MuJoCo runs on the CPU)")
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/bench_contact_batch.json)")
    ap.add_argument("--markdown", default=None, help="markdown file to update (default BENCHMARKS.md; 'none' skips)")
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args(argv)
    dev = args.device
    torch.set_num_threads(1)
    if dev == "cpu":  # the native kernels are CPU code
        bench_contact.prepare_kernels()
    load0, t_start = os.getloadavg(), time.perf_counter()
    have_mj = bench_contact.mujoco_laikago() is not None
    bench_contact.run("laikago", "checkpoint", 5, 1, device=dev)  # first calls off the clock
    if have_mj:
        bench_contact.run_mujoco(5, 1)
    T, rows = args.steps, []
    for B in [int(x) for x in args.batch.split(",")]:
        d = bench_contact.run("laikago", "checkpoint", T, B, device=dev)
        row = {"batch": B, "T": T, "forward_ms_per_step": d["forward_ms_per_step"],
               "backward_ms_per_step": d["backward_ms_per_step"],
               "per_robot_ms": (d["forward_ms_per_step"] + d["backward_ms_per_step"]) / B}
        if have_mj:
            nb = min(B, args.mujoco_robots)
            mj = bench_contact.run_mujoco(T, nb)
            row.update(mujoco_robots=nb, mujoco_step_per_robot_ms=mj["step_ms_per_step"] / nb,
                       mujoco_fd_per_robot_ms=mj["fd_ms_per_step"] / nb, mujoco=mj["version"])
        rows.append(row)
        print(f"B={B}: diffmech fwd+bwd {row['per_robot_ms']:.3f} ms per robot-step"
              + (f"; MuJoCo FD {row['mujoco_fd_per_robot_ms']:.3f}, mj_step {row['mujoco_step_per_robot_ms']:.4f} "
                 f"ms per robot-step" if have_mj else "") + f"; load {os.getloadavg()[0]:.1f}", flush=True)
    rep = {"rows": rows, "load_before": load0, "load_after": os.getloadavg(), "wall_s": time.perf_counter() - t_start,
           "machine": _machine.machine(ROOT, 1, ["src/diffmech", "benchmarks/bench_contact_batch.py"]),
           "date": datetime.datetime.now().isoformat(timespec="seconds"), "python": platform.python_version(),
           "device": dev, "device_name": torch.cuda.get_device_name(dev) if dev.startswith("cuda") else "cpu",
           "args": " ".join(sys.argv[1:] if argv is None else argv)}
    text = "\n".join(markdown(rep))
    print(text)
    if not args.no_write:
        path = args.json or os.path.join(ROOT, "benchmarks", "results", "bench_contact_batch.json")
        with open(path, "w") as f:
            json.dump(rep, f, indent=2)
        if args.markdown != "none":
            replace_section(args.markdown or os.path.join(ROOT, "BENCHMARKS.md"), text, *_marks(rep))
    return rep


def _marks(rep: dict) -> tuple[str, str]:
    if rep.get("device", "cpu") == "cpu":
        return MARK_START, MARK_END
    return MARK_START.replace(":start", "_gpu:start"), MARK_END.replace(":end", "_gpu:end")


def markdown(rep: dict) -> list[str]:
    start, end = _marks(rep)
    where = ("" if rep.get("device", "cpu") == "cpu" else
             f" on a GPU ({rep['device_name']}; MuJoCo on one CPU core of the same machine)")
    lines = [start, f"## Contact rollouts: gradient cost per robot vs batch size{where}", "",
             generated_by("bench_contact_batch.py", rep), "",
             "Native kernels for the robot's mass matrix, bias forces, link kinematics and floating-base update "
             "(`diffmech.dynamics.kernels.prepare`), and the native ground route of the step "
             "(`diffmech.sim.prepare_ground_kernels`: the step's first stage as one kernel, the contact problem in C); "
             "the checkpointed rollout runs each step, and its reverse, as one call of a C driver of those kernels "
             "(`diffmech.sim._ground_rollout`, at every batch size). "
             "`scenes.laikago` copies in one batch, dt 1e-3, float64, zero commanded torque; gradient of the chassis' "
             "final x + z w.r.t. every torque and the drives' stiffness (checkpointed adjoint). Per robot-step: "
             "forward + backward time / (batch x steps). MuJoCo: `mjd_transitionFD` (one step's derivatives by centred "
             "differences) and `mj_step` per robot and step, robots one after another (measured on at most "
             "`--mujoco-robots` of them). Seed (C++, one robot): 1.4 ms forward + backward per step.", "",
             "| robots | steps | diffmech fwd ms/step | diffmech bwd ms/step | diffmech fwd+bwd per robot-step (ms) "
             "| vs seed (1.4 ms) | MuJoCo FD per robot-step (ms) | diffmech / MuJoCo FD "
             "| MuJoCo mj_step per robot-step (ms) |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rep["rows"]:
        fd = r.get("mujoco_fd_per_robot_ms")
        lines.append(f"| {r['batch']} | {r['T']} | {r['forward_ms_per_step']:.2f} | {r['backward_ms_per_step']:.2f} | "
                     f"{r['per_robot_ms']:.3f} | {r['per_robot_ms'] / SEED_MS:.2f}x | "
                     + (f"{fd:.3f} | {r['per_robot_ms'] / fd:.2f} | {r['mujoco_step_per_robot_ms']:.4f} |" if fd else
                        "- | - | - |"))
    raw = "bench_contact_batch.json" if rep.get("device", "cpu") == "cpu" else "bench_contact_batch_cuda.json"
    lines += ["", f"Raw data: `benchmarks/results/{raw}`.", end]
    return lines


if __name__ == "__main__":
    main()
