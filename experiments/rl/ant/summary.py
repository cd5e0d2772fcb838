"""Summarise the Ant runs of experiments/rl/ant: a markdown table (printed) and one figure of every run's
evaluation return against environment steps and against training wall-clock (curves.png).

    python experiments/rl/ant/summary.py [DIR [PREFIXES]]   # PREFIXES: e.g. shac64_h4,sac_w,sesac_w
"""

from __future__ import annotations

import csv
import json
import statistics
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ALGOS = {"sac": "SAC (stable-baselines3)", "sesac": "sample-enhanced SAC", "shac": "SHAC",
         "shac64": "SHAC, 64 environments"}


def main(root: Path, only: str | None = None) -> None:
    """``only``: the runs whose folder name starts with one of these comma-separated prefixes."""
    runs: dict[str, list[Path]] = {}
    prefixes = tuple(only.split(",")) if only else ("",)
    for d in sorted(root.iterdir()):
        if d.is_dir() and (d / "metrics.json").exists() and d.name.startswith(prefixes):
            runs.setdefault(d.name.rsplit("_s", 1)[0], []).append(d)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    colours = dict(zip(runs, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    print("| algorithm | seeds | env steps per run | max_return per seed | mean max_return | final_return per seed |"
          " MuJoCo return of the best policy (diffmech) |")
    print("|---|---:|---:|---|---:|---|---|")
    for name, dirs in runs.items():
        ms = [json.loads((d / "metrics.json").read_text()) for d in dirs]
        tp = []
        for d in dirs:
            f = d / "transplant.json"
            if f.exists():
                t = json.loads(f.read_text())
                tp.append(f"{t['policy_return']:.1f} ({t['diffmech_return']:.1f})")
        cfg = json.loads((dirs[0] / "config.json").read_text())
        cap, wall = cfg.get("max_wall_s") or float("inf"), max(m["wall_s"] for m in ms)
        label = ALGOS.get(name.split("_")[0], name) + (f", {cap:.0f} s" if wall >= 0.95 * cap else
                                                       f", {wall:.0f} s (its step budget)")
        if cfg["algo"] == "shac":
            label += f", windows of {cfg['algo_config']['horizon']} steps"
        if cfg.get("env_kwargs", {}).get("contact_solver") == "smooth":
            label += ", smooth contacts"
        steps = ", ".join(str(m["env_steps"]) for m in ms)
        best = ", ".join(f"{m['max_return']:.1f}" for m in ms)
        final = ", ".join(f"{m['final_return']:.1f}" for m in ms)
        mean = statistics.mean(m["max_return"] for m in ms)
        print(f"| {label} | {len(ms)} | {steps} | {best} | {mean:.1f} | {final} | {', '.join(tp) or '-'} |")
        for i, d in enumerate(dirs):
            with open(d / "curve.csv") as f:
                rows = list(csv.DictReader(f))
            for ax, key in zip(axes, ("env_steps", "wall_s")):
                ax.plot([float(r[key]) for r in rows], [float(r["eval_return"]) for r in rows], "-o", ms=3,
                        color=colours[name], label=label if i == 0 else None)
    for ax in axes:  # zero action on the same evaluation starts: 100.2, 99.0, 99.2 (seeds 0-2; EXPERIMENTS.md)
        ax.axhline(99.5, color="k", ls="--", lw=1, label="zero action (standing), mean" if ax is axes[0] else None)
    axes[0].set_xlabel("environment steps")
    axes[1].set_xlabel("training wall-clock (s, 2 shared cores)")
    axes[0].set_ylabel("evaluation return (2 episodes of 100 steps)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[0].legend(loc="lower right", fontsize=8)
    fig.suptitle("Ant (diffmech.rl.Ant, episodes of 100 steps): return against steps and wall-clock")
    fig.tight_layout()
    fig.savefig(root / ("curves.png" if only is None else f"curves_{only.replace(',', '_')}.png"), dpi=100)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "experiments/rl/ant"), sys.argv[2] if len(sys.argv) > 2 else None)
