"""Progress of long Python calls (issue 36): ``progress=None`` is silent while a stage is short and,
once it has run ``diffmech._progress.AFTER_S`` seconds, logs one INFO line of the ``diffmech.<module>``
logger when noticed (with its sizes) and one when it ends (elapsed seconds) where stderr is not a
terminal; ``progress=True`` draws a tqdm bar on stderr; ``progress=False`` is silent. The threshold is
lowered to 0 where a test needs a "long" call. What a call computes does not depend on its progress."""

from __future__ import annotations

import json
import logging

import pytest
import torch

import diffmech
from diffmech import _progress
from diffmech.sim import rollout
from hopper_scene import make_scene, start_state

F64 = torch.float64


def _pendulum_rollout(progress, steps=40, grad=True):
    robot = diffmech.systems.n_link_pendulum(2, name="pendulum2")
    q0 = torch.tensor([[0.3, -0.2], [0.1, 0.4]], dtype=F64)
    tau = torch.full((2, steps, 2), 0.1, dtype=F64, requires_grad=grad)
    qs, vs = rollout(robot, q0, torch.zeros_like(q0), tau, dt=1e-3, progress=progress)
    if grad:
        (qs[:, -1].square().sum() + vs[:, -1].sum()).backward()
    return qs.detach(), vs.detach(), tau.grad


def _lines(caplog, name="diffmech.sim"):
    return [r.getMessage() for r in caplog.records if r.name == name]


@pytest.fixture
def long_after_0(monkeypatch):
    """Every stage counts as long from its first step."""
    monkeypatch.setattr(_progress, "AFTER_S", 0.0)


def test_a_long_rollout_logs_its_stages(long_after_0, caplog, capsys):
    caplog.set_level(logging.INFO, logger="diffmech")
    _pendulum_rollout(None)
    lines = _lines(caplog)
    # forward and backward: a line when noticed (the sizes), one at the end (the elapsed time)
    assert len(lines) == 4, lines
    assert lines[0].startswith("rollout: 40 steps x batch 2 of 'pendulum2'") and "nv 2" in lines[0]
    assert lines[1].startswith("rollout: done in ") and "(40 steps)" in lines[1]
    assert lines[2].startswith("rollout backward: 40 steps x batch 2")
    assert lines[3].startswith("rollout backward: done in ") and "(40 steps)" in lines[3]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == "diffmech.sim")
    assert "it/s" not in capsys.readouterr().err  # stderr is not a terminal here: no bar


def test_the_diffmech_logger_at_warning_silences_them(long_after_0, caplog):
    caplog.set_level(logging.WARNING, logger="diffmech")
    _pendulum_rollout(None)
    assert _lines(caplog) == []


def test_a_short_rollout_logs_nothing_and_draws_no_bar(caplog, capsys):
    caplog.set_level(logging.INFO, logger="diffmech")
    assert _progress.AFTER_S >= 1.0
    _pendulum_rollout(None)
    assert _lines(caplog) == []
    assert capsys.readouterr().err == ""


def test_progress_false_silences_a_long_rollout(long_after_0, caplog, capsys):
    caplog.set_level(logging.INFO, logger="diffmech")
    _pendulum_rollout(False)
    assert _lines(caplog) == []
    assert capsys.readouterr().err == ""


def test_progress_true_draws_a_bar_on_stderr(caplog, capsys):
    caplog.set_level(logging.INFO, logger="diffmech")
    _pendulum_rollout(True)
    err = capsys.readouterr().err
    # tqdm redraws at most every 0.1 s and clears its line at the end: the first drawing of each bar is certain
    assert "rollout:   0%" in err and "rollout backward:   0%" in err and "0/40 [" in err
    assert _lines(caplog) == []  # the bar is the progress: no lines besides


def test_the_results_do_not_depend_on_progress(long_after_0):
    ref = _pendulum_rollout(False)
    for progress in (None, True):
        for a, b in zip(_pendulum_rollout(progress), ref):
            assert torch.equal(a, b)


def test_a_long_scene_rollout_logs_its_stages_and_computes_the_same(long_after_0, caplog):
    caplog.set_level(logging.INFO, logger="diffmech")

    def run(progress):
        scene = make_scene()
        q0, v0 = (x.detach().requires_grad_() for x in start_state(scene))
        tau = torch.full((2, 6, scene.nv), 0.1, dtype=F64, requires_grad=True)
        qs, vs = rollout(scene, q0, v0, tau, dt=2e-3, progress=progress)
        (qs[:, -1, 2].sum() + vs[:, -1].square().sum()).backward()
        return qs.detach(), vs.detach(), q0.grad, v0.grad, tau.grad

    ref = run(False)
    assert _lines(caplog) == []
    got = run(None)
    for a, b in zip(got, ref):
        assert torch.equal(a, b)
    lines = _lines(caplog)
    assert len(lines) == 4, lines
    assert lines[0].startswith("rollout: 6 steps x batch 2 of a scene") and "route " in lines[0]
    assert lines[1].startswith("rollout: done in ")
    assert lines[2].startswith("rollout backward: 6 steps") and lines[3].startswith("rollout backward: done in ")


