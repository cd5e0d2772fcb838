"""``diffmech rl {train,sweep,eval,transplant}``: reinforcement learning from the command line.

Registered on the top-level parser by :func:`add_parser`; :func:`main` runs a parsed command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli_checks import (
    CheckpointError,
    UsageError,
    brief,
    check_existing_folder,
    load_checkpoint,
    out_path,
    positive_float,
    positive_int,
    prepare_run_folder,
    torch_device,
)
from ..errors import DiffmechError, OptionError
from ..sweeps import add_sweep_options
from .train import ALGOS, DEFAULT_STEPS, ENVS

# the metrics of the sweep's table and plot (summary.json has them all)
SWEEP_METRICS = ("max_return", "final_return", "relative_max_return", "env_steps", "wall_s")


def _value(text: str):
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def add_parser(sub) -> None:
    """Add ``rl`` and its subcommands to the subparsers ``sub`` of the ``diffmech`` parser."""
    rl = sub.add_parser("rl", help="reinforcement learning with simulation gradients (train, sweep, eval, transplant)",
                        description="Train a policy on a diffmech task (SHAC and policy- or sample-enhanced SAC "
                                    "through the differentiable simulator; stable-baselines3's SAC and PPO on the "
                                    "gymnasium adapter), or evaluate a trained run.")
    rsub = rl.add_subparsers(dest="rl_command", required=True)
    t = rsub.add_parser("train", help="train one algorithm on one task",
                        description="Writes DIR/config.json, DIR/metrics.json (max_return, final_return, env_steps, "
                                    "wall_s), DIR/curve.csv and DIR/curve.png (evaluation return vs environment steps "
                                    "and vs wall-clock) and checkpoints (checkpoint.pt and checkpoint_best.pt, or "
                                    "model.zip and model_best.zip for sac/ppo).")
    _train_options(t)
    t.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    t.add_argument("--out", required=True, type=out_path, help="output folder DIR")
    t.add_argument("--overwrite", action="store_true",
                   help="replace a run already in DIR (without it such a folder is refused; rl runs do not resume)")
    t.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    sw = rsub.add_parser("sweep", help="'rl train' over several seeds, locally or on Ray (resumable)",
                         description="Runs 'rl train' once per seed into OUT/seed<k> (a run whose metrics.json "
                                     "exists is not re-run), on a local process pool or a Ray cluster; writes "
                                     "OUT/summary.json (each run's metrics and their mean, std, min and max over "
                                     "the seeds) and OUT/summary.png, and prints the table.")
    _train_options(sw)
    add_sweep_options(sw)
    e = rsub.add_parser("eval", help="run a trained policy once and render a GIF",
                        description="Re-runs the deterministic policy of a run folder (by default the one of the best "
                                    "evaluation during training) for one episode, prints its "
                                    "return, writes DIR/eval.json and DIR/eval.gif (matplotlib, Pillow writer).")
    e.add_argument("run", help="run folder DIR written by 'diffmech rl train'")
    e.add_argument("--final", action="store_true",
                   help="the final policy instead of the one of the best evaluation during training")
    e.add_argument("--no-gif", action="store_true", help="skip the GIF")
    m = rsub.add_parser("transplant", help="run a trained Ant policy in MuJoCo (no retraining)",
                        description="Evaluates the policy of an '--env ant' run on the same Ant built with the mujoco "
                                    "package (diffmech.rl.transplant), next to a uniformly random policy and the same "
                                    "policy in diffmech, from the same start states; prints the returns and writes "
                                    "DIR/transplant.json.")
    m.add_argument("run", help="run folder DIR written by 'diffmech rl train --env ant'")
    m.add_argument("--episodes", type=positive_int, default=5, help="episodes of each policy (default: %(default)s)")
    m.add_argument("--horizon", type=positive_int, default=None, help="steps per episode (default: the run's task's)")
    m.add_argument("--final", action="store_true", help="the final policy instead of the best evaluation's")
    m.add_argument("--integrator", default="Euler", choices=("Euler", "implicitfast", "RK4"),
                   help="MuJoCo's integrator (default: %(default)s, semi-implicit as diffmech's)")
    m.add_argument("--seed", type=int, default=0, help="start states and random policy (default: %(default)s)")


def _train_options(t: argparse.ArgumentParser) -> None:
    t.add_argument("--env", required=True, choices=ENVS, metavar="ENV",
                   help="task: nlink-reach, ant (diffmech's own Ant), or one of gymnasium's MuJoCo v5 tasks rebuilt "
                        "from its XML files (diffmech.rl.make): " + ", ".join(ENVS[2:]))
    t.add_argument("--links", type=positive_int, default=2,
                   help="links of the pendulum (nlink-reach; default: %(default)s)")
    t.add_argument("--algo", required=True, choices=ALGOS, help="algorithm")
    t.add_argument("--steps", type=positive_int, default=None,
                   help="environment steps (default: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + ")")
    t.add_argument("--device", default="cpu", type=torch_device,
                   help="torch device of diffmech's learners (default: %(default)s)")
    t.add_argument("--threads", type=positive_int, default=1, help="torch CPU threads of a run (default: %(default)s)")
    t.add_argument("--max-wall", type=positive_float, default=None, metavar="S",
                   help="stop after S seconds of training (evaluations excluded) even with steps left")
    t.add_argument("--evaluations", type=positive_int, default=50,
                   help="evaluations over the run (default: %(default)s)")
    t.add_argument("--eval-episodes", type=positive_int, default=4,
                   help="episodes per evaluation (default: %(default)s)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an algorithm setting (SHACConfig/SACConfig field, or a stable-baselines3 keyword), "
                        "VALUE read as JSON when it parses; repeatable")
    t.add_argument("--env-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a task keyword, e.g. reset_noise=0.05; repeatable")


# the files an 'rl train' run writes (removed by --overwrite; the first four mark a folder that holds a run)
RUN_FILES = ("config.json", "metrics.json", "checkpoint.pt", "model.zip", "checkpoint_best.pt", "model_best.zip",
             "curve.csv", "curve.png", "eval.json", "eval.gif", "transplant.json")


def _pairs(items: list[str], what: str) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise UsageError(f"{what} expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        if not k.strip():
            raise UsageError(f"{what} expects KEY=VALUE, got {item!r}")
        out[k.strip()] = _value(v)
    return out


def _kind(default) -> str | None:
    if isinstance(default, bool):
        return "true or false"
    if isinstance(default, int):
        return "an integer"
    if isinstance(default, float):
        return "a finite number"
    if isinstance(default, tuple):
        return "a JSON list such as [64, 64]"
    if isinstance(default, str):
        return "a string"
    return None


def _fits(value, default) -> bool:
    import math

    if isinstance(default, bool):
        return isinstance(value, bool)
    if isinstance(default, int):
        return isinstance(value, int) and not isinstance(value, bool)
    if isinstance(default, float):
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if isinstance(default, tuple):
        return isinstance(value, list)
    if isinstance(default, str):
        return isinstance(value, str)
    return True


def _settings(algo: str, env: str, overrides: dict):
    """The algorithm's config with ``overrides``; a setting of the wrong type is named before any work
    (it would otherwise fail deep inside the learner, or run with a string where a number belongs)."""
    import dataclasses

    from .train import TASK_DEFAULTS, _config

    defaults = _config(algo, dict(TASK_DEFAULTS.get((env, algo), {})))
    try:
        cfg = _config(algo, {**TASK_DEFAULTS.get((env, algo), {}), **overrides})  # unknown names fail here
    except OptionError as exc:  # a name the algorithm does not have is a usage error, as a wrong type is
        raise UsageError(f"--set: {exc}") from None
    if dataclasses.is_dataclass(defaults):
        for k, v in overrides.items():
            d = getattr(defaults, k)
            if not _fits(v, d):
                raise UsageError(f"--set {k}={json.dumps(v) if not isinstance(v, str) else v}: {k} expects "
                                 f"{_kind(d)} (default {d!r})")
    return cfg


def _check_run_files(run: str, which: str) -> Path:
    """The run's config.json and the policy file that ``which`` names, readable, before any work."""
    import zipfile

    path = check_existing_folder(run, "run folder")
    cpath = path / "config.json"
    if not cpath.exists():
        raise DiffmechError(f"{run} is not a run folder (no config.json); give a folder written by 'diffmech rl train'")
    try:
        config = json.loads(cpath.read_text())
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{cpath}: cannot read the run's configuration ({exc})") from None
    missing = [k for k in ("env", "algo", "links", "seed") if not isinstance(config, dict) or k not in config]
    if missing:
        raise CheckpointError(f"{cpath}: not the configuration of an 'rl train' run (lacks {', '.join(missing)})")
    tag = "_best" if which == "best" else ""
    if config["algo"] in ("sac", "ppo"):
        f = path / f"model{tag}.zip"
        if not f.is_file():
            raise CheckpointError(f"{f}: no such policy file (the run did not finish?)")
        try:
            with zipfile.ZipFile(f) as z:
                bad = z.testzip()
        except (OSError, zipfile.BadZipFile) as exc:
            raise CheckpointError(f"{f}: cannot read the policy ({exc}); the file is truncated or corrupt") from None
        if bad is not None:
            raise CheckpointError(f"{f}: the policy file is corrupt (member {bad})")
        return f
    f = path / f"checkpoint{tag}.pt"
    load_checkpoint(f, keys=("config", "state"), what="rl checkpoint")
    return f


