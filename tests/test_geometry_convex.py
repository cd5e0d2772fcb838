"""Convex hulls (:mod:`diffmech.contact.convex`) against coal, pair by pair, at a few hundred seeded
random poses each (rotated; separated, touching, penetrating), their gradients against central
differences, and URDF / MJCF meshes in simulated scenes.

Conventions as in ``tests/test_geometry_coal.py`` (float64): ``phi`` is coal's signed distance
(``enable_signed_distance``; minus the depth in penetration), diffmech's normal (from b to a) is
minus coal's ``normal``, and diffmech's point is halfway between the surfaces, so ``point -+ phi/2
normal`` is compared with coal's nearest points on b and on a. Coal runs GJK / EPA (tolerances set
to 1e-14) on a ``coal.Convex`` of the same hull (vertices and triangles), and is analytic against a
halfspace.
"""

from __future__ import annotations

import math
import os
import warnings

import coal
import numpy as np
import pytest
import torch

from diffmech.contact import convex as cv
from diffmech.model import systems
from diffmech.model.collision import Shape, set_collision_shapes
from diffmech.sim import Scene, rollout
from diffmech.spatial import matrix_to_quat, quat_to_matrix
from test_geometry_coal import _rotations, coal_shape
from test_geometry_coal import coal_distance as _coal

F64 = torch.float64
N = 200  # random poses per pair type
# measured errors against coal (this file's seeds, all four pair types; touching poses included):
# phi <= 5e-16, normal <= 9.7e-13, points <= 9.5e-15. Coal's GJK / EPA stop at a tolerance of 1e-14,
# so the tolerances leave it room: 1e-12 on phi, 1e-10 on the normal and the points.
PHI_TOL = 1e-12
DIR_TOL = 1e-10
STEPS = 100  # of 2 ms in the scene tests
STEPS_URDF = 60  # 3 cm of fall take 39


def _hull(seed: int, n: int, axes) -> cv.ConvexHull:
    rng = np.random.default_rng(seed)
    return cv.hull_from_points(rng.normal(size=(n, 3)) * np.asarray(axes))


def _coal_convex(h: cv.ConvexHull, scale: float = 1.0):
    v = coal.StdVec_Vec3s()
    for x in h.vertices * scale:
        v.append(np.array(x, dtype=float))
    t = coal.StdVec_Triangle()
    for a, b, c in h.triangles:
        t.append(coal.Triangle(int(a), int(b), int(c)))
    return coal.Convex(v, t)


def _coal_shape(kind: str, size):
    if kind == "convex":
        return _coal_convex(size[1], size[0])
    return coal_shape(kind, size)


def _poses(g, ga, gb, scale, n=N, depth=0.3):
    """``n`` poses of a near b: a in a random direction from b, moved along coal's normal to a signed
    distance in ``[-depth, 0.1] * scale``, every 7th exactly touching."""
    Ra, Rb = _rotations(g, n), _rotations(g, n)
    pb = 0.1 * torch.randn(n, 3, dtype=F64, generator=g)
    u = torch.randn(n, 3, dtype=F64, generator=g)
    pa = pb + scale * u / u.norm(dim=-1, keepdim=True)
    d, _, _, nrm = _coal(ga, Ra, pa, gb, Rb, pb)
    target = (-depth + (depth + 0.1) * torch.rand(n, dtype=F64, generator=g)) * scale
    target[::7] = 0.0
    return Ra, pa + (target - d)[:, None] * nrm, Rb, pb


def _check(c, ref, what: str, touching_normal: bool = True):
    d, wa, wb, n = ref
    phi, point, normal = c.phi[:, 0], c.point[:, 0], c.normal[:, 0]
    assert (d > 1e-6).sum() >= 20 and (d < -1e-6).sum() >= 20, f"{what}: the poses must include both sides"
    errs = {"phi": ((phi - d).abs(), PHI_TOL),
            "normal": ((normal - n).norm(dim=-1), DIR_TOL),
            "point on a": ((point + 0.5 * phi[:, None] * normal - wa).norm(dim=-1), DIR_TOL),
            "point on b": ((point - 0.5 * phi[:, None] * normal - wb).norm(dim=-1), DIR_TOL)}
    for name, (e, tol) in errs.items():
        if name != "phi" and not touching_normal:
            e = e[d.abs() > 1e-9]  # a touching pair's normal is any of its contact's normal cone
        assert float(e.max()) < tol, f"{what} {name}: max error {float(e.max()):.3g} (pose {int(e.argmax())})"