def test_stabilize_simulate_logs_its_stage_and_computes_the_same(long_after_0, caplog):
    from diffmech.control.stabilize import simulate

    caplog.set_level(logging.INFO, logger="diffmech")

    def field(x):  # a harmonic oscillator, x = (q, p)
        return torch.stack([x[..., 1], -x[..., 0]], -1)

    x0 = torch.tensor([[1.0, 0.0], [0.5, 0.2]], dtype=F64)
    t_ref, X_ref = simulate(field, x0, 1.0, 20, progress=False)
    assert _lines(caplog, "diffmech.eigenmode") == []
    t, X = simulate(field, x0, 1.0, 20)
    assert torch.equal(t, t_ref) and torch.equal(X, X_ref)
    lines = _lines(caplog, "diffmech.eigenmode")
    assert len(lines) == 2 and lines[0].startswith("simulate (rk4): 20 steps over 1 s, batch (2,), state 2")
    assert lines[1].startswith("simulate (rk4): done in ") and "(20 steps)" in lines[1]


def test_a_stage_without_steps_logs_one_line_when_it_ran_long(long_after_0, caplog, capsys):
    caplog.set_level(logging.INFO, logger="diffmech")
    log = logging.getLogger("diffmech.test")
    with _progress.Stage(log, "data set", sizes="8 samples", progress=None):
        pass
    with _progress.Stage(log, "quiet", progress=False):
        pass
    lines = _lines(caplog, "diffmech.test")
    assert len(lines) == 1 and lines[0].startswith("data set: 8 samples, done in ")
    with pytest.raises(KeyError), _progress.Stage(log, "failing", 3, progress=None) as stage:
        stage.update()
        raise KeyError("x")
    assert _lines(caplog, "diffmech.test")[-1].startswith("failing: stopped after ")
    assert capsys.readouterr().err == ""


def _without_timings(m: dict) -> str:
    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items()
                if not (k.endswith("_s") or k in ("s_per_step", "seconds"))}
    return json.dumps(strip(m), sort_keys=True)


@pytest.mark.slow
def test_the_training_loops_log_their_stages_and_compute_the_same(long_after_0, tmp_path, caplog):
    from diffmech.control.configs import get_config
    from diffmech.control.eigenmodes import EigenmodeTrainer
    from diffmech.learn.train import TrainConfig, run
    from diffmech.rl.train import train

    caplog.set_level(logging.INFO, logger="diffmech")
    rl = dict(links=2, steps=32, evaluations=1, eval_episodes=2,
              overrides={"num_envs": 4, "horizon": 8, "hidden": [16, 16]})
    symo = TrainConfig(system="pendulum", model="symo", n_ics=2, epochs=2, n_samples=8, n_int=2, int_steps=10)
    out = {}
    for progress in (False, None):
        caplog.clear()
        m_rl = train("nlink-reach", "shac", tmp_path / f"rl{progress}", progress=progress, **rl)
        m_symo = run(symo, tmp_path / f"symo{progress}", progress=progress)
        torch.manual_seed(0)
        tr = EigenmodeTrainer(get_config("tiny", dtype="float64", epochs=2))
        hist = tr.train(progress=progress)
        out[progress] = (_without_timings(m_rl), _without_timings(m_symo),
                         json.dumps([{k: v for k, v in r.items() if k != "train_seconds"} for r in hist]))
        # (a native kernel's build is announced whatever the progress)
        lines = [r.getMessage() for r in caplog.records if r.name in ("diffmech.rl", "diffmech.learn",
                                                                       "diffmech.eigenmode", "diffmech.sim")]
        if progress is False:
            assert lines == []
            continue
        for head, unit in (("rl train shac nlink-reach: ", "32 environment steps"),
                           ("symo train pendulum/symo/N=2: ", "epochs 1 to 2"),
                           ("symo evaluate pendulum/symo/N=2: ", "samples"),
                           ("eigenmode tiny: ", "2 epochs x")):
            mine = [x for x in lines if x.startswith(head)]
            assert len(mine) in (1, 2), (head, lines)
            assert unit in mine[0] and "done in " in mine[-1], mine
    assert out[None] == out[False]
