"""The narrow phase (:mod:`diffmech.contact.geometry`) against coal (hpp-fcl's successor), pair by
pair, at a few hundred seeded random poses each -- rotated, separated, touching, penetrating, plus
the special poses of each pair (parallel and crossing capsules, a box's corner inside a box, a
capsule across a box's edge) -- and each pair in a simulated scene against its analytic rest state.

Conventions compared (float64 throughout):

* signed distance ``phi``: coal's ``distance`` with ``enable_signed_distance`` (negative in
  penetration: minus the penetration depth, as ``collide`` reports it);
* normal: diffmech's points from shape b to shape a, coal's ``DistanceResult.normal`` from o1 = a to
  o2 = b, so diffmech's normal is minus coal's;
* witness points: diffmech returns one point per candidate, *halfway* between the two surfaces; coal
  returns a point on each surface (``getNearestPoint1/2``). So diffmech's point is compared with the
  midpoint of coal's, and ``point +- phi/2 normal`` with coal's points on a and on b.

Where coal is analytic (sphere, capsule and box against a halfspace; sphere-sphere, sphere-capsule,
capsule-capsule, sphere-box) the results agree to rounding: measured errors are below 1e-14 and the
tolerance is 1e-12. Where coal runs GJK/EPA (box-box, capsule-box) with its tolerances set to 1e-14
here, the distance is within 4e-11 (tolerance 1e-9), the normal and witness points within 2.2e-9
(tolerance 1e-8: EPA's, they vary with the state earlier coal queries leave).
Where diffmech's contact model deliberately differs from an exact distance (the candidates are
fixed points: a box's corners on the ground, a capsule's ends, a cylinder's 16 rim points; box-box
reports the separating-axis test's separation for separated boxes whose nearest features are
corners) the test compares what must agree and says why at that test.
"""

from __future__ import annotations

import math

import coal
import numpy as np
import pytest
import torch

from diffmech.contact import geometry as geo
from diffmech.model import systems
from diffmech.sim import Scene, rollout

F64 = torch.float64
N = 300  # random poses per pair type
EXACT = 1e-12  # coal analytic: measured < 1e-14 (phi, normal, points), 2e-12 for an ill-conditioned normal
GJK = 1e-9  # coal GJK/EPA at tolerance 1e-14, the distance: measured < 4e-11
# ... and its normal and witness points, whose error depends on the state earlier coal queries left
# (measured 3e-14 for capsule-box run alone, 1.0e-9 (normal) and 2.2e-9 (points) after box-box queries)
GJK_DIRECTION = 1e-8


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    # the solver's sweeps in C, as users get them (tests/test_pgs.py checks them against torch's)
    from diffmech.contact import pgs_native

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


# ------------------------------------------------------------------ poses and coal
def _rotations(g: torch.Generator, n: int) -> torch.Tensor:
    """Uniform random rotations (unit quaternions, textbook formula), ``(n, 3, 3)``."""
    q = torch.randn(n, 4, dtype=F64, generator=g)
    w, x, y, z = (q / q.norm(dim=-1, keepdim=True)).unbind(-1)
    return torch.stack([
        torch.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
        torch.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
        torch.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1)], -2)


def _axis_rotation(axis, angle: float) -> torch.Tensor:
    a = torch.tensor(axis, dtype=F64)
    a = a / a.norm()
    K = torch.tensor([[0, -a[2], a[1]], [a[2], 0, -a[0]], [-a[1], a[0], 0]], dtype=F64)
    return torch.eye(3, dtype=F64) + math.sin(angle) * K + (1 - math.cos(angle)) * K @ K


def coal_shape(kind: str, size):
    """The coal geometry of a diffmech primitive ``kind`` of dimensions ``size`` (also used by
    ``test_geometry_convex.py``)."""
    if kind == "sphere":
        return coal.Sphere(size[0])
    if kind == "capsule":  # coal: radius and the full length of the axis (halfLength = length / 2), along z
        return coal.Capsule(size[0], size[1])
    if kind == "box":  # coal: full side lengths
        return coal.Box(*size)
    if kind == "cylinder":
        return coal.Cylinder(size[0], size[1])
    if kind == "ground":
        return coal.Halfspace(np.array([0.0, 0.0, 1.0]), 0.0)  # z <= 0
    raise ValueError(kind)


def coal_distance(ga, Ra, pa, gb, Rb, pb):
    """Coal's signed distance ``(n,)``, points on a and on b ``(n, 3)`` and the normal from b to a
    (diffmech's convention) ``(n, 3)`` between the coal geometries ``ga`` and ``gb`` at each of ``n``
    poses ``R (n, 3, 3)``, ``p (n, 3)`` (also used by ``test_geometry_convex.py``)."""
    req = coal.DistanceRequest()
    req.enable_signed_distance = True
    req.gjk_tolerance = req.epa_tolerance = 1e-14
    req.gjk_max_iterations = req.epa_max_iterations = 1000
    out = []
    for i in range(len(pa)):
        ta, tb = coal.Transform3s(), coal.Transform3s()
        ta.setRotation(Ra[i].numpy())
        ta.setTranslation(pa[i].numpy())
        tb.setRotation(Rb[i].numpy())
        tb.setTranslation(pb[i].numpy())
        res = coal.DistanceResult()
        d = coal.distance(ga, ta, gb, tb, req, res)
        out.append(np.concatenate([[d], res.getNearestPoint1(), res.getNearestPoint2(), -res.normal]))
    out = torch.tensor(np.array(out), dtype=F64)
    return out[:, 0], out[:, 1:4], out[:, 4:7], out[:, 7:10]


def _coal(ka, sa, Ra, pa, kb, sb, Rb, pb):
    """:func:`coal_distance` between the shapes ``(kind, size)`` ``a`` and ``b``."""
    return coal_distance(coal_shape(ka, sa), Ra, pa, coal_shape(kb, sb), Rb, pb)


def _near(g, ka, sa, kb, sb, scale, n=N, depth=0.12, Ra=None, Rb=None):
    """``n`` rotated poses of a near b: a is put in a random direction from b, then moved along
    coal's normal to a signed distance drawn in [-depth, 0.08] * scale, every 7th exactly touching
    (distance 0 where coal's distance is exact along the normal)."""
    Ra = _rotations(g, n) if Ra is None else Ra
    Rb = _rotations(g, n) if Rb is None else Rb
    pb = 0.1 * torch.randn(n, 3, dtype=F64, generator=g)
    u = torch.randn(n, 3, dtype=F64, generator=g)
    pa = pb + scale * u / u.norm(dim=-1, keepdim=True)
    d, _, _, nrm = _coal(ka, sa, Ra, pa, kb, sb, Rb, pb)
    target = (-depth + (depth + 0.08) * torch.rand(n, dtype=F64, generator=g)) * scale
    target[::7] = 0.0
    return Ra, pa + (target - d)[:, None] * nrm, Rb, pb


