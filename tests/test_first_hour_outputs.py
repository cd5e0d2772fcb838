"""Outputs that explain themselves (issue 36, items 4 and 5): summaries that print as tables,
readable parameter names, run folders that say what their numbers are, GIFs with visual meshes."""

from __future__ import annotations

import csv
import json
import warnings
from pathlib import Path

import pytest
import torch

from diffmech import load_urdf
from diffmech.model import systems

DOCS = Path(__file__).resolve().parents[1] / "docs"

# A one-joint arm whose link has a <visual> box and a different <collision> sphere: what the
# animation draws tells which of the two it used.
ARM = """<robot name="arm">
  <link name="base"/>
  <link name="arm_link">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <visual><origin xyz="0.2 0 0"/><geometry><box size="0.4 0.05 0.05"/></geometry>
      <material name="red"><color rgba="0.8 0.1 0.1 1"/></material></visual>
    <collision><origin xyz="0.4 0 0"/><geometry><sphere radius="0.03"/></geometry></collision>
  </link>
  <joint name="hinge" type="revolute">
    <parent link="base"/><child link="arm_link"/><origin xyz="0 0 0.5"/><axis xyz="0 1 0"/>
    <limit lower="-3" upper="3" effort="10" velocity="5"/>
  </joint>
</robot>
"""


# ---------------------------------------------------------------------------- item 5: small bumps
def test_summary_is_a_dict_that_prints_as_a_table():
    robot = systems.acrobot()
    s = robot.summary()
    assert isinstance(s, dict)
    assert s["nq"] == 2 and s["joint_types"] == {"continuous": 2, "fixed": 1}
    assert dict(s) == json.loads(json.dumps(s))  # still plain data
    text = str(s)
    assert repr(s) == text
    lines = text.splitlines()
    assert len(lines) == len(s)
    assert lines[0].split() == ["name", "acrobot"]
    assert any(line.split()[:1] == ["total_mass"] and line.endswith("kg") for line in lines)
    # the key column is aligned: every value starts at the same column
    starts = {len(line) - len(line[len(key):].lstrip()) for line, key in zip(lines, s)}
    assert len(starts) == 1


def test_summary_of_a_learnable_mass_does_not_warn():
    robot = systems.acrobot()
    robot.make_link_param_learnable(robot.link_names[-1], "mass")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert robot.summary()["total_mass"] == pytest.approx(2.0)


def test_parameter_names_map_module_paths_to_link_names():
    robot = systems.acrobot()
    robot.make_link_param_learnable(robot.link_names[-1], "mass")
    robot.make_link_param_learnable(robot.link_names[-1], "damping")
    robot.freeze_link_param(robot.link_names[-1], "damping")
    k = robot.link_names.index(robot.link_names[-1])
    names = robot.parameter_names()
    assert names[f"links.{k}.mass"] == f"{robot.link_names[-1]}.mass"
    assert set(names) == {n for n, _ in robot.named_parameters()}
    trainable = robot.parameter_names(trainable_only=True)
    assert sorted(trainable.values()) == sorted(robot.learnable_parameters())
    assert set(trainable) == set(robot.learnable_parameters(readable=False))
    # the module paths stay the state_dict keys, so saved models load as before
    twin = systems.acrobot()
    twin.make_link_param_learnable(robot.link_names[-1], "mass")
    twin.make_link_param_learnable(robot.link_names[-1], "damping")
    twin.load_state_dict(robot.state_dict())
    assert all(n in robot.state_dict() for n in names)


def test_ant_observation_quaternion_order_is_documented():
    from diffmech.rl.ant import Ant

    assert "(w, x, y, z)" in Ant.__doc__ and "(x, y, z, w)" in Ant.__doc__ and "Ant-v5" in Ant.__doc__
    page = (DOCS / "tutorials" / "reinforcement-learning.md").read_text()
    assert "`(w, x, y, z)`" in page and "`(x, y, z, w)`" in page


