"""Training runs of the seed paper's protocol, with checkpoints, resume and the output files.

One run (:func:`run`) trains one model on the first ``n_ics`` trajectories of the training pool
and evaluates it; it writes into its folder:

- ``config.json``: the :class:`TrainConfig`;
- ``history.csv`` and ``loss_curves.png``: per epoch the learning rate, the training objective
  (mean over minibatches), the test objective (what the scheduler watched), the paper's
  train/test position errors where computed (every ``log_every`` epochs and the last), Newton
  iterations and failures;
- ``checkpoint.pt``: model, optimiser, scheduler, RNG states and history, every
  ``checkpoint_every`` epochs and at the end; ``resume=True`` continues from it and gives the
  same result as an uninterrupted run;
- ``metrics.json``: the paper-compatible metrics, the corrected ones (:mod:`.metrics`), the last
  epoch's objectives (``final_train_objective``, ``final_test_objective``: the history's last row,
  not the same quantity as ``train_loss``/``test_loss``), a ``definitions`` entry saying in one line
  what each of these is, Newton
  statistics, ``wall_s`` (training and evaluation, summed over resumed sessions) and ``cpu_s`` (the
  process's CPU time over the same: the cost of the run on a machine it has to itself; ``null`` when
  the run resumed from a checkpoint written before ``cpu_s`` existed);
- ``rollout.npz``: the integration-set predictions and per-trajectory errors.

The protocol (the seed's): Adam, ``ReduceLROnPlateau(patience=50, factor=0.7)`` stepped on the
test objective every epoch, 2000 epochs, batch ``4 n_ics`` (8 minibatches per epoch), no
shuffling except E2E-SyMo on the cart-pole, ``torch.manual_seed(230)`` before building the model,
float32.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .. import _log
from .._progress import Stage
from ..errors import DiffmechError
from .data import make_dataset, step_samples
from .metrics import metric_definitions, one_step_losses, paper_loss_columns, rollout_integration_set, rollout_metrics
from .models import MODEL_NAMES, build_model
from .systems import get_system

__all__ = ["TrainConfig", "run", "load_run_model", "RunError"]

logger = _log.get("learn")


class RunError(DiffmechError):
    """A run folder that does not match its configuration, or a model that cannot be trained."""


@dataclass
class TrainConfig:
    """Everything that defines a run (defaults: the seed's protocol; ``None``: the system preset's value)."""

    system: str = "pendulum"
    model: str = "e2e-symo"
    n_ics: int = 128
    epochs: int = 2000
    h: float | None = None
    seed: int = 230
    data_seed: int = 0
    int_seed: int = 1
    batch_size: int | None = None
    lr: float | None = None
    width: int | None = None
    patience: int = 50
    factor: float = 0.7
    dtype: str = "float32"
    device: str = "cpu"
    newton_tol: float = 1e-5
    newton_max_iter: int = 10
    rollout_tol: float = 1e-4
    line_search: bool = False
    inertia: str = "paper"
    dissipation: bool = False
    shuffle: bool | None = None
    n_samples: int = 256
    n_steps: int = 32
    n_int: int = 16
    int_steps: int = 500
    rtol: float | None = None
    atol: float | None = None
    warm_start: bool = True
    log_every: int = 50
    checkpoint_every: int = 10
    extra: dict = field(default_factory=dict)

    def resolved(self) -> TrainConfig:
        """A copy with the preset defaults filled in."""
        p = get_system(self.system).preset
        c = dataclasses.replace(self)
        c.h = p.h if c.h is None else float(c.h)
        c.batch_size = 4 * c.n_ics if c.batch_size is None else c.batch_size
        c.lr = p.lr if c.lr is None else c.lr
        c.width = p.width if c.width is None else c.width
        c.shuffle = (p.shuffle_e2e and c.model == "e2e-symo") if c.shuffle is None else c.shuffle
        return c

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


_HISTORY_FIELDS = ["epoch", "lr", "train_objective", "test_objective", "train_loss", "test_loss",
                   "train_loss_positions", "test_loss_positions", "newton_iterations_mean", "newton_iterations_max",
                   "newton_failures", "epoch_s"]
# fields that may differ between a run and its resumption
_RESUMABLE = {"epochs", "checkpoint_every", "log_every", "extra"}


def _dtype(name: str) -> torch.dtype:
    try:
        return {"float32": torch.float32, "float64": torch.float64}[name]
    except KeyError:
        raise RunError(f"dtype must be 'float32' or 'float64', got {name!r}") from None


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _write_json(obj, path: Path) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=True) + "\n")
    os.replace(tmp, path)


def _build(cfg: TrainConfig):
    system = get_system(cfg.system)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    model = build_model(cfg.model, system.angle_mask, cfg.h, width=cfg.width, input_matrix=system.input_matrix,
                        inertia=cfg.inertia, dissipation=cfg.dissipation, tol=cfg.newton_tol,
                        max_iter=cfg.newton_max_iter, line_search=cfg.line_search)
    return system, model.to(dtype=_dtype(cfg.dtype), device=cfg.device)


def _data(cfg: TrainConfig):
    ds = make_dataset(cfg.system, cfg.h, seed=cfg.data_seed, int_seed=cfg.int_seed, n_samples=cfg.n_samples,
                      n_steps=cfg.n_steps, n_int=cfg.n_int, int_steps=cfg.int_steps, rtol=cfg.rtol, atol=cfg.atol)
    if cfg.n_ics > len(ds.train):
        raise RunError(f"n_ics = {cfg.n_ics} exceeds the training pool of {len(ds.train)} trajectories")
    return ds


def _roots(x: Tensor, converged: Tensor) -> Tensor:
    """Roots to warm-start the next epoch from: NaN where the solve did not converge, so that
    :func:`_warm` starts those samples from the seed's guess again. (Restarting from a failed
    iterate kept a sample in the wrong basin epoch after epoch: a pendulum run at N = 8 carried two
    failing test samples for 1,600 epochs, their error driving the scheduler's signal.)"""
    return torch.where(converged[:, None], x, torch.full_like(x, float("nan")))


