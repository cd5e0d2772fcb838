"""``diffmech.compat.drm`` against differentiable-robot-model itself and against PyBullet.

Oracles: differentiable-robot-model (DRM) 0.2.3 on the same robots, states and parameters -- its
float32 as shipped, and its float64 (its URDF values and scratch tensors redirected to float64, see
:func:`drm_float64`) -- and PyBullet for what DRM's own tests compare with it (link poses,
Jacobians, inverse dynamics, mass matrices, forward dynamics by one simulation step). Tolerances are
relative to the largest entry of the reference (at least 1): 1e-5 in float32, 1e-10 in float64.
DRM's example training loops (identifying the iiwa's link 1 from inverse or forward dynamics, its
kinematics, the two-link arm's) run on the facade for a few epochs.
"""

from __future__ import annotations

import contextlib
import copy
import io
import logging
import os
import pickle
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("differentiable_robot_model")
diff_robot_data = pytest.importorskip("diff_robot_data")

import differentiable_robot_model.data_utils as drm_data  # noqa: E402
import differentiable_robot_model.rigid_body_params as drm_params  # noqa: E402
from differentiable_robot_model.robot_model import DifferentiableRobotModel as DrmModel  # noqa: E402

from diffmech.compat import drm  # noqa: E402
from diffmech.compat.drm import data_utils, rigid_body_params  # noqa: E402
from diffmech.errors import ModelError  # noqa: E402

logging.getLogger("urdf_parser_py").setLevel(logging.ERROR)
BASE = list(diff_robot_data.__path__)[0]

# The robots and links of DRM's kinematics/dynamics tests.
ROBOTS = {
    "fetch": ("fetch_description/urdf/fetch_arm_no_gripper_small_damping.urdf", ["virtual_ee_link"]),
    "2link": ("2link_robot.urdf", ["endEffector"]),
    "iiwa": ("kuka_iiwa/urdf/iiwa7.urdf", ["iiwa_link_ee"]),
    "panda": ("panda_description/urdf/panda_no_gripper.urdf", ["panda_virtual_ee_link"]),
    "allegro": ("allegro/urdf/allegro_hand_description_left_small_damping.urdf",
                ["link_11.0_tip", "link_7.0_tip", "link_3.0_tip", "link_15.0_tip"]),
    "trifinger": ("trifinger_edu_description/trifinger_edu.urdf",
                  ["finger_tip_link_0", "finger_tip_link_120", "finger_tip_link_240"]),
    "jaco": ("kinova_description/urdf/jaco_clean.urdf", ["j2n6s300_link_ee"]),
}
TOL = {torch.float32: 1e-5, torch.float64: 1e-10}


def robot_params(fast):
    """Every robot; those not in ``fast`` run in the full suite (``-m slow``)."""
    return [pytest.param(k, marks=() if k in fast else pytest.mark.slow) for k in ROBOTS]


def path(key: str) -> str:
    return os.path.join(BASE, ROBOTS[key][0])


@contextlib.contextmanager
def drm_float64(building: bool = False):
    """DRM in float64: it builds its parameters with ``dtype=torch.float32`` (redirected while
    ``building``) and its scratch tensors in the default dtype (float64 inside the block)."""
    old_tensor, old_default = torch.tensor, torch.get_default_dtype()

    def tensor64(*args, **kwargs):
        if kwargs.get("dtype") is torch.float32:
            kwargs["dtype"] = torch.float64
        return old_tensor(*args, **kwargs)

    if building:
        torch.tensor = tensor64
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.tensor = old_tensor
        torch.set_default_dtype(old_default)


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        yield


def models(key: str, dtype: torch.dtype):
    """A fresh DRM model and the facade of the same URDF in ``dtype``."""
    with quiet(), (drm_float64(building=True) if dtype == torch.float64 else contextlib.nullcontext()):
        ref = DrmModel(path(key))
    with quiet():
        ours = drm.DifferentiableRobotModel(path(key), dtype=dtype)
    return ref, ours


def in_dtype(dtype):
    return drm_float64() if dtype == torch.float64 else contextlib.nullcontext()


def assert_close(ours, ref, tol, what=""):
    if isinstance(ref, (tuple, list)):
        assert len(ours) == len(ref), what
        for k, (a, b) in enumerate(zip(ours, ref)):
            assert_close(a, b, tol, f"{what}[{k}]")
        return
    assert ours.shape == ref.shape and ours.dtype == ref.dtype, (what, ours.shape, ref.shape, ours.dtype, ref.dtype)
    scale = max(1.0, float(ref.detach().abs().max())) if ref.numel() else 1.0
    err = float((ours.detach() - ref.detach()).abs().max()) if ref.numel() else 0.0
    assert err <= tol * scale, f"{what}: {err:.3e} > {tol:.0e} x {scale:.3g}"


