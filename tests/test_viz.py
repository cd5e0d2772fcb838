"""diffmech.viz: the 3-D view of robots and scenes (plotly figure, self-contained HTML, CLI)."""

import base64
import importlib.util
import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

pytest.importorskip("plotly")
trimesh = pytest.importorskip("trimesh")

from diffmech import cli, load_urdf, viz  # noqa: E402
from diffmech.errors import DiffmechError, OptionError, ShapeError  # noqa: E402
from diffmech.model import systems  # noqa: E402
from diffmech.sim import Scene  # noqa: E402

# The mesh of link1: an irregular tetrahedron, so that a wrong rotation or a mirrored axis shows.
TETRA = np.array([[0.0, 0.0, 0.0], [0.3, 0.0, 0.0], [0.0, 0.2, 0.0], [0.0, 0.0, 0.1]])
TETRA_FACES = np.array([[0, 2, 1], [0, 1, 3], [0, 3, 2], [1, 2, 3]])
MESH_XYZ, MESH_RPY, MESH_SCALE = (0.2, 0.0, 0.05), (0.0, 0.0, math.pi / 2), 0.5
J1_Z, J2_X = 0.1, 0.4  # joint origins: joint1 (z axis) at z = 0.1, joint2 (y axis) 0.4 along link1's x
BOX2 = (0.3, 0.05, 0.04)  # link2's collision box (no <visual>), centred 0.15 along link2's x

URDF = f"""<?xml version="1.0"?>
<robot name="bot">
  <link name="base"/>
  <link name="link1">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <visual>
      <origin xyz="{' '.join(map(str, MESH_XYZ))}" rpy="{' '.join(map(str, MESH_RPY))}"/>
      <geometry><mesh filename="package://bot/meshes/part.stl" scale="{MESH_SCALE} {MESH_SCALE} {MESH_SCALE}"/>
      </geometry>
      <material name="orange"><color rgba="1 0.5 0 1"/></material>
    </visual>
  </link>
  <link name="link2">
    <inertial><mass value="1"/><inertia ixx="0.01" iyy="0.01" izz="0.01" ixy="0" ixz="0" iyz="0"/></inertial>
    <collision>
      <origin xyz="0.15 0 0"/>
      <geometry><box size="{' '.join(map(str, BOX2))}"/></geometry>
    </collision>
  </link>
  <joint name="joint1" type="revolute">
    <parent link="base"/><child link="link1"/><origin xyz="0 0 {J1_Z}"/><axis xyz="0 0 1"/>
    <limit lower="-3" upper="3" effort="10" velocity="1"/>
  </joint>
  <joint name="joint2" type="revolute">
    <parent link="link1"/><child link="link2"/><origin xyz="{J2_X} 0 0"/><axis xyz="0 1 0"/>
    <limit lower="-3" upper="3" effort="10" velocity="1"/>
  </joint>
</robot>
"""


@pytest.fixture
def bot(tmp_path):
    """A two-joint arm in a ROS-like package folder ``tmp/bot/{urdf,meshes}``; returns the URDF path."""
    (tmp_path / "bot" / "urdf").mkdir(parents=True)
    (tmp_path / "bot" / "meshes").mkdir()
    trimesh.Trimesh(TETRA, TETRA_FACES, process=False).export(tmp_path / "bot" / "meshes" / "part.stl")
    path = tmp_path / "bot" / "urdf" / "bot.urdf"
    path.write_text(URDF)
    return str(path)


def _rz(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, -s, 0.0], [s, c, 0.0], [0.0, 0.0, 1.0]])


def _ry(a):
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0.0, s], [0.0, 1.0, 0.0], [-s, 0.0, c]])


def _trace(fig, name):
    (k,) = [i for i, d in enumerate(fig.data) if d.name == name]
    return k


