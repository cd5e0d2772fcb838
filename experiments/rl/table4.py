"""Table 4 of the seed (maximum return on the n-link pendulum) from the runs of ``table4.sh``.

Reads ``ROOT/<algo>_n<links>_s<seed>/metrics.json`` (and ``config.json``) for every run found and
prints a markdown table: per n, the mean +- standard deviation over the seeds of ``max_return``
(the best evaluation), each seed's value, the seed paper's numbers and the maximum ``0.5 n^2``.

    python experiments/rl/table4.py experiments/rl/table4 [--algo shac]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path

# The seed's Table 4 (10 repetitions each): its policy enhancement ("Ours") and MBPO.
SEED_OURS = {1: (0.49, 0.01), 2: (1.93, 0.08), 3: (4.28, 0.25), 4: (7.81, 0.19), 5: (12.31, 0.16),
             6: (17.78, 0.24), 7: (24.34, 0.11)}
SEED_MBPO = {1: (0.49, 0.01), 2: (1.90, 0.02), 3: (4.28, 0.22), 4: (7.50, 0.57), 5: (11.13, 0.99),
             6: (15.02, 1.45), 7: (19.97, 2.33)}


def collect(root: Path, algo: str) -> dict[int, list[dict]]:
    runs: dict[int, list[dict]] = {}
    for d in sorted(root.glob(f"{algo}_n*_s*")):
        m = re.fullmatch(rf"{re.escape(algo)}_n(\d+)_s(\d+)", d.name)
        if not m or not (d / "metrics.json").exists():
            continue
        met = json.loads((d / "metrics.json").read_text())
        met["seed"] = int(m.group(2))
        runs.setdefault(int(m.group(1)), []).append(met)
    return runs


def table(runs: dict[int, list[dict]], algo: str) -> str:
    rows = ["| n | maximum 0.5 n^2 | seed: policy enhancement | seed: MBPO | "
            f"diffmech {algo}: max_return, mean ± std (relative) | per seed (seed: value) | "
            "runs >= 97% | env steps per run | training wall per run (s, loaded machine) |",
            "|---:|---:|---:|---:|---:|---|---:|---:|---:|"]
    for n in sorted(runs):
        rs = sorted(runs[n], key=lambda r: r["seed"])
        best = 0.5 * n**2
        vals = [r["max_return"] for r in rs]
        mean = statistics.fmean(vals)
        std = f"{statistics.stdev(vals):.3f}" if len(vals) > 1 else "n/a (one seed)"
        per = ", ".join(f"{r['seed']}: {r['max_return']:.3f}" for r in rs)
        ok = sum(v >= 0.97 * best for v in vals)
        steps = sorted({r["env_steps"] for r in rs})
        wall = statistics.fmean(r["wall_s"] for r in rs)
        so, sm = SEED_OURS.get(n), SEED_MBPO.get(n)
        rows.append(f"| {n} | {best:g} | {so[0]:.2f} ± {so[1]:.2f} | {sm[0]:.2f} ± {sm[1]:.2f} | "
                    f"**{mean:.3f} ± {std}** ({100 * mean / best:.1f}%) | {per} | {ok}/{len(vals)} | "
                    f"{', '.join(f'{s:,}' for s in steps)} | {wall:.0f} |")
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path)
    ap.add_argument("--algo", default="shac")
    args = ap.parse_args()
    print(table(collect(args.root, args.algo), args.algo))


if __name__ == "__main__":
    main()
