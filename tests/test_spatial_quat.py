"""Quaternion to rotation matrix against SciPy, at any batch shape, and its gradient."""

from __future__ import annotations

import pytest
import torch

from diffmech import spatial


@pytest.mark.parametrize("shape", [(), (5,), (2, 3), (0,)])
def test_quat_to_matrix_matches_scipy_at_any_batch_shape(shape):
    from scipy.spatial.transform import Rotation

    g = torch.Generator().manual_seed(3)
    q = torch.randn(*shape, 4, dtype=torch.float64, generator=g)
    q = q / q.norm(dim=-1, keepdim=True)
    R = spatial.quat_to_matrix(q)
    assert R.shape == (*shape, 3, 3)
    if q.numel():
        ref = Rotation.from_quat(q.reshape(-1, 4).numpy()).as_matrix().reshape(*shape, 3, 3)  # (x, y, z, w)
        torch.testing.assert_close(R, torch.as_tensor(ref), rtol=0, atol=1e-14)
    assert spatial.quat_to_matrix(q.float()).dtype == torch.float32


def test_quat_to_matrix_gradients():
    q = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(spatial.quat_to_matrix, (q,))
