"""Reinforcement learning with simulation gradients.

:class:`~diffmech.rl.env.DiffEnv` is a batched environment whose observations and rewards are
differentiable w.r.t. actions and states (through the simulator's one-step function);
:class:`~diffmech.rl.env.NLinkReach` the n-link pendulum reaching task, :class:`~diffmech.rl.ant.Ant`
the MuJoCo Ant's locomotion task on a contact scene; :func:`~diffmech.rl.tasks.make` gymnasium's MuJoCo
``v5`` tasks (``make("Ant-v5", num_envs=64)``) rebuilt from gymnasium's own XML files. With gymnasium
installed, importing this package registers the gymnasium ids ``diffmech/NLinkReach-v0``,
``diffmech/Ant-v0`` and ``diffmech/Ant-v5``, ``diffmech/Humanoid-v5``, ... (:mod:`diffmech.rl.gym_env`).
"""

from .ant import Ant
from .env import DiffEnv, NLinkReach, StepResult
from .tasks import make

__all__ = ["Ant", "DiffEnv", "NLinkReach", "StepResult", "make"]

try:  # gymnasium is optional (the ``rl`` extra): register the ids where it is installed
    from .gym_env import register as _register
except ImportError:  # pragma: no cover - without gymnasium
    pass
else:
    _register()
