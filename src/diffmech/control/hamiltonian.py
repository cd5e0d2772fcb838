"""A robot in Hamiltonian form, optionally closed by a control potential.

The state is ``x = (q, p)`` with the generalised momentum ``p = M(q) v``; the plant Hamiltonian is
``H(q, p) = 1/2 p^T M(q)^{-1} p + U(q)``, where ``M`` is the robot's mass matrix (CRBA) and ``U`` its
potential energy (gravity plus joint springs), both from the rigid-body core. A control potential
``V_theta(q)`` (:mod:`~diffmech.control.potentials`) closes the loop conservatively:
``H_theta = H + V_theta``, ``x_dot = J grad H_theta`` with ``J = [[0, I], [-I, 0]]``.

Derivatives of ``H`` are taken by autograd through the core; second derivatives (the Jacobian of
the vector field, needed by the trajectory solver and its adjoint) are batched over all points of
a trajectory at once with ``is_grads_batched``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch
from torch import Tensor, nn

from ..errors import ModelError, ShapeError, SimulationError
from .potentials import ZeroPotential
from .potentials import potential_gradient as _potential_gradient
from .potentials import potential_hessian as _potential_hessian

__all__ = ["HamiltonianSystem", "FieldEval"]


class FieldEval(NamedTuple):
    """Vector field and by-products at states ``x (..., 2n)``."""

    G: Tensor  # (..., 2n) (dH/dp, -dH/dq)
    J: Tensor | None  # (..., 2n, 2n) dG/dx
    H: Tensor  # (...) energy
    v: Tensor  # (..., n) M^{-1} p
    L: Tensor  # (..., n, n) Cholesky factor of M
    Hv: Tensor | None = None  # (..., n, n) the control potential's Hessian (its part of J), when J was asked for


class HamiltonianSystem(nn.Module):
    """A fixed-base :class:`~diffmech.RobotModel` as a Hamiltonian system ``(q, p)``, closed by a
    control potential.

    With ``joints`` given, only those joints move and the others stay locked at ``locked``: the
    mass matrix is the matching sub-block of the full one and the potential energy is evaluated at
    the full configuration (the dynamics of the robot with the other joints clamped).

    Args:
        robot: fixed-base robot (``nq == nv``).
        potential: control potential acting on the free coordinates (``None``: zero).
        joints: names of the free joints (default: all, in the robot's order).
        locked: ``(nq,)`` configuration of the locked joints (default: neutral).
        ee_link: link whose origin is the end effector (default: ``"tip"`` if the robot has one,
            else the last link).
    """

    def __init__(self, robot, potential: nn.Module | None = None, *, joints: Sequence[str] | None = None,
                 locked: Tensor | None = None, ee_link: str | None = None):
        super().__init__()
        if robot.floating_base or robot.nq != robot.nv:
            raise ModelError(f"HamiltonianSystem: robot {getattr(robot, 'name', '?')!r} must have a fixed base "
                             f"with nq == nv (got nq={robot.nq}, nv={robot.nv})")
        self.robot = robot
        names = list(robot.joint_names)
        if joints is None:
            idx = list(range(robot.nq))
        else:
            missing = [j for j in joints if j not in names]
            if missing:
                raise ModelError(f"HamiltonianSystem: unknown joints {missing}; the robot has {names}")
            idx = [names.index(j) for j in joints]
        self.joints = [names[i] for i in idx]
        self.n = len(idx)
        self.register_buffer("index", torch.tensor(idx, dtype=torch.long, device=robot.device), persistent=False)
        self.subset = joints is not None and idx != list(range(robot.nq))
        if locked is None:
            locked = robot.neutral_configuration()
        locked = torch.as_tensor(locked, dtype=robot.dtype, device=robot.device)
        if locked.shape != (robot.nq,):
            raise ShapeError(f"HamiltonianSystem: locked must have shape ({robot.nq},), got {tuple(locked.shape)}")
        self.register_buffer("locked", locked.clone(), persistent=False)
        if ee_link is None:
            ee_link = "tip" if "tip" in robot.link_names else robot.link_names[-1]
        if ee_link not in robot.link_names:
            raise ModelError(f"HamiltonianSystem: unknown end-effector link {ee_link!r}")
        self.ee_link = ee_link
        self.potential = potential if potential is not None else ZeroPotential(self.n)
        if getattr(self.potential, "n", self.n) != self.n:
            raise ShapeError(f"HamiltonianSystem: potential acts on {self.potential.n} coordinates, "
                             f"the system has {self.n}")
        self._batched_hessian = True

    # ------------------------------------------------------------------ basic quantities
    @property
    def dtype(self) -> torch.dtype:
        return self.robot.dtype

    @property
    def device(self) -> torch.device:
        return self.robot.device

    def full_configuration(self, q: Tensor) -> Tensor:
        """``(..., n) -> (..., nq)``: free coordinates into the robot's configuration."""
        self._check_q(q)
        if not self.subset:
            return q
        base = self.locked.to(q.dtype).expand(*q.shape[:-1], self.robot.nq)
        return base.scatter(-1, self.index.expand(*q.shape[:-1], self.n), q)

    def _check_q(self, q: Tensor) -> None:
        if q.shape[-1] != self.n:
            raise ShapeError(f"HamiltonianSystem: q must have shape (..., {self.n}), got {tuple(q.shape)}")

    def mass_matrix(self, q: Tensor) -> Tensor:
        """``M(q) (..., n, n)``, kg m^2."""
        M = self.robot.mass_matrix(self.full_configuration(q))
        if self.subset:
            i = self.index
            M = M[..., i, :][..., :, i]
        return M

    def plant_potential(self, q: Tensor) -> Tensor:
        """Gravity plus joint-spring energy ``U(q) (...)``, J."""
        return self.robot.potential_energy(self.full_configuration(q))

    def control_potential(self, q: Tensor) -> Tensor:
        """``V_theta(q) (...)``, J."""
        return self.potential(q)

    def velocity(self, q: Tensor, p: Tensor) -> Tensor:
        """``v = M(q)^{-1} p (..., n)``."""
        L = self._cholesky(self.mass_matrix(q))
        return torch.cholesky_solve(p.unsqueeze(-1), L).squeeze(-1)

    def momentum(self, q: Tensor, v: Tensor) -> Tensor:
        """``p = M(q) v (..., n)``."""
        return (self.mass_matrix(q) @ v.unsqueeze(-1)).squeeze(-1)

    def kinetic_energy(self, q: Tensor, p: Tensor) -> Tensor:
        """``1/2 p^T M^{-1} p (...)``, J."""
        return 0.5 * (p * self.velocity(q, p)).sum(-1)

    def hamiltonian(self, q: Tensor, p: Tensor, *, closed_loop: bool = True) -> Tensor:
        """``H(q, p)`` (plant) or ``H + V_theta`` (``closed_loop``), ``(...)`` J."""
        H = self.kinetic_energy(q, p) + self.plant_potential(q)
        if closed_loop:
            H = H + self.control_potential(q)
        return H

    def _full_velocity(self, v: Tensor) -> Tensor:
        if not self.subset:
            return v
        base = v.new_zeros(*v.shape[:-1], self.robot.nv)
        return base.scatter(-1, self.index.expand(*v.shape[:-1], self.n), v)

    def inverse_dynamics(self, q: Tensor, v: Tensor, a: Tensor) -> Tensor:
        """Generalised forces ``(..., n)`` that give the accelerations ``a`` at ``(q, v)`` (RNEA; joint
        springs included, locked joints held still)."""
        tau = self.robot.inverse_dynamics(self.full_configuration(q), self._full_velocity(v), self._full_velocity(a))
        return tau[..., self.index] if self.subset else tau

    def acceleration(self, q: Tensor, v: Tensor, tau: Tensor) -> Tensor:
        """Accelerations ``(..., n)`` under the generalised forces ``tau`` (plant only)."""
        bias = self.inverse_dynamics(q, v, torch.zeros_like(v))
        return torch.linalg.solve(self.mass_matrix(q), (tau - bias).unsqueeze(-1)).squeeze(-1)

    def end_effector(self, q: Tensor) -> Tensor:
        """World position of :attr:`ee_link`'s origin ``(..., 3)``, m."""
        return self.robot.link_pose(self.full_configuration(q), self.ee_link)[..., :3, 3]

    def control_force(self, q: Tensor, *, create_graph: bool = False) -> Tensor:
        """``u = -dV_theta/dq (..., n)``."""
        return -self.potential.gradient(q, create_graph=create_graph)

    @staticmethod
    def _cholesky(M: Tensor) -> Tensor:
        L, info = torch.linalg.cholesky_ex(M)
        if bool((info != 0).any()):
            raise SimulationError("HamiltonianSystem: the mass matrix is not positive definite "
                                  f"at {int((info != 0).sum())} of {info.numel()} configurations")
        return L

    # ------------------------------------------------------------------ vector field
    def field(self, x: Tensor, *, jacobian: bool = False, create_graph: bool = False,
              closed_loop: bool = True) -> tuple[Tensor, Tensor | None]:
        """Hamiltonian vector field ``G(x) = (dH/dp, -dH/dq)`` and optionally its Jacobian.

        Args:
            x: (..., 2n) states ``(q, p)``.
            jacobian: also return ``dG/dx (..., 2n, 2n)`` (rows: outputs).
            create_graph: keep the graph to ``x`` and to the potential's parameters (for plain
                autograd through a solver); otherwise the results are detached.
            closed_loop: include the control potential.

        Returns:
            ``(G, J)`` with ``J = None`` unless ``jacobian``.
        """
        ev = self.evaluate(x, jacobian=jacobian, create_graph=create_graph, closed_loop=closed_loop, energy=False)
        return ev.G, ev.J

    def evaluate(self, x: Tensor, *, jacobian: bool = False, create_graph: bool = False,
                 closed_loop: bool = True, energy: bool = True) -> FieldEval:
        """:meth:`field` plus the by-products a controller needs (one mass-matrix factorisation).

        Without ``create_graph`` the plant and the control potential are differentiated apart: the
        plant's ``dH/dq`` is the pull-back of ``-1/2 v v^T`` through the mass matrix plus the
        gravity and spring torques (inverse dynamics at rest), both by the rigid-body core (its
        native kernels when they are built, see :meth:`prepare_native`), and the potential's
        derivatives come from :meth:`~diffmech.control.potentials.Potential.gradient` and
        :meth:`~diffmech.control.potentials.Potential.hessian` (closed form for
        :class:`~diffmech.control.potentials.MLPPotential`). With ``jacobian`` the plant's second
        derivatives are taken by autograd through the core. With ``create_graph`` everything goes
        through one autograd graph (double backprop), as a plain autograd solver needs.

        Args:
            energy: also compute ``H`` (otherwise ``FieldEval.H`` is ``None``; saves the potential
                energy's evaluation where only the field is wanted).

        Returns:
            A :class:`FieldEval`: ``G``, ``J``, ``H`` (closed-loop energy when ``closed_loop``),
            ``v = M^{-1} p``, ``L`` (Cholesky factor of ``M``).
        """
        n = self.n
        if x.shape[-1] != 2 * n:
            raise ShapeError(f"HamiltonianSystem.field: x must have shape (..., {2 * n}), got {tuple(x.shape)}")
        if create_graph:
            return self._evaluate_graph(x, jacobian, closed_loop)
        use_v = closed_loop and not isinstance(self.potential, ZeroPotential)
        q = x[..., :n].detach()
        p = x[..., n:].detach()
        H = None
        J = None
        Hv = None
        if not jacobian:
            with torch.enable_grad():
                qq = q.requires_grad_(True)
                M = self.mass_matrix(qq)
            L = self._cholesky(M.detach())
            v = torch.cholesky_solve(p.unsqueeze(-1), L).squeeze(-1)
            (dHq,) = torch.autograd.grad(M, qq, grad_outputs=-0.5 * v.unsqueeze(-1) * v.unsqueeze(-2))
            with torch.no_grad():
                dHq = dHq + self.inverse_dynamics(q.detach(), torch.zeros_like(p), torch.zeros_like(p))
                if energy:
                    H = 0.5 * (p * v).sum(-1) + self.plant_potential(q.detach())
            q = q.detach()
        else:
            with torch.enable_grad():
                qq = q.requires_grad_(True)
                pp = p.requires_grad_(True)
                M = self.mass_matrix(qq)
                L = self._cholesky(M)
                v = torch.cholesky_solve(pp.unsqueeze(-1), L).squeeze(-1)
                Hp = 0.5 * (pp * v).sum(-1) + self.plant_potential(qq)
                (dHq,) = torch.autograd.grad(Hp.sum(), qq, create_graph=True)
                Hqq, Hqp = self._hessian_rows(dHq, qq, pp)
                Minv = torch.cholesky_inverse(L)
            q, dHq, v, L, H = q.detach(), dHq.detach(), v.detach(), L.detach(), Hp.detach()
            Hqq, Hqp, Minv = Hqq.detach(), Hqp.detach(), Minv.detach()
        if use_v:
            if jacobian:
                Hv = _potential_hessian(self.potential, q)
                Hqq = Hqq + Hv
            dHq = dHq + _potential_gradient(self.potential, q)
            if H is not None:
                with torch.no_grad():
                    H = H + self.potential(q)
        if jacobian:
            top = torch.cat([Hqp.transpose(-1, -2), Minv], -1)
            bottom = torch.cat([-Hqq, -Hqp], -1)
            J = torch.cat([top, bottom], -2)
        G = torch.cat([v, -dHq], -1)
        return FieldEval(G, J, H, v, L, Hv)

    def _evaluate_graph(self, x: Tensor, jacobian: bool, closed_loop: bool) -> FieldEval:
        """:meth:`evaluate` with ``create_graph``: one autograd graph through the core and the potential."""
        n = self.n
        with torch.enable_grad():
            if not x.requires_grad:
                x = x.detach().requires_grad_(True)
            q, p = x[..., :n], x[..., n:]
            M = self.mass_matrix(q)
            L = self._cholesky(M)
            v = torch.cholesky_solve(p.unsqueeze(-1), L).squeeze(-1)
            H = 0.5 * (p * v).sum(-1) + self.plant_potential(q)
            if closed_loop and not isinstance(self.potential, ZeroPotential):
                H = H + self.potential(q)
            (dHq,) = torch.autograd.grad(H.sum(), q, create_graph=True)
            J = None
            if jacobian:
                Hqq, Hqp = self._hessian_rows(dHq, q, p)
                Minv = torch.cholesky_inverse(L)
                top = torch.cat([Hqp.transpose(-1, -2), Minv], -1)
                bottom = torch.cat([-Hqq, -Hqp], -1)
                J = torch.cat([top, bottom], -2).detach()
        G = torch.cat([v, -dHq], -1)
        return FieldEval(G, J, H, v, L)

    def prepare_native(self, gradients: bool = True) -> bool:
        """Build (or load from the disk store) the native kernels of the mass matrix and the
        inverse dynamics that :meth:`evaluate` uses for the robot's tree and dtype; returns
        whether they are available (without them the torch implementation runs, with the same
        results)."""
        from ..dynamics import kernels

        if not self.device.type == "cpu":
            return False
        try:
            kernels.prepare(self.robot, algorithms=("mass_matrix", "inverse_dynamics"), dtypes=(self.dtype,),
                            gradients=gradients)
        except (kernels.NativeUnavailable, OSError):
            return False
        return True

    def _hessian_rows(self, dHq: Tensor, q: Tensor, p: Tensor) -> tuple[Tensor, Tensor]:
        """``d(dH/dq)/dq`` and ``d(dH/dq)/dp``, ``(..., n, n)`` each (row i: derivative of component i)."""
        n = self.n
        if self._batched_hessian:
            eye = torch.eye(n, dtype=q.dtype, device=q.device)
            basis = eye.reshape(n, *([1] * (q.dim() - 1)), n).expand(n, *q.shape)
            try:
                hq, hp = torch.autograd.grad(dHq, (q, p), grad_outputs=basis, is_grads_batched=True,
                                             retain_graph=True, allow_unused=True)
                return self._zeros_if_none(hq, q).movedim(0, -2), self._zeros_if_none(hp, q).movedim(0, -2)
            except RuntimeError:  # an operation without a batching rule: fall back to a loop
                self._batched_hessian = False
        rows_q, rows_p = [], []
        for i in range(n):
            hq, hp = torch.autograd.grad(dHq[..., i].sum(), (q, p), retain_graph=True, allow_unused=True)
            rows_q.append(self._zeros_if_none(hq, q))
            rows_p.append(self._zeros_if_none(hp, q))
        return torch.stack(rows_q, -2), torch.stack(rows_p, -2)

    @staticmethod
    def _zeros_if_none(t: Tensor | None, like: Tensor) -> Tensor:
        return torch.zeros_like(like) if t is None else t

    def extra_repr(self) -> str:
        return f"n={self.n}, joints={self.joints}, ee_link={self.ee_link!r}"