def _policy_call(policy: Path, fn):
    # the files were checked; what still fails is a policy that does not fit its run's configuration
    try:
        return fn()
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{policy}: the policy does not fit the run's config.json ({type(exc).__name__}: "
                              f"{brief(exc)})") from None


def _sweep_job(folder: str, *, progress=None, env: str, algo: str, **kwargs) -> dict:
    """One run of ``diffmech rl sweep`` (called by name in the sweep's workers)."""
    from .train import train

    return train(env, algo, folder, progress=progress, **kwargs)


def _sweep(args: argparse.Namespace) -> None:
    from ..cli_checks import check_out_folder
    from ..sweeps import cli_logging, seed_sweep

    check_out_folder(args.out)
    overrides, env_kwargs = _pairs(args.set, "--set"), _pairs(args.env_set, "--env-set")
    _settings(args.algo, args.env, overrides)  # a bad --set fails once, here
    options = {"env": args.env, "algo": args.algo, "links": args.links, "steps": args.steps, "device": args.device,
               "threads": args.threads, "max_wall": args.max_wall, "evaluations": args.evaluations,
               "eval_episodes": args.eval_episodes, "overrides": overrides, "env_kwargs": env_kwargs}
    cli_logging()
    seed_sweep("rl train", "diffmech.rl.cli:_sweep_job", options, args.seeds, args.out, workers=args.workers,
               backend=args.backend, address=args.address, threads=args.threads, headline=SWEEP_METRICS,
               curve=("curve.csv", "env_steps", "eval_return"))


