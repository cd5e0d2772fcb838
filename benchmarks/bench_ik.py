"""Inverse kinematics on the Panda: diffmech's batched solver vs Pinocchio's CLIK loop, same targets.

Targets: the pose of ``panda_virtual_ee_link`` at ``--n`` random configurations within the joint
limits (so every target is reachable). A target counts as solved when the link is within 1e-4 m and
1e-3 rad of it (``--tol-position``, ``--tol-orientation``), the joints within their limits.

- *diffmech*: one call ``diffmech.ik.solve_ik(robot, link, targets, generator=...)`` on the whole
  batch: Levenberg-Marquardt on the link pose, projected steps within the limits, first start the
  middle of the limits, on a stalled attempt the target's next random starts in parallel; at most
  ``--max-iterations`` rounds per target, restarts included.
- *Pinocchio CLIK*: the damped least-squares loop of Pinocchio's inverse-kinematics example
  (``forwardKinematics``, ``log6`` of the joint placement error in the joint frame,
  ``computeJointJacobian``, ``Jlog6``, ``v = -J^T (J J^T + damp I)^-1 err``, ``integrate(q, v DT)``),
  written for the link frame (the target moved to the parent joint), with the same stopping test,
  the joints clipped to their limits after each step, and the same starts in the same order: the
  middle of the limits, then diffmech's restart configurations one after another, each attempt
  capped at ``--max-iterations`` steps.

Both run on one thread (``--threads``) in the same process, interleaved repeat by repeat; wall
times are medians. Every diffmech solution is also checked with Pinocchio's forward kinematics.

    python benchmarks/bench_ik.py --quick      # seconds; writes only where --json/--markdown say
    python benchmarks/bench_ik.py              # the run in BENCHMARKS.md and results/bench_ik.json
    python benchmarks/bench_ik.py --from-json benchmarks/results/bench_ik.json   # re-render the markdown
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # _markdown, when imported by a test

import _machine  # noqa: E402
import diffmech  # noqa: E402
from _markdown import publish, replace_section, stamp  # noqa: E402
from diffmech import spatial  # noqa: E402

MARK_START, MARK_END = "<!-- bench_ik:start -->", "<!-- bench_ik:end -->"
URDF = "panda_description/urdf/panda_no_gripper.urdf"
LINK = "panda_virtual_ee_link"


def panda_path() -> str:
    import diff_robot_data

    return os.path.join(list(diff_robot_data.__path__)[0], URDF)


def make_targets(robot, n: int, seed: int) -> torch.Tensor:
    q = robot.random_configuration(n, generator=torch.Generator().manual_seed(seed))
    return robot.link_pose(q, LINK)


# ----------------------------------------------------------------------------- diffmech
def run_diffmech(robot, T: torch.Tensor, args, dtype: torch.dtype):
    t0 = time.perf_counter()
    res = diffmech.ik.solve_ik(robot, LINK, T.to(dtype), generator=torch.Generator().manual_seed(args.seed + 1),
                               tol_position=args.tol_position, tol_orientation=args.tol_orientation,
                               max_iterations=args.max_iterations, restarts=args.restarts)
    return time.perf_counter() - t0, res


def starts_for_peer(robot, n: int, args) -> np.ndarray:
    """The starts diffmech uses, in order: the middle of the limits, then its restart draws."""
    lim = robot.joint_limits()
    mid = (0.5 * (lim["lower"] + lim["upper"])).expand(1, n, robot.nq)
    rand = robot.random_configuration(args.restarts, n, generator=torch.Generator().manual_seed(args.seed + 1))
    return torch.cat([mid, rand]).numpy()


# ----------------------------------------------------------------------------- Pinocchio
class PinCLIK:
    """Pinocchio's inverse-kinematics example loop, for a frame fixed on the last joint."""

    def __init__(self, path: str, args):
        import pinocchio as pin

        self.pin = pin
        self.model = pin.buildModelFromUrdf(path)
        self.data = self.model.createData()
        fid = self.model.getFrameId(LINK)
        frame = self.model.frames[fid]
        self.jid = frame.parentJoint
        self.jMf = frame.placement
        self.fMj = frame.placement.inverse()
        self.lo, self.hi = self.model.lowerPositionLimit.copy(), self.model.upperPositionLimit.copy()
        self.dt, self.damp = args.pin_dt, args.pin_damp
        self.tol_p, self.tol_r = args.tol_position, args.tol_orientation
        self.max_it = args.max_iterations

    def attempt(self, oMdes, q):
        pin, model, data = self.pin, self.model, self.data
        oMjdes = oMdes * self.fMj
        eye = np.eye(6)
        for i in range(self.max_it + 1):
            pin.forwardKinematics(model, data, q)
            oMj = data.oMi[self.jid]
            iMd = oMj.actInv(oMjdes)
            err = pin.log6(iMd).vector  # joint frame; its angular part's norm is the frame's rotation error
            if (np.linalg.norm(oMj.act(self.jMf.translation) - oMdes.translation) <= self.tol_p
                    and np.linalg.norm(err[3:]) <= self.tol_r):
                return q, True, i
            if i == self.max_it:
                return q, False, i
            J = pin.computeJointJacobian(model, data, q, self.jid)
            J = -pin.Jlog6(iMd.inverse()) @ J
            v = -J.T @ np.linalg.solve(J @ J.T + self.damp * eye, err)
            q = np.clip(pin.integrate(model, q, v * self.dt), self.lo, self.hi)
        raise AssertionError("unreachable")

    def solve(self, T: np.ndarray, starts: np.ndarray):
        n = T.shape[0]
        qs = np.zeros((n, self.model.nq))
        ok = np.zeros(n, dtype=bool)
        its = np.zeros(n, dtype=int)
        first = np.zeros(n, dtype=bool)
        t0 = time.perf_counter()
        for b in range(n):
            oMdes = self.pin.SE3(T[b, :3, :3], T[b, :3, 3])
            for s in range(starts.shape[0]):
                q, c, i = self.attempt(oMdes, starts[s, b])
                its[b] += i
                if c:
                    ok[b], qs[b], first[b] = True, q, s == 0
                    break
                qs[b] = q
        return time.perf_counter() - t0, {"q": qs, "converged": ok, "iterations": its, "first": first}


