"""diffmech against Pinocchio on real and synthetic robots, 100 random float64 states each.

diffmech is called once on the whole batch; Pinocchio in a loop (see ``oracle.py`` for the
mapping of coordinates, Jacobian columns, external forces and world-fixed inertia). Errors are
relative to the largest entry of each sample's reference; set ``DIFFMECH_ORACLE_REPORT=1`` to
print the measured maxima at the end of the run.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FLOATING, ORACLE_ERRORS, ROBOTS, get_robot, random_state, robot_path

pytest.importorskip("pinocchio")
from oracle import PinOracle, rel_err  # noqa: E402

N = 100
TOL = 1e-9
# Offsets (link coordinates, m) of the points used for jacobian(point=...); sample i uses i % 4.
OFFSETS = np.array([[0.1, -0.05, 0.2], [0.0, 0.0, 0.0], [-0.3, 0.25, 0.02], [0.05, 0.4, -0.15]])


class Case:
    """One robot, its Pinocchio oracle and N seeded states (torch and NumPy views)."""

    def __init__(self, key: str):
        self.key = key
        self.robot = get_robot(key)
        self.pin = PinOracle(self.robot, robot_path(key))
        self.q, self.v, self.a, self.f = random_state(self.robot, (N,), seed=1234)
        self.qn, self.vn, self.an, self.fn = (t.numpy() for t in (self.q, self.v, self.a, self.f))

    def check(self, name: str, actual: torch.Tensor, expected: np.ndarray, per: int = 1) -> float:
        err = rel_err(actual.detach().numpy(), expected, per=per)
        ORACLE_ERRORS[(self.key, name)] = max(err, ORACLE_ERRORS.get((self.key, name), 0.0))
        assert err < TOL, f"{self.key}: {name} differs from Pinocchio by {err:.2e} (relative)"
        return err

    def links_to_check(self) -> list[str]:
        """The last link, one in the middle and the root (zero Jacobian unless floating)."""
        names = self.robot.link_names
        return list(dict.fromkeys([names[-1], names[len(names) // 2], names[0]]))


@pytest.fixture(scope="module", params=list(ROBOTS))
def case(request) -> Case:
    return Case(request.param)


def test_model_matches(case: Case):
    r, m = case.robot, case.pin.model
    assert (r.nq, r.nv) == (m.nq - sum(nq == 2 for _, nq, _ in case.pin._jmap), m.nv)
    assert r.floating_base == (case.key in FLOATING)


def test_forward_kinematics(case: Case):
    T = case.robot.forward_kinematics(case.q)
    assert T.shape == (N, case.robot.n_links, 4, 4)
    ref = np.stack([case.pin.forward_kinematics(q) for q in case.qn])
    case.check("fk", T, ref)
    last = case.robot.link_names[-1]
    case.check("fk", case.robot.link_pose(case.q, last), ref[:, -1])


@pytest.mark.parametrize("frame", ["world_aligned", "local", "world"])
def test_jacobian(case: Case, frame: str):
    for link in case.links_to_check():
        J = case.robot.jacobian(case.q, link, frame=frame)
        assert J.shape == (N, 6, case.robot.nv)
        ref = np.stack([case.pin.jacobian(q, link, frame) for q in case.qn])
        case.check(f"jac_{frame}", J, ref)


@pytest.mark.parametrize("frame", ["world_aligned", "local"])
def test_jacobian_point(case: Case, frame: str):
    """``point=`` equals Pinocchio's Jacobian of a frame translated by the offset on the link."""
    link = case.robot.link_names[-1]
    idx = np.arange(N) % len(OFFSETS)
    point = torch.as_tensor(OFFSETS[idx])
    J = case.robot.jacobian(case.q, link, frame=frame, point=point)
    ref = np.stack([case.pin.jacobian(q, link, frame, offset=OFFSETS[k]) for q, k in zip(case.qn, idx)])
    case.check(f"jac_point_{frame}", J, ref)


def test_rnea(case: Case):
    tau = case.robot.inverse_dynamics(case.q, case.v, case.a, passive=False)
    ref = np.stack([case.pin.rnea(q, v, a) for q, v, a in zip(case.qn, case.vn, case.an)])
    case.check("rnea", tau, ref)


def test_rnea_external_forces(case: Case):
    tau = case.robot.inverse_dynamics(case.q, case.v, case.a, f_ext=case.f, passive=False)
    ref = np.stack([case.pin.rnea(*s) for s in zip(case.qn, case.vn, case.an, case.fn)])
    case.check("rnea_fext", tau, ref)


def test_crba(case: Case):
    M = case.robot.mass_matrix(case.q)
    ref = np.stack([case.pin.crba(q) for q in case.qn])
    case.check("crba", M, ref)


@pytest.mark.parametrize("method", ["aba", "crba"])
def test_forward_dynamics(case: Case, method: str):
    tau = case.a  # any joint forces will do
    qdd = case.robot.forward_dynamics(case.q, case.v, tau, passive=False, method=method)
    ref = np.stack([case.pin.aba(q, v, t) for q, v, t in zip(case.qn, case.vn, tau.numpy())])
    case.check(f"fd_{method}", qdd, ref)


@pytest.mark.parametrize("method", ["aba", "crba"])
def test_forward_dynamics_external_forces(case: Case, method: str):
    qdd = case.robot.forward_dynamics(case.q, case.v, case.a, f_ext=case.f, passive=False, method=method)
    ref = np.stack([case.pin.aba(*s) for s in zip(case.qn, case.vn, case.an, case.fn)])
    case.check(f"fd_{method}_fext", qdd, ref)


def test_center_of_mass(case: Case):
    """All links count, world-fixed ones too (Pinocchio's ``centerOfMass`` leaves those out; the
    oracle adds ``model.inertias[0]`` back -- see ``oracle.py``)."""
    c = case.robot.center_of_mass(case.q)
    ref = np.stack([case.pin.center_of_mass(q) for q in case.qn])
    case.check("com", c, ref)
    # the scale of the check: positions of order 0.1-1 m, so 1e-9 relative is sub-nanometre
    assert np.abs(ref).max() > 1e-3


def test_energies(case: Case):
    T = case.robot.kinetic_energy(case.q, case.v)
    case.check("kinetic", T, np.array([case.pin.kinetic_energy(q, v) for q, v in zip(case.qn, case.vn)]), per=0)
    U = case.robot.potential_energy(case.q, passive=False)
    case.check("potential", U, np.array([case.pin.potential_energy(q) for q in case.qn]), per=0)


def test_world_fixed_inertia_accounting():
    """The oracle's correction is not vacuous: on a fixed-base robot with a heavy root link,
    Pinocchio's raw centre of mass and potential energy differ from the all-links values."""
    import pinocchio as pin

    o = PinOracle(get_robot("branching_tree"), robot_path("branching_tree"))
    assert o.world_fixed_mass() == pytest.approx(4.5)  # hub + sensor, welded to the world
    q = get_robot("branching_tree").neutral_configuration().numpy()
    raw = pin.centerOfMass(o.model, o.data, o.q(q))
    assert np.abs(raw - o.center_of_mass(q)).max() > 1e-2
