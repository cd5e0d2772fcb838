"""MuJoCo's narrow phase (:mod:`diffmech.contact.soft_collide`) against MuJoCo's own ``d.contact``.

Scenes of free bodies at seeded random poses (touching, penetrating, separated within and beyond
the margin; margins, gaps, priorities and solmix set) go through ``mj_forward``; ``collide`` at
MuJoCo's geom poses must give the same contacts (matched by geoms and position): position, frame
and distance to 1e-10, the mixed parameters exactly, the same count, the same active set. gymnasium's
Ant, Hopper and Walker2d check the table built from a scene (geom placements through diffmech's
kinematics). Gradients of distance and position against central differences at two step sizes.
"""

from __future__ import annotations

import os

import mujoco  # noqa: E402
import numpy as np
import pytest
import torch

from diffmech.contact.soft_collide import collide  # noqa: E402
from diffmech.contact.soft_geoms import (  # noqa: E402
    GeomTable,
    geom_poses,
    geom_table_default,
    geom_table_from_mjmodel,
)
from diffmech.errors import ModelError  # noqa: E402

TOL = 1e-10


def _scene_xml(geoms: list[str], plane: str = "") -> str:
    """A plane in the world and one free body per geom (``geoms``: the ``<geom>`` attributes)."""
    bodies = "".join(f'<body name="b{i}" pos="{i} 0 1"><freejoint/><geom name="g{i}" {a}/></body>'
                     for i, a in enumerate(geoms))
    return (f'<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1" {plane}/>{bodies}'
            "</worldbody></mujoco>")


_ALIGNED = np.array([[1, 0, 0, 0], [0.5 ** 0.5, 0.5 ** 0.5, 0, 0], [0.5 ** 0.5, 0, 0.5 ** 0.5, 0], [0, 1, 0, 0],
                     [0.5, 0.5, 0.5, 0.5]])


def _random_states(m, n: int, rng: np.random.Generator, mode: str = "random") -> np.ndarray:
    """``(n, nq)`` states: every free body within reach of the others and of the plane. ``mode``:
    ``"random"`` orientations, ``"parallel"`` (one random orientation for all bodies), ``"aligned"``
    (axis-aligned orientations: flat boxes, upright cylinders), ``"deep"`` (the bodies' centres
    within 5 cm of each other)."""
    nb = m.nbody - 1
    span = float(np.max(m.geom_rbound[1:])) * 1.6
    out = np.zeros((n, m.nq))
    for k in range(n):
        q = np.zeros(m.nq)
        centre = rng.uniform(-1, 1, 3) * np.array([1.0, 1.0, 0.0])
        centre[2] = rng.uniform(-0.3, 1.2) * span
        same = rng.standard_normal(4)
        for b in range(nb):
            a = 7 * b
            if mode in ("deep", "parallel"):
                q[a:a + 3] = centre + rng.uniform(-1, 1, 3) * (0.05 if mode == "deep" else span / 2)
            else:
                q[a:a + 2] = centre[:2] + rng.uniform(-span, span, 2)
                q[a + 2] = rng.uniform(-0.3, 1.2) * span
            quat = {"parallel": same, "aligned": _ALIGNED[rng.integers(len(_ALIGNED))]}.get(
                mode, rng.standard_normal(4))
            q[a + 3:a + 7] = quat / np.linalg.norm(quat)
        out[k] = q
    return out


def _load(tmp_path, xml: str, name: str = "scene"):
    """``(m, scene, table)`` of an XML string (written to ``tmp_path``: Scene.from_mjcf reads files)."""
    from diffmech.model.mjcf import compile_mjcf
    from diffmech.sim import Scene

    path = tmp_path / f"{name}.xml"
    path.write_text(xml)
    m = compile_mjcf(path)
    scene = Scene.from_mjcf(path)
    return m, scene, geom_table_from_mjmodel(m, scene)


