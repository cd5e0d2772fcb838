"""Lane programs (per-state RNEA/ABA/CRBA in local frames), run eagerly against the batch-last
algorithms (themselves checked against Pinocchio in test_oracle_pinocchio.py). The native kernels
built from them are tested in test_native.py."""


import pytest
import torch

from conftest import ROBOTS, get_robot, random_state
from diffmech.dynamics import lanes
from diffmech.dynamics.aba import aba_flat
from diffmech.dynamics.crba import crba_flat
from diffmech.dynamics.rnea import rnea_flat


def rel_err(got, want):
    return ((got - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()


@pytest.mark.parametrize("key", list(ROBOTS))
def test_lane_programs_match_batch_last_algorithms(key):
    robot = get_robot(key)
    q, v, a, _ = random_state(robot, (5,), seed=3)
    mt, tree = robot.model_tensors(torch.float64), robot.tree
    with torch.no_grad():
        for passive in (False, True):
            tau = lanes.rnea_lanes(tree, mt, q.t(), v.t(), a.t(), passive).t()
            assert rel_err(tau, rnea_flat(tree, mt, q, v, a, None, passive)) < 1e-12
            qdd = lanes.aba_lanes(tree, mt, q.t(), v.t(), a.t(), passive).t()
            # ABA accumulates rounding like M^-1: compare at the conditioning of the robot's M
            assert rel_err(qdd, aba_flat(tree, mt, q, v, a, None, passive)) < 1e-10
        M = lanes.crba_lanes(tree, mt, q.t()).permute(2, 0, 1)
        assert rel_err(M, crba_flat(tree, mt, q)) < 1e-12


def test_lane_program_bias_forces_without_acceleration():
    robot = get_robot("humanoid")
    q, v, _, _ = random_state(robot, (4,), seed=1)
    mt = robot.model_tensors(torch.float64)
    with torch.no_grad():
        h = lanes.rnea_lanes(robot.tree, mt, q.t(), v.t(), None, True).t()
    torch.testing.assert_close(h, robot.bias_forces(q, v), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("key", ["iiwa", "branching_tree", "laikago"])
def test_lane_programs_with_external_forces(key):
    robot = get_robot(key)
    q, v, a, f = random_state(robot, (4,), seed=6)
    mt, tree = robot.model_tensors(torch.float64), robot.tree
    fT = f.reshape(4, -1).t()
    with torch.no_grad():
        tau = lanes.rnea_lanes(tree, mt, q.t(), v.t(), a.t(), True, fT).t()
        assert rel_err(tau, rnea_flat(tree, mt, q, v, a, f, True)) < 1e-12
        qdd = lanes.aba_lanes(tree, mt, q.t(), v.t(), a.t(), True, fT).t()
        assert rel_err(qdd, aba_flat(tree, mt, q, v, a, f, True)) < 1e-10
