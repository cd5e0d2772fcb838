"""One time step of a :class:`~diffmech.sim.Scene` with frictional contact and joint limits.

Semi-implicit Euler at the velocity level (the time-stepping of Stewart-Trinkle / Anitescu-Potra
that the seed's simulator and most robotics engines use):

1. each model's free velocity ``v_free = v + dt M^-1 (tau - h(q, v))`` from the core's mass
   matrix and bias forces;
2. contact candidates from the narrow phase (:mod:`diffmech.contact.geometry`) and joint-limit
   rows, each a block ``(normal, tangent, tangent)`` of the contact Jacobian ``J``;
3. impulses ``lam`` from projected Gauss-Seidel (:func:`diffmech.contact.pgs.pgs`) -- or, with
   ``Scene(solver="smooth")``, of the relaxed problem of :mod:`diffmech.contact.smooth`, by Newton's
   method from the PGS solution -- with normal
   targets ``b``: a separated candidate (``phi > 0``) may close the gap within the step (``v_n >=
   -phi / dt``, a speculative contact: the body lands on the surface instead of into it), a
   penetrating one is pushed out by ``baumgarte * |phi| / dt``, and an impact faster than
   ``bounce_speed`` leaves with ``-e`` times its normal velocity;
4. ``v+ = v_free + M^-1 J^T lam`` and ``q+ = integrate(q, v+, dt)`` per model (a floating
   base translates by ``dt`` times its world-frame velocity, see :func:`_advance`).

Candidates that cannot touch within the step in any environment of the batch are dropped before
the solve (a broad phase on bounding spheres, then on the signed distance against the relative
speed), so the solver sees only the candidates that matter. The shapes of a model are placed in one
pass, and the spheres and capsules near the ground -- robots' feet -- are tested in one batched pass
per kind. Every operation is differentiable; the rollout's checkpointed backward recomputes a step
under autograd from the forward step's contact set and impulses (``replay``: no broad phase, no
selection, no sweeps, the same result bit for bit) and differentiates through it -- stage 3 and
the impulse of stage 4 as one node with a hand-written reverse pass
(:func:`diffmech.contact.impulses.velocity_update`).

A scene of one robot whose shapes are spheres, capsules, boxes and cylinders touching only the ground takes a native
route once its kernels are built (:func:`diffmech.sim.prepare_ground_kernels`): stages 1 and 2 are
one kernel call (every ball a candidate: no broad phase), and the step's gradient one node that
runs that kernel's reverse mode and the contact problem's reverse pass in C
(:mod:`diffmech.sim._ground_step`, :mod:`diffmech.contact.update_native`). Same contact set, same
solver, same step to rounding.
"""

from __future__ import annotations

import contextlib
import dataclasses
import warnings
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..contact import convex
from ..contact import geometry as geo
from ..contact.impulses import Blocks, assemble, velocity_update
from ..contact.pgs import pgs
from ..contact.smooth import smooth_solve
from ..dynamics import threads
from ..dynamics._jacobian import JACOBIAN_MAX_BATCH, one_thread
from ..dynamics.free_flyer import free_flyer_integrate
from ..dynamics.kinematics import advance_floating_base, poses_and_world_jacobians
from ..errors import ModelError, ShapeError, SimulationError
from ..model.collision import Shape
from ..spatial import quat_to_matrix, rpy_to_matrix, skew
from ._ground_step import coefficients as ground_coefficients
from ._ground_step import ground_advance, ground_velocity_update, has_limits, with_graph
from .integrators import check_dt
from .route import step_route, warn_unconverged
from .scene import GROUND, Scene

__all__ = ["contact_step"]

_SUPPORTED = {("sphere", "sphere"), ("box", "sphere"), ("capsule", "sphere"), ("capsule", "capsule"),
              ("box", "capsule"), ("box", "box")}


def _pair(ka, sa, Ra, pa, kb, sb, Rb, pb, ha=None, hb=None) -> geo.Candidates:
    """Candidates of shape a against shape b (normal from b to a); ``ha``, ``hb``: the hulls of
    convex shapes (:mod:`diffmech.contact.convex`)."""
    if ka == "convex" or kb == "convex":
        return _convex_pair(ka, sa, Ra, pa, kb, sb, Rb, pb, ha, hb)
    if (ka, kb) not in _SUPPORTED:
        c = _pair(kb, sb, Rb, pb, ka, sa, Ra, pa)
        return geo.Candidates(c.phi, c.point, -c.normal)
    if ka == "sphere":
        return geo.sphere_sphere(pa, sa[0], pb, sb[0])
    if ka == "box" and kb == "sphere":
        c = geo.sphere_box(pb, sb[0], Ra, pa, sa)
        return geo.Candidates(c.phi, c.point, -c.normal)
    if ka == "capsule" and kb == "sphere":
        c = geo.sphere_capsule(pb, sb[0], Ra, pa, sa)
        return geo.Candidates(c.phi, c.point, -c.normal)
    if ka == "capsule":
        return geo.capsule_capsule(Ra, pa, sa, Rb, pb, sb)
    if kb == "capsule":
        c = geo.capsule_box(Rb, pb, sb, Ra, pa, sa)
        return geo.Candidates(c.phi, c.point, -c.normal)
    return geo.box_box(Ra, pa, sa, Rb, pb, sb)


def _convex_pair(ka, sa, Ra, pa, kb, sb, Rb, pb, ha, hb) -> geo.Candidates:
    """A pair with a convex shape (the convex one first in :mod:`diffmech.contact.convex`'s functions)."""
    if ka != "convex":
        c = _convex_pair(kb, sb, Rb, pb, ka, sa, Ra, pa, hb, ha)
        return geo.Candidates(c.phi, c.point, -c.normal)
    if kb == "convex":
        return convex.convex_convex(ha, sa, Ra, pa, hb, sb, Rb, pb)
    if kb == "sphere":
        return convex.convex_sphere(ha, sa, Ra, pa, pb, sb[0])
    if kb == "capsule":
        return convex.convex_capsule(ha, sa, Ra, pa, Rb, pb, sb)
    if kb == "box":
        return convex.convex_box(ha, sa, Ra, pa, Rb, pb, sb)
    raise ModelError(f"Scene: a convex shape touches spheres, capsules, boxes, convex shapes and the ground, "
                     f"not a {kb}")