def _mujoco_contacts(m, d, qpos):
    d.qpos[:] = qpos
    mujoco.mj_forward(m, d)
    return [d.contact[i] for i in range(d.ncon)]


def _compare(m, table: GeomTable, states: np.ndarray, pos: torch.Tensor, rot: torch.Tensor) -> dict:
    """Match ``collide``'s found slots with ``d.contact`` state by state; return the largest errors."""
    d = mujoco.MjData(m)
    c = collide(table, pos, rot)
    ids = table.geom_id
    g1, g2 = ids[c.geom1.numpy()], ids[c.geom2.numpy()]
    err = {"pos": 0.0, "frame": 0.0, "dist": 0.0, "n": 0, "types": {}}
    for b, qpos in enumerate(states):
        cons = _mujoco_contacts(m, d, qpos)
        found = np.nonzero(c.found[b].numpy())[0]
        assert len(found) == len(cons), f"state {b}: {len(found)} contacts, MuJoCo {len(cons)}"
        assert int(c.active[b].sum()) == sum(1 for x in cons if not x.exclude)
        used = set()
        for con in cons:
            cand = [k for k in found if (g1[k], g2[k]) == tuple(con.geom) and k not in used]
            assert cand, f"state {b}: no contact of geoms {tuple(con.geom)}"
            k = min(cand, key=lambda k: np.abs(c.pos[b, k].numpy() - con.pos).max())
            used.add(k)
            err["pos"] = max(err["pos"], float(np.abs(c.pos[b, k].numpy() - con.pos).max()))
            err["frame"] = max(err["frame"], float(np.abs(c.frame[b, k].numpy().ravel() - con.frame).max()))
            err["dist"] = max(err["dist"], abs(float(c.dist[b, k]) - con.dist))
            assert bool(c.active[b, k]) == (not con.exclude)
            assert float(c.includemargin[k]) == con.includemargin
            np.testing.assert_array_equal(c.friction[k].numpy(), con.friction)
            np.testing.assert_array_equal(c.solref[k].numpy(), con.solref)
            np.testing.assert_array_equal(c.solimp[k].numpy(), con.solimp)
            assert int(c.condim[k]) == con.dim
            err["n"] += 1
            key = tuple(sorted(int(m.geom_type[g]) for g in con.geom))
            act, gap = err["types"].get(key, (0, 0))
            err["types"][key] = (act + (not con.exclude), gap + bool(con.exclude))
    return err


def _poses(m, states):
    d = mujoco.MjData(m)
    P, R = [], []
    for q in states:
        d.qpos[:] = q
        mujoco.mj_kinematics(m, d)
        P.append(d.geom_xpos.copy())
        R.append(d.geom_xmat.reshape(-1, 3, 3).copy())
    return torch.tensor(np.array(P)), torch.tensor(np.array(R))


GEOMS = {
    "sphere": 'type="sphere" size="0.1"',
    "sphere_m": 'type="sphere" size="0.12" margin="0.02" gap="0.01" priority="0" solmix="2" friction="0.7 0.01 0.001"',
    "capsule": 'type="capsule" size="0.07 0.15" margin="0.01" solref="0.03 0.8" condim="4"',
    "capsule_p": 'type="capsule" size="0.05 0.2" priority="1" solimp="0.8 0.9 0.002 0.4 3" condim="1"',
    "box": 'type="box" size="0.1 0.15 0.08" margin="0.015" gap="0.005" friction="1.2 0.02 0.002"',
    "box2": 'type="box" size="0.2 0.05 0.12" priority="2" margin="0.01" solmix="3"',
    "cylinder": 'type="cylinder" size="0.1 0.12" margin="0.01" gap="0.02" contype="2" conaffinity="1"',
    "cylinder2": 'type="cylinder" size="0.08 0.05" contype="2" conaffinity="1"',
    "cylinder3": 'type="cylinder" size="0.09 0.1" margin="0.01" condim="6"',
}
SCENES = {
    "sphere-sphere": ["sphere", "sphere_m"],
    "sphere-capsule": ["sphere_m", "capsule"],
    "capsule-capsule": ["capsule", "capsule_p"],
    "sphere-box": ["sphere_m", "box"],
    "plane-cylinder": ["cylinder", "cylinder2"],
    "capsule-box": ["capsule_p", "box"],
    "box-box": ["box", "box2"],
    "sphere-cylinder": ["sphere_m", "cylinder3"],
}
PLANE = 'margin="0.005" gap="0.003" solmix="0.5" conaffinity="3"'


