"""The Ant in MuJoCo: run a policy trained in diffmech on the same robot built with ``mujoco``.

:func:`mujoco_ant` compiles :func:`diffmech.model.ant.ant_mjcf` (the same dimensions, joints, limits,
density, damping, armature and motors as the diffmech Ant); :class:`MujocoAnt` is the task of
:class:`~diffmech.rl.ant.Ant` on it (the same observation, reward, termination, start states and
step of ``frame_skip x timestep``); :func:`transplant` evaluates a trained run's policy there,
without retraining, next to a uniformly random policy. What differs is the simulator: MuJoCo's soft
contacts (a contact is a stiff spring-damper with its default ``solref``, so the feet sink a few
millimetres and bounce a little) and soft joint limits, against diffmech's hard ones.

``diffmech rl transplant DIR`` calls :func:`transplant`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from ..errors import OptionError

__all__ = ["mujoco_ant", "MujocoAnt", "diffmech_to_mujoco_state", "transplant", "zero_action_agreement"]


def mujoco_ant(geometry=None, *, timestep: float = 0.01, integrator: str = "Euler", friction: float = 1.0):
    """The Ant of ``geometry`` (default the MuJoCo Ant's) as a compiled ``mujoco.MjModel``."""
    import mujoco

    from ..model.ant import ant_mjcf

    return mujoco.MjModel.from_xml_string(ant_mjcf(geometry, timestep=timestep, integrator=integrator,
                                                   friction=friction))


def diffmech_to_mujoco_state(q: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """MuJoCo's ``qpos (..., 15)``, ``qvel (..., 14)`` of a diffmech Ant state ``q (..., 15)``,
    ``v (..., 14)``: the quaternion to ``(w, x, y, z)``, the torso's linear velocity from torso to
    world axes (MuJoCo's free joint keeps it in world axes, the angular one in body axes, as diffmech)."""
    q, v = np.asarray(q, dtype=np.float64), np.asarray(v, dtype=np.float64)
    quat = q[..., 3:7] / np.linalg.norm(q[..., 3:7], axis=-1, keepdims=True)
    x, y, z, w = (quat[..., i] for i in range(4))
    R = np.stack([np.stack([1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)], -1),
                  np.stack([2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)], -1),
                  np.stack([2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)], -1)], -2)
    qpos = np.concatenate([q[..., :3], w[..., None], quat[..., :3], q[..., 7:]], -1)
    qvel = np.concatenate([(R @ v[..., :3, None])[..., 0], v[..., 3:]], -1)
    return qpos, qvel


