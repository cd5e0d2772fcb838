"""MuJoCo's PGS solver (:mod:`diffmech.contact.soft_pgs`) against MuJoCo's own, float64.

Oracle: ``mujoco.mj_forward`` with ``opt.solver = mjSOL_PGS`` and a small ``opt.iterations``
(unconverged), fed the same rows (MuJoCo's ``efc_J``, ``efc_aref``, ``efc_R``, friction loss),
mass matrix, smooth force and ``qacc_warmstart``: ``qacc`` and ``efc_force`` must agree to
rounding. Then ``mj_step`` against :func:`diffmech.sim.contact_step` on files that ask for PGS
(the rows built by diffmech), and the gradient (the converged problem's, at PGS's zones) against
central differences of the converged Newton solution.
"""

from __future__ import annotations

import os
import warnings

import gymnasium
import mujoco
import numpy as np
import pytest
import torch

from diffmech.contact import soft_pgs, soft_solver
from diffmech.contact.soft_constraints import KIND_CONE_NORMAL, KIND_CONE_TANGENT, Rows
from diffmech.errors import ModelError
from diffmech.sim import Scene
from test_soft_step import _compare, _scene

HUMANOID = os.path.join(os.path.dirname(gymnasium.__file__), "envs", "mujoco", "assets", "humanoid.xml")

# boxes, spheres and a capsule on a floor (three contact islands), a hinge with friction loss and a limit
PILE = """
<mujoco model="pile">
  <option timestep="0.005" solver="PGS" iterations="{it}"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 0.1"/>
    <body name="b1" pos="0 0 0.098" euler="0 0 15"><freejoint/><geom type="box" size="0.2 0.15 0.1" mass="2"/></body>
    <body name="s1" pos="0.03 0.01 0.296"><freejoint/><geom type="sphere" size="0.1" mass="0.5"/></body>
    <body name="c1" pos="1 0 0.049"><freejoint/><geom type="capsule" fromto="0 -0.2 0 0 0.2 0" size="0.05"
      mass="1"/></body>
    <body name="s2" pos="1.02 0.05 0.197"><freejoint/><geom type="sphere" size="0.1" mass="0.3" condim="1"/></body>
    <body name="arm" pos="-1 0 0.5">
      <joint name="j" type="hinge" axis="0 1 0" range="-30 20" frictionloss="0.3" damping="0.1"/>
      <geom type="capsule" fromto="0 0 0 0.4 0 0" size="0.04" contype="0" conaffinity="0"/>
    </body>
  </worldbody>
</mujoco>
"""

# mjtConstraint -> diffmech's row kinds (equality, friction loss, limit / frictionless, pyramid edge)
_KIND = {0: 0, 1: 1, 2: 1, 3: 2, 4: 2, 5: 2, 6: 3}


def _problem(m, d):
    """(M, qfrc_smooth, rows, qacc_warmstart) of MuJoCo's data after mj_forward, batch of one."""
    n, nv = d.nefc, m.nv
    J = np.zeros((n, nv))
    if d.efc_J.size == n * nv:
        J[:] = d.efc_J.reshape(n, nv)
    else:
        mujoco.mju_sparse2dense(J, d.efc_J, d.efc_J_rownnz, d.efc_J_rowadr, d.efc_J_colind)
    M = np.zeros((nv, nv))
    mujoco.mj_fullM(m, d, M)

    def t(a):
        return torch.as_tensor(np.array(a, dtype=np.float64))[None]

    kind = torch.as_tensor([_KIND[int(k)] for k in d.efc_type], dtype=torch.long)
    rows = Rows(t(J), t(d.efc_aref), t(d.efc_R), kind, t(d.efc_frictionloss), torch.ones(1, n, dtype=torch.bool))
    return t(M), t(d.qfrc_smooth), rows, t(d.qacc_warmstart)


def _pile_state(steps: int):
    m = mujoco.MjModel.from_xml_string(PILE.format(it=50))
    d = mujoco.MjData(m)
    for _ in range(steps):
        mujoco.mj_step(m, d)
    return m, d


def _humanoid_state(steps: int):
    """gymnasium's Humanoid lowered onto the floor, ``steps`` steps of random actions (it stands)."""
    m = mujoco.MjModel.from_xml_path(HUMANOID)
    d = mujoco.MjData(m)
    d.qpos[2] = 1.3
    rng = np.random.default_rng(3)
    for _ in range(steps):
        d.ctrl[:] = rng.uniform(-0.4, 0.4, m.nu)
        mujoco.mj_step(m, d)
    return m, d


