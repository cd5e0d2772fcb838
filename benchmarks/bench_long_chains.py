"""Long kinematic chains: memory and first-call time against the length of the chain, and against Pinocchio.

Snakes, ropes and long manipulators have hundreds of links. Until the CRBA placement table became an index
(``KinematicTree.tables().crba_gather``), a dense ``(nv^2, npairs)`` 0/1 matrix made the memory of the first
mass matrix or forward dynamics call grow with ``nv^4`` (1.1 GB at 100 links, 4.2 GB at 150, 12.7 GB and
55 s at 200; an allocator error at 300). This script measures, for serial chains of ``--chains`` links and
branching trees of ``--trees`` links (binary trees: 8 and 10 levels deep), each built from a URDF string
written here and read by both libraries (``diffmech.load_urdf`` and ``pinocchio.buildModelFromXML``):

* ``build``: reading the URDF into a model (Pinocchio: ``buildModelFromXML`` and ``createData``);
* ``fd1`` / ``fd16``: ``robot.forward_dynamics(q, v, tau)`` (the default method) at batch 1 and 16
  (Pinocchio: ``aba`` per state in a Python loop);
* ``mass``: ``robot.mass_matrix(q)`` at batch 1 (Pinocchio: ``crba``).

Each cell runs in a fresh process (float64, ``DIFFMECH_NATIVE=never``: the torch code, no native kernels;
``--threads`` torch threads, Pinocchio single-threaded): the time of the first call (the model built, its
tables not: the first call builds them), the steady time (the fastest of a few later calls), and the peak
resident memory of the process (``ru_maxrss``) above what it held after its imports, which is what the
model and the call added. Ratios are diffmech over Pinocchio, measured in the same run. Forward dynamics and
the mass matrix are checked against Pinocchio on the same state (largest error relative to the largest
entry, in the ``agreement`` entries) where its ``Data`` takes at most 2 GB.

Pinocchio's ``createData`` takes up to about ``64 nv^3`` bytes (its ``Data`` holds ``nv^3`` tensors of
second-order derivatives: 0.45 GB at 200 DoFs, 1.7 GB at 300, 64 GB at 1000): its cells are not run where
that exceeds ``--pin-max-gb`` (6: up to about 450 DoFs), and its workers run under an address-space limit
3 GB above it.

``--before REV`` also measures the diffmech of a git revision (``git archive REV src``, unpacked into a
temporary directory and put first on ``PYTHONPATH``; the working tree and the index are left alone) on the
sizes up to ``--before-max`` links (150: the old code needs 12.7 GB at 200 links), and reports the ratios
now / before.

    python benchmarks/bench_long_chains.py                  # results/long_chains.json + BENCHMARKS.md (~4 min)
    python benchmarks/bench_long_chains.py --before 59e2c9d # + the code before the index tables (~5 min)
    python benchmarks/bench_long_chains.py --quick          # seconds, writes nothing
    python benchmarks/bench_long_chains.py --chains 2000,5000 --trees '' --markdown none --json /tmp/l.json
    python benchmarks/bench_long_chains.py --from-json benchmarks/results/long_chains.json   # re-render
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tarfile
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

MARK_START, MARK_END = "<!-- bench_long_chains:start -->", "<!-- bench_long_chains:end -->"
OPS = ("build", "fd1", "fd16", "mass")
OP_TEXT = {"build": "build the model", "fd1": "forward dynamics, batch 1", "fd16": "forward dynamics, batch 16",
           "mass": "mass matrix, batch 1"}


# --------------------------------------------------------------------------- the robots
def _link(name: str, k: int) -> str:
    m = 1.0 + 0.1 * (k % 3)
    return (f'<link name="{name}"><inertial><origin xyz="0.01 0 0.05" rpy="0 0 0"/><mass value="{m}"/>'
            f'<inertia ixx="{0.01 * m}" ixy="0.0005" ixz="0" iyy="{0.012 * m}" iyz="0" izz="{0.004 * m}"/>'
            f"</inertial></link>")


def _joint(k: int, parent: str, child: str, xyz: str) -> str:
    axis = ("0 1 0", "1 0 0", "0 0 1")[k % 3]
    return (f'<joint name="j{k}" type="revolute"><parent link="{parent}"/><child link="{child}"/>'
            f'<origin xyz="{xyz}" rpy="0 0 0.3"/><axis xyz="{axis}"/>'
            f'<limit lower="-3.14" upper="3.14" effort="100" velocity="10"/></joint>')


def urdf(system: str, n: int) -> str:
    """A URDF of ``n`` moving links: ``chain`` (each link on the previous one; a 3-D snake, the joint
    axes turning through y, x, z) or ``tree`` (link ``k`` on link ``(k - 1) // 2``: a binary tree)."""
    parts = [f'<?xml version="1.0"?><robot name="{system}{n}">', '<link name="l0"/>']
    for k in range(1, n + 1):
        parent = k - 1 if system == "chain" else (k - 1) // 2
        xyz = "0 0 0.1" if system == "chain" else f"0 {0.05 if k % 2 else -0.05} 0.1"
        parts += [_link(f"l{k}", k), _joint(k, f"l{parent}", f"l{k}", xyz)]
    parts.append("</robot>")
    return "".join(parts)


def depth(system: str, n: int) -> int:
    return n if system == "chain" else n.bit_length()


# --------------------------------------------------------------------------- one cell, in its own process
def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _states(n: int, batch: int, seed: int = 0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.uniform(-1, 1, (batch, n)), rng.standard_normal((batch, n)), rng.standard_normal((batch, n))


def _steady(fn, budget: float = 0.5, repeats: int = 3) -> float:
    best, t_end, k = float("inf"), time.perf_counter() + budget, 0
    while k < repeats or (time.perf_counter() < t_end and k < 20):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        k += 1
        if best > budget:
            break
    return best


class _PinMap:
    """Pinocchio's model of the same URDF, with diffmech's joint order mapped to its q and v."""

    def __init__(self, xml: str, joint_names):
        import pinocchio as pin

        self.pin = pin
        self.model = pin.buildModelFromXML(xml)
        self.data = self.model.createData()
        self.iq = [self.model.joints[self.model.getJointId(j)].idx_q for j in joint_names]
        self.iv = [self.model.joints[self.model.getJointId(j)].idx_v for j in joint_names]

    def aba(self, q, v, tau):
        import numpy as np

        qp, vp, up = np.zeros(self.model.nq), np.zeros(self.model.nv), np.zeros(self.model.nv)
        qp[self.iq], vp[self.iv], up[self.iv] = q, v, tau
        return np.asarray(self.pin.aba(self.model, self.data, qp, vp, up))[self.iv]

    def crba(self, q):
        import numpy as np

        qp = np.zeros(self.model.nq)
        qp[self.iq] = q
        M = np.array(self.pin.crba(self.model, self.data, qp))
        M = np.triu(M) + np.triu(M, 1).T
        return M[np.ix_(self.iv, self.iv)]


def worker(cfg: dict) -> dict:
    """Measure one cell (see the module docstring); runs in a fresh process."""
    system, n, op, lib = cfg["system"], cfg["links"], cfg["op"], cfg["lib"]
    xml = urdf(system, n)
    batch = 16 if op == "fd16" else 1
    q, v, tau = _states(n, batch)
    out = {"system": system, "links": n, "op": op, "lib": cfg["label"], "batch": batch}
    if cfg.get("max_gb"):  # address space: a failed allocation is reported instead of swapping the machine
        lim = int(cfg["max_gb"] * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (lim, lim))
    if lib == "pinocchio":
        import numpy as np
        import pinocchio as pin

        small = pin.buildModelFromXML(urdf("chain", 2))  # warm-up: lazy imports and first-call set-up
        pin.aba(small, small.createData(), np.zeros(2), np.zeros(2), np.zeros(2))
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        model = pin.buildModelFromXML(xml)
        out["model_s"] = time.perf_counter() - t0
        data = model.createData()
        out["build_s"] = time.perf_counter() - t0
        out["data_mb"] = _rss_mb() - rss0
        qs, vs, us = (np.ascontiguousarray(x) for x in (q, v, tau))  # random states (the check maps joints by name)
        if op == "build":
            call = None
        elif op == "mass":
            def call():
                return pin.crba(model, data, qs[0])
        else:
            def call():
                for k in range(batch):
                    pin.aba(model, data, qs[k], vs[k], us[k])
    else:
        os.environ["DIFFMECH_NATIVE"] = "never"
        import torch

        import diffmech

        torch.set_num_threads(cfg["threads"])
        qt, vt, ut = (torch.from_numpy(x) for x in (q, v, tau))
        small = diffmech.load_urdf(urdf("chain", 2), dtype=torch.float64)  # warm-up: lazy imports, torch set-up
        small.forward_dynamics(qt[:, :2], vt[:, :2], ut[:, :2])
        small.mass_matrix(qt[:, :2])
        rss0 = _rss_mb()
        t0 = time.perf_counter()
        robot = diffmech.load_urdf(xml, dtype=torch.float64)
        out["build_s"] = time.perf_counter() - t0
        out["nv"] = robot.nv
        if op == "build":
            call = None
        elif op == "mass":
            def call():
                return robot.mass_matrix(qt)
        else:
            def call():
                return robot.forward_dynamics(qt, vt, ut)
    if call is not None:
        t0 = time.perf_counter()
        got = call()
        out["first_s"] = time.perf_counter() - t0
        out["steady_s"] = _steady(call)
    out["peak_rss_mb"] = _rss_mb()
    out["delta_rss_mb"] = out["peak_rss_mb"] - rss0
    if lib != "pinocchio" and op in ("fd1", "mass") and cfg.get("check"):
        try:
            import numpy as np

            ref = _PinMap(xml, robot.joint_names)
            got = got.detach().numpy()[0]
            want = ref.aba(q[0], v[0], tau[0]) if op == "fd1" else ref.crba(q[0])
            out["max_rel_err"] = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-300))
        except ImportError:
            pass
    return out


