"""MuJoCo's soft constraint rows and primal Newton solver (``diffmech.contact.soft_constraints``,
``diffmech.contact.soft_solver``) against MuJoCo itself.

Oracle: ``mujoco.mj_forward`` on small MJCF models (free spheres, boxes, capsules on a plane with
condim 1, 3 and 6, positive and negative solref, margins, impratio; a hinge/slide chain pushed into
its limits, with dof friction loss, touching the plane). The row builders get MuJoCo's own inputs
(``d.contact``, body Jacobians from ``mj_jac``, ``body_invweight0``, ``dof_invweight0``, ``qvel``,
``qpos``) and must reproduce ``efc_J``, ``efc_aref``, ``efc_R`` and ``efc_D``; ``solve`` gets
``mj_fullM`` and ``qfrc_smooth`` and must reproduce ``qacc`` and ``efc_force`` (MuJoCo run to a
tight tolerance so that its answer is the minimiser). Gradients of ``qacc`` are checked against
central differences of the whole solve at two step sizes. Everything in float64 except the float32
check.
"""

from __future__ import annotations

import warnings
from types import SimpleNamespace

import mujoco  # noqa: E402
import numpy as np
import pytest
import torch

from diffmech.contact.soft_constraints import (
    KIND_EDGE,
    KIND_FRICTION,
    Rows,
    cat_rows,
    clamp_solimp,
    contact_rows,
    frictionloss_params,
    frictionloss_rows,
    impedance,
    limit_params,
    limit_rows,
    refsafe_of,
    solref_gains,
)
from diffmech.contact.soft_solver import solve
from diffmech.errors import OptionError, ShapeError

F64 = torch.float64

# free bodies on a plane: the plane has condim 1 so that the capsule's contacts stay frictionless
# (MuJoCo takes the larger condim of a pair); a margin/gap pair, a capsule whose contacts' timeconst
# (0.012, the mean of the pair's solref) is below 2 dt (floored by MuJoCo), negative solref, a
# solimp with power 3 and impratio 1.5
FREE_XML = """
<mujoco>
  <option timestep="0.008" impratio="1.5" jacobian="dense"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1" condim="1" friction="0.8 0.01 0.001"/>
    <body name="ball" pos="0 0 0.2"><freejoint/>
      <geom type="sphere" size="0.1" condim="3" friction="0.5" margin="0.01" gap="0.002"/></body>
    <body name="box" pos="0.6 0 0.2"><freejoint/>
      <geom type="box" size="0.1 0.15 0.08" condim="3" solref="-3000 -40" friction="1"/></body>
    <body name="capsule" pos="-0.6 0 0.2"><freejoint/>
      <geom type="capsule" size="0.05 0.2" condim="1" solimp="0.8 0.95 0.004 0.3 3"
            solref="0.004 0.7"/></body>
    <body name="roller" pos="0 0.6 0.2"><freejoint/>
      <geom type="sphere" size="0.1" condim="6" friction="0.7 0.05 0.02"/></body>
  </worldbody>
</mujoco>
"""

# a slide + three hinges with limits (margin, negative solreflimit, custom solimplimit) and friction
# loss (custom solreffriction / solimpfriction), its capsules reaching the plane
CHAIN_XML = """
<mujoco>
  <option timestep="0.002" jacobian="dense"/>
  <worldbody>
    <geom name="floor" type="plane" size="5 5 .1" friction="0.9"/>
    <body name="base" pos="0 0 0.45">
      <joint name="lift" type="slide" axis="0 0 1" range="-0.2 0.1" frictionloss="0.3"/>
      <geom type="sphere" size="0.05" contype="0" conaffinity="0" mass="2"/>
      <body name="l1">
        <joint name="j1" type="hinge" axis="0 1 0" range="-60 60" margin="0.05"
               solreflimit="0.01 0.8" solimplimit="0.85 0.97 0.01 0.4 2"/>
        <geom type="capsule" fromto="0 0 0 0 0 -0.25" size="0.03"/>
        <body name="l2" pos="0 0 -0.25">
          <joint name="j2" type="hinge" axis="0 1 0" range="-90 10" solreflimit="-5000 -50"
                 frictionloss="0.05"/>
          <geom type="capsule" fromto="0 0 0 0.25 0 0" size="0.03" friction="0.6"/>
          <body name="l3" pos="0.25 0 0">
            <joint name="j3" type="hinge" axis="1 0 0" range="-30 30" frictionloss="0.4"
                   solreffriction="0.05 1" solimpfriction="0.5 0.9 0.01 0.5 2"/>
            <geom type="capsule" fromto="0 0 0 0 0 -0.2" size="0.03" solref="0.01 1.2"/>
          </body>
        </body>
      </body>
    </body>
  </worldbody>
</mujoco>
"""


