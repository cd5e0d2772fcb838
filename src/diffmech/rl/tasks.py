"""Gymnasium's MuJoCo ``v5`` tasks as batched differentiable environments: :func:`make`.

``make("Ant-v5", num_envs=64, seed=0)`` builds the task from the XML file inside the installed
gymnasium package (``gymnasium/envs/mujoco/assets``) with :meth:`diffmech.sim.Scene.from_mjcf`, and
steps it with :func:`diffmech.sim.contact_step` (``solver="mujoco"``: MuJoCo's soft contacts, joint
limits and the file's integrator) ``frame_skip`` times per environment step, as gymnasium's
``MujocoEnv.do_simulation`` calls ``mj_step``. Observations, rewards, terminations, reset noise,
``frame_skip`` and every keyword's default are those of gymnasium's ``*_v5.py`` (gymnasium 1.x);
the keywords of those classes are accepted under the same names.

Conventions kept from gymnasium (and MuJoCo) on purpose:

* The action is MuJoCo's ``ctrl`` (``(N, nu)``, units of the actuators' ``ctrlrange``; MuJoCo clips
  it to the range, so the gradient is zero outside). :attr:`MujocoTask.action_low` /
  :attr:`~MujocoTask.action_high` hold the range; the control costs use the action unclipped.
* Observations are built from MuJoCo's ``qpos`` / ``qvel`` (a free joint's quaternion ``w`` first,
  its linear velocity in world axes), not from diffmech's ``q`` / ``v``. The state the environment
  keeps (``env.q``, ``env.v``) is diffmech's (:func:`diffmech.model.mjcf.mjcf_state_to_diffmech`);
  :meth:`MujocoTask.mujoco_state` and :meth:`MujocoTask.from_mujoco_state` convert. A reset keeps
  gymnasium's unnormalised noisy quaternion in the state (MuJoCo normalises a copy for kinematics);
  every step returns it normalised, as ``mj_step`` does.
* After ``mj_step`` MuJoCo's body positions, ``cinert``, ``cvel``, ``site_xpos`` and the contacts
  are those of the step's last forward evaluation (the start of the last substep with Euler, the
  fourth stage with RK4), not of the new state, and gymnasium's rewards read them (Ant's and
  Humanoid's forward velocity, Reacher's distance, InvertedDoublePendulum's tip). Here they come from
  the same evaluation (``info["soft"]`` of the step), so one step from a state equals gymnasium's
  ``set_state`` followed by ``step``. The position *before* a step is that of the state itself
  (gymnasium's first step after a reset sees the same; its later steps see the previous step's last
  evaluation: a difference of one substep in where the distance is measured, which cancels over an
  episode's sum).
* ``cfrc_ext`` (Ant, Humanoid) is MuJoCo's ``mj_rnePostConstraint`` result of the last evaluation's
  contacts; ``qfrc_constraint`` (InvertedDoublePendulum) that evaluation's ``J^T f``. Right after a
  reset both are zero, as in gymnasium (``mj_resetData`` zeroes them and ``mj_forward`` computes
  ``cfrc_ext`` only for sensors; the reset states of that task are far from the cart's limits).

Unknown task names and keywords raise :class:`~diffmech.errors.OptionError` naming the known ones.
"""

from __future__ import annotations

import abc
import math
import os
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..contact.soft_constraints import contact_layout
from ..errors import OptionError, ShapeError
from ..model.mjcf import actuator_forces, diffmech_state_to_mjcf, mjcf_state_to_diffmech
from ..sim.contact_step import contact_step
from ..sim.mj_bodies import MjBodies, normalize_free_quaternions
from .env import DiffEnv

__all__ = ["make", "TASKS", "MujocoTask", "StepExtras", "gym_assets", "contact_local_forces",
           "contact_wrenches", "AntV5", "HalfCheetahV5", "HopperV5",
           "Walker2dV5", "HumanoidV5", "SwimmerV5", "ReacherV5", "InvertedPendulumV5", "InvertedDoublePendulumV5"]


def gym_assets() -> str:
    """The folder of gymnasium's MuJoCo XML files (``gymnasium/envs/mujoco/assets``)."""
    try:
        import gymnasium
    except ImportError as err:  # pragma: no cover - the rl extra installs it
        raise OptionError("diffmech.rl.make: the gymnasium package is not installed (pip install "
                          "'diffmech[rl]'); its XML files define the tasks") from err
    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")


class StepExtras(NamedTuple):
    """What MuJoCo's ``mjData`` holds after a step besides the state, from the step's last forward
    evaluation.

    qf, vf: (B, nq), (B, nv) diffmech state of that evaluation. cfrc_ext: (B, nbody, 6) contact
    wrenches per body (torque about the tree's centre of mass, force; world axes, N m and N).
    qfrc_constraint: (B, m.nv) constraint forces in MuJoCo's ``qvel`` coordinates. ctrl: (B, nu).
    """

    qf: Tensor
    vf: Tensor
    cfrc_ext: Tensor
    qfrc_constraint: Tensor
    ctrl: Tensor


