"""diffmech.learn models: network jets, DEL residual and Jacobian, implicit gradients, Newton status."""

from __future__ import annotations

import pytest
import torch

from diffmech.implicit import batched_jacobian
from diffmech.learn import LNODE, MODEL_NAMES, E2ESyMo, LagrangianNet, StepSamples, SyMo, build_model
from diffmech.learn.models import _ode_step

DT = torch.float64
MASKS = [(True,), (False, True), (True, True, False)]


def _batch(n, B=6, seed=0, dtype=DT, nu=None):
    g = torch.Generator().manual_seed(seed)
    nu = n if nu is None else nu
    q_prev = torch.randn(B, n, generator=g, dtype=DT)
    q = q_prev + 0.05 * torch.randn(B, n, generator=g, dtype=DT)
    q_next = 2 * q - q_prev + 1e-3 * torch.randn(B, n, generator=g, dtype=DT)
    v = (q - q_prev) / 0.1
    u = torch.randn(B, nu, generator=g, dtype=DT)
    return StepSamples(q_prev, q, v, q_next, (q_next - q) / 0.1, u, u, u).to(dtype=dtype)


@pytest.mark.parametrize("mask", MASKS + [(True,)])
@pytest.mark.parametrize("inertia", ["paper", "cholesky"])
def test_network_jets_match_torch_func(mask, inertia):
    torch.manual_seed(0)
    net = LagrangianNet(mask, width=16, inertia=inertia).double()
    q = torch.randn(5, len(mask), dtype=DT)
    V, dV, d2V, H, dH, d2H = net.jet(q, 2)

    def fV(x):
        return net(x)[1]

    def fH(x):
        return net(x)[0]

    assert torch.allclose(dV, torch.func.vmap(torch.func.jacrev(fV))(q), atol=1e-13)
    assert torch.allclose(d2V, torch.func.vmap(torch.func.hessian(fV))(q), atol=1e-13)
    assert torch.allclose(dH, torch.func.vmap(torch.func.jacrev(fH))(q).permute(0, 3, 1, 2), atol=1e-13)
    HH = torch.func.vmap(torch.func.jacrev(torch.func.jacrev(fH)))(q).permute(0, 3, 4, 1, 2)
    assert torch.allclose(d2H, HH, atol=1e-12)
    if len(mask) == 1:
        Vs, dVs, d2Vs, Hs, dHs, d2Hs = net.jet_scalar(q, 2)
        for a, b in ((Vs, V), (dVs, dV[..., 0]), (d2Vs, d2V[..., 0, 0]), (Hs, H[..., 0, 0]), (dHs, dH[..., 0, 0, 0]),
                     (d2Hs, d2H[..., 0, 0, 0, 0])):
            assert torch.allclose(a, b, atol=1e-14)


def test_seed_parameter_counts_and_seeded_init():
    """The seed's parameter counts (spec section 1.5) and identical weights under the same seed."""
    counts = {("node-rk4", (True,), 128): 17281, ("symo", (True,), 128): 17154,
              ("node-rk4", (False, True), 256): 68098, ("e2e-symo", (False, True), 256): 67844}
    for (name, mask, w), expected in counts.items():
        B = torch.ones(len(mask), 1) if len(mask) == 1 else torch.tensor([[1.0], [0.0]])
        m = build_model(name, mask, 0.1, width=w, input_matrix=B)
        assert sum(p.numel() for p in m.parameters()) == expected
    torch.manual_seed(230)
    a = build_model("e2e-symo", (True,), 0.1)
    torch.manual_seed(230)
    b = build_model("e2e-symo", (True,), 0.1)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    # the trunk is Xavier-uniform with gain 5/3 and zero biases
    bound = 5 / 3 * (6 / (2 + 128)) ** 0.5
    assert a.net.trunk.l1.weight.abs().max() <= bound and a.net.trunk.l1.bias.abs().max() == 0


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dissipation", [False, True])
def test_del_residual_jacobian_and_parts(mask, dissipation):
    torch.manual_seed(1)
    n = len(mask)
    m = E2ESyMo(mask, 0.1, 16, dissipation=dissipation).double()
    b = _batch(n)
    c, _ = m.known_part(b.q_prev, b.q, b.u_prev, b.u, b.u_next)
    g, J = m.residual_and_jacobian(b.q_next, b.q, c)
    assert torch.allclose(g, m.residual(b.q_next, b.q, c), atol=1e-13)
    assert torch.allclose(g, m.del_residual(b.q_next, b.q_prev, b.q, b.u_prev, b.u, b.u_next), atol=1e-13)
    J_ad = batched_jacobian(lambda x: m.residual(x, b.q, c), b.q_next)
    assert torch.allclose(J, J_ad, atol=1e-12)

    # against autograd through the discrete Lagrangian (the seed's construction)
    def Ld(a, x):
        H, V = m.net(0.5 * (a + x))
        vb = (x - a) / m.h
        return m.h * (0.5 * (vb[..., None, :] @ H @ vb[..., :, None])[..., 0, 0] - V)

    qk = b.q.clone().requires_grad_(True)
    grad = torch.autograd.grad((Ld(b.q_prev, qk) + Ld(qk, b.q_next)).sum(), qk)[0]
    forces = 0.25 * m.h * (b.u_prev + 2 * b.u + b.u_next)
    if dissipation:
        D = m.dissipation.matrix()
        forces = forces - 0.5 * m.h * ((b.q - b.q_prev) / m.h + (b.q_next - b.q) / m.h) @ D.T
    assert torch.allclose(g, grad + forces, atol=1e-12)


