"""The contact step's first stage as one native kernel (``diffmech.sim._ground_step``): its lane
program against the torch step's own quantities, and the native step against the torch step --
trajectories, impulses and gradients (w.r.t. torques, drive gains, friction, a foot's radius) --
with contacts made and broken and a joint limit reached. float64 unless said."""

from __future__ import annotations

import importlib

import pytest
import torch

import diffmech
from diffmech.dynamics import kernels, lanes
from diffmech.dynamics.kernel_store import available
from diffmech.sim import Scene, prepare_ground_kernels, rollout
from diffmech.sim import _ground_step as gs
from hopper_scene import make_scene as _scene
from hopper_scene import start_state as _start

cs = importlib.import_module("diffmech.sim.contact_step")
rt = importlib.import_module("diffmech.sim.route")
cr = importlib.import_module("diffmech.sim.contact_rollout")
F64 = torch.float64


def _torch_stage(scene, q, v, tau, dt):
    """The torch step's v_free, Cholesky factor, gaps and ground rows (all balls, the plan's order)."""
    n = scene.names[0]
    m = scene.models[n]
    kp, kd, ref, arm = scene.drives[n]
    nj = kp.shape[0]
    M = m.mass_matrix(q) + torch.diag_embed(torch.nn.functional.pad(arm + dt * kd + dt * dt * kp, (m.nv - nj, 0)))
    f = tau - m.bias_forces(q, v)
    fj = kp * (ref - q[:, m.nq - nj:]) - (kd + dt * kp) * v[:, m.nv - nj:]
    f = torch.cat([f[:, :m.nv - nj], f[:, m.nv - nj:] + fj], -1)
    L = torch.linalg.cholesky(M)
    acc = torch.cholesky_solve(f[..., None], L)[..., 0]
    if m.floating_base:
        acc = torch.cat([acc[:, :3] + torch.linalg.cross(v[:, 3:6], v[:, :3]), acc[:, 3:]], -1)
    layout = cs._shape_layout(scene, n, F64, q.device)
    T, Jw = cs.poses_and_world_jacobians(m, q, list(scene.shapes[n]))
    R, p = cs._placed(T[:, layout.links][..., :3, :3], T[:, layout.links][..., :3, 3], layout)
    items = [cs._item(scene, n, link, k, sh, j) for link, k, sh, j in layout.shapes]
    g = cs._ground_candidates(items, list(range(len(items))), R, p)
    Jc = torch.cat([Jw[:, [items[i][5]]].expand(-1, c, -1, -1) for i, c in zip(range(len(items)), g.counts)], 1)
    # _ground_candidates orders the kinds as they first appear: the same order as the plan's
    Js = Jc[:, :, :3] + torch.linalg.cross(Jc[:, :, 3:], g.point[..., None], dim=-2)
    return v + dt * acc, L, g.phi, cs._GROUND_FRAME.to(F64) @ Js


def _lane_stage(scene, plan, q, v, tau, dt):
    m = scene.models[plan.name]
    B = q.shape[0]
    drive = torch.cat(scene.drives[plan.name]).expand(B, -1)
    balls = gs._balls(scene, plan, F64).expand(B, -1)
    out = lanes.ground_step_lanes(m.tree, m.model_tensors(F64), q.t(), v.t(), tau.t(), drive.t(), balls.t(),
                                  torch.full((1, B), dt, dtype=F64), plan.links).t()
    nv, nb = m.nv, len(plan.links)
    return (out[:, :nv], out[:, nv:nv + nv * nv].reshape(B, nv, nv), out[:, nv + nv * nv:nv + nv * nv + nb],
            out[:, nv + nv * nv + nb:].reshape(B, nb, 3, nv))


@pytest.mark.parametrize("which", ["hopper", "ant"])
def test_lane_program_equals_the_torch_stage(which):
    if which == "hopper":
        scene = _scene()
    else:
        from diffmech.rl import Ant

        ant = Ant(2, native=False)
        scene = ant.scene
        if not scene.drives:  # the Ant's motors are torques: give it drives to cover them too
            scene = Scene([scene.models["ant"]], drives={"ant": {"stiffness": 30.0, "damping": 2.0}})
    plan = gs._plan(scene, F64)
    assert plan is not None
    gen = torch.Generator().manual_seed(4)
    q = scene.neutral_configuration().expand(3, -1).clone()
    m = scene.models[scene.names[0]]
    q[:, 7:] += 0.3 * torch.randn(3, m.nq - 7, generator=gen, dtype=F64)
    q[:, 3:7] += 0.2 * torch.randn(3, 4, generator=gen, dtype=F64)
    q[:, 2] = 0.3
    v = torch.randn(3, m.nv, generator=gen, dtype=F64)
    tau = torch.randn(3, m.nv, generator=gen, dtype=F64)
    with torch.no_grad():
        got = _lane_stage(scene, plan, q, v, tau, 2e-3)
        want = _torch_stage(scene, q, v, tau, 2e-3)
    for a, b, name in zip(got, want, ("v_free", "L", "phi", "rows")):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=name)


