"""Where users call the core: learnable-parameter gradients, per-call overhead, the first call of a
process, eager calls on a loaded machine, and the default call at a large batch.

Sections (each a JSON entry and a table in BENCHMARKS.md):

* ``param_grad``: the gradient of a system-identification loss ``sum |ID(q, v, a; theta) - tau|^2``
  w.r.t. the mass and the 3x3 inertia of every moving link of the iiwa (float64), by diffmech
  (autograd through the torch code; the default path with native kernels; ``compiled``) against
  differentiable-robot-model's autograd (same parameters, learnable through its own API) and
  Pinocchio's joint-torque regressor (``computeJointTorqueRegressor`` per state, then ``Y^T r``;
  Pinocchio has no batch API for it). All three gradients are checked to agree first.
* ``overhead``: one native call at batch 1: the whole call (``compiled(...)``; the default path
  ``robot.inverse_dynamics``), the kernel alone, and the difference (the Python overhead).
* ``first_call``: a fresh process with the kernels stored on disk: import time and the first call.
* ``eager_under_load``: eager forward and inverse dynamics and the mass matrix at batch 1 (the
  torch code, 2 threads), median and 90th percentile, alone and with busy processes on every core,
  in the Jacobian formulation of small batches and the elementwise one.
* ``default_call``: ``robot.forward_dynamics`` / ``inverse_dynamics`` without a graph at batch 1024,
  native kernels built by ``diffmech.dynamics.kernels.prepare``, against Pinocchio's batch API and
  differentiable-robot-model.

Run from the repository root: ``python benchmarks/bench_core_calls.py`` (about 5 minutes cold).
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import torch

import _machine
import _peers
import diffmech
from bench_dynamics import time_call
from diffmech.dynamics import _jacobian, compiled, kernels

HERE = Path(__file__).resolve().parent
START, END = "<!-- bench_core_calls:start -->", "<!-- bench_core_calls:end -->"
F64 = torch.float64


def states(robot, B: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(B, generator=g)
    v = torch.randn(B, robot.nv, dtype=F64, generator=g)
    a = torch.randn(B, robot.nv, dtype=F64, generator=g)
    return q, v, a


# --------------------------------------------------------------------------- parameter gradients
def moving_links(robot) -> list[str]:
    return [n for n, b in zip(robot.link_names, robot.link_body) if b >= 0 and float(robot.link_params(n).mass) > 0]


def diffmech_param_grad(robot, links, q, v, a, tau, mode: str):
    """A callable: the sys-ID loss and its backward; returns the parameter gradients."""
    params = []
    for link in links:
        for name in ("mass", "inertia"):
            robot.make_link_param_learnable(link, name)
            params.append(getattr(robot.link_params(link), name))
    f = compiled(robot, "inverse_dynamics", passive=False) if mode == "compiled" else None

    def run():
        for p in params:
            p.grad = None
        with kernels.native_mode("auto" if mode == "default" else "never"):
            out = f(q, v, a) if f is not None else robot.inverse_dynamics(q, v, a, passive=False)
        ((out - tau) ** 2).sum().backward()
        return [p.grad for p in params]

    return run


def drm_param_grad(path, links, q, v, a, tau):
    from differentiable_robot_model.rigid_body_params import UnconstrainedScalar, UnconstrainedTensor

    peer = _peers.DrmPeer(path, "iiwa_link_ee", F64)
    m = peer.model
    params = []
    with _peers.drm_float64(True):
        for link in links:
            body = m._bodies[m._name_to_idx_map[link]]
            mass = body.inertia.mass().detach().clone().reshape(1)
            inertia = body.inertia.inertia_mat().detach().clone()
            m.make_link_param_learnable(link, "mass", UnconstrainedScalar(init_val=mass))
            m.make_link_param_learnable(link, "inertia_mat", UnconstrainedTensor(3, 3, init_tensor=inertia))
            params += [body.inertia.mass.param, body.inertia.inertia_mat.param]  # the modules installed above

    def run():
        for p in params:
            p.grad = None
        with _peers.drm_float64(True):
            out = m.compute_inverse_dynamics(q, v, a, use_damping=False)
            ((out - tau) ** 2).sum().backward()
        return [p.grad for p in params]

    return run


def pin_param_grad(path, robot, links, q, v, a, tau):
    """Pinocchio: the regressor Y per state (nv x 10 per joint), the residual, and Y^T r summed;
    the gradient w.r.t. Pinocchio's inertial parameters (m, m c, I about the joint origin)."""
    peer = _peers.PinPeer(path, robot, "iiwa_link_ee")
    pin, model, data = peer.pin, peer.model, peer.data
    qp, vp, ap = peer.to_pin(q, v, a)
    # diffmech joint order -> Pinocchio v order
    order = np.zeros(robot.nv, dtype=int)
    order[peer._vi] = np.arange(robot.nv)
    tau_pin = tau.detach().numpy()[:, order]
    rows = [(np.ascontiguousarray(qp[i]), np.ascontiguousarray(vp[i]), np.ascontiguousarray(ap[i]),
             tau_pin[i]) for i in range(qp.shape[0])]

    def run():
        g = np.zeros(10 * (model.njoints - 1))
        for qi, vi, ai, ti in rows:
            Y = pin.computeJointTorqueRegressor(model, data, qi, vi, ai)
            r = Y @ np.concatenate([model.inertias[j].toDynamicParameters() for j in range(1, model.njoints)]) - ti
            g += 2.0 * (Y.T @ r)
        return g

    return run


