"""``Scene``: several robots and free bodies in one world, with a ground plane and contact laws.

The scene's state is the models' states concatenated in the order given: ``q = [q_a, q_b, ...]``
(``scene.nq``), ``v = [v_a, v_b, ...]`` (``scene.nv``), ``scene.slices[name]`` and
``scene.vslices[name]`` the parts of each model. :func:`diffmech.sim.rollout` steps a scene with
frictional contact (:mod:`diffmech.sim.contact_step`).

Static models -- a URDF without a moving joint loaded without a floating base (a table, a ramp,
``nq = nv = 0``) -- are fixed obstacles: their collision shapes stay at their forward-kinematics
placements, they touch every moving model and free body (not the ground, not each other), the
contact solver treats them as of infinite mass (they have no column in the scene's velocity), and
they have no entries in ``q`` and ``v`` (their slices are empty).
"""

from __future__ import annotations

import contextvars
import math
from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn

from .._warnings import warn
from ..contact.convex import convex_plane
from ..contact.geometry import plane_candidates
from ..dynamics.kinematics import forward_kinematics
from ..errors import ModelError, OptionError, ShapeError
from ..model.collision import KINDS, collision_shapes, contact_coefficients
from ..robot import RobotModel
from ..spatial import rpy_to_matrix

__all__ = ["Scene", "GROUND", "SOLVERS", "PENETRATION_WARNING", "warn_initial_penetration"]

GROUND = "ground"
SOLVERS = ("pgs", "smooth", "mujoco")
# set while Scene.from_mjcf builds a scene: its geoms come from the compiled file, not from the shapes
_BUILDING_FROM_MJCF: contextvars.ContextVar[bool] = contextvars.ContextVar("building_from_mjcf", default=False)
PENETRATION_WARNING = 5e-3  # m: the default threshold of warn_initial_penetration


def _coef(value, name: str, where: str) -> Tensor | float:
    """A friction or restitution coefficient: one non-negative finite number (restitution at most 1)."""
    upper = 1.0 if name == "restitution" else float("inf")
    what = "a number in [0, 1] (0: plastic, 1: elastic)" if name == "restitution" else "a non-negative finite number"
    if isinstance(value, Tensor):
        if value.numel() != 1:
            raise ModelError(f"{where}: {name} must be {what} or a one-element tensor, got a tensor of shape "
                             f"{tuple(value.shape)} ({value.detach().flatten()[:3].tolist()})")
        f = float(value.detach())
        if not (0 <= f <= upper and f < float("inf")):
            raise ModelError(f"{where}: {name} must be {what}, got a tensor holding {f!r}")
        return value.reshape(())
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ModelError(f"{where}: {name} must be a number or a one-element tensor, got {value!r}") from None
    if not (0 <= f <= upper and f < float("inf")):
        raise ModelError(f"{where}: {name} must be {what}, got {value!r}")
    return f


