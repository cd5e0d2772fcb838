"""Native kernels (lane programs compiled to C): values, gradients w.r.t. the state and the learnable
parameters, external forces, the default path of the public functions, the kernel store keyed by
structure, and what happens without a C compiler. The torch implementation is the reference here
(itself checked against Pinocchio in test_oracle_pinocchio.py and test_implementations.py)."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
import textwrap
import time

import pytest
import torch

import diffmech
from conftest import get_robot, random_state, robot_path
from diffmech.dynamics import compiled, kernels, native
from diffmech.model import systems
from diffmech.model.params import PositiveScalar, make_link_inertial_learnable

needs_cc = pytest.mark.skipif(not native.available(), reason="no C compiler for native kernels")
pytestmark = needs_cc
F64 = torch.float64
ALGS = ["forward_dynamics", "inverse_dynamics", "mass_matrix"]


def rel_err(got, want):
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-300))


def small_robots():
    """A chain with damping and springs, a branching tree, and the tree on a floating base."""
    chain = systems.n_link_pendulum(3, damping=(0.3, 0.1, 0.2), stiffness=(2.0, 0.0, 5.0), rest=(0.1, -0.2, 0.3))
    tree = diffmech.load_urdf(robot_path("branching_tree"))
    free = diffmech.load_urdf(robot_path("floating_pair"), floating_base=True)
    return {"chain": chain, "tree": tree, "free": free}


@pytest.fixture(scope="module")
def robots():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return small_robots()


def _args(robot, algorithm, B, seed, f_ext=False):
    q, v, a, f = random_state(robot, (B,), seed=seed)
    if algorithm == "mass_matrix":
        return (q,)
    return (q, v, a, f) if f_ext else (q, v, a)


def _torch(robot, algorithm, args, passive=True):
    with kernels.native_mode("never"):
        if algorithm == "mass_matrix":
            return robot.mass_matrix(*args)
        f = args[3] if len(args) == 4 else None
        fn = robot.forward_dynamics if algorithm == "forward_dynamics" else robot.inverse_dynamics
        return fn(*args[:3], f_ext=f, passive=passive)


@pytest.mark.parametrize("name", ["chain", "tree", "free"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_values_match_the_torch_code(robots, name, algorithm):
    robot = robots[name]
    f = compiled(robot, algorithm)
    for B in (1, 37):  # 37: two full tiles of 16 and a tail
        args = _args(robot, algorithm, B, seed=B)
        with torch.no_grad():
            got = f(*args)
        want = _torch(robot, algorithm, args)
        assert got.shape == want.shape and got.dtype == F64
        assert rel_err(got, want) < 1e-11, (name, algorithm, B)
    assert f._call is not None  # the native path ran, not a fallback


@pytest.mark.parametrize("name", ["chain", "free"])
@pytest.mark.parametrize("algorithm", ["forward_dynamics", "inverse_dynamics"])
def test_external_forces_and_passive_terms(robots, name, algorithm):
    robot = robots[name]
    for passive in (True, False):
        args = _args(robot, algorithm, 19, seed=3, f_ext=True)
        with kernels.native_mode("build"):
            fn = robot.forward_dynamics if algorithm == "forward_dynamics" else robot.inverse_dynamics
            got = fn(*args[:3], f_ext=args[3], passive=passive)
        assert rel_err(got, _torch(robot, algorithm, args, passive)) < 1e-11


@pytest.mark.parametrize("name", ["chain", "free"])
@pytest.mark.parametrize("algorithm", ALGS)
def test_gradients_of_state_and_parameters(robots, name, algorithm):
    """The kernel of the reverse mode: state cotangents per state, parameter cotangents summed over
    the batch -- against autograd through the torch code."""
    robot = copy.deepcopy(robots[name])
    massive = [n for n in robot.link_names if float(robot.link_params(n).mass) > 0]
    make_link_inertial_learnable(robot, massive[-1])
    robot.make_link_param_learnable(massive[0], "mass", PositiveScalar())
    if name == "chain":
        robot.make_link_param_learnable("link2", "damping")
        robot.make_link_param_learnable("link3", "stiffness")
    params = list(robot.learnable_parameters().values())
    args = [t.clone().requires_grad_(True) for t in _args(robot, algorithm, 21, seed=5)]
    w = torch.randn(_torch(robot, algorithm, args).shape, dtype=F64, generator=torch.Generator().manual_seed(1))
    got = torch.autograd.grad((compiled(robot, algorithm)(*args) * w).sum(), args + params, allow_unused=True)
    want = torch.autograd.grad((_torch(robot, algorithm, args) * w).sum(), args + params, allow_unused=True)
    for k, (a, b) in enumerate(zip(got, want)):
        if b is None:  # the mass matrix does not depend on v, the torques or the passive terms
            assert a is None or not a.any(), (name, algorithm, k)
            continue
        assert rel_err(a, b) < 1e-10, (name, algorithm, k)


def _ran_native(fn, depth: int = 4) -> bool:
    """Whether a native kernel's node is among the first ``depth`` levels of a graph."""
    if fn is None or depth < 0:
        return False
    return "Native" in type(fn).__name__ or any(_ran_native(f, depth - 1) for f, _ in fn.next_functions)


