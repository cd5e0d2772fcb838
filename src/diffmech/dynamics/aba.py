"""Forward dynamics: the Articulated Body Algorithm (Featherstone 2008, §7.3) and its fast gradient.

ABA is written in world-aligned axes about each body's own origin (:mod:`._local`): articulated
inertias pass from child to parent by a pure translation along the short lever between the two
origins, which keeps float32 results accurate far from the world origin; bodies of one depth are
processed together.

``forward_dynamics`` wraps it with the cheap backward of the implicit function theorem: since
``ID(q, v, qdd, theta) = tau``, for a cotangent ``g`` of ``qdd``, ``lam = M^{-1} g`` is the
cotangent of ``tau`` and the cotangents of ``q``, ``v``, ``f_ext`` and every model parameter are the
VJP of RNEA with ``-lam`` at the solved ``qdd``. The forward pass keeps no graph, and ``M^{-1} g``
reuses the articulated-body factors of the forward pass (they depend on ``q`` only), so it costs
two light sweeps instead of a mass matrix and a factorisation.

The alternative, ``method="crba"``, solves ``M qdd = tau - h`` with the mass matrix (CRBA) and the
bias forces (RNEA) of one shared kinematic pass; its backward reuses the LU factors of ``M``. It
issues about half of ABA's operators, none of them a sweep over the depth of the tree, so eager
calls on a few states -- where each operator costs microseconds of overhead and almost no
arithmetic -- are faster with it; ``method="auto"`` (the default) picks it there.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import OptionError
from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from . import threads
from ._common import (
    RigidInertia,
    TreeState,
    add_passive,
    as_state,
    bind,
    f_ext_entry,
    generalized_force,
    generalized_mass,
    gravity_acceleration,
    joint_q,
    joint_v,
    mm,
    motion_cross,
    mv,
    tree_state,
    velocity_of_dofs,
    velocity_terms,
    world_inertia,
)
from ._jacobian import body_forces_jac, com_jacobians, mass_matrix_jac, one_thread, use_jacobians
from ._local import Shift, com_inertia, local_terms, parent_shifts, tables_of
from ._world import crba_world_bl, world_frame
from .crba import crba_bl, crba_flat
from .kernels import default_native
from .rnea import rnea_bl, rnea_flat
from .rnea_vjp import rnea_state_vjp

__all__ = ["aba", "forward_dynamics", "aba_flat", "forward_dynamics_flat", "METHODS"]

METHODS = ("auto", "aba", "crba")
# Largest flat batch for which ``method="auto"`` takes CRBA + LU in eager mode. Measured (2 threads,
# forward and fast gradient): faster than ABA at 1-64 states (1.1-1.6x) on the iiwa, the Allegro hand
# and a 21-DoF floating-base humanoid; at 1024 states still on the first two, 1.5x slower on the humanoid.
AUTO_CRBA_MAX_BATCH = 64
# ... and (on the CPU) at most this many ``batch * nv^2``: CRBA + LU costs O(nv^2) to O(nv^3) per state,
# ABA O(nv) plus a few operators per level of the tree. Measured on serial chains (2 shared cores,
# float64, steady state): CRBA 2-5x faster at one state up to 400 DoFs, and at 16 states up to 50; ABA 2x
# faster at 64 states from 50 DoFs and at 16 states from 150 (5x at 1000 DoFs and one state). The limit
# (one state up to 256 DoFs, 16 up to 64) is lower than the speed alone would set: solving with M loses
# digits in proportion to its condition number, which grows fast with the length of a chain (CRBA + LU
# within 1e-10 of Pinocchio's ABA up to 150 links, 2e-9 at 300, as Pinocchio's own CRBA + solve; ABA
# within 1e-11 at 300).
AUTO_CRBA_MAX_WORK = 1 << 16


class _Level(NamedTuple):
    """One depth of the tree. A depth with a single body (every depth of a chain) drops the ``k``
    dimension: no stacking, unsqueezing or selecting, which at batch 1 is most of the work.

    Quantities are about each body's own origin (world-aligned axes, :mod:`._local`)."""

    idx: tuple[int, ...]  # bodies at this depth
    par: tuple[int, ...]  # their parents
    dofs: list[int] | int  # their DoF indices (an int for a single body)
    U: Tensor  # (k, 6, B) IA S
    D: Tensor  # (k, B) S^T IA S
    Ud: Tensor  # (k, 6, B) U / D
    u: Tensor  # (k, B)
    S: Tensor  # (k, 6, B) motion columns at the bodies' origins
    c: Tensor  # (k, 6, B) velocity-product acceleration
    shift: Shift | None  # to the parents' origins (None: bodies hanging from the world)


