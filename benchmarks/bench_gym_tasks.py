"""Environment steps per second of gymnasium's MuJoCo v5 tasks: ``diffmech.rl.make`` with gradients vs gymnasium.

diffmech: ``diffmech.rl.make(name, num_envs=N)`` (the task built from gymnasium's own XML file,
``Scene(solver="mujoco")``: MuJoCo's soft contacts, Newton solver and the file's integrator, float64,
``frame_skip`` substeps per environment step, CPU, one torch thread), reset with seed 0 and stepped
``--steps`` times (16: a SHAC window) with uniformly random actions in the control range held in a
tensor that requires grad, then ``backward()`` of the summed reward to every action (*with
gradients*: the forward steps plus the backward pass); *no graph*: the same steps under
:func:`torch.no_grad`. An environment step is one environment advanced by one step (``frame_skip``
simulator steps), so a call of ``env.step`` on ``N`` environments counts ``N`` steps.

gymnasium: ``gymnasium.make(ID)`` for one environment, ``gymnasium.make_vec(ID, num_envs=N,
vectorization_mode="sync")`` (a ``SyncVectorEnv``) for more, stepped the same number of times with
random actions; no gradients (MuJoCo's C step, one thread). A finished episode resets inside the
timing (as a vector environment's autoreset does; diffmech's environments restart finished
episodes inside ``step`` too).

Every variant runs once as a warm-up, then ``--repeats`` times interleaved (diffmech with gradients,
diffmech without, gymnasium), so a load change on the shared machine hits every column alike;
medians of wall-clock and of process CPU seconds. ``mujoco.mjx`` is tried (it needs JAX); where it
does not import, the section says so.

Writes ``benchmarks/results/gym_tasks.json`` and the "gymnasium's MuJoCo tasks" section of
BENCHMARKS.md.

    python benchmarks/bench_gym_tasks.py                     # the recorded run
    python benchmarks/bench_gym_tasks.py --quick             # seconds; writes nothing
    python benchmarks/bench_gym_tasks.py --big               # also 4096 environments (--big-steps steps)
    python benchmarks/bench_gym_tasks.py --from-json benchmarks/results/gym_tasks.json   # re-render
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, HERE)

import _machine  # noqa: E402
from _markdown import replace_section, stamp  # noqa: E402

MARK_START, MARK_END = "<!-- bench_gym_tasks:start -->", "<!-- bench_gym_tasks:end -->"
TASKS = ("ant-v5", "halfcheetah-v5", "hopper-v5")
KINDS = ("grad", "nograd", "gym")


def random_actions(env, steps: int, batch: int, seed: int) -> torch.Tensor:
    """Uniform actions ``(steps, batch, act_dim)`` in ``env``'s control range (float64, CPU)."""
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(steps, batch, env.act_dim, generator=g, dtype=torch.float64)
    lo, hi = env.action_low.cpu(), env.action_high.cpu()
    return lo + (hi - lo) * u


def time_diffmech(env, actions: torch.Tensor, grad: bool) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``actions.shape[0]`` steps of ``env`` from its seed-0 reset, with
    a graph and ``backward()`` of the summed reward to the actions (``grad``), or under ``no_grad``."""
    env.reset(seed=0)
    t0, c0 = time.perf_counter(), time.process_time()
    if grad:
        a = actions.clone().requires_grad_(True)
        total = a.new_zeros(())
        for k in range(a.shape[0]):
            total = total + env.step(a[k]).reward.sum()
        total.backward()
        env.detach()
    else:
        with torch.no_grad():
            for k in range(actions.shape[0]):
                env.step(actions[k])
    return time.perf_counter() - t0, time.process_time() - c0


def gymnasium_env(gym_id: str, batch: int):
    """gymnasium's own environment ``gym_id`` (one, or a ``SyncVectorEnv`` of ``batch``)."""
    import gymnasium

    if batch == 1:
        return gymnasium.make(gym_id)
    return gymnasium.make_vec(gym_id, num_envs=batch, vectorization_mode="sync")


