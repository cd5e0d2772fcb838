"""The parameter values of a robot: learnable tensors, one flat store, and the derived tensor bundle.

:class:`RobotParameters` is the ``nn.Module`` that owns a robot's physical parameters -- each link's
mass, centre of mass and inertia, each joint's placement, damping, friction and spring, and gravity --
as tensors held by small per-link and per-joint modules (``robot.links[i].mass``, ...), so that any
of them can be made learnable (a parametrization from :mod:`torch.nn.utils.parametrize` or a whole
inertial source); optimisers, ``state_dict``, ``.to()`` and ``torch.func.functional_call`` work as
for any module. From them it produces :class:`ModelTensors`, the bundle of per-call constants the
algorithms read (joint placements, body inertias, ...), in any dtype and device.

Why changes are always seen. Producing the bundle costs some fifty small tensor operations, so it is
cached -- and a cache is a source of silently wrong answers when a parameter changes by a route it
does not watch (``.data``, rebinding, ``load_state_dict``, an optimiser step, ``.to()``, ...).
The cache here is safe by construction rather than by a list of routes:

* every frozen raw value is a view of one flat tensor (the *store*): whatever writes a value in
  place -- an in-place op on the tensor, on ``.data``, on a ``state_dict`` alias, ``copy_`` by
  ``load_state_dict``, an optimiser -- writes the store, and one comparison of the store with the
  snapshot taken when the bundle was made sees it;
* the only other way to change a value is to change *which* tensor holds it: a module attribute
  set or deleted, a parametrization registered, ``.to()``, ``functional_call``'s swaps -- all of
  which write the modules' parameter/buffer/submodule dictionaries, which are observed -- or a
  tensor re-pointed at other memory (``.data = t``, ``set_``) or asked to require a gradient, which
  the store's own tensor class observes. Each bumps a generation counter, and the next call
  re-reads the layout.
* A value that is not a store view (a learnable parameter, a parametrization, an inertial source,
  a tensor a user assigned) is read afresh at every call: no cache where none can be made safe.

The per-call check is one integer comparison and one ``torch.equal`` of a few hundred numbers.
"""

from __future__ import annotations

import copy
import math
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from .. import spatial
from ..errors import ModelError
from .persistence import PhysicalValues, reconcile_inertial_source
from .spec import JointSpec, LinkSpec, RobotSpec
from .tree import KinematicTree
from .validate import check_number, check_spec_mass_matrix, validate_parameters

__all__ = ["RobotParameters", "RobotSummary", "LinkParams", "JointParams", "ModelTensors", "RawParameters",
           "derive_tensors"]

LINK_PARAMS = ("mass", "com", "inertia")
JOINT_PARAMS = ("origin_xyz", "origin_rpy", "damping", "friction", "stiffness", "rest")
# Names used by differentiable-robot-model, accepted as aliases.
ALIASES = {
    "inertia_mat": "inertia",
    "trans": "origin_xyz",
    "rot_angles": "origin_rpy",
    "joint_damping": "damping",
    "spring_stiffness": "stiffness",
    "spring_rest": "rest",
}
# Layout of the store: one block per kind of value, entries in link / joint order.
_LINK_SHAPES = {"mass": (), "com": (3,), "inertia": (3, 3)}
_JOINT_SHAPES = {"origin_xyz": (3,), "origin_rpy": (3,), "damping": (), "friction": (), "stiffness": (), "rest": ()}


