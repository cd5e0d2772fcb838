"""Projected Gauss-Seidel on the velocity-level contact problem, batched over environments.

The problem of one time step, for ``K`` constraint blocks of three rows (normal, two tangents):

    w = A lam + c,   0 <= lam_n  _|_  w_n >= 0,   |lam_t| <= mu lam_n  with lam_t opposing w_t,

where ``A = J M^-1 J^T`` (the Delassus operator, ``(B, 3K, 3K)``), ``c = J v_free - b`` (the
velocity the constraints would see without impulses, minus the normal targets ``b``) and ``lam``
the impulses (N s). The friction set is the exact disc (the Coulomb cone at the impulse level):
after each block's tangential Gauss-Seidel step the tangential impulse is projected onto the disc
of radius ``mu lam_n``. A block with zero tangent rows (a joint limit) has ``mu = 0``.

Gradient. The sweeps run without a graph; the solution carries the gradient by the implicit
function theorem at the fixed point it reached, with the contact modes (separated, sticking,
sliding) held fixed. So the gradient does not depend on where the solver started (a warm start) or
on how many sweeps it needed, and is the derivative finite differences of a converged solve see.
Differentiating the sweeps instead (the seed's approach) gives a truncated series that is off by as
much as the solver is from converged after those sweeps from *that start*; with a warm start that
stops after four sweeps, this was off by 1e-4 relative in a sliding box's mass gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from .pgs_native import native_sweeps

__all__ = ["PGSResult", "pgs"]


class PGSResult(NamedTuple):
    lam: Tensor  # (B, K, 3) impulses: normal, tangent 1, tangent 2
    iterations: int
    residual: float  # largest change of an impulse in the last sweep, relative to the largest impulse


def _inverse_diagonal(A: Tensor) -> Tensor:
    diag = torch.diagonal(A, dim1=-2, dim2=-1)
    safe = diag > 1e-12 * diag.amax(-1, keepdim=True).clamp_min(1e-300)
    return torch.where(safe, 1.0 / torch.where(safe, diag, torch.ones_like(diag)), torch.zeros_like(diag))


def _sweeps(A: Tensor, c: Tensor, mu: Tensor, iterations: int, tol: float, check_every: int,
            lam0: Tensor | None) -> tuple[Tensor, int, float]:
    B, R = c.shape
    K = R // 3
    inv = _inverse_diagonal(A)
    cols = [A[:, :, 3 * i:3 * i + 3] for i in range(K)]
    a_tn = [A[:, 3 * i + 1:3 * i + 3, 3 * i] for i in range(K)]
    if lam0 is None:
        lam = [c.new_zeros(B, 3) for _ in range(K)]
        w = c
    else:
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
                change = torch.maximum(change, d.abs().amax())
        if check:
            size = torch.stack([x.abs().amax() for x in lam]).amax()
            residual = float(change / (size + 1.0))
            if residual <= tol:
                break
    return torch.stack(lam, dim=1), it, residual


def _modes(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Masks (B, K): in contact (normal impulse > 0), sliding (friction on the disc's edge), and
    tangent rows that carry no impulse at all (mu = 0 or no tangent rows)."""
    B, K, _ = lam.shape
    ln, lt = lam[..., 0], lam[..., 1:]
    inv = _inverse_diagonal(A).reshape(B, K, 3)
    active = ln > 0
    bound = mu * ln
    free_t = (bound <= 0) | (inv[..., 1:] == 0).all(-1)
    w = ((A @ lam.reshape(B, -1, 1))[..., 0] + c).reshape(B, K, 3)
    z = lt - w[..., 1:] * inv[..., 1:]
    # On the disc's edge and pushed outwards: the projection is what holds the friction there.
    sliding = active & ~free_t & (z.norm(dim=-1) > bound * (1 + 1e-9)) & (lt.norm(dim=-1) >= bound * (1 - 1e-7))
    return active, sliding, free_t


