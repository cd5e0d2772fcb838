"""Narrow phase of convex polytopes (mesh collision shapes taken as their convex hulls), batched.

Same conventions as :mod:`diffmech.contact.geometry`: placements ``R (..., 3, 3)``, ``p (..., 3)``
in the world, a :class:`~diffmech.contact.geometry.Candidates` of fixed ``k`` per pair with the
signed distance ``phi`` (m, negative in penetration), the point halfway between the two surfaces and
the unit normal from shape b to shape a.

A :class:`ConvexHull` holds a hull's vertices (shape frame, m) and its topology: outward face
normals, one vertex of each face, and its edges with the two faces beside each (edges between
coplanar triangles dropped). :func:`hull_from_points` builds one with ``trimesh``, keeping at most
:data:`MAX_VERTICES` vertices (a larger hull is replaced by the hull of a farthest-point sample of
its vertices, an inner approximation whose depth is stored in ``ConvexHull.simplified``), because
the cost of a pair grows with the vertex count (GJK) and the edge count squared (penetration).

Algorithms. Separated pairs: GJK on the vertices (closest point of each simplex to the origin by
enumerating its sub-simplices), run without the graph; the final simplex names the closest features
(vertex, edge or face of each shape), and the distance, points and normal are recomputed with the
graph as the projection of the origin on the affine hull of those features' Minkowski differences,
so their gradients are the closed-form ones of the active features, not a differentiation of the
iterations. Penetrating pairs (GJK distance below 1e-9 of the size): the separating-axis test,
exact for polytopes: the face normals of both shapes and the cross products of the edge pairs that
form a face of the Minkowski difference (the Gauss-map arc test), the axis of least penetration
chosen without the graph and its depth, points and normal closed forms of the poses. A sphere is a
point with a radius, a capsule a segment with a radius, a box an 8-vertex polytope whose vertices
follow its size. Besides that closest pair, a pair reports the deepest vertices of each shape
against the other's supporting plane normal to the contact normal where their feet lie on the other
shape (:func:`_manifold`), so that a face resting on a face is held at its corners, not rocking on
one point.

Cost (float64, one CPU thread of a shared machine, a 48-vertex hull of the Panda's ``link3``
against itself): convex-plane 0.15 ms at batch 1 and 1.8 ms at batch 1024; convex-convex 5 ms
(separated) and 12 ms (penetrating) at batch 1, 154 ms and 1.2 s at batch 1024; coal takes 10 us
per convex-convex pair and 2 us per convex-halfspace pair (a Python loop over the pairs
included). Small batches pay torch's per-operation overhead over GJK's ~10 iterations; large
penetrating ones the separating-axis test's edge-pair table (``Ea x Eb`` Gauss-map tests).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..errors import ModelError
from .geometry import Candidates, closest_points_segments

__all__ = ["ConvexHull", "hull_from_points", "MAX_VERTICES", "convex_plane", "convex_convex", "convex_box",
           "convex_sphere", "convex_capsule", "PLANE_CANDIDATES"]

MAX_VERTICES = 48  # hull vertices kept (see the module docstring)
PLANE_CANDIDATES = 8  # the deepest vertices a hull reports against the ground plane
_CHUNK = 128  # pairs per separating-axis table
_FAR = 1e3  # m: phi of a candidate slot not used
MANIFOLD = 8  # the vertices of each shape a pair adds to its closest points (see _manifold)


@dataclass(frozen=True, eq=False)
class ConvexHull:
    """A convex polytope in its shape frame (compared by identity; built by :func:`hull_from_points`).

    Attributes:
        vertices: ``(V, 3)`` float64, m.
        normals: ``(F, 3)`` outward unit face normals.
        face_vertex: ``(F,)`` a vertex index on each face (its plane: ``normals[f] . x = normals[f] .
            vertices[face_vertex[f]]``).
        edges: ``(E, 2)`` vertex indices of each edge between two non-coplanar faces.
        edge_faces: ``(E, 2)`` the two faces beside each edge.
        triangles: ``(T, 3)`` the hull's triangles (for drawing and for coal).
        simplified: ``0.0``, or the largest distance (m) of a dropped vertex outside the kept hull.
    """

    vertices: np.ndarray
    normals: np.ndarray
    face_vertex: np.ndarray
    edges: np.ndarray
    edge_faces: np.ndarray
    triangles: np.ndarray
    simplified: float = 0.0

    @property
    def radius(self) -> float:
        """Largest distance of a vertex from the shape's origin, m."""
        return float(np.linalg.norm(self.vertices, axis=1).max())

    def tensors(self, dtype, device) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """``(vertices, normals, face_vertex, edges, edge_faces)`` as tensors, cached per dtype and device."""
        return _tensors(self, dtype, device)


