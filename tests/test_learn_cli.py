"""diffmech symo: a tiny training run through the CLI, resume with nothing lost, sweeps and figures."""

from __future__ import annotations

import csv
import json
import sys

import numpy as np
import pytest
import torch

from diffmech.cli import main
from diffmech.errors import DiffmechError
from diffmech.learn import MODEL_NAMES, PRESETS, TrainConfig, load_run_model, make_dataset, run, step_samples
from diffmech.learn import cli as learn_cli
from diffmech.learn.figures import comparison_markdown
from diffmech.learn.metrics import one_step_losses
from diffmech.learn.sweep import sweep

METRIC_KEYS = ("train_loss", "test_loss", "integration_loss", "energy_loss", "inertia_loss", "integration_median",
               "integration_positions", "energy_loss_consistent", "train_loss_positions", "test_loss_positions",
               "wall_s")


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


def _tiny(**kw) -> TrainConfig:
    base = dict(system="pendulum", model="e2e-symo", n_ics=2, epochs=3, n_samples=8, n_int=2, int_steps=10,
                checkpoint_every=1, log_every=2)
    base.update(kw)
    return TrainConfig(**base)


def test_cli_choices_match_the_library():
    assert learn_cli.MODEL_CHOICES == MODEL_NAMES
    assert set(learn_cli.SYSTEM_CHOICES) == set(PRESETS)


def test_symo_train_through_the_cli(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["symo", "train", "--system", "pendulum", "--model", "symo", "--n-ics", "2", "--epochs", "2",
               "--h", "0.1", "--seed", "3", "--out", str(out), "--n-samples", "8", "--n-int", "2", "--int-steps", "10",
               "--no-progress"])
    assert rc == 0
    for f in ("config.json", "metrics.json", "history.csv", "loss_curves.png", "checkpoint.pt", "rollout.npz"):
        assert (out / f).is_file(), f
    cfg = json.loads((out / "config.json").read_text())
    assert (cfg["model"], cfg["n_ics"], cfg["epochs"], cfg["h"], cfg["seed"]) == ("symo", 2, 2, 0.1, 3)
    m = json.loads((out / "metrics.json").read_text())
    for k in METRIC_KEYS:
        assert k in m and m[k] is not None, k
    assert m["epochs"] == 2 and m["adam_steps"] == 2 * 8  # 8 minibatches of 4 N samples per epoch
    with open(out / "history.csv") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["epoch"]) for r in rows] == [1, 2]
    assert "integration_loss=" in capsys.readouterr().out
    # the numbers, not only the files: the history's last row is metrics.json's final objectives ...
    assert float(rows[-1]["train_objective"]) == m["final_train_objective"]
    assert float(rows[-1]["test_objective"]) == m["final_test_objective"]
    # ... the integration errors are those of the stored rollout (positions: the pendulum has 1 DoF) ...
    z = np.load(out / "rollout.npz")
    per_traj = ((z["q"] - z["true"][..., :1]) ** 2).mean(axis=(1, 2))
    assert z["q"].shape == (2, 10, 1) and m["integration_loss"] == pytest.approx(per_traj.mean(), rel=1e-12)
    assert m["integration_median"] == pytest.approx(np.median(per_traj), rel=1e-12)
    # ... and the test error is the saved model's on the test set, solved again here
    c, system, model = load_run_model(out)
    ds = make_dataset(c.system, c.h, seed=c.data_seed, int_seed=c.int_seed, n_samples=c.n_samples, n_steps=c.n_steps,
                      n_int=c.n_int, int_steps=c.int_steps)
    test_b = step_samples(ds.test, system.n, dtype=torch.float32)
    assert len(test_b) == 4 * 32  # 4 test trajectories of 32 transitions
    te = one_step_losses(model, "symo", test_b, "test", tol=c.newton_tol, max_iter=c.newton_max_iter)
    assert te["loss"] == pytest.approx(m["test_loss"], rel=1e-6)
    assert te["positions"] == pytest.approx(m["test_loss_positions"], rel=1e-6)
    # a second train into the same folder without --resume is refused; evaluate rewrites the metrics
    assert main(["symo", "train", "--model", "symo", "--n-ics", "2", "--epochs", "2", "--out", str(out),
                 "--n-samples", "8", "--n-int", "2", "--int-steps", "10", "--no-progress"]) == 1
    assert main(["symo", "evaluate", str(out)]) == 0
    m2 = json.loads((out / "metrics.json").read_text())
    assert m2["integration_loss"] == pytest.approx(m["integration_loss"], rel=1e-6)
    assert m2["train_loss"] == m["train_loss"]