def _tangents(n: Tensor) -> tuple[Tensor, Tensor]:
    a = torch.zeros_like(n)
    use_y = n[..., 0].abs() > 0.9
    a[..., 0] = torch.where(use_y, 0.0, 1.0)
    a[..., 1] = torch.where(use_y, 1.0, 0.0)
    t1 = torch.linalg.cross(n, a)
    t1 = t1 / t1.norm(dim=-1, keepdim=True)
    return t1, torch.linalg.cross(n, t1)


_FRAMES: dict = {}


def _shape_frame(s: Shape, dtype, device) -> tuple[Tensor | None, Tensor | None]:
    """A shape's rotation and offset in its link's frame as tensors, ``None`` where they are the
    identity or zero (most shapes): built once per shape placement, dtype and device."""
    key = (s.rpy, s.xyz, dtype, device)
    got = _FRAMES.get(key)
    if got is None:
        R = None if not any(s.rpy) else rpy_to_matrix(torch.tensor(s.rpy, dtype=dtype, device=device))
        p = None if not any(s.xyz) else torch.tensor(s.xyz, dtype=dtype, device=device)
        got = _FRAMES[key] = (R, p)
    return got


def _adjacent(robot, a: str, b: str) -> bool:
    t = robot.tree
    la, lb = t.link(a), t.link(b)
    return la == lb or t.link_parent[la] == lb or t.link_parent[lb] == la


def _broad_phase(scene: Scene, items: list, P: Tensor | None, reach: float) -> tuple[list[int], list[tuple[int, int]]]:
    """Shapes that may touch the ground, and pairs of shapes that may touch each other, within one
    step in any environment: bounding spheres tested all at once (one ``(B, N, N)`` distance
    table and one transfer to the host), so a scene of many bodies pays the narrow phase only
    for the pairs that are close. Shapes of one model are paired only with ``self_collision``
    and never across a joint; a static model's shapes (fixed obstacles) are paired with no shape of
    another static model and never with the ground."""
    if not items:
        return [], []
    P = P.detach()  # (B, N, 3) the shapes' centres
    rad = P.new_tensor([it[4] for it in items])  # (N,)
    N = len(items)
    key = (scene.self_collision, tuple(it[:2] for it in items))
    cache = scene.__dict__.setdefault("_pair_masks", {})
    if key not in cache:  # which pairs may touch at all: fixed for a scene, built once
        ok = torch.ones(N, N, dtype=torch.bool).triu(1)
        for i in range(N):
            for j in range(i + 1, N):
                (na, la), (nb, lb) = items[i][:2], items[j][:2]
                if na == nb and (not scene.self_collision or _adjacent(scene.models[na], la, lb)):
                    ok[i, j] = False
                if na in scene.static and nb in scene.static:  # two obstacles: neither moves
                    ok[i, j] = False
        cache[key] = ok
    pair_ok = cache[key]
    if N > 1 and cache.setdefault(("any", key), bool(pair_ok.any())):  # no pair may touch: no distance table
        gap = torch.cdist(P, P).amin(0) - rad[:, None] - rad[None, :]
        close = (gap <= reach).cpu() & pair_ok
    else:
        close = pair_ok
    low = (P[..., 2] - rad).amin(0).cpu() if scene.ground else None
    ground = [] if low is None else [i for i in (low < reach).nonzero()[:, 0].tolist()
                                     if items[i][0] not in scene.static]
    return ground, [tuple(ij) for ij in close.nonzero().tolist()]


class _Layout(NamedTuple):
    links: Tensor  # (S,) link index of each shape
    R: Tensor | None  # (S, 3, 3) shape rotations in their links (None: all identity)
    xyz: Tensor | None  # (S, 3) shape offsets (None: all zero)
    shapes: list  # (link, index on the link, Shape, row of the link among the model's shaped links)


_LAYOUTS: dict = {}


def _offsets(shapes: list, dtype, device) -> tuple[Tensor | None, Tensor | None]:
    """The shapes' rotations ``(S, 3, 3)`` and offsets ``(S, 3)`` in their links, ``None`` where all are the
    identity or zero; the identity and zero stand in for a shape without one (exact in the products:
    ``x 1 + y 0 + z 0 = x``)."""
    frames = [_shape_frame(sh, dtype, device) for sh in shapes]
    eye, zero = torch.eye(3, dtype=dtype, device=device), torch.zeros(3, dtype=dtype, device=device)
    R = torch.stack([eye if Rs is None else Rs for Rs, _ in frames]) if any(f[0] is not None for f in frames) else None
    xyz = torch.stack([zero if x is None else x for _, x in frames]) if any(f[1] is not None for f in frames) else None
    return R, xyz


def _shape_layout(scene: Scene, n: str, dtype, device) -> _Layout:
    """Model ``n``'s shapes as index and offset tensors, built once per layout, dtype and device."""
    m = scene.models[n]
    shaped = list(scene.shapes[n])
    shapes = [(link, k, sh, j) for j, link in enumerate(shaped) for k, sh in enumerate(scene.shapes[n][link])]
    key = (tuple(m.link_names), tuple((link, k, sh.kind, sh.rpy, sh.xyz, sh.hull) for link, k, sh, _ in shapes),
           dtype, device)
    got = _LAYOUTS.get(key)
    if got is None:
        links = torch.tensor([m.link_names.index(link) for link, _, _, _ in shapes], dtype=torch.long, device=device)
        got = _LAYOUTS[key] = _Layout(links, *_offsets([sh for _, _, sh, _ in shapes], dtype, device), shapes)
    return got


def _free_layout(scene: Scene, free: list[str], dtype, device) -> tuple[Tensor, _Layout, list, Tensor]:
    """The free bodies' shapes: each shape's body (index into ``free``), their offsets as a
    :class:`_Layout` (``links`` unused), ``(model, link, index, Shape)`` per shape, and each body's six
    columns in the scene's velocity ``(K, 6)``; cached."""
    shapes = [(n, link, k, sh) for n in free for link, shs in scene.shapes[n].items() for k, sh in enumerate(shs)]
    starts = tuple(scene.vslices[n].start for n in free)
    key = ("free", tuple(free), starts,
           tuple((n, link, k, sh.kind, sh.rpy, sh.xyz, sh.hull) for n, link, k, sh in shapes), dtype, device)
    got = _LAYOUTS.get(key)
    if got is None:
        body = torch.tensor([free.index(n) for n, _, _, _ in shapes], dtype=torch.long, device=device)
        cols = torch.tensor([list(range(s0, s0 + 6)) for s0 in starts], dtype=torch.long, device=device)
        got = _LAYOUTS[key] = (body, _Layout(body, *_offsets([sh for _, _, _, sh in shapes], dtype, device), []),
                               shapes, cols)
    return got


