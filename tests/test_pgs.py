"""The contact solver alone: its solution against complementarity, its implicit gradient against
central differences of converged solves, independence of the gradient from the warm start."""

from __future__ import annotations

import pytest
import torch

from diffmech.contact.pgs import pgs

F64 = torch.float64


def _problem(seed: int, K: int = 3, B: int = 2):
    g = torch.Generator().manual_seed(seed)
    J = torch.randn(B, 3 * K, 3 * K + 2, generator=g, dtype=F64)
    A = J @ J.transpose(-1, -2) / (3 * K) + 0.05 * torch.eye(3 * K, dtype=F64)
    c = torch.randn(B, 3 * K, generator=g, dtype=F64)
    c[:, 0::3] -= 0.5  # most normals approaching: a mix of contact modes
    mu = 0.2 + 0.8 * torch.rand(B, K, generator=g, dtype=F64)
    return A, c, mu


def _solve(A, c, mu, lam0=None):
    return pgs(A, c, mu, iterations=5000, tol=1e-15, check_every=1, lam0=lam0)


@pytest.mark.parametrize("seed", range(6))
def test_solution_is_complementary(seed):
    A, c, mu = _problem(seed)
    res = _solve(A, c, mu)
    lam = res.lam
    w = ((A @ lam.reshape(2, -1, 1))[..., 0] + c).reshape(lam.shape)
    assert res.unconverged == 0 and res.residual <= 64 * torch.finfo(F64).eps
    assert (lam[..., 0] >= 0).all() and (w[..., 0] >= -1e-9).all()
    assert (lam[..., 0] * w[..., 0]).abs().max() < 1e-9
    assert (lam[..., 1:].norm(dim=-1) <= mu * lam[..., 0] + 1e-12).all()


@pytest.mark.parametrize("seed", range(6))
def test_implicit_gradient_matches_finite_differences_and_ignores_the_warm_start(seed):
    A, c, mu = _problem(seed)
    weights = torch.randn(2, 3, 3, generator=torch.Generator().manual_seed(100 + seed), dtype=F64)

    def loss(A, c, mu, lam0=None):
        return (_solve(A, c, mu, lam0).lam * weights).sum()

    grads = []
    for lam0 in (None, _solve(A, c, mu).lam * 1.3):
        A_, c_, mu_ = (t.clone().requires_grad_(True) for t in (A, c, mu))
        loss((A_ + A_.transpose(-1, -2)) / 2, c_, mu_, lam0).backward()
        grads.append((A_.grad, c_.grad, mu_.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    # central differences of converged solves, along random directions
    eps = 1e-6
    for k, t in enumerate((A, c, mu)):
        d = torch.randn(t.shape, generator=torch.Generator().manual_seed(7 + k), dtype=F64)
        if k == 0:
            d = (d + d.transpose(-1, -2)) / 2
        args = [A, c, mu]
        plus, minus = list(args), list(args)
        plus[k], minus[k] = t + eps * d, t - eps * d
        fd = (loss(*plus) - loss(*minus)) / (2 * eps)
        analytic = (grads[0][k] * d).sum()
        assert float(analytic) == pytest.approx(float(fd), rel=1e-5, abs=1e-8)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_sweeps_equal_the_torch_sweeps(dtype, monkeypatch):
    from diffmech.contact import pgs_native
    from diffmech.contact.pgs_native import native_sweeps

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)  # the suite runs with native kernels off

    A, c, mu = (t.to(dtype) for t in _problem(3, K=4, B=1))
    if native_sweeps(A, c, mu, 1, 0.0, 1, None, 0) is None:
        pytest.skip("no C compiler: the torch sweeps run")
    # (the C code may contract a * b + c into one rounding, so compare to rounding, and stop on a
    # tolerance above it)
    warm = _solve(A.double(), c.double(), mu.double()).lam.to(dtype)
    for iterations, lam0, stop in ((1, None, 0.0), (7, None, 0.0), (30, warm, 1e-4)):
        a = pgs(A, c, mu, iterations=iterations, tol=stop, lam0=lam0, native=True, newton=0)
        b = pgs(A, c, mu, iterations=iterations, tol=stop, lam0=lam0, native=False, newton=0)
        tol = 1e-12 if dtype == torch.float64 else 1e-5
        torch.testing.assert_close(a.lam, b.lam, rtol=tol, atol=tol)
        assert a.iterations == b.iterations


def test_closed_form_residual_jacobian_equals_autograd():
    """The implicit backward's ``dF/dlam`` (closed form) against autograd through the residual, on
    problems whose solutions have separated, sticking and sliding blocks."""
    from diffmech.contact.pgs import _modes, _residual, _residual_jacobian

    seen = torch.zeros(3, dtype=torch.bool)
    for seed in range(12):
        A, c, mu = _problem(seed, K=4)
        lam = _solve(A, c, mu).lam
        modes = _modes(lam, A, c, mu)
        active, sliding, _ = modes
        seen |= torch.stack([(~active).any(), (active & ~sliding).any(), sliding.any()])
        J, _, _ = _residual_jacobian(lam, A, c, mu, *modes)
        def one(x, A, c, mu, *m):
            return _residual(x.reshape(4, 3)[None], A[None], c[None], mu[None], *(t[None] for t in m)).reshape(-1)

        ref = torch.func.vmap(torch.func.jacrev(one))(lam.reshape(2, -1), A, c, mu, *modes)
        torch.testing.assert_close(J, ref, rtol=1e-12, atol=1e-12)
    assert seen.all()  # every mode occurred


def test_implicit_backward_equals_autograd_through_the_residual():
    """The closed-form parameter gradients of the implicit backward against the implicit function
    theorem done by autograd (the Jacobian of the residual and its VJP w.r.t. ``A``, ``c``, ``mu``)."""
    from diffmech.contact.pgs import _modes, _residual

    for seed in range(12):
        A, c, mu = _problem(seed, K=4)
        lam = _solve(A, c, mu).lam
        g = torch.randn(lam.shape, generator=torch.Generator().manual_seed(seed), dtype=F64)
        A_, c_, mu_ = (t.clone().requires_grad_(True) for t in (A, c, mu))
        (_solve(A_, c_, mu_).lam * g).sum().backward()
        modes = _modes(lam, A, c, mu)
        x = lam.reshape(2, -1).clone().requires_grad_(True)
        f = _residual(x.reshape(2, 4, 3), A, c, mu, *modes).reshape(2, -1)
        J = torch.stack([torch.autograd.grad(f[:, i].sum(), x, retain_graph=True)[0] for i in range(12)], 1)
        u = (torch.linalg.pinv(J.transpose(-1, -2)) @ g.reshape(2, 12, 1))[..., 0]
        Ar, cr, mur = (t.clone().requires_grad_(True) for t in (A, c, mu))
        f = _residual(lam, Ar, cr, mur, *modes).reshape(2, -1)
        ref = torch.autograd.grad(f, (Ar, cr, mur), -u)
        for got, want in zip((A_.grad, c_.grad, mu_.grad), ref):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)
