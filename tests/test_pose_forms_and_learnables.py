"""Pose outputs as position + quaternion, the SE(3) pose error, freezing and unfreezing learnable
parameters, readable parameter names, and value sources (modules that compute a parameter's value).

Oracles: Pinocchio (link placements and their quaternions, ``log6``), central differences, the
matrix form of the same pose, and values set by hand.
"""

from __future__ import annotations

import copy
import io
import pickle

import numpy as np
import pytest
import torch
from torch import nn

import diffmech
from conftest import get_robot, random_state, robot_path
from diffmech import spatial
from diffmech.errors import ModelError, OptionError
from diffmech.model.params import (
    PositiveScalar,
    SymmetricPositiveDefinite,
    ValueSource,
    is_value_source,
    make_link_inertial_learnable,
)
from oracle import PinOracle


def _iiwa():
    return copy.deepcopy(get_robot("iiwa"))


# ----------------------------------------------------------------------------- poses
@pytest.mark.parametrize("key", ["iiwa", "allegro"])
def test_pos_quat_pose_matches_the_matrix_and_pinocchio(key):
    pin = pytest.importorskip("pinocchio")
    robot = get_robot(key)
    q = random_state(robot, (6,), seed=1)[0]
    link = robot.link_names[-1]
    pos, quat = robot.link_pose(q, link, form="pos_quat")
    T = robot.link_pose(q, link)
    assert pos.shape == (6, 3) and quat.shape == (6, 4)
    torch.testing.assert_close(pos, T[..., :3, 3], rtol=0, atol=0)
    torch.testing.assert_close(spatial.quat_to_matrix(quat), T[..., :3, :3], rtol=0, atol=1e-14)
    assert bool((quat[..., 3] >= 0).all())
    p2, R2 = robot.link_pose(q, link, form="pos_rot")
    assert torch.equal(p2, pos) and torch.equal(R2, T[..., :3, :3])
    oracle = PinOracle(robot, robot_path(key))
    model, data = oracle.model, oracle.data
    fid = model.getFrameId(link, pin.BODY)
    for b in range(6):
        pin.framesForwardKinematics(model, data, oracle.q(q[b].numpy()))
        M = data.oMf[fid]
        ref = pin.Quaternion(M.rotation).coeffs()  # (x, y, z, w)
        ref = ref if ref[3] >= 0 else -ref
        np.testing.assert_allclose(pos[b].numpy(), M.translation, atol=1e-12)
        np.testing.assert_allclose(quat[b].numpy(), ref, atol=1e-12)
    # all links at once, any batch shape
    P, Q = robot.forward_kinematics(q.reshape(2, 3, -1), form="pos_quat")
    assert P.shape == (2, 3, robot.n_links, 3) and Q.shape == (2, 3, robot.n_links, 4)
    i = robot.link_names.index(link)
    torch.testing.assert_close(Q.reshape(6, -1, 4)[:, i], quat, rtol=0, atol=1e-15)
    with pytest.raises(OptionError, match="pose form"):
        robot.link_pose(q, link, form="quaternion")


def test_pos_quat_gradient():
    robot = get_robot("iiwa")
    q = random_state(robot, (2,), seed=2)[0].requires_grad_()
    assert torch.autograd.gradcheck(lambda x: torch.cat(robot.link_pose(x, "iiwa_link_ee", form="pos_quat"), -1), (q,))


def test_pose_error_is_pinocchio_log6_and_takes_one_pose_to_the_other():
    pin = pytest.importorskip("pinocchio")
    g = torch.Generator().manual_seed(0)
    nu = torch.randn(20, 6, generator=g, dtype=torch.float64)
    T = spatial.homogeneous(*spatial.se3_exp(nu))
    Tt = spatial.homogeneous(*spatial.se3_exp(torch.randn(20, 6, generator=g, dtype=torch.float64)))
    err = spatial.pose_error(T, Tt)
    for b in range(20):
        M, Mt = pin.SE3(T[b].numpy()), pin.SE3(Tt[b].numpy())
        np.testing.assert_allclose(err[b].numpy(), pin.log6(M.actInv(Mt)).vector, atol=1e-11)
    # T exp(err) = T_target
    R, p = spatial.se3_exp(err)
    torch.testing.assert_close(T @ spatial.homogeneous(R, p), Tt, rtol=0, atol=1e-11)
    assert float(spatial.pose_error(T, T).abs().max()) < 1e-12
    torch.testing.assert_close(spatial.se3_log_matrix(T), spatial.se3_log(T[..., :3, :3], T[..., :3, 3]))
    split = spatial.pose_error(T, Tt, frame="split")
    torch.testing.assert_close(split[..., :3], Tt[..., :3, 3] - T[..., :3, 3])
    torch.testing.assert_close(spatial.so3_exp(split[..., 3:]) @ T[..., :3, :3], Tt[..., :3, :3], rtol=0, atol=1e-11)
    with pytest.raises(OptionError, match="frame"):
        spatial.pose_error(T, Tt, frame="world")
    # differentiable w.r.t. both poses, through a robot's pose
    robot = get_robot("iiwa")
    q = random_state(robot, (2,), seed=3)[0].requires_grad_()
    target = Tt[:2]
    assert torch.autograd.gradcheck(lambda x: spatial.pose_error(robot.link_pose(x, "iiwa_link_ee"), target), (q,))


