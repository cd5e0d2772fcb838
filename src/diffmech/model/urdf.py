"""URDF -> :class:`~diffmech.model.spec.RobotSpec`, with yourdfpy parsing the XML (``diffmech.load_urdf``
turns the spec into a :class:`~diffmech.RobotModel`)."""

from __future__ import annotations

import io
import math
import os
import warnings

import numpy as np

from ..errors import URDFError
from .spec import JOINT_TYPES, JointSpec, LinkSpec, RobotSpec

__all__ = ["parse_urdf"]


def _rpy(R: np.ndarray) -> tuple[float, float, float]:
    sp = float(np.clip(-R[2, 0], -1.0, 1.0))
    pitch = math.asin(sp)
    if math.hypot(R[2, 1], R[2, 2]) < 1e-10:  # gimbal lock: put all of the rotation into roll
        return (math.atan2(-R[1, 2], R[1, 1]), pitch, 0.0)
    return (math.atan2(R[2, 1], R[2, 2]), pitch, math.atan2(R[1, 0], R[0, 0]))


def _num(value, what: str, src: str) -> float:
    if value is None:
        return 0.0
    try:
        return float(value)
    except (TypeError, ValueError):
        raise URDFError(f"{src}: {what} is not a number: {value!r}") from None


_NUMERIC = {
    "link": {"inertial/mass": ["value"], "inertial/origin": ["xyz", "rpy"],
             "inertial/inertia": ["ixx", "ixy", "ixz", "iyy", "iyz", "izz"]},
    "joint": {"origin": ["xyz", "rpy"], "axis": ["xyz"], "limit": ["lower", "upper", "effort", "velocity"],
              "dynamics": ["damping", "friction"]},
}


def _check_numbers(root, src: str) -> None:
    """Name the link or joint whose numeric attribute is not a number (yourdfpy would not)."""
    for kind, paths in _NUMERIC.items():
        for el in root.findall(kind):
            name = el.get("name", "?")
            for path, attrs in paths.items():
                for sub in el.findall(path):
                    for attr in attrs:
                        value = sub.get(attr)
                        if value is None:
                            continue
                        try:
                            [float(x) for x in value.split()]
                        except ValueError:
                            raise URDFError(
                                f"{src}: {kind} '{name}': <{path.split('/')[-1]} {attr}> is not a number: {value!r}"
                            ) from None


def parse_urdf(path_or_xml: str | os.PathLike) -> RobotSpec:
    """Read a URDF file (or an XML string) into a :class:`RobotSpec`.

    Raises:
        URDFError: malformed XML, unknown joint types, mimic joints, bad numbers; the message
            names the file and the joint or link.
    """
    import yourdfpy
    from lxml import etree

    text = os.fspath(path_or_xml)
    is_xml = text.lstrip().startswith("<")
    src = "<urdf string>" if is_xml else text
    if not is_xml and not os.path.isfile(text):
        raise URDFError(f"{src}: no such URDF file")
    raw = text.encode() if is_xml else open(text, "rb").read()
    try:
        # yourdfpy falls back to lxml's recover mode on syntax errors, silently repairing broken files,
        # so the document is checked with a strict parser first.
        root = etree.fromstring(raw, etree.XMLParser(recover=False, remove_comments=True))
    except etree.XMLSyntaxError as e:
        raise URDFError(f"{src}: malformed XML: {e}") from None
    if root.tag != "robot":
        raise URDFError(f"{src}: the root element is <{root.tag}>, expected <robot>")
    _check_numbers(root, src)
    try:
        data = io.BytesIO(raw)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            urdf = yourdfpy.URDF.load(
                data, build_scene_graph=False, build_collision_scene_graph=False,
                load_meshes=False, load_collision_meshes=False,
            )
    except etree.XMLSyntaxError as e:
        raise URDFError(f"{src}: malformed XML: {e}") from None
    except Exception as e:  # yourdfpy raises assorted errors on invalid content
        raise URDFError(f"{src}: cannot parse URDF: {type(e).__name__}: {e}") from None
    robot = urdf.robot
    links = []
    for link in robot.links:
        inert = link.inertial
        if inert is None:
            links.append(LinkSpec(name=link.name, has_inertial=False))
            continue
        T = np.eye(4) if inert.origin is None else np.asarray(inert.origin, dtype=float)
        Rin = T[:3, :3]
        I = np.zeros((3, 3)) if inert.inertia is None else np.asarray(inert.inertia, dtype=float)
        Ilink = Rin @ I @ Rin.T  # inertial <origin rpy> rotates the principal axes into the link frame
        links.append(LinkSpec(
            name=link.name,
            mass=_num(inert.mass, f"mass of link '{link.name}'", src),
            com=tuple(float(x) for x in T[:3, 3]),
            inertia=tuple(tuple(float(x) for x in row) for row in Ilink),
        ))
    joints = []
    for j in robot.joints:
        if j.type not in JOINT_TYPES:
            raise URDFError(
                f"{src}: joint '{j.name}' has type '{j.type}', which diffmech does not support "
                f"(supported: {', '.join(JOINT_TYPES)}; use floating_base=True for a free root)"
            )
        if j.mimic is not None:
            raise URDFError(
                f"{src}: joint '{j.name}' mimics '{j.mimic.joint}'; mimic joints are not supported "
                "(remove the <mimic> tag to make it an independent joint)"
            )
        T = np.eye(4) if j.origin is None else np.asarray(j.origin, dtype=float)
        axis = (1.0, 0.0, 0.0) if j.axis is None else tuple(float(a) for a in j.axis)
        lim = j.limit
        dyn = j.dynamics

        def value(group, attr: str, default: float, joint: str = j.name) -> float:
            raw = None if group is None else getattr(group, attr)
            return default if raw is None else _num(raw, f"{attr} of joint '{joint}'", src)

        lower, upper = value(lim, "lower", -math.inf), value(lim, "upper", math.inf)
        if j.type == "continuous":
            lower, upper = -math.inf, math.inf
        joints.append(JointSpec(
            name=j.name, type=j.type, parent=j.parent, child=j.child,
            xyz=tuple(float(x) for x in T[:3, 3]), rpy=_rpy(T[:3, :3]), axis=axis,
            lower=lower, upper=upper,
            velocity=value(lim, "velocity", math.inf), effort=value(lim, "effort", math.inf),
            damping=value(dyn, "damping", 0.0), friction=value(dyn, "friction", 0.0),
        ))
    return RobotSpec(name=robot.name or "robot", links=links, joints=joints, source=src)
