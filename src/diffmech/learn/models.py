"""Learned dynamics models of the seed paper: NODE, L-NODE, SyMo and E2E-SyMo.

All four map one-step samples (:class:`~.data.StepSamples`) to a training objective, predict the
next observation and roll out long trajectories; the two SyMo models learn a discrete Lagrangian
from positions only.

- :class:`NODE`: an MLP ``(embed(q), v, u) -> q''`` integrated by one explicit step (RK4 or
  midpoint); loss: MSE of the next full state.
- :class:`LNODE`: the Lagrangian prior ``q'' = H^{-1}(tau - c(q, v) - dV/dq)`` with ``H``, ``V``
  from :class:`~.networks.LagrangianNet`; same integrators and loss.
- :class:`SyMo`: the discrete Lagrangian ``L_d(a, b) = h L(q_bar, v_bar)`` (midpoint rule,
  ``q_bar = (a + b)/2``, ``v_bar = (b - a)/h``) and the forced discrete Euler-Lagrange residual
  ``g(q_next) = D2 L_d(q_prev, q) + D1 L_d(q, q_next) + (h/4)(tau_prev + 2 tau + tau_next)``;
  loss: ``mean(g^2)`` on the observed ``q_next``; prediction: Newton on ``g``.
- :class:`E2ESyMo`: the same residual, with the root ``q_next = root(g)`` computed inside the
  training loop by :func:`diffmech.implicit.newton_solve` (backward by the implicit function
  theorem); loss: MSE of the predicted positions.

Newton here is batched and exact: the residual and its Jacobian come from one pass of the network
carrying analytic second derivatives (no row-by-row autograd, no copy of the network), and every
solve reports per-sample convergence. E2E-SyMo's implicit backward pass contracts the residual with
its adjoint vector before differentiating (:meth:`_DELModel.weighted_del_residual`): one directional
derivative of the network per midpoint, from the activations kept from the forward evaluations.
With ``dissipation=True`` the Lagrangian models also learn a constant Rayleigh dissipation
``R = v^T D v / 2``, ``D = L_D L_D^T``; its force ``-D v`` enters the continuous dynamics (L-NODE) or
the discrete forces at the step midpoints (SyMo).

Training-time quirks of the seed kept by default: NODE and L-NODE train with torchdiffeq's
``rk4`` (the 3/8 rule) and are evaluated with classic RK4; the 1-DoF inertia is
``softplus(z)`` (``inertia="paper"``).
"""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..errors import ShapeError
from ..implicit import NewtonStatus, newton_solve
from .data import StepSamples
from .e2e_native import native_objective, native_solve
from .networks import MLP, AngleEmbedding, LagrangianNet

__all__ = ["LearnedDynamics", "NODE", "LNODE", "SyMo", "E2ESyMo", "Prediction", "Rollout", "build_model",
           "MODEL_NAMES"]

MODEL_NAMES = ("node-rk4", "node-midpoint", "lnode-rk4", "lnode-midpoint", "symo", "e2e-symo")


class Prediction(NamedTuple):
    """One-step prediction: ``q (M, n)``, ``v (M, n)`` (``None`` for SyMo models, which predict positions
    only), ``converged (M,)`` bool (all true for explicit models) and Newton ``iterations``."""

    q: Tensor
    v: Tensor | None
    converged: Tensor
    iterations: int


class Rollout(NamedTuple):
    """A long rollout: ``q, v (B, T, n)``; ``v`` is the seed's velocity (SyMo: backward difference
    ``(q_k - q_{k-1})/h``), ``v_consistent`` the model's own velocity at the node (SyMo: the
    discrete Legendre transform ``H(q_k)^{-1} p_k``); ``failures (B,)`` counts non-converged Newton
    steps per trajectory (their last iterate was used), ``iterations`` the total Newton iterations."""

    q: Tensor
    v: Tensor
    v_consistent: Tensor
    failures: Tensor
    iterations: int


