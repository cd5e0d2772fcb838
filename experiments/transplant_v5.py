"""Transplant (the seed's Table 5) on gymnasium's v5 tasks: train SHAC in diffmech, evaluate in gymnasium.

For each task (``hopper-v5``, ``halfcheetah-v5``, ``ant-v5`` by default) this

1. trains SHAC in diffmech (:func:`diffmech.rl.train.train`, ``diffmech.rl.make``'s environment:
   the task built from gymnasium's own XML, stepped by ``Scene(solver="mujoco")``) for a small budget
   of wall-clock time (``--max-wall`` seconds, evaluations excluded);
2. draws ``--episodes`` start states with diffmech's reset noise and runs the trained deterministic
   policy from each of them for at most ``--horizon`` steps in diffmech and in gymnasium's own
   environment (``gymnasium.make(ID)``, ``reset`` then ``unwrapped.set_state`` to the same MuJoCo
   ``qpos``/``qvel``), without retraining;
3. does the same with a uniformly random policy whose action sequence per episode is drawn once and
   replayed in both simulators.

Writes ``<out>/<task>.json`` per task (returns per episode, episode lengths, the ratio
gymnasium / diffmech of the mean returns, the first observations' largest difference, the run's
training metrics) and ``<out>/summary.json``. ``--quick`` trains for a few seconds on short episodes
(a smoke test of the pipeline, not a result).

    python experiments/transplant_v5.py                       # all three, ~10 min of training each
    python experiments/transplant_v5.py --tasks hopper-v5 --max-wall 300
    python experiments/transplant_v5.py --quick --out /tmp/tv5
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

TASKS = ("hopper-v5", "halfcheetah-v5", "ant-v5")
# SHAC settings per task. Small batches because one step costs tens of milliseconds per environment on
# a CPU core here; Ant's window of 4 steps follows train.TASK_DEFAULTS["ant"] (longer windows' gradients
# grow through the contacts and did not learn on the code-built Ant).
SHAC_SETTINGS = {"hopper-v5": {"num_envs": 8, "horizon": 8},
                 "halfcheetah-v5": {"num_envs": 8, "horizon": 8},
                 "ant-v5": {"num_envs": 8, "horizon": 4}}
HERE = Path(__file__).resolve().parent


def run_diffmech(env, policy, q0, v0, actions=None):
    """Returns and lengths ``(E,)`` of one episode per environment of ``env`` (``E = env.num_envs``)
    from the diffmech states ``q0``, ``v0``, stopping each at its termination or ``env.horizon``;
    ``policy(obs) -> action``, or ``actions (T, E, act_dim)`` replayed."""
    E = env.num_envs
    env.set_state(q0.clone(), v0.clone(), torch.zeros(E, dtype=torch.long))
    obs = env.obs
    obs0 = obs.clone()
    total = torch.zeros(E, dtype=env.dtype)
    length = torch.zeros(E, dtype=torch.long)
    running = torch.ones(E, dtype=torch.bool)
    with torch.no_grad():
        for t in range(env.horizon):
            a = policy(obs) if actions is None else torch.as_tensor(actions[t], dtype=env.dtype)
            res = env.step(a)
            total += torch.where(running, res.reward, torch.zeros_like(res.reward))
            length += running.long()
            running &= ~(res.terminated | res.truncated)
            obs = res.obs
            if not bool(running.any()):
                break
    return total.numpy(), length.numpy(), obs0.numpy()


def run_gymnasium(name: str, policy, qpos0, qvel0, horizon: int, actions=None):
    """The same episodes in gymnasium's environment ``name`` from MuJoCo states ``qpos0 (E, nq)``,
    ``qvel0 (E, nv)``; ``policy`` takes and returns NumPy arrays ``(obs_dim,)`` -> ``(act_dim,)``."""
    import gymnasium

    env = gymnasium.make(name, max_episode_steps=horizon)
    rets, lens, obs0s = [], [], []
    for e in range(qpos0.shape[0]):
        env.reset(seed=e)
        env.unwrapped.set_state(qpos0[e], qvel0[e])
        obs = env.unwrapped._get_obs()
        obs0s.append(obs.copy())
        total, n = 0.0, 0
        for t in range(horizon):
            a = policy(obs) if actions is None else actions[t, e]
            obs, r, term, trunc, _ = env.step(np.asarray(a, dtype=np.float64))
            total, n = total + float(r), n + 1
            if term or trunc:
                break
        rets.append(total)
        lens.append(n)
    env.close()
    return np.array(rets), np.array(lens), np.stack(obs0s)


def _stats(x) -> dict:
    x = np.asarray(x, dtype=float)
    return {"mean": float(x.mean()), "std": float(x.std()), "per_episode": x.tolist()}


def transplant_task(task: str, run: Path, *, episodes: int, horizon: int, seed: int, which: str = "best",
                    diffmech: bool = True) -> dict:
    """Evaluate the SHAC run in folder ``run`` (trained on ``task``) in diffmech (unless not ``diffmech``)
    and in gymnasium."""
    from diffmech.rl.tasks import make
    from diffmech.rl.train import _load_policy

    config = json.loads((run / "config.json").read_text())
    env = make(task, episodes, seed=seed + 20_000, horizon=horizon)
    policy_t = _load_policy(run, config, env, which)
    q0, v0 = env.initial_state(episodes)
    qpos0, qvel0 = (x.detach().numpy() for x in env.mujoco_state(q0, v0))
    rng = np.random.default_rng(seed)
    lo, hi = env.action_low.numpy(), env.action_high.numpy()
    actions = rng.uniform(lo, hi, size=(horizon, episodes, env.act_dim))

    def policy_np(obs):
        with torch.no_grad():
            return policy_t(torch.as_tensor(obs, dtype=env.dtype)[None])[0].numpy()

    name = type(env).gym_id
    out: dict = {"task": task, "gym_id": name, "episodes": episodes, "horizon": horizon, "policy": which,
                 "run": str(run), "start_seed": seed + 20_000}
    t0 = time.perf_counter()
    if diffmech:
        d_ret, d_len, d_obs0 = run_diffmech(env, policy_t, q0, v0)
        dr_ret, dr_len, _ = run_diffmech(env, None, q0, v0, actions)
    t1 = time.perf_counter()
    g_ret, g_len, g_obs0 = run_gymnasium(name, policy_np, qpos0, qvel0, horizon)
    gr_ret, gr_len, _ = run_gymnasium(name, None, qpos0, qvel0, horizon, actions)
    # MuJoCo's own sensitivity: gymnasium again from starts shifted by 1e-14 m (or rad) in every qpos
    # entry, the size of the difference between diffmech's step and mj_step
    gp_ret, _, _ = run_gymnasium(name, policy_np, qpos0 + 1e-14, qvel0, horizon)
    gpr_ret, _, _ = run_gymnasium(name, None, qpos0 + 1e-14, qvel0, horizon, actions)
    t2 = time.perf_counter()
    out.update({
        "gymnasium_policy_return": _stats(g_ret), "gymnasium_policy_steps": g_len.tolist(),
        "gymnasium_random_return": _stats(gr_ret), "gymnasium_random_steps": gr_len.tolist(),
        "gymnasium_shifted_start_policy_return": _stats(gp_ret),
        "gymnasium_shifted_start_random_return": _stats(gpr_ret),
        "gymnasium_wall_s": round(t2 - t1, 2)})
    if diffmech:
        out.update({
            "diffmech_policy_return": _stats(d_ret), "diffmech_policy_steps": d_len.tolist(),
            "diffmech_random_return": _stats(dr_ret), "diffmech_random_steps": dr_len.tolist(),
            "ratio_policy_gymnasium_over_diffmech": float(g_ret.mean() / d_ret.mean()),
            "ratio_random_gymnasium_over_diffmech": float(gr_ret.mean() / dr_ret.mean()),
            # the two simulators observe the same start state the same way (a check of the plumbing)
            "max_abs_obs0_difference": float(np.abs(d_obs0 - g_obs0).max()),
            "diffmech_wall_s": round(t1 - t0, 2)})
    metrics = run / "metrics.json"
    if metrics.exists():
        out["training"] = json.loads(metrics.read_text())
        out["training_config"] = {k: config[k] for k in ("steps", "seed", "max_wall_s", "env_kwargs")}
        out["training_config"]["shac"] = {k: config["algo_config"][k] for k in ("num_envs", "horizon", "actor_lr")}
    return out


def divergence(task: str, *, episodes: int, horizon: int, seed: int) -> list[float]:
    """Largest ``|qpos|`` difference (m or rad) between diffmech and gymnasium's MuJoCo after each of
    ``horizon`` steps of the replayed random actions from the transplant's start states (no
    termination: ``frame_skip`` substeps per step in both, ``MujocoEnv.do_simulation`` on gymnasium's side)."""
    import gymnasium

    from diffmech.rl.tasks import make

    env = make(task, episodes, seed=seed + 20_000, horizon=horizon)
    q, v = env.initial_state(episodes)
    qpos0, qvel0 = (x.numpy() for x in env.mujoco_state(q, v))
    rng = np.random.default_rng(seed)
    acts = rng.uniform(env.action_low.numpy(), env.action_high.numpy(), size=(horizon, episodes, env.act_dim))
    gyms = [gymnasium.make(type(env).gym_id).unwrapped for _ in range(episodes)]
    for e, g in enumerate(gyms):
        g.reset(seed=e)
        g.set_state(qpos0[e], qvel0[e])
    out = []
    with torch.no_grad():
        for t in range(horizon):
            q, v = env.simulate(q, v, torch.as_tensor(acts[t], dtype=env.dtype))
            qpos = env.mujoco_state(q, v)[0].numpy()
            for e, g in enumerate(gyms):
                g.do_simulation(acts[t, e], g.frame_skip)
            out.append(max(float(np.abs(qpos[e] - g.data.qpos).max()) for e, g in enumerate(gyms)))
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tasks", nargs="+", default=list(TASKS), choices=TASKS)
    p.add_argument("--max-wall", type=float, default=600.0, help="training seconds per task (evaluations excluded)")
    p.add_argument("--steps", type=int, default=1_000_000, help="environment-step cap of the training")
    p.add_argument("--train-horizon", type=int, default=200, help="episode length during training")
    p.add_argument("--horizon", type=int, default=200, help="episode length of the transplant evaluation")
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--evaluations", type=int, default=4, help="evaluations during training (picks 'best')")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--runs", default="/tmp/transplant_v5_runs", help="folder of the training runs")
    p.add_argument("--out", default=str(HERE / "rl" / "transplant_v5"), help="folder of the results JSON")
    p.add_argument("--skip-train", action="store_true", help="evaluate existing runs in --runs")
    p.add_argument("--gym-only", action="store_true",
                   help="with --skip-train: rerun only the gymnasium episodes and update <out>/<task>.json's keys")
    p.add_argument("--divergence", action="store_true",
                   help="only add the per-step qpos difference of the random episodes to <out>/<task>.json")
    p.add_argument("--quick", action="store_true", help="seconds: a smoke test of the pipeline")
    a = p.parse_args(argv)
    if a.quick:
        a.max_wall, a.steps, a.train_horizon, a.horizon, a.episodes, a.evaluations = 1.0, 8, 5, 5, 2, 1
    from diffmech.rl.train import train

    out_dir, runs = Path(a.out), Path(a.runs)
    out_dir.mkdir(parents=True, exist_ok=True)
    summary = {}
    if a.divergence:
        for task in a.tasks:
            path = out_dir / f"{task}.json"
            res = json.loads(path.read_text())
            res["random_qpos_divergence"] = divergence(task, episodes=a.episodes, horizon=a.horizon, seed=a.seed)
            path.write_text(json.dumps(res, indent=1))
            print(task, [f"{x:.1e}" for x in res["random_qpos_divergence"][9::10]], flush=True)
        return summary
    for task in a.tasks:
        run = runs / task
        if not a.skip_train:
            settings = dict(SHAC_SETTINGS[task])
            if a.quick:
                settings = {"num_envs": 2, "horizon": 2}
            train(task, "shac", run, steps=a.steps, seed=a.seed, max_wall=a.max_wall, evaluations=a.evaluations,
                  eval_episodes=2, progress=False, overrides=settings, env_kwargs={"horizon": a.train_horizon})
        res = transplant_task(task, run, episodes=a.episodes, horizon=a.horizon, seed=a.seed,
                              diffmech=not a.gym_only)
        res["quick"] = a.quick
        if a.gym_only:  # keep the diffmech episodes of the earlier run (same starts and actions)
            old = json.loads((out_dir / f"{task}.json").read_text())
            if (old["episodes"], old["horizon"]) != (a.episodes, a.horizon):
                raise SystemExit(f"{task}: --episodes/--horizon differ from the recorded run's")
            res = {**old, **res}
            res["ratio_policy_gymnasium_over_diffmech"] = (res["gymnasium_policy_return"]["mean"]
                                                           / res["diffmech_policy_return"]["mean"])
            res["ratio_random_gymnasium_over_diffmech"] = (res["gymnasium_random_return"]["mean"]
                                                           / res["diffmech_random_return"]["mean"])
        (out_dir / f"{task}.json").write_text(json.dumps(res, indent=1))
        summary[task] = res
        ratio = res["ratio_policy_gymnasium_over_diffmech"]
        print(f"{task}: diffmech {res['diffmech_policy_return']['mean']:.1f}, gymnasium "
              f"{res['gymnasium_policy_return']['mean']:.1f} (ratio {ratio:.3f}); "
              f"random {res['diffmech_random_return']['mean']:.1f} / {res['gymnasium_random_return']['mean']:.1f}",
              flush=True)
    # summary of every task file present (tasks may be run in separate processes)
    table = {}
    for f in sorted(out_dir.glob("*-v5.json")):
        r = json.loads(f.read_text())
        table[r["task"]] = {k: (r[k]["mean"] if isinstance(r[k], dict) else r[k]) for k in (
            "diffmech_policy_return", "gymnasium_policy_return", "ratio_policy_gymnasium_over_diffmech",
            "gymnasium_shifted_start_policy_return", "diffmech_random_return", "gymnasium_random_return",
            "gymnasium_shifted_start_random_return", "max_abs_obs0_difference", "episodes", "horizon") if k in r}
        table[r["task"]]["env_steps_trained"] = r.get("training", {}).get("env_steps")
        table[r["task"]]["quick"] = r.get("quick")
    (out_dir / "summary.json").write_text(json.dumps(table, indent=1))
    return summary


if __name__ == "__main__":
    main()
