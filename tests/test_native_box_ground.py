"""The native contact route (``diffmech.sim._ground_step``, ``_ground_rollout``) for a robot with box
and cylinder shapes on the ground: a box is its 8 corners and a cylinder the 16 points of its end rims,
balls of radius 0 -- the candidates ``contact.geometry.plane_candidates`` gives them, in the torch
step's order and under its keys. Checked against the torch step: the candidates, the trajectories with
contacts made and broken, the gradients (torques, initial velocity, friction, a learnable box size)
of both adjoints, and central differences. float64; the robot is ``tests/assets/box_feet.urdf``."""

from __future__ import annotations

import importlib
import os

import pytest
import torch

import diffmech
from diffmech.dynamics import kernels
from diffmech.dynamics.kernel_store import available
from diffmech.model import systems
from diffmech.model.collision import Shape, set_collision_shapes
from diffmech.sim import Scene, prepare_ground_kernels, rollout
from diffmech.sim import _ground_step as gs
from diffmech.spatial import matrix_to_quat, rpy_to_matrix

cs = importlib.import_module("diffmech.sim.contact_step")
rt = importlib.import_module("diffmech.sim.route")
F64 = torch.float64
URDF = os.path.join(os.path.dirname(__file__), "assets", "box_feet.urdf")
BOX = (0.08, 0.05, 0.02)  # the feet's size in the URDF, m


def _scene(size=None, friction=0.6, tol=1e-15, back="cylinder"):
    """The box-footed robot with drives on its hips; ``size``: the left foot's box dimensions (a tensor
    to learn them); ``back="sphere"``: a ball in place of the cylinder on its back (the tests that build
    the kernels: 17 balls instead of 32 to compile; the cylinder's are :func:`test_free_cylinder`'s).
    ``tol=1e-15``: the contact solves run all their sweeps (the C solver stops each environment on its
    own, the torch solver all at once: with a looser tolerance they stop at different sweeps, a
    difference of about the tolerance)."""
    robot = diffmech.load_urdf(URDF, floating_base=True)
    if back == "sphere":
        set_collision_shapes(robot, "body", Shape("sphere", (0.04,), xyz=(0.0, 0.0, 0.08)))
    sizes = None if size is None else {("boxfeet", "left"): size}
    return Scene([robot], friction=friction, tol=tol, sizes=sizes,
                 drives={"boxfeet": {"stiffness": 40.0, "damping": 1.5, "armature": 0.01}})


def _start(scene, B=2):
    """Env 0 lands on its feet (1 cm above the ground), sliding; env 1 upside down, on the ball on its back
    (1 cm above); the left hip swings into its upper limit."""
    q = scene.neutral_configuration().expand(B, -1).clone()
    q[:, 2] = 0.22
    if B > 1:
        q[1, 2] = 0.13
        q[1, 3:7] = torch.tensor([1.0, 0.0, 0.0, 0.0], dtype=F64)
    v = torch.zeros(B, scene.nv, dtype=F64)
    v[:, 0] = torch.tensor([0.4, -0.2], dtype=F64)[:B]
    v[:, 6] = 3.0
    return q, v