def _unrolled_root(m: E2ESyMo, b: StepSamples, iters=8):
    """Newton's iterations recorded by autograd (the oracle for the implicit gradient); the residual and
    its Jacobian are plain differentiable tensor code, checked against forward-mode AD above."""
    c, _ = m.known_part(b.q_prev, b.q, b.u_prev, b.u, b.u_next)
    x = (2 * b.q - b.q_prev).detach()
    for _ in range(iters):
        g, J = m.residual_and_jacobian(x, b.q, c)
        x = x - torch.linalg.solve(J, g)
    return x


@pytest.fixture
def flush_denormals():
    # backpropagating through Newton iterations past convergence produces subnormal float64
    # values, on which x86 arithmetic is ~100x slower
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


@pytest.mark.parametrize("mask", MASKS[:2] + [pytest.param(MASKS[2], marks=pytest.mark.slow)])
def test_e2e_implicit_gradient_vs_unrolled_and_finite_differences(mask, flush_denormals):
    torch.manual_seed(2)
    n = len(mask)
    m = E2ESyMo(mask, 0.1, 8, tol=1e-13, max_iter=50).double()
    b = _batch(n, B=4, seed=3)
    loss, info = m.objective(b)
    assert info["failures"] == 0
    params = list(m.parameters())
    g_ift = torch.autograd.grad(loss, params)
    loss_u = (_unrolled_root(m, b) - b.q_next).square().mean()
    g_unr = torch.autograd.grad(loss_u, params)
    for a, c in zip(g_ift, g_unr):
        assert torch.allclose(a, c, rtol=1e-7, atol=1e-12)
    # central differences on a few weights
    W = m.net.trunk.l2.weight
    gW = g_ift[[i for i, p in enumerate(params) if p is W][0]]
    eps = 1e-6
    for i, j in [(0, 0), (3, 5), (7, 2)]:
        with torch.no_grad():
            W[i, j] += eps
            lp = m.objective(b)[0]
            W[i, j] -= 2 * eps
            lm = m.objective(b)[0]
            W[i, j] += eps
        fd = (lp - lm) / (2 * eps)
        assert abs(float(fd) - float(gW[i, j])) <= 1e-6 * abs(float(fd)) + 1e-12


def test_lnode_acceleration_is_euler_lagrange():
    for mask, inertia in [((True,), "paper"), ((True,), "cholesky"), ((False, True), "paper"), ((True,) * 3, "paper")]:
        n = len(mask)
        torch.manual_seed(3)
        m = LNODE(mask, 0.1, 16, inertia=inertia, dissipation=True).double()
        g = torch.Generator().manual_seed(4)
        q, v, u = (torch.randn(5, n, generator=g, dtype=DT) for _ in range(3))

        def L(qq, vv, net=m.net):
            H, V = net(qq)
            return 0.5 * (vv[..., None, :] @ H @ vv[..., :, None])[..., 0, 0] - V

        M = torch.func.vmap(torch.func.hessian(L, argnums=1))(q, v)
        Lvq = torch.func.vmap(torch.func.jacfwd(torch.func.grad(L, argnums=1), argnums=0))(q, v)
        Lq = torch.func.vmap(torch.func.grad(L, argnums=0))(q, v)
        rhs = u - v @ m.dissipation.matrix().T - (Lvq @ v[..., None])[..., 0] + Lq
        assert torch.allclose(m.acceleration(q, v, u), torch.linalg.solve(M, rhs), atol=1e-12)


