"""``Scene(solver="mujoco")``: :func:`diffmech.sim.soft_step.soft_step` against MuJoCo's ``mj_step``.

Oracle: ``mujoco.mj_step`` on the same file, float64, states compared after every step (``qpos``
and ``qvel`` in MuJoCo's coordinates, through :func:`diffmech.model.mjcf.diffmech_state_to_mjcf`).
Without contacts the step is the same arithmetic as MuJoCo's up to rounding; with contacts the
Newton solver stops at MuJoCo's tolerance, which bounds the agreement. Gradients: central
differences at two step sizes.
"""

from __future__ import annotations

import os
import warnings

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

from diffmech.dynamics import kernels
from diffmech.errors import DiffmechError, NativeRouteError
from diffmech.model.mjcf import actuator_forces, diffmech_state_to_mjcf, mjcf_state_to_diffmech
from diffmech.model.systems import sphere
from diffmech.sim import Scene, contact_step, rollout

ASSETS = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets")

PENDULUM = """
<mujoco model="pendulum">
  <option timestep="0.01" integrator="{integrator}"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="a" pos="0 0 1">
      <joint name="j1" type="hinge" axis="0 1 0" damping="0.3" stiffness="2" springref="0.2" armature="0.05"/>
      <geom type="capsule" fromto="0 0 0 0.5 0 0" size="0.05"/>
      <body name="b" pos="0.5 0 0">
        <joint name="j2" type="hinge" axis="0.3 1 0.2" damping="0.1" armature="0.02" ref="0.1"/>
        <geom type="capsule" fromto="0 0 0 0 0.2 -0.5" size="0.04"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="j2" gear="3"/></actuator>
</mujoco>
"""

TUMBLER = """
<mujoco model="tumbler">
  <option timestep="0.005" integrator="{integrator}"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="box" pos="0 0 1">
      <freejoint/>
      <geom type="box" size="0.1 0.2 0.3" pos="0.05 0 0" euler="10 20 30"/>
      <body name="arm" pos="0.1 0 0.3">
        <joint name="h" type="hinge" axis="1 0 0" damping="0.05" armature="0.01"/>
        <geom type="capsule" fromto="0 0 0 0 0.3 0" size="0.03"/>
      </body>
    </body>
  </worldbody>
  <actuator><motor joint="h" gear="2"/></actuator>
</mujoco>
"""

DROP = """
<mujoco model="drop">
  <option timestep="0.005" integrator="{integrator}"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="ball" pos="0 0 0.15">
      <freejoint/>
      <geom type="sphere" size="0.1" mass="1"/>
    </body>
    <body name="brick" pos="0.5 0 0.12" euler="5 10 20">
      <freejoint/>
      <geom type="box" size="0.1 0.15 0.05" mass="2"/>
    </body>
  </worldbody>
</mujoco>
"""

LIMIT = """
<mujoco model="limit">
  <option timestep="0.005"/>
  <default><geom contype="0" conaffinity="0"/></default>
  <worldbody>
    <body name="arm" pos="0 0 1">
      <joint name="j" type="hinge" axis="0 1 0" range="-0.3 0.4" damping="0.05" frictionloss="0.05"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04"/>
    </body>
  </worldbody>
  <actuator><motor joint="j" gear="1"/></actuator>
</mujoco>
"""


def _scene(tmp_path, xml: str, **fmt) -> tuple[Scene, object]:
    path = tmp_path / "model.xml"
    path.write_text(xml.format(**fmt) if fmt else xml)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sites, sensors the files hold
        scene = Scene.from_mjcf(path)
    return scene, mujoco.MjModel.from_xml_path(str(path))