def time_gymnasium(genv, actions: np.ndarray) -> tuple[float, float]:
    """Wall-clock and CPU seconds of ``actions.shape[0]`` steps of ``genv`` (``actions (T, B, act_dim)``)."""
    genv.reset(seed=0)
    vector = hasattr(genv, "num_envs")
    t0, c0 = time.perf_counter(), time.process_time()
    for k in range(actions.shape[0]):
        if vector:
            genv.step(actions[k])
        else:
            _, _, term, trunc, _ = genv.step(actions[k, 0])
            if term or trunc:
                genv.reset()
    return time.perf_counter() - t0, time.process_time() - c0


def mjx_status() -> dict:
    """Whether ``mujoco.mjx`` imports here (it needs JAX), and why not."""
    try:
        import mujoco.mjx  # noqa: F401
    except Exception as e:  # noqa: BLE001 - any failure means "not usable here"; the message says which
        return {"available": False, "reason": f"{type(e).__name__}: {e}"}
    return {"available": True, "reason": ""}


def measure(task: str, batch: int, steps: int, repeats: int, with_gym: bool = True) -> dict:
    """One cell: steps per second (wall and CPU) of each variant, medians of ``repeats`` interleaved runs."""
    from diffmech.rl import make

    env = make(task, batch, seed=0)
    actions = random_actions(env, steps, batch, seed=batch)
    kinds = {"grad": lambda: time_diffmech(env, actions, True),
             "nograd": lambda: time_diffmech(env, actions, False)}
    gym_id = type(env).gym_id
    if with_gym:
        genv = gymnasium_env(gym_id, batch)
        acts = actions.numpy()
        kinds["gym"] = lambda: time_gymnasium(genv, acts)
    # warm-up: two steps of each (first-call costs: kernels, lazy imports, gymnasium's model load)
    warm = random_actions(env, 2, batch, seed=batch + 1)
    time_diffmech(env, warm, True)
    time_diffmech(env, warm, False)
    if with_gym:
        time_gymnasium(genv, warm.numpy())
    times: dict[str, list[float]] = {k: [] for k in kinds}
    cpu: dict[str, list[float]] = {k: [] for k in kinds}
    for _ in range(repeats):
        for k, f in kinds.items():
            w, c = f()
            times[k].append(w)
            cpu[k].append(c)
    cell = {"task": task, "gym_id": gym_id, "batch": batch, "steps": steps, "frame_skip": env.frame_skip,
            "sim_dt": env.sim_dt, "nq": env.robot.nq, "nv": env.robot.nv, "act_dim": env.act_dim}
    for k in kinds:
        cell[f"{k}_s"], cell[f"{k}_all_s"] = statistics.median(times[k]), times[k]
        cell[f"{k}_cpu_s"], cell[f"{k}_cpu_all_s"] = statistics.median(cpu[k]), cpu[k]
        cell[f"{k}_steps_per_s"] = batch * steps / cell[f"{k}_s"]
        cell[f"{k}_steps_per_cpu_s"] = batch * steps / max(cell[f"{k}_cpu_s"], 1e-9)
    cell["grad_over_nograd_time"] = cell["grad_s"] / cell["nograd_s"]
    if with_gym:
        cell["gym_over_grad"] = cell["gym_steps_per_s"] / cell["grad_steps_per_s"]
        cell["gym_over_nograd"] = cell["gym_steps_per_s"] / cell["nograd_steps_per_s"]
        cell["gym_over_grad_cpu"] = cell["gym_steps_per_cpu_s"] / cell["grad_steps_per_cpu_s"]
        genv.close()
    return cell


def _rate(x: float | None) -> str:
    return "-" if x is None else (f"{x:,.0f}" if x >= 100 else f"{x:.3g}")


def _ratio(x: float | None) -> str:
    return "-" if x is None else (f"{x:,.0f}x" if x >= 100 else f"{x:.3g}x")


