"""Mimic joints: a joint that follows another one, ``q = multiplier * q_master + offset``.

The generalised coordinates leave mimic joints out (as Pinocchio's ``JointModelMimic``); every
algorithm is checked against Pinocchio built with ``mimic=True`` and against the same tree with the
coupling eliminated by hand (``tau = G^T tau_full``, ``M = G^T M_full G``, ``J = J_full G``).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import diffmech
from conftest import random_state
from diffmech import JointSpec, LinkSpec, RobotSpec
from diffmech.errors import ModelError, OptionError
from diffmech.sim import rollout

pin = pytest.importorskip("pinocchio")
from oracle import PinOracle, rel_err  # noqa: E402

DT = torch.float64


def _data_file(pkg: str, rel: str) -> str:
    if pkg == "diff_robot_data":
        root = list(pytest.importorskip("diff_robot_data").__path__)[0]
    else:
        root = pytest.importorskip("pybullet_data").getDataPath()
    path = os.path.join(root, rel)
    if not os.path.isfile(path):
        pytest.skip(f"{rel} not installed")
    return path


FILES = {
    "panda_gripper": ("diff_robot_data", "panda_description/urdf/panda.urdf"),
    "xarm_gripper": ("pybullet_data", "xarm/xarm6_with_gripper.urdf"),
}


@pytest.mark.parametrize("key", list(FILES))
@pytest.mark.parametrize("floating_base", [False, True])
def test_matches_pinocchio(key, floating_base):
    path = _data_file(*FILES[key])
    robot = diffmech.load_urdf(path, floating_base=floating_base)
    assert robot.tree.coords is not None and robot.nv < robot.tree.nv
    oracle = PinOracle(robot, path)
    assert oracle.model.nv == robot.nv
    q, v, a, _ = random_state(robot, (4,), seed=3)
    qn, vn, an = q.numpy(), v.numpy(), a.numpy()
    checks = {
        "rnea": (robot.inverse_dynamics(q, v, a, passive=False), [oracle.rnea(*s) for s in zip(qn, vn, an)]),
        "crba": (robot.mass_matrix(q), [oracle.crba(x) for x in qn]),
        "fd": (robot.forward_dynamics(q, v, a, passive=False), [oracle.aba(*s) for s in zip(qn, vn, an)]),
        "fk": (robot.forward_kinematics(q), [oracle.forward_kinematics(x) for x in qn]),
        # Pinocchio's computeKineticEnergy refuses mimic joints: 1/2 v^T M v from its crba
        "kinetic": (robot.kinetic_energy(q, v), [0.5 * y @ oracle.crba(x) @ y for x, y in zip(qn, vn)]),
        "com": (robot.center_of_mass(q), [oracle.center_of_mass(x) for x in qn]),
        # and computePotentialEnergy too: -m g . c from its centre of mass
        "potential": (robot.potential_energy(q, passive=False),
                      [-float(robot.total_mass()) * robot.gravity.numpy() @ oracle.center_of_mass(x) for x in qn]),
    }
    link = robot.link_names[-1]
    for frame in ("world_aligned", "local", "world"):
        checks[f"jacobian {frame}"] = (robot.jacobian(q, link, frame=frame),
                                       [oracle.jacobian(x, link, frame) for x in qn])
    for name, (got, ref) in checks.items():
        err = rel_err(got.detach().numpy(), np.stack(ref)) if np.ndim(ref[0]) else \
            float(np.max(np.abs(got.detach().numpy() - np.array(ref)) / np.maximum(np.abs(ref), 1e-12)))
        assert err < 1e-10, (key, floating_base, name, err)


def _chain(mimic: dict | None = None, floating_base=False, damping=0.0, stiffness=0.0) -> diffmech.RobotModel:
    """A four-joint chain with a branch; ``mimic`` maps joint name -> (master, multiplier, offset)."""
    inertia = ((0.02, 0.001, 0.0), (0.001, 0.03, 0.002), (0.0, 0.002, 0.025))
    links = [LinkSpec(n, mass=m, com=(0.01, 0.02, 0.1), inertia=inertia)
             for n, m in (("base", 2.0), ("l1", 1.5), ("l2", 1.2), ("l3", 0.8), ("l4", 0.5), ("b1", 0.3))]
    mimic = mimic or {}
    joints = []
    for name, parent, child, axis, kind in (("j1", "base", "l1", (0, 0, 1), "revolute"),
                                            ("j2", "l1", "l2", (0, 1, 0), "revolute"),
                                            ("j3", "l2", "l3", (1, 0, 0), "prismatic"),
                                            ("j4", "l3", "l4", (0, 1, 1), "revolute"),
                                            ("jb", "l1", "b1", (1, 1, 0), "continuous")):
        joints.append(JointSpec(name, kind, parent, child, xyz=(0.05, -0.02, 0.3), rpy=(0.1, -0.2, 0.3), axis=axis,
                                lower=-2.0, upper=2.0, damping=damping, stiffness=stiffness, rest=0.1,
                                mimic=mimic.get(name)))
    return diffmech.RobotModel(RobotSpec("chain", links, joints), floating_base=floating_base)


@pytest.mark.parametrize("floating_base", [False, True])
def test_matches_the_coupling_eliminated_by_hand(floating_base):
    """Chains of mimic joints (j4 mimics j2 which mimics j1), offsets, prismatic and a branch; the
    passive terms and external forces of the mimic joints act through ``G^T``."""
    mimic = {"j2": ("j1", -0.7, 0.2), "j4": ("j2", 1.5, -0.1), "jb": ("j3", 2.0, 0.0)}
    coupled = _chain(mimic, floating_base, damping=0.3, stiffness=2.0)
    full = _chain(None, floating_base, damping=0.3, stiffness=2.0)
    assert coupled.joint_names == ["j1", "j3"] and full.nv == coupled.nv + 3
    nb = 7 if floating_base else 0
    vb = 6 if floating_base else 0
    # full joint order j1, j2, j3, j4, jb (depth first: j1, then j2-j3-j4, then jb)
    assert full.joint_names == ["j1", "j2", "j3", "j4", "jb"]
    G = torch.zeros(full.nv, coupled.nv, dtype=DT)
    G[:vb, :vb] = torch.eye(vb, dtype=DT)
    s2, s4 = -0.7, -0.7 * 1.5
    for row, (col, s) in enumerate([(0, 1.0), (0, s2), (1, 1.0), (0, s4), (1, 2.0)]):
        G[vb + row, vb + col] = s
    offset = torch.zeros(full.nq, dtype=DT)
    offset[nb + 1], offset[nb + 3] = 0.2, 1.5 * 0.2 - 0.1

    def expand_q(q):
        qj = q[..., nb:] @ G[vb:, vb:].T + offset[nb:]
        return torch.cat([q[..., :nb], qj], -1)

    q, v, a, f = random_state(coupled, (5,), seed=2)
    qf, vf, af = expand_q(q), v @ G.T, a @ G.T
    close = lambda x, y: torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)  # noqa: E731
    close(coupled.inverse_dynamics(q, v, a, f_ext=f), full.inverse_dynamics(qf, vf, af, f_ext=f) @ G)
    close(coupled.mass_matrix(q), G.T @ full.mass_matrix(qf) @ G)
    close(coupled.bias_forces(q, v), full.bias_forces(qf, vf) @ G)
    close(coupled.generalized_gravity(q), full.generalized_gravity(qf) @ G)
    close(coupled.jacobian(q, "l4"), full.jacobian(qf, "l4") @ G)
    close(coupled.forward_kinematics(q), full.forward_kinematics(qf))
    close(coupled.kinetic_energy(q, v), full.kinetic_energy(qf, vf))
    close(coupled.potential_energy(q), full.potential_energy(qf))
    # forward dynamics: G^T M G qdd = tau - G^T h
    tau = a
    qdd = coupled.forward_dynamics(q, v, tau, f_ext=f)
    close(coupled.inverse_dynamics(q, v, qdd, f_ext=f), tau)
    for method in ("aba", "crba"):
        close(coupled.forward_dynamics(q, v, tau, f_ext=f, method=method), qdd)


def test_gradients_and_rollouts():
    robot = _chain({"j4": ("j2", 1.5, -0.1)}, damping=0.2, stiffness=1.0)
    q, v, tau, _ = random_state(robot, (2,), seed=4)
    ins = [t.clone().requires_grad_(True) for t in (q, v, tau)]
    assert torch.autograd.gradcheck(lambda *x: robot.forward_dynamics(*x), ins)
    assert torch.autograd.gradcheck(lambda *x: robot.inverse_dynamics(*x), ins)
    robot.make_link_param_learnable("l4", "mass")
    u = 0.1 * torch.randn(2, 30, robot.nv, dtype=DT, requires_grad=True)
    grads = []
    for adjoint in ("checkpoint", "autograd"):
        qs, vs = rollout(robot, q, v, u, 0.01, adjoint=adjoint)
        grads.append(torch.autograd.grad(qs[:, -1].square().sum() + vs.square().mean(),
                                         [u, robot.link_params("l4").mass]))
    for g1, g2 in zip(*grads):
        torch.testing.assert_close(g1, g2, rtol=1e-10, atol=1e-12)


def test_limits_and_random_configurations_follow_the_independent_joints():
    robot = _chain({"j2": ("j1", 2.0, 0.0)})
    assert robot.joint_limits()["lower"].shape == (robot.nv,)
    q = robot.random_configuration(100)
    assert q.shape == (100, robot.nq)


def test_what_is_not_supported_says_so():
    robot = _chain({"j2": ("j1", 2.0, 0.0)})
    with pytest.raises(OptionError, match="mimic"):
        diffmech.dynamics.compiled(robot)
    with pytest.raises(ModelError, match="mimic"):
        rollout(robot, robot.neutral_configuration(), torch.zeros(robot.nv, dtype=DT),
                torch.zeros(3, robot.nv, dtype=DT), 0.01, integrator="variational_midpoint")


def test_bad_mimic_tags():
    with pytest.raises(ModelError, match="j9"):
        _chain({"j2": ("j9", 1.0, 0.0)})
    with pytest.raises(ModelError, match="cycle"):
        _chain({"j2": ("j4", 1.0, 0.0), "j4": ("j2", 1.0, 0.0)})
