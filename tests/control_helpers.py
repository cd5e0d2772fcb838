"""Shared systems of the control tests (float64)."""

from __future__ import annotations

import math

import torch

from diffmech.control import HamiltonianSystem, MLPPotential
from diffmech.model.systems import double_pendulum, pendulum

# the paper's double pendulum: point masses 1 kg, links 1 m, joint-2 spring k (q2 - pi/2)^2, k = 0.5
SPRING = (0.0, 1.0)
REST = (0.0, math.pi / 2)
# an exact eigenmode of the uncontrolled double pendulum (slow family), found by
# diffmech.control.verify.natural_eigenmode (shooting with rtol 1e-11; re-checked in a slow test)
NATURAL_Q0 = (0.2305, 0.3432483782121355)
NATURAL_T = 2.635524647384638


def paper_pendulum(dtype=torch.float64) -> object:
    return double_pendulum(stiffness=SPRING, rest=REST, bob_radius=0.0, dtype=dtype, gravity=9.81)


def system(potential: bool = True, *, dtype=torch.float64, hidden: int = 8, seed: int = 0) -> HamiltonianSystem:
    torch.manual_seed(seed)
    pot = MLPPotential(2, hidden=hidden, dtype=dtype) if potential else None
    return HamiltonianSystem(paper_pendulum(dtype), pot)


def simple_pendulum_system(dtype=torch.float64) -> HamiltonianSystem:
    return HamiltonianSystem(pendulum(bob_radius=0.0, dtype=dtype, gravity=9.81))
