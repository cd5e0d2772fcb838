"""diffmech.rl.make: gymnasium's MuJoCo v5 tasks rebuilt from gymnasium's own XML files.

Oracles: gymnasium's environments themselves (``set_state`` then ``_get_obs`` / ``step``, float64,
MuJoCo 4.0), MuJoCo's ``mj_rnePostConstraint`` for the contact wrenches, central differences at two
step sizes for the reward's gradient w.r.t. the action, single environments for the batched one.
"""

import gymnasium  # noqa: E402
import mujoco  # noqa: E402
import numpy as np
import pytest
import torch

from diffmech.errors import OptionError  # noqa: E402
from diffmech.rl import make  # noqa: E402
from diffmech.rl.tasks import TASKS, contact_wrenches  # noqa: E402

NAMES = sorted(TASKS)
CONTACT = ("Ant-v5", "HalfCheetah-v5", "Hopper-v5", "Humanoid-v5", "Walker2d-v5")  # feet on a floor
# (task, state) one-step comparisons that do not pass yet, and what they wait for
PENDING: dict = {}  # (task, state) -> why it does not match yet (xfail); none now


@pytest.fixture(autouse=True)
def _quiet(tmp_path, monkeypatch):
    import warnings

    monkeypatch.chdir(tmp_path)  # MuJoCo's compiler logs half_cheetah.xml's deprecated 'settotalmass' to the cwd
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


_GYM: dict = {}


def _gym(name):
    if name not in _GYM:
        _GYM[name] = gymnasium.make(name).unwrapped
    return _GYM[name]


_ENVS: dict = {}


def _env(name, n=1):
    """A shared environment (the tests use its pure ``transition`` and ``noise``; one that changes an
    environment builds its own)."""
    if (name, n) not in _ENVS:
        _ENVS[name, n] = make(name, n, seed=0)
    return _ENVS[name, n]


def _landed_state(g, name, seed):
    """A state of gymnasium's own: reset, then random actions until something touches (at most 60 steps)."""
    g.reset(seed=seed)
    rng = np.random.default_rng(seed)
    for _ in range(60):
        if g.data.ncon > 0:
            break
        g.step(rng.uniform(g.action_space.low, g.action_space.high) * 0.3)
    return g.data.qpos.copy(), g.data.qvel.copy(), rng.uniform(g.action_space.low, g.action_space.high)


@pytest.mark.parametrize("name", NAMES)
def test_reset_observation_equals_gymnasium(name):
    g, env = _gym(name), _env(name, 3)
    states = []
    for s in range(3):
        g.reset(seed=s)  # gymnasium's reset noise, quaternions unnormalised
        states.append((g.data.qpos.copy(), g.data.qvel.copy()))
    q, v = env.from_mujoco_state(np.stack([s[0] for s in states]), np.stack([s[1] for s in states]))
    obs = env.observe(q, v, torch.zeros(3, dtype=torch.long)).numpy()
    for i, (qpos, qvel) in enumerate(states):
        g.set_state(qpos, qvel)
        want = g._get_obs()
        assert obs[i].shape == want.shape
        np.testing.assert_allclose(obs[i], want, rtol=0, atol=1e-12 * max(1.0, np.abs(want).max()))


def _step_params():
    cases = [(n, "reset") for n in NAMES] + [(n, "contact") for n in CONTACT]
    return [pytest.param(*c, marks=pytest.mark.xfail(reason=PENDING[c], strict=False)) if c in PENDING else c
            for c in cases]


@pytest.mark.parametrize("name, state", _step_params())
def test_step_equals_gymnasium(name, state):
    """From a state of gymnasium's reset (in the air) or after its first contact, one step with a random
    action."""
    g, env = _gym(name), _env(name)
    if state == "contact":
        qpos, qvel, a = _landed_state(g, name, seed=3)
    else:
        g.reset(seed=3)
        qpos, qvel = g.data.qpos.copy(), g.data.qvel.copy()
        a = np.random.default_rng(3).uniform(g.action_space.low, g.action_space.high)
    g.set_state(qpos, qvel)
    # a transition starts its first substep's solver cold, as mj_step does after a reset; the landing left
    # gymnasium's warm start at its last acceleration (which matters to humanoid.xml's unconverged PGS)
    g.data.qacc_warmstart[:] = 0
    assert state == "reset" or g.data.ncon > 0
    obs_g, rew_g, term_g, trunc_g, _ = g.step(a)
    q, v = env.from_mujoco_state(qpos[None], qvel[None])
    _, _, obs, rew, term = env.transition(q, v, torch.zeros(1, dtype=torch.long), torch.as_tensor(a)[None])
    # measured over gymnasium's reset seeds 0-5: at most 2e-14 relative, but 1e-10 for Humanoid in the air
    # (its file's PGS solver leaves the joint-limit forces that far from converged)
    scale = max(1.0, np.abs(obs_g).max())
    np.testing.assert_allclose(obs[0].numpy(), obs_g, rtol=0, atol=1e-9 * scale)
    assert abs(float(rew[0]) - rew_g) <= 1e-9 * max(1.0, abs(rew_g))
    assert bool(term[0]) == term_g and not trunc_g


