"""The broad phase: a scene of many bodies runs the narrow phase only for the shapes that are close."""

from __future__ import annotations

import importlib

import pytest
import torch

from diffmech.contact import pgs_native
from diffmech.model import systems
from diffmech.sim import Scene, rollout

cs = importlib.import_module("diffmech.sim.contact_step")

f64 = dict(dtype=torch.float64)


@pytest.fixture(autouse=True)
def _native_pgs(monkeypatch):
    monkeypatch.setattr(pgs_native, "enabled", lambda: True)


def _grid_scene(n_side: int = 7):
    """``n_side^2 + 1`` balls of radius 0.1: a grid 1 m apart, 2 m above the ground, plus one
    ball resting on the first and the first one touching nothing else."""
    balls = {f"b{i}": systems.sphere(0.1, 1.0) for i in range(n_side * n_side + 1)}
    scene = Scene(balls)
    q0 = scene.neutral_configuration().reshape(-1, 7).clone()
    for i in range(n_side * n_side):
        q0[i, :3] = torch.tensor([i % n_side, i // n_side, 2.0], **f64)
    q0[-1, :3] = torch.tensor([0.0, 0.0, 2.0 + 0.2 - 1e-4], **f64)
    return scene, q0.reshape(-1)


def test_only_close_pairs_reach_the_narrow_phase(monkeypatch):
    scene, q0 = _grid_scene()
    calls = []
    pair, plane = cs._pair, cs.geo.plane_candidates
    monkeypatch.setattr(cs, "_pair", lambda *a: calls.append("pair") or pair(*a))
    monkeypatch.setattr(cs.geo, "plane_candidates", lambda *a: calls.append("plane") or plane(*a))
    info: dict = {}
    v0 = torch.zeros(1, scene.nv, **f64)
    cs.contact_step(scene, q0[None], v0, torch.zeros_like(v0), 1e-3, info)
    assert calls == ["pair"]  # 50 balls, 1225 pairs: one is close, and nothing is near the ground
    assert info["candidates"] == 1
    # ... and the step is the one a scene of the two touching balls alone takes
    two = Scene({"b0": systems.sphere(0.1, 1.0), "b1": systems.sphere(0.1, 1.0)})
    q2 = torch.cat([q0[:7], q0[-7:]])[None]
    z2 = torch.zeros(1, 12, **f64)
    qa, va = cs.contact_step(scene, q0[None], v0, torch.zeros_like(v0), 1e-3)
    qb, vb = cs.contact_step(two, q2, z2, z2, 1e-3)
    torch.testing.assert_close(torch.cat([qa[0, :7], qa[0, -7:]]), qb[0], rtol=0, atol=1e-14)
    torch.testing.assert_close(torch.cat([va[0, :6], va[0, -6:]]), vb[0], rtol=0, atol=1e-14)


def test_falling_grid_lands_and_keeps_the_stack():
    """Every ball of the grid lands on the ground; the one on top stays on its ball."""
    scene, q0 = _grid_scene(3)
    Q, _ = rollout(scene, q0, torch.zeros(scene.nv, **f64), torch.zeros(120, scene.nv, **f64), 1e-2)
    z = Q[-1].reshape(-1, 7)[:, 2]
    # hard contacts: every ball rests at its radius, the top one at three (measured: 6e-17 m)
    assert bool(((z[:-1] - 0.1).abs() < 1e-12).all()), z
    assert abs(float(z[-1]) - 0.3) < 1e-12, float(z[-1])
