"""The smoothed contact problem (``Scene(solver="smooth")``): its Jacobian, its root's gradient, its
limit (the hard problem), and scenes stepped with it."""

from __future__ import annotations

import contextlib

import pytest
import torch

from diffmech.contact import pgs_native
from diffmech.contact.pgs import pgs
from diffmech.contact.smooth import smooth_jacobian, smooth_residual, smooth_solve
from diffmech.errors import ConvergenceError, ModelError, OptionError
from diffmech.model import systems
from diffmech.sim import Scene, rollout

f64 = dict(dtype=torch.float64)


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


def _problem(seed: int, B: int = 3, K: int = 4):
    g = torch.Generator().manual_seed(seed)
    J = torch.randn(B, 3 * K, 2 * K + 1, generator=g, **f64)
    A = J @ J.transpose(-1, -2) / K + 1e-3 * torch.eye(3 * K, **f64)
    c = torch.randn(B, 3 * K, generator=g, **f64)
    mu = 0.2 + torch.rand(B, K, generator=g, **f64)
    return A, c, mu


@pytest.mark.parametrize("scaled", [False, True])
def test_jacobian_is_the_residuals(scaled):
    A, c, mu = _problem(0)
    x = torch.randn(3, 12, generator=torch.Generator().manual_seed(1), **f64)
    s0 = 0.01 + torch.rand(3, 4, generator=torch.Generator().manual_seed(2), **f64) if scaled else None
    got = smooth_jacobian(x, A, c, mu, 1e-3, 1e-2, s0)
    want = torch.func.vmap(torch.func.jacrev(
        lambda x, A, c, mu, s0: smooth_residual(x[None], A[None], c[None], mu[None], 1e-3, 1e-2,
                                                None if s0 is None else s0[None])[0]),
        in_dims=(0, 0, 0, 0, 0 if scaled else None))(x, A, c, mu, s0)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def quotient_residual(lam: torch.Tensor, A, c, mu, kappa: float, eps: float) -> torch.Tensor:
    """The relaxed laws as the module states them (friction as ``lam_t + mu lam_n w_t / speed``),
    written out independently of the form the solver iterates on. (B, K, 3)."""
    B, K, _ = lam.shape
    w = ((A @ lam.reshape(B, -1, 1))[..., 0] + c).reshape(B, K, 3)
    ln, wn, lt, wt = lam[..., 0], w[..., 0], lam[..., 1:], w[..., 1:]
    rn = ln + wn - torch.sqrt(ln ** 2 + wn ** 2 + 2 * kappa)
    rt = lt + (mu * ln / torch.sqrt((wt ** 2).sum(-1) + eps ** 2))[..., None] * wt
    return torch.cat([rn[..., None], rt], -1)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_root_and_gradient(seed):
    A, c, mu = _problem(seed, B=2, K=3)
    lam0 = pgs(A, c, mu, iterations=500, tol=1e-12, native=False).lam
    lam, _, rel = smooth_solve(A, c, mu, lam0, kappa=1e-3, eps=1e-2)
    assert rel < 1e-9
    r = smooth_residual(lam.reshape(2, -1), A, c, mu, 1e-3, 1e-2)
    assert float(r.abs().amax()) < 1e-8
    assert float(quotient_residual(lam, A, c, mu, 1e-3, 1e-2).abs().amax()) < 1e-8
    assert bool((lam[..., 0] > 0).all())  # relaxed: every normal impulse is positive

    def f(c, mu):
        return smooth_solve(A, c, mu, lam0, kappa=1e-3, eps=1e-2)[0]

    assert torch.autograd.gradcheck(f, (c.clone().requires_grad_(True), mu.clone().requires_grad_(True)),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)
    # A along one symmetric direction, against central differences
    D = torch.randn(A.shape, generator=torch.Generator().manual_seed(seed + 10), **f64)
    D = D + D.transpose(-1, -2)
    t = torch.zeros((), **f64, requires_grad=True)
    out = smooth_solve(A + t * D, c, mu, lam0, kappa=1e-3, eps=1e-2)[0]
    w = torch.randn(out.shape, generator=torch.Generator().manual_seed(seed + 20), **f64)
    (g,) = torch.autograd.grad((out * w).sum(), t)
    h = 1e-6
    fd = ((smooth_solve(A + h * D, c, mu, lam0, kappa=1e-3, eps=1e-2)[0] * w).sum()
          - (smooth_solve(A - h * D, c, mu, lam0, kappa=1e-3, eps=1e-2)[0] * w).sum()) / (2 * h)
    assert abs(float(g - fd)) < 1e-6 * max(1.0, abs(float(fd)))


