"""Rigid-body core benchmark: diffmech against Pinocchio, differentiable-robot-model and pytorch_kinematics.

Measures states per second of forward kinematics (all links), the end-effector Jacobian
(world-aligned), inverse dynamics (RNEA), the mass matrix (CRBA), forward dynamics (ABA, plus
diffmech's CRBA + Cholesky variant) and the gradient of ``qdd.square().sum()`` through forward
dynamics with respect to ``(q, v, tau)``, on the KUKA iiwa (7 DoF chain) and the Allegro hand
(16 DoF tree), in float64 and float32, for several batch sizes, with ``torch.set_num_threads(2)``.

Every cell is warmed up, then timed as the median of several repetitions (``time.perf_counter``),
each repetition long enough (>= 2 ms, by repeating fast calls) and the whole cell within a time
budget. Pinocchio's single-state functions run in a Python loop; at large batches the loop is
timed on a subsample and extrapolated linearly (the note says so). Pinocchio is float64 only,
so float32 rows compare against its float64 numbers. Peers that would take too long at a batch
size (predicted from the previous batch) are skipped and marked.

Usage::

    python benchmarks/bench_dynamics.py                      # full run (~10 min), writes results
    python benchmarks/bench_dynamics.py --quick              # seconds; smoke test
    python benchmarks/bench_dynamics.py --robots iiwa --dtypes float64 --batches 1,1024 --algos aba,grad
    python benchmarks/bench_dynamics.py --compile --robots iiwa --dtypes float64 --algos aba

Outputs: a printed table, ``benchmarks/results/bench_dynamics.json`` and the section between
``<!-- bench_dynamics:start -->`` and ``<!-- bench_dynamics:end -->`` of ``BENCHMARKS.md``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

import diffmech

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _peers  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_JSON = ROOT / "benchmarks" / "results" / "bench_dynamics.json"
DEFAULT_MD = ROOT / "BENCHMARKS.md"
START, END = "<!-- bench_dynamics:start -->", "<!-- bench_dynamics:end -->"

ALGOS = ("fk", "jac", "rnea", "crba", "aba", "grad")
ALGO_TITLE = {
    "fk": "FK (all links)", "jac": "Jacobian (ee, world-aligned)", "rnea": "inverse dynamics (RNEA)",
    "crba": "mass matrix (CRBA)", "aba": "forward dynamics", "grad": "grad of sum(qdd^2) via FD",
}
# Implementation ids, in table order; the first one is the reference of every ratio.
IMPLS = ("diffmech", "diffmech-alt", "diffmech-compiled", "pin-loop", "pin-batch", "drm", "pk")
IMPL_TITLE = {
    "diffmech": "diffmech", "diffmech-alt": "diffmech alt.", "diffmech-compiled": "diffmech compiled",
    "pin-loop": "Pinocchio loop", "pin-batch": "Pinocchio batch 2 thr", "drm": "diff-robot-model",
    "pk": "pytorch_kinematics",
}
ALT_NOTE = {"aba": "the method 'auto' did not pick", "grad": "autograd through the algorithm (fast_grad=False)"}


# --------------------------------------------------------------------------- timing


def time_call(fn, budget: float, min_sample: float = 2e-3, max_reps: int = 30, max_call: float = 5.0) -> dict:
    """Median seconds per call of ``fn`` after a warm-up, spending about ``budget`` seconds.

    Fast calls are repeated inside each sample so a sample lasts at least ``min_sample`` seconds
    (timer resolution and Python overhead stay negligible). A first call slower than ``max_call``
    is reported as it is (one repetition): at that length warm-up effects are negligible and a
    second call would only double the cost of the cell.
    """
    t0 = time.perf_counter()
    fn()
    first = time.perf_counter() - t0
    if first > max_call:
        return {"seconds": first, "min_seconds": first, "reps": 1, "number": 1, "first_call_s": first,
                "single_call": True}
    t0 = time.perf_counter()
    fn()
    est = max(time.perf_counter() - t0, 1e-7)
    number = max(1, math.ceil(min_sample / est))
    # At least 3 repetitions even past the budget: one stalled call must not become the result.
    reps = max(3, min(max_reps, int(budget / (est * number))))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        samples.append((time.perf_counter() - t0) / number)
    return {"seconds": statistics.median(samples), "min_seconds": min(samples), "reps": reps, "number": number,
            "first_call_s": first}


# --------------------------------------------------------------------------- cells


def diffmech_fn(robot, algo: str, impl: str, q, v, u, ee: str):
    """A callable for one diffmech cell (``impl`` is ``diffmech`` or ``diffmech-alt``)."""
    if algo == "fk" and impl == "diffmech":
        def run():
            with torch.no_grad():
                robot.forward_kinematics(q)
    elif algo == "jac" and impl == "diffmech":
        def run():
            with torch.no_grad():
                robot.jacobian(q, ee)
    elif algo == "rnea" and impl == "diffmech":
        def run():
            with torch.no_grad():
                robot.inverse_dynamics(q, v, u, passive=False)
    elif algo == "crba" and impl == "diffmech":
        def run():
            with torch.no_grad():
                robot.mass_matrix(q)
    elif algo == "aba":
        # diffmech: the default (method="auto"); alt.: the algorithm the default did not pick.
        from diffmech.dynamics.aba import resolve_method

        method = "auto" if impl == "diffmech" else {"aba": "crba", "crba": "aba"}[resolve_method("auto", q.shape[0])]

        def run():
            with torch.no_grad():
                robot.forward_dynamics(q, v, u, passive=False, method=method)
    elif algo == "grad":
        fast = impl == "diffmech"
        qg, vg, ug = (t.detach().clone().requires_grad_(True) for t in (q, v, u))

        def run():
            qg.grad = vg.grad = ug.grad = None
            qdd = robot.forward_dynamics(qg, vg, ug, passive=False, fast_grad=fast)
            qdd.square().sum().backward()
    else:
        return None
    return run


COMPILED_NAME = {"rnea": "inverse_dynamics", "crba": "mass_matrix", "aba": "forward_dynamics",
                 "grad": "forward_dynamics"}


def compiled_fn(robot, algo: str, q, v, u, cache: dict, key):
    """diffmech's compiled evaluation (``diffmech.dynamics.compiled``) for ``algo``.

    One compiled function per robot, dtype and algorithm is kept in ``cache`` across batch sizes,
    as a user would keep it. It runs native kernels (built by the first call, any batch size), for
    the gradient the kernel of ABA's reverse mode. Returns ``(callable, seconds of the first
    call)``; the first call includes the build.
    """
    from diffmech.dynamics import compiled

    if key not in cache:
        cache[key] = compiled(robot, COMPILED_NAME[algo], passive=False)
    cf = cache[key]
    if algo == "grad":
        # The same loss as the eager cell; the backward is the native kernel of ABA's reverse mode.
        qg, vg, ug = (t.detach().clone().requires_grad_(True) for t in (q, v, u))

        def run():
            qg.grad = vg.grad = ug.grad = None
            cf(qg, vg, ug).square().sum().backward()
    else:
        args = (q,) if algo == "crba" else (q, v, u)

        def run():
            with torch.no_grad():
                cf(*args)
    t0 = time.perf_counter()
    run()
    first = time.perf_counter() - t0
    return run, first


def random_states(robot, B: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(B, generator=g)
    v = torch.randn(B, robot.nv, generator=g, dtype=robot.dtype)
    u = torch.randn(B, robot.nv, generator=g, dtype=robot.dtype)
    return q, v, u


# --------------------------------------------------------------------------- agreement


def agreement(robot, ee: str, pinp, drm, pk, dtype) -> dict:
    """Max relative differences between diffmech and each peer on a few states (same quantity checks).

    Differences are scaled by ``max(1, max|peer value|)``: light fingers under random torques reach
    accelerations of 1e4 and more, where an absolute float32 error says nothing.
    """
    import numpy as np

    def rel(peer, ours_):
        peer = np.asarray(peer, dtype=np.float64)
        return float(np.abs(peer - ours_).max() / max(1.0, np.abs(peer).max()))

    q, v, u = random_states(robot, 3, seed=1)
    ours = {
        "fk": robot.link_pose(q, ee)[..., :3, 3],
        "jac": robot.jacobian(q, ee),
        "rnea": robot.inverse_dynamics(q, v, u, passive=False),
        "crba": robot.mass_matrix(q),
        "aba": robot.forward_dynamics(q, v, u, passive=False),
    }
    ours = {k: t.detach().double().numpy() for k, t in ours.items()}
    out: dict[str, dict[str, float]] = {}
    if pinp is not None:
        pin = pinp.pin
        qp, vp, up = pinp.to_pin(q, v, u)
        vi = pinp._vi
        errs = {}
        for i in range(3):
            tau = pinp.from_pin_v(pin.rnea(pinp.model, pinp.data, qp[i], vp[i], up[i]))
            qdd = pinp.from_pin_v(pin.aba(pinp.model, pinp.data, qp[i], vp[i], up[i]))
            M = pin.crba(pinp.model, pinp.data, qp[i])
            M = (np.triu(M) + np.triu(M, 1).T)[np.ix_(vi, vi)]
            J = pin.computeFrameJacobian(pinp.model, pinp.data, qp[i], pinp.fid, pin.LOCAL_WORLD_ALIGNED)[:, vi]
            pin.forwardKinematics(pinp.model, pinp.data, qp[i])
            pin.updateFramePlacements(pinp.model, pinp.data)
            p = pinp.data.oMf[pinp.fid].translation
            for k, val in [("rnea", tau), ("aba", qdd), ("crba", M), ("jac", J), ("fk", p)]:
                errs[k] = max(errs.get(k, 0.0), rel(val, ours[k][i]))
        out["pinocchio"] = errs
    if drm is not None:
        out["drm"] = {k: rel(drm.evaluate(k, q, v, u).double().numpy(), ours[k])
                      for k in ("fk", "jac", "rnea", "crba", "aba")}
    if pk is not None:
        out["pk"] = {"jac": rel(pk.jacobian_full(q, robot.nv).double().numpy(), ours["jac"])}
    return out


# --------------------------------------------------------------------------- run


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    # The "diffmech" columns time the torch code: the public methods must not pick up the native
    # kernels that the compiled columns build (bench_core_calls.py times that default path).
    from diffmech.dynamics import kernels

    kernels.set_native("never")
    if args.allocator == "tuned":
        from diffmech.perf import tune_allocator

        args.allocator_applied = tune_allocator()
    if args.compile:
        import torch._dynamo as dynamo
        import torch._inductor.config as ic

        dynamo.config.cache_size_limit = 64
        ic.fx_graph_cache = False  # report cold compile times
    robots = args.robots.split(",")
    dtypes = [getattr(torch, d) for d in args.dtypes.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    algos = args.algos.split(",")
    for a in algos:
        if a not in ALGOS:
            raise SystemExit(f"unknown algo '{a}'; choose from {ALGOS}")
    have = {m: _peers.available(m) for m in ("pinocchio", "differentiable_robot_model", "pytorch_kinematics")}
    records: list[dict] = []
    agree: dict = {}
    pin_cache: dict = {}  # (robot, batch, algo, impl) -> record, reused for float32 rows
    compiled_cache: dict = {}  # (robot, dtype, algo) -> compiled function, reused across batch sizes
    t_start = time.perf_counter()
    load_start = os.getloadavg() if hasattr(os, "getloadavg") else None

    def add(robot_name, dtype, B, algo, impl, status, timing=None, note="", **extra):
        rec = {"robot": robot_name, "dtype": str(dtype).replace("torch.", ""), "batch": B, "algo": algo,
               "impl": impl, "status": status, "note": note}
        if timing is not None:
            rec.update(timing)
            rec["states_per_s"] = B / timing["seconds"]
        rec.update(extra)
        records.append(rec)
        if args.verbose:
            rate = f"{rec['states_per_s']:.3g}/s" if "states_per_s" in rec else status
            print(f"  {robot_name:8s} {rec['dtype']:8s} B={B:<6d} {algo:5s} {impl:18s} {rate} {note}", flush=True)
        return rec

    for robot_name in robots:
        path, ee = _peers.robot_path(robot_name)
        pinp = None
        if have["pinocchio"] and not args.no_peers:
            ref = diffmech.load_urdf(path)
            pinp = _peers.PinPeer(path, ref, ee, threads=args.threads)
        for dtype in dtypes:
            robot = diffmech.load_urdf(path, dtype=dtype)
            drm = pk = None
            if not args.no_peers:
                if have["differentiable_robot_model"]:
                    drm = _peers.DrmPeer(path, ee, dtype)
                if have["pytorch_kinematics"]:
                    pk = _peers.PkPeer(path, ee, dtype, robot.joint_names)
                agree[f"{robot_name}/{str(dtype)[6:]}"] = agreement(robot, ee, pinp, drm, pk, dtype)
            history: dict = {}  # (algo, impl) -> [(batch, seconds per call)], to predict the next batch
            for B in batches:
                q, v, u = random_states(robot, B)
                if pinp is not None:
                    n_loop = min(B, args.pin_loop_max)
                    qp, vp, up = pinp.to_pin(q, v, u)
                for algo in algos:
                    cells: list[tuple[str, object, str]] = [
                        ("diffmech", diffmech_fn(robot, algo, "diffmech", q, v, u, ee), "")]
                    if algo in ALT_NOTE:
                        cells.append(("diffmech-alt", diffmech_fn(robot, algo, "diffmech-alt", q, v, u, ee),
                                      ALT_NOTE[algo]))
                    for impl, fn, note in cells:
                        add(robot_name, dtype, B, algo, impl, "ok", time_call(fn, args.budget, max_call=args.max_call),
                            note)
                    if args.compile and algo in COMPILED_NAME:
                        try:
                            fn, cs = compiled_fn(robot, algo, q, v, u, compiled_cache, (robot_name, dtype, algo))
                            t = time_call(fn, args.budget, max_call=args.max_call)
                            add(robot_name, dtype, B, algo, "diffmech-compiled", "ok", t,
                                f"diffmech.dynamics.compiled (passive=False; native kernels); first call {cs:.1f} s",
                                compile_s=cs)
                        except Exception as e:  # a compiler failure is a result, not a crash
                            add(robot_name, dtype, B, algo, "diffmech-compiled", "error",
                                note=f"{type(e).__name__}: {str(e).splitlines()[0][:120]}")
                    if args.no_peers:
                        continue
                    # Pinocchio: measured once per robot and batch (float64), reused for float32 rows.
                    for impl in ("pin-loop", "pin-batch"):
                        key = (robot_name, B, algo, impl)
                        if pinp is None:
                            add(robot_name, dtype, B, algo, impl, "n/a", note="pinocchio not installed")
                            continue
                        if key in pin_cache:
                            old = pin_cache[key]
                            extra = {k: old[k] for k in old if k not in ("robot", "dtype", "batch", "algo", "impl",
                                                                          "status", "note")}
                            note = old["note"]
                            if old["status"] == "ok":
                                note += ("; " if note else "") + "Pinocchio float64"
                            add(robot_name, dtype, B, algo, impl, old["status"], None, note, **extra)
                            continue
                        if impl == "pin-loop":
                            fn = pinp.loop_fn(algo, qp[:n_loop], vp[:n_loop], up[:n_loop])
                            t = time_call(fn, args.budget, max_call=args.max_call)
                            note = "" if n_loop == B else f"timed on {n_loop} states, extrapolated x{B // n_loop}"
                            t = dict(t, seconds=t["seconds"] * B / n_loop, min_seconds=t["min_seconds"] * B / n_loop)
                            if algo == "grad":
                                note = "computeABADerivatives" + ("; " + note if note else "")
                            pin_cache[key] = add(robot_name, dtype, B, algo, impl, "ok", t, note)
                        else:
                            fn = pinp.parallel_fn(algo, qp, vp, up)
                            if fn is None:
                                pin_cache[key] = add(robot_name, dtype, B, algo, impl, "n/a",
                                                     note=f"no parallel {algo} in pinocchio {pinp.pin.__version__}")
                            else:
                                pin_cache[key] = add(robot_name, dtype, B, algo, impl, "ok",
                                                     time_call(fn, args.budget, max_call=args.max_call))
                                # Pinocchio's batch API sets OpenMP's thread count, which torch shares.
                                torch.set_num_threads(args.threads)
                    # differentiable-robot-model and pytorch_kinematics, skipped when predicted too slow.
                    peer_cells = [("drm", drm.fn(algo, q, v, u) if drm is not None else None,
                                   "differentiable_robot_model not installed" if drm is None else "")]
                    if algo in ("fk", "jac"):
                        pk_note = "pytorch_kinematics not installed" if pk is None else (
                            "serial chain to the ee only" if algo == "jac" and len(pk.serial_cols) < robot.nv else "")
                        peer_cells.append(("pk", pk.fn(algo, q) if pk is not None else None, pk_note))
                    for impl, fn, note in peer_cells:
                        if fn is None:
                            add(robot_name, dtype, B, algo, impl, "n/a", note=note)
                            continue
                        est = predict_seconds(history.get((algo, impl), []), B)
                        if est is not None and est > args.skip_above:
                            add(robot_name, dtype, B, algo, impl, "skipped",
                                note=f"skipped: est. {est:.0f} s/call > {args.skip_above:g} s")
                            continue
                        t = time_call(fn, args.budget, max_call=args.max_call)
                        history.setdefault((algo, impl), []).append((B, t["seconds"]))
                        if t.get("single_call"):
                            note = (note + "; " if note else "") + f"one call (> {args.max_call:g} s)"
                        add(robot_name, dtype, B, algo, impl, "ok", t, note)
            del robot, drm, pk
    elapsed = time.perf_counter() - t_start
    ratios = compute_ratios(records)
    meta = machine_info(args, elapsed)
    meta["load_average_at_start"] = load_start
    return {
        "meta": meta,
        "results": records,
        "ratios": ratios,
        "targets": evaluate_targets(records),
        "agreement": agree,
    }


def predict_seconds(history: list[tuple[int, float]], B: int) -> float | None:
    """Seconds per call at batch ``B`` from the line through the last two measured batches.

    A fixed per-call overhead dominates small batches (differentiable-robot-model spends ~0.1 s on
    one state), so a single point says nothing about the slope; with fewer than two points the
    cell is measured.
    """
    if len(history) < 2:
        return None
    (b1, t1), (b2, t2) = history[-2], history[-1]
    slope = max((t2 - t1) / (b2 - b1), 0.0) if b2 != b1 else t2 / b2
    return t2 + slope * (B - b2)


def compute_ratios(records: list[dict]) -> list[dict]:
    """diffmech (default implementation) states/s divided by each other implementation's."""
    ref = {(r["robot"], r["dtype"], r["batch"], r["algo"]): r.get("states_per_s")
           for r in records if r["impl"] == "diffmech"}
    out = []
    for r in records:
        if r["impl"] == "diffmech" or "states_per_s" not in r:
            continue
        ours = ref.get((r["robot"], r["dtype"], r["batch"], r["algo"]))
        if ours:
            out.append({"robot": r["robot"], "dtype": r["dtype"], "batch": r["batch"], "algo": r["algo"],
                        "peer": r["impl"], "ratio": ours / r["states_per_s"]})
    return out


