"""Parametrizations of learnable physical parameters (``diffmech.model.params``).

Round trips (value -> raw -> value to 1e-12), physical outputs for arbitrary raw inputs, the
pseudo-inertia algebra against an explicit ``U U^T``, the torque regressor, gradients through
``inverse_dynamics`` against finite differences, and the module plumbing (``state_dict``,
``.to(float32)``, ``torch.func.functional_call``, freezing). The identification example is run
with a few steps.
"""

from __future__ import annotations

import copy
import importlib.util
import io
import json
import math
import os

import pytest
import torch
from torch import nn

from conftest import get_robot, random_state
from diffmech.errors import ModelError
from diffmech.model.params import (
    IndependentInertial,
    PhysicallyConsistentInertial,
    PositiveScalar,
    SymmetricPositiveDefinite,
    inertial_from_pseudo_inertia,
    inertial_from_standard_parameters,
    inertial_regressor,
    inertial_to_log_cholesky,
    is_physically_consistent,
    log_cholesky_to_inertial,
    make_link_inertial_learnable,
    pseudo_inertia,
    standard_inertial_parameters,
)

# torch.func's forward-mode transforms (used by inertial_regressor) trip torch's own deprecated
# torch.jit.script internally.
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.jit.script.*:DeprecationWarning")

F64 = torch.float64
IIWA_MOVING = [f"iiwa_link_{i}" for i in range(1, 8)]


def _close(a, b, tol=1e-12):
    torch.testing.assert_close(a, b, rtol=tol, atol=tol)


def _random_bodies(n: int, seed: int = 0):
    """``n`` random strictly consistent bodies: mass (n,), com (n, 3), inertia (n, 3, 3) (rotated)."""
    g = torch.Generator().manual_seed(seed)
    mass = torch.exp(torch.randn(n, generator=g, dtype=F64))
    com = 0.2 * torch.randn(n, 3, generator=g, dtype=F64)
    A = 0.3 * torch.randn(n, 3, 3, generator=g, dtype=F64)
    # Second moment about the COM = m A A^T (+ a bit), hence the triangle inequality.
    Sigma = mass[:, None, None] * (A @ A.mT + 1e-3 * torch.eye(3, dtype=F64))
    inertia = Sigma.diagonal(dim1=-2, dim2=-1).sum(-1)[:, None, None] * torch.eye(3, dtype=F64) - Sigma
    return mass, com, inertia


def _iiwa():
    return copy.deepcopy(get_robot("iiwa"))


def _tau(robot, n=4, seed=0, passive=False):
    q, v, a, _ = random_state(robot, (n,), seed=seed)
    return robot.inverse_dynamics(q, v, a, passive=passive)


class _Call(nn.Module):
    """``torch.func.functional_call`` needs a ``forward``: wrap ``inverse_dynamics``."""

    def __init__(self, robot, passive=True):
        super().__init__()
        self.robot = robot
        self.passive = passive

    def forward(self, q, v, a):
        return self.robot.inverse_dynamics(q, v, a, passive=self.passive)


# ---------------------------------------------------------------------------- round trips
@pytest.mark.parametrize("min_value", [0.0, 0.5, -2.0])
def test_positive_scalar_round_trip(min_value):
    p = PositiveScalar(min_value)
    value = min_value + torch.tensor([1e-5, 1e-3, 0.37, 3.0, 47.0, 2.5e3], dtype=F64)
    _close(p(p.right_inverse(value)), value)
    scalar = torch.tensor(min_value + 2.0, dtype=F64)
    assert p.right_inverse(scalar).shape == ()
    _close(p(p.right_inverse(scalar)), scalar)


def test_positive_scalar_floor_and_rejection():
    p = PositiveScalar(floor=1e-6)
    raw = p.right_inverse(torch.tensor(0.0, dtype=F64))  # e.g. a URDF damping of 0
    assert torch.isfinite(raw)
    _close(p(raw), torch.tensor(1e-6, dtype=F64))
    with pytest.raises(ModelError, match="below min_value"):
        p.right_inverse(torch.tensor(-0.1, dtype=F64))


