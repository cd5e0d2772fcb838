"""RNEA, ABA and CRBA as straight-line programs on lanes: the form :mod:`.native` turns into one loop.

Every scalar of the per-state algorithm is a ``(B,)`` tensor -- one lane per state -- and every
operation is elementwise. Traced and emitted as C (:mod:`.native`), a whole algorithm becomes a
single vectorised loop over the batch that keeps each state's intermediates in registers: nothing
but the inputs and the result touches memory. The batch-last tensor programs of :mod:`.rnea` and
:mod:`.aba` instead write every intermediate ``(nb, 6, B)`` array to memory. In eager mode the code
here issues thousands of tiny operations; it is written for code generation (and runs eagerly in
its tests).

Conventions (those of Featherstone 2008 and Pinocchio, not the world-frame form of the batch-last
code): each body's quantities are in its own frame, spatial vectors are ``(linear; angular)``, a
joint's transform is ``(R, p)`` with ``R`` the body's axes and ``p`` its origin in the parent body's
frame. A floating base's ``v[:6]`` and ``a[:6]`` are its body-frame velocity and acceleration, as in
the rest of diffmech. Results equal the batch-last algorithms to rounding.

A symmetric 6x6 matrix (spatial inertia, articulated inertia) is kept as blocks ``(A, Bm, C)``:
``[[A, Bm], [Bm^T, C]]`` with ``A`` and ``C`` symmetric 3x3 (6 lanes each, see ``_SYM``) and
``Bm`` a full 3x3 (9 lanes, row-major): 21 lanes in all.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from ..model.parameters import ModelTensors
from ..model.tree import KinematicTree

__all__ = ["rnea_lanes", "aba_lanes", "crba_lanes", "kinematics_lanes", "advance_lanes", "ground_step_lanes",
           "SERIES_BELOW"]

Vec = list  # 3 lanes
Mat = list  # 9 lanes, row-major
Sym = list  # 6 lanes: 00, 01, 02, 11, 12, 22
_SYM = ((0, 1, 2), (1, 3, 4), (2, 4, 5))  # (row, column) -> position in a Sym
_UPPER = ((0, 0), (0, 1), (0, 2), (1, 1), (1, 2), (2, 2))  # position in a Sym -> (row, column)


# ---------------------------------------------------------------- 3-vectors and 3x3 matrices on lanes
def _cross(a: Vec, b: Vec) -> Vec:
    return [a[1] * b[2] - a[2] * b[1], a[2] * b[0] - a[0] * b[2], a[0] * b[1] - a[1] * b[0]]


def _add(a: Vec, b: Vec) -> Vec:
    return [x + y for x, y in zip(a, b)]


def _sub(a: Vec, b: Vec) -> Vec:
    return [x - y for x, y in zip(a, b)]


def _scale(a: Vec, s) -> Vec:
    return [x * s for x in a]


def _dot(a: Vec, b: Vec):
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]


def _mv(R: Mat, x: Vec) -> Vec:
    """``R x``."""
    return [R[3 * i] * x[0] + R[3 * i + 1] * x[1] + R[3 * i + 2] * x[2] for i in range(3)]


def _mtv(R: Mat, x: Vec) -> Vec:
    """``R^T x``."""
    return [R[i] * x[0] + R[3 + i] * x[1] + R[6 + i] * x[2] for i in range(3)]


def _sym_mv(S: Sym, x: Vec) -> Vec:
    return [S[_SYM[i][0]] * x[0] + S[_SYM[i][1]] * x[1] + S[_SYM[i][2]] * x[2] for i in range(3)]


def _col(M: Mat, j: int) -> Vec:
    return [M[j], M[3 + j], M[6 + j]]


def _rot_sym(R: Mat, S: Sym) -> Sym:
    """``R S R^T`` for symmetric ``S``."""
    rows = [[R[3 * i], R[3 * i + 1], R[3 * i + 2]] for i in range(3)]
    RS = [_sym_mv(S, r) for r in rows]  # rows of R S
    return [_dot(RS[i], rows[j]) for i, j in _UPPER]


def _rot_full(R: Mat, M: Mat) -> Mat:
    """``R M R^T``."""
    RM = [_mtv(M, [R[3 * i], R[3 * i + 1], R[3 * i + 2]]) for i in range(3)]  # row i of R M is (M^T r_i)^T
    return [_dot(RM[i], [R[3 * j], R[3 * j + 1], R[3 * j + 2]]) for i in range(3) for j in range(3)]


def _skew_mul_sym(p: Vec, S: Sym) -> Mat:
    """``[p] S`` for symmetric ``S``: column ``j`` is ``p x S[:, j]``."""
    cols = [_cross(p, [S[_SYM[0][j]], S[_SYM[1][j]], S[_SYM[2][j]]]) for j in range(3)]
    return [cols[j][i] for i in range(3) for j in range(3)]


def _skew_mul(p: Vec, M: Mat) -> Mat:
    """``[p] M``: column ``j`` is ``p x M[:, j]``."""
    cols = [_cross(p, _col(M, j)) for j in range(3)]
    return [cols[j][i] for i in range(3) for j in range(3)]


# ---------------------------------------------------------------- spatial algebra in local frames
def _motion_to_child(R: Mat, p: Vec, lin: Vec, ang: Vec) -> tuple[Vec, Vec]:
    """A parent-frame motion seen in the child frame: ``(R^T (lin + ang x p), R^T ang)``."""
    return _mtv(R, _add(lin, _cross(ang, p))), _mtv(R, ang)


def _force_to_parent(R: Mat, p: Vec, lin: Vec, ang: Vec) -> tuple[Vec, Vec]:
    """A child-frame force seen in the parent frame: ``(R lin, R ang + p x R lin)``."""
    rl = _mv(R, lin)
    return rl, _add(_mv(R, ang), _cross(p, rl))


def _motion_cross(vl: Vec, va: Vec, ml: Vec, ma: Vec) -> tuple[Vec, Vec]:
    """``v x m`` for spatial motions."""
    return _add(_cross(va, ml), _cross(vl, ma)), _cross(va, ma)


def _force_cross(vl: Vec, va: Vec, fl: Vec, fa: Vec) -> tuple[Vec, Vec]:
    """``v x* f``."""
    return _cross(va, fl), _add(_cross(va, fa), _cross(vl, fl))


def _sym6_apply(I6: tuple[Sym, Mat, Sym], lin: Vec, ang: Vec) -> tuple[Vec, Vec]:
    """``[[A, Bm], [Bm^T, C]] (lin; ang)``."""
    A, Bm, C = I6
    return _add(_sym_mv(A, lin), _mv(Bm, ang)), _add(_mtv(Bm, lin), _sym_mv(C, ang))


def _sym6_to_parent(R: Mat, p: Vec, I6: tuple[Sym, Mat, Sym]) -> tuple[Sym, Mat, Sym]:
    """``X^T I X`` for the motion transform ``X`` from the parent to the child frame.

    Rotation first (each block ``R . R^T``), then the shift of the reference point by ``p`` with
    ``P = [p]``: ``A, Bm - A P, C + P Bm - Bm^T P - P A P``.
    """
    A, Bm, C = _rot_sym(R, I6[0]), _rot_full(R, I6[1]), _rot_sym(R, I6[2])
    PA = _skew_mul_sym(p, A)
    AP = [-PA[3 * j + i] for i in range(3) for j in range(3)]  # A P = -(P A)^T: A symmetric, P skew
    Bn = [b - x for b, x in zip(Bm, AP)]
    PB = _skew_mul(p, Bm)
    PAP = _skew_mul(p, AP)  # symmetric; only its upper triangle is read
    Cn = [C[_SYM[i][j]] + PB[3 * i + j] + PB[3 * j + i] - PAP[3 * i + j]
          for i, j in _UPPER]
    return A, Bn, Cn


# ---------------------------------------------------------------- the model on lanes
class _Tree:
    """Per-body constants of one call, indexed as lanes (0-d tensors broadcast against lanes)."""

    def __init__(self, tree: KinematicTree, mt: ModelTensors):
        self.model, self.mt = tree, mt
        self.nfree = tree.nfree
        self.parent = tree.body_parent
        g = mt.gravity
        self.ag = [-g[0], -g[1], -g[2]]  # the world's acceleration that stands in for gravity

    def joint(self, b: int) -> tuple[int, bool, Vec]:
        """DoF index, whether the joint is prismatic, and its axis in the body frame."""
        j = b - self.nfree
        prismatic = self.model.is_prismatic[j]
        axis = self.mt.lin_axis[j, :, 0] if prismatic else self.mt.rot_axis[j, :, 0]
        return b + 5 * self.nfree, prismatic, [axis[0], axis[1], axis[2]]

    def placement(self, b: int, qT: Tensor) -> tuple[Mat, Vec]:
        """``(R, p)`` of body ``b`` in its parent's frame (the world for roots and the base)."""
        mt = self.mt
        if self.nfree and b == 0:
            return _quat_matrix([qT[3], qT[4], qT[5], qT[6]]), [qT[0], qT[1], qT[2]]
        j = b - self.nfree
        qj = qT[7 * self.nfree + j]
        if self.model.is_prismatic[j]:  # A1 and A2 vanish: the rotation is constant
            R = [mt.A0[j, r, c, 0] for r in range(3) for c in range(3)]
            p = [mt.p_tree[j, r, 0] + mt.lin_dir[j, r, 0] * qj for r in range(3)]
            return R, p
        s, c1 = torch.sin(qj), 1.0 - torch.cos(qj)
        R = [mt.A0[j, r, c, 0] + s * mt.A1[j, r, c, 0] + c1 * mt.A2[j, r, c, 0] for r in range(3) for c in range(3)]
        return R, [mt.p_tree[j, r, 0] for r in range(3)]

    def inertia(self, b: int) -> tuple[Sym, Mat, Sym]:
        """Body ``b``'s spatial inertia about its origin, body frame: ``[[m 1, -[h]], [[h], I]]``."""
        mt = self.mt
        m, h, I = mt.body_mass[b], mt.body_h[b], mt.body_I[b]
        zero = torch.zeros_like(m)
        A = [m, zero, zero, m, zero, m]
        Bm = [zero, h[2], -h[1], -h[2], zero, h[0], h[1], -h[0], zero]
        return A, Bm, [I[0, 0], I[0, 1], I[0, 2], I[1, 1], I[1, 2], I[2, 2]]

    def passive(self, qT: Tensor, vT: Tensor) -> list[tuple[int, Tensor]]:
        """``(dof, force)`` of the joint damping and springs acting on each joint."""
        mt, nf = self.mt, self.nfree
        out = []
        for j in range(self.model.nj):
            out.append((6 * nf + j, -mt.damping[j] * vT[6 * nf + j] - mt.stiffness[j] * (qT[7 * nf + j] - mt.rest[j])))
        return out


    def external(self, kin: list[tuple], fT: Tensor) -> list[tuple[Vec, Vec] | None]:
        """Per body, the sum of the external link forces ``fT (n_links * 6, B)`` (force; torque
        about the link origin, world axes) as a force at the body origin in body axes (``None``
        for a body without any)."""
        model, mt = self.model, self.mt
        Rw: list[Mat] = []
        for b, (R, _, _, _, _) in enumerate(kin):
            par = self.parent[b]
            Rw.append(R if par < 0 else _mat_mul(Rw[par], R))
        out: list[tuple[Vec, Vec] | None] = [None] * model.nb
        for link, b in enumerate(model.link_body):
            if b < 0:
                continue
            f = _mtv(Rw[b], [fT[6 * link + i] for i in range(3)])
            t = _mtv(Rw[b], [fT[6 * link + 3 + i] for i in range(3)])
            t = _add(t, _cross([mt.link_p[link, i] for i in range(3)], f))
            out[b] = (f, t) if out[b] is None else (_add(out[b][0], f), _add(out[b][1], t))
        return out