def _pick(c: geo.Candidates, idx: torch.Tensor):
    rows = torch.arange(len(idx))
    return c.phi[rows, idx], c.point[rows, idx], c.normal[rows, idx]


def _check(phi, point, normal, ref, tol, what, mask=None, normal_tol=None):
    """phi, normal, the midpoint and the two surface points against coal's ``ref``; ``normal_tol``
    (per pose) where the normal is ill-conditioned."""
    d, wa, wb, n = ref
    mask = torch.ones_like(d, dtype=torch.bool) if mask is None else mask
    dtol = GJK_DIRECTION if tol == GJK else tol  # normal and points
    nerr = (normal - n).norm(dim=-1) * (dtol / normal_tol if normal_tol is not None else 1.0)
    errs = {"phi": ((phi - d).abs(), tol), "normal": (nerr, dtol),
            "midpoint": ((point - 0.5 * (wa + wb)).norm(dim=-1), dtol),
            "point on a": ((point + 0.5 * phi[:, None] * normal - wa).norm(dim=-1), dtol),
            "point on b": ((point - 0.5 * phi[:, None] * normal - wb).norm(dim=-1), dtol)}
    for k, (e, t) in errs.items():
        worst = float(e[mask].max())
        assert worst < t, f"{what}: {k} off coal's by {worst:.2e} (> {t:.0e})"


# ------------------------------------------------------------------ against the ground
@pytest.mark.parametrize("kind,size", [("sphere", (0.1,)), ("capsule", (0.05, 0.3)), ("box", (0.2, 0.3, 0.1))])
def test_shapes_against_the_ground_equal_coal_halfspace(kind, size):
    """The deepest candidate (a sphere's centre, a capsule's lower end sphere, a box's lowest
    corner) is the exact nearest point, so it equals coal's analytic shape-halfspace distance. Also
    poses lying flat (a capsule horizontal, a box face down), where coal's witness point is one of
    several: there phi and the normal are compared, and every lowest candidate is checked to be on
    the shape at that distance."""
    g = torch.Generator().manual_seed(1)
    R = _rotations(g, N)
    I, O = torch.eye(3, dtype=F64).expand(N, 3, 3), torch.zeros(N, 3, dtype=F64)
    p = torch.cat([torch.randn(N, 2, dtype=F64, generator=g), O[:, :1]], 1)
    p[:, 2] = -_coal(kind, size, R, p, "ground", None, I, O)[0] + 0.05 * (torch.rand(N, dtype=F64, generator=g) - 0.6)
    ref = _coal(kind, size, R, p, "ground", None, I, O)
    assert int((ref[0] < 0).sum()) > N // 3 and int((ref[0] > 0).sum()) > N // 4
    c = geo.plane_candidates(kind, size, R, p)
    _check(*_pick(c, c.phi.argmin(1)), ref, EXACT, f"{kind}-ground")
    # flat: axis or face horizontal, random yaw, heights around the contact
    yaw = torch.stack([_axis_rotation((0, 0, 1), float(a)) for a in torch.rand(N, generator=g, dtype=F64) * 6.3])
    flat = yaw @ (_axis_rotation((1, 0, 0), math.pi / 2) if kind == "capsule" else torch.eye(3, dtype=F64))
    lowest = size[2] / 2 if kind == "box" else size[0]
    p[:, 2] = lowest + 0.01 * (torch.rand(N, dtype=F64, generator=g) - 0.6)
    d, _, _, n = _coal(kind, size, flat, p, "ground", None, I, O)
    c = geo.plane_candidates(kind, size, flat, p)
    assert (c.phi.min(1).values - d).abs().max() < EXACT
    assert (c.normal - n[:, None]).norm(dim=-1).max() < EXACT
    low = c.phi <= d[:, None] + EXACT  # the lowest candidates: 2 (capsule) or 4 (box) each
    assert int(low.sum()) == N * {"sphere": 1, "capsule": 2, "box": 4}[kind]
    on_shape = c.point + 0.5 * c.phi[..., None] * c.normal  # its point on the shape's surface
    assert (on_shape[..., 2] - (p[:, 2] - lowest)[:, None])[low].abs().max() < EXACT


def test_cylinder_against_the_ground_is_coal_within_the_rim_polygon():
    """A cylinder touches the ground with 8 points on each end rim (a regular octagon): the lowest
    rim point is within pi/8 of an octagon vertex, so diffmech's gap exceeds coal's exact one by
    between 0 and ``r sin(tilt) (1 - cos(pi/8))`` (measured: the bound is reached to 1e-3 of it),
    and equals it (to rounding) where the cylinder is tilted about a body axis through a vertex."""
    g = torch.Generator().manual_seed(2)
    r, L = 0.1, 0.3
    R = _rotations(g, N)
    I, O = torch.eye(3, dtype=F64).expand(N, 3, 3), torch.zeros(N, 3, dtype=F64)
    p = O.clone()
    lowest = -_coal("cylinder", (r, L), R, p, "ground", None, I, O)[0]
    p[:, 2] = lowest + 0.05 * (torch.rand(N, dtype=F64, generator=g) - 0.6)
    d, _, _, n = _coal("cylinder", (r, L), R, p, "ground", None, I, O)
    c = geo.plane_candidates("cylinder", (r, L), R, p)
    gap = c.phi.min(1).values - d
    bound = r * (1 - math.cos(math.pi / 8)) * (1 - R[:, 2, 2] ** 2).sqrt()
    assert gap.min() > -EXACT and (gap - bound).max() < EXACT
    assert (gap / bound).max() > 0.99  # the bound is the error, not a loose cap
    # tilted about the body x axis (and yawed): the lowest rim point is the vertex at -y
    tilt = torch.rand(N, dtype=F64, generator=g) * 3.0
    R = torch.stack([_axis_rotation((0, 0, 1), 2.0 * i) @ _axis_rotation((1, 0, 0), float(t))
                     for i, t in enumerate(tilt)])
    ref = _coal("cylinder", (r, L), R, p, "ground", None, I, O)
    c = geo.plane_candidates("cylinder", (r, L), R, p)
    _check(*_pick(c, c.phi.argmin(1)), ref, EXACT, "cylinder-ground (vertex lowest)")