def states(n: int, batch, dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [2 * torch.rand(*batch, n, generator=g, dtype=dtype) - 1 for _ in range(3)]


# ----------------------------------------------------------------------------- the facade = DRM
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("key", robot_params(fast=("2link", "iiwa")))
def test_every_method_matches_drm(key, dtype):
    ref, ours = models(key, dtype)
    tol = TOL[dtype]
    n = ref._n_dofs
    assert ours._n_dofs == n and ours._controlled_joints == ref._controlled_joints
    assert ours.get_link_names() == ref.get_link_names()
    assert ours.get_joint_limits() == ref.get_joint_limits()
    for b_ref, b_ours in zip(ref._bodies, ours._bodies):
        assert (b_ours.name, b_ours.joint_idx) == (b_ref.name, b_ref.joint_idx)
        if b_ref.joint_idx is not None:
            assert_close(b_ours.get_joint_damping_const(), b_ref.get_joint_damping_const(), tol, "damping")
    q, qd, qdd = states(n, (4,), dtype)
    with in_dtype(dtype):
        # DRM's all-links FK reads its bodies' poses, which its other methods overwrite: call it first.
        all_ref = ref.compute_forward_kinematics_all_links(q)
        all_ours = ours.compute_forward_kinematics_all_links(q)
        assert list(all_ours) == list(all_ref)
        for link in all_ref:
            pos, quat = all_ref[link]
            assert_close(all_ours[link], (pos.expand(4, 3), quat.expand(4, 4)), tol, f"all links {link}")
        for link in ROBOTS[key][1]:
            for rec in (False, True):
                assert_close(ours.compute_forward_kinematics(q, link, recursive=rec),
                             ref.compute_forward_kinematics(q, link), tol, f"fk {link}")
            assert_close(ours.compute_endeffector_jacobian(q, link), ref.compute_endeffector_jacobian(q, link), tol,
                         f"jacobian {link}")
        assert_close(ours.compute_lagrangian_inertia_matrix(q), ref.compute_lagrangian_inertia_matrix(q), tol, "M")
        for g in (True, False):
            for d in (True, False):
                flags = f"gravity={g}, damping={d}"
                assert_close(ours.compute_inverse_dynamics(q, qd, qdd, g, d),
                             ref.compute_inverse_dynamics(q, qd, qdd, g, d), tol, f"inverse dynamics {flags}")
                assert_close(ours.compute_non_linear_effects(q, qd, g, d),
                             ref.compute_non_linear_effects(q, qd, g, d), tol, f"non-linear effects {flags}")
                f = qdd.clone()
                assert_close(ours.compute_forward_dynamics(q, qd, f, g, d),
                             ref.compute_forward_dynamics(q, qd, qdd.clone(), g, d), tol, f"forward dynamics {flags}")
                assert torch.equal(f, qdd)  # DRM subtracts the damping from its argument; the facade does not
        # unbatched inputs give unbatched outputs, as in DRM
        link = ROBOTS[key][1][0]
        for name, args in [("compute_forward_kinematics", (q[0], link)), ("compute_endeffector_jacobian", (q[0], link)),
                           ("compute_inverse_dynamics", (q[0], qd[0], qdd[0])),
                           ("compute_lagrangian_inertia_matrix", (q[0],)),
                           ("compute_forward_dynamics", (q[0], qd[0], qdd[0]))]:
            assert_close(getattr(ours, name)(*args), getattr(ref, name)(*args), tol, f"unbatched {name}")


def test_defaults_match_drm():
    """float32 by default; forward dynamics leaves damping out unless asked, the others include it."""
    ref, ours = models("2link", torch.float32)
    q, qd, f = states(2, (3,), torch.float32, seed=1)
    assert ours.compute_inverse_dynamics(q, qd, f).dtype == torch.float32
    assert_close(ours.compute_forward_dynamics(q, qd, f), ref.compute_forward_dynamics(q, qd, f.clone()), 1e-5)
    assert_close(ours.compute_inverse_dynamics(q, qd, f), ref.compute_inverse_dynamics(q, qd, f), 1e-5)
    damped = ours.compute_inverse_dynamics(q, qd, f) - ours.compute_inverse_dynamics(q, qd, f, use_damping=False)
    assert_close(damped, 0.5 * qd, 1e-6)  # <dynamics damping="0.5"> on both joints


def test_joint_order_follows_the_urdf_order_of_links(tmp_path):
    """Links listed out of depth-first order: DRM numbers the joints by their child link in the file,
    the facade maps that order onto diffmech's and back."""
    def link(name, mass):
        return (f'<link name="{name}"><inertial><origin xyz="0.1 0 0.05"/><mass value="{mass}"/>'
                f'<inertia ixx="0.01" ixy="0.001" ixz="0" iyy="0.02" iyz="0" izz="0.015"/></inertial></link>')

    def joint(name, parent, child, xyz, axis):
        return (f'<joint name="{name}" type="revolute"><parent link="{parent}"/><child link="{child}"/>'
                f'<origin xyz="{xyz}" rpy="0.1 0 0.2"/><axis xyz="{axis}"/>'
                f'<limit lower="-2" upper="2" effort="10" velocity="3"/><dynamics damping="0.3"/></joint>')

    urdf = tmp_path / "tree.urdf"
    urdf.write_text(
        '<robot name="tree">' + link("base", 1) + link("a1", 1.5) + link("b1", 0.7) + link("a2", 1.1) + link("b2", 0.4)
        + joint("ja2", "a1", "a2", "0.3 0 0", "0 1 0") + joint("jb1", "base", "b1", "0 0.2 0.1", "1 0 0")
        + joint("ja1", "base", "a1", "0 0 0.2", "0 0 1") + joint("jb2", "b1", "b2", "0.2 0 0", "0 0 -1") + "</robot>")
    with quiet():
        ref = DrmModel(str(urdf))
        ours = drm.DifferentiableRobotModel(str(urdf))
    assert ours._to_native is not None  # the orders differ, so the mapping is exercised
    q, qd, qdd = states(4, (3,), torch.float32, seed=2)
    assert_close(ours.compute_inverse_dynamics(q, qd, qdd), ref.compute_inverse_dynamics(q, qd, qdd), 1e-5)
    assert_close(ours.compute_lagrangian_inertia_matrix(q), ref.compute_lagrangian_inertia_matrix(q), 1e-5)
    assert_close(ours.compute_forward_dynamics(q, qd, qdd, use_damping=True),
                 ref.compute_forward_dynamics(q, qd, qdd.clone(), use_damping=True), 1e-5)
    assert_close(ours.compute_endeffector_jacobian(q, "b2"), ref.compute_endeffector_jacobian(q, "b2"), 1e-5)


# ----------------------------------------------------------------------------- gradients and learning
LEARN = [("iiwa_link_1", "mass", "PositiveScalar", {}),
         ("iiwa_link_1", "inertia_mat", "SymmPosDef3DInertiaMatrixNet", {}),
         ("iiwa_link_1", "trans", "UnconstrainedTensor", {"dim1": 1, "dim2": 3}),
         ("iiwa_link_3", "com", "UnconstrainedTensor", {"dim1": 1, "dim2": 3}),
         ("iiwa_link_4", "rot_angles", "UnconstrainedTensor", {"dim1": 1, "dim2": 3})]


def _learnable_pair(dtype, seed=0):
    ref, ours = models("iiwa", dtype)
    with in_dtype(dtype):
        for model, params in ((ref, drm_params), (ours, rigid_body_params)):
            torch.manual_seed(seed)
            for link, name, cls, kwargs in LEARN:
                model.make_link_param_learnable(link, name, getattr(params, cls)(**kwargs))
    return ref, ours


def _sources(model) -> list[torch.Tensor]:
    """The tensors of the parametrizations of :data:`LEARN`, in its order (DRM's or the facade's)."""
    out = []
    for link, name, _, _ in LEARN:
        if isinstance(model, DrmModel):
            body = model._bodies[model._name_to_idx_map[link]]
            module = getattr(body.inertia if name in ("mass", "com", "inertia_mat") else body, name)
        else:
            owner, attr = model.robot.param_owner(link, name)
            module = owner.parametrizations[attr][0].source
        out += list(module.parameters())
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_gradients_match_drm(dtype):
    """Same seed, same parametrizations: the same initial values and the same gradients w.r.t. the
    parametrizations' tensors and the state, through inverse and forward dynamics and kinematics."""
    ref, ours = _learnable_pair(dtype)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    p_ref, p_ours = _sources(ref), _sources(ours)
    assert len(p_ours) == len(list(ours.parameters())) == len(list(ref.parameters()))
    assert [tuple(p.shape) for p in p_ours] == [tuple(p.shape) for p in p_ref]
    for a, b in zip(p_ours, p_ref):
        assert torch.equal(a, b)
    q0, qd0, u0 = states(7, (5,), dtype, seed=3)
    for which in ("id", "fd", "fk"):
        grads = []
        for model in (ours, ref):
            q = q0.clone().requires_grad_()
            params = p_ours if model is ours else p_ref
            for p in params:
                p.grad = None
            with in_dtype(dtype):
                if which == "id":
                    out = model.compute_inverse_dynamics(q, qd0, u0)
                elif which == "fd":
                    out = model.compute_forward_dynamics(q, qd0, u0.clone(), use_damping=True)
                else:
                    # positions only: DRM's quaternion scales by a Python float (math.sqrt of a
                    # tensor), which cuts that factor out of its gradient; the facade's is checked below
                    out = model.compute_forward_kinematics(q, "iiwa_link_ee")[0]
                (out * torch.linspace(0.5, 1.5, out.shape[-1], dtype=dtype)).square().sum().backward()
            grads.append([q.grad] + [torch.zeros_like(p) if p.grad is None else p.grad for p in params])
        for k, (a, b) in enumerate(zip(*grads)):
            assert_close(a, b, tol, f"{which}: gradient {k}")


def test_quaternion_gradient_is_exact():
    """The facade's orientation output differentiates correctly (central differences, float64)."""
    _, ours = models("iiwa", torch.float64)
    q = states(7, (2,), torch.float64, seed=6)[0].requires_grad_()
    assert torch.autograd.gradcheck(lambda x: ours.compute_forward_kinematics(x, "iiwa_link_ee")[1], (q,))


def test_training_loop_matches_drm_step_by_step():
    """An identification loop (Adam on inverse dynamics, symmetric inertia parametrization) takes the
    same steps on the facade as on DRM (float64: the two agree to round-off at every step)."""
    ref, ours = _learnable_pair(torch.float64, seed=4)
    with quiet():
        gt = drm.DifferentiableKUKAiiwa(dtype=torch.float64)  # the same torques as DRM's (tested above)
    q, qd, qdd = states(7, (16,), torch.float64, seed=8)
    tau_gt = gt.compute_inverse_dynamics(q, qd, qdd)
    with drm_float64():
        losses = {}
        for model in (ref, ours):
            opt = torch.optim.Adam(model.parameters(), lr=1e-2)
            losses[model is ours] = []
            for _ in range(4):
                opt.zero_grad()
                tau = model.compute_inverse_dynamics(q, qd, qdd)
                loss = ((tau - tau_gt) ** 2 / tau_gt.var(dim=0)).mean()
                loss.backward()
                opt.step()
                losses[model is ours].append(float(loss))
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-8)
    assert losses[True][-1] < losses[True][0]


