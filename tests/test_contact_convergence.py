"""The contact solve converges, and a rollout's gradient is the derivative of what was simulated.

The standing quadruped (``scenes.laikago``, zero torque, 1 ms steps) is where projected Gauss-Seidel
alone cycles: four toes, mu = 1, a well-conditioned 12 x 12 Delassus matrix, and sweeps that settle
into a cycle whose impulses break the contact conditions (a loaded toe approaching the ground, one
sliding with less than the friction bound) however many run. The solve's semismooth Newton
iterations converge there; this file checks that against the contact conditions written out directly
and against an independent solve (SciPy's root finder on the equations of the solution's contact
modes), then checks the rollout's gradients w.r.t. torques and every link mass against central
differences on each route (native stepper, the torch step) and both adjoints. float64.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest
import torch
from scipy.optimize import root

from diffmech.contact.pgs import pgs
from diffmech.dynamics import kernels
from diffmech.sim import prepare_ground_kernels, rollout, scenes

F64 = torch.float64
impulses = importlib.import_module("diffmech.contact.impulses")
pgs_native = importlib.import_module("diffmech.contact.pgs_native")

T, DT = 200, 1e-3


@pytest.fixture(scope="module")
def laikago():
    return scenes.laikago(1)  # pybullet_data: a test dependency (the oracle scene), never skipped


def _problems(scene, q0, v0, steps):
    """The contact problems ``(A, c, mu)`` of the given steps of the standing rollout (torch route)."""
    tau = torch.zeros(T, scene.nv, dtype=F64)
    with torch.no_grad():
        Q, V = rollout(scene, q0, v0, tau, DT)
    got = []
    real = impulses.solve_and_apply

    def capture(solve, *args):
        def keep(A, c, mu):
            got.append((A.detach().clone(), c.detach().clone(), mu.detach().clone()))
            return solve(A, c, mu)
        return real(keep, *args)

    from diffmech.sim import contact_step

    with pytest.MonkeyPatch.context() as mp, kernels.native_mode("never"), torch.no_grad():
        mp.setattr(impulses, "solve_and_apply", capture)
        for k in steps:
            contact_step(scene, Q[k:k + 1], V[k:k + 1], tau[k:k + 1], DT)
    return got


def _conditions(lam, A, c, mu):
    """The contact conditions written out, per block: ``(normal error, friction-cone error, slip error)``
    (the largest of each, in N s or m/s), independent of the solver's natural map."""
    w = (A @ lam.reshape(-1) + c).reshape(-1, 3)
    ln, lt, wn, wt = lam[:, 0], lam[:, 1:], w[:, 0], w[:, 1:]
    normal = max(float((-ln).clamp_min(0).max()), float((-wn).clamp_min(0).max()),
                 float((ln * wn).abs().max()) / max(float(ln.abs().max()), 1e-300))
    cone = float((lt.norm(dim=-1) - mu * ln).clamp_min(0).max())
    # sliding (|w_t| > 0): friction at the bound, opposing the slip; sticking: w_t = 0
    slip = 0.0
    for k in range(lam.shape[0]):
        if float(ln[k]) <= 0:
            continue
        speed = float(wt[k].norm())
        if speed > 1e-9:
            want = -mu[k] * ln[k] * wt[k] / wt[k].norm()
            slip = max(slip, float((lt[k] - want).abs().max()))
    return normal, cone, slip


def test_standing_quadruped_sweeps_cycle_and_the_solve_converges(laikago):
    scene, q0, v0 = laikago
    for A, c, mu in _problems(scene, q0, v0, (100, 150, 199)):
        sweeps = pgs(A, c, mu, iterations=5000, tol=0.0, newton=0, native=False)
        assert sweeps.residual > 1e-3 and sweeps.violation > 1e-3  # the cycle: conditions broken by mm/s
        full = pgs(A, c, mu, native=False)
        assert full.unconverged == 0 and full.residual <= 1e-9 and full.newton <= 10
        normal, cone, slip = _conditions(full.lam[0], A[0], c[0], mu[0])
        assert normal < 1e-10 and cone < 1e-12 and slip < 1e-10, (normal, cone, slip)
        # the sweeps' impulses break them: a loaded toe approaching the ground or friction below the bound
        assert max(_conditions(sweeps.lam[0], A[0], c[0], mu[0])) > 1e-3