def _placed(R: Tensor, p: Tensor, layout: _Layout) -> tuple[Tensor, Tensor]:
    """Shapes' world placements from their links' ``(R (B, S, 3, 3), p (B, S, 3))`` and offsets."""
    if layout.xyz is not None:
        p = p + (R @ layout.xyz[..., None])[..., 0]
    if layout.R is not None:
        R = R @ layout.R
    return R, p


def _item(scene: Scene, n: str, link: str, k: int, shape: Shape, row: int) -> tuple:
    """``(model, link, shape, size, bounding radius, world Jacobian row)`` of one shape."""
    size = scene.shape_size(n, link, k)
    radius = (dataclasses.replace(shape, size=tuple(size.detach().tolist())).bounding_radius
              if isinstance(size, Tensor) else shape.bounding_radius)
    return n, link, shape, size, radius, row


class _Touching(NamedTuple):
    """Groups of candidates (a shape on the ground or a pair of shapes) side by side."""

    bodies: list  # per group: row of the body in the world Jacobians, or a pair (a, b) of rows (relative)
    keys: list  # per group: (i, -1) or (i, j), items' indices
    coef: list  # per group: the arguments of Scene.coefficients
    counts: list  # per group: number of candidates
    phi: Tensor  # (B, m)
    point: Tensor  # (B, m, 3)
    normal: Tensor | None  # (B, m, 3); None: the ground's +z for all


# (normal, tangent, tangent) of the ground: +z, then the tangents _tangents gives +z: +y and -x
_GROUND_FRAME = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [-1.0, 0.0, 0.0]], dtype=torch.float64)


def _ground_candidates(items: list, near: list[int], R_all: Tensor, p_all: Tensor) -> _Touching:
    """The candidates of the shapes ``near`` the ground, spheres and capsules of all models in one batched
    pass each (kinds in the order they first appear), boxes and cylinders one by one."""
    kinds: dict[str, list[int]] = {}
    for i in near:
        kinds.setdefault(items[i][2].kind, []).append(i)
    order, counts, phis, points = [], [], [], []
    for kind, sel in kinds.items():
        if kind in ("sphere", "capsule"):
            idx = torch.tensor(sel, dtype=torch.long, device=p_all.device)
            phi, point = geo.plane_candidates_many(kind, [items[i][3] for i in sel], R_all[:, idx], p_all[:, idx])
            per = 1 if kind == "sphere" else 2
        elif kind == "convex":
            c = [convex.convex_plane(items[i][2].hull, items[i][3], R_all[:, i], p_all[:, i]) for i in sel]
            phi, point = torch.cat([x.phi for x in c], 1), torch.cat([x.point for x in c], 1)
            per = None
        else:
            c = [geo.plane_candidates(kind, items[i][3], R_all[:, i], p_all[:, i]) for i in sel]
            phi, point = torch.cat([x.phi for x in c], 1), torch.cat([x.point for x in c], 1)
            per = c[0].phi.shape[1]
        order += sel
        counts += [x.phi.shape[1] for x in c] if per is None else [per] * len(sel)
        phis.append(phi)
        points.append(point)
    return _Touching([items[i][5] for i in order], [(i, -1) for i in order],
                     [(items[i][0], GROUND, items[i][1], None) for i in order], counts,
                     torch.cat(phis, 1) if len(phis) > 1 else phis[0],
                     torch.cat(points, 1) if len(points) > 1 else points[0], None)


def _select(scene: Scene, t: _Touching, J_all: Tensor, v_free: Tensor, dt: float, kept: dict | None, rows, phis,
            mus, es, keys, B: int, dtype, frame: Tensor | None = None) -> None:
    """Keep the candidates of ``t`` that can touch within the step (or, replaying, those the step
    kept) and append their rows (normal, two tangents), gaps, coefficients and keys."""
    owner = [g for g, k in enumerate(t.counts) for _ in range(k)]
    first = [0]
    for k in t.counts:
        first.append(first[-1] + k)
    dev = v_free.device
    pairs = isinstance(t.bodies[0], tuple)

    def rows_of(cands: list[int]) -> Tensor:
        """The candidates' bodies' world Jacobians (B, m, 6, nv): relative for pairs, linear in the twists."""
        if pairs:
            ra = torch.tensor([t.bodies[owner[j]][0] for j in cands], dtype=torch.long, device=dev)
            rb = torch.tensor([t.bodies[owner[j]][1] for j in cands], dtype=torch.long, device=dev)
            return J_all[:, ra] - J_all[:, rb]
        return J_all[:, torch.tensor([t.bodies[owner[j]] for j in cands], dtype=torch.long, device=dev)]

    if kept is not None:
        idx = [first[g] + j for g, key in enumerate(t.keys) for j in kept.get(key, ())]
    else:
        with torch.no_grad():  # a mask only: the velocity of each candidate point, v_o + w x x, from the twists
            tw = (rows_of(list(range(len(owner)))) @ v_free[:, None, :, None])[..., 0]  # (B, m, 6)
            vrel = tw[..., :3] + torch.linalg.cross(tw[..., 3:], t.point, dim=-1)
            idx = (t.phi < 2e-3 + 2.0 * dt * vrel.norm(dim=-1)).any(0).nonzero()[:, 0].tolist()
    if not idx:
        return
    # the kept candidates' rows only (B, k, 3, nv): each column's angular part crossed with the point
    sel = torch.tensor(idx, dtype=torch.long, device=dev)
    Jc = rows_of(idx)
    Js = Jc[:, :, :3] + torch.linalg.cross(Jc[:, :, 3:], t.point[:, sel, :, None], dim=-2)
    keys.extend((*t.keys[owner[j]], j - first[owner[j]]) for j in idx)
    if frame is not None:
        rows.append(frame @ Js)  # the same frame for every candidate (the ground)
    else:
        nrm = t.normal[:, sel]
        t1, t2 = _tangents(nrm)
        rows.append(torch.stack([nrm, t1, t2], dim=-2) @ Js)
    phis.append(t.phi[:, sel])
    groups = [owner[j] for j in idx]
    coef = {g: scene.coefficients(*t.coef[g]) for g in set(groups)}
    for out, j in ((mus, 0), (es, 1)):
        vals = [coef[g][j] for g in groups]
        if any(isinstance(x, Tensor) for x in vals):
            out.append(torch.stack([torch.as_tensor(x, dtype=dtype, device=v_free.device) for x in vals])
                       .expand(B, -1))
        else:
            out.append(torch.tensor(vals, dtype=dtype, device=v_free.device).expand(B, -1))