# ----------------------------------------------------------------------------- checks
def pin_check(clik: PinCLIK, q: np.ndarray, T: np.ndarray) -> tuple[float, float]:
    """Largest position and rotation errors of ``LINK`` at ``q`` by Pinocchio's forward kinematics."""
    pin, model, data = clik.pin, clik.model, clik.data
    fid = model.getFrameId(LINK)
    dp, dr = 0.0, 0.0
    for b in range(q.shape[0]):
        pin.framesForwardKinematics(model, data, q[b])
        oMf = data.oMf[fid]
        dp = max(dp, float(np.linalg.norm(oMf.translation - T[b, :3, 3])))
        dr = max(dr, float(np.linalg.norm(pin.log3(T[b, :3, :3] @ oMf.rotation.T))))
    return dp, dr


def summary(times, conv, iters, first, q, lo, hi) -> dict:
    conv = np.asarray(conv, dtype=bool)
    iters = np.asarray(iters)
    return {"wall_s": statistics.median(times), "wall_min_s": min(times), "wall_all_s": times,
            "solved": float(conv.mean()), "solved_first_start": float(np.asarray(first).mean()),
            "n": int(conv.size), "iterations_mean": float(iters.mean()),
            "iterations_solved_p50": float(np.percentile(iters[conv], 50)) if conv.any() else float("nan"),
            "iterations_solved_p90": float(np.percentile(iters[conv], 90)) if conv.any() else float("nan"),
            "iterations_max": int(iters.max()),
            "within_limits": bool(((q >= lo - 1e-12) & (q <= hi + 1e-12)).all())}


