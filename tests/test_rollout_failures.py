"""Rollouts that fail loudly: divergence, non-finite controls and gradients, policies that read
tensors the backward pass cannot reach; and ``stable_dt`` against analytic stability limits."""

from __future__ import annotations

import importlib
import math

import pytest
import torch
from torch import nn

from diffmech.errors import OptionError, SimulationError
from diffmech.model import systems
from diffmech.sim import rollout, stable_dt
from test_rollout import DT, MLPPolicy, _assert_same, _load, two_link_arm

ro = importlib.import_module("diffmech.sim.rollout")


def _iiwa_push(mag=20.0, T=120):
    robot = _load("iiwa")
    q0 = robot.neutral_configuration() + 0.3
    return robot, q0, torch.zeros(robot.nv, dtype=DT), torch.full((T, robot.nv), mag, dtype=DT)


# ---------------------------------------------------------------- divergence
@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
@pytest.mark.parametrize("grad", [True, False])
def test_divergence_is_caught_before_overflow(adjoint, grad):
    """The issue's case: constant torques on the iiwa at dt = 10 ms blow up super-exponentially."""
    robot, q0, v0, tau = _iiwa_push()
    tau.requires_grad_(grad)
    with pytest.raises(SimulationError) as info:
        rollout(robot, q0, v0, tau, 0.01, adjoint=adjoint)
    msg = str(info.value)
    assert "diverged at step 83 (state 84, t = 0.84 s)" in msg
    assert "kinetic energy" in msg and "fastest coordinate is joint 'iiwa_joint_" in msg
    suggested = float(msg.split("stable_dt suggests dt <= ")[1].split(" s")[0])
    assert 1e-4 < suggested < 0.01
    # Without the check the same trajectory is finite through step 83 and overflows a few steps later.
    with pytest.raises(SimulationError, match=r"non-finite state at step (\d+)") as late:
        rollout(robot, q0, v0, tau.detach(), 0.01, max_energy_growth=None)
    first_bad = int(str(late.value).split("non-finite state at step ")[1].split(" ")[0])
    assert 83 < first_bad <= 95
    with torch.no_grad():
        q, v = rollout(robot, q0, v0, tau[:84].detach(), 0.01, max_energy_growth=None)
    assert torch.isfinite(v).all() and v.abs().max() < 1e5


def test_divergence_names_the_batch_element():
    robot, q0, v0, tau = _iiwa_push()
    tau = torch.stack([tau * 0.1, tau, tau * 0.1])  # element 1 diverges
    with pytest.raises(SimulationError, match=r"diverged at step 83 .*in batch element \(1,\) \(1 of 3 batch"):
        rollout(robot, q0, v0, tau, 0.01)


def _ratio(robot, q0, v0, tau, dt, **kw) -> float:
    stats: dict = {}
    with torch.no_grad():
        rollout(robot, q0, v0, tau, dt, stats=stats, **kw)
    return stats["max_energy_ratio"]


@pytest.mark.parametrize("integrator,dt,limit", [("semi_implicit_euler", 1e-3, 1.1), ("rk4", 2e-3, 1.1),
                                                 ("euler", 1e-3, 2.0), ("midpoint", 2e-3, 1.1),
                                                 ("variational_midpoint", 5e-3, 1.1)])
def test_sane_rollouts_stay_near_the_energy_bound(integrator, dt, limit):
    """Without a divergence the kinetic energy stays within the received energy (ratio ~ 1), far
    below the default factor 1000: the iiwa falling from rest, and a random torque sequence."""
    robot = _load("iiwa")
    g = torch.Generator().manual_seed(0)
    q0 = robot.random_configuration(2, generator=g)
    T = 40 if integrator == "variational_midpoint" else 200
    tau = torch.zeros(2, T, robot.nv, dtype=DT)
    tau[1] = 5 * torch.randn(T, robot.nv, dtype=DT, generator=g)
    ratio = _ratio(robot, q0, torch.zeros(2, robot.nv, dtype=DT), tau, dt, integrator=integrator)
    assert 0.3 < ratio < limit


