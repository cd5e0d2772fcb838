"""URDF -> :class:`~diffmech.model.spec.RobotSpec`, with yourdfpy parsing the XML (``diffmech.load_urdf``
turns the spec into a :class:`~diffmech.RobotModel`)."""

from __future__ import annotations

import copy
import io
import math
import os
import re
import warnings

import numpy as np

from ..errors import ModelError, URDFError
from .spec import JOINT_TYPES, JointSpec, LinkSpec, RobotSpec
from .validate import check_number

__all__ = ["parse_urdf"]


def _rpy(R: np.ndarray) -> tuple[float, float, float]:
    cp = math.hypot(R[2, 1], R[2, 2])
    # atan2, not asin(-R[2, 0]): asin loses digits near +-pi/2, where pybullet_data's "1.5708" lies
    # (the racecar's steering hinges came out 4e-6 off, relative, in their gravity torque)
    pitch = math.atan2(-R[2, 0], cp)
    if cp < 1e-10:  # gimbal lock: put all of the rotation into roll
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
              "dynamics": ["damping", "friction"], "mimic": ["multiplier", "offset"]},
}

_VECTORS = ("xyz", "rpy")
_UNBOUNDED = ("lower", "upper", "effort", "velocity")  # infinite: no limit

# The <geometry> children yourdfpy reads; others (PyBullet's <plane>, <cdf>, <capsule>, ...) are dropped.
_GEOMETRY_TAGS = ("box", "cylinder", "sphere", "mesh")

# The XML declaration, after an optional UTF-8 byte-order mark and white space, up to its version number.
_DECLARATION = re.compile(rb"""\A(\xef\xbb\xbf)?\s*(<\?xml\s+version\s*=\s*["'])([^"']*)""")


def _check_numbers(root, src: str) -> None:
    """Name the link or joint whose numeric attribute is not a number or not as many as it should be
    (yourdfpy would not)."""
    for kind, paths in _NUMERIC.items():
        for el in root.findall(kind):
            name = el.get("name", "?")
            for path, attrs in paths.items():
                for sub in el.findall(path):
                    for attr in attrs:
                        value = sub.get(attr)
                        if value is None:
                            continue
                        tag = f"<{path.split('/')[-1]} {attr}>"
                        try:
                            numbers = [float(x) for x in value.split()]
                        except ValueError:
                            raise URDFError(f"{src}: {kind} '{name}': {tag} is not a number: {value!r}") from None
                        expected = 3 if attr in _VECTORS else 1
                        if len(numbers) != expected:  # yourdfpy would silently use the first three
                            raise URDFError(f"{src}: {kind} '{name}': {tag} has {len(numbers)} numbers, "
                                            f"expected {expected}: {value!r}")
                        # here, before an inertial <origin rpy> of inf turns the whole inertia into NaN
                        for i, x in enumerate(numbers):
                            try:
                                check_number(f"{src}: {kind} '{name}'", tag if expected == 1 else f"{tag}[{i}]", x,
                                             infinite=attr in _UNBOUNDED)
                            except ModelError as e:
                                raise URDFError(str(e)) from None


def _normalise_declaration(raw: bytes) -> bytes:
    """Accept the XML declarations that urdfdom (Pinocchio, ROS) and PyBullet accept and libxml2 refuses.

    pybullet_data writes ``<?xml version="0.0" ?>`` and some files put white space before the
    declaration; neither changes what the document means, so the version becomes 1.0 and the white
    space goes.
    """
    m = _DECLARATION.match(raw)
    if m is None:
        return raw
    version = m.group(3)
    if re.fullmatch(rb"1\.[0-9]+", version) is None:
        version = b"1.0"
    return (m.group(1) or b"") + m.group(2) + version + raw[m.end():]