def _mat_mul(A: Mat, B: Mat) -> Mat:
    return [A[3 * i] * B[j] + A[3 * i + 1] * B[3 + j] + A[3 * i + 2] * B[6 + j] for i in range(3) for j in range(3)]


def _stack(values: Sequence[Tensor], like: Tensor) -> Tensor:
    """Stack lanes into ``(n, B)``; a value that does not depend on the state (a 0-d constant, e.g.
    a leaf body's own inertia in the mass matrix) is broadcast to a lane."""
    return torch.stack([x if x.dim() else x.expand_as(like) for x in values])


def _quat_matrix(quat: list[Tensor]) -> Mat:
    """Rotation of a quaternion ``(x, y, z, w)``, normalised first (as the batch-last kinematics)."""
    x, y, z, w = quat
    inv = torch.rsqrt(x * x + y * y + z * z + w * w)
    x, y, z, w = x * inv, y * inv, z * inv, w * inv
    return [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
            2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
            2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)]


def _joint_motion(prismatic: bool, axis: Vec, s) -> tuple[Vec | None, Vec | None]:
    """``S s`` as ``(linear, angular)``, ``None`` for the part that is zero."""
    return (_scale(axis, s), None) if prismatic else (None, _scale(axis, s))


def _add_opt(a: Vec, b: Vec | None) -> Vec:
    return a if b is None else _add(a, b)


