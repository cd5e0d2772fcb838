"""MJCF (MuJoCo's XML format) -> :class:`~diffmech.model.spec.RobotSpec`, through MuJoCo's own compiler.

The file is compiled by ``mujoco.MjModel.from_xml_path`` (defaults classes, ``<include>``,
``fromto``, inertias from geoms, ``autolimits``, degrees vs radians are MuJoCo's business) and the
*compiled* model is read: what diffmech gets is what MuJoCo simulates.

Mapping (MuJoCo -> diffmech):

* A body becomes a link of the same name. Its frame is MuJoCo's body frame: ``body_pos`` /
  ``body_quat`` (``w x y z``) in the parent body's frame.
* A hinge or slide joint becomes a ``revolute`` (``continuous`` when unlimited) or ``prismatic``
  joint. MuJoCo's hinge turns about an axis through ``jnt_pos`` (in the body frame); diffmech's
  turns about the child frame's origin, so the joint frame is put at ``jnt_pos`` and the body's
  content (inertia, geoms, children) is shifted by ``-jnt_pos`` in it. MuJoCo moves a joint by
  ``q - qpos0`` (its ``ref``): the joint placement is turned (or shifted) by ``-ref`` about its
  axis, so that ``q`` is MuJoCo's ``qpos`` unchanged.
* A body with several joints (the planar roots of hopper, walker, half_cheetah, swimmer) gets a
  chain of massless links, one per joint but the last, named ``"{body}__{joint}"``; MuJoCo
  applies a body's joints in order, each about axes that the previous ones have moved, which is
  what such a chain does.
* A body with no joint is welded to its parent (a ``fixed`` joint named ``"{body}__weld"``).
* A ``free`` joint on a top-level body is diffmech's floating base (see the state conventions
  below).
* A ``ball`` joint becomes a ``ball`` joint turning about ``jnt_pos`` (placed as a hinge's): its
  ``q`` is MuJoCo's ``qpos`` quaternion reordered from ``(w, x, y, z)`` to ``(x, y, z, w)``, its ``v``
  MuJoCo's ``qvel`` unchanged (both the angular velocity in the child frame). A limited ball's
  cone (``range[1]``, the largest rotation angle) -> ``JointSpec.upper``; a ball joint with a spring
  (``stiffness``) is refused. ``armature`` and ``damping`` in ``meta["mjcf"]`` have one entry per DoF
  (three for a ball).
* Inertia: ``body_mass``, the centre of mass ``body_ipos`` and the principal inertia
  ``body_inertia`` in the frame ``body_iquat``, rotated into the link frame (``R diag(I) R^T``).
* ``dof_damping`` -> ``JointSpec.damping``, ``jnt_stiffness`` and the spring reference
  ``qpos_spring`` -> ``stiffness`` / ``rest``, ``dof_frictionloss`` -> ``friction``, ``jnt_range``
  where ``jnt_limited`` -> ``lower`` / ``upper``, ``jnt_actfrcrange`` where limited -> ``effort``.
* ``dof_armature`` is **not** part of a :class:`~diffmech.RobotModel` (diffmech's mass matrix has no
  armature term): it is kept in ``robot.meta["mjcf"]["armature"]`` (per joint, ``q`` order) and
  :meth:`diffmech.sim.Scene.from_mjcf` applies it as the scene's drive armature. The rigid-body
  mass matrix equals MuJoCo's ``mj_fullM`` minus ``diag(dof_armature)``.
* Gravity: ``opt.gravity`` (zero when the file disables gravity).

State conventions. diffmech's floating base is ``q = (x, y, z, qx, qy, qz, qw, joints...)`` and
``v = (linear, angular, joints...)`` with both velocities in the root body's frame (Pinocchio's).
MuJoCo's free joint is ``qpos = (x, y, z, qw, qx, qy, qz)`` and ``qvel = (linear in the world
frame, angular in the body frame)``. :func:`mjcf_state_to_diffmech` and
:func:`diffmech_state_to_mjcf` convert (the base linear velocity is rotated by the body's
orientation); joint coordinates are the same numbers in both. MuJoCo's ``qacc`` of a free joint
is the time derivative of its ``qvel`` (world-frame linear acceleration), diffmech's the
derivative of its body-frame ``v``: :func:`diffmech_acc_to_mjcf` converts.

What is refused (``ModelError`` naming the element): ball joints with springs, a free joint below the top
level, equality constraints, tendons that act (stiffness, damping, friction loss, limits,
armature, or used by an actuator), gravity compensation, nonlinear joint damping or stiffness
polynomials. What is ignored with one warning naming it: tendons that do nothing, fluid forces
(``density``/``viscosity``, the swimmer's; a ``Scene.from_mjcf`` scene with ``solver="mujoco"`` applies
them, :mod:`diffmech.sim.soft_fluid`), sensors and sites. Actuators are read (:class:`Actuator`,
``meta["mjcf"]["actuators"]``); :func:`actuator_forces` turns controls into joint forces.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..errors import ModelError, ShapeError
from .collision import Shape
from .spec import JointSpec, LinkSpec, RobotSpec
from .urdf import _rpy

__all__ = ["Actuator", "MjcfTree", "load_mjcf", "parse_mjcf", "mjcf_specs", "compile_mjcf", "mjcf_state_to_diffmech",
           "diffmech_state_to_mjcf", "diffmech_acc_to_mjcf", "actuator_forces"]

_FREE, _BALL, _SLIDE, _HINGE = 0, 1, 2, 3  # mjtJoint
_DSBL_SPRING, _DSBL_DAMPER, _DSBL_GRAVITY = 1 << 5, 1 << 6, 1 << 7  # mjtDisableBit
# mjtGeom numbers of the primitives diffmech's contact code knows (plane only as the ground)
_PLANE, _SPHERE, _CAPSULE, _ELLIPSOID, _CYLINDER, _BOX = 0, 2, 3, 4, 5, 6
_MESH = 7
_GEOM_NAMES = {0: "plane", 1: "hfield", 2: "sphere", 3: "capsule", 4: "ellipsoid", 5: "cylinder", 6: "box",
               7: "mesh", 8: "sdf"}


@dataclass(frozen=True)
class Actuator:
    """One MJCF actuator on a hinge or slide joint.

    The force it applies is ``gear * (gain * ctrl + bias0 + bias1 * gear * q + bias2 * gear * v)``
    on its joint (N m or N), with ``ctrl`` clipped to ``ctrlrange`` when ``ctrllimited`` and the
    bracket clipped to ``forcerange`` when ``forcelimited`` (MuJoCo's ``motor``: gain 1, no bias;
    ``position``: gain ``kp``, bias ``(0, -kp, -kv)``; ``velocity``: gain ``kv``, bias ``(0, 0, -kv)``).

    Attributes:
        name: actuator name. joint: the joint it drives. index: its row in MuJoCo's ``ctrl``.
        gear: transmission ratio. gain, bias: see above (``bias`` 3 numbers).
        ctrlrange, forcerange: ``(lo, hi)`` or None when not limited.
    """

    name: str
    joint: str
    index: int
    gear: float
    gain: float
    bias: tuple[float, float, float]
    ctrlrange: tuple[float, float] | None
    forcerange: tuple[float, float] | None


@dataclass
class MjcfTree:
    """One kinematic tree read from a compiled MJCF model.

    Attributes:
        spec: the :class:`RobotSpec` (``spec.meta["mjcf"]`` as documented in :func:`mjcf_specs`).
        floating_base: whether the tree's root body has a free joint.
        shapes: ``{link: [Shape, ...]}`` of its collision geoms of supported types.
        friction: ``{link: sliding friction}`` (the largest of the link's geoms).
        root: the MuJoCo body id of the tree's root (``0``, the world, for a combined fixed tree).
    """

    spec: RobotSpec
    floating_base: bool
    shapes: dict
    friction: dict
    root: int


def compile_mjcf(path: str | os.PathLike):
    """``mujoco.MjModel`` of the file ``path``.

    Raises:
        ModelError: no such file, or MuJoCo's compiler refuses it (its message included).
    """
    import mujoco

    src = os.fspath(path)
    if not os.path.isfile(src):
        raise ModelError(f"{src}: no such MJCF file")
    try:
        return mujoco.MjModel.from_xml_path(src)
    except Exception as e:  # mujoco raises ValueError with the compiler's message
        raise ModelError(f"{src}: MuJoCo cannot compile the file: {e}") from None


def _name(m, kind: str, i: int) -> str:
    import mujoco

    obj = {"body": mujoco.mjtObj.mjOBJ_BODY, "joint": mujoco.mjtObj.mjOBJ_JOINT, "geom": mujoco.mjtObj.mjOBJ_GEOM,
           "actuator": mujoco.mjtObj.mjOBJ_ACTUATOR, "tendon": mujoco.mjtObj.mjOBJ_TENDON,
           "sensor": mujoco.mjtObj.mjOBJ_SENSOR, "site": mujoco.mjtObj.mjOBJ_SITE,
           "equality": mujoco.mjtObj.mjOBJ_EQUALITY}[kind]
    return mujoco.mj_id2name(m, obj, i) or f"{kind}{i}"


def _quat_matrix(wxyz) -> np.ndarray:
    w, x, y, z = (float(a) for a in wxyz)
    n = math.sqrt(w * w + x * x + y * y + z * z)
    w, x, y, z = w / n, x / n, y / n, z / n
    return np.array([
        [1 - 2 * (y * y + z * z), 2 * (x * y - w * z), 2 * (x * z + w * y)],
        [2 * (x * y + w * z), 1 - 2 * (x * x + z * z), 2 * (y * z - w * x)],
        [2 * (x * z - w * y), 2 * (y * z + w * x), 1 - 2 * (x * x + y * y)],
    ])


def _pose(pos, wxyz) -> np.ndarray:
    T = np.eye(4)
    T[:3, :3] = _quat_matrix(wxyz)
    T[:3, 3] = np.asarray(pos, dtype=float)
    return T


def _shift(p) -> np.ndarray:
    T = np.eye(4)
    T[:3, 3] = np.asarray(p, dtype=float)
    return T


def _axis_angle(axis: np.ndarray, angle: float) -> np.ndarray:
    """4x4 rotation by ``angle`` (rad) about the unit ``axis`` (Rodrigues)."""
    a = axis / np.linalg.norm(axis)
    K = np.array([[0.0, -a[2], a[1]], [a[2], 0.0, -a[0]], [-a[1], a[0], 0.0]])
    T = np.eye(4)
    T[:3, :3] = np.eye(3) + math.sin(angle) * K + (1.0 - math.cos(angle)) * K @ K
    return T


def _geoms(m, b: int) -> range:
    return range(int(m.body_geomadr[b]), int(m.body_geomadr[b]) + int(m.body_geomnum[b]))


def _collides(m, g: int) -> bool:
    return bool(m.geom_contype[g] or m.geom_conaffinity[g])


def _vec(x) -> tuple[float, float, float]:
    return tuple(float(a) for a in x)


def _check_model(m, src: str, fluid: bool = False) -> None:
    """Refuse what would change the dynamics and diffmech cannot represent; warn once about what is
    ignored."""
    ignored = []
    if m.neq:
        names = [_name(m, "equality", i) for i in range(m.neq)]
        raise ModelError(f"{src}: equality constraint(s) {names}: diffmech does not support MJCF <equality>")
    acting, inert = [], []
    for t in range(m.ntendon):
        used = bool(np.any((m.actuator_trntype == 3) & (m.actuator_trnid[:, 0] == t))) if m.nu else False
        acts = (m.tendon_stiffness[t] != 0 or m.tendon_damping[t] != 0 or m.tendon_frictionloss[t] != 0
                or m.tendon_limited[t] or getattr(m, "tendon_armature", np.zeros(m.ntendon))[t] != 0 or used)
        (acting if acts else inert).append(_name(m, "tendon", t))
    if acting:
        raise ModelError(f"{src}: tendon(s) {acting} act on the joints (stiffness, damping, friction loss, "
                         "limits, armature or an actuator); diffmech does not support MJCF <tendon>")
    if inert:
        ignored.append(f"tendon(s) {inert} (they have no stiffness, damping, limit or actuator)")
    for j in range(m.njnt):
        t = int(m.jnt_type[j])
        name, body = _name(m, "joint", j), _name(m, "body", int(m.jnt_bodyid[j]))
        if t == _BALL and m.jnt_stiffness[j] != 0 and not m.opt.disableflags & _DSBL_SPRING:
            raise ModelError(f"{src}: ball joint '{name}' (body '{body}') has a spring (stiffness "
                             f"{float(m.jnt_stiffness[j]):g}); springs on ball joints are not supported")
        if t == _FREE and int(m.body_parentid[m.jnt_bodyid[j]]) != 0:
            raise ModelError(f"{src}: free joint '{name}' is on body '{body}', which is not a child of the "
                             "world; diffmech's free joint is the floating base of a tree's root")
        # MuJoCo 4's polynomial springs and dampers: diffmech's joints are linear
        poly = [f for f in ("jnt_stiffnesspoly", "dof_dampingpoly") if hasattr(m, f)
                and np.any(getattr(m, f)[j if f.startswith("jnt") else int(m.jnt_dofadr[j])] != 0)]
        if poly:
            raise ModelError(f"{src}: joint '{name}' has a nonlinear spring or damper ({poly[0]}); not supported")
    grav = np.nonzero(m.body_gravcomp != 0)[0]
    if len(grav):
        raise ModelError(f"{src}: body '{_name(m, 'body', int(grav[0]))}' has gravcomp; not supported")
    if not fluid and (m.opt.density != 0 or m.opt.viscosity != 0 or np.any(m.opt.wind != 0)):
        ignored.append(f"fluid forces (option density={m.opt.density:g}, viscosity={m.opt.viscosity:g})")
    if m.nsensor:
        ignored.append(f"{m.nsensor} sensor(s)")
    if m.nsite:
        ignored.append(f"site(s) {[_name(m, 'site', i) for i in range(m.nsite)]}")
    if ignored:
        warn(f"{src}: diffmech ignores " + "; ".join(ignored))


def _actuators(m, src: str) -> dict[int, list[Actuator]]:
    """``{joint id: [Actuator, ...]}``; a transmission other than a hinge/slide joint is refused."""
    out: dict[int, list[Actuator]] = {}
    for a in range(m.nu):
        name = _name(m, "actuator", a)
        trn, j = int(m.actuator_trntype[a]), int(m.actuator_trnid[a, 0])
        if trn not in (0, 1) or int(m.jnt_type[j]) not in (_HINGE, _SLIDE):
            raise ModelError(f"{src}: actuator '{name}' drives something other than a hinge or slide joint "
                             f"(transmission type {trn}); not supported")
        if (int(m.actuator_dyntype[a]) != 0 or int(m.actuator_gaintype[a]) != 0
                or int(m.actuator_biastype[a]) not in (0, 1)):
            raise ModelError(f"{src}: actuator '{name}' has activation dynamics or a nonlinear gain/bias; "
                             "only motor, position, velocity and affine general actuators are supported")
        extra = [f for f in ("actuator_armature", "actuator_damping", "actuator_delay")
                 if hasattr(m, f) and np.any(np.asarray(getattr(m, f)[a]) != 0)]
        if extra:
            raise ModelError(f"{src}: actuator '{name}' has a non-zero {extra[0]}; not supported")
        bias = (0.0, 0.0, 0.0) if int(m.actuator_biastype[a]) == 0 else _vec(m.actuator_biasprm[a, :3])
        out.setdefault(j, []).append(Actuator(
            name=name, joint=_name(m, "joint", j), index=a, gear=float(m.actuator_gear[a, 0]),
            gain=float(m.actuator_gainprm[a, 0]), bias=bias,
            ctrlrange=tuple(map(float, m.actuator_ctrlrange[a])) if m.actuator_ctrllimited[a] else None,
            forcerange=tuple(map(float, m.actuator_forcerange[a])) if m.actuator_forcelimited[a] else None))
    return out


def _geom_shape(m, g: int, offset: np.ndarray) -> tuple[Shape | None, str | None]:
    """The :class:`Shape` of geom ``g`` in the link frame (``offset``: body frame -> link frame), or
    ``(None, type name)`` for a type diffmech's contact code does not have."""
    t, size = int(m.geom_type[g]), m.geom_size[g]
    T = offset @ _pose(m.geom_pos[g], m.geom_quat[g])
    xyz, rpy = _vec(T[:3, 3]), _rpy(T[:3, :3])
    if t == _SPHERE:
        return Shape("sphere", (float(size[0]),), xyz, rpy), None
    if t == _CAPSULE:  # MuJoCo: radius, half-length of the segment; diffmech: radius, full length
        return Shape("capsule", (float(size[0]), 2.0 * float(size[1])), xyz, rpy), None
    if t == _CYLINDER:
        return Shape("cylinder", (float(size[0]), 2.0 * float(size[1])), xyz, rpy), None
    if t == _BOX:  # half sizes -> side lengths
        return Shape("box", tuple(2.0 * float(s) for s in size[:3]), xyz, rpy), None
    if t == _MESH and int(m.geom_dataid[g]) >= 0:
        return Shape("convex", (1.0,), xyz, rpy, _mesh_hull(m, int(m.geom_dataid[g]))), None
    return None, _GEOM_NAMES.get(t, str(t))


def _mesh_hull(m, k: int):
    """The convex hull of MuJoCo's compiled mesh ``k`` (its vertices ``mesh_vert``, in the geom's
    frame: MuJoCo has moved them to the mesh's centre of mass and inertia axes and put that offset
    in ``geom_pos`` / ``geom_quat``); MuJoCo collides meshes through their convex hulls too."""
    import mujoco

    from ..contact.convex import hull_from_points

    a, n = int(m.mesh_vertadr[k]), int(m.mesh_vertnum[k])
    name = mujoco.mj_id2name(m, mujoco.mjtObj.mjOBJ_MESH, k) or f"mesh{k}"
    return hull_from_points(np.asarray(m.mesh_vert[a:a + n], dtype=np.float64), where=f"mesh {name!r}")


def mjcf_specs(m, src: str = "<mjcf>", *, combine: bool = True, scene: bool = False,
               fluid: bool = False) -> list[MjcfTree]:
    """The kinematic trees of a compiled ``mujoco.MjModel``.

    Args:
        m: the compiled model.
        src: file name for messages.
        combine: one tree for the whole file when possible: every top-level body with degrees of
            freedom hangs from a massless ``"world"`` link (a fixed base), or the file's single moving
            tree with a free joint is a floating-base tree. ``False``: one tree per top-level body
            with degrees of freedom (what a :class:`~diffmech.sim.Scene` holds). A tree is named
            after its top-level body, or after the file (``<mujoco model>``) when it is the only one.
        scene: put joint damping in ``meta["mjcf"]`` only (the scene applies it as an implicit drive,
            as MuJoCo's Euler integrator does) instead of in the joints.
        fluid: the caller applies the file's fluid forces (a ``solver="mujoco"`` scene does): no
            warning that they are ignored.

    Returns:
        The trees. Each ``spec.meta["mjcf"]`` holds ``qpos_index`` and ``qvel_index`` (for each
        diffmech ``q``/``v`` coordinate its index in MuJoCo's ``qpos``/``qvel``, the quaternion
        reordered), ``armature`` and ``damping`` (per joint in ``q`` order), ``actuators`` (list of
        :class:`Actuator`), ``timestep`` (s), ``free`` (bool), ``source``, ``geoms`` (one
        ``(MuJoCo geom id, link name, 4x4 pose of the geom in the link frame)`` per colliding geom of
        the tree, every type; :mod:`diffmech.contact.soft_geoms` reads it).

    Raises:
        ModelError: see the module docstring; also a file whose top-level trees cannot form one
            model when ``combine`` (a free-floating tree beside others).
    """
    _check_model(m, src, fluid)
    acts = _actuators(m, src)
    nbody = m.nbody
    children: dict[int, list[int]] = {b: [] for b in range(nbody)}
    for b in range(1, nbody):
        children[int(m.body_parentid[b])].append(b)
    body_joints: dict[int, list[int]] = {b: [] for b in range(nbody)}
    for j in range(m.njnt):
        body_joints[int(m.jnt_bodyid[j])].append(j)
    subtree_dofs = np.zeros(nbody, dtype=int)
    for b in range(nbody - 1, 0, -1):  # children have larger ids than their parent
        subtree_dofs[b] += int(m.body_dofnum[b])
        subtree_dofs[int(m.body_parentid[b])] += subtree_dofs[b]
    tops = children[0]
    moving = [b for b in tops if subtree_dofs[b] > 0]
    if not moving:
        raise ModelError(f"{src}: no body of the file moves (no joints): nothing to simulate")
    free = {b for b in moving if body_joints[b] and int(m.jnt_type[body_joints[b][0]]) == _FREE}
    gravity = (0.0, 0.0, 0.0) if m.opt.disableflags & _DSBL_GRAVITY else _vec(m.opt.gravity)
    if combine and free and len(moving) > 1:
        raise ModelError(f"{src}: the file holds {len(moving)} moving trees "
                         f"({[_name(m, 'body', b) for b in moving]}), "
                         f"{[_name(m, 'body', b) for b in free]} with a free joint; load_mjcf returns one "
                         "RobotModel: use diffmech.sim.Scene.from_mjcf for several trees")
    if combine and not free:
        groups = [(0, tops)]
    else:
        groups = [(b, [b]) for b in moving]
    unsupported: dict[str, list[str]] = {}
    trees = [_tree(m, src, root, bodies, root in free, acts, gravity, scene, children, body_joints, unsupported)
             for root, bodies in groups]
    if unsupported:
        where = "; ".join(f"{k}: {v}" for k, v in unsupported.items())
        warn(f"{src}: geoms of types diffmech's contact code does not have are not used for contact ({where})")
    if len(trees) == 1 and _model_name(m):
        trees[0].spec.name = _model_name(m)  # the file's one tree: <mujoco model="...">
    return trees


def _tree(m, src, root: int, tops: list[int], floating: bool, acts, gravity, scene: bool,
          children: dict, body_joints: dict, unsupported: dict) -> MjcfTree:
    links: list[LinkSpec] = []
    joints: list[JointSpec] = []
    shapes: dict[str, list[Shape]] = {}
    friction: dict[str, float] = {}
    armature: list[float] = []
    damping: list[float] = []
    jnt_order: list[int] = []
    actuators: list[Actuator] = []
    geoms: list[tuple[int, str, np.ndarray]] = []  # (MuJoCo geom id, link, geom pose in the link frame)
    used: dict[str, set[str]] = {"link": set(), "joint": set()}

    def unique(name: str, kind: str = "link") -> str:
        # MuJoCo names are unique per kind; the frames added here ("__weld", "__joint") could clash
        base, k = name, 1
        while name in used[kind]:
            name, k = f"{base}_{k}", k + 1
        used[kind].add(name)
        return name

    def add_body(b: int, link: str, offset: np.ndarray) -> None:
        """Inertia and geoms of body ``b`` on ``link``, whose frame maps to the body frame by ``offset``
        (a point's link coordinates are ``offset @`` its body coordinates)."""
        R = _quat_matrix(m.body_iquat[b])
        I = R @ np.diag(m.body_inertia[b]) @ R.T
        com = offset[:3, :3] @ m.body_ipos[b] + offset[:3, 3]
        Rl = offset[:3, :3]
        links.append(LinkSpec(name=link, mass=float(m.body_mass[b]), com=_vec(com),
                              inertia=tuple(_vec(r) for r in Rl @ I @ Rl.T)))
        for g in _geoms(m, b):
            if not _collides(m, g):
                continue  # visual only: MuJoCo never collides it
            geoms.append((g, link, offset @ _pose(m.geom_pos[g], m.geom_quat[g])))
            shape, bad = _geom_shape(m, g, offset)
            if shape is None:
                unsupported.setdefault(bad, []).append(_name(m, "geom", g))
                continue
            shapes.setdefault(link, []).append(shape)
            friction[link] = max(friction.get(link, 0.0), float(m.geom_friction[g, 0]))

    def visit(b: int, parent_link: str, parent_offset: np.ndarray) -> None:
        body = _name(m, "body", b)
        prev_link, prev = parent_link, parent_offset @ _pose(m.body_pos[b], m.body_quat[b])
        js = body_joints[b]
        if not js:
            link = unique(body)
            joints.append(JointSpec(unique(f"{body}__weld", "joint"), "fixed", prev_link, link,
                                    xyz=_vec(prev[:3, 3]), rpy=_rpy(prev[:3, :3])))
            add_body(b, link, np.eye(4))
            for c in children[b]:
                visit(c, link, np.eye(4))
            return
        offset = np.eye(4)
        for k, j in enumerate(js):
            t = int(m.jnt_type[j])
            jname = _name(m, "joint", j)
            last = k == len(js) - 1
            link = unique(body if last else f"{body}__{jname}")
            if not last:
                links.append(LinkSpec(name=link))  # massless frame between two joints of one body
            anchor = m.jnt_pos[j] if t in (_HINGE, _BALL) else np.zeros(3)
            # MuJoCo moves a joint by q - qpos0 (the joint's ref); the placement absorbs -ref
            ref, axis = float(m.qpos0[m.jnt_qposadr[j]]), np.asarray(m.jnt_axis[j], dtype=float)
            place = prev @ _shift(anchor)
            if t != _BALL:  # a ball's qpos0 is the identity quaternion: no reference to absorb
                place = place @ (_shift(-ref * axis) if t == _SLIDE else _axis_angle(axis, -ref))
            limited = bool(m.jnt_limited[j])
            lo, hi = (float(m.jnt_range[j, 0]), float(m.jnt_range[j, 1])) if limited else (-math.inf, math.inf)
            if t == _BALL:
                lo, axis = 0.0, np.array([1.0, 0.0, 0.0])
            d = int(m.jnt_dofadr[j])
            damp = 0.0 if m.opt.disableflags & _DSBL_DAMPER else float(m.dof_damping[d])
            effort = (float(np.abs(m.jnt_actfrcrange[j]).max()) if m.jnt_actfrclimited[j] else math.inf)
            kind = "ball" if t == _BALL else "prismatic" if t == _SLIDE else ("revolute" if limited else "continuous")
            joints.append(JointSpec(
                unique(jname, "joint"), kind, prev_link, link, xyz=_vec(place[:3, 3]), rpy=_rpy(place[:3, :3]),
                axis=_vec(axis), lower=lo, upper=hi, effort=effort,
                damping=0.0 if scene else damp, friction=float(m.dof_frictionloss[d]),
                stiffness=0.0 if m.opt.disableflags & _DSBL_SPRING or t == _BALL else float(m.jnt_stiffness[j]),
                rest=0.0 if t == _BALL else float(m.qpos_spring[m.jnt_qposadr[j]])))
            for i in range(3 if t == _BALL else 1):
                armature.append(float(m.dof_armature[d + i]))
                damping.append(0.0 if m.opt.disableflags & _DSBL_DAMPER else float(m.dof_damping[d + i]))
            jnt_order.append(j)
            actuators.extend(acts.get(j, []))
            prev_link, offset = link, _shift(-anchor)
            prev = offset
        add_body(b, prev_link, offset)
        for c in children[b]:
            visit(c, prev_link, offset)

    if floating:
        body = _name(m, "body", root)
        fj = body_joints[root][0]
        if len(body_joints[root]) > 1 or np.any(m.jnt_pos[fj] != 0):
            raise ModelError(f"{src}: free joint '{_name(m, 'joint', fj)}' of body '{body}' has a non-zero pos "
                             "or other joints beside it; not supported")
        link = unique(body)
        add_body(root, link, np.eye(4))
        for c in children[root]:
            visit(c, link, np.eye(4))
        name = body
    else:
        world = unique(_name(m, "body", 0) if root == 0 else f"{_name(m, 'body', root)}__world")
        links.append(LinkSpec(name=world))
        for b in tops:
            visit(b, world, np.eye(4))
        name = (_model_name(m) or "mjcf") if root == 0 else _name(m, "body", root)
    qpos_index, qvel_index = [], []
    if floating:
        fj = body_joints[root][0]
        a, d = int(m.jnt_qposadr[fj]), int(m.jnt_dofadr[fj])
        qpos_index += [a, a + 1, a + 2, a + 4, a + 5, a + 6, a + 3]  # (qx, qy, qz, qw) from (w, x, y, z)
        qvel_index += list(range(d, d + 6))
    for j in jnt_order:
        a, d = int(m.jnt_qposadr[j]), int(m.jnt_dofadr[j])
        ball = int(m.jnt_type[j]) == _BALL
        qpos_index += [a + 1, a + 2, a + 3, a] if ball else [a]  # (qx, qy, qz, qw) from (w, x, y, z)
        qvel_index += [d, d + 1, d + 2] if ball else [d]
    meta = {"mjcf": {"qpos_index": qpos_index, "qvel_index": qvel_index, "armature": armature,
                     "damping": damping, "actuators": actuators, "timestep": float(m.opt.timestep),
                     "free": floating, "source": src, "geoms": geoms}}
    spec = RobotSpec(name=name, links=links, joints=joints, source=src, gravity=gravity, meta=meta)
    return MjcfTree(spec=spec, floating_base=floating, shapes=shapes, friction=friction, root=root)


def _model_name(m) -> str:
    raw = bytes(m.names)
    return raw[:raw.index(b"\0")].decode() if b"\0" in raw else ""


def parse_mjcf(path: str | os.PathLike) -> MjcfTree:
    """The file's one kinematic tree (see :func:`load_mjcf`)."""
    src = os.fspath(path)
    return mjcf_specs(compile_mjcf(src), src)[0]


def _robot(tree: MjcfTree, dtype, device):
    from ..robot import RobotModel  # above this package: imported when used

    tree.spec.meta["collision"] = tree.shapes
    return RobotModel(tree.spec, floating_base=tree.floating_base, dtype=dtype, device=device)


def load_mjcf(path: str | os.PathLike, *, dtype: torch.dtype = torch.float64,
              device: torch.device | str | None = None):
    """Load an MJCF file as one :class:`~diffmech.RobotModel`, compiled by MuJoCo's own compiler.

    The file's bodies with degrees of freedom form one tree: a top-level body with a free joint is
    the floating base (``q = (x, y, z, qx, qy, qz, qw, joints...)``, ``v`` in the body frame; see
    :func:`mjcf_state_to_diffmech` for MuJoCo's order and frames); otherwise every top-level body
    hangs from a massless ``"world"`` link (a fixed base; several arms and objects on slides, as
    pusher and reacher, are one tree). Joints come in MuJoCo's ``qpos`` order. Collision geoms of
    supported types (sphere, capsule, cylinder, box) are the links' collision shapes
    (:mod:`diffmech.model.collision`); the mapping of every quantity is in the module docstring.
    Armature is not part of the model: ``robot.meta["mjcf"]["armature"]``.

    Args:
        path: the ``.xml`` file (includes and meshes resolved relative to it by MuJoCo).
        dtype: dtype of the model's parameters (float64 by default).
        device: device of the model's parameters.

    Returns:
        The :class:`~diffmech.RobotModel`, gravity from the file's ``<option>``.

    Raises:
        ModelError (a :class:`~diffmech.DiffmechError`): no such file, MuJoCo refuses it, or it holds
            what diffmech cannot represent (ball joints, equality constraints, acting tendons, a
            free-floating tree beside other moving trees), naming the element.
    """
    return _robot(parse_mjcf(path), dtype, device)


# ------------------------------------------------------------------ state conversion
def _index(model) -> tuple[list[int], list[int]]:
    """Concatenated qpos/qvel indices of a model or of a scene's models."""
    models = [model.models[n] for n in model.names] if hasattr(model, "names") and hasattr(model, "models") else [model]
    qi, vi = [], []
    for mdl in models:
        info = mdl.meta.get("mjcf")
        if info is None:
            raise ModelError(f"{getattr(mdl, 'name', 'model')}: not loaded from an MJCF file (no meta['mjcf'])")
        qi += info["qpos_index"]
        vi += info["qvel_index"]
    return qi, vi


def _model_slices(model):
    if hasattr(model, "names") and hasattr(model, "models"):
        return [(model.models[n], model.slices[n], model.vslices[n]) for n in model.names]
    return [(model, slice(0, model.nq), slice(0, model.nv))]


def _quat_rotate_inv(quat_xyzw: Tensor, x: Tensor) -> Tensor:
    """``R(quat)^T x`` for unit quaternions ``(..., 4)`` in ``(x, y, z, w)`` order."""
    u, w = quat_xyzw[..., :3], quat_xyzw[..., 3:]
    t = 2.0 * torch.cross(u, x, dim=-1)
    return x - w * t + torch.cross(u, t, dim=-1)


def _quat_rotate(quat_xyzw: Tensor, x: Tensor) -> Tensor:
    u, w = quat_xyzw[..., :3], quat_xyzw[..., 3:]
    t = 2.0 * torch.cross(u, x, dim=-1)
    return x + w * t + torch.cross(u, t, dim=-1)


def mjcf_state_to_diffmech(model, qpos, qvel=None):
    """MuJoCo's ``(qpos (..., m.nq), qvel (..., m.nv))`` -> diffmech's ``(q (..., nq), v (..., nv))``.

    Args:
        model: a :class:`~diffmech.RobotModel` from :func:`diffmech.load_mjcf` or a
            :class:`~diffmech.sim.Scene` from :meth:`~diffmech.sim.Scene.from_mjcf`.
        qpos, qvel: MuJoCo's state of the whole file (tensors or arrays; ``qvel`` optional).

    Returns:
        ``(q, v)`` (``v`` None without ``qvel``) as tensors in the model's dtype: a free joint's
        quaternion reordered to ``(qx, qy, qz, qw)`` and its world-frame linear velocity rotated
        into the body frame.
    """
    opts = dict(dtype=model.dtype, device=model.device)
    qpos = torch.as_tensor(qpos, **opts)
    qi, vi = _index(model)
    q = qpos[..., qi]
    if qvel is None:
        return q, None
    v = torch.as_tensor(qvel, **opts)[..., vi].clone()
    for mdl, sq, sv in _model_slices(model):
        if mdl.meta["mjcf"]["free"]:
            quat = q[..., sq.start + 3:sq.start + 7]
            v[..., sv.start:sv.start + 3] = _quat_rotate_inv(quat, v[..., sv.start:sv.start + 3])
    return q, v


def diffmech_state_to_mjcf(model, q, v=None, qpos0=None):
    """diffmech's ``(q, v)`` -> MuJoCo's ``(qpos, qvel)`` (the inverse of :func:`mjcf_state_to_diffmech`).

    Args:
        model: as in :func:`mjcf_state_to_diffmech`.
        q, v: ``(..., nq)``, ``(..., nv)`` diffmech state (``v`` optional).
        qpos0: MuJoCo's ``m.qpos0`` ``(m.nq,)``, for coordinates the model does not have (none for a
            file loaded whole); zeros without it.

    Returns:
        ``(qpos (..., m.nq), qvel (..., m.nv))`` tensors (``qvel`` None without ``v``), a free joint's
        quaternion as ``(w, x, y, z)`` and its linear velocity in the world frame.
    """
    q = torch.as_tensor(q, dtype=model.dtype, device=model.device)
    qi, vi = _index(model)
    nq = max(qi) + 1 if qpos0 is None else len(qpos0)
    qpos = q.new_zeros(*q.shape[:-1], nq) if qpos0 is None else \
        torch.as_tensor(qpos0, dtype=q.dtype, device=q.device).expand(*q.shape[:-1], nq).clone()
    qpos[..., qi] = q
    if v is None:
        return qpos, None
    v = torch.as_tensor(v, dtype=model.dtype, device=model.device)
    vw = v.clone()
    for mdl, sq, sv in _model_slices(model):
        if mdl.meta["mjcf"]["free"]:
            i = sv.start
            vw[..., i:i + 3] = _quat_rotate(q[..., sq.start + 3:sq.start + 7], v[..., i:i + 3])
    qvel = v.new_zeros(*v.shape[:-1], max(vi) + 1)
    qvel[..., vi] = vw
    return qpos, qvel


def diffmech_acc_to_mjcf(model, q, v, a):
    """diffmech's acceleration ``a (..., nv)`` at ``(q, v)`` -> MuJoCo's ``qacc`` (``(..., m.nv)``).

    A free joint's MuJoCo linear acceleration is that of the body origin in the world frame,
    ``R (a_lin + w x v_lin)`` with diffmech's body-frame ``v_lin``, ``w`` and ``a_lin``; every
    other coordinate is the same number.
    """
    q, v, a = (torch.as_tensor(x, dtype=model.dtype, device=model.device) for x in (q, v, a))
    _, vi = _index(model)
    out = a.clone()
    for mdl, sq, sv in _model_slices(model):
        if mdl.meta["mjcf"]["free"]:
            i = sv.start
            lin = a[..., i:i + 3] + torch.cross(v[..., i + 3:i + 6], v[..., i:i + 3], dim=-1)
            out[..., i:i + 3] = _quat_rotate(q[..., sq.start + 3:sq.start + 7], lin)
    qacc = a.new_zeros(*a.shape[:-1], max(vi) + 1)
    qacc[..., vi] = out
    return qacc


def actuator_forces(model, ctrl, q=None, v=None) -> Tensor:
    """Joint forces ``(..., nv)`` of the file's actuators for controls ``ctrl (..., m.nu)``.

    Args:
        model: a model from :func:`diffmech.load_mjcf` or a scene from ``Scene.from_mjcf``.
        ctrl: MuJoCo's control vector (all the file's actuators, in its order).
        q, v: diffmech's state, needed only by actuators with a bias (``position``, ``velocity``).

    Returns:
        ``tau`` in diffmech's ``v`` order (zero on floating bases), N m or N, differentiable in
        ``ctrl``, ``q`` and ``v``; see :class:`Actuator` for the law.
    """
    ctrl = torch.as_tensor(ctrl, dtype=model.dtype, device=model.device)
    parts = []
    for mdl, sq, sv in _model_slices(model):
        info = mdl.meta["mjcf"]
        joints = list(mdl.joint_names)
        off_q, off_v = (7, 6) if info["free"] else (0, 0)
        cols = [torch.zeros_like(ctrl[..., 0])] * mdl.nv
        for act in info["actuators"]:
            k = joints.index(act.joint)
            u = ctrl[..., act.index]
            if act.ctrlrange is not None:
                u = u.clamp(act.ctrlrange[0], act.ctrlrange[1])
            f = act.gain * u + act.bias[0]
            if act.bias[1] or act.bias[2]:
                if q is None or v is None:
                    raise ShapeError(f"actuator_forces: actuator '{act.name}' has a position/velocity bias; "
                                     "pass q and v")
                qq = torch.as_tensor(q, dtype=model.dtype, device=model.device)[..., sq][..., off_q + k]
                vv = torch.as_tensor(v, dtype=model.dtype, device=model.device)[..., sv][..., off_v + k]
                f = f + act.bias[1] * act.gear * qq + act.bias[2] * act.gear * vv
            if act.forcerange is not None:
                f = f.clamp(act.forcerange[0], act.forcerange[1])
            cols[off_v + k] = cols[off_v + k] + act.gear * f
        parts.append(torch.stack(cols, -1) if cols else ctrl.new_zeros(*ctrl.shape[:-1], 0))  # a static model
    return torch.cat(parts, -1)


# ------------------------------------------------------------------ scenes

def _self_collision(m, root: int) -> bool:
    """Whether two geoms of the tree under ``root`` in bodies that are not parent and child can
    touch by their ``contype``/``conaffinity`` bits (MuJoCo's filter)."""
    bodies = [b for b in range(1, m.nbody) if int(m.body_rootid[b]) == root]
    geoms = [g for b in bodies for g in _geoms(m, b) if _collides(m, g)]
    for i, g in enumerate(geoms):
        for h in geoms[i + 1:]:
            a, b = int(m.geom_bodyid[g]), int(m.geom_bodyid[h])
            if a == b or int(m.body_parentid[a]) == b or int(m.body_parentid[b]) == a:
                continue
            if (m.geom_contype[g] & m.geom_conaffinity[h]) or (m.geom_contype[h] & m.geom_conaffinity[g]):
                return True
    return False


def _static_tree(m, src: str, trees: list[MjcfTree], world_geoms: list[int]) -> MjcfTree | None:
    """The fixed obstacles of a scene as one static tree (no moving joint: ``nq = 0``), or ``None``
    where there are none: a root link ``"world"`` holding the world body's colliding geoms
    ``world_geoms`` (the ground plane left out by the caller), with each top-level body without
    degrees of freedom below it, welded at its placement. Its geoms of types the contact code does
    not have (a plane that is not the ground, meshes, ...) are named in one warning."""
    roots = {t.root for t in trees}
    children: dict[int, list[int]] = {b: [] for b in range(m.nbody)}
    for b in range(1, m.nbody):
        children[int(m.body_parentid[b])].append(b)
    tops = [b for b in children[0] if b not in roots]  # a top-level body outside every moving tree: no dof
    if not world_geoms and not any(_collides(m, g) for b in range(1, m.nbody)
                                   if int(m.body_rootid[b]) in tops for g in _geoms(m, b)):
        return None
    unsupported: dict[str, list[str]] = {}
    body_joints: dict[int, list[int]] = {b: [] for b in range(m.nbody)}  # none: these bodies have no joint
    gravity = (0.0, 0.0, 0.0) if m.opt.disableflags & _DSBL_GRAVITY else _vec(m.opt.gravity)
    t = _tree(m, src, 0, tops, False, {}, gravity, True, children, body_joints, unsupported)
    world = t.spec.links[0].name
    for g in world_geoms:
        t.spec.meta["mjcf"]["geoms"].append((g, world, _pose(m.geom_pos[g], m.geom_quat[g])))
        shape, bad = _geom_shape(m, g, np.eye(4))
        if shape is None:
            unsupported.setdefault(bad, []).append(_name(m, "geom", g))
            continue
        t.shapes.setdefault(world, []).append(shape)
        t.friction[world] = max(t.friction.get(world, 0.0), float(m.geom_friction[g, 0]))
    if unsupported:
        where = "; ".join(f"{k}: {v}" for k, v in unsupported.items())
        warn(f"{src}: static geoms of types diffmech's contact code does not have are not used for contact "
             f"({where}; the ground is a plane z = 0 facing +z)")
    if not t.shapes:
        return None
    names = {tr.spec.name for tr in trees}
    name, k = "static", 1
    while name in names:
        name, k = f"static_{k}", k + 1
    t.spec.name = name
    return t


def scene_from_mjcf(cls, path, dtype, device, kwargs: dict):
    """:meth:`diffmech.sim.Scene.from_mjcf` (``cls`` the scene class)."""
    src = os.fspath(path)
    m = compile_mjcf(src)
    solver = kwargs.get("solver", "mujoco")
    trees = mjcf_specs(m, src, combine=False, scene=True, fluid=solver == "mujoco")
    ground, ground_friction, world_geoms = False, None, []
    for g in _geoms(m, 0):
        if not _collides(m, g):
            continue
        R = _quat_matrix(m.geom_quat[g])
        if (int(m.geom_type[g]) == _PLANE and not ground and abs(float(m.geom_pos[g, 2])) < 1e-12
                and np.allclose(R[:, 2], (0.0, 0.0, 1.0), atol=1e-12)):
            ground, ground_friction = True, float(m.geom_friction[g, 0])
        else:
            world_geoms.append(g)
    static = _static_tree(m, src, trees, world_geoms)
    if static is not None:  # the world's other geoms and the bodies welded to it: one static model
        trees = trees + [static]
    models, drives, frictions = {}, {}, {}
    for t in trees:
        robot = _robot(t, dtype, device)
        name = t.spec.name
        models[name] = robot
        info = t.spec.meta["mjcf"]
        arm, damp = info["armature"], info["damping"]
        if any(arm) or any(damp):
            drives[name] = {"armature": torch.tensor(arm, dtype=dtype, device=device),
                            "damping": torch.tensor(damp, dtype=dtype, device=device)}
        # a moving link's friction meets the ground's (MuJoCo takes the larger of a pair); an obstacle never
        # touches the ground and keeps its own
        floor = 0.0 if t is static else ground_friction or 0.0
        frictions[name] = {link: {"friction": max(f, floor)} for link, f in t.friction.items()}
    # MuJoCo's own step keeps damping and armature in scene.mujoco (from the compiled model), not in drives
    opts = dict(ground=ground, drives=(drives or None) if solver != "mujoco" else None,
                self_collision=any(_self_collision(m, t.root) for t in trees), solver=solver)
    if ground_friction is not None:
        opts["friction"] = ground_friction
    opts.update(kwargs)
    from ..sim.scene import _BUILDING_FROM_MJCF

    token = _BUILDING_FROM_MJCF.set(True)
    try:
        scene = cls(models, **opts)
    finally:
        _BUILDING_FROM_MJCF.reset(token)
    if "friction" not in kwargs and "pairs" not in kwargs:
        for name, table in frictions.items():
            scene.link_coefficients[name] = table
    scene.timestep = float(m.opt.timestep)
    if solver == "mujoco":
        from ..contact.soft_geoms import geom_table_from_mjmodel
        from ..sim.soft_fluid import fluid_model
        from ..sim.soft_step import options_from_mjmodel

        try:
            scene.mujoco = options_from_mjmodel(m, scene, src)
            scene.mujoco.geoms = geom_table_from_mjmodel(m, scene)
            scene.mujoco.fluid = fluid_model(m, scene)
        except ModelError as e:  # what MuJoCo's contact model here lacks; the hard-contact solvers may load it
            where = "" if str(e).startswith(src) else f"{src}: "
            raise ModelError(f"{where}{e} (Scene.from_mjcf(..., solver='pgs') loads the file with diffmech's hard "
                             "contacts)") from None
    return scene
