"""The Hamiltonian form of a robot: field and Jacobian against finite differences, conservation,
the model's natural modes (spec section 6, model checks), joint subsets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from control_helpers import NATURAL_Q0, NATURAL_T, paper_pendulum, system
from diffmech.control import HamiltonianSystem, MLPPotential
from diffmech.control.configs import build_robot, get_config
from diffmech.control.verify import equilibrium, integrate_ivp, ivp_field, linear_modes, natural_eigenmode, verify_mode
from diffmech.errors import ModelError, ShapeError


def _fd(f, x, eps=1e-6):
    cols = []
    for j in range(x.shape[-1]):
        e = torch.zeros_like(x)
        e[..., j] = eps
        cols.append((f(x + e) - f(x - e)) / (2 * eps))
    return torch.stack(cols, -1)


def test_matrix_and_energy_match_the_paper_model():
    sys_ = system(potential=False)
    q = torch.tensor([-0.5, -0.5], dtype=torch.float64)
    M = sys_.mass_matrix(q)
    c2 = math.cos(q[1])
    expected = torch.tensor([[3 + 2 * c2, 1 + c2], [1 + c2, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(M, expected, rtol=0, atol=1e-12)
    # V_g + k (q2 - pi/2)^2 with k = 0.5 (the public code's spring convention)
    V = -9.81 * (2 * math.cos(q[0]) + math.cos(q[0] + q[1])) + 0.5 * (q[1] - math.pi / 2) ** 2
    assert abs(float(sys_.plant_potential(q)) - V) < 1e-12


def test_spring_factor_option():
    code = build_robot(get_config("main", dtype="float64"))
    paper = build_robot(get_config("main", dtype="float64", spring_factor="paper"))
    q = torch.tensor([0.1, 0.4], dtype=torch.float64)
    d = float(code.potential_energy(q) - paper.potential_energy(q))
    assert abs(d - 0.25 * (0.4 - math.pi / 2) ** 2) < 1e-12


def test_field_is_hamiltonian_gradient_and_jacobian_matches_fd():
    sys_ = system(potential=True)
    x = torch.tensor([[0.3, -0.7, 0.9, -1.2], [-1.1, 0.4, 0.2, 2.0]], dtype=torch.float64)
    G, J = sys_.field(x, jacobian=True)
    H = lambda xx: sys_.hamiltonian(xx[..., :2], xx[..., 2:])  # noqa: E731
    grad = _fd(H, x)
    torch.testing.assert_close(G, torch.cat([grad[..., 2:], -grad[..., :2]], -1), rtol=1e-7, atol=1e-7)
    Jfd = _fd(lambda xx: sys_.field(xx)[0], x).transpose(-1, -2).transpose(-1, -2)
    torch.testing.assert_close(J, Jfd, rtol=1e-6, atol=1e-6)


def test_field_batch_shapes_and_errors():
    sys_ = system()
    for shape in [(), (1,), (3,), (2, 5)]:
        x = torch.randn(*shape, 4, dtype=torch.float64)
        G, J = sys_.field(x, jacobian=True)
        assert G.shape == x.shape and J.shape == (*shape, 4, 4)
    with pytest.raises(ShapeError):
        sys_.field(torch.zeros(3, dtype=torch.float64))


def test_energy_conserved_without_control():
    """Spec check 1 (shortened to 1.5 s here; 10 s in the slow variant)."""
    sys_ = system(potential=False)
    x0 = torch.tensor([1.0, -0.5, 0.5, 1.0], dtype=torch.float64)
    sol = integrate_ivp(sys_, x0, 1.5, t_eval=np.linspace(0, 1.5, 151), closed_loop=False)
    X = torch.from_numpy(sol.y.T.copy())
    H = sys_.hamiltonian(X[:, :2], X[:, 2:], closed_loop=False)
    assert float((H - H[0]).abs().max()) < 1e-6


@pytest.mark.slow
def test_energy_conserved_without_control_10s():
    sys_ = system(potential=False)
    x0 = torch.tensor([1.0, -0.5, 0.5, 1.0], dtype=torch.float64)
    sol = integrate_ivp(sys_, x0, 10.0, t_eval=np.linspace(0, 10, 1001), closed_loop=False)
    X = torch.from_numpy(sol.y.T.copy())
    H = sys_.hamiltonian(X[:, :2], X[:, 2:], closed_loop=False)
    assert float((H - H[0]).abs().max()) < 1e-6


def test_time_reversal_symmetry_from_rest():
    """Lemma 2.1: from (q0, 0), q(t) = q(-t) and p(t) = -p(-t) (solve_ivp forwards and backwards)."""
    from scipy.integrate import solve_ivp

    sys_ = system(potential=True)
    y0 = np.array([-0.5, -0.5, 0.0, 0.0])
    t = np.linspace(0, 0.4, 21)
    f = ivp_field(sys_)
    fwd = solve_ivp(f, (0, 0.4), y0, method="DOP853", t_eval=t, rtol=1e-10, atol=1e-10).y
    back = solve_ivp(f, (0, -0.4), y0, method="DOP853", t_eval=-t, rtol=1e-10, atol=1e-10).y
    assert np.abs(fwd[:2] - back[:2]).max() < 1e-8
    assert np.abs(fwd[2:] + back[2:]).max() < 1e-8


def test_equilibrium_and_linear_periods():
    """Spec check 3: equilibrium (-0.0695, 0.2088), linearised periods 1.04 s and 2.61 s."""
    sys_ = system(potential=False)
    qe = equilibrium(sys_, [0.0, 0.3])
    torch.testing.assert_close(qe, torch.tensor([-0.0695, 0.2088], dtype=torch.float64), atol=1e-4, rtol=0)
    periods = linear_modes(sys_, qe)["periods"]
    torch.testing.assert_close(periods, torch.tensor([1.042, 2.612], dtype=torch.float64), atol=2e-3, rtol=0)


def test_natural_mode_fixture_is_an_eigenmode():
    sys_ = system(potential=False)
    m, _ = verify_mode(sys_, NATURAL_Q0, NATURAL_T, samples=401)
    assert m["periodicity_error"] < 1e-8
    assert m["p_half_relative"] < 1e-8
    assert m["symmetry_error_q"] < 1e-8
    assert m["line_shaped"]


@pytest.mark.slow
def test_natural_eigenmode_shooting():
    sys_ = system(potential=False)
    nm = natural_eigenmode(sys_, [NATURAL_Q0[0], 0.34], 1.3, fix=0)
    assert abs(nm["period"] - NATURAL_T) < 1e-8
    assert abs(float(nm["q0"][1]) - NATURAL_Q0[1]) < 1e-8


def test_joint_subset_is_the_clamped_robot():
    robot = paper_pendulum()
    sub = HamiltonianSystem(robot, MLPPotential(1, hidden=4, dtype=torch.float64), joints=["joint2"],
                            locked=torch.tensor([0.3, 0.0], dtype=torch.float64))
    q = torch.tensor([[0.7], [-0.2]], dtype=torch.float64)
    full = torch.cat([torch.full_like(q, 0.3), q], -1)
    torch.testing.assert_close(sub.mass_matrix(q), robot.mass_matrix(full)[:, 1:, 1:])
    torch.testing.assert_close(sub.plant_potential(q), robot.potential_energy(full))
    torch.testing.assert_close(sub.end_effector(q), robot.link_pose(full, "tip")[:, :3, 3])
    G, J = sub.field(torch.cat([q, torch.ones_like(q)], -1), jacobian=True)
    assert G.shape == (2, 2) and J.shape == (2, 2, 2)
    with pytest.raises(ModelError):
        HamiltonianSystem(robot, joints=["nope"])


def test_inverse_dynamics_matches_the_hamiltonian_field():
    """ID(q, v, a) with a from the Hamiltonian field (no control) returns zero force, also on a joint subset."""
    robot = paper_pendulum()
    for sys_ in (HamiltonianSystem(robot), HamiltonianSystem(robot, joints=["joint2"],
                                                                locked=torch.tensor([0.3, 0.0], dtype=torch.float64))):
        n = sys_.n
        x = torch.randn(5, 2 * n, dtype=torch.float64)
        G, J = sys_.field(x, jacobian=True, closed_loop=False)
        v = G[:, :n]
        a = (J @ G.unsqueeze(-1)).squeeze(-1)[:, :n]  # qdd = d/dt (M^-1 p)
        torch.testing.assert_close(sys_.inverse_dynamics(x[:, :n], v, a), torch.zeros(5, n, dtype=torch.float64),
                                   rtol=0, atol=1e-10)
        torch.testing.assert_close(sys_.acceleration(x[:, :n], v, torch.zeros(5, n, dtype=torch.float64)), a)


@pytest.mark.parametrize("fourier", [True, False])
@pytest.mark.parametrize("depth", [1, 2, 3])
def test_mlp_closed_form_derivatives_match_autograd_and_fd(fourier, depth):
    from diffmech.control.potentials import autograd_gradient, autograd_hessian

    torch.manual_seed(depth)
    pot = MLPPotential(3, hidden=16, depth=depth, fourier=fourier, dtype=torch.float64)
    q = torch.randn(4, 5, 3, dtype=torch.float64)
    V, g, H = pot.derivatives(q)
    torch.testing.assert_close(V, pot(q).detach(), rtol=0, atol=1e-14)
    torch.testing.assert_close(g, autograd_gradient(pot, q), rtol=0, atol=1e-13)
    torch.testing.assert_close(H, autograd_hessian(pot, q), rtol=0, atol=1e-13)
    torch.testing.assert_close(g, _fd(lambda qq: pot(qq).detach(), q), rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(H, _fd(lambda qq: pot.gradient(qq), q), rtol=1e-7, atol=1e-7)
    # the parameters' gradient of a weighted control force (what the discrete adjoint asks for)
    w = torch.randn_like(q)
    params = list(pot.parameters())
    a = torch.autograd.grad((pot.gradient(q, create_graph=True) * w).sum(), params, allow_unused=True)
    b = torch.autograd.grad((autograd_gradient(pot, q, create_graph=True) * w).sum(), params, allow_unused=True)
    for x, y in zip(a, b):
        if x is None or y is None:  # the output bias does not move the gradient
            assert x is None and y is None
        else:
            torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("native", [False, True])
def test_split_field_equals_one_graph(native):
    """The field without a graph (plant by the mass matrix's pull-back and the inverse dynamics,
    potential in closed form) equals the single-autograd-graph field, with and without native
    kernels, also for a joint subset."""
    from diffmech.model.systems import n_link_pendulum

    torch.manual_seed(0)
    arm = n_link_pendulum(3, masses=(1.0, 0.8, 0.6), lengths=(0.7, 0.6, 0.5), stiffness=(0.0, 1.0, 1.0),
                          rest=(0.0, 0.5, 0.5), bob_radius=0.0, dtype=torch.float64)
    systems_ = [system(potential=True, hidden=16),
                HamiltonianSystem(arm, MLPPotential(3, hidden=16, dtype=torch.float64)),
                HamiltonianSystem(arm, MLPPotential(2, hidden=16, dtype=torch.float64), joints=[arm.joint_names[0],
                                                                                                  arm.joint_names[2]],
                                  locked=torch.tensor([0.0, 0.3, 0.0], dtype=torch.float64))]
    for sys_ in systems_:
        if native and not sys_.prepare_native():
            pytest.skip("no native kernels (no C compiler)")
        x = torch.randn(6, 2 * sys_.n, dtype=torch.float64)
        ref = sys_._evaluate_graph(x, True, True)
        for jac in (False, True):
            ev = sys_.evaluate(x, jacobian=jac)
            torch.testing.assert_close(ev.G, ref.G.detach(), rtol=0, atol=1e-12)
            torch.testing.assert_close(ev.H, ref.H.detach(), rtol=0, atol=1e-12)
            if jac:
                torch.testing.assert_close(ev.J, ref.J, rtol=0, atol=1e-12)