class MujocoTask(DiffEnv):
    """Base class of the gymnasium v5 tasks (see the module); subclasses set :attr:`gym_id`,
    :attr:`xml_file`, :attr:`defaults` (gymnasium's keywords and their defaults) and the task's
    :meth:`obs_from`, :meth:`reward_from`, :meth:`terminal_from` and :meth:`noise`.

    Args:
        num_envs: parallel environments ``N``.
        seed: of the reset noise (torch's generator on the CPU: the same resets on every device;
            not the same draws as gymnasium's NumPy generator, the same distribution).
        horizon: steps per episode (default gymnasium's ``max_episode_steps``).
        device, dtype: of the simulation (float64 by default).
        solver: the scene's contact solver; ``"mujoco"`` (default) is MuJoCo's model. Where this
            diffmech has no such solver the scene's default is used, with one warning.
        xml_file: another MJCF file (gymnasium's keyword; a bare name is looked up among the assets).
        frame_skip: simulator steps per environment step (gymnasium's keyword).
        **kwargs: the task's gymnasium keywords (:attr:`defaults`).
    """

    gym_id: str = ""
    xml_file: str = ""
    frame_skip_default: int = 1
    defaults: dict = {}

    def __init__(self, num_envs: int = 1, *, seed: int | None = None, horizon: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype = torch.float64,
                 solver: str = "mujoco", xml_file: str | None = None, frame_skip: int | None = None, **kwargs):
        import mujoco

        from ..sim.scene import SOLVERS, Scene

        unknown = sorted(set(kwargs) - set(self.defaults))
        if unknown:
            raise OptionError(f"{self.gym_id}: unknown keyword(s) {unknown}; the task takes "
                              f"{sorted(self.defaults) + ['xml_file', 'frame_skip', 'horizon', 'solver']}")
        self.config = {**self.defaults, **kwargs}
        frame_skip = self.frame_skip_default if frame_skip is None else frame_skip
        if isinstance(frame_skip, bool) or not isinstance(frame_skip, int) or frame_skip < 1:
            raise OptionError(f"{self.gym_id}: frame_skip must be a positive integer, got {frame_skip!r}")
        xml = xml_file or self.xml_file
        path = xml if os.path.isabs(xml) or os.path.exists(xml) else os.path.join(gym_assets(), xml)
        if not os.path.exists(path):
            raise OptionError(f"{self.gym_id}: no file {path!r}")
        self.xml_path = path
        self.m = mujoco.MjModel.from_xml_path(path)
        opts = {}
        if solver not in SOLVERS:
            warn(f"{self.gym_id}: this diffmech has no contact solver {solver!r} (it has {SOLVERS}); the scene "
                 f"steps with Scene.from_mjcf's default, whose contacts differ from MuJoCo's")
        else:
            opts["solver"] = solver
        self.scene = Scene.from_mjcf(path, dtype=dtype, device=device, **opts)
        self.solver = self.scene.solver
        self.frame_skip = frame_skip
        self.sim_dt = float(self.m.opt.timestep)
        self.bodies = MjBodies(self.m, self.scene)
        z = dict(dtype=dtype, device=self.scene.device)
        self.init_qpos = torch.tensor(np.asarray(self.m.qpos0), **z)
        self.init_qvel = torch.zeros(self.m.nv, **z)
        self.action_low = torch.tensor(np.asarray(self.m.actuator_ctrlrange)[:, 0], **z)
        self.action_high = torch.tensor(np.asarray(self.m.actuator_ctrlrange)[:, 1], **z)
        limited = np.asarray(self.m.actuator_ctrllimited, dtype=bool)
        self.action_low[~torch.as_tensor(limited)] = -math.inf
        self.action_high[~torch.as_tensor(limited)] = math.inf
        self._geom_body = None
        self._warned_extras = False
        self._setup()
        if horizon is None:
            import gymnasium

            horizon = gymnasium.spec(self.gym_id).max_episode_steps or 1000
        super().__init__(self.scene, num_envs, dt=frame_skip * self.sim_dt, horizon=horizon, max_torque=1.0,
                         integrator=None, compile=False, seed=seed, act_dim=int(self.m.nu))

    def _setup(self) -> None:
        """Task constants that need the model (subclasses)."""

    # ------------------------------------------------------------------ MuJoCo's coordinates
    def mujoco_state(self, q: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """diffmech's ``(q (B, nq), v (B, nv))`` -> MuJoCo's ``(qpos (B, m.nq), qvel (B, m.nv))``
        (differentiable; an unnormalised quaternion is kept in ``qpos``)."""
        qpos, _ = diffmech_state_to_mjcf(self.scene, q, None, qpos0=self.init_qpos)
        _, qvel = diffmech_state_to_mjcf(self.scene, normalize_free_quaternions(self.scene, q), v,
                                         qpos0=self.init_qpos)
        return qpos, qvel

    def from_mujoco_state(self, qpos, qvel) -> tuple[Tensor, Tensor]:
        """MuJoCo's ``(qpos, qvel)`` -> diffmech's ``(q, v)`` (inverse of :meth:`mujoco_state`)."""
        qpos = torch.as_tensor(qpos, dtype=self.dtype, device=self.device)
        q, _ = mjcf_state_to_diffmech(self.scene, qpos)
        _, v = mjcf_state_to_diffmech(self.scene, diffmech_state_to_mjcf(
            self.scene, normalize_free_quaternions(self.scene, q), qpos0=self.init_qpos)[0], qvel)
        return q, v

    def actuator_tau(self, ctrl: Tensor, q: Tensor, v: Tensor) -> Tensor:
        """Joint forces ``(B, nv)`` (diffmech's ``v`` order) of the file's actuators under ``ctrl (B, nu)``
        (:func:`diffmech.model.mjcf.actuator_forces` per model; a model without degrees of freedom,
        the scene's ``static`` one, adds no columns)."""
        parts = []
        for n in self.scene.names:
            mdl, sq, sv = self.scene.models[n], self.scene.slices[n], self.scene.vslices[n]
            parts.append(ctrl.new_zeros(ctrl.shape[0], 0) if mdl.nv == 0 else
                         actuator_forces(mdl, ctrl, q[:, sq], v[:, sv]))
        return torch.cat(parts, -1)

    def _to_mj_v(self, x: Tensor, q: Tensor) -> Tensor:
        """Generalized forces ``(B, nv)`` in diffmech's ``v`` coordinates -> MuJoCo's ``qvel`` order
        and axes (a floating base's linear row turned into world axes)."""
        _, out = diffmech_state_to_mjcf(self.scene, normalize_free_quaternions(self.scene, q), x,
                                        qpos0=self.init_qpos)
        return out

    # ------------------------------------------------------------------ simulation
    def initial_state(self, n: int) -> tuple[Tensor, Tensor]:
        qpos, qvel = self.noise(n)
        return self.from_mujoco_state(qpos, qvel)

    def noise(self, n: int) -> tuple[Tensor, Tensor]:
        """``n`` reset states ``(qpos, qvel)`` in MuJoCo's coordinates (gymnasium's ``reset_model``)."""
        s = float(self.config["reset_noise_scale"])
        return self.init_qpos + self._uniform(n, self.m.nq, -s, s), self.init_qvel + self._uniform(n, self.m.nv, -s, s)

    def _uniform(self, n: int, k: int, lo: float, hi: float) -> Tensor:
        u = torch.rand(n, k, generator=self.generator, dtype=self.dtype).to(self.device)
        return lo + (hi - lo) * u

    def _normal(self, n: int, k: int) -> Tensor:
        return torch.randn(n, k, generator=self.generator, dtype=self.dtype).to(self.device)

    def fresh_extras(self, q: Tensor, v: Tensor) -> StepExtras:
        """The extras of a state right after ``set_state`` (``mj_forward``): its own kinematics, no
        contact wrenches, no constraint forces, zero control."""
        z = q.new_zeros
        return StepExtras(q, v, z(q.shape[0], self.bodies.nbody, 6), z(q.shape[0], self.m.nv),
                          z(q.shape[0], self.m.nu))

    def simulate_extras(self, q: Tensor, v: Tensor, action: Tensor) -> tuple[Tensor, Tensor, StepExtras]:
        """``frame_skip`` contact steps under ``ctrl = action (B, nu)``: ``(q1, v1, extras)``."""
        ctrl = action
        q = normalize_free_quaternions(self.scene, q)  # the step of an unnormalised qpos equals that of the unit one
        info: dict = {}
        warm = None  # each substep's solver starts from the previous one's acceleration (MuJoCo's qacc_warmstart)
        for _ in range(self.frame_skip):
            info = {}
            qs, vs = q, v
            tau = self.actuator_tau(ctrl, q, v)
            q, v = contact_step(self.scene, q, v, tau, self.sim_dt, info, warm=warm)
            warm = info.get("lam")
        return q, v, self._extras(info, qs, vs, ctrl)

    def _extras(self, info: dict, qs: Tensor, vs: Tensor, ctrl: Tensor) -> StepExtras:
        soft = info.get("soft")
        B = qs.shape[0]
        if soft is None:
            if not self._warned_extras:
                warn(f"{self.gym_id}: the step ran on the {info.get('route', self.solver)!r} route, which reports no "
                     "MuJoCo contact forces: cfrc_ext and qfrc_constraint are zero and the positions MuJoCo reads "
                     "after a step are those at the start of the last substep")
                self._warned_extras = True
            ex = self.fresh_extras(qs, vs)
            return ex._replace(ctrl=ctrl)
        qf, vf = soft["q"], soft["v"]
        cfrc = qs.new_zeros(B, self.bodies.nbody, 6)
        con, force, rows = soft.get("contacts"), soft.get("force"), soft.get("rows")
        if con is not None and force is not None and con.pos.shape[1]:
            cfrc = self._cfrc_ext(qf, con, force)
        qfrc_c = qs.new_zeros(B, self.m.nv)
        if force is not None and rows is not None:
            f = force * rows.exists.to(force.dtype)
            _, vi = self._index()
            qfrc_c = qfrc_c.index_copy(1, vi, (rows.J.transpose(-1, -2) @ f[..., None])[..., 0])
        return StepExtras(qf, vf, cfrc, qfrc_c, ctrl)

    def _index(self):
        from ..model.mjcf import _index

        qi, vi = _index(self.scene)
        dev = self.device
        return torch.tensor(qi, device=dev), torch.tensor(vi, device=dev)

    def _cfrc_ext(self, qf: Tensor, con, force: Tensor) -> Tensor:
        """MuJoCo's ``cfrc_ext`` from the last evaluation's contacts and constraint forces."""
        if self._geom_body is None:
            gid = np.asarray(self.scene.mujoco.geoms.geom_id)
            self._geom_body = torch.tensor(np.asarray(self.m.geom_bodyid)[gid], dtype=torch.long, device=self.device)
        # the step orders its rows as MuJoCo does (friction loss, limits, contacts): the contacts' are the last
        n = len(contact_layout(con.condim)[0])
        return contact_wrenches(self.bodies, qf, con, force[:, force.shape[1] - n:], self._geom_body[con.geom1],
                                self._geom_body[con.geom2])

    def simulate(self, q: Tensor, v: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        q1, v1, _ = self.simulate_extras(q, v, action)
        return q1, v1

    def _transition(self, q, v, t, action):
        action = self._check_action(action, q.shape[0])
        q1, v1, ex = self.simulate_extras(q, v, action)
        obs1 = self.obs_from(q1, v1, ex)
        rew = self.reward_from(q, v, q1, v1, action, ex)
        term = self.terminal_from(q1, v1, ex)
        return self._guarded(q1, v1, obs1, rew, term)

    # ------------------------------------------------------------------ the task
    def observe(self, q: Tensor, v: Tensor, t: Tensor) -> Tensor:
        """Observation of a state as right after a reset (:meth:`fresh_extras`); a step's observation
        uses the step's extras (see the module)."""
        return self.obs_from(q, v, self.fresh_extras(q, v))

    def reward(self, q, v, q1, v1, action):
        """The reward with :meth:`fresh_extras` of the new state (no contact forces); a step uses the
        step's own extras (see the module)."""
        return self.reward_from(q, v, q1, v1, action, self.fresh_extras(q1, v1))

    def terminal(self, q1, v1):
        return self.terminal_from(q1, v1, self.fresh_extras(q1, v1))

    @abc.abstractmethod
    def obs_from(self, q: Tensor, v: Tensor, ex: StepExtras) -> Tensor:
        """The task's observation ``(B, obs_dim)`` of the state ``(q, v)`` with the step's extras ``ex``."""

    @abc.abstractmethod
    def reward_from(self, q, v, q1, v1, action, ex: StepExtras) -> Tensor:
        """The task's reward ``(B,)`` of the step ``(q, v) -> (q1, v1)`` under ``action`` with its extras ``ex``."""

    def terminal_from(self, q1, v1, ex: StepExtras) -> Tensor:
        return torch.zeros(q1.shape[0], dtype=torch.bool, device=q1.device)

    def draw_points(self, q: Tensor) -> Tensor:
        """``(B, nbody - 1, 3)`` the bodies' origins (MuJoCo's ``xpos``)."""
        return self.bodies.poses(q)[0][:, 1:]

    # helpers
    def _body_xpos(self, q: Tensor, body: int) -> Tensor:
        return self.bodies.poses(q)[0][:, body]

    def _ctrl_cost(self, action: Tensor) -> Tensor:
        return self.config["ctrl_cost_weight"] * action.square().sum(-1)

    def _finite(self, qpos: Tensor, qvel: Tensor) -> Tensor:
        return torch.isfinite(qpos).all(-1) & torch.isfinite(qvel).all(-1)


def contact_local_forces(condim, friction: Tensor, force: Tensor) -> Tensor:
    """Contact-frame forces ``(B, K, 6)`` (normal, two tangents, torsion, two rolling torques) of ``K``
    contact slots from their pyramidal constraint forces (MuJoCo's ``mj_contactForce``).

    Args:
        condim: (K,) each slot's condim (1, 3, 4 or 6).
        friction: (K, 5) or (B, K, 5) the slots' friction coefficients.
        force: (B, n) the constraint forces of the slots' rows in
            :func:`diffmech.contact.soft_constraints.contact_layout` order (a frictionless slot one
            normal row, a pyramid ``2 (condim - 1)`` edge rows ``+mu_k``, ``-mu_k``).
    """
    slots, local = contact_layout(condim)
    K, B, n = len(np.asarray(torch.as_tensor(condim).cpu()).reshape(-1)), force.shape[0], len(slots)
    if force.shape[-1] != n:
        raise ShapeError(f"contact_local_forces: {n} contact rows for condim {condim}, got forces "
                         f"{tuple(force.shape)}")
    f = force
    dev = force.device
    slots_t, local_t = torch.as_tensor(slots, device=dev), torch.as_tensor(local, device=dev)
    edge = local_t > 0
    k = torch.where(edge, (local_t - 1) // 2, torch.zeros_like(local_t))
    sign = torch.where((local_t - 1) % 2 == 0, 1.0, -1.0).to(f.dtype)
    mu = torch.as_tensor(friction, dtype=f.dtype, device=dev).expand(B, K, 5)
    # the normal force is the sum of the edges' (or the one row's), tangent k is mu_k (f_{+k} - f_{-k})
    flat = f.new_zeros(B, K * 6).index_add(1, slots_t * 6, f)
    tang = torch.where(edge, sign * mu[:, slots_t, k] * f, torch.zeros_like(f))
    return flat.index_add(1, slots_t * 6 + 1 + k, tang).view(B, K, 6)


def contact_wrenches(bodies: MjBodies, qf: Tensor, con, force: Tensor, body1: Tensor, body2: Tensor) -> Tensor:
    """MuJoCo's ``cfrc_ext (B, nbody, 6)`` (``mj_rnePostConstraint``) of contacts ``con`` (a
    :class:`~diffmech.contact.soft_collide.SoftContacts`: ``pos``, ``frame``, ``active``, ``condim``,
    ``friction``) at configuration ``qf (B, nq)`` with constraint forces ``force (B, R)`` (see
    :func:`contact_local_forces`); ``body1``, ``body2``: (K,) MuJoCo body ids of the slots' geoms."""
    local_f = contact_local_forces(con.condim, con.friction, force)
    xpos, xmat = bodies.poses(qf)
    xipos, _ = bodies.xipos(xpos, xmat)
    com = bodies.subtree_com(xipos)
    return bodies.cfrc_ext(con.pos, con.frame, local_f, body1, body2, com, con.active)


def _between(x: Tensor, lo: float, hi: float, strict: bool = True) -> Tensor:
    return (x > lo) & (x < hi) if strict else (x >= lo) & (x <= hi)


class _Forward(MujocoTask):
    """Tasks rewarded for the forward speed of ``qpos[0]`` (HalfCheetah, Hopper, Walker2d, Swimmer)."""

    skip_positions = 1  # qpos entries left out of the observation
    clip_velocity = None

    def obs_from(self, q, v, ex):
        qpos, qvel = self.mujoco_state(q, v)
        if self.config["exclude_current_positions_from_observation"]:
            qpos = qpos[:, self.skip_positions:]
        if self.clip_velocity is not None:
            qvel = qvel.clamp(-self.clip_velocity, self.clip_velocity)
        return torch.cat([qpos, qvel], -1)

    def healthy(self, qpos: Tensor, qvel: Tensor) -> Tensor:
        return torch.ones(qpos.shape[0], dtype=torch.bool, device=qpos.device)

    def reward_from(self, q, v, q1, v1, action, ex):
        x0 = self.mujoco_state(q, v)[0][:, 0]
        qpos1, qvel1 = self.mujoco_state(q1, v1)
        r = self.config["forward_reward_weight"] * (qpos1[:, 0] - x0) / self.dt - self._ctrl_cost(action)
        if "healthy_reward" in self.config:
            r = r + self.healthy(qpos1, qvel1).to(r.dtype) * self.config["healthy_reward"]
        return r

    def terminal_from(self, q1, v1, ex):
        if not self.config.get("terminate_when_unhealthy", False):
            return super().terminal_from(q1, v1, ex)
        return ~self.healthy(*self.mujoco_state(q1, v1))


class HalfCheetahV5(_Forward):
    """gymnasium's ``HalfCheetah-v5``: obs ``qpos[1:], qvel`` (17); reward forward speed minus
    ``0.1 |a|^2``; never terminates; reset ``qpos`` uniform, ``qvel`` normal, scale 0.1."""

    gym_id, xml_file, frame_skip_default = "HalfCheetah-v5", "half_cheetah.xml", 5
    defaults = dict(forward_reward_weight=1.0, ctrl_cost_weight=0.1, reset_noise_scale=0.1,
                    exclude_current_positions_from_observation=True)

    def noise(self, n):
        s = float(self.config["reset_noise_scale"])
        return self.init_qpos + self._uniform(n, self.m.nq, -s, s), self.init_qvel + s * self._normal(n, self.m.nv)


class HopperV5(_Forward):
    """gymnasium's ``Hopper-v5``: obs ``qpos[1:], clip(qvel, -10, 10)`` (11); reward forward speed
    + 1 while healthy - ``1e-3 |a|^2``; terminates when unhealthy (``qpos[2:], qvel`` within
    (-100, 100), height ``qpos[1] > 0.7``, angle ``qpos[2]`` within (-0.2, 0.2)); reset uniform 5e-3."""

    gym_id, xml_file, frame_skip_default = "Hopper-v5", "hopper.xml", 4
    clip_velocity = 10.0
    defaults = dict(forward_reward_weight=1.0, ctrl_cost_weight=1e-3, healthy_reward=1.0,
                    terminate_when_unhealthy=True, healthy_state_range=(-100.0, 100.0),
                    healthy_z_range=(0.7, float("inf")), healthy_angle_range=(-0.2, 0.2), reset_noise_scale=5e-3,
                    exclude_current_positions_from_observation=True)

    def healthy(self, qpos, qvel):
        c = self.config
        state = torch.cat([qpos, qvel], -1)[:, 2:]
        ok = ((state > c["healthy_state_range"][0]) & (state < c["healthy_state_range"][1])).all(-1)
        return ok & _between(qpos[:, 1], *c["healthy_z_range"]) & _between(qpos[:, 2], *c["healthy_angle_range"])


class Walker2dV5(_Forward):
    """gymnasium's ``Walker2d-v5`` (``walker2d_v5.xml``): obs ``qpos[1:], clip(qvel, -10, 10)`` (17);
    reward forward speed + 1 while healthy - ``1e-3 |a|^2``; healthy: height in (0.8, 2), angle in
    (-1, 1); reset uniform 5e-3."""

    gym_id, xml_file, frame_skip_default = "Walker2d-v5", "walker2d_v5.xml", 4
    clip_velocity = 10.0
    defaults = dict(forward_reward_weight=1.0, ctrl_cost_weight=1e-3, healthy_reward=1.0,
                    terminate_when_unhealthy=True, healthy_z_range=(0.8, 2.0), healthy_angle_range=(-1.0, 1.0),
                    reset_noise_scale=5e-3, exclude_current_positions_from_observation=True)

    def healthy(self, qpos, qvel):
        c = self.config
        return _between(qpos[:, 1], *c["healthy_z_range"]) & _between(qpos[:, 2], *c["healthy_angle_range"])


class SwimmerV5(_Forward):
    """gymnasium's ``Swimmer-v5``: obs ``qpos[2:], qvel`` (8); reward ``x`` speed - ``1e-4 |a|^2``;
    reset uniform 0.1. The file's fluid (``density``, ``viscosity``) acts through
    :mod:`diffmech.sim.soft_fluid` inside the step."""

    gym_id, xml_file, frame_skip_default = "Swimmer-v5", "swimmer.xml", 4
    skip_positions = 2
    defaults = dict(forward_reward_weight=1.0, ctrl_cost_weight=1e-4, reset_noise_scale=0.1,
                    exclude_current_positions_from_observation=True)


class AntV5(MujocoTask):
    """gymnasium's ``Ant-v5``: obs ``qpos[2:], qvel, clip(cfrc_ext[1:], -1, 1)`` (105); reward ``x``
    speed of the torso + 1 while healthy - ``0.5 |a|^2`` - ``5e-4 |clip(cfrc_ext)|^2``; healthy:
    finite and torso height in [0.2, 1]; reset ``qpos`` uniform, ``qvel`` normal, scale 0.1."""

    gym_id, xml_file, frame_skip_default = "Ant-v5", "ant.xml", 5
    defaults = dict(forward_reward_weight=1.0, ctrl_cost_weight=0.5, contact_cost_weight=5e-4, healthy_reward=1.0,
                    main_body=1, terminate_when_unhealthy=True, healthy_z_range=(0.2, 1.0),
                    contact_force_range=(-1.0, 1.0), reset_noise_scale=0.1,
                    exclude_current_positions_from_observation=True, include_cfrc_ext_in_observation=True)

    def _setup(self):
        import mujoco

        b = self.config["main_body"]
        self.main_body = b if isinstance(b, int) else mujoco.mj_name2id(self.m, mujoco.mjtObj.mjOBJ_BODY, b)
        if not 0 <= self.main_body < self.m.nbody:
            raise OptionError(f"Ant-v5: main_body {b!r} is not a body of {self.xml_path}")

    def noise(self, n):
        s = float(self.config["reset_noise_scale"])
        return self.init_qpos + self._uniform(n, self.m.nq, -s, s), self.init_qvel + s * self._normal(n, self.m.nv)

    def _contact(self, ex):
        return ex.cfrc_ext.clamp(*self.config["contact_force_range"])

    def obs_from(self, q, v, ex):
        qpos, qvel = self.mujoco_state(q, v)
        if self.config["exclude_current_positions_from_observation"]:
            qpos = qpos[:, 2:]
        parts = [qpos, qvel]
        if self.config["include_cfrc_ext_in_observation"]:
            parts.append(self._contact(ex)[:, 1:].flatten(1))
        return torch.cat(parts, -1)

    def healthy(self, qpos, qvel):
        return self._finite(qpos, qvel) & _between(qpos[:, 2], *self.config["healthy_z_range"], strict=False)

    def reward_from(self, q, v, q1, v1, action, ex):
        c = self.config
        x0 = self._body_xpos(q, self.main_body)[:, 0]
        x1 = self._body_xpos(ex.qf, self.main_body)[:, 0]
        healthy = self.healthy(*self.mujoco_state(q1, v1)).to(q1.dtype)
        contact = c["contact_cost_weight"] * self._contact(ex).square().sum((-1, -2))
        return (c["forward_reward_weight"] * (x1 - x0) / self.dt + healthy * c["healthy_reward"]
                - self._ctrl_cost(action) - contact)

    def terminal_from(self, q1, v1, ex):
        if not self.config["terminate_when_unhealthy"]:
            return super().terminal_from(q1, v1, ex)
        return ~self.healthy(*self.mujoco_state(q1, v1))


class HumanoidV5(MujocoTask):
    """gymnasium's ``Humanoid-v5``: obs ``qpos[2:], qvel, cinert[1:], cvel[1:], qfrc_actuator[6:],
    cfrc_ext[1:]`` (348); reward ``1.25`` times the ``x`` speed of the centre of mass + 5 while
    healthy - ``0.1 |ctrl|^2`` - ``min(5e-7 |cfrc_ext|^2, 10)``; healthy: height ``qpos[2]`` in
    (1, 2); reset uniform 1e-2."""

    gym_id, xml_file, frame_skip_default = "Humanoid-v5", "humanoid.xml", 5
    defaults = dict(forward_reward_weight=1.25, ctrl_cost_weight=0.1, contact_cost_weight=5e-7,
                    contact_cost_range=(-math.inf, 10.0), healthy_reward=5.0, terminate_when_unhealthy=True,
                    healthy_z_range=(1.0, 2.0), reset_noise_scale=1e-2,
                    exclude_current_positions_from_observation=True, include_cinert_in_observation=True,
                    include_cvel_in_observation=True, include_qfrc_actuator_in_observation=True,
                    include_cfrc_ext_in_observation=True)

    def _mass_center(self, q):
        xpos, xmat = self.bodies.poses(q)
        xipos, _ = self.bodies.xipos(xpos, xmat)
        m = self.bodies.mass
        return (m[:, None] * xipos).sum(1) / m.sum()

    def obs_from(self, q, v, ex):
        c = self.config
        qpos, qvel = self.mujoco_state(q, v)
        if c["exclude_current_positions_from_observation"]:
            qpos = qpos[:, 2:]
        parts = [qpos, qvel]
        mb = self.bodies
        if c["include_cinert_in_observation"] or c["include_cvel_in_observation"]:
            xpos, xmat, S = mb.poses(ex.qf, jacobians=True)
            xipos, ximat = mb.xipos(xpos, xmat)
            com = mb.subtree_com(xipos)
            if c["include_cinert_in_observation"]:
                parts.append(mb.cinert(xipos, ximat, com)[:, 1:].flatten(1))
            if c["include_cvel_in_observation"]:
                parts.append(mb.cvel(S, ex.vf, com)[:, 1:].flatten(1))
        if c["include_qfrc_actuator_in_observation"]:
            tau = self.actuator_tau(ex.ctrl, ex.qf, ex.vf)
            parts.append(self._to_mj_v(tau, ex.qf)[:, 6:])
        if c["include_cfrc_ext_in_observation"]:
            parts.append(ex.cfrc_ext[:, 1:].flatten(1))
        return torch.cat(parts, -1)

    def healthy(self, qpos):
        return _between(qpos[:, 2], *self.config["healthy_z_range"])

    def reward_from(self, q, v, q1, v1, action, ex):
        c = self.config
        x0 = self._mass_center(q)[:, 0]
        x1 = self._mass_center(ex.qf)[:, 0]
        healthy = self.healthy(self.mujoco_state(q1, v1)[0]).to(q1.dtype)
        contact = (c["contact_cost_weight"] * ex.cfrc_ext.square().sum((-1, -2))).clamp(*c["contact_cost_range"])
        return (c["forward_reward_weight"] * (x1 - x0) / self.dt + healthy * c["healthy_reward"]
                - self._ctrl_cost(action) - contact)

    def terminal_from(self, q1, v1, ex):
        if not self.config["terminate_when_unhealthy"]:
            return super().terminal_from(q1, v1, ex)
        return ~self.healthy(self.mujoco_state(q1, v1)[0])


class ReacherV5(MujocoTask):
    """gymnasium's ``Reacher-v5``: obs ``cos, sin`` of the two arm angles, the target's ``qpos``,
    the arm's ``qvel``, fingertip minus target (x, y) (10); reward ``-|fingertip - target|`` (3-D) -
    ``|a|^2``; 50 steps; reset arm ``qpos`` uniform 0.1, target uniform in the disc of radius 0.2
    (rejection from the square), arm ``qvel`` uniform 5e-3, target at rest."""

    gym_id, xml_file, frame_skip_default = "Reacher-v5", "reacher.xml", 2
    defaults = dict(reward_dist_weight=1.0, reward_control_weight=1.0)

    def _setup(self):
        import mujoco

        self.fingertip = mujoco.mj_name2id(self.m, mujoco.mjtObj.mjOBJ_BODY, "fingertip")
        self.target = mujoco.mj_name2id(self.m, mujoco.mjtObj.mjOBJ_BODY, "target")

    def noise(self, n):
        qpos = self.init_qpos + self._uniform(n, self.m.nq, -0.1, 0.1)
        goal = self._uniform(n, 2, -0.2, 0.2)
        bad = goal.norm(dim=-1) >= 0.2
        while bool(bad.any()):  # gymnasium redraws until the goal lies in the disc
            goal = torch.where(bad[:, None], self._uniform(n, 2, -0.2, 0.2), goal)
            bad = goal.norm(dim=-1) >= 0.2
        qpos = torch.cat([qpos[:, :-2], goal], -1)
        qvel = self.init_qvel + self._uniform(n, self.m.nv, -0.005, 0.005)
        qvel = torch.cat([qvel[:, :-2], torch.zeros_like(qvel[:, -2:])], -1)
        return qpos, qvel

    def _vec(self, q):
        xpos = self.bodies.poses(q)[0]
        return xpos[:, self.fingertip] - xpos[:, self.target]

    def obs_from(self, q, v, ex):
        qpos, qvel = self.mujoco_state(q, v)
        th = qpos[:, :2]
        return torch.cat([torch.cos(th), torch.sin(th), qpos[:, 2:], qvel[:, :2], self._vec(ex.qf)[:, :2]], -1)

    def reward_from(self, q, v, q1, v1, action, ex):
        c = self.config
        return -self._vec(ex.qf).norm(dim=-1) * c["reward_dist_weight"] - action.square().sum(-1) * \
            c["reward_control_weight"]


class InvertedPendulumV5(MujocoTask):
    """gymnasium's ``InvertedPendulum-v5``: obs ``qpos, qvel`` (4); reward 1 per step until the pole
    leaves (-0.2, 0.2) rad (or the state is not finite), which terminates; reset uniform 0.01."""

    gym_id, xml_file, frame_skip_default = "InvertedPendulum-v5", "inverted_pendulum.xml", 2
    defaults = dict(reset_noise_scale=0.01)

    def obs_from(self, q, v, ex):
        return torch.cat(self.mujoco_state(q, v), -1)

    def terminal_from(self, q1, v1, ex):
        obs = self.obs_from(q1, v1, ex)
        return ~torch.isfinite(obs).all(-1) | (obs[:, 1].abs() > 0.2)

    def reward_from(self, q, v, q1, v1, action, ex):
        return (~self.terminal_from(q1, v1, ex)).to(q1.dtype)


class InvertedDoublePendulumV5(MujocoTask):
    """gymnasium's ``InvertedDoublePendulum-v5``: obs cart ``x``, ``sin``, ``cos`` of the two angles,
    ``clip(qvel, -10, 10)``, ``clip(qfrc_constraint, -10, 10)[0]`` (9); reward ``10`` while the tip
    is above 1 m - ``0.01 x_tip^2 - (y_tip - 2)^2`` - ``1e-3 w1^2 - 5e-3 w2^2``; terminates when the
    tip's height is at most 1 m; reset ``qpos`` uniform, ``qvel`` normal, scale 0.1."""

    gym_id, xml_file, frame_skip_default = "InvertedDoublePendulum-v5", "inverted_double_pendulum.xml", 5
    defaults = dict(healthy_reward=10.0, reset_noise_scale=0.1)

    def _setup(self):
        z = dict(dtype=self.scene.dtype, device=self.scene.device)
        self.site_body = int(self.m.site_bodyid[0])
        self.site_pos = torch.tensor(np.asarray(self.m.site_pos[0]), **z)

    def noise(self, n):
        s = float(self.config["reset_noise_scale"])
        return self.init_qpos + self._uniform(n, self.m.nq, -s, s), self.init_qvel + s * self._normal(n, self.m.nv)

    def tip(self, q: Tensor) -> Tensor:
        """``(B, 3)`` the world position of the file's first site (``tip``)."""
        xpos, xmat = self.bodies.poses(q)
        return xpos[:, self.site_body] + (xmat[:, self.site_body] @ self.site_pos[:, None])[..., 0]

    def obs_from(self, q, v, ex):
        qpos, qvel = self.mujoco_state(q, v)
        return torch.cat([qpos[:, :1], torch.sin(qpos[:, 1:]), torch.cos(qpos[:, 1:]), qvel.clamp(-10, 10),
                          ex.qfrc_constraint.clamp(-10, 10)[:, :1]], -1)

    def terminal_from(self, q1, v1, ex):
        return self.tip(ex.qf)[:, 2] <= 1

    def reward_from(self, q, v, q1, v1, action, ex):
        p = self.tip(ex.qf)
        x, y = p[:, 0], p[:, 2]
        qvel = self.mujoco_state(q1, v1)[1]
        alive = (y > 1).to(q1.dtype) * self.config["healthy_reward"]
        return alive - (0.01 * x**2 + (y - 2) ** 2) - (1e-3 * qvel[:, 1] ** 2 + 5e-3 * qvel[:, 2] ** 2)


TASKS: dict[str, type[MujocoTask]] = {c.gym_id: c for c in (
    AntV5, HalfCheetahV5, HopperV5, Walker2dV5, HumanoidV5, SwimmerV5, ReacherV5, InvertedPendulumV5,
    InvertedDoublePendulumV5)}
_LOWER = {k.lower(): k for k in TASKS}


def make(name: str, num_envs: int = 1, *, seed: int | None = None, **kwargs) -> MujocoTask:
    """The batched differentiable environment of gymnasium's MuJoCo task ``name`` (see the module).

    Args:
        name: ``"Ant-v5"``, ``"HalfCheetah-v5"``, ``"Hopper-v5"``, ``"Walker2d-v5"``, ``"Humanoid-v5"``,
            ``"Swimmer-v5"``, ``"Reacher-v5"``, ``"InvertedPendulum-v5"`` or
            ``"InvertedDoublePendulum-v5"`` (any case, with or without a ``"diffmech/"`` prefix).
        num_envs: parallel environments.
        seed: of the reset noise.
        **kwargs: :class:`MujocoTask`'s keywords and the task's gymnasium keywords.

    Raises:
        OptionError: an unknown name (the message lists the known ones) or keyword.
    """
    key = str(name).removeprefix("diffmech/").lower()
    if key not in _LOWER:
        raise OptionError(f"diffmech.rl.make: unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[_LOWER[key]](num_envs, seed=seed, **kwargs)