class _Interrupt(Exception):
    pass


@pytest.mark.parametrize("model", ["e2e-symo", pytest.param("lnode-rk4", marks=pytest.mark.slow)])
def test_resume_after_an_interruption_loses_nothing(tmp_path, monkeypatch, model):
    cfg = _tiny(model=model, epochs=4)
    a = run(cfg, tmp_path / "a", progress=False)
    # interrupt the second run during its third epoch (after 2 checkpointed epochs)
    calls = {"n": 0}
    step = torch.optim.Adam.step

    def failing_step(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2 * 8 + 3:
            raise _Interrupt
        return step(self, *args, **kwargs)

    monkeypatch.setattr(torch.optim.Adam, "step", failing_step)
    with pytest.raises(_Interrupt):
        run(cfg, tmp_path / "b", progress=False)
    monkeypatch.setattr(torch.optim.Adam, "step", step)
    assert not (tmp_path / "b" / "metrics.json").exists()
    b = run(cfg, tmp_path / "b", resume=True, progress=False)
    ka = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)
    kb = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    for k in ka["model"]:
        assert torch.equal(ka["model"][k], kb["model"][k]), k
    strip = lambda h: [{k: v for k, v in r.items() if k != "epoch_s"} for r in h]  # noqa: E731
    assert strip(ka["history"]) == strip(kb["history"])
    for k in ("train_loss", "test_loss", "integration_loss", "energy_loss", "integration_median"):
        assert a[k] == b[k], k
    # a finished run resumes to its metrics; more epochs continue it
    assert run(cfg, tmp_path / "b", resume=True, progress=False)["integration_loss"] == b["integration_loss"]
    c = run(_tiny(model=model, epochs=5), tmp_path / "b", resume=True, progress=False)
    assert c["epochs"] == 5 and c["cpu_s"] > 0
    # a checkpoint of older code without cpu_s: the run's CPU time is unknown, not this session's alone
    ck = torch.load(tmp_path / "b" / "checkpoint.pt", weights_only=False)
    del ck["cpu_s"]
    torch.save(ck, tmp_path / "b" / "checkpoint.pt")
    assert run(_tiny(model=model, epochs=6), tmp_path / "b", resume=True, progress=False)["cpu_s"] is None


def test_sweep_resumes_and_figures(tmp_path):
    base = _tiny(epochs=2)
    rows = sweep(base, tmp_path, models=("node-midpoint", "symo"), n_ics=(2,), workers=1, progress=False)
    assert [(r["model"], r["n_ics"]) for r in rows] == [("node-midpoint", 2), ("symo", 2)]
    with open(tmp_path / "summary.csv") as f:
        summary = list(csv.DictReader(f))
    assert len(summary) == 2
    # the summary's numbers are the runs' own metrics.json values
    for row in summary:
        m = json.loads((tmp_path / row["model"] / "N2" / "metrics.json").read_text())
        for key in ("test_loss", "integration_loss", "integration_median", "energy_loss_consistent"):
            assert float(row[key]) == m[key], (row["model"], key)
    stamp = (tmp_path / "symo" / "N2" / "metrics.json").stat().st_mtime_ns
    rows2 = sweep(base, tmp_path, models=("node-midpoint", "symo"), n_ics=(2,), workers=1, progress=False)
    assert rows2 == rows and (tmp_path / "symo" / "N2" / "metrics.json").stat().st_mtime_ns == stamp
    assert main(["symo", "figures", str(tmp_path), "--n-ics", "2", "--long-horizon", "30"]) == 0
    for name in ("pendulum_metrics.png", "pendulum_metrics_corrected.png", "pendulum_phase_N2.png",
                 "pendulum_energy_N2.png", "pendulum_long_horizon_N2.png"):
        assert (tmp_path / name).stat().st_size > 1000, name
    table = (tmp_path / "pendulum_comparison.md").read_text()
    assert "| SyMo | integration error |" in table and "0.0277" in table  # the paper's SyMo value at N = 128
    lh = json.loads((tmp_path / "pendulum_long_horizon_N2.json").read_text())
    assert set(lh) == {"symo"} and lh["symo"]["newton_failures"] >= 0


