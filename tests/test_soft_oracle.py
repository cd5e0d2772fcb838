"""Acceptance tests of ``Scene(solver="mujoco")`` against MuJoCo (issue 33, section 4).

Oracle: ``mujoco.mj_step`` on the same model, float64. Every trajectory test steps MuJoCo and the
scene side by side for 100 steps under seeded random controls (``actuator_forces`` of the file's
actuators, or random generalised forces where a scene has none) and compares ``qpos`` after every
step (through :func:`diffmech.model.mjcf.diffmech_state_to_mjcf`) to 1e-6; the scenes with
contacts check that MuJoCo's contact count both rose and fell along the run. Gradients through
rollouts: central differences at two step sizes.
"""

from __future__ import annotations

import os
import re
import warnings

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

import diffmech
from diffmech.errors import DiffmechError
from diffmech.model.mjcf import actuator_forces, diffmech_state_to_mjcf, mjcf_state_to_diffmech
from diffmech.model.systems import box, sphere
from diffmech.sim import Scene, contact_step, rollout

ASSETS = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")
TOL = 1e-6  # issue 33's bound on qpos over 100 steps


def _load(tmp_path, xml: str) -> tuple[Scene, object]:
    path = tmp_path / "model.xml"
    path.write_text(xml)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # what the files hold that a scene does not use
        scene = Scene.from_mjcf(path)
    return scene, mujoco.MjModel.from_xml_path(str(path))


def _mj_force_to_diffmech(scene, q: torch.Tensor, qfrc: np.ndarray) -> torch.Tensor:
    """A generalised force in MuJoCo's coordinates -> diffmech's at ``q (nq,)`` (a free joint's
    linear part rotated into the body frame, as its velocity is)."""
    qpos, _ = diffmech_state_to_mjcf(scene, q)
    return mjcf_state_to_diffmech(scene, qpos, qfrc)[1]


def _compare(scene, m, d, steps: int, rng, *, ctrl_scale: float = 1.0, force_scale: float = 0.0,
             convert=None) -> dict:
    """Step MuJoCo and ``scene`` side by side from ``d``'s state under random controls
    (``ctrl_scale``) and random generalised forces (``force_scale``, MuJoCo's ``qfrc_applied``);
    the largest ``qpos`` difference (up to the first step beyond :data:`TOL`) and MuJoCo's contact
    counts. ``convert``: the scene whose state
    conversions apply (``scene`` itself unless the scene was built in code)."""
    conv = convert if convert is not None else scene
    q, v = mjcf_state_to_diffmech(conv, d.qpos.copy(), d.qvel.copy())
    q, v = q[None], v[None]
    err, ncon = 0.0, []
    info: dict = {"lam": None}
    for _ in range(steps):
        ctrl = ctrl_scale * rng.uniform(-1.0, 1.0, m.nu)
        d.ctrl[:] = ctrl
        tau = actuator_forces(scene, torch.as_tensor(ctrl)[None], q, v) if m.nu else torch.zeros_like(v)
        if force_scale:
            f = force_scale * rng.uniform(-1.0, 1.0, m.nv)
            d.qfrc_applied[:] = f
            tau = tau + _mj_force_to_diffmech(conv, q[0], f)[None]
        mujoco.mj_step(m, d)
        warm, info = info["lam"], {}  # MuJoCo starts its solver from the previous step's qacc
        q, v = contact_step(scene, q, v, tau, m.opt.timestep, info, warm=warm)
        qpos, _ = diffmech_state_to_mjcf(conv, q[0], v[0], qpos0=m.qpos0)
        err = max(err, float(np.abs(qpos.numpy() - d.qpos).max()))
        ncon.append(d.ncon)
        if err > TOL:  # failed: stop here (the xfailed cases too)
            break
    assert info["route"] == "torch: mujoco solver"
    dn = np.diff(ncon)
    return {"q": err, "ncon": ncon, "made": int((dn > 0).sum()), "broken": int((dn < 0).sum())}


