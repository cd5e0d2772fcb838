"""Evaluation of learned dynamics: the seed paper's metrics, computed as its code did, and corrected ones.

Paper-compatible values (what Figures 3 and 4 plot; the keys of ``metrics.json``):

- ``train_loss`` / ``test_loss``: one-step MSE of the predicted next observation over the seed's
  columns (:func:`paper_loss_columns`): positions for SyMo/E2E-SyMo and on 1-DoF systems; on
  multi-DoF systems the seed's code scored L-NODE on the full state and NODE on the first ``n``
  (train) and ``3n // 2`` (test) state entries.
- ``integration_loss``: 16 unforced rollouts of 500 steps against the truth; per trajectory the mean
  over time of the squared error, then the mean over trajectories. On 1-DoF systems positions
  only; on multi-DoF systems the seed scored the full state, SyMo velocities being the backward
  differences ``(q_k - q_{k-1})/h``.
- ``energy_loss``: mean over trajectories of ``mean_t (E(x0) - E(q_t, v_t))^2`` with the true
  energy ``E`` and the reset state ``x0``; SyMo velocities again by backward difference, which
  belongs to the half step and puts a floor under the metric (``energy_floor``: the same
  reconstruction applied to the true positions).
- ``inertia_loss``: mean over time and matrix entries of ``(H_true(q_true,t) - H_model(q_pred,t))^2``,
  averaged over trajectories (absent for NODE).

Corrected metrics beside them: position-only one-step and rollout errors for every model
(``*_positions``), per-trajectory medians (``integration_median``, ``*_median``), the energy from
the model's own velocity at the node (``energy_loss_consistent``: for SyMo the discrete Legendre
transform ``H(q_k)^{-1} D2 L_d(q_{k-1}, q_k)``), the same against the true trajectory's energy at
each step instead of the initial one (``energy_tracking``, meaningful for damped systems), and the
inertia error with both matrices at the predicted positions (``inertia_loss_predicted``).

Not to be confused with the training objective (``train_objective``/``test_objective`` of
``history.csv``, ``final_test_objective`` of ``metrics.json``): what the optimiser and the
learning-rate scheduler see, for SyMo a residual rather than an error. :func:`metric_definitions`
states each in one line; ``metrics.json`` carries them as its ``definitions`` entry.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from .data import StepSamples, Trajectories
from .models import LearnedDynamics, Prediction, Rollout
from .systems import System

__all__ = ["metric_definitions", "paper_loss_columns", "paper_integration_columns", "one_step_losses",
           "rollout_metrics", "rollout_integration_set", "trajectory_mse", "energy_mse", "inertia_mse"]


def paper_loss_columns(model_name: str, n: int, split: str) -> int:
    """Number of leading state entries ``(q, v)`` the seed's train/test "pose" error averaged."""
    if model_name in ("symo", "e2e-symo") or n == 1:
        return n
    if model_name.startswith("lnode"):
        return 2 * n  # the seed's 'L-NODE' != 'LODE' branch: the full-state loss
    if model_name.startswith("node"):
        # the seed sliced its NODE input [q, v, u, 0] (3n entries) by len // 3 (train) and len // 2 (test)
        return n if split == "train" else (3 * n) // 2
    raise ValueError(f"unknown model {model_name!r}")


def paper_integration_columns(n: int) -> int:
    """State entries of the seed's integration error: positions on 1-DoF systems, else the full state."""
    return n if n == 1 else 2 * n


def _mse_cols(q, v, q_ref, v_ref, cols: int, n: int) -> float:
    pred = q if cols <= n or v is None else torch.cat([q, v], -1)
    ref = q_ref if cols <= n or v is None else torch.cat([q_ref, v_ref], -1)
    return float((pred[..., :cols] - ref[..., :cols]).double().square().mean())


def one_step_losses(model: LearnedDynamics, model_name: str, b: StepSamples, split: str, *,
                    tol: float = 1e-5, max_iter: int = 10, chunk: int = 512) -> dict:
    """Paper-compatible (``loss``) and position-only (``positions``) one-step errors on ``b``.

    NODE/L-NODE predict with their training integrator (as the seed's evaluation did), SyMo models
    by Newton with tolerance ``tol``. ``failures`` counts non-converged solves.
    """
    preds = [model.predict(b.index(slice(s, s + chunk)), tol=tol, max_iter=max_iter, training_step=True)
             for s in range(0, len(b), chunk)]
    pred = Prediction(torch.cat([p.q for p in preds]), None if preds[0].v is None else torch.cat([p.v for p in preds]),
                      torch.cat([p.converged for p in preds]), max(p.iterations for p in preds))
    cols = paper_loss_columns(model_name, model.n, split)
    return {
        "loss": _mse_cols(pred.q, pred.v, b.q_next, b.v_next, cols, model.n),
        "positions": float((pred.q - b.q_next).double().square().mean()),
        "failures": int((~pred.converged).sum()),
        "iterations": pred.iterations,
    }


