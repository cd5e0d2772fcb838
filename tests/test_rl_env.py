"""diffmech.rl.env: the batched differentiable environment and the n-link reaching task.

Oracles: central finite differences (torch.autograd.gradcheck) for the gradients of the reward and the
next observation w.r.t. the action and the state; the telescoped sum of squared distances for the
return; a second environment without resets for the values around an automatic reset.
"""

import math

import pytest
import torch

from diffmech.errors import OptionError, ShapeError
from diffmech.rl import NLinkReach


@pytest.fixture(autouse=True)
def _float64():
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def _env(n=2, num_envs=3, **kw):
    return NLinkReach(n, num_envs=num_envs, dtype=torch.float64, **kw)


@pytest.mark.parametrize("compile", [True, False])
@pytest.mark.parametrize("n", [1, 3])
def test_transition_gradients_match_finite_differences(n, compile):
    env = _env(n, compile=compile)
    g = torch.Generator().manual_seed(n)
    q = (torch.rand(2, n, generator=g) * 2 - 1) * 2
    v = torch.randn(2, n, generator=g)
    a = torch.rand(2, n, generator=g) * 1.6 - 0.8  # inside [-1, 1], away from the clamp's kinks
    t = torch.tensor([3, 7])

    def f(q, v, a):
        q1, v1, obs, r, _ = env.transition(q, v, t, a)
        return obs, r, q1, v1

    assert torch.autograd.gradcheck(f, (q.requires_grad_(), v.requires_grad_(), a.requires_grad_()),
                                    eps=1e-6, atol=1e-6, rtol=1e-5)