def _asset(name: str) -> tuple[Scene, object]:
    path = os.path.join(ASSETS, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scene = Scene.from_mjcf(path)
    return scene, mujoco.MjModel.from_xml_path(path)


def _compare(scene, m, d, steps: int, rng, ctrl_scale: float = 1.0) -> dict:
    """Step MuJoCo and the scene side by side from ``d``'s state under random controls; the largest
    differences of ``qpos`` and ``qvel``, the number of steps that had a contact and the numbers of
    steps where MuJoCo's contact count rose (``made``) and fell (``broken``)."""
    q, v = mjcf_state_to_diffmech(scene, d.qpos.copy(), d.qvel.copy())
    q, v = q[None], v[None]
    err_q = err_v = 0.0
    touching = made = broken = 0
    ncon = d.ncon
    info: dict = {"lam": None}
    for _ in range(steps):
        ctrl = ctrl_scale * rng.uniform(-1.0, 1.0, m.nu)
        d.ctrl[:] = ctrl
        tau = actuator_forces(scene, torch.as_tensor(ctrl)[None], q, v) if m.nu else torch.zeros_like(v)
        mujoco.mj_step(m, d)
        warm, info = info["lam"], {}  # the previous step's qacc starts the solver: MuJoCo's qacc_warmstart
        q, v = contact_step(scene, q, v, tau, m.opt.timestep, info, warm=warm)
        qpos, qvel = diffmech_state_to_mjcf(scene, q[0], v[0], qpos0=m.qpos0)
        err_q = max(err_q, float(np.abs(qpos.numpy() - d.qpos).max()))
        err_v = max(err_v, float(np.abs(qvel.numpy() - d.qvel).max()))
        touching += d.ncon > 0
        made, broken, ncon = made + (d.ncon > ncon), broken + (d.ncon < ncon), d.ncon
    assert info["route"] == "torch: mujoco solver"
    return {"q": err_q, "v": err_v, "touching": touching, "made": made, "broken": broken}


# ------------------------------------------------------------------ without contacts
@pytest.mark.parametrize("integrator", ["Euler", "RK4", "implicitfast", "Euler-explicit", "implicitfast-explicit"])
def test_pendulum_with_damping_springs_armature(tmp_path, integrator):
    xml = PENDULUM
    if integrator.endswith("-explicit"):  # eulerdamp disabled: Euler's damping explicit, implicitfast's not
        integrator = integrator.removesuffix("-explicit")
        xml = xml.replace("<default>", '<option><flag eulerdamp="disable"/></option>\n  <default>')
    scene, m = _scene(tmp_path, xml, integrator=integrator)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(0)
    d.qpos[:] = m.qpos0 + 0.5 * rng.standard_normal(m.nq)
    d.qvel[:] = rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng)
    assert err["q"] < 1e-13 and err["v"] < 1e-12, err  # measured 1.0e-15, 7.1e-15


@pytest.mark.parametrize("integrator", ["Euler", pytest.param("RK4", marks=pytest.mark.slow),
                                        pytest.param("implicitfast", marks=pytest.mark.slow)])
def test_free_body_tumbling(tmp_path, integrator):
    scene, m = _scene(tmp_path, TUMBLER, integrator=integrator)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(1)
    quat = rng.standard_normal(4)
    d.qpos[3:7] = quat / np.linalg.norm(quat)
    d.qvel[:] = 3.0 * rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng)
    assert err["q"] < 1e-12 and err["v"] < 1e-11, err  # measured 1.4e-14, 7.2e-14


@pytest.mark.parametrize("name", ["inverted_double_pendulum.xml", "reacher.xml"])
def test_gymnasium_no_contact(name):
    scene, m = _asset(name)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(2)
    d.qpos[:] = m.qpos0 + 0.05 * rng.standard_normal(m.nq)  # near the middle: no limit reached
    d.qvel[:] = 0.1 * rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng, ctrl_scale=0.02)
    assert err["touching"] == 0
    assert err["q"] < 1e-12 and err["v"] < 1e-12, err  # measured 2.2e-15, 1.2e-14


