"""Gymnasium adapters of :class:`~diffmech.rl.env.DiffEnv` (NumPy in and out, no gradients).

:class:`GymEnv` is one environment (a ``gymnasium.Env``: what stable-baselines3 and most libraries
take), :class:`GymVectorEnv` all ``num_envs`` of a batched environment at once (a
``gymnasium.vector.VectorEnv`` with same-step autoreset: an environment that finishes returns its
next episode's first observation, the last one is in ``info["final_obs"]`` where
``info["_final_obs"]`` is true). :func:`register` adds the ids ``diffmech/NLinkReach-v0``
(keyword ``links=n`` and those of :class:`~diffmech.rl.env.NLinkReach`) and ``diffmech/Ant-v0``
(keywords of :class:`~diffmech.rl.ant.Ant`) and, for gymnasium's MuJoCo tasks rebuilt by
:func:`diffmech.rl.make`, ``diffmech/Ant-v5``, ``diffmech/HalfCheetah-v5``, ... (:data:`TASK_IDS`;
keywords those of :func:`~diffmech.rl.make`) to gymnasium's registry;
importing :mod:`diffmech.rl` calls it when gymnasium is installed::

    import gymnasium as gym, diffmech.rl
    env = gym.make("diffmech/NLinkReach-v0", links=3)
    venv = gym.make_vec("diffmech/NLinkReach-v0", num_envs=64, vectorization_mode="vector_entry_point", links=3)
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from .ant import Ant
from .env import DiffEnv, NLinkReach
from .tasks import TASKS, make

__all__ = ["GymEnv", "GymVectorEnv", "NLinkReachEnv", "NLinkReachVectorEnv", "AntEnv", "AntVectorEnv", "TaskEnv",
           "TaskVectorEnv", "register", "ENV_IDS", "TASK_IDS"]

ENV_IDS = {"nlink-reach": "diffmech/NLinkReach-v0", "ant": "diffmech/Ant-v0"}
# gymnasium's MuJoCo v5 tasks (diffmech.rl.make): {"Ant-v5": "diffmech/Ant-v5", ...}
TASK_IDS = {name: f"diffmech/{name}" for name in TASKS}


def _spaces(env: DiffEnv) -> tuple[spaces.Box, spaces.Box]:
    obs = spaces.Box(-np.inf, np.inf, (env.obs_dim,), np.float32)
    low, high = getattr(env, "action_low", None), getattr(env, "action_high", None)
    if low is None:
        act = spaces.Box(-1.0, 1.0, (env.act_dim,), np.float32)
    else:  # a gymnasium task: the actuators' ctrlrange, as gymnasium's own environment
        act = spaces.Box(low.cpu().numpy().astype(np.float32), high.cpu().numpy().astype(np.float32),
                         (env.act_dim,), np.float32)
    return obs, act


def _np(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy().astype(np.float32)


class GymEnv(gymnasium.Env):
    """One environment of a :class:`DiffEnv` (built with ``num_envs=1``) as a ``gymnasium.Env``.

    Observations are float32 arrays ``(obs_dim,)``, actions ``(act_dim,)`` in ``[-1, 1]``; the episode
    is truncated at the task's horizon. ``render_mode="rgb_array"`` draws the state with matplotlib.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, env: DiffEnv, render_mode: str | None = None):
        if env.num_envs != 1:
            raise ValueError(f"GymEnv wraps one environment; got num_envs={env.num_envs} (use GymVectorEnv)")
        self.env = env
        self.observation_space, self.action_space = _spaces(env)
        self.render_mode = render_mode
        self.metadata = {**self.metadata, "render_fps": int(min(30, round(1.0 / env.dt)))}
        self._q = None  # the state shown by render()

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        if seed is not None:
            self.env.seed(seed)
        with torch.no_grad():
            obs = self.env.reset()
        self._q = self.env.q[0]
        return _np(obs[0]), {}

    def step(self, action):
        a = torch.as_tensor(np.asarray(action, dtype=np.float32).reshape(1, -1), dtype=self.env.dtype,
                            device=self.env.device)
        with torch.no_grad():
            res = self.env.step(a)
        self._q = res.final_q[0]
        # the batched env restarts on its own; a gymnasium.Env hands back the last state and waits for reset()
        return (_np(res.final_obs[0]), float(res.reward[0]), bool(res.terminated[0]), bool(res.truncated[0]), {})

    def render(self):
        if self.render_mode != "rgb_array":
            return None
        from .render import rgb_frame

        return rgb_frame(self.env, self._q)


