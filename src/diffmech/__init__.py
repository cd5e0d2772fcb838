"""diffmech: differentiable, learnable mechanics in PyTorch."""

from . import ik, sim
from .dynamics import (
    aba,
    bias_forces,
    center_of_mass,
    crba,
    forward_dynamics,
    forward_kinematics,
    generalized_gravity,
    integrate,
    inverse_dynamics,
    jacobian,
    kinetic_energy,
    link_pose,
    mass_matrix,
    potential_energy,
    rnea,
)
from .errors import (
    ConvergenceError,
    DiffmechError,
    ModelError,
    OptionError,
    ShapeError,
    SimulationError,
    URDFError,
)
from .ik import inverse_kinematics
from .model import JointSpec, KinematicTree, LinkSpec, RobotSpec, parse_urdf
from .model import systems as systems
from .model.mjcf import load_mjcf
from .robot import RobotModel, load_urdf

__version__ = "0.1.0"

# Subpackages with heavier imports load on first use: ``diffmech.learn.X`` works after ``import diffmech``.
_LAZY = ("compat", "contact", "control", "dynamics", "implicit", "learn", "model", "perf", "rl", "spatial",
         "viz")


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "sim", "ik", "systems", "RobotModel", "KinematicTree",
    "RobotSpec", "LinkSpec", "JointSpec", "load_urdf", "load_mjcf", "parse_urdf",
    "forward_kinematics", "link_pose", "jacobian", "center_of_mass", "integrate",
    "rnea", "inverse_dynamics", "crba", "mass_matrix", "aba", "forward_dynamics", "bias_forces",
    "generalized_gravity", "kinetic_energy", "potential_energy", "inverse_kinematics",
    "DiffmechError", "ModelError", "URDFError", "ShapeError", "OptionError", "ConvergenceError", "SimulationError",
]
