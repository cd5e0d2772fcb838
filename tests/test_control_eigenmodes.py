"""Eigenmode learning: the loss terms, the effort schedule, checkpoint/resume, and a short
end-to-end run of the command line on the tiny configuration."""

from __future__ import annotations

import json
import math
import os

import pytest
import torch

from diffmech.cli import main
from diffmech.control.configs import CONFIGS, get_config
from diffmech.control.eigenmodes import EigenmodeTrainer, effort_weight, eigenmode_loss, half_index
from diffmech.control.flow import code_grid, hamiltonian_flow


def test_effort_schedule():
    # 4 cycles over 100 epochs: ramp 0 -> 1 over 12.5 epochs, then hold 1
    assert effort_weight(0, 100) == 0.0
    assert abs(effort_weight(5, 100) - 0.4) < 1e-12
    assert effort_weight(20, 100) == 1.0
    assert effort_weight(25, 100) == 0.0


def test_code_grid_is_symmetric_with_half_point():
    g = code_grid(100, dtype=torch.float64)
    assert g.numel() == 101 and half_index(g) == 50
    torch.testing.assert_close(g + g.flip(0), torch.ones_like(g))


def test_loss_terms_by_hand():
    cfg = get_config("tiny", dtype="float64", grid_points=20, samples=100)
    tr = EigenmodeTrainer(cfg)
    flow = hamiltonian_flow(tr.system, tr.x0, tr.period, tr.grid)
    L = eigenmode_loss(tr.system, flow, tr.period, tr.target, cfg, beta=0.5, generator=torch.Generator().manual_seed(0))
    X = flow.X.detach()
    n, N, ih = 2, X.shape[0] - 1, half_index(flow.grid)
    q, p = X[:, :n], X[:, n:]
    # with samples >= ih - 1 every first-half index j <= ih - 2 enters the max-norms
    idx = torch.arange(ih - 1)
    c_q = (q[idx] - q[N - idx]).abs().sum(-1).max()
    c_p = (p[idx] + p[N - idx]).abs().sum(-1).max()
    c_h = p[ih].square().sum()
    torch.testing.assert_close(L.c_q.detach(), c_q)
    torch.testing.assert_close(L.c_p.detach(), c_p)
    torch.testing.assert_close(L.c_half.detach(), c_h)
    ee = tr.system.end_effector(q[ih])
    torch.testing.assert_close(L.task.detach(), 10 * (ee - tr.target).square().sum())
    expected = L.task + cfg.effort * 0.5 * L.effort + 0.05 * c_q + 0.0005 * c_p + 0.95 * c_h
    torch.testing.assert_close(L.total.detach(), expected.detach())


def test_target_from_angles_is_forward_kinematics():
    tr = EigenmodeTrainer(get_config("tiny", dtype="float64"))
    q = (0.75, 0.75)
    # diffmech's planar convention: tip at (-(sin q1 + sin(q1 + q2)), 0, -(cos q1 + cos(q1 + q2)))
    expect = torch.tensor([-(math.sin(q[0]) + math.sin(q[0] + q[1])), 0.0,
                           -(math.cos(q[0]) + math.cos(q[0] + q[1]))], dtype=torch.float64)
    torch.testing.assert_close(tr.target, expect)


def test_learned_period_stays_positive_and_moves():
    cfg = get_config("tiny", learn_period=True, period_init=1.0, epochs=3)
    tr = EigenmodeTrainer(cfg)
    tr.train(progress=False)
    assert float(tr.period.detach()) > 0 and float(tr.period.detach()) != 1.0


def test_cli_learn_resume_report(tmp_path):
    out = str(tmp_path / "run")
    assert main(["eigenmode", "learn", "--config", "tiny", "--epochs", "3", "--q0", "-0.5", "-0.5",
                 "--target-angles", "0.75", "0.75", "--period", "1.5", "--effort", "1e-4", "--out", out,
                 "--no-plots", "--no-progress"]) == 0
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    for key in ("ee_error_half_period", "periodicity_error", "p_half_norm", "effort", "period", "wall_s"):
        assert isinstance(m[key], float) and math.isfinite(m[key])
    assert m["steps"] == 3
    assert main(["eigenmode", "learn", "--config", "tiny", "--epochs", "5", "--out", out, "--resume",
                 "--no-plots", "--no-progress"]) == 0
    with open(os.path.join(out, "metrics.json")) as f:
        assert json.load(f)["steps"] == 5
    assert main(["eigenmode", "report", out]) == 0
    assert os.path.exists(os.path.join(out, "report.md"))
    assert main(["eigenmode", "report", str(tmp_path / "missing")]) == 1