def _model(xml):
    m = mujoco.MjModel.from_xml_string(xml)
    # run MuJoCo's Newton solver to the minimiser, so that qacc / efc_force are the exact answer
    m.opt.tolerance = 1e-15
    m.opt.iterations = 200
    m.opt.ls_iterations = 100
    return m


def _free_states(m, n, rng):
    """Random poses of the free bodies, each lowered onto the plane to a random penetration."""
    out = []
    for _ in range(n):
        d = mujoco.MjData(m)
        for b in range(1, m.nbody):
            adr = m.jnt_qposadr[m.body_jntadr[b]]
            q = rng.normal(size=4)
            d.qpos[adr + 3:adr + 7] = q / np.linalg.norm(q)
        mujoco.mj_kinematics(m, d)
        for g in range(1, m.ngeom):
            adr = m.jnt_qposadr[m.body_jntadr[m.geom_bodyid[g]]]
            R, size = d.geom_xmat[g].reshape(3, 3), m.geom_size[g]
            if m.geom_type[g] == mujoco.mjtGeom.mjGEOM_BOX:
                low = np.abs(R[2]) @ size
            elif m.geom_type[g] == mujoco.mjtGeom.mjGEOM_CAPSULE:
                low = size[0] + size[1] * abs(R[2, 2])
            else:
                low = size[0]
            d.qpos[adr + 2] = low - rng.uniform(-0.006, 0.01)
        d.qvel[:] = rng.normal(size=m.nv) * 0.5
        mujoco.mj_forward(m, d)
        out.append(d)
    return out


def _chain_states(m, n, rng):
    out = []
    lo, hi = m.jnt_range[:, 0], m.jnt_range[:, 1]
    for _ in range(n):
        d = mujoco.MjData(m)
        # around the range, a little beyond both ends
        d.qpos[:] = lo + (hi - lo) * rng.uniform(-0.08, 1.08, size=m.nq)
        d.qvel[:] = rng.normal(size=m.nv)
        mujoco.mj_forward(m, d)
        out.append(d)
    return out


def _contacts(m, datas, dtype=F64, cone="pyramidal"):
    """MuJoCo's contacts of B states as padded slots grouped by condim (SoftContacts' fields),
    their Jacobians and invweights, and the MuJoCo efc row of every contact row (-1: padding)."""
    B = len(datas)
    dims = sorted({int(c) for d in datas for c in d.contact.dim})
    counts = {c: max(int((d.contact.dim == c).sum()) for d in datas) for c in dims}
    condim = [c for c in dims for _ in range(counts[c])]
    K, nv = len(condim), m.nv
    nrow = [1 if c == 1 or cone == "elliptic" else 2 * (c - 1) for c in condim]
    nrow = [c if cone == "elliptic" else n for c, n in zip(condim, nrow)]
    pos = np.zeros((B, K, 3))
    frame = np.tile(np.eye(3), (B, K, 1, 1))
    dist, margin = np.zeros((B, K)), np.zeros((B, K))
    active = np.zeros((B, K), dtype=bool)
    friction = np.ones((B, K, 5))
    solref = np.tile([0.02, 1.0], (B, K, 1))
    solimp = np.tile([0.9, 0.95, 0.001, 0.5, 2], (B, K, 1))
    Jt, Jr = np.zeros((B, K, 3, nv)), np.zeros((B, K, 3, nv))
    iw1, iw2 = np.zeros((B, K, 2)), np.zeros((B, K, 2))
    efc_row = -np.ones((B, sum(nrow)), dtype=np.int64)
    starts = np.cumsum([0] + nrow)
    for b, d in enumerate(datas):
        used = {c: 0 for c in dims}
        for i in range(d.ncon):
            con = d.contact[i]
            c = int(con.dim)
            k = condim.index(c) + used[c]
            used[c] += 1
            pos[b, k], frame[b, k] = con.pos, con.frame.reshape(3, 3)
            dist[b, k], margin[b, k], active[b, k] = con.dist, con.includemargin, True
            friction[b, k], solref[b, k], solimp[b, k] = con.friction, con.solref, con.solimp
            for side, sgn in ((0, -1.0), (1, 1.0)):
                body = m.geom_bodyid[con.geom[side]]
                jp, jr = np.zeros((3, nv)), np.zeros((3, nv))
                mujoco.mj_jac(m, d, jp, jr, con.pos, body)
                Jt[b, k] += sgn * jp
                Jr[b, k] += sgn * jr
                (iw1 if side == 0 else iw2)[b, k] = m.body_invweight0[body]
            efc_row[b, starts[k]:starts[k + 1]] = con.efc_address + np.arange(nrow[k])
    t = lambda x: torch.tensor(x, dtype=dtype)  # noqa: E731
    c = SimpleNamespace(pos=t(pos), frame=t(frame), dist=t(dist), active=torch.tensor(active),
                        friction=t(friction), solref=t(solref), solimp=t(solimp),
                        includemargin=t(margin), condim=torch.tensor(condim))
    return c, t(Jt), t(Jr), t(iw1), t(iw2), efc_row


