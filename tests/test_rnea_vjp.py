"""The hand-written RNEA VJP equals autograd through RNEA, and the fast backwards that use it
equal plain autograd (float64)."""

from __future__ import annotations

import pytest
import torch

from conftest import ROBOTS, get_robot, random_state
from diffmech.dynamics._common import tree_state
from diffmech.dynamics.rnea import rnea_flat
from diffmech.dynamics.rnea_vjp import rnea_vjp_bl
from diffmech.model import systems

FLOATING = [k for k, v in ROBOTS.items() if v[2]]


def _check(robot, batch, passive, seed=0, quat_scale=1.0, with_f_ext=False):
    q, v, a, f = random_state(robot, (batch,), seed)
    if robot.floating_base:  # a drifted quaternion: the kinematics normalise it
        q = torch.cat([q[:, :3], q[:, 3:7] * quat_scale, q[:, 7:]], dim=1)
    f = f if with_f_ext else None
    tree, mt = robot.tree, robot.model_tensors()
    lam = torch.randn(batch, robot.nv, dtype=torch.float64, generator=torch.Generator().manual_seed(seed + 1))
    ins = [t.clone().requires_grad_(True) for t in (q, v, a) + ((f,) if with_f_ext else ())]
    out = rnea_flat(tree, mt, ins[0], ins[1], ins[2], ins[3] if with_f_ext else None, passive)
    ref = torch.autograd.grad(out, ins, lam)
    got = rnea_vjp_bl(tree, tree_state(tree, mt, q), q.T, v.T, a.T, lam.T, passive, f_ext=f)
    got = [got.q.T, got.v.T, got.a.T] + ([got.f_ext] if with_f_ext else [])
    for name, r, g in zip(["q", "v", "a", "f_ext"], ref, got):
        scale = max(1.0, float(r.abs().max()))
        err = float((g - r).abs().max()) / scale
        assert err < 1e-12, (robot.name, name, err)


@pytest.mark.parametrize("key", list(ROBOTS))
@pytest.mark.parametrize("batch", [1, 5, 300])
def test_matches_autograd_on_the_test_robots(key, batch):
    _check(get_robot(key), batch, passive=False)


@pytest.mark.parametrize("key", FLOATING)
@pytest.mark.parametrize("passive", [True, False])
def test_floating_base_with_a_drifted_quaternion(key, passive):
    """The base cotangent maps from the tangent space to (position, quaternion) exactly, also off the unit sphere."""
    _check(get_robot(key), 4, passive, seed=2, quat_scale=1.3)


@pytest.mark.parametrize("passive", [True, False])
def test_passive_terms(passive):
    robot = systems.double_pendulum(stiffness=(3.0, 2.0), rest=(0.3, -0.2), damping=(0.4, 0.1))
    _check(robot, 4, passive)


@pytest.mark.parametrize("key", ["iiwa", "branching_tree", "laikago", "humanoid"])
@pytest.mark.parametrize("passive", [True, False])
def test_external_forces(key, passive):
    """Cotangents of the external link forces, and of q through the moving points they act at."""
    _check(get_robot(key), 5, passive, seed=4, with_f_ext=True)


@pytest.mark.parametrize("method", ["aba", "crba"])
@pytest.mark.parametrize("key", ["branching_tree", "humanoid"])
def test_fast_forward_dynamics_backward_uses_it_and_matches(method, key):
    robot = get_robot(key)
    q, v, tau, _ = random_state(robot, (6,), 3)
    w = torch.randn(6, robot.nv, dtype=torch.float64)
    grads = []
    for fast in (True, False):
        ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
        qdd = robot.forward_dynamics(*ins, method=method, fast_grad=fast)
        grads.append(torch.autograd.grad((w * qdd).sum(), ins))
    for a, b in zip(*grads):  # relative to the largest entry (the humanoid's reach ~800)
        assert float((a - b).abs().max()) <= 1e-12 * max(1.0, float(b.abs().max())), key


@pytest.mark.parametrize("key", ["oblique_chain", "humanoid"])
def test_matches_central_differences(key):
    """Directional derivative of lam . RNEA along random (dq, dv, da), by central differences."""
    robot = get_robot(key)
    q, v, a, _ = random_state(robot, (3,), 7)
    g = torch.Generator().manual_seed(8)
    lam, dv, da = (torch.randn(3, robot.nv, dtype=torch.float64, generator=g) for _ in range(3))
    dq = torch.randn(3, robot.nq, dtype=torch.float64, generator=g)
    tree, mt = robot.tree, robot.model_tensors()
    qbar, vbar, abar, _ = rnea_vjp_bl(tree, tree_state(tree, mt, q), q.T, v.T, a.T, lam.T, True)
    pred = (qbar.T * dq).sum() + (vbar.T * dv).sum() + (abar.T * da).sum()
    h = 1e-6

    def f(s):
        return (lam * rnea_flat(tree, mt, q + s * h * dq, v + s * h * dv, a + s * h * da, None, True)).sum()

    fd = (f(1.0) - f(-1.0)) / (2 * h)
    assert abs(float(fd - pred)) < 1e-7 * max(1.0, abs(float(fd)))