def test_energy_bound_counts_external_forces_and_floating_base():
    """A floating base pushed by external forces and falling: the work of f_ext and gravity counts."""
    robot = _load("laikago")
    g = torch.Generator().manual_seed(1)
    T = 300
    f_ext = torch.zeros(T, robot.n_links, 6, dtype=DT)
    f_ext[:50, 0, :3] = torch.tensor([200.0, 0.0, 300.0], dtype=DT)  # a push on the trunk
    q0 = robot.neutral_configuration()
    v0 = 0.5 * torch.randn(robot.nv, dtype=DT, generator=g)
    ratio = _ratio(robot, q0, v0, torch.zeros(T, robot.nv, dtype=DT), 1e-3, f_ext=f_ext)
    assert 0.5 < ratio < 1.1
    # A PD policy on the arm (controls through a policy are counted too).
    arm = two_link_arm()
    ratio = _ratio(arm, torch.tensor([1.0, -0.5], dtype=DT), torch.zeros(2, dtype=DT),
                   lambda t, q, v: -20.0 * q - 0.5 * v, 1e-3, steps=500)
    assert 0.3 < ratio < 1.1


def test_stiff_system_stable_at_suggested_dt_diverges_at_ten_times():
    robot = systems.n_link_pendulum(3, masses=[1.0, 0.5, 0.1], lengths=[0.5, 0.4, 0.2], stiffness=[400.0, 200.0, 80.0],
                                    damping=0.01)
    q0 = torch.tensor([0.3, -0.2, 0.4], dtype=DT)
    v0 = torch.zeros(3, dtype=DT)
    for integrator in ("semi_implicit_euler", "rk4"):
        dt = stable_dt(robot, integrator=integrator, generator=torch.Generator().manual_seed(0))
        T = 400
        stats: dict = {}
        q, v = rollout(robot, q0, v0, torch.zeros(T, 3, dtype=DT), dt, integrator=integrator, stats=stats)
        assert stats["max_energy_ratio"] < 1.5 and v.abs().max() < 500
        with pytest.raises(SimulationError, match=r"diverged at step \d+ .*stable_dt suggests dt <= "):
            rollout(robot, q0, v0, torch.zeros(T, 3, dtype=DT), 10 * dt, integrator=integrator)


def test_max_energy_growth_option():
    robot, q0, v0, tau = _iiwa_push(T=10)
    for bad in (0, -1.0, float("inf"), "big"):
        with pytest.raises(OptionError, match="max_energy_growth"):
            rollout(robot, q0, v0, tau, 0.01, max_energy_growth=bad)
    # A bound below the physical ratio (~0.5 here) fires at the first step.
    with pytest.raises(SimulationError, match=r"diverged at step 0 .*exceeds max_energy_growth = 0.001 times"):
        rollout(robot, q0, v0, tau, 0.01, max_energy_growth=1e-3)


# ---------------------------------------------------------------- non-finite inputs
def test_non_finite_controls_are_refused_where_they_enter():
    robot = two_link_arm()
    T = 50
    z = torch.zeros(3, 2, dtype=DT)
    tau = torch.zeros(3, T, 2, dtype=DT)
    tau[2, 41, 1] = float("nan")
    for adjoint in ("checkpoint", "autograd"):
        with pytest.raises(SimulationError, match=r"'tau' is not finite at step 41 \(t = 0.41 s\) in batch element "
                                                  r"\(2,\), joint 'elbow': nan"):
            rollout(robot, z, z, tau, 0.01, adjoint=adjoint)
    f_ext = torch.zeros(3, T, robot.n_links, 6, dtype=DT)
    f_ext[0, 7, 2, 4] = float("inf")
    with pytest.raises(SimulationError, match=r"'f_ext' is not finite at step 7 .*batch element \(0,\), link 'fore', "
                                              r"component 4"):
        rollout(robot, z, z, torch.zeros(3, T, 2, dtype=DT), 0.01, f_ext=f_ext)


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_non_finite_policy_output_names_the_step(adjoint):
    robot = two_link_arm()

    def policy(t, q, v):
        u = -q - v
        if round(t / 0.01) == 40:
            u = u.clone()
            u[2, 0] = float("inf")
        return u

    q0 = torch.full((4, 2), 0.1, dtype=DT, requires_grad=True)
    with pytest.raises(SimulationError, match=r"the policy returned a non-finite value at step 40 \(t = 0.4 s\) in "
                                              r"batch element \(2,\).*joint 'shoulder': inf"):
        rollout(robot, q0, torch.zeros(4, 2, dtype=DT), policy, 0.01, steps=60, adjoint=adjoint)


