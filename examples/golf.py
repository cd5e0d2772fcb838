"""Hitting a golf ball to a target: gradient iterations through the contact rollout vs CMA-ES.

The linkage of ``diffmech.sim.scenes.golf`` (an arm and a club, in its downswing) strikes a ball
(radius 2.5 cm, 0.5 kg, restitution 0.5) lying on the ground. Find the joint torques over the
swing that send the ball to land ``--target`` (3 m) away along ``+x``:

* controls: ``--knots`` values per joint (shoulder, wrist), ``u (knots, 2)``, linearly interpolated
  over the ``T = --horizon / --dt`` steps and scaled by 10 N m (by default one knot per step:
  the seed's ``T x 2`` torque sequence); the scene's joint forces are these torques (the ball
  gets none). Both optimisers start from ``u = 0``, no torque: the club's own
  swing then drives the ball about 1.2 m;
* objective: ``(x_land - target)^2`` (m^2), where ``x_land`` is where the ball comes down to the
  ground, ``x + vx t*`` with ``t*`` the time its centre takes to fall back to its radius from the
  state at the end of the horizon (free flight, the ball is in the air by then; the simulator's
  semi-implicit Euler flight, so the simulated ball lands there too: checked at the end by
  simulating on). The landing point is smooth in the launch state, unlike the position after
  bounces and rolling;
* gradient method (``--method``): Newton's method on the residual ``x_land(u) - target`` (the
  least-norm step, its length limited by a radius that grows after a step that lowers the loss
  and shrinks after one that does not, which is then taken back), or Adam on the loss; the
  gradient ``dx_land/du`` from ``backward()`` through ``diffmech.sim.rollout`` (checkpointed
  adjoint); at most ``--iterations`` (50, the seed's count), stopping at ``|x_land - target| <
  --tol``;
* CMA-ES (``cmaes``): the same objective over ``u`` with the same budget of simulated steps: a
  gradient iteration counts ``2 T`` (the forward steps and the steps recomputed in the backward
  pass), a CMA-ES candidate ``T``; the budget is what ``--iterations`` gradient iterations may use,
  whether or not the gradient method stops earlier. Each generation's candidates are simulated
  as one batch without a graph. ``--cmaes-budget K`` gives it ``K`` times that budget.

Writes ``results.json`` and ``golf.png`` (loss vs iterations and vs wall-clock time, both methods)
to ``--out`` (default ``results/golf``). Run::

    python examples/golf.py                          # 2 minutes on 2 busy cores
    python examples/golf.py --knots 8 --cmaes-budget 15   # 16 controls; CMA-ES with 15x the steps
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch

from diffmech.sim import rollout, scenes
from diffmech.spatial import quat_to_matrix

G = 9.81
TORQUE_SCALE = 10.0  # N m per unit of u
RADIUS = 0.025  # the ball's, m


class Golf:
    """The scene, the controls -> torques map and the objective, for one or a batch of ``u``."""

    def __init__(self, horizon: float, dt: float, knots: int, target: float):
        self.scene, self.q0, self.v0 = scenes.golf()
        self.T, self.dt, self.knots, self.target = round(horizon / dt), dt, knots, target
        if knots < 2 or self.T < 2:
            raise SystemExit(f"golf: need at least 2 knots and 2 steps, got {knots}, {self.T}")
        t = torch.linspace(0, knots - 1, self.T, dtype=torch.float64)
        self.i0 = t.floor().long().clamp(max=knots - 2)
        self.w = (t - self.i0)[:, None]
        self.qb = self.scene.slices["ball"].start
        self.vb = self.scene.vslices["ball"].start

    def torques(self, u: torch.Tensor) -> torch.Tensor:
        """``u (..., knots, 2) -> (..., T, nv)``: joint torques, none on the ball."""
        club = (1 - self.w) * u[..., self.i0, :] + self.w * u[..., self.i0 + 1, :]
        rest = club.new_zeros(*club.shape[:-1], self.scene.nv - 2)
        return torch.cat([TORQUE_SCALE * club, rest], -1)

    def landing(self, q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Where the ball comes down, from its state ``q (..., nq), v (..., nv)`` in free flight."""
        b, vb = self.qb, self.vb
        # a floating base's linear velocity is in its own frame: turn it into the world's
        vw = (quat_to_matrix(q[..., b + 3:b + 7]) @ v[..., vb:vb + 3, None])[..., 0]
        height = (q[..., b + 2] - RADIUS).clamp_min(0.0)
        # The simulator's free flight is semi-implicit Euler: after n steps the height is
        # z + n dt (vz - g dt / 2) - g (n dt)^2 / 2, the parabola with vz - g dt / 2 for vz (the
        # ball comes down 2 to 3 mm earlier than on the exact parabola at this dt). 1e-12 keeps
        # the square root differentiable for a ball at rest on the ground.
        vz = vw[..., 2] - G * self.dt / 2
        t_fall = (vz + torch.sqrt(vz**2 + 2 * G * height + 1e-12)) / G
        return q[..., b] + vw[..., 0] * t_fall

    def simulate_landing(self, u: torch.Tensor) -> dict:
        """Roll on past the horizon (no torque) until the ball first touches the ground: where the
        simulation puts the landing, to check the extrapolated ``x_land``. ``u (knots, 2)``."""
        with torch.no_grad():
            qs, vs = rollout(self.scene, self.q0, self.v0, self.torques(u), self.dt)
            b, vb = self.qb, self.vb
            vw = quat_to_matrix(qs[-1, b + 3:b + 7]) @ vs[-1, vb:vb + 3]
            t_fall = (vw[2] + torch.sqrt(vw[2] ** 2 + 2 * G * (qs[-1, b + 2] - RADIUS).clamp_min(0.0))) / G
            n_extra = round(float(t_fall) / self.dt) + 10
            more = rollout(self.scene, qs[-1], vs[-1], torch.zeros(n_extra, self.scene.nv, dtype=torch.float64),
                           self.dt)[0]
        qs = torch.cat([qs, more[1:]])
        # the ground's impulse turns the ball's fall around within a step (the contact is resolved
        # before the ball reaches the ground): the first step whose vertical displacement grows
        # by more than gravity allows is the landing
        dz = qs[self.T:, self.qb + 2].diff()
        kick = (dz.diff() > -G * self.dt**2 + 1e-9).nonzero()
        if len(kick) == 0:
            return {"landed": False}
        k = self.T + int(kick[0, 0]) + 1  # the state before the step in which the ball lands
        # it lands within that step, in flight at the horizontal speed of the steps before (the
        # state after the step is no bound: friction with the ground slows the ball within it)
        x0, x1 = float(qs[k, self.qb]), float(2 * qs[k, self.qb] - qs[k - 1, self.qb])
        return {"landed": True, "time_s": k * self.dt, "x_before_m": x0, "x_after_m": x1}

    def __call__(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``u (..., knots, 2) -> (loss (...), x_land (...))``."""
        qs, vs = rollout(self.scene, self.q0, self.v0, self.torques(u), self.dt)
        x = self.landing(qs[..., -1, :], vs[..., -1, :])
        return (x - self.target) ** 2, x


def run_gradient(task: Golf, iterations: int, method: str, lr: float, radius: float, tol: float) -> list[dict]:
    """``method="newton"``: Newton's method on the residual ``r(u) = x_land(u) - target`` (one
    equation, ``n`` unknowns): the least-norm step ``-r g / |g|^2`` with ``g = dx_land/du``, at most
    ``radius`` long (RMS over the controls); a step that does not lower the loss is taken back and
    the radius quartered, one that does doubles it. ``"adam"``: Adam on the loss with cosine decay."""
    u = torch.zeros(task.knots, 2, dtype=torch.float64)
    n = u.numel()
    opt = sched = None
    if method == "adam":
        u.requires_grad_()
        opt = torch.optim.Adam([u], lr=lr)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, iterations)
    log, t0, steps = [], time.perf_counter(), 0
    best = None  # (loss, r, u, g) of the accepted point (newton), (loss, -, u, -) of the best (adam)
    for it in range(iterations):
        if method == "adam":
            opt.zero_grad()
            loss, x = task(u)
            loss.backward()
        else:
            ur = u.clone().requires_grad_()
            loss, x = task(ur)
            (g,) = torch.autograd.grad(x, ur)
        steps += 2 * task.T
        loss_f, x_f = float(loss.detach()), float(x.detach())
        entry = {"iteration": it + 1, "loss": loss_f, "x_land": x_f, "wall_s": time.perf_counter() - t0,
                 "steps": steps}
        if method == "newton":
            accepted = best is None or loss_f < best[0]
            if accepted:
                best = (loss_f, x_f - task.target, u.clone(), g)
                radius *= 1.0 if it == 0 else 2.0
            else:
                radius /= 4.0
            entry.update(accepted=accepted, radius=radius)
        elif best is None or loss_f < best[0]:
            best = (loss_f, None, u.detach().clone(), None)
        entry["best_loss"] = best[0]
        log.append(entry)
        print(f"gradient ({method}) iteration {it + 1}/{iterations}: x_land {x_f:.4f} m, loss {loss_f:.3e}, "
              f"{entry['wall_s']:.1f} s" + ("" if entry.get("accepted", True) else " (step taken back)"), flush=True)
        if best[0] < tol**2 or it == iterations - 1:
            break
        if method == "adam":
            opt.step()
            sched.step()
        else:
            _, r, u0, g0 = best
            du = -r * g0 / (g0 * g0).sum().clamp_min(1e-30)
            rms = float(du.norm()) / n**0.5
            u = u0 + du * min(1.0, radius / max(rms, 1e-30))
    log[-1]["u"] = best[2].tolist()  # the best controls found
    return log


def run_cmaes(task: Golf, budget: int, sigma: float, seed: int) -> list[dict]:
    import cmaes
    import numpy as np

    n = task.knots * 2
    opt = cmaes.CMA(mean=np.zeros(n), sigma=sigma, seed=seed)
    log, t0, steps, evals = [], time.perf_counter(), 0, 0
    best = (float("inf"), None, None)
    while steps + task.T * opt.population_size <= budget:
        zs = [opt.ask() for _ in range(opt.population_size)]
        u = torch.tensor(np.stack(zs), dtype=torch.float64).reshape(len(zs), task.knots, 2)
        with torch.no_grad():
            loss, x = task(u)
        losses = [float(v) if math.isfinite(float(v)) else 1e10 for v in loss]
        opt.tell(list(zip(zs, losses)))
        steps += task.T * len(zs)
        evals += len(zs)
        i = min(range(len(zs)), key=losses.__getitem__)
        if losses[i] < best[0]:
            best = (losses[i], float(x[i]), zs[i].tolist())
        log.append({"generation": opt.generation, "evaluations": evals, "loss": best[0], "x_land": best[1],
                    "wall_s": time.perf_counter() - t0, "steps": steps})
        print(f"CMA-ES generation {opt.generation}: {evals} evaluations, {steps}/{budget} steps, best x_land "
              f"{best[1]:.4f} m, loss {best[0]:.3e}, {log[-1]['wall_s']:.1f} s", flush=True)
    if log:
        log[-1]["u"] = torch.tensor(best[2]).reshape(task.knots, 2).tolist()
    return log


def plot(path: str, grad_log: list[dict], cma_log: list[dict], title: str, method: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    series = ((grad_log, "iteration", f"gradient ({method}, best so far)", "o-"),
              (cma_log, "evaluations", "CMA-ES (best so far)", ".-"))
    for log, key, label, style in series:
        if not log:
            continue
        loss = [max(e.get("best_loss", e["loss"]), 1e-16) for e in log]
        ax[0].semilogy([e[key] for e in log], loss, style, label=label, ms=3)
        ax[1].semilogy([e["wall_s"] for e in log], loss, style, label=label, ms=3)
    ax[0].set_xlabel("iterations (gradient: rollout + backward; CMA-ES: candidate rollouts)")
    ax[1].set_xlabel("wall-clock time, s")
    for a in ax:
        a.set_ylabel("(x_land - target)^2, m^2")
        a.grid(True, alpha=0.3)
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", type=float, default=3.0, help="where the ball should land, m along +x")
    ap.add_argument("--horizon", type=float, default=0.2,
                    help="simulated time, s (the ball must be in flight by then)")
    ap.add_argument("--dt", type=float, default=2e-3)
    ap.add_argument("--knots", type=int, default=0,
                    help="torque knots per joint (default 0: one per step, the seed's n x k torques)")
    ap.add_argument("--iterations", type=int, default=50, help="most gradient iterations (the seed: 50)")
    ap.add_argument("--method", choices=("newton", "adam"), default="newton", help="gradient method")
    ap.add_argument("--tol", type=float, default=1e-4, help="newton/adam stop when |x_land - target| < tol, m")
    ap.add_argument("--radius", type=float, default=0.5, help="newton's first step length (RMS of u)")
    ap.add_argument("--lr", type=float, default=0.05, help="adam's initial learning rate, in units of u")
    ap.add_argument("--sigma", type=float, default=0.5, help="CMA-ES initial step size, in units of u")
    ap.add_argument("--cmaes-budget", type=float, default=1.0,
                    help="CMA-ES budget as a multiple of the gradient method's simulated steps")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (one robot per batch: 1 is fastest)")
    ap.add_argument("--out", default=os.path.join("results", "golf"))
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    steps = round(args.horizon / args.dt)
    task = Golf(args.horizon, args.dt, args.knots or steps, args.target)

    grad_log = run_gradient(task, args.iterations, args.method, args.lr, args.radius, args.tol)
    # CMA-ES gets what the gradient method was allowed (--iterations), used or not
    budget = 2 * task.T * args.iterations
    cma_log = run_cmaes(task, int(args.cmaes_budget * budget), args.sigma, args.seed)

    best_grad = min(grad_log, key=lambda e: e["loss"])
    best_cma = cma_log[-1] if cma_log else {"loss": float("inf"), "x_land": None, "evaluations": 0}
    out = {"target_m": args.target, "horizon_s": args.horizon, "dt": args.dt, "steps_per_rollout": task.T,
           "knots": task.knots, "controls": 2 * task.knots, "torque_scale_Nm": TORQUE_SCALE,
           "method": args.method, "tol_m": args.tol, "radius": args.radius, "lr": args.lr, "sigma": args.sigma,
           "seed": args.seed, "threads": args.threads,
           "budget_steps": budget, "cmaes_budget_steps": int(args.cmaes_budget * budget),
           "gradient": grad_log, "cmaes": cma_log,
           "gradient_final": {k: grad_log[-1][k] for k in ("iteration", "loss", "x_land", "wall_s", "steps")},
           "gradient_best": {k: best_grad[k] for k in ("iteration", "loss", "x_land", "wall_s")},
           "cmaes_best": {k: best_cma.get(k) for k in ("evaluations", "loss", "x_land", "wall_s", "steps")},
           "x_land_at_zero_torque": grad_log[0]["x_land"]}
    # the extrapolated landing against the simulated one (the ball's first touch of the ground)
    for key, log in (("gradient_best", grad_log), ("cmaes_best", cma_log)):
        if log:
            out[key]["simulated_landing"] = task.simulate_landing(torch.tensor(log[-1]["u"], dtype=torch.float64))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    plot(os.path.join(args.out, "golf.png"), grad_log, cma_log,
         f"golf: ball to land at x = {args.target:g} m; {task.T} steps of {args.dt:g} s per rollout, "
         f"{2 * task.knots} controls", args.method)
    g = best_grad
    print(f"gradient: lands at {g['x_land']:.4f} m (loss {g['loss']:.2e}) after {len(grad_log)} iterations, "
          f"{g['wall_s']:.0f} s; CMA-ES: best lands at {best_cma['x_land'] if cma_log else float('nan'):.4f} m "
          f"(loss {best_cma['loss']:.2e}) after {best_cma['evaluations']} evaluations with "
          f"{out['cmaes_budget_steps']} simulated steps -> {args.out}")
    return out


if __name__ == "__main__":
    main()
