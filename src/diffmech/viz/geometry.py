"""The triangle meshes a view draws, in each link's frame.

A link is drawn from its URDF ``<visual>`` elements (mesh files, boxes, spheres, cylinders) where it
has them and they load, else from its collision shapes (:mod:`diffmech.model.collision`: sphere,
box, cylinder, capsule), so free bodies and robots built in code show too. Mesh files are read
with ``trimesh`` (STL, OBJ, DAE, PLY, ...); a mesh with several materials becomes one
:class:`LinkMesh` per colour. :func:`decimate` brings the total number of triangles under a budget
so that an animated page stays small.
"""

from __future__ import annotations

import functools
import math
import os
import warnings
from dataclasses import dataclass, replace

import numpy as np

from ..errors import OptionError

__all__ = ["LinkMesh", "link_meshes", "decimate", "GEOMETRY"]

GEOMETRY = ("auto", "visual", "collision")

# Drawn when neither the URDF nor the mesh file gives a colour (RGBA in [0, 1]).
DEFAULT_COLOR = (0.62, 0.66, 0.72, 1.0)


@dataclass(frozen=True)
class LinkMesh:
    """One triangle mesh rigidly attached to a link.

    Attributes:
        link: the link's name; ``index`` its position in ``robot.link_names`` (and in
            ``forward_kinematics`` outputs).
        vertices: ``(N, 3)`` float64, metres, in the link frame (the URDF ``<origin>`` and mesh
            ``scale`` applied).
        faces: ``(M, 3)`` int64 vertex indices.
        color: RGBA in ``[0, 1]``.
        kind: ``"visual"`` or ``"collision"``: where the mesh came from.
        source: the mesh file, or the primitive's name (``"box"``, ``"sphere"``, ...).
    """

    link: str
    index: int
    vertices: np.ndarray
    faces: np.ndarray
    color: tuple[float, float, float, float]
    kind: str
    source: str


# ---------------------------------------------------------------------------- primitives
def _origin(xyz, rpy) -> np.ndarray:
    """``T_link_element`` from URDF ``xyz`` and roll-pitch-yaw (``R = Rz(y) Ry(p) Rx(r)``)."""
    import trimesh

    T = trimesh.transformations.euler_matrix(*[float(a) for a in rpy], axes="sxyz")
    T[:3, 3] = [float(x) for x in xyz]
    return T


def _primitive(kind: str, size) -> tuple[np.ndarray, np.ndarray]:
    """Vertices and faces of a URDF primitive centred at its origin (cylinder/capsule along z)."""
    import trimesh

    if kind == "sphere":
        m = trimesh.creation.icosphere(subdivisions=2, radius=size[0])
    elif kind == "box":
        m = trimesh.creation.box(extents=size)
    elif kind == "cylinder":
        m = trimesh.creation.cylinder(radius=size[0], height=size[1], sections=24)
    elif kind == "capsule":
        m = trimesh.creation.capsule(height=size[1], radius=size[0], count=[24, 12])
    else:  # pragma: no cover - callers pass only the kinds above
        raise ValueError(kind)
    return np.asarray(m.vertices, dtype=np.float64), np.asarray(m.faces, dtype=np.int64)


def _transform(T: np.ndarray, v: np.ndarray) -> np.ndarray:
    return v @ T[:3, :3].T + T[:3, 3]


# ---------------------------------------------------------------------------- mesh files
def resolve_mesh_path(filename: str, source: str | None) -> str | None:
    """An existing file for a URDF mesh ``filename``, or ``None``.

    Paths kept absolute by the URDF reader are used as they are. A ``package://NAME/rest`` URI that
    the reader could not resolve is looked up under each directory of ``$ROS_PACKAGE_PATH`` (as
    ``DIR/NAME/rest`` or ``DIR/rest`` when ``DIR`` is the package itself) and under the ancestors of
    the URDF file (``source``). A relative path is taken relative to the URDF's directory, then
    the current directory.
    """
    if filename.startswith("file://"):
        filename = filename[len("file://"):]
    if not filename.startswith("package://"):
        if os.path.isabs(filename):
            return filename if os.path.isfile(filename) else None
        here = [os.path.dirname(os.path.abspath(source))] if source and os.path.isfile(source) else []
        bases = here + [os.getcwd()]
        for b in bases:
            p = os.path.join(b, filename)
            if os.path.isfile(p):
                return os.path.normpath(p)
        return None
    rest = filename[len("package://"):]
    pkg, _, sub = rest.partition("/")
    roots = [d for d in os.environ.get("ROS_PACKAGE_PATH", "").split(os.pathsep) if d]
    if source and os.path.isfile(source):
        d = os.path.dirname(os.path.abspath(source))
        for _ in range(6):
            roots.append(d)
            parent = os.path.dirname(d)
            if parent == d:
                break
            d = parent
    for r in roots:
        for p in (os.path.join(r, pkg, sub), os.path.join(r, sub) if os.path.basename(r) == pkg else None):
            if p and os.path.isfile(p):
                return os.path.normpath(p)
    return None


