"""High-accuracy checks of a learned mode with SciPy's adaptive solvers.

The fixed-step grid used in training can be exploited by the optimiser (a trajectory that is
periodic only for the coarse scheme); every trained potential is therefore re-integrated from
``(q0, 0)`` with ``solve_ivp`` (DOP853, ``rtol = atol = 1e-10`` by default) in float64 and judged
on the continuous flow: periodicity after ``T``, ``p(T/2)``, time-reversal symmetry
``q(t) = q(T - t)``, line-shapedness of the configuration trace, end-effector error at ``T/2`` and
the control effort ``int_0^T ||grad V_theta||^2 dt``.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from torch import Tensor

from ..errors import ConvergenceError, SimulationError
from .hamiltonian import HamiltonianSystem

__all__ = ["as_float64", "ivp_field", "integrate_ivp", "verify_mode", "line_shape", "linear_modes", "equilibrium",
           "natural_eigenmode"]


def as_float64(system: HamiltonianSystem) -> HamiltonianSystem:
    """A float64 copy of ``system`` (robot and potential), for oracle-grade integration."""
    if system.dtype == torch.float64:
        return system
    return copy.deepcopy(system).to(torch.float64)


def ivp_field(system: HamiltonianSystem, *, closed_loop: bool = True, effort: bool = False,
              control: Callable[[Tensor], Tensor] | None = None) -> Callable[[float, np.ndarray], np.ndarray]:
    """``f(t, y)`` for ``solve_ivp``: the Hamiltonian field in physical time, float64.

    Args:
        system: the (float64) system.
        closed_loop: include ``V_theta``.
        effort: append ``l' = ||grad V_theta(q)||^2`` to the state.
        control: extra generalised force ``u(x) (2n,) -> (n,)`` added to ``p_dot``.
    """
    n = system.n
    dt, dev = system.dtype, system.device

    def f(t, y):
        x = torch.as_tensor(y[: 2 * n], dtype=dt, device=dev)
        G, _ = system.field(x, closed_loop=closed_loop)
        parts = [G]
        if control is not None:
            with torch.no_grad():
                u = control(x)
            parts[0] = G + torch.cat([torch.zeros_like(u), u])
        if effort:
            g = system.potential.gradient(x[:n])
            parts.append(g.square().sum().reshape(1))
        return torch.cat(parts).cpu().numpy()

    return f


def integrate_ivp(system: HamiltonianSystem, x0, t_end: float, *, t_eval=None, closed_loop: bool = True,
                  effort: bool = False, control=None, rtol: float = 1e-10, atol: float = 1e-10,
                  method: str = "DOP853", dense: bool = False):
    """``solve_ivp`` of the system's flow from ``x0`` over ``[0, t_end]``; raises on failure."""
    from scipy.integrate import solve_ivp

    y0 = np.asarray(torch.as_tensor(x0, dtype=torch.float64).cpu().numpy(), dtype=float)
    if effort:
        y0 = np.concatenate([y0, [0.0]])
    sol = solve_ivp(ivp_field(system, closed_loop=closed_loop, effort=effort, control=control), (0.0, float(t_end)),
                    y0, method=method, t_eval=t_eval, rtol=rtol, atol=atol, dense_output=dense)
    if not sol.success:
        raise SimulationError(f"integrate_ivp: solve_ivp ({method}) failed: {sol.message}")
    return sol


def line_shape(q: np.ndarray) -> dict:
    """Is the half-period trace ``q (K, n)`` (from one turning point to the other) a simple arc?

    Returns the smallest ratio of chord to arc length between points at least a tenth of the arc
    apart (close to 0 for a trace that loops back on itself; 1 for a straight segment) and, in the
    plane, the number of crossings of non-adjacent segments.
    """
    seg = np.linalg.norm(np.diff(q, axis=0), axis=1)
    s = np.concatenate([[0.0], np.cumsum(seg)])
    length = s[-1]
    out = {"arc_length": float(length), "min_chord_ratio": 1.0, "self_intersections": 0}
    if length <= 0:
        return out
    idx = np.linspace(0, len(q) - 1, min(len(q), 400)).astype(int)
    qs, ss = q[idx], s[idx]
    ds = np.abs(ss[:, None] - ss[None, :])
    chord = np.linalg.norm(qs[:, None] - qs[None, :], axis=-1)
    mask = ds > 0.1 * length
    if mask.any():
        out["min_chord_ratio"] = float((chord[mask] / ds[mask]).min())
    if q.shape[1] == 2:
        out["self_intersections"] = _crossings(qs)
    return out


