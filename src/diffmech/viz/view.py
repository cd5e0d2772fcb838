"""Animated 3-D views of robots and scenes as plotly figures and self-contained HTML pages."""

from __future__ import annotations

import base64
import math
import os
from pathlib import Path

import numpy as np
import torch

from ..errors import DiffmechError, OptionError, ShapeError
from .geometry import LinkMesh, decimate, link_meshes

__all__ = ["figure", "show", "trajectory", "auto_max_faces"]

# Per model of a scene, when neither the URDF nor the mesh file colours it.
_PALETTE = [(0.62, 0.66, 0.72, 1.0), (0.86, 0.45, 0.25, 1.0), (0.30, 0.58, 0.80, 1.0), (0.45, 0.70, 0.35, 1.0),
            (0.80, 0.70, 0.30, 1.0), (0.60, 0.45, 0.75, 1.0)]
_GROUND_COLOR = "rgb(205, 208, 200)"


def _models(obj) -> tuple[list[tuple[str, object]], bool, dict[str, slice] | None, int]:
    """``([(name, RobotModel)], ground, q slices, nq)`` of a robot or a :class:`~diffmech.sim.Scene`."""
    from ..robot import RobotModel
    from ..sim.scene import Scene

    if isinstance(obj, Scene):
        return [(n, obj.models[n]) for n in obj.names], obj.ground, dict(obj.slices), obj.nq
    if isinstance(obj, RobotModel):
        return [(obj.name, obj)], False, None, obj.nq
    raise DiffmechError(f"diffmech.viz: expected a RobotModel or a diffmech.sim.Scene, got {type(obj).__name__}")


def trajectory(obj, q_trajectory=None) -> torch.Tensor:
    """``q_trajectory`` as a ``(T, nq)`` float64 CPU tensor (``None``: the neutral configuration).

    Raises:
        ShapeError: not ``(T, nq)`` or ``(nq,)`` with ``T >= 1``, or not finite, naming the shape.
    """
    models, _, _, nq = _models(obj)
    name = models[0][0] if len(models) == 1 else "scene"
    if q_trajectory is None:
        return obj.neutral_configuration().detach().to("cpu", torch.float64)[None]
    try:
        q = torch.as_tensor(q_trajectory.detach() if isinstance(q_trajectory, torch.Tensor) else
                            np.asarray(q_trajectory, dtype=np.float64))
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{name}: q_trajectory cannot be converted to a tensor: {exc}") from None
    shape = tuple(q.shape)
    if q.ndim == 1:
        q = q[None]
    if q.ndim != 2 or q.shape[-1] != nq or q.shape[0] < 1:
        raise ShapeError(f"{name}: q_trajectory must have shape (T, {nq}) or ({nq},) (nq = {nq}), got shape {shape}")
    if q.is_complex() or q.dtype == torch.bool:
        raise ShapeError(f"{name}: q_trajectory must be real numbers, got dtype {q.dtype}")
    q = q.to("cpu", torch.float64)
    bad = ~torch.isfinite(q)
    if bad.any():
        t, i = (int(x) for x in bad.nonzero()[0])
        raise ShapeError(f"{name}: q_trajectory of shape {shape} is not finite at step {t}, coordinate {i}")
    return q