def _singular(name: str, m, q: Tensor, v: Tensor, tau: Tensor) -> Exception:
    """The error for a mass matrix that failed to factor: a non-finite ``q (B, nq)``, ``v`` or ``tau (B, nv)``
    of model ``name`` (named with its batch element and coordinate; a rollout adds the step), else a
    singular model."""
    from ._guards import coord_name, dof_name

    for arg, x, what in (("q", q, coord_name), ("v", v, dof_name), ("tau", tau, dof_name)):
        bad = ~torch.isfinite(x.detach())
        if bool(bad.any()):
            b, i = bad.nonzero()[0].tolist()
            err = SimulationError(f"contact_step: '{arg}' of model {name!r} is not finite in batch element {b}: "
                                  f"{what(m, i)} = {x[b, i].item()}")
            err.argument = arg
            return err
    return ModelError(f"Scene model {name!r}: the mass matrix is not positive definite (a massless moving link?)")


def _free_bodies(scene: Scene) -> list[str]:
    """Names of the scene's free rigid bodies (a floating base and no joint, e.g.
    :func:`diffmech.model.systems.sphere`): their dynamics, poses and steps are evaluated together
    in closed form (:func:`_free_body_dynamics`) where a scene has two or more -- a pile of 50 balls
    would otherwise cost 50 calls of each rigid-body algorithm per step."""
    free = [n for n in scene.names if scene.models[n].floating_base and scene.models[n].nv == 6
            and len(scene.models[n].link_names) == 1 and n not in scene.drives]
    return free if len(free) >= 2 else []


def _free_body_dynamics(scene: Scene, free: list[str], qs: dict, vs: dict, ts: dict, dt: float, chol: dict,
                        vfree: dict) -> tuple[Tensor, Tensor, Tensor]:
    """The first stage of the step for the free bodies ``free``, all at once: mass matrices,
    Cholesky factors and free velocities, written into the dicts as the per-model code writes them
    (``tests/test_contact.py`` checks them against it); returns the bodies' rotations ``(B, K, 3, 3)``,
    positions ``(B, K, 3)`` and world Jacobians ``(B, K, 6, 6)``.

    Body frame at the link origin, twist ``(v, w)`` in that frame; link mass ``m``, centre of mass
    ``c`` and inertia ``I_c`` about it (link axes): ``M = [[m 1, -m [c]x], [m [c]x, I_c - m [c]x^2]]``
    (constant), bias ``h = (w x p_l - m g_b, v x p_l + w x p_a - m c x g_b)`` with momenta
    ``p_l = m (v + w x c)``, ``p_a = m c x v + I_o w`` and gravity ``g_b = R^T g`` in the body frame.
    """
    models = [scene.models[n] for n in free]
    inertials = [m.link_params(m.link_names[0]).inertial() for m in models]
    mass = torch.stack([x[0] for x in inertials])  # (K,)
    c = torch.stack([x[1] for x in inertials])  # (K, 3)
    Ic = torch.stack([x[2] for x in inertials])  # (K, 3, 3)
    Ic = 0.5 * (Ic + Ic.transpose(-1, -2))  # the rigid-body algorithms read the symmetric part, so do their gradients
    g = torch.stack([m.gravity for m in models])  # (K, 3) world
    mk = mass[:, None, None]
    C = skew(c)
    Io = Ic - mk * (C @ C)
    eye = torch.eye(3, dtype=c.dtype, device=c.device).expand_as(C)
    M = torch.cat([torch.cat([mk * eye, -mk * C], -1), torch.cat([mk * C, Io], -1)], -2)  # (K, 6, 6)
    L, bad = torch.linalg.cholesky_ex(M)
    if bool(bad.any()):
        n = free[int(bad.nonzero()[0])]
        raise ModelError(f"Scene model {n!r}: the mass matrix is not positive definite (mass or inertia)")
    q = torch.stack([qs[n] for n in free], 1)  # (B, K, 7)
    v = torch.stack([vs[n] for n in free], 1)  # (B, K, 6)
    tau = torch.stack([ts[n] for n in free], 1)
    B = q.shape[0]
    R = quat_to_matrix(q[..., 3:7] / q[..., 3:7].norm(dim=-1, keepdim=True))  # (B, K, 3, 3)
    vl, w = v[..., :3], v[..., 3:]
    cb, m1 = c.expand(B, -1, -1), mass[:, None]
    pl = m1 * (vl + torch.linalg.cross(w, cb))
    pa = m1 * torch.linalg.cross(cb, vl) + (Io @ w[..., None])[..., 0]
    gb = (R.transpose(-1, -2) @ g[..., None])[..., 0]
    h = torch.cat([torch.linalg.cross(w, pl) - m1 * gb,
                   torch.linalg.cross(vl, pl) + torch.linalg.cross(w, pa) - m1 * torch.linalg.cross(cb, gb)], -1)
    Lb = L.expand(B, -1, -1, -1)
    acc = torch.cholesky_solve((tau - h)[..., None], Lb)[..., 0]
    acc = torch.cat([acc[..., :3] + torch.linalg.cross(w, vl), acc[..., 3:]], -1)  # world translation (_advance)
    v_free = v + dt * acc
    p = q[..., :3]
    Jw = torch.cat([torch.cat([R, skew(p) @ R], -1), torch.cat([torch.zeros_like(R), R], -1)], -2)
    for k, n in enumerate(free):
        chol[n] = Lb[:, k]
        vfree[n] = v_free[:, k]
    return R, p, Jw