def _warm(x0: Tensor | None, b) -> Tensor | None:
    """A warm start for Newton: the previous root where finite, else the seed's guess ``2 q - q_prev``."""
    if x0 is None:
        return None
    ok = torch.isfinite(x0).all(-1, keepdim=True)
    return torch.where(ok, x0, 2 * b.q - b.q_prev)


# Rows per chunk of the large no-grad evaluations: the networks' jet stacks of 512 rows stay in
# cache (measured 1.2-3x faster than one 4096-row batch on this machine's CPU).
EVAL_CHUNK = 512


def _test_objective(model, name: str, b, cfg, x0=None) -> tuple[float, float | None, float | None, int, Tensor | None]:
    """Test objective (the scheduler's signal), plus the paper's and the position test errors where free,
    failures, and the roots (E2E-SyMo; the next epoch's warm start)."""
    M = len(b)
    chunks = [slice(s, s + EVAL_CHUNK) for s in range(0, M, EVAL_CHUNK)]
    with torch.no_grad():
        if name == "symo":
            tot = sum(float(model.objective(b.index(sl))[0]) * len(b.index(sl)) for sl in chunks)
            return tot / M, None, None, 0, None
        if name == "e2e-symo":
            qs, oks, fails = [], [], 0
            for sl in chunks:
                bb = b.index(sl)
                pred = model.predict(bb, tol=cfg.newton_tol, max_iter=cfg.newton_max_iter,
                                     x0=_warm(None if x0 is None else x0[sl], bb))
                qs.append(pred.q)
                oks.append(pred.converged)
                fails += int((~pred.converged).sum())
            q = torch.cat(qs)
            mse = float((q - b.q_next).square().mean())
            return mse, mse, mse, fails, _roots(q, torch.cat(oks))
        outs = [model.objective(b.index(sl)) for sl in chunks]
        loss = sum(float(o[0]) * len(b.index(sl)) for o, sl in zip(outs, chunks)) / M
        q = torch.cat([o[1]["q"] for o in outs])
        v = torch.cat([o[1]["v"] for o in outs])
        cols = paper_loss_columns(name, model.n, "test")
        full = torch.cat([q, v], -1)[:, :cols]
        ref = torch.cat([b.q_next, b.v_next], -1)[:, :cols]
        return loss, float((full - ref).square().mean()), float((q - b.q_next).square().mean()), 0, None


