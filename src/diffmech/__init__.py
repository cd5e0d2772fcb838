"""diffmech: differentiable, learnable mechanics in PyTorch."""

from . import sim
from .dynamics import (
    aba,
    bias_forces,
    center_of_mass,
    crba,
    forward_dynamics,
    forward_kinematics,
    generalized_gravity,
    integrate,
    jacobian,
    kinetic_energy,
    link_pose,
    potential_energy,
    rnea,
)
from .errors import ConvergenceError, DiffmechError, ModelError, ShapeError, SimulationError, URDFError
from .model import JointSpec, LinkSpec, RobotModel, RobotSpec, load_urdf, parse_urdf

__version__ = "0.1.0"

__all__ = [
    "sim", "RobotModel", "RobotSpec", "LinkSpec", "JointSpec", "load_urdf", "parse_urdf",
    "forward_kinematics", "link_pose", "jacobian", "center_of_mass", "integrate",
    "rnea", "crba", "aba", "forward_dynamics", "bias_forces", "generalized_gravity",
    "kinetic_energy", "potential_energy",
    "DiffmechError", "ModelError", "URDFError", "ShapeError", "ConvergenceError", "SimulationError",
]