def test_humanoid_contact_step_with_newton():
    """Humanoid's contact step (cinert, cvel, qfrc_actuator, cfrc_ext of the last RK4 stage) against
    gymnasium's with MuJoCo's solver set to Newton, converged, as diffmech's."""
    g = gymnasium.make("Humanoid-v5").unwrapped
    env = make("Humanoid-v5")
    qpos, qvel, a = _landed_state(g, "Humanoid-v5", seed=3)
    g.model.opt.solver = mujoco.mjtSolver.mjSOL_NEWTON
    g.model.opt.tolerance, g.model.opt.iterations = 1e-15, 1000
    env.scene.mujoco.tolerance, env.scene.mujoco.iterations = 1e-15, 1000
    env.scene.mujoco.solver = "newton"  # the file's PGS otherwise
    g.set_state(qpos, qvel)
    assert g.data.ncon > 0
    obs_g, rew_g, term_g, _, _ = g.step(a)
    q, v = env.from_mujoco_state(qpos[None], qvel[None])
    _, _, obs, rew, term = env.transition(q, v, torch.zeros(1, dtype=torch.long), torch.as_tensor(a)[None])
    assert np.abs(obs_g[-78:]).max() > 10  # contact wrenches in the observation
    # measured: 1.1e-11 on observations of 5e2, 4e-15 on the reward
    np.testing.assert_allclose(obs[0].numpy(), obs_g, rtol=0, atol=1e-12 * np.abs(obs_g).max())
    assert abs(float(rew[0]) - rew_g) <= 1e-12 * max(1.0, abs(rew_g)) and bool(term[0]) == term_g


@pytest.mark.parametrize("name", ["Ant-v5", "Humanoid-v5"])
def test_contact_wrenches_equal_mujoco(name):
    """cfrc_ext from contacts, forces and diffmech's kinematics = mj_rnePostConstraint (contacts of
    MuJoCo's own, fed in as the step's would be)."""
    from types import SimpleNamespace

    env = _env(name)
    m = env.m
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    d.qpos[:] = m.qpos0 + rng.uniform(-0.2, 0.2, m.nq)
    d.qpos[2] = 0.3 if name == "Ant-v5" else 1.0  # low enough to touch the floor
    d.qpos[3:7] /= np.linalg.norm(d.qpos[3:7])
    d.qvel[:] = rng.normal(size=m.nv)
    mujoco.mj_forward(m, d)
    mujoco.mj_rnePostConstraint(m, d)
    nc = d.ncon
    assert nc >= 2 and np.abs(d.cfrc_ext).max() > 1.0
    c = d.contact
    dims = c.dim[:nc]
    con = SimpleNamespace(pos=torch.tensor(c.pos[:nc])[None], frame=torch.tensor(c.frame[:nc].reshape(-1, 3, 3))[None],
                          active=torch.ones(1, nc, dtype=torch.bool), condim=torch.tensor(dims),
                          friction=torch.tensor(c.friction[:nc]))
    force = np.concatenate([d.efc_force[c.efc_address[i]:c.efc_address[i] + (1 if dims[i] == 1 else 2 * (dims[i] - 1))]
                            for i in range(nc)])
    q, _ = env.from_mujoco_state(d.qpos[None], d.qvel[None])
    got = contact_wrenches(env.bodies, q, con, torch.tensor(force)[None], torch.tensor(m.geom_bodyid[c.geom1[:nc]]),
                           torch.tensor(m.geom_bodyid[c.geom2[:nc]]))
    np.testing.assert_allclose(got[0].numpy(), d.cfrc_ext, rtol=0, atol=1e-12 * np.abs(d.cfrc_ext).max())


