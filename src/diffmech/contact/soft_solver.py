"""MuJoCo's primal constraint problem solved by Newton's method, batched and differentiable.

Given the joint-space inertia ``M`` (B, nv, nv), the smooth force ``qfrc_smooth`` (B, nv) (all
forces but the constraints, so that ``a0 = M^-1 qfrc_smooth`` is the unconstrained acceleration)
and constraint rows (:class:`~.soft_constraints.Rows`), the acceleration ``a`` minimises

    0.5 (a - a0)' M (a - a0) + sum_i s_i(J_i a - aref_i),

with, for ``x = J_i a - aref_i`` and ``D_i = 1 / R_i``:

* equality rows (kind 0): ``s = 0.5 D x^2``;
* friction-loss rows (kind 1, bound ``f``): the Huber function ``0.5 D x^2`` for ``|x| < R f`` and
  ``f |x| - 0.5 R f^2`` beyond;
* limit, frictionless-contact and pyramid-edge rows (kinds 2, 3): ``0.5 D x^2`` for ``x < 0``, 0
  otherwise;
* an elliptic cone (a kind-4 normal row and its kind-5 tangent rows, with the cone's ``mu`` and
  friction coefficients ``f_j`` in ``floss``): with ``N = mu x_0``, ``T = |(f_j x_j)_j|``, no cost
  where ``N >= mu T`` (separating), ``0.5 sum D x^2`` where ``mu N + T <= 0`` (sticking), and
  ``0.5 D_0 / (mu^2 (1 + mu^2)) (N - mu T)^2`` between (sliding).

The row force is ``-ds/dx``: ``-D x`` in a quadratic zone, ``-+f`` on a saturated friction row, 0 on
a satisfied row. The cost is strictly convex; without elliptic cones it is piecewise quadratic, and
Newton's method with an exact line search reaches its minimiser after finitely many changes of the
active set (MuJoCo's ``mj_solNewton``; here that line search is exact: the breakpoints of the 1-D
piecewise quadratic are sorted and the segment holding the zero of the derivative found directly).
With elliptic cones the Newton Hessian carries the cones' Hessians and the line search is a
bracketed 1-D Newton iteration.

Gradients: the search runs without autograd. At its solution ``a*`` the zones (which rows are
quadratic, which friction rows saturate at which sign, which cones slide) are held fixed and one
more Newton step ``a* - H^-1 grad(a*)`` is taken inside autograd, with the Hessian ``H`` of the
solution. Its value is the minimiser (for piecewise quadratic costs it is the linear solve
``(M + J_a' D_a J_a) a = qfrc_smooth + J_a' D_a aref_a + J_s' f_s``), and its derivative
``-H^-1 d grad / d theta`` is the implicit derivative of the minimiser in ``M``, ``qfrc_smooth``,
``J``, ``aref``, ``R`` and ``floss`` wherever the zones do not change (everywhere except on a set of
measure zero).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..errors import ShapeError
from .soft_constraints import (
    KIND_CONE_NORMAL,
    KIND_CONE_TANGENT,
    KIND_EDGE,
    KIND_EQUALITY,
    KIND_FRICTION,
    KIND_UNILATERAL,
    Rows,
)

_INF = float("inf")


def _mv(A: Tensor, x: Tensor) -> Tensor:
    if A.dim() == 3 and x.dim() == 2:  # bmm directly: matmul's dispatch costs as much as the product here
        return torch.bmm(A, x.unsqueeze(-1)).squeeze(-1)
    return (A @ x.unsqueeze(-1)).squeeze(-1)


class _Masks:
    """Row-kind masks of a solve, computed once (``exists`` folded in): ``fric`` friction-loss
    rows, ``eq`` equality rows, ``uni`` limit / frictionless / pyramid-edge rows, all (B, R)."""

    def __init__(self, kind: Tensor, exists: Tensor):
        self.fric = (kind == KIND_FRICTION) & exists
        self.eq = (kind == KIND_EQUALITY) & exists
        self.uni = ((kind == KIND_UNILATERAL) | (kind == KIND_EDGE)) & exists
        self.any_fric = bool(self.fric.any())


def _zones(x: Tensor, mk: _Masks, Rf: Tensor):
    """Per row: quadratic mask and the saturated friction force (+f below, -f above)."""
    if not mk.any_fric:  # no friction-loss row: no saturation
        return mk.eq | (mk.uni & (x < 0)), torch.zeros_like(x)
    neg = mk.fric & (x <= -Rf)
    pos = mk.fric & (x >= Rf)
    quad = mk.eq | (mk.fric & ~(neg | pos)) | (mk.uni & (x < 0))
    return quad, neg.to(x.dtype) - pos.to(x.dtype)


def _cost(a, a0, M, x, D, R, floss, quad, sat):
    """Primal cost per environment (B,), elliptic cones' middle zones excluded."""
    da = a - a0
    gauss = 0.5 * (da * _mv(M, da)).sum(-1)
    qc = torch.where(quad, 0.5 * D * x * x, torch.zeros_like(x))
    lin = sat.abs() * (floss * x.abs() - 0.5 * R * floss * floss)
    return gauss + (qc + lin).sum(-1)