def _sym(g):
    """The symmetric part of an inertia-matrix gradient: differentiable-robot-model learns all nine
    entries of the matrix, diffmech the six of a symmetric one (the same derivative once symmetrised)."""
    if g.shape[-2:] == (3, 3):
        return 0.5 * (g + g.transpose(-1, -2))
    return g


def bench_param_grad(args) -> dict:
    path, _ = _peers.robot_path("iiwa")
    out = {"batches": {}, "check": None}
    for B in args.grad_batches:
        robot = diffmech.load_urdf(path)
        links = moving_links(robot)
        q, v, a = states(robot, B, seed=B)
        with torch.no_grad():
            tau = robot.inverse_dynamics(q, v, a, passive=False) * 1.05 + 0.1  # "measured" torques
        kernels.prepare(robot, ["inverse_dynamics"], passive=(False,), gradients=True, parameters=True)
        cells = {}
        for mode in ("eager", "default", "compiled"):
            r = diffmech.load_urdf(path)
            cells[f"diffmech {mode}"] = diffmech_param_grad(r, links, q, v, a, tau, mode)
        if _peers.available("differentiable_robot_model"):
            cells["differentiable-robot-model"] = drm_param_grad(path, links, q, v, a, tau)
        if _peers.available("pinocchio"):
            cells["Pinocchio regressor loop"] = pin_param_grad(path, robot, links, q, v, a, tau)
        if out["check"] is None:  # the gradients agree (mass gradients: identical parameters everywhere)
            ref = cells["diffmech eager"]()
            errs = {}
            for name, fn in cells.items():
                if name.startswith("diffmech") or name.startswith("differentiable"):
                    got = fn()
                    errs[name] = max(float((_sym(x).reshape(-1) - y.reshape(-1)).abs().max()
                                           / y.abs().max().clamp_min(1e-12)) for x, y in zip(got, ref))
            out["check"] = {"max relative difference to diffmech eager": errs, "batch": B}
        times = {name: time_call(fn, args.budget) for name, fn in cells.items()}
        out["batches"][B] = {name: t["seconds"] for name, t in times.items()}
        print(f"param_grad B={B}: " + ", ".join(f"{k} {1e3 * t:.2f} ms" for k, t in out["batches"][B].items()),
              flush=True)
    return out


# --------------------------------------------------------------------------- overhead of a native call
def bench_overhead(args) -> dict:
    path, _ = _peers.robot_path("iiwa")
    robot = diffmech.load_urdf(path)
    q, v, a = states(robot, 1)
    f = compiled(robot, "inverse_dynamics")
    kernels.prepare(robot, ["inverse_dynamics"], gradients=False)
    with torch.no_grad():
        f(q, v, a)
        k = f._call.kernel(F64)
        _, C = robot.model_tensors_flat(F64)

        def loop(fn, n):
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) / n

        res = {}
        for name, fn in {"compiled call": lambda: f(q, v, a), "kernel alone": lambda: k([q, v, a], C),
                         "default path (robot.inverse_dynamics, native)": None}.items():
            if fn is None:
                def fn():
                    robot.inverse_dynamics(q, v, a)
                ctx = kernels.native_mode("auto")
            else:
                ctx = kernels.native_mode("never")
            with ctx:
                for _ in range(1000):
                    fn()
                res[name] = statistics.median(loop(fn, 2000) for _ in range(15))
    res["python overhead (compiled)"] = res["compiled call"] - res["kernel alone"]
    res["python overhead (default path)"] = res["default path (robot.inverse_dynamics, native)"] - res["kernel alone"]
    print("overhead: " + ", ".join(f"{k} {1e6 * t:.1f} us" for k, t in res.items()), flush=True)
    return res