HA = _hull(1, 40, (0.1, 0.2, 0.15))  # 40 points: a hull of about 15 to 20 vertices
HB = _hull(2, 30, (0.2, 0.1, 0.1))
SLAB = cv.hull_from_points([[x, y, z] for x in (-0.3, 0.3) for y in (-0.3, 0.3) for z in (-0.1, 0.1)])


def test_convex_convex_matches_coal():
    g = torch.Generator().manual_seed(11)
    ga, gb = _coal_convex(HA, 1.3), _coal_convex(HB)
    Ra, pa, Rb, pb = _poses(g, ga, gb, 0.3)
    c = cv.convex_convex(HA, (1.3,), Ra, pa, HB, (1.0,), Rb, pb)
    _check(c, _coal(ga, Ra, pa, gb, Rb, pb), "convex-convex")


@pytest.mark.parametrize("kind, size", [("sphere", (0.07,)), ("capsule", (0.05, 0.3)), ("box", (0.3, 0.1, 0.2))])
def test_convex_primitive_matches_coal(kind, size):
    g = torch.Generator().manual_seed(12 + len(size))
    ga, gb = _coal_convex(HA), _coal_shape(kind, size)
    Ra, pa, Rb, pb = _poses(g, ga, gb, 0.3)
    if kind == "sphere":
        c = cv.convex_sphere(HA, (1.0,), Ra, pa, pb, size[0])
    elif kind == "capsule":
        c = cv.convex_capsule(HA, (1.0,), Ra, pa, Rb, pb, size)
    else:
        c = cv.convex_box(HA, (1.0,), Ra, pa, Rb, pb, size)
    _check(c, _coal(ga, Ra, pa, gb, Rb, pb), f"convex-{kind}")


def test_convex_plane_matches_coal_and_reports_the_deepest_vertices():
    g = torch.Generator().manual_seed(13)
    n = N
    R = _rotations(g, n)
    p = torch.zeros(n, 3, dtype=F64)
    p[:, 2] = 0.25 + 0.3 * (torch.rand(n, dtype=F64, generator=g) - 0.5)  # the hull reaches 0.2 to 0.35 m down
    ga = _coal_convex(HA)
    d, wa, wb, nrm = _coal(ga, R, p, _coal_shape("ground", ()), torch.eye(3, dtype=F64).expand(n, 3, 3),
                           torch.zeros(n, 3, dtype=F64))
    c = cv.convex_plane(HA, (1.0,), R, p)
    assert c.phi.shape == (n, cv.PLANE_CANDIDATES)
    assert (d > 0).sum() > 20 and (d < 0).sum() > 20
    low = c.phi.argmin(1)
    phi, point, normal = (x[torch.arange(n), low] for x in c)
    assert float((phi - d).abs().max()) < 1e-12  # coal: analytic against a halfspace
    assert float((point + 0.5 * phi[:, None] * normal - wa).norm(dim=-1).max()) < 1e-12
    assert float((normal - nrm).norm(dim=-1).max()) < 1e-12
    # the k candidates are the k lowest vertices
    world = p[:, None] + torch.as_tensor(HA.vertices) @ R.transpose(-1, -2)
    assert torch.equal(c.phi.sort(1).values, world[..., 2].sort(1).values[:, :cv.PLANE_CANDIDATES])


def _axis_angle(w: torch.Tensor) -> torch.Tensor:
    """exp of ``skew(w)``, ``(..., 3, 3)``: Rodrigues' formula (differentiable for ``w != 0``)."""
    th = w.norm(dim=-1, keepdim=True)[..., None]
    k = w / w.norm(dim=-1, keepdim=True)
    z = torch.zeros_like(k[..., 0])
    K = torch.stack([torch.stack([z, -k[..., 2], k[..., 1]], -1), torch.stack([k[..., 2], z, -k[..., 0]], -1),
                     torch.stack([-k[..., 1], k[..., 0], z], -1)], -2)
    return torch.eye(3, dtype=w.dtype) + torch.sin(th) * K + (1 - torch.cos(th)) * K @ K