@pytest.mark.parametrize("diag", ["exp", "softplus"])
@pytest.mark.parametrize("eps", [0.0, 1e-4])
def test_spd_round_trip(diag, eps):
    _, _, inertia = _random_bodies(5, seed=1)
    value = inertia + eps * torch.eye(3, dtype=F64)
    p = SymmetricPositiveDefinite(eps, diag=diag)
    raw = p.right_inverse(value)
    assert raw.shape == value.shape
    assert not raw.triu(1).any()
    _close(p(raw), value)
    _close(p(p.right_inverse(value[0])), value[0])


def test_spd_rejects_indefinite():
    with pytest.raises(ModelError, match="not positive definite"):
        SymmetricPositiveDefinite().right_inverse(torch.diag(torch.tensor([1.0, 0.0, -1e-3], dtype=F64)))
    with pytest.raises(ModelError, match="eps"):
        SymmetricPositiveDefinite(eps=0.5).right_inverse(torch.eye(3, dtype=F64) * 0.4)


def test_log_cholesky_round_trip_random_bodies():
    mass, com, inertia = _random_bodies(200, seed=2)
    theta = inertial_to_log_cholesky(mass, com, inertia)
    assert theta.shape == (200, 10)
    m2, c2, I2 = log_cholesky_to_inertial(theta)
    _close(m2, mass)
    _close(c2, com)
    _close(I2, inertia)
    _close(inertial_to_log_cholesky(m2, c2, I2), theta, tol=1e-9)


def test_physically_consistent_round_trip_iiwa_links():
    robot = _iiwa()
    for name in IIWA_MOVING:
        lp = robot.link_params(name)
        m, c, I = (t.clone() for t in lp.inertial())
        src = PhysicallyConsistentInertial(lp)
        assert src.theta.shape == (10,) and isinstance(src.theta, nn.Parameter)
        m2, c2, I2 = src()
        _close(m2, m)
        _close(c2, c)
        _close(I2, I)


def test_independent_inertial_round_trip():
    robot = _iiwa()
    lp = robot.link_params("iiwa_link_4")
    src = IndependentInertial(lp)
    for got, want in zip(src(), lp.inertial()):
        _close(got.detach(), want.detach())


def test_pseudo_inertia_matches_explicit_factor():
    """``J(theta)`` from the returned (mass, com, inertia) equals ``U U^T`` built from the paper's formula."""
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(50, 10, generator=g, dtype=F64)
    alpha, d1, d2, d3, s12, s23, s13, t1, t2, t3 = theta.unbind(-1)
    z = torch.zeros_like(alpha)
    U = torch.stack([
        d1.exp(), s12, s13, t1,
        z, d2.exp(), s23, t2,
        z, z, d3.exp(), t3,
        z, z, z, torch.ones_like(alpha),
    ], dim=-1).reshape(50, 4, 4) * alpha.exp()[:, None, None]
    J = pseudo_inertia(*log_cholesky_to_inertial(theta))
    _close(J, U @ U.mT, tol=1e-10)
    for got, want in zip(inertial_from_pseudo_inertia(J), log_cholesky_to_inertial(theta)):
        _close(got, want, tol=1e-9)


def test_standard_parameters_round_trip():
    mass, com, inertia = _random_bodies(20, seed=4)
    pi = standard_inertial_parameters(mass, com, inertia)
    assert pi.shape == (20, 10)
    _close(pi[:, 0], mass)
    _close(pi[:, 1:4], mass[:, None] * com)
    for got, want in zip(inertial_from_standard_parameters(pi), (mass, com, inertia)):
        _close(got, want)


# ---------------------------------------------------------------------------- physical outputs
def test_positive_scalar_outputs_above_min_value():
    raw = 8.0 * torch.randn(1000, generator=torch.Generator().manual_seed(5), dtype=F64)
    assert (PositiveScalar(0.25)(raw) > 0.25).all()


@pytest.mark.parametrize("diag", ["exp", "softplus"])
def test_spd_outputs_are_spd(diag):
    raw = torch.randn(500, 3, 3, generator=torch.Generator().manual_seed(6), dtype=F64)
    value = SymmetricPositiveDefinite(1e-6, diag=diag)(raw)
    _close(value, value.mT)
    assert (torch.linalg.eigvalsh(value) > 0).all()


