"""``diffmech rl train`` / ``diffmech rl eval``: the files a run writes, tiny budgets."""

import csv
import json
import math

import pytest

from diffmech.cli import main

pytest.importorskip("gymnasium")


def _train(tmp_path, algo, *extra):
    out = tmp_path / algo
    rc = main(["rl", "train", "--env", "nlink-reach", "--links", "2", "--algo", algo, "--seed", "0", "--out", str(out),
               "--evaluations", "2", "--eval-episodes", "2", "--no-progress", *extra])
    assert rc == 0
    return out


def test_train_and_eval_shac(tmp_path, capsys):
    out = _train(tmp_path, "shac", "--steps", "64", "--set", "num_envs=4", "--set", "horizon=8",
                 "--set", "hidden=[16, 16]", "--env-set", "reset_noise=0.05")
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("max_return", "final_return", "env_steps", "wall_s"):
        assert key in metrics
    assert metrics["env_steps"] == 64 and metrics["max_possible_return"] == pytest.approx(2.0)
    rows = list(csv.DictReader(open(out / "curve.csv")))
    assert float(rows[0]["env_steps"]) == 0 and float(rows[-1]["env_steps"]) == 64
    assert max(float(r["eval_return"]) for r in rows) == pytest.approx(metrics["max_return"])
    assert float(rows[-1]["eval_return"]) == metrics["final_return"]
    config = json.loads((out / "config.json").read_text())
    assert config["algo_config"]["hidden"] == [16, 16] and config["env_kwargs"] == {"reset_noise": 0.05}
    assert (out / "curve.png").stat().st_size > 0 and (out / "checkpoint.pt").exists()
    capsys.readouterr()
    assert main(["rl", "eval", str(out)]) == 0
    ev = json.loads(capsys.readouterr().out)
    assert ev["steps"] == 100 and (out / "eval.gif").read_bytes()[:6] == b"GIF89a"
    assert ev["policy"] == "best"
    assert main(["rl", "eval", str(out), "--final", "--no-gif"]) == 0
    fin = json.loads(capsys.readouterr().out)
    assert fin["policy"] == "final" and math.isfinite(fin["return"])
    # the value, not only its presence: the episode's return telescopes to the change of the tip's squared
    # distance to the target, here from the robot's general forward kinematics along the same episode
    from diffmech.rl.train import _load_policy, evaluate, make_env

    env = make_env("nlink-reach", 1, links=2, seed=config["seed"] + 20_000, **config["env_kwargs"])
    ret, qs, _ = evaluate(env, _load_policy(out, config, env, "final"), record=True)
    assert ret == pytest.approx(fin["return"], rel=1e-6) and fin["steps"] == qs.shape[0] - 1 == 100
    tip = env.robot.link_pose(qs.double(), "tip")[..., :3, 3]
    d2 = (tip - env.target.double()).square().sum(-1)
    assert fin["return"] == pytest.approx(float(d2[0] - d2[-1]), abs=1e-5)
    assert abs(fin["return"]) > 1e-3  # the tip moved: the comparison is not trivially satisfied


def test_train_sb3_sac_and_eval(tmp_path, capsys):
    pytest.importorskip("stable_baselines3")
    out = _train(tmp_path, "sac", "--steps", "40", "--set", "learning_starts=20", "--set", "batch_size=8")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["env_steps"] == 40
    rows = list(csv.DictReader(open(out / "curve.csv")))
    assert [float(r["env_steps"]) for r in rows] == [0, 20, 40]
    assert max(float(r["eval_return"]) for r in rows) == metrics["max_return"]
    assert float(rows[-1]["eval_return"]) == metrics["final_return"]
    assert (out / "model.zip").exists() and (out / "model_best.zip").exists()
    assert main(["rl", "eval", str(out), "--no-gif"]) == 0


def test_bad_setting_is_an_error(tmp_path, capsys):
    rc = main(["rl", "train", "--env", "nlink-reach", "--algo", "shac", "--seed", "0", "--out", str(tmp_path / "x"),
               "--steps", "8", "--set", "no_such=1"])
    assert rc == 2 and "no_such" in capsys.readouterr().err  # a usage error, as a value of the wrong type
    rc = main(["rl", "train", "--env", "ant", "--algo", "shac", "--seed", "0", "--out", str(tmp_path / "y"),
               "--env-set", "frame_skip=0"])
    assert rc == 1 and "frame_skip" in capsys.readouterr().err
    rc = main(["rl", "transplant", str(tmp_path / "no_such_run")])
    assert rc == 1 and "no_such_run" in capsys.readouterr().err