def _crossings(p: np.ndarray) -> int:
    a, b = p[:-1], p[1:]
    count = 0
    for i in range(len(a)):
        j = np.arange(i + 2, len(a))
        if not len(j):
            continue
        d1, d2 = b[i] - a[i], b[j] - a[j]
        den = d1[0] * d2[:, 1] - d1[1] * d2[:, 0]
        ok = np.abs(den) > 1e-15
        w = a[j] - a[i]
        t = np.where(ok, (w[:, 0] * d2[:, 1] - w[:, 1] * d2[:, 0]) / np.where(ok, den, 1), -1)
        u = np.where(ok, (w[:, 0] * d1[1] - w[:, 1] * d1[0]) / np.where(ok, den, 1), -1)
        count += int(((t > 1e-9) & (t < 1 - 1e-9) & (u > 1e-9) & (u < 1 - 1e-9)).sum())
    return count


def verify_mode(system: HamiltonianSystem, q0, period: float, target=None, *, samples: int = 2001,
                rtol: float = 1e-10, atol: float = 1e-10, method: str = "DOP853") -> tuple[dict, dict]:
    """Re-integrate the closed loop from ``(q0, 0)`` over one period and measure the mode.

    Returns:
        ``(metrics, trajectory)``: metrics (floats; distances in m, angles in rad, momenta in
        kg m^2/s, effort in N^2 m^2 s) and the sampled trajectory (``t``, ``q``, ``p``, ``ee``, ``H``,
        ``u``, ``effort``; numpy arrays).
    """
    sys64 = as_float64(system)
    n = sys64.n
    q0 = torch.as_tensor(q0, dtype=torch.float64).reshape(n)
    x0 = torch.cat([q0, torch.zeros_like(q0)])
    T = float(period)
    t = np.linspace(0.0, T, samples)
    sol = integrate_ivp(sys64, x0, T, t_eval=t, effort=True, rtol=rtol, atol=atol, method=method)
    Y = sol.y.T
    q, p, ell = Y[:, :n], Y[:, n:2 * n], Y[:, 2 * n]
    qt, pt = torch.from_numpy(q), torch.from_numpy(p)
    with torch.no_grad():
        H = sys64.hamiltonian(qt, pt).numpy()
        ee = sys64.end_effector(qt).numpy()
        u = -sys64.potential.gradient(qt).numpy()
    ih = samples // 2
    pnorm = np.linalg.norm(p, axis=1)
    x_end = Y[-1, : 2 * n]
    metrics = {
        "period": T,
        "periodicity_error": float(np.linalg.norm(x_end - x0.numpy())),
        "periodicity_error_q": float(np.linalg.norm(q[-1] - q[0])),
        "periodicity_error_p": float(np.linalg.norm(p[-1] - p[0])),
        "p_half_norm": float(pnorm[ih]),
        "p_half_relative": float(pnorm[ih] / max(pnorm.max(), 1e-300)),
        "p_max": float(pnorm.max()),
        "symmetry_error_q": float(np.abs(q - q[::-1]).sum(1).max()),
        "symmetry_error_p": float(np.abs(p + p[::-1]).sum(1).max()),
        "effort": float(ell[-1]),
        "energy_drift": float(np.abs(H - H[0]).max()),
        "nfev": int(sol.nfev),
        "solver": f"solve_ivp {method} rtol={rtol:g} atol={atol:g}",
    }
    shape = line_shape(q[: ih + 1])
    metrics.update({f"line_{k}": v for k, v in shape.items()})
    metrics["line_shaped"] = bool(metrics["symmetry_error_q"] <= 1e-2 and shape["self_intersections"] == 0
                                  and shape["min_chord_ratio"] > 0.05)
    if target is not None:
        tgt = np.asarray(torch.as_tensor(target, dtype=torch.float64).cpu().numpy())
        metrics["ee_error_half_period"] = float(np.linalg.norm(ee[ih] - tgt))
        metrics["ee_half_period"] = ee[ih].tolist()
        metrics["target"] = tgt.tolist()
    traj = {"t": t, "q": q, "p": p, "ee": ee, "H": H, "u": u, "effort": ell}
    return metrics, traj