class MujocoAnt:
    """The task of :class:`~diffmech.rl.ant.Ant` (one environment) simulated by MuJoCo.

    Args:
        env: the diffmech :class:`~diffmech.rl.ant.Ant` whose constants (geometry, ``sim_dt``,
            ``frame_skip``, horizon, reward weights, healthy range, reset noise) and start states it
            takes: a reset draws the start state from ``env.initial_state`` with ``env``'s generator.
        integrator: MuJoCo's integrator (``"Euler"``: semi-implicit, as diffmech's; the MuJoCo Ant's
            file uses ``"RK4"``).
    """

    def __init__(self, env, *, integrator: str = "Euler"):
        import mujoco

        self.env = env
        self.model = mujoco_ant(env.geometry, timestep=env.sim_dt, integrator=integrator,
                                friction=float(env.scene.friction))
        self.data = mujoco.MjData(self.model)
        self.t = 0

    def observe(self) -> np.ndarray:
        d = self.data
        return np.concatenate([d.qpos[2:], d.qvel]).copy()

    def healthy(self) -> bool:
        d = self.data
        lo, hi = self.env.healthy_z_range
        return bool(np.isfinite(d.qpos).all() and np.isfinite(d.qvel).all() and lo < d.qpos[2] < hi)

    def set_state(self, q: np.ndarray, v: np.ndarray) -> None:
        """Put the robot in the diffmech state ``q (15,)``, ``v (14,)``."""
        import mujoco

        qpos, qvel = diffmech_to_mujoco_state(q, v)
        mujoco.mj_resetData(self.model, self.data)
        self.data.qpos[:], self.data.qvel[:] = qpos, qvel
        mujoco.mj_forward(self.model, self.data)

    def reset(self) -> np.ndarray:
        q, v = self.env.initial_state(1)
        self.set_state(q[0].detach().cpu().numpy(), v[0].detach().cpu().numpy())
        self.t = 0
        return self.observe()

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool]:
        """``(obs, reward, terminated, truncated)`` of one step (``frame_skip`` MuJoCo steps)."""
        import mujoco

        a = np.asarray(action, dtype=np.float64).reshape(-1)
        x0 = float(self.data.qpos[0])
        self.data.ctrl[:] = np.clip(a, -1.0, 1.0)
        mujoco.mj_step(self.model, self.data, nstep=self.env.frame_skip)
        healthy = self.healthy()
        reward = ((float(self.data.qpos[0]) - x0) / self.env.dt + self.env.healthy_reward * healthy
                  - self.env.ctrl_cost_weight * float(a @ a))
        self.t += 1
        return self.observe(), reward, not healthy, healthy and self.t >= self.env.horizon

    def episode(self, policy: Callable[[np.ndarray], np.ndarray]) -> tuple[float, int, float]:
        """``(return, steps, distance along x)`` of one episode from a fresh start."""
        obs, total, steps = self.reset(), 0.0, 0
        x0 = float(self.data.qpos[0])
        while True:
            obs, r, term, trunc = self.step(policy(obs))
            total, steps = total + r, steps + 1
            if term or trunc:
                return total, steps, float(self.data.qpos[0]) - x0


def transplant(run, *, episodes: int = 5, which: str = "best", horizon: int | None = None, seed: int = 0,
               integrator: str = "Euler", write: bool = True) -> dict:
    """Evaluate the policy of a ``diffmech rl train --env ant`` run in MuJoCo, and a random policy.

    Args:
        run: the run's folder (``config.json`` and its checkpoints).
        episodes: episodes of each policy (the same start states for both).
        which: ``"best"`` or ``"final"`` checkpoint.
        horizon: steps per episode (default: the run's task's).
        seed: of the start states and the random policy.
        integrator: MuJoCo's (see :class:`MujocoAnt`).
        write: also write ``transplant.json`` into the run's folder.

    Returns:
        ``{"policy_return", "random_return"`` (means over the episodes), their per-episode lists,
        ``"policy_steps"``, ``"policy_distance"`` (m along ``x``), ``"diffmech_return"`` and
        ``"diffmech_random_return"`` (the same policies and start states in diffmech), ...}.
    """
    from .train import _load_policy, make_env

    if which not in ("best", "final"):
        raise OptionError(f"which must be 'best' or 'final', got {which!r}")
    if isinstance(episodes, bool) or not isinstance(episodes, int) or episodes < 1:
        raise OptionError(f"episodes must be a positive integer, got {episodes!r}")
    run = Path(run)
    config = json.loads((run / "config.json").read_text())
    if config["env"] != "ant":
        raise OptionError(f"transplant: {run} trained on {config['env']!r}; only 'ant' runs have a MuJoCo twin")
    kwargs = dict(config.get("env_kwargs", {}))
    if horizon is not None:
        kwargs["horizon"] = int(horizon)
    env = make_env("ant", 1, seed=seed, **kwargs)
    policy_t = _load_policy(run, config, env, which)

    def policy(obs: np.ndarray) -> np.ndarray:
        with torch.no_grad():
            a = policy_t(torch.as_tensor(obs, dtype=env.dtype, device=env.device)[None])
        return a[0].detach().cpu().numpy()

    rng = np.random.default_rng(seed)

    def random_policy(obs: np.ndarray) -> np.ndarray:
        return rng.uniform(-1.0, 1.0, env.act_dim)

    mj = MujocoAnt(env, integrator=integrator)
    out: dict = {"run": str(run), "policy": which, "episodes": episodes, "horizon": env.horizon,
                 "integrator": integrator, "dt": env.dt, "sim_dt": env.sim_dt}
    for name, pol in (("policy", policy), ("random", random_policy)):
        env.seed(seed)  # the same start states for both policies
        rets, steps, dists = [], [], []
        for _ in range(episodes):
            r, n, d = mj.episode(pol)
            rets.append(r)
            steps.append(n)
            dists.append(d)
        out[f"{name}_return"] = float(np.mean(rets))
        out[f"{name}_returns"] = rets
        out[f"{name}_steps"] = steps
        out[f"{name}_distance"] = float(np.mean(dists))
    # the same policy and start states in diffmech, for reference
    from .train import evaluate

    dm = make_env("ant", episodes, seed=seed, **kwargs)
    dm.seed(seed)
    out["diffmech_return"] = evaluate(dm, policy_t)
    g = torch.Generator(device=dm.device).manual_seed(seed)
    dm.seed(seed)
    out["diffmech_random_return"] = evaluate(dm, lambda obs: 2 * torch.rand(
        obs.shape[0], dm.act_dim, generator=g, dtype=dm.dtype, device=dm.device) - 1)
    if write:
        (run / "transplant.json").write_text(json.dumps(out, indent=1))
    return out