def _advance(scene: Scene, qs: dict, vs: dict, dt: float, free: list[str]) -> tuple[Tensor, Tensor]:
    """Positions from the new velocities. A floating base's linear velocity is held in the base
    frame of step ``k`` through the step (the ``omega x v`` term is added to its rate above), so the
    base moves by ``dt R_k v`` in world axes and its velocity is re-expressed in the new base frame:
    a symplectic Euler step of the world-frame translation, which conserves the linear momentum of
    bodies that only push on each other exactly (integrating the base-frame velocity with ``exp``
    would not, by ``O(dt^2 |omega|^2 |v|)`` per step)."""
    if not free and len(scene.names) == 1:  # one model: no splitting and joining
        m = scene.models[scene.names[0]]
        q, v = qs[scene.names[0]], vs[scene.names[0]]
        return advance_floating_base(m, q, v, dt) if m.floating_base else (m.integrate(q, v, dt), v)
    qo, vo = {}, {}
    if free:  # the same update for all free bodies (see _free_bodies) in one pass
        q, v = torch.stack([qs[n] for n in free], 1), torch.stack([vs[n] for n in free], 1)  # (B, K, .)
        Rk = quat_to_matrix(q[..., 3:7] / q[..., 3:7].norm(dim=-1, keepdim=True))
        vw = (Rk @ v[..., :3, None])[..., 0]
        rot = free_flyer_integrate(q.reshape(-1, 7), (dt * torch.cat([torch.zeros_like(vw), v[..., 3:]], -1)
                                                      ).reshape(-1, 6)).reshape(q.shape)
        q1 = torch.cat([q[..., :3] + dt * vw, rot[..., 3:]], -1)
        R1 = quat_to_matrix(q1[..., 3:7])
        v1 = torch.cat([(R1.transpose(-1, -2) @ vw[..., None])[..., 0], v[..., 3:]], -1)
        for k, n in enumerate(free):
            qo[n], vo[n] = q1[:, k], v1[:, k]
    for n in scene.names:
        if n in qo:
            continue
        m, q, v = scene.models[n], qs[n], vs[n]
        if n in scene.static:  # (B, 0): nothing moves
            qo[n], vo[n] = q, v
            continue
        if not m.floating_base:
            qo[n], vo[n] = m.integrate(q, v, dt), v
            continue
        qo[n], vo[n] = advance_floating_base(m, q, v, dt)
    return torch.cat([qo[n] for n in scene.names], -1), torch.cat([vo[n] for n in scene.names], -1)


def _warn_fallback(scene: Scene, envs: list[int]) -> None:
    """Warn once per scene that a smooth contact problem had no root found and the hard solution
    stood in (``info["fallbacks"]`` and the rollout's ``contact_fallbacks`` count every case)."""
    if scene.__dict__.get("_warned_fallback"):
        return
    scene.__dict__["_warned_fallback"] = True
    warnings.warn(f"smooth contact solve: no root found for environment(s) {envs[:5]} by any route (a relaxed "
                  "problem can have none: more active constraints than degrees of freedom, feet sliding); they "
                  "take the hard problem's solution and its gradient for this step. Counted in "
                  "info['fallbacks'] / stats['contact_fallbacks']; warned once per scene.", RuntimeWarning,
                  stacklevel=3)


@threads.decided
def contact_step(scene: Scene, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict | None = None,
                 warm: dict | None = None, replay: dict | None = None) -> tuple[Tensor, Tensor]:
    """Advance ``(q (..., nq), v (..., nv))`` by ``dt`` under joint forces ``tau (..., nv)`` (the batch
    dims broadcast; one step of the scene's own rollout, where they are flattened to one).

    ``info`` (a dict), when given, receives ``route`` (the implementation that ran: ``"native"`` or
    ``"torch: <why>"``, see :mod:`diffmech.sim.route`), ``candidates`` (blocks solved), ``iterations``
    (sweeps), ``newton`` (Newton iterations after them), ``residual`` (the contact conditions' residual
    relative to the impulses), ``violation`` (m/s, their largest velocity error), ``unconverged``
    (environments whose solve stopped short; warned once per scene), ``penetration`` (deepest, m),
    ``fallbacks`` (with ``Scene(solver="smooth")``: environments whose relaxed problem had no root
    found, which took the hard problem's solution and its gradient instead; warned once per scene)
    and ``lam``, the impulses of each candidate by a key that names it across steps; passing that
    dict back as ``warm`` starts the next step's solver from them (a resting stack then needs a few
    sweeps instead of hundreds).

    With ``Scene(solver="mujoco")`` the step is MuJoCo's (:func:`diffmech.sim.soft_step.soft_step`,
    whose ``info`` keys are documented there; ``warm`` starts its solver, ``replay`` is not used).

    ``replay``: this very step's ``info["lam"]`` from an earlier evaluation at the same state and
    forces (with ``Scene(solver="pgs")``): the step is then recomputed with that contact set and those
    impulses -- no broad phase, no candidate selection, no sweeps -- and gives the same result, bit for
    bit, with the same (implicit) gradient. The checkpointed adjoint's backward pass recomputes its
    steps so.
    """
    check_dt(dt, "contact_step")
    for name, x, n in (("q", q, scene.nq), ("v", v, scene.nv), ("tau", tau, scene.nv)):
        if not isinstance(x, Tensor) or x.dim() < 1 or x.shape[-1] != n:
            raise ShapeError(f"contact_step: {name} must be a tensor (..., {n}) for this scene, got "
                             f"{tuple(getattr(x, 'shape', ())) if isinstance(x, Tensor) else type(x).__name__}")
    if q.dim() == 2 and v.shape == (q.shape[0], scene.nv) and tau.shape == v.shape:
        batch = None
    else:  # any other batch shape: broadcast and flatten to (B, n), the solver's layout
        try:
            batch = torch.broadcast_shapes(q.shape[:-1], v.shape[:-1], tau.shape[:-1])
        except RuntimeError:
            raise ShapeError(f"contact_step: the batch dims of q {tuple(q.shape)}, v {tuple(v.shape)} and tau "
                             f"{tuple(tau.shape)} do not broadcast") from None
        q, v, tau = (x.expand(*batch, x.shape[-1]).reshape(-1, x.shape[-1]) for x in (q, v, tau))
    # small dense solves: threads only wait for each other (see one_thread)
    if info is None:
        info = {}
    if scene.solver == "mujoco":  # MuJoCo's soft constraints and integrators (diffmech.sim.soft_step)
        from .soft_step import soft_step

        q1, v1 = soft_step(scene, q, v, tau, dt, info, warm)
        if batch is not None:
            q1, v1 = q1.reshape(*batch, scene.nq), v1.reshape(*batch, scene.nv)
        return q1, v1
    with one_thread() if q.shape[0] <= JACOBIAN_MAX_BATCH else contextlib.nullcontext():
        q1, v1 = _step(scene, q, v, tau, dt, info, warm, replay if scene.solver == "pgs" else None)
    if info.get("unconverged"):
        warn_unconverged(scene, info, "contact_step")
    if batch is not None:
        q1, v1 = q1.reshape(*batch, scene.nq), v1.reshape(*batch, scene.nv)
    return q1, v1


