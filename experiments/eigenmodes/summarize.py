"""Collect the eigenmode runs under experiments/eigenmodes/ into summary.json, sweep figures and
markdown tables (printed), and write the seed-001 section of EXPERIMENTS.md from the committed runs.

    python experiments/eigenmodes/summarize.py                            # tables on stdout
    python experiments/eigenmodes/summarize.py --markdown EXPERIMENTS.md  # + rewrite the eigenmodes section

The section sits between ``<!-- eigenmodes:start -->`` / ``<!-- eigenmodes:end -->`` (appended when
missing). The seed's and the spec's figures it compares with are the constants under "reference
values" below, each with where it comes from.
"""

from __future__ import annotations

import argparse
import csv
import glob
import json
import os
import subprocess

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MARK_START, MARK_END = "<!-- eigenmodes:start -->", "<!-- eigenmodes:end -->"

# ---------------------------------------------------------------- reference values (seed 001, spec, issue 12)
# spec = /work/shared/specs/eigenmodes.md (section 6 thresholds are the spec author's, the seed gives none);
# seed = the paper's text (section 5); issue = issue 12, section 4 (the original code re-run on this machine).
SPEC_P_HALF_REL = 1e-2  # spec 6.4: ||p(T/2)|| <= 1e-2 max ||p||
SPEC_SYMMETRY = 1e-2  # spec 6.4: max_t ||q(t) - q(T-t)||_1 <= 1e-2 rad
SPEC_EE = 0.05  # spec 6.4: end-effector error at T/2 <= 0.05 m
SPEC_PERIODICITY = 1e-2  # spec 6.5: high-accuracy periodicity error <= 1e-2
SEED_MULTIPLIER_BOUND = 0.5  # seed section 5 / spec 5.3: non-trivial multipliers bounded by 0.5
SEED_EPOCHS, CODE_STEPS_PER_EPOCH = 500, 7  # seed Table 2; spec 2.6 (2022 code: 7 Adam steps per epoch)
ISSUE_EE, ISSUE_TRAIN_S = 0.01, 120.0  # issue 12 target: < 1 cm high-accuracy in < 2 min of training
ISSUE_REF_S_PER_STEP = "0.55-0.65"  # issue 12: the original code's step on this machine
ISSUE_REF_EE_500 = 0.094  # issue 12: the original code's main configuration after 500 steps (m)
GRID_TOL = 1e-2  # experiment.stabilize's convergence rule for the grid of starts (|H - E*| and d_q)


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


def _verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**NOT met**")


def _history(run: str) -> list[dict]:
    path = os.path.join(HERE, run, "history.csv")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [{k: float(v) for k, v in r.items()} for r in csv.DictReader(f)]


def _first_below(hist: list[dict], threshold: float) -> dict | None:
    return next((r for r in hist if r["ee_error"] < threshold), None)


def _results_commit(run: str) -> str:
    try:
        return subprocess.run(["git", "log", "-1", "--format=%h %ad", "--date=short", "--",
                               os.path.join(HERE, run, "metrics.json")], capture_output=True, text=True,
                              cwd=ROOT, timeout=10).stdout.strip() or "uncommitted"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _segments(hist: list[dict], size: int = 500) -> list[tuple[int, int, float, float, float]]:
    """(first step, last step, s/step, mean Newton iterations, fixed-step ee error at the end) per block."""
    out, prev = [], 0.0
    for a in range(0, len(hist), size):
        blk = hist[a:a + size]
        t = blk[-1]["train_seconds"]
        out.append((a, a + len(blk) - 1, (t - prev) / len(blk),
                    sum(r["newton_iterations"] for r in blk) / len(blk), blk[-1]["ee_error"]))
        prev = t
    return out