def test_log_cholesky_outputs_are_physical():
    theta = 2.0 * torch.randn(2000, 10, generator=torch.Generator().manual_seed(7), dtype=F64)
    mass, com, inertia = log_cholesky_to_inertial(theta)
    assert (mass > 0).all()
    _close(inertia, inertia.mT)
    lam = torch.linalg.eigvalsh(inertia)  # ascending principal moments
    assert (lam > 0).all()
    assert (lam[:, 2] <= (lam[:, 0] + lam[:, 1]) * (1 + 1e-12)).all()
    assert is_physically_consistent(mass, com, inertia).all()


def test_spd_inertia_need_not_be_physical():
    """A positive-definite inertia can still violate the triangle inequality; the consistent
    parametrization refuses it (and ``is_physically_consistent`` says so)."""
    m, c = torch.tensor(1.0, dtype=F64), torch.zeros(3, dtype=F64)
    rod_too_fat = torch.diag(torch.tensor([1.0, 0.3, 0.3], dtype=F64))  # 1.0 > 0.3 + 0.3
    assert (torch.linalg.eigvalsh(rod_too_fat) > 0).all()
    assert not bool(is_physically_consistent(m, c, rod_too_fat))
    with pytest.raises(ModelError, match="triangle inequality"):
        inertial_to_log_cholesky(m, c, rod_too_fat)
    with pytest.raises(ModelError, match="positive mass"):
        inertial_to_log_cholesky(torch.tensor(0.0, dtype=F64), c, torch.eye(3, dtype=F64))


# ---------------------------------------------------------------------------- installing on a robot
@pytest.mark.parametrize("kind", ["physically_consistent", "independent"])
def test_make_link_inertial_learnable_keeps_the_model(kind):
    robot = _iiwa()
    tau0 = _tau(robot)
    modules = [make_link_inertial_learnable(robot, name, kind) for name in IIWA_MOVING]
    assert robot.link_params("iiwa_link_3").inertial_source is modules[2]
    assert robot.model_tensors() is not robot.model_tensors()  # learnable values are read at every call
    names = set(robot.learnable_parameters(readable=False))
    assert ("links.3.inertial_source.theta" in names) == (kind == "physically_consistent")
    assert len([n for n in names if ".inertial_source." in n]) >= len(IIWA_MOVING)
    _close(_tau(robot), tau0)


def test_install_on_float32_robot_and_supersede_single_parameters():
    robot = _iiwa()
    q, v, a, _ = random_state(robot, (4,), seed=0)
    tau0 = robot.inverse_dynamics(q, v, a, passive=False).float()
    robot.make_link_param_learnable("iiwa_link_3", "mass", PositiveScalar())
    robot.to(torch.float32)
    src = make_link_inertial_learnable(robot, "iiwa_link_3")
    assert src.theta.dtype == torch.float32
    # the link's own (now unused) learnable mass is frozen so optimisers do not carry it along
    assert not robot.link_params("iiwa_link_3").parametrizations.mass.original.requires_grad
    tau32 = robot.inverse_dynamics(q.float(), v.float(), a.float(), passive=False)
    torch.testing.assert_close(tau32, tau0, rtol=1e-4, atol=1e-4)


def test_make_link_inertial_learnable_errors_name_the_link():
    robot = _iiwa()
    with pytest.raises(ModelError, match="iiwa_link_ee.*positive mass"):
        make_link_inertial_learnable(robot, "iiwa_link_ee")  # massless in the URDF
    with pytest.raises(ModelError, match="kind"):
        make_link_inertial_learnable(robot, "iiwa_link_2", kind="cholesky")
    with pytest.raises(ModelError, match="no link named"):
        make_link_inertial_learnable(robot, "iiwa_link_9")


def test_single_tensor_parametrizations_keep_the_model():
    robot = _iiwa()
    tau0 = _tau(robot, passive=True)
    robot.make_link_param_learnable("iiwa_link_2", "mass", PositiveScalar())
    robot.make_link_param_learnable("iiwa_link_5", "inertia", SymmetricPositiveDefinite())
    robot.make_link_param_learnable("iiwa_link_3", "damping", PositiveScalar())  # URDF damping 0 -> floor
    tau1 = _tau(robot, passive=True)
    torch.testing.assert_close(tau1, tau0, rtol=1e-10, atol=1e-5)  # 1e-6 N m s/rad floor on damping
    names = set(robot.learnable_parameters(readable=False))
    assert "links.2.parametrizations.mass.original" in names
    assert "links.5.parametrizations.inertia.original" in names


