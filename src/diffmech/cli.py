"""Command line: ``diffmech demo|info|view|symo|eigenmode|sim|rl ...`` (also ``python -m diffmech ...``)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from .cli_checks import finite_float, int_at_least, out_path, positive_float, positive_int
from .errors import DiffmechError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="diffmech", description="Differentiable, learnable mechanics in PyTorch.")
    parser.add_argument("--version", action="version", version=_version())
    parser.add_argument("--debug", action="store_true",
                        help="let errors propagate with their Python traceback (for bug reports)")
    sub = parser.add_subparsers(dest="command", required=True)
    info = sub.add_parser("info", help="one URDF file: links, DoF, mass, joint types, round-trip check",
                          description="Load a URDF and print the demo's table for it: links, DoF, total mass, "
                                      "joint types and max |forward_dynamics(inverse_dynamics(a)) - a| on random "
                                      "states (float64).")
    info.add_argument("urdf", help="path of the URDF file")
    info.add_argument("--floating-base", action="store_true", help="attach the root link by a free joint")
    info.add_argument("--batch", type=positive_int, default=32,
                      help="random states of the round trip (default: %(default)s)")
    info.add_argument("--json", action="store_true", help="print the row as JSON instead of a table")
    view = sub.add_parser(
        "view", help="write an animated 3-D view of a URDF as one self-contained HTML page",
        description="Draw a URDF's visual meshes (collision shapes where a link has none) at one configuration "
                    "or along a trajectory, as an HTML page that opens offline (plotly.js inline).",
    )
    view.add_argument("urdf", help="path of the URDF file")
    view.add_argument("--q", nargs="+", type=finite_float, default=None, metavar="V",
                      help="one configuration, nq numbers (default: the neutral configuration)")
    view.add_argument("--trajectory", default=None, metavar="FILE",
                      help="configurations, one per row: .npy, or text/CSV with nq columns")
    view.add_argument("--dt", type=positive_float, default=None, help="seconds between trajectory rows (slider labels)")
    view.add_argument("--floating-base", action="store_true", help="attach the root link by a free joint")
    view.add_argument("--geometry", choices=("auto", "visual", "collision"), default="auto",
                      help="what to draw (default: %(default)s: visual meshes, collision shapes where none)")
    view.add_argument("--max-faces", type=positive_int, default=None,
                      help="triangles per frame (default: chosen from the trajectory length)")
    view.add_argument("--out", type=out_path, default="traj.html", help="HTML file to write (default: %(default)s)")
    demo = sub.add_parser(
        "demo", help="load every robot at hand, check that forward dynamics inverts inverse dynamics, write a report",
        description="Load the bundled systems and every installed robot description, check "
                    "forward_dynamics(inverse_dynamics(q, v, a)) == a on random states, sweep the joints, "
                    "and write report.json plus one PNG per robot.",
    )
    demo.add_argument("--out", type=out_path, default="results/demo", help="output folder (default: %(default)s)")
    demo.add_argument("--robots", default=None,
                      help="comma-separated robot names (default: all; see --list)")
    demo.add_argument("--list", action="store_true", help="list the robots the demo knows and exit")
    demo.add_argument("--batch", type=positive_int, default=128, help="random states per robot (default: %(default)s)")
    demo.add_argument("--points", type=int_at_least(2), default=101,
                      help="configurations per sweep (default: %(default)s)")
    demo.add_argument("--seed", type=int, default=0, help="random seed (default: %(default)s)")
    demo.add_argument("--tol", type=positive_float, default=1e-8,
                      help="largest accepted relative round-trip error (default: %(default)s)")
    demo.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    demo.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    kern = sub.add_parser("kernels", help="build native kernels of a robot or scene ahead of time, list stored ones",
                          description="Native kernels are built on a first call (seconds to minutes) and stored in "
                                      "$DIFFMECH_CACHE_DIR for every later process; `build` does it now.")
    ks = kern.add_subparsers(dest="kernels_command", required=True)
    kb = ks.add_parser("build", help="build the kernels of URDF files or ready-made scenes",
                       description="Build and store the kernels a URDF's dynamics (and with --contact its contact "
                                   "step on the ground) or a scene of diffmech.sim.scenes use.")
    kb.add_argument("targets", nargs="+", metavar="URDF|SCENE",
                    help="URDF files or scene names (laikago, ant, racecar, golf, panda_throw)")
    kb.add_argument("--floating-base", action="store_true", help="a URDF's root joined to the world by a free joint")
    kb.add_argument("--dtype", nargs="+", choices=("float64", "float32"), default=["float64"],
                    help="dtypes to build for (default: float64)")
    kb.add_argument("--parameters", action="store_true",
                    help="also the gradients w.r.t. inertial parameters (identification, learnable masses)")
    kb.add_argument("--contact", action="store_true", help="a URDF: also its contact step on the ground")
    kl = ks.add_parser("list", help="the stored kernels: name, size, compile time")
    kl.add_argument("--json", action="store_true", help="print JSON instead of a table")
    from .control.cli import add_eigenmode_parser
    from .learn.cli import add_parser as add_symo_parser
    from .rl.cli import add_parser as add_rl_parser
    from .sim.cli import add_sim_parser

    add_symo_parser(sub)
    add_eigenmode_parser(sub)
    add_sim_parser(sub)
    add_rl_parser(sub)
    return parser


def _version() -> str:
    import torch

    from . import __version__

    return f"diffmech {__version__} (torch {torch.__version__})"


def _info(args) -> int:
    import json

    import torch

    from . import load_urdf
    from .demo import print_table, robot_row

    if args.batch < 1:
        print(f"diffmech info: error: --batch must be at least 1, got {args.batch}", file=sys.stderr)
        return 2
    try:
        robot = load_urdf(args.urdf, floating_base=args.floating_base)
    except (DiffmechError, OSError) as exc:
        print(f"diffmech info: error: {exc}", file=sys.stderr)
        return 1
    row = robot_row(robot, args.batch, torch.Generator().manual_seed(0))
    if args.json:
        print(json.dumps({"name": robot.name, **row}, indent=1))
    else:
        print_table({robot.name: row}, title=f"diffmech info {args.urdf}")
    return 0


def _view(args) -> int:
    import warnings

    import numpy as np

    from . import load_urdf

    if args.q is not None and args.trajectory is not None:
        print("diffmech view: error: give --q or --trajectory, not both", file=sys.stderr)
        return 2
    try:
        from .viz import show

        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*has no <inertial>.*")
            robot = load_urdf(args.urdf, floating_base=args.floating_base)
        q = args.q
        if args.trajectory is not None:
            path = args.trajectory
            q = np.load(path) if path.endswith(".npy") else np.loadtxt(path, delimiter="," if path.endswith(".csv")
                                                                        else None, ndmin=2)
        out = show(robot, q, args.out, geometry=args.geometry, dt=args.dt, max_faces=args.max_faces)
    except (DiffmechError, OSError, ValueError) as exc:
        print(f"diffmech view: error: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {out}")
    return 0


def _kernels(args) -> int:
    import json

    from . import _log
    from .prebuild import describe, prebuild, stored_kernels

    if args.kernels_command == "list":
        rows = stored_kernels()
        print(json.dumps(rows, indent=1) if args.json else describe(rows))
        return 0
    _log.show()
    for target in args.targets:
        try:
            rep = prebuild(target, floating_base=args.floating_base, dtypes=tuple(args.dtype),
                           parameters=args.parameters, contact=args.contact)
        except DiffmechError as exc:  # NativeUnavailable included
            print(f"diffmech kernels build: error: {target}: {exc}", file=sys.stderr)
            return 1
        route = f", contact step route: {rep.route}" if rep.route else ""
        print(f"{target}: {len(rep.built)} kernels built in {rep.seconds:.1f} s{route}")
        for name in rep.built:
            print(f"  {name}")
    return 0


def _command(args) -> str:
    words = [args.command]
    for attr in ("symo_command", "eigen_command", "sim_command", "rl_command", "kernels_command"):
        if getattr(args, attr, None):
            words.append(getattr(args, attr))
    return " ".join(words)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``diffmech`` script; returns the process exit code.

    Exit status 2 for a command line that asks for something impossible (argparse's errors and
    :class:`~diffmech.cli_checks.UsageError`), 1 for a failure; one line on stderr, no traceback
    unless ``--debug``.
    """
    from .cli_checks import UsageError

    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except UsageError as exc:
        if args.debug:
            raise
        print(f"diffmech {_command(args)}: error: {exc}", file=sys.stderr)
        return 2
    except DiffmechError as exc:
        if args.debug:
            raise
        print(f"diffmech {_command(args)}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"diffmech {_command(args)}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # noqa: BLE001 - a user gets one line; --debug gives the traceback
        if args.debug:
            raise
        print(f"diffmech {_command(args)}: error: {type(exc).__name__}: {exc} (run 'diffmech --debug ...' for the "
              "traceback)", file=sys.stderr)
        return 1


def _dispatch(args) -> int:
    if args.command == "info":
        return _info(args)
    if args.command == "view":
        return _view(args)
    if args.command == "symo":
        from .learn.cli import main as symo_main

        return symo_main(args)
    if args.command == "sim":
        from .sim.cli import run_sim

        return run_sim(args)
    if args.command == "rl":
        from .rl.cli import main as rl_main

        return rl_main(args)
    if args.command == "eigenmode":
        from .control.cli import run_eigenmode

        return run_eigenmode(args)
    if args.command == "kernels":
        return _kernels(args)
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