# ------------------------------------------------------------------ with contacts and limits
@pytest.mark.parametrize("integrator", ["Euler", pytest.param("RK4", marks=pytest.mark.slow)])
def test_sphere_and_box_dropped_on_the_plane(tmp_path, integrator):
    scene, m = _scene(tmp_path, DROP, integrator=integrator)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(3)
    d.qvel[:] = 0.5 * rng.standard_normal(m.nv)
    err = _compare(scene, m, d, 100, rng)
    assert err["touching"] > 50 and err["made"] > 0
    assert err["q"] < 1e-12 and err["v"] < 1e-10, err  # measured 1.3e-14, 1.1e-12 (RK4)


def test_hinge_hits_its_limit(tmp_path):
    scene, m = _scene(tmp_path, LIMIT)
    d = mujoco.MjData(m)
    rng = np.random.default_rng(4)
    d.qvel[:] = 2.0
    err = _compare(scene, m, d, 100, rng, ctrl_scale=0.5)
    assert err["touching"] == 0  # the limit and the friction loss are constraints, not contacts
    assert err["q"] < 1e-12 and err["v"] < 1e-12, err  # measured 1.4e-17, 2.7e-15
    d2 = mujoco.MjData(m)
    d2.qvel[:] = 2.0
    seen = 0
    for _ in range(100):
        mujoco.mj_step(m, d2)
        seen += int(np.any(d2.efc_type == mujoco.mjtConstraint.mjCNSTR_LIMIT_JOINT))
    assert seen > 10  # the limit was reached


def _gym_start(m, name: str, rng) -> mujoco.MjData:
    """A state of a gymnasium robot near its reset state (feet on, or about to touch, the floor)."""
    d = mujoco.MjData(m)
    d.qpos[:] = m.qpos0 + 0.05 * rng.standard_normal(m.nq)
    if name == "ant.xml":
        d.qpos[2], d.qpos[3:7] = 0.6, (1.0, 0.0, 0.0, 0.0)
    d.qvel[:] = 0.1 * rng.standard_normal(m.nv)
    return d


@pytest.mark.slow
@pytest.mark.parametrize("name", ["hopper.xml", "ant.xml"])
def test_gymnasium_robots_with_contacts(name):
    """Hopper (condim 1, RK4) and Ant (condim 3, margin 0.01, RK4) under random controls, their
    feet touching and leaving the floor."""
    scene, m = _asset(name)
    rng = np.random.default_rng(5)
    d = _gym_start(m, name, rng)
    err = _compare(scene, m, d, 100, rng)
    assert err["touching"] > 5 and err["made"] > 0 and err["broken"] > 0, err
    assert err["q"] < 1e-11 and err["v"] < 1e-10, err  # measured 9.2e-15, 4.5e-14 (ant)


# ------------------------------------------------------------------ scenes built in code, rollouts, routes
def test_scene_built_in_code_matches_mujoco_defaults(tmp_path):
    """A sphere built in code with solver="mujoco" steps as the same sphere in an MJCF file with
    MuJoCo's default parameters (friction 0.5 on both geoms)."""
    xml = """
    <mujoco><option timestep="0.005"/>
      <worldbody><geom type="plane" size="5 5 0.1" friction="0.5 0.005 0.0001"/>
        <body name="ball" pos="0 0 0.2"><freejoint/>
          <geom type="sphere" size="0.1" mass="1.5" friction="0.5 0.005 0.0001"/></body>
      </worldbody></mujoco>"""
    _, m = _scene(tmp_path, xml)
    scene = Scene([sphere(0.1, 1.5, gravity=9.81)], solver="mujoco", friction=0.5)
    assert scene.mujoco.integrator == "euler" and scene.mujoco.cone == "pyramidal"
    m.opt.gravity[:] = (0.0, 0.0, -9.81)
    d = mujoco.MjData(m)
    d.qvel[:] = (0.5, -0.3, 0.0, 2.0, 1.0, -1.0)
    mujoco.mj_forward(m, d)
    q = torch.tensor([0.0, 0.0, 0.2, 0.0, 0.0, 0.0, 1.0], dtype=torch.float64)[None]
    v = torch.tensor(d.qvel, dtype=torch.float64)[None]  # identity orientation: the frames agree
    err = 0.0
    for _ in range(60):
        mujoco.mj_step(m, d)
        q, v = contact_step(scene, q, v, torch.zeros_like(v), m.opt.timestep)
        err = max(err, float(np.abs(q[0, :3].numpy() - d.qpos[:3]).max()))
    assert d.ncon == 1 and err < 1e-13, err  # measured 1.4e-16