def _case(m, datas, dtype=F64):
    cone = "elliptic" if m.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC else "pyramidal"
    """(M, qfrc_smooth, rows, efc_row, contacts) of B MuJoCo states; efc_row (B, R) is MuJoCo's
    row of each of ours (-1 where our row does not exist)."""
    t = lambda x: torch.tensor(np.asarray(x), dtype=dtype)  # noqa: E731
    v = t([d.qvel for d in datas])
    dt = m.opt.timestep
    safe = refsafe_of(m)
    groups, fixed = [], []
    fp = frictionloss_params(m)
    if len(fp["dof"]):
        groups.append(frictionloss_rows(v, fp["dof"], fp["frictionloss"], fp["solref"],
                                        fp["solimp"], fp["invweight"], dt, refsafe=safe))
    lp = limit_params(m)
    if len(lp["dof"]):
        q = t([d.qpos[lp["qposadr"]] for d in datas])
        groups.append(limit_rows(q, v, lp["dof"], lp["range"], lp["margin"], lp["solref"],
                                 lp["solimp"], lp["invweight"], dt, refsafe=safe))
    # MuJoCo puts friction rows, then limit rows, then contacts: the first two keep their order
    for g in groups:
        fixed.append(g.exists.numpy())
    fixed = np.concatenate(fixed, axis=1) if fixed else np.zeros((len(datas), 0), bool)
    rows_fl = -np.ones(fixed.shape, dtype=np.int64)
    for b in range(len(datas)):
        rows_fl[b, fixed[b]] = np.arange(fixed[b].sum())
    c = None
    efc_row = rows_fl
    if any(d.ncon for d in datas):
        c, Jt, Jr, iw1, iw2, efc_c = _contacts(m, datas, dtype, cone)
        groups.append(contact_rows(c, Jt, Jr, v, iw1, iw2, dt, impratio=m.opt.impratio,
                                   cone=cone, refsafe=safe))
        efc_row = np.concatenate([rows_fl, efc_c], axis=1)
    M = np.zeros((len(datas), m.nv, m.nv))
    for b, d in enumerate(datas):
        mujoco.mj_fullM(m, d, M[b])
    return t(M), t([d.qfrc_smooth for d in datas]), cat_rows(*groups), efc_row, c


def _check_rows(m, datas):
    M, f, rows, efc_row, _ = _case(m, datas)
    errs = []
    for b, d in enumerate(datas):
        assert (efc_row[b] >= 0).sum() == d.nefc
        ours = torch.as_tensor(efc_row[b] >= 0)
        assert torch.equal(rows.exists[b], ours)
        idx = efc_row[b][efc_row[b] >= 0]
        J = rows.J[b][ours].numpy()
        aref, R = rows.aref[b][ours].numpy(), rows.R[b][ours].numpy()
        efcJ = d.efc_J.reshape(d.nefc, m.nv)[idx]
        errs.append((np.abs(J - efcJ).max() / np.abs(efcJ).max(),
                     np.abs(aref - d.efc_aref[idx]).max() / np.abs(d.efc_aref).max(),
                     np.abs(R / d.efc_R[idx] - 1).max(),
                     np.abs(1 / R / d.efc_D[idx] - 1).max()))
    err = np.max(errs, axis=0)
    # measured: J exact, aref 4e-16, R and D 2e-16
    assert err.max() < 1e-13, err
    return M, f, rows, efc_row


