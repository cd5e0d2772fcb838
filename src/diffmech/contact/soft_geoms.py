"""The collision geoms of a scene with MuJoCo's contact parameters: :class:`GeomTable`.

A table lists every geom that can touch something, where it sits (a link of one of the scene's
models, or fixed in the world), MuJoCo's per-geom contact parameters and the geom pairs that
MuJoCo's collision filters let through. :func:`diffmech.contact.soft_collide.collide` turns the
geoms' world poses into contacts as ``mj_collision`` does.

Two builders:

* :func:`geom_table_from_mjmodel` -- a scene from :meth:`diffmech.sim.Scene.from_mjcf` and the
  compiled ``mujoco.MjModel`` of the same file: every number is the model's.
* :func:`geom_table_default` -- a scene built in code: its collision shapes with MuJoCo's default
  geom parameters and ``body_invweight0`` computed as ``mj_setConst`` computes it.

Geom types use MuJoCo's ``mjtGeom`` numbering (0 plane, 2 sphere, 3 capsule, 4 ellipsoid,
5 cylinder, 6 box, 7 mesh) and sizes MuJoCo's ``geom_size`` (radius / half-lengths, m). A geom's
local ``z`` is a capsule's or cylinder's axis and a plane's normal.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..errors import ModelError

__all__ = ["GeomTable", "geom_table_from_mjmodel", "geom_table_default", "geom_poses", "PAIR_TYPES",
           "TYPE_NAMES"]

PLANE, HFIELD, SPHERE, CAPSULE, ELLIPSOID, CYLINDER, BOX, MESH = 0, 1, 2, 3, 4, 5, 6, 7
TYPE_NAMES = {0: "plane", 1: "hfield", 2: "sphere", 3: "capsule", 4: "ellipsoid", 5: "cylinder", 6: "box",
              7: "mesh", 8: "sdf"}
# the (type1, type2) pairs soft_collide has, type1 <= type2 as MuJoCo orders a pair
PAIR_TYPES = ((PLANE, SPHERE), (PLANE, CAPSULE), (PLANE, BOX), (SPHERE, SPHERE), (SPHERE, CAPSULE),
              (CAPSULE, CAPSULE), (PLANE, CYLINDER), (SPHERE, BOX), (CAPSULE, BOX), (BOX, BOX),
              (SPHERE, CYLINDER))
_DSBL_FILTERPARENT = 1 << 10  # mjtDisableBit.mjDSBL_FILTERPARENT
_ENBL_OVERRIDE = 1 << 0  # mjtEnableBit
# MuJoCo's default geom: mjs_defaultGeom
_DEFAULT_SOLREF = (0.02, 1.0)
_DEFAULT_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)
_DEFAULT_FRICTION = (1.0, 0.005, 0.0001)
_MINVAL = 1e-15  # mjMINVAL


@dataclass
class GeomTable:
    """The collision geoms of a scene (``G`` geoms), MuJoCo's parameters per geom.

    Attributes:
        names: geom names (MuJoCo's, or ``"{model}/{link}/{i}"`` for a scene built in code).
        model: the scene model each geom is on; ``None``: fixed in the world (the ground plane, the
            world body's geoms, bodies welded to the world).
        link: the link of that model (``None`` for the world).
        type: ``(G,)`` int, ``mjtGeom``. size: ``(G, 3)`` ``geom_size`` (m).
        pose: ``(G, 4, 4)`` the geom frame in its link frame (in the world when ``model`` is None).
        friction: ``(G, 3)`` sliding, torsional, rolling. condim, priority: ``(G,)`` int.
        solmix, margin, gap: ``(G,)`` (margin, gap in m). solref: ``(G, 2)``. solimp: ``(G, 5)``.
        invweight: ``(G, 2)`` ``body_invweight0`` of the geom's body (translation 1/kg,
            rotation 1/(kg m^2)); zero for the world.
        pairs: ``(P, 2)`` geom index pairs MuJoCo's filters let collide, ordered as MuJoCo orders
            them (the lower type first; same type: the lower MuJoCo geom id first).
        geom_id: ``(G,)`` MuJoCo geom id (-1 for a scene built in code).
        pair_params: parameters of the pairs an MJCF ``<contact><pair>`` sets, which replace the
            geoms' mixed ones: ``{"explicit" (P,) bool, "condim" (P,), "friction" (P, 5),
            "solref" (P, 2), "solimp" (P, 5), "margin" (P,), "gap" (P,)}`` (rows of pairs that are not
            explicit unused); None when there are none.
    """

    names: list
    model: list
    link: list
    type: np.ndarray
    size: np.ndarray
    pose: np.ndarray
    friction: np.ndarray
    condim: np.ndarray
    priority: np.ndarray
    solmix: np.ndarray
    margin: np.ndarray
    gap: np.ndarray
    solref: np.ndarray
    solimp: np.ndarray
    invweight: np.ndarray
    pairs: np.ndarray
    geom_id: np.ndarray = field(default=None)
    pair_params: dict | None = None

    def __len__(self) -> int:
        return len(self.names)


def _ordered(t: np.ndarray, ids: np.ndarray, a: int, b: int) -> tuple[int, int]:
    """MuJoCo's order of a pair: the lower type first, for equal types the lower geom id."""
    if (t[a], ids[a]) > (t[b], ids[b]):
        return b, a
    return a, b