# ---------------------------------------------------------------- non-finite gradients
def test_non_finite_loss_gradient_is_blamed_on_the_loss():
    robot = two_link_arm()
    q0 = torch.tensor([0.2, 0.1], dtype=DT, requires_grad=True)
    q, v = rollout(robot, q0, torch.zeros(2, dtype=DT), torch.zeros(10, 2, dtype=DT), 0.01)
    loss = torch.sqrt(q[5, 0] - q[5, 0].detach())  # d sqrt(x)/dx at 0: inf
    with pytest.raises(SimulationError, match=r"loss w.r.t. the returned 'q' at state 5 .*joint 'shoulder', is not "
                                              r"finite \(inf\): the loss produced it"):
        loss.backward()


def _nan_jacobian_policy(k_bad, dt):
    """A PD law whose output is finite everywhere but whose derivative w.r.t. q is NaN at step ``k_bad``."""

    def policy(t, q, v):
        u = -4.0 * q - 0.3 * v
        if round(t / dt) == k_bad:
            u = u + torch.sqrt(q - q)  # value 0, derivative 0.5 / sqrt(0) * 0 = nan
        return u
    return policy


@pytest.mark.parametrize("path", ["time_batched", "hand_sequential", "generic_sequential"])
def test_non_finite_policy_jacobian_names_step_and_input(monkeypatch, path):
    if path != "time_batched":
        monkeypatch.setattr(ro, "TIME_BATCHED_MAX_WORK", 0)
    integrator = "rk4" if path == "generic_sequential" else "semi_implicit_euler"
    robot = two_link_arm()
    q0 = torch.tensor([[0.3, -0.2], [0.1, 0.4]], dtype=DT, requires_grad=True)
    q, v = rollout(robot, q0, torch.zeros(2, 2, dtype=DT), _nan_jacobian_policy(45, 0.01), 0.01, steps=70,
                   integrator=integrator)
    with pytest.raises(SimulationError, match=r"gradient w.r.t. 'q' at step 45 \(t = 0.45 s\) in batch element "
                                              r"\(0,\) is not finite, while the gradient w.r.t. the state after it"):
        (q * q).sum().backward()


class _SqrtGain(nn.Module):
    """``tau = -sqrt(gain) q``: at ``gain = 0`` the output is finite, its derivative w.r.t. gain is not."""

    def __init__(self):
        super().__init__()
        self.gain = nn.Parameter(torch.zeros(2, dtype=DT))

    def forward(self, t, q, v):
        return -torch.sqrt(self.gain) * q - v


@pytest.mark.parametrize("rows", [100, 0])
def test_non_finite_parameter_gradient_names_the_parameter(monkeypatch, rows):
    monkeypatch.setattr(ro, "TIME_BATCHED_MAX_WORK", rows)
    robot = two_link_arm()
    q, _ = rollout(robot, torch.tensor([0.3, -0.2], dtype=DT), torch.zeros(2, dtype=DT), _SqrtGain(), 0.01, steps=40)
    with pytest.raises(SimulationError, match=r"gradient w.r.t. policy parameter 'gain' at step 39 "):
        q.sum().backward()


@pytest.mark.parametrize("path", ["time_batched", "hand_sequential", "generic_sequential", "compiled_step"])
def test_overflowing_adjoint_names_the_step(monkeypatch, path):
    """Tensor controls: an adjoint that overflows on its way back is caught on every reverse path. The
    forward check is off and the step far beyond the stability limit, so that every reverse step
    multiplies a huge loss gradient by the step's amplification (~50)."""
    if path != "time_batched":
        monkeypatch.setattr(ro, "TIME_BATCHED_MAX_WORK", 0)
    integrator = "rk4" if path == "generic_sequential" else "semi_implicit_euler"
    robot = systems.n_link_pendulum(2, stiffness=[3e4, 3e4])
    kw = {}
    if path == "compiled_step":
        from diffmech.dynamics import compiled

        kw["compile"] = compiled(robot, compile=False, chunk=None)
    q0 = torch.tensor([1e-200, -1e-200], dtype=DT, requires_grad=True)  # tiny: the dynamics stay linear
    tau = torch.zeros(40, 2, dtype=DT, requires_grad=True)
    q, _ = rollout(robot, q0, torch.zeros(2, dtype=DT), tau, 4e-2, integrator=integrator,
                   max_energy_growth=None, **kw)
    assert torch.isfinite(q).all()
    with pytest.raises(SimulationError, match=r"the gradient w.r.t. .*'q'.* at step \d+ \(t = .*is not finite"):
        (1e280 * q[-1]).sum().backward()


