"""Identities of rigid-body dynamics that must hold whatever the robot (float64).

Every robot gets random joint damping, springs and rest positions, so the passive terms are
exercised too. Time derivatives are taken by automatic differentiation along the motion
``q(t) = integrate(q, v, t)``, ``v(t) = v + t a`` (on the free-flyer manifold for a floating
base), and gradients in the local coordinates ``delta -> integrate(q, delta)``.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import FLOATING, get_robot, random_state, robot_path

FIXED = ["iiwa", "prismatic_mix", "branching_tree", "oblique_chain"]
IDS = FIXED + FLOATING
B = 6
TOL = 1e-9
# torch loads its forward-mode AD decompositions through torch.jit.script on the first jvp
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script` is deprecated:DeprecationWarning")


def rel(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Max over the leading (batch) dimension of max|actual - expected| / max|expected|."""
    a = actual.detach().reshape(actual.shape[0], -1)
    e = expected.detach().reshape(expected.shape[0], -1)
    scale = e.abs().max(-1).values.clamp_min(1e-12)
    return float(((a - e).abs().max(-1).values / scale).max())


def with_passive(key: str, seed: int = 7):
    """A copy of robot ``key`` with random positive damping/stiffness and random rest angles."""
    r = copy.deepcopy(get_robot(key))
    g = torch.Generator().manual_seed(seed)
    for name in r.joint_names:
        jp = r.joint_params(name)
        u = torch.rand(3, generator=g, dtype=torch.float64)
        jp.damping.copy_(0.1 + u[0])
        jp.stiffness.copy_(0.5 + 2 * u[1])
        jp.rest.copy_(u[2] - 0.5)
    return r


@pytest.fixture(scope="module", params=IDS)
def robot(request):
    return with_passive(request.param)


@pytest.fixture(scope="module")
def state(robot):
    return random_state(robot, (B,), seed=99)


def passive_torque(robot, q, v) -> torch.Tensor:
    """``-D v - K (q - rest)`` on the joint coordinates, zero on the base, built from the parameters."""
    d = torch.stack([robot.joint_params(n).damping for n in robot.joint_names])
    k = torch.stack([robot.joint_params(n).stiffness for n in robot.joint_names])
    rest = torch.stack([robot.joint_params(n).rest for n in robot.joint_names])
    nb = 6 if robot.floating_base else 0
    qj, vj = q[..., robot.nq - len(d):], v[..., nb:]
    tj = -d * vj - k * (qj - rest)
    return torch.cat([torch.zeros_like(v[..., :nb]), tj], dim=-1)


def test_passive_terms_in_inverse_dynamics(robot, state):
    q, v, a, _ = state
    diff = robot.inverse_dynamics(q, v, a, passive=True) - robot.inverse_dynamics(q, v, a, passive=False)
    assert rel(diff, -passive_torque(robot, q, v)) < TOL
    assert diff.abs().max() > 1e-3  # the passive terms are really there


@pytest.mark.parametrize("method", ["aba", "crba"])
@pytest.mark.parametrize("passive", [True, False])
@pytest.mark.parametrize("use_fext", [False, True])
def test_forward_inverts_inverse(robot, state, method, passive, use_fext):
    q, v, a, f = state
    f = f if use_fext else None
    tau = robot.inverse_dynamics(q, v, a, f_ext=f, passive=passive)
    a2 = robot.forward_dynamics(q, v, tau, f_ext=f, passive=passive, method=method)
    assert rel(a2, a) < TOL
    tau2 = robot.inverse_dynamics(q, v, a2, f_ext=f, passive=passive)
    assert rel(tau2, tau) < TOL


def test_mass_matrix_spd(robot, state):
    M = robot.mass_matrix(state[0])
    assert rel(M, M.transpose(-1, -2)) < 1e-14
    assert torch.linalg.eigvalsh(M).min() > 0


def test_mass_matrix_columns_are_rnea_differences(robot, state):
    q = state[0]
    nv = robot.nv
    eye = torch.eye(nv, dtype=q.dtype)
    zero = torch.zeros(nv, dtype=q.dtype)
    # (B, nv, nv): row i is the torque for a = e_i
    tau_e = robot.inverse_dynamics(q[:, None], zero, eye, passive=False)
    tau_0 = robot.inverse_dynamics(q, zero, zero, passive=False)[:, None]
    M = robot.mass_matrix(q)
    assert rel(tau_e - tau_0, M.transpose(-1, -2)) < TOL