def _line_search(x0, dv, c1, c2, D, Rf, floss, mk: _Masks):
    """Exact minimiser alpha >= 0 of the cost along a descent direction.

    x0: (B, R) row residuals J a - aref at alpha = 0; dv: (B, R) J d; c1 = d'(M a - qfrc_smooth),
    c2 = d' M d (B,); mk: the rows' kinds. The derivative in alpha is continuous, piecewise linear
    and non-decreasing; its breakpoints are where a row changes zone.
    """
    inf = torch.full_like(x0, _INF)
    nz = dv != 0
    # unilateral rows: one breakpoint -x0 / dv ahead when the row leaves or enters x < 0
    act0 = (x0 < 0) | ((x0 == 0) & (dv < 0))
    ahead_u = mk.uni & nz & (act0 == (dv > 0))
    safe_dv = torch.where(nz, dv, torch.ones_like(dv))
    b_u = torch.where(ahead_u, -x0 / safe_dv, inf)
    # change of (g1, g2) of the derivative g1 + g2 alpha at each breakpoint
    q1, q2 = D * x0 * dv, D * dv * dv
    s_u = 1.0 - 2.0 * act0.to(x0.dtype)  # -1 where the row leaves x < 0, +1 where it enters
    if mk.any_fric:
        # friction rows: breakpoints at x = -Rf and x = +Rf when ahead along dv
        b_lo = (-Rf - x0) / safe_dv
        b_hi = (Rf - x0) / safe_dv
        b_lo = torch.where(mk.fric & nz & (b_lo > 0), b_lo, inf)
        b_hi = torch.where(mk.fric & nz & (b_hi > 0), b_hi, inf)
        sgn = torch.sign(dv)
        fdv = floss * dv
        d1 = torch.cat([s_u * q1, sgn * (q1 + fdv), -sgn * (q1 - fdv)], dim=-1)
        d2 = torch.cat([s_u * q2, sgn * q2, -sgn * q2], dim=-1)
        bps = torch.cat([b_u, b_lo, b_hi], dim=-1)
    else:
        d1, d2, bps = s_u * q1, s_u * q2, b_u
    bps, order = torch.sort(bps, dim=-1)
    finite = torch.isfinite(bps)
    zero = torch.zeros_like(bps)
    d1 = torch.where(finite, d1.gather(-1, order), zero)
    d2 = torch.where(finite, d2.gather(-1, order), zero)
    starts = torch.cat([torch.zeros_like(bps[..., :1]), bps], dim=-1)
    ends = torch.cat([bps, torch.full_like(bps[..., :1], _INF)], dim=-1)

    def deriv_coeffs(lo, hi):
        # derivative = g1 + g2 alpha with the zones of each row inside the segment (lo, hi)
        alpha = torch.where(torch.isfinite(hi), 0.5 * (lo + hi), lo + 1.0)
        x = x0 + alpha.unsqueeze(-1) * dv
        quad, sat = _zones(x, mk, Rf)
        Dq = torch.where(quad, D, torch.zeros_like(D))
        g1 = c1 + (Dq * x0 * dv - sat * floss * dv).sum(-1)
        g2 = c2 + (Dq * dv * dv).sum(-1)
        return g1, g2

    # running coefficients only pick the segment; the step is then computed from the exact
    # coefficients of that segment (no cancellation of large D terms in the running sums)
    g1, g2 = deriv_coeffs(starts[..., 0], ends[..., 0])
    G1 = g1.unsqueeze(-1) + torch.cat([zero[..., :1], d1.cumsum(-1)], dim=-1)
    G2 = g2.unsqueeze(-1) + torch.cat([zero[..., :1], d2.cumsum(-1)], dim=-1)
    fend = G1[..., :-1] + G2[..., :-1] * torch.where(finite, bps, zero)
    k = ((fend < 0) & finite).sum(-1, keepdim=True)
    lo = starts.gather(-1, k).squeeze(-1)
    hi = ends.gather(-1, k).squeeze(-1)
    if bool((k != 0).any()):  # else every environment stays in its first segment: g1, g2 are its own
        g1, g2 = deriv_coeffs(lo, hi)
    alpha = -g1 / g2
    return torch.maximum(torch.minimum(alpha, hi), lo)