def _find(records, robot, dtype, batch, algo, impl):
    for r in records:
        if (r["robot"], r["dtype"], r["batch"], r["algo"], r["impl"]) == (robot, dtype, batch, algo, impl):
            return r
    return None


def evaluate_targets(records: list[dict]) -> list[dict]:
    """The issue's targets (iiwa, float64, 2 threads), each with the measured value and verdict."""
    spec = [
        # (text, batch, algo, peer, kind, threshold); kind: "ratio" diffmech/peer >= t, "time" s/call < t
        ("forward dynamics >= 10x diff-robot-model", 1024, "aba", "drm", "ratio", 10.0),
        ("inverse dynamics >= 10x diff-robot-model", 1024, "rnea", "drm", "ratio", 10.0),
        ("mass matrix >= 50x diff-robot-model", 1024, "crba", "drm", "ratio", 50.0),
        ("forward dynamics >= 0.5x Pinocchio batch API (2 thr)", 1024, "aba", "pin-batch", "ratio", 0.5),
        ("inverse dynamics >= 0.5x Pinocchio batch API (2 thr)", 1024, "rnea", "pin-batch", "ratio", 0.5),
        ("mass matrix >= 0.5x Pinocchio batch API (2 thr)", 1024, "crba", "pin-batch", "ratio", 0.5),
        ("forward dynamics >= 1x Pinocchio batch API (2 thr)", 16384, "aba", "pin-batch", "ratio", 1.0),
        ("inverse dynamics >= 1x Pinocchio batch API (2 thr)", 16384, "rnea", "pin-batch", "ratio", 1.0),
        ("mass matrix >= 1x Pinocchio batch API (2 thr)", 16384, "crba", "pin-batch", "ratio", 1.0),
        ("forward dynamics < 1 ms per call", 1, "aba", None, "time", 1e-3),
        ("FD gradient faster than Pinocchio computeABADerivatives loop", 1024, "grad", "pin-loop", "ratio", 1.0),
        ("FD gradient >= 10x diff-robot-model autograd", 1024, "grad", "drm", "ratio", 10.0),
    ]
    out = []
    for text, B, algo, peer, kind, thr in spec:
        row = {"target": text, "robot": "iiwa", "dtype": "float64", "batch": B, "algo": algo, "peer": peer,
               "threshold": thr, "kind": kind, "value": None, "value_best": None, "value_alt": None, "met": None,
               "value_compiled": None, "met_compiled": None, "note": ""}
        comp = _find(records, "iiwa", "float64", B, algo, "diffmech-compiled")
        comp = comp if comp is not None and "states_per_s" in comp else None
        ours = _find(records, "iiwa", "float64", B, algo, "diffmech")
        alt = _find(records, "iiwa", "float64", B, algo, "diffmech-alt") if algo == "aba" else None
        if ours is None or "states_per_s" not in ours:
            row["note"] = "not measured in this run"
            out.append(row)
            continue
        if kind == "time":
            row["value"] = ours["seconds"]
            row["value_best"] = ours["min_seconds"]
            row["value_alt"] = alt["seconds"] if alt and "seconds" in alt else None
            row["met"] = row["value"] < thr
            if comp is not None:
                row["value_compiled"] = comp["seconds"]
                row["met_compiled"] = comp["seconds"] < thr
        else:
            p = _find(records, "iiwa", "float64", B, algo, peer)
            if p is None or "states_per_s" not in p:
                row["note"] = p["note"] if p else "peer not measured in this run"
                out.append(row)
                continue
            row["value"] = ours["states_per_s"] / p["states_per_s"]
            # The same ratio from each side's fastest repetition: less sensitive to a loaded machine.
            row["value_best"] = p["min_seconds"] / ours["min_seconds"]
            if alt and "states_per_s" in alt:
                row["value_alt"] = alt["states_per_s"] / p["states_per_s"]
            row["met"] = row["value"] >= thr
            if comp is not None:
                row["value_compiled"] = comp["states_per_s"] / p["states_per_s"]
                row["met_compiled"] = row["value_compiled"] >= thr
        out.append(row)
    return out


