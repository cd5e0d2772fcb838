"""Every way of changing a parameter is seen by the next call (no stale cached model tensors).

Each test changes one parameter of a model by one route and compares inverse dynamics with a model
built afresh with the changed value (the oracle: no cache has seen the old value). The cache itself
is checked too: unchanged parameters give the very same model tensors.
"""

from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from torch import nn

import diffmech
from diffmech.model import systems
from diffmech.model.params import PositiveScalar, make_link_inertial_learnable

F64 = torch.float64


def build(mass2=1.0, damping=0.0, gravity=9.81):
    # point masses (bob radius 0): a link's inertia does not depend on its mass
    return systems.n_link_pendulum(3, masses=(1.0, mass2, 0.5), lengths=(1.0, 1.0, 0.7), damping=damping,
                                   gravity=gravity, bob_radius=0.0)


@pytest.fixture
def state():
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(4, 3, dtype=F64, generator=g) for _ in range(3))


def tau(robot, state):
    return robot.inverse_dynamics(*state).detach()


def same(a, b):
    torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_unchanged_parameters_reuse_the_model_tensors(state):
    robot = build()
    assert robot.model_tensors() is robot.model_tensors()
    v = robot.param_version
    tau(robot, state)
    assert robot.param_version == v


def test_in_place_op(state):
    robot = build()
    tau(robot, state)
    with torch.no_grad():
        robot.link_params("link2").mass.mul_(3.0)
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_in_place_op_through_data(state):
    robot = build()
    tau(robot, state)
    robot.link_params("link2").mass.data.mul_(3.0)  # .data has a version counter of its own
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_rebinding_data(state):
    robot = build()
    tau(robot, state)
    p = robot.link_params("link2").mass
    p.data = torch.tensor(3.0, dtype=F64)
    same(tau(robot, state), tau(build(mass2=3.0), state))
    p.data.mul_(2.0)  # still the model's tensor after the rebinding
    same(tau(robot, state), tau(build(mass2=6.0), state))


def test_set_(state):
    robot = build()
    tau(robot, state)
    with torch.no_grad():
        robot.link_params("link2").mass.set_(torch.tensor(3.0, dtype=F64))
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_attribute_assignment(state):
    robot = build()
    tau(robot, state)
    robot.link_params("link2").mass = torch.tensor(3.0, dtype=F64)
    same(tau(robot, state), tau(build(mass2=3.0), state))
    robot.link_params("link2").mass.mul_(2.0)  # the assigned tensor is read at every call
    same(tau(robot, state), tau(build(mass2=6.0), state))


def test_a_state_dict_alias(state):
    robot = build()
    tau(robot, state)
    sd = robot.state_dict()  # aliases of the parameters
    sd["links.2.mass"].fill_(3.0)
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_load_state_dict(state):
    robot = build()
    tau(robot, state)
    robot.load_state_dict(build(mass2=3.0, damping=0.4).state_dict())
    same(tau(robot, state), tau(build(mass2=3.0, damping=0.4), state))


def test_load_state_dict_with_assign(state):
    robot = build()
    tau(robot, state)
    robot.load_state_dict(build(mass2=3.0).state_dict(), assign=True)
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_to_dtype_and_back(state):
    robot = build()
    tau(robot, state)
    robot.to(torch.float32)
    assert robot.model_tensors().body_mass.dtype == torch.float32
    with torch.no_grad():
        robot.link_params("link2").mass.fill_(3.0)
    robot.to(F64)
    same(tau(robot, state), tau(build(mass2=3.0).to(torch.float32).to(F64), state))


def test_set_gravity(state):
    robot = build()
    tau(robot, state)
    robot.set_gravity([0.0, 0.0, -3.0])
    same(tau(robot, state), tau(build(gravity=3.0), state))


def test_optimiser_step(state):
    robot = build()
    robot.make_link_param_learnable("link2", "mass")
    opt = torch.optim.SGD(robot.parameters(), lr=0.01)
    robot.inverse_dynamics(*state).sum().backward()
    g = float(robot.link_params("link2").mass.grad)
    opt.step()
    with torch.no_grad():
        same(tau(robot, state), tau(build(mass2=1.0 - 0.01 * g), state))


