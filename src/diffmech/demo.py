"""A tour of the rigid-body core on every robot at hand, with a consistency check and a report.

``diffmech demo --out results/demo`` (or ``python -m diffmech demo``):

1. builds the bundled systems of :mod:`diffmech.model.systems` and loads every robot description it
   finds installed (differentiable-robot-model's ``diff_robot_data`` arms and hands, and
   ``pybullet_data``'s laikago quadruped on a floating base), skipping those whose package is
   missing;
2. checks on a batch of random states that forward dynamics inverts inverse dynamics,
   ``forward_dynamics(q, v, inverse_dynamics(q, v, a)) == a`` (joint damping and springs
   included), and fails with :class:`RoundTripError` if it does not;
3. sweeps every joint together from its lower to its upper limit and records the condition number
   of the mass matrix and the gravity torques along the way;
4. prints a table and writes ``report.json`` and one PNG per robot into the output folder.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from .errors import DiffmechError
from .model import RobotModel, load_urdf, systems

__all__ = ["RoundTripError", "RobotEntry", "available_robots", "roundtrip_error", "sweep", "run_demo", "joint_groups",
           "sweep_figure"]


class RoundTripError(DiffmechError):
    """``forward_dynamics(inverse_dynamics(a))`` did not return ``a`` within tolerance."""


@dataclass(frozen=True)
class RobotEntry:
    """A robot the demo knows how to build.

    Attributes:
        name: short name used on the command line.
        package: Python package that must be importable (``None`` for the bundled systems).
        build: returns the model (called only when ``package`` is importable).
        description: one line for listings.
    """

    name: str
    package: str | None
    build: Callable[[], RobotModel]
    description: str

    def available(self) -> bool:
        return self.package is None or importlib.util.find_spec(self.package) is not None


def _package_dir(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise DiffmechError(f"package '{package}' is not installed")
    return list(spec.submodule_search_locations)[0]


def _urdf(package: str, relpath: str, floating_base: bool = False) -> Callable[[], RobotModel]:
    def build() -> RobotModel:
        return load_urdf(os.path.join(_package_dir(package), relpath), floating_base=floating_base)

    return build


def available_robots() -> dict[str, RobotEntry]:
    """Every robot the demo knows, by name, bundled systems first (installed or not)."""
    drd = "diff_robot_data"
    entries = [
        RobotEntry("pendulum", None, systems.pendulum, "simple pendulum, 1 kg bob on a 1 m rod"),
        RobotEntry("double_pendulum", None,
                   lambda: systems.double_pendulum(stiffness=(2.0, 1.0), rest=(0.0, 0.3), damping=0.05),
                   "double pendulum with joint springs and damping"),
        RobotEntry("4_link_pendulum", None, lambda: systems.n_link_pendulum(4, lengths=(0.4, 0.3, 0.3, 0.2)),
                   "planar 4-link pendulum"),
        RobotEntry("cartpole", None, systems.cartpole, "cart on a rail with a pendulum pole"),
        RobotEntry("acrobot", None, systems.acrobot, "two uniform rods, shoulder and elbow"),
        RobotEntry("iiwa", drd, _urdf(drd, "kuka_iiwa/urdf/iiwa7.urdf"), "KUKA LBR iiwa 7 arm"),
        RobotEntry("panda", drd, _urdf(drd, "panda_description/urdf/panda_no_gripper.urdf"),
                   "Franka Emika Panda arm"),
        RobotEntry("allegro", drd, _urdf(drd, "allegro/urdf/allegro_hand_description_left.urdf"),
                   "Allegro hand (left), 4 fingers"),
        RobotEntry("fetch_arm", drd, _urdf(drd, "fetch_description/urdf/fetch_arm_no_gripper.urdf"), "Fetch arm"),
        RobotEntry("trifinger", drd, _urdf(drd, "trifinger_edu_description/trifinger_edu.urdf"),
                   "TriFinger Edu, 3 fingers"),
        RobotEntry("jaco", drd, _urdf(drd, "kinova_description/urdf/jaco_clean.urdf"), "Kinova Jaco arm"),
        RobotEntry("laikago", "pybullet_data", _urdf("pybullet_data", "laikago/laikago_toes_zup.urdf", True),
                   "Laikago quadruped, floating base"),
    ]
    return {e.name: e for e in entries}


# ---------------------------------------------------------------------------- checks and sweeps
def roundtrip_error(robot: RobotModel, batch: int, *, generator: torch.Generator | None = None) -> dict:
    """Compare ``forward_dynamics(inverse_dynamics(q, v, a))`` with ``a`` on random states.

    ``q`` from :meth:`RobotModel.random_configuration`, ``v`` and ``a`` standard normal; passive
    joint terms are on in both directions.

    Returns:
        ``max_abs_err`` (max over the batch and coordinates of ``|a' - a|``), ``max_rel_err``
        (the same divided by ``max(1, |a|)`` of that state), ``max_abs_a``, ``batch``.
    """
    kw = dict(dtype=robot.dtype, device=robot.device)
    q = robot.random_configuration(batch, generator=generator)
    v = torch.randn(batch, robot.nv, generator=generator, **kw)
    a = torch.randn(batch, robot.nv, generator=generator, **kw)
    with torch.no_grad():
        tau = robot.inverse_dynamics(q, v, a)
        a2 = robot.forward_dynamics(q, v, tau)
    err = (a2 - a).abs()
    scale = a.abs().amax(-1, keepdim=True).clamp_min(1.0)
    return {
        "max_abs_err": float(err.max()), "max_rel_err": float((err / scale).max()),
        "max_abs_a": float(a.abs().max()), "batch": batch,
    }


def _sweep_bounds(robot: RobotModel) -> tuple[torch.Tensor, torch.Tensor]:
    lim = robot.joint_limits()
    lo, hi = lim["lower"].to(torch.float64), lim["upper"].to(torch.float64)
    pris = torch.tensor([t == "prismatic" for t in robot.joint_types], dtype=torch.bool)
    # Unbounded joints sweep one turn (revolute) or one metre each way (prismatic).
    span = torch.where(pris, torch.ones_like(lo), torch.full_like(lo, math.pi))
    lo = torch.where(torch.isfinite(lo), lo, -span)
    hi = torch.where(torch.isfinite(hi), hi, span)
    return lo, hi


def sweep(robot: RobotModel, points: int) -> dict:
    """Move every joint together from its lower to its upper limit.

    At fraction ``s`` in ``[0, 1]`` joint ``j`` sits at ``lower_j + s (upper_j - lower_j)``
    (unbounded joints use ``[-pi, pi]`` rad or ``[-1, 1]`` m); a floating base stays at the
    origin with identity orientation.

    Returns:
        ``s (points,)``, ``q (points, nq)``, ``mass_matrix_cond (points,)`` (2-norm condition
        number of ``M(q)``), ``gravity (points, nv)`` (generalised gravity ``g(q)``, N m or N),
        ``lower``/``upper`` used, as lists.
    """
    kw = dict(dtype=robot.dtype, device=robot.device)
    lo, hi = (t.to(**kw) for t in _sweep_bounds(robot))
    s = torch.linspace(0.0, 1.0, points, **kw)
    qj = lo + s[:, None] * (hi - lo)
    q = torch.cat([robot.neutral_configuration()[: robot.nq - robot.nj].expand(points, -1), qj], -1)
    with torch.no_grad():
        M = robot.mass_matrix(q)
        g = robot.generalized_gravity(q)
    eig = torch.linalg.eigvalsh(M)  # M is symmetric positive definite: cond = max/min eigenvalue
    cond = eig[:, -1] / eig[:, 0]
    return {
        "s": s.tolist(), "q": q.tolist(), "mass_matrix_cond": cond.tolist(), "gravity": g.tolist(),
        "lower": lo.tolist(), "upper": hi.tolist(),
    }


def _coordinate_names(robot: RobotModel) -> list[str]:
    base = ["base_vx", "base_vy", "base_vz", "base_wx", "base_wy", "base_wz"] if robot.floating_base else []
    return base + list(robot.joint_names)


def joint_groups(robot: RobotModel) -> list[tuple[str, list[int]]]:
    """The moving joints grouped by limb: ``[(label, [indices into robot.joint_names]), ...]``.

    A limb is an unbranched chain of one-DoF bodies: a joint belongs to the limb of the topmost
    body above it whose parent (a body or the world) carries more than one chain. An arm is one
    limb; a hand has one per finger (and its wrist joints, if any, form another); a quadruped one
    per leg. The label is what the group's joint names share and the others' do not (``"FR"`` for
    laikago's front right leg), else its number and first and last joint (``"1: joint_0.0 ...
    joint_3.0"``).
    Groups come in ``joint_names`` order; mimic joints (not coordinates) are left out.
    """
    import re

    tree = robot.tree
    nfree = tree.nfree
    body_of = {tree.all_joint_names[k]: b + nfree for b, k in enumerate(tree.body_joint)}
    children: dict[int, int] = {}
    for b in range(tree.nb):
        children[tree.body_parent[b]] = children.get(tree.body_parent[b], 0) + 1

    def top(b: int) -> int:
        # Up while the parent is a one-DoF body with this chain as its only child.
        while (p := tree.body_parent[b]) >= nfree and children.get(p, 0) == 1:
            b = p
        return b

    groups: dict[int, list[int]] = {}
    for i, name in enumerate(robot.joint_names):
        groups.setdefault(top(body_of[name]), []).append(i)
    tokens = lambda n: set(t for t in re.split(r"[_\-. /]+", n) if t)  # noqa: E731
    names = robot.joint_names
    common_all = set.intersection(*(tokens(n) for n in names)) if names else set()
    out = []
    for idx in groups.values():
        own = set.intersection(*(tokens(names[i]) for i in idx)) - common_all
        # Keep the shared tokens in the order they appear in the first joint's name.
        shared = [t for t in re.split(r"[_\-. /]+", names[idx[0]]) if t in own]
        k = len(out) + 1
        span = names[idx[0]] if len(idx) == 1 else f"{names[idx[0]]} ... {names[idx[-1]]}"
        label = " ".join(dict.fromkeys(shared)) if shared and len(groups) > 1 else f"{k}: {span}"
        out.append((label, idx))
    return out


def sweep_figure(name: str, robot: RobotModel, data: dict):
    """The demo's plot of a :func:`sweep` as a matplotlib ``Figure``: cond M(q), the floating
    base's gravity wrench (a force panel [N] and a torque panel [N m]), and the joints' gravity
    torques in one panel per limb (:func:`joint_groups`; two columns beyond two limbs), each legend
    beside its panel."""
    # The object-oriented API leaves pyplot's global backend alone: works headless.
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    g = torch.tensor(data["gravity"])
    s = data["s"]
    nbase = 6 if robot.floating_base else 0
    groups = joint_groups(robot)
    ncols = 2 if len(groups) > 2 else 1
    group_rows = -(-len(groups) // ncols)
    rows = 1 + (1 if nbase else 0) + group_rows
    fig = Figure(figsize=(7.5 + 5.0 * (ncols - 1), 2.3 * rows + 0.7), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(rows, ncols)
    ax0 = fig.add_subplot(grid[0, :])
    ax0.semilogy(s, data["mass_matrix_cond"], color="k")
    ax0.set_ylabel("cond M(q)")
    ax0.set_title("mass-matrix condition number", fontsize=9, loc="left")
    axes = [ax0]

    def legend(ax, n):
        ax.legend(fontsize=7, ncol=1 if n <= 8 else 2, loc="center left", bbox_to_anchor=(1.01, 0.5), frameon=False)

    row = 1
    if nbase:
        # g(q)'s first six entries are the wrench that holds the base against gravity, in the base
        # frame: force (linear rows) and torque (angular rows) have different units, hence two panels.
        pair = grid[row, :].subgridspec(1, 2)
        for col, (title, unit, sym) in enumerate((("force", "N", "F"), ("torque", "N m", "M"))):
            ax = fig.add_subplot(pair[0, col], sharex=ax0)
            for i, c in enumerate("xyz"):
                ax.plot(s, g[:, 3 * col + i].tolist(), label=f"{sym}_{c}", linewidth=1.2)
            ax.set_title(f"base gravity wrench: {title} (base frame)", fontsize=9, loc="left")
            ax.set_ylabel(f"{title} [{unit}]")
            legend(ax, 3)
            axes.append(ax)
        row += 1
    for n, (label, idx) in enumerate(groups):
        ax = fig.add_subplot(grid[row + n // ncols, n % ncols], sharex=ax0)
        types = {robot.joint_types[i] for i in idx}
        mixed = "prismatic" in types and len(types) > 1
        unit = "N" if types == {"prismatic"} else "N m | N" if mixed else "N m"
        for i, j in enumerate(idx):
            suffix = f" [{'N' if robot.joint_types[j] == 'prismatic' else 'N m'}]" if mixed else ""
            # Dashed once the 10-colour cycle repeats, so every curve stays identifiable.
            ax.plot(s, g[:, nbase + j].tolist(), label=robot.joint_names[j] + suffix, linewidth=1.2,
                    linestyle="-" if i < 10 else "--")
        ax.set_title(f"gravity torque, limb {label}" if len(groups) > 1 else "joint gravity torque", fontsize=9,
                     loc="left")
        ax.set_ylabel(f"[{unit}]")
        legend(ax, len(idx))
        if n + ncols >= len(groups):  # the lowest panel of its column
            ax.set_xlabel("sweep fraction s  (joint j at lower_j + s (upper_j - lower_j))")
        axes.append(ax)
    for ax in axes:
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle(f"{name} ({robot.name}, nq={robot.nq}, nv={robot.nv}): all joints swept together")
    return fig


def _plot(name: str, robot: RobotModel, data: dict, path: Path) -> None:
    sweep_figure(name, robot, data).savefig(path, dpi=100)


# ---------------------------------------------------------------------------- table
def _joint_types(robot: RobotModel) -> str:
    counts = dict(robot.summary()["joint_types"])
    if robot.floating_base:
        counts = {"free": 1, **counts}
    return " ".join(f"{k}:{v}" for k, v in counts.items())


_COLUMNS = ("robot", "links", "DoF (nq/nv)", "total mass [kg]", "joint types", "max |fd(id(a)) - a|")


def _rows(results: dict) -> list[tuple[str, ...]]:
    return [
        (name, str(r["links"]), f"{r['nq']}/{r['nv']}", f"{r['total_mass']:.3f}", r["joint_type_counts"],
         f"{r['roundtrip']['max_abs_err']:.2e}")
        for name, r in results.items()
    ]


def robot_row(robot: RobotModel, batch: int, generator: torch.Generator | None = None) -> dict:
    """What the table shows of one robot: sizes, mass, joint types and the round-trip error."""
    summary = robot.summary()
    return {"source": robot.source, "links": summary["links"], "bodies": summary["bodies"], "nq": robot.nq,
            "nv": robot.nv, "floating_base": robot.floating_base, "total_mass": summary["total_mass"],
            "joint_types": summary["joint_types"], "joint_type_counts": _joint_types(robot),
            "joint_names": list(robot.joint_names), "roundtrip": roundtrip_error(robot, batch, generator=generator)}


def format_table(results: dict) -> str:
    """Plain aligned text table of the per-robot results."""
    rows = [_COLUMNS, *_rows(results)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    right = {1, 2, 3, 5}
    fmt = lambda row: "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))  # noqa: E731
    lines = [fmt(rows[0]), "  ".join("-" * w for w in widths)] + [fmt(r) for r in rows[1:]]
    return "\n".join(lines)


def print_table(results: dict, title: str = "diffmech demo") -> None:
    """Print the table with ``rich`` when it is installed, else as plain text."""
    if importlib.util.find_spec("rich") is not None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=title)
        for i, col in enumerate(_COLUMNS):
            table.add_column(col, justify="right" if i in (1, 2, 3, 5) else "left")
        for row in _rows(results):
            table.add_row(*row)
        Console().print(table)
    else:
        print(format_table(results))


# ---------------------------------------------------------------------------- driver
def run_demo(
    out: str | os.PathLike = "results/demo",
    robots: Sequence[str] | None = None,
    *,
    batch: int = 128,
    points: int = 101,
    seed: int = 0,
    tol: float = 1e-8,
    plots: bool = True,
    progress: bool = True,
    echo: bool = True,
) -> dict:
    """Run the demo and write ``report.json`` (and ``<robot>.png`` files) into ``out``.

    Args:
        out: output folder (created).
        robots: names from :func:`available_robots`; ``None`` for all. Robots whose package is
            not installed are skipped and listed under ``skipped`` in the report.
        batch: random states per robot for the round-trip check.
        points: configurations along each sweep.
        seed: seed of the random states.
        tol: largest accepted relative round-trip error ``|a' - a| / max(1, |a|)``.
        plots: write the PNG plots.
        progress: show a tqdm progress bar (on stderr).
        echo: print the table.

    Returns:
        The report (as written to ``report.json``).

    Raises:
        DiffmechError: an unknown robot name.
        RoundTripError: a robot failed the round-trip check (after the report is written).
    """
    from tqdm import tqdm

    known = available_robots()
    names = list(known) if robots is None else list(robots)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise DiffmechError(f"unknown robot(s) {unknown}; choose from {list(known)}")
    if batch < 1 or points < 2:
        raise DiffmechError(f"need batch >= 1 and points >= 2, got batch={batch}, points={points}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(seed)
    results: dict[str, dict] = {}
    skipped: dict[str, str] = {}
    failures: list[str] = []
    t_start = time.perf_counter()
    bar = tqdm(names, desc="diffmech demo", unit="robot", disable=None if progress else True)
    for name in bar:
        bar.set_postfix_str(name)
        entry = known[name]
        if not entry.available():
            skipped[name] = f"package '{entry.package}' is not installed"
            continue
        t0 = time.perf_counter()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*has no <inertial>.*")
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            robot = entry.build()
        t_load = time.perf_counter() - t0
        t0 = time.perf_counter()
        row = robot_row(robot, batch, gen)
        t_rt = time.perf_counter() - t0
        rt = row.pop("roundtrip")
        rt["ok"] = bool(rt["max_rel_err"] <= tol)
        if not rt["ok"]:
            failures.append(f"{name}: max |fd(id(a)) - a| = {rt['max_abs_err']:.3e} "
                            f"(relative {rt['max_rel_err']:.3e} > tol {tol:.1e})")
        sw = sweep(robot, points)
        rec = {
            "description": entry.description, **row,
            "coordinates_v": _coordinate_names(robot), "roundtrip": rt, "sweep": sw,
            "sweep_summary": {
                "cond_min": min(sw["mass_matrix_cond"]), "cond_max": max(sw["mass_matrix_cond"]),
                "max_abs_gravity": max(abs(x) for row in sw["gravity"] for x in row),
            },
            "seconds": {"load": t_load, "roundtrip": t_rt},
        }
        if plots:
            png = out / f"{name}.png"
            _plot(name, robot, sw, png)
            rec["plot"] = png.name
        results[name] = rec
    bar.close()
    report = {
        "diffmech_version": _version(), "torch_version": torch.__version__, "dtype": "float64", "seed": seed,
        "batch": batch, "points": points, "tolerance_rel": tol, "ok": not failures, "failures": failures,
        "skipped": skipped, "seconds_total": time.perf_counter() - t_start, "robots": results,
    }
    (out / "report.json").write_text(json.dumps(report, indent=1))
    if echo:
        print_table(results)
        for name, why in skipped.items():
            print(f"skipped {name}: {why}")
        print(f"report: {out / 'report.json'}")
    if failures:
        raise RoundTripError("forward_dynamics(inverse_dynamics(a)) != a for " + "; ".join(failures))
    return report


def _version() -> str:
    from . import __version__

    return __version__