@pytest.mark.parametrize("passive", [True, False])
def test_bias_forces_is_rnea_at_zero_acceleration(robot, state, passive):
    q, v, _, _ = state
    h = robot.bias_forces(q, v, passive=passive)
    assert rel(h, robot.inverse_dynamics(q, v, torch.zeros_like(v), passive=passive)) < TOL
    g = robot.generalized_gravity(q)
    assert rel(g, robot.inverse_dynamics(q, torch.zeros_like(v), torch.zeros_like(v), passive=False)) < TOL


def mass_matrix_rate(robot, q, v) -> torch.Tensor:
    """``dM/dt (B, nv, nv)`` along ``q(t) = integrate(q, v, t)`` at ``t = 0``, by forward-mode AD."""
    t = torch.zeros(q.shape[0], dtype=q.dtype)
    _, Mdot = torch.func.jvp(lambda t: robot.mass_matrix(robot.integrate(q, v, t)), (t,), (torch.ones_like(t),))
    return Mdot


def test_power_of_coriolis_forces(robot, state):
    """``v^T (dM/dt - 2 C) v = 0`` with ``C v = h(q, v) - g(q)`` (holds in the free-flyer's
    quasi-velocities too: it is the kinetic-energy balance)."""
    q, v, _, _ = state
    Cv = robot.bias_forces(q, v, passive=False) - robot.generalized_gravity(q)
    Mdot = mass_matrix_rate(robot, q, v)
    vMv = (v * (Mdot @ v[..., None])[..., 0]).sum(-1)
    scale = (v * v).sum(-1) * Mdot.abs().amax((-1, -2))
    assert ((vMv - 2 * (v * Cv).sum(-1)).abs() < TOL * scale).all()
    assert (vMv.abs() > 1e-6 * scale).any()  # the identity is not 0 = 0

@pytest.mark.parametrize("key", FIXED)
def test_christoffel_coriolis_skew(key):
    """Fixed base (q is a vector space): ``C`` from the Christoffel symbols of ``M`` gives
    ``C v = h - g`` and makes ``dM/dt - 2 C`` skew-symmetric."""
    robot = get_robot(key)
    q, v, _, _ = random_state(robot, (3,), seed=5)
    Mdot = mass_matrix_rate(robot, q, v)
    for i in range(q.shape[0]):
        dM = torch.func.jacfwd(robot.mass_matrix)(q[i])  # dM[i, j, k] = dM_ij / dq_k
        # gamma[i, j, k] = 1/2 (dM_ij/dq_k + dM_ik/dq_j - dM_jk/dq_i)
        gamma = 0.5 * (dM + torch.einsum("ikj->ijk", dM) - torch.einsum("jki->ijk", dM))
        C = gamma @ v[i]
        assert rel((dM @ v[i])[None], Mdot[i][None]) < TOL
        N = Mdot[i] - 2 * C
        scale = Mdot[i].abs().max()
        assert (N + N.T).abs().max() < TOL * scale
        Cv = robot.bias_forces(q[i], v[i], passive=False) - robot.generalized_gravity(q[i])
        assert rel((C @ v[i])[None], Cv[None]) < TOL


def energy_rate(robot, q, v, a, passive: bool) -> torch.Tensor:
    """``dE/dt (B,)`` of ``E = T + U(passive)`` along ``(integrate(q, v, t), v + t a)`` at ``t = 0``."""
    t = torch.zeros(q.shape[0], dtype=q.dtype, requires_grad=True)
    qt = robot.integrate(q, v, t)
    vt = v + t[:, None] * a
    E = robot.kinetic_energy(qt, vt) + robot.potential_energy(qt, passive=passive)
    (dE,) = torch.autograd.grad(E.sum(), t)
    return dE