def test_regressor_reproduces_torques_and_restores_the_robot():
    robot = _iiwa()
    make_link_inertial_learnable(robot, "iiwa_link_4")
    q, v, a, _ = random_state(robot, (2, 3), seed=10)
    tau = robot.inverse_dynamics(q, v, a, passive=False)
    Y = inertial_regressor(robot, q, v, a)
    moving = [n for n, b in zip(robot.link_names, robot.link_body) if b >= 0]
    assert Y.shape == (2, 3, robot.nv, 10 * len(moving))
    pi = torch.cat([standard_inertial_parameters(*robot.link_params(n).inertial()) for n in moving]).detach()
    _close(Y @ pi, tau.detach(), tol=1e-10)
    assert isinstance(robot.link_params("iiwa_link_4").inertial_source, PhysicallyConsistentInertial)
    assert robot.link_params("iiwa_link_2").inertial_source is None
    _close(robot.inverse_dynamics(q, v, a, passive=False), tau)


# ---------------------------------------------------------------------------- gradients
def test_gradients_match_finite_differences():
    """d(inverse_dynamics)/d(raw) through all three kinds of parametrization, by gradcheck."""
    robot = _iiwa()
    make_link_inertial_learnable(robot, "iiwa_link_3")
    make_link_inertial_learnable(robot, "iiwa_link_6", "independent")
    robot.make_link_param_learnable("iiwa_link_5", "mass", PositiveScalar())
    robot.make_link_param_learnable("iiwa_link_2", "damping", PositiveScalar())
    with torch.no_grad():
        robot.joint_params("iiwa_joint_2").parametrizations.damping.original.fill_(0.3)
    names = sorted(robot.learnable_parameters(readable=False))
    assert len(names) == 6
    q, v, a, _ = random_state(robot, (3,), seed=11)
    wrapper = _Call(robot, passive=True)
    params = robot.learnable_parameters(readable=False)
    values = [params[n].detach().clone().requires_grad_(True) for n in names]

    def call(*vals):
        return torch.func.functional_call(wrapper, {f"robot.{n}": t for n, t in zip(names, vals)}, (q, v, a))

    assert torch.autograd.gradcheck(call, values, eps=1e-6, atol=1e-6, rtol=1e-6)


def test_backward_fills_raw_gradients():
    robot = _iiwa()
    src = make_link_inertial_learnable(robot, "iiwa_link_7")
    robot.make_link_param_learnable("iiwa_link_4", "mass", PositiveScalar())
    _tau(robot).square().sum().backward()
    assert src.theta.grad is not None and src.theta.grad.abs().sum() > 0
    raw = robot.link_params("iiwa_link_4").parametrizations.mass.original
    assert raw.grad is not None and raw.grad.abs() > 0


# ---------------------------------------------------------------------------- module plumbing
def _learnable_iiwa():
    robot = _iiwa()
    make_link_inertial_learnable(robot, "iiwa_link_2")
    make_link_inertial_learnable(robot, "iiwa_link_6", "independent")
    robot.make_link_param_learnable("iiwa_link_4", "mass", PositiveScalar())
    robot.make_link_param_learnable("iiwa_link_5", "inertia", SymmetricPositiveDefinite())
    return robot