def _parse_xml(raw: bytes, src: str):
    """The document's root element, checked strictly except for undeclared namespace prefixes.

    yourdfpy falls back to lxml's recover mode on syntax errors, silently repairing broken files,
    so the document is checked with a strict parser first. Prefixes without a namespace
    declaration (Gazebo's ``<sensor:camera>`` in fetch.urdf) are accepted, as urdfdom accepts them;
    libxml2 reports them as errors and then misses some syntax errors (junk after the root
    element), so such a document is checked by expat without namespace processing instead.
    """
    from xml.parsers import expat

    from lxml import etree

    raw = _normalise_declaration(raw)
    parser = etree.XMLParser(recover=False, remove_comments=True)
    try:
        return etree.fromstring(raw, parser)
    except etree.XMLSyntaxError as e:
        bad = [err for err in parser.error_log if err.domain_name != "NAMESPACE"]
        if bad or len(parser.error_log) == 0:
            detail = f"{bad[0].message}, line {bad[0].line}, column {bad[0].column}" if bad else e
            raise URDFError(f"{src}: malformed XML: {detail}") from None
    try:
        expat.ParserCreate().Parse(raw, True)
    except expat.ExpatError as e:
        raise URDFError(f"{src}: malformed XML: {e}") from None
    # well-formed: recover mode only keeps the undeclared prefixes in the tag names
    return etree.fromstring(raw, etree.XMLParser(recover=True, remove_comments=True))


def _drop_extensions(root) -> None:
    """Remove elements and attributes with an undeclared namespace prefix (simulator extensions, not URDF)."""
    for el in list(root.iter()):
        if isinstance(el.tag, str) and ":" in el.tag and not el.tag.startswith("{"):
            el.getparent().remove(el)
            continue
        for attr in [a for a in el.attrib if ":" in a and not a.startswith("{")]:
            del el.attrib[attr]


def _drop_unknown_geometry(root) -> dict[str, list[str]]:
    """Remove the <visual>/<collision> elements whose geometry yourdfpy cannot read.

    Returns:
        ``{tag: [link names]}`` of what was removed (``"empty <geometry>"`` for a missing or empty one).
    """
    dropped: dict[str, list[str]] = {}
    for link in root.findall("link"):
        for kind in ("visual", "collision"):
            for el in link.findall(kind):
                geom = el.find("geometry")
                first = geom[0].tag if geom is not None and len(geom) else None
                if first in _GEOMETRY_TAGS:
                    continue
                link.remove(el)
                tag = f"<{first}>" if isinstance(first, str) else "empty <geometry>"
                names = dropped.setdefault(tag, [])
                if link.get("name", "?") not in names:
                    names.append(link.get("name", "?"))
    return dropped


def _resolve_file(filename: str, base: str | None) -> str:
    """An absolute path for a mesh or texture ``filename`` of a file in directory ``base``.

    A relative path, or a ``package://`` URI with the prefix taken off, is looked up in ``base`` and
    then its two parent directories, the first where the file exists (PyBullet looks there too, and
    diff_robot_data's and pybullet_data's files rely on it). Where none has it, a ``package://`` URI
    is kept (it needs ROS package paths) and a relative path is taken relative to ``base``. Without
    ``base`` (a URDF given as a string) relative paths and URIs are kept.
    """
    package = filename.startswith("package://")
    rel = filename[len("package://"):] if package else filename.removeprefix("file://")
    if os.path.isabs(rel) and not package:
        return rel
    if base is None:
        return filename
    d = base
    for _ in range(3):
        candidate = os.path.normpath(os.path.join(d, rel))
        if os.path.exists(candidate):
            return candidate
        d = os.path.dirname(d)
    return filename if package else os.path.normpath(os.path.join(base, rel))


def _keep_geometry(root, base: str | None) -> dict:
    """The ``<visual>``/``<collision>``/``<contact>`` elements of each link and the top-level
    ``<material>`` elements, as XML text with absolute mesh and texture paths (what ``RobotModel.to_urdf`` writes
    back and what viewers read)."""
    from lxml import etree

    def text(el) -> str:
        el = copy.deepcopy(el)
        for sub in el.iter("mesh", "texture"):
            if sub.get("filename"):
                sub.set("filename", _resolve_file(sub.get("filename"), base))
        return etree.tostring(el, encoding="unicode", with_tail=False)

    links = {}
    for link in root.findall("link"):
        els = [text(el) for el in link if el.tag in ("visual", "collision", "contact")]
        if els:
            links[link.get("name")] = els
    return {"geometry": links, "materials": [text(m) for m in root.findall("material")]}


