"""Sweeps: every (model, number of training initial conditions) run of one system, resumable.

Each run lives in ``OUT/<model>/N<n_ics>/`` (see :func:`diffmech.learn.train.run`); a run whose
``metrics.json`` exists is skipped, an interrupted one continues from its checkpoint. Runs are
spread over a local process pool by default (one thread each), or over a Ray cluster
(``backend="ray"``, the optional extra ``pip install diffmech[ray]``), by :func:`diffmech.sweeps.execute`
as the seed sweeps of the other jobs are. When all runs are done the sweep writes ``OUT/summary.csv`` and
``OUT/summary.json`` (here a list of the runs' metrics, one row per run).
"""

from __future__ import annotations

import csv
import json
import time
from dataclasses import replace
from pathlib import Path

from ..errors import DiffmechError
from .models import MODEL_NAMES
from .train import TrainConfig, _data, run

__all__ = ["sweep", "run_dir", "collect", "SUMMARY_KEYS"]

N_ICS = (8, 16, 32, 64, 128)
SUMMARY_KEYS = ("system", "model", "n_ics", "h", "train_loss", "test_loss", "integration_loss", "energy_loss",
                "inertia_loss", "integration_median", "integration_positions", "integration_positions_median",
                "energy_loss_consistent", "energy_loss_consistent_median", "energy_tracking", "energy_floor",
                "inertia_loss_predicted",
                "train_loss_positions", "test_loss_positions", "newton_iterations_mean", "train_newton_failures",
                "rollout_newton_failures", "final_lr", "adam_steps", "n_params", "train_s", "eval_s", "wall_s", "cpu_s")
# rough relative cost per epoch, to start the longest runs first
_COST = {"e2e-symo": 4.0, "lnode-rk4": 3.0, "symo": 2.0, "lnode-midpoint": 2.0, "node-rk4": 1.5, "node-midpoint": 1.0}


def run_dir(out: str | Path, model: str, n_ics: int) -> Path:
    return Path(out) / model / f"N{n_ics}"


def _run_one(folder: str, *, progress: bool | None = None, cfg: dict) -> dict:
    """One run of the sweep (called by name in the workers of :func:`diffmech.sweeps.execute`)."""
    return run(TrainConfig(**cfg), folder, resume=True, progress=progress)


def collect(out: str | Path) -> list[dict]:
    """The metrics of every finished run under ``out`` (sorted by model and N)."""
    rows = []
    for path in sorted(Path(out).glob("*/N*/metrics.json")):
        rows.append(json.loads(path.read_text()))
    order = {m: i for i, m in enumerate(MODEL_NAMES)}
    rows.sort(key=lambda r: (order.get(r.get("model"), 99), r.get("n_ics", 0)))
    return rows


def _write_summary(out: Path, rows: list[dict]) -> None:
    (out / "summary.json").write_text(json.dumps(rows, indent=1) + "\n")
    with open(out / "summary.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(SUMMARY_KEYS), extrasaction="ignore")
        w.writeheader()
        for r in rows:
            w.writerow({k: r.get(k) for k in SUMMARY_KEYS})


def sweep(base: TrainConfig, out: str | Path, *, models=MODEL_NAMES, n_ics=N_ICS, workers: int | None = None,
          backend: str = "local", threads: int = 1, nice: int = 0, progress: bool | None = None,
          address: str | None = None) -> list[dict]:
    """Run (or resume) ``models x n_ics`` runs of ``base`` into ``out`` and return all their metrics.

    Args:
        base: configuration shared by the runs (its ``model`` and ``n_ics`` are replaced).
        out: sweep folder.
        models, n_ics: the grid.
        workers: parallel runs (default: the machine's CPU count); ``1`` runs in this process.
        backend: ``"local"`` (process pool) or ``"ray"`` (needs ``ray``).
        threads: torch threads per run.
        nice: added niceness of the worker processes.
        progress: the bar over the runs (default: on a terminal); per-run bars only with ``workers=1``.
        address: the Ray cluster (:func:`diffmech.sweeps.execute`): default ``RAY_ADDRESS`` or a new
            local one.
    """
    from ..sweeps import Run, check_out, execute

    out = check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    for m in models:
        if m not in MODEL_NAMES:
            raise DiffmechError(f"sweep: unknown model {m!r}; choose from {', '.join(MODEL_NAMES)}")
    _data(replace(base, n_ics=max(n_ics)).resolved())  # generate (and cache) the data once, before the workers
    runs = []
    for m in models:
        for n in n_ics:
            folder = run_dir(out, m, n).relative_to(out).as_posix()
            runs.append(Run(folder, "diffmech.learn.sweep:_run_one", {"cfg": replace(base, model=m, n_ics=n).to_json()},
                            {"model": m, "n_ics": n}, _COST.get(m, 1.0) * (1 + n / 64)))
    t0 = time.perf_counter()
    outcomes = execute(runs, out, workers=workers, backend=backend, address=address, threads=threads, nice=nice,
                       progress=progress, desc=f"sweep {base.system}")
    errors = [f"{out / o.run.name}: {o.error}" for o in outcomes if o.status == "failed"]
    rows = collect(out)
    _write_summary(out, rows)
    (out / "sweep.json").write_text(json.dumps({"base": base.to_json(), "models": list(models), "n_ics": list(n_ics),
                                                "workers": workers, "backend": backend, "threads": threads,
                                                "session_wall_s": time.perf_counter() - t0, "errors": errors},
                                               indent=1) + "\n")
    if errors:
        raise DiffmechError(f"sweep: {len(errors)} run(s) failed:\n" + "\n".join(errors))
    return rows
