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

Newton's method first iterates on the laws as written. Where it stalls, it iterates on the friction
law multiplied through by ``sqrt(|w_t|^2 + eps^2) / s0``,

    (sqrt(|w_t|^2 + eps^2) lam_t + mu lam_n w_t) / s0 = 0,

with ``s0`` that slip speed at the start of the solve (a constant, ``>= eps``): the same roots (the
factor is positive) and the same implicit gradient, but no ``1 / speed`` inside, then through a
continuation from a strongly relaxed problem. Neither form is better everywhere (measured): on Ant
contact problems under bang-bang torques the quotient form's line search shrank its steps to 1e-8
for 50 iterations at residuals of 2e-3 to 6e-2, with or without continuation, where the product
form converged in 9 iterations or through its continuation; on the laikago standing, the product
form stalled at a quarter of the steps (a foot at the stick-slip boundary), where the quotient form
converged in at most 25 iterations. Dividing by ``s0`` keeps the residual in impulse units near the
start, so the tolerance means what it means in the quotient form.
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
    """``F(lam)`` of the relaxed problem above; ``x (B, 3K)`` the impulses, ``A (B, 3K, 3K)``,
    ``c (B, 3K)``, ``mu (B, K)``. Friction rows in the quotient form, or with ``s0 (B, K)`` (m/s) in
    the product form divided by ``s0``. Returns ``(B, 3K)``."""
    lam, w = _split(x, A, c)
    ln, wn, lt, wt = lam[..., 0], w[..., 0], lam[..., 1:], w[..., 1:]
    rn = ln + wn - torch.sqrt(ln * ln + wn * wn + 2.0 * kappa)
    speed = torch.sqrt((wt * wt).sum(-1) + eps * eps)
    if s0 is None:
        rt = lt + (mu * ln / speed)[..., None] * wt
    else:
        rt = (speed[..., None] * lt + (mu * ln)[..., None] * wt) / s0[..., None]
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
    P = torch.zeros(B, K, 3, 3, dtype=x.dtype, device=x.device)
    Q = torch.zeros_like(P)
    P[..., 0, 0] = 1.0 - ln / s
    Q[..., 0, 0] = 1.0 - wn / s
    eye = torch.eye(2, dtype=x.dtype, device=x.device)
    if s0 is None:
        P[..., 1, 1] = 1.0
        P[..., 2, 2] = 1.0
        P[..., 1:, 0] = (mu / speed)[..., None] * wt
        g = (mu * ln / speed)[..., None, None]
        Q[..., 1:, 1:] = g * (eye - wt[..., :, None] * wt[..., None, :] / (speed * speed)[..., None, None])
    else:
        P[..., 1, 1] = speed / s0
        P[..., 2, 2] = speed / s0
        P[..., 1:, 0] = (mu / s0)[..., None] * wt
        Q[..., 1:, 1:] = (lt[..., :, None] * wt[..., None, :] / speed[..., None, None]
                          + (mu * ln)[..., None, None] * eye) / s0[..., None, None]
    # Q A block row by block row (3 x 3 times 3 x 3K: a K-th of the dense product's work), then P onto
    # the diagonal blocks. Measured, 64 Ants (K = 20): 0.25 ms as one (B K, 3, 3) @ (B K, 3, 3K) product,
    # 0.73 ms as the 4-D product, 1.8 ms as the dense (B, 3K, 3K) one.
    J = (Q.reshape(B * K, 3, 3) @ A.reshape(B * K, 3, R)).reshape(B, K, 3, K, 3)
    idx = torch.arange(K, device=x.device)
    J[:, idx, :, idx, :] += P.transpose(0, 1)
    return J.reshape(B, R, R)


# Iterations after which a direct solve counts as stalled and its environments go on by the next
# route (measured: converging direct solves took at most 11 iterations on Ant contact problems and 25
# on the laikago standing), so that the batch does not pay max_iter iterations for one of them.
DIRECT_ITERATIONS = 30


