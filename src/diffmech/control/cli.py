"""``diffmech eigenmode learn | sweep | stabilize | report``: the command-line group of :mod:`diffmech.control`.

Only argparse is imported at module level, so registering the group costs nothing; the work is
done by :mod:`diffmech.control.experiment`.
"""

from __future__ import annotations

import argparse
import sys

from ..cli_checks import (
    finite_float,
    int_at_least,
    nonnegative_float,
    out_path,
    positive_float,
    positive_int,
    torch_device,
)
from ..sweeps import add_sweep_options

__all__ = ["add_eigenmode_parser", "run_eigenmode"]

_CONFIG_NAMES = ("main", "example", "effort-sweep", "periods", "other-pair", "learn-period", "learn-period-c",
                 "three-link", "iiwa", "tiny", "main-fast",
                 "main-fast-effort", "three-link-fast", "iiwa-fast", "iiwa-fast-effort")


def add_eigenmode_parser(sub) -> argparse.ArgumentParser:
    """Register ``eigenmode`` and its subcommands on an ``add_subparsers()`` object."""
    eig = sub.add_parser(
        "eigenmode", help="learn, stabilise and certify efficient periodic motions (eigenmodes)",
        description="Learn a control potential whose conservative closed loop performs an eigenmode that "
                    "reaches a target at half period (learn), stabilise it and compute its cycle "
                    "multipliers (stabilize), summarise a run (report).",
    )
    esub = eig.add_subparsers(dest="eigen_command", required=True)

    learn = esub.add_parser("learn", help="train a potential, verify the mode with a high-accuracy solver",
                            description="Train V_theta, re-integrate the closed loop with solve_ivp "
                                        "(rtol = atol = 1e-10) and write DIR/metrics.json, history.csv, "
                                        "trajectory.csv, checkpoint.pt and figures.")
    _learn_options(learn)
    learn.add_argument("--seed", type=int, help="random seed (default: the configuration's)")
    learn.add_argument("--out", required=True, type=out_path, metavar="DIR", help="output folder")
    learn.add_argument("--overwrite", action="store_true",
                       help="replace a run already in DIR (without it, or --resume, such a folder is refused)")
    learn.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    sweep = esub.add_parser("sweep", help="'eigenmode learn' over several seeds, locally or on Ray (resumable)",
                            description="Runs 'eigenmode learn' once per seed into OUT/seed<k> (a run whose "
                                        "metrics.json exists is not re-run), on a local process pool or a Ray "
                                        "cluster; writes OUT/summary.json (each run's metrics and their mean, std, "
                                        "min and max over the seeds) and OUT/summary.png, and prints the table.")
    _learn_options(sweep)
    add_sweep_options(sweep)

    stab = esub.add_parser("stabilize", help="stabilise the learned mode, simulate, compute cycle multipliers",
                           description="Simulate the stabilising controller from a perturbed start (and a grid "
                                       "of others), with and without damping, compare with the unprojected "
                                       "variant and with a computed-torque tracking controller, and compute "
                                       "the cycle multipliers (monodromy by autodiff and by finite differences).")
    stab.add_argument("dir", metavar="DIR", help="folder of a finished 'learn' run")
    stab.add_argument("--gains", type=positive_float, nargs=2, metavar=("AE", "AM"),
                      help="alpha_E alpha_M (default 1 10)")
    stab.add_argument("--damping", type=nonnegative_float, metavar="B", help="plant viscous damping b (default 0)")
    stab.add_argument("--start", type=finite_float, nargs="+", metavar="X",
                      help="start state q1 .. qn p1 .. pn (default: q0 + 0.7, p = 5)")
    stab.add_argument("--periods", type=positive_float, default=None,
                      help="simulated horizon in periods (default: 3; 1 for a smoke-test configuration such as tiny)")
    stab.add_argument("--grid", type=positive_int, default=None,
                      help="perturbed starts per axis of the start grid (default: 4; 2 for a smoke test)")
    stab.add_argument("--monodromy-steps", type=int_at_least(3), default=None,
                      help="fixed RK4 steps per period for the monodromy matrices; odd, so that no stage "
                           "falls on a turning point when starting at T/4 (default: 601; 101 for a smoke test)")
    stab.add_argument("--tag", default="",
                      help="suffix of the output files (stabilize_TAG.json, ...) to keep several settings side "
                           "by side; metrics.json gets the multipliers only without a tag")
    stab.add_argument("--threads", type=positive_int, default=1, help="torch threads (default: %(default)s)")
    stab.add_argument("--no-plots", action="store_true", help="skip figures and animations")

    rep = esub.add_parser("report", help="print a run's metrics (and write DIR/report.md)")
    rep.add_argument("dir", metavar="DIR", help="folder of a 'learn' run")
    return eig


