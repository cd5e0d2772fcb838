"""Integration of a floating base on SE(3), with a hand-written reverse-mode derivative.

A step of a free-flyer configuration (position ``p``, quaternion ``quat`` in ``(x, y, z, w)``
order) by a body twist ``nu = (v; w)`` (base frame; already multiplied by the time step) is

    p' = p + R(quat) V(w) v,      quat' = normalise(quat * e(w)),

with ``V(w) = 1 + b [w]x + c [w]x^2`` (the left Jacobian of SO(3)) and ``e(w) = (s w, cos(t/2))``
the unit quaternion of the rotation vector ``w``, ``t = |w|``, ``s = sin(t/2)/t``,
``b = (1 - cos t)/t^2 = 2 s^2``, ``c = (t - sin t)/t^3``. The quaternion is normalised before use,
so the map is invariant to its norm and its cotangent has no radial component.

Autograd through these few dozen operations on 3-vectors costs more than the rigid-body
algorithms at batch 1 (every operation is a recorded node); :class:`FreeFlyerStep` runs them
without a graph and writes the backward by hand (derivation in its docstring). Under
``torch.compile`` the plain function is traced instead.

Small angles: the coefficients and their derivatives ``s'/t``, ``c'/t`` cancel catastrophically in
closed form; below ``t^2 < 1`` they come from their Taylor series (to ``t^14``, error < 1e-16),
evaluated together as one matrix product with the powers of ``t^2``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["free_flyer_integrate", "free_flyer_vjp", "FreeFlyerStep", "quaternion_step"]

_TERMS = 8  # powers t^0 .. t^14
_SERIES_BELOW = 1.0  # t^2 threshold between series and closed forms


def _series_table() -> list[list[float]]:
    """Taylor coefficients (rows: powers of ``t^2``) of ``s, s'/t, c, c'/t, cos(t/2)``."""
    rows = []
    for n in range(_TERMS):
        sign = (-1) ** n
        s = sign / (2 ** (2 * n + 1) * math.factorial(2 * n + 1))
        c = sign / math.factorial(2 * n + 3)
        cw = sign / (2 ** (2 * n) * math.factorial(2 * n))
        # d/dt of the t^(2m) term over t: 2m t^(2m-2) -> power n = m - 1.
        m = n + 1
        sp = (-1) ** m * 2 * m / (2 ** (2 * m + 1) * math.factorial(2 * m + 1))
        cp = (-1) ** m * 2 * m / math.factorial(2 * m + 3)
        rows.append([s, sp, c, cp, cw])
    return rows


_TABLE = _series_table()
_TABLES: dict = {}


def _table(like: Tensor) -> Tensor:
    key = (like.dtype, like.device)
    t = _TABLES.get(key)
    if t is None:
        t = _TABLES[key] = torch.tensor(_TABLE, dtype=like.dtype, device=like.device)
    return t


def _closed_forms(t2: Tensor) -> Tensor:
    """``(s, s'/t, c, c'/t, cos(t/2))`` from trigonometric functions, ``t2 (B, 1) -> (B, 5)`` (valid away from 0)."""
    safe = torch.where(t2 < _SERIES_BELOW, torch.ones_like(t2), t2)
    t = safe.sqrt()
    half_s, half_c = (t / 2).sin(), (t / 2).cos()
    sin_t = t.sin()
    s = half_s / t
    sp = (t * half_c / 2 - half_s) / (safe * t)
    c = (t - sin_t) / (safe * t)
    one_minus_cos = 2 * half_s * half_s
    cp = (t * one_minus_cos - 3 * (t - sin_t)) / (safe * safe * t)
    return torch.cat([s, sp, c, cp, half_c], dim=-1)


def _coefficients(t2: Tensor) -> Tensor:
    """``(s, s'/t, c, c'/t, cos(t/2))`` for ``t2 = |w|^2 (B, 1)`` -> ``(B, 5)``."""
    powers = torch.cat([torch.ones_like(t2), t2.expand(-1, _TERMS - 1)], dim=-1).cumprod(-1)
    series = powers @ _table(t2)
    if not torch.compiler.is_compiling() and bool((t2 < _SERIES_BELOW).all()):
        return series  # the common case: a time step turns the base by far less than a radian
    return torch.where(t2 < _SERIES_BELOW, series, _closed_forms(t2))


def _cross(a: Tensor, b: Tensor) -> Tensor:
    return torch.linalg.cross(a, b, dim=-1)


def _dot(a: Tensor, b: Tensor) -> Tensor:
    return (a * b).sum(-1, keepdim=True)


def _qmul(a: Tensor, b: Tensor) -> Tensor:
    """Hamilton product of ``(x, y, z, w)`` quaternions ``(B, 4)``."""
    av, aw = a[:, :3], a[:, 3:]
    bv, bw = b[:, :3], b[:, 3:]
    return torch.cat([aw * bv + bw * av + _cross(av, bv), aw * bw - _dot(av, bv)], dim=-1)


def _conj(a: Tensor) -> Tensor:
    return torch.cat([-a[:, :3], a[:, 3:]], dim=-1)


def _forward(q: Tensor, dv: Tensor) -> tuple[Tensor, tuple]:
    """The step and the intermediates its backward needs. ``q (B, nq), dv (B, nv) -> (B, nq)``."""
    pos, quat = q[:, :3], q[:, 3:7]
    v, w = dv[:, :3], dv[:, 3:6]
    coef = _coefficients(_dot(w, w))
    s, c, cw = coef[:, 0:1], coef[:, 2:3], coef[:, 4:5]
    b = 2 * s * s
    wxv = _cross(w, v)
    wwxv = _cross(w, wxv)
    pe = v + b * wxv + c * wwxv  # V(w) v, base frame
    qn = quat.norm(dim=-1, keepdim=True)
    n = quat / qn
    nu, nw = n[:, :3], n[:, 3:]
    uxp = _cross(nu, pe)
    dp = pe + 2 * (nw * uxp + _cross(nu, uxp))  # R(n) pe
    e = torch.cat([s * w, cw], dim=-1)
    m = _qmul(quat, e)
    mn = m.norm(dim=-1, keepdim=True)
    quat1 = m / mn
    out = torch.cat([pos + dp, quat1, q[:, 7:] + dv[:, 6:]], dim=-1)
    return out, (w, v, coef, wxv, wwxv, pe, qn, n, e, mn, quat1)


class FreeFlyerStep(torch.autograd.Function):
    """:func:`free_flyer_integrate` with the backward written by hand.

    For cotangents ``(pbar', quatbar', qbar_j)`` of the outputs:

    * position: ``pbar = pbar'``; through ``R(n) pe``: ``pe_bar = R^T pbar'`` and, for a rotation of
      the base by ``d theta`` on the right, ``theta_bar = pe x pe_bar``, i.e.
      ``quatbar += 2 (n * (theta_bar, 0)) / |quat|``;
    * normalisation ``quat' = m / |m|``: ``mbar = (1 - quat' quat'^T) quatbar' / |m|``; the product
      ``m = quat * e`` gives ``quatbar += mbar * conj(e)`` and ``ebar = conj(quat) * mbar``;
    * ``e = (s w, cos(t/2))``: ``wbar = s ebar_v + w ((s'/t) w.ebar_v - s/2 ebar_w)``;
    * ``pe = v + b w x v + c w x (w x v)``: ``vbar = V^T pe_bar`` and
      ``wbar += (b'/t pe_bar.(w x v) + c'/t pe_bar.(w x w x v)) w + b v x pe_bar
      + c ((w.v) pe_bar + (w.pe_bar) v - 2 (v.pe_bar) w)``, with ``b'/t = 4 s s'/t``;
    * joints: the identity.
    """

    @staticmethod
    def forward(ctx, q: Tensor, dv: Tensor) -> Tensor:
        out, saved = _forward(q, dv)
        ctx.save_for_backward(q, dv, *saved)
        return out

    @staticmethod
    def backward(ctx, g: Tensor):
        q, dv, *saved = ctx.saved_tensors
        if torch.is_grad_enabled():  # a graph of the gradient is wanted: intermediates with their graph
            _, saved = _forward(q, dv)
        return _backward(q, saved, g)


def _backward(q: Tensor, saved: tuple, g: Tensor) -> tuple[Tensor, Tensor]:
    """Cotangents ``(qbar (B, nq), dvbar (B, nv))`` for ``g (B, nq)`` (see :class:`FreeFlyerStep`)."""
    w, v, coef, wxv, wwxv, pe, qn, n, e, mn, quat1 = saved
    quat = q[:, 3:7]
    s, sp, c, cp = coef[:, 0:1], coef[:, 1:2], coef[:, 2:3], coef[:, 3:4]
    b = 2 * s * s
    gp, gq, gj = g[:, :3], g[:, 3:7], g[:, 7:]
    nu, nw = n[:, :3], n[:, 3:]
    # Position through R(n) pe.
    uxg = _cross(nu, gp)
    P = gp - 2 * (nw * uxg - _cross(nu, uxg))  # R^T gp
    th = _cross(pe, P)
    quat_bar = torch.cat([nw * th + _cross(nu, th), -_dot(nu, th)], dim=-1) * (2 / qn)
    # Quaternion through the normalised product.
    mbar = (gq - quat1 * _dot(quat1, gq)) / mn
    quat_bar = quat_bar + _qmul(mbar, _conj(e))
    ebar = _qmul(_conj(quat), mbar)
    ev, ew = ebar[:, :3], ebar[:, 3:]
    # Rotation vector through e(w) and V(w) v.
    wxP = _cross(w, P)
    vbar = P - b * wxP + c * _cross(w, wxP)
    wv, wP, vP = _dot(w, v), _dot(w, P), _dot(v, P)
    radial = sp * _dot(w, ev) - s / 2 * ew + 4 * s * sp * _dot(P, wxv) + cp * _dot(P, wwxv) - 2 * c * vP
    wbar = s * ev + radial * w + b * _cross(v, P) + c * (wv * P + wP * v)
    return torch.cat([gp, quat_bar, gj], dim=-1), torch.cat([vbar, wbar, gj], dim=-1)


def free_flyer_vjp(q: Tensor, dv: Tensor, g: Tensor) -> tuple[Tensor, Tensor]:
    """Cotangents ``(qbar (B, nq), dvbar (B, nv))`` of :func:`free_flyer_integrate` at ``(q, dv)``
    for an output cotangent ``g (B, nq)``, with no graph."""
    with torch.no_grad():
        return _backward(q, _forward(q, dv)[1], g)


def quaternion_step(quat: Tensor, w: Tensor) -> Tensor:
    """Unit quaternions ``(B, 4)`` ``(x, y, z, w)`` turned by rotation vectors ``w (B, 3)`` in their own
    (body) frame: ``normalise(quat * e(w))``, the rotation part of a free-flyer step (a ball joint's
    ``integrate``). Plain operations: autograd differentiates them."""
    coef = _coefficients(_dot(w, w))
    m = _qmul(quat, torch.cat([coef[:, 0:1] * w, coef[:, 4:5]], dim=-1))
    return m / m.norm(dim=-1, keepdim=True)


def _transformed() -> bool:
    """Whether a ``torch.func`` transform (``jvp``, ``vmap``, ...) is tracing: the hand-written
    backward has no forward-mode or batching rule, so those see the plain operations."""
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    return bool(active()) if active is not None else True


def free_flyer_integrate(q: Tensor, dv: Tensor) -> Tensor:
    """One step of a floating-base configuration: ``q (B, nq)`` moved by ``dv (B, nv)`` (velocity
    times time step; base twist in the base frame first) -> ``(B, nq)``, quaternion of unit norm.

    Differentiable twice (with ``create_graph`` the backward recomputes its intermediates with a graph)."""
    if torch.compiler.is_compiling() or _transformed() or not (q.requires_grad or dv.requires_grad):
        return _forward(q, dv)[0]
    return FreeFlyerStep.apply(q, dv)
