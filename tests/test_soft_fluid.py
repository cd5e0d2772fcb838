"""diffmech.sim.soft_fluid: MuJoCo's inertia-box fluid forces.

Oracles: MuJoCo's ``qfrc_fluid`` (``mj_forward``, float64) at random states of gymnasium's swimmer
and of a floating body with a hinged limb in a wind; central differences at two step sizes for the
gradients w.r.t. ``q`` and ``v``.
"""

import os

import mujoco  # noqa: E402
import numpy as np
import pytest
import torch

from diffmech.errors import ModelError  # noqa: E402
from diffmech.model.mjcf import mjcf_state_to_diffmech  # noqa: E402
from diffmech.sim import Scene  # noqa: E402
from diffmech.sim.soft_fluid import fluid_model  # noqa: E402

FLOATING = """<mujoco><option density="1.2" viscosity="0.01" wind="0.5 -1 0.3"/>
<worldbody><body name="b" pos="0 0 1"><freejoint/><geom type="box" size=".2 .1 .05" mass="2"/>
<body name="c" pos="0.3 0 0"><joint type="hinge" axis="0 1 0"/>
<geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.05"/></body></body></worldbody></mujoco>"""


@pytest.fixture(autouse=True)
def _quiet():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the MJCF reader's note on the fluid options
        yield


def _swimmer_path():
    import gymnasium
    return os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", "swimmer.xml")


def _floating_path(tmp_path):
    p = tmp_path / "floating.xml"
    p.write_text(FLOATING)
    return str(p)


def _mujoco_order(scene, m, d, f):
    """diffmech generalized force (nv,) -> MuJoCo's qvel order and axes (a free joint's linear row in
    world axes)."""
    f = f.clone()
    if m.jnt_type[0] == 0:
        f[:3] = torch.tensor(d.xmat[m.jnt_bodyid[0]].reshape(3, 3)) @ f[:3]
    out = np.zeros(m.nv)
    out[scene.models[scene.names[0]].meta["mjcf"]["qvel_index"]] = f.numpy()
    return out


@pytest.mark.parametrize("which", ["swimmer", "floating"])
def test_fluid_forces_equal_mujoco(which, tmp_path):
    path = _swimmer_path() if which == "swimmer" else _floating_path(tmp_path)
    m = mujoco.MjModel.from_xml_path(path)
    d = mujoco.MjData(m)
    scene = Scene.from_mjcf(path)
    fm = fluid_model(m, scene)
    rng = np.random.default_rng(0)
    for _ in range(4):
        qpos = m.qpos0 + rng.uniform(-1, 1, m.nq)
        if m.jnt_type[0] == 0:
            qpos[3:7] /= np.linalg.norm(qpos[3:7])
        qvel = rng.normal(size=m.nv) * 3
        d.qpos[:], d.qvel[:] = qpos, qvel
        mujoco.mj_forward(m, d)
        q, v = mjcf_state_to_diffmech(scene, qpos[None], qvel[None])
        got = _mujoco_order(scene, m, d, fm.forces(q, v)[0])
        want = d.qfrc_fluid
        assert np.abs(want).max() > 0.1
        # measured: 1.5e-11 on forces of 1.9e4 (swimmer), 9e-16 (floating)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-14 * max(1.0, np.abs(want).max()))


def test_no_fluid_gives_none(tmp_path):
    p = tmp_path / "dry.xml"
    p.write_text(FLOATING.replace('<option density="1.2" viscosity="0.01" wind="0.5 -1 0.3"/>', ""))
    m = mujoco.MjModel.from_xml_path(str(p))
    assert fluid_model(m, Scene.from_mjcf(str(p))) is None


def test_ellipsoid_model_is_refused(tmp_path):
    p = tmp_path / "ellipsoid.xml"
    p.write_text(FLOATING.replace('mass="2"/>', 'mass="2" fluidshape="ellipsoid"/>'))
    m = mujoco.MjModel.from_xml_path(str(p))
    with pytest.raises(ModelError, match="ellipsoid"):
        fluid_model(m, Scene.from_mjcf(str(p)))


def test_fluid_gradients_match_central_differences(tmp_path):
    path = _floating_path(tmp_path)
    m = mujoco.MjModel.from_xml_path(path)
    scene = Scene.from_mjcf(path)
    fm = fluid_model(m, scene)
    g = torch.Generator().manual_seed(0)
    q = scene.neutral_configuration()[None].clone()
    q[:, 7:] = 0.4
    v = torch.randn(1, scene.nv, generator=g, dtype=torch.float64)
    w = torch.randn(1, scene.nv, generator=g, dtype=torch.float64)
    dv = torch.randn(1, scene.nv, generator=g, dtype=torch.float64)
    dq = torch.randn(1, scene.nq, generator=g, dtype=torch.float64)
    dq[:, 3:7] = 0  # move along the joint and the translation; the quaternion stays unit

    def f(q, v):
        return (fm.forces(q, v) * w).sum()

    qr, vr = q.clone().requires_grad_(True), v.clone().requires_grad_(True)
    gq, gv = torch.autograd.grad(f(qr, vr), (qr, vr))
    for h in (1e-4, 1e-5):
        with torch.no_grad():
            fd_v = (f(q, v + h * dv) - f(q, v - h * dv)) / (2 * h)
            fd_q = (f(q + h * dq, v) - f(q - h * dq, v)) / (2 * h)
        assert abs(float(fd_v - (gv * dv).sum())) <= 1e-10 * max(1.0, abs(float(fd_v)))  # measured 3e-12
        assert abs(float(fd_q - (gq * dq).sum())) <= 1e-10 * max(1.0, abs(float(fd_q)))
