"""Fixed-step integration of a closed-loop Hamiltonian flow on a normalised time grid, differentiable.

The flow is integrated in normalised time ``s in [0, 1]``: ``dx/ds = |T| G(x)`` with ``G = J grad H_theta``
(:class:`~diffmech.control.hamiltonian.HamiltonianSystem`), so the period ``T`` is an ordinary scalar
that can be learned. One-step schemes: explicit Euler, explicit midpoint (the eigenmode paper's
solver), classical RK4, and the implicit midpoint rule (symplectic for any Hamiltonian).

How the discrete trajectory is computed (``solver``):

- ``"sequential"``: step after step, as any integrator does.
- ``"newton"`` (default): all steps at once. The discrete trajectory ``X = (x_1, ..., x_N)`` is the
  root of the residuals ``R_k = x_{k+1} - Phi_k(x_k)``; Newton's method on the whole trajectory
  evaluates the vector field and its Jacobian at every stage of every step in one batched call
  and solves the block-bidiagonal linear system by a forward recurrence of small matrix products
  (a parallel-in-time solve, as in DEER, Lim et al. 2024). Started from the trajectory of the
  previous call (a :class:`FlowCache`, e.g. the previous training step), it converges in one or
  two iterations to round-off, to the same discrete trajectory as the sequential solve. It falls
  back to the sequential solve when it does not converge.

Gradients (``adjoint``):

- ``"discrete"`` (default): a hand-written discrete adjoint of the scheme. Only the states are kept;
  the step Jacobians of the last Newton iteration are reused, the adjoint recurrence runs over
  ``(2n, 2n)`` matrices, and the parameter gradient is one batched vector-Jacobian product of the
  control force over all stages. It is the exact gradient of the discrete trajectory.
- ``"autograd"``: plain autograd through a sequential loop (double backprop through the vector
  field); the reference the discrete adjoint is checked and timed against.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import ConvergenceError, ShapeError, SimulationError
from .hamiltonian import HamiltonianSystem
from .potentials import potential_gradient

__all__ = ["Scheme", "SCHEMES", "get_scheme", "code_grid", "uniform_grid", "Flow", "FlowCache",
           "hamiltonian_flow", "effort_integral"]


# ---------------------------------------------------------------------------- schemes and grids
@dataclass(frozen=True)
class Scheme:
    """A one-step Runge-Kutta scheme ``(a, b)``; explicit if ``a`` is strictly lower triangular.

    Only explicit schemes and the one-stage implicit midpoint rule are supported.
    """

    name: str
    a: tuple[tuple[float, ...], ...]
    b: tuple[float, ...]
    implicit: bool
    order: int

    @property
    def stages(self) -> int:
        return len(self.b)


SCHEMES: dict[str, Scheme] = {
    "euler": Scheme("euler", ((0.0,),), (1.0,), False, 1),
    "midpoint": Scheme("midpoint", ((0.0, 0.0), (0.5, 0.0)), (0.0, 1.0), False, 2),
    "rk4": Scheme("rk4", ((0.0, 0.0, 0.0, 0.0), (0.5, 0.0, 0.0, 0.0), (0.0, 0.5, 0.0, 0.0), (0.0, 0.0, 1.0, 0.0)),
                  (1 / 6, 1 / 3, 1 / 3, 1 / 6), False, 4),
    "implicit_midpoint": Scheme("implicit_midpoint", ((0.5,),), (1.0,), True, 2),
}
_ALIASES = {"symplectic": "implicit_midpoint", "rk2": "midpoint"}


def get_scheme(name: str | Scheme) -> Scheme:
    """A :class:`Scheme` by name: ``euler``, ``midpoint``, ``rk4``, ``implicit_midpoint`` (alias ``symplectic``)."""
    if isinstance(name, Scheme):
        return name
    key = _ALIASES.get(name, name)
    if key not in SCHEMES:
        raise ValueError(f"unknown scheme {name!r}; choose from {sorted(SCHEMES) + sorted(_ALIASES)}")
    return SCHEMES[key]


def code_grid(points: int = 100, *, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """``linspace(0, 1, points)`` with ``s = 0.5`` inserted when missing (the paper's code: 101 points).

    The grid is symmetric (``s_j + s_{N-j} = 1``), so grid index ``j`` pairs with ``N - j`` (``t`` with
    ``T - t``) and ``s = 0.5`` is a grid point.
    """
    if points < 3:
        raise ShapeError(f"code_grid: points must be >= 3, got {points}")
    s = torch.linspace(0.0, 1.0, points, dtype=torch.float64)
    if not bool((s - 0.5).abs().min() < 1e-12):
        s = torch.cat([s, s.new_tensor([0.5])]).sort().values
    return s.to(dtype=dtype, device=device)


def uniform_grid(steps: int = 100, *, dtype: torch.dtype = torch.float32, device=None) -> Tensor:
    """``steps + 1`` equidistant points on ``[0, 1]``; ``steps`` must be even (``s = 0.5`` on the grid)."""
    if steps < 2 or steps % 2:
        raise ShapeError(f"uniform_grid: steps must be even and >= 2, got {steps}")
    return torch.linspace(0.0, 1.0, steps + 1, dtype=torch.float64).to(dtype=dtype, device=device)


# ---------------------------------------------------------------------------- results and cache
class Flow(NamedTuple):
    """A discrete trajectory.

    Attributes:
        X: (..., N + 1, 2n) states on the grid.
        stage_q: (..., N, S, n) configurations at the scheme's stages (for quadratures along the flow).
        weights: (N, S) quadrature weights ``h_k b_s`` in normalised time: ``sum weights * g(stage_q)``
            integrates ``g`` over ``s in [0, 1]`` with the scheme's own rule.
        grid: (N + 1,) normalised times.
    """

    X: Tensor
    stage_q: Tensor
    weights: Tensor
    grid: Tensor


@dataclass
class FlowCache:
    """Warm start for the Newton solve: the last trajectory and its plant Jacobians.

    Pass the same cache to successive calls whose trajectories are close (training steps). The
    first Newton update of the next call uses the plant part of the stored step Jacobians with the
    control potential's Hessian re-evaluated for the current parameters (cheap), so only the plant
    part is stale. ``stats`` collects, per call, the Newton iterations, the Jacobian evaluations,
    the residuals and whether the sequential fallback ran.
    """

    X: Tensor | None = None
    J_plant: Tensor | None = None  # (B, N, S, 2n, 2n) plant part of the stage Jacobians (without |T|)
    key: tuple | None = None
    stats: list = field(default_factory=list)

    def clear(self) -> None:
        self.X = self.J_plant = self.key = None


class _Stages(NamedTuple):
    Y: Tensor  # (B, N, S, D) stage states
    G: Tensor  # (B, N, S, D) vector field (without |T|)
    J: Tensor | None  # (B, N, S, D, D) its Jacobian (without |T|)
    Hv: Tensor | None = None  # (B, N, S, n, n) the control potential's Hessian (its part of J)


class _Lin(NamedTuple):
    dphi: Tensor  # (B, N, D, D) step Jacobian dx_{k+1}/dx_k
    prec: Tensor | None  # (B, N, D, D) (dR/dx_{k+1})^{-1} for implicit schemes
    dY: Tensor  # (B, N, S, D, D) stage Jacobians dY_s/dx_k


@dataclass
class _Runner:
    system: HamiltonianSystem
    scheme: Scheme
    h: Tensor  # (N,)
    solver: str
    cache: FlowCache | None
    rtol: float
    max_iter: int
    params: tuple

    @property
    def N(self) -> int:
        return self.h.shape[0]

    def eye(self, D: int, like: Tensor) -> Tensor:
        return torch.eye(D, dtype=like.dtype, device=like.device)


# ---------------------------------------------------------------------------- stage evaluation
def _field(r: _Runner, Y: Tensor, jac: bool) -> tuple[Tensor, Tensor | None, Tensor | None]:
    shape = Y.shape
    ev = r.system.evaluate(Y.reshape(-1, shape[-1]), jacobian=jac, energy=False)
    n = shape[-1] // 2
    J = None if ev.J is None else ev.J.reshape(*shape, shape[-1])
    Hv = None if ev.Hv is None else ev.Hv.reshape(*shape[:-1], n, n)
    return ev.G.reshape(shape), J, Hv


def _stages(r: _Runner, X: Tensor, Tabs: Tensor, jac: bool, k0: int = 0) -> _Stages:
    """Stages of the steps starting at ``X[:, :-1]`` (``X``: (B, N + 1, D), steps ``k0 ...``)."""
    sc = r.scheme
    xk = X[:, :-1]
    h = r.h[k0:k0 + xk.shape[1]].reshape(1, -1, 1)
    if sc.implicit:
        Y = 0.5 * (xk + X[:, 1:])
        G, J, Hv = _field(r, Y, jac)
        return _Stages(Y.unsqueeze(2), G.unsqueeze(2), None if J is None else J.unsqueeze(2),
                       None if Hv is None else Hv.unsqueeze(2))
    Ys, Gs = [], []
    for s in range(sc.stages):
        Y = xk
        for j in range(s):
            if sc.a[s][j]:
                Y = Y + (h * sc.a[s][j] * Tabs) * Gs[j]
        G, _, _ = _field(r, Y, False)
        Ys.append(Y)
        Gs.append(G)
    st = _Stages(torch.stack(Ys, 2), torch.stack(Gs, 2), None)
    return _jacobians(r, st) if jac else st


def _jacobians(r: _Runner, st: _Stages) -> _Stages:
    """``st`` with the field's Jacobians at all its stage states, from one batched evaluation (the
    explicit stages follow each other, their Jacobians do not: one call instead of one per stage
    saves the per-call cost of the second derivatives through the rigid-body core)."""
    G, J, Hv = _field(r, st.Y, True)
    return _Stages(st.Y, G, J, Hv)


def _residual(r: _Runner, X: Tensor, st: _Stages, Tabs: Tensor) -> Tensor:
    b = X.new_tensor(r.scheme.b).reshape(1, 1, -1, 1)
    incr = (b * st.G).sum(2) * (r.h.reshape(1, -1, 1) * Tabs)
    return X[:, 1:] - X[:, :-1] - incr


def _linearize(r: _Runner, st: _Stages, Tabs: Tensor) -> _Lin:
    sc = r.scheme
    J = st.J * Tabs  # (B, N, S, D, D)
    D = J.shape[-1]
    eye = r.eye(D, J)
    h = r.h.reshape(1, -1, 1, 1)
    if sc.implicit:
        half = 0.5 * h * J[:, :, 0]
        prec = torch.linalg.inv(eye - half)
        dphi = prec @ (eye + half)
        return _Lin(dphi, prec, prec.unsqueeze(2))
    dY = []
    for s in range(sc.stages):
        Ds = eye.expand_as(J[:, :, 0])
        for j in range(s):
            if sc.a[s][j]:
                Ds = Ds + (h * sc.a[s][j]) * (J[:, :, j] @ dY[j])
        dY.append(Ds)
    dphi = eye.expand_as(J[:, :, 0])
    for s in range(sc.stages):
        if sc.b[s]:
            dphi = dphi + (h * sc.b[s]) * (J[:, :, s] @ dY[s])
    return _Lin(dphi, None, torch.stack(dY, 2))


def _forward_recurrence(dphi: Tensor, rhs: Tensor) -> Tensor:
    """``d_0 = 0, d_{k+1} = dphi_k d_k + rhs_k``; returns ``(B, N + 1, D)``."""
    B, N, D = rhs.shape
    d = rhs.new_zeros(B, D, 1)
    out = [d]
    for k in range(N):
        d = torch.baddbmm(rhs[:, k].unsqueeze(-1), dphi[:, k], d)
        out.append(d)
    return torch.stack(out, 1).squeeze(-1)


def _backward_recurrence(dphi: Tensor, g: Tensor) -> Tensor:
    """``lam_N = g_N, lam_k = g_k + dphi_k^T lam_{k+1}``; ``g`` (B, N + 1, D)."""
    B, N1, D = g.shape
    lam = g[:, -1].unsqueeze(-1)
    out = [lam]
    dT = dphi.transpose(-1, -2)
    for k in range(N1 - 2, -1, -1):
        lam = torch.baddbmm(g[:, k].unsqueeze(-1), dT[:, k], lam)
        out.append(lam)
    out.reverse()
    return torch.stack(out, 1).squeeze(-1)


# ---------------------------------------------------------------------------- solvers
def _tolerance(r: _Runner, X: Tensor) -> float:
    return r.rtol * (1.0 + float(X.abs().max()))


def _sequential(r: _Runner, x0: Tensor, Tabs: Tensor) -> Tensor:
    """Step after step, without a graph; ``x0`` (B, D) -> ``X`` (B, N + 1, D)."""
    sc = r.scheme
    xs = [x0]
    x = x0
    for k in range(r.N):
        if sc.implicit:
            x = _implicit_step(r, x, Tabs, k)
        else:
            X2 = torch.stack([x, x], 1)  # the second slot is unused by explicit stages
            st = _stages(r, X2, Tabs, False, k0=k)
            b = x.new_tensor(sc.b).reshape(1, -1, 1)
            x = x + (r.h[k] * Tabs) * (b * st.G[:, 0]).sum(1)
        if not bool(torch.isfinite(x).all()):
            raise SimulationError(f"hamiltonian_flow: non-finite state at step {k + 1} of {r.N} "
                                  f"({sc.name}, sequential)")
        xs.append(x)
    return torch.stack(xs, 1)


def _implicit_step(r: _Runner, x: Tensor, Tabs: Tensor, k: int, max_iter: int = 30) -> Tensor:
    """One implicit-midpoint step by Newton on the stage ``Y = x + h/2 |T| G(Y)``."""
    half = 0.5 * r.h[k] * Tabs
    G, _ = r.system.field(x)
    Y = x + half * G
    eye = r.eye(x.shape[-1], x)
    tol = _tolerance(r, x)
    for _ in range(max_iter):
        G, J = r.system.field(Y, jacobian=True)
        res = Y - x - half * G
        Y = Y - torch.linalg.solve(eye - half * J, res.unsqueeze(-1)).squeeze(-1)
        if float(res.abs().max()) <= tol:
            return 2.0 * Y - x
    raise ConvergenceError(f"hamiltonian_flow: implicit midpoint step {k} did not converge in {max_iter} "
                           f"Newton iterations (residual {float(res.abs().max()):.3e})")


def _potential_jacobian(r: _Runner, Y: Tensor) -> Tensor:
    """The control potential's part of the field Jacobian at stage states ``Y (..., 2n)`` (without |T|)."""
    n = r.system.n
    Hv = r.system.potential.hessian(Y[..., :n].reshape(-1, n)).reshape(*Y.shape[:-1], n, n)
    return _embed_hessian(Hv, Y)