def check_pairs(table: GeomTable) -> None:
    """Raise :class:`ModelError` naming the first pair whose type :mod:`soft_collide` does not have."""
    for a, b in table.pairs:
        key = (int(table.type[a]), int(table.type[b]))
        if key not in PAIR_TYPES:
            raise ModelError(
                f"MuJoCo contacts: geoms {table.names[a]!r} ({TYPE_NAMES.get(key[0], key[0])}) and "
                f"{table.names[b]!r} ({TYPE_NAMES.get(key[1], key[1])}) may collide, and diffmech's MuJoCo "
                f"collision code has no {TYPE_NAMES.get(key[0])}-{TYPE_NAMES.get(key[1])} pair "
                f"(it has {', '.join(TYPE_NAMES[x] + '-' + TYPE_NAMES[y] for x, y in PAIR_TYPES)})")


# ------------------------------------------------------------------ from a compiled MuJoCo model
def _mj_name(m, g: int) -> str:
    import mujoco

    return mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_GEOM, g) or f"geom{g}"


def _mj_pairs(m, geoms: list[int]) -> list[tuple[int, int]]:
    """The geom pairs ``mj_collision`` considers besides the explicit ``<pair>`` ones (MuJoCo ids),
    its filters applied: the bodies' weld groups, parent-child (unless ``filterparent`` is
    disabled), ``<exclude>``, the geoms' ``contype``/``conaffinity``; a pair that a ``<pair>`` element
    names is left to that element."""
    weld, parent, dofnum = m.body_weldid, m.body_parentid, m.body_dofnum
    nofilterparent = bool(m.opt.disableflags & _DSBL_FILTERPARENT)
    excluded = {(int(s >> 16), int(s & 0xFFFF)) for s in m.exclude_signature} if m.nexclude else set()
    explicit = {frozenset((int(m.pair_geom1[k]), int(m.pair_geom2[k]))) for k in range(m.npair)}
    out = []
    for i, g in enumerate(geoms):
        for h in geoms[i + 1:]:
            b1, b2 = int(m.geom_bodyid[g]), int(m.geom_bodyid[h])
            w1, w2 = int(weld[b1]), int(weld[b2])
            if w1 == w2 or (dofnum[w1] == 0 and dofnum[w2] == 0):
                continue
            if not nofilterparent and w1 != 0 and w2 != 0 and (w1 == weld[parent[w2]] or w2 == weld[parent[w1]]):
                continue
            if (min(b1, b2), max(b1, b2)) in excluded or frozenset((g, h)) in explicit:
                continue
            if not (m.geom_contype[g] & m.geom_conaffinity[h]) and not (m.geom_contype[h] & m.geom_conaffinity[g]):
                continue
            out.append((g, h))
    return out