def _command_line(argv: list[str]) -> str:
    """The command that produced a result, with the (long) ``--note`` text elided."""
    shown, elide = [], False
    for a in argv:
        if elide:
            shown.append("'...'")
        elif a.startswith("--note="):
            shown.append("--note='...'")
        else:
            shown.append(shlex.quote(a))
        elide = a == "--note"
    return " ".join(["python benchmarks/bench_dynamics.py", *shown])


def machine_info(args, elapsed: float) -> dict:
    model, cores = platform.processor() or "unknown", os.cpu_count()
    try:
        lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        for line in lscpu.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except Exception:
        pass
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "cpu": model, "cores": cores, "threads": args.threads, "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(), "versions": _peers.versions(),
        "load_average_at_end": load, "elapsed_s": round(elapsed, 1),
        "command": _command_line(sys.argv[1:]),
        "args": {k: v for k, v in vars(args).items() if k not in ("json", "markdown")},
        "note": args.note,
        "allocator": ("glibc mallopt: mmap threshold 32 MiB, trim threshold 2 GiB (diffmech.perf.tune_allocator)"
                      if getattr(args, "allocator_applied", False) else "process default"),
    }


# --------------------------------------------------------------------------- output


def fmt_rate(x: float | None) -> str:
    if x is None:
        return "-"
    if x >= 1e6:
        return f"{x / 1e6:.2f}M"
    if x >= 1e3:
        return f"{x / 1e3:.1f}k"
    return f"{x:.0f}" if x >= 10 else f"{x:.2g}"