def _learn_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="main", choices=_CONFIG_NAMES,
                   help="base configuration (default: %(default)s; tiny is a smoke test, not the paper's run)")
    p.add_argument("--q0", type=finite_float, nargs="+", metavar="A", help="initial configuration (rad)")
    p.add_argument("--target-angles", type=finite_float, nargs="+", metavar="A",
                   help="target configuration whose end-effector position is the target (rad)")
    per = p.add_mutually_exclusive_group()
    per.add_argument("--period", type=positive_float, metavar="T", help="fixed period (s)")
    per.add_argument("--learn-period", action="store_true", help="learn the period jointly (appendix D)")
    p.add_argument("--effort", type=nonnegative_float, metavar="C", help="control-effort coefficient c")
    p.add_argument("--epochs", type=positive_int, metavar="E", help="number of epochs")
    p.add_argument("--steps-per-epoch", type=positive_int, help="optimiser steps per epoch (2022 code: 7, 2023: 1)")
    p.add_argument("--lr", type=positive_float, help="Adam learning rate")
    p.add_argument("--method", choices=("midpoint", "rk4", "implicit_midpoint", "euler"),
                   help="fixed-step scheme of the training trajectory")
    p.add_argument("--adjoint", choices=("discrete", "autograd"), help="gradient through the solver")
    p.add_argument("--dtype", choices=("float32", "float64"), help="training dtype")
    p.add_argument("--device", type=torch_device, help="torch device of the training (default cpu; e.g. cuda)")
    p.add_argument("--effort-descent", action="store_true",
                   help="after the Gauss-Newton polish, lower the effort within the mode's conditions "
                        "(configs with the polish only)")
    p.add_argument("--stop-ee", type=positive_float, metavar="M",
                   help="stop once the fixed-step end-effector error at T/2 is below M metres")
    p.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    p.add_argument("--threads", type=positive_int, default=1,
                   help="torch threads (default: %(default)s; the problem is too small for more)")
    p.add_argument("--no-plots", action="store_true", help="skip figures and animations")


# the metrics of the sweep's table and plot (summary.json has them all)
SWEEP_METRICS = ("ee_error_half_period", "periodicity_error", "p_half_norm", "effort", "period", "wall_s")
_SWEEP_ONLY = ("seeds", "workers", "backend", "address", "out", "command", "eigen_command", "debug")


def _sweep_job(folder: str, *, progress=None, **options) -> dict:
    """One run of ``diffmech eigenmode sweep`` (called by name in the sweep's workers)."""
    from . import experiment

    show = sys.stderr.isatty() if progress is None else progress
    # a sweep resumes by design: a seed interrupted earlier continues from its checkpoint
    options = {**options, "resume": True, "overwrite": False}
    return experiment.learn(argparse.Namespace(**options, out=folder, no_progress=not show))


def _sweep(args: argparse.Namespace) -> None:
    from ..cli_checks import check_out_folder
    from ..sweeps import cli_logging, seed_sweep
    from .configs import get_config
    from .experiment import config_overrides

    check_out_folder(args.out)
    options = {k: v for k, v in vars(args).items() if k not in _SWEEP_ONLY}
    get_config(args.config, **config_overrides(argparse.Namespace(**options, seed=None)))  # bad options fail here
    cli_logging()
    seed_sweep("eigenmode learn", "diffmech.control.cli:_sweep_job", options, args.seeds, args.out,
               workers=args.workers, backend=args.backend, address=args.address, threads=args.threads,
               headline=SWEEP_METRICS, curve=("history.csv", "step", "total"))


def run_eigenmode(args: argparse.Namespace) -> int:
    """Run the parsed ``eigenmode`` subcommand; returns the exit code (errors propagate to
    :func:`diffmech.cli.main`)."""
    import torch

    from . import experiment

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    if args.eigen_command == "sweep":
        _sweep(args)
    elif args.eigen_command == "learn":
        metrics = experiment.learn(args)
        print(experiment.format_metrics(metrics))
    elif args.eigen_command == "stabilize":
        metrics = experiment.stabilize(args)
        print(experiment.format_metrics(metrics, stabilize=True))
    else:
        print(experiment.report(args.dir))
    return 0
