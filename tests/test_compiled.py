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
    with pytest.raises(diffmech.OptionError, match="unknown algorithm"):
        compiled(robot, "aba_twice")


@pytest.mark.slow
def test_torch_compile_matches_eager(robot):
    g = torch.Generator().manual_seed(2)
    q = robot.random_configuration(8, generator=g)
    v = torch.randn(8, robot.nv, dtype=torch.float64, generator=g)
    tau = torch.randn(8, robot.nv, dtype=torch.float64, generator=g)
    f = compiled(robot, chunk=4)
    torch.testing.assert_close(f(q, v, tau), robot.forward_dynamics(q, v, tau), atol=1e-10, rtol=1e-10)


@pytest.fixture
def learnable_robot():
    from diffmech.model.params import PositiveScalar

    r = systems.n_link_pendulum(3)
    r.make_link_param_learnable("link1", "mass", PositiveScalar())
    r.make_link_param_learnable("link2", "com")
    r.make_link_param_learnable("link2", "damping")
    return r


@pytest.mark.parametrize("algorithm", ["forward_dynamics", "inverse_dynamics", "mass_matrix"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_vjp_backward_matches_autograd(learnable_robot, algorithm, chunk):
    """The VJP backward (chunked, with a padded last piece) gives the eager gradients w.r.t. the
    states and every learnable parameter."""
    robot = learnable_robot
    g = torch.Generator().manual_seed(3)
    B = 10
    q = robot.random_configuration(B, generator=g).requires_grad_()
    v = torch.randn(B, robot.nv, dtype=torch.float64, generator=g, requires_grad=True)
    u = torch.randn(B, robot.nv, dtype=torch.float64, generator=g, requires_grad=True)
    args = (q,) if algorithm == "mass_matrix" else (q, v, u)
    params = [p for p in robot.parameters() if p.requires_grad]
    assert len(params) == 3
    f = compiled(robot, algorithm, chunk=chunk, compile=False)
    w = torch.randn_like(getattr(robot, algorithm)(*args), dtype=torch.float64)
    y1 = f(*args)
    g1 = torch.autograd.grad((w * y1).sum(), [*args, *params], allow_unused=True)
    y2 = getattr(robot, algorithm)(*args)
    g2 = torch.autograd.grad((w * y2).sum(), [*args, *params], allow_unused=True)
    torch.testing.assert_close(y1, y2, atol=1e-12, rtol=1e-12)
    for a, b in zip(g1, g2):
        if b is None:  # e.g. the mass matrix does not depend on damping
            assert a is None or float(a.abs().max()) == 0.0
        else:
            torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_only_needed_cotangents_are_computed(robot):
    q = robot.random_configuration(5)
    v = torch.randn(5, robot.nv, dtype=torch.float64)
    tau = torch.randn(5, robot.nv, dtype=torch.float64, requires_grad=True)
    f = compiled(robot, compile=False)
    (gt,) = torch.autograd.grad(f(q, v, tau).sum(), tau)
    # d qdd / d tau = M^-1: the cotangent of a sum is M^-1 applied to ones.
    M = robot.mass_matrix(q)
    torch.testing.assert_close(gt, torch.linalg.solve(M, torch.ones_like(tau)), atol=1e-12, rtol=1e-12)
    with torch.no_grad():
        assert not f(q, v, tau).requires_grad


def test_bad_shapes_and_mixed_batches(robot):
    f = compiled(robot, compile=False)
    z = torch.zeros(3, 3, dtype=torch.float64)
    with pytest.raises(diffmech.ShapeError, match="'v' is"):
        f(z, torch.zeros(4, 3, dtype=torch.float64), z)
    with pytest.raises(diffmech.ShapeError, match="chunk"):
        compiled(robot, chunk=0)


@pytest.mark.slow
def test_torch_compile_gradients_match_eager(learnable_robot):
    robot = learnable_robot
    g = torch.Generator().manual_seed(4)
    q = robot.random_configuration(8, generator=g).requires_grad_()
    v = torch.randn(8, robot.nv, dtype=torch.float64, generator=g, requires_grad=True)
    tau = torch.randn(8, robot.nv, dtype=torch.float64, generator=g, requires_grad=True)
    params = [p for p in robot.parameters() if p.requires_grad]
    f = compiled(robot, chunk=4)
    g1 = torch.autograd.grad(f(q, v, tau).square().sum(), [q, v, tau, *params])
    g2 = torch.autograd.grad(robot.forward_dynamics(q, v, tau).square().sum(), [q, v, tau, *params])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)


@pytest.mark.slow
def test_torch_compile_gradients_floating_base_batch_one():
    """A batch of one on a floating base (a compiled small-batch code path once gave wrong q/v gradients)."""
    from conftest import get_robot, random_state

    robot = get_robot("humanoid")
    q, v, tau, _ = random_state(robot, (1,), 5)
    ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    f = compiled(robot)
    g1 = torch.autograd.grad(f(*ins).square().sum(), ins)
    g2 = torch.autograd.grad(robot.forward_dynamics(*ins).square().sum(), ins)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, atol=1e-9 * max(1.0, float(b.abs().max())), rtol=1e-9)