def _made_and_broken(err: dict) -> None:
    assert max(err["ncon"]) > 0 and err["made"] > 0 and err["broken"] > 0, err["ncon"]


# ------------------------------------------------------------------ gymnasium robots
def _gym(env_id: str, xml: str, seed: int):
    """The scene and MuJoCo model of a gymnasium file and gymnasium's reset state for ``seed``."""
    env = gymnasium.make(env_id)
    env.reset(seed=seed)
    path = os.path.join(ASSETS, xml)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scene = Scene.from_mjcf(path)
        m = mujoco.MjModel.from_xml_path(path)
    d = mujoco.MjData(m)
    d.qpos[:] = env.unwrapped.data.qpos
    d.qvel[:] = env.unwrapped.data.qvel
    env.close()
    return scene, m, d


@pytest.mark.parametrize("env_id, xml", [
    ("HalfCheetah-v5", "half_cheetah.xml"),  # Euler, dt 0.01, condim 3
    pytest.param("Walker2d-v5", "walker2d_v5.xml", marks=pytest.mark.slow),  # RK4, dt 0.002
])
def test_gymnasium_from_reset(env_id, xml):
    scene, m, d = _gym(env_id, xml, seed=0)
    err = _compare(scene, m, d, 100, np.random.default_rng(10))
    assert err["q"] < TOL, err["q"]  # measured 1.8e-14 (HalfCheetah), 2.4e-14 (Walker2d)
    _made_and_broken(err)


# ------------------------------------------------------------------ a pile of boxes and spheres
def _pile_xml(option: str = "", condim_box: int = 3, condim_sphere: int = 3) -> str:
    """Five boxes stacked (slightly offset and turned) and ten spheres dropped onto each other and
    the plane; ``condim_sphere`` on every other sphere (the rest condim 3)."""
    bodies = []
    for i in range(5):
        bodies.append(f'<body name="box{i}" pos="{0.01 * i:.3f} {-0.008 * i:.3f} {0.1 + 0.201 * i:.3f}" '
                      f'euler="0 0 {7 * i}"><freejoint/>'
                      f'<geom type="box" size="0.12 0.1 0.1" mass="{1 + 0.2 * i:.2f}" condim="{condim_box}"/></body>')
    for i in range(10):
        x, y = 0.5 + 0.13 * (i % 3) - 0.01 * (i // 3), 0.13 * (i // 3) - 0.2 + 0.01 * (i % 3)
        c = condim_sphere if i % 2 else 3
        bodies.append(f'<body name="ball{i}" pos="{x:.3f} {y:.3f} {0.08 + 0.05 * i:.3f}"><freejoint/>'
                      f'<geom type="sphere" size="0.06" mass="0.3" condim="{c}"/></body>')
    return (f'<mujoco model="pile"><option timestep="0.005" {option}/><worldbody>'
            f'<geom name="floor" type="plane" size="5 5 0.1"/>{"".join(bodies)}</worldbody></mujoco>')


# each 8 to 25 s (2 shared cores): slow. The plain cases (condim 3 everywhere, impratio 1, tolerance
# 1e-8) measured 3.8e-9 (pyramidal) and 2.4e-7 (elliptic).
@pytest.mark.slow
@pytest.mark.parametrize("option, condim_box, condim_sphere", [
    ('impratio="2"', 4, 6),  # pyramidal; boxes condim 4, every other sphere 6, the rest 3
    # elliptic: at MuJoCo's tolerance 1e-8 the two Newton solvers' stopping points differ by up to
    # 5.6e-7 over the 100 steps (2.2e-10 over 40 steps at 1e-13: the same problem); 1e-10 here
    ('cone="elliptic" impratio="2" tolerance="1e-10"', 6, 4),
])
def test_pile(tmp_path, option, condim_box, condim_sphere):
    scene, m = _load(tmp_path, _pile_xml(option, condim_box, condim_sphere))
    d = mujoco.MjData(m)
    rng = np.random.default_rng(11)
    d.qvel[:] = 0.3 * rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng)
    assert err["q"] < TOL, err["q"]  # measured 5.1e-8 (pyramidal), 8.7e-8 (elliptic)
    _made_and_broken(err)


