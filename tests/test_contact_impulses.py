"""The contact velocity update's hand-written reverse pass (diffmech.contact.impulses) against
autograd through the same chain of torch operations, and against finite differences; the native
implicit pull-back against the torch one."""

from __future__ import annotations

import importlib

import pytest
import torch

from diffmech.contact.impulses import Blocks, assemble, minv, velocity_update
from diffmech.contact.pgs import pgs

pgs_mod = importlib.import_module("diffmech.contact.pgs")
pgs_native = importlib.import_module("diffmech.contact.pgs_native")

RULES = {"dt": 1e-2, "baumgarte": 0.2, "bounce_speed": 1e-2}


def _problem(seed: int, B: int = 3, K: int = 4, groups=((1, 5, (0,)), (2, 3, (8, 5)), (1, 2, (11,)))):
    """Random J, states and a block-diagonal M of several groups (one of them stacked, its blocks
    out of order in the velocity) with gaps, restitutions and frictions that make some blocks
    separate, some stick, some slide and some bounce."""
    g = torch.Generator().manual_seed(seed)
    nv = sum(G * n for G, n, _ in groups)
    Ls = []
    for G, n, _ in groups:
        X = torch.randn(B, G, n, n, generator=g, dtype=torch.float64)
        Ls.append(torch.linalg.cholesky(X @ X.transpose(-1, -2) + n * torch.eye(n, dtype=torch.float64)))
    blocks = Blocks(Ls, [s for _, _, s in groups])
    J = torch.randn(B, 3 * K, nv, generator=g, dtype=torch.float64)
    v = torch.randn(B, nv, generator=g, dtype=torch.float64)
    vf = v + 0.1 * torch.randn(B, nv, generator=g, dtype=torch.float64)
    phi = 0.02 * torch.randn(B, K, generator=g, dtype=torch.float64)
    mu = 0.2 + 0.8 * torch.rand(B, K, generator=g, dtype=torch.float64)
    e = 0.5 * torch.rand(B, K, generator=g, dtype=torch.float64)
    return J, v, vf, phi, mu, e, blocks


def _solver():
    def solve(A, c, mu):
        return pgs(A, c, mu, iterations=20000, tol=1e-15)
    return solve


def _reference(J, v, vf, phi, mu, e, blocks, lam):
    """The same chain by autograd: the torch assembly, the implicit PGS layer, the impulse's velocity."""
    p = assemble(J, v, vf, phi, e, blocks, **RULES)
    res = pgs(p.A, p.c, mu, solution=lam)
    B, K, _ = lam.shape
    return vf + (p.W @ res.lam.reshape(B, 3 * K, 1))[..., 0]


def test_minv_matches_a_dense_solve():
    J, v, vf, phi, mu, e, blocks = _problem(0)
    B, nv = v.shape
    M = torch.zeros(B, nv, nv, dtype=torch.float64)
    for L, starts in zip(blocks.L, blocks.starts):
        n = L.shape[-1]
        for k, s in enumerate(starts):
            M[:, s:s + n, s:s + n] = L[:, k] @ L[:, k].transpose(-1, -2)
    X = torch.randn(B, nv, 5, dtype=torch.float64)
    torch.testing.assert_close(minv(X, blocks), torch.linalg.solve(M, X), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(6))
def test_reverse_pass_matches_autograd(seed):
    J, v, vf, phi, mu, e, blocks = _problem(seed)
    v1, res = velocity_update(J, v, vf, phi, mu, e, blocks, _solver(), **RULES)
    lam = res.lam
    active = lam[..., 0] > 0
    assert bool(active.any()) and bool((~active).any())
    ins = [J, v, vf, phi, mu, e, *blocks.L]
    ins = [x.clone().requires_grad_() for x in ins]
    bl = Blocks(ins[6:], blocks.starts)
    out, _ = velocity_update(*ins[:6], bl, lambda A, c, m: pgs(A, c, m, solution=lam), **RULES)
    torch.testing.assert_close(out.detach(), v1, rtol=0, atol=0)
    ref = _reference(*ins[:6], bl, lam)
    torch.testing.assert_close(out.detach(), ref.detach(), rtol=1e-12, atol=1e-12)
    w = torch.randn_like(out)
    got = torch.autograd.grad(out, ins, w)
    want = torch.autograd.grad(ref, ins, w)
    names = ["J", "v", "v_free", "phi", "mu", "e"] + [f"L{i}" for i in range(len(blocks.L))]
    for n, a, b in zip(names, got, want):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=lambda m, n=n: f"{n}: {m}")


