"""Batched differentiable environments on diffmech's simulator.

A :class:`DiffEnv` holds ``num_envs`` copies of one task as tensors ``q (N, nq)``, ``v (N, nv)`` and
step counters ``t (N,)`` on one device. :meth:`DiffEnv.step` advances all of them by one step of the
simulator (:class:`~diffmech.sim.Integrator`, semi-implicit Euler by default): the next
observation and the reward are ordinary autograd tensors, so they carry gradients w.r.t. the action
and (through the state kept from earlier steps) w.r.t. earlier actions and states whenever those
require grad. :meth:`DiffEnv.detach` cuts that history (a short-horizon learner calls it between
windows). Finished environments restart on their own inside ``step`` with :func:`torch.where`, so
the gradients of the others are untouched and a restarted one simply stops depending on its past.

:meth:`DiffEnv.transition` is the same step as a pure function of a given state (no reset, no
stored state): learners use it to differentiate the reward and the next observation at states from
a replay buffer.

Tasks subclass :class:`DiffEnv`; :class:`NLinkReach` is the n-link pendulum reaching task.
"""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .._warnings import warn
from ..errors import OptionError, ShapeError
from ..robot import RobotModel
from ..sim.integrators import Integrator, get_integrator

__all__ = ["DiffEnv", "StepResult", "NLinkReach", "SEED_PENDULUM_MASSES"]


@dataclass
class StepResult:
    """What :meth:`DiffEnv.step` returns (it also unpacks as ``obs, reward, terminated, truncated, info``).

    Attributes:
        obs: (N, obs_dim) observation after the step; for an environment that finished this step,
            the first observation of its next episode.
        reward: (N,) reward of the step.
        terminated: (N,) bool, the episode ended in a terminal state (no value beyond it).
        truncated: (N,) bool, the episode reached the time limit.
        final_obs: (N, obs_dim) observation reached by the step before any reset (equals ``obs``
            where the environment did not finish); differentiable like ``obs``.
        final_q, final_v: (N, nq), (N, nv) the state reached by the step before any reset.
    """

    obs: Tensor
    reward: Tensor
    terminated: Tensor
    truncated: Tensor
    final_obs: Tensor
    final_q: Tensor
    final_v: Tensor

    def __iter__(self):
        yield from (self.obs, self.reward, self.terminated, self.truncated, {"final_obs": self.final_obs})


