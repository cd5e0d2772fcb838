"""diffmech.learn metrics on hand-computed tiny cases, and the paper's metric conventions."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from diffmech.learn import Trajectories, get_system
from diffmech.learn.metrics import (
    energy_mse,
    inertia_mse,
    paper_integration_columns,
    paper_loss_columns,
    rollout_metrics,
    trajectory_mse,
)
from diffmech.learn.models import Rollout


def test_paper_columns():
    # pendulum: positions for every model
    for m in ("node-rk4", "lnode-midpoint", "symo", "e2e-symo"):
        assert paper_loss_columns(m, 1, "train") == paper_loss_columns(m, 1, "test") == 1
    # cart-pole: L-NODE full state, NODE (x, theta) for train and (x, theta, x') for test, SyMo positions
    assert paper_loss_columns("lnode-rk4", 2, "train") == paper_loss_columns("lnode-rk4", 2, "test") == 4
    assert paper_loss_columns("node-midpoint", 2, "train") == 2
    assert paper_loss_columns("node-midpoint", 2, "test") == 3
    assert paper_loss_columns("e2e-symo", 2, "test") == 2
    assert paper_integration_columns(1) == 1 and paper_integration_columns(2) == 4


def test_trajectory_and_inertia_mse_by_hand():
    pred = np.array([[[1.0, 2.0], [3.0, 4.0]], [[0.0, 0.0], [0.0, 0.0]]])
    true = np.array([[[1.0, 0.0], [3.0, 2.0]], [[1.0, 1.0], [1.0, 1.0]]])
    # trajectory 0: errors 0, 4, 0, 4 -> 2; trajectory 1: all 1 -> 1
    assert trajectory_mse(pred, true).tolist() == [2.0, 1.0]
    H = np.ones((1, 2, 2, 2))
    Hm = H.copy()
    Hm[0, 1, 0, 0] = 3.0  # one entry off by 2 at t = 1: (4 / 4 entries) / 2 steps = 0.5
    assert inertia_mse(H, Hm).tolist() == [0.5]


def test_energy_mse_by_hand():
    s = get_system("pendulum")  # E = v^2 / 6 + 4.905 cos(theta) + const
    x0 = np.array([[0.0, 0.0]])
    q = np.array([[[0.0], [math.pi / 2]]])
    v = np.array([[[math.sqrt(6.0)], [0.0]]])
    # E(x0) - E = -1 at t = 0 and 4.905 at t = 1 -> (1 + 4.905^2) / 2
    assert energy_mse(s, x0, q, v)[0] == pytest.approx((1 + 4.905**2) / 2, rel=1e-12)


def test_rollout_metrics_of_the_truth():
    """Feeding the true positions: zero position error; the seed's energy metric then equals its floor."""
    s = get_system("pendulum")
    rng = np.random.default_rng(0)
    T = 12
    t = 0.1 * np.arange(T + 2)
    obs = np.stack([np.stack([0.3 * np.sin(2 * t + p), 0.6 * np.cos(2 * t + p)], -1) for p in rng.uniform(0, 6, 3)])
    traj = Trajectories(obs[:, 0], obs, np.zeros((3, T + 2, 1)))
    q = torch.as_tensor(obs[:, 2:, :1])
    v_bd = (q - torch.as_tensor(obs[:, 1:-1, :1])) / 0.1
    roll = Rollout(q, v_bd, torch.as_tensor(obs[:, 2:, 1:]), torch.zeros(3, dtype=torch.long), 2 * T)
    model = SimpleNamespace(h=0.1, uses_newton=True, lagrangian=False)
    m, arrays = rollout_metrics(model, s, traj, roll)
    assert m["integration_loss"] == 0 and m["integration_median"] == 0
    assert m["energy_loss"] == pytest.approx(m["energy_floor"], rel=1e-12)
    assert m["energy_loss_consistent"] == pytest.approx(float(energy_mse(s, traj.x0, obs[:, 2:, :1],
                                                                         obs[:, 2:, 1:]).mean()), rel=1e-12)
    assert m["inertia_loss"] is None and arrays["per_traj_positions"].shape == (3,)
    assert m["rollout_newton_iterations_mean"] == 2