class _Factors(NamedTuple):
    """Articulated-body factors of one configuration: enough to apply ``M(q)^{-1}``."""

    levels: list[_Level]  # deepest first
    root: tuple[Tensor, Tensor, Tensor] | None  # floating base: (S0 (6 comp, 6 dof, B), U0, D0)
    # The centered kinematic pass at q, and the world inertias (world_inertia(ts)) if computed.
    kinematics: tuple[TreeState, RigidInertia | None]
    # Small batches (:func:`_aba_small`): every tensor batch-first, ``(k, B, ...)``, the shifts
    # as transforms ``X``; the root as ``(S0 (B, 6 comp, 6 dof), U0, D0)``.
    batch_first: bool = False


def _aba(tree: KinematicTree, mt: ModelTensors, q: Tensor, v: Tensor, tau: Tensor, f_ext, passive: bool,
         small: bool | None = None) -> tuple[Tensor, _Factors]:
    """ABA: ``qdd (B, nv)`` and the factors that apply ``M(q)^{-1}``. ``small``: take the
    batch-first path of :func:`_aba_small` (default: for batches up to ``ABA_MATRIX_MAX_BATCH``);
    :func:`factor_tensors` needs ``False``."""
    world = world_frame()
    ts = tree_state(tree, mt, q, centered=not world)
    vT, tauT = v.transpose(0, 1), tau.transpose(0, 1)
    if passive:
        tauT = add_passive(tree, mt, tauT, q.transpose(0, 1), vT, 1.0)
    if world:  # everything at the world origin: no shifts between bodies
        vt = velocity_terms(tree, ts, vT, f_ext)
        S, inertia = ts.S, vt.inertia
        levels, IA0, pA0 = _sweep(tree, inertia, vt.bias, S, vt.c, tauT, None)
    else:
        lt = local_terms(tree, ts, vT, f_ext)
        S, inertia = lt.Sl, None  # S: (nv, 6, B) at each body's origin
        dof_V = velocity_of_dofs(tree, lt.V)
        c = motion_cross(dof_V, S * vT[:, None])  # (nv, 6, B): d/dt S_d = V_body(d) x S_d
        shifts = parent_shifts(tree, ts, small)
        if shifts.X is not None:
            a_w = gravity_acceleration(mt).transpose(0, 1).expand(q.shape[0], 6)
            qdd, levels, root = _aba_small(tree, lt.inertia, lt.bias, S, c, tauT, shifts, a_w)
            return qdd, _Factors(levels, root, (ts, None), batch_first=True)
        levels, IA0, pA0 = _sweep(tree, lt.inertia, lt.bias, S, c, tauT, shifts)

    B = q.shape[0]
    a_world = gravity_acceleration(mt).expand(6, B)  # a pure linear acceleration: the same at every point
    A: list[Tensor] = [None] * tree.nb  # type: ignore[list-item]
    pieces: list[Tensor] = []
    root = None
    if tree.nfree:
        S0 = S[:6].transpose(0, 1)  # (6 components, 6 dofs, B)
        U0 = mm(IA0, S0)
        D0 = mm(S[:6], U0)
        rhs = tauT[:6] - mv(S[:6], pA0) - mv(U0.transpose(0, 1), a_world)
        q0 = _solve6(D0, rhs)
        A[0] = a_world + mv(S0, q0)
        pieces.append(q0)
        root = (S0, U0, D0)
    for lv in reversed(levels):
        ap = _parent_accel(A, lv.par, a_world)
        apc = (ap if lv.shift is None else lv.shift.motion_down(ap)) + lv.c
        ql = (lv.u - (lv.U * apc).sum(-2)) / lv.D
        Al = torch.addcmul(apc, lv.S, ql[..., None, :])
        if len(lv.idx) == 1:
            A[lv.idx[0]] = Al
            pieces.append(ql[None])
        else:
            for k, b in enumerate(lv.idx):
                A[b] = Al[k]
            pieces.append(ql)
    qdd = torch.cat(pieces, 0)[list(tree.aba_gather)]  # (nv, B) in DoF order
    return qdd.transpose(0, 1), _Factors(levels, root, (ts, inertia))


