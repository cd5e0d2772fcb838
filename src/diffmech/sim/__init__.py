"""Simulation: fixed-step integrators, scenes with frictional contact, and differentiable rollouts with a
checkpointed adjoint."""

from ._ground_step import prepare_ground_kernels
from .contact_step import contact_step
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
from .scene import Scene, warn_initial_penetration
from .stability import stable_dt

__all__ = [
    "rollout", "Scene", "warn_initial_penetration", "contact_step", "prepare_ground_kernels",
    "ADJOINTS", "stable_dt", "INTEGRATORS", "Integrator", "ExplicitEuler", "SemiImplicitEuler",
    "ExplicitMidpoint", "RK4", "VariationalMidpoint", "get_integrator",
]