# ---------------------------------------------------------------- params=
def test_policy_reading_a_tensor_computed_outside_is_refused_with_advice():
    robot = two_link_arm()
    T = 10
    W = torch.randn(T, 2, dtype=DT, requires_grad=True)
    scale = torch.tensor([2.0, 3.0], dtype=DT)
    U = W * scale  # computed outside the policy

    def policy(t, q, v):
        return U[round(t / 0.01)]

    z = torch.zeros(2, dtype=DT)
    for params in ([W], None):
        with pytest.raises(SimulationError, match=r"reads 'U' that requires grad and was computed outside it .*"
                                                  r"params= expects the tensors the policy reads.*params=\[U\]"):
            rollout(robot, z, z, policy, 0.01, steps=T, params=params)
    # What the message advises: pass U; its gradient then flows on to W (as with autograd).
    grads = {}
    for adjoint in ("checkpoint", "autograd"):
        U = W * scale  # afresh: each backward below frees the graph of the one before
        q, _ = rollout(robot, z, z, policy, 0.01, steps=T, params=[U], adjoint=adjoint)
        grads[adjoint] = torch.autograd.grad((q**2).sum() + q.sum(), W)
    _assert_same(grads["checkpoint"], grads["autograd"])
    assert grads["checkpoint"][0][:-1].abs().min() > 0


def test_policy_reading_an_unlisted_leaf_is_refused():
    robot = two_link_arm()
    K = torch.tensor([3.0, 2.0], dtype=DT, requires_grad=True)
    z = torch.zeros(2, dtype=DT)
    with pytest.raises(SimulationError, match=r"depends on 1 tensor\(s\) that require grad but are not in params= "
                                              r"\(shapes \[\(2,\)\]\)"):
        rollout(robot, z + 0.1, z, lambda t, q, v: -K * q, 0.01, steps=5)
    q, _ = rollout(robot, z + 0.1, z, lambda t, q, v: -K * q, 0.01, steps=5, params=[K])  # listed: fine
    assert torch.autograd.grad(q.sum(), K)[0].abs().min() > 0


def test_graph_built_outside_after_the_first_step_gives_a_diffmech_error():
    """The probe sees step 0 only; a policy that first reads the outside graph later is caught in the
    backward pass, where torch's "backward through the graph a second time" becomes a SimulationError."""
    robot = two_link_arm()
    T = 6
    W = torch.randn(T, 2, dtype=DT, requires_grad=True)
    U = W * 2.0

    def policy(t, q, v):
        k = round(t / 0.01)
        return U[k] if k > 0 else -q

    z = torch.zeros(2, dtype=DT)
    q, _ = rollout(robot, z + 0.1, z, policy, 0.01, steps=T, params=[W])
    with pytest.raises(SimulationError, match=r"policy reads a tensor that requires grad and was computed outside it"):
        q.sum().backward()


def test_policy_using_robot_dynamics_with_learnable_parameters_is_not_flagged():
    """Gravity compensation reads the robot's (learnable) parameters: no false alarm, exact gradients."""
    robot = two_link_arm()
    robot.make_link_param_learnable("fore", "mass")
    K = torch.tensor([3.0, 2.0], dtype=DT, requires_grad=True)

    def policy(t, q, v):
        return robot.generalized_gravity(q) - K * q - 0.2 * v

    q0 = torch.tensor([[0.3, 0.1], [-0.2, 0.5]], dtype=DT, requires_grad=True)
    out = {}
    for adjoint in ("checkpoint", "autograd"):
        q, v = rollout(robot, q0, torch.zeros(2, 2, dtype=DT), policy, 0.01, steps=15, params=[K], adjoint=adjoint)
        out[adjoint] = torch.autograd.grad((q**2).sum() + v.sum(), [K, q0, *[p for p in robot.parameters()
                                                                                if p.requires_grad]])
    _assert_same(out["checkpoint"], out["autograd"])
    assert all(g.abs().max() > 0 for g in out["checkpoint"])


