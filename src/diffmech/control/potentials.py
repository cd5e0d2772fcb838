"""Control potentials ``V_theta(q)``: the learnable part of a conservative closed loop.

A potential is an ``nn.Module`` mapping ``q (..., n)`` to ``V (...)`` (J). The closed loop of a
mechanical system under the control force ``u = -grad V_theta(q)`` is again conservative, with the
Hamiltonian ``H + V_theta``. Gradients and Hessians with respect to ``q`` come from autograd, so any
smooth module works; :class:`MLPPotential` is the network of the eigenmode paper in both of its
variants (the public code's Fourier-feature input with two hidden layers, and the paper's Table 2:
raw angles, one hidden layer).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..errors import ShapeError

__all__ = ["Potential", "MLPPotential", "ZeroPotential", "potential_gradient", "potential_hessian", "autograd_gradient",
           "autograd_hessian"]


class Potential(nn.Module):
    """Base class: ``forward(q) -> V``; :meth:`gradient` and :meth:`hessian` by autograd.

    Args:
        n: number of coordinates the potential acts on.
    """

    def __init__(self, n: int):
        super().__init__()
        if n < 1:
            raise ShapeError(f"{type(self).__name__}: n must be >= 1, got {n}")
        self.n = int(n)

    def _check(self, q: Tensor) -> None:
        if q.shape[-1] != self.n:
            raise ShapeError(f"{type(self).__name__}: q must have shape (..., {self.n}), got {tuple(q.shape)}")

    def gradient(self, q: Tensor, *, create_graph: bool = False) -> Tensor:
        """``dV/dq (..., n)``; with ``create_graph`` the result is differentiable (to ``q`` when it
        requires grad, and to the parameters)."""
        return autograd_gradient(self, q, create_graph=create_graph)

    def hessian(self, q: Tensor) -> Tensor:
        """``d^2 V / dq^2 (..., n, n)`` (no graph)."""
        return autograd_hessian(self, q)


def potential_gradient(potential: nn.Module, q: Tensor, *, create_graph: bool = False) -> Tensor:
    """``dV/dq (..., n)`` of any module ``q -> V``.

    Without ``create_graph`` the result is detached (the parameters' graph is dropped); with it the
    result carries a graph to ``q`` (when it has one) and to the module's parameters. A
    :class:`Potential` answers with its own :meth:`Potential.gradient` (closed form where it has one).
    """
    if isinstance(potential, Potential):
        return potential.gradient(q, create_graph=create_graph)
    return autograd_gradient(potential, q, create_graph=create_graph)


def autograd_gradient(potential: nn.Module, q: Tensor, *, create_graph: bool = False) -> Tensor:
    """``dV/dq (..., n)`` by reverse-mode autograd through ``potential`` (see :func:`potential_gradient`)."""
    with torch.enable_grad():
        if create_graph and q.requires_grad:
            qq = q
        else:
            qq = q.detach().requires_grad_(True)
        V = potential(qq)
        (g,) = torch.autograd.grad(V.sum(), qq, create_graph=create_graph)
    return g


def potential_hessian(potential: nn.Module, q: Tensor) -> Tensor:
    """``d^2 V / dq^2 (..., n, n)`` of any module ``q -> V``, batched over the leading dims (no graph).
    A :class:`Potential` answers with its own :meth:`Potential.hessian`."""
    if isinstance(potential, Potential):
        return potential.hessian(q)
    return autograd_hessian(potential, q)


def autograd_hessian(potential: nn.Module, q: Tensor) -> Tensor:
    """``d^2 V / dq^2 (..., n, n)`` by double backprop through ``potential`` (no graph)."""
    n = q.shape[-1]
    with torch.enable_grad():
        qq = q.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(potential(qq).sum(), qq, create_graph=True)
        if not g.requires_grad:  # a potential linear in q
            return q.new_zeros(*q.shape, n)
        eye = torch.eye(n, dtype=q.dtype, device=q.device)
        basis = eye.reshape(n, *([1] * (q.dim() - 1)), n).expand(n, *q.shape)
        (rows,) = torch.autograd.grad(g, qq, grad_outputs=basis, is_grads_batched=True, allow_unused=True)
    if rows is None:
        return q.new_zeros(*q.shape, n)
    return rows.movedim(0, -2)


class ZeroPotential(Potential):
    """``V = 0``: the uncontrolled system (no parameters)."""

    def forward(self, q: Tensor) -> Tensor:
        self._check(q)
        return q.sum(-1) * 0.0

    def gradient(self, q: Tensor, *, create_graph: bool = False) -> Tensor:
        return torch.zeros_like(q)

    def hessian(self, q: Tensor) -> Tensor:
        return q.new_zeros(*q.shape, self.n)


class MLPPotential(Potential):
    """A tanh multilayer perceptron ``V_theta(q)``.

    The input is either the angles themselves or their Fourier features ``(sin q, cos q)``, which
    make ``V_theta`` ``2 pi``-periodic in every coordinate (right for revolute joints). Defaults are
    the eigenmode paper's public code: Fourier input, two hidden layers of 256, tanh, linear output;
    ``MLPPotential(n, depth=1, fourier=False)`` is the paper's Table 2. Initialisation: PyTorch's.

    Args:
        n: number of coordinates.
        hidden: width of the hidden layers.
        depth: number of hidden layers (>= 1).
        fourier: use ``(sin q, cos q)`` as input.
        dtype, device: of the parameters.
    """

    def __init__(self, n: int, hidden: int = 256, depth: int = 2, *, fourier: bool = True,
                 dtype: torch.dtype = torch.float32, device=None):
        super().__init__(n)
        if depth < 1 or hidden < 1:
            raise ShapeError(f"MLPPotential: depth and hidden must be >= 1, got depth={depth}, hidden={hidden}")
        self.fourier = bool(fourier)
        self.hidden = int(hidden)
        self.depth = int(depth)
        width_in = 2 * n if fourier else n
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width_in, hidden, dtype=dtype, device=device), nn.Tanh()]
            width_in = hidden
        layers.append(nn.Linear(width_in, 1, dtype=dtype, device=device))
        self.net = nn.Sequential(*layers)

    def features(self, q: Tensor) -> Tensor:
        """Network input ``(..., 2n)`` or ``(..., n)``."""
        return torch.cat([torch.sin(q), torch.cos(q)], -1) if self.fourier else q

    def forward(self, q: Tensor) -> Tensor:
        self._check(q)
        return self.net(self.features(q)).squeeze(-1)

    # Closed-form derivatives. The network is a chain ``a_1 = W_1 f(q) + b_1``, ``h_i = tanh(a_i)``,
    # ``a_{i+1} = W_{i+1} h_i + b_{i+1}``, ``V = w^T h_L + b``. The gradient is one backward sweep
    # ``g_i = dV/da_i = (1 - h_i^2) * W_{i+1}^T g_{i+1}`` contracted with ``da_1/dq``; the Hessian
    # pushes the ``n`` tangents ``da_i/dq`` forward and differentiates the backward sweep along them
    # (forward-over-reverse by hand). Written out, they are a handful of matrix products on the
    # whole batch with no autograd graph, where autograd's double backward replays the graph per
    # derivative order (several times slower on the small batches of a trajectory).
    def _linears(self) -> tuple[list[nn.Linear], nn.Linear]:
        lin = [m for m in self.net if isinstance(m, nn.Linear)]
        return lin[:-1], lin[-1]

    def derivatives(self, q: Tensor, order: int = 2) -> tuple[Tensor, ...]:
        """``(V (...), dV/dq (..., n)[, d^2V/dq^2 (..., n, n)])`` in closed form (``order`` 1 or 2).

        The results carry autograd graphs to the parameters (and to ``q``) only when grad mode is
        on and something requires grad; the Hessian is symmetric up to round-off.
        """
        self._check(q)
        lead = q.shape[:-1]
        n = self.n
        x = q.reshape(-1, n)
        hidden, out = self._linears()
        W1 = hidden[0].weight  # (H, 2n) or (H, n)
        if self.fourier:
            s, c = torch.sin(x), torch.cos(x)
            a = torch.addmm(hidden[0].bias, torch.cat([s, c], -1), W1.t())
            Ws, Wc = W1[:, :n].t(), W1[:, n:].t()  # (n, H)
            A = c.unsqueeze(-1) * Ws - s.unsqueeze(-1) * Wc  # da_1/dq, (B, n, H)
        else:
            a = torch.addmm(hidden[0].bias, x, W1.t())
            A = W1.t().expand(x.shape[0], n, W1.shape[0])
        hs = [torch.tanh(a)]
        for lin in hidden[1:]:
            hs.append(torch.tanh(torch.addmm(lin.bias, hs[-1], lin.weight.t())))
        V = torch.addmm(out.bias, hs[-1], out.weight.t()).squeeze(-1)
        ss = [1 - h.square() for h in hs]  # tanh' = 1 - tanh^2
        # backward sweep: r_i = dV/dh_i, g_i = dV/da_i
        rs = [out.weight.expand_as(hs[-1])]
        gs: list[Tensor] = []
        for i in range(len(hs) - 1, -1, -1):
            gs.insert(0, ss[i] * rs[0])
            if i > 0:
                rs.insert(0, gs[0] @ hidden[i].weight)
        grad = (A @ gs[0].unsqueeze(-1)).squeeze(-1)
        if order < 2:
            return V.reshape(lead), grad.reshape(*lead, n)
        # forward tangents dh_i/dq (B, n, H)
        dh = [ss[0].unsqueeze(1) * A]
        for i, lin in enumerate(hidden[1:], 1):
            dh.append(ss[i].unsqueeze(1) * (dh[-1] @ lin.weight.t()))
        # tangents of the backward sweep: dg_i = d(1 - h_i^2) r_i + (1 - h_i^2) dr_i, dr_L = 0
        dr = None
        for i in range(len(hs) - 1, -1, -1):
            dg = dh[i] * (-2 * hs[i] * rs[i]).unsqueeze(1)
            if dr is not None:
                dg = torch.addcmul(dg, ss[i].unsqueeze(1), dr)
            if i > 0:
                dr = dg @ hidden[i].weight
        Hs = A @ dg.transpose(-1, -2)  # (B, n, n): sum_k da_1k/dq_j d(g_1k)/dq_l
        if self.fourier:
            # the features' own curvature: d^2 sin q / dq^2 = -sin q, d^2 cos q / dq^2 = -cos q
            g1 = gs[0]
            Hs = Hs - torch.diag_embed(s * (g1 @ Ws.t()) + c * (g1 @ Wc.t()))
        return V.reshape(lead), grad.reshape(*lead, n), Hs.reshape(*lead, n, n)

    def gradient(self, q: Tensor, *, create_graph: bool = False) -> Tensor:
        with torch.set_grad_enabled(create_graph):
            g = self.derivatives(q, order=1)[1]
        return g if create_graph else g.detach()

    def hessian(self, q: Tensor) -> Tensor:
        with torch.no_grad():
            return self.derivatives(q, order=2)[2]

    def extra_repr(self) -> str:
        return f"n={self.n}, hidden={self.hidden}, depth={self.depth}, fourier={self.fourier}"