def fmt_ratio(x: float) -> str:
    if x >= 10:
        return f"{x:.0f}x"
    return f"{x:.2f}x" if x >= 0.1 else f"{x:.2g}x"


def cell_text(rec: dict | None, ref: dict | None, md: bool) -> str:
    if rec is None:
        return ""
    if "states_per_s" not in rec:
        return "n/a" if rec["status"] == "n/a" else rec["status"]
    s = fmt_rate(rec["states_per_s"])
    if rec["impl"] != "diffmech" and ref is not None and "states_per_s" in ref:
        s += f" ({fmt_ratio(ref['states_per_s'] / rec['states_per_s'])})"
    if rec["impl"] == "pin-loop" and "extrapolated" in rec.get("note", ""):
        s += "*"
    if rec.get("single_call"):
        s += "^"
    return s


def tables(result: dict, md: bool) -> list[tuple[str, list[str], list[list[str]]]]:
    """One table per robot and dtype: rows (algo, batch), columns implementations."""
    recs = result["results"]
    out = []
    keys = []
    for r in recs:
        k = (r["robot"], r["dtype"])
        if k not in keys:
            keys.append(k)
    for robot, dtype in keys:
        rs = [r for r in recs if (r["robot"], r["dtype"]) == (robot, dtype)]
        impls = [i for i in IMPLS if any(r["impl"] == i for r in rs)]
        header = ["algorithm", "batch"] + [IMPL_TITLE[i] for i in impls]
        rows = []
        for algo in ALGOS:
            for B in sorted({r["batch"] for r in rs if r["algo"] == algo}):
                ref = _find(rs, robot, dtype, B, algo, "diffmech")
                row = [ALGO_TITLE[algo], str(B)]
                for i in impls:
                    row.append(cell_text(_find(rs, robot, dtype, B, algo, i), ref, md))
                rows.append(row)
        out.append((f"{robot}, {dtype}", header, rows))
    return out


