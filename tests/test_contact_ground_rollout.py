"""The checkpointed rollout's own steps for one robot on the ground (``diffmech.sim._ground_rollout``):
the steps and their reverse written on the native kernels without autograd, against the same rollout
stepped by ``contact_step`` (the native route and the torch code) -- trajectories bit for bit,
gradients w.r.t. torques, initial state, drive gains, friction, restitution and a foot's radius --
and against central finite differences. float64 unless said."""

from __future__ import annotations

import importlib

import pytest
import torch

from diffmech.dynamics import kernels
from diffmech.dynamics.kernel_store import available
from diffmech.sim import _ground_rollout as gr
from diffmech.sim import prepare_ground_kernels, rollout
from hopper_scene import make_scene, start_state

cs = importlib.import_module("diffmech.sim.contact_step")
rt = importlib.import_module("diffmech.sim.route")
cr = importlib.import_module("diffmech.sim.contact_rollout")
F64 = torch.float64

pytestmark = pytest.mark.skipif(not available(), reason="no C compiler")


@pytest.fixture(params=["driver", "python"])
def driver(request, monkeypatch):
    """The stepper's two implementations: its C driver (``diffmech.sim._ground_driver``), and the Python
    on the kernels' buffers that stands in where the driver hands a step back."""
    if request.param == "python":
        monkeypatch.setattr(gr.GroundStepper, "_driver", lambda self: None)
    return request.param


def _loss(qs, vs):
    return (qs[:, -1, 0] + 2 * qs[:, -1, 2] + qs[:, -1, 7]).sum() + (vs[:, -1, 0] ** 2).sum() + vs[:, 5, 7].sum()


def _rollout(route: str, T: int, dt: float, *, checkpoint_every: int = 1, q=None, v=None, dtype=F64, tol=None):
    """Roll out the hopper under ``route``: "stepper" (this module's), "native" (contact_step's native
    route) or "torch" (contact_step's torch code); returns the trajectory, the gradients and the steps'
    contact sets (stepper only)."""
    leaves = {k: torch.tensor(x, dtype=dtype, requires_grad=True)
              for k, x in (("kp", 40.0), ("mu", 0.6), ("e", 0.3), ("r", 0.03))}
    scene = make_scene(leaves["kp"], leaves["mu"], leaves["r"], leaves["e"])
    if dtype != F64:
        scene = scene.to(dtype)
    if tol is not None:
        scene.tol = tol
    assert prepare_ground_kernels(scene, dtypes=(dtype,))
    q0, v0 = start_state(make_scene()) if q is None else (q, v)
    q0, v0 = q0.to(dtype).requires_grad_(), v0.to(dtype).requires_grad_()
    tau = torch.zeros(q0.shape[0], T, scene.nv, dtype=dtype)
    tau[:, :, 6:] = 0.3
    tau.requires_grad_(True)
    sets, vjps = [], []
    with kernels.native_mode("auto"), pytest.MonkeyPatch.context() as mp:
        if route != "stepper":
            mp.setattr(rt, "ground_stepper", lambda *a, **k: None)
        if route == "torch":
            mp.setattr(rt, "ground_plan", lambda *a, **k: None)
        step, vjp = gr.GroundStepper.step, gr.GroundStepper.vjp

        def spy_step(self, *a, **k):
            out = step(self, *a, **k)
            sets.append(tuple(a[5]["lam"].slots.tolist()))
            return out

        def spy_vjp(self, *a, **k):
            vjps.append(1)
            return vjp(self, *a, **k)

        mp.setattr(gr.GroundStepper, "step", spy_step)
        mp.setattr(gr.GroundStepper, "vjp", spy_vjp)
        stats: dict = {}
        qs, vs = rollout(scene, q0, v0, tau, dt, checkpoint_every=checkpoint_every, stats=stats)
        _loss(qs, vs).backward()
    grads = {"tau": tau.grad, "q0": q0.grad, "v0": v0.grad, **{k: t.grad for k, t in leaves.items()}}
    assert (len(vjps) == T) == (route == "stepper")
    return qs.detach(), vs.detach(), grads, sets, stats


def test_stepper_equals_contact_step_and_the_torch_code(driver):
    T, dt = 150, 2e-3
    qa, va, ga, sets, sa = _rollout("stepper", T, dt)
    qb, vb, gb, _, sb = _rollout("native", T, dt)
    qc, vc, gc, _, _ = _rollout("torch", T, dt)
    # what the trajectory goes through: feet landing, the capsule landing upside down, a joint limit
    nb = 4  # two feet, the capsule's two end balls
    slots = set().union(*map(set, sets))
    assert len(set(sets)) > 3 and any(s >= nb for s in slots) and {2, 3} & slots
    assert torch.equal(qa, qb) and torch.equal(va, vb)  # the same operations: the same steps, bit for bit
    assert sa.pop("route") == "native" and sb.pop("route") == "torch: scene"  # (the stepper patched away)
    assert sa == sb
    torch.testing.assert_close(qa, qc, rtol=0, atol=1e-10)
    for name in ga:
        assert ga[name] is not None and torch.isfinite(ga[name]).all() and float(ga[name].abs().max()) > 0, name
        for other, tol in ((gb, 1e-10), (gc, 1e-9)):
            err = float((ga[name] - other[name]).abs().max() / other[name].abs().max())
            assert err < tol, (name, err)