def _nmse(pred, target, var):
    return ((pred - target) ** 2 / var).mean()


@pytest.mark.parametrize("task", ["inverse_dynamics", pytest.param("forward_dynamics", marks=pytest.mark.slow)])
def test_drm_dynamics_example_loops_run_on_the_facade(task):
    """DRM's learn_dynamics_iiwa / learn_forward_dynamics_iiwa: link 1's mass (PositiveScalar), inertia
    (UnconstrainedTensor 3x3) and translation or centre of mass, from sine-motion data of the
    ready-made iiwa, Adam, batches of 100; a few epochs, the loss falls."""
    torch.manual_seed(0)
    np.random.seed(1)
    with quiet():
        model = drm.DifferentiableRobotModel(path("iiwa"), name="kuka_iiwa")
        gt = drm.DifferentiableKUKAiiwa()
        gt.print_link_names()
    model.make_link_param_learnable("iiwa_link_1", "mass", drm.PositiveScalar())
    second = "trans" if task == "inverse_dynamics" else "com"
    model.make_link_param_learnable("iiwa_link_1", second, drm.UnconstrainedTensor(dim1=1, dim2=3))
    model.make_link_param_learnable("iiwa_link_1", "inertia_mat", drm.UnconstrainedTensor(dim1=3, dim2=3))
    make = (drm.generate_sine_motion_inverse_dynamics_data if task == "inverse_dynamics"
            else drm.generate_sine_motion_forward_dynamics_data)
    data = make(gt, n_data=500, dt=1.0 / 250.0, freq=0.1)  # 2 s: int(n_data dt) must exceed 1
    loader = torch.utils.data.DataLoader(dataset=data, batch_size=100, shuffle=False)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    epochs = []
    for _ in range(4):
        losses = []
        for q, qd, qdd, tau in loader:
            opt.zero_grad()
            if task == "inverse_dynamics":
                loss = _nmse(model.compute_inverse_dynamics(q=q, qd=qd, qdd_des=qdd, include_gravity=True), tau,
                             data.var())
            else:
                loss = _nmse(model.compute_forward_dynamics(q=q, qd=qd, f=tau, include_gravity=True, use_damping=True),
                             qdd, data.var())
            loss.backward()
            opt.step()
            losses.append(loss.item())
        epochs.append(np.mean(losses))
    assert all(np.isfinite(epochs)) and epochs[-1] < 0.5 * epochs[0], epochs
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        model.print_learnable_params()
    second = "iiwa_joint_1.origin_xyz.param" if task == "inverse_dynamics" else "iiwa_link_1.com.param"
    assert "iiwa_link_1.mass.l:" in out.getvalue() and second in out.getvalue()