def _aba_small(tree: KinematicTree, inertia: RigidInertia, bias: Tensor, S: Tensor, c: Tensor, tauT: Tensor,
               shifts: Shift, a_w: Tensor) -> tuple[Tensor, list[_Level], tuple | None]:
    """ABA for small batches, batch-first: every product of a 6x6 matrix is one batched matrix
    product, and a shift to the parent's origin two (``X^T Ia X``). Returns ``qdd (B, nv)``, the
    levels and the root factors (batch-first, see :class:`_Factors`); ``a_w (B, 6)`` is the
    acceleration that stands in for gravity."""
    IA = list(inertia.matrix().permute(0, 3, 1, 2).unbind(0))  # (B, 6, 6) about each body's origin
    pA = list(bias.permute(0, 2, 1).unbind(0))  # (B, 6)
    Sb, cb, tb = S.permute(0, 2, 1), c.permute(0, 2, 1), tauT  # (nv, B, 6), (nv, B, 6), (nv, B)
    X = shifts.X  # (nb, B, 6, 6)
    levels: list[_Level] = []
    for (idx, par, dofs), index in zip(level_structure(tree), tables_of(tree, S).levels):
        single = len(idx) == 1
        if single:
            Il, pl = IA[idx[0]], pA[idx[0]]
        else:
            Il, pl = torch.stack([IA[b] for b in idx]), torch.stack([pA[b] for b in idx])
        Sl, cl, tl = Sb[dofs], cb[dofs], tb[dofs]
        U = (Il @ Sl[..., None])[..., 0]
        D = (Sl * U).sum(-1)
        Ud = U / D[..., None]
        u = tl - (Sl * pl).sum(-1)
        Ia = torch.addcmul(Il, U[..., :, None], Ud[..., None, :], value=-1)
        pa = torch.addcmul(pl + (Ia @ cl[..., None])[..., 0], Ud, u[..., None])
        Xl = None
        if par[0] >= 0:  # move to the parents' origins, then add
            Xl = X[idx[0]] if single else X.index_select(0, index)
            Xt = Xl.transpose(-1, -2)
            Ia, pa = Xt @ Ia @ Xl, (Xt @ pa[..., None])[..., 0]
            if single:
                IA[par[0]] = IA[par[0]] + Ia
                pA[par[0]] = pA[par[0]] + pa
            else:
                for k, pb in enumerate(par):
                    IA[pb] = IA[pb] + Ia[k]
                    pA[pb] = pA[pb] + pa[k]
        levels.append(_Level(idx, par, dofs, U, D, Ud, u, Sl, cl, None if Xl is None else Shift(None, Xl)))

    A: list[Tensor] = [None] * tree.nb  # type: ignore[list-item]
    pieces: list[Tensor] = []
    root = None
    if tree.nfree:
        S0 = Sb[:6].permute(1, 2, 0)  # (B, 6 components, 6 dofs)
        U0 = IA[0] @ S0
        D0 = S0.transpose(-1, -2) @ U0
        rhs = tb[:6].transpose(0, 1) - (S0.transpose(-1, -2) @ pA[0][..., None])[..., 0] - \
            (a_w[:, None] @ U0)[:, 0]
        q0 = torch.linalg.solve(D0, rhs)  # (B, 6)
        A[0] = a_w + (S0 @ q0[..., None])[..., 0]
        pieces.append(q0.transpose(0, 1))
        root = (S0, U0, D0)
    for lv in reversed(levels):
        ap = _parent_accel(A, lv.par, a_w)
        if lv.shift is not None:
            ap = (lv.shift.X @ ap[..., None])[..., 0]
        apc = ap + lv.c
        ql = (lv.u - (lv.U * apc).sum(-1)) / lv.D
        Al = torch.addcmul(apc, lv.S, ql[..., None])
        if len(lv.idx) == 1:
            A[lv.idx[0]] = Al
            pieces.append(ql[None])
        else:
            for k, b in enumerate(lv.idx):
                A[b] = Al[k]
            pieces.append(ql)
    qdd = torch.cat(pieces, 0)[list(tree.aba_gather)]  # (nv, B) in DoF order
    return qdd.transpose(0, 1), levels, root


def _level_shift(shifts: Shift | None, idx: tuple[int, ...], par: tuple[int, ...], index: Tensor | None
                 ) -> Shift | None:
    if par[0] < 0 or shifts is None:
        return None
    return shifts.select(idx[0] if index is None else index)