class _Cones:
    """Static layout of the elliptic cones among the rows: ``idx`` (C, 6) the rows of each cone
    (normal first; unused slots repeat the normal), ``mask`` (C, 6), and the flat (row, cone) pairs
    of the used slots."""

    def __init__(self, kind: Tensor):
        k = kind.cpu().numpy()
        normals = np.nonzero(k == KIND_CONE_NORMAL)[0]
        idx = np.repeat(normals[:, None], 6, axis=1)
        mask = np.zeros((normals.size, 6), dtype=bool)
        owned = np.zeros(k.size, dtype=bool)
        for c, i in enumerate(normals):
            n = 1
            while i + n < k.size and k[i + n] == KIND_CONE_TANGENT and n < 6:
                idx[c, n] = i + n
                n += 1
            mask[c, :n] = True
            owned[i:i + n] = True
        stray = np.nonzero((k == KIND_CONE_TANGENT) & ~owned)[0]
        if stray.size:
            raise ShapeError(f"solve: row {int(stray[0])} is an elliptic-cone tangent row that does "
                             "not follow its cone's normal row")
        dev = kind.device
        self.n = normals.size
        self.idx = torch.as_tensor(idx, device=dev)
        self.mask = torch.as_tensor(mask, device=dev)
        self.rows = self.idx[self.mask]
        self.cone_of_row = torch.arange(self.n, device=dev)[:, None].expand(-1, 6)[self.mask]


