"""diffmech.rl.gym_env: gymnasium's own checkers, the registered ids, and stable-baselines3 on the adapters."""

import numpy as np
import pytest
import torch

gymnasium = pytest.importorskip("gymnasium")

import diffmech.rl  # noqa: E402,F401  (registers the ids)
from diffmech.rl import NLinkReach  # noqa: E402
from diffmech.rl.gym_env import GymVectorEnv, NLinkReachEnv  # noqa: E402


def test_env_checker_passes():
    from gymnasium.utils.env_checker import check_env

    env = gymnasium.make("diffmech/NLinkReach-v0", links=3, render_mode="rgb_array")
    check_env(env.unwrapped)
    img = env.unwrapped.render()
    assert img.ndim == 3 and img.shape[2] == 3 and img.dtype == np.uint8
    assert env.observation_space.shape == (12,) and env.action_space.shape == (3,)


def test_single_env_matches_the_batched_env():
    env = gymnasium.make("diffmech/NLinkReach-v0", links=2)
    ref = NLinkReach(2, num_envs=1)
    obs, _ = env.reset(seed=0)
    ref_obs = ref.reset()
    np.testing.assert_allclose(obs, ref_obs[0].numpy())
    rng = np.random.default_rng(0)
    total, steps, done = 0.0, 0, False
    while not done:
        a = rng.uniform(-1, 1, 2).astype(np.float32)
        obs, r, term, trunc, _ = env.step(a)
        res = ref.step(torch.as_tensor(a)[None])
        assert r == pytest.approx(float(res.reward[0]))
        total += r
        steps += 1
        done = term or trunc
    assert steps == 100 and trunc and not term
    np.testing.assert_allclose(obs, res.final_obs[0].numpy(), rtol=1e-6)
    # the return is the squared distance gained: |x_0 - x_g|^2 - |x_T - x_g|^2 (the obs holds (x - x_g) / (n l))
    assert total == pytest.approx(2.0 - float(np.sum(obs[6:8] ** 2)), abs=1e-4)  # n l = 1


def test_vector_env_same_step_autoreset():
    venv = gymnasium.make_vec("diffmech/NLinkReach-v0", num_envs=4, vectorization_mode="vector_entry_point",
                              links=2, horizon=3)
    assert isinstance(venv, GymVectorEnv) and venv.num_envs == 4
    obs, _ = venv.reset(seed=1)
    assert obs.shape == (4, 9) and obs.dtype == np.float32
    for _ in range(3):
        obs, r, term, trunc, info = venv.step(np.full((4, 2), 0.5, np.float32))
        assert r.shape == (4,)
    assert trunc.all() and info["_final_obs"].all()
    assert info["final_obs"][0].shape == (9,)
    np.testing.assert_allclose(obs, venv.reset()[0])  # restarted in the same step
    assert not np.allclose(info["final_obs"][0], obs[0])


def test_vector_env_checker():
    venv = GymVectorEnv(NLinkReach(2, num_envs=3))
    obs, _ = venv.reset(seed=0)
    assert venv.observation_space.contains(obs)
    a = venv.action_space.sample()
    obs, *_ = venv.step(a)
    assert venv.observation_space.contains(obs)


def test_stable_baselines3_sac_and_ppo_run_unchanged():
    sb3 = pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_checker import check_env as sb3_check

    env = NLinkReachEnv(links=2)
    sb3_check(env)
    sac = sb3.SAC("MlpPolicy", env, learning_starts=20, batch_size=16, seed=0, device="cpu")
    sac.learn(total_timesteps=40)
    ppo = sb3.PPO("MlpPolicy", gymnasium.make("diffmech/NLinkReach-v0", links=2), n_steps=32, batch_size=16,
                  n_epochs=1, seed=0, device="cpu")
    ppo.learn(total_timesteps=64)
    a, _ = ppo.predict(env.reset()[0], deterministic=True)
    assert a.shape == (2,) and np.all(np.abs(a) <= 1)
