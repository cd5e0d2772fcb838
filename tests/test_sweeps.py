"""``diffmech rl sweep`` / ``eigenmode sweep`` (and ``symo sweep``'s backends): local pool, resume, Ray.

The jobs are the smallest there are (SHAC on the 2-link reach for 64 steps, the ``tiny`` eigenmode
configuration, a 2-epoch SyMo run); what is checked is the machinery around them: one folder per seed,
the summary over the seeds, resuming, bad options, and that a Ray cluster computes what the local
pool computes, bit for bit (only the timings differ).
"""

from __future__ import annotations

import json
import logging
import math
import time

import pytest

from diffmech.cli import main
from diffmech.sweeps import Run, flatten_numeric, format_table, parse_seeds, summarize

RL = ["--env", "nlink-reach", "--links", "2", "--algo", "shac", "--steps", "64", "--set", "num_envs=4",
      "--set", "horizon=8", "--set", "hidden=[16, 16]", "--evaluations", "2", "--eval-episodes", "2"]
EIGEN = ["--config", "tiny", "--no-plots"]


def _without_timings(metrics: dict) -> str:
    """The metrics as JSON without the clock readings (``*_s``, ``s_per_step``), which no two runs share."""
    def strip(d):
        return {k: strip(v) if isinstance(v, dict) else v for k, v in d.items()
                if not (k.endswith("_s") or k == "s_per_step")}
    return json.dumps(strip(metrics), sort_keys=True)


def _metrics(out, seed) -> dict:
    return json.loads((out / f"seed{seed}" / "metrics.json").read_text())


