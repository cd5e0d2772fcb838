"""diffmech.rl.Ant: standing on the plane, the reward's definition, gradients vs finite differences,
termination and auto-reset, gymnasium's checker, bad input."""

import math

import numpy as np
import pytest
import torch
from scipy.spatial.transform import Rotation

from diffmech.errors import DiffmechError, ModelError, OptionError, ShapeError
from diffmech.model.ant import AntGeometry, ant_link_inertials, ant_robot, capsule_inertia
from diffmech.rl import Ant
from diffmech.sim import Scene, scenes

F64 = torch.float64


@pytest.fixture(scope="module")
def standing():
    """The Ant settled on the ground under zero action (1 s = 20 steps), and the env."""
    env = Ant(1, reset_noise=0.0, seed=0)
    env.reset()
    zs = []
    with torch.no_grad():
        for _ in range(20):
            res = env.step(torch.zeros(1, 8, dtype=F64))
            assert not bool(res.terminated.any())
            zs.append(float(res.final_q[0, 2]))
    return env, zs


def test_ant_settles_on_the_plane_without_sinking(standing):
    env, zs = standing
    geo = env.geometry
    # resting on the shins' foot spheres with the ankles at their start angle (friction holds the feet):
    # the torso's centre stands shin sin(angle) + leg radius above the ground
    rest = geo.shin_length * math.sin(scenes.ANT_START_ANKLE) + geo.leg_radius
    lo, hi = env.healthy_z_range
    assert all(lo < z < hi for z in zs)
    assert zs[-1] == pytest.approx(rest, abs=2e-3)  # not sunk by more than the solver's slop
    assert max(zs[10:]) - min(zs[10:]) < 1e-5  # no jitter once settled (0.5 s to 1 s)
    assert float(env.v.abs().max()) < 1e-4
    q, v = env.q, env.v
    info: dict = {}
    from diffmech.sim import contact_step

    contact_step(env.scene, q, v, torch.zeros(1, 14, dtype=F64), env.sim_dt, info)
    assert info["penetration"] < 1e-3 and info["candidates"] >= 4  # the four feet


def test_model_masses_from_the_shapes():
    geo = AntGeometry()
    robot = ant_robot(geo)
    total = sum(float(robot.link_params(n).inertial()[0]) for n in robot.link_names)
    rho, r = geo.density, geo.leg_radius

    def cap(length):  # cylinder plus sphere volume
        return rho * (math.pi * r**2 * length + 4 / 3 * math.pi * r**3)

    expected = rho * 4 / 3 * math.pi * geo.torso_radius**3 + 4 * (cap(geo.hip_offset) + cap(geo.thigh_length)
                                                                  + cap(geo.shin_length))
    assert total == pytest.approx(expected, rel=1e-12)
    # a capsule's inertia against a fine numerical integration of its solid
    m, ip, ia = capsule_inertia(0.08, 0.5, 5.0)
    n = 120
    xs = (np.arange(n) + 0.5) / n * 2 - 1
    X, Y, Z = np.meshgrid(xs * 0.08, xs * 0.08, xs * (0.25 + 0.08), indexing="ij")
    dz = np.clip(np.abs(Z) - 0.25, 0, None)
    inside = X**2 + Y**2 + dz**2 <= 0.08**2
    dv = (2 * 0.08 / n) ** 2 * (2 * 0.33 / n) * 5.0
    assert m == pytest.approx(inside.sum() * dv, rel=2e-3)
    assert ia == pytest.approx(((X**2 + Y**2) * inside).sum() * dv, rel=5e-3)
    assert ip == pytest.approx(((Y**2 + Z**2) * inside).sum() * dv, rel=5e-3)
    torso = ant_link_inertials(geo)["torso"]
    assert np.allclose(torso[1], 0.0) and np.allclose(torso[2], np.diag(np.diag(torso[2])))