def markdown(rep: dict) -> str:
    mc = rep["machine"]
    args = (" " + rep["args"].strip()) if rep.get("args", "").strip() else ""
    lines = [MARK_START, "## gymnasium's MuJoCo tasks (`diffmech.rl.make`): steps per second with gradients", "",
             f"_Generated by `python benchmarks/bench_gym_tasks.py{args}` on {mc['date']} ({rep['wall_s']:.0f} s); "
             f"{mc['cpu']}, {mc['cores']} cores shared with other jobs, torch {mc['torch']}, MuJoCo {mc['mujoco']}, "
             f"gymnasium {mc['gymnasium']}, `torch.set_num_threads({mc['threads']})`, Python {mc['python']}, "
             f"commit {mc['commit']}; load average (1 min) at the start {rep['load_before'][0]:.1f}, at the end "
             f"{rep['load_after'][0]:.1f}._", "",
             *([f"_Note: {rep['note']}_", ""] if rep.get("note") else []),
             f"Environment steps per second (environments x steps / time) of `diffmech.rl.make(name, num_envs=N)` "
             f"(gymnasium's XML, `Scene(solver=\"mujoco\")`, float64, CPU) over {rep['steps']} steps (a SHAC window) "
             "of random actions from a seed-0 reset: *with gradients* = the steps with a graph plus `backward()` of "
             "the summed reward to every action; *no graph* = the same steps under `torch.no_grad()`. gymnasium: "
             "its own environment (`gymnasium.make`, a `SyncVectorEnv` of N for N > 1), the same number of steps, "
             "MuJoCo's C step, no gradients. One environment step is `frame_skip` simulator steps. Medians of "
             f"{rep['repeats']} interleaved repeats after a warm-up (the JSON keeps every repeat).", "",
             "| task | envs | frame skip | diffmech with gradients (steps/s) | diffmech no graph (steps/s) | "
             "gymnasium (steps/s) | gymnasium / diffmech with gradients | gymnasium / diffmech no graph | "
             "with gradients / no graph (time) | per CPU-second: gymnasium / with gradients |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for c in rep["cells"]:
        lines.append(f"| {c['gym_id']} | {c['batch']} | {c['frame_skip']} | {_rate(c['grad_steps_per_s'])} | "
                     f"{_rate(c['nograd_steps_per_s'])} | {_rate(c.get('gym_steps_per_s'))} | "
                     f"{_ratio(c.get('gym_over_grad'))} | {_ratio(c.get('gym_over_nograd'))} | "
                     f"{c['grad_over_nograd_time']:.2f} | {_ratio(c.get('gym_over_grad_cpu'))} |")
    lines.append("")
    big = rep.get("big")
    if big:
        lines.append(f"4096 environments: {big['steps']} steps each, {big['repeats']} repeat(s), without gymnasium "
                     "(a `SyncVectorEnv` of 4096 Python environments was not timed).")
    else:
        widest = [c for c in rep["cells"] if c["batch"] == max(x["batch"] for x in rep["cells"])]
        est = ", ".join(f"{c['gym_id']} {4096 * rep['steps'] / c['grad_steps_per_s'] / 60:.0f} min"
                        for c in widest)
        lines.append(f"4096 environments: not run in this recording (`--big` runs them with `--big-steps` steps): "
                     f"at the {widest[0]['batch']}-environment rates with gradients above, one {rep['steps']}-step "
                     f"window of 4096 would take about {est} (if the rate per environment held), beyond this "
                     "run's budget on the shared 2 cores.")
    mjx = rep["mjx"]
    lines.append("")
    lines.append("MJX: " + ("`mujoco.mjx` imports here but was not timed by this script (no JAX accelerator "
                            "configured)." if mjx["available"] else
                            f"not measured: `import mujoco.mjx` fails here ({mjx['reason']}); MJX is the separate "
                            "`mujoco-mjx` package and needs JAX, and neither is installed in the project's "
                            "environment, so there is no MJX column."))
    lines.append("")
    lines.append("What the ratios say: gymnasium's step is MuJoCo's C loop, one call per environment; diffmech's "
                 "is Python and torch on batched tensors (contact detection over every geom pair, constraint rows, "
                 "a Newton solve per substep), so one environment pays the dispatch of every torch call, which a "
                 "batch of 64 shares. diffmech alone computes the gradient of the window's return with respect to "
                 "every action; gymnasium computes none.")
    lines.append(MARK_END)
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    replace_section(path, section, MARK_START, MARK_END)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="Hopper, 1 and 4 environments, 2 steps; writes nothing")
    ap.add_argument("--tasks", default=",".join(TASKS), help="comma-separated task names (default %(default)s)")
    ap.add_argument("--batches", default="1,64", help="comma-separated numbers of environments (default %(default)s)")
    ap.add_argument("--steps", type=int, default=16, help="steps per window (default %(default)s)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--big", action="store_true", help="also 4096 environments (--big-steps steps, one repeat)")
    ap.add_argument("--big-steps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default %(default)s)")
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/gym_tasks.json)")
    ap.add_argument("--markdown", default=None, help="markdown file to update (default BENCHMARKS.md); 'none' skips")
    ap.add_argument("--note", default=None, help="a sentence about the run's conditions, printed in the section")
    ap.add_argument("--from-json", default=None, metavar="JSON", help="only re-render the markdown from a results file")
    args = ap.parse_args(argv)
    md = args.markdown or ("none" if args.quick else os.path.join(ROOT, "BENCHMARKS.md"))
    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        update_markdown(md if md != "none" else os.path.join(ROOT, "BENCHMARKS.md"), markdown(rep))
        return rep
    import gymnasium
    import mujoco

    t_start, load_before = time.perf_counter(), os.getloadavg()
    torch.set_num_threads(args.threads)
    tasks = ["hopper-v5"] if args.quick else args.tasks.split(",")
    batches = [1, 4] if args.quick else [int(x) for x in args.batches.split(",")]
    steps = 2 if args.quick else args.steps
    repeats = 1 if args.quick else args.repeats
    rep: dict = {"steps": steps, "repeats": repeats, "mjx": mjx_status(), "cells": [], "note": args.note}
    for task in tasks:
        for b in batches:
            c = measure(task, b, steps, repeats)
            rep["cells"].append(c)
            print(f"{c['gym_id']:>16s} x{b:<5d} grad {_rate(c['grad_steps_per_s']):>8s}  nograd "
                  f"{_rate(c['nograd_steps_per_s']):>8s}  gymnasium {_rate(c['gym_steps_per_s']):>8s}  "
                  f"ratio {_ratio(c['gym_over_grad'])} / {_ratio(c['gym_over_nograd'])}", flush=True)
    if args.big and not args.quick:
        rep["big"] = {"steps": args.big_steps, "repeats": 1, "with_gym": False}
        for task in tasks:
            c = measure(task, 4096, args.big_steps, 1, with_gym=False)
            rep["cells"].append(c)
            print(f"{c['gym_id']:>16s} x4096  grad {_rate(c['grad_steps_per_s']):>8s}  nograd "
                  f"{_rate(c['nograd_steps_per_s']):>8s}", flush=True)
    rep["machine"] = _machine.machine(ROOT, args.threads, ["src"], mujoco=mujoco.__version__,
                                      gymnasium=gymnasium.__version__)
    json_path = args.json or (None if args.quick else os.path.join(HERE, "results", "gym_tasks.json"))
    if json_path == "none":
        json_path = None
    stamp(rep, argv=argv, json_path=json_path, root=ROOT, load_before=load_before, t_start=t_start)
    if json_path:
        os.makedirs(os.path.dirname(os.path.abspath(json_path)), exist_ok=True)
        with open(json_path, "w") as f:
            json.dump(rep, f, indent=1)
    if md != "none":
        update_markdown(md, markdown(rep))
    return rep


if __name__ == "__main__":
    main()