def _plot_history(history: list[dict], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ep = [r["epoch"] for r in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].semilogy(ep, [r["train_objective"] for r in history], label="train objective")
    ax[0].semilogy(ep, [r["test_objective"] for r in history], label="test objective")
    pts = [(r["epoch"], r["train_loss"], r["test_loss"]) for r in history
           if r["train_loss"] is not None and r["test_loss"] is not None]
    if pts:
        e, a, b = zip(*pts)
        ax[0].semilogy(e, a, "o", ms=2, label="train error (paper)")
        ax[0].semilogy(e, b, "s", ms=2, label="test error (paper)")
    ax[0].set_xlabel("epoch")
    ax[0].legend(fontsize=7)
    ax[0].set_title(title, fontsize=9)
    ax[1].semilogy(ep, [r["lr"] for r in history])
    ax[1].set_xlabel("epoch")
    ax[1].set_ylabel("learning rate")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _write_history(history: list[dict], path: Path) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=_HISTORY_FIELDS)
        w.writeheader()
        for r in history:
            w.writerow({k: ("" if r.get(k) is None else r.get(k)) for k in _HISTORY_FIELDS})
    os.replace(tmp, path)


def _check_config(cfg: TrainConfig, path: Path) -> None:
    old = dataclasses.asdict(_read_run_config(path))
    new = cfg.to_json()
    diff = {k for k in set(old) | set(new) if k not in _RESUMABLE and old.get(k) != new.get(k)}
    if diff:
        raise RunError(f"{path}: the existing run differs in {sorted(diff)}; use another --out or drop --resume")


