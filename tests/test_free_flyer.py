"""The floating-base step on SE(3): its hand-written backward equals autograd through the plain
operations and finite differences, for small, threshold-crossing and large rotations (float64)."""

from __future__ import annotations

import pytest
import torch

from diffmech.dynamics.free_flyer import FreeFlyerStep, _closed_forms, _coefficients, _forward, free_flyer_integrate

DT = torch.float64


def _inputs(angle: float, batch: int = 4, nj: int = 2, quat_scale: float = 1.0, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    pos = torch.randn(batch, 3, dtype=DT, generator=g)
    quat = torch.randn(batch, 4, dtype=DT, generator=g)
    quat = quat / quat.norm(dim=-1, keepdim=True) * quat_scale
    q = torch.cat([pos, quat, torch.randn(batch, nj, dtype=DT, generator=g)], dim=-1)
    dv = torch.randn(batch, 6 + nj, dtype=DT, generator=g)
    w = dv[:, 3:6]
    dv[:, 3:6] = w / w.norm(dim=-1, keepdim=True) * angle
    return q.requires_grad_(True), dv.requires_grad_(True)


ANGLES = [0.0, 1e-7, 1e-3, 0.3, 0.999, 1.001, 2.5]  # |w| (rad); the series covers |w| < 1


@pytest.mark.parametrize("angle", ANGLES)
def test_hand_backward_equals_autograd(angle):
    q, dv = _inputs(angle, quat_scale=1.2)
    w = torch.randn(q.shape, dtype=DT, generator=torch.Generator().manual_seed(5))
    got = torch.autograd.grad((w * FreeFlyerStep.apply(q, dv)).sum(), [q, dv])
    ref = torch.autograd.grad((w * _forward(q, dv)[0]).sum(), [q, dv])
    for a, b in zip(got, ref):
        assert float((a - b).abs().max()) < 1e-12, angle


@pytest.mark.parametrize("angle", [1e-3, 0.5, 0.99, 1.01, 2.0])
def test_gradcheck(angle):
    q, dv = _inputs(angle, batch=2, quat_scale=0.8, seed=1)
    assert torch.autograd.gradcheck(FreeFlyerStep.apply, (q, dv))


def test_second_derivatives():
    q, dv = _inputs(0.4, batch=2, seed=2)
    assert torch.autograd.gradgradcheck(FreeFlyerStep.apply, (q, dv))


def test_series_meets_closed_forms():
    """Both evaluations of the coefficients agree where each is accurate (around the switch)."""
    t2 = torch.linspace(0.3, 3.0, 50, dtype=DT)[:, None]
    powers = torch.cat([torch.ones_like(t2), t2.expand(-1, 7)], dim=-1).cumprod(-1)
    from diffmech.dynamics.free_flyer import _table

    series = powers @ _table(t2)
    closed = _closed_forms(t2.clamp_min(1.0))
    near = (t2 >= 1.0)[:, 0] & (t2 <= 1.5)[:, 0]
    torch.testing.assert_close(series[near], closed[near], atol=1e-14, rtol=1e-13)
    # And the mixed batch takes each branch per row.
    mixed = _coefficients(torch.tensor([[0.01], [2.0]], dtype=DT))
    torch.testing.assert_close(mixed[1:], _closed_forms(torch.tensor([[2.0]], dtype=DT)))


def test_unit_quaternion_and_norm_invariance():
    q, dv = _inputs(0.2, quat_scale=1.0)
    q2 = q.detach().clone()
    q2[:, 3:7] *= 3.0  # same orientation
    out, out2 = free_flyer_integrate(q.detach(), dv.detach()), free_flyer_integrate(q2, dv.detach())
    torch.testing.assert_close(out, out2, atol=1e-15, rtol=0)
    torch.testing.assert_close(out[:, 3:7].norm(dim=-1), torch.ones(4, dtype=DT), atol=1e-15, rtol=0)


def test_functorch_transforms_see_the_plain_operations():
    q, dv = _inputs(0.2, batch=3)
    q, dv = q.detach(), dv.detach()
    t = torch.randn_like(dv)
    _, jvp = torch.func.jvp(lambda d: free_flyer_integrate(q, d), (dv,), (t,))
    eps = 1e-6
    fd = (_forward(q, dv + eps * t)[0] - _forward(q, dv - eps * t)[0]) / (2 * eps)
    torch.testing.assert_close(jvp, fd, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("batch", [1, 9, 64])
def test_lone_free_body_dynamics_at_every_batch_size(batch):
    # A lone floating body has no joint below its base: the batched (B > 8) path once failed on
    # the empty joint set. Oracle: a uniform box's body-frame mass matrix diag(m, m, m, Ixx, Iyy, Izz).
    from diffmech.model import systems

    m, (lx, ly, lz) = 2.0, (0.2, 0.3, 0.4)
    box = systems.box((lx, ly, lz), m).to(torch.float64)
    q = box.random_configuration(batch)
    expected = torch.diag(torch.tensor([m, m, m, m * (ly**2 + lz**2) / 12, m * (lx**2 + lz**2) / 12,
                                        m * (lx**2 + ly**2) / 12], dtype=torch.float64))
    torch.testing.assert_close(box.mass_matrix(q), expected.expand(batch, 6, 6), rtol=0, atol=1e-14)
    v, tau = torch.randn(batch, 6, dtype=torch.float64), torch.randn(batch, 6, dtype=torch.float64)
    a = box.forward_dynamics(q, v, tau)
    torch.testing.assert_close(box.inverse_dynamics(q, v, a), tau, rtol=0, atol=1e-12)


@pytest.mark.parametrize("which", ["chain", "free body"])
def test_poses_and_world_jacobians_equal_the_one_link_calls(which):
    from diffmech.dynamics.kinematics import jacobian, poses_and_world_jacobians
    from diffmech.model import systems

    robot = systems.n_link_pendulum(3) if which == "chain" else systems.box((0.1, 0.2, 0.3), 1.0)
    robot = robot.to(torch.float64)
    q = robot.random_configuration(5)
    links = list(robot.link_names)[::-1]
    T, J = poses_and_world_jacobians(robot, q, links)
    torch.testing.assert_close(T, robot.forward_kinematics(q), rtol=0, atol=0)
    for i, link in enumerate(links):
        torch.testing.assert_close(J[:, i], jacobian(robot, q, link, frame="world"), rtol=0, atol=1e-15)