def _sweep(tree: KinematicTree, inertia: RigidInertia, bias: Tensor, S: Tensor, c: Tensor, tauT: Tensor,
           shifts: Shift | None) -> tuple[list[_Level], Tensor | None, Tensor | None]:
    """ABA's inward sweep (batch-last). A revolute column ``(0; w)`` at its body's origin meets
    only the right half of the articulated inertia. ``shifts=None``: everything at the world
    origin (no shifts, dense columns)."""
    IA = list(inertia.matrix().unbind(0))
    pA = list(bias.unbind(0))
    prismatic = tree.is_prismatic
    levels: list[_Level] = []
    for (idx, par, dofs), index in zip(level_structure(tree), tables_of(tree, S).levels):
        single = len(idx) == 1
        if single:
            Il, pl = IA[idx[0]], pA[idx[0]]
        else:
            Il, pl = torch.stack([IA[b] for b in idx]), torch.stack([pA[b] for b in idx])
        Sl, cl, tl = S[dofs], c[dofs], tauT[dofs]
        if shifts is None or any(prismatic[b - tree.nfree] for b in idx):
            U = mv(Il, Sl)
            D = (Sl * U).sum(-2)
            u = tl - (Sl * pl).sum(-2)
        else:
            w = Sl[..., 3:, :]
            U = mv(Il[..., 3:, :], w)
            D = (w * U[..., 3:, :]).sum(-2)
            u = tl - (w * pl[..., 3:, :]).sum(-2)
        Ud = U / D[..., None, :]
        Ia = torch.addcmul(Il, U[..., :, None, :], Ud[..., None, :, :], value=-1)
        pa = torch.addcmul(pl + mv(Ia, cl), Ud, u[..., None, :])
        sh = _level_shift(shifts, idx, par, index)
        if par[0] >= 0:
            if sh is not None:  # move to the parents' origins, then add
                Ia, pa = sh.inertia_up(Ia), sh.force_up(pa)
            if single:
                IA[par[0]] = IA[par[0]] + Ia
                pA[par[0]] = pA[par[0]] + pa
            else:
                for k, pb in enumerate(par):
                    IA[pb] = IA[pb] + Ia[k]
                    pA[pb] = pA[pb] + pa[k]
        levels.append(_Level(idx, par, dofs, U, D, Ud, u, Sl, cl, sh))
    return levels, IA[0] if tree.nfree else None, pA[0] if tree.nfree else None


def level_structure(tree: KinematicTree) -> list[tuple[tuple[int, ...], tuple[int, ...], list[int] | int]]:
    """``(bodies, parents, dofs)`` of each depth below a floating base, deepest first, as ABA
    sweeps them (``dofs`` an int for a single-body depth, else a list usable as an index)."""
    out = []
    for (idx, par), level_dofs in zip(reversed(tree.levels), reversed(tree.level_dofs)):
        if tree.nfree and idx == (0,):
            continue
        out.append((idx, par, level_dofs[0] if len(idx) == 1 else list(level_dofs)))
    return out


def factor_tensors(factors: _Factors) -> list[Tensor]:
    """The tensors of ``factors`` that :func:`factors_from` needs: ``U, D, S`` and the shifts
    ``r`` of every depth (below the world), and ``S0, U0, D0`` of a floating base (batch-last
    factors: ``_aba(..., small=False)``)."""
    if factors.batch_first:
        raise ValueError("factor_tensors needs the batch-last factors of _aba(..., small=False)")
    out = [t for lv in factors.levels for t in (lv.U, lv.D, lv.S) + (() if lv.shift is None else (lv.shift.r,))]
    if factors.root is not None:
        out += list(factors.root)
    return out


def factors_from(tree: KinematicTree, ts: TreeState | None, tensors: list[Tensor]) -> _Factors:
    """Rebuild the :class:`_Factors` that apply ``M^{-1}`` from :func:`factor_tensors` (``ts``,
    the kinematic pass at the same configuration, is only carried along)."""
    levels = []
    k = 0
    for idx, par, dofs in level_structure(tree):
        U, D, S = tensors[k:k + 3]
        k += 3
        sh = None
        if par[0] >= 0:
            sh = Shift(tensors[k])
            k += 1
        levels.append(_Level(idx, par, dofs, U, D, U / D[..., None, :], None, S, None, sh))
    root = tuple(tensors[k:k + 3]) if tree.nfree else None
    return _Factors(levels, root, (ts, None))


def _parent_accel(A: list[Tensor], par: tuple[int, ...], a_world: Tensor) -> Tensor:
    if len(par) == 1:
        return A[par[0]] if par[0] >= 0 else a_world
    return torch.stack([A[p] if p >= 0 else a_world for p in par])


def _solve6(D0: Tensor, rhs: Tensor) -> Tensor:
    """Solve ``D0 x = rhs`` for ``D0 (6, 6, B)``, ``rhs (6, B)``."""
    return torch.linalg.solve(D0.permute(2, 0, 1), rhs.transpose(0, 1)).transpose(0, 1)