def test_reward_and_observation_match_their_definitions():
    env = Ant(3, seed=3, frame_skip=2)
    env.reset()
    g = torch.Generator().manual_seed(0)
    for _ in range(4):
        q = env.q.clone()
        a = 1.2 * (2 * torch.rand(3, 8, generator=g, dtype=F64) - 1)  # some beyond the limits: clamped torque
        res = env.step(a)
        q1, v1 = res.final_q, res.final_v
        z = q1[:, 2]
        healthy = ((z > 0.2) & (z < 1.0)).to(F64)
        expected = (q1[:, 0] - q[:, 0]) / 0.02 + healthy - 0.5 * (a**2).sum(-1)
        torch.testing.assert_close(res.reward, expected, rtol=0, atol=1e-12)
        torch.testing.assert_close(res.terminated, healthy == 0)
        # MuJoCo's layout: z, quaternion (w, x, y, z), joints, world linear velocity, body angular velocity, rates
        R = Rotation.from_quat(q1[:, 3:7].numpy())  # scipy: (x, y, z, w)
        obs = res.final_obs.numpy()
        np.testing.assert_allclose(obs[:, 0], q1[:, 2].numpy())
        np.testing.assert_allclose(obs[:, 1:5], np.roll(q1[:, 3:7].numpy(), 1, axis=1))
        np.testing.assert_allclose(obs[:, 5:13], q1[:, 7:].numpy())
        np.testing.assert_allclose(obs[:, 13:16], R.apply(v1[:, :3].numpy()), atol=1e-12)
        np.testing.assert_allclose(obs[:, 16:19], v1[:, 3:6].numpy())
        np.testing.assert_allclose(obs[:, 19:27], v1[:, 6:].numpy())
    assert env.obs_dim == 27 and env.act_dim == 8 and env.dt == pytest.approx(0.02)  # 2 substeps of 0.01 s


def _check_return_gradient(env, q0, v0, seed: int) -> None:
    """The gradient of a 2-step return w.r.t. small torques (the feet keep sticking) against central
    differences."""
    t0 = torch.zeros(1, dtype=torch.long)
    A = 0.02 * (2 * torch.rand(2, 1, 8, generator=torch.Generator().manual_seed(seed), dtype=F64) - 1)

    def ret(A):
        q, v, total = q0, v0, 0.0
        for k in range(A.shape[0]):
            q, v, _, r, _ = env.transition(q, v, t0, A[k])
            total = total + r.sum()
        return total

    a = A.clone().requires_grad_()
    (grad,) = torch.autograd.grad(ret(a), a)
    fd = torch.zeros_like(A)
    eps = 1e-6
    with torch.no_grad():
        for i in range(A.numel()):
            e = torch.zeros(A.numel(), dtype=F64)
            e[i] = eps
            e = e.view_as(A)
            fd.view(-1)[i] = (ret(A + e) - ret(A - e)) / (2 * eps)
    assert float(grad.abs().max()) > 0.1  # the forward reward does depend on the torques
    torch.testing.assert_close(grad, fd, rtol=1e-4, atol=1e-4)


def test_return_gradient_matches_central_differences(standing):
    # a contact-steady configuration: the settled Ant, small torques that keep the feet sticking
    env0, _ = standing
    env = Ant(1, reset_noise=0.0, frame_skip=1, iterations=500)
    _check_return_gradient(env, env0.q.clone(), env0.v.clone(), seed=1)


def test_termination_and_autoreset_keep_the_other_gradients():
    env = Ant(2, seed=0, frame_skip=1)
    env.reset()
    q, v = env.q.clone(), env.v.clone()
    q[0, 2] = 1.3  # env 0 above the healthy range: its first step ends the episode
    env.set_state(q, v)
    a = torch.zeros(2, 2, 8, dtype=F64, requires_grad=True)
    res = env.step(a[0])
    assert res.terminated.tolist() == [True, False] and not bool(res.truncated.any())
    x1 = float(res.final_q[0, 0].detach())
    assert float(res.reward[0].detach()) == pytest.approx((x1 - float(q[0, 0])) / 0.01, abs=1e-9)
    assert int(env.t[0]) == 0 and int(env.t[1]) == 1
    # the restarted env sits at a fresh start state (near the scene's, within the reset noise)
    assert abs(float(env.q[0, 2]) - 0.75) <= 0.1 + 1e-12
    torch.testing.assert_close(res.obs[0], env.observe(env.q, env.v, env.t)[0])
    res2 = env.step(a[1])
    ga0, = torch.autograd.grad(res2.reward[0], a, retain_graph=True)
    ga1, = torch.autograd.grad(res2.reward[1], a)
    assert float(ga0[0].abs().max()) == 0.0 and float(ga0[1, 0].abs().max()) > 0  # restarted: no past
    assert float(ga1[0, 1].abs().max()) > 0 and float(ga1[1, 1].abs().max()) > 0  # the other: its past
    assert float(ga1[:, 0].abs().max()) == 0.0  # environments never mix


