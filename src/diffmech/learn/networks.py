"""The seed's networks, with analytic forward-mode derivatives with respect to the configuration.

:class:`LagrangianNet` is the seed's "rigid body" network: an MLP trunk on the angle embedding of
``q`` with three linear heads, the potential ``V(q)`` and a Cholesky factor of the inertia
``H(q)``. The Lagrangian models need ``dV/dq``, ``dH/dq`` (the DEL residual, L-NODE's Coriolis
terms) and, for Newton's Jacobian, the second derivatives. Instead of nested autograd
(``create_graph=True`` and one backward pass per row of a Jacobian, as the seed does), the trunk
propagates *jets*: the value together with its first (and second) derivatives along every
coordinate, as a stack ``(..., K, width)`` with ``K = 1 + n (+ n(n+1)/2)``. Each layer is then
one matrix product on the stack, the whole computation is plain tensor code (so reverse mode
gives parameter gradients through it in one pass, and ``torch.func`` transforms compose with it),
and no graph of a graph is built.
Without a graph the jets are computed in place. :meth:`LagrangianNet.directional_heads` gives the
heads' outputs with their derivative along one vector per sample and a hand-written reverse pass for
the parameters, optionally from jets kept from earlier no-graph evaluations at the same points
(:meth:`LagrangianNet.record_jets`).

Initialisation follows the seed exactly: layers are created in its order with PyTorch's default
initialisation, then the trunk's (and NODE's output) layers are re-initialised Xavier-uniform with
gain ``5/3`` (tanh) and zero biases; the heads keep the default. Under the same
``torch.manual_seed`` the initial weights equal the seed's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ShapeError

__all__ = ["AngleEmbedding", "MLP", "LagrangianNet", "pair_index"]

_TANH_GAIN = 5.0 / 3.0


def pair_index(n: int) -> tuple[list[int], list[int]]:
    """Pairs ``(j, k)``, ``j <= k``, ordering the second-order jet entries."""
    js, ks = zip(*[(j, k) for j in range(n) for k in range(j, n)])
    return list(js), list(ks)


def _seed_init(layers: list[nn.Linear]) -> None:
    for layer in layers:
        nn.init.constant_(layer.bias, 0)
        nn.init.xavier_uniform_(layer.weight, gain=_TANH_GAIN)


class AngleEmbedding(nn.Module):
    """``q -> s = (q[~angle], cos q[angle], sin q[angle])`` (the seed's order: translations first).

    Args:
        angle_mask: (n,) which coordinates are angles.
    """

    def __init__(self, angle_mask):
        super().__init__()
        mask = torch.as_tensor(list(angle_mask), dtype=torch.bool)
        self.n = int(mask.numel())
        lin = torch.nonzero(~mask).flatten()
        ang = torch.nonzero(mask).flatten()
        self.register_buffer("lin", lin, persistent=False)
        self.register_buffer("ang", ang, persistent=False)
        self.n_out = int(lin.numel() + 2 * ang.numel())
        # d s / d q as a constant (n, n_out) pattern: linear part and the (cos, sin) columns of angles
        m, a = int(lin.numel()), int(ang.numel())
        P_lin = torch.zeros(self.n, self.n_out)
        P_lin[lin, torch.arange(m)] = 1.0
        self.register_buffer("P_lin", P_lin, persistent=False)
        S_cos = torch.zeros(self.n, self.n_out)
        S_sin = torch.zeros(self.n, self.n_out)
        S_cos[ang, m + torch.arange(a)] = 1.0
        S_sin[ang, m + a + torch.arange(a)] = 1.0
        self.register_buffer("S_cos", S_cos, persistent=False)
        self.register_buffer("S_sin", S_sin, persistent=False)
        self.angle_mask = tuple(bool(x) for x in mask)

    def forward(self, q: Tensor) -> Tensor:
        if q.shape[-1] != self.n:
            raise ShapeError(f"AngleEmbedding: q must be (..., {self.n}), got {tuple(q.shape)}")
        qa = q[..., self.ang]
        return torch.cat([q[..., self.lin], torch.cos(qa), torch.sin(qa)], -1)


def _tanh(x: Tensor) -> Tensor:
    # Arrays of a few thousand entries and more: tanh(x) = 2 sigmoid(2x) - 1, the same function, measured
    # 1.5x (32 x 256) to 3x (512 x 128 and above) faster than torch.tanh on this CPU (float32, AVX-512).
    # Smaller ones: one operation instead of four (per-call overhead rules).
    if x.numel() < 6144:
        return torch.tanh(x)
    if torch.is_grad_enabled() and x.requires_grad:  # sigmoid's backward reads its output: no in-place
        return 2 * torch.sigmoid(2 * x) - 1
    return torch.sigmoid(2 * x).mul_(2).sub_(1)


class MLP(nn.Module):
    """The seed's trunk ``Linear(in, w) - tanh - Linear(w, w) - tanh`` (+ optional ``Linear(w, out)``)."""

    def __init__(self, n_in: int, width: int, n_out: int | None = None):
        super().__init__()
        self.l1 = nn.Linear(n_in, width)
        self.l2 = nn.Linear(width, width)
        self.out = nn.Linear(width, n_out) if n_out is not None else None
        _seed_init([m for m in (self.l1, self.l2, self.out) if m is not None])

    def forward(self, x: Tensor) -> Tensor:
        h = _tanh(self.l2(_tanh(self.l1(x))))
        return self.out(h) if self.out is not None else h


def _add_to_value(z: Tensor, b: Tensor) -> Tensor:
    """``z[0] + b`` on a jet stack ``(K, ..., w)`` (biases enter the value only). In place without a
    graph; with one, a broadcast add of ``[b, 0, ...]``: autograd would otherwise copy and zero-fill the
    whole stack for the in-place update of a slice."""
    if not (torch.is_grad_enabled() and (z.requires_grad or b.requires_grad)):
        z[0].add_(b)
        return z
    if z.shape[0] == 1:
        return z + b
    pad = torch.cat([b[None], b.new_zeros(z.shape[0] - 1, b.shape[-1])], 0)
    return z + pad.reshape(z.shape[0], *([1] * (z.dim() - 2)), b.shape[-1])


def _tanh_jet(z: Tensor, n: int, pj: Tensor | None, pk: Tensor | None) -> Tensor:
    """tanh on a jet stack ``z (K, ..., w)``: value, ``n`` first derivatives, the pair second derivatives.

    Jets are stacked along the *first* dimension so that each component is a contiguous block.
    """
    h = _tanh(z[0])
    if z.shape[0] == 1:
        return h[None]
    t1 = 1 - h * h
    dz = z[1:1 + n]
    parts = [h[None], t1 * dz]
    if z.shape[0] > 1 + n:
        dzj, dzk = (dz, dz) if n == 1 else (dz.index_select(0, pj), dz.index_select(0, pk))
        parts.append((-2 * h * t1) * dzj * dzk + t1 * z[1 + n:])
    return torch.cat(parts, 0)


def _tanh_jet_(z: Tensor, n: int, pj: tuple, pk: tuple) -> Tensor:
    """:func:`_tanh_jet` in place on a fresh jet stack ``z (K, ..., w)`` (no graph): no concatenation and
    no new stack, which on large batches costs as much as the arithmetic."""
    h = _tanh(z[0])
    if z.shape[0] == 1:
        z[0].copy_(h)
        return z
    t = 1 - h * h
    if z.shape[0] > 1 + n:
        m2 = (-2 * h).mul_(t)  # the second derivative of tanh
        z[1 + n:].mul_(t)
        for p, (j, k) in enumerate(zip(pj, pk)):
            z[1 + n + p].addcmul_(m2 * z[1 + j], z[1 + k])
    z[1:1 + n].mul_(t)
    z[0].copy_(h)
    return z


def _head_jet_nograd(q: Tensor, W1: Tensor, b1: Tensor, W2: Tensor, b2: Tensor, Wh: Tensor, bh: Tensor,
                     stack: Tensor, n: int, pj: tuple, pk: tuple, record: list | None = None) -> Tensor:
    """:func:`_head_jet_fn` without a graph from the embedding's jet ``stack (K, ..., n_in)``: each
    layer one matrix product into a fresh stack, the bias added to its value rows and the activation's
    jet computed in place. ``record``: a list that receives the layers' input jets ``(stack, h1, h2)``."""
    z = stack @ W1.T
    z[0].add_(b1)
    h1 = _tanh_jet_(z, n, pj, pk)
    z = h1 @ W2.T
    z[0].add_(b2)
    h2 = _tanh_jet_(z, n, pj, pk)
    out = h2 @ Wh.T
    out[0].add_(bh)
    if record is not None:
        record.extend((stack, h1, h2))
    return out


def _head_jet_fn(q: Tensor, W1: Tensor, b1: Tensor, W2: Tensor, b2: Tensor, Wh: Tensor, bh: Tensor, P_lin: Tensor,
                 S_cos: Tensor, S_sin: Tensor, lin: Tensor, ang: Tensor, pjt: Tensor, pkt: Tensor, order: int,
                 pj: tuple, pk: tuple, record: list | None = None) -> Tensor:
    """The heads' output jets ``(K, ..., m)`` of :class:`LagrangianNet` as a pure function of its tensors
    (``record``: see :func:`_head_jet_nograd`; used without a graph only)."""
    n = P_lin.shape[0]
    if order == 2 and n == 1 and ang.numel() == 1:  # the pendulum: (cos, sin) and its jets
        c, sn = torch.cos(q), torch.sin(q)
        stack = torch.stack([torch.cat([c, sn], -1), torch.cat([-sn, c], -1), torch.cat([-c, -sn], -1)])
    else:
        qa = q[..., ang]
        s = torch.cat([q[..., lin], torch.cos(qa), torch.sin(qa)], -1)
        if order == 0:
            stack = s[None]
        else:
            c, sn = torch.cos(q), torch.sin(q)
            ds = P_lin - sn[..., :, None] * S_cos + c[..., :, None] * S_sin  # (..., n, m)
            parts = [s[None], ds.movedim(-2, 0)]
            if order >= 2:
                diag = torch.tensor([float(j == k) for j, k in zip(pj, pk)], dtype=q.dtype, device=q.device)[:, None]
                Sc, Ss = S_cos[list(pj)] * diag, S_sin[list(pj)] * diag  # (P, m)
                parts.append((-(c[..., list(pj), None] * Sc + sn[..., list(pj), None] * Ss)).movedim(-2, 0))
            stack = torch.cat(parts, 0)
    if not (torch.is_grad_enabled() and any(w.requires_grad for w in (q, W1, b1, W2, b2, Wh, bh))):
        return _head_jet_nograd(q, W1, b1, W2, b2, Wh, bh, stack, n, pj, pk, record)
    z = _add_to_value(stack @ W1.T, b1)
    h = _tanh_jet(z, n, pjt, pkt)
    z2 = _add_to_value(h @ W2.T, b2)
    h2 = _tanh_jet(z2, n, pjt, pkt)
    return _add_to_value(h2 @ Wh.T, bh)


def _embed_dir(q: Tensor, d: Tensor, lin: Tensor, ang: Tensor) -> Tensor:
    """The embedding ``s(q)`` and its derivative along ``d`` stacked ``(2, ..., n_in)``."""
    if lin.numel() == 0 and ang.numel() == q.shape[-1] == 1:  # the pendulum
        c, sn = torch.cos(q), torch.sin(q)
        return torch.stack([torch.cat([c, sn], -1), torch.cat([-sn * d, c * d], -1)])
    qa, da = q[..., ang], d[..., ang]
    c, sn = torch.cos(qa), torch.sin(qa)
    return torch.stack([torch.cat([q[..., lin], c, sn], -1), torch.cat([d[..., lin], -sn * da, c * da], -1)])


def _tanh_dir_(z: Tensor) -> tuple[Tensor, Tensor]:
    """tanh on a (value, direction) stack ``z (2, ..., w)``, in place; returns ``(z, 1 - tanh^2)``."""
    h = _tanh(z[0])
    t = 1 - h * h
    z[1].mul_(t)
    z[0].copy_(h)
    return z, t


def _value_and_direction(X: Tensor, d: Tensor) -> Tensor:
    """``(X[0], sum_k d_k X[1 + k])`` stacked ``(2, ..., w)`` from a jet stack ``X (K, ..., w)``, ``d (..., n)``."""
    n = d.shape[-1]
    Xd = X[1] * d[..., :1]
    for k in range(1, n):
        Xd.addcmul_(X[1 + k], d[..., k:k + 1])
    return torch.stack([X[0], Xd])


class _DirectionalHeads(torch.autograd.Function):
    """Heads' outputs of :class:`LagrangianNet` at ``q`` and their derivatives along ``d``, with a
    hand-written reverse pass for the parameters (``q`` and ``d`` are constants: no gradient).

    Reverse mode through a (value, direction) jet: for ``h = tanh(z)``, ``h_d = t z_d`` with
    ``t = 1 - h^2`` the cotangents are ``gz_d = t gh_d`` and ``gz = t gh - 2 h h_d gh_d``, so the pass
    costs two matrix products per layer and reuses the forward's activations (no graph of
    elementwise operations is recorded).
    """

    @staticmethod
    def forward(ctx, q, d, lin, ang, W1, b1, W2, b2, Wh, bh, pre=None):
        if pre is None:
            S = _embed_dir(q, d, lin, ang)
            Z1 = S @ W1.T
            Z1[0].add_(b1)
            H1, t1 = _tanh_dir_(Z1)
            Z2 = H1 @ W2.T
            Z2[0].add_(b2)
            H2, t2 = _tanh_dir_(Z2)
        else:  # the layers' inputs (value, direction) from jets already evaluated at q
            S, H1, H2 = pre
            t1, t2 = 1 - H1[0] * H1[0], 1 - H2[0] * H2[0]
        O = H2 @ Wh.T
        O[0].add_(bh)
        ctx.save_for_backward(S, H1, t1, H2, t2, W2, Wh)
        return O[0], O[1]

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, go, god):
        S, H1, t1, H2, t2, W2, Wh = ctx.saved_tensors
        G = torch.stack([go, god])  # (2, ..., m)

        def flat(x):
            return x.reshape(-1, x.shape[-1])

        def back(GH, H, t):
            # cotangents of the pre-activations from those of the activations (see the class docstring)
            GZ = GH * t
            GZ[0].addcmul_(H[0] * H[1], GH[1], value=-2.0)
            return GZ

        gWh = flat(G).T @ flat(H2)
        gbh = flat(go).sum(0)
        GZ2 = back(G @ Wh, H2, t2)
        gW2 = flat(GZ2).T @ flat(H1)
        gb2 = flat(GZ2[0]).sum(0)
        GZ1 = back(GZ2 @ W2, H1, t1)
        gW1 = flat(GZ1).T @ flat(S)
        gb1 = flat(GZ1[0]).sum(0)
        return None, None, None, None, gW1, gb1, gW2, gb2, gWh, gbh, None


