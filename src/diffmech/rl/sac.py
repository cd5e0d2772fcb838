"""Soft actor-critic on a :class:`~diffmech.rl.env.DiffEnv`, with the seed's two uses of simulation gradients.

Plain SAC (Haarnoja et al. 2018): twin Q critics with Polyak-averaged targets, a tanh-squashed Gaussian
actor, the entropy weight tuned towards ``-act_dim``. The replay buffer also keeps each transition's
simulator state, so the simulator can be differentiated at stored samples.

``enhancement="policy"`` (policy enhancement, Qiao et al. 2021, eqs. 13-14 and 16): the actor's
``dQ/da`` is replaced by the one-step expansion through the simulator at the stored action ``a0``,

    ``g = dr/da + gamma dV(s')/ds' ds'/da``,   ``V(s') = min_j Q_j(s', a') - alpha log pi(a'|s')``,  ``a' ~ pi(s')``,

evaluated by re-running the stored transition from its simulator state with ``a0`` under autograd; the
actor minimises ``alpha log pi(a|s) - w g . a`` with ``a ~ pi(s)`` and the sample weight
``w = exp(-|a - a0|)`` (the gradient is exact only near ``a0``).

``enhancement="sample"`` (sample enhancement, eq. 11): each real transition ``(s, a0, s'_0, r_0)``
also adds ``extra_samples`` first-order neighbours ``(s, a0 + da, s'_0 + ds'/da da, r_0 + dr/da da)``
to the buffer, with ``da ~ N(0, sample_sigma^2)`` (kept inside ``[-1, 1]``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..errors import OptionError
from .env import DiffEnv
from .nets import SquashedGaussianActor, mlp

__all__ = ["SACConfig", "SAC", "ReplayBuffer", "ENHANCEMENTS"]

ENHANCEMENTS = ("none", "policy", "sample")


@dataclass
class SACConfig:
    """Settings of :class:`SAC`."""

    enhancement: str = "none"     # "none", "policy" or "sample"
    num_envs: int = 1             # environments stepped together per iteration
    buffer_size: int = 1_000_000
    batch_size: int = 256
    gamma: float = 0.99
    tau: float = 0.005            # target <- (1 - tau) target + tau critic
    lr: float = 3e-4
    hidden: tuple[int, ...] = (256, 256)
    learning_starts: int = 1000   # environment steps of uniform random actions before updates
    updates_per_step: float = 1.0 # gradient updates per environment step
    init_alpha: float = 0.2
    extra_samples: int = 9        # sample enhancement: neighbours per real transition
    sample_sigma: float = 0.1     # sample enhancement: std of the action perturbation


class ReplayBuffer:
    """A ring buffer of tensors on one device; fields given by name at the first :meth:`add`."""

    def __init__(self, capacity: int, device):
        self.capacity, self.device = int(capacity), device
        self.data: dict[str, Tensor] = {}
        self.size = self.pos = 0

    def add(self, **fields: Tensor) -> None:
        n = next(iter(fields.values())).shape[0]
        if not self.data:
            self.data = {k: torch.zeros((self.capacity, *v.shape[1:]), dtype=v.dtype, device=self.device)
                         for k, v in fields.items()}
        idx = (self.pos + torch.arange(n, device=self.device)) % self.capacity
        for k, v in fields.items():
            self.data[k][idx] = v.detach().to(self.device)
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, n: int, generator: torch.Generator | None = None) -> dict[str, Tensor]:
        idx = torch.randint(0, self.size, (n,), device=self.device, generator=generator)
        return {k: v[idx] for k, v in self.data.items()}


class SAC:
    """SAC (optionally enhanced by simulation gradients) on a :class:`~diffmech.rl.env.DiffEnv`.

    :meth:`iteration` steps all ``num_envs`` environments once, stores the transitions and runs the
    updates due; it returns the environment steps it took. :meth:`act` is the deterministic policy.
    """

    def __init__(self, env: DiffEnv, cfg: SACConfig | None = None, *, total_iterations: int | None = None):
        self.env, self.cfg = env, cfg or SACConfig()
        c = self.cfg
        if c.enhancement not in ENHANCEMENTS:
            raise OptionError(f"SAC: enhancement must be one of {ENHANCEMENTS}, got {c.enhancement!r}")
        dt, dev = env.dtype, env.device
        self.actor = SquashedGaussianActor(env.obs_dim, env.act_dim, c.hidden, state_std=True,
                                           activation=nn.ReLU).to(dev, dt)
        self.q = nn.ModuleList([mlp(env.obs_dim + env.act_dim, 1, c.hidden, nn.ReLU) for _ in range(2)]).to(dev, dt)
        self.q_target = copy.deepcopy(self.q).requires_grad_(False)
        self.log_alpha = torch.tensor(float(torch.tensor(c.init_alpha).log()), dtype=dt, device=dev,
                                      requires_grad=True)
        self.target_entropy = -float(env.act_dim)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=c.lr)
        self.q_opt = torch.optim.Adam(self.q.parameters(), lr=c.lr)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=c.lr)
        self.buffer = ReplayBuffer(c.buffer_size, dev)
        self.env_steps = 0
        self._update_debt = 0.0
        self.obs = env.reset()
        self.ep_return = torch.zeros(env.num_envs, dtype=dt, device=dev)
        self.finished_returns: list[float] = []
        self.generator = torch.Generator(device=dev)
        self.generator.manual_seed(int(torch.randint(0, 2**31 - 1, ()).item()))
        self.total_iterations = total_iterations

    @torch.no_grad()
    def act(self, obs: Tensor) -> Tensor:
        """Deterministic action ``(B, act_dim)`` for observations ``(B, obs_dim)``."""
        return self.actor(obs, deterministic=True)

    def _qmin(self, qs: nn.ModuleList, obs: Tensor, a: Tensor) -> Tensor:
        x = torch.cat([obs, a], -1)
        return torch.min(qs[0](x), qs[1](x)).squeeze(-1)

    # ------------------------------------------------------------------ collection
    def _collect(self) -> None:
        env, c = self.env, self.cfg
        q, v, t = (x.detach() for x in env.get_state())
        obs = self.obs
        with torch.no_grad():
            if self.env_steps < c.learning_starts:
                a = torch.rand(env.num_envs, env.act_dim, generator=self.generator, dtype=env.dtype,
                               device=env.device) * 2 - 1
            else:
                a = self.actor(obs)
        with torch.no_grad():
            res = env.step(a)
        if c.enhancement == "sample":
            self._add_neighbours(obs, a, res.final_obs, res.reward, res.terminated, (q, v, t))
        env.detach()
        self.buffer.add(obs=obs, act=a, rew=res.reward, next_obs=res.final_obs, term=res.terminated.to(env.dtype),
                        q=q, v=v, t=t)
        with torch.no_grad():
            self.ep_return += res.reward
            done = res.terminated | res.truncated
            if bool(done.any()):
                self.finished_returns += self.ep_return[done].tolist()
                self.ep_return[done] = 0
        self.obs = res.obs.detach()
        self.env_steps += env.num_envs

    # action_jacobian repeats the batch while it has at most this many rows (transitions x outputs)
    JACOBIAN_REPEAT_ROWS = 1024

    def action_jacobian(self, q: Tensor, v: Tensor, t: Tensor, a0: Tensor) -> Tensor:
        """``(N, obs_dim + 1, act_dim)``: the derivatives of each transition's next observation and reward
        (last row) w.r.t. its action ``a0 (N, act_dim)`` from the states ``q, v, t``.

        Up to :attr:`JACOBIAN_REPEAT_ROWS` rows in all (``N (obs_dim + 1)``): one pass over the batch
        repeated ``D = obs_dim + 1`` times, with a one-hot cotangent per copy, instead of ``D`` backward
        passes over the batch: a simulator step of a few environments costs its operators' overhead, not
        arithmetic, so a batch ``D`` times larger costs far less than ``D`` passes (the Ant, 28 rows: 8.7x
        faster for one transition, 1.6x for 16; the 3-link reaching task, 13 rows: 4x for 64).
        Environments are independent, so each copy's gradient is one row. Larger batches take one step
        and ``D`` backward passes (the Ant at 64 transitions, 1,792 rows: the repeated batch was 1.6x
        slower; ``benchmarks/bench_sample_jacobian.py``)."""
        env = self.env
        N, D = a0.shape[0], env.obs_dim + 1
        if N * D > self.JACOBIAN_REPEAT_ROWS:
            a = a0.detach().clone().requires_grad_(True)
            with torch.enable_grad():
                _, _, obs1, rew, _ = env.transition(q.detach(), v.detach(), t.detach(), a)
                outs = torch.cat([obs1, rew[:, None]], -1)
                rows = [torch.autograd.grad(outs[:, i].sum(), a, retain_graph=i < D - 1)[0] for i in range(D)]
            return torch.stack(rows, 1)
        rep = lambda x: x.detach().repeat(D, *([1] * (x.dim() - 1)))  # noqa: E731 - (D N, ...), copy-major
        a = rep(a0).requires_grad_(True)
        with torch.enable_grad():
            _, _, obs1, rew, _ = env.transition(rep(q), rep(v), rep(t), a)
            outs = torch.cat([obs1, rew[:, None]], -1).reshape(D, N, D)
            onehot = torch.eye(D, dtype=outs.dtype, device=outs.device)[:, None, :].expand(D, N, D)
            (g,) = torch.autograd.grad(outs, a, onehot)
        return g.reshape(D, N, -1).transpose(0, 1)

    def _add_neighbours(self, obs: Tensor, a0: Tensor, next_obs: Tensor, rew: Tensor, term: Tensor,
                        state: tuple[Tensor, Tensor, Tensor]) -> None:
        """Sample enhancement: first-order neighbours of the transitions just taken."""
        c = self.cfg
        J = self.action_jacobian(*state, a0)  # (N, obs_dim + 1, act_dim)
        outs = torch.cat([next_obs, rew[:, None]], -1).detach()
        a0 = a0.detach()
        K = c.extra_samples
        a = (a0[:, None] + c.sample_sigma * torch.randn(a0.shape[0], K, a0.shape[1], generator=self.generator,
                                                         dtype=a0.dtype, device=a0.device)).clamp(-1, 1)
        y = outs[:, None] + torch.einsum("noa,nka->nko", J, a - a0[:, None])
        N, d = obs.shape[0], obs.shape[1]
        rep = lambda x: x[:, None].expand(N, K, *x.shape[1:]).reshape(N * K, *x.shape[1:])
        q, v, t = state
        self.buffer.add(obs=rep(obs), act=a.reshape(N * K, -1), rew=y[..., d].reshape(N * K),
                        next_obs=y[..., :d].reshape(N * K, d), term=rep(term.to(obs.dtype)),
                        q=rep(q), v=rep(v), t=rep(t))

    # ------------------------------------------------------------------ updates
    def _update(self) -> dict:
        c = self.cfg
        b = self.buffer.sample(c.batch_size, self.generator)
        alpha = self.log_alpha.exp().detach()
        with torch.no_grad():
            a1, logp1 = self.actor.sample(b["next_obs"])
            y = b["rew"] + c.gamma * (1 - b["term"]) * (self._qmin(self.q_target, b["next_obs"], a1) - alpha * logp1)
        x = torch.cat([b["obs"], b["act"]], -1)
        q_loss = sum((qi(x).squeeze(-1) - y).square().mean() for qi in self.q)
        self.q_opt.zero_grad(set_to_none=True)
        q_loss.backward()
        self.q_opt.step()

        a, logp = self.actor.sample(b["obs"])
        if c.enhancement == "policy":
            g = self._action_gradient(b)
            w = torch.exp(-(a.detach() - b["act"]).norm(dim=-1))
            actor_loss = (alpha * logp - w * (g * a).sum(-1)).mean()
        else:
            actor_loss = (alpha * logp - self._qmin(self.q, b["obs"], a)).mean()
        self.actor_opt.zero_grad(set_to_none=True)
        actor_loss.backward()
        self.actor_opt.step()
        alpha_loss = -(self.log_alpha * (logp.detach() + self.target_entropy)).mean()
        self.alpha_opt.zero_grad(set_to_none=True)
        alpha_loss.backward()
        self.alpha_opt.step()
        with torch.no_grad():
            for pt, p in zip(self.q_target.parameters(), self.q.parameters()):
                pt.lerp_(p, c.tau)
        return {"q_loss": float(q_loss.detach()), "actor_loss": float(actor_loss.detach()), "alpha": float(alpha)}

    def _action_gradient(self, b: dict) -> Tensor:
        """``dr/da + gamma dV(s')/ds' ds'/da`` at the stored ``(state, a0)``, re-simulated under autograd."""
        a0 = b["act"].clone().requires_grad_(True)
        _, _, obs1, r, term = self.env.transition(b["q"], b["v"], b["t"], a0)
        a1, logp1 = self.actor.sample(obs1)
        alpha = self.log_alpha.exp().detach()
        v1 = self._qmin(self.q, obs1, a1) - alpha * logp1
        y = r + self.cfg.gamma * (1 - term.to(r.dtype)) * v1
        (g,) = torch.autograd.grad(y.sum(), a0)  # rows independent: the sum's gradient is each row's
        return g.detach()

    def iteration(self) -> dict:
        self._collect()
        info: dict = {"env_steps": self.env.num_envs}
        if self.env_steps >= self.cfg.learning_starts:
            self._update_debt += self.cfg.updates_per_step * self.env.num_envs
            while self._update_debt >= 1:
                info.update(self._update())
                self._update_debt -= 1
        return info

    def state_dict(self) -> dict:
        return {"actor": self.actor.state_dict(), "q": self.q.state_dict(), "q_target": self.q_target.state_dict(),
                "log_alpha": self.log_alpha.detach().clone()}

    def load_state_dict(self, sd: dict) -> None:
        self.actor.load_state_dict(sd["actor"])
        self.q.load_state_dict(sd["q"])
        self.q_target.load_state_dict(sd["q_target"])
        with torch.no_grad():
            self.log_alpha.copy_(sd["log_alpha"])
