"""Stabilising a learned eigenmode: energy control plus an energy-neutral mode-stabilising term.

The plant is the closed loop of :class:`~diffmech.control.hamiltonian.HamiltonianSystem`
(``H_theta = H + V_theta``) with an extra feedback ``u_s`` and optional viscous damping:

``q_dot = dH_theta/dp,  p_dot = -dH_theta/dq + u_E + u_M - b q_dot``.

- Energy control (spec 4.2): ``u_E = a_E (E* - H_theta) p_hat`` with ``p_hat = p / ||p||_{M^-1}``;
  its power is ``a_E (E* - H_theta) ||p||_{M^-1}``, so ``|H_theta - E*|`` never grows without damping.
- Mode stabilisation (spec 4.3): ``u_M = a_M Pi sigma p*(s*)`` with the projector
  ``Pi = I - p_hat p_hat^T M^{-1}``, which removes exactly the component that would change the
  energy (``q_dot^T u_M = 0``). ``s*(q)`` is the closest point of the stored orbit on the half
  period ``[0, T/2]`` and ``sigma = sign(p*(s*)^T p)`` picks the direction of travel. The
  unprojected variant ``a_M (sigma p*(s*) - p)`` is kept for comparison.

The closest point is found on a cubic Hermite interpolant of the orbit built from the exact
vector field at the samples, by a coarse search over samples and a safeguarded Newton iteration on
``(q*(s) - q) . q*'(s) = 0``; the returned ``s*`` is differentiable in ``q`` (implicit function
theorem, via one Newton step taken with the graph), so the whole closed loop can be differentiated
(monodromy matrices by autodiff, :mod:`~diffmech.control.floquet`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .. import _log
from .._progress import Stage
from ..errors import ShapeError
from .hamiltonian import HamiltonianSystem
from .verify import as_float64, integrate_ivp

__all__ = ["Orbit", "ModeStabilizer", "TrackingController", "simulate", "simulate_ivp", "signals"]

log = _log.get("eigenmode")


# ---------------------------------------------------------------------------- the stored orbit
class Orbit:
    """Samples of a periodic orbit ``x*(t)``, ``t in [0, T]``, with a C1 cubic Hermite interpolant.

    Args:
        t: (K,) uniform sample times from 0 to ``T``.
        x: (K, 2n) states; ``xdot``: (K, 2n) their time derivatives (exact vector field).
        energy: target energy ``E* = H_theta(q0, 0)``.
    """

    def __init__(self, t: Tensor, x: Tensor, xdot: Tensor, energy: float):
        if x.dim() != 2 or x.shape != xdot.shape or t.shape[0] != x.shape[0]:
            raise ShapeError("Orbit: t (K,), x (K, 2n) and xdot (K, 2n) expected")
        self.t, self.x, self.xdot = t, x, xdot
        self.n = x.shape[1] // 2
        self.period = float(t[-1] - t[0])
        self.dt = self.period / (t.shape[0] - 1)
        self.energy = float(energy)
        self.half = int(round((t.shape[0] - 1) / 2))
        # cubic Hermite pieces in tau = (s - t_i) / dt: y = c0 + c1 tau + c2 tau^2 + c3 tau^3
        y0, y1 = x[:-1], x[1:]
        d0, d1 = xdot[:-1] * self.dt, xdot[1:] * self.dt
        self.coef = torch.stack([y0, d0, 3 * (y1 - y0) - 2 * d0 - d1, 2 * (y0 - y1) + d0 + d1], 1)  # (K-1, 4, 2n)

    @classmethod
    def from_system(cls, system: HamiltonianSystem, q0, period: float, *, samples: int = 1001,
                    rtol: float = 1e-10, atol: float = 1e-10) -> Orbit:
        """Integrate the closed loop from ``(q0, 0)`` over one period (``solve_ivp``, float64).

        ``samples`` should be odd so that ``T/2`` is a sample.
        """
        sys64 = as_float64(system)
        n = sys64.n
        q0 = torch.as_tensor(q0, dtype=torch.float64).reshape(n)
        x0 = torch.cat([q0, torch.zeros_like(q0)])
        t = np.linspace(0.0, float(period), samples)
        sol = integrate_ivp(sys64, x0, float(period), t_eval=t, rtol=rtol, atol=atol)
        x = torch.from_numpy(sol.y.T.copy())
        G, _ = sys64.field(x)
        with torch.no_grad():
            E = float(sys64.hamiltonian(q0, torch.zeros_like(q0)))
        return cls(torch.from_numpy(t), x, G, E)

    def to(self, dtype: torch.dtype, device=None) -> Orbit:
        kw = dict(dtype=dtype, device=device)
        return Orbit(self.t.to(**kw), self.x.to(**kw), self.xdot.to(**kw), self.energy)

    # interpolation on [0, T]; s may carry a graph
    def _segment(self, s: Tensor) -> tuple[Tensor, Tensor]:
        K = self.t.shape[0]
        i = torch.clamp(torch.floor(s.detach() / self.dt), 0, K - 2).long()
        tau = s / self.dt - i.to(s.dtype)
        return i, tau

    def interpolate(self, s: Tensor, derivatives: int = 0) -> list[Tensor]:
        """``[x*(s), x*'(s), x*''(s)][: derivatives + 1]``, each ``(..., 2n)``; ``s`` in ``[0, T]``."""
        i, tau = self._segment(s)
        c = self.coef[i]  # (..., 4, 2n)
        c0, c1, c2, c3 = c.unbind(-2)
        t = tau.unsqueeze(-1)
        out = [((c3 * t + c2) * t + c1) * t + c0]
        if derivatives >= 1:
            out.append(((3 * c3 * t + 2 * c2) * t + c1) / self.dt)
        if derivatives >= 2:
            out.append((6 * c3 * t + 2 * c2) / self.dt ** 2)
        return out

    def closest(self, q: Tensor, *, iterations: int = 4) -> Tensor:
        """``s*(q) = argmin_{s in [0, T/2]} ||q - q*(s)||`` ``(...)``, differentiable in ``q``."""
        n = self.n
        qs = self.x[: self.half + 1, :n]
        d2 = (q.detach().unsqueeze(-2) - qs).square().sum(-1)
        j = d2.argmin(-1)
        lo = (torch.clamp(j - 1, min=0).to(q.dtype)) * self.dt
        hi = (torch.clamp(j + 1, max=self.half).to(q.dtype)) * self.dt
        s = j.to(q.dtype) * self.dt
        qd = q.detach()
        for _ in range(iterations):
            x, dx, ddx = self.interpolate(s, 2)
            r = x[..., :n] - qd
            phi = (r * dx[..., :n]).sum(-1)
            dphi = dx[..., :n].square().sum(-1) + (r * ddx[..., :n]).sum(-1)
            newton = s - phi / torch.where(dphi > 0, dphi, torch.ones_like(dphi))
            # where the distance is not locally convex, step to the bracket end phi points to
            fallback = torch.where(phi > 0, lo, hi)
            s = torch.where(dphi > 0, newton, fallback).clamp(lo, hi)
        # keep the best of the Newton point and the bracket ends (boundary minima, non-convex cases)
        cands = torch.stack([s, lo, hi], -1)
        xc = self.interpolate(cands)[0][..., :n]
        best = (xc - qd.unsqueeze(-2)).square().sum(-1).argmin(-1, keepdim=True)
        s = cands.gather(-1, best).squeeze(-1)
        if not q.requires_grad:
            return s
        # one Newton step with the graph: ds*/dq by the implicit function theorem at interior minima
        x, dx, ddx = self.interpolate(s, 2)
        r = x[..., :n] - q
        phi = (r * dx[..., :n]).sum(-1)
        dphi = dx[..., :n].square().sum(-1) + (r * ddx[..., :n]).sum(-1)
        interior = (s > 0) & (s < self.half * self.dt) & (dphi > 0)
        step = phi / torch.where(interior, dphi, torch.ones_like(dphi))
        return torch.where(interior, s - (step - step.detach()), s)

    def reference(self, q: Tensor, p: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """``(s*, q*(s*), sigma, sigma p*(s*))`` for states ``(q, p)``."""
        s = self.closest(q)
        xs = self.interpolate(s)[0]
        qs, ps = xs[..., : self.n], xs[..., self.n:]
        sigma = torch.sign((ps * p).sum(-1)).detach()
        return s, qs, sigma, sigma.unsqueeze(-1) * ps


# ---------------------------------------------------------------------------- controllers
@dataclass
class ModeStabilizer:
    """The stabilising feedback of the eigenmode paper on top of the closed loop ``H_theta``.

    Args:
        system: the closed loop (robot plus learned potential).
        orbit: the stored target orbit.
        gains: ``(alpha_E, alpha_M)``.
        damping: viscous damping ``b`` of the plant (N m s/rad), applied as ``-b q_dot``.
        projected: energy-neutral projected mode term (``False``: ``a_M (sigma p* - p)``).
        energy: target energy (default ``orbit.energy``).
    """

    system: HamiltonianSystem
    orbit: Orbit
    gains: tuple[float, float] = (1.0, 10.0)
    damping: float = 0.0
    projected: bool = True
    energy: float | None = None

    def __post_init__(self):
        if self.orbit.n != self.system.n:
            raise ShapeError(f"ModeStabilizer: orbit has {self.orbit.n} coordinates, system {self.system.n}")
        self.orbit = self.orbit.to(self.system.dtype, self.system.device)

    @property
    def target_energy(self) -> float:
        return self.orbit.energy if self.energy is None else float(self.energy)

    def terms(self, x: Tensor, *, create_graph: bool = False) -> dict[str, Tensor]:
        """Feedback terms and diagnostics at states ``x (..., 2n)``.

        With ``create_graph`` everything is differentiable in ``x`` (``sigma`` is piecewise constant).
        Keys: ``u_E``, ``u_M``, ``v`` (``q_dot``), ``G`` (closed-loop Hamiltonian field), ``H``, ``s``
        (closest orbit time), ``q_ref``, ``p_ref`` (``sigma p*(s*)``), ``sigma``, ``p_norm``
        (``||p||_{M^-1}``), ``power_E``, ``power_M``.
        """
        n = self.system.n
        ev = self.system.evaluate(x, create_graph=create_graph)
        if create_graph:
            q, p = x[..., :n], x[..., n:]
        else:
            q, p = x[..., :n].detach(), x[..., n:].detach()
        aE, aM = self.gains
        v, H = ev.v, ev.H
        pnorm2 = (p * v).sum(-1)
        pos = pnorm2 > 0
        safe2 = torch.where(pos, pnorm2, torch.ones_like(pnorm2))
        pnorm = torch.where(pos, safe2.sqrt(), torch.zeros_like(pnorm2))
        p_hat = torch.where(pos.unsqueeze(-1), p / safe2.sqrt().unsqueeze(-1), torch.zeros_like(p))
        uE = aE * (self.target_energy - H).unsqueeze(-1) * p_hat
        s, qs, sigma, w = self.orbit.reference(q, p)
        if self.projected:
            # Pi w = w - p_hat (p_hat^T M^-1 w) = w - p (v . w) / ||p||^2
            coef = torch.where(pos, (v * w).sum(-1) / safe2, torch.zeros_like(pnorm2))
            uM = aM * (w - coef.unsqueeze(-1) * p)
        else:
            uM = aM * (w - p)
        return {"u_E": uE, "u_M": uM, "v": v, "G": ev.G, "H": H, "s": s, "q_ref": qs, "p_ref": w, "sigma": sigma,
                "p_norm": pnorm, "power_E": (v * uE).sum(-1), "power_M": (v * uM).sum(-1)}

    def force(self, x: Tensor, *, create_graph: bool = False) -> Tensor:
        """``u_E + u_M - b q_dot (..., n)``: what the actuators add to ``-grad V_theta``."""
        t = self.terms(x, create_graph=create_graph)
        return t["u_E"] + t["u_M"] - self.damping * t["v"]

    def field(self, x: Tensor, *, create_graph: bool = False) -> Tensor:
        """Closed-loop vector field ``x_dot (..., 2n)``."""
        t = self.terms(x, create_graph=create_graph)
        u = t["u_E"] + t["u_M"] - self.damping * t["v"]
        return t["G"] + torch.cat([torch.zeros_like(u), u], -1)


@dataclass
class TrackingController:
    """Computed-torque PD tracking of the orbit's time parametrisation (for comparison).

    ``u = ID(q, qd, qdd*(t) + Kd (qd*(t) - qd) + Kp (q*(t) - q))`` (inverse dynamics of the plant,
    without any learned potential) makes the plant follow ``q*(t + t0)``; ``u`` is the total
    actuator force. ``qdd*`` is the closed loop's acceleration on the orbit (plant under
    ``-grad V_theta``).
    """

    system: HamiltonianSystem
    orbit: Orbit
    kp: float = 100.0
    kd: float = 20.0
    t0: float = 0.0

    def __post_init__(self):
        self.orbit = self.orbit.to(self.system.dtype, self.system.device)

    def desired(self, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """``q*, qd*, qdd*`` at times ``t (...)``."""
        n = self.system.n
        s = torch.remainder(t + self.t0, self.orbit.period)
        x = self.orbit.interpolate(s)[0]
        q, p = x[..., :n], x[..., n:]
        with torch.no_grad():
            qd = self.system.velocity(q, p)
            qdd = self.system.acceleration(q, qd, self.system.control_force(q))
        return q, qd, qdd

    def force(self, t: Tensor, x: Tensor) -> Tensor:
        n = self.system.n
        q, p = x[..., :n], x[..., n:]
        q_des, qd_des, qdd_des = self.desired(t)
        with torch.no_grad():
            qd = self.system.velocity(q, p)
            a = qdd_des + self.kd * (qd_des - qd) + self.kp * (q_des - q)
            return self.system.inverse_dynamics(q, qd, a)

    def field(self, t: Tensor, x: Tensor) -> Tensor:
        G, _ = self.system.field(x, closed_loop=False)
        u = self.force(t, x)
        return G + torch.cat([torch.zeros_like(u), u], -1)


# ---------------------------------------------------------------------------- simulation
def simulate(field, x0: Tensor, t_end: float, steps: int, *, method: str = "rk4", time_dependent: bool = False,
             progress: bool | None = None) -> tuple[Tensor, Tensor]:
    """Fixed-step integration of ``x_dot = field(x)`` (or ``field(t, x)``), batched, differentiable.

    ``progress``: ``None`` (default): silent while short; after 2 s a tqdm bar on stderr if it is a
    terminal, else INFO lines of the ``diffmech.eigenmode`` logger (sizes, then elapsed seconds);
    ``True``: a bar at once; ``False``: nothing (see :mod:`diffmech._progress`).

    Returns ``(t (steps + 1,), X (..., steps + 1, 2n))``.
    """
    h = float(t_end) / steps
    t = torch.linspace(0.0, float(t_end), steps + 1, dtype=x0.dtype, device=x0.device)
    f = field if time_dependent else (lambda tt, xx: field(xx))
    xs = [x0]
    x = x0
    stage = Stage(log, f"simulate ({method})", steps, progress=progress,
                  sizes=f"{steps} steps over {float(t_end):g} s, batch {tuple(x0.shape[:-1])}, state {x0.shape[-1]}")
    for k in range(steps):
        tk = t[k]
        if method == "rk4":
            k1 = f(tk, x)
            k2 = f(tk + h / 2, x + h / 2 * k1)
            k3 = f(tk + h / 2, x + h / 2 * k2)
            k4 = f(tk + h, x + h * k3)
            x = x + h / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
        elif method == "midpoint":
            x = x + h * f(tk + h / 2, x + h / 2 * f(tk, x))
        else:
            raise ValueError(f"simulate: method must be 'rk4' or 'midpoint', got {method!r}")
        xs.append(x)
        stage.update()
    stage.close()
    return t, torch.stack(xs, -2)


def simulate_ivp(field, x0: Tensor, t_end: float, *, samples: int = 1001, rtol: float = 1e-10, atol: float = 1e-10,
                 method: str = "DOP853", time_dependent: bool = False) -> tuple[Tensor, Tensor]:
    """``solve_ivp`` of ``x_dot = field(x)`` (float64); returns ``(t (K,), X (K, 2n))``."""
    from scipy.integrate import solve_ivp

    from ..errors import SimulationError

    dt, dev = x0.dtype, x0.device

    def f(t, y):
        x = torch.as_tensor(y, dtype=dt, device=dev)
        with torch.no_grad():
            out = field(torch.tensor(t, dtype=dt), x) if time_dependent else field(x)
        return out.cpu().numpy()

    ts = np.linspace(0.0, float(t_end), samples)
    sol = solve_ivp(f, (0.0, float(t_end)), x0.detach().cpu().numpy(), method=method, t_eval=ts, rtol=rtol, atol=atol)
    if not sol.success:
        raise SimulationError(f"simulate_ivp: {sol.message}")
    return torch.from_numpy(ts).to(dt), torch.from_numpy(sol.y.T.copy()).to(dt)


def signals(stab: ModeStabilizer, X: Tensor) -> dict[str, Tensor]:
    """Energy, distances to the orbit and injected powers along states ``X (..., 2n)``."""
    n = stab.system.n
    with torch.no_grad():
        t = stab.terms(X)
        q, p = X[..., :n], X[..., n:]
        return {"H": t["H"], "E_target": torch.full_like(t["H"], stab.target_energy),
                "dist_q": (q - t["q_ref"]).norm(dim=-1), "dist_p": (p - t["p_ref"]).norm(dim=-1),
                "power_E": t["power_E"], "power_M": t["power_M"], "s": t["s"], "sigma": t["sigma"],
                "u_E": t["u_E"], "u_M": t["u_M"], "q_ref": t["q_ref"], "p_ref": t["p_ref"]}
