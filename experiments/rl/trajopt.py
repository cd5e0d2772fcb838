"""Open-loop reference for n-link reaching: Adam on the 100 x n torques (through tanh) of 16 random starts,
backpropagating the return through the differentiable environment; prints the best return per n."""

import time

import torch

from diffmech.rl import NLinkReach

torch.manual_seed(0)
torch.set_num_threads(1)
for n in (1, 2, 3):
    B = 16
    env = NLinkReach(n, num_envs=B)
    u = (0.5 * torch.randn(B, env.horizon, n)).requires_grad_()
    opt = torch.optim.Adam([u], lr=0.1)
    t0 = time.time()
    for _ in range(300):
        env.reset()
        ret = 0
        for k in range(env.horizon):
            ret = ret + env.step(torch.tanh(u[:, k])).reward
        opt.zero_grad()
        (-ret.sum()).backward()
        opt.step()
    print(f"n = {n}: best return {ret.max().item():.4f} of {env.max_return} ({time.time() - t0:.0f} s)")
