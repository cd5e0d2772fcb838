"""Cycle multipliers: monodromy by autodiff == finite differences; the energy multiplier of the
stabilised orbit equals exp(-a_E int ||p*||_{M^-1} dt) (eq. 21); trivial multiplier 1."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from control_helpers import NATURAL_Q0, NATURAL_T, simple_pendulum_system, system
from diffmech.control.floquet import (
    limit_cycle,
    monodromy_autodiff,
    monodromy_fd,
    multipliers,
    orbit_point,
    ratio_multipliers,
)
from diffmech.control.stabilize import ModeStabilizer, Orbit
from diffmech.control.verify import natural_eigenmode


@pytest.fixture(scope="module")
def pendulum_mode():
    sys_ = simple_pendulum_system()
    nm = natural_eigenmode(sys_, [0.8], 1.0, fix=0, rtol=1e-11, tol=1e-11)
    orbit = Orbit.from_system(sys_, nm["q0"], nm["period"], samples=201)
    return sys_, orbit


def _energy_multiplier(stab: ModeStabilizer) -> float:
    orb = stab.orbit
    n = orb.n
    pn = (orb.x[:, n:] * stab.system.velocity(orb.x[:, :n], orb.x[:, n:])).sum(-1).clamp_min(0).sqrt()
    return math.exp(-stab.gains[0] * float(torch.trapezoid(pn, orb.t)))


def test_pendulum_monodromy_autodiff_fd_and_energy_multiplier(pendulum_mode):
    sys_, orbit = pendulum_mode
    stab = ModeStabilizer(sys_, orbit, gains=(0.5, 10.0))
    x0 = orbit_point(stab, 0.25)
    Ma = monodromy_autodiff(stab, x0, steps=81)
    Mf = monodromy_fd(stab, x0, steps=81, eps=1e-6)
    torch.testing.assert_close(Ma, Mf, rtol=0, atol=1e-6)
    mu = multipliers(Ma, stab.field(x0))
    assert abs(mu["trivial"] - 1.0) < 1e-4 and mu["alignment"] > 0.999
    # 1-DoF: the only non-trivial multiplier is the energy one, predicted by eq. (21)
    assert abs(mu["max_modulus"] - _energy_multiplier(stab)) < 1e-4
    # the exact orbit is the closed loop's limit cycle: same period, no gap
    cyc = limit_cycle(stab, periods=2, steps=81)
    assert abs(cyc["period"] - orbit.period) < 1e-4 and cyc["gap"] < 1e-4 and cyc["return_error"] < 1e-6


def test_double_pendulum_monodromy_autodiff_equals_fd_over_a_segment():
    sys_ = system(potential=False)
    orbit = Orbit.from_system(sys_, NATURAL_Q0, NATURAL_T, samples=801)
    stab = ModeStabilizer(sys_, orbit, gains=(1.0, 10.0))
    x0 = orbit_point(stab, 0.3)
    # a segment without turning point: near one, s*(q) and p*(s*(q)) have a square-root singularity
    # (the orbit's speed vanishes there), so finite differences lose accuracy; full periods are
    # compared in the slow test below
    Ma = monodromy_autodiff(stab, x0, 0.4, steps=20)
    Mf = monodromy_fd(stab, x0, 0.4, steps=20, eps=1e-6)
    torch.testing.assert_close(Ma, Mf, rtol=0, atol=1e-5 * float(Ma.abs().max()))


@pytest.fixture(scope="module")
def double_pendulum_mode():
    """The natural mode's orbit, integrated once (a tight solve_ivp, 1.7 s of CPU) for both gains below:
    the orbit does not depend on the gains, and ModeStabilizer does not change it."""
    sys_ = system(potential=False)
    return sys_, Orbit.from_system(sys_, NATURAL_Q0, NATURAL_T, samples=1001)


@pytest.mark.slow
@pytest.mark.parametrize("gains", [(1.0, 10.0), (10.0, 10.0)])
def test_double_pendulum_natural_mode_is_stabilised(gains, double_pendulum_mode):
    """Spec check 12 on an exact eigenmode: non-trivial multipliers inside the circle of radius 0.5,
    the energy multiplier as eq. (21) predicts, autodiff == finite differences over a period."""
    sys_, orbit = double_pendulum_mode
    stab = ModeStabilizer(sys_, orbit, gains=gains)
    x0 = orbit_point(stab, 0.25)
    # 301 RK4 steps per period (601 before: twice the time). Measured 2026-12-07 with 301 steps for gains
    # (1, 10) and (10, 10), and with 601 for (1, 10): |AD - FD| / max(1, |M|) 7e-9, 1.2e-8 (601: 1.7e-8);
    # |trivial - 1| 2.6e-7, 6.4e-7 (601: 3.7e-8); energy multiplier against eq. (21) 1.05e-6 (2.5e-5 of
    # it), 4e-18 (601: 6.0e-7). The tolerances, 1e-3 throughout before, are now 5 to 80 times those errors.
    steps = 301
    Ma = monodromy_autodiff(stab, x0, steps=steps)
    Mf = monodromy_fd(stab, x0, steps=steps, eps=1e-7)
    assert float((Ma - Mf).abs().max()) < 1e-6 * max(1.0, float(Ma.abs().max()))
    mu = multipliers(Ma, stab.field(x0))
    assert abs(mu["trivial"] - 1.0) < 1e-5
    assert mu["max_modulus"] < 0.5
    pred = _energy_multiplier(stab)
    assert np.min(np.abs(mu["nontrivial"] - pred)) < 1e-4 * max(pred, 1e-3) + 1e-6
    ratio = ratio_multipliers(stab, x0, steps=steps)
    assert np.all(np.isfinite(ratio))