def test_some_problems_bounce():
    """The rebound target's branch is among those differentiated above."""
    assert any(bool(assemble(*_problem(s)[:4], _problem(s)[5], _problem(s)[6], **RULES).bounce.any())
               for s in range(6))


def test_reverse_pass_matches_finite_differences():
    torch.manual_seed(3)
    J, v, vf, phi, mu, e, blocks = _problem(11, B=2, K=3, groups=((1, 4, (0,)), (2, 2, (4, 6))))
    solve = _solver()
    # the mass matrices through a symmetric parametrisation M = L L^T (Cholesky reads one triangle)
    ins = [x.clone().requires_grad_() for x in (J, v, vf, phi, mu, e, *blocks.L)]

    def f(*xs):
        Ls = [torch.linalg.cholesky(X @ X.transpose(-1, -2)) for X in xs[6:]]
        return velocity_update(*xs[:6], Blocks(Ls, blocks.starts), solve, **RULES)[0]

    from diffmech.dynamics.kernels import native_mode

    with native_mode("auto"):  # the sweeps in C where a compiler is found (the suite runs them in torch)
        lam = velocity_update(J, v, vf, phi, mu, e, blocks, solve, **RULES)[1].lam
        A, c = assemble(J, v, vf, phi, e, blocks, **RULES)[:2]
        active, sliding, _ = pgs_mod._modes(lam, A, c, mu)
        assert bool((~active).any()) and bool(sliding.any()) and bool((active & ~sliding).any())
        # FD steps of 1e-7 keep these modes (a mode change would show as a mismatch)
        assert torch.autograd.gradcheck(f, ins, eps=1e-7, atol=1e-5, rtol=1e-4, nondet_tol=1e-9)


