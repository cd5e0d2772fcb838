"""``RobotModel``: the ``nn.Module`` a user holds -- parameters below, algorithms as methods above.

:class:`RobotModel` is a thin facade over two layers that do not know about it: the description
(:class:`~diffmech.model.tree.KinematicTree` and the parameter values of
:class:`~diffmech.model.parameters.RobotParameters`, in :mod:`diffmech.model`) and the pure
algorithms (:mod:`diffmech.dynamics`). Each method *is* the algorithm function:
``robot.inverse_dynamics(q, v, a)`` calls :func:`diffmech.rnea` ``(robot, q, v, a)``, so the two
spellings can never differ.
"""

from __future__ import annotations

import os

import torch
from torch import Tensor

from . import dynamics
from .model.parameters import RobotParameters
from .model.urdf import _parse_urdf
from .model.urdf_export import robot_to_urdf

__all__ = ["RobotModel", "load_urdf"]


class RobotModel(RobotParameters):
    """A kinematic tree with batched, differentiable kinematics and dynamics.

    Build one with :func:`diffmech.load_urdf` or the builders of :mod:`diffmech.model.systems`.
    The parameter API (``link_params``, ``make_link_param_learnable``, ``model_tensors``, ...) is
    that of :class:`~diffmech.model.parameters.RobotParameters`; the structure is ``robot.tree``.

    Attributes:
        name: robot name.
        link_names: all links, in the order of :meth:`forward_kinematics` outputs.
        joint_names: the moving joints, in ``q``/``v`` order (after the 7/6 base coordinates
            when ``floating_base``).
        nq, nv: sizes of ``q`` and ``v``.
        floating_base: whether the root link is attached to the world by a free joint.
        actuated_joints: the joints with actuators (default: all of ``joint_names``).
    """

    forward_kinematics = dynamics.forward_kinematics
    link_pose = dynamics.link_pose
    jacobian = dynamics.jacobian
    center_of_mass = dynamics.center_of_mass
    inverse_dynamics = dynamics.rnea
    mass_matrix = dynamics.crba
    forward_dynamics = dynamics.forward_dynamics
    bias_forces = dynamics.bias_forces
    generalized_gravity = dynamics.generalized_gravity
    kinetic_energy = dynamics.kinetic_energy
    potential_energy = dynamics.potential_energy
    integrate = dynamics.integrate

    def to_urdf(self, path: str | os.PathLike | None = None) -> str:
        """Write the current parameters (identified or learnable ones at their current values) as a
        URDF that :func:`load_urdf` re-loads to the same dynamics and Pinocchio and PyBullet load.

        Kept: masses, centres of mass, inertias, joint origins, axes, limits, damping, friction,
        mimic joints, fixed joints, and the source file's ``<visual>``/``<collision>``/``<material>``
        elements (mesh paths made absolute). Not expressible in URDF: a floating base (re-load with
        ``floating_base=True``), gravity and joint springs (a comment and a warning). Details in
        :mod:`diffmech.model.urdf_export`.

        Args:
            path: file to write; ``None`` to only return the text.

        Returns:
            The URDF text.

        Raises:
            ModelError: a non-finite parameter, a negative mass or an inertia that is not positive
                semi-definite, naming the link or joint.
        """
        return robot_to_urdf(self, path)

    def forward(self, q: Tensor, v: Tensor, tau: Tensor, **kwargs) -> Tensor:
        """``robot(q, v, tau)`` is :meth:`forward_dynamics`, so ``torch.func.functional_call`` and
        ensembles work on the model directly."""
        return dynamics.forward_dynamics(self, q, v, tau, **kwargs)


def load_urdf(
    path: str | os.PathLike,
    *,
    floating_base: bool = False,
    dtype: torch.dtype = torch.float64,
    device: torch.device | str | None = None,
    gravity=(0.0, 0.0, -9.81),
) -> RobotModel:
    """Load a URDF file (or XML string) as a :class:`RobotModel`.

    Args:
        path: URDF file path, or the XML text itself.
        floating_base: attach the root link to the world by a free joint (``nq = nv + 1``).
            Without it, a file with no moving joint (a table, ``plane.urdf``) is a static model:
            ``nq = nv = 0`` (as Pinocchio's ``buildModelFromUrdf``), its links at their fixed
            placements (``forward_kinematics`` of a ``(..., 0)`` configuration), joint-space results
            empty (``(..., 0)``, ``(..., 0, 0)``); in a :class:`~diffmech.sim.Scene` a fixed obstacle
            (a rollout of it alone: ``ModelError``, nothing to integrate).
        dtype: dtype of the model's parameters (float64 by default).
        device: device of the model's parameters.
        gravity: (3,) world gravity, m/s^2.

    Raises:
        URDFError / ModelError: naming the file, the offending link or joint and the value: a model
            that loads is one that simulates (the rules: :mod:`diffmech.model.validate`,
            ``docs/conventions.md``).
    """
    spec = _parse_urdf(path, stacklevel=3)  # a warning about the file points at the caller
    spec.gravity = tuple(float(g) for g in gravity)
    return RobotModel(spec, floating_base=floating_base, dtype=dtype, device=device)