def print_tables(result: dict) -> None:
    for title, header, rows in tables(result, md=False):
        widths = [max(len(h), *(len(r[k]) for r in rows)) for k, h in enumerate(header)]
        print(f"\n== {title}: states/s (diffmech / peer) ==")
        print("  ".join(h.ljust(w) for h, w in zip(header, widths)))
        for r in rows:
            print("  ".join(c.ljust(w) for c, w in zip(r, widths)))
    print("\n== targets (iiwa, float64) ==")
    for t in result["targets"]:
        print(f"  [{_verdict(t):^8s}] {t['target']} @ batch {t['batch']}: {_target_value(t)}")
    print("\n== agreement with peers (max relative difference on 3 states) ==")
    for k, d in result["agreement"].items():
        print(f"  {k}: " + "; ".join(f"{p}: " + ", ".join(f"{a}={e:.1e}" for a, e in v.items()) for p, v in d.items()))


def _load(x) -> str:
    return " / ".join(f"{v:.1f}" for v in x) if x else "n/a"


def _verdict(t: dict) -> str:
    return {True: "met", False: "NOT met", None: "n/a"}[t["met"]]


def _target_value(t: dict) -> str:
    if t["value"] is None:
        return t["note"] or "-"
    if t["kind"] == "time":
        s = f"{t['value'] * 1e3:.2f} ms (default method; best rep {t['value_best'] * 1e3:.2f} ms)"
        if t["value_alt"] is not None:
            s += f", {t['value_alt'] * 1e3:.2f} ms (the other method)"
        if t.get("value_compiled") is not None:
            s += f"; compiled {t['value_compiled'] * 1e3:.2f} ms ({_verdict_compiled(t)})"
        return s
    s = f"{fmt_ratio(t['value'])}"
    if t["algo"] == "aba":
        s += " (default method)"
    s += f" [best reps {fmt_ratio(t['value_best'])}]"
    if t["value_alt"] is not None:
        s += f", {fmt_ratio(t['value_alt'])} (the other method)"
    if t.get("value_compiled") is not None:
        s += f"; compiled {fmt_ratio(t['value_compiled'])} ({_verdict_compiled(t)})"
    return s