def main(args: argparse.Namespace) -> int:
    """Run a parsed ``rl`` command; returns the exit code (errors propagate to :func:`diffmech.cli.main`)."""
    try:
        if args.rl_command == "train":
            from .train import train

            overrides, env_kwargs = _pairs(args.set, "--set"), _pairs(args.env_set, "--env-set")
            _settings(args.algo, args.env, overrides)
            prepare_run_folder(args.out, markers=RUN_FILES[:4], remove=RUN_FILES, overwrite=args.overwrite,
                               can_resume=False)
            m = train(args.env, args.algo, args.out, links=args.links, steps=args.steps, seed=args.seed,
                      device=args.device, threads=args.threads, max_wall=args.max_wall, evaluations=args.evaluations,
                      eval_episodes=args.eval_episodes, progress=False if args.no_progress else None,
                      overrides=overrides, env_kwargs=env_kwargs)
        elif args.rl_command == "sweep":
            _sweep(args)
            return 0
        elif args.rl_command == "transplant":
            from .transplant import transplant

            which = "final" if args.final else "best"
            policy = _check_run_files(args.run, which)
            m = _policy_call(policy, lambda: transplant(
                args.run, episodes=args.episodes, which=which, horizon=args.horizon, seed=args.seed,
                integrator=args.integrator))
        else:
            from .train import evaluate_run

            which = "final" if args.final else "best"
            policy = _check_run_files(args.run, which)
            m = _policy_call(policy, lambda: evaluate_run(args.run, which=which, gif=not args.no_gif))
    except FileNotFoundError as exc:
        raise DiffmechError(f"{exc.filename}: {exc.strerror}") from None
    except ImportError as exc:
        raise DiffmechError(str(exc)) from None
    print(json.dumps(m, indent=1))
    return 0
