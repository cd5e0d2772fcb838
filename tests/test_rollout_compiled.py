"""``rollout(..., compile=...)``: the compiled step / step-VJP path and the compiled forward dynamics.

The default tests run the very same functions eagerly (``compiled(robot, compile=False)``), which
checks the adjoint logic exactly; the slow test compiles them with ``torch.compile``.
"""

from __future__ import annotations

import copy

import pytest
import torch

from diffmech.dynamics import compiled
from diffmech.errors import OptionError, ShapeError
from diffmech.sim import rollout
from test_rollout import DT, MLPPolicy, _assert_same, _grads, _load, _loss, _problem, make_robot

EXPLICIT = ["euler", "semi_implicit_euler", "midpoint", "rk4"]


def _eager(robot):
    return compiled(robot, compile=False, chunk=None)


@pytest.mark.parametrize("integrator", EXPLICIT)
@pytest.mark.parametrize("which", ["arm", "iiwa"])
@pytest.mark.parametrize("adjoint,every", [("checkpoint", 1), ("checkpoint", 3), ("autograd", 1)])
def test_tensor_controls_match_the_eager_rollout(integrator, which, adjoint, every):
    """Gradients w.r.t. q0, v0, the torques and the learnable mass and damping."""
    robot, q0, v0, tau, wq, wv = _problem(which, (2,), 7)
    dt = 0.01 if which == "arm" else 1e-3
    q_ref, _ = rollout(robot, q0, v0, tau, dt, integrator=integrator)
    _, g_ref = _grads(robot, q0, v0, tau, wq, wv, dt, integrator=integrator)
    kw = dict(integrator=integrator, adjoint=adjoint, checkpoint_every=every, compile=_eager(robot))
    q, _ = rollout(robot, q0, v0, tau, dt, **kw)
    _, g = _grads(robot, q0, v0, tau, wq, wv, dt, **kw)
    torch.testing.assert_close(q, q_ref, atol=1e-13, rtol=0)
    _assert_same(g, g_ref)


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_policy_matches_the_eager_rollout(adjoint):
    robot, q0, v0, _, wq, wv = _problem("arm", (3,), 9)
    policy = MLPPolicy(robot.nq, robot.nv)
    _, g_ref = _grads(robot, q0, v0, policy, wq, wv, 0.01, steps=9)
    _, g = _grads(robot, q0, v0, policy, wq, wv, 0.01, steps=9, adjoint=adjoint, compile=_eager(robot))
    assert len(g) == 2 + 2 + 4  # q0, v0, mass, damping, two linear layers
    _assert_same(g, g_ref)


