"""Which implementation runs a contact step or rollout (``info["route"]``, ``stats["route"]``), the
``require`` mode that forbids leaving the native route, and the native step as one autograd node:
against the torch step in a loop under autograd with a policy and learnable robot parameters, and
against central differences. float64, the hopper of ``hopper_scene`` (small kernels)."""

from __future__ import annotations

import pytest
import torch

import diffmech
from diffmech.dynamics import kernels
from diffmech.errors import NativeRouteError
from diffmech.sim import Scene, contact_step, prepare_ground_kernels, rollout
from hopper_scene import make_scene, start_state

F64 = torch.float64


def test_routes_are_recorded_with_their_reason():
    scene = make_scene()
    assert prepare_ground_kernels(scene)
    q, v = start_state(scene)
    tau = torch.zeros(2, scene.nv, dtype=F64)
    for mode, want in (("auto", "native"), ("never", "torch: native kernels off (DIFFMECH_NATIVE=never)")):
        with kernels.native_mode(mode):
            info: dict = {}
            contact_step(scene, q, v, tau, 2e-3, info=info)
            assert info["route"] == want
            stats: dict = {}
            rollout(scene, q, v, tau[:, None].expand(2, 3, -1), 2e-3, stats=stats)
            assert stats["route"] == want
    with kernels.native_mode("auto"):
        stats = {}
        rollout(scene, q, v, tau[:, None].expand(2, 3, -1), 2e-3, adjoint="autograd", stats=stats)
        assert stats["route"] == "torch: adjoint='autograd'"
        two = Scene([make_scene().models["hopper"], diffmech.model.systems.sphere(0.05, 0.2, name="ball")])
        info = {}
        q2 = torch.cat([q, torch.tensor([[0.5, 0, 0.1, 0, 0, 0, 1]] * 2, dtype=F64)], -1)
        contact_step(two, q2, torch.zeros(2, two.nv, dtype=F64), torch.zeros(2, two.nv, dtype=F64), 2e-3, info=info)
        assert info["route"] == "torch: 2 models in the scene"


def test_require_mode_raises_where_the_torch_route_would_run():
    scene = make_scene()
    assert prepare_ground_kernels(scene)
    q, v = start_state(scene)
    tau = torch.zeros(2, scene.nv, dtype=F64)
    with kernels.native_mode("require"):
        info: dict = {}
        contact_step(scene, q, v, tau, 2e-3, info=info)
        assert info["route"] == "native"
        with pytest.raises(NativeRouteError, match=r"rollout: .*adjoint='autograd'.*DIFFMECH_NATIVE=require"):
            rollout(scene, q, v, tau[:, None], 2e-3, adjoint="autograd")
        smooth = make_scene()
        smooth.solver = "smooth"
        with pytest.raises(NativeRouteError, match="solver 'smooth'"):
            contact_step(smooth, q, v, tau, 2e-3)


def _policy_loop(scene, q, v, net, T, dt):
    """``T`` steps of ``contact_step`` under autograd with the policy ``net``, warm-started as a user would."""
    warm, out = {}, []
    for _ in range(T):
        u = net(torch.cat([q, v], -1))
        tau = torch.cat([u.new_zeros(u.shape[0], 6), u], -1)
        info: dict = {}
        q, v = contact_step(scene, q, v, tau, dt, info=info, warm=warm)
        warm = info["lam"]
        out.append(info["route"])
    return q, v, out


def test_the_native_step_node_equals_the_torch_step_with_a_policy_and_learnable_parameters():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(9 + 8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 2)).to(F64)
    got = {}
    for mode in ("auto", "never"):
        kp = torch.tensor(40.0, dtype=F64, requires_grad=True)
        mu = torch.tensor(0.6, dtype=F64, requires_grad=True)
        scene = make_scene(kp, mu)
        robot = scene.models["hopper"]
        robot.make_link_param_learnable("left", "mass")
        robot.make_link_param_learnable("right", "damping")  # of the joint whose child is "right"
        q, v = start_state(scene)
        # "build": the stepper's reverse mode for the learnable fields (inertial and damping) is built once
        with kernels.native_mode("build" if mode == "auto" else mode):
            q1, v1, routes = _policy_loop(scene, q, v, net, 40, 2e-3)
            loss = (q1[:, 0] + 2 * q1[:, 2] + q1[:, 7]).sum() + v1[:, 6].square().sum()
            params = [*net.parameters(), kp, mu, *[p for p in robot.parameters() if p.requires_grad]]
            grads = torch.autograd.grad(loss, params)
        assert set(routes) == ({"native"} if mode == "auto" else {"torch: native kernels off (DIFFMECH_NATIVE=never)"})
        got[mode] = (q1.detach(), grads)
    torch.testing.assert_close(got["auto"][0], got["never"][0], rtol=0, atol=1e-10)
    for a, b in zip(got["auto"][1], got["never"][1]):
        assert float(b.abs().max()) > 0
        torch.testing.assert_close(a, b, rtol=1e-7, atol=1e-12)