def pin_data_gb(nv: int) -> float:
    """Pinocchio's ``createData`` in GB, measured: up to about ``64 nv^3`` bytes (its ``Data`` holds ``nv^3``
    tensors of second-order derivatives: 0.45 GB at 200 DoFs, 1.2-1.7 GB at 300; 64 GB at 1000)."""
    return 64e-9 * nv**3


def run_cell(cfg: dict, src: str | None, timeout: float) -> dict:
    env = dict(os.environ, DIFFMECH_NATIVE="never", OMP_NUM_THREADS=str(cfg["threads"]))
    if src:
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    base = {k: cfg[k] for k in ("system", "links", "op")} | {"lib": cfg["label"]}
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", json.dumps(cfg)], env=env,
                           cwd=ROOT, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return base | {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or [f"exit status {p.returncode}"])[-1]
        return base | {"error": tail[-300:]}
    return json.loads(lines[-1])


# --------------------------------------------------------------------------- report
def _fmt_s(x) -> str:
    if x is None:
        return "-"
    return f"{x:.3f} s" if x >= 0.1 else f"{1e3 * x:.2f} ms"


def _fmt_mb(x) -> str:
    return "-" if x is None else f"{x:,.0f} MB" if x >= 10 else f"{x:.1f} MB"


def _ratio(a, b) -> str:
    return "-" if a is None or b is None or b <= 0 else f"{a / b:,.1f}x"