def _explicit_pairs(m) -> list[int]:
    """The ``<pair>`` elements that can be read: no ``solreffriction``, no adhesion."""
    bad = []
    for k in range(m.npair):
        if np.any(m.pair_solreffriction[k] != 0) or (hasattr(m, "pair_adhesion") and m.pair_adhesion[k] != 0):
            bad.append(f"{_mj_name(m, int(m.pair_geom1[k]))}-{_mj_name(m, int(m.pair_geom2[k]))}")
    if bad:
        raise ModelError(f"MuJoCo contacts: <pair> elements {bad} set solreffriction or adhesion; not supported")
    return list(range(m.npair))


def geom_table_from_mjmodel(m, scene) -> GeomTable:
    """The geoms of ``scene`` with the compiled model's parameters.

    Args:
        m: ``mujoco.MjModel`` of the file (:func:`diffmech.model.mjcf.compile_mjcf`).
        scene: the :class:`~diffmech.sim.Scene` of the same file (:meth:`~diffmech.sim.Scene.from_mjcf`);
            its models' ``meta["mjcf"]["geoms"]`` say which link holds each geom.

    Returns:
        The :class:`GeomTable`; geoms welded to the world are fixed there at their placement at
        ``qpos0``; ``invweight`` is ``m.body_invweight0``.

    Raises:
        ModelError: ``<pair>`` elements with ``solreffriction`` or adhesion, ``option override``, geoms
            with ``adhesion``, a
            colliding geom that no scene model holds, or a pair of geom types the collision code does
            not have (naming the geoms).
    """
    import mujoco

    if m.opt.enableflags & _ENBL_OVERRIDE:
        raise ModelError("MuJoCo contacts: <option><flag override=\"enable\"> is not supported")
    where: dict[int, tuple[str, str, np.ndarray]] = {}
    for name in scene.names:
        for g, link, T in scene.models[name].meta.get("mjcf", {}).get("geoms", []):
            where[int(g)] = (name, link, np.asarray(T, dtype=np.float64))
    d = mujoco.MjData(m)
    mujoco.mj_kinematics(m, d)  # at qpos0: the placement of the geoms fixed in the world
    explicit = _explicit_pairs(m)
    named = {int(g) for k in explicit for g in (m.pair_geom1[k], m.pair_geom2[k])}
    geoms = [g for g in range(m.ngeom) if m.geom_contype[g] or m.geom_conaffinity[g] or g in named]
    adhesive = [_mj_name(m, g) for g in geoms if hasattr(m, "geom_adhesion") and m.geom_adhesion[g] != 0]
    if adhesive:
        raise ModelError(f"MuJoCo contacts: geoms {adhesive} have adhesion; not supported")
    names, models, links, poses = [], [], [], []
    for g in geoms:
        names.append(_mj_name(m, g))
        if int(m.body_weldid[m.geom_bodyid[g]]) == 0:
            T = np.eye(4)
            T[:3, :3] = d.geom_xmat[g].reshape(3, 3)
            T[:3, 3] = d.geom_xpos[g]
            models.append(None)
            links.append(None)
            poses.append(T)
        elif g in where:
            name, link, T = where[g]
            models.append(name)
            links.append(link)
            poses.append(T)
        else:
            raise ModelError(f"MuJoCo contacts: geom {names[-1]!r} (id {g}) is on no model of the scene; build the "
                             "scene with Scene.from_mjcf from the same file")
    idx = {g: i for i, g in enumerate(geoms)}
    ids = np.asarray(geoms, dtype=np.int64)
    types = np.asarray(m.geom_type[geoms], dtype=np.int64)
    pairs = [_ordered(types, ids, idx[g], idx[h]) for g, h in _mj_pairs(m, geoms)]
    pair_params = None
    if explicit:
        P0, P = len(pairs), len(pairs) + len(explicit)
        pair_params = {"explicit": np.zeros(P, dtype=bool), "condim": np.zeros(P, dtype=np.int64),
                       "friction": np.zeros((P, 5)), "solref": np.zeros((P, 2)), "solimp": np.zeros((P, 5)),
                       "margin": np.zeros(P), "gap": np.zeros(P)}
        for r, k in enumerate(explicit, start=P0):
            a, b = idx[int(m.pair_geom1[k])], idx[int(m.pair_geom2[k])]
            pairs.append((b, a) if types[a] > types[b] else (a, b))  # MuJoCo swaps only on the types
            pair_params["explicit"][r] = True
            pair_params["condim"][r] = int(m.pair_dim[k])
            for key in ("friction", "solref", "solimp", "margin", "gap"):
                pair_params[key][r] = getattr(m, f"pair_{key}")[k]
    bodies = m.geom_bodyid[geoms]
    table = GeomTable(
        names=names, model=models, link=links, type=types, size=np.array(m.geom_size[geoms], dtype=np.float64),
        pose=np.stack(poses) if poses else np.zeros((0, 4, 4)),
        friction=np.array(m.geom_friction[geoms], dtype=np.float64),
        condim=np.array(m.geom_condim[geoms], dtype=np.int64),
        priority=np.array(m.geom_priority[geoms], dtype=np.int64),
        solmix=np.array(m.geom_solmix[geoms], dtype=np.float64),
        margin=np.array(m.geom_margin[geoms], dtype=np.float64),
        gap=np.array(m.geom_gap[geoms], dtype=np.float64), solref=np.array(m.geom_solref[geoms], dtype=np.float64),
        solimp=np.array(m.geom_solimp[geoms], dtype=np.float64),
        invweight=np.array(m.body_invweight0[bodies], dtype=np.float64),
        pairs=np.asarray(pairs, dtype=np.int64).reshape(-1, 2), geom_id=ids, pair_params=pair_params)
    check_pairs(table)
    return table