# ------------------------------------------------------------------ pairs of shapes
def test_sphere_sphere_equals_coal():
    g = torch.Generator().manual_seed(3)
    ra, rb = 0.1, 0.2
    Ra, pa, Rb, pb = _near(g, "sphere", (ra,), "sphere", (rb,), 0.3)
    ref = _coal("sphere", (ra,), Ra, pa, "sphere", (rb,), Rb, pb)
    assert int((ref[0] < 0).sum()) > N // 3
    c = geo.sphere_sphere(pa, ra, pb, rb)
    _check(*_pick(c, torch.zeros(N, dtype=torch.long)), ref, EXACT, "sphere-sphere")


def test_sphere_box_equals_coal_outside_and_with_the_centre_inside():
    """Sphere outside (face, edge and corner regions) and penetrating, including centres inside the
    box (distance to the nearest face, normal that face's)."""
    g = torch.Generator().manual_seed(4)
    r, s = 0.1, (0.4, 0.25, 0.15)
    Ra, pa, Rb, pb = _near(g, "sphere", (r,), "box", s, 0.3, depth=0.6)
    ref = _coal("sphere", (r,), Ra, pa, "box", s, Rb, pb)
    inside = geo.point_box(pa[:, None], Rb, pb, s)[0][:, 0] < 0
    assert int(inside.sum()) > 10 and int((ref[0] > 0).sum()) > N // 8
    c = geo.sphere_box(pa, r, Rb, pb, s)
    # a centre just outside the box has the normal of a short vector (centre minus its nearest box
    # point), rounded in both libraries: error ~ 1e-17 m / that length (measured 2.2e-12 at 2e-5 m)
    sdf = geo.point_box(pa[:, None], Rb, pb, s)[0][:, 0].abs()
    _check(*_pick(c, torch.zeros(N, dtype=torch.long)), ref, EXACT, "sphere-box",
           normal_tol=torch.clamp(1e-15 / sdf, min=EXACT))


def test_sphere_capsule_equals_coal():
    g = torch.Generator().manual_seed(5)
    r, s = 0.1, (0.05, 0.4)
    Ra, pa, Rb, pb = _near(g, "sphere", (r,), "capsule", s, 0.3)
    ref = _coal("sphere", (r,), Ra, pa, "capsule", s, Rb, pb)
    c = geo.sphere_capsule(pa, r, Rb, pb, s)
    _check(*_pick(c, torch.zeros(N, dtype=torch.long)), ref, EXACT, "sphere-capsule")


def _capsule_capsule_candidates_are_coal(Ra, pa, sa, Rb, pb, sb, what, tilt=None):
    """Candidates 1, 2 are a's end spheres against capsule b and 3, 4 b's end spheres against
    capsule a: each is coal's sphere-capsule answer. The least candidate is the capsule-capsule
    distance, which is the least of coal's capsule-capsule and those four (for parallel axes the
    distance is reached at an end). Candidate 0 (the closest axis points) is coal's capsule-capsule
    answer (phi, normal, points). ``tilt`` (rad, parallel and nearly parallel axes): the closest
    axis points are a whole segment, or nearly, and both coal's capsule-capsule and candidate 0 fall
    back to a point at an end of it, off the least distance by up to ``length * tilt`` (measured
    1.7e-8 m at tilt 8.7e-8 rad, coal and diffmech alike): candidate 0 is then compared to that bound,
    its normal to coal's, and the least candidate to the least end-sphere answer."""
    n = len(pa)
    c = geo.capsule_capsule(Ra, pa, sa, Rb, pb, sb)
    ref = _coal("capsule", sa, Ra, pa, "capsule", sb, Rb, pb)
    I = torch.eye(3, dtype=F64).expand(n, 3, 3)
    ends = []
    for k, end in enumerate((-1, 1)):
        e = pa + end * 0.5 * sa[1] * Ra[..., 2]
        r = _coal("sphere", (sa[0],), I, e, "capsule", sb, Rb, pb)
        _check(*_pick(c, torch.full((n,), 1 + k)), r, EXACT, f"{what}: a's end {k}")
        ends.append(r[0])
    for k, end in enumerate((-1, 1)):
        e = pb + end * 0.5 * sb[1] * Rb[..., 2]
        d, wb, wa, nb = _coal("sphere", (sb[0],), I, e, "capsule", sa, Ra, pa)  # normal from a to b: flip
        _check(*_pick(c, torch.full((n,), 3 + k)), (d, wa, wb, -nb), EXACT, f"{what}: b's end {k}")
        ends.append(d)
    least = torch.minimum(ref[0], torch.stack(ends, 1).min(1).values)
    worst = float((c.phi.min(1).values - least).abs().max())
    assert worst < EXACT, f"{what}: least candidate off the distance by {worst:.2e}"
    phi, point, normal = _pick(c, torch.zeros(n, dtype=torch.long))
    if tilt is None:
        _check(phi, point, normal, ref, EXACT, what)
    else:
        bound = max(sa[1], sb[1]) * tilt + EXACT
        assert ((phi - ref[0]).abs() <= bound).all() and ((phi - least).abs() <= bound).all()
        assert (normal - ref[3]).norm(dim=-1).max() < 1e-6


def test_capsule_capsule_equals_coal_rotated():
    g = torch.Generator().manual_seed(6)
    sa, sb = (0.05, 0.3), (0.08, 0.5)
    Ra, pa, Rb, pb = _near(g, "capsule", sa, "capsule", sb, 0.3)
    assert int((_coal("capsule", sa, Ra, pa, "capsule", sb, Rb, pb)[0] < 0).sum()) > N // 3
    _capsule_capsule_candidates_are_coal(Ra, pa, sa, Rb, pb, sb, "capsule-capsule")


