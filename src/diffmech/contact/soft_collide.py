"""MuJoCo's narrow phase on batches: the contacts ``mj_collision`` puts in ``d.contact``.

:func:`collide` takes the world poses of a :class:`~diffmech.contact.soft_geoms.GeomTable`'s geoms
and returns, for every pair the table lets collide, a fixed number of contact slots (the most
contacts MuJoCo's function for that pair type makes), each with MuJoCo's position (mid-way between
the two surfaces), frame (normal from geom1 to geom2, tangents as ``mju_makeFrame`` completes them),
signed distance and the pair's mixed parameters (``mj_contactParam``). A slot is ``found`` where
MuJoCo's function reports that contact (distance within ``margin + gap``) and ``active`` where
MuJoCo keeps it in the constraint problem (``dist < includemargin``, ``includemargin`` the sum of the
two geoms' margins, as MuJoCo 4 sets it).

Pair types (MuJoCo's functions, as MuJoCo 4.0 computes them): plane-sphere, plane-capsule,
plane-box, plane-cylinder, sphere-sphere, sphere-capsule, sphere-cylinder, sphere-box,
capsule-capsule, capsule-box, box-box. Pairs MuJoCo hands to its general convex collider
(``mjc_Convex``: ellipsoids, meshes, capsule-cylinder, cylinder-cylinder, cylinder-box) and height
fields are refused when the table is built (``ModelError`` naming the two geoms). Every value is
differentiable in the geoms' poses where MuJoCo's function is smooth (the branch taken -- face,
edge, clipped vertex -- is fixed by the forward values).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from ..errors import ShapeError
from .soft_geoms import (
    BOX,
    CAPSULE,
    CYLINDER,
    PAIR_TYPES,
    PLANE,
    SPHERE,
    GeomTable,
    check_pairs,
)

__all__ = ["SoftContacts", "collide", "contact_parameters", "make_frame"]

_MINVAL = 1e-15  # mjMINVAL
_MINMU = 1e-5  # mjMINMU: the smallest friction coefficient MuJoCo assigns


class SoftContacts(NamedTuple):
    """``K`` contact slots (fixed for a table) of a batch of ``B`` states.

    Attributes:
        pos: ``(B, K, 3)`` contact point, world frame (m), mid-way between the surfaces.
        frame: ``(B, K, 3, 3)`` rows: normal (from geom1 to geom2), tangent1, tangent2.
        dist: ``(B, K)`` signed distance (m, negative: penetration).
        active: ``(B, K)`` bool: found and ``dist < includemargin`` (in MuJoCo's constraint problem).
        geom1, geom2: ``(K,)`` long, indices into the table.
        friction: ``(K, 5)`` (sliding, sliding, torsional, rolling, rolling), mixed as MuJoCo mixes.
        solref: ``(K, 2)``; solimp: ``(K, 5)``.
        includemargin: ``(K,)`` m. condim: ``(K,)`` long.
        found: ``(B, K)`` bool: MuJoCo's ``d.contact`` holds this contact (``active`` ones and those
            beyond ``includemargin`` within ``margin + gap``).
    """

    pos: Tensor
    frame: Tensor
    dist: Tensor
    active: Tensor
    geom1: Tensor
    geom2: Tensor
    friction: Tensor
    solref: Tensor
    solimp: Tensor
    includemargin: Tensor
    condim: Tensor
    found: Tensor | None = None


# ------------------------------------------------------------------ small vector helpers
def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1)


def _normalize(v: Tensor) -> tuple[Tensor, Tensor]:
    """``mju_normalize3``: ``(v / |v|, |v|)``, ``(1, 0, 0)`` where ``|v| < mjMINVAL``; finite gradients
    everywhere (the zero branch has none)."""
    n2 = _dot(v, v)
    ok = n2 >= _MINVAL * _MINVAL
    n = torch.sqrt(torch.where(ok, n2, torch.ones_like(n2)))
    ex = torch.zeros_like(v)
    ex[..., 0] = 1.0
    u = torch.where(ok.unsqueeze(-1), v / n.unsqueeze(-1), ex)
    return u, torch.where(ok, n, torch.zeros_like(n))


def _col(R: Tensor, i: int) -> Tensor:
    return R[..., :, i]


def _mv(R: Tensor, x: Tensor) -> Tensor:
    return (R * x.unsqueeze(-2)).sum(-1)


def _mtv(R: Tensor, x: Tensor) -> Tensor:
    return (R * x.unsqueeze(-1)).sum(-2)


def make_frame(normal: Tensor, tangent: Tensor) -> Tensor:
    """``mju_makeFrame``: rows ``(normal, t1, t2)`` ``(..., 3, 3)`` from a normal and an optional first
    tangent (zero: ``(0, 1, 0)``, or ``(0, 0, 1)`` when the normal is within 60 degrees of ``y``)."""
    n, _ = _normalize(normal)
    small = _dot(tangent, tangent) < 0.25
    ey = torch.zeros_like(n)
    ey[..., 1] = 1.0
    ez = torch.zeros_like(n)
    ez[..., 2] = 1.0
    dflt = torch.where(((n[..., 1] < 0.5) & (n[..., 1] > -0.5)).unsqueeze(-1), ey, ez)
    t = torch.where(small.unsqueeze(-1), dflt, tangent)
    t, _ = _normalize(t - n * _dot(n, t).unsqueeze(-1))
    return torch.stack([n, t, torch.cross(n, t, dim=-1)], -2)


# ------------------------------------------------------------------ raw collision functions
# Each returns (pos, normal, tangent, dist, found) with a slot axis before the vector axis:
# pos/normal/tangent (..., n, 3), dist/found (..., n). Sizes broadcast as (..., 3), margins as (...).
def _sphere_sphere(p1, R1, r1, p2, R2, r2, margin):
    """mjraw_SphereSphere: one slot (no slot axis), normal from 1 to 2."""
    dif = p1 - p2
    cd2 = _dot(dif, dif)
    lim = margin + r1 + r2
    found = cd2 <= lim * lim
    normal, ln = _normalize(p2 - p1)
    alt, _ = _normalize(torch.cross(_col(R1, 2), _col(R2, 2), dim=-1))
    normal = torch.where((ln < _MINVAL).unsqueeze(-1), alt, normal)
    dist = ln - r1 - r2
    pos = p1 + normal * (r1 + dist / 2).unsqueeze(-1)
    return pos, normal, torch.zeros_like(pos), dist, found


def _plane_point(p1, n, c, r, margin):
    """mjraw_PlaneSphere for the plane (origin ``p1``, unit normal ``n``) and a sphere at ``c``."""
    cdist = _dot(c - p1, n)
    found = cdist <= margin + r
    dist = cdist - r
    pos = c - n * (dist / 2 + r).unsqueeze(-1)
    return pos, dist, found


def _slots(items):
    pos, nrm, tan, dist, found = zip(*items)
    return (torch.stack(pos, -2), torch.stack(nrm, -2), torch.stack(tan, -2), torch.stack(dist, -1),
            torch.stack(found, -1))


def _compact(out, n: int):
    """Keep the first ``n`` found slots in order (MuJoCo fills its buffer in that order and stops)."""
    pos, nrm, tan, dist, found = out
    m = found.shape[-1]
    key = torch.where(found, 0, m) + torch.arange(m, device=found.device)
    order = torch.argsort(key, dim=-1)[..., :n]
    g3 = order.unsqueeze(-1).expand(*order.shape, 3)
    return (pos.gather(-2, g3), nrm.gather(-2, g3), tan.gather(-2, g3), dist.gather(-1, order),
            found.gather(-1, order))


def _plane_sphere(p1, R1, s1, p2, R2, s2, margin):
    n = _col(R1, 2)
    pos, dist, found = _plane_point(p1, n, p2, s2[..., 0], margin)
    return _slots([(pos, n, torch.zeros_like(pos), dist, found)])


def _plane_capsule(p1, R1, s1, p2, R2, s2, margin):
    n, axis = _col(R1, 2), _col(R2, 2)
    seg = axis * s2[..., 1:2]
    items = []
    for sign in (1.0, -1.0):
        pos, dist, found = _plane_point(p1, n, p2 + sign * seg, s2[..., 0], margin)
        items.append((pos, n, axis, dist, found))
    return _slots(items)


def _plane_box(p1, R1, s1, p2, R2, s2, margin):
    n = _col(R1, 2)
    dist0 = _dot(p2 - p1, n)
    items = []
    for i in range(8):
        sgn = torch.tensor([1.0 if i & 1 else -1.0, 1.0 if i & 2 else -1.0, 1.0 if i & 4 else -1.0],
                           dtype=p1.dtype, device=p1.device)
        corner = _mv(R2, s2 * sgn)
        ld = _dot(n, corner)
        dist = dist0 + ld
        found = (dist <= margin) & (ld <= 0)
        pos = corner + p2 - n * (dist / 2).unsqueeze(-1)
        items.append((pos, n, torch.zeros_like(pos), dist, found))
    return _compact(_slots(items), 4)


def _plane_cylinder(p1, R1, s1, p2, R2, s2, margin):
    n, axis = _col(R1, 2), _col(R2, 2)
    prj = _dot(n, axis)
    flip = prj > 0
    axis = torch.where(flip.unsqueeze(-1), -axis, axis)
    prj = torch.where(flip, -prj, prj)
    dist0 = _dot(p2 - p1, n)
    vec = axis * prj.unsqueeze(-1) - n
    l2 = _dot(vec, vec)
    r, h = s2[..., 0], s2[..., 1]
    ok = l2 >= _MINVAL * _MINVAL
    vec = torch.where(ok.unsqueeze(-1), vec * (r / torch.sqrt(torch.where(ok, l2, torch.ones_like(l2)))).unsqueeze(-1),
                      _col(R2, 0) * r.unsqueeze(-1))
    prjvec = _dot(vec, n)
    axis = axis * h.unsqueeze(-1)
    prj = prj * h
    zero = torch.zeros_like(p1)
    d1 = dist0 + prj + prjvec
    f1 = d1 <= margin
    c1 = p2 + vec + axis - n * (d1 * 0.5).unsqueeze(-1)
    d2 = dist0 - prj + prjvec
    f2 = f1 & (d2 <= margin)
    c2 = p2 + vec - axis - n * (d2 * 0.5).unsqueeze(-1)
    d3 = dist0 + prj - prjvec * 0.5
    f3 = f1 & (d3 <= margin)
    side, _ = _normalize(torch.cross(vec, axis, dim=-1))
    side = side * (r * 3.0 ** 0.5 / 2).unsqueeze(-1)
    base = p2 + axis - vec * 0.5 - n * (d3 * 0.5).unsqueeze(-1)
    items = [(c1, n, zero, d1, f1), (c2, n, zero, d2, f2), (base + side, n, zero, d3, f3),
             (base - side, n, zero, d3, f3)]
    return _compact(_slots(items), 4)


def _sphere_capsule(p1, R1, s1, p2, R2, s2, margin):
    axis = _col(R2, 2)
    ln = s2[..., 1]
    x = torch.maximum(torch.minimum(_dot(axis, p1 - p2), ln), -ln)
    c = p2 + axis * x.unsqueeze(-1)
    return _slots([_sphere_sphere(p1, R1, s1[..., 0], c, R2, s2[..., 0], margin)])


def _sphere_sphere_pair(p1, R1, s1, p2, R2, s2, margin):
    return _slots([_sphere_sphere(p1, R1, s1[..., 0], p2, R2, s2[..., 0], margin)])


def _capsule_capsule(p1, R1, s1, p2, R2, s2, margin):
    a1 = _col(R1, 2) * s1[..., 1:2]
    a2 = _col(R2, 2) * s2[..., 1:2]
    dif = p1 - p2
    ma, mb, mc = _dot(a1, a1), -_dot(a1, a2), _dot(a2, a2)
    u, v = -_dot(a1, dif), _dot(a2, dif)
    det = ma * mc - mb * mb
    general = det.abs() >= _MINVAL
    r1, r2 = s1[..., 0], s2[..., 0]

    def clip(x):
        return x.clamp(-1.0, 1.0)

    def at(x1, x2):
        return _sphere_sphere(p1 + a1 * x1.unsqueeze(-1), R1, r1, p2 + a2 * x2.unsqueeze(-1), R2, r2, margin)

    # general configuration: the closest points of the two segments
    dsafe = torch.where(general, det, torch.ones_like(det))
    x1 = (mc * u - mb * v) / dsafe
    x2 = (ma * v - mb * u) / dsafe
    hi1, lo1 = x1 > 1, x1 < -1
    x2 = torch.where(hi1, (v - mb) / mc, torch.where(lo1, (v + mb) / mc, x2))
    x1 = torch.where(hi1, torch.ones_like(x1), torch.where(lo1, -torch.ones_like(x1), x1))
    hi2, lo2 = x2 > 1, x2 < -1
    x1 = torch.where(hi2, clip((u - mb) / ma), torch.where(lo2, clip((u + mb) / ma), x1))
    x2 = torch.where(hi2, torch.ones_like(x2), torch.where(lo2, -torch.ones_like(x2), x2))
    g = at(x1, x2)
    # parallel axes (MuJoCo 4): the two ends of the part of segment 1 that segment 2 overlaps (both at
    # the nearer end of segment 1 when they do not overlap), each with its closest point on segment 2
    t_a, t_b = (u - mb) / ma, (u + mb) / ma  # segment 2's ends projected on segment 1
    lo, hi = clip(torch.minimum(t_a, t_b)), clip(torch.maximum(t_a, t_b))
    c_lo = at(lo, clip((v - mb * lo) / mc))
    c_hi = at(hi, clip((v - mb * hi) / mc))
    items = [tuple(torch.where(general.unsqueeze(-1) if a.dim() == general.dim() + 1 else general, ga, a)
                   for ga, a in zip(g, c_lo)),
             c_hi[:4] + (c_hi[4] & ~general,)]
    return _compact(_slots(items), 2)


def _sphere_box(p1, R1, s1, p2, R2, s2, margin):
    r = s1[..., 0]
    center = _mtv(R2, p1 - p2)
    clamped = torch.maximum(torch.minimum(center, s2), -s2)
    tmp, dist = _normalize(clamped - center)
    found = dist - r <= margin
    inside = dist <= _MINVAL
    # centre inside the box: the nearest face, in MuJoCo's order (-x, +x, -y, +y, -z, +z), first on ties
    faces = torch.stack([(-s2[..., 0] - center[..., 0]).abs(), (s2[..., 0] - center[..., 0]).abs(),
                         (-s2[..., 1] - center[..., 1]).abs(), (s2[..., 1] - center[..., 1]).abs(),
                         (-s2[..., 2] - center[..., 2]).abs(), (s2[..., 2] - center[..., 2]).abs()], -1)
    k = torch.argmin(faces, -1)  # the first of equal minima, as MuJoCo's strict comparison
    closest = faces.gather(-1, k.unsqueeze(-1)).squeeze(-1)
    nearest = torch.nn.functional.one_hot(torch.div(k, 2, rounding_mode="floor"), 3).to(p1.dtype)
    nearest = nearest * torch.where(k % 2 == 1, -1.0, 1.0).to(p1.dtype).unsqueeze(-1)
    pos_in = center + nearest * ((r - closest) / 2).unsqueeze(-1)
    pos_out = (clamped + center + tmp * r.unsqueeze(-1)) * 0.5
    i3 = inside.unsqueeze(-1)
    pos = _mv(R2, torch.where(i3, pos_in, pos_out)) + p2
    normal = _mv(R2, torch.where(i3, nearest, tmp))
    dist = torch.where(inside, -closest, dist) - r
    return _slots([(pos, normal, torch.zeros_like(pos), dist, found)])


def _safe_div(a: Tensor, b: Tensor) -> Tensor:
    """``a / b`` with ``inf`` (of ``a``'s sign, ``nan`` for ``0 / 0``) where ``b == 0``, as C divides, and
    finite gradients everywhere."""
    zero = b == 0
    q = a / torch.where(zero, torch.ones_like(b), b)
    inf = torch.where(a == 0, torch.full_like(a, float("nan")), torch.sign(a) * float("inf"))
    return torch.where(zero, inf, q)


def _pick(v: Tensor, idx: Tensor) -> Tensor:
    """``v[..., idx]`` for a per-element integer index ``idx`` (shape ``v.shape[:-1]``)."""
    return v.gather(-1, idx.unsqueeze(-1)).squeeze(-1)


def _capsule_box(p1, R1, s1, p2, R2, s2, margin):
    """mjraw_CapsuleBox: the capsule point nearest the box (the end nearest a face, or the closest
    point to one of the 12 edges) and, by MuJoCo's rules on the relative orientation, a second point
    along the capsule; each collides with the box as a sphere (up to 2 contacts)."""
    s1, s2 = s1.expand(p1.shape), s2.expand(p2.shape)
    r, hl = s1[..., 0], s1[..., 1]
    pos = _mtv(R2, p1 - p2)  # capsule centre in the box frame
    axis = _mtv(R2, _col(R1, 2))
    half = axis * hl.unsqueeze(-1)
    bits = torch.tensor([1, 2, 4], device=p1.device)
    axisdir = ((half > 0).long() * bits).sum(-1)
    bestmax = margin + 2 * (r + hl + s2.sum(-1))
    best = bestmax.clone()
    ilong = torch.zeros_like(axisdir)
    bsp = torch.zeros_like(r)  # best segment position in [-1, 1]
    bbp = torch.zeros_like(r)  # best box (edge) position in [-1, 1]
    cltype = ilong - 4
    clface, clcorner, cledge = ilong - 1, ilong.clone(), ilong.clone()
    # a capsule end nearest a face (at most one coordinate outside the box)
    for i in (-1, 1):
        end = pos + half * i
        clamped = torch.maximum(torch.minimum(end, s2), -s2)
        out = (end < -s2) | (end > s2)
        nout = out.long().sum(-1)
        last = torch.where(out, torch.arange(3, device=p1.device), -1).max(-1).values
        d = _dot(clamped - end, clamped - end)
        take = (nout <= 1) & (d < best)
        best = torch.where(take, d, best)
        bsp = torch.where(take, torch.full_like(bsp, float(i)), bsp)
        cltype = torch.where(take, ilong - 2 + i, cltype)
        clface = torch.where(take, last, clface)
    # the 12 edges: closest points of the capsule segment and the edge segment
    ma_all, mc = s2 * s2, hl * hl
    for j in range(3):
        for i in range(8):
            if i & (1 << j):
                continue
            corner = torch.stack([s2[..., k] * (1.0 if i & (1 << k) else -1.0) if k != j else torch.zeros_like(r)
                                  for k in range(3)], -1)
            dif = corner - pos
            ma = ma_all[..., j]
            mb = -s2[..., j] * half[..., j]
            u = -s2[..., j] * dif[..., j]
            v = _dot(half, dif)
            det = ma * mc - mb * mb
            ok = det.abs() >= _MINVAL
            idet = 1 / torch.where(ok, det, torch.ones_like(det))
            x1 = (mc * u - mb * v) * idet
            x2 = (ma * v - mb * u) * idet
            s1i = torch.ones_like(ilong)
            s2i = torch.ones_like(ilong)
            hi1, lo1 = x1 > 1, x1 < -1
            x2 = torch.where(hi1, (v - mb) / mc, torch.where(lo1, (v + mb) / mc, x2))
            x1 = torch.where(hi1, torch.ones_like(x1), torch.where(lo1, -torch.ones_like(x1), x1))
            s1i = torch.where(hi1, 2, torch.where(lo1, 0, s1i))
            hi2, lo2 = x2 > 1, x2 < -1
            x1n = torch.where(hi2, (u - mb) / ma, (u + mb) / ma)
            s1n = torch.where(x1n > 1, 2, torch.where(x1n < -1, 0, s1i))
            x1n = x1n.clamp(-1.0, 1.0)
            clip2 = hi2 | lo2
            x1 = torch.where(clip2, x1n, x1)
            s1i = torch.where(clip2, s1n, s1i)
            s2i = torch.where(hi2, 2, torch.where(lo2, 0, s2i))
            x2 = torch.where(hi2, torch.ones_like(x2), torch.where(lo2, -torch.ones_like(x2), x2))
            e = dif - half * x2.unsqueeze(-1)
            e = e.index_add(-1, torch.tensor([j], device=e.device), (s2[..., j] * x1).unsqueeze(-1))
            d = _dot(e, e)
            c1 = s1i * 3 + s2i
            take = ok & (d < best - _MINVAL)
            best = torch.where(take, d, best)
            bsp = torch.where(take, x2, bsp)
            bbp = torch.where(take, x1, bbp)
            clcorner = torch.where(take, i + (1 << j) * torch.div(c1, 6, rounding_mode="floor"), clcorner)
            cledge = torch.where(take, torch.full_like(cledge, j), cledge)
            cltype = torch.where(take, c1, cltype)
    ahalf = half.abs()
    sec = torch.full_like(r, -4.0)
    # (a) a box corner is closest
    c = axisdir ^ clcorner
    flip = (c == 3) | (c == 5) | (c == 6)
    mul = torch.where(flip, -1.0, 1.0).to(r.dtype)
    ca = torch.where(flip, 7 - c, c)
    de = torch.where(flip, 1 + bsp, 1 - bsp)
    dp = torch.where(flip, 1 - bsp, 1 + bsp)
    ax = torch.where(ca == 1, 0, torch.where(ca == 2, 1, 2))
    ax1, ax2 = (ax + 1) % 3, (ax + 2) % 3
    along = _pick(axis, ax) ** 2 > 0.5
    sec_edge = torch.minimum(de, _safe_div(2 * _pick(s2, ax), _pick(ahalf, ax))) * mul
    sec_face = torch.minimum(torch.minimum(dp, _safe_div(2 * _pick(s2, ax1), _pick(ahalf, ax1))),
                             _safe_div(2 * _pick(s2, ax2), _pick(ahalf, ax2))) * -mul
    case_a = (cltype >= 0) & (torch.div(cltype, 3, rounding_mode="floor") != 1) & (c != 0) & (c != 7)
    sec = torch.where(case_a, torch.where(along, sec_edge, sec_face), sec)
    # (b) the middle of a box edge is closest: a second point only in a cross configuration
    cb = (axisdir ^ clcorner) & (7 - (1 << cledge))
    ax = cledge
    b1, b2 = (ax + 1) % 3, (ax + 2) % 3
    b1 = torch.where(_pick(axis, b1).abs() > _pick(axis, b2).abs(), b2, b1)
    b2 = 3 - ax - b1
    up = ((cb >> b2) & 1) == 1
    mul = torch.where(up, 1.0, -1.0).to(r.dtype)
    sb = torch.where(up, 1 - bsp, 1 + bsp)
    sb = torch.minimum(sb, _safe_div(2 * _pick(s2, b2), _pick(ahalf, b2)))
    e2 = torch.where(((axisdir >> ax) & 1) == ((cb >> b2) & 1), 1 - bbp, 1 + bbp)
    sb = torch.minimum(sb, _safe_div(_pick(s2, ax) * e2, _pick(ahalf, ax))) * mul
    case_b = (cltype >= 0) & (torch.div(cltype, 3, rounding_mode="floor") == 1) & ((cb == 1) | (cb == 2) | (cb == 4))
    sec = torch.where(case_b, sb, sec)
    # (c) a capsule end is closest to a face: how far the capsule stays above the box
    mul = torch.where(cltype == -3, 1.0, -1.0).to(r.dtype)
    start = pos - half * mul.unsqueeze(-1)
    sc = torch.full_like(r, 2.0)
    for i in range(3):
        for lim in (s2[..., i], -s2[..., i]):
            e1 = _safe_div(lim - start[..., i], half[..., i]) * mul
            sc = torch.where((clface != i) & (e1 > 0) & (e1 < sc), e1, sc)
    case_c = (cltype < 0) & (cltype != -4) & (clface != -1)
    sec = torch.where(case_c, sc * mul, sec)
    # the contacts: spheres of the capsule's radius at the chosen points
    first = _mv(R2, pos + half * bsp.unsqueeze(-1)) + p2
    second = _mv(R2, pos + half * (sec + bsp).unsqueeze(-1)) + p2
    valid = cltype != -4
    c_first = _sphere_box(first, R1, s1, p2, R2, s2, margin)
    c_second = _sphere_box(second, R1, s1, p2, R2, s2, margin)
    f1 = c_first[4][..., 0] & valid
    f2 = c_second[4][..., 0] & valid & (sec > -3)
    out = tuple(torch.cat([a, b], -2 if a.dim() == c_first[0].dim() else -1) for a, b in zip(c_first[:4], c_second[:4]))
    return _compact(out + (torch.stack([f1, f2], -1),), 2)


def _sphere_cylinder(p1, R1, s1, p2, R2, s2, margin):
    """mjc_SphereCylinder: against the side (sphere-sphere with the axis point), a cap (plane-sphere,
    normal turned to point from the sphere to the cylinder) or the rim (sphere-point)."""
    s1, s2 = s1.expand(p1.shape), s2.expand(p2.shape)
    r1, rad, h = s1[..., 0], s2[..., 0], s2[..., 1]
    axis = _col(R2, 2)
    vec = p1 - p2
    x = _dot(axis, vec)
    a_proj = axis * x.unsqueeze(-1)
    p_proj = vec - a_proj
    pp2 = _dot(p_proj, p_proj)
    side = x.abs() < h
    cap = pp2 < rad * rad
    deep = side & cap  # centre inside: the nearer of the cap and the side
    d_cap = h - x.abs()
    d_rad = rad - torch.sqrt(torch.where(deep, pp2, torch.ones_like(pp2)))
    side = side & ~(deep & (d_cap < d_rad))
    cap = cap & ~(deep & ~(d_cap < d_rad))
    c_side = _sphere_sphere(p1, R1, r1, a_proj + p2, R2, rad, margin)
    n_cap = torch.where((x > 0).unsqueeze(-1), axis, -axis)
    cpos, cdist, cfound = _plane_point(p2 + n_cap * h.unsqueeze(-1), n_cap, p1, r1, margin)
    c_cap = (cpos, -n_cap, torch.zeros_like(cpos), cdist, cfound)
    rim = p_proj * (rad / torch.sqrt(torch.where(pp2 > 0, pp2, torch.ones_like(pp2)))).unsqueeze(-1)
    rim = rim + axis * torch.where(x > 0, h, -h).unsqueeze(-1) + p2
    c_rim = _sphere_sphere(p1, R1, r1, rim, R2, torch.zeros_like(rad), margin)
    out = []
    for a, b, c in zip(c_side, c_cap, c_rim):
        sd, cp = side, cap
        if a.dim() > side.dim():
            sd, cp = side.unsqueeze(-1), cap.unsqueeze(-1)
        out.append(torch.where(sd, a, torch.where(cp, b, c)))
    return _slots([tuple(out)])


# mjc_BoxBox's rounding scales (double precision)
_BB_SEPEPS, _BB_PAREPS, _BB_SGNEPS, _BB_DUPEPS, _BB_EDGEBIAS = 1e-13, 1e-16, 1e-9, 1e-14, 1e-6


def _clip(poly: Tensor, n: Tensor, coord: int, sign: float, limit: Tensor) -> tuple[Tensor, Tensor]:
    """One Sutherland-Hodgman pass of MuJoCo's box-box clipping: the polygon ``poly (..., 8, 3)``
    (``n`` valid vertices) against ``sign * v[coord] <= limit``; vertices inside are kept, and the
    crossing point of each edge that strictly crosses the line is added after its first vertex."""
    m = poly.shape[-2]
    k = torch.arange(m, device=poly.device)
    valid = k < n.unsqueeze(-1)
    nxt = torch.where(k + 1 >= n.unsqueeze(-1), torch.zeros_like(k), k + 1)  # (..., m)
    q = poly.gather(-2, nxt.unsqueeze(-1).expand(poly.shape))
    dp = sign * poly[..., coord] - limit.unsqueeze(-1)
    dq = sign * q[..., coord] - limit.unsqueeze(-1)
    keep = valid & (dp <= 0)
    cross = valid & (((dp < 0) & (dq > 0)) | ((dp > 0) & (dq < 0)))
    t = dp / torch.where(cross, dp - dq, torch.ones_like(dp))
    inter = poly + t.unsqueeze(-1) * (q - poly)
    cand = torch.stack([poly, inter], -2).flatten(-3, -2)  # (..., 2m, 3): p0, i0, p1, i1, ...
    flag = torch.stack([keep, cross], -1).flatten(-2)
    j = torch.arange(2 * m, device=poly.device)
    order = torch.argsort(torch.where(flag, j, j + 2 * m), dim=-1)[..., :m]
    out = cand.gather(-2, order.unsqueeze(-1).expand(*order.shape, 3))
    return out, flag.long().sum(-1).clamp(max=m)


def _box_box(p1, R1, s1, p2, R2, s2, margin):
    """mjc_BoxBox: the separating-axis test over the 15 axes; for a face axis the incident face
    clipped against the reference face (up to 8 contacts at the clipped vertices within the
    margin), for an edge axis one contact at the closest points of the two edges."""
    s1, s2 = s1.expand(p1.shape), s2.expand(p2.shape)
    dt, dev = p1.dtype, p1.device
    rot = R1.transpose(-1, -2) @ R2  # box 2's axes in box 1's frame (columns)
    rabs = rot.abs()
    pos21 = _mtv(R1, p2 - p1)
    pos12 = _mtv(R2, p1 - p2)
    septol = margin + _BB_SEPEPS * (s1.sum(-1) + s2.sum(-1))
    sep_a = pos21.abs() - s1 - (rabs * s2.unsqueeze(-2)).sum(-1)
    sep_b = pos12.abs() - s2 - (rabs * s1.unsqueeze(-1)).sum(-2)
    faces = torch.cat([sep_a, sep_b], -1)
    separated = (faces > septol.unsqueeze(-1)).any(-1)
    code_face = torch.argmax(faces, -1)  # the first of equal maxima, as the strict comparisons
    sep_face = faces.gather(-1, code_face.unsqueeze(-1)).squeeze(-1)
    sep_best, code = sep_face, code_face
    for i in range(3):
        i1, i2 = (i + 1) % 3, (i + 2) % 3
        for j in range(3):
            j1, j2 = (j + 1) % 3, (j + 2) % 3
            ax1, ax2 = -rot[..., i2, j], rot[..., i1, j]
            n2 = ax1 * ax1 + ax2 * ax2
            ok = n2 >= _BB_PAREPS
            inv = 1 / torch.sqrt(torch.where(ok, n2, torch.ones_like(n2)))
            ax1, ax2 = ax1 * inv, ax2 * inv
            rad1 = s1[..., i1] * ax1.abs() + s1[..., i2] * ax2.abs()
            b1 = ax1 * rot[..., i1, j1] + ax2 * rot[..., i2, j1]
            b2 = ax1 * rot[..., i1, j2] + ax2 * rot[..., i2, j2]
            rad2 = s2[..., j1] * b1.abs() + s2[..., j2] * b2.abs()
            sep = (ax1 * pos21[..., i1] + ax2 * pos21[..., i2]).abs() - rad1 - rad2
            separated = separated | (ok & (sep > septol))
            take = ok & (sep - _BB_EDGEBIAS * sep.abs() > sep_best) & (sep > sep_face)
            sep_best = torch.where(take, sep, sep_best)
            code = torch.where(take, torch.full_like(code, 6 + 3 * i + j), code)
    edge = code >= 6
    ei = torch.div((code - 6).clamp(min=0), 3, rounding_mode="floor")
    ej = (code - 6).clamp(min=0) % 3
    ei1, ei2 = (ei + 1) % 3, (ei + 2) % 3
    ej1, ej2 = (ej + 1) % 3, (ej + 2) % 3
    rflat = rot.flatten(-2)

    def r_(r, c):
        return _pick(rflat, 3 * r + c)

    def vec(idx_vals):  # a 3-vector with the given (index, value) entries
        return sum(torch.nn.functional.one_hot(ix, 3).to(dt) * v.unsqueeze(-1) for ix, v in idx_vals)

    axis, _ = _normalize(vec([(ei1, -r_(ei2, ej)), (ei2, r_(ei1, ej))]))
    # a winning edge nearly parallel to the best face: the face is kept
    fd1 = _pick(axis, code_face.clamp(max=2)).abs()
    fcol = (code_face - 3).clamp(min=0)
    fd2 = _dot(axis, rflat.gather(-1, torch.stack([fcol, fcol + 3, fcol + 6], -1))).abs()
    face_dot = torch.where(code_face < 3, fd1, fd2)
    back = edge & (face_dot > 0.99) & (sep_best < sep_face + 0.05 * sep_face.abs() + _MINVAL)
    code = torch.where(back, code_face, code)
    edge = code >= 6
    # ---- edge-edge contact
    axis = torch.where((_dot(axis, pos21) < 0).unsqueeze(-1), -axis, axis)
    a2 = _mtv(rot, axis)
    # a near-zero axis component makes the supporting edge ambiguous: both are tried, the closer kept
    amb1 = torch.where(_pick(axis, ei1).abs() < _BB_SGNEPS, ei1,
                       torch.where(_pick(axis, ei2).abs() < _BB_SGNEPS, ei2, -1))
    amb2 = torch.where(_pick(a2, ej1).abs() < _BB_SGNEPS, ej1,
                       torch.where(_pick(a2, ej2).abs() < _BB_SGNEPS, ej2, -1))
    d2 = rflat.gather(-1, torch.stack([ej, ej + 3, ej + 6], -1))
    b = _pick(d2, ei)
    denom = 1 - b * b
    si, tj = _pick(s1, ei), _pick(s2, ej)
    best_g = torch.full_like(b, float("inf"))
    w1 = w2 = torch.zeros_like(p1)
    for v1 in (0, 1):
        for v2 in (0, 1):
            f1 = torch.where(_pick(axis, ei1) >= 0, 1.0, -1.0).to(dt)
            f2 = torch.where(_pick(axis, ei2) >= 0, 1.0, -1.0).to(dt)
            if v1:
                f1 = torch.where(amb1 == ei1, -f1, f1)
                f2 = torch.where(amb1 == ei2, -f2, f2)
            c1 = vec([(ei1, f1 * _pick(s1, ei1)), (ei2, f2 * _pick(s1, ei2))])
            g1 = torch.where(_pick(a2, ej1) >= 0, -1.0, 1.0).to(dt)
            g2 = torch.where(_pick(a2, ej2) >= 0, -1.0, 1.0).to(dt)
            if v2:
                g1 = torch.where(amb2 == ej1, -g1, g1)
                g2 = torch.where(amb2 == ej2, -g2, g2)
            cc = vec([(ej1, g1 * _pick(s2, ej1)), (ej2, g2 * _pick(s2, ej2))])
            c2 = _mv(rot, cc) + pos21
            e = c2 - c1
            d1e, d2e = _pick(e, ei), _dot(d2, e)
            small = denom < _MINVAL
            sv = torch.where(small, torch.zeros_like(b),
                             (d1e - b * d2e) / torch.where(small, torch.ones_like(b), denom))
            sv = torch.maximum(torch.minimum(sv, si), -si)
            tv = b * sv - d2e
            tv = torch.maximum(torch.minimum(tv, tj), -tj)
            sv = d1e + b * tv
            sv = torch.maximum(torch.minimum(sv, si), -si)
            q1 = c1 + torch.nn.functional.one_hot(ei, 3).to(dt) * sv.unsqueeze(-1)
            q2 = c2 + d2 * tv.unsqueeze(-1)
            gp = _dot(q2 - q1, q2 - q1)
            use = gp < best_g
            if v1:
                use = use & (amb1 >= 0)
            if v2:
                use = use & (amb2 >= 0)
            best_g = torch.where(use, gp, best_g)
            w1 = torch.where(use.unsqueeze(-1), q1, w1)
            w2 = torch.where(use.unsqueeze(-1), q2, w2)
    edist = _dot(w2 - w1, axis)
    epos = _mv(R1, 0.5 * (w1 + w2)) + p1
    enormal = _mv(R1, axis)
    efound = edge & ~separated & (edist <= septol)
    # ---- face contact: clip the incident face against the reference face's side planes
    ref1 = code < 3
    a = torch.where(ref1, code, code - 3).clamp(0, 2)
    r3 = ref1.unsqueeze(-1)
    sref, sinc = torch.where(r3, s1, s2), torch.where(r3, s2, s1)
    pref = torch.where(r3, p1, p2)
    matref = torch.where(r3.unsqueeze(-1), R1, R2)
    posoi = torch.where(r3, pos21, pos12)
    rinc = torch.where(r3.unsqueeze(-1), rot, rot.transpose(-1, -2))
    iflat = rinc.flatten(-2)
    sgn = torch.where(_pick(posoi, a) >= 0, 1.0, -1.0).to(dt)
    row = iflat.gather(-1, torch.stack([3 * a, 3 * a + 1, 3 * a + 2], -1))
    binc = torch.argmax(row.abs(), -1)
    tinc = torch.where(sgn * _pick(row, binc) > 0, -1.0, 1.0).to(dt)
    fax, fay = (a + 1) % 3, (a + 2) % 3
    bu, bv = (binc + 1) % 3, (binc + 2) % 3
    cx, du, dv = [], [], []
    for c in (fax, fay, a):
        cx.append(_pick(posoi, c) + tinc * _pick(sinc, binc) * _pick(iflat, 3 * c + binc))
        du.append(_pick(sinc, bu) * _pick(iflat, 3 * c + bu))
        dv.append(_pick(sinc, bv) * _pick(iflat, 3 * c + bv))
    cx[2] = sgn * cx[2] - _pick(sref, a)
    du[2], dv[2] = du[2] * sgn, dv[2] * sgn
    cx, du, dv = torch.stack(cx, -1), torch.stack(du, -1), torch.stack(dv, -1)
    signs = torch.tensor([[1.0, 1.0], [-1.0, 1.0], [-1.0, -1.0], [1.0, -1.0]], dtype=dt, device=dev)
    quad = cx.unsqueeze(-2) + signs[:, 0:1] * du.unsqueeze(-2) + signs[:, 1:2] * dv.unsqueeze(-2)
    poly = torch.cat([quad, torch.zeros_like(quad)], -2)  # capacity 8
    n = torch.full_like(code, 4)
    lx, ly = _pick(sref, fax), _pick(sref, fay)
    for coord, sign, lim in ((0, 1.0, lx), (0, -1.0, lx), (1, 1.0, ly), (1, -1.0, ly)):
        poly, n = _clip(poly, n, coord, sign, lim)
    dupe2 = _BB_DUPEPS * (lx * lx + ly * ly)
    acc = []
    for k in range(8):
        ok = (k < n) & (poly[..., k, 2] <= margin)
        for q in range(k):
            dd = (poly[..., q, :2] - poly[..., k, :2]).pow(2).sum(-1)
            ok = ok & ~(acc[q] & (dd < dupe2))
        acc.append(ok)
    acc = torch.stack(acc, -1) & ~edge.unsqueeze(-1) & ~separated.unsqueeze(-1)
    oh = [torch.nn.functional.one_hot(x, 3).to(dt).unsqueeze(-2) for x in (fax, fay, a)]
    posc = (poly[..., 0:1] * oh[0] + poly[..., 1:2] * oh[1]
            + (sgn.unsqueeze(-1) * (_pick(sref, a).unsqueeze(-1) + 0.5 * poly[..., 2])).unsqueeze(-1) * oh[2])
    fpos = (matref.unsqueeze(-3) @ posc.unsqueeze(-1)).squeeze(-1) + pref.unsqueeze(-2)
    nsign = torch.where(ref1, sgn, -sgn)
    col_a = matref.gather(-1, a.view(*a.shape, 1, 1).expand(*a.shape, 3, 1)).squeeze(-1)  # the face axis
    fnormal = nsign.unsqueeze(-1) * col_a
    fnormal = fnormal.unsqueeze(-2).expand_as(fpos)
    # slot 0 holds the edge contact when the axis is an edge's
    e3 = edge.unsqueeze(-1)
    pos = torch.cat([torch.where(e3, epos, fpos[..., 0, :]).unsqueeze(-2), fpos[..., 1:, :]], -2)
    normal = torch.cat([torch.where(e3, enormal, fnormal[..., 0, :]).unsqueeze(-2), fnormal[..., 1:, :]], -2)
    dist = torch.cat([torch.where(edge, edist, poly[..., 0, 2]).unsqueeze(-1), poly[..., 1:, 2]], -1)
    found = torch.cat([(acc[..., 0] | efound).unsqueeze(-1), acc[..., 1:]], -1)
    return _compact((pos, normal, torch.zeros_like(pos), dist, found), 8)


_FUNCS = {(PLANE, SPHERE): (_plane_sphere, 1), (PLANE, CAPSULE): (_plane_capsule, 2), (PLANE, BOX): (_plane_box, 4),
          (SPHERE, SPHERE): (_sphere_sphere_pair, 1), (SPHERE, CAPSULE): (_sphere_capsule, 1),
          (CAPSULE, CAPSULE): (_capsule_capsule, 2), (PLANE, CYLINDER): (_plane_cylinder, 4),
          (SPHERE, BOX): (_sphere_box, 1), (CAPSULE, BOX): (_capsule_box, 2),
          (BOX, BOX): (_box_box, 8), (SPHERE, CYLINDER): (_sphere_cylinder, 1)}
assert set(_FUNCS) == set(PAIR_TYPES)


# ------------------------------------------------------------------ parameters
def contact_parameters(table: GeomTable) -> dict[str, np.ndarray]:
    """Per pair of ``table.pairs``, MuJoCo's mixed contact parameters (``mj_contactParam``).

    Returns:
        ``{"condim" (P,), "friction" (P, 5), "solref" (P, 2), "solimp" (P, 5), "margin" (P,)
        (the sum of the two geoms', MuJoCo's ``includemargin``), "gap" (P,) (the sum)}``: the higher
        ``priority`` geom's values, or for equal priorities the larger condim and friction and
        ``solref``/``solimp`` mixed by ``solmix`` (``solref`` the element-wise minimum when either is
        a direct reference, ``solref[0] <= 0``); a ``<pair>`` element's own values for its pair.
    """
    a, b = table.pairs[:, 0], table.pairs[:, 1]
    pa, pb = table.priority[a], table.priority[b]
    s1, s2 = table.solmix[a], table.solmix[b]
    both = (s1 >= _MINVAL) & (s2 >= _MINVAL)
    mix = np.where(both, s1 / np.where(both, s1 + s2, 1.0),
                   np.where((s1 < _MINVAL) & (s2 < _MINVAL), 0.5, np.where(s1 < _MINVAL, 0.0, 1.0)))[:, None]
    ref1, ref2 = table.solref[a], table.solref[b]
    standard = (ref1[:, :1] > 0) & (ref2[:, :1] > 0)
    solref = np.where(standard, mix * ref1 + (1 - mix) * ref2, np.minimum(ref1, ref2))
    solimp = mix * table.solimp[a] + (1 - mix) * table.solimp[b]
    fri = np.maximum(table.friction[a], table.friction[b])
    condim = np.maximum(table.condim[a], table.condim[b])
    for sel, g in ((pa > pb, a), (pa < pb, b)):
        solref[sel], solimp[sel] = table.solref[g][sel], table.solimp[g][sel]
        fri[sel], condim[sel] = table.friction[g][sel], table.condim[g][sel]
    out = {"condim": condim, "friction": fri[:, [0, 0, 1, 2, 2]], "solref": solref, "solimp": solimp,
           "margin": table.margin[a] + table.margin[b], "gap": table.gap[a] + table.gap[b]}
    pp = table.pair_params
    if pp is not None:  # <pair> elements: their own values, not mixed
        ex = pp["explicit"]
        for key in out:
            out[key][ex] = pp[key][ex]
    out["friction"] = np.maximum(_MINMU, out["friction"])
    return out


def _plan(table: GeomTable):
    """Per pair type (in ``PAIR_TYPES`` order): the pair indices; cached on the table."""
    key = (len(table), table.pairs.shape[0], table.pairs.tobytes())
    cached = getattr(table, "_soft_plan", None)
    if cached is not None and cached[0] == key:
        return cached[1]
    check_pairs(table)
    types = table.type[table.pairs] if len(table.pairs) else np.zeros((0, 2), dtype=np.int64)
    groups = []
    for t in PAIR_TYPES:
        sel = np.nonzero((types[:, 0] == t[0]) & (types[:, 1] == t[1]))[0]
        if len(sel):
            groups.append((t, sel))
    plan = (groups, contact_parameters(table), {})  # the last: collide's tensors per dtype and device
    table._soft_plan = (key, plan)
    return plan


# ------------------------------------------------------------------ the narrow phase
def collide(table: GeomTable, geom_pos: Tensor, geom_rot: Tensor) -> SoftContacts:
    """MuJoCo's contacts of every pair of ``table`` at the given geom poses.

    Args:
        table: the scene's :class:`~diffmech.contact.soft_geoms.GeomTable`.
        geom_pos: ``(B, G, 3)`` geom origins, world frame (m).
        geom_rot: ``(B, G, 3, 3)`` geom orientations (columns: the geom axes in world coordinates).

    Returns:
        :class:`SoftContacts` with ``K`` slots: per pair type in the order of
        :data:`~diffmech.contact.soft_geoms.PAIR_TYPES` (plane-sphere 1 slot a pair, plane-capsule 2,
        plane-box 4, sphere-sphere 1, sphere-capsule 1, capsule-capsule 2, plane-cylinder 4,
        sphere-box 1, capsule-box 2, box-box 8, sphere-cylinder 1), pair-major within a type. ``pos``,
        ``frame`` and ``dist`` are differentiable in ``geom_pos`` and ``geom_rot``; slots that are not
        ``found`` hold finite values that no contact uses.

    Raises:
        ShapeError: poses whose shapes do not fit the table.
        ModelError: a pair type the code does not have (naming the geoms).
    """
    G = len(table)
    if geom_pos.dim() != 3 or geom_pos.shape[1:] != (G, 3) or geom_rot.shape != (*geom_pos.shape[:2], 3, 3):
        raise ShapeError(f"collide: geom_pos must be (B, {G}, 3) and geom_rot (B, {G}, 3, 3) for a table of {G} geoms, "
                         f"got {tuple(geom_pos.shape)} and {tuple(geom_rot.shape)}")
    groups, par, tcache = _plan(table)
    B, dt, dev = geom_pos.shape[0], geom_pos.dtype, geom_pos.device
    k = _slot_tensors(table, groups, par, tcache, dt, dev)
    outs = []
    for (t, sel), (i1, i2, det) in zip(groups, k["pairs"]):
        fn, n = _FUNCS[t]
        size = k["size"]
        out = fn(geom_pos[:, i1], geom_rot[:, i1], size[i1], geom_pos[:, i2], geom_rot[:, i2], size[i2], det)
        P = len(sel)
        outs.append(tuple(x.reshape(B, P * n, *x.shape[3:]) for x in out))
    if outs:
        pos, nrm, tan, dist, found = (torch.cat(x, 1) for x in zip(*outs))
    else:
        pos = nrm = tan = geom_pos.new_zeros(B, 0, 3)
        dist, found = geom_pos.new_zeros(B, 0), torch.zeros(B, 0, dtype=torch.bool, device=dev)
    frame = make_frame(nrm, tan)
    inc = k["includemargin"]
    return SoftContacts(
        pos=pos, frame=frame, dist=dist, active=found & (dist < inc), geom1=k["geom1"], geom2=k["geom2"],
        friction=k["friction"], solref=k["solref"], solimp=k["solimp"], includemargin=inc, condim=k["condim"],
        found=found)


def _slot_tensors(table: GeomTable, groups, par: dict, cache: dict, dt: torch.dtype, dev) -> dict:
    """The constant tensors of :func:`collide` (geom sizes, per pair type the geom indices and
    detection distances, per slot the pair's geoms and parameters), kept in the table's plan
    (``cache``) per dtype and device."""
    key = (dt, str(dev))
    got = cache.get(key)
    if got is not None:
        return got
    detect = torch.as_tensor(par["margin"] + par["gap"], dtype=dt, device=dev)
    pairs, pair_of_slot = [], []
    for t, sel in groups:
        i1, i2 = (torch.as_tensor(table.pairs[sel, j], device=dev) for j in (0, 1))
        pairs.append((i1, i2, detect[torch.as_tensor(sel, device=dev)]))
        pair_of_slot.append(np.repeat(sel, _FUNCS[t][1]))
    slot_pair = np.concatenate(pair_of_slot) if pair_of_slot else np.zeros(0, dtype=np.int64)

    def per_slot(x, dtype=dt):
        return torch.as_tensor(np.asarray(x)[slot_pair], dtype=dtype, device=dev)

    got = {"size": torch.as_tensor(table.size, dtype=dt, device=dev), "pairs": pairs,
           "includemargin": per_slot(par["margin"]), "geom1": per_slot(table.pairs[:, 0], torch.long),
           "geom2": per_slot(table.pairs[:, 1], torch.long), "friction": per_slot(par["friction"]),
           "solref": per_slot(par["solref"]), "solimp": per_slot(par["solimp"]),
           "condim": per_slot(par["condim"], torch.long)}
    cache[key] = got
    return got