def _mem_ratio(a, b) -> str:
    """``a / b`` of two memory increases, ``-`` where Pinocchio's is under 1 MB (below what ``ru_maxrss``
    resolves against the peak of its imports)."""
    return "-" if a is None or b is None or b < 1.0 else f"{a / b:.2g}x"


def _cells(rep: dict) -> dict:
    return {(c["lib"], c["system"], c["links"], c["op"]): c for c in rep["cells"]}


def ratios(rep: dict) -> list[dict]:
    """diffmech / Pinocchio and, where measured, diffmech / diffmech before, per cell."""
    cells, out = _cells(rep), []
    before = rep.get("before_label")
    for (lib, system, n, op), c in cells.items():
        if lib != "diffmech" or "error" in c:
            continue
        for peer in ["pinocchio"] + ([before] if before else []):
            p = cells.get((peer, system, n, op))
            if p is None:
                continue
            r = {"system": system, "links": n, "op": op, "vs": peer}
            if "error" in p:
                r["peer_error"] = p["error"]
            else:
                for key in ("build_s", "first_s", "steady_s", "delta_rss_mb", "peak_rss_mb"):
                    if c.get(key) is not None and p.get(key):
                        r[key] = c[key] / p[key]
            out.append(r)
    return out


def print_table(rep: dict) -> None:
    cells = _cells(rep)
    before = rep.get("before_label")
    for system, n in rep["sizes"]:
        print(f"\n{system} of {n} links")
        for op in OPS:
            c, p = cells.get(("diffmech", system, n, op), {}), cells.get(("pinocchio", system, n, op), {})
            key = "build_s" if op == "build" else "first_s"
            ct, pt = c.get("steady_s", c.get(key)), p.get("steady_s", p.get(key))
            line = (f"  {op:6s} first {_fmt_s(c.get(key)):>10s} steady {_fmt_s(c.get('steady_s')):>10s} "
                    f"+RSS {_fmt_mb(c.get('delta_rss_mb')):>9s} | pinocchio {_fmt_s(pt):>10s} "
                    f"+RSS {_fmt_mb(p.get('delta_rss_mb')):>8s} | time {_ratio(ct, pt)} peak RSS "
                    f"{_ratio(c.get('peak_rss_mb'), p.get('peak_rss_mb'))}")
            b = cells.get((before, system, n, op)) if before else None
            if b:
                line += (f" | before: {b['error'][:60]}" if "error" in b else
                         f" | before first {_fmt_s(b.get(key))} +RSS {_fmt_mb(b.get('delta_rss_mb'))}")
            if "error" in c:
                line = f"  {op:6s} ERROR {c['error']}"
            print(line, flush=True)