def _replayed(replay: dict) -> tuple[list[int], list[tuple[int, int]], dict]:
    """The shapes near the ground, the pairs of shapes near each other and, per group of candidates
    (``(i, -1)``, ``(i, j)``, ``(model, sign)`` of the joint limits), the indices kept: from the keys of
    a step's impulses (see :func:`contact_step`'s ``replay``), in the order the step made them."""
    ground, pairs, kept = set(), set(), {}
    for key in replay:
        kept.setdefault(key[:2], []).append(key[2])
        if isinstance(key[0], str):  # a joint limit: (model, sign, joint)
            continue
        if key[1] == -1:
            ground.add(key[0])
        else:
            pairs.add(key[:2])
    return sorted(ground), sorted(pairs), kept


def _step(scene: Scene, q: Tensor, v: Tensor, tau: Tensor, dt: float, info: dict | None, warm: dict | None,
          replay: dict | None = None) -> tuple[Tensor, Tensor]:
    got = step_route(scene, q, v, tau, dt, info, warm, replay)
    if got is not None:
        return got
    B = q.shape[0]
    dtype = q.dtype
    names = scene.names
    qs, vs, ts = scene.split(q, "q"), scene.split(v, "v"), scene.split(tau, "v")
    chol, vfree, poses, jac_world = {}, {}, {}, {}
    free = _free_bodies(scene)
    if free:
        free_R, free_p, free_J = _free_body_dynamics(scene, free, qs, vs, ts, dt, chol, vfree)
    for n in names:
        if n in chol:
            continue
        m = scene.models[n]
        if n in scene.static:  # a fixed obstacle: no velocity, no mass matrix; its shapes' poses only
            vfree[n] = vs[n]
            if scene.shapes[n]:  # its Jacobians have no column: (B, L, 6, 0), zero rows once padded
                poses[n], jac_world[n] = poses_and_world_jacobians(m, qs[n], list(scene.shapes[n]))
            continue
        M = m.mass_matrix(qs[n])
        f = ts[n] - m.bias_forces(qs[n], vs[n])
        if n in scene.drives:
            # Linearly implicit spring-damper: kp (q_ref - q1) - kd v1 with q1 = q + dt v1, so
            # (M + dt kd + dt^2 kp) a = f + kp (q_ref - q) - (kd + dt kp) v on the joint rows; the
            # motors' armature adds to the same diagonal.
            kp, kd, ref, arm = scene.drives[n]
            nj = kp.shape[0]
            qj, vj = qs[n][..., m.nq - nj:], vs[n][..., m.nv - nj:]
            fj = kp * (ref - qj) - (kd + dt * kp) * vj
            f = torch.cat([f[..., :m.nv - nj], f[..., m.nv - nj:] + fj], -1)
            extra = torch.nn.functional.pad(arm + dt * kd + dt * dt * kp, (m.nv - nj, 0))
            M = M + torch.diag_embed(extra)
        L, bad = torch.linalg.cholesky_ex(M)
        if bool(bad.any()):
            raise _singular(n, m, qs[n], vs[n], ts[n])
        chol[n] = L
        acc = torch.cholesky_solve(f[..., None], L)[..., 0]
        if m.floating_base:  # base translation in world axes at step k (see _advance)
            w, vl = vs[n][..., 3:6], vs[n][..., :3]
            acc = torch.cat([acc[..., :3] + torch.linalg.cross(w, vl), acc[..., 3:]], -1)
        vfree[n] = vs[n] + dt * acc
        if scene.shapes[n]:  # poses of all links and world Jacobians of the shaped ones, one pass
            poses[n], jac_world[n] = poses_and_world_jacobians(m, qs[n], list(scene.shapes[n]))
    v_free = torch.cat([vfree[n] for n in names], -1)

    # shapes in the world: each model's in one pass (their links' poses, then the shapes' offsets)
    items = []  # (model, link, shape, size, bounding radius, world Jacobian row)
    Rs_w, ps_w, jrows = [], [], []
    if free and any(scene.shapes[n] for n in free):  # the free bodies' shapes at once
        body, frames, shapes, cols = _free_layout(scene, free, dtype, q.device)
        R, p = _placed(free_R[:, body], free_p[:, body], frames)
        Rs_w.append(R)
        ps_w.append(p)
        # (B, K, 6, nv): each body's Jacobian in its 6 columns of the scene's velocity
        B_, K_ = free_J.shape[:2]
        jrows.append(free_J.new_zeros(B_, K_, 6, scene.nv).scatter(
            3, cols[None, :, None, :].expand(B_, K_, 6, 6), free_J))
        items += [_item(scene, n, link, k, shape, b) for (n, link, k, shape), b in zip(shapes, body.tolist())]
    for n in names:
        if not scene.shapes[n] or n in free:
            continue
        layout = _shape_layout(scene, n, dtype, q.device)
        T = poses[n][:, layout.links]  # (B, S, 4, 4)
        R, p = _placed(T[..., :3, :3], T[..., :3, 3], layout)
        Rs_w.append(R)
        ps_w.append(p)
        sl = scene.vslices[n]
        jrows.append(torch.nn.functional.pad(jac_world[n], (sl.start, scene.nv - sl.stop)))  # (B, L, 6, nv)
        row0 = sum(x.shape[1] for x in jrows[:-1])
        items += [_item(scene, n, link, k, shape, row0 + j) for link, k, shape, j in layout.shapes]
    R_all = torch.cat(Rs_w, 1) if len(Rs_w) > 1 else (Rs_w[0] if Rs_w else None)  # (B, N, 3, 3)
    p_all = torch.cat(ps_w, 1) if len(ps_w) > 1 else (ps_w[0] if ps_w else None)  # (B, N, 3)
    J_all = torch.cat(jrows, 1) if len(jrows) > 1 else (jrows[0] if jrows else None)  # (B, L, 6, nv), world origin

    reach = 0.05 + 50.0 * dt  # m: what can come into contact within one step at up to 50 m/s
    kept = None
    if replay is not None:
        near_ground, near_pairs, kept = _replayed(replay)
    else:
        near_ground, near_pairs = _broad_phase(scene, items, p_all, reach)

    rows, phis, mus, es, keys = [], [], [], [], []
    # every candidate of the shapes near the ground at once: per kind of shape, one batched narrow phase
    if near_ground:
        ground = _ground_candidates(items, near_ground, R_all, p_all)
        _select(scene, ground, J_all, v_free, dt, kept, rows, phis, mus, es, keys, B, dtype,
                frame=_GROUND_FRAME.to(dtype=dtype, device=q.device))
    if near_pairs:
        groups = []  # (Candidates, item a, item b)
        for i, j in near_pairs:
            na, la, sa, za, _, _ = items[i]
            nb, lb, sb, zb, _, _ = items[j]
            if "cylinder" in (sa.kind, sb.kind):
                raise ModelError(f"Scene: a cylinder touches only the ground; {na}/{la} ({sa.kind}) and "
                                 f"{nb}/{lb} ({sb.kind}) came within {reach:.3g} m of each other")
            groups.append((_pair(sa.kind, za, R_all[:, i], p_all[:, i], sb.kind, zb, R_all[:, j], p_all[:, j],
                                 sa.hull, sb.hull), i, j))
        pairs = _Touching([(items[i][5], items[j][5]) for _, i, j in groups],
                          [(i, j) for _, i, j in groups],
                          [(items[i][0], items[j][0], items[i][1], items[j][1]) for _, i, j in groups],
                          [g[0].phi.shape[1] for g in groups],
                          torch.cat([g[0].phi for g in groups], 1), torch.cat([g[0].point for g in groups], 1),
                          torch.cat([g[0].normal for g in groups], 1))
        _select(scene, pairs, J_all, v_free, dt, kept, rows, phis, mus, es, keys, B, dtype)
    if scene.limits:
        _limit_rows(scene, qs, vs, dt, kept, rows, phis, mus, es, keys, B, q)
    return _finish(scene, qs, v, v_free, vfree, chol, free, rows, phis, mus, es, keys, dt, info, warm, replay)


