"""The work behind ``diffmech eigenmode learn | stabilize | report``: runs, metrics files, figures."""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import numpy as np
import torch

from .. import _log
from .._warnings import warn
from ..errors import ConvergenceError, DiffmechError
from .configs import get_config, smoke_test_note
from .eigenmodes import EigenmodeTrainer, half_index
from .floquet import limit_cycle, monodromy_autodiff, monodromy_fd, multipliers, orbit_point, ratio_multipliers
from .stabilize import ModeStabilizer, Orbit, TrackingController, signals, simulate, simulate_ivp
from .verify import as_float64, verify_mode

log = _log.get("eigenmode")

__all__ = ["learn", "finish_learn", "stabilize", "report", "format_metrics", "config_overrides"]


def _dump(path: str, obj) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=2, default=_json_default)
    os.replace(path + ".tmp", path)


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if isinstance(o, complex):
        return [o.real, o.imag]
    raise TypeError(f"not JSON serialisable: {type(o)}")


def config_overrides(args: argparse.Namespace) -> dict:
    """Config fields set on the command line."""
    ov: dict = {}
    if args.q0 is not None:
        ov["q0"] = tuple(args.q0)
    if args.target_angles is not None:
        ov["target_angles"] = tuple(args.target_angles)
        ov["target_position"] = None
    if args.period is not None:
        ov["period"] = args.period
        ov["learn_period"] = False
    if args.learn_period:
        ov["learn_period"] = True
    for name in ("effort", "epochs", "steps_per_epoch", "lr", "method", "adjoint", "dtype", "device", "seed"):
        val = getattr(args, name, None)
        if val is not None:
            ov[name] = val
    if args.stop_ee is not None:
        ov["stop_ee"] = args.stop_ee
    if getattr(args, "effort_descent", False):
        ov["effort_descent"] = True
    return ov


# ---------------------------------------------------------------------------- learn
# the files a 'learn' run writes (removed by --overwrite; the first two mark a folder that holds a run)
RUN_FILES = ("checkpoint.pt", "metrics.json", "history.csv", "config.json", "trajectory.csv", "training.png",
             "mode.png", "potential.png", "control.png", "mode.gif", "report.md")


def learn(args: argparse.Namespace) -> dict:
    from ..cli_checks import prepare_run_folder

    t0 = time.perf_counter()
    out = args.out
    ov = config_overrides(args)
    ckpt = os.path.join(out, "checkpoint.pt")
    resume = bool(getattr(args, "resume", False))
    # a finished or interrupted run is never replaced silently: --resume continues it, --overwrite replaces it
    prepare_run_folder(out, markers=("checkpoint.pt", "metrics.json"), remove=RUN_FILES, resume=resume,
                       overwrite=bool(getattr(args, "overwrite", False)))
    if resume and os.path.exists(ckpt):
        trainer = EigenmodeTrainer.load(out, **ov)
    else:
        trainer = EigenmodeTrainer(get_config(args.config, **ov), out)
    os.makedirs(out, exist_ok=True)
    trainer.train(progress=False if args.no_progress else None)
    return finish_learn(trainer, out, plots=not args.no_plots, started=t0)