def _check_summary(out, seeds):
    summary = json.loads((out / "summary.json").read_text())
    assert [r["run"] for r in summary["runs"]] == [f"seed{s}" for s in seeds]
    assert [r["seed"] for r in summary["runs"]] == list(seeds)
    for row, s in zip(summary["runs"], seeds):
        assert row["metrics"] == _metrics(out, s)  # the rows are the runs' metrics.json, unchanged
    for key, st in summary["stats"].items():
        vals = [flatten_numeric(_metrics(out, s))[key] for s in seeds]
        finite = [v for v in vals if math.isfinite(v)]
        assert st["n"] == len(finite)
        if finite:
            mean = sum(finite) / len(finite)
            assert st["mean"] == pytest.approx(mean, rel=1e-12, abs=1e-300)
            assert st["std"] == pytest.approx(math.sqrt(sum((v - mean) ** 2 for v in finite) / len(finite)),
                                              rel=1e-9, abs=1e-300)
            assert (st["min"], st["max"]) == (min(finite), max(finite))
    assert (out / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return summary


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The rl and eigenmode sweeps of seeds 0 and 1 on a local pool of two workers, run once for the
    tests below (each pool worker imports torch and diffmech: seconds that all tests would repeat)."""
    root = tmp_path_factory.mktemp("local")
    outs = {"rl": root / "rl", "eigenmode": root / "eigenmode"}
    assert main(["rl", "sweep", *RL, "--seeds", "0,1", "--workers", "2", "--out", str(outs["rl"])]) == 0
    assert main(["eigenmode", "sweep", *EIGEN, "--seeds", "0,1", "--workers", "2", "--out",
                 str(outs["eigenmode"])]) == 0
    return outs


def test_rl_sweep_two_workers_then_resumes(local, capsys, caplog):
    out = local["rl"]
    summary = _check_summary(out, [0, 1])
    assert summary["stats"]["env_steps"]["mean"] == 64 and summary["options"]["algo"] == "shac"
    assert _metrics(out, 0) != _metrics(out, 1)  # the seeds are passed on
    stamps = [(out / f"seed{s}" / "metrics.json").stat().st_mtime_ns for s in (0, 1)]

    caplog.set_level(logging.INFO, logger="diffmech")
    t0 = time.perf_counter()
    assert main(["rl", "sweep", *RL, "--seeds", "0,1", "--workers", "2", "--out", str(out)]) == 0
    assert time.perf_counter() - t0 < 5  # no worker started, nothing trained
    printed = capsys.readouterr().out
    assert "2 of 2 runs already finished" in printed
    assert "max_return" in printed and "mean" in printed and "seed1" in printed  # the table
    assert sum("not re-run" in r.getMessage() for r in caplog.records) == 2
    assert [(out / f"seed{s}" / "metrics.json").stat().st_mtime_ns for s in (0, 1)] == stamps
    _check_summary(out, [0, 1])

    # another budget in the same folder would mix two sweeps: refused, naming what differs
    assert main(["rl", "sweep", *RL[:-2], "--eval-episodes", "3", "--seeds", "0", "--out", str(out)]) == 1
    assert "eval_episodes" in capsys.readouterr().err


def test_rl_train_seed_defaults_to_0_and_matches_the_sweep_run(tmp_path, capsys):
    # 'rl train' without --seed is seed 0, and the sweep's seed0 is that run (its workers change nothing)
    sweep = tmp_path / "sweep"
    assert main(["rl", "sweep", *RL, "--seeds", "0", "--workers", "1", "--out", str(sweep)]) == 0
    one = tmp_path / "one"
    assert main(["rl", "train", *RL, "--out", str(one), "--no-progress"]) == 0
    assert json.loads((one / "config.json").read_text())["seed"] == 0
    assert _without_timings(json.loads((one / "metrics.json").read_text())) == _without_timings(_metrics(sweep, 0))


def test_rl_eval_of_a_missing_folder_names_it(tmp_path, capsys):
    missing = tmp_path / "no_such_run"
    assert main(["rl", "eval", str(missing)]) == 1
    err = capsys.readouterr().err
    assert str(missing) in err and "does not exist" in err and "Errno" not in err
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["rl", "eval", str(empty)]) == 1
    err = capsys.readouterr().err
    assert "not a run folder" in err and "Errno" not in err


def test_eigenmode_sweep_two_seeds(local):
    out = local["eigenmode"]
    summary = _check_summary(out, [0, 1])
    assert summary["stats"]["period"]["std"] == 0.0  # tiny's period is fixed
    assert _metrics(out, 0)["effort"] != _metrics(out, 1)["effort"]
    assert (out / "seed0" / "trajectory.csv").exists()


@pytest.mark.parametrize("job", ["rl", "eigenmode"])
@pytest.mark.parametrize("args, option", [(["--seeds", "x"], "--seeds"), (["--seeds", "0,0"], "--seeds"),
                                          (["--workers", "0"], "--workers"), (["--backend", "foo"], "--backend")])
def test_bad_options_are_named(tmp_path, capsys, job, args, option):
    cmd = ["rl", "sweep", *RL] if job == "rl" else ["eigenmode", "sweep", *EIGEN]
    with pytest.raises(SystemExit) as exc:
        main([*cmd, *args, "--out", str(tmp_path / "o")])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert option in err and "Traceback" not in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("job", ["rl", "eigenmode"])
def test_out_that_is_a_file_is_named(tmp_path, capsys, job):
    f = tmp_path / "a_file"
    f.write_text("")
    cmd = ["rl", "sweep", *RL] if job == "rl" else ["eigenmode", "sweep", *EIGEN]
    assert main([*cmd, "--seeds", "0", "--out", str(f)]) == 1
    err = capsys.readouterr().err
    assert "--out" in err and str(f) in err and "Traceback" not in err


def test_seed_lists_and_the_summary_of_unfinished_runs(tmp_path):
    assert parse_seeds("0-2,7") == [0, 1, 2, 7] and parse_seeds(" 3 ") == [3]
    for name, m in (("a", {"x": 1.0, "n": {"y": 2}, "flag": True}), ("b", {"x": float("nan"), "n": {"y": 4}})):
        (tmp_path / name).mkdir()
        (tmp_path / name / "metrics.json").write_text(json.dumps(m))
    runs = [Run(n, "unused:unused") for n in ("a", "b", "c")]
    s = summarize(tmp_path, runs)
    assert s["missing"] == ["c"] and "flag" not in s["stats"]
    assert s["stats"]["x"] == {"mean": 1.0, "std": 0.0, "min": 1.0, "max": 1.0, "n": 1, "n_nonfinite": 1}
    assert s["stats"]["n.y"]["mean"] == 3.0 and s["stats"]["n.y"]["std"] == 1.0
    table = format_table(s, ["x", "n.y", "absent"])
    assert "n.y" in table and "absent" not in table and len(table.splitlines()) == 2 + 2 + 1 + 4


def test_a_failed_run_is_reported_and_the_others_summarised(tmp_path, capsys):
    from diffmech.errors import DiffmechError
    from diffmech.sweeps import execute, seed_sweep

    outcomes = execute([Run("bad", "diffmech.sweeps:no_such_job")], tmp_path / "x", workers=1, progress=False)
    assert outcomes[0].status == "failed" and "no_such_job" in outcomes[0].error
    with pytest.raises(DiffmechError, match="1 run\\(s\\) failed"):
        seed_sweep("rl train", "diffmech.rl.cli:_sweep_job", {"env": "nlink-reach", "algo": "no-such-algo"}, [0],
                   tmp_path / "y", workers=1)
    summary = json.loads((tmp_path / "y" / "summary.json").read_text())
    assert summary["runs"] == [] and summary["missing"] == ["seed0"] and "no-such-algo" in summary["errors"]["seed0"]


# ---------------------------------------------------------------------------- Ray
@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    # the sweeps use an initialised Ray as it is; a two-CPU local cluster, as the local pools below
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.parametrize("job", ["eigenmode", "rl"])
def test_sweeps_on_ray_equal_the_local_pool(tmp_path, capsys, ray_cluster, local, job):
    cmd = ["rl", "sweep", *RL] if job == "rl" else ["eigenmode", "sweep", *EIGEN]
    remote = tmp_path / job
    assert main([*cmd, "--seeds", "0,1", "--backend", "ray", "--out", str(remote)]) == 0
    _check_summary(remote, [0, 1])
    here = ray_cluster.get_runtime_context().get_node_id()  # the one node of this cluster ran both
    assert json.loads((remote / "sweep.json").read_text())["nodes"] == {"seed0": here, "seed1": here}
    assert json.loads((local[job] / "sweep.json").read_text())["nodes"] == {}  # no Ray node on the local pool
    for s in (0, 1):
        assert _without_timings(_metrics(remote, s)) == _without_timings(_metrics(local[job], s)), s
        # the run's files come back from the Ray worker's scratch folder, all of them
        assert sorted(p.name for p in (remote / f"seed{s}").iterdir()) == \
            sorted(p.name for p in (local[job] / f"seed{s}").iterdir())
        if job == "eigenmode":
            assert (remote / f"seed{s}" / "trajectory.csv").read_bytes() == \
                (local[job] / f"seed{s}" / "trajectory.csv").read_bytes()
    capsys.readouterr()
    # resuming works the same on Ray: nothing is sent to the cluster
    assert main([*cmd, "--seeds", "0,1", "--backend", "ray", "--out", str(remote)]) == 0
    assert "2 of 2 runs already finished" in capsys.readouterr().out


def test_symo_sweep_on_ray_equals_in_process(tmp_path, ray_cluster, monkeypatch):
    # the path of 'symo sweep --backend ray', which no test ran before
    from diffmech.learn.sweep import sweep
    from diffmech.learn.train import TrainConfig

    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path / "cache"))
    base = TrainConfig(system="pendulum", model="symo", n_ics=2, epochs=2, n_samples=8, n_int=2, int_steps=10)
    here = sweep(base, tmp_path / "local", models=("symo",), n_ics=(2,), workers=1, progress=False)
    there = sweep(base, tmp_path / "ray", models=("symo",), n_ics=(2,), backend="ray", progress=False)
    assert [_without_timings(r) for r in there] == [_without_timings(r) for r in here]
    assert (tmp_path / "ray" / "symo" / "N2" / "checkpoint.pt").exists()


@pytest.mark.slow
def test_rl_sweep_on_a_cluster_of_two_nodes_runs_on_both(tmp_path, local):
    # docs/sweeps.md's cluster of several machines, on this one: a head and a second node of one CPU each
    # (ray start --head; ray start --address=HEAD:PORT), and what a user of it runs: the command line,
    # another process, joins the running cluster by the head's address (it starts no Ray of its own),
    # and with both seeds in flight at once each node runs one
    import subprocess
    import sys

    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        nodes = {cluster.head_node.node_id, *(n.node_id for n in cluster.worker_nodes)}
        assert len(nodes) == 2
        out = tmp_path / "two_nodes"
        r = subprocess.run([sys.executable, "-m", "diffmech", "rl", "sweep", *RL, "--seeds", "0,1", "--backend",
                            "ray", "--address", cluster.address, "--out", str(out)],
                           capture_output=True, text=True, timeout=300)
    finally:
        cluster.shutdown()
    assert r.returncode == 0, r.stderr[-3000:]
    assert "Started a local Ray instance" not in r.stderr
    ran = json.loads((out / "sweep.json").read_text())["nodes"]  # the node of each run, as Ray reports it
    assert sorted(ran) == ["seed0", "seed1"] and set(ran.values()) == nodes
    _check_summary(out, [0, 1])
    for s in (0, 1):
        assert _without_timings(_metrics(out, s)) == _without_timings(_metrics(local["rl"], s))
        assert sorted(p.name for p in (out / f"seed{s}").iterdir()) == \
            sorted(p.name for p in (local["rl"] / f"seed{s}").iterdir())
