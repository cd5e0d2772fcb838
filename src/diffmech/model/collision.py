"""Collision shapes attached to links: the description the contact code reads.

A :class:`Shape` is plain data -- a kind, its dimensions in metres and its placement in the link
frame -- kept in ``robot.meta["collision"]`` (``{link name: [Shape, ...]}``), so it travels with
``copy.deepcopy``, pickling and ``torch.save`` like the rest of the description. Shapes come from a
URDF's ``<collision>`` elements (:func:`collision_shapes` reads them the first time it is asked)
or are set with :func:`set_collision_shapes`.

Dimensions (URDF conventions): ``sphere`` ``(radius,)``; ``box`` ``(lx, ly, lz)`` full side
lengths; ``cylinder`` and ``capsule`` ``(radius, length)`` with the axis along the shape's local
``z`` and ``length`` the distance between the centres of the end faces (capsule: of the end
spheres); ``convex`` ``(scale,)``, a uniform factor on the vertices of its :attr:`Shape.hull`
(a :class:`~diffmech.contact.convex.ConvexHull` in the shape's frame, m).

A URDF ``<mesh>`` (its file found as the viewer finds visual meshes: absolute, relative to the
URDF, ``package://``) becomes a ``convex`` shape: the convex hull of the file's vertices, times the
mesh ``scale``, with at most :data:`~diffmech.contact.convex.MAX_VERTICES` vertices. A mesh that is
not convex is approximated by its hull, with one warning per link.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import ModelError

__all__ = ["Shape", "collision_shapes", "contact_coefficients", "set_collision_shapes", "KINDS"]

KINDS = {"sphere": 1, "box": 3, "cylinder": 2, "capsule": 2, "convex": 1}


@dataclass(frozen=True)
class Shape:
    """One collision shape of a link.

    Attributes:
        kind: ``"sphere"``, ``"box"``, ``"cylinder"``, ``"capsule"`` or ``"convex"``.
        size: dimensions in metres (see the module docstring).
        xyz: origin of the shape in the link frame, m.
        rpy: orientation of the shape in the link frame (URDF roll-pitch-yaw), rad.
        hull: a ``convex`` shape's :class:`~diffmech.contact.convex.ConvexHull` (``None`` for the others).
    """

    kind: str
    size: tuple[float, ...]
    xyz: tuple[float, float, float] = (0.0, 0.0, 0.0)
    rpy: tuple[float, float, float] = (0.0, 0.0, 0.0)
    hull: Any = None

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ModelError(f"collision shape: unknown kind {self.kind!r}; choose from {sorted(KINDS)}")
        from ..contact.convex import ConvexHull

        if (self.kind == "convex") != isinstance(self.hull, ConvexHull):
            raise ModelError(f"collision shape {self.kind}: a convex shape needs a hull "
                             "(diffmech.contact.convex.hull_from_points) and only a convex shape has one, got "
                             f"hull={type(self.hull).__name__}")
        size = tuple(float(s) for s in self.size)
        if len(size) != KINDS[self.kind] or not all(math.isfinite(s) and s > 0 for s in size):
            raise ModelError(f"collision shape {self.kind}: size must be {KINDS[self.kind]} positive finite "
                             f"numbers, got {self.size!r}")
        object.__setattr__(self, "size", size)
        object.__setattr__(self, "xyz", tuple(float(x) for x in self.xyz))
        object.__setattr__(self, "rpy", tuple(float(x) for x in self.rpy))

    @property
    def bounding_radius(self) -> float:
        """Radius of a sphere about the shape's origin that holds the shape, m."""
        s = self.size
        if self.kind == "sphere":
            return s[0]
        if self.kind == "box":
            return 0.5 * math.sqrt(s[0] ** 2 + s[1] ** 2 + s[2] ** 2)
        if self.kind == "capsule":
            return 0.5 * s[1] + s[0]
        if self.kind == "convex":
            return self.hull.radius * s[0]
        return math.sqrt(s[0] ** 2 + 0.25 * s[1] ** 2)


def _floats(text: str | None, n: int, default: tuple[float, ...]) -> tuple[float, ...]:
    if text is None:
        return default
    vals = tuple(float(x) for x in text.split())
    if len(vals) != n:
        raise ValueError(f"expected {n} numbers, got {text!r}")
    return vals


@functools.lru_cache(maxsize=256)
def _mesh_hull(path: str, mtime: float, scale: tuple, where: str):
    """The hull of a mesh file times ``scale`` and whether the file's mesh is convex (cached: a robot
    loaded again, or two links of one mesh, build it once)."""
    import numpy as np
    import trimesh

    from ..contact.convex import hull_from_points
    from ..viz.geometry import load_mesh_file

    parts = load_mesh_file(path)
    hull = hull_from_points(np.concatenate([v for v, _, _ in parts]) * np.array(scale), where=where)
    convex = len(parts) == 1 and trimesh.Trimesh(parts[0][0], parts[0][1], process=False).is_convex
    return hull, convex