@pytest.mark.parametrize("name", ["chain", "tree", "free"])
def test_poses_and_world_jacobians_by_the_kinematics_kernel(robots, name):
    """The contact step's kinematics (every link's pose, the world Jacobians of some links) by the
    ``kinematics`` kernel: values, and gradients w.r.t. the configuration and the learnable joint
    origins, against the torch code; world-fixed links (the chain's base) included."""
    from diffmech.dynamics.kinematics import poses_and_world_jacobians

    robot = copy.deepcopy(robots[name])
    joint_links = [n for n in robot.link_names if robot.tree.link_body[robot.tree.link(n)] >= 0]
    robot.make_link_param_learnable(joint_links[-1], "origin_xyz")
    robot.make_link_param_learnable(joint_links[-1], "origin_rpy")
    params = list(robot.learnable_parameters().values())
    links = [robot.link_names[0], *joint_links[-2:]]
    for B in (1, 21):
        q = random_state(robot, (B,), seed=B)[0].clone().requires_grad_(True)
        with kernels.native_mode("never"):
            T0, J0 = poses_and_world_jacobians(robot, q, links)
        with kernels.native_mode("build"):
            T1, J1 = poses_and_world_jacobians(robot, q, links)
        assert T1.shape == T0.shape == (B, robot.n_links, 4, 4) and J1.shape == J0.shape == (B, 3, 6, robot.nv)
        assert _ran_native(T1.grad_fn)
        assert rel_err(T1.detach(), T0.detach()) < 1e-12 and rel_err(J1.detach(), J0.detach()) < 1e-12
        gen = torch.Generator().manual_seed(B)
        wT, wJ = torch.randn(T0.shape, dtype=F64, generator=gen), torch.randn(J0.shape, dtype=F64, generator=gen)
        want = torch.autograd.grad((T0 * wT).sum() + (J0 * wJ).sum(), [q, *params])
        got = torch.autograd.grad((T1 * wT).sum() + (J1 * wJ).sum(), [q, *params])
        for k, (a, b) in enumerate(zip(got, want)):
            assert rel_err(a, b) < 1e-10, (name, B, k)
        for form in ("matrix", "pos_quat", "pos_rot"):  # forward_kinematics reads the same kernel
            with kernels.native_mode("never"), torch.no_grad():
                want = diffmech.forward_kinematics(robot, q, form=form)
            with kernels.native_mode("build"), torch.no_grad():
                got = diffmech.forward_kinematics(robot, q, form=form)
            for a, b in zip(*((got, want) if form != "matrix" else ((got,), (want,)))):
                assert a.shape == b.shape and rel_err(a, b) < 1e-12, form