def apply_inverse_mass(tree: KinematicTree, factors: _Factors, g: Tensor) -> Tensor:
    """``M(q)^{-1} g`` for ``g (B, nv)`` from the factors of a previous ABA pass at ``q``."""
    if factors.batch_first:
        return _apply_inverse_mass_small(tree, factors, g)
    gT = g.transpose(0, 1)
    pA: list[Tensor | None] = [None] * tree.nb
    us = []
    for lv in factors.levels:
        pl = _stack_opt(pA, lv.idx)
        u = gT[lv.dofs] if pl is None else gT[lv.dofs] - (lv.S * pl).sum(-2)
        pa = lv.Ud * u[..., None, :] if pl is None else torch.addcmul(pl, lv.Ud, u[..., None, :])
        if lv.shift is not None:
            pa = lv.shift.force_up(pa)
        for k, p in enumerate(lv.par):
            if p >= 0:
                pk = pa if len(lv.par) == 1 else pa[k]
                pA[p] = pk if pA[p] is None else pA[p] + pk
        us.append(u)
    A: list[Tensor | None] = [None] * tree.nb
    out = torch.empty_like(gT)
    if factors.root is not None:
        S0, _, D0 = factors.root
        rhs = gT[:6] if pA[0] is None else gT[:6] - (S0 * pA[0][:, None]).sum(0)
        x0 = _solve6(D0, rhs)
        A[0] = mv(S0, x0)
        out[:6] = x0
    for lv, u in zip(reversed(factors.levels), reversed(us)):
        ap = _stack_opt(A, lv.par)
        if ap is not None and lv.shift is not None:
            ap = lv.shift.motion_down(ap)
        ql = u / lv.D if ap is None else (u - (lv.U * ap).sum(-2)) / lv.D
        Al = lv.S * ql[..., None, :] if ap is None else torch.addcmul(ap, lv.S, ql[..., None, :])
        if len(lv.idx) == 1:
            A[lv.idx[0]] = Al
        else:
            for k, b in enumerate(lv.idx):
                A[b] = Al[k]
        out[lv.dofs] = ql
    return out.transpose(0, 1)


def _apply_inverse_mass_small(tree: KinematicTree, factors: _Factors, g: Tensor) -> Tensor:
    """:func:`apply_inverse_mass` from the batch-first factors of :func:`_aba_small`."""
    gT = g.transpose(0, 1)
    pA: list[Tensor | None] = [None] * tree.nb
    us = []
    for lv in factors.levels:
        pl = _stack_opt(pA, lv.idx)
        u = gT[lv.dofs] if pl is None else gT[lv.dofs] - (lv.S * pl).sum(-1)
        pa = lv.Ud * u[..., None] if pl is None else torch.addcmul(pl, lv.Ud, u[..., None])
        if lv.shift is not None:
            pa = (lv.shift.X.transpose(-1, -2) @ pa[..., None])[..., 0]
        for k, p in enumerate(lv.par):
            if p >= 0:
                pk = pa if len(lv.par) == 1 else pa[k]
                pA[p] = pk if pA[p] is None else pA[p] + pk
        us.append(u)
    A: list[Tensor | None] = [None] * tree.nb
    out = torch.empty_like(gT)
    if factors.root is not None:
        S0, _, D0 = factors.root
        rhs = gT[:6].transpose(0, 1)
        if pA[0] is not None:
            rhs = rhs - (S0.transpose(-1, -2) @ pA[0][..., None])[..., 0]
        x0 = torch.linalg.solve(D0, rhs)
        A[0] = (S0 @ x0[..., None])[..., 0]
        out[:6] = x0.transpose(0, 1)
    for lv, u in zip(reversed(factors.levels), reversed(us)):
        ap = _stack_opt(A, lv.par)
        if ap is not None and lv.shift is not None:
            ap = (lv.shift.X @ ap[..., None])[..., 0]
        ql = u / lv.D if ap is None else (u - (lv.U * ap).sum(-1)) / lv.D
        Al = lv.S * ql[..., None] if ap is None else torch.addcmul(ap, lv.S, ql[..., None])
        if len(lv.idx) == 1:
            A[lv.idx[0]] = Al
        else:
            for k, b in enumerate(lv.idx):
                A[b] = Al[k]
        out[lv.dofs] = ql
    return out.transpose(0, 1)


