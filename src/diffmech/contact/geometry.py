"""Narrow phase: signed distances, contact points and normals between primitive shapes, batched.

Every function takes world placements (``R (B, 3, 3)``, ``p (B, 3)``) and sizes -- tuples of floats,
or 1-D tensors (the shape's dimensions, see :mod:`diffmech.model.collision`) when the distances
must be differentiable w.r.t. the geometry -- and
returns a :class:`Candidates` of ``k`` fixed candidate points per batch element: the signed
distance ``phi (B, k)`` (m, negative in penetration), the contact point ``point (B, k, 3)`` (world,
halfway between the two surfaces) and the unit normal ``normal (B, k, 3)`` pointing from the
second shape to the first (the first shape is pushed along ``+normal``). The candidate set of a
pair is fixed (box: its 8 corners; capsule: its two end spheres and the closest pair of axis
points), so everything is differentiable w.r.t. the poses while the set of touching candidates
stays the same; the solver gives zero force to candidates that do not touch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["Candidates", "plane_candidates", "plane_candidates_many", "sphere_sphere",
           "sphere_box", "sphere_capsule", "capsule_capsule", "capsule_box",
           "box_box", "point_box", "closest_points_segments"]

_EPS = 1e-12


class Candidates(NamedTuple):
    phi: Tensor  # (B, k)
    point: Tensor  # (B, k, 3)
    normal: Tensor  # (B, k, 3)


def _unit(x: Tensor) -> tuple[Tensor, Tensor]:
    n = x.norm(dim=-1, keepdim=True)
    return x / n.clamp_min(_EPS), n[..., 0]


def _vec(size, like: Tensor) -> Tensor:
    """A shape's dimensions as a tensor on ``like``'s dtype and device (a tensor stays in the graph)."""
    if isinstance(size, Tensor):
        return size.to(dtype=like.dtype, device=like.device)
    return torch.tensor(size, dtype=like.dtype, device=like.device)


def _corners(R: Tensor, p: Tensor, size) -> Tensor:
    """The 8 corners of a box, ``(B, 8, 3)``."""
    s = torch.tensor([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)], dtype=p.dtype,
                     device=p.device) * _vec(size, p) * 0.5
    return p[:, None] + s @ R.transpose(-1, -2)


def _segment(R: Tensor, p: Tensor, length: float) -> tuple[Tensor, Tensor]:
    half = 0.5 * length * R[..., :, 2]
    return p - half, p + half


def plane_candidates(kind: str, size, R: Tensor, p: Tensor) -> Candidates:
    """A shape against the ground plane ``z = 0`` (normal ``+z``): sphere 1 candidate, capsule 2
    (end spheres), box 8 (corners), cylinder 16 (8 points on each end rim)."""
    ez = torch.zeros_like(p)
    ez[..., 2] = 1.0
    if kind == "sphere":
        pts, r = p[:, None], size[0]
    elif kind == "capsule":
        a, b = _segment(R, p, size[1])
        pts, r = torch.stack([a, b], dim=1), size[0]
    elif kind == "box":
        pts, r = _corners(R, p, size), 0.0
    elif kind == "cylinder":
        ang = torch.arange(8, dtype=p.dtype, device=p.device) * (torch.pi / 4)
        ring = size[0] * (torch.cos(ang)[:, None] * R[:, None, :, 0] + torch.sin(ang)[:, None] * R[:, None, :, 1])
        a, b = _segment(R, p, size[1])
        pts, r = torch.cat([a[:, None] + ring, b[:, None] + ring], dim=1), 0.0
    else:
        raise ValueError(kind)
    phi = pts[..., 2] - r
    point = pts - (r + 0.5 * phi)[..., None] * ez[:, None]
    return Candidates(phi, point, ez[:, None].expand_as(pts))


def plane_candidates_many(kind: str, sizes: list, R: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
    """:func:`plane_candidates` of ``S`` spheres or capsules at once: ``R (B, S, 3, 3)``, ``p (B, S, 3)``,
    ``sizes`` one per shape (tuples of floats or tensors). Returns ``phi (B, S k)`` and ``point (B, S k, 3)``,
    shape by shape in the order of :func:`plane_candidates` (``k`` = 1 for a sphere, 2 for a capsule; the
    normal is ``+z`` for all)."""
    if kind not in ("sphere", "capsule"):
        raise ValueError(kind)
    if any(isinstance(z, Tensor) for z in sizes):
        dims = torch.stack([_vec(z, p) for z in sizes])
    else:
        dims = torch.tensor(sizes, dtype=p.dtype, device=p.device)  # (S, 1 or 2)
    if kind == "sphere":
        pts, r = p, dims[:, 0]
    else:  # the two end spheres
        half = (0.5 * dims[:, 1, None]) * R[..., :, 2]
        pts = torch.stack([p - half, p + half], 2).flatten(1, 2)
        r = dims[:, 0].repeat_interleave(2)
    phi = pts[..., 2] - r
    ez = torch.zeros(3, dtype=p.dtype, device=p.device)
    ez[2] = 1.0
    return phi, pts - (r + 0.5 * phi)[..., None] * ez


def _spheres(ca: Tensor, ra: float, cb: Tensor, rb: float) -> Candidates:
    """Spheres centred at ``ca (B, k, 3)`` and ``cb`` (normal from b to a)."""
    n, dist = _unit(ca - cb)
    phi = dist - ra - rb
    point = cb + (rb + 0.5 * phi)[..., None] * n
    return Candidates(phi, point, n)


def sphere_sphere(pa: Tensor, ra: float, pb: Tensor, rb: float) -> Candidates:
    return _spheres(pa[:, None], ra, pb[:, None], rb)


def _closest_on_segment(x: Tensor, a: Tensor, b: Tensor) -> Tensor:
    d = b - a
    t = (((x - a) * d).sum(-1) / (d * d).sum(-1).clamp_min(_EPS)).clamp(0.0, 1.0)
    return a + t[..., None] * d


def closest_points_segments(p1: Tensor, q1: Tensor, p2: Tensor, q2: Tensor) -> tuple[Tensor, Tensor]:
    """Closest points of segments ``[p1, q1]`` and ``[p2, q2]`` (``(..., 3)`` each)."""
    d1, d2, r = q1 - p1, q2 - p2, p1 - p2
    a, e = (d1 * d1).sum(-1).clamp_min(_EPS), (d2 * d2).sum(-1).clamp_min(_EPS)
    b, c, f = (d1 * d2).sum(-1), (d1 * r).sum(-1), (d2 * r).sum(-1)
    den = a * e - b * b
    s = torch.where(den > 1e-12 * a * e, ((b * f - c * e) / den.clamp_min(_EPS)).clamp(0, 1), torch.zeros_like(den))
    t = (b * s + f) / e
    s = torch.where(t < 0, (-c / a).clamp(0, 1), torch.where(t > 1, ((b - c) / a).clamp(0, 1), s))
    t = t.clamp(0, 1)
    return p1 + s[..., None] * d1, p2 + t[..., None] * d2


def sphere_capsule(pa: Tensor, ra: float, R: Tensor, p: Tensor, size) -> Candidates:
    a, b = _segment(R, p, size[1])
    c = _closest_on_segment(pa, a, b)
    return _spheres(pa[:, None], ra, c[:, None], size[0])


def capsule_capsule(Ra: Tensor, pa: Tensor, sa, Rb: Tensor, pb: Tensor, sb) -> Candidates:
    """Five candidates: the closest pair of axis points and each end sphere against the other axis
    (so that two capsules lying side by side touch along a line, not at one wobbling point)."""
    a0, a1 = _segment(Ra, pa, sa[1])
    b0, b1 = _segment(Rb, pb, sb[1])
    ca, cb = closest_points_segments(a0, a1, b0, b1)
    ends_a = torch.stack([a0, a1], 1)
    ends_b = torch.stack([b0, b1], 1)
    on_b = _closest_on_segment(ends_a, b0[:, None], b1[:, None])
    on_a = _closest_on_segment(ends_b, a0[:, None], a1[:, None])
    A = torch.cat([ca[:, None], ends_a, on_a], 1)
    B = torch.cat([cb[:, None], on_b, ends_b], 1)
    return _spheres(A, sa[0], B, sb[0])


def point_box(x: Tensor, R: Tensor, p: Tensor, size) -> tuple[Tensor, Tensor]:
    """Signed distance of points ``x (B, k, 3)`` to a box (negative inside) and the unit normal of
    the box surface nearest to each point (pointing out of the box, towards the point)."""
    h = _vec(size, x) * 0.5
    loc = ((x - p[:, None]) @ R)  # box coordinates
    q = loc.abs() - h
    outside = q.clamp_min(0.0)
    d_out = outside.norm(dim=-1)
    n_out = (loc - loc.clamp(-h, h)) / d_out[..., None].clamp_min(_EPS)
    qmax, axis = q.max(dim=-1)
    n_in = torch.nn.functional.one_hot(axis, 3).to(x.dtype) * torch.sign(loc).where(loc != 0, torch.ones_like(loc))
    is_out = d_out > 1e-12
    phi = torch.where(is_out, d_out, qmax.clamp_max(0.0))
    n_loc = torch.where(is_out[..., None], n_out, n_in)
    return phi, n_loc @ R.transpose(-1, -2)


def sphere_box(pa: Tensor, ra: float, R: Tensor, p: Tensor, size) -> Candidates:
    phi, n = point_box(pa[:, None], R, p, size)
    phi = phi - ra
    point = pa[:, None] - (ra + 0.5 * phi)[..., None] * n
    return Candidates(phi, point, n)


def _segment_box_argmin(a: Tensor, b: Tensor, R: Tensor, p: Tensor, size) -> Tensor:
    """The parameter ``t (B,)`` in [0, 1] of the point of segment ``[a, b]`` with the least signed
    distance to the box (exactly, up to rounding). Along the segment the box's signed distance is
    convex and piecewise simple: outside the box its square is a quadratic between the points where
    the segment crosses a face plane ``loc_i = +-h_i``, inside it is ``max_i |loc_i| - h_i``, linear
    between the points where two of those terms are equal or a ``loc_i`` is zero. The minimum is at
    one of those points, at an end, or at the vertex of one of the quadratics: all are evaluated and
    the least kept. Each candidate ``t`` is a differentiable closed form of the poses (the discrete
    choices -- signs, which axes are outside -- are made without the graph), as ``t`` of
    :func:`_closest_on_segment` is."""
    h = _vec(size, a) * 0.5
    la = ((a - p)[:, None] @ R)[:, 0]  # box coordinates (B, 3)
    lb = ((b - p)[:, None] @ R)[:, 0]
    d = lb - la

    def solve(num: Tensor, den: Tensor) -> Tensor:  # num / den where den is not ~0 (no inf/nan gradients)
        ok = den.abs() > 1e-12
        return torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), torch.zeros_like(num)).clamp(0, 1)

    ones = torch.ones_like(d[:, :1])
    ts = [ones * 0.0, ones]
    cross = torch.cat([solve(h - la, d), solve(-h - la, d)], 1)  # face planes, (B, 6)
    ts += [cross, solve(-la, d)]  # and the centre planes loc_i = 0 (kinks of |loc_i|)
    for i, j in ((0, 1), (0, 2), (1, 2)):  # s_i loc_i - h_i = s_j loc_j - h_j
        for si in (1.0, -1.0):
            for sj in (1.0, -1.0):
                num = h[..., i] - h[..., j] - si * la[:, i] + sj * la[:, j]
                ts.append(solve(num, si * d[:, i] - sj * d[:, j])[:, None])
    # outside: between consecutive face-plane crossings the squared distance is
    # sum over the axes outside the slab of (loc_i - s_i h_i)^2, least at -sum a_i d_i / sum d_i^2
    brk = torch.sort(torch.cat([ts[0], ts[1], cross], 1), dim=1).values  # (B, 8)
    lo, hi = brk[:, :-1], brk[:, 1:]
    with torch.no_grad():
        mid = la[:, None] + (0.5 * (lo + hi))[..., None] * d[:, None]  # (B, 7, 3)
        out = (mid.abs() > h).to(a.dtype)
        sgn = torch.where(mid < 0, -1.0, 1.0).to(a.dtype)
    off = la[:, None] - sgn * h
    num = -(out * off * d[:, None]).sum(-1)
    den = (out * d[:, None] ** 2).sum(-1)
    ok = den > 1e-24
    vertex = torch.where(ok, num / torch.where(ok, den, torch.ones_like(den)), lo)
    ts.append(torch.minimum(torch.maximum(vertex, lo), hi))
    # the axis point nearest the box centre: the one kept where several are nearest (a capsule lying
    # flat on a face), so that it does not coincide with an end candidate (duplicated contact rows
    # make the contact problem singular); the distance it gives is then within rounding (64 eps
    # times the box's size) of the least
    centre = solve(-(la * d).sum(-1, keepdim=True), (d * d).sum(-1, keepdim=True))
    t = torch.cat([centre] + ts, 1)  # (B, 31)
    with torch.no_grad():
        x = a[:, None] + t[..., None] * (b - a)[:, None]
        phi = point_box(x, R, p, size)[0]
        near = phi <= phi.min(1, keepdim=True).values + 64 * torch.finfo(phi.dtype).eps * (1.0 + h.max())
        best = torch.where(near, (t - centre).abs(), torch.full_like(t, 2.0)).argmin(1)
    return t.gather(1, best[:, None])[:, 0]


def capsule_box(Ra: Tensor, pa: Tensor, sa, R: Tensor, p: Tensor, size) -> Candidates:
    """The capsule's two end spheres and its axis point nearest the box (least signed distance),
    against the box."""
    a, b = _segment(Ra, pa, sa[1])
    # Fix (issue 34): the third candidate was the axis point nearest the box *centre*, which is not
    # the axis point nearest the box's surface: a capsule across a box's edge or corner went up to
    # 6 cm (capsule 0.05 x 0.3) into the box with no candidate seeing it (tests/test_geometry_coal.py).
    t = _segment_box_argmin(a, b, R, p, size)
    c = torch.stack([a, b, a + t[:, None] * (b - a)], 1)
    phi, n = point_box(c, R, p, size)
    phi = phi - sa[0]
    return Candidates(phi, c - (sa[0] + 0.5 * phi)[..., None] * n, n)


def _half_extent(R: Tensor, size, n: Tensor) -> Tensor:
    """Half the width of a box along unit directions ``n (B, ..., 3)``."""
    h = _vec(size, n) * 0.5
    shape = n.shape
    Rb = R.reshape(R.shape[0], *([1] * (n.dim() - 2)), 3, 3)
    return ((n[..., None, :] @ Rb)[..., 0, :].abs() * h).sum(-1).reshape(shape[:-1])


def box_box(Ra: Tensor, pa: Tensor, sa, Rb: Tensor, pb: Tensor, sb) -> Candidates:
    """Box against box (16 candidates, normal from b to a): the contact normal is the face axis of
    either box with the least penetration (separating-axis test over the six face axes); the
    candidates are each box's corners, their distance measured along that normal to the other
    box's supporting face, and a corner whose footprint on that face falls outside the other box
    is no candidate (its distance is set to 1 km). Face-face, face-edge and face-corner contacts
    (resting, stacked, tipping boxes) are covered; edge-edge crossings are not. A corner of b
    that coincides with a candidate corner of a is dropped (one contact, not two)."""
    d = pa - pb
    axes = torch.cat([Ra.transpose(-1, -2), Rb.transpose(-1, -2)], 1)  # (B, 6, 3) rows = face axes
    proj = (axes * d[:, None]).sum(-1)
    axes = axes * torch.where(proj < 0, -1.0, 1.0)[..., None]
    sep = proj.abs() - _half_extent(Ra, sa, axes) - _half_extent(Rb, sb, axes)
    n = torch.gather(axes, 1, sep.argmax(1)[:, None, None].expand(-1, 1, 3))[:, 0]  # (B, 3)
    top_b = (n * pb).sum(-1) + _half_extent(Rb, sb, n[:, None])[:, 0]
    low_a = (n * pa).sum(-1) - _half_extent(Ra, sa, n[:, None])[:, 0]
    ca, cb = _corners(Ra, pa, sa), _corners(Rb, pb, sb)
    phi_a = (ca * n[:, None]).sum(-1) - top_b[:, None]
    phi_b = low_a[:, None] - (cb * n[:, None]).sum(-1)
    largest = max(float(x) for x in (*sa, *sb))
    tol = 1e-3 * largest
    with torch.no_grad():
        in_b = point_box(ca - phi_a[..., None] * n[:, None], Rb, pb, sb)[0] <= tol
        in_a = point_box(cb + phi_b[..., None] * n[:, None], Ra, pa, sa)[0] <= tol
        # a corner of b that meets a corner of a (aligned faces) is the same contact: keep one,
        # since duplicated rows make the contact problem singular and slow the solver
        same = (torch.cdist(cb, ca) <= 1e-6 * largest + tol) & in_b[:, None, :]
        in_a = in_a & ~same.any(-1)
    far = torch.full_like(phi_a, 1e3)
    phi = torch.cat([torch.where(in_b, phi_a, far), torch.where(in_a, phi_b, far)], 1)
    point = torch.cat([ca - 0.5 * phi_a[..., None] * n[:, None], cb + 0.5 * phi_b[..., None] * n[:, None]], 1)
    return Candidates(phi, point, n[:, None].expand(-1, 16, 3))
