"""Starting points of eigenmode learning: the target configuration (against the closed-form
inverse kinematics of the planar two-joint iiwa) and the linear-mode potential (against the
harmonic oscillator it is built to be)."""

from __future__ import annotations

import math

import pytest
import torch

from control_helpers import system as pendulum_system
from diffmech.control.configs import get_config
from diffmech.control.eigenmodes import EigenmodeTrainer
from diffmech.control.hamiltonian import HamiltonianSystem
from diffmech.control.potentials import MLPPotential
from diffmech.control.warmstart import fit_linear_mode, target_configuration
from diffmech.errors import DiffmechError

# iiwa7 with joints 2 and 4 free and the others at 0: a planar arm in the x-z plane, shoulder
# 0.34 m above the base, 0.40 m to the elbow (joint 4), then 0.526 m to iiwa_link_ee (URDF origins)
H_SHOULDER, L1, L2 = 0.34, 0.40, 0.526


def planar_fk(q2: float, q4: float) -> tuple[float, float]:
    # joint 4's axis is opposite to joint 2's in this planar section
    return (L1 * math.sin(q2) + L2 * math.sin(q2 - q4), H_SHOULDER + L1 * math.cos(q2) + L2 * math.cos(q2 - q4))


def planar_ik(x: float, z: float) -> list[tuple[float, float]]:
    """Both elbow solutions by the law of cosines (b = q2 - (q2 - q4) is the elbow's bend)."""
    zr = z - H_SHOULDER
    c = (x * x + zr * zr - L1 * L1 - L2 * L2) / (2 * L1 * L2)
    out = []
    for b in (math.acos(c), -math.acos(c)):  # second link's angle minus the first's: -q4
        q2 = math.atan2(x, zr) - math.atan2(L2 * math.sin(b), L1 + L2 * math.cos(b))
        out.append((q2, -b))
    return out


@pytest.fixture(scope="module")
def iiwa_system():
    pytest.importorskip("diff_robot_data")
    from diffmech.control.configs import build_system

    return build_system(get_config("iiwa", hidden=4, native=False), dtype=torch.float64)


def test_planar_model_matches_forward_kinematics(iiwa_system):
    g = torch.Generator().manual_seed(0)
    for q in torch.rand(5, 2, generator=g, dtype=torch.float64) * 3 - 1.5:
        ee = iiwa_system.end_effector(q)
        x, z = planar_fk(float(q[0]), float(q[1]))
        assert abs(float(ee[1])) < 1e-12
        assert abs(float(ee[0]) - x) < 1e-9 and abs(float(ee[2]) - z) < 1e-9


def test_iiwa_target_is_reachable_and_matches_closed_form(iiwa_system):
    cfg = get_config("iiwa-fast")
    target = torch.tensor(cfg.target_position, dtype=torch.float64)
    q0 = torch.tensor(cfg.q0, dtype=torch.float64)
    q_t = target_configuration(iiwa_system, target, q0, tol=1e-10)
    assert float((iiwa_system.end_effector(q_t) - target).norm()) < 1e-10
    exact = planar_ik(cfg.target_position[0], cfg.target_position[2])
    for q2, q4 in exact:
        x, z = planar_fk(q2, q4)
        assert abs(x - cfg.target_position[0]) < 1e-12 and abs(z - cfg.target_position[2]) < 1e-12
    # the solution kept is the closed-form one nearest to q0 in the kinetic-energy metric M(q0)
    M0 = iiwa_system.mass_matrix(q0)
    dist = [float((torch.tensor(s, dtype=torch.float64) - q0) @ M0 @ (torch.tensor(s, dtype=torch.float64) - q0))
            for s in exact]
    nearest = torch.tensor(exact[dist.index(min(dist))], dtype=torch.float64)
    torch.testing.assert_close(q_t, nearest, atol=1e-8, rtol=0)


def test_unreachable_target_raises(iiwa_system):
    # 1.5 m from the shoulder: beyond L1 + L2 = 0.926 m
    with pytest.raises(DiffmechError, match="out of reach"):
        target_configuration(iiwa_system, torch.tensor([1.5, 0.0, 0.34], dtype=torch.float64),
                             torch.zeros(2, dtype=torch.float64))


def test_linear_mode_fit_is_the_harmonic_well():
    """After the fit, U + V_theta is (to the fit's accuracy) the quadratic well
    1/2 omega^2 (q - q_c)^T M(q_c) (q - q_c): its gradient vanishes at q_c and M(q_c)^-1 times its
    Hessian there is omega^2 I, i.e. every small oscillation about q_c has period T."""
    sys_ = pendulum_system(hidden=256)
    q0 = torch.tensor([-0.5, -0.5], dtype=torch.float64)
    q_t = torch.tensor([0.75, 0.75], dtype=torch.float64)
    T = 1.5
    info = fit_linear_mode(sys_, q0, q_t, T, samples=1000, generator=torch.Generator().manual_seed(0))
    assert info["relative_residual"] < 0.02
    qc = 0.5 * (q0 + q_t)
    torch.testing.assert_close(torch.tensor(info["q_center"], dtype=torch.float64), qc)
    total = lambda q: sys_.plant_potential(q) + sys_.control_potential(q)  # noqa: E731
    g = torch.autograd.functional.jacobian(total, qc)
    Hs = torch.autograd.functional.hessian(total, qc)
    K = torch.tensor(info["stiffness"], dtype=torch.float64)
    assert float(g.norm()) < 0.02 * float(K.norm())
    freqs = torch.linalg.eigvals(torch.linalg.solve(sys_.mass_matrix(qc), Hs)).real.sqrt()
    torch.testing.assert_close(freqs, torch.full((2,), 2 * math.pi / T, dtype=torch.float64), rtol=0.02, atol=0)


def test_linear_mode_needs_an_mlp():
    sys_ = HamiltonianSystem(pendulum_system(potential=False).robot)
    with pytest.raises(DiffmechError, match="MLPPotential"):
        fit_linear_mode(sys_, torch.zeros(2, dtype=torch.float64), torch.ones(2, dtype=torch.float64), 1.0)
    assert isinstance(pendulum_system().potential, MLPPotential)


def test_unknown_init_raises():
    with pytest.raises(DiffmechError, match="init"):
        EigenmodeTrainer(get_config("tiny", init="zeros"))


@pytest.mark.slow
def test_iiwa_fast_converges():
    """The iiwa configuration from the linear-mode start: the polish reaches its tolerance and the
    high-accuracy re-integration confirms the task and the mode."""
    pytest.importorskip("diff_robot_data")
    from diffmech.control.verify import verify_mode
    from diffmech.dynamics import kernels

    tr = EigenmodeTrainer(get_config("iiwa-fast"))
    with kernels.native_mode("build"):  # as users run it: the torch code alone takes about an hour here
        tr.train(progress=False)
    assert tr.polished and tr.polish_info["converged"], tr.polish_info
    m, _ = verify_mode(tr.system, tr.cfg.q0, float(tr.period), tr.target)
    assert m["ee_error_half_period"] < 1e-2
    assert m["periodicity_error"] < 1e-2 and m["symmetry_error_q"] < 1e-2
    assert m["line_shaped"]