def _rgba(color) -> tuple[float, float, float, float] | None:
    """A trimesh colour (uint8 RGBA) as floats, or ``None`` for trimesh's default grey."""
    if color is None:
        return None
    c = np.asarray(color, dtype=np.float64).reshape(-1)[:4]
    if c.size < 3:
        return None
    if c.size == 3:
        c = np.append(c, 255.0)
    if np.allclose(c, [102, 102, 102, 255]):  # trimesh's "no colour given"
        return None
    return tuple(float(x) for x in c / 255.0)


@functools.lru_cache(maxsize=256)
def _load_mesh_file(path: str, mtime: float) -> tuple[tuple[np.ndarray, np.ndarray, tuple | None], ...]:
    """The parts of a mesh file, one per colour: ``((vertices, faces, rgba or None), ...)``.

    Vertices are merged (a texture's seams split them in the file), which keeps the page small.
    ``mtime`` keys the cache so an edited file is read again.
    """
    import trimesh

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        loaded = trimesh.load(path)
    if isinstance(loaded, trimesh.Scene):
        geoms = loaded.dump() if hasattr(loaded, "dump") else list(loaded.geometry.values())
    else:
        geoms = [loaded]
    by_color: dict[tuple | None, list] = {}
    for g in geoms:
        if not isinstance(g, trimesh.Trimesh) or len(g.faces) == 0:
            continue
        color = None
        try:
            visual = g.visual
            if visual.kind == "texture":
                color = _rgba(getattr(visual.material, "main_color", None))
            elif visual.kind in ("face", "vertex"):
                color = _rgba(visual.main_color)
        except Exception:  # a material trimesh cannot summarise: use the URDF's or the default colour
            color = None
        by_color.setdefault(color, []).append(g)
    parts = []
    for color, meshes in by_color.items():
        v = np.concatenate([np.asarray(m.vertices, dtype=np.float64) for m in meshes])
        offsets = np.cumsum([0] + [len(m.vertices) for m in meshes[:-1]])
        f = np.concatenate([np.asarray(m.faces, dtype=np.int64) + o for m, o in zip(meshes, offsets)])
        merged = trimesh.Trimesh(v, f, process=True)  # merge duplicate vertices, drop degenerate faces
        parts.append((np.asarray(merged.vertices, dtype=np.float64), np.asarray(merged.faces, dtype=np.int64),
                      color))
    if not parts:
        raise ValueError("no triangles")
    return tuple(parts)


def load_mesh_file(path: str) -> tuple[tuple[np.ndarray, np.ndarray, tuple | None], ...]:
    """Read a mesh file (cached by path and modification time); see :func:`_load_mesh_file`."""
    return _load_mesh_file(os.path.abspath(path), os.path.getmtime(path))


# ---------------------------------------------------------------------------- URDF <visual>
def _materials(robot) -> dict[str, tuple]:
    from lxml import etree

    out = {}
    for text in robot.meta.get("urdf", {}).get("materials", []):
        el = etree.fromstring(text)
        c = el.find("color")
        if el.get("name") and c is not None and c.get("rgba"):
            out[el.get("name")] = tuple(float(x) for x in c.get("rgba").split())
    return out


def _element_color(el, materials: dict) -> tuple | None:
    mat = el.find("material")
    if mat is None:
        return None
    c = mat.find("color")
    if c is not None and c.get("rgba"):
        return tuple(float(x) for x in c.get("rgba").split())
    return materials.get(mat.get("name"))