def test_truncation_at_the_horizon():
    env = Ant(1, seed=0, horizon=3, frame_skip=1)
    env.reset()
    flags = [bool(env.step(torch.zeros(1, 8, dtype=F64)).truncated[0]) for _ in range(3)]
    assert flags == [False, False, True] and int(env.t[0]) == 0


def test_bad_input_raises():
    with pytest.raises(OptionError, match="frame_skip"):
        Ant(frame_skip=0)
    with pytest.raises(OptionError, match="healthy_z_range"):
        Ant(healthy_z_range=(1.0, 0.2))
    with pytest.raises(OptionError, match="num_envs"):
        Ant(0)
    with pytest.raises(ModelError, match="leg_radius"):
        AntGeometry(leg_radius=-0.1)
    with pytest.raises(ModelError, match="ankle_range"):
        AntGeometry(ankle_range=(1.0, 0.5))
    env = Ant(2)
    env.reset()
    with pytest.raises(ShapeError, match=r"\(2, 8\)"):
        env.step(torch.zeros(2, 14, dtype=F64))
    robot = ant_robot()
    with pytest.raises(ModelError, match="armature"):
        Scene({"ant": robot}, drives={"ant": {"armature": -1.0}})
    from diffmech.rl.train import make_env

    with pytest.raises(DiffmechError):
        make_env("ant", 1, frame_skip=-1)
    assert isinstance(make_env("ant", 2), Ant)
    with pytest.raises(OptionError, match="contact_solver"):
        Ant(contact_solver="soft")
    with pytest.raises(OptionError, match="smoothing"):
        Ant(contact_solver="smooth", smoothing=0.0)


def test_smooth_contacts_stand_like_hard_ones_and_match_central_differences(standing):
    """``contact_solver="smooth"``: the settled Ant stays within a millimetre of the hard-contact one
    under zero action, and the return's gradient w.r.t. the torques matches central differences."""
    env0, _ = standing
    env = Ant(1, reset_noise=0.0, frame_skip=1, contact_solver="smooth")
    assert env.scene.solver == "smooth"
    q0, v0 = env0.q.clone(), env0.v.clone()
    t0 = torch.zeros(1, dtype=torch.long)
    q, v = q0, v0
    with torch.no_grad():
        for _ in range(20):
            q, v, _, _, _ = env.transition(q, v, t0, torch.zeros(1, 8, dtype=F64))
    assert abs(float(q[0, 2] - q0[0, 2])) < 1e-3
    _check_return_gradient(env, q0, v0, seed=2)


def test_armature_slows_a_joint():
    # the armature adds to the joint's diagonal: a hip under a torque, the Ant held in the air by nothing
    # (no ground), accelerates by about tau / (I + armature) at first
    robot = ant_robot()
    dt = 1e-3
    out = []
    for arm in (0.0, 1.0):
        scene = Scene({"ant": robot}, ground=False, limits=False, drives={"ant": {"armature": arm}})
        q = scene.neutral_configuration()[None].clone()
        v = torch.zeros(1, 14, dtype=F64)
        tau = torch.zeros(1, 14, dtype=F64)
        tau[0, 6] = 1.0
        from diffmech.sim import contact_step

        _, v1 = contact_step(scene, q, v, tau, dt)
        out.append(float(v1[0, 6]) / dt)
    M = robot.mass_matrix(scene.neutral_configuration())
    Minv = torch.linalg.inv(M)
    assert out[0] == pytest.approx(float(Minv[6, 6]), rel=1e-9)
    Ma = M.clone()
    Ma[6:, 6:] += torch.eye(8, dtype=F64)
    assert out[1] == pytest.approx(float(torch.linalg.inv(Ma)[6, 6]), rel=1e-9)


