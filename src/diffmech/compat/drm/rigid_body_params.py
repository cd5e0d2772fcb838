"""differentiable-robot-model's parametrizations of learnable link parameters, as value sources.

Each class is an ``nn.Module`` whose ``forward()`` takes no argument and returns a parameter's value
(differentiable-robot-model's convention); ``make_link_param_learnable(link, name, module)`` -- of
:class:`~diffmech.compat.drm.DifferentiableRobotModel` or of a native :class:`diffmech.RobotModel` --
installs it as the parameter's parametrization (:class:`diffmech.model.params.ValueSource`), so its
tensors are the ones an optimiser trains. The constructors take differentiable-robot-model's
arguments and draw their random initial values in the same order and shapes, so under the same
``torch.manual_seed`` they start from the same numbers; without ``init_param`` the value starts
there, not at the URDF's value.

Shapes of the values: scalars ``()`` (:class:`PositiveScalar`) or ``(1,)`` (:class:`UnconstrainedScalar`),
:class:`UnconstrainedTensor` ``(dim1, dim2)`` (``(1, 3)`` for a translation, centre of mass or rpy,
``(3, 3)`` for an inertia), the inertia networks ``(3, 3)`` in kg m^2 about the centre of mass.

For new code, diffmech's own parametrizations start from the current value and cover the physical
constraints: :class:`diffmech.model.params.PositiveScalar` (softplus),
:class:`~diffmech.model.params.SymmetricPositiveDefinite` (log-Cholesky, the counterpart of
:class:`SymmPosDef3DInertiaMatrixNet`), and
:func:`~diffmech.model.params.make_link_inertial_learnable` for all ten inertial parameters of a link
kept physically consistent (which :class:`CovParameterized3DInertiaMatrixNet` and
:class:`TriangParam3DInertiaMatrixNet` approach for the rotational inertia alone).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ... import spatial
from ...errors import ModelError

__all__ = [
    "UnconstrainedScalar",
    "PositiveScalar",
    "UnconstrainedTensor",
    "SymmPosDef3DInertiaMatrixNet",
    "CovParameterized3DInertiaMatrixNet",
    "Symm3DInertiaMatrixNet",
    "TriangParam3DInertiaMatrixNet",
]

# The order of the six numbers of a symmetric 3x3 or of a lower-triangular factor: the diagonal,
# then the strict lower triangle row by row ((1, 0), (2, 0), (2, 1)).
_ROWS = (0, 1, 2, 1, 2, 2)
_COLS = (0, 1, 2, 0, 0, 1)


def _tensor(x, what: str) -> Tensor:
    t = x if isinstance(x, Tensor) else torch.as_tensor(x, dtype=torch.get_default_dtype())
    if not t.dtype.is_floating_point:
        t = t.to(torch.get_default_dtype())
    if not bool(torch.isfinite(t).all()):
        raise ModelError(f"{what}: initial value is not finite: {t.tolist()}")
    return t.detach().clone()


def _matrix3(x, what: str) -> Tensor:
    """A (3, 3) initial matrix from (3, 3) or (1, 3, 3)."""
    t = _tensor(x, what)
    if t.numel() != 9:
        raise ModelError(f"{what}: init_param must be a 3x3 matrix, got shape {tuple(t.shape)}")
    return t.reshape(3, 3)


def _lower(l: Tensor) -> Tensor:
    """``l (6,)`` -> lower-triangular ``L (3, 3)`` (diagonal first, as :data:`_ROWS`)."""
    z = l.new_zeros(())
    return torch.stack([l[0], z, z, l[3], l[1], z, l[4], l[5], l[2]]).reshape(3, 3)


def _six(M: Tensor) -> Tensor:
    return M[list(_ROWS), list(_COLS)]


def _cholesky(A: Tensor, what: str) -> Tensor:
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) != 0:
        raise ModelError(f"{what}: init_param is not positive definite above the bias "
                         f"(eigenvalues {torch.linalg.eigvalsh(A).tolist()})")
    return L


class UnconstrainedScalar(nn.Module):
    """A free scalar, ``(1,)``: ``init_val``, or uniform in [0, 1)."""

    def __init__(self, init_val=None):
        super().__init__()
        value = torch.rand(1) if init_val is None else _tensor(init_val, "UnconstrainedScalar")
        self.param = nn.Parameter(value)

    def forward(self) -> Tensor:
        return self.param


class PositiveScalar(nn.Module):
    """``value = l^2 + min_val`` (shape ``()``), kept at or above ``min_val``.

    Args:
        min_val: lower bound.
        init_param_std: standard deviation of the random initial ``l``.
        init_param: initial value (``l = sqrt(init_param - min_val)``) instead of a random one.
    """

    def __init__(self, min_val: float = 0.0, init_param_std: float = 1.0, init_param=None):
        super().__init__()
        self._min_val = min_val
        if init_param is None:
            raw = torch.empty(1, 1).normal_(mean=0.0, std=init_param_std)
        else:
            v = _tensor(init_param, "PositiveScalar")
            if bool((v < min_val).any()):
                raise ModelError(f"PositiveScalar: init_param {v.tolist()} is below min_val {min_val}")
            raw = torch.sqrt(v - min_val)
        self.l = nn.Parameter(raw.squeeze())

    def forward(self) -> Tensor:
        return (self.l * self.l + self._min_val).squeeze()


class UnconstrainedTensor(nn.Module):
    """A free ``(dim1, dim2)`` tensor: ``init_tensor``, or normal with ``init_std``."""

    def __init__(self, dim1: int, dim2: int, init_tensor=None, init_std: float = 0.1):
        super().__init__()
        self._dim1, self._dim2 = dim1, dim2
        if init_tensor is None:
            value = torch.empty(dim1, dim2).normal_(mean=0.0, std=init_std)
        else:
            value = _tensor(init_tensor, "UnconstrainedTensor")
        self.param = nn.Parameter(value)

    def forward(self) -> Tensor:
        return self.param


class Symm3DInertiaMatrixNet(nn.Module):
    """A symmetric 3x3 (not necessarily positive definite): six free numbers ``l``, the diagonal
    then the strict lower triangle. ``init_param``: a (3, 3) or (1, 3, 3) initial matrix."""

    def __init__(self, init_param_std: float = 0.01, init_param=None, is_initializing_params: bool = True):
        super().__init__()
        if init_param is None or not is_initializing_params:
            l = torch.empty(1, 6).normal_(mean=0.0, std=init_param_std).squeeze()
        else:
            l = _six(_matrix3(init_param, "Symm3DInertiaMatrixNet"))
        self.l = nn.Parameter(l)

    def forward(self) -> Tensor:
        T = _lower(self.l)
        return T + T.mT - torch.diag_embed(self.l[:3])


class SymmPosDef3DInertiaMatrixNet(nn.Module):
    """``value = L L^T + bias I``, ``L`` lower-triangular from six free numbers ``l`` (its diagonal is
    not constrained, so the value is positive semi-definite plus ``bias``).

    ``init_param``: a (3, 3) or (1, 3, 3) positive definite initial inertia (its Cholesky factor after
    removing ``bias``); else ``l`` is normal with ``init_param_std``.
    """

    def __init__(self, bias: float = 1e-7, init_param_std: float = 0.01, init_param=None,
                 is_initializing_params: bool = True):
        super().__init__()
        self.spd_3d_inertia_mat_diag_bias = bias
        if init_param is None or not is_initializing_params:
            l = torch.empty(1, 6).normal_(mean=0.0, std=init_param_std).squeeze()
        else:
            I0 = _matrix3(init_param, "SymmPosDef3DInertiaMatrixNet")
            eye = torch.eye(3, dtype=I0.dtype)
            l = _six(_cholesky(0.5 * (I0 + I0.mT) - bias * eye, "SymmPosDef3DInertiaMatrixNet"))
        self.l = nn.Parameter(l)

    def forward(self) -> Tensor:
        L = _lower(self.l)
        eye = torch.eye(3, dtype=self.l.dtype, device=self.l.device)
        return L @ L.mT + self.spd_3d_inertia_mat_diag_bias * eye


class CovParameterized3DInertiaMatrixNet(nn.Module):
    """Inertia from the density-weighted covariance ``Sigma = L L^T + bias I`` of the body's mass:
    ``I = tr(Sigma) 1 - Sigma`` (Wensing et al., "Linear Matrix Inequalities for Physically
    Consistent Inertial Parameter Identification", 2017), so the principal moments obey the triangle
    inequality. ``init_param``: a (3, 3) or (1, 3, 3) initial inertia.
    """

    def __init__(self, bias: float = 1e-7, init_param_std: float = 0.01, init_param=None,
                 is_initializing_params: bool = True):
        super().__init__()
        self.spd_3d_cov_inertia_mat_diag_bias = bias
        if init_param is None or not is_initializing_params:
            l = torch.empty(1, 6).normal_(mean=0.0, std=init_param_std).squeeze()
        else:
            I0 = _matrix3(init_param, "CovParameterized3DInertiaMatrixNet")
            I0 = 0.5 * (I0 + I0.mT)
            eye = torch.eye(3, dtype=I0.dtype)
            Sigma = 0.5 * torch.trace(I0) * eye - I0
            l = _six(_cholesky(Sigma - bias * eye, "CovParameterized3DInertiaMatrixNet"))
        self.l = nn.Parameter(l)

    def forward(self) -> Tensor:
        L = _lower(self.l)
        eye = torch.eye(3, dtype=self.l.dtype, device=self.l.device)
        Sigma = L @ L.mT + self.spd_3d_cov_inertia_mat_diag_bias * eye
        return torch.trace(Sigma) * eye - Sigma


class TriangParam3DInertiaMatrixNet(nn.Module):
    """``I = R diag(J1, J2, J3) R^T`` with principal moments ``J1, J2 > bias``
    (:class:`PositiveScalar`), ``J3 = sqrt(J1^2 + J2^2 - 2 J1 J2 cos alpha)`` for an angle
    ``alpha = pi sigmoid(a)`` in (0, pi) -- so ``|J1 - J2| < J3 < J1 + J2``, the triangle inequality --
    and ``R = exp(inertia_ori_axis_angle)``.

    ``init_param``: a (3, 3) or (1, 3, 3) initial inertia whose principal moments satisfy the strict
    triangle inequality (the two largest become ``J1``, ``J2``). (differentiable-robot-model 0.2.3
    defines this class but cannot construct it; this one is complete.)
    """

    def __init__(self, bias: float, init_param_std: float = 0.01, init_param=None,
                 is_initializing_params: bool = True):
        super().__init__()
        self._bias = bias
        if init_param is None or not is_initializing_params:
            axis_angle = torch.empty(1, 3).normal_(mean=0.0, std=init_param_std)
            self.J1net = PositiveScalar(min_val=bias, init_param_std=0.1)
            self.J2net = PositiveScalar(min_val=bias, init_param_std=0.1)
            self.alpha_param_net = UnconstrainedTensor(1, 1, init_std=init_param_std)
        else:
            I0 = _matrix3(init_param, "TriangParam3DInertiaMatrixNet")
            I0 = 0.5 * (I0 + I0.mT)
            J, V = torch.linalg.eigh(I0.double())
            J, V = J.flip(0), V.flip(1)  # descending, as the SVD of an SPD matrix
            if float(torch.linalg.det(V)) < 0:
                V[:, 0] = -V[:, 0]
            if not (J[2] > 0 and J[0] < J[1] + J[2] and float(J[1]) > bias):
                raise ModelError(f"TriangParam3DInertiaMatrixNet: principal moments {J.tolist()} must be positive, "
                                 f"satisfy the strict triangle inequality and exceed bias={bias} (two largest)")
            cos_alpha = (J[0] ** 2 + J[1] ** 2 - J[2] ** 2) / (2 * J[0] * J[1])
            frac = torch.arccos(cos_alpha.clamp(-1.0, 1.0)) / math.pi
            dtype = torch.get_default_dtype()
            axis_angle = spatial.so3_log(V).to(dtype)[None]
            self.J1net = PositiveScalar(min_val=bias, init_param=J[0].to(dtype))
            self.J2net = PositiveScalar(min_val=bias, init_param=J[1].to(dtype))
            self.alpha_param_net = UnconstrainedTensor(1, 1, init_tensor=torch.logit(frac).to(dtype).reshape(1, 1))
        self.inertia_ori_axis_angle = nn.Parameter(axis_angle.squeeze())

    def forward(self) -> Tensor:
        alpha = math.pi * torch.sigmoid(self.alpha_param_net().squeeze())
        J1, J2 = self.J1net(), self.J2net()
        J3 = torch.sqrt(J1 * J1 + J2 * J2 - 2.0 * J1 * J2 * torch.cos(alpha))
        R = spatial.so3_exp(self.inertia_ori_axis_angle)
        return (R * torch.stack([J1, J2, J3])) @ R.mT