def test_comparison_table_of_a_partial_sweep():
    rows = [{"system": "pendulum", "model": "e2e-symo", "n_ics": 128, "train_loss": 1.1867e-07, "test_loss": 1.1e-07,
             "integration_loss": 0.027338, "energy_loss": 0.3789, "inertia_loss": 1.055e-05,
             "integration_median": 0.002658, "energy_loss_consistent": 0.004825},
            {"system": "pendulum", "model": "node-rk4", "n_ics": 64, "train_loss": 3e-08, "test_loss": 2e-08,
             "integration_loss": 100.0, "energy_loss": 0.1, "inertia_loss": None}]
    table = comparison_markdown(rows, "pendulum")
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()
             if line.startswith("| ") and not line.startswith("| model")]
    lines = {(c[0], c[1]): c[2:] for c in cells}
    assert len(lines) == 6 * 7  # all six models of the paper, 5 paper metrics and 2 corrected ones
    # ours beside the paper's (Figure 3, E2E-SyMo, N = 8 ... 128); cells without a run say so
    assert lines["E2E-SyMo", "integration error"] == ["not run / 0.0228", "not run / 0.0302", "not run / 0.0039",
                                                        "not run / 0.0239", "0.0273 / 0.028"]
    assert lines["E2E-SyMo", "integration median"] == ["not run"] * 4 + ["0.00266"]
    assert lines["NODE-RK4", "inertia error"] == ["not run / -"] * 3 + ["- / -", "not run / -"]
    assert lines["SyMo", "train error"][0] == "not run / 2.67e-08"
    # a system without published values: only the N that were run, only diffmech's values
    other = comparison_markdown([{**rows[0], "system": "arm3", "n_ics": 32}], "arm3")
    assert "| E2E-SyMo | integration error | 0.0273 |" in other and "/" not in other.split("\n", 2)[2]


def test_ray_backend_needs_ray(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # as if not installed
    with pytest.raises(DiffmechError, match=r"diffmech\[ray\]"):
        sweep(_tiny(), tmp_path, models=("symo",), n_ics=(2,), backend="ray", progress=False)


def test_failed_solves_restart_from_the_seed_guess():
    """The warm start of the next epoch: a converged root is reused, a failed solve's iterate is not
    (the sample starts from the seed's ``2 q - q_prev`` again instead of staying in a wrong basin)."""
    from types import SimpleNamespace

    from diffmech.learn.train import _roots, _warm

    x = torch.tensor([[1.0, 2.0], [30.0, -40.0]])
    roots = _roots(x, torch.tensor([True, False]))
    b = SimpleNamespace(q=torch.tensor([[0.5, 0.5], [0.25, 0.5]]), q_prev=torch.tensor([[0.0, 0.0], [0.0, 0.25]]))
    start = _warm(roots, b)
    assert torch.equal(start[0], x[0])
    assert torch.equal(start[1], torch.tensor([0.5, 0.75]))


def test_e2e_objective_reports_convergence_per_sample():
    from types import SimpleNamespace

    from diffmech.learn.models import build_model

    torch.manual_seed(0)
    m = build_model("e2e-symo", [True], 0.1, width=16)
    q_prev = torch.zeros(4, 1)
    q = torch.full((4, 1), 0.01)
    u = torch.zeros(4, 1)
    b = SimpleNamespace(q_prev=q_prev, q=q, u_prev=u, u=u, u_next=u, q_next=torch.full((4, 1), 0.02))
    _, info = m.objective(b)
    assert info["converged"].shape == (4,) and info["converged"].dtype == torch.bool
    assert int((~info["converged"]).sum()) == info["failures"]
