"""Rigid-body algorithms: pure functions of a :class:`~diffmech.RobotModel` and batched states."""

from .aba import aba, forward_dynamics
from .compiled import CompiledDynamics, compiled
from .crba import crba
from .energy import kinetic_energy, potential_energy
from .kinematics import center_of_mass, forward_kinematics, integrate, jacobian, link_pose
from .rnea import bias_forces, generalized_gravity, rnea

__all__ = [
    "aba", "forward_dynamics", "compiled", "CompiledDynamics", "crba", "rnea", "bias_forces", "generalized_gravity",
    "kinetic_energy",
    "potential_energy", "forward_kinematics", "link_pose", "jacobian", "center_of_mass", "integrate",
]
