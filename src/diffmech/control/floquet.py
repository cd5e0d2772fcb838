"""Cycle (Floquet) multipliers of a stabilised periodic orbit.

The monodromy matrix ``Phi = d phi_T / dx`` at a point ``x0`` of the orbit (``phi_T``: the closed-loop
flow over one period) is computed two ways and compared:

- by automatic differentiation of a fixed-step integration of the closed loop (one batched
  forward pass over ``2n`` copies of ``x0``, one backward pass with the identity as cotangents);
- by central finite differences of the same fixed-step flow, or of SciPy's adaptive solver.

The closed loop is autonomous, so ``Phi f(x0) = f(x0)``: one multiplier is 1 (perturbations along
the flow). It is identified by its eigenvector's alignment with ``f(x0)`` and excluded; the orbit is
locally orbitally asymptotically stable when all other multipliers lie inside the unit circle.

The energy feedback's direction ``p_hat = p / ||p||_{M^-1}`` flips where ``p`` passes through zero
(the turning points), so the field's Jacobian jumps there (the field itself is continuous on the
orbit, so the continuous flow stays differentiable). A fixed-step scheme whose stage lands on a
turning point is not differentiable at that start: with the start at ``T/4`` and the turning points
at ``T/2`` and ``T``, use an odd number of steps per period.
The paper's "ratio of partial derivatives" (spec 5.2, reconstructed) is :func:`ratio_multipliers`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .stabilize import ModeStabilizer, simulate, simulate_ivp

__all__ = ["monodromy_autodiff", "monodromy_fd", "multipliers", "ratio_multipliers", "orbit_point"]


def orbit_point(stab: ModeStabilizer, fraction: float = 0.25) -> Tensor:
    """``x*(fraction T)`` on the stored orbit (the MATLAB prototype used ``T/4``)."""
    orb = stab.orbit
    s = torch.tensor(fraction * orb.period, dtype=orb.x.dtype, device=orb.x.device)
    return orb.interpolate(s)[0]


def monodromy_autodiff(stab: ModeStabilizer, x0: Tensor, period: float | None = None, *, steps: int = 601,
                       method: str = "rk4") -> Tensor:
    """``d phi_T / dx (2n, 2n)`` by reverse-mode autodiff through a fixed-step integration."""
    T = stab.orbit.period if period is None else float(period)
    D = x0.shape[-1]
    xb = x0.detach().expand(D, D).clone().requires_grad_(True)
    with torch.enable_grad():
        _, X = simulate(lambda x: stab.field(x, create_graph=True), xb, T, steps, method=method)
        eye = torch.eye(D, dtype=x0.dtype, device=x0.device)
        (g,) = torch.autograd.grad(X[:, -1], xb, grad_outputs=eye)
    return g  # row i: gradient of component i of phi_T


def monodromy_fd(stab: ModeStabilizer, x0: Tensor, period: float | None = None, *, eps: float = 1e-6,
                 steps: int = 601, method: str = "rk4", ivp_rtol: float = 1e-11) -> Tensor:
    """``d phi_T / dx`` by central differences; ``method="ivp"`` uses ``solve_ivp`` (DOP853)."""
    T = stab.orbit.period if period is None else float(period)
    D = x0.shape[-1]
    E = torch.eye(D, dtype=x0.dtype, device=x0.device) * eps
    starts = torch.cat([x0.detach() + E, x0.detach() - E], 0)  # (2D, D)
    if method == "ivp":
        ends = torch.stack([simulate_ivp(stab.field, s, T, samples=2, rtol=ivp_rtol, atol=ivp_rtol)[1][-1]
                            for s in starts])
    else:
        with torch.no_grad():
            _, X = simulate(stab.field, starts, T, steps, method=method)
        ends = X[:, -1]
    return ((ends[:D] - ends[D:]) / (2 * eps)).T  # column j: response to a perturbation of x_j


def multipliers(monodromy: Tensor, flow_direction: Tensor) -> dict:
    """Eigenvalues of the monodromy matrix, the trivial one (eigenvector closest to the flow
    direction) separated from the others.

    Returns ``{"all", "trivial", "nontrivial", "moduli", "max_modulus", "alignment"}`` (numpy / floats).
    """
    Mn = monodromy.detach().cpu().double().numpy()
    w, V = np.linalg.eig(Mn)
    f = flow_direction.detach().cpu().double().numpy()
    f = f / max(np.linalg.norm(f), 1e-300)
    align = np.abs(V.conj().T @ f) / np.maximum(np.linalg.norm(V, axis=0), 1e-300)
    k = int(np.argmax(align))
    rest = np.delete(w, k)
    mod = np.abs(rest)
    return {"all": w, "trivial": complex(w[k]), "nontrivial": rest, "moduli": np.sort(mod)[::-1],
            "max_modulus": float(mod.max()) if len(mod) else 0.0, "alignment": float(align[k])}


def _orbit_error(stab: ModeStabilizer, x: Tensor) -> Tensor:
    n = stab.system.n
    _, qs, _, w = stab.orbit.reference(x[..., :n], x[..., n:])
    return torch.cat([x[..., :n] - qs, x[..., n:] - w], -1)


def ratio_multipliers(stab: ModeStabilizer, x0: Tensor, period: float | None = None, *, eps: float = 1e-3,
                      steps: int = 601, method: str = "rk4") -> np.ndarray:
    """Spec eq. (22), reconstructed: ``mu_i = d e_i(phi_T(x)) / dx_i  /  d e_i(x) / dx_i`` at ``x0``,
    with ``e(x) = (q - q*(s*), p - sigma p*(s*))`` the error to the orbit, by central differences."""
    T = stab.orbit.period if period is None else float(period)
    D = x0.shape[-1]
    E = torch.eye(D, dtype=x0.dtype, device=x0.device) * eps
    starts = torch.cat([x0.detach() + E, x0.detach() - E], 0)
    with torch.no_grad():
        if method == "ivp":
            ends = torch.stack([simulate_ivp(stab.field, s, T, samples=2)[1][-1] for s in starts])
        else:
            _, X = simulate(stab.field, starts, T, steps, method=method)
            ends = X[:, -1]
        e_end = _orbit_error(stab, ends)
        e_start = _orbit_error(stab, starts)
    num = (e_end[:D].diagonal() - e_end[D:].diagonal()) / (2 * eps)
    den = (e_start[:D].diagonal() - e_start[D:].diagonal()) / (2 * eps)
    return (num / den).cpu().numpy()
