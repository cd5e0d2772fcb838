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
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..errors import ConvergenceError
from ..implicit import newton_solve

__all__ = ["smooth_residual", "smooth_jacobian", "smooth_solve"]


def _split(x: Tensor, A: Tensor, c: Tensor):
    B, R = x.shape
    K = R // 3
    w = ((A @ x[..., None])[..., 0] + c).reshape(B, K, 3)
    return x.reshape(B, K, 3), w


def smooth_residual(x: Tensor, A: Tensor, c: Tensor, mu: Tensor, kappa: float, eps: float) -> Tensor:
    """``F(lam)`` of the relaxed problem above; ``x (B, 3K)`` the impulses, ``A (B, 3K, 3K)``,
    ``c (B, 3K)``, ``mu (B, K)``. Returns ``(B, 3K)``."""
    lam, w = _split(x, A, c)
    ln, wn, lt, wt = lam[..., 0], w[..., 0], lam[..., 1:], w[..., 1:]
    rn = ln + wn - torch.sqrt(ln * ln + wn * wn + 2.0 * kappa)
    speed = torch.sqrt((wt * wt).sum(-1) + eps * eps)
    rt = lt + (mu * ln / speed)[..., None] * wt
    return torch.cat([rn[..., None], rt], -1).reshape(x.shape)


def smooth_jacobian(x: Tensor, A: Tensor, c: Tensor, mu: Tensor, kappa: float, eps: float) -> Tensor:
    """``dF/dlam (B, 3K, 3K) = P + Q A`` with ``P = dF/dlam`` at fixed ``w`` and ``Q = dF/dw``,
    both block diagonal (3 x 3 per contact)."""
    B, R = x.shape
    K = R // 3
    lam, w = _split(x, A, c)
    ln, wn, wt = lam[..., 0], w[..., 0], w[..., 1:]
    s = torch.sqrt(ln * ln + wn * wn + 2.0 * kappa)
    speed = torch.sqrt((wt * wt).sum(-1) + eps * eps)
    P = torch.zeros(B, K, 3, 3, dtype=x.dtype, device=x.device)
    Q = torch.zeros_like(P)
    P[..., 0, 0] = 1.0 - ln / s
    Q[..., 0, 0] = 1.0 - wn / s
    P[..., 1, 1] = 1.0
    P[..., 2, 2] = 1.0
    P[..., 1:, 0] = (mu / speed)[..., None] * wt
    eye = torch.eye(2, dtype=x.dtype, device=x.device)
    g = (mu * ln / speed)[..., None, None]
    Q[..., 1:, 1:] = g * (eye - wt[..., :, None] * wt[..., None, :] / (speed * speed)[..., None, None])
    idx = torch.arange(K, device=x.device)

    def block_diag(M: Tensor) -> Tensor:
        out = torch.zeros(B, K, 3, K, 3, dtype=x.dtype, device=x.device)
        out[:, idx, :, idx, :] = M.transpose(0, 1)
        return out.reshape(B, R, R)

    Qd = block_diag(Q)
    return block_diag(P) + Qd @ A


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

    def solve(x0, k, e, params, sc=scale):
        def residual(x, A, c, mu):
            return smooth_residual(x, A, c, mu, k, e)

        def jacobian(x, A, c, mu):
            return smooth_jacobian(x, A, c, mu, k, e)

        return newton_solve(residual, x0, params, tol=tol * sc, max_iter=max_iter, jacobian=jacobian,
                            raise_on_failure=False, context="smooth contact solve")

    x, status = solve(x0, kappa, eps, (A, c, mu))
    its = status.iterations
    if not bool(status.converged.all()):
        # Continuation, for the environments that did not converge only: the strongly relaxed problem
        # is nearly linear; tighten it step by step from its root. The others keep their roots (the
        # environments are independent: a path through the relaxed problems may fail where the direct
        # one succeeded). Only the last solve carries the gradient (the root does not depend on x0).
        bad = (~status.converged).nonzero()[:, 0]
        x1, plain = x0[bad], tuple(t.detach()[bad] for t in (A, c, mu))
        for f in (1e6, 1e4, 1e2):
            x1, st = solve(x1, kappa * f, eps * f, plain, scale[bad])
            its += st.iterations
        x, status = solve(x.detach().index_put((bad,), x1.detach()), kappa, eps, (A, c, mu))
        its += status.iterations
    if not bool(status.converged.all()):
        bad = (~status.converged).nonzero()[:, 0].tolist()
        raise ConvergenceError(f"smooth contact solve: Newton's method did not converge in {max_iter} iterations "
                               f"in environment(s) {bad[:5]} (residual {float(status.residual_norm.amax()):.3g}); "
                               "increase the relaxation (smoothing, friction_smoothing) or reduce dt")
    rel = float((status.residual_norm / scale).amax()) if B else 0.0
    return x.reshape(B, K, 3), its, rel