def test_the_solution_equals_an_independent_solve(laikago):
    """SciPy's root finder (MINPACK's hybrid method) on the equations of the solution's contact modes --
    sticking: w = 0; sliding: w_n = 0 and lam_t = -mu lam_n w_t / |w_t|; separated: lam = 0 -- started
    from the cycling sweeps' impulses, reaches the same impulses."""
    scene, q0, v0 = laikago
    for A, c, mu in _problems(scene, q0, v0, (100,)):
        lam = pgs(A, c, mu, native=False).lam[0]
        start = pgs(A, c, mu, newton=0, native=False).lam[0]
        An, cn, mun = A[0].numpy(), c[0].numpy(), mu[0].numpy()
        w = (An @ lam.reshape(-1).numpy() + cn).reshape(-1, 3)
        active = lam[:, 0].numpy() > 0
        sliding = active & (np.linalg.norm(w[:, 1:], axis=1) > 1e-9)
        assert sliding.any()  # the case the sweeps cycle on

        def equations(x, An=An, cn=cn, mun=mun, active=active, sliding=sliding):
            lx = x.reshape(-1, 3)
            wx = (An @ x + cn).reshape(-1, 3)
            out = []
            for k in range(lx.shape[0]):
                if not active[k]:
                    out += list(lx[k])
                elif sliding[k]:
                    out += [wx[k, 0], *(lx[k, 1:] + mun[k] * lx[k, 0] * wx[k, 1:] / np.linalg.norm(wx[k, 1:]))]
                else:
                    out += list(wx[k])
            return np.array(out)

        sol = root(equations, start.reshape(-1).numpy(), method="hybr", tol=1e-13)
        assert np.abs(sol.fun).max() < 1e-15
        np.testing.assert_allclose(sol.x, lam.reshape(-1).numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_native_solve_equals_the_torch_solve(laikago, monkeypatch, dtype):
    monkeypatch.setattr(pgs_native, "enabled", lambda: True)  # the suite runs with native kernels off
    scene, q0, v0 = laikago
    probs = _problems(scene, q0, v0, (0, 60, 100, 199))
    A, c, mu = (torch.cat(x).to(dtype) for x in zip(*probs))
    a, b = pgs(A, c, mu, native=True), pgs(A, c, mu, native=False)
    assert a.unconverged == b.unconverged == 0 and a.newton > 0
    tol = 1e-8 if dtype == F64 else 2e-4  # both converged to the tolerance (float32: 64 ulps)
    scale = float(a.lam.abs().max())
    torch.testing.assert_close(a.lam, b.lam, rtol=0, atol=tol * scale)


def test_a_solve_that_stops_short_warns_once(laikago):
    scene, q0, v0 = scenes.laikago(1)
    scene.iterations = 50

    contact_pgs = importlib.import_module("diffmech.contact.pgs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(contact_pgs, "NEWTON_ITERATIONS", 0)
        mp.setattr(contact_pgs.pgs, "__kwdefaults__", {**contact_pgs.pgs.__kwdefaults__, "newton": 0})
        stats: dict = {}
        with pytest.warns(RuntimeWarning, match=r"stopped short .* residual .* violated by"), \
                kernels.native_mode("never"), torch.no_grad():
            rollout(scene, q0, v0, torch.zeros(120, scene.nv, dtype=F64), DT, stats=stats)
    assert stats["contact_unconverged"] > 0 and stats["contact_violation_max"] > 1e-3


# ------------------------------------------------------------------ gradients against central differences
def _loss_and_grads(scene, q0, v0, tau, params, adjoint):
    stats: dict = {}
    Q, _ = rollout(scene, q0, v0, tau, DT, adjoint=adjoint, stats=stats)
    z = Q[-1, 2]
    return float(z), torch.autograd.grad(z, [tau, *params]), stats


def _central(f, x, idx, h):
    with torch.no_grad():
        x[idx] += h
        up = f()
        x[idx] -= 2 * h
        down = f()
        x[idx] += h
    return (up - down) / (2 * h)


@pytest.mark.slow
def test_standing_quadruped_gradients_equal_central_differences():
    """The review's case: 200 steps standing, loss the chassis height at the end; d/d tau at steps 0, 50,
    100 and d/d every link mass, on the native route and the torch route, checkpointed and autograd
    adjoints, against central differences at two step sizes (which agree: the map is smooth there)."""
    scene, q0, v0 = scenes.laikago(1)
    scene.tol = 1e-13  # the finite differences of the rollout at h = 1e-6 resolve ~1e-10 of the loss
    assert prepare_ground_kernels(scene, parameters=True)
    robot = scene.models["laikago0"]
    for link in robot.link_names:
        if float(robot.link_params(link).mass) > 0:
            robot.make_link_param_learnable(link, "mass")
    params = [p for p in robot.parameters() if p.requires_grad]
    assert len(params) >= 13
    tau = torch.zeros(T, scene.nv, dtype=F64, requires_grad=True)
    got = {}
    for route, mode in (("native", "auto"), ("torch", "never")):
        for adjoint in ("checkpoint", "autograd"):
            if route == "torch" and adjoint == "autograd":
                continue  # the same steps as native/autograd's contact_step, 10 s more
            with kernels.native_mode(mode):
                z, grads, stats = _loss_and_grads(scene, q0, v0, tau, params, adjoint)
            assert stats.get("route", "native" if adjoint == "checkpoint" else "").startswith(
                "native" if (route, adjoint) == ("native", "checkpoint") else "torch"), stats
            got[(route, adjoint)] = grads
    ref = got[("native", "checkpoint")]
    for key, grads in got.items():
        for a, b in zip(grads, ref):
            torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-14, msg=str(key))

    def f():
        with kernels.native_mode("auto"):
            Q, _ = rollout(scene, q0, v0, tau.detach(), DT)
        return float(Q[-1, 2])

    tau_d = tau.detach().clone()

    def f_tau():
        with kernels.native_mode("auto"):
            Q, _ = rollout(scene, q0, v0, tau_d, DT)
        return float(Q[-1, 2])

    checks = [((0, 8), 1e-2), ((0, 2), 1e-2), ((50, 12), 1e-2), ((100, 10), 1e-2)]
    for idx, h in checks:
        a, b = _central(f_tau, tau_d, idx, h), _central(f_tau, tau_d, idx, h / 10)
        assert abs(a - b) <= 1e-5 * abs(b), (idx, a, b)  # smooth there
        assert float(ref[0][idx]) == pytest.approx(b, rel=1e-4), idx
    for p, g in zip(params, ref[1:]):
        a, b = _central(f, p.data, (), 1e-3), _central(f, p.data, (), 1e-4)
        assert abs(a - b) <= 1e-5 * abs(b) + 1e-12, (a, b)
        assert float(g) == pytest.approx(b, rel=1e-4, abs=1e-10)