def test_the_floating_base_update_by_the_advance_kernel(robots):
    """The contact step's position update of a floating base by the ``advance`` kernel: values and
    gradients w.r.t. the configuration and the velocity equal the torch code's; a rotation of a radian
    or more per step takes the torch code (closed forms instead of the kernel's series); a fixed base
    has no such kernel (``prepare`` skips it)."""
    from diffmech.dynamics.kinematics import advance_floating_base

    robot = robots["free"]
    gen = torch.Generator().manual_seed(4)
    q, v, _, _ = random_state(robot, (17,), seed=4)
    q = torch.cat([q[:, :3], 1.3 * q[:, 3:7], q[:, 7:]], -1)  # a quaternion off unit norm: normalised in use
    for dt, scale in ((1e-3, 1.0), (0.01, 20.0), (0.5, 10.0)):  # the last: |dt w| > 1 rad, the torch code
        qg, vg = q.clone().requires_grad_(True), (scale * v).clone().requires_grad_(True)
        with kernels.native_mode("never"):
            want = advance_floating_base(robot, qg, vg, dt)
        with kernels.native_mode("build"):
            got = advance_floating_base(robot, qg, vg, dt)
        native = any(_ran_native(x.grad_fn) for x in got)
        assert native == (float((dt * vg.detach()[:, 3:6]).norm(dim=-1).amax()) < 1.0), (dt, scale)
        for a, b in zip(got, want):
            assert rel_err(a.detach(), b.detach()) < 1e-13, (dt, scale)
        w = [torch.randn(x.shape, dtype=F64, generator=gen) for x in want]
        g_want = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(want, w)), (qg, vg))
        g_got = torch.autograd.grad(sum((x * wi).sum() for x, wi in zip(got, w)), (qg, vg))
        for a, b in zip(g_got, g_want):
            assert rel_err(a, b) < 1e-12, (dt, scale)
    chain = robots["chain"]
    kernels.prepare(chain, algorithms=("advance",))  # nothing to build, no error
    with pytest.raises(kernels.NativeUnavailable):
        kernels.NativeCall(chain.tree, "advance", True, False, build=False).kernel(F64)


def test_a_contact_rollout_with_kernels_equals_the_torch_code():
    """The laikago standing on its toes, 30 contact steps (checkpointed adjoint) with every kernel the
    contact step reads (mass matrix, bias forces, kinematics, the floating base's update) against the
    same rollout in torch code: states and the gradient w.r.t. the torques and the drives' stiffness."""
    pytest.importorskip("pybullet_data")
    from diffmech.sim import rollout, scenes

    def run(mode):
        kp = torch.tensor(1000.0, dtype=F64, requires_grad=True)
        scene, q0, v0 = scenes.laikago(1, stiffness=kp)
        scene.tol, scene.iterations = 1e-15, 1000  # the impulses to rounding: no early stop decides the last digits
        q0, v0 = q0.expand(2, -1).clone(), v0.expand(2, -1) + torch.tensor([0.05, -0.05], dtype=F64)[:, None]
        tau = torch.zeros(2, 30, scene.nv, dtype=F64, requires_grad=True)
        with kernels.native_mode(mode):
            if mode == "build":
                kernels.prepare(scene.models["laikago0"], algorithms=("inverse_dynamics", "mass_matrix",
                                                                      "kinematics", "advance"))
            qs, _ = rollout(scene, q0, v0, tau, 1e-3, adjoint="checkpoint")
            loss = (qs[:, -1, 0] + qs[:, -1, 2]).sum()
            loss.backward()
        return qs.detach(), tau.grad, kp.grad

    got, want = run("build"), run("never")
    # the native route (the stepper's C step) and the torch step: the same solve, each environment's sweeps
    # stopping on their own in C and batched in torch; measured 1.1e-11
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-10