def _stack_opt(values: list, idx: tuple[int, ...]) -> Tensor | None:
    """Stack ``values[i]`` for ``i`` in ``idx`` (``None`` or ``i < 0`` count as zero); ``None`` if all zero.
    A single index gives the value itself (a single-body level has no level dimension)."""
    got = [values[i] if i >= 0 else None for i in idx]
    ref = next((g for g in got if g is not None), None)
    if ref is None:
        return None
    if len(got) == 1:
        return ref
    return torch.stack([g if g is not None else torch.zeros_like(ref) for g in got])


def aba_flat(
    tree: KinematicTree,
    mt: ModelTensors,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    f_ext: Tensor | None = None,
    passive: bool = True,
) -> Tensor:
    """ABA on flat batches: ``q (B, nq), v (B, nv), tau (B, nv) -> qdd (B, nv)`` (plain autograd)."""
    return _aba(tree, mt, q, v, tau, f_ext, passive)[0]


def _solve_crba(tree: KinematicTree, mt: ModelTensors, q, v, tau, f_ext, passive
                ) -> tuple[Tensor, tuple[Tensor, Tensor], tuple]:
    """``qdd (B, nv)`` from the mass matrix and the bias forces, the LU factors of ``M``, and the
    centered kinematic pass with the world inertias (``None`` where not needed; ``None`` for both
    where small batches took the Jacobian formulation, which has no such pass)."""
    # LU, not Cholesky: with two threads MKL's potrf stalls for milliseconds whenever the other core
    # is busy, even on one 7x7 matrix (measured on a shared machine: one call in six; none with one
    # thread), and getrf/getrs do not. M is positive definite, so no pivot vanishes and the info
    # flag need not be checked (no sync).
    world = world_frame()
    if not world and use_jacobians(q):
        with one_thread():
            cj = com_jacobians(tree, mt, q)
            LU, piv, _ = torch.linalg.lu_factor_ex(mass_matrix_jac(cj, symmetric=False))
            if passive:
                tau = add_passive(tree, mt, tau.transpose(0, 1), q.transpose(0, 1), v.transpose(0, 1),
                                  1.0).transpose(0, 1)
            # tau - J^T F as one product
            rhs = torch.baddbmm(tau[..., None], cj.J.transpose(1, 2), body_forces_jac(tree, mt, cj, v, None, f_ext),
                                alpha=-1.0)
            return torch.linalg.lu_solve(LU, piv, rhs)[..., 0], (LU, piv), None
    ts = tree_state(tree, mt, q, centered=not world)
    inertia = world_inertia(ts) if world else com_inertia(tree, ts)
    M = crba_world_bl(tree, ts, inertia) if world else crba_bl(tree, ts, inertia)
    h = rnea_bl(tree, ts, q.transpose(0, 1), v.transpose(0, 1), None, f_ext, passive, inertia).transpose(0, 1)
    LU, piv, _ = _lu_factor(M)
    return _lu_apply(LU, piv, tau - h), (LU, piv), (ts, inertia if world else None)


# Measured with torch 2.13+cpu (oneMKL 2024.2) on 2 cores: once ``torch.set_num_threads`` has been called
# (:class:`~._jacobian.one_thread` does), a batched LU of matrices larger than about 140 on two threads
# fails inside MKL ("Parameter 6 was incorrect on entry to DLASWP") and then hangs. Those are factored on
# one thread (at that size the work per matrix dwarfs the lost batch parallelism).
LU_ONE_THREAD_ABOVE = 128


def _lu_factor(M: Tensor):
    """``torch.linalg.lu_factor_ex(M)`` for ``M (B, nv, nv)``, large CPU batches on one thread."""
    if (M.shape[-1] > LU_ONE_THREAD_ABOVE and M.shape[0] > 1 and M.is_cpu
            and not torch.compiler.is_compiling() and not torch._C._are_functorch_transforms_active()):
        with one_thread():
            return torch.linalg.lu_factor_ex(M)
    return torch.linalg.lu_factor_ex(M)


def _lu_apply(LU: Tensor, piv: Tensor, b: Tensor) -> Tensor:
    """``M^{-1} b`` for ``b (B, nv)`` from ``torch.linalg.lu_factor_ex(M)``."""
    return torch.linalg.lu_solve(LU, piv, b[..., None])[..., 0]


def resolve_method(method: str, batch: int, nv: int = 0) -> str:
    """The algorithm ``method`` stands for at flat batch size ``batch`` (``"auto"`` picks one) on a
    tree of ``nv`` DoFs (``0``: leave the size out, as on CUDA)."""
    if method != "auto":
        return method
    # Eager small batches pay per operator, and CRBA + LU issues about half of ABA's operators (no
    # sweep over the depth of the tree). Compiled code, large batches and long chains pay per flop: ABA.
    return "crba" if (batch <= AUTO_CRBA_MAX_BATCH and batch * nv * nv <= AUTO_CRBA_MAX_WORK
                      and not torch.compiler.is_compiling()) else "aba"


