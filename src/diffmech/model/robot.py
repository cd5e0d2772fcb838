"""``RobotModel``: a kinematic tree as a ``torch.nn.Module``.

The topology (parents, joint types, index maps, ancestor masks) is static Python / integer data
fixed at construction. The physical parameters -- each link's mass, centre of mass and inertia,
each joint's placement, damping and spring -- are tensors held by small per-link and per-joint
modules, so any of them can be made learnable by swapping in a parametrization
(``torch.nn.utils.parametrize``); optimisers, ``state_dict``, ``.to()`` and
``torch.func.functional_call`` then work as for any module.

Bodies vs links: links joined by ``fixed`` joints are merged into one rigid *body* (as Pinocchio
does), so the dynamics loops run over moving bodies only; every link keeps its own frame for
kinematics. A link that carries no moving joint above it is attached to the world (body ``-1``).

Generalised coordinates: ``q = [q_base (7), q_joints]`` with ``q_base = (x, y, z, qx, qy, qz, qw)``
(position of the root link in the world, unit quaternion of its orientation, Pinocchio's order)
when ``floating_base`` is set; one coordinate per revolute/continuous/prismatic joint in
``joint_names`` order (a continuous joint is one angle). ``v = [v_base (6), v_joints]`` with
``v_base = (linear; angular)`` velocity of the root link *in its own frame* (Pinocchio's
free-flyer convention).
"""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .. import spatial
from ..errors import ModelError
from .spec import JOINT_TYPES, JointSpec, LinkSpec, RobotSpec

__all__ = ["RobotModel", "LinkParams", "JointParams", "ModelTensors"]

_LINK_PARAMS = ("mass", "com", "inertia")
_JOINT_PARAMS = ("origin_xyz", "origin_rpy", "damping", "friction", "stiffness", "rest")
# Names used by differentiable-robot-model, accepted as aliases.
_ALIASES = {
    "inertia_mat": "inertia",
    "trans": "origin_xyz",
    "rot_angles": "origin_rpy",
    "joint_damping": "damping",
    "spring_stiffness": "stiffness",
    "spring_rest": "rest",
}


