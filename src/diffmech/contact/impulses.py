"""The contact problem of one time step, assembled from the constraint Jacobian and the mass
matrix's Cholesky factors, solved, and applied as a velocity change -- with a hand-written reverse
pass.

Per environment, with ``R = 3K`` constraint rows (blocks ``(normal, tangent, tangent)``), ``nv``
velocities and the mass matrix ``M`` block diagonal (one block per model, or a stack of equal
blocks, e.g. free bodies):

    W = M^-1 J^T,   A = J W,   c = J v_free - (b, 0, 0),   lam = solve(A, c, mu),   v+ = v_free + W lam,

with normal targets ``b`` (:func:`assemble`). The reverse pass of this chain, written out with the
solution's cotangent in low-rank form (:func:`~diffmech.contact.pgs.implicit_vjp`), is about
twenty batched products where autograd's graph of the same operations has some seventy nodes
(views, slices, expansions of the batched products), most of them bookkeeping: the checkpointed
rollout's backward pass recomputes every step and pays for each node.

Cotangents, for ``g = dL/dv+``, with ``y = M^-1 (g + J^T a)``, ``u = W lam`` and ``(a, d)`` the
solution's pull-back (``dL/dc = a``, ``dL/dA = a lam^T + diag(d)``)::

    dL/dv_free = g + J^T a
    dL/dJ      = a (v_free + u)^T + lam y^T + 2 diag(d) W^T + e_n (db/dv_n) v^T   (normal rows)
    dL/dM      = -(y u^T + W diag(d) W^T)                                        (per block)
    dL/dL_chol = (dL/dM + dL/dM^T) L_chol
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
from torch import Tensor

from .pgs import PGSResult, implicit_vjp

__all__ = ["Blocks", "Problem", "minv", "assemble", "velocity_update", "update_vjp", "solve_and_apply"]


class Blocks(NamedTuple):
    """The mass matrix's diagonal blocks by their lower Cholesky factors: group ``i`` is
    ``L[i] (B, G_i, n_i, n_i)``, ``G_i`` blocks of size ``n_i`` starting at the velocity indices
    ``starts[i]`` (``G_i`` of them). Together the blocks cover the velocity."""

    L: list[Tensor]
    starts: list[tuple[int, ...]]


def _rows(starts: tuple[int, ...], n: int) -> slice | list[int]:
    """The velocity indices of a group, as a slice where its blocks are consecutive."""
    if all(s == starts[0] + k * n for k, s in enumerate(starts)):
        return slice(starts[0], starts[0] + len(starts) * n)
    return [s + i for s in starts for i in range(n)]


def _order(blocks: Blocks) -> list[int] | None:
    """The permutation putting the groups' rows, concatenated, in velocity order (``None``: already)."""
    idx = []
    for L, st in zip(blocks.L, blocks.starts):
        r = _rows(st, L.shape[-1])
        idx += list(range(r.start, r.stop)) if isinstance(r, slice) else r
    return None if idx == list(range(len(idx))) else idx


def _per_group(X: Tensor, blocks: Blocks) -> list[Tensor]:
    """``X (B, nv, k)`` cut into the groups' ``(B, G, n, k)``."""
    B, _, k = X.shape
    out = []
    for L, st in zip(blocks.L, blocks.starts):
        G, n = L.shape[1], L.shape[-1]
        out.append(X[:, _rows(st, n)].reshape(B, G, n, k))
    return out


def _joined(parts: list[Tensor], order: list[int] | None) -> Tensor:
    """The inverse of :func:`_per_group`: ``(B, G, n, k)`` pieces back to ``(B, nv, k)``."""
    flat = [p.reshape(p.shape[0], -1, p.shape[-1]) for p in parts]
    X = flat[0] if len(flat) == 1 else torch.cat(flat, 1)
    if order is None:
        return X
    out = torch.empty_like(X)
    out[:, order] = X
    return out


def minv(X: Tensor, blocks: Blocks) -> Tensor:
    """``M^-1 X`` for ``X (B, nv, k)``."""
    if len(blocks.L) == 1 and blocks.L[0].shape[1] == 1:  # one model (the common case): no cutting
        return torch.cholesky_solve(X, blocks.L[0][:, 0])
    return _joined([torch.cholesky_solve(x, L) for x, L in zip(_per_group(X, blocks), blocks.L)], _order(blocks))