# ------------------------------------------------------------------ scenes built in code, a URDF arm
CODE_XML = """
<mujoco><option timestep="0.005"/><worldbody><geom type="plane" size="5 5 0.1"/>
  <body name="s0" pos="0 0 0.3" quat="0.9 0.1 0.3 0.2"><freejoint/><geom type="sphere" size="0.1" mass="1.5"/></body>
  <body name="b0" pos="0.3 0.05 0.25" quat="0.8 0.3 -0.2 0.1"><freejoint/>
    <geom type="box" size="0.1 0.15 0.05" mass="2"/></body>
  <body name="s1" pos="0.32 0 0.6"><freejoint/><geom type="sphere" size="0.08" mass="0.7"/></body>
</worldbody></mujoco>"""


def test_scene_built_in_code_against_mjcf(tmp_path):
    """Two spheres and a box built with ``diffmech.model.systems`` (MuJoCo's default friction 1,
    solref, solimp, condim 3) against the same bodies written as MJCF."""
    file_scene, m = _load(tmp_path, CODE_XML)
    scene = Scene([sphere(0.1, 1.5, name="s0"), box((0.2, 0.3, 0.1), 2.0, name="b0"), sphere(0.08, 0.7, name="s1")],
                  solver="mujoco", friction=1.0)
    assert scene.names == file_scene.names and scene.nq == file_scene.nq
    d = mujoco.MjData(m)
    rng = np.random.default_rng(12)
    d.qvel[:] = 0.5 * rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng, force_scale=1.0, convert=file_scene)
    assert err["q"] < TOL, err["q"]  # measured 1.1e-14
    _made_and_broken(err)


@pytest.mark.slow  # 2-3 s
def test_urdf_arm_hits_the_ground(tmp_path):
    """pybullet_data's ``pendulum5.urdf`` (five hinges about x, sphere collision shapes), its base
    raised 0.4 m, swinging into the ground; MuJoCo loads the same URDF (plus a plane). The joints'
    ``friction`` is removed: a scene built in code has no friction loss."""
    import pybullet_data
    text = open(os.path.join(pybullet_data.getDataPath(), "pendulum5.urdf")).read()
    edited = re.sub(r'(<joint name="joint0".*?xyz=")0 0 0(")', r"\g<1>0 0 0.4\2",
                    text.replace('friction="1.0"', ""), count=1, flags=re.S)
    assert edited.count("0 0 0.4") == 1
    path = tmp_path / "pendulum5.urdf"
    path.write_text(edited)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the massless 'world' link
        robot = diffmech.load_urdf(path)
    scene = Scene([robot], solver="mujoco", friction=1.0)
    spec = mujoco.MjSpec.from_file(str(path))
    spec.worldbody.add_geom(type=mujoco.mjtGeom.mjGEOM_PLANE, size=[5, 5, 0.1])
    spec.option.timestep = 0.01
    m = spec.compile()
    assert m.nv == scene.nv == 5 and not m.dof_frictionloss.any() and (m.dof_damping == 1.0).all()
    d = mujoco.MjData(m)
    d.qpos[:] = (0.05, -0.1, -0.1, -0.05, 0.0)
    d.qvel[:] = (0.0, 0.0, 0.0, 1.0, 2.0)
    q, v = torch.tensor(d.qpos)[None], torch.tensor(d.qvel)[None]  # hinges only: same coordinates
    rng = np.random.default_rng(13)
    err, ncon = 0.0, []
    for _ in range(100):
        f = 5.0 * rng.uniform(-1.0, 1.0, m.nv)
        d.qfrc_applied[:] = f
        mujoco.mj_step(m, d)
        q, v = contact_step(scene, q, v, torch.tensor(f)[None], m.opt.timestep)
        err = max(err, float(np.abs(q[0].numpy() - d.qpos).max()))
        ncon.append(d.ncon)
    dn = np.diff(ncon)
    assert (dn > 0).any() and (dn < 0).any(), ncon
    assert err < TOL, err  # measured 3.6e-15


