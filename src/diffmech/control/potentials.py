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

__all__ = ["Potential", "MLPPotential", "ZeroPotential", "potential_gradient", "potential_hessian"]


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
        """``dV/dq (..., n)``; with ``create_graph`` the result is differentiable (double backprop)."""
        return potential_gradient(self, q, create_graph=create_graph)

    def hessian(self, q: Tensor) -> Tensor:
        """``d^2 V / dq^2 (..., n, n)`` (no graph)."""
        return potential_hessian(self, q)


def potential_gradient(potential: nn.Module, q: Tensor, *, create_graph: bool = False) -> Tensor:
    """``dV/dq (..., n)`` of any module ``q -> V``.

    Without ``create_graph`` the result is detached (the parameters' graph is dropped); with it the
    result carries a graph to ``q`` (when it has one) and to the module's parameters.
    """
    with torch.enable_grad():
        if create_graph and q.requires_grad:
            qq = q
        else:
            qq = q.detach().requires_grad_(True)
        V = potential(qq)
        (g,) = torch.autograd.grad(V.sum(), qq, create_graph=create_graph)
    return g


def potential_hessian(potential: nn.Module, q: Tensor) -> Tensor:
    """``d^2 V / dq^2 (..., n, n)`` of any module ``q -> V``, batched over the leading dims."""
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

    def extra_repr(self) -> str:
        return f"n={self.n}, hidden={self.hidden}, depth={self.depth}, fourier={self.fourier}"