def _bias_acc(vl: Vec, va: Vec, prismatic: bool, axis: Vec, qd) -> tuple[Vec, Vec | None]:
    """``v x (S qd)``: the acceleration of a joint's motion carried by its moving body."""
    sl, sa = _joint_motion(prismatic, axis, qd)
    if prismatic:
        return _cross(va, sl), None
    return _cross(vl, sa), _cross(va, sa)


def _velocities(tree: _Tree, qT: Tensor, vT: Tensor) -> list[tuple]:
    """Per body: ``(R, p, vl, va, c)`` with ``c`` the bias acceleration (``None`` where zero)."""
    out: list[tuple] = []
    for b in range(tree.model.nb):
        R, p = tree.placement(b, qT)
        if tree.nfree and b == 0:
            out.append((R, p, [vT[0], vT[1], vT[2]], [vT[3], vT[4], vT[5]], None))
            continue
        d, prismatic, axis = tree.joint(b)
        sl, sa = _joint_motion(prismatic, axis, vT[d])
        par = tree.parent[b]
        if par < 0:  # hangs from the world: v = S qd, and v x S qd = 0
            zero = torch.zeros_like(vT[d])
            out.append((R, p, sl or [zero] * 3, sa or [zero] * 3, None))
            continue
        _, _, pvl, pva, _ = out[par]
        vl, va = _motion_to_child(R, p, pvl, pva)
        c = _bias_acc(vl, va, prismatic, axis, vT[d])
        out.append((R, p, _add_opt(vl, sl), _add_opt(va, sa), c))
    return out