def _peak(rep: dict, lib: str) -> str:
    peaks = [c["peak_rss_mb"] for c in rep["cells"] if c["lib"] == lib and "peak_rss_mb" in c]
    return f"{min(peaks):,.0f}-{max(peaks):,.0f}" if peaks else "?"


def section(rep: dict) -> str:
    from _markdown import generated_by

    cells = _cells(rep)
    before = rep.get("before_label")
    lines = [MARK_START, "## Long chains: memory and first-call time", "",
             generated_by("bench_long_chains.py", rep) if "machine" in rep else "", "",
             "Serial chains and binary trees of revolute links (a tree of 200 links is 8 levels deep, of 1000 "
             "links 10), built from one URDF string by both libraries; float64, the torch code "
             "(`DIFFMECH_NATIVE=never`), one process per cell. "
             "*first*: the first call after building the model (diffmech builds its index tables there); "
             "*steady*: the fastest later call; *+RSS*: the process's peak resident memory above what it held "
             "after its imports. Pinocchio: `buildModelFromXML` + `createData`, `aba` per state in a Python "
             "loop, `crba`; its first and steady times agree, the steady one is shown. Ratios: diffmech / "
             "Pinocchio (steady time; +RSS, `-` where Pinocchio's is under 1 MB, which `ru_maxrss` does not "
             "resolve). Whole processes: Pinocchio's peaks at about "
             f"{_peak(rep, 'pinocchio')} MB, diffmech's (torch imported) at {_peak(rep, 'diffmech')} MB"
             + (f"; *before*: diffmech at `{before}`, the dense `(nv^2, npairs)` scatter table." if before else ".")
             + " `max err`: largest difference from Pinocchio relative to the largest entry.", "",
             "| robot | call | diffmech first | steady | +RSS | Pinocchio steady | +RSS | time ratio | memory ratio "
             + ("| before: first | before: +RSS " if before else "") + "| max err |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if before else "") + "---:|"]
    for system, n in rep["sizes"]:
        for op in OPS:
            c, p = cells.get(("diffmech", system, n, op), {}), cells.get(("pinocchio", system, n, op), {})
            key = "build_s" if op == "build" else "first_s"
            if "error" in c:
                row = f"| {system} {n} | {OP_TEXT[op]} | error: {c['error'][:80]} | | | | | | "
            elif "error" in p:
                gb = pin_data_gb(n)
                row = (f"| {system} {n} | {OP_TEXT[op]} | {_fmt_s(c.get(key))} | {_fmt_s(c.get('steady_s'))} | "
                       f"{_fmt_mb(c.get('delta_rss_mb'))} | not run ({gb:.0f} GB for `createData`) | | | ")
            else:
                ct, pt = c.get("steady_s", c.get(key)), p.get("steady_s", p.get(key))
                row = (f"| {system} {n} | {OP_TEXT[op]} | {_fmt_s(c.get(key))} | {_fmt_s(c.get('steady_s'))} | "
                       f"{_fmt_mb(c.get('delta_rss_mb'))} | {_fmt_s(pt)} | {_fmt_mb(p.get('delta_rss_mb'))} | "
                       f"{_ratio(ct, pt)} | {_mem_ratio(c.get('delta_rss_mb'), p.get('delta_rss_mb'))} ")
            if before:
                b = cells.get((before, system, n, op))
                if b is None:
                    row += "| not run | "
                elif "error" in b:
                    row += f"| error: {b['error'][:60]} | "
                else:
                    row += f"| {_fmt_s(b.get(key))} | {_fmt_mb(b.get('delta_rss_mb'))} "
            err = c.get("max_rel_err")
            row += f"| {'-' if err is None else f'{err:.0e}'} |"
            lines.append(row)
    lines += ["", "Every table of the tree now has O(nv^2) entries or fewer (the pairs of DoFs whose mass-matrix "
              "entry can be nonzero; on a chain, all of them), and the algorithms place the mass matrix with one "
              "gather; before, the first call of a 100-link chain added 0.8 GB and took 2-3 s, and the issue "
              "measured 4.2 GB at 150 links, 12.7 GB and 55 s at 200, an allocator error at 300 (the before "
              "column stops at `--before-max` links for that reason). `method=\"auto\"` on the CPU takes CRBA + "
              "LU only while `batch * nv^2 <= AUTO_CRBA_MAX_WORK`, ABA beyond (O(nv) memory per state; the mass "
              "matrix itself has `nv^2` entries). Pinocchio's `createData` allocates about `64 nv^3` bytes "
              "(second-order derivative tensors), hence its +RSS from 200 links and the cells not run at 500 and "
              "1000. Its time per call stays 14-330x below eager torch's at batch 1 and 16: each call is a few "
              "hundred operators per level of the tree (a chain of 1000 links is 1000 levels for ABA). Timings on "
              "a loaded shared machine (see the load averages) vary by 2x between runs; the memory does not. "
              f"Raw data: `{rep.get('json_path', 'benchmarks/results/long_chains.json')}`.", MARK_END]
    return "\n".join(lines)


# --------------------------------------------------------------------------- main
def _export(rev: str, into: str) -> str:
    """``src`` of git revision ``rev`` unpacked under ``into`` (``git archive``: no checkout)."""
    tar = os.path.join(into, "src.tar")
    with open(tar, "wb") as f:
        subprocess.run(["git", "archive", rev, "src"], cwd=ROOT, stdout=f, check=True)
    with tarfile.open(tar) as t:
        t.extractall(into, filter="data")
    return os.path.join(into, "src")


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chains", default="50,100,200,500,1000", help="serial chain lengths (links)")
    ap.add_argument("--trees", default="200,1000", help="binary tree sizes (links)")
    ap.add_argument("--ops", default=",".join(OPS))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--before", metavar="REV", help="also measure diffmech at this git revision")
    ap.add_argument("--before-max", type=int, default=150, help="largest size measured with --before")
    ap.add_argument("--no-peers", action="store_true", help="skip Pinocchio")
    ap.add_argument("--pin-max-gb", type=float, default=6.0,
                    help="skip Pinocchio where createData would take more (about 64 nv^3 bytes)")
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds per cell")
    ap.add_argument("--quick", action="store_true", help="chains of 20 and 50 links, a tree of 50; writes nothing")
    ap.add_argument("--json", default=os.path.join(HERE, "results", "long_chains.json"))
    ap.add_argument("--markdown", default=os.path.join(ROOT, "BENCHMARKS.md"), help="'none' skips")
    ap.add_argument("--from-json", metavar="JSON", help="only re-render the section from a results file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(json.loads(args.worker))), flush=True)
        return {}
    from _markdown import publish, replace_section, stamp

    if args.from_json:
        with open(args.from_json) as f:
            rep = json.load(f)
        print_table(rep)
        if args.markdown != "none":
            replace_section(args.markdown, section(rep), MARK_START, MARK_END)
        return rep
    import _machine

    t_start, load_before = time.perf_counter(), os.getloadavg()
    ints = lambda s: [int(x) for x in s.split(",") if x.strip()]  # noqa: E731
    sizes = ([("chain", 20), ("chain", 50), ("tree", 50)] if args.quick else
             [("chain", n) for n in ints(args.chains)] + [("tree", n) for n in ints(args.trees)])
    ops = [op for op in args.ops.split(",") if op]
    try:
        from importlib.metadata import version

        pin_version = version("pin")
    except Exception:
        pin_version = "missing"
    libs = [("diffmech", "diffmech", None)]
    if not args.no_peers and pin_version != "missing":
        libs.append(("pinocchio", "pinocchio", None))
    tmp = tempfile.TemporaryDirectory(prefix="bench_long_chains_")
    before_label = None
    if args.before:
        rev = subprocess.run(["git", "rev-parse", "--short", args.before], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.strip()
        before_label = f"diffmech@{rev}"
        libs.append(("diffmech", before_label, _export(rev, tmp.name)))
    rep = {"machine": _machine.machine(ROOT, args.threads, ["src", "benchmarks/bench_long_chains.py"],
                                       pinocchio=pin_version),
           "sizes": sizes, "ops": ops, "threads": args.threads, "before_label": before_label, "cells": []}
    rep["date"] = rep["machine"]["date"]
    for system, n in sizes:
        for lib, label, src in libs:
            if src is not None and n > args.before_max:
                continue
            for op in ops:
                cfg = {"system": system, "links": n, "op": op, "lib": lib, "label": label, "threads": args.threads,
                       "check": label == "diffmech" and pin_version != "missing" and pin_data_gb(n) <= 2.0}
                if lib == "pinocchio":
                    if pin_data_gb(n) > args.pin_max_gb:
                        rep["cells"].append({"system": system, "links": n, "op": op, "lib": label, "error": (
                            f"not run: createData would take about {pin_data_gb(n):.0f} GB (--pin-max-gb "
                            f"{args.pin_max_gb:g})")})
                        continue
                    cfg["max_gb"] = args.pin_max_gb + 3.0
                rep["cells"].append(run_cell(cfg, os.path.join(ROOT, "src") if src is None else src, args.timeout))
        print_table({**rep, "sizes": [(system, n)]})
    tmp.cleanup()
    rep["ratios"] = ratios(rep)
    rep["agreement"] = [{k: c[k] for k in ("system", "links", "op", "max_rel_err")}
                        for c in rep["cells"] if "max_rel_err" in c]
    stamp(rep, argv=argv, json_path=None if args.quick else args.json, root=ROOT, load_before=load_before,
          t_start=t_start)
    if args.quick:
        return rep
    md = None if args.markdown == "none" else args.markdown
    publish(rep, args.json, md, section, lambda p, s: replace_section(p, s, MARK_START, MARK_END))
    return rep


if __name__ == "__main__":
    main()