# ----------------------------------------------------------------------------- report
def machine(threads: int) -> dict:
    try:
        import pinocchio

        pin_version = pinocchio.__version__
    except ImportError:
        pin_version = "n/a"
    return _machine.machine(ROOT, threads, ["src/diffmech", "benchmarks/bench_ik.py"], pinocchio=pin_version)


def markdown(rep: dict) -> str:
    mc, a = rep["machine"], rep["settings"]
    load = (f"load average (1/5/15 min) at the start {' / '.join(f'{x:.1f}' for x in rep['load_before'])}, "
            f"at the end {' / '.join(f'{x:.1f}' for x in rep['load_after'])}")
    lines = [MARK_START, "## Inverse kinematics (issue 14)", "",
             f"_Generated by `python benchmarks/bench_ik.py{rep.get('args', '')}` on {mc['date']} "
             f"({rep['wall_s']:.0f} s); {mc['cpu']}, {mc['cores']} cores shared with other jobs, torch {mc['torch']}, "
             f"Pinocchio {mc['pinocchio']}, `torch.set_num_threads({mc['threads']})`, Python {mc['python']}, commit "
             f"{mc['commit']}; {load}._", ""]
    if max(rep["load_before"][0], rep["load_after"][0]) > 1.5:
        lines += ["> Measured while other jobs loaded the 2 cores: absolute times are inflated; the solvers were "
                  "interleaved repeat by repeat, so their ratio is less affected.", ""]
    lines += [
             f"Panda (`panda_no_gripper.urdf`), link `{LINK}`, {a['n']} targets: the link's pose at random "
             f"configurations within the joint limits (all reachable). Solved: within {a['tol_position']:g} m and "
             f"{a['tol_orientation']:g} rad, joints within their limits. *diffmech*: one batched call of "
             f"`diffmech.ik.solve_ik` (Levenberg-Marquardt on the link pose, projected steps within the limits; first "
             f"start the middle of the limits; a stalled attempt gives way to {a['restarts']} random restarts, "
             f"8 at a time in parallel; at most {a['max_iterations']} rounds per target, restarts included). "
             f"*Pinocchio CLIK*: the loop of Pinocchio's inverse-kinematics example (`forwardKinematics`, `log6` in "
             f"the joint frame, `computeJointJacobian`, `Jlog6`, `v = -J^T (J J^T + {a['pin_damp']:g} I)^-1 err`, "
             f"`integrate(q, {a['pin_dt']:g} v)`) with the same stopping test, joints clipped to the limits after "
             f"each step, and the same starts in the same order (middle of the limits, then diffmech's restart "
             f"draws one after another), each attempt capped at {a['max_iterations']} steps -- so Pinocchio gets "
             f"up to {a['max_iterations'] * (a['restarts'] + 1)} steps per target. Medians of "
             f"{a['repeats']} interleaved repeats; one thread each.", "",
             "| solver | solved | solved from the first start | iterations per target: mean / p50 / p90 (solved) "
             "/ max | wall time (s) | per target (ms) | time ratio diffmech / Pinocchio |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    pin = rep["results"].get("pinocchio_clik")
    for name, r in rep["results"].items():
        ratio = (f"{r['wall_s'] / pin['wall_s']:.3f} ({pin['wall_s'] / r['wall_s']:.1f}x faster)"
                 if pin and name != "pinocchio_clik" else "")
        lines.append(f"| {r['label']} | {100 * r['solved']:.1f}% | {100 * r['solved_first_start']:.1f}% | "
                     f"{r['iterations_mean']:.1f} / {r['iterations_solved_p50']:.0f} / "
                     f"{r['iterations_solved_p90']:.0f} / {r['iterations_max']} | {r['wall_s']:.3f} | "
                     f"{1e3 * r['wall_s'] / r['n']:.3f} | {ratio} |")
    lines += ["", "Iterations: diffmech counts rounds of its batched loop until the target is solved or given up "
                  "(restarts run in parallel, so this is its latency per target); Pinocchio counts the steps of all "
                  "its attempts for the target."]
    ck = rep.get("pin_check", {})
    if ck:
        lines += ["", "Check: diffmech's float64 solutions through Pinocchio's `framesForwardKinematics`: largest "
                      f"position error {ck['position']:.2e} m, largest rotation error {ck['rotation']:.2e} rad "
                      "(solved targets)."]
    tg = rep.get("targets", [])
    if tg:
        lines += ["", "| target (issue 14) | measured | verdict |", "|---|---|---|"]
        lines += [f"| {t['target']} | {t['measured']} | {'met' if t['met'] else 'NOT met'} |" for t in tg]
    lines += ["", f"Raw data: `{rep.get('json_path', 'benchmarks/results/bench_ik.json')}`.", MARK_END]
    return "\n".join(lines)


def update_markdown(path: str, section: str) -> None:
    """Replace this benchmark's section of ``path`` between its markers (append if absent)."""
    replace_section(path, section, MARK_START, MARK_END)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke test: 20 targets, one repeat, writes nothing")
    ap.add_argument("--n", type=int, default=1000, help="number of targets")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--tol-position", type=float, default=1e-4)
    ap.add_argument("--tol-orientation", type=float, default=1e-3)
    ap.add_argument("--max-iterations", type=int, default=100)
    ap.add_argument("--restarts", type=int, default=16)
    ap.add_argument("--pin-dt", type=float, default=0.5,
                    help="CLIK step (the example's DT is 0.1, which cannot reach 1e-4 from afar in 100 steps; of "
                         "1.0, 0.5 and 0.1, 0.5 solves the most targets fastest)")
    ap.add_argument("--pin-damp", type=float, default=1e-6, help="CLIK damping (the example's damp)")
    ap.add_argument("--no-pinocchio", action="store_true")
    ap.add_argument("--json", default=None, help="results file (default benchmarks/results/bench_ik.json; "
                                                 "with --quick: none)")
    ap.add_argument("--markdown", default=None, help="file whose bench_ik section is rewritten (default "
                                                     "BENCHMARKS.md; with --quick: none); 'none' skips")
    ap.add_argument("--from-json", default=None, help="re-render the markdown from a results file, measure nothing")
    args = ap.parse_args(argv)
    default_json = None if args.quick else os.path.join(ROOT, "benchmarks", "results", "bench_ik.json")
    default_md = None if args.quick else os.path.join(ROOT, "BENCHMARKS.md")
    json_path = args.json or default_json
    md_path = None if args.markdown == "none" else (args.markdown or default_md)
    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        if md_path:
            update_markdown(md_path, markdown(rep))
        return rep
    if args.quick:
        args.n, args.repeats = 20, 1
    torch.set_num_threads(args.threads)
    t_start = time.perf_counter()
    load_before = os.getloadavg()
    path = panda_path()
    robot = diffmech.load_urdf(path)
    T = make_targets(robot, args.n, args.seed)
    lim = robot.joint_limits()
    lo, hi = lim["lower"].numpy(), lim["upper"].numpy()
    clik = None
    if not args.no_pinocchio:
        try:
            clik = PinCLIK(path, args)
        except ImportError:
            print("pinocchio not installed: the CLIK column is skipped")
    starts = starts_for_peer(robot, args.n, args)
    # warm-up: the first call builds the model tensors of each dtype
    for dt in (torch.float64, torch.float32):
        diffmech.ik.solve_ik(robot, LINK, T[:4].to(dt))
    runs: dict[str, dict] = {"diffmech_f64": {"times": []}, "diffmech_f32": {"times": []}}
    if clik is not None:
        runs["pinocchio_clik"] = {"times": []}
    for rep_i in range(args.repeats):
        for name, dt in (("diffmech_f64", torch.float64), ("diffmech_f32", torch.float32)):
            el, res = run_diffmech(robot, T, args, dt)
            runs[name]["times"].append(el)
            runs[name]["res"] = res
            print(f"repeat {rep_i + 1}: {name} {el:.3f} s, solved {float(res.converged.double().mean()):.4f}")
        if clik is not None:
            el, res = clik.solve(T.numpy(), starts)
            runs["pinocchio_clik"]["times"].append(el)
            runs["pinocchio_clik"]["res"] = res
            print(f"repeat {rep_i + 1}: pinocchio_clik {el:.3f} s, solved {res['converged'].mean():.4f}")
    results = {}
    for name, dt in (("diffmech_f64", torch.float64), ("diffmech_f32", torch.float32)):
        res = runs[name]["res"]
        q = res.q.double()
        # an independent check of the solver's own verdict, in float64
        Tq = robot.link_pose(q, LINK)
        dp = (Tq[:, :3, 3] - T[:, :3, 3]).norm(dim=-1)
        dr = spatial.so3_log(T[:, :3, :3] @ Tq[:, :3, :3].transpose(-1, -2)).norm(dim=-1)
        solved = (res.converged & (dp <= args.tol_position * 1.001) & (dr <= args.tol_orientation * 1.001)).numpy()
        results[name] = {"label": f"diffmech `solve_ik`, {'float64' if dt == torch.float64 else 'float32'}",
                         **summary(runs[name]["times"], solved, res.iterations.numpy(),
                                   (res.converged & (res.attempts == 1)).numpy(), q.numpy(), lo, hi),
                         "attempts_max": int(res.attempts.max()), "max_position_error_solved": float(dp[solved].max()),
                         "max_rotation_error_solved": float(dr[solved].max())}
    rep: dict = {"machine": machine(args.threads), "settings": {k: getattr(args, k) for k in (
        "n", "seed", "repeats", "tol_position", "tol_orientation", "max_iterations", "restarts", "pin_dt",
        "pin_damp")}, "results": results}
    if clik is not None:
        pr = runs["pinocchio_clik"]["res"]
        rep["results"]["pinocchio_clik"] = {
            "label": f"Pinocchio CLIK loop (DT {args.pin_dt:g}, damp {args.pin_damp:g})",
            **summary(runs["pinocchio_clik"]["times"], pr["converged"], pr["iterations"], pr["first"], pr["q"], lo, hi)}
        r64 = runs["diffmech_f64"]["res"]
        sel = r64.converged.numpy()
        dp, dr = pin_check(clik, r64.q.numpy()[sel], T.numpy()[sel])
        rep["pin_check"] = {"position": dp, "rotation": dr}
        print(f"Pinocchio FK of diffmech's solutions: max position error {dp:.2e} m, rotation {dr:.2e} rad")
    stamp(rep, argv=argv, json_path=json_path, root=ROOT, load_before=load_before, t_start=t_start)
    d = rep["results"]["diffmech_f64"]
    rep["targets"] = [{"target": f">= 99.5% of {args.n} reachable targets solved to {args.tol_position:g} m and "
                                 f"{args.tol_orientation:g} rad within {args.max_iterations} iterations (float64)",
                       "measured": f"{100 * d['solved']:.1f}% (max {d['iterations_max']} iterations)",
                       "met": d["solved"] >= 0.995 and d["iterations_max"] <= args.max_iterations}]
    if "pinocchio_clik" in rep["results"]:
        p = rep["results"]["pinocchio_clik"]
        rep["targets"].append({"target": "faster than a Pinocchio CLIK loop over the same targets (float64)",
                               "measured": f"{d['wall_s']:.3f} s vs {p['wall_s']:.3f} s (ratio "
                                           f"{d['wall_s'] / p['wall_s']:.3f})", "met": d["wall_s"] < p["wall_s"]})
    publish(rep, json_path, md_path, markdown, update_markdown)
    return rep


if __name__ == "__main__":
    main()
