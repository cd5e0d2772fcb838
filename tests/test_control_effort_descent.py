"""Effort descent under the mode's conditions: the projected step against SciPy's SLSQP on the
same linearised problem and on a small nonlinear one, and a short descent on the pendulum."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import minimize

from diffmech.control.eigenmodes import projected_effort_step


def test_projected_step_solves_the_linearised_problem():
    """d = argmin g^T d + ||d||^2 / (2 alpha) s.t. r + J d = 0, against SLSQP."""
    g_ = torch.Generator().manual_seed(0)
    J = torch.randn(2, 6, generator=g_, dtype=torch.float64)
    r = 0.1 * torch.randn(2, generator=g_, dtype=torch.float64)
    g = torch.randn(6, generator=g_, dtype=torch.float64)
    alpha = 0.3
    d, Pg = projected_effort_step(J, r, g, alpha)
    torch.testing.assert_close(J @ d, -r, atol=1e-10, rtol=0)
    torch.testing.assert_close(J @ Pg, torch.zeros(2, dtype=torch.float64), atol=1e-10, rtol=0)
    Jn, rn, gn = J.numpy(), r.numpy(), g.numpy()
    res = minimize(lambda x: gn @ x + x @ x / (2 * alpha), np.zeros(6), jac=lambda x: gn + x / alpha,
                   constraints=[{"type": "eq", "fun": lambda x: rn + Jn @ x, "jac": lambda x: Jn}],
                   method="SLSQP", options={"ftol": 1e-14, "maxiter": 200})
    assert res.success, res.message
    np.testing.assert_allclose(d.numpy(), res.x, atol=1e-6)


def _c(x: torch.Tensor) -> torch.Tensor:  # two smooth constraints on R^4
    return torch.stack([x[0] ** 2 + x[1] - 1.0, torch.sin(x[2]) + x[3] * x[0] - 0.3])


def _E(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:  # a convex "effort"
    return ((x - a) * torch.tensor([1.0, 2.0, 0.5, 1.5], dtype=x.dtype)).square().sum()


def test_descent_lowers_the_objective_and_keeps_the_constraints():
    """Projected steps with Gauss-Newton re-projection on a small nonlinear problem: every step
    lowers E, the constraints stay at round-off, and the end point is SLSQP's constrained minimum."""
    a = torch.tensor([0.2, -0.4, 1.0, 0.7], dtype=torch.float64)
    x = torch.tensor([0.9, 0.2, 0.1, 0.3], dtype=torch.float64)
    for _ in range(20):  # a feasible start by Gauss-Newton
        J = torch.autograd.functional.jacobian(_c, x)
        x = x - J.T @ torch.linalg.solve(J @ J.T, _c(x))
    assert float(_c(x).abs().max()) < 1e-12
    E_prev = float(_E(x, a))
    alpha = 0.05
    for _ in range(300):
        J = torch.autograd.functional.jacobian(_c, x)
        g = torch.autograd.functional.jacobian(lambda y: _E(y, a), x)
        d, _ = projected_effort_step(J, _c(x), g, alpha)
        x = x + d
        for _ in range(3):  # re-project
            Jx = torch.autograd.functional.jacobian(_c, x)
            x = x - Jx.T @ torch.linalg.solve(Jx @ Jx.T, _c(x))
        E = float(_E(x, a))
        assert E <= E_prev + 1e-12
        assert float(_c(x).abs().max()) < 1e-10
        E_prev = E
    an = a.numpy()
    w = np.array([1.0, 2.0, 0.5, 1.5])
    res = minimize(lambda y: np.sum(((y - an) * w) ** 2), x.numpy() + 0.05, method="SLSQP",
                   constraints=[{"type": "eq", "fun": lambda y: _c(torch.tensor(y)).numpy()}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert res.success, res.message
    np.testing.assert_allclose(x.numpy(), res.x, atol=1e-5)


@pytest.mark.slow
def test_effort_descent_on_the_pendulum():
    """On the tiny double-pendulum run with the polish: the descent lowers the effort and the mode's
    conditions stay within the polish tolerance (checked by the high-accuracy re-integration)."""
    from diffmech.control.configs import get_config
    from diffmech.control.eigenmodes import EigenmodeTrainer
    from diffmech.control.verify import verify_mode

    cfg = get_config("main-fast", hidden=32, polish_grid_points=120, polish_from=1.0, init="linear-mode",
                     effort_descent=True, effort_descent_iter=4, dtype="float64")
    from diffmech.dynamics import kernels

    tr = EigenmodeTrainer(cfg)
    with kernels.native_mode("build"):  # as users run it (the torch code alone: half an hour on 2 cores)
        tr.train(progress=False)
    info = tr.polish_info
    assert info["converged"], info
    ed = info["effort_descent"]
    assert ed["iterations"] >= 1 and ed["effort_end"] < ed["effort_start"]
    assert ed["ee_error"] < cfg.polish_tol[0] and ed["p_half_norm"] < cfg.polish_tol[1]
    m, _ = verify_mode(tr.system, cfg.q0, cfg.period, tr.target)
    assert m["ee_error_half_period"] < 2e-3 and m["periodicity_error"] < 1e-2