PAIRS = ('<contact><pair geom1="g1" geom2="g0" condim="4" friction="0.3 0.3 0.02 0.001 0.002" margin="0.03" '
         'gap="0.01" solref="0.05 0.7" solimp="0.7 0.8 0.01 0.3 4"/>'
         '<pair geom1="floor" geom2="g1" condim="1"/></contact>')


@pytest.mark.parametrize("kind", list(SCENES) + ["pair"])
def test_pairs_match_mujoco(kind, tmp_path):
    """Every pair type, and <pair> elements (two spheres that collide only through one)."""
    if kind == "pair":
        xml = _scene_xml([GEOMS["sphere"] + ' conaffinity="0"', GEOMS["sphere_m"] + ' conaffinity="0"'], PLANE)
        xml = xml.replace("</mujoco>", PAIRS + "</mujoco>")
    else:
        xml = _scene_xml([GEOMS[g] for g in SCENES[kind]], PLANE)
    m, scene, table = _load(tmp_path, xml)
    rng = np.random.default_rng(0)
    states = np.concatenate([_random_states(m, 40, rng, mode) for mode in ("random", "parallel", "aligned", "deep")])
    pos, rot = _poses(m, states)
    err = _compare(m, table, states, pos, rot)
    print(kind, err)
    # every pair type of the scene met, active and in the gap (dist in [includemargin, margin + gap])
    types = {tuple(sorted((int(table.type[a]), int(table.type[b])))) for a, b in table.pairs}
    assert types == set(err["types"]) and all(a > 0 for a, _ in err["types"].values())
    assert max(err["pos"], err["frame"], err["dist"]) < TOL


def _gym_xml(name: str) -> str:
    import gymnasium
    return os.path.join(os.path.dirname(gymnasium.__file__), "envs/mujoco/assets", name)


def _standing_states(m, n: int, rng: np.random.Generator) -> np.ndarray:
    """Random joint angles (within the limits), the root tilted a little and lowered until its lowest
    geom is within 3 cm of the floor (above or below)."""
    d = mujoco.MjData(m)
    out = np.zeros((n, m.nq))
    free = int(m.jnt_type[0]) == mujoco.mjtJoint.mjJNT_FREE
    zi = 2 if free else 1  # the free joint's z, or the planar root's "rootz" slide
    for k in range(n):
        q = m.qpos0.copy()
        for j in range(m.njnt):
            a = int(m.jnt_qposadr[j])
            if int(m.jnt_type[j]) == mujoco.mjtJoint.mjJNT_HINGE and m.jnt_limited[j]:
                lo, hi = m.jnt_range[j]
                q[a] = rng.uniform(lo, hi)
        if free:
            tilt = np.concatenate([[1.0], rng.normal(0, 0.15, 3)])
            q[3:7] = tilt / np.linalg.norm(tilt)
        else:
            q[2] = rng.normal(0, 0.3)  # rooty
        d.qpos[:] = q
        mujoco.mj_kinematics(m, d)
        low = np.inf
        for g in range(m.ngeom):
            if m.geom_bodyid[g] == 0 or not (m.geom_contype[g] or m.geom_conaffinity[g]):
                continue
            R = d.geom_xmat[g].reshape(3, 3)
            reach = m.geom_size[g, 0] + (abs(R[2, 2]) * m.geom_size[g, 1] if m.geom_type[g] == 3 else 0.0)
            low = min(low, d.geom_xpos[g, 2] - reach)
        q[zi] += -low + rng.uniform(-0.03, 0.03)
        out[k] = q
    return out


