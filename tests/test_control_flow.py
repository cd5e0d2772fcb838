"""The closed-loop flow on the normalised grid: Newton (all steps at once) == sequential, the
discrete adjoint == plain autograd == finite differences, convergence orders of the schemes."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from control_helpers import system
from diffmech.control import FlowCache, code_grid, effort_integral, hamiltonian_flow, uniform_grid
from diffmech.control.configs import get_config
from diffmech.control.eigenmodes import eigenmode_loss
from diffmech.control.verify import integrate_ivp
from diffmech.errors import ShapeError

METHODS = ["midpoint", "rk4", "implicit_midpoint", "euler"]
X0 = torch.tensor([-0.5, -0.5, 0.0, 0.0], dtype=torch.float64)


def _perturb(module, scale=1e-3, seed=1):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(scale * torch.randn(p.shape, generator=g, dtype=p.dtype))


@pytest.mark.parametrize("method", METHODS)
def test_newton_matches_sequential(method):
    sys_ = system()
    grid = code_grid(16, dtype=torch.float64)
    cache = FlowCache()
    hamiltonian_flow(sys_, X0, 1.5, grid, method=method, cache=cache)  # cold: sequential, fills the cache
    _perturb(sys_.potential)
    f_newton = hamiltonian_flow(sys_, X0, 1.5, grid, method=method, cache=cache)
    f_seq = hamiltonian_flow(sys_, X0, 1.5, grid, method=method, solver="sequential")
    info = cache.stats[-1]
    assert not info["fallback"] and 1 <= info["iterations"] <= 4
    torch.testing.assert_close(f_newton.X, f_seq.X, rtol=0, atol=1e-12)
    torch.testing.assert_close(f_newton.stage_q, f_seq.stage_q, rtol=0, atol=1e-12)


def _loss(sys_, flow):
    X = flow.X
    return (X[..., 6, :] ** 2).sum() + X[..., -1, 1] * 3 + effort_integral(sys_, flow).sum() \
        + torch.sin(flow.stage_q).sum()


@pytest.mark.parametrize("method", METHODS)
def test_discrete_adjoint_equals_autograd(method):
    sys_ = system()
    grid = code_grid(12, dtype=torch.float64)
    x0 = X0.clone().requires_grad_(True)
    T = torch.tensor(1.5, dtype=torch.float64, requires_grad=True)
    params = [p for p in sys_.potential.parameters()][:-1]  # the output bias does not enter the field
    grads = []
    for adjoint in ("discrete", "autograd"):
        flow = hamiltonian_flow(sys_, x0, T, grid, method=method, adjoint=adjoint)
        grads.append(torch.autograd.grad(_loss(sys_, flow), [x0, T, *params]))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_batched_initial_states():
    sys_ = system()
    grid = code_grid(12, dtype=torch.float64)
    x0 = torch.stack([X0, X0 + 0.1, X0 - 0.2]).reshape(3, 1, 4)
    flow = hamiltonian_flow(sys_, x0, 1.2, grid)
    assert flow.X.shape == (3, 1, grid.numel(), 4)
    single = hamiltonian_flow(sys_, x0[1, 0], 1.2, grid, solver="sequential")
    torch.testing.assert_close(flow.X[1, 0], single.X, rtol=0, atol=1e-12)


def test_training_loss_gradient_matches_finite_differences():
    cfg = get_config("tiny", dtype="float64", grid_points=24, samples=5)
    sys_ = system(hidden=6)
    target = torch.tensor([1.0, 0.0, -1.0], dtype=torch.float64)
    grid = code_grid(cfg.grid_points, dtype=torch.float64)
    w = sys_.potential.net[2].weight  # hidden -> hidden

    def J(T, w_shift=None):
        if w_shift is not None:
            with torch.no_grad():
                w.add_(w_shift)
        flow = hamiltonian_flow(sys_, X0, T, grid)
        out = eigenmode_loss(sys_, flow, torch.as_tensor(T), target, cfg, beta=0.7,
                             generator=torch.Generator().manual_seed(3)).total
        if w_shift is not None:
            with torch.no_grad():
                w.sub_(w_shift)
        return out

    T = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
    L = J(T)
    gT, gw = torch.autograd.grad(L, [T, w])
    eps = 1e-6
    with torch.no_grad():
        Tp, Tm = torch.tensor(1.3 + eps, dtype=torch.float64), torch.tensor(1.3 - eps, dtype=torch.float64)
        fdT = (J(Tp) - J(Tm)) / (2 * eps)
        E = torch.zeros_like(w)
        E[1, 2] = eps
        fdw = (J(1.3, E) - J(1.3, -E)) / (2 * eps)
    assert abs(float(gT) - float(fdT)) <= 1e-6 * max(1.0, abs(float(fdT)))
    assert abs(float(gw[1, 2]) - float(fdw)) <= 1e-6 * max(1.0, abs(float(fdw)))


def test_float32_follows_float64():
    s64 = system()
    s32 = copy.deepcopy(s64).to(torch.float32)
    grid = code_grid(30)
    with torch.no_grad():
        f32 = hamiltonian_flow(s32, X0.float(), 1.5, grid)
        f64 = hamiltonian_flow(s64, X0, 1.5, grid.double())
    assert f32.X.dtype == torch.float32
    assert float((f32.X.double() - f64.X).abs().max()) < 1e-4


@pytest.mark.parametrize("method,order", [
    pytest.param("euler", 1, marks=pytest.mark.slow), ("midpoint", 2),
    pytest.param("implicit_midpoint", 2, marks=pytest.mark.slow), ("rk4", 4)])
def test_convergence_order(method, order):
    """Global error at s = 1 against solve_ivp (rtol = atol = 1e-12) halves like h^order."""
    sys_ = system(potential=False)
    x0 = torch.tensor([0.6, -0.4, 0.0, 0.0], dtype=torch.float64)
    T = 0.6
    ref = integrate_ivp(sys_, x0, T, rtol=1e-12, atol=1e-12).y[:, -1]
    steps = {1: (64, 128, 256), 2: (12, 24, 48), 4: (6, 12, 24)}[order]
    errs = []
    for N in steps:
        flow = hamiltonian_flow(sys_, x0, T, uniform_grid(N, dtype=torch.float64), method=method, solver="sequential")
        errs.append(np.abs(flow.X[-1].numpy() - ref).max())
    rates = np.log2(np.array(errs[:-1]) / np.array(errs[1:]))
    assert np.all(np.abs(rates - order) < 0.35), (errs, rates)


def test_errors():
    sys_ = system()
    with pytest.raises(ShapeError):
        hamiltonian_flow(sys_, torch.zeros(3, dtype=torch.float64), 1.0)
    with pytest.raises(ShapeError):
        hamiltonian_flow(sys_, X0, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError):
        hamiltonian_flow(sys_, X0, 1.0, method="leapfrog")
    with pytest.raises(ShapeError):
        uniform_grid(7)