# --------------------------------------------------------------------------- the first call of a process
_FIRST = textwrap.dedent("""
    import time
    t0 = time.perf_counter()
    import torch, diffmech, diff_robot_data, os
    from diffmech.dynamics import _jacobian, compiled, kernels
    t1 = time.perf_counter()
    robot = diffmech.load_urdf(os.path.join(diff_robot_data.__path__[0], "kuka_iiwa/urdf/iiwa7.urdf"))
    q = robot.random_configuration(8); v = torch.zeros(8, 7, dtype=torch.float64)
    t2 = time.perf_counter()
    with torch.no_grad():
        compiled(robot, "{alg}")(q, v, v)
    t3 = time.perf_counter()
    with kernels.native_mode("auto"), torch.no_grad():
        getattr(robot, "{alg}")(q, v, v)
    t4 = time.perf_counter()
    print(t1 - t0, t2 - t1, t3 - t2, t4 - t3)
""")


def bench_first_call(args) -> dict:
    out = {}
    for alg in ("forward_dynamics", "inverse_dynamics"):
        code = _FIRST.format(alg=alg)
        subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)  # build / store
        runs = []
        for _ in range(3):
            res = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
            runs.append([float(x) for x in res.stdout.split()])
        med = [statistics.median(r[i] for r in runs) for i in range(4)]
        out[alg] = {"import_s": med[0], "load_urdf_s": med[1], "first_compiled_call_s": med[2],
                    "first_default_call_s": med[3]}
        print(f"first call {alg}: {out[alg]}", flush=True)
    return out


# --------------------------------------------------------------------------- eager calls on a loaded machine
def _busy(stop):
    while not stop.is_set():
        sum(i * i for i in range(10000))


def _timed(call, n: int) -> list[float]:
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        call()
        ts.append(time.perf_counter() - t0)
    return ts


def bench_eager_under_load(args) -> dict:
    """Eager calls at batch 1 on the iiwa, alone and with a busy process on every core, in the two
    eager formulations of small batches: the centre-of-mass Jacobians (the default up to
    ``JACOBIAN_MAX_BATCH`` states) and the elementwise one (what larger batches take), interleaved
    in one process."""
    path, _ = _peers.robot_path("iiwa")
    robot = diffmech.load_urdf(path)
    q, v, a = states(robot, 1)
    calls = {"forward_dynamics": lambda: robot.forward_dynamics(q, v, a),
             "inverse_dynamics": lambda: robot.inverse_dynamics(q, v, a),
             "mass_matrix": lambda: robot.mass_matrix(q)}
    formulations = {"jacobian": _jacobian.JACOBIAN_MAX_BATCH, "elementwise": 0}
    out = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        for busy in (0, os.cpu_count() or 2):
            stop = multiprocessing.Event()
            procs = [multiprocessing.Process(target=_busy, args=(stop,)) for _ in range(busy)]
            for p in procs:
                p.start()
            try:
                time.sleep(0.5)
                # Interleaved rounds, so that a drift of the shared machine's speed hits both alike.
                ts = {(form, alg): [] for form in formulations for alg in calls}
                with kernels.native_mode("never"), torch.no_grad():
                    for rnd in range(9):
                        for form, limit in formulations.items():
                            _jacobian.JACOBIAN_MAX_BATCH = limit
                            for alg, call in calls.items():
                                got = _timed(call, 50)
                                if rnd:  # the first round warms up
                                    ts[form, alg] += got
                for form in formulations:
                    row = {}
                    for alg in calls:
                        x = sorted(ts[form, alg])
                        row[alg] = {"median_ms": 1e3 * statistics.median(x), "p90_ms": 1e3 * x[int(0.9 * len(x))],
                                    "max_ms": 1e3 * x[-1]}
                    out[f"{busy} busy processes, {form}"] = row
                    print(f"eager batch 1, {busy} busy, {form}: "
                          + ", ".join(f"{k} {r['median_ms']:.3f} ms" for k, r in row.items()), flush=True)
            finally:
                _jacobian.JACOBIAN_MAX_BATCH = formulations["jacobian"]
                stop.set()
                for p in procs:
                    p.join()
    finally:
        torch.set_num_threads(threads)
    return out


