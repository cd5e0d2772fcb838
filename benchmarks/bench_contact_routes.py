"""The contact rollout's routes: what learnable robot parameters and a policy cost on the native route,
against the same rollout with fixed parameters under a torque sequence, and against the torch route;
and what the contact solve's Newton iterations cost.

Scene: ``scenes.laikago(1)`` standing (zero torque), 200 steps of 1 ms, loss the chassis height at the
end, forward + backward (``torch.autograd.grad`` w.r.t. the torques and every learnable tensor), one
thread. Rows:

* ``fixed``: torques only (the reference of the ratios);
* ``masses``: every link mass learnable (``make_link_param_learnable(link, "mass")``), gradients
  w.r.t. them too;
* ``policy``: an MLP policy (state -> 12 joint torques, 64 hidden units, tanh), gradients w.r.t. its
  weights; batch 1 and 16;
* each on the native route (``DIFFMECH_NATIVE`` auto, kernels built first) and the torch route
  (``native_mode("never")``);
* the Ant (:class:`diffmech.rl.Ant`, 1 and 64 environments): a SHAC window of 16 environment steps
  and its backward pass with an MLP policy, with a fixed action sequence, and gymnasium's MuJoCo
  ``Ant-v5`` stepping the same environments without gradients (in a loop);
* ``sweeps only``: the forward rollout with the solve's Newton iterations switched off
  (``NEWTON_ITERATIONS = 0``; its impulses then break the contact conditions on most of these steps),
  against the default forward: the Newton iterations' share of the time.

Timing: rounds of adjacent blocks, one per variant, the ratio of each round's times; the median over
rounds (and the lowest and highest round) -- both sides of a ratio measured seconds apart.

    python benchmarks/bench_contact_routes.py              # about 3 minutes after the kernels (first run: +2 min)
    python benchmarks/bench_contact_routes.py --rounds 3 --no-write
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
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import _machine  # noqa: E402
from _markdown import replace_section  # noqa: E402
from diffmech.dynamics import kernels  # noqa: E402
from diffmech.sim import prepare_ground_kernels, rollout, scenes  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact_routes:start -->", "<!-- bench_contact_routes:end -->"
T, DT = 200, 1e-3
F64 = torch.float64


def _setup(kind: str, batch: int):
    scene, q0, v0 = scenes.laikago(1)
    robot = scene.models["laikago0"]
    params = []
    policy = None
    if kind == "masses":
        for link in robot.link_names:
            if float(robot.link_params(link).mass) > 0:
                robot.make_link_param_learnable(link, "mass")
        params = [p for p in robot.parameters() if p.requires_grad]
    if kind == "policy":
        torch.manual_seed(0)
        net = torch.nn.Sequential(torch.nn.Linear(scene.nq + scene.nv, 64), torch.nn.Tanh(),
                                  torch.nn.Linear(64, 12)).to(F64)

        def policy(t, q, v):
            u = net(torch.cat([q, v], -1))
            return torch.cat([torch.zeros_like(u[..., :6]), u], -1)

        params = list(net.parameters())
    q0 = q0.expand(batch, -1).clone()
    tau = torch.zeros(batch, T, scene.nv, dtype=F64, requires_grad=policy is None)
    return scene, q0, v0, tau, policy, params


def _once(setup, forward_only: bool = False) -> tuple[float, dict]:
    scene, q0, v0, tau, policy, params = setup
    stats: dict = {}
    t0 = time.perf_counter()
    if forward_only:
        with torch.no_grad():
            rollout(scene, q0, v0, tau, DT, stats=stats)
        return time.perf_counter() - t0, stats
    if policy is None:
        Q, _ = rollout(scene, q0, v0, tau, DT, stats=stats)
        wrt = [tau, *params]
    else:
        Q, _ = rollout(scene, q0, v0, policy, DT, steps=T, params=params, stats=stats)
        wrt = params
    torch.autograd.grad(Q[:, -1, 2].sum(), wrt)
    return time.perf_counter() - t0, stats


def _rounds(variants: dict, rounds: int) -> dict:
    """``{name: [seconds per round]}``: each round times every variant once, in a rotating order."""
    names = list(variants)
    out: dict = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            fn = variants[n]
            out[n].append(fn())
    return out


def _ant_window(batch: int, steps: int, policy: bool, rounds: int) -> dict:
    """SHAC's unit of work on :class:`diffmech.rl.Ant`: ``steps`` environment steps from the current states
    and the backward pass of their summed reward, by an MLP policy (observation -> 8 actions, 64 hidden
    units, tanh) or a fixed action sequence that requires grad; seconds per window, per round."""
    from diffmech.rl import Ant

    env = Ant(batch, seed=0)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(env.obs_dim, 64), torch.nn.Tanh(),
                              torch.nn.Linear(64, env.act_dim)).to(F64)
    acts = (0.5 * torch.randn(steps, batch, env.act_dim, dtype=F64)).requires_grad_()
    obs = env.reset()
    out = []
    routes = set()
    for r in range(rounds + 1):  # the first: warm-up (kernels loaded, steppers made)
        t0 = time.perf_counter()
        total = 0.0
        for k in range(steps):
            a = torch.tanh(net(obs)) if policy else acts[k]
            res = env.step(a)
            total = total + res.reward.sum()
            obs = res.obs
        total.backward()
        env.q, env.v = env.q.detach(), env.v.detach()  # SHAC: the next window starts from detached states
        obs = obs.detach()
        if r:
            out.append(time.perf_counter() - t0)
        info: dict = {}
        from diffmech.sim import contact_step

        with torch.no_grad():
            contact_step(env.scene, env.q, env.v, torch.zeros(batch, env.scene.nv, dtype=F64), env.sim_dt, info=info)
        routes.add(info["route"])
    return {"seconds": out, "route": sorted(routes)}


def _gymnasium_ant(batch: int, steps: int, rounds: int) -> list[float] | None:
    """Seconds of ``steps`` steps of gymnasium's own ``Ant-v5`` (``batch`` environments in a loop, no
    gradients), per round; ``None`` where it does not import."""
    try:
        import gymnasium
        import numpy as np
    except ImportError:
        return None
    try:
        envs = [gymnasium.make("Ant-v5") for _ in range(batch)]
    except Exception as e:  # noqa: BLE001 - gymnasium's MuJoCo environments need mujoco and imageio
        print(f"gymnasium Ant-v5 unavailable: {e}", flush=True)
        return None
    rng = np.random.default_rng(0)
    for i, e in enumerate(envs):
        e.reset(seed=i)
    out = []
    for r in range(rounds + 1):
        acts = rng.uniform(-1, 1, (steps, batch, 8))
        t0 = time.perf_counter()
        for k in range(steps):
            for i, e in enumerate(envs):
                _, _, term, trunc, _ = e.step(acts[k, i])
                if term or trunc:
                    e.reset()
        if r:
            out.append(time.perf_counter() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--ant-batches", default="1,64", help="Ant environments (default %(default)s); '' skips")
    ap.add_argument("--window", type=int, default=16, help="SHAC window of the Ant rows (default %(default)s)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_build = time.perf_counter()
    scene, _, _ = scenes.laikago(1)
    prepare_ground_kernels(scene, parameters=True)
    print(f"kernels ready in {time.perf_counter() - t_build:.0f} s", flush=True)

    results: dict = {"machine": _machine.machine(ROOT, 1, ["src", "benchmarks"]), "steps": T, "dt": DT, "rows": []}
    pgs_module = importlib.import_module("diffmech.contact.pgs")
    rollout_module = importlib.import_module("diffmech.sim._ground_rollout")

    # native route: fixed, masses, policy (batch 1 and 16)
    cases = [("fixed", 1), ("masses", 1), ("policy", 1), ("fixed", 16), ("policy", 16)]
    setups = {c: _setup(*c) for c in cases}
    routes = {}
    for c, s in setups.items():  # warm: kernels loaded, routes recorded
        with kernels.native_mode("auto"):
            routes[c] = _once(s)[1]["route"]

    def timed(c, mode):
        def fn():
            with kernels.native_mode(mode):
                return _once(setups[c])[0]
        return fn

    native = _rounds({c: timed(c, "auto") for c in cases}, args.rounds)
    torch_route = _rounds({c: timed(c, "never") for c in (("fixed", 1), ("masses", 1), ("policy", 1))},
                          max(1, args.rounds // 2))

    def ratio(a, b):
        rs = [x / y for x, y in zip(a, b)]
        return statistics.median(rs), min(rs), max(rs)

    for c in cases:
        ref = native[("fixed", c[1])]
        med, lo, hi = ratio(native[c], ref)
        row = {"case": c[0], "batch": c[1], "route": routes[c], "ms_per_step": 1e3 * statistics.median(native[c]) / T,
               "ratio_to_fixed": med, "ratio_rounds": [lo, hi]}
        if c in torch_route:
            n = len(torch_route[c])
            tr = ratio(torch_route[c], native[c][:n])
            row.update(torch_ms_per_step=1e3 * statistics.median(torch_route[c]) / T, torch_over_native=tr[0])
        results["rows"].append(row)
        print(row, flush=True)

    # the Newton iterations' share of the forward rollout (fixed, batch 1)
    s = setups[("fixed", 1)]

    def forward(newton):
        def fn():
            old = rollout_module.NEWTON_ITERATIONS
            rollout_module.NEWTON_ITERATIONS = newton
            try:
                with kernels.native_mode("auto"):
                    return _once(s, forward_only=True)
            finally:
                rollout_module.NEWTON_ITERATIONS = old
        return fn

    fw = _rounds({"newton": lambda: forward(pgs_module.NEWTON_ITERATIONS)()[0], "sweeps": lambda: forward(0)()[0]},
                 args.rounds)
    _, st_sweeps = forward(0)()
    _, st_newton = forward(pgs_module.NEWTON_ITERATIONS)()
    med, lo, hi = ratio(fw["newton"], fw["sweeps"])
    results["newton"] = {"forward_ms_per_step": 1e3 * statistics.median(fw["newton"]) / T,
                         "sweeps_only_ms_per_step": 1e3 * statistics.median(fw["sweeps"]) / T,
                         "ratio": med, "ratio_rounds": [lo, hi],
                         "sweeps_only_unconverged_steps": st_sweeps["contact_unconverged"],
                         "sweeps_only_violation_max": st_sweeps["contact_violation_max"],
                         "newton_unconverged_steps": st_newton["contact_unconverged"],
                         "newton_violation_max": st_newton["contact_violation_max"],
                         "newton_iterations_max": st_newton["contact_newton_max"]}
    print(results["newton"], flush=True)

    # the Ant: an MLP policy's window and its backward, a fixed action sequence's, gymnasium's Ant-v5 stepping
    results["ant"] = []
    for batch in [int(x) for x in args.ant_batches.split(",") if x]:
        from diffmech.rl import Ant

        with kernels.native_mode("build"):  # the Ant's kernels, once per machine (minutes)
            Ant(batch, seed=0)
        pol = _ant_window(batch, args.window, True, args.rounds)
        fixed = _ant_window(batch, args.window, False, args.rounds)
        gym = _gymnasium_ant(batch, args.window, args.rounds)
        n = args.window * batch
        row = {"batch": batch, "window": args.window, "route": pol["route"],
               "policy_ms_per_env_step": 1e3 * statistics.median(pol["seconds"]) / n,
               "fixed_ms_per_env_step": 1e3 * statistics.median(fixed["seconds"]) / n,
               "policy_over_fixed": ratio(pol["seconds"], fixed["seconds"])}
        if gym is not None:
            row["gymnasium_ms_per_env_step"] = 1e3 * statistics.median(gym) / n
            row["policy_over_gymnasium"] = ratio(pol["seconds"], gym)
        results["ant"].append(row)
        print(row, flush=True)

    lines = [MARK_START, "", f"`python benchmarks/bench_contact_routes.py` ({results['machine']['cpu']}, 1 thread, "
             f"commit {results['machine'].get('commit', '')}). Laikago standing, {T} steps of {DT * 1e3:g} ms, "
             "forward + backward; ratios from rounds of adjacent blocks (median, lowest-highest round).", "",
             "| case | batch | route | ms / step | x fixed (same batch) | torch route ms / step | torch / native |",
             "|---|---|---|---|---|---|---|"]
    for r in results["rows"]:
        lines.append(f"| {r['case']} | {r['batch']} | {r['route']} | {r['ms_per_step']:.3f} | "
                     f"{r['ratio_to_fixed']:.2f} ({r['ratio_rounds'][0]:.2f}-{r['ratio_rounds'][1]:.2f}) | "
                     + (f"{r['torch_ms_per_step']:.2f} | {r['torch_over_native']:.1f}" if "torch_ms_per_step" in r
                        else "- | -") + " |")
    n = results["newton"]
    lines += ["", f"Forward alone: {n['forward_ms_per_step']:.3f} ms / step with the Newton iterations, "
              f"{n['sweeps_only_ms_per_step']:.3f} without ({n['ratio']:.2f}x, rounds {n['ratio_rounds'][0]:.2f}-"
              f"{n['ratio_rounds'][1]:.2f}). Without them {n['sweeps_only_unconverged_steps']} of {T} steps stop short "
              f"(contact conditions violated by up to {n['sweeps_only_violation_max']:.2g} m/s); with them "
              f"{n['newton_unconverged_steps']} (at most {n['newton_iterations_max']} iterations, violation "
              f"{n['newton_violation_max']:.2g} m/s).", ""]
    if results["ant"]:
        lines += [f"`diffmech.rl.Ant`: a window of {args.window} environment steps and its backward "
                  "pass (SHAC's unit), an MLP policy (64 tanh units) against a fixed action sequence, and "
                  "gymnasium's `Ant-v5` stepping the same number of environments in a loop without gradients; "
                  "ms per environment step.", "",
                  "| Ants | route | policy | fixed actions | policy / fixed | gymnasium Ant-v5 | policy / gymnasium |",
                  "|---|---|---|---|---|---|---|"]
        for r in results["ant"]:
            pf, pg = r["policy_over_fixed"], r.get("policy_over_gymnasium")
            lines.append(f"| {r['batch']} | {', '.join(r['route'])} | {r['policy_ms_per_env_step']:.3f} | "
                         f"{r['fixed_ms_per_env_step']:.3f} | {pf[0]:.2f} ({pf[1]:.2f}-{pf[2]:.2f}) | "
                         + (f"{r['gymnasium_ms_per_env_step']:.3f} | {pg[0]:.1f} ({pg[1]:.1f}-{pg[2]:.1f})"
                            if pg else "- | -") + " |")
        lines.append("")
    lines.append(MARK_END)
    print("\n".join(lines))
    if not args.no_write:
        with open(os.path.join(ROOT, "benchmarks", "results", "contact_routes.json"), "w") as f:
            json.dump(results, f, indent=1)
        replace_section(os.path.join(ROOT, "BENCHMARKS.md"), "\n".join(lines), MARK_START, MARK_END,
                        "## Contact rollout routes: learnable parameters, policies, the solve's Newton iterations")


if __name__ == "__main__":
    main()