class LagrangianNet(nn.Module):
    """``q -> (H(q), V(q))`` with jets: the seed's rigid-body network.

    ``V = Linear(w, 1)(h)``; the Cholesky factor has diagonal ``softplus(Linear(w, n)(h))`` and
    strictly lower part ``Linear(w, n(n-1)/2)(h)`` (row-major order of ``tril_indices``); the three
    heads are one parameter pair ``head_weight (1 + n + n(n-1)/2, w)``, ``head_bias``.

    Args:
        angle_mask: (n,) coordinates embedded as ``(cos, sin)``.
        width: hidden width.
        inertia: ``"paper"`` (default) reproduces the seed's code: for ``n = 1``, ``H =
            softplus(z)`` (no square, no epsilon); for ``n >= 2``, ``H = L L^T + eps I``.
            ``"cholesky"`` uses ``L L^T + eps I`` for every ``n``.
        eps: the diagonal added to ``L L^T`` (the seed: 1e-9).
    """

    def __init__(self, angle_mask, width: int = 128, inertia: str = "paper", eps: float = 1e-9):
        super().__init__()
        if inertia not in ("paper", "cholesky"):
            raise ShapeError(f"LagrangianNet: inertia must be 'paper' or 'cholesky', got {inertia!r}")
        self.embed = AngleEmbedding(angle_mask)
        n = self.n = self.embed.n
        self.width = width
        self.trunk = MLP(self.embed.n_out, width)
        # the seed's three heads, created (and default-initialised) in its order, stored as one linear
        # map with rows [V, Cholesky diagonal (n), strictly lower part (n(n-1)/2)]
        fc_ld = nn.Linear(width, n)
        fc_lo = nn.Linear(width, n * (n - 1) // 2) if n > 1 else None
        fc_g = nn.Linear(width, 1)
        heads = [fc_g, fc_ld] + ([fc_lo] if fc_lo is not None else [])
        self.head_weight = nn.Parameter(torch.cat([m.weight.detach() for m in heads], 0))
        self.head_bias = nn.Parameter(torch.cat([m.bias.detach() for m in heads], 0))
        self.inertia_kind = inertia
        self.eps = eps
        self._tapes: list | None = None
        self._pj, self._pk = pair_index(n)
        self.register_buffer("_pjt", torch.tensor(self._pj, dtype=torch.long), persistent=False)
        self.register_buffer("_pkt", torch.tensor(self._pk, dtype=torch.long), persistent=False)
        rows, cols = torch.tril_indices(n, n, -1)
        # gather map from [diag (n), lower (n(n-1)/2), zero] to the flattened n x n factor
        gmap = torch.full((n * n,), n + len(rows), dtype=torch.long)
        gmap[torch.arange(n) * (n + 1)] = torch.arange(n)
        gmap[rows * n + cols] = n + torch.arange(len(rows))
        self.register_buffer("_gmap", gmap, persistent=False)
        # symmetric (n, n) from pair entries
        sym = torch.empty(n * n, dtype=torch.long)
        for p, (j, k) in enumerate(zip(self._pj, self._pk)):
            sym[j * n + k] = p
            sym[k * n + j] = p
        self.register_buffer("_sym", sym, persistent=False)

    # ------------------------------------------------------------------ jets
    def _head_jet(self, q: Tensor, order: int) -> Tensor:
        """Jets of the heads' outputs ``(K, ..., 1 + n + n(n-1)/2)``: ``[V, diag pre-activations, lower]``."""
        if q.shape[-1] != self.n:
            raise ShapeError(f"LagrangianNet: q must be (..., {self.n}), got {tuple(q.shape)}")
        e, t = self.embed, self.trunk
        args = (q, t.l1.weight, t.l1.bias, t.l2.weight, t.l2.bias, self.head_weight, self.head_bias, e.P_lin,
                e.S_cos, e.S_sin, e.lin, e.ang, self._pjt, self._pkt, order, tuple(self._pj), tuple(self._pk))
        if self._tapes is None or order < 1:
            return _head_jet_fn(*args)
        rec: list = []
        out = _head_jet_fn(*args, record=rec)
        if rec:  # evaluated without a graph: keep the jets for directional_heads (the first and the latest)
            entry = (q, self._param_key(), *rec)
            if len(self._tapes) < 2:
                self._tapes.append(entry)
            else:
                self._tapes[1] = entry
        return out

    def _params(self) -> tuple[Tensor, ...]:
        t = self.trunk
        return t.l1.weight, t.l1.bias, t.l2.weight, t.l2.bias, self.head_weight, self.head_bias

    def _param_key(self) -> tuple:
        return tuple((id(p), p._version) for p in self._params())

    def record_jets(self, on: bool) -> None:
        """Start (or stop) keeping the first and the latest first-order (or higher) jets evaluated without
        a graph, for :meth:`directional_heads` at the same points with the same weights. A Newton solve
        turns it on: the implicit backward pass then needs no forward pass of the network."""
        self._tapes = [] if on else None

    def _find_tape(self, q: Tensor):
        if not self._tapes:
            return None
        key = self._param_key()
        for e in self._tapes:
            if e[1] == key and e[0].shape == q.shape and e[0].dtype == q.dtype and torch.equal(e[0], q):
                return e
        return None

    def directional_heads(self, q: Tensor, d: Tensor) -> tuple[Tensor, Tensor]:
        """The heads' outputs ``o (..., 1 + n + n(n-1)/2)`` (``[V, Cholesky diagonal pre-activations,
        strictly lower part]``) at ``q (..., n)`` and their derivatives along ``d (..., n)``.

        Differentiable w.r.t. the network's parameters only (``q`` and ``d`` are treated as constants),
        by a hand-written reverse pass: the cheap way to the parameter gradient of a quantity that
        contracts the first derivatives with one vector per sample (a vector-Jacobian product of the
        DEL residual needs ``d`` = its cotangent, not all ``n`` directions).
        """
        if q.shape[-1] != self.n or d.shape != q.shape:
            raise ShapeError(f"LagrangianNet.directional_heads: q and d must both be (..., {self.n}), got "
                             f"{tuple(q.shape)} and {tuple(d.shape)}")
        e = self.embed
        pre = None
        if self._tapes and q.dim() >= 2:
            tapes = [self._find_tape(q[i]) for i in range(q.shape[0])]
            if all(tp is not None for tp in tapes):
                pre = tuple(torch.stack([_value_and_direction(tp[2 + a], d[i]) for i, tp in enumerate(tapes)], 1)
                            for a in range(3))
        return _DirectionalHeads.apply(q.detach(), d.detach(), e.lin, e.ang, *self._params(), pre)

    def jet_scalar(self, q: Tensor, order: int = 1):
        """The 1-DoF case of :meth:`jet` with every entry a tensor of the batch shape ``(...)``."""
        if self.n != 1:
            raise ShapeError(f"LagrangianNet.jet_scalar: needs n = 1, the network has n = {self.n}")
        out = self._head_jet(q, order)
        V = out[0, ..., 0]
        z0 = out[0, ..., 1]
        L = F.softplus(z0)
        if order == 0:
            return V, None, None, (L if self.inertia_kind == "paper" else L * L + self.eps), None, None
        sig = torch.sigmoid(z0)
        z1 = out[1, ..., 1]
        dL = sig * z1
        d2L = (sig * (1 - sig)) * z1 * z1 + sig * out[2, ..., 1] if order >= 2 else None
        dV, d2V = out[1, ..., 0], (out[2, ..., 0] if order >= 2 else None)
        if self.inertia_kind == "paper":
            return V, dV, d2V, L, dL, d2L
        return (V, dV, d2V, L * L + self.eps, 2 * L * dL,
                (2 * (dL * dL + L * d2L)) if order >= 2 else None)

    def factor_jet(self, q: Tensor, order: int = 1):
        """The potential's and the Cholesky factor's jets, stacked first (``n >= 2`` or ``inertia="cholesky"``).

        Returns ``(V, dV, d2V, L)``: ``V (...)``, ``dV (n, ...)`` (``dV[j] = dV/dq_j``), ``d2V (P, ...)``
        for the pairs of :func:`pair_index`, and ``L (K, ..., n, n)``: the factor (``H = L L^T +
        eps I``), its ``n`` first and ``P`` second derivatives; entries above ``order`` are ``None``.
        Models contract these with velocities directly instead of forming ``dH`` and ``d2H``.
        """
        if self.n == 1 and self.inertia_kind == "paper":
            raise ShapeError("LagrangianNet.factor_jet: the 1-DoF 'paper' inertia softplus(z) has no factor; "
                             "use jet_scalar")
        n = self.n
        out = self._head_jet(q, order)  # (K, ..., m)
        V = out[0, ..., 0]
        dV = out[1:1 + n, ..., 0] if order >= 1 else None
        d2V = out[1 + n:, ..., 0] if order >= 2 else None
        zd = out[..., 1:1 + n]  # (K, ..., n)
        z0 = zd[0]
        parts = [F.softplus(z0)[None]]
        if order >= 1:
            sig = torch.sigmoid(z0)
            dz = zd[1:1 + n]
            parts.append(sig * dz)
            if order >= 2:
                dzj, dzk = (dz, dz) if n == 1 else (dz.index_select(0, self._pjt), dz.index_select(0, self._pkt))
                parts.append((sig * (1 - sig)) * dzj * dzk + sig * zd[1 + n:])
        ld = torch.cat(parts, 0) if len(parts) > 1 else parts[0]  # (K, ..., n)
        vals = torch.cat([ld, out[..., 1 + n:], ld.new_zeros(*ld.shape[:-1], 1)], -1)
        L = vals[..., self._gmap].unflatten(-1, (n, n))
        return V, dV, d2V, L

    def jet(self, q: Tensor, order: int = 1):
        """Potential and inertia with their derivatives at ``q (..., n)``.

        Returns ``(V, dV, d2V, H, dH, d2H)``: ``V (...)``, ``dV (..., n)``, ``d2V (..., n, n)``,
        ``H (..., n, n)``, ``dH (..., n, n, n)`` with ``dH[..., j, :, :] = dH/dq_j``, and
        ``d2H (..., n, n, n, n)``; entries above ``order`` are ``None``.
        """
        n = self.n
        pj, pk = self._pjt, self._pkt
        out = self._head_jet(q, order).movedim(0, -2)  # (..., K, 1 + n + n(n-1)/2)
        V = out[..., 0, 0]
        dV = out[..., 1:1 + n, 0] if order >= 1 else None
        d2V = out[..., 1 + n:, 0][..., self._sym].unflatten(-1, (n, n)) if order >= 2 else None
        zd = out[..., 1:1 + n]  # (..., K, n) Cholesky diagonal pre-activations (jet)
        lo = out[..., 1 + n:]  # (..., K, n(n-1)/2)
        z0 = zd[..., 0, :]
        parts = [F.softplus(z0)[..., None, :]]
        if order >= 1:
            sig = torch.sigmoid(z0)
            dz = zd[..., 1:1 + n, :]
            parts.append(sig[..., None, :] * dz)
            if order >= 2:
                dzj, dzk = (dz, dz) if n == 1 else (dz.index_select(-2, pj), dz.index_select(-2, pk))
                parts.append((sig * (1 - sig))[..., None, :] * dzj * dzk + sig[..., None, :] * zd[..., 1 + n:, :])
        ld = torch.cat(parts, -2) if len(parts) > 1 else parts[0]  # (..., K, n)
        if self.inertia_kind == "paper" and n == 1:
            Hs = ld[..., None]  # (..., K, 1, 1): H = softplus(z), its jet is the softplus jet
            H = Hs[..., 0, :, :]
            dH = Hs[..., 1:2, :, :] if order >= 1 else None
            d2H = Hs[..., 2, :, :][..., None, None, :, :] if order >= 2 else None
            return V, dV, d2V, H, dH, d2H
        vals = torch.cat([ld, lo, ld.new_zeros(*ld.shape[:-1], 1)], -1)
        L = vals[..., self._gmap].unflatten(-1, (n, n))  # (..., K, n, n) jets of the factor
        L0 = L[..., 0, :, :]
        M = L @ L0.mT[..., None, :, :]  # (..., K, n, n): dL L^T terms
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        H = M[..., 0, :, :] + self.eps * eye
        dH = d2H = None
        if order >= 1:
            Md = M[..., 1:1 + n, :, :]
            dH = Md + Md.mT
            if order >= 2:
                dL = L[..., 1:1 + n, :, :]
                cross = dL.index_select(-3, pj) @ dL.index_select(-3, pk).mT
                Mp = M[..., 1 + n:, :, :] + cross
                d2Hp = Mp + Mp.mT  # (..., P, n, n)
                d2H = d2Hp[..., self._sym, :, :].unflatten(-3, (n, n))
        return V, dV, d2V, H, dH, d2H

    def forward(self, q: Tensor) -> tuple[Tensor, Tensor]:
        """``H (..., n, n)`` and ``V (...)`` at ``q (..., n)``."""
        V, _, _, H, _, _ = self.jet(q, 0)
        return H, V