def _mesh(link: str, g, robot, xyz, rpy) -> Shape | None:
    """The convex shape of a URDF ``<mesh>`` (``None``, with a warning, when its file is not found
    or not read)."""
    from ..viz.geometry import resolve_mesh_path

    name = getattr(robot, "name", "robot")
    filename = g.get("filename") or ""
    path = resolve_mesh_path(filename, getattr(robot, "source", None))
    if path is None:
        warnings.warn(f"{name}: link {link!r}: collision mesh {filename!r} not found (set ROS_PACKAGE_PATH for "
                      "package:// files); it is not used for contact", stacklevel=5)
        return None
    try:
        scale = _floats(g.get("scale"), 3, (1.0, 1.0, 1.0))
        hull, convex = _mesh_hull(path, os.path.getmtime(path), scale,
                                  f"{name}: link {link!r}: collision mesh {filename!r}")
    except ModelError as exc:  # a flat or degenerate mesh: no solid to collide with, said once
        warnings.warn(f"{exc}; it is not used for contact", stacklevel=5)
        return None
    except Exception as exc:  # any reader error: that shape is left out, said once
        warnings.warn(f"{name}: link {link!r}: cannot read collision mesh {path!r} ({type(exc).__name__}: {exc}); "
                      "it is not used for contact", stacklevel=5)
        return None
    notes = []
    if not convex:
        notes.append("is not convex: contact uses its convex hull")
    if hull.simplified > 0:
        notes.append(f"has a hull of more than {len(hull.vertices)} vertices: contact uses the hull of "
                     f"{len(hull.vertices)} of them (up to {hull.simplified * 1e3:.2g} mm inside the full hull)")
    if notes:
        warnings.warn(f"{name}: link {link!r}: collision mesh {filename!r} " + "; it ".join(notes), stacklevel=5)
    return Shape("convex", (1.0,), xyz, rpy, hull)


def _parse(link: str, xml: str, source: str, robot=None, meshes: bool = True) -> Shape | None:
    from lxml import etree

    el = etree.fromstring(xml)
    origin = el.find("origin")
    xyz = _floats(origin.get("xyz") if origin is not None else None, 3, (0.0, 0.0, 0.0))
    rpy = _floats(origin.get("rpy") if origin is not None else None, 3, (0.0, 0.0, 0.0))
    geom = el.find("geometry")
    if geom is None or len(geom) == 0:
        return None
    g = geom[0]
    if g.tag == "sphere":
        return Shape("sphere", (float(g.get("radius")),), xyz, rpy)
    if g.tag == "box":
        return Shape("box", _floats(g.get("size"), 3, ()), xyz, rpy)
    if g.tag in ("cylinder", "capsule"):
        return Shape(g.tag, (float(g.get("radius")), float(g.get("length"))), xyz, rpy)
    if g.tag == "mesh":
        if meshes:
            return _mesh(link, g, robot, xyz, rpy)
        warnings.warn(f"{source}: link {link!r}: <collision> <mesh> is not used for contact (meshes=False)",
                      stacklevel=4)
        return None
    warnings.warn(f"{source}: link {link!r}: <collision> geometry <{g.tag}> is not used for contact "
                  "(only sphere, box, cylinder, capsule and mesh are)", stacklevel=4)
    return None


def collision_shapes(robot, *, meshes: bool = True) -> dict[str, list[Shape]]:
    """The collision shapes of each link, ``{link: [Shape, ...]}`` (links without shapes absent).

    Read once from the URDF's ``<collision>`` elements unless :func:`set_collision_shapes` set them;
    a ``<mesh>`` becomes a ``convex`` shape (its convex hull, see the module docstring), or, with
    ``meshes=False`` on that first reading, is skipped with one warning naming the link.
    """
    meta = robot.meta
    if "collision" not in meta:
        out: dict[str, list[Shape]] = {}
        geometry = meta.get("urdf", {}).get("geometry", {})
        for link, elements in geometry.items():
            for xml in elements:
                if not xml.lstrip().startswith("<collision"):
                    continue
                try:
                    shape = _parse(link, xml, getattr(robot, "name", "robot"), robot, meshes)
                except (ValueError, TypeError) as exc:
                    raise ModelError(f"{robot.name}: link {link!r}: unreadable <collision>: {exc}") from None
                if shape is not None:
                    out.setdefault(link, []).append(shape)
        meta["collision"] = out
    return meta["collision"]


def contact_coefficients(robot) -> dict[str, dict[str, float]]:
    """Friction and restitution of each link from the URDF's ``<contact>`` elements (PyBullet's
    extension: ``<lateral_friction value=...>``, ``<restitution value=...>``), ``{link: {"friction":
    f, "restitution": e}}`` with only the values present; links without them absent. A
    :class:`~diffmech.sim.Scene` uses them for the pairs its ``pairs`` argument does not set."""
    from lxml import etree

    out: dict[str, dict[str, float]] = {}
    for link, elements in robot.meta.get("urdf", {}).get("geometry", {}).items():
        for xml in elements:
            if not xml.lstrip().startswith("<contact"):
                continue
            el = etree.fromstring(xml)
            for tag, key in (("lateral_friction", "friction"), ("restitution", "restitution")):
                sub = el.find(tag)
                if sub is None or sub.get("value") is None:
                    continue
                try:
                    val = float(sub.get("value"))
                except ValueError:
                    val = float("nan")
                if not (0 <= val < float("inf")):
                    raise ModelError(f"{robot.name}: link {link!r}: <contact><{tag} value={sub.get('value')!r}> "
                                     "must be a non-negative number")
                out.setdefault(link, {})[key] = val
    return out


def set_collision_shapes(robot, link: str, shapes: Shape | list[Shape] | None) -> None:
    """Replace the collision shapes of ``link`` (``None`` or ``[]`` removes them)."""
    if link not in robot.link_names:
        raise ModelError(f"{robot.name}: no link named {link!r} (links: {list(robot.link_names)})")
    table = collision_shapes(robot)
    shapes = [] if shapes is None else [shapes] if isinstance(shapes, Shape) else list(shapes)
    for s in shapes:
        if not isinstance(s, Shape):
            raise ModelError(f"{robot.name}: link {link!r}: expected diffmech.model.collision.Shape, got {type(s)}")
    if shapes:
        table[link] = shapes
    else:
        table.pop(link, None)