# ------------------------------------------------------------------ limits, friction loss, option flags
LIMITS_XML = """
<mujoco model="limits">
  <option timestep="0.005">{flags}</option>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1" solref="0.008 0.1"/>
    <body name="arm" pos="0 0 1">
      <joint name="j1" type="hinge" axis="0 1 0" range="-0.3 0.4" margin="0.05" damping="0.5"
             solreflimit="0.008 0.8" solimplimit="0.8 0.97 0.002 0.4 3"
             frictionloss="0.08" solreffriction="0.008 1.2"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04" contype="0" conaffinity="0"/>
      <body name="slider" pos="0.4 0 0">
        <joint name="s" type="slide" axis="1 0 0.3" damping="3" range="-0.1 0.08" margin="0.02" solreflimit="-3000 -20"
               frictionloss="0.5" solimpfriction="0.7 0.9 0.01 0.3 2"/>
        <geom type="sphere" size="0.06" contype="0" conaffinity="0"/>
      </body>
    </body>
    <body name="ball" pos="0.5 0.5 0.2"><freejoint/><geom type="sphere" size="0.1" mass="1" solref="0.008 0.1"/></body>
  </worldbody>
  <actuator><motor joint="j1" gear="3"/><motor joint="s" gear="20"/></actuator>
</mujoco>
"""


def _mj_run(m, steps: int, seed: int) -> np.ndarray:
    """MuJoCo's qpos trajectory ``(steps, nq)`` from rest under the seeded controls of :func:`_compare`."""
    d = mujoco.MjData(m)
    d.qvel[-6:] = (0.3, 0.0, -1.5, 0.0, 0.0, 0.0)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(steps):
        d.ctrl[:] = rng.uniform(-1.0, 1.0, m.nu)
        mujoco.mj_step(m, d)
        out.append(d.qpos.copy())
    return np.asarray(out)


@pytest.mark.parametrize("flags", [
    "",
    pytest.param('<flag eulerdamp="disable"/>', marks=pytest.mark.slow),
    '<flag refsafe="disable"/>',
    pytest.param('<flag frictionloss="disable" contact="disable"/>', marks=pytest.mark.slow),
    pytest.param('<flag limit="disable" gravity="disable" damper="disable"/>', marks=pytest.mark.slow),
    pytest.param('<flag constraint="disable"/>', marks=pytest.mark.slow),
])
def test_limits_friction_loss_and_flags(tmp_path, flags):
    """Joint limits with margins and their solref (positive and negative) / solimp, friction loss
    with its solref / solimp, a ball bouncing on the floor (the solref time constants 0.008 s, below
    2 dt: refsafe clamps them), under each of MuJoCo's option flags the step reads. Each flag changes MuJoCo's
    trajectory (checked), so the comparison sees whether the step honours it."""
    scene, m = _load(tmp_path, LIMITS_XML.format(flags=flags))
    if flags:
        base = mujoco.MjModel.from_xml_string(LIMITS_XML.format(flags=""))
        assert np.abs(_mj_run(m, 100, 14) - _mj_run(base, 100, 14)).max() > 1e-4  # the flag matters
    d = mujoco.MjData(m)
    d.qvel[-6:] = (0.3, 0.0, -1.5, 0.0, 0.0, 0.0)
    err = _compare(scene, m, d, 100, np.random.default_rng(14))
    # measured: no flag 2.5e-8, eulerdamp 1.0e-7 (the solver's tolerance on the limits and friction
    # loss), frictionloss+contact 3.0e-16, limit+gravity+damper 2.5e-14, constraint 2.2e-16
    assert err["q"] < TOL, err["q"]
    if "contact" not in flags and "constraint" not in flags:
        _made_and_broken(err)
    dd = mujoco.MjData(m)  # the limits and the friction loss were active along the run
    kinds = set()
    rng = np.random.default_rng(14)
    dd.qvel[-6:] = (0.3, 0.0, -1.5, 0.0, 0.0, 0.0)
    for _ in range(100):
        dd.ctrl[:] = rng.uniform(-1.0, 1.0, m.nu)
        mujoco.mj_step(m, dd)
        kinds |= set(int(t) for t in dd.efc_type)
    assert not dd.warning.number.any()  # MuJoCo's run stayed stable (no reset)
    if not re.search("limit|constraint", flags):
        assert int(mujoco.mjtConstraint.mjCNSTR_LIMIT_JOINT) in kinds
    if not re.search("frictionloss|constraint", flags):
        assert int(mujoco.mjtConstraint.mjCNSTR_FRICTION_DOF) in kinds