@functools.lru_cache(maxsize=512)
def _tensors(h: ConvexHull, dtype, device):
    return (torch.tensor(h.vertices, dtype=dtype, device=device),
            torch.tensor(h.normals, dtype=dtype, device=device),
            torch.tensor(h.face_vertex, dtype=torch.long, device=device),
            torch.tensor(h.edges, dtype=torch.long, device=device),
            torch.tensor(h.edge_faces, dtype=torch.long, device=device))


def _topology(mesh) -> tuple[np.ndarray, ...]:
    """Normals, a vertex per face, the edges between non-coplanar faces and their faces, of a trimesh hull."""
    normals = np.asarray(mesh.face_normals, dtype=np.float64)
    faces = np.asarray(mesh.faces, dtype=np.int64)
    adj = np.asarray(mesh.face_adjacency, dtype=np.int64).reshape(-1, 2)
    edges = np.asarray(mesh.face_adjacency_edges, dtype=np.int64).reshape(-1, 2)
    # an edge inside a planar facet (two coplanar triangles) is no edge of the polytope
    bend = np.einsum("ij,ij->i", normals[adj[:, 0]], normals[adj[:, 1]]) < 1.0 - 1e-10
    return normals, faces[:, 0].copy(), edges[bend], adj[bend], faces


def hull_from_points(points, *, max_vertices: int = MAX_VERTICES, where: str = "convex hull") -> ConvexHull:
    """The convex hull of ``points (N, 3)`` (m), with at most ``max_vertices`` vertices.

    A hull with more vertices is replaced by the hull of ``max_vertices`` of them: four spread ones
    (farthest-point sampling from the vertex farthest from the centroid), then each the vertex
    farthest outside the hull of those before it: an inner approximation; ``simplified`` records how
    far the farthest dropped vertex lies outside it (measured: 1.5 to 5.1 mm on the links of the
    Panda and the KUKA iiwa of ``pybullet_data`` at 48 vertices, 4 to 11 mm at 32).

    Raises:
        ModelError: fewer than 4 points not all in a plane (``where`` names the culprit).
    """
    import trimesh

    pts = np.asarray(points, dtype=np.float64).reshape(-1, 3)
    if len(pts) < 4 or not np.isfinite(pts).all():
        raise ModelError(f"{where}: a convex shape needs at least 4 finite points, got {len(pts)}")
    try:
        hull = trimesh.convex.convex_hull(pts)
    except Exception as exc:  # qhull refuses flat or degenerate point sets
        raise ModelError(f"{where}: no convex hull of {len(pts)} points ({type(exc).__name__}: {exc})") from None
    if hull.volume <= 0 or len(hull.vertices) < 4:
        raise ModelError(f"{where}: the points are flat (no volume); not a convex solid")
    simplified = 0.0
    if len(hull.vertices) > max_vertices:
        v = np.asarray(hull.vertices)
        # the 4 points of a large tetrahedron, then greedily the vertex farthest outside the hull kept
        pick = [int(np.argmax(np.linalg.norm(v - v.mean(0), axis=1)))]
        d = np.linalg.norm(v - v[pick[0]], axis=1)
        for _ in range(3):
            pick.append(int(np.argmax(d)))
            d = np.minimum(d, np.linalg.norm(v - v[pick[-1]], axis=1))
        while True:
            small = trimesh.convex.convex_hull(v[pick])
            out = (v @ small.face_normals.T - np.einsum("ij,ij->i", small.face_normals, small.triangles[:, 0])).max(1)
            if len(pick) == max_vertices:
                break
            pick.append(int(np.argmax(out)))
        simplified = float(max(out.max(), 0.0))
        hull = small
    normals, fv, edges, edge_faces, tris = _topology(hull)
    return ConvexHull(np.asarray(hull.vertices, dtype=np.float64).copy(), normals, fv, edges, edge_faces, tris,
                      simplified)


@functools.lru_cache(maxsize=1)
def _unit_box() -> ConvexHull:
    """The cube ``[-1/2, 1/2]^3`` as a hull; a box's vertices are these times its side lengths (its
    normals and edges do not change with the sides)."""
    corners = np.array([[x, y, z] for x in (-0.5, 0.5) for y in (-0.5, 0.5) for z in (-0.5, 0.5)])
    return hull_from_points(corners, where="unit box")


# ------------------------------------------------------------------ shapes as vertex sets
class _Poly:
    """One side of a pair in the world: vertices ``v (B, V, 3)``, face normals ``n (B, F, 3)`` and
    offsets ``d (B, F)`` (``n . x <= d`` inside), edges and their faces (index tensors), a radius."""

    def __init__(self, local: Tensor, R: Tensor, p: Tensor, normals=None, face_vertex=None, edges=None,
                 edge_faces=None, radius=0.0):
        self.v = p[:, None] + local @ R.transpose(-1, -2)
        self.radius = radius
        self.edges, self.edge_faces = edges, edge_faces
        if normals is not None:
            self.n = normals @ R.transpose(-1, -2)
            self.d = (self.n * self.v[:, face_vertex]).sum(-1)
        else:
            self.n = self.d = None


