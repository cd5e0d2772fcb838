"""Lane programs (per-state RNEA/ABA/CRBA in local frames) and the native kernels built from them.

The lane programs run eagerly here against the batch-last algorithms (themselves checked against
Pinocchio in test_oracle_pinocchio.py); the native kernels against the eager methods, including
the batch tail of a tile, the multi-threaded split, float32 and a changed parameter.
"""

import copy

import pytest
import torch

from conftest import ROBOTS, get_robot, random_state
from diffmech.dynamics import compiled, lanes, native
from diffmech.dynamics.aba import aba_flat
from diffmech.dynamics.crba import crba_flat
from diffmech.dynamics.rnea import rnea_flat
from diffmech.model import systems


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


needs_cc = pytest.mark.skipif(not native.available(), reason="no C compiler for native kernels")


@needs_cc
@pytest.mark.parametrize("key", ["iiwa", "prismatic_mix", "branching_tree", "laikago"])
@pytest.mark.parametrize("algorithm", ["forward_dynamics", "inverse_dynamics", "mass_matrix"])
def test_native_kernels_match_eager(key, algorithm):
    robot = get_robot(key)
    f = compiled(robot, algorithm)
    for B in (1, 37):  # 37: two full tiles of 16 and a tail
        q, v, a, _ = random_state(robot, (B,), seed=B)
        args = (q,) if algorithm == "mass_matrix" else (q, v, a)
        with torch.no_grad():
            got = f(*args)
        want = getattr(robot, algorithm)(*args)
        assert got.shape == want.shape and got.dtype == torch.float64
        assert rel_err(got, want) < (1e-10 if algorithm == "forward_dynamics" else 1e-12)
    assert f.kernel(torch.float64) is not None  # the native path ran, not a fallback


@needs_cc
def test_native_kernel_threads_and_float32():
    robot = get_robot("iiwa")
    q, v, tau, _ = random_state(robot, (2 * native.MIN_STATES_PER_THREAD + 3,), seed=5)
    f = compiled(robot, "inverse_dynamics")
    want = robot.inverse_dynamics(q, v, tau)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the batch is split between two threads
        with torch.no_grad():
            got = f(q, v, tau)
            got32 = f(q.float(), v.float(), tau.float())
    finally:
        torch.set_num_threads(threads)
    assert rel_err(got, want) < 1e-12
    assert got32.dtype == torch.float32 and rel_err(got32.double(), want) < 1e-5


@needs_cc
def test_native_kernel_follows_parameter_changes():
    robot = copy.deepcopy(systems.n_link_pendulum(3))
    f = compiled(robot, "forward_dynamics")
    q, v, tau, _ = random_state(robot, (6,), seed=2)
    with torch.no_grad():
        before = f(q, v, tau)
        robot.link_params("link3").mass.mul_(3.0)  # in place: the model notices (tensor versions)
        after = f(q, v, tau)
    assert not torch.allclose(before, after)
    assert rel_err(after, robot.forward_dynamics(q, v, tau)) < 1e-12


def test_without_compiler_falls_back_to_torch(monkeypatch):
    monkeypatch.setattr(native, "compiler", lambda: None)
    robot = systems.n_link_pendulum(2)
    f = compiled(robot, "inverse_dynamics", compile=False, native=True)
    q, v, a, _ = random_state(robot, (3,))
    with pytest.warns(UserWarning, match="no native kernel"):
        with torch.no_grad():
            got = f(q, v, a)
    torch.testing.assert_close(got, robot.inverse_dynamics(q, v, a), rtol=1e-12, atol=1e-12)


def test_unsupported_operation_is_refused():
    def program(x, c):
        return torch.stack([torch.tanh(x[0]) * c[0]])

    if not native.available():
        pytest.skip("no C compiler")
    with pytest.raises(native.NativeUnavailable, match="unsupported operation"):
        native.LaneKernel(program, [1], [torch.ones(1, dtype=torch.float64)], torch.float64)
    with pytest.raises(native.NativeUnavailable, match="dtype"):
        native.LaneKernel(program, [1], [torch.ones(1, dtype=torch.float16)], torch.float16)


@needs_cc
def test_lane_kernel_on_a_small_program():
    def program(x, c):  # x (2, B): rows a, b -> (a * b + c0, sin(a) / b)
        return torch.stack([x[0] * x[1] + c[0], torch.sin(x[0]) / x[1]])

    k = native.LaneKernel(program, [2], [torch.zeros(1, dtype=torch.float64)], torch.float64)
    x = torch.rand(21, 2, dtype=torch.float64) + 0.5
    c = torch.tensor([0.25], dtype=torch.float64)
    out = k([x], [c])
    torch.testing.assert_close(out, torch.stack([x[:, 0] * x[:, 1] + 0.25, x[:, 0].sin() / x[:, 1]], 1),
                               rtol=1e-14, atol=1e-14)
    assert "#pragma omp simd" in k.source


@needs_cc
@pytest.mark.parametrize("key", ["iiwa", pytest.param("laikago", marks=pytest.mark.slow)])  # laikago: ~1 min build
def test_native_forward_dynamics_gradient_matches_autograd(key):
    robot = get_robot(key)
    f = compiled(robot, "forward_dynamics")
    q, v, tau, _ = random_state(robot, (19,), seed=7)
    w = torch.randn(19, robot.nv, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    got = torch.autograd.grad((f(*ins) * w).sum(), ins)
    ref_ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    want = torch.autograd.grad((robot.forward_dynamics(*ref_ins, fast_grad=False) * w).sum(), ref_ins)
    assert f.kernel(torch.float64, vjp=True) is not None  # the native reverse mode ran
    for name, a, b in zip(("q", "v", "tau"), got, want):
        assert rel_err(a, b) < 1e-9, name
