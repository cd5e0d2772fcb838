"""Simulation: fixed-step integrators and differentiable rollouts with a checkpointed adjoint."""

from .integrators import (
    INTEGRATORS,
    RK4,
    ExplicitEuler,
    ExplicitMidpoint,
    Integrator,
    SemiImplicitEuler,
    VariationalMidpoint,
    get_integrator,
)
from .rollout import ADJOINTS, rollout

__all__ = [
    "rollout", "ADJOINTS", "INTEGRATORS", "Integrator", "ExplicitEuler", "SemiImplicitEuler", "ExplicitMidpoint",
    "RK4", "VariationalMidpoint", "get_integrator",
]