def _cone_eval(x, D, coef, exists, cones, dv=None, alpha=None, hessian=True, middle=None):
    """Zones, forces, costs and Hessians of the elliptic cones at row residuals ``x`` (B, R).

    ``middle`` (B, C): the cones to treat as sliding (default: those in the middle zone at ``x``).

    With ``dv`` and ``alpha``: also the first and second derivative along ``x + alpha dv``
    of the middle zones' cost (evaluated at ``x + alpha dv``).
    """
    idx, maskf = cones.idx, cones.mask.to(x.dtype)
    if alpha is not None:
        x = x + alpha.unsqueeze(-1) * dv
    S = coef[:, idx] * maskf  # mu, then the friction coefficients
    ex = exists[:, idx[:, 0]]
    mu = torch.where(ex, S[..., 0], torch.ones_like(S[..., 0]))
    U = x[:, idx] * S
    N = U[..., 0]
    T2 = (U[..., 1:] ** 2).sum(-1)
    # sqrt kept away from 0 so that its derivative stays finite where it is masked out
    T = torch.where(T2 > 0, torch.where(T2 > 0, T2, torch.ones_like(T2)).sqrt(), torch.zeros_like(T2))
    top = (N >= mu * T) | ((T2 <= 0) & (N >= 0))
    bottom = ~top & ((mu * N + T <= 0) | ((T2 <= 0) & (N < 0))) & ex
    if middle is None:
        middle = ~top & ~bottom & ex
    else:
        # held zones: a sliding cone has T > 0 up to rounding; keep the formulas finite anyway
        T = torch.where(middle & (T2 <= 0), torch.ones_like(T), T)
    Ts = torch.where(middle, T, torch.ones_like(T))
    Dm = D[:, idx[:, 0]] / (mu * mu * (1 + mu * mu))
    NmT = N - mu * Ts
    zero = torch.zeros_like(N)
    f0 = torch.where(middle, -Dm * NmT * mu, zero)
    ft = -(f0 / Ts).unsqueeze(-1) * U[..., 1:] * S[..., 1:]
    out = {"bottom": bottom, "middle": middle,
           "force": torch.cat([f0.unsqueeze(-1), ft], dim=-1) * maskf,
           "cost": torch.where(middle, 0.5 * Dm * NmT * NmT, zero).sum(-1)}
    u = U[..., 1:]
    if dv is not None:
        V = dv[:, idx] * S
        T1 = (u * V[..., 1:]).sum(-1) / Ts
        T2d = ((V[..., 1:] ** 2).sum(-1) - T1 * T1) / Ts
        g = V[..., 0] - mu * T1
        out["d1"] = torch.where(middle, Dm * NmT * g, zero).sum(-1)
        out["d2"] = torch.where(middle, Dm * (g * g - NmT * mu * T2d), zero).sum(-1)
    if not hessian:
        return out
    # Hessian of the middle-zone cost in the rows' residuals (B, C, 6, 6)
    T3 = Ts * Ts * Ts
    Hh = ((mu * N / T3)[..., None, None] * u.unsqueeze(-1) * u.unsqueeze(-2)
          + torch.diag_embed((mu * mu - mu * N / Ts).unsqueeze(-1).expand_as(u)))
    row0 = torch.cat([torch.ones_like(N).unsqueeze(-1), -(mu / Ts).unsqueeze(-1) * u], dim=-1)
    H = torch.cat([row0.unsqueeze(-2), torch.cat([row0[..., 1:].unsqueeze(-1), Hh], dim=-1)],
                  dim=-2)
    out["hess"] = torch.where(middle[..., None, None], Dm[..., None, None]
                              * S.unsqueeze(-1) * S.unsqueeze(-2) * H, torch.zeros_like(H))
    return out


def _scatter_rows(vals_c, cones, B, R):
    """(B, C, 6) per-cone values to (B, R) rows."""
    # every row belongs to one cone at most: a copy, not a sum
    return vals_c.new_zeros(B, R).index_copy(1, cones.rows, vals_c[:, cones.mask])


def _line_search_newton(x0, dv, c1, c2, D, Rf, floss, mk, exists, coef, cones, iters=60):
    """Minimiser alpha >= 0 along a descent direction when elliptic cones make the cost
    non-quadratic between breakpoints: Newton's method on the derivative inside a bracket."""

    def deriv(alpha):
        x = x0 + alpha.unsqueeze(-1) * dv
        quad, sat = _zones(x, mk, Rf)
        cz = _cone_eval(x0, D, coef, exists, cones, dv=dv, alpha=alpha, hessian=False)
        quad = quad | _scatter_rows(cz["bottom"][..., None].expand(-1, -1, 6).to(x.dtype),
                                    cones, *x.shape).bool()
        Dq = torch.where(quad, D, torch.zeros_like(D))
        g1 = c1 + alpha * c2 + (Dq * x * dv - sat * floss * dv).sum(-1) + cz["d1"]
        g2 = c2 + (Dq * dv * dv).sum(-1) + cz["d2"]
        return g1, g2

    zero = torch.zeros_like(c1)
    lo, hi = zero.clone(), torch.full_like(c1, _INF)
    g0, h0 = deriv(zero)
    alpha = (-g0 / h0).clamp_min(0)
    done = g0 >= 0
    alpha = torch.where(done, zero, alpha)
    for _ in range(iters):
        g1, g2 = deriv(alpha)
        lo = torch.where(g1 < 0, alpha, lo)
        hi = torch.where(g1 > 0, alpha, hi)
        done = done | (g1.abs() <= 64 * torch.finfo(g1.dtype).eps * g0.abs()) | (
            hi - lo <= 4 * torch.finfo(g1.dtype).eps * hi)
        if bool(done.all()):
            break
        new = alpha - g1 / g2
        bad = ~((new > lo) & (new < hi))
        new = torch.where(bad, torch.where(torch.isfinite(hi), 0.5 * (lo + hi), 2 * lo + 1), new)
        alpha = torch.where(done, alpha, new)
    return alpha


