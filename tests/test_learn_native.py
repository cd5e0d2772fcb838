"""diffmech.learn.e2e_native: E2E-SyMo's training objective in C against the torch code (the oracle: its jets are
checked against torch.func and its implicit gradient against unrolled Newton and finite differences in
test_learn_models.py), against central differences directly, and on failures, warm starts and fallbacks."""

from __future__ import annotations

import pytest
import torch

from diffmech.dynamics.kernels import native_mode
from diffmech.learn import E2ESyMo, StepSamples, e2e_native, get_system, make_dataset, step_samples
from diffmech.learn.e2e_native import library, native_objective

pytestmark = pytest.mark.skipif(library() is None, reason="no C compiler: the torch code runs")

DT = torch.float64
# translations and angles in every order, 1 to 4 degrees of freedom
MASKS = [(True,), (False,), (False, True), (True, True), (True, True, False), (False, True, False, True)]


@pytest.fixture
def exact_newton(monkeypatch):
    """Every Newton step with the exact Jacobian: the torch code's path, iterate for iterate."""
    monkeypatch.setattr(e2e_native, "QUASI_NEWTON_STEPS", 0)


def _batch(n, B=6, seed=0, dtype=DT, nu=None, step=0.05):
    g = torch.Generator().manual_seed(seed)
    nu = n if nu is None else nu
    q_prev = torch.randn(B, n, generator=g, dtype=DT)
    q = q_prev + step * torch.randn(B, n, generator=g, dtype=DT)
    q_next = 2 * q - q_prev + 1e-3 * torch.randn(B, n, generator=g, dtype=DT)
    u = torch.randn(B, nu, generator=g, dtype=DT)
    return StepSamples(q_prev, q, (q - q_prev) / 0.1, q_next, (q_next - q) / 0.1, u, 0.5 * u, 0.2 * u).to(dtype=dtype)


def _both(make, b, x0=None, scale=1.0):
    """Loss, info and parameter gradients of the C objective and of the torch code, on two equal models."""
    out = []
    for mode in ("auto", "never"):
        m = make()
        with native_mode(mode):
            assert (native_objective(m, b, x0) is not None) == (mode == "auto")
            loss, info = m.objective(b, x0=x0)
        grads = torch.autograd.grad(scale * loss, list(m.parameters()), allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for g, p in zip(grads, m.parameters())]
        out.append((loss.detach(), info, grads))
    return out


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("inertia", ["paper", "cholesky"])
def test_objective_and_gradient_match_the_torch_code(mask, inertia, exact_newton):
    n = len(mask)
    b = _batch(n, B=7, seed=1)

    def make():
        torch.manual_seed(3)
        return E2ESyMo(mask, 0.1, 16, inertia=inertia, tol=1e-11, max_iter=30).double()

    (la, ia, ga), (lt, it, gt) = _both(make, b, scale=2.5)
    assert ia["failures"] == it["failures"] == 0
    assert ia["iterations"] == it["iterations"] and ia["iterations"] >= 1
    assert torch.equal(ia["converged"], it["converged"])
    assert torch.allclose(ia["q"], it["q"], rtol=0, atol=1e-12)
    assert torch.allclose(la, lt, rtol=1e-11, atol=0)
    for a, c in zip(ga, gt):
        assert torch.allclose(a, c, rtol=1e-9, atol=1e-12 * float(c.abs().max() + 1e-30))


@pytest.mark.parametrize("mask", [(True,), (False, True), (True, True, False)])
def test_gradient_matches_central_differences(mask):
    """The implicit gradient (adjoint at the root, the hand-written reverse pass) against central differences of
    the C objective itself, on weights of every layer and on biases."""
    torch.manual_seed(2)
    m = E2ESyMo(mask, 0.1, 8, tol=1e-13, max_iter=50).double()
    b = _batch(len(mask), B=5, seed=3)
    with native_mode("auto"):
        loss, info = m.objective(b)
        assert info["failures"] == 0
        params = dict(m.named_parameters())
        grads = dict(zip(params, torch.autograd.grad(loss, list(params.values()))))
        eps = 1e-6
        for name, idx in [("net.trunk.l1.weight", (3, 1)), ("net.trunk.l1.bias", (5,)),
                          ("net.trunk.l2.weight", (0, 0)), ("net.trunk.l2.weight", (7, 2)),
                          ("net.trunk.l2.bias", (4,)), ("net.head_weight", (1, 6)), ("net.head_bias", (1,))]:
            p = params[name]
            with torch.no_grad():
                p[idx] += eps
                lp = m.objective(b)[0]
                p[idx] -= 2 * eps
                lm = m.objective(b)[0]
                p[idx] += eps
            fd = float(lp - lm) / (2 * eps)
            assert abs(fd - float(grads[name][idx])) <= 1e-6 * abs(fd) + 1e-12, name


