"""Gradients of the rigid-body algorithms.

Three kinds of checks, all in float64:

* ``torch.autograd.gradcheck`` (analytic backward vs central finite differences) of every
  algorithm w.r.t. the state inputs, on a small branched tree written inline (oblique revolute
  axis, prismatic and continuous joints, a fixed tool link, damping and springs) and on the
  floating-base laikago;
* gradcheck w.r.t. learnable model parameters (mass, com, inertia, joint placement, damping,
  stiffness, rest, gravity) through ``torch.func.functional_call``;
* the implicit-function-theorem backward of ``forward_dynamics(fast_grad=True)`` against plain
  autograd through the algorithm (``fast_grad=False``) on the iiwa and the floating laikago,
  for every input and every learnable parameter.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn
from torch.autograd import gradcheck, gradgradcheck

import diffmech

DT = torch.float64

# Inertial block shared by the toy links: an off-diagonal inertia rotated by the inertial <origin rpy>
# and an offset centre of mass, so that no term of the spatial inertia is trivially zero.
_INERTIAL = (
    '<inertial><origin xyz="{cx} 0.02 {cz}" rpy="0.1 -0.2 0.3"/><mass value="{m}"/>'
    '<inertia ixx="0.021" ixy="0.002" ixz="-0.001" iyy="0.032" iyz="0.003" izz="0.017"/></inertial>'
)


def _link(name: str, m: float, cx: float = 0.03, cz: float = 0.12) -> str:
    return f'<link name="{name}">{_INERTIAL.format(m=m, cx=cx, cz=cz)}</link>'


# base -j1(revolute, oblique axis)-> l1 -j2(prismatic, oblique axis)-> l2 -j3(continuous)-> l3 -fixed-> tool
#                                   l1 -j4(revolute)-> l4   (a branch: two bodies at one depth)
TOY_URDF = f"""<?xml version="1.0"?>
<robot name="toy">
  {_link("base", 2.0)}
  {_link("l1", 1.3, 0.05, 0.2)}
  {_link("l2", 0.9, -0.04, 0.1)}
  {_link("l3", 0.6, 0.02, 0.15)}
  {_link("tool", 0.25, 0.01, 0.03)}
  {_link("l4", 0.4, 0.06, -0.05)}
  <joint name="j1" type="revolute">
    <parent link="base"/><child link="l1"/>
    <origin xyz="0.1 -0.05 0.3" rpy="0.2 -0.1 0.4"/>
    <axis xyz="0.3 -0.5 0.8"/>
    <limit lower="-2.5" upper="2.5" effort="50" velocity="3"/>
    <dynamics damping="0.3" friction="0.1"/>
  </joint>
  <joint name="j2" type="prismatic">
    <parent link="l1"/><child link="l2"/>
    <origin xyz="0.0 0.1 0.35" rpy="-0.3 0.2 0.1"/>
    <axis xyz="1 0.2 -0.3"/>
    <limit lower="-0.4" upper="0.4" effort="80" velocity="1"/>
    <dynamics damping="0.7"/>
  </joint>
  <joint name="j3" type="continuous">
    <parent link="l2"/><child link="l3"/>
    <origin xyz="0.2 0.0 0.1" rpy="0.0 0.5 -0.2"/>
    <axis xyz="0 1 0"/>
    <dynamics damping="0.05"/>
  </joint>
  <joint name="tool_joint" type="fixed">
    <parent link="l3"/><child link="tool"/>
    <origin xyz="0.0 0.05 0.25" rpy="0.3 0.0 0.6"/>
  </joint>
  <joint name="j4" type="revolute">
    <parent link="l1"/><child link="l4"/>
    <origin xyz="-0.1 0.0 0.2" rpy="0.0 0.0 1.0"/>
    <axis xyz="1 0 0"/>
    <limit lower="-1.5" upper="1.5" effort="20" velocity="4"/>
  </joint>