class Problem(NamedTuple):
    """One step's contact problem (:func:`assemble`), with what its reverse pass reads."""

    A: Tensor  # (B, R, R) Delassus operator
    c: Tensor  # (B, R) free constraint velocity minus the normal targets
    W: Tensor  # (B, nv, R) M^-1 J^T
    vn: Tensor  # (B, K) normal velocity before the step
    bounce: Tensor  # (B, K) bool: the target is the rebound -e vn where it exceeds the gap's
    scale: Tensor  # (B, K) the gap's target is -phi / dt * scale (1, or baumgarte when penetrating)


def assemble(J: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, e: Tensor, blocks: Blocks, *, dt: float,
             baumgarte: float, bounce_speed: float) -> Problem:
    """The problem above for ``J (B, 3K, nv)``, velocities ``v``, ``v_free (B, nv)``, gaps ``phi (B, K)``
    (m) and restitutions ``e (B, K)``: a separated candidate may close its gap within the step
    (``v_n >= -phi / dt``), a penetrating one is pushed out by ``baumgarte |phi| / dt``, an impact
    faster than ``bounce_speed`` (m/s) leaves with ``-e`` times its normal velocity. Differentiable
    (torch operations); :func:`velocity_update` differentiates it by hand."""
    B, R, _ = J.shape
    K = R // 3
    W = minv(J.transpose(-1, -2), blocks)
    A = J @ W
    Jv = J @ torch.stack([v, v_free], -1)  # (B, R, 2): one product for both
    vn = Jv[..., 0].reshape(B, K, 3)[..., 0]
    cfree = Jv[..., 1].reshape(B, K, 3)
    scale = torch.where(phi >= 0, phi.new_ones(()), phi.new_tensor(baumgarte))
    target = -phi / dt * scale
    with torch.no_grad():
        bounce = (vn < -bounce_speed) & (cfree[..., 0] * dt < -phi) & (e > 0)
    target = torch.where(bounce, torch.maximum(target, -e * vn), target)
    c = (cfree - torch.nn.functional.pad(target[..., None], (0, 2))).reshape(B, R)
    return Problem(A, c, W, vn, bounce, scale)


def solve_and_apply(solve, consts: tuple, J, v, v_free, phi, mu, e, Ls) -> tuple[Tensor, PGSResult, Problem, Tensor]:
    """:func:`assemble`, ``solve`` and the impulse's velocity, as :func:`velocity_update` evaluates them:
    ``(v+, the solver's result, the problem, W lam)``; ``consts = (dt, baumgarte, bounce_speed, starts)``."""
    dt, baumgarte, bounce_speed, starts = consts
    p = assemble(J, v, v_free, phi, e, Blocks(list(Ls), starts), dt=dt, baumgarte=baumgarte,
                 bounce_speed=bounce_speed)
    res = solve(p.A, p.c, mu)
    B, K, _ = res.lam.shape
    u = (p.W @ res.lam.reshape(B, 3 * K, 1))[..., 0]
    return v_free + u, res, p, u


class _Update(torch.autograd.Function):
    @staticmethod
    def forward(ctx, solve, out: dict, consts: tuple, J, v, v_free, phi, mu, e, *Ls):
        v1, res, p, u = solve_and_apply(solve, consts, J, v, v_free, phi, mu, e, Ls)
        out["result"] = res
        ctx.consts = consts
        # A = J W is formed again in the backward pass rather than kept: (B, 3K, 3K) is the largest
        # tensor of a step (118 MB for 4096 Ants' 20 candidates), the product a small share of the time
        ctx.save_for_backward(J, v, v_free, phi, mu, e, res.lam, u, p.c, p.W, p.vn, p.bounce, p.scale, *Ls)
        return v1

    @staticmethod
    def backward(ctx, g):
        grads = update_vjp(ctx.consts, ctx.saved_tensors, g, ctx.needs_input_grad[3:])
        return (None, None, None, *grads)