class Scene(nn.Module):
    """Rigid bodies and robots in one world, touching each other and the ground.

    Args:
        models: ``{name: RobotModel}`` or a sequence of models (named by ``model.name``, which must
            then be unique). Fixed-base models stay where their root is; floating-base ones move
            freely (``diffmech.model.systems.sphere`` / ``box`` / ``capsule`` build free bodies).
            Only links with collision shapes (:mod:`diffmech.model.collision`) touch anything.
            A static model (no moving joint, no floating base: ``nq = 0``) is a fixed obstacle at
            the placement its forward kinematics gives (see the module docstring); a scene needs at
            least one model that moves.
        ground: a plane ``z = 0`` with normal ``+z`` (named ``"ground"`` in ``pairs``).
        friction: Coulomb coefficient of every pair (number or one-element tensor; a tensor that
            requires grad receives gradients through a rollout).
        restitution: coefficient of restitution of every pair, in ``[0, 1]`` (0: plastic, 1: elastic),
            likewise (also in ``pairs`` and a URDF's ``<contact>``; outside ``[0, 1]``: ``ModelError``).
        pairs: per pair of names, ``{("ball", "ground"): {"friction": 0.0, "restitution": 0.5}}``
            (order of the two names does not matter). Where a pair is not listed, a link's URDF
            ``<contact>`` values (``lateral_friction``, ``restitution``) apply to its contacts
            (the larger of two links' values), else ``friction`` and ``restitution``.
        limits: enforce the URDF joint position limits as unilateral constraints.
        self_collision: test shapes of one model against each other (links that share a joint
            excluded).
        solver: ``"pgs"`` (default): the hard contact problem by projected Gauss-Seidel, its
            gradient by the implicit function theorem with the contact modes fixed.
            ``"smooth"``: the relaxed problem of :mod:`diffmech.contact.smooth` (complementarity
            relaxed by ``smoothing``, friction by ``friction_smoothing``) by Newton's method from
            the PGS solution; forces and gradients vary smoothly across contact changes (a body
            about to touch, a contact about to slip already has a gradient).
            ``"mujoco"`` (the default of :meth:`from_mjcf`): MuJoCo's soft contact model and
            integrators, as ``mj_step`` computes them (:mod:`diffmech.sim.soft_step`, the page
            ``docs/mujoco_contact.md``): contacts, joint limits and friction loss as soft
            constraints with impedance from ``solref`` / ``solimp``, solved by the primal Newton
            method; Euler (implicit damping), RK4 or implicitfast. A scene from a file keeps the
            compiled model's options and constants in ``scene.mujoco``
            (:class:`~diffmech.sim.soft_step.MujocoOptions`); one built in code takes MuJoCo's
            defaults (Euler, pyramidal cones, ``solref (0.02, 1)``, ``solimp (0.9, 0.95, 0.001, 0.5,
            2)``), its damping, armature and springs from ``drives`` and the joints, its geoms'
            sliding friction from ``friction`` and the links' URDF ``<contact>`` values (all read
            once, as numbers: no gradient reaches them); ``restitution``, ``iterations``, ``tol``,
            ``baumgarte``, ``bounce_speed``, ``pairs``, ``sizes`` do not apply to it. Another name:
            ``OptionError``.
        smoothing: ``kappa`` of the smooth solver, J (impulse x separating speed): a candidate
            ``d`` m away feels about ``kappa dt / d`` N s.
        friction_smoothing: ``eps`` of the smooth solver, m/s: slip speed under which friction
            acts as a stiff viscous law (a resting body creeps at most at this speed).
        iterations: maximum projected Gauss-Seidel sweeps per step.
        tol: the solver stops when no impulse changes by more than ``tol`` (relative) in a sweep.
        baumgarte: fraction of a penetration removed per step (by a separating velocity).
        bounce_speed: restitution applies to impacts faster than this, m/s (slower ones settle).
        drives: joint-level spring-dampers that are part of the scene (position-controlled
            actuators, a quadruped holding its pose): ``{model name: {"stiffness": kp, "damping":
            kd, "target": q_ref}}``, adding ``kp (q_ref - q) - kd v`` to the joint forces of that
            model's joints (not its floating base). ``kp`` (N m/rad) and ``kd`` (N m s/rad) are
            numbers or ``(nj,)`` tensors, ``q_ref`` an ``(nj,)`` tensor (default: the neutral
            configuration); tensors that require grad receive gradients through a rollout. Both
            terms are integrated implicitly in the velocity (stable for any gains at any ``dt``).
            An optional ``"armature"`` (kg m^2 or kg, number or ``(nj,)`` tensor, default 0) adds
            the reflected inertia of each joint's motor to the diagonal of the mass matrix (what
            MJCF calls ``armature``), which also slows the joints under a given torque.
        sizes: dimensions of collision shapes that the contacts should be differentiable w.r.t.:
            ``{(model name, link name): tensor}`` for a link's first shape, or ``{(model, link,
            index): tensor}``; the tensor holds the shape's dimensions in its
            :mod:`~diffmech.model.collision` order (sphere ``(radius,)``, box ``(lx, ly, lz)``,
            capsule / cylinder ``(radius, length)``, convex hull ``(scale,)``: a factor on its
            vertices, dimensionless), m, and replaces the shape's own values in
            the contact geometry (not in the mass or inertia, which stay the model's). A tensor
            that requires grad receives gradients through a rollout while the set of touching
            points stays the same.

    Attributes:
        names: the models' names, in the order of their coordinates.
        static: the names of the static models (fixed obstacles; no coordinates), in that order.
        nq, nv: sizes of the scene's ``q`` and ``v`` (the models' concatenated).
        slices, vslices: ``{name: slice}`` of each model's coordinates in ``q`` and in ``v``.
        models: the models (``nn.ModuleDict``).
        mujoco: with ``solver="mujoco"``, the options and constants its step reads
            (:class:`~diffmech.sim.soft_step.MujocoOptions`); None otherwise.
    """

    def __init__(self, models, *, ground: bool = True, friction=0.5, restitution=0.0, pairs=None,
                 limits: bool = True, self_collision: bool = False, iterations: int = 50, tol: float = 1e-9,
                 baumgarte: float = 0.2, bounce_speed: float = 1e-2, drives=None, sizes=None,
                 solver: str = "pgs", smoothing: float = 1e-6, friction_smoothing: float = 1e-4):
        super().__init__()
        if isinstance(models, RobotModel):
            models = [models]
        if isinstance(models, Mapping):
            items = list(models.items())
        elif isinstance(models, Sequence):
            items = [(m.name, m) for m in models]
        else:
            raise ModelError(f"Scene: models must be a dict of name -> RobotModel or a list, got {type(models)}")
        if not items:
            raise ModelError("Scene: no models")
        names = [n for n, _ in items]
        dup = {n for n in names if names.count(n) > 1}
        if dup:
            raise ModelError(f"Scene: model names must be unique, {sorted(dup)} repeat (pass a dict to name them)")
        if GROUND in names:
            raise ModelError(f"Scene: {GROUND!r} is the ground's name; rename that model")
        for n, m in items:
            if not isinstance(m, RobotModel):
                raise ModelError(f"Scene: model {n!r} is a {type(m).__name__}, not a RobotModel")
        dtypes = {m.dtype for _, m in items}
        if len(dtypes) > 1:
            raise ModelError(f"Scene: the models have different dtypes {sorted(map(str, dtypes))}")
        self.static = [n for n, m in items if m.tree.nb == 0]
        if len(self.static) == len(items):
            raise ModelError(f"Scene: every model is static (no moving joint and no floating base: {self.static}); "
                             "a scene needs a robot or a free body to simulate")
        self.names = names
        self.models = nn.ModuleDict(dict(items))
        self.slices: dict[str, slice] = {}
        self.vslices: dict[str, slice] = {}
        iq = iv = 0
        for n, m in items:
            self.slices[n], self.vslices[n] = slice(iq, iq + m.nq), slice(iv, iv + m.nv)
            iq, iv = iq + m.nq, iv + m.nv
        self.nq, self.nv = iq, iv
        self.ground = bool(ground)
        self.friction = _coef(friction, "friction", "Scene")
        self.restitution = _coef(restitution, "restitution", "Scene")
        self.pairs: dict[frozenset, dict] = {}
        for key, vals in (pairs or {}).items():
            if not (isinstance(key, tuple) and len(key) == 2):
                raise ModelError(f"Scene: pairs keys must be (name, name) tuples, got {key!r}")
            for k in key:
                if k not in names and k != GROUND:
                    raise ModelError(f"Scene: pairs names unknown model {k!r} (models: {names + [GROUND]})")
            bad = set(vals) - {"friction", "restitution"}
            if bad:
                raise ModelError(f"Scene: pairs[{key!r}]: unknown keys {sorted(bad)} (friction, restitution)")
            self.pairs[frozenset(key)] = {k: _coef(v, k, f"Scene pairs[{key!r}]") for k, v in vals.items()}
        self.limits, self.self_collision = bool(limits), bool(self_collision)
        if iterations < 1 or tol < 0:
            raise ModelError(f"Scene: iterations must be >= 1 and tol >= 0, got {iterations}, {tol}")
        self.iterations, self.tol = int(iterations), float(tol)
        self.baumgarte, self.bounce_speed = float(baumgarte), float(bounce_speed)
        if solver not in SOLVERS:
            raise OptionError(f"Scene: unknown solver {solver!r}; choose 'pgs', 'smooth' or 'mujoco'")
        if not (smoothing > 0 and friction_smoothing > 0):
            raise ModelError(f"Scene: smoothing and friction_smoothing must be positive, got {smoothing}, "
                             f"{friction_smoothing}")
        self.solver, self.smoothing, self.friction_smoothing = solver, float(smoothing), float(friction_smoothing)
        self.shapes = {n: collision_shapes(m) for n, m in items}
        self.link_coefficients = {n: contact_coefficients(m) for n, m in items}
        for n, table in self.link_coefficients.items():
            for link, vals in table.items():
                e = vals.get("restitution")
                if e is not None and not 0 <= e <= 1:
                    raise ModelError(f"Scene: model {n!r} link {link!r}: the URDF's <contact><restitution "
                                     f"value={e!r}> must be in [0, 1] (0: plastic, 1: elastic)")
        self.drives: dict[str, tuple[Tensor, Tensor, Tensor, Tensor]] = {}
        for n, spec in (drives or {}).items():
            self.drives[n] = self._drive(n, spec)
        self.shape_sizes: dict[tuple[str, str, int], Tensor] = {}
        for key, value in (sizes or {}).items():
            self._set_size(key, value)
        self.mujoco = None
        if solver == "mujoco":  # MuJoCo's defaults; Scene.from_mjcf replaces them by the file's
            from .soft_step import default_options

            self.mujoco = default_options(self)
            if not _BUILDING_FROM_MJCF.get():  # a shape or pair MuJoCo's collision code lacks: refused here
                from ..contact.soft_geoms import geom_table_default

                self.mujoco.geoms = geom_table_default(self)

    @classmethod
    def from_mjcf(cls, path, *, dtype: torch.dtype = torch.float64, device=None, **kwargs) -> Scene:
        """The scene of an MJCF file, compiled by MuJoCo's own compiler (:mod:`diffmech.model.mjcf`).

        Each top-level body with degrees of freedom is one model, named after that body, or after
        the file's ``<mujoco model>`` when there is one such body (a free joint makes it a floating
        base; otherwise it hangs from its own massless world link). A
        plane of the world body at ``z = 0`` facing ``+z`` that collides is the ground; the world's
        other colliding geoms and the top-level bodies without joints (welded to the world) are one
        static model named ``"static"``, a fixed obstacle (its geoms of kinds the contact code does
        not have, another plane among them: one warning names them).
        Links collide through their sphere, capsule, cylinder and box geoms (others: one warning);
        a link's friction is the largest sliding friction of its geoms and the ground's (MuJoCo
        takes the larger of a pair). ``self_collision`` is on when the geoms' ``contype`` /
        ``conaffinity`` let two bodies of one tree that are not parent and child touch.
        Gravity is the file's; ``scene.timestep`` (s) is its ``<option timestep>`` for the caller's
        ``dt``; the actuators are in each model's ``meta["mjcf"]["actuators"]``
        (:func:`diffmech.model.mjcf.actuator_forces` maps MuJoCo's ``ctrl`` to joint forces).

        The solver is ``"mujoco"`` unless ``solver`` is given: the scene steps as MuJoCo's
        ``mj_step`` (:mod:`diffmech.sim.soft_step`), with the compiled model's options (timestep,
        integrator, cone, impratio, tolerance, iterations, disable flags), joint limits
        (``solref`` / ``solimp`` / ``margin``), dof friction loss, damping, armature, springs and
        collision geoms (:class:`diffmech.contact.soft_geoms.GeomTable`) in ``scene.mujoco``
        (:class:`~diffmech.sim.soft_step.MujocoOptions`). With ``solver="pgs"`` or ``"smooth"``
        the contacts are diffmech's hard contacts: joint damping and armature become the scene's
        drives (damping implicit in the velocity, as MuJoCo's ``Euler`` integrator treats it),
        springs stay in the models, joint limits are enforced, and trajectories agree with
        MuJoCo's only until the first contact.

        Args:
            path: the ``.xml`` file.
            dtype, device: of the models' parameters.
            **kwargs: any other :class:`Scene` argument, overriding what the file gives.

        Raises:
            ModelError: see :func:`diffmech.load_mjcf` (ball joints, equality constraints, acting
                tendons, ...), naming the element.
        """
        from ..model.mjcf import scene_from_mjcf

        return scene_from_mjcf(cls, path, dtype, device, kwargs)

    # ------------------------------------------------------------------ state
    @property
    def dtype(self) -> torch.dtype:
        return next(iter(self.models.values())).dtype

    @property
    def device(self) -> torch.device:
        return next(iter(self.models.values())).device

    def model(self, name: str) -> RobotModel:
        return self.models[name]

    def neutral_configuration(self) -> Tensor:
        """``(nq,)``: every model's neutral configuration."""
        return torch.cat([self.models[n].neutral_configuration() for n in self.names])

    def random_configuration(self, *batch: int, generator: torch.Generator | None = None) -> Tensor:
        """``(*batch, nq)``: every model's random configuration (free bodies anywhere in
        ``[-1, 1]^3``: bodies may overlap)."""
        return torch.cat([self.models[n].random_configuration(*batch, generator=generator) for n in self.names], -1)

    def split(self, x: Tensor, which: str = "q") -> dict[str, Tensor]:
        """``{name: part}`` of a scene ``q`` (``which="q"``) or ``v`` (``"v"``) ``(..., n)``."""
        sl, n = (self.slices, self.nq) if which == "q" else (self.vslices, self.nv)
        if x.shape[-1] != n:
            raise ShapeError(f"Scene: {which} must have {n} entries in its last dimension, got shape {tuple(x.shape)}")
        return {k: x[..., s] for k, s in sl.items()}

    def _drive(self, name: str, spec) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        where = f"Scene drives[{name!r}]"
        if name not in self.names:
            raise ModelError(f"{where}: no model of that name (models: {self.names})")
        if not isinstance(spec, Mapping) or set(spec) - {"stiffness", "damping", "target", "armature"}:
            raise ModelError(f"{where}: expected a dict with keys stiffness, damping, target, armature; "
                             f"got {spec!r}")
        m = self.models[name]
        off_q, off_v = (7, 6) if m.floating_base else (0, 0)
        nj = m.nv - off_v
        if nj == 0 or m.nq - off_q != nj:
            raise ModelError(f"{where}: drives need one coordinate per joint velocity (revolute / prismatic "
                             f"joints); {name!r} has {m.nq - off_q} joint coordinates and {nj} joint velocities")
        opts = dict(dtype=m.dtype, device=m.device)
        out = []
        for key, default in (("stiffness", 0.0), ("damping", 0.0),
                             ("target", m.neutral_configuration()[off_q:]), ("armature", 0.0)):
            val = spec.get(key, default)
            t = val if isinstance(val, Tensor) else torch.as_tensor(val, **opts)
            if t.dim() == 0:
                t = t.expand(nj)
            if t.shape != (nj,) or not torch.isfinite(t.detach()).all():
                raise ModelError(f"{where}: {key} must be a finite number or a ({nj},) tensor (one per joint of "
                                 f"{name!r}), got shape {tuple(t.shape)}")
            if key != "target" and bool((t.detach() < 0).any()):
                raise ModelError(f"{where}: {key} must be non-negative, got {t.detach().tolist()}")
            out.append(t.to(**opts))
        return tuple(out)

    def _set_size(self, key, value) -> None:
        where = f"Scene sizes[{key!r}]"
        if not (isinstance(key, tuple) and len(key) in (2, 3)):
            raise ModelError(f"{where}: keys must be (model, link) or (model, link, index) tuples")
        name, link, index = (*key, 0) if len(key) == 2 else key
        if name not in self.names:
            raise ModelError(f"{where}: no model of that name (models: {self.names})")
        shapes = self.shapes[name].get(link, [])
        if not isinstance(index, int) or not 0 <= index < len(shapes):
            raise ModelError(f"{where}: model {name!r} link {link!r} has {len(shapes)} collision shape(s)"
                             f" (links with shapes: {sorted(self.shapes[name])})")
        kind = shapes[index].kind
        n = KINDS[kind]
        m = self.models[name]
        t = value if isinstance(value, Tensor) else torch.as_tensor(value, dtype=m.dtype, device=m.device)
        if t.shape not in ((n,),) + (((),) if n == 1 else ()):
            raise ModelError(f"{where}: a {kind} takes {n} dimension(s), got a tensor of shape {tuple(t.shape)}")
        if not (torch.isfinite(t.detach()).all() and bool((t.detach() > 0).all())):
            raise ModelError(f"{where}: dimensions must be positive and finite, got {t.detach().tolist()}")
        self.shape_sizes[(name, link, index)] = t.reshape(n).to(dtype=m.dtype, device=m.device)

    def shape_size(self, model: str, link: str, index: int = 0) -> Tensor | tuple[float, ...]:
        """The dimensions the contact geometry uses for shape ``index`` of ``link`` of ``model``:
        the tensor given in ``sizes``, else the shape's own values (floats), m."""
        key = (model, link, index)
        return self.shape_sizes[key] if key in self.shape_sizes else self.shapes[model][link][index].size

    def _apply(self, fn, recurse=True):
        # The models' tensors move with nn.Module; the coefficients, drives and sizes are plain
        # attributes (tensors the user may hold and train), moved here through a differentiable
        # copy so that gradients still reach the tensors that were passed in.
        super()._apply(fn, recurse)

        def move(v):
            return fn(v) if isinstance(v, Tensor) else v

        self.friction, self.restitution = move(self.friction), move(self.restitution)
        self.pairs = {k: {kk: move(v) for kk, v in d.items()} for k, d in self.pairs.items()}
        self.drives = {k: tuple(move(t) for t in d) for k, d in self.drives.items()}
        self.shape_sizes = {k: move(t) for k, t in self.shape_sizes.items()}
        return self

    def coefficients(self, a: str, b: str, link_a: str | None = None, link_b: str | None = None
                     ) -> tuple[Tensor | float, Tensor | float]:
        """``(friction, restitution)`` of the pair ``(a, b)`` (model names or ``"ground"``), for
        contacts of the links ``link_a`` of ``a`` and ``link_b`` of ``b`` when given: ``pairs``
        first, then the links' URDF ``<contact>`` values (the larger of the two), then the scene's."""
        over = self.pairs.get(frozenset((a, b)), {})
        out = []
        for key, default in (("friction", self.friction), ("restitution", self.restitution)):
            if key in over:
                out.append(over[key])
                continue
            vals = [self.link_coefficients.get(m, {}).get(link, {}).get(key) for m, link in ((a, link_a), (b, link_b))]
            vals = [v for v in vals if v is not None]
            out.append(max(vals) if vals else default)
        return out[0], out[1]

    def coefficient_tensors(self) -> list[Tensor]:
        """The friction, restitution, drive and shape-size tensors that require grad (for the
        rollout's gradients)."""
        vals = [self.friction, self.restitution] + [v for d in self.pairs.values() for v in d.values()]
        vals += [t for d in self.drives.values() for t in d] + list(self.shape_sizes.values())
        out, seen = [], set()
        for v in vals:
            if isinstance(v, Tensor) and v.requires_grad and id(v) not in seen:
                seen.add(id(v))
                out.append(v)
        return out

    # ------------------------------------------------------------------ the ground
    def _check_q(self, q, where: str) -> Tensor:
        if not isinstance(q, Tensor) or not q.dtype.is_floating_point:
            raise ShapeError(f"Scene.{where}: q must be a floating-point tensor of shape (..., {self.nq}), got "
                             f"{type(q).__name__}" + (f" of dtype {q.dtype}" if isinstance(q, Tensor) else ""))
        if q.dim() < 1 or q.shape[-1] != self.nq:
            raise ShapeError(f"Scene.{where}: q must have shape (..., {self.nq}) (nq of the models "
                             f"{self.names}), got q of shape {tuple(q.shape)}")
        return q

    def _named(self, model, where: str) -> list[str]:
        """The names ``model`` (None, a name or a sequence of names) stands for, checked to exist."""
        if model is None:
            return list(self.names)
        names = [model] if isinstance(model, str) else list(model) if isinstance(model, Sequence) else None
        if names is None or not all(isinstance(n, str) for n in names):
            raise ModelError(f"Scene.{where}: model must be None, a model name or a list of names, got {model!r}")
        for n in names:
            if n not in self.names:
                raise ModelError(f"Scene.{where}: no model named {n!r} (the scene's models: {self.names})")
        return list(dict.fromkeys(names))

    def _lowest(self, name: str, q: Tensor) -> tuple[Tensor, Tensor]:
        """Signed height above the plane ``z = 0`` of the lowest point of model ``name``'s collision
        shapes, ``(...)`` m (negative: below the plane), and the index in ``list(scene.shapes[name])``
        of the link that has it, ``(...)`` long; ``q (..., scene.nq)``."""
        m, shapes = self.models[name], self.shapes[name]
        qm = q[..., self.slices[name]]
        batch = qm.shape[:-1]
        # (B, L, 3), (B, L, 3, 3); math.prod, not -1: a static model's part of q has no element
        p_links, R_links = forward_kinematics(m, qm.reshape(math.prod(batch), m.nq), form="pos_rot")
        lows, rows = [], []
        for j, (link, shs) in enumerate(shapes.items()):
            li = m.link_names.index(link)
            R_l, p_l = R_links[:, li], p_links[:, li]
            for k, sh in enumerate(shs):
                R, p = R_l, p_l
                if any(sh.xyz):
                    p = p + R_l @ torch.tensor(sh.xyz, dtype=p.dtype, device=p.device)
                if any(sh.rpy):
                    R = R_l @ rpy_to_matrix(torch.tensor(sh.rpy, dtype=p.dtype, device=p.device))
                size = self.shape_size(name, link, k)
                if sh.kind == "cylinder":
                    lows.append(_cylinder_low(R, p, size))
                elif sh.kind == "convex":  # its deepest vertex
                    lows.append(convex_plane(sh.hull, size, R, p, k=1).phi[..., 0])
                else:  # sphere, capsule, box: the contact code's candidates include the lowest point
                    lows.append(plane_candidates(sh.kind, size, R, p).phi.amin(-1))
                rows.append(j)
        low, at = torch.stack(lows, -1).min(-1)
        link = torch.tensor(rows, dtype=torch.long, device=at.device)[at]
        return low.reshape(batch), link.reshape(batch)

    def place_on_ground(self, q: Tensor, model: str | Sequence[str] | None = None) -> Tensor:
        """``q`` with models raised or lowered so that each rests on the ground: its lowest collision
        point exactly on the plane ``z = 0`` (gap 0), batch element by batch element.

        Each model is moved vertically only, by changing its floating base's height (the third
        entry of its part of ``q``: a floating base's coordinates are ``(x, y, z, qx, qy, qz, qw)``
        in m and a unit quaternion, then the joint coordinates); its horizontal position,
        orientation and joint angles stay as given, and the lowest point is that of its collision
        shapes (:mod:`diffmech.model.collision`, with the dimensions of the scene's ``sizes``) at
        that orientation and those joint angles (forward kinematics). The lowest point is exact for
        every kind: a sphere's bottom, a capsule's lower end sphere, a box's lowest corner, a
        cylinder's lowest rim point. (The contact step samples a cylinder's rims at 8 points
        each, so a cylinder resting on its rim between two samples is seen there up to
        ``radius (1 - cos(pi / 8))``, 7.6 % of its radius, above the ground.) Models are placed
        independently: one standing on another is not stacked on it.

        Differentiable w.r.t. ``q`` (and the tensors of ``sizes``): the new height is the old one
        minus the lowest point's height, whose gradient flows to the orientation and the joint
        coordinates (to the shape with the lowest point; the result does not depend on the old
        height, so its gradient w.r.t. that height is zero).

        Args:
            q: ``(..., scene.nq)`` configuration of the scene, any leading batch dimensions, in the
                scene's dtype (float32 or float64).
            model: which models to place: ``None`` (default) every model with a floating base and
                collision shapes; a model name; or a list of names (each must have a floating base
                and collision shapes).

        Returns:
            ``(..., scene.nq)``: a new tensor; ``q`` is not modified.

        Raises:
            ShapeError: ``q`` is not a floating-point tensor of shape ``(..., scene.nq)``.
            ModelError: a named model does not exist, has no floating base or no collision shapes
                (it cannot be placed); ``model=None`` and no model of the scene can be placed.
        """
        q = self._check_q(q, "place_on_ground")
        if model is None:
            names = [n for n in self.names if self.models[n].floating_base and self.shapes[n]]
            if not names:
                raise ModelError(f"Scene.place_on_ground: no model of the scene has a floating base and collision "
                                 f"shapes (models: {self.names}); nothing can be placed")
        else:
            names = self._named(model, "place_on_ground")
            for n in names:
                if not self.models[n].floating_base:
                    raise ModelError(f"Scene.place_on_ground: model {n!r} has a fixed base; only a model with a "
                                     f"floating base can be raised or lowered")
                if not self.shapes[n]:
                    raise ModelError(f"Scene.place_on_ground: model {n!r} has no collision shapes; nothing of it "
                                     f"touches the ground (set some with diffmech.model.collision."
                                     f"set_collision_shapes)")
        out = q.clone()
        for n in names:
            low, _ = self._lowest(n, q)
            i = self.slices[n].start + 2
            out[..., i] = q[..., i] - low
        return out

    def penetration(self, q: Tensor, model: str | Sequence[str] | None = None) -> dict[str, tuple[Tensor, object]]:
        """How deep each model's collision shapes reach below the ground plane ``z = 0``.

        Args:
            q: ``(..., scene.nq)`` configuration of the scene.
            model: ``None`` (default): every model with collision shapes (fixed-base ones too) but
                the static ones (obstacles, which may reach into the ground by design); a model
                name or a list of names.

        Returns:
            ``{name: (depth, link)}`` for each model with collision shapes: ``depth (...)`` the
            deepest penetration ``max(0, -height of the lowest point)``, m (0 where the model is
            above the ground), differentiable w.r.t. ``q``; ``link`` the name of the link with the
            lowest point, a ``str`` for an unbatched ``q``, else nested lists of ``str`` of the
            batch shape (``Tensor.tolist`` style). Geometry as in :meth:`place_on_ground`.

        Raises:
            ShapeError: a wrong ``q``. ModelError: an unknown model name.
        """
        q = self._check_q(q, "penetration")
        out = {}
        for n in self._named(model, "penetration"):
            if not self.shapes[n] or (model is None and n in self.static):
                continue
            low, idx = self._lowest(n, q)
            links = list(self.shapes[n])
            out[n] = ((-low).clamp_min(0.0), _map_nested(idx.tolist(), links.__getitem__))
        return out

    def extra_repr(self) -> str:
        static = f"static={self.static}, " if self.static else ""
        return (f"models={self.names}, {static}nq={self.nq}, nv={self.nv}, ground={self.ground}, "
                f"friction={_number(self.friction):g}, restitution={_number(self.restitution):g}")


