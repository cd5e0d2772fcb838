"""The velocity-level contact problem, batched over environments: projected Gauss-Seidel sweeps, then
semismooth Newton iterations where the sweeps leave the contact conditions unmet.

The problem of one time step, for ``K`` constraint blocks of three rows (normal, two tangents):

    w = A lam + c,   0 <= lam_n  _|_  w_n >= 0,   |lam_t| <= mu lam_n  with lam_t opposing w_t,

where ``A = J M^-1 J^T`` (the Delassus operator, ``(B, 3K, 3K)``), ``c = J v_free - b`` (the
velocity the constraints would see without impulses, minus the normal targets ``b``) and ``lam``
the impulses (N s). The friction set is the exact disc (the Coulomb cone at the impulse level):
after each block's tangential Gauss-Seidel step the tangential impulse is projected onto the disc
of radius ``mu lam_n``. A block with zero tangent rows (a joint limit) has ``mu = 0``.

Convergence. A solution is a zero of the natural map ``G(lam) = lam - Pi(lam - D w)`` (``D =
diag(A)^-1``, ``Pi`` the projection of the sweeps: the normal impulse onto ``[0, inf)``, the
tangential one onto the disc of radius ``mu`` times the projected normal impulse). The sweeps are the
Gauss-Seidel iteration of that fixed point; they cycle on some problems with sliding friction (see
:func:`pgs`), so the solve ends with semismooth Newton iterations on ``G`` wherever ``max |G|``
exceeds the tolerance. ``PGSResult.residual`` is ``max |G|`` relative to the problem's impulse scale,
``violation`` the same error as a velocity (m/s), ``unconverged`` the environments left above the
tolerance (the step that called the solver warns).

Gradient. The sweeps run without a graph; the solution carries the gradient by the implicit
function theorem at the fixed point it reached, with the contact modes (separated, sticking,
sliding) held fixed. So the gradient does not depend on where the solver started (a warm start) or
on how many iterations it needed, and is the derivative finite differences of a converged solve see
-- of a converged one only: at impulses that do not meet the conditions it is the derivative of no
map that was simulated.
Differentiating the sweeps instead (the seed's approach) gives a truncated series that is off by as
much as the solver is from converged after those sweeps from *that start*; with a warm start that
stops after four sweeps, this was off by 1e-4 relative in a sliding box's mass gradient.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import ShapeError
from .pgs_native import native_sweeps, native_vjp

__all__ = ["PGSResult", "pgs", "implicit_vjp"]


# Semismooth Newton iterations after the sweeps, at most (measured: 1 to 5 on the standing quadruped's
# contact problems, where the sweeps cycle; each costs one R x R factorisation).
NEWTON_ITERATIONS = 30


class PGSResult(NamedTuple):
    lam: Tensor  # (B, K, 3) impulses: normal, tangent 1, tangent 2
    iterations: int  # sweeps (the most of any environment)
    residual: float  # max |G| / impulse scale (natural map G of the contact conditions), worst environment
    newton: int = 0  # semismooth Newton iterations after the sweeps (the most of any environment)
    violation: float = 0.0  # m/s: the largest velocity error of a contact condition, max |G_i| A_ii
    unconverged: int = 0  # environments whose residual is above the tolerance (a solve that stopped short)


def _inverse_diagonal(A: Tensor) -> Tensor:
    """The step sizes ``(B, 3K)`` of the sweeps and the natural map (``pgs.c``'s ``prepare``): ``1 / A_nn``
    for a normal row, one size ``2 / (A_t1t1 + A_t2t2)`` for both tangent rows of a block (with a size per
    row the projection's fixed point has friction opposing ``D_t w_t``, not the slip ``w_t``); 0 for rows
    whose diagonal is at most 1e-12 of the largest."""
    diag = torch.diagonal(A, dim1=-2, dim2=-1)
    B, R = diag.shape
    floor = 1e-12 * diag.amax(-1, keepdim=True).clamp_min(1e-300)
    d = diag.reshape(B, R // 3, 3)
    t = (d[..., 1] + d[..., 2])[..., None].expand(B, R // 3, 2)
    safe_n, safe_t = d[..., :1] > floor[..., None], t > 2 * floor[..., None]
    inv_n = torch.where(safe_n, 1.0 / torch.where(safe_n, d[..., :1], torch.ones_like(d[..., :1])), 0.0)
    inv_t = torch.where(safe_t, 2.0 / torch.where(safe_t, t, torch.ones_like(t)), 0.0)
    return torch.cat([inv_n, inv_t], -1).reshape(B, R)


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


def _natural(lam: Tensor, w: Tensor, inv: Tensor, mu: Tensor) -> tuple[Tensor, dict]:
    """The natural map ``G (B, K, 3)`` of the contact conditions (see ``pgs.c``: ``G = lam - Pi(lam - D w)``
    block by block, ``D = diag(inv)``, the disc's radius ``mu max(0, lam_n - inv_n w_n)``) and the pieces
    of its generalized Jacobian; ``lam, w, inv (B, K, 3)``, ``mu (B, K)``."""
    sn = lam[..., 0] - inv[..., 0] * w[..., 0]
    act = sn > 0
    rad = mu * sn.clamp_min(0)
    y = lam[..., 1:] - inv[..., 1:] * w[..., 1:]
    yn = y.norm(dim=-1)
    edge = yn > rad
    yh = y / torch.where(edge, yn, torch.ones_like(yn))[..., None]
    proj = torch.where(edge[..., None], rad[..., None] * yh, y)
    G = torch.cat([(lam[..., 0] - sn.clamp_min(0))[..., None], lam[..., 1:] - proj], -1)
    return G, {"act": act, "rad": rad, "edge": edge, "yh": yh, "yn": yn}


def _natural_jacobian(A: Tensor, inv: Tensor, mu: Tensor, parts: dict) -> Tensor:
    """An element of the generalized Jacobian of :func:`_natural`, ``(B, 3K, 3K)`` (``inv (B, K, 3)``)."""
    B, R, _ = A.shape
    K = R // 3
    eye = _eye(R, A)
    DA = (inv.reshape(B, R, 1) * A).reshape(B, K, 3, R)  # rows inv_i A_i
    E = eye.reshape(K, 3, R)
    act, rad, edge, yh, yn = (parts[k] for k in ("act", "rad", "edge", "yh", "yn"))
    Jn = torch.where(act[..., None], DA[:, :, 0], E[:, 0])  # (B, K, R)
    dy = E[:, 1:] - DA[:, :, 1:]  # (B, K, 2, R)
    drad = torch.where(act[..., None], mu[..., None] * (E[:, 0] - DA[:, :, 0]), torch.zeros_like(Jn))
    P = (_eye(2, A) - yh[..., :, None] * yh[..., None, :]) / torch.where(edge, yn, torch.ones_like(yn))[..., None, None]
    slide = E[:, 1:] - yh[..., None] * drad[:, :, None] - rad[..., None, None] * (P @ dy)
    Jt = torch.where(edge[..., None, None], slide, DA[:, :, 1:])
    return torch.cat([Jn[:, :, None], Jt], 2).reshape(B, R, R)


def _measure(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(G (B, K, 3), w (B, K, 3), inv (B, K, 3), impulse scale (B,))`` at impulses ``lam (B, K, 3)``:
    the natural map, ``w = A lam + c``, ``1 / diag(A)`` and the problem's impulse scale (the largest of
    ``|lam|`` and ``inv_i |c_i|``, N s)."""
    B, K, _ = lam.shape
    inv = _inverse_diagonal(A).reshape(B, K, 3)
    w = ((A @ lam.reshape(B, -1, 1))[..., 0] + c).reshape(B, K, 3)
    G, _ = _natural(lam, w, inv, mu)
    scale = torch.maximum(lam.abs().amax((-1, -2)), (inv * c.reshape(B, K, 3).abs()).amax((-1, -2)))
    return G, w, inv, scale


def _tolerance(tol: float, dtype: torch.dtype) -> float:
    """The relative residual a solve must reach: ``tol``, but no less than 64 ulps of ``dtype``."""
    return max(tol, 64 * torch.finfo(dtype).eps)


def _newton(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, tol: float, iterations: int) -> tuple[Tensor, int]:
    """Semismooth Newton iterations on :func:`_natural` (``pgs.c``'s, in torch: the reference) from ``lam
    (B, K, 3)``, each environment until its residual is at most ``tol`` times its impulse scale, with a
    backtracking line search on ``|G|^2``; least-norm steps where the Jacobian is singular. Returns the
    impulses -- Newton's where it converged, ``lam`` elsewhere -- and the iterations run."""
    B, K, _ = lam.shape
    R = 3 * K
    start = lam
    G, w, inv, scale = _measure(lam, A, c, mu)
    tol_abs = _tolerance(tol, A.dtype) * scale
    f = (G * G).sum((-1, -2))
    it = 0
    for it in range(1, iterations + 1):
        todo = ~(G.abs().amax((-1, -2)) <= tol_abs)
        if not bool(todo.any()):
            it -= 1
            break
        _, parts = _natural(lam, w, inv, mu)
        Jm = _natural_jacobian(A, inv, mu, parts)
        d = _least_norm_solve(Jm, -G.reshape(B, R, 1)).reshape(B, K, 3)
        Ad = (A @ d.reshape(B, R, 1))[..., 0].reshape(B, K, 3)
        step = torch.ones(B, dtype=A.dtype, device=A.device)
        done = ~todo
        new_lam, new_w, new_G, new_f = lam, w, G, f
        for _ in range(30):
            lt, wt = lam + step[:, None, None] * d, w + step[:, None, None] * Ad
            Gt, _ = _natural(lt, wt, inv, mu)
            ft = (Gt * Gt).sum((-1, -2))
            ok = ~done & (ft <= (1 - 1e-4 * step) * f)
            new_lam = torch.where(ok[:, None, None], lt, new_lam)
            new_w = torch.where(ok[:, None, None], wt, new_w)
            new_G = torch.where(ok[:, None, None], Gt, new_G)
            new_f = torch.where(ok, ft, new_f)
            done = done | ok
            if bool(done.all()):
                break
            step = torch.where(done, step, 0.5 * step)
        if not bool((done & todo).any()):
            break  # no environment found a descent: stalled
        lam, w, G, f = new_lam, new_w, new_G, new_f
        if it % 8 == 0:  # w afresh: the updates w += step A d drift by rounding
            G, w, _, _ = _measure(lam, A, c, mu)
            f = (G * G).sum((-1, -2))
    # kept only where it converged (see pgs.c: stalled iterates may have wandered along near-null directions)
    G, _, _, _ = _measure(lam, A, c, mu)
    converged = G.abs().amax((-1, -2)) <= tol_abs
    return torch.where(converged[:, None, None], lam, start), it


def _state(lam: Tensor, A: Tensor, c: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """``(D^-1, w = A lam + c, z = lam_t - D_t^-1 w_t)`` per block, ``(B, K, 3)`` each (``z``: ``(B, K, 2)``)."""
    B, K, _ = lam.shape
    inv = _inverse_diagonal(A).reshape(B, K, 3)
    w = ((A @ lam.reshape(B, -1, 1))[..., 0] + c).reshape(B, K, 3)
    return inv, w, lam[..., 1:] - w[..., 1:] * inv[..., 1:]


def _modes(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, state: tuple | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Masks (B, K): in contact (normal impulse > 0), sliding (friction on the disc's edge), and
    tangent rows that carry no impulse at all (mu = 0 or no tangent rows). ``state``: :func:`_state`."""
    ln, lt = lam[..., 0], lam[..., 1:]
    inv, w, z = state if state is not None else _state(lam, A, c)
    active = ln > 0
    bound = mu * ln
    free_t = (bound <= 0) | (inv[..., 1:] == 0).all(-1)
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


_EYES: dict = {}


def _eye(n: int, like: Tensor) -> Tensor:
    """The identity ``(n, n)`` in ``like``'s dtype and device, built once (a constant)."""
    key = (n, like.dtype, like.device)
    got = _EYES.get(key)
    if got is None:
        got = _EYES[key] = torch.eye(n, dtype=like.dtype, device=like.device)
    return got


def _residual_jacobian(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, active: Tensor, sliding: Tensor,
                       free_t: Tensor, state: tuple | None = None) -> tuple[Tensor, Tensor, dict]:
    """``J = dF/dlam`` of :func:`_residual` in closed form, ``(B, 3K, 3K)``, the mask of the rows
    that read ``w`` (``(B, 3K)``), and the sliding blocks' pieces the parameter gradients reuse.

    Rows ``f = w_r`` are rows of ``A``; rows ``f = lam_r`` are unit rows; a sliding block's
    tangent rows ``f_t = lam_t - mu lam_n z/|z|`` with ``z = lam_t - D_t w_t`` give
    ``E_t - mu z_hat e_n^T - mu lam_n P (E_t - D_t A_t)``, ``P = (I - z_hat z_hat^T) / |z|``."""
    B, K, _ = lam.shape
    R = 3 * K
    inv, w, z = state if state is not None else _state(lam, A, c)
    stick = active & ~free_t & ~sliding
    wrow = torch.stack([active, stick, stick], -1).reshape(B, R)
    eye = _eye(R, A)
    J = torch.where(wrow[..., None], A, eye)
    z_hat = None
    if bool(sliding.any()):
        zn = z.norm(dim=-1).clamp_min(1e-300)
        z_hat = z / zn[..., None]
        E = eye.reshape(K, 3, R)
        Et, en = E[:, 1:], E[:, 0]  # (K, 2, R), (K, R)
        At = A.reshape(B, K, 3, R)[:, :, 1:]
        I2 = torch.eye(2, dtype=A.dtype, device=A.device)
        P = (I2 - z_hat[..., :, None] * z_hat[..., None, :]) / zn[..., None, None]
        mln = mu * lam[..., 0]  # (B, K)
        S = Et - (mu[..., None] * z_hat)[..., None] * en[:, None, :] - mln[..., None, None] * (
            P @ (Et - inv[..., 1:, None] * At))
        Jb = J.reshape(B, K, 3, R)
        J = torch.cat([Jb[:, :, :1], torch.where(sliding[..., None, None], S, Jb[:, :, 1:])], 2).reshape(B, R, R)
    else:
        P = mln = None
    return J, wrow, {"w": w, "inv": inv, "z_hat": z_hat, "P": P, "mln": mln}


def _least_norm_solve(M: Tensor, b: Tensor) -> Tensor:
    """The least-norm least-squares solution of ``M x = b`` (``(B, R, R)``, ``(B, R, k)``), i.e.
    ``pinv(M) b``. By LU where every pivot is above 1e-10 of the largest (the common case: the
    system then has full rank and one solution), by the pseudo-inverse for the other systems of the
    batch (measured on the 60 x 60 systems of 64 Ants in a training run: 2.6 ms against pinv's 17 to
    25 ms, the same answers to 1e-11 relative; one random 12 x 12 system 34 us against 51 us). LU
    rather than LAPACK's rank-revealing ``gelsy`` (as fast), whose
    results change in the last bits from call to call, where the checkpointed backward pass must
    repeat itself exactly."""
    LU, piv, info = torch.linalg.lu_factor_ex(M)
    d = torch.diagonal(LU, dim1=-2, dim2=-1).abs()
    full = (info == 0) & (d.amin(-1) > 1e-10 * d.amax(-1))
    x = torch.linalg.lu_solve(LU, piv, b)
    if not bool(full.all()):
        low = (~full).nonzero()[:, 0]
        x = x.index_put((low,), torch.linalg.pinv(M[low]) @ b[low])
    return x


def implicit_vjp(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, grad: Tensor
                 ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The cotangents of ``A``, ``c`` and ``mu`` for the cotangent ``grad (B, K, 3)`` of the solution
    ``lam (B, K, 3)`` (implicit function theorem, modes fixed), in low-rank form: ``(a, d, g_mu)``
    with ``g_c = a (B, 3K)``, ``g_A = a lam^T + diag(d)`` (``d (B, 3K)``, ``None`` where no block
    slides) and ``g_mu (B, K)`` (``None`` where no block slides: zero).

    In C on the CPU (:func:`~diffmech.contact.pgs_native.native_vjp`: in torch this is some sixty
    operations on a few dozen numbers per environment); the environments whose residual Jacobian is
    rank-deficient, and other devices, by the torch code and its least-norm solve."""
    got = native_vjp(lam, A, c, mu, grad)
    if got is None:
        return _implicit_vjp(lam, A, c, mu, grad)
    a, d, g_mu, ok, slides = got
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:, 0]
        a2, d2, g2 = _implicit_vjp(lam[bad], A[bad], c[bad], mu[bad], grad[bad])
        a[bad] = a2
        d[bad] = d2 if d2 is not None else 0.0
        g_mu[bad] = g2 if g2 is not None else 0.0
        slides += int(d2 is not None)
    return (a, d, g_mu) if slides else (a, None, None)


def _implicit_vjp(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, grad: Tensor
                  ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """:func:`implicit_vjp` in torch."""
    B, K, _ = lam.shape
    R = 3 * K
    state = _state(lam, A, c)
    active, sliding, free_t = _modes(lam, A, c, mu, state)
    J, wrow, parts = _residual_jacobian(lam, A, c, mu, active, sliding, free_t, state)
    # J^T u = grad. Least norm: a statically indeterminate contact (four corners of a box on
    # the ground) leaves a null space in the normal impulses that moves no velocity.
    u = _least_norm_solve(J.transpose(-1, -2), grad.reshape(B, R, 1))[..., 0]
    # dL/dtheta = -u^T dF/dtheta. F reads c and A through w = A lam + c: the coefficient of w
    # is -u on the rows f = w, and mu lam_n D_t P (-u_t) on a sliding block's tangent rows.
    v = -u
    a = torch.where(wrow, v, torch.zeros_like(v)).reshape(B, K, 3)
    if parts["P"] is None:
        return a.reshape(B, R), None, None
    Pv = (parts["P"] @ v.reshape(B, K, 3)[..., 1:, None])[..., 0]  # (B, K, 2)
    mln, inv = parts["mln"], parts["inv"]
    a = torch.cat([a[..., :1], torch.where(sliding[..., None], mln[..., None] * inv[..., 1:] * Pv, a[..., 1:])], -1)
    # ... and mu directly: d f_t / d mu = -lam_n z_hat
    g_mu = torch.where(sliding, -lam[..., 0] * (v.reshape(B, K, 3)[..., 1:] * parts["z_hat"]).sum(-1),
                       torch.zeros_like(mu))
    # z = lam_t - rho w_t with rho = 2 / (A_t1t1 + A_t2t2): d f_t / d rho = mu lam_n P w_t and
    # d rho / d A_tt = -rho^2 / 2 for both tangent rows (zero at an exact solution: the slip is along z)
    dr = -mln * (Pv * parts["w"][..., 1:]).sum(-1) * inv[..., 1] ** 2 / 2
    d = torch.where(sliding[..., None], dr[..., None].expand_as(Pv), torch.zeros_like(Pv))
    return a.reshape(B, R), torch.cat([torch.zeros_like(d[..., :1]), d], -1).reshape(B, R), g_mu


class _ImplicitPGS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, lam, A, c, mu):
        ctx.save_for_backward(lam, A, c, mu)
        return lam.clone()

    @staticmethod
    def backward(ctx, grad):
        lam, A, c, mu = ctx.saved_tensors
        B, K, _ = lam.shape
        a, d, g_mu = implicit_vjp(lam, A, c, mu, grad)
        g_A = None
        if A.requires_grad:
            g_A = a[..., :, None] * lam.reshape(B, 1, 3 * K)
            if d is not None:
                g_A = g_A + torch.diag_embed(d)
        if g_mu is None and mu.requires_grad:
            g_mu = torch.zeros_like(mu)
        return None, g_A, (a if c.requires_grad else None), (g_mu if mu.requires_grad else None)


def pgs(A: Tensor, c: Tensor, mu: Tensor, *, iterations: int = 50, tol: float = 1e-9,
        check_every: int = 4, lam0: Tensor | None = None, native: bool = True,
        solution: Tensor | None = None, newton: int = NEWTON_ITERATIONS) -> PGSResult:
    """Solve the contact problem above: projected Gauss-Seidel sweeps, then, where they leave the
    contact conditions unmet, semismooth Newton iterations on their natural map.

    The sweeps alone can cycle: on problems with sliding friction and strong coupling between
    normal and tangential impulses (a standing quadruped's feet) they settle into a cycle whose
    impulses violate the conditions (a loaded foot approaching the ground, one sliding with less than
    the friction bound), however many sweeps run. Newton's method on the natural map
    ``G(lam) = lam - Pi(lam - D w)`` (the sweeps' own fixed-point map, ``D = diag(A)^-1``) converges
    there in a few iterations; a singular Jacobian (a statically indeterminate contact set) takes
    least-norm (Levenberg-Marquardt) steps.

    Args:
        A: (B, 3K, 3K) Delassus operator (symmetric positive semi-definite).
        c: (B, 3K) free constraint velocity minus the targets.
        mu: (B, K) friction coefficients.
        iterations: maximum number of sweeps over the blocks.
        tol: the sweeps stop when no impulse changed by more than ``tol`` times the largest impulse
            (plus ``tol`` N s) in a sweep (checked every ``check_every`` sweeps); the solve has
            converged when ``max |G| <= tol`` times the problem's impulse scale (the largest of
            ``|lam|`` and ``|c_i| / A_ii``), or 64 ulps of the dtype where that is larger.
        lam0: optional (B, K, 3) starting impulses (a warm start, e.g. the previous step's).
        native: solve in C on the CPU where possible (:mod:`.pgs_native`; each environment then stops
            on its own), else in torch (the same method).
        solution: (B, K, 3) impulses this solver returned for the same problem before: no solve, the
            result is that solution with its gradient (``iterations`` 0, ``residual`` 0), as a backward
            pass that recomputes a step needs it.
        newton: maximum semismooth Newton iterations after the sweeps (0: sweeps only).

    Returns:
        :class:`PGSResult`; ``lam`` is differentiable w.r.t. ``A``, ``c`` and ``mu`` (implicit
        function theorem at the solution, modes fixed: exact where the solve converged, which
        ``unconverged == 0`` says).
    """
    B, R = c.shape
    K = R // 3
    if K == 0:
        return PGSResult(c.new_zeros(B, 0, 3), 0, 0.0)
    if solution is not None:
        if solution.shape != (B, K, 3):
            raise ShapeError(f"pgs: solution must be ({B}, {K}, 3) for this problem, got {tuple(solution.shape)}")
        lam = solution.detach()
        if A.requires_grad or c.requires_grad or mu.requires_grad:
            lam = _ImplicitPGS.apply(lam, A, c, mu)
        return PGSResult(lam, 0, 0.0)
    with torch.no_grad():
        A_, c_, mu_ = A.detach(), c.detach(), mu.detach()
        lam0_ = None if lam0 is None else lam0.detach()
        out = native_sweeps(A_, c_, mu_, iterations, tol, check_every, lam0_, newton) if native else None
        if out is not None:
            lam, st = out
            result = PGSResult(lam, st.sweeps, st.residual, st.newton, st.violation, st.unconverged)
        else:
            lam, it, _ = _sweeps(A_, c_, mu_, iterations, tol, check_every, lam0_)
            lam, n_it = _newton(lam, A_, c_, mu_, tol, newton) if newton > 0 else (lam, 0)
            G, _, inv, scale = _measure(lam, A_, c_, mu_)
            g = G.abs().amax((-1, -2))
            rel = torch.where(scale > 0, g / torch.where(scale > 0, scale, torch.ones_like(scale)), g)
            viol = torch.where(inv > 0, G.abs() / torch.where(inv > 0, inv, torch.ones_like(inv)),
                               torch.zeros_like(inv)).amax((-1, -2))
            bad = ~(rel <= _tolerance(tol, A_.dtype))
            result = PGSResult(lam, it, float(rel.max()), n_it, float(viol.max()), int(bad.sum()))
    if A.requires_grad or c.requires_grad or mu.requires_grad:
        result = result._replace(lam=_ImplicitPGS.apply(result.lam, A, c, mu))
    return result
