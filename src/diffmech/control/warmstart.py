"""Starting points for eigenmode learning: the target configuration and a linear-mode potential.

A freshly initialised network potential has gradients of order 0.1 N m. On a light pendulum that is
a fair start, but on an industrial arm whose free joints carry gravity torques of tens of N m about
an unstable upright (the iiwa), the closed loop simply falls over during the first half period, the
trajectory is chaotic in the parameters, and gradient descent from there makes no progress.

:func:`fit_linear_mode` instead starts the network close to a potential whose closed loop has the
wanted mode already, to first order. With ``q_c`` the midpoint of the start ``q0`` and the target
configuration ``q_t`` and ``omega = 2 pi / T``, the prior

``V_prior(q) = -U(q) + 1/2 omega^2 (q - q_c)^T M(q_c) (q - q_c)``

cancels the plant potential ``U`` (gravity and springs) and replaces it by a quadratic well in which,
for the inertia frozen at ``M(q_c)``, every direction oscillates with period ``T``: started at rest
from ``q0`` the motion is the straight line to ``2 q_c - q0 = q_t``, reached at ``T/2``. The
network's last layer is fitted to ``grad V_prior`` by linear least squares (the gradient is linear in
the output weights), on configurations drawn in a box around the segment ``q0 -> q_t``. The actual
inertia varies along the motion, so the fitted mode misses the target by a little; the Adam phase or
the Gauss-Newton polish removes the rest.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..errors import DiffmechError
from .hamiltonian import HamiltonianSystem
from .potentials import MLPPotential

__all__ = ["target_configuration", "fit_linear_mode"]


def target_configuration(system: HamiltonianSystem, target: Tensor, q0: Tensor, *, tol: float = 1e-5,
                         max_iter: int = 60) -> Tensor:
    """A configuration of the free joints whose end effector is at ``target``: ``q_t (n,)``.

    Damped Gauss-Newton (Levenberg-Marquardt) on ``FK(q) - target`` from a few deterministic starts
    (``-q0``, the zero configuration, ``q0``); of the converged solutions the one nearest to ``q0``
    in the metric ``M(q0)`` (the kinetic-energy distance). Raises :class:`DiffmechError` with the
    closest distance reached when the target is out of reach of the free joints.

    Args:
        system: the Hamiltonian system (its free joints and end-effector link).
        target: ``(3,)`` world position, m.
        q0: ``(n,)`` start configuration, rad.
        tol: accepted position error, m.
    """
    x_d = target.detach().to(system.dtype)
    a = q0.detach().to(system.dtype)
    n = a.numel()
    eye = torch.eye(n, dtype=a.dtype, device=a.device)
    found: list[Tensor] = []
    best = math.inf
    with torch.no_grad():
        for q in (-a, torch.zeros_like(a), a):
            lam = 1e-3
            err = float((system.end_effector(q) - x_d).norm())
            for _ in range(max_iter):
                if err < tol:
                    break
                with torch.enable_grad():
                    J = torch.autograd.functional.jacobian(system.end_effector, q)  # (3, n)
                r = system.end_effector(q) - x_d
                A = J.T @ J
                q_new = q - torch.linalg.solve(A + lam * float(A.diagonal().max().clamp_min(1e-12)) * eye, J.T @ r)
                err_new = float((system.end_effector(q_new) - x_d).norm())
                if err_new < err:
                    q, err, lam = q_new, err_new, max(lam / 10, 1e-9)
                else:
                    lam *= 10
            best = min(best, err)
            if err < tol:
                found.append(q)
        if not found:
            raise DiffmechError(f"eigenmode target {x_d.tolist()} m is out of reach of the free joints "
                                f"{system.joints} (closest end-effector distance {best:.4g} m)")
        M0 = system.mass_matrix(a)
        dist = [float((q - a) @ M0 @ (q - a)) for q in found]
    return found[dist.index(min(dist))]


def _hidden_features(potential: MLPPotential, q: Tensor) -> Tensor:
    """Last hidden layer ``h_L(q) (..., H)``."""
    hidden, _ = potential._linears()
    x = potential.features(q)
    for lin in hidden:
        x = torch.tanh(lin(x))
    return x


def fit_linear_mode(system: HamiltonianSystem, q0: Tensor, q_t: Tensor, period: float, *, margin: float = 0.5,
                    samples: int = 2000, ridge: float = 1e-6, generator: torch.Generator | None = None) -> dict:
    """Set the output layer of ``system.potential`` so that ``grad V_theta`` fits ``grad V_prior``
    (module docstring) in the least-squares sense; the hidden layers keep their initialisation.

    Args:
        system: closed loop whose potential is an :class:`MLPPotential` (changed in place).
        q0, q_t: ``(n,)`` start and target configurations, rad.
        period: ``T``, s.
        margin: rad added on each side of the box spanned by ``q0`` and ``q_t`` for the samples.
        samples: number of configurations drawn uniformly in the box.
        ridge: Tikhonov weight on the output weights, relative to the mean squared feature gradient.

    Returns:
        ``{"q_center", "stiffness" (n, n), "relative_residual", "output_weight_norm",
        "gravity_torque_max", "initial_torque_max"}``: the prior's centre and stiffness
        ``omega^2 M(q_c)``, the fit's relative gradient residual on the samples, and the largest plant
        and initial control torques on the samples (N m).
    """
    pot = system.potential
    if not isinstance(pot, MLPPotential):
        raise DiffmechError(f"fit_linear_mode: needs an MLPPotential, got {type(pot).__name__}")
    n = system.n
    dt, dev = system.dtype, system.device
    q0 = q0.detach().to(dt)
    q_t = q_t.detach().to(dt)
    if q0.shape != (n,) or q_t.shape != (n,):
        raise DiffmechError(f"fit_linear_mode: q0 and q_t must have shape ({n},), got {tuple(q0.shape)}, "
                            f"{tuple(q_t.shape)}")
    if not period > 0:
        raise DiffmechError(f"fit_linear_mode: period must be positive, got {period}")
    qc = 0.5 * (q0 + q_t)
    omega = 2 * math.pi / period
    with torch.no_grad():
        K = omega ** 2 * system.mass_matrix(qc)
    lo = torch.minimum(q0, q_t) - margin
    hi = torch.maximum(q0, q_t) + margin
    Q = torch.rand(samples, n, generator=generator, dtype=dt).to(dev) * (hi - lo) + lo
    Qg = Q.clone().requires_grad_(True)
    (dU,) = torch.autograd.grad(system.plant_potential(Qg).sum(), Qg)
    target_grad = (-dU + (Q - qc) @ K.T).detach()  # grad V_prior, (B, n)
    with torch.no_grad():
        initial = pot.gradient(Q)
    with torch.no_grad():
        Jh = torch.func.vmap(torch.func.jacrev(lambda q: _hidden_features(pot, q)))(Q)  # (B, H, n)
    A = Jh.transpose(1, 2).reshape(-1, Jh.shape[1]).double()  # rows: (sample, coordinate)
    b = target_grad.reshape(-1).double()
    AtA = A.T @ A
    lam = ridge * float(AtA.diagonal().mean())
    w = torch.linalg.solve(AtA + lam * torch.eye(AtA.shape[0], dtype=AtA.dtype, device=AtA.device), A.T @ b)
    residual = float((A @ w - b).norm() / b.norm().clamp_min(1e-300))
    _, out = pot._linears()
    with torch.no_grad():
        out.weight.copy_(w.to(out.weight.dtype).reshape_as(out.weight))
    return {"q_center": qc.tolist(), "q_target": q_t.tolist(), "stiffness": K.tolist(),
            "relative_residual": residual, "output_weight_norm": float(w.norm()),
            "gravity_torque_max": float(dU.abs().max()), "initial_torque_max": float(initial.abs().max())}