FILTER_XML = """
<mujoco model="filter">
  <option timestep="0.005">{flags}</option>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="upper" pos="0 0 0.5">
      <joint name="a" type="hinge" axis="0 1 0" damping="0.2"/>
      <geom name="upper_geom" type="capsule" fromto="0 0 0 0.3 0 0" size="0.05"/>
      <body name="lower" pos="0.3 0 0">
        <joint name="b" type="hinge" axis="0 1 0" damping="0.2"/>
        <geom name="lower_geom" type="capsule" fromto="-0.02 0 0 0.25 0 -0.2" size="0.05"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="a" gear="4"/><motor joint="b" gear="2"/></actuator>
</mujoco>
"""


@pytest.mark.parametrize("flags", [
    "",
    '<flag filterparent="disable"/>',
    '<flag warmstart="disable"/>',
])
def test_parent_child_filter_flags(tmp_path, flags):
    """A two-link arm whose child capsule overlaps its parent's at the elbow, swinging into the
    floor: MuJoCo filters the parent-child pair unless ``filterparent`` is disabled."""
    scene, m = _load(tmp_path, FILTER_XML.format(flags=flags))
    d = mujoco.MjData(m)
    err = _compare(scene, m, d, 100, np.random.default_rng(19))
    assert err["q"] < TOL, err["q"]  # measured 3.6e-15 (no flag)
    if "filterparent" in flags:  # the elbow's parent-child contact stays the whole run
        assert min(err["ncon"]) > 0, err["ncon"]
    else:
        _made_and_broken(err)


# ------------------------------------------------------------------ gradients through rollouts
def _rollout_gradients(scene, q0, v0, T: int, dt: float, model: str, link: str, free: list[int], seed: int):
    """Gradients of ``w . q_T`` (``w`` random) after ``T`` steps w.r.t. the joint forces ``tau (T, nv)``,
    ``q0`` (along the coordinates ``free``: positions, not quaternions) and the mass of ``link``,
    by both adjoints, their relative differences to central differences at steps 1e-6 and 1e-5 along
    random directions, ``{adjoint: (2, 3)}`` (rows: step sizes; columns: tau, q0, mass), and the
    central differences ``(2, 3)``."""
    robot = scene.model(model)
    robot.make_link_param_learnable(link, "mass")
    mass = robot.learnable_parameters()[f"{link}.mass"]
    rng = np.random.default_rng(seed)
    tau0 = torch.tensor(rng.uniform(-1.0, 1.0, (T, scene.nv)), dtype=torch.float64)
    w = torch.tensor(rng.standard_normal(scene.nq), dtype=torch.float64)
    d_tau = torch.tensor(rng.standard_normal((T, scene.nv)), dtype=torch.float64)
    d_q = torch.zeros_like(q0)
    d_q[free] = torch.tensor(rng.standard_normal(len(free)), dtype=torch.float64)

    def f(tau, q, adjoint="autograd"):
        Q, _ = rollout(scene, q, v0.expand(q.shape[:-1] + v0.shape[-1:]), tau, dt, adjoint=adjoint)
        return (Q[..., -1, :] * w).sum(-1)

    grads = {}
    for adjoint in ("checkpoint", "autograd"):
        tau, q = tau0.clone().requires_grad_(), q0.clone().requires_grad_()
        g_tau, g_q, g_m = torch.autograd.grad(f(tau, q, adjoint), [tau, q, mass])
        grads[adjoint] = torch.stack([(g_tau * d_tau).sum(), (g_q * d_q).sum(), g_m.reshape(())])
    eps = torch.tensor([1e-6, 1e-5], dtype=torch.float64)
    with torch.no_grad():
        # tau and q0 perturbed in one batch of 8: (+-, step, {tau, q0})
        sign = torch.tensor([1.0, -1.0], dtype=torch.float64)[:, None, None]
        e = (sign * eps[None, :, None]).expand(2, 2, 2)
        on_tau = torch.tensor([1.0, 0.0], dtype=torch.float64)
        taus = tau0 + (e * on_tau)[..., None, None] * d_tau
        qs = q0 + (e * (1 - on_tau))[..., None] * d_q
        y = f(taus, qs)  # (2, 2, 2)
        fd_tq = (y[0] - y[1]) / (2 * eps[:, None])  # (2 steps, {tau, q0})
        m0 = mass.detach().clone()
        fd_m = []
        for h in eps.tolist():
            mass.copy_(m0 + h)
            fp = f(tau0, q0)
            mass.copy_(m0 - h)
            fm = f(tau0, q0)
            mass.copy_(m0)
            fd_m.append((fp - fm) / (2 * h))
    fd = torch.cat([fd_tq, torch.stack(fd_m)[:, None]], dim=1)  # (2, 3)
    return {k: (g[None] - fd).abs() / fd.abs() for k, g in grads.items()}, fd