@pytest.mark.parametrize("pair", ["convex", "box", "sphere", "capsule", "plane"])
def test_gradients_match_central_differences(pair):
    """phi, point and normal of each pair w.r.t. both placements (translation and a rotation
    vector), at 12 separated and penetrating poses, against central differences at two step sizes
    (the difference between the two estimates bounds their truncation error)."""
    g = torch.Generator().manual_seed(21)
    n = 8
    Ra0, Rb0 = _rotations(g, n), _rotations(g, n)
    pb = 0.05 * torch.randn(n, 3, dtype=F64, generator=g)
    u = torch.randn(n, 3, dtype=F64, generator=g)
    pa = pb + (0.15 + 0.4 * torch.rand(n, 1, dtype=F64, generator=g)) * u / u.norm(dim=-1, keepdim=True)
    w0 = 0.3 * torch.randn(n, 6, dtype=F64, generator=g)
    ha = HA
    if pair == "capsule":  # half the poses: the capsule lying over the top face of a slab, nearly parallel
        ha = SLAB
        m = n // 2
        Ra0[:m] = torch.eye(3, dtype=F64)
        Rb0[:m] = _axis_angle(torch.tensor([0.0, 0.0, 1.0], dtype=F64) * torch.rand(m, 1, dtype=F64, generator=g)
                              * 3) @ _axis_angle(torch.tensor([[math.pi / 2, 0.0, 0.0]], dtype=F64))
        pa[:m] = 0.0
        pb[:m] = torch.cat([0.1 * torch.rand(m, 2, dtype=F64, generator=g) - 0.05,
                            0.1 + 0.05 + 0.02 * torch.rand(m, 1, dtype=F64, generator=g) - 0.01], 1)
        w0[:m] = 0.02 * torch.randn(m, 6, dtype=F64, generator=g)

    def f(x: torch.Tensor) -> torch.Tensor:  # x (m n, 12): a's and b's translations and rotation vectors
        k = x.shape[0] // n
        Ra, Rb = _axis_angle(x[:, 6:9]) @ Ra0.repeat(k, 1, 1), _axis_angle(x[:, 9:12]) @ Rb0.repeat(k, 1, 1)
        qa, qb = x[:, :3], x[:, 3:6]
        if pair == "convex":
            c = cv.convex_convex(HA, (1.0,), Ra, qa, HB, (1.0,), Rb, qb)
        elif pair == "box":
            c = cv.convex_box(HA, (1.0,), Ra, qa, Rb, qb, (0.3, 0.1, 0.2))
        elif pair == "sphere":
            c = cv.convex_sphere(HA, (1.0,), Ra, qa, qb, 0.07)
        elif pair == "capsule":
            c = cv.convex_capsule(ha, (1.0,), Ra, qa, Rb, qb, (0.05, 0.3))
        else:
            c = cv.convex_plane(HA, (1.0,), Ra, qa)
        # every slot's phi and point, and the normal (one for all slots): (m n, 4 k + 3)
        return torch.cat([c.phi, c.point.flatten(1), c.normal[:, 0]], 1)

    x0 = torch.cat([pa, pb, w0], 1)
    if pair == "plane":
        x0[:, 2] = 0.25 + 0.1 * torch.randn(n, dtype=F64, generator=g)
    x = x0.clone().requires_grad_()
    out0 = f(x)
    m = out0.shape[1]
    k = (m - 3) // 4
    assert (out0[:, 0] > 0).any() and (out0[:, 0] < 0).any()
    J = torch.stack([torch.autograd.grad(out0[:, i].sum(), x, retain_graph=True)[0] for i in range(m)], 1)
    # every perturbed pose in one batched call: (2 step sizes, 2 signs, 12 coordinates, n poses)
    eye = torch.eye(12, dtype=F64)
    hs = torch.tensor([1e-6, 1e-7], dtype=F64)
    X = x0 + (hs[:, None, None, None, None] * torch.tensor([1.0, -1.0], dtype=F64)[None, :, None, None, None]
              * eye[None, None, :, None, :])
    Y = f(X.reshape(-1, 12)).reshape(2, 2, 12, n, m)
    # slots in use (phi < 1 km) at the pose and at every perturbed one: their phi and point
    used = (out0[:, :k].detach() < 1e2) & (Y[..., :k] < 1e2).all(0).all(0).all(0)
    assert int(used[:, 1:].sum()) >= (3 if pair in ("convex", "box", "capsule", "plane") else 0)
    mask = torch.cat([used, used[..., None].expand(-1, -1, 3).flatten(1), torch.ones(n, 3, dtype=torch.bool)], 1)
    fd = ((Y[:, 0] - Y[:, 1]) / (2 * hs[:, None, None, None])).permute(0, 2, 3, 1)  # (2, n, m, 12)
    trunc = ((fd[0] - fd[1]).abs() * mask[..., None]).max()
    err = ((J - fd[0]).abs() * mask[..., None]).max()
    # analytic vs differences: within the difference between the two step sizes' estimates plus
    # their rounding (1e-16 / 1e-7 ~ 1e-9 on unit-size derivatives)
    assert err < 10 * trunc + 1e-7, f"{pair}: gradient error {float(err):.3g}, differences differ by {float(trunc):.3g}"
    assert trunc < 1e-5