def test_floating_base():
    robot = copy.deepcopy(_load("laikago"))
    robot.make_link_param_learnable(robot.link_names[1], "mass")
    g = torch.Generator().manual_seed(3)
    q0 = robot.random_configuration(2, generator=g).requires_grad_(True)
    v0 = (0.5 * torch.randn(2, robot.nv, dtype=DT, generator=g)).requires_grad_(True)
    tau = torch.randn(2, 4, robot.nv, dtype=DT, generator=g)
    tau[..., :6] = 0.0
    tau.requires_grad_(True)
    wq = torch.randn(2, 5, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(2, 5, robot.nv, dtype=DT, generator=g)
    _, g_ref = _grads(robot, q0, v0, tau, wq, wv, 1e-3, integrator="rk4")
    _, g = _grads(robot, q0, v0, tau, wq, wv, 1e-3, integrator="rk4", compile=_eager(robot))
    _assert_same(g, g_ref)


def test_no_grad_path_uses_the_compiled_step():
    robot, q0, v0, tau, _, _ = _problem("arm", (2,), 5)
    with torch.no_grad():
        q_ref, v_ref = rollout(robot, q0, v0, tau, 0.01)
        q, v = rollout(robot, q0, v0, tau, 0.01, compile=_eager(robot))
    assert not q.requires_grad
    torch.testing.assert_close(q, q_ref, atol=1e-14, rtol=0)
    torch.testing.assert_close(v, v_ref, atol=1e-14, rtol=0)


def test_bad_options():
    robot, q0, v0, tau, _, _ = _problem("arm", (2,), 3)
    with pytest.raises(ShapeError, match="explicit integrator"):
        rollout(robot, q0, v0, tau, 0.01, integrator="variational_midpoint", compile=_eager(robot))
    f_ext = torch.zeros(2, 3, robot.n_links, 6, dtype=DT)
    with pytest.raises(OptionError, match="f_ext=True"):
        rollout(robot, q0, v0, tau, 0.01, f_ext=f_ext, compile=_eager(robot))
    other = make_robot("arm")
    with pytest.raises(OptionError, match="forward dynamics of 'arm2'"):
        rollout(robot, q0, v0, tau, 0.01, compile=compiled(other, compile=False))
    with pytest.raises(OptionError, match="passive"):
        rollout(robot, q0, v0, tau, 0.01, passive=False, compile=_eager(robot))
    with pytest.raises(OptionError, match="compile must be"):
        rollout(robot, q0, v0, tau, 0.01, compile="yes")


def _f_ext_problem(which, T):
    robot, q0, v0, tau, wq, wv = _problem(which, (2,), T)
    g = torch.Generator().manual_seed(3)
    f_ext = torch.randn(2, T, robot.n_links, 6, dtype=DT, generator=g).requires_grad_(True)
    return robot, q0, v0, tau, f_ext, wq, wv


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
@pytest.mark.parametrize("integrator", ["semi_implicit_euler", "rk4"])
def test_external_forces_match_the_eager_rollout(adjoint, integrator):
    """Compiled forward dynamics with ``f_ext=True``: states and the gradients w.r.t. q0, v0, the
    torques, the external forces and the learnable parameters equal the eager rollout's."""
    robot, q0, v0, tau, f_ext, wq, wv = _f_ext_problem("iiwa", 4)

    def grads(**kw):
        q, v = rollout(robot, q0, v0, tau, 1e-3, f_ext=f_ext, integrator=integrator, adjoint=adjoint, **kw)
        inputs = [q0, v0, tau, f_ext] + [p for p in robot.parameters() if p.requires_grad]
        return q, torch.autograd.grad(_loss(q, v, wq, wv), inputs)

    q_ref, g_ref = grads()
    q, g = grads(compile=compiled(robot, compile=False, chunk=None, f_ext=True))
    torch.testing.assert_close(q, q_ref, atol=1e-13, rtol=0)
    assert g[3].abs().max() > 0
    _assert_same(g, g_ref)


def test_external_forces_native_rollout(tmp_path, monkeypatch):
    """``compile=True`` with ``f_ext`` on the CPU runs the native forward-dynamics kernel with
    external forces (built here into a fresh cache) and its reverse mode."""
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path))
    robot, q0, v0, tau, f_ext, wq, wv = _f_ext_problem("arm", 3)
    out = []
    for kw in ({}, {"compile": True}):
        q, v = rollout(robot, q0, v0, tau, 0.01, f_ext=f_ext, **kw)
        inputs = [q0, v0, tau, f_ext] + [p for p in robot.parameters() if p.requires_grad]
        out.append((q, torch.autograd.grad(_loss(q, v, wq, wv), inputs)))
    torch.testing.assert_close(out[1][0], out[0][0], atol=1e-12, rtol=0)
    _assert_same(out[1][1], out[0][1], tol=1e-9)


@pytest.mark.slow
def test_torch_compile_rollout_matches_eager():
    robot, q0, v0, tau, wq, wv = _problem("arm", (2,), 6)
    _, g_ref = _grads(robot, q0, v0, tau, wq, wv, 0.01)
    _, g = _grads(robot, q0, v0, tau, wq, wv, 0.01, compile=True)
    _assert_same(g, g_ref, tol=1e-9)
    # Another trajectory length reuses the compiled step: the kernels see the same shapes and strides.
    robot2, q0, v0, tau, wq, wv = _problem("arm", (2,), 11)
    robot.load_state_dict(robot2.state_dict())
    import torch._dynamo

    with torch._dynamo.config.patch(error_on_recompile=True):
        _, g = _grads(robot, q0, v0, tau, wq, wv, 0.01, compile=True)
    _, g_ref = _grads(robot, q0, v0, tau, wq, wv, 0.01)
    _assert_same(g, g_ref, tol=1e-9)


@pytest.mark.parametrize("which", ["iiwa", "laikago"])
@pytest.mark.parametrize("every", [1, 3])
def test_state_only_gradients_take_the_time_batched_reverse(monkeypatch, which, every):
    """With few rows per step the compiled rollout's reverse is the time-batched one, which
    recomputes the accelerations the compiled forward did not record."""
    import importlib

    ro = importlib.import_module("diffmech.sim.rollout")
    seen = []
    orig = ro._reverse_time_batched
    monkeypatch.setattr(ro, "_reverse_time_batched", lambda *a: seen.append(a[4] is None) or orig(*a))
    robot = _load(which)
    g = torch.Generator().manual_seed(12)
    T = 7
    q0 = robot.random_configuration(1, generator=g).requires_grad_(True)
    v0 = (0.5 * torch.randn(1, robot.nv, dtype=DT, generator=g)).requires_grad_(True)
    tau = torch.randn(1, T, robot.nv, dtype=DT, generator=g).requires_grad_(True)
    wq = torch.randn(1, T + 1, robot.nq, dtype=DT, generator=g)
    wv = torch.randn(1, T + 1, robot.nv, dtype=DT, generator=g)
    _, g_ref = _grads(robot, q0, v0, tau, wq, wv, 1e-2, adjoint="autograd")
    _, g = _grads(robot, q0, v0, tau, wq, wv, 1e-2, checkpoint_every=every, compile=_eager(robot))
    _assert_same(g, g_ref)
    assert seen and all(seen)
