"""Contacts differentiable w.r.t. the collision geometry (``Scene(sizes=...)``), and ``Scene.to``."""

from __future__ import annotations

import pytest
import torch

from diffmech.contact import pgs_native
from diffmech.errors import ModelError
from diffmech.model import systems
from diffmech.sim import Scene, rollout

f64 = dict(dtype=torch.float64)


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


def _resting_ball(radius, steps: int, adjoint: str, depth: float = 1e-4):
    ball = systems.sphere(0.1, 1.0)
    scene = Scene({"ball": ball}, sizes={("ball", "body"): radius}, tol=1e-13, iterations=200)
    q0 = ball.neutral_configuration()
    q0[2] = 0.1 - depth  # slightly into the ground: the position correction acts from step 0
    Q, _ = rollout(scene, q0, torch.zeros(6, **f64), torch.zeros(steps, 6, **f64), 1e-2, adjoint=adjoint)
    return Q[-1, 2], scene


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_resting_height_follows_the_radius(adjoint):
    """A resting ball's height converges to its radius: with a penetration phi < 0 the step sets
    the normal velocity to -baumgarte phi / dt, so z_T = r - (1 - b)^T (r - z_0) and
    dz_T/dr = 1 - (1 - b)^T exactly."""
    r = torch.tensor([0.1], **f64, requires_grad=True)
    steps = 30
    z, scene = _resting_ball(r, steps, adjoint)
    (g,) = torch.autograd.grad(z, r)
    expected = 1.0 - (1.0 - scene.baumgarte) ** steps
    assert abs(float(g) - expected) < 1e-9, (float(g), expected)


def test_box_and_ball_sizes_match_finite_differences():
    """A ball resting on a free box resting on the ground: the ball's final height w.r.t. the
    box's side lengths and the ball's radius, against central differences of the whole rollout."""
    ball, box = systems.sphere(0.05, 0.3), systems.box(size=(0.4, 0.3, 0.2), mass=2.0)
    size0 = torch.tensor([0.4, 0.3, 0.2], **f64)
    rad0 = torch.tensor([0.05], **f64)

    def final_height(size, rad):
        scene = Scene({"box": box, "ball": ball}, sizes={("box", "body"): size, ("ball", "body"): rad},
                      tol=1e-14, iterations=400)
        q0 = scene.neutral_configuration()
        q0[2] = 0.1 - 2e-4
        q0[7:9] = torch.tensor([0.03, -0.02])  # off the box's centre: a tilt would show in x
        q0[9] = 0.2 + 0.05 - 5e-4
        Q, _ = rollout(scene, q0, torch.zeros(12, **f64), torch.zeros(20, 12, **f64), 5e-3)
        return Q[-1, 9]

    size = size0.clone().requires_grad_(True)
    rad = rad0.clone().requires_grad_(True)
    gs, gr = torch.autograd.grad(final_height(size, rad), (size, rad))
    eps = 1e-6
    fd = []
    for base, i in [("size", 0), ("size", 1), ("size", 2), ("rad", 0)]:
        vals = []
        for sgn in (1, -1):
            s, r = size0.clone(), rad0.clone()
            (s if base == "size" else r)[i] += sgn * eps
            with torch.no_grad():
                vals.append(float(final_height(s, r)))
        fd.append((vals[0] - vals[1]) / (2 * eps))
    got = torch.cat([gs, gr]).tolist()
    assert abs(fd[2]) > 0.5 and abs(fd[3]) > 0.5  # the heights do depend on lz and r
    for a, b in zip(got, fd):
        assert abs(a - b) < 1e-6 * max(1.0, abs(b)), (got, fd)


def test_sizes_are_checked():
    ball = systems.sphere(0.1, 1.0)
    with pytest.raises(ModelError, match="no model"):
        Scene({"ball": ball}, sizes={("bal", "body"): 0.1})
    with pytest.raises(ModelError, match="link 'base'.*0 collision shape"):
        Scene({"ball": ball}, sizes={("ball", "base"): 0.1})
    with pytest.raises(ModelError, match="sphere takes 1"):
        Scene({"ball": ball}, sizes={("ball", "body"): torch.ones(3, **f64)})
    with pytest.raises(ModelError, match="positive"):
        Scene({"ball": ball}, sizes={("ball", "body"): -0.1})
    scene = Scene({"ball": ball}, sizes={("ball", "body"): 0.2})
    assert float(scene.shape_size("ball", "body")[0]) == 0.2
    assert Scene({"ball": ball}).shape_size("ball", "body") == (0.1,)


def test_to_moves_coefficients_drives_and_sizes_and_keeps_their_gradients():
    arm = systems.double_pendulum()
    ball = systems.sphere(0.1, 1.0)
    mu = torch.tensor(0.4, **f64, requires_grad=True)
    kp = torch.tensor([5.0, 5.0], **f64, requires_grad=True)
    rad = torch.tensor([0.1], **f64, requires_grad=True)
    scene = Scene({"ball": ball, "arm": arm}, friction=mu, drives={"arm": {"stiffness": kp}},
                  sizes={("ball", "body"): rad})
    scene.to(torch.float32)
    assert scene.friction.dtype == torch.float32
    assert all(t.dtype == torch.float32 for t in scene.drives["arm"])
    assert scene.shape_size("ball", "body").dtype == torch.float32
    q0 = scene.neutral_configuration()
    q0[2] = 0.099
    q0[7] = 0.3
    v0 = torch.zeros(scene.nv)
    v0[0] = 0.5  # sliding: friction acts
    Q, _ = rollout(scene, q0, v0, torch.zeros(10, scene.nv), 1e-2)
    (Q[-1, 0] + Q[-1, 2] + Q[-1, 7:9].sum()).backward()
    assert mu.grad is not None and float(mu.grad) < 0  # more friction, less sliding
    assert kp.grad is not None and bool(kp.grad.abs().sum() > 0)
    assert rad.grad is not None and float(rad.grad) > 0  # a larger ball sits higher
