"""Throwing a ball at a target with the Panda: gradient descent through the contact rollout vs CMA-ES.

The scene is ``diffmech.sim.scenes.panda_throw()``: a 9-DoF Panda holds a 0.05 kg ball (radius 1 cm)
between its finger pads through contact, its arm on joint impedances about a gravity-compensated
pose, so that zero torque holds everything still. The decision variables are the arm torques of
every step, ``u (T, 7)`` (N m, on top of the impedance; ``T = --steps`` at ``dt = --dt``); the
fingers open at step ``--release`` (``scenes.panda_throw_torques``), the ball flies and lands.

Loss: the squared horizontal distance (m^2) between the landing point and ``--target``. The
landing point is found from the simulated flight: at the last step ``k`` after the release where
the ball's centre is still above ``--landing-height`` (10 cm) on its way down, the parabola through
its position and velocity is continued to the height of its radius (the ground): smooth in the
state at ``k``, and continuous when ``k`` moves by a step. A ball that does not come down within
the horizon is continued from the last state.

With ``--torque-limits urdf`` (the default) the torques respect the URDF's effort limits ``e`` (87 N m
on joints 1-4, 12 N m on joints 5-7): the decision variables are ``z (T, 7)`` and the torques
``u = e tanh(z / e)`` (``u = z`` while ``|z| << e``); ``--torque-limits none`` optimises ``u = z``
unbounded.

* gradient descent on ``z`` with the gradient of the landing error (m) through
  ``diffmech.sim.rollout(..., adjoint="checkpoint")``, ``--iterations`` (20) iterations, by
  Polyak's step (the error's least value is 0: ``u <- u - e / |grad e|^2 grad e``, a Newton step on the
  linearised error along the gradient) or, with ``--method adam``, Adam (``--lr`` N m);
* CMA-ES (``cmaes``; the full covariance up to 2000 variables, the diagonal one -- ``SepCMA`` --
  above: the eigendecomposition of a 7000 x 7000 matrix per generation is out of reach) on the
  same ``u`` and loss, each generation's population simulated as one batch, with the same budget of
  simulated steps (times ``--cma-factor``): a gradient iteration counts ``2 T`` (the forward steps
  and the steps recomputed by the backward pass), a CMA-ES candidate ``T``.

Writes ``results.json`` and ``panda_throw.png`` (landing error vs iterations, vs simulated steps and
vs wall-clock time, both methods) to ``--out`` (default ``results/panda_throw``). Run::

    python examples/panda_throw.py                      # T = 150 steps (1.5 s): minutes on 2 busy cores
    python examples/panda_throw.py --steps 1000         # the seed's 1000 x 7 torques (10 s): much longer
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

import torch
from tqdm.auto import tqdm

from diffmech.errors import SimulationError
from diffmech.sim import rollout, scenes
from diffmech.spatial import quat_to_matrix

G = 9.81
DIVERGED = 1e6  # loss of a candidate whose rollout failed (m^2)


def landing_step(qs: torch.Tensor, release: int, height: float) -> torch.Tensor:
    """The step whose state the landing is continued from, ``(...)``: the last before the ball's
    centre first drops below ``height`` after ``release`` (the last step if it never does)."""
    z = qs[..., 11].detach()
    T1 = z.shape[-1]
    below = (z < height) & (torch.arange(T1, device=z.device) > release)
    first = torch.where(below.any(-1), below.int().argmax(-1), torch.full_like(z[..., 0], T1, dtype=torch.long))
    return (first - 1).clamp(min=0)


def landing_point(qs: torch.Tensor, vs: torch.Tensor, release: int, height: float, radius: float) -> torch.Tensor:
    """Where the ball lands, ``(..., 2)`` (x, y), from scene trajectories ``qs (..., T+1, 16)``,
    ``vs (..., T+1, 15)``: the parabola from the last state after ``release`` that is still above
    ``height`` while descending, continued down to ``z = radius``."""
    k = landing_step(qs, release, height)
    idx = k[..., None, None]
    q = torch.gather(qs, -2, idx.expand(*k.shape, 1, qs.shape[-1]))[..., 0, :]
    v = torch.gather(vs, -2, idx.expand(*k.shape, 1, vs.shape[-1]))[..., 0, :]
    quat = q[..., 12:16]
    R = quat_to_matrix(quat / quat.norm(dim=-1, keepdim=True))
    vw = (R @ v[..., 9:12, None])[..., 0]  # the ball's linear velocity in world axes
    p = q[..., 9:12]
    drop = (p[..., 2] - radius).clamp_min(0.0)
    t = (vw[..., 2] + torch.sqrt(vw[..., 2] ** 2 + 2 * G * drop)) / G
    return p[..., :2] + vw[..., :2] * t[..., None]


class Problem:
    """The throw: scene, horizon, release, target; ``loss(u)`` for ``u (..., T, 7)``."""

    def __init__(self, args):
        self.scene, self.q0, self.v0 = scenes.panda_throw()
        self.T, self.dt, self.release = args.steps, args.dt, args.release
        self.height, self.radius = args.landing_height, 0.01
        self.target = torch.tensor(args.target, dtype=torch.float64)
        effort = self.scene.models["panda"].joint_limits()["effort"][:7].detach()
        self.limit = effort if args.torque_limits == "urdf" else None

    def torques(self, z: torch.Tensor) -> torch.Tensor:
        """Arm torques ``u (..., T, 7)`` (N m) from the decision variables ``z``: within the effort
        limits by a smooth saturation, or ``z`` itself without limits."""
        return z if self.limit is None else self.limit * torch.tanh(z / self.limit)

    def rollout(self, z: torch.Tensor):
        tau = scenes.panda_throw_torques(self.torques(z), self.release)
        return rollout(self.scene, self.q0, self.v0, tau, self.dt)

    def loss(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        qs, vs = self.rollout(u)
        land = landing_point(qs, vs, self.release, self.height, self.radius)
        return (land - self.target).square().sum(-1), land


def run_gradient(prob: Problem, args, progress: bool) -> list[dict]:
    u = torch.zeros(prob.T, 7, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([u], lr=args.lr) if args.method == "adam" else None
    log, t0, steps = [], time.perf_counter(), 0
    bar = tqdm(range(args.iterations), desc="gradient", disable=not progress)
    for it in bar:
        loss, land = prob.loss(u)
        err = loss.sqrt()
        (g,) = torch.autograd.grad(err, u)
        steps += 2 * prob.T
        log.append({"iteration": it, "loss": float(loss.detach()), "error_m": float(err.detach()),
                    "landing": land.detach().tolist(), "wall_s": time.perf_counter() - t0, "steps": steps,
                    "max_abs_torque": float(prob.torques(u.detach()).abs().max())})
        bar.set_postfix(error_m=f"{log[-1]['error_m']:.4f}")
        if it == args.iterations - 1:
            return log, u.detach()
        if opt is not None:
            u.grad = g
            opt.step()
        else:  # Polyak's step: the error's minimum is 0, so step by error / |grad|^2 along -grad
            with torch.no_grad():
                u -= args.step * float(err.detach()) / float(g.square().sum().clamp_min(1e-300)) * g
    bar.close()
    return log, u.detach()


def run_cmaes(prob: Problem, args, budget: int, progress: bool) -> tuple[list[dict], dict]:
    import cmaes
    import numpy as np

    n = prob.T * 7
    kind = cmaes.CMA if n <= 2000 else cmaes.SepCMA
    opt = kind(mean=np.zeros(n), sigma=args.sigma, population_size=args.popsize, seed=args.seed)
    log, t0, steps, best = [], time.perf_counter(), 0, float("inf")
    bar = tqdm(total=budget, desc="CMA-ES", disable=not progress)
    while steps + prob.T * opt.population_size <= budget:
        zs = [opt.ask() for _ in range(opt.population_size)]
        u = torch.tensor(np.stack(zs), dtype=torch.float64).reshape(len(zs), prob.T, 7)
        with torch.no_grad():
            try:
                losses = prob.loss(u)[0].tolist()
            except SimulationError:  # a diverged batch: score its members one by one
                losses = []
                for ui in u:
                    try:
                        losses.append(float(prob.loss(ui)[0]))
                    except SimulationError:
                        losses.append(DIVERGED)
        losses = [x if math.isfinite(x) else DIVERGED for x in losses]
        opt.tell(list(zip(zs, losses)))
        steps += prob.T * len(zs)
        bar.update(prob.T * len(zs))
        best = min(best, min(losses))
        log.append({"generation": opt.generation, "loss": best, "error_m": math.sqrt(best),
                    "wall_s": time.perf_counter() - t0, "steps": steps})
        bar.set_postfix(error_m=f"{math.sqrt(best):.4f}")
    bar.close()
    return log, {"variant": kind.__name__, "popsize": opt.population_size, "dimension": n}


def plot(grad_log, cma_log, path, title, grad_label):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 3, figsize=(15, 4))
    for log, label, key in ((grad_log, grad_label, "iteration"), (cma_log, "CMA-ES (best so far)", "generation")):
        if not log:
            continue
        err = [max(e["error_m"], 1e-12) for e in log]
        ax[0].semilogy([e[key] for e in log], err, "o-", ms=3, label=label)
        ax[1].semilogy([e["steps"] for e in log], err, "o-", ms=3, label=label)
        ax[2].semilogy([e["wall_s"] for e in log], err, "o-", ms=3, label=label)
    ax[0].set_xlabel("iteration (gradient) / generation (CMA-ES)")
    ax[1].set_xlabel("simulated steps (gradient: forward + recomputed)")
    ax[2].set_xlabel("wall-clock time, s")
    for a in ax:
        a.set_ylabel("landing error, m")
        a.grid(True, alpha=0.3)
        a.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=150, help="T, steps per rollout (default 150; the seed: 1000)")
    ap.add_argument("--dt", type=float, default=0.01)
    ap.add_argument("--release", type=int, default=40, help="step at which the fingers open (default 40)")
    ap.add_argument("--target", type=float, nargs=2, default=(1.5, 0.5), help="x y on the ground, m")
    ap.add_argument("--landing-height", type=float, default=0.1, help="m (see the loss)")
    ap.add_argument("--iterations", type=int, default=20, help="gradient iterations (default 20)")
    ap.add_argument("--method", choices=("polyak", "adam"), default="polyak",
                    help="gradient descent's step: Polyak's (default) or Adam's")
    ap.add_argument("--step", type=float, default=1.0, help="fraction of Polyak's step (default 1)")
    ap.add_argument("--lr", type=float, default=8.0, help="Adam's step, N m (default 8)")
    ap.add_argument("--popsize", type=int, default=10, help="CMA-ES population (default 10)")
    ap.add_argument("--sigma", type=float, default=2.0, help="CMA-ES initial step, N m (default 2)")
    ap.add_argument("--cma-factor", type=float, default=1.0,
                    help="CMA-ES budget in multiples of the gradient run's simulated steps (default 1)")
    ap.add_argument("--torque-limits", choices=("urdf", "none"), default="urdf",
                    help="bound the arm torques by the URDF's effort limits (smoothly, default) or not")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join("results", "panda_throw"))
    ap.add_argument("--no-progress", action="store_true")
    args = ap.parse_args(argv)
    if not 0 < args.release < args.steps:
        ap.error(f"--release must lie in (0, --steps), got {args.release}")
    torch.set_num_threads(1)  # one robot per rollout: a second thread mostly waits
    progress = not args.no_progress
    prob = Problem(args)

    grad_log, u_best = run_gradient(prob, args, progress)
    with torch.no_grad():  # the last iterate's throw: when the ball lands, how fast it left the hand
        qs, vs = prob.rollout(u_best)
        k = int(landing_step(qs, prob.release, prob.height))
        speed = float(((qs[prob.release + 3:, 9:12] - qs[prob.release + 2:-1, 9:12]) / prob.dt).norm(dim=-1)[0])
    effort = prob.scene.models["panda"].joint_limits()["effort"][:7].tolist()
    budget = int(grad_log[-1]["steps"] * args.cma_factor)
    cma_log, cma_info = run_cmaes(prob, args, budget, progress)
    with torch.no_grad():
        loss0 = float(prob.loss(torch.zeros(prob.T, 7, dtype=torch.float64))[0])
    out = {"T": prob.T, "dt": args.dt, "release_step": args.release, "target": list(args.target),
           "landing_height": args.landing_height, "loss_initial": loss0, "error_initial_m": math.sqrt(loss0),
           "gradient": grad_log, "cmaes": cma_log, "cmaes_info": cma_info,
           "gradient_error_m": min(e["error_m"] for e in grad_log), "gradient_iterations": len(grad_log),
           "gradient_wall_s": grad_log[-1]["wall_s"],
           "cmaes_error_m": min((e["error_m"] for e in cma_log), default=float("nan")),
           "cmaes_generations": len(cma_log), "cmaes_wall_s": cma_log[-1]["wall_s"] if cma_log else 0.0,
           "budget_steps": budget, "gradient_landing_step": k, "gradient_ball_speed_after_release_mps": speed,
           "gradient_max_abs_torque_per_joint": prob.torques(u_best).abs().amax(0).tolist(),
           "urdf_effort_limits": effort, "torque_limits": args.torque_limits}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(out, f, indent=1)
    plot(grad_log, cma_log, os.path.join(args.out, "panda_throw.png"),
         f"Panda throw: landing error vs target {tuple(args.target)} m (T = {prob.T}, dt = {args.dt:g} s)",
         "gradient descent (Polyak step)" if args.method == "polyak" else "gradient descent (Adam)")
    print(f"initial landing error {out['error_initial_m']:.3f} m; gradient descent: {out['gradient_error_m']:.4f} m "
          f"after {out['gradient_iterations']} iterations ({out['gradient_wall_s']:.0f} s); CMA-ES "
          f"({cma_info['variant']}, population {cma_info['popsize']}): {out['cmaes_error_m']:.4f} m after "
          f"{out['cmaes_generations']} generations ({out['cmaes_wall_s']:.0f} s), same {budget} simulated steps; "
          f"the ball lands after step {k}, leaving the hand at {speed:.2f} m/s")
    return out


if __name__ == "__main__":
    main()