def test_gradients_through_steps_match_finite_differences():
    """Three steps of the stored-state API: the return w.r.t. the initial state and every action."""
    env = _env(2, num_envs=2, reset_noise=0.3)
    env.reset(seed=1)
    q0, v0, _ = env.get_state()
    acts = torch.full((3, 2, 2), 0.3) + 0.1 * torch.arange(6.0).reshape(3, 2, 1)

    def ret(q0, v0, acts):
        env.set_state(q0, v0, torch.zeros(2, dtype=torch.long))
        total, last = 0, None
        for k in range(3):
            obs, r, *_ = env.step(acts[k])
            total, last = total + r, obs
        return total, last

    assert torch.autograd.gradcheck(ret, (q0.clone().requires_grad_(), v0.clone().requires_grad_(),
                                          acts.requires_grad_()), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_closed_form_tip_matches_forward_kinematics(n):
    env = _env(n, num_envs=1, link_length=0.7)
    q = 3 * torch.randn(6, n, generator=torch.Generator().manual_seed(n))
    torch.testing.assert_close(env.tip(q), env.robot.link_pose(q, "tip")[..., :3, 3], atol=1e-12, rtol=0)


def test_return_telescopes_to_distance_progress():
    n = 3
    env = _env(n, num_envs=4)
    obs = env.reset()
    x0 = env.tip(env.q)
    d0 = (x0 - env.target).square().sum(-1)
    # The start is horizontal and the target straight up: |x_0 - x_g|^2 = 2 (n l)^2 = 0.5 n^2 at l = 0.5.
    torch.testing.assert_close(d0, torch.full((4,), 0.5 * n**2))
    assert env.max_return == pytest.approx(0.5 * n**2)
    torch.testing.assert_close(x0, torch.tensor([-1.5, 0.0, 0.0]).expand(4, 3), atol=1e-12, rtol=0)
    g = torch.Generator().manual_seed(0)
    total = torch.zeros(4)
    for _ in range(env.horizon):
        res = env.step(torch.rand(4, n, generator=g) * 2 - 1)
        total += res.reward
        last_q = env.q
    assert bool(res.truncated.all()) and not bool(res.terminated.any())
    # the final observation holds the tip's offset from the target / (n l): recover |x_T - x_g|^2
    rel = res.final_obs[:, 3 * n:3 * n + 2] * (n * env.link_length)
    torch.testing.assert_close(total, d0 - rel.square().sum(-1), atol=1e-9, rtol=0)
    torch.testing.assert_close(res.obs, obs)  # every env restarted at the horizontal start
    torch.testing.assert_close(last_q, env.initial_state(4)[0])
    assert int(env.t.max()) == 0


def test_auto_reset_keeps_the_gradients_of_the_others():
    n, N, T = 2, 3, 5
    env = _env(n, num_envs=N, horizon=T)
    ref = _env(n, num_envs=N, horizon=1000)  # the same dynamics, never resets
    env.reset()
    ref.reset()
    t = torch.tensor([0, 2, 4])  # env 2 finishes at the next step
    q = torch.tensor([[1.0, 0.2], [0.5, -0.3], [2.0, 0.1]])
    v = torch.tensor([[0.1, 0.0], [0.0, 0.4], [-0.2, 0.3]])
    a = torch.tensor([[0.2, -0.1], [0.5, 0.5], [-0.3, 0.7]], requires_grad=True)
    env.set_state(q.clone().requires_grad_(), v, t)
    ref.set_state(q, v, t)
    res = env.step(a)
    obs_ref, r_ref, *_ = ref.step(a.detach())
    assert res.truncated.tolist() == [False, False, True]
    assert env.t.tolist() == [1, 3, 0]
    # the finished env starts over; the final observation and the reward are those of the step
    start = env.observe(*env.initial_state(1), torch.zeros(1, dtype=torch.long))
    torch.testing.assert_close(res.obs[2], start[0])
    torch.testing.assert_close(res.obs[:2, :-1], obs_ref[:2, :-1])
    torch.testing.assert_close(res.final_obs[:, :-1], obs_ref[:, :-1])
    torch.testing.assert_close(res.reward, r_ref)
    # gradients: each running env depends on its own action only; the restarted one on nothing
    jac = torch.stack([torch.autograd.grad(res.obs[i].sum(), a, retain_graph=True)[0] for i in range(N)])
    assert bool((jac[0, 0] != 0).any()) and bool((jac[1, 1] != 0).any())
    assert float(jac[0, 1:].abs().max()) == 0 and float(jac[1, [0, 2]].abs().max()) == 0
    assert float(jac[2].abs().max()) == 0
    # ... while its final observation keeps the gradient of the step (a value bootstrap needs it)
    g_final = torch.autograd.grad(res.final_obs[2].sum(), a, retain_graph=True)[0]
    assert bool((g_final[2] != 0).any())
    # stepping on: the running envs' state still carries the graph back to the first action
    res2 = env.step(torch.zeros(N, n))
    g2 = torch.autograd.grad(res2.reward.sum(), a)[0]
    assert bool((g2[:2] != 0).all()) and float(g2[2].abs().max()) == 0


def test_detach_cuts_the_history():
    env = _env(1, num_envs=2)
    env.reset()
    a = torch.full((2, 1), 0.5, requires_grad=True)
    env.step(a)
    env.detach()
    r = env.step(torch.zeros(2, 1)).reward
    assert not r.requires_grad


def test_bad_input_raises():
    env = _env(2, num_envs=2)
    with pytest.raises(OptionError, match="reset"):
        env.step(torch.zeros(2, 2))
    env.reset()
    with pytest.raises(ShapeError, match=r"action must have shape \(2, 2\)"):
        env.step(torch.zeros(2, 3))
    with pytest.raises(OptionError, match="links"):
        NLinkReach(0)
    with pytest.raises(OptionError, match="num_envs"):
        NLinkReach(2, num_envs=0)
    with pytest.raises(OptionError, match="max_torque"):
        NLinkReach(2, max_torque=-1.0)


def test_float32_default_and_torque_limit():
    env = NLinkReach(2, num_envs=2)
    obs = env.reset()
    torch.set_default_dtype(torch.float32)
    assert obs.dtype == torch.float32 and obs.shape == (2, env.obs_dim) == (2, 9)
    # actions beyond [-1, 1] are clamped: the same step as at the limit
    q1, v1 = env.simulate(env.q, env.v, torch.full((2, 2), 5.0))
    q2, v2 = env.simulate(env.q, env.v, torch.ones(2, 2))
    torch.testing.assert_close(v1, v2)
    assert math.isclose(float(env.max_torque[0]), 10.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_cuda_matches_cpu():
    cpu, gpu = NLinkReach(2, num_envs=2), NLinkReach(2, num_envs=2, device="cuda")
    cpu.reset()
    gpu.reset()
    a = torch.tensor([[0.3, -0.2], [1.0, 0.5]])
    for _ in range(5):
        oc, rc, *_ = cpu.step(a)
        og, rg, *_ = gpu.step(a.cuda())
    torch.testing.assert_close(og.cpu(), oc, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(rg.cpu(), rc, atol=1e-4, rtol=1e-4)


def test_runaway_state_ends_its_episode_without_nan():
    """A state beyond max_speed (or non-finite) terminates that environment with a zero reward and
    finite observations; the others are untouched; the count and a warning report it."""
    env = NLinkReach(3, num_envs=3, dtype=torch.float64)
    env.reset()
    q, v = env.q.clone(), env.v.clone()
    v[1] = torch.tensor([150.0, 0.0, 0.0], dtype=torch.float64)  # past max_speed after one step
    v[2, 0] = float("inf")
    env.set_state(q, v) if hasattr(env, "set_state") else setattr(env, "v", v)
    a = torch.zeros(3, 3, dtype=torch.float64, requires_grad=True)
    with pytest.warns(UserWarning, match="environment 1 left the simulable range"):
        res = env.step(a)
    assert res.terminated.tolist() == [False, True, True]
    assert res.reward[1:].abs().max() == 0 and bool(torch.isfinite(res.reward).all())
    assert bool(torch.isfinite(res.final_obs).all()) and bool(torch.isfinite(res.obs).all())
    assert env.diverged == 2
    # restarted from the task's start; the first environment's step is the plain transition
    q1, v1, _, r1, _ = NLinkReach(3, num_envs=1, dtype=torch.float64).transition(q[:1], v[:1], env.t[:1] * 0, a[:1])
    torch.testing.assert_close(res.reward[:1], r1)
    torch.testing.assert_close(env.v[1:], torch.zeros(2, 3, dtype=torch.float64))
    res.reward[0].backward()
    # a state beyond max_speed but finite keeps every gradient finite (a non-finite one cannot: 0 * inf)
    assert bool(torch.isfinite(a.grad[:2]).all())
    # max_speed=None: only non-finite states end an episode
    free = NLinkReach(3, num_envs=1, dtype=torch.float64, max_speed=None)
    free.reset()
    free.v = torch.tensor([[150.0, 0.0, 0.0]], dtype=torch.float64)
    assert not bool(free.step(torch.zeros(1, 3, dtype=torch.float64)).terminated.any())
    with pytest.raises(OptionError, match="max_speed"):
        NLinkReach(2, max_speed=0.0)
