"""Training runs and their outputs: ``diffmech rl train`` and ``diffmech rl eval`` call these.

A run trains one algorithm on one task for a budget of environment steps, evaluating the
deterministic policy at regular intervals, and writes into its folder:

* ``config.json``: the task, the algorithm, its settings, the seed, versions;
* ``metrics.json``: ``max_return`` (best evaluation return), ``final_return`` (last evaluation),
  ``env_steps``, ``wall_s`` (training time, evaluations excluded), ``total_wall_s``, and for
  nlink-reach ``max_possible_return`` (``0.5 n^2`` by default) with ``max_return`` relative to it;
* ``curve.csv`` (rewritten after every evaluation, so a run in progress can be watched) and
  ``curve.png``: evaluation return against environment steps and against
  wall-clock training time;
* ``checkpoint.pt`` (diffmech's learners: their networks and settings) or ``model.zip``
  (stable-baselines3's SAC and PPO, on the gymnasium adapter), the final policy, and
  ``checkpoint_best.pt`` / ``model_best.zip``, the policy of the best evaluation.

``sac`` and ``ppo`` are stable-baselines3's, unchanged, on :class:`~diffmech.rl.gym_env.GymEnv`;
``policy-enhanced-sac``, ``sample-enhanced-sac`` and ``shac`` are diffmech's (:mod:`.sac`,
:mod:`.shac`) on the batched differentiable environment.
"""

from __future__ import annotations

import copy
import csv
import dataclasses
import json
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch
from torch import Tensor

from .. import _log
from .._progress import Stage
from ..errors import OptionError
from .env import DiffEnv, NLinkReach

__all__ = ["ALGOS", "ENVS", "GYM_ENVS", "DEFAULT_STEPS", "make_env", "evaluate", "train", "evaluate_run"]

log = _log.get("rl")

ALGOS = ("sac", "ppo", "policy-enhanced-sac", "sample-enhanced-sac", "shac")
# gymnasium's MuJoCo v5 tasks by lowercase name ("ant-v5", ...): diffmech.rl.make
GYM_ENVS = ("ant-v5", "halfcheetah-v5", "hopper-v5", "walker2d-v5", "humanoid-v5", "swimmer-v5", "reacher-v5",
            "invertedpendulum-v5", "inverteddoublependulum-v5")
ENVS = ("nlink-reach", "ant", *GYM_ENVS)
# Environment steps of a run when --steps is not given.
DEFAULT_STEPS = {"shac": 500_000, "ppo": 500_000, "sac": 50_000, "policy-enhanced-sac": 50_000,
                 "sample-enhanced-sac": 50_000}


# Settings that differ from an algorithm's defaults on a task (the user's --set wins). On nlink-reach
# SHAC's windows of 50 steps and learning rates of 5e-4 climbed steadily where the paper's 32 steps and
# 2e-3 oscillated (links=2, 200k steps; a whole-episode window, 100 steps, diverged).
# The task observes the elapsed time and scores where the episode ends, so the time limit is part of it:
# no value beyond it (bootstrap_truncation=False). With the critic's extrapolation there, links=3 (600k
# steps, seeds 0 and 1) reached best 4.47 and 3.51 of 4.5 and ended at NaN and 2.43; without, best 4.37
# and 4.44, final 4.08 and 4.33.
# On the Ant the gradient of a window's return grows with its length through the contacts: at SHAC's
# initial policy the actor gradient's norm is 1 to 2 for windows of 1 to 4 steps (one window of 4: 20), 3.5
# to 4.7 for 8 and 32 to 69 for 16 (experiments/rl/ant/gradient_growth.py), clipped to 1; windows of 16
# steps never learned to walk, windows of 4 did (EXPERIMENTS.md, "The Ant").
TASK_DEFAULTS = {("nlink-reach", "shac"): {"horizon": 50, "actor_lr": 5e-4, "critic_lr": 5e-4,
                                           "bootstrap_truncation": False},
                 ("ant", "shac"): {"horizon": 4}}


def make_env(name: str, num_envs: int = 1, *, links: int = 2, seed: int = 0, device=None, **kwargs) -> DiffEnv:
    """The batched differentiable environment of a task name (:data:`ENVS`)."""
    if name == "nlink-reach":
        return NLinkReach(links, num_envs=num_envs, seed=seed, device=device, **kwargs)
    if name == "ant":
        from .ant import Ant

        return Ant(num_envs, seed=seed, device=device, **kwargs)
    if name in GYM_ENVS:
        from .tasks import make

        return make(name, num_envs, seed=seed, device=device, **kwargs)
    raise OptionError(f"unknown task {name!r}; choose one of {ENVS}")


