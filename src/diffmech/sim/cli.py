"""``diffmech sim run SCENE``: roll out a ready-made contact scene, write its trajectory and a GIF."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

from ..cli_checks import nonnegative_float, out_path, prepare_run_folder

SCENES = ("racecar", "racecar-rolling", "golf", "laikago", "panda-throw")
# the files a run writes: any of them in --out means the folder holds a run
RUN_FILES = ("results.json", "trajectory.csv", "animation.gif")


def add_sim_parser(sub) -> argparse.ArgumentParser:
    """Register ``sim`` and its subcommands on an ``add_subparsers()`` object."""
    sim = sub.add_parser("sim", help="simulate ready-made contact scenes",
                         description="Roll out a scene of diffmech.sim.scenes and write its trajectory.")
    ssub = sim.add_subparsers(dest="sim_command", required=True)
    run = ssub.add_parser("run", help="roll out a scene under zero commanded torque; trajectory, stats and a GIF",
                          description="Roll out SCENE (zero commanded torque) and write DIR/trajectory.csv "
                                      "(t, q, v), DIR/results.json (the rollout's stats, wall time) and "
                                      "DIR/animation.gif (in 3-D: visual meshes where the URDF has them, "
                                      "else the collision shapes). panda-throw: the Panda holds the ball still "
                                      "and opens its fingers halfway through.")
    run.add_argument("scene", choices=SCENES)
    run.add_argument("--seconds", type=float, default=1.0, help="simulated time (default: %(default)s)")
    run.add_argument("--dt", type=float, default=1e-3, help="time step, s (default: %(default)s)")
    run.add_argument("--friction", type=nonnegative_float, default=None,
                     help="friction of the racecar scenes (default: 0.3)")
    run.add_argument("--out", default=None, type=out_path, help="output folder (default: results/sim/SCENE)")
    run.add_argument("--overwrite", action="store_true",
                     help="replace a run already in the output folder (without it such a folder is refused)")
    run.add_argument("--no-gif", action="store_true", help="skip the animation")
    return sim


def run_sim(args) -> int:
    import math

    import torch

    from . import rollout, scenes
    from .render import animate_scene

    out = args.out or os.path.join("results", "sim", args.scene)
    if not (math.isfinite(args.dt) and math.isfinite(args.seconds) and args.dt > 0 and args.seconds > 0):
        print(f"diffmech sim run: error: --dt and --seconds must be positive, got {args.dt}, {args.seconds}",
              file=sys.stderr)
        return 2
    prepare_run_folder(out, markers=RUN_FILES, overwrite=args.overwrite, can_resume=False)
    if args.scene.startswith("racecar"):
        mu = 0.3 if args.friction is None else args.friction
        scene, q0, v0 = scenes.racecar(mu, braked=args.scene == "racecar")
    elif args.scene == "golf":
        scene, q0, v0 = scenes.golf()
    elif args.scene == "panda-throw":
        scene, q0, v0 = scenes.panda_throw()
    else:
        scene, q0, v0 = scenes.laikago(1)
    T = max(1, round(args.seconds / args.dt))
    tau = torch.zeros(T, scene.nv, dtype=q0.dtype)
    if args.scene == "panda-throw":  # the fingers open halfway: the ball drops
        tau = scenes.panda_throw_torques(tau[:, :7], T // 2)
    stats: dict = {}
    t0 = time.perf_counter()
    with torch.no_grad():
        qs, vs = rollout(scene, q0, v0, tau, args.dt, stats=stats)  # a bar or log lines once it runs 2 s
    wall = time.perf_counter() - t0
    os.makedirs(out, exist_ok=True)
    t = torch.arange(T + 1, dtype=torch.float64)[:, None] * args.dt
    table = torch.cat([t, qs.double(), vs.double()], -1)
    header = ["t"] + [f"q{i}" for i in range(scene.nq)] + [f"v{i}" for i in range(scene.nv)]
    with open(os.path.join(out, "trajectory.csv"), "w") as f:
        f.write(",".join(header) + "\n")
        for row in table.tolist():
            f.write(",".join(f"{x:.9g}" for x in row) + "\n")
    frames = 0
    if not args.no_gif:
        frames = animate_scene(scene, qs, os.path.join(out, "animation.gif"), dt=args.dt, title=args.scene)
    res = {"scene": args.scene, "steps": T, "dt": args.dt, "wall_s": wall, "ms_per_step": 1e3 * wall / T,
           "names": scene.names, "slices": {n: [s.start, s.stop] for n, s in scene.slices.items()},
           "frames": frames, "stats": {k: v for k, v in stats.items() if isinstance(v, (int, float))}}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(res, f, indent=1)
    print(f"diffmech sim run {args.scene}: {T} steps in {wall:.1f} s ({res['ms_per_step']:.2f} ms/step) -> {out}")
    return 0