</robot>
"""

# Joint springs are not part of URDF: set them on the spec, with non-zero rest positions.
_SPRINGS = {"j1": (1.5, 0.2), "j2": (40.0, -0.05), "j3": (0.8, 0.4), "j4": (2.0, -0.3)}


def _toy() -> diffmech.RobotModel:
    spec = diffmech.parse_urdf(TOY_URDF)
    for j in spec.joints:
        if j.name in _SPRINGS:
            j.stiffness, j.rest = _SPRINGS[j.name]
    return diffmech.RobotModel(spec, dtype=DT)


def _laikago() -> diffmech.RobotModel:
    pybullet_data = pytest.importorskip("pybullet_data")
    path = os.path.join(pybullet_data.getDataPath(), "laikago", "laikago_toes_zup.urdf")
    return diffmech.load_urdf(path, floating_base=True, dtype=DT)


def _iiwa() -> diffmech.RobotModel:
    diff_robot_data = pytest.importorskip("diff_robot_data")
    path = os.path.join(list(diff_robot_data.__path__)[0], "kuka_iiwa", "urdf", "iiwa7.urdf")
    return diffmech.load_urdf(path, dtype=DT)


@pytest.fixture(scope="module")
def toy():
    return _toy()


@pytest.fixture(scope="module")
def laikago():
    return _laikago()


def _state(robot, batch, seed):
    """Random ``q, v, a, f_ext`` (all float64, leaves requiring grad)."""
    g = torch.Generator().manual_seed(seed)
    q = robot.random_configuration(*batch, generator=g)
    v = torch.randn(*batch, robot.nv, generator=g, dtype=DT)
    a = torch.randn(*batch, robot.nv, generator=g, dtype=DT)
    f = torch.randn(*batch, robot.n_links, 6, generator=g, dtype=DT)
    return [t.requires_grad_(True) for t in (q, v, a, f)]


def _gradcheck(fn, inputs, fast_mode=False):
    # Central differences with eps=1e-6 in float64 are good to ~1e-8 relative on these smooth maps.
    # fast_mode compares random projections of the Jacobian (one JVP/VJP pair instead of one backward
    # per output element): used on laikago, whose full Jacobians (e.g. 648 x 38 for M) are slow to build.
    assert gradcheck(fn, tuple(inputs), eps=1e-6, atol=1e-6, rtol=1e-5, fast_mode=fast_mode)


# ---------------------------------------------------------------- state gradients, small tree
FD_VARIANTS = [(m, fg) for m in ("aba", "crba") for fg in (True, False)]


def _fd(method: str, fast_grad: bool, with_f_ext: bool = True, passive: bool = True):
    """``forward_dynamics`` as a function of ``(robot, q, v, tau, f_ext)`` with fixed options."""

    def fn(r, q, v, tau, f):
        return r.forward_dynamics(q, v, tau, f_ext=f if with_f_ext else None, passive=passive, method=method,
                                  fast_grad=fast_grad)

    return fn


def _toy_cases():
    """(id, function of (q, v, a, f_ext) -> output, which of q, v, a, f_ext it uses)."""
    return [
        ("forward_kinematics", lambda r, q, v, a, f: r.forward_kinematics(q), "q"),
        ("link_pose_tool", lambda r, q, v, a, f: r.link_pose(q, "tool"), "q"),
        ("jacobian_world_aligned", lambda r, q, v, a, f: r.jacobian(q, "tool"), "q"),
        ("jacobian_local", lambda r, q, v, a, f: r.jacobian(q, "l3", frame="local"), "q"),
        ("jacobian_world", lambda r, q, v, a, f: r.jacobian(q, "l4", frame="world"), "q"),
        # point offset in link coordinates is differentiable too (it enters through `a` here)
        ("jacobian_point", lambda r, q, v, a, f: r.jacobian(q, "tool", point=a[..., :3]), "qa"),
        ("inverse_dynamics", lambda r, q, v, a, f: r.inverse_dynamics(q, v, a), "qva"),
        ("inverse_dynamics_bare", lambda r, q, v, a, f: r.inverse_dynamics(q, v, a, passive=False), "qva"),
        ("inverse_dynamics_f_ext", lambda r, q, v, a, f: r.inverse_dynamics(q, v, a, f_ext=f), "qvaf"),
        ("mass_matrix", lambda r, q, v, a, f: r.mass_matrix(q), "q"),
        ("bias_forces", lambda r, q, v, a, f: r.bias_forces(q, v), "qv"),
        ("bias_forces_bare", lambda r, q, v, a, f: r.bias_forces(q, v, passive=False), "qv"),
        ("generalized_gravity", lambda r, q, v, a, f: r.generalized_gravity(q), "q"),
        ("kinetic_energy", lambda r, q, v, a, f: r.kinetic_energy(q, v), "qv"),
        ("potential_energy", lambda r, q, v, a, f: r.potential_energy(q), "q"),
        ("potential_energy_bare", lambda r, q, v, a, f: r.potential_energy(q, passive=False), "q"),
        ("center_of_mass", lambda r, q, v, a, f: r.center_of_mass(q), "q"),
        ("integrate", lambda r, q, v, a, f: r.integrate(q, v, 0.05), "qv"),
    ] + [
        (f"forward_dynamics_{m}_fast{fg}", _fd(m, fg), "qvaf") for m, fg in FD_VARIANTS
    ] + [
        (f"forward_dynamics_bare_{m}_fast{fg}", _fd(m, fg, with_f_ext=False, passive=False), "qva")
        for m, fg in FD_VARIANTS
    ]


@pytest.mark.parametrize("name, fn, uses", _toy_cases(), ids=[c[0] for c in _toy_cases()])
def test_gradcheck_state_toy(toy, name, fn, uses):
    q, v, a, f = _state(toy, (2,), seed=1)
    inputs = [t for key, t in zip("qvaf", (q, v, a, f)) if key in uses]

    def call(*xs):
        d = dict(zip([k for k in "qvaf" if k in uses], xs))
        return fn(toy, d.get("q", q), d.get("v", v), d.get("a", a), d.get("f", f))

    _gradcheck(call, inputs)


def test_gradcheck_forward_dynamics_unbatched_broadcast(toy):
    """Broadcast inputs (unbatched q, batched tau): gradients are summed back to q's shape."""
    q, v, a, f = _state(toy, (), seed=2)
    tau = torch.randn(3, toy.nv, dtype=DT, generator=torch.Generator().manual_seed(3)).requires_grad_(True)
    _gradcheck(lambda q, v, tau: toy.forward_dynamics(q, v, tau), (q, v, tau))