@torch.no_grad()
def evaluate(env: DiffEnv, policy: Callable[[Tensor], Tensor], *, record: bool = False):
    """Mean return of one episode per environment of ``env`` under ``policy(obs) -> action``.

    With ``record``, also the states ``(T + 1, nq)`` and rewards ``(T,)`` of environment 0's episode.
    """
    obs = env.reset()
    total = torch.zeros(env.num_envs, dtype=env.dtype, device=env.device)
    running = torch.ones(env.num_envs, dtype=torch.bool, device=env.device)
    qs, rs = [env.q[0].clone()], []
    for _ in range(env.horizon):
        res = env.step(policy(obs))
        total += torch.where(running, res.reward, torch.zeros_like(res.reward))
        if record and bool(running[0]):
            qs.append(res.final_q[0].clone())
            rs.append(res.reward[0].clone())
        running &= ~(res.terminated | res.truncated)
        obs = res.obs
        if not bool(running.any()):
            break
    mean = float(total.mean())
    return (mean, torch.stack(qs), torch.stack(rs)) if record else mean


# ---------------------------------------------------------------------- the learners
def _config(algo: str, overrides: dict):
    from .sac import SACConfig
    from .shac import SHACConfig

    if algo == "shac":
        cfg = SHACConfig()
    elif algo in ("policy-enhanced-sac", "sample-enhanced-sac"):
        cfg = SACConfig(enhancement="policy" if algo.startswith("policy") else "sample")
    else:
        return dict(overrides)
    names = {f.name for f in dataclasses.fields(cfg)}
    bad = sorted(set(overrides) - names)
    if bad:
        raise OptionError(f"{algo}: unknown settings {bad}; known: {sorted(names)}")
    for k, v in overrides.items():
        setattr(cfg, k, tuple(v) if isinstance(getattr(cfg, k), tuple) else v)
    return cfg


def _learner(algo: str, cfg, env_name: str, links: int, seed: int, device, env_kwargs: dict, iterations: int):
    from .sac import SAC
    from .shac import SHAC

    env = make_env(env_name, cfg.num_envs, links=links, seed=seed, device=device, **env_kwargs)
    if algo == "shac":
        return SHAC(env, cfg, total_iterations=iterations)
    return SAC(env, cfg, total_iterations=iterations)


def _sb3_model(algo: str, env_name: str, links: int, seed: int, overrides: dict, env_kwargs: dict):
    import stable_baselines3 as sb3
    from stable_baselines3.common.vec_env import DummyVecEnv

    from .gym_env import AntEnv, NLinkReachEnv, TaskEnv

    if env_name not in ENVS:
        make_env(env_name)  # raises for unknown tasks
    n_envs = int(overrides.pop("n_envs", 8 if algo == "ppo" else 1))

    def one(i):
        def f():
            e = (NLinkReachEnv(links=links, seed=seed + i, **env_kwargs) if env_name == "nlink-reach"
                 else TaskEnv(env_name, seed=seed + i, **env_kwargs) if env_name in GYM_ENVS
                 else AntEnv(seed=seed + i, **env_kwargs))
            e.reset(seed=seed + i)
            return e
        return f

    venv = DummyVecEnv([one(i) for i in range(n_envs)])
    cls = sb3.PPO if algo == "ppo" else sb3.SAC
    try:
        return cls("MlpPolicy", venv, seed=seed, device="cpu", verbose=0, **overrides), n_envs
    except TypeError as exc:  # an unknown keyword of the stable-baselines3 class
        raise OptionError(f"{algo} (stable-baselines3): {exc}") from None