def _verdict_compiled(t: dict) -> str:
    return {True: "met", False: "not met", None: "n/a"}[t.get("met_compiled")]


def markers(section: str) -> tuple[str, str]:
    return f"<!-- {section}:start -->", f"<!-- {section}:end -->"


def markdown(result: dict, section: str = "bench_dynamics") -> str:
    """The markdown block of a run; a section other than the main one holds only the targets and the
    compiled table."""
    start, end = markers(section)
    m = result["meta"]
    v = m["versions"]
    lines = [
        start,
        f"_Generated by `{m['command'].strip()}` on {m['date']} ({m['elapsed_s']:.0f} s)._",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {v['torch']}, `torch.set_num_threads({m['threads']})`; "
        f"pinocchio {v['pinocchio']}, differentiable-robot-model {v['differentiable_robot_model']}, "
        f"pytorch_kinematics {v['pytorch_kinematics']}. Load average (1/5/15 min) at the start: "
        f"{_load(m.get('load_average_at_start'))}, at the end: {_load(m['load_average_at_end'])}. "
        f"Allocator: {m.get('allocator', 'process default')}; it applies to every peer in the process.",
    ]
    if m.get("note"):
        lines += ["", f"**Note:** {m['note']}"]
    lines += [
        "",
        "### Targets (iiwa, float64, 2 threads)",
        "",
        "| target | batch | measured: median ratio [ratio of the fastest repetitions] | verdict eager (median) "
        "| verdict compiled |",
        "| --- | ---: | --- | --- | --- |",
    ]
    for t in result["targets"]:
        lines.append(f"| {t['target']} | {t['batch']} | {_target_value(t)} | {_verdict(t)} | "
                     f"{_verdict_compiled(t)} |")
    if section != "bench_dynamics":
        lines += _compiled_table(result) + [end]
        return "\n".join(lines)
    lines += [
        "",
        "Ratios are diffmech's states/s over the peer's (above 1: diffmech is faster); "
        "forward dynamics use the default `method=\"auto\"` (CRBA + LU up to 64 states, ABA above); \"the "
        "other method\" is the one it did not pick; \"compiled\" is `diffmech.dynamics.compiled` in the same "
        "run, after its first (building) call: native kernels (the algorithm's lane program compiled to C, "
        "`diffmech.dynamics.native`); the gradient by the native kernel of ABA's traced reverse mode, which "
        "recomputes the forward pass per state and saves only the inputs.",
        "",
        "### States per second (ratio diffmech / column in brackets)",
        "",
        "Columns: **diffmech** = the public `RobotModel` methods (`forward_kinematics`, `jacobian(q, ee)`, "
        "`inverse_dynamics`, `mass_matrix`, `forward_dynamics`; `passive=False`), under `torch.no_grad()` except "
        "for the gradient; **diffmech alt.** = for forward dynamics the method that `method=\"auto\"` did not "
        "pick (ABA up to 64 states, CRBA + LU above), for the gradient plain autograd through the algorithm "
        "(`fast_grad=False`); **Pinocchio loop** = a Python loop of "
        "single-state calls (`forwardKinematics`+`updateFramePlacements`, `computeFrameJacobian` "
        "LOCAL_WORLD_ALIGNED, `rnea`, `crba`, `aba`, `computeABADerivatives`); **Pinocchio batch 2 thr** = "
        "`rneaInParallel`/`abaInParallel` (this pinocchio has no parallel FK/Jacobian/CRBA/derivatives: n/a); "
        "**diff-robot-model** = differentiable-robot-model (float64 by redirecting its float32 tensors, "
        "`use_damping=False`; the gradient by autograd through `compute_forward_dynamics`); "
        "**pytorch_kinematics** = `build_chain_from_urdf(...).forward_kinematics` (whole tree) and "
        "`build_serial_chain_from_urdf(..., ee).jacobian`.",
        "",
        "Marks: `*` Pinocchio loop timed on a subsample of "
        f"{m['args']['pin_loop_max']} states and extrapolated linearly; `^` a single timed call "
        f"(slower than {m['args']['max_call']:g} s); \"skipped\" = predicted slower than "
        f"{m['args']['skip_above']:g} s per call by a line through the two previous batches. float32 rows "
        "compare against Pinocchio in float64 (it has no float32). On Allegro pytorch_kinematics' Jacobian covers "
        "one finger (4 of 16 joints); "
        "it parses the URDF in float32, so its float64 results agree to ~1e-7 only.",
    ]
    for title, header, rows in tables(result, md=True):
        lines += ["", f"#### {title}", "", "| " + " | ".join(header) + " |",
                  "| " + " | ".join(["---"] + ["---:"] * (len(header) - 1)) + " |"]
        lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += _compiled_table(result)
    lines += ["", "Agreement with the peers (max difference over 3 random states, relative to max(1, max |peer|); "
              "checks that each peer computes the same quantity):", ""]
    for k, d in result["agreement"].items():
        lines.append(f"- {k}: " + "; ".join(
            f"{p}: " + ", ".join(f"{a} {e:.0e}" for a, e in v.items()) for p, v in d.items()))
    lines.append(end)
    return "\n".join(lines)