# ---------------------------------------------------------------- stable_dt
def _inertia(robot):
    return robot.mass_matrix(torch.zeros(1, dtype=DT))[0, 0].item()


def test_stable_dt_pendulum_with_spring():
    """Hanging pendulum with a spring: w^2 = (k + m g l) / I; semi-implicit Euler is stable up to
    2 / w (a period of pi steps), RK4 up to 2 sqrt(2) / w, explicit Euler only by the tolerance."""
    m, l, k = 2.0, 0.5, 3.0
    robot = systems.n_link_pendulum(1, masses=m, lengths=l, stiffness=k)
    w = math.sqrt((k + m * 9.81 * l) / _inertia(robot))
    period = 2 * math.pi / w
    q = torch.zeros(1, dtype=DT)
    h = {name: stable_dt(robot, q, integrator=name, safety=1.0, tol=1e-8)
         for name in ("semi_implicit_euler", "rk4", "euler", "midpoint")}
    assert h["semi_implicit_euler"] == pytest.approx(period / math.pi, rel=1e-6)
    assert h["rk4"] == pytest.approx(2 * math.sqrt(2) / w, rel=1e-6)
    assert h["euler"] == pytest.approx(math.sqrt(2e-8 + 1e-16) / w, rel=1e-6)  # |1 + i h w| <= 1 + tol
    assert h["midpoint"] == pytest.approx((8e-8) ** 0.25 / w, rel=1e-3)  # |1 + z + z^2/2| on the imaginary axis
    assert stable_dt(robot, q, integrator="variational_midpoint") == math.inf
    assert stable_dt(robot, q) == pytest.approx(0.5 * stable_dt(robot, q, safety=1.0))


def test_stable_dt_damped_joint():
    """A damped joint without spring or gravity: lam = -d / I; the Euler schemes and the midpoint
    rule are stable up to 2 I / d, RK4 up to 2.7853 I / d (its stability interval on the real axis)."""
    d = 0.7
    robot = systems.n_link_pendulum(1, masses=2.0, lengths=0.5, damping=d, gravity=(0.0, 0.0, 0.0))
    tau_d = _inertia(robot) / d
    q = torch.zeros(1, dtype=DT)
    for name, c in (("semi_implicit_euler", 2.0), ("euler", 2.0), ("midpoint", 2.0), ("rk4", 2.785293563405282)):
        assert stable_dt(robot, q, integrator=name, safety=1.0, tol=1e-10) == pytest.approx(c * tau_d, rel=1e-7)
    assert stable_dt(robot, q, passive=False) == math.inf  # nothing limits the step without damping


def test_stable_dt_defaults_floating_base_and_errors():
    robot = _load("iiwa")
    h = stable_dt(robot, generator=torch.Generator().manual_seed(0))
    assert 1e-3 < h < 0.02  # the wrist's damping (0.5) on its small inertia sets it
    fast = stable_dt(robot, robot.neutral_configuration(), torch.full((robot.nv,), 50.0, dtype=DT))
    assert fast < stable_dt(robot, robot.neutral_configuration())
    laikago = _load("laikago")
    assert 0 < stable_dt(laikago, integrator="rk4", generator=torch.Generator().manual_seed(0)) < math.inf
    with pytest.raises(OptionError, match="integrator"):
        stable_dt(robot, integrator="leapfrog")
    with pytest.raises(OptionError, match="safety"):
        stable_dt(robot, safety=0.0)


# ---------------------------------------------------------------- exactness of the guarded paths
def test_guards_do_not_change_gradients():
    """The chunked checks and the energy monitor are pure observers."""
    robot = two_link_arm()
    policy = MLPPolicy(2, 2)
    q0 = torch.tensor([[0.3, 0.1], [-0.2, 0.5]], dtype=DT, requires_grad=True)
    out = []
    for growth in (1e3, None):
        q, v = rollout(robot, q0, torch.zeros(2, 2, dtype=DT), policy, 0.01, steps=70, max_energy_growth=growth)
        out.append(torch.autograd.grad((q**2).sum(), [q0, *policy.parameters()]))
    _assert_same(out[0], out[1], tol=1e-300)


