"""Build the native kernels a robot or a scene will use, ahead of time (``diffmech kernels build``).

A first native call builds its kernels (seconds for a small tree, minutes for the Ant's contact step);
:func:`prebuild` does that once, before a job that should not pay it, e.g. on a cluster's head node
before a sweep or in a container image. Kernels are stored in the cache of
:func:`~diffmech.dynamics.kernel_store.cache_root` (``$DIFFMECH_CACHE_DIR``) and found there by every
later process on the machine.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

import torch

from . import _log
from .dynamics import kernels
from .dynamics.kernel_store import cache_root
from .errors import OptionError

__all__ = ["SCENES", "PrebuildReport", "prebuild", "stored_kernels"]

log = _log.get("prebuild")

# The ready-made scenes of diffmech.sim.scenes a target may name ("ant" is also diffmech.rl.Ant's scene).
SCENES = ("laikago", "ant", "racecar", "golf", "panda_throw")
_DTYPES = {"float64": torch.float64, "float32": torch.float32}


@dataclass(frozen=True)
class PrebuildReport:
    """What :func:`prebuild` did for one target.

    Attributes:
        target: the URDF path or scene name.
        built: names of the kernels compiled now (empty where all were stored already).
        route: the contact step's route for a scene (``"native"``, or ``"torch: <why>"``), else ``None``.
        seconds: wall time.
    """

    target: str
    built: tuple[str, ...]
    route: str | None
    seconds: float


def stored_kernels() -> list[dict]:
    """The kernels in the cache: one dict per kernel (``name``, ``size`` in bytes, ``created`` as a Unix
    time, ``compile_seconds`` where recorded, ``file``)."""
    root = cache_root()
    rows = []
    for side in sorted(root.glob("*.json")):
        try:
            rec = json.loads(side.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and "name" in rec:
            name = str(rec["name"])
            if name.startswith("native kernel '") and name.endswith("'"):  # the store's label of it
                name = name[len("native kernel '"):-1]
            rows.append({"name": name, "size": rec.get("size"), "created": rec.get("created"),
                         "compile_seconds": rec.get("compile_seconds"), "file": str(side.with_suffix(".so"))})
    return rows


def _names() -> dict[str, str]:
    return {row["file"]: row["name"] for row in stored_kernels()}


def prebuild(target: str, *, floating_base: bool = False, dtypes=("float64",), parameters: bool = False,
             contact: bool = False) -> PrebuildReport:
    """Build and store the native kernels ``target`` uses.

    Args:
        target: a URDF file, or the name of a scene in :mod:`diffmech.sim.scenes` (:data:`SCENES`).
        floating_base: a URDF's root joined to the world by a free joint.
        dtypes: ``"float64"`` and/or ``"float32"``.
        parameters: also the kernels of gradients with respect to the inertial parameters (a URDF:
            masses, centres of mass, inertias; a scene: every link mass made learnable).
        contact: a URDF: also the kernels of its contact step on the ground (``Scene([robot])``,
            from the neutral configuration placed on the ground).

    A scene's kernels are those of a two-step rollout and its backward (the contact step's forward
    and reverse), in each dtype.

    Raises:
        OptionError: an unknown scene or dtype, a missing file.
        NativeUnavailable: no C compiler, or a failed build.
    """
    bad = [d for d in dtypes if d not in _DTYPES]
    if bad or not dtypes:
        raise OptionError(f"prebuild: dtypes must be among {tuple(_DTYPES)}, got {list(dtypes)}")
    start = time.perf_counter()
    before = _names()
    route = None
    is_file = target.endswith((".urdf", ".URDF", ".xml")) or os.path.sep in target or os.path.exists(target)
    if is_file:
        if not os.path.isfile(target):
            raise OptionError(f"prebuild: no file {target!r}")
        from .model import load_urdf

        for name in dtypes:
            robot = load_urdf(target, floating_base=floating_base, dtype=_DTYPES[name])
            log.info("%s (%s): dynamics kernels", robot.name, name)
            kernels.prepare(robot, dtypes=(_DTYPES[name],), parameters=parameters)
            if contact:
                from .sim import Scene

                scene = Scene([robot])
                q0 = scene.neutral_configuration()
                if floating_base:
                    q0 = scene.place_on_ground(q0)
                route = _step_twice(scene, q0, torch.zeros(scene.nv, dtype=_DTYPES[name]), parameters)
    else:
        if target not in SCENES:
            raise OptionError(f"prebuild: {target!r} is neither a file nor a scene; scenes: {', '.join(SCENES)}")
        from .sim import scenes

        for name in dtypes:
            scene, q0, v0 = getattr(scenes, target)(dtype=_DTYPES[name])
            log.info("scene %s (%s): contact step kernels", target, name)
            route = _step_twice(scene, q0, v0, parameters)
    after = _names()
    built = tuple(sorted(after[f] for f in after.keys() - before.keys()))
    return PrebuildReport(target, built, route, time.perf_counter() - start)


def _step_twice(scene, q0, v0, parameters: bool) -> str:
    """Build the kernels of ``scene``'s contact step (with the inertial-parameter reverse mode if
    ``parameters``), then run a two-step rollout and its backward, which builds the rest (the contact
    solve, the update, the driver); returns the rollout's route."""
    from .sim import rollout
    from .sim._ground_step import prepare_ground_kernels

    prepare_ground_kernels(scene, dtypes=(q0.dtype,), parameters=parameters)
    v0 = v0.detach().clone().requires_grad_(True)
    stats: dict = {}
    with kernels.native_mode("build"):
        # the kernels take dt as an input: any step builds the ones every dt uses
        q, _ = rollout(scene, q0, v0, torch.zeros(2, scene.nv, dtype=q0.dtype), 1e-3, stats=stats)
        q[-1].sum().backward()
    if stats.get("route") != "native":
        log.warning("the contact step of this scene runs on %s; only its dynamics kernels are built",
                    stats.get("route"))
    return stats.get("route")


def _human_size(n: int | None) -> str:
    if n is None:
        return "?"
    return f"{n / 1024:.0f} kB" if n < 1 << 20 else f"{n / (1 << 20):.1f} MB"


def describe(rows: list[dict]) -> str:
    """A table of :func:`stored_kernels`' rows."""
    lines = [f"{'kernel':60s} {'size':>8s} {'compile':>8s}  created"]
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])) if r.get("created") else "?"
        sec = f"{r['compile_seconds']:.1f} s" if r.get("compile_seconds") is not None else "-"
        lines.append(f"{r['name'][:60]:60s} {_human_size(r.get('size')):>8s} {sec:>8s}  {when}")
    lines.append(f"{len(rows)} kernels in {cache_root()}")
    return "\n".join(lines)
