"""Friction estimation with a braked car: gradient iterations through the contact rollout vs CMA-ES.

The car of ``diffmech.sim.scenes.racecar`` (wheels locked) starts at 1 m/s along ``+x`` and slides
to a halt on the ground. Find the friction coefficient ``mu`` for which it is at ``x = --target``
(0.8 m) after ``--horizon`` (1 s) at ``dt = 1e-3``:

* gradient method: Newton on the residual ``r(mu) = x(T; mu) - target``, ``mu <- mu - r / (dx/dmu)``,
  with ``dx/dmu`` from ``loss.backward()`` through ``diffmech.sim.rollout`` (checkpointed adjoint);
  at most ``--iterations`` (10) iterations, stopping when ``|r| < 1e-6`` m;
* CMA-ES (``cmaes``): minimises ``r^2`` over ``mu`` in ``[0, 1]`` with the same budget of simulated
  steps: a gradient iteration counts ``2 T`` (the forward steps and the recomputed steps of the
  backward pass), a CMA-ES candidate ``T``;
* the analytic answer for a sliding car: ``x(T) = v0 T - mu g dt^2 N (N + 1) / 2`` (semi-implicit
  Euler, ``N = T / dt`` steps; ``v0 T - mu g T^2 / 2`` in continuous time) while it still slides.

Writes ``results.json`` and ``racecar_friction.png`` (loss vs iterations and vs wall-clock time) to
``--out`` (default ``results/racecar_friction``). Run::

    python examples/racecar_friction.py                       # several minutes on 2 busy cores
    python examples/racecar_friction.py --horizon 0.3 --target 0.25
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
from tqdm.auto import tqdm

from diffmech.sim import rollout, scenes

G = 9.81


def final_x(mu: torch.Tensor, T: int, dt: float) -> torch.Tensor:
    scene, q0, v0 = scenes.racecar(mu)
    qs, _ = rollout(scene, q0, v0, torch.zeros(T, scene.nv, dtype=torch.float64), dt)
    return qs[-1, 0]


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=float, default=0.8, help="x at the end of the horizon, m")
    ap.add_argument("--horizon", type=float, default=1.0, help="s")
    ap.add_argument("--dt", type=float, default=1e-3)
    ap.add_argument("--mu0", type=float, default=0.002, help="initial guess (the seed's scene value)")
    ap.add_argument("--iterations", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="results/racecar_friction")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    T = round(args.horizon / args.dt)
    N = T
    mu_analytic = 2 * (1.0 * args.horizon - args.target) / (G * args.dt**2 * N * (N + 1))
    mu_continuous = 2 * (1.0 * args.horizon - args.target) / (G * args.horizon**2)

    grad_log, t0, steps = [], time.perf_counter(), 0
    mu = torch.tensor(args.mu0, dtype=torch.float64)
    for it in tqdm(range(args.iterations), desc="gradient", disable=None):
        m = mu.clone().requires_grad_()
        x = final_x(m, T, args.dt)
        r = x - args.target
        (g,) = torch.autograd.grad(x, m)
        steps += 2 * T
        grad_log.append({"iteration": it, "mu": float(m.detach()), "loss": float(r.detach()) ** 2,
                         "wall_s": time.perf_counter() - t0, "steps": steps})
        if abs(float(r.detach())) < 1e-6:
            break
        mu = (m - r / g).detach().clamp_min(0.0)
    budget = steps

    import cmaes
    import numpy as np

    opt = cmaes.CMA(mean=np.array([args.mu0]), sigma=0.05, bounds=np.array([[0.0, 1.0]]), seed=args.seed)
    cma_log, t0, steps, best = [], time.perf_counter(), 0, (float("inf"), None)
    bar = tqdm(total=budget, desc="CMA-ES", disable=None)
    while steps + T * opt.population_size <= budget:
        sols = []
        with torch.no_grad():
            for _ in range(opt.population_size):
                z = opt.ask()
                loss = (float(final_x(torch.tensor(z[0], dtype=torch.float64), T, args.dt)) - args.target) ** 2
                sols.append((z, loss))
                steps += T
                bar.update(T)
                best = min(best, (loss, float(z[0])))
        opt.tell(sols)
        cma_log.append({"generation": opt.generation, "mu": best[1], "loss": best[0],
                        "wall_s": time.perf_counter() - t0, "steps": steps})
    bar.close()
    out = {"target_m": args.target, "horizon_s": args.horizon, "dt": args.dt, "mu_analytic_discrete": mu_analytic,
           "mu_analytic_continuous": mu_continuous, "gradient": grad_log, "cmaes": cma_log,
           "gradient_mu": grad_log[-1]["mu"], "gradient_iterations": len(grad_log),
           "cmaes_mu": best[1], "budget_steps": budget}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=2)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    for log, label in ((grad_log, "gradient (Newton on the residual)"), (cma_log, "CMA-ES (best so far)")):
        if not log:
            continue
        loss = [max(e["loss"], 1e-16) for e in log]
        ax[0].semilogy([e["steps"] for e in log], loss, "o-", label=label)
        ax[1].semilogy([e["wall_s"] for e in log], loss, "o-", label=label)
    ax[0].set_xlabel("simulated steps (gradient: forward + recomputed)")
    ax[1].set_xlabel("wall-clock time, s")
    for a in ax:
        a.set_ylabel("(x(T) - target)^2, m^2")
        a.grid(True, alpha=0.3)
        a.legend()
    fig.suptitle(f"braked car: mu for x({args.horizon:g} s) = {args.target:g} m; analytic {mu_analytic:.5f}")
    fig.tight_layout()
    fig.savefig(os.path.join(args.out, "racecar_friction.png"), dpi=120)
    print(f"gradient: mu = {out['gradient_mu']:.6f} after {out['gradient_iterations']} iterations; "
          f"CMA-ES: mu = {best[1]:.6f} (loss {best[0]:.2e}) with the same {budget} simulated steps; "
          f"analytic (discrete) {mu_analytic:.6f}, continuous time {mu_continuous:.6f}")
    return out


if __name__ == "__main__":
    main()
