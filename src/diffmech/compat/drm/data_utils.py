"""differentiable-robot-model's data helpers: data sets of states and torques from a ground-truth model.

The generators take any model with differentiable-robot-model's interface (a
:class:`~diffmech.compat.drm.DifferentiableRobotModel` of this package or of
``differentiable_robot_model``) and draw from NumPy's and torch's global generators with the same
calls as differentiable-robot-model, so after the same seeds both give the same states. States are
float32 (the default dtype for the sine motions), in the model's joint order.
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset

from ...errors import ModelError

__all__ = [
    "InverseDynamicsDataset",
    "ForwardDynamicsDataset",
    "generate_random_forward_kinematics_data",
    "generate_random_inverse_dynamics_data",
    "generate_sine_motion_inverse_dynamics_data",
    "generate_sine_motion_forward_dynamics_data",
]


class InverseDynamicsDataset(Dataset):
    """Items ``[q, qd, qdd_des, tau]`` from ``data`` (a dict of ``(N, n_dofs)`` tensors with those keys)."""

    def __init__(self, data: dict):
        self.data = data

    def __getitem__(self, index):
        d = self.data
        return [d["q"][index, :], d["qd"][index, :], d["qdd_des"][index, :], d["tau"][index, :]]

    def __len__(self) -> int:
        return self.data["q"].shape[0]

    def var(self) -> torch.Tensor:
        """Per-joint variance of the torques, ``(n_dofs,)`` (normalises an inverse-dynamics loss)."""
        return self.data["tau"].var(dim=0)


class ForwardDynamicsDataset(InverseDynamicsDataset):
    """As :class:`InverseDynamicsDataset`; :meth:`var` is that of the accelerations ``qdd_des``."""

    def var(self) -> torch.Tensor:
        return self.data["qdd_des"].var(dim=0)


def _bounds(robot_model, key: str) -> np.ndarray:
    values = [joint[key] for joint in robot_model.get_joint_limits()]
    if any(v is None for v in values):
        raise ModelError(f"{getattr(robot_model, 'name', 'robot')}: a joint has no '{key}' limit")
    return np.asarray(values, dtype=float)


def _uniform(low, high, shape, device) -> torch.Tensor:
    return torch.tensor(np.random.uniform(low=low, high=high, size=shape), dtype=torch.float32, device=device)


def generate_random_forward_kinematics_data(robot_model, n_data: int, ee_name: str) -> dict:
    """``{"q": (n_data, n_dofs), "ee_pos": (n_data, 3)}``: joints uniform within their limits
    (``np.random``), the world position of link ``ee_name``."""
    device = robot_model._device
    lo, hi = _bounds(robot_model, "lower"), _bounds(robot_model, "upper")
    q = _uniform(lo, hi, (n_data, robot_model._n_dofs), device)
    ee_pos, _ = robot_model.compute_forward_kinematics(q=q, link_name=ee_name)
    return {"q": q, "ee_pos": ee_pos}


def generate_random_inverse_dynamics_data(robot_model, n_data: int) -> InverseDynamicsDataset:
    """Joints uniform within their limits, velocities within +-0.2 of the velocity limits,
    accelerations within +-0.4 of them (``np.random``), and the torques of the model (gravity and
    damping included). (differentiable-robot-model draws 7 columns whatever the robot; here
    ``n_dofs``, the same for the 7-DoF arms.)"""
    device = robot_model._device
    n = robot_model._n_dofs
    lo, hi = _bounds(robot_model, "lower"), _bounds(robot_model, "upper")
    vel = 0.2 * _bounds(robot_model, "velocity")
    q = _uniform(lo, hi, (n_data, n), device)
    qd = _uniform(-vel, vel, (n_data, n), device)
    qdd_des = _uniform(-2.0 * vel, 2.0 * vel, (n_data, n), device)
    tau = robot_model.compute_inverse_dynamics(q=q, qd=qd, qdd_des=qdd_des, include_gravity=True)
    return InverseDynamicsDataset({"q": q, "qd": qd, "qdd_des": qdd_des, "tau": tau})


def _sine_motion(robot_model, n_data: int, dt: float, freq: float) -> dict:
    """Every joint follows ``0.7 sin(2 pi freq t)`` on ``n_data`` times from 0 to
    ``int(n_data dt) - 1`` s (the grid differentiable-robot-model uses)."""
    device = robot_model._device
    n = robot_model._n_dofs
    amplitude = 0.7
    t = torch.linspace(0.0, int(n_data * dt) - 1, n_data)
    # pi as differentiable-robot-model computes it (2 acos 0 in the default dtype), so the states agree.
    pi = 2.0 * float(torch.acos(torch.zeros(1)))
    w = 2 * pi * freq
    s = torch.sin(w * t).reshape(n_data, 1).repeat(1, n)
    c = torch.cos(w * t).reshape(n_data, 1).repeat(1, n)
    q = (amplitude * s + torch.zeros(n)).to(device)
    qd = (w * amplitude * c).to(device)
    qdd_des = (-(w ** 2) * amplitude * s).to(device)
    tau = robot_model.compute_inverse_dynamics(q=q, qd=qd, qdd_des=qdd_des, include_gravity=True)
    return {"q": q, "qd": qd, "qdd_des": qdd_des, "tau": tau}


def generate_sine_motion_inverse_dynamics_data(robot_model, n_data: int, dt: float, freq: float
                                               ) -> InverseDynamicsDataset:
    """A sine motion of all joints and the model's torques (gravity and damping included)."""
    return InverseDynamicsDataset(_sine_motion(robot_model, n_data, dt, freq))


def generate_sine_motion_forward_dynamics_data(robot_model, n_data: int, dt: float, freq: float
                                               ) -> ForwardDynamicsDataset:
    """As :func:`generate_sine_motion_inverse_dynamics_data`, for fitting forward dynamics
    (:meth:`ForwardDynamicsDataset.var` is that of the accelerations)."""
    return ForwardDynamicsDataset(_sine_motion(robot_model, n_data, dt, freq))