def _check_gradients(rel: dict, fd: torch.Tensor) -> None:
    """The two step sizes' differences agree (to 1e-4: the contacts' stiffness curves the 1e-5 one),
    and each adjoint's gradient is within 1e-5 of the nearer of them."""
    assert ((fd[0] - fd[1]).abs() / fd[1].abs() < 1e-4).all(), fd
    for adjoint, r in rel.items():
        assert r.min(0).values.max() < 1e-5, (adjoint, r)


def _settled(scene, m, steps: int, seed: int, qpos=None):
    """MuJoCo's state after ``steps`` steps under random controls from ``qpos`` (default ``qpos0``)."""
    d = mujoco.MjData(m)
    if qpos is not None:
        d.qpos[:] = qpos
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        d.ctrl[:] = rng.uniform(-1.0, 1.0, m.nu)
        mujoco.mj_step(m, d)
    assert d.ncon > 0
    return mjcf_state_to_diffmech(scene, d.qpos.copy(), d.qvel.copy())


# 5-8 s on 2 shared cores (10 steps; the autograd adjoint's backward runs on one thread, as the
# checkpointed one's: at two it took ten times longer under load)
@pytest.mark.slow
def test_gradients_ant():
    """The Ant (RK4, dt 0.01) with two feet on the floor, 10 steps; the torso's mass."""
    path = os.path.join(ASSETS, "ant.xml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scene = Scene.from_mjcf(path)
    m = mujoco.MjModel.from_xml_path(path)
    scene.mujoco.tolerance = 1e-14  # the differences need the solve converged far below their step
    q0, v0 = _settled(scene, m, 64, 15)
    free = [0, 1, 2] + list(range(7, scene.nq))  # the torso's position and the joint angles
    rel, fd = _rollout_gradients(scene, q0, v0, 10, m.opt.timestep, "ant", "torso", free, 16)
    # measured over 20 steps (both adjoints alike; steps 1e-6 / 1e-5; tau, q0, mass): 5.7e-9 1.6e-9 3.8e-9 /
    # 8.0e-9 1.5e-7 4.4e-10; 10 steps keep the test at half the time
    _check_gradients(rel, fd)


STACK_XML = """
<mujoco model="stack"><option timestep="0.005"/><worldbody><geom name="floor" type="plane" size="5 5 0.1"/>
{}</worldbody></mujoco>"""


@pytest.mark.slow
def test_gradients_box_stack(tmp_path):
    """Five boxes stacked (the pile's), settled 60 steps in MuJoCo, then 20 steps; the mass of the
    middle box."""
    boxes = _pile_xml().split('<geom name="floor" type="plane" size="5 5 0.1"/>')[1].split('<body name="ball0"')[0]
    scene, m = _load(tmp_path, STACK_XML.format(boxes))
    assert m.nbody == 6
    scene.mujoco.tolerance = 1e-14
    q0, v0 = _settled(scene, m, 60, 17)
    free = [i for b in range(5) for i in range(7 * b, 7 * b + 3)]  # the boxes' positions
    rel, fd = _rollout_gradients(scene, q0, v0, 20, m.opt.timestep, "box2", "box2", free, 18)
    # measured (both adjoints alike; steps 1e-6 / 1e-5; tau, q0, mass): 1.3e-7 1.8e-7 7.3e-8 / 1.0e-8 1.2e-5 7.8e-9
    # (the two q0 differences differ by 1.2e-5: the stiff contacts' curvature)
    _check_gradients(rel, fd)


# ------------------------------------------------------------------ bad input
MESH_XML = """
<mujoco><asset><mesh name="tet" vertex="0 0 0  0.1 0 0  0 0.1 0  0 0 0.1"/></asset>
  <worldbody><geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="rock" pos="0 0 0.3"><freejoint/><geom name="rock_geom" type="mesh" mesh="tet"/></body>
  </worldbody></mujoco>"""


def test_mesh_geom_in_a_file_is_refused(tmp_path):
    path = tmp_path / "mesh.xml"
    path.write_text(MESH_XML)
    with pytest.raises(DiffmechError, match="'floor' \\(plane\\) and 'rock_geom' \\(mesh\\)"):
        Scene.from_mjcf(path)


def _mesh_rock():
    from diffmech.contact.convex import hull_from_points
    from diffmech.model.collision import Shape, set_collision_shapes

    rock = sphere(0.1, 1.0, name="rock")
    hull = hull_from_points(np.array([[0.0, 0, 0], [0.1, 0, 0], [0, 0.1, 0], [0, 0, 0.1]]))
    set_collision_shapes(rock, "body", Shape("convex", (1.0,), hull=hull))
    return rock


def _cylinder_can():
    from diffmech.model.collision import Shape, set_collision_shapes

    can = sphere(0.1, 1.0, name="can")
    set_collision_shapes(can, "body", Shape("cylinder", (0.1, 0.2)))
    return can


@pytest.mark.parametrize("models, match", [
    (lambda: [_mesh_rock()], "'ground' \\(plane\\) and 'rock/body/0' \\(mesh\\)"),
    (lambda: [box((0.1, 0.1, 0.1), 1.0, name="brick"), _cylinder_can()],
     "'can/body/0' \\(cylinder\\) and 'brick/body/0' \\(box\\)"),
])
def test_unsupported_shapes_in_code_raise_at_construction(models, match):
    """A scene built in code with shapes MuJoCo's collision code here lacks is refused when it is
    made, naming the two geoms (as ``Scene.from_mjcf`` does)."""
    with pytest.raises(DiffmechError, match=match):
        Scene(models(), solver="mujoco")


@pytest.mark.parametrize("solver", ["pgs", "mujoco"])
def test_nan_in_q0(solver):
    """A NaN in ``q0`` raises the same error, naming the coordinate, whatever the solver."""
    scene = Scene([sphere(0.1, 1.0)], solver=solver)
    q0 = torch.tensor([0.0, float("nan"), 0.3, 0, 0, 0, 1], dtype=torch.float64)
    v0 = torch.zeros(6, dtype=torch.float64)
    with pytest.raises(DiffmechError, match="'q0' is not finite: model 'sphere', base position coordinate 1 = nan"):
        rollout(scene, q0, v0, torch.zeros(3, 6, dtype=torch.float64), 0.005)