# ------------------------------------------------------------------ a scene built in code
def _shape_geom(shape) -> tuple[int, tuple[float, float, float], np.ndarray]:
    """``(mjtGeom type, geom_size, 4x4 pose in the link frame)`` of a :class:`~diffmech.model.collision.Shape`."""
    from ..spatial import rpy_to_matrix

    T = np.eye(4)
    T[:3, :3] = rpy_to_matrix(torch.tensor(shape.rpy, dtype=torch.float64)).numpy()
    T[:3, 3] = shape.xyz
    s = shape.size
    if shape.kind == "sphere":
        return SPHERE, (s[0], 0.0, 0.0), T
    if shape.kind == "capsule":  # diffmech: (radius, length between the end-sphere centres)
        return CAPSULE, (s[0], s[1] / 2.0, 0.0), T
    if shape.kind == "cylinder":
        return CYLINDER, (s[0], s[1] / 2.0, 0.0), T
    if shape.kind == "box":  # side lengths -> half sizes
        return BOX, (s[0] / 2.0, s[1] / 2.0, s[2] / 2.0), T
    return MESH, (float(s[0]), 0.0, 0.0), T


def _weld_parent(robot, body: int) -> int:
    """The body (weld group) a moving body hangs from, ``-1`` for the world: MuJoCo's
    ``body_weldid[body_parentid]``; the three bodies of a ball joint are one."""
    joint = robot.tree.body_joint
    nfree = robot.tree.nfree
    p = robot.body_parent[body]
    while p >= nfree and body >= nfree and joint[p - nfree] == joint[body - nfree]:
        body, p = p, robot.body_parent[p]
    return p


def _invweight(robot, links: list[str], armature: Tensor | None) -> dict[str, tuple[float, float]]:
    """``body_invweight0`` of ``links`` as ``mj_setConst`` computes it: the averaged diagonal blocks of
    ``J M^-1 J^T`` with ``J`` the body's centre-of-mass Jacobian (world axes) and ``M`` the mass matrix
    (with armature) at the neutral configuration."""
    from ..dynamics import jacobian, mass_matrix

    q = robot.neutral_configuration().to(torch.float64)
    M = mass_matrix(robot, q).to(torch.float64)
    if armature is not None:
        M = M + torch.diag(armature.to(torch.float64))
    out = {}
    for link in links:
        com = robot.links[robot.link_names.index(link)].com.detach().to(q.dtype)
        J = jacobian(robot, q, link, frame="world_aligned", point=com).to(torch.float64)
        A = J @ torch.linalg.solve(M, J.T)
        out[link] = (float(torch.diagonal(A)[:3].mean()), float(torch.diagonal(A)[3:].mean()))
    return out


