"""The stabilising controller (spec section 4): energy-neutral mode term, zero feedback on the
orbit, |H - E*| never growing without damping, the closest-point search."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from control_helpers import NATURAL_Q0, NATURAL_T, system
from diffmech.control.stabilize import ModeStabilizer, Orbit, TrackingController, signals, simulate, simulate_ivp


@pytest.fixture(scope="module")
def natural():
    """The uncontrolled double pendulum, one of its exact eigenmodes, and a controller."""
    sys_ = system(potential=False)
    orbit = Orbit.from_system(sys_, NATURAL_Q0, NATURAL_T, samples=801)
    return sys_, orbit


@pytest.fixture(scope="module")
def learned():
    """A double pendulum closed by a random potential, its (non-periodic) trajectory as 'orbit'."""
    sys_ = system(potential=True, hidden=8)
    orbit = Orbit.from_system(sys_, [-0.5, -0.5], 1.0, samples=201)
    return sys_, orbit


@pytest.mark.parametrize("gains", [(1.0, 10.0), (10.0, 10.0)])
def test_mode_term_injects_no_power(learned, gains):
    sys_, orbit = learned
    stab = ModeStabilizer(sys_, orbit, gains=gains)
    g = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(256, 2, generator=g, dtype=torch.float64) * 3 - 1.5,
                   torch.randn(256, 2, generator=g, dtype=torch.float64) * 4], -1)
    t = stab.terms(x)
    scale = (t["v"].norm(dim=-1) * t["u_M"].norm(dim=-1)).clamp_min(1.0)
    assert float((t["power_M"].abs() / scale).max()) < 1e-13
    # the energy term's power is a_E (E* - H) ||p||_{M^-1}
    expected = gains[0] * (stab.target_energy - t["H"]) * t["p_norm"]
    torch.testing.assert_close(t["power_E"], expected, rtol=1e-12, atol=1e-12)
    # the unprojected variant does inject power
    free = ModeStabilizer(sys_, orbit, gains=gains, projected=False).terms(x)
    assert float(free["power_M"].abs().max()) > 1.0


def test_feedback_vanishes_on_the_orbit(natural):
    sys_, orbit = natural
    stab = ModeStabilizer(sys_, orbit, gains=(1.0, 10.0))
    t = torch.linspace(0, NATURAL_T, 97, dtype=torch.float64)[1:-1]
    x = orbit.interpolate(t)[0]
    terms = stab.terms(x)
    assert float(terms["u_E"].abs().max()) < 1e-7
    assert float(terms["u_M"].abs().max()) < 1e-6
    # closest point: s* = t on the first half, T - t on the second
    expect = torch.where(t <= NATURAL_T / 2, t, NATURAL_T - t)
    assert float((terms["s"] - expect).abs().max()) < 1e-7


def test_closest_point_gradient_matches_fd(learned):
    sys_, orbit = learned
    q = torch.tensor([[-0.3, -0.2], [0.4, 0.1]], dtype=torch.float64)
    qs = orbit.interpolate(torch.tensor([0.15, 0.35], dtype=torch.float64))[0][:, :2]
    q = qs + torch.tensor([[0.02, -0.03], [-0.01, 0.02]], dtype=torch.float64)
    qq = q.clone().requires_grad_(True)
    s = orbit.closest(qq)
    g = torch.autograd.grad(s.sum(), qq)[0]
    eps = 1e-6
    for j in range(2):
        e = torch.zeros_like(q)
        e[:, j] = eps
        fd = (orbit.closest(q + e) - orbit.closest(q - e)) / (2 * eps)
        torch.testing.assert_close(g[:, j], fd, rtol=1e-5, atol=1e-6)


def test_energy_error_never_grows_without_damping(natural):
    sys_, orbit = natural
    stab = ModeStabilizer(sys_, orbit, gains=(1.0, 10.0))
    x0 = torch.tensor([*(np.array(NATURAL_Q0) + 0.3), 2.0, 2.0], dtype=torch.float64)
    t, X = simulate_ivp(stab.field, x0, 0.5 * NATURAL_T, samples=151, rtol=1e-9, atol=1e-9)
    err = (signals(stab, X)["H"] - stab.target_energy).abs()
    assert float(err[0]) > 1.0
    assert float(torch.diff(err).max()) < 1e-7
    assert float(err[-1]) < 0.5 * float(err[0])


@pytest.mark.slow
def test_stabilisation_converges_to_the_orbit(natural):
    sys_, orbit = natural
    stab = ModeStabilizer(sys_, orbit, gains=(1.0, 10.0))
    x0 = torch.tensor([*(np.array(NATURAL_Q0) + 0.3), 2.0, 2.0], dtype=torch.float64)
    t, X = simulate(stab.field, x0, 4 * NATURAL_T, 1200, method="rk4")
    sg = signals(stab, X)
    assert float(sg["dist_q"][-1]) < 1e-3 and float(sg["dist_p"][-1]) < 1e-2
    assert float((sg["H"][-1] - stab.target_energy).abs()) < 1e-3


def test_damping_settles_below_target_energy(natural):
    sys_, orbit = natural
    stab = ModeStabilizer(sys_, orbit, gains=(1.0, 10.0), damping=0.5)
    x0 = orbit.x[0].clone()
    _, X = simulate(stab.field, x0, 0.6 * NATURAL_T, 90, method="midpoint")
    H = signals(stab, X)["H"]
    assert float(H[-30:].max()) < stab.target_energy  # spec check 14: settles below E*
    assert float(H[-30:].min()) > stab.target_energy - 2.0


def test_tracking_controller_follows_the_orbit(natural):
    sys_, orbit = natural
    track = TrackingController(sys_, orbit, kp=100.0, kd=20.0)
    x0 = orbit.x[0].clone()
    t, X = simulate(track.field, x0, 0.2, 20, method="rk4", time_dependent=True)
    ref = orbit.interpolate(t)[0]
    assert float((X[:, :2] - ref[:, :2]).abs().max()) < 1e-4