def solve(M: Tensor, qfrc_smooth: Tensor, rows: Rows, *, tol: float = 1e-10,
          iterations: int = 100, warmstart: Tensor | None = None,
          scale: Tensor | None = None) -> tuple[Tensor, Tensor, dict]:
    """Constrained acceleration and row forces of MuJoCo's primal problem (see the module doc).

    M: (B, nv, nv) symmetric positive-definite joint-space inertia; qfrc_smooth: (B, nv);
    rows: :class:`~.soft_constraints.Rows` with ``R`` rows. warmstart: optional (B, nv) start,
    used per environment where its cost is below that of ``a0`` (as MuJoCo chooses).
    scale: (B,) factor of MuJoCo's convergence tests; default ``1 / trace(M)`` (MuJoCo's
    ``1 / (meaninertia nv)`` at the current configuration).
    Stops an environment when ``scale |grad| < tol`` (``grad`` of the cost, force units), the
    tolerance floored at the rounding level of the dtype, or when no further decrease is possible.

    Returns ``qacc`` (B, nv), ``force`` (B, R) (``efc_force``: ``-D (J a - aref)`` on quadratic
    rows, ``+-floss`` on saturated friction rows, the cone's force on elliptic cones, 0 elsewhere)
    and ``info`` with ``iterations`` (B,), ``gradient`` (B,) (scaled gradient norm),
    ``improvement`` (B,) (scaled cost decrease of the last step), ``converged`` (B,) bool,
    ``quadratic`` (B, R) bool, ``saturated`` (B, R) (+1 / -1 / 0), ``cone_middle`` (B, C) bool.
    Environments that stop short of ``tol`` raise one warning per call.
    """
    J, aref, R, kind, floss, exists = rows
    B, nv = qfrc_smooth.shape
    nr_all = J.shape[-2]
    if M.shape != (B, nv, nv) or J.shape[:1] + J.shape[2:] != (B, nv):
        raise ShapeError(f"solve: M {tuple(M.shape)}, qfrc_smooth {tuple(qfrc_smooth.shape)} and "
                         f"rows.J {tuple(J.shape)} do not fit (B, nv, nv), (B, nv), (B, R, nv)")
    dtype = qfrc_smooth.dtype
    eps = torch.finfo(dtype).eps
    kind = kind.to(J.device)
    cones = _Cones(kind)
    has_cones = cones.n > 0
    keep = None
    if not has_cones and nr_all:
        live = exists.any(0)
        if not bool(live.all()):
            # a row that exists in no environment has no force and no cost: the search and the
            # differentiable step run on the others, the forces are scattered back at the end
            keep = live.nonzero()[:, 0]
            J, aref, R, floss, exists = (t.index_select(1, keep) for t in (J, aref, R, floss, exists))
            kind = kind.index_select(0, keep)
    nr = J.shape[-2]
    mk = _Masks(kind, exists)
    coneish = (kind == KIND_CONE_NORMAL) | (kind == KIND_CONE_TANGENT)
    with torch.no_grad():
        Md, fd, Jd, arefd, Rd, flossd = (t.detach() for t in (M, qfrc_smooth, J, aref, R, floss))
        if bool(exists.all()):  # (one environment after the compaction above): nothing to mask
            Dd = 1 / Rd
        else:
            Rd = torch.where(exists, Rd, torch.ones_like(Rd))
            Dd = torch.where(exists, 1 / Rd, torch.zeros_like(Rd))
            Jd = torch.where(exists.unsqueeze(-1), Jd, torch.zeros_like(Jd))
            arefd = torch.where(exists, arefd, torch.zeros_like(arefd))
        coef = torch.where(exists & coneish, flossd, torch.zeros_like(flossd))
        flossd = torch.where(exists & ~coneish, flossd, torch.zeros_like(flossd))
        Rf = Rd * flossd
        LM = torch.linalg.cholesky(Md)
        a0 = torch.cholesky_solve(fd.unsqueeze(-1), LM).squeeze(-1)
        sc = (1 / torch.diagonal(Md, dim1=-2, dim2=-1).sum(-1)) if scale is None else scale.detach()

        def state(a):
            x = _mv(Jd, a) - arefd
            quad, sat = _zones(x, mk, Rf)
            cz = None
            if has_cones:
                cz = _cone_eval(x, Dd, coef, exists, cones)
                bottom = cz["bottom"][..., None].expand(-1, -1, 6).to(dtype)
                quad = quad | _scatter_rows(bottom, cones, B, nr).bool()
            cost = _cost(a, a0, Md, x, Dd, Rd, flossd, quad, sat)
            if has_cones:
                cost = cost + cz["cost"]
            return x, quad, sat, cz, cost

        def forces(x, quad, sat, cz):
            f = -torch.where(quad, Dd, torch.zeros_like(Dd)) * x + sat * flossd
            if has_cones:
                f = f + _scatter_rows(cz["force"], cones, B, nr)
            return f

        def hessian(quad, cz):
            Dq = torch.where(quad, Dd, torch.zeros_like(Dd))
            H = Md + torch.bmm(Jd.transpose(-1, -2), Dq.unsqueeze(-1) * Jd)
            if has_cones:
                Jc = Jd[:, cones.idx] * cones.mask.to(dtype)[..., None]
                H = H + (Jc.transpose(-1, -2) @ cz["hess"] @ Jc).sum(1)
            return H

        def new_gauss_scale(a):
            # size of the terms the Gauss cost is made of, for its rounding level
            return 0.5 * ((a.abs() + a0.abs()) * _mv(Md.abs(), a.abs() + a0.abs())).sum(-1)

        Jabs = Jd.abs()
        fd_abs, arefd_abs = fd.abs(), arefd.abs()
        a = a0.clone()
        x, quad, sat, cz, cost = state(a)
        if warmstart is not None:
            aw = warmstart.detach().to(dtype)
            sw = state(aw)
            use = sw[-1] < cost
            a = torch.where(use.unsqueeze(-1), aw, a)
            if has_cones:
                x, quad, sat, cz, cost = state(a)
            else:  # the state of the start chosen per environment
                u1 = use.unsqueeze(-1)
                x, quad, sat = torch.where(u1, sw[0], x), torch.where(u1, sw[1], quad), torch.where(u1, sw[2], sat)
                cost = torch.where(use, sw[-1], cost)

        done = torch.zeros(B, dtype=torch.bool, device=J.device)
        stalled = torch.zeros_like(done)
        niter = torch.zeros(B, dtype=torch.long, device=J.device)
        improvement = torch.zeros(B, dtype=dtype, device=J.device)
        for it in range(iterations + 1):
            force = forces(x, quad, sat, cz)
            Ma = _mv(Md, a)
            grad = Ma - fd - _mv(Jd.transpose(-1, -2), force)
            gnorm = sc * grad.norm(dim=-1)
            if bool((gnorm < tol).all()):  # the floor below cannot matter: tol_eff >= tol
                tol_eff = torch.full_like(gnorm, tol)
            else:
                # rounding level of the gradient: the size of the terms it is the difference of
                Dact = torch.where(quad | coneish, Dd, torch.zeros_like(Dd))
                big = (Ma.abs() + fd_abs + _mv(Jabs.transpose(-1, -2),
                                               Dact * (_mv(Jabs, a.abs()) + arefd_abs)
                                               + sat.abs() * flossd)).norm(dim=-1)
                tol_eff = torch.clamp_min(10 * eps * sc * big, tol)
            done = done | (gnorm < tol_eff) | stalled
            if bool(done.all()) or it == iterations:
                break
            # Newton direction on the current zones
            L, bad = torch.linalg.cholesky_ex(hessian(quad, cz))
            d = -torch.cholesky_solve(grad.unsqueeze(-1), L).squeeze(-1)
            if bool((bad != 0).any()):
                d = torch.where((bad != 0).unsqueeze(-1), -torch.cholesky_solve(grad.unsqueeze(-1), LM)
                                .squeeze(-1), d)
            dv = _mv(Jd, d)
            c1 = (d * (Ma - fd)).sum(-1)
            c2 = (d * _mv(Md, d)).sum(-1)
            if has_cones:
                alpha = _line_search_newton(x, dv, c1, c2, Dd, Rf, flossd, mk, exists, coef,
                                            cones)
            else:
                alpha = _line_search(x, dv, c1, c2, Dd, Rf, flossd, mk)
            alpha = torch.where(done, torch.zeros_like(alpha), alpha)
            a_new = a + alpha.unsqueeze(-1) * d
            new = state(a_new)
            cost_new = new[-1]
            step = ~done & (alpha > 0) & (cost_new <= cost)
            if not bool((step | done | (alpha <= 0)).all()):
                # a step near the solution changes the cost below its rounding: accept it then too
                slack = 64 * eps * (cost.abs() + new_gauss_scale(a_new))
                step = ~done & (alpha > 0) & (cost_new <= cost + slack)
            stalled = stalled | (~done & ~step)
            improvement = torch.where(step, sc * (cost - cost_new), improvement)
            a = torch.where(step.unsqueeze(-1), a_new, a)
            if has_cones:
                x, quad, sat, cz, cost = new if bool(step.all()) else state(a)
            else:  # where no step was taken the state is the one before it
                s1 = step.unsqueeze(-1)
                x, quad, sat = torch.where(s1, new[0], x), torch.where(s1, new[1], quad), torch.where(s1, new[2], sat)
                cost = torch.where(step, cost_new, cost)
            niter = niter + (~done).to(torch.long)
        converged = gnorm < tol_eff
        H = hessian(quad, cz)
        LH = torch.linalg.cholesky(H)

    if not bool(converged.all()):
        worst = int(torch.argmax(torch.where(converged, torch.zeros_like(gnorm), gnorm)))
        warn(f"soft_solver.solve: {int((~converged).sum())} of {B} environment(s) stopped short of "
             f"tol={tol:g} after {int(niter.max())} iterations (worst: environment {worst}, scaled "
             f"gradient {float(gnorm[worst]):.3e}, last scaled improvement "
             f"{float(improvement[worst]):.3e})")

    # differentiable Newton step from the solution with its zones held fixed: its value is the
    # solution (one more exact step) and its derivative the implicit one, -H^-1 dgrad/dtheta
    Dfull = torch.where(exists, 1 / torch.where(exists, R, torch.ones_like(R)), torch.zeros_like(R))
    Dq = torch.where(quad, Dfull, torch.zeros_like(Dfull))
    Jm = torch.where(exists.unsqueeze(-1), J, torch.zeros_like(J))
    arefm = torch.where(exists, aref, torch.zeros_like(aref))
    fsat = sat * torch.where(exists & ~coneish, floss, torch.zeros_like(floss))
    coefm = torch.where(exists & coneish, floss, torch.zeros_like(floss))

    def row_force(xr):
        f = -Dq * xr + fsat
        if has_cones:
            # the sliding cones of the solution, not those of xr (equal up to rounding)
            czr = _cone_eval(xr, Dfull, coefm, exists, cones, hessian=False, middle=cz["middle"])
            f = f + _scatter_rows(czr["force"], cones, B, nr)
        return f

    a_star = a.detach()
    g = _mv(M, a_star) - qfrc_smooth - _mv(Jm.transpose(-1, -2), row_force(_mv(Jm, a_star) - arefm))
    qacc = a_star - torch.cholesky_solve(g.unsqueeze(-1), LH).squeeze(-1)
    force = row_force(_mv(Jm, qacc) - arefm)
    if keep is not None:
        force = force.new_zeros(B, nr_all).index_copy(1, keep, force)
        quad = quad.new_zeros(B, nr_all).index_copy(1, keep, quad)
        sat = sat.new_zeros(B, nr_all).index_copy(1, keep, sat)
    info = {"iterations": niter, "gradient": gnorm, "improvement": improvement,
            "converged": converged, "quadratic": quad, "saturated": sat,
            "cone_middle": cz["middle"] if has_cones else torch.zeros(B, 0, dtype=torch.bool,
                                                                      device=J.device)}
    return qacc, force, info