def _number(x) -> float:
    return float(x.detach()) if isinstance(x, Tensor) else float(x)


def _map_nested(x, fn):
    return [_map_nested(y, fn) for y in x] if isinstance(x, list) else fn(x)


def _cylinder_low(R: Tensor, p: Tensor, size) -> Tensor:
    """Height of the lowest point of cylinders ``(R (B, 3, 3), p (B, 3))`` of ``size = (radius, length)``
    (axis along the shape's ``z``), ``(B,)``: the lower end face's centre, less the radius times the
    length of the vertical axis projected on the end face's plane."""
    radius, length = size[0], size[1]
    a = R[:, 2, :]  # world z of the shape's axes: (R[2, 0], R[2, 1], R[2, 2])
    s2 = a[:, 0] ** 2 + a[:, 1] ** 2
    tilt = torch.where(s2 > 0, s2.clamp_min(torch.finfo(s2.dtype).tiny).sqrt(), torch.zeros_like(s2))
    return p[:, 2] - 0.5 * length * a[:, 2].abs() - radius * tilt


def warn_initial_penetration(scene: Scene, q: Tensor, threshold: float = PENETRATION_WARNING) -> dict[str, float]:
    """Warn, once per call (one ``RuntimeWarning``), about every model of ``scene`` that starts more
    than ``threshold`` m inside the ground, naming it, its deepest link and the depth.

    What a rollout calls on its initial ``q``: a body that starts inside the ground is pushed out
    by the contact step's Baumgarte term (``baumgarte * depth / dt`` per step), which launches it
    visibly at centimetres of depth, while a body resting on the ground sits at most the solver's
    tolerance inside it. The default threshold, 5 mm (:data:`PENETRATION_WARNING`), lies between
    the two: no warning for a scene's own resting start (``diffmech.sim.scenes`` place their
    bodies on the ground), one for a robot placed by guessing its height.

    Args:
        scene: the scene (nothing is checked or warned when it has no ground).
        q: ``(..., scene.nq)`` initial configuration; with batch dimensions, the deepest batch
            element of each model is reported (its index given).
        threshold: depth in m above which to warn (non-negative).

    Returns:
        ``{name: depth}`` (m, the deepest over the batch) of the models warned about; empty when
        there is no warning.
    """
    if not (threshold >= 0 and threshold < float("inf")):
        raise ModelError(f"warn_initial_penetration: threshold must be a non-negative number of metres, got "
                         f"{threshold!r}")
    if not scene.ground:
        return {}
    with torch.no_grad():
        pen = scene.penetration(q.detach() if isinstance(q, Tensor) else q)
    lines, out = [], {}
    for n, (depth, links) in pen.items():
        flat = depth.reshape(-1)
        k = int(flat.argmax())
        d = float(flat[k])
        if not d > threshold:
            continue
        link = links
        index = []
        if depth.dim():
            index = list(torch.unravel_index(torch.tensor(k), depth.shape))
            for i in index:
                link = link[int(i)]
        where = f", batch element {tuple(int(i) for i in index)}" if index else ""
        fix = ("Scene.place_on_ground(q) raises it onto the ground" if scene.models[n].floating_base
               else "it has a fixed base: change its joint angles or its base placement")
        lines.append(f"model {n!r} starts {d:.4g} m inside the ground (link {link!r}{where}); {fix}")
        out[n] = d
    if lines:
        warn("; ".join(lines) + f" (warning above {threshold:g} m)", RuntimeWarning)
    return out