class _ForwardDynamics(torch.autograd.Function):
    """Forward dynamics whose backward is one ``M^{-1}`` application plus one RNEA VJP."""

    @staticmethod
    def forward(ctx, tree, method, passive, q, v, tau, f_ext, *mt_fields):
        mt = ModelTensors(*mt_fields)
        if method == "aba":
            qdd, factors = _aba(tree, mt, q, v, tau, f_ext, passive)
            ctx.inverse = lambda g: apply_inverse_mass(tree, factors, g)
            kinematics = factors.kinematics
        else:
            qdd, (LU, piv), kinematics = _solve_crba(tree, mt, q, v, tau, f_ext, passive)
            ctx.inverse = lambda g: _lu_apply(LU, piv, g)
        # Kept for the hand-written backward (inputs and model tensors are constants in here).
        ctx.kinematics = kinematics
        ctx.tree, ctx.passive, ctx.method, ctx.saved_tau = tree, passive, method, tau
        ctx.has_f_ext = f_ext is not None
        ctx.save_for_backward(q, v, qdd, f_ext if f_ext is not None else q.new_empty(0), *mt_fields)
        return qdd

    @staticmethod
    def backward(ctx, g):
        q, v, qdd, f_ext, *mt_fields = ctx.saved_tensors
        f_ext = f_ext if ctx.has_f_ext else None
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():
            return _ForwardDynamics._differentiable_backward(ctx, g, q, v, f_ext, mt_fields)
        lam = ctx.inverse(g.contiguous())
        # Inputs of RNEA that need a cotangent: q, v, f_ext, then the model tensors.
        leaves = [q, v, f_ext, *mt_fields]
        flags = [needs[3], needs[4], needs[6] and f_ext is not None, *needs[7:]]
        wanted = [i for i, f in enumerate(flags) if f]
        grads: list[Tensor | None] = [None] * len(leaves)
        if wanted and not any(flags[3:]):
            # Cotangents of the state (and external forces): the hand-written RNEA VJP (no graph to
            # record and replay), on the forward pass's kinematics.
            ts, inertia = ctx.kinematics or (tree_state(ctx.tree, ModelTensors(*mt_fields), q, centered=True), None)
            gq, gv, gf = rnea_state_vjp(ctx.tree, q, v, qdd, -lam, ctx.passive, ts, inertia, f_ext=f_ext)
            grads[0] = gq if flags[0] else None
            grads[1] = gv if flags[1] else None
            grads[2] = gf if flags[2] else None
        elif wanted:
            with torch.enable_grad():
                # Detached: the saved tensors may carry upstream graphs (e.g. a rollout), which this VJP must not walk.
                inputs = [None if t is None else (t.detach().requires_grad_(True) if flags[i] else t.detach())
                          for i, t in enumerate(leaves)]
                tau_id = rnea_flat(ctx.tree, ModelTensors(*inputs[3:]), inputs[0], inputs[1], qdd.detach(),
                                   inputs[2], ctx.passive)
                got = torch.autograd.grad(tau_id, [inputs[i] for i in wanted], grad_outputs=-lam, allow_unused=True)
            for i, gi in zip(wanted, got):
                grads[i] = gi
        g_tau = lam if needs[5] else None
        return (None, None, None, grads[0], grads[1], g_tau, grads[2], *grads[3:])

    @staticmethod
    def _differentiable_backward(ctx, g, q, v, f_ext, mt_fields):
        """Backward with ``create_graph=True``: differentiate a re-run of the plain algorithm, so
        that higher derivatives are exact (slower; only used when a graph of the gradient is asked for)."""
        tau = ctx.saved_tau
        qdd = (_aba if ctx.method == "aba" else _solve_crba)(ctx.tree, ModelTensors(*mt_fields), q, v, tau, f_ext,
                                                             ctx.passive)[0]
        ins = [q, v, tau, f_ext, *mt_fields]
        wanted = [i for i, t in enumerate(ins) if t is not None and ctx.needs_input_grad[3 + i]]
        got = torch.autograd.grad(qdd, [ins[i] for i in wanted], g, create_graph=True, allow_unused=True)
        grads: list[Tensor | None] = [None] * len(ins)
        for i, gi in zip(wanted, got):
            grads[i] = gi
        return (None, None, None, *grads)


