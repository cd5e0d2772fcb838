"""``diffmech symo {train,evaluate,sweep,figures}``: learned dynamics from the command line.

Registered on the top-level parser by :func:`add_parser`; :func:`main` runs a parsed command.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ..cli_checks import (
    UsageError,
    check_existing_folder,
    check_out_folder,
    int_at_least,
    nonnegative_int,
    out_path,
    positive_float,
    positive_int,
    prepare_run_folder,
    torch_device,
)
from ..errors import DiffmechError
from ..sweeps import add_sweep_options

MODEL_CHOICES = ("node-rk4", "node-midpoint", "lnode-rk4", "lnode-midpoint", "symo", "e2e-symo")
SYSTEM_CHOICES = ("pendulum", "cartpole", "damped_pendulum", "damped_cartpole", "double_pendulum", "arm3")


def _run_options(p: argparse.ArgumentParser, *, single: bool) -> None:
    p.add_argument("--system", default="pendulum", choices=SYSTEM_CHOICES, help="system preset (default: %(default)s)")
    if single:
        p.add_argument("--model", default="e2e-symo", choices=MODEL_CHOICES, help="model (default: %(default)s)")
        p.add_argument("--n-ics", type=positive_int, default=128,
                       help="training initial conditions, the first N of the pool (default: %(default)s)")
    p.add_argument("--epochs", type=positive_int, default=2000, help="epochs (default: %(default)s)")
    p.add_argument("--h", type=positive_float, default=None, help="time step, s (default: the preset's: pendulum 0.1, "
                   "cart-pole 0.05)")
    p.add_argument("--seed", type=int, default=230, help="model initialisation and shuffling seed (default: "
                   "%(default)s, the paper's)")
    p.add_argument("--data-seed", type=int, default=0, help="train/test data seed (default: %(default)s)")
    p.add_argument("--int-seed", type=int, default=1, help="integration-set seed (default: %(default)s)")
    p.add_argument("--out", required=True, type=out_path, help="output folder")
    p.add_argument("--lr", type=positive_float, default=None, help="initial learning rate (default: the preset's)")
    p.add_argument("--width", type=positive_int, default=None, help="hidden width (default: the preset's)")
    p.add_argument("--batch-size", type=positive_int, default=None, help="minibatch size (default: 4 N)")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--device", default="cpu", type=torch_device, help="torch device, e.g. cuda (default: %(default)s)")
    p.add_argument("--inertia", default="paper", choices=("paper", "cholesky"),
                   help="1-DoF inertia: the seed's softplus(z) or L L^T + eps (default: %(default)s)")
    p.add_argument("--dissipation", action="store_true", help="learn a Rayleigh dissipation matrix (L-NODE, SyMo)")
    p.add_argument("--newton-tol", type=positive_float, default=1e-5,
                   help="training Newton tolerance (default: %(default)s)")
    p.add_argument("--rollout-tol", type=positive_float, default=1e-4,
                   help="rollout Newton tolerance (default: %(default)s)")
    p.add_argument("--line-search", action="store_true", help="backtracking line search in Newton (the seed: none)")
    p.add_argument("--no-warm-start", action="store_true",
                   help="E2E-SyMo: start every Newton solve from 2 q_k - q_{k-1} (the seed) instead of the "
                        "previous epoch's root")
    p.add_argument("--n-samples", type=int_at_least(2), default=256,
                   help="trajectories drawn; the first half is the training pool, the rest the test set "
                        "(default: %(default)s)")
    p.add_argument("--n-int", type=positive_int, default=16, help="integration trajectories (default: %(default)s)")
    p.add_argument("--int-steps", type=positive_int, default=500, help="integration steps (default: %(default)s)")
    p.add_argument("--tight", action="store_true", help="ground truth with RK45 rtol = atol = 1e-10 instead of "
                   "the preset's (SciPy's defaults for the seed's systems)")
    p.add_argument("--threads", type=positive_int, default=1, help="torch threads per run (default: %(default)s)")


def add_parser(sub) -> argparse.ArgumentParser:
    """Add the ``symo`` command group to the top-level subparsers ``sub``."""
    symo = sub.add_parser("symo", help="learned dynamics: NODE, L-NODE, SyMo, E2E-SyMo (train, evaluate, sweep, "
                          "figures)", description="Structure-preserving learned dynamics (Santos et al. 2022).")
    ss = symo.add_subparsers(dest="symo_command", required=True)
    tr = ss.add_parser("train", help="train and evaluate one model",
                       description="Train one model on the first N trajectories of the training pool and evaluate "
                                   "it; writes config.json, history.csv, loss_curves.png, checkpoint.pt, "
                                   "metrics.json and rollout.npz into --out.")
    _run_options(tr, single=True)
    tr.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    tr.add_argument("--overwrite", action="store_true",
                    help="replace a run already in --out (without it, or --resume, such a folder is refused)")
    tr.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    ev = ss.add_parser("evaluate", help="re-evaluate a trained run (rewrites metrics.json)")
    ev.add_argument("run", help="run folder (with config.json and checkpoint.pt)")
    ev.add_argument("--int-steps", type=positive_int, default=None, help="rollout steps (default: the run's)")
    ev.add_argument("--out", default=None, type=out_path, help="write metrics here instead of RUN/metrics.json")
    sw = ss.add_parser("sweep", help="all models x training-set sizes of one system (resumable)",
                       description="Run models x N into OUT/<model>/N<n>; finished runs are skipped, interrupted "
                                   "ones resume; writes OUT/summary.csv and summary.json.")
    _run_options(sw, single=False)
    sw.add_argument("--models", default=",".join(MODEL_CHOICES), help="comma-separated models (default: all six)")
    sw.add_argument("--n-ics", default="8,16,32,64,128", help="comma-separated N (default: %(default)s)")
    add_sweep_options(sw, seeds=None, out=False)
    sw.add_argument("--nice", type=nonnegative_int, default=0, help="niceness added to the worker processes")
    sw.add_argument("--figures", action="store_true", help="also write the figures into OUT")
    fg = ss.add_parser("figures", help="figures of a sweep folder (metrics vs N with the paper's values, "
                       "phase portraits, energy)")
    fg.add_argument("sweep", help="sweep folder")
    fg.add_argument("--out", default=None, type=out_path, help="figure folder (default: the sweep folder)")
    fg.add_argument("--n-ics", type=positive_int, default=32, help="N of the phase-portrait and energy plots")
    fg.add_argument("--traj", type=nonnegative_int, default=0, help="integration trajectory to plot")
    fg.add_argument("--no-paper", action="store_true", help="no overlay of the paper's values")
    fg.add_argument("--long-horizon", type=nonnegative_int, default=0, metavar="STEPS",
                    help="also roll the N models out for STEPS steps and plot the energy error (e.g. 10000)")
    return symo


def _config(args, model: str = "e2e-symo", n_ics: int = 128):
    from .train import TrainConfig

    return TrainConfig(
        system=args.system, model=model, n_ics=n_ics, epochs=args.epochs, h=args.h, seed=args.seed,
        data_seed=args.data_seed, int_seed=args.int_seed, batch_size=args.batch_size, lr=args.lr, width=args.width,
        dtype=args.dtype, device=args.device, newton_tol=args.newton_tol, rollout_tol=args.rollout_tol,
        line_search=args.line_search, inertia=args.inertia, dissipation=args.dissipation,
        warm_start=not args.no_warm_start, n_samples=args.n_samples, n_int=args.n_int, int_steps=args.int_steps,
        rtol=1e-10 if args.tight else None, atol=1e-10 if args.tight else None,
    )


def _print_metrics(m: dict) -> None:
    keys = ("train_loss", "test_loss", "integration_loss", "energy_loss", "inertia_loss", "integration_median",
            "energy_loss_consistent", "wall_s")
    print("  ".join(f"{k}={m[k]:.4g}" if isinstance(m.get(k), float) else f"{k}={m.get(k)}" for k in keys))
    # the training objective (history.csv's last row) is another quantity than test_loss: say both, and why
    # they can differ, where a user compares them
    if isinstance(m.get("final_test_objective"), float):
        fails = m.get("eval_newton_failures")
        print(f"final_test_objective={m['final_test_objective']:.4g} (history.csv's last row: the training "
              f"objective, not test_loss; metrics.json's 'definitions' says how they differ)"
              + (f"  eval_newton_failures={fails}" if fails else ""))


# the files of a finished or interrupted run: their presence means --out holds a run
RUN_FILES = ("checkpoint.pt", "metrics.json", "history.csv", "config.json", "rollout.npz", "loss_curves.png")


def _int_list(text: str, option: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"{option} expects comma-separated positive integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise UsageError(f"{option} expects comma-separated positive integers, got {text!r}")
    return values


def main(args: argparse.Namespace) -> int:
    """Run a parsed ``symo`` command; returns the exit code (errors propagate to :func:`diffmech.cli.main`)."""
    import torch

    cmd = args.symo_command
    if cmd == "train":
        from .train import run

        prepare_run_folder(args.out, markers=("checkpoint.pt", "metrics.json"), remove=RUN_FILES,
                           resume=args.resume, overwrite=args.overwrite)
        torch.set_num_threads(args.threads)
        m = run(_config(args, args.model, args.n_ics), args.out, resume=args.resume,
                progress=False if args.no_progress else None)
        _print_metrics(m)
    elif cmd == "evaluate":
        from .data import step_samples
        from .train import _data, _dtype, evaluate_run, load_run_model

        check_existing_folder(args.run, "run folder", needs=("config.json", "checkpoint.pt"))
        out = Path(args.out) if args.out else Path(args.run)
        check_out_folder(out)
        cfg, system, model = load_run_model(args.run)
        if args.int_steps is not None:
            cfg.int_steps = args.int_steps
        ds = _data(cfg)
        dt = _dtype(cfg.dtype)
        tb = step_samples(ds.train.take(slice(0, cfg.n_ics)), system.n, dtype=dt, device=cfg.device)
        te = step_samples(ds.test, system.n, dtype=dt, device=cfg.device)
        out.mkdir(parents=True, exist_ok=True)
        m = evaluate_run(model, cfg, system, ds, tb, te, out)
        old = Path(args.run) / "metrics.json"
        if old.exists():  # keep the training-time values (the paper's train error is the last epoch's)
            try:
                prev = json.loads(old.read_text())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise DiffmechError(f"{old}: not a metrics file ({exc}); delete it to write a new one") from None
            m = {**prev, **{k: v for k, v in m.items() if k != "train_loss"}}
        (out / "metrics.json").write_text(json.dumps(m, indent=2) + "\n")
        _print_metrics(m)
    elif cmd == "sweep":
        from ..sweeps import cli_logging
        from .sweep import sweep

        check_out_folder(args.out)
        models = [x.strip() for x in args.models.split(",") if x.strip()]
        bad = [m for m in models if m not in MODEL_CHOICES]
        if bad or not models:
            raise UsageError(f"--models: unknown {', '.join(map(repr, bad)) or 'empty list'}; choose from "
                             f"{', '.join(MODEL_CHOICES)}")
        n_ics = _int_list(args.n_ics, "--n-ics")
        cli_logging()
        rows = sweep(_config(args), args.out, models=models, n_ics=n_ics, workers=args.workers,
                     backend=args.backend, address=args.address, threads=args.threads, nice=args.nice)
        print(f"{len(rows)} runs in {args.out}/summary.csv")
        if args.figures:
            from .figures import make_figures

            for p in make_figures(args.out):
                print(p)
    elif cmd == "figures":
        from .figures import make_figures
        from .sweep import collect

        check_existing_folder(args.sweep, "sweep folder")
        if args.out:
            check_out_folder(args.out)
        rows = collect(args.sweep)
        if not rows:
            raise DiffmechError(f"sweep folder {args.sweep} holds no finished run (no MODEL/N<n>/metrics.json); "
                                "give the --out of a 'diffmech symo sweep'")
        for p in make_figures(args.sweep, args.out, n_ics=args.n_ics, paper=not args.no_paper, traj=args.traj):
            print(p)
        if args.long_horizon:
            from .figures import long_horizon_figure

            system = rows[0]["system"]
            out = Path(args.out or args.sweep)
            path = out / f"{system}_long_horizon_N{args.n_ics}.png"
            summary = long_horizon_figure(args.sweep, args.n_ics, path, steps=args.long_horizon)
            (out / f"{system}_long_horizon_N{args.n_ics}.json").write_text(json.dumps(summary, indent=1) + "\n")
            print(path)
    return 0


__all__ = ["add_parser", "main", "MODEL_CHOICES", "SYSTEM_CHOICES"]