def _read(text: str, is_xml: bool) -> bytes:
    if is_xml:
        return text.encode()
    with open(text, "rb") as f:
        return f.read()


def parse_urdf(path_or_xml: str | os.PathLike) -> RobotSpec:
    """Read a URDF file (or an XML string) into a :class:`RobotSpec`.

    ``<visual>``/``<collision>`` geometry of a kind diffmech does not read (PyBullet's ``<plane>``,
    ``<cdf>``, ``<capsule>``, ...) is left out with one warning per file: dynamics do not use it.
    Mimic joints are parsed into :attr:`JointSpec.mimic`. The ``<visual>``/``<collision>`` elements and
    ``<material>`` elements are kept as XML text in ``spec.meta["urdf"]`` (mesh paths made absolute).

    Every number must be finite and at most 1e9 in magnitude (position, velocity and effort limits
    may be infinite: no limit). Building a model of the spec (:func:`diffmech.load_urdf`) then
    applies the rest of :mod:`diffmech.model.validate`: masses ``>= 0``, inertias symmetric and
    positive semi-definite (the triangle inequalities are not required), damping and friction
    ``>= 0``, and a mass matrix positive definite at the neutral configuration -- every moving joint
    carries mass or inertia along its axis (a massless leaf link on a revolute joint is refused, on a
    fixed joint it loads) and a floating base carries a positive-definite total inertia.

    Raises:
        URDFError: malformed XML, unknown joint types, bad numbers; the message names the file
            and the joint or link.
    """
    return _parse_urdf(path_or_xml, stacklevel=3)


def _parse_urdf(path_or_xml: str | os.PathLike, stacklevel: int) -> RobotSpec:
    """:func:`parse_urdf`; ``stacklevel`` makes its warning point at the caller of the public function."""
    import yourdfpy
    from lxml import etree

    text = os.fspath(path_or_xml)
    is_xml = text.lstrip().startswith("<")
    src = "<urdf string>" if is_xml else text
    if not is_xml and not os.path.isfile(text):
        raise URDFError(f"{src}: no such URDF file")
    root = _parse_xml(_read(text, is_xml), src)
    if root.tag != "robot":
        raise URDFError(f"{src}: the root element is <{root.tag}>, expected <robot>")
    _check_numbers(root, src)
    _drop_extensions(root)
    dropped = _drop_unknown_geometry(root)
    if dropped:
        where = "; ".join(f"{tag} in link(s) {', '.join(repr(n) for n in names)}" for tag, names in dropped.items())
        warnings.warn(
            f"{src}: ignoring <visual>/<collision> geometry diffmech does not read ({where}); "
            "dynamics do not use it",
            UserWarning, stacklevel=stacklevel,
        )
    try:
        data = io.BytesIO(etree.tostring(root))
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
        mimic = None
        if j.mimic is not None:
            if not j.mimic.joint:
                raise URDFError(f"{src}: joint '{j.name}': <mimic> names no joint")
            if j.mimic.joint == j.name or j.mimic.joint not in {jj.name for jj in robot.joints}:
                raise URDFError(f"{src}: joint '{j.name}' mimics '{j.mimic.joint}', which is not another joint")
            mimic = (
                j.mimic.joint,
                1.0 if j.mimic.multiplier is None else float(j.mimic.multiplier),
                0.0 if j.mimic.offset is None else float(j.mimic.offset),
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
            damping=value(dyn, "damping", 0.0), friction=value(dyn, "friction", 0.0), mimic=mimic,
        ))
    meta = {"urdf": _keep_geometry(root, None if is_xml else os.path.dirname(os.path.abspath(text)))}
    return RobotSpec(name=robot.name or "robot", links=links, joints=joints, source=src, meta=meta)