def run(cfg: TrainConfig, out: str | Path, *, resume: bool = False, progress: bool | None = None,
        evaluate: bool = True) -> dict:
    """Train (or resume) one run into folder ``out`` and evaluate it; returns the metrics dict.

    Args:
        cfg: the run's configuration (preset defaults are filled in).
        out: the run folder.
        resume: continue from ``out/checkpoint.pt`` if present (a finished run is only re-evaluated
            when its ``metrics.json`` is missing). Without it an existing checkpoint is an error.
        progress: ``None`` (default): each stage (data set, training, evaluation) is silent while
            short; once one has run 2 s, a tqdm bar on stderr if stderr is a terminal, else INFO
            lines of the ``diffmech.learn`` logger (its sizes, then its elapsed seconds and last
            losses); ``True``: a bar from the first epoch; ``False``: nothing (see
            :mod:`diffmech._progress`).
        evaluate: compute metrics after training.
    """
    if cfg.model not in MODEL_NAMES:
        raise RunError(f"unknown model {cfg.model!r}; choose one of {', '.join(MODEL_NAMES)}")
    cfg = cfg.resolved()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_path, cfg_path, metrics_path = out / "checkpoint.pt", out / "config.json", out / "metrics.json"
    if ckpt_path.exists() and not resume:
        raise RunError(f"{out} already holds a run (checkpoint.pt); pass resume=True (--resume) or another folder")
    if resume and cfg_path.exists():
        _check_config(cfg, cfg_path)
    _write_json(cfg.to_json(), cfg_path)

    system, model = _build(cfg)
    ck = {}
    if resume and ckpt_path.exists():
        from ..cli_checks import CheckpointError, load_checkpoint

        # read before the data set is generated (minutes): a bad checkpoint is named at once
        ck = load_checkpoint(ckpt_path, keys=("model", "optimizer", "scheduler", "generator", "torch_rng", "history",
                                              "epoch", "wall_s", "train_s"),
                             what="symo checkpoint", map_location=cfg.device)
        _load_model_state(model, ck["model"], ckpt_path)
    # the data set and the evaluation report no steps: no bar for them (progress=True counts as None)
    with Stage(logger, f"symo data {cfg.system}", sizes=f"{cfg.n_samples} samples, {cfg.n_int} integration sets",
               progress=progress and None, unit="set"):
        ds = _data(cfg)
    dt = _dtype(cfg.dtype)
    train_b = step_samples(ds.train.take(slice(0, cfg.n_ics)), system.n, dtype=dt, device=cfg.device)
    test_b = step_samples(ds.test, system.n, dtype=dt, device=cfg.device)
    # fused Adam: the same update as torch's default implementation in one kernel (CPU and CUDA)
    opt = torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=0, fused=True)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, mode="min", patience=cfg.patience, factor=cfg.factor)
    gen = torch.Generator().manual_seed(cfg.seed)
    history: list[dict] = []
    start, wall_prev, train_s_prev, cpu_prev = 0, 0.0, 0.0, 0.0
    last_train_pose = None
    if ck:
        try:
            opt.load_state_dict(ck["optimizer"])
            sched.load_state_dict(ck["scheduler"])
            gen.set_state(ck["generator"])
            torch.set_rng_state(ck["torch_rng"])
        except (RuntimeError, KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{ckpt_path}: the checkpoint's optimiser or RNG state does not fit this run "
                                  f"({exc})") from None
        history, start = ck["history"], ck["epoch"]
        # checkpoints of older code lack cpu_s: the run's CPU time is then unknown, not this session's alone
        wall_prev, train_s_prev, cpu_prev = ck["wall_s"], ck["train_s"], ck.get("cpu_s")
        last_train_pose = ck.get("last_train_pose")
        if start >= cfg.epochs and metrics_path.exists():
            return json.loads(metrics_path.read_text())
    t0, c0 = time.perf_counter(), time.process_time()
    M = len(train_b)
    # Newton warm starts (E2E-SyMo): each sample's root of the previous epoch; the roots agree with
    # those from the seed's guess to the tolerance, at fewer iterations.
    ws = cfg.warm_start and cfg.model == "e2e-symo"
    roots_train = (2 * train_b.q - train_b.q_prev) if ws else None
    roots_test = (2 * test_b.q - test_b.q_prev) if ws else None
    if ws and resume and ckpt_path.exists() and ck.get("roots", (None, None))[0] is not None:
        roots_train, roots_test = ck["roots"]
    bs = cfg.batch_size

    def cpu_total() -> float | None:
        return None if cpu_prev is None else cpu_prev + time.process_time() - c0

    def save(epoch: int) -> None:
        _atomic_save({"model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                      "generator": gen.get_state(), "torch_rng": torch.get_rng_state(), "history": history,
                      "epoch": epoch, "wall_s": wall_prev + time.perf_counter() - t0,
                      "cpu_s": cpu_total(),
                      "train_s": train_s_prev + time.perf_counter() - t0, "last_train_pose": last_train_pose,
                      "roots": (roots_train, roots_test), "config": cfg.to_json()}, ckpt_path)

    bar = Stage(logger, f"symo train {cfg.system}/{cfg.model}/N={cfg.n_ics}", cfg.epochs, initial=start, unit="epoch",
                sizes=f"epochs {start + 1} to {cfg.epochs}, {M} training samples in batches of {bs}", progress=progress)
    name = cfg.model
    for epoch in range(start, cfg.epochs):
        te = time.perf_counter()
        model.train()
        final = epoch == cfg.epochs - 1
        log = final or (cfg.log_every > 0 and (epoch + 1) % cfg.log_every == 0)
        order = torch.randperm(M, generator=gen) if cfg.shuffle else None
        objs, poses, pos_only, iters, fails = [], [], [], [], 0
        for s in range(0, M, bs):
            idx = slice(s, s + bs) if order is None else order[s:s + bs]
            b = train_b.index(idx)
            opt.zero_grad(set_to_none=True)
            if ws:
                loss, info = model.objective(b, x0=_warm(roots_train[idx], b))
                roots_train[idx] = _roots(info["q"], info["converged"])
            else:
                loss, info = model.objective(b)
            if not torch.isfinite(loss):
                save(epoch)  # the state before this epoch's first non-finite loss
                raise RunError(f"{out}: non-finite training loss at epoch {epoch} (lr {opt.param_groups[0]['lr']:.3g})")
            loss.backward()
            objs.append(float(loss.detach()))
            iters.append(info.get("iterations", 0))
            fails += info.get("failures", 0)
            if name == "e2e-symo":
                poses.append(objs[-1])
                pos_only.append(objs[-1])
            elif name == "symo":
                if log:  # the seed root-finds every minibatch; its value only matters where recorded
                    r = one_step_losses(model, name, b, "train", tol=cfg.newton_tol, max_iter=cfg.newton_max_iter)
                    poses.append(r["loss"])
                    pos_only.append(r["positions"])
            else:
                cols = paper_loss_columns(name, model.n, "train")
                full = torch.cat([info["q"], info["v"]], -1)[:, :cols]
                ref = torch.cat([b.q_next, b.v_next], -1)[:, :cols]
                poses.append(float((full - ref).square().mean()))
                pos_only.append(float((info["q"] - b.q_next).square().mean()))
            opt.step()
        model.eval()
        test_obj, test_pose, test_pos, test_fail, roots = _test_objective(model, name, test_b, cfg, roots_test)
        if ws:
            roots_test = roots
        if not math.isfinite(test_obj):
            save(epoch)
            raise RunError(f"{out}: non-finite test objective at epoch {epoch}")
        sched.step(test_obj)
        if name == "symo" and log:
            r = one_step_losses(model, name, test_b, "test", tol=cfg.newton_tol, max_iter=cfg.newton_max_iter)
            test_pose, test_pos, test_fail = r["loss"], r["positions"], test_fail + r["failures"]
        row = {
            "epoch": epoch + 1, "lr": opt.param_groups[0]["lr"], "train_objective": float(np.mean(objs)),
            "test_objective": test_obj,
            "train_loss": float(np.mean(poses)) if poses else None,
            "test_loss": test_pose if (log or name != "symo") else None,
            "train_loss_positions": float(np.mean(pos_only)) if pos_only else None,
            "test_loss_positions": test_pos if (log or name != "symo") else None,
            "newton_iterations_mean": float(np.mean(iters)) if model.uses_newton else None,
            "newton_iterations_max": int(np.max(iters)) if model.uses_newton else None,
            "newton_failures": fails + test_fail, "epoch_s": time.perf_counter() - te,
        }
        history.append(row)
        if final:
            last_train_pose = (row["train_loss"], row["train_loss_positions"])
        bar.set_postfix(loss=f"{row['train_objective']:.3e}", test=f"{test_obj:.3e}", lr=f"{row['lr']:.1e}")
        if (cfg.checkpoint_every > 0 and (epoch + 1) % cfg.checkpoint_every == 0) or final:
            save(epoch + 1)
            _write_history(history, out / "history.csv")
        bar.update()
    bar.close()
    train_s = train_s_prev + time.perf_counter() - t0
    _write_history(history, out / "history.csv")
    if history:
        _plot_history(history, out / "loss_curves.png", f"{cfg.system} {cfg.model} N={cfg.n_ics}")
    if not evaluate:
        return {}
    t1 = time.perf_counter()
    with Stage(logger, f"symo evaluate {cfg.system}/{cfg.model}/N={cfg.n_ics}", progress=progress and None,
               sizes=f"{len(train_b)} + {len(test_b)} samples, {cfg.int_steps} integration steps", unit="set"):
        metrics = evaluate_run(model, cfg, system, ds, train_b, test_b, out)
    if last_train_pose is not None:
        metrics["train_loss"], metrics["train_loss_positions_last_epoch"] = last_train_pose
    eval_s = time.perf_counter() - t1
    its = [r["newton_iterations_mean"] for r in history if r["newton_iterations_mean"] is not None]
    metrics.update({
        "final_lr": opt.param_groups[0]["lr"], "epochs": len(history),
        "adam_steps": int(next(iter(opt.state_dict()["state"].values()))["step"]) if opt.state_dict()["state"] else 0,
        "n_params": sum(p.numel() for p in model.parameters()),
        "newton_iterations_mean": float(np.mean(its)) if its else None,
        "newton_iterations_max": max((r["newton_iterations_max"] for r in history
                                      if r["newton_iterations_max"] is not None), default=None),
        "train_newton_failures": int(sum(r["newton_failures"] for r in history)),
        "train_s": train_s, "eval_s": eval_s, "wall_s": wall_prev + time.perf_counter() - t0,
        "cpu_s": cpu_total(),
        "system": cfg.system, "model": cfg.model, "n_ics": cfg.n_ics, "h": cfg.h,
    })
    if history:
        metrics["final_train_objective"] = history[-1]["train_objective"]
        metrics["final_test_objective"] = history[-1]["test_objective"]
    # last, so that the numbers come first in the file; evaluate_run set it, the update above kept it
    metrics["definitions"] = metrics.pop("definitions")
    _write_json(metrics, metrics_path)
    return metrics