def zero_action_agreement(seconds: float = 0.5, *, integrator: str = "Euler") -> dict:
    """Torso height of the diffmech and MuJoCo Ants from the same start (no noise) under zero action,
    every substep for ``seconds``: ``{"t", "z_diffmech", "z_mujoco", "max_abs_dz"}`` and the largest
    difference of all positions (``max_abs_dq``, m or rad) before the first contact."""
    import mujoco

    from ..sim.contact_step import contact_step
    from .ant import Ant

    env = Ant(1, reset_noise=0.0)
    mj = MujocoAnt(env, integrator=integrator)
    q, v = env.q_start[None].clone(), env.v_start[None].clone()
    mj.set_state(q[0].numpy(), v[0].numpy())
    n = int(round(seconds / env.sim_dt))
    tau = torch.zeros(1, 14, dtype=env.dtype)
    zd, zm, dq_free, first_contact = [float(q[0, 2])], [float(mj.data.qpos[2])], 0.0, None
    warm: dict = {}
    for k in range(n):
        info: dict = {}
        q, v = contact_step(env.scene, q, v, tau, env.sim_dt, info, warm=warm)
        warm = info["lam"]
        mujoco.mj_step(mj.model, mj.data)
        zd.append(float(q[0, 2]))
        zm.append(float(mj.data.qpos[2]))
        pushed = any(float(t[..., 0].max()) > 0 for t in warm.values())
        if first_contact is None and (pushed or mj.data.ncon > 0):
            first_contact = (k + 1) * env.sim_dt
        if first_contact is None:
            qpos, _ = diffmech_to_mujoco_state(q[0].numpy(), v[0].numpy())
            dq_free = max(dq_free, float(np.abs(qpos - mj.data.qpos).max()))
    zd_, zm_ = np.array(zd), np.array(zm)
    return {"t": (np.arange(n + 1) * env.sim_dt).tolist(), "z_diffmech": zd, "z_mujoco": zm,
            "max_abs_dz": float(np.abs(zd_ - zm_).max()), "max_abs_dq_before_contact": dq_free,
            "first_contact_s": first_contact, "final_z_diffmech": zd[-1], "final_z_mujoco": zm[-1],
            "rest_z_expected": float(env.geometry.shin_length * math.sin(float(env.q_start[8]))
                                     + env.geometry.leg_radius)}