# ---------------------------------------------------------------------------- natural modes
def equilibrium(system: HamiltonianSystem, q_guess, *, closed_loop: bool = False, tol: float = 1e-12,
                max_iter: int = 50) -> Tensor:
    """A stationary point of the potential (``U`` or ``U + V_theta``) by Newton from ``q_guess``, float64."""
    sys64 = as_float64(system)
    q = torch.as_tensor(q_guess, dtype=torch.float64).clone()
    n = sys64.n
    for _ in range(max_iter):
        x = torch.cat([q, torch.zeros_like(q)])
        G, J = sys64.field(x, jacobian=True, closed_loop=closed_loop)
        grad = -G[n:]
        K = -J[n:, :n]
        step = torch.linalg.solve(K, grad)
        q = q - step
        if float(step.abs().max()) < tol:
            return q
    raise ConvergenceError(f"equilibrium: no convergence from {q_guess} in {max_iter} iterations")


def linear_modes(system: HamiltonianSystem, q_eq, *, closed_loop: bool = False) -> dict:
    """Small-oscillation modes about the equilibrium ``q_eq``: periods (s, ascending) and shapes."""
    sys64 = as_float64(system)
    q = torch.as_tensor(q_eq, dtype=torch.float64)
    n = sys64.n
    _, J = sys64.field(torch.cat([q, torch.zeros_like(q)]), jacobian=True, closed_loop=closed_loop)
    K = -J[n:, :n]
    M = sys64.mass_matrix(q)
    w2, vecs = torch.linalg.eig(torch.linalg.solve(M, K))
    w2 = w2.real
    order = torch.argsort(w2, descending=True)
    w2, vecs = w2[order], vecs.real[:, order]
    return {"omega2": w2, "periods": 2 * torch.pi / w2.clamp_min(1e-300).sqrt(), "shapes": vecs}


def natural_eigenmode(system: HamiltonianSystem, q0_guess, half_period_guess: float, *, fix: int = 0,
                      closed_loop: bool = False, tol: float = 1e-10, max_iter: int = 30, rtol: float = 1e-11
                      ) -> dict:
    """An eigenmode of the conservative system by shooting: find ``q0`` (coordinate ``fix`` held)
    and the half period ``t*`` with ``p(t*) = 0`` from ``(q0, 0)``; then ``T = 2 t*`` (Lemma 2.3).

    Returns ``{"q0", "period", "residual", "iterations"}`` (float64 tensors / floats).
    """
    sys64 = as_float64(system)
    n = sys64.n
    if not -n <= fix < n:
        raise ValueError(f"natural_eigenmode: fix must index one of the {n} coordinates, got {fix}")
    fix = fix % n
    q0 = torch.as_tensor(q0_guess, dtype=torch.float64).clone()
    free = [i for i in range(n) if i != fix]

    def shoot(z: np.ndarray) -> np.ndarray:
        q = q0.clone()
        q[free] = torch.as_tensor(z[:-1])
        sol = integrate_ivp(sys64, torch.cat([q, torch.zeros_like(q)]), z[-1], closed_loop=closed_loop,
                            rtol=rtol, atol=rtol)
        return sol.y[n:2 * n, -1]

    z = np.concatenate([q0[free].numpy(), [float(half_period_guess)]])
    for it in range(max_iter):
        r = shoot(z)
        if np.abs(r).max() < tol:
            q = q0.clone()
            q[free] = torch.as_tensor(z[:-1])
            return {"q0": q, "period": 2 * float(z[-1]), "residual": float(np.abs(r).max()), "iterations": it}
        Jm = np.empty((n, n))
        for j in range(n):
            e = np.zeros(n)
            e[j] = 1e-6
            Jm[:, j] = (shoot(z + e) - shoot(z - e)) / 2e-6
        z = z - np.linalg.solve(Jm, r)
    raise ConvergenceError(f"natural_eigenmode: shooting did not converge in {max_iter} iterations "
                           f"(residual {np.abs(r).max():.3e})")
