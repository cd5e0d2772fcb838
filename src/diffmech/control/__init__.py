"""Control: learned conservative closed loops (eigenmodes), their stabilisation and certification."""

from .flow import Flow, FlowCache, Scheme, code_grid, effort_integral, get_scheme, hamiltonian_flow, uniform_grid
from .hamiltonian import HamiltonianSystem
from .potentials import MLPPotential, Potential, ZeroPotential

__all__ = [
    "HamiltonianSystem", "Potential", "MLPPotential", "ZeroPotential",
    "Flow", "FlowCache", "Scheme", "get_scheme", "code_grid", "uniform_grid", "hamiltonian_flow", "effort_integral",
]
