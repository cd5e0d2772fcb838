"""The ready-made contact scenes of ``diffmech.sim.scenes`` against analytic answers."""

from __future__ import annotations

import pytest
import torch

from diffmech.sim import rollout, scenes


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    # What users get by default: the solver's sweeps in C (the suite otherwise runs with native
    # kernels off; tests/test_pgs.py checks the C sweeps against the torch ones).
    from diffmech.contact import pgs_native

    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


G = 9.81


def test_braked_racecar_slides_like_a_block_and_newton_finds_the_friction():
    """A braked car decelerates at mu g: semi-implicit Euler gives ``x(N dt) = v0 N dt - mu g dt^2
    N (N + 1) / 2`` exactly, and Newton on ``x(mu) - target`` with the rollout's gradient finds the
    analytic ``mu`` in two iterations (x is linear in mu while the car slides)."""
    T, dt, target = 120, 1e-3, 0.115
    mu_true = 2 * (T * dt - target) / (G * dt**2 * T * (T + 1))
    mu = torch.tensor(0.002, dtype=torch.float64)
    for _ in range(3):
        m = mu.clone().requires_grad_()
        scene, q0, v0 = scenes.racecar(m)
        assert scene.nq == 7 and float(v0[0]) == 1.0
        qs, vs = rollout(scene, q0, v0, torch.zeros(T, scene.nv, dtype=torch.float64), dt)
        r = qs[-1, 0] - target
        r.backward()
        assert abs(float(m.grad) + G * dt**2 * T * (T + 1) / 2) < 1e-9  # dx/dmu, analytic
        mu = (m - r / m.grad).detach()
    assert abs(float(mu) - mu_true) < 1e-9
    qs = qs.detach()
    assert abs(float(qs[-1, 2]) - 0.1) < 1e-6 and abs(float(qs[-1, 1])) < 1e-9  # on its wheels, straight on


@pytest.mark.slow
def test_free_wheels_roll_where_braked_wheels_slide():
    T, dt = 200, 1e-3
    braked, q0, v0 = scenes.racecar(0.5)
    rolling, q0r, v0r = scenes.racecar(0.5, braked=False)
    assert rolling.nv == braked.nv + 4
    vb = rollout(braked, q0, v0, torch.zeros(T, braked.nv, dtype=torch.float64), dt)[1][-1, 0]
    vr = rollout(rolling, q0r, v0r, torch.zeros(T, rolling.nv, dtype=torch.float64), dt)[1][-1, 0]
    assert abs(float(vb) - (1.0 - 0.5 * G * T * dt)) < 1e-9
    assert float(vr) > float(vb) + 0.3


def test_golf_swing_hits_the_ball_and_its_gradient_matches_finite_differences():
    """Gravity swings the club through the ball; d(ball x at the end)/d(shoulder torque) by the
    checkpointed backward against central differences (the contact sequence is the same for the
    perturbed swings)."""
    scene, q0, v0 = scenes.golf()
    T, dt = 260, 2e-3
    ball = scene.slices["ball"].start

    def final_ball_x(u):
        tau = torch.zeros(T, scene.nv, dtype=torch.float64)
        tau = torch.cat([u.reshape(1, 1).expand(120, 1), tau[:120, 1:]], 1)
        tau = torch.cat([tau, torch.zeros(T - 120, scene.nv, dtype=torch.float64)])
        qs, _ = rollout(scene, q0, v0, tau, dt)
        return qs[-1, ball]

    u = torch.tensor(-0.4, dtype=torch.float64, requires_grad=True)
    x = final_ball_x(u)
    x.backward()
    assert x.detach().item() > 0.3  # the ball was hit forward
    with torch.no_grad():
        fd = (final_ball_x(u + 1e-5) - final_ball_x(u - 1e-5)) / 2e-5
    assert abs(float(u.grad) - float(fd)) < 1e-4 * max(1.0, abs(float(fd)))


def _stand(seconds, dt=2e-3):
    scene, q0, v0 = scenes.laikago(1)
    T = round(seconds / dt)
    info = {}
    qs, vs = rollout(scene, q0, v0, torch.zeros(T, scene.nv, dtype=torch.float64), dt, stats=info)
    return scene, qs, vs, info


def test_laikago_settles_on_its_toes():
    scene, qs, vs, _ = _stand(0.4)
    assert scene.nq == 19 and scene.nv == 18
    # settles within a few mm of the standing height, toes on (not in) the ground
    assert abs(float(qs[-1, 2]) - 0.518) < 5e-3
    toes = [n for n in scene.models["laikago0"].link_names if n.startswith("toe")]
    T = scene.models["laikago0"].forward_kinematics(qs[-1])
    z = torch.stack([T[scene.models["laikago0"].link_names.index(n), 2, 3] for n in toes])
    assert float(z.min()) > 0.03 - 1e-3 and float(z.max()) < 0.03 + 2e-3


@pytest.mark.slow
def test_laikago_stands_five_seconds_without_sinking_or_drifting():
    scene, qs, vs, info = _stand(5.0)
    settled = round(1.0 / 2e-3)
    drift = (qs[-1, :3] - qs[settled, :3]).abs()
    assert float(drift.max()) < 1e-3  # m over the last 4 s
    assert float(vs[-1].abs().max()) < 1e-3
    assert float(qs[-1, 2]) > 0.51


def test_sim_run_cli_writes_trajectory_results_and_gif(tmp_path):
    import json

    from diffmech.cli import main
    from diffmech.sim.render import shape_lines

    out = tmp_path / "car"
    assert main(["sim", "run", "racecar", "--seconds", "0.05", "--friction", "0.5", "--out", str(out)]) == 0
    res = json.loads((out / "results.json").read_text())
    assert res["steps"] == 50 and res["frames"] >= 2
    rows = (out / "trajectory.csv").read_text().splitlines()
    assert len(rows) == 52 and rows[0].startswith("t,q0,")
    x_end, vx_end = float(rows[-1].split(",")[1]), float(rows[-1].split(",")[8])
    assert vx_end == pytest.approx(1.0 - 0.5 * G * 0.05, abs=1e-9)  # the braked car decelerates at mu g
    assert x_end > 0.04
    assert (out / "animation.gif").read_bytes()[:6] == b"GIF89a"
    # a box's drawing: 12 edges whose ends are its corners at the pose given
    from diffmech.model.collision import Shape

    R = torch.eye(3, dtype=torch.float64)
    lines = shape_lines(Shape("box", (0.2, 0.4, 0.6)), R, torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64))
    assert len(lines) == 12
    corners = torch.cat(lines)
    torch.testing.assert_close(corners.amin(0), torch.tensor([0.9, 1.8, 2.7], dtype=torch.float64))
    torch.testing.assert_close(corners.amax(0), torch.tensor([1.1, 2.2, 3.3], dtype=torch.float64))
    assert main(["sim", "run", "golf", "--dt", "-1", "--out", str(tmp_path / "g")]) == 2