def test_gymnasium_env_checker_passes():
    gymnasium = pytest.importorskip("gymnasium")
    from gymnasium.utils.env_checker import check_env

    import diffmech.rl  # noqa: F401  (registers the ids)

    env = gymnasium.make("diffmech/Ant-v0", frame_skip=1, render_mode="rgb_array")
    check_env(env.unwrapped)
    assert env.observation_space.shape == (27,) and env.action_space.shape == (8,)
    img = env.unwrapped.render()
    assert img.ndim == 3 and img.dtype == np.uint8
    venv = gymnasium.make_vec("diffmech/Ant-v0", num_envs=2, vectorization_mode="vector_entry_point", horizon=2,
                              frame_skip=1)
    obs, _ = venv.reset(seed=0)
    assert obs.shape == (2, 27)
    for _ in range(2):
        obs, r, term, trunc, info = venv.step(np.zeros((2, 8), np.float32))
    assert trunc.all() and r.shape == (2,)


# Two Ants' states (hex floats, exact) from 64 Ants under random bang-bang torques with the smooth
# contact model, at the step where the batch's solve failed: the first Ant's own problem converges
# directly, the second's needs the solver's continuation.
_TWO_ANTS_Q = (
    (
        "-0x1.386e62d35ceeap+1", "0x1.b7fa070d46cd9p-1", "0x1.b0a5876f6f4d1p-1", "0x1.f0992bbfe2125p-3",
        "-0x1.de4056cf5a5c9p-4", "-0x1.1ba0f0a17d47fp-1", "0x1.9360248b01519p-1", "-0x1.713ab022a12e1p-3",
        "0x1.56e073b26a1b1p-1", "0x1.71b9496f30f6cp-3", "0x1.bccb0b7b58fa9p-1", "0x1.38bc7a42b41ecp-2",
        "0x1.00bfdf2638dccp+0", "0x1.0c152348cc666p-1", "0x1.38c353fbb98abp+0",
    ),
    (
        "0x1.354536f0b86fep-1", "0x1.3bb4de17eec30p+0", "0x1.434f07e42cd14p-2", "-0x1.e3b6ca3646ba3p-1",
        "0x1.89d9e2af3a328p-3", "0x1.f969b382b8065p-3", "0x1.905ff6e648704p-4", "0x1.0c15234945cecp-1",
        "0x1.0c1523bc7cbc6p-1", "0x1.048ec44999a57p-1", "0x1.00a601c943427p+0", "0x1.a2d51feffa5b2p-2",
        "0x1.0c15238c2b98cp-1", "-0x1.0c152348f027dp-1", "0x1.0c1523bc606d4p-1",
    ),
)
_TWO_ANTS_V = (
    (
        "-0x1.192549892933ap+0", "-0x1.3bcc895001e90p-1", "0x1.28cbc09df8c1ap+0", "0x1.cbc8a737b0a03p+0",
        "-0x1.48dd82601be14p+0", "0x1.11247a6cc6616p+0", "-0x1.8d64a861e772bp-2", "0x1.73c274139bf0dp+2",
        "0x1.984e41504ab99p-2", "0x1.66aae1eed991ap-2", "-0x1.ce4ef8c0db181p+2", "-0x1.cf8b5ff394a95p+2",
        "-0x1.b2529b0000000p-28", "-0x1.0379078000000p-27",
    ),
    (
        "0x1.89bfc9fb34558p-4", "0x1.0f7996c9628fcp+0", "-0x1.e470be8c517b2p-4", "0x1.7aba4b7e2fce8p+1",
        "-0x1.6eff923872e54p-2", "-0x1.73041e47258f2p+1", "-0x1.b422f40000000p-30", "0x1.56680e0000000p-29",
        "-0x1.783e8fec8191cp+0", "-0x1.d0bbea2f3cde4p+2", "0x1.e0ea4e95cf9cdp+2", "-0x1.435503c69ef42p+2",
        "0x1.4af7910000000p-28", "0x1.8092190000000p-28",
    ),
)
_TWO_ANTS_ACTION = ((1, -1, -1, 1, -1, 1, 1, -1), (1, 1, -1, -1, 1, 1, 1, -1))