def _check_solve(m, datas, M, f, rows, efc_row, rtol=1e-12):
    qacc, force, info = solve(M, f, rows)
    assert bool(info["converged"].all())
    assert float(info["gradient"].max()) < 1e-10  # the default tol
    for b, d in enumerate(datas):
        scale_a = np.abs(d.qacc).max()
        assert np.abs(qacc[b].numpy() - d.qacc).max() < rtol * max(1.0, scale_a)
        ours = efc_row[b] >= 0
        fo = force[b].detach().numpy()
        assert np.all(fo[~ours] == 0)
        ref = d.efc_force[efc_row[b][ours]]
        assert np.abs(fo[ours] - ref).max() < 10 * rtol * max(1.0, np.abs(ref).max())
    return info


def test_free_bodies_rows_and_solve_match_mujoco():
    m = _model(FREE_XML)
    datas = _free_states(m, 6, np.random.default_rng(1))
    dims = {int(c) for d in datas for c in d.contact.dim}
    assert dims == {1, 3, 6}, dims  # frictionless, pyramid and condim-6 contacts all present
    for d in datas:  # one state at a time: each has its own contact layout
        M, f, rows, efc_row = _check_rows(m, [d])
        # measured: qacc 1e-14, force 2e-14 (relative to their largest entries)
        _check_solve(m, [d], M, f, rows, efc_row)


def test_elliptic_cones_match_mujoco():
    m = _model(FREE_XML)
    m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    middle = 0
    for d in _free_states(m, 6, np.random.default_rng(1)):
        M, f, rows, efc_row = _check_rows(m, [d])
        # measured: qacc 5e-10, force 2e-9 relative; there MuJoCo stops short of the minimiser
        # (the gradient of the cost at its qacc is 7e-9 after scaling, at ours 3e-15)
        info = _check_solve(m, [d], M, f, rows, efc_row, rtol=1e-8)
        middle += int(info["cone_middle"].sum())
    assert middle >= 3  # cones in the middle (sliding) zone were solved


STACK_XML = """
<mujoco>
  <option timestep="0.004" jacobian="dense"/>
  <worldbody>
    <geom type="plane" size="5 5 .1"/>
    <body pos="0 0 0.1"><freejoint/><geom type="box" size="0.1 0.1 0.1" friction="0.6"/></body>
    <body pos="0.03 0.02 0.29"><freejoint/><geom type="box" size="0.1 0.1 0.1"/></body>
    <body pos="0.05 0 0.45"><freejoint/><geom type="sphere" size="0.08" friction="0.9"/></body>
  </worldbody>
</mujoco>
"""


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_stacked_bodies_match_mujoco(cone):
    # contacts between two moving bodies (Jacobian differences on both sides), after MuJoCo's own
    # steps, with a velocity kick
    m = _model(STACK_XML)
    if cone == "elliptic":
        m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    d = mujoco.MjData(m)
    for _ in range(40):
        mujoco.mj_step(m, d)
    d.qvel[:] += np.random.default_rng(0).normal(size=m.nv) * 0.2
    mujoco.mj_forward(m, d)
    bodies = {int(m.geom_bodyid[g]) for g in np.asarray(d.contact.geom).ravel()}
    assert {1, 2, 3} <= bodies and d.ncon >= 8
    M, f, rows, efc_row = _check_rows(m, [d])
    # measured: qacc 2e-16 (pyramidal), 2e-13 (elliptic; MuJoCo stops near, not at, the minimiser)
    _check_solve(m, [d], M, f, rows, efc_row, rtol=1e-12 if cone == "pyramidal" else 1e-8)


def test_refsafe_disabled_matches_mujoco():
    # without MuJoCo's 2 dt floor the capsule contacts' timeconst 0.012 (< 2 dt) is used as given
    m = _model(FREE_XML)
    m.opt.disableflags |= int(mujoco.mjtDisableBit.mjDSBL_REFSAFE)
    d = _free_states(m, 2, np.random.default_rng(1))[1]
    capsule = m.body("capsule").id
    assert any(m.geom_bodyid[g] == capsule for g in np.asarray(d.contact.geom).ravel())
    _check_rows(m, [d])