def _visual_meshes(robot, link: str, index: int, texts: list[str], materials: dict, default: tuple,
                   warn) -> list[LinkMesh] | None:
    """The link's ``<visual>`` meshes (``[]`` when it has none); ``None`` when one cannot be drawn."""
    from lxml import etree

    out: list[LinkMesh] = []
    for text in texts:
        if not text.lstrip().startswith("<visual"):
            continue
        el = etree.fromstring(text)
        o = el.find("origin")
        T = _origin((o.get("xyz") or "0 0 0").split() if o is not None else (0, 0, 0),
                    (o.get("rpy") or "0 0 0").split() if o is not None else (0, 0, 0))
        urdf_color = _element_color(el, materials)
        geom = el.find("geometry")
        g = geom[0] if geom is not None and len(geom) else None
        if g is None:
            continue
        if g.tag == "mesh":
            filename = g.get("filename") or ""
            path = resolve_mesh_path(filename, robot.source)
            if path is None:
                warn(f"{robot.name}: link {link!r}: mesh {filename!r} not found (set ROS_PACKAGE_PATH for "
                     "package:// files); drawing its collision shapes")
                return None
            try:
                parts = load_mesh_file(path)
            except Exception as exc:  # any reader error: fall back, do not fail the whole view
                warn(f"{robot.name}: link {link!r}: cannot read mesh {path!r} ({type(exc).__name__}: {exc}); "
                     "drawing its collision shapes")
                return None
            scale = np.array([float(s) for s in (g.get("scale") or "1 1 1").split()], dtype=np.float64)
            for v, f, file_color in parts:
                # The file's own colours (a DAE's materials) where it has them, else the URDF's.
                color = file_color or urdf_color or default
                out.append(LinkMesh(link, index, _transform(T, v * scale), f, tuple(color), "visual", path))
            continue
        try:
            if g.tag == "box":
                kind, size = "box", [float(x) for x in g.get("size").split()]
            elif g.tag == "sphere":
                kind, size = "sphere", [float(g.get("radius"))]
            elif g.tag in ("cylinder", "capsule"):
                kind, size = g.tag, [float(g.get("radius")), float(g.get("length"))]
            else:
                continue
        except (TypeError, ValueError, AttributeError):
            warn(f"{robot.name}: link {link!r}: unreadable <visual> <{g.tag}>; drawing its collision shapes")
            return None
        if not all(math.isfinite(x) and x > 0 for x in size):
            continue  # a zero-size visual (laikago's toes) draws nothing
        v, f = _primitive(kind, size)
        out.append(LinkMesh(link, index, _transform(T, v), f, tuple(urdf_color or default), "visual", kind))
    return out


def _collision_meshes(robot, link: str, index: int, color) -> list[LinkMesh]:
    from ..model.collision import collision_shapes

    out = []
    for s in collision_shapes(robot).get(link, []):
        if s.kind == "convex":  # a mesh's hull: its own triangles
            v, f = s.hull.vertices * s.size[0], np.asarray(s.hull.triangles, dtype=np.int64)
        else:
            v, f = _primitive(s.kind, s.size)
        out.append(LinkMesh(link, index, _transform(_origin(s.xyz, s.rpy), v), f, tuple(color), "collision", s.kind))
    return out


def link_meshes(robot, geometry: str = "auto", color=None) -> list[LinkMesh]:
    """Every mesh of ``robot`` in its link's frame, links in ``robot.link_names`` order.

    Args:
        robot: a :class:`~diffmech.RobotModel`.
        geometry: ``"auto"`` (a link's ``<visual>`` elements where it has them and they load, else
            its collision shapes), ``"visual"`` (only ``<visual>``) or ``"collision"`` (only the
            collision shapes of :func:`diffmech.model.collision.collision_shapes`).
        color: RGBA for collision shapes and uncoloured visuals (default: a light grey-blue).

    A mesh file that is missing or unreadable is reported in one warning per robot and the link
    falls back to its collision shapes.
    """
    if geometry not in GEOMETRY:
        raise OptionError(f"geometry must be one of {GEOMETRY}, got {geometry!r}")
    with warnings.catch_warnings():
        # A URDF's mesh <collision> is skipped for contact with a warning; the view has the <visual>.
        warnings.filterwarnings("ignore", message=".*is not used for contact.*")
        warnings.filterwarnings("ignore", message=".*contact uses (its convex hull|the hull of).*")
        from ..model.collision import collision_shapes

        collision_shapes(robot)
    color = tuple(color) if color is not None else DEFAULT_COLOR
    problems: list[str] = []
    materials = _materials(robot)
    geom = robot.meta.get("urdf", {}).get("geometry", {})
    out: list[LinkMesh] = []
    for index, link in enumerate(robot.link_names):
        vis: list[LinkMesh] | None = []
        if geometry != "collision":
            vis = _visual_meshes(robot, link, index, geom.get(link, []), materials, color, problems.append)
        if vis:
            out.extend(vis)
        elif vis is None or geometry != "visual":  # none asked for, none there, or one failed to load
            out.extend(_collision_meshes(robot, link, index, color))
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        warnings.warn("; ".join(problems[:3]) + more, UserWarning, stacklevel=3)
    return out