class ModelTensors(NamedTuple):
    """Per-call constants derived from the parameters, in one dtype/device: the values the
    algorithms read besides the :class:`~diffmech.model.tree.KinematicTree`.

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


class RawParameters(NamedTuple):
    """The raw parameter values of a robot, one tensor per kind (links and joints in tree order)."""

    mass: Tensor  # (nl,) kg
    com: Tensor  # (nl, 3) m, link frame
    inertia: Tensor  # (nl, 3, 3) kg m^2 about the centre of mass, link axes
    origin_xyz: Tensor  # (nJ, 3) m, joint frame in the parent link frame (nJ = nl - 1 joints)
    origin_rpy: Tensor  # (nJ, 3) rad
    damping: Tensor  # (nJ,)
    friction: Tensor  # (nJ,)
    stiffness: Tensor  # (nJ,)
    rest: Tensor  # (nJ,)
    gravity: Tensor  # (3,) m/s^2, world frame


def derive_tensors(tree: KinematicTree, raw: RawParameters) -> ModelTensors:
    """The :class:`ModelTensors` of raw parameter values, differentiably (a few dozen batched ops).

    Link offsets are composed from each body's frame down through fixed joints, one fixed depth
    at a time; inertias about each link's centre of mass are moved to its body's origin and summed
    per body (mass, first moment and inertia add up without dividing by a possibly zero body mass).
    """
    dtype, device = raw.mass.dtype, raw.mass.device
    tb = tree.tables(dtype, device)
    nl = tree.n_links
    eye = torch.eye(3, dtype=dtype, device=device)
    Rj = spatial.rpy_to_matrix(raw.origin_rpy)  # (nJ, 3, 3)
    xyz = raw.origin_xyz
    link_R = eye.expand(nl, 3, 3)
    link_p = raw.mass.new_zeros(nl, 3)
    for links, parents, joints in tb.fixed_levels:
        Rp = link_R[parents]
        link_R = link_R.index_copy(0, links, Rp @ Rj[joints])
        link_p = link_p.index_copy(0, links, link_p[parents] + (Rp @ xyz[joints][..., None])[..., 0])
    pl = tb.body_joint_parent_link
    Rp = link_R[pl]
    R_tree = Rp @ Rj[tb.body_joint]  # (nj, 3, 3)
    p_tree = link_p[pl] + (Rp @ xyz[tb.body_joint][..., None])[..., 0]
    if tb.ball_inner is not None:  # a ball's second and third bodies sit on its first (tree module docstring)
        inner = tb.ball_inner[:, None]
        R_tree = torch.lerp(R_tree, eye.expand_as(R_tree), inner[..., None])
        p_tree = p_tree * (1 - inner)

    mass, com = raw.mass, raw.com
    # A raw learnable 3x3 drifts off symmetry under unconstrained updates; ABA assumes symmetry,
    # so only the symmetric part is physical.
    inertia = 0.5 * (raw.inertia + raw.inertia.transpose(-1, -2))
    c_b = link_p + (link_R @ com[..., None])[..., 0]
    I_c = link_R @ inertia @ link_R.transpose(-1, -2)
    I_o = I_c + mass[:, None, None] * ((c_b * c_b).sum(-1)[:, None, None] * eye - c_b[:, :, None] * c_b[:, None, :])
    keep, body = tb.moving_links, tb.moving_link_body
    body_mass = mass.new_zeros(tree.nb).index_add(0, body, mass[keep])
    body_h = mass.new_zeros(tree.nb, 3).index_add(0, body, (mass[:, None] * c_b)[keep])
    body_I = mass.new_zeros(tree.nb, 3, 3).index_add(0, body, I_o[keep])

    pris = tb.prismatic[:, None]
    rot_axis = tb.axes * (1 - pris)
    lin_axis = tb.axes * pris
    K = spatial.skew(rot_axis)
    A1 = R_tree @ K
    A2 = A1 @ K
    lin_dir = (R_tree @ lin_axis[..., None])[..., 0]
    bj = tb.body_joint
    return ModelTensors(
        A0=R_tree[..., None], A1=A1[..., None], A2=A2[..., None], p_tree=p_tree[..., None],
        lin_dir=lin_dir[..., None], rot_axis=rot_axis[..., None], lin_axis=lin_axis[..., None],
        body_mass=body_mass, body_h=body_h, body_I=body_I,
        link_R=link_R, link_p=link_p, link_mass=mass, link_com=com,
        damping=raw.damping[bj], stiffness=raw.stiffness[bj] if tb.ball_body is None else
        raw.stiffness[bj] * (1 - tb.ball_body), rest=raw.rest[bj] if tb.ball_body is None else
        raw.rest[bj] * (1 - tb.ball_body), gravity=raw.gravity,
    )


# ---------------------------------------------------------------------------- change observation
class _Generation:
    """A counter shared by a robot, its parameter modules' dictionaries and its store tensors."""

    __slots__ = ("n",)

    def __init__(self):
        self.n = 0

    def __getstate__(self):
        return self.n

    def __setstate__(self, n):
        self.n = n


def _bump(owner) -> None:
    gen = getattr(owner, "_dm_gen", None)
    if gen is not None:
        gen.n += 1


class _ObservedDict(dict):
    """A module's ``_parameters`` / ``_buffers`` / ``_modules`` dictionary whose every write bumps
    its robot's generation (torch's own code -- ``_apply``, parametrize, ``functional_call`` --
    writes these dictionaries directly, not through ``__setattr__``)."""

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        _bump(self)

    def __delitem__(self, key):
        super().__delitem__(key)
        _bump(self)

    def pop(self, *args):
        _bump(self)
        return super().pop(*args)

    def popitem(self):
        _bump(self)
        return super().popitem()

    def clear(self):
        _bump(self)
        super().clear()

    def update(self, *args, **kwargs):
        _bump(self)
        super().update(*args, **kwargs)

    def setdefault(self, key, default=None):
        _bump(self)
        return super().setdefault(key, default)

    def __ior__(self, other):
        _bump(self)
        return super().__ior__(other)

    def __reduce_ex__(self, protocol):
        # Rebuilt as a plain dict: the robot re-installs observation after copying or unpickling.
        return (dict, (dict(self),))


_CPU = torch.device("cpu")
_DATA = torch._C.TensorBase.data
_REQUIRES_GRAD = torch._C.TensorBase.requires_grad


class StoredTensor(torch.Tensor):
    """A frozen raw parameter value that is a view of its robot's store (see the module docstring).

    Behaves as a plain tensor (operations return plain tensors); re-pointing it at other memory
    (``.data = t``, ``set_``) or making it require a gradient tells its robot, which then re-reads
    its layout (the new value is copied into the store, or, for a gradient, read afresh each call).
    """

    __torch_function__ = torch._C._disabled_torch_function_impl

    @property
    def data(self):
        return _DATA.__get__(self)

    @data.setter
    def data(self, value):
        _DATA.__set__(self, value)
        _bump(self)

    @property
    def requires_grad(self):
        return _REQUIRES_GRAD.__get__(self)

    @requires_grad.setter
    def requires_grad(self, flag):
        _REQUIRES_GRAD.__set__(self, flag)
        _bump(self)

    def requires_grad_(self, requires_grad: bool = True):
        out = super().requires_grad_(requires_grad)
        _bump(self)
        return out

    def set_(self, *args, **kwargs):
        out = super().set_(*args, **kwargs)
        _bump(self)
        return out

    def __reduce_ex__(self, proto):
        # Saved as the plain tensor it stands for (``torch.save(robot)`` / pickling): the loaded
        # robot re-creates its store.
        return torch.Tensor.__reduce_ex__(self.as_subclass(torch.Tensor), proto)

    def __deepcopy__(self, memo):
        # A copy of the value; the copied robot re-creates its store and re-points it there.
        if id(self) in memo:
            return memo[id(self)]
        out = _stored(self.detach().clone(), None)
        memo[id(self)] = out
        return out


def _stored(view: Tensor, gen: _Generation) -> StoredTensor:
    t = torch.Tensor._make_subclass(StoredTensor, view, False)
    t._dm_gen = gen
    return t


