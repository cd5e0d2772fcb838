"""Sweeps: many runs of one job (seeds, or a grid of settings), resumable, on a local process pool or Ray.

Used by ``diffmech rl sweep``, ``diffmech eigenmode sweep`` and ``diffmech symo sweep``. Each run is
named by its folder under the sweep's ``--out``; a run whose ``metrics.json`` exists is finished and
is not run again, so an interrupted sweep continues where it stopped (and seeds can be added later).

Backends:

* ``local`` (default): a process pool (``concurrent.futures`` with the ``spawn`` start method, so
  workers do not inherit the parent's torch threads or open files); ``workers=1`` runs in this
  process.
* ``ray``: each run is a Ray task. It runs in a scratch folder of the worker's machine and sends the
  run's files back, which the driver writes under ``--out``: a cluster needs no shared file system,
  only diffmech (and the job's extras) installed on every machine.

Jobs are named ``"module:function"`` rather than passed as functions so that the spawn workers and
the Ray workers import them by name; each is called as ``function(folder, progress=..., **kwargs)``,
writes ``metrics.json`` into ``folder`` and returns the metrics.

The seed sweeps also write ``summary.json`` (per-run rows and mean, std, min and max of each numeric
metric, nested metrics flattened as ``outer.inner``), print one table and draw ``summary.png``.
"""

from __future__ import annotations

import argparse
import csv
import importlib
import json
import logging
import math
import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import _log
from .errors import DiffmechError

__all__ = ["Run", "Outcome", "BACKENDS", "execute", "summarize", "format_table", "plot_summary",
           "seed_sweep", "add_sweep_options", "parse_seeds", "flatten_numeric"]

log = logging.getLogger("diffmech.sweeps")

BACKENDS = ("local", "ray")
# Options that change how a run is shown or scheduled, not what it computes: a rerun may change them.
_PRESENTATION = ("no_progress", "no_plots", "threads")


@dataclass
class Run:
    """One run of a sweep: ``target(OUT/name, progress=..., **kwargs)``."""

    name: str
    target: str
    kwargs: dict = field(default_factory=dict)
    labels: dict = field(default_factory=dict)
    cost: float = 1.0


@dataclass
class Outcome:
    run: Run
    status: str  # "done", "skipped" (metrics.json was there) or "failed"
    seconds: float = 0.0
    error: str | None = None
    node: str | None = None  # the Ray node that ran it (its hex id); None on the local backend


# ---------------------------------------------------------------------------- workers
def _call(target: str, folder: str, kwargs: dict, threads: int, nice: int, progress: bool | None) -> dict:
    import torch

    if nice:
        os.nice(nice)
    torch.set_num_threads(threads)
    module, _, name = target.partition(":")
    fn = getattr(importlib.import_module(module), name)
    return fn(folder, progress=progress, **kwargs)


def _timed(target: str, folder: str, kwargs: dict, threads: int, nice: int, progress: bool | None) -> float:
    # the worker's own clock: in a pool, the driver only sees when a result arrives
    t0 = time.perf_counter()
    _call(target, folder, kwargs, threads, nice, progress)
    return time.perf_counter() - t0


def _pack(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _unpack(files: dict[str, bytes], folder: Path) -> None:
    # metrics.json last: a driver killed while writing must not leave a run that looks finished
    for rel in sorted(files, key=lambda r: r == "metrics.json"):
        path = folder / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[rel])


def _ray_call(target: str, name: str, kwargs: dict, threads: int,
              files: dict[str, bytes]) -> tuple[dict[str, bytes], float, str]:
    import ray

    with tempfile.TemporaryDirectory(prefix="diffmech-sweep-") as tmp:
        folder = Path(tmp) / name
        folder.mkdir(parents=True)
        _unpack(files, folder)  # an interrupted run's checkpoint, for jobs that resume
        seconds = _timed(target, str(folder), kwargs, threads, 0, False)
        # which machine ran it: sweep.json keeps it, for a run to look into on a cluster
        return _pack(folder), seconds, ray.get_runtime_context().get_node_id()