def _frame_xyz(fig, t, k):
    """World vertices of trace ``k`` at frame ``t`` (the base trace where the frame leaves it out)."""
    frame = fig.frames[t]
    d = frame.data[list(frame.traces).index(k)] if k in frame.traces else fig.data[k]

    def values(a):  # frames hold base64 float32 typed arrays, the base traces numpy arrays
        if isinstance(a, dict):
            assert a["dtype"] == "f4"
            return np.frombuffer(base64.b64decode(a["bdata"]), dtype="<f4").astype(np.float64)
        return np.asarray(a, dtype=np.float64)

    return np.stack([values(d.x), values(d.y), values(d.z)], -1)


def _same_points(a, b, tol):
    """Each point of ``a`` has one of ``b`` within ``tol`` and vice versa (order-free comparison)."""
    d = np.linalg.norm(a[:, None] - b[None], axis=-1)
    return d.min(1).max() < tol and d.min(0).max() < tol


def _frames_in_html(text):
    m = re.search(r"Plotly\.addFrames\(\s*['\"][^'\"]+['\"],\s*(\[.*\])\);", text, re.S)
    return json.loads(m.group(1)) if m else []


def test_link_vertices_follow_forward_kinematics(bot):
    robot = load_urdf(bot)
    q = torch.tensor([[0.0, 0.0], [0.7, -0.4], [-1.9, 1.2]], dtype=torch.float64)
    fig = viz.figure(robot, q)
    assert len(fig.frames) == 3 and [f.name for f in fig.frames] == ["0", "1", "2"]
    k1, k2 = _trace(fig, "bot/link1"), _trace(fig, "bot/link2")
    fk = robot.forward_kinematics(q).numpy()
    R0 = _rz(MESH_RPY[2])  # the mesh's <origin rpy>: a yaw
    local = TETRA * MESH_SCALE @ R0.T + np.array(MESH_XYZ)  # link1 frame
    box = np.array([[sx, sy, sz] for sx in (-1, 1) for sy in (-1, 1) for sz in (-1, 1)]) * np.array(BOX2) / 2
    box += [0.15, 0.0, 0.0]  # link2 frame
    for t, (a, b) in enumerate(q.tolist()):
        # Analytic: link1 = Trans(0, 0, J1_Z) Rz(a); link2 = link1 Trans(J2_X, 0, 0) Ry(b).
        R1, p1 = _rz(a), np.array([0.0, 0.0, J1_Z])
        R2, p2 = R1 @ _ry(b), p1 + R1 @ [J2_X, 0.0, 0.0]
        np.testing.assert_allclose(fk[t, 1, :3, :3], R1, atol=1e-12)
        np.testing.assert_allclose(fk[t, 2, :3, 3], p2, atol=1e-12)
        # The figure's vertices (float32) where the link's pose puts them.
        assert _same_points(_frame_xyz(fig, t, k1), local @ R1.T + p1, 1e-6)
        assert _same_points(_frame_xyz(fig, t, k2), box @ R2.T + p2, 1e-6)
        # ... and where robot.forward_kinematics puts them.
        assert _same_points(_frame_xyz(fig, t, k1), local @ fk[t, 1, :3, :3].T + fk[t, 1, :3, 3], 1e-6)
    assert fig.data[k1].color == "rgb(255, 128, 0)"  # the URDF material
    assert fig.data[_trace(fig, "bot/link2")].hovertemplate.endswith("collision: box</extra>")


def test_html_is_self_contained_with_one_frame_per_step(bot, tmp_path):
    robot = load_urdf(bot)
    steps = 7
    q = torch.stack([torch.linspace(-1, 1, steps), torch.linspace(0, 0.5, steps)], -1).double()
    out = viz.show(robot, q, tmp_path / "out" / "traj.html", dt=0.1)
    text = out.read_text()
    scripts = re.findall(r"<script[^>]*>", text)
    assert scripts and not any("src=" in s for s in scripts)  # plotly.js inline, nothing fetched
    assert not re.search(r"<(script|link)[^>]+(src|href)=[\"']?(https?:)?//", text)
    frames = _frames_in_html(text)
    assert [f["name"] for f in frames] == [str(t) for t in range(steps)]
    assert len(text) < 8e6  # plotly.js is about 4.6 MB of it
    fig = viz.figure(robot, q[0])  # one configuration: one frame, no play button
    assert len(fig.frames) == 1 and fig.layout.updatemenus[0].visible is False


