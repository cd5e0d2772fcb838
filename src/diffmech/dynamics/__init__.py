"""Rigid-body algorithms: pure functions of a robot's tree and parameter values and of batched states.

Each public function takes the robot (a :class:`~diffmech.RobotModel`; it reads only its
``tree`` and ``model_tensors``) first; ``robot.inverse_dynamics`` is literally :func:`rnea`, and so
on for every method. The ``*_flat`` functions of the submodules are the pure cores, of
``(tree, model_tensors, flat state)``.
"""

from ._common import check_finite_inputs
from ._world import set_eager_frame
from .aba import aba, forward_dynamics
from .compiled import CompiledDynamics, compiled
from .crba import crba, mass_matrix
from .energy import kinetic_energy, potential_energy
from .kinematics import center_of_mass, forward_kinematics, integrate, jacobian, link_pose
from .rnea import bias_forces, generalized_gravity, inverse_dynamics, rnea

__all__ = [
    "aba", "forward_dynamics", "rnea", "inverse_dynamics", "crba", "mass_matrix", "bias_forces",
    "generalized_gravity", "kinetic_energy", "potential_energy", "forward_kinematics", "link_pose", "jacobian",
    "center_of_mass", "integrate", "compiled", "CompiledDynamics", "set_eager_frame", "check_finite_inputs",
]