def _compiled_table(result: dict) -> list[str]:
    lines: list[str] = []
    compiled = [r for r in result["results"] if r["impl"] == "diffmech-compiled"]
    if compiled:
        lines += ["", "### Compiled evaluation: `diffmech.dynamics.compiled`",
                  "",
                  "RNEA, CRBA, ABA and the gradient through ABA: native kernels, built by the first call of a "
                  "robot, algorithm and dtype (first-call seconds; one kernel serves every batch size, so later "
                  "batch sizes show ~0 s; the first call of a later process with the kernel stored is measured "
                  "by bench_core_calls.py). Break-even = first-call seconds / seconds saved per call.", "",
                  "| robot | dtype | algorithm | batch | first call s | eager states/s | compiled states/s "
                  "| speed-up | break-even calls |", "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in compiled:
            e = _find(result["results"], r["robot"], r["dtype"], r["batch"], r["algo"], "diffmech")
            if "states_per_s" not in r or e is None:
                lines.append(f"| {r['robot']} | {r['dtype']} | {r['algo']} | {r['batch']} | {r['note']} | | | | |")
                continue
            saved = e["seconds"] - r["seconds"]
            be = f"{r['compile_s'] / saved:.0f}" if saved > 0 else "never"
            lines.append(f"| {r['robot']} | {r['dtype']} | {r['algo']} | {r['batch']} | {r['compile_s']:.1f} | "
                         f"{fmt_rate(e['states_per_s'])} | {fmt_rate(r['states_per_s'])} | "
                         f"{e['seconds'] / r['seconds']:.2f}x | {be} |")
    return lines


HEADER_TEMPLATE = """# Benchmarks

Machine: {cpu}, {cores} cores, torch {torch}, `torch.set_num_threads({threads})` unless a section says otherwise.
Generated sections sit between `<!-- name:start -->` / `<!-- name:end -->` markers and are rewritten
by their script under `benchmarks/` (see `benchmarks/README.md`); rerun the script to refresh one.
"""

SECTION_TITLE = "## Rigid-body core"


def write_markdown(path: Path, block: str, meta: dict, section: str = "bench_dynamics") -> None:
    """Replace the ``section`` block of ``path`` (creating the file or the block if needed).

    A missing secondary block goes right after the main one, inside the "Rigid-body core" section.
    """
    start, end = markers(section)
    if path.exists():
        text = path.read_text()
    else:
        text = HEADER_TEMPLATE.format(cpu=meta["cpu"], cores=meta["cores"], torch=meta["versions"]["torch"],
                                      threads=meta["threads"])
    if start in text and end in text:
        i, j = text.index(start), text.index(end) + len(end)
        text = text[:i] + block + text[j:]
    elif section != "bench_dynamics" and END in text:
        j = text.index(END) + len(END)
        text = text[:j] + "\n\n" + block + text[j:]
    else:
        if not text.endswith("\n"):
            text += "\n"
        text += f"\n{SECTION_TITLE}\n\n{block}\n"
    path.write_text(text)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny subset in seconds (smoke test); writes no results unless "
                   "--json/--markdown are given")
    p.add_argument("--robots", default=None, help="comma list from: " + ",".join(_peers.ROBOTS))
    p.add_argument("--dtypes", default=None, help="comma list: float64,float32")
    p.add_argument("--batches", default=None, help="comma list of batch sizes")
    p.add_argument("--algos", default=None, help="comma list from: " + ",".join(ALGOS))
    p.add_argument("--threads", type=int, default=2, help="torch threads and Pinocchio batch-API threads")
    p.add_argument("--allocator", choices=("tuned", "default"), default="tuned",
                   help="'tuned': diffmech.perf.tune_allocator() first (glibc keeps freed memory for reuse); "
                        "'default': the process's malloc settings")
    p.add_argument("--budget", type=float, default=None, help="seconds of timed repetitions per cell")
    p.add_argument("--max-call", type=float, default=4.0,
                   help="a first call slower than this (s) is reported as the single measurement")
    p.add_argument("--skip-above", type=float, default=10.0,
                   help="skip a peer predicted (from the two previous batches) slower than this per call (s)")
    p.add_argument("--pin-loop-max", type=int, default=None, help="time Pinocchio's loop on at most this many states")
    p.add_argument("--compile", action="store_true", help="also time diffmech.dynamics.compiled for RNEA/CRBA/ABA "
                   "and the FD gradient (native kernels: seconds to build each, ~30 s for the gradient)")
    p.add_argument("--json", default=None, help=f"JSON output (default {DEFAULT_JSON.relative_to(ROOT)})")
    p.add_argument("--markdown", default=None, help=f"markdown file to update (default {DEFAULT_MD.name}; '' = none)")
    p.add_argument("--note", default="", help="a remark printed into the markdown section")
    p.add_argument("--no-peers", action="store_true", help="time diffmech only (e.g. for --compile studies)")
    p.add_argument("--section", default="bench_dynamics",
                   help="markdown block to write (<!-- NAME:start/end -->); any name but the default holds only "
                   "the compiled table")
    p.add_argument("--verbose", "-v", action="store_true", help="print each cell as it is measured")
    p.add_argument("--from-json", default=None, metavar="PATH",
                   help="measure nothing: print and write the markdown of a previous run's JSON")
    args = p.parse_args(argv)
    quick = args.quick
    defaults = {
        "robots": "iiwa" if quick else "iiwa,allegro",
        "dtypes": "float64" if quick else "float64,float32",
        "batches": "1,8" if quick else "1,64,1024,16384",
        "algos": ",".join(ALGOS),
        "budget": 0.02 if quick else 0.5,
        "pin_loop_max": 4 if quick else 256,
        "json": "" if quick else str(DEFAULT_JSON),
        "markdown": "" if quick else str(DEFAULT_MD),
    }
    for k, val in defaults.items():
        if getattr(args, k) is None:
            setattr(args, k, val)
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.from_json:
        result = json.loads(Path(args.from_json).read_text())
        print_tables(result)
        if args.markdown:
            write_markdown(Path(args.markdown), markdown(result, args.section), result["meta"], args.section)
            print(f"updated {args.markdown}")
        return result
    result = run(args)
    print_tables(result)
    if args.json:
        out = Path(args.json)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(result, indent=1))
        print(f"\nwrote {out}")
    if args.markdown:
        write_markdown(Path(args.markdown), markdown(result, args.section), result["meta"], args.section)
        print(f"updated {args.markdown}")
    print(f"elapsed {result['meta']['elapsed_s']} s")
    return result


if __name__ == "__main__":
    main()