@pytest.mark.parametrize("name", ["chain", "free"])
def test_bias_forces_run_the_inverse_dynamics_kernel(robots, name):
    """``bias_forces`` (the contact step's ``h``) by the inverse-dynamics kernel at zero
    acceleration: values and state gradients as the torch code's."""
    robot = robots[name]
    q, v, _ = (t.clone().requires_grad_(True) for t in _args(robot, "inverse_dynamics", 13, seed=9))
    w = torch.randn(13, robot.nv, dtype=F64, generator=torch.Generator().manual_seed(2))
    with kernels.native_mode("build"):
        got = robot.bias_forces(q, v)
        fns = [got.grad_fn] + [f for f, _ in got.grad_fn.next_functions]
        assert any("Native" in type(f).__name__ for f in fns)  # the kernel ran
        g_got = torch.autograd.grad((got * w).sum(), (q, v))
    with kernels.native_mode("never"):
        want = robot.bias_forces(q, v)
        g_want = torch.autograd.grad((want * w).sum(), (q, v))
    assert rel_err(got, want) < 1e-11
    for a, b in zip(g_got, g_want):
        assert rel_err(a, b) < 1e-10


def test_second_derivatives_differentiate_the_torch_code(robots):
    robot = robots["chain"]
    q, v, tau = (t.clone().requires_grad_(True) for t in _args(robot, "forward_dynamics", 3, seed=2))
    f = compiled(robot, "forward_dynamics")
    (gq,) = torch.autograd.grad(f(q, v, tau).square().sum(), q, create_graph=True)
    (hq,) = torch.autograd.grad(gq.sum(), q)
    with kernels.native_mode("never"):
        (gq2,) = torch.autograd.grad(robot.forward_dynamics(q, v, tau, fast_grad=False).square().sum(), q,
                                     create_graph=True)
        (hq2,) = torch.autograd.grad(gq2.sum(), q)
    assert rel_err(gq.detach(), gq2.detach()) < 1e-10 and rel_err(hq, hq2) < 1e-9


def test_threads_and_float32(robots):
    robot = robots["tree"]
    args = _args(robot, "inverse_dynamics", 2 * native.MIN_STATES_PER_THREAD + 3, seed=5)
    f = compiled(robot, "inverse_dynamics")
    want = _torch(robot, "inverse_dynamics", args)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # the batch is split between two threads
        with torch.no_grad():
            got = f(*args)
            got32 = f(*[a.float() for a in args])
    finally:
        torch.set_num_threads(threads)
    assert rel_err(got, want) < 1e-12
    assert got32.dtype == torch.float32 and rel_err(got32.double(), want) < 1e-5


def test_every_way_of_changing_a_parameter_reaches_the_kernels(robots):
    robot = copy.deepcopy(robots["chain"])
    f = compiled(robot, "forward_dynamics")
    args = _args(robot, "forward_dynamics", 6, seed=2)

    def check():
        with torch.no_grad():
            got = f(*args)
        assert rel_err(got, _torch(robot, "forward_dynamics", args)) < 1e-11
        return got

    before = check()
    robot.link_params("link3").mass.data.mul_(3.0)  # .data bypasses version counters
    after = check()
    assert not torch.allclose(before, after)
    robot.joint_params("joint2").damping.data = torch.tensor(0.9, dtype=F64)  # rebinding
    robot.set_gravity([0.0, 0.0, -3.0])
    robot.load_state_dict({**robot.state_dict(), "links.2.mass": torch.tensor(0.5, dtype=F64)})
    check()