def finish_learn(trainer: EigenmodeTrainer, out: str, *, plots: bool = True, started: float | None = None) -> dict:
    """Verify the trained mode with ``solve_ivp``, write ``metrics.json``, ``trajectory.csv`` and figures."""
    cfg = trainer.cfg
    T = float(trainer.period.detach())
    tv = time.perf_counter()
    m, traj = verify_mode(trainer.system, cfg.q0, T, trainer.target)
    verify_s = time.perf_counter() - tv
    with torch.no_grad():
        flow = trainer.flow(grad=False)
        n = trainer.system.n
        ih = half_index(flow.grid)
        X = flow.X
        ee_d = float((trainer.system.end_effector(X[ih, :n]) - trainer.target).norm())
    stats = trainer.cache.stats
    note = smoke_test_note(cfg)
    metrics = {
        "config": cfg.name,
        **({"smoke_test": True, "note": note} if note else {"smoke_test": False}),
        "ee_error_half_period": m["ee_error_half_period"],
        "periodicity_error": m["periodicity_error"],
        "p_half_norm": m["p_half_norm"],
        "effort": m["effort"],
        "period": T,
        "wall_s": (time.perf_counter() - started) if started is not None else trainer.train_seconds + verify_s,
        "train_s": trainer.train_seconds,
        "verify_s": verify_s,
        "steps": len(trainer.history),
        "adam_steps": sum(r.get("phase", "adam") == "adam" for r in trainer.history),
        "polish": trainer.polish_info,
        "init": trainer.init_info,
        "epochs": trainer.epoch,
        "stopped_early": trainer.stopped_early,
        "s_per_step": trainer.train_seconds / max(len(trainer.history), 1),
        "fixed_step": {"ee_error_half_period": ee_d, "p_half_norm": float(X[ih, n:].norm()),
                       "periodicity_error": float((X[-1] - X[0]).norm()), "method": cfg.method,
                       "grid_points": int(flow.grid.numel())},
        "newton": {"mean_iterations": float(np.mean([s.get("iterations", 0) for s in stats])) if stats else 0.0,
                   "fallbacks": int(sum(bool(s.get("fallback")) for s in stats))},
        "high_accuracy": {k: v for k, v in m.items() if k not in ("ee_half_period", "target")},
        "ee_half_period": m.get("ee_half_period"),
        "target": m.get("target"),
        "q0": list(cfg.q0),
        "effort_coefficient": cfg.effort,
        "learn_period": cfg.learn_period,
        "torch_threads": torch.get_num_threads(),
    }
    os.makedirs(out, exist_ok=True)
    _dump(os.path.join(out, "metrics.json"), metrics)
    _write_trajectory(os.path.join(out, "trajectory.csv"), traj)
    if plots:
        from . import plots as P

        P.plot_training(trainer.history, os.path.join(out, "training.png"))
        P.plot_mode(trainer.system, traj, m.get("target"), os.path.join(out, "mode.png"))
        P.plot_potential(trainer.system, traj, os.path.join(out, "potential.png"))
        P.plot_control(traj, os.path.join(out, "control.png"))
        P.animate(trainer.system, traj["q"], os.path.join(out, "mode.gif"), t=traj["t"], target=m.get("target"),
                  title=f"learned mode ({cfg.name}), T = {T:.2f} s")
    return metrics


