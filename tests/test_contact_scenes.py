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


def _golf_landing(scene, q, v):
    """Where the ball comes down from its state ``q (nq,), v (nv,)`` in free flight (m along x)."""
    from diffmech.spatial import quat_to_matrix

    b, vb = scene.slices["ball"].start, scene.vslices["ball"].start
    vw = quat_to_matrix(q[b + 3:b + 7]) @ v[vb:vb + 3]  # the base velocity is in the ball's frame
    t = (vw[2] + torch.sqrt(vw[2] ** 2 + 2 * G * (q[b + 2] - 0.025))) / G
    return q[b] + vw[0] * t, vw


def _head_lowest(scene, qs):
    """Lowest corner of the club's head over a trajectory ``qs (T, nq)``, m above the ground."""
    from diffmech.model.collision import collision_shapes
    from diffmech.spatial import rpy_to_matrix

    club = scene.models["club"]
    (head,) = collision_shapes(club)["club"]
    T = club.forward_kinematics(qs[:, scene.slices["club"]])[:, club.link_names.index("club")]
    half = torch.tensor(head.size, dtype=torch.float64) / 2
    signs = torch.tensor([[x, y, z] for x in (-1, 1) for y in (-1, 1) for z in (-1, 1)], dtype=torch.float64)
    local = torch.tensor(head.xyz, dtype=torch.float64) + (signs * half) @ rpy_to_matrix(
        torch.tensor(head.rpy, dtype=torch.float64)).T
    return float((T[:, None, :3, :3] @ local[None, :, :, None])[..., 0][..., 2].add(T[:, None, 2, 3]).amin())


def test_golf_swing_drives_the_ball_forward_and_its_landing_gradient_matches_finite_differences():
    """Without torque the club, in its downswing, strikes the ball, which leaves forward and up,
    while the head never touches the ground; d(landing x)/d(joint torques) by the checkpointed
    backward against central differences (the contact sequence is the same for the perturbed
    swings). Torques: 4 knots per joint, linearly interpolated over the swing."""
    scene, q0, v0 = scenes.golf()
    T, dt = 90, 2e-3
    assert scene.nq == 2 + 7 and float(q0[4]) == 0.025 and float(v0[0]) < 0
    knots = torch.linspace(0, 3, T, dtype=torch.float64)
    i0 = knots.floor().long().clamp(max=2)
    w = (knots - i0)[:, None]

    def run(u):  # u (4, 2) N m at the knots -> (landing x, qs, vs)
        tau = torch.cat([(1 - w) * u[i0] + w * u[i0 + 1], torch.zeros(T, scene.nv - 2, dtype=torch.float64)], 1)
        qs, vs = rollout(scene, q0, v0, tau, dt)
        return _golf_landing(scene, qs[-1], vs[-1])[0], qs, vs

    u = torch.zeros(4, 2, dtype=torch.float64, requires_grad=True)
    x, qs, vs = run(u)
    x.backward()
    qs, vs = qs.detach(), vs.detach()
    b = scene.slices["ball"].start
    _, vw = _golf_landing(scene, qs[-1], vs[-1])
    assert float(qs[-1, b]) > float(q0[b]) + 0.03 and float(qs[-1, b + 2]) > 0.03  # struck: forward, up
    assert float(vw[0]) > 2.0 and float(vw[2]) > 0.5
    assert 0.8 < float(x.detach()) < 1.6  # the ball comes down about 1.2 m away
    assert 0.0 < _head_lowest(scene, qs) < 3e-3  # the head sweeps 2 mm above the ground
    d = torch.randn(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        eps = 1e-3  # N m
        fd = (run(u + eps * d)[0] - run(u - eps * d)[0]) / (2 * eps)
    g = float((u.grad * d).sum())
    assert abs(float(fd)) > 1e-3
    assert abs(g - float(fd)) < 1e-4 * max(1.0, abs(float(fd))), (g, float(fd))


def _stand(seconds, dt=2e-3):
    scene, q0, v0 = scenes.laikago(1)
    T = round(seconds / dt)
    info = {}
    qs, vs = rollout(scene, q0, v0, torch.zeros(T, scene.nv, dtype=torch.float64), dt, stats=info)
    return scene, qs, vs, info


def test_laikago_settles_on_its_toes():
    scene, qs, vs, _ = _stand(0.4)
    assert scene.nq == 19 and scene.nv == 18
    # settles within a few mm of the standing height (measured: 2.3e-3 m lower after 0.4 s, still
    # swaying by 0.5 mm), toes on (not in) the ground
    assert abs(float(qs[-1, 2]) - 0.518) < 3e-3
    toes = [n for n in scene.models["laikago0"].link_names if n.startswith("toe")]
    T = scene.models["laikago0"].forward_kinematics(qs[-1])
    z = torch.stack([T[scene.models["laikago0"].link_names.index(n), 2, 3] for n in toes])
    # the toe spheres (radius 0.03) rest on the ground: measured 1.4e-10 m above it (the position
    # correction closing the last gap while the body still sways)
    assert float(z.min()) > 0.03 - 1e-9 and float(z.max()) < 0.03 + 1e-9


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
