"""Narrow phase: signed distances, contact points and normals between primitive shapes, batched.

Every function takes world placements (``R (B, 3, 3)``, ``p (B, 3)``) and sizes -- tuples of floats,
or 1-D tensors (the shape's dimensions, see :mod:`diffmech.model.collision`) when the distances
must be differentiable w.r.t. the geometry -- and
returns a :class:`Candidates` of ``k`` fixed candidate points per batch element: the signed
distance ``phi (B, k)`` (m, negative in penetration), the contact point ``point (B, k, 3)`` (world,
halfway between the two surfaces) and the unit normal ``normal (B, k, 3)`` pointing from the
second shape to the first (the first shape is pushed along ``+normal``). The number of candidates
of a pair is fixed (box on the ground: its 8 corners; capsule: its two end spheres and the closest
pair of axis points; box on box: the 8 slots of a clipped contact polygon), so everything is
differentiable w.r.t. the poses while the set of touching candidates stays the same; the solver
gives zero force to candidates that do not touch, and a slot a pose does not use has ``phi`` = 1 km.
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


def _largest(*sizes) -> float:
    """The largest dimension of some shapes (a scale for tolerances; no gradient flows through it)."""
    return max(float(x.detach() if isinstance(x, Tensor) else x) for size in sizes for x in size)


def _col(R: Tensor, k: Tensor) -> Tensor:
    """Column ``k (B,)`` of ``R (B, 3, 3)`` (a box's axis in the world), ``(B, 3)``."""
    return R.gather(2, k[:, None, None].expand(-1, 3, 1))[..., 0]


def _at(h: Tensor, k: Tensor) -> Tensor:
    """Entry ``k (B,)`` of each row of ``h (B, 3)``, ``(B,)``."""
    return h.gather(1, k[:, None])[:, 0]


def _sign(x: Tensor) -> Tensor:
    """+-1, +1 at zero (a side must be picked even where both are equally good)."""
    return torch.where(x < 0, -1.0, 1.0).to(x.dtype)


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
    """Five candidates against the box: the capsule's two end spheres, its axis point nearest the
    box (least signed distance), and the ends of the axis clipped to the side planes of the box
    face that point faces (so that a capsule lying across a face narrower than it, both ends
    overhanging, rests on the face's two edges, not on one point it rocks about). A clipped end
    that is no clipping (the segment's end is over the face: the end sphere is that candidate) or
    within 1e-6 of the size of the nearest axis point is unused (``phi`` = 1 km)."""
    a, b = _segment(Ra, pa, sa[1])
    # Fix (issue 34): the third candidate was the axis point nearest the box *centre*, which is not
    # the axis point nearest the box's surface: a capsule across a box's edge or corner went up to
    # 6 cm (capsule 0.05 x 0.3) into the box with no candidate seeing it (tests/test_geometry_coal.py).
    t = _segment_box_argmin(a, b, R, p, size)
    c = torch.stack([a, b, a + t[:, None] * (b - a)], 1)
    phi, n = point_box(c, R, p, size)
    phi = phi - sa[0]
    face, s = _nearest_face(c[:, 2], R, p, size)
    tc, valid = _segment_face_clip(a, b, t, face, R, p, size)
    # unused parameters may be +-1e30 (no side plane crosses the segment): kept on the segment so
    # that every point stays finite in the broad phase's arithmetic, float32 included
    x = a[:, None] + tc.clamp(0.0, 1.0)[..., None] * (b - a)[:, None]  # (B, 2, 3)
    # measured along the face's normal: exact where the axis is above the face (the clipped point
    # is over it), and a depth along the normal, not to a side face, where it dips below
    nf = s[:, None] * _col(R, face)
    hf = _at((_vec(size, a) * 0.5).expand(a.shape[0], 3), face)
    phi_c = ((x - p[:, None]) * nf[:, None]).sum(-1) - hf[:, None] - sa[0]
    phi = torch.cat([phi, phi_c], 1)
    n = torch.cat([n, nf[:, None].expand(-1, 2, 3)], 1)
    point = torch.cat([c, x], 1) - (sa[0] + 0.5 * phi)[..., None] * n
    phi = torch.cat([phi[:, :3], torch.where(valid, phi_c, torch.full_like(phi_c, 1e3))], 1)
    return Candidates(phi, point, n)


def _nearest_face(x: Tensor, R: Tensor, p: Tensor, size) -> tuple[Tensor, Tensor]:
    """The face of the box a point ``x (B, 3)`` is furthest out of (or least deep below): its axis
    ``(B,)`` and side ``(B,)`` (+-1), chosen without the graph."""
    with torch.no_grad():
        loc = ((x - p)[:, None] @ R)[:, 0]
        face = (loc.abs() - _vec(size, x).detach() * 0.5).argmax(1)
        return face, _sign(loc.gather(1, face[:, None])[:, 0])


def _segment_face_clip(a: Tensor, b: Tensor, t: Tensor, face: Tensor, R: Tensor, p: Tensor,
                       size) -> tuple[Tensor, Tensor]:
    """The parameters ``(B, 2)`` where segment ``[a, b]`` enters and leaves the slab of the box's
    face with axis ``face (B,)`` (the face's side planes; the face plane itself not), and
    whether each is a candidate: strictly inside the segment (an end is a candidate already), the
    entry before the exit, and not within 1e-6 of the box's size of the point at ``t`` (or of each
    other): near-duplicated contact rows only slow the solver. Each parameter is a closed form of
    the poses (which plane clips is chosen without the graph)."""
    B = a.shape[0]
    h = (_vec(size, a) * 0.5).expand(B, 3)
    la = ((a - p)[:, None] @ R)[:, 0]
    d = ((b - a)[:, None] @ R)[:, 0]
    with torch.no_grad():
        normal_axis = torch.nn.functional.one_hot(face, 3).bool()
        parallel = d.abs() <= 1e-12  # to a side plane: that plane does not clip
        free = normal_axis | parallel
    den = torch.where(free, torch.ones_like(d), d)
    r1, r2 = (-h - la) / den, (h - la) / den
    big = torch.full_like(d, 1e30)
    lo = torch.where(free, -big, torch.minimum(r1, r2)).max(1).values
    hi = torch.where(free, big, torch.maximum(r1, r2)).min(1).values
    tc = torch.stack([lo, hi], 1)
    with torch.no_grad():
        # ... unless the segment lies outside it: then it never enters the slab
        outside = (parallel & ~normal_axis & (la.abs() > h)).any(1)
        length = (b - a).norm(dim=-1)
        gap = 1e-6 * _largest(size) / length.clamp_min(1e-30)
        valid = (tc > 0) & (tc < 1) & (lo < hi)[:, None] & ~outside[:, None]
        valid &= (tc - t[:, None]).abs() > gap[:, None]
        valid[:, 1] &= (hi - lo) > gap
    return tc, valid


def _clip_half(poly: Tensor, count: Tensor, axis: int, s: float, bound: Tensor) -> tuple[Tensor, Tensor]:
    """One step of Sutherland-Hodgman: the convex polygon ``poly (B, M, 3)`` (its first ``count``
    vertices, in order) cut by the half-space ``s x[axis] <= bound``, as ``(B, M + 1, 3)`` and its
    new count. Fixed size so that a batch is clipped at once: each vertex contributes itself if
    inside and the crossing of its outgoing edge if that edge changes sides, then the kept slots are
    moved to the front in polygon order. Which slots are kept is decided without the graph; a
    crossing is a closed form of its edge's end points, so the clipped polygon is differentiable
    where no vertex sits on the boundary."""
    B, M, _ = poly.shape
    slot = torch.arange(M, device=poly.device)
    nxt = torch.where(slot + 1 < count[:, None], slot + 1, 0)
    nxt_v = poly.gather(1, nxt[..., None].expand(-1, -1, 3))
    dp = s * poly[..., axis] - bound[:, None]
    dq = s * nxt_v[..., axis] - bound[:, None]
    with torch.no_grad():
        valid = slot < count[:, None]
        keep = valid & (dp <= 0)
        # strictly on both sides: a vertex on the boundary is kept and makes no second point there
        cross = valid & (((dp < 0) & (dq > 0)) | ((dp > 0) & (dq < 0)))
    den = torch.where(cross, dp - dq, torch.ones_like(dp))
    t = torch.where(cross, dp / den, torch.zeros_like(dp))
    out = torch.stack([poly, poly + t[..., None] * (nxt_v - poly)], 2).reshape(B, 2 * M, 3)
    with torch.no_grad():
        ok = torch.stack([keep, cross], 2).reshape(B, 2 * M)
        order = torch.sort((~ok).to(torch.int8), dim=1, stable=True).indices[:, :M + 1]
        # a convex polygon gains at most one vertex per cut (the clamp guards against rounding)
        count = ok.sum(1).clamp_max(M + 1)
    return out.gather(1, order[..., None].expand(-1, -1, 3)), count


def _box_face_contacts(Rr, pr, hr, k, n_out, Ri, pi, hi, tol: float, merge: float) -> tuple[Tensor, Tensor, Tensor]:
    """The contact polygon of a reference face (box ``Rr, pr, hr``, face axis ``k (B,)``, outward
    unit normal ``n_out (B, 3)`` towards the other box) and the incident face of box ``Ri, pi, hi``
    (the face most opposed to ``n_out``): the incident face clipped to the reference face's side
    planes (widened by ``tol``, so that a vertex on a side -- equal boxes stacked -- is one point,
    not a vertex and a crossing a rounding error apart). Returns, per clipped vertex (8 slots),
    its height ``w (B, 8)`` above the reference face's plane, its world point projected halfway to
    that plane ``(B, 8, 3)`` and a validity mask; vertices within ``merge`` of the previous one are
    invalid (near-duplicated contact rows only slow the solver)."""
    B = pr.shape[0]
    k1, k2 = (k + 1) % 3, (k + 2) % 3
    t1, t2 = _col(Rr, k1), _col(Rr, k2)
    c_ref = pr + _at(hr, k)[:, None] * n_out
    with torch.no_grad():
        dots = (n_out[:, None] @ Ri)[:, 0]  # (B, 3)
        m = dots.abs().argmax(1)
        sm = -_sign(dots.gather(1, m[:, None])[:, 0])
    m1, m2 = (m + 1) % 3, (m + 2) % 3
    c_inc = pi + (sm * _at(hi, m))[:, None] * _col(Ri, m)
    e1, e2 = _at(hi, m1)[:, None] * _col(Ri, m1), _at(hi, m2)[:, None] * _col(Ri, m2)
    verts = torch.stack([c_inc + e1 + e2, c_inc - e1 + e2, c_inc - e1 - e2, c_inc + e1 - e2], 1)
    frame = torch.stack([t1, t2, n_out], -1)  # columns: the reference face's (u, v, w) axes
    poly = (verts - c_ref[:, None]) @ frame
    count = torch.full((B,), 4, dtype=torch.long, device=pr.device)
    lims = torch.stack([_at(hr, k1), _at(hr, k2)], 1) + tol
    # the common resting case (a smaller box on a larger one, stacked equal boxes): the incident
    # face inside the reference face needs no clipping; one test instead of four cuts
    if not bool((poly[..., :2].detach().abs() <= lims[:, None].detach()).all()):
        for axis in (0, 1):
            for s in (1.0, -1.0):
                poly, count = _clip_half(poly, count, axis, s, lims[:, axis])
    with torch.no_grad():
        slot = torch.arange(poly.shape[1], device=pr.device)
        valid = slot < count[:, None]
        last = (count - 1).clamp_min(0)
        gap_prev = (poly[:, 1:] - poly[:, :-1]).norm(dim=-1) < merge
        gap_first = (poly.gather(1, last[:, None, None].expand(-1, 1, 3))[:, 0] - poly[:, 0]).norm(dim=-1) < merge
        drop = torch.cat([torch.zeros_like(gap_prev[:, :1]), gap_prev], 1)
        drop = drop | ((slot == last[:, None]) & (gap_first & (last > 0))[:, None])
        valid = valid & ~drop
    u, v, w = poly.unbind(-1)
    point = (c_ref[:, None] + u[..., None] * t1[:, None] + v[..., None] * t2[:, None]
             + 0.5 * w[..., None] * n_out[:, None])
    return w, point, valid


def box_box(Ra: Tensor, pa: Tensor, sa, Rb: Tensor, pb: Tensor, sb) -> Candidates:
    """Box against box (8 candidates, normal from b to a), as established engines do it: a
    separating-axis test over the 15 axes (each box's 3 face normals and the 9 cross products of an
    edge of a with an edge of b) picks the axis of least penetration (greatest separation).

    * A face axis: the face of the other box most opposed to it (the incident face) is clipped to
      the side planes of the axis's face (the reference face), Sutherland-Hodgman; the clipped
      polygon's vertices (at most 8: corners of either face and crossings of their outlines) are
      the candidates, each at its distance along the normal to the reference face's plane
      (negative below it). Face-face, face-edge and face-corner contacts, a cube on a cube turned
      45 degrees (an octagon of outline crossings) included.
    * An edge axis, better than every face axis by more than rounding: one candidate, the closest
      points of the two edges, at their separation along the axis.

    Slots not used (clipped away, merged with a neighbour, or 1..7 for an edge contact) have
    ``phi`` = 1 km, so the solver never sees them. Separated boxes get the same candidates with
    ``phi > 0`` (speculative contacts); where no face axis separates them and their outlines do not
    overlap along it (a corner next to a corner) there is none. The discrete choices (axis, faces,
    clipping) are made without the graph; each candidate is a closed form of the poses and sizes."""
    B = pa.shape[0]
    ha = (_vec(sa, pa) * 0.5).expand(B, 3)
    hb = (_vec(sb, pb) * 0.5).expand(B, 3)
    scale = _largest(sa, sb)
    eps = torch.finfo(pa.dtype).eps
    # an edge axis along a face axis (boxes turned about a common axis: a's x cross b's x is the
    # common z) separates exactly as far as that face: rounding must not pick the edge, nor flip
    # between the two boxes' faces when they are parallel (b's face is the reference then)
    tie = 64 * eps * scale
    d = pa - pb
    with torch.no_grad():
        A, Bx, dd, had, hbd = Ra.detach(), Rb.detach(), d.detach(), ha.detach(), hb.detach()
        faces = torch.cat([A.transpose(-1, -2), Bx.transpose(-1, -2)], 1)  # (B, 6, 3)
        cr = torch.linalg.cross(A.transpose(-1, -2)[:, :, None], Bx.transpose(-1, -2)[:, None], dim=-1).reshape(B, 9, 3)
        crn = cr.norm(dim=-1)
        ok = crn > eps ** 0.5  # parallel edges: their plane's normal is a face axis, tested already
        axes = torch.cat([faces, cr / torch.where(ok, crn, torch.ones_like(crn))[..., None]], 1)
        sep = ((axes @ dd[:, :, None])[..., 0].abs() - ((axes @ A).abs() * had[:, None]).sum(-1)
               - ((axes @ Bx).abs() * hbd[:, None]).sum(-1))
        sep_a, ka = sep[:, :3].max(1)
        sep_b, kb = sep[:, 3:6].max(1)
        sep_e, ke = sep[:, 6:].masked_fill(~ok, -torch.inf).max(1)
        ref_a = sep_a > sep_b + tie
        use_edge = sep_e > torch.maximum(sep_a, sep_b) + tie
        k = torch.where(ref_a, ka, kb)
        axis = torch.where(ref_a[:, None], _col(A, ka), _col(Bx, kb))
        # the reference face's outward normal points to the other box
        side = _sign((axis * dd).sum(-1)) * torch.where(ref_a, -1.0, 1.0).to(pa.dtype)
    sel = ref_a[:, None]
    Rr, Ri = torch.where(sel[..., None], Ra, Rb), torch.where(sel[..., None], Rb, Ra)
    pr, pi = torch.where(sel, pa, pb), torch.where(sel, pb, pa)
    hr, hi = torch.where(sel, ha, hb), torch.where(sel, hb, ha)
    n_out = side[:, None] * _col(Rr, k)
    # the reference face widened by 1e-9 of the size (or rounding, in float32): equal boxes stacked
    # and drifting by rounding keep their 4 corners, unclipped
    w, point, valid = _box_face_contacts(Rr, pr, hr, k, n_out, Ri, pi, hi, tol=max(tie, 1e-9 * scale),
                                         merge=1e-6 * scale)
    far = torch.full_like(w, 1e3)
    phi = torch.where(valid, w, far)
    normal = torch.where(sel, -n_out, n_out)[:, None].expand(-1, w.shape[1], 3)

    # edge against edge: the pair of edges (one of a along axis i, one of b along axis j) that
    # support the two boxes along u = a_i x b_j, and their closest points
    if not bool(use_edge.any()):  # most calls: no edge contact in the batch, nothing to compute
        return Candidates(phi, point, normal)
    i, j = ke // 3, ke % 3
    Ai, Bj = _col(Ra, i), _col(Rb, j)
    c = torch.linalg.cross(Ai, Bj, dim=-1)
    # the environments that do not use it get a unit denominator: a zero cross product there must
    # not put a 0/0 into the graph
    u = c / ((c * c).sum(-1) + (~use_edge).to(c.dtype)).sqrt()[:, None]
    with torch.no_grad():
        su = _sign((u * d).sum(-1))
        ud = (u * su[:, None])[:, None]
        ga = torch.where(torch.nn.functional.one_hot(i, 3).bool(), 0.0, -_sign((ud @ A)[:, 0])).to(pa.dtype)
        gb = torch.where(torch.nn.functional.one_hot(j, 3).bool(), 0.0, _sign((ud @ Bx)[:, 0])).to(pa.dtype)
    u = u * su[:, None]
    ea = pa + (Ra @ (ga * ha)[..., None])[..., 0]  # the middle of a's supporting edge along -u
    eb = pb + (Rb @ (gb * hb)[..., None])[..., 0]  # and of b's along +u
    la, lb = _at(ha, i)[:, None] * Ai, _at(hb, j)[:, None] * Bj
    xa, xb = closest_points_segments(ea - la, ea + la, eb - lb, eb + lb)
    # every point of a's edge is at a's support along u (the edge is perpendicular to u): the
    # separation along u, whether or not the closest points are inside the edges
    phi_e = ((xa - xb) * u).sum(-1)
    e = use_edge[:, None]
    phi = torch.where(e, torch.cat([phi_e[:, None], far[:, 1:]], 1), phi)
    point = torch.where(e[..., None], torch.cat([(0.5 * (xa + xb))[:, None], point[:, 1:]], 1), point)
    normal = torch.where(e[..., None], u[:, None].expand_as(normal), normal)
    return Candidates(phi, point, normal)
