"""Learning efficient eigenmodes (Wotte, Dummer, Botteghi, Brune, Stramigioli, Califano 2023).

A control potential ``V_theta`` is trained so that the conservative closed loop ``H + V_theta``,
started at rest from ``q0``, performs an eigenmode of period ``T`` (periodic, two turning points,
line-shaped trace) whose other turning point, reached at ``T/2``, puts the end effector on a target,
with little control effort. The loss (soft-constrained, spec sections 2.3 to 2.5):

``J = w_task ||FK(q(T/2)) - x_d||^2 + beta(epoch) c |T| int_0^1 ||grad V_theta||^2 ds + rho C(x)``,
``C = l1 max_S ||q(t) - q(T - t)||_1 + l2 max_S ||p(t) + p(T - t)||_1 + l3 ||p(T/2)||^2``,

with ``S`` a fresh random set of grid times in the first half period at every step, the trajectory
from the fixed-step solver of :mod:`~diffmech.control.flow` on the normalised grid, and ``T`` fixed
or learned jointly (appendix D).

Optionally (``polish=True`` in the config, not in the paper) the Adam phase is followed by a
Gauss-Newton solve of the mode's conditions ``FK(q(T/2)) = x_d``, ``p(T/2) = 0`` on a finer, more
accurate trajectory (:meth:`EigenmodeTrainer.polish`), which makes the learned orbit periodic and
time-symmetric for the exact flow, not only on the training grid.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from .. import _log
from .._progress import Stage
from ..errors import DiffmechError, ShapeError
from .configs import EigenmodeConfig, build_system
from .flow import Flow, FlowCache, code_grid, effort_integral, hamiltonian_flow
from .hamiltonian import HamiltonianSystem

log = _log.get("eigenmode")

__all__ = ["EigenmodeLoss", "eigenmode_loss", "effort_weight", "EigenmodeTrainer", "half_index", "target_point",
           "projected_effort_step"]


def half_index(grid: Tensor) -> int:
    """Index of ``s = 0.5`` in a symmetric normalised grid."""
    i = int((grid - 0.5).abs().argmin())
    if abs(float(grid[i]) - 0.5) > 1e-6:
        raise ShapeError("the normalised grid must contain s = 0.5")
    return i


def effort_weight(epoch: int, epochs: int, cycles: int = 4, ratio: float = 0.5) -> float:
    """Cyclical ramp of the effort weight: ``cycles`` times over the run, 0 -> 1 over the first
    ``ratio`` of each cycle, then 1 (the public code's annealing)."""
    length = max(epochs / max(cycles, 1), 1e-12)
    tau = (epoch % length) / length
    return tau / ratio if tau <= ratio else 1.0


def target_point(system: HamiltonianSystem, cfg: EigenmodeConfig) -> Tensor:
    """Task-space target ``x_d (3,)``: ``target_position`` or ``FK(target_angles)``."""
    if cfg.target_position is not None:
        return torch.tensor(cfg.target_position, dtype=system.dtype, device=system.device)
    if cfg.target_angles is None:
        raise DiffmechError("config needs target_angles or target_position")
    qt = torch.tensor(cfg.target_angles, dtype=system.dtype, device=system.device)
    with torch.no_grad():
        return system.end_effector(qt)


@dataclass
class EigenmodeLoss:
    total: Tensor
    task: Tensor
    effort: Tensor  # |T| int ||grad V||^2 ds (before the weight c beta)
    constraint: Tensor
    c_q: Tensor
    c_p: Tensor
    c_half: Tensor
    ee_error: Tensor  # ||FK(q(T/2)) - x_d||, m

    def scalars(self) -> dict[str, float]:
        return {k: float(v.detach()) for k, v in self.__dict__.items()}


def eigenmode_loss(system: HamiltonianSystem, flow: Flow, period: Tensor, target: Tensor, cfg: EigenmodeConfig,
                   *, beta: float = 1.0, generator: torch.Generator | None = None) -> EigenmodeLoss:
    """The soft-constrained loss of one trajectory (see the module docstring)."""
    n = system.n
    X = flow.X
    if X.dim() != 2:
        raise ShapeError(f"eigenmode_loss: one trajectory expected, got X of shape {tuple(X.shape)}")
    ih = half_index(flow.grid)
    N = X.shape[0] - 1
    q, p = X[:, :n], X[:, n:]
    err2 = (system.end_effector(q[ih]) - target).square().sum()
    ee_error = err2.clamp_min(0).sqrt()
    task = cfg.w_task * (err2 if cfg.task_squared else ee_error)
    effort = period.abs() * effort_integral(system, flow)
    idx = torch.randperm(max(ih - 1, 1), generator=generator)[: cfg.samples].to(X.device)
    pair = N - idx
    c_q = (q[idx] - q[pair]).abs().sum(-1).max()
    c_p = (p[idx] + p[pair]).abs().sum(-1).max()
    c_half = p[ih].square().sum()
    l1, l2, l3 = cfg.lambdas
    C = l1 * c_q + l2 * c_p + l3 * c_half
    total = task + cfg.effort * beta * effort + cfg.rho * C
    return EigenmodeLoss(total, task, effort, C, c_q, c_p, c_half, ee_error)


def projected_effort_step(J: Tensor, r: Tensor, g: Tensor, alpha: float) -> tuple[Tensor, Tensor]:
    """One step of effort descent under equality constraints: ``(d (P,), Pg (P,))``.

    ``d`` minimises the model ``g^T d + ||d||^2 / (2 alpha)`` subject to the linearised constraints
    ``r + J d = 0``: ``d = -alpha P g - J^T (J J^T)^{-1} r`` with ``P = I - J^T (J J^T)^{-1} J`` the
    projector onto the null space of ``J``. The first part lowers the objective without changing the
    linearised residual (to first order), the second is the minimum-norm Gauss-Newton correction.

    Args:
        J: ``(m, P)`` Jacobian of the constraint residuals (full row rank up to round-off; a tiny
            ridge relative to the largest diagonal entry of ``J J^T`` guards the solve).
        r: ``(m,)`` residuals.
        g: ``(P,)`` gradient of the objective.
        alpha: step length (the inverse curvature of the model), > 0.
    """
    A = J @ J.T
    ridge = 1e-12 * float(A.diagonal().max().clamp_min(1e-300))
    A = A + ridge * torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    sol = torch.linalg.solve(A, torch.stack([J @ g, r], -1))  # (m, 2)
    Pg = g - J.T @ sol[:, 0]
    return -alpha * Pg - J.T @ sol[:, 1], Pg


def _flat_grad(out: Tensor, params: list[Tensor], retain_graph: bool = True) -> Tensor:
    gs = torch.autograd.grad(out, params, retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(gs, params)])