def test_pure_function_api_gradients(toy):
    """The module-level pure functions are the same maps as the methods, backward included."""
    q, v, a, f = _state(toy, (2,), seed=4)
    _gradcheck(lambda q, v, a: diffmech.rnea(toy, q, v, a), (q, v, a))
    _gradcheck(lambda q, v, a, f: diffmech.aba(toy, q, v, a, f_ext=f), (q, v, a, f))
    _gradcheck(lambda q: diffmech.crba(toy, q), (q,))


# ---------------------------------------------------------------- state gradients, floating base
def _laikago_cases():
    return [
        ("forward_kinematics", lambda r, q, v, a, f: r.forward_kinematics(q), "q"),
        ("jacobian_local", lambda r, q, v, a, f: r.jacobian(q, r.link_names[-1], frame="local"), "q"),
        ("inverse_dynamics_f_ext", lambda r, q, v, a, f: r.inverse_dynamics(q, v, a, f_ext=f), "qvaf"),
        ("mass_matrix", lambda r, q, v, a, f: r.mass_matrix(q), "q"),
        ("fd_aba_fast", lambda r, q, v, a, f: r.forward_dynamics(q, v, a, f_ext=f), "qvaf"),
        ("fd_crba_slow", lambda r, q, v, a, f: r.forward_dynamics(q, v, a, method="crba", fast_grad=False), "qva"),
        ("kinetic_energy", lambda r, q, v, a, f: r.kinetic_energy(q, v), "qv"),
        ("potential_energy", lambda r, q, v, a, f: r.potential_energy(q), "q"),
        ("center_of_mass", lambda r, q, v, a, f: r.center_of_mass(q), "q"),
        ("integrate", lambda r, q, v, a, f: r.integrate(q, v, 0.1), "qv"),
    ]