def test_smooth_contacts_step_each_environment_as_if_alone():
    """The batch dimension holds independent environments: two Ants stepped together by the smooth
    contact model take the steps each takes alone. (The solver used to send every environment of a
    batch through its continuation when one needed it; the first Ant's path through it failed.)"""
    from diffmech.sim import contact_step

    env = Ant(2, contact_solver="smooth")
    q = torch.tensor([[float.fromhex(x) for x in row] for row in _TWO_ANTS_Q], dtype=F64)
    v = torch.tensor([[float.fromhex(x) for x in row] for row in _TWO_ANTS_V], dtype=F64)
    tau = torch.cat([torch.zeros(2, 6, dtype=F64), env.max_torque * torch.tensor(_TWO_ANTS_ACTION, dtype=F64)], -1)
    both, alone = (q, v), [(q[i:i + 1], v[i:i + 1]) for i in range(2)]
    warm: list[dict] = [{}, {}, {}]  # each substep starts from the last one's impulses, as Ant.simulate does

    def substep(k, state, tau_k):
        info: dict = {}
        out = contact_step(env.scene, *state, tau_k, env.sim_dt, info, warm=warm[k])
        warm[k] = info["lam"]
        return out

    for _ in range(env.frame_skip):
        both = substep(0, both, tau)
        alone = [substep(1 + i, s, tau[i:i + 1]) for i, s in enumerate(alone)]
    # the batch's candidate set is the union of both: the far candidates' relaxed impulses (~kappa / gap)
    # are the only difference
    torch.testing.assert_close(both[0], torch.cat([s[0] for s in alone]), rtol=0, atol=1e-7)
    torch.testing.assert_close(both[1], torch.cat([s[1] for s in alone]), rtol=0, atol=1e-5)


# Ants under bang-bang torques at a substep's start whose smooth contact problem Newton's method did
# not solve in the quotient form of the friction law, cold or warm started, with or without the
# continuation: one of 64 (seed 0, step 136; the product form solves it directly) and one of 16
# (seed 1, step 94; the product form solves it through its continuation). (q, v, action) as hex floats.
_HARD_ANTS = {
    "64-ants-step-136": (
        ("-0x1.d1a15608483bbp-2", "-0x1.3ba395f242b28p+0", "0x1.8e1ab3742a6e8p-1", "0x1.58b34a53a6c6dp-4",
         "-0x1.f20813b373ed7p-3", "0x1.7d0cbc993648ap-3", "0x1.e580048b3c3fdp-1", "-0x1.84075f181e2cep-2",
         "0x1.38c353fbc542cp+0", "0x1.83258591a8410p-2", "0x1.0c1523bb5b8d8p-1", "0x1.82f2fbf9e1760p-2",
         "0x1.562d5f451fabbp-1", "0x1.821dc745eaf48p-2", "0x1.38c353fc5f885p+0"),
        ("0x1.3cfc110c2dfa4p-1", "-0x1.7ce53cea1f349p-1", "-0x1.23fc151467261p-1", "-0x1.e561a3cf9a587p-1",
         "0x1.0edfd537efe3ap+1", "0x1.1cb847eb9b6bdp+0", "0x1.6fd785070fa63p+2", "-0x1.3069370000000p-28",
         "-0x1.734cfeaa05e90p+2", "-0x1.30a8d28000000p-27", "-0x1.724072b581746p+2", "0x1.6d80250702a25p+2",
         "-0x1.7433a1b794a1bp+2", "0x1.073af40000000p-27"),
        (1, 1, -1, -1, -1, 1, -1, 1)),
    "16-ants-step-94": (
        ("0x1.2e59f783a8681p-4", "0x1.ab62d22c5672fp-3", "0x1.e21574a94f365p-1", "-0x1.f87097d5e4998p-7",
         "-0x1.6b7e0036522fdp-2", "0x1.27005b5f3b724p-7", "0x1.de91d9d17f4d9p-1", "-0x1.0c152349cc3ccp-1",
         "0x1.66bbc22505e40p-1", "-0x1.be6e715e0d1dep-2", "0x1.0c1523bd71684p-1", "0x1.82757230f7f34p-2",
         "0x1.7de73e9ca48f2p-1", "0x1.0c15237c18359p-1", "0x1.0c1523a5ef89ap-1"),
        ("0x1.21b085934542ep-2", "-0x1.0e764523dfbfep-3", "-0x1.21dd70703f2eep-1", "-0x1.6df41a3a29866p+0",
         "0x1.d10e3827b0318p+0", "0x1.c4170d9c7ff9dp+1", "0x1.900eee0000000p-29", "-0x1.6dddd571383acp+3",
         "-0x1.80589007b182dp+3", "0x1.9aa2660000000p-27", "-0x1.763f91b798df8p+2", "0x1.4aeede44389dep+0",
         "0x1.af9fd88000000p-24", "-0x1.37d80555dfda4p-1"),
        (-1, -1, -1, -1, -1, -1, 1, 1)),
}


