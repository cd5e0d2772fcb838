"""diffmech.rl.transplant: the MuJoCo twin of the Ant has the diffmech Ant's geometry and masses, falls the
same way until the feet touch, and runs a diffmech-trained policy."""

import json
import math

import numpy as np
import pytest
import torch

mujoco = pytest.importorskip("mujoco")

from diffmech.model.ant import LEGS, AntGeometry, ant_link_inertials, ant_robot  # noqa: E402
from diffmech.rl import Ant  # noqa: E402
from diffmech.rl.transplant import MujocoAnt, mujoco_ant, transplant, zero_action_agreement  # noqa: E402


def _body(model, name):
    return mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_BODY, name)


def test_geometry_and_masses_match_mujoco():
    geo = AntGeometry()
    model = mujoco_ant(geo)  # MuJoCo computes the masses and inertias from the geoms and the density
    robot = ant_robot(geo)
    inert = ant_link_inertials(geo)
    total = 0.0
    for link in robot.link_names:
        b = _body(model, link)
        m, com, inertia = (x.detach().numpy() for x in robot.link_params(link).inertial())
        assert float(m) == pytest.approx(model.body_mass[b], rel=1e-12), link
        np.testing.assert_allclose(com, model.body_ipos[b], atol=1e-12)
        # MuJoCo keeps principal moments (body_iquat turns them): compare the eigenvalues
        np.testing.assert_allclose(np.sort(np.linalg.eigvalsh(inertia)), np.sort(model.body_inertia[b]), rtol=1e-10)
        np.testing.assert_allclose(inertia, inert[link][2], rtol=1e-12, atol=1e-15)
        total += float(m)
    assert total == pytest.approx(float(mujoco.mj_getTotalmass(model)), rel=1e-12)
    # torso inertia: about 0.0111 (x, y) and 0.0136 (z) kg m^2 for 0.484 kg
    b = _body(model, "torso")
    assert model.body_mass[b] == pytest.approx(0.48388, abs=1e-5)
    # leg lengths: hip offset, thigh and shin (body offsets and capsule lengths), radii
    for name, sx, sy in LEGS:
        thigh, shin = _body(model, f"{name}_thigh"), _body(model, f"{name}_shin")
        assert np.linalg.norm(model.body_pos[thigh]) == pytest.approx(geo.hip_offset, rel=1e-12)
        assert np.linalg.norm(model.body_pos[shin]) == pytest.approx(geo.thigh_length, rel=1e-12)
        np.testing.assert_allclose(model.body_pos[shin][:2] / np.linalg.norm(model.body_pos[shin]),
                                   np.array([sx, sy]) / math.sqrt(2), atol=1e-12)
        g = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_GEOM, f"{name}_shin_geom")
        assert 2 * model.geom_size[g][1] == pytest.approx(geo.shin_length, rel=1e-12)
        assert model.geom_size[g][0] == pytest.approx(geo.leg_radius)
        for j, rng in (("hip", geo.hip_range), ("ankle", geo.ankle_range)):
            jid = mujoco.mj_name2id(model, mujoco.mjtObj.mjOBJ_JOINT, f"{name}_{j}")
            np.testing.assert_allclose(model.jnt_range[jid], rng, rtol=1e-12)
            k = robot.joint_names.index(f"{name}_{j}")
            assert model.jnt_qposadr[jid] == 7 + k  # the same coordinate order
            assert model.dof_armature[model.jnt_dofadr[jid]] == geo.armature
    assert model.nu == 8 and np.allclose(model.actuator_gear[:, 0], geo.gear)


def test_observations_agree_at_a_moving_state():
    env = Ant(1, seed=5)
    mj = MujocoAnt(env)
    q, v = env.initial_state(1)
    q[0, 3:7] = torch.tensor([0.1, -0.2, 0.3, 0.9], dtype=torch.float64)
    q[0, 3:7] /= q[0, 3:7].norm()
    v[0] = torch.linspace(-1, 1, 14, dtype=torch.float64)
    mj.set_state(q[0].numpy(), v[0].numpy())
    np.testing.assert_allclose(mj.observe(), env.observe(q, v, torch.zeros(1, dtype=torch.long))[0].numpy(),
                               atol=1e-12)


def test_zero_action_falls_alike_then_differs_by_the_soft_contacts():
    r = zero_action_agreement(0.5)
    # free fall: the same semi-implicit Euler steps, equal to round-off until a foot touches (after 0.25 s)
    assert r["max_abs_dq_before_contact"] < 1e-12
    assert r["first_contact_s"] == pytest.approx(0.25, abs=1e-9)  # the same step in both (measured)
    # then MuJoCo's soft contacts let the feet sink and slide, diffmech's hard ones do not: diffmech
    # rests at the expected height to rounding (measured 2e-15 m), MuJoCo's torso 14.5 mm lower
    # (measured, mujoco 3; the largest difference along the way is that final one)
    assert r["final_z_diffmech"] == pytest.approx(r["rest_z_expected"], abs=1e-12)
    assert 0.012 < r["final_z_diffmech"] - r["final_z_mujoco"] < 0.018
    assert r["max_abs_dz"] < 0.018


def test_transplant_a_trained_run(tmp_path):
    from diffmech.rl.train import train

    run = tmp_path / "run"
    train("ant", "sample-enhanced-sac", run, steps=2, seed=0, evaluations=1, eval_episodes=1, progress=False,
          overrides={"learning_starts": 100, "hidden": [8, 8], "extra_samples": 1},
          env_kwargs={"horizon": 3, "frame_skip": 1})
    out = transplant(run, episodes=2, horizon=3)
    assert json.loads((run / "transplant.json").read_text())["policy_return"] == out["policy_return"]
    assert len(out["policy_returns"]) == 2 and len(out["random_returns"]) == 2
    assert all(n == 3 for n in out["policy_steps"])  # no fall in 3 steps of 0.01 s
    # both alive all along: the return is 3 alive bonuses plus forward progress minus the control cost
    assert all(abs(x - 3) < 3 for x in out["policy_returns"])
    assert math.isfinite(out["diffmech_return"]) and math.isfinite(out["diffmech_random_return"])