def _observe(module: nn.Module, gen: _Generation) -> None:
    for name in ("_parameters", "_buffers", "_modules"):
        d = module.__dict__[name]
        if not isinstance(d, _ObservedDict):
            d = _ObservedDict(d)
            module.__dict__[name] = d
        d._dm_gen = gen


# ---------------------------------------------------------------------------- parameter modules
class LinkParams(PhysicalValues, nn.Module):
    """Inertial parameters of one link (link frame, SI units).

    Tensors: ``mass ()``, ``com (3,)``, ``inertia (3, 3)`` about the centre of mass.
    ``inertial_source`` may hold a module returning ``(mass, com, inertia)`` jointly (used by
    parametrizations that must see all ten inertial parameters at once, e.g. physical consistency).
    A state dict holds the values the model reads under ``mass``/``com``/``inertia`` (the source's
    while one is installed), see :mod:`~diffmech.model.persistence`.
    """

    _physical_names = LINK_PARAMS

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

    def _derived_value(self, name: str) -> Tensor | None:
        if self.inertial_source is not None:
            return self.inertial_source()[LINK_PARAMS.index(name)]
        return super()._derived_value(name)

    def _keeps_raw(self, name: str) -> bool:
        return self.inertial_source is not None  # the raw tensor is not read while a source is installed

    def _reconcile_sources(self, sd: dict, prefix: str) -> None:
        reconcile_inertial_source(self, sd, prefix)


class JointParams(PhysicalValues, nn.Module):
    """Placement and passive parameters of one joint.

    Tensors: ``origin_xyz (3,)`` m and ``origin_rpy (3,)`` rad (joint frame in the parent link
    frame), ``damping ()``, ``friction ()``, ``stiffness ()``, ``rest ()``.
    """

    _physical_names = JOINT_PARAMS

    def __init__(self, spec: JointSpec, dtype: torch.dtype, device=None):
        super().__init__()
        kw = dict(dtype=dtype, device=device)
        self.register_buffer("origin_xyz", torch.tensor(spec.xyz, **kw).reshape(3))
        self.register_buffer("origin_rpy", torch.tensor(spec.rpy, **kw).reshape(3))
        for name in ("damping", "friction", "stiffness", "rest"):
            self.register_buffer(name, torch.tensor(float(getattr(spec, name)), **kw))


class RobotSummary(dict):
    """The ``dict`` of :meth:`RobotParameters.summary` that prints as a two-column table.

    Everything a ``dict`` does is unchanged (indexing, ``==``, ``json.dumps``, pickling); only
    ``str()`` and ``repr()`` give the table, so that ``print(robot.summary())`` and a REPL show it.
    """

    _UNITS = {"total_mass": "kg"}

    def table(self) -> str:
        """The table: one row per key, values formatted for reading (mass in kg to 0.1 g)."""
        rows = []
        for key, value in self.items():
            if isinstance(value, dict):
                text = ", ".join(f"{k} {v}" for k, v in value.items()) or "-"
            elif isinstance(value, float):
                text = f"{value:.4f}"
            else:
                text = str(value)
            unit = self._UNITS.get(key)
            rows.append((key, f"{text} {unit}" if unit else text))
        width = max((len(k) for k, _ in rows), default=0)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    __str__ = table

    def __repr__(self) -> str:
        return self.table()


class _Slot(NamedTuple):
    kind: str  # RawParameters field
    index: int  # entry within the kind (-1 for gravity)
    module: nn.Module
    name: str  # attribute name on the module
    start: int  # offset in the store
    shape: tuple