@pytest.mark.parametrize("name, fn, uses", _laikago_cases(), ids=[c[0] for c in _laikago_cases()])
def test_gradcheck_state_laikago(laikago, name, fn, uses):
    q, v, a, f = _state(laikago, (2,), seed=5)
    inputs = [t for key, t in zip("qvaf", (q, v, a, f)) if key in uses]

    def call(*xs):
        d = dict(zip([k for k in "qvaf" if k in uses], xs))
        return fn(laikago, d.get("q", q), d.get("v", v), d.get("a", a), d.get("f", f))

    _gradcheck(call, inputs, fast_mode=True)


def test_gradcheck_integrate_floating_zero_rotation(laikago):
    """The series branch of the SE(3) exponential (zero angular velocity) has the right derivative."""
    q, v, _, _ = _state(laikago, (2,), seed=6)
    v = v.detach().clone()
    v[:, 3:6] = 0.0
    v.requires_grad_(True)
    _gradcheck(lambda q, v: laikago.integrate(q, v, 0.1), (q, v), fast_mode=True)


def test_gradcheck_integrate_dt(laikago):
    q, v, _, _ = _state(laikago, (2,), seed=7)
    dt = torch.tensor([0.05, 0.2], dtype=DT, requires_grad=True)
    _gradcheck(lambda q, v, dt: laikago.integrate(q, v, dt), (q, v, dt), fast_mode=True)


# ---------------------------------------------------------------- parameter gradients
LEARNABLE = [
    ("l1", "mass"), ("l2", "com"), ("l3", "inertia"), ("tool", "mass"), ("tool", "com"), ("l4", "inertia"),
    ("l1", "damping"), ("l2", "damping"), ("l1", "origin_xyz"), ("l2", "origin_rpy"),
    ("tool", "origin_xyz"), ("tool", "origin_rpy"),  # a fixed joint: moves the merged body's inertia
    ("l3", "stiffness"), ("l4", "rest"), ("base", "mass"),
]


class _Call(nn.Module):
    """Gives ``functional_call`` a ``forward`` to run: ``fn(robot, *args)``."""

    def __init__(self, robot, fn):
        super().__init__()
        self.robot = robot
        self.fn = fn

    def forward(self, *args):
        return self.fn(self.robot, *args)


@pytest.fixture(scope="module")
def toy_learnable():
    robot = _toy()
    for link, name in LEARNABLE:
        robot.make_link_param_learnable(link, name)
    names = sorted(robot.learnable_parameters(readable=False))
    assert len(names) == len(LEARNABLE)
    return robot, names


PARAM_FUNCTIONS = [
    ("forward_kinematics", lambda r, q, v, a, f: r.forward_kinematics(q)),
    ("jacobian", lambda r, q, v, a, f: r.jacobian(q, "tool", frame="local")),
    ("inverse_dynamics_f_ext", lambda r, q, v, a, f: r.inverse_dynamics(q, v, a, f_ext=f)),
    ("mass_matrix", lambda r, q, v, a, f: r.mass_matrix(q)),
    ("kinetic_energy", lambda r, q, v, a, f: r.kinetic_energy(q, v)),
    ("potential_energy", lambda r, q, v, a, f: r.potential_energy(q)),
    ("center_of_mass", lambda r, q, v, a, f: r.center_of_mass(q)),
    ("generalized_gravity", lambda r, q, v, a, f: r.generalized_gravity(q)),
] + [(f"forward_dynamics_{m}_fast{fg}", _fd(m, fg)) for m, fg in FD_VARIANTS]