def _ray_init(address: str | None, workers: int | None):
    try:
        import ray
    except ImportError:
        raise DiffmechError("--backend ray needs Ray: pip install 'diffmech[ray]'") from None
    if ray.is_initialized():
        return ray, False
    try:
        if address or os.environ.get("RAY_ADDRESS"):
            ray.init(address=address)
        else:
            # a private local cluster no larger than asked, without the dashboard's extra processes
            ray.init(num_cpus=workers, include_dashboard=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise DiffmechError(f"--address {address or os.environ.get('RAY_ADDRESS')}: cannot reach a Ray cluster: "
                            f"{exc}") from None
    return ray, True


def _message(exc: BaseException) -> str:
    cause = getattr(exc, "cause", None)  # Ray wraps the task's exception
    exc = cause if isinstance(cause, BaseException) else exc
    return f"{type(exc).__name__}: {exc}"


def execute(runs: Sequence[Run], out: str | Path, *, workers: int | None = None, backend: str = "local",
            address: str | None = None, threads: int = 1, nice: int = 0, progress: bool | None = None,
            desc: str = "sweep") -> list[Outcome]:
    """Run (or skip, when finished) every run of ``runs`` into ``out/<run.name>``.

    Args:
        runs: the runs; the costliest start first.
        out: sweep folder (created).
        workers: runs at a time (``local``: default the CPU count, ``1`` in this process; ``ray``:
            default as many as the cluster schedules).
        backend: ``"local"`` or ``"ray"``.
        address: Ray cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``); default
            ``RAY_ADDRESS`` or a new local cluster of ``workers`` CPUs. An already initialised Ray
            (``ray.init`` called before) is used as it is.
        threads: torch threads of each run (the CPUs a Ray task asks for).
        nice: niceness added to the local worker processes.
        progress: a bar over the runs (default: on a terminal); the runs' own bars only with
            ``workers=1``.

    Returns:
        one :class:`Outcome` per run, in the order of ``runs``. Failures do not stop the others.
    """
    import concurrent.futures as cf
    import multiprocessing as mp

    from tqdm.auto import tqdm

    if backend not in BACKENDS:
        raise DiffmechError(f"--backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if workers is not None and workers < 1:
        raise DiffmechError(f"--workers must be at least 1, got {workers}")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    names = [r.name for r in runs]
    if len(set(names)) != len(names):
        raise DiffmechError("sweep: two runs share a folder name")
    outcomes: dict[str, Outcome] = {}
    todo = []
    for r in runs:
        if (out / r.name / "metrics.json").exists():
            outcomes[r.name] = Outcome(r, "skipped")
            log.info("%s %s: metrics.json exists, not re-run", desc, r.name)
        else:
            todo.append(r)
    todo.sort(key=lambda r: -r.cost)
    bar = tqdm(total=len(runs), initial=len(runs) - len(todo), desc=desc, unit="run", dynamic_ncols=True,
               disable=(None if progress is None else not progress))

    def finished(r: Run, dt: float, exc: BaseException | None, node: str | None = None) -> None:
        if exc is None:
            outcomes[r.name] = Outcome(r, "done", dt, node=node)
            log.info("%s %s: done in %.1f s%s (%d of %d runs finished)", desc, r.name, dt,
                     f" on Ray node {node[:12]}" if node else "",
                     sum(o.status != "failed" for o in outcomes.values()), len(runs))
        else:
            outcomes[r.name] = Outcome(r, "failed", dt, _message(exc))
            log.error("%s %s: failed after %.1f s: %s", desc, r.name, dt, _message(exc))
            log.debug("%s %s: traceback", desc, r.name, exc_info=exc)
        bar.update(1)

    try:
        if not todo:
            pass
        elif backend == "ray":
            _execute_ray(todo, out, workers, address, threads, finished)
        elif (workers or os.cpu_count() or 1) == 1:
            for r in todo:
                t0 = time.perf_counter()
                try:
                    _call(r.target, str(out / r.name), r.kwargs, threads, 0, progress)
                except Exception as exc:  # noqa: BLE001 - one failed run does not stop the sweep
                    finished(r, time.perf_counter() - t0, exc)
                else:
                    finished(r, time.perf_counter() - t0, None)
        else:
            n = min(workers or os.cpu_count() or 1, len(todo))
            with cf.ProcessPoolExecutor(max_workers=n, mp_context=mp.get_context("spawn")) as ex:
                t0 = time.perf_counter()
                futs = {ex.submit(_timed, r.target, str(out / r.name), r.kwargs, threads, nice, False): r
                        for r in todo}
                for f in cf.as_completed(futs):
                    exc = f.exception()
                    finished(futs[f], time.perf_counter() - t0 if exc else f.result(), exc)
    finally:
        bar.close()
    return [outcomes[r.name] for r in runs]


def _execute_ray(todo: list[Run], out: Path, workers: int | None, address: str | None, threads: int,
                 finished: Callable) -> None:
    ray, started = _ray_init(address, workers)
    try:
        remote = ray.remote(num_cpus=threads)(_ray_call)
        queue, pending = list(todo), {}
        while queue or pending:
            while queue and (workers is None or len(pending) < workers):
                r = queue.pop(0)
                folder = out / r.name
                files = _pack(folder) if folder.is_dir() else {}
                pending[remote.remote(r.target, r.name, r.kwargs, threads, files)] = (r, time.perf_counter())
            done, _ = ray.wait(list(pending), num_returns=1)
            r, t0 = pending.pop(done[0])
            try:
                files, seconds, node = ray.get(done[0])
                _unpack(files, out / r.name)
            except Exception as exc:  # noqa: BLE001 - one failed run does not stop the sweep
                finished(r, time.perf_counter() - t0, exc)
            else:
                finished(r, seconds, None, node)
    finally:
        if started:
            ray.shutdown()


# ---------------------------------------------------------------------------- summaries
def flatten_numeric(metrics: dict, prefix: str = "") -> dict[str, float]:
    """The numbers of ``metrics`` (booleans and lists left out), nested dicts as ``outer.inner``."""
    flat = {}
    for k, v in metrics.items():
        if isinstance(v, dict):
            flat.update(flatten_numeric(v, f"{prefix}{k}."))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            flat[f"{prefix}{k}"] = v
    return flat


def _stats(values: list[float]) -> dict:
    finite = [float(v) for v in values if math.isfinite(v)]
    if not finite:
        return {"mean": float("nan"), "std": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0,
                "n_nonfinite": len(values)}
    mean = math.fsum(finite) / len(finite)
    # population std (ddof = 0): defined for one seed too; the table says n
    std = math.sqrt(math.fsum((v - mean) ** 2 for v in finite) / len(finite))
    s = {"mean": mean, "std": std, "min": min(finite), "max": max(finite), "n": len(finite)}
    if len(finite) < len(values):
        s["n_nonfinite"] = len(values) - len(finite)
    return s


def summarize(out: str | Path, runs: Sequence[Run]) -> dict:
    """Per-run rows (``run``, the run's labels, ``metrics`` as in its ``metrics.json``) and the
    statistics of each numeric metric over the finished runs (non-finite values left out of them)."""
    out = Path(out)
    rows, missing = [], []
    for r in runs:
        path = out / r.name / "metrics.json"
        if path.exists():
            rows.append({"run": r.name, **r.labels, "metrics": json.loads(path.read_text())})
        else:
            missing.append(r.name)
    values: dict[str, list[float]] = {}
    for row in rows:
        for k, v in flatten_numeric(row["metrics"]).items():
            values.setdefault(k, []).append(v)
    return {"runs": rows, "stats": {k: _stats(v) for k, v in values.items()}, "missing": missing}


def format_table(summary: dict, keys: Sequence[str]) -> str:
    """One row per run, then mean, std, min and max, for the metrics ``keys`` that the runs have."""
    keys = [k for k in keys if k in summary["stats"]]
    table = []
    for row in summary["runs"]:
        flat = flatten_numeric(row["metrics"])
        table.append([row["run"]] + [_fmt(flat.get(k)) for k in keys])
    for s in ("mean", "std", "min", "max"):
        table.append([s] + [_fmt(summary["stats"][k][s]) for k in keys])
    head = ["run"] + list(keys)
    widths = [max(len(str(x)) for x in col) for col in zip(head, *table)]
    lines = ["  ".join(str(x).rjust(w) if i else str(x).ljust(w) for i, (x, w) in enumerate(zip(r, widths)))
             for r in [head] + table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    lines.insert(len(summary["runs"]) + 2, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, int) or (math.isfinite(v) and v.is_integer() and abs(v) < 1e9):
        return str(int(v))  # step counts read as counts, not 2.24e+04
    return f"{v:.4g}"


def plot_summary(out: str | Path, summary: dict, keys: Sequence[str], *, curve: tuple[str, str, str] | None = None,
                 title: str = "") -> Path:
    """``out/summary.png``: each run's value of each metric of ``keys`` with the mean and +- one std,
    and first, with ``curve = (csv file, x column, y column)``, that curve of every run."""
    from matplotlib.figure import Figure

    out = Path(out)
    keys = [k for k in keys if k in summary["stats"]]
    panels = len(keys) + (curve is not None)
    ncols = min(max(panels, 1), 3)
    nrows = math.ceil(max(panels, 1) / ncols)
    fig = Figure(figsize=(3.6 * ncols, 3.0 * nrows), layout="constrained")
    axes = list(fig.subplots(nrows, ncols, squeeze=False).ravel())
    for ax in axes[panels:]:
        ax.set_visible(False)
    names = [row["run"] for row in summary["runs"]]
    if curve is not None:
        ax = axes[0]
        fname, xk, yk = curve
        for name in names:
            xs, ys = _read_curve(out / name / fname, xk, yk)
            if xs:
                ax.plot(xs, ys, lw=1, label=name)
        ax.set(xlabel=xk, ylabel=yk, title=f"{yk} ({fname})")
        if 0 < len(names) <= 10:
            ax.legend(fontsize="small")
    for ax, k in zip(axes[panels - len(keys):], keys):
        vals = [flatten_numeric(row["metrics"]).get(k, float("nan")) for row in summary["runs"]]
        s = summary["stats"][k]
        ax.plot(range(len(vals)), vals, "o")
        if s["n"]:
            ax.axhline(s["mean"], color="k", lw=1)
            ax.axhspan(s["mean"] - s["std"], s["mean"] + s["std"], color="k", alpha=0.1, lw=0)
        ax.set_xticks(range(len(names)), names, rotation=45 if len(names) > 4 else 0, fontsize="small")
        ax.set_title(k)
    if title:
        fig.suptitle(title)
    path = out / "summary.png"
    fig.savefig(path, dpi=100)
    return path


def _read_curve(path: Path, xk: str, yk: str) -> tuple[list[float], list[float]]:
    if not path.exists():
        return [], []
    xs, ys = [], []
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            try:
                xs.append(float(row[xk]))
                ys.append(float(row[yk]))
            except (KeyError, TypeError, ValueError):
                continue
    return xs, ys


# ---------------------------------------------------------------------------- command line
def parse_seeds(text: str) -> list[int]:
    """``"0,1,2"`` or ranges ``"0-4"`` (inclusive), mixed: ``"0-2,7"``."""
    seeds = []
    try:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            lo, sep, hi = part.partition("-")
            if sep and lo:
                a, b = int(lo), int(hi)
                if b < a:
                    raise ValueError
                seeds.extend(range(a, b + 1))
            else:
                seeds.append(int(part))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected integers such as 0,1,2 or 0-4, got {text!r}") from None
    if not seeds:
        raise argparse.ArgumentTypeError("expected at least one seed")
    if len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"a seed appears twice in {text!r}")
    return seeds


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {n}")
    return n


def add_sweep_options(p: argparse.ArgumentParser, *, seeds: str | None = "0,1,2", out: bool = True) -> None:
    """The options shared by the sweep commands (``--seeds`` when ``seeds`` is its default)."""
    if seeds is not None:
        p.add_argument("--seeds", type=parse_seeds, default=parse_seeds(seeds), metavar="LIST",
                       help=f"seeds, one run each: 0,1,2 or 0-4 (default: {seeds})")
    p.add_argument("--workers", type=_positive_int, default=None, metavar="N",
                   help="runs at a time (default: the CPU count locally, the cluster's capacity on Ray; "
                        "1 runs in this process)")
    p.add_argument("--backend", default="local", choices=BACKENDS,
                   help="a local process pool, or Ray tasks (pip install 'diffmech[ray]'); default: %(default)s")
    p.add_argument("--address", default=None,
                   help="Ray cluster to connect to, e.g. auto or ray://HOST:10001 (default: RAY_ADDRESS, else a "
                        "new local Ray)")
    if out:
        p.add_argument("--out", required=True, metavar="DIR",
                       help="sweep folder: one sub-folder per run, summary.json, summary.png")


def check_out(out: str | Path) -> Path:
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DiffmechError(f"--out {out} is a file, not a folder")
    return out


def cli_logging() -> None:
    """Show the sweeps' per-run log lines on stderr unless the user configured logging."""
    _log.show()


def seed_sweep(job: str, target: str, options: dict, seeds: Sequence[int], out: str | Path, *,
               workers: int | None = None, backend: str = "local", address: str | None = None, threads: int = 1,
               headline: Sequence[str] = (), curve: tuple[str, str, str] | None = None,
               echo: Callable[[str], None] = print) -> dict:
    """One run of ``target`` per seed in ``out/seed<k>`` (``options`` plus ``seed=k``), then
    ``summary.json``, the table of the ``headline`` metrics (printed with ``echo``) and ``summary.png``.

    ``out/sweep.json`` keeps ``options``; a later sweep into the same folder must give the same ones
    (seeds may differ: new ones are run, finished ones are not). Raises :class:`DiffmechError` once the
    summary is written if some runs failed.
    """
    out = check_out(out)
    out.mkdir(parents=True, exist_ok=True)
    record = out / "sweep.json"
    opts = {k: v for k, v in options.items() if k not in _PRESENTATION}
    if record.exists():
        try:
            old = json.loads(record.read_text())
        except json.JSONDecodeError:
            old = {}
        if old.get("job") == job:
            old_opts = {k: v for k, v in old.get("options", {}).items() if k not in _PRESENTATION}
            diff = sorted(k for k in set(old_opts) | set(opts) if old_opts.get(k) != opts.get(k))
            if diff:
                raise DiffmechError(f"--out {out} holds a sweep with other options ({', '.join(diff)}); give the same "
                                    "options to resume it, or another --out")
        elif old.get("job") is not None:
            raise DiffmechError(f"--out {out} holds a {old['job']!r} sweep, not {job!r}; choose another --out")
    runs = [Run(f"seed{s}", target, {**options, "seed": s}, {"seed": s}) for s in seeds]
    done = [r.name for r in runs if (out / r.name / "metrics.json").exists()]
    if done:
        echo(f"resuming: {len(done)} of {len(runs)} runs already finished (metrics.json found), not re-run: "
             f"{', '.join(done)}")
    t0 = time.perf_counter()
    outcomes = execute(runs, out, workers=workers, backend=backend, address=address, threads=threads, desc=job)
    summary = {"job": job, "options": options, "seeds": list(seeds), **summarize(out, runs),
               "errors": {o.run.name: o.error for o in outcomes if o.status == "failed"}}
    record.write_text(json.dumps({"job": job, "options": options, "seeds": list(seeds), "backend": backend,
                                  "workers": workers, "session_wall_s": time.perf_counter() - t0,
                                  "outcomes": {o.run.name: o.status for o in outcomes},
                                  "nodes": {o.run.name: o.node for o in outcomes if o.node is not None}},
                                 indent=1) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    if summary["runs"]:
        echo(format_table(summary, headline or list(summary["stats"])[:6]))
        plot_summary(out, summary, headline or list(summary["stats"])[:6], curve=curve,
                     title=f"{job}: {len(summary['runs'])} seeds")
    echo(f"{len(summary['runs'])} of {len(runs)} runs in {out}; summary.json, summary.png")
    if summary["errors"]:
        raise DiffmechError(f"{len(summary['errors'])} run(s) failed:\n" +
                            "\n".join(f"  {k}: {v}" for k, v in summary["errors"].items()))
    return summary
