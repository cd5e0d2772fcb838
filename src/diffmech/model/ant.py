"""The Ant: a floating sphere torso with four two-joint capsule legs (the MuJoCo Ant's geometry).

:class:`AntGeometry` holds the dimensions, :func:`ant_robot` builds the diffmech
:class:`~diffmech.RobotModel` with its collision shapes, and :func:`ant_mjcf` writes the same robot
as an MJCF string for the ``mujoco`` package (both from one :class:`AntGeometry`, so a policy
trained on one runs on the other).

Geometry (world axes at ``q = 0``, torso at the origin, ``+x`` forward). Legs point along the four
diagonals ``u = (sx, sy, 0) / sqrt(2)``, ``sx, sy = +-1``, named ``front_left`` (``+x +y``),
``front_right`` (``+x -y``), ``back_left`` (``-x +y``) and ``back_right`` (``-x -y``). Each leg:

* a fixed capsule on the torso from the torso's centre to the hip at ``hip_offset * u``;
* the hip joint (about ``+z``, limits ``hip_range``) and the thigh, a capsule from the hip to the
  ankle at ``thigh_length * u`` further out;
* the ankle joint about ``z x u`` (horizontal, across the leg; a positive angle turns the foot
  down, limits ``ankle_range``) and the shin, a capsule of ``shin_length`` along ``u`` at
  ``q = 0`` (horizontal) ending at the foot.

Capsules have radius ``leg_radius``; bodies have uniform ``density`` (kg/m^3), so the masses and
inertias are the shapes' (the torso link carries the sphere and the four fixed capsules). The
joints' ``q`` order: ``hip``, ``ankle`` of ``front_left``, ``front_right``, ``back_left``,
``back_right``. Defaults: the MuJoCo Ant's (torso radius 0.25 m, capsules of radius 0.08 m, hip
offset and thigh ``0.2 sqrt 2`` m, shin ``0.4 sqrt 2`` m, density 5, hips +-30 deg, ankles
30..70 deg, joint damping 1 N m s/rad, armature 1 kg m^2, gear 150 N m).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ModelError
from ..robot import RobotModel
from .collision import Shape, set_collision_shapes
from .spec import JointSpec, LinkSpec, RobotSpec

__all__ = ["AntGeometry", "LEGS", "ant_robot", "ant_mjcf", "capsule_inertia", "ant_link_inertials"]

# (name, sx, sy): the leg's direction (sx, sy, 0) / sqrt(2)
LEGS = (("front_left", 1, 1), ("front_right", 1, -1), ("back_left", -1, 1), ("back_right", -1, -1))


@dataclass(frozen=True)
class AntGeometry:
    """Dimensions of the Ant (m, kg/m^3, rad, N m s/rad, kg m^2, N m); see the module docstring."""

    torso_radius: float = 0.25
    leg_radius: float = 0.08
    hip_offset: float = 0.2 * math.sqrt(2.0)
    thigh_length: float = 0.2 * math.sqrt(2.0)
    shin_length: float = 0.4 * math.sqrt(2.0)
    density: float = 5.0
    hip_range: tuple[float, float] = (-math.radians(30.0), math.radians(30.0))
    ankle_range: tuple[float, float] = (math.radians(30.0), math.radians(70.0))
    damping: float = 1.0
    armature: float = 1.0
    gear: float = 150.0

    def __post_init__(self):
        for k in ("torso_radius", "leg_radius", "hip_offset", "thigh_length", "shin_length", "density", "gear"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ModelError(f"AntGeometry: {k} must be a positive number, got {v!r}")
        for k in ("damping", "armature"):
            v = getattr(self, k)
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ModelError(f"AntGeometry: {k} must be a non-negative number, got {v!r}")
        for k in ("hip_range", "ankle_range"):
            lo, hi = getattr(self, k)
            if not lo < hi:
                raise ModelError(f"AntGeometry: {k} must be (lower, upper) with lower < upper, got {(lo, hi)}")


def capsule_inertia(radius: float, length: float, density: float) -> tuple[float, float, float]:
    """``(mass, i_perp, i_axial)`` of a solid capsule (kg, kg m^2 about its centre): a cylinder of
    ``length`` plus two half-spheres whose centres of mass sit ``3 r / 8`` beyond its ends."""
    r, h = radius, length
    mc, ms = density * math.pi * r**2 * h, density * 4.0 / 3.0 * math.pi * r**3
    d = h / 2 + 3 * r / 8
    i_perp = mc * (3 * r**2 + h**2) / 12 + ms * (83 * r**2 / 320 + d**2)
    i_axial = mc * r**2 / 2 + ms * 2 * r**2 / 5
    return mc + ms, i_perp, i_axial


def _combine(parts: list[tuple[float, np.ndarray, np.ndarray]]) -> tuple[float, np.ndarray, np.ndarray]:
    """Mass, centre of mass and inertia about it of rigid parts ``(mass, centre (3,), inertia about
    the centre (3, 3))`` in one frame."""
    m = sum(p[0] for p in parts)
    c = sum(p[0] * p[1] for p in parts) / m
    inertia = np.zeros((3, 3))
    for mi, ci, Ii in parts:
        d = ci - c
        inertia += Ii + mi * (d @ d * np.eye(3) - np.outer(d, d))
    return m, c, inertia


def _capsule_part(geo: AntGeometry, start: np.ndarray, u: np.ndarray, length: float):
    m, ip, ia = capsule_inertia(geo.leg_radius, length, geo.density)
    uu = np.outer(u, u)
    return m, start + 0.5 * length * u, ip * (np.eye(3) - uu) + ia * uu


def ant_link_inertials(geo: AntGeometry | None = None) -> dict[str, tuple[float, np.ndarray, np.ndarray]]:
    """``{link: (mass kg, centre of mass (3,) m, inertia about it (3, 3) kg m^2)}`` in each link's
    frame (the torso's centre; a thigh's hip; a shin's ankle), from the shapes and the density."""
    geo = geo or AntGeometry()
    rt = geo.torso_radius
    ms = geo.density * 4.0 / 3.0 * math.pi * rt**3
    torso = [(ms, np.zeros(3), 0.4 * ms * rt**2 * np.eye(3))]
    out = {}
    for name, sx, sy in LEGS:
        u = np.array([sx, sy, 0.0]) / math.sqrt(2.0)
        torso.append(_capsule_part(geo, np.zeros(3), u, geo.hip_offset))
        out[f"{name}_thigh"] = _capsule_part(geo, np.zeros(3), u, geo.thigh_length)
        out[f"{name}_shin"] = _capsule_part(geo, np.zeros(3), u, geo.shin_length)
    return {"torso": _combine(torso), **out}


def _capsule_shape(geo: AntGeometry, u: np.ndarray, length: float) -> Shape:
    # a capsule's axis is its local z: pitch it down to x, then yaw it onto u
    yaw = math.atan2(u[1], u[0])
    c = 0.5 * length * u
    return Shape("capsule", (geo.leg_radius, length), xyz=tuple(c.tolist()), rpy=(0.0, math.pi / 2, yaw))


def ant_robot(geometry: AntGeometry | None = None, *, dtype=torch.float64, device=None) -> RobotModel:
    """The Ant as a :class:`~diffmech.RobotModel` with a floating base (``nq = 15``: torso
    position, quaternion ``(qx, qy, qz, qw)``, 8 joint angles; ``nv = 14``) and collision shapes:
    a sphere on the torso and a capsule on every leg segment (the module docstring).

    The joints carry their limits but no damping (the scene applies ``geometry.damping`` and
    ``geometry.armature`` as drives, implicitly, see :func:`diffmech.sim.scenes.ant`).
    """
    geo = geometry or AntGeometry()
    inert = ant_link_inertials(geo)

    def link(name):
        m, c, inertia = inert[name]
        return LinkSpec(name, mass=float(m), com=tuple(c.tolist()), inertia=tuple(map(tuple, inertia.tolist())))

    links, joints = [link("torso")], []
    for name, sx, sy in LEGS:
        u = np.array([sx, sy, 0.0]) / math.sqrt(2.0)
        links += [link(f"{name}_thigh"), link(f"{name}_shin")]
        joints.append(JointSpec(f"{name}_hip", "revolute", "torso", f"{name}_thigh",
                                xyz=tuple((geo.hip_offset * u).tolist()), axis=(0.0, 0.0, 1.0),
                                lower=geo.hip_range[0], upper=geo.hip_range[1], effort=geo.gear))
        joints.append(JointSpec(f"{name}_ankle", "revolute", f"{name}_thigh", f"{name}_shin",
                                xyz=tuple((geo.thigh_length * u).tolist()), axis=(-u[1], u[0], 0.0),
                                lower=geo.ankle_range[0], upper=geo.ankle_range[1], effort=geo.gear))
    robot = RobotModel(RobotSpec("ant", links, joints), floating_base=True, dtype=dtype, device=device)
    shapes = [Shape("sphere", (geo.torso_radius,))]
    for name, sx, sy in LEGS:
        u = np.array([sx, sy, 0.0]) / math.sqrt(2.0)
        shapes.append(_capsule_shape(geo, u, geo.hip_offset))
        set_collision_shapes(robot, f"{name}_thigh", _capsule_shape(geo, u, geo.thigh_length))
        set_collision_shapes(robot, f"{name}_shin", _capsule_shape(geo, u, geo.shin_length))
    set_collision_shapes(robot, "torso", shapes)
    expected = [f"{n}_{j}" for n, _, _ in LEGS for j in ("hip", "ankle")]
    if list(robot.joint_names) != expected:  # the action and observation layout rely on it
        raise ModelError(f"ant_robot: unexpected joint order {list(robot.joint_names)}")
    return robot


def _v(x) -> str:
    return " ".join(f"{float(a):.17g}" for a in x)


def ant_mjcf(geometry: AntGeometry | None = None, *, timestep: float = 0.01, friction: float = 1.0,
             integrator: str = "Euler", torso_height: float = 0.75) -> str:
    """The Ant of ``geometry`` as an MJCF document (for ``mujoco.MjModel.from_xml_string``).

    The same bodies, joints (order, axes, limits), capsules and density as :func:`ant_robot`, the
    masses computed by MuJoCo from the geoms; joint ``damping`` and ``armature`` from the geometry,
    one motor per joint of gear ``geometry.gear`` and control range ``[-1, 1]``; a ground plane of
    Coulomb friction ``friction``, contacts only between the ground and the robot (the robot's geoms
    do not touch each other), gravity ``-9.81 z``, step ``timestep`` s with ``integrator``.
    """
    geo = geometry or AntGeometry()
    r = geo.leg_radius
    deg = 180.0 / math.pi
    legs = []
    for name, sx, sy in LEGS:
        u = np.array([sx, sy, 0.0]) / math.sqrt(2.0)
        a = np.array([-u[1], u[0], 0.0])
        legs.append(f"""
      <geom name="{name}_hip_geom" type="capsule" size="{r!r}" fromto="0 0 0 {_v(geo.hip_offset * u)}"/>
      <body name="{name}_thigh" pos="{_v(geo.hip_offset * u)}">
        <joint name="{name}_hip" type="hinge" axis="0 0 1" range="{_v(np.array(geo.hip_range) * deg)}"/>
        <geom name="{name}_thigh_geom" type="capsule" size="{r!r}" fromto="0 0 0 {_v(geo.thigh_length * u)}"/>
        <body name="{name}_shin" pos="{_v(geo.thigh_length * u)}">
          <joint name="{name}_ankle" type="hinge" axis="{_v(a)}" range="{_v(np.array(geo.ankle_range) * deg)}"/>
          <geom name="{name}_shin_geom" type="capsule" size="{r!r}" fromto="0 0 0 {_v(geo.shin_length * u)}"/>
        </body>
      </body>""")
    motors = "\n".join(f'    <motor name="{n}_{j}_motor" joint="{n}_{j}" gear="{geo.gear!r}" ctrllimited="true" '
                       f'ctrlrange="-1 1"/>' for n, _, _ in LEGS for j in ("hip", "ankle"))
    return f"""<mujoco model="ant">
  <compiler angle="degree" inertiafromgeom="true"/>
  <option timestep="{timestep!r}" integrator="{integrator}" gravity="0 0 -9.81"/>
  <default>
    <joint limited="true" damping="{geo.damping!r}" armature="{geo.armature!r}"/>
    <geom density="{geo.density!r}" contype="1" conaffinity="0" condim="3" friction="{friction!r} 0.5 0.5"/>
  </default>
  <worldbody>
    <geom name="floor" type="plane" size="0 0 0.05" conaffinity="1" contype="1"/>
    <body name="torso" pos="0 0 {torso_height!r}">
      <freejoint name="root"/>
      <geom name="torso_geom" type="sphere" size="{geo.torso_radius!r}"/>{"".join(legs)}
    </body>
  </worldbody>
  <actuator>
{motors}
  </actuator>
</mujoco>
"""