native = pytest.mark.skipif(not available(), reason="no C compiler")


def _count_backwards(monkeypatch) -> list:
    """A list that grows by one per call of the native ground step's hand-written backward."""
    calls: list = []
    real = gs._GroundVelocity.backward

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(gs._GroundVelocity, "backward", spy)
    return calls


def _spy_stages(monkeypatch) -> list:
    """A list that grows by one per native stage of a step: whether it came with its own graph."""
    seen: list = []
    real = gs.ground_stage

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out is not None and not out.by_hand)
        return out

    monkeypatch.setattr(rt, "ground_stage", spy)
    return seen


def _loss(qs, vs):
    return (qs[:, -1, 0] + 2 * qs[:, -1, 2] + qs[:, -1, 7]).sum() + (vs[:, -1, 0] ** 2).sum()


def _run(scene, q, v, tau, dt, fused, loss, adjoint="checkpoint", monkeypatch=None):
    """Roll out and backpropagate ``loss(qs, vs)`` with native kernels on (the backward pass replays the
    steps: under the same mode), through the native ground step (``fused``) or the torch step, each step
    by :func:`~diffmech.sim.contact_step` (the checkpointed rollout's own stepper for this route is
    ``tests/test_contact_ground_rollout.py``'s)."""
    if not fused:
        monkeypatch.setattr(rt, "ground_plan", lambda *a, **k: None)
    stats: dict = {}
    with kernels.native_mode("auto"), pytest.MonkeyPatch.context() as mp:
        mp.setattr(rt, "ground_stepper", lambda *a, **k: None)
        qs, vs = rollout(scene, q, v, tau, dt, adjoint=adjoint, stats=stats)
        loss(qs, vs).backward()
    if not fused:
        monkeypatch.undo()
    return qs.detach(), vs.detach(), stats


