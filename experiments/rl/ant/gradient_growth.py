"""How the gradient of an Ant window's return grows with the window's length.

Two measurements, for the hard (projected Gauss-Seidel) and the smooth contact model:

* ``dR_h / da_0``: 64 Ants that have landed (10 steps of zero action from their start states) take
  16 more steps under fixed actions ``tanh(0.37 n)``, ``n`` standard normal (the spread of SHAC's
  initial policy); for each ``h = 1..16`` the gradient of the return of the first ``h`` steps w.r.t.
  the first action, per Ant (the Ants are independent, so one backward pass per ``h`` gives every
  Ant's row). Median and largest norm over the 64 Ants.
* SHAC's actor gradient: the norm of the gradient of SHAC's window loss w.r.t. the actor's
  parameters (before clipping) at the initial policy, windows of ``H = 1, 2, 4, 8, 16`` steps,
  three windows each (learning rates zero, so the policy stays the initial one).

Writes ``gradient_growth.json`` and ``gradient_growth.png`` into the folder given (default: this
script's folder).

    python experiments/rl/ant/gradient_growth.py [OUT]
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from diffmech.rl.ant import Ant
from diffmech.rl.shac import SHAC, SHACConfig

N, H = 64, 16


def landed(solver: str) -> Ant:
    env = Ant(N, horizon=100, seed=0, contact_solver=solver)
    env.reset()
    with torch.no_grad():
        for _ in range(10):
            env.step(torch.zeros(N, 8, dtype=env.dtype))
    env.detach()
    return env


def return_gradients(solver: str) -> dict:
    env = landed(solver)
    g = torch.Generator().manual_seed(1)
    acts = (0.37 * torch.randn(H, N, 8, generator=g, dtype=env.dtype)).tanh()
    a0 = acts[0].clone().requires_grad_(True)
    rewards = []
    for t in range(H):
        rewards.append(env.step(a0 if t == 0 else acts[t]).reward)
    R = torch.stack(rewards).cumsum(0)  # (H, N): return of the first h + 1 steps
    norms = torch.stack([torch.autograd.grad(R[h].sum(), a0, retain_graph=h < H - 1)[0].norm(dim=-1)
                         for h in range(H)])  # (H, N)
    return {"median": norms.median(1).values.tolist(), "max": norms.amax(1).tolist()}


def shac_gradients(solver: str) -> dict:
    out = {}
    for h in (1, 2, 4, 8, 16):
        torch.manual_seed(0)
        env = landed(solver)
        sh = SHAC(env, SHACConfig(num_envs=N, horizon=h, actor_lr=0.0, critic_lr=0.0))
        sh.obs = env.obs
        out[h] = [sh.iteration()["grad_norm"] for _ in range(3)]
    return out


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0]) if argv else Path(__file__).parent
    torch.set_num_threads(1)
    t0 = time.time()
    res = {"ants": N, "steps": H, "window_return_gradient": {}, "shac_actor_gradient_norm": {}}
    for solver in ("pgs", "smooth"):
        res["window_return_gradient"][solver] = return_gradients(solver)
        res["shac_actor_gradient_norm"][solver] = shac_gradients(solver)
        print(solver, "done", f"{time.time() - t0:.0f} s", flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    (out / "gradient_growth.json").write_text(json.dumps(res, indent=1))

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    hs = list(range(1, H + 1))
    for solver, style in (("pgs", "-"), ("smooth", "--")):
        w = res["window_return_gradient"][solver]
        axes[0].semilogy(hs, w["median"], "o" + style, ms=3, label=f"{solver}: median of 64 Ants")
        axes[0].semilogy(hs, w["max"], "s" + style, ms=3, label=f"{solver}: largest")
        s = res["shac_actor_gradient_norm"][solver]
        axes[1].semilogy(list(s), [max(v) for v in s.values()], "o" + style, label=f"{solver}: largest of 3 windows")
        axes[1].semilogy(list(s), [min(v) for v in s.values()], "s" + style, label=f"{solver}: smallest")
    axes[0].set_xlabel("steps h of 0.05 s")
    axes[0].set_ylabel("|d return(h) / d a_0|")
    axes[1].set_xlabel("SHAC window H (steps)")
    axes[1].set_ylabel("actor gradient norm (before clipping at 1)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Ant: gradients through the contacts grow with the window")
    fig.tight_layout()
    fig.savefig(out / "gradient_growth.png", dpi=100)


if __name__ == "__main__":
    main()