def test_capsule_capsule_equals_coal_crossing_and_parallel():
    """Crossing at right angles (closest points inside both axes, edge-on-edge like), and parallel
    (anti-parallel too) with overlapping extents: a segment of closest points."""
    g = torch.Generator().manual_seed(7)
    sa, sb = (0.05, 0.3), (0.08, 0.5)
    Rb = _rotations(g, N)
    spin = torch.stack([_axis_rotation((0, 0, 1), float(a)) for a in torch.rand(N, generator=g, dtype=F64) * 6.3])
    Ra = Rb @ spin @ _axis_rotation((1, 0, 0), math.pi / 2)  # a's axis = b's x or y rotated: perpendicular
    pb = torch.zeros(N, 3, dtype=F64)
    gap = (torch.rand(N, dtype=F64, generator=g) - 0.6) * 0.05
    # a's centre: offset along the common perpendicular (b's axis x a's axis), inside both extents
    perp = torch.linalg.cross(Rb[..., 2], Ra[..., 2])
    along_b = (torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.4 * sb[1]
    along_a = (torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.4 * sa[1]
    pa = pb + (sa[0] + sb[0] + gap)[:, None] * perp + along_b[:, None] * Rb[..., 2] + along_a[:, None] * Ra[..., 2]
    _capsule_capsule_candidates_are_coal(Ra, pa, sa, Rb, pb, sb, "capsule-capsule crossing")
    # parallel and anti-parallel, overlapping along the axis, some exactly side by side
    flip = (torch.rand(N, generator=g, dtype=F64) < 0.5).to(F64) * math.pi
    tilt = torch.rand(N, generator=g, dtype=F64) * 1e-7
    tilt[::2] = 0.0  # exactly parallel (to rounding), or within 1e-7 rad
    Ra = Rb @ torch.stack([_axis_rotation((1, 0, 0), float(f)) @ _axis_rotation((0, 1, 0), float(e))
                           for f, e in zip(flip, tilt)])
    phase = torch.rand(N, dtype=F64, generator=g)[:, None] * 6.3  # a's axis beside b's, any side
    off = (sa[0] + sb[0] + gap)[:, None] * (Rb[..., 0] * torch.cos(phase) + Rb[..., 1] * torch.sin(phase))
    shift = (torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.3
    shift[::5] = 0.0
    pa = pb + off + shift[:, None] * Rb[..., 2]
    _capsule_capsule_candidates_are_coal(Ra, pa, sa, Rb, pb, sb, "capsule-capsule parallel", tilt=tilt)


def _old_third_candidate_gap(Ra, pa, sa, Rb, pb, sb):
    """What the capsule-box candidates reported before the fix: the axis point nearest the box centre."""
    a, b = pa - 0.5 * sa[1] * Ra[..., 2], pa + 0.5 * sa[1] * Ra[..., 2]
    c = torch.stack([a, b, geo._closest_on_segment(pb, a, b)], 1)
    return geo.point_box(c, Rb, pb, sb)[0].min(1).values - sa[0]


def test_capsule_box_equals_coal():
    """Candidates 0 and 1 are the capsule's end spheres against the box (coal's sphere-box), and the
    least candidate is the capsule-box distance (coal's, by GJK/EPA: measured to 2.3e-11 here, in
    penetration too), its normal and witness points. Regression (issue 34): the third candidate
    used to be the axis point nearest the box's centre, which missed a capsule across an edge or a
    corner by up to 6 cm at these poses."""
    g = torch.Generator().manual_seed(8)
    sa, sb = (0.05, 0.3), (0.4, 0.25, 0.15)
    Ra, pa, Rb, pb = _near(g, "capsule", sa, "box", sb, 0.3)
    ref = _coal("capsule", sa, Ra, pa, "box", sb, Rb, pb)
    assert int((ref[0] < 0).sum()) > N // 3
    c = geo.capsule_box(Ra, pa, sa, Rb, pb, sb)
    _check(*_pick(c, c.phi.argmin(1)), ref, GJK, "capsule-box")
    I = torch.eye(3, dtype=F64).expand(N, 3, 3)
    for k, end in enumerate((-1, 1)):
        e = pa + end * 0.5 * sa[1] * Ra[..., 2]
        _check(*_pick(c, torch.full((N,), k)), _coal("sphere", (sa[0],), I, e, "box", sb, Rb, pb), EXACT,
               f"capsule-box end {k}")
    old = _old_third_candidate_gap(Ra, pa, sa, Rb, pb, sb) - ref[0]
    assert float(old.max()) > 0.02  # the poses include the ones the old candidates missed


def test_capsule_across_a_box_edge_or_corner_equals_coal():
    """Capsules lying across an edge (axis perpendicular-ish to the edge, middle over it) and
    leaning on a corner: the nearest axis point is neither an end nor the point nearest the box
    centre."""
    g = torch.Generator().manual_seed(9)
    sa, sb = (0.03, 0.6), (0.4, 0.3, 0.2)
    Rb = _rotations(g, N)
    pb = torch.zeros(N, 3, dtype=F64)
    h = torch.tensor(sb, dtype=F64) / 2
    # a point on an edge or a corner of the box (box coordinates), the capsule's axis through a
    # point r + gap out from it along a direction in the edge's normal cone, axis perpendicular to it
    sgn = torch.where(torch.rand(N, 3, generator=g, dtype=F64) < 0.5, -1.0, 1.0)
    corner = sgn * h
    free = torch.randint(0, 4, (N,), generator=g)  # 0..2: that coordinate slides along an edge; 3: corner
    for i in range(3):
        m = free == i
        corner[m, i] = (torch.rand(int(m.sum()), generator=g, dtype=F64) - 0.5) * 1.6 * h[i]
    out = sgn * torch.rand(N, 3, generator=g, dtype=F64) + 0.05 * sgn
    for i in range(3):
        out[free == i, i] = 0.0
    out = out / out.norm(dim=-1, keepdim=True)
    gap = (torch.rand(N, dtype=F64, generator=g) - 0.6) * 0.02
    gap[::7] = 0.0
    axis = torch.linalg.cross(out, torch.randn(N, 3, dtype=F64, generator=g))
    axis = axis / axis.norm(dim=-1, keepdim=True)
    slide = (torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.4  # the touching point along the axis
    centre = corner + (sa[0] + gap)[:, None] * out + slide[:, None] * axis
    pa = (Rb @ centre[..., None])[..., 0] + pb
    z = Rb @ axis[..., None]
    x = torch.linalg.cross(z[..., 0], torch.randn(N, 3, dtype=F64, generator=g))
    x = x / x.norm(dim=-1, keepdim=True)
    Ra = torch.stack([x, torch.linalg.cross(z[..., 0], x), z[..., 0]], -1)
    ref = _coal("capsule", sa, Ra, pa, "box", sb, Rb, pb)
    c = geo.capsule_box(Ra, pa, sa, Rb, pb, sb)
    _check(*_pick(c, c.phi.argmin(1)), ref, GJK, "capsule across an edge")
    old = _old_third_candidate_gap(Ra, pa, sa, Rb, pb, sb) - ref[0]
    assert float((old > 1e-3).float().mean()) > 0.2


def test_capsule_across_a_narrower_box_face_is_held_at_the_face_edges():
    """A capsule lying across a box face narrower than it (axis in the face's plane, within 30
    degrees of the face's short side, both ends overhanging, gap -2..+2 mm): candidates 3 and 4 are
    the axis's crossings of the face's two side planes, each coal's sphere-box answer for a sphere
    of the capsule's radius there (exact); the least candidate is still coal's capsule-box distance
and normal."""
    g = torch.Generator().manual_seed(14)
    r, L, sb = 0.03, 0.6, (0.2, 0.4, 0.2)
    Rb = _rotations(g, N)
    pb = 0.1 * torch.randn(N, 3, dtype=F64, generator=g)
    psi = (torch.rand(N, dtype=F64, generator=g) - 0.5) * math.radians(60)
    axis = torch.stack([torch.cos(psi), torch.sin(psi), torch.zeros_like(psi)], -1)  # box coordinates
    gap = (torch.rand(N, dtype=F64, generator=g) - 0.5) * 4e-3
    mid = torch.stack([(torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.04,
                       (torch.rand(N, dtype=F64, generator=g) - 0.5) * 0.1, 0.1 + r + gap], -1)
    pa = pb + (Rb @ mid[..., None])[..., 0]
    z = (Rb @ axis[..., None])[..., 0]
    x = (Rb @ torch.tensor([0.0, 0.0, 1.0], dtype=F64)[:, None])[..., 0]
    Ra = torch.stack([x, torch.linalg.cross(z, x), z], -1)
    c = geo.capsule_box(Ra, pa, (r, L), Rb, pb, sb)
    ref = _coal("capsule", (r, L), Ra, pa, "box", sb, Rb, pb)
    # lying flat the least distance is reached along a segment: coal's witness is one of its points
    phi, _, normal = _pick(c, c.phi.argmin(1))
    assert (phi - ref[0]).abs().max() < GJK and (normal - ref[3]).norm(dim=-1).max() < GJK_DIRECTION
    I = torch.eye(3, dtype=F64).expand(N, 3, 3)
    for k, side in ((3, -1.0), (4, 1.0)):
        t = (side * 0.1 - mid[:, 0]) / axis[:, 0]  # the axis at the side plane x = +-0.1 (box coordinates)
        centre = pa + t[:, None] * z
        _check(*_pick(c, torch.full((N,), k)), _coal("sphere", (r,), I, centre, "box", sb, Rb, pb), EXACT,
               f"capsule across a narrower face, clipped end {k}")


def _face_aligned(Ra, Rb, n):
    axes = torch.cat([Ra.transpose(-1, -2), Rb.transpose(-1, -2)], 1)
    return (axes * n[:, None]).sum(-1).abs().max(1).values > 1 - 1e-9


def _sat(Ra, pa, sa, Rb, pb, sb):
    """The separating-axis test of two boxes, written out here as the oracle's side of it: the 15
    unit axes ``(n, 15, 3)`` (6 face normals, then a_i x b_j; NaN for parallel edges) and each one's
    separation ``(n, 15)`` (-inf for parallel edges)."""
    A, B = Ra.transpose(-1, -2), Rb.transpose(-1, -2)
    cr = torch.linalg.cross(A[:, :, None], B[:, None], dim=-1).flatten(1, 2)
    cn = cr.norm(dim=-1, keepdim=True)
    axes = torch.cat([A, B, torch.where(cn > 1e-6, cr / cn, torch.nan)], 1)
    ha, hb = torch.tensor(sa, dtype=F64) / 2, torch.tensor(sb, dtype=F64) / 2
    sep = ((axes * (pa - pb)[:, None]).sum(-1).abs() - ((axes @ Ra).abs() * ha).sum(-1)
           - ((axes @ Rb).abs() * hb).sum(-1))
    return axes, sep.nan_to_num(nan=-math.inf)


def _box_box_against_coal(Ra, pa, sa, Rb, pb, sb, what):
    """Every penetrating pose (the penetration of two boxes is along one of the 15 axes, so coal's
    EPA and the separating-axis test agree) and every separated pose whose coal normal is one of the
    15 axes, compared on the deepest candidate: phi, and where no second axis separates within 1e-9
    of the best (touching poses, where coal's normal is one of several) the normal and points too.
    Separated poses whose nearest features are a corner and a corner or an edge (normal on no axis)
    are left out: box_box reports the axis test's separation there, which is a lower bound. Returns
    coal's answers and the masks of penetrating and of edge-edge poses."""
    ref = _coal("box", sa, Ra, pa, "box", sb, Rb, pb)
    axes, sep = _sat(Ra, pa, sa, Rb, pb, sb)
    on_axis = ((axes * ref[3][:, None]).sum(-1).abs() > 1 - 1e-9).any(1)
    best, k = sep.max(1)
    other = ((axes * axes[torch.arange(len(k)), k][:, None]).sum(-1).abs() < 1 - 1e-6) & (sep > -math.inf)
    clear = best - torch.where(other, sep, -math.inf).max(1).values > 1e-9
    pen = ref[0] < 0
    c = geo.box_box(Ra, pa, sa, Rb, pb, sb)
    phi, point, normal = _pick(c, c.phi.argmin(1))
    both = pen | on_axis
    assert float((phi - ref[0])[both].abs().max()) < GJK, what
    _check(phi, point, normal, ref, GJK, what, mask=both & clear)
    assert int((both & ~clear).sum()) < len(k) // 20
    return ref, pen, ~_face_aligned(Ra, Rb, ref[3])


def test_box_box_equals_coal():
    """Random rotated poses, separated, touching and penetrating (169 of 300 here, 94 of them edge
    against edge; with the face axes only 15 of those 94 had no candidate and 19 were reported
    deeper than they are). coal runs GJK/EPA here: measured errors below 4e-11 (phi), 2e-13
    (normal) and 5e-10 (points, separated edges; 6e-11 in penetration)."""
    g = torch.Generator().manual_seed(10)
    sa, sb = (0.2, 0.3, 0.1), (0.4, 0.25, 0.15)
    Ra, pa, Rb, pb = _near(g, "box", sa, "box", sb, 0.3)
    _, pen, edge = _box_box_against_coal(Ra, pa, sa, Rb, pb, sb, "box-box")
    assert int((pen & ~edge).sum()) > N // 10 and int((pen & edge).sum()) > N // 10


def test_box_corner_inside_a_box_equals_coal():
    """A rotated box with one corner pushed 0..5 mm into a face of another (rotated) box, away from
    that face's edges: the deepest candidate is that corner, at coal's depth, normal and points."""
    g = torch.Generator().manual_seed(11)
    sa, sb = (0.2, 0.3, 0.1), (0.4, 0.25, 0.15)
    Ra, Rb = _rotations(g, N), _rotations(g, N)
    pb = 0.1 * torch.randn(N, 3, dtype=F64, generator=g)
    hb = torch.tensor(sb, dtype=F64) / 2
    face = torch.randint(0, 3, (N,), generator=g)
    sgn = torch.where(torch.rand(N, generator=g, dtype=F64) < 0.5, -1.0, 1.0)
    nloc = torch.nn.functional.one_hot(face, 3).to(F64) * sgn[:, None]
    spot = (torch.rand(N, 3, dtype=F64, generator=g) - 0.5) * hb  # within the middle half of the face
    spot = torch.where(nloc != 0, nloc * hb, spot)
    n = (Rb @ nloc[..., None])[..., 0]
    depth = 5e-3 * torch.rand(N, dtype=F64, generator=g)
    corners = geo._corners(Ra, torch.zeros(N, 3, dtype=F64), sa)
    low = corners[torch.arange(N), (corners * n[:, None]).sum(-1).argmin(1)]  # a's corner deepest along -n
    pa = pb + (Rb @ spot[..., None])[..., 0] - depth[:, None] * n - low
    ref = _coal("box", sa, Ra, pa, "box", sb, Rb, pb)
    assert (ref[0] + depth).abs().max() < GJK  # coal agrees with the construction
    c = geo.box_box(Ra, pa, sa, Rb, pb, sb)
    _check(*_pick(c, c.phi.argmin(1)), ref, GJK, "box corner in box")


def test_box_on_box_face_to_face_equals_coal():
    """Parallel faces (a box resting on another, random yaw and offset, gap -3..+2 mm): the gap and
    the normal are coal's, and the candidates at the least phi are the vertices of the contact
    patch -- the overlap of the two rectangles: every corner of either face over the other face
    and the crossings of their outlines (before the clipping only box corners were candidates, and
    a patch was held by 1 corner at 77 of these poses, or none where the rectangles cross like a
    plus sign)."""
    g = torch.Generator().manual_seed(12)
    sa, sb = (0.2, 0.3, 0.1), (0.4, 0.25, 0.15)
    Rb = _rotations(g, N)
    yaw = torch.stack([_axis_rotation((0, 0, 1), float(a)) for a in torch.rand(N, generator=g, dtype=F64) * 6.3])
    Ra = Rb @ yaw
    gap = (torch.rand(N, dtype=F64, generator=g) - 0.6) * 5e-3
    lateral = torch.cat([(torch.rand(N, 2, dtype=F64, generator=g) - 0.5) * 0.2, torch.zeros(N, 1, dtype=F64)], 1)
    pb = torch.zeros(N, 3, dtype=F64)
    above = lateral + torch.tensor([0, 0, 1.0], dtype=F64) * ((sa[2] + sb[2]) / 2 + gap)[:, None]
    pa = (Rb @ above[..., None])[..., 0]
    d, _, _, n = _coal("box", sa, Ra, pa, "box", sb, Rb, pb)
    assert (d - gap).abs().max() < GJK
    c = geo.box_box(Ra, pa, sa, Rb, pb, sb)
    rows = torch.arange(N)
    assert (c.phi.min(1).values - d).abs().max() < GJK
    assert (c.normal[rows, c.phi.argmin(1)] - n).norm(dim=-1).max() < GJK
    held = c.phi <= d[:, None] + GJK
    assert int(held.sum(1).min()) >= 3
    # in b's frame: the held points' (x, y) inside both rectangles, the corners of either face
    # strictly inside the other among them
    hb, ha = torch.tensor(sb, dtype=F64) / 2, torch.tensor(sa, dtype=F64) / 2
    pts = ((c.point - pb[:, None]) @ Rb)[..., :2]  # (N, 8, 2)
    in_a = ((c.point - pa[:, None]) @ Ra)[..., :2]
    assert (pts.abs() - hb[:2])[held].max() < 1e-9 and (in_a.abs() - ha[:2])[held].max() < 1e-9
    ca = ((geo._corners(Ra, pa, sa) - pb[:, None]) @ Rb)[..., :2]  # a's corners in b's frame
    cb = ((geo._corners(Rb, pb, sb) - pa[:, None]) @ Ra)[..., :2]  # b's in a's
    for corners, h, held_pts in ((ca, hb, pts), (cb, ha, in_a)):
        inside = ((corners.abs() - h[:2]) < -1e-6).all(-1)
        near = (corners[:, :, None] - held_pts[:, None]).norm(dim=-1).masked_fill(~held[:, None], math.inf)
        assert near.min(-1).values[inside].max() < 1e-9
    # a patch is held at its vertices: 3 to 8 of them
    assert set(held.sum(1).tolist()) - set(range(3, 9)) == set()


def test_box_edge_across_box_edge_equals_coal():
    """Two cubes turned 45 degrees about perpendicular axes, so that the top edge of b crosses the
    bottom edge of a, 1 mm deep: coal's depth is 1 mm along z, and box_box's one candidate (the
    edges' closest points) is coal's answer. Before the 9 edge axes were tested it had no candidate
    there (the upper cube fell through, see the scene test below)."""
    s = (0.2, 0.2, 0.2)
    Rb = _axis_rotation((1, 0, 0), math.pi / 4)[None]
    Ra = _axis_rotation((0, 1, 0), math.pi / 4)[None]
    pb = torch.zeros(1, 3, dtype=F64)
    pa = torch.tensor([[0.0, 0.0, 0.2 * math.sqrt(2) - 1e-3]], dtype=F64)
    ref = _coal("box", s, Ra, pa, "box", s, Rb, pb)
    assert abs(float(ref[0]) + 1e-3) < GJK
    c = geo.box_box(Ra, pa, s, Rb, pb, s)
    assert int((c.phi < 1e3).sum()) == 1
    _check(*_pick(c, c.phi.argmin(1)), ref, GJK, "edge across edge")


def test_box_edges_crossing_at_random_equal_coal():
    """Random poses, 94 of them penetrating (0..3.6 cm) with coal's normal an edge-edge axis
    (a_i x b_j): every one is coal's depth, normal and points (measured below 4e-11). With the face
    axes only, 91 of those 94 were off coal's depth by more than 1e-6 m: 9 had no candidate, 3 were
    reported deeper than they are."""
    g = torch.Generator().manual_seed(13)
    sa, sb = (0.3, 0.2, 0.25), (0.2, 0.35, 0.3)
    Ra, pa, Rb, pb = _near(g, "box", sa, "box", sb, 0.3)
    _, pen, edge = _box_box_against_coal(Ra, pa, sa, Rb, pb, sb, "box edges crossing")
    assert int((pen & edge).sum()) > N // 5


def test_box_on_an_equal_box_turned_45_degrees_equals_coal():
    """A cube on an equal cube turned 45 degrees about the vertical, 1 mm into it: no corner of
    either face lies over the other, the overlap is an octagon whose vertices are all outline
    crossings; they are the 8 candidates, at coal's depth and normal."""
    s = (0.3, 0.3, 0.1)
    Ra, Rb = _axis_rotation((0, 0, 1), math.pi / 4)[None], torch.eye(3, dtype=F64)[None]
    pa, pb = torch.tensor([[0.0, 0.0, 0.1 - 1e-3]], dtype=F64), torch.zeros(1, 3, dtype=F64)
    d, _, _, n = _coal("box", s, Ra, pa, "box", s, Rb, pb)
    assert abs(float(d) + 1e-3) < GJK
    c = geo.box_box(Ra, pa, s, Rb, pb, s)
    assert (c.phi - d).abs().max() < GJK and (c.normal - n).norm(dim=-1).max() < GJK
    t = 0.15 * math.tan(math.pi / 8)
    octagon = torch.tensor([(x, y) for a, b in ((0.15, t), (t, 0.15)) for x in (a, -a) for y in (b, -b)], dtype=F64)
    # each vertex held, to the 1e-9 of the size by which box_box widens the reference face (measured 4.2e-10)
    assert (c.point[0, :, None, :2] - octagon).norm(dim=-1).min(0).values.max() < 1e-9
    assert (c.point[0, :, 2] - (0.05 - 0.5e-3)).abs().max() < 1e-12  # halfway into the overlap


def test_box_box_in_float32_is_float64_rounded():
    g = torch.Generator().manual_seed(10)
    sa, sb = (0.2, 0.3, 0.1), (0.4, 0.25, 0.15)
    Ra, pa, Rb, pb = _near(g, "box", sa, "box", sb, 0.3, n=100)
    c64 = geo.box_box(Ra, pa, sa, Rb, pb, sb)
    c32 = geo.box_box(Ra.float(), pa.float(), sa, Rb.float(), pb.float(), sb)
    assert c32.phi.dtype == torch.float32
    assert float((c32.phi.min(1).values.double() - c64.phi.min(1).values).abs().max()) < 1e-5  # measured 1.1e-6


def _gradcheck_pair(fn, *args):
    def f(*xs):
        c = fn(*xs)
        return c.phi.clamp_max(10.0), c.point, c.normal  # unused slots (1 km) are constants
    xs = [x.detach().clone().requires_grad_() for x in args]
    assert torch.autograd.gradcheck(f, xs, eps=1e-7, atol=1e-6, rtol=1e-5)


def test_box_box_and_capsule_box_gradients_are_finite_differences():
    """Every candidate's phi, point and normal w.r.t. both poses (the rotation matrices' entries as
    given) and both sizes, float64, at poses away from the switches (axis, faces, clipping): the
    face case with clipped crossings, the edge case, and a capsule held at its clipped ends."""
    g = torch.Generator().manual_seed(10)
    sa, sb = (0.2, 0.3, 0.1), (0.4, 0.25, 0.15)
    Ra, pa, Rb, pb = _near(g, "box", sa, "box", sb, 0.3, n=40)
    ref = _coal("box", sa, Ra, pa, "box", sb, Rb, pb)
    edge = ~_face_aligned(Ra, Rb, ref[3])
    za, zb = torch.tensor(sa, dtype=F64), torch.tensor(sb, dtype=F64)
    for kind in (edge, ~edge):
        for i in (kind & (ref[0] < 0)).nonzero()[:2, 0].tolist():
            _gradcheck_pair(geo.box_box, Ra[i:i + 1], pa[i:i + 1], za, Rb[i:i + 1], pb[i:i + 1], zb)
    r, L = 0.03, 0.5
    Rb = _axis_rotation((0.3, 1, 0.2), 0.7)[None]
    pb = torch.tensor([[0.1, 0.2, 0.3]], dtype=F64)
    Ra = Rb @ (_axis_rotation((0, 0, 1), 0.3) @ _axis_rotation((0, 1, 0), math.pi / 2 + 0.01))[None]
    pa = pb + (Rb @ torch.tensor([0.01, 0.02, 0.1 + r - 1e-3], dtype=F64)[:, None])[..., 0]
    assert int((geo.capsule_box(Ra, pa, (r, L), Rb, pb, (0.2, 0.4, 0.2)).phi < 1e3).sum()) == 5
    _gradcheck_pair(geo.capsule_box, Ra, pa, torch.tensor([r, L], dtype=F64), Rb, pb,
                    torch.tensor([0.2, 0.4, 0.2], dtype=F64))


# ------------------------------------------------------------------ in a simulated scene
def _quat_about(axis, angle):  # (x, y, z, w)
    s = math.sin(angle / 2)
    return [s * axis[0], s * axis[1], s * axis[2], math.cos(angle / 2)]


def test_capsule_rests_on_a_box():
    """A capsule (its ends over the box's top face) dropped 1 cm onto a free box on the ground: at
    rest the capsule's centre is at box height + radius, the box's at half its height, and both
    still (after 0.3 s)."""
    r, L = 0.03, 0.3
    scene = Scene({"box": systems.box((0.4, 0.3, 0.2), 5.0, name="box"), "cap": systems.capsule(r, L, 0.5, name="cap")},
                  friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, 0.1], dtype=F64)
    q[7:10] = torch.tensor([0.02, 0.01, 0.2 + r + 0.01], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((0.0, 1.0, 0.0), math.pi / 2), dtype=F64)  # axis along x, ends over the face
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(300, scene.nv, dtype=F64), 1e-3)
    assert abs(float(Q[-1, 9]) - (0.2 + r)) < 1e-12  # measured 3e-17 m
    assert abs(float(Q[-1, 2]) - 0.1) < 1e-12  # measured 3e-17 m
    assert float(V[-1].abs().max()) < 1e-11  # measured 8e-14 m/s


def test_capsule_leaning_on_a_box_edge_stays():
    """Regression (issue 34): a capsule leaning 30 degrees, its lower end on the ground and its
    side on the top edge of a box, placed exactly touching both, stays where it is (friction 1 holds
    it). With the old capsule-box candidates (the axis point nearest the box centre, not the edge)
    it sank 4 cm into the edge in 0.1 s; measured now: drift < 1e-15 m over 0.4 s."""
    r, L, a = 0.03, 0.6, math.radians(30)
    x0 = 0.2 + ((0.2 - r) * math.cos(a) + r) / math.sin(a)  # lower end's centre: axis r from the edge
    u = torch.tensor([-math.cos(a), 0.0, math.sin(a)], dtype=F64)
    scene = Scene({"box": systems.box((0.4, 0.4, 0.2), 5.0, name="box"), "cap": systems.capsule(r, L, 0.5, name="cap")},
                  friction=1.0)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, 0.1], dtype=F64)
    q[7:10] = torch.tensor([x0, 0.0, r], dtype=F64) + 0.5 * L * u
    q[10:14] = torch.tensor(_quat_about((0.0, 1.0, 0.0), math.atan2(float(u[0]), float(u[2]))), dtype=F64)
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(400, scene.nv, dtype=F64), 1e-3)
    assert float((Q[-1] - q).abs().max()) < 1e-12  # measured 1.1e-16
    assert float(V[-1].abs().max()) < 1e-12  # measured 1e-14


