"""A smoothed contact problem solved by Newton's method: forces and gradients that vary smoothly
across contact changes.

The hard problem of one step (see :mod:`.pgs`) is, per block ``(normal, tangent, tangent)`` with
``w = A lam + c``: ``0 <= lam_n _|_ w_n >= 0`` and Coulomb friction on the disc ``|lam_t| <= mu
lam_n``. Its solution is piecewise smooth: a contact that is about to close or a block that is
about to slip contributes nothing to the gradient until it does. Here both laws are relaxed:

    lam_n + w_n - sqrt(lam_n^2 + w_n^2 + 2 kappa) = 0     (lam_n > 0, w_n > 0, lam_n w_n = kappa)
    lam_t + mu lam_n w_t / sqrt(|w_t|^2 + eps^2) = 0      (friction opposing the slip, saturating)

``kappa`` (N s x m/s, the product of impulse and separating velocity, i.e. J) relaxes the
complementarity -- a candidate ``d`` metres away within the step feels an impulse of about
``kappa dt / d`` -- and ``eps`` (m/s) is the slip speed below which friction acts as a stiff
viscous law instead of Coulomb's jump. Both to zero recover the hard problem. The root is found by
:func:`diffmech.implicit.newton_solve` from the projected Gauss-Seidel solution (close to it for
small relaxations) with the analytic Jacobian, and its gradient comes from that implicit layer:
``d lam / d (A, c, mu) = -J^-1 dF/d(A, c, mu)`` at the root, with every contact's mode blended
smoothly rather than fixed.

Newton's method iterates on the friction law multiplied through by ``sqrt(|w_t|^2 + eps^2) / s0``,

    (sqrt(|w_t|^2 + eps^2) lam_t + mu lam_n w_t) / s0 = 0,

with ``s0`` that slip speed at the starting guess (a constant of the solve, ``>= eps``): the same
roots (the factor is positive) and the same implicit gradient, but no ``1 / speed`` inside. In the
quotient form a sticking contact's law turns within a slip of ``eps`` with a slope of ``mu lam_n /
eps``, and Newton's line search stalled on it (measured on Ant contact problems: steps shrunk to
1e-8 for 50 iterations at residuals of 2e-3 to 6e-2, with or without continuation; solved in this
form). Dividing by ``s0`` keeps the residual in impulse units near the start, so the tolerance
means what it meant.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConvergenceError
from ..implicit import newton_solve

__all__ = ["slip_speed", "smooth_residual", "smooth_jacobian", "smooth_solve"]


def _split(x: Tensor, A: Tensor, c: Tensor):
    B, R = x.shape
    K = R // 3
    w = ((A @ x[..., None])[..., 0] + c).reshape(B, K, 3)
    return x.reshape(B, K, 3), w


def slip_speed(x: Tensor, A: Tensor, c: Tensor, eps: float) -> Tensor:
    """``sqrt(|w_t|^2 + eps^2) (B, K)`` at the impulses ``x (B, 3K)``: the friction rows' scale
    ``s0`` of :func:`smooth_residual` when taken at the starting guess."""
    _, w = _split(x, A, c)
    return torch.sqrt((w[..., 1:] ** 2).sum(-1) + eps * eps)


def smooth_residual(x: Tensor, A: Tensor, c: Tensor, mu: Tensor, kappa: float, eps: float,
                    s0: Tensor | None = None) -> Tensor:
    """``F(lam)`` of the relaxed problem above in the form Newton's method iterates on; ``x (B, 3K)``
    the impulses, ``A (B, 3K, 3K)``, ``c (B, 3K)``, ``mu (B, K)``, ``s0 (B, K)`` the friction rows'
    scale (m/s; default ``eps``). Returns ``(B, 3K)``."""
    lam, w = _split(x, A, c)
    ln, wn, lt, wt = lam[..., 0], w[..., 0], lam[..., 1:], w[..., 1:]
    rn = ln + wn - torch.sqrt(ln * ln + wn * wn + 2.0 * kappa)
    speed = torch.sqrt((wt * wt).sum(-1) + eps * eps)
    rt = speed[..., None] * lt + (mu * ln)[..., None] * wt
    rt = rt / (eps if s0 is None else s0[..., None])
    return torch.cat([rn[..., None], rt], -1).reshape(x.shape)


def smooth_jacobian(x: Tensor, A: Tensor, c: Tensor, mu: Tensor, kappa: float, eps: float,
                    s0: Tensor | None = None) -> Tensor:
    """``dF/dlam (B, 3K, 3K) = P + Q A`` of :func:`smooth_residual` with ``P = dF/dlam`` at fixed
    ``w`` and ``Q = dF/dw``, both block diagonal (3 x 3 per contact)."""
    B, R = x.shape
    K = R // 3
    lam, w = _split(x, A, c)
    ln, wn, lt, wt = lam[..., 0], w[..., 0], lam[..., 1:], w[..., 1:]
    s = torch.sqrt(ln * ln + wn * wn + 2.0 * kappa)
    speed = torch.sqrt((wt * wt).sum(-1) + eps * eps)
    inv_s0 = 1.0 / (torch.full_like(speed, eps) if s0 is None else s0)
    P = torch.zeros(B, K, 3, 3, dtype=x.dtype, device=x.device)
    Q = torch.zeros_like(P)
    P[..., 0, 0] = 1.0 - ln / s
    Q[..., 0, 0] = 1.0 - wn / s
    P[..., 1, 1] = speed * inv_s0
    P[..., 2, 2] = speed * inv_s0
    P[..., 1:, 0] = (mu * inv_s0)[..., None] * wt
    eye = torch.eye(2, dtype=x.dtype, device=x.device)
    Q[..., 1:, 1:] = (lt[..., :, None] * wt[..., None, :] / speed[..., None, None]
                      + (mu * ln)[..., None, None] * eye) * inv_s0[..., None, None]
    idx = torch.arange(K, device=x.device)

    def block_diag(M: Tensor) -> Tensor:
        out = torch.zeros(B, K, 3, K, 3, dtype=x.dtype, device=x.device)
        out[:, idx, :, idx, :] = M.transpose(0, 1)
        return out.reshape(B, R, R)

    Qd = block_diag(Q)
    return block_diag(P) + Qd @ A


DIRECT_ITERATIONS = 20


def smooth_solve(A: Tensor, c: Tensor, mu: Tensor, lam0: Tensor, *, kappa: float, eps: float,
                 tol: float = 1e-10, max_iter: int = 50) -> tuple[Tensor, int, float]:
    """Impulses ``(B, K, 3)`` of the relaxed problem, from the starting guess ``lam0 (B, K, 3)``
    (the hard problem's solution); differentiable w.r.t. ``A``, ``c`` and ``mu`` by the implicit
    function theorem. ``tol`` is relative to the largest of ``|c|`` and ``|lam0|`` (plus one) of each
    environment. Returns ``(lam, iterations, largest relative residual)``.

    Raises:
        ConvergenceError: naming the environments where Newton's method did not converge.
    """
    B, K, _ = lam0.shape
    x0 = lam0.detach().reshape(B, 3 * K)
    scale = 1.0 + torch.maximum(c.detach().abs().amax(-1), x0.abs().amax(-1))

    def solve(x0, k, e, params, sc=scale, s0=None, iters=max_iter):
        def residual(x, A, c, mu, s0):
            return smooth_residual(x, A, c, mu, k, e, s0)

        def jacobian(x, A, c, mu, s0):
            return smooth_jacobian(x, A, c, mu, k, e, s0)

        if s0 is None:
            s0 = slip_speed(x0, params[0].detach(), params[1].detach(), e)
        out = newton_solve(residual, x0, (*params, s0), tol=tol * sc, max_iter=iters, jacobian=jacobian,
                           raise_on_failure=False, context="smooth contact solve")
        return (*out, s0)

    # A direct solve that has not converged in DIRECT_ITERATIONS has stalled (converging ones take
    # at most 11 on Ant contact problems): hand it to the continuation rather than the batch
    # paying for up to max_iter iterations of it.
    x, status, s0 = solve(x0, kappa, eps, (A, c, mu), iters=min(max_iter, DIRECT_ITERATIONS))
    its = status.iterations
    if not bool(status.converged.all()):
        # Continuation, for the environments that did not converge only: the strongly relaxed problem
        # is nearly linear; tighten it tenfold at a time from its root (hundredfold steps failed on Ant
        # contact problems that tenfold ones solve). The others keep their roots (the
        # environments are independent: a path through the relaxed problems may fail where the direct
        # one succeeded). Only the last solve carries the gradient (the root does not depend on x0).
        bad = (~status.converged).nonzero()[:, 0]
        x1, plain = x0[bad], tuple(t.detach()[bad] for t in (A, c, mu))
        for f in (1e6, 1e5, 1e4, 1e3, 1e2, 1e1):
            x1, st, _ = solve(x1, kappa * f, eps * f, plain, scale[bad])
            its += st.iterations
        # the converged environments keep their friction scale, so they stay converged as they were
        s0 = s0.index_put((bad,), slip_speed(x1, plain[0], plain[1], eps))
        x, status, _ = solve(x.detach().index_put((bad,), x1.detach()), kappa, eps, (A, c, mu), s0=s0)
        its += status.iterations
    if not bool(status.converged.all()):
        bad = (~status.converged).nonzero()[:, 0].tolist()
        raise ConvergenceError(f"smooth contact solve: Newton's method did not converge in {max_iter} iterations "
                               f"in environment(s) {bad[:5]} (residual {float(status.residual_norm.amax()):.3g}); "
                               "increase the relaxation (smoothing, friction_smoothing) or reduce dt")
    rel = float((status.residual_norm / scale).amax()) if B else 0.0
    return x.reshape(B, K, 3), its, rel