# ---------------------------------------------------------------- RNEA
def rnea_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor, aT: Tensor | None,
               passive: bool, fT: Tensor | None = None) -> Tensor:
    """Inverse dynamics: ``qT (nq, B), vT (nv, B), aT (nv, B) -> tau (nv, B)`` (``aT=None``: zero);
    ``fT (n_links * 6, B)``: external link forces as in :func:`~diffmech.dynamics.rnea.rnea`.

    Same result as :func:`~diffmech.dynamics.rnea.rnea_bl`.
    """
    return _stack(_rnea_values(model, mt, qT, vT, aT, passive, fT), vT[0])


def _rnea_values(model: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor, aT: Tensor | None, passive: bool,
                 fT: Tensor | None = None) -> list:
    """:func:`rnea_lanes` as a list of ``nv`` lanes."""
    tree = _Tree(model, mt)
    kin = _velocities(tree, qT, vT)
    ext = tree.external(kin, fT) if fT is not None else [None] * model.nb
    acc: list[tuple[Vec, Vec]] = []
    forces: list[list[Vec]] = []
    for b, (R, p, vl, va, c) in enumerate(kin):
        par = tree.parent[b]
        if tree.nfree and b == 0:
            al, aa = _mtv(R, tree.ag), [torch.zeros_like(qT[0])] * 3
            if aT is not None:
                al, aa = _add(al, [aT[0], aT[1], aT[2]]), [aT[3], aT[4], aT[5]]
        else:
            d, prismatic, axis = tree.joint(b)
            if par < 0:
                al, aa = _mtv(R, tree.ag), [torch.zeros_like(qT[0])] * 3
            else:
                al, aa = _motion_to_child(R, p, *acc[par])
            if c is not None:
                al, aa = _add(al, c[0]), _add_opt(aa, c[1])
            if aT is not None:
                sl, sa = _joint_motion(prismatic, axis, aT[d])
                al, aa = _add_opt(al, sl), _add_opt(aa, sa)
        acc.append((al, aa))
        I6 = tree.inertia(b)
        fl, fa = _sym6_apply(I6, al, aa)
        hl, ha = _sym6_apply(I6, vl, va)
        bl, ba = _force_cross(vl, va, hl, ha)
        fb = [_add(fl, bl), _add(fa, ba)]
        if ext[b] is not None:
            fb = [_sub(fb[0], ext[b][0]), _sub(fb[1], ext[b][1])]
        forces.append(fb)
    tau: list[Tensor] = [None] * model.nv  # type: ignore[list-item]
    for b in reversed(range(model.nb)):
        fl, fa = forces[b]
        par = tree.parent[b]
        if tree.nfree and b == 0:
            tau[0:6] = [*fl, *fa]
            continue
        d, prismatic, axis = tree.joint(b)
        tau[d] = _dot(axis, fl if prismatic else fa)
        if par >= 0:
            R, p = kin[b][0], kin[b][1]
            gl, ga = _force_to_parent(R, p, fl, fa)
            forces[par] = [_add(forces[par][0], gl), _add(forces[par][1], ga)]
    if passive:
        for d, f in tree.passive(qT, vT):
            tau[d] = tau[d] - f
    return tau


# ---------------------------------------------------------------- ABA
def _sym6_minus_outer(I6: tuple[Sym, Mat, Sym], Ul: Vec, Ua: Vec, Dinv) -> tuple[Sym, Mat, Sym]:
    """``I - U U^T / D`` for ``U = (Ul; Ua)``."""
    A, Bm, C = I6
    sl = _scale(Ul, Dinv)
    sa = _scale(Ua, Dinv)
    An = [A[k] - Ul[i] * sl[j] for k, (i, j) in enumerate(_UPPER)]
    Bn = [Bm[3 * i + j] - Ul[i] * sa[j] for i in range(3) for j in range(3)]
    Cn = [C[k] - Ua[i] * sa[j] for k, (i, j) in enumerate(_UPPER)]
    return An, Bn, Cn


def _sym6_add(X: tuple[Sym, Mat, Sym], Y: tuple[Sym, Mat, Sym]) -> tuple[Sym, Mat, Sym]:
    return _add(X[0], Y[0]), _add(X[1], Y[1]), _add(X[2], Y[2])