def test_balls_are_the_torch_steps_candidates():
    """The plan's balls, placed by the links' poses, are the torch step's candidates against the ground --
    gaps and contact points of every box corner and cylinder rim point -- under the same keys in the
    same order (the kernel places each ball as it places a foot's sphere)."""
    size = torch.tensor([0.09, 0.04, 0.03], dtype=F64)
    scene = _scene(size)
    plan = gs._plan(scene, F64)
    assert plan is not None and len(plan.links) == 16 + 8 + 8  # the cylinder's rim points, two boxes' corners
    n = plan.name
    m = scene.models[n]
    gen = torch.Generator().manual_seed(2)
    B = 3
    q = scene.neutral_configuration().expand(B, -1).clone()
    q[:, 3:7] += 0.4 * torch.randn(B, 4, generator=gen, dtype=F64)
    q[:, 3:7] /= q[:, 3:7].norm(dim=-1, keepdim=True)
    q[:, 7:] += 0.4 * torch.randn(B, 2, generator=gen, dtype=F64)
    q[:, 2] = 0.1
    layout = cs._shape_layout(scene, n, F64, q.device)
    T, _ = cs.poses_and_world_jacobians(m, q, list(scene.shapes[n]))
    R, p = cs._placed(T[:, layout.links][..., :3, :3], T[:, layout.links][..., :3, 3], layout)
    items = [cs._item(scene, n, link, k, sh, j) for link, k, sh, j in layout.shapes]
    g = cs._ground_candidates(items, list(range(len(items))), R, p)
    assert plan.keys == [(*g.keys[i], j) for i, c in enumerate(g.counts) for j in range(c)]
    balls = gs._balls(scene, plan, F64)[0].view(-1, 4)
    Tl = T[:, list(plan.links)]
    centre = (Tl[..., :3, :3] @ balls[:, :3, None])[..., 0] + Tl[..., :3, 3]
    phi = centre[..., 2] - balls[:, 3]
    point = torch.cat([centre[..., :2], 0.5 * phi[..., None]], -1)  # as the kernel forms it
    assert float(phi.min()) < 0 < float(phi.max())  # corners and rim points on both sides of the ground
    # measured: 5.6e-17 (gaps), 5.6e-17 (points)
    torch.testing.assert_close(phi, g.phi, rtol=0, atol=1e-15)
    torch.testing.assert_close(point, g.point, rtol=0, atol=1e-15)


def test_box_and_cylinder_sizes_reach_the_balls():
    """A box's corners and a cylinder's rim points move with their sizes as plane_candidates' do: the
    balls' Jacobian w.r.t. a size against central differences (linear in the size: exact to rounding)."""
    scene = _scene(torch.tensor(BOX, dtype=F64))
    plan = gs._plan(scene, F64)
    for link, item, s0 in (("left", 1, BOX), ("body", 0, (0.04, 0.3))):
        s0 = torch.tensor(s0, dtype=F64)
        lo, hi = (plan.keys.index(k) for k in ((item, -1, 0), (item, -1, 7 if link == "left" else 15)))

        def balls(s, link=link, lo=lo, hi=hi):
            scene.shape_sizes[("boxfeet", link, 0)] = s
            return gs._balls(scene, plan, F64)[0].view(-1, 4)[lo:hi + 1]

        J = torch.autograd.functional.jacobian(balls, s0)  # (k, 4, size)
        assert float(J[:, :3].abs().min(0).values.max()) > 0  # every point moves with the size
        for h in (1e-3, 1e-5):
            for i in range(len(s0)):
                e = torch.zeros(len(s0), dtype=F64)
                e[i] = h
                fd = (balls(s0 + e) - balls(s0 - e)) / (2 * h)
                torch.testing.assert_close(J[..., i], fd, rtol=0, atol=1e-9)
        assert float(J[:, 3].abs().max()) == 0  # radius 0 whatever the size


native = pytest.mark.skipif(not available(), reason="no C compiler")


@pytest.fixture(scope="module")
def built():
    scene = _scene(torch.tensor(BOX, dtype=F64), back="sphere")
    assert prepare_ground_kernels(scene)
    return True


def _loss(Q, V):
    return (Q[:, -1, 0] + 2 * Q[:, -1, 2] + Q[:, -1, 7]).sum() + (V[:, -1, 0] ** 2).sum() + Q[:, 40, 8].sum()