def test_energy_balance(robot, state):
    q, v, tau, _ = state
    a = robot.forward_dynamics(q, v, tau, passive=True)
    tp = passive_torque(robot, q, v)
    # rigid-body energy: the springs and dampers act as external joint forces
    dE = energy_rate(robot, q, v, a, passive=False)
    expect = (v * (tau + tp)).sum(-1)
    assert rel(dE[:, None], expect[:, None]) < 1e-8
    # with the spring energy included only damping remains, and it dissipates
    d = torch.stack([robot.joint_params(n).damping for n in robot.joint_names])
    vj = v[:, robot.nv - len(d):]
    dE_total = energy_rate(robot, q, v, a, passive=True)
    assert rel(dE_total[:, None], ((v * tau).sum(-1) - (d * vj * vj).sum(-1))[:, None]) < 1e-8
    a0 = robot.forward_dynamics(q, v, torch.zeros_like(tau), passive=True)
    assert (energy_rate(robot, q, v, a0, passive=True) < 0).all()


def test_kinetic_energy_quadratic_form(robot, state):
    q, v, _, _ = state
    M = robot.mass_matrix(q)
    T = robot.kinetic_energy(q, v)
    assert rel(T[:, None], 0.5 * (v * (M @ v[..., None])[..., 0]).sum(-1)[:, None]) < TOL
    assert (T > 0).all()


def local_gradient(robot, fn, q) -> torch.Tensor:
    """``d fn(integrate(q, delta)) / d delta`` at ``delta = 0``, ``(B, nv)``."""
    delta = torch.zeros(q.shape[0], robot.nv, dtype=q.dtype, requires_grad=True)
    (g,) = torch.autograd.grad(fn(robot.integrate(q, delta)).sum(), delta)
    return g


def test_gravity_is_potential_gradient(robot, state):
    q = state[0]
    dU = local_gradient(robot, lambda x: robot.potential_energy(x, passive=False), q)
    assert rel(robot.generalized_gravity(q), dU) < TOL
    # with springs: the static joint forces hold both gravity and the springs
    dU_total = local_gradient(robot, lambda x: robot.potential_energy(x, passive=True), q)
    zero = torch.zeros_like(dU)
    assert rel(robot.inverse_dynamics(q, zero, zero, passive=True), dU_total) < TOL


def test_jacobian_is_velocity_of_link(robot, state):
    """``J(q) v`` (world-aligned) is the time derivative of the link pose along the motion."""
    q, v, _, _ = state
    link = robot.link_names[-1]
    t = torch.zeros(q.shape[0], dtype=q.dtype)
    T, Tdot = torch.func.jvp(lambda t: robot.link_pose(robot.integrate(q, v, t), link), (t,), (torch.ones_like(t),))
    Jv = (robot.jacobian(q, link) @ v[..., None])[..., 0]
    assert rel(Tdot[:, :3, 3], Jv[:, :3]) < TOL
    W = Tdot[:, :3, :3] @ T[:, :3, :3].transpose(-1, -2)  # skew(omega)
    omega = torch.stack([W[:, 2, 1], W[:, 0, 2], W[:, 1, 0]], -1)
    assert rel(omega, Jv[:, 3:]) < TOL


@pytest.mark.parametrize("key", FLOATING + ["prismatic_mix"])
def test_integrate_matches_pinocchio(key):
    pin = pytest.importorskip("pinocchio")
    from oracle import PinOracle

    robot = get_robot(key)
    o = PinOracle(robot, robot_path(key))
    q, v, _, _ = random_state(robot, (20,), seed=3)
    v = 3 * v  # rotations well beyond the small-angle branch
    for dt in (1e-3, 0.7):
        qn = robot.integrate(q, v, dt)
        for i in range(q.shape[0]):
            mine = o.q(qn[i].numpy())
            ref = np.asarray(pin.integrate(o.model, o.q(q[i].numpy()), o.v(v[i].numpy()) * dt))
            if robot.floating_base:
                # q and -q are one rotation; compare with the sign that aligns them
                s = np.sign(mine[3:7] @ ref[3:7])
                mine[3:7] *= s
            assert np.abs(mine - ref).max() < 1e-12 * max(1.0, np.abs(ref).max())
        if robot.floating_base:
            assert (qn[:, 3:7].norm(dim=-1) - 1).abs().max() < 1e-14


def test_integrate_keeps_unit_quaternion_over_many_steps():
    robot = get_robot("humanoid")
    q, v, _, _ = random_state(robot, (8,), seed=11)
    for _ in range(200):
        q = robot.integrate(q, 5 * v, 0.05)
    assert (q[:, 3:7].norm(dim=-1) - 1).abs().max() < 1e-12