def update_vjp(consts: tuple, saved: tuple, g: Tensor, need: tuple) -> tuple:
    """The reverse pass of :func:`velocity_update` for ``g = dL/dv+ (B, nv)``: the cotangents of ``(J, v,
    v_free, phi, mu, e, *Ls)`` (``None`` where ``need`` is false), from the forward pass's ``consts``
    and tensors ``(J, v, v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, *Ls)``."""
    J, v, v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, *Ls = saved
    A = J @ W  # bit for bit the forward's (the same product of the same tensors)
    dt, _, _, starts = consts
    blocks = Blocks(Ls, starts)
    B, R, nv = J.shape
    K = R // 3
    y = minv(g[..., None], blocks)  # M^-1 g
    g_lam = (J @ y)[..., 0]  # W^T g
    a, d, g_mu = implicit_vjp(lam, A, c, mu, g_lam.reshape(B, K, 3))
    Jt = J.transpose(-1, -2)
    Jta = (Jt @ a[..., None])[..., 0]
    y = (y + W @ a[..., None])[..., 0]  # M^-1 (g + J^T a)
    # the normal targets: c_n = (J v_free)_n - b, b = where(bounce, max(t, -e vn), t), t = -phi / dt * scale
    g_b = -a.reshape(B, K, 3)[..., 0]
    t = -phi / dt * scale
    x = -e * vn
    to_x = bounce & (x > t)  # the rebound is the target (at a tie, the gap's: a subgradient)
    g_t, g_x = torch.where(to_x, 0.0, g_b), torch.where(to_x, g_b, 0.0)
    g_J = g_v = g_vf = g_phi = g_e = None
    if need[0]:
        v1 = v_free + u
        g_J = a[..., :, None] * v1[:, None, :] + lam.reshape(B, R, 1) * y[:, None, :]
        if d is not None:
            g_J = g_J + 2.0 * d[..., :, None] * W.transpose(-1, -2)
        g_vn = g_x * -e
        g_J = g_J.reshape(B, K, 3, nv)
        g_J[:, :, 0] += g_vn[..., None] * v[:, None, :]
        g_J = g_J.reshape(B, R, nv)
    if need[1]:
        g_v = (J.reshape(B, K, 3, nv)[:, :, 0].transpose(-1, -2) @ (g_x * -e)[..., None])[..., 0]
    if need[2]:
        g_vf = g + Jta
    if need[3]:
        g_phi = g_t * (-scale / dt)
    if need[4]:
        g_mu = g_mu if g_mu is not None else torch.zeros_like(mu)
    else:
        g_mu = None
    if need[5]:
        g_e = g_x * -vn
    g_Ls = []
    if any(need[6:]):
        # dL/dM = -(y u^T + W diag(d) W^T) per block; dL/dL = (dL/dM + its transpose) L
        ys, us, Ws = _per_group(y[..., None], blocks), _per_group(u[..., None], blocks), _per_group(W, blocks)
        for Lg, yg, ug, Wg, nd in zip(Ls, ys, us, Ws, need[6:]):
            if not nd:
                g_Ls.append(None)
                continue
            gM = yg @ ug.transpose(-1, -2)
            if d is not None:
                gM = gM + (Wg * d[:, None, None, :]) @ Wg.transpose(-1, -2)
            g_Ls.append(-(gM + gM.transpose(-1, -2)) @ Lg)
    else:
        g_Ls = [None] * len(Ls)
    return (g_J, g_v, g_vf, g_phi, g_mu, g_e, *g_Ls)


def velocity_update(J: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, mu: Tensor, e: Tensor, blocks: Blocks,
                    solve: Callable[[Tensor, Tensor, Tensor], PGSResult], *, dt: float, baumgarte: float,
                    bounce_speed: float) -> tuple[Tensor, PGSResult]:
    """``v+ = v_free + M^-1 J^T lam`` with ``lam = solve(A, c, mu)`` on the problem of :func:`assemble`
    (shapes there; ``mu (B, K)``). ``solve`` runs without a graph and returns the impulses as a
    :class:`~diffmech.contact.pgs.PGSResult` (e.g. :func:`~diffmech.contact.pgs.pgs`, or a replayed
    solution); the gradient w.r.t. every tensor argument (and the Cholesky factors in ``blocks``) is
    the implicit one at that solution, by the hand-written reverse pass above. Returns ``(v+ (B, nv),
    the solver's result)``."""
    consts = (dt, baumgarte, bounce_speed, tuple(blocks.starts))
    args = (J, v, v_free, phi, mu, e)
    if torch.is_grad_enabled() and any(x.requires_grad for x in (*args, *blocks.L)):
        out: dict = {}
        return _Update.apply(solve, out, consts, *args, *blocks.L), out["result"]
    with torch.no_grad():
        v1, res, _, _ = solve_and_apply(solve, consts, *args, blocks.L)
    return v1, res
