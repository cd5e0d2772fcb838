"""Collect the eigenmode runs under experiments/eigenmodes/ into summary.json, sweep figures and
markdown tables (printed) for EXPERIMENTS.md.

    python experiments/eigenmodes/summarize.py
"""

from __future__ import annotations

import glob
import json
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))


def load(run: str) -> dict | None:
    path = os.path.join(HERE, run, "metrics.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        m = json.load(f)
    out = {"run": run, **{k: m.get(k) for k in ("config", "period", "ee_error_half_period", "periodicity_error",
                                                  "p_half_norm", "effort", "effort_coefficient", "steps", "train_s",
                                                  "wall_s", "s_per_step", "learn_period", "max_multiplier")}}
    ha = m.get("high_accuracy", {})
    out.update({k: ha.get(k) for k in ("p_half_relative", "symmetry_error_q", "line_shaped", "energy_drift")})
    out["ee_error_fixed_step"] = m.get("fixed_step", {}).get("ee_error_half_period")
    for sp in sorted(glob.glob(os.path.join(HERE, run, "stabilize*.json"))):
        with open(sp) as f:
            st = json.load(f)
        tag = os.path.basename(sp)[len("stabilize"):-len(".json")].lstrip("_") or "default"
        fl = st["floquet"]
        out.setdefault("stabilize", {})[tag] = {
            "gains": st["gains"], "damping": st["damping"], "max_multiplier": st["max_multiplier"],
            "multipliers": st["multipliers"], "max_multiplier_fd": fl["finite_differences"]["max_modulus"],
            "monodromy_difference": fl["monodromy_max_abs_difference"], "monodromy_max_abs": fl["monodromy_max_abs"],
            "energy_multiplier_predicted": fl["energy_multiplier_predicted"],
            "ratio_multipliers": fl["ratio_multipliers"], "trivial": fl["autodiff"]["trivial"],
            "runs": st["runs"], "grid_converged": st["grid"]["converged"], "grid_size": len(st["grid"]["starts"]),
            "tracking": st["tracking"]}
    return out


def sweep_plot(rows: list[dict], key: str, xlabel: str, path: str, logx: bool, marks=()) -> None:
    rows = sorted(rows, key=lambda r: r[key])
    xs = [r[key] if (r[key] or not logx) else 1e-6 for r in rows]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    ax[0].plot(xs, [r["effort"] for r in rows], "o-")
    ax[0].set_ylabel("effort int ||u||^2 dt (high-accuracy)")
    ax[1].plot(xs, [1e3 * r["ee_error_half_period"] for r in rows], "o-")
    ax[1].set_ylabel("end-effector error at T/2 (mm)")
    for a in ax:
        a.set_xlabel(xlabel)
        if logx:
            a.set_xscale("symlog", linthresh=1e-5)
        for m in marks:
            a.axvline(m, color="k", ls=":", lw=0.8)
    ax[0].set_yscale("log")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    runs = sorted(d for d in os.listdir(HERE) if os.path.isdir(os.path.join(HERE, d)))
    rows = [r for r in (load(d) for d in runs) if r is not None]
    with open(os.path.join(HERE, "summary.json"), "w") as f:
        json.dump(rows, f, indent=2)
    eff = [r for r in rows if r["run"].startswith("effort_c")]
    if len(eff) > 1:
        sweep_plot(eff, "effort_coefficient", "effort coefficient c", os.path.join(HERE, "effort_sweep.png"), True)
    per = [r for r in rows if r["run"].startswith("period_T")]
    if len(per) > 1:
        sweep_plot(per, "period", "period T (s)", os.path.join(HERE, "periods.png"), False, marks=(1.042, 2.612))
    print("| run | T (s) | c | steps | train (s) | ee error T/2 high-acc. (mm) | fixed-step (mm) | periodicity | "
          "‖p(T/2)‖ rel. | max‖q(t)-q(T-t)‖₁ | line-shaped | effort |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(f"| {r['run']} | {r['period']:.3f} | {r['effort_coefficient']:g} | {r['steps']} | {r['train_s']:.0f} | "
              f"{1e3 * r['ee_error_half_period']:.1f} | {1e3 * (r['ee_error_fixed_step'] or float('nan')):.1f} | "
              f"{r['periodicity_error']:.3g} | {r['p_half_relative']:.2g} | {r['symmetry_error_q']:.2g} | "
              f"{r['line_shaped']} | {r['effort']:.4g} |")
    for r in rows:
        for tag, s in r.get("stabilize", {}).items():
            print(f"\n{r['run']} / {tag}: gains {s['gains']}, b = {s['damping']}: multipliers (autodiff) "
                  f"{', '.join(f'{x:.3g}' for x in s['multipliers'])}; max (FD) {s['max_multiplier_fd']:.3g}; "
                  f"|M_ad - M_fd| {s['monodromy_difference']:.2e} (|M| {s['monodromy_max_abs']:.3g}); energy "
                  f"multiplier predicted {s['energy_multiplier_predicted']:.3g}; ratio form "
                  f"{', '.join(f'{x:.3g}' for x in s['ratio_multipliers'])}; "
                  f"grid {s['grid_converged']}/{s['grid_size']}")
            for name, run in s["runs"].items():
                print(f"  {name}: |H-E*| {run['energy_error_start']:.3g} -> {run['energy_error_end']:.3g} "
                      f"(max increase {run['energy_error_max_increase']:.2g}), d_q {run['dist_q_start']:.3g} -> "
                      f"{run['dist_q_end']:.3g}, d_p {run['dist_p_start']:.3g} -> {run['dist_p_end']:.3g}, "
                      f"|work| stabiliser {run['injected_energy_abs_stabilizer']:.3g} J, mode term "
                      f"{run['injected_energy_abs_mode_term']:.3g} J, all actuators {run['actuator_work_abs']:.3g} J, "
                      f"effort {run['actuator_effort']:.4g}")
            t = s["tracking"]
            print(f"  tracking (computed-torque PD kp={t['kp']:g}, kd={t['kd']:g}): "
                  f"|work| {t['actuator_work_abs']:.3g} J, effort {t['actuator_effort']:.4g}")


if __name__ == "__main__":
    main()
