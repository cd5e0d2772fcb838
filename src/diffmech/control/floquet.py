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
at ``T/2`` and ``T``, use an odd number of steps per period. Near a turning point the closest-point
map ``q -> s*(q)`` (and with it ``p*(s*(q))``) also has a square-root singularity, because the orbit's
speed vanishes there; finite differences lose accuracy around it, so compare the two monodromy
matrices on the limit cycle (:func:`limit_cycle`), where the feedback vanishes.
The paper's "ratio of partial derivatives" (spec 5.2, reconstructed) is :func:`ratio_multipliers`.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..errors import ConvergenceError
from .stabilize import ModeStabilizer, simulate, simulate_ivp

__all__ = ["monodromy_autodiff", "monodromy_fd", "multipliers", "ratio_multipliers", "orbit_point", "limit_cycle"]


def orbit_point(stab: ModeStabilizer, fraction: float = 0.25) -> Tensor:
    """``x*(fraction T)`` on the stored orbit (the MATLAB prototype used ``T/4``)."""
    orb = stab.orbit
    s = torch.tensor(fraction * orb.period, dtype=orb.x.dtype, device=orb.x.device)
    return orb.interpolate(s)[0]


def limit_cycle(stab: ModeStabilizer, x0: Tensor | None = None, *, periods: int = 4, steps: int = 601,
                method: str = "rk4") -> dict:
    """The closed loop's own periodic orbit near the stored one, and its period.

    A learned mode is periodic only up to the training's accuracy, so the stored orbit is not exactly
    invariant under the controller; the attracting limit cycle next to it is. It is reached by
    integrating ``periods`` periods from ``x0`` (default ``x*(T/4)``); its period is the return time to
    the hyperplane through the final point normal to the flow (fixed steps, then a secant
    refinement of the last step).

    Returns:
        ``{"x0", "period", "return_error", "gap"}``: a point on the cycle, its period (s), the
        distance between that point and the state one period later (convergence check) and the
        largest distance between the cycle and the stored orbit in ``q``.
    """
    T = stab.orbit.period
    h = T / steps
    x = orbit_point(stab, 0.25) if x0 is None else x0.detach()
    with torch.no_grad():
        _, X = simulate(stab.field, x, periods * T, periods * steps, method=method)
        xc = X[-1]
        fc = stab.field(xc)
        m = int(1.5 * steps)
        _, Y = simulate(stab.field, xc, m * h, m, method=method)
        g = (Y - xc) @ fc
        k0 = steps // 2
        idx = [k for k in range(k0, Y.shape[0]) if g[k - 1] < 0 <= g[k]]
        if not idx:
            raise ConvergenceError("limit_cycle: the trajectory does not return to its section within 1.5 periods")
        k = idx[0]
        # secant on the section function over the last step
        a, b = 0.0, h
        ga, gb = float(g[k - 1]), float(g[k])
        for _ in range(8):
            tau = a - ga * (b - a) / (gb - ga)
            _, Z = simulate(stab.field, Y[k - 1], tau, 1, method=method) if tau > 0 else (None, Y[k - 1 : k])
            gt = float((Z[-1] - xc) @ fc)
            if abs(gt) < 1e-14 * max(1.0, float(fc.norm()) ** 2):
                break
            if gt < 0:
                a, ga = tau, gt
            else:
                b, gb = tau, gt
        Tc = (k - 1) * h + tau
        ret = float((Z[-1] - xc).norm())
        nq = stab.system.n
        gap = float(stab.terms(Y[: int(Tc / h) + 1])["q_ref"].sub(Y[: int(Tc / h) + 1, :nq]).norm(dim=-1).max())
    return {"x0": xc, "period": float(Tc), "return_error": ret, "gap": gap}


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