def test_small_relaxation_approaches_the_hard_solution():
    """One contact with ``A = a I``: the hard solution in closed form -- separated (lam = 0),
    sticking (lam = -c / a) or sliding (lam_t = -mu lam_n c_t / |c_t|) -- and the smooth one tends
    to it as the relaxations go to zero."""
    a, mu = 2.0, torch.full((5, 1), 0.5, **f64)
    c = torch.tensor([[0.3, 0.1, 0.0], [-1.0, 0.2, -0.1], [-1.0, 0.5, 0.9], [-0.4, -2.0, 0.0],
                      [-2.0, 0.0, 0.0]], **f64)
    A = a * torch.eye(3, **f64).expand(5, 3, 3)
    ln = (-c[:, 0] / a).clamp_min(0)
    stick = -c[:, 1:] / a
    bound = mu[:, 0] * ln
    norm = stick.norm(dim=-1)
    lt = torch.where((norm <= bound)[:, None], stick, stick * (bound / norm.clamp_min(1e-300))[:, None])
    hard = torch.cat([ln[:, None], lt], -1)[:, None]
    errs = []
    for kappa, eps in [(1e-4, 1e-3), (1e-6, 1e-5), (1e-10, 1e-8)]:
        soft, _, _ = smooth_solve(A, c, mu, torch.zeros_like(hard), kappa=kappa, eps=eps)
        errs.append(float((soft - hard).abs().amax()))
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-4, errs


def _drop(solver, steps=150):
    ball = systems.sphere(0.1, 1.0)
    scene = Scene({"ball": ball}, solver=solver)
    q0 = ball.neutral_configuration()
    q0[2] = 0.3
    Q, V = rollout(scene, q0, torch.zeros(6, **f64), torch.zeros(steps, 6, **f64), 1e-2)
    return Q, V


def test_ball_comes_to_rest():
    Q, V = _drop("smooth")
    # the smoothed contact holds the ball 1.0e-7 m off the plane (measured; smoothing 1e-6)
    assert abs(float(Q[-1, 2]) - 0.1) < 3e-7
    assert float(V[-1].norm()) < 1e-12  # measured 2e-16 m/s


@pytest.mark.parametrize("mu", [0.2, 0.6])
def test_sliding_box_stops_where_coulomb_says(mu):
    box = systems.box(size=(0.2, 0.2, 0.1), mass=1.0)
    scene = Scene({"box": box}, solver="smooth", friction=mu)
    q0 = box.neutral_configuration()
    q0[2] = 0.05
    v0 = torch.zeros(6, **f64)
    v0[0] = 1.0
    dt = 1e-2
    Q, _ = rollout(scene, q0, v0, torch.zeros(100, 6, **f64), dt)
    # v0^2 / (2 mu g), less the half step semi-implicit Euler loses: v_k = v0 - k mu g dt
    expected = 1.0 / (2 * mu * 9.81) - 0.5 * dt
    assert abs(float(Q[-1, 0]) - expected) < 2e-4 * expected  # measured 2.4e-5 (mu 0.2), 9.7e-5 (0.6)
    # the discrete sum dt sum_k max(v0 - k mu g dt, 0): the smoothed friction (friction_smoothing
    # 1e-4) lets the box slide 3.1e-6 m (mu 0.2), 4.7e-6 m (0.6) further (measured)
    k = int(1.0 / (mu * 9.81 * dt))
    assert 0 < float(Q[-1, 0]) - dt * (k - mu * 9.81 * dt * k * (k + 1) / 2) < 1e-5