def _write_trajectory(path: str, traj: dict) -> None:
    t, q, p, ee, H, u = traj["t"], traj["q"], traj["p"], traj["ee"], traj["H"], traj["u"]
    n = q.shape[1]
    cols = ["t"] + [f"q{i + 1}" for i in range(n)] + [f"p{i + 1}" for i in range(n)] + ["ee_x", "ee_y", "ee_z", "H"] \
        + [f"u{i + 1}" for i in range(n)]
    data = np.column_stack([t, q, p, ee, H, u])
    np.savetxt(path, data[:: max(1, len(t) // 500)], delimiter=",", header=",".join(cols), comments="", fmt="%.10g")


# ---------------------------------------------------------------------------- stabilize
def _run_signals(stab: ModeStabilizer, t: torch.Tensor, X: torch.Tensor) -> dict:
    sg = signals(stab, X)
    with torch.no_grad():
        v = stab.system.velocity(X[..., : stab.system.n], X[..., stab.system.n:])
        u_total = stab.force(X) + stab.system.control_force(X[..., : stab.system.n])
    out = {k: sg[k].cpu().numpy() for k in ("H", "dist_q", "dist_p", "power_E", "power_M", "s", "sigma")}
    out["t"] = t.cpu().numpy()
    out["q"] = X[..., : stab.system.n].cpu().numpy()
    out["power_total"] = (v * u_total).sum(-1).cpu().numpy()
    out["u_total_sq"] = u_total.square().sum(-1).cpu().numpy()
    out["u_s_sq"] = (sg["u_E"] + sg["u_M"]).square().sum(-1).cpu().numpy()
    return out


def _cumtrapz(y: np.ndarray, t: np.ndarray) -> np.ndarray:
    return np.concatenate([[0.0], np.cumsum(0.5 * (y[1:] + y[:-1]) * np.diff(t))])


def _summary(r: dict, E: float) -> dict:
    err = np.abs(r["H"] - E)
    t = r["t"]
    return {
        "energy_error_start": float(err[0]), "energy_error_end": float(err[-1]),
        "energy_error_max_increase": float(np.max(np.diff(err), initial=0.0)),
        "dist_q_start": float(r["dist_q"][0]), "dist_q_end": float(r["dist_q"][-1]),
        "dist_p_start": float(r["dist_p"][0]), "dist_p_end": float(r["dist_p"][-1]),
        "injected_energy_abs_stabilizer": float(np.trapezoid(np.abs(r["power_E"] + r["power_M"]), t)),
        "injected_energy_abs_mode_term": float(np.trapezoid(np.abs(r["power_M"]), t)),
        "actuator_work_abs": float(np.trapezoid(np.abs(r["power_total"]), t)),
        "actuator_effort": float(np.trapezoid(r["u_total_sq"], t)),
        "stabilizer_effort": float(np.trapezoid(r["u_s_sq"], t)),
        "H_end": float(r["H"][-1]), "H_mean_last_period": float(np.mean(r["H"][-len(t) // 3:])),
    }


def stabilize(args: argparse.Namespace) -> dict:
    t_start = time.perf_counter()
    out = args.dir
    mpath = os.path.join(out, "metrics.json")
    from ..cli_checks import RunFolderError, check_existing_folder, check_out_folder

    check_existing_folder(out, "run folder")
    check_out_folder(out, "run folder")  # its results are written into it
    if not os.path.exists(os.path.join(out, "checkpoint.pt")):
        raise RunFolderError(f"{out}: no checkpoint.pt (run 'diffmech eigenmode learn --out {out}' first)")
    trainer = EigenmodeTrainer.load(out)
    cfg = trainer.cfg
    system = as_float64(trainer.system)
    n = system.n
    T = float(trainer.period.detach())
    gains = tuple(args.gains) if args.gains is not None else tuple(cfg.gains)
    damping = float(args.damping) if args.damping is not None else float(cfg.damping)
    q0 = torch.tensor(cfg.q0, dtype=torch.float64)
    if args.start is not None:
        if len(args.start) != 2 * n:
            raise DiffmechError(f"--start needs {2 * n} numbers (q1..q{n} p1..p{n}), got {len(args.start)}")
        x_start = torch.tensor(args.start, dtype=torch.float64)
    elif cfg.start is not None:
        x_start = torch.tensor(cfg.start, dtype=torch.float64)
    else:
        x_start = torch.cat([q0 + 0.7, torch.full((n,), 5.0, dtype=torch.float64)])
    # the defaults scale with the run: a smoke-test configuration gets a smoke-test stabilisation
    smoke = smoke_test_note(cfg) is not None
    periods = float(args.periods) if getattr(args, "periods", None) is not None else (1.0 if smoke else 3.0)
    grid_n = int(args.grid) if getattr(args, "grid", None) is not None else (2 if smoke else 4)
    ms = int(args.monodromy_steps) if getattr(args, "monodromy_steps", None) is not None else (101 if smoke else 601)
    grid_periods = 2 if smoke else 5
    if periods <= 0 or grid_n < 1 or ms < 3:
        raise DiffmechError(f"--periods must be > 0, --grid >= 1, --monodromy-steps >= 3 "
                            f"(got {periods}, {grid_n}, {ms})")
    _log.show()
    log.info("stabilize %s: %g periods, grid %d x %d, %d monodromy steps per period%s", out, periods, grid_n,
             grid_n, ms, " (smoke-test settings)" if smoke else "")
    orbit = Orbit.from_system(system, q0, T, samples=1001)
    stab = ModeStabilizer(system, orbit, gains=gains, damping=0.0)
    horizon = periods * T
    steps = int(round(333 * periods))
    E = orbit.energy
    runs: dict[str, dict] = {}
    summaries: dict[str, dict] = {}

    def run(name: str, st: ModeStabilizer, ivp: bool = False):
        log.info("stabilize: simulating %s", name)
        if ivp:
            t, X = simulate_ivp(st.field, x_start, horizon, samples=steps + 1, rtol=1e-8, atol=1e-8)
        else:
            with torch.no_grad():
                t, X = simulate(st.field, x_start, horizon, steps, method="midpoint")
        runs[name] = _run_signals(st, t, X)
        summaries[name] = _summary(runs[name], E)

    run("projected (midpoint)", stab)
    run("projected (DOP853)", stab, ivp=True)
    run("unprojected (midpoint)", ModeStabilizer(system, orbit, gains=gains, projected=False))
    for b in ([damping] if damping > 0 else [0.1, 0.5]):
        run(f"projected, b={b:g}", ModeStabilizer(system, orbit, gains=gains, damping=b))

    # a grid of perturbed starts, batched
    log.info("stabilize: a grid of %d perturbed starts over %d periods", grid_n * grid_n, grid_periods)
    offs = np.linspace(-0.6, 0.6, grid_n)
    starts = []
    for a in offs:
        for b_ in offs:
            x = x_start.clone()
            x[:n] = q0 + torch.tensor([a, b_] + [0.0] * (n - 2), dtype=torch.float64)[:n]
            x[n:] = 0.0
            starts.append(x)
    S = torch.stack(starts)
    with torch.no_grad():
        _, XG = simulate(stab.field, S, grid_periods * T, int(round(grid_periods * 333)), method="midpoint")
        sg_end = signals(stab, XG[:, -1])
        sg_0 = signals(stab, XG[:, 0])
    grid = {"starts": S.numpy(), "horizon_periods": grid_periods,
            "energy_error_start": np.abs(sg_0["H"].numpy() - E), "energy_error_end": np.abs(sg_end["H"].numpy() - E),
            "dist_q_end": sg_end["dist_q"].numpy(), "dist_p_end": sg_end["dist_p"].numpy()}
    grid["converged"] = int(((grid["dist_q_end"] < 1e-2) & (grid["energy_error_end"] < 1e-2)).sum())

    # tracking controller on the same orbit, same start and horizon
    t0_phase = float(orbit.closest(x_start[:n]))
    track = TrackingController(system, orbit, t0=t0_phase)
    with torch.no_grad():
        tt, XT = simulate(track.field, x_start, horizon, steps, method="midpoint", time_dependent=True)
        uT = track.force(tt, XT)
        vT = system.velocity(XT[:, :n], XT[:, n:])
    PT = (vT * uT).sum(-1).numpy()
    tracking = {"kp": track.kp, "kd": track.kd, "actuator_work_abs": float(np.trapezoid(np.abs(PT), tt.numpy())),
                "actuator_effort": float(np.trapezoid(uT.square().sum(-1).numpy(), tt.numpy()))}

    # cycle multipliers on the closed loop's own limit cycle (next to the stored orbit), undamped
    log.info("stabilize: limit cycle and monodromy matrices (%d RK4 steps per period)", ms)
    try:
        cyc = limit_cycle(stab, steps=ms)
        cycle_note = "the closed loop's limit cycle"
    except ConvergenceError as err:
        # A mode far from periodic (an early or failed training) has no limit cycle next to its
        # stored orbit: linearise along the stored orbit instead, and say so.
        cyc = {"x0": orbit_point(stab, 0.25), "period": float(T), "gap": None, "return_error": None}
        cycle_note = f"the stored orbit ({err}; the multipliers linearise along an orbit that is not periodic)"
        warn(f"eigenmode stabilize: {cycle_note}")
    x0, Tc = cyc["x0"], cyc["period"]
    tm = time.perf_counter()
    Ma = monodromy_autodiff(stab, x0, Tc, steps=ms)
    t_ad = time.perf_counter() - tm
    tm = time.perf_counter()
    Mf = monodromy_fd(stab, x0, Tc, steps=ms)
    t_fd = time.perf_counter() - tm
    with torch.no_grad():
        f0 = stab.field(x0)
    mu_a = multipliers(Ma, f0)
    mu_f = multipliers(Mf, f0)
    ratio = ratio_multipliers(stab, x0, Tc, steps=ms)
    tq = orbit.t.numpy()
    with torch.no_grad():
        pn = (orbit.x[:, n:] * system.velocity(orbit.x[:, :n], orbit.x[:, n:])).sum(-1).clamp_min(0).sqrt().numpy()
    mu_energy_pred = math.exp(-gains[0] * float(np.trapezoid(pn, tq)))
    floquet = {
        "x0": x0.tolist(), "steps_per_period": ms, "limit_cycle_period": Tc, "limit_cycle_gap_q": cyc["gap"],
        "limit_cycle_return_error": cyc["return_error"], "linearised_along": cycle_note,
        "autodiff": {"multipliers": [complex(z) for z in mu_a["nontrivial"]], "moduli": mu_a["moduli"],
                     "trivial": mu_a["trivial"], "max_modulus": mu_a["max_modulus"], "seconds": t_ad},
        "finite_differences": {"multipliers": [complex(z) for z in mu_f["nontrivial"]], "moduli": mu_f["moduli"],
                               "trivial": mu_f["trivial"], "max_modulus": mu_f["max_modulus"], "seconds": t_fd},
        "monodromy_max_abs_difference": float((Ma - Mf).abs().max()),
        "monodromy_max_abs": float(Ma.abs().max()),
        "energy_multiplier_predicted": mu_energy_pred,
        "ratio_multipliers": ratio,
    }
    result = {
        "gains": list(gains), "damping": damping, "start": x_start.tolist(), "period": T, "energy_target": E,
        "horizon_s": horizon, "settings": {"periods": periods, "grid": grid_n, "monodromy_steps": ms,
                                           "grid_periods": grid_periods, "smoke_test": smoke},
        "runs": summaries, "grid": grid, "tracking": tracking, "floquet": floquet,
        "multipliers": mu_a["moduli"], "max_multiplier": mu_a["max_modulus"],
        "wall_s": time.perf_counter() - t_start,
    }
    tag = f"_{args.tag}" if getattr(args, "tag", "") else ""
    _dump(os.path.join(out, f"stabilize{tag}.json"), result)
    if os.path.exists(mpath) and not tag:
        with open(mpath) as f:
            metrics = json.load(f)
        metrics.update({"multipliers": mu_a["moduli"], "max_multiplier": mu_a["max_modulus"],
                        "multipliers_fd": mu_f["moduli"], "stabilize_gains": list(gains)})
        _dump(mpath, metrics)
    if not args.no_plots:
        from . import plots as P

        P.plot_stabilization(runs, E, os.path.join(out, f"stabilize{tag}.png"))
        P.plot_multipliers({"autodiff": mu_a["all"], "finite differences": mu_f["all"]},
                           os.path.join(out, f"multipliers{tag}.png"))
        r0 = runs["projected (midpoint)"]
        ts = r0["t"]
        un = runs["unprojected (midpoint)"]
        curves = {"mode controller: |q_dot . u| (V_theta + u_E + u_M)": _cumtrapz(np.abs(r0["power_total"]), ts),
                  "mode controller: u_E + u_M only": _cumtrapz(np.abs(r0["power_E"] + r0["power_M"]), ts),
                  "unprojected variant: u_E + u_M": _cumtrapz(np.abs(un["power_E"] + un["power_M"]), ts),
                  "computed-torque PD tracking": _cumtrapz(np.abs(PT), tt.numpy())}
        P.plot_efficiency(ts, curves,
                          os.path.join(out, f"efficiency{tag}.png"), "cumulative |power| (J)")
        P.animate(system, r0["q"], os.path.join(out, f"stabilize{tag}.gif"), t=ts, orbit_q=orbit.x[:, :n].numpy(),
                  target=trainer.target.double().numpy(), frames=90, title="stabilisation from a perturbed start")
    note = smoke_test_note(cfg)
    return {"config": cfg.name, **({"note": note} if note else {}),
            **{k: result[k] for k in ("gains", "damping", "max_multiplier", "multipliers", "wall_s")},
            "runs": summaries, "monodromy_difference": floquet["monodromy_max_abs_difference"],
            "grid_converged": f"{grid['converged']}/{len(starts)}"}


# ---------------------------------------------------------------------------- report
def format_metrics(m: dict, *, stabilize: bool = False) -> str:
    if stabilize:
        lines = [f"config {m['config']}: gains {m['gains']}, damping {m['damping']}",
                 f"  max non-trivial multiplier {m['max_multiplier']:.4g}; moduli "
                 + ", ".join(f"{x:.3g}" for x in m["multipliers"]),
                 f"  monodromy autodiff vs finite differences: max |difference| {m['monodromy_difference']:.2e}",
                 f"  grid of perturbed starts converged: {m['grid_converged']}"]
        for name, s in m["runs"].items():
            lines.append(f"  {name:26s} |H-E*| {s['energy_error_start']:.3g} -> {s['energy_error_end']:.3g}, "
                         f"d_q {s['dist_q_start']:.3g} -> {s['dist_q_end']:.3g}, "
                         f"d_p {s['dist_p_start']:.3g} -> {s['dist_p_end']:.3g}")
        lines.append(f"  wall {m['wall_s']:.1f} s")
        return "\n".join(([m["note"]] if m.get("note") else []) + lines)
    # first, so that a smoke test's numbers are never read without the warning
    head = f"{m['note']}\n" if m.get("note") else ""
    return head + (f"config {m['config']}: T = {m['period']:.4g} s, end-effector error at T/2 "
            f"{1e3 * m['ee_error_half_period']:.2f} mm "
            f"(fixed-step {1e3 * m['fixed_step']['ee_error_half_period']:.2f} mm), "
            f"periodicity error {m['periodicity_error']:.3g}, |p(T/2)| {m['p_half_norm']:.3g}, "
            f"effort {m['effort']:.4g}, "
            + (f"{m['adam_steps']} Adam steps + {m['polish'].get('iterations')} Gauss-Newton iterations"
               if m.get("polish") else f"{m['steps']} steps")
            + (f" + {ed['iterations']} effort-descent steps (effort {ed['effort_start']:.4g} -> "
               f"{ed['effort_end']:.4g} on the polish grid)"
               if (ed := (m.get("polish") or {}).get("effort_descent")) else "")
            + f" in {m['train_s']:.1f} s "
            f"({1e3 * m['s_per_step']:.0f} ms/step), wall {m['wall_s']:.1f} s")


def report(out: str) -> str:
    from ..cli_checks import CheckpointError, RunFolderError, check_existing_folder

    check_existing_folder(out, "run folder")
    path = os.path.join(out, "metrics.json")
    if not os.path.exists(path):
        raise RunFolderError(f"{out}: no metrics.json (run 'diffmech eigenmode learn --out {out}')")
    try:
        with open(path) as f:
            m = json.load(f)
        if not isinstance(m, dict) or "config" not in m or "period" not in m:
            raise ValueError("not the metrics of an 'eigenmode learn' run")
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot read the run's metrics ({exc})") from None
    ha = m.get("high_accuracy", {})
    lines = [f"# Eigenmode run `{out}` (config {m['config']})", "",
             *([f"**{m['note']}.**", ""] if m.get("note") else []),
             "| quantity | value |", "| --- | --- |",
             f"| period T (s) | {m['period']:.4g}{' (learned)' if m.get('learn_period') else ''} |",
             f"| end-effector error at T/2, high-accuracy (mm) | {1e3 * m['ee_error_half_period']:.3f} |",
             f"| end-effector error at T/2, fixed-step (mm) | {1e3 * m['fixed_step']['ee_error_half_period']:.3f} |",
             f"| periodicity error after T | {m['periodicity_error']:.3g} |",
             f"| ‖p(T/2)‖ | {m['p_half_norm']:.3g} (relative {ha.get('p_half_relative', float('nan')):.3g}) |",
             f"| time-reversal symmetry max ‖q(t) - q(T-t)‖₁ (rad) | {ha.get('symmetry_error_q', float('nan')):.3g} |",
             f"| line-shaped trace | {ha.get('line_shaped')} "
             f"(min chord ratio {ha.get('line_min_chord_ratio', float('nan')):.3g}) |",
             f"| effort ∫‖u‖² dt | {m['effort']:.4g} |",
             f"| training | {m['steps']} steps, {m['train_s']:.1f} s ({1e3 * m['s_per_step']:.0f} ms/step), "
             f"wall {m['wall_s']:.1f} s |"]
    if "max_multiplier" in m:
        lines.append(f"| cycle multipliers (non-trivial moduli) | {', '.join(f'{x:.3g}' for x in m['multipliers'])} |")
        lines.append(f"| max multiplier | {m['max_multiplier']:.4g} |")
    text = "\n".join(lines) + "\n"
    with open(os.path.join(out, "report.md"), "w") as f:
        f.write(text)
    return text