def _joint_columns(I6: tuple[Sym, Mat, Sym], prismatic: bool, axis: Vec) -> tuple[Vec, Vec]:
    """``U = I S`` for the joint's motion subspace ``S``."""
    A, Bm, C = I6
    if prismatic:  # S = (axis; 0)
        return _sym_mv(A, axis), _mtv(Bm, axis)
    return _mv(Bm, axis), _sym_mv(C, axis)  # S = (0; axis)


def _sym6_entries(I6: tuple[Sym, Mat, Sym]) -> list[list[Tensor]]:
    """The full 6x6 matrix ``[[A, Bm], [Bm^T, C]]`` as rows of lanes."""
    A, Bm, C = I6
    M: list[list] = [[None] * 6 for _ in range(6)]
    for i in range(3):
        for j in range(3):
            M[i][j] = A[_SYM[i][j]]
            M[3 + i][3 + j] = C[_SYM[i][j]]
            M[i][3 + j] = M[3 + j][i] = Bm[3 * i + j]
    return M


def _solve_spd6(I6: tuple[Sym, Mat, Sym], rhs: list[Tensor]) -> list[Tensor]:
    """``x`` with ``[[A, Bm], [Bm^T, C]] x = rhs`` (symmetric positive definite) by LDL^T."""
    M = _sym6_entries(I6)
    L = [[None] * 6 for _ in range(6)]
    Dg: list[Tensor] = []
    for j in range(6):
        d = M[j][j]
        for k in range(j):
            d = d - L[j][k] * L[j][k] * Dg[k]
        Dg.append(d)
        inv = 1.0 / d
        for i in range(j + 1, 6):
            s = M[i][j]
            for k in range(j):
                s = s - L[i][k] * L[j][k] * Dg[k]
            L[i][j] = s * inv
    y: list[Tensor] = []
    for i in range(6):
        s = rhs[i]
        for k in range(i):
            s = s - L[i][k] * y[k]
        y.append(s)
    x: list[Tensor] = [None] * 6  # type: ignore[list-item]
    for i in reversed(range(6)):
        s = y[i] / Dg[i]
        for k in range(i + 1, 6):
            s = s - L[k][i] * x[k]
        x[i] = s
    return x


def aba_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor, tauT: Tensor, passive: bool,
              fT: Tensor | None = None) -> Tensor:
    """Forward dynamics by ABA: ``qT (nq, B), vT (nv, B), tauT (nv, B) -> qdd (nv, B)``;
    ``fT (n_links * 6, B)``: external link forces as in :func:`~diffmech.dynamics.aba.forward_dynamics`.

    Same result as :func:`~diffmech.dynamics.aba.aba_flat`.
    """
    tree = _Tree(model, mt)
    kin = _velocities(tree, qT, vT)
    ext = tree.external(kin, fT) if fT is not None else [None] * model.nb
    tau = [tauT[d] for d in range(model.nv)]
    if passive:
        for d, f in tree.passive(qT, vT):
            tau[d] = tau[d] + f
    IA, pA = [], []
    for b, (_, _, vl, va, _) in enumerate(kin):
        I6 = tree.inertia(b)
        hl, ha = _sym6_apply(I6, vl, va)
        IA.append(I6)
        pb = list(_force_cross(vl, va, hl, ha))
        if ext[b] is not None:
            pb = [_sub(pb[0], ext[b][0]), _sub(pb[1], ext[b][1])]
        pA.append(pb)
    # Leaves to root: articulated inertias and bias forces, and what the last sweep needs per joint.
    joint: list[tuple | None] = [None] * model.nb
    for b in reversed(range(model.nb)):
        if tree.nfree and b == 0:
            continue
        R, p, _, _, c = kin[b]
        d, prismatic, axis = tree.joint(b)
        Ul, Ua = _joint_columns(IA[b], prismatic, axis)
        D = _dot(axis, Ul if prismatic else Ua)
        Dinv = 1.0 / D
        u = tau[d] - _dot(axis, pA[b][0] if prismatic else pA[b][1])
        joint[b] = (d, prismatic, axis, Ul, Ua, Dinv, u)
        par = tree.parent[b]
        if par < 0:
            continue
        Ia = _sym6_minus_outer(IA[b], Ul, Ua, Dinv)
        uD = u * Dinv
        pl, pa = pA[b]
        if c is not None:  # a prismatic joint's bias acceleration has no angular part
            cl, ca = _sym6_apply(Ia, c[0], c[1] if c[1] is not None else [torch.zeros_like(u)] * 3)
            pl, pa = _add(pl, cl), _add(pa, ca)
        pl, pa = _add(pl, _scale(Ul, uD)), _add(pa, _scale(Ua, uD))
        IA[par] = _sym6_add(IA[par], _sym6_to_parent(R, p, Ia))
        gl, ga = _force_to_parent(R, p, pl, pa)
        pA[par] = [_add(pA[par][0], gl), _add(pA[par][1], ga)]
    # Root to leaves: accelerations.
    qdd: list[Tensor] = [None] * model.nv  # type: ignore[list-item]
    acc: list[tuple[Vec, Vec]] = []
    for b, (R, p, _, _, c) in enumerate(kin):
        par = tree.parent[b]
        if tree.nfree and b == 0:
            a0 = _solve_spd6(IA[0], [tau[k] - f for k, f in zip(range(6), [*pA[0][0], *pA[0][1]])])
            grav = _mtv(R, tree.ag)
            qdd[0:6] = [a0[0] - grav[0], a0[1] - grav[1], a0[2] - grav[2], a0[3], a0[4], a0[5]]
            acc.append((a0[0:3], a0[3:6]))
            continue
        d, prismatic, axis, Ul, Ua, Dinv, u = joint[b]
        if par < 0:
            al, aa = _mtv(R, tree.ag), [torch.zeros_like(u)] * 3
        else:
            al, aa = _motion_to_child(R, p, *acc[par])
        if c is not None:
            al, aa = _add(al, c[0]), _add_opt(aa, c[1])
        qd = (u - _dot(Ul, al) - _dot(Ua, aa)) * Dinv
        qdd[d] = qd
        sl, sa = _joint_motion(prismatic, axis, qd)
        acc.append((_add_opt(al, sl), _add_opt(aa, sa)))
    return _stack(qdd, tauT[0])