def test_optimiser_step_on_a_frozen_copy_under_no_grad(state):
    """A learnable parameter evaluated without a graph follows the optimiser too."""
    robot = build()
    robot.make_link_param_learnable("link2", "mass")
    with torch.no_grad():
        tau(robot, state)
        robot.link_params("link2").mass.add_(2.0)
        same(tau(robot, state), tau(build(mass2=3.0), state))


def test_parametrization(state):
    robot = build()
    tau(robot, state)
    robot.make_link_param_learnable("link2", "mass", PositiveScalar())
    same(tau(robot, state), tau(build(), state))
    with torch.no_grad():
        orig = robot.link_params("link2").parametrizations.mass.original
        orig.copy_(PositiveScalar().right_inverse(torch.tensor(3.0, dtype=F64)))
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_inertial_source(state):
    robot = systems.n_link_pendulum(3, bob_radius=0.1)  # a physically consistent (non-point) mass
    before = tau(robot, state)
    src = make_link_inertial_learnable(robot, "link2")
    same(tau(robot, state), before)
    with torch.no_grad():
        src.theta[0] += 0.5 * torch.log(torch.tensor(3.0, dtype=F64))  # mass = exp(2 alpha): x3
    after = tau(robot, state)
    assert not torch.allclose(after, before)
    same(after, tau(copy.deepcopy(robot), state))  # a copy computes its tensors afresh


def test_requires_grad_on_a_buffer_gives_a_gradient(state):
    robot = build()
    tau(robot, state)
    m = robot.link_params("link2").mass
    m.requires_grad_(True)
    robot.inverse_dynamics(*state).sum().backward()
    assert m.grad is not None and m.grad.abs() > 0


def test_functional_call(state):
    robot = build()
    tau(robot, state)
    out = torch.func.functional_call(robot, {"links.2.mass": torch.tensor(3.0, dtype=F64)},
                                     (state[0], state[1], torch.zeros(4, 3, dtype=F64)))
    ref = build(mass2=3.0).forward_dynamics(state[0], state[1], torch.zeros(4, 3, dtype=F64))
    same(out, ref)
    same(tau(robot, state), tau(build(), state))  # and back to the robot's own value


def test_vmap_over_a_parameter_ensemble(state):
    robot = build()
    masses = torch.tensor([1.0, 2.0, 3.0], dtype=F64)

    def one(m):
        return torch.func.functional_call(robot, {"links.2.mass": m}, (state[0], state[1], state[2]))

    out = torch.vmap(one)(masses)
    for k, m in enumerate(masses.tolist()):
        same(out[k], build(mass2=m).forward_dynamics(*state))


def test_joint_placement(state):
    spec_changed = build()
    # the oracle: a model whose first call comes after the change (its joint frames are built once)
    with torch.no_grad():
        spec_changed.joint_params("joint3").origin_xyz[2] = -0.5
    robot = build()
    tau(robot, state)
    robot.joint_params("joint3").origin_xyz.data[2] = -0.5
    same(tau(robot, state), tau(spec_changed, state))


def test_deepcopy_and_pickle_are_independent(state):
    robot = build()
    tau(robot, state)
    twin = copy.deepcopy(robot)
    twin.link_params("link2").mass.data.fill_(3.0)
    same(tau(twin, state), tau(build(mass2=3.0), state))
    same(tau(robot, state), tau(build(), state))
    buf = io.BytesIO()
    torch.save(robot, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=False)
    loaded.link_params("link2").mass.data.fill_(3.0)
    same(tau(loaded, state), tau(build(mass2=3.0), state))
    same(tau(pickle.loads(pickle.dumps(robot)), state), tau(build(), state))


def test_replacing_a_whole_parameter_module(state):
    robot = build()
    tau(robot, state)
    robot.links[2] = copy.deepcopy(build(mass2=3.0).links[2])
    same(tau(robot, state), tau(build(mass2=3.0), state))


def test_a_nan_parameter_is_named(state):
    robot = build()
    robot.link_params("link2").mass.data.fill_(float("nan"))
    with pytest.raises(diffmech.ModelError, match="link2.*mass"):
        robot.inverse_dynamics(*state)


def test_parameters_module_list_is_still_a_module():
    robot = build()
    assert isinstance(robot.links[0], nn.Module)
    assert {n for n, _ in robot.named_buffers()} >= {"links.2.mass", "joints.1.damping", "gravity"}