def test_rk4_variants_are_fourth_order():
    f = lambda q, v: -torch.sin(q)  # noqa: E731
    q0, v0 = torch.tensor([1.0], dtype=DT), torch.tensor([0.0], dtype=DT)
    ref = q0.clone(), v0.clone()
    for _ in range(1000):
        ref = _ode_step(f, *ref, 1e-3, "rk4")
    for method, order in [("rk4", 4), ("rk4-38", 4), ("midpoint", 2)]:
        errs = []
        for h in (0.1, 0.05):
            s = (q0, v0)
            for _ in range(round(1.0 / h)):
                s = _ode_step(f, *s, h, method)
            errs.append(float((s[0] - ref[0]).abs()))
        assert abs(torch.log2(torch.tensor(errs[0] / errs[1])) - order) < 0.35, (method, errs)


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_every_model_forward_backward_predict_rollout(name, dtype):
    torch.manual_seed(5)
    n = 2
    m = build_model(name, (False, True), 0.05, width=16, input_matrix=torch.tensor([[1.0], [0.0]])).to(dtype)
    b = _batch(n, B=8, dtype=dtype, nu=1)
    loss, _ = m.objective(b)
    assert loss.dtype == dtype and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in m.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert any(float(g.abs().max()) > 0 for g in grads)
    pred = m.predict(b)
    assert pred.q.shape == (8, n) and pred.q.dtype == dtype
    u = torch.zeros(3, 12, 1, dtype=dtype)
    r = m.rollout(b.q_prev[:3], b.q[:3], b.v[:3], u, 10)
    assert r.q.shape == (3, 10, n) and r.v.shape == (3, 10, n) and r.v_consistent.shape == (3, 10, n)
    assert torch.isfinite(r.q).all()


def test_newton_status_reports_non_convergence():
    """A solve that cannot converge is reported per sample, left out of the E2E loss and counted in rollouts."""
    torch.manual_seed(6)
    m = E2ESyMo((True,), 0.1, 16).double()
    b = _batch(1, B=8, seed=7)
    x, st = m.solve(b.q_prev, b.q, b.u_prev, b.u, b.u_next, tol=1e-30, max_iter=1)
    assert not st.converged.any() and st.iterations == 1 and (st.residual_norm > 0).all()
    # a NaN input makes that sample fail, the others converge
    q_bad = b.q.clone()
    q_bad[3] = float("nan")
    x, st = m.solve(b.q_prev, q_bad, b.u_prev, b.u, b.u_next)
    assert st.converged.tolist() == [True, True, True, False, True, True, True, True]
    bad = StepSamples(b.q_prev, q_bad, b.v, b.q_next, b.v_next, b.u_prev, b.u, b.u_next)
    loss, info = m.objective(bad)
    assert info["failures"] == 1 and torch.isfinite(loss)
    ok = torch.arange(8) != 3
    loss_ok, _ = m.objective(bad.index(ok))
    assert torch.allclose(loss, loss_ok)
    r = m.rollout(b.q_prev[:2], b.q[:2], b.v[:2], torch.zeros(2, 7, 1, dtype=DT), 5, tol=1e-30, max_iter=1)
    assert r.failures.tolist() == [5, 5]


def test_straggler_phase_and_float32_tolerance_floor():
    torch.manual_seed(8)
    m = SyMo((True,), 0.1, 16)
    b = _batch(1, B=16, seed=9, dtype=torch.float32)
    # large unwrapped angles: float32 cannot reach 1e-5 in the residual, the per-sample floor accepts
    # the round-off level instead
    shift = 40.0
    bb = StepSamples(b.q_prev + shift, b.q + shift, b.v, b.q_next + shift, b.v_next, b.u_prev, b.u, b.u_next)
    x, st = m.solve(bb.q_prev, bb.q, bb.u_prev, bb.u, bb.u_next)
    assert st.converged.all()
    c, H = m.known_part(bb.q_prev, bb.q, bb.u_prev, bb.u, bb.u_next)
    tol = m.tolerance(bb.q, H, 1e-5)
    assert (tol > 1e-5).all() and (tol < 1e-3).all()
    # the straggler phase continues only the unconverged samples and merges them back
    m64 = m.double()
    b64 = bb.to(dtype=DT)
    m64.straggler_iter = 1
    x1, st1 = m64.solve(b64.q_prev, b64.q, b64.u_prev, b64.u, b64.u_next, tol=1e-12, max_iter=20)
    m64.straggler_iter = 20
    x2, st2 = m64.solve(b64.q_prev, b64.q, b64.u_prev, b64.u, b64.u_next, tol=1e-12, max_iter=20)
    assert st1.converged.all() and st2.converged.all()
    assert torch.allclose(x1, x2, atol=1e-11)