def _embed_hessian(Hv: Tensor, Y: Tensor) -> Tensor:
    """The field-Jacobian block ``[[0, 0], [-Hv, 0]]`` of a potential's Hessian ``Hv (..., n, n)``."""
    n = Hv.shape[-1]
    J = Y.new_zeros(*Y.shape, Y.shape[-1])
    J[..., n:, :n] = -Hv
    return J


# A chord iteration that shrinks the residual by less than this factor refreshes the step Jacobians.
# A refresh costs about six first-order evaluations of the field on the trajectory (the plant's second
# derivatives by autograd through the rigid-body core), so slowly contracting chord iterations are
# cheaper up to a rate of about one half.
_REFRESH_RATE = 0.5


def _newton(r: _Runner, x0: Tensor, Tabs: Tensor, X: Tensor, J_plant: Tensor | None
            ) -> tuple[Tensor, _Stages, _Lin, dict] | None:
    """Newton on the whole trajectory from the guess ``X``; ``None`` when it fails.

    The step Jacobians (the expensive part: second derivatives of ``H`` at every stage) are
    recomputed only where they pay: at an iterate expected to be the last one (they are needed
    there for the adjoint) and where the previous update contracted the residual poorly; other
    iterates reuse the last linearisation (a chord / quasi-Newton step).
    """
    X = X.clone()
    X[:, 0] = x0
    eps = torch.finfo(X.dtype).eps
    st = _stages(r, X, Tabs, jac=J_plant is None)
    R = _residual(r, X, st, Tabs)
    res = float(R.abs().max())
    hist = [res]
    if J_plant is None:
        lin = _linearize(r, st, Tabs)
    else:
        lin = _linearize(r, _Stages(st.Y, st.G, J_plant + _potential_jacobian(r, st.Y)), Tabs)
    it, n_jac, rate = 0, int(st.J is not None), None
    while res > _tolerance(r, X):
        if it >= r.max_iter or not math.isfinite(res):
            return None
        rhs = -R if lin.prec is None else -(lin.prec @ R.unsqueeze(-1)).squeeze(-1)
        X = X + _forward_recurrence(lin.dphi, rhs)
        it += 1
        tol = _tolerance(r, X)
        want_jac = (0.01 if rate is None else rate) * res <= tol
        st = _stages(r, X, Tabs, jac=want_jac)
        R = _residual(r, X, st, Tabs)
        new = float(R.abs().max())
        hist.append(new)
        rate = new / max(res, 1e-300)
        if want_jac:
            lin = _linearize(r, st, Tabs)
            n_jac += 1
        elif rate > _REFRESH_RATE and new > tol:  # a stale linearisation: refresh it here
            st = _jacobians(r, st)
            lin = _linearize(r, st, Tabs)
            n_jac += 1
        if new > 0.5 * res and new <= 1e3 * eps * (1.0 + float(X.abs().max())):
            res = new
            break  # round-off floor reached
        if new > 1e3 * max(hist[0], 1e-3) or not math.isfinite(new):
            return None
        res = new
    if st.J is None:  # the adjoint needs the exact step Jacobians of the final trajectory
        st = _jacobians(r, st)
        lin = _linearize(r, st, Tabs)
        n_jac += 1
    return X, st, lin, {"iterations": it, "jacobians": n_jac, "residual": hist[-1], "history": hist}