def _residual(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, active: Tensor, sliding: Tensor,
              free_t: Tensor) -> Tensor:
    """F(lam) = 0 at the solution, for the contact modes given: separated blocks lam = 0, sticking
    blocks w = 0, sliding blocks w_n = 0 and lam_t = mu lam_n z/|z| with z = lam_t - D^-1 w_t (the
    fixed point of the projected step), tangent rows without friction lam_t = 0. (B, K, 3)."""
    B, K, _ = lam.shape
    inv = _inverse_diagonal(A).reshape(B, K, 3)
    w = ((A @ lam.reshape(B, -1, 1))[..., 0] + c).reshape(B, K, 3)
    lt = lam[..., 1:]
    z = lt - w[..., 1:] * inv[..., 1:]
    zn = z.norm(dim=-1, keepdim=True)
    z_hat = z / torch.where(sliding[..., None], zn, torch.ones_like(zn))
    f_n = torch.where(active, w[..., 0], lam[..., 0])
    f_slide = lt - (mu * lam[..., 0])[..., None] * z_hat
    f_t = torch.where(sliding[..., None], f_slide, w[..., 1:])
    f_t = torch.where((free_t | ~active)[..., None], lt, f_t)
    return torch.cat([f_n[..., None], f_t], dim=-1)


class _ImplicitPGS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lam, A, c, mu):
        ctx.save_for_backward(lam, A, c, mu)
        return lam.clone()

    @staticmethod
    def backward(ctx, grad):
        lam, A, c, mu = ctx.saved_tensors
        B, K, _ = lam.shape
        modes = _modes(lam, A, c, mu)
        with torch.enable_grad():
            x = lam.detach().reshape(B, 3 * K).requires_grad_(True)
            # J = dF/dlam, (B, 3K, 3K), row by row in one batched backward.
            f = _residual(x.reshape(B, K, 3), A.detach(), c.detach(), mu.detach(), *modes).reshape(B, 3 * K)
            eye = torch.eye(3 * K, dtype=lam.dtype, device=lam.device).expand(B, 3 * K, 3 * K)
            (J,) = torch.autograd.grad(f, x, eye.transpose(0, 1), is_grads_batched=True)
            J = J.transpose(0, 1)
            # J^T u = grad. Least norm: a statically indeterminate contact (four corners of a box
            # on the ground) leaves a null space in the normal impulses that moves no velocity.
            u = (torch.linalg.pinv(J.transpose(-1, -2)) @ grad.reshape(B, 3 * K, 1))[..., 0]
            inputs = [t for t in (A, c, mu) if t.requires_grad]
            if not inputs:
                return None, None, None, None
            A_, c_, mu_ = (t.detach().requires_grad_(t.requires_grad) for t in (A, c, mu))
            f = _residual(lam.detach(), A_, c_, mu_, *modes).reshape(B, 3 * K)
            wrt = [t for t in (A_, c_, mu_) if t.requires_grad]
            got = iter(torch.autograd.grad(f, wrt, -u, allow_unused=True))
        return (None, *(next(got) if t.requires_grad else None for t in (A_, c_, mu_)))


def pgs(A: Tensor, c: Tensor, mu: Tensor, *, iterations: int = 50, tol: float = 1e-9,
        check_every: int = 4, lam0: Tensor | None = None, native: bool = True) -> PGSResult:
    """Solve the contact problem above by projected Gauss-Seidel.

    Args:
        A: (B, 3K, 3K) Delassus operator (symmetric positive semi-definite).
        c: (B, 3K) free constraint velocity minus the targets.
        mu: (B, K) friction coefficients.
        iterations: maximum number of sweeps over the blocks.
        tol: stop when no impulse changed by more than ``tol`` times the largest impulse (plus
            ``tol`` N s) in a sweep (checked every ``check_every`` sweeps).
        lam0: optional (B, K, 3) starting impulses (a warm start, e.g. the previous step's).
        native: run the sweeps in C on the CPU where possible (:mod:`.pgs_native`; each
            environment then stops on its own when converged), else in torch.

    Returns:
        :class:`PGSResult`; ``lam`` is differentiable w.r.t. ``A``, ``c`` and ``mu`` (implicit
        function theorem at the solution, modes fixed).
    """
    B, R = c.shape
    K = R // 3
    if K == 0:
        return PGSResult(c.new_zeros(B, 0, 3), 0, 0.0)
    with torch.no_grad():
        args = (A.detach(), c.detach(), mu.detach(), iterations, tol, check_every,
                None if lam0 is None else lam0.detach())
        out = native_sweeps(*args) if native else None
        lam, it, residual = out if out is not None else _sweeps(*args)
    if A.requires_grad or c.requires_grad or mu.requires_grad:
        lam = _ImplicitPGS.apply(lam, A, c, mu)
    return PGSResult(lam, it, residual)