def test_gradient_wrt_the_hull_scale():
    """A convex shape's ``size`` is a uniform scale of its vertices (a Scene's ``sizes`` may make it a
    tensor): phi of a hull on the ground and of two hulls, w.r.t. the scales, against central
    differences at two step sizes."""
    g = torch.Generator().manual_seed(31)
    n = 8
    Ra, Rb = _rotations(g, n), _rotations(g, n)
    u = torch.randn(n, 3, dtype=F64, generator=g)
    pa = (0.2 + 0.3 * torch.rand(n, 1, dtype=F64, generator=g)) * u / u.norm(dim=-1, keepdim=True)
    pb = torch.zeros(n, 3, dtype=F64)
    pz = pa.clone()
    pz[:, 2] = 0.25 + 0.1 * torch.randn(n, dtype=F64, generator=g)

    def f(s: torch.Tensor) -> torch.Tensor:  # (2,) scales -> (n, 2) phi of the pair and of a on the ground
        pair = cv.convex_convex(HA, s[:1], Ra, pa, HB, s[1:], Rb, pb).phi[:, 0]
        ground = cv.convex_plane(HA, s[:1], Ra, pz, k=1).phi[:, 0]
        return torch.stack([pair, ground], 1)

    s0 = torch.tensor([1.1, 0.9], dtype=F64)
    J = torch.autograd.functional.jacobian(f, s0)  # (n, 2, 2)
    out = f(s0)
    assert (out < 0).any() and (out > 0).any()
    fd = []
    for h in (1e-6, 1e-7):
        fd.append(torch.stack([(f(s0 + h * e) - f(s0 - h * e)) / (2 * h) for e in torch.eye(2, dtype=F64)], -1))
    trunc = (fd[0] - fd[1]).abs().max()
    assert (J - fd[0]).abs().max() < 10 * trunc + 1e-7 and trunc < 1e-5


def test_hull_simplification_bound():
    """A hull of more than MAX_VERTICES vertices keeps that many, each one of the input's, and no input
    point lies further outside any of its faces than the ``simplified`` it reports (scipy's qhull as
    the oracle of the faces' planes)."""
    from scipy.spatial import ConvexHull as Qhull

    pts = np.random.default_rng(5).normal(size=(400, 3))
    pts = pts / np.linalg.norm(pts, axis=1, keepdims=True) * (0.2, 0.05, 0.1)  # on an ellipsoid: all on the hull
    h = cv.hull_from_points(pts)
    assert len(h.vertices) == cv.MAX_VERTICES
    assert np.isin(h.vertices.view([("", float)] * 3), pts.view([("", float)] * 3)).all()
    eq = Qhull(h.vertices).equations  # (F, 4): n . x + c <= 0 inside
    out = (pts @ eq[:, :3].T + eq[:, 3]).max(1)
    assert 0 < h.simplified and abs(out.max() - h.simplified) < 1e-12
    assert np.allclose(np.linalg.norm(h.normals, axis=1), 1.0)
    assert (h.vertices @ h.normals.T - np.einsum("ij,ij->i", h.normals, h.vertices[h.face_vertex])).max() < 1e-12