# ---------------------------------------------------------------------------- item 4: outputs agree
def test_metrics_json_defines_what_differs_from_the_history(tmp_path):
    from diffmech.learn import TrainConfig, run

    cfg = TrainConfig(system="pendulum", model="symo", n_ics=2, epochs=2, n_samples=8, n_int=2, int_steps=10,
                      checkpoint_every=1, log_every=1)
    m = run(cfg, tmp_path / "run", progress=False)
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved == json.loads(json.dumps(m))
    with open(tmp_path / "run" / "history.csv") as f:
        last = list(csv.DictReader(f))[-1]
    # the history's objective is in metrics.json under its own name ...
    assert saved["final_test_objective"] == pytest.approx(float(last["test_objective"]), rel=1e-12)
    assert saved["final_train_objective"] == pytest.approx(float(last["train_objective"]), rel=1e-12)
    # ... the paper's test error is the same quantity in both files ...
    assert saved["test_loss"] == pytest.approx(float(last["test_loss"]), rel=1e-9)
    # ... and every name a reader might confuse is defined in one line, the SyMo objective as a residual
    d = saved["definitions"]
    for key in ("train_objective", "test_objective", "train_loss", "test_loss", "eval_newton_failures"):
        assert isinstance(d[key], str) and "\n" not in d[key], key
    assert "residual" in d["train_objective"]
    assert list(saved)[-1] == "definitions"
    page = (DOCS / "tutorials" / "learned-dynamics.md").read_text()
    assert "final_test_objective" in page and "`definitions`" in page


def _arm_scene():
    from diffmech.sim import Scene

    return Scene({"arm": load_urdf(ARM)}, ground=True)


def test_animation_draws_visual_meshes(tmp_path, monkeypatch):
    import matplotlib
    import trimesh  # noqa: F401  (the viz extra, in the test extra: missing, the test fails)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from diffmech.sim import render
    from diffmech.viz import geometry

    calls = []
    real = geometry.link_meshes
    monkeypatch.setattr(geometry, "link_meshes", lambda *a, **k: calls.append(a[0].name) or real(*a, **k))
    scene = _arm_scene()
    meshes = render.scene_meshes(scene)
    assert calls == ["arm"] and [m.kind for m in meshes["arm"]] == ["visual"]
    fig = plt.figure()
    ax = fig.add_subplot(projection="3d")
    n = render.draw_scene(ax, scene, scene.neutral_configuration(), meshes)
    assert n == 12  # the box's triangles
    assert len(ax.collections) == 1 and len(ax.lines) == 0  # the visual box, not the collision sphere
    tris = render.scene_triangles(scene, scene.neutral_configuration(), meshes)[0][1]
    assert tris[..., 0].max() == pytest.approx(0.4) and tris[..., 2].min() == pytest.approx(0.475)
    plt.close(fig)
    q = torch.stack([scene.neutral_configuration(), scene.neutral_configuration() + 0.3])
    assert render.animate_scene(scene, q, str(tmp_path / "a.gif"), dt=0.04) == 2
    assert (tmp_path / "a.gif").stat().st_size > 0


def test_animation_without_trimesh_draws_collision_shapes_with_one_warning(monkeypatch):
    import importlib.util

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from diffmech.sim import render

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "trimesh" else real(name, *a))
    scene = _arm_scene()
    with pytest.warns(UserWarning, match="trimesh") as rec:
        meshes = render.scene_meshes(scene)
    assert meshes == {} and len([w for w in rec if "trimesh" in str(w.message)]) == 1
    fig = plt.figure()
    ax = fig.add_subplot(projection="3d")
    assert render.draw_scene(ax, scene, scene.neutral_configuration(), meshes) == 0
    assert len(ax.lines) > 0 and len(ax.collections) == 0
    plt.close(fig)


def test_tiny_eigenmode_run_says_it_is_a_smoke_test(tmp_path, capsys):
    from diffmech.cli import main
    from diffmech.control import experiment
    from diffmech.control.configs import CONFIGS, get_config, smoke_test_note

    assert smoke_test_note(get_config("tiny")) and smoke_test_note(get_config("main")) is None
    assert [n for n, c in CONFIGS.items() if c.smoke_test] == ["tiny"]
    out = str(tmp_path / "run")
    assert main(["eigenmode", "learn", "--config", "tiny", "--epochs", "2", "--out", out, "--no-plots",
                 "--no-progress"]) == 0
    printed = capsys.readouterr().out.splitlines()
    m = json.loads((Path(out) / "metrics.json").read_text())
    assert m["smoke_test"] is True and "not the paper's" in m["note"]
    i = next(k for k, line in enumerate(printed) if "end-effector error" in line)
    assert printed[i - 1] == m["note"]  # said before the numbers, not after
    assert m["note"] in experiment.report(out)
    # a real configuration's summary carries no such line
    m_main = dict(m, config="main", smoke_test=False)
    del m_main["note"]
    assert "smoke" not in experiment.format_metrics(m_main)
