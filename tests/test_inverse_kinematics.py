"""Inverse kinematics: reached poses (diffmech and Pinocchio forward kinematics), joint limits,
unreachable targets, batch shapes and dtypes, errors, and the implicit gradient against finite
differences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import diffmech
from conftest import get_robot, robot_path
from diffmech import spatial as sp
from diffmech.ik import solve_ik

EE = {"panda": "panda_virtual_ee_link", "iiwa": "iiwa_link_ee", "jaco": "j2n6s300_end_effector",
      "trifinger": "finger_tip_link_0"}


def _targets(robot, link, n, seed, dtype=torch.float64):
    q = robot.random_configuration(n, generator=torch.Generator().manual_seed(seed))
    return robot.link_pose(q, link).to(dtype)


def _pose_errors(robot, link, q, T):
    """Position (m) and rotation-angle (rad) errors of ``link`` at ``q`` against ``T``, in float64."""
    Tq = robot.link_pose(q.double(), link)
    T = T.double()
    dp = (Tq[..., :3, 3] - T[..., :3, 3]).norm(dim=-1)
    dr = sp.so3_log(T[..., :3, :3] @ Tq[..., :3, :3].transpose(-1, -2)).norm(dim=-1)
    return dp, dr


def _within_limits(robot, q, slack=0.0):
    lim = robot.joint_limits()
    qj = q.double()[..., robot.nq - len(robot.joint_names):]
    return bool(((qj >= lim["lower"] - slack) & (qj <= lim["upper"] + slack)).all())


@pytest.mark.parametrize("key", ["panda", "iiwa"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_reaches_random_reachable_targets(key, dtype):
    robot = get_robot(key)
    link = EE[key]
    T = _targets(robot, link, 48, seed=1, dtype=dtype)
    res = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(0))
    assert res.q.dtype == dtype and res.q.shape == (48, robot.nq)
    assert bool(res.converged.all()), f"{int((~res.converged).sum())} of 48 not solved"
    dp, dr = _pose_errors(robot, link, res.q, T)
    # the solver's own test runs in `dtype`; recomputed in float64 the errors stay within tolerance
    slack = 1.0 if dtype == torch.float64 else 1.01
    assert float(dp.max()) <= 1e-4 * slack and float(dr.max()) <= 1e-3 * slack
    torch.testing.assert_close(res.position_error, dp.to(dtype), atol=2e-6, rtol=0)
    assert _within_limits(robot, res.q)
    assert int(res.iterations.max()) <= 100


@pytest.mark.parametrize("key", ["panda", "iiwa"])
def test_solution_checked_by_pinocchio_forward_kinematics(key):
    pin = pytest.importorskip("pinocchio")
    from oracle import PinOracle

    robot = get_robot(key)
    link = EE[key]
    oracle = PinOracle(robot, robot_path(key))
    T = _targets(robot, link, 12, seed=5)
    q, converged = diffmech.inverse_kinematics(robot, link, T, generator=torch.Generator().manual_seed(1))
    assert bool(converged.all())
    li = robot.link_names.index(link)
    for b in range(T.shape[0]):
        Tp = oracle.forward_kinematics(q[b].numpy())[li]
        assert np.linalg.norm(Tp[:3, 3] - T[b, :3, 3].numpy()) <= 1e-4
        assert np.linalg.norm(pin.log3(T[b, :3, :3].numpy() @ Tp[:3, :3].T)) <= 1e-3


def test_unreachable_targets_are_flagged_not_raised():
    robot = get_robot("panda")
    link = EE["panda"]
    T = _targets(robot, link, 6, seed=2)
    far = T.clone()
    far[3:, :3, 3] += torch.tensor([3.0, 0.0, 0.0], dtype=T.dtype)  # 3 m beyond any reach
    res = solve_ik(robot, link, far, generator=torch.Generator().manual_seed(0))
    assert res.converged.tolist() == [True, True, True, False, False, False]
    assert bool((res.position_error[3:] > 1.0).all())
    assert bool(torch.isfinite(res.q).all()) and _within_limits(robot, res.q)
    # the best attempt of an unreachable target still comes as close as the arm allows
    reach = robot.link_pose(res.q[3:], link)[:, :3, 3]
    base = robot.link_pose(robot.neutral_configuration(), "panda_link1")[:3, 3]
    towards = (far[3:, :3, 3] - base) / (far[3:, :3, 3] - base).norm(dim=-1, keepdim=True)
    assert bool((((reach - base) * towards).sum(-1) > 0.6).all())


def test_batch_shapes_and_q0_broadcast():
    robot = get_robot("iiwa")
    link = EE["iiwa"]
    T = _targets(robot, link, 6, seed=3).reshape(2, 3, 4, 4)
    res = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(0))
    assert res.q.shape == (2, 3, robot.nq)
    for f in (res.converged, res.position_error, res.orientation_error, res.iterations, res.attempts):
        assert f.shape == (2, 3)
    assert res.converged.dtype == torch.bool and bool(res.converged.all())
    q1, c1 = diffmech.inverse_kinematics(robot, link, T[0, 0], q0=robot.neutral_configuration() + 0.1)
    assert q1.shape == (robot.nq,) and c1.shape == () and bool(c1)
    # q0 at a solution: nothing to do
    q_sol = robot.random_configuration(generator=torch.Generator().manual_seed(9))
    res = solve_ik(robot, link, robot.link_pose(q_sol, link), q0=q_sol)
    assert int(res.iterations) == 0 and int(res.attempts) == 1
    torch.testing.assert_close(res.q, q_sol, atol=0, rtol=0)
    # an empty batch
    q_empty, c_empty = diffmech.inverse_kinematics(robot, link, T[:0, 0])
    assert q_empty.shape == (0, robot.nq) and c_empty.shape == (0,)


def test_generator_makes_restarts_reproducible():
    robot = get_robot("panda")
    link = EE["panda"]
    T = _targets(robot, link, 40, seed=4)
    a = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(3))
    b = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(3))
    assert bool((a.attempts > 1).any()), "no target needed a restart; the test shows nothing"
    torch.testing.assert_close(a.q, b.q, atol=0, rtol=0)
    assert torch.equal(a.iterations, b.iterations)


def test_position_and_orientation_modes_and_weights():
    robot = get_robot("panda")
    link = EE["panda"]
    T = _targets(robot, link, 8, seed=6)
    g = torch.Generator().manual_seed(0)
    rp = solve_ik(robot, link, T, mode="position", generator=g)
    dp, _ = _pose_errors(robot, link, rp.q, T)
    assert bool(rp.converged.all()) and float(dp.max()) <= 1e-4
    assert float(rp.orientation_error.abs().max()) == 0.0
    ro = solve_ik(robot, link, T, mode="orientation", generator=g)
    _, dr = _pose_errors(robot, link, ro.q, T)
    assert bool(ro.converged.all()) and float(dr.max()) <= 1e-3
    # weight 0 on the z axis: z is left free and not tested
    shifted = T.clone()
    shifted[:, 2, 3] += 5.0
    w = torch.tensor([1.0, 1.0, 0.0, 1.0, 1.0, 1.0], dtype=T.dtype)
    rw = solve_ik(robot, link, shifted, weights=w, generator=g)
    assert bool(rw.converged.all())
    Tq = robot.link_pose(rw.q, link)
    assert float((Tq[:, :2, 3] - T[:, :2, 3]).abs().max()) <= 1e-4
    # (w_position, w_orientation) pairs give the same reachable solutions' accuracy
    r2 = solve_ik(robot, link, T, weights=(2.0, 0.5), generator=g)
    assert bool(r2.converged.all())


def test_per_target_weights():
    robot = get_robot("iiwa")
    link = EE["iiwa"]
    T = _targets(robot, link, 2, seed=16)
    far = T.clone()
    far[:, :3, 3] += 4.0  # out of reach: only the orientation can be met
    w = torch.tensor([[0.0, 0.0, 0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0, 1.0, 1.0]], dtype=T.dtype)
    res = solve_ik(robot, link, far, weights=w, generator=torch.Generator().manual_seed(0))
    assert res.converged.tolist() == [True, False]
    assert float(res.position_error[0]) == 0.0 and float(res.orientation_error[0]) <= 1e-3


def test_continuous_joints_are_not_clipped():
    robot = get_robot("jaco")  # joints 1, 4, 5, 6 are continuous
    link = EE["jaco"]
    T = _targets(robot, link, 16, seed=7)
    res = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(0))
    assert bool(res.converged.all()) and _within_limits(robot, res.q)
    dp, dr = _pose_errors(robot, link, res.q, T)
    assert float(dp.max()) <= 1e-4 and float(dr.max()) <= 1e-3


def test_constant_damping_schedule_and_no_limits():
    robot = get_robot("iiwa")
    link = EE["iiwa"]
    T = _targets(robot, link, 16, seed=8)
    res = solve_ik(robot, link, T, damping=1e-3, damping_schedule="constant",
                   generator=torch.Generator().manual_seed(0))
    assert float(res.converged.double().mean()) >= 0.9
    res = solve_ik(robot, link, T, respect_limits=False, generator=torch.Generator().manual_seed(0))
    assert bool(res.converged.all())


def test_floating_base():
    robot = get_robot("humanoid")
    T = _targets(robot, "l_hand", 8, seed=10)
    res = solve_ik(robot, "l_hand", T, generator=torch.Generator().manual_seed(0))
    assert bool(res.converged.all())
    dp, dr = _pose_errors(robot, "l_hand", res.q, T)
    assert float(dp.max()) <= 1e-4 and float(dr.max()) <= 1e-3
    torch.testing.assert_close(res.q[:, 3:7].norm(dim=-1), torch.ones(8, dtype=T.dtype))
    assert _within_limits(robot, res.q)


def test_errors():
    robot = get_robot("iiwa")
    link = EE["iiwa"]
    T = _targets(robot, link, 2, seed=0)
    with pytest.raises(diffmech.ShapeError, match=r"'target' must have shape \(\.\.\., 4, 4\), got \(2, 3, 4\)"):
        diffmech.inverse_kinematics(robot, link, T[:, :3])
    with pytest.raises(diffmech.ShapeError, match="'target' must be a floating-point tensor"):
        diffmech.inverse_kinematics(robot, link, T.long())
    with pytest.raises(diffmech.ShapeError, match=r"'q0' must have shape \(\.\.\., 7\)"):
        diffmech.inverse_kinematics(robot, link, T, q0=torch.zeros(6, dtype=T.dtype))
    with pytest.raises(diffmech.ShapeError, match="'q0' of shape \\(3, 7\\) does not broadcast"):
        diffmech.inverse_kinematics(robot, link, T, q0=torch.zeros(3, 7, dtype=T.dtype))
    with pytest.raises(diffmech.ShapeError, match="'weights'"):
        diffmech.inverse_kinematics(robot, link, T, weights=torch.ones(5))
    with pytest.raises(diffmech.ShapeError, match="'weights'"):
        diffmech.inverse_kinematics(robot, link, T, weights=(1.0, -1.0))
    with pytest.raises(diffmech.ModelError, match="no link named 'nope'"):
        diffmech.inverse_kinematics(robot, "nope", T)
    with pytest.raises(diffmech.OptionError, match="unknown mode"):
        diffmech.inverse_kinematics(robot, link, T, mode="both")
    with pytest.raises(diffmech.OptionError, match="unknown damping_schedule"):
        diffmech.inverse_kinematics(robot, link, T, damping_schedule="fast")
    with pytest.raises(diffmech.OptionError, match="parallel_restarts"):
        diffmech.inverse_kinematics(robot, link, T, parallel_restarts=0)
    with pytest.raises(diffmech.OptionError, match="every weight of mode 'position' is zero"):
        diffmech.inverse_kinematics(robot, link, T, mode="position", weights=(0.0, 1.0))


# ----------------------------------------------------------------------------- gradients
_TIGHT = dict(tol_position=1e-13, tol_orientation=1e-13, restarts=0, max_iterations=200)


def test_gradient_full_pose_six_dof_gradcheck():
    """A 6-DoF arm (Jaco; the finger joints do not move the end effector): the exact derivative of
    the unique nearby solution, checked against finite differences of the solver itself."""
    robot = get_robot("jaco")
    link = EE["jaco"]
    q_ref = robot.random_configuration(generator=torch.Generator().manual_seed(11))
    T0 = robot.link_pose(q_ref, link)

    def solve(xi):  # target = T0 exp(xi): a well-defined pose for every xi
        R, p = sp.se3_exp(xi)
        T = T0 @ sp.homogeneous(R, p)
        q, conv = diffmech.inverse_kinematics(robot, link, T, q0=q_ref, **_TIGHT)
        assert bool(conv.all())
        return q[:6]

    xi = torch.zeros(6, dtype=torch.float64, requires_grad=True)
    # the solver stops within 1e-13 of the target: finite differences with eps = 1e-5 carry ~1e-8 of noise
    assert torch.autograd.gradcheck(solve, (xi,), eps=1e-5, atol=1e-6, rtol=1e-5)
    xi2 = (0.05 * torch.randn(6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))).requires_grad_()
    assert torch.autograd.gradcheck(solve, (xi2,), eps=1e-5, atol=1e-6, rtol=1e-5)


def test_gradient_position_only_three_dof_gradcheck():
    """Position-only IK of one TriFinger fingertip (3 joints): gradient w.r.t. the target matrix."""
    robot = get_robot("trifinger")
    link = EE["trifinger"]
    q_ref = robot.random_configuration(generator=torch.Generator().manual_seed(12))
    T0 = robot.link_pose(q_ref, link)

    def solve(T):
        q, conv = diffmech.inverse_kinematics(robot, link, T, q0=q_ref, mode="position", **_TIGHT)
        assert bool(conv.all())
        return q

    assert torch.autograd.gradcheck(solve, (T0.clone().requires_grad_(),), eps=1e-5, atol=1e-6, rtol=1e-5)


def test_gradient_batched_float32_matches_float64():
    robot = get_robot("jaco")
    link = EE["jaco"]
    T = _targets(robot, link, 4, seed=13)
    T64 = T.clone().requires_grad_()
    q64, _ = diffmech.inverse_kinematics(robot, link, T64, **{**_TIGHT, "restarts": 16, "max_iterations": 300})
    (g64,) = torch.autograd.grad(q64[:, :6].sin().sum(), T64)
    T32 = T.float().requires_grad_()
    q32, c32 = diffmech.inverse_kinematics(robot, link, T32, q0=q64.detach().float(), restarts=0)
    assert bool(c32.all())
    (g32,) = torch.autograd.grad(q32[:, :6].sin().sum(), T32)
    assert g32.dtype == torch.float32
    torch.testing.assert_close(g32.double(), g64, atol=5e-3 * float(g64.abs().max()), rtol=0)


def test_gradient_redundant_arm_is_the_minimum_norm_motion():
    """Panda (7 joints, 6 residuals): dq/dxi moves the link with the target and has no null-space part."""
    robot = get_robot("panda")
    link = EE["panda"]
    q_ref = robot.random_configuration(generator=torch.Generator().manual_seed(14))
    T0 = robot.link_pose(q_ref, link)

    def solve(xi):
        R, p = sp.se3_exp(xi)
        q, conv = diffmech.inverse_kinematics(robot, link, T0 @ sp.homogeneous(R, p), q0=q_ref, **_TIGHT)
        assert bool(conv)
        return q

    xi = torch.zeros(6, dtype=torch.float64)
    dq = torch.autograd.functional.jacobian(solve, xi)  # (7, 6)
    J = robot.jacobian(q_ref, link)  # world-aligned (linear; angular)
    R0 = T0[:3, :3]
    expected = torch.block_diag(R0, R0)  # T0 exp(xi): world-aligned twist of the target per unit xi
    torch.testing.assert_close(J @ dq, expected, atol=1e-8, rtol=0)
    null = torch.linalg.svd(J).Vh[-1]  # (7,) the null direction of J
    assert float((null @ dq).abs().max()) < 1e-8
    # damped variant: still follows the target to first order, up to the damping
    def solve_damped(xi):
        R, p = sp.se3_exp(xi)
        q, _ = diffmech.inverse_kinematics(robot, link, T0 @ sp.homogeneous(R, p), q0=q_ref, grad_damping=1e-6,
                                           **_TIGHT)
        return q

    dq_d = torch.autograd.functional.jacobian(solve_damped, xi)
    torch.testing.assert_close(dq_d, dq, atol=1e-3 * float(dq.abs().max()), rtol=0)


def test_gradient_with_respect_to_robot_parameters():
    """q* also depends on the model: d q*/d(link offset) by the same implicit step vs finite differences."""
    import copy

    robot = copy.deepcopy(get_robot("trifinger"))
    link = EE["trifinger"]
    q_ref = robot.random_configuration(generator=torch.Generator().manual_seed(15))
    T = robot.link_pose(q_ref, link).detach()
    robot.make_link_param_learnable(link, "origin_xyz")
    (name, param), = robot.learnable_parameters().items()

    def solve():
        q, conv = diffmech.inverse_kinematics(robot, link, T, q0=q_ref, mode="position", **_TIGHT)
        assert bool(conv)
        return q

    q = solve()
    (g,) = torch.autograd.grad(q.sum(), param)
    eps = 1e-6
    fd = torch.zeros_like(param)
    with torch.no_grad():
        for i in range(param.numel()):
            param.view(-1)[i] += eps
            qp = solve()
            param.view(-1)[i] -= 2 * eps
            qm = solve()
            param.view(-1)[i] += eps
            fd.view(-1)[i] = (qp.sum() - qm.sum()) / (2 * eps)
    torch.testing.assert_close(g, fd, atol=1e-6, rtol=1e-5)
    assert math.isfinite(float(g.abs().sum())) and float(g.abs().sum()) > 0, name


@pytest.mark.slow
def test_panda_thousand_targets_success_rate():
    robot = get_robot("panda")
    link = EE["panda"]
    T = _targets(robot, link, 1000, seed=21)
    res = solve_ik(robot, link, T, generator=torch.Generator().manual_seed(0))
    assert float(res.converged.double().mean()) >= 0.995
    assert int(res.iterations.max()) <= 100
    assert _within_limits(robot, res.q)