@pytest.mark.parametrize("name", NAMES)
def test_reset_noise_ranges(name):
    env = _env(name)
    g = _gym(name)
    n = 4000
    qpos, qvel = (x.numpy() for x in env.noise(n))
    q0, v0 = g.init_qpos, g.init_qvel
    s = env.config.get("reset_noise_scale")
    if name == "Reacher-v5":
        assert np.all(np.abs(qpos[:, :2] - q0[:2]) <= 0.1) and np.abs(qpos[:, :2] - q0[:2]).max() > 0.099
        assert np.all(np.linalg.norm(qpos[:, 2:], axis=1) < 0.2) and np.linalg.norm(qpos[:, 2:], axis=1).max() > 0.19
        assert np.all(np.abs(qvel[:, :2]) <= 0.005) and np.abs(qvel[:, :2]).max() > 0.0049
        assert np.all(qvel[:, 2:] == 0)
        return
    dq = qpos - q0
    assert np.all(np.abs(dq) <= s) and np.all(np.abs(dq).max(0) > 0.99 * s)  # uniform on [-s, s], every coordinate
    assert np.all(np.abs(dq.mean(0)) < 0.1 * s) and np.allclose(dq.std(0), s / np.sqrt(3), rtol=0.1)
    dv = qvel - v0
    if name in ("Ant-v5", "HalfCheetah-v5", "InvertedDoublePendulum-v5"):  # normal with standard deviation s
        assert np.allclose(dv.std(0), s, rtol=0.1) and np.abs(dv).max() > 2.5 * s
    else:
        assert np.all(np.abs(dv) <= s) and np.allclose(dv.std(0), s / np.sqrt(3), rtol=0.1)


def test_episode_ends_and_restarts():
    """InvertedPendulum pushed hard: the pole leaves (-0.2, 0.2) rad, the step reports the termination with
    gymnasium's reward 0 and the environment restarts from a fresh reset state."""
    env = make("InvertedPendulum-v5", 2, seed=0)
    env.reset()
    steps = 0
    while steps < 100:
        res = env.step(torch.full((2, 1), 3.0, dtype=torch.float64))
        steps += 1
        if bool(res.terminated.any()):
            break
    assert bool(res.terminated.all()) and steps > 1
    assert torch.all(res.reward == 0) and torch.all(res.final_obs[:, 1].abs() > 0.2)
    assert torch.all(env.t == 0) and torch.all(env.obs[:, 1].abs() <= 0.01)  # the reset noise's range
    torch.testing.assert_close(res.obs, env.obs)


def test_reset_keeps_the_unnormalised_quaternion():
    env = make("Ant-v5", 2, seed=0)
    env.reset(seed=1)
    qpos, _ = env.mujoco_state(env.q, env.v)
    assert np.abs(np.linalg.norm(qpos[:, 3:7].numpy(), axis=1) - 1).max() > 1e-3  # as gymnasium's reset leaves it
    env.step(torch.zeros(2, 8, dtype=torch.float64))
    qpos, _ = env.mujoco_state(env.q, env.v)
    np.testing.assert_allclose(np.linalg.norm(qpos[:, 3:7].numpy(), axis=1), 1, atol=1e-14)


@pytest.mark.parametrize("name", [pytest.param("Hopper-v5", marks=pytest.mark.slow), "Reacher-v5"])
def test_batched_equals_single(name):
    g = _gym(name)
    states = [_landed_state(g, name, seed=s) for s in range(4)]
    qpos, qvel, a = (torch.tensor(np.stack(x)) for x in zip(*states))
    env4 = _env(name, 4)
    q, v = env4.from_mujoco_state(qpos, qvel)
    t = torch.zeros(4, dtype=torch.long)
    out4 = env4.transition(q, v, t, a)
    env1 = _env(name, 1)
    for i in range(4):
        out1 = env1.transition(q[i:i + 1], v[i:i + 1], t[i:i + 1], a[i:i + 1])
        for x4, x1 in zip(out4, out1):
            if x4.dtype == torch.bool:
                assert bool(x4[i]) == bool(x1[0])
            else:
                torch.testing.assert_close(x4[i], x1[0], rtol=0, atol=1e-12)


