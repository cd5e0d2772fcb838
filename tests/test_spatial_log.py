"""SO(3)/SE(3) logarithms and the SO(3) log Jacobian against Pinocchio, round trips and finite differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffmech import spatial as sp

pin = pytest.importorskip("pinocchio")


def _rotvecs(n: int, seed: int = 0) -> torch.Tensor:
    """Random rotation vectors with angles in [0, pi), plus the identity, tiny angles and angles near pi."""
    g = torch.Generator().manual_seed(seed)
    axis = torch.randn(n, 3, generator=g, dtype=torch.float64)
    axis = axis / axis.norm(dim=-1, keepdim=True)
    ang = torch.rand(n, 1, generator=g, dtype=torch.float64) * math.pi
    special = torch.tensor([0.0, 1e-9, 1e-6, 1e-3, math.pi - 0.2, math.pi - 1e-3, math.pi - 1e-7],
                           dtype=torch.float64)[:, None]
    return torch.cat([axis * ang, axis[: special.shape[0]] * special])


def test_so3_log_inverts_exp_and_matches_pinocchio():
    w = _rotvecs(200)
    R = sp.so3_exp(w)
    torch.testing.assert_close(sp.so3_log(R), w, atol=1e-12, rtol=0)
    for i in range(0, w.shape[0], 7):
        np.testing.assert_allclose(sp.so3_log(R[i]).numpy(), pin.log3(R[i].numpy()), atol=1e-12)


def test_so3_log_at_pi_returns_a_valid_logarithm():
    axis = torch.tensor([0.3, -0.5, 0.8], dtype=torch.float64)
    w = axis / axis.norm() * math.pi
    lw = sp.so3_log(sp.so3_exp(w))
    assert min(float((lw - w).abs().max()), float((lw + w).abs().max())) < 1e-12


def test_so3_log_float32():
    w = _rotvecs(100)
    err = (sp.so3_log(sp.so3_exp(w).float()).double() - w).norm(dim=-1)
    assert float(err.max()) < 2e-6


def test_se3_log_inverts_exp_and_matches_pinocchio():
    w = _rotvecs(100, seed=1)
    v = torch.randn(w.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    nu = torch.cat([v, w], -1)
    R, p = sp.se3_exp(nu)
    torch.testing.assert_close(sp.se3_log(R, p), nu, atol=1e-11, rtol=0)
    for i in range(0, nu.shape[0], 5):
        ref = pin.log6(pin.SE3(R[i].numpy(), p[i].numpy())).vector
        np.testing.assert_allclose(sp.se3_log(R[i], p[i]).numpy(), ref, atol=1e-11)


def test_so3_jlog_matches_pinocchio_and_finite_differences():
    w = _rotvecs(50, seed=3)
    w = w[w.norm(dim=-1) < math.pi - 1e-2]  # the log jumps at pi; its Jacobian is tested away from it
    for i in range(0, w.shape[0], 5):
        np.testing.assert_allclose(sp.so3_jlog(w[i]).numpy(), pin.Jlog3(sp.so3_exp(w[i]).numpy()), atol=1e-12)
    d = 1e-7 * torch.randn(w.shape[0], 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    lhs = sp.so3_log(sp.so3_exp(w) @ sp.so3_exp(d)) - w
    rhs = (sp.so3_jlog(w) @ d[..., None])[..., 0]
    assert float(((lhs - rhs).norm(dim=-1) / d.norm(dim=-1)).max()) < 1e-5


@pytest.mark.parametrize("angle", [0.0, 1e-7, 0.4, 2.5, math.pi - 0.05])
def test_log_gradients(angle):
    axis = torch.tensor([0.2, 0.9, -0.4], dtype=torch.float64)
    w = axis / axis.norm() * angle
    R = sp.so3_exp(w).requires_grad_()
    assert torch.autograd.gradcheck(sp.so3_log, (R,))
    p = torch.tensor([0.3, -1.0, 0.5], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(sp.se3_log, (R, p))
    assert torch.autograd.gradcheck(sp.so3_jlog, (w.clone().requires_grad_(),))