def _mimic_forward_dynamics(tree: KinematicTree, mt: ModelTensors, q, v, tau, f_ext, passive) -> Tensor:
    """Forward dynamics of a tree with mimic joints: ``G^T M G qdd = tau - G^T h`` in the generalised
    coordinates (ABA does not take the coupling; plain autograd for the gradient)."""
    qj, vj = joint_q(tree, q), joint_v(tree, v)
    M = generalized_mass(tree, crba_flat(tree, mt, qj))
    h = rnea_flat(tree, mt, qj, vj, None, f_ext, passive)
    return torch.linalg.solve(M, tau - generalized_force(tree, h))


def check_method(method: str) -> None:
    if method not in METHODS:
        raise OptionError(f"forward_dynamics: unknown method {method!r}; choose from {METHODS}")


def forward_dynamics_flat(
    tree: KinematicTree,
    mt: ModelTensors,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    f_ext: Tensor | None = None,
    passive: bool = True,
    method: str = "auto",
    fast_grad: bool = True,
) -> Tensor:
    """:func:`forward_dynamics` on flat batches ``(B, n)`` of generalised coordinates (no shape checks)."""
    check_method(method)
    if tree.nv == 0:  # a static model: no acceleration
        return q.new_zeros(q.shape[0], 0)
    if tree.coords is not None:
        return _mimic_forward_dynamics(tree, mt, q, v, tau, f_ext, passive)
    method = resolve_method(method, q.shape[0], tree.nv if q.is_cpu else 0)
    # torch.func transforms need setup_context-style functions; plain autograd gives the same result there.
    fast_grad = fast_grad and not torch._C._are_functorch_transforms_active()
    if fast_grad and torch.is_grad_enabled() and any(
        t is not None and t.requires_grad for t in (q, v, tau, f_ext, *mt)
    ):
        return _ForwardDynamics.apply(tree, method, passive, q, v, tau, f_ext, *mt)
    if method == "aba":
        return _aba(tree, mt, q, v, tau, f_ext, passive)[0]
    return _solve_crba(tree, mt, q, v, tau, f_ext, passive)[0]


@threads.decided
def forward_dynamics(
    robot: RobotParameters,
    q: Tensor,
    v: Tensor,
    tau: Tensor,
    *,
    f_ext: Tensor | None = None,
    passive: bool = True,
    method: str = "auto",
    fast_grad: bool = True,
) -> Tensor:
    """Joint accelerations ``qdd = M^{-1} (tau + tau_passive + J^T f_ext - h)``.

    The same function as :func:`diffmech.aba` and :meth:`diffmech.RobotModel.forward_dynamics`.
    Its backward is the implicit-function-theorem gradient (one ``M^{-1}`` application and one
    RNEA VJP, both reusing the forward pass), unless ``fast_grad=False``.

    Args:
        robot: the robot.
        q: (..., nq) configuration.
        v: (..., nv) joint velocities.
        tau: (..., nv) applied joint forces (zero entries on a floating base for an unactuated base).
        f_ext: optional (..., n_links, 6) external force; torque on each link, world-aligned axes,
            torque about the link origin.
        passive: include the model's joint damping and springs.
        method: ``"aba"`` (Articulated Body Algorithm), ``"crba"`` (mass matrix and a batched LU
            solve) or ``"auto"`` (default: ``"crba"`` for eager batches of at most
            ``AUTO_CRBA_MAX_BATCH`` states, where it issues fewer operators, unless on the CPU
            ``batch * nv^2`` exceeds ``AUTO_CRBA_MAX_WORK`` (long chains); else ``"aba"``). They
            agree to rounding.
        fast_grad: use the implicit-function-theorem backward (first-order gradients only).
            ``False`` backpropagates through the algorithm itself (for higher-order derivatives;
            a backward with ``create_graph=True`` does that automatically).

    Returns:
        (..., nv) accelerations in the inputs' dtype and device.
    """
    check_method(method)
    flat, batch = as_state(
        robot, [("q", q, robot.nq), ("v", v, robot.nv), ("tau", tau, robot.nv), f_ext_entry(robot, f_ext)]
    )
    fe = flat[3] if f_ext is not None else None
    if method != "crba" and fast_grad:
        out = default_native(robot, "forward_dynamics", flat, passive, f_ext is not None)
        if out is not None:
            return out.reshape(*batch, robot.nv)
    tree, mt = bind(robot, flat[0])
    qdd = forward_dynamics_flat(tree, mt, flat[0], flat[1], flat[2], fe, passive, method, fast_grad)
    return qdd.reshape(*batch, robot.nv)


aba = forward_dynamics