@pytest.mark.parametrize("robot", [pytest.param("iiwa", marks=pytest.mark.slow), "toy"])
def test_drm_kinematics_example_loops_run_on_the_facade(robot):
    """DRM's learn_kinematics_of_iiwa / learn_kinematics_of_toy (Adam, learning rate raised from 1e-3 to
    1e-2 for 50 steps instead of 3000): joint translations (and rotations) from end-effector positions;
    the toy freezes arm1's translation at step 10 and unfreezes it at step 30."""
    torch.manual_seed(0)
    np.random.seed(1)
    with quiet():
        if robot == "iiwa":
            model, gt, ee = drm.DifferentiableRobotModel(path("iiwa"), "kuka_iiwa"), drm.DifferentiableKUKAiiwa(), \
                "iiwa_link_ee"
            learn = [("iiwa_link_1", "trans"), ("iiwa_link_1", "rot_angles")]
        else:
            model = drm.DifferentiableRobotModel(urdf_path=path("2link"), name="2link")
            gt, ee = drm.DifferentiableTwoLinkRobot(), "endEffector"
            learn = [("arm1", "trans"), ("arm2", "trans")]
    for link, name in learn:
        model.make_link_param_learnable(link, name, drm.UnconstrainedTensor(dim1=1, dim2=3))
    data = drm.generate_random_forward_kinematics_data(gt, n_data=100, ee_name=ee)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    frozen_trans = None
    for i in range(50):
        opt.zero_grad()
        pos, _ = model.compute_forward_kinematics(q=data["q"], link_name=ee)
        loss = torch.nn.functional.mse_loss(pos, data["ee_pos"])
        if robot == "toy" and i == 10:
            model.freeze_learnable_link_param(link_name="arm1", parameter_name="trans")
            frozen_trans = model._bodies[1].trans().detach().clone()
        if robot == "toy" and i == 30:
            assert torch.equal(model._bodies[1].trans(), frozen_trans)  # not trained while frozen
            model.unfreeze_learnable_link_param(link_name="arm1", parameter_name="trans")
        loss.backward()
        opt.step()
        losses.append(float(loss))
    assert np.isfinite(losses).all() and losses[-1] < 0.5 * losses[0], losses[::10]
    if robot == "toy":
        assert not torch.equal(model._bodies[1].trans(), frozen_trans)


