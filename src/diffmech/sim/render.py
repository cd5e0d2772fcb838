"""Animations of contact scenes in 3-D, drawn by matplotlib (GIF).

For a look at a rollout without a viewer. A link with URDF ``<visual>`` elements is drawn from them
as shaded triangles (:func:`diffmech.viz.geometry.link_meshes`, mesh files read by ``trimesh`` of
the ``viz`` extra, simplified to a budget of triangles); every other link by the wireframe of its
collision shapes (spheres and capsules as wire spheres and segments, boxes by their 12 edges,
cylinders by their two rims and four generators). Without ``trimesh`` all links are wireframes,
with one warning. The ground is a square; one frame per ``stride`` steps.
"""

from __future__ import annotations

import importlib.util
import math
import warnings

import numpy as np
import torch
from torch import Tensor

from ..errors import ShapeError
from ..spatial import rpy_to_matrix
from .scene import Scene

__all__ = ["shape_lines", "scene_lines", "scene_meshes", "scene_triangles", "draw_scene", "animate_scene"]

# Triangles of all visual meshes of a scene together: matplotlib sorts and draws every polygon of
# every frame in Python, so laikago's 38k triangles would take ~1 s a frame; 3000 keep its shape.
MAX_FACES = 3000


def _circle(n: int = 16) -> Tensor:
    a = torch.linspace(0, 2 * math.pi, n + 1, dtype=torch.float64)
    return torch.stack([torch.cos(a), torch.sin(a), torch.zeros_like(a)], -1)


def shape_lines(shape, R: Tensor, p: Tensor) -> list[Tensor]:
    """Polylines ``[(k, 3), ...]`` (world coordinates, m) drawing one shape at pose ``(R (3, 3), p (3,))``."""
    R, p = R.double(), p.double()
    s = shape.size
    c = _circle()
    out = []
    if shape.kind in ("sphere", "capsule"):
        r = s[0]
        half = 0.5 * s[1] if shape.kind == "capsule" else 0.0
        rings = [c * r, c[:, [0, 2, 1]] * r, c[:, [2, 0, 1]] * r]  # three great circles
        for end in ((-half, half) if half else (0.0,)):
            off = torch.tensor([0.0, 0.0, end], dtype=torch.float64)
            out += [ring + off for ring in rings]
        if half:
            for x, y in ((r, 0.0), (-r, 0.0), (0.0, r), (0.0, -r)):
                out.append(torch.tensor([[x, y, -half], [x, y, half]], dtype=torch.float64))
    elif shape.kind == "box":
        h = torch.tensor(s, dtype=torch.float64) / 2
        corners = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)],
                               dtype=torch.float64) * h
        for i in range(8):
            for j in range(i + 1, 8):
                if int((corners[i] != corners[j]).sum()) == 1:
                    out.append(corners[[i, j]])
    elif shape.kind == "cylinder":
        r, half = s[0], 0.5 * s[1]
        for end in (-half, half):
            out.append(c * r + torch.tensor([0.0, 0.0, end], dtype=torch.float64))
        for x, y in ((r, 0.0), (-r, 0.0), (0.0, r), (0.0, -r)):
            out.append(torch.tensor([[x, y, -half], [x, y, half]], dtype=torch.float64))
    Rs = rpy_to_matrix(torch.tensor(shape.rpy, dtype=torch.float64))
    off = torch.tensor(shape.xyz, dtype=torch.float64)
    return [(line @ Rs.T + off) @ R.T + p for line in out]


def scene_lines(scene: Scene, q: Tensor, skip: dict[str, set[str]] | None = None) -> list[tuple[str, list[Tensor]]]:
    """``[(model name, polylines), ...]`` of every collision shape at the scene configuration ``q (nq,)``.

    ``skip``: per model, links left out (those :func:`scene_meshes` draws from their visuals).
    """
    if q.shape != (scene.nq,):
        raise ShapeError(f"scene_lines: q must be ({scene.nq},), got {tuple(q.shape)}")
    parts = scene.split(q.detach().to(scene.dtype)[None], "q")
    out = []
    for name in scene.names:
        m = scene.models[name]
        left_out = (skip or {}).get(name, set())
        links = {k: v for k, v in scene.shapes[name].items() if k not in left_out}
        if not links:
            continue
        T = m.forward_kinematics(parts[name])[0].double()
        lines = []
        for link, shapes in links.items():
            Tl = T[m.link_names.index(link)]
            for s in shapes:
                lines += shape_lines(s, Tl[:3, :3], Tl[:3, 3])
        out.append((name, lines))
    return out


def scene_meshes(scene: Scene, max_faces: int = MAX_FACES) -> dict[str, list]:
    """The visual meshes of each model, ``{model name: [LinkMesh, ...]}`` (link frames, m), only
    for models with ``<visual>`` elements, simplified together to about ``max_faces`` triangles.

    Empty when ``trimesh`` is missing (a warning says so once per call) or no model has visuals.
    """
    candidates = [n for n in scene.names if getattr(scene.models[n], "meta", {}).get("urdf", {}).get("geometry")]
    if not candidates:
        return {}
    if importlib.util.find_spec("trimesh") is None:
        warnings.warn("the animation draws collision shapes: reading the models' visual meshes needs "
                      "trimesh (pip install 'diffmech[viz]')", UserWarning, stacklevel=3)
        return {}
    from ..viz.geometry import decimate, link_meshes

    found = {}
    for name in candidates:
        visual = [m for m in link_meshes(scene.models[name], "auto") if m.kind == "visual"]
        if visual:
            found[name] = visual
    if not found:
        return {}
    flat = decimate([m for ms in found.values() for m in ms], max_faces)
    out, k = {}, 0
    for name, ms in found.items():
        out[name], k = flat[k:k + len(ms)], k + len(ms)
    return out


