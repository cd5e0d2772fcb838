"""``KinematicTree``: the immutable description of a robot's tree, separate from its parameter values.

As Pinocchio's ``Model`` topology and MJX's static ``Model`` fields: what the algorithms need to
know about a tree that never changes -- topology, joint types and axes, the coordinate layout and
the index tables the batched algorithms use -- is plain Python data fixed at construction. The
values (masses, inertias, placements, passive terms, gravity) live elsewhere
(:class:`~diffmech.model.parameters.RobotParameters` holds them and produces
:class:`~diffmech.model.parameters.ModelTensors`), so that algorithms are pure functions of
``(tree, values, state)``.

Bodies vs links: links joined by ``fixed`` joints are merged into one rigid *body* (as Pinocchio
does), so the dynamics loops run over moving bodies only; every link keeps its own frame for
kinematics. A link that carries no moving joint above it is attached to the world (body ``-1``).
A tree without a moving joint and without a floating base is *static* (``nb = nq = nv = 0``, as
Pinocchio builds it): its links keep their fixed placements, the joint-space algorithms return
empty ``(..., 0)`` results, and a :class:`~diffmech.sim.Scene` uses it as a fixed obstacle.

Generalised coordinates: ``q = [q_base (7), q_joints]`` with ``q_base = (x, y, z, qx, qy, qz, qw)``
when ``floating_base`` is set; one coordinate per revolute/continuous/prismatic joint and four, a
unit quaternion ``(qx, qy, qz, qw)``, per ball joint, in ``joint_names`` order. ``v = [v_base (6),
v_joints]`` with ``v_base = (linear; angular)`` velocity of the root link in its own frame
(Pinocchio's free-flyer convention), and per ball joint the angular velocity of its child frame in
that frame (Pinocchio's ``JointModelSpherical``).

Ball joints: the algorithms work on bodies of one DoF each (the floating base aside), so a ball
joint becomes three bodies on one origin -- the first carries the joint's rotation ``R(quat)``
and turns about its ``x`` axis, the two massless ones below it about ``y`` and ``z`` with identity
placements, and the last carries the child link. At any configuration the three columns are the
child frame's axes through the joint origin, the ball's motion subspace. Unlike a gimbal, the three
columns turn with the child body, so each DoF's velocity-product term uses the last body's velocity
(``TreeTables.c_body``); the first two bodies have no mass and no other children, so nothing else
sees their partial velocities.

:attr:`KinematicTree.structure_hash` identifies everything generated code depends on (topology,
joint kinds, coordinate layout) and nothing else: two robots with the same tree shape share native
kernels whatever their names, dimensions and masses.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from .._warnings import warn
from ..errors import ModelError
from .spec import JOINT_TYPES, JointSpec, RobotSpec
from .validate import check_spec_values

__all__ = ["KinematicTree", "TreeTables", "CoordinateMap", "symmetric_from_pairs"]


@dataclass(frozen=True)
class CoordinateMap:
    """How a tree with mimic joints maps its generalised coordinates to joint space.

    Joint space has one coordinate per moving joint (what the algorithms work in); the generalised
    coordinates leave out the joints that mimic another one: joint ``k`` of joint space is
    ``q_k = scale_k * q[src_k] + offset_k`` (``v_k = scale_k * v[src_k]``). Forces map back by the
    transpose: ``tau[i] = sum_{k: src_k = i} scale_k tau_k``; mass matrices ``G^T M G``.

    Attributes:
        nq, nv: sizes of the generalised ``q`` and ``v``.
        joint_names: the independent joints (the generalised coordinates after a floating base).
        q_src, v_src: per joint-space coordinate (base coordinates first), its generalised index.
        q_scale, q_offset, v_scale: per joint-space coordinate.
        lower, upper, velocity, effort: limits of the independent joints.
    """

    nq: int
    nv: int
    joint_names: tuple
    q_src: tuple
    q_scale: tuple
    q_offset: tuple
    v_src: tuple
    v_scale: tuple
    lower: tuple
    upper: tuple
    velocity: tuple
    effort: tuple


@dataclass(frozen=True)
class TreeTables:
    """Index tables of a tree as tensors on one device (masks in one floating dtype).

    Attributes:
        mask_bd: (nb, nv) ``1`` where DoF ``d`` moves body ``i`` (an ancestor sum is ``mask_bd @ x``).
        mask_db: (nv, nb) its transpose (a subtree sum).
        crba_d, crba_e: (npairs,) long, the pairs ``(d, e)`` of DoFs with ``d``'s body at or above
            ``e``'s, whose mass-matrix entries CRBA computes.
        crba_gather: (nv * nv,) long, for each entry of the row-major ``(nv, nv)`` mass matrix the
            pair whose value it takes (``(d, e)`` and ``(e, d)``), ``npairs`` where no pair reaches it:
            ``pad(vals, (0, 0, 0, 1)).index_select(0, crba_gather)`` places per-pair values ``vals
            (npairs, B)`` (see :func:`symmetric_from_pairs`). O(nv^2) memory.
        crba_scatter: (nv * nv, npairs) the same placement as a dense 0/1 matrix. It has
            O(nv^2 npairs) entries (O(nv^4) on a chain: gigabytes from about 100 DoFs), so it is
            built only when first read, except on small trees; the algorithms use ``crba_gather``.
        dof_body: (nv,) long, the body each DoF moves.
        jumps: (k, nb + 1) long, pointer-jumping table: row ``k`` maps each body (and the world,
            index ``nb``) to its ancestor ``2^k`` levels up, the world once past the root.
        link_body: (n_links,) long, each link's body (``-1``: fixed to the world).
        axes: (nj, 3) unit joint axes; prismatic: (nj,) ``1.0`` on prismatic joints.
        moving_links, moving_link_body: (k,) long, the links that move and their bodies.
        body_joint, body_joint_parent_link: (nj,) long, see :class:`KinematicTree`.
        fixed_levels: per fixed depth, ``(links, parent links, joints)`` as long tensors.
        q_src, v_src, q_scale, q_offset, v_scale: the :class:`CoordinateMap` as tensors (``None``
            without mimic joints).
        c_body: (nv,) long, the body whose velocity turns each DoF's column (the DoF's own body but
            on ball joints, whose three columns turn with the ball's last body); ``None`` without
            ball joints. The ball tables below are ``None`` without ball joints too.
        q_scalar: (nj,) long, the ``q`` index of each one-DoF body's angle, ``nq`` (a zero row
            appended to ``q``) on the bodies of ball joints.
        ball_first: (n_ball,) long, the first body of each ball joint, counted from the first joint
            body (an index into the ``nj`` joint rows).
        ball_q, ball_v: (4 n_ball,), (3 n_ball,) long, the quaternion and angular-velocity indices in
            ``q`` and ``v``; scalar_q, scalar_v: those of the other joints (base excluded).
        ball_inner: (nj,) ``1.0`` on the second and third body of each ball joint; ball_body: (nj,)
            ``1.0`` on all three.
    """

    mask_bd: Tensor
    mask_db: Tensor
    crba_d: Tensor
    crba_e: Tensor
    crba_gather: Tensor
    dof_body: Tensor
    jumps: Tensor
    link_body: Tensor
    axes: Tensor
    prismatic: Tensor
    moving_links: Tensor
    moving_link_body: Tensor
    body_joint: Tensor
    body_joint_parent_link: Tensor
    fixed_levels: tuple
    q_src: Tensor | None = None
    v_src: Tensor | None = None
    q_scale: Tensor | None = None
    q_offset: Tensor | None = None
    v_scale: Tensor | None = None
    c_body: Tensor | None = None
    q_scalar: Tensor | None = None
    ball_first: Tensor | None = None
    ball_q: Tensor | None = None
    ball_v: Tensor | None = None
    scalar_q: Tensor | None = None
    scalar_v: Tensor | None = None
    ball_inner: Tensor | None = None
    ball_body: Tensor | None = None
    _crba_scatter: Tensor | None = field(default=None, repr=False, compare=False)

    @property
    def crba_scatter(self) -> Tensor:
        """(nv * nv, npairs) 0/1 matrix: ``crba_scatter @ vals`` places per-pair values at ``(d, e)``
        and ``(e, d)`` (built on first use on large trees; prefer :attr:`crba_gather`)."""
        if self._crba_scatter is None:
            object.__setattr__(self, "_crba_scatter", _scatter_matrix(self.crba_gather, self.crba_d.shape[0],
                                                                      self.mask_bd.dtype))
        return self._crba_scatter


# Trees whose dense CRBA scatter matrix has at most this many entries (8 MiB in float64; chains up to
# about 35 DoFs) get it with their tables, as every tree used to; larger ones build it only if read.
EAGER_SCATTER_MAX = 1 << 20


def _scatter_matrix(gather: Tensor, npairs: int, dtype: torch.dtype) -> Tensor:
    """The dense ``(len(gather), npairs)`` 0/1 matrix of a gather index (``npairs``: no pair)."""
    rows = torch.arange(gather.shape[0], device=gather.device)
    hit = gather < npairs
    out = torch.zeros(gather.shape[0], npairs, dtype=dtype, device=gather.device)
    return out.index_put_((rows[hit], gather[hit]), torch.ones((), dtype=dtype, device=gather.device))


def symmetric_from_pairs(tables: TreeTables, vals: Tensor) -> Tensor:
    """``(B, nv, nv)`` symmetric matrix from its values ``vals (npairs, B)`` at the CRBA pairs
    ``(tables.crba_d, tables.crba_e)``: one gather, O(nv^2 B) memory, differentiable, and usable under
    ``torch.func`` transforms and ``torch.compile``."""
    nv = math.isqrt(tables.crba_gather.shape[0])
    M = torch.nn.functional.pad(vals, (0, 0, 0, 1)).index_select(0, tables.crba_gather)  # (nv * nv, B)
    return M.transpose(0, 1).reshape(-1, nv, nv)


def pair_gather(nv: int, d: Tensor, e: Tensor, mirror: Tensor) -> Tensor:
    """(nv * nv,) long: the index of pair ``k`` at ``(d[k], e[k])`` and, where ``mirror[k]``, at
    ``(e[k], d[k])``; ``len(d)`` at the entries no pair reaches."""
    k = torch.arange(d.shape[0], dtype=torch.long, device=d.device)
    out = torch.full((nv * nv,), d.shape[0], dtype=torch.long, device=d.device)
    out[(e * nv + d)[mirror]] = k[mirror]
    out[d * nv + e] = k  # last: where a pair and a mirrored one meet (same body) they agree anyway
    return out


class KinematicTree:
    """The immutable structure of a kinematic tree.

    Build one from a :class:`~diffmech.model.spec.RobotSpec` (or get ``robot.tree``). Every
    attribute is plain Python data (ints, tuples); :meth:`tables` gives the index tables as tensors.

    Attributes:
        name, source: robot name and where the description came from (error messages).
        floating_base: whether the root link is attached to the world by a free joint.
        nfree: ``1`` with a floating base, else ``0``.
        link_names: all links in depth-first order (the order of ``forward_kinematics`` outputs).
        all_joint_names: every joint (fixed ones too), in the order of its child link
            (``link_names[1:]``); ``joint_kinds`` their types.
        joint_names: the moving joints, in ``q``/``v`` order; ``joint_types`` their types.
        nq, nv, nb, nj, n_links: sizes of ``q``, ``v``; moving bodies; one-DoF bodies; links.
        link_parent: parent link of each link (``-1`` for the root).
        link_body: the body each link belongs to (``-1``: fixed to the world).
        body_parent: parent body of each body (``-1``: hangs from the world).
        body_joint: for each one-DoF body, the index of its joint in ``all_joint_names``.
        body_depth: depth of each body (0 for bodies hanging from the world).
        dof_body: the body moved by each DoF.
        levels: per depth, ``(bodies, their parents)``.
        level_dofs: per depth, the DoF index of each of its one-DoF bodies.
        aba_gather: DoF order from ABA's root-first, level-by-level order.
        crba_pairs: the ``(d, e)`` pairs of :class:`TreeTables`.
        jumps: the pointer-jumping rows of :class:`TreeTables`.
        world_links: links fixed to the world; moving_links: the others.
        fixed_levels: per fixed depth ``d >= 1``, ``(links, their parent links, their joints)`` of the
            links ``d`` fixed joints below their body's frame (offsets are composed level by level).
        body_joint_parent_link: the parent link of each one-DoF body's joint.
        body_kinds: the joint type of each one-DoF body (``"ball"`` on all three of a ball joint's).
        n_ball: the number of ball joints; ball_joints: per ball joint ``(first body - nfree, q index
            of its quaternion, v index of its angular velocity)``.
        q_scalar: per one-DoF body, the ``q`` index of its angle (``-1`` on ball bodies).
        q_joint_start, v_joint_start: first joint coordinate in ``q`` and ``v`` (7 and 6 with a
            floating base).
        is_prismatic: per one-DoF body; ``any_prismatic``.
        axes: unit joint axis of each one-DoF body, in its joint frame.
        lower, upper, velocity, effort: limits per moving joint (``inf`` where absent; a ball joint's
            ``lower`` is ``0`` and its ``upper`` the largest rotation angle).
        coords: ``None``, or the :class:`CoordinateMap` of a tree with mimic joints: then ``nq`` and
            ``nv`` here count joint space, and ``coords.nq``/``coords.nv`` the generalised
            coordinates a :class:`~diffmech.RobotModel` takes.
        structure_hash: hex digest of what generated code depends on (see the module docstring).
    """

    def __init__(self, spec: RobotSpec, *, floating_base: bool = False):
        self.name = spec.name
        self.source = spec.source
        self.floating_base = bool(floating_base)
        self._tables: dict = {}
        self._tables_lock = threading.Lock()
        self._build(spec)

    # The tree is immutable: attribute writes after construction are refused.
    def __setattr__(self, key, value):
        if getattr(self, "_frozen", False):
            raise AttributeError(f"KinematicTree is immutable (tried to set '{key}')")
        object.__setattr__(self, key, value)

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_tables", None)
        state.pop("_tables_lock", None)
        return state

    def __setstate__(self, state):
        state = dict(state)
        if "_anc" not in state and "body_ancestors" in state:  # pickled before the array
            state["_anc"] = np.array(state.pop("body_ancestors"), dtype=bool).reshape(state["nb"], state["nb"])
            state["_anc"].flags.writeable = False
            state.pop("crba_pairs", None)
        if "n_ball" not in state:  # pickled before ball joints: every joint body has one angle
            state.update(n_ball=0, ball_joints=(), body_kinds=state["joint_types"],
                         q_scalar=tuple(range(state["q_joint_start"], state["nq"])))
        object.__setattr__(self, "__dict__", state)
        object.__setattr__(self, "_tables", {})
        object.__setattr__(self, "_tables_lock", threading.Lock())

    def __deepcopy__(self, memo):
        return self  # immutable

    def __repr__(self) -> str:
        return (f"KinematicTree({self.name!r}, links={self.n_links}, bodies={self.nb}, nq={self.nq}, nv={self.nv}, "
                f"floating_base={self.floating_base})")

    # ------------------------------------------------------------------ construction
    def _build(self, spec: RobotSpec) -> None:
        src = spec.source
        names = [link.name for link in spec.links]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ModelError(f"{src}: duplicate link name(s) {sorted(dup)}")
        jnames = [j.name for j in spec.joints]
        dupj = {n for n in jnames if jnames.count(n) > 1}
        if dupj:
            raise ModelError(f"{src}: duplicate joint name(s) {sorted(dupj)}")
        by_name = {link.name: link for link in spec.links}
        if not spec.links:
            raise ModelError(f"{src}: the robot has no links")
        parent_joint: dict[str, JointSpec] = {}
        children: dict[str, list[JointSpec]] = {n: [] for n in names}
        for j in spec.joints:
            if j.type not in JOINT_TYPES:
                raise ModelError(
                    f"{src}: joint '{j.name}' has type '{j.type}'; supported types are {', '.join(JOINT_TYPES)}"
                )
            for role, link in (("parent", j.parent), ("child", j.child)):
                if link not in by_name:
                    raise ModelError(f"{src}: joint '{j.name}' names {role} link '{link}', which does not exist")
            if j.child in parent_joint:
                raise ModelError(
                    f"{src}: link '{j.child}' is the child of two joints ('{parent_joint[j.child].name}' and "
                    f"'{j.name}'): a kinematic tree allows one parent per link (closed loops are not supported)"
                )
            if j.type == "ball":
                if j.mimic is not None:
                    raise ModelError(f"{src}: ball joint '{j.name}' cannot mimic another joint")
                if j.stiffness != 0:
                    raise ModelError(f"{src}: ball joint '{j.name}' has stiffness {j.stiffness}; springs on ball "
                                     "joints are not supported")
                if not j.upper >= 0:
                    raise ModelError(f"{src}: ball joint '{j.name}' has a negative cone angle {j.upper}")
            elif j.type != "fixed":
                axis = list(map(float, j.axis))
                norm = math.sqrt(sum(a * a for a in axis))
                if not norm > 1e-12 or not math.isfinite(norm):
                    raise ModelError(f"{src}: joint '{j.name}' has a zero or invalid axis {tuple(j.axis)}")
            if j.type in ("prismatic", "revolute") and j.lower > j.upper:
                raise ModelError(f"{src}: joint '{j.name}' has lower limit {j.lower} > upper limit {j.upper}")
            parent_joint[j.child] = j
            children[j.parent].append(j)
        roots = [n for n in names if n not in parent_joint]
        if len(roots) == 0:
            raise ModelError(
                f"{src}: no root link (every link has a parent): the joints form a cycle through links "
                f"{_cycle_from(names[0], parent_joint)}"
            )
        if len(roots) > 1:
            raise ModelError(f"{src}: the links form {len(roots)} trees, with roots {roots}; expected one root link")
        check_spec_values(spec)  # every number, mass and inertia: the rules of diffmech.model.validate

        # Depth-first order from the root (children in file order), as Pinocchio numbers joints.
        order: list[str] = []
        stack = [roots[0]]
        while stack:
            name = stack.pop()
            order.append(name)
            stack.extend(j.child for j in reversed(children[name]))
        if len(order) != len(names):
            missing = sorted(set(names) - set(order))
            raise ModelError(
                f"{src}: links {missing} are not reachable from root '{roots[0]}': the joints form a cycle "
                f"through links {_cycle_from(missing[0], parent_joint)}"
            )
        link_specs = [by_name[n] for n in order]
        joint_specs = [parent_joint[n] for n in order[1:]]  # in the order of their child link
        static = not self.floating_base and all(j.type == "fixed" for j in joint_specs)
        for link in link_specs:
            if not link.has_inertial and not static:  # a static model's masses play no part
                warn(f"{src}: link '{link.name}' has no <inertial>: treated as massless")
        link_index = {n: i for i, n in enumerate(order)}

        # Bodies: the floating root (if any), then one per moving joint in depth-first order.
        nfree = 1 if self.floating_base else 0
        body_parent: list[int] = [-1] * nfree
        link_body: list[int] = [0 if self.floating_base else -1]
        link_parent: list[int] = [-1]
        body_joint: list[int] = []
        balls: list[tuple[int, int, int]] = []  # (first body - nfree, q index, v index)
        q_scalar: list[int] = []
        nq_j = 0
        for k, j in enumerate(joint_specs):
            pl = link_index[j.parent]
            link_parent.append(pl)
            if j.type == "fixed":
                link_body.append(link_body[pl])
            elif j.type == "ball":
                first = len(body_parent)
                balls.append((first - nfree, 7 * nfree + nq_j, 6 * nfree + len(body_joint)))
                for i in range(3):
                    body_parent.append(link_body[pl] if i == 0 else first + i - 1)
                    body_joint.append(k)
                    q_scalar.append(-1)
                link_body.append(first + 2)
                nq_j += 4
            else:
                q_scalar.append(7 * nfree + nq_j)
                nq_j += 1
                body_parent.append(link_body[pl])
                body_joint.append(k)
                link_body.append(len(body_parent) - 1)
        # No moving joint and no floating base: a static model (nq = nv = 0, as Pinocchio builds it),
        # whose links all hang from the world at fixed placements (a table, a ramp: a Scene's obstacle).
        nb, nj = len(body_parent), len(body_joint)
        nq, nv = 7 * nfree + nq_j, 6 * nfree + nj

        depth: list[int] = []
        for p in body_parent:
            depth.append(0 if p < 0 else depth[p] + 1)
        by_depth: list[list[int]] = [[] for _ in range(max(depth, default=-1) + 1)]
        for b, d in enumerate(depth):
            by_depth[d].append(b)
        levels = [(tuple(idx), tuple(body_parent[b] for b in idx)) for idx in by_depth]

        # anc[i, j]: body j is body i or one of its ancestors. Every body comes after its parent, so
        # its row is its parent's plus itself (O(nb^2) bits, copied in C: a 1000-body chain in 1 ms).
        anc = np.zeros((nb, nb), dtype=bool)
        for i, p in enumerate(body_parent):
            if p >= 0:
                anc[i] = anc[p]
            anc[i, i] = True
        anc.flags.writeable = False
        dof_body = [0] * (6 * nfree) + [nfree + k for k in range(nj)]
        dof0 = 5 * nfree  # the DoF of one-DoF body b is b + 5 * nfree
        level_dofs = tuple(tuple(b + dof0 for b in idx) for idx, _ in levels)
        aba_order = list(range(6 * nfree))
        for idx, _ in levels:
            if not (nfree and idx == (0,)):
                aba_order.extend(b + dof0 for b in idx)
        aba_gather = [0] * nv
        for k, d in enumerate(aba_order):
            aba_gather[d] = k
        up = [p if p >= 0 else nb for p in body_parent] + [nb]
        jumps = []
        while any(a != nb for a in up):
            jumps.append(tuple(up))
            up = [up[a] for a in up]

        # Fixed joints compose link offsets within a body; links at fixed depth d (d fixed joints below
        # their body's frame) are placed together once depth d - 1 is known.
        fixed_depth = [0]
        for j in joint_specs:
            fixed_depth.append(fixed_depth[link_index[j.parent]] + 1 if j.type == "fixed" else 0)
        fixed_levels = []
        for d in range(1, max(fixed_depth) + 1):
            ls = tuple(i for i in range(1, len(order)) if fixed_depth[i] == d)
            fixed_levels.append((ls, tuple(link_parent[i] for i in ls), tuple(i - 1 for i in ls)))

        kinds = [joint_specs[k].type for k in body_joint]
        axes = []
        for i, k in enumerate(body_joint):
            if kinds[i] == "ball":  # x, y, z of the child frame on the ball's three bodies
                first = next(b for b, _, _ in balls if b <= i < b + 3)
                axes.append(tuple(float(c == i - first) for c in range(3)))
                continue
            a = [float(x) for x in joint_specs[k].axis]
            n = math.sqrt(sum(x * x for x in a))
            axes.append(tuple(x / n for x in a))
        moving = list(dict.fromkeys(body_joint))  # one entry per moving joint, in q/v order
        lim = lambda attr: tuple(  # noqa: E731
            (0.0 if attr == "lower" and joint_specs[k].type == "ball" else float(getattr(joint_specs[k], attr)))
            for k in moving)

        self.link_names = tuple(order)
        self.link_index = dict(link_index)
        self.all_joint_names = tuple(j.name for j in joint_specs)
        self.joint_kinds = tuple(j.type for j in joint_specs)
        self.joint_index = {j.name: k for k, j in enumerate(joint_specs)}
        self.joint_parent_link = tuple(link_index[j.parent] for j in joint_specs)
        self.nfree = nfree
        self.nb, self.nj, self.nq, self.nv, self.n_links = nb, nj, nq, nv, len(order)
        self.body_parent = tuple(body_parent)
        self.link_body = tuple(link_body)
        self.link_parent = tuple(link_parent)
        self.body_joint = tuple(body_joint)
        self.joint_names = tuple(joint_specs[k].name for k in moving)
        self.joint_types = tuple(joint_specs[k].type for k in moving)
        self.body_kinds = tuple(kinds)
        self.n_ball = len(balls)
        self.ball_joints = tuple(balls)
        self.q_scalar = tuple(q_scalar)
        self.body_depth = tuple(depth)
        self._anc = anc
        self.levels = tuple(levels)
        self.level_dofs = level_dofs
        self.dof_body = tuple(dof_body)
        self.aba_gather = tuple(aba_gather)
        self.jumps = tuple(jumps)
        self.world_links = tuple(i for i, b in enumerate(link_body) if b < 0)
        self.moving_links = tuple(i for i, b in enumerate(link_body) if b >= 0)
        self.q_joint_start, self.v_joint_start = 7 * nfree, 6 * nfree
        self.fixed_levels = tuple(fixed_levels)
        self.body_joint_parent_link = tuple(link_index[joint_specs[k].parent] for k in body_joint)
        self.is_prismatic = tuple(t == "prismatic" for t in kinds)
        self.any_prismatic = any(self.is_prismatic)
        self.axes = tuple(axes)
        self.lower, self.upper = lim("lower"), lim("upper")
        self.velocity, self.effort = lim("velocity"), lim("effort")
        self.coords = _coordinate_map(src, joint_specs, body_joint, nfree, self)
        self.structure_hash = hashlib.sha256(json.dumps({
            "format": 1, "nfree": nfree, "body_parent": body_parent, "link_body": link_body,
            "link_parent": link_parent, "kinds": kinds, "n_links": len(order),
            "coords": None if self.coords is None else [self.coords.q_src, self.coords.v_src],
        }, sort_keys=True).encode()).hexdigest()
        self._frozen = True

    # ------------------------------------------------------------------ pair tables
    @property
    def body_ancestors(self) -> tuple:
        """``body_ancestors[i][j]``: body ``j`` is body ``i`` or one of its ancestors (nested tuples of
        bools; the tables are built from a boolean array)."""
        return tuple(tuple(row) for row in self._anc.tolist())

    def crba_pair_array(self) -> np.ndarray:
        """``(npairs, 2)`` int64: the ``(d, e)`` pairs of :attr:`crba_pairs` (``e``, then ``d`` ascending)."""
        db = np.asarray(self.dof_body, dtype=np.int64)
        e, d = np.nonzero(self._anc[np.ix_(db, db)])  # [e, d]: d's body is e's or above it
        return np.stack([d, e], 1)

    def body_pair_array(self) -> np.ndarray:
        """``(n, 2)`` int64: every pair ``(a, b)`` of bodies with ``a`` the body ``b`` or one of its
        ancestors; ``b`` ascending, then from ``b`` up to its root."""
        # An ancestor has a smaller index than its descendants: along a row of the reversed matrix the
        # ancestors of b come from b up to the root.
        b, c = np.nonzero(self._anc[:, ::-1])
        return np.stack([self.nb - 1 - c, b], 1)

    @property
    def crba_pairs(self) -> tuple:
        """The ``(d, e)`` pairs of DoFs with ``d``'s body at or above ``e``'s, as tuples (built on
        first use; the tables are built from an array)."""
        return self._build_once(("crba_pairs",), lambda: tuple(map(tuple, self.crba_pair_array().tolist())))

    # ------------------------------------------------------------------ lookups
    def link(self, link: str | int) -> int:
        """Index of ``link`` in :attr:`link_names` (a name or an index)."""
        n = len(self.link_names)
        if isinstance(link, int) and not isinstance(link, bool):
            if not -n <= link < n:
                raise ModelError(f"{self.name}: link index {link} out of range (robot has {n} links)")
            return link % n
        if link not in self.link_index:
            raise ModelError(f"{self.name}: no link named '{link}'; links are {list(self.link_names)}")
        return self.link_index[link]

    def joint(self, joint: str) -> int:
        """Index of ``joint`` (moving or fixed) in :attr:`all_joint_names`."""
        if joint not in self.joint_index:
            raise ModelError(f"{self.name}: no joint named '{joint}'; joints are {list(self.all_joint_names)}")
        return self.joint_index[joint]

    def tables(self, dtype: torch.dtype, device: torch.device | str | None = None) -> TreeTables:
        """The index tables as tensors (masks in ``dtype``) on ``device``; built once per pair."""
        device = torch.device(device) if device is not None else torch.device("cpu")
        got = self._tables.get((dtype, device))
        return got if got is not None else self._build_once((dtype, device), lambda: self._make_tables(dtype, device))

    def derived(self, key: tuple, build):
        """A value derived from the tree alone, built once by ``build()`` and kept with the tree under
        ``key`` (algorithms keep their own index tables here; an attribute of the tree, unlike a
        module-level cache, is something ``torch.compile`` can guard on)."""
        key = ("derived", *key)
        got = self._tables.get(key)
        return got if got is not None else self._build_once(key, build)

    def _build_once(self, key: tuple, build):
        with self._tables_lock:
            got = self._tables.get(key)
            if got is None:
                got = self._tables[key] = build()
        return got

    def _make_tables(self, dtype, device) -> TreeTables:
        nb, nv = self.nb, self.nv
        A = torch.from_numpy(self._anc.copy())
        db = torch.tensor(self.dof_body, dtype=torch.long)
        mask_bd = A[:, db].to(dtype).contiguous()  # mask_bd[i, d]: DoF d moves body i
        # Index tables only: every one here has O(nb nv) or O(npairs) <= O(nv^2) entries.
        pairs = torch.from_numpy(self.crba_pair_array())
        d, e = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
        gather = pair_gather(nv, d, e, db[d] != db[e])
        kw = dict(device=device)
        long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
        return TreeTables(
            mask_bd=mask_bd.to(**kw), mask_db=mask_bd.T.contiguous().to(**kw),
            crba_d=d.to(**kw), crba_e=e.to(**kw), crba_gather=gather.to(**kw), dof_body=db.to(**kw),
            _crba_scatter=(_scatter_matrix(gather, len(d), dtype).to(**kw)
                           if nv * nv * len(d) <= EAGER_SCATTER_MAX else None),
            jumps=torch.tensor(self.jumps, dtype=torch.long, **kw).reshape(-1, nb + 1),
            link_body=long(self.link_body),
            axes=torch.tensor(self.axes, dtype=dtype, device=device).reshape(self.nj, 3),
            prismatic=torch.tensor(self.is_prismatic, dtype=dtype, device=device),
            moving_links=long(self.moving_links),
            moving_link_body=long([self.link_body[i] for i in self.moving_links]),
            body_joint=long(self.body_joint), body_joint_parent_link=long(self.body_joint_parent_link),
            fixed_levels=tuple((long(a), long(b), long(c)) for a, b, c in self.fixed_levels),
            **({} if self.coords is None else dict(
                q_src=long(self.coords.q_src), v_src=long(self.coords.v_src),
                q_scale=torch.tensor(self.coords.q_scale, dtype=dtype, device=device),
                q_offset=torch.tensor(self.coords.q_offset, dtype=dtype, device=device),
                v_scale=torch.tensor(self.coords.v_scale, dtype=dtype, device=device))),
            **({} if not self.n_ball else self._ball_tables(dtype, device)),
        )

    def _ball_tables(self, dtype, device) -> dict:
        """The ball-joint fields of :class:`TreeTables`."""
        long = lambda x: torch.tensor(x, dtype=torch.long, device=device).reshape(-1)  # noqa: E731
        nf, j0 = self.nfree, 6 * self.nfree
        c_body = list(self.dof_body)
        inner = [0.0] * self.nj
        ball_q, ball_v = [], []
        for first, qi, vi in self.ball_joints:
            for i in range(3):
                c_body[j0 + first + i] = nf + first + 2
            inner[first + 1] = inner[first + 2] = 1.0
            ball_q += range(qi, qi + 4)
            ball_v += range(vi, vi + 3)
        in_ball = set(ball_v)
        return dict(
            c_body=long(c_body), q_scalar=long([i if i >= 0 else self.nq for i in self.q_scalar]),
            ball_first=long([b for b, _, _ in self.ball_joints]), ball_q=long(ball_q), ball_v=long(ball_v),
            scalar_q=long([i for i in self.q_scalar if i >= 0]),
            scalar_v=long([d for d in range(j0, self.nv) if d not in in_ball]),
            ball_inner=torch.tensor(inner, dtype=dtype, device=device),
            ball_body=torch.tensor([float(i < 0) for i in self.q_scalar], dtype=dtype, device=device),
        )


def _coordinate_map(src: str, joint_specs: list[JointSpec], body_joint: list[int], nfree: int,
                    tree: KinematicTree) -> CoordinateMap | None:
    """The :class:`CoordinateMap` of the moving joints' ``mimic`` entries (``None`` if there are none)."""
    moving = [joint_specs[k] for k in body_joint]
    if not any(j.mimic is not None for j in moving):
        for j in joint_specs:
            if j.mimic is not None:
                raise ModelError(f"{src}: fixed joint '{j.name}' has a <mimic> tag; only moving joints can mimic")
        return None
    if any(j.type == "ball" for j in joint_specs):
        raise ModelError(f"{src}: mimic joints in a tree with ball joints are not supported")
    index = {j.name: i for i, j in enumerate(moving)}
    for j in joint_specs:
        if j.mimic is None:
            continue
        if j.type == "fixed":
            raise ModelError(f"{src}: fixed joint '{j.name}' has a <mimic> tag; only moving joints can mimic")
        if j.mimic[0] not in index:
            raise ModelError(f"{src}: joint '{j.name}' mimics '{j.mimic[0]}', which is not a moving joint")
    # Resolve chains (a mimics b mimics c): q_a = s_a (s_b q_c + o_b) + o_a.
    resolved: dict[int, tuple[int, float, float]] = {}

    def resolve(i: int, seen: tuple) -> tuple[int, float, float]:
        if i in resolved:
            return resolved[i]
        j = moving[i]
        if j.mimic is None:
            out = (i, 1.0, 0.0)
        else:
            if i in seen:
                names = [moving[k].name for k in seen]
                raise ModelError(f"{src}: mimic joints form a cycle: {names}")
            m, s, o = resolve(index[j.mimic[0]], seen + (i,))
            a, b = float(j.mimic[1]), float(j.mimic[2])
            out = (m, a * s, a * o + b)  # q_j = a q_k + b with q_k = s q_m + o
        resolved[i] = out
        return out

    masters = [resolve(i, ()) for i in range(len(moving))]
    independent = [i for i, j in enumerate(moving) if j.mimic is None]
    position = {i: n for n, i in enumerate(independent)}
    q_src = list(range(7 * nfree)) + [7 * nfree + position[m] for m, _, _ in masters]
    v_src = list(range(6 * nfree)) + [6 * nfree + position[m] for m, _, _ in masters]
    joint_scale = [s for _, s, _ in masters]
    pick = lambda values: tuple(values[i] for i in independent)  # noqa: E731
    return CoordinateMap(
        nq=7 * nfree + len(independent), nv=6 * nfree + len(independent),
        joint_names=tuple(moving[i].name for i in independent),
        q_src=tuple(q_src), q_scale=tuple([1.0] * (7 * nfree) + joint_scale),
        q_offset=tuple([0.0] * (7 * nfree) + [o for _, _, o in masters]),
        v_src=tuple(v_src), v_scale=tuple([1.0] * (6 * nfree) + joint_scale),
        lower=pick(tree.lower), upper=pick(tree.upper), velocity=pick(tree.velocity), effort=pick(tree.effort),
    )


def _cycle_from(start: str, parent_joint: dict[str, JointSpec]) -> str:
    """Walk parents from ``start`` until a link repeats; describe the loop as ``[links] via joints [...]``."""
    seen: list[str] = []
    link = start
    while link not in seen and link in parent_joint:
        seen.append(link)
        link = parent_joint[link].parent
    loop = seen[seen.index(link):] if link in seen else seen
    return f"{loop} via joints {[parent_joint[n].name for n in loop]}"