# --------------------------------------------------------------------------- the default call at batch 1024
def bench_default_call(args) -> dict:
    path, ee = _peers.robot_path("iiwa")
    robot = diffmech.load_urdf(path)
    kernels.prepare(robot, ["forward_dynamics", "inverse_dynamics"], passive=(False,), gradients=False)
    B = 1024
    q, v, a = states(robot, B, seed=3)
    out = {}
    cells = {}
    for alg, pin_alg in (("forward_dynamics", "aba"), ("inverse_dynamics", "rnea")):
        def ours(alg=alg, mode="auto"):
            with kernels.native_mode(mode), torch.no_grad():
                getattr(robot, alg)(q, v, a, passive=False)
        cells[(alg, "diffmech default (native)")] = ours
        cells[(alg, "diffmech eager (torch code)")] = lambda alg=alg: ours(alg, "never")
        if _peers.available("pinocchio"):
            pp = _peers.PinPeer(path, robot, ee)
            fn = pp.parallel_fn(pin_alg, *pp.to_pin(q, v, a))
            if fn is not None:
                cells[(alg, "Pinocchio batch 2 thr")] = fn
        if _peers.available("differentiable_robot_model"):
            drm = _peers.DrmPeer(path, ee, F64)
            cells[(alg, "differentiable-robot-model")] = drm.fn(pin_alg, q, v, a)
    for (alg, name), fn in cells.items():
        out.setdefault(alg, {})[name] = B / time_call(fn, args.budget)["seconds"]
    for alg, row in out.items():
        print(f"default call {alg} B={B} states/s: " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()), flush=True)
    return out