def smooth_solve(A: Tensor, c: Tensor, mu: Tensor, lam0: Tensor, *, kappa: float, eps: float,
                 tol: float = 1e-10, max_iter: int = 50, raise_on_failure: bool = True):
    """Impulses ``(B, K, 3)`` of the relaxed problem, from the starting guess ``lam0 (B, K, 3)``
    (the hard problem's solution); differentiable w.r.t. ``A``, ``c`` and ``mu`` by the implicit
    function theorem. ``tol`` is relative to the largest of ``|c|`` and ``|lam0|`` (plus one) of each
    environment. Returns ``(lam, iterations, largest relative residual)``; with
    ``raise_on_failure=False`` also ``solved (B,)``, and the unsolved environments' rows of ``lam``
    are ``lam0``'s, without a gradient (the residual is over the solved ones).

    Routes, each only for the environments the previous one left unsolved (environments are
    independent: a route that fails for one may fail for another that the previous route solved):
    Newton on the quotient form; on the product form from the same start; on the product form
    through a continuation from the relaxation times 1e6, tenfold at a time (hundredfold steps
    failed on Ant contact problems that tenfold ones solve). Then one solve over the batch, in the
    product form at each environment's root, carries the gradient (the root does not depend on the
    route).

    Not every relaxed problem has a root: with more active constraints than the bodies have degrees
    of freedom and feet sliding (an Ant under bang-bang torques, all four feet down and six joint
    limits reached: 18 rows on 14 degrees of freedom) every route stalled, and a Levenberg-Marquardt
    search stopped at a stationary point of ``|F|^2`` with ``|F| = 2e-4`` and ``J^T F = 8e-12``.

    Raises:
        ConvergenceError: naming the environments where Newton's method did not converge (with
            ``raise_on_failure``).
    """
    B, K, _ = lam0.shape
    x0 = lam0.detach().reshape(B, 3 * K)
    scale = 1.0 + torch.maximum(c.detach().abs().amax(-1), x0.abs().amax(-1))
    direct = min(max_iter, DIRECT_ITERATIONS)

    def solve(x0, k, e, params, sc, product: bool, iters: int):
        def residual(x, A, c, mu, *s0):
            return smooth_residual(x, A, c, mu, k, e, *s0)

        def jacobian(x, A, c, mu, *s0):
            return smooth_jacobian(x, A, c, mu, k, e, *s0)

        s0 = (slip_speed(x0, params[0].detach(), params[1].detach(), e),) if product else ()
        return newton_solve(residual, x0, (*params, *s0), tol=tol * sc, max_iter=iters, jacobian=jacobian,
                            raise_on_failure=False, context="smooth contact solve")

    x, status = solve(x0, kappa, eps, (A, c, mu), scale, False, direct)
    its = status.iterations
    solved = status.converged
    if not bool(solved.all()):
        x = x.detach()
        bad = (~status.converged).nonzero()[:, 0]
        plain = tuple(t.detach()[bad] for t in (A, c, mu))
        x1, st = solve(x0[bad], kappa, eps, plain, scale[bad], True, direct)
        its += st.iterations
        if not bool(st.converged.all()):
            worse = (~st.converged).nonzero()[:, 0]
            x2, sub = x0[bad][worse], tuple(t[worse] for t in plain)
            for f in (1e6, 1e5, 1e4, 1e3, 1e2, 1e1, 1.0):
                x2, st2 = solve(x2, kappa * f, eps * f, sub, scale[bad][worse], True, max_iter)
                its += st2.iterations
            x1 = x1.index_put((worse,), x2)
            st = st._replace(converged=st.converged.index_put((worse,), st2.converged),
                             residual_norm=st.residual_norm.index_put((worse,), st2.residual_norm))
        x = x.index_put((bad,), x1)
        solved = solved.index_put((bad,), st.converged)
        if not bool(solved.all()):
            unsolved = (~solved).nonzero()[:, 0]
            if raise_on_failure:
                rn = st.residual_norm[(~st.converged).nonzero()[:, 0]]
                raise ConvergenceError(
                    f"smooth contact solve: Newton's method did not converge in environment(s) "
                    f"{unsolved.tolist()[:5]} (residual {float(rn.amax()):.3g}) by any route; increase the "
                    "relaxation (smoothing, friction_smoothing) or reduce dt")
        # the gradient-carrying solve, over the solved environments; the others keep lam0 (no gradient)
        ok = solved.nonzero()[:, 0]
        if len(ok) == B:
            x, status = solve(x, kappa, eps, (A, c, mu), scale, True, max_iter)
            its += status.iterations
        elif len(ok) == 0:
            x, status, scale = x0, status._replace(residual_norm=scale[:0]), scale[:0]
        else:
            xo, status = solve(x[ok], kappa, eps, tuple(t[ok] for t in (A, c, mu)), scale[ok], True, max_iter)
            x = x0.index_put((ok,), xo)
            scale = scale[ok]
            its += status.iterations
    rel = float((status.residual_norm / scale).amax()) if status.residual_norm.numel() else 0.0
    lam = x.reshape(B, K, 3)
    return (lam, its, rel) if raise_on_failure else (lam, its, rel, solved)
