"""Sparse checkpoints in contact rollouts (``checkpoint_every``): the backward pass recomputes each
segment from its checkpoint, so the gradient must equal the dense-checkpoint one bit for bit (the
recomputed steps repeat the forward pass's operations and warm starts) while the saved states
shrink."""

from __future__ import annotations

import functools

import pytest
import torch

from diffmech import RobotModel
from diffmech.errors import DiffmechError
from diffmech.model import systems
from diffmech.model.spec import JointSpec, LinkSpec, RobotSpec
from diffmech.sim import Scene, contact_step, rollout

F64 = torch.float64


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    from diffmech.contact import pgs_native

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


def _bouncing_pair():
    """A ball bouncing on a box that slides on the ground: contacts made and broken, two bodies,
    friction and restitution tensors that receive gradients; a batch of two environments."""
    ball, box = systems.sphere(0.05, 0.3, name="ball"), systems.box((0.3, 0.3, 0.1), 2.0, name="box")
    mu = torch.tensor(0.4, dtype=F64, requires_grad=True)
    e = torch.tensor(0.5, dtype=F64, requires_grad=True)
    scene = Scene([ball, box], friction=mu, restitution=e)
    q0 = scene.neutral_configuration().clone()
    q0[scene.slices["ball"]][:3] = torch.tensor([0.02, 0.0, 0.16], dtype=F64)  # lands on the box at ~45 ms
    q0[scene.slices["box"]][:3] = torch.tensor([0.0, 0.0, 0.05], dtype=F64)
    v0 = torch.zeros(2, scene.nv, dtype=F64)
    v0[:, scene.vslices["box"].start] = torch.tensor([0.6, 0.3], dtype=F64)
    return scene, q0.expand(2, -1).clone(), v0, (mu, e)


def _grads(K, T=90, policy=None):
    scene, q0, v0, coeffs = _bouncing_pair()
    q0.requires_grad_()
    v0.requires_grad_()
    st: dict = {}
    if policy is None:
        tau = torch.zeros(2, T, scene.nv, dtype=F64)
        tau[:, :, scene.vslices["box"].start] = 0.5
        tau.requires_grad_()
        Q, V = rollout(scene, q0, v0, tau, 1e-3, checkpoint_every=K, stats=st)
        ins = [q0, v0, tau, *coeffs]
    else:
        Q, V = rollout(scene, q0, v0, policy, 1e-3, steps=T, checkpoint_every=K, stats=st)
        ins = [q0, v0, *coeffs, *policy.parameters()]
    loss = Q[:, -1, :3].square().sum() + V[:, T // 2].sum() + Q[:, 40, 2].sum()
    return torch.autograd.grad(loss, ins), Q.detach(), st


@functools.cache
def _dense():
    return _grads(1)


@pytest.mark.parametrize("K", [4, 90, 1000])
def test_sparse_checkpoints_give_the_dense_gradient_bit_for_bit(K):
    g1, Q1, st1 = _dense()
    gk, Qk, stk = _grads(K)
    assert st1["contact_candidates_max"] > 0  # contacts really happen
    assert torch.equal(Q1, Qk)
    for a, b in zip(g1, gk):
        assert torch.equal(a, b)
    assert stk["checkpoint_every"] == min(K, 90)
    # the backward pass held one segment of K - 1 recomputed states at a time
    B, nx = Q1.shape[0], Q1.shape[-1] + 12
    assert stk["backward_segment_bytes"] >= (min(K, 90) - 1) * B * nx * 8
    # states (and warm starts) of ceil(T / K) + 1 steps instead of T + 1
    assert stk["saved_state_bytes"] < st1["saved_state_bytes"] * (90 // min(K, 90) + 2) / 91 * 1.5


def test_sparse_checkpoints_with_a_policy():
    torch.manual_seed(0)
    net = torch.nn.Linear(26, 12).double()

    class Policy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, t, q, v):
            return torch.tanh(self.net(torch.cat([q, v], -1)))

    g1, _, _ = _grads(1, T=40, policy=Policy())
    g7, _, _ = _grads(7, T=40, policy=Policy())
    for a, b in zip(g1, g7):
        assert torch.equal(a, b)
    assert g1[-2].abs().sum() > 0


def test_saved_memory_is_flat_in_the_horizon_with_a_fixed_number_of_checkpoints():
    """``checkpoint_every = T / c``: the bytes kept for the backward pass do not grow with ``T``."""
    saved = []
    for T in (50, 500):
        scene, q0, v0, _ = _bouncing_pair()
        st: dict = {}
        tau = torch.zeros(2, T, scene.nv, dtype=F64, requires_grad=True)
        with torch.no_grad():  # the forward pass alone decides what is kept
            rollout(scene, q0, v0, tau.detach(), 1e-3, checkpoint_every=T // 10, stats=st)
        saved.append(st["saved_state_bytes"])
    assert saved[1] <= saved[0] * 1.2


@pytest.mark.parametrize("bad", [0, -3, 2.5, True])
def test_checkpoint_every_is_checked(bad):
    scene, q0, v0, _ = _bouncing_pair()
    with pytest.raises(DiffmechError, match="checkpoint_every"):
        rollout(scene, q0, v0, torch.zeros(2, 5, scene.nv, dtype=F64), 1e-3, checkpoint_every=bad)


def test_a_replayed_step_is_the_step_bit_for_bit():
    """The backward pass recomputes a step from its own contact set and impulses (``replay``: no broad
    phase, no candidate selection, no sweeps): the same next state, bit for bit, as the step that
    searched and solved, at every step of a run where contacts are made and broken (joint limits
    included), and the same gradient as the recomputation that solves again."""
    scene, q, v, _ = _bouncing_pair()
    arm = RobotModel(RobotSpec("arm", [LinkSpec("base"), LinkSpec("link", mass=1.0, com=(0.0, 0.0, -0.5),
                                                               inertia=((0.01, 0, 0), (0, 0.01, 0), (0, 0, 0.01)))],
                               [JointSpec("j", "revolute", "base", "link", axis=(0.0, 1.0, 0.0), lower=-0.05,
                                          upper=0.05)]))  # swings onto its limits, both ways
    scene = Scene([*scene.models.values(), arm], friction=scene.friction, restitution=scene.restitution)
    q = torch.cat([q, torch.zeros(2, 1, dtype=F64)], -1)
    v = torch.cat([v, torch.tensor([[2.0], [-2.0]], dtype=F64)], -1)
    tau = torch.zeros_like(v)
    prev, replayed_limits = {}, 0
    for k in range(90):
        info: dict = {}
        q1, v1 = contact_step(scene, q, v, tau, 1e-3, info, warm=prev)
        again = contact_step(scene, q, v, tau, 1e-3, warm=prev, replay=info["lam"])
        assert torch.equal(again[0], q1) and torch.equal(again[1], v1), k
        replayed_limits += any(isinstance(key[0], str) for key in info["lam"])
        if k in (20, 45):  # gradients: replayed against solved again
            qg, vg, tg = (x.clone().requires_grad_() for x in (q, v, tau))
            g = [torch.autograd.grad(sum(o.square().sum() for o in contact_step(scene, qg, vg, tg, 1e-3, warm=prev,
                                                                                   replay=r)), (qg, vg, tg))
                 for r in (info["lam"], None)]
            for a, b in zip(*g):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)
        prev, q, v = info["lam"], q1, v1
    assert replayed_limits > 0
