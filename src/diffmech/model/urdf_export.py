"""A robot's current parameters written back as a URDF (``RobotModel.to_urdf``).

What is written: every link with its current mass, centre of mass and rotational inertia (an
``<inertial>`` with ``rpy="0 0 0"``: the inertia about the centre of mass in link axes, as the model
holds it; a massless link gets explicit zeros, so that PyBullet does not give it its default of
1 kg), every joint (fixed ones too) with its current origin, unit axis, limits, damping, friction
and ``<mimic>`` (a chain of mimic joints is written resolved to its independent joint), and the
``<visual>``/``<collision>`` and ``<material>`` elements of the source file (mesh paths absolute,
``package://`` kept). Numbers are written with ``repr``, so a float64 value comes back exactly.
Learnable parameters are written at their current (e.g. identified) values.

What URDF cannot say, and how it is handled:

* a floating base: URDF has no free joint; a comment says so and the file is loaded with
  ``load_urdf(path, floating_base=True)``;
* gravity other than ``(0, 0, -9.81)`` and joint springs (``stiffness``): a comment and a warning;
* infinite limits: the attribute is left out (diffmech reads an absent limit as infinite); a
  revolute joint without finite position limits is written ``continuous``. urdfdom (Pinocchio,
  ROS) needs ``effort`` and ``velocity`` on revolute and prismatic joints, so such a file from a
  robot with infinite effort or velocity limits loads in diffmech and PyBullet but not in Pinocchio;
* the rest of the source file (``<transmission>``, ``<gazebo>``, other link children, comments)
  is not kept: diffmech does not read it.
"""

from __future__ import annotations

import math
import os
import xml.etree.ElementTree as ET

import torch

from .._warnings import warn
from ..errors import ModelError
from .validate import check_joint_values, check_link_values

__all__ = ["robot_to_urdf"]

_DEFAULT_GRAVITY = (0.0, 0.0, -9.81)


def _comment(text: str) -> ET.Element:
    return ET.Comment(" " + text.replace("--", "- -") + " ")  # "--" may not appear in an XML comment


def _num(x: float) -> str:
    return repr(float(x))


def _vec(xs) -> str:
    return " ".join(_num(x) for x in xs)


def _values(robot) -> dict[str, list]:
    """The raw parameters as float64 Python lists, checked to re-load as a valid model."""
    with torch.no_grad():
        raw = robot.raw_parameters()
    v = {k: t.detach().to("cpu", torch.float64) for k, t in raw._asdict().items()}
    name = robot.name
    # the loader's own rules (diffmech.model.validate), so that what is written is what loads
    for i, link in enumerate(robot.tree.link_names):
        sym = 0.5 * (v["inertia"][i] + v["inertia"][i].T)  # a parametrisation may leave rounding asymmetry
        try:
            check_link_values(f"{name}: link '{link}'", v["mass"][i], v["com"][i].tolist(), sym.tolist())
        except ModelError as err:
            raise ModelError(f"{err}; cannot write a URDF that loads") from None
        v["inertia"][i] = sym
    for k, joint in enumerate(robot.tree.all_joint_names):
        values = {kind: v[f"origin_{kind}"][k].tolist() for kind in ("xyz", "rpy")}
        values.update({kind: float(v[kind][k]) for kind in ("damping", "friction", "stiffness", "rest")
                       if v[kind][k].numel() == 1})
        try:
            check_joint_values(f"{name}: joint '{joint}'", **values)
        except ModelError as err:
            raise ModelError(f"{err}; cannot write a URDF") from None
    return {k: t.tolist() for k, t in v.items()}


def _mimic_of(tree) -> dict[str, tuple[str, float, float]]:
    """``{joint: (independent joint, multiplier, offset)}`` of the joints that mimic another one."""
    coords = tree.coords
    if coords is None:
        return {}
    q0 = 7 * tree.nfree
    independent = set(coords.joint_names)
    out = {}
    for m, joint in enumerate(tree.joint_names):
        if joint in independent:
            continue
        i = q0 + m
        out[joint] = (coords.joint_names[coords.q_src[i] - q0], coords.q_scale[i], coords.q_offset[i])
    return out