@pytest.mark.parametrize("name", ["ant.xml", "hopper.xml", "walker2d_v5.xml"])
def test_gymnasium_contacts(name, tmp_path):
    from diffmech.model.mjcf import compile_mjcf, mjcf_state_to_diffmech
    from diffmech.sim import Scene

    path = _gym_xml(name)
    m = compile_mjcf(path)
    scene = Scene.from_mjcf(path)
    table = geom_table_from_mjmodel(m, scene)
    states = _standing_states(m, 60, np.random.default_rng(1))
    q, _ = mjcf_state_to_diffmech(scene, torch.tensor(states))
    pos, rot = geom_poses(table, scene, q)
    ref_pos, ref_rot = _poses(m, states)
    ids = torch.as_tensor(table.geom_id)
    # diffmech's kinematics places every geom where MuJoCo does
    assert (pos - ref_pos[:, ids]).abs().max() < 1e-12
    assert (rot - ref_rot[:, ids]).abs().max() < 1e-12
    err = _compare(m, table, states, pos, rot)
    print(name, err)
    assert err["types"].get((0, 3), (0, 0))[0] > 50  # feet on the floor
    assert max(err["pos"], err["frame"], err["dist"]) < TOL
    # invweight: MuJoCo's body_invweight0 of each geom's body
    np.testing.assert_array_equal(table.invweight, m.body_invweight0[m.geom_bodyid[table.geom_id]])


@pytest.mark.parametrize("name", ["ant.xml", "hopper.xml"])
def test_default_invweight_matches_setconst(name):
    """``geom_table_default``'s ``J M^-1 J^T`` at the neutral configuration is MuJoCo's body_invweight0."""
    from diffmech.model.mjcf import compile_mjcf
    from diffmech.sim import Scene

    path = _gym_xml(name)
    m = compile_mjcf(path)
    scene = Scene.from_mjcf(path)
    table = geom_table_default(scene)
    checked = 0
    for i, link in enumerate(table.link):
        if link is None:
            continue
        b = mujoco.mj_name2id(m, mujoco.mjtObj.mjOBJ_BODY, link)
        np.testing.assert_allclose(table.invweight[i], m.body_invweight0[b], rtol=1e-10, atol=0)
        checked += 1
    assert checked == sum(1 for g in range(m.ngeom) if m.geom_bodyid[g] > 0 and m.geom_contype[g])
    # the ground plane and MuJoCo's default parameters
    assert table.type[0] == 0 and table.model[0] is None
    np.testing.assert_array_equal(table.solimp[1], [0.9, 0.95, 0.001, 0.5, 2.0])
    np.testing.assert_array_equal(table.solref[1], [0.02, 1.0])


def test_default_table_scene_in_code():
    """A scene of diffmech's free bodies: one geom each plus the ground, every pair (none welded),
    MuJoCo's geom sizes, a solid sphere's invweight, the scene's friction and a scene.pairs override."""
    from diffmech.contact.soft_collide import contact_parameters
    from diffmech.model import systems
    from diffmech.sim import Scene

    scene = Scene({"a": systems.sphere(0.1, 1.0), "b": systems.box((0.2, 0.3, 0.1), 2.0)}, friction=0.8,
                  pairs={("a", "ground"): {"friction": 0.3}})
    table = geom_table_default(scene)
    assert [int(t) for t in table.type] == [0, 2, 6]
    assert sorted(map(tuple, table.pairs.tolist())) == [(0, 1), (0, 2), (1, 2)]
    np.testing.assert_allclose(table.size[2], [0.1, 0.15, 0.05])
    np.testing.assert_allclose(table.invweight[1], [1.0, 1.0 / (0.4 * 0.01)], rtol=1e-12)  # solid sphere
    par = contact_parameters(table)
    fr = {tuple(p): par["friction"][k] for k, p in enumerate(table.pairs.tolist())}
    np.testing.assert_array_equal(fr[(0, 2)], [0.8, 0.8, 0.005, 0.0001, 0.0001])
    np.testing.assert_array_equal(fr[(1, 2)], [0.8, 0.8, 0.005, 0.0001, 0.0001])
    np.testing.assert_array_equal(fr[(0, 1)], [0.3, 0.3, 0.005, 0.0001, 0.0001])  # scene.pairs