class LinkParams(nn.Module):
    """Inertial parameters of one link (link frame, SI units).

    Tensors: ``mass ()``, ``com (3,)``, ``inertia (3, 3)`` about the centre of mass.
    ``inertial_source`` may hold a module returning ``(mass, com, inertia)`` jointly (used by
    parametrizations that must see all ten inertial parameters at once, e.g. physical consistency).
    """

    def __init__(self, spec: LinkSpec, dtype: torch.dtype, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.register_buffer("mass", torch.tensor(float(spec.mass), **kw))
        self.register_buffer("com", torch.tensor(spec.com, **kw).reshape(3))
        self.register_buffer("inertia", torch.tensor(spec.inertia, **kw).reshape(3, 3))
        self.inertial_source: nn.Module | None = None

    def inertial(self) -> tuple[Tensor, Tensor, Tensor]:
        """Return ``(mass (), com (3,), inertia (3, 3))``."""
        if self.inertial_source is not None:
            return self.inertial_source()
        return self.mass, self.com, self.inertia


class JointParams(nn.Module):
    """Placement and passive parameters of one joint.

    Tensors: ``origin_xyz (3,)`` m and ``origin_rpy (3,)`` rad (joint frame in the parent link
    frame), ``damping ()``, ``friction ()``, ``stiffness ()``, ``rest ()``.
    """

    def __init__(self, spec: JointSpec, dtype: torch.dtype, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.register_buffer("origin_xyz", torch.tensor(spec.xyz, **kw).reshape(3))
        self.register_buffer("origin_rpy", torch.tensor(spec.rpy, **kw).reshape(3))
        for name in ("damping", "friction", "stiffness", "rest"):
            self.register_buffer(name, torch.tensor(float(getattr(spec, name)), **kw))


class ModelTensors(NamedTuple):
    """Per-call constants derived from the parameters, in one dtype/device.

    ``nb`` moving bodies, ``nj`` one-DoF bodies (``nb - 1`` with a floating base, else ``nb``),
    ``nl`` links. Fields used in the batch-last algorithms carry a trailing broadcast dimension.
    The joint rotation about a unit axis is ``R_joint = I + sin q K + (1 - cos q) K^2``, so the
    joint's placement in its parent body, ``R_tree R_joint``, is ``A0 + sin q A1 + (1 - cos q) A2``.
    """

    A0: Tensor  # (nj, 3, 3, 1) R_tree: joint frame in the parent body frame
    A1: Tensor  # (nj, 3, 3, 1) R_tree K (zero for prismatic joints)
    A2: Tensor  # (nj, 3, 3, 1) R_tree K^2
    p_tree: Tensor  # (nj, 3, 1) joint origin in the parent body frame
    lin_dir: Tensor  # (nj, 3, 1) R_tree axis for prismatic joints, zero for revolute
    rot_axis: Tensor  # (nj, 3, 1) revolute axis in the body frame, zero for prismatic
    lin_axis: Tensor  # (nj, 3, 1) prismatic axis in the body frame, zero for revolute
    body_mass: Tensor  # (nb,) mass of each body (its rigidly attached links)
    body_h: Tensor  # (nb, 3) first mass moment sum m c about the body origin, body frame
    body_I: Tensor  # (nb, 3, 3) rotational inertia about the body origin, body axes
    link_R: Tensor  # (nl, 3, 3) link frame in its body frame (world for world-fixed links)
    link_p: Tensor  # (nl, 3)
    link_mass: Tensor  # (nl,)
    link_com: Tensor  # (nl, 3) in link frame
    damping: Tensor  # (nj,)
    stiffness: Tensor  # (nj,)
    rest: Tensor  # (nj,)
    gravity: Tensor  # (3,)


class RobotModel(nn.Module):
    """A kinematic tree with batched, differentiable kinematics and dynamics.

    Build one with :func:`diffmech.load_urdf` or the builders of :mod:`diffmech.model.systems`.

    Attributes:
        name: robot name.
        link_names: all links, in the order of :meth:`forward_kinematics` outputs.
        joint_names: the moving joints, in ``q``/``v`` order (after the 7/6 base coordinates
            when ``floating_base``).
        nq, nv: sizes of ``q`` and ``v``.
        floating_base: whether the root link is attached to the world by a free joint.
        actuated_joints: the joints with actuators (default: all of ``joint_names``).
    """

    def __init__(
        self,
        spec: RobotSpec,
        *,
        floating_base: bool = False,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if not dtype.is_floating_point:
            raise ModelError(f"RobotModel dtype must be floating point, got {dtype}")
        self.name = spec.name
        self.source = spec.source
        self.floating_base = bool(floating_base)
        self._build_topology(spec)
        self.links = nn.ModuleList([LinkParams(spec_l, dtype, device) for spec_l in self._link_specs])
        self.joints = nn.ModuleList([JointParams(spec_j, dtype, device) for spec_j in self._joint_specs])
        gravity = torch.as_tensor(spec.gravity, dtype=dtype, device=device)
        if gravity.shape != (3,):
            raise ModelError(f"{spec.source}: gravity must have shape (3,), got {tuple(gravity.shape)}")
        self.register_buffer("gravity", gravity.clone())
        self._cache: tuple | None = None
        #: Joints driven by actuators (all moving joints unless a builder says otherwise, e.g. the
        #: cartpole's slider); controllers and environments read it, the dynamics do not.
        self.actuated_joints: list[str] = list(self.joint_names)

    # ------------------------------------------------------------------ topology
    def _build_topology(self, spec: RobotSpec) -> None:
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
            if j.type != "fixed":
                axis = list(map(float, j.axis))
                norm = math.sqrt(sum(a * a for a in axis))
                if not norm > 1e-12 or not math.isfinite(norm):
                    raise ModelError(f"{src}: joint '{j.name}' has a zero or invalid axis {tuple(j.axis)}")
            if j.type == "prismatic" or j.type == "revolute":
                if j.lower > j.upper:
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
        for link in spec.links:
            if link.mass < 0 or not math.isfinite(link.mass):
                raise ModelError(f"{src}: link '{link.name}' has invalid mass {link.mass}")
            _check_inertia(src, link)

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

        self._link_specs = [by_name[n] for n in order]
        self.link_names: list[str] = order
        self._link_index = {n: i for i, n in enumerate(order)}
        # joints in the order of their child link; the root link has none
        self._joint_specs = [parent_joint[n] for n in order[1:]]
        self.all_joint_names = [j.name for j in self._joint_specs]
        self._joint_index = {j.name: k for k, j in enumerate(self._joint_specs)}
        for link in self._link_specs:
            if not link.has_inertial:
                warnings.warn(
                    f"{src}: link '{link.name}' has no <inertial>: treated as massless", stacklevel=4
                )

        # Bodies: the floating root (if any), then one per moving joint in depth-first order.
        nfree = 1 if self.floating_base else 0
        body_parent: list[int] = [-1] * nfree
        link_body: list[int] = [0 if self.floating_base else -1]
        link_parent: list[int] = [-1]
        body_joint: list[int] = []  # joint index (into _joint_specs) of each one-DoF body
        for k, j in enumerate(self._joint_specs):
            li = k + 1
            pl = self._link_index[j.parent]
            link_parent.append(pl)
            if j.type == "fixed":
                link_body.append(link_body[pl])
            else:
                body_parent.append(link_body[pl])
                body_joint.append(k)
                link_body.append(len(body_parent) - 1)
            assert len(link_body) == li + 1
        self.nb = len(body_parent)
        self.nj = len(body_joint)
        self._nfree = nfree
        self.body_parent = body_parent
        self.link_body = link_body
        self.link_parent = link_parent
        self._body_joint = body_joint
        self.joint_names: list[str] = [self._joint_specs[k].name for k in body_joint]
        self.joint_types: list[str] = [self._joint_specs[k].type for k in body_joint]
        self.nq = 7 * nfree + self.nj
        self.nv = 6 * nfree + self.nj
        if self.nb == 0:
            raise ModelError(f"{src}: the robot has no moving joint (and no floating base): nothing to simulate")

        # Depth levels of the bodies (bodies at one depth are processed together).
        depth = []
        for p in body_parent:
            depth.append(0 if p < 0 else depth[p] + 1)
        self.body_depth = depth
        self._levels = []
        for d in range(max(depth) + 1):
            idx = [b for b in range(self.nb) if depth[b] == d]
            self._levels.append((idx, [body_parent[b] for b in idx]))

        # Ancestor masks. A[j, i] = 1 if body j is body i or one of its ancestors.
        A = torch.zeros(self.nb, self.nb, dtype=torch.bool)
        for i in range(self.nb):
            j = i
            while j >= 0:
                A[j, i] = True
                j = body_parent[j]
        dof_body = [0] * (6 * nfree) + [nfree + k for k in range(self.nj)]
        self.dof_body = dof_body
        db = torch.tensor(dof_body, dtype=torch.long)
        # mask_bd[i, d]: dof d moves body i
        mask_bd = A[db, :].T.contiguous().to(torch.float64)
        self.register_buffer("_mask_bd", mask_bd, persistent=False)
        self.register_buffer("_mask_db", mask_bd.T.contiguous(), persistent=False)
        # Mass-matrix entries: pairs (d, e) with body(d) at or above body(e); M[d, e] = S_d . Ic_e S_e.
        # `_crba_scatter` places each pair's value at (d, e) and, for distinct bodies, at (e, d).
        pairs = [(d, e) for e in range(self.nv) for d in range(self.nv) if bool(A[dof_body[d], dof_body[e]])]
        scatter = torch.zeros(self.nv * self.nv, len(pairs), dtype=torch.float64)
        for k, (d, e) in enumerate(pairs):
            scatter[d * self.nv + e, k] = 1
            if dof_body[d] != dof_body[e]:
                scatter[e * self.nv + d, k] = 1
        self.register_buffer("_crba_d", torch.tensor([d for d, _ in pairs], dtype=torch.long), persistent=False)
        self.register_buffer("_crba_e", torch.tensor([e for _, e in pairs], dtype=torch.long), persistent=False)
        self.register_buffer("_dof_body", torch.tensor(dof_body, dtype=torch.long), persistent=False)
        self.register_buffer("_crba_scatter", scatter, persistent=False)
        self._body_anc = A
        # ABA processes one depth at a time; DoF of one-DoF body b is b + 5 * nfree.
        dof0 = 5 * nfree
        self._level_dofs = [[b + dof0 for b in idx] for idx, _ in self._levels]
        # ABA yields accelerations root first, then level by level; `_aba_gather` puts them in DoF order.
        order = list(range(6 * nfree))
        for idx, _ in self._levels:
            if not (nfree and idx == [0]):
                order.extend(b + dof0 for b in idx)
        self._aba_gather = [order.index(d) for d in range(self.nv)]
        # Pointer jumping for small-batch pose composition: row k maps each body (and the world,
        # index nb) to its ancestor 2^k levels up, the world once past the root.
        anc = [p if p >= 0 else self.nb for p in body_parent] + [self.nb]
        jumps = []
        while any(a != self.nb for a in anc):
            jumps.append(anc)
            anc = [anc[a] for a in anc]
        self.register_buffer("_jumps", torch.tensor(jumps, dtype=torch.long).reshape(-1, self.nb + 1),
                             persistent=False)
        self._world_links = [i for i, b in enumerate(link_body) if b < 0]
        self._q_joint_start = 7 * nfree
        self._v_joint_start = 6 * nfree

        # Link offsets are composed from the root through fixed joints: topological order suffices.
        kinds = [self._joint_specs[k].type for k in body_joint]
        self._is_prismatic = [t == "prismatic" for t in kinds]
        self._any_prismatic = any(self._is_prismatic)
        lim = lambda attr: [float(getattr(self._joint_specs[k], attr)) for k in body_joint]  # noqa: E731
        self.register_buffer("position_lower", torch.tensor(lim("lower"), dtype=torch.float64), persistent=False)
        self.register_buffer("position_upper", torch.tensor(lim("upper"), dtype=torch.float64), persistent=False)
        self.register_buffer("velocity_limit", torch.tensor(lim("velocity"), dtype=torch.float64), persistent=False)
        self.register_buffer("effort_limit", torch.tensor(lim("effort"), dtype=torch.float64), persistent=False)
        axes = []
        for k in body_joint:
            a = torch.tensor(self._joint_specs[k].axis, dtype=torch.float64)
            axes.append(a / a.norm())
        self.register_buffer(
            "_axes", torch.stack(axes) if axes else torch.zeros(0, 3, dtype=torch.float64), persistent=False
        )

    # ------------------------------------------------------------------ parameters
    def _cache_key(self, dtype, device) -> tuple | None:
        """Identity and version of every parameter tensor, or ``None`` when results must not be
        cached (a parametrization, an inertial source, or a tensor that requires grad)."""
        key = [dtype, device, id(self.gravity), self.gravity._version]
        for m in (*self.links._modules.values(), *self.joints._modules.values()):
            d = m.__dict__
            if d["_modules"]:  # parametrize or an inertial source installed a submodule
                return None
            for t in d["_buffers"].values():
                key.append(id(t))
                key.append(t._version)
            for t in d["_parameters"].values():
                if t.requires_grad:
                    return None
                key.append(id(t))
                key.append(t._version)
        return tuple(key)

    @torch.compiler.disable
    def model_tensors(self, dtype: torch.dtype | None = None, device=None) -> ModelTensors:
        """Constants of the algorithms derived from the current parameters, differentiably.

        Cached while no parameter is learnable and no tensor was changed in place.
        """
        dtype = dtype or self.gravity.dtype
        device = torch.device(device) if device is not None else self.gravity.device
        key = None if self.gravity.requires_grad else self._cache_key(dtype, device)
        if key is not None and self._cache is not None and self._cache[0] == key:
            return self._cache[1]
        mt = self._compute_tensors(dtype, device)
        if key is not None:
            self._cache = (key, mt)
        return mt

    def _compute_tensors(self, dtype, device) -> ModelTensors:
        kw = dict(dtype=dtype, device=device)
        cast = lambda t: t.to(**kw)  # noqa: E731
        nl = len(self.link_names)
        # Joint placements of all joints at once.
        if self.joints:
            xyz = torch.stack([cast(j.origin_xyz) for j in self.joints])
            Rj = spatial.rpy_to_matrix(torch.stack([cast(j.origin_rpy) for j in self.joints]))
        # Offsets of every link in its body frame; the joint frame of a moving joint in its parent body.
        eye = torch.eye(3, **kw)
        zero = torch.zeros(3, **kw)
        link_R: list[Tensor] = [eye]
        link_p: list[Tensor] = [zero]
        tree_R: list[Tensor] = []
        tree_p: list[Tensor] = []
        for k, js in enumerate(self._joint_specs):
            pl = self.link_parent[k + 1]
            R = link_R[pl] @ Rj[k]
            p = link_p[pl] + link_R[pl] @ xyz[k]
            if js.type == "fixed":
                link_R.append(R)
                link_p.append(p)
            else:
                tree_R.append(R)
                tree_p.append(p)
                link_R.append(eye)
                link_p.append(zero)
        link_R_t = torch.stack(link_R)
        link_p_t = torch.stack(link_p)
        if self.nj:
            R_tree, p_tree = torch.stack(tree_R), torch.stack(tree_p)
        else:
            R_tree, p_tree = torch.zeros(0, 3, 3, **kw), torch.zeros(0, 3, **kw)

        inertial = [link.inertial() for link in self.links]
        mass = torch.stack([cast(m) for m, _, _ in inertial])
        com = torch.stack([cast(c) for _, c, _ in inertial])
        inertia = torch.stack([cast(i) for _, _, i in inertial])
        # A raw learnable 3x3 drifts off symmetry under unconstrained updates; ABA assumes symmetry,
        # so only the symmetric part is physical.
        inertia = 0.5 * (inertia + inertia.transpose(-1, -2))
        # Mass, first moment and inertia about the body origin: these add up across links
        # without dividing by a (possibly zero) body mass.
        c_b = link_p_t + (link_R_t @ com[..., None])[..., 0]
        I_c = link_R_t @ inertia @ link_R_t.transpose(-1, -2)
        I_o = I_c + mass[:, None, None] * ((c_b * c_b).sum(-1)[:, None, None] * eye - c_b[:, :, None] * c_b[:, None, :])
        keep = [i for i, b in enumerate(self.link_body) if b >= 0]
        body = torch.tensor([self.link_body[i] for i in keep], dtype=torch.long, device=device)
        keep_t = torch.tensor(keep, dtype=torch.long, device=device)
        body_mass = torch.zeros(self.nb, **kw).index_add(0, body, mass[keep_t])
        body_h = torch.zeros(self.nb, 3, **kw).index_add(0, body, (mass[:, None] * c_b)[keep_t])
        body_I = torch.zeros(self.nb, 3, 3, **kw).index_add(0, body, I_o[keep_t])

        axes = cast(self._axes)
        pris = torch.tensor(self._is_prismatic, **kw)[:, None] if self.nj else torch.zeros(0, 1, **kw)
        rot_axis = axes * (1 - pris)
        lin_axis = axes * pris
        K = spatial.skew(rot_axis)
        A1 = R_tree @ K
        A2 = A1 @ K
        lin_dir = (R_tree @ lin_axis[..., None])[..., 0]
        joint_of_body = [self.joints[k] for k in self._body_joint]
        if self.nj:
            damping = torch.stack([cast(j.damping) for j in joint_of_body])
            stiffness = torch.stack([cast(j.stiffness) for j in joint_of_body])
            rest = torch.stack([cast(j.rest) for j in joint_of_body])
        else:
            damping = stiffness = rest = torch.zeros(0, **kw)
        assert link_R_t.shape[0] == nl
        return ModelTensors(
            A0=R_tree[..., None], A1=A1[..., None], A2=A2[..., None], p_tree=p_tree[..., None],
            lin_dir=lin_dir[..., None], rot_axis=rot_axis[..., None], lin_axis=lin_axis[..., None],
            body_mass=body_mass, body_h=body_h, body_I=body_I,
            link_R=link_R_t, link_p=link_p_t, link_mass=mass, link_com=com,
            damping=damping, stiffness=stiffness, rest=rest, gravity=cast(self.gravity),
        )

    def link_params(self, link: str) -> LinkParams:
        """The parameter module of ``link``."""
        return self.links[self.link_index(link)]

    def joint_params(self, joint: str) -> JointParams:
        """The parameter module of ``joint`` (moving or fixed)."""
        if joint not in self._joint_index:
            raise ModelError(f"{self.name}: no joint named '{joint}'; joints are {self.all_joint_names}")
        return self.joints[self._joint_index[joint]]

    def link_index(self, link: str | int) -> int:
        """Index of ``link`` in :attr:`link_names` (names or indices accepted)."""
        if isinstance(link, int):
            if not -len(self.link_names) <= link < len(self.link_names):
                raise ModelError(
                    f"{self.name}: link index {link} out of range (robot has {len(self.link_names)} links)"
                )
            return link % len(self.link_names)
        if link not in self._link_index:
            raise ModelError(f"{self.name}: no link named '{link}'; links are {self.link_names}")
        return self._link_index[link]

    def _param_owner(self, link: str, name: str) -> tuple[nn.Module, str]:
        name = _ALIASES.get(name, name)
        li = self.link_index(link)
        if name in _LINK_PARAMS:
            return self.links[li], name
        if name in _JOINT_PARAMS:
            if li == 0:
                raise ModelError(f"{self.name}: link '{link}' is the root link and has no parent joint with '{name}'")
            return self.joints[li - 1], name
        raise ModelError(
            f"{self.name}: unknown link parameter '{name}'; choose from {_LINK_PARAMS + _JOINT_PARAMS}"
        )

    def make_link_param_learnable(self, link: str, name: str, parametrization: nn.Module | None = None) -> None:
        """Turn one physical parameter of ``link`` into a trainable ``nn.Parameter``.

        Args:
            link: link name.
            name: ``mass``, ``com``, ``inertia`` (link inertial), or ``origin_xyz``, ``origin_rpy``,
                ``damping``, ``friction``, ``stiffness``, ``rest`` (of the joint whose child is
                ``link``). differentiable-robot-model's names (``inertia_mat``, ``trans``,
                ``rot_angles``, ``joint_damping``) are accepted too.
            parametrization: optional ``nn.Module`` mapping an unconstrained tensor to the
                parameter (e.g. :class:`diffmech.model.params.PositiveScalar`); it is registered
                with ``torch.nn.utils.parametrize``, and its ``right_inverse`` (if any) sets the
                initial value from the current one.
        """
        module, name = self._param_owner(link, name)
        if name in _LINK_PARAMS and getattr(module, "inertial_source", None) is not None:
            raise ModelError(
                f"{self.name}: the inertial parameters of link '{link}' are already learnable jointly "
                f"({type(module.inertial_source).__name__}); '{name}' is not read separately"
            )
        if parametrize.is_parametrized(module, name):
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
        value = getattr(module, name).detach().clone()
        if name in module._buffers:
            del module._buffers[name]
        elif name in module._parameters:
            del module._parameters[name]
        module.register_parameter(name, nn.Parameter(value))
        if parametrization is not None:
            parametrize.register_parametrization(module, name, parametrization)
        self._cache = None

    def freeze_link_param(self, link: str, name: str) -> None:
        """Stop training a parameter made learnable by :meth:`make_link_param_learnable`.

        For a link whose inertial parameters are learnable jointly (``inertial_source``), freezing
        ``mass``, ``com`` or ``inertia`` freezes all ten of them.
        """
        module, name = self._param_owner(link, name)
        source = getattr(module, "inertial_source", None) if name in _LINK_PARAMS else None
        if source is not None:
            source.requires_grad_(False)
        elif parametrize.is_parametrized(module, name):
            for p in module.parametrizations[name].parameters():
                p.requires_grad_(False)
        elif name in module._parameters:
            module._parameters[name].requires_grad_(False)

    # differentiable-robot-model spelling
    freeze_learnable_link_param = freeze_link_param

    def learnable_parameters(self) -> dict[str, Tensor]:
        """Trainable tensors by qualified name (``links.3.mass``, ...)."""
        return {n: p for n, p in self.named_parameters() if p.requires_grad}

    def set_gravity(self, gravity) -> None:
        """Set the gravity vector (3,), m/s^2, world frame."""
        g = torch.as_tensor(gravity, dtype=self.gravity.dtype, device=self.gravity.device)
        if g.shape != (3,):
            raise ModelError(f"gravity must have shape (3,), got {tuple(g.shape)}")
        self.gravity.copy_(g)

    # ------------------------------------------------------------------ summaries
    @property
    def dtype(self) -> torch.dtype:
        return self.gravity.dtype

    @property
    def device(self) -> torch.device:
        return self.gravity.device

    @property
    def n_links(self) -> int:
        return len(self.link_names)

    def total_mass(self) -> Tensor:
        """Sum of all link masses, kg (including links fixed to the world)."""
        return self.model_tensors().link_mass.sum()

    def joint_limits(self) -> dict[str, Tensor]:
        """``lower``, ``upper``, ``velocity``, ``effort`` limits, each ``(nj,)`` in joint order."""
        return {
            "lower": self.position_lower, "upper": self.position_upper,
            "velocity": self.velocity_limit, "effort": self.effort_limit,
        }

    def neutral_configuration(self) -> Tensor:
        """``q`` with zero joint angles and identity base orientation, ``(nq,)``."""
        q = torch.zeros(self.nq, dtype=self.dtype, device=self.device)
        if self.floating_base:
            q[6] = 1.0
        return q

    def random_configuration(self, *batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random ``q (*batch, nq)``: joints uniform within limits (``[-pi, pi]`` where unbounded),
        base position in ``[-1, 1]^3`` and a uniform random unit quaternion."""
        kw = dict(dtype=self.dtype, device=self.device)
        lo = torch.where(torch.isfinite(self.position_lower), self.position_lower, -math.pi).to(**kw)
        hi = torch.where(torch.isfinite(self.position_upper), self.position_upper, math.pi).to(**kw)
        u = torch.rand(*batch, self.nj, generator=generator, **kw)
        qj = lo + (hi - lo) * u
        if not self.floating_base:
            return qj
        pos = 2 * torch.rand(*batch, 3, generator=generator, **kw) - 1
        quat = torch.randn(*batch, 4, generator=generator, **kw)
        quat = quat / quat.norm(dim=-1, keepdim=True)
        return torch.cat([pos, quat, qj], dim=-1)

    def summary(self) -> dict:
        """Plain-data summary: name, counts, total mass, joint types."""
        types: dict[str, int] = {}
        for j in self._joint_specs:
            types[j.type] = types.get(j.type, 0) + 1
        return {
            "name": self.name, "links": self.n_links, "bodies": self.nb, "nq": self.nq, "nv": self.nv,
            "floating_base": self.floating_base, "total_mass": float(self.total_mass()), "joint_types": types,
        }

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, links={self.n_links}, nq={self.nq}, nv={self.nv}, "
                f"floating_base={self.floating_base}")

    # ------------------------------------------------------------------ algorithms as methods
    def forward(self, q: Tensor, v: Tensor, tau: Tensor, **kwargs) -> Tensor:
        """``robot(q, v, tau)`` is :meth:`forward_dynamics`, so ``torch.func.functional_call`` and
        ensembles work on the model directly."""
        return self.forward_dynamics(q, v, tau, **kwargs)

    # Imported lazily: the algorithms read the model, the model does not import them at load time.
    def forward_kinematics(self, q: Tensor) -> Tensor:
        """World poses of all links ``(..., n_links, 4, 4)`` in :attr:`link_names` order."""
        from ..dynamics.kinematics import forward_kinematics

        return forward_kinematics(self, q)

    def link_pose(self, q: Tensor, link: str) -> Tensor:
        """World pose ``T_world_link (..., 4, 4)`` of one link."""
        from ..dynamics.kinematics import link_pose

        return link_pose(self, q, link)

    def jacobian(self, q: Tensor, link: str, *, frame: str = "world_aligned", point: Tensor | None = None) -> Tensor:
        """Geometric Jacobian ``(..., 6, nv)``; see :func:`diffmech.dynamics.kinematics.jacobian`."""
        from ..dynamics.kinematics import jacobian

        return jacobian(self, q, link, frame=frame, point=point)

    def center_of_mass(self, q: Tensor) -> Tensor:
        """Centre of mass of the whole robot in the world ``(..., 3)``."""
        from ..dynamics.kinematics import center_of_mass

        return center_of_mass(self, q)

    def inverse_dynamics(self, q, v, a, *, f_ext=None, passive: bool = True) -> Tensor:
        """Joint forces ``(..., nv)`` by RNEA; see :func:`diffmech.dynamics.rnea.rnea`."""
        from ..dynamics.rnea import rnea

        return rnea(self, q, v, a, f_ext=f_ext, passive=passive)

    def mass_matrix(self, q) -> Tensor:
        """Joint-space inertia ``(..., nv, nv)`` by CRBA."""
        from ..dynamics.crba import crba

        return crba(self, q)

    def forward_dynamics(self, q, v, tau, *, f_ext=None, passive: bool = True, method: str = "auto",
                         fast_grad: bool = True) -> Tensor:
        """Joint accelerations ``(..., nv)``; see :func:`diffmech.dynamics.aba.forward_dynamics`."""
        from ..dynamics.aba import forward_dynamics

        return forward_dynamics(self, q, v, tau, f_ext=f_ext, passive=passive, method=method,
                                    fast_grad=fast_grad)

    def bias_forces(self, q, v, *, passive: bool = True) -> Tensor:
        """Coriolis, centrifugal, gravity (and passive) forces ``h(q, v) (..., nv)``."""
        from ..dynamics.rnea import bias_forces

        return bias_forces(self, q, v, passive=passive)

    def generalized_gravity(self, q) -> Tensor:
        """Gravity torques ``g(q) (..., nv)`` (joint springs excluded)."""
        from ..dynamics.rnea import generalized_gravity

        return generalized_gravity(self, q)

    def kinetic_energy(self, q, v) -> Tensor:
        """Kinetic energy ``(...)``, J."""
        from ..dynamics.energy import kinetic_energy

        return kinetic_energy(self, q, v)

    def potential_energy(self, q, *, passive: bool = True) -> Tensor:
        """Gravity (plus joint-spring when ``passive``) potential energy ``(...)``, J."""
        from ..dynamics.energy import potential_energy

        return potential_energy(self, q, passive=passive)

    def integrate(self, q, v, dt=1.0) -> Tensor:
        """Configuration reached after moving with constant velocity ``v`` for ``dt`` (on the manifold)."""
        from ..dynamics.kinematics import integrate

        return integrate(self, q, v, dt)


def _cycle_from(start: str, parent_joint: dict[str, JointSpec]) -> str:
    """Walk parents from ``start`` until a link repeats; describe the loop as ``[links] via joints [...]``."""
    seen: list[str] = []
    link = start
    while link not in seen and link in parent_joint:
        seen.append(link)
        link = parent_joint[link].parent
    loop = seen[seen.index(link):] if link in seen else seen
    return f"{loop} via joints {[parent_joint[n].name for n in loop]}"


def _check_inertia(src: str, link: LinkSpec) -> None:
    I = torch.tensor(link.inertia, dtype=torch.float64)
    if I.shape != (3, 3) or not torch.isfinite(I).all():
        raise ModelError(f"{src}: link '{link.name}' has an invalid inertia tensor {link.inertia}")
    if not torch.allclose(I, I.T, atol=1e-12 * max(1.0, float(I.abs().max()))):
        raise ModelError(f"{src}: link '{link.name}' has a non-symmetric inertia tensor {I.tolist()}")
    eig = torch.linalg.eigvalsh(I)
    if eig.min() < -1e-9 * max(1.0, float(eig.abs().max())):
        raise ModelError(
            f"{src}: link '{link.name}' has an inertia tensor that is not positive semi-definite "
            f"(eigenvalues {[round(float(e), 9) for e in eig]})"
        )
