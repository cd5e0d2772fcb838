"""MuJoCo's dual projected Gauss-Seidel solver (``<option solver="PGS">``), batched.

The problem is the dual of the one :mod:`~.soft_solver` solves: with ``A = J M^-1 J' + diag(R)``
(MuJoCo's ``efc_AR``) and ``b = J a0 - aref`` (``efc_b``, ``a0 = M^-1 qfrc_smooth``), the row forces
``f`` minimise ``0.5 f' A f + b' f`` subject to ``f`` free on equality rows, ``-floss <= f <= floss``
on friction-loss rows and ``f >= 0`` on limit, frictionless-contact and pyramid-edge rows; then
``qacc = a0 + M^-1 J' f``. At the minimiser this is the primal solution of :mod:`~.soft_solver`.

MuJoCo does not solve it to convergence: it sweeps the rows in a pseudo-random order (a PCG32
generator seeded the same on every call, one Fisher-Yates shuffle of the row list per sweep), each
row set to its unconstrained minimum and clamped to its interval (an update that raises the cost
by more than 1e-10 is undone), with Nesterov momentum between sweeps (``beta = (k - 1) / (k + 2)``,
the extrapolated forces projected back onto the intervals, ``k`` reset to 0 when the sweep's
correction opposes the extrapolation), and stops after a sweep whose cost decrease, scaled by
``1 / trace(M)`` over the island's dofs, is below ``tolerance``, or after ``iterations`` sweeps.
The constraint islands (rows coupled through shared degrees of freedom) are solved as separate
problems, each with its own generator, momentum and stopping test. This module repeats that
arithmetic, so its forces are MuJoCo's (unconverged) forces up to rounding. The matrices are torch;
the sequential sweeps run in NumPy on the CPU, vectorised over islands and environments.

Warm start (MuJoCo's ``mj_warmstart`` for PGS): the primal row forces at ``qacc_warmstart`` (the
previous step's acceleration), replaced by zeros where their dual cost is positive.

Gradients: the sweeps run without autograd. The returned values are PGS's; their derivative is the
implicit derivative of the *converged* problem's minimiser with the zones PGS ends in held fixed
(rows with positive force quadratic, friction rows at a bound saturated): one Newton step of the
primal cost in those zones, taken inside autograd, whose value is subtracted again. It is not the
derivative of the map the truncated iteration computes.

Elliptic cones (kinds 4 and 5) are not implemented here: :func:`solve` raises for them.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import torch
from torch import Tensor

from ..errors import ModelError, ShapeError
from .soft_constraints import (
    KIND_CONE_NORMAL,
    KIND_CONE_TANGENT,
    KIND_EQUALITY,
    KIND_FRICTION,
    Rows,
)

_MASK64 = (1 << 64) - 1
_MINVAL = 1e-15  # MuJoCo's mjMINVAL
_UNDO = 1e-10  # a row update that raises the dual cost by more than this is undone (MuJoCo's rule)


def _pcg32(state: list[int]) -> int:
    old = state[0]
    state[0] = (old * 6364136223846793005 + 1) & _MASK64
    xs = (((old >> 18) ^ old) >> 27) & 0xFFFFFFFF
    rot = old >> 59
    return ((xs >> rot) | (xs << ((-rot) & 31))) & 0xFFFFFFFF


@lru_cache(maxsize=256)
def visit_orders(n: int, sweeps: int) -> np.ndarray:
    """(sweeps, n) the positions (0..n-1 in the island's row order) MuJoCo's PGS visits in each
    sweep of an island with ``n`` rows: one Fisher-Yates shuffle per sweep of the running list,
    PCG32 with state 0 and increment 1, advanced once before the first shuffle."""
    state = [0]
    _pcg32(state)
    order = list(range(n))
    out = np.empty((sweeps, n), dtype=np.int64)
    for s in range(sweeps):
        for i in range(n - 1, 0, -1):
            j = _pcg32(state) % (i + 1)
            order[i], order[j] = order[j], order[i]
        out[s] = order
    return out


def _islands(M: Tensor, J: Tensor, exists: Tensor, split: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """(B, R) island label of every existing row (-1 elsewhere) and (B, nv) that of every dof:
    rows are in one island when they reach each other through degrees of freedom coupled by ``M``
    or by a row; a label is the island's smallest dof (``nv + r`` for a row that touches none).
    ``split=False``: one island (label 0) of all rows and dofs."""
    if not split:
        return (torch.where(exists, 0, -1).cpu().numpy(),
                np.zeros((M.shape[0], M.shape[-1]), dtype=np.int64))
    B, nr, nv = J.shape
    touch = (J != 0) & exists.unsqueeze(-1)  # (B, R, nv)
    t = touch.to(M.dtype)
    adj = ((M != 0).to(M.dtype) + t.transpose(1, 2) @ t) > 0
    reach = adj | torch.eye(nv, dtype=torch.bool, device=M.device)
    for _ in range(max(1, int(np.ceil(np.log2(max(nv, 2)))))):
        reach = (reach.to(M.dtype) @ reach.to(M.dtype)) > 0
    # label of a dof: the smallest dof it reaches; of a row: that of any dof it touches
    dof_label = torch.where(reach, torch.arange(nv, device=M.device), nv).amin(-1)  # (B, nv)
    first = torch.where(touch, torch.arange(nv, device=M.device), nv).amin(-1)  # (B, R)
    lab = dof_label.gather(1, first.clamp_max(nv - 1))
    # a row that touches no dof is an island of its own
    lab = torch.where(first < nv, lab, nv + torch.arange(nr, device=M.device))
    return torch.where(exists, lab, -1).cpu().numpy(), dof_label.cpu().numpy()


def mujoco_row_order(table, contacts, nrows: int) -> Tensor | None:
    """(R,) permutation of the rows into MuJoCo's ``efc`` order, which fixes the order PGS visits
    them in: the rows before the contacts' (friction loss, limits) unchanged, then the contact
    slots as ``mj_collision`` emits them: by body pair (lower body first; bodies ranked by their
    geoms' MuJoCo ids), then geom pair, then slot (:func:`~.soft_collide.collide` orders slots per
    pair type instead). None without contacts.

    table: the :class:`~.soft_geoms.GeomTable` (its ``geom_id``, ``model`` and ``link``); contacts:
    its :class:`~.soft_collide.SoftContacts` (K slots, pyramidal rows as
    :func:`~.soft_constraints.contact_layout` lays them out) or None. Bodies are told apart by
    their (model, link); two bodies that share one (welded into one diffmech link, or static bodies
    other than the world) count as one, which can misplace their contacts in the order.
    """
    if contacts is None or table is None or contacts.geom1.numel() == 0:
        return None
    from .soft_constraints import contact_layout

    cache = table.__dict__.setdefault("_pgs_order", {})
    key = (int(contacts.geom1.numel()), int(nrows))
    if key in cache:
        return cache[key]
    G = len(table.model)
    gid = np.arange(G) if table.geom_id is None or (np.asarray(table.geom_id) < 0).any() else \
        np.asarray(table.geom_id, dtype=np.int64)
    body = np.empty(G, dtype=np.int64)
    rank, prev = -1, object()
    for g in np.argsort(gid, kind="stable"):  # geoms are numbered body by body: a new body starts a run
        cur = (table.model[g], table.link[g])
        rank += cur != prev
        body[g], prev = rank, cur
    g1, g2 = contacts.geom1.cpu().numpy(), contacts.geom2.cpu().numpy()
    b1, b2, i1, i2 = body[g1], body[g2], gid[g1], gid[g2]
    lo = b1 < b2
    slot_key = np.stack([np.minimum(b1, b2), np.maximum(b1, b2), np.where(lo, i1, i2), np.where(lo, i2, i1),
                         np.arange(len(g1))], 1)
    slots, _ = contact_layout(contacts.condim)
    before = nrows - len(slots)
    rank_of_slot = np.lexsort(slot_key.T[::-1]).argsort()
    contact_perm = before + np.lexsort((np.arange(len(slots)), rank_of_slot[slots]))
    perm = np.concatenate([np.arange(before), contact_perm])
    out = None if (perm == np.arange(nrows)).all() else torch.as_tensor(perm, device=contacts.geom1.device)
    cache[key] = out
    return out


def _primal_forces(x: Tensor, D: Tensor, floss: Tensor, kind: Tensor, exists: Tensor) -> Tensor:
    """Row forces of the primal cost at residuals ``x = J a - aref`` (MuJoCo's constraint update)."""
    fric = kind == KIND_FRICTION
    Rf = floss / D.clamp_min(_MINVAL)
    quad_f = -D * x
    f = torch.where(fric, torch.where(x <= -Rf, floss, torch.where(x >= Rf, -floss, quad_f)),
                    torch.where(kind == KIND_EQUALITY, quad_f, torch.where(x < 0, quad_f, torch.zeros_like(x))))
    return torch.where(exists, f, torch.zeros_like(f))


def solve(M: Tensor, qfrc_smooth: Tensor, rows: Rows, *, tol: float = 1e-8, iterations: int = 100,
          warmstart: Tensor | None = None, scale: Tensor | None = None,
          order: Tensor | None = None, islands: bool = True) -> tuple[Tensor, Tensor, dict]:
    """Constrained acceleration and row forces as MuJoCo's PGS computes them (see the module doc).

    M: (B, nv, nv) joint-space inertia (armature included); qfrc_smooth: (B, nv);
    rows: :class:`~.soft_constraints.Rows` with ``R`` rows in MuJoCo's order (friction loss, limits,
    contacts) and kinds 0-3. tol, iterations: ``opt.tolerance`` and ``opt.iterations``.
    warmstart: (B, nv) MuJoCo's ``qacc_warmstart``; None means zeros (``qacc_warmstart`` after
    ``mj_resetData``). scale: (B,) factor of the stopping test; default, as MuJoCo, per island
    ``1 / trace`` of ``M`` over the island's dofs. order: (R,) permutation that puts the rows in
    MuJoCo's ``efc`` order (:func:`mujoco_row_order`), which sets the order PGS visits them in;
    None: they are in it. islands: False solves all rows of an environment as one problem (MuJoCo
    with ``mjDSBL_ISLAND``; the stopping test then scales by ``1 / trace(M)``).

    Returns ``qacc`` (B, nv), ``force`` (B, R) (``efc_force``; 0 on rows that do not exist) and
    ``info``: ``iterations`` (B,) (most sweeps of an island of the environment), ``improvement``
    (B,) (largest scaled cost decrease of an island's last sweep), ``converged`` (B,) (every island
    stopped by the tolerance), ``quadratic`` (B, R), ``saturated`` (B, R) (+1 / -1 / 0) and
    ``cone_middle`` (B, 0).

    Raises:
        ShapeError: shapes that do not fit.
        ModelError: elliptic-cone rows (not implemented for PGS; use ``<option cone="pyramidal">``
            or the Newton solver).
    """
    if order is not None:
        qacc, force, info = solve(M, qfrc_smooth, Rows(*(t.index_select(-2 if t.dim() == 3 else -1, order)
                                                          for t in rows)),
                                  tol=tol, iterations=iterations, warmstart=warmstart, scale=scale,
                                  islands=islands)
        inv = torch.argsort(order)
        for k in ("quadratic", "saturated"):
            info[k] = info[k].index_select(1, inv)
        return qacc, force.index_select(1, inv), info
    J, aref, R, kind, floss, exists = rows
    B, nv = qfrc_smooth.shape
    if M.shape != (B, nv, nv) or J.shape[:1] + J.shape[2:] != (B, nv):
        raise ShapeError(f"soft_pgs.solve: M {tuple(M.shape)}, qfrc_smooth {tuple(qfrc_smooth.shape)} and "
                         f"rows.J {tuple(J.shape)} do not fit (B, nv, nv), (B, nv), (B, R, nv)")
    kind = kind.to(J.device)
    if bool(((kind == KIND_CONE_NORMAL) | (kind == KIND_CONE_TANGENT)).any()):
        raise ModelError("soft_pgs.solve: elliptic-cone rows; diffmech's PGS has pyramidal cones only "
                         "(use <option cone=\"pyramidal\"> or solver=\"Newton\")")
    dtype, dev = qfrc_smooth.dtype, qfrc_smooth.device
    fric = kind == KIND_FRICTION
    eq = kind == KIND_EQUALITY
    with torch.no_grad():
        Md, fd, Jd, arefd, flossd = (t.detach() for t in (M, qfrc_smooth, J, aref, floss))
        Rd = torch.where(exists, R.detach(), torch.ones_like(arefd))
        Jd = torch.where(exists.unsqueeze(-1), Jd, torch.zeros_like(Jd))
        arefd = torch.where(exists, arefd, torch.zeros_like(arefd))
        flossd = torch.where(exists & fric, flossd, torch.zeros_like(flossd))
        LM = torch.linalg.cholesky(Md)
        a0 = torch.cholesky_solve(fd.unsqueeze(-1), LM).squeeze(-1)
        MiJt = torch.cholesky_solve(Jd.transpose(1, 2), LM)  # (B, nv, R)
        A = Jd @ MiJt + torch.diag_embed(Rd)
        b = (Jd @ a0.unsqueeze(-1)).squeeze(-1) - arefd
        sc = None if scale is None else scale.detach().to(dtype)
        inf = torch.full_like(b, float("inf"))
        lo = torch.where(eq, -inf, torch.where(fric, -flossd, torch.zeros_like(b)))
        hi = torch.where(fric, flossd, inf)

        # warm start: primal forces at qacc_warmstart, kept where their dual cost is not positive
        aw = torch.zeros_like(a0) if warmstart is None else warmstart.detach().to(dtype)
        xw = (Jd @ aw.unsqueeze(-1)).squeeze(-1) - arefd
        f = _primal_forces(xw, 1 / Rd, flossd, kind, exists)
        cost_w = (f * b).sum(-1) + 0.5 * (f * (A @ f.unsqueeze(-1)).squeeze(-1)).sum(-1)
        f = torch.where((cost_w > 0).unsqueeze(-1), torch.zeros_like(f), f)

        f, niter, improvement, conv = _sweeps(A, b, f, lo, hi, sc, torch.diagonal(Md, dim1=-2, dim2=-1),
                                              *_islands(Md, Jd, exists, islands), tol, iterations)
        qacc_pgs = a0 + (MiJt @ f.unsqueeze(-1)).squeeze(-1)
        # the zones PGS ends in (MuJoCo's dual state): a friction row at a bound saturates there
        sat = torch.where(fric & exists & (f >= flossd), 1.0, torch.where(fric & exists & (f <= -flossd), -1.0, 0.0))
        sat = sat.to(dtype)
        quad = exists & (eq | (fric & (sat == 0)) | (~eq & ~fric & (f > 0)))

    # implicit gradient of the converged problem with these zones: one Newton step inside autograd
    # from PGS's acceleration; its value is removed again, its derivative kept
    Dfull = torch.where(exists, 1 / torch.where(exists, R, torch.ones_like(R)), torch.zeros_like(R))
    Dq = torch.where(quad, Dfull, torch.zeros_like(Dfull))
    Jm = torch.where(exists.unsqueeze(-1), J, torch.zeros_like(J))
    arefm = torch.where(exists, aref, torch.zeros_like(aref))
    fsat = sat * torch.where(exists & fric, floss, torch.zeros_like(floss))
    H = M + Jm.transpose(-1, -2) @ (Dq.unsqueeze(-1) * Jm)
    LH = torch.linalg.cholesky(H)
    a_star = qacc_pgs.detach()

    def row_force(a):
        return -Dq * ((Jm @ a.unsqueeze(-1)).squeeze(-1) - arefm) + fsat

    g = (M @ a_star.unsqueeze(-1)).squeeze(-1) - qfrc_smooth - (Jm.transpose(-1, -2) @ row_force(a_star)
                                                               .unsqueeze(-1)).squeeze(-1)
    qn = a_star - torch.cholesky_solve(g.unsqueeze(-1), LH).squeeze(-1)
    fn = row_force(qn)
    qacc = qacc_pgs + (qn - qn.detach())
    force = f + torch.where(exists, fn - fn.detach(), torch.zeros_like(fn))
    info = {"iterations": niter, "improvement": improvement, "converged": conv, "quadratic": quad,
            "saturated": sat, "cone_middle": torch.zeros(B, 0, dtype=torch.bool, device=dev)}
    return qacc, force, info


def _sweeps(A: Tensor, b: Tensor, f: Tensor, lo: Tensor, hi: Tensor, sc: Tensor | None, mdiag: Tensor,
            labels: np.ndarray, dof_labels: np.ndarray, tol: float, iterations: int):
    """MuJoCo's PGS sweeps on every island of every environment at once (no autograd).

    A (B, R, R), b, f, lo, hi (B, R), sc (B,) or None (per island: 1 / the trace of ``M`` over the
    island's dofs), mdiag (B, nv) the diagonal of ``M``; labels (B, R), dof_labels (B, nv) from
    :func:`_islands`. Returns the forces (B, R), and per environment the sweeps, the last scaled
    improvement and convergence (tensors on ``b``'s device).

    The sweeps are sequential updates of one row per island at a time, vectorised over the
    islands; they run in NumPy on the CPU, where an update costs a few microseconds (torch's
    per-operation overhead made them 20 times slower), in ``b``'s dtype.
    """
    B, nr = b.shape
    dev, tdtype = b.device, b.dtype
    A, b, f, lo, hi, md = (t.cpu().numpy() for t in (A, b, f, lo, hi, mdiag))
    dtype = b.dtype
    # problems: (environment, island); their rows in increasing order (MuJoCo's island row lists)
    env_of, rows_of, dofs_of = [], [], []
    row_prob = np.full((B, nr), -1, dtype=np.int64)
    for e in range(B):
        for lab in np.unique(labels[e][labels[e] >= 0]):
            r = np.nonzero(labels[e] == lab)[0]
            row_prob[e, r] = len(env_of)
            env_of.append(e)
            rows_of.append(r)
            dofs_of.append(np.nonzero(dof_labels[e] == lab)[0])
    P = len(env_of)

    def out(f, sweeps, imp, conv):
        t = {"device": dev}
        return (torch.as_tensor(f.reshape(B, nr), dtype=tdtype, **t), torch.as_tensor(sweeps, **t),
                torch.as_tensor(imp, dtype=tdtype, **t), torch.as_tensor(conv, **t))

    if P == 0 or iterations <= 0:
        return out(f, np.zeros(B, dtype=np.int64), np.zeros(B, dtype=dtype), np.full(B, P == 0))
    env_t = np.asarray(env_of)
    if sc is None:
        sc_p = np.asarray([1 / md[e, dofs].sum() if len(dofs) else 1 / md[e].sum()
                           for e, dofs in zip(env_of, dofs_of)], dtype=dtype)
    else:
        sc_p = sc.cpu().numpy()[env_t]
    sizes = np.asarray([len(r) for r in rows_of])
    nmax = int(sizes.max())
    # flat row index (e * R + r) each problem visits at sweep s, step k (a problem with fewer rows
    # repeats a dummy slot past its end, masked by `has`)
    visit = np.zeros((iterations, P, nmax), dtype=np.int64)
    for p, (e, r) in enumerate(zip(env_of, rows_of)):
        visit[:, p, :len(r)] = e * nr + r[visit_orders(len(r), iterations)]
    has = np.arange(nmax)[None, :] < sizes[:, None]  # (P, nmax)
    rp = row_prob.reshape(-1)
    row_in = rp >= 0
    rp_safe = np.maximum(rp, 0)

    A_rows = A.reshape(B * nr, nr)
    A_diag = np.diagonal(A, axis1=-2, axis2=-1).reshape(-1).copy()
    A_inv = 1 / A_diag
    b, lo, hi = b.reshape(-1), lo.reshape(-1), hi.reshape(-1)
    f = f.reshape(-1).copy()
    f_prev = f.copy()
    live = np.ones(P, dtype=bool)
    k_nest = np.zeros(P, dtype=dtype)
    sweeps = np.zeros(P, dtype=np.int64)
    imp_last = np.zeros(P, dtype=dtype)
    for s in range(iterations):
        live_row = row_in & live[rp_safe]
        # Nesterov extrapolation, projected onto the rows' intervals
        beta = np.where(k_nest > 0, (k_nest - 1) / np.maximum(k_nest + 2, 1), 0) if s else np.zeros_like(k_nest)
        beta_row = np.where(live_row, beta[rp_safe], 0)
        ext = beta_row > 0
        f_ext = np.minimum(np.maximum(f + beta_row * (f - f_prev), lo), hi)
        f_prev = np.where(live_row, f, f_prev)
        f = np.where(ext, f_ext, f)
        f_mom = f.copy()
        improvement = np.zeros(P, dtype=dtype)
        vs = visit[s]
        act_all = has & live[:, None]
        for k in range(nmax):
            i = vs[:, k]
            act = act_all[:, k]
            old = f[i]
            res = b[i] + np.einsum("pr,pr->p", A_rows[i], f.reshape(B, nr)[env_t])
            new = np.minimum(np.maximum(old - res * A_inv[i], lo[i]), hi[i])
            d = new - old
            change = 0.5 * d * d * A_diag[i] + d * res
            take = (change <= _UNDO) & act
            f[i[take]] = new[take]
            improvement -= np.where(take, change, 0)
        improvement *= sc_p
        # momentum restart where the sweep's correction opposes the extrapolation
        dot = np.bincount(rp_safe, weights=np.where(live_row, (f - f_mom) * (f_mom - f_prev), 0), minlength=P)
        restart = (dot < 0) & (s > 0)
        k_nest = np.where(live, np.where(restart, 0, k_nest + 1), k_nest)
        sweeps += live
        imp_last = np.where(live, improvement, imp_last)
        live = live & ~(improvement < tol)
        if not live.any():
            break
    niter = np.zeros(B, dtype=np.int64)
    np.maximum.at(niter, env_t, sweeps)
    imp_env = np.full(B, -np.inf, dtype=dtype)
    np.maximum.at(imp_env, env_t, imp_last)
    conv = np.ones(B, dtype=bool)
    np.logical_and.at(conv, env_t, imp_last < tol)
    return out(f, niter, np.where(np.isfinite(imp_env), imp_env, 0), conv)