def geom_table_default(scene) -> GeomTable:
    """The collision shapes of a scene built in code, with MuJoCo's default geom parameters.

    Each link collision shape (:mod:`diffmech.model.collision`) is one geom: ``solref (0.02, 1)``,
    ``solimp (0.9, 0.95, 0.001, 0.5, 2)``, margin and gap 0, condim 3, priority 0, solmix 1,
    friction ``(f, 0.005, 0.0001)`` with ``f`` the link's URDF ``<contact>`` friction or the scene's
    ``friction``; a pair of models with a friction in ``scene.pairs`` gets that value (as a number: a
    tensor's gradient does not flow through the table). The ground (when ``scene.ground``) is a
    plane ``z = 0`` facing ``+z``. Every geom has ``contype = conaffinity = 1``; the pairs are
    MuJoCo's filters on that: not within one weld group (links joined by fixed joints; a static
    model and the ground are welded to the world), not parent and child, and not within one model
    unless ``scene.self_collision``. ``invweight``: ``J M^-1 J^T`` at the neutral configuration, as
    ``mj_setConst``, with ``M`` the mass matrix plus the armature of the scene's drives (else of
    ``meta["mjcf"]["armature"]``); MuJoCo's special case of bodies moved by axis-aligned slide joints
    alone (``body_simple == 2``) is not reproduced.

    Args:
        scene: a :class:`~diffmech.sim.Scene`.

    Raises:
        ModelError: a pair of geom types the collision code does not have (naming the geoms).
    """
    fr = scene.friction
    fr = float(fr.detach()) if isinstance(fr, Tensor) else float(fr)
    names, models, links, types, sizes, poses, fric, inv = [], [], [], [], [], [], [], []
    weld_of: list = []
    owner: list[str] = []  # the scene name of each geom's model ("ground" for the ground), for scene.pairs
    if scene.ground:
        names.append("ground")
        models.append(None)
        links.append(None)
        types.append(PLANE)
        sizes.append((0.0, 0.0, 1.0))
        poses.append(np.eye(4))
        fric.append((fr, *_DEFAULT_FRICTION[1:]))
        inv.append((0.0, 0.0))
        weld_of.append(("", None, None))
        owner.append("ground")
    for name in scene.names:
        robot = scene.models[name]
        shapes = scene.shapes.get(name, {})
        static = name in scene.static
        moving = [link for link in shapes if shapes[link]]
        arm = None  # per joint (no floating-base entries): the scene's drives, else an MJCF file's armature
        if name in scene.drives:  # (stiffness, damping, target, armature)
            arm = scene.drives[name][3].detach().to(torch.float64)
        elif robot.meta.get("mjcf", {}).get("armature"):
            arm = torch.tensor(robot.meta["mjcf"]["armature"], dtype=torch.float64)
        if arm is not None:
            arm = torch.cat([arm.new_zeros(robot.nv - arm.numel()), arm])
        iw = {} if static else _invweight(robot, moving, arm)
        for link in moving:
            w = robot.link_body[robot.link_names.index(link)]
            world = static or w < 0  # links fixed to a fixed base or in a static model: MuJoCo's weld id 0
            for i, shape in enumerate(shapes[link]):
                t, size, T = _shape_geom(shape)
                names.append(f"{name}/{link}/{i}")
                models.append(None if static else name)
                links.append(None if static else link)
                types.append(t)
                sizes.append(size)
                if static:
                    from ..dynamics import forward_kinematics

                    Tl = forward_kinematics(robot, robot.neutral_configuration())[robot.link_names.index(link)]
                    T = Tl.detach().to(torch.float64).numpy() @ T
                poses.append(T)
                lf = scene.link_coefficients.get(name, {}).get(link, {}).get("friction")
                fric.append((float(lf) if lf is not None else fr, *_DEFAULT_FRICTION[1:]))
                inv.append((0.0, 0.0) if static else iw[link])
                weld_of.append(("", None, None) if world else (name, w, _weld_parent(robot, w)))
                owner.append(name)
    G = len(names)
    types_a = np.asarray(types, dtype=np.int64)
    ids = np.arange(G, dtype=np.int64)
    pairs = []
    for a in range(G):
        for b in range(a + 1, G):
            (ma, wa, pa), (mb, wb, pb) = weld_of[a], weld_of[b]
            if (ma, wa) == (mb, wb) or (ma == "" and mb == ""):
                continue  # one weld group, or both fixed in the world
            if ma == mb and (not scene.self_collision or pa == wb or pb == wa):
                continue  # one model: self collision off, or parent and child
            pairs.append(_ordered(types_a, ids, a, b))
    fr_a = np.asarray(fric, dtype=np.float64).reshape(G, 3)
    # a friction set for a pair of models in scene.pairs replaces the mixed one of their geoms' pairs
    P = len(pairs)
    pair_params = {"explicit": np.zeros(P, dtype=bool), "condim": np.full(P, 3, dtype=np.int64),
                   "friction": np.zeros((P, 5)), "solref": np.tile(np.asarray(_DEFAULT_SOLREF), (P, 1)),
                   "solimp": np.tile(np.asarray(_DEFAULT_SOLIMP), (P, 1)), "margin": np.zeros(P), "gap": np.zeros(P)}
    for r, (a, b) in enumerate(pairs):
        over = scene.pairs.get(frozenset((owner[a], owner[b])), {}).get("friction")
        if over is not None:
            f = float(over.detach()) if isinstance(over, Tensor) else float(over)
            pair_params["explicit"][r] = True
            pair_params["friction"][r] = (f, f, _DEFAULT_FRICTION[1], _DEFAULT_FRICTION[2], _DEFAULT_FRICTION[2])
    table = GeomTable(
        names=names, model=models, link=links, type=types_a, size=np.asarray(sizes, dtype=np.float64).reshape(G, 3),
        pose=np.stack(poses) if poses else np.zeros((0, 4, 4)), friction=fr_a,
        condim=np.full(G, 3, dtype=np.int64), priority=np.zeros(G, dtype=np.int64), solmix=np.ones(G),
        margin=np.zeros(G), gap=np.zeros(G), solref=np.tile(np.asarray(_DEFAULT_SOLREF), (G, 1)),
        solimp=np.tile(np.asarray(_DEFAULT_SOLIMP), (G, 1)), invweight=np.asarray(inv, dtype=np.float64).reshape(G, 2),
        pairs=np.asarray(pairs, dtype=np.int64).reshape(-1, 2), geom_id=np.full(G, -1, dtype=np.int64),
        pair_params=pair_params if pair_params["explicit"].any() else None)
    check_pairs(table)
    return table