def _solve(r: _Runner, x0: Tensor, Tabs: Tensor) -> tuple[Tensor, _Stages, _Lin]:
    B, D = x0.shape
    key = (B, r.N, D, x0.dtype, x0.device, r.scheme.name)
    cache = r.cache
    out = None
    info: dict = {"iterations": 0, "fallback": False}
    if r.solver == "newton" and cache is not None and cache.key == key and cache.X is not None:
        out = _newton(r, x0, Tabs, cache.X, cache.J_plant)
        if out is None:
            info["fallback"] = True
    if out is not None:
        X, st, lin, extra = out
        info.update(extra)
    else:
        X = _sequential(r, x0, Tabs)
        st = _stages(r, X, Tabs, jac=True)
        lin = _linearize(r, st, Tabs)
        info["residual"] = float(_residual(r, X, st, Tabs).abs().max())
    if cache is not None:
        cache.X, cache.key = X.detach(), key
        cache.J_plant = (st.J - (_potential_jacobian(r, st.Y) if st.Hv is None else _embed_hessian(st.Hv, st.Y))
                         ).detach()
        cache.stats.append(info)
    return X, st, lin


# ---------------------------------------------------------------------------- autograd function
class _DiscreteAdjointFlow(torch.autograd.Function):
    @staticmethod
    def forward(ctx, r: _Runner, x0: Tensor, period: Tensor, *params: Tensor):
        Tabs = period.detach().abs()
        X, st, lin = _solve(r, x0.detach(), Tabs)
        n = r.system.n
        ctx.r = r
        extra = (lin.prec,) if lin.prec is not None else ()
        ctx.save_for_backward(period, st.Y, st.G, st.J, lin.dphi, lin.dY, *extra)
        return X, st.Y[..., :n].clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gX: Tensor | None, gQ: Tensor | None):
        r: _Runner = ctx.r
        period, Y, G, J, dphi, dY, *rest = ctx.saved_tensors
        prec = rest[0] if rest else None
        sc = r.scheme
        B, N, S, D = Y.shape
        n = D // 2
        Tabs = period.abs()
        if gX is None:
            gX = Y.new_zeros(B, N + 1, D)
        gYq = Y.new_zeros(B, N, S, D)
        if gQ is not None:
            gYq[..., :n] = gQ
        # cotangents reaching x_k through the stage configurations (independent of the adjoint)
        c = (dY.transpose(-1, -2) @ gYq.unsqueeze(-1)).squeeze(-1).sum(2)  # (B, N, D)
        g = gX.clone()
        g[:, :-1] += c
        lam = _backward_recurrence(dphi, g)
        Lam = lam[:, 1:]  # cotangent of x_{k+1}
        h = r.h.reshape(1, -1, 1)
        JT = (J * Tabs).transpose(-1, -2)
        if sc.implicit:
            rhs = h * Lam + 0.5 * h * gYq[:, :, 0]
            Fbar = (prec.transpose(-1, -2) @ rhs.unsqueeze(-1)).squeeze(-1).unsqueeze(2)
        else:
            Fb: list[Tensor | None] = [None] * S
            Yb: list[Tensor | None] = [None] * S
            for s in range(S - 1, -1, -1):
                f = (h * sc.b[s]) * Lam
                for q_ in range(s + 1, S):
                    if sc.a[q_][s]:
                        f = f + (h * sc.a[q_][s]) * Yb[q_]
                Fb[s] = f
                Yb[s] = (JT[:, :, s] @ f.unsqueeze(-1)).squeeze(-1) + gYq[:, :, s]
            Fbar = torch.stack(Fb, 2)  # (B, N, S, D)
        grad_x0 = lam[:, 0] if ctx.needs_input_grad[1] else None
        grad_T = None
        if ctx.needs_input_grad[2]:
            grad_T = (torch.sign(period) * (G * Fbar).sum()).reshape(period.shape)
        grads_p: list[Tensor | None] = [None] * len(r.params)
        want = [i for i, p in enumerate(r.params) if ctx.needs_input_grad[3 + i]]
        if want:
            # F_p = -|T| grad V_theta(q) is the only parameter dependence of the field
            q = Y[..., :n].reshape(-1, n)
            w = Fbar[..., n:].reshape(-1, n)
            with torch.enable_grad():
                gV = potential_gradient(r.system.potential, q, create_graph=True)
                obj = -(Tabs * (gV * w).sum())
                out = torch.autograd.grad(obj, [r.params[i] for i in want], allow_unused=True)
            for i, gi in zip(want, out):
                grads_p[i] = gi
        return (None, grad_x0, grad_T, *grads_p)


