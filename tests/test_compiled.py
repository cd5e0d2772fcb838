"""The compiled, chunked evaluation path agrees with the eager algorithms."""

import pytest
import torch

import diffmech
from diffmech.dynamics import compiled
from diffmech.model import systems


@pytest.fixture(scope="module")
def robot():
    return systems.n_link_pendulum(3)


@pytest.mark.parametrize("algorithm", ["forward_dynamics", "inverse_dynamics", "mass_matrix"])
def test_chunked_eager_matches(robot, algorithm):
    g = torch.Generator().manual_seed(0)
    B = 10  # not a multiple of the chunk: exercises the padded last piece
    q = robot.random_configuration(B, generator=g)
    v = torch.randn(B, robot.nv, dtype=torch.float64, generator=g)
    u = torch.randn(B, robot.nv, dtype=torch.float64, generator=g)
    args = (q,) if algorithm == "mass_matrix" else (q, v, u)
    f = compiled(robot, algorithm, chunk=4, compile=False)
    expected = getattr(robot, algorithm)(*args)
    torch.testing.assert_close(f(*args), expected, atol=1e-12, rtol=1e-12)


def test_gradients_flow_through_chunks(robot):
    g = torch.Generator().manual_seed(1)
    q = robot.random_configuration(6, generator=g).requires_grad_()
    v = torch.randn(6, robot.nv, dtype=torch.float64, generator=g)
    tau = torch.randn(6, robot.nv, dtype=torch.float64, generator=g)
    f = compiled(robot, chunk=4, compile=False)
    (g1,) = torch.autograd.grad(f(q, v, tau).square().sum(), q)
    (g2,) = torch.autograd.grad(robot.forward_dynamics(q, v, tau).square().sum(), q)
    torch.testing.assert_close(g1, g2, atol=1e-12, rtol=1e-12)


def test_bad_input(robot):
    f = compiled(robot, compile=False)
    with pytest.raises(diffmech.ShapeError, match=r"'q' must have shape \(B, 3\)"):
        f(torch.zeros(3, 5, dtype=torch.float64), torch.zeros(3, 3), torch.zeros(3, 3))
    with pytest.raises(diffmech.ShapeError, match="unknown algorithm"):
        compiled(robot, "aba_twice")


@pytest.mark.slow
def test_torch_compile_matches_eager(robot):
    g = torch.Generator().manual_seed(2)
    q = robot.random_configuration(8, generator=g)
    v = torch.randn(8, robot.nv, dtype=torch.float64, generator=g)
    tau = torch.randn(8, robot.nv, dtype=torch.float64, generator=g)
    f = compiled(robot, chunk=4)
    torch.testing.assert_close(f(q, v, tau), robot.forward_dynamics(q, v, tau), atol=1e-10, rtol=1e-10)