# ------------------------------------------------------------------ scenes
def _piece(name: str = "piece"):
    """A free body (a 1 kg box's inertia) whose collision shape is a prism 6 cm high on an irregular
    heptagon about 0.2 x 0.1 m: a hull of 14 vertices with 7 on each flat end."""
    body = systems.box((0.2, 0.1, 0.06), 1.0, name=name)
    ang = np.sort(np.random.default_rng(3).uniform(0, 2 * np.pi, 7))
    rad = np.random.default_rng(4).uniform(0.8, 1.2, 7)
    ring = np.stack([0.1 * rad * np.cos(ang), 0.05 * rad * np.sin(ang)], 1)
    pts = np.concatenate([np.pad(ring, ((0, 0), (0, 1)), constant_values=z) for z in (-0.03, 0.03)])
    set_collision_shapes(body, "body", Shape("convex", (1.0,), hull=cv.hull_from_points(pts)))
    return body


_MJCF = """<mujoco model="drop">
  <asset>
    <mesh name="wedge" vertex="0 0 0  0.2 0 0  0 0.1 0  0 0 0.1  0.2 0.1 0  0.05 0.05 0.02"/>
  </asset>
  <worldbody>
    <geom name="floor" type="plane" size="2 2 0.1"/>
    <body name="piece" pos="0 0 0.3">
      <freejoint/>
      <geom type="mesh" mesh="wedge" density="1000"/>
    </body>
  </worldbody>
</mujoco>
"""


@pytest.mark.slow
def test_an_mjcf_mesh_geom_is_its_hull_and_rests_on_the_ground(tmp_path):
    """A ``mesh`` geom of an MJCF file becomes the hull of MuJoCo's compiled vertices (the 6th, inside
    the others' hull, dropped) at the geom's placement, and the body lands on it and comes to rest."""
    import mujoco

    path = tmp_path / "drop.xml"
    path.write_text(_MJCF)
    scene = Scene.from_mjcf(path, solver="pgs")  # diffmech's hard contacts (MuJoCo's own refuses meshes)
    (shape,) = scene.shapes["drop"]["piece"]
    assert shape.kind == "convex"
    m = mujoco.MjModel.from_xml_path(str(path))
    verts = m.mesh_vert[:m.mesh_vertnum[0]].astype(np.float64)
    assert len(shape.hull.vertices) == 5
    assert min(np.abs(verts - v).sum(1).min() for v in shape.hull.vertices) == 0.0  # MuJoCo's own vertices
    assert np.allclose(shape.xyz, m.geom_pos[1], atol=1e-12)
    q = scene.place_on_ground(scene.neutral_configuration())
    q[2] += 0.01
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(STEPS, scene.nv, dtype=F64), 2e-3)
    assert float(scene.penetration(Q)["drop"][0].max()) < 1e-3
    assert float(V[-1].abs().max()) < 1e-3


def test_the_native_route_refuses_convex_shapes():
    from diffmech.sim._ground_step import _ineligible

    assert _ineligible(Scene([_piece()])) == "convex shapes"  # the route: "torch: convex shapes"


@pytest.mark.slow
def test_a_hull_falls_onto_the_ground_and_a_box():
    """A free hull dropped tilted on the ground, and one dropped on a free box lying there: each
    lands, tips onto a face and comes to rest (speed below 1 mm/s) on the ground or on the box,
    never sinking more than 1 mm into either."""
    piece, other = _piece(), _piece("second")
    crate = systems.box((0.4, 0.4, 0.1), 5.0, name="crate")
    scene = Scene([piece, other, crate], friction=0.8)
    q = scene.neutral_configuration().clone()
    q[0], q[7], q[14] = -0.5, 0.5, 0.5
    quat = matrix_to_quat(_axis_angle(torch.tensor([0.15, -0.1, 0.3], dtype=F64)))
    q[3:7], q[10:14] = quat, quat
    q = scene.place_on_ground(q)
    q[2] += 0.01
    q[9] += 0.11  # the second piece 1 cm above the crate
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(STEPS, scene.nv, dtype=F64), 2e-3)
    pen = scene.penetration(Q)
    assert float(pen["piece"][0].max()) < 1e-3 and float(pen["second"][0].max()) < 1e-3
    assert float(V[-1].abs().max()) < 1e-3, V[-1]
    d = _depth_in_box(scene, "second", Q, "crate")  # on the crate, never 1 mm in
    assert float(d.min()) > -1e-3 and abs(float(d[-1])) < 1e-3




