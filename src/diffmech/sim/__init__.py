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
from .stability import stable_dt

__all__ = [
    "rollout", "ADJOINTS", "stable_dt", "INTEGRATORS", "Integrator", "ExplicitEuler", "SemiImplicitEuler",
    "ExplicitMidpoint", "RK4", "VariationalMidpoint", "get_integrator",
]
