"""Sparse checkpoints in contact rollouts (``checkpoint_every``): the backward pass recomputes each
segment from its checkpoint, so the gradient must equal the dense-checkpoint one bit for bit (the
recomputed steps repeat the forward pass's operations and warm starts) while the saved states
shrink."""

from __future__ import annotations

import functools

import pytest
import torch

from diffmech.errors import DiffmechError
from diffmech.model import systems
from diffmech.sim import Scene, rollout

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