# ---------------------------------------------------------------- CRBA
def crba_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor) -> Tensor:
    """Mass matrix by CRBA: ``qT (nq, B) -> M (nv, nv, B)``."""
    M = _crba_entries(model, mt, qT)
    return torch.stack([_stack(row, qT[0]) for row in M])


def _crba_entries(model: KinematicTree, mt: ModelTensors, qT: Tensor) -> list[list]:
    """:func:`crba_lanes` as ``nv`` rows of ``nv`` lanes (exact zeros where no path joins two DoFs)."""
    tree = _Tree(model, mt)
    place = [tree.placement(b, qT) for b in range(model.nb)]
    Ic = [tree.inertia(b) for b in range(model.nb)]
    for b in reversed(range(model.nb)):
        par = tree.parent[b]
        if par >= 0:
            Ic[par] = _sym6_add(Ic[par], _sym6_to_parent(*place[b], Ic[b]))
    zero = torch.zeros_like(qT[0])
    M = [[zero] * model.nv for _ in range(model.nv)]
    for b in range(model.nb):
        if tree.nfree and b == 0:  # the base block is the composite inertia of the whole robot
            for i, row in enumerate(_sym6_entries(Ic[0])):
                M[i][:6] = row
            continue
        d, prismatic, axis = tree.joint(b)
        fl, fa = _joint_columns(Ic[b], prismatic, axis)
        M[d][d] = _dot(axis, fl if prismatic else fa)
        a = b
        while tree.parent[a] >= 0:  # carry the column's force up to each ancestor joint
            fl, fa = _force_to_parent(*place[a], fl, fa)
            a = tree.parent[a]
            if tree.nfree and a == 0:
                col = [*fl, *fa]
                for k in range(6):
                    M[k][d] = M[d][k] = col[k]
                continue
            e, pe, ae = tree.joint(a)
            M[e][d] = M[d][e] = _dot(ae, fl if pe else fa)
    return M


# ---------------------------------------------------------------- kinematics
def kinematics_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor) -> Tensor:
    """World poses of every link and world-frame motion subspaces: ``qT (nq, B) -> (16 n_links + 6 nv, B)``.

    Rows ``16 l .. 16 l + 15``: link ``l``'s homogeneous transform ``T_world_link``, row-major (the
    last row the constants ``0 0 0 1``); then, per DoF ``d``, rows ``16 n_links + 6 d ..``: its column
    of the spatial velocity at the world origin, world axes, ``(linear; angular)`` -- the batch-first
    :func:`~diffmech.dynamics.kinematics.link_placements` and ``TreeState.S`` of the torch code.
    """
    tree = _Tree(model, mt)
    zero = torch.zeros_like(qT[0])
    one = zero + 1.0
    Rw, pw = _world_frames(tree, qT)
    out: list[Tensor] = []
    for link, b in enumerate(model.link_body):
        Rl = [mt.link_R[link, r, c] for r in range(3) for c in range(3)]
        pl = [mt.link_p[link, r] for r in range(3)]
        if b >= 0:
            Rl, pl = _mat_mul(Rw[b], Rl), _add(pw[b], _mv(Rw[b], pl))
        for r in range(3):
            out.extend([Rl[3 * r], Rl[3 * r + 1], Rl[3 * r + 2], pl[r]])
        out.extend([zero, zero, zero, one])
    for lin, ang in _world_columns(tree, Rw, pw, zero):
        out.extend([*lin, *ang])
    return _stack(out, zero)


