"""Figures like the seed paper's: the five metrics against the number of training initial conditions
(Figures 3 and 4, with the published values overlaid), phase portraits of long rollouts (Figure 1)
and the energy along them."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ._paper import N_ICS, PAPER
from .models import MODEL_NAMES
from .sweep import collect

__all__ = ["metrics_figure", "phase_portraits", "energy_figure", "long_horizon_figure", "comparison_markdown",
           "make_figures"]

LABELS = {"node-rk4": "NODE-RK4", "node-midpoint": "NODE-Midpoint", "lnode-rk4": "L-NODE-RK4",
          "lnode-midpoint": "L-NODE-Midpoint", "symo": "SyMo", "e2e-symo": "E2E-SyMo"}
COLORS = {"node-rk4": "tab:blue", "node-midpoint": "tab:cyan", "lnode-rk4": "tab:green",
          "lnode-midpoint": "tab:olive", "symo": "tab:orange", "e2e-symo": "tab:red"}
METRICS = (("train_loss", "train error"), ("test_loss", "test error"), ("integration_loss", "integration error"),
           ("energy_loss", "energy error"), ("inertia_loss", "inertia error"))


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def metrics_figure(rows: list[dict], system: str, path: str | Path, *, paper: bool = True,
                   extra: tuple[tuple[str, str], ...] = ()) -> None:
    """Five (or more) panels, metric vs N on log-log axes, one line per model; the paper's values dashed.

    Args:
        rows: run metrics (:func:`~.sweep.collect`).
        system: ``"pendulum"`` or ``"cartpole"`` selects the paper's overlay (none for other systems).
        path: output PNG.
        extra: additional ``(metric key, title)`` panels, e.g. the corrected metrics.
    """
    plt = _plt()
    panels = METRICS + tuple(extra)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.3))
    ref = PAPER.get(system) if paper else None
    for ax, (key, title) in zip(axes, panels):
        for m in MODEL_NAMES:
            pts = sorted((r["n_ics"], r.get(key)) for r in rows if r.get("model") == m and r.get(key) is not None)
            if pts:
                x, y = zip(*pts)
                ax.loglog(x, y, "o-", color=COLORS[m], label=LABELS[m], ms=4)
            if ref is not None and m in ref and key in ref[m]:
                vals = [(n, v) for n, v in zip(N_ICS, ref[m][key]) if v is not None]
                if vals:
                    x, y = zip(*vals)
                    ax.loglog(x, y, "s--", color=COLORS[m], mfc="none", ms=4, alpha=0.6, lw=1)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("training initial conditions N")
        ax.set_xticks(list(N_ICS))
        ax.set_xticklabels([str(n) for n in N_ICS])
        ax.minorticks_off()
    axes[0].legend(fontsize=7, title="solid: diffmech, dashed: paper" if ref is not None else None,
                   title_fontsize=7)
    fig.suptitle(f"{system}: metrics vs training set size", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _load_rollout(sweep_dir: Path, model: str, n_ics: int):
    p = Path(sweep_dir) / model / f"N{n_ics}" / "rollout.npz"
    return np.load(p) if p.exists() else None


def phase_portraits(sweep_dir: str | Path, n_ics: int, path: str | Path, *, traj: int = 0, coord: int = -1,
                    velocity: str = "v_consistent") -> None:
    """Phase portrait ``(q, v)`` of one integration trajectory for every model against the truth (Figure 1).

    ``coord``: which coordinate (default the last: the angle). ``velocity``: ``"v"`` (the seed's
    backward differences for SyMo) or ``"v_consistent"``.
    """
    plt = _plt()
    models = [m for m in MODEL_NAMES if _load_rollout(sweep_dir, m, n_ics) is not None]
    if not models:
        return
    fig, axes = plt.subplots(1, len(models), figsize=(3.0 * len(models), 3.0), squeeze=False)
    for ax, m in zip(axes[0], models):
        z = _load_rollout(sweep_dir, m, n_ics)
        true, q, v = z["true"], z["q"], z[velocity]
        n = q.shape[-1]
        ax.plot(true[traj, :, coord % n], true[traj, :, n + coord % n], "k-", lw=1.5, alpha=0.5, label="truth")
        ax.plot(q[traj, :, coord % n], v[traj, :, coord % n], "-", color=COLORS[m], lw=0.8, label=LABELS[m])
        lim_q = np.abs(true[traj, :, coord % n]).max() * 1.5 + 0.5
        lim_v = np.abs(true[traj, :, n + coord % n]).max() * 1.5 + 0.5
        ax.set_xlim(-lim_q, lim_q)
        ax.set_ylim(-lim_v, lim_v)
        ax.set_title(LABELS[m], fontsize=9)
        ax.set_xlabel("q")
    axes[0][0].set_ylabel("v")
    fig.suptitle(f"phase portraits, integration trajectory {traj}, N = {n_ics}, {q.shape[1]} steps", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def energy_figure(sweep_dir: str | Path, n_ics: int, path: str | Path, system, *, traj: int = 0) -> None:
    """True energy of each model's rollout over time (one integration trajectory; SyMo: consistent velocity)."""
    import torch

    if not any(_load_rollout(sweep_dir, m, n_ics) is not None for m in MODEL_NAMES):
        return  # no finished run at this N (a partial sweep): no empty figure
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    E0 = None
    for m in MODEL_NAMES:
        z = _load_rollout(sweep_dir, m, n_ics)
        if z is None:
            continue
        n = z["q"].shape[-1]
        h = float(z["h"])
        with torch.no_grad():
            E = system.energy(torch.as_tensor(z["q"][traj]), torch.as_tensor(z["v_consistent"][traj])).numpy()
            if E0 is None:
                x0 = z["x0"][traj]
                E0 = float(system.energy(torch.as_tensor(x0[:n]), torch.as_tensor(x0[n:])))
        t = h * (2 + np.arange(len(E)))
        ax.plot(t, np.clip(E - E0, -1e3, 1e3), color=COLORS[m], lw=0.8, label=LABELS[m])
    ax.axhline(0, color="k", lw=0.8)
    ax.set_yscale("symlog", linthresh=1e-3)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("E - E(x0) (J)")
    ax.legend(fontsize=7, ncol=3)
    ax.set_title(f"energy error along integration trajectory {traj}, N = {n_ics}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def long_horizon_figure(sweep_dir: str | Path, n_ics: int, path: str | Path, *, steps: int = 10_000,
                        n_traj: int = 4, models=("node-rk4", "lnode-rk4", "symo", "e2e-symo")) -> dict:
    """Energy error of ``steps``-step unforced rollouts of trained models (from the integration set's
    first ``n_traj`` initial observations); returns per model the max over trajectories of
    ``|E - E(x0)|`` in the first and the last tenth of the horizon (SyMo: consistent velocity)."""
    import torch

    from .data import make_dataset
    from .train import load_run_model

    plt = _plt()
    fig, ax = plt.subplots(figsize=(7, 3.6))
    summary = {}
    for m in models:
        folder = Path(sweep_dir) / m / f"N{n_ics}"
        if not (folder / "checkpoint.pt").exists():
            continue
        cfg, system, model = load_run_model(folder)
        ds = make_dataset(cfg.system, cfg.h, seed=cfg.data_seed, int_seed=cfg.int_seed, n_samples=cfg.n_samples,
                          n_steps=cfg.n_steps, n_int=cfg.n_int, int_steps=cfg.int_steps, rtol=cfg.rtol, atol=cfg.atol)
        traj = ds.integration.take(slice(0, n_traj))
        n_traj = len(traj)
        n = system.n
        dt = next(model.parameters()).dtype
        obs = torch.as_tensor(traj.obs).to(dt)
        u = torch.zeros(n_traj, steps + 2, system.nu, dtype=dt)
        with torch.no_grad():
            r = model.rollout(obs[:, 0, :n], obs[:, 1, :n], obs[:, 1, n:], u, steps, tol=cfg.rollout_tol,
                              max_iter=cfg.newton_max_iter)
            E = system.energy(r.q.double(), r.v_consistent.double()).numpy()
            x0 = torch.as_tensor(traj.x0)
            E0 = system.energy(x0[:, :n], x0[:, n:]).numpy()
        err = np.abs(E - E0[:, None])
        t = cfg.h * (2 + np.arange(steps))
        worst = np.nan_to_num(err, nan=np.inf).max(0)
        ax.semilogy(t, np.clip(worst, 1e-8, 1e6), color=COLORS[m], lw=0.8, label=LABELS[m])
        tenth = max(steps // 10, 1)
        summary[m] = {"first_tenth_max": float(worst[:tenth].max()), "last_tenth_max": float(worst[-tenth:].max()),
                      "newton_failures": int(r.failures.sum())}
    ax.set_xlabel("time (s)")
    ax.set_ylabel("max over trajectories |E - E(x0)| (J)")
    ax.legend(fontsize=7)
    ax.set_title(f"energy error over {steps} steps, N = {n_ics}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return summary


def _fmt(x) -> str:
    if x is None:
        return "-"
    x = float(x)
    if x != x:
        return "nan"
    return f"{x:.3g}" if 1e-3 <= abs(x) < 1e4 or x == 0 else f"{x:.2e}"


def comparison_markdown(rows: list[dict], system: str, *, models=None, n_ics=None) -> str:
    """A markdown table: for each model and metric, diffmech's value beside the paper's at every N.

    A partial sweep renders whole: a (model, N) cell without a finished run reads ``not run``; ``-``
    marks a value that does not exist (NODE's inertia error, the paper's corrected metrics).

    Args:
        rows: run metrics (:func:`~.sweep.collect`).
        system: selects the paper's values (``"pendulum"``, ``"cartpole"``; none for other systems).
        models: rows of the table (default: the paper's models of ``system`` and every model in ``rows``).
        n_ics: columns (default: the paper's N and every N in ``rows``).
    """
    ref = PAPER.get(system, {})
    have = {(r.get("model"), r.get("n_ics")): r for r in rows}
    if models is None:
        models = [m for m in MODEL_NAMES if m in ref or any(k[0] == m for k in have)]
    if n_ics is None:
        n_ics = sorted(set(N_ICS if ref else ()) | {k[1] for k in have if k[1] is not None})
    paper_n = {n: i for i, n in enumerate(N_ICS)}
    cell = "diffmech / paper" if ref else "diffmech"
    lines = [f"| model | metric | {' | '.join(f'N = {n}' for n in n_ics)} |",
             "|---|---|" + "---|" * len(n_ics)]
    for m in models:
        for key, title in METRICS + (("integration_median", "integration median"),
                                     ("energy_loss_consistent", "energy, consistent v")):
            theirs = ref.get(m, {}).get(key)
            cells = []
            for n in n_ics:
                ours = _fmt(have[m, n].get(key)) if (m, n) in have else "not run"
                if theirs is not None:
                    ours += " / " + (_fmt(theirs[paper_n[n]]) if n in paper_n else "-")
                cells.append(ours)
            lines.append(f"| {LABELS[m]} | {title} | {' | '.join(cells)} |")
    return f"Each cell: {cell}" + (" (the paper has no corrected metrics)" if ref else "") + ".\n\n" + \
        "\n".join(lines)


def make_figures(sweep_dir: str | Path, out: str | Path | None = None, *, n_ics: int = 32, paper: bool = True,
                 traj: int = 0) -> list[Path]:
    """All figures of a sweep folder into ``out`` (default the sweep folder); returns their paths."""
    from .systems import get_system

    sweep_dir = Path(sweep_dir)
    out = Path(out) if out is not None else sweep_dir
    out.mkdir(parents=True, exist_ok=True)
    rows = collect(sweep_dir)
    if not rows:
        return []
    system = rows[0]["system"]
    paths = []
    p = out / f"{system}_metrics.png"
    metrics_figure(rows, system, p, paper=paper)
    paths.append(p)
    p = out / f"{system}_metrics_corrected.png"
    metrics_figure(rows, system, p, paper=False, extra=(("integration_median", "integration error, median"),
                                                       ("energy_loss_consistent", "energy error, consistent v")))
    paths.append(p)
    p = out / f"{system}_phase_N{n_ics}.png"
    phase_portraits(sweep_dir, n_ics, p, traj=traj)
    paths.append(p)
    p = out / f"{system}_energy_N{n_ics}.png"
    energy_figure(sweep_dir, n_ics, p, get_system(system), traj=traj)
    paths.append(p)
    p = out / f"{system}_comparison.md"
    p.write_text(comparison_markdown(rows, system) + "\n")
    paths.append(p)
    return [q for q in paths if q.exists()]