def evaluate_run(model, cfg: TrainConfig, system, ds, train_b, test_b, out: Path | None) -> dict:
    """Paper-compatible and corrected metrics of a trained model (and ``rollout.npz`` in ``out``)."""
    model.eval()
    tr = one_step_losses(model, cfg.model, train_b, "train", tol=cfg.newton_tol, max_iter=cfg.newton_max_iter)
    te = one_step_losses(model, cfg.model, test_b, "test", tol=cfg.newton_tol, max_iter=cfg.newton_max_iter)
    roll = rollout_integration_set(model, ds.integration, cfg.int_steps, tol=cfg.rollout_tol,
                                   max_iter=cfg.newton_max_iter)
    m, arrays = rollout_metrics(model, system, ds.integration, roll)
    metrics = {"train_loss": tr["loss"], "test_loss": te["loss"], **{k: m[k] for k in
               ("integration_loss", "energy_loss", "inertia_loss")},
               "integration_median": m["integration_median"],
               "train_loss_positions": tr["positions"], "test_loss_positions": te["positions"],
               "eval_newton_failures": tr["failures"] + te["failures"]}
    metrics.update({k: v for k, v in m.items() if k not in metrics})
    metrics["definitions"] = metric_definitions(cfg.model)
    if out is not None:
        np.savez_compressed(out / "rollout.npz", true=ds.integration.obs[:, 2:2 + roll.q.shape[1]],
                            x0=ds.integration.x0, h=cfg.h, **arrays)
    return metrics