# ------------------------------------------------------------------ world poses
def geom_poses(table: GeomTable, scene, q: Tensor) -> tuple[Tensor, Tensor]:
    """World poses of the table's geoms at the scene configuration ``q``.

    Args:
        table: the scene's :class:`GeomTable`.
        scene: the :class:`~diffmech.sim.Scene`.
        q: ``(..., scene.nq)`` configuration.

    Returns:
        ``(pos (..., G, 3), rot (..., G, 3, 3))``: geom origins (m) and orientations (columns: the
        geom's axes in world coordinates), differentiable in ``q``.
    """
    from ..dynamics import forward_kinematics

    batch = q.shape[:-1]
    pose = torch.as_tensor(table.pose, dtype=q.dtype, device=q.device)
    G = len(table)
    T = pose.expand(*batch, G, 4, 4)
    cols: list[Tensor | None] = [None] * G
    for name in scene.names:
        sel = [i for i in range(G) if table.model[i] == name]
        if not sel:
            continue
        robot = scene.models[name]
        Tl = forward_kinematics(robot, q[..., scene.slices[name]])
        li = torch.tensor([robot.link_names.index(table.link[i]) for i in sel], device=q.device)
        Tg = Tl.index_select(-3, li).to(q.dtype) @ pose[sel]
        for k, i in enumerate(sel):
            cols[i] = Tg[..., k, :, :]
    T = torch.stack([T[..., i, :, :] if c is None else c for i, c in enumerate(cols)], -3)
    return T[..., :3, 3], T[..., :3, :3]
