"""Every scene feature the native contact route serves, through both routes: the rollout's trajectory
and the gradient of a loss w.r.t. each kind of learnable input -- link inertials, joint placements,
damping, springs, drive gains, friction, restitution, shape sizes, torques, the initial state --
on the native route (checkpointed, C reverse) and on the torch route (DIFFMECH_NATIVE=never), for both
adjoints where they differ. float64, the hopper of ``hopper_scene`` (a floating body, two legs with
sphere feet, a capsule on its back, drives, a joint limit that is hit), two environments (one lands on
its feet, one on its back)."""

from __future__ import annotations

import pytest
import torch

from diffmech.dynamics import kernels
from diffmech.sim import prepare_ground_kernels, rollout
from hopper_scene import make_scene, start_state

F64 = torch.float64
T, DT = 60, 2e-3

# (name, how to make it learnable on a fresh scene): each returns the scene and the tensors to differentiate
LINK = {"mass": "left", "com": "body", "inertia": "body", "origin_xyz": "right", "origin_rpy": "left",
        "damping": "right", "stiffness": "left", "rest": "left"}


def _scene(kind):
    kp = torch.tensor(40.0, dtype=F64, requires_grad=kind == "drive stiffness")
    mu = torch.tensor(0.6, dtype=F64, requires_grad=kind == "friction")
    e = torch.tensor(0.3, dtype=F64, requires_grad=kind == "restitution")
    r = torch.tensor(0.03, dtype=F64, requires_grad=True) if kind == "sphere radius" else None
    scene = make_scene(kp, mu, radius=r, restitution=e)
    robot = scene.models["hopper"]
    wrt = [t for t in (kp, mu, e, r) if t is not None and t.requires_grad]
    if kind == "rest":  # a spring's rest position matters only where the joint has a spring
        robot.make_link_param_learnable(LINK[kind], "stiffness")
        with torch.no_grad():
            for p in robot.parameters():
                if p.requires_grad:
                    p.fill_(5.0)
    if kind in LINK:
        robot.make_link_param_learnable(LINK[kind], kind)
        wrt += [p for p in robot.parameters() if p.requires_grad]
    return scene, wrt


KINDS = [*LINK, "drive stiffness", "friction", "restitution", "sphere radius", "state and torques"]


def _run(kind, mode, adjoint):
    scene, wrt = _scene(kind)
    q0, v0 = start_state(scene)
    g = torch.Generator().manual_seed(1)
    tau = 0.5 * torch.randn(2, T, scene.nv, generator=g, dtype=F64)
    tau[..., :6] = 0.0
    if kind == "state and torques":
        v0 = v0.clone().requires_grad_(True)
        tau.requires_grad_(True)
        wrt = [v0, tau]
    stats: dict = {}
    with kernels.native_mode(mode):
        Q, V = rollout(scene, q0, v0, tau, DT, adjoint=adjoint, stats=stats)
        loss = (Q[:, -1, 2] + 0.3 * Q[:, -1, 0] + Q[:, T // 2, 7]).sum() + 0.1 * V[:, -1, 6].square().sum()
        grads = torch.autograd.grad(loss, wrt)
    return stats["route"], Q.detach(), grads


@pytest.fixture(scope="module")
def kernels_built():
    for kind in ("mass", "damping"):  # the inertial and the damping reverse modes besides the state's
        scene, _ = _scene(kind)
        assert prepare_ground_kernels(scene, parameters=True)
    return True


@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_native_and_torch_routes_agree(kind, kernels_built):
    route_n, Qn, gn = _run(kind, "build", "checkpoint")
    route_t, Qt, gt = _run(kind, "never", "checkpoint")
    assert route_n == "native" and route_t.startswith("torch")
    # measured: trajectories equal to 1.1e-16, gradients to 2.6e-15 of their largest entry (every kind)
    torch.testing.assert_close(Qn, Qt, rtol=0, atol=1e-13)
    for a, b in zip(gn, gt):
        assert float(b.abs().max()) > 0, f"{kind}: the torch route's gradient is zero"
        scale = float(b.abs().max())
        assert float((a - b).abs().max()) <= 1e-12 * scale, (kind, float((a - b).abs().max()), scale)
    # the autograd adjoint (the torch route, the graph of every step) agrees with both
    _, Qa, ga = _run(kind, "build", "autograd")
    torch.testing.assert_close(Qa, Qt, rtol=0, atol=1e-13)
    for a, b in zip(ga, gt):
        assert float((a - b).abs().max()) <= 1e-12 * float(b.abs().max()), kind