@pytest.mark.parametrize("name", ["Hopper-v5", "Reacher-v5"])
def test_reward_gradient_matches_central_differences(name):
    """Hopper from a state with its foot on the floor (a contact), Reacher without contacts."""
    g, env = _gym(name), _env(name)
    qpos, qvel, a = _landed_state(g, name, seed=5)
    if name == "Hopper-v5":
        g.set_state(qpos, qvel)
        assert g.data.ncon > 0
    q, v = env.from_mujoco_state(qpos[None], qvel[None])
    t = torch.zeros(1, dtype=torch.long)
    a = torch.tensor(a)[None] * 0.5  # inside the ctrlrange: MuJoCo's clamp has zero slope outside

    def reward(a):
        return env.transition(q, v, t, a)[3].sum()

    a_req = a.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(reward(a_req), a_req)
    d = torch.randn(a.shape, generator=torch.Generator().manual_seed(0), dtype=a.dtype)
    want = (grad * d).sum()
    with torch.no_grad():
        for h in (1e-4, 1e-5):
            fd = (reward(a + h * d) - reward(a - h * d)) / (2 * h)
            # measured 8e-11 (Hopper, h = 1e-4)
            assert abs(float(fd - want)) <= 1e-9 * max(1.0, abs(float(want))), (h, float(fd), float(want))


@pytest.mark.slow
def test_ant_gradient_through_contact_wrenches():
    """Ant on the floor: the reward (its contact cost) and the observed contact wrenches carry the
    gradient of the contact forces (the solver's implicit derivative) w.r.t. the action."""
    g, env = _gym("Ant-v5"), _env("Ant-v5")
    qpos, qvel, a = _landed_state(g, "Ant-v5", seed=5)
    q, v = env.from_mujoco_state(qpos[None], qvel[None])
    t = torch.zeros(1, dtype=torch.long)
    a = torch.tensor(a)[None] * 0.5

    def f(a):
        _, _, obs, rew, _ = env.transition(q, v, t, a)
        return rew.sum() + obs[:, 27:].sum()

    a_req = a.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(a_req), a_req)
    d = torch.randn(a.shape, generator=torch.Generator().manual_seed(0), dtype=a.dtype)
    want = float((grad * d).sum())
    with torch.no_grad():
        for h in (1e-5, 1e-6):  # measured 1.7e-9 and 1.2e-10 on a derivative of 1.4
            fd = float((f(a + h * d) - f(a - h * d)) / (2 * h))
            assert abs(fd - want) <= 1e-8 * max(1.0, abs(want)), (h, fd, want)


def test_unknown_name_lists_the_tasks():
    with pytest.raises(OptionError, match="Ant-v5.*Walker2d-v5"):
        make("Pusher-v5")
    with pytest.raises(OptionError, match="unknown keyword"):
        make("Hopper-v5", healthy_z=1.0)


def test_names_and_gymnasium_ids():
    import diffmech.rl  # noqa: F401  (registers the ids)
    from diffmech.rl.train import make_env

    assert make("diffmech/hopper-v5").gym_id == "Hopper-v5"
    assert make_env("reacher-v5", 2).num_envs == 2  # what 'diffmech rl train --env reacher-v5' builds
    from diffmech.cli import _parser

    args = _parser().parse_args(["rl", "train", "--env", "ant-v5", "--algo", "shac", "--out", "run"])
    assert args.env == "ant-v5"
    e = gymnasium.make("diffmech/Reacher-v5")
    ref = _gym("Reacher-v5")
    assert e.observation_space.shape == ref.observation_space.shape
    np.testing.assert_array_equal(e.action_space.low, ref.action_space.low)
    np.testing.assert_array_equal(e.action_space.high, ref.action_space.high)
    obs, _ = e.reset(seed=0)
    obs1, r, term, trunc, _ = e.step(e.action_space.sample())
    assert obs1.shape == obs.shape and np.isfinite(r) and not term and not trunc
    assert e.unwrapped.env.horizon == 50 and e.unwrapped.env.dt == pytest.approx(ref.dt)
    ve = gymnasium.make_vec("diffmech/Reacher-v5", num_envs=3, vectorization_mode="vector_entry_point")
    obs, _ = ve.reset(seed=0)
    assert obs.shape == (3, 10) and ve.step(ve.action_space.sample())[1].shape == (3,)
