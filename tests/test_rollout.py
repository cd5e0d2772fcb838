"""Rollouts: checkpointed adjoint == autograd == finite differences; errors; batch shapes."""

from __future__ import annotations

import copy
import functools
import os
import warnings

import pytest
import torch
from torch import nn

import diffmech
from diffmech import JointSpec, LinkSpec, RobotModel, RobotSpec
from diffmech.errors import ConvergenceError, OptionError, ShapeError, SimulationError
from diffmech.sim import INTEGRATORS, rollout

DT = torch.float64
INTEGRATOR_NAMES = sorted(INTEGRATORS)


def two_link_arm(damping=0.15) -> RobotModel:
    """A two-link arm: a hinge about +y, then one about +x (non-planar), with joint damping."""
    links = [LinkSpec("base", has_inertial=False),
             LinkSpec("upper", 1.2, (0.02, 0.0, -0.25), ((0.03, 0.001, 0.0), (0.001, 0.025, 0.0), (0.0, 0.0, 0.01))),
             LinkSpec("fore", 0.8, (0.0, 0.01, -0.2), ((0.02, 0.0, 0.0), (0.0, 0.018, 0.002), (0.0, 0.002, 0.006)))]
    joints = [JointSpec("shoulder", "revolute", "base", "upper", axis=(0.0, 1.0, 0.0), damping=damping),
              JointSpec("elbow", "revolute", "upper", "fore", xyz=(0.0, 0.0, -0.5), axis=(1.0, 0.0, 0.0),
                        damping=damping)]
    return RobotModel(RobotSpec("arm2", links, joints))


@functools.cache
def _load(which: str) -> RobotModel:
    if which == "iiwa":
        pkg = pytest.importorskip("diff_robot_data")
        path = os.path.join(list(pkg.__path__)[0], "kuka_iiwa/urdf/iiwa7.urdf")
        fb = False
    else:
        path = os.path.join(pytest.importorskip("pybullet_data").getDataPath(), "laikago/laikago_toes_zup.urdf")
        fb = True
    if not os.path.isfile(path):
        pytest.skip(f"{path} not found")
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*has no <inertial>.*")
        return diffmech.load_urdf(path, floating_base=fb)


def make_robot(which: str) -> RobotModel:
    """A fresh model with a learnable link mass and a learnable joint damping."""
    if which == "arm":
        robot = two_link_arm()
        robot.make_link_param_learnable("fore", "mass")
        robot.make_link_param_learnable("upper", "damping")
    else:
        robot = copy.deepcopy(_load("iiwa"))
        with torch.no_grad():  # the iiwa's URDF has no damping: give joint 3 some
            robot.joint_params(robot.all_joint_names[2]).damping.fill_(0.5)  # parent joint of link 3
        robot.make_link_param_learnable(robot.link_names[4], "mass")
        robot.make_link_param_learnable(robot.link_names[3], "damping")
    return robot


class MLPPolicy(nn.Module):
    """tau = W2 tanh(W1 [q, v, t] + b1) + b2."""

    def __init__(self, nq, nv, hidden=8, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.l1 = nn.Linear(nq + nv + 1, hidden, dtype=DT)
        self.l2 = nn.Linear(hidden, nv, dtype=DT)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=DT))

    def forward(self, t, q, v):
        tt = torch.full((*q.shape[:-1], 1), t, dtype=q.dtype)
        return self.l2(torch.tanh(self.l1(torch.cat([q, v, tt], -1))))