def test_stepper_segments_equal_dense_checkpoints():
    T, dt = 60, 2e-3
    qa, _, ga, _, _ = _rollout("stepper", T, dt)
    qb, _, gb, _, st = _rollout("stepper", T, dt, checkpoint_every=7)
    assert st["checkpoint_every"] == 7 and torch.equal(qa, qb)
    for name in ga:
        assert torch.equal(ga[name], gb[name]), name


def test_stepper_large_rotation_takes_the_torch_position_update(driver):
    """A base turning more than a radian in a step: the position update's series does not apply, the
    torch function (and its autograd) stand in, in both routes."""
    q, v = start_state(make_scene(), B=1)
    q[:, 2] = 0.6
    v[:, 3:6] = torch.tensor([400.0, 300.0, 0.0], dtype=F64)  # 0.5 rad per 1e-3 s; 1 rad per 2e-3 s
    qa, _, ga, _, _ = _rollout("stepper", 6, 2e-3, q=q, v=v)
    qb, _, gb, _, _ = _rollout("native", 6, 2e-3, q=q, v=v)
    assert torch.equal(qa, qb)
    for name in ("tau", "q0", "v0"):
        torch.testing.assert_close(ga[name], gb[name], rtol=1e-10, atol=1e-12)


def test_stepper_gradient_against_finite_differences(driver):
    """Feet resting on the ground (a fixed contact set): the gradient w.r.t. torques, the initial state and
    the drives' stiffness against central differences."""
    scene = make_scene()
    scene.iterations, scene.tol = 3000, 1e-14  # the solution the implicit gradient assumes
    assert prepare_ground_kernels(scene)
    q0 = scene.neutral_configuration()[None].clone()
    q0[:, 2] = 0.228  # the feet 2 mm into the ground (gaps away from zero, where the targets have a kink)
    v0 = torch.zeros(1, scene.nv, dtype=F64)
    v0[:, 0] = 0.05
    T, dt = 25, 2e-3

    def f(tau, q0, v0, kp):
        scene.drives["hopper"] = (kp.expand(2),) + scene.drives["hopper"][1:]
        qs, vs = rollout(scene, q0, v0, tau, dt)
        return (qs[:, -1, 0] + 3 * qs[:, -1, 2] + qs[:, -1, 7] + vs[:, -1, 6]).sum()

    gen = torch.Generator().manual_seed(3)
    tau = (0.2 * torch.randn(1, T, scene.nv, generator=gen, dtype=F64)).requires_grad_()
    kp = torch.tensor(40.0, dtype=F64, requires_grad=True)
    with kernels.native_mode("auto"):
        used: list = []
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(rt, "ground_stepper", _recording(used))
            f(tau, q0.requires_grad_(), v0.requires_grad_(), kp).backward()
        assert used and used[0] is not None
        eps = 1e-6
        checks = [(tau, (0, 0, 6)), (tau, (0, 10, 7)), (tau, (0, 20, 2)), (q0, (0, 2)), (q0, (0, 7)), (v0, (0, 0)),
                  (v0, (0, 7)), (kp, ())]
        with torch.no_grad():
            for x, idx in checks:
                args = {"tau": tau, "q0": q0, "v0": v0, "kp": kp}
                name = [k for k, t in args.items() if t is x][0]
                plus, minus = x.detach().clone(), x.detach().clone()
                plus[idx] += eps
                minus[idx] -= eps
                fd = (f(**{**args, name: plus}) - f(**{**args, name: minus})) / (2 * eps)
                torch.testing.assert_close(x.grad[idx], fd, rtol=1e-4, atol=1e-8, msg=(name, idx))


def test_stepper_float32(driver):
    """float32 against float64 at one tolerance, float32's (64 ulps: 7.6e-6): a tighter float64 solve may
    take a contact at the stick-slip boundary to the other side, where the gradient jumps (of mu: 100 %)."""
    T, dt = 100, 2e-3
    q, v = start_state(make_scene())
    qa, _, ga, _, _ = _rollout("stepper", T, dt, q=q, v=v, dtype=torch.float32, tol=1e-5)
    qb, _, gb, _, _ = _rollout("stepper", T, dt, q=q, v=v, tol=1e-5)
    assert qa.dtype == torch.float32 and float((qa.double() - qb).abs().max()) < 1e-4
    # measured: tau 6e-6, kp 8e-6, mu 2.3e-2 (the friction's gradient comes from the sliding steps only, whose
    # slip directions float32's solve resolves to its tolerance)
    for name, tol in (("tau", 5e-3), ("kp", 5e-3), ("mu", 5e-2)):
        err = float((ga[name].double() - gb[name]).abs().max() / gb[name].abs().max())
        assert err < tol, (name, err)