def test_two_capsules_crossing_rest_on_each_other():
    """Capsule b dropped 5 cm crosswise onto the middle of capsule a lying on the ground: b comes to
    rest at 2 r_a + r_b, a at r_a, both still (after 0.4 s)."""
    ra, rb = 0.04, 0.03
    scene = Scene({"a": systems.capsule(ra, 0.5, 1.0, name="a"), "b": systems.capsule(rb, 0.4, 0.5, name="b")},
                  friction=0.5)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, ra], dtype=F64)
    q[3:7] = torch.tensor(_quat_about((0.0, 1.0, 0.0), math.pi / 2), dtype=F64)  # a along x
    q[7:10] = torch.tensor([0.0, 0.0, 2 * ra + rb + 0.05], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((1.0, 0.0, 0.0), math.pi / 2), dtype=F64)  # b along y
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(400, scene.nv, dtype=F64), 1e-3)
    assert abs(float(Q[-1, 9]) - (2 * ra + rb)) < 1e-12  # measured 8e-17 m
    assert abs(float(Q[-1, 2]) - ra) < 1e-12  # measured 8e-17 m
    assert float(V[-1].abs().max()) < 1e-11  # measured 3e-13 m/s


def _still(scene, q, steps=200, dt=1e-3):
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(steps, scene.nv, dtype=F64), dt)
    return Q, V


