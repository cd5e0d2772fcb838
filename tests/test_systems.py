"""The builders of diffmech.model.systems against closed-form mechanics (float64)."""

import math

import pytest
import torch

from diffmech.errors import ModelError
from diffmech.model import systems

G = 9.81
f64 = dict(dtype=torch.float64)


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# ---------------------------------------------------------------------------- pendulum
@pytest.mark.parametrize("mass,length,radius", [(1.0, 1.0, None), (2.5, 0.4, 0.05), (0.3, 2.0, 0.0)])
def test_pendulum_mass_matrix_and_gravity(mass, length, radius):
    rob = systems.pendulum(mass, length, bob_radius=radius)
    r = 0.01 * length if radius is None else radius
    inertia = 0.4 * mass * r**2
    q = torch.linspace(-3.0, 3.0, 13, **f64)[:, None]
    M = rob.mass_matrix(q)
    torch.testing.assert_close(M, torch.full_like(M, mass * length**2 + inertia), rtol=1e-13, atol=1e-14)
    torch.testing.assert_close(rob.generalized_gravity(q), mass * G * length * torch.sin(q), rtol=1e-12, atol=1e-13)
    # Unforced acceleration points back down: -g(q)/M.
    qdd = rob.forward_dynamics(q, torch.zeros_like(q), torch.zeros_like(q))
    torch.testing.assert_close(qdd, -mass * G * length * torch.sin(q) / (mass * length**2 + inertia))


def test_pendulum_sign_convention_tip_position():
    rob = systems.pendulum(1.0, 0.7)
    theta = torch.tensor([[0.0], [0.4], [-1.2]], **f64)
    p = rob.link_pose(theta, "tip")[..., :3, 3]
    expected = torch.stack([-0.7 * torch.sin(theta[:, 0]), torch.zeros(3, **f64), -0.7 * torch.cos(theta[:, 0])], -1)
    torch.testing.assert_close(p, expected)
    assert rob.joint_types == ["continuous"] and rob.link_names == ["base", "link1", "tip"]


def test_pendulum_damping_is_passive_torque():
    rob = systems.pendulum(1.0, 1.0, damping=0.3)
    q, v, a = torch.tensor([0.2], **f64), torch.tensor([1.5], **f64), torch.tensor([-0.4], **f64)
    diff = rob.inverse_dynamics(q, v, a) - rob.inverse_dynamics(q, v, a, passive=False)
    torch.testing.assert_close(diff, 0.3 * v)


def test_pendulum_small_angle_period():
    mass, length, radius = 1.3, 0.8, 0.1
    rob = systems.pendulum(mass, length, bob_radius=radius)
    M = mass * length**2 + 0.4 * mass * radius**2
    period = 2 * math.pi * math.sqrt(M / (mass * G * length))
    # Linearisation at the bottom: d(qdd)/dq = -omega^2.
    q0 = torch.zeros(1, **f64, requires_grad=True)
    (dqdd,) = torch.autograd.grad(rob.forward_dynamics(q0, torch.zeros(1, **f64), torch.zeros(1, **f64)).sum(), q0)
    assert abs(float(dqdd) + (2 * math.pi / period) ** 2) < 1e-12
    # Integrating one analytic period from a small release angle brings the bob back (RK4).
    n = 400
    dt = period / n
    x = torch.tensor([1e-3, 0.0], **f64)

    def f(x):
        return torch.cat([x[1:], rob.forward_dynamics(x[:1], x[1:], torch.zeros(1, **f64))])

    for _ in range(n):
        k1 = f(x)
        k2 = f(x + 0.5 * dt * k1)
        k3 = f(x + 0.5 * dt * k2)
        k4 = f(x + dt * k3)
        x = x + dt / 6 * (k1 + 2 * k2 + 2 * k3 + k4)
    # The anharmonic period shift at 1e-3 rad is ~6e-8 relative; RK4 error is far smaller.
    assert abs(float(x[0]) - 1e-3) < 1e-9
    assert abs(float(x[1])) < 1e-8


def test_gravity_is_configurable():
    q = torch.tensor([[0.3], [-1.0]], **f64)
    moon = systems.pendulum(2.0, 0.5, gravity=1.62)
    torch.testing.assert_close(moon.generalized_gravity(q), 2.0 * 1.62 * 0.5 * torch.sin(q))
    none = systems.pendulum(2.0, 0.5, gravity=(0.0, 0.0, 0.0))
    assert none.generalized_gravity(q).abs().max() == 0
    # Gravity with an x component: V = m l (gx sin q + gz cos q), so g(q) = m l (gx cos q - gz sin q).
    gx, gz = 2.0, -9.0
    side = systems.pendulum(2.0, 0.5, gravity=(gx, 0.0, gz))
    torch.testing.assert_close(side.generalized_gravity(q), 2.0 * 0.5 * (gx * torch.cos(q) - gz * torch.sin(q)))
    side.set_gravity((0.0, 0.0, -G))
    torch.testing.assert_close(side.generalized_gravity(q), 2.0 * G * 0.5 * torch.sin(q))
    # Every builder accepts the keyword.
    builders = (systems.cartpole, systems.acrobot, systems.double_pendulum,
                lambda **kw: systems.n_link_pendulum(3, **kw))
    for build in builders:
        rob = build(gravity=(0.0, 0.0, 0.0))
        assert rob.gravity.tolist() == [0.0, 0.0, 0.0]
        assert rob.generalized_gravity(rob.random_configuration(4, generator=_gen())).abs().max() == 0