def auto_max_faces(steps: int) -> int:
    """Triangles per frame for a trajectory of ``steps`` frames: about 4 MB of vertex data in all,
    between 2,000 and 60,000 triangles (a closed mesh has about half as many vertices, and each
    vertex costs 16 bytes of base64-encoded float32 per frame)."""
    return int(min(60_000, max(2_000, 500_000 // max(steps, 1))))


def _poses(model, q: torch.Tensor) -> np.ndarray:
    """``(T, n_links, 4, 4)`` float64 world poses of every link along ``q (T, nq)``."""
    with torch.no_grad():
        T = model.forward_kinematics(q.to(device=model.device, dtype=model.dtype))
    return T.detach().to("cpu", torch.float64).numpy()


def _typed(a: np.ndarray) -> dict:
    """A plotly typed-array spec (little-endian float32, base64): what plotly writes for a numpy
    array anyway, given ready-made so that building hundreds of frames skips plotly's per-array
    checks (most of the time otherwise)."""
    return {"dtype": "f4", "bdata": base64.b64encode(np.ascontiguousarray(a, dtype="<f4").tobytes()).decode()}


def _rgb(c) -> str:
    return "rgb({:d}, {:d}, {:d})".format(*(int(round(255 * float(x))) for x in c[:3]))


def figure(obj, q_trajectory=None, *, geometry: str = "auto", dt: float | None = None, fps: float | None = None,
           max_faces: int | None = None, ground: bool | None = None, title: str | None = None):
    """An animated plotly figure of a robot or scene along a trajectory.

    Args:
        obj: a :class:`~diffmech.RobotModel` or a :class:`diffmech.sim.Scene` (all its models, and
            its ground plane when it has one).
        q_trajectory: ``(T, nq)`` or ``(nq,)`` configurations (tensor, array or nested lists; a
            scene's ``q`` is its models' concatenated); ``None``: the neutral configuration.
        geometry: ``"auto"`` (URDF ``<visual>`` meshes where a link has them, collision shapes
            elsewhere), ``"visual"`` or ``"collision"``; see :func:`diffmech.viz.geometry.link_meshes`.
        dt: seconds between steps, for the slider's labels and the playback speed (default:
            labels are step numbers).
        fps: playback frames per second (default: real time when ``dt`` is given, else 20).
        max_faces: triangles per frame over all meshes (default: :func:`auto_max_faces` of ``T``,
            so that the page stays a few MB); larger meshes are simplified to fit.
        ground: draw the plane ``z = 0`` (default: a scene's own setting; no plane for a robot).
        title: figure title (default: the robot's or the scene's model names).

    Returns:
        A ``plotly.graph_objects.Figure`` with one ``Mesh3d`` trace per link mesh (named
        ``"model/link"``; a model with nothing to draw gets a ``Scatter3d`` skeleton joining its
        link origins, ``"model/skeleton"``), one frame per step named ``"0" .. "T-1"`` (only moving
        traces are in the frames, their ``x``/``y``/``z`` as float32 typed-array specs
        ``{"dtype": "f4", "bdata": base64}``), a play/pause button and a time slider.

    Raises:
        ShapeError: a ``q_trajectory`` of the wrong shape or not finite.
        OptionError: an unknown ``geometry``, ``max_faces < 1``, ``dt``/``fps`` not positive.
    """
    try:
        import plotly.graph_objects as go
    except ImportError:
        raise DiffmechError("diffmech.viz needs plotly: pip install 'diffmech[viz]'") from None
    models, scene_ground, slices, _ = _models(obj)
    q = trajectory(obj, q_trajectory)
    steps = q.shape[0]
    if max_faces is not None and int(max_faces) < 1:
        raise OptionError(f"max_faces must be a positive number of triangles, got {max_faces}")
    for name, val in (("dt", dt), ("fps", fps)):
        if val is not None and not (float(val) > 0 and math.isfinite(float(val))):
            raise OptionError(f"{name} must be positive and finite, got {val}")
    budget = int(max_faces) if max_faces is not None else auto_max_faces(steps)

    # Meshes of every model, in the link frames, then simplified together to the budget.
    meshes: list[tuple[str, LinkMesh]] = []
    for k, (name, model) in enumerate(models):
        color = _PALETTE[k % len(_PALETTE)] if len(models) > 1 else None
        meshes += [(name, m) for m in link_meshes(model, geometry, color=color)]
    simplified = decimate([m for _, m in meshes], budget)
    meshes = [(name, m) for (name, _), m in zip(meshes, simplified)]

    poses = {name: _poses(model, q if slices is None else q[:, slices[name]]) for name, model in models}
    # World vertices per mesh and step: (T, N, 3).
    world = []
    for name, m in meshes:
        P = poses[name][:, m.index]  # (T, 4, 4)
        world.append(np.einsum("tij,nj->tni", P[:, :3, :3], m.vertices) + P[:, None, :3, 3])
    # A model with nothing to draw (the bundled pendulums, a body without shapes) is drawn as its
    # skeleton: a segment from each link's origin to its parent's, NaN between segments.
    skeletons = []
    for name, model in models:
        if any(n == name for n, _ in meshes):
            continue
        parent = model.tree.link_parent
        idx = [j for i in range(len(parent)) if parent[i] >= 0 for j in (parent[i], i, -1)] or [0]
        origins = np.concatenate([poses[name][:, :, :3, 3], np.full((steps, 1, 3), np.nan)], 1)
        skeletons.append((name, origins[:, idx]))
    world += [w for _, w in skeletons]
    moving = [i for i, w in enumerate(world) if steps > 1 and np.nanmax(np.ptp(w, axis=0)) > 0.0]

    lo = np.min([np.nanmin(w.reshape(-1, 3), 0) for w in world], axis=0) if world else np.full(3, -0.5)
    hi = np.max([np.nanmax(w.reshape(-1, 3), 0) for w in world], axis=0) if world else np.full(3, 0.5)
    draw_ground = scene_ground if ground is None else bool(ground)
    traces = []
    for (name, m), w in zip(meshes, world):
        label = f"{name}/{m.link}"
        traces.append(go.Mesh3d(
            x=w[0, :, 0].astype(np.float32), y=w[0, :, 1].astype(np.float32), z=w[0, :, 2].astype(np.float32),
            i=m.faces[:, 0].astype(np.int32), j=m.faces[:, 1].astype(np.int32), k=m.faces[:, 2].astype(np.int32),
            # Smooth shading rounds the edges of boxes and cylinders (shared vertices): those flat.
            color=_rgb(m.color), opacity=m.color[3] if m.color[3] < 1 else None,
            flatshading=m.source in ("box", "cylinder"),
            name=label, hovertemplate=f"{label}<extra>{m.kind}: {os.path.basename(m.source)}</extra>",
            lighting=dict(ambient=0.45, diffuse=0.8, specular=0.25, roughness=0.5, fresnel=0.1),
            lightposition=dict(x=1e3, y=1e3, z=3e3), showlegend=False,
        ))
    for k, (name, w) in enumerate(skeletons):
        traces.append(go.Scatter3d(
            x=w[0, :, 0].astype(np.float32), y=w[0, :, 1].astype(np.float32), z=w[0, :, 2].astype(np.float32),
            mode="lines+markers", name=f"{name}/skeleton", showlegend=False, hovertemplate=f"{name}<extra></extra>",
            line=dict(color=_rgb(_PALETTE[(k + 1) % len(_PALETTE)]), width=8),
            marker=dict(size=4, color="rgb(40, 40, 40)"),
        ))
    if draw_ground:
        # A square under everything, twice the bodies' footprint over the whole trajectory.
        c = 0.5 * (lo[:2] + hi[:2])
        h = max(0.5, float((hi[:2] - lo[:2]).max()))
        traces.append(go.Mesh3d(x=[c[0] - h, c[0] + h, c[0] + h, c[0] - h], y=[c[1] - h, c[1] - h, c[1] + h, c[1] + h],
                                z=[0.0] * 4, i=[0, 0], j=[1, 2], k=[2, 3], color=_GROUND_COLOR, name="ground",
                                hoverinfo="skip", flatshading=True, showlegend=False))
        lo = np.minimum(lo, [c[0] - h, c[1] - h, 0.0])
        hi = np.maximum(hi, [c[0] + h, c[1] + h, 0.0])

    # Fixed axis ranges over the whole trajectory, equal scale on all three axes: the view stays put.
    # A flat extent (a planar pendulum) still gets a box a fifth as deep as it is wide.
    mid, span = 0.5 * (lo + hi), np.maximum(hi - lo, 1e-3)
    span = np.maximum(span, 0.2 * span.max())
    lo, hi = mid - 0.5 * span, mid + 0.5 * span
    pad = 0.05 * span.max()
    lo, hi = lo - pad, hi + pad
    span = hi - lo
    ratio = span / span.max()
    axis = dict(showbackground=False, gridcolor="rgb(220, 220, 220)", zerolinecolor="rgb(180, 180, 180)")
    labels = [f"{k * dt:.3g} s" if dt is not None else str(k) for k in range(steps)]
    frame_ms = 1000.0 / fps if fps is not None else (1000.0 * dt if dt is not None else 50.0)
    frames = [go.Frame(
        name=str(t), traces=moving,
        data=[(go.Mesh3d if i < len(meshes) else go.Scatter3d)(
            x=_typed(world[i][t, :, 0]), y=_typed(world[i][t, :, 1]), z=_typed(world[i][t, :, 2])) for i in moving],
    ) for t in range(steps)]
    play = dict(frame=dict(duration=frame_ms, redraw=True), transition=dict(duration=0), fromcurrent=True,
                mode="immediate")
    still = dict(frame=dict(duration=0, redraw=True), transition=dict(duration=0), mode="immediate")
    names = [n for n, _ in models]
    layout = go.Layout(
        title=dict(text=title if title is not None else ", ".join(names), x=0.02),
        margin=dict(l=0, r=0, t=40, b=0), paper_bgcolor="white",
        scene=dict(
            xaxis=dict(range=[lo[0], hi[0]], title="x [m]", **axis),
            yaxis=dict(range=[lo[1], hi[1]], title="y [m]", **axis),
            zaxis=dict(range=[lo[2], hi[2]], title="z [m]", **axis),
            aspectmode="manual", aspectratio=dict(x=ratio[0], y=ratio[1], z=ratio[2]),
            camera=dict(eye=dict(x=1.2, y=1.2, z=0.75)), domain=dict(x=[0, 1], y=[0.1 if steps > 1 else 0, 1]),
        ),
        updatemenus=[dict(
            type="buttons", direction="left", x=0.02, y=0.02, xanchor="left", yanchor="bottom",
            pad=dict(r=10, t=10), showactive=False, visible=steps > 1,
            buttons=[dict(label="Play", method="animate", args=[None, play]),
                     dict(label="Pause", method="animate", args=[[None], still])],
        )],
        sliders=[dict(
            active=0, x=0.15, len=0.83, y=0.02, yanchor="bottom", pad=dict(t=10, b=10),
            currentvalue=dict(prefix="t = " if dt is not None else "step ", visible=True, font=dict(color="black")),
            # Beyond a few dozen steps the tick labels overlap: keep the ticks, show the value above.
            font=dict(color="rgba(0, 0, 0, 0)") if steps > 25 else None, visible=steps > 1,
            steps=[dict(label=labels[t], method="animate", args=[[str(t)], still]) for t in range(steps)],
        )],
    )
    return go.Figure(data=traces, layout=layout, frames=frames)


def show(obj, q_trajectory=None, path: str | os.PathLike = "traj.html", **kwargs) -> Path:
    """Write an animated 3-D view of a robot or scene as one self-contained HTML file.

    The page carries plotly.js inline: it opens offline, from disk, with no server. ``kwargs`` go
    to :func:`figure` (``geometry``, ``dt``, ``fps``, ``max_faces``, ``ground``, ``title``).

    Args:
        obj: a :class:`~diffmech.RobotModel` or a :class:`diffmech.sim.Scene`.
        q_trajectory: ``(T, nq)`` or ``(nq,)`` configurations; ``None``: the neutral configuration.
        path: the HTML file to write (its folder is created).

    Returns:
        The path written.
    """
    fig = figure(obj, q_trajectory, **kwargs)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(path, include_plotlyjs=True, full_html=True, auto_play=False,
                   config={"displaylogo": False, "responsive": True})
    return path
