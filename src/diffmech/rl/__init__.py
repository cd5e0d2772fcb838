"""Reinforcement learning with simulation gradients.

:class:`~diffmech.rl.env.DiffEnv` is a batched environment whose observations and rewards are
differentiable w.r.t. actions and states (through the simulator's one-step function);
:class:`~diffmech.rl.env.NLinkReach` the n-link pendulum reaching task.
"""

from .env import DiffEnv, NLinkReach, StepResult

__all__ = ["DiffEnv", "NLinkReach", "StepResult"]