@pytest.mark.parametrize("name, fn", PARAM_FUNCTIONS, ids=[c[0] for c in PARAM_FUNCTIONS])
def test_gradcheck_learnable_parameters(toy_learnable, name, fn):
    robot, names = toy_learnable
    q, v, a, f = (t.detach() for t in _state(robot, (2,), seed=8))
    params = dict(robot.learnable_parameters(readable=False))
    values = [params[n].detach().clone().requires_grad_(True) for n in names]
    gravity = robot.gravity.detach().clone().requires_grad_(True)
    wrapper = _Call(robot, fn)

    def call(*vals):
        swap = {f"robot.{n}": _sym(n, t) for n, t in zip(names, vals[:-1])}
        swap["robot.gravity"] = vals[-1]
        return torch.func.functional_call(wrapper, swap, (q, v, a, f))

    _gradcheck(call, [*values, gravity])


def _sym(name: str, t):
    """Perturb inertias only along symmetric directions.

    A finite-difference step on one off-diagonal entry of a raw 3x3 inertia leaves the set of
    symmetric matrices, where ABA and RNEA disagree (see test_nonsymmetric_inertia_parameter);
    the physical derivative is the one along ``E_ij + E_ji``.
    """
    return 0.5 * (t + t.transpose(-1, -2)) if name.endswith("inertia") else t


def test_learnable_parameter_gradients_reach_the_parameters(toy_learnable):
    """Plain ``.backward()`` (no functional_call) fills ``.grad`` of every learnable parameter."""
    robot, names = toy_learnable
    q, v, a, f = (t.detach() for t in _state(robot, (3,), seed=9))
    robot.zero_grad()
    robot.forward_dynamics(q, v, a, f_ext=f).square().sum().backward()
    params = robot.learnable_parameters(readable=False)
    for n in names:
        grad = params[n].grad
        if n == "links.0.mass":  # the root link is welded to the world: its mass cannot affect qdd
            assert grad is None or not grad.any(), n
            continue
        if n == "joints.0.origin_xyz":
            # The first joint's offset translates the whole moving robot, which uniform gravity and
            # link-origin external forces do not see: the dynamics (centered on body 0) give exactly 0.
            assert grad is None or not grad.any(), n
            continue
        assert grad is not None and torch.isfinite(grad).all(), n
        assert grad.abs().max() > 0, n
    robot.zero_grad(set_to_none=True)


# ---------------------------------------------------------------- fast backward == plain autograd
_JOINT_PARAMS = ("origin_xyz", "origin_rpy", "damping", "stiffness", "rest")


def _all_learnable(robot):
    """Every inertial and joint parameter learnable, springs switched on, gravity requiring grad."""
    g = torch.Generator().manual_seed(11)
    for i, link in enumerate(robot.link_names):
        for name in ("mass", "com", "inertia"):
            robot.make_link_param_learnable(link, name)
        if i == 0:
            continue
        for name in _JOINT_PARAMS:
            robot.make_link_param_learnable(link, name)
        jp = robot.joints[i - 1]
        with torch.no_grad():
            jp.stiffness.copy_(torch.rand((), generator=g, dtype=DT) * 5)
            jp.rest.copy_(torch.rand((), generator=g, dtype=DT) - 0.5)
            jp.damping.add_(torch.rand((), generator=g, dtype=DT))
    robot.gravity.requires_grad_(True)
    return robot


@pytest.fixture(scope="module")
def iiwa_all():
    return _all_learnable(_iiwa())


@pytest.fixture(scope="module")
def laikago_all():
    return _all_learnable(_laikago())


def _graph_has(node, fragment: str, depth: int = 4) -> bool:
    """Whether an autograd node whose class name contains ``fragment`` is within ``depth`` of ``node``."""
    frontier = [node]
    for _ in range(depth):
        if any(n is not None and fragment in type(n).__name__ for n in frontier):
            return True
        frontier = [m for n in frontier if n is not None for m, _ in n.next_functions]
    return False


def _fd_grads(robot, q, v, tau, f, w, method, fast_grad):
    qdd = robot.forward_dynamics(q, v, tau, f_ext=f, method=method, fast_grad=fast_grad)
    assert _graph_has(qdd.grad_fn, "ForwardDynamics") == fast_grad  # the path under test is the one taken
    params = robot.learnable_parameters(readable=False)
    names = sorted(params)
    leaves = [q, v, tau, f, robot.gravity, *(params[n] for n in names)]
    grads = torch.autograd.grad((qdd * w).sum(), leaves, allow_unused=True)
    return qdd, dict(zip(["q", "v", "tau", "f_ext", "gravity", *names], grads))


