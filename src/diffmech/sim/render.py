"""Animations of contact scenes: the collision shapes in 3-D, drawn by matplotlib (GIF).

For a look at a rollout without a viewer: every shape of every model (spheres and capsules as wire
spheres and segments, boxes by their 12 edges, cylinders by their two rims and four generators),
the ground as a square, one frame per ``stride`` steps.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import ShapeError
from ..spatial import rpy_to_matrix
from .scene import Scene

__all__ = ["shape_lines", "scene_lines", "animate_scene"]


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


def scene_lines(scene: Scene, q: Tensor) -> list[tuple[str, list[Tensor]]]:
    """``[(model name, polylines), ...]`` of every collision shape at the scene configuration ``q (nq,)``."""
    if q.shape != (scene.nq,):
        raise ShapeError(f"scene_lines: q must be ({scene.nq},), got {tuple(q.shape)}")
    parts = scene.split(q.detach().to(scene.dtype)[None], "q")
    out = []
    for name in scene.names:
        m = scene.models[name]
        if not scene.shapes[name]:
            continue
        T = m.forward_kinematics(parts[name])[0].double()
        lines = []
        for link, shapes in scene.shapes[name].items():
            Tl = T[m.link_names.index(link)]
            for s in shapes:
                lines += shape_lines(s, Tl[:3, :3], Tl[:3, 3])
        out.append((name, lines))
    return out


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
    frames = [scene_lines(scene, qs[k]) for k in idx]
    pts = torch.cat([line for f in frames for _, lines in f for line in lines])
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
        for j, (_name, lines) in enumerate(frames[i]):
            for line in lines:
                ax.plot(line[:, 0], line[:, 1], line[:, 2], color=colours[j % len(colours)], lw=0.9)
        ax.set_title(f"{title + '  ' if title else ''}t = {idx[i] * dt:.2f} s")

    anim = FuncAnimation(fig, draw, frames=len(idx))
    anim.save(path, writer=PillowWriter(fps=fps))
    plt.close(fig)
    return len(idx)