# ---------------------------------------------------------------------------- cart-pole
def test_cartpole_closed_form():
    mc, mp, l, r = 1.7, 0.3, 0.6, 0.02
    rob = systems.cartpole(mc, mp, l, bob_radius=r)
    I = 0.4 * mp * r**2
    assert rob.joint_names == ["slider", "hinge"] and rob.joint_types == ["prismatic", "continuous"]
    g = _gen(1)
    q = torch.randn(32, 2, generator=g, **f64) * 2
    v = torch.randn(32, 2, generator=g, **f64) * 2
    s, c = torch.sin(q[:, 1]), torch.cos(q[:, 1])
    M = torch.stack([torch.stack([torch.full_like(c, mc + mp), -mp * l * c], -1),
                     torch.stack([-mp * l * c, torch.full_like(c, mp * l * l + I)], -1)], -2)
    torch.testing.assert_close(rob.mass_matrix(q), M, rtol=1e-13, atol=1e-13)
    h = torch.stack([mp * l * s * v[:, 1] ** 2, mp * G * l * s], -1)
    torch.testing.assert_close(rob.bias_forces(q, v), h, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(rob.generalized_gravity(q), torch.stack([torch.zeros_like(s), mp * G * l * s], -1))
    # Bob position: (x - l sin theta, 0, -l cos theta).
    p = rob.link_pose(q, "tip")[..., :3, 3]
    torch.testing.assert_close(p, torch.stack([q[:, 0] - l * s, torch.zeros_like(s), -l * c], -1))
    assert rob.actuated_joints == ["slider"]
    assert abs(float(rob.total_mass()) - (mc + mp)) < 1e-15


def test_cartpole_damping_per_joint():
    rob = systems.cartpole(damping=(0.5, 0.02))
    q, v, a = torch.tensor([0.1, 0.4], **f64), torch.tensor([1.0, -2.0], **f64), torch.zeros(2, **f64)
    torch.testing.assert_close(rob.inverse_dynamics(q, v, a) - rob.inverse_dynamics(q, v, a, passive=False),
                               torch.tensor([0.5, -0.04], **f64))


# ---------------------------------------------------------------------------- double pendulum
def _double_pendulum_M(q, m1, m2, l1, l2):
    c2 = torch.cos(q[..., 1])
    m11 = (m1 + m2) * l1**2 + m2 * l2**2 + 2 * m2 * l1 * l2 * c2
    m12 = m2 * l2**2 + m2 * l1 * l2 * c2
    m22 = torch.full_like(c2, m2 * l2**2)
    return torch.stack([torch.stack([m11, m12], -1), torch.stack([m12, m22], -1)], -2)


def test_double_pendulum_point_mass_matrix_and_gravity():
    m1, m2, l1, l2 = 1.2, 0.7, 0.9, 0.5
    rob = systems.double_pendulum((m1, m2), (l1, l2), bob_radius=0.0)
    q = torch.randn(64, 2, generator=_gen(2), **f64) * 3
    torch.testing.assert_close(rob.mass_matrix(q), _double_pendulum_M(q, m1, m2, l1, l2), rtol=1e-13, atol=1e-13)
    s1, s12 = torch.sin(q[:, 0]), torch.sin(q[:, 0] + q[:, 1])
    grav = torch.stack([(m1 + m2) * G * l1 * s1 + m2 * G * l2 * s12, m2 * G * l2 * s12], -1)
    torch.testing.assert_close(rob.generalized_gravity(q), grav, rtol=1e-12, atol=1e-12)


def test_double_pendulum_bob_inertia_adds_rotational_terms():
    m1, m2, l1, l2, r1, r2 = 1.0, 2.0, 1.0, 0.8, 0.1, 0.05
    rob = systems.double_pendulum((m1, m2), (l1, l2), bob_radius=(r1, r2))
    I1, I2 = 0.4 * m1 * r1**2, 0.4 * m2 * r2**2
    q = torch.randn(16, 2, generator=_gen(3), **f64)
    # bob 1 turns with q1, bob 2 with q1 + q2.
    extra = torch.tensor([[I1 + I2, I2], [I2, I2]], **f64)
    torch.testing.assert_close(rob.mass_matrix(q), _double_pendulum_M(q, m1, m2, l1, l2) + extra)
    assert torch.linalg.eigvalsh(rob.mass_matrix(q)).min() > 0


def test_double_pendulum_springs():
    k, r, d = (3.0, 0.5), (0.2, -0.4), (0.1, 0.05)
    rob = systems.double_pendulum(stiffness=k, rest=r, damping=d)
    assert [float(j.stiffness) for j in rob.joints[:2]] == list(k)
    assert [float(j.rest) for j in rob.joints[:2]] == list(r)
    g = _gen(4)
    q, v, a = (torch.randn(8, 2, generator=g, **f64) for _ in range(3))
    kt, rt, dt = (torch.tensor(x, **f64) for x in (k, r, d))
    passive = rob.inverse_dynamics(q, v, a) - rob.inverse_dynamics(q, v, a, passive=False)
    torch.testing.assert_close(passive, kt * (q - rt) + dt * v)
    # The spring is at rest at q = rest without gravity: zero acceleration there.
    free = systems.double_pendulum(stiffness=k, rest=r, gravity=0.0)
    qdd = free.forward_dynamics(torch.tensor(r, **f64), torch.zeros(2, **f64), torch.zeros(2, **f64))
    assert qdd.abs().max() < 1e-14
    # Spring energy: 0.5 k (q - rest)^2 on top of gravity.
    dV = rob.potential_energy(q) - rob.potential_energy(q, passive=False)
    torch.testing.assert_close(dV, (0.5 * kt * (q - rt) ** 2).sum(-1))


def test_double_pendulum_stiffness_and_rest_are_learnable():
    rob = systems.double_pendulum(stiffness=(2.0, 1.0), rest=(0.1, 0.3))
    for link in ("link1", "link2"):
        rob.make_link_param_learnable(link, "stiffness")
        rob.make_link_param_learnable(link, "rest")
    params = rob.learnable_parameters()
    assert set(params) == {"joint1.stiffness", "joint1.rest", "joint2.stiffness", "joint2.rest"}
    q = torch.tensor([0.7, -0.2], **f64)
    v = torch.tensor([0.3, 0.1], **f64)
    # d tau / d k_i = q_i - rest_i and d tau / d rest_i = -k_i.
    tau = rob.inverse_dynamics(q, v, torch.zeros(2, **f64))
    grads = torch.autograd.grad(tau.sum(), [params[n] for n in sorted(params)])
    by_name = dict(zip(sorted(params), grads))
    assert abs(float(by_name["joint1.stiffness"]) - (0.7 - 0.1)) < 1e-14
    assert abs(float(by_name["joint2.stiffness"]) - (-0.2 - 0.3)) < 1e-14
    assert abs(float(by_name["joint1.rest"]) + 2.0) < 1e-14
    assert abs(float(by_name["joint2.rest"]) + 1.0) < 1e-14
    # Through forward dynamics too: compare with a finite difference in k2.
    zero = torch.zeros(2, **f64)
    qdd = rob.forward_dynamics(q, v, zero)
    (g_k2,) = torch.autograd.grad(qdd[1], rob.joints[1].stiffness)
    eps = 1e-6
    plus = systems.double_pendulum(stiffness=(2.0, 1.0 + eps), rest=(0.1, 0.3)).forward_dynamics(q, v, zero)[1]
    minus = systems.double_pendulum(stiffness=(2.0, 1.0 - eps), rest=(0.1, 0.3)).forward_dynamics(q, v, zero)[1]
    assert abs(float(g_k2) - float(plus - minus) / (2 * eps)) < 1e-7
    assert float(g_k2) != 0.0


# ---------------------------------------------------------------------------- acrobot and n-link chains
def test_acrobot_spong_closed_form():
    m1, m2, l1, l2, lc1, lc2, I1, I2 = 1.0, 1.5, 1.1, 0.9, 0.4, 0.6, 0.09, 0.12
    rob = systems.acrobot((m1, m2), (l1, l2), com=(lc1, lc2), inertias=(I1, I2))
    assert rob.joint_names == ["shoulder", "elbow"] and rob.actuated_joints == ["elbow"]
    q = torch.randn(32, 2, generator=_gen(5), **f64) * 3
    c2 = torch.cos(q[:, 1])
    m11 = I1 + I2 + m1 * lc1**2 + m2 * (l1**2 + lc2**2 + 2 * l1 * lc2 * c2)
    m12 = I2 + m2 * (lc2**2 + l1 * lc2 * c2)
    m22 = torch.full_like(c2, I2 + m2 * lc2**2)
    M = torch.stack([torch.stack([m11, m12], -1), torch.stack([m12, m22], -1)], -2)
    torch.testing.assert_close(rob.mass_matrix(q), M, rtol=1e-13, atol=1e-13)
    s1, s12 = torch.sin(q[:, 0]), torch.sin(q[:, 0] + q[:, 1])
    grav = torch.stack([(m1 * lc1 + m2 * l1) * G * s1 + m2 * lc2 * G * s12, m2 * lc2 * G * s12], -1)
    torch.testing.assert_close(rob.generalized_gravity(q), grav, rtol=1e-12, atol=1e-12)


def test_acrobot_default_is_uniform_rod():
    rob = systems.acrobot((2.0, 1.0), (1.0, 0.5))
    # Rod about its end: m l^2 / 3. Hanging straight, M22 = m2 l2^2 / 3.
    M = rob.mass_matrix(torch.zeros(2, **f64))
    assert abs(float(M[1, 1]) - 1.0 * 0.25 / 3) < 1e-15


@pytest.mark.parametrize("n", [1, 3, 5])
def test_n_link_pendulum_mass_matrix_from_bob_jacobians(n):
    g = _gen(10 + n)
    masses = (torch.rand(n, generator=g, **f64) + 0.5).tolist()
    lengths = (torch.rand(n, generator=g, **f64) + 0.3).tolist()
    radii = (0.1 * torch.rand(n, generator=g, **f64)).tolist()
    rob = systems.n_link_pendulum(n, masses=masses, lengths=lengths, bob_radius=radii)
    assert rob.nq == rob.nv == n and rob.joint_names == [f"joint{i + 1}" for i in range(n)]
    q = torch.randn(n, generator=g, **f64)

    def bobs(q):
        phi = torch.cumsum(q, 0)
        steps = torch.stack([-torch.sin(phi), -torch.cos(phi)], -1) * torch.tensor(lengths, **f64)[:, None]
        return torch.cumsum(steps, 0)  # (n, 2): x, z of every bob

    J = torch.autograd.functional.jacobian(bobs, q)  # (n, 2, n)
    Jphi = torch.tril(torch.ones(n, n, **f64))  # absolute angle of bob i = sum of q[:i+1]
    M = sum(m * J[i].T @ J[i] for i, m in enumerate(masses))
    M = M + sum(0.4 * m * r**2 * torch.outer(Jphi[i], Jphi[i]) for i, (m, r) in enumerate(zip(masses, radii)))
    torch.testing.assert_close(rob.mass_matrix(q), M, rtol=1e-12, atol=1e-12)
    # Potential energy -sum m g z_i and its gradient = generalized gravity.
    V = sum(m * G * z for m, z in zip(masses, bobs(q)[:, 1]))
    torch.testing.assert_close(rob.potential_energy(q), V)
    tip = rob.link_pose(q, "tip")[:3, 3]
    torch.testing.assert_close(tip[[0, 2]], bobs(q)[-1])


def test_builders_dtype_device_and_roundtrip():
    for build in (systems.pendulum, systems.cartpole, systems.acrobot, systems.double_pendulum,
                  lambda **kw: systems.n_link_pendulum(4, **kw)):
        rob = build(dtype=torch.float32, device="cpu")
        assert rob.dtype == torch.float32 and rob.device.type == "cpu"
        assert all(t.dtype == torch.float32 for m in (*rob.links, *rob.joints) for t in m.buffers())
        q32 = rob.random_configuration(3)
        assert q32.dtype == torch.float32 and rob.mass_matrix(q32).dtype == torch.float32
        rob64 = build()
        g = _gen(7)
        q = rob64.random_configuration(16, generator=g)
        v, a = torch.randn(16, rob64.nv, generator=g, **f64), torch.randn(16, rob64.nv, generator=g, **f64)
        a2 = rob64.forward_dynamics(q, v, rob64.inverse_dynamics(q, v, a))
        torch.testing.assert_close(a2, a, rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("call,culprit", [
    (lambda: systems.pendulum(mass=0.0), "masses"),
    (lambda: systems.pendulum(length=-1.0), "lengths"),
    (lambda: systems.pendulum(damping=-0.1), "damping"),
    (lambda: systems.n_link_pendulum(0), "'n'"),
    (lambda: systems.n_link_pendulum(3, masses=(1.0, 2.0)), "masses"),
    (lambda: systems.double_pendulum(stiffness=(1.0,)), "stiffness"),
    (lambda: systems.cartpole(pole_length=0.0), "pole_length"),
    (lambda: systems.acrobot(inertias=(1.0, -1.0)), "inertias"),
    (lambda: systems.pendulum(gravity=(0.0, -9.81)), "gravity"),
    (lambda: systems.cartpole(gravity="down"), "gravity"),
])
def test_bad_arguments_name_the_culprit(call, culprit):
    with pytest.raises(ModelError, match=culprit):
        call()