def _limit_rows(scene: Scene, qs: dict, vs: dict, dt: float, kept: dict | None, rows, phis, mus, es, keys, B: int,
                q: Tensor) -> None:
    """Append the rows of the joint limits that can be reached within the step (or, replaying, those
    the step kept: ``kept`` from :func:`_replayed`): a unilateral constraint on the joint's velocity,
    without friction."""
    for n in scene.names:
        m = scene.models[n]
        lim = m.joint_limits()
        lo, hi = lim["lower"], lim["upper"]
        off = 7 if m.floating_base else 0
        if lo.numel() != m.nq - off or m.nq - off == 0:
            continue
        qj, vj = qs[n][:, off:], vs[n][:, m.nv - lo.numel():]
        cpu = q.is_cpu  # a few numbers: numpy's operations cost a fraction of torch's dispatch
        if kept is None and cpu:
            lon, hin = lo.detach().numpy(), hi.detach().numpy()
            if not (np.isfinite(lon).any() or np.isfinite(hin).any()):
                continue  # no joint has a limit
            qn, vn = qj.detach().numpy(), vj.detach().numpy()
        col = scene.vslices[n].start + m.nv - lo.numel()
        for sign in (1.0, -1.0):
            if kept is not None:
                if (n, sign) not in kept:
                    continue
                idx = torch.tensor(kept[(n, sign)], dtype=torch.long, device=q.device)
            elif cpu:
                with np.errstate(invalid="ignore"):
                    gap = qn - lon if sign > 0 else hin - qn
                    sel = np.flatnonzero((np.isfinite(gap) & (gap < 2e-3 + 2.0 * dt * np.abs(vn))).any(0))
                if not len(sel):
                    continue
                idx = torch.from_numpy(sel).to(q.device)
            else:
                with torch.no_grad():
                    gap = qj - lo if sign > 0 else hi - qj
                    keep = (torch.isfinite(gap) & (gap < 2e-3 + 2.0 * dt * vj.abs())).any(0)
                if not bool(keep.any()):
                    continue
                idx = keep.nonzero()[:, 0]
            phi = qj[:, idx] - lo[idx] if sign > 0 else hi[idx] - qj[:, idx]
            keys.extend((n, sign, j) for j in idx.tolist())
            k = len(idx)
            J = torch.zeros(B, k, 3, scene.nv, dtype=q.dtype, device=q.device)
            J[:, torch.arange(k), 0, col + idx] = sign
            rows.append(J)
            phis.append(phi)
            mus.append(q.new_zeros(B, k))
            es.append(q.new_zeros(B, k))


def _deepest(phi: Tensor) -> float:
    """The deepest penetration ``max(0, -phi)`` (m) of the gaps ``phi``."""
    if phi.is_cpu:  # a few numbers: numpy's operations cost a fraction of torch's dispatch
        return max(float(-phi.detach().numpy().min()), 0.0) + 0.0
    return float((-phi.detach()).clamp_min(0).amax()) + 0.0