def _run(route, adjoint="checkpoint", T=100, grad=True):
    """Trajectory, route string and gradients (torques, v0, friction, the left foot's size) of a rollout
    by ``route``: "native"; "torch" (the torch step with the same C contact solver, the native route
    turned off); "never" (everything in torch)."""
    size = torch.tensor(BOX, dtype=F64, requires_grad=True)
    mu = torch.tensor(0.6, dtype=F64, requires_grad=True)
    scene = _scene(size, mu, back="sphere")
    q, v = _start(scene)
    v = v.requires_grad_(grad)
    tau = torch.zeros(2, T, scene.nv, dtype=F64)
    tau[:, :, 6:] = 0.3
    tau[:, 50:, 6:] = -0.4  # the legs swing back: feet lift and land again
    tau.requires_grad_(grad)
    stats: dict = {}
    with kernels.native_mode("never" if route == "never" else "auto"), pytest.MonkeyPatch.context() as mp:
        if route == "torch":
            mp.setattr(rt, "ground_plan", lambda *a, **k: None)
            mp.setattr(rt, "ground_stepper", lambda *a, **k: None)
        Q, V = rollout(scene, q, v, tau, 2e-3, adjoint=adjoint, stats=stats)
        grads = torch.autograd.grad(_loss(Q, V), (tau, v, mu, size)) if grad else None
    return Q.detach(), stats["route"], grads


@native
@pytest.mark.slow
def test_native_route_equals_the_torch_route(built):
    Qn, route_n, gn = _run("native")
    Qa, route_a, ga = _run("native", "autograd")  # each step the native step's own node
    Qt, route_t, gt = _run("torch")
    Qw, route_w, _ = _run("never", T=40, grad=False)  # the all-torch solver: 0.2 s a step
    assert route_n == "native" and route_a == "torch: adjoint='autograd'"
    assert route_t.startswith("torch") and route_w.startswith("torch: native kernels off")
    # contacts made and broken: the keys of each step's impulses (a forward pass, the native route)
    scene = _scene(back="sphere")
    q, v = _start(scene)
    sets, warm = [], None
    with kernels.native_mode("auto"), torch.no_grad():
        for k in range(100):
            tau = torch.zeros(2, scene.nv, dtype=F64)
            tau[:, 6:] = 0.3 if k < 50 else -0.4
            info: dict = {}
            q, v = diffmech.sim.contact_step(scene, q, v, tau, 2e-3, info=info, warm=warm)
            warm = info["lam"]
            sets.append(frozenset(k for k in info["lam"] if not isinstance(k[0], str)))
        assert info["route"] == "native"
    keys = set().union(*sets)
    assert len(set(sets)) > 5
    assert {k[0] for k in keys} == {0, 1, 2}  # the ball on the back (item 0) and both feet touched the ground
    # measured: trajectories 1.6e-15 apart (native / torch step), 7.3e-15 (native / all torch, 40 steps);
    # gradients 2.0e-12 of their largest entry apart
    torch.testing.assert_close(Qn, Qt, rtol=0, atol=1e-12)
    torch.testing.assert_close(Qa, Qt, rtol=0, atol=1e-12)
    torch.testing.assert_close(Qn[:, :41], Qw, rtol=0, atol=1e-12)
    for a, b, c, name in zip(gn, ga, gt, ("tau", "v0", "friction", "box size")):
        scale = float(c.abs().max())
        assert scale > 0, name
        assert float((a - c).abs().max()) <= 1e-10 * scale, (name, float((a - c).abs().max()), scale)
        assert float((b - c).abs().max()) <= 1e-10 * scale, (name, float((b - c).abs().max()), scale)


