"""Sweeps: every (model, number of training initial conditions) run of one system, resumable.

Each run lives in ``OUT/<model>/N<n_ics>/`` (see :func:`diffmech.learn.train.run`); a run whose
``metrics.json`` exists is skipped, an interrupted one continues from its checkpoint. Runs are
spread over a local process pool by default (one thread each), or over a Ray cluster
(``backend="ray"``, the optional extra ``pip install diffmech[ray]``). When all runs are done
the sweep writes ``OUT/summary.csv`` and ``OUT/summary.json``.
"""

from __future__ import annotations

import concurrent.futures as cf
import csv
import json
import multiprocessing as mp
import os
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


def _worker(cfg_dict: dict, folder: str, threads: int, nice: int, progress: bool | None) -> dict:
    import torch

    if nice:
        os.nice(nice)
    torch.set_num_threads(threads)
    metrics_path = Path(folder) / "metrics.json"
    if metrics_path.exists():
        return json.loads(metrics_path.read_text())
    return run(TrainConfig(**cfg_dict), folder, resume=True, progress=progress)


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
          backend: str = "local", threads: int = 1, nice: int = 0, progress: bool | None = None) -> list[dict]:
    """Run (or resume) ``models x n_ics`` runs of ``base`` into ``out`` and return all their metrics.

    Args:
        base: configuration shared by the runs (its ``model`` and ``n_ics`` are replaced).
        out: sweep folder.
        models, n_ics: the grid.
        workers: parallel runs (default: the machine's CPU count); ``1`` runs in this process.
        backend: ``"local"`` (process pool) or ``"ray"`` (needs ``ray``; ``ray.init()`` connects to
            ``RAY_ADDRESS`` or starts a local cluster).
        threads: torch threads per run.
        nice: added niceness of the worker processes.
        progress: per-run progress bars (default: only with ``workers=1`` on a terminal).
    """
    from tqdm.auto import tqdm

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for m in models:
        if m not in MODEL_NAMES:
            raise DiffmechError(f"sweep: unknown model {m!r}; choose from {', '.join(MODEL_NAMES)}")
    _data(replace(base, n_ics=max(n_ics)).resolved())  # generate (and cache) the data once, before the workers
    jobs = []
    for m in models:
        for n in n_ics:
            cfg = replace(base, model=m, n_ics=n)
            jobs.append((cfg.to_json(), str(run_dir(out, m, n))))
    todo = [j for j in jobs if not (Path(j[1]) / "metrics.json").exists()]
    todo.sort(key=lambda j: -_COST.get(j[0]["model"], 1.0) * (1 + j[0]["n_ics"] / 64))
    workers = workers or os.cpu_count() or 1
    t0 = time.perf_counter()
    bar = tqdm(total=len(jobs), initial=len(jobs) - len(todo), desc=f"sweep {base.system}", dynamic_ncols=True,
                disable=None)
    errors = []
    if backend == "ray":
        try:
            import ray
        except ImportError:
            raise DiffmechError("sweep(backend='ray') needs Ray: pip install 'diffmech[ray]'") from None
        if not ray.is_initialized():
            ray.init()
        remote = ray.remote(num_cpus=threads)(_worker)
        pending = {remote.remote(c, d, threads, nice, False): d for c, d in todo}
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1)
            d = pending.pop(done[0])
            try:
                ray.get(done[0])
            except Exception as exc:  # noqa: BLE001 - reported below with the run folder
                errors.append(f"{d}: {exc}")
            bar.update(1)
    elif backend == "local":
        if workers == 1:
            for c, d in todo:
                try:
                    _worker(c, d, threads, nice, progress)
                except DiffmechError as exc:
                    errors.append(f"{d}: {exc}")
                bar.update(1)
        else:
            with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn")) as ex:
                futs = {ex.submit(_worker, c, d, threads, nice, False): d for c, d in todo}
                for f in cf.as_completed(futs):
                    try:
                        f.result()
                    except Exception as exc:  # noqa: BLE001 - reported below with the run folder
                        errors.append(f"{futs[f]}: {exc}")
                    bar.update(1)
    else:
        raise DiffmechError(f"sweep: backend must be 'local' or 'ray', got {backend!r}")
    bar.close()
    rows = collect(out)
    _write_summary(out, rows)
    (out / "sweep.json").write_text(json.dumps({"base": base.to_json(), "models": list(models), "n_ics": list(n_ics),
                                                "workers": workers, "backend": backend, "threads": threads,
                                                "session_wall_s": time.perf_counter() - t0, "errors": errors},
                                               indent=1) + "\n")
    if errors:
        raise DiffmechError(f"sweep: {len(errors)} run(s) failed:\n" + "\n".join(errors))
    return rows