class Dissipation(nn.Module):
    """Constant Rayleigh dissipation matrix ``D = L L^T`` (``L``: softplus diagonal, free strictly lower part)."""

    def __init__(self, n: int, init: float = 1e-3):
        super().__init__()
        # softplus(rho)^2 = init
        self.rho = nn.Parameter(torch.full((n,), float(torch.log(torch.expm1(torch.tensor(init) ** 0.5)))))
        self.lower = nn.Parameter(torch.zeros(n * (n - 1) // 2))
        self.n = n

    def matrix(self) -> Tensor:
        n = self.n
        L = torch.diag_embed(F.softplus(self.rho))
        if n > 1:
            r, c = torch.tril_indices(n, n, -1, device=L.device)
            L = L.index_put((r, c), self.lower)
        return L @ L.T

    def force(self, v: Tensor) -> Tensor:
        """``-D v`` for ``v (..., n)``."""
        return -(v @ self.matrix().T)


class LearnedDynamics(nn.Module):
    """Common interface. Subclasses define ``objective``, ``predict`` and ``rollout``.

    Args:
        n: degrees of freedom.
        h: time step, s.
        input_matrix: (n, nu) ``tau = B u`` (default identity).
    """

    uses_newton = False
    lagrangian = False

    def __init__(self, n: int, h: float, input_matrix=None):
        super().__init__()
        self.n, self.h = int(n), float(h)
        B = torch.eye(n) if input_matrix is None else torch.as_tensor(input_matrix, dtype=torch.float32)
        if B.dim() != 2 or B.shape[0] != n:
            raise ShapeError(f"{type(self).__name__}: input_matrix must be ({n}, nu), got {tuple(B.shape)}")
        self.register_buffer("input_matrix", B.to(torch.get_default_dtype()))
        self.nu = int(B.shape[1])

    def tau(self, u: Tensor) -> Tensor:
        return u @ self.input_matrix.to(u.dtype).T

    def inertia(self, q: Tensor) -> Tensor | None:  # pragma: no cover - overridden by Lagrangian models
        return None


# ---------------------------------------------------------------------------- explicit (ODE) models
_RK4_38 = "rk4-38"


def _ode_step(f, q: Tensor, v: Tensor, h: float, method: str) -> tuple[Tensor, Tensor]:
    """One explicit step of ``(q, v)' = (v, f(q, v))``: ``rk4`` (classic), ``rk4-38`` (3/8 rule) or ``midpoint``."""
    if method == "midpoint":
        a1 = f(q, v)
        qm, vm = q + 0.5 * h * v, v + 0.5 * h * a1
        return q + h * vm, v + h * f(qm, vm)
    if method == "rk4":
        a1 = f(q, v)
        q2, v2 = q + 0.5 * h * v, v + 0.5 * h * a1
        a2 = f(q2, v2)
        q3, v3 = q + 0.5 * h * v2, v + 0.5 * h * a2
        a3 = f(q3, v3)
        q4, v4 = q + h * v3, v + h * a3
        a4 = f(q4, v4)
        return q + h / 6 * (v + 2 * v2 + 2 * v3 + v4), v + h / 6 * (a1 + 2 * a2 + 2 * a3 + a4)
    if method == _RK4_38:
        # torchdiffeq's fixed-grid "rk4" (rk4_alt_step_func)
        a1 = f(q, v)
        q2, v2 = q + h * v / 3, v + h * a1 / 3
        a2 = f(q2, v2)
        q3, v3 = q + h * (v2 - v / 3), v + h * (a2 - a1 / 3)
        a3 = f(q3, v3)
        q4, v4 = q + h * (v - v2 + v3), v + h * (a1 - a2 + a3)
        a4 = f(q4, v4)
        return q + h * (v + 3 * (v2 + v3) + v4) / 8, v + h * (a1 + 3 * (a2 + a3) + a4) / 8
    raise ShapeError(f"unknown integrator {method!r}; use 'rk4', 'rk4-38' or 'midpoint'")


class _ODEModel(LearnedDynamics, metaclass=ABCMeta):
    """Shared code of NODE and L-NODE: one explicit step per sample, full-state MSE."""

    def __init__(self, n, h, input_matrix, integrator: str, train_integrator: str | None):
        super().__init__(n, h, input_matrix)
        if integrator not in ("rk4", "midpoint"):
            raise ShapeError(f"{type(self).__name__}: integrator must be 'rk4' or 'midpoint', got {integrator!r}")
        self.integrator = integrator
        self.train_integrator = train_integrator or (_RK4_38 if integrator == "rk4" else "midpoint")

    @abstractmethod
    def acceleration(self, q: Tensor, v: Tensor, u: Tensor) -> Tensor:
        """``qdd (B, n)`` of the learned vector field; each subclass (NODE, L-NODE) defines its own."""

    def step(self, q: Tensor, v: Tensor, u: Tensor, method: str | None = None) -> tuple[Tensor, Tensor]:
        return _ode_step(lambda a, b: self.acceleration(a, b, u), q, v, self.h, method or self.integrator)

    def objective(self, b: StepSamples):
        q1, v1 = self.step(b.q, b.v, b.u, self.train_integrator)
        loss = ((q1 - b.q_next).square().sum() + (v1 - b.v_next).square().sum()) / (2 * q1.numel())
        return loss, {"q": q1.detach(), "v": v1.detach(), "iterations": 0}

    @torch.no_grad()
    def predict(self, b: StepSamples, *, training_step: bool = True, **_) -> Prediction:
        q1, v1 = self.step(b.q, b.v, b.u, self.train_integrator if training_step else self.integrator)
        return Prediction(q1, v1, torch.ones(q1.shape[0], dtype=torch.bool, device=q1.device), 0)

    @torch.no_grad()
    def rollout(self, q0: Tensor, q1: Tensor, v1: Tensor, u: Tensor, n_steps: int, **_) -> Rollout:
        """From the full state ``(q1, v1) (B, n)`` (``q0`` unused), ``n_steps`` classic steps with
        controls ``u (B, >= n_steps + 2, nu)`` (``u[:, k + 2]`` drives the step to observation ``k + 2``,
        as in the seed's samples)."""
        qs, vs = [], []
        q, v = q1, v1
        for k in range(n_steps):
            q, v = self.step(q, v, u[:, k + 1], self.integrator)
            qs.append(q)
            vs.append(v)
        Q, Vv = torch.stack(qs, 1), torch.stack(vs, 1)
        return Rollout(Q, Vv, Vv, torch.zeros(q1.shape[0], dtype=torch.long, device=q1.device), 0)


class NODE(_ODEModel):
    """Neural ODE: ``q'' = MLP(embed(q), v, u)`` (the seed's ``NODE_T``/``NODE_RT``).

    Args:
        angle_mask: (n,) coordinates embedded as ``(cos, sin)``.
        h: time step, s.
        width: hidden width (seed: 128 pendulum, 256 cart-pole).
        integrator: ``"rk4"`` or ``"midpoint"`` (evaluation; training uses ``train_integrator``,
            default the seed's: torchdiffeq's 3/8-rule RK4 or midpoint).
        input_matrix: (n, nu); NODE reads ``u`` itself (nu inputs), not ``tau``.
    """

    def __init__(self, angle_mask, h: float, width: int = 128, integrator: str = "rk4", input_matrix=None,
                 train_integrator: str | None = None):
        n = len(tuple(angle_mask))
        super().__init__(n, h, input_matrix, integrator, train_integrator)
        self.embed = AngleEmbedding(angle_mask)
        self.mlp = MLP(self.embed.n_out + n + self.nu, width, n)

    def acceleration(self, q, v, u):
        return self.mlp(torch.cat([self.embed(q), v, u], -1))


class LNODE(_ODEModel):
    """Lagrangian neural ODE (Deep Lagrangian Networks): ``q'' = H^{-1}(tau - c - dV/dq [- D v])``.

    ``c = (d(H v)/dq) v - d(v^T H v / 2)/dq`` from the analytic first derivatives of
    :class:`~.networks.LagrangianNet`.
    """

    lagrangian = True

    def __init__(self, angle_mask, h: float, width: int = 128, integrator: str = "rk4", input_matrix=None,
                 train_integrator: str | None = None, inertia: str = "paper", dissipation: bool = False):
        n = len(tuple(angle_mask))
        super().__init__(n, h, input_matrix, integrator, train_integrator)
        self.net = LagrangianNet(angle_mask, width, inertia)
        self.dissipation = Dissipation(n) if dissipation else None

    def inertia(self, q):
        return self.net(q)[0]

    def acceleration(self, q, v, u):
        rhs = self.tau(u)
        if self.dissipation is not None:
            rhs = rhs + self.dissipation.force(v)
        if self.n == 1:
            _, dV, _, H, dH, _ = self.net.jet_scalar(q, 1)
            vs = v[..., 0]
            # c = (dH v) v - (dH v^2)/2 = dH v^2 / 2
            return (rhs[..., 0] - 0.5 * dH * vs * vs - dV)[..., None] / H[..., None]
        # with H = L L^T + eps I, w = L^T v and a_k = (dL/dq_k)^T v: (dH/dq_k) v = (dL/dq_k) w + L a_k and
        # v^T (dH/dq_i) v / 2 = a_i . w, so c_i = sum_k ((dH/dq_k) v)_i v_k - a_i . w
        _, dV, _, L = self.net.factor_jet(q, 1)
        n = self.n
        y = (L.mT @ v[..., :, None])[..., 0]  # (1 + n, ..., n)
        w, a = y[0], y[1:1 + n]
        dHv = (L[1:1 + n] @ w[..., None])[..., 0] + (L[0] @ a[..., None])[..., 0]  # (n(k), ..., n(i))
        c = (dHv * v.movedim(-1, 0)[..., None]).sum(0) - (a * w).sum(-1).movedim(0, -1)
        H = L[0] @ L[0].mT + self.net.eps * torch.eye(n, dtype=q.dtype, device=q.device)
        return torch.linalg.solve(H, rhs - c - dV.movedim(0, -1))


# ---------------------------------------------------------------------------- discrete (SyMo) models
class _DELModel(LearnedDynamics):
    """The discrete Lagrangian ``L_d`` of a :class:`~.networks.LagrangianNet` and its forced DEL residual."""

    lagrangian = True
    uses_newton = True
    straggler_iter = 4
    # the implicit backward pass by :meth:`weighted_del_residual` (False: autograd through :meth:`del_residual`)
    fast_vjp = True

    def __init__(self, angle_mask, h: float, width: int = 128, input_matrix=None, inertia: str = "paper",
                 dissipation: bool = False, tol: float = 1e-5, max_iter: int = 10, line_search: bool = False):
        n = len(tuple(angle_mask))
        super().__init__(n, h, input_matrix)
        self.net = LagrangianNet(angle_mask, width, inertia)
        self.dissipation = Dissipation(n) if dissipation else None
        self.tol, self.max_iter, self.line_search = tol, max_iter, line_search

    def inertia(self, q):
        return self.net(q)[0]

    # D1 L_d(a, b) = (h/2) phi - H v_bar and D2 L_d(a, b) = (h/2) phi + H v_bar, with
    # phi_k = v_bar^T (dH/dq_k) v_bar / 2 - dV/dq_k at q_bar: (half_h_phi, p) of one step.
    def _step_terms(self, a: Tensor, b: Tensor):
        """``((h/2) phi, H v_bar, v_bar, ||H||)`` of the step ``a -> b`` at its midpoint (see below)."""
        h = self.h
        vb = (b - a) / h
        if self.n == 1:  # scalar arithmetic: a third of the tensor operations of the matrix form
            _, dV, _, H, dH, _ = self.net.jet_scalar((0.5 * (a + b)), 1)
            v = vb[..., 0]
            return (0.5 * h * (0.5 * dH * v * v - dV))[..., None], (H * v)[..., None], vb, H
        phi, p, Hs = self._contractions(0.5 * (a + b), vb, 1)[:3]
        return 0.5 * h * phi, p, vb, Hs

    def _contractions(self, qbar: Tensor, vb: Tensor, order: int):
        """``phi (..., n)``, ``p = H v_bar``, a bound of ``||H||`` and, for ``order = 2``, ``psi (..., n, n)``,
        ``dHv (..., n, n)`` (``dHv[k, i] = ((dH/dq_k) v_bar)_i``) and ``H``, from the factor's jets.

        With ``H = L L^T + eps I``, ``w = L^T v`` and ``a_k = (dL/dq_k)^T v``:
        ``phi_k = v^T (dH/dq_k) v / 2 - dV/dq_k = a_k . w - dV/dq_k``,
        ``psi_kj = d phi_k / dq_j = a_j . a_k + w . (d2L/dq_k dq_j)^T v - d2V/dq_k dq_j``, and
        ``(dH/dq_k) v = (dL/dq_k) w + L a_k``.
        """
        n, eps = self.n, self.net.eps
        _, dV, d2Vp, L = self.net.factor_jet(qbar, order)
        y = (L.mT @ vb[..., :, None])[..., 0]  # (K, ..., n)
        w, a = y[0], y[1:1 + n]
        phi = ((a * w).sum(-1) - dV).movedim(0, -1)
        p = (L[0] @ w[..., None])[..., 0] + eps * vb
        Hs = L[0].square().sum((-2, -1)) + eps
        if order == 1:
            return phi, p, Hs
        net = self.net
        psi_p = (y[1 + n:] * w).sum(-1) + (a.index_select(0, net._pjt) * a.index_select(0, net._pkt)).sum(-1) - d2Vp
        psi = psi_p.movedim(0, -1)[..., net._sym].unflatten(-1, (n, n))
        dHv = ((L[1:1 + n] @ w[..., None])[..., 0] + (L[0] @ a[..., None])[..., 0]).movedim(0, -2)
        H = L[0] @ L[0].mT + eps * torch.eye(n, dtype=vb.dtype, device=vb.device)
        return phi, p, Hs, psi, dHv, H

    def _forces(self, tau_a: Tensor, tau_b: Tensor, vb: Tensor) -> Tensor:
        """Discrete force of one step at either end: ``(h/2)`` times the step's mean force."""
        f = (0.25 * self.h) * (tau_a + tau_b)
        if self.dissipation is not None:
            f = f + (0.5 * self.h) * self.dissipation.force(vb)
        return f

    def known_part(self, q_prev, q, u_prev, u, u_next) -> tuple[Tensor, Tensor]:
        """Residual terms that do not depend on ``q_next`` (``D2 L_d(q_prev, q) + f^+`` and the controls
        of ``f^-``), and a bound of the inertia's norm ``(...)`` at the first midpoint."""
        hphi, p, vb, H = self._step_terms(q_prev, q)
        tau_u = self.tau(u)
        c = hphi + p + self._forces(self.tau(u_prev), tau_u, vb) + (0.25 * self.h) * (tau_u + self.tau(u_next))
        return c, H

    def tolerance(self, q: Tensor, H: Tensor, tol: float) -> Tensor:
        """Per-sample Newton tolerance ``max(tol, 2 eps ||H|| (||q||_inf + 1) / h)`` (``H (...)``: a norm bound).

        The residual contains ``H (x - q) / h``; rounding ``x`` to the working precision perturbs it by
        about ``eps ||H|| |x| / h``, which for the seed's unwrapped angles (tens of radians) exceeds
        1e-5 in float32. Below that level no iteration can make progress, so the tolerance is raised
        to it per sample (in float64 it stays at ``tol``).
        """
        eps = torch.finfo(q.dtype).eps
        floor = (2 * eps / self.h) * H.detach() * (q.detach().abs().amax(-1) + 1)
        return floor.clamp(min=tol)

    def residual(self, x: Tensor, q: Tensor, c: Tensor) -> Tensor:
        """``g(x) = D1 L_d(q, x) [- (h/2) D v_bar] + c`` (``c`` from :meth:`known_part`)."""
        hphi, p, vb, _ = self._step_terms(q, x)
        g = hphi - p + c
        if self.dissipation is not None:
            g = g + (0.5 * self.h) * self.dissipation.force(vb)
        return g

    def residual_and_jacobian(self, x: Tensor, q: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
        """``g(x)`` and ``dg/dx (..., n, n)`` from one second-order jet of the network."""
        h = self.h
        vb = (x - q) / h
        if self.n == 1:
            _, dV, d2V, H, dH, d2H = self.net.jet_scalar(0.5 * (q + x), 2)
            v = vb[..., 0]
            g = ((0.5 * h) * (0.5 * dH * v * v - dV) - H * v)[..., None] + c
            J = ((0.25 * h) * (0.5 * d2H * v * v - d2V) - H / h)[..., None, None]
        else:
            phi, p, _, psi, dHv, H = self._contractions(0.5 * (q + x), vb, 2)
            g = 0.5 * h * phi - p + c
            J = (0.25 * h) * psi + 0.5 * (dHv - dHv.mT) - H / h
        if self.dissipation is not None:
            D = self.dissipation.matrix().to(x.dtype)
            g = g + (0.5 * h) * self.dissipation.force(vb)
            J = J - 0.5 * D
        return g, J

    def del_residual(self, x: Tensor, q_prev: Tensor, q: Tensor, u_prev: Tensor, u: Tensor, u_next: Tensor,
                     c: Tensor | None = None) -> Tensor:
        """The forced DEL residual ``g(x) = D2 L_d(q_prev, q) + D1 L_d(q, x) + f^+ + f^-``, both midpoints in
        one network pass (``c`` is ignored: it is the signature of :meth:`solve`'s residual)."""
        hphi, p, vb, _ = self._step_terms(torch.stack([q_prev, q]), torch.stack([q, x]))
        tau_u = self.tau(u)
        return (hphi[0] + p[0] + hphi[1] - p[1] + self._forces(self.tau(u_prev), tau_u, vb[0])
                + self._forces(tau_u, self.tau(u_next), vb[1]))

    def weighted_del_residual(self, x: Tensor, lam: Tensor, q_prev: Tensor, q: Tensor, u_prev: Tensor, u: Tensor,
                              u_next: Tensor, c: Tensor | None = None) -> Tensor:
        """``sum(lam * del_residual(x, ...))`` (a scalar) for the parameter gradients: ``lam (B, n)``.

        Contracting the residual with ``lam`` first turns every first derivative of the network into
        one directional derivative along ``lam`` (``lam . phi = (D_lam L^T v) . (L^T v) - D_lam V``), so
        its parameter gradient (the implicit backward pass's vector-Jacobian product) takes one
        (value, direction) jet per midpoint with a hand-written reverse pass
        (:meth:`~.networks.LagrangianNet.directional_heads`) instead of ``1 + n`` jets through autograd.
        The positions and ``lam`` are constants (no gradient); ``c`` is ignored.
        """
        h, n, net = self.h, self.n, self.net
        qb = torch.stack([0.5 * (q_prev + q), 0.5 * (q + x)])
        vb = torch.stack([(q - q_prev) / h, (x - q) / h])
        lam = lam.detach()
        o, od = net.directional_heads(qb, lam.expand_as(qb))
        sign = vb.new_tensor([1.0, -1.0]).reshape(2, *([1] * (vb.dim() - 1)))  # D2 L_d(q_prev, q), D1 L_d(q, x)
        if n == 1 and net.inertia_kind == "paper":
            H = F.softplus(o[..., 1:2])
            H_lam = torch.sigmoid(o[..., 1:2]) * od[..., 1:2]
            lam_phi = 0.5 * H_lam * vb * vb - od[..., :1]
            lam_p = (H * vb) * lam
        else:
            zd = o[..., 1:1 + n]
            zeros = o.new_zeros(*o.shape[:-1], 1)
            L = torch.cat([F.softplus(zd), o[..., 1 + n:], zeros], -1)[..., net._gmap].unflatten(-1, (n, n))
            L_lam = torch.cat([torch.sigmoid(zd) * od[..., 1:1 + n], od[..., 1 + n:], zeros], -1)[..., net._gmap]
            L_lam = L_lam.unflatten(-1, (n, n))
            w = (L.mT @ vb[..., None])[..., 0]
            lam_phi = (L_lam.mT @ vb[..., None])[..., 0] * w - od[..., :1] / n
            lam_p = (L.mT @ lam[..., None])[..., 0] * w + net.eps * lam * vb
        total = ((0.5 * h) * lam_phi + sign * lam_p).sum()
        tau_u = self.tau(u)
        forces = self._forces(self.tau(u_prev), tau_u, vb[0]) + self._forces(tau_u, self.tau(u_next), vb[1])
        return total + (lam * forces).sum()

    def _rj(self, x, q_prev, q, u_prev, u, u_next, c):
        return self.residual_and_jacobian(x, q, c)

    def solve(self, q_prev, q, u_prev, u, u_next, *, tol: float | None = None, max_iter: int | None = None,
              x0: Tensor | None = None, update: str | None = None) -> tuple[Tensor, NewtonStatus]:
        """Root ``q_next (B, n)`` of the DEL residual (graph attached when grad mode is on) and its status.

        The Newton iterations evaluate the residual and its Jacobian together
        (:meth:`residual_and_jacobian`, the ``q_next``-independent part computed once without a
        graph); the implicit backward pass differentiates :meth:`del_residual` at the root, one
        network pass for both midpoints.

        ``x0``: initial guess (default the seed's ``2 q - q_prev``); any guess in the root's basin gives
        the same answer to the tolerance (:meth:`tolerance`). ``update``: ``"newton"`` (default with
        gradients: the Jacobian at the root comes free for the implicit backward pass) or ``"chord"``
        (default without). The batch iterates together for at most ``straggler_iter`` iterations;
        samples still unconverged then continue alone, so a few slow ones do not cost whole-batch
        evaluations. Without gradients on the CPU the C code of :mod:`~diffmech.learn.e2e_native` solves
        instead (:func:`~diffmech.learn.e2e_native.native_solve`: per-sample Newton, the same roots to
        the tolerance) where it applies.
        """
        grad = torch.is_grad_enabled()
        params = [p for p in self.parameters() if p.requires_grad] if grad else []
        if not params and update in (None, "chord"):
            fast = native_solve(self, q_prev, q, u_prev, u, u_next, x0, self.tol if tol is None else tol,
                                self.max_iter if max_iter is None else max_iter)
            if fast is not None:
                x, ok, rn, it = fast
                return x, NewtonStatus(ok, rn, it)
        # with gradients, keep the network's jets at the first midpoint and at the root for the backward pass
        self.net.record_jets(bool(params) and self.fast_vjp)
        with torch.no_grad():
            c, H = self.known_part(q_prev, q, u_prev, u, u_next)
        x0 = (2 * q - q_prev).detach() if x0 is None else x0.detach()
        tol_b = self.tolerance(q, H, self.tol if tol is None else tol)
        max_iter = self.max_iter if max_iter is None else max_iter
        if not params and x0.dim() == 2 and update in (None, "chord"):
            return self._solve_no_grad(x0, q.detach(), c, tol_b, max_iter)
        update = update or ("newton" if grad and params else "chord")
        data = (q_prev.detach(), q.detach(), u_prev.detach(), u.detach(), u_next.detach(), c)
        kw = dict(adjoint_params=params, line_search=self.line_search, update=update,
                  residual_and_jacobian=self._rj, raise_on_failure=False, context=type(self).__name__,
                  weighted_residual=self.weighted_del_residual if self.fast_vjp else None)
        first = min(max_iter, self.straggler_iter)
        x, st = newton_solve(self.del_residual, x0, data, tol=tol_b, max_iter=first, **kw)
        if max_iter > first and x.dim() == 2 and not bool(st.converged.all()):
            idx = torch.nonzero(~st.converged).squeeze(-1)
            xs, st2 = newton_solve(self.del_residual, x[idx].detach(), tuple(d[idx] for d in data), tol=tol_b[idx],
                                   max_iter=max_iter - first, **kw)
            x = x.index_put((idx,), xs)
            st = NewtonStatus(st.converged.index_put((idx,), st2.converged),
                              st.residual_norm.index_put((idx,), st2.residual_norm), first + st2.iterations)
        return x, st

    def _solve_no_grad(self, x0, q, c, tol_b, max_iter) -> tuple[Tensor, NewtonStatus]:
        """Without gradients: test the initial guesses first and iterate only the samples that need it
        (warm-started evaluations mostly need none), by chord steps on ``g(x) = D1 L_d(q, x) + c``."""
        r0 = self.residual(x0, q, c)
        rn0 = r0.abs().amax(-1)
        ok = rn0 <= tol_b
        if bool(ok.all()) or max_iter == 0:
            return x0, NewtonStatus(ok, rn0, 0)
        idx = torch.nonzero(~ok).squeeze(-1)

        def res(x, qq, cc):
            return self.residual(x, qq, cc)

        def rj(x, qq, cc):
            return self.residual_and_jacobian(x, qq, cc)

        xs, st = newton_solve(res, x0[idx], (q[idx], c[idx]), tol=tol_b[idx], max_iter=max_iter,
                              line_search=self.line_search, update="chord", residual_and_jacobian=rj,
                              raise_on_failure=False, context=type(self).__name__)
        return (x0.index_put((idx,), xs),
                NewtonStatus(ok.index_put((idx,), st.converged), rn0.index_put((idx,), st.residual_norm),
                             st.iterations))

    def momentum(self, q: Tensor, q_next: Tensor, u: Tensor, u_next: Tensor) -> Tensor:
        """Discrete momentum at ``q_next`` after the step ``q -> q_next``: ``D2 L_d(q, q_next) + f^+``."""
        hphi, p, vb, _ = self._step_terms(q, q_next)
        return hphi + p + self._forces(self.tau(u), self.tau(u_next), vb)

    @torch.no_grad()
    def predict(self, b: StepSamples, *, tol: float | None = None, max_iter: int | None = None,
                x0: Tensor | None = None, **_) -> Prediction:
        x, st = self.solve(b.q_prev, b.q, b.u_prev, b.u, b.u_next, tol=tol, max_iter=max_iter, x0=x0)
        return Prediction(x, None, st.converged, st.iterations)

    @torch.no_grad()
    def rollout(self, q0: Tensor, q1: Tensor, v1: Tensor, u: Tensor, n_steps: int, *, tol: float = 1e-4,
                max_iter: int = 10) -> Rollout:
        """From the positions ``q0, q1 (B, n)`` (``v1`` unused), ``n_steps`` Newton steps with controls
        ``u (B, >= n_steps + 2, nu)``; a step that does not converge continues from its last iterate and
        is counted in ``failures``."""
        qs, vs, vcs = [], [], []
        failures = torch.zeros(q1.shape[0], dtype=torch.long, device=q1.device)
        iters = 0
        qp, qc = q0, q1
        h = self.h
        for k in range(n_steps):
            x, st = self.solve(qp, qc, u[:, k], u[:, k + 1], u[:, k + 2], tol=tol, max_iter=max_iter)
            failures += (~st.converged).long()
            iters += st.iterations
            p = self.momentum(qc, x, u[:, k + 1], u[:, k + 2])
            H = self.inertia(x)
            vcs.append(p / H[..., 0] if self.n == 1 else torch.linalg.solve(H, p))
            qs.append(x)
            vs.append((x - qc) / h)
            qp, qc = qc, x
        return Rollout(torch.stack(qs, 1), torch.stack(vs, 1), torch.stack(vcs, 1), failures, iters)


class SyMo(_DELModel):
    """Symplectic Momentum network: trained on the DEL residual of observed positions, Newton at inference.

    Args:
        angle_mask: (n,) coordinates embedded as ``(cos, sin)``.
        h: time step, s.
        width: hidden width.
        input_matrix: (n, nu), ``tau = B u``.
        inertia: ``"paper"`` or ``"cholesky"`` (see :class:`~.networks.LagrangianNet`).
        dissipation: learn a Rayleigh dissipation matrix.
        tol, max_iter: Newton's per-sample tolerance on ``max |g|`` and iteration limit (seed: 1e-5, 10).
        line_search: backtracking on the residual (the seed's Newton has none).
    """

    def objective(self, b: StepSamples):
        g = self.del_residual(b.q_next, b.q_prev, b.q, b.u_prev, b.u, b.u_next)
        return g.square().mean(), {"iterations": 0}


class E2ESyMo(_DELModel):
    """End-to-end SyMo: the Newton root of the DEL residual inside training, gradients by the implicit
    function theorem (:func:`diffmech.implicit.newton_solve`). Arguments as :class:`SyMo`.

    The loss averages the squared position errors over the samples whose solve converged; the
    others are left out and counted (``info["failures"]``), never used silently. (With no
    converged sample the loss is a zero without gradient.)

    On the CPU, without dissipation or line search, :meth:`objective` runs in C
    (:mod:`~diffmech.learn.e2e_native`: the same loss and gradient; ``native_mode("never")`` of
    :mod:`diffmech.dynamics.kernels` selects the torch code below).
    """

    def objective(self, b: StepSamples, x0: Tensor | None = None):
        fused = native_objective(self, b, x0)
        if fused is not None:
            return fused
        x, st = self.solve(b.q_prev, b.q, b.u_prev, b.u, b.u_next, x0=x0)
        ok = st.converged
        n_ok = int(ok.sum())
        if n_ok == x.shape[0]:
            loss = (x - b.q_next).square().mean()
        else:
            # the graph of the whole batch would carry the failed samples' non-finite or meaningless
            # sensitivities: solve the converged ones again from their roots (no iteration) and use that
            idx = torch.nonzero(ok).squeeze(-1)
            if n_ok:
                bo = b.index(idx)
                xo, _ = self.solve(bo.q_prev, bo.q, bo.u_prev, bo.u, bo.u_next, x0=x[idx])
                loss = (xo - bo.q_next).square().mean()
            else:
                loss = sum((0.0 * p).sum() for p in self.parameters())
        return loss, {"q": x.detach(), "converged": ok, "iterations": st.iterations, "failures": x.shape[0] - n_ok}


def build_model(name: str, angle_mask, h: float, *, width: int = 128, input_matrix=None, inertia: str = "paper",
                dissipation: bool = False, tol: float = 1e-5, max_iter: int = 10, line_search: bool = False,
                train_integrator: str | None = None) -> LearnedDynamics:
    """A model by its CLI name (:data:`MODEL_NAMES`), e.g. ``"e2e-symo"`` or ``"lnode-midpoint"``."""
    if name in ("node-rk4", "node-midpoint"):
        if dissipation:
            raise ShapeError("NODE learns any force; dissipation=True applies to L-NODE and the SyMo models")
        return NODE(angle_mask, h, width, name.split("-")[1], input_matrix, train_integrator)
    if name in ("lnode-rk4", "lnode-midpoint"):
        return LNODE(angle_mask, h, width, name.split("-")[1], input_matrix, train_integrator, inertia, dissipation)
    if name in ("symo", "e2e-symo"):
        cls = SyMo if name == "symo" else E2ESyMo
        return cls(angle_mask, h, width, input_matrix, inertia, dissipation, tol, max_iter, line_search)
    raise ShapeError(f"unknown model {name!r}; choose one of {', '.join(MODEL_NAMES)}")