def test_scene_with_a_sphere_and_a_box(tmp_path):
    r, size = 0.1, (0.3, 0.2, 0.1)
    scene = Scene([systems.sphere(r, 1.0, name="ball"), systems.box(size, 2.0, name="crate")])
    q = scene.neutral_configuration().clone()
    q[0:3] = torch.tensor([0.5, 0.0, 0.3])
    q[7:10] = torch.tensor([-0.2, 0.1, 0.05])
    half = math.pi / 4  # the crate turned 90 degrees about z: quaternion (x, y, z, w)
    q[10:14] = torch.tensor([0.0, 0.0, math.sin(half), math.cos(half)])
    q2 = q.clone()
    q2[2] = 0.1  # the ball falls, the crate stays
    fig = viz.figure(scene, torch.stack([q, q2]))
    names = [d.name for d in fig.data]
    assert names == ["ball/body", "crate/body", "ground"]
    for t, z in enumerate((0.3, 0.1)):
        ball = _frame_xyz(fig, t, 0)
        np.testing.assert_allclose(np.linalg.norm(ball - [0.5, 0.0, z], axis=1), r, atol=1e-6)
    crate = _frame_xyz(fig, 1, 1)
    corners = np.array([[sx * size[1], sy * size[0], sz * size[2]] for sx in (-.5, .5) for sy in (-.5, .5)
                        for sz in (-.5, .5)]) + [-0.2, 0.1, 0.05]  # x and y extents swapped by the turn
    assert _same_points(crate, corners, 1e-6)
    assert fig.frames[0].traces == (0,)  # only the moving ball is in the frames
    ground = fig.data[2]
    assert set(np.asarray(ground.z).tolist()) == {0.0} and min(ground.x) < -0.2 - 0.15 and max(ground.x) > 0.6
    out = viz.show(scene, torch.stack([q, q2]), tmp_path / "scene.html")
    assert len(_frames_in_html(out.read_text())) == 2
    # A robot alone has no ground unless asked for.
    assert "ground" not in [d.name for d in viz.figure(scene.model("ball"), q[:7]).data]
    assert "ground" in [d.name for d in viz.figure(scene.model("ball"), q[:7], ground=True).data]


def test_model_without_geometry_drawn_as_its_skeleton():
    robot = systems.acrobot()
    q = torch.tensor([[0.0, 0.0], [0.4, -1.1], [2.0, 0.5]], dtype=torch.float64)
    fig = viz.figure(robot, q)
    assert [d.name for d in fig.data] == ["acrobot/skeleton"] and fig.data[0].type == "scatter3d"
    fk = robot.forward_kinematics(q)[:, :, :3, 3].numpy()
    for t in range(3):
        pts = _frame_xyz(fig, t, 0)
        pts = pts[np.isfinite(pts).all(1)]
        assert _same_points(pts, fk[t], 1e-6)  # every link origin, nothing else


def test_package_uri_resolved_through_ros_package_path(bot, tmp_path, monkeypatch):
    # A URDF given as text keeps package:// URIs; the view finds them under ROS_PACKAGE_PATH.
    robot = load_urdf(open(bot).read())
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp_path))
    meshes = viz.link_meshes(robot)
    assert [(m.link, m.kind) for m in meshes] == [("link1", "visual"), ("link2", "collision")]
    monkeypatch.setenv("ROS_PACKAGE_PATH", str(tmp_path / "nowhere"))
    with pytest.warns(UserWarning, match="link1.*not found"):
        meshes = viz.link_meshes(robot)
    assert [m.link for m in meshes] == ["link2"]  # no collision shape on link1 to fall back to
    assert [m.kind for m in viz.link_meshes(robot, "collision")] == ["collision"]