def _hull_poly(hull: ConvexHull, scale, R: Tensor, p: Tensor) -> _Poly:
    v, n, fv, e, ef = hull.tensors(p.dtype, p.device)
    s = scale[0] if not isinstance(scale, Tensor) else scale.to(p.dtype).reshape(-1)[0]
    return _Poly(v * s, R, p, n, fv, e, ef)


def _box_poly(size, R: Tensor, p: Tensor) -> _Poly:
    v, n, fv, e, ef = _unit_box().tensors(p.dtype, p.device)
    s = size if isinstance(size, Tensor) else torch.tensor(size, dtype=p.dtype, device=p.device)
    return _Poly(v * s.to(p.dtype), R, p, n, fv, e, ef)


# ------------------------------------------------------------------ GJK (no graph)
_SUBSETS = [s for k in (1, 2, 3, 4) for s in itertools.combinations(range(4), k)]


def _dot(x: Tensor, y: Tensor) -> Tensor:
    return (x * y).sum(-1)


def _affine(P: Tensor) -> tuple[Tensor, Tensor]:
    """Barycentric coordinates ``(..., s)`` of the origin's projection on the affine hull of the
    points ``P (..., s, 3)`` (s = 1 to 4; 4: the origin itself, in the tetrahedron's coordinates) in
    closed form (Cramer's rule: batched small solves cost far more), and whether the points are
    affinely dependent ``(...)`` (then the coordinates are meaningless)."""
    s = P.shape[-2]
    P0 = P[..., 0, :]
    if s == 1:
        return torch.ones_like(P[..., 0]), torch.zeros_like(P0[..., 0], dtype=torch.bool)
    D = P[..., 1:, :] - P0[..., None, :]
    if s == 2:
        d = D[..., 0, :]
        dd = _dot(d, d)
        flat = dd <= 1e-24 * _dot(P0, P0).clamp_min(1e-300)
        mu = (-_dot(d, P0) / torch.where(flat, torch.ones_like(dd), dd))[..., None]
    elif s == 3:
        d1, d2 = D[..., 0, :], D[..., 1, :]
        a, b, c = _dot(d1, d1), _dot(d1, d2), _dot(d2, d2)
        r1, r2 = -_dot(d1, P0), -_dot(d2, P0)
        det = a * c - b * b
        flat = det <= 1e-12 * a * c
        det = torch.where(flat, torch.ones_like(det), det)
        mu = torch.stack([(c * r1 - b * r2) / det, (a * r2 - b * r1) / det], -1)
    else:
        d1, d2, d3 = D[..., 0, :], D[..., 1, :], D[..., 2, :]
        c23 = torch.linalg.cross(d2, d3, dim=-1)
        det = _dot(d1, c23)
        flat = det.abs() <= 1e-12 * d1.norm(dim=-1) * d2.norm(dim=-1) * d3.norm(dim=-1)
        det = torch.where(flat, torch.ones_like(det), det)
        mu = torch.stack([-_dot(P0, c23), -_dot(d1, torch.linalg.cross(P0, d3, dim=-1)),
                          -_dot(d1, torch.linalg.cross(d2, P0, dim=-1))], -1) / det[..., None]
    return torch.cat([1 - mu.sum(-1, keepdim=True), mu], -1), flat


@functools.lru_cache(maxsize=8)
def _subset_tables(device) -> tuple[list[Tensor], Tensor, Tensor]:
    """The 15 non-empty subsets of a simplex's 4 slots, grouped by size: index tensors ``(G_s, s)``,
    and for all 15 in that order their slot masks ``(15, 4)`` and sizes ``(15,)``."""
    groups = [[s for s in _SUBSETS if len(s) == k] for k in (1, 2, 3, 4)]
    idx = [torch.tensor(g, dtype=torch.long, device=device) for g in groups]
    masks = torch.tensor([[i in s for i in range(4)] for g in groups for s in g], device=device)
    sizes = torch.tensor([len(s) for g in groups for s in g], device=device)
    return idx, masks, sizes