def test_native_pullback_matches_torch():
    from diffmech.dynamics.kernels import native_mode

    g = torch.Generator().manual_seed(5)
    slid = 0
    for trial in range(40):
        B, K, nv = 3, 1 + trial % 5, 12
        J = torch.randn(B, 3 * K, nv, generator=g, dtype=torch.float64)
        X = torch.randn(B, nv, nv, generator=g, dtype=torch.float64)
        M = X @ X.transpose(-1, -2) + nv * torch.eye(nv, dtype=torch.float64)
        A = J @ torch.linalg.solve(M, J.transpose(-1, -2))
        c = torch.randn(B, 3 * K, generator=g, dtype=torch.float64)
        mu = torch.rand(B, K, generator=g, dtype=torch.float64) * (torch.rand(B, K, generator=g) > 0.2)
        lam = pgs(A, c, mu, iterations=5000, tol=1e-15).lam
        grad = torch.randn(B, K, 3, generator=g, dtype=torch.float64)
        want = pgs_mod._implicit_vjp(lam, A, c, mu, grad)
        with native_mode("auto"):  # the suite runs with native kernels off
            got = pgs_native.native_vjp(lam, A, c, mu, grad)
        if got is None:
            pytest.skip("no C compiler: the native kernels are not available")
        a, d, g_mu, ok, slides = got
        assert bool(ok.all())
        torch.testing.assert_close(a, want[0], rtol=1e-10, atol=1e-12)
        if want[1] is None:
            assert slides == 0
        else:
            slid += 1
            torch.testing.assert_close(d, want[1], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(g_mu, want[2], rtol=1e-10, atol=1e-12)
    assert slid > 10


def test_rank_deficient_environments_take_the_least_norm_solve(monkeypatch):
    """A box's four corners on the ground: the normal impulses have a null space; the native kernel
    says so and the least-norm torch solve answers for those environments -- the same gradient as
    with the torch pull-back throughout."""
    from diffmech.dynamics.kernels import native_mode
    from diffmech.model import systems
    from diffmech.sim import Scene, contact_step

    box = systems.box(size=(0.4, 0.3, 0.2), mass=2.0)
    scene = Scene({"box": box}, friction=0.5)
    q0 = scene.neutral_configuration().clone()
    q0[2] = 0.1
    v = torch.zeros(2, scene.nv, dtype=q0.dtype)
    v[:, 2] = -0.2
    v[1, 0] = 0.3  # the second one slides

    def grad(mode):
        q = torch.stack([q0, q0]).requires_grad_()
        with native_mode(mode):
            info: dict = {}
            _, v1 = contact_step(scene, q, v, torch.zeros_like(v), 1e-3, info)
            assert info["candidates"] == 4
            return torch.autograd.grad(v1[..., 2].sum() + v1[..., 0].sum() + v1[..., 4].sum(), q)[0]

    torch_sizes = []
    inner = pgs_mod._implicit_vjp

    def spy(lam, *args):
        torch_sizes.append(lam.shape[0])
        return inner(lam, *args)

    monkeypatch.setattr(pgs_mod, "_implicit_vjp", spy)
    g_native = grad("auto")
    if pgs_native._library() is None:
        pytest.skip("no C compiler: the native kernels are not available")
    assert torch_sizes and torch_sizes[0] <= 2  # the rank-deficient environments only
    torch_sizes.clear()
    g_torch = grad("never")
    assert torch_sizes == [2]
    assert torch.isfinite(g_native).all()
    torch.testing.assert_close(g_native, g_torch, rtol=1e-9, atol=1e-11 * float(g_torch.abs().max()))


def test_float32_matches_float64():
    """The same step in float32 (the C pull-back's float kernel, where available): the velocity and
    every gradient agree with float64 to float32's precision (measured: 2e-7 relative)."""
    from diffmech.dynamics.kernels import native_mode

    J, v, vf, phi, mu, e, blocks = _problem(2)
    lam64 = velocity_update(J, v, vf, phi, mu, e, blocks, _solver(), **RULES)[1].lam
    out = {}
    for dtype in (torch.float64, torch.float32):
        ins = [x.to(dtype).requires_grad_() for x in (J, v, vf, phi, mu, e, *blocks.L)]
        sol = lam64.to(dtype)
        with native_mode("auto"):
            v1, _ = velocity_update(*ins[:6], Blocks(ins[6:], blocks.starts),
                                    lambda A, c, m, sol=sol: pgs(A, c, m, solution=sol), **RULES)
            w = torch.linspace(-1, 1, v1.numel(), dtype=dtype).reshape(v1.shape)
            out[dtype] = [v1.detach()] + list(torch.autograd.grad(v1, ins, w))
    for a, b in zip(out[torch.float32], out[torch.float64]):
        assert a.dtype == torch.float32
        scale = float(b.abs().max()) + 1e-12
        assert float((a.double() - b).abs().max()) <= 1e-5 * scale, float((a.double() - b).abs().max()) / scale


@pytest.mark.parametrize("seed", range(4))
def test_native_assembly_and_reverse_pass_equal_the_torch_code(seed):
    """diffmech.contact.update_native (one mass-matrix block, as the native ground step has) against
    assemble and update_vjp, with separated, sticking, sliding and bouncing blocks."""
    from diffmech.contact import update_native
    from diffmech.contact.impulses import update_vjp
    from diffmech.dynamics import kernels

    J, v, vf, phi, mu, e, blocks = _problem(seed, groups=((1, 9, (0,)),))
    L = blocks.L[0][:, 0]
    with kernels.native_mode("auto"):
        if not update_native.available(J):
            pytest.skip("no C compiler")
        A, c, W, vn, bounce, scale = update_native.assemble_native(J, L, v, vf, phi, e, **RULES)
        p = assemble(J, v, vf, phi, e, blocks, **RULES)
        for got, want in ((A, p.A), (c, p.c), (W, p.W), (vn, p.vn), (scale, p.scale)):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        assert torch.equal(bounce, p.bounce)
        lam = pgs(A, c, mu, iterations=20000, tol=1e-15).lam
        sliding = (lam[..., 1:].norm(dim=-1) > 0.999 * mu * lam[..., 0]) & (lam[..., 0] > 0)
        assert bool(sliding.any()) and bool((lam[..., 0] == 0).any())
        B, K, _ = lam.shape
        u = (W @ lam.reshape(B, 3 * K, 1))[..., 0]
        g = torch.randn(B, v.shape[1], dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
        got = update_native.backward_native(g, J, v, vf, phi, mu, e, lam, u, c, W, vn, bounce, scale, L,
                                            RULES["dt"], pgs_mod.implicit_vjp)
        want = update_vjp((RULES["dt"], RULES["baumgarte"], RULES["bounce_speed"], ((0,),)),
                          (J, v, vf, phi, mu, e, lam, u, c, W, vn, bounce, scale, L[:, None]), g, (True,) * 7)
    for name, a, b in zip(("J", "v", "v_free", "phi", "mu", "e", "L"), got, want):
        b = b[:, 0] if name == "L" else b
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