def _urdf_robot(path: str):
    import pybullet_data

    from diffmech import load_urdf

    with warnings.catch_warnings():  # each link's mesh is not convex and its hull simplified: said, known
        warnings.simplefilter("ignore")
        robot = load_urdf(os.path.join(pybullet_data.getDataPath(), path), floating_base=True)
        shapes = Scene([robot]).shapes[robot.name]
    assert shapes and all(sh.kind == "convex" for shs in shapes.values() for sh in shs)
    return robot


def _depth_in_box(scene, name: str, q: torch.Tensor, crate: str) -> torch.Tensor:
    """The least signed distance ``(T,)`` of model ``name``'s hulls to the box model ``crate``, from
    the pair function the contact step uses, at the scene configurations ``q (T, nq)``."""
    from diffmech.dynamics.kinematics import forward_kinematics
    from diffmech.spatial import rpy_to_matrix

    m = scene.models[name]
    p_l, R_l = forward_kinematics(m, q[:, scene.slices[name]], form="pos_rot")
    qc = q[:, scene.slices[crate]]
    size = scene.shapes[crate]["body"][0].size
    out = []
    for link, shapes in scene.shapes[name].items():
        i = m.link_names.index(link)
        for sh in shapes:
            R = R_l[:, i] @ rpy_to_matrix(torch.tensor(sh.rpy, dtype=F64))
            p = p_l[:, i] + (R_l[:, i] @ torch.tensor(sh.xyz, dtype=F64))
            out.append(cv.convex_box(sh.hull, sh.size, R, p, quat_to_matrix(qc[:, 3:7]), qc[:, :3], size).phi[:, 0])
    return torch.stack(out, 1).min(1).values


@pytest.mark.slow
def test_kuka_falls_on_the_ground_and_panda_on_a_box():
    """PyBullet's KUKA iiwa (a floating base, lying on its side, 3 cm up) falls on the ground, and the
    Panda (likewise) on a free box lying there, through their links' mesh hulls: no point of either
    goes more than 1 mm into the ground or the box, and each comes down onto it (its nearest
    shape within 1 mm of the surface at the end)."""
    kuka = _urdf_robot("kuka_iiwa/model.urdf")
    panda = _urdf_robot("franka_panda/panda.urdf")
    crate = systems.box((0.5, 1.4, 0.1), 20.0, name="crate")
    scene = Scene({"kuka": kuka, "panda": panda, "crate": crate}, friction=0.8)
    q = scene.neutral_configuration().clone()
    side = matrix_to_quat(_axis_angle(torch.tensor([math.pi / 2, 0.0, 0.0], dtype=F64)))  # arms along -y
    kq, pq, cq = (scene.slices[n].start for n in ("kuka", "panda", "crate"))
    q[kq + 3:kq + 7], q[pq + 3:pq + 7] = side, side
    q[kq] = -1.0
    q[pq], q[pq + 1] = 0.6, 1.0
    q[cq], q[cq + 1] = 0.6, 0.55  # under the whole Panda
    q = scene.place_on_ground(q)
    q[kq + 2] += 0.03
    q[pq + 2] += 0.1 + 0.03
    Q, V = rollout(scene, q, torch.zeros(scene.nv, dtype=F64), torch.zeros(STEPS_URDF, scene.nv, dtype=F64), 2e-3)
    pen = scene.penetration(Q)
    assert float(pen["kuka"][0].max()) < 1e-3 and float(pen["crate"][0].max()) < 1e-3
    assert abs(float(scene._lowest("kuka", Q[-1])[0])) < 1e-3
    d = _depth_in_box(scene, "panda", Q, "crate")
    assert float(d.min()) > -1e-3
    assert abs(float(d[-1])) < 1e-3

