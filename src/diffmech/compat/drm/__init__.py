"""differentiable-robot-model's API on diffmech: a drop-in replacement for ``differentiable_robot_model``.

Replace the package name in the imports and the rest of the code runs unchanged::

    from differentiable_robot_model.robot_model import DifferentiableRobotModel   # before
    from diffmech.compat.drm.robot_model import DifferentiableRobotModel          # after
    from diffmech.compat.drm import DifferentiableRobotModel                      # or flat

Submodules mirror differentiable-robot-model's: :mod:`~diffmech.compat.drm.robot_model` (the robot
class and the ready-made robots), :mod:`~diffmech.compat.drm.rigid_body_params` (parametrizations),
:mod:`~diffmech.compat.drm.data_utils` (data sets). ``model.robot`` is the underlying
:class:`diffmech.RobotModel`. What differs from differentiable-robot-model is listed in
:mod:`diffmech.compat.drm.robot_model`.
"""

from .data_utils import (
    ForwardDynamicsDataset,
    InverseDynamicsDataset,
    generate_random_forward_kinematics_data,
    generate_random_inverse_dynamics_data,
    generate_sine_motion_forward_dynamics_data,
    generate_sine_motion_inverse_dynamics_data,
)
from .rigid_body_params import (
    CovParameterized3DInertiaMatrixNet,
    PositiveScalar,
    Symm3DInertiaMatrixNet,
    SymmPosDef3DInertiaMatrixNet,
    TriangParam3DInertiaMatrixNet,
    UnconstrainedScalar,
    UnconstrainedTensor,
)
from .robot_model import (
    DifferentiableAllegroHand,
    DifferentiableFetchArm,
    DifferentiableFrankaPanda,
    DifferentiableKinovaJaco,
    DifferentiableKUKAiiwa,
    DifferentiableRobotModel,
    DifferentiableTrifingerEdu,
    DifferentiableTwoLinkRobot,
    ParameterNameError,
    robot_description_folder,
)

__all__ = [
    "DifferentiableRobotModel", "DifferentiableKUKAiiwa", "DifferentiableFrankaPanda", "DifferentiableTwoLinkRobot",
    "DifferentiableTrifingerEdu", "DifferentiableAllegroHand", "DifferentiableFetchArm", "DifferentiableKinovaJaco",
    "ParameterNameError", "robot_description_folder",
    "UnconstrainedScalar", "PositiveScalar", "UnconstrainedTensor", "SymmPosDef3DInertiaMatrixNet",
    "CovParameterized3DInertiaMatrixNet", "Symm3DInertiaMatrixNet", "TriangParam3DInertiaMatrixNet",
    "InverseDynamicsDataset", "ForwardDynamicsDataset", "generate_random_forward_kinematics_data",
    "generate_random_inverse_dynamics_data", "generate_sine_motion_inverse_dynamics_data",
    "generate_sine_motion_forward_dynamics_data",
]