def _mujoco_pgs(m, d, iterations: int):
    """MuJoCo's PGS at ``d``'s state and warm start, ``iterations`` sweeps at most."""
    m.opt.solver, m.opt.iterations = mujoco.mjtSolver.mjSOL_PGS, iterations
    d2 = mujoco.MjData(m)
    d2.qpos[:], d2.qvel[:], d2.ctrl[:] = d.qpos, d.qvel, d.ctrl
    d2.qacc_warmstart[:] = d.qacc_warmstart
    mujoco.mj_forward(m, d2)
    return d2


@pytest.mark.parametrize("iterations", [5, 20, 50])
@pytest.mark.parametrize("which", ["pile", "humanoid"])
def test_forward_equals_mujoco_pgs(which, iterations):
    m, d = _pile_state(30) if which == "pile" else _humanoid_state(80)
    d2 = _mujoco_pgs(m, d, iterations)
    assert d2.nefc > 0 and d2.ncon > 0
    M, f, rows, warm = _problem(m, d2)
    qacc, force, info = soft_pgs.solve(M, f, rows, tol=m.opt.tolerance, iterations=iterations, warmstart=warm)
    # measured: at most 2e-13 (forces up to 1.3e3 N)
    np.testing.assert_allclose(force[0].numpy(), d2.efc_force, rtol=0, atol=1e-10)
    np.testing.assert_allclose(qacc[0].numpy(), d2.qacc, rtol=0, atol=1e-10)
    # the sweeps of the largest island; MuJoCo counts them per island
    assert int(info["iterations"][0]) == int(d2.solver_niter[:max(1, d2.nisland)].max())
    if iterations == 5:  # not converged: it differs from the minimiser
        q_newton, _, _ = soft_solver.solve(M, f, rows, tol=1e-14, iterations=200)
        assert float((q_newton - qacc).abs().max()) > 1e-6


def test_forward_without_islands_equals_mujoco_pgs():
    """``<flag island="disable">``: MuJoCo sweeps all rows as one problem (its own order and stop)."""
    m, d = _pile_state(30)
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_ISLAND)
    d2 = _mujoco_pgs(m, d, 300)
    assert d2.nisland == 0 and 1 < d2.solver_niter[0] < 300  # stopped by the tolerance
    M, f, rows, warm = _problem(m, d2)
    qacc, force, info = soft_pgs.solve(M, f, rows, tol=m.opt.tolerance, iterations=300, warmstart=warm,
                                       islands=False)
    assert int(info["iterations"][0]) == int(d2.solver_niter[0])
    # measured: 1.3e-14
    np.testing.assert_allclose(force[0].numpy(), d2.efc_force, rtol=0, atol=1e-10)
    np.testing.assert_allclose(qacc[0].numpy(), d2.qacc, rtol=0, atol=1e-10)


def test_batch_of_states_with_different_rows():
    """Two pile states (different row counts, padded; three islands each) solved as one batch."""
    probs, outs = [], []
    for steps in (10, 60):
        m, d = _pile_state(steps)
        d2 = _mujoco_pgs(m, d, 20)
        probs.append(_problem(m, d2))
        outs.append(d2)
    R = max(p[2].J.shape[1] for p in probs)

    def pad(rows):
        n = rows.J.shape[1]
        padr = (0, R - n)
        return Rows(torch.nn.functional.pad(rows.J, (0, 0) + padr), torch.nn.functional.pad(rows.aref, padr),
                    torch.nn.functional.pad(rows.R, padr, value=1.0), torch.nn.functional.pad(rows.kind, padr, value=2),
                    torch.nn.functional.pad(rows.floss, padr), torch.nn.functional.pad(rows.exists, padr))

    padded = [pad(p[2]) for p in probs]
    # the row kinds are static in a batch: both states' rows are friction loss then contacts
    assert torch.equal(padded[0].kind[:1], padded[1].kind[:1])
    rows = Rows(*(torch.cat([getattr(r, k) for r in padded]) for k in ("J", "aref", "R")), padded[0].kind,
                *(torch.cat([getattr(r, k) for r in padded]) for k in ("floss", "exists")))
    M = torch.cat([p[0] for p in probs])
    f = torch.cat([p[1] for p in probs])
    warm = torch.cat([p[3] for p in probs])
    qacc, force, _ = soft_pgs.solve(M, f, rows, tol=1e-8, iterations=20, warmstart=warm)
    for b, d2 in enumerate(outs):
        n = d2.nefc
        np.testing.assert_allclose(force[b, :n].numpy(), d2.efc_force, rtol=0, atol=1e-10)
        np.testing.assert_allclose(qacc[b].numpy(), d2.qacc, rtol=0, atol=1e-10)
        assert float(force[b, n:].abs().sum()) == 0