# ---------------------------------------------------------------------- the run
class _Recorder:
    """Evaluations at regular environment steps, training time without the evaluations."""

    def __init__(self, eval_env: DiffEnv, policy: Callable, every: int, bar, max_wall: float | None,
                 evaluations: int, out: Path | None = None):
        self.eval_env, self.policy, self.every, self.bar = eval_env, policy, max(1, every), bar
        self.out = out  # curve.csv is rewritten there after every evaluation: a long run can be watched
        self.max_wall = math.inf if max_wall is None else float(max_wall)
        # with a wall budget, evaluations are also due every max_wall / evaluations seconds, so a slow
        # learner that spends its budget long before its step budget still gets a curve
        self.every_s = self.max_wall / max(1, evaluations)
        self.next_eval_s = self.every_s
        self.on_best: Callable[[], None] | None = None  # called when an evaluation beats every earlier one
        self.rows: list[dict] = []
        self.t0 = time.perf_counter()
        self.eval_time = 0.0
        self.next_eval = 0
        self.env_steps = 0
        self.train_return = float("nan")

    def wall(self) -> float:
        return time.perf_counter() - self.t0 - self.eval_time

    def advance(self, steps: int, train_returns: list[float] | None = None) -> bool:
        """Count ``steps`` more environment steps, evaluate when due; ``False`` once the wall budget is spent."""
        self.env_steps += steps
        if train_returns:
            self.train_return = sum(train_returns[-16:]) / len(train_returns[-16:])
        if self.bar is not None:
            self.bar.update(steps)
        if self.env_steps >= self.next_eval or self.wall() >= self.next_eval_s:
            self.evaluate()
            self.next_eval = self.env_steps + self.every
            self.next_eval_s = self.wall() + self.every_s
        return self.wall() < self.max_wall

    def evaluate(self) -> None:
        t = time.perf_counter()
        ret = evaluate(self.eval_env, self.policy)
        self.eval_time += time.perf_counter() - t
        if self.on_best is not None and all(ret > r["eval_return"] for r in self.rows):
            self.on_best()
        self.rows.append({"env_steps": self.env_steps, "wall_s": round(self.wall(), 3), "eval_return": ret,
                          "train_return": self.train_return})
        if self.out is not None:
            _write_curve_csv(self.out, self.rows)
        if self.bar is not None:
            self.bar.set_postfix(eval=f"{ret:.3f}", best=f"{max(r['eval_return'] for r in self.rows):.3f}")


def _write_curve_csv(out: Path, rows: list[dict]) -> None:
    tmp = out / "curve.csv.tmp"
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["env_steps", "wall_s", "eval_return", "train_return"])
        w.writeheader()
        w.writerows(rows)
    tmp.replace(out / "curve.csv")  # whole files only, for a reader watching the run