# ---------------------------------------------------------------------------- decimation
def _cluster(v: np.ndarray, f: np.ndarray, cell: float) -> tuple[np.ndarray, np.ndarray]:
    """Vertex clustering: merge the vertices in each cube of side ``cell`` into their mean, drop
    the triangles that collapse and the duplicates."""
    c = np.floor((v - v.min(0)) / cell).astype(np.int64)
    n = c.max(0) + 1
    _, inv, counts = np.unique((c[:, 0] * n[1] + c[:, 1]) * n[2] + c[:, 2], return_inverse=True, return_counts=True)
    merged = np.zeros((len(counts), 3))
    np.add.at(merged, inv, v)
    merged /= counts[:, None]
    g = inv[f]
    g = g[(g[:, 0] != g[:, 1]) & (g[:, 1] != g[:, 2]) & (g[:, 0] != g[:, 2])]
    if len(g):
        s = np.sort(g, axis=1)
        m = int(inv.max()) + 1
        _, first = np.unique((s[:, 0] * m + s[:, 1]) * m + s[:, 2], return_index=True)
        g = g[np.sort(first)]
    used, g = np.unique(g, return_inverse=True)
    return merged[used], g.reshape(-1, 3).astype(np.int64)


def _closed(f: np.ndarray) -> bool:
    """Whether every edge is shared by exactly two triangles (no open border)."""
    e = np.sort(np.concatenate([f[:, [0, 1]], f[:, [1, 2]], f[:, [2, 0]]]), axis=1)
    n = int(f.max()) + 1
    _, counts = np.unique(e[:, 0] * n + e[:, 1], return_counts=True)
    return bool((counts == 2).all())


_SIMPLIFIED: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


def _simplify(v: np.ndarray, f: np.ndarray, faces: int) -> tuple[np.ndarray, np.ndarray]:
    """About ``faces`` triangles: quadric decimation (fast-simplification) of a closed mesh, vertex
    clustering with the cell size found by bisection otherwise (quadric decimation keeps the open
    borders of CAD exports and stops far above the target on them). Results are cached."""
    import hashlib

    key = (hashlib.sha1(v.tobytes() + f.tobytes()).hexdigest(), faces)
    if key not in _SIMPLIFIED:
        if len(_SIMPLIFIED) > 512:
            _SIMPLIFIED.clear()
        _SIMPLIFIED[key] = _simplify_uncached(v, f, faces)
    return _SIMPLIFIED[key]


def _simplify_uncached(v: np.ndarray, f: np.ndarray, faces: int) -> tuple[np.ndarray, np.ndarray]:
    if _closed(f):
        try:
            import fast_simplification

            v2, f2 = fast_simplification.simplify(v.astype(np.float64), f.astype(np.int64),
                                                  target_reduction=1.0 - faces / len(f))
            if 0 < len(f2) <= 1.25 * faces:
                return np.asarray(v2, dtype=np.float64), np.asarray(f2, dtype=np.int64)
        except ImportError:
            pass
    diag = float(np.linalg.norm(np.ptp(v, axis=0)))
    if not diag > 0:
        return v, f
    lo, hi = math.log(diag * 1e-4), math.log(diag * 0.5)
    best = (v, f)
    for _ in range(14):  # bisection on log(cell): the triangle count falls as the cell grows
        mid = 0.5 * (lo + hi)
        v2, f2 = _cluster(v, f, math.exp(mid))
        if len(f2) > faces:
            lo = mid
        else:
            hi = mid
            if len(f2) > 0:
                best = (v2, f2)
    return best


def decimate(meshes: list[LinkMesh], max_faces: int, min_faces: int = 64) -> list[LinkMesh]:
    """Simplify the meshes so that their triangles add up to about ``max_faces``.

    Each mesh keeps a share of the budget proportional to its triangle count, and at least
    ``min_faces`` (small primitives are never touched). Quadric decimation (``fast-simplification``,
    in the ``viz`` extra) where it reaches the target, vertex clustering otherwise.
    """
    total = sum(len(m.faces) for m in meshes)
    if total <= max_faces:
        return meshes
    out = []
    for m in meshes:
        target = max(min_faces, math.floor(max_faces * len(m.faces) / total))
        if len(m.faces) > target:
            v, f = _simplify(m.vertices, m.faces, target)
            m = replace(m, vertices=v, faces=f)
        out.append(m)
    return out