def test_chain_limits_frictionloss_contacts_batched_match_mujoco():
    m = _model(CHAIN_XML)
    datas = _chain_states(m, 5, np.random.default_rng(2))
    types = {int(t) for d in datas for t in d.efc_type}
    C = mujoco.mjtConstraint
    assert {int(C.mjCNSTR_FRICTION_DOF), int(C.mjCNSTR_LIMIT_JOINT),
            int(C.mjCNSTR_CONTACT_PYRAMIDAL)} <= types, types
    assert len({d.nefc for d in datas}) > 1  # the batch mixes different active rows
    M, f, rows, efc_row = _check_rows(m, datas)
    # measured: qacc 8e-15, force 9e-15 (relative to their largest entries)
    _check_solve(m, datas, M, f, rows, efc_row)  # B = 5 in one call
    # a saturated friction-loss row and an active limit occur among these states
    _, _, info = solve(M, f, rows)
    assert bool((info["saturated"] != 0).any())
    assert bool((info["quadratic"] & (rows.kind == 2)).any())


def test_impedance_shape_and_clamps():
    # the flat case, the two power branches, saturation, and MuJoCo's clamps of solimp
    si = torch.tensor([0.9, 0.95, 0.01, 0.3, 3.0], dtype=F64)
    x = torch.tensor([0.0, 0.002, 0.003, 0.007, 0.01, 0.02], dtype=F64)
    imp = impedance(si, -x, torch.zeros_like(x))
    y = torch.where(x / 0.01 <= 0.3, (x / 0.01) ** 3 / 0.3 ** 2,
                    1 - (1 - x / 0.01).clamp_min(0) ** 3 / 0.7 ** 2).clamp(max=1.0)
    assert float((imp - (0.9 + 0.05 * y)).abs().max()) < 1e-15
    flat = impedance(torch.tensor([0.9, 0.9, 0.01, 0.5, 2.0], dtype=F64), -x, 0 * x)
    assert torch.all(flat == 0.9)
    # out-of-range solimp: dmin, dmax, midpoint into [1e-4, 0.9999], width >= 0, power >= 1
    c = clamp_solimp(torch.tensor([0.0, 1.5, -1.0, 0.0, 0.5], dtype=F64))
    assert c.tolist() == [1e-4, 0.9999, 0.0, 1e-4, 1.0]
    assert torch.all(impedance(c, -x, 0 * x) == 0.5 * (1e-4 + 0.9999))  # zero width: flat


def test_solref_gains_forms_and_floor():
    si = clamp_solimp(torch.tensor([[0.9, 0.95, 0.001, 0.5, 2.0]] * 4, dtype=F64))
    ref = torch.tensor([[0.02, 1.0], [0.004, 0.5], [-3000.0, -40.0], [0.02, -1.0]], dtype=F64)
    with pytest.warns(UserWarning, match="mixed-sign"):
        k, b = solref_gains(ref, si, 0.005)
    tc = torch.tensor([0.02, 0.01, 0.0, 0.02], dtype=F64)  # 0.004 floored at 2 dt; mixed: default
    dr = torch.tensor([1.0, 0.5, 0.0, 1.0], dtype=F64)
    assert torch.allclose(k[[0, 1, 3]], 1 / (0.95 * tc * dr)[[0, 1, 3]] ** 2, rtol=1e-15, atol=0)
    assert torch.allclose(b[[0, 1, 3]], 2 / (0.95 * tc)[[0, 1, 3]], rtol=1e-15, atol=0)
    assert torch.allclose(k[2], torch.tensor(3000 / 0.95 ** 2, dtype=F64), rtol=1e-15, atol=0)
    assert torch.allclose(b[2], torch.tensor(40 / 0.95, dtype=F64), rtol=1e-15, atol=0)
    k2, _ = solref_gains(ref[1:2], si[1:2], 0.005, refsafe=False)
    assert torch.allclose(k2, 1 / (0.95 * 0.004 * 0.5) ** 2 * torch.ones(1, dtype=F64), rtol=1e-15)


def _pick_state(m, datas, want):
    for d in datas:
        M, f, rows, _, c = _case(m, [d])
        _, _, info = solve(M, f, rows)
        if c is not None and want(rows, info):
            return d
    pytest.fail("no state of the wanted kind among the samples")