@pytest.mark.parametrize("key", ["branching_tree", "humanoid"])
@pytest.mark.parametrize("chunk", [None, 4])
def test_hand_backward_of_forward_dynamics_matches_autograd(key, chunk):
    """Without learnable parameters, forward dynamics differentiates through the saved articulated-body
    factors and the hand-written RNEA VJP (fixed and floating base, chunked with a padded last piece)."""
    from conftest import get_robot, random_state

    robot = get_robot(key)
    q, v, tau, _ = random_state(robot, (10,), 6)
    ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    f = compiled(robot, chunk=chunk, compile=False)
    y = f(*ins)
    assert y.grad_fn is not None and "CompiledForwardDynamics" in type(y.grad_fn).__name__
    w = torch.randn(y.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    g1 = torch.autograd.grad((w * y).sum(), ins)
    ref = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    g2 = torch.autograd.grad((w * robot.forward_dynamics(*ref, fast_grad=False)).sum(), ref)
    for a, b in zip(g1, g2):
        assert float((a - b).abs().max()) <= 1e-11 * max(1.0, float(b.abs().max()))


@pytest.mark.slow
@pytest.mark.parametrize("key", ["iiwa", "humanoid"])
def test_torch_compile_hand_backward_matches_eager(key):
    from conftest import get_robot, random_state

    robot = get_robot(key)
    q, v, tau, _ = random_state(robot, (6,), 7)
    ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    f = compiled(robot, chunk=4)
    g1 = torch.autograd.grad(f(*ins).square().sum(), ins)
    ref = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    g2 = torch.autograd.grad(robot.forward_dynamics(*ref).square().sum(), ref)
    for a, b in zip(g1, g2):
        assert float((a - b).abs().max()) <= 1e-9 * max(1.0, float(b.abs().max()))


def test_a_torch_compile_failure_falls_back_to_eager(robot, monkeypatch):
    """torch.compile's own failures (an InductorError when the C++ toolchain breaks) become one
    warning and the eager torch code, never an exception from deep inside torch."""

    class InductorError(RuntimeError):
        pass

    InductorError.__module__ = "torch._inductor.exc"

    def broken(fn, **kwargs):
        def call(*args, **kw):
            raise InductorError("C++ compile error: cc1plus not found")
        return call

    monkeypatch.setattr(torch, "compile", broken)
    f = compiled(robot, "inverse_dynamics", native=False)
    g = torch.Generator().manual_seed(3)
    q, v, a = (torch.randn(4, robot.nv, dtype=torch.float64, generator=g) for _ in range(3))
    with pytest.warns(UserWarning, match="torch.compile failed"):
        out = f(q, v, a)
    torch.testing.assert_close(out, robot.inverse_dynamics(q, v, a), rtol=1e-12, atol=1e-12)