def test_rollout_gradient_matches_finite_differences():
    """d(final x of a box pushed across the ground)/d(friction, push), smooth solver, float64."""
    box = systems.box(size=(0.2, 0.2, 0.1), mass=1.0)

    def final_x(mu, push):
        scene = Scene({"box": box}, solver="smooth", friction=mu)
        q0 = box.neutral_configuration()
        q0[2] = 0.05
        tau = torch.zeros(40, 6, **f64)
        tau[:, 0] = push
        Q, _ = rollout(scene, q0, torch.zeros(6, **f64), tau, 1e-2)
        return Q[-1, 0]

    mu = torch.tensor(0.3, **f64, requires_grad=True)
    push = torch.tensor(4.0, **f64, requires_grad=True)
    g_mu, g_push = torch.autograd.grad(final_x(mu, push), (mu, push))
    eps = 1e-6
    with torch.no_grad():
        fd_mu = (final_x(0.3 + eps, 4.0) - final_x(0.3 - eps, 4.0)) / (2 * eps)
        fd_push = (final_x(0.3, 4.0 + eps) - final_x(0.3, 4.0 - eps)) / (2 * eps)
    assert abs(float(g_mu - fd_mu)) < 1e-6 * max(1.0, abs(float(fd_mu)))
    assert abs(float(g_push - fd_push)) < 1e-6 * max(1.0, abs(float(fd_push)))
    assert float(g_mu) < 0 < float(g_push)


def test_gradient_before_the_push_overcomes_static_friction():
    """A push below mu m g does not move the box: the hard model's gradient w.r.t. the push is
    zero (the box sticks), the smooth model's is positive (it creeps, more for a stronger push)."""
    box = systems.box(size=(0.2, 0.2, 0.1), mass=1.0)
    grads = {}
    for solver in ("pgs", "smooth"):
        scene = Scene({"box": box}, solver=solver, friction=0.5, friction_smoothing=1e-2)
        q0 = box.neutral_configuration()
        q0[2] = 0.05
        push = torch.tensor(4.0, **f64, requires_grad=True)  # mu m g = 4.9 N
        tau = torch.zeros(30, 6, **f64)
        tau[:, 0] = 1.0
        Q, _ = rollout(scene, q0, torch.zeros(6, **f64), tau * push, 1e-2)
        (grads[solver],) = torch.autograd.grad(Q[-1, 0], push)
    assert abs(float(grads["pgs"])) < 1e-9
    assert float(grads["smooth"]) > 1e-5


def test_solver_options_are_checked():
    ball = systems.sphere(0.1, 1.0)
    with pytest.raises(OptionError, match="unknown solver"):
        Scene(ball, solver="newton")
    with pytest.raises(ModelError, match="positive"):
        Scene(ball, solver="smooth", smoothing=0.0)


def test_every_route_of_the_solve_gives_the_same_root_and_gradient(monkeypatch):
    """With the direct solves cut to one iteration, the environments go through the product form and
    its continuation: the roots and the implicit gradient are those of the direct solve, and an
    environment the first route solves keeps its root (the batch's environments are independent)."""
    import importlib

    smooth = importlib.import_module("diffmech.contact.smooth")
    A, c, mu = _problem(3, B=3, K=3)
    lam0 = pgs(A, c, mu, iterations=500, tol=1e-12, native=False).lam
    c = c.clone().requires_grad_(True)
    w = torch.randn(3, 3, 3, generator=torch.Generator().manual_seed(4), **f64)

    def solve_and_grad():
        lam, its, rel = smooth_solve(A, c, mu, lam0, kappa=1e-3, eps=1e-2)
        (g,) = torch.autograd.grad((lam * w).sum(), c)
        return lam.detach(), g, its, rel

    lam_d, g_d, its_d, _ = solve_and_grad()
    # an environment already at its root: the first route solves it in no iteration
    lam0 = lam0.clone()
    lam0[1] = lam_d[1]
    monkeypatch.setattr(smooth, "DIRECT_ITERATIONS", 1)
    lam_r, g_r, its_r, rel = solve_and_grad()
    assert its_r > its_d and rel < 1e-9
    torch.testing.assert_close(lam_r, lam_d, rtol=0, atol=1e-9)
    torch.testing.assert_close(g_r, g_d, rtol=1e-7, atol=1e-9)
    assert torch.equal(lam_r[1], lam_d[1])