# ----------------------------------------------------------------------------- parametrizations and data
def _spd(seed):
    """A physical rotational inertia: principal moments within the triangle inequality, rotated."""
    from diffmech import spatial

    g = torch.Generator().manual_seed(seed)
    R = spatial.so3_exp(torch.randn(3, generator=g, dtype=torch.float64)).float()
    J = torch.tensor([0.02, 0.03, 0.04]) * (1 + 0.2 * torch.rand(3, generator=g))
    return (R * J) @ R.T


@pytest.mark.parametrize("name,kwargs", [
    ("UnconstrainedScalar", {}),
    ("PositiveScalar", {}),
    ("PositiveScalar", {"min_val": 0.2, "init_param_std": 0.3}),
    ("PositiveScalar", {"min_val": 0.1, "init_param": torch.tensor(2.5)}),
    ("UnconstrainedTensor", {"dim1": 3, "dim2": 3}),
    ("UnconstrainedTensor", {"dim1": 1, "dim2": 3, "init_tensor": torch.tensor([[0.1, -0.2, 0.3]])}),
    ("SymmPosDef3DInertiaMatrixNet", {}),
    ("SymmPosDef3DInertiaMatrixNet", {"bias": 1e-4, "init_param": _spd(0)}),
    ("CovParameterized3DInertiaMatrixNet", {}),
    ("CovParameterized3DInertiaMatrixNet", {"init_param": _spd(1)}),
    ("Symm3DInertiaMatrixNet", {}),
    ("Symm3DInertiaMatrixNet", {"init_param": _spd(2)[None]}),
])
def test_parametrizations_match_drm(name, kwargs):
    """Same seed, same arguments: the same tensors, the same value, the same gradient."""
    out = []
    for module in (drm_params, rigid_body_params):
        torch.manual_seed(7)
        m = getattr(module, name)(**kwargs)
        value = m()
        (value * torch.arange(1.0, value.numel() + 1).reshape(value.shape)).sum().backward()
        out.append((value.detach(), [p.detach().clone() for p in m.parameters()], [p.grad for p in m.parameters()]))
    (v_ref, p_ref, g_ref), (v_ours, p_ours, g_ours) = out
    assert v_ours.shape == v_ref.shape
    torch.testing.assert_close(v_ours, v_ref, rtol=1e-6, atol=1e-9)
    for a, b in zip(p_ours + g_ours, p_ref + g_ref):
        torch.testing.assert_close(a.reshape(b.shape), b, rtol=1e-5, atol=1e-7)
    if "init_param" in kwargs and "InertiaMatrix" in name:
        torch.testing.assert_close(v_ours, kwargs["init_param"].reshape(3, 3), rtol=1e-5, atol=1e-6)


def test_triangle_parametrization_is_physical_and_starts_at_its_initial_inertia():
    """DRM 0.2.3 cannot construct TriangParam3DInertiaMatrixNet; the facade's keeps the principal moments
    within the triangle inequality for every parameter value and reproduces an initial inertia."""
    with pytest.raises(TypeError):
        drm_params.TriangParam3DInertiaMatrixNet(bias=1e-5)
    torch.manual_seed(0)
    m = rigid_body_params.TriangParam3DInertiaMatrixNet(bias=1e-5)
    for _ in range(20):
        with torch.no_grad():
            for p in m.parameters():
                p.add_(torch.randn_like(p))
        J = torch.linalg.eigvalsh(m().double())
        assert J[0] > 0 and J[2] <= J[0] + J[1] + 1e-12
    I0 = _spd(3)
    m = rigid_body_params.TriangParam3DInertiaMatrixNet(bias=1e-5, init_param=I0)
    torch.testing.assert_close(m(), I0, rtol=1e-4, atol=1e-7)
    m().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in m.parameters())
    with pytest.raises(ModelError, match="triangle"):
        rigid_body_params.TriangParam3DInertiaMatrixNet(bias=1e-5, init_param=torch.diag(torch.tensor([1.0, 0.2, 0.2])))