@pytest.mark.parametrize("name", ["pendulum", "cartpole"])
def test_float32_on_the_papers_data(name):
    """The seed's systems, widths and data in float32 (the benchmark's setting): the C code's error against
    float64 is the torch code's (the head bias's small gradient cancels: ~2e-4 relative in both)."""
    system = get_system(name)
    p = system.preset
    s = step_samples(make_dataset(name).train, system.n).index(slice(0, 64))
    res = {}
    for mode in ("auto", "never"):
        for dtype in (torch.float32, torch.float64):
            torch.manual_seed(230)
            m = E2ESyMo(system.angle_mask, p.h, p.width, system.input_matrix).to(dtype)
            with native_mode(mode):
                loss, info = m.objective(s.to(dtype=dtype))
            loss.backward()
            assert info["failures"] == 0
            res[mode, dtype] = (loss.detach().double(), info["q"].double(), [q.grad.double() for q in m.parameters()])
    l64, q64, g64 = res["never", torch.float64]
    assert torch.allclose(res["auto", torch.float64][0], l64, rtol=1e-12)
    for mode in ("auto", "never"):
        l32, q32, g32 = res[mode, torch.float32]
        assert torch.allclose(l32, l64, rtol=1e-5) and torch.allclose(q32, q64, atol=1e-5)
    for a, t, c in zip(res["auto", torch.float32][2], res["never", torch.float32][2], g64):
        assert float((a - c).norm()) <= 2 * float((t - c).norm()) + 1e-5 * float(c.norm())


def test_failures_are_left_out_and_warm_starts_agree(exact_newton):
    def make(**kw):
        def f():
            torch.manual_seed(6)
            return E2ESyMo((False, True), 0.1, 16, **kw).double()
        return f

    b = _batch(2, B=8, seed=7)
    # nothing converges: loss zero, gradients zero, every sample counted
    (la, ia, ga), (lt, it, gt) = _both(make(tol=1e-30, max_iter=1), b)
    assert ia["failures"] == it["failures"] == 8 and ia["iterations"] == it["iterations"] == 1
    assert float(la) == float(lt) == 0.0 and all(float(g.abs().max()) == 0 for g in ga)
    # one sample with a NaN: left out, the loss and the gradient are those of the others
    q_bad = b.q.clone()
    q_bad[3, 1] = float("nan")
    bad = StepSamples(b.q_prev, q_bad, b.v, b.q_next, b.v_next, b.u_prev, b.u, b.u_next)
    (la, ia, ga), (lt, it, gt) = _both(make(), bad)
    assert ia["failures"] == it["failures"] == 1 and not ia["converged"][3]
    ok = torch.arange(8) != 3
    (lo, _, go), _ = _both(make(), bad.index(ok))
    assert torch.allclose(la, lt) and torch.allclose(la, lo)
    for a, c, d in zip(ga, gt, go):
        assert torch.isfinite(a).all() and torch.allclose(a, c, atol=1e-13) and torch.allclose(a, d, atol=1e-13)
    # a warm start from the roots: no iteration, the same loss and gradient
    (la, ia, ga), _ = _both(make(tol=1e-12), b)
    (lw, iw, gw), (lwt, iwt, _) = _both(make(tol=1e-12), b, x0=ia["q"])
    assert iw["iterations"] == iwt["iterations"] == 0
    assert torch.allclose(lw, la, rtol=1e-10) and torch.allclose(lw, lwt, rtol=1e-12)
    for a, c in zip(ga, gw):
        assert torch.allclose(a, c, rtol=1e-8, atol=1e-14)