@native
def test_native_step_equals_the_torch_step_with_its_gradients(monkeypatch):
    T, dt = 150, 2e-3
    grads = {}
    for fused in (False, True):
        kp = torch.tensor(40.0, dtype=F64, requires_grad=True)
        mu = torch.tensor(0.6, dtype=F64, requires_grad=True)
        r = torch.tensor(0.03, dtype=F64, requires_grad=True)
        scene = _scene(kp, mu, r)
        assert prepare_ground_kernels(scene)
        q, v = _start(scene)
        tau = torch.zeros(2, T, scene.nv, dtype=F64)
        tau[:, :, 6:] = 0.3
        tau.requires_grad_(True)
        infos = []
        with kernels.native_mode("auto"):  # one step by hand: the same contact set and impulses
            if not fused:
                monkeypatch.setattr(rt, "ground_plan", lambda *a, **k: None)
            info: dict = {}
            q1, v1 = diffmech.sim.contact_step(scene, q + torch.tensor([0, 0, -0.035] + [0] * 6, dtype=F64), v,
                                               tau[:, 0].detach(), dt, info=info)
            monkeypatch.undo()
            infos.append((q1, v1, info))
        backwards = _count_backwards(monkeypatch)
        qs, vs, st = _run(scene, q, v, tau, dt, fused, _loss, monkeypatch=monkeypatch)
        monkeypatch.undo()
        assert (len(backwards) > T // 2) if fused else not backwards  # the hand-written node of most steps
        grads[fused] = (qs, tau.grad, kp.grad, mu.grad, r.grad, st, infos)
    # what the trajectory goes through: the contact sets of its steps (native path, no graph)
    scene = _scene()
    q, v = _start(scene)
    sets = []
    with kernels.native_mode("auto"), torch.no_grad():
        for _ in range(T):
            info = {}
            q, v = diffmech.sim.contact_step(scene, q, v, torch.full((2, scene.nv), 0.3, dtype=F64) * (
                torch.arange(scene.nv) >= 6), dt, info=info)
            sets.append(frozenset(info["lam"]))
    keys = set().union(*sets)
    assert len(set(sets)) > 3  # contacts made and broken
    assert any(isinstance(k[0], str) for k in keys)  # a joint limit reached
    capsule = list(scene.shapes["hopper"]).index("body")  # one shape per link: the item's index
    assert any(k[0] == capsule for k in keys)  # the capsule touched the ground
    a, b = grads[False], grads[True]
    q1a, v1a, ia = a[6][0]
    q1b, v1b, ib = b[6][0]
    assert ia["candidates"] == ib["candidates"] > 0 and list(ia["lam"]) == list(ib["lam"])
    torch.testing.assert_close(q1a, q1b, rtol=0, atol=1e-12)
    torch.testing.assert_close(v1a, v1b, rtol=0, atol=1e-9)
    # through the contact changes above, the two paths' rounding stays below 1e-10 (1e-13 measured); the
    # gradients agree to 1e-12 (measured 9e-14 to 8e-13)
    torch.testing.assert_close(a[0], b[0], rtol=0, atol=1e-10)
    for ga, gb, name in zip(a[1:5], b[1:5], ("tau", "stiffness", "friction", "radius")):
        assert gb is not None and torch.isfinite(gb).all(), name
        err = float((ga - gb).abs().max() / ga.abs().max().clamp_min(1e-12))
        assert err < 1e-9, (name, err)


@native
def test_native_step_is_taken_and_checkpoint_equals_autograd(monkeypatch):
    scene = _scene()
    assert prepare_ground_kernels(scene)
    q, v = _start(scene)
    seen = []
    real = gs.ground_stage

    def spy(*a, **k):
        out = real(*a, **k)
        seen.append(out is not None)
        return out

    monkeypatch.setattr(rt, "ground_stage", spy)
    T, dt = 60, 2e-3
    out = {}
    for adjoint in ("checkpoint", "autograd"):
        tau = torch.full((2, T, scene.nv), 0.2, dtype=F64, requires_grad=True)
        qs, vs, _ = _run(scene, q, v, tau, dt, True, lambda qs, vs: qs[:, -1, :3].sum() + vs[:, -1].square().sum(),
                         adjoint)
        out[adjoint] = (qs, tau.grad)
    assert seen and all(seen)
    torch.testing.assert_close(out["checkpoint"][0], out["autograd"][0], rtol=0, atol=0)
    torch.testing.assert_close(out["checkpoint"][1], out["autograd"][1], rtol=1e-10, atol=1e-12)


@native
def test_native_stage_gradcheck():
    scene = _scene()
    prepare_ground_kernels(scene)
    with kernels.native_mode("auto"):
        plan = gs.ground_plan(scene, torch.zeros(1, dtype=F64))
        assert plan is not None
        q, v = _start(scene)
        tau = torch.randn(2, scene.nv, dtype=F64, generator=torch.Generator().manual_seed(1))

        def f(q, v, tau):  # the kernel's reverse mode (the stage with its own node) against finite differences
            stage = gs.with_graph(scene, plan, gs.ground_stage(scene, plan, q, v, tau, 2e-3))
            assert not stage.by_hand
            return torch.cat([x.flatten(1) for x in stage[:4]], 1)

        torch.autograd.gradcheck(f, (q.requires_grad_(), v.requires_grad_(), tau.requires_grad_()), eps=1e-6,
                                 atol=1e-6, rtol=1e-5)


@native
def test_native_step_float32():
    scene = _scene().to(torch.float32)
    assert prepare_ground_kernels(scene, dtypes=(torch.float32,))
    q, v = _start(_scene())
    tau = torch.zeros(2, 100, scene.nv)
    with kernels.native_mode("auto"):
        plan = gs.ground_plan(scene, q.float())
        assert plan is not None
        qs32, _ = rollout(scene, q.float(), v.float(), tau, 2e-3)
    scene64 = _scene()
    prepare_ground_kernels(scene64)
    with kernels.native_mode("auto"):
        qs64, _ = rollout(scene64, q, v, tau.double(), 2e-3)
    assert float((qs32.double() - qs64).abs().max()) < 1e-4


@native
def test_native_step_gradient_wrt_a_link_mass(monkeypatch):
    """A learnable link mass: the stage then keeps its own node (the kernel's reverse mode with the
    inertial parameters' cotangents, ``prepare_ground_kernels(parameters=True)``)."""
    T, dt = 80, 2e-3
    got = {}
    for fused in (False, True):
        scene = _scene()
        robot = scene.models["hopper"]
        robot.make_link_param_learnable("left", "mass")
        assert prepare_ground_kernels(scene, parameters=True)
        q, v = _start(scene)
        tau = torch.zeros(2, T, scene.nv, dtype=F64)
        stages = _spy_stages(monkeypatch)
        _run(scene, q, v, tau, dt, fused, _loss, monkeypatch=monkeypatch)
        monkeypatch.undo()
        # the forward pass by the stepper's one-node step (no stage of this route), each step's replay in
        # the backward pass with the stage's own node
        assert (len(stages), sum(stages)) == ((T, T) if fused else (0, 0))
        (p,) = [t for name, t in robot.learnable_parameters().items() if "left" in name]
        got[fused] = p.grad.clone()
    assert float(got[False].abs().max()) > 0
    torch.testing.assert_close(got[True], got[False], rtol=1e-9, atol=1e-12)


@native
def test_a_scene_that_ran_the_native_step_still_copies_and_saves():
    import copy
    import io

    scene = _scene()
    assert prepare_ground_kernels(scene)
    q, v = _start(scene)
    tau = torch.zeros(2, scene.nv, dtype=F64)
    with kernels.native_mode("auto"):
        want = diffmech.sim.contact_step(scene, q, v, tau, 2e-3)
        assert gs._PLANS.get(scene)  # the route was planned (beside the scene, not in it)
        twin = copy.deepcopy(scene)
        torch.save(scene, io.BytesIO())
        got = diffmech.sim.contact_step(twin, q, v, tau, 2e-3)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