def _world_frames(tree: _Tree, qT: Tensor) -> tuple[list[Mat], list[Vec]]:
    """Every body's rotation and origin in the world."""
    Rw: list[Mat] = []
    pw: list[Vec] = []
    for b in range(tree.model.nb):
        R, p = tree.placement(b, qT)
        par = tree.parent[b]
        if par < 0:
            Rw.append(R)
            pw.append(p)
        else:
            Rw.append(_mat_mul(Rw[par], R))
            pw.append(_add(pw[par], _mv(Rw[par], p)))
    return Rw, pw


def _world_columns(tree: _Tree, Rw: list[Mat], pw: list[Vec], zero) -> list[tuple[Vec, Vec]]:
    """Per DoF, its motion subspace column as the spatial velocity at the world origin, world axes."""
    cols: list[tuple[Vec, Vec]] = []
    if tree.nfree:  # the base frame's axes: a linear DoF moves along one, an angular one turns about it
        for i in range(3):
            cols.append((_col(Rw[0], i), [zero] * 3))
        for i in range(3):
            a = _col(Rw[0], i)
            cols.append((_cross(pw[0], a), a))
    for b in range(tree.nfree, tree.model.nb):
        _, prismatic, axis = tree.joint(b)
        a = _mv(Rw[b], axis)
        # a revolute axis through p with direction a moves the world origin with velocity p x a
        cols.append((a, [zero] * 3) if prismatic else (_cross(pw[b], a), a))
    return cols


# ---------------------------------------------------------------- a contact step's position update
# The free-flyer coefficients s(t) = sin(t/2)/t and cos(t/2) of a rotation by t = |w| as Taylor series in
# t^2 (to t^14: error below 1e-16 for t^2 < 1, the torch code's own threshold; larger rotations are
# the caller's to route to the torch code, which switches to closed forms).
SERIES_BELOW = 1.0
_S_SERIES = [(-1) ** n / (2 ** (2 * n + 1) * math.factorial(2 * n + 1)) for n in range(8)]
_CW_SERIES = [(-1) ** n / (2 ** (2 * n) * math.factorial(2 * n)) for n in range(8)]


def _horner(coef: list[float], x):
    out = coef[-1] * x + coef[-2]
    for a in reversed(coef[:-2]):
        out = out * x + a
    return out


def advance_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor, dtT: Tensor) -> Tensor:
    """A floating base's position update of the contact step: ``qT (nq, B), vT (nv, B), dtT (1, B) ->
    (nq + nv, B)``, the new configuration and the velocity re-expressed in the new base frame.

    The base translates by ``dt R_k v_lin`` in world axes, turns by ``dt w`` (body frame, the
    quaternion product with ``e(dt w)``, normalised), the joints move by ``dt v_j``, and the linear
    velocity (held in the base frame of step ``k``) is expressed in the new one: ``R_1^T R_k v_lin``
    (see :func:`diffmech.sim.contact_step._advance`, whose torch code this equals to rounding).
    Rotations per step below ``t^2 < SERIES_BELOW`` only (the series).
    """
    dt = dtT[0]
    x, y, z, w = (qT[3 + i] for i in range(4))
    Rk = _quat_matrix([x, y, z, w])
    vl = [vT[0], vT[1], vT[2]]
    vw = _mv(Rk, vl)
    rot = [vT[3] * dt, vT[4] * dt, vT[5] * dt]
    t2 = _dot(rot, rot)
    s, cw = _horner(_S_SERIES, t2), _horner(_CW_SERIES, t2)
    ev = _scale(rot, s)
    # quat * e (Hamilton, (x, y, z, w)): (w ev + cw qv + qv x ev, w cw - qv . ev)
    qv = [x, y, z]
    mv = _add(_add(_scale(ev, w), _scale(qv, cw)), _cross(qv, ev))
    mw = w * cw - _dot(qv, ev)
    inv = torch.rsqrt(_dot(mv, mv) + mw * mw)
    quat1 = [mv[0] * inv, mv[1] * inv, mv[2] * inv, mw * inv]
    R1 = _quat_matrix(quat1)
    out = [qT[i] + dt * vw[i] for i in range(3)] + quat1
    out += [qT[7 + j] + dt * vT[6 + j] for j in range(model.nq - 7)]
    out += _mtv(R1, vw) + [vT[3 + i] for i in range(model.nv - 3)]
    return _stack(out, dt)


# ---------------------------------------------------------------- a contact step before its solve: balls on the ground
def _cholesky(M: list[list]) -> list[list]:
    """Lower Cholesky factor of a symmetric positive definite matrix of lanes (exact zeros kept:
    the tracer folds the products with them, so a tree's sparsity costs nothing)."""
    n = len(M)
    L = [[0.0] * n for _ in range(n)]
    for j in range(n):
        s = M[j][j]
        for k in range(j):
            s = s - L[j][k] * L[j][k]
        L[j][j] = torch.sqrt(s)
        inv = 1.0 / L[j][j]
        for i in range(j + 1, n):
            s = M[i][j]
            for k in range(j):
                s = s - L[i][k] * L[j][k]
            L[i][j] = s * inv
    return L


