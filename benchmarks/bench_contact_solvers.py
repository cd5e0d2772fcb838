"""The two contact solvers side by side: ``Scene(solver="pgs")`` (the hard problem, projected
Gauss-Seidel, gradient with the contact modes fixed) and ``Scene(solver="smooth")`` (the relaxed
problem by Newton's method from the PGS solution, implicit gradient), on the same scenes, one run,
float64, one thread:

- accuracy: a ball dropped from 0.3 m (penetration and speed after 1.5 s), a box sliding at 1 m/s
  (stopping distance against the discrete closed form ``v0^2 / (2 mu g) - v0 dt / 2``), a stack of
  three boxes (drift over 3 s), the laikago standing 0.5 s (base drift);
- time: forward and forward + backward (checkpointed adjoint) ms per step on each scene;
- gradient across a contact-mode change: a box pushed below its static friction, d(final x)/d(push)
  (zero for the hard model, where the box sticks; the smooth one creeps) and the same gradient
  against central differences of the smooth rollout.

Writes ``benchmarks/results/contact_solvers.json`` and a section of BENCHMARKS.md.

    python benchmarks/bench_contact_solvers.py          # about 3 minutes on 2 busy cores
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _machine import machine  # noqa: E402
from _markdown import replace_section  # noqa: E402
from diffmech.model import systems  # noqa: E402
from diffmech.sim import Scene, rollout, scenes  # noqa: E402

MARK_START, MARK_END = "<!-- bench_contact_solvers:start -->", "<!-- bench_contact_solvers:end -->"
f64 = dict(dtype=torch.float64)
G = 9.81


def _free(scene: Scene, **place) -> torch.Tensor:
    q0 = scene.neutral_configuration()
    for name, xyz in place.items():
        q0[scene.slices[name].start:scene.slices[name].start + 3] = torch.tensor(xyz, **f64)
    return q0


def ball(solver):
    s = Scene({"ball": systems.sphere(0.1, 1.0)}, solver=solver)
    return s, _free(s, ball=(0, 0, 0.3)), torch.zeros(s.nv, **f64), 1e-2, 150


def box(solver, mu=0.4):
    s = Scene({"box": systems.box(size=(0.2, 0.2, 0.1), mass=1.0)}, solver=solver, friction=mu)
    v0 = torch.zeros(s.nv, **f64)
    v0[0] = 1.0
    return s, _free(s, box=(0, 0, 0.05)), v0, 1e-2, 100


def stack(solver):
    boxes = {f"b{i}": systems.box((0.3, 0.3, 0.2), 1.0, name=f"b{i}") for i in range(3)}
    s = Scene(boxes, friction=0.8, solver=solver)
    return s, _free(s, b0=(0, 0, 0.1), b1=(0, 0, 0.3), b2=(0, 0, 0.5)), torch.zeros(s.nv, **f64), 1e-2, 300


def laikago(solver):
    s, q0, v0 = scenes.laikago(1)
    s.solver = solver
    return s, q0.reshape(-1, s.nq)[0], v0.reshape(-1, s.nv)[0], 1e-3, 500


SCENES = {"ball drop": ball, "sliding box": box, "stack of three boxes": stack, "laikago standing": laikago}


def accuracy(name, Q, V, dt) -> dict:
    if name == "ball drop":
        return {"penetration_m": max(0.0, 0.1 - float(Q[-1, 2])), "final_speed_m_s": float(V[-1].norm())}
    if name == "sliding box":
        want = 1.0 / (2 * 0.4 * G) - 0.5 * dt
        return {"stop_m": float(Q[-1, 0]), "closed_form_m": want, "rel_error": abs(float(Q[-1, 0]) - want) / want}
    if name == "stack of three boxes":
        z = Q[:, [2, 9, 16]]
        return {"max_drift_m": float((z - z[0]).abs().max())}
    return {"base_drift_m": float((Q[-1, :3] - Q[0, :3]).norm())}


def timed(name, solver, repeats):
    out = {}
    fwd, both = [], []
    for _ in range(repeats):
        scene, q0, v0, dt, T = SCENES[name](solver)
        tau = torch.zeros(T, scene.nv, **f64, requires_grad=True)
        t0 = time.perf_counter()
        with torch.no_grad():
            Q, V = rollout(scene, q0, v0, tau.detach(), dt)
        fwd.append((time.perf_counter() - t0) / T * 1e3)
        t0 = time.perf_counter()
        Qg, _ = rollout(scene, q0, v0, tau, dt)
        Qg[-1, :3].sum().backward()
        both.append((time.perf_counter() - t0) / T * 1e3)
    out.update(forward_ms_per_step=min(fwd), fwd_bwd_ms_per_step=min(both), steps=T, dt=dt)
    out.update(accuracy(name, Q, V, dt))
    return out


def push_gradient(solver, push: float, eps: float = 1e-6) -> dict:
    def final_x(p):
        s = Scene({"box": systems.box(size=(0.2, 0.2, 0.1), mass=1.0)}, solver=solver, friction=0.5,
                  friction_smoothing=1e-2)
        tau = torch.zeros(30, 6, **f64)
        tau[:, 0] = 1.0
        Q, _ = rollout(s, _free(s, box=(0, 0, 0.05)), torch.zeros(6, **f64), tau * p, 1e-2)
        return Q[-1, 0]

    p = torch.tensor(push, **f64, requires_grad=True)
    (g,) = torch.autograd.grad(final_x(p), p)
    with torch.no_grad():
        fd = (final_x(torch.tensor(push + eps, **f64)) - final_x(torch.tensor(push - eps, **f64))) / (2 * eps)
    return {"push_N": push, "grad": float(g), "central_difference": float(fd)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--no-write", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_start = time.time()
    rows = []
    for name in SCENES:
        for solver in ("pgs", "smooth"):
            r = {"scene": name, "solver": solver, **timed(name, solver, args.repeats)}
            rows.append(r)
            print(json.dumps(r))
    grads = [{"solver": s, **push_gradient(s, push)} for s in ("pgs", "smooth") for push in (2.0, 4.0)]
    for g in grads:
        print(json.dumps(g))
    result = {"machine": machine(ROOT, 1, ["src", "benchmarks"]), "wall_s": time.time() - t_start,
              "load_avg": os.getloadavg(), "scenes": rows, "push_gradients": grads}
    if args.no_write:
        return
    os.makedirs(os.path.join(ROOT, "benchmarks", "results"), exist_ok=True)
    with open(os.path.join(ROOT, "benchmarks", "results", "contact_solvers.json"), "w") as f:
        json.dump(result, f, indent=1)
    m = result["machine"]
    lines = [MARK_START, "## Contact solvers: PGS vs smooth", "",
             f"_Generated by `python benchmarks/bench_contact_solvers.py` ({result['wall_s']:.0f} s); {m['cpu']}, "
             f"{m['cores']} cores shared with other jobs (load {result['load_avg'][0]:.1f}), torch {m['torch']}, "
             f"one thread, commit {m.get('commit', '')}; float64, best of {args.repeats}._", "",
             "`pgs`: the hard problem by projected Gauss-Seidel (C sweeps), gradient by the implicit function "
             "theorem with the contact modes fixed. `smooth`: the relaxed problem (kappa 1e-6 J, eps 1e-4 m/s) by "
             "Newton's method from the PGS solution, gradient by `diffmech.implicit`.", "",
             "| scene | solver | steps x dt | forward ms/step | fwd+bwd ms/step | smooth / pgs (fwd+bwd) | accuracy |",
             "|---|---|---|---:|---:|---:|---|"]
    for i, r in enumerate(rows):
        acc = ", ".join(f"{k} {v:.3g}" for k, v in r.items() if k not in
                        ("scene", "solver", "forward_ms_per_step", "fwd_bwd_ms_per_step", "steps", "dt"))
        prev = rows[i - 1]["fwd_bwd_ms_per_step"]
        ratio = f"{r['fwd_bwd_ms_per_step'] / prev:.2f}" if r["solver"] == "smooth" else ""
        lines.append(f"| {r['scene']} | {r['solver']} | {r['steps']} x {r['dt']:g} | {r['forward_ms_per_step']:.2f} | "
                     f"{r['fwd_bwd_ms_per_step']:.2f} | {ratio} | {acc} |")
    fwd = [r["forward_ms_per_step"] / rows[i - 1]["forward_ms_per_step"] for i, r in enumerate(rows)
           if r["solver"] == "smooth"]
    both = [r["fwd_bwd_ms_per_step"] / rows[i - 1]["fwd_bwd_ms_per_step"] for i, r in enumerate(rows)
            if r["solver"] == "smooth"]
    lines += ["", "`base_drift_m` of the laikago is the distance between its first and last base positions, the "
              "settling from the start pose included. Time of `smooth` over `pgs` on these scenes: forward "
              f"{min(fwd):.2f}x to {max(fwd):.2f}x, forward + backward {min(both):.2f}x to {max(both):.2f}x. "
              "Default: `pgs`, the exact (unrelaxed) contact law at the accuracy above; `smooth` where an "
              "optimisation needs gradients across contact changes.", "",
              "Gradient across a mode change: a 1 kg box (mu 0.5, so mu m g = 4.9 N) pushed for 0.3 s by a force "
              "below static friction; d(final x)/d(push), m/N (smooth: friction_smoothing 1e-2 m/s):", "",
              "| solver | push (N) | gradient | central difference |", "|---|---:|---:|---:|"]
    for g in grads:
        lines.append(f"| {g['solver']} | {g['push_N']:g} | {g['grad']:.3e} | {g['central_difference']:.3e} |")
    lines += ["", "Raw data: `benchmarks/results/contact_solvers.json`.", MARK_END]
    replace_section(os.path.join(ROOT, "BENCHMARKS.md"), "\n".join(lines), MARK_START, MARK_END)


if __name__ == "__main__":
    main()
