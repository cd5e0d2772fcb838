"""Policy rollouts: the time-batched reverse (step Jacobians batched over time, one policy VJP per
step, one batched VJP per chunk for the robot's parameters) and the sequential ones give the
gradients of ``adjoint="autograd"`` and of finite differences (float64)."""

from __future__ import annotations

import copy
import importlib
import os
import sys

import pytest
import torch
from torch import nn

from diffmech.sim import rollout
from test_rollout import DT, MLPPolicy, _assert_same, _fd_check, _load, _loss, _model_params, _problem

ro = importlib.import_module("diffmech.sim.rollout")


class WithOffset(nn.Module):
    """A policy plus a torque offset on the joints that it reads from a tensor computed outside."""

    def __init__(self, policy, offset):
        super().__init__()
        self.policy, self.offset = policy, offset

    def forward(self, t, q, v):
        u = self.policy(t, q, v)
        return u + torch.cat([torch.zeros(u.shape[-1] - self.offset.shape[0], dtype=u.dtype), self.offset])


class LinearFeedback(nn.Module):
    """``tau = K (q_ref - q) - D v + b`` on the joint coordinates (a floating base's are left out)."""

    def __init__(self, nq, nv, n_act, seed=0):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.nq, self.nv, self.n_act = nq, nv, n_act
        self.K = nn.Parameter(2.0 + torch.rand(n_act, dtype=DT, generator=g))
        self.D = nn.Parameter(0.1 * torch.randn(n_act, n_act, dtype=DT, generator=g))
        self.q_ref = nn.Parameter(0.1 * torch.randn(n_act, dtype=DT, generator=g))
        self.b = nn.Parameter(0.1 * torch.randn(n_act, dtype=DT, generator=g))

    def forward(self, t, q, v):
        qa, va = q[..., self.nq - self.n_act:], v[..., self.nv - self.n_act:]
        u = self.K * (self.q_ref - qa) - va @ self.D.T + self.b
        return torch.cat([torch.zeros(*u.shape[:-1], self.nv - self.n_act, dtype=u.dtype), u], -1)


def _spy(monkeypatch):
    """Record which reverse path runs: the time-batched one, and the policy VJPs per step."""
    seen = {"batched": 0, "policy_vjp": 0}
    orig_tb, orig_pv = ro._reverse_time_batched, ro._policy_vjp

    def tb(*a):
        seen["batched"] += 1
        return orig_tb(*a)

    def pv(*a):
        seen["policy_vjp"] += 1
        return orig_pv(*a)

    monkeypatch.setattr(ro, "_reverse_time_batched", tb)
    monkeypatch.setattr(ro, "_policy_vjp", pv)
    return seen


def _grads(robot, q0, v0, policy, T, dt, wq, wv, extra=(), **kw):
    q, v = rollout(robot, q0, v0, policy, dt, steps=T, params=list(extra) or None, **kw)
    inputs = [q0, v0, *_model_params(robot), *policy.parameters(), *extra]
    return inputs, torch.autograd.grad(_loss(q, v, wq, wv), inputs)


@pytest.mark.parametrize("integrator", ["semi_implicit_euler", "rk4"])
@pytest.mark.parametrize("mode", ["time_batched", "time_batched_chunks", "sequential"])
@pytest.mark.parametrize("every", [1, 3])
@pytest.mark.parametrize("learnable", [True, False])
def test_policy_paths_match_autograd(monkeypatch, integrator, mode, every, learnable):
    """MLP policy on the iiwa (two robots), with or without learnable robot mass and damping."""
    monkeypatch.setattr(ro, "TIME_BATCHED_MAX_WORK", 0 if mode == "sequential" else 10**6)
    if mode == "time_batched_chunks":
        monkeypatch.setattr(ro, "_TIME_BATCHED_CHUNK_BYTES", 1)  # one step per chunk
    seen = _spy(monkeypatch)
    T = 5
    robot, q0, v0, _, wq, wv = _problem("iiwa", (2,), T)
    if not learnable:
        robot = _load("iiwa")
    policy = MLPPolicy(robot.nq, robot.nv)
    _, g_ck = _grads(robot, q0, v0, policy, T, 1e-3, wq, wv, integrator=integrator, checkpoint_every=every)
    _, g_ag = _grads(robot, q0, v0, policy, T, 1e-3, wq, wv, integrator=integrator, adjoint="autograd")
    assert len(g_ck) == 2 + 2 * learnable + 4 and all(g.abs().max() > 0 for g in g_ck)
    _assert_same(g_ck, g_ag)
    assert (seen["batched"] > 0) == (mode != "sequential")
    # One policy VJP per step on the batched path and on the hand-written sequential one (Euler,
    # no robot parameter); the generic sequential path differentiates the policy inside the rebuilt step.
    hand = mode != "sequential" or (integrator == "semi_implicit_euler" and not learnable)
    assert seen["policy_vjp"] == (T if hand else 0)