def test_wall_budget_stops_early(tmp_path):
    from diffmech.rl.train import train

    m = train("nlink-reach", "shac", tmp_path / "w", links=1, steps=10_000, max_wall=0.0, evaluations=1,
              eval_episodes=1, progress=False, overrides={"num_envs": 2, "horizon": 4, "hidden": [8]})
    assert m["env_steps"] == 8  # one iteration, then the budget is spent
    assert json.loads((tmp_path / "w" / "config.json").read_text())["algo_config"]["critic_lr"] == 5e-4


def test_the_curve_is_on_disk_after_each_evaluation(tmp_path):
    # a long run can be watched (and one that dies keeps its curve): curve.csv after every evaluation
    import torch

    from diffmech.rl.env import NLinkReach
    from diffmech.rl.train import _Recorder

    env = NLinkReach(1, num_envs=2, seed=0)
    rec = _Recorder(env, lambda obs: torch.zeros(obs.shape[0], 1, dtype=obs.dtype), 10, None, None, 5, tmp_path)
    rec.evaluate()
    rows = list(csv.DictReader(open(tmp_path / "curve.csv")))
    assert len(rows) == 1 and float(rows[0]["env_steps"]) == 0
    rec.advance(10)
    rows = list(csv.DictReader(open(tmp_path / "curve.csv")))
    assert [float(r["env_steps"]) for r in rows] == [0, 10]
    assert float(rows[1]["eval_return"]) == pytest.approx(rec.rows[1]["eval_return"])
    assert not (tmp_path / "curve.csv.tmp").exists()


def test_ant_shac_takes_the_task_windows(tmp_path):
    # the Ant's SHAC windows default to 4 steps (longer windows' gradients grow through the contacts);
    # --set still wins
    out = tmp_path / "ant"
    assert main(["rl", "train", "--env", "ant", "--algo", "shac", "--steps", "8", "--set", "num_envs=2",
                 "--set", "hidden=[8, 8]", "--env-set", "horizon=2", "--evaluations", "1", "--eval-episodes", "1",
                 "--seed", "0", "--out", str(out), "--no-progress"]) == 0
    cfg = json.loads((out / "config.json").read_text())["algo_config"]
    assert cfg["horizon"] == 4 and cfg["num_envs"] == 2
    assert json.loads((out / "metrics.json").read_text())["env_steps"] == 8
    out2 = tmp_path / "ant2"
    assert main(["rl", "train", "--env", "ant", "--algo", "shac", "--steps", "4", "--set", "num_envs=2",
                 "--set", "horizon=2", "--set", "hidden=[8, 8]", "--env-set", "horizon=2", "--evaluations", "1",
                 "--eval-episodes", "1", "--seed", "0", "--out", str(out2), "--no-progress"]) == 0
    assert json.loads((out2 / "config.json").read_text())["algo_config"]["horizon"] == 2


def test_the_gif_follows_a_robot_that_travels(tmp_path):
    # a robot that runs many times its size is followed by the view, one that stays is not
    import numpy as np
    import torch

    from diffmech.rl.render import _follow, save_gif

    body = np.array([[0.0, 0.0, 0.0], [0.5, 0.0, 0.3], [1.0, 0.0, 0.0]])  # (P, 3), 1 m wide
    runs = np.stack([body + [0.2 * k, 0.0, 0.0] for k in range(50)])  # 9.8 m along x
    stays = np.stack([body + [0.01 * k, 0.0, 0.0] for k in range(50)])
    assert _follow(runs) == pytest.approx(0.75) and _follow(stays) is None

    class Fake:
        dt, dtype, device = 0.05, torch.float64, "cpu"

        def draw_points(self, q):
            return torch.as_tensor(runs)[: q.shape[0]]

        def draw_target(self):
            return None

    save_gif(Fake(), torch.zeros(50, 1), tmp_path / "run.gif")
    assert (tmp_path / "run.gif").read_bytes()[:6] == b"GIF89a"