def test_data_helpers_match_drm():
    """The same seeds give the same states; the torques are the two models' (equal to float32 round-off)."""
    with quiet():
        gt_ref = DrmModel(path("iiwa"))
        gt_ours = drm.DifferentiableKUKAiiwa()
    for name, args in [("generate_sine_motion_inverse_dynamics_data", (300, 1 / 250, 0.05)),
                       ("generate_sine_motion_forward_dynamics_data", (300, 1 / 250, 0.1)),
                       ("generate_random_inverse_dynamics_data", (50,))]:
        got = []
        for module, gt in ((drm_data, gt_ref), (data_utils, gt_ours)):
            np.random.seed(3)
            torch.manual_seed(3)
            ds = getattr(module, name)(gt, *args)
            got.append((ds.data, ds.var(), len(ds), ds[5]))
        (d_ref, var_ref, n_ref, item_ref), (d_ours, var_ours, n_ours, item_ours) = got
        assert n_ours == n_ref and type(var_ours) is torch.Tensor
        for k in ("q", "qd", "qdd_des"):
            assert torch.equal(d_ours[k], d_ref[k]), (name, k)
        assert_close(d_ours["tau"], d_ref["tau"], 1e-5, name)
        assert_close(var_ours, var_ref, 1e-4, name)
        assert_close(item_ours, item_ref, 1e-5, name)
    np.random.seed(4)
    fk_ref = drm_data.generate_random_forward_kinematics_data(gt_ref, 40, "iiwa_link_ee")
    np.random.seed(4)
    fk_ours = data_utils.generate_random_forward_kinematics_data(gt_ours, 40, "iiwa_link_ee")
    assert torch.equal(fk_ours["q"], fk_ref["q"])
    assert_close(fk_ours["ee_pos"], fk_ref["ee_pos"], 1e-5)


# ----------------------------------------------------------------------------- the rest of the API
def test_learnable_parameter_api():
    with quiet():
        model = drm.DifferentiableKUKAiiwa()
    with pytest.raises(AttributeError):  # DRM raises AttributeError for an unknown name
        model.make_link_param_learnable("iiwa_link_1", "colour", drm.PositiveScalar())
    with pytest.raises(ModelError, match="not a learnable"):
        model.freeze_learnable_link_param("iiwa_link_2", "mass")
    model.make_link_param_learnable("iiwa_link_2", "mass", drm.PositiveScalar(init_param=torch.tensor(4.0)))
    model.make_link_param_learnable("iiwa_link_2", "joint_damping", drm.PositiveScalar(min_val=0.1))
    names = set(model.robot.learnable_parameters(readable=True))
    assert names == {"iiwa_link_2.mass.l", "iiwa_joint_2.damping.l"}
    assert float(model.robot.link_params("iiwa_link_2").mass) == pytest.approx(4.0)
    assert float(model._bodies[2].get_joint_damping_const()) >= 0.1
    model.freeze_learnable_link_param("iiwa_link_2", "mass")
    assert set(model.robot.learnable_parameters(readable=True)) == {"iiwa_joint_2.damping.l"}
    model.unfreeze_learnable_link_param("iiwa_link_2", "mass")
    assert "iiwa_link_2.mass.l" in model.robot.learnable_parameters(readable=True)
    # a diffmech parametrization (forward(raw)) starts at the current value
    before = model.robot.link_params("iiwa_link_3").inertia.clone()
    from diffmech.model.params import SymmetricPositiveDefinite

    model.make_link_param_learnable("iiwa_link_3", "inertia_mat", SymmetricPositiveDefinite())
    torch.testing.assert_close(model.robot.link_params("iiwa_link_3").inertia, before, rtol=1e-5, atol=1e-7)


def test_state_dict_round_trip_with_drm_parametrizations():
    """A checkpoint of a model trained through DRM-style parametrizations loads into one made learnable
    the same way (other random starts) and gives the same outputs; into a plain model it gives the values."""
    _, a = _learnable_pair(torch.float32, seed=0)
    _, b = _learnable_pair(torch.float32, seed=1)
    q, qd, qdd = states(7, (3,), torch.float32)
    assert not torch.allclose(a.compute_inverse_dynamics(q, qd, qdd), b.compute_inverse_dynamics(q, qd, qdd))
    b.load_state_dict(a.state_dict())
    assert torch.equal(a.compute_inverse_dynamics(q, qd, qdd), b.compute_inverse_dynamics(q, qd, qdd))
    with quiet():
        plain = drm.DifferentiableKUKAiiwa()
    plain.load_state_dict(a.state_dict())
    assert_close(plain.compute_inverse_dynamics(q, qd, qdd), a.compute_inverse_dynamics(q, qd, qdd), 1e-5)
    with pytest.raises(ModelError, match="cannot be set from a value"):
        b.load_state_dict(plain.state_dict())
    # copies and pickles, gravity-free calls included
    ref = a.compute_inverse_dynamics(q, qd, qdd, include_gravity=False)
    buf = io.BytesIO()
    torch.save(a, buf)
    buf.seek(0)
    for c in (copy.deepcopy(a), pickle.loads(pickle.dumps(a)), torch.load(buf, weights_only=False)):
        assert torch.equal(c.compute_inverse_dynamics(q, qd, qdd, include_gravity=False), ref)
        assert c._bodies[1]._model is c