def _flow_autograd(r: _Runner, x0: Tensor, period: Tensor) -> tuple[Tensor, Tensor]:
    """Plain autograd through a sequential loop (double backprop through the vector field)."""
    sc = r.scheme
    Tabs = period.abs()
    n = r.system.n
    sys_ = r.system
    xs, qs = [x0], []
    x = x0
    for k in range(r.N):
        h = r.h[k]
        if sc.implicit:
            with torch.no_grad():
                Ystar = 0.5 * (x + _implicit_step(r, x.detach(), Tabs.detach(), k))
                _, Jst = sys_.field(Ystar, jacobian=True)
                A = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device) - 0.5 * h * Tabs.detach() * Jst
            G, _ = sys_.field(Ystar, create_graph=True)
            res = Ystar - x - 0.5 * h * Tabs * G
            Y = Ystar - torch.linalg.solve(A, res.unsqueeze(-1)).squeeze(-1)  # exact first-order sensitivities
            x = 2.0 * Y - x
            qs.append(Y[..., :n].unsqueeze(1))
        else:
            Gs, Ys = [], []
            for s in range(sc.stages):
                Y = x
                for j in range(s):
                    if sc.a[s][j]:
                        Y = Y + (h * sc.a[s][j]) * Tabs * Gs[j]
                G, _ = sys_.field(Y, create_graph=True)
                Gs.append(G)
                Ys.append(Y)
            x = x + h * Tabs * sum(sc.b[s] * Gs[s] for s in range(sc.stages) if sc.b[s])
            qs.append(torch.stack([Y[..., :n] for Y in Ys], 1))
        xs.append(x)
    return torch.stack(xs, 1), torch.stack(qs, 1)


