"""Eager float32 accuracy and eager speed of inverse dynamics, the mass matrix and forward dynamics.

Accuracy. For each robot, 100 seeded random states: ``q`` from ``robot.random_configuration``
(a floating base is then moved to base position ``(10, 10, 0)``, 14 m from the origin), and
``v``, ``a``, ``tau`` standard normal. The inputs are rounded to float32 once; the reference is the
float64 result of the float64 model at those rounded inputs (upcast), so input rounding is not
counted. The float32 result comes from two routes: the float64 model called with the float32
inputs (``model64``) and ``robot.to(torch.float32)`` (``model32``). The error of one state is
``max |x32 - x64| / max |x64|`` over the entries of that state's result; the figure reported is
the maximum over the 100 states. Quantities: ``ID`` (``inverse_dynamics``), ``M``
(``mass_matrix``), ``FD-aba`` and ``FD-crba`` (``forward_dynamics`` with that ``method``).

Speed. Eager calls of a float64 model (``torch.set_num_threads(2)``) at batch 1, 64 and 1024:
``ID``, ``M``, ``FD`` (``method="auto"``) and ``FD+grad`` (forward dynamics and the backward of
``qdd.square().sum()`` w.r.t. ``q``, ``v``, ``tau``). Each cell is warmed up, then the median
of repeated timed samples (each sample at least 2 ms, repeating the call) is reported, with the
fastest sample.

Results are stored per ``--label`` (e.g. ``before`` for the code before a change, ``after``) in
``benchmarks/results/eager_accuracy.json``, with the git commit of the measured code, and the
``eager_accuracy`` section of ``BENCHMARKS.md`` is rendered from every label in the file.

Usage::

    python benchmarks/bench_eager_accuracy.py --label after           # accuracy + timings (~3 min)
    python benchmarks/bench_eager_accuracy.py --label after --no-timing
    python benchmarks/bench_eager_accuracy.py --from-json              # re-render BENCHMARKS.md only
    python benchmarks/bench_eager_accuracy.py --quick                  # smoke test, writes nothing

The runs recorded in BENCHMARKS.md (``before``: the code before the change, checked out at
``/tmp/base``, e.g. ``git archive dd898de src | tar -x -C /tmp/base``)::

    PYTHONPATH=/tmp/base/src python benchmarks/bench_eager_accuracy.py --label before --commit dd898de
    python benchmarks/bench_eager_accuracy.py --label after
    python benchmarks/bench_eager_accuracy.py --label after-world --frame world
    # and the same three with --threads 1 and labels before-1t, after-1t, after-world-1t
"""

from __future__ import annotations

import argparse
import copy
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

import diffmech

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "eager_accuracy.json"
DEFAULT_MD = ROOT / "BENCHMARKS.md"
SECTION = "eager_accuracy"
BASE_POSITION = (10.0, 10.0, 0.0)

# name -> (package, relative path, floating base)
ROBOTS = {
    "iiwa": ("diff_robot_data", "kuka_iiwa/urdf/iiwa7.urdf", False),
    "allegro": ("diff_robot_data", "allegro/urdf/allegro_hand_description_left.urdf", False),
    "laikago@10m": ("pybullet_data", "laikago/laikago_toes_zup.urdf", True),
}
QUANTITIES = ("ID", "M", "FD-aba", "FD-crba")
TIMED = ("ID", "M", "FD", "FD+grad")


def robot_path(name: str) -> str:
    pkg, rel, _ = ROBOTS[name]
    if pkg == "pybullet_data":
        import pybullet_data

        root = pybullet_data.getDataPath()
    else:
        import diff_robot_data

        root = list(diff_robot_data.__path__)[0]
    return os.path.join(root, rel)


def load(name: str) -> diffmech.RobotModel:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return diffmech.load_urdf(robot_path(name), floating_base=ROBOTS[name][2])