def test_bad_input_names_the_tensor_and_its_shape(bot):
    robot = load_urdf(bot)
    with pytest.raises(ShapeError, match=r"q_trajectory must have shape \(T, 2\) or \(2,\).*got shape \(4, 3\)"):
        viz.figure(robot, torch.zeros(4, 3))
    with pytest.raises(DiffmechError, match=r"q_trajectory.*got shape \(2, 2, 2\)"):
        viz.show(robot, np.zeros((2, 2, 2)))
    with pytest.raises(ShapeError, match="not finite at step 1, coordinate 0"):
        viz.figure(robot, [[0.0, 0.0], [float("nan"), 0.0]])
    with pytest.raises(OptionError, match="geometry"):
        viz.figure(robot, geometry="wireframe")
    with pytest.raises(DiffmechError, match="RobotModel or a diffmech.sim.Scene"):
        viz.figure("bot.urdf")


def test_cli_view_writes_a_page(bot, tmp_path, capsys):
    out = tmp_path / "v.html"
    assert cli.main(["view", bot, "--q", "0.3", "-0.2", "--out", str(out)]) == 0
    assert out.exists() and len(_frames_in_html(out.read_text())) == 1
    traj = tmp_path / "q.csv"
    np.savetxt(traj, np.linspace([0, 0], [1, -1], 5), delimiter=",")
    assert cli.main(["view", bot, "--trajectory", str(traj), "--dt", "0.05", "--out", str(out)]) == 0
    assert len(_frames_in_html(out.read_text())) == 5
    assert cli.main(["view", bot, "--out", str(out)]) == 0  # neutral configuration
    capsys.readouterr()
    assert cli.main(["view", bot, "--q", "1", "2", "3", "--out", str(out)]) == 1
    assert "q_trajectory must have shape (T, 2)" in capsys.readouterr().err


def test_decimation_keeps_the_shape_within_budget():
    sphere = trimesh.creation.icosphere(subdivisions=5, radius=0.2)  # 20480 triangles, closed
    cup = trimesh.creation.cylinder(radius=0.1, height=0.3, sections=256)
    keep = np.abs(cup.face_normals[:, 2]) < 0.5  # the side only: an open mesh (quadric decimation stalls)
    cup = trimesh.Trimesh(cup.vertices, cup.faces[keep])
    cup = trimesh.Trimesh(*trimesh.remesh.subdivide_to_size(cup.vertices, cup.faces, 0.01))
    meshes = [viz.LinkMesh("a", 0, np.asarray(m.vertices), np.asarray(m.faces), (1, 1, 1, 1), "visual", "x")
              for m in (sphere, cup)]
    assert min(len(m.faces) for m in meshes) > 4000
    small = viz.decimate(meshes, 1000)
    assert sum(len(m.faces) for m in small) <= 1300
    assert all(len(m.faces) >= 64 for m in small)
    np.testing.assert_allclose(np.linalg.norm(small[0].vertices, axis=1), 0.2, rtol=0.08)  # coarse: ~70 vertices
    radial = np.linalg.norm(small[1].vertices[:, :2], axis=1)
    assert np.all(np.abs(radial - 0.1) < 0.015) and np.ptp(small[1].vertices[:, 2]) > 0.25


def test_real_robot_meshes_stay_small():
    drd = pytest.importorskip("diff_robot_data")
    robot = load_urdf(os.path.join(drd.__path__[0], "kuka_iiwa/urdf/iiwa7.urdf"))
    fig = viz.figure(robot, robot.random_configuration(50, generator=torch.Generator().manual_seed(0)))
    assert len(fig.data) == 8 and all("visual" in d.hovertemplate for d in fig.data)
    faces = sum(len(d.i) for d in fig.data)
    assert faces <= 1.3 * viz.view.auto_max_faces(50)


