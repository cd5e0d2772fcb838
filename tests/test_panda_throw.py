"""``scenes.panda_throw``: the Panda holds the ball through contact, lets it go when the fingers
open, and the gradient of where the ball lands matches central differences;
``examples/panda_throw.py`` runs end to end on a tiny budget."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import load_example
from diffmech.sim import rollout, scenes

pytest.importorskip("pybullet_data")

G = 9.81


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    # What users get by default: the solver's sweeps in C (tests/test_pgs.py checks them).
    from diffmech.contact import pgs_native

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


@pytest.fixture(scope="module")
def throw():
    return scenes.panda_throw()


def _example():
    return load_example("panda_throw")


def _hand_frame_ball(scene, qs):
    """The ball's centre in the hand's frame, ``(..., 3)``."""
    robot = scene.models["panda"]
    T = robot.forward_kinematics(qs[..., :9])[..., robot.link_names.index("panda_hand"), :, :]
    return ((qs[..., 9:12] - T[..., :3, 3])[..., None, :] @ T[..., :3, :3])[..., 0, :]


def test_scene_holds_the_ball_still_then_drops_it_when_the_fingers_open(throw):
    scene, q0, v0 = throw
    assert scene.names == ["panda", "ball"] and (scene.nq, scene.nv) == (16, 15)
    assert scene.models["panda"].nv == 9  # 7 arm joints and two independent fingers
    # the ball sits between the pads: its centre on the hand's axis, each pad's face touching it
    torch.testing.assert_close(_hand_frame_ball(scene, q0), torch.tensor([0.0, 0.0, 0.1024], dtype=torch.float64),
                               atol=1e-9, rtol=0)
    torch.testing.assert_close(q0[7:9], torch.full((2,), 0.01, dtype=torch.float64))
    T, release = 70, 50  # held for 0.5 s under zero commanded torque, then the fingers open
    tau = scenes.panda_throw_torques(torch.zeros(T, 7, dtype=torch.float64), release)
    stats = {}
    with torch.no_grad():
        qs, vs = rollout(scene, q0, v0, tau, 0.01, stats=stats)
    held = qs[: release + 1]
    # arm and ball still: the drives' gravity-compensated targets make the start an equilibrium
    assert float((held[:, :7] - q0[:7]).abs().max()) < 1e-4
    assert float((held[:, 9:12] - q0[9:12]).norm(dim=-1).max()) < 1e-4
    assert float((_hand_frame_ball(scene, held) - _hand_frame_ball(scene, q0)).norm(dim=-1).max()) < 1e-4
    assert float((held[:, 7:9] - 0.01).abs().max()) < 1e-4  # the pads squeeze, nothing slips
    assert stats["contact_penetration_max"] < 1e-4
    # the fingers open to their 4 cm limits and the ball falls freely from the next steps on:
    # semi-implicit Euler, v_{k+1} = v_k - g dt e_z and z_{k+1} = z_k + dt v_{k+1}, no sideways push
    assert float(qs[-1, 7:9].min()) > 0.04 - 1e-6
    j = release + 2
    torch.testing.assert_close(vs[j + 1:, 11] - vs[j:-1, 11], torch.full((T - j,), -G * 0.01, dtype=torch.float64),
                               atol=1e-9, rtol=0)
    torch.testing.assert_close(qs[j + 1:, 11] - qs[j:-1, 11], 0.01 * vs[j + 1:, 11], atol=1e-9, rtol=0)
    assert float(vs[release:, 9:11].abs().max()) < 1e-6
    assert float(qs[-1, 11]) < float(q0[11]) - 0.15


def test_landing_point_continues_the_flight_to_the_ground():
    """On an exact parabola the landing point is where it meets ``z = radius``, whichever step
    the continuation starts from; steps before the release are ignored."""
    mod = _example()
    dt, r, n = 0.01, 0.01, 80
    t = torch.arange(n + 1, dtype=torch.float64) * dt
    p0, v = torch.tensor([0.3, -0.1, 0.6], dtype=torch.float64), torch.tensor([2.0, 1.0, 1.5], dtype=torch.float64)
    qs = torch.zeros(n + 1, 16, dtype=torch.float64)
    vs = torch.zeros(n + 1, 15, dtype=torch.float64)
    qs[:, 9:12] = p0 + t[:, None] * v
    qs[:, 11] -= 0.5 * G * t**2
    qs[:, 15] = 1.0
    vs[:, 9:12] = v
    vs[:, 11] -= G * t
    t_land = (v[2] + torch.sqrt(v[2] ** 2 + 2 * G * (p0[2] - r))) / G
    expected = p0[:2] + v[:2] * t_land
    for height in (0.1, 0.3):
        torch.testing.assert_close(mod.landing_point(qs, vs, 5, height, r), expected, atol=1e-12, rtol=0)
    qs[:5, 11] = 0.0  # below the landing height before the release: not a landing
    torch.testing.assert_close(mod.landing_point(qs, vs, 5, 0.1, r), expected, atol=1e-12, rtol=0)


def test_landing_gradient_matches_central_differences(throw):
    """d(squared landing error)/d(arm torques) through the grasp, the release and the flight, by
    the checkpointed backward, against central differences of the same rollouts (float64)."""
    mod = _example()
    scene, q0, v0 = throw
    T, release, dt = 34, 6, 0.01
    target = torch.tensor([0.8, 0.2], dtype=torch.float64)

    def loss(u):
        qs, vs = rollout(scene, q0, v0, scenes.panda_throw_torques(u, release), dt)
        return (mod.landing_point(qs, vs, release, 0.1, 0.01) - target).square().sum(-1)

    u = torch.zeros(T, 7, dtype=torch.float64)
    u[:release, 0], u[:release, 1], u[:release, 3] = 5.0, 15.0, -10.0  # a weak throw
    u.requires_grad_()
    loss(u).backward()
    entries = [(1, 0), (3, 1), (5, 3), (4, 5)]
    eps = 1e-5
    perturbed = []
    for k, j in entries:
        for sign in (1.0, -1.0):
            du = u.detach().clone()
            du[k, j] += sign * eps
            perturbed.append(du)
    with torch.no_grad():
        lb = loss(torch.stack(perturbed))  # the perturbed rollouts as one batch
    fd = (lb[0::2] - lb[1::2]) / (2 * eps)
    got = torch.stack([u.grad[k, j] for k, j in entries])
    assert float(fd.abs().min()) > 1e-5  # each entry moves the landing point
    torch.testing.assert_close(got, fd, rtol=1e-5, atol=1e-10)
    assert float(u.grad[release:].abs().max()) < 1e-12  # torques after the release do not reach the ball


@pytest.mark.slow
def test_example_runs_on_a_tiny_budget(tmp_path):
    pytest.importorskip("cmaes")
    pytest.importorskip("matplotlib")
    mod = _example()
    out = tmp_path / "throw"
    res = mod.main(["--steps", "40", "--release", "10", "--target", "0.7", "0.1", "--iterations", "4",
                    "--popsize", "4", "--out", str(out), "--no-progress"])
    saved = json.loads((out / "results.json").read_text())
    assert (out / "panda_throw.png").stat().st_size > 0
    # the default bounds the torques by the URDF's effort limits
    assert saved["torque_limits"] == "urdf"
    assert all(t <= e for t, e in zip(saved["gradient_max_abs_torque_per_joint"], saved["urdf_effort_limits"]))
    assert saved["gradient_error_m"] == pytest.approx(res["gradient_error_m"])
    grad, cma = saved["gradient"], saved["cmaes"]
    assert len(grad) == 4 and [e["steps"] for e in grad] == [80, 160, 240, 320]
    assert saved["budget_steps"] == 320 and cma and cma[-1]["steps"] <= 320
    assert len(cma) == 2 and cma[-1]["steps"] == 2 * 4 * 40  # two generations of four 40-step rollouts
    # gradient descent lowers the landing error well below where the ball drops untouched
    assert grad[-1]["error_m"] < 0.3 * saved["error_initial_m"]
    assert [e["loss"] for e in cma] == sorted((e["loss"] for e in cma), reverse=True)
    assert cma[-1]["error_m"] <= saved["error_initial_m"] + 1e-9
    assert 10 < saved["gradient_landing_step"] < 40 and saved["gradient_ball_speed_after_release_mps"] > 0
    assert saved["urdf_effort_limits"] == [87.0] * 4 + [12.0] * 3
    assert len(saved["gradient_max_abs_torque_per_joint"]) == 7


def test_sim_run_cli_drops_the_ball_halfway(tmp_path):
    from diffmech.cli import main

    out = tmp_path / "panda"
    assert main(["sim", "run", "panda-throw", "--seconds", "0.2", "--dt", "0.01", "--out", str(out), "--no-gif"]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 20 and res["names"] == ["panda", "ball"]
    rows = [[float(x) for x in r.split(",")] for r in (out / "trajectory.csv").read_text().splitlines()[1:]]
    z = [r[1 + 11] for r in rows]  # the ball's height: held for 10 steps, then falling
    assert max(abs(a - z[0]) for a in z[:11]) < 1e-4 and z[-1] < z[0] - 0.02