# --------------------------------------------------------------------------- output
def machine() -> dict:
    model = _machine.cpu_model()
    return {"date": datetime.datetime.now().isoformat(timespec="seconds"), "cpu": model, "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "versions": _peers.versions(), "load_average": os.getloadavg()}


def ratio(x, y):
    return f"{x / y:.2f}x" if x and y else "n/a"


def markdown(res: dict) -> str:
    m = res["machine"]
    lines = [START, f"_Generated by `{res['command']}` on {m['date']} ({res['elapsed_s']:.0f} s); {m['cpu']}, "
                    f"{m['cores']} cores, torch {m['versions']['torch']}, {m['torch_threads']} threads; load average "
                    f"at the end {', '.join(f'{x:.1f}' for x in m['load_average'])}._", ""]
    if "param_grad" in res:
        pg = res["param_grad"]
        lines += ["### Gradient of a system-identification loss w.r.t. every link's mass and inertia (iiwa, float64)",
                  "", "| batch | diffmech eager | diffmech default (native) | diffmech compiled | "
                  "differentiable-robot-model | Pinocchio regressor loop | native / DRM | native / Pinocchio |",
                  "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for B, row in pg["batches"].items():
            def ms(k, row=row):
                return f"{1e3 * row[k]:.2f} ms" if row.get(k) else "n/a"

            nat = row.get("diffmech default")
            lines.append(f"| {B} | {ms('diffmech eager')} | {ms('diffmech default')} | "
                         f"{ms('diffmech compiled')} | {ms('differentiable-robot-model')} | "
                         f"{ms('Pinocchio regressor loop')} | {ratio(row.get('differentiable-robot-model'), nat)} | "
                         f"{ratio(row.get('Pinocchio regressor loop'), nat)} |")
        chk = pg["check"]
        lines += ["", f"Agreement of the gradients at batch {chk['batch']} (max relative difference to diffmech "
                      "eager): " + ", ".join(f"{k} {v:.1e}" for k, v in
                                             chk["max relative difference to diffmech eager"].items()) + " "
                  "(inertia gradients symmetrised: differentiable-robot-model learns all nine entries of each "
                  "matrix). The loss is the sum of squared residuals of inverse dynamics (no damping) against "
                  "torques; *default*: `robot.inverse_dynamics` with the kernels `prepare()` built (the parameter "
                  "cotangents reduced over the batch inside the kernel); *compiled*: "
                  "`compiled(robot, \"inverse_dynamics\")`; *Pinocchio regressor loop*: per state "
                  "`computeJointTorqueRegressor` and `Y^T r` accumulated, a Python loop (Pinocchio has no batched "
                  "regressor), the gradient w.r.t. Pinocchio's inertial parameters.", ""]
    if "overhead" in res:
        o = res["overhead"]
        lines += ["### One native call at batch 1 (iiwa inverse dynamics, float64, no graph)", "",
                  "| what | time |", "| --- | ---: |"]
        lines += [f"| {k} | {1e6 * v:.1f} us |" for k, v in o.items()] + [""]
    if "first_call" in res:
        lines += ["### A fresh process, kernels stored on disk (median of 3 processes)", "",
                  "| algorithm | import diffmech | load_urdf | first `compiled(...)` call | first default call |",
                  "| --- | ---: | ---: | ---: | ---: |"]
        for alg, r in res["first_call"].items():
            lines.append(f"| {alg} | {r['import_s']:.2f} s | {r['load_urdf_s']:.2f} s | "
                         f"{r['first_compiled_call_s']:.3f} s | {r['first_default_call_s']:.3f} s |")
        lines.append("")
    if "eager_under_load" in res:
        lines += ["### Eager calls at batch 1 (the torch code, iiwa, float64, 2 threads)", "",
                  "Median per call, 90th percentile in brackets; `jacobian` is the formulation batches of up to "
                  "`JACOBIAN_MAX_BATCH` states take, `elementwise` the one of larger batches (and of this "
                  "call before it existed).", "",
                  "| machine, formulation | forward dynamics | inverse dynamics | mass matrix |",
                  "| --- | ---: | ---: | ---: |"]
        for k, r in res["eager_under_load"].items():
            cells = [f"{r[a]['median_ms']:.2f} ms ({r[a]['p90_ms']:.2f})"
                     for a in ("forward_dynamics", "inverse_dynamics", "mass_matrix")]
            lines.append(f"| {k} | " + " | ".join(cells) + " |")
        lines.append("")
    if "default_call" in res:
        lines += ["### The default call without a graph at batch 1024 (iiwa, float64, states per second)", "",
                  "| algorithm | diffmech default (native) | diffmech eager | Pinocchio batch 2 thr | "
                  "differentiable-robot-model | default / Pinocchio | default / DRM |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for alg, r in res["default_call"].items():
            d = r.get("diffmech default (native)")
            pinr, drm = r.get("Pinocchio batch 2 thr"), r.get("differentiable-robot-model")
            lines.append(f"| {alg} | {d:.3g} | {r['diffmech eager (torch code)']:.3g} | "
                         f"{pinr:.3g} | {drm:.3g} | {ratio(d, pinr)} | {ratio(d, drm)} |")
        lines.append("")
    lines.append(END)
    return "\n".join(lines)


def write_markdown(path: Path, block: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if START in text and END in text:
        text = text[:text.index(START)] + block + text[text.index(END) + len(END):]
    else:
        text = text.rstrip("\n") + "\n\n## Where users call the core\n\n" + block + "\n"
    path.write_text(text)


SECTIONS = {"param_grad": bench_param_grad, "overhead": bench_overhead, "first_call": bench_first_call,
            "eager_under_load": bench_eager_under_load, "default_call": bench_default_call}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    p.add_argument("--grad-batches", default="64,1024", help="batches of the parameter-gradient section")
    p.add_argument("--budget", type=float, default=1.0, help="seconds per timed cell")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=str(HERE / "results" / "bench_core_calls.json"))
    p.add_argument("--markdown", default=str(HERE.parent / "BENCHMARKS.md"), help="'' to skip")
    args = p.parse_args(argv)
    args.grad_batches = [int(x) for x in args.grad_batches.split(",")]
    torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    res = {"command": "python benchmarks/bench_core_calls.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    for name in args.sections.split(","):
        res[name] = SECTIONS[name](args)
    res["elapsed_s"] = time.perf_counter() - t0
    res["machine"] = machine()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=1, default=str))
    if args.markdown:
        write_markdown(Path(args.markdown), markdown(res))
    return res


if __name__ == "__main__":
    main()
