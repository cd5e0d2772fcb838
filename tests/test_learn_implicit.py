"""diffmech.implicit.newton_solve with a fused residual-and-Jacobian (the extension E2E-SyMo uses)."""

from __future__ import annotations

import pytest
import torch

from diffmech.errors import ShapeError
from diffmech.implicit import newton_solve

DT = torch.float64


def residual(x, A, b):
    return (A @ x[..., None])[..., 0] + 0.3 * torch.sin(x) - b


class Counted:
    """``(r, J)`` of :func:`residual`, counting its calls."""

    def __init__(self):
        self.calls = 0

    def __call__(self, x, A, b):
        self.calls += 1
        return residual(x, A, b), A + torch.diag_embed(0.3 * torch.cos(x))


def problem(batch=(5,), n=3, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    A = 2.0 * torch.eye(n, dtype=DT) + 0.3 * torch.randn(*batch, n, n, generator=g, dtype=DT)
    b = torch.randn(*batch, n, generator=g, dtype=DT)
    return A.requires_grad_(requires_grad), b.requires_grad_(requires_grad)


@pytest.mark.parametrize("update", ["newton", "chord"])
@pytest.mark.parametrize("n", [1, 3])
def test_fused_root_and_gradient_equal_the_plain_solve(update, n):
    A, b = problem(n=n, requires_grad=True)
    x0 = torch.zeros_like(b)
    rj = Counted()
    x1 = newton_solve(residual, x0, (A, b), tol=1e-13, residual_and_jacobian=rj, update=update)
    x2 = newton_solve(residual, x0, (A, b), tol=1e-13)
    assert torch.allclose(x1, x2, atol=1e-12)
    w = torch.randn_like(x1)
    g1 = torch.autograd.grad((x1 * w).sum(), (A, b))
    g2 = torch.autograd.grad((x2 * w).sum(), (A, b))
    for a, c in zip(g1, g2):
        assert torch.allclose(a, c, atol=1e-11)


def test_fused_newton_reuses_the_root_jacobian_and_chord_evaluates_it_once():
    A, b = problem(requires_grad=True)
    rj = Counted()
    x = newton_solve(residual, torch.zeros_like(b), (A, b), tol=1e-13, residual_and_jacobian=rj)
    forward_calls = rj.calls
    x.sum().backward()
    assert rj.calls == forward_calls  # the backward pass used the Jacobian saved at the root
    rj = Counted()
    with torch.no_grad():
        xc, st = newton_solve(residual, torch.zeros_like(b), (A, b), tol=1e-13, residual_and_jacobian=rj,
                              update="chord", raise_on_failure=False)
    assert st.converged.all() and rj.calls == 1 and st.iterations > 2
    # warm start at the root: no Jacobian at all
    rj = Counted()
    with torch.no_grad():
        newton_solve(residual, xc, (A, b), tol=1e-10, residual_and_jacobian=rj, update="chord")
    assert rj.calls == 0


def test_fused_non_finite_element_stops_alone():
    A, b = problem()
    b = b.clone()
    b[2, 0] = float("nan")
    x, st = newton_solve(residual, torch.zeros_like(b), (A, b), tol=1e-12, residual_and_jacobian=Counted(),
                         raise_on_failure=False)
    assert st.converged.tolist() == [True, True, False, True, True]
    assert residual(x, A, b)[st.converged].abs().max() < 1e-12


def test_fused_shape_error():
    A, b = problem()
    with pytest.raises(ShapeError, match="Jacobian"):
        newton_solve(residual, torch.zeros_like(b), (A, b), residual_and_jacobian=lambda x, A, b: (residual(x, A, b),
                                                                                                   A[..., :2, :]))


def test_weighted_residual_serves_the_backward_pass():
    A, b = problem(n=3, requires_grad=True)
    x0 = torch.zeros_like(b)
    calls = []

    def weighted(x, w, A_, b_):
        calls.append(1)
        return (w * residual(x, A_, b_)).sum()

    x1 = newton_solve(residual, x0, (A, b), tol=1e-13, residual_and_jacobian=Counted(), weighted_residual=weighted)
    x2 = newton_solve(residual, x0, (A, b), tol=1e-13)
    w = torch.randn_like(x1)
    g1 = torch.autograd.grad((x1 * w).sum(), (A, b))
    assert calls == [1]
    g2 = torch.autograd.grad((x2 * w).sum(), (A, b))
    for a, c in zip(g1, g2):
        assert torch.allclose(a, c, atol=1e-11)
