"""The same code on a CUDA device as on the CPU.

Each part of the library (rollouts and their adjoint, contact scenes, the learned-dynamics models,
eigenmodes, reinforcement learning, inverse kinematics, the command lines) runs once on the CPU and
once on the GPU in float64 from the same inputs; the results and gradients must agree to rounding
(the CPU results are checked against Pinocchio, MuJoCo, finite differences and analytic answers in
the other test files). Every output must live on the device: a tensor left behind on the CPU is a
defect even where the numbers agree. Skipped without CUDA.
"""

from __future__ import annotations

import copy
import json
import os

import pytest
import torch

from diffmech.model import systems
from diffmech.sim import Scene, rollout

# DIFFMECH_TEST_DEVICE=cpu runs the file against the CPU itself (a check of the tests' own code on a
# machine without a GPU; the comparisons are then trivial)
GPU = torch.device(os.environ.get("DIFFMECH_TEST_DEVICE", "cuda"))
pytestmark = pytest.mark.skipif(GPU.type == "cuda" and not torch.cuda.is_available(), reason="needs CUDA")

F64 = torch.float64


def _close(gpu, cpu, tol=1e-9, what=""):
    assert gpu.device.type == GPU.type, f"{what}: on {gpu.device}"
    torch.testing.assert_close(gpu.cpu(), cpu, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")


def _grads(loss_fn, leaves):
    loss = loss_fn()
    return loss, torch.autograd.grad(loss, leaves)


# ---------------------------------------------------------------- rollouts of a robot (no contact)
@pytest.mark.parametrize("adjoint", ["checkpoint", "autograd"])
def test_rollout_and_adjoint(adjoint):
    from test_rollout import two_link_arm

    out = {}
    for dev in ("cpu", GPU):
        arm = two_link_arm().to(dev)
        arm.make_link_param_learnable("fore", "mass")
        g = torch.Generator().manual_seed(0)
        tau = (0.5 * torch.randn(80, 2, generator=g, dtype=F64)).to(dev).requires_grad_(True)
        q0 = torch.tensor([0.3, -0.2], dtype=F64, device=str(dev))
        v0 = torch.zeros(2, dtype=F64, device=str(dev))
        Q, V = rollout(arm, q0, v0, tau, 0.01, adjoint=adjoint)
        loss = Q[-1].square().sum() + 0.1 * V.square().mean()
        mass = arm.link_params("fore").mass
        out[dev] = (Q.detach(), *torch.autograd.grad(loss, [tau, mass]))
    for name, a, b in zip(("Q", "dtau", "dmass"), out[GPU], out["cpu"]):
        _close(a, b, what=name)


# ---------------------------------------------------------------- contact scenes
def _pile():
    return Scene([systems.sphere(0.05, 0.5, name="ball"), systems.box((0.2, 0.2, 0.1), 1.0, name="box"),
                  systems.capsule(0.03, 0.2, 0.3, name="rod")], friction=0.6, restitution=0.2)


def _pile_state(scene, dev):
    q = scene.neutral_configuration().clone()
    q[scene.slices["ball"]][:3] = torch.tensor([0.02, 0.01, 0.25], dtype=F64, device=str(dev))
    q[scene.slices["box"]][:3] = torch.tensor([0.0, 0.0, 0.06], dtype=F64, device=str(dev))
    q[scene.slices["rod"]][:3] = torch.tensor([0.3, 0.0, 0.14], dtype=F64, device=str(dev))
    v = torch.zeros(scene.nv, dtype=F64, device=str(dev))
    v[scene.slices["rod"]][:1] = 0.5  # sliding: friction matters
    return q, v


@pytest.mark.parametrize("route", ["built-on-device", "moved-with-to"])
@pytest.mark.parametrize("solver", ["pgs", "smooth"])
def test_contact_scene_rollout_and_gradients(route, solver):
    out = {}
    for dev in ("cpu", GPU):
        scene = _pile()
        scene.solver = solver
        if dev == GPU:
            if route == "moved-with-to":
                scene = scene.to(dev)
            else:
                scene = Scene([m.to(dev) for m in _pile().models.values()], friction=0.6, restitution=0.2)
                scene.solver = solver
        assert scene.device.type == torch.device(dev).type
        mu = torch.tensor(0.6, dtype=F64, device=dev, requires_grad=True)
        scene.friction = mu
        q0, v0 = _pile_state(scene, dev)
        v0.requires_grad_(True)
        st: dict = {}
        Q, V = rollout(scene, q0, v0, torch.zeros(150, scene.nv, dtype=F64, device=str(dev)), 2e-3, stats=st)
        loss = Q[-1, scene.slices["rod"]][0] + Q[-1, scene.slices["ball"]][:3].square().sum()
        out[dev] = (Q.detach(), *torch.autograd.grad(loss, [mu, v0]))
        assert st["contact_penetration_max"] < 5e-3
    for name, a, b in zip(("Q", "dmu", "dv0"), out[GPU], out["cpu"]):
        _close(a, b, tol=1e-8, what=f"{solver}/{route} {name}")


def test_laikago_batch_checkpointed_gradient():
    from diffmech.sim import scenes

    pytest.importorskip("pybullet_data")
    out = {}
    for dev in ("cpu", GPU):
        scene, q0, v0 = scenes.laikago(2)
        scene, q0, v0 = scene.to(dev), q0.to(dev), v0.to(dev)
        q0 = q0.expand(3, -1).clone()  # three independent worlds of two robots
        v0 = v0.expand(3, -1).clone()
        tau = torch.zeros(3, 40, scene.nv, dtype=F64, device=dev, requires_grad=True)
        st: dict = {}
        Q, V = rollout(scene, q0, v0, tau, 1e-3, checkpoint_every=10, stats=st)
        loss = Q[:, -1, 2].sum() + V[:, -1].square().sum()
        out[dev] = (Q.detach(), torch.autograd.grad(loss, tau)[0])
        assert st["checkpoint_every"] == 10
    _close(out[GPU][0], out["cpu"][0], tol=1e-8, what="Q")
    _close(out[GPU][1], out["cpu"][1], tol=1e-7, what="dtau")


# ---------------------------------------------------------------- learned dynamics
@pytest.mark.parametrize("name", ["node-rk4", "lnode-midpoint", "symo", "e2e-symo"])
def test_learned_models_objective_and_gradients(name):
    from diffmech.learn import build_model
    from test_learn_models import _batch

    torch.manual_seed(0)
    cpu = build_model(name, (True, True), 0.1, width=32).double()
    gpu = copy.deepcopy(cpu).to(GPU)
    b = _batch(2, B=8)
    lc, _ = cpu.objective(b)
    lg, _ = gpu.objective(b.to(device=GPU))
    _close(lg.detach(), lc.detach(), what=f"{name} loss")
    gc = torch.autograd.grad(lc, list(cpu.parameters()), allow_unused=True)
    gg = torch.autograd.grad(lg, list(gpu.parameters()), allow_unused=True)
    for a, c in zip(gg, gc):
        if c is not None:
            _close(a, c, tol=1e-8, what=f"{name} grad")
    q0 = b.q_prev
    u = torch.zeros(8, 12, 2, dtype=F64)
    rc = cpu.rollout(q0, b.q, b.v, u, 10)
    rg = gpu.rollout(q0.to(GPU), b.q.to(GPU), b.v.to(GPU), u.to(GPU), 10)
    _close(rg.q, rc.q, tol=1e-8, what=f"{name} rollout")


def test_symo_train_command_on_cuda(tmp_path):
    from diffmech.cli import main

    out = tmp_path / "run"
    main(["symo", "train", "--system", "pendulum", "--model", "e2e-symo", "--n-ics", "8", "--epochs", "3",
          "--device", str(GPU), "--dtype", "float64", "--n-int", "2", "--int-steps", "20", "--out", str(out),
          "--no-progress"])
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics


# ---------------------------------------------------------------- eigenmodes
def test_eigenmode_flow_and_training_step():
    from diffmech.control.configs import get_config
    from diffmech.control.eigenmodes import EigenmodeTrainer

    res = {}
    for dev in ("cpu", GPU):
        cfg = get_config("tiny", dtype="float64", grid_points=20, samples=100, device=str(dev), native=False)
        tr = EigenmodeTrainer(cfg)
        assert tr.system.device.type == torch.device(dev).type == tr.period.device.type
        L = tr.step(0)
        L2 = tr.step(1)
        res[dev] = (tr.flow(grad=False).X, L.total.detach(), L2.total.detach(),
                    torch.cat([p.detach().reshape(-1) for p in tr.system.potential.parameters()]))
    for name, a, b in zip(("X", "loss0", "loss1", "params"), res[GPU], res["cpu"]):
        _close(a, b, tol=1e-8, what=name)


def test_eigen_learn_command_on_cuda(tmp_path):
    from diffmech.cli import main

    out = tmp_path / "eig"
    main(["eigenmode", "learn", "--config", "tiny", "--epochs", "2", "--device", str(GPU), "--dtype", "float64",
          "--out", str(out), "--no-plots", "--no-progress"])
    assert (out / "checkpoint.pt").exists()


# ---------------------------------------------------------------- reinforcement learning
def test_ant_env_steps_and_gradients():
    from diffmech.rl import Ant

    res = {}
    for dev in ("cpu", GPU):
        env = Ant(3, reset_noise=0.05, seed=0, device=str(dev))
        env.reset()
        g = torch.Generator().manual_seed(1)
        a = (0.5 * torch.randn(3, 8, generator=g, dtype=F64)).to(dev).requires_grad_(True)
        r1 = env.step(a)
        r2 = env.step(a.detach() * 0.5)
        assert r1.obs.device.type == torch.device(dev).type == r2.reward.device.type
        da = torch.autograd.grad(r1.reward.sum(), a)[0]
        res[dev] = (r2.obs.detach(), r2.reward.detach(), da)
    for name, x, y in zip(("obs", "reward", "dreward/da"), res[GPU], res["cpu"]):
        _close(x, y, tol=1e-7, what=name)


@pytest.mark.parametrize("algo", ["shac", "sample-enhanced-sac"])
def test_rl_train_command_on_cuda(tmp_path, algo):
    from diffmech.cli import main

    out = tmp_path / algo
    steps = "512" if algo == "shac" else "300"
    main(["rl", "train", "--env", "nlink-reach", "--algo", algo, "--steps", steps, "--seed", "0", "--out",
          str(out), "--device", str(GPU), "--evaluations", "2", "--eval-episodes", "1", "--no-progress"]
         + (["--set", "learning_starts=100", "--set", "batch_size=64"] if algo != "shac" else []))
    m = json.loads((out / "metrics.json").read_text())
    assert m["env_steps"] > 0


# ---------------------------------------------------------------- inverse kinematics, kernels
def test_inverse_kinematics_on_cuda():
    from conftest import get_robot
    from diffmech.ik import solve_ik

    robot = copy.deepcopy(get_robot("panda")).to(GPU)
    link = "panda_virtual_ee_link"
    q = robot.random_configuration(16, generator=torch.Generator(device=GPU).manual_seed(0))
    T = robot.link_pose(q, link)
    res = solve_ik(robot, link, T, generator=torch.Generator(device=GPU).manual_seed(1))
    assert res.q.device.type == GPU.type
    assert bool(res.converged.all())
    assert float(res.position_error.max()) < 1e-4


def test_kernels_prepare_leaves_cuda_models_on_torch():
    """The native kernels are CPU code: a CUDA model must keep running (and agree) with them prepared."""
    from conftest import get_robot
    from diffmech.dynamics import kernels

    cpu = get_robot("iiwa")
    gpu = copy.deepcopy(cpu).to(GPU)
    kernels.prepare(gpu, algorithms=("inverse_dynamics", "mass_matrix"))
    g = torch.Generator().manual_seed(3)
    q = torch.randn(5, cpu.nq, generator=g, dtype=F64)
    v = torch.randn(5, cpu.nv, generator=g, dtype=F64)
    _close(gpu.mass_matrix(q.to(GPU)), cpu.mass_matrix(q), what="M")
    _close(gpu.bias_forces(q.to(GPU), v.to(GPU)), cpu.bias_forces(q, v), what="h")