# ----------------------------------------------------------------------------- freezing
def _grads(robot):
    q, v, a, _ = random_state(robot, (3,), seed=4)
    robot.zero_grad()
    tau = robot.inverse_dynamics(q, v, a)
    if tau.requires_grad:
        tau.square().sum().backward()
    return {n: p.grad for n, p in robot.named_parameters()}


def test_unfreeze_link_param_restores_training():
    robot = _iiwa()
    robot.make_link_param_learnable("iiwa_link_2", "mass")
    robot.make_link_param_learnable("iiwa_link_3", "inertia", SymmetricPositiveDefinite())
    robot.make_link_param_learnable("iiwa_link_4", "damping", PositiveScalar())
    make_link_inertial_learnable(robot, "iiwa_link_5")
    names = {"iiwa_link_2.mass", "iiwa_link_3.inertia.raw", "iiwa_joint_4.damping.raw", "iiwa_link_5.inertial.theta"}
    assert set(robot.learnable_parameters(readable=True)) == names
    for link, name in [("iiwa_link_2", "mass"), ("iiwa_link_3", "inertia"), ("iiwa_link_4", "damping"),
                       ("iiwa_link_5", "com")]:
        robot.freeze_link_param(link, name)
    assert robot.learnable_parameters() == {}
    assert all(g is None for g in _grads(robot).values())
    for link, name in [("iiwa_link_2", "mass"), ("iiwa_link_3", "inertia"), ("iiwa_link_4", "damping"),
                       ("iiwa_link_5", "mass")]:
        robot.unfreeze_link_param(link, name)
    assert set(robot.learnable_parameters(readable=True)) == names
    grads = _grads(robot)
    qualified = robot.learnable_parameters(readable=False)
    assert all(grads[n] is not None and float(grads[n].abs().sum()) > 0 for n in qualified)
    with pytest.raises(ModelError, match="not learnable"):
        robot.unfreeze_link_param("iiwa_link_6", "com")


def test_readable_names_name_the_same_tensors_as_the_qualified_ones():
    robot = _iiwa()
    robot.make_link_param_learnable("iiwa_link_1", "com")
    robot.make_link_param_learnable("iiwa_link_2", "trans")  # the joint above the link
    robot.make_link_param_learnable("iiwa_link_3", "mass", PositiveScalar())
    robot.make_link_param_learnable("iiwa_link_4", "inertia", SymmetricPositiveDefinite())
    # two parametrizations of one tensor
    from torch.nn.utils import parametrize

    parametrize.register_parametrization(robot.link_params("iiwa_link_4"), "inertia", nn.Identity())
    make_link_inertial_learnable(robot, "iiwa_link_6")
    qualified = robot.learnable_parameters(readable=False)
    readable = robot.learnable_parameters()
    assert list(readable) == ["iiwa_link_1.com", "iiwa_link_3.mass.raw", "iiwa_link_4.inertia.raw",
                              "iiwa_link_6.inertial.theta", "iiwa_joint_2.origin_xyz"]
    assert all(a is b for a, b in zip(qualified.values(), readable.values()))
    assert "links.1.com" in qualified  # the keys of functional_call and state_dict
    assert set(qualified) <= set(dict(robot.named_parameters()))


# ----------------------------------------------------------------------------- value sources
class Mass(nn.Module):
    """A value source: ``forward()`` returns the value (kg) itself, from its own tensor."""

    def __init__(self, value: float):
        super().__init__()
        self.log_m = nn.Parameter(torch.tensor(float(value)).log())

    def forward(self):
        return self.log_m.exp()


