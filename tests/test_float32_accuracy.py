"""Float32 inverse dynamics, mass matrix and forward dynamics agree with float64 to 1e-5.

Oracle: the float64 model evaluated at the same (float32-rounded) inputs. The error of a state
is ``max |x32 - x64| / max |x64|`` over its entries; every state of 100 random ones (unit-scale
velocities, accelerations and torques) must stay below 1e-5, for a float64 model called with
float32 inputs and for ``robot.to(torch.float32)``, at a large batch (the batch-last paths) and
in batches of four (the small-batch paths). The quadruped's floating base stands at
(10, 10, 0) m: the dynamics are invariant under a translation of the world, and float32 must
not lose digits to it.
"""

from __future__ import annotations

import copy

import pytest
import torch

import diffmech
from conftest import get_robot

TOL = 1e-5
N = 100
ROBOTS = ["iiwa", "allegro", "laikago"]
BASE = (10.0, 10.0, 0.0)


def _inputs(robot, seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(N, generator=g)
    if robot.floating_base:
        q[:, :3] = torch.tensor(BASE, dtype=q.dtype)
    v, a, tau = (torch.randn(N, robot.nv, generator=g, dtype=torch.float64) for _ in range(3))
    return {k: t.float() for k, t in dict(q=q, v=v, a=a, tau=tau).items()}


def _evaluate(robot, x: dict[str, torch.Tensor], chunk: int | None = None) -> dict[str, torch.Tensor]:
    if chunk is not None:
        parts = [_evaluate(robot, {k: t[i:i + chunk] for k, t in x.items()}) for i in range(0, N, chunk)]
        return {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
    out = {
        "inverse_dynamics": robot.inverse_dynamics(x["q"], x["v"], x["a"]),
        "mass_matrix": robot.mass_matrix(x["q"]),
        "forward_dynamics_aba": robot.forward_dynamics(x["q"], x["v"], x["tau"], method="aba"),
        "forward_dynamics_crba": robot.forward_dynamics(x["q"], x["v"], x["tau"], method="crba"),
    }
    return {k: t.reshape(t.shape[0], -1) for k, t in out.items()}


def _max_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(((got.double() - ref).abs().amax(-1) / ref.abs().amax(-1)).max())


@pytest.fixture(scope="module", params=ROBOTS)
def case(request):
    robot = get_robot(request.param)
    x = _inputs(robot)
    ref = _evaluate(robot, {k: t.double() for k, t in x.items()})
    return request.param, robot, x, ref


@pytest.mark.parametrize("route", ["float64_model", "float32_model"])
@pytest.mark.parametrize("chunk", [None, 4], ids=["batch100", "batch4"])
def test_float32_matches_float64(case, route, chunk):
    name, robot, x, ref = case
    model = robot if route == "float64_model" else copy.deepcopy(robot).to(torch.float32)
    got = _evaluate(model, x, chunk)
    for k, t in got.items():
        assert t.dtype == torch.float32, k
        err = _max_error(t, ref[k])
        assert err < TOL, f"{name} {route} {k}: float32 error {err:.2e} >= {TOL:.0e}"


def test_translation_of_the_world_changes_nothing():
    """A floating base moved by 10 m has the same dynamics (float64, to round-off)."""
    robot = get_robot("laikago")
    x = {k: t.double() for k, t in _inputs(robot, seed=3).items()}
    moved = dict(x, q=x["q"].clone())
    moved["q"][:, :3] -= torch.tensor(BASE, dtype=torch.float64)
    a, b = _evaluate(robot, x), _evaluate(robot, moved)
    for k in a:
        assert _max_error(a[k], b[k]) < 1e-12, k


def test_world_frame_option_gives_the_same_float64_dynamics():
    """``set_eager_frame("world")`` (the former formulation, kept as an option) computes the same
    functions; unknown frames are refused."""
    robot = get_robot("laikago")
    x = {k: t.double()[:8] for k, t in _inputs(robot, seed=4).items()}
    ref = _evaluate_small(robot, x)
    old = diffmech.dynamics.set_eager_frame("world")
    try:
        world = _evaluate_small(robot, x)
        assert diffmech.dynamics.set_eager_frame("world") == "world"
    finally:
        diffmech.dynamics.set_eager_frame(old)
    for k in ref:
        assert _max_error(world[k], ref[k]) < 1e-10, k
    with pytest.raises(diffmech.OptionError):
        diffmech.dynamics.set_eager_frame("origin")


def _evaluate_small(robot, x):
    """The four quantities at a few states, at batch 8 and at batch 1."""
    n = x["q"].shape[0]
    return {
        "inverse_dynamics": robot.inverse_dynamics(x["q"], x["v"], x["a"]),
        "mass_matrix": robot.mass_matrix(x["q"]).flatten(1),
        "forward_dynamics_aba": robot.forward_dynamics(x["q"], x["v"], x["tau"], method="aba"),
        "forward_dynamics_crba": robot.forward_dynamics(x["q"], x["v"], x["tau"], method="crba"),
        "forward_dynamics_aba_b1": torch.stack([
            robot.forward_dynamics(x["q"][i], x["v"][i], x["tau"][i], method="aba") for i in range(n)]),
    }
