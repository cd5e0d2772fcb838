"""Eager small batches: the centre-of-mass Jacobian formulation (``dynamics/_jacobian.py``).

Batches of up to ``JACOBIAN_MAX_BATCH`` states take it in eager mode (mass matrix, inverse and
forward dynamics). Oracles: Pinocchio on every test robot (fixed and floating base, prismatic
joints, branches, external forces); the elementwise formulation one state past the threshold;
central differences through it (gradcheck, parameters included); ``torch.func.vmap``, whose
per-sample batch of one takes it too, against the batched call.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import ROBOTS, get_robot, random_state, robot_path
from diffmech.dynamics import kernels
from diffmech.dynamics._jacobian import JACOBIAN_MAX_BATCH, one_thread

pin = pytest.importorskip("pinocchio")
from oracle import PinOracle, rel_err  # noqa: E402

TOL = 1e-9


@pytest.fixture(scope="module", params=list(ROBOTS))
def case(request):
    robot = get_robot(request.param)
    return robot, PinOracle(robot, robot_path(request.param))


@pytest.fixture(autouse=True)
def _eager():
    with kernels.native_mode("never"):
        yield


@pytest.mark.parametrize("batch", [1, JACOBIAN_MAX_BATCH])
def test_against_pinocchio(case, batch):
    robot, oracle = case
    q, v, a, f = random_state(robot, (batch,), seed=batch)
    qn, vn, an, fn = (t.numpy() for t in (q, v, a, f))
    M = robot.mass_matrix(q)
    tau = robot.inverse_dynamics(q, v, a, f_ext=f, passive=False)
    qdd = robot.forward_dynamics(q, v, a, f_ext=f, passive=False)
    h = robot.inverse_dynamics(q, v, torch.zeros_like(a), passive=False)
    assert rel_err(M.numpy(), np.stack([oracle.crba(x) for x in qn])) < TOL
    assert rel_err(tau.numpy(), np.stack([oracle.rnea(*s) for s in zip(qn, vn, an, fn)])) < TOL
    assert rel_err(qdd.numpy(), np.stack([oracle.aba(*s) for s in zip(qn, vn, an, fn)])) < TOL
    assert rel_err(h.numpy(), np.stack([oracle.rnea(x, y, np.zeros_like(y)) for x, y in zip(qn, vn)])) < TOL


@pytest.mark.parametrize("key", ["iiwa", "prismatic_mix", "humanoid"])
def test_same_as_elementwise_past_the_threshold(key):
    """Batch B takes the Jacobian formulation, B + 1 states the elementwise one: the first B agree."""
    robot = copy.deepcopy(get_robot(key))
    for k, name in enumerate(robot.joint_names):
        robot.joint_params(name).damping.data.fill_(0.2 + 0.1 * k)
        robot.joint_params(name).stiffness.data.fill_(1.0 + k)
    B = JACOBIAN_MAX_BATCH
    q, v, a, f = random_state(robot, (B + 1,), seed=3)
    calls = {
        "M": lambda s: robot.mass_matrix(q[s]),
        "ID": lambda s: robot.inverse_dynamics(q[s], v[s], a[s], f_ext=f[s]),
        "FD": lambda s: robot.forward_dynamics(q[s], v[s], a[s], f_ext=f[s]),
    }
    for name, call in calls.items():
        small, large = call(slice(0, B)), call(slice(0, B + 1))[:B]
        torch.testing.assert_close(small, large, rtol=1e-12, atol=1e-12, msg=name)


@pytest.mark.parametrize("key", ["prismatic_mix", "floating_pair"])
def test_gradcheck(key):
    robot = copy.deepcopy(get_robot(key))
    link = robot.link_names[-1]
    robot.make_link_param_learnable(link, "mass")
    q, v, a, f = (t.detach().requires_grad_(True) for t in random_state(robot, (2,), seed=5))
    mass = robot.link_params(link).mass

    def inverse(q, v, a, f, mass):
        return robot.inverse_dynamics(q, v, a, f_ext=f)

    def forward(q, v, a, f, mass):
        return robot.forward_dynamics(q, v, a, f_ext=f)

    for fn in (inverse, forward, lambda q, v, a, f, mass: robot.mass_matrix(q)):
        assert torch.autograd.gradcheck(fn, (q, v, a, f, mass), eps=1e-6, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("key", ["iiwa", "humanoid"])
def test_vmap(key):
    robot = get_robot(key)
    q, v, a, f = random_state(robot, (5,), seed=7)

    def one(q, v, tau, f):
        return robot.forward_dynamics(q[None], v[None], tau[None], f_ext=f[None])[0]

    got = torch.func.vmap(one)(q, v, a, f)
    torch.testing.assert_close(got, robot.forward_dynamics(q, v, a, f_ext=f), rtol=1e-11, atol=1e-11)
    J = torch.func.jacrev(lambda v: one(q[0], v, a[0], f[0]))(v[0])
    eps = 1e-6
    fd = torch.stack([(one(q[0], v[0] + eps * e, a[0], f[0]) - one(q[0], v[0] - eps * e, a[0], f[0])) / (2 * eps)
                      for e in torch.eye(robot.nv, dtype=v.dtype)], -1)
    torch.testing.assert_close(J, fd, rtol=1e-6, atol=1e-6)


def test_thread_count_restored():
    """The formulation runs on one thread and gives the caller's thread count back, errors included."""
    robot = get_robot("iiwa")
    q, v, a, _ = random_state(robot, (1,))
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        robot.forward_dynamics(q, v, a)
        robot.inverse_dynamics(q, v, a)
        robot.mass_matrix(q)
        assert torch.get_num_threads() == 2
        with pytest.raises(ValueError), one_thread():
            assert torch.get_num_threads() == 1
            raise ValueError
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)


def test_thread_count_restored_with_concurrent_callers():
    """Python threads calling at once share the one-thread setting; the caller's count comes back."""
    import threading

    robot = get_robot("iiwa")
    q, v, a, _ = random_state(robot, (1,))
    ref = robot.forward_dynamics(q, v, a)
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    errors = []

    def work():
        for _ in range(50):
            if not torch.equal(robot.forward_dynamics(q, v, a), ref):
                errors.append("different result")

    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(old)