@native
@pytest.mark.slow
def test_native_box_gradient_against_central_differences(built):
    """A landing on one corner of each foot (the base rolled and pitched: no statically indeterminate
    contact set, whose implicit gradient is not the derivative, see ``route.warn_unconverged``), 40
    steps: the gradient w.r.t. the left foot's size, the friction and the initial velocity."""
    T = 40

    def loss(size, mu, v0):
        scene = _scene(size, mu, back="sphere")
        q = scene.neutral_configuration()[None].clone()
        q[:, 2] = 0.225
        q[:, 3:7] = matrix_to_quat(rpy_to_matrix(torch.tensor([0.15, 0.1, 0.0], dtype=F64)))
        tau = torch.zeros(1, T, scene.nv, dtype=F64)
        tau[:, :, 6:] = 0.3
        stats: dict = {}
        with kernels.native_mode("auto"):
            Q, V = rollout(scene, q, v0, tau, 2e-3, stats=stats)
        assert stats["route"] == "native" and stats["contact_candidates_max"] > 0
        return _loss(Q, V)

    size = torch.tensor(BOX, dtype=F64, requires_grad=True)
    mu = torch.tensor(0.6, dtype=F64, requires_grad=True)
    v0 = torch.zeros(1, 8, dtype=F64)
    v0[0, :2] = torch.tensor([0.4, 0.1], dtype=F64)
    v0.requires_grad_(True)
    g = torch.cat([x.reshape(-1) for x in torch.autograd.grad(loss(size, mu, v0), (size, mu, v0))])
    x0 = torch.cat([size.detach(), mu.detach()[None], v0.detach()[0]])

    def f(x):
        with torch.no_grad():
            return float(loss(x[:3], x[3], x[None, 4:]))

    # measured: within 1.1e-8 (relative to the largest entry) of h = 1e-7's differences, 1.1e-6 of 1e-6's
    for h in (1e-6, 1e-7):
        fd = torch.tensor([(f(x0 + h * e) - f(x0 - h * e)) / (2 * h) for e in torch.eye(len(x0), dtype=F64)],
                          dtype=F64)
        err = float((fd - g).abs().max() / g.abs().max())
        assert err < 1e-4, (h, err, fd.tolist(), g.tolist())


@native
@pytest.mark.slow
def test_free_cylinder():
    """A free cylinder (its 16 rim points) tilted, spinning and sliding, landing on its rim: the native
    route against the torch step (the same C contact solver), trajectories and gradients (initial
    velocity, learnable radius and length), both adjoints."""

    def run(route, adjoint="checkpoint"):
        body = systems.box((0.2, 0.2, 0.3), 2.0, name="cyl")  # a box's inertia: any will do
        set_collision_shapes(body, body.link_names[0], Shape("cylinder", (0.1, 0.3)))
        size = torch.tensor([0.1, 0.3], dtype=F64, requires_grad=True)
        scene = Scene([body], friction=0.5, tol=1e-15, sizes={("cyl", body.link_names[0]): size})
        if route == "native":
            assert prepare_ground_kernels(scene)
        q = scene.neutral_configuration().expand(2, -1).clone()
        q[:, 2] = 0.22
        q[:, 3:7] = torch.tensor([[0.1, 0.2, 0.0, 1.0], [0.3, 0.0, 0.1, 1.0]], dtype=F64)
        q[:, 3:7] /= q[:, 3:7].norm(dim=-1, keepdim=True)
        v = torch.zeros(2, 6, dtype=F64)
        v[:, 0], v[:, 5] = 1.0, 2.0
        v.requires_grad_(True)
        tau = torch.zeros(2, 100, 6, dtype=F64)
        stats: dict = {}
        with kernels.native_mode("auto"), pytest.MonkeyPatch.context() as mp:
            if route == "torch":
                mp.setattr(rt, "ground_plan", lambda *a, **k: None)
                mp.setattr(rt, "ground_stepper", lambda *a, **k: None)
            Q, V = rollout(scene, q, v, tau, 2e-3, adjoint=adjoint, stats=stats)
            g = torch.autograd.grad(Q[:, -1, :3].sum() + V[:, -1].square().sum(), (v, size))
        return Q.detach(), g, stats

    Qn, gn, sn = run("native")
    Qa, ga, _ = run("native", "autograd")
    Qt, gt, st = run("torch")
    assert sn["route"] == "native" and st["route"].startswith("torch") and sn["contact_candidates_max"] >= 2
    # measured: trajectories 2.2e-16 apart, gradients 4.5e-14 of their largest entry
    torch.testing.assert_close(Qn, Qt, rtol=0, atol=1e-12)
    torch.testing.assert_close(Qa, Qt, rtol=0, atol=1e-12)
    for a, b, c in zip(gn, ga, gt):
        scale = float(c.abs().max())
        assert scale > 0 and float((a - c).abs().max()) <= 1e-10 * scale and float((b - c).abs().max()) <= 1e-10 * scale
