"""Every implementation of the rigid-body algorithms against Pinocchio, for every feature.

Implementations: the batch-last torch code (``torch``), the lane programs run eagerly (``lanes``),
the native kernels (``native``) and the torch code under torch.compile (``compile``, slow).
Features: fixed and floating base, joint damping and springs (``passive``), external forces
(``f_ext``) and both. Pinocchio has no joint springs: its results get the passive terms added
analytically (``tau += d v + k (q - rest)``; forward dynamics with ``tau - d v - k (q - rest)``).

The reverse passes -- the hand-written RNEA VJP, the native reverse-mode kernels and autograd
through the torch code -- are checked against Pinocchio's ``computeRNEADerivatives`` on fixed
bases, and against central differences where Pinocchio's conventions differ (a floating base's
tangent space; external forces fixed in the world instead of in the link frame).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import get_robot, random_state, robot_path
from diffmech.dynamics import compiled, kernels, lanes, native
from diffmech.dynamics._common import tree_state
from diffmech.dynamics.aba import aba_flat
from diffmech.dynamics.crba import crba_flat
from diffmech.dynamics.rnea import rnea_flat
from diffmech.dynamics.rnea_vjp import rnea_vjp_bl

pin = pytest.importorskip("pinocchio")
from oracle import PinOracle, rel_err  # noqa: E402

slow = pytest.mark.slow
needs_cc = pytest.mark.skipif(not native.available(), reason="no C compiler for native kernels")
IMPLS = ["torch", "lanes", pytest.param("native", marks=needs_cc), pytest.param("compile", marks=[needs_cc, slow])]
ROBOTS = ["prismatic_mix", "floating_pair", pytest.param("branching_tree_free", marks=slow),
          pytest.param("iiwa", marks=slow), pytest.param("humanoid", marks=slow)]
FEATURES = ["plain", "passive", "f_ext", "passive+f_ext"]
B = 3


def _robot(key: str):
    """The test robot with joint damping, springs and rest angles set (so `passive` changes results)."""
    base = get_robot("branching_tree" if key == "branching_tree_free" else key)
    if key == "branching_tree_free":
        import warnings

        import diffmech

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            base = diffmech.load_urdf(robot_path("branching_tree"), floating_base=True)
    robot = copy.deepcopy(base)
    for k, name in enumerate(robot.joint_names):
        jp = robot.joint_params(name)
        jp.damping.data.fill_(0.1 * (k + 1))
        jp.stiffness.data.fill_(1.5 + 0.5 * k)
        jp.rest.data.fill_(0.1 * k - 0.2)
    path = robot_path("branching_tree" if key == "branching_tree_free" else key)
    return robot, PinOracle(robot, path)


@pytest.fixture(scope="module", params=ROBOTS)
def case(request):
    return (request.param, *_robot(request.param))


def _passive(robot, q, v):
    """``d v + k (q - rest)`` per generalised coordinate (zero on a floating base), ``(B, nv)``."""
    d = torch.stack([robot.joint_params(n).damping for n in robot.joint_names])
    k = torch.stack([robot.joint_params(n).stiffness for n in robot.joint_names])
    r = torch.stack([robot.joint_params(n).rest for n in robot.joint_names])
    j0, v0 = (7, 6) if robot.floating_base else (0, 0)
    tj = d * v[:, v0:] + k * (q[:, j0:] - r)
    return torch.cat([torch.zeros(q.shape[0], v0, dtype=q.dtype), tj], dim=1)


def _impl(impl, robot, algorithm, q, v, x, f, passive):
    tree, mt = robot.tree, robot.model_tensors()
    if impl == "torch":
        fn = {"inverse_dynamics": rnea_flat, "forward_dynamics": aba_flat}
        if algorithm == "mass_matrix":
            return crba_flat(tree, mt, q)
        return fn[algorithm](tree, mt, q, v, x, f, passive)
    if impl == "lanes":
        fT = None if f is None else f.reshape(f.shape[0], -1).T
        if algorithm == "mass_matrix":
            return lanes.crba_lanes(tree, mt, q.T).permute(2, 0, 1)
        fn = lanes.rnea_lanes if algorithm == "inverse_dynamics" else lanes.aba_lanes
        return fn(tree, mt, q.T, v.T, x.T, passive, fT).T
    if impl == "native":
        with kernels.native_mode("build"):
            if algorithm == "mass_matrix":
                return robot.mass_matrix(q)
            fn = robot.inverse_dynamics if algorithm == "inverse_dynamics" else robot.forward_dynamics
            return fn(q, v, x, f_ext=f, passive=passive)
    if impl == "compile":
        fn = compiled(robot, algorithm, native=False, passive=passive, f_ext=f is not None)
        return fn(q) if algorithm == "mass_matrix" else fn(q, v, x, *(() if f is None else (f,)))
    raise AssertionError(impl)


# The mass matrix takes neither passive terms nor external forces: only its plain case exists.
ALGORITHM_FEATURES = [(a, f) for a in ("inverse_dynamics", "forward_dynamics") for f in FEATURES]
ALGORITHM_FEATURES.append(("mass_matrix", "plain"))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("algorithm, feature", ALGORITHM_FEATURES)
def test_matches_pinocchio(case, impl, feature, algorithm):
    key, robot, oracle = case
    passive, with_f = "passive" in feature, "f_ext" in feature
    q, v, x, f = random_state(robot, (B,), seed=11)
    f = f if with_f else None
    with torch.no_grad():
        got = _impl(impl, robot, algorithm, q, v, x, f, passive).numpy()
    qn, vn, xn = q.numpy(), v.numpy(), x.numpy()
    fn = [None] * B if f is None else f.numpy()
    tp = _passive(robot, q, v).numpy() if passive else np.zeros((B, robot.nv))
    if algorithm == "inverse_dynamics":
        ref = np.stack([oracle.rnea(qn[i], vn[i], xn[i], fn[i]) for i in range(B)]) + tp
    elif algorithm == "forward_dynamics":
        ref = np.stack([oracle.aba(qn[i], vn[i], xn[i] - tp[i], fn[i]) for i in range(B)])
    else:
        ref = np.stack([oracle.crba(qn[i]) for i in range(B)])
    tol = 1e-9 if algorithm == "forward_dynamics" else 1e-11
    assert rel_err(got, ref) < tol, (key, impl, feature, algorithm, rel_err(got, ref))


# ---------------------------------------------------------------- reverse passes
GRAD_IMPLS = ["hand_vjp", "autograd", pytest.param("native", marks=needs_cc)]


def _rnea_vjp(impl, robot, q, v, a, f, lam, passive):
    """``(qbar, vbar, abar[, fbar])`` of ``lam . RNEA(q, v, a, f)``."""
    tree, mt = robot.tree, robot.model_tensors()
    if impl == "hand_vjp":
        got = rnea_vjp_bl(tree, tree_state(tree, mt, q), q.T, v.T, a.T, lam.T, passive, f_ext=f)
        return [got.q.T, got.v.T, got.a.T] + ([got.f_ext] if f is not None else [])
    ins = [t.clone().requires_grad_(True) for t in (q, v, a) + ((f,) if f is not None else ())]
    fe = ins[3] if f is not None else None
    if impl == "autograd":
        with kernels.native_mode("never"):
            out = robot.inverse_dynamics(*ins[:3], f_ext=fe, passive=passive)
    else:
        with kernels.native_mode("build"):
            out = robot.inverse_dynamics(*ins[:3], f_ext=fe, passive=passive)
    return list(torch.autograd.grad((out * lam).sum(), ins))


@pytest.mark.parametrize("impl", GRAD_IMPLS)
@pytest.mark.parametrize("passive", [False, True])
def test_rnea_derivatives_match_pinocchio(impl, passive):
    robot, oracle = _robot("prismatic_mix")
    q, v, a, _ = random_state(robot, (B,), seed=12)
    lam = torch.randn(B, robot.nv, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    got = _rnea_vjp(impl, robot, q, v, a, None, lam, passive)
    d = torch.stack([robot.joint_params(n).damping for n in robot.joint_names]).numpy()
    k = torch.stack([robot.joint_params(n).stiffness for n in robot.joint_names]).numpy()
    m, data = oracle.model, oracle.data
    for i in range(B):
        pin.computeRNEADerivatives(m, data, oracle.q(q[i].numpy()), oracle.v(v[i].numpy()), oracle.v(a[i].numpy()))
        P = oracle.P
        dq, dv = P.T @ data.dtau_dq @ P, P.T @ data.dtau_dv @ P
        M = data.M.copy()
        M = P.T @ (np.triu(M) + np.triu(M, 1).T) @ P
        if passive:
            dq, dv = dq + np.diag(k), dv + np.diag(d)
        li = lam[i].numpy()
        for name, g, J in (("q", got[0][i], dq), ("v", got[1][i], dv), ("a", got[2][i], M)):
            err = np.abs(g.detach().numpy() - li @ J).max() / max(1.0, np.abs(li @ J).max())
            assert err < 1e-10, (impl, passive, name, err)


@pytest.mark.parametrize("impl", GRAD_IMPLS)
@pytest.mark.parametrize("key", ["floating_pair", "prismatic_mix", pytest.param("branching_tree_free", marks=slow)])
def test_rnea_derivatives_with_external_forces_match_central_differences(impl, key):
    robot, _ = _robot(key)
    q, v, a, f = random_state(robot, (2,), seed=13)
    gen = torch.Generator().manual_seed(4)
    lam = torch.randn(2, robot.nv, dtype=torch.float64, generator=gen)
    dirs = [torch.randn(t.shape, dtype=torch.float64, generator=gen) for t in (q, v, a, f)]
    got = _rnea_vjp(impl, robot, q, v, a, f, lam, True)
    pred = sum((g.detach() * d).sum() for g, d in zip(got, dirs))
    h = 1e-6

    def val(s):
        xs = [t + s * h * d for t, d in zip((q, v, a, f), dirs)]
        with kernels.native_mode("never"):
            return (robot.inverse_dynamics(*xs[:3], f_ext=xs[3]) * lam).sum()

    fd = (val(1.0) - val(-1.0)) / (2 * h)
    assert abs(float(fd - pred)) < 1e-7 * max(1.0, abs(float(fd))), (impl, key)