class Wrong(nn.Module):
    def forward(self):
        return torch.ones(2)


def test_value_source_computes_the_parameter():
    assert is_value_source(Mass(1.0)) and not is_value_source(PositiveScalar())
    robot = _iiwa()
    ref = copy.deepcopy(robot)
    with torch.no_grad():
        ref.link_params("iiwa_link_3").mass.fill_(2.5)
    robot.make_link_param_learnable("iiwa_link_3", "mass", Mass(2.5))
    assert isinstance(robot.link_params("iiwa_link_3").parametrizations.mass[0], ValueSource)
    assert list(robot.learnable_parameters(readable=True)) == ["iiwa_link_3.mass.log_m"]
    q, v, a, _ = random_state(robot, (4,), seed=5)
    tau = robot.inverse_dynamics(q, v, a)
    torch.testing.assert_close(tau, ref.inverse_dynamics(q, v, a), rtol=1e-13, atol=1e-12)
    # gradient w.r.t. log m = m d(tau)/dm, by central differences in m
    tau.sum().backward()
    g = robot.link_params("iiwa_link_3").parametrizations.mass[0].source.log_m.grad
    eps = 1e-6
    fd = []
    for s in (1, -1):
        with torch.no_grad():
            ref.link_params("iiwa_link_3").mass.fill_(2.5 + s * eps)
        fd.append(float(ref.inverse_dynamics(q, v, a).sum()))
    assert float(g) == pytest.approx(2.5 * (fd[0] - fd[1]) / (2 * eps), rel=1e-6)
    with pytest.raises(ModelError, match="iiwa_link_3.*Wrong.*1 values"):
        _iiwa().make_link_param_learnable("iiwa_link_3", "mass", Wrong())


def test_value_sources_save_load_copy_and_pickle():
    robot = _iiwa()
    robot.make_link_param_learnable("iiwa_link_3", "mass", Mass(2.5))
    with torch.no_grad():
        robot.link_params("iiwa_link_3").parametrizations.mass[0].source.log_m.fill_(np.log(3.0))
    q, v, a, _ = random_state(robot, (2,), seed=6)
    tau = robot.inverse_dynamics(q, v, a)
    # into a model holding the parameter the same way: the source's own tensors are restored
    other = _iiwa()
    other.make_link_param_learnable("iiwa_link_3", "mass", Mass(1.0))
    other.load_state_dict(robot.state_dict())
    torch.testing.assert_close(other.inverse_dynamics(q, v, a), tau, rtol=0, atol=0)
    # into a plain model: the value
    plain = _iiwa()
    plain.load_state_dict(robot.state_dict())
    assert float(plain.link_params("iiwa_link_3").mass) == pytest.approx(3.0)
    # a value cannot be pushed into a source
    with pytest.raises(ModelError, match="cannot be set from a value"):
        other.load_state_dict(_iiwa().state_dict())
    for clone in (copy.deepcopy(robot), pickle.loads(pickle.dumps(robot))):
        torch.testing.assert_close(clone.inverse_dynamics(q, v, a), tau, rtol=0, atol=0)
    buf = io.BytesIO()
    torch.save(robot, buf)
    buf.seek(0)
    torch.testing.assert_close(torch.load(buf, weights_only=False).inverse_dynamics(q, v, a), tau, rtol=0, atol=0)


def test_drm_parametrization_modules_work_on_a_native_model():
    """differentiable-robot-model's own classes are value sources too."""
    drm_params = pytest.importorskip("differentiable_robot_model.rigid_body_params")
    robot = diffmech.load_urdf(robot_path("iiwa"), dtype=torch.float32)
    torch.manual_seed(0)
    robot.make_link_param_learnable("iiwa_link_1", "mass", drm_params.PositiveScalar(init_param=torch.tensor(4.0)))
    robot.make_link_param_learnable("iiwa_link_1", "inertia_mat", drm_params.SymmPosDef3DInertiaMatrixNet(
        init_param=robot.link_params("iiwa_link_1").inertia.detach().clone()[None]))
    assert float(robot.link_params("iiwa_link_1").mass) == pytest.approx(4.0)
    assert set(robot.learnable_parameters(readable=True)) == {"iiwa_link_1.mass.l", "iiwa_link_1.inertia.l"}
    q, v, a, _ = random_state(robot, (3,), seed=7, dtype=torch.float32)
    robot.inverse_dynamics(q, v, a).sum().backward()
    assert all(p.grad is not None for p in robot.learnable_parameters().values())
