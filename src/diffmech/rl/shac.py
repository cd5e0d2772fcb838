"""SHAC: short-horizon actor-critic through the differentiable simulator (Xu et al., ICLR 2022).

Each iteration runs ``num_envs`` environments for ``horizon`` (``H``) steps with the stochastic
actor, keeping the autograd graph of the simulator. The actor loss is minus the mean over the
environments of ``sum_{t<H} gamma^t r_t + gamma^H V(s_H)``, backpropagated through the rollout (an
episode that ends inside the window closes its sum there: ``V`` of its last observation after a time
limit -- or nothing, with ``bootstrap_truncation=False`` -- nothing after a terminal state, and its next
episode starts a new sum). Then the graph is
cut (:meth:`~diffmech.rl.env.DiffEnv.detach`) and the critic ``V`` regresses TD(lambda) targets
computed from the window's rewards and the target critic's values, in minibatches; the target
critic follows by Polyak averaging.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .env import DiffEnv
from .nets import RunningNorm, SquashedGaussianActor, mlp

__all__ = ["SHACConfig", "SHAC", "td_lambda_targets"]


@dataclass
class SHACConfig:
    """Settings of :class:`SHAC` (defaults: the paper's, smaller networks)."""

    num_envs: int = 64            # parallel environments
    horizon: int = 32             # steps of each differentiable window, H
    gamma: float = 0.99
    lam: float = 0.95             # TD(lambda) of the critic targets
    actor_lr: float = 2e-3
    critic_lr: float = 2e-3
    betas: tuple[float, float] = (0.7, 0.95)
    lr_decay: bool = True         # linear decay to 0 over the run
    grad_clip: float = 1.0        # actor gradient norm
    critic_iterations: int = 16   # passes over the window's data per iteration
    critic_minibatches: int = 4
    target_alpha: float = 0.2     # target <- alpha target + (1 - alpha) critic
    hidden: tuple[int, ...] = (64, 64)
    init_log_std: float = -1.0
    obs_norm: bool = True
    reward_scale: float = 1.0
    # Value of the observation reached at the time limit: the critic's (True, the paper's: the episode
    # is cut short of an endless task), or 0 (False: the time limit is part of the task, e.g. a task
    # that observes the elapsed time and scores where the episode ends).
    bootstrap_truncation: bool = True


def td_lambda_targets(rewards: Tensor, next_values: Tensor, done: Tensor, gamma: float, lam: float) -> Tensor:
    """TD(lambda) returns of a window, ``(H, N)``.

    ``G_t = r_t + gamma ((1 - lam) V_{t+1} + lam G_{t+1})``, with ``G_t = r_t + gamma V_{t+1}`` where the
    episode ends at step ``t`` (``done``) and at the window's last step. ``next_values[t]`` is the value
    of the observation the step reached (``0`` after a terminal state).
    """
    H = rewards.shape[0]
    out = torch.empty_like(rewards)
    G = next_values[H - 1]
    for t in range(H - 1, -1, -1):
        boot = next_values[t]
        cont = boot if t == H - 1 else torch.where(done[t], boot, (1 - lam) * boot + lam * G)
        G = rewards[t] + gamma * cont
        out[t] = G
    return out


class SHAC:
    """Short-horizon actor-critic on a :class:`~diffmech.rl.env.DiffEnv` (its ``num_envs`` is used).

    :meth:`iteration` runs one window and the updates and returns the environment steps it took;
    :meth:`act` is the deterministic policy on raw observations.
    """

    def __init__(self, env: DiffEnv, cfg: SHACConfig | None = None, *, total_iterations: int | None = None):
        self.env, self.cfg = env, cfg or SHACConfig()
        c = self.cfg
        dt = env.dtype
        self.norm = RunningNorm(env.obs_dim).to(env.device, dt)
        self.actor = SquashedGaussianActor(env.obs_dim, env.act_dim, c.hidden, state_std=False,
                                           init_log_std=c.init_log_std).to(env.device, dt)
        self.critic = mlp(env.obs_dim, 1, c.hidden).to(env.device, dt)
        self.target = copy.deepcopy(self.critic).requires_grad_(False)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.actor_lr, betas=c.betas)
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=c.critic_lr, betas=c.betas)
        self.total_iterations = total_iterations
        self.iterations = 0
        self.obs = env.reset()
        self.ep_return = torch.zeros(env.num_envs, dtype=dt, device=env.device)
        self.finished_returns: list[float] = []  # training episodes' returns (raw rewards)

    def _n(self, obs: Tensor) -> Tensor:
        return self.norm(obs) if self.cfg.obs_norm else obs

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        """Deterministic action ``(B, act_dim)`` for raw observations ``(B, obs_dim)``."""
        return self.actor(self._n(obs), deterministic=True)

    def _set_lr(self) -> None:
        if not (self.cfg.lr_decay and self.total_iterations):
            return
        f = max(0.0, 1.0 - self.iterations / self.total_iterations)
        for opt, lr in ((self.actor_opt, self.cfg.actor_lr), (self.critic_opt, self.cfg.critic_lr)):
            for g in opt.param_groups:
                g["lr"] = lr * f

    def iteration(self) -> dict:
        c, env = self.cfg, self.env
        H, N = c.horizon, env.num_envs
        self._set_lr()
        obs_buf, rew_buf, done_buf, nv_buf = [], [], [], []
        disc = torch.ones(N, dtype=env.dtype, device=env.device)
        acc = torch.zeros(N, dtype=env.dtype, device=env.device)
        loss = 0.0
        obs = self.obs
        for i in range(H):
            if c.obs_norm:
                self.norm.update(obs)
            a = self.actor(self._n(obs))
            res = env.step(a)
            r = res.reward * c.reward_scale
            done = res.terminated | res.truncated
            v_next = self.target(self._n(res.final_obs)).squeeze(-1)
            last = res.terminated if c.bootstrap_truncation else res.terminated | res.truncated
            v_next = torch.where(last, torch.zeros_like(v_next), v_next)
            acc = acc + disc * r
            close = done if i < H - 1 else torch.ones_like(done)
            loss = loss - torch.where(close, acc + disc * c.gamma * v_next, torch.zeros_like(acc)).sum()
            disc = torch.where(done, torch.ones_like(disc), disc * c.gamma)
            acc = torch.where(done, torch.zeros_like(acc), acc)
            obs_buf.append(obs.detach())
            rew_buf.append(r.detach())
            done_buf.append(done)
            nv_buf.append(v_next.detach())
            with torch.no_grad():
                self.ep_return += res.reward
                if bool(done.any()):
                    self.finished_returns += self.ep_return[done].tolist()
                    self.ep_return[done] = 0
            obs = res.obs
        loss = loss / (H * N)
        self.actor_opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = nn.utils.clip_grad_norm_(self.actor.parameters(), c.grad_clip)
        if torch.isfinite(gnorm):
            self.actor_opt.step()
        # else: a window whose gradient overflowed (a chaotic swing) would turn every weight into NaN; skip it
        env.detach()
        self.obs = obs.detach()

        # critic: TD(lambda) targets of the window, then minibatch regression
        with torch.no_grad():
            targets = td_lambda_targets(torch.stack(rew_buf), torch.stack(nv_buf), torch.stack(done_buf), c.gamma,
                                        c.lam)
            X = self._n(torch.stack(obs_buf)).reshape(H * N, -1)
            Y = targets.reshape(H * N)
        mb = max(1, (H * N) // c.critic_minibatches)
        closs = torch.zeros(())
        for _ in range(c.critic_iterations):
            perm = torch.randperm(H * N, device=env.device)
            for k in range(0, H * N, mb):
                idx = perm[k:k + mb]
                closs = (self.critic(X[idx]).squeeze(-1) - Y[idx]).square().mean()
                self.critic_opt.zero_grad(set_to_none=True)
                closs.backward()
                self.critic_opt.step()
        with torch.no_grad():
            for pt, p in zip(self.target.parameters(), self.critic.parameters()):
                pt.mul_(c.target_alpha).add_(p, alpha=1 - c.target_alpha)
        self.iterations += 1
        return {"env_steps": H * N, "actor_loss": float(loss.detach()), "critic_loss": float(closs.detach()),
                "grad_norm": float(gnorm)}

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "critic": self.critic.state_dict(),
                "target": self.target.state_dict(), "norm": self.norm.state_dict()}

    def load_state_dict(self, sd: dict) -> None:
        self.actor.load_state_dict(sd["actor"])
        self.critic.load_state_dict(sd["critic"])
        self.target.load_state_dict(sd["target"])
        self.norm.load_state_dict(sd["norm"])