def _cholesky_solve(L: list[list], f: list) -> list:
    """``(L L^T)^-1 f`` by forward and back substitution."""
    n = len(L)
    y = list(f)
    for i in range(n):
        for k in range(i):
            y[i] = y[i] - L[i][k] * y[k]
        y[i] = y[i] / L[i][i]
    for i in reversed(range(n)):
        for k in range(i + 1, n):
            y[i] = y[i] - L[k][i] * y[k]
        y[i] = y[i] / L[i][i]
    return y


def ground_step_lanes(model: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor, tauT: Tensor,
                      driveT: Tensor | None, ballT: Tensor, dtT: Tensor, links: Sequence[int]) -> Tensor:
    """What a contact step of one robot on the ground needs before its solve, in one program:
    ``qT (nq, B), vT (nv, B), tauT (nv, B)``, drives ``driveT (4 nd, B)`` (stiffness, damping, target,
    armature of the last ``nd`` joints; ``None``: none), balls ``ballT (4 nb, B)`` (per ball its centre
    in its link's frame and its radius, m) on the links ``links`` (indices into the link names), ``dtT
    (1, B)`` -> rows ``(nv + nv nv + nb + 3 nb nv, B)``:

    * the free velocity ``v + dt M^-1 (tau - h(q, v) + drive forces)``, the drives linearly implicit
      and the floating base's translation rate in world axes at step ``k`` (the contact step's
      stage 1, :mod:`diffmech.sim.contact_step`);
    * the lower Cholesky factor of ``M`` with the drives' ``armature + dt kd + dt^2 kp`` added to
      their diagonal, row-major;
    * each ball's gap to the plane ``z = 0``, ``phi = z - r`` (m);
    * each ball's contact rows (normal ``+z``, tangents ``+y``, ``-x``): the velocity of the contact
      point ``(x, y, (z - r) / 2)`` -- midway through the penetration -- per unit of each DoF.
    """
    tree = _Tree(model, mt)
    nv, nq = model.nv, model.nq
    dt = dtT[0]
    zero = torch.zeros_like(qT[0])
    M = _crba_entries(model, mt, qT)
    h = _rnea_values(model, mt, qT, vT, None, True)
    f = [tauT[i] - h[i] for i in range(nv)]
    nd = 0 if driveT is None else driveT.shape[0] // 4
    for j in range(nd):
        d, kp, kd, ref, arm = nv - nd + j, driveT[j], driveT[nd + j], driveT[2 * nd + j], driveT[3 * nd + j]
        f[d] = f[d] + (kp * (ref - qT[nq - nd + j]) - (kd + dt * kp) * vT[d])
        M[d][d] = M[d][d] + (arm + dt * kd + dt * dt * kp)
    L = _cholesky(M)
    acc = _cholesky_solve(L, f)
    if tree.nfree:  # the base's translation rate in world axes at step k (see contact_step._advance)
        wv = _cross([vT[3], vT[4], vT[5]], [vT[0], vT[1], vT[2]])
        acc[:3] = _add(acc[:3], wv)
    out = [vT[i] + dt * acc[i] for i in range(nv)]
    out += [L[i][j] if j <= i else zero for i in range(nv) for j in range(nv)]
    Rw, pw = _world_frames(tree, qT)
    cols = _world_columns(tree, Rw, pw, zero)
    rows, gaps = [], []
    for k, link in enumerate(links):
        o = [ballT[4 * k + i] for i in range(3)]
        r = ballT[4 * k + 3]
        Rl = [mt.link_R[link, i, j] for i in range(3) for j in range(3)]
        c = _add([mt.link_p[link, i] for i in range(3)], _mv(Rl, o))
        b = model.link_body[link]
        dofs: list[int] = []
        if b >= 0:
            c = _add(pw[b], _mv(Rw[b], c))
            a = b
            while a >= 0:  # the DoFs that move the link: its body's and its ancestors'
                dofs += list(range(6)) if tree.nfree and a == 0 else [tree.joint(a)[0]]
                a = tree.parent[a]
        phi = c[2] - r
        x = [c[0], c[1], 0.5 * phi]
        gaps.append(phi)
        nrm, t1, t2 = [zero] * nv, [zero] * nv, [zero] * nv
        for d in dofs:
            lin, ang = cols[d]
            u = _add(lin, _cross(ang, x))
            nrm[d], t1[d], t2[d] = u[2], u[1], -u[0]
        rows += nrm + t1 + t2
    return _stack(out + gaps + rows, dt)