def test_the_default_path_uses_built_kernels_only(robots, monkeypatch):
    robot = robots["tree"]
    args = _args(robot, "inverse_dynamics", 5, seed=8)
    want = _torch(robot, "inverse_dynamics", args)
    ran = []
    real = kernels.call_native

    def spy(call, state, rb):
        ran.append(call.algorithm)
        return real(call, state, rb)

    monkeypatch.setattr(kernels, "call_native", spy)
    kernels.prepare(robot, ["inverse_dynamics"], gradients=False)
    with kernels.native_mode("auto"):
        got = robot.inverse_dynamics(*args)
        assert diffmech.rnea(robot, *args).equal(got)
        # no reverse-mode kernel was built: a differentiable call falls back to the torch code
        q = args[0].clone().requires_grad_(True)
        robot.inverse_dynamics(q, *args[1:]).sum().backward()
    assert ran and rel_err(got, want) < 1e-12
    with kernels.native_mode("never"):
        ran.clear()
        robot.inverse_dynamics(*args)
        assert not ran


def test_kernels_are_shared_by_trees_of_one_structure():
    """Names and parameter values are not part of a kernel: a second robot with the same tree
    reuses the first one's kernel (no tracing, no compiling)."""
    a = systems.n_link_pendulum(2, masses=1.0, lengths=1.0)
    b = systems.n_link_pendulum(2, masses=(2.0, 0.5), lengths=(0.3, 0.7), damping=0.2)
    assert a.tree.structure_hash == b.tree.structure_hash
    fa = compiled(a, "inverse_dynamics")
    args = _args(a, "inverse_dynamics", 4, seed=1)
    with torch.no_grad():
        fa(*args)
        t0 = time.perf_counter()
        got = compiled(b, "inverse_dynamics")(*args)
        assert time.perf_counter() - t0 < 0.5
    assert rel_err(got, _torch(b, "inverse_dynamics", args)) < 1e-12
    c = systems.n_link_pendulum(3)
    assert c.tree.structure_hash != a.tree.structure_hash


def _python(code: str, env: dict) -> subprocess.CompletedProcess:
    full = {**os.environ, **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full,
                          timeout=600)


def test_a_fresh_process_loads_stored_kernels_without_tracing(tmp_path):
    """The first call of a process whose kernels are on disk costs a load, not a trace and a
    compile (target: under 0.5 s)."""
    code = """
        import time, warnings
        import torch, diffmech
        from diffmech.dynamics import compiled, kernels
        kernels.set_native("auto")
        robot = diffmech.model.systems.n_link_pendulum(4)
        q = torch.zeros(2, 4, dtype=torch.float64)
        t0 = time.perf_counter()
        with torch.no_grad():
            compiled(robot, "forward_dynamics")(q, q, q)
        t1 = time.perf_counter()
        print(f"first call {t1 - t0:.4f} s")
    """
    env = {"DIFFMECH_CACHE_DIR": str(tmp_path)}
    cold = _python(code, env)
    assert cold.returncode == 0, cold.stderr
    warm = _python(code, env)
    assert warm.returncode == 0, warm.stderr
    seconds = float(warm.stdout.split()[-2])
    print(cold.stdout.strip(), "->", warm.stdout.strip())
    assert seconds < 0.5


def test_without_any_c_compiler_compiled_runs_the_torch_code_eagerly(tmp_path):
    """A stripped PATH (no cc, gcc or $CC): native kernels and torch.compile both need a compiler;
    ``compiled`` warns once and runs the torch code eagerly, with the same results."""
    code = """
        import warnings, torch, diffmech
        from diffmech.dynamics import compiled, native
        assert not native.available()
        robot = diffmech.model.systems.n_link_pendulum(3)
        q = torch.rand(5, 3, dtype=torch.float64)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            f = compiled(robot, "forward_dynamics")
            out = f(q, q, q)
            out = f(q, q, q)
        msgs = [str(x.message) for x in w if "compiler" in str(x.message)]
        assert len(msgs) == 1, msgs
        assert w[0].filename.endswith("<string>"), w[0].filename  # points at the caller's line
        with diffmech.dynamics.kernels.native_mode("never"):
            ref = robot.forward_dynamics(q, q, q)
        assert torch.allclose(out, ref, rtol=1e-12, atol=1e-12)
        print("ok")
    """
    empty = tmp_path / "bin"
    empty.mkdir()
    res = _python(code, {"PATH": str(empty), "CC": "", "DIFFMECH_CACHE_DIR": str(tmp_path / "cache")})
    assert res.returncode == 0 and res.stdout.strip().endswith("ok"), res.stderr[-3000:]