_OBJECTIVES = {
    "symo": "the mean squared residual of the discrete Euler-Lagrange equations at the observed positions "
            "(no Newton solve; not a position error, so not comparable with test_loss)",
    "e2e-symo": "the one-step position MSE (rad^2 or m^2) with Newton warm-started from the previous "
                "epoch's roots, in training over the converged samples only (test_loss solves from the "
                "seed's guess 2 q - q_prev instead)",
}


def metric_definitions(model_name: str) -> dict[str, str]:
    """One line per quantity of ``history.csv`` and ``metrics.json`` that a reader might confuse:
    what the scheduler watched (``*_objective``) against the paper's errors (``*_loss``).

    Written as the ``definitions`` entry of ``metrics.json``, so that a run folder explains itself.
    """
    obj = _OBJECTIVES.get(model_name, "the model's training loss: one-step MSE of the training integrator's "
                                      "prediction of (q, v)")
    return {
        "train_objective": f"history.csv, per epoch, mean over minibatches of the training objective: {obj}",
        "test_objective": "history.csv, per epoch: the same objective on the test set, which "
                          "ReduceLROnPlateau watches; final_test_objective is the last epoch's",
        "train_loss": "the paper's one-step MSE of the predicted next observation over the seed's columns "
                      "(paper_loss_columns) on the training samples, at the last epoch",
        "test_loss": "the paper's one-step MSE on the test samples after training, Newton (SyMo models) from "
                     "the seed's guess; a sample whose solve did not converge keeps its last iterate, so one "
                     "failure (eval_newton_failures) can dominate it",
        "eval_newton_failures": "non-converged Newton solves while computing train_loss and test_loss",
        "integration_loss": "mean over the integration trajectories of the time-mean squared error of "
                            "unforced rollouts (paper_integration_columns)",
    }


