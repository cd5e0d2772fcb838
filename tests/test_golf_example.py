"""``examples/golf.py`` runs end to end on a tiny budget, makes progress and counts as documented."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cmaes")
pytest.importorskip("matplotlib")

from conftest import load_example as _load


@pytest.mark.slow
def test_golf_example_newton_and_cmaes_progress_on_a_tiny_budget(tmp_path):
    mod = _load("golf")
    out = tmp_path / "golf"
    T = 90
    mod.main(["--iterations", "2", "--horizon", str(T * 2e-3), "--knots", "3", "--cmaes-budget", "3",
              "--target", "2.0", "--out", str(out)])
    res = json.loads((out / "results.json").read_text())
    assert (out / "golf.png").stat().st_size > 0
    assert res["steps_per_rollout"] == T and res["controls"] == 6
    grad, cma = res["gradient"], res["cmaes"]
    # a gradient iteration counts the forward and the recomputed steps; CMA-ES gets three times
    # what two gradient iterations may use, in whole generations of candidate rollouts
    assert [e["steps"] for e in grad] == [2 * T * (i + 1) for i in range(len(grad))]
    assert res["cmaes_budget_steps"] == 3 * 2 * 2 * T
    assert len(cma) >= 1 and cma[-1]["steps"] == cma[-1]["evaluations"] * T <= res["cmaes_budget_steps"]
    assert [e["loss"] for e in cma] == sorted(e["loss"] for e in cma)[::-1]  # best so far
    # from no torque (the ball lands about 1.2 m away) one Newton step gets most of the way
    assert 0.8 < grad[0]["x_land"] < 1.6
    assert res["gradient_best"]["loss"] < 0.1 * grad[0]["loss"]
    # the landing point extrapolated from the end of the horizon is where the simulated ball
    # lands: within the step in which the ground stops its fall
    for key in ("gradient_best", "cmaes_best"):
        sim = res[key]["simulated_landing"]
        assert sim["landed"]
        assert sim["x_before_m"] - 1e-6 <= res[key]["x_land"] <= sim["x_after_m"] + 1e-6, (sim, res[key])