def scene_triangles(scene: Scene, q: Tensor, meshes: dict[str, list]) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """World triangles of the meshes of :func:`scene_meshes` at ``q (nq,)``: ``[(model name,
    triangles (M, 3, 3) m, face colours (M, 4) RGBA), ...]``."""
    if q.shape != (scene.nq,):
        raise ShapeError(f"scene_triangles: q must be ({scene.nq},), got {tuple(q.shape)}")
    parts = scene.split(q.detach().to(scene.dtype)[None], "q")
    out = []
    for name, ms in meshes.items():
        T = scene.models[name].forward_kinematics(parts[name])[0].double().cpu().numpy()
        tris, cols = [], []
        for m in ms:
            Tl = T[m.index]
            v = m.vertices @ Tl[:3, :3].T + Tl[:3, 3]
            tris.append(v[m.faces])
            cols.append(np.broadcast_to(np.asarray(m.color, dtype=float), (len(m.faces), 4)))
        out.append((name, np.concatenate(tris), np.concatenate(cols)))
    return out


def _shade(tris: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """Face colours dimmed by the angle to a light above and in front, so that a mesh reads as a solid."""
    n = np.cross(tris[:, 1] - tris[:, 0], tris[:, 2] - tris[:, 0])
    n /= np.maximum(np.linalg.norm(n, axis=-1, keepdims=True), 1e-12)
    light = np.array([0.3, -0.5, 0.8]) / np.linalg.norm([0.3, -0.5, 0.8])
    k = 0.45 + 0.55 * np.abs(n @ light)  # abs: mesh files do not agree on the winding
    out = cols.copy()
    out[:, :3] *= k[:, None]
    return out


def draw_scene(ax, scene: Scene, q: Tensor, meshes: dict[str, list], colours: list | None = None) -> int:
    """Draw the scene at ``q (nq,)`` into a matplotlib 3-D axes: the meshes of :func:`scene_meshes`
    as polygons, every other link's collision shapes as lines. Returns the number of polygons drawn."""
    from mpl_toolkits.mplot3d.art3d import Poly3DCollection

    colours = colours or ["C0", "C1", "C2", "C3"]
    n_poly = 0
    for _name, tris, cols in scene_triangles(scene, q, meshes):
        ax.add_collection3d(Poly3DCollection(tris, facecolors=_shade(tris, cols), edgecolors="none", linewidths=0))
        n_poly += len(tris)
    skip = {name: {m.link for m in ms} for name, ms in meshes.items()}
    for j, (_name, lines) in enumerate(scene_lines(scene, q, skip)):
        for line in lines:
            ax.plot(line[:, 0], line[:, 1], line[:, 2], color=colours[j % len(colours)], lw=0.9)
    return n_poly


def animate_scene(scene: Scene, qs: Tensor, path: str, *, dt: float, fps: int = 25, max_frames: int = 150,
                  title: str | None = None) -> int:
    """Write a GIF of the rollout ``qs (T + 1, nq)`` (one environment) to ``path``; returns the
    number of frames. Frames are spaced to play at about real time, at most ``max_frames``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.animation import FuncAnimation, PillowWriter

    if qs.dim() != 2 or qs.shape[-1] != scene.nq:
        raise ShapeError(f"animate_scene: qs must be (T + 1, {scene.nq}) (one environment), got {tuple(qs.shape)}")
    n = qs.shape[0]
    stride = max(1, round(1.0 / (fps * dt)), math.ceil(n / max_frames))
    idx = list(range(0, n, stride))
    meshes = scene_meshes(scene)
    skip = {name: {m.link for m in ms} for name, ms in meshes.items()}
    pts = [line for k in idx for _, lines in scene_lines(scene, qs[k], skip) for line in lines]
    pts += [torch.from_numpy(t.reshape(-1, 3)) for k in idx for _, t, _ in scene_triangles(scene, qs[k], meshes)]
    pts = torch.cat(pts)
    lo, hi = pts.amin(0), pts.amax(0)
    centre, span = (lo + hi) / 2, float((hi - lo).amax()) / 2 + 0.05
    fig = plt.figure(figsize=(5, 5))
    ax = fig.add_subplot(projection="3d")
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]

    def draw(i):
        ax.cla()
        ax.set_xlim(float(centre[0]) - span, float(centre[0]) + span)
        ax.set_ylim(float(centre[1]) - span, float(centre[1]) + span)
        ax.set_zlim(max(float(centre[2]) - span, -0.05), max(float(centre[2]) - span, -0.05) + 2 * span)
        ax.set_xlabel("x [m]")
        ax.set_ylabel("y [m]")
        ax.set_zlabel("z [m]")
        if scene.ground:
            g = [float(centre[0]) - span, float(centre[0]) + span, float(centre[1]) - span, float(centre[1]) + span]
            ax.plot([g[0], g[1], g[1], g[0], g[0]], [g[2], g[2], g[3], g[3], g[2]], [0] * 5, color="0.6", lw=0.8)
        draw_scene(ax, scene, qs[idx[i]], meshes, colours)
        ax.set_title(f"{title + '  ' if title else ''}t = {idx[i] * dt:.2f} s")

    anim = FuncAnimation(fig, draw, frames=len(idx))
    anim.save(path, writer=PillowWriter(fps=fps))
    plt.close(fig)
    return len(idx)