def _bench_note() -> str:
    """The convergence figures of ``benchmarks/results/eigen.json``, when it exists."""
    path = os.path.join(ROOT, "benchmarks", "results", "eigen.json")
    if not os.path.exists(path):
        return ""
    with open(path) as f:
        b = json.load(f)
    cv, step = b.get("converge"), b.get("steps", {}).get("100", {})
    if not cv:
        return ""
    ratio = ""
    if "diffmech" in step and "reference-style" in step:
        ratio = (f"; one step {1e3 * step['diffmech']['median_s']:.0f} ms vs "
                 f"{1e3 * step['reference-style']['median_s']:.0f} ms for the reference-style step "
                 f"({step['reference-style']['median_s'] / step['diffmech']['median_s']:.1f}x, target 5x)")
    return (f": with lr {cv['lr']:g} the high-accuracy error reached {1e3 * cv['ee_error_half_period']:.1f} mm after "
            f"{cv['steps']} steps and {cv['train_s']:.0f} s of training (load average "
            f"{b['load_before'][0]:.1f} -> {b['load_after'][0]:.1f} on the 2 cores){ratio}")


def section(rows: list[dict]) -> str:
    """The EXPERIMENTS.md section on the ``main`` run (seed 001, section 5 of the paper)."""
    r = next((x for x in rows if x["run"] == "main"), None)
    if r is None:
        raise SystemExit("experiments/eigenmodes/main/metrics.json is missing: run experiments/eigenmodes/run.sh main")
    with open(os.path.join(HERE, "main", "metrics.json")) as f:
        m = json.load(f)
    with open(os.path.join(HERE, "main", "config.json")) as f:
        cfg = json.load(f)
    ha, fs = m["high_accuracy"], m["fixed_step"]
    hist = _history("main")
    L = [MARK_START, "## Eigenmodes (seed 001): Wotte et al., efficient periodic motions via neural potentials", "",
         f"_Generated by `python experiments/eigenmodes/summarize.py --markdown EXPERIMENTS.md` from the committed "
         f"`experiments/eigenmodes/main/` (results commit {_results_commit('main')}); edit the script, not this "
         f"section._", "",
         "The paper's main experiment (its section 5) with `diffmech.control` (issue 12). The seed's text lost its "
         "mathematics and most numbers; the reference values below come from the seed where it states them, "
         "otherwise from the spec `shared/specs/eigenmodes.md` (whose section-6 thresholds are its author's own "
         "suggestions, not the paper's) and from issue 12 (the original code re-run on this machine).", "",
         "### Setup and commands", "",
         f"- Double pendulum `systems.double_pendulum`, masses {cfg['masses']}, lengths {cfg['lengths']}, elbow "
         f"spring k = {cfg['stiffness'][1]} about {cfg['rest'][1]:.4f} rad ({cfg['spring_factor']} convention, no "
         f"1/2), g = {cfg['gravity']}; q0 = {tuple(cfg['q0'])}, target FK{tuple(cfg['target_angles'])}, "
         f"T = {cfg['period']} s, c = {cfg['effort']:g}, weights task {cfg['w_task']:g}, lambda "
         f"{'/'.join(f'{x:g}' for x in cfg['lambdas'])}, rho {cfg['rho']:g}, {cfg['samples']} pair samples.",
         f"- Potential: {'Fourier input, ' if cfg['fourier'] else ''}{cfg['depth']} hidden layers of {cfg['hidden']} "
         f"(tanh); {cfg['dtype']}; {cfg['grid_points'] + (0 if cfg['grid_points'] % 2 else 1)}-point normalised "
         f"grid, explicit {cfg['method']}; trajectory by `solver={cfg['solver']!r}`, gradient by "
         f"`adjoint={cfg['adjoint']!r}`; Adam lr {cfg['lr']:g}, ExponentialLR {cfg['gamma']} per epoch, "
         f"{cfg['epochs']} epochs x {cfg['steps_per_epoch']} steps; `torch.set_num_threads({m['torch_threads']})`.",
         "- Verification: `solve_ivp` DOP853, rtol = atol = 1e-10, from (q0, 0) over one period. Stabilisation: "
         "gains (alpha_E, alpha_M) = (1, 10), start q = (0.2, 0.2), p = (5, 5), 3 periods, midpoint (the code's "
         "scheme) and DOP853 (rtol = atol = 1e-8).", "",
         "```bash",
         "nice -n 10 diffmech eigenmode learn --config main --out experiments/eigenmodes/main",
         "nice -n 10 diffmech eigenmode stabilize experiments/eigenmodes/main --gains 1 10",
         "python experiments/eigenmodes/summarize.py --markdown EXPERIMENTS.md",
         "```", "",
         "(`experiments/eigenmodes/run.sh main` runs the first two and two more stabilisation variants, "
         "`--gains 10 10` and `--damping 0.5`, whose results are not committed.)", ""]

    # ---------------------------------------------------------------- learned mode
    sym, per, prel = ha["symmetry_error_q"], ha["periodicity_error"], ha["p_half_relative"]
    ee = m["ee_error_half_period"]
    cm = _first_below(hist, ISSUE_EE)
    h500 = hist[499] if len(hist) >= 500 else None
    seg = _segments(hist)
    L += ["### The learned mode", "",
          "| quantity | seed / spec / issue | diffmech | verdict |", "|---|---|---|---|",
          f"| end-effector error at T/2, high-accuracy re-integration | spec: <= {1e3 * SPEC_EE:.0f} mm; issue: "
          f"< {1e3 * ISSUE_EE:.0f} mm; original code {1e3 * ISSUE_REF_EE_500:.0f} mm after 500 steps | "
          f"**{1e3 * ee:.2f} mm** (training grid: {1e3 * fs['ee_error_half_period']:.2f} mm) | "
          f"{_verdict(ee <= SPEC_EE and ee < ISSUE_EE)} |",
          f"| ‖p(T/2)‖ / max ‖p‖ | spec: <= {SPEC_P_HALF_REL:g} | {prel:.2g} (‖p(T/2)‖ = {ha['p_half_norm']:.3g}, "
          f"max {ha['p_max']:.3g}) | {_verdict(prel <= SPEC_P_HALF_REL)} |",
          f"| time-reversal symmetry max ‖q(t) - q(T-t)‖₁ | spec: <= {SPEC_SYMMETRY:g} rad | **{sym:.3f} rad** "
          f"(momentum antisymmetry max ‖p(t) + p(T-t)‖₁ {ha['symmetry_error_p']:.3g}) | "
          f"{_verdict(sym <= SPEC_SYMMETRY)} |",
          f"| periodicity ‖x(T) - x(0)‖ | spec: <= {SPEC_PERIODICITY:g} | **{per:.3f}** (q part "
          f"{ha['periodicity_error_q']:.2g} rad, p part {ha['periodicity_error_p']:.3g}); on the training grid "
          f"{fs['periodicity_error']:.3g} | {_verdict(per <= SPEC_PERIODICITY)} |",
          f"| line-shaped configuration trace | seed: the learned modes are line-shaped (its Fig. 6c) | "
          f"{ha['line_shaped']}: no self-intersection ({ha['line_self_intersections']}), min chord ratio "
          f"{ha['line_min_chord_ratio']:.2f}, but the criterion also asks for the symmetry above | "
          f"{_verdict(bool(ha['line_shaped']))} |",
          f"| energy drift of H_theta in the re-integration | conserved (closed loop is Hamiltonian) | "
          f"{ha['energy_drift']:.2g} J | {_verdict(ha['energy_drift'] < 1e-6)} |",
          f"| effort ∫‖u‖² dt | seed: plots only (its Fig. 10) | {m['effort']:.4g} N²m²s | n/a |",
          f"| training | seed: {SEED_EPOCHS} epochs = {SEED_EPOCHS * CODE_STEPS_PER_EPOCH} Adam steps in the 2022 "
          f"code; issue: original code {ISSUE_REF_S_PER_STEP} s/step; target < 1 cm in < {ISSUE_TRAIN_S:.0f} s | "
          f"{m['steps']} steps, **{m['train_s']:.0f} s** ({m['s_per_step']:.2f} s/step); fixed-step error "
          + (f"first < 1 cm at step {int(cm['step'])} after {cm['train_seconds']:.0f} s" if cm else "never < 1 cm")
          + (f"; {1e3 * h500['ee_error']:.0f} mm after 500 steps" if h500 else "")
          + f" | {_verdict(ee < ISSUE_EE and m['train_s'] < ISSUE_TRAIN_S)} |", ""]

    # ---------------------------------------------------------------- stabilisation
    st = r.get("stabilize", {}).get("default")
    if st:
        with open(os.path.join(HERE, "main", "stabilize.json")) as f:
            sj = json.load(f)
        runs, fl = st["runs"], sj["floquet"]
        E = sj["energy_target"]
        dop, mid, unp = runs["projected (DOP853)"], runs["projected (midpoint)"], runs["unprojected (midpoint)"]
        mu = st["multipliers"]
        ratio = max(abs(x) for x in st["ratio_multipliers"])
        L += ["### Stabilisation and certification", "",
              f"Gains {st['gains']}, no damping, start {[round(x, 3) for x in sj['start']]}, horizon "
              f"{sj['horizon_s']:.2f} s; target energy E* = {E:.4f} J. Multipliers on the closed loop's own limit "
              f"cycle (period {fl['limit_cycle_period']:.4f} s, {fl['steps_per_period']} steps per period).", "",
              "| quantity | seed / spec | diffmech | verdict |", "|---|---|---|---|",
              f"| non-trivial cycle multipliers (monodromy eigenvalues) | seed: all < 1, bounded by "
              f"{SEED_MULTIPLIER_BOUND} | {', '.join(f'{x:.3g}' for x in mu)} (autodiff); max "
              f"{st['max_multiplier_fd']:.3g} by finite differences; trivial {st['trivial'][0]:.3f} | "
              f"{_verdict(max(mu) <= SEED_MULTIPLIER_BOUND)} |",
              f"| monodromy matrix, autodiff vs finite differences | spec: compute both | max difference "
              f"{st['monodromy_difference']:.2g} (entries up to {st['monodromy_max_abs']:.3g}) | n/a |",
              f"| ratio-form multipliers (spec's reconstruction of the seed's eq. 22) | seed: < 1 | "
              f"{', '.join(f'{x:.3g}' for x in st['ratio_multipliers'])} | {_verdict(ratio < 1)} |",
              f"| energy-direction multiplier | exp(-alpha_E ∫‖p*‖_M⁻¹ dt) | predicted "
              f"{st['energy_multiplier_predicted']:.3g}; the eigenvalue {sorted(mu)[1]:.3g} | n/a |",
              f"| \\|H - E*\\| | seed: converges to E*; spec: never increases | {dop['energy_error_start']:.3g} -> "
              f"{dop['energy_error_end']:.2g} J (DOP853, largest increase {dop['energy_error_max_increase']:.1g}); "
              f"midpoint {mid['energy_error_start']:.3g} -> {mid['energy_error_end']:.2g} (largest increase "
              f"{mid['energy_error_max_increase']:.2g}) | {_verdict(dop['energy_error_end'] < 1e-4)} |",
              f"| distance to the orbit in q / in p | seed: -> 0 | {dop['dist_q_start']:.3g} -> "
              f"{dop['dist_q_end']:.2g} rad / {dop['dist_p_start']:.3g} -> {dop['dist_p_end']:.2g} (DOP853) | "
              f"{_verdict(dop['dist_q_end'] < 1e-2 and dop['dist_p_end'] < 1e-1)} |",
              f"| energy the mode-stabilising term injects | seed: none (projected) | "
              f"{dop['injected_energy_abs_mode_term']:.2g} J (∫\\|power\\|) | "
              f"{_verdict(dop['injected_energy_abs_mode_term'] < 1e-9)} |",
              f"| projected vs unprojected controller, ∫\\|power\\| of u_E + u_M | seed: the projection injects "
              f"less | {mid['injected_energy_abs_stabilizer']:.3g} J vs {unp['injected_energy_abs_stabilizer']:.3g} J "
              f"(midpoint) | "
              f"{_verdict(mid['injected_energy_abs_stabilizer'] < unp['injected_energy_abs_stabilizer'])} |"]
        for name, run in runs.items():
            if name.startswith("projected, b="):
                below = run["H_mean_last_period"] < E
                L.append(f"| damping {name.split(', ')[1]}: H over the last period, distance to the orbit | seed: "
                         f"H oscillates below E*, the state stays near the mode | mean H "
                         f"{run['H_mean_last_period']:.3f} J (E* {E:.3f}); d_q {run['dist_q_end']:.3g} rad, d_p "
                         f"{run['dist_p_end']:.3g} at the end | {_verdict(below and run['dist_q_end'] < 0.1)} "
                         "(qualitative; the seed's b values are unknown) |")
        t = st["tracking"]
        L.append(f"| actuator work and effort vs a tracking controller (computed-torque PD kp {t['kp']:g}, kd "
                 f"{t['kd']:g}, same orbit, start, horizon) | n/a (beyond the paper) | ∫\\|power\\| "
                 f"{dop['actuator_work_abs']:.0f} J vs {t['actuator_work_abs']:.0f} J, effort "
                 f"{dop['actuator_effort']:.0f} vs {t['actuator_effort']:.0f} | n/a |")
        g = sj["grid"]
        fails = [(tuple(round(v, 2) for v in s0[:2]), e0, e1, dq) for s0, e0, e1, dq in
                 zip(g["starts"], g["energy_error_start"], g["energy_error_end"], g["dist_q_end"])
                 if not (e1 < GRID_TOL and dq < GRID_TOL)]
        L += [f"| grid of {len(g['starts'])} starts at rest, q in {{-1.1, -0.7, -0.3, 0.1}}², "
              f"{g['horizon_periods']} periods, midpoint | n/a (ours) | {g['converged']}/{len(g['starts'])} end with "
              f"\\|H - E*\\| and d_q < {GRID_TOL:g} | see below |", ""]
        if fails:
            L.append("Grid starts outside the rule: " + "; ".join(
                f"q0 = {q}: \\|H - E*\\| {e0:.3g} -> {e1:.3g} J, d_q {dq:.2g} rad" for q, e0, e1, dq in fails)
                + ". The grid runs use the midpoint scheme, whose energy settles about "
                f"{mid['energy_error_end']:.3f} J off E* (the projected midpoint run above), so energy errors "
                "just above the rule with d_q below 1e-3 rad are at the rule's edge rather than failures to "
                "converge; a start whose energy error barely shrinks did not reach the orbit within the horizon.")
            L.append("")

    # ---------------------------------------------------------------- figures
    figs = [("Fig. 4", "the closed-loop motion over one period", "mode.png", "mode.gif"),
            ("Fig. 5", "open-loop and learned potential over the configuration space", "potential.png", None),
            ("Fig. 6", "control inputs; configuration trace", "control.png", None),
            ("Fig. 7", "stabilisation from the perturbed start: energy, distances, q, p", "stabilize.png",
             "stabilize.gif"),
            ("text of section 5", "cycle multipliers", "multipliers.png", None),
            ("none", "training curves (loss terms, end-effector error, effort)", "training.png", None),
            ("none", "injected energy: stabilising controller vs tracking", "efficiency.png", None)]
    L += ["### Figures", "", "| seed | content | diffmech |", "|---|---|---|"]
    for sf, what, png, gif in figs:
        if not os.path.exists(os.path.join(HERE, "main", png)):
            continue
        link = f"[{png}](experiments/eigenmodes/main/{png})"
        if gif and os.path.exists(os.path.join(HERE, "main", gif)):
            link += f", [{gif}](experiments/eigenmodes/main/{gif})"
        L.append(f"| {sf} | {what} | {link} |")
    L.append("")

    # ---------------------------------------------------------------- where we differ
    L += ["### Where diffmech's results differ, and why", "",
          f"- **Symmetry {sym:.3f} rad and periodicity {per:.3f} above the spec's {SPEC_SYMMETRY:g}.** The loss "
          f"imposes the eigenmode conditions only on the {fs['grid_points']}-point midpoint grid "
          f"(dt = T/100 = {1e3 * cfg['period'] / 100:.0f} ms, |p| up to {ha['p_max']:.1f}), through max-over-samples "
          f"L1 terms with the seed code's weights (the p-antisymmetry weight is "
          f"{cfg['lambdas'][1]:g}). On that grid the orbit closes to {fs['periodicity_error']:.3g} with "
          f"‖p(T/2)‖ {fs['p_half_norm']:.2g}; the exact flow of the same closed loop closes in q "
          f"({ha['periodicity_error_q']:.1g} rad) but not in p ({ha['periodicity_error_p']:.3f}), so the trained "
          "potential partly relies on the midpoint scheme's error (the case the spec's periodicity check is there "
          "to catch). The seed trains on the same grid and reports neither number, so whether its orbits share "
          "the gap is unknown. Not tried yet: training on a finer grid or with RK4 (`grid_points`, `method` in the "
          "config), a final fine-grid phase, a larger p-antisymmetry weight. The line-shape verdict fails only "
          "through the symmetry bound; the trace has no self-intersection.",
          f"- **Training {m['train_s']:.0f} s against the {ISSUE_TRAIN_S:.0f} s target.** The run follows the "
          f"seed's protocol ({m['steps']} Adam steps, lr {cfg['lr']:g}, decay {cfg['gamma']} per epoch of "
          f"{cfg['steps_per_epoch']} steps); the fixed-step error first drops below 1 cm at step "
          f"{int(cm['step']) if cm else '-'}, so at this learning rate the step count alone misses the target at "
          f"any step time above {ISSUE_TRAIN_S / int(cm['step']) * 1e3 if cm else float('nan'):.0f} ms. The step "
          "time was not steady: "
          + ", ".join(f"steps {a}-{b}: {1e3 * sp:.0f} ms/step, {it:.2f} Newton iterations" for a, b, sp, it, _ in seg)
          + f" ({m['newton']['fallbacks']} sequential fallbacks over the run). The first 500 steps cost several "
          "times the later ones without needing more Newton iterations; the cause is not established (the "
          "machine was shared and metrics.json records no load). `benchmarks/bench_eigen.py` times one step "
          "against a reference-style step, and the convergence with one step per epoch at a larger learning rate "
          "(BENCHMARKS.md, section *Eigenmode learning*)" + _bench_note() + ".",
          f"- **Multipliers far below the seed's bound** ({max(mu):.3g} vs {SEED_MULTIPLIER_BOUND}). The seed "
          "gives only the bound; ours are measured on the controlled loop's own limit cycle (the learned orbit "
          f"is not exactly periodic, see above; the cycle has period {fl['limit_cycle_period']:.4f} s and lies "
          f"within {fl['limit_cycle_gap_q']:.1g} rad of the learned orbit) with the trivial multiplier "
          f"({st['trivial'][0]:.3f}) excluded, and the autodiff and finite-difference monodromy agree."
          if st else "", ""]
    L.append(MARK_END)
    return "\n".join(x for x in L if x is not None)


def update_markdown(path: str, text: str) -> None:
    old = open(path).read() if os.path.exists(path) else "# Experiments\n"
    if MARK_START in old and MARK_END in old:
        a, b = old.index(MARK_START), old.index(MARK_END) + len(MARK_END)
        new = old[:a] + text + old[b:]
    else:
        new = old.rstrip("\n") + "\n\n" + text + "\n"
    with open(path, "w") as f:
        f.write(new)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--markdown", default=None, help="rewrite the eigenmodes section of this file (EXPERIMENTS.md)")
    args = ap.parse_args(argv)
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
    if args.markdown:
        update_markdown(args.markdown, section(rows))
        print(f"\nwrote the eigenmodes section of {args.markdown}")


if __name__ == "__main__":
    main()