def _grad_scene(tmp_path, kind):
    m, scene, table = _load(tmp_path, _scene_xml([GEOMS[g] for g in SCENES[kind]], PLANE))
    states = _random_states(m, 10, np.random.default_rng(3), "deep" if kind != "plane-cylinder" else "random")
    pos, rot = _poses(m, states)
    return table, pos, rot


def _so3(w):
    """Rotation matrices ``exp([w]x)``, ``w (..., 3)``."""
    K = torch.zeros(*w.shape[:-1], 3, 3, dtype=w.dtype)
    K[..., 0, 1], K[..., 0, 2], K[..., 1, 2] = -w[..., 2], w[..., 1], -w[..., 0]
    return torch.linalg.matrix_exp(K - K.transpose(-1, -2))


def _jvp(f, x, e):
    """``J(x) e`` of ``f`` by two reverse passes (``J^T u``, then its derivative in ``u`` along ``e``)."""
    x = x.detach().requires_grad_(True)
    y = f(x)
    u = torch.zeros_like(y, requires_grad=True)
    (g,) = torch.autograd.grad(y, x, grad_outputs=u, create_graph=True)
    (jv,) = torch.autograd.grad(g, u, grad_outputs=e)
    return jv


@pytest.mark.parametrize("kind", ["capsule-capsule", "box-box",
                                  pytest.param("capsule-box", marks=pytest.mark.slow),
                                  pytest.param("plane-cylinder", marks=pytest.mark.slow),
                                  pytest.param("sphere-box", marks=pytest.mark.slow),
                                  pytest.param("sphere-capsule", marks=pytest.mark.slow)])
def test_gradients_against_central_differences(kind, tmp_path):
    """Directional derivatives of dist and pos along random pose perturbations (translations, and
    rotations ``R exp([w]x)`` at ``w = 0``) by autograd against central differences at
    two step sizes, on the found contacts of random states."""
    table, pos, rot = _grad_scene(tmp_path, kind)
    found = collide(table, pos, rot).found

    def f(x):
        c = collide(table, pos + x[..., :3], rot @ _so3(x[..., 3:]))
        return torch.cat([c.dist.unsqueeze(-1), c.pos], -1)  # (B, K, 4)

    x0 = torch.zeros(*pos.shape[:2], 6, dtype=torch.float64)
    gen = torch.Generator().manual_seed(0)
    mask = found.unsqueeze(-1).expand(*found.shape, 4)
    errs, scale, n = {1e-6: 0.0, 1e-5: 0.0}, 0.0, 0
    for _ in range(2):
        e = torch.randn(x0.shape, generator=gen, dtype=torch.float64)
        jv = _jvp(f, x0, e)
        scale = max(scale, float(jv[mask].abs().max()))
        for h in errs:
            with torch.no_grad():
                fd = (f(x0 + h * e) - f(x0 - h * e)) / (2 * h)
            diff = (fd - jv)[mask].abs()
            smooth = diff < 1e-3  # a branch switch inside the step (a face change, a clip) is left out
            n += int(smooth.sum())
            errs[h] = max(errs[h], float(diff[smooth].max()))
    print(kind, errs, scale, n)
    assert n > 0.95 * 4 * int(mask.sum()) and scale > 0.1
    # central differences: an O(h^2) truncation error, the smaller step gains a factor ~100
    assert errs[1e-6] < 1e-6 and errs[1e-5] < 1e-4 and errs[1e-6] < 0.05 * errs[1e-5] + 1e-9