class RobotParameters(PhysicalValues, nn.Module):
    """A robot's kinematic tree and parameter values (the layer below the algorithms).

    :class:`diffmech.RobotModel` adds the algorithms as methods; build robots with
    :func:`diffmech.load_urdf` or :mod:`diffmech.model.systems`.

    Attributes:
        tree: the :class:`~diffmech.model.tree.KinematicTree` (immutable).
        name, link_names, joint_names, all_joint_names, joint_types, nq, nv: copies of the tree's, as
            are nb, nj, floating_base, link_body, link_parent, body_parent and body_depth.
        links, joints: per-link :class:`LinkParams` and per-joint :class:`JointParams` (in the
            order of ``link_names`` and ``all_joint_names``).
        actuated_joints: the joints with actuators (default: all of ``joint_names``).
        meta: what the description carried besides the dynamics (plain data; for a URDF,
            ``meta["urdf"]`` holds its ``<visual>``/``<collision>`` elements and materials, which
            :meth:`diffmech.RobotModel.to_urdf` writes back).

    Names: ``named_parameters()`` and ``state_dict`` use module paths, links and joints by index
    (``links.7.mass`` is the mass of ``link_names[7]``, ``joints.2.damping`` the damping of
    ``all_joint_names[2]``); :meth:`learnable_parameters` and :meth:`parameter_names` give the names
    after the link or joint (``iiwa_link_7.mass``).

    Saving: ``state_dict`` holds each parameter's physical value (and the raw tensors of learnable
    ones); ``load_state_dict`` restores the values into any model of the same tree, the raw tensors
    exactly where the receiver made them learnable the same way; ``torch.save(robot)``,
    ``copy.deepcopy`` and pickling work with parametrizations (:mod:`~diffmech.model.persistence`).
    """

    _physical_names = ("gravity",)

    def __init__(
        self,
        spec: RobotSpec,
        *,
        floating_base: bool = False,
        dtype: torch.dtype = torch.float64,
        device: torch.device | str | None = None,
    ):
        super().__init__()
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise ModelError(f"RobotModel dtype must be a floating-point torch.dtype, got {dtype}")
        tree = KinematicTree(spec, floating_base=floating_base)
        check_spec_mass_matrix(spec, tree)  # a model that loads is a model that simulates
        self.tree = tree
        self.name = tree.name
        self.source = tree.source
        self.floating_base = tree.floating_base
        coords = tree.coords  # mimic joints: the generalised coordinates leave them out
        self.link_names: list[str] = list(tree.link_names)
        self.joint_names: list[str] = list(coords.joint_names if coords else tree.joint_names)
        self.all_joint_names: list[str] = list(tree.all_joint_names)
        self.joint_types: list[str] = [tree.joint_types[tree.joint_names.index(n)] for n in self.joint_names]
        self.nq, self.nv = (coords.nq, coords.nv) if coords else (tree.nq, tree.nv)
        self.nb, self.nj = tree.nb, len(self.joint_names)
        limits = coords if coords else tree
        self.link_body: list[int] = list(tree.link_body)
        self.link_parent: list[int] = list(tree.link_parent)
        self.body_parent: list[int] = list(tree.body_parent)
        self.body_depth: list[int] = list(tree.body_depth)
        by_link = {link.name: link for link in spec.links}
        by_joint = {j.name: j for j in spec.joints}
        self.links = nn.ModuleList([LinkParams(by_link[n], dtype, device) for n in tree.link_names])
        self.joints = nn.ModuleList([JointParams(by_joint[n], dtype, device) for n in tree.all_joint_names])
        gravity = torch.as_tensor(spec.gravity, dtype=dtype, device=device)
        if gravity.shape != (3,):
            raise ModelError(f"{spec.source}: gravity must have shape (3,), got {tuple(gravity.shape)}")
        self.register_buffer("gravity", gravity.clone())
        kw = dict(dtype=torch.float64, device=device)
        self.register_buffer("position_lower", torch.tensor(limits.lower, **kw), persistent=False)
        self.register_buffer("position_upper", torch.tensor(limits.upper, **kw), persistent=False)
        self.register_buffer("velocity_limit", torch.tensor(limits.velocity, **kw), persistent=False)
        self.register_buffer("effort_limit", torch.tensor(limits.effort, **kw), persistent=False)
        #: Joints driven by actuators (all moving joints unless a builder says otherwise, e.g. the
        #: cartpole's slider); controllers and environments read it, the dynamics do not.
        self.actuated_joints: list[str] = list(self.joint_names)
        self.meta: dict = copy.deepcopy(spec.meta)
        self._init_store(dtype, gravity.device)
        self.register_load_state_dict_post_hook(_validate_after_load)

    # ------------------------------------------------------------------ saving
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        meta = getattr(destination, "_metadata", None)
        if meta is not None and prefix[:-1] in meta:  # lets a load into another robot say so
            meta[prefix[:-1]]["link_names"] = list(self.link_names)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        names = local_metadata.get("link_names")
        if names is not None and list(names) != self.link_names:
            # Reported with the unexpected keys, which torch raises on with strict=True only (it
            # passes strict=True to every module whatever the caller's choice).
            diff = next((i for i, (a, b) in enumerate(zip(names, self.link_names)) if a != b),
                        min(len(names), len(self.link_names)))
            theirs = f"'{names[diff]}'" if diff < len(names) else "none"
            ours = f"'{self.link_names[diff]}'" if diff < len(self.link_names) else "none"
            unexpected_keys.append(f"{prefix}link_names: the state dict is of another robot (link {diff} is "
                                   f"{theirs}, in {self.name} {ours}); strict=False loads it by position")
        if not getattr(self, "_dm_restoring", False):
            # Children load after this call: keep their values so that a refused load leaves the model as it was.
            self.__dict__["_dm_before_load"] = {k: v.detach().clone() for k, v in self.state_dict().items()}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ------------------------------------------------------------------ the store
    def _init_store(self, dtype: torch.dtype, device: torch.device) -> None:
        self._dm_gen = _Generation()
        self._store_dtype, self._store_device = dtype, torch.device(device)
        self._layout_gen = -1
        self._version = 0
        self._relayout(adopt=True)

    def _slots(self) -> list[_Slot]:
        slots, off = [], 0
        nl, nJ = len(self.links), len(self.joints)
        for kind, shape in _LINK_SHAPES.items():
            size = math.prod(shape)
            for i in range(nl):
                slots.append(_Slot(kind, i, self.links[i], kind, off + i * size, shape))
            off += nl * size
        for kind, shape in _JOINT_SHAPES.items():
            size = math.prod(shape)
            for k in range(nJ):
                slots.append(_Slot(kind, k, self.joints[k], kind, off + k * size, shape))
            off += nJ * size
        slots.append(_Slot("gravity", -1, self, "gravity", off, (3,)))
        return slots

    def _relayout(self, adopt: bool) -> None:
        """Re-read which tensor holds each raw value; rebuild the store views.

        ``adopt``: plain tensors found in buffers become store views (after construction, ``.to()``
        or unpickling, when nobody else holds them); otherwise such a tensor -- one a user assigned --
        is read afresh at every call.
        """
        with torch.inference_mode(False):
            self._relayout_impl(adopt)

    def _relayout_impl(self, adopt: bool) -> None:
        gen = self._dm_gen
        for m in (self, self.links, self.joints, *self.links, *self.joints):
            _observe(m, gen)
        slots = self._slots()
        dtype, device = self._store_dtype, self._store_device
        total = slots[-1].start + 3
        flat = torch.zeros(total, dtype=dtype, device=device)
        live: list[_Slot] = []
        stored: list[tuple[_Slot, Tensor]] = []
        for s in slots:
            m = s.module
            source = s.kind in LINK_PARAMS and getattr(m, "inertial_source", None) is not None
            t = m.__dict__["_buffers"].get(s.name)
            plain = (t is not None and not source and not parametrize.is_parametrized(m, s.name)
                     and not t.requires_grad and t.shape == s.shape)
            if plain and (isinstance(t, StoredTensor) or adopt):
                with torch.no_grad():
                    flat[s.start:s.start + math.prod(s.shape)].copy_(t.detach().reshape(-1))
                stored.append((s, t))
            else:
                live.append(s)
        for s, t in stored:
            view = flat[s.start:s.start + math.prod(s.shape)].view(s.shape)
            if isinstance(t, StoredTensor):
                _DATA.__set__(t, view)  # the same object, now viewing the new store
                t._dm_gen = gen
            else:
                s.module.__dict__["_buffers"][s.name] = _stored(view, gen)
        self._flat = flat
        self._slot_list = slots
        self._live = live
        self._snapshot = flat.clone()
        self._entries: dict = {}
        self._flat_entries: dict = {}
        self._version += 1
        self._layout_gen = gen.n

    def _apply(self, fn, recurse=True):
        out = super()._apply(fn, recurse)
        g = self.gravity
        self._store_dtype, self._store_device = g.dtype, g.device
        self._relayout(adopt=True)
        return out

    def __setstate__(self, state):
        super().__setstate__(state)
        g = self.gravity
        self._store_dtype, self._store_device = g.dtype, g.device
        self._dm_gen = _Generation()
        self._relayout(adopt=True)
        if not any(h is _validate_after_load for h in self._load_state_dict_post_hooks.values()):
            self.register_load_state_dict_post_hook(_validate_after_load)  # pickled before the check existed

    def __getstate__(self):
        state = dict(self.__dict__)
        for key in ("_flat", "_snapshot", "_entries", "_flat_entries", "_live", "_slot_list", "_dm_before_load"):
            state.pop(key, None)
        return state

    @property
    def param_version(self) -> int:
        """A counter that grows whenever a parameter value or the parameter layout changes (as seen
        by the next :meth:`model_tensors` call)."""
        self.model_tensors()
        return self._version

    def raw_parameters(self) -> RawParameters:
        """The raw values, one tensor per kind, in the model's dtype and device; learnable values
        keep their graph."""
        flat = self._flat
        parts = {}
        off = 0
        nl, nJ = len(self.links), len(self.joints)
        for kind, shape in _LINK_SHAPES.items():
            n = nl * math.prod(shape)
            parts[kind] = flat[off:off + n].view(nl, *shape)
            off += n
        for kind, shape in _JOINT_SHAPES.items():
            n = nJ * math.prod(shape)
            parts[kind] = flat[off:off + n].view(nJ, *shape)
            off += n
        parts["gravity"] = flat[off:off + 3]
        if self._live:
            groups: dict[str, tuple[list[int], list[Tensor]]] = {}
            sources: dict[int, tuple] = {}
            for s in self._live:
                m = s.module
                if s.kind in LINK_PARAMS and getattr(m, "inertial_source", None) is not None:
                    if s.index not in sources:
                        sources[s.index] = m.inertial_source()
                    value = sources[s.index][LINK_PARAMS.index(s.kind)]
                else:
                    value = getattr(m, s.name)
                if not isinstance(value, Tensor) or tuple(value.shape) != s.shape:
                    where = f"link '{self.link_names[s.index]}'" if s.kind in LINK_PARAMS else (
                        "gravity" if s.kind == "gravity" else f"joint '{self.all_joint_names[s.index]}'")
                    raise ModelError(f"{self.name}: {where}: parameter '{s.name}' must be a tensor of shape "
                                     f"{s.shape}, got {getattr(value, 'shape', type(value).__name__)}")
                value = value.to(dtype=flat.dtype, device=flat.device)
                if s.kind == "gravity":
                    parts["gravity"] = value
                    continue
                idx, vals = groups.setdefault(s.kind, ([], []))
                idx.append(s.index)
                vals.append(value)
            for kind, (idx, vals) in groups.items():
                index = torch.tensor(idx, dtype=torch.long, device=flat.device)
                parts[kind] = parts[kind].index_put((index,), torch.stack(vals))
        return RawParameters(**parts)

    def _read_direct(self) -> RawParameters:
        """The raw values read from the modules one by one (no store), for functorch transforms."""
        per_kind: dict[str, list[Tensor]] = {k: [] for k in RawParameters._fields}
        sources: dict[int, tuple] = {}
        dtype, device = self._store_dtype, self._store_device
        for s in self._slots():
            m = s.module
            if s.kind in LINK_PARAMS and getattr(m, "inertial_source", None) is not None:
                if s.index not in sources:
                    sources[s.index] = m.inertial_source()
                value = sources[s.index][LINK_PARAMS.index(s.kind)]
            else:
                value = getattr(m, s.name)
            if isinstance(value, StoredTensor):
                value = value.as_subclass(torch.Tensor)
            per_kind[s.kind].append(value.to(dtype=dtype, device=device))
        return RawParameters(**{k: (v[0] if k == "gravity" else torch.stack(v)) for k, v in per_kind.items()})

    def model_tensors(self, dtype: torch.dtype | None = None, device=None) -> ModelTensors:
        """The constants of the algorithms derived from the current parameters, in ``dtype`` on
        ``device`` (default: the model's), differentiably w.r.t. learnable parameters.

        Cached while every raw value is a frozen store view; any change is seen (module docstring).
        """
        dtype = dtype or self._store_dtype
        if device is None:
            device = self._store_device
        elif not isinstance(device, torch.device):
            device = torch.device(device)
        if torch._C._are_functorch_transforms_active():
            # Inside vmap / grad / jvp (functional_call of an ensemble, a regressor by jacfwd) the
            # tensors may be wrapped per transform level: read every value where it is, touch nothing.
            return self._derive(dtype, device, direct=True)
        if self._dm_gen.n != self._layout_gen:
            self._relayout(adopt=False)
        if self._live:
            self._version += 1
            return self._derive(dtype, device)
        if not torch.equal(self._flat, self._snapshot):
            self._snapshot = self._flat.clone()
            self._entries, self._flat_entries = {}, {}
            self._version += 1
        key = (dtype, device)
        mt = self._entries.get(key)
        if mt is None:
            # Cached values carry no graph and must outlive an inference_mode block.
            with torch.inference_mode(False), torch.no_grad():
                mt = self._derive(dtype, device)
            self._entries[key] = mt
        return mt

    def model_tensors_flat(self, dtype: torch.dtype) -> tuple[ModelTensors, Tensor]:
        """:meth:`model_tensors` on the CPU in ``dtype``, and their values flattened and concatenated
        in field order (the constants argument of native kernels); cached with them."""
        mt = self.model_tensors(dtype, _CPU)
        hit = self._flat_entries.get(dtype)
        if hit is not None and hit[0] is mt:  # the entry holds mt, so its identity is not recycled
            return hit
        flat = torch.cat([t.detach().reshape(-1) for t in mt])
        if not self._live:
            self._flat_entries[dtype] = (mt, flat)
        return mt, flat

    def _derive(self, dtype: torch.dtype, device: torch.device, direct: bool = False) -> ModelTensors:
        raw = self._read_direct() if direct else self.raw_parameters()
        if not direct:
            self._check_finite(raw)
        mt = derive_tensors(self.tree, raw)
        if mt.gravity.dtype != dtype or mt.gravity.device != device:
            mt = ModelTensors(*[t.to(dtype=dtype, device=device) for t in mt])
        return mt

    def _check_finite(self, raw: RawParameters) -> None:
        if all(bool(torch.isfinite(t).all()) for t in raw):
            return
        for kind, t in zip(RawParameters._fields, raw):
            bad = (~torch.isfinite(t.detach())).reshape(t.shape[0], -1).any(-1) if t.dim() else None
            if kind == "gravity":
                if not bool(torch.isfinite(t).all()):
                    raise ModelError(f"{self.name}: gravity is not finite: {t.detach().tolist()}")
                continue
            if bad is not None and bool(bad.any()):
                i = int(bad.nonzero()[0, 0])
                where = f"link '{self.link_names[i]}'" if kind in LINK_PARAMS else f"joint '{self.all_joint_names[i]}'"
                raise ModelError(f"{self.name}: {where}: parameter '{kind}' is not finite: {t[i].detach().tolist()}")

    # ------------------------------------------------------------------ parameter API
    def link_params(self, link: str | int) -> LinkParams:
        """The parameter module of ``link``."""
        return self.links[self.tree.link(link)]

    def joint_params(self, joint: str) -> JointParams:
        """The parameter module of ``joint`` (moving or fixed)."""
        return self.joints[self.tree.joint(joint)]

    def link_index(self, link: str | int) -> int:
        """Index of ``link`` in :attr:`link_names` (names or indices accepted)."""
        return self.tree.link(link)

    def param_owner(self, link: str | int, name: str) -> tuple[nn.Module, str]:
        """The module holding parameter ``name`` of ``link`` (its joint's module for joint
        parameters: the joint whose child is ``link``) and the canonical parameter name."""
        name = ALIASES.get(name, name)
        li = self.tree.link(link)
        if name in LINK_PARAMS:
            return self.links[li], name
        if name in JOINT_PARAMS:
            if li == 0:
                raise ModelError(f"{self.name}: link '{self.link_names[0]}' is the root link and has no parent "
                                 f"joint with '{name}'")
            return self.joints[li - 1], name
        raise ModelError(f"{self.name}: unknown link parameter '{name}'; choose from {LINK_PARAMS + JOINT_PARAMS}")

    def make_link_param_learnable(self, link: str, name: str, parametrization: nn.Module | None = None) -> None:
        """Turn one physical parameter of ``link`` into a trainable ``nn.Parameter``.

        Args:
            link: link name.
            name: ``mass``, ``com``, ``inertia`` (link inertial), or ``origin_xyz``, ``origin_rpy``,
                ``damping``, ``friction``, ``stiffness``, ``rest`` (of the joint whose child is
                ``link``). differentiable-robot-model's names (``inertia_mat``, ``trans``,
                ``rot_angles``, ``joint_damping``) are accepted too.
            parametrization: optional ``nn.Module``, either a parametrization mapping an
                unconstrained tensor to the parameter (``forward(raw)``, e.g.
                :class:`diffmech.model.params.PositiveScalar`; registered with
                ``torch.nn.utils.parametrize``, its ``right_inverse`` (if any) sets the initial value
                from the current one), or a *value source* whose ``forward()`` takes no argument and
                returns the value itself (differentiable-robot-model's parametrizations,
                :mod:`diffmech.compat.drm`): its own tensors are trained and the value starts where
                the source starts (:class:`diffmech.model.params.ValueSource`).
        """
        from .params import ValueSource, is_value_source

        module, name = self.param_owner(link, name)
        if name in LINK_PARAMS and getattr(module, "inertial_source", None) is not None:
            raise ModelError(
                f"{self.name}: the inertial parameters of link '{link}' are already learnable jointly "
                f"({type(module.inertial_source).__name__}); '{name}' is not read separately"
            )
        if parametrize.is_parametrized(module, name):
            parametrize.remove_parametrizations(module, name, leave_parametrized=True)
        value = getattr(module, name).detach().clone().as_subclass(torch.Tensor)
        if parametrization is not None:
            self._check_initial_value(link, module, name, value, parametrization)
        if name in module._buffers:
            del module._buffers[name]
        elif name in module._parameters:
            del module._parameters[name]
        if parametrization is not None and is_value_source(parametrization):
            # The frozen current value stays as the parametrization's (unused) original buffer.
            module.register_buffer(name, value)
            what = f"{self.name}: link '{self.link_names[self.tree.link(link)]}': {name}"
            source = ValueSource(parametrization.to(device=value.device), value.shape, what)
            parametrize.register_parametrization(module, name, source)
            return
        module.register_parameter(name, nn.Parameter(value))
        if parametrization is not None:
            parametrize.register_parametrization(module, name, parametrization)

    def _check_initial_value(self, link: str, module: nn.Module, name: str, value: Tensor,
                             parametrization: nn.Module) -> None:
        """Refuse a parametrization whose initial value breaks the rules of :mod:`diffmech.model.validate`
        (a value source starting at a negative mass, a ``right_inverse`` that does not round-trip),
        before anything is changed."""
        from .params import is_value_source

        try:
            with torch.no_grad():
                if is_value_source(parametrization):
                    start = parametrization()
                else:
                    inverse = getattr(parametrization, "right_inverse", None)
                    raw = inverse(value) if inverse is not None else value
                    start = parametrization(*raw) if isinstance(raw, (tuple, list)) else parametrization(raw)
        except ModelError:
            raise
        except Exception:  # noqa: BLE001 - registering it raises the parametrization's own error
            return
        if not isinstance(start, Tensor) or tuple(start.shape) != tuple(value.shape):
            return  # ValueSource / register_parametrization name the shape mismatch
        li = self.tree.link(link)
        if is_value_source(parametrization):
            # A value source starts where it chooses (differentiable-robot-model's examples start an
            # UnconstrainedTensor inertia at random values): finite numbers only, physics not asked.
            where = f"{self.name} (initial value of learnable '{name}'): link '{self.link_names[li]}'"
            for i, x in enumerate(start.detach().reshape(-1).tolist()):
                check_number(where, f"{name}[{i}]" if start.dim() else name, x)
            return
        validate_parameters(self, f"initial value of learnable '{name}' of link '{self.link_names[li]}'",
                            links=[li], override=(name, li if name in LINK_PARAMS else li - 1, start))

    def freeze_link_param(self, link: str, name: str) -> None:
        """Stop training a parameter made learnable by :meth:`make_link_param_learnable`.

        For a link whose inertial parameters are learnable jointly (``inertial_source``), freezing
        ``mass``, ``com`` or ``inertia`` freezes all ten of them.
        """
        self._set_trainable(link, name, False)

    def unfreeze_link_param(self, link: str, name: str) -> None:
        """Train again a parameter made learnable and then frozen (:meth:`freeze_link_param`)."""
        self._set_trainable(link, name, True)

    def _set_trainable(self, link: str, name: str, flag: bool) -> None:
        module, name = self.param_owner(link, name)
        source = getattr(module, "inertial_source", None) if name in LINK_PARAMS else None
        if source is not None:
            source.requires_grad_(flag)
        elif parametrize.is_parametrized(module, name):
            for p in module.parametrizations[name].parameters():
                p.requires_grad_(flag)
        elif name in module._parameters:
            module._parameters[name].requires_grad_(flag)
        elif flag:
            raise ModelError(f"{self.name}: parameter '{name}' of link '{link}' is not learnable; "
                             "call make_link_param_learnable first")

    # differentiable-robot-model spellings
    freeze_learnable_link_param = freeze_link_param
    unfreeze_learnable_link_param = unfreeze_link_param

    def learnable_parameters(self, readable: bool = True) -> dict[str, Tensor]:
        """Trainable tensors by name.

        :meth:`parameter_names` maps the module paths of ``named_parameters()`` to these names.

        Args:
            readable: ``False``: qualified module names (``links.3.mass``,
                ``links.3.parametrizations.mass.original``, ``links.3.inertial_source.theta``), the
                keys of ``state_dict`` and ``torch.func.functional_call``. ``True`` (default): names
                after the link or joint -- ``iiwa_link_3.mass`` (a learnable value), ``iiwa_link_3.mass.raw``
                (the unconstrained tensor of a parametrization), ``iiwa_joint_2.origin_xyz``,
                ``iiwa_link_3.inertial.theta`` (an inertial source), ``iiwa_link_1.mass.l`` (the
                tensors of a value source or of a parametrization's own modules), ``gravity``.
        """
        named = ((n, p) for n, p in self.named_parameters() if p.requires_grad)
        if not readable:
            return dict(named)
        return {self._readable_name(n): p for n, p in named}

    def parameter_names(self, trainable_only: bool = False) -> dict[str, str]:
        """The readable name of each entry of ``named_parameters()``.

        ``named_parameters()`` and ``state_dict`` name a value by its module path, with links and
        joints numbered in the order of ``link_names`` and ``all_joint_names`` (``links.7.mass``,
        ``joints.2.parametrizations.damping.original``); :meth:`learnable_parameters` names it after
        the link or joint (``iiwa_link_7.mass``, ``iiwa_joint_3.damping.raw``). The module paths stay
        what they are so that ``state_dict`` files, optimiser states and ``functional_call`` keep
        working (a link name may also hold a dot, which a module path cannot).

        Args:
            trainable_only: only the tensors with ``requires_grad`` (the keys of
                ``learnable_parameters(readable=False)``).

        Returns:
            ``{module path: readable name}``, e.g. ``{"links.7.mass": "iiwa_link_7.mass"}``.
        """
        return {n: self._readable_name(n) for n, p in self.named_parameters()
                if p.requires_grad or not trainable_only}

    def _readable_name(self, qualified: str) -> str:
        parts = qualified.split(".")
        owner: nn.Module = self
        if len(parts) > 2 and parts[0] in ("links", "joints") and parts[1].isdigit():
            k = int(parts[1])
            head = [self.link_names[k] if parts[0] == "links" else self.all_joint_names[k]]
            owner, rest = getattr(self, parts[0])[k], parts[2:]
        else:
            head, rest = [], parts
        if len(rest) >= 3 and rest[0] == "parametrizations":
            plist = owner.parametrizations[rest[1]]
            tail = rest[2:]
            if tail[0].startswith("original"):
                tail = ["raw" + tail[0][len("original"):]] + tail[1:]
            elif tail[0].isdigit():
                step = plist[int(tail[0])]
                tail = tail[1:] if len(plist) == 1 else [f"step{tail[0]}"] + tail[1:]
                skip = getattr(step, "_readable_skip", None)
                if skip is not None and tail and tail[0] == skip:
                    tail = tail[1:]
            rest = [rest[1]] + tail
        elif rest and rest[0] == "inertial_source":
            rest = ["inertial"] + rest[1:]
        return ".".join(head + rest)

    def set_gravity(self, gravity) -> None:
        """Set the gravity vector (3,), m/s^2, world frame."""
        g = torch.as_tensor(gravity, dtype=self.gravity.dtype, device=self.gravity.device)
        if g.shape != (3,):
            raise ModelError(f"gravity must have shape (3,), got {tuple(g.shape)}")
        with torch.no_grad():
            self.gravity.copy_(g)

    # ------------------------------------------------------------------ summaries
    @property
    def dtype(self) -> torch.dtype:
        return self._store_dtype

    @property
    def device(self) -> torch.device:
        return self._store_device

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
        """``q`` with zero joint angles and identity base and ball-joint orientations, ``(nq,)``."""
        q = torch.zeros(self.nq, dtype=self.dtype, device=self.device)
        if self.floating_base:
            q[6] = 1.0
        for _, qi, _ in self.tree.ball_joints:
            q[qi + 3] = 1.0
        return q

    def random_configuration(self, *batch: int, generator: torch.Generator | None = None) -> Tensor:
        """Random ``q (*batch, nq)``: joints uniform within limits (``[-pi, pi]`` where unbounded),
        base position in ``[-1, 1]^3`` and a uniform random unit quaternion; ball joints uniform
        over rotations (within their cone: uniform over the rotations of at most that angle)."""
        kw = dict(dtype=self.dtype, device=self.device)
        lo = torch.where(torch.isfinite(self.position_lower), self.position_lower, -math.pi).to(**kw)
        hi = torch.where(torch.isfinite(self.position_upper), self.position_upper, math.pi).to(**kw)
        u = torch.rand(*batch, self.nj, generator=generator, **kw)
        qj = lo + (hi - lo) * u
        if self.tree.n_ball:
            qj = _with_ball_quaternions(self.tree, qj, self.position_upper, generator)
        if not self.floating_base:
            return qj
        pos = 2 * torch.rand(*batch, 3, generator=generator, **kw) - 1
        quat = torch.randn(*batch, 4, generator=generator, **kw)
        quat = quat / quat.norm(dim=-1, keepdim=True)
        return torch.cat([pos, quat, qj], dim=-1)

    def summary(self) -> RobotSummary:
        """Name, counts, total mass (kg) and joint types, as a :class:`RobotSummary`: a plain ``dict``
        (keys ``name``, ``links``, ``bodies``, ``nq``, ``nv``, ``floating_base``, ``total_mass``,
        ``joint_types``) that prints as a table."""
        types: dict[str, int] = {}
        for t in self.tree.joint_kinds:
            types[t] = types.get(t, 0) + 1
        return RobotSummary(
            name=self.name, links=self.n_links, bodies=self.nb, nq=self.nq, nv=self.nv,
            floating_base=self.floating_base, total_mass=self.total_mass().detach().item(), joint_types=types,
        )

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, links={self.n_links}, nq={self.nq}, nv={self.nv}, "
                f"floating_base={self.floating_base}")