def test_an_environment_without_a_root_is_reported_not_raised_when_asked(monkeypatch):
    """``raise_on_failure=False``: an environment no route solves (here: made to look so) keeps its
    start ``lam0`` without a gradient and is flagged; the others are solved as in a batch without it,
    with finite gradients."""
    import importlib

    smooth = importlib.import_module("diffmech.contact.smooth")
    A, c, mu = _problem(5, B=3, K=3)
    lam0 = pgs(A, c, mu, iterations=500, tol=1e-12, native=False).lam
    want, _, _ = smooth_solve(A, c, mu, lam0, kappa=1e-3, eps=1e-2)
    real = smooth.newton_solve

    def env1_never_converges(*args, **kw):
        x, st = real(*args, **kw)
        if x.shape[0] == 3:  # the whole batch: environment 1 fails
            st = st._replace(converged=st.converged & torch.tensor([True, False, True]))
        elif x.shape[0] == 1:  # the later routes, which environment 1 alone takes
            st = st._replace(converged=torch.zeros_like(st.converged))
        return x, st

    monkeypatch.setattr(smooth, "newton_solve", env1_never_converges)
    with pytest.raises(ConvergenceError, match=r"environment\(s\) \[1\]"):
        smooth_solve(A, c, mu, lam0, kappa=1e-3, eps=1e-2)
    cg = c.clone().requires_grad_(True)
    lam, _, rel, solved = smooth_solve(A, cg, mu, lam0, kappa=1e-3, eps=1e-2, raise_on_failure=False)
    assert solved.tolist() == [True, False, True] and rel < 1e-9
    assert torch.equal(lam[1].detach(), lam0[1])
    torch.testing.assert_close(lam[[0, 2]].detach(), want[[0, 2]], rtol=0, atol=1e-10)
    (g,) = torch.autograd.grad(lam.sum(), cg)
    assert torch.isfinite(g).all() and float(g[1].abs().amax()) == 0.0


def test_contact_step_takes_the_hard_solution_where_the_smooth_problem_is_unsolved(monkeypatch):
    """Where the smooth solve finds no root, the step is the hard (PGS) solver's step, with its
    gradient, counted in ``info["fallbacks"]`` and the rollout's ``contact_fallbacks``, warned once."""
    import importlib

    step_module = importlib.import_module("diffmech.sim.contact_step")
    real = step_module.smooth_solve
    monkeypatch.setattr(step_module, "smooth_solve", lambda *a, **kw: real(*a, **{**kw, "max_iter": 0}))
    box = systems.box(size=(0.2, 0.2, 0.1), mass=1.0)
    q0 = box.neutral_configuration()
    q0[2] = 0.0499
    v0 = torch.zeros(6, **f64)
    v0[0] = 0.5
    out = {}
    for solver in ("pgs", "smooth"):
        mu = torch.tensor(0.4, **f64, requires_grad=True)
        scene = Scene({"box": box}, solver=solver, friction=mu)
        info: dict = {}
        with pytest.warns(RuntimeWarning, match="hard problem") if solver == "smooth" else contextlib.nullcontext():
            q1, v1 = step_module.contact_step(scene, q0[None], v0[None], torch.zeros(1, 6, **f64), 1e-2, info)
        st: dict = {}
        Q, _ = rollout(scene, q0, v0, torch.zeros(20, 6, **f64), 1e-2, stats=st)
        (g,) = torch.autograd.grad(Q[-1, 0], mu)
        out[solver] = (v1, Q, g, info["fallbacks"], st["contact_fallbacks"])
    assert out["pgs"][3] == 0 and out["pgs"][4] == 0
    assert out["smooth"][3] == 1 and out["smooth"][4] == 20
    # the same problem solved by the same sweeps, from another start (the smooth route's PGS solution):
    # equal to the PGS tolerance
    for a, b in zip(out["smooth"][:3], out["pgs"][:3]):
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-9)
    assert float(out["pgs"][2]) != 0.0