def _drop_scene(tmp_path):
    scene, m = _scene(tmp_path, DROP, integrator="Euler")
    d = mujoco.MjData(m)
    for _ in range(100):  # settle: the brick rests on its face, its four corners 1e-4 m deep
        mujoco.mj_step(m, d)
    q0, v0 = mjcf_state_to_diffmech(scene, d.qpos.copy(), d.qvel.copy())
    return scene, m, q0, v0


def test_rollout_both_adjoints(tmp_path):
    scene, m, q0, v0 = _drop_scene(tmp_path)
    scene.mujoco.tolerance = 1e-12
    T = 5
    tau = torch.zeros(T, scene.nv, dtype=torch.float64, requires_grad=True)
    grads, finals = [], []
    for adjoint in ("checkpoint", "autograd"):
        stats: dict = {}
        Q, _ = rollout(scene, q0, v0, tau, m.opt.timestep, adjoint=adjoint, stats=stats)
        assert stats["route"] == "torch: mujoco solver"
        (g,) = torch.autograd.grad(Q[-1, 9], tau)
        grads.append(g)
        finals.append(Q[-1].detach())
    assert torch.equal(finals[0], finals[1])
    assert torch.allclose(grads[0], grads[1], atol=1e-12, rtol=1e-10)


def test_native_require_refuses_the_mujoco_solver(tmp_path):
    scene, m, q0, v0 = _drop_scene(tmp_path)
    with kernels.native_mode("require"), pytest.raises(NativeRouteError, match="mujoco solver"):
        contact_step(scene, q0, v0, torch.zeros_like(v0), m.opt.timestep)


def test_unknown_solver_and_refused_integrator(tmp_path):
    with pytest.raises(DiffmechError, match="mujoco"):
        Scene([sphere(0.1, 1.0)], solver="mujco")
    with pytest.raises(DiffmechError, match="implicit"):
        _scene(tmp_path, PENDULUM, integrator="implicit")
    # pusher's capsule and cylinder may touch: no such pair in the soft collision code; the error says
    # how to load the file with the hard-contact solver instead
    path = os.path.join(ASSETS, "pusher.xml")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(DiffmechError, match="capsule.*solver='pgs'"):
            Scene.from_mjcf(path)
        assert Scene.from_mjcf(path, solver="pgs").mujoco is None


