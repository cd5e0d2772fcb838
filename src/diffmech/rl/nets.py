"""Small networks shared by the learners: MLPs, a running observation normaliser, squashed Gaussian actors."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor, nn

__all__ = ["mlp", "RunningNorm", "SquashedGaussianActor"]


def mlp(inp: int, out: int, hidden: Sequence[int], activation: type[nn.Module] = nn.ELU) -> nn.Sequential:
    """``inp -> hidden... -> out`` with ``activation`` between the linear layers (PyTorch's default init)."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(inp, h), activation()]
        inp = h
    layers.append(nn.Linear(inp, out))
    return nn.Sequential(*layers)


class RunningNorm(nn.Module):
    """``(x - mean) / std`` with the mean and variance of every batch passed to :meth:`update` (parallel
    Welford); differentiable w.r.t. ``x`` (the statistics are constants)."""

    def __init__(self, dim: int, eps: float = 1e-5, clip: float = 10.0):
        super().__init__()
        self.register_buffer("mean", torch.zeros(dim))
        self.register_buffer("var", torch.ones(dim))
        self.register_buffer("count", torch.tensor(eps))
        self.eps, self.clip = eps, clip

    @torch.no_grad()
    def update(self, x: Tensor) -> None:
        x = x.reshape(-1, x.shape[-1]).to(self.mean.dtype)
        n = x.shape[0]
        m, v = x.mean(0), x.var(0, unbiased=False)
        tot = self.count + n
        delta = m - self.mean
        self.mean += delta * n / tot
        self.var.copy_((self.var * self.count + v * n + delta.square() * self.count * n / tot) / tot)
        self.count.copy_(tot)

    def forward(self, x: Tensor) -> Tensor:
        y = (x - self.mean) / torch.sqrt(self.var + self.eps)
        return y.clamp(-self.clip, self.clip)


class SquashedGaussianActor(nn.Module):
    """``a = tanh(mu(s) + sigma(s) eps)``, ``eps ~ N(0, I)``: actions in ``(-1, 1)``, reparameterised.

    ``state_std=True`` lets the network output the log standard deviation too (SAC); otherwise it is
    one learned vector (SHAC).
    """

    LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], *, state_std: bool,
                 init_log_std: float = -1.0, activation: type[nn.Module] = nn.ELU):
        super().__init__()
        self.state_std = state_std
        self.net = mlp(obs_dim, 2 * act_dim if state_std else act_dim, hidden, activation)
        if not state_std:
            self.log_std = nn.Parameter(torch.full((act_dim,), float(init_log_std)))

    def dist(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        out = self.net(obs)
        if self.state_std:
            mu, log_std = out.chunk(2, dim=-1)
        else:
            mu, log_std = out, self.log_std.expand_as(out)
        return mu, log_std.clamp(self.LOG_STD_MIN, self.LOG_STD_MAX)

    def forward(self, obs: Tensor, deterministic: bool = False) -> Tensor:
        """Action ``(..., act_dim)``: sampled, or ``tanh(mu)`` when ``deterministic``."""
        mu, log_std = self.dist(obs)
        return torch.tanh(mu if deterministic else mu + log_std.exp() * torch.randn_like(mu))

    def sample(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        """Reparameterised action and its log-density ``(...,)`` (with the tanh change of variables)."""
        mu, log_std = self.dist(obs)
        eps = torch.randn_like(mu)
        u = mu + log_std.exp() * eps
        logp = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        # log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u)), stable for large |u|
        logp = logp - (2 * (math.log(2.0) - u - nn.functional.softplus(-2 * u))).sum(-1)
        return torch.tanh(u), logp