def test_pile_steps_equal_mj_step(tmp_path):
    """Scene.from_mjcf of a file asking for PGS (20 sweeps) steps as mj_step: islands, friction loss,
    limit, box-plane, sphere-box, capsule-plane, sphere-capsule contacts."""
    scene, m = _scene(tmp_path, PILE, it=20)
    assert scene.mujoco.solver == "pgs"
    r = _compare(scene, m, mujoco.MjData(m), 20, np.random.default_rng(0))
    assert r["touching"] == 20
    # measured: 1.4e-15 (q), 3e-14 (v) over 100 steps
    assert r["q"] < 1e-10 and r["v"] < 1e-9


@pytest.mark.slow
def test_humanoid_standing_100_steps_equal_mj_step():
    """gymnasium's humanoid.xml (PGS, 50 sweeps, RK4) standing on the floor under random controls."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the file's tendons
        scene = Scene.from_mjcf(HUMANOID)
    m = mujoco.MjModel.from_xml_path(HUMANOID)
    d = mujoco.MjData(m)
    d.qpos[2] = 1.3  # feet on the floor
    r = _compare(scene, m, d, 100, np.random.default_rng(0), ctrl_scale=0.1)
    assert r["touching"] >= 80 and r["made"] and r["broken"]
    # measured: 9e-15 (q), 5e-13 (v); 5e-15 with controls 4 times larger (it then hops)
    assert r["q"] < 1e-10 and r["v"] < 1e-9


def test_gradient_is_the_converged_problems():
    """d qacc / d (qfrc_smooth, aref) from PGS (20 sweeps) = central differences of the converged
    minimiser (Newton to 1e-14), at a state where PGS ends in the converged zones."""
    m, d = _humanoid_state(80)
    d2 = _mujoco_pgs(m, d, 20)
    M, f, rows, warm = _problem(m, d2)
    _, _, info_n = soft_solver.solve(M, f, rows, tol=1e-14, iterations=200)
    f_ = f.clone().requires_grad_(True)
    aref = rows.aref.clone().requires_grad_(True)
    qacc, _, info = soft_pgs.solve(M, f_, rows._replace(aref=aref), tol=1e-8, iterations=20, warmstart=warm)
    assert torch.equal(info["quadratic"], info_n["quadratic"])
    w = torch.as_tensor(np.random.default_rng(1).standard_normal(m.nv))[None]
    gf, ga = torch.autograd.grad((qacc * w).sum(), (f_, aref))

    def newton(fv, av):
        return float((soft_solver.solve(M, fv, rows._replace(aref=av), tol=1e-14, iterations=200)[0] * w).sum())

    rng = np.random.default_rng(2)
    for _ in range(3):
        df = torch.as_tensor(rng.standard_normal(f.shape))
        da = torch.as_tensor(rng.standard_normal(aref.shape))
        want = [(newton(f + h * df, rows.aref + h * da) - newton(f - h * df, rows.aref - h * da)) / (2 * h)
                for h in (1e-4, 1e-5)]
        got = float((gf * df).sum() + (ga * da).sum())
        # piecewise linear in (f, aref) within the zones: the differences agree to rounding
        assert abs(want[0] - want[1]) < 1e-6 * max(1.0, abs(got))
        assert abs(got - want[1]) < 1e-6 * max(1.0, abs(got))


def test_elliptic_rows_are_refused_and_cg_uses_newton(tmp_path):
    M, f, rows, _ = _problem(*(lambda md: (md[0], _mujoco_pgs(*md, 5)))(_pile_state(10)))
    kind = rows.kind.clone()
    kind[1], kind[2] = KIND_CONE_NORMAL, KIND_CONE_TANGENT
    with pytest.raises(ModelError, match="elliptic"):
        soft_pgs.solve(M, f, rows._replace(kind=kind))
    path = tmp_path / "cg.xml"
    path.write_text(PILE.format(it=20).replace('solver="PGS"', 'solver="CG"'))
    with pytest.warns(UserWarning, match="CG"):
        scene = Scene.from_mjcf(path)
    assert scene.mujoco.solver == "cg"


def test_visit_orders_are_permutations():
    o = soft_pgs.visit_orders(7, 4)
    assert o.shape == (4, 7) and all(sorted(r) == list(range(7)) for r in o)
    assert not (o[0] == o[1]).all()  # reshuffled every sweep