def _cd_check(fun, x, direction, tol=1e-6):
    """Directional derivative by autograd vs central differences at two step sizes.

    ``fun`` maps a batch of inputs (n, ...) to outputs (n, ...); ``x`` is one input (1, ...). The
    four perturbed inputs go through one batched call."""
    x = x.detach().clone().requires_grad_(True)
    y = fun(x)
    w = torch.randn(y.shape, dtype=F64, generator=torch.Generator().manual_seed(5))
    (g,) = torch.autograd.grad((w * y).sum(), x)
    ad = float((g * direction).sum())
    steps = (1e-5, 1e-6)
    with torch.no_grad():
        xs = torch.cat([x + s * h * direction for h in steps for s in (1, -1)])
        ys = fun(xs)
    for i, h in enumerate(steps):
        cd = float((w * (ys[2 * i] - ys[2 * i + 1])).sum() / (2 * h))
        # measured: at most 9e-8 relative (1e-6 steps; the elliptic forces), 2e-9 (1e-5 steps)
        assert abs(ad - cd) <= tol * max(1.0, abs(ad)), (h, ad, cd)


def _gradient_checks(m, d):
    """qacc (and the forces) against central differences in every input of ``solve``, and
    end to end through ``contact_rows`` in the contact distances."""
    cone = "elliptic" if m.opt.cone == mujoco.mjtCone.mjCONE_ELLIPTIC else "pyramidal"
    M, f, rows, _, c = _case(m, [d])
    gen = torch.Generator().manual_seed(4)
    rnd = lambda t: torch.randn(t.shape, dtype=F64, generator=gen)  # noqa: E731
    qacc0 = solve(M, f, rows)[0]
    tile = lambda t, n: t.expand(n, *t.shape[1:])  # noqa: E731

    def out_of(which=0, **kw):
        # warm-started at the unperturbed solution: a step or two per solve
        n = next(iter(kw.values())).shape[0]
        args = {"M": tile(M, n), "f": tile(f, n)} | kw
        r = Rows(*(kw.get(k, t if k == "kind" else tile(t, n)) for k, t in rows._asdict().items()))
        return solve(args["M"], args["f"], r, warmstart=tile(qacc0, n))[which]

    _cd_check(lambda x: out_of(f=x), f, rnd(f))
    _cd_check(lambda x: out_of(aref=x), rows.aref, rnd(rows.aref))
    _cd_check(lambda x: out_of(R=x), rows.R, rnd(rows.R) * rows.R)
    _cd_check(lambda x: out_of(J=x), rows.J, rnd(rows.J) * 1e-2)
    _cd_check(lambda x: out_of(floss=x), rows.floss, rnd(rows.floss) * rows.floss * 1e-2)
    # a symmetric direction scaled like M (its entries span orders of magnitude)
    sym = rnd(M)
    diag = torch.diagonal(M, dim1=-2, dim2=-1).sqrt()
    dM = 0.05 * (sym + sym.transpose(-1, -2)) * diag.unsqueeze(-1) * diag.unsqueeze(-2)
    _cd_check(lambda x: out_of(M=x), M, dM)
    _cd_check(lambda x: out_of(1, aref=x), rows.aref, rnd(rows.aref))
    _cd_check(lambda x: out_of(1, M=x), M, dM)
    # end to end through the row builders: contact distances (impedance and aref), frames,
    # Jacobians, velocities and joint positions (limit impedance and aref)
    lp, fp = limit_params(m), frictionloss_params(m)
    _, Jt, Jr, iw1, iw2, _ = _contacts(m, [d], cone=cone)
    base = {"dist": c.dist, "frame": c.frame, "Jt": Jt, "Jr": Jr,
            "v": torch.tensor(d.qvel[None], dtype=F64),
            "q": torch.tensor(d.qpos[None][:, lp["qposadr"]], dtype=F64)}

    def qacc_e2e(key, x):
        n = x.shape[0]
        e = {k: x if k == key else tile(t, n) for k, t in base.items()}
        groups = []
        if len(fp["dof"]):
            groups.append(frictionloss_rows(e["v"], fp["dof"], fp["frictionloss"], fp["solref"],
                                            fp["solimp"], fp["invweight"], m.opt.timestep))
        if len(lp["dof"]):
            groups.append(limit_rows(e["q"], e["v"], lp["dof"], lp["range"], lp["margin"],
                                     lp["solref"], lp["solimp"], lp["invweight"], m.opt.timestep))
        cn = SimpleNamespace(**(vars(c) | {"dist": e["dist"], "frame": e["frame"],
                                           "active": tile(c.active, n)}))
        groups.append(contact_rows(cn, e["Jt"], e["Jr"], e["v"], tile(iw1, n), tile(iw2, n),
                                   m.opt.timestep, impratio=m.opt.impratio, cone=cone))
        return solve(tile(M, n), tile(f, n), cat_rows(*groups), warmstart=tile(qacc0, n))[0]

    for key, scale in (("dist", 1e-3), ("frame", 1e-2), ("Jt", 1e-2), ("v", 1.0), ("q", 1e-2)):
        if key == "q" and not len(lp["dof"]):
            continue
        _cd_check(lambda x, key=key: qacc_e2e(key, x), base[key], rnd(base[key]) * scale)
    if cone == "elliptic" or int(c.condim.max()) > 3:
        _cd_check(lambda x: qacc_e2e("Jr", x), base["Jr"], rnd(base["Jr"]) * 1e-2)