def test_cube_on_an_equal_cube_turned_45_degrees_rests():
    """The octagon of outline crossings holds the upper cube: over 0.2 s its centre stays 2 h above
    the lower one's (measured 2e-15 m); with box corners only it fell through (0.2 m in 0.2 s)."""
    h = 0.1
    scene = Scene({"b": systems.box((2 * h,) * 3, 1.0, name="b"), "a": systems.box((2 * h,) * 3, 1.0, name="a")},
                  friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, h], dtype=F64)
    q[7:10] = torch.tensor([0.0, 0.0, 3 * h], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((0.0, 0.0, 1.0), math.pi / 4), dtype=F64)
    Q, V = _still(scene, q)
    assert float((Q[:, 9] - Q[:, 2] - 2 * h).abs().max()) < 1e-9  # measured 2.1e-15 m
    assert float((Q[:, 2] - h).abs().max()) < 1e-9
    assert float(V.abs().max()) < 1e-8  # measured 1.1e-10


def test_box_edge_on_a_box_overhanging_its_edge_rests():
    """A cube turned 45 degrees about x lies on its lower edge on a box's top face, half of that
    edge overhanging the box's side (the cube's centre over the box's edge): the clipped edge,
    from the cube's corner to the box's edge, holds it (measured drift 1e-17 m); with box corners
    only, one corner held it and it tipped off (7 cm down in 0.2 s)."""
    h = 0.1
    scene = Scene({"b": systems.box((0.4, 0.4, 0.2), 5.0, name="b"), "a": systems.box((2 * h,) * 3, 1.0, name="a")},
                  friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, 0.1], dtype=F64)
    q[7:10] = torch.tensor([0.2, 0.05, 0.2 + h * math.sqrt(2)], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((1.0, 0.0, 0.0), math.pi / 4), dtype=F64)
    Q, V = _still(scene, q)
    assert float((Q - q).abs().max()) < 1e-12  # measured 7.8e-18
    assert float(V.abs().max()) < 1e-12  # measured 4e-15 m/s