def _finish(scene: Scene, qs: dict, v: Tensor, v_free: Tensor, vfree: dict, chol: dict, free: list, rows, phis, mus,
            es, keys, dt: float, info: dict | None, warm: dict | None, replay: dict | None, update=velocity_update,
            advance=None) -> tuple[Tensor, Tensor]:
    """Solve the contact problem of the rows gathered and advance the positions (``update``: the PGS
    solver's velocity update, :func:`~diffmech.contact.impulses.velocity_update` or a stand-in with
    its signature; ``advance(qs, vs)``: a stand-in for :func:`_advance` that may return ``None``)."""
    names = scene.names

    def advance_(vs: dict) -> tuple[Tensor, Tensor]:
        got = None if advance is None else advance(qs, vs)
        return got if got is not None else _advance(scene, qs, vs, dt, free)

    B = v.shape[0]
    if not rows:
        if info is not None:
            info.update(candidates=0, iterations=0, residual=0.0, penetration=0.0, fallbacks=0, newton=0,
                        violation=0.0, unconverged=0, lam={})
        return advance_(vfree)

    Jc, phi, mu, e = (x[0] if len(x) == 1 else torch.cat(x, 1) for x in (rows, phis, mus, es))  # (B, K, 3, nv), (B, K)
    K = Jc.shape[1]
    J = Jc.reshape(B, 3 * K, scene.nv)
    # the mass matrix's blocks: the free bodies' stacked (one batched solve), each other model's own
    # (a static model has none: no column of J is its, as for a body of infinite mass)
    moving = [n for n in names if n not in free and n not in scene.static]
    Ls = ([torch.stack([chol[n] for n in free], 1)] if free else []) + [chol[n][:, None] for n in moving]
    starts = ([tuple(scene.vslices[n].start for n in free)] if free else []) + [
        (scene.vslices[n].start,) for n in moving]
    blocks = Blocks(Ls, starts)
    rules = {"dt": dt, "baumgarte": scene.baumgarte, "bounce_speed": scene.bounce_speed}
    replayed = replay is not None and list(replay) == keys  # contact_step passes replay with pgs only
    lam0 = None
    if warm and not replayed:
        zero = phi.new_zeros(B, 3)
        lam0 = torch.stack([warm.get(k, zero) for k in keys], 1)
    fallbacks = 0
    if scene.solver == "smooth":
        prob = assemble(J, v, v_free, phi, e, blocks, **rules)
        A, c = prob.A, prob.c
        # the hard problem's solution, without a graph, is the starting guess of the Newton solve
        res = pgs(A.detach(), c.detach(), mu.detach(), iterations=scene.iterations, tol=scene.tol, lam0=lam0)
        lam_s, it_s, rel_s, solved = smooth_solve(A, c, mu, res.lam, kappa=scene.smoothing,
                                                  eps=scene.friction_smoothing, raise_on_failure=False)
        if not bool(solved.all()):
            # a relaxed problem without a root (see smooth_solve): that environment takes the hard
            # problem's solution, with its gradient, and the step says so
            bad = (~solved).nonzero()[:, 0]
            hard = pgs(A[bad], c[bad], mu[bad], iterations=scene.iterations, tol=scene.tol, lam0=res.lam[bad])
            lam_s = lam_s.index_put((bad,), hard.lam)
            fallbacks = len(bad)
            _warn_fallback(scene, bad.tolist())
        # the relaxed problem's residual; the hard problem's convergence only where its solution stood in
        res = res._replace(lam=lam_s, iterations=res.iterations + it_s, residual=max(res.residual, rel_s),
                           unconverged=hard.unconverged if fallbacks else 0,
                           violation=hard.violation if fallbacks else 0.0)
        v1 = v_free + (prob.W @ res.lam.reshape(B, 3 * K, 1))[..., 0]
    else:
        if replayed:
            sol = torch.stack([replay[k] for k in keys], 1)

            def solve(A, c, mu_):
                return pgs(A, c, mu_, solution=sol)
        else:
            def solve(A, c, mu_):
                return pgs(A, c, mu_, iterations=scene.iterations, tol=scene.tol, lam0=lam0)
        # assembly, solve and impulses with a hand-written reverse pass (see diffmech.contact.impulses)
        v1, res = update(J, v, v_free, phi, mu, e, blocks, solve, **rules)
    q1, v1 = advance_(scene.split(v1, "v"))
    if info is not None:
        lam = res.lam.detach()
        info.update(candidates=K, iterations=res.iterations, residual=res.residual, fallbacks=fallbacks,
                    newton=res.newton, violation=res.violation, unconverged=res.unconverged,
                    penetration=_deepest(phi),
                    lam=dict(zip(keys, lam.unbind(1))))
    return q1, v1


_NO_BALLS = torch.zeros(0, dtype=torch.long)


def _ground_step(scene: Scene, plan, stage: tuple, q: Tensor, v: Tensor, dt: float, info: dict | None,
                 warm: dict | None, replay: dict | None) -> tuple[Tensor, Tensor]:
    """:func:`_step` of one robot on the ground from the native first stage (:mod:`._ground_step`):
    every ball is a candidate (no broad phase: the kernel has placed them all), kept as the torch
    step keeps them; the rest of the step is the same code."""
    v_free, L, phi_all, rows_all = stage[:4]
    B = q.shape[0]
    n = plan.name
    qs, vs = {n: q}, {n: v}  # the scene's one model
    kept = None
    if replay is not None:
        _, _, kept = _replayed(replay)
        balls = [plan.index[k] for k in replay if not isinstance(k[0], str) and k[1] == -1]
    else:  # a mask only: each contact point's speed, |rows v_free| (rows orthonormal); numpy: see _limit_rows
        speed = np.linalg.norm(np.einsum("bkjn,bn->bkj", rows_all.detach().numpy(), v_free.detach().numpy()), axis=-1)
        with np.errstate(invalid="ignore"):
            balls = np.flatnonzero((phi_all.detach().numpy() < 2e-3 + 2.0 * dt * speed).any(0)).tolist()
    rows, phis, mus, es, keys = [], [], [], [], []
    sel = None
    if balls:
        key = tuple(balls)
        sel = plan.sel.get(key)
        if sel is None:
            if len(plan.sel) >= 1024:  # contact sets seen: a robot with many balls meets many (bounded memory)
                plan.sel.clear()
            sel = plan.sel[key] = torch.tensor(balls, dtype=torch.long, device=q.device)
        rows.append(rows_all[:, sel])
        phis.append(phi_all[:, sel])
        mu, e = ground_coefficients(scene, plan, sel, balls, B, q)
        mus.append(mu)
        es.append(e)
        keys.extend(plan.keys[b] for b in balls)
    lim = scene.models[n].joint_limits()
    if scene.limits and has_limits(plan, lim["lower"], lim["upper"]):
        _limit_rows(scene, qs, vs, dt, kept, rows, phis, mus, es, keys, B, q)
    update = velocity_update
    if stage.by_hand and rows:  # the stage has no graph: one node differentiates it with the update
        update = ground_velocity_update(stage, plan, sel if sel is not None else _NO_BALLS)
    elif stage.by_hand:  # no row: the stage's own node
        stage = with_graph(scene, plan, stage)
        v_free, L = stage.v_free, stage.L
    return _finish(scene, qs, v, v_free, {n: v_free}, {n: L}, [], rows, phis, mus, es, keys, dt, info, warm, replay,
                   update, lambda qs_, vs_: ground_advance(scene, plan, qs_[n], vs_[n], dt))
