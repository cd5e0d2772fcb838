"""Bad command-line input gets one clear line and a non-zero exit status, never a traceback or a silent
success (issue 35, items 5, 8 and 9). Every check here happens before any work: nothing trains."""

from __future__ import annotations

import json
import os

import pytest

from diffmech import cli_checks
from diffmech.cli import main
from diffmech.cli_checks import RunFolderError, prepare_run_folder


def run_cli(argv, capsys) -> tuple[int, str]:
    """``diffmech ARGV`` in this process: (exit status, stderr + stdout)."""
    try:
        rc = main([str(a) for a in argv])
    except SystemExit as exc:  # argparse's usage errors
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.err + out.out


def symo(out):
    return ["symo", "train", "--out", out]


def eig(out):
    return ["eigenmode", "learn", "--config", "tiny", "--out", out]


def rl(out):
    return ["rl", "train", "--env", "nlink-reach", "--algo", "shac", "--out", out]


# (command builder, extra arguments, the option the message must name); exit status 2
USAGE = [
    (symo, ["--n-ics", "0"], "--n-ics"),
    (symo, ["--width", "0"], "--width"),
    (symo, ["--device", "bogus"], "--device"),
    (symo, ["--epochs", "-5"], "--epochs"),
    (symo, ["--epochs", "0"], "--epochs"),
    (symo, ["--h", "0"], "--h"),
    (symo, ["--h", "nan"], "--h"),
    (symo, ["--lr", "inf"], "--lr"),
    (symo, ["--batch-size", "0"], "--batch-size"),
    (symo, ["--n-samples", "1"], "--n-samples"),
    (symo, ["--int-steps", "0"], "--int-steps"),
    (symo, ["--newton-tol", "-1"], "--newton-tol"),
    (symo, ["--threads", "0"], "--threads"),
    (symo, ["--epochs", "abc"], "--epochs"),
    (eig, ["--period", "0"], "--period"),
    (eig, ["--period", "-1"], "--period"),
    (eig, ["--period", "nan"], "--period"),
    (eig, ["--steps-per-epoch", "0"], "--steps-per-epoch"),
    (eig, ["--epochs", "0"], "--epochs"),
    (eig, ["--lr", "-1e-3"], "--lr"),
    (eig, ["--effort", "-1"], "--effort"),
    (eig, ["--q0", "nan", "0"], "--q0"),
    (eig, ["--device", "bogus"], "--device"),
    (eig, ["--stop-ee", "0"], "--stop-ee"),
    (eig, ["--threads", "0"], "--threads"),
    (eig, ["--resume", "--overwrite"], "--overwrite"),
    (rl, ["--max-wall", "-1"], "--max-wall"),
    (rl, ["--steps", "0"], "--steps"),
    (rl, ["--evaluations", "0"], "--evaluations"),
    (rl, ["--eval-episodes", "0"], "--eval-episodes"),
    (rl, ["--links", "0"], "--links"),
    (rl, ["--device", "bogus"], "--device"),
    (rl, ["--set", "num_envs=abc"], "num_envs"),
    (rl, ["--set", "horizon=1.5"], "horizon"),
    (rl, ["--set", "actor_lr=nan"], "actor_lr"),
    (rl, ["--set", "num_envs"], "--set"),
]


@pytest.mark.parametrize("cmd, extra, option", USAGE,
                         ids=[f"{c.__name__}{''.join(e)}" for c, e, _ in USAGE])
def test_usage_errors(tmp_path, capsys, cmd, extra, option):
    out = tmp_path / "run"
    rc, text = run_cli([*cmd(out), *extra], capsys)
    assert rc == 2, text
    assert option in text and "Traceback" not in text
    assert not out.exists()  # refused before any work