def test_adam_steps_follow_the_torch_code_and_graphs_stay_independent(exact_newton):
    """Ten training steps in float64 give the torch code's weights; a second objective evaluated before the first
    graph's backward pass (the C code reuses its buffers) leaves the first gradient unchanged."""
    b = _batch(2, B=16, seed=9)
    weights = []
    for mode in ("auto", "never"):
        torch.manual_seed(4)
        m = E2ESyMo((False, True), 0.05, 16).double()
        opt = torch.optim.Adam(m.parameters(), lr=1e-3)
        with native_mode(mode):
            for _ in range(10):
                opt.zero_grad()
                m.objective(b)[0].backward()
                opt.step()
        weights.append(torch.cat([p.detach().flatten() for p in m.parameters()]))
    assert torch.allclose(weights[0], weights[1], rtol=1e-9, atol=1e-12)
    torch.manual_seed(4)
    m = E2ESyMo((False, True), 0.05, 16).double()
    with native_mode("auto"):
        l1, _ = m.objective(b)
        g_alone = torch.autograd.grad(l1, list(m.parameters()), retain_graph=True)
        l2, _ = m.objective(b.index(torch.arange(16).flip(0)))
        g_after = torch.autograd.grad(l1, list(m.parameters()))
    for a, c in zip(g_alone, g_after):
        assert torch.equal(a, c)


def test_where_it_applies():
    b = _batch(2, B=4, seed=1)
    with native_mode("auto"):
        assert native_objective(E2ESyMo((False, True), 0.1, 8).double(), b, None) is not None
        assert native_objective(E2ESyMo((False, True), 0.1, 8, dissipation=True).double(), b, None) is None
        assert native_objective(E2ESyMo((False, True), 0.1, 8, line_search=True).double(), b, None) is None
        assert native_objective(E2ESyMo((False, True), 0.1, 8), b, None) is None  # float32 model, float64 data
        assert native_objective(E2ESyMo((True,) * 7, 0.1, 8).double(), _batch(7, B=2), None) is None  # n > NMAX
        m = E2ESyMo((False, True), 0.1, 8).double()
        m.fast_vjp = False
        assert native_objective(m, b, None) is None
        # without gradients: the same loss, no graph
        m = E2ESyMo((False, True), 0.1, 8).double()
        with torch.no_grad():
            loss, info = m.objective(b)
        assert not loss.requires_grad
        assert torch.allclose(loss, m.objective(b)[0].detach(), rtol=1e-12)
    with native_mode("never"):
        assert native_objective(E2ESyMo((False, True), 0.1, 8).double(), b, None) is None


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_scipy_blas_where_torch_exports_none(monkeypatch, dtype):
    """The C code's products through SciPy's BLAS (the fallback where libtorch_cpu exports no ``?gemm_``, as in
    non-MKL builds): the loss and gradient of torch's BLAS, for both precisions and both Newton variants."""
    scipy_gemm, torch_gemm = e2e_native._scipy_gemm(), dict(e2e_native._GEMM)
    assert scipy_gemm is not None and all(scipy_gemm.values())
    b = _batch(3, B=40, seed=5, dtype=dtype)

    def run(mask, gemm):
        monkeypatch.setattr(e2e_native, "_GEMM", gemm)
        monkeypatch.setattr(e2e_native, "_PLANS", {})
        torch.manual_seed(3)
        m = E2ESyMo(mask, 0.1, 24, tol=1e-11 if dtype == torch.float64 else 1e-5, max_iter=30).to(dtype)
        with native_mode("auto"):
            loss, info = m.objective(b)
        return loss.detach(), info["q"], torch.autograd.grad(loss, list(m.parameters()))

    rtol = 1e-10 if dtype == torch.float64 else 1e-4
    for mask in [(False, True, True), (True, False, False)]:  # reverse-pass Newton and the jets' own (n = 1 below)
        (la, qa, ga), (ls, qs, gs) = run(mask, torch_gemm), run(mask, scipy_gemm)
        assert torch.allclose(la, ls, rtol=rtol) and torch.allclose(qa, qs, rtol=0, atol=100 * rtol)
        for a, c in zip(ga, gs):
            assert torch.allclose(a, c, rtol=rtol, atol=rtol * float(a.abs().max()))
    b = _batch(1, B=40, seed=5, dtype=dtype)
    (la, _, ga), (ls, _, gs) = run((True,), torch_gemm), run((True,), scipy_gemm)
    assert torch.allclose(la, ls, rtol=rtol)
    for a, c in zip(ga, gs):
        assert torch.allclose(a, c, rtol=rtol, atol=rtol * float(a.abs().max()))