# ---------------------------------------------------------------- a scene's inputs, checked where they enter
def _ball_scene():
    from diffmech.sim import Scene

    return Scene({"ball": systems.sphere(0.1, 1.0)}, friction=0.5)


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
@pytest.mark.parametrize("case, pattern", [
    ("v0 nan", r"'v0' is not finite in batch element \(1,\): model 'ball', base twist component 4 = nan"),
    ("q0 inf", r"'q0' is not finite in batch element \(0,\): model 'ball', base position coordinate 2 = inf"),
    ("zero quaternion", r"'q0' holds a quaternion of norm 0 in batch element \(1,\): model 'ball', base quaternion "
                        r"\(coordinates 3..6"),
    ("quaternion of norm 2", r"'q0' holds a quaternion of norm 2 in batch element \(0,\)"),
    ("tau 1e300", r"'tau' is beyond 1e\+09 in magnitude \(SI units\?\) at step 7 \(t = 0.007 s\) in batch element "
                  r"\(1,\), model 'ball', base twist component 5: 1e\+300"),
    ("tau nan", r"'tau' is not finite at step 3 .*model 'ball', base twist component 0: nan"),
    ("v0 1e12", r"'v0' is beyond 1e\+09 in magnitude .*base twist component 0 = 1e\+12"),
])
def test_scene_rollout_names_the_bad_input(adjoint, case, pattern):
    """Before, each of these raised 'the mass matrix is not positive definite (a massless moving link?)'
    from inside the first step, naming neither the argument nor the step."""
    scene = _ball_scene()
    q0 = torch.tensor([[0, 0, 0.5, 0, 0, 0, 1.0]] * 2, dtype=DT)
    v0 = torch.zeros(2, 6, dtype=DT)
    tau = torch.zeros(2, 10, 6, dtype=DT)
    if case == "v0 nan":
        v0[1, 4] = math.nan
    elif case == "q0 inf":
        q0[0, 2] = math.inf
    elif case == "zero quaternion":
        q0[1, 3:] = 0.0
    elif case == "quaternion of norm 2":
        q0[0, 3:] *= 2.0
    elif case == "tau 1e300":
        tau[1, 7, 5] = 1e300
    elif case == "tau nan":
        tau[0, 3, 0] = math.nan
    elif case == "v0 1e12":
        v0[0, 0] = 1e12
    with pytest.raises(SimulationError, match=pattern):
        rollout(scene, q0, v0, tau, 1e-3, adjoint=adjoint)


def test_scene_rollout_accepts_a_quaternion_rounded_to_float32():
    scene = _ball_scene().to(torch.float32)
    q0 = torch.tensor([0, 0, 0.5, 0.1, 0.2, 0.3, 0.0], dtype=torch.float32)
    q0[6] = math.sqrt(1 - 0.14)  # norm 1 to float32 rounding
    q, _ = rollout(scene, q0, torch.zeros(6), torch.zeros(5, 6), 1e-3)
    assert torch.isfinite(q).all()


@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_scene_policy_output_nan_names_the_step_it_entered(adjoint):
    """A policy that returns NaN at step 5: the state after step 5 is not finite, and the error says so
    (the free body's step propagates it; the next step's factorisation finds it)."""
    scene = _ball_scene()

    def policy(t, q, v):
        return torch.full_like(v, math.nan) if round(t / 1e-3) == 5 else torch.zeros_like(v)

    q0 = torch.tensor([0, 0, 0.5, 0, 0, 0, 1.0], dtype=DT)
    with pytest.raises(SimulationError, match=r"the state after step 5 \(t = 0.006 s\) is not finite \('q' of model "
                                              r"'ball' is not finite in batch element 0"):
        rollout(scene, q0, torch.zeros(6, dtype=DT), policy, 1e-3, steps=10, adjoint=adjoint)


def test_floating_base_rollout_refuses_a_zero_quaternion():
    robot = systems.sphere(0.1, 1.0)
    q0 = torch.tensor([0, 0, 0.5, 0, 0, 0, 0.0], dtype=DT)
    with pytest.raises(SimulationError, match=r"'q0' holds a quaternion of norm 0: base quaternion"):
        rollout(robot, q0, torch.zeros(6, dtype=DT), torch.zeros(5, 6, dtype=DT), 1e-3)