def _simplex_closest(W: Tensor, used: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Closest point to the origin of the simplices ``W (B, 4, 3)`` (slots ``used (B, 4)``): the
    least distance over the sub-simplices whose projection of the origin on their affine hull has
    positive barycentric coordinates (the smallest such sub-simplex on a tie). Returns the point
    ``(B, 3)``, the chosen slots ``(B, 4)`` and their barycentric weights ``(B, 4)`` (zero elsewhere).
    The sub-simplices of one size are evaluated together (few operations: what costs at small batches)."""
    B = W.shape[0]
    idx, masks, _ = _subset_tables(W.device)
    dists, lams = [], []
    for ix in idx:
        P = W[:, ix]  # (B, G, size, 3)
        lam, flat = _affine(P)
        ok = used[:, ix].all(-1) & ~flat & (lam >= 0).all(-1)
        x = (lam[..., None] * P).sum(-2)
        dists.append(torch.where(ok, (x * x).sum(-1), torch.full_like(flat, torch.inf, dtype=W.dtype)))
        full = torch.zeros(B, ix.shape[0], 4, dtype=W.dtype, device=W.device)
        lams.append(full.scatter(2, ix.expand(B, -1, -1), lam))
    dist = torch.cat(dists, 1)  # (B, 15), sizes ascending
    lam = torch.cat(lams, 1)  # (B, 15, 4)
    # the least distance; among those within rounding of it, the first (smallest) sub-simplex
    best = dist.min(1, keepdim=True).values
    pick = (dist <= best * (1 + 1e-12)).to(torch.int8).argmax(1)
    lam_out = lam[torch.arange(B, device=W.device), pick]
    return (lam_out[..., None] * W).sum(1), masks[pick], lam_out


def _support(v: Tensor, d: Tensor) -> Tensor:
    """Index ``(B,)`` of the vertex of ``v (B, V, 3)`` furthest along ``d (B, 3)``."""
    return (v @ d[..., None])[..., 0].argmax(1)


def _gjk(va: Tensor, vb: Tensor, iterations: int = 100) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """GJK on vertex sets ``va (B, Va, 3)``, ``vb (B, Vb, 3)`` (no graph). Returns the distance
    ``(B,)`` and the final simplex: vertex indices in a and in b ``(B, 4)`` and the slots used ``(B, 4)``
    (at most 3 where the sets are apart; 4 where the origin is inside the Minkowski difference)."""
    B = va.shape[0]
    dev = va.device
    ar = torch.arange(B, device=dev)
    ia = torch.zeros(B, 4, dtype=torch.long, device=dev)
    ib = torch.zeros(B, 4, dtype=torch.long, device=dev)
    used = torch.zeros(B, 4, dtype=torch.bool, device=dev)
    v = va.mean(1) - vb.mean(1)
    v = torch.where(v.norm(dim=-1, keepdim=True) > 0, v, torch.ones_like(v))
    done = torch.zeros(B, dtype=torch.bool, device=dev)
    size = (va.detach().abs().amax((1, 2)) + vb.detach().abs().amax((1, 2))).clamp_min(1e-300)
    tiny = (1e-14 * size) ** 2
    for it in range(iterations):
        ja, jb = _support(va, -v), _support(vb, v)
        w = va[ar, ja] - vb[ar, jb]
        vv = (v * v).sum(-1)
        # no progress along v: v is the closest point (relative test; the absolute one for touching);
        # the first v (centroids' difference) is no point of the simplex
        stop = (vv - (v * w).sum(-1) <= 1e-13 * vv + tiny) & (it > 0)
        dup = ((ia == ja[:, None]) & (ib == jb[:, None]) & used).any(1)
        done = done | stop | dup
        if bool(done.all()):
            break
        free = (~used).long().argmax(1)  # a free slot (there is one: a full simplex holds the origin)
        put = ~done
        ia[ar[put], free[put]] = ja[put]
        ib[ar[put], free[put]] = jb[put]
        used[ar[put], free[put]] = True
        W = va[ar[:, None], ia] - vb[ar[:, None], ib]
        x, slots, _ = _simplex_closest(W, used)
        used = torch.where(put[:, None], slots, used)
        v = torch.where(put[:, None], x, v)
        # rounding can make the new simplex's closest point no nearer than the last (a cycle): stop
        inside = put & ((v * v).sum(-1) <= tiny)
        done = done | inside | (put & ((v * v).sum(-1) >= vv * (1 - 1e-14)) & (it > 0))
    return v.norm(dim=-1), ia, ib, used


def _closest(pa: _Poly, pb: _Poly, ia: Tensor, ib: Tensor, used: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """With the graph: the projection of the origin on the affine hull of the final simplex's
    Minkowski points (slots ``used``): the distance ``(B,)`` and the closest points on a and on b
    ``(B, 3)`` (the vertex sets, before radii)."""
    B = ia.shape[0]
    ar = torch.arange(B, device=ia.device)[:, None]
    A, Bv = pa.v[ar, ia], pb.v[ar, ib]  # (B, 4, 3)
    W = A - Bv
    with torch.no_grad():
        _, slots, lam0 = _simplex_closest(W.detach(), used)
        count = slots.sum(1)
        order = torch.sort((~slots).to(torch.int8), dim=1, stable=True).indices  # chosen slots first
    W, A, Bv = (x.gather(1, order[..., None].expand(-1, -1, 3)) for x in (W, A, Bv))
    lam = torch.zeros(B, 4, dtype=W.dtype, device=W.device)
    for k in (1, 2, 3):
        sel = count == k
        if not bool(sel.any()):
            continue
        lk = _affine(W[sel, :k])[0]
        lam = lam.index_put((sel.nonzero()[:, 0],), torch.nn.functional.pad(lk, (0, 4 - k)))
    a = (lam[..., None] * A).sum(1)
    b = (lam[..., None] * Bv).sum(1)
    return (a - b).norm(dim=-1), a, b


# ------------------------------------------------------------------ separating axes (penetration)
def _sat(pa: _Poly, pb: _Poly) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Least penetration of a and b (vertex sets; b may be a point or a segment, with no faces) by
    the separating-axis test: the separation ``(B,)`` (negative: depth) along the best axis, the unit
    normal from b to a ``(B, 3)`` and the points of a and of b that realise it ``(B, 3)``. The axis is
    chosen without the graph; the rest is a closed form of the poses."""
    B = pa.v.shape[0]
    dev, dt = pa.v.device, pa.v.dtype
    ar = torch.arange(B, device=dev)
    cands = []  # (separation (B, m) without graph, kind, payload)
    with torch.no_grad():
        # faces of a: b's vertex deepest along -n
        hb = pa.n.detach() @ pb.v.detach().transpose(1, 2)  # (B, Fa, Vb)
        s_fa, jb = (hb.min(2).values - pa.d.detach()), hb.argmin(2)
        best_fa, fa = s_fa.max(1)
        cands.append(best_fa)
        if pb.n is not None:
            ha = pb.n.detach() @ pa.v.detach().transpose(1, 2)
            s_fb, ja = (ha.min(2).values - pb.d.detach()), ha.argmin(2)
            best_fb, fb = s_fb.max(1)
        else:
            best_fb = torch.full((B,), -torch.inf, dtype=dt, device=dev)
        cands.append(best_fb)
        best_e = torch.full((B,), -torch.inf, dtype=dt, device=dev)
        ea_i = eb_i = torch.zeros(B, dtype=torch.long, device=dev)
        if pa.edges is not None and len(pa.edges) and pb.edges is not None and len(pb.edges):
            va, vb = pa.v.detach(), pb.v.detach()
            a0, a1 = va[:, pa.edges[:, 0]], va[:, pa.edges[:, 1]]  # (B, Ea, 3)
            b0, b1 = vb[:, pb.edges[:, 0]], vb[:, pb.edges[:, 1]]
            da, db = a1 - a0, b1 - b0
            na1, na2 = pa.n.detach()[:, pa.edge_faces[:, 0]], pa.n.detach()[:, pa.edge_faces[:, 1]]
            Ea, Eb = da.shape[1], db.shape[1]
            # which edge pairs can give an axis: matrix products only (the costly part is elementwise)
            if pb.n is not None:  # Gauss-map arcs of a and of -b must cross (a face of the Minkowski difference)
                c, d = -pb.n.detach()[:, pb.edge_faces[:, 0]], -pb.n.detach()[:, pb.edge_faces[:, 1]]
                bxa = torch.linalg.cross(na2, na1, dim=-1)  # (B, Ea, 3)
                dxc = torch.linalg.cross(d, c, dim=-1)  # (B, Eb, 3)
                cba = bxa @ c.transpose(1, 2)  # (B, Ea, Eb)
                dba = bxa @ d.transpose(1, 2)
                adc = na1 @ dxc.transpose(1, 2)
                bdc = na2 @ dxc.transpose(1, 2)
                ok = (cba * dba < 0) & (adc * bdc < 0) & (cba * bdc > 0)
            else:  # b a segment: its Gauss map is the great circle normal to it; a's arc must cross it
                ok = ((na1 @ db.transpose(1, 2)) * (na2 @ db.transpose(1, 2))) < 0
            bi, i, j = ok.nonzero().unbind(1)  # the few pairs that pass
            u = torch.linalg.cross(da[bi, i], db[bi, j], dim=-1)
            un = u.norm(dim=-1)
            par = un <= 1e-9 * da[bi, i].norm(dim=-1) * db[bi, j].norm(dim=-1)  # parallel edges: a face axis
            u = u / un.clamp_min(1e-300)[:, None]
            u = u * torch.where((u * (na1[bi, i] + na2[bi, i])).sum(-1) < 0, -1.0, 1.0).to(dt)[:, None]
            sep_k = (u * (b0[bi, j] - a0[bi, i])).sum(-1)  # u outward of a: on a's arc between its faces' normals
            sep_k = torch.where(par, torch.full_like(sep_k, -torch.inf), sep_k)
            s_e = torch.full((B, Ea * Eb), -torch.inf, dtype=dt, device=dev)
            s_e[bi, i * Eb + j] = sep_k
            best_e, flat = s_e.max(1)
            ea_i, eb_i = flat // Eb, flat % Eb
        # faces first on ties (their points are the stable ones), edges only when better by rounding
        tol = 1e-12 * (pa.v.detach().abs().amax((1, 2)) + pb.v.detach().abs().amax((1, 2)))
        use_fb = best_fb > best_fa + tol
        use_e = best_e > torch.maximum(best_fa, best_fb) + tol
    # closed forms with the graph
    n_fa = pa.n[ar, fa]
    xb = pb.v[ar, jb[ar, fa]]
    sep = (n_fa * xb).sum(-1) - pa.d[ar, fa]
    normal = -n_fa
    pt_b = xb
    pt_a = xb - sep[:, None] * n_fa
    if bool(use_fb.any()):
        n_fb = pb.n[ar, fb]
        xa = pa.v[ar, ja[ar, fb]]
        s2 = (n_fb * xa).sum(-1) - pb.d[ar, fb]
        sel = use_fb[:, None]
        sep = torch.where(use_fb, s2, sep)
        normal = torch.where(sel, n_fb, normal)
        pt_a = torch.where(sel, xa, pt_a)
        pt_b = torch.where(sel, xa - s2[:, None] * n_fb, pt_b)
    if bool(use_e.any()):
        ea, eb = pa.edges[ea_i], pb.edges[eb_i]
        a0, a1 = pa.v[ar, ea[:, 0]], pa.v[ar, ea[:, 1]]
        b0, b1 = pb.v[ar, eb[:, 0]], pb.v[ar, eb[:, 1]]
        u = torch.linalg.cross(a1 - a0, b1 - b0, dim=-1)
        u = u / torch.where(use_e, u.norm(dim=-1), torch.ones_like(sep))[:, None]
        mid = pa.n[ar, pa.edge_faces[ea_i, 0]] + pa.n[ar, pa.edge_faces[ea_i, 1]]
        with torch.no_grad():
            sg = torch.where((u * mid).sum(-1) < 0, -1.0, 1.0).to(dt)
        u = u * sg[:, None]
        xa, xb2 = closest_points_segments(a0, a1, b0, b1)
        s3 = (u * (b0 - a0)).sum(-1)
        sel = use_e[:, None]
        sep = torch.where(use_e, s3, sep)
        normal = torch.where(sel, -u, normal)
        # the edges' closest points, moved to lie exactly the separation apart along the axis
        mid_pt = 0.5 * (xa + xb2)
        pt_a = torch.where(sel, mid_pt - 0.5 * s3[:, None] * u, pt_a)
        pt_b = torch.where(sel, mid_pt + 0.5 * s3[:, None] * u, pt_b)
    return sep, normal, pt_a, pt_b


# ------------------------------------------------------------------ pairs
def _flat(*xs: Tensor) -> tuple[tuple, list[Tensor]]:
    """The leading dims of the first argument (a rotation ``(..., 3, 3)``) and every placement with
    its leading dims flattened to one."""
    lead = xs[0].shape[:-2]
    return lead, [x.reshape(-1, 3, 3) if x.shape[-2:] == (3, 3) and x.dim() >= 2 and x.shape[:-2] == lead
                  else x.reshape(-1, 3) for x in xs]


def _unflat(c: Candidates, lead) -> Candidates:
    k = c.phi.shape[-1]
    return Candidates(c.phi.reshape(*lead, k), c.point.reshape(*lead, k, 3), c.normal.reshape(*lead, k, 3))


def _poly_pair(pa: _Poly, pb: _Poly, manifold: bool = True) -> Candidates:
    """The signed distance of two vertex sets (b with its radius), GJK where they are apart, the
    separating-axis test where they overlap: candidate 0; then, with ``manifold``, the corners of
    a face resting on a face (:func:`_manifold`)."""
    with torch.no_grad():
        dist, ia, ib, used = _gjk(pa.v.detach(), pb.v.detach())
        size = pa.v.detach().abs().amax((1, 2)) + pb.v.detach().abs().amax((1, 2))
        deep = (dist <= 1e-9 * size) | (used.sum(1) == 4)
    B = dist.shape[0]
    phi = torch.zeros(B, dtype=pa.v.dtype, device=pa.v.device)
    point = torch.zeros(B, 3, dtype=pa.v.dtype, device=pa.v.device)
    normal = torch.zeros_like(point)
    r = pb.radius
    apart = ~deep
    if bool(apart.any()):
        d, a, b = _closest(_sub(pa, apart), _sub(pb, apart), ia[apart], ib[apart], used[apart])
        n = (a - b) / d.clamp_min(1e-300)[:, None]
        ph = d - r
        idx = apart.nonzero()[:, 0]
        phi = phi.index_put((idx,), ph)
        normal = normal.index_put((idx,), n)
        point = point.index_put((idx,), b + (r + 0.5 * ph)[:, None] * n)
    if bool(deep.any()):
        idx = deep.nonzero()[:, 0]
        # in chunks: the edge pairs' table is (chunk, Ea, Eb, 3)
        parts = [_sat(_sub(pa, idx[i:i + _CHUNK]), _sub(pb, idx[i:i + _CHUNK])) for i in range(0, len(idx), _CHUNK)]
        sep, n, a, b = (torch.cat(x) for x in zip(*parts)) if len(parts) > 1 else parts[0]
        ph = sep - r
        phi = phi.index_put((idx,), ph)
        normal = normal.index_put((idx,), n)
        point = point.index_put((idx,), b + (r + 0.5 * ph)[:, None] * n)
    main = Candidates(phi[:, None], point[:, None], normal[:, None])
    if not manifold:
        return main
    return _manifold(pa, pb, main)


def _inside(p: _Poly, x: Tensor, tol: Tensor) -> Tensor:
    """Whether points ``x (B, k, 3)`` lie in the polytope ``p`` grown by ``tol (B, 1)`` (no graph)."""
    return ((x @ p.n.transpose(1, 2)) - p.d[:, None]).amax(-1) <= tol


def _manifold(pa: _Poly, pb: _Poly, main: Candidates, k: int = MANIFOLD) -> Candidates:
    """The pair's candidate ``main`` and up to ``k`` more from each side, so that a face resting on a
    face has its corners (one point alone rocks): the vertices of a deepest along ``-n`` at their
    height above b's supporting plane normal to ``n`` (``n`` the main normal, from b to a), and those
    of b deepest along ``+n`` below a's, each kept only where its foot on that plane lies on the other
    shape (within 1e-9 of the size) and not within 1e-6 of the size of the main point (a duplicated
    row slows the solver). A slot not kept has ``phi`` = 1 km. Each is a closed form of the poses
    through ``n``, its vertex and the other shape's support vertex (chosen without the graph)."""
    B = main.phi.shape[0]
    n, r = main.normal[:, 0], pb.radius
    ar = torch.arange(B, device=n.device)
    size = (pa.v.detach().abs().amax((1, 2)) + pb.v.detach().abs().amax((1, 2)))[:, None]
    phis, points = [main.phi], [main.point]
    if pb.n is not None:  # a's vertices against b's plane (b a polytope; a point or segment has no face)
        ha = (pa.v @ n[..., None])[..., 0]  # (B, Va)
        with torch.no_grad():
            ia = ha.topk(min(k, ha.shape[1]), dim=1, largest=False).indices.sort(1).values
            sb = (pb.v.detach() @ n.detach()[..., None])[..., 0].argmax(1)
        top = (pb.v[ar, sb] * n).sum(-1)[:, None] + r
        phi = ha.gather(1, ia) - top
        x = pa.v.gather(1, ia[..., None].expand(-1, -1, 3))
        pt = x - 0.5 * phi[..., None] * n[:, None]
        with torch.no_grad():
            ok = _inside(pb, (x - phi[..., None] * n[:, None]).detach(), 1e-9 * size)
        phis.append(torch.where(ok, phi, torch.full_like(phi, _FAR)))
        points.append(pt)
    hb = (pb.v @ n[..., None])[..., 0]  # b's vertices against a's plane
    with torch.no_grad():
        ib = hb.topk(min(k, hb.shape[1]), dim=1).indices.sort(1).values
        sa = (pa.v.detach() @ n.detach()[..., None])[..., 0].argmin(1)
    bottom = (pa.v[ar, sa] * n).sum(-1)[:, None]
    phi = bottom - hb.gather(1, ib) - r
    x = pb.v.gather(1, ib[..., None].expand(-1, -1, 3))
    pt = x + (r + 0.5 * phi)[..., None] * n[:, None]
    with torch.no_grad():
        ok = _inside(pa, (x + (r + phi)[..., None] * n[:, None]).detach(), 1e-9 * size)
    phis.append(torch.where(ok, phi, torch.full_like(phi, _FAR)))
    points.append(pt)
    phi, point = torch.cat(phis, 1), torch.cat(points, 1)
    with torch.no_grad():  # the main point again: dropped
        dup = (point[:, 1:] - main.point).norm(dim=-1) <= 1e-6 * size
    phi = torch.cat([phi[:, :1], torch.where(dup, torch.full_like(phi[:, 1:], _FAR), phi[:, 1:])], 1)
    return Candidates(phi, point, n[:, None].expand(-1, phi.shape[1], 3))


def _sub(p: _Poly, mask: Tensor) -> _Poly:
    out = _Poly.__new__(_Poly)
    out.v = p.v[mask]
    out.n = None if p.n is None else p.n[mask]
    out.d = None if p.d is None else p.d[mask]
    out.edges, out.edge_faces, out.radius = p.edges, p.edge_faces, p.radius
    return out


def convex_plane(hull: ConvexHull, scale, R: Tensor, p: Tensor, k: int = PLANE_CANDIDATES) -> Candidates:
    """A hull against the ground plane ``z = 0`` (normal ``+z``): its ``k`` deepest vertices (fewer
    when it has fewer), chosen without the graph, so that a hull resting on a face has that face's
    corners, in the order of their vertex indices. ``scale``: ``(s,)`` the hull's uniform scale.
    ``R (..., 3, 3)``, ``p (..., 3)``."""
    lead, (R, p) = _flat(R, p)
    v, *_ = hull.tensors(p.dtype, p.device)
    s = scale[0] if not isinstance(scale, Tensor) else scale.to(p.dtype).reshape(-1)[0]
    x = p[:, None] + (v * s) @ R.transpose(-1, -2)  # (B, V, 3)
    k = min(k, x.shape[1])
    with torch.no_grad():
        # in vertex order: a slot keeps its vertex while the set of the k deepest stays (the solver's
        # warm start follows slots from step to step; two vertices of an edge swapping depth must not
        # swap their impulses)
        idx = x[..., 2].topk(k, dim=1, largest=False).indices.sort(1).values
    pts = x.gather(1, idx[..., None].expand(-1, -1, 3))
    phi = pts[..., 2]
    ez = torch.zeros_like(pts)
    ez[..., 2] = 1.0
    return _unflat(Candidates(phi, pts - 0.5 * phi[..., None] * ez, ez), lead)


def convex_convex(ha: ConvexHull, sa, Ra: Tensor, pa: Tensor, hb: ConvexHull, sb, Rb: Tensor,
                  pb: Tensor) -> Candidates:
    """Two hulls (scales ``sa``, ``sb``), normal from b to a: candidate 0 the signed distance and its
    closest points, then ``2 MANIFOLD`` slots for a face resting on a face (:func:`_manifold`)."""
    lead, (Ra, pa, Rb, pb) = _flat(Ra, pa, Rb, pb)
    return _unflat(_poly_pair(_hull_poly(ha, sa, Ra, pa), _hull_poly(hb, sb, Rb, pb)), lead)


def convex_box(ha: ConvexHull, sa, Ra: Tensor, pa: Tensor, Rb: Tensor, pb: Tensor, size) -> Candidates:
    """A hull against a box of side lengths ``size`` (normal from the box to the hull); candidates as
    :func:`convex_convex`'s (``1 + MANIFOLD + 8``)."""
    lead, (Ra, pa, Rb, pb) = _flat(Ra, pa, Rb, pb)
    return _unflat(_poly_pair(_hull_poly(ha, sa, Ra, pa), _box_poly(size, Rb, pb)), lead)


def convex_sphere(ha: ConvexHull, sa, Ra: Tensor, pa: Tensor, pb: Tensor, rb) -> Candidates:
    """A hull against a sphere of centre ``pb`` and radius ``rb`` (normal from the sphere to the hull):
    one candidate."""
    lead, (Ra, pa, pb) = _flat(Ra, pa, pb)
    pt = _Poly.__new__(_Poly)
    pt.v, pt.n, pt.d, pt.edges, pt.edge_faces, pt.radius = pb[:, None], None, None, None, None, rb
    return _unflat(_poly_pair(_hull_poly(ha, sa, Ra, pa), pt, manifold=False), lead)


_SEGMENT = torch.tensor([[0, 1]])


def convex_capsule(ha: ConvexHull, sa, Ra: Tensor, pa: Tensor, Rb: Tensor, pb: Tensor, size) -> Candidates:
    """A hull against a capsule of ``size = (radius, length)`` along its local ``z`` (normal from the
    capsule to the hull): candidate 0 the signed distance, 1 and 2 the end spheres against the
    hull's supporting plane where they are over it (a capsule lying on a face)."""
    lead, (Ra, pa, Rb, pb) = _flat(Ra, pa, Rb, pb)
    half = 0.5 * size[1] * Rb[..., :, 2]
    seg = _Poly.__new__(_Poly)
    seg.v, seg.n, seg.d, seg.radius = torch.stack([pb - half, pb + half], 1), None, None, size[0]
    seg.edges, seg.edge_faces = _SEGMENT.to(pb.device), None
    return _unflat(_poly_pair(_hull_poly(ha, sa, Ra, pa), seg), lead)
