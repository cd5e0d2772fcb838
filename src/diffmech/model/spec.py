"""Plain-data description of a robot, independent of any file format.

Parsers (:mod:`diffmech.model.urdf`) and builders (:mod:`diffmech.model.systems`) produce a
:class:`RobotSpec`; :class:`diffmech.RobotModel` turns it into tensors once.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

JOINT_TYPES = ("revolute", "continuous", "prismatic", "fixed", "ball")

Vec3 = tuple[float, float, float]
Mat3 = tuple[Vec3, Vec3, Vec3]

_ZERO3: Vec3 = (0.0, 0.0, 0.0)
_ZERO33: Mat3 = (_ZERO3, _ZERO3, _ZERO3)


@dataclass
class LinkSpec:
    """A rigid link.

    Attributes:
        name: unique link name.
        mass: kg.
        com: centre of mass in the link frame, m.
        inertia: rotational inertia about the centre of mass, in link-frame axes, kg m^2
            (a URDF ``<inertial><origin rpy>`` is already applied: ``R I R^T``).
        has_inertial: False when the description gave no inertial (the link is massless).
    """

    name: str
    mass: float = 0.0
    com: Vec3 = _ZERO3
    inertia: Mat3 = _ZERO33
    has_inertial: bool = True


@dataclass
class JointSpec:
    """A joint connecting ``parent`` to ``child``; the child link frame is the joint frame.

    Attributes:
        name: unique joint name.
        type: one of ``revolute``, ``continuous``, ``prismatic``, ``fixed``, ``ball``. A ``ball``
            (spherical) joint turns the child frame freely about the joint origin: its
            configuration is a unit quaternion ``(qx, qy, qz, qw)`` (4 coordinates of ``q``), its
            velocity the angular velocity of the child frame in the child frame (3 of ``v``), as
            Pinocchio's ``JointModelSpherical`` and the floating base's rotation.
        parent, child: link names.
        xyz, rpy: placement of the joint frame in the parent link frame (URDF ``<origin>``).
        axis: joint axis in the joint frame (normalised by the model; ignored by ``ball``).
        lower, upper: position limits (rad or m); infinite when absent. ``ball``: ``upper`` is the
            largest rotation angle from the neutral orientation (MuJoCo's cone, ``range[1]``, rad),
            ``lower`` is ignored; ``random_configuration`` samples within the cone, but the
            simulators' joint-limit constraints do not enforce it yet.
        velocity, effort: velocity and effort limits; infinite when absent.
        damping: viscous damping, N m s/rad (or N s/m).
        friction: Coulomb friction level, N m (stored; used by simulators, not by RNEA).
        stiffness, rest: joint spring ``tau = -stiffness (q - rest)`` (not supported on ``ball``
            joints: the model refuses a non-zero stiffness there). ``damping`` of a ``ball`` acts on
            each component of its angular velocity.
        mimic: ``(joint, multiplier, offset)`` when this joint follows another one,
            ``q = multiplier * q_joint + offset`` (URDF ``<mimic>``; multiplier 1 and offset 0 by
            default); None for an independent joint.
    """

    name: str
    type: str
    parent: str
    child: str
    xyz: Vec3 = _ZERO3
    rpy: Vec3 = _ZERO3
    axis: Vec3 = (1.0, 0.0, 0.0)
    lower: float = -math.inf
    upper: float = math.inf
    velocity: float = math.inf
    effort: float = math.inf
    damping: float = 0.0
    friction: float = 0.0
    stiffness: float = 0.0
    rest: float = 0.0
    mimic: tuple[str, float, float] | None = None


@dataclass
class RobotSpec:
    """A kinematic tree: links, joints, gravity, and where it came from (for error messages)."""

    name: str
    links: list[LinkSpec]
    joints: list[JointSpec]
    source: str = "<memory>"
    gravity: Vec3 = (0.0, 0.0, -9.81)
    meta: dict = field(default_factory=dict)