def trajectory_mse(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-trajectory mean over time and entries of the squared error: (N, T, d) x2 -> (N,)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.mean((pred - true) ** 2, axis=(1, 2))


def energy_mse(system: System, x0: np.ndarray, q: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Per-trajectory ``mean_t (E(x0) - E(q_t, v_t))^2``: x0 (N, 2n), q, v (N, T, n) -> (N,)."""
    n = system.n
    with torch.no_grad():
        E0 = system.energy(torch.as_tensor(x0[:, :n]), torch.as_tensor(x0[:, n:])).cpu().numpy()
        E = system.energy(torch.as_tensor(q), torch.as_tensor(v)).cpu().numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        return np.mean((E0[:, None] - E) ** 2, axis=1)


def inertia_mse(H_ref: np.ndarray, H_model: np.ndarray) -> np.ndarray:
    """Per-trajectory mean over time and entries: (N, T, n, n) x2 -> (N,)."""
    with np.errstate(over="ignore", invalid="ignore"):
        return np.mean((H_ref - H_model) ** 2, axis=(1, 2, 3))


@torch.no_grad()
def rollout_integration_set(model: LearnedDynamics, traj: Trajectories, n_steps: int | None = None, *,
                            tol: float = 1e-4, max_iter: int = 10, dtype=None, device=None) -> Rollout:
    """Roll ``model`` out on every trajectory of ``traj`` (batched) from observations 0 and 1."""
    p = next(model.parameters())
    kw = dict(dtype=dtype or p.dtype, device=device or p.device)
    n = model.n
    obs = torch.as_tensor(traj.obs).to(**kw)
    u = torch.as_tensor(traj.u).to(**kw)
    T = obs.shape[1] - 2 if n_steps is None else n_steps
    return model.rollout(obs[:, 0, :n], obs[:, 1, :n], obs[:, 1, n:], u, T, tol=tol, max_iter=max_iter)


def _stats(x: np.ndarray, prefix: str) -> dict:
    x = np.asarray(x, dtype=np.float64)
    return {prefix: _f(np.mean(x)), f"{prefix}_median": _f(np.median(x)), f"{prefix}_std": _f(np.std(x, ddof=1))}


def _f(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else (None if math.isnan(x) else x)


@torch.no_grad()
def rollout_metrics(model: LearnedDynamics, system: System, traj: Trajectories, roll: Rollout) -> tuple[dict, dict]:
    """Integration, energy and inertia metrics of a rollout on ``traj`` (the integration set).

    Returns ``(metrics, arrays)``: the scalar metrics and per-trajectory arrays (for files/figures).
    """
    n = system.n
    T = roll.q.shape[1]
    true = traj.obs[:, 2:2 + T]
    q = roll.q.double().cpu().numpy()
    v = roll.v.double().cpu().numpy()
    vc = roll.v_consistent.double().cpu().numpy()
    pred_full = np.concatenate([q, v], -1)
    per_pos = trajectory_mse(q, true[..., :n])
    per_full = trajectory_mse(pred_full, true)
    cols = paper_integration_columns(n)
    per_paper = per_full if cols == 2 * n else per_pos
    e_paper = energy_mse(system, traj.x0, q, v)
    e_cons = energy_mse(system, traj.x0, q, vc)
    # energy along the true trajectory instead of the initial one (the reference for damped systems)
    with torch.no_grad():
        E_true = system.energy(torch.as_tensor(true[..., :n]), torch.as_tensor(true[..., n:])).cpu().numpy()
        E_pred = system.energy(torch.as_tensor(q), torch.as_tensor(vc)).cpu().numpy()
    with np.errstate(over="ignore", invalid="ignore"):
        e_track = np.mean((E_true - E_pred) ** 2, axis=1)
    # the backward-difference floor of the seed's energy metric (true positions, same reconstruction)
    q_true_prev = traj.obs[:, 1:1 + T, :n]
    e_floor = energy_mse(system, traj.x0, true[..., :n], (true[..., :n] - q_true_prev) / model.h)
    m = {
        "integration_loss": _f(per_paper.mean()),
        "integration_std": _f(np.std(per_full, ddof=1)),  # the seed's error bars: full-state spread
        "integration_median": _f(np.median(per_pos)),
        **_stats(per_pos, "integration_positions"),
        **_stats(per_full, "integration_full"),
        "energy_loss": _f(e_paper.mean()),
        "energy_loss_median": _f(np.median(e_paper)),
        "energy_std": _f(np.std(e_paper, ddof=1)),
        **_stats(e_cons, "energy_loss_consistent"),
        **_stats(e_track, "energy_tracking"),
        "energy_floor": _f(e_floor.mean()) if model.uses_newton else None,
        "rollout_newton_failures": int(roll.failures.sum()),
        "rollout_newton_iterations_mean": roll.iterations / max(T, 1),
    }
    arrays = {"q": q, "v": v, "v_consistent": vc, "per_traj_positions": per_pos, "per_traj_full": per_full,
              "per_traj_energy": e_paper, "per_traj_energy_consistent": e_cons,
              "failures": roll.failures.cpu().numpy()}
    if model.lagrangian:
        qt = torch.as_tensor(q, dtype=next(model.parameters()).dtype, device=next(model.parameters()).device)
        with np.errstate(over="ignore", invalid="ignore"):
            H_model = np.nan_to_num(model.inertia(qt.clamp(-1e6, 1e6)).double().cpu().numpy(), nan=np.inf)
        H_true = system.mass_matrix(torch.as_tensor(true[..., :n])).cpu().numpy()
        q_finite = np.nan_to_num(q, nan=0.0, posinf=0.0, neginf=0.0)
        H_true_pred = system.mass_matrix(torch.as_tensor(q_finite)).cpu().numpy()
        per_H = inertia_mse(H_true, H_model)
        per_Hp = inertia_mse(H_true_pred, H_model)
        m.update({"inertia_loss": _f(per_H.mean()), "inertia_std": _f(np.std(per_H, ddof=1)),
                  "inertia_loss_median": _f(np.median(per_H)), "inertia_loss_predicted": _f(per_Hp.mean())})
        arrays["per_traj_inertia"] = per_H
        arrays["H_model"] = H_model
    else:
        m.update({"inertia_loss": None, "inertia_std": None, "inertia_loss_median": None,
                  "inertia_loss_predicted": None})
    return m, arrays