def _set_params(params: list[Tensor], base: list[Tensor], step: Tensor) -> None:
    with torch.no_grad():
        off = 0
        for p, b in zip(params, base):
            k = p.numel()
            p.copy_(b + step[off:off + k].reshape(p.shape).to(p.dtype))
            off += k


class EigenmodeTrainer:
    """Adam on the potential's parameters (and ``T`` when learned), one trajectory per step.

    Args:
        cfg: the run's configuration.
        out: folder for ``checkpoint.pt`` and ``history.csv`` (``None``: nothing written).
    """

    def __init__(self, cfg: EigenmodeConfig, out: str | None = None):
        self.cfg = cfg
        self.out = out
        with torch.random.fork_rng(devices=[]):  # seed the network's initialisation without touching the caller's RNG
            torch.manual_seed(cfg.seed)
            self.system = build_system(cfg).to(cfg.device)
        self.native = bool(cfg.native) and self.system.prepare_native()
        self.dtype = cfg.torch_dtype
        dev = self.system.device
        self.generator = torch.Generator().manual_seed(cfg.seed + 1)
        n = self.system.n
        if len(cfg.q0) != n:
            raise ShapeError(f"config {cfg.name!r}: q0 has {len(cfg.q0)} values, the system has {n} coordinates")
        self.q0 = torch.tensor(cfg.q0, dtype=self.dtype, device=dev)
        self.x0 = torch.cat([self.q0, torch.zeros_like(self.q0)])
        self.target = target_point(self.system, cfg)
        T0 = cfg.period_init if cfg.learn_period else cfg.period
        self.period = torch.nn.Parameter(torch.tensor(float(T0), dtype=self.dtype, device=dev),
                                         requires_grad=cfg.learn_period)
        self.grid = code_grid(cfg.grid_points, dtype=self.dtype, device=dev)
        params = list(self.system.potential.parameters()) + ([self.period] if cfg.learn_period else [])
        self.optimizer = torch.optim.Adam(params, lr=cfg.lr)
        self.scheduler = torch.optim.lr_scheduler.ExponentialLR(self.optimizer, gamma=cfg.gamma)
        self.cache = FlowCache()
        self.epoch = 0
        self.history: list[dict] = []
        self.train_seconds = 0.0
        self.stopped_early = False
        self.polished = False
        self.polish_info: dict = {}
        self.init_info: dict = {}
        if cfg.init == "linear-mode":
            self.init_info = self._linear_mode_init()
        elif cfg.init != "default":
            raise DiffmechError(f"config {cfg.name!r}: init must be 'default' or 'linear-mode', got {cfg.init!r}")

    def _linear_mode_init(self) -> dict:
        from .warmstart import fit_linear_mode, target_configuration

        cfg = self.cfg
        t0 = time.perf_counter()
        if cfg.target_position is None and cfg.target_angles is not None:
            q_t = torch.tensor(cfg.target_angles, dtype=self.dtype, device=self.system.device)
        else:
            q_t = target_configuration(self.system, self.target, self.q0)
        gen = torch.Generator().manual_seed(cfg.seed + 2)
        info = fit_linear_mode(self.system, self.q0, q_t, float(self.period.detach()), margin=cfg.init_margin,
                               generator=gen)
        info["seconds"] = time.perf_counter() - t0
        # the fit's seconds count as training time
        self.train_seconds += info["seconds"]
        return info

    # ------------------------------------------------------------------ one step
    def flow(self, *, grad: bool = True) -> Flow:
        cfg = self.cfg
        with torch.set_grad_enabled(grad):
            return hamiltonian_flow(self.system, self.x0, self.period, self.grid, method=cfg.method,
                                    solver=cfg.solver, adjoint=cfg.adjoint, cache=self.cache)

    def beta(self, epoch: int) -> float:
        cfg = self.cfg
        if cfg.effort == 0 or not cfg.effort_anneal:
            return 1.0
        return effort_weight(epoch, cfg.epochs, cfg.effort_cycles, cfg.effort_ratio)

    def loss(self, epoch: int) -> EigenmodeLoss:
        flow = self.flow()
        return eigenmode_loss(self.system, flow, self.period, self.target, self.cfg, beta=self.beta(epoch),
                              generator=self.generator)

    def step(self, epoch: int) -> EigenmodeLoss:
        self.optimizer.zero_grad(set_to_none=True)
        L = self.loss(epoch)
        if not bool(torch.isfinite(L.total)):
            raise DiffmechError(f"eigenmode training ({self.cfg.name}): non-finite loss at epoch {epoch}")
        if self.cfg.polish and float(L.ee_error.detach()) < self.cfg.polish_from:
            # the polish takes over from these parameters: an Adam step now could only move them
            # away from the point whose error was just measured
            return L
        L.total.backward()
        self.optimizer.step()
        if self.cfg.learn_period:
            with torch.no_grad():
                self.period.copy_(self.period.abs().clamp_min(self.cfg.period_min))
        return L

    # ------------------------------------------------------------------ loop
    def train(self, *, progress: bool | None = None,
              callback: Callable[[EigenmodeTrainer, dict], bool] | None = None,
              checkpoint_every: float = 30.0) -> list[dict]:
        """Run the remaining epochs; ``callback(trainer, record)`` returning True stops early.

        Checkpoints (``out/checkpoint.pt``) are written every ``checkpoint_every`` seconds and at the end.
        ``progress``: ``None`` (default): silent while short; once the Adam phase (or the polish) has
        run 2 s, a tqdm bar on stderr if stderr is a terminal, else one INFO line of the
        ``diffmech.eigenmode`` logger then (sizes) and one at its end (elapsed seconds, last loss);
        ``True``: a bar from the first step; ``False``: nothing (see :mod:`diffmech._progress`).
        """
        cfg = self.cfg
        total = cfg.epochs * cfg.steps_per_epoch
        done = self.epoch * cfg.steps_per_epoch
        bar = Stage(log, f"eigenmode {cfg.name}", total, initial=done, progress=progress,
                    sizes=f"{cfg.epochs} epochs x {cfg.steps_per_epoch} Adam steps, {self.grid.numel()} grid points")
        last_ckpt = time.perf_counter()
        reached_polish = False
        try:
            while self.epoch < cfg.epochs and not self.stopped_early and not self.polished:
                for _ in range(cfg.steps_per_epoch):
                    t0 = time.perf_counter()
                    L = self.step(self.epoch)
                    self.train_seconds += time.perf_counter() - t0
                    rec = {"step": len(self.history), "epoch": self.epoch, "phase": "adam", **L.scalars(),
                           "period": float(self.period.detach()), "lr": self.optimizer.param_groups[0]["lr"],
                           "newton_iterations": self.cache.stats[-1].get("iterations", 0) if self.cache.stats else 0,
                           "train_seconds": self.train_seconds}
                    self.history.append(rec)
                    bar.set_postfix(loss=f"{rec['total']:.3g}", ee=f"{rec['ee_error']:.3g}")
                    bar.update(1)
                    stop = cfg.stop_ee is not None and rec["ee_error"] < cfg.stop_ee and (
                        cfg.stop_p is None or math.sqrt(rec["c_half"]) < cfg.stop_p)
                    if cfg.polish and rec["ee_error"] < cfg.polish_from:
                        reached_polish = stop = True
                    if callback is not None and callback(self, rec):
                        stop = True
                    if stop:
                        self.stopped_early = True
                        break
                if not reached_polish:  # no Adam step was taken at the hand-over
                    self.scheduler.step()
                self.epoch += 1
                if self.out and time.perf_counter() - last_ckpt > checkpoint_every:
                    self.save()
                    last_ckpt = time.perf_counter()
        finally:
            bar.close()
        if cfg.polish and not self.polished and (reached_polish or self.epoch >= cfg.epochs):
            self.polish(progress=progress)
        if self.out:
            self.save()
        return self.history

    # ------------------------------------------------------------------ Gauss-Newton polish
    def mode_residual(self, grid: Tensor, method: str, cache: FlowCache | None = None) -> tuple[Tensor, Flow]:
        """``r = (FK(q(T/2)) - x_d, p(T/2))`` (``(3 + n,)``, m and kg m^2/s) of the trajectory on
        ``grid`` by ``method``, differentiable w.r.t. the potential's parameters."""
        n = self.system.n
        flow = hamiltonian_flow(self.system, self.x0, self.period.detach(), grid, method=method,
                                solver=self.cfg.solver, cache=cache)
        ih = half_index(grid)
        X = flow.X
        return torch.cat([self.system.end_effector(X[ih, :n]) - self.target, X[ih, n:]]), flow

    def polish(self, *, progress: bool | None = None) -> dict:
        """Solve ``FK(q(T/2)) = x_d, p(T/2) = 0`` by damped minimum-norm Gauss-Newton steps.

        With ``p(0) = 0``, a turning point at ``T/2`` makes the orbit periodic and time-symmetric
        (spec, Lemmas 2.1-2.3), so these ``3 + n`` residuals are the whole eigenmode condition plus
        the task. Each iteration takes their Jacobian ``Jr (3 + n, P)`` w.r.t. the ``P`` parameters
        (one discrete-adjoint pass per residual) and moves the parameters by the smallest step that
        zeroes the linearised residual, ``-Jr^T (Jr Jr^T + mu s I)^{-1} r`` (Levenberg-Marquardt
        damping ``mu`` relative to ``s = max diag Jr Jr^T``, raised tenfold after a step that does
        not reduce ``||r||`` and lowered after one that does). The trajectory is the config's
        ``polish_method`` on ``polish_grid_points`` (RK4 on 201 points by default: far more
        accurate than the training grid's midpoint rule, so the solution holds for the exact flow).

        Returns (and stores in :attr:`polish_info`): iterations, converged, final ``||FK - x_d||``,
        ``||p(T/2)||``, seconds. ``progress`` as in :meth:`train`.
        """
        cfg = self.cfg
        t_start = time.perf_counter()
        self._polish_base = self.train_seconds
        grid = code_grid(cfg.polish_grid_points, dtype=self.dtype, device=self.system.device)
        cache = FlowCache()
        params = [p for p in self.system.potential.parameters() if p.requires_grad]
        tol_e, tol_p = cfg.polish_tol
        mu = 1e-6
        r, flow = self.mode_residual(grid, cfg.polish_method, cache)
        converged = False
        it = 0
        stage = Stage(log, f"eigenmode polish {cfg.name}", cfg.polish_max_iter + 1, unit="iteration", progress=progress,
                      sizes=f"at most {cfg.polish_max_iter} Gauss-Newton iterations on {cfg.polish_grid_points} points")
        for it in range(cfg.polish_max_iter + 1):
            e_norm, p_norm = float(r[:3].detach().norm()), float(r[3:].detach().norm())
            self._polish_record(flow, e_norm, p_norm, it, t_start)
            stage.set_postfix(ee=f"{e_norm:.3g}", p=f"{p_norm:.3g}")
            stage.update()
            if e_norm < tol_e and p_norm < tol_p:
                converged = True
                break
            if it == cfg.polish_max_iter:
                break
            Jr = torch.stack([_flat_grad(r[i], params) for i in range(r.numel())]).double()
            rd = r.detach().double()
            A = Jr @ Jr.T
            scale = float(A.diagonal().max())
            eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
            theta0 = [p.detach().clone() for p in params]
            accepted = False
            for _ in range(12):
                step = -(Jr.T @ torch.linalg.solve(A + mu * scale * eye, rd))
                _set_params(params, theta0, step)
                try:
                    r_new, flow_new = self.mode_residual(grid, cfg.polish_method, cache)
                    finite = bool(torch.isfinite(r_new).all())
                    ok = finite and float(r_new.detach().norm()) < float(rd.norm())
                except (DiffmechError, RuntimeError):
                    finite = ok = False
                if not finite:
                    cache.clear()  # the warm start is the failed trajectory: start the next solve afresh
                if ok:
                    r, flow = r_new, flow_new
                    mu = max(mu / 10, 1e-12)
                    accepted = True
                    break
                mu *= 10
            if not accepted:
                with torch.no_grad():
                    for p, t0_ in zip(params, theta0):
                        p.copy_(t0_)
                break
        stage.close()
        self.cache.clear()
        self.polished = True
        self.polish_info = {"iterations": it, "converged": converged, "ee_error": e_norm, "p_half_norm": p_norm,
                            "seconds": time.perf_counter() - t_start, "method": cfg.polish_method,
                            "grid_points": int(grid.numel())}
        if cfg.effort_descent and converged:
            self.polish_info["effort_descent"] = self.descend_effort(grid, cache, t_start)
            self.polish_info["seconds"] = time.perf_counter() - t_start
        return self.polish_info

    def descend_effort(self, grid: Tensor, cache: FlowCache, t_start: float) -> dict:
        """Lower the effort ``E = T int ||grad V_theta||^2 ds`` on the polish trajectory while the
        mode's conditions ``r = (FK(q(T/2)) - x_d, p(T/2))`` stay within ``polish_tol``.

        Each iteration takes ``J = dr/dtheta`` (one discrete-adjoint pass per residual) and
        ``g = dE/dtheta`` (one more), and the step of :func:`projected_effort_step`: steepest descent
        of ``E`` projected onto the null space of ``J`` plus the Gauss-Newton correction of ``r``.
        A trial is accepted when ``E`` decreased and both residual norms are within ``polish_tol``;
        a trial that lowers ``E`` but leaves the tolerance gets up to ``effort_descent_corrections``
        second-order corrections (minimum-norm Gauss-Newton steps on the new residual with the same
        ``J``: one trajectory each, no new Jacobian). After an accepted step the step length doubles,
        after a failed trial it shrinks fourfold (at most 8 trials per iteration). The
        first step length is set so that the model predicts a decrease of
        ``effort_descent_fraction`` of ``E``.

        Returns: iterations, effort before and after (on the polish trajectory), residual norms,
        seconds of the descent.
        """
        cfg = self.cfg
        t0 = time.perf_counter()
        params = [p for p in self.system.potential.parameters() if p.requires_grad]
        tol_e, tol_p = cfg.polish_tol
        T = self.period.detach()

        def evaluate():
            r, flow = self.mode_residual(grid, cfg.polish_method, cache)
            return r, flow, T.abs() * effort_integral(self.system, flow)

        r, flow, E = evaluate()
        E_start = float(E.detach())
        alpha = None
        it = 0
        accepted_steps = 0
        corrections = 0
        for it in range(cfg.effort_descent_iter):
            J = torch.stack([_flat_grad(r[i], params) for i in range(r.numel())]).double()
            g = _flat_grad(E, params, retain_graph=False).double()
            rd, E0 = r.detach().double(), float(E.detach())
            theta0 = [p.detach().clone() for p in params]
            if alpha is None:
                _, Pg = projected_effort_step(J, rd, g, 1.0)
                alpha = cfg.effort_descent_fraction * E0 / max(float(Pg.square().sum()), 1e-300)
            accepted = False
            for _ in range(8):
                step, _ = projected_effort_step(J, rd, g, alpha)
                ok = False
                # the trial, then (when only the conditions drifted out of tolerance) the
                # second-order correction: a Gauss-Newton step on the new residual with the old J
                for attempt in range(1 + cfg.effort_descent_corrections):
                    _set_params(params, theta0, step)
                    try:
                        r_new, flow_new, E_new = evaluate()
                    except (DiffmechError, RuntimeError):
                        cache.clear()  # the warm start is the failed trajectory: start the next solve afresh
                        break
                    e_new, p_new = float(r_new[:3].detach().norm()), float(r_new[3:].detach().norm())
                    if not bool(torch.isfinite(r_new).all()):
                        cache.clear()
                        break
                    if float(E_new.detach()) >= E0:
                        break
                    if e_new < tol_e and p_new < tol_p:
                        ok = True
                        break
                    corrections += attempt < cfg.effort_descent_corrections
                    step = step + projected_effort_step(J, r_new.detach().double(), g, 0.0)[0]
                if ok:
                    r, flow, E = r_new, flow_new, E_new
                    alpha *= 2.0
                    accepted = True
                    break
                alpha /= 4
            if not accepted:
                _set_params(params, theta0, torch.zeros(sum(p.numel() for p in params), dtype=torch.float64))
                cache.clear()
                r, flow, E = evaluate()
                break
            accepted_steps += 1
            self._polish_record(flow, float(r[:3].detach().norm()), float(r[3:].detach().norm()),
                                it + 1, t_start, phase="effort")
        return {"iterations": accepted_steps, "effort_start": E_start, "effort_end": float(E.detach()),
                "ee_error": float(r[:3].detach().norm()), "p_half_norm": float(r[3:].detach().norm()),
                "seconds": time.perf_counter() - t0, "step_length": alpha, "corrections": corrections}

    def _polish_record(self, flow: Flow, e_norm: float, p_norm: float, it: int, t_start: float,
                       phase: str = "polish") -> None:
        with torch.no_grad():
            L = eigenmode_loss(self.system, flow, self.period.detach(), self.target, self.cfg, generator=self.generator)
        # the polish's seconds count as training time
        self.train_seconds = self._polish_base + time.perf_counter() - t_start
        rec = {"step": len(self.history), "epoch": self.epoch, "phase": phase, **L.scalars(),
               "period": float(self.period.detach()), "lr": 0.0, "newton_iterations": it,
               "train_seconds": self.train_seconds}
        rec["ee_error"], rec["c_half"] = e_norm, p_norm ** 2
        self.history.append(rec)

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        return {"config": self.cfg.to_dict(), "potential": self.system.potential.state_dict(),
                "period": float(self.period.detach()), "optimizer": self.optimizer.state_dict(),
                "scheduler": self.scheduler.state_dict(), "epoch": self.epoch, "history": self.history,
                "train_seconds": self.train_seconds, "generator": self.generator.get_state(),
                "stopped_early": self.stopped_early, "polished": self.polished, "polish_info": self.polish_info,
                "init_info": self.init_info, "flow_cache": self._cache_state()}

    def _cache_state(self) -> dict:
        # the Newton solve of the next step starts from the cached trajectory: without it a resumed
        # run converges to a (slightly) different root and drifts from the uninterrupted one
        c = self.cache
        return {"X": None if c.X is None else c.X.cpu(), "J_plant": None if c.J_plant is None else c.J_plant.cpu(),
                "key": None if c.key is None else tuple(str(k) if isinstance(k, torch.device) else k for k in c.key),
                "stats": list(c.stats)}

    def _load_cache_state(self, state: dict | None) -> None:
        self.cache.clear()
        self.cache.stats = []
        if not state:
            return
        self.cache.stats = list(state.get("stats", []))
        key = state.get("key")
        if key is None or state.get("X") is None or state.get("J_plant") is None:
            return
        key = tuple(torch.device(k) if i == 4 else k for i, k in enumerate(key))
        if key[4].type != torch.device(self.system.device).type:
            return  # trained elsewhere: the next solve starts afresh, as the key would not match anyway
        self.cache.key = key
        self.cache.X = state["X"].to(key[4])
        self.cache.J_plant = state["J_plant"].to(key[4])

    def load_state_dict(self, state: dict) -> None:
        self.system.potential.load_state_dict(state["potential"])
        with torch.no_grad():
            self.period.fill_(state["period"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        self.epoch = int(state["epoch"])
        self.history = list(state["history"])
        self.train_seconds = float(state["train_seconds"])
        self.generator.set_state(state["generator"])
        self.stopped_early = bool(state.get("stopped_early", False))
        self.polished = bool(state.get("polished", False))
        self.polish_info = dict(state.get("polish_info", {}))
        self.init_info = dict(state.get("init_info", {}))
        self._load_cache_state(state.get("flow_cache"))

    def save(self) -> None:
        os.makedirs(self.out, exist_ok=True)
        path = os.path.join(self.out, "checkpoint.pt")
        # a name of this writer's own, renamed into place: a run interrupted mid-write, or another
        # process writing the same run, never leaves a truncated checkpoint.pt
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        try:
            torch.save(self.state_dict(), tmp)
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)
        self.write_history()
        with open(os.path.join(self.out, "config.json"), "w") as f:
            json.dump(self.cfg.to_dict(), f, indent=2)

    def write_history(self) -> None:
        if not self.history:
            return
        keys = list(self.history[0])
        with open(os.path.join(self.out, "history.csv"), "w") as f:
            f.write(",".join(keys) + "\n")
            for r in self.history:
                f.write(",".join(f"{r[k]:.10g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + "\n")

    @classmethod
    def load(cls, out: str, **overrides) -> EigenmodeTrainer:
        """The trainer saved in ``out`` (config overrides: e.g. more ``epochs`` to resume further)."""
        from ..cli_checks import CheckpointError, brief, load_checkpoint

        path = os.path.join(out, "checkpoint.pt")
        state = load_checkpoint(path, keys=("config", "potential", "period", "optimizer", "scheduler", "epoch",
                                            "history", "train_seconds", "generator"), what="eigenmode checkpoint")
        try:
            cfg = EigenmodeConfig.from_dict(state["config"]).replace(**overrides)
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"{path}: the checkpoint's configuration is not an eigenmode config ({exc})") \
                from None
        tr = cls(cfg, out)
        try:
            tr.load_state_dict(state)
        except (RuntimeError, TypeError, ValueError, KeyError) as exc:
            raise CheckpointError(f"{path}: the checkpoint does not match its configuration ({brief(exc)})") from None
        return tr