def test_gradient_of_final_height(tmp_path):
    """d(final brick height)/d(tau, q0, brick mass) through 8 steps resting on the floor, against
    central differences at two step sizes."""
    scene, m, q0, v0 = _drop_scene(tmp_path)
    scene.mujoco.tolerance = 1e-14  # the finite differences need the solve converged far below their step
    robot = scene.model("brick")
    robot.make_link_param_learnable("brick", "mass")
    mass = robot.learnable_parameters()["brick.mass"]
    T, dt, iz = 8, m.opt.timestep, scene.slices["brick"].start + 2
    rng = np.random.default_rng(6)
    tau0 = torch.tensor(rng.uniform(-1, 1, (T, scene.nv)), dtype=torch.float64)

    def height(tau, q):
        Q, _ = rollout(scene, q, v0, tau, dt, adjoint="autograd")
        return Q[-1, iz]

    tau = tau0.clone().requires_grad_()
    q = q0.clone().requires_grad_()
    g_tau, g_q, g_m = torch.autograd.grad(height(tau, q), [tau, q, mass])
    d_tau = torch.tensor(rng.standard_normal((T, scene.nv)))
    d_q = torch.zeros_like(q0)
    d_q[iz - 2:iz + 1] = torch.tensor(rng.standard_normal(3))  # the brick's position
    m0 = mass.detach().clone()
    errors = []
    with torch.no_grad():
        for eps in (1e-6, 1e-5):
            fd_tau = (height(tau0 + eps * d_tau, q0) - height(tau0 - eps * d_tau, q0)) / (2 * eps)
            fd_q = (height(tau0, q0 + eps * d_q) - height(tau0, q0 - eps * d_q)) / (2 * eps)
            mass.copy_(m0 + eps)
            hp = height(tau0, q0)
            mass.copy_(m0 - eps)
            hm = height(tau0, q0)
            mass.copy_(m0)
            fd_m = (hp - hm) / (2 * eps)
            errors.append([float(abs(fd_tau - (g_tau * d_tau).sum()) / (g_tau * d_tau).sum().abs()),
                           float(abs(fd_q - (g_q * d_q).sum()) / (g_q * d_q).sum().abs()),
                           float(abs(fd_m - g_m) / g_m.abs())])
    # relative errors measured: tau 9e-6 (its effect on the height is 1e-8 m/N: round-off) and
    # 6e-7; q0 6e-9 and 2e-10; mass 1.4e-8 and 4e-9
    errors = np.asarray(errors)
    assert errors[:, 0].max() < 5e-5 and errors[:, 1:].max() < 1e-7, errors


def test_gradient_rk4_free_body(tmp_path):
    """RK4 on a tumbling free body: the gradient of a weighted sum of the final configuration with
    respect to the initial velocity and the joint forces (through the stages' quaternion exponentials
    and tangent maps), against central differences at two step sizes."""
    scene, m = _scene(tmp_path, TUMBLER, integrator="RK4")
    rng = np.random.default_rng(8)
    d = mujoco.MjData(m)
    quat = rng.standard_normal(4)
    d.qpos[3:7] = quat / np.linalg.norm(quat)
    d.qvel[:] = 3.0 * rng.standard_normal(m.nv)
    q0, v0 = mjcf_state_to_diffmech(scene, d.qpos.copy(), d.qvel.copy())
    T = 5
    tau0 = torch.tensor(rng.uniform(-1, 1, (T, scene.nv)), dtype=torch.float64)
    w = torch.tensor(rng.standard_normal(scene.nq), dtype=torch.float64)

    def f(v, tau):
        Q, _ = rollout(scene, q0, v, tau, m.opt.timestep, adjoint="autograd")
        return (Q[-1] * w).sum()

    v = v0.clone().requires_grad_()
    tau = tau0.clone().requires_grad_()
    g_v, g_tau = torch.autograd.grad(f(v, tau), [v, tau])
    d_v = torch.tensor(rng.standard_normal(scene.nv))
    d_tau = torch.tensor(rng.standard_normal((T, scene.nv)))
    errors = []
    with torch.no_grad():
        for eps in (1e-6, 1e-5):
            fd_v = (f(v0 + eps * d_v, tau0) - f(v0 - eps * d_v, tau0)) / (2 * eps)
            fd_tau = (f(v0, tau0 + eps * d_tau) - f(v0, tau0 - eps * d_tau)) / (2 * eps)
            errors.append([float(abs(fd_v - (g_v * d_v).sum())), float(abs(fd_tau - (g_tau * d_tau).sum()))])
    # measured (absolute; the directional derivatives are 7.4e-2 and 8.0e-4): v 1.3e-11, 1.6e-12;
    # tau 1.7e-10, 1.9e-11 (round-off of the differences at the smaller step)
    assert np.max(errors) < 2e-9, errors