def test_qacc_gradients_match_central_differences():
    # pyramidal: a state with active contact edges, an active limit and a saturated friction row
    m = _model(CHAIN_XML)
    d = _pick_state(m, _chain_states(m, 12, np.random.default_rng(3)), lambda rows, info: bool(
        (info["quadratic"][0] & (rows.kind == KIND_EDGE)).any()) and bool(
        (info["quadratic"][0] & (rows.kind == 2)).any()) and bool(
        (info["saturated"][0] != 0).any()))
    _gradient_checks(m, d)


def test_elliptic_gradients_match_central_differences():
    # a state with a cone in its middle (sliding) zone
    m = _model(FREE_XML)
    m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    d = _pick_state(m, _free_states(m, 6, np.random.default_rng(1)),
                    lambda rows, info: bool(info["cone_middle"].any()))
    _gradient_checks(m, d)


@pytest.mark.parametrize("cone", ["pyramidal", "elliptic"])
def test_float32_solve_agrees_with_float64(cone):
    # float32 runs to its own rounding level (no warning) and lands near the float64 solution
    m = _model(FREE_XML)
    if cone == "elliptic":
        m.opt.cone = mujoco.mjtCone.mjCONE_ELLIPTIC
    for d in _free_states(m, 3, np.random.default_rng(7)):
        M, f, rows, _, _ = _case(m, [d])
        q64 = solve(M, f, rows)[0]
        r32 = Rows(*(t.float() if t.is_floating_point() else t for t in rows))
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            q32, _, info = solve(M.float(), f.float(), r32)
        assert q32.dtype == torch.float32 and bool(info["converged"].all())
        # measured: 7e-7 relative to the largest acceleration
        assert (q32.double() - q64).abs().max() < 1e-5 * q64.abs().max()


def test_stopping_short_warns_and_reports():
    m = _model(CHAIN_XML)
    datas = _chain_states(m, 5, np.random.default_rng(2))
    M, f, rows, _, _ = _case(m, datas)
    with pytest.warns(UserWarning, match="stopped short"):
        _, _, info = solve(M, f, rows, iterations=1)
    assert not bool(info["converged"].all())
    # a warm start at the solution converges with no Newton step
    qacc, _, _ = solve(M, f, rows)
    q2, _, info2 = solve(M, f, rows, warmstart=qacc)
    assert int(info2["iterations"].max()) <= 1
    assert float((q2 - qacc).abs().max()) < 1e-12


def test_bad_input_raises():
    m = _model(FREE_XML)
    d = _free_states(m, 1, np.random.default_rng(1))[0]
    _, Jt, Jr, iw1, iw2, _ = _contacts(m, [d])
    c = _contacts(m, [d])[0]
    v = torch.tensor(d.qvel[None])
    with pytest.raises(OptionError):
        contact_rows(c, Jt, Jr, v, iw1, iw2, 0.005, cone="circular")
    with pytest.raises(ShapeError, match="condim"):
        contact_rows(SimpleNamespace(**(vars(c) | {"condim": torch.full_like(c.condim, 2)})),
                     Jt, Jr, v, iw1, iw2, 0.005)
    M = torch.eye(m.nv, dtype=F64)[None]
    r = contact_rows(c, Jt, Jr, v, iw1, iw2, 0.005)
    with pytest.raises(ShapeError, match="solve"):
        solve(M[:, :3, :3], v, r)
    assert int((r.kind == KIND_FRICTION).sum()) == 0
