"""Which action gradient does policy enhancement follow, and how good is it? (n-link reaching)

For the policy of a ``policy-enhanced-sac`` run (its best and its final checkpoint) on states its own
deterministic policy visits (8 episodes from the task's start states, every 10th step), with actions
``a0`` drawn from the stochastic policy there, three gradients w.r.t. ``a0``:

* ``g_pe``: the one-step expansion the enhanced actor follows (eq. 13-14): ``dr/da + gamma dV(s')/ds' ds'/da``
  with ``V(s') = min Q(s', a') - alpha log pi(a'|s')``, ``a' ~ pi(s')`` (the learner's own code);
* ``g_q``: the critic's own ``d min Q(s, a)/da`` at ``a0`` (what plain SAC's actor follows);
* ``g_r``: the reward's part of ``g_pe`` alone, ``dr/da`` (the rest is the critic's state gradient);
* ``g_true``: the gradient of the discounted return actually obtained, ``sum_k gamma^k r_k`` to the end of the
  episode, by the simulator's gradient through the whole rollout under the deterministic policy after ``a0``.

Reports the median cosine of ``g_pe`` and of ``g_q`` with ``g_true`` and the median norms, per checkpoint;
writes ``pe_gradients.json`` into each run folder and prints a markdown table of the medians over the runs
of each ``n``.

    python experiments/rl/pe_gradients.py experiments/rl/table4/policy-enhanced-sac_n5_s0 [...]
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import torch

from diffmech.rl.train import _config, _learner


def learner_of(run: Path, which: str):
    config = json.loads((run / "config.json").read_text())
    ck = torch.load(run / ("checkpoint_best.pt" if which == "best" else "checkpoint.pt"), weights_only=False)
    cfg = _config(config["algo"], dict(ck["config"]))
    cfg.num_envs = 8
    sac = _learner(config["algo"], cfg, config["env"], config["links"], 1000 + config["seed"], "cpu",
                   config.get("env_kwargs", {}), 1)
    sac.load_state_dict(ck["state"])
    return sac


def states(sac, every: int = 10):
    env = sac.env
    env.reset()
    out = []
    with torch.no_grad():
        for k in range(env.horizon):
            q, v, t = (x.detach().clone() for x in env.get_state())
            if k % every == 0:
                out.append((q, v, t))
            env.step(sac.act(env.obs))
    return [torch.cat(x) for x in zip(*out)]


def true_gradient(sac, q, v, t, a0):
    env, gamma = sac.env, sac.cfg.gamma
    a = a0.clone().requires_grad_(True)
    ret = torch.zeros(q.shape[0], dtype=q.dtype)
    alive = torch.ones(q.shape[0], dtype=torch.bool)
    disc = 1.0
    act = a
    for _ in range(env.horizon):
        q, v, obs, r, term = env.transition(q, v, t, act)
        ret = ret + disc * torch.where(alive, r, torch.zeros_like(r))
        t = t + 1
        alive = alive & ~term & (t < env.horizon)
        if not bool(alive.any()):
            break
        disc *= gamma
        act = sac.actor(obs, deterministic=True)
    (g,) = torch.autograd.grad(ret.sum(), a)
    return g


def reward_gradient(sac, q, v, t, a0):
    a = a0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sac.env.transition(q, v, t, a)[3].sum(), a)
    return g


def critic_gradient(sac, obs, a0):
    a = a0.clone().requires_grad_(True)
    (g,) = torch.autograd.grad(sac._qmin(sac.q, obs, a).sum(), a)
    return g


def main(runs: list[str]) -> None:
    torch.set_num_threads(1)
    every: dict = {}
    for r in runs:
        run = Path(r)
        res = {}
        for which in ("best", "final"):
            torch.manual_seed(0)
            sac = learner_of(run, which)
            q, v, t = states(sac)
            obs = sac.env.observe(q, v, t)
            with torch.no_grad():
                a0, _ = sac.actor.sample(obs)
            g_true = true_gradient(sac, q, v, t, a0)
            g_pe = sac._action_gradient({"act": a0, "q": q, "v": v, "t": t})
            g_q = critic_gradient(sac, obs, a0)
            g_r = reward_gradient(sac, q, v, t, a0)
            cos = torch.nn.functional.cosine_similarity
            res[which] = {"states": int(q.shape[0]),
                          "cos_pe_true": statistics.median(cos(g_pe, g_true, dim=-1).tolist()),
                          "cos_q_true": statistics.median(cos(g_q, g_true, dim=-1).tolist()),
                          "cos_pe_q": statistics.median(cos(g_pe, g_q, dim=-1).tolist()),
                          "norm_true": statistics.median(g_true.norm(dim=-1).tolist()),
                          "norm_pe": statistics.median(g_pe.norm(dim=-1).tolist()),
                          "norm_q": statistics.median(g_q.norm(dim=-1).tolist()),
                          "norm_r": statistics.median(g_r.norm(dim=-1).tolist())}
            print(run.name, which, {k: round(x, 3) for k, x in res[which].items()}, flush=True)
        (run / "pe_gradients.json").write_text(json.dumps(res, indent=1))
        every.setdefault(json.loads((run / "config.json").read_text())["links"], []).append(res)
    print("| n | runs | checkpoint | cos(g_pe, g_true) | cos(g_q, g_true) | cos(g_pe, g_q) | |g_true| | |g_pe| | |g_q| "
          "| |dr/da| |")
    print("|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for n, rs in sorted(every.items()):
        for which in ("best", "final"):
            med = {k: statistics.median(r[which][k] for r in rs) for k in rs[0][which] if k != "states"}
            print(f"| {n} | {len(rs)} | {which} | {med['cos_pe_true']:.2f} | {med['cos_q_true']:.2f} | "
                  f"{med['cos_pe_q']:.2f} | {med['norm_true']:.3f} | {med['norm_pe']:.3f} | {med['norm_q']:.3f} | "
                  f"{med['norm_r']:.4f} |")


if __name__ == "__main__":
    main(sys.argv[1:])
