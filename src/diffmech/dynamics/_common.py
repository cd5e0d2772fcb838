"""Input checking and the world-frame kinematic pass shared by every algorithm.

All algorithms work in the world frame with spatial vectors at the world origin (Featherstone's
"Plucker coordinates at the origin"): each joint contributes a world-frame motion subspace column
``S_d``, and a body's velocity is the sum of the columns of the joints above it. Sums over
ancestors or over subtrees then become one matrix product with a constant 0/1 mask, so RNEA and
CRBA are a handful of batched operations over all bodies at once; only the pose composition (and
ABA) walk the tree, level by level, processing bodies of one depth together.

Internally tensors are *batch-last* ("structure of arrays"): ``(n_bodies, 6, B)``,
``(n_bodies, 3, 3, B)``. Every small 3-vector / 3x3 / 6x6 product is then an elementwise
operation over long contiguous rows of ``B`` values, and every ancestor/subtree sum is one GEMM,
instead of many tiny per-sample matrix products. Public functions take and return batch-first
tensors; the transposes happen once at the boundary.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
import torch.utils.weak
from torch import Tensor

from ..errors import ShapeError
from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree, pair_gather


def bind(robot: RobotParameters, like: Tensor) -> tuple[KinematicTree, ModelTensors]:
    """The tree and the parameter tensors of ``robot`` in ``like``'s dtype and device."""
    return robot.tree, robot.model_tensors(like.dtype, like.device)


# ---------------------------------------------------------------- generalised <-> joint space (mimic joints)
def joint_q(tree: KinematicTree, q: Tensor) -> Tensor:
    """Generalised ``q (B, nq)`` -> joint-space ``(B, tree.nq)`` (identity without mimic joints)."""
    if tree.coords is None:
        return q
    tb = tree.tables(q.dtype, q.device)
    return torch.addcmul(tb.q_offset, q[:, tb.q_src], tb.q_scale)


def joint_v(tree: KinematicTree, v: Tensor) -> Tensor:
    """Generalised ``v`` (or ``a``) ``(B, nv)`` -> joint space ``(B, tree.nv)``."""
    if tree.coords is None:
        return v
    tb = tree.tables(v.dtype, v.device)
    return v[:, tb.v_src] * tb.v_scale


def generalized_force(tree: KinematicTree, tau: Tensor, dim: int = -1) -> Tensor:
    """Joint-space forces ``(..., tree.nv)`` (along ``dim``) -> generalised ``(..., nv)``: ``G^T tau``."""
    if tree.coords is None:
        return tau
    tb = tree.tables(tau.dtype, tau.device)
    dim = dim % tau.dim()
    shape = [1] * tau.dim()
    shape[dim] = -1
    out = tau.new_zeros(*tau.shape[:dim], tree.coords.nv, *tau.shape[dim + 1:])
    return out.index_add(dim, tb.v_src, tau * tb.v_scale.view(shape))


def generalized_mass(tree: KinematicTree, M: Tensor) -> Tensor:
    """Joint-space ``M (B, tree.nv, tree.nv)`` -> generalised ``G^T M G (B, nv, nv)``."""
    if tree.coords is None:
        return M
    return generalized_force(tree, generalized_force(tree, M, -1), -2)


# float16 and bfloat16 have no LU or Cholesky on the CPU, and their three digits would not survive the
# cancellations of the dynamics anyway.
SUPPORTED_DTYPES = (torch.float32, torch.float64)

# Opt-in (docs/conventions.md, "Inputs"): the dynamics propagate NaN by default, because a check costs
# a host synchronisation on a GPU and, on the CPU, +60% of a native batch-1 call (the budget is 2%).
_CHECK_FINITE = [os.environ.get("DIFFMECH_CHECK_FINITE", "0") not in ("", "0")]


def check_finite_inputs(enabled: bool | None = None) -> bool:
    """Whether the dynamics and kinematics functions raise :class:`~diffmech.errors.ShapeError` naming
    the argument for a NaN or infinite input (default off, or ``$DIFFMECH_CHECK_FINITE=1``); with
    ``enabled`` set it first. Off, non-finite inputs propagate to non-finite outputs."""
    if enabled is not None:
        _CHECK_FINITE[0] = bool(enabled)
    return _CHECK_FINITE[0]