def _with_ball_quaternions(tree: KinematicTree, qj: Tensor, upper: Tensor, generator) -> Tensor:
    """Joint coordinates ``(*batch, nq - 7 nfree)`` from one sample per moving joint ``qj (*batch, nj)``:
    a ball joint's entry is replaced by a random unit quaternion ``(x, y, z, w)``, uniform over the
    rotations of angle at most its ``upper``.

    Uniform over SO(3) the angle ``t`` has density ``(1 - cos t) / pi``; restricted to ``t <= a``, its
    CDF is ``(t - sin t) / (a - sin a)``, inverted by Newton steps from a bracketing start."""
    kw = dict(dtype=qj.dtype, device=qj.device)
    batch = qj.shape[:-1]
    out = []
    for i, kind in enumerate(tree.joint_types):
        if kind != "ball":
            out.append(qj[..., i:i + 1])
            continue
        a = float(upper[i])
        if a >= math.pi:  # no cone: a normalised Gaussian 4-vector is uniform over rotations
            quat = torch.randn(*batch, 4, generator=generator, **kw)
            out.append(quat / quat.norm(dim=-1, keepdim=True))
            continue
        axis = torch.randn(*batch, 3, generator=generator, **kw)
        axis = axis / axis.norm(dim=-1, keepdim=True)
        target = torch.rand(*batch, 1, generator=generator, **kw) * (a - math.sin(a))
        t = torch.full_like(target, a)
        for _ in range(60):  # F convex on [0, pi]: from the right end Newton decreases monotonically
            f = t - torch.sin(t) - target
            t = torch.where(f > 0, t - f / (1 - torch.cos(t)).clamp_min(1e-300), t)
        out.append(torch.cat([axis * torch.sin(t / 2), torch.cos(t / 2)], -1))
    return torch.cat(out, -1)


def _validate_after_load(module: RobotParameters, incompatible_keys) -> None:
    """``load_state_dict`` post-hook: the loaded values obey :mod:`diffmech.model.validate`, or the
    previous values come back and a :class:`ModelError` names the link and value."""
    if getattr(module, "_dm_restoring", False):
        return
    before = module.__dict__.pop("_dm_before_load", None)
    try:
        validate_parameters(module, "load_state_dict")
    except ModelError:
        if before is not None:
            module.__dict__["_dm_restoring"] = True
            try:
                nn.Module.load_state_dict(module, before, strict=False)
            finally:
                module.__dict__["_dm_restoring"] = False
        raise
