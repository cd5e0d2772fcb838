"""Command line: ``diffmech demo ...`` (also ``python -m diffmech demo ...``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .errors import DiffmechError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffmech", description="Differentiable, learnable mechanics in PyTorch.")
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo", help="load every robot at hand, check that forward dynamics inverts inverse dynamics, write a report",
        description="Load the bundled systems and every installed robot description, check "
                    "forward_dynamics(inverse_dynamics(q, v, a)) == a on random states, sweep the joints, "
                    "and write report.json plus one PNG per robot.",
    )
    demo.add_argument("--out", default="results/demo", help="output folder (default: %(default)s)")
    demo.add_argument("--robots", default=None,
                      help="comma-separated robot names (default: all; see --list)")
    demo.add_argument("--list", action="store_true", help="list the robots the demo knows and exit")
    demo.add_argument("--batch", type=int, default=128, help="random states per robot (default: %(default)s)")
    demo.add_argument("--points", type=int, default=101, help="configurations per sweep (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    demo.add_argument("--tol", type=float, default=1e-8,
                      help="largest accepted relative round-trip error (default: %(default)s)")
    demo.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    from .control.cli import add_eigenmode_parser
    from .learn.cli import add_parser as add_symo_parser

    add_symo_parser(sub)
    add_eigenmode_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diffmech`` script; returns the process exit code."""
    args = _parser().parse_args(argv)
    if args.command == "symo":
        from .learn.cli import main as symo_main

        return symo_main(args)
    if args.command == "eigenmode":
        from .control.cli import run_eigenmode

        return run_eigenmode(args)
    if args.command == "demo":
        from .demo import available_robots, run_demo

        if args.list:
            for name, entry in available_robots().items():
                state = "" if entry.available() else f"  (needs package {entry.package})"
                print(f"{name:18s} {entry.description}{state}")
            return 0
        robots = None if args.robots is None else [r.strip() for r in args.robots.split(",") if r.strip()]
        try:
            run_demo(args.out, robots, batch=args.batch, points=args.points, seed=args.seed, tol=args.tol,
                     plots=not args.no_plots, progress=not args.no_progress)
        except DiffmechError as exc:
            print(f"diffmech demo: error: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