def _plot_curve(out: Path, rows: list[dict], title: str, best_possible: float | None) -> None:
    """``curve.png`` (the recorder has written ``curve.csv`` at each evaluation)."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8), sharey=True)
    for ax, key, label in ((axes[0], "env_steps", "environment steps"), (axes[1], "wall_s", "wall-clock (s)")):
        ax.plot([r[key] for r in rows], [r["eval_return"] for r in rows], "-o", ms=3, label="evaluation")
        if best_possible is not None:
            ax.axhline(best_possible, color="k", ls="--", lw=1, label="largest possible")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("return")
    axes[0].legend(loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(out / "curve.png", dpi=100)
    plt.close(fig)


def _versions() -> dict:
    from .. import __version__

    v = {"diffmech": __version__, "torch": torch.__version__, "python": sys.version.split()[0]}
    for mod in ("gymnasium", "stable_baselines3"):
        try:
            v[mod] = __import__(mod).__version__
        except ImportError:
            pass
    return v


def train(env_name: str, algo: str, out, *, links: int = 2, steps: int | None = None, seed: int = 0,
          device: str = "cpu", threads: int | None = 1, max_wall: float | None = None, evaluations: int = 50,
          eval_episodes: int = 4, progress: bool | None = None, overrides: dict | None = None,
          env_kwargs: dict | None = None) -> dict:
    """Train ``algo`` on ``env_name`` for ``steps`` environment steps and write the run into ``out``.

    Args:
        env_name: a task of :data:`ENVS`; algo: one of :data:`ALGOS`.
        out: output folder (created).
        links: number of links (nlink-reach).
        steps: environment-step budget (default :data:`DEFAULT_STEPS`); a learner's iteration in
            progress finishes, so the count can end slightly above.
        seed: seeds torch, the environments and stable-baselines3.
        device: of diffmech's learners and environments (stable-baselines3 runs on the CPU).
        threads: torch CPU threads (``None``: leave torch's choice); one thread is fastest for these
            small batches on a shared machine.
        max_wall: stop once the training time (evaluations excluded) exceeds this many seconds, even
            with steps left (to compare algorithms at one wall-clock budget).
        evaluations: about this many evaluations over the run (and one at the start and the end): every
            ``steps / evaluations`` environment steps, and with ``max_wall`` also every
            ``max_wall / evaluations`` seconds of training.
        eval_episodes: episodes per evaluation (batched).
        progress: ``None`` (default): silent while the training is short; once it has run 2 s, a
            tqdm bar over the environment steps on stderr if stderr is a terminal, else one INFO
            line of the ``diffmech.rl`` logger then (the budget) and one at the end (elapsed
            seconds, last and best evaluation return); ``True``: a bar from the start; ``False``:
            nothing (see :mod:`diffmech._progress`).
        overrides: settings of the algorithm's config (:class:`~diffmech.rl.shac.SHACConfig`,
            :class:`~diffmech.rl.sac.SACConfig`) or keyword arguments of stable-baselines3's class.
        env_kwargs: more keyword arguments of the task (e.g. ``reset_noise``).

    Returns:
        the metrics written to ``metrics.json``.
    """
    if algo not in ALGOS:
        raise OptionError(f"unknown algorithm {algo!r}; choose one of {ALGOS}")
    if env_name not in ENVS:
        raise OptionError(f"unknown task {env_name!r}; choose one of {ENVS}")
    steps = int(DEFAULT_STEPS[algo] if steps is None else steps)
    if steps < 1:
        raise OptionError(f"steps must be positive, got {steps}")
    overrides, env_kwargs = dict(overrides or {}), dict(env_kwargs or {})
    if threads is not None:
        torch.set_num_threads(int(threads))
    torch.manual_seed(seed)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    eval_env = make_env(env_name, eval_episodes, links=links, seed=seed + 10_000, device=device, **env_kwargs)
    cfg = _config(algo, {**TASK_DEFAULTS.get((env_name, algo), {}), **overrides})
    config = {"env": env_name, "links": links, "algo": algo, "steps": steps, "seed": seed, "device": device,
              "threads": threads, "max_wall_s": max_wall, "evaluations": evaluations, "eval_episodes": eval_episodes,
              "env_kwargs": env_kwargs,
              "algo_config": dataclasses.asdict(cfg) if dataclasses.is_dataclass(cfg) else cfg,
              "versions": _versions()}
    (out / "config.json").write_text(json.dumps(config, indent=1))
    bar = Stage(log, f"rl train {algo} {env_name}", steps, unit="env step", progress=progress,
                sizes=f"{steps} environment steps, seed {seed}, {evaluations} evaluations of {eval_episodes} episodes")
    every = max(1, steps // max(1, evaluations))
    if algo in ("sac", "ppo"):
        rec = _train_sb3(algo, env_name, links, seed, steps, cfg, env_kwargs, eval_env, every, bar, out, max_wall,
                         evaluations)
    else:
        rec = _train_own(algo, cfg, env_name, links, seed, steps, device, env_kwargs, eval_env, every, bar, out,
                         max_wall, evaluations)
    bar.close()
    wall = rec.wall()
    if rec.rows[-1]["env_steps"] != rec.env_steps:
        rec.evaluate()
    rets = [r["eval_return"] for r in rec.rows]
    finite = [x for x in rets if math.isfinite(x)]
    metrics = {"max_return": max(finite) if finite else float("nan"), "final_return": rets[-1],
               "env_steps": rec.env_steps, "wall_s": round(wall, 3),
               "total_wall_s": round(time.perf_counter() - rec.t0, 3), "evaluations": len(rets),
               "non_finite_evaluations": len(rets) - len(finite)}
    if getattr(rec, "diverged", None) is not None:
        metrics["diverged_episodes"] = rec.diverged  # training episodes ended by a runaway state (DiffEnv)
    if getattr(rec, "contact_fallbacks", None) is not None:
        metrics["contact_fallbacks"] = rec.contact_fallbacks  # smooth contact problems without a root found
    best = getattr(eval_env, "max_return", None)
    if best is not None:
        metrics["max_possible_return"] = best
        metrics["relative_max_return"] = metrics["max_return"] / best
    (out / "metrics.json").write_text(json.dumps(metrics, indent=1))
    title = f"{algo} on {env_name}" + (f" (n = {links})" if env_name == "nlink-reach" else "") + f", seed {seed}"
    _plot_curve(out, rec.rows, title, best)
    return metrics


def _train_own(algo, cfg, env_name, links, seed, steps, device, env_kwargs, eval_env, every, bar, out,
               max_wall, evaluations) -> _Recorder:
    per_iter = cfg.num_envs * (cfg.horizon if algo == "shac" else 1)
    iterations = math.ceil(steps / per_iter)
    learner = _learner(algo, cfg, env_name, links, seed, device, env_kwargs, iterations)
    rec = _Recorder(eval_env, learner.act, every, bar, max_wall, evaluations, out)
    best: dict = {}
    rec.on_best = lambda: best.update(state=copy.deepcopy(learner.state_dict()))
    rec.evaluate()
    rec.next_eval = every
    while rec.env_steps < steps:
        info = learner.iteration()
        if not rec.advance(info["env_steps"], learner.finished_returns):
            break
    if rec.rows[-1]["env_steps"] != rec.env_steps:
        rec.evaluate()
    rec.diverged = getattr(getattr(learner, "env", None), "diverged", None)
    rec.contact_fallbacks = getattr(getattr(learner, "env", None), "contact_fallbacks", None)
    for name, state in (("checkpoint.pt", learner.state_dict()), ("checkpoint_best.pt", best["state"])):
        torch.save({"algo": algo, "config": dataclasses.asdict(cfg), "state": state}, out / name)
    return rec


def _train_sb3(algo, env_name, links, seed, steps, overrides, env_kwargs, eval_env, every, bar, out,
               max_wall, evaluations) -> _Recorder:
    import numpy as np
    from stable_baselines3.common.callbacks import BaseCallback

    model, n_envs = _sb3_model(algo, env_name, links, seed, dict(overrides), env_kwargs)

    def policy(obs: Tensor) -> Tensor:
        a, _ = model.predict(obs.detach().cpu().numpy(), deterministic=True)
        return torch.as_tensor(np.asarray(a), dtype=eval_env.dtype, device=eval_env.device)

    rec = _Recorder(eval_env, policy, every, bar, max_wall, evaluations, out)
    rec.on_best = lambda: model.save(out / "model_best.zip")

    class Hook(BaseCallback):
        def _on_step(self) -> bool:
            for info in self.locals.get("infos", []):
                ep = info.get("episode")
                if ep is not None:
                    returns.append(float(ep["r"]))
            return rec.advance(n_envs, returns)

    returns: list[float] = []
    rec.evaluate()
    rec.next_eval = every
    model.learn(total_timesteps=steps, callback=Hook())
    if rec.rows[-1]["env_steps"] != rec.env_steps:
        rec.evaluate()
    model.save(out / "model.zip")
    return rec


# ---------------------------------------------------------------------- evaluation of a run
def _load_policy(run: Path, config: dict, env: DiffEnv, which: str = "best") -> Callable[[Tensor], Tensor]:
    algo = config["algo"]
    tag = "_best" if which == "best" else ""
    if algo in ("sac", "ppo"):
        import numpy as np
        import stable_baselines3 as sb3

        model = (sb3.PPO if algo == "ppo" else sb3.SAC).load(run / f"model{tag}.zip", device="cpu")

        def policy(obs):
            a, _ = model.predict(obs.detach().cpu().numpy(), deterministic=True)
            return torch.as_tensor(np.asarray(a), dtype=env.dtype, device=env.device)
        return policy
    ck = torch.load(run / f"checkpoint{tag}.pt", map_location=env.device, weights_only=False)
    cfg = _config(algo, {k: v for k, v in ck["config"].items()})
    learner = _learner(algo, cfg, config["env"], config["links"], config["seed"], env.device,
                       config.get("env_kwargs", {}), 1)
    learner.load_state_dict(ck["state"])
    return learner.act


def evaluate_run(run, *, which: str = "best", gif: bool = True, device: str = "cpu") -> dict:
    """Re-run a trained policy of the folder ``run`` for one episode, write ``eval.json`` and
    ``eval.gif`` (matplotlib animation, Pillow writer); returns the evaluation.

    ``which``: ``"best"`` (the policy of the best evaluation during training, ``checkpoint_best.pt`` /
    ``model_best.zip``) or ``"final"`` (``checkpoint.pt`` / ``model.zip``).
    """
    if which not in ("best", "final"):
        raise OptionError(f"which must be 'best' or 'final', got {which!r}")
    run = Path(run)
    config = json.loads((run / "config.json").read_text())
    env = make_env(config["env"], 1, links=config["links"], seed=config["seed"] + 20_000, device=device,
                   **config.get("env_kwargs", {}))
    policy = _load_policy(run, config, env, which)
    ret, qs, rs = evaluate(env, policy, record=True)
    result = {"policy": which, "return": ret, "steps": int(rs.shape[0])}
    best = getattr(env, "max_return", None)
    if best is not None:
        result["max_possible_return"] = best
        result["relative_return"] = ret / best
    if gif:
        from .render import save_gif

        save_gif(env, qs, run / "eval.gif", rewards=rs)
        result["gif"] = str(run / "eval.gif")
    (run / "eval.json").write_text(json.dumps(result, indent=1))
    return result