@pytest.mark.parametrize("mask", [(False, True), (True, True, False)])
def test_quasi_newton_first_step_finds_the_same_root_and_gradient(mask):
    """The default first Newton step without the network's second derivatives (n >= 2): the root to the
    tolerance, and the gradient of the exact adjoint at it."""
    b = _batch(len(mask), B=16, seed=5)

    def make():
        torch.manual_seed(3)
        return E2ESyMo(mask, 0.1, 16, tol=1e-11, max_iter=30).double()

    assert e2e_native.QUASI_NEWTON_STEPS == 1
    (la, ia, ga), (lt, it, gt) = _both(make, b)
    assert ia["failures"] == it["failures"] == 0 and it["iterations"] <= ia["iterations"] <= it["iterations"] + 1
    assert torch.allclose(ia["q"], it["q"], rtol=0, atol=1e-11)
    assert torch.allclose(la, lt, rtol=1e-8)
    for a, c in zip(ga, gt):
        assert torch.allclose(a, c, rtol=1e-7, atol=1e-9 * float(c.abs().max() + 1e-30))


def test_quasi_newton_first_step_keeps_the_iterations_on_the_papers_data():
    system = get_system("cartpole")
    p = system.preset
    s = step_samples(make_dataset("cartpole").train, system.n).index(slice(0, 256))
    torch.manual_seed(230)
    m = E2ESyMo(system.angle_mask, p.h, p.width, system.input_matrix)
    with native_mode("auto"):
        _, quasi = m.objective(s)
        plan_iters = e2e_native._plan(m.net, 256, torch.float32).iters
        steps_quasi = plan_iters.clone()
        e2e_native.QUASI_NEWTON_STEPS = 0
        try:
            _, exact = m.objective(s)
            steps_exact = e2e_native._plan(m.net, 256, torch.float32).iters.clone()
        finally:
            e2e_native.QUASI_NEWTON_STEPS = 1
    assert quasi["failures"] == exact["failures"] == 0
    assert float(steps_quasi.double().mean()) <= float(steps_exact.double().mean()) + 0.3
    assert torch.allclose(quasi["q"], exact["q"], atol=2e-6)


@pytest.mark.parametrize("mask", [(True,), (False, True), (True, True, False)])
def test_solves_without_gradients_predict_and_rollout(mask):
    """``solve`` without gradients (``predict``, rollouts) by the C code: the torch code's roots to the tolerance,
    failures and residual norms reported alike."""
    n = len(mask)
    torch.manual_seed(8)
    m = E2ESyMo(mask, 0.1, 16).double()
    b = _batch(n, B=9, seed=4)
    res = {}
    for mode in ("auto", "never"):
        with native_mode(mode):
            pred = m.predict(b, tol=1e-12, max_iter=30)
            x, st = m.solve(b.q_prev, b.q, b.u_prev, b.u, b.u_next, tol=1e-30, max_iter=2)
            u = 0.1 * torch.randn(3, 12, n, generator=torch.Generator().manual_seed(2), dtype=DT)
            roll = m.rollout(b.q_prev[:3], b.q[:3], b.v[:3], u, 10, tol=1e-12)
        res[mode] = (pred, st, roll)
    (pa, sa, ra), (pt, st_, rt) = res["auto"], res["never"]
    assert pa.converged.all() and pt.converged.all()
    assert torch.allclose(pa.q, pt.q, rtol=0, atol=1e-12)
    assert not sa.converged.any() and not st_.converged.any() and sa.iterations == st_.iterations == 2
    assert (sa.residual_norm > 0).all() and torch.isfinite(sa.residual_norm).all()
    # Newton converges where the torch code's chord iterations may not (10 at most, tol 1e-12)
    assert int(ra.failures.sum()) == 0
    both = rt.failures == 0
    assert both.any() and torch.allclose(ra.q[both], rt.q[both], rtol=0, atol=1e-10)