def test_unsupported_operation_and_dtype_are_refused():
    def program(x, c):
        return torch.stack([torch.tanh(x[0]) * c[0]])

    with pytest.raises(native.NativeUnavailable, match="unsupported operation"):
        native.kernel_of(program, [1], [torch.ones(1, dtype=F64)], F64)
    with pytest.raises(native.NativeUnavailable, match="dtype"):
        native.kernel_of(program, [1], [torch.ones(1, dtype=torch.float16)], torch.float16)


def test_lane_kernel_on_a_small_program():
    def program(x, c):  # x (2, B): rows a, b -> (a * b + c0, sin(a) / b)
        return torch.stack([x[0] * x[1] + c[0], torch.sin(x[0]) / x[1]])

    k = native.kernel_of(program, [2], [torch.zeros(1, dtype=F64)], F64)
    x = torch.rand(21, 2, dtype=F64) + 0.5
    out = k([x], torch.tensor([0.25], dtype=F64))
    torch.testing.assert_close(out, torch.stack([x[:, 0] * x[:, 1] + 0.25, x[:, 0].sin() / x[:, 1]], 1),
                               rtol=1e-14, atol=1e-14)


@pytest.mark.slow
@pytest.mark.parametrize("key", ["iiwa", "allegro", "laikago"])
def test_real_robots(key):
    robot = copy.deepcopy(get_robot(key))
    for algorithm in ALGS:
        args = _args(robot, algorithm, 23, seed=4)
        with torch.no_grad():
            assert rel_err(compiled(robot, algorithm)(*args), _torch(robot, algorithm, args)) < 1e-10
    link = robot.link_names[3]
    robot.make_link_param_learnable(link, "mass")
    robot.make_link_param_learnable(link, "inertia")
    params = list(robot.learnable_parameters().values())
    args = [t.clone().requires_grad_(True) for t in _args(robot, "inverse_dynamics", 23, seed=4)]
    got = torch.autograd.grad(compiled(robot, "inverse_dynamics")(*args).square().sum(), args + params)
    want = torch.autograd.grad(_torch(robot, "inverse_dynamics", args).square().sum(), args + params)
    for a, b in zip(got, want):
        assert rel_err(a, b) < 1e-10


def test_a_missing_kernel_raises_a_fresh_error_each_call(tmp_path, monkeypatch):
    """A kernel looked up while it is not built raises a new ``NotBuilt`` each time. Re-raising one stored
    instance chained every call's traceback (and the frames and tensors it holds) onto it: a memory leak
    that grew with every simulator step of a robot whose kernels were not prepared."""
    from diffmech.dynamics import kernel_store
    from diffmech.dynamics.kernel_store import NotBuilt

    monkeypatch.setenv("DIFFMECH_CACHE_DIR", str(tmp_path))  # an empty store
    monkeypatch.setattr(kernels, "_MEMO", {})  # and nothing loaded in this process
    monkeypatch.setattr(kernel_store, "_MEMO", {})
    model = systems.double_pendulum()
    call = kernels.NativeCall(model.tree, "inverse_dynamics", True, False, build=False)

    def depth(err):
        n, tb = 0, err.__traceback__
        while tb is not None:
            n, tb = n + 1, tb.tb_next
        return n

    errs = []
    for _ in range(4):
        with pytest.raises(NotBuilt) as info:
            call.kernel(F64)
        errs.append(info.value)
    assert len({id(e) for e in errs}) == len(errs)
    assert depth(errs[-1]) <= depth(errs[1])  # no traceback accumulates across calls