def test_stepper_only_where_it_applies():
    """The stepper serves policies and learnable robot parameters too; native kernels off, a joint limit
    that requires grad or a scene it does not serve leave it, with the reason."""
    scene = make_scene()
    assert prepare_ground_kernels(scene, parameters=True)
    q, _ = start_state(scene)
    with kernels.native_mode("auto"):
        assert isinstance(gr.ground_stepper(scene, q, 1e-3), gr.GroundStepper)
        why = []
        with kernels.native_mode("never"):
            assert gr.ground_stepper(scene, q, 1e-3, why) is None
        assert why == ["native kernels off (DIFFMECH_NATIVE=never)"]
        scene.models["hopper"].make_link_param_learnable("left", "mass")
        stepper = gr.ground_stepper(scene, q, 1e-3)
        assert isinstance(stepper, gr.GroundStepper) and stepper.fields  # the inertial fields' reverse mode
        why = []
        assert gr.ground_stepper(scene.to(torch.float32), q.float(), 1e-3, why) is None
        assert why == ["learnable parameters: kernels not built (set_native('build') or `diffmech kernels build`)"]


def test_driver_steps_handed_back_to_the_python():
    """The driver hands a step's reverse back (a rank-deficient contact problem, here every third step by
    hand): the Python computes it, and the gradient is the driver's."""
    T, dt = 80, 2e-3
    _, _, want, _, _ = _rollout("stepper", T, dt)
    calls = []
    real = gr.GroundStepper._driver

    def handing_back(self):
        fns = real(self)
        if fns is None:
            return None

        def backward(*args):
            calls.append(1)
            return 2 if len(calls) % 3 == 0 else fns[1](*args)

        return fns[0], backward

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gr.GroundStepper, "_driver", handing_back)
        _, _, got, _, _ = _rollout("stepper", T, dt)
    assert len(calls) == T
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-12, atol=1e-15)


def _recording(made: list):
    """``ground_stepper`` that appends what it returns to ``made``."""
    real = gr.ground_stepper

    def make(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    return make


def test_fixed_base_robot():
    """A fixed base (the hopper's body held 22.8 cm up, its feet swung into the ground): no position-update
    kernel, the joints' update by the robot's ``integrate``; the same rollout and gradient as contact_step's."""
    import diffmech
    from diffmech.sim import Scene
    from hopper_scene import URDF

    urdf = URDF.replace('<robot name="hopper">', '<robot name="hopper"><link name="world"/><joint name="lift" '
                        'type="fixed"><parent link="world"/><child link="body"/><origin xyz="0 0 0.228"/></joint>')
    out = {}
    for route in ("stepper", "native"):
        robot = diffmech.load_urdf(urdf)
        kp = torch.tensor(5.0, dtype=F64, requires_grad=True)
        scene = Scene([robot], friction=0.5, drives={"hopper": {"stiffness": kp, "damping": 0.5}})
        assert prepare_ground_kernels(scene)
        q0 = torch.tensor([[-0.3, 0.3]], dtype=F64)  # the feet 8 mm up, swinging down into the ground
        v0 = torch.tensor([[4.0, -4.0]], dtype=F64)
        tau = torch.zeros(1, 60, 2, dtype=F64, requires_grad=True)
        used = []
        with kernels.native_mode("auto"), pytest.MonkeyPatch.context() as mp:
            mp.setattr(rt, "ground_stepper", _recording(used) if route == "stepper" else (lambda *a, **k: None))
            stats: dict = {}
            with pytest.warns(RuntimeWarning, match="contact solve stopped short"):
                qs, vs = rollout(scene, q0, v0, tau, 2e-3, stats=stats)
            (qs[:, -1].sum() + vs[:, -1, 0]).backward()
        if route == "stepper":
            assert used[0] is not None and used[0].driver is None  # a fixed base: the Python steps
        assert stats["contact_candidates_max"] >= 2
        # a leg with one joint pressed into the ground while its foot slides: no impulses meet the contact
        # conditions (normal and tangential rows of a foot are collinear), and the solve says so
        assert stats["contact_unconverged"] > 0 and stats["contact_violation_max"] > 1e-4
        out[route] = (qs.detach(), tau.grad, kp.grad)
    assert torch.equal(out["stepper"][0], out["native"][0])
    for a, b in zip(out["stepper"][1:], out["native"][1:]):
        assert float(b.abs().max()) > 0
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-14)


def test_non_finite_gradient_names_the_step(driver):
    from diffmech.errors import SimulationError

    scene = make_scene()
    assert prepare_ground_kernels(scene)
    q, v = start_state(scene)
    tau = torch.zeros(2, 20, scene.nv, dtype=F64, requires_grad=True)
    with kernels.native_mode("auto"):
        qs, _ = rollout(scene, q, v, tau, 2e-3)
        with pytest.raises(SimulationError, match="non-finite gradient at step 19"):
            (qs[:, -1, 0] * float("nan")).sum().backward()