class GymVectorEnv(VectorEnv):
    """All ``num_envs`` environments of a :class:`DiffEnv` as one ``gymnasium.vector.VectorEnv``.

    One batched simulator step serves every environment; same-step autoreset (see the module).
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP, "render_modes": []}

    def __init__(self, env: DiffEnv):
        self.env = env
        self.num_envs = env.num_envs
        self.single_observation_space, self.single_action_space = _spaces(env)
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self.render_mode = None

    def reset(self, *, seed: int | list[int] | None = None, options: dict | None = None):
        if isinstance(seed, (list, tuple)):
            seed = seed[0]
        if seed is not None:
            self._np_random, _ = gymnasium.utils.seeding.np_random(seed)
            self.env.seed(seed)
        with torch.no_grad():
            obs = self.env.reset()
        return _np(obs), {}

    def step(self, actions):
        a = torch.as_tensor(np.asarray(actions, dtype=np.float32), dtype=self.env.dtype, device=self.env.device)
        with torch.no_grad():
            res = self.env.step(a)
        done = _bool(res.terminated | res.truncated)
        info: dict[str, Any] = {}
        if done.any():
            final = np.full(self.num_envs, None, dtype=object)
            fo = _np(res.final_obs)
            for i in np.flatnonzero(done):
                final[i] = fo[i]
            info = {"final_obs": final, "_final_obs": done, "final_info": {}, "_final_info": done}
        return (_np(res.obs), res.reward.detach().cpu().numpy().astype(np.float64), _bool(res.terminated),
                _bool(res.truncated), info)


def _bool(x: torch.Tensor) -> np.ndarray:
    return x.detach().cpu().numpy().astype(bool)


class NLinkReachEnv(GymEnv):
    """``diffmech/NLinkReach-v0``: :class:`~diffmech.rl.env.NLinkReach` as a ``gymnasium.Env``."""

    def __init__(self, links: int = 2, render_mode: str | None = None, **kwargs):
        super().__init__(NLinkReach(links, num_envs=1, **kwargs), render_mode=render_mode)


class NLinkReachVectorEnv(GymVectorEnv):
    """``diffmech/NLinkReach-v0`` made by ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``."""

    def __init__(self, num_envs: int = 1, links: int = 2, **kwargs):
        super().__init__(NLinkReach(links, num_envs=num_envs, **kwargs))


class AntEnv(GymEnv):
    """``diffmech/Ant-v0``: :class:`~diffmech.rl.ant.Ant` as a ``gymnasium.Env`` (27 observations,
    8 actions in ``[-1, 1]``, 1000 steps of 0.05 s per episode by default)."""

    def __init__(self, render_mode: str | None = None, **kwargs):
        super().__init__(Ant(num_envs=1, **kwargs), render_mode=render_mode)


class AntVectorEnv(GymVectorEnv):
    """``diffmech/Ant-v0`` made by ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``."""

    def __init__(self, num_envs: int = 1, **kwargs):
        super().__init__(Ant(num_envs=num_envs, **kwargs))


class TaskEnv(GymEnv):
    """``diffmech/<Task>-v5``: a task of :func:`diffmech.rl.make` as a ``gymnasium.Env`` (actions in
    the actuators' ``ctrlrange``; the episode ends at the task's horizon, gymnasium's
    ``max_episode_steps``)."""

    def __init__(self, task: str, render_mode: str | None = None, **kwargs):
        super().__init__(make(task, 1, **kwargs), render_mode=render_mode)


class TaskVectorEnv(GymVectorEnv):
    """``diffmech/<Task>-v5`` made by ``gymnasium.make_vec(..., vectorization_mode="vector_entry_point")``."""

    def __init__(self, task: str, num_envs: int = 1, **kwargs):
        super().__init__(make(task, num_envs, **kwargs))


def register() -> None:
    """Add the diffmech ids to gymnasium's registry (idempotent)."""
    if ENV_IDS["nlink-reach"] not in gymnasium.registry:
        gymnasium.register(ENV_IDS["nlink-reach"], entry_point=f"{__name__}:NLinkReachEnv",
                           vector_entry_point=f"{__name__}:NLinkReachVectorEnv")
    if ENV_IDS["ant"] not in gymnasium.registry:
        # the episode's limit is the task's own horizon (the env truncates), not a TimeLimit wrapper
        gymnasium.register(ENV_IDS["ant"], entry_point=f"{__name__}:AntEnv",
                           vector_entry_point=f"{__name__}:AntVectorEnv")
    for name, gid in TASK_IDS.items():
        if gid not in gymnasium.registry:
            gymnasium.register(gid, entry_point=f"{__name__}:TaskEnv", vector_entry_point=f"{__name__}:TaskVectorEnv",
                               kwargs={"task": name})