class DiffEnv(abc.ABC):
    """Base class: ``num_envs`` differentiable environments over one :class:`~diffmech.RobotModel`.

    Actions are ``(N, act_dim)`` in ``[-1, 1]`` (clamped; the gradient is zero outside), scaled by
    :attr:`max_torque` to joint torques held over one step of length :attr:`dt`. Subclasses define
    :meth:`initial_state`, :meth:`observe`, :meth:`reward` and optionally :meth:`terminal`.

    Args:
        robot: the model (fixed base here; its dtype and device are the environment's).
        num_envs: number of parallel environments ``N``.
        dt: simulation step, s.
        horizon: steps per episode (then truncated).
        max_torque: torque of action ``1``, N m, scalar or one per joint.
        integrator: name or :class:`~diffmech.sim.Integrator`; ``None`` for a task that overrides
            :meth:`simulate` (a contact scene).
        act_dim: size of an action (default ``robot.nv``: a torque on every coordinate).
        compile: evaluate the forward dynamics with native kernels
            (:func:`diffmech.dynamics.compiled`); ``None``: on the CPU yes, elsewhere the eager code.
        seed: seed of the environment's random generator (resets).
        max_speed: a next state with a joint speed above this (rad/s or m/s), or with a non-finite
            value, has left what the time step can simulate (an explicit integrator's step grows
            without bound from there): the episode terminates there with a zero reward for the step,
            the environment restarts, and :attr:`diverged` counts it (a warning names the first).
            ``None``: only non-finite states.
    """

    def __init__(self, robot: RobotModel, num_envs: int, *, dt: float, horizon: int,
                 max_torque: float | Sequence[float], integrator: str | Integrator = "semi_implicit_euler",
                 compile: bool | None = None, seed: int | None = None, act_dim: int | None = None,
                 max_speed: float | None = None):
        if isinstance(num_envs, bool) or not isinstance(num_envs, int) or num_envs < 1:
            raise OptionError(f"{type(self).__name__}: num_envs must be a positive integer, got {num_envs!r}")
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise OptionError(f"{type(self).__name__}: horizon must be a positive integer, got {horizon!r}")
        if not (dt > 0 and math.isfinite(dt)):
            raise OptionError(f"{type(self).__name__}: dt must be positive, got {dt!r}")
        self.robot = robot
        self.num_envs = num_envs
        self.dt = float(dt)
        self.horizon = horizon
        self.dtype, self.device = robot.dtype, robot.device
        self.act_dim = robot.nv if act_dim is None else int(act_dim)
        mt = torch.as_tensor(max_torque, dtype=self.dtype, device=self.device)
        if mt.dim() > 1 or (mt.dim() == 1 and mt.numel() != self.act_dim) or not bool((mt > 0).all()):
            raise OptionError(f"{type(self).__name__}: max_torque must be positive, a number or {self.act_dim} "
                              f"numbers, got {max_torque!r}")
        self.max_torque = mt.expand(self.act_dim).clone()
        if max_speed is not None and not (max_speed > 0):
            raise OptionError(f"{type(self).__name__}: max_speed must be positive or None, got {max_speed!r}")
        self.max_speed = None if max_speed is None else float(max_speed)
        self.diverged = 0  # episodes ended by a state beyond max_speed or non-finite (see max_speed)
        self.integrator = None
        if integrator is not None:
            self.integrator = get_integrator(integrator)
            self.integrator.check_robot(robot)
        if compile is None:
            compile = self.device.type == "cpu" and integrator is not None
        self._accel = None
        if compile:
            from ..dynamics import compiled

            fd = compiled(robot, "forward_dynamics")
            self._accel = lambda q, v, tau, f_ext=None: fd(q, v, tau)
        # on the CPU: a seed gives the same resets on every device (the draws are a few numbers per env)
        self.generator = torch.Generator()
        self.generator.manual_seed(0 if seed is None else int(seed))
        self.q = self.v = self.t = None  # set by reset()
        self.obs_dim = int(self.observe(*self._zero_state(1), torch.zeros(1, dtype=torch.long,
                                                                            device=self.device)).shape[-1])

    # ------------------------------------------------------------------ the task (subclasses)
    @abc.abstractmethod
    def initial_state(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` initial states ``q (n, nq), v (n, nv)`` drawn with :attr:`generator`."""
        ...

    @abc.abstractmethod
    def observe(self, q: Tensor, v: Tensor, t: Tensor) -> Tensor:
        """Observation ``(B, obs_dim)`` of states ``q (B, nq), v (B, nv)`` at step counts ``t (B,)``."""
        ...

    @abc.abstractmethod
    def reward(self, q: Tensor, v: Tensor, q1: Tensor, v1: Tensor, action: Tensor) -> Tensor:
        """Reward ``(B,)`` of the step ``(q, v) -> (q1, v1)`` under ``action (B, act_dim)``."""
        ...

    def terminal(self, q1: Tensor, v1: Tensor) -> Tensor:
        """``(B,)`` bool: the state ends the episode (default: never)."""
        return torch.zeros(q1.shape[0], dtype=torch.bool, device=q1.device)

    def draw_points(self, q: Tensor) -> Tensor:
        """``(B, k, 3)`` world points drawn as a polyline (:mod:`diffmech.rl.render`); default: the
        origins of the robot's links in order."""
        return self.robot.forward_kinematics(q)[..., :3, 3]

    def draw_target(self) -> Tensor | None:
        """A world point ``(3,)`` drawn as the goal, or ``None``."""
        return None

    # ------------------------------------------------------------------ the mechanics
    def _zero_state(self, n: int) -> tuple[Tensor, Tensor]:
        z = dict(dtype=self.dtype, device=self.device)
        return self.robot.neutral_configuration().to(**z).expand(n, -1).clone(), torch.zeros(n, self.robot.nv, **z)

    def _check_action(self, action: Tensor, n: int) -> Tensor:
        if not isinstance(action, Tensor):
            action = torch.as_tensor(action, dtype=self.dtype, device=self.device)
        if action.shape != (n, self.act_dim):
            raise ShapeError(f"{type(self).__name__}: action must have shape ({n}, {self.act_dim}), "
                             f"got {tuple(action.shape)}")
        return action.to(dtype=self.dtype, device=self.device)

    def simulate(self, q: Tensor, v: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        """One simulator step of states ``q (B, nq), v (B, nv)`` under ``action (B, act_dim)``."""
        tau = action.clamp(-1.0, 1.0) * self.max_torque
        return self.integrator.step_flat(self.robot, q, v, tau, self.dt, accel=self._accel)

    def transition(self, q: Tensor, v: Tensor, t: Tensor, action: Tensor
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """The step as a pure function: ``(q1, v1, obs1, reward, terminated)`` with no reset.

        Args:
            q, v: (B, nq), (B, nv) states; t: (B,) step counts; action: (B, act_dim).

        Returns:
            next state ``q1, v1``, next observation ``(B, obs_dim)`` (at step count ``t + 1``),
            reward ``(B,)`` and terminal flags ``(B,)``; differentiable w.r.t. ``q``, ``v`` and
            ``action``.
        """
        return self._transition(q, v, t, action)[:5]

    def _transition(self, q: Tensor, v: Tensor, t: Tensor, action: Tensor
                    ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """:meth:`transition` and the ``(B,)`` flags of the states that ran away (:meth:`diverging`)."""
        action = self._check_action(action, q.shape[0])
        q1, v1 = self.simulate(q, v, action)
        obs1, rew, term = self.observe(q1, v1, t + 1), self.reward(q, v, q1, v1, action), self.terminal(q1, v1)
        return self._guarded(q1, v1, obs1, rew, term)

    def _guarded(self, q1: Tensor, v1: Tensor, obs1: Tensor, rew: Tensor, term: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """A transition's outputs with the states that ran away (:meth:`diverging`) terminated, their
        reward 0 and their observation made finite, and those ``(B,)`` flags."""
        bad = self.diverging(q1, v1)
        if bool(bad.any()):
            # finite stand-ins, so that neither a normaliser nor a network downstream turns into NaN
            rew = torch.where(bad, torch.zeros_like(rew), rew)
            obs1 = torch.where(bad[:, None], torch.nan_to_num(obs1.detach(), nan=0.0, posinf=0.0, neginf=0.0), obs1)
            term = term | bad
        return q1, v1, obs1, rew, term, bad

    def diverging(self, q1: Tensor, v1: Tensor) -> Tensor:
        """``(B,)`` bool: the state is non-finite or faster than :attr:`max_speed` (see the class)."""
        with torch.no_grad():
            bad = ~(torch.isfinite(q1).all(-1) & torch.isfinite(v1).all(-1))
            if self.max_speed is not None:
                bad = bad | (v1.abs().amax(-1) > self.max_speed)
        return bad

    def _count_diverged(self, bad: Tensor, v1: Tensor) -> None:
        n = int(bad.sum())
        if n:
            if not self.diverged:
                i = int(bad.nonzero()[0])
                warn(f"{type(self).__name__}: environment {i} left the simulable range (|v| max "
                     f"{float(v1[i].detach().abs().amax()):.3g}, max_speed {self.max_speed}); its episode ends "
                     "there (further cases are counted in .diverged)")
            self.diverged += n

    # ------------------------------------------------------------------ the vector environment
    def seed(self, seed: int) -> None:
        """Re-seed the generator of initial states."""
        self.generator.manual_seed(int(seed))

    def reset(self, seed: int | None = None) -> Tensor:
        """Restart every environment; returns the observations ``(N, obs_dim)`` (no graph)."""
        if seed is not None:
            self.seed(seed)
        self.q, self.v = self.initial_state(self.num_envs)
        self.t = torch.zeros(self.num_envs, dtype=torch.long, device=self.device)
        return self.observe(self.q, self.v, self.t)

    def reset_envs(self, mask: Tensor) -> None:
        """Restart the environments where ``mask (N,)`` is true (the others keep their state and graph)."""
        self.q, self.v, self.t = self._restart(mask, self.q, self.v, self.t)

    def _restart(self, mask: Tensor, q: Tensor, v: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q0, v0 = self.initial_state(self.num_envs)
        m = mask[:, None]
        return torch.where(m, q0, q), torch.where(m, v0, v), torch.where(mask, torch.zeros_like(t), t)

    @property
    def obs(self) -> Tensor:
        """Current observations ``(N, obs_dim)``."""
        return self.observe(self.q, self.v, self.t)

    def get_state(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(q, v, t)`` of all environments (the tensors themselves, graph included)."""
        return self.q, self.v, self.t

    def set_state(self, q: Tensor, v: Tensor, t: Tensor | None = None) -> None:
        """Put the environments in states ``q (N, nq), v (N, nv)`` (a tensor that requires grad makes
        the following steps differentiable w.r.t. it) at step counts ``t (N,)`` (default: kept, or 0)."""
        n = self.num_envs
        if q.shape != (n, self.robot.nq) or v.shape != (n, self.robot.nv):
            raise ShapeError(f"{type(self).__name__}.set_state: q, v must be ({n}, {self.robot.nq}), "
                             f"({n}, {self.robot.nv}); got {tuple(q.shape)}, {tuple(v.shape)}")
        if t is None:
            t = self.t if self.t is not None else torch.zeros(n, dtype=torch.long, device=self.device)
        self.q, self.v, self.t = q, v, t.to(device=self.device, dtype=torch.long).expand(n).clone()

    def detach(self) -> None:
        """Cut the autograd history of the stored state (gradients stop flowing to earlier steps)."""
        self.q, self.v = self.q.detach(), self.v.detach()

    def step(self, action: Tensor) -> StepResult:
        """Advance all environments by one step; finished ones restart (see :class:`StepResult`).

        Args:
            action: (N, act_dim) in ``[-1, 1]``.
        """
        if self.q is None:
            raise OptionError(f"{type(self).__name__}: call reset() before step()")
        q1, v1, obs1, rew, term, bad = self._transition(self.q, self.v, self.t, action)
        self._count_diverged(bad, v1)
        t1 = self.t + 1
        trunc = (t1 >= self.horizon) & ~term
        done = term | trunc
        qn, vn = q1, v1
        if bool(done.any()):
            qn, vn, t1 = self._restart(done, q1, v1, t1)
            obs = torch.where(done[:, None], self.observe(qn, vn, t1), obs1)
        else:
            obs = obs1
        self.q, self.v, self.t = qn, vn, t1
        return StepResult(obs, rew, term, trunc, obs1, q1, v1)


# Bob masses of the seed's n-link pendulum files (first link 1 kg, every further link 2.16 kg).
SEED_PENDULUM_MASSES = (1.0, 2.16)


class NLinkReach(DiffEnv):
    """Swing the tip of an n-link pendulum from horizontal to the highest reachable point.

    The pendulum is :func:`diffmech.model.systems.n_link_pendulum` (planar, x-z plane, links of
    ``link_length`` m with a bob at each end, gravity ``-z``), with the seed's geometry and masses by
    default: links of 0.5 m, bob masses 1 kg (first) and 2.16 kg (the others), no joint damping. Every
    joint is driven, ``|torque| <= max_torque`` (10 N m), ``dt = 1/60`` s, 100 steps per episode.

    Start: link 1 horizontal (``q1 = pi/2``: the chain lies along ``-x``), the other joints straight,
    at rest (plus ``reset_noise`` uniform rad on every angle). Target: ``x_g = (0, 0, n l)``, the
    tip with the chain straight up.

    Reward of a step: the progress of the tip ``x`` towards the target,
    ``r_t = |x_{t-1} - x_g|^2 - |x_t - x_g|^2`` (positive when the tip gets closer). The return of an
    episode telescopes to ``|x_0 - x_g|^2 - |x_T - x_g|^2``: only where the tip ends counts, and the
    largest possible return is ``|x_0 - x_g|^2 = 2 (n l)^2`` (tip exactly at the target at the last
    step), i.e. ``0.5 n^2`` with the seed's 0.5 m links (``2 n^2`` with unit links);
    :attr:`max_return` holds it.

    Observation ``(N, 3 n + 3)``: ``cos q``, ``sin q`` (relative joint angles), ``v / 10``, the tip
    minus the target divided by ``n l`` (x and z), and the elapsed fraction of the episode ``t / T``.

    Args:
        links: number of links ``n``.
        num_envs: parallel environments.
        link_length: m; masses: one number or ``n`` numbers, kg (default the seed's).
        damping: joint damping, N m s/rad.
        reset_noise: half-width of the uniform noise added to the initial angles, rad.
        device, dtype: of the simulation (float32 by default).
        max_speed: joint speed (rad/s) that ends an episode (:class:`DiffEnv`): 100 by default, a
            turn of 1.7 rad per step of 1/60 s, where semi-implicit Euler's swing grows without bound
            (a 6-link chain went from 72 to 1e30 rad/s in ten steps; controlled swings stay under 60).
        **kwargs: the other keywords of :class:`DiffEnv`.
    """

    def __init__(self, links: int = 2, num_envs: int = 1, *, link_length: float = 0.5,
                 masses: float | Sequence[float] | None = None, damping: float = 0.0, max_torque: float = 10.0,
                 dt: float = 1.0 / 60.0, horizon: int = 100, reset_noise: float = 0.0,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float32,
                 max_speed: float | None = 100.0, **kwargs):
        from ..model.systems import n_link_pendulum

        if isinstance(links, bool) or not isinstance(links, int) or links < 1:
            raise OptionError(f"NLinkReach: links must be a positive integer, got {links!r}")
        if masses is None:
            masses = [SEED_PENDULUM_MASSES[0]] + [SEED_PENDULUM_MASSES[1]] * (links - 1)
        self.links = links
        self.link_length = float(link_length)
        self.reset_noise = float(reset_noise)
        robot = n_link_pendulum(links, masses=masses, lengths=link_length, damping=damping, dtype=dtype,
                                device=device)
        reach = links * self.link_length
        self.target = torch.tensor([0.0, 0.0, reach], dtype=dtype, device=robot.device)
        self.max_return = 2.0 * reach**2
        super().__init__(robot, num_envs, dt=dt, horizon=horizon, max_torque=max_torque, max_speed=max_speed,
                         **kwargs)

    def initial_state(self, n: int) -> tuple[Tensor, Tensor]:
        z = dict(dtype=self.dtype, device=self.device)
        q = torch.zeros(n, self.links, **z)
        q[:, 0] = math.pi / 2
        if self.reset_noise > 0:
            u = torch.rand(n, self.links, generator=self.generator, dtype=self.dtype).to(self.device)
            q = q + self.reset_noise * (2 * u - 1)
        return q, torch.zeros(n, self.links, **z)

    def draw_points(self, q: Tensor) -> Tensor:
        return self.robot.forward_kinematics(q)[..., 1:, :3, 3]  # joint 1, the further joints, the tip

    def draw_target(self) -> Tensor:
        return self.target

    def tip(self, q: Tensor) -> Tensor:
        """World position ``(..., 3)`` of the tip for joint angles ``q (..., n)``.

        In closed form for the planar chain (link ``i`` points along the absolute angle
        ``q_1 + ... + q_i`` from straight down): the same as ``robot.link_pose(q, "tip")`` (tested), at a
        fraction of the cost of the general forward kinematics, which dominated a step at small batches.
        """
        phi = torch.cumsum(q, dim=-1)
        x = -self.link_length * torch.sin(phi).sum(-1)
        z = -self.link_length * torch.cos(phi).sum(-1)
        return torch.stack([x, torch.zeros_like(x), z], dim=-1)

    def observe(self, q: Tensor, v: Tensor, t: Tensor) -> Tensor:
        rel = (self.tip(q) - self.target)[..., [0, 2]] / (self.links * self.link_length)
        frac = (t.to(q.dtype) / self.horizon)[:, None]
        return torch.cat([torch.cos(q), torch.sin(q), 0.1 * v, rel, frac], dim=-1)

    def reward(self, q: Tensor, v: Tensor, q1: Tensor, v1: Tensor, action: Tensor) -> Tensor:
        x = self.tip(torch.cat([q, q1]))
        d2 = (x - self.target).square().sum(-1)
        B = q.shape[0]
        return d2[:B] - d2[B:]