def test_state_dict_round_trip():
    a = _learnable_iiwa()
    with torch.no_grad():
        g = torch.Generator().manual_seed(12)
        for p in a.parameters():
            p.add_(0.1 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    tau_a = _tau(a)
    buf = io.BytesIO()
    torch.save(a.state_dict(), buf)
    b = _learnable_iiwa()
    assert (_tau(b) - tau_a).abs().max() > 1e-3  # b starts elsewhere
    buf.seek(0)
    b.load_state_dict(torch.load(buf))
    _close(_tau(b), tau_a)
    keys = set(a.state_dict())
    assert {"links.2.inertial_source.theta", "links.4.parametrizations.mass.original"} <= keys


def test_to_float32():
    robot = _learnable_iiwa()
    q, v, a, _ = random_state(robot, (5,), seed=13)
    tau64 = robot.inverse_dynamics(q, v, a).detach()
    robot.to(torch.float32)
    src = robot.link_params("iiwa_link_2").inertial_source
    assert src.theta.dtype == torch.float32
    assert robot.link_params("iiwa_link_4").parametrizations.mass.original.dtype == torch.float32
    tau32 = robot.inverse_dynamics(q.float(), v.float(), a.float())
    assert tau32.dtype == torch.float32
    torch.testing.assert_close(tau32.double(), tau64, rtol=1e-4, atol=1e-4)
    tau32.square().sum().backward()
    assert src.theta.grad.dtype == torch.float32 and torch.isfinite(src.theta.grad).all()


def test_functional_call_with_parameter_dict():
    robot = _learnable_iiwa()
    q, v, a, _ = random_state(robot, (4,), seed=14)
    tau0 = robot.inverse_dynamics(q, v, a).detach()
    theta_new = inertial_to_log_cholesky(*_random_bodies(1, seed=15))[0]
    raw_mass = torch.tensor(1.3, dtype=F64)
    swap = {
        "robot.links.2.inertial_source.theta": theta_new,
        "robot.links.4.parametrizations.mass.original": raw_mass,
    }
    tau_fc = torch.func.functional_call(_Call(robot), swap, (q, v, a))
    _close(robot.inverse_dynamics(q, v, a).detach(), tau0)  # the module is untouched
    ref = copy.deepcopy(robot)
    with torch.no_grad():
        ref.link_params("iiwa_link_2").inertial_source.theta.copy_(theta_new)
        ref.link_params("iiwa_link_4").parametrizations.mass.original.copy_(raw_mass)
    _close(tau_fc, ref.inverse_dynamics(q, v, a))
    assert (tau_fc - tau0).abs().max() > 1e-3


def test_freeze_stops_updates():
    robot = _iiwa()
    robot.make_link_param_learnable("iiwa_link_2", "mass", PositiveScalar())
    robot.make_link_param_learnable("iiwa_link_3", "mass", PositiveScalar())
    src = make_link_inertial_learnable(robot, "iiwa_link_5")
    robot.freeze_link_param("iiwa_link_2", "mass")
    src.requires_grad_(False)  # the documented way to freeze an inertial source
    frozen = robot.link_params("iiwa_link_2").parametrizations.mass.original
    live = robot.link_params("iiwa_link_3").parametrizations.mass.original
    before = (frozen.detach().clone(), live.detach().clone(), src.theta.detach().clone())
    opt = torch.optim.SGD([p for p in robot.parameters() if p.requires_grad], lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        _tau(robot).square().sum().backward()
        opt.step()
    assert torch.equal(frozen.detach(), before[0])
    assert torch.equal(src.theta.detach(), before[2])
    assert not torch.equal(live.detach(), before[1])


def test_training_keeps_bodies_consistent():
    """Large Adam steps on the log-Cholesky coordinates never leave the physical set."""
    robot = _iiwa()
    src = make_link_inertial_learnable(robot, "iiwa_link_4")
    opt = torch.optim.Adam([src.theta], lr=0.5)
    for _ in range(5):
        opt.zero_grad()
        (-_tau(robot).square().sum()).backward()  # push anywhere, hard
        opt.step()
        assert bool(is_physically_consistent(*src()))


# ---------------------------------------------------------------------------- example
def _load_example():
    path = os.path.join(os.path.dirname(__file__), os.pardir, "examples", "identify_iiwa_inertia.py")
    spec = importlib.util.spec_from_file_location("identify_iiwa_inertia", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_example_runs(tmp_path):
    pytest.importorskip("diff_robot_data")
    ex = _load_example()
    out = tmp_path / "identify"
    res = ex.main(["--steps", "4", "--train", "24", "--test", "24", "--out", str(out)])
    with open(out / "results.json") as f:
        saved = json.load(f)
    assert saved["robot"] == res["robot"] == "iiwa7"
    assert saved["learned_links"] == IIWA_MOVING
    assert saved["identifiability"]["base_parameters"] < saved["identifiability"]["standard_parameters"]
    assert saved["physically_consistent_after"]
    h = saved["heldout_torque_rel_error"]
    assert h["after"] < 0.1 * h["before"]
    assert saved["train_loss"][-1] < saved["train_loss"][0]
    assert set(saved["per_link"]["iiwa_link_3"]["after"]) == {"mass", "com", "inertia"}
    assert all(math.isfinite(v) for v in saved["per_link"]["iiwa_link_1"]["after"].values())
    assert (out / "identify_iiwa.png").stat().st_size > 1000
