"""Inverse kinematics: batched Levenberg-Marquardt on link poses, differentiable w.r.t. the target."""

from .solve import IKResult, inverse_kinematics, solve_ik

__all__ = ["IKResult", "inverse_kinematics", "solve_ik"]