def _problem(which, batch, T, seed=0):
    robot = make_robot(which)
    g = torch.Generator().manual_seed(seed)
    q0 = robot.random_configuration(*batch, generator=g).mul(0.5).requires_grad_(True)
    v0 = torch.randn(*batch, robot.nv, dtype=DT, generator=g).requires_grad_(True)
    tau = torch.randn(*batch, T, robot.nv, dtype=DT, generator=g).requires_grad_(True)
    wq = torch.randn(*batch, T + 1, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(*batch, T + 1, robot.nv, dtype=DT, generator=g)
    return robot, q0, v0, tau, wq, wv


def _loss(q, v, wq, wv):
    """Uses every state of the trajectory, nonlinearly."""
    return (q * wq).sum() + 0.5 * (v * v * wv.abs()).sum() + (torch.sin(q[..., -1, :]) ** 2).sum()


def _model_params(robot):
    return [p for p in robot.parameters() if p.requires_grad]


def _grads(robot, q0, v0, tau, wq, wv, dt, **kw):
    q, v = rollout(robot, q0, v0, tau, dt, **kw)
    loss = _loss(q, v, wq, wv)
    inputs = [q0, v0] + ([tau] if isinstance(tau, torch.Tensor) else []) + _model_params(robot)
    if isinstance(tau, nn.Module):
        inputs += list(tau.parameters())
    return inputs, torch.autograd.grad(loss, inputs)


def _fd_check(robot, q0, v0, tau, wq, wv, dt, inputs, grads, integrator, n_dirs=2, h=1e-6, seed=5, steps=None):
    """Central differences of the loss along random joint directions of all inputs."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(n_dirs):
        dirs = [torch.randn(x.shape, dtype=DT, generator=g) for x in inputs]
        pred = sum((gr * d).sum() for gr, d in zip(grads, dirs)).item()
        vals = []
        for s in (1.0, -1.0):
            with torch.no_grad():
                for x, d in zip(inputs, dirs):
                    x.add_(s * h * d)
                q, v = rollout(robot, q0, v0, tau, dt, integrator=integrator, steps=steps)
                vals.append(_loss(q, v, wq, wv).item())
                for x, d in zip(inputs, dirs):
                    x.sub_(s * h * d)
        fd = (vals[0] - vals[1]) / (2 * h)
        assert abs(fd - pred) < 2e-6 * max(1.0, abs(fd)), (fd, pred)


def _assert_same(ga, gb, tol=1e-10):
    for a, b in zip(ga, gb):
        scale = max(1.0, b.abs().max().item())
        assert (a - b).abs().max().item() < tol * scale, ((a - b).abs().max().item(), scale)


CASES = [("arm", (2,), 12, 0.01), ("iiwa", (2,), 5, 1e-3)]


@pytest.mark.parametrize("integrator", INTEGRATOR_NAMES)
@pytest.mark.parametrize("which,batch,T,dt", CASES, ids=[c[0] for c in CASES])
def test_open_loop_gradients(integrator, which, batch, T, dt):
    if INTEGRATORS[integrator].implicit:
        T = min(T, 6)  # implicit steps cost ~15 explicit ones
    robot, q0, v0, tau, wq, wv = _problem(which, batch, T)
    inputs, g_ck = _grads(robot, q0, v0, tau, wq, wv, dt, integrator=integrator, adjoint="checkpoint")
    _, g_ag = _grads(robot, q0, v0, tau, wq, wv, dt, integrator=integrator, adjoint="autograd")
    assert len(g_ck) == 5  # q0, v0, tau, mass, damping
    assert all(g.abs().max() > 0 for g in g_ck)
    _assert_same(g_ck, g_ag)
    _fd_check(robot, q0, v0, tau, wq, wv, dt, inputs, g_ck, integrator)


@pytest.mark.parametrize("integrator", INTEGRATOR_NAMES)
@pytest.mark.parametrize("which,batch,T,dt", CASES, ids=[c[0] for c in CASES])
def test_policy_gradients(integrator, which, batch, T, dt):
    if INTEGRATORS[integrator].implicit:
        T = min(T, 5)
    robot, q0, v0, _, wq, wv = _problem(which, batch, T)
    policy = MLPPolicy(robot.nq, robot.nv)
    inputs, g_ck = _grads(robot, q0, v0, policy, wq, wv, dt, integrator=integrator, steps=T)
    _, g_ag = _grads(robot, q0, v0, policy, wq, wv, dt, integrator=integrator, steps=T, adjoint="autograd")
    assert len(g_ck) == 4 + 4  # q0, v0, mass, damping, two weights, two biases
    _assert_same(g_ck, g_ag)
    _fd_check(robot, q0, v0, policy, wq, wv, dt, inputs, g_ck, integrator, n_dirs=1, steps=T)


def test_closure_policy_with_explicit_params():
    """A plain function's captured tensors receive gradients when listed in params=."""
    robot, q0, v0, _, wq, wv = _problem("arm", (3,), 10)
    log_gain = torch.tensor([1.0, 0.5], dtype=DT, requires_grad=True)
    gain = log_gain.exp()  # a non-leaf tensor read by the closure
    q_ref = torch.tensor([0.3, -0.2], dtype=DT, requires_grad=True)

    def pd(t, q, v):
        return -gain * (q - q_ref) - 0.1 * v

    out = {}
    for adjoint in ("checkpoint", "autograd"):
        q, v = rollout(robot, q0, v0, pd, 0.01, steps=10, params=[gain, q_ref], adjoint=adjoint)
        out[adjoint] = torch.autograd.grad(_loss(q, v, wq, wv), [log_gain, q_ref, q0], retain_graph=True)
    _assert_same(out["checkpoint"], out["autograd"])
    assert out["checkpoint"][0].abs().min() > 0


@pytest.mark.parametrize("integrator,every,T", [("semi_implicit_euler", 3, 13), ("semi_implicit_euler", 5, 13),
                                                ("rk4", 4, 13), ("variational_midpoint", 3, 7)])
def test_checkpoint_interval(integrator, every, T):
    robot, q0, v0, tau, wq, wv = _problem("arm", (2,), T)
    stats1: dict = {}
    _, g1 = _grads(robot, q0, v0, tau, wq, wv, 0.01, integrator=integrator, checkpoint_every=1, stats=stats1)
    stats: dict = {}
    _, gk = _grads(robot, q0, v0, tau, wq, wv, 0.01, integrator=integrator, checkpoint_every=every, stats=stats)
    _assert_same(gk, g1, tol=1e-12)
    assert stats1["recomputed_steps"] == 0 and stats["recomputed_steps"] == T
    # Saved: every k-th state (B = 2, nq = nv = 2, float64); with k = 1 also the accelerations
    # of explicit integrators, replayed in the backward pass instead of recomputed.
    assert stats["saved_state_bytes"] == (T // every + 1) * 2 * (2 + 2) * 8
    S = INTEGRATORS[integrator].accel_calls
    assert stats1["saved_state_bytes"] == (T + 1) * 2 * (2 + 2) * 8 + T * S * 2 * 2 * 8


@pytest.mark.parametrize("integrator", ["semi_implicit_euler", "rk4"])
@pytest.mark.parametrize("learnable", [True, False])  # False: the replayed steps take the hand-written RNEA VJP
def test_floating_base_laikago(integrator, learnable):
    robot = copy.deepcopy(_load("laikago"))
    if learnable:
        robot.make_link_param_learnable(robot.link_names[1], "mass")
    g = torch.Generator().manual_seed(3)
    T = 4
    q0 = robot.random_configuration(2, generator=g).requires_grad_(True)
    v0 = (0.5 * torch.randn(2, robot.nv, dtype=DT, generator=g)).requires_grad_(True)
    tau = torch.randn(2, T, robot.nv, dtype=DT, generator=g)
    tau[..., :6] = 0.0  # unactuated base
    tau.requires_grad_(True)
    wq = torch.randn(2, T + 1, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(2, T + 1, robot.nv, dtype=DT, generator=g)
    _, g_ck = _grads(robot, q0, v0, tau, wq, wv, 1e-3, integrator=integrator)
    q, _ = rollout(robot, q0, v0, tau, 1e-3, integrator=integrator)
    assert torch.allclose(q[..., 3:7].norm(dim=-1), torch.ones(2, T + 1, dtype=DT), atol=1e-14)
    _, g_ag = _grads(robot, q0, v0, tau, wq, wv, 1e-3, integrator=integrator, adjoint="autograd")
    _assert_same(g_ck, g_ag)


@pytest.mark.parametrize("batch", [(), (3,), (2, 2)])
def test_batch_shapes(batch):
    robot = two_link_arm()
    g = torch.Generator().manual_seed(0)
    T = 6
    q0 = torch.randn(*batch, 2, dtype=DT, generator=g)
    v0 = torch.randn(2, dtype=DT, generator=g)  # broadcast
    tau = torch.randn(*batch, T, 2, dtype=DT, generator=g)
    q, v = rollout(robot, q0, v0, tau, 0.01)
    assert q.shape == (*batch, T + 1, 2) and v.shape == (*batch, T + 1, 2)
    assert torch.equal(q[..., 0, :], q0) and torch.equal(v[..., 0, :], v0.expand(*batch, 2))
    # Each batch element equals its own unbatched rollout.
    for idx in [()] if not batch else [tuple(0 for _ in batch), tuple(s - 1 for s in batch)]:
        qi, vi = rollout(robot, q0[idx], v0, tau[idx], 0.01)
        assert torch.allclose(qi, q[idx], atol=1e-14) and torch.allclose(vi, v[idx], atol=1e-14)


def test_zero_steps_and_no_grad_path():
    robot = two_link_arm()
    q0 = torch.tensor([0.1, 0.2], dtype=DT, requires_grad=True)
    v0 = torch.zeros(2, dtype=DT)
    q, v = rollout(robot, q0, v0, torch.zeros(0, 2, dtype=DT), 0.01)
    assert q.shape == (1, 2)
    (q.sum()).backward()
    assert torch.equal(q0.grad, torch.ones(2, dtype=DT))
    with torch.no_grad():
        q, v = rollout(robot, q0, v0, torch.zeros(5, 2, dtype=DT), 0.01)
    assert q.grad_fn is None and q.shape == (6, 2)


def _graph_size(t: torch.Tensor) -> int:
    seen, stack = set(), [t.grad_fn]
    while stack:
        fn = stack.pop()
        if fn is None or fn in seen:
            continue
        seen.add(fn)
        stack.extend(f for f, _ in fn.next_functions)
    return len(seen)


def test_checkpoint_keeps_no_graph():
    """The checkpointed rollout's graph is one node (plus input plumbing) whatever the horizon."""
    robot = make_robot("arm")
    sizes = []
    for T in (5, 40):
        q0 = torch.zeros(2, dtype=DT, requires_grad=True)
        tau = torch.zeros(T, 2, dtype=DT, requires_grad=True)
        q, _ = rollout(robot, q0, torch.zeros(2, dtype=DT), tau, 0.01)
        sizes.append(_graph_size(q))
        q_ag, _ = rollout(robot, q0, torch.zeros(2, dtype=DT), tau, 0.01, adjoint="autograd")
        assert _graph_size(q_ag) > 5 * T
    assert sizes[0] == sizes[1] < 20


def test_non_finite_state_names_step_and_element():
    robot = two_link_arm()
    T = 50
    tau = torch.zeros(3, T, 2, dtype=DT)
    tau[1, 37, 0] = float("inf")
    for adjoint in ("checkpoint", "autograd"):
        with pytest.raises(SimulationError, match=r"step 37 .*batch element \(1,\)"):
            rollout(robot, torch.zeros(3, 2, dtype=DT), torch.zeros(3, 2, dtype=DT), tau, 0.01, adjoint=adjoint)
    with pytest.raises(SimulationError, match="initial state"):
        rollout(robot, torch.tensor([float("nan"), 0.0], dtype=DT), torch.zeros(2, dtype=DT),
                torch.zeros(3, 2, dtype=DT), 0.01)


def test_variational_non_convergence_names_step():
    robot = two_link_arm(damping=0.0)
    T = 8
    tau = torch.zeros(T, 2, dtype=DT)
    tau[4] = float("nan")
    for adjoint in ("checkpoint", "autograd"):
        with pytest.raises(SimulationError, match=r"'tau' is not finite at step 4 \(t = 0.04 s\), joint 'shoulder'"):
            rollout(robot, torch.zeros(2, dtype=DT), torch.zeros(2, dtype=DT), tau, 0.01,
                    integrator="variational_midpoint", adjoint=adjoint)
        # A policy's output is checked in chunks: the implicit step meets it first.
        with pytest.raises(ConvergenceError, match=r"\(step 4\).*residual norm nan.*not finite"):
            rollout(robot, torch.zeros(2, dtype=DT), torch.zeros(2, dtype=DT), lambda t, q, v: tau[round(t / 0.01)],
                    0.01, steps=T, integrator="variational_midpoint", adjoint=adjoint)
    tau[4] = 1e6  # a kick to ~1e3 rad/s: no midpoint root within reach once the arm whirls
    with pytest.raises(ConvergenceError, match=r"\(step [4-7]\): did not converge after 30 iterations.*residual norm"):
        rollout(robot, torch.zeros(2, dtype=DT), torch.zeros(2, dtype=DT), tau, 0.01, integrator="variational_midpoint")


def test_bad_arguments():
    robot = two_link_arm()
    q0, v0 = torch.zeros(2, dtype=DT), torch.zeros(2, dtype=DT)
    tau = torch.zeros(4, 2, dtype=DT)
    with pytest.raises(OptionError, match="adjoint"):
        rollout(robot, q0, v0, tau, 0.01, adjoint="magic")
    with pytest.raises(ShapeError, match="checkpoint_every"):
        rollout(robot, q0, v0, tau, 0.01, checkpoint_every=0)
    with pytest.raises(ShapeError, match="'steps' is required"):
        rollout(robot, q0, v0, lambda t, q, v: v, 0.01)
    with pytest.raises(ShapeError, match=r"'tau' must have shape \(\.\.\., T, 2\)"):
        rollout(robot, q0, v0, torch.zeros(4, 3, dtype=DT), 0.01)
    with pytest.raises(ShapeError, match="do not broadcast"):
        rollout(robot, torch.zeros(3, 2, dtype=DT), v0, torch.zeros(2, 4, 2, dtype=DT), 0.01)
    with pytest.raises(ShapeError, match="dt must be"):
        rollout(robot, q0, v0, tau, -0.1)
    with pytest.raises(ShapeError, match="policy returned shape"):
        rollout(robot, q0, v0, lambda t, q, v: torch.zeros(5, dtype=DT), 0.01, steps=3)


def test_external_forces_gradient():
    robot = two_link_arm()
    g = torch.Generator().manual_seed(2)
    T = 8
    f_ext = torch.randn(2, T, robot.n_links, 6, dtype=DT, generator=g).requires_grad_(True)
    q0 = torch.randn(2, 2, dtype=DT, generator=g)
    tau = torch.zeros(T, 2, dtype=DT)
    res = {}
    for adjoint in ("checkpoint", "autograd"):
        q, v = rollout(robot, q0, torch.zeros(2, dtype=DT), tau, 0.01, f_ext=f_ext, adjoint=adjoint,
                       integrator="midpoint")
        res[adjoint] = torch.autograd.grad((q**2).sum() + (v**2).sum(), f_ext)
    _assert_same(res["checkpoint"], res["autograd"])
    assert res["checkpoint"][0][:, :, 2:].abs().max() > 0  # the moving links feel their forces


# ---------------------------------------------------------------- hand-written reverse steps
@pytest.mark.parametrize("integrator", ["euler", "semi_implicit_euler"])
@pytest.mark.parametrize("which, batch", [("iiwa", (1,)), ("laikago", (1,)), ("laikago", (2,))])
@pytest.mark.parametrize("mode", ["time_batched", "time_batched_chunks", "sequential"])
@pytest.mark.parametrize("every", [1, 3])
def test_hand_reverse_steps_match_autograd(monkeypatch, integrator, which, batch, mode, every):
    """State-only gradients (tensor controls, no learnable parameter) take the hand-written reverse
    step: sequentially, or with the step Jacobians batched over time (in one chunk or in several)."""
    import importlib

    ro = importlib.import_module("diffmech.sim.rollout")

    monkeypatch.setattr(ro, "TIME_BATCHED_MAX_WORK", 0 if mode == "sequential" else 10**6)
    if mode == "time_batched_chunks":
        monkeypatch.setattr(ro, "_TIME_BATCHED_CHUNK_BYTES", 1)  # one step per chunk
    cls = type(diffmech.sim.get_integrator(integrator))
    calls = []
    orig = cls.step_vjp_flat
    monkeypatch.setattr(cls, "step_vjp_flat", lambda self, *a: calls.append(a[1].shape[0]) or orig(self, *a))
    robot = _load(which)
    g = torch.Generator().manual_seed(11)
    T = 7
    q0 = robot.random_configuration(*batch, generator=g).requires_grad_(True)
    v0 = (0.5 * torch.randn(*batch, robot.nv, dtype=DT, generator=g)).requires_grad_(True)
    tau = torch.randn(*batch, T, robot.nv, dtype=DT, generator=g).requires_grad_(True)
    wq = torch.randn(*batch, T + 1, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(*batch, T + 1, robot.nv, dtype=DT, generator=g)
    kw = dict(integrator=integrator)
    _, g_ck = _grads(robot, q0, v0, tau, wq, wv, 1e-2, checkpoint_every=every, **kw)
    _, g_ag = _grads(robot, q0, v0, tau, wq, wv, 1e-2, adjoint="autograd", **kw)
    _assert_same(g_ck, g_ag)
    # The hand-written path ran: once per step, or on (steps x unit cotangents) rows per chunk.
    m = robot.nq + robot.nv
    B = batch[0]
    if mode == "sequential":
        assert calls == [B] * T
    elif mode == "time_batched_chunks":
        assert calls == [m * B] * T
    else:
        assert sum(calls) == T * m * B and all(c % (m * B) == 0 for c in calls)
        assert len(calls) < T  # several steps per call
