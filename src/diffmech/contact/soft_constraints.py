"""MuJoCo's soft constraint rows in torch: Jacobian, reference acceleration and regulariser.

A constraint row ``i`` of MuJoCo's primal problem is ``(J_i, aref_i, R_i)`` plus a kind that says
which cost it carries (see :mod:`.soft_solver`). The numbers follow MuJoCo's
``mj_makeConstraint`` (row assembly), ``mj_diagApprox`` (the approximate diagonal of ``J M^-1 J'``
from the model's ``body_invweight0`` / ``dof_invweight0``), ``mj_makeImpedance`` (impedance from
``solimp``, stiffness and damping from ``solref``, ``R = (1 - imp) / imp * diagApprox``, the
pyramid's common ``R``) and ``mj_referenceConstraint`` (``aref = -B J v - K imp (pos - margin)``).

Rows built here, in MuJoCo's order when concatenated as ``cat_rows(friction, limits, contacts)``:

* dof friction loss (kind 1): ``J = e_dof``, bound ``floss``, ``pos = margin = 0``, no stiffness;
* joint limits of hinge and slide joints (kind 2), per joint the lower side then the upper side:
  ``dist = q - lo`` with ``J = +e_dof`` and ``dist = hi - q`` with ``J = -e_dof``, present where
  ``dist < margin``;
* contacts (condim 1: one frictionless normal row, kind 2; condim 3, 4, 6 with the pyramidal cone:
  ``2 (condim - 1)`` edge rows ``J_n + mu_k J_k`` and ``J_n - mu_k J_k``, kind 3, where ``J_k`` runs
  over the contact frame's tangents, then the spin and the two rolling axes; with the elliptic
  cone: the normal row, kind 4, then ``condim - 1`` rows ``J_k``, kind 5).

All functions are batch-first, work in the dtype of their tensor inputs (float32 or float64) and are
differentiable in every tensor input (positions, velocities, Jacobians, distances, frames).
Units: SI (m, rad, s); ``aref`` is an acceleration in the row's units (m/s^2 or rad/s^2).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..errors import OptionError, ShapeError

# MuJoCo's clamps (mjmodel.h / mjtype.h)
MINVAL = 1e-15
MINIMP = 1e-4
MAXIMP = 0.9999
MINMU = 1e-5
DEFAULT_SOLREF = (0.02, 1.0)

KIND_EQUALITY = 0
KIND_FRICTION = 1
KIND_UNILATERAL = 2  # joint limit, frictionless contact
KIND_EDGE = 3  # pyramid edge
KIND_CONE_NORMAL = 4  # normal row of an elliptic cone
KIND_CONE_TANGENT = 5  # tangential (sliding, spin, rolling) row of an elliptic cone


class Rows(NamedTuple):
    """``R`` constraint rows of a batch of ``B`` environments (padded: ``exists`` masks the rows
    that are not there in an environment; their other entries are finite and ignored).

    J: (B, R, nv) Jacobian (row velocity = J v). aref: (B, R) reference acceleration.
    R: (B, R) regulariser (D = 1 / R). kind: (R,) long, see ``KIND_*``.
    floss: (B, R) friction-loss bound (force units) on kind 1 rows; on the rows of an elliptic cone
    (kinds 4 and 5: a normal row followed by its ``condim - 1`` tangent rows) the cone's
    coefficients: the regularised cone's ``mu`` on the normal row, the friction coefficient on each
    tangent row; 0 elsewhere.
    exists: (B, R) bool.
    """

    J: Tensor
    aref: Tensor
    R: Tensor
    kind: Tensor
    floss: Tensor
    exists: Tensor


def cat_rows(*rows: Rows) -> Rows:
    """Rows of several groups stacked along the row axis (in the given order)."""
    rows = [r for r in rows if r is not None]
    if not rows:
        raise ShapeError("cat_rows: no rows given")
    return Rows(*(torch.cat([getattr(r, f) for r in rows], dim=-2 if f == "J" else -1)
                  for f in Rows._fields))


# --------------------------------------------------------------------------------------------
# impedance and reference parameters


def clamp_solimp(solimp: Tensor) -> Tensor:
    """``solimp`` (..., 5) = (dmin, dmax, width, midpoint, power) clamped as MuJoCo clamps it."""
    d0 = solimp[..., 0].clamp(MINIMP, MAXIMP)
    d1 = solimp[..., 1].clamp(MINIMP, MAXIMP)
    width = solimp[..., 2].clamp_min(0.0)
    mid = solimp[..., 3].clamp(MINIMP, MAXIMP)
    power = solimp[..., 4].clamp_min(1.0)
    return torch.stack([d0, d1, width, mid, power], dim=-1)


def impedance(solimp: Tensor, pos: Tensor, margin: Tensor) -> Tensor:
    """MuJoCo's impedance ``imp`` in (0, 1) of rows at violation ``pos - margin``.

    solimp: (..., 5), already clamped (:func:`clamp_solimp`); pos, margin: (...) broadcastable.
    ``imp`` runs from dmin at zero violation to dmax at ``|pos - margin| >= width`` along
    ``a x^p`` up to the midpoint and ``1 - b (1 - x)^p`` after it (``x = |pos - margin| / width``).
    """
    d0, d1, width, mid, power = solimp.unbind(-1)
    flat = (d0 == d1) | (width <= MINVAL)
    x = ((pos - margin) / torch.where(flat, torch.ones_like(width), width)).abs()
    xc = x.clamp(0.0, 1.0)
    # both branches evaluated on clamped arguments so that autograd never sees 0 ** negative
    lower = xc.pow(power) / mid.pow(power - 1)
    upper = 1 - (1 - xc).pow(power) / (1 - mid).pow(power - 1)
    y = torch.where(power == 1, xc, torch.where(xc <= mid, lower, upper))
    y = torch.where(x >= 1, torch.ones_like(y), y)
    imp = d0 + y * (d1 - d0)
    return torch.where(flat, 0.5 * (d0 + d1) + 0 * x, imp)


def solref_gains(solref: Tensor, solimp: Tensor, dt: float, *, refsafe: bool = True,
                 what: str = "solref") -> tuple[Tensor, Tensor]:
    """Stiffness ``K`` and damping ``B`` of rows from ``solref`` (..., 2) and clamped ``solimp``.

    Positive ``solref = (timeconst, dampratio)``: ``K = 1 / (dmax timeconst dampratio)^2``,
    ``B = 2 / (dmax timeconst)``, with ``timeconst >= 2 dt`` unless ``refsafe`` is off (MuJoCo's
    ``mjDSBL_REFSAFE``). Negative ``solref = (-stiffness, -damping)``: ``K = stiffness / dmax^2``,
    ``B = damping / dmax``. A mixed-sign ``solref`` is replaced by MuJoCo's default (0.02, 1), with
    a warning, as MuJoCo does.
    """
    ref0, ref1 = solref[..., 0], solref[..., 1]
    mixed = (ref0 > 0) ^ (ref1 > 0)
    if bool(mixed.any()):
        warn(f"{what}: mixed-sign solref (one entry positive, one not), replaced by MuJoCo's "
             f"default {DEFAULT_SOLREF} as MuJoCo does")
        ref0 = torch.where(mixed, torch.full_like(ref0, DEFAULT_SOLREF[0]), ref0)
        ref1 = torch.where(mixed, torch.full_like(ref1, DEFAULT_SOLREF[1]), ref1)
    if refsafe:
        ref0 = torch.where(ref0 > 0, ref0.clamp_min(2 * dt), ref0)
    dmax = solimp[..., 1]
    k_std = 1 / (dmax * dmax * ref0 * ref0 * ref1 * ref1).clamp_min(MINVAL)
    k_dir = -ref0 / (dmax * dmax).clamp_min(MINVAL)
    b_std = 2 / (dmax * ref0).clamp_min(MINVAL)
    b_dir = -ref1 / dmax.clamp_min(MINVAL)
    return torch.where(ref0 > 0, k_std, k_dir), torch.where(ref1 > 0, b_std, b_dir)


def _regulariser(imp: Tensor, diag: Tensor) -> Tensor:
    return ((1 - imp) * diag / imp).clamp_min(MINVAL)


# --------------------------------------------------------------------------------------------
# contacts


def _as(x, like: Tensor) -> Tensor:
    return torch.as_tensor(x, dtype=like.dtype, device=like.device)


def contact_layout(condim) -> tuple[np.ndarray, np.ndarray]:
    """Static row layout of contact slots: (slot, local) per row, ``local`` 0 the normal of a
    condim-1 slot, ``1 + 2 (k - 1) + (0 for +mu_k, 1 for -mu_k)`` the edges of the pyramid."""
    condim = np.asarray(torch.as_tensor(condim).cpu(), dtype=np.int64).reshape(-1)
    bad = ~np.isin(condim, (1, 3, 4, 6))
    if bad.any():
        raise ShapeError(f"contact_rows: condim {condim[bad][0]} of slot {int(np.nonzero(bad)[0][0])} "
                         "is not one of MuJoCo's 1, 3, 4, 6")
    slots, local = [], []
    for k, c in enumerate(condim):
        if c == 1:
            slots.append(k)
            local.append(0)
        else:
            slots.extend([k] * (2 * (c - 1)))
            local.extend(range(1, 2 * (c - 1) + 1))
    return np.asarray(slots, dtype=np.int64), np.asarray(local, dtype=np.int64)


def contact_rows(c, Jt: Tensor, Jr: Tensor | None, v: Tensor, invweight1, invweight2, dt: float,
                 *, cone: str = "pyramidal", impratio: float = 1.0, refsafe: bool = True,
                 static: dict | None = None) -> Rows:
    """Rows of ``K`` contact slots (one group of rows per slot, present where ``c.active``).

    c: a :class:`~diffmech.contact.soft_collide.SoftContacts` (or any object with its fields):
    ``frame`` (B, K, 3, 3) rows normal (geom1 to geom2), tangent1, tangent2; ``dist`` (B, K);
    ``active`` (B, K); ``friction`` (K, 5) or (B, K, 5); ``solref`` (K, 2) / ``solimp`` (K, 5)
    (or batched); ``includemargin`` (K,) or (B, K); ``condim`` (K,) (static per slot).
    Jt, Jr: (B, K, 3, nv) world-axes Jacobians of the velocity of geom2's body minus geom1's body
    at the contact point, translational and rotational (``Jr`` only needed for condim 4 and 6).
    v: (B, nv) generalised velocity. invweight1, invweight2: (K, 2) or (B, K, 2)
    ``body_invweight0`` (translation, rotation) of the two geoms' bodies. dt: time step (s).
    impratio: MuJoCo's ``opt.impratio`` (friction-to-normal impedance ratio).
    cone: "pyramidal" (rows in MuJoCo's order within each slot: pairs ``+mu_k``, ``-mu_k`` for
    k = 1, 2, ...) or "elliptic" (a normal row, kind 4, then ``condim - 1`` rows along the
    tangents, spin and rolling axes, kind 5; ``c.solreffriction`` (K, 2), if the object has it and
    it is nonzero, sets their damping as in MuJoCo).
    static: (pyramidal cones) a dict that keeps the per-slot parts that do not depend on the state
    (row layout, clamped parameters, ``solref`` gains, weights; filled on the first call, read on
    the next ones); only for per-slot ``(K, ...)`` parameters that need no gradient, one dict per
    set of them and ``dt``.
    """
    if cone not in ("pyramidal", "elliptic"):
        raise OptionError(f"contact_rows: cone={cone!r} is not 'pyramidal' or 'elliptic'")
    frame, dist = c.frame, c.dist
    B, K = dist.shape[-2], dist.shape[-1]
    nv = Jt.shape[-1]
    if Jt.shape[-4:] != (B, K, 3, nv) or frame.shape[-4:] != (B, K, 3, 3):
        raise ShapeError(f"contact_rows: Jt {tuple(Jt.shape)} / frame {tuple(frame.shape)} do not "
                         f"match dist {tuple(dist.shape)} as (B, K, 3, nv) / (B, K, 3, 3)")
    if cone == "elliptic":
        return _elliptic_rows(c, Jt, Jr, v, invweight1, invweight2, dt, impratio, refsafe)
    dev = dist.device
    like = dist
    st = static if static else _contact_static(c, invweight1, invweight2, dt, refsafe, like)
    if static is not None and not static:
        static.update(st)
    s_idx, l_idx = st["s_idx"], st["l_idx"]
    friction = st["friction"].expand(B, K, 5)
    # rows of the contact frame: normal, tangent1, tangent2, then spin, roll1, roll2
    jc = frame @ Jt
    if st["maxdim"] > 3:
        if Jr is None:
            raise ShapeError("contact_rows: condim 4/6 contacts need the rotational Jacobian Jr")
        jc = torch.cat([jc, frame @ Jr], dim=-2)
    ndir = jc.shape[-2]
    jn = jc[..., 0:1, :]
    mu = friction[..., : ndir - 1, None]
    edges = torch.stack([jn + mu * jc[..., 1:, :], jn - mu * jc[..., 1:, :]], dim=-2)
    cand = torch.cat([jn, edges.reshape(B, K, 2 * (ndir - 1), nv)], dim=-2)
    J = cand[:, s_idx, l_idx]

    margin = st["margin"].expand(B, K)
    imp = impedance(st["solimp"].expand(B, K, 5), dist, margin)
    kk, bb = st["kk"].expand(B, K), st["bb"].expand(B, K)
    tran = st["tran"].expand(B, K)
    # frictionless: R from the translational weight; pyramid: MuJoCo's R of the first edge pair
    # (diagApprox tran (1 + mu_1^2)), the second set to R / impratio, then all edges share
    # 2 mu^2 R with mu^2 = mu_1^2 R[1] / R[0]
    fr0 = friction[..., 0]
    r_normal = _regulariser(imp, tran)
    r_first = _regulariser(imp, tran + fr0 * fr0 * tran)
    r_second = r_first / max(MINVAL, float(impratio))
    r_edge = 2 * fr0 * fr0 * (r_second / r_first) * r_first
    r_slot = torch.where(st["condim1"], r_normal, r_edge)

    vel = (J @ v.unsqueeze(-1)).squeeze(-1)
    aref = -bb[:, s_idx] * vel - (kk * imp * (dist - margin))[:, s_idx]
    kind = st["kind"]
    exists = torch.as_tensor(c.active, device=dev).expand(B, K)[:, s_idx]
    return Rows(J, aref, r_slot[:, s_idx], kind, torch.zeros_like(aref), exists)


def _contact_static(c, invweight1, invweight2, dt, refsafe, like) -> dict:
    """The state-independent parts of :func:`contact_rows` (pyramidal cones)."""
    K = like.shape[-1]
    dev = like.device
    slots, local = contact_layout(c.condim)
    s_idx = torch.as_tensor(slots, device=dev)
    l_idx = torch.as_tensor(local, device=dev)
    solimp = clamp_solimp(_as(c.solimp, like))
    kk, bb = solref_gains(_as(c.solref, like), solimp, dt, refsafe=refsafe, what="contact solref")
    return {"s_idx": s_idx, "l_idx": l_idx, "maxdim": int(torch.as_tensor(c.condim).max()) if K else 1,
            "friction": _as(c.friction, like).clamp_min(MINMU), "solimp": solimp, "kk": kk, "bb": bb,
            "margin": _as(c.includemargin, like),
            "tran": _as(invweight1, like)[..., 0] + _as(invweight2, like)[..., 0],
            "condim1": torch.as_tensor(c.condim, device=dev).reshape(K) == 1,
            "kind": torch.where(l_idx == 0, KIND_UNILATERAL, KIND_EDGE).to(torch.long)}


def _elliptic_rows(c, Jt, Jr, v, invweight1, invweight2, dt, impratio, refsafe) -> Rows:
    frame, dist = c.frame, c.dist
    B, K = dist.shape[-2], dist.shape[-1]
    nv = Jt.shape[-1]
    dev, like = dist.device, dist
    condim = np.asarray(torch.as_tensor(c.condim).cpu(), dtype=np.int64).reshape(-1)
    contact_layout(condim)  # validates the condims
    slots = np.repeat(np.arange(K), condim)
    local = np.concatenate([np.arange(n) for n in condim]) if K else np.zeros(0, np.int64)
    s_idx, l_idx = torch.as_tensor(slots, device=dev), torch.as_tensor(local, device=dev)
    jc = frame @ Jt
    if K and condim.max() > 3:
        if Jr is None:
            raise ShapeError("contact_rows: condim 4/6 contacts need the rotational Jacobian Jr")
        jc = torch.cat([jc, frame @ Jr], dim=-2)
    J = jc[:, s_idx, l_idx] if K else jc.new_zeros(B, 0, nv)
    friction = _as(c.friction, like).clamp_min(MINMU).expand(B, K, 5)
    solimp = clamp_solimp(_as(c.solimp, like)).expand(B, K, 5)
    solref = _as(c.solref, like).expand(B, K, 2)
    srf = getattr(c, "solreffriction", None)
    srf = torch.zeros_like(solref) if srf is None else _as(srf, like).expand(B, K, 2)
    margin = _as(c.includemargin, like).expand(B, K)
    imp = impedance(solimp, dist, margin)
    kk, bb = solref_gains(solref, solimp, dt, refsafe=refsafe, what="contact solref")
    # MuJoCo's solreffriction: a mixed-sign pair becomes (0, 0), i.e. the contact's solref
    mixed = (srf[..., 0] > 0) ^ (srf[..., 1] > 0)
    if bool(mixed.any()):
        warn("contact solreffriction: mixed-sign values replaced by (0, 0) as MuJoCo does")
        srf = torch.where(mixed.unsqueeze(-1), torch.zeros_like(srf), srf)
    use_f = (srf[..., 0] != 0) | (srf[..., 1] != 0)
    _, bf = solref_gains(torch.where(use_f.unsqueeze(-1), srf, solref), solimp, dt,
                         refsafe=refsafe, what="contact solreffriction")
    iw1 = _as(invweight1, like).expand(B, K, 2)
    iw2 = _as(invweight2, like).expand(B, K, 2)
    tran = iw1[..., 0] + iw2[..., 0]
    # normal R from the translational weight, the first tangent R / impratio, the others scaled so
    # that R_j mu_j^2 is the same for all tangent rows; the cone's mu = mu_1 sqrt(R_1 / R_0)
    r0 = _regulariser(imp, tran)
    r1 = r0 / max(MINVAL, float(impratio))
    fr0 = friction[..., 0]
    mu = fr0 * torch.sqrt(r1 / r0)
    r_tan = torch.cat([r1.unsqueeze(-1), r1.unsqueeze(-1) * fr0.unsqueeze(-1) ** 2
                       / friction[..., 1:] ** 2], dim=-1)  # (B, K, 5) rows 1..5
    r_all = torch.cat([r0.unsqueeze(-1), r_tan], dim=-1)
    coef = torch.cat([mu.unsqueeze(-1), friction], dim=-1)  # (B, K, 6)
    R = r_all[:, s_idx, l_idx]
    vel = (J @ v.unsqueeze(-1)).squeeze(-1)
    normal = l_idx == 0
    b_row = torch.where(normal, bb[:, s_idx], bf[:, s_idx])
    aref = -b_row * vel - torch.where(normal, (kk * imp * (dist - margin))[:, s_idx],
                                      torch.zeros_like(vel))
    # a condim-1 contact is a frictionless row under either cone, as in MuJoCo
    frictionless = torch.as_tensor(condim[slots] == 1, device=dev)
    kind = torch.where(normal, KIND_CONE_NORMAL, KIND_CONE_TANGENT).to(torch.long)
    kind = torch.where(frictionless, KIND_UNILATERAL, kind)
    coef = coef[:, s_idx, l_idx]
    coef = torch.where(frictionless, torch.zeros_like(coef), coef)
    exists = torch.as_tensor(c.active, device=dev).expand(B, K)[:, s_idx]
    return Rows(J, aref, R, kind, coef, exists)


# --------------------------------------------------------------------------------------------
# joint limits and dof friction loss


def limit_rows(qval: Tensor, v: Tensor, dof, jrange, margin, solref, solimp, invweight, dt: float,
               *, refsafe: bool = True, static: dict | None = None) -> Rows:
    """Rows of the limits of ``L`` hinge / slide joints: ``2 L`` rows, per joint lower then upper.

    qval: (B, L) joint positions (rad or m); v: (B, nv) generalised velocity; dof: (L,) the joints'
    dof indices; jrange: (L, 2) (lo, hi); margin: (L,) activation margin; solref: (L, 2) and
    solimp: (L, 5) (MuJoCo's ``jnt_solref`` / ``jnt_solimp``, i.e. solreflimit / solimplimit);
    invweight: (L,) ``dof_invweight0`` of the joints' dofs. A row exists where ``dist < margin``
    with ``dist = q - lo`` (lower, J = +e_dof) and ``dist = hi - q`` (upper, J = -e_dof).
    static: a dict that keeps the parts that do not depend on the state (filled on the first call,
    read on the next ones); the caller keeps one per set of constants, dtype, device, ``nv`` and ``dt``.
    """
    B, nv = v.shape[-2], v.shape[-1]
    like = v
    if static:
        st = static
        L = st["L"]
    else:
        dof = torch.as_tensor(dof, device=v.device, dtype=torch.long).reshape(-1)
        L = dof.numel()
        st = {"L": L, "jrange": _as(jrange, like).reshape(L, 2),
              "sign": torch.tensor([1.0, -1.0], dtype=v.dtype, device=v.device).repeat(L),
              "dof2": dof.repeat_interleave(2)}
        J = torch.zeros(2 * L, nv, dtype=v.dtype, device=v.device)
        J[torch.arange(2 * L, device=v.device), st["dof2"]] = st["sign"]
        st["J"] = J
        st["marg"] = _as(margin, like).reshape(L).repeat_interleave(2)
        st["si"] = clamp_solimp(_as(solimp, like).reshape(L, 5)).repeat_interleave(2, dim=0)
        sr = _as(solref, like).reshape(L, 2).repeat_interleave(2, dim=0)
        st["kk"], st["bb"] = solref_gains(sr, st["si"], dt, refsafe=refsafe, what="joint solreflimit")
        st["iw"] = _as(invweight, like).reshape(L).repeat_interleave(2)
        st["kind"] = torch.full((2 * L,), KIND_UNILATERAL, dtype=torch.long, device=v.device)
        if static is not None:
            static.update(st)
    if qval.shape[-2:] != (B, L):
        raise ShapeError(f"limit_rows: qval {tuple(qval.shape)} is not (B, L) = ({B}, {L})")
    jrange = st["jrange"]
    dist = torch.stack([qval - jrange[:, 0], jrange[:, 1] - qval], dim=-1).reshape(B, 2 * L)
    marg = st["marg"]
    imp = impedance(st["si"], dist, marg)
    R = _regulariser(imp, st["iw"]).expand(B, 2 * L)
    vel = v[:, st["dof2"]] * st["sign"]
    aref = -st["bb"] * vel - st["kk"] * imp * (dist - marg)
    return Rows(st["J"].expand(B, 2 * L, nv), aref, R, st["kind"], torch.zeros_like(aref), dist < marg)


def frictionloss_rows(v: Tensor, dof, frictionloss, solref, solimp, invweight, dt: float,
                      *, refsafe: bool = True) -> Rows:
    """Rows of ``F`` dofs with friction loss (always present).

    v: (B, nv); dof: (F,) dof indices; frictionloss: (F,) bound (N or N m); solref: (F, 2),
    solimp: (F, 5) (``dof_solref`` / ``dof_solimp``: solreffriction / solimpfriction);
    invweight: (F,) ``dof_invweight0``. The rows have no stiffness: ``aref = -B v_dof``, and their
    impedance is the one at zero violation.
    """
    B, nv = v.shape[-2], v.shape[-1]
    like = v
    dof = torch.as_tensor(dof, device=v.device, dtype=torch.long).reshape(-1)
    F = dof.numel()
    J = torch.zeros(B, F, nv, dtype=v.dtype, device=v.device)
    J[:, torch.arange(F, device=v.device), dof] = 1.0
    si = clamp_solimp(_as(solimp, like).reshape(F, 5))
    sr = _as(solref, like).reshape(F, 2)
    zero = torch.zeros(F, dtype=v.dtype, device=v.device)
    imp = impedance(si, zero, zero)
    _, bb = solref_gains(sr, si, dt, refsafe=refsafe, what="dof solreffriction")
    R = _regulariser(imp, _as(invweight, like).reshape(F)).expand(B, F)
    aref = -bb * v[:, dof]
    floss = _as(frictionloss, like).reshape(F).expand(B, F)
    kind = torch.full((F,), KIND_FRICTION, dtype=torch.long, device=v.device)
    return Rows(J, aref, R, kind, floss, torch.ones(B, F, dtype=torch.bool, device=v.device))


# --------------------------------------------------------------------------------------------
# parameters from a compiled MuJoCo model

# mjtDisableBit values (mjmodel.h)
_DSBL_CONSTRAINT = 1 << 0
_DSBL_FRICTIONLOSS = 1 << 2
_DSBL_LIMIT = 1 << 3
_DSBL_REFSAFE = 1 << 12


def refsafe_of(m) -> bool:
    """Whether a ``mujoco.MjModel`` floors ``timeconst`` at ``2 dt`` (``mjDSBL_REFSAFE`` unset):
    the ``refsafe`` argument of the row builders."""
    return not (int(m.opt.disableflags) & _DSBL_REFSAFE)


def limit_params(m) -> dict:
    """The limited hinge and slide joints of a ``mujoco.MjModel``, as numpy arrays for
    :func:`limit_rows`: ``qposadr``, ``dof``, ``range``, ``margin``, ``solref``, ``solimp``,
    ``invweight``. Limited ball joints are not supported and are named in a warning. No joints
    when the model disables limits or all constraints (``opt.disableflags``)."""
    if int(m.opt.disableflags) & (_DSBL_LIMIT | _DSBL_CONSTRAINT):
        limited = np.zeros(0, dtype=np.int64)
    else:
        limited = np.nonzero(np.asarray(m.jnt_limited, dtype=bool))[0]
    jtype = np.asarray(m.jnt_type)[limited]
    ball = limited[jtype == 1]
    if ball.size:
        warn(f"limit_params: the limits of ball joint(s) {ball.tolist()} are not modelled "
             "(only hinge and slide joint limits are)")
    sel = limited[(jtype == 2) | (jtype == 3)]
    dof = np.asarray(m.jnt_dofadr)[sel]
    return {
        "qposadr": np.asarray(m.jnt_qposadr)[sel], "dof": dof,
        "range": np.asarray(m.jnt_range)[sel], "margin": np.asarray(m.jnt_margin)[sel],
        "solref": np.asarray(m.jnt_solref)[sel], "solimp": np.asarray(m.jnt_solimp)[sel],
        "invweight": np.asarray(m.dof_invweight0)[dof],
    }


def frictionloss_params(m) -> dict:
    """The dofs of a ``mujoco.MjModel`` with friction loss, for :func:`frictionloss_rows`:
    ``dof``, ``frictionloss``, ``solref``, ``solimp``, ``invweight``; no dofs when the model
    disables friction loss or all constraints (``opt.disableflags``)."""
    dof = np.nonzero(np.asarray(m.dof_frictionloss) != 0)[0]
    if int(m.opt.disableflags) & (_DSBL_FRICTIONLOSS | _DSBL_CONSTRAINT):
        dof = dof[:0]
    return {
        "dof": dof, "frictionloss": np.asarray(m.dof_frictionloss)[dof],
        "solref": np.asarray(m.dof_solref)[dof], "solimp": np.asarray(m.dof_solimp)[dof],
        "invweight": np.asarray(m.dof_invweight0)[dof],
    }
