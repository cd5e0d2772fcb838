"""Robot descriptions: the immutable :class:`KinematicTree`, the parameter values
(:class:`RobotParameters`, :class:`ModelTensors`), parametrizations, URDF parsing and export
(:mod:`.urdf_export`, behind ``RobotModel.to_urdf``), saving (:mod:`.persistence`) and builders.

Nothing here imports the algorithms. ``RobotModel``, ``load_urdf`` and ``systems`` (whose builders
return ``RobotModel`` s) sit above the algorithms and are reached lazily from this package.
"""

from .parameters import JointParams, LinkParams, ModelTensors, RawParameters, RobotParameters
from .params import (
    IndependentInertial,
    PhysicallyConsistentInertial,
    PositiveScalar,
    SymmetricPositiveDefinite,
    inertial_regressor,
    make_link_inertial_learnable,
)
from .spec import JointSpec, LinkSpec, RobotSpec
from .tree import KinematicTree
from .urdf import parse_urdf

__all__ = [
    "RobotModel", "RobotSpec", "LinkSpec", "JointSpec", "load_urdf", "parse_urdf", "systems",
    "KinematicTree", "RobotParameters", "ModelTensors", "RawParameters", "LinkParams", "JointParams",
    "PositiveScalar", "SymmetricPositiveDefinite", "PhysicallyConsistentInertial", "IndependentInertial",
    "make_link_inertial_learnable", "inertial_regressor",
]


def __getattr__(name: str):
    # The facade and the builders live above the algorithms; importing them here at load time would
    # run the algorithms' imports from this package (and cycle).
    if name in ("RobotModel", "load_urdf"):
        from .. import robot

        return getattr(robot, name)
    if name == "systems":
        import importlib

        return importlib.import_module(".systems", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