@pytest.mark.parametrize("argv, option", [
    (["symo", "train", "--out", ""], "--out"),
    (["eigenmode", "learn", "--config", "tiny", "--out", " "], "--out"),
    (["rl", "train", "--env", "nlink-reach", "--algo", "shac", "--out", ""], "--out"),
    (["sim", "run", "golf", "--out", ""], "--out"),
    (["sim", "run", "golf", "--seconds", "0"], "--seconds"),
    (["sim", "run", "golf", "--dt", "-1"], "--dt"),
    (["sim", "run", "racecar", "--friction", "-1"], "--friction"),
    (["symo", "sweep", "--n-ics", "0,4", "--out", "{tmp}/s"], "--n-ics"),
    (["symo", "sweep", "--n-ics", "4,x", "--out", "{tmp}/s"], "--n-ics"),
    (["symo", "sweep", "--models", "symo,bogus", "--out", "{tmp}/s"], "--models"),
    (["symo", "figures", "{tmp}", "--n-ics", "0"], "--n-ics"),
    (["symo", "evaluate", "{tmp}", "--int-steps", "0"], "--int-steps"),
    (["eigenmode", "stabilize", "{tmp}", "--periods", "0"], "--periods"),
    (["eigenmode", "stabilize", "{tmp}", "--grid", "0"], "--grid"),
    (["eigenmode", "stabilize", "{tmp}", "--monodromy-steps", "1"], "--monodromy-steps"),
    (["eigenmode", "stabilize", "{tmp}", "--damping", "-1"], "--damping"),
    (["rl", "transplant", "{tmp}", "--episodes", "0"], "--episodes"),
    (["info", "{tmp}/x.urdf", "--batch", "0"], "--batch"),
    (["view", "{tmp}/x.urdf", "--dt", "0"], "--dt"),
    (["view", "{tmp}/x.urdf", "--max-faces", "-3"], "--max-faces"),
    (["view", "{tmp}/x.urdf", "--q", "nan"], "--q"),
    (["view", "{tmp}/x.urdf", "--out", ""], "--out"),
    (["demo", "--batch", "0"], "--batch"),
    (["demo", "--points", "1"], "--points"),
    (["demo", "--tol", "-1e-8"], "--tol"),
    (["demo", "--out", ""], "--out"),
])
def test_more_usage_errors(tmp_path, capsys, argv, option):
    rc, text = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert rc == 2, text
    assert option in text and "Traceback" not in text
    assert not (tmp_path / "s").exists()


# ---------------------------------------------------------------------------- folders and files: status 1
@pytest.fixture
def a_file(tmp_path):
    f = tmp_path / "a_file"
    f.write_text("not a folder")
    return f


@pytest.mark.parametrize("cmd", [symo, eig, rl, lambda out: ["sim", "run", "golf", "--out", out]],
                         ids=["symo", "eigenmode", "rl", "sim"])
@pytest.mark.parametrize("where", ["file", "inside-file", "read-only"])
def test_out_that_cannot_be_written(tmp_path, capsys, monkeypatch, a_file, cmd, where):
    out = {"file": a_file, "inside-file": a_file / "run", "read-only": tmp_path / "ro" / "run"}[where]
    if where == "read-only":
        (tmp_path / "ro").mkdir()
        real = cli_checks.tempfile.mkstemp

        def mkstemp(*args, dir=None, **kw):  # a read-only folder, also for root (whom chmod does not stop)
            if dir is not None and str(dir).startswith(str(tmp_path / "ro")):
                raise PermissionError(13, "Permission denied")
            return real(*args, dir=dir, **kw)

        monkeypatch.setattr(cli_checks.tempfile, "mkstemp", mkstemp)
    rc, text = run_cli(cmd(out), capsys)
    assert rc == 1, text
    assert "--out" in text and str(out) in text and "Traceback" not in text
    assert a_file.read_text() == "not a folder"


@pytest.mark.parametrize("argv, needle", [
    (["symo", "figures", "{tmp}/missing"], "does not exist"),
    (["symo", "figures", "{tmp}"], "no finished run"),
    (["symo", "evaluate", "{tmp}/missing"], "does not exist"),
    (["symo", "evaluate", "{tmp}"], "config.json"),
    (["eigenmode", "stabilize", "{tmp}/missing"], "does not exist"),
    (["eigenmode", "stabilize", "{tmp}"], "checkpoint.pt"),
    (["eigenmode", "report", "{tmp}/missing"], "does not exist"),
    (["rl", "eval", "{tmp}/missing"], "does not exist"),
    (["rl", "eval", "{tmp}"], "not a run folder"),
])
def test_missing_inputs_are_named(tmp_path, capsys, argv, needle):
    rc, text = run_cli([a.replace("{tmp}", str(tmp_path)) for a in argv], capsys)
    assert rc == 1, text
    assert needle in text and str(tmp_path) in text and "Traceback" not in text


