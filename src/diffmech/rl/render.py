"""Pictures of a :class:`~diffmech.rl.env.DiffEnv` with matplotlib: one frame as an RGB array, or a
trajectory as an animated GIF (Pillow writer). Planar scenes are drawn in the world x-z plane."""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

__all__ = ["rgb_frame", "save_gif"]


def _extent(env, pts: np.ndarray) -> tuple[float, float, float, float]:
    target = env.draw_target()
    allp = pts.reshape(-1, 3)
    if target is not None:
        allp = np.concatenate([allp, target.detach().cpu().double().numpy()[None]])
    lo, hi = allp[:, [0, 2]].min(0), allp[:, [0, 2]].max(0)
    half = max(float((hi - lo).max()) / 2 * 1.15, 0.25)
    c = (lo + hi) / 2
    return c[0] - half, c[0] + half, c[1] - half, c[1] + half


def _follow(pts: np.ndarray) -> float | None:
    """Half width (m) of a view that follows the robot, or ``None`` for one fixed view: a robot that
    travels more than three of its own sizes (the Ant runs tens of metres) would be a dot in a view of
    its whole path."""
    xz = pts[..., [0, 2]]
    body = float((xz.max(1) - xz.min(1)).max())
    travel = float(pts[:, :, 0].mean(1).max() - pts[:, :, 0].mean(1).min())
    return max(body, 0.25) * 0.75 if travel > 3 * max(body, 1e-9) else None


def _figure(env, pts: np.ndarray, size: float):
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(size, size), dpi=80)
    x0, x1, z0, z1 = _extent(env, pts)
    ax.set_xlim(x0, x1)
    ax.set_ylim(z0, z1)
    ax.set_aspect("equal")
    ax.set_xlabel("x (m)")
    ax.set_ylabel("z (m)")
    ax.grid(alpha=0.3)
    target = env.draw_target()
    if target is not None:
        t = target.detach().cpu().double().numpy()
        ax.plot([t[0]], [t[2]], marker="*", color="tab:red", markersize=14, linestyle="none", label="target")
    (line,) = ax.plot([], [], "-o", color="tab:blue", lw=3, markersize=6)
    title = ax.set_title("")
    fig.tight_layout()
    return fig, ax, line, title


def _points(env, qs: Tensor) -> np.ndarray:
    with torch.no_grad():
        return env.draw_points(qs.to(dtype=env.dtype, device=env.device)).cpu().double().numpy()


def rgb_frame(env, q: Tensor, *, size: float = 4.0, title: str = "") -> np.ndarray:
    """One picture ``(H, W, 3)`` uint8 of the state ``q (nq,)``."""
    pts = _points(env, q[None])
    fig, _, line, ttl = _figure(env, pts, size)
    line.set_data(pts[0, :, 0], pts[0, :, 2])
    ttl.set_text(title)
    fig.canvas.draw()
    img = np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()
    import matplotlib.pyplot as plt

    plt.close(fig)
    return img


def save_gif(env, qs: Tensor, path, *, fps: int | None = None, rewards: Tensor | None = None,
             size: float = 4.0) -> None:
    """Animate the states ``qs (T, nq)`` into a GIF at ``path`` (matplotlib's Pillow writer).

    ``fps`` defaults to real time (``1 / env.dt``, at most 30 frames/s; frames are skipped to keep
    it); ``rewards (T - 1,)`` adds the running return to the title. A robot that travels more than
    three times its size is followed by the view (the x axis moves with it).
    """
    from matplotlib import animation

    real = 1.0 / env.dt
    fps = int(fps or min(30, round(real)))
    stride = max(1, round(real / fps))
    idx = list(range(0, qs.shape[0], stride))
    if idx[-1] != qs.shape[0] - 1:
        idx.append(qs.shape[0] - 1)
    pts = _points(env, qs)
    fig, ax, line, ttl = _figure(env, pts, size)
    half = _follow(pts)
    if half is not None:  # the same window around the robot in every frame; z as the whole path's
        lo = min(float(pts[..., 2].min()) - 0.1 * half, -0.05 * half)
        hi = max(float(pts[..., 2].max()) + 0.1 * half, lo + 2 * half)
        ax.set_ylim(lo, hi)
        if hi - lo > 2 * half:  # a robot that jumps higher than the window is wide: keep it all in view
            ax.set_aspect("auto")
    ret = None if rewards is None else np.concatenate([[0.0], np.cumsum(rewards.detach().cpu().double().numpy())])

    def draw(i):
        k = idx[i]
        line.set_data(pts[k, :, 0], pts[k, :, 2])
        if half is not None:
            c = float(pts[k, :, 0].mean())
            ax.set_xlim(c - half, c + half)
        text = f"t = {k * env.dt:.2f} s"
        if ret is not None:
            text += f"   return {ret[min(k, len(ret) - 1)]:.3f}"
        ttl.set_text(text)
        return line, ttl

    anim = animation.FuncAnimation(fig, draw, frames=len(idx), blit=False)
    anim.save(str(path), writer=animation.PillowWriter(fps=fps))
    import matplotlib.pyplot as plt

    plt.close(fig)
