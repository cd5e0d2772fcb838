"""``experiments/transplant_v5.py``: the same start states and actions give the same returns in
diffmech's HalfCheetah-v5 and in gymnasium's (the oracle), and ``--quick`` runs end to end."""

from __future__ import annotations

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "experiments", "transplant_v5.py")


@pytest.fixture(scope="module")
def tv5():
    spec = importlib.util.spec_from_file_location("transplant_v5", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_replayed_actions_give_gymnasiums_returns(tv5):
    from diffmech.rl import make

    T, E = 6, 2
    env = make("halfcheetah-v5", E, seed=3, horizon=T)
    q0, v0 = env.initial_state(E)
    qpos, qvel = (x.numpy() for x in env.mujoco_state(q0, v0))
    acts = np.random.default_rng(0).uniform(env.action_low.numpy(), env.action_high.numpy(), (T, E, env.act_dim))
    d_ret, d_len, d_obs = tv5.run_diffmech(env, None, q0, v0, acts)
    g_ret, g_len, g_obs = tv5.run_gymnasium("HalfCheetah-v5", None, qpos, qvel, T, acts)
    assert d_len.tolist() == g_len.tolist() == [T, T]
    # measured: observations equal, returns 2.3e-14 apart (diffmech's step matches mj_step to ~1e-14)
    assert np.abs(d_obs - g_obs).max() < 1e-12
    assert np.abs(d_ret - g_ret).max() < 1e-12


@pytest.mark.slow
def test_quick_run_writes_results(tv5, tmp_path):
    tv5.main(["--quick", "--tasks", "halfcheetah-v5", "--out", str(tmp_path / "out"), "--runs", str(tmp_path / "runs")])
    r = json.loads((tmp_path / "out" / "halfcheetah-v5.json").read_text())
    assert r["max_abs_obs0_difference"] < 1e-12
    # no contact-dependent reward term on HalfCheetah: the same policy returns the same in both
    assert abs(r["gymnasium_policy_return"]["mean"] - r["diffmech_policy_return"]["mean"]) < 1e-9
    assert "halfcheetah-v5" in json.loads((tmp_path / "out" / "summary.json").read_text())