def _symo_run(folder, checkpoint: bytes | dict):
    import torch

    from diffmech.learn.train import TrainConfig

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TrainConfig(model="symo", n_ics=2, epochs=1).to_json()))
    if isinstance(checkpoint, bytes):
        (folder / "checkpoint.pt").write_bytes(checkpoint)
    else:
        torch.save(checkpoint, folder / "checkpoint.pt")


def _truncated(tmp_path) -> bytes:
    import torch

    torch.save({"model": {"w": torch.zeros(100)}, "x": list(range(1000))}, tmp_path / "whole.pt")
    raw = (tmp_path / "whole.pt").read_bytes()
    return raw[: len(raw) // 2]


@pytest.mark.parametrize("kind", ["truncated", "foreign", "mismatched"])
def test_bad_symo_checkpoint_is_named(tmp_path, capsys, kind):
    import torch

    ck = {"truncated": _truncated(tmp_path), "foreign": {"something": 1},
          "mismatched": {"model": {"no_such.weight": torch.zeros(3)}}}[kind]
    run = tmp_path / "run"
    _symo_run(run, ck)
    rc, text = run_cli(["symo", "evaluate", run], capsys)
    assert rc == 1, text
    assert str(run / "checkpoint.pt") in text and "Traceback" not in text
    rc, text = run_cli(["symo", "train", "--model", "symo", "--n-ics", "2", "--epochs", "1", "--out", run,
                        "--resume"], capsys)
    assert rc == 1, text
    assert str(run / "checkpoint.pt") in text and "Traceback" not in text


def test_bad_symo_config_is_named(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.json").write_text("{ truncated")
    (run / "checkpoint.pt").write_bytes(b"")
    rc, text = run_cli(["symo", "evaluate", run], capsys)
    assert rc == 1 and str(run / "config.json") in text and "Traceback" not in text


@pytest.mark.parametrize("kind", ["truncated", "foreign", "empty", "mismatched"])
def test_bad_eigenmode_checkpoint_is_named(tmp_path, capsys, kind):
    import torch

    run = tmp_path / "run"
    run.mkdir()
    path = run / "checkpoint.pt"
    if kind == "truncated":
        path.write_bytes(_truncated(tmp_path))
    elif kind == "foreign":
        torch.save({"model": 1}, path)
    elif kind == "mismatched":  # a checkpoint of another network than its configuration builds
        from diffmech.control.configs import get_config
        from diffmech.control.eigenmodes import EigenmodeTrainer

        state = EigenmodeTrainer(get_config("tiny")).state_dict()
        state["potential"] = {"no_such.weight": torch.zeros(3)}
        torch.save(state, path)
    else:
        path.write_bytes(b"")
    for argv in (["eigenmode", "learn", "--config", "tiny", "--out", run, "--resume"],
                 ["eigenmode", "stabilize", run]):
        rc, text = run_cli(argv, capsys)
        assert rc == 1, text
        assert str(path) in text and "Traceback" not in text


def test_bad_eigenmode_metrics_are_named(tmp_path, capsys):
    (tmp_path / "metrics.json").write_text("[1, 2")
    rc, text = run_cli(["eigenmode", "report", tmp_path], capsys)
    assert rc == 1 and str(tmp_path / "metrics.json") in text and "Traceback" not in text


@pytest.mark.parametrize("kind", ["truncated", "foreign", "bad-config", "mismatched"])
def test_bad_rl_run_is_named(tmp_path, capsys, kind):
    import dataclasses

    import torch

    from diffmech.rl.shac import SHACConfig

    run = tmp_path / "run"
    run.mkdir()
    config = {"env": "nlink-reach", "algo": "shac", "links": 2, "seed": 0}
    (run / "config.json").write_text("{" if kind == "bad-config" else json.dumps(config))
    if kind == "truncated":
        (run / "checkpoint_best.pt").write_bytes(_truncated(tmp_path))
    elif kind == "mismatched":
        torch.save({"algo": "shac", "config": dataclasses.asdict(SHACConfig(num_envs=2)),
                    "state": {"no_such": torch.zeros(2)}}, run / "checkpoint_best.pt")
    else:
        torch.save({"algo": "shac"}, run / "checkpoint_best.pt")
    rc, text = run_cli(["rl", "eval", run, "--no-gif"], capsys)
    assert rc == 1, text
    culprit = run / ("config.json" if kind == "bad-config" else "checkpoint_best.pt")
    assert str(culprit) in text and "Traceback" not in text


def test_debug_flag_reraises(tmp_path):
    with pytest.raises(RunFolderError):
        main(["--debug", "symo", "figures", str(tmp_path / "missing")])


def test_unexpected_error_is_one_line(tmp_path, capsys, monkeypatch):
    import diffmech.learn.cli as learn_cli

    def boom(*a, **k):
        raise ZeroDivisionError("a bug")

    monkeypatch.setattr(learn_cli, "_int_list", boom)
    rc, text = run_cli(["symo", "sweep", "--out", tmp_path / "s"], capsys)
    assert rc == 1 and "ZeroDivisionError: a bug" in text and "--debug" in text and "Traceback" not in text
    with pytest.raises(ZeroDivisionError):
        main(["--debug", "symo", "sweep", "--out", str(tmp_path / "s")])


# ---------------------------------------------------------------------------- run folders: item 5
RUNS = {
    "symo": (symo, "checkpoint.pt", True),
    "eigenmode": (eig, "checkpoint.pt", True),
    "eigenmode-finished": (eig, "metrics.json", True),
    "rl": (rl, "config.json", False),
    "sim": (lambda out: ["sim", "run", "golf", "--out", out], "results.json", False),
}


@pytest.mark.parametrize("name", list(RUNS))
def test_existing_run_is_not_overwritten(tmp_path, capsys, name):
    cmd, marker, resumable = RUNS[name]
    out = tmp_path / "run"
    out.mkdir()
    (out / marker).write_text("the earlier run")
    rc, text = run_cli(cmd(out), capsys)
    assert rc == 1, text
    assert str(out) in text and "--overwrite" in text and ("--resume" in text) == resumable
    assert "Traceback" not in text
    assert (out / marker).read_text() == "the earlier run"
    assert sorted(os.listdir(out)) == [marker]


def test_overwrite_removes_the_run_files_only(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    for name in ("checkpoint.pt", "history.csv", "notes.txt"):
        (out / name).write_text("x")
    with pytest.raises(RunFolderError, match="--resume to continue it, --overwrite to replace it"):
        prepare_run_folder(out, markers=("checkpoint.pt", "metrics.json"), remove=("history.csv",))
    assert prepare_run_folder(out, markers=("checkpoint.pt", "metrics.json"), remove=("history.csv",),
                              resume=True) == out
    assert sorted(os.listdir(out)) == ["checkpoint.pt", "history.csv", "notes.txt"]
    prepare_run_folder(out, markers=("checkpoint.pt", "metrics.json"), remove=("history.csv",), overwrite=True)
    assert sorted(os.listdir(out)) == ["notes.txt"]


def test_eigenmode_sweep_job_resumes_its_seed_folders(tmp_path, monkeypatch):
    # a sweep resumes by design: its runs are not refused for the checkpoint an interruption left
    import argparse

    from diffmech.control import cli as eig_cli
    from diffmech.control import experiment

    seen = {}

    def learn(args: argparse.Namespace):
        seen.update(vars(args))
        return {}

    monkeypatch.setattr(experiment, "learn", learn)
    eig_cli._sweep_job(str(tmp_path / "seed0"), progress=False, resume=False, config="tiny")
    assert seen["resume"] is True and seen["overwrite"] is False
