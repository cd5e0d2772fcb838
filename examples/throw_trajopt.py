"""Throwing release with the iiwa: gradient-based trajectory optimisation vs CMA-ES.

Find joint torques over ``T`` steps that bring the end effector (the last link,
``iiwa_link_ee``) to a target position with a target (release) velocity at time ``T dt``, from
rest. Both optimisers minimise the same objective under the same torque parametrisation and the
same budget of simulated steps:

* objective: ``|p(T) - p*|^2 / (5 cm)^2 + |pdot(T) - pdot*|^2 / (0.5 m/s)^2 + 1e-3 mean(u^2)``,
  with ``p = robot.link_pose(q, ee)[:3, 3]`` and ``pdot = (robot.jacobian(q, ee) @ v)[:3]``
  (world-aligned axes); the last term keeps the torques small where the task allows;
* torques: ``tau(t) = g(q0) + s * interp(u)(t)``: the gravity torques of the start pose (so
  ``u = 0`` is "hold still"), plus ``--knots`` values per joint, ``u (knots, 7)``, linearly
  interpolated over the ``T`` steps and scaled by ``s_i = M_ii(q0) * 20 rad/s^2`` (so ``u ~ 1``
  accelerates every joint alike; scaling by the effort limits instead lets the light wrist spin
  up to velocities where the fixed step becomes unstable); ``u`` are the decision variables of
  both optimisers (few enough for CMA-ES, smooth for Adam);
* Adam: gradients through ``diffmech.sim.rollout(..., adjoint="checkpoint")``;
* CMA-ES (``cmaes`` package): each generation's population simulated as one batch (no gradient);
  a candidate whose rollout diverges gets the objective ``1e10``.

Counting the budget (``--budget``, in simulated-step equivalents): a CMA-ES candidate costs
``T`` steps (one robot simulated for ``T`` steps; a batch of ``P`` candidates costs ``P T``). An
Adam iteration costs ``(1 + r) T``, where ``r`` is the backward / forward wall-time ratio of the
checkpointed rollout, measured once on three warm-up gradient evaluations before the run and
then held fixed (reported in the JSON). Both stop at the first iteration that would exceed the
budget. Wall-clock time is measured separately, so the plot against time shows what each method
really costs here: CMA-ES simulates its population as one batch without a graph, which costs far
less time per simulated step than a batch-1 gradient. ``--equal-time`` (default) therefore also
gives CMA-ES a second run with Adam's wall-clock time instead of its step budget.

Threads: one by default. At one robot per batch every operation is tiny, and with two threads
the backward pass mostly waits for the second one (about 3x slower on the 2-core development
machine); pass ``--threads 2`` to compare.

Outputs in ``--out`` (default ``results/throw_trajopt``): ``results.json`` and
``throw_trajopt.png`` (loss vs iterations, vs simulated steps and vs wall-clock time). Run::

    python examples/throw_trajopt.py                    # about 2.5 min
    python examples/throw_trajopt.py --budget 100000 --seed 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import time

import torch

import diffmech
import diffmech.sim
from diffmech.errors import SimulationError

EE = "iiwa_link_ee"
Q_START = (0.0, 0.6, 0.0, -1.4, 0.0, 0.9, 0.0)  # rad: arm folded in front of the base
P_TARGET = (0.55, 0.0, 0.75)  # m, world
V_TARGET = (1.5, 0.0, 1.5)  # m/s, world: forward and up, a throw
POS_SCALE, VEL_SCALE, REG = 0.05, 0.5, 1e-3
ACCEL_SCALE = 20.0  # rad/s^2 per unit of u
DIVERGED = 1e10  # objective of a candidate whose rollout became non-finite


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=int, default=40_000,
                    help="simulated-step equivalents per optimiser (default 40000 = 400 rollouts of T=100)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=os.path.join("results", "throw_trajopt"))
    ap.add_argument("--steps", type=int, default=100, help="T, steps per rollout (default 100)")
    ap.add_argument("--dt", type=float, default=5e-3, help="step, s (default 5e-3: T dt = 0.5 s)")
    ap.add_argument("--knots", type=int, default=6, help="torque knots per joint (default 6)")
    ap.add_argument("--lr", type=float, default=0.05, help="Adam learning rate (default 0.05)")
    ap.add_argument("--sigma", type=float, default=0.5, help="CMA-ES initial step size (default 0.5)")
    ap.add_argument("--popsize", type=int, default=None, help="CMA-ES population (default 4 + 3 ln n)")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (default 1: at these sizes a second thread mostly waits)")
    ap.add_argument("--equal-time", action=argparse.BooleanOptionalAction, default=True,
                    help="also run CMA-ES for as much wall-clock time as Adam took (default on)")
    ap.add_argument("--ratio", type=float, default=None,
                    help="fix the backward/forward cost ratio r instead of measuring it (reproducible budgets)")
    ap.add_argument("--no-progress", action="store_true")
    return ap.parse_args(argv)


class Problem:
    """The throw: torque parametrisation, rollout and objective, batched over candidates."""

    def __init__(self, args):
        import diff_robot_data

        path = os.path.join(diff_robot_data.__path__[0], "kuka_iiwa", "urdf", "iiwa7.urdf")
        self.robot = diffmech.load_urdf(path, dtype=torch.float64)
        self.T, self.dt, self.K = args.steps, args.dt, args.knots
        f64 = dict(dtype=torch.float64)
        self.q0 = torch.tensor(Q_START, **f64)
        self.v0 = torch.zeros(7, **f64)
        self.p_target = torch.tensor(P_TARGET, **f64)
        self.v_target = torch.tensor(V_TARGET, **f64)
        with torch.no_grad():
            self.g0 = self.robot.generalized_gravity(self.q0)
            self.scale = ACCEL_SCALE * torch.diagonal(self.robot.mass_matrix(self.q0))
        # Linear interpolation (hat functions) from K knots at evenly spaced times to T steps.
        t = torch.linspace(0, self.K - 1, self.T, **f64)
        self.Phi = torch.clamp(1 - (t[:, None] - torch.arange(self.K, **f64)[None]).abs(), min=0)  # (T, K)
        self.n = self.K * 7

    def torques(self, u: torch.Tensor) -> torch.Tensor:
        """``u (P, K, 7)`` -> ``tau (P, T, 7)``."""
        return self.g0 + self.scale * (self.Phi @ u)

    def loss(self, u: torch.Tensor, stats: dict | None = None) -> torch.Tensor:
        """Objective of candidates ``u (P, K, 7)`` -> ``(P,)`` (see module docstring)."""
        q, v = diffmech.sim.rollout(self.robot, self.q0, self.v0, self.torques(u), self.dt,
                                    adjoint="checkpoint", stats=stats)
        qT, vT = q[:, -1], v[:, -1]
        p = self.robot.link_pose(qT, EE)[..., :3, 3]
        pdot = (self.robot.jacobian(qT, EE)[..., :3, :] @ vT[..., None])[..., 0]
        return (((p - self.p_target) / POS_SCALE) ** 2).sum(-1) + (((pdot - self.v_target) / VEL_SCALE) ** 2).sum(-1) \
            + REG * (u**2).mean((-2, -1))

    def loss_no_grad(self, u: torch.Tensor) -> torch.Tensor:
        """:meth:`loss` without gradient; a candidate whose rollout diverges scores ``DIVERGED``.

        The rollout stops the whole batch at the first non-finite state, so on failure the
        candidates are re-simulated one by one to find the diverging ones.
        """
        with torch.no_grad():
            try:
                return self.loss(u)
            except SimulationError:
                out = []
                for ui in u:
                    try:
                        out.append(self.loss(ui[None])[0])
                    except SimulationError:
                        out.append(torch.tensor(DIVERGED, dtype=u.dtype))
                return torch.stack(out)

    def terminal(self, u: torch.Tensor) -> dict:
        with torch.no_grad():
            q, v = diffmech.sim.rollout(self.robot, self.q0, self.v0, self.torques(u[None]), self.dt)
            qT, vT = q[0, -1], v[0, -1]
            p = self.robot.link_pose(qT, EE)[:3, 3]
            pdot = self.robot.jacobian(qT, EE)[:3] @ vT
        return {"position": p.tolist(), "velocity": pdot.tolist(),
                "position_error_m": float((p - self.p_target).norm()),
                "velocity_error_m_s": float((pdot - self.v_target).norm()),
                "max_abs_torque_Nm": float(self.torques(u[None]).abs().max())}


def measure_ratio(prob: Problem, reps: int = 3) -> float:
    """Backward / forward wall-time ratio of one gradient evaluation (median of ``reps``)."""
    ratios = []
    for _ in range(reps):
        u = torch.zeros(1, prob.K, 7, dtype=torch.float64, requires_grad=True)
        st: dict = {}
        prob.loss(u, st).sum().backward()
        ratios.append(st["backward_time"] / st["forward_time"])
    return statistics.median(ratios)


def run_adam(prob: Problem, budget: float, cost: float, lr: float, progress: bool) -> dict:
    u = torch.zeros(1, prob.K, 7, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.Adam([u], lr=lr)
    hist = {"iteration": [], "loss": [], "best": [], "sim_steps": [], "wall_s": []}
    used, best, best_u, it = 0.0, math.inf, u.detach()[0].clone(), 0
    n_iter = int(budget // cost)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_iter, desc="Adam", unit="it")
    t0 = time.perf_counter()
    while used + cost <= budget:
        loss = prob.loss(u).sum()
        opt.zero_grad()
        loss.backward()
        val = float(loss.detach())
        if val < best:
            best, best_u = val, u.detach()[0].clone()
        opt.step()
        used += cost
        it += 1
        for key, x in (("iteration", it), ("loss", val), ("best", best), ("sim_steps", used),
                       ("wall_s", time.perf_counter() - t0)):
            hist[key].append(x)
        if bar is not None:
            bar.update()
            bar.set_postfix(loss=f"{val:.3e}")
    if bar is not None:
        bar.close()
    with torch.no_grad():
        final = float(prob.loss(u.detach()).sum())
    if final < best:
        best, best_u = final, u.detach()[0].clone()
    return {"history": hist, "best_loss": best, "u": best_u, "iterations": it, "sim_steps": used,
            "wall_s": time.perf_counter() - t0}


def run_cma(prob: Problem, budget: float, sigma: float, popsize: int | None, seed: int, progress: bool,
            time_budget: float | None = None) -> dict:
    """CMA-ES within ``budget`` simulated steps, or (``time_budget``) within that many seconds."""
    import numpy as np
    from cmaes import CMA

    opt = CMA(mean=np.zeros(prob.n), sigma=sigma, seed=seed, population_size=popsize)
    P = opt.population_size
    cost = P * prob.T
    hist = {"iteration": [], "loss": [], "best": [], "sim_steps": [], "wall_s": []}
    used, best, best_u, gen = 0.0, math.inf, None, 0
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=None if time_budget else int(budget // cost), desc=f"CMA-ES (pop {P})", unit="gen")
    t0 = time.perf_counter()
    while (time.perf_counter() - t0 < time_budget) if time_budget else (used + cost <= budget):
        xs = np.stack([opt.ask() for _ in range(P)])
        u = torch.from_numpy(xs).reshape(P, prob.K, 7)
        f = prob.loss_no_grad(u).numpy()
        opt.tell(list(zip(xs, f.tolist())))
        used += cost
        gen += 1
        i = int(f.argmin())
        if f[i] < best:
            best, best_u = float(f[i]), u[i].clone()
        for key, x in (("iteration", gen), ("loss", float(f.min())), ("best", best), ("sim_steps", used),
                       ("wall_s", time.perf_counter() - t0)):
            hist[key].append(x)
        if bar is not None:
            bar.update()
            bar.set_postfix(best=f"{best:.3e}")
    if bar is not None:
        bar.close()
    if best_u is None:
        best_u = torch.zeros(prob.K, 7, dtype=torch.float64)
        best = float(prob.loss(best_u[None]).sum())
    return {"history": hist, "best_loss": best, "u": best_u, "iterations": gen, "sim_steps": used,
            "wall_s": time.perf_counter() - t0, "popsize": P}


def plot(path: str, runs: dict, loss0: float, budget: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.8))
    xlabels = {"iteration": "iteration (Adam step / CMA-ES generation)", "sim_steps": "simulated-step equivalents",
               "wall_s": "wall-clock time (s)"}
    # The equal-time CMA-ES run starts with the same seed, so its first generations are the
    # step-budget run: draw it dashed, underneath.
    style = {"Adam": dict(color="C0", lw=1.8, zorder=3), "CMA-ES": dict(color="C2", lw=1.8, zorder=2)}
    for ax, (key, label) in zip(axes, xlabels.items()):
        for name, r in runs.items():
            st = style.get(name, dict(color="C4", lw=1.2, ls="--", zorder=1))
            h = r["history"]
            ax.semilogy([0] + h[key], [loss0] + h["best"], label=f"{name}: best so far", **st)
            ax.semilogy(h[key], h["loss"], alpha=0.3, lw=0.7, color=st["color"],
                        label=f"{name}: {'current iterate' if name == 'Adam' else 'generation best'}")
        ax.set_xlabel(label)
        ax.set_ylabel("objective")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].set_xlim(0, budget * 1.02)
    axes[1].axvline(budget, color="k", lw=0.8, ls=":")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    fig.suptitle("iiwa throw: Adam with diffmech gradients (checkpoint adjoint) vs CMA-ES")
    fig.tight_layout(rect=(0, 0.12, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    prob = Problem(args)
    progress = not args.no_progress
    with torch.no_grad():
        loss0 = float(prob.loss(torch.zeros(1, prob.K, 7, dtype=torch.float64)).sum())
    ratio = measure_ratio(prob) if args.ratio is None else args.ratio
    adam_cost = (1 + ratio) * prob.T
    print(f"T = {prob.T} steps of {prob.dt} s, {prob.n} decision variables ({prob.K} knots x 7 joints); "
          f"budget {args.budget} simulated steps")
    print(f"backward/forward ratio r = {ratio:.2f}: an Adam iteration costs (1 + r) T = {adam_cost:.0f} step "
          f"equivalents, a CMA-ES candidate T = {prob.T}; objective at u = 0: {loss0:.3e}")

    adam = run_adam(prob, args.budget, adam_cost, args.lr, progress)
    cma = run_cma(prob, args.budget, args.sigma, args.popsize, args.seed, progress)
    runs = {"Adam": adam, "CMA-ES": cma}
    if args.equal_time:
        runs["CMA-ES, Adam's wall time"] = run_cma(prob, math.inf, args.sigma, args.popsize, args.seed, progress,
                                                   time_budget=adam["wall_s"])

    print(f"\n{'method':26s} {'iterations':>10s} {'sim steps':>10s} {'wall s':>8s} {'best loss':>10s} "
          f"{'pos err cm':>10s} {'vel err m/s':>11s}")
    out_runs = {}
    for name, r in runs.items():
        term = prob.terminal(r["u"])
        print(f"{name:26s} {r['iterations']:10d} {r['sim_steps']:10.0f} {r['wall_s']:8.1f} {r['best_loss']:10.3e} "
              f"{100 * term['position_error_m']:10.2f} {term['velocity_error_m_s']:11.3f}")
        out_runs[name] = {k: v for k, v in r.items() if k != "u"} | {"terminal": term, "u": r["u"].tolist()}
    winner = min(("Adam", "CMA-ES"), key=lambda n: runs[n]["best_loss"])
    print(f"lower objective within the same budget of simulated steps: {winner}")
    if args.equal_time:
        other = runs["CMA-ES, Adam's wall time"]
        print(f"CMA-ES given Adam's wall-clock time ({adam['wall_s']:.0f} s, {other['sim_steps']:.0f} simulated steps, "
              f"batched without gradients): best objective {other['best_loss']:.3e} vs Adam's {adam['best_loss']:.3e}")

    os.makedirs(args.out, exist_ok=True)
    result = {
        "args": vars(args), "T": prob.T, "dt": prob.dt, "n_variables": prob.n, "ee_link": EE,
        "target_position_m": list(P_TARGET), "target_velocity_m_s": list(V_TARGET), "loss_initial": loss0,
        "backward_forward_ratio": ratio, "adam_iteration_cost_steps": adam_cost,
        "cost_model": "CMA-ES candidate = T steps; Adam iteration = (1 + r) T, r measured once before the run",
        "runs": out_runs, "winner": winner,
    }
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(result, f, indent=1)
    plot(os.path.join(args.out, "throw_trajopt.png"), runs, loss0, args.budget)
    print(f"wrote {os.path.join(args.out, 'results.json')} and throw_trajopt.png")
    return result


if __name__ == "__main__":
    main()
