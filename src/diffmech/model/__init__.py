"""Robot descriptions: :class:`RobotModel`, URDF loading, parametrizations and builders."""

from .robot import RobotModel
from .spec import JointSpec, LinkSpec, RobotSpec
from .urdf import load_urdf, parse_urdf

__all__ = ["RobotModel", "RobotSpec", "LinkSpec", "JointSpec", "load_urdf", "parse_urdf"]