def random_inputs(robot: diffmech.RobotModel, n: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """Seeded float64 ``q, v, a, tau`` (a floating base at :data:`BASE_POSITION`)."""
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(n, generator=g)
    if robot.floating_base:
        q[:, :3] = torch.tensor(BASE_POSITION, dtype=q.dtype)
    v = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    a = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    tau = torch.randn(n, robot.nv, generator=g, dtype=torch.float64)
    return {"q": q, "v": v, "a": a, "tau": tau}


def evaluate(robot: diffmech.RobotModel, x: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The four quantities, each flattened per state ``(n, k)``."""
    q, v, a, tau = x["q"], x["v"], x["a"], x["tau"]
    out = {
        "ID": robot.inverse_dynamics(q, v, a),
        "M": robot.mass_matrix(q),
        "FD-aba": robot.forward_dynamics(q, v, tau, method="aba"),
        "FD-crba": robot.forward_dynamics(q, v, tau, method="crba"),
    }
    return {k: t.reshape(t.shape[0], -1) for k, t in out.items()}


def relative_errors(got: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Per state ``max |got - ref| / max |ref|``, ``(n,)``."""
    return (got.double() - ref).abs().amax(-1) / ref.abs().amax(-1)


def accuracy(robot: diffmech.RobotModel, n: int = 100, seed: int = 0) -> dict[str, dict[str, float]]:
    """Maximum over ``n`` states of the per-state relative float32 error, per route and quantity."""
    x32 = {k: t.float() for k, t in random_inputs(robot, n, seed).items()}
    ref = evaluate(robot, {k: t.double() for k, t in x32.items()})
    robot32 = copy.deepcopy(robot).to(torch.float32)
    out = {}
    for route, model in (("model64", robot), ("model32", robot32)):
        got = evaluate(model, x32)
        out[route] = {k: float(relative_errors(got[k], ref[k]).max()) for k in QUANTITIES}
    return out


def time_call(fn, budget: float = 0.6, min_sample: float = 2e-3, reps: int = 7) -> dict[str, float]:
    """Median and fastest seconds per call after a warm-up (samples of at least ``min_sample``)."""
    fn()
    t0 = time.perf_counter()
    fn()
    one = max(time.perf_counter() - t0, 1e-7)
    inner = max(1, int(min_sample / one))
    samples = []
    start = time.perf_counter()
    while len(samples) < reps and (len(samples) < 3 or time.perf_counter() - start < budget):
        t0 = time.perf_counter()
        for _ in range(inner):
            fn()
        samples.append((time.perf_counter() - t0) / inner)
    return {"median_s": statistics.median(samples), "min_s": min(samples), "samples": len(samples)}


def _calls(robot: diffmech.RobotModel, x: dict[str, torch.Tensor]) -> dict:
    """The timed calls on inputs ``x``: ``name -> (function, needs a graph)``."""
    q, v, a, tau = x["q"], x["v"], x["a"], x["tau"]
    qg, vg, tg = (t.clone().requires_grad_(True) for t in (q, v, tau))

    def fd_grad():
        qdd = robot.forward_dynamics(qg, vg, tg)
        torch.autograd.grad(qdd.square().sum(), (qg, vg, tg))

    return {
        "ID": (lambda: robot.inverse_dynamics(q, v, a), False),
        "M": (lambda: robot.mass_matrix(q), False),
        "FD": (lambda: robot.forward_dynamics(q, v, tau), False),
        "FD+grad": (fd_grad, True),
    }


def timings(robot: diffmech.RobotModel, batches: list[int], budget: float) -> dict[str, dict[str, dict]]:
    out: dict[str, dict[str, dict]] = {}
    for B in batches:
        cells = {}
        for name, (fn, graph) in _calls(robot, random_inputs(robot, B, seed=1)).items():
            with torch.enable_grad() if graph else torch.no_grad():
                cells[name] = time_call(fn, budget)
        out[str(B)] = cells
    return out


def git_commit() -> str:
    """The commit of the checkout that holds the imported ``diffmech``."""
    where = Path(diffmech.__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=where, capture_output=True, text=True,
                             check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=where,
                               capture_output=True, text=True, check=True).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


# --------------------------------------------------------------------------- report


def render(data: dict) -> str:
    runs = data.get("runs", {})
    labels = list(runs)
    lines = [
        "Eager float32 error relative to float64 (100 random states, unit-scale `v`, `a`, `tau`; per state",
        "`max|x32 - x64| / max|x64|`, the maximum over states; reference: the float64 model at the float32-rounded",
        "inputs; `model64`: float64 model called with float32 inputs, `model32`: `robot.to(torch.float32)`;",
        "laikago floating base at (10, 10, 0) m). Command: `python benchmarks/bench_eager_accuracy.py --label LABEL`.",
        "",
        "| robot | route | quantity | " + " | ".join(f"{lb} ({runs[lb]['commit']})" for lb in labels) + " |",
        "| --- | --- | --- | " + " | ".join("---:" for _ in labels) + " |",
    ]
    robots = [r for r in ROBOTS if any(r in runs[lb].get("accuracy", {}) for lb in labels)]
    for r in robots:
        for route in ("model64", "model32"):
            for k in QUANTITIES:
                cells = []
                for lb in labels:
                    v = runs[lb].get("accuracy", {}).get(r, {}).get(route, {}).get(k)
                    cells.append("n/a" if v is None else f"{v:.1e}")
                lines.append(f"| {r} | {route} | {k} | " + " | ".join(cells) + " |")
    timed = [lb for lb in labels if runs[lb].get("timing")]
    for threads in sorted({runs[lb]["threads"] for lb in timed}, reverse=True):
        group = [lb for lb in timed if runs[lb]["threads"] == threads]
        base = group[0]
        lines += [
            "",
            f"Eager float64 timings, {threads} thread{'s' if threads > 1 else ''}: median of repeated samples (fastest "
            "in parentheses), microseconds per call; the last columns are the fastest samples' ratios to "
            f"`{base}`. `FD` is `method=\"auto\"`; `FD+grad` adds the backward of `qdd.square().sum()` w.r.t. "
            "`(q, v, tau)`. Machine state: " + "; ".join(f"{lb}: {runs[lb].get('machine', '')}" for lb in group) + ".",
            "",
            "| robot | batch | call | " + " | ".join(group + [f"{lb}/{base}" for lb in group[1:]]) + " |",
            "| --- | ---: | --- | " + " | ".join("---:" for _ in group + group[1:]) + " |",
        ]
        for r in robots:
            batches = sorted({int(b) for lb in group for b in runs[lb]["timing"].get(r, {})})
            for B in batches:
                for k in TIMED:
                    got = [runs[lb]["timing"].get(r, {}).get(str(B), {}).get(k) for lb in group]
                    cells = ["n/a" if c is None else f"{c['median_s'] * 1e6:.0f} ({c['min_s'] * 1e6:.0f})" for c in got]
                    ratios = ["n/a" if c is None or got[0] is None else f"{c['min_s'] / got[0]['min_s']:.2f}"
                              for c in got[1:]]
                    lines.append(f"| {r} | {B} | {k} | " + " | ".join(cells + ratios) + " |")
    return "\n".join(lines) + "\n"


def write_markdown(path: Path, body: str) -> None:
    start, end = f"<!-- {SECTION}:start -->", f"<!-- {SECTION}:end -->"
    text = path.read_text() if path.exists() else ""
    block = f"{start}\n{body}{end}"
    if start in text and end in text:
        head, rest = text.split(start, 1)
        text = head + block + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n## Eager float32 accuracy\n\n" + block + "\n"
    path.write_text(text)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--label", default="after", help="name of this run in the results file")
    ap.add_argument("--robots", default=",".join(ROBOTS))
    ap.add_argument("--batches", default="1,64,1024")
    ap.add_argument("--states", type=int, default=100)
    ap.add_argument("--budget", type=float, default=0.6, help="seconds per timed cell")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-timing", action="store_true")
    ap.add_argument("--machine", default="", help="free text stored with the timings (load, other jobs)")
    ap.add_argument("--commit", default=None, help="the commit of the measured diffmech (default: git of its checkout)")
    ap.add_argument("--json", default=str(DEFAULT_JSON))
    ap.add_argument("--markdown", default=str(DEFAULT_MD), help="'' for none")
    ap.add_argument("--from-json", action="store_true", help="only re-render the markdown from --json")
    ap.add_argument("--quick", action="store_true", help="few states, batch 1, short budget; writes nothing")
    ap.add_argument("--frame", choices=("local", "world"), default=None,
                    help="diffmech.dynamics.set_eager_frame before measuring (code that has it)")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    if args.frame is not None:
        diffmech.dynamics.set_eager_frame(args.frame)
    path = Path(args.json)
    data = json.loads(path.read_text()) if path.exists() else {"runs": {}}
    if args.from_json:
        if args.markdown:
            write_markdown(Path(args.markdown), render(data))
        return
    if args.quick:
        args.states, args.batches, args.budget = 5, "1", 0.05
    robots = args.robots.split(",")
    batches = [int(b) for b in args.batches.split(",")]
    load_avg = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    run = {
        "commit": args.commit or git_commit(), "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "torch": torch.__version__, "python": platform.python_version(), "threads": args.threads,
        "frame": args.frame or "default",
        "machine": args.machine or f"load average {load_avg:.1f} at start", "accuracy": {}, "timing": {},
    }
    for r in robots:
        robot = load(r)
        run["accuracy"][r] = acc = accuracy(robot, args.states)
        for route, errs in acc.items():
            print(f"{r:12s} {route}: " + "  ".join(f"{k}={e:.1e}" for k, e in errs.items()), flush=True)
        if not args.no_timing:
            run["timing"][r] = tm = timings(robot, batches, args.budget)
            for B, cells in tm.items():
                print(f"{r:12s} B={B:>5s}: " + "  ".join(f"{k}={c['median_s'] * 1e6:.0f}us" for k, c in cells.items()),
                      flush=True)
    if args.quick:
        return
    data.setdefault("runs", {})[args.label] = run
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n")
    if args.markdown:
        write_markdown(Path(args.markdown), render(data))


if __name__ == "__main__":
    main(sys.argv[1:])