@pytest.mark.parametrize("integrator", ["semi_implicit_euler", "rk4"])
@pytest.mark.parametrize("every", [1, 3])
def test_floating_base_policy_with_params_extras(integrator, every):
    """laikago (floating base), a linear feedback on its joints, a learnable link mass and an extra
    tensor in params= (a non-leaf torque offset): checkpoint == autograd, and finite differences."""
    robot = copy.deepcopy(_load("laikago"))
    robot.make_link_param_learnable(robot.link_names[1], "mass")
    g = torch.Generator().manual_seed(4)
    T = 4
    q0 = robot.random_configuration(1, generator=g).requires_grad_(True)
    v0 = (0.3 * torch.randn(1, robot.nv, dtype=DT, generator=g)).requires_grad_(True)
    wq = torch.randn(1, T + 1, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(1, T + 1, robot.nv, dtype=DT, generator=g)
    log_w = torch.zeros(robot.nv - 6, dtype=DT, requires_grad=True)
    offset = torch.exp(log_w) * 0.5  # non-leaf, passed in params=
    pol = WithOffset(LinearFeedback(robot.nq, robot.nv, robot.nv - 6), offset)
    dt = 2e-3
    _, g_ck = _grads(robot, q0, v0, pol, T, dt, wq, wv, extra=[offset], integrator=integrator, checkpoint_every=every)
    _, g_ag = _grads(robot, q0, v0, pol, T, dt, wq, wv, extra=[offset], integrator=integrator, adjoint="autograd")
    assert len(g_ck) == 2 + 1 + 4 + 1
    _assert_same(g_ck, g_ag)
    assert all(x.abs().max() > 0 for x in g_ck)
    # Finite differences along a random direction of q0 (tangent, quaternion kept unit), v0 and the parameters.
    with torch.no_grad():
        leaves = [v0, *_model_params(robot), *pol.parameters(), offset]
        grads = [g_ck[1], *g_ck[2:]]
        dirs = [torch.randn(x.shape, dtype=DT, generator=g) for x in leaves]
        h = 1e-6
        vals = []
        for s in (1.0, -1.0):
            for x, d in zip(leaves, dirs):
                x.add_(s * h * d)
            q, v = rollout(robot, q0, v0, pol, dt, steps=T, integrator=integrator)
            vals.append(_loss(q, v, wq, wv).item())
            for x, d in zip(leaves, dirs):
                x.sub_(s * h * d)
        fd = (vals[0] - vals[1]) / (2 * h)
        pred = sum((gr * d).sum() for gr, d in zip(grads, dirs)).item()
        assert abs(fd - pred) < 2e-6 * max(1.0, abs(fd)), (fd, pred)


@pytest.mark.parametrize("integrator", ["semi_implicit_euler", "rk4"])
def test_linear_feedback_finite_differences(integrator):
    """The time-batched policy reverse against central differences (iiwa, learnable mass and damping)."""
    T = 8
    robot, q0, v0, _, wq, wv = _problem("iiwa", (1,), T)
    policy = LinearFeedback(robot.nq, robot.nv, robot.nv)
    inputs, g_ck = _grads(robot, q0, v0, policy, T, 1e-3, wq, wv, integrator=integrator)
    _fd_check(robot, q0, v0, policy, wq, wv, 1e-3, inputs, g_ck, integrator, n_dirs=2, steps=T)


def test_tensor_controls_with_robot_parameters_take_the_batched_reverse(monkeypatch):
    """System identification (torques given, learnable mass and damping): the time-batched reverse
    with one batched parameter VJP per chunk, in one and in many chunks."""
    T = 6
    robot, q0, v0, tau, wq, wv = _problem("iiwa", (1,), T)
    seen = _spy(monkeypatch)
    for chunk_bytes, integrator in ((4 << 20, "rk4"), (1, "semi_implicit_euler")):
        monkeypatch.setattr(ro, "_TIME_BATCHED_CHUNK_BYTES", chunk_bytes)
        inputs = [q0, v0, tau, *_model_params(robot)]
        q, v = rollout(robot, q0, v0, tau, 1e-3, integrator=integrator)
        g_ck = torch.autograd.grad(_loss(q, v, wq, wv), inputs)
        q, v = rollout(robot, q0, v0, tau, 1e-3, integrator=integrator, adjoint="autograd")
        g_ag = torch.autograd.grad(_loss(q, v, wq, wv), inputs)
        _assert_same(g_ck, g_ag)
    assert seen["batched"] == 2


def test_benchmark_cell_runs_and_agrees():
    """``benchmarks/bench_policy_rollout.py`` measures what it names: one small cell of each control."""
    pytest.importorskip("diff_robot_data")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
    import bench_policy_rollout as bp

    robot = bp.load_iiwa()
    for control in bp.CONTROLS:
        c = bp.measure(robot, control, 1, "semi_implicit_euler", 4, 1)
        assert c["forward_s"] > 0 and c["backward_s"] > 0 and c["grad_rel_diff_vs_autograd"] < 1e-12
        assert c["loss_rel_diff_vs_autograd"] < 1e-12