def test_the_native_step_node_against_central_differences():
    """Feet resting on the ground (a fixed contact set, the map smooth): 25 steps of contact_step, the
    gradient w.r.t. a link mass, the friction and a torque against central differences at two step sizes."""
    scene = make_scene(friction=torch.tensor(0.6, dtype=F64, requires_grad=True))
    scene.tol, scene.iterations = 1e-14, 3000
    robot = scene.models["hopper"]
    robot.make_link_param_learnable("body", "mass")
    assert prepare_ground_kernels(scene, parameters=True)
    q0 = scene.neutral_configuration()[None].clone()
    q0[:, 2] = 0.228
    v0 = torch.zeros(1, scene.nv, dtype=F64)
    v0[:, 0] = 0.05
    tau = (0.2 * torch.randn(1, 25, scene.nv, generator=torch.Generator().manual_seed(3), dtype=F64))
    tau.requires_grad_(True)
    (mass,) = [p for p in robot.parameters() if p.requires_grad]
    mu = scene.friction

    def loss():
        q, v, warm = q0, v0, {}
        for k in range(25):
            info: dict = {}
            q, v = contact_step(scene, q, v, tau[:, k], 2e-3, info=info, warm=warm)
            warm = info["lam"]
            assert info["route"] == "native"
        return (q[:, 0] + 3 * q[:, 2] + q[:, 7] + v[:, 6]).sum()

    with kernels.native_mode("build"):
        g_tau, g_mass, g_mu = torch.autograd.grad(loss(), [tau, mass, mu])
        for x, idx, g in ((tau, (0, 3, 6), g_tau[0, 3, 6]), (tau, (0, 12, 7), g_tau[0, 12, 7]), (mass, (), g_mass),
                          (mu, (), g_mu)):
            fd = []
            for h in (1e-5, 1e-6):
                with torch.no_grad():
                    x[idx] += h
                    up = float(loss())
                    x[idx] -= 2 * h
                    down = float(loss())
                    x[idx] += h
                fd.append((up - down) / (2 * h))
            assert fd[0] == pytest.approx(fd[1], rel=1e-4, abs=1e-9)  # smooth there
            assert float(g) == pytest.approx(fd[0], rel=1e-4, abs=1e-8), (idx, float(g), fd)


def test_the_default_checkpoint_spacing_keeps_memory_flat(monkeypatch):
    """``checkpoint_every=None``: every state's warm start is kept until they outgrow the budget, then the
    spacing doubles; the kept bytes stay under the budget whatever the horizon, and the gradient is the
    one with every state kept (the recomputation repeats the forward pass bit for bit)."""
    import importlib

    cr = importlib.import_module("diffmech.sim.contact_rollout")
    box = diffmech.model.systems.box((0.2, 0.2, 0.2), 1.0, name="box")
    scene = Scene([box], friction=0.4)
    q0 = scene.neutral_configuration().clone()
    q0[2] = 0.1
    v0 = torch.zeros(scene.nv, dtype=F64)
    v0[0] = 1.0
    monkeypatch.setattr(cr, "CHECKPOINT_BUDGET", 4096)
    kept, spacing, grads = {}, {}, {}
    for T in (100, 400):
        for every in (None, 1):
            tau = torch.zeros(T, scene.nv, dtype=F64, requires_grad=True)
            stats: dict = {}
            qs, _ = rollout(scene, q0, v0, tau, 1e-3, checkpoint_every=every, stats=stats)
            qs[-1, 0].backward()
            kept[T, every], spacing[T, every], grads[T, every] = stats["saved_state_bytes"], stats[
                "checkpoint_every"], tau.grad
        assert torch.equal(grads[T, None], grads[T, 1])
    assert spacing[100, None] > 1 and spacing[400, None] > spacing[100, None]
    warm = {T: kept[T, None] - (T // spacing[T, None] + 2) * (scene.nq + scene.nv) * 8 for T in (100, 400)}
    assert all(0 < w <= 4096 + 512 for w in warm.values()), warm  # the warm starts (one past the budget at most)
    assert kept[400, 1] > 4 * kept[400, None]


@pytest.mark.parametrize("dt", [0.0, -1e-3, float("nan"), float("inf")])
def test_a_scene_rollout_refuses_a_bad_time_step(dt):
    from diffmech.errors import ShapeError

    scene = Scene([diffmech.model.systems.sphere(0.05, 0.2, name="ball")])
    q0 = scene.neutral_configuration().clone()
    q0[2] = 0.05
    with pytest.raises(ShapeError, match="dt must be a positive finite number"):
        rollout(scene, q0, torch.zeros(scene.nv, dtype=F64), torch.zeros(3, scene.nv, dtype=F64), dt)