# ---------------------------------------------------------------------------- public entry
def hamiltonian_flow(system: HamiltonianSystem, x0: Tensor, period: Tensor | float, grid: Tensor | None = None, *,
                     method: str | Scheme = "midpoint", solver: str = "newton", adjoint: str = "discrete",
                     cache: FlowCache | None = None, rtol: float | None = None, max_iter: int = 8) -> Flow:
    """Integrate ``dx/ds = |T| J grad H_theta(x)`` over the normalised grid, differentiably.

    Args:
        system: the closed loop (robot and control potential).
        x0: (..., 2n) initial states ``(q0, p0)``.
        period: ``T`` (s), a scalar tensor (may require grad) or a number.
        grid: (N + 1,) increasing normalised times from 0 to 1 (default :func:`code_grid`).
        method: ``"midpoint"`` (default), ``"rk4"``, ``"euler"``, ``"implicit_midpoint"`` /
            ``"symplectic"``.
        solver: ``"newton"`` (whole trajectory at once, warm-started from ``cache``) or
            ``"sequential"``.
        adjoint: ``"discrete"`` (hand-written discrete adjoint, stores only states and step
            Jacobians) or ``"autograd"`` (plain autograd through the sequential loop).
        cache: warm start and statistics of the Newton solve (see :class:`FlowCache`).
        rtol: Newton tolerance on the step residual, relative to ``1 + max |x|`` (default
            ``32 eps`` of the dtype).
        max_iter: Newton iterations before the sequential fallback.

    Returns:
        A :class:`Flow`. Gradients reach ``x0``, ``period`` and the control potential's
        parameters (the robot's own parameters are treated as constants by the discrete adjoint).
    """
    dtype, device = system.dtype, system.device
    x0 = torch.as_tensor(x0, dtype=dtype, device=device)
    D = 2 * system.n
    if x0.shape[-1] != D:
        raise ShapeError(f"hamiltonian_flow: x0 must have shape (..., {D}), got {tuple(x0.shape)}")
    period = torch.as_tensor(period, dtype=dtype, device=device)
    if period.dim() != 0:
        raise ShapeError(f"hamiltonian_flow: period must be a scalar, got shape {tuple(period.shape)}")
    grid = code_grid(dtype=dtype, device=device) if grid is None else grid.to(dtype=dtype, device=device)
    if grid.dim() != 1 or grid.shape[0] < 2 or not bool((grid[1:] > grid[:-1]).all()):
        raise ShapeError("hamiltonian_flow: grid must be a 1-D increasing tensor with >= 2 points")
    scheme = get_scheme(method)
    if solver not in ("newton", "sequential"):
        raise ValueError(f"hamiltonian_flow: solver must be 'newton' or 'sequential', got {solver!r}")
    if adjoint not in ("discrete", "autograd"):
        raise ValueError(f"hamiltonian_flow: adjoint must be 'discrete' or 'autograd', got {adjoint!r}")
    batch = x0.shape[:-1]
    xf = x0.reshape(-1, D)
    params = tuple(p for p in system.potential.parameters())
    r = _Runner(system, scheme, grid[1:] - grid[:-1], solver, cache,
                32 * torch.finfo(dtype).eps if rtol is None else float(rtol), int(max_iter), params)
    if adjoint == "autograd":
        X, Q = _flow_autograd(r, xf, period)
    else:
        X, Q = _DiscreteAdjointFlow.apply(r, xf, period, *params)
    b = grid.new_tensor(scheme.b)
    weights = r.h.unsqueeze(-1) * b
    N = r.N
    return Flow(X.reshape(*batch, N + 1, D), Q.reshape(*batch, N, scheme.stages, system.n), weights, grid)


def effort_integral(system: HamiltonianSystem, flow: Flow, *, create_graph: bool = True) -> Tensor:
    """``int_0^1 ||grad V_theta(q(s))||^2 ds`` by the scheme's quadrature, ``(...)``.

    The control effort over one period is ``|T|`` times this (time normalisation).
    """
    n = system.n
    q = flow.stage_q
    g = potential_gradient(system.potential, q.reshape(-1, n), create_graph=create_graph).reshape(q.shape)
    return (flow.weights * g.square().sum(-1)).sum((-1, -2))