@pytest.mark.parametrize("case", sorted(_HARD_ANTS))
def test_smooth_contacts_solve_a_problem_the_quotient_form_stalled_on(monkeypatch, case):
    """The smooth solve converges on those Ants' contact problems, and its impulses satisfy the
    relaxed laws as written (the quotient form, evaluated independently) to the solver's tolerance."""
    import importlib

    from test_contact_smooth import quotient_residual

    step_module = importlib.import_module("diffmech.sim.contact_step")
    seen = []
    solve = step_module.smooth_solve

    def recording(A, c, mu, lam0, **kw):
        out = solve(A, c, mu, lam0, **kw)
        seen.append((A, c, mu, kw, out))
        return out

    monkeypatch.setattr(step_module, "smooth_solve", recording)
    env = Ant(1, contact_solver="smooth")
    hq, hv, action = _HARD_ANTS[case]
    q = torch.tensor([[float.fromhex(x) for x in hq]], dtype=F64)
    v = torch.tensor([[float.fromhex(x) for x in hv]], dtype=F64)
    tau = torch.cat([torch.zeros(1, 6, dtype=F64), env.max_torque * torch.tensor([action], dtype=F64)], -1)
    info: dict = {}
    q1, v1 = step_module.contact_step(env.scene, q, v, tau, env.sim_dt, info)
    assert torch.isfinite(q1).all() and torch.isfinite(v1).all()
    (A, c, mu, kw, (lam, _, rel, solved)), = seen
    assert bool(solved.all()) and info["fallbacks"] == 0 and rel < 1e-10
    scale = 1.0 + float(torch.maximum(c.abs().amax(), lam.abs().amax()))
    r = quotient_residual(lam, A, c, mu, kw["kappa"], kw["eps"])
    assert float(r.abs().amax()) < 1e-9 * scale


def test_the_ant_counts_the_substeps_where_the_hard_solution_stood_in(monkeypatch):
    import importlib

    step_module = importlib.import_module("diffmech.sim.contact_step")
    real = step_module.smooth_solve
    monkeypatch.setattr(step_module, "smooth_solve", lambda *a, **kw: real(*a, **{**kw, "max_iter": 0}))
    env = Ant(2, contact_solver="smooth", reset_noise=0.0, seed=0)
    env.reset()
    env.q = env.q.clone()
    env.q[:, 2] = 0.46  # the feet on the ground: contact in every substep
    ant_module = importlib.import_module("diffmech.rl.ant")
    seen = []

    def recording(*a, **kw):
        out = step_module.contact_step(*a, **kw)
        seen.append(a[5]["fallbacks"])
        return out

    monkeypatch.setattr(ant_module, "contact_step", recording)
    with pytest.warns(RuntimeWarning, match="hard problem"):
        env.step(torch.zeros(2, 8, dtype=F64))
    assert len(seen) == env.frame_skip and sum(seen) > 0 and env.contact_fallbacks == sum(seen)