def test_kinematic_state_and_newton_euler():
    """``iterative_newton_euler`` after ``update_kinematic_state``: the joint forces of zero acceleration
    without damping under the base acceleration (gravity is (0, 0, 9.81) upwards)."""
    ref, ours = models("iiwa", torch.float32)
    q, qd, qdd = states(7, (3,), torch.float32, seed=5)
    with pytest.raises(ModelError):
        ours.iterative_newton_euler(torch.tensor([0.0, 0, 9.81, 0, 0, 0]))
    ours.update_kinematic_state(q, qd)
    tau = ours.iterative_newton_euler(torch.tensor([0.0, 0.0, 9.81, 0.0, 0.0, 0.0]), qdd)
    assert_close(tau, ref.compute_inverse_dynamics(q, qd, qdd, use_damping=False), 1e-5)
    tau0 = ours.iterative_newton_euler(torch.zeros(3, 6))
    assert_close(tau0, ref.compute_non_linear_effects(q, qd, include_gravity=False, use_damping=False), 1e-5)
    with pytest.raises(ModelError, match="angular"):
        ours.iterative_newton_euler(torch.tensor([0.0, 0, 9.81, 1.0, 0, 0]))


def test_ready_made_robots():
    expect = {"DifferentiableKUKAiiwa": 7, "DifferentiableFrankaPanda": 7, "DifferentiableTwoLinkRobot": 2,
              "DifferentiableTrifingerEdu": 9, "DifferentiableAllegroHand": 16, "DifferentiableFetchArm": 7,
              "DifferentiableKinovaJaco": 12}
    for cls_name, n in expect.items():
        with quiet():
            model = getattr(drm, cls_name)()
        assert model._n_dofs == n and os.path.exists(model.urdf_path) and model.name
        assert model.compute_inverse_dynamics(*states(n, (2,), torch.float32)).shape == (2, n)
    with quiet():
        ref = DrmModel(os.path.join(BASE, "panda_description/urdf/panda_no_gripper.urdf"))
        ours = drm.DifferentiableFrankaPanda()
    q = states(7, (2,), torch.float32)[0]
    assert_close(ours.compute_forward_kinematics(q, "panda_virtual_ee_link"),
                 ref.compute_forward_kinematics(q, "panda_virtual_ee_link"), 1e-5)


def test_quaternion_sign_follows_drm_in_every_branch():
    """The pivot of the conversion (w, x, y or z largest) decides the sign; all four branches occur."""
    from differentiable_robot_model.spatial_vector_algebra import CoordinateTransform

    from diffmech import spatial
    from diffmech.compat.drm.robot_model import _drm_quaternion

    g = torch.Generator().manual_seed(0)
    axes = torch.randn(400, 3, generator=g, dtype=torch.float64)
    angle = torch.rand(400, 1, generator=g, dtype=torch.float64) * 2 * np.pi
    R = spatial.so3_exp(axes / axes.norm(dim=-1, keepdim=True) * angle).float()
    with quiet():
        ref = CoordinateTransform(rot=R, trans=torch.zeros(400, 3)).get_quaternion()
    ours = _drm_quaternion(R)
    torch.testing.assert_close(ours, ref, rtol=0, atol=1e-6)
    pivot = torch.stack([R.diagonal(dim1=-2, dim2=-1).sum(-1), *R.diagonal(dim1=-2, dim2=-1).unbind(-1)], -1)
    assert len(set(pivot.argmax(-1).tolist())) == 4


