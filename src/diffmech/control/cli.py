"""``diffmech eigenmode learn | stabilize | report``: the command-line group of :mod:`diffmech.control`.

Only argparse is imported at module level, so registering the group costs nothing; the work is
done by :mod:`diffmech.control.experiment`.
"""

from __future__ import annotations

import argparse
import sys

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
    learn.add_argument("--config", default="main", choices=_CONFIG_NAMES,
                       help="base configuration (default: %(default)s)")
    learn.add_argument("--q0", type=float, nargs="+", metavar="A", help="initial configuration (rad)")
    learn.add_argument("--target-angles", type=float, nargs="+", metavar="A",
                       help="target configuration whose end-effector position is the target (rad)")
    per = learn.add_mutually_exclusive_group()
    per.add_argument("--period", type=float, metavar="T", help="fixed period (s)")
    per.add_argument("--learn-period", action="store_true", help="learn the period jointly (appendix D)")
    learn.add_argument("--effort", type=float, metavar="C", help="control-effort coefficient c")
    learn.add_argument("--epochs", type=int, metavar="E", help="number of epochs")
    learn.add_argument("--steps-per-epoch", type=int, help="optimiser steps per epoch (2022 code: 7, 2023: 1)")
    learn.add_argument("--lr", type=float, help="Adam learning rate")
    learn.add_argument("--method", choices=("midpoint", "rk4", "implicit_midpoint", "euler"),
                       help="fixed-step scheme of the training trajectory")
    learn.add_argument("--adjoint", choices=("discrete", "autograd"), help="gradient through the solver")
    learn.add_argument("--dtype", choices=("float32", "float64"), help="training dtype")
    learn.add_argument("--device", help="torch device of the training (default cpu; e.g. cuda)")
    learn.add_argument("--seed", type=int, help="random seed")
    learn.add_argument("--effort-descent", action="store_true",
                       help="after the Gauss-Newton polish, lower the effort within the mode's conditions "
                            "(configs with the polish only)")
    learn.add_argument("--stop-ee", type=float, metavar="M",
                       help="stop once the fixed-step end-effector error at T/2 is below M metres")
    learn.add_argument("--out", required=True, metavar="DIR", help="output folder")
    learn.add_argument("--resume", action="store_true", help="continue from DIR/checkpoint.pt")
    learn.add_argument("--threads", type=int, default=1,
                       help="torch threads (default: %(default)s; the problem is too small for more)")
    learn.add_argument("--no-plots", action="store_true", help="skip figures and animations")
    learn.add_argument("--no-progress", action="store_true", help="hide the progress bar")

    stab = esub.add_parser("stabilize", help="stabilise the learned mode, simulate, compute cycle multipliers",
                           description="Simulate the stabilising controller from a perturbed start (and a grid "
                                       "of others), with and without damping, compare with the unprojected "
                                       "variant and with a computed-torque tracking controller, and compute "
                                       "the cycle multipliers (monodromy by autodiff and by finite differences).")
    stab.add_argument("dir", metavar="DIR", help="folder of a finished 'learn' run")
    stab.add_argument("--gains", type=float, nargs=2, metavar=("AE", "AM"), help="alpha_E alpha_M (default 1 10)")
    stab.add_argument("--damping", type=float, metavar="B", help="plant viscous damping b (default 0)")
    stab.add_argument("--start", type=float, nargs="+", metavar="X",
                      help="start state q1 .. qn p1 .. pn (default: q0 + 0.7, p = 5)")
    stab.add_argument("--periods", type=float, default=3.0, help="simulated horizon in periods (default: %(default)s)")
    stab.add_argument("--grid", type=int, default=4,
                      help="perturbed starts per axis of the start grid (default: %(default)s)")
    stab.add_argument("--monodromy-steps", type=int, default=601,
                      help="fixed RK4 steps per period for the monodromy matrices; odd, so that no stage "
                           "falls on a turning point when starting at T/4 (default: %(default)s)")
    stab.add_argument("--tag", default="",
                      help="suffix of the output files (stabilize_TAG.json, ...) to keep several settings side "
                           "by side; metrics.json gets the multipliers only without a tag")
    stab.add_argument("--threads", type=int, default=1, help="torch threads (default: %(default)s)")
    stab.add_argument("--no-plots", action="store_true", help="skip figures and animations")

    rep = esub.add_parser("report", help="print a run's metrics (and write DIR/report.md)")
    rep.add_argument("dir", metavar="DIR", help="folder of a 'learn' run")
    return eig


def run_eigenmode(args: argparse.Namespace) -> int:
    """Run the parsed ``eigenmode`` subcommand; returns the exit code."""
    import torch

    from ..errors import DiffmechError
    from . import experiment

    if getattr(args, "threads", None):
        torch.set_num_threads(args.threads)
    try:
        if args.eigen_command == "learn":
            metrics = experiment.learn(args)
            print(experiment.format_metrics(metrics))
        elif args.eigen_command == "stabilize":
            metrics = experiment.stabilize(args)
            print(experiment.format_metrics(metrics, stabilize=True))
        else:
            print(experiment.report(args.dir))
    except (DiffmechError, FileNotFoundError, KeyError) as exc:
        print(f"diffmech eigenmode {args.eigen_command}: error: {exc}", file=sys.stderr)
        return 1
    return 0