@pytest.mark.parametrize("geoms, extra, match", [
    (['type="cylinder" size=".1 .1"', 'type="box" size=".1 .2 .1"'], "", "'g0' \\(cylinder\\) and 'g1' \\(box\\)"),
    (['type="ellipsoid" size=".1 .2 .1"'], "", "'floor' \\(plane\\) and 'g0' \\(ellipsoid\\)"),
    pytest.param(['type="mesh" mesh="tet"'], '<asset><mesh name="tet" vertex="0 0 0 .1 0 0 0 .1 0 0 0 .1"/></asset>',
                 "'floor' \\(plane\\) and 'g0' \\(mesh\\)", marks=pytest.mark.slow),
    (['type="sphere" size=".1"', 'type="sphere" size=".1"'],
     '<contact><pair geom1="g0" geom2="g1" solreffriction="0.01 1"/></contact>', "solreffriction"),
])
@pytest.mark.filterwarnings("ignore:.*not used for contact")
def test_refusals_name_the_geoms(geoms, extra, match, tmp_path):
    """A pair type the collision code does not have, and a <pair> with solreffriction: ModelError."""
    xml = _scene_xml(geoms)
    xml = xml.replace("<worldbody>", extra + "<worldbody>") if "asset" in extra else \
        xml.replace("</mujoco>", extra + "</mujoco>")
    with pytest.raises(ModelError, match=match):
        _load(tmp_path, xml)


def test_static_geoms_through_scene_kinematics(tmp_path):
    """Geoms of the world body and of a body welded to it are fixed in the world (``model`` None);
    ``geom_poses`` through the scene's kinematics places every geom where MuJoCo does."""
    from diffmech.model.mjcf import mjcf_state_to_diffmech

    xml = ('<mujoco><worldbody><geom name="floor" type="plane" size="5 5 .1"/>'
           '<geom name="step" type="box" size=".3 .3 .05" pos=".2 0 .05" euler="0 5 0"/>'
           '<body name="post" pos="-.3 .1 .2" euler="10 0 0"><geom name="pole" type="capsule" size=".05 .2"/></body>'
           '<body name="ball" pos="0 0 .3"><freejoint/><geom name="b" type="sphere" size=".1"/></body>'
           '<body name="rod" pos="0 0 .6"><freejoint/><geom name="r" type="capsule" size=".04 .15"/>'
           '<body name="tip" pos="0 0 .2"><joint type="hinge" axis="1 0 0"/>'
           '<geom name="t" type="box" size=".05 .05 .05"/>'
           '</body></body></worldbody></mujoco>')
    m, scene, table = _load(tmp_path, xml)
    assert [table.model[i] is None for i in range(len(table))] == [True, True, True, False, False, False]
    rng = np.random.default_rng(2)
    states = np.zeros((40, m.nq))
    for a in (0, 7):  # the two free joints: near the step and the pole, any orientation
        states[:, a:a + 3] = rng.uniform([-0.4, -0.3, 0.0], [0.4, 0.3, 0.4], (40, 3))
        quat = rng.standard_normal((40, 4))
        states[:, a + 3:a + 7] = quat / np.linalg.norm(quat, axis=1, keepdims=True)
    states[:, 14] = rng.uniform(-2, 2, 40)  # the hinge
    q, _ = mjcf_state_to_diffmech(scene, torch.tensor(states))
    pos, rot = geom_poses(table, scene, q)
    ref_pos, ref_rot = _poses(m, states)
    assert (pos - ref_pos).abs().max() < 1e-12 and (rot - ref_rot).abs().max() < 1e-12
    err = _compare(m, table, states, pos, rot)
    print(err)
    assert max(err["pos"], err["frame"], err["dist"]) < TOL and err["n"] > 20