def test_cube_edge_across_a_cube_edge_balances():
    """Test ``test_box_edge_across_box_edge_equals_coal``'s cubes in a scene: the lower one on its
    edge on the ground, the upper one's edge across its top edge, one edge-edge contact holding it
    (a balanced, unstable rest: rounding grows only 5-fold in 0.2 s). Measured: height within 2e-15
    m, speeds below 5e-11; with face axes only the upper cube fell through."""
    h = 0.1
    scene = Scene({"b": systems.box((2 * h,) * 3, 1.0, name="b"), "a": systems.box((2 * h,) * 3, 1.0, name="a")},
                  friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, h * math.sqrt(2)], dtype=F64)
    q[3:7] = torch.tensor(_quat_about((1.0, 0.0, 0.0), math.pi / 4), dtype=F64)
    q[7:10] = torch.tensor([0.0, 0.0, 3 * h * math.sqrt(2)], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((0.0, 1.0, 0.0), math.pi / 4), dtype=F64)
    Q, V = _still(scene, q)
    assert float((Q[:, 9] - 3 * h * math.sqrt(2)).abs().max()) < 1e-9
    assert float(V.abs().max()) < 1e-8


def test_capsule_across_a_narrower_box_stays_still():
    """A capsule lying across a box 0.2 m wide, 0.15 m of it overhanging on each side: held at the
    box's two edges (the clipped axis) as well as at its middle it does not rock (measured angular
    speed 3e-13 rad/s); held at the middle only it rocked at +-0.044 rad/s."""
    r, L = 0.03, 0.5
    scene = Scene({"box": systems.box((0.2, 0.4, 0.2), 5.0, name="box"), "cap": systems.capsule(r, L, 0.5, name="cap")},
                  friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.0, 0.0, 0.1], dtype=F64)
    q[7:10] = torch.tensor([0.01, 0.02, 0.2 + r], dtype=F64)
    q[10:14] = torch.tensor(_quat_about((0.0, 1.0, 0.0), math.pi / 2), dtype=F64)  # axis along x
    Q, V = _still(scene, q, steps=300)
    assert float(V[:, 9:12].abs().max()) < 1e-9  # the capsule's angular velocity
    assert float((Q - q).abs().max()) < 1e-12  # measured 5e-16