def _joint(root: ET.Element, robot, k: int, values: dict, mimic: dict) -> None:
    tree = robot.tree
    name, kind = tree.all_joint_names[k], tree.joint_kinds[k]
    m = tree.joint_names.index(name) if kind != "fixed" else -1
    lower, upper = (tree.lower[m], tree.upper[m]) if m >= 0 else (-math.inf, math.inf)
    if kind == "revolute" and not (math.isfinite(lower) or math.isfinite(upper)):
        kind = "continuous"
    el = ET.SubElement(root, "joint", name=name, type=kind)
    ET.SubElement(el, "parent", link=tree.link_names[tree.link_parent[k + 1]])
    ET.SubElement(el, "child", link=tree.link_names[k + 1])
    ET.SubElement(el, "origin", xyz=_vec(values["origin_xyz"][k]), rpy=_vec(values["origin_rpy"][k]))
    if kind == "fixed":
        return
    ET.SubElement(el, "axis", xyz=_vec(tree.axes[m]))
    limits = {"effort": tree.effort[m], "velocity": tree.velocity[m]}
    if kind != "continuous":
        limits = {"lower": lower, "upper": upper, **limits}
    limits = {a: _num(x) for a, x in limits.items() if math.isfinite(x)}
    if limits:
        ET.SubElement(el, "limit", **limits)
    damping, friction = values["damping"][k], values["friction"][k]
    if damping or friction:
        ET.SubElement(el, "dynamics", damping=_num(damping), friction=_num(friction))
    if name in mimic:
        joint, multiplier, offset = mimic[name]
        ET.SubElement(el, "mimic", joint=joint, multiplier=_num(multiplier), offset=_num(offset))


def robot_to_urdf(robot, path: str | os.PathLike | None = None) -> str:
    """Write ``robot``'s current parameters as a URDF (see the module docstring for what is kept).

    Args:
        robot: a :class:`~diffmech.RobotModel` (any dtype and device; learnable parameters are
            written at their current values).
        path: file to write (its directory must exist); ``None`` to only return the text.

    Returns:
        The URDF text.

    Raises:
        ModelError: a parameter the URDF could not carry to a valid model (non-finite, a negative
            mass, an inertia that is not positive semi-definite), naming the link or joint; a ball
            joint (URDF has no spherical joint type), naming it.
    """
    tree = robot.tree
    balls = [n for n, kind in zip(tree.all_joint_names, tree.joint_kinds) if kind == "ball"]
    if balls:
        raise ModelError(f"{robot.name}: joint '{balls[0]}' is a ball joint, which URDF cannot express (its joint "
                         "types turn or slide about one axis); save the model with torch.save instead")
    values = _values(robot)
    kept = getattr(robot, "meta", {}).get("urdf", {})
    geometry = kept.get("geometry", {})
    root = ET.Element("robot", name=robot.name)
    root.append(_comment(f"written by diffmech from {robot.source}"))
    if tree.floating_base:
        root.append(_comment(f"floating base: '{tree.link_names[0]}' is free (URDF has no free joint); "
                             "load with diffmech.load_urdf(path, floating_base=True)"))
    gravity = tuple(values["gravity"])
    g = robot.gravity.detach().cpu()
    if not torch.equal(g, torch.tensor(_DEFAULT_GRAVITY, dtype=g.dtype)):  # float32 -9.81 is the default
        root.append(_comment(f"gravity {_vec(gravity)} m/s^2 (URDF has no gravity)"))
        warn(f"{robot.name}: gravity {gravity} is not written to the URDF (URDF has no gravity); "
             "pass gravity= to load_urdf")
    springs = [(n, s) for n, s in zip(tree.all_joint_names, values["stiffness"]) if s]
    if springs:
        where = ", ".join(f"'{n}' (stiffness {s})" for n, s in springs)
        root.append(_comment(f"joint springs not written (URDF has none): {where}"))
        warn(f"{robot.name}: joint springs are not written to the URDF (URDF has none): {where}")
    for text in kept.get("materials", []):
        root.append(ET.fromstring(text))
    for i, link in enumerate(tree.link_names):
        el = ET.SubElement(root, "link", name=link)
        inertial = ET.SubElement(el, "inertial")
        ET.SubElement(inertial, "origin", xyz=_vec(values["com"][i]), rpy="0.0 0.0 0.0")
        ET.SubElement(inertial, "mass", value=_num(values["mass"][i]))
        inertia = values["inertia"][i]
        ET.SubElement(inertial, "inertia", ixx=_num(inertia[0][0]), ixy=_num(inertia[0][1]),
                      ixz=_num(inertia[0][2]), iyy=_num(inertia[1][1]), iyz=_num(inertia[1][2]),
                      izz=_num(inertia[2][2]))
        for text in geometry.get(link, []):
            el.append(ET.fromstring(text))
    mimic = _mimic_of(tree)
    for k in range(len(tree.all_joint_names)):
        _joint(root, robot, k, values, mimic)
    ET.indent(root)
    text = '<?xml version="1.0"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
    if path is not None:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    return text
