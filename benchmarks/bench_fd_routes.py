"""Forward dynamics: every route it can take, forced one at a time, at the sizes users call.

``robot.forward_dynamics`` picks among a native kernel (CPU, kernels built), ABA and CRBA + LU in the
torch code, and within those a Jacobian formulation of CRBA for small batches, a batch-first ABA of
6x6 matrix products for small batches, and a world-frame variant of both. This benchmark forces each
route in turn (module thresholds and switches set for the run, restored after) and times it against
the one the library picks, so that a route stays only where it wins by a margin at a size users call
(the pipeline issue asks for 1.5x).

Routes (``none`` where a route does not apply to the size):

* ``picked``: the library's own choice (kernels built: the native one);
* ``native``: the native kernel (``set_native("build")``);
* ``aba``: torch ABA, local frames, the batch-last sweep;
* ``aba small``: torch ABA, the batch-first 6x6 products (defined at batches up to 64 here);
* ``aba world``: torch ABA in the world frame;
* ``crba``: torch CRBA + LU, local frames, the batch-last sweep;
* ``crba jacobian``: CRBA from the centre-of-mass Jacobians (batches up to 64 here);
* ``crba world``: CRBA + LU in the world frame.

Each is timed without a graph (``value``) and with the gradient of a scalar of ``qdd`` w.r.t.
``q``, ``v`` and ``tau`` (``value+grad``), float64, in rounds that alternate the routes; the table
gives each route's fastest round relative to the fastest route of its row.

    python benchmarks/bench_fd_routes.py                # results/fd_routes.json + BENCHMARKS.md
    python benchmarks/bench_fd_routes.py --quick --markdown none --json /tmp/r.json
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

import torch  # noqa: E402

import diffmech  # noqa: E402
from _machine import machine  # noqa: E402
from _markdown import publish, replace_section, stamp  # noqa: E402
from diffmech.dynamics import _jacobian, _local, _world, kernels  # noqa: E402

MARK_START, MARK_END = "<!-- bench_fd_routes:start -->", "<!-- bench_fd_routes:end -->"
ROUTES = ("native", "aba", "aba small", "aba world", "crba", "crba jacobian", "crba world")
SMALL_MAX = 64  # the forced small-batch formulations are timed up to this batch


def _robots() -> dict:
    import pybullet_data

    out = {"iiwa (7 DoF)": diffmech.load_urdf(os.path.join(pybullet_data.getDataPath(), "kuka_iiwa/model.urdf"))}
    out["laikago (18 DoF, floating)"] = diffmech.load_urdf(
        os.path.join(pybullet_data.getDataPath(), "laikago/laikago_toes.urdf"), floating_base=True)
    try:
        import gymnasium

        xml = os.path.join(os.path.dirname(gymnasium.__file__), "envs/mujoco/assets/humanoid.xml")
        out["humanoid (27 DoF, floating)"] = diffmech.load_mjcf(xml)
    except ImportError:
        pass
    return {k: m.to(torch.float64) for k, m in out.items()}


@contextlib.contextmanager
def _route(name: str):
    """Force ``name`` (see the module docstring) for the calls inside."""
    saved = (kernels.set_native("never"), _jacobian.JACOBIAN_MAX_BATCH, _jacobian.JACOBIAN_MAX_WORK,
             _local.ABA_MATRIX_MAX_BATCH, _world.set_eager_frame("local"))
    try:
        if name in ("native", "picked"):
            kernels.set_native("build")
        _jacobian.JACOBIAN_MAX_BATCH = 1 << 30 if name == "crba jacobian" else 0
        _jacobian.JACOBIAN_MAX_WORK = 1 << 40 if name == "crba jacobian" else 0
        _local.ABA_MATRIX_MAX_BATCH = 1 << 30 if name == "aba small" else 0
        if name.endswith("world"):
            _world.set_eager_frame("world")
        if name == "picked":  # the library's own thresholds
            _jacobian.JACOBIAN_MAX_BATCH, _jacobian.JACOBIAN_MAX_WORK = saved[1], saved[2]
            _local.ABA_MATRIX_MAX_BATCH = saved[3]
        yield "auto" if name in ("native", "picked") else name.split()[0]
    finally:
        kernels.set_native(saved[0])
        _jacobian.JACOBIAN_MAX_BATCH, _jacobian.JACOBIAN_MAX_WORK = saved[1], saved[2]
        _local.ABA_MATRIX_MAX_BATCH = saved[3]
        _world.set_eager_frame(saved[4])


def _applies(route: str, B: int) -> bool:
    return not (route in ("aba small", "crba jacobian") and B > SMALL_MAX)


def _call(robot, method: str, q, v, tau, grad: bool):
    if not grad:
        with torch.no_grad():
            return robot.forward_dynamics(q, v, tau, method=method)
    qdd = robot.forward_dynamics(q, v, tau, method=method)
    qdd.square().sum().backward()
    return qdd


def _time(robot, route: str, state, grad: bool, budget: float) -> float:
    """Seconds per call: the fastest of a few repetitions, each long enough to average the timer out."""
    with _route(route) as method:
        _call(robot, method, *state, grad)  # builds kernels, warms caches
        reps, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 0.05 or reps < 3:
            _call(robot, method, *state, grad)
            reps += 1
        per = (time.perf_counter() - t0) / reps
        n = max(1, int(budget / 3 / max(per, 1e-7)))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                _call(robot, method, *state, grad)
            best = min(best, (time.perf_counter() - t0) / n)
    return best


def _state(robot, B: int, grad: bool, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(B, generator=g)
    v = torch.randn(B, robot.nv, dtype=torch.float64, generator=g)
    tau = torch.randn(B, robot.nv, dtype=torch.float64, generator=g)
    return tuple(x.requires_grad_(grad) for x in (q, v, tau))


def run(batches, rounds: int, budget: float) -> dict:
    torch.set_num_threads(2)
    rows = []
    robots = _robots()
    from tqdm.auto import tqdm

    todo = [(name, B, grad) for name in robots for B in batches for grad in (False, True)]
    for name, B, grad in tqdm(todo, desc="fd routes"):
        robot = robots[name]
        state = _state(robot, B, grad)
        routes = ["picked"] + [r for r in ROUTES if _applies(r, B)]
        ref = None
        with torch.no_grad():
            with _route("crba"):
                ref = robot.forward_dynamics(*[x.detach() for x in state], method="crba")
        best = {r: float("inf") for r in routes}
        err = {}
        for k in range(rounds):
            for r in (routes if k % 2 == 0 else routes[::-1]):
                best[r] = min(best[r], _time(robot, r, state, grad, budget))
        for r in routes:
            with _route(r) as method, torch.no_grad():
                err[r] = float((robot.forward_dynamics(*[x.detach() for x in state], method=method) - ref).abs().max())
        fastest = min(best.values())
        rows.append({"robot": name, "batch": B, "mode": "value+grad" if grad else "value",
                     "seconds": best, "relative": {r: t / fastest for r, t in best.items()},
                     "max_abs_diff_vs_crba": err})
    return {"rows": rows, "routes": ["picked", *ROUTES]}


def section(rep: dict) -> str:
    lines = [MARK_START, "### Forward-dynamics routes (`benchmarks/bench_fd_routes.py`)", "",
             f"_`python benchmarks/bench_fd_routes.py{rep['args']}` on {rep['date']} ({rep['wall_s']:.0f} s), "
             f"{rep['machine']['cpu']}, {rep['machine']['cores']} cores shared with other jobs, torch 2 threads, "
             f"float64, commit {rep['machine']['commit']}; load average at the start "
             f"{' / '.join(f'{x:.1f}' for x in rep['load_before'])}. Time of each route relative to the fastest "
             f"route of its row (1.00 = fastest; `-` = not defined at that batch); `picked` is what "
             f"`forward_dynamics` chooses with kernels built._", "",
             "| robot | batch | mode | " + " | ".join(rep["routes"]) + " |",
             "|---|---:|---|" + "---:|" * len(rep["routes"])]
    for row in rep["rows"]:
        cells = [f"{row['relative'][r]:.2f}" if r in row["relative"] else "-" for r in rep["routes"]]
        lines.append(f"| {row['robot']} | {row['batch']} | {row['mode']} | " + " | ".join(cells) + " |")
    if rep.get("summary"):
        lines += ["", *rep["summary"]]
    lines.append(MARK_END)
    return "\n".join(lines)


def summarise(rep: dict) -> list[str]:
    """Per torch route: the rows where it is the fastest torch route by 1.5x or more over the next one."""
    torch_routes = [r for r in ROUTES if r != "native"]
    out = []
    for r in torch_routes:
        wins = []
        for row in rep["rows"]:
            rel = {k: v for k, v in row["seconds"].items() if k in torch_routes}
            if r not in rel:
                continue
            others = [v for k, v in rel.items() if k != r]
            if others and rel[r] * 1.5 <= min(others):
                wins.append(f"{row['robot'].split()[0]} B={row['batch']} {row['mode']} "
                            f"({min(others) / rel[r]:.1f}x)")
        out.append(f"- `{r}` wins among the torch routes by >= 1.5x at: " + ("; ".join(wins) if wins else "none"))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="batches 1 and 64, one round (a smoke test)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--budget", type=float, default=0.15, help="seconds per timed block")
    p.add_argument("--json", default=os.path.join(HERE, "results", "fd_routes.json"))
    p.add_argument("--markdown", default=os.path.join(ROOT, "BENCHMARKS.md"), help="'none' to skip")
    a = p.parse_args(argv)
    t0, load = time.perf_counter(), os.getloadavg()
    batches = (1, 64) if a.quick else (1, 8, 64, 1024)
    rep = run(batches, 1 if a.quick else a.rounds, a.budget)
    rep["machine"] = machine(ROOT, 2, ["src", "benchmarks/bench_fd_routes.py"])
    rep["date"] = rep["machine"].get("date", time.strftime("%Y-%m-%d"))
    stamp(rep, argv=argv, json_path=a.json, root=ROOT, load_before=load, t_start=t0)
    rep["summary"] = summarise(rep)
    for s in rep["summary"]:
        print(s)
    md = None if a.markdown == "none" else a.markdown
    publish(rep, a.json, md, section,
            lambda path, text: replace_section(path, text, MARK_START, MARK_END, "## Where users call the core"))


if __name__ == "__main__":
    main()
