"""diffmech.perf: the allocator settings apply on glibc and leave results unchanged."""

import platform

import torch

from diffmech.model import systems
from diffmech.perf import tune_allocator


def test_tune_allocator_applies_on_glibc_and_changes_no_result():
    robot = systems.n_link_pendulum(3)
    q = robot.random_configuration(64, generator=torch.Generator().manual_seed(0))
    v = torch.ones(64, 3, dtype=torch.float64)
    before = robot.forward_dynamics(q, v, v)
    applied = tune_allocator()
    if platform.system() == "Linux" and platform.libc_ver()[0] == "glibc":
        assert applied
    assert torch.equal(robot.forward_dynamics(q, v, v), before)