def _unused_parameters(robot) -> set[str]:
    """Parameters that cannot influence the dynamics: Coulomb friction (stored for simulators, not
    used by RNEA/ABA) and the damping/spring of fixed joints."""
    out = {f"joints.{i}.friction" for i in range(len(robot.joints))}
    for i, name in enumerate(robot.all_joint_names):
        if name not in robot.joint_names:
            out |= {f"joints.{i}.{p}" for p in ("damping", "stiffness", "rest")}
    return out


@pytest.mark.parametrize("method", ["aba", "crba"])
@pytest.mark.parametrize("robot_name", ["iiwa", "laikago"])
def test_fast_grad_matches_autograd(robot_name, method, request):
    robot = request.getfixturevalue(f"{robot_name}_all")
    q, v, a_target, f = _state(robot, (8,), seed=12)
    # Torques of the robot's own scale (those producing O(1) accelerations): with unit random torques
    # the light distal links of the iiwa reach qdd ~ 5e3 and float64 round-off alone is ~1e-9 in both
    # paths (autograd-ABA and autograd-CRBA disagree by as much).
    with torch.no_grad():
        f.mul_(0.3)
        tau = robot.inverse_dynamics(q, v, a_target, f_ext=f)
    tau.requires_grad_(True)
    w = torch.randn(8, robot.nv, dtype=DT, generator=torch.Generator().manual_seed(13))
    qdd_fast, g_fast = _fd_grads(robot, q, v, tau, f, w, method, True)
    qdd_slow, g_slow = _fd_grads(robot, q, v, tau, f, w, method, False)
    torch.testing.assert_close(qdd_fast, qdd_slow, atol=1e-12, rtol=0)
    torch.testing.assert_close(qdd_slow, a_target.detach(), atol=1e-10, rtol=0)
    assert g_fast.keys() == g_slow.keys()
    unused = _unused_parameters(robot)
    worst = 0.0
    for k in g_fast:
        a, b = g_fast[k], g_slow[k]
        if k in unused:
            assert (a is None or not a.any()) and (b is None or not b.any()), k
            continue
        assert a is not None and b is not None, k
        if k.endswith(".inertia"):
            # Only the symmetric part is a physical derivative (test_nonsymmetric_inertia_parameter).
            a, b = a + a.transpose(-1, -2), b + b.transpose(-1, -2)
        worst = max(worst, float((a - b).abs().max()))
        torch.testing.assert_close(a, b, atol=1e-10, rtol=0, msg=lambda m, k=k: f"{k}: {m}")
    # Gradients must be non-trivial for the comparison to mean anything.
    for k in ("q", "v", "tau", "f_ext", "gravity"):
        assert g_slow[k].abs().max() > 1e-3, k
    print(f"\nmax |fast - autograd| {robot_name} {method}: {worst:.3e}")


def test_fast_grad_only_parameters_require_grad(iiwa_all):
    """With no state input requiring grad, the fast path still differentiates the parameters."""
    q, v, a, _ = (t.detach() for t in _state(iiwa_all, (4,), seed=14))
    tau = iiwa_all.inverse_dynamics(q, v, a).detach()  # O(1) accelerations, as above
    params = iiwa_all.learnable_parameters()
    names = sorted(params)
    outs = []
    for fast in (True, False):
        qdd = iiwa_all.forward_dynamics(q, v, tau, fast_grad=fast)
        outs.append(torch.autograd.grad(qdd.sum(), [params[n] for n in names], allow_unused=True))
    for n, a, b in zip(names, *outs):
        if a is None or b is None:
            assert a is None and b is None, n
            continue
        if n.endswith(".inertia"):
            a, b = a + a.transpose(-1, -2), b + b.transpose(-1, -2)
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)


