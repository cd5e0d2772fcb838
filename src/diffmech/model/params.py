"""Parametrizations that keep learnable physical parameters physical.

Two kinds of module live here:

* ``torch.nn.utils.parametrize`` parametrizations for one tensor, used with
  ``robot.make_link_param_learnable(link, name, parametrization)``: :class:`PositiveScalar`
  (mass, damping, stiffness) and :class:`SymmetricPositiveDefinite` (a 3x3 rotational inertia).
  Each has ``forward(raw) -> value`` and ``right_inverse(value) -> raw``, so registering it keeps
  the parameter's current value.
* Joint parametrizations of all ten inertial parameters of a link, installed as the link's
  ``inertial_source`` by :func:`make_link_inertial_learnable`:
  :class:`PhysicallyConsistentInertial` (log-Cholesky factor of the pseudo-inertia, Rucker &
  Wensing 2022) and :class:`IndependentInertial` (positive mass, free centre of mass, SPD inertia).

Only the pseudo-inertia form guarantees *physical consistency*: a positive mass distribution
exists with these moments, i.e. ``m > 0`` and the principal moments about the centre of mass obey
the triangle inequality ``I1 <= I2 + I3``. A positive-definite inertia tensor alone does not.

Reference: C. Rucker and P. M. Wensing, "Smooth Parameterization of Rigid-Body Inertia",
IEEE Robotics and Automation Letters 7(2), 2022, pp. 2771-2778.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from ..errors import ModelError

__all__ = [
    "ValueSource",
    "is_value_source",
    "PositiveScalar",
    "SymmetricPositiveDefinite",
    "PhysicallyConsistentInertial",
    "IndependentInertial",
    "make_link_inertial_learnable",
    "pseudo_inertia",
    "inertial_from_pseudo_inertia",
    "inertial_to_log_cholesky",
    "log_cholesky_to_inertial",
    "is_physically_consistent",
    "standard_inertial_parameters",
    "inertial_from_standard_parameters",
    "inertial_regressor",
]


# ---------------------------------------------------------------------------- scalar helpers
def _softplus(x: Tensor) -> Tensor:
    # logaddexp is exact for large x (F.softplus switches to the identity above a threshold,
    # which breaks a 1e-12 round trip) and never overflows.
    return torch.logaddexp(x, torch.zeros_like(x))


def _softplus_inverse(y: Tensor) -> Tensor:
    # log(exp(y) - 1) written so that it neither overflows for large y nor cancels for small y.
    return y + torch.log(-torch.expm1(-y))


_POSITIVE = {
    "softplus": (_softplus, _softplus_inverse),
    "exp": (torch.exp, torch.log),
}


def _positive_map(kind: str):
    if kind not in _POSITIVE:
        raise ModelError(f"unknown positive map '{kind}'; choose from {sorted(_POSITIVE)}")
    return _POSITIVE[kind]


def _flip(x: Tensor) -> Tensor:
    return x.flip(-1).flip(-2)


def _upper_cholesky(A: Tensor) -> tuple[Tensor, Tensor]:
    """``U`` upper-triangular with ``A = U U^T`` (the Cholesky factor of the index-reversed matrix).

    Returns ``(U, info)``; ``info != 0`` where ``A`` is not positive definite.
    """
    L, info = torch.linalg.cholesky_ex(_flip(A))
    return _flip(L), info


# ---------------------------------------------------------------------------- value sources
def is_value_source(module: nn.Module) -> bool:
    """Whether ``module`` computes a value by itself: its ``forward`` takes no required argument
    (differentiable-robot-model's style, ``PositiveScalar()()``), unlike a parametrization, which
    maps a raw tensor to the value (``forward(raw)``)."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return False
    return not any(
        p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        for p in sig.parameters.values()
    )


class ValueSource(nn.Module):
    """A module that produces a parameter's value by itself, installed as its parametrization.

    ``robot.make_link_param_learnable(link, name, source)`` with a ``source`` whose ``forward()``
    takes no argument wraps it in this class: the parameter's value is ``source()`` reshaped to the
    parameter's shape (``(1,)`` or ``(1, 3)`` outputs are accepted for a scalar or a 3-vector) and cast
    to the model's dtype; the source's own tensors are the trainable ones. Unlike a parametrization
    with ``right_inverse``, the value starts where the source starts (its own initialisation), not at
    the parameter's current value.

    Args:
        source: the module; ``source()`` returns a tensor with as many elements as the parameter.
        shape: the parameter's shape (``()`` for a mass, ``(3,)``, ``(3, 3)``).
        what: a name for error messages (``"link 'iiwa_link_1': mass"``).
    """

    # learnable_parameters(readable=True) leaves this child's name out: "iiwa_link_1.mass.l".
    _readable_skip = "source"
    # Loading a state dict cannot set the value through it (no right_inverse); see persistence.
    computes_value = True

    def __init__(self, source: nn.Module, shape: Sequence[int], what: str = "parameter"):
        super().__init__()
        self.source = source
        self.shape = tuple(int(n) for n in shape)
        self.what = what

    def forward(self, current: Tensor) -> Tensor:
        """``current`` (the frozen tensor the value replaces) gives only the dtype; -> ``source()``."""
        value = self.source()
        if not isinstance(value, Tensor) or value.numel() != math.prod(self.shape):
            raise ModelError(
                f"{self.what}: {type(self.source).__name__}() returned "
                f"{tuple(value.shape) if isinstance(value, Tensor) else type(value).__name__}, "
                f"expected {math.prod(self.shape)} values for shape {self.shape}"
            )
        return value.reshape(self.shape).to(current.dtype)

    def extra_repr(self) -> str:
        return f"shape={self.shape}"


# ---------------------------------------------------------------------------- single-tensor parametrizations
class PositiveScalar(nn.Module):
    """``value = min_value + softplus(raw)``: a parameter kept above ``min_value``.

    For masses (kg), joint damping (N m s/rad), spring stiffness (N m/rad), ... Any shape works
    (elementwise); the raw tensor has the value's shape and dtype.

    Args:
        min_value: lower bound of the value, in the parameter's units.
        floor: :meth:`right_inverse` lifts values closer than ``floor`` to ``min_value`` (a
            damping of exactly 0, say) to ``min_value + floor``, so the raw parameter is finite and
            its gradient does not vanish.
    """

    def __init__(self, min_value: float = 0.0, *, floor: float = 1e-6):
        super().__init__()
        if not floor > 0:
            raise ModelError(f"PositiveScalar: floor must be positive, got {floor}")
        self.min_value = float(min_value)
        self.floor = float(floor)

    def forward(self, raw: Tensor) -> Tensor:
        """``raw (...)`` unconstrained -> ``value (...)`` > ``min_value``."""
        return self.min_value + _softplus(raw)

    def right_inverse(self, value: Tensor) -> Tensor:
        """``value (...)`` >= ``min_value`` -> ``raw (...)`` with ``forward(raw) == value``."""
        y = value - self.min_value
        if bool((y < 0).any()):
            raise ModelError(
                f"PositiveScalar: value {value.detach().tolist()} is below min_value {self.min_value}"
            )
        return _softplus_inverse(y.clamp(min=self.floor))

    def extra_repr(self) -> str:
        return f"min_value={self.min_value}"


class SymmetricPositiveDefinite(nn.Module):
    """``value = L L^T + eps I`` with ``L`` lower-triangular and a positive diagonal.

    For a rotational inertia about the centre of mass (kg m^2) or any ``(..., n, n)`` SPD matrix.
    The raw tensor has the value's shape: its strict lower triangle is ``L``'s, its diagonal is
    ``L``'s diagonal mapped back through the positive map (``log`` for ``"exp"``, the log-Cholesky
    form), and its upper triangle is ignored (kept at zero by :meth:`right_inverse`).

    This keeps the inertia positive definite, not physically consistent: use
    :class:`PhysicallyConsistentInertial` to also enforce the triangle inequality.

    Args:
        eps: added multiple of the identity, a lower bound on the eigenvalues (value units).
        diag: ``"exp"`` (default) or ``"softplus"``, the map making ``L``'s diagonal positive.
    """

    def __init__(self, eps: float = 0.0, *, diag: str = "exp"):
        super().__init__()
        if eps < 0:
            raise ModelError(f"SymmetricPositiveDefinite: eps must be >= 0, got {eps}")
        self.eps = float(eps)
        self.diag = diag
        self._pos, self._pos_inv = _positive_map(diag)

    def forward(self, raw: Tensor) -> Tensor:
        """``raw (..., n, n)`` -> SPD ``value (..., n, n)``."""
        L = raw.tril(-1) + torch.diag_embed(self._pos(raw.diagonal(dim1=-2, dim2=-1)))
        value = L @ L.mT
        if self.eps:
            value = value + self.eps * torch.eye(raw.shape[-1], dtype=raw.dtype, device=raw.device)
        return value

    def right_inverse(self, value: Tensor) -> Tensor:
        """SPD ``value (..., n, n)`` (all eigenvalues above ``eps``) -> ``raw (..., n, n)``."""
        if value.dim() < 2 or value.shape[-1] != value.shape[-2]:
            raise ModelError(f"SymmetricPositiveDefinite: expected a square matrix, got shape {tuple(value.shape)}")
        A = 0.5 * (value + value.mT)
        if self.eps:
            A = A - self.eps * torch.eye(A.shape[-1], dtype=A.dtype, device=A.device)
        L, info = torch.linalg.cholesky_ex(A)
        if bool((info != 0).any()):
            eig = torch.linalg.eigvalsh(0.5 * (value + value.mT)).detach()
            raise ModelError(
                f"SymmetricPositiveDefinite: value is not positive definite above eps={self.eps} "
                f"(eigenvalues {eig.tolist()})"
            )
        return L.tril(-1) + torch.diag_embed(self._pos_inv(L.diagonal(dim1=-2, dim2=-1)))

    def extra_repr(self) -> str:
        return f"eps={self.eps}, diag={self.diag!r}"


# ---------------------------------------------------------------------------- pseudo-inertia algebra
def pseudo_inertia(mass: Tensor, com: Tensor, inertia: Tensor) -> Tensor:
    """The 4x4 pseudo-inertia ``J = [[Sigma_O, h], [h^T, m]]`` of a rigid body.

    ``h = m c`` and ``Sigma_O = 0.5 tr(I_O) 1 - I_O`` is the second moment of the mass
    distribution about the frame origin, ``I_O`` the rotational inertia about the origin.
    ``J`` is positive definite exactly when the parameters are (strictly) physically consistent.

    Args:
        mass: (...) kg.
        com: (..., 3) centre of mass in the frame, m.
        inertia: (..., 3, 3) rotational inertia about the centre of mass, frame axes, kg m^2.

    Returns:
        (..., 4, 4) ``J`` in kg, kg m, kg m^2 blocks.
    """
    m = mass[..., None, None]
    eye = torch.eye(3, dtype=com.dtype, device=com.device)
    # Second moment about the COM, then shifted to the origin by the parallel-axis theorem.
    Sigma_c = 0.5 * inertia.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] * eye - inertia
    Sigma_o = Sigma_c + m * com[..., :, None] * com[..., None, :]
    h = mass[..., None] * com
    top = torch.cat([Sigma_o, h[..., :, None]], dim=-1)
    bottom = torch.cat([h[..., None, :], mass[..., None, None]], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def inertial_from_pseudo_inertia(J: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`pseudo_inertia`: ``J (..., 4, 4) -> (mass (...), com (..., 3), inertia (..., 3, 3))``.

    ``mass`` must be nonzero; the inertia is about the centre of mass.
    """
    mass = J[..., 3, 3]
    com = J[..., :3, 3] / mass[..., None]
    Sigma_c = J[..., :3, :3] - mass[..., None, None] * com[..., :, None] * com[..., None, :]
    eye = torch.eye(3, dtype=J.dtype, device=J.device)
    inertia = Sigma_c.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] * eye - Sigma_c
    return mass, com, inertia


def is_physically_consistent(mass: Tensor, com: Tensor, inertia: Tensor, *, tol: float = 0.0) -> Tensor:
    """Whether the pseudo-inertia is positive definite (smallest eigenvalue > ``tol``).

    Shapes as in :func:`pseudo_inertia`; returns a bool tensor of shape ``(...)``. Equivalent to
    ``mass > 0`` and strict triangle inequalities of the principal moments about the COM.
    """
    J = pseudo_inertia(mass, com, inertia)
    return torch.linalg.eigvalsh(0.5 * (J + J.mT))[..., 0] > tol


# Order of the ten log-Cholesky coordinates, as in Rucker & Wensing (2022).
_THETA_NAMES = ("alpha", "d1", "d2", "d3", "s12", "s23", "s13", "t1", "t2", "t3")


def log_cholesky_to_inertial(theta: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Map log-Cholesky coordinates to physically consistent inertial parameters.

    ``theta = (alpha, d1, d2, d3, s12, s23, s13, t1, t2, t3)`` defines
    ``U = e^alpha [[e^d1, s12, s13, t1], [0, e^d2, s23, t2], [0, 0, e^d3, t3], [0, 0, 0, 1]]`` and
    the pseudo-inertia ``J = U U^T`` (Rucker & Wensing 2022). Every ``theta`` in R^10 gives a
    positive-definite ``J``, and every positive-definite ``J`` has exactly one ``theta``. Writing
    ``U = e^alpha [[D, t], [0, 1]]``: ``m = e^(2 alpha)``, ``c = t`` and the second moment about the
    COM is ``m D D^T``, which is how the values are formed here (no subtraction of large terms).

    Args:
        theta: (..., 10) unconstrained.

    Returns:
        ``mass (...)`` kg, ``com (..., 3)`` m, ``inertia (..., 3, 3)`` about the COM, kg m^2.
    """
    alpha, d1, d2, d3, s12, s23, s13 = theta[..., :7].unbind(-1)
    t = theta[..., 7:10]
    z = torch.zeros_like(alpha)
    D = torch.stack(
        [d1.exp(), s12, s13, z, d2.exp(), s23, z, z, d3.exp()], dim=-1
    ).reshape(*theta.shape[:-1], 3, 3)
    mass = torch.exp(2 * alpha)
    Sigma_c = mass[..., None, None] * (D @ D.mT)
    eye = torch.eye(3, dtype=theta.dtype, device=theta.device)
    inertia = Sigma_c.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] * eye - Sigma_c
    return mass, t, inertia


def inertial_to_log_cholesky(mass: Tensor, com: Tensor, inertia: Tensor) -> Tensor:
    """Inverse of :func:`log_cholesky_to_inertial`.

    ``(mass (...), com (..., 3), inertia (..., 3, 3) about the COM) -> theta (..., 10)``.

    Raises:
        ModelError: the parameters are not strictly physically consistent (``mass <= 0``, or a
            principal moment about the COM not strictly below the sum of the other two).
    """
    mass = torch.as_tensor(mass, dtype=com.dtype, device=com.device)
    if bool((mass <= 0).any()):
        raise ModelError(f"physically consistent parametrization needs a positive mass, got {mass.tolist()}")
    eye = torch.eye(3, dtype=com.dtype, device=com.device)
    Ic = 0.5 * (inertia + inertia.mT)
    Sigma_c = 0.5 * Ic.diagonal(dim1=-2, dim2=-1).sum(-1)[..., None, None] * eye - Ic
    D, info = _upper_cholesky(Sigma_c / mass[..., None, None])
    if bool((info != 0).any()):
        moments = torch.linalg.eigvalsh(Ic).detach()
        raise ModelError(
            "physically consistent parametrization needs principal moments about the COM that satisfy the "
            f"strict triangle inequality, got {moments.tolist()} kg m^2"
        )
    alpha = 0.5 * torch.log(mass)
    d = torch.log(D.diagonal(dim1=-2, dim2=-1))
    s = torch.stack([D[..., 0, 1], D[..., 1, 2], D[..., 0, 2]], dim=-1)
    return torch.cat([alpha[..., None], d, s, com], dim=-1)


# ---------------------------------------------------------------------------- ten-parameter modules
def _current_inertial(link_params: nn.Module) -> tuple[Tensor, Tensor, Tensor]:
    with torch.no_grad():
        mass, com, inertia = link_params.inertial()
    return mass.detach().clone(), com.detach().clone(), inertia.detach().clone()


class PhysicallyConsistentInertial(nn.Module):
    """All ten inertial parameters of a link, physically consistent by construction.

    Holds ``theta``, a ``(10,)`` :class:`torch.nn.Parameter` of log-Cholesky coordinates of the
    pseudo-inertia (see :func:`log_cholesky_to_inertial`; Rucker & Wensing, IEEE RA-L 2022),
    initialised from the link's current values. Every value of ``theta`` gives ``mass > 0`` and
    principal moments that satisfy the triangle inequality; the map is smooth and one-to-one, so
    optimisers can move freely in R^10. ``theta[7:10]`` is the centre of mass itself (m) and
    ``exp(2 theta[0])`` the mass.

    Install with :func:`make_link_inertial_learnable` (which sets the link's ``inertial_source``).

    Args:
        link_params: the link's :class:`~diffmech.model.parameters.LinkParams`; its current mass, COM
            and inertia must be strictly physically consistent (a massless link is not).
    """

    def __init__(self, link_params: nn.Module):
        super().__init__()
        mass, com, inertia = _current_inertial(link_params)
        theta = inertial_to_log_cholesky(mass, com, inertia)
        self.theta = nn.Parameter(theta)
        # A badly conditioned inertia (nearly violating the triangle inequality) would not survive
        # the round trip; fail now rather than silently change the model.
        m2, c2, I2 = log_cholesky_to_inertial(theta)
        tol = torch.finfo(theta.dtype).eps ** 0.5
        scale = float(inertia.abs().max()) + float(mass) * float(com.square().sum())
        if (
            abs(float(m2 - mass)) > tol * float(mass)
            or float((c2 - com).abs().max()) > tol * (1.0 + float(com.abs().max()))
            or float((I2 - inertia).abs().max()) > tol * max(scale, 1e-30)
        ):
            raise ModelError(
                "PhysicallyConsistentInertial: the link's inertial parameters do not survive the "
                "log-Cholesky round trip (nearly degenerate inertia)"
            )

    def forward(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(mass ()`` kg, ``com (3,)`` m in the link frame, ``inertia (3, 3)`` kg m^2 about the COM)."""
        return log_cholesky_to_inertial(self.theta)

    def set_inertial(self, mass: Tensor, com: Tensor, inertia: Tensor) -> None:
        """Set ``theta`` in place so that :meth:`forward` gives these values (used by ``load_state_dict``).

        Raises:
            ModelError: the values are not strictly physically consistent.
        """
        kw = dict(dtype=self.theta.dtype, device=self.theta.device)
        theta = inertial_to_log_cholesky(torch.as_tensor(mass, **kw), torch.as_tensor(com, **kw),
                                         torch.as_tensor(inertia, **kw))
        with torch.no_grad():
            self.theta.copy_(theta)


class IndependentInertial(nn.Module):
    """Mass, centre of mass and inertia as three independent learnable tensors.

    ``mass = softplus(mass_raw)`` (:class:`PositiveScalar`), ``com`` free (m, link frame),
    ``inertia = L L^T`` (:class:`SymmetricPositiveDefinite`, about the COM, kg m^2). Keeps the
    mass positive and the inertia positive definite, but not the triangle inequality; the usual
    choice before physical consistency was understood, kept for comparison.

    Args:
        link_params: the link's :class:`~diffmech.model.parameters.LinkParams` (initial values); the
            inertia must be positive definite.
        diag: positive map of the Cholesky diagonal, ``"exp"`` or ``"softplus"``.
    """

    def __init__(self, link_params: nn.Module, *, diag: str = "exp"):
        super().__init__()
        mass, com, inertia = _current_inertial(link_params)
        self.mass_map = PositiveScalar()
        self.inertia_map = SymmetricPositiveDefinite(diag=diag)
        self.mass_raw = nn.Parameter(self.mass_map.right_inverse(mass))
        self.com = nn.Parameter(com)
        self.inertia_raw = nn.Parameter(self.inertia_map.right_inverse(inertia))

    def forward(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(mass ()`` kg, ``com (3,)`` m in the link frame, ``inertia (3, 3)`` kg m^2 about the COM)."""
        return self.mass_map(self.mass_raw), self.com, self.inertia_map(self.inertia_raw)

    def set_inertial(self, mass: Tensor, com: Tensor, inertia: Tensor) -> None:
        """Set the raw tensors in place so that :meth:`forward` gives these values (used by
        ``load_state_dict``).

        Raises:
            ModelError: a negative mass or an inertia that is not positive definite.
        """
        kw = dict(dtype=self.com.dtype, device=self.com.device)
        with torch.no_grad():
            self.mass_raw.copy_(self.mass_map.right_inverse(torch.as_tensor(mass, **kw)))
            self.com.copy_(torch.as_tensor(com, **kw))
            self.inertia_raw.copy_(self.inertia_map.right_inverse(torch.as_tensor(inertia, **kw)))


_INERTIAL_KINDS = {
    "physically_consistent": PhysicallyConsistentInertial,
    "independent": IndependentInertial,
}


def make_link_inertial_learnable(robot, link: str, kind: str = "physically_consistent") -> nn.Module:
    """Make all ten inertial parameters of ``link`` learnable through one module.

    Sets ``robot.link_params(link).inertial_source`` to a new :class:`PhysicallyConsistentInertial`
    or :class:`IndependentInertial` initialised from the link's current values, so the model is
    unchanged until the parameters are trained. While a source is installed, the link's own
    ``mass``/``com``/``inertia`` tensors are not read; any of them made learnable before is frozen.
    To stop training the source: ``module.requires_grad_(False)``.

    Args:
        robot: a :class:`~diffmech.RobotModel`.
        link: link name.
        kind: ``"physically_consistent"`` (default) or ``"independent"``.

    Returns:
        The installed module (its parameters are also in ``robot.parameters()``).

    Raises:
        ModelError: unknown ``kind`` or link, or initial values outside the parametrization's range
            (e.g. a massless link for ``"physically_consistent"``), naming the link.
    """
    if kind not in _INERTIAL_KINDS:
        raise ModelError(f"unknown inertial parametrization kind '{kind}'; choose from {sorted(_INERTIAL_KINDS)}")
    lp = robot.link_params(link)
    try:
        module = _INERTIAL_KINDS[kind](lp)
    except ModelError as e:
        raise ModelError(f"{robot.name}: link '{link}': {e}") from None
    for name in ("mass", "com", "inertia"):
        robot.freeze_link_param(link, name)
    lp.inertial_source = module
    return module


# ---------------------------------------------------------------------------- linear (standard) parameters
_UPPER = ([0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2])


def standard_inertial_parameters(mass: Tensor, com: Tensor, inertia: Tensor) -> Tensor:
    """The ten parameters in which the dynamics is linear.

    ``pi = (m, m c_x, m c_y, m c_z, I_xx, I_xy, I_xz, I_yy, I_yz, I_zz)`` with ``I`` the rotational
    inertia about the *link origin* (parallel-axis theorem), link axes.

    Args:
        mass: (...) kg.
        com: (..., 3) centre of mass in the link frame, m.
        inertia: (..., 3, 3) about the centre of mass, kg m^2.

    Returns:
        (..., 10) in kg, kg m, kg m^2.
    """
    m = mass[..., None, None]
    eye = torch.eye(3, dtype=com.dtype, device=com.device)
    I_o = inertia + m * ((com * com).sum(-1)[..., None, None] * eye - com[..., :, None] * com[..., None, :])
    return torch.cat([mass[..., None], mass[..., None] * com, I_o[..., _UPPER[0], _UPPER[1]]], dim=-1)


def inertial_from_standard_parameters(pi: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Inverse of :func:`standard_inertial_parameters` (the mass must be nonzero).

    ``pi (..., 10) -> (mass (...), com (..., 3), inertia (..., 3, 3) about the COM)``.
    """
    mass = pi[..., 0]
    com = pi[..., 1:4] / mass[..., None]
    I_o = pi[..., [4, 5, 6, 5, 7, 8, 6, 8, 9]].unflatten(-1, (3, 3))
    eye = torch.eye(3, dtype=pi.dtype, device=pi.device)
    m = mass[..., None, None]
    inertia = I_o - m * ((com * com).sum(-1)[..., None, None] * eye - com[..., :, None] * com[..., None, :])
    return mass, com, inertia


class _StandardSource(nn.Module):
    # Reads its ten parameters from a plain attribute so a functional transform can feed them.
    def __init__(self, pi: Tensor):
        super().__init__()
        self.pi = pi

    def forward(self) -> tuple[Tensor, Tensor, Tensor]:
        return inertial_from_standard_parameters(self.pi)


def inertial_regressor(robot, q: Tensor, v: Tensor, a: Tensor, links: Sequence[str] | None = None) -> Tensor:
    """Joint-force regressor of the inertial parameters: ``tau = Y pi + tau_rest``.

    The rigid-body joint forces (``inverse_dynamics(..., passive=False)``) are linear in each
    link's :func:`standard_inertial_parameters`; ``Y`` holds the coefficients, computed exactly by
    forward-mode differentiation. ``pi`` stacks the ten parameters of each link of ``links`` in
    order, and ``tau_rest`` is the contribution of the other links. ``Y`` depends on ``q, v, a``
    and the kinematics only, not on any inertial parameter. The robot is left unchanged (its
    ``inertial_source`` entries are swapped for the computation and restored).

    Args:
        robot: a :class:`~diffmech.RobotModel`.
        q: (..., nq), v: (..., nv), a: (..., nv) states and accelerations.
        links: link names (default: every link that moves, i.e. not rigidly fixed to the world).

    Returns:
        (..., nv, 10 * len(links)) in the units that make ``Y pi`` N m (or N).
    """
    from torch.func import jacfwd

    if links is None:
        links = [n for n, b in zip(robot.link_names, robot.link_body) if b >= 0]
    links = list(links)
    lps = [robot.link_params(n) for n in links]
    kw = dict(dtype=robot.dtype, device=robot.device)
    # Y does not depend on pi: any valid point serves (unit mass, unit inertia about the origin).
    one = torch.tensor([1.0, 0, 0, 0, 1, 0, 0, 1, 0, 1], **kw)
    pi0 = one.repeat(len(links))
    sources = [_StandardSource(one) for _ in links]
    saved = [lp.inertial_source for lp in lps]

    def torques(pi: Tensor) -> Tensor:
        for k, src in enumerate(sources):
            src.pi = pi[10 * k: 10 * k + 10]
        return robot.inverse_dynamics(q, v, a, passive=False)

    try:
        for lp, src in zip(lps, sources):
            lp.inertial_source = src
        return jacfwd(torques)(pi0)
    finally:
        for lp, old in zip(lps, saved):
            lp.inertial_source = old