def _raise_non_finite(model: RobotParameters, named: list, flat: list[Tensor]) -> None:
    """Raise for the first of ``flat`` (the tensors of ``named``, in order) holding a NaN or inf."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return  # no data-dependent branches in a graph
    names = [n for n, t, _ in (x for x in named if x is not None) if t is not None]
    for name, t in zip(names, flat):
        if math.isfinite(float(t.detach().sum())):  # one reduction; a finite sum that overflows looks again
            continue
        ok = torch.isfinite(t.detach())
        if not bool(ok.all()):
            b, i = (int(x) for x in (~ok.reshape(ok.shape[0], -1)).nonzero()[0])
            raise ShapeError(f"{model.name}: '{name}' is not finite: {float(t.detach().reshape(t.shape[0], -1)[b, i])} "
                             f"at batch element {b}, entry {i} (diffmech.dynamics.check_finite_inputs is on)")


def as_state(model: RobotParameters, named: list) -> tuple[list[Tensor], tuple[int, ...]]:
    """Validate and broadcast state tensors, then flatten their batch dimensions.

    Args:
        model: the robot (its name, dtype and device; shapes come with ``named``).
        named: ``(name, tensor, trailing)`` triples, ``trailing`` the expected last dimension
            (an int) or trailing shape (a tuple); ``None`` entries are skipped.

    Returns:
        The tensors reshaped to ``(B, *trailing)`` in one dtype/device, and the common batch shape.
    """
    fast = _as_state_flat(model, named)
    if fast is not None:
        if _CHECK_FINITE[0]:
            _raise_non_finite(model, named, fast[0])
        return fast
    named = [x for x in named if x is not None]
    tensors = [(n, t, (k,) if isinstance(k, int) else tuple(k)) for n, t, k in named if t is not None]
    ref = next((t for _, t, _ in tensors if isinstance(t, Tensor)), None)
    dtype = ref.dtype if ref is not None else model.dtype
    device = ref.device if ref is not None else model.device
    out = []
    for name, t, k in tensors:
        if not isinstance(t, Tensor):
            try:
                t = torch.as_tensor(t, dtype=dtype, device=device)
            except (TypeError, ValueError, RuntimeError) as e:
                raise ShapeError(f"{model.name}: '{name}' cannot be converted to a tensor: {e}") from None
        if not t.dtype.is_floating_point:
            raise ShapeError(f"{model.name}: '{name}' must be a floating-point tensor, got dtype {t.dtype}")
        if t.dtype not in SUPPORTED_DTYPES:
            raise ShapeError(f"{model.name}: '{name}' has dtype {t.dtype}; diffmech computes in float32 or float64 "
                             f"(convert with .float() or .double())")
        if t.dtype != dtype:
            raise ShapeError(
                f"{model.name}: '{name}' has dtype {t.dtype} but '{tensors[0][0]}' has {dtype}; "
                "pass all state tensors in one dtype"
            )
        if t.device != device:
            raise ShapeError(
                f"{model.name}: '{name}' is on {t.device} but '{tensors[0][0]}' is on {device}; "
                "pass all state tensors on one device"
            )
        if t.dim() < len(k) or tuple(t.shape[t.dim() - len(k):]) != k:
            want = ", ".join(map(str, k))
            raise ShapeError(f"{model.name}: '{name}' must have shape (..., {want}), got {tuple(t.shape)}")
        out.append((name, t, k))
    if device.type != model.device.type:
        raise ShapeError(
            f"{model.name}: inputs are on {device} but the model is on {model.device}; call model.to({device.type!r})"
        )
    shapes = [t.shape[: t.dim() - len(k)] for _, t, k in out]
    try:
        batch = shapes[0] if all(s == shapes[0] for s in shapes) else torch.broadcast_shapes(*shapes)
    except RuntimeError:
        shapes = ", ".join(f"{n} {tuple(t.shape)}" for n, t, _ in out)
        raise ShapeError(f"{model.name}: batch dimensions do not broadcast: {shapes}") from None
    # Already-flat inputs pass through untouched (at batch 1 every skipped operator counts).
    flat = [t if len(batch) == 1 and t.shape == (*batch, *k) else t.expand(*batch, *k).reshape(math.prod(batch), *k)
            for _, t, k in out]  # math.prod, not -1: a static model's (..., 0) states have no elements
    if _CHECK_FINITE[0]:
        _raise_non_finite(model, named, flat)
    return flat, tuple(batch)


def _as_state_flat(model: RobotParameters, named: list) -> tuple[list[Tensor], tuple[int, ...]] | None:
    """:func:`as_state` for the common call -- floating-point tensors already flat ``(B, *trailing)``,
    one batch size, dtype and device type (the model's) -- in a few attribute reads; ``None``
    otherwise (then the general path checks everything and says what is wrong)."""
    out = []
    ref = None
    for entry in named:
        if entry is None:
            continue
        _, t, k = entry
        if type(t) is not Tensor:
            return None
        if ref is None:
            ref = t
            if (t.dtype is not torch.float64 and t.dtype is not torch.float32) or t.device.type != model.device.type:
                return None
        elif t.dtype is not ref.dtype or t.device != ref.device:
            return None
        shape = t.shape
        if isinstance(k, int):
            if len(shape) != 2 or shape[1] != k or shape[0] != ref.shape[0]:
                return None
        elif shape[1:] != k or shape[0] != ref.shape[0] or len(shape) != 1 + len(k):
            return None
        out.append(t)
    return (out, (ref.shape[0],)) if ref is not None else None


class TreeState(NamedTuple):
    """World-frame kinematic quantities for a flat batch ``B`` (batch-last)."""

    R: Tensor  # (nb, 3, 3, B) body orientations in the world
    p: Tensor  # (nb, 3, B) body origins in the world
    S: Tensor  # (nv, 6, B) motion subspace columns, world frame at the origin
    mt: ModelTensors


# ---------------------------------------------------------------- batch-last small algebra
# Up to this batch size the per-operator cost dominates, and a few batched matrix products
# (batch-first) beat the many elementwise operations over rows of B values that large batches want.
SMALL_BATCH = 8


def small_batch(x: Tensor) -> bool:
    """Whether the batch-last tensor ``x (..., B)`` takes the small-batch code paths."""
    # Compiled code pays per flop, not per operator: it keeps the elementwise formulation (whose
    # compiled backward is also the one the tests cover at every batch size).
    return x.shape[-1] <= SMALL_BATCH and not torch.compiler.is_compiling()


def mv(M: Tensor, x: Tensor) -> Tensor:
    """``M x`` for ``M (..., m, n, B)``, ``x (..., n, B)`` -> ``(..., m, B)``."""
    if M.shape[-1] == 1 and x.shape[-1] == 1 and not torch.compiler.is_compiling():  # x: one column vector
        return M[..., 0] @ x
    return (M * x.unsqueeze(-3)).sum(-2)


def mm(A: Tensor, C: Tensor) -> Tensor:
    """``A C`` for ``A (..., m, k, B)``, ``C (..., k, n, B)`` -> ``(..., m, n, B)``."""
    return (A.unsqueeze(-2) * C.unsqueeze(-4)).sum(-3)


def mv_small(M: Tensor, x: Tensor) -> Tensor:
    """:func:`mv` as one batched matrix product (batch-first inside), for small batches."""
    if M.shape[-1] == 1 and x.shape[-1] == 1 and not torch.compiler.is_compiling():
        return M[..., 0] @ x
    return (M.movedim(-1, -3) @ x.movedim(-1, -2)[..., None])[..., 0].movedim(-2, -1)


def cross(a: Tensor, b: Tensor) -> Tensor:
    """Cross product over the component dimension ``-2`` of ``(..., 3, B)`` tensors."""
    if max(a.shape[-1], b.shape[-1]) < 256 or max(a.numel(), b.numel()) <= 4096:
        return torch.linalg.cross(a, b, dim=-2)
    # linalg.cross strides across rows of B values; by components it is ~2x faster for long rows.
    a1, a2, a3 = a.unbind(-2)
    b1, b2, b3 = b.unbind(-2)
    return torch.stack([a2 * b3 - a3 * b2, a3 * b1 - a1 * b3, a1 * b2 - a2 * b1], dim=-2)


def motion_cross(v: Tensor, m: Tensor) -> Tensor:
    """``v x m`` for spatial motions ``(..., 6, B)`` (linear; angular)."""
    vl, va = v[..., :3, :], v[..., 3:, :]
    ml, ma = m[..., :3, :], m[..., 3:, :]
    return torch.cat([cross(va, ml) + cross(vl, ma), cross(va, ma)], dim=-2)


def force_cross(v: Tensor, f: Tensor) -> Tensor:
    """``v x* f`` for a motion and a force ``(..., 6, B)``."""
    vl, va = v[..., :3, :], v[..., 3:, :]
    fl, fa = f[..., :3, :], f[..., 3:, :]
    return torch.cat([cross(va, fl), cross(va, fa) + cross(vl, fl)], dim=-2)


class RigidInertia(NamedTuple):
    """Spatial inertia at the world origin as ``(m (nb, 1), h (nb, 3, B), I (nb, 3, 3, B))``:
    mass, first moment ``m c`` and rotational inertia about the origin.

    ``full`` is the ``(nb, 6, 6, B)`` :meth:`matrix` when the small-batch path built it up front:
    one matrix product per application then replaces a dozen elementwise operations.
    """

    m: Tensor
    h: Tensor
    I: Tensor
    full: Tensor | None = None

    def apply(self, x: Tensor) -> Tensor:
        """Momentum / force ``I x`` of a motion ``x (nb, 6, B)``."""
        if self.full is not None:
            return mv_small(self.full, x)
        xl, xa = x[..., :3, :], x[..., 3:, :]
        lin = self.m[..., None] * xl - cross(self.h, xa)
        ang = cross(self.h, xl) + mv(self.I, xa)
        return torch.cat([lin, ang], dim=-2)

    def matrix(self) -> Tensor:
        """Full ``(nb, 6, 6, B)`` matrix ``[[m 1, -[h]], [[h], I]]``."""
        if self.full is not None:
            return self.full
        hx, hy, hz = self.h.unbind(-2)
        m = self.m.expand_as(hx)
        z = torch.zeros_like(hx)
        skew_h = torch.stack([z, -hz, hy, hz, z, -hx, -hy, hx, z], dim=-2).unflatten(-2, (3, 3))
        eye_m = torch.stack([m, z, z, z, m, z, z, z, m], dim=-2).unflatten(-2, (3, 3))
        return _block(eye_m, -skew_h, skew_h, self.I)


def _block(a: Tensor, b: Tensor, c: Tensor, d: Tensor) -> Tensor:
    """``[[a, b], [c, d]]`` from four ``(..., 3, 3, B)`` blocks -> ``(..., 6, 6, B)``."""
    return torch.cat([torch.cat([a, b], dim=-2), torch.cat([c, d], dim=-2)], dim=-3)


def quat_to_matrix_bl(quat: Tensor) -> Tensor:
    """Quaternions ``(4, B)`` ``(x, y, z, w)`` -> rotations ``(3, 3, B)``.

    The quaternion is normalised first: a configuration whose quaternion drifted from unit norm
    means the same orientation, and the derivative w.r.t. the quaternion has no radial component
    (which the hand-written RNEA VJP relies on).
    """
    qn = quat / quat.norm(dim=0, keepdim=True)
    if small_batch(quat):  # the entries are fixed combinations of the products q_i q_j: 4 operators, not 40
        Q = (qn[:, None] * qn[None]).reshape(16, -1)
        return tree_sum(_quat_products(quat.dtype, quat.device), Q).unflatten(0, (3, 3))
    x, y, z, w = qn.unbind(0)
    rows = [
        1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w),
        2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w),
        2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y),
    ]
    return torch.stack(rows, 0).unflatten(0, (3, 3))


@functools.cache
def _quat_products(dtype: torch.dtype, device: torch.device) -> Tensor:
    """``(9, 16)``: the rotation matrix entries (row-major) of a unit quaternion ``(x, y, z, w)``
    from its products ``q_i q_j`` (row-major ``4 x 4``)."""
    C = torch.zeros(9, 4, 4, dtype=dtype)
    x, y, z, w = range(4)
    terms = {
        0: [(w, w, 1), (x, x, 1), (y, y, -1), (z, z, -1)], 1: [(x, y, 2), (z, w, -2)], 2: [(x, z, 2), (y, w, 2)],
        3: [(x, y, 2), (z, w, 2)], 4: [(w, w, 1), (x, x, -1), (y, y, 1), (z, z, -1)], 5: [(y, z, 2), (x, w, -2)],
        6: [(x, z, 2), (y, w, -2)], 7: [(y, z, 2), (x, w, 2)], 8: [(w, w, 1), (x, x, -1), (y, y, -1), (z, z, 1)],
    }
    for k, ts in terms.items():
        for i, j, c in ts:
            C[k, i, j] += c
    return C.reshape(9, 16).to(device)


# ---------------------------------------------------------------- tables of the local-point formulation
@dataclass(frozen=True)
class LocalTables:
    """Index tables of the local-point formulation (:mod:`._local`) on one device, in one dtype.

    Attributes:
        anc, desc: (npairs,) long, every pair of bodies with ``desc`` in the subtree of ``anc``
            (itself included); ``npairs`` their number.
        sum_anc: (nb, npairs) 0/1: ``sum_anc @ x`` sums per-pair values ``x`` over each body's
            subtree (``anc`` is the same sum as an index); ``None`` on trees where it would have more
            than ``SMALL_SUM`` entries (:func:`~._local.segment_sum` takes the index there anyway).
        jp_pair, jp_joint, jp_body: (njp,) long, the pairs whose ``anc`` is a one-DoF body: their
            row in the pairs above, the joint (``0..nj-1``) and the descendant; ``jp_sum``
            (nj, njp) 0/1 sums over each joint's pairs (``None`` as ``sum_anc``).
        far_d, far_e / near_d, near_e: (k,) long, the mass-matrix pairs ``(d, e)`` (``d``'s body at
            or above ``e``'s) whose DoFs move different bodies / the same body.
        crba_gather: (nv * nv,) long, per entry of the row-major mass matrix its row in the values
            ``(far + near, B)`` of the pairs above (a far pair also fills its transpose), ``far +
            near`` for the entries no pair reaches (a zero row appended to the values).
        parent: (nb,) long, each body's parent (a body hanging from the world: itself).
        levels: per ABA depth (deepest first, below a floating base), its bodies as a long tensor
            (``None`` for a single body).
        local_mask: (nv, 6, 1) keeps the rows of a world-origin motion column that it has at its
            own body's origin: the angular rows, and the linear rows of prismatic and base-linear DoFs.
        root_mask: (nj, 1, 1) ``1`` on bodies hanging from the world (fixed base), else ``0``.
        base_pairs: (nb,) long, the rows of the pairs ``(0, b)`` (floating base; else empty).
        eye3: (3, 3) identity.

    Every table has O(npairs) <= O(nb^2) entries (the 0/1 matrices: at most ``SMALL_SUM``).
    """

    anc: Tensor
    desc: Tensor
    npairs: int
    sum_anc: Tensor | None
    jp_pair: Tensor
    jp_joint: Tensor
    jp_body: Tensor
    jp_sum: Tensor | None
    far_d: Tensor
    far_e: Tensor
    near_d: Tensor
    near_e: Tensor
    crba_gather: Tensor
    parent: Tensor
    levels: tuple
    local_mask: Tensor
    root_mask: Tensor
    base_pairs: Tensor
    eye3: Tensor


def local_tables(tree: KinematicTree, dtype: torch.dtype, device: torch.device) -> LocalTables:
    """The :class:`LocalTables` of ``tree`` (built once per tree, dtype and device)."""
    return tree.derived(("local", dtype, device), lambda: _make_local_tables(tree, dtype, device))


def _make_local_tables(tree: KinematicTree, dtype: torch.dtype, device: torch.device) -> LocalTables:
    # Index arithmetic on arrays: a 1000-body chain has half a million pairs of each kind.
    nb, nv, nj, par, nf = tree.nb, tree.nv, tree.nj, tree.body_parent, tree.nfree
    db = np.asarray(tree.dof_body, dtype=np.int64)
    pairs = tree.body_pair_array()  # (a, b): a at or above b
    anc, desc = pairs[:, 0], pairs[:, 1]
    jrows = np.nonzero(anc >= nf)[0]
    jp_joint = anc[jrows] - nf
    cp = tree.crba_pair_array()
    same = db[cp[:, 0]] == db[cp[:, 1]]
    fn = np.concatenate([cp[~same], cp[same]])  # the far pairs, then the near ones
    nfar = int((~same).sum())
    gather = pair_gather(nv, torch.from_numpy(fn[:, 0].copy()), torch.from_numpy(fn[:, 1].copy()),
                         torch.arange(len(fn)) < nfar)
    mask = torch.zeros(nv, 6, 1, dtype=dtype)
    mask[:, 3:] = 1
    mask[: 3 * tree.nfree, :3] = 1  # base translations: (R0 e_i; 0) wherever the base is
    for k, prismatic in enumerate(tree.is_prismatic):
        if prismatic:
            mask[tree.v_joint_start + k, :3] = 1
    roots = [float(not tree.nfree and p < 0) for p in par[tree.nfree:]]
    long = lambda x: torch.as_tensor(np.ascontiguousarray(x, dtype=np.int64)).reshape(-1).to(device)  # noqa: E731
    return LocalTables(
        anc=long(anc), desc=long(desc), npairs=len(pairs),
        sum_anc=_sum_matrix(torch.from_numpy(anc.copy()), nb, dtype, device),
        jp_pair=long(jrows), jp_joint=long(jp_joint), jp_body=long(desc[jrows]),
        jp_sum=_sum_matrix(torch.from_numpy(jp_joint.copy()), nj, dtype, device),
        far_d=long(fn[:nfar, 0]), far_e=long(fn[:nfar, 1]), near_d=long(fn[nfar:, 0]), near_e=long(fn[nfar:, 1]),
        crba_gather=gather.to(device),
        parent=long([b if a < 0 else a for b, a in enumerate(par)]),
        levels=tuple(None if len(idx) == 1 else long(idx) for idx, _ in reversed(tree.levels)
                     if not (tree.nfree and idx == (0,))),
        local_mask=mask.to(device),
        root_mask=torch.tensor(roots, dtype=dtype, device=device).reshape(-1, 1, 1),
        base_pairs=long(np.nonzero(anc == 0)[0] if tree.nfree else []),
        eye3=torch.eye(3, dtype=dtype, device=device),
    )


def _sum_matrix(index: Tensor, n: int, dtype: torch.dtype, device: torch.device) -> Tensor | None:
    """``(n, len(index))`` 0/1 matrix summing the entries of each ``index`` value (what
    :func:`~._local.segment_sum` takes on small sums), or ``None`` where it would have more than
    ``SMALL_SUM`` entries: ``segment_sum`` never reads one that large, and on a long chain it would
    have O(nb^3) entries."""
    if n * index.shape[0] > SMALL_SUM:
        return None
    out = torch.zeros(n, index.shape[0], dtype=dtype)
    out[index, torch.arange(index.shape[0])] = 1
    return out.to(device)


class LocalConstants(NamedTuple):
    """Per-model constants of the local-point formulation (:mod:`._local`), in body frames."""

    c_loc: Tensor  # (nb, 3) centre of mass of each body (massless: its origin)
    Ic_loc: Tensor  # (nb, 3, 3) rotational inertia about the centre of mass
    p_tree: Tensor  # (nj, 3, 1) joint placements of the centered kinematic pass


_PER_MODEL = torch.utils.weak.WeakIdKeyDictionary()


def per_model(tag: str, tensors: tuple, build):
    """``build()``, kept per model-tensor bundle: a value computed from ``tensors`` alone (fields of one
    :class:`~diffmech.model.parameters.ModelTensors`, which are replaced, never changed, when a
    parameter changes) is reused while the same tensors come back and none carries a graph."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors) or torch.compiler.is_compiling():
        return build()
    got = _PER_MODEL.get(tensors[0])
    if got is not None:
        hit = got.get(tag)
        if hit is not None and all(a is b for a, b in zip(hit[0], tensors[1:])):
            return hit[1]
    value = build()
    if not (torch.is_inference_mode_enabled() or torch._C._are_functorch_transforms_active()):
        _PER_MODEL.setdefault(tensors[0], {})[tag] = (tensors[1:], value)
    return value


def local_constants(tree: KinematicTree, mt: ModelTensors) -> LocalConstants:
    """The :class:`LocalConstants` of ``mt`` (kept per model-tensor bundle, see :func:`per_model`)."""

    def build() -> LocalConstants:
        m, h = mt.body_mass, mt.body_h
        c_loc = h / torch.where(m > 0, m, torch.ones_like(m))[:, None]
        # I_c = I_o - m (|c|^2 1 - c c^T), with m c = h.
        Ic_loc = torch.addcmul(mt.body_I, h[:, :, None], c_loc[:, None, :]) - \
            (h * c_loc).sum(-1)[:, None, None] * torch.eye(3, dtype=m.dtype, device=m.device)
        p_tree = mt.p_tree
        if not tree.nfree:
            # Bodies hanging from the world are placed relative to body 0's joint: its own offset
            # becomes an exact zero, the others' the (constant, small) differences of the offsets.
            p_tree = p_tree - local_tables(tree, p_tree.dtype, p_tree.device).root_mask * p_tree[:1]
        return LocalConstants(c_loc, Ic_loc, p_tree)

    return per_model("local", (mt.body_I, mt.body_h, mt.body_mass, mt.p_tree), build)


# ---------------------------------------------------------------- ball joints
def joint_angles(tree: KinematicTree, qT: Tensor) -> Tensor:
    """The angle (or displacement) of each one-DoF body, ``qT (nq, B) -> (nj, B)``; zero on the bodies
    of ball joints, whose rotation :func:`ball_rotations` gives."""
    if not tree.n_ball:
        return qT[tree.q_joint_start:]
    tb = tree.tables(qT.dtype, qT.device)
    return torch.cat([qT, qT.new_zeros(1, qT.shape[1])]).index_select(0, tb.q_scalar)


def ball_rotations(tree: KinematicTree, qT: Tensor) -> Tensor:
    """The rotation of each ball joint's child frame in its joint frame, ``qT (nq, B) -> (n_ball, 3, 3, B)``
    (quaternions normalised, as the floating base's)."""
    tb = tree.tables(qT.dtype, qT.device)
    B = qT.shape[1]
    quat = qT.index_select(0, tb.ball_q).view(tree.n_ball, 4, B).transpose(0, 1).reshape(4, -1)
    return quat_to_matrix_bl(quat).view(3, 3, tree.n_ball, B).permute(2, 0, 1, 3)


def with_ball_rotations(tree: KinematicTree, mt: ModelTensors, qT: Tensor, R_loc: Tensor) -> Tensor:
    """``R_loc (nj, 3, 3, B)`` with each ball joint's first body placed by ``R_tree R(quat)``."""
    tb = tree.tables(qT.dtype, qT.device)
    R_ball = mm(mt.A0.index_select(0, tb.ball_first), ball_rotations(tree, qT))
    return R_loc.expand(-1, 3, 3, qT.shape[1]).index_copy(0, tb.ball_first, R_ball)


def velocity_of_dofs(tree: KinematicTree, V: Tensor) -> Tensor:
    """Per-body ``V (nb, ...)`` -> ``(nv, ...)``: for each DoF, the value of the body whose motion turns
    its column (its own body; the last body of a ball joint). Without a floating base or ball
    joints DoF ``d`` is body ``d``: ``V`` itself."""
    if tree.n_ball:
        return V.index_select(0, tree.tables(V.dtype, V.device).c_body)
    if tree.nfree:
        return V[tree.tables(V.dtype, V.device).dof_body]
    return V


# ---------------------------------------------------------------- the kinematic pass
def body_placements(tree: KinematicTree, mt: ModelTensors, qT: Tensor, centered: bool = False
                    ) -> tuple[Tensor, Tensor]:
    """World placements of all bodies. ``qT (nq, B) -> R (nb, 3, 3, B), p (nb, 3, B)``.

    ``centered``: positions relative to the origin of body 0 (the floating base, or the first
    body hanging from the world), which sits exactly at zero: a translation of the world, under
    which the dynamics are invariant, that keeps the positions as small as the robot (see
    :mod:`._local`). The kinematics of a fixed base shift by the constant placement of body 0's
    joint in the world.
    """
    qj = joint_angles(tree, qT)  # (nj, B)
    s = qj.sin()[:, None, None]
    c1 = (1.0 - qj.cos())[:, None, None]
    R_loc = torch.addcmul(torch.addcmul(mt.A0, s, mt.A1), c1, mt.A2)  # (nj, 3, 3, B)
    if tree.n_ball:
        R_loc = with_ball_rotations(tree, mt, qT, R_loc)
    p_tree = local_constants(tree, mt).p_tree if centered else mt.p_tree
    # lin_dir is exactly zero on revolute joints, whatever the parameters.
    p_loc = torch.addcmul(p_tree, mt.lin_dir, qj[:, None]) if tree.any_prismatic else p_tree  # (nj, 3, B|1)
    base_p = (qT[:3] if not centered else torch.zeros_like(qT[:3])) if tree.nfree else None
    if small_batch(qT):
        return _placements_by_jumping(tree, qT, R_loc, p_loc, base_p)
    Rs: list[Tensor] = [None] * tree.nb  # type: ignore[list-item]
    ps: list[Tensor] = [None] * tree.nb  # type: ignore[list-item]
    off = tree.nfree
    if off:
        Rs[0] = quat_to_matrix_bl(qT[3:7])
        ps[0] = base_p
    for idx, par in tree.levels:
        if off and idx == (0,):
            continue
        if len(idx) == 1:
            b, pb = idx[0], par[0]
            Rl, pl = R_loc[b - off], p_loc[b - off]
            if pb < 0:
                Rs[b], ps[b] = Rl.expand(3, 3, qT.shape[1]), pl.expand(3, qT.shape[1])
            else:
                Rs[b] = mm(Rs[pb], Rl)
                ps[b] = ps[pb] + mv(Rs[pb], pl)
            continue
        jl = [b - off for b in idx]
        Rl, pl = R_loc[jl], p_loc[jl]
        if par[0] < 0:  # all bodies at depth 0 hang from the world
            Rn, pn = Rl.expand(-1, 3, 3, qT.shape[1]), pl.expand(-1, 3, qT.shape[1])
        else:
            Rp = torch.stack([Rs[b] for b in par])
            pp = torch.stack([ps[b] for b in par])
            Rn = mm(Rp, Rl)
            pn = pp + mv(Rp, pl)
        for k, b in enumerate(idx):
            Rs[b], ps[b] = Rn[k], pn[k]
    return torch.stack(Rs), torch.stack(ps)


def _placements_by_jumping(tree: KinematicTree, qT: Tensor, R_loc: Tensor, p_loc: Tensor, base_p: Tensor
                           ) -> tuple[Tensor, Tensor]:
    """:func:`body_placements` for small batches, as products of homogeneous transforms.

    Each step composes every body's transform with the one 2^k levels up (pointer jumping), so a
    depth-d tree takes ceil(log2 d) batched matrix products instead of d levels of elementwise
    ones. Returns batch-last views of batch-first storage.
    """
    B = qT.shape[1]
    R = R_loc.permute(0, 3, 1, 2)  # (nj, B, 3, 3)
    p = p_loc.permute(0, 2, 1)[..., None].expand(-1, B, 3, 1)  # (nj, B, 3, 1)
    if tree.nfree:
        R = torch.cat([quat_to_matrix_bl(qT[3:7]).permute(2, 0, 1)[None], R])
        p = torch.cat([base_p.transpose(0, 1)[None, :, :, None], p])
    eye = torch.eye(4, dtype=qT.dtype, device=qT.device)
    T = torch.cat([torch.cat([R, p], -1), eye[3:].expand(tree.nb, B, 1, 4)], -2)
    T = torch.cat([T, eye.expand(1, B, 4, 4)])  # (nb + 1, B, 4, 4), the last the world
    for anc in tree.tables(qT.dtype, qT.device).jumps:
        T = T[anc] @ T
    T = T[:-1]
    return T[..., :3, :3].permute(0, 2, 3, 1), T[..., :3, 3].permute(0, 2, 1)


def tree_state(tree: KinematicTree, mt: ModelTensors, q: Tensor, *, batch_last: bool = False,
               centered: bool = False) -> TreeState:
    """Body placements and world-frame motion subspaces for ``q (B, nq)`` (or ``(nq, B)``).

    ``centered``: in the world translated so that body 0 sits at the origin (for the dynamics,
    which do not change under the translation; see :func:`body_placements`).
    """
    qT = q if batch_last else q.transpose(0, 1)
    R, p = body_placements(tree, mt, qT, centered)
    off = tree.nfree
    Rj, pj = R[off:], p[off:]
    w_rot = mv(Rj, mt.rot_axis)  # (nj, 3, B)
    # A revolute axis through p with direction w moves the world origin with velocity p x w.
    lin = cross(pj, w_rot)
    if tree.any_prismatic:  # lin_axis is exactly zero on revolute joints
        lin = lin + mv(Rj, mt.lin_axis)
    S = torch.cat([lin, w_rot], dim=-2)
    if off:
        # Free-flyer columns: the base frame's axes, i.e. the columns of its motion transform.
        cols = R[0].transpose(0, 1)  # (3 axes, 3 components, B): the base frame's axes in the world
        lin = torch.cat([cols, torch.zeros_like(cols)], dim=1)
        ang = torch.cat([cross(p[0][None].expand_as(cols), cols), cols], dim=1)
        S0 = torch.cat([lin, ang], dim=0)  # (6 dofs, 6, B)
        S = torch.cat([S0, S], dim=0)
    return TreeState(R=R, p=p, S=S, mt=mt)


def world_inertia(ts: TreeState) -> RigidInertia:
    """Spatial inertias of all bodies in the world frame at the origin."""
    mt = ts.mt
    m = mt.body_mass[:, None]  # (nb, 1)
    if small_batch(ts.p):
        return _world_inertia_small(ts, m)
    hb = mv(ts.R, mt.body_h[..., None])  # body first moment, world axes, about the body origin
    Ib = mm(mm(ts.R, mt.body_I[..., None]), ts.R.transpose(1, 2))
    p = ts.p
    # Move the reference point from the body origin to the world origin.
    ph = (p * hb).sum(1, keepdim=True)  # (nb, 1, B)
    pp = (p * p).sum(1, keepdim=True)
    eye = torch.eye(3, dtype=p.dtype, device=p.device)[None, :, :, None]
    I = Ib + (m[..., None, None] * pp[:, None] + 2 * ph[:, None]) * eye - m[..., None, None] * (
        p[:, :, None] * p[:, None, :]) - (p[:, :, None] * hb[:, None, :] + hb[:, :, None] * p[:, None, :])
    h = hb + m[..., None] * p
    return RigidInertia(m=m, h=h, I=I)


def _world_inertia_small(ts: TreeState, m: Tensor) -> RigidInertia:
    """:func:`world_inertia` by batched 3x3 matrix products (batch-first), for small batches."""
    mt = ts.mt
    R = ts.R.permute(0, 3, 1, 2)  # (nb, B, 3, 3)
    p = ts.p.permute(0, 2, 1)[..., None]  # (nb, B, 3, 1)
    hb = R @ mt.body_h[:, None, :, None]  # first moment about the body origin, world axes
    Ib = R @ mt.body_I[:, None] @ R.transpose(-1, -2)
    h = torch.addcmul(hb, m[..., None, None], p)
    # Parallel axis from the body origin to the world origin: I = Ib + tr(W) 1 - W, W = h p^T + p hb^T.
    W = torch.cat([h, p], -1) @ torch.cat([p, hb], -1).transpose(-1, -2)
    tr = W.diagonal(0, -2, -1).sum(-1)[..., None, None]  # (nb, B, 1, 1)
    eye = torch.eye(3, dtype=p.dtype, device=p.device)
    I = torch.addcmul(Ib - W, tr, eye)
    h_skew = torch.linalg.cross(h, eye.expand(1, 1, 3, 3), dim=-2)  # column i is h x e_i
    m_eye = (m[..., None, None] * eye).expand_as(I)
    full = torch.cat([torch.cat([m_eye, -h_skew], -1), torch.cat([h_skew, I], -1)], -2)  # (nb, B, 6, 6)
    return RigidInertia(m=m, h=h[..., 0].permute(0, 2, 1), I=I.permute(0, 2, 3, 1), full=full.permute(0, 2, 3, 1))


class VelocityTerms(NamedTuple):
    """What RNEA and ABA both derive from the velocities (batch-last)."""

    inertia: RigidInertia  # world-frame body inertias
    V: Tensor  # (nb, 6, B) body spatial velocities
    c: Tensor  # (nv, 6, B) velocity-product acceleration of each joint, (V_body x S) v
    bias: Tensor  # (nb, 6, B) V x* I V minus the external forces


def velocity_terms(
    tree: KinematicTree, ts: TreeState, vT: Tensor, f_ext: Tensor | None, inertia: RigidInertia | None = None
) -> VelocityTerms:
    """Body velocities, joint bias accelerations and body bias forces for ``vT (nv, B)``.

    ``inertia`` is ``world_inertia(ts)`` when the caller already has it.
    """
    if inertia is None:
        inertia = world_inertia(ts)
    mask_bd, _ = masks(tree, vT)
    Sv = ts.S * vT[:, None]
    V = tree_sum(mask_bd, Sv)
    # Each column moves with its body: d/dt S_d = V_body(d) x S_d. Without a floating base, DoF d
    # is body d.
    c = motion_cross(velocity_of_dofs(tree, V), Sv)
    bias = force_cross(V, inertia.apply(V))
    if f_ext is not None:
        bias = bias - external_body_forces(tree, ts, f_ext)
    return VelocityTerms(inertia, V, c, bias)


def masks(tree: KinematicTree, like: Tensor) -> tuple[Tensor, Tensor]:
    """``(mask_bd (nb, nv), mask_db (nv, nb))`` in ``like``'s dtype: ``mask_bd[i, d] = 1`` when
    joint ``d`` moves body ``i``."""
    tb = tree.tables(like.dtype, like.device)
    return tb.mask_bd, tb.mask_db


# Masked sums of up to this many products are one elementwise product and a sum, which ATen runs
# on the calling thread (below its grain size): BLAS threads GEMMs from about a thousand products
# on, and on a loaded machine each threaded call waits for a descheduled worker -- 30 ms per call
# measured on 2 shared cores, where the elementwise form takes microseconds. Below
# ``TINY_SUM`` products BLAS stays on one thread and one GEMM is the fewest operators.
SMALL_SUM = 32768
TINY_SUM = 512


def tree_sum(mask: Tensor, x: Tensor) -> Tensor:
    """``y[i] = sum_j mask[i, j] x[j]`` for ``x (n, ..., B)``: one GEMM over all trailing dims."""
    m = mask.shape[0]
    flat = x.flatten(1)  # not reshape(len(x), -1): x is empty for a lone free body
    if TINY_SUM < m * flat.numel() <= SMALL_SUM and not torch.compiler.is_compiling():
        return (mask[:, :, None] * flat).sum(1).reshape(m, *x.shape[1:])
    return (mask @ flat).reshape(m, *x.shape[1:])


def gravity_acceleration(mt: ModelTensors) -> Tensor:
    """Spatial acceleration of the world that stands in for gravity, ``(6, 1)``: ``(-g; 0)``."""
    return torch.nn.functional.pad(-mt.gravity, (0, 3))[:, None]


def passive_forces(tree: KinematicTree, mt: ModelTensors, qT: Tensor, vT: Tensor) -> Tensor:
    """Joint damping and spring forces ``(nv, B)`` acting *on* the joints (zero on the base)."""
    qj = joint_angles(tree, qT)
    vj = vT[tree.v_joint_start:]
    tj = -mt.damping[:, None] * vj - mt.stiffness[:, None] * (qj - mt.rest[:, None])
    if tree.nfree:
        tj = torch.cat([torch.zeros_like(vT[:6]), tj], dim=0)
    return tj


def add_passive(tree: KinematicTree, mt: ModelTensors, tauT: Tensor, qT: Tensor, vT: Tensor, sign: float) -> Tensor:
    """``tauT + sign * passive_forces(...)`` in fewer operations (``tauT (nv, B)``)."""
    if tree.nfree or tree.n_ball:
        return tauT + sign * passive_forces(tree, mt, qT, vT)
    # Fixed base: every coordinate is a joint's, so both products fuse into tau with no slicing.
    tauT = torch.addcmul(tauT, mt.damping[:, None], vT, value=-sign)
    return torch.addcmul(tauT, mt.stiffness[:, None], qT - mt.rest[:, None], value=-sign)


def external_body_forces(tree: KinematicTree, ts: TreeState, f_ext: Tensor) -> Tensor:
    """Map link forces to world-origin body forces.

    Args:
        f_ext: (B, n_links, 6) force; torque (N; N m) applied to each link, world-aligned axes,
            torque taken about the link origin.

    Returns:
        (nb, 6, B) spatial forces at the world origin, summed per body (links fixed to the world
        are dropped: they cannot move).
    """
    keep_t, body, origin = link_origins(tree, ts, f_ext)
    f = f_ext[:, keep_t].permute(1, 2, 0)  # (k, 6, B)
    fw = torch.cat([f[:, :3], f[:, 3:] + cross(origin, f[:, :3])], dim=1)
    out = torch.zeros(tree.nb, 6, f_ext.shape[0], dtype=f_ext.dtype, device=f_ext.device)
    return out.index_add(0, body, fw)


def link_origins(tree: KinematicTree, ts: TreeState, like: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The links that move, their bodies (both ``(k,)`` long) and their origins in the world
    ``(k, 3, B)`` (links fixed to the world cannot move and are left out)."""
    tb = tree.tables(like.dtype, like.device)
    keep, body = tb.moving_links, tb.moving_link_body
    origin = ts.p[body] + mv(ts.R[body], ts.mt.link_p[keep][..., None])
    return keep, body, origin


def f_ext_entry(model: RobotParameters, f_ext) -> tuple | None:
    """The :func:`as_state` entry of an optional ``f_ext (..., n_links, 6)``."""
    return None if f_ext is None else ("f_ext", f_ext, (model.n_links, 6))