# ----------------------------------------------------------------------------- PyBullet, as DRM's own tests
@pytest.mark.parametrize("key", robot_params(fast=("2link", "iiwa", "allegro", "trifinger")))
def test_matches_pybullet_where_drm_tests_do(key):
    """Link poses, Jacobians, inverse dynamics (damping removed), mass matrices and one simulation step
    of forward dynamics, on DRM's sampling (joints within limits, 1% of the velocity limits)."""
    p = pytest.importorskip("pybullet")
    with quiet():
        model = drm.DifferentiableRobotModel(path(key))
    n = model._n_dofs
    pc = p.connect(p.DIRECT)
    try:
        body = p.loadURDF(path(key), basePosition=[0, 0, 0], useFixedBase=True, flags=p.URDF_USE_INERTIA_FROM_FILE,
                          physicsClientId=pc)
        p.setGravity(0, 0, -9.81, physicsClientId=pc)
        n_joints = p.getNumJoints(body, physicsClientId=pc)
        damping = [float(model._bodies[i + 1].get_joint_damping_const()) for i in range(n_joints)]
        rng = np.random.default_rng(0)
        lim = model.get_joint_limits()
        lo, hi = np.array([j["lower"] for j in lim]), np.array([j["upper"] for j in lim])
        vmax = 0.01 * np.array([j["velocity"] for j in lim])
        B = 3
        qs, vs = rng.uniform(lo, hi, (B, n)), rng.uniform(-vmax, vmax, (B, n))
        accs = 10 * rng.uniform(-vmax, vmax, (B, n))
        joints = [i - 1 for i in model._controlled_joints]

        def set_state(qi, vi):
            for k, j in enumerate(joints):
                p.resetJointState(body, j, qi[k], vi[k], physicsClientId=pc)

        qt, vt, at = (torch.tensor(x, dtype=torch.float32) for x in (qs, vs, accs))
        for link in ROBOTS[key][1]:
            idx = model._name_to_idx_map[link] - 1
            pos, quat = model.compute_forward_kinematics(qt, link)
            lin, ang = model.compute_endeffector_jacobian(qt, link)
            for b in range(B):
                set_state(qs[b], vs[b])
                state = p.getLinkState(body, idx, computeForwardKinematics=1, physicsClientId=pc)
                np.testing.assert_allclose(pos[b].numpy(), state[4], atol=2e-6)
                np.testing.assert_allclose(quat[b].numpy(), state[5], atol=2e-6)
                jl, ja = p.calculateJacobian(body, idx, [0, 0, 0], list(qs[b]), list(vs[b]), [0.0] * n,
                                             physicsClientId=pc)
                np.testing.assert_allclose(lin[b].numpy(), np.array(jl), atol=2e-6)
                np.testing.assert_allclose(ang[b].numpy(), np.array(ja), atol=2e-6)
        tau = model.compute_inverse_dynamics(qt, vt, at, include_gravity=True, use_damping=True)
        d = torch.tensor([damping[j] for j in joints])
        M = model.compute_lagrangian_inertia_matrix(qt)
        bullet_tau = []
        for b in range(B):
            set_state(qs[b], vs[b])
            bt = np.array(p.calculateInverseDynamics(body, list(qs[b]), list(vs[b]), list(accs[b]), physicsClientId=pc))
            bullet_tau.append(bt)
            np.testing.assert_allclose((tau[b] - d * vt[b]).numpy(), bt, atol=1e-5, rtol=1e-5)
            Mb = np.array(p.calculateMassMatrix(body, list(qs[b]), physicsClientId=pc))
            np.testing.assert_allclose(M[b].numpy(), Mb, rtol=1e-4, atol=1e-6)
        # one step of Bullet's simulation under the torques of the sampled accelerations
        dt = 1.0 / 240.0
        for use_damping in (False, True):
            for i in range(n_joints):
                # two calls: setting maxJointVelocity in the same call loses the damping setting
                p.changeDynamics(body, i, linearDamping=0.0, angularDamping=0.0,
                                 jointDamping=damping[i] if use_damping else 0.0, physicsClientId=pc)
                p.changeDynamics(body, i, maxJointVelocity=200, physicsClientId=pc)
            qdd_bullet = []
            for b in range(B):
                p.setJointMotorControlArray(body, joints, p.VELOCITY_CONTROL, forces=np.zeros(n), physicsClientId=pc)
                set_state(qs[b], vs[b])
                p.setJointMotorControlArray(body, joints, p.TORQUE_CONTROL, forces=bullet_tau[b], physicsClientId=pc)
                p.stepSimulation(physicsClientId=pc)
                v_next = np.array([s[1] for s in p.getJointStates(body, joints, physicsClientId=pc)])
                qdd_bullet.append((v_next - vs[b]) / dt)
            qdd = model.compute_forward_dynamics(qt, vt, torch.tensor(np.array(bullet_tau), dtype=torch.float32),
                                                 include_gravity=True, use_damping=use_damping)
            np.testing.assert_allclose(qdd.numpy(), np.array(qdd_bullet), rtol=1e-2, atol=1e-3)
            if not use_damping:
                np.testing.assert_allclose(qdd.numpy(), accs, rtol=1e-2, atol=1e-3)
    finally:
        p.disconnect(pc)


def test_bodies_follow_the_model_to_another_dtype():
    from diffmech.compat.drm import DifferentiableKUKAiiwa

    model = DifferentiableKUKAiiwa()
    assert model._bodies[2].joint_axis.dtype == torch.float32
    torch.testing.assert_close(model._bodies[2].joint_axis, torch.tensor([[0.0, 0.0, 1.0]]))
    model.to(torch.float64)
    assert model._bodies[2].joint_axis.dtype == torch.float64