def test_nonsymmetric_inertia_parameter():
    robot = _toy()
    robot.make_link_param_learnable("l3", "inertia")
    with torch.no_grad():
        robot.link_params("l3").inertia[0, 1] += 0.004  # what an optimiser step on a raw gradient can do
    q, v, tau, _ = (t.detach() for t in _state(robot, (3,), seed=18))
    qdd_aba = robot.forward_dynamics(q, v, tau, method="aba", fast_grad=False)
    qdd_crba = robot.forward_dynamics(q, v, tau, method="crba", fast_grad=False)
    torch.testing.assert_close(qdd_aba, qdd_crba, atol=1e-10, rtol=1e-10)
    inertia = robot.link_params("l3").inertia
    (g_fast,) = torch.autograd.grad(robot.forward_dynamics(q, v, tau, fast_grad=True).sum(), inertia)
    (g_slow,) = torch.autograd.grad(robot.forward_dynamics(q, v, tau, fast_grad=False).sum(), inertia)
    torch.testing.assert_close(g_fast, g_slow, atol=1e-10, rtol=1e-10)


# ---------------------------------------------------------------- second order
# With ``create_graph=True`` the fast backward re-runs the plain algorithm under autograd, so
# second derivatives through the default ``fast_grad=True`` are exact.
def _first_grad(robot, q, v, tau, fast_grad, loss=lambda qdd, q: qdd.square().sum()):
    qdd = robot.forward_dynamics(q, v, tau, fast_grad=fast_grad)
    (gq,) = torch.autograd.grad(loss(qdd, q), q, create_graph=True)
    return gq


def test_fast_grad_double_backward_matches_plain(toy):
    q, v, tau, _ = _state(toy, (2,), seed=15)
    for wrt in (q, v, tau):
        expected = torch.autograd.grad(_first_grad(toy, q, v, tau, False).sum(), wrt)[0]
        got = torch.autograd.grad(_first_grad(toy, q, v, tau, True).sum(), wrt)[0]
        torch.testing.assert_close(got, expected, atol=1e-9, rtol=1e-9)


def test_fast_grad_second_derivative_is_right_or_refused(toy):
    q, v, tau, _ = _state(toy, (2,), seed=15)
    loss = lambda qdd, q: (qdd * q[..., : toy.nv]).sum()  # q enters twice: through qdd and directly
    expected = torch.autograd.grad(_first_grad(toy, q, v, tau, False, loss).sum(), q)[0]
    try:
        got = torch.autograd.grad(_first_grad(toy, q, v, tau, True, loss).sum(), q)[0]
    except diffmech.DiffmechError as e:
        assert "fast_grad" in str(e)
        return
    torch.testing.assert_close(got, expected, atol=1e-8, rtol=1e-8)


def test_fast_grad_under_torch_func(toy):
    q, v, tau, _ = (t.detach() for t in _state(toy, (), seed=19))
    fn = lambda fast: lambda x: toy.forward_dynamics(x, v, tau, fast_grad=fast).sum()
    expected = torch.func.grad(fn(False))(q)
    try:
        got = torch.func.grad(fn(True))(q)
    except diffmech.DiffmechError as e:
        assert "fast_grad" in str(e)
        return
    torch.testing.assert_close(got, expected, atol=1e-10, rtol=1e-10)


@pytest.mark.parametrize("method", ["aba", "crba"])
def test_plain_autograd_second_order(toy, method):
    """``fast_grad=False`` supports second derivatives (checked against finite differences)."""
    q, v, tau, _ = _state(toy, (1,), seed=16)
    assert gradgradcheck(
        lambda q, v, tau: toy.forward_dynamics(q, v, tau, method=method, fast_grad=False),
        (q, v, tau), eps=1e-6, atol=1e-5, rtol=1e-4,
    )


def test_gradgradcheck_inverse_dynamics(toy):
    q, v, a, _ = _state(toy, (1,), seed=17)
    assert gradgradcheck(lambda q, v, a: toy.inverse_dynamics(q, v, a), (q, v, a), eps=1e-6, atol=1e-5, rtol=1e-4)