def _read_run_config(path: Path) -> TrainConfig:
    from ..cli_checks import CheckpointError

    try:
        cfg_d = json.loads(path.read_text())
    except OSError as exc:
        raise CheckpointError(f"{path}: cannot read the run's configuration ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}: not a run configuration (invalid JSON: {exc})") from None
    if not isinstance(cfg_d, dict):
        raise CheckpointError(f"{path}: not a run configuration (a JSON {type(cfg_d).__name__}, not an object)")
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    unknown = sorted(set(cfg_d) - known)
    if unknown:
        raise CheckpointError(f"{path}: not a 'diffmech symo' run configuration (unknown fields {unknown})")
    try:
        return TrainConfig(**cfg_d).resolved()
    except (DiffmechError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a usable run configuration ({type(exc).__name__}: {exc})") from None


def _load_model_state(model, state, path: Path) -> None:
    from ..cli_checks import CheckpointError, brief

    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: the checkpoint's model does not match the run's config.json "
                              f"({brief(exc)})") from None


def load_run_model(out: str | Path):
    """``(config, system, model)`` of a run folder, the model loaded from its checkpoint."""
    from ..cli_checks import load_checkpoint

    out = Path(out)
    cfg = _read_run_config(out / "config.json")
    system, model = _build(cfg)
    ck = load_checkpoint(out / "checkpoint.pt", keys=("model",), what="symo checkpoint", map_location=cfg.device)
    _load_model_state(model, ck["model"], out / "checkpoint.pt")
    model.eval()
    return cfg, system, model
