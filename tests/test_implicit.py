"""The Newton root-find layer: roots, implicit-function-theorem gradients, failure reports."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from diffmech.errors import ConvergenceError, ShapeError
from diffmech.implicit import NewtonStatus, batched_jacobian, newton_solve

DT = torch.float64


def cube_root_residual(x, a):
    return x**3 - a


def coupled_residual(x, A, b):
    """``A x + 0.3 sin(x) - b``: a smooth, uniquely solvable system for diagonally dominant A."""
    return (A @ x[..., None])[..., 0] + 0.3 * torch.sin(x) - b


def _coupled_problem(batch=(4,), n=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    A = 2.0 * torch.eye(n, dtype=DT) + 0.3 * torch.randn(*batch, n, n, generator=g, dtype=DT)
    b = torch.randn(*batch, n, generator=g, dtype=DT)
    return A, b


def test_scalar_root_known_solution():
    a = torch.tensor([[0.5], [8.0], [27.0], [-3.0]], dtype=DT)
    x = newton_solve(cube_root_residual, torch.ones_like(a), (a,), tol=1e-13)
    expected = torch.sign(a) * a.abs() ** (1 / 3)
    assert torch.allclose(x, expected, atol=1e-12, rtol=0)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_vector_root_batch_shapes(batch):
    A, b = _coupled_problem(batch)
    x = newton_solve(coupled_residual, torch.zeros_like(b), (A, b), tol=1e-13)
    assert x.shape == b.shape
    assert coupled_residual(x, A, b).abs().max() < 1e-12


def test_analytic_jacobian_matches_forward_mode():
    A, b = _coupled_problem()

    def jac(x, A, b):
        return A + torch.diag_embed(0.3 * torch.cos(x))

    x = torch.randn(4, 3, dtype=DT)
    J_ad = batched_jacobian(lambda y: coupled_residual(y, A, b), x)
    assert torch.allclose(J_ad, jac(x, A, b), atol=1e-14, rtol=0)
    x1 = newton_solve(coupled_residual, torch.zeros_like(b), (A, b), jacobian=jac, tol=1e-13)
    x2 = newton_solve(coupled_residual, torch.zeros_like(b), (A, b), tol=1e-13)
    assert torch.allclose(x1, x2, atol=1e-13, rtol=0)


def test_gradcheck_implicit_gradient():
    A, b = _coupled_problem(batch=(2,))
    A.requires_grad_(True)
    b.requires_grad_(True)
    f = lambda A, b: newton_solve(coupled_residual, torch.zeros_like(b), (A, b), tol=1e-14)
    assert torch.autograd.gradcheck(f, (A, b), eps=1e-6, atol=1e-8, rtol=1e-6)


def _unrolled_newton(fn, x0, params, iters):
    """Plain Newton iterations recorded by autograd (reference for the implicit gradient)."""
    x = x0
    for _ in range(iters):
        J = torch.func.vmap(torch.func.jacrev(lambda y, *p: fn(y, *p)))(x, *params)
        x = x - torch.linalg.solve(J, fn(x, *params)[..., None])[..., 0]
    return x


def test_implicit_gradient_equals_unrolled_newton():
    A, b = _coupled_problem(batch=(5,), n=4, seed=3)
    A.requires_grad_(True)
    b.requires_grad_(True)
    g = torch.randn(5, 4, dtype=DT, generator=torch.Generator().manual_seed(9))
    x_imp = newton_solve(coupled_residual, torch.zeros_like(b), (A, b), tol=1e-14)
    gi = torch.autograd.grad((x_imp * g).sum(), (A, b))
    x_unr = _unrolled_newton(coupled_residual, torch.zeros_like(b), (A, b), 12)
    gu = torch.autograd.grad((x_unr * g).sum(), (A, b))
    assert torch.allclose(x_imp, x_unr, atol=1e-13, rtol=0)
    for a, c in zip(gi, gu):
        assert (a - c).abs().max() < 1e-11


class _CapturedResidual(nn.Module):
    """A residual whose parameters are read from the module, not passed as arguments."""

    def __init__(self):
        super().__init__()
        self.k = nn.Parameter(torch.tensor([1.5, 0.7, 2.0], dtype=DT))
        self.c = nn.Parameter(torch.tensor(0.4, dtype=DT))

    def forward(self, x, b):
        return self.k * x + self.c * x**3 - b


def test_gradients_reach_captured_module_parameters():
    m = _CapturedResidual()
    b = torch.tensor([[0.3, -1.0, 2.0], [1.0, 0.5, -0.2]], dtype=DT, requires_grad=True)
    x = newton_solve(m, torch.zeros_like(b), (b,), tol=1e-14)  # module: adjoint_params default
    loss = (x**2).sum()
    grads = torch.autograd.grad(loss, [b, m.k, m.c])
    # Reference: autograd through unrolled Newton.
    xu = _unrolled_newton(lambda y, bb: m(y, bb), torch.zeros_like(b), (b,), 15)
    ref = torch.autograd.grad((xu**2).sum(), [b, m.k, m.c])
    for a, c in zip(grads, ref):
        assert (a - c).abs().max() < 1e-12
    # A plain closure needs adjoint_params explicitly; without them only b gets a gradient.
    fn = lambda y, bb: m(y, bb)
    x2 = newton_solve(fn, torch.zeros_like(b), (b,), adjoint_params=list(m.parameters()), tol=1e-14)
    g2 = torch.autograd.grad((x2**2).sum(), [m.k, m.c])
    for a, c in zip(g2, ref[1:]):
        assert (a - c).abs().max() < 1e-12


def test_convergence_error_names_context_residual_and_iterations():
    a = torch.tensor([[8.0], [1e6]], dtype=DT)
    with pytest.raises(ConvergenceError) as err:
        newton_solve(cube_root_residual, torch.ones_like(a), (a,), tol=1e-12, max_iter=3, context="step 17")
    msg = str(err.value)
    assert "step 17" in msg
    assert "3 iterations" in msg
    assert "residual norm" in msg
    assert "(1,)" in msg  # the batch element that failed


def test_status_instead_of_raise():
    a = torch.tensor([[8.0], [1e6]], dtype=DT)
    x, status = newton_solve(cube_root_residual, torch.ones_like(a), (a,), tol=1e-12, max_iter=3,
                             raise_on_failure=False)
    assert isinstance(status, NewtonStatus)
    assert status.converged.tolist() == [False, False] or status.converged.tolist() == [True, False]
    assert not bool(status.converged[1])
    assert status.iterations == 3
    assert status.residual_norm[1] > 1.0
    x, status = newton_solve(cube_root_residual, torch.ones_like(a), (a,), tol=1e-9, max_iter=100,
                             raise_on_failure=False)
    assert bool(status.converged.all())
    assert torch.allclose(x[:, 0], torch.tensor([2.0, 100.0], dtype=DT), atol=1e-9)


def test_non_finite_residual_is_reported():
    a = torch.tensor([[4.0]], dtype=DT)
    with pytest.raises(ConvergenceError, match="not finite"):
        newton_solve(lambda x, a: torch.log(x) - a, -torch.ones_like(a), (a,), max_iter=5, context="probe")


def test_bad_residual_shape():
    with pytest.raises(ShapeError, match="square system"):
        newton_solve(lambda x: x.sum(-1, keepdim=True), torch.zeros(2, 3, dtype=DT))


def test_no_graph_kept_in_forward():
    """The forward iterations must not hold a graph: the output's only node is the implicit one."""
    A, b = _coupled_problem()
    b.requires_grad_(True)
    x = newton_solve(coupled_residual, torch.zeros_like(b), (A, b), tol=1e-13)
    assert type(x.grad_fn).__name__ == "_ImplicitSolveBackward"
    assert x.grad_fn.next_functions[0][0] is None  # x0 is not a differentiable input