# ---------------------------------------------------------------------------- headless browser
_SHOT = textwrap.dedent("""
    import sys
    from playwright.sync_api import sync_playwright
    exe = sys.argv[1] or None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--use-angle=swiftshader",
                                    "--enable-unsafe-swiftshader", "--ignore-gpu-blocklist"])
        page = browser.new_page(viewport={"width": 800, "height": 600})
        for html, png, frame in zip(sys.argv[2::3], sys.argv[3::3], sys.argv[4::3]):
            page.goto("file://" + html)
            page.wait_for_function("document.querySelector('.plotly-graph-div')"
                                   " && document.querySelector('.plotly-graph-div')._fullLayout", timeout=30000)
            if frame != "-":  # what the slider does: animate to that frame
                page.evaluate("f => Plotly.animate(document.querySelector('.plotly-graph-div'), [f],"
                              " {frame: {duration: 0, redraw: true}, transition: {duration: 0}, mode: 'immediate'})",
                              frame)
            page.wait_for_timeout(1000)
            page.screenshot(path=png)
        browser.close()
""")


def _browser():
    """A Python that has playwright and a Chromium for it, or ``None``."""
    python = sys.executable if importlib.util.find_spec("playwright") else os.environ.get("DIFFMECH_PLAYWRIGHT_PYTHON")
    if not python:
        return None
    exe = os.environ.get("DIFFMECH_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium-headless-shell", "chromium", "chromium-browser", "google-chrome")
         if shutil.which(n)), "")  # "" : playwright's own browser, if it downloaded one
    return python, exe


@pytest.mark.slow  # a browser start and two WebGL renders in software: 10-25 s
def test_browser_screenshot_shows_the_robot(bot, tmp_path):
    found = _browser()
    if found is None:
        pytest.skip("playwright not installed (set DIFFMECH_PLAYWRIGHT_PYTHON to a Python that has it)")
    Image = pytest.importorskip("PIL.Image")
    python, exe = found
    robot = load_urdf(bot)
    q = torch.tensor([[0.5, -0.3], [2.5, 1.0]], dtype=torch.float64)
    full, empty = tmp_path / "robot.html", tmp_path / "empty.html"
    viz.show(robot, q, full)
    fig = viz.figure(robot, q)
    fig.update_traces(visible=False)  # the same axes and camera, no robot
    fig.write_html(empty, include_plotlyjs=True)
    script = tmp_path / "shot.py"
    script.write_text(_SHOT)
    pngs = [tmp_path / "robot.png", tmp_path / "empty.png", tmp_path / "robot1.png"]
    args = [str(full), str(pngs[0]), "-", str(empty), str(pngs[1]), "-", str(full), str(pngs[2]), "1"]
    run = subprocess.run([python, str(script), exe, *args], capture_output=True, text=True, timeout=120)
    # a browser that starts but renders nothing, or does not start, is a failure: ./run.sh installs one
    assert run.returncode == 0, f"headless Chromium ({exe or 'playwright'}) failed: {run.stderr.strip()[-2000:]}"
    a, b, c = (np.asarray(Image.open(p).convert("RGB"), dtype=np.int16) for p in pngs)
    assert (np.abs(a - b).max(-1) > 30).mean() > 0.005, "the robot is not visible"
    orange = lambda im: (im[..., 0] > 150) & (im[..., 1] > 50) & (im[..., 1] < 170) & (im[..., 2] < 90)  # noqa: E731
    assert orange(a).sum() > 50  # link1's URDF material
    # Step 1 of the slider moves the robot: the picture changes, the orange link too.
    assert (np.abs(c - a).max(-1) > 30).mean() > 0.002
    assert (orange(a) != orange(c)).sum() > 50
