"""Robot descriptions: :class:`RobotModel`, URDF loading, parametrizations and builders."""

from . import systems
from .params import (
    IndependentInertial,
    PhysicallyConsistentInertial,
    PositiveScalar,
    SymmetricPositiveDefinite,
    inertial_regressor,
    make_link_inertial_learnable,
)
from .robot import RobotModel
from .spec import JointSpec, LinkSpec, RobotSpec
from .urdf import load_urdf, parse_urdf

__all__ = [
    "RobotModel", "RobotSpec", "LinkSpec", "JointSpec", "load_urdf", "parse_urdf", "systems",
    "PositiveScalar", "SymmetricPositiveDefinite", "PhysicallyConsistentInertial", "IndependentInertial",
    "make_link_inertial_learnable", "inertial_regressor",
]
