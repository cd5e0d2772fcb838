"""``diffmech rl {train,sweep,eval,transplant}``: reinforcement learning from the command line.

Registered on the top-level parser by :func:`add_parser`; :func:`main` runs a parsed command.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from ..errors import DiffmechError
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
    t.add_argument("--out", required=True, help="output folder DIR")
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
    m.add_argument("--episodes", type=int, default=5, help="episodes of each policy (default: %(default)s)")
    m.add_argument("--horizon", type=int, default=None, help="steps per episode (default: the run's task's)")
    m.add_argument("--final", action="store_true", help="the final policy instead of the best evaluation's")
    m.add_argument("--integrator", default="Euler", choices=("Euler", "implicitfast", "RK4"),
                   help="MuJoCo's integrator (default: %(default)s, semi-implicit as diffmech's)")
    m.add_argument("--seed", type=int, default=0, help="start states and random policy (default: %(default)s)")


def _train_options(t: argparse.ArgumentParser) -> None:
    t.add_argument("--env", required=True, choices=ENVS, help="task")
    t.add_argument("--links", type=int, default=2, help="links of the pendulum (nlink-reach; default: %(default)s)")
    t.add_argument("--algo", required=True, choices=ALGOS, help="algorithm")
    t.add_argument("--steps", type=int, default=None,
                   help="environment steps (default: " + ", ".join(f"{k} {v}" for k, v in DEFAULT_STEPS.items()) + ")")
    t.add_argument("--device", default="cpu", help="torch device of diffmech's learners (default: %(default)s)")
    t.add_argument("--threads", type=int, default=1, help="torch CPU threads of a run (default: %(default)s)")
    t.add_argument("--max-wall", type=float, default=None, metavar="S",
                   help="stop after S seconds of training (evaluations excluded) even with steps left")
    t.add_argument("--evaluations", type=int, default=50, help="evaluations over the run (default: %(default)s)")
    t.add_argument("--eval-episodes", type=int, default=4, help="episodes per evaluation (default: %(default)s)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="an algorithm setting (SHACConfig/SACConfig field, or a stable-baselines3 keyword), "
                        "VALUE read as JSON when it parses; repeatable")
    t.add_argument("--env-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a task keyword, e.g. reset_noise=0.05; repeatable")


def _pairs(items: list[str], what: str) -> dict:
    out = {}
    for item in items:
        if "=" not in item:
            raise DiffmechError(f"{what} expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = _value(v)
    return out


def _run_folder(run: str) -> None:
    # checked here so that a mistyped folder is named as such, not as a missing config.json
    path = Path(run)
    if not path.is_dir():
        raise DiffmechError(f"run folder {run} does not exist")
    if not (path / "config.json").exists():
        raise DiffmechError(f"{run} is not a run folder (no config.json); give a folder written by 'diffmech rl train'")


def _sweep_job(folder: str, *, progress=None, env: str, algo: str, **kwargs) -> dict:
    """One run of ``diffmech rl sweep`` (called by name in the sweep's workers)."""
    from .train import train

    return train(env, algo, folder, progress=progress, **kwargs)


def _sweep(args: argparse.Namespace) -> None:
    from ..sweeps import check_out, cli_logging, seed_sweep
    from .train import TASK_DEFAULTS, _config

    check_out(args.out)
    overrides, env_kwargs = _pairs(args.set, "--set"), _pairs(args.env_set, "--env-set")
    _config(args.algo, {**TASK_DEFAULTS.get((args.env, args.algo), {}), **overrides})  # a bad --set fails once, here
    options = {"env": args.env, "algo": args.algo, "links": args.links, "steps": args.steps, "device": args.device,
               "threads": args.threads, "max_wall": args.max_wall, "evaluations": args.evaluations,
               "eval_episodes": args.eval_episodes, "overrides": overrides, "env_kwargs": env_kwargs}
    cli_logging()
    seed_sweep("rl train", "diffmech.rl.cli:_sweep_job", options, args.seeds, args.out, workers=args.workers,
               backend=args.backend, address=args.address, threads=args.threads, headline=SWEEP_METRICS,
               curve=("curve.csv", "env_steps", "eval_return"))


def main(args: argparse.Namespace) -> int:
    """Run a parsed ``rl`` command; returns the exit code."""
    try:
        if args.rl_command == "train":
            from .train import train

            m = train(args.env, args.algo, args.out, links=args.links, steps=args.steps, seed=args.seed,
                      device=args.device, threads=args.threads, max_wall=args.max_wall, evaluations=args.evaluations,
                      eval_episodes=args.eval_episodes, progress=False if args.no_progress else None,
                      overrides=_pairs(args.set, "--set"), env_kwargs=_pairs(args.env_set, "--env-set"))
        elif args.rl_command == "sweep":
            _sweep(args)
            return 0
        elif args.rl_command == "transplant":
            from .transplant import transplant

            _run_folder(args.run)
            m = transplant(args.run, episodes=args.episodes, which="final" if args.final else "best",
                           horizon=args.horizon, seed=args.seed, integrator=args.integrator)
        else:
            from .train import evaluate_run

            _run_folder(args.run)
            m = evaluate_run(args.run, which="final" if args.final else "best", gif=not args.no_gif)
    except FileNotFoundError as exc:
        print(f"diffmech rl {args.rl_command}: error: {exc.filename}: {exc.strerror}", file=sys.stderr)
        return 1
    except (DiffmechError, ImportError) as exc:
        print(f"diffmech rl {args.rl_command}: error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(m, indent=1))
    return 0
