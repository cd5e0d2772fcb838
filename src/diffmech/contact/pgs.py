"""Projected Gauss-Seidel on the velocity-level contact problem, batched over environments.

The problem of one time step, for ``K`` constraint blocks of three rows (normal, two tangents):

    w = A lam + c,   0 <= lam_n  _|_  w_n >= 0,   |lam_t| <= mu lam_n  with lam_t opposing w_t,

where ``A = J M^-1 J^T`` (the Delassus operator, ``(B, 3K, 3K)``), ``c = J v_free - b`` (the
velocity the constraints would see without impulses, minus the normal targets ``b``) and ``lam``
the impulses (N s). The friction set is the exact disc (the Coulomb cone at the impulse level):
after each block's tangential Gauss-Seidel step the tangential impulse is projected onto the disc
of radius ``mu lam_n``. A block with zero tangent rows (a joint limit) has ``mu = 0``.

Written with out-of-place updates so that autograd can differentiate through the iterations (the
rollout's checkpointed backward recomputes one step at a time, so the graph of one step's
iterations is all that is ever held).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

__all__ = ["PGSResult", "pgs"]


class PGSResult(NamedTuple):
    lam: Tensor  # (B, K, 3) impulses: normal, tangent 1, tangent 2
    iterations: int
    residual: float  # largest change of an impulse in the last sweep, relative to the largest impulse


def pgs(A: Tensor, c: Tensor, mu: Tensor, *, iterations: int = 50, tol: float = 1e-9,
        check_every: int = 4, lam0: Tensor | None = None) -> PGSResult:
    """Solve the contact problem above by projected Gauss-Seidel.

    Args:
        A: (B, 3K, 3K) Delassus operator (symmetric positive semi-definite).
        c: (B, 3K) free constraint velocity minus the targets.
        mu: (B, K) friction coefficients.
        iterations: maximum number of sweeps over the blocks.
        tol: stop when no impulse changed by more than ``tol`` times the largest impulse (plus
            ``tol`` N s) in a sweep (checked every ``check_every`` sweeps).
        lam0: optional (B, K, 3) starting impulses (a warm start, e.g. the previous step's; treated
            as a constant: the solution, not the path to it, carries the gradient).

    Returns:
        :class:`PGSResult`.
    """
    B, R = c.shape
    K = R // 3
    if K == 0:
        return PGSResult(c.new_zeros(B, 0, 3), 0, 0.0)
    diag = torch.diagonal(A, dim1=-2, dim2=-1)
    safe = diag > 1e-12 * diag.amax(-1, keepdim=True).clamp_min(1e-300)
    inv = torch.where(safe, 1.0 / torch.where(safe, diag, torch.ones_like(diag)), torch.zeros_like(diag))
    cols = [A[:, :, 3 * i:3 * i + 3] for i in range(K)]
    a_tn = [A[:, 3 * i + 1:3 * i + 3, 3 * i] for i in range(K)]
    if lam0 is None:
        lam = [c.new_zeros(B, 3) for _ in range(K)]
        w = c
    else:
        lam0 = lam0.detach()
        lam = list(lam0.unbind(1))
        w = c + (A @ lam0.reshape(B, R, 1))[..., 0]
    it, residual = 0, float("inf")
    for it in range(1, iterations + 1):
        check = it % check_every == 0 or it == iterations
        change = c.new_zeros(())
        for i in range(K):
            r = 3 * i
            wi = w[:, r:r + 3]
            li = lam[i]
            ln = (li[:, 0] - wi[:, 0] * inv[:, r]).clamp_min(0.0)
            dn = ln - li[:, 0]
            wt = wi[:, 1:] + a_tn[i] * dn[:, None]
            lt = li[:, 1:] - wt * inv[:, r + 1:r + 3]
            bound = mu[:, i] * ln
            norm = lt.norm(dim=-1)
            scale = torch.where(norm > bound, bound / norm.clamp_min(1e-300), torch.ones_like(norm))
            lt = lt * scale[:, None]
            new = torch.cat([ln[:, None], lt], dim=-1)
            d = new - li
            w = w + (cols[i] @ d[..., None])[..., 0]
            lam[i] = new
            if check:
                change = torch.maximum(change, d.detach().abs().amax())
        if check:
            size = torch.stack([x.detach().abs().amax() for x in lam]).amax()
            residual = float(change / (size + 1.0))
            if residual <= tol:
                break
    return PGSResult(torch.stack(lam, dim=1), it, residual)