@pytest.mark.slow
def test_cli_stabilize_and_figures(tmp_path):
    out = str(tmp_path / "run")
    assert main(["eigenmode", "learn", "--config", "tiny", "--epochs", "2", "--out", out, "--no-progress"]) == 0
    # Two epochs leave the mode far from periodic: no limit cycle next to it, so the multipliers
    # linearise along the stored orbit, with a warning that says so.
    with pytest.warns(UserWarning, match="stored orbit"):
        assert main(["eigenmode", "stabilize", out, "--gains", "1", "10", "--periods", "0.5", "--grid", "2",
                     "--monodromy-steps", "41"]) == 0
    with open(os.path.join(out, "metrics.json")) as f:
        m = json.load(f)
    assert len(m["multipliers"]) == 3 and m["max_multiplier"] == max(m["multipliers"])
    # the values, not only the files: metrics.json's multipliers are stabilize.json's, and the monodromy
    # matrices by autodiff and by central differences (two independent routes) agree
    with open(os.path.join(out, "stabilize.json")) as f:
        st = json.load(f)
    assert m["multipliers"] == st["multipliers"] and m["max_multiplier"] == st["max_multiplier"]
    fl = st["floquet"]
    print(f"monodromy |AD - FD| {fl['monodromy_max_abs_difference']:.2e} of {fl['monodromy_max_abs']:.2e}; "
          f"moduli AD {m['multipliers']} FD {m['multipliers_fd']}")
    assert fl["steps_per_period"] == 41 and fl["monodromy_max_abs"] > 0.1
    # measured 2026-12-07: |AD - FD| 3.7e-7 of 7.2 (5e-8 relative); moduli 5.28, 0.0506, 3.7e-7 agree to
    # 5e-8 relative and 3e-9 absolute
    assert fl["monodromy_max_abs_difference"] < 1e-6 * fl["monodromy_max_abs"]
    assert sorted(m["multipliers_fd"]) == pytest.approx(sorted(m["multipliers"]), rel=1e-6, abs=1e-7)
    for name in ("mode.png", "potential.png", "control.png", "training.png", "mode.gif", "stabilize.png",
                 "multipliers.png", "efficiency.png", "stabilize.gif"):
        assert os.path.getsize(os.path.join(out, name)) > 1000, name


@pytest.mark.slow
def test_stabilize_defaults_scale_with_a_smoke_test_run(tmp_path, caplog):
    """On a `tiny` run, stabilize without options takes the smoke-test settings (1 period, a 2 x 2 grid,
    101 monodromy steps; the full ones are 3, 4 x 4 and 601), records them, and logs each stage."""
    import logging

    out = str(tmp_path / "run")
    # no learn plots: this test reads stabilize.json only (the figures are test_cli_stabilize_and_figures')
    assert main(["eigenmode", "learn", "--config", "tiny", "--epochs", "2", "--out", out, "--no-progress",
                 "--no-plots"]) == 0
    caplog.set_level(logging.INFO, logger="diffmech")
    with pytest.warns(UserWarning, match="stored orbit"):
        assert main(["eigenmode", "stabilize", out, "--no-plots"]) == 0
    with open(os.path.join(out, "stabilize.json")) as f:
        st = json.load(f)
    assert st["settings"] == {"periods": 1.0, "grid": 2, "monodromy_steps": 101, "grid_periods": 2,
                              "smoke_test": True}
    assert st["floquet"]["steps_per_period"] == 101 and len(st["grid"]["starts"]) == 4
    stages = [r.getMessage() for r in caplog.records if r.name == "diffmech.eigenmode"]
    assert stages[0].endswith("(smoke-test settings)") and any("monodromy" in m for m in stages[1:]), stages


def test_all_configs_build():
    for name in CONFIGS:
        if name.startswith("iiwa"):
            pytest.importorskip("diff_robot_data")
        cfg = get_config(name)
        tr = EigenmodeTrainer(cfg.replace(hidden=4, native=False))  # no kernel builds here
        assert tr.target.shape == (3,)


@pytest.mark.slow
def test_polish_solves_the_mode_conditions():
    """The Gauss-Newton polish drives FK(q(T/2)) - x_d and p(T/2) to its tolerance on its own
    (RK4) trajectory, and the high-accuracy re-integration (SciPy) confirms the mode: periodic and
    time-symmetric to the polish grid's discretisation error. Start: a natural eigenmode of the
    pendulum (zero control force) with the target moved off its turning point by 0.03 rad per joint."""
    from control_helpers import NATURAL_Q0, NATURAL_T, system
    from diffmech.control.verify import integrate_ivp, verify_mode

    x0 = torch.tensor([*NATURAL_Q0, 0.0, 0.0], dtype=torch.float64)
    q_half = integrate_ivp(system(potential=False), x0, NATURAL_T / 2).y[:2, -1]
    cfg = get_config("tiny", dtype="float64", hidden=16, epochs=0, q0=NATURAL_Q0, period=NATURAL_T,
                     target_angles=tuple(float(a) + 0.03 for a in q_half), polish=True, polish_grid_points=120,
                     polish_tol=(1e-6, 1e-6), polish_max_iter=15)
    tr = EigenmodeTrainer(cfg)
    with torch.no_grad():
        tr.system.potential.net[-1].weight.zero_()  # V_theta constant: the closed loop is the pendulum
    start = float((tr.system.end_effector(torch.tensor(q_half)) - tr.target).norm())
    assert start > 0.02
    tr.train(progress=False)
    info = tr.polish_info
    assert tr.polished and info["converged"], info
    assert info["ee_error"] < 1e-6 and info["p_half_norm"] < 1e-6
    assert [r["phase"] for r in tr.history] == ["polish"] * (info["iterations"] + 1)
    m, _ = verify_mode(tr.system, cfg.q0, float(tr.period), tr.target)
    assert m["ee_error_half_period"] < 1e-4, m
    assert m["p_half_norm"] < 1e-3 and m["periodicity_error"] < 1e-3 and m["symmetry_error_q"] < 1e-3, m
