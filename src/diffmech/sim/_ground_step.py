"""The first stage of a contact step of one robot on the ground, as one native kernel.

A scene of one articulated robot whose collision shapes are spheres, capsules, boxes and
cylinders -- a legged robot's feet, the Ant, box feet -- touching nothing but the ground: the free
velocity (mass matrix, bias forces, the drives' linearly implicit spring-dampers, Cholesky factor and
solve), every ball's gap and its contact rows come from one call of the kernel of
:func:`~diffmech.dynamics.lanes.ground_step_lanes`, and its gradient from one call of that kernel's
reverse mode. A ball is a point of a link and a radius: a sphere is one, a capsule its two end balls,
a box its 8 corners and a cylinder the 16 points of its two end rims (radius 0) -- the candidates
:func:`~diffmech.contact.geometry.plane_candidates` gives each shape against the ground, in its order.
The torch code of the same stage (:mod:`diffmech.sim.contact_step`) issues some two hundred operations
per step, each costing the same for one robot as for a thousand: with one robot that dispatch was most
of the step.

Used where the kernels are built or stored (:func:`diffmech.dynamics.kernels.set_native`; built
by :func:`prepare_ground_kernels`), else the torch code runs; both give the same step to rounding.
"""

from __future__ import annotations

import weakref
from typing import NamedTuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..contact import update_native
from ..contact.impulses import solve_and_apply, update_vjp
from ..contact.pgs import implicit_vjp
from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable
from ..spatial import rpy_to_matrix
from .scene import GROUND, Scene

__all__ = ["GroundPlan", "Stage", "ground_plan", "ground_stage", "ground_advance", "ground_velocity_update",
           "with_graph", "has_limits", "prepare_ground_kernels"]

# the shapes whose candidates against the ground are a fixed set of balls (geometry.plane_candidates)
_KINDS = ("sphere", "capsule", "box", "cylinder")
_COUNT = {"sphere": 1, "capsule": 2, "box": 8, "cylinder": 16}  # balls per shape
# a box's corners as plane_candidates orders them: x slowest, z fastest, -1 before +1
_CORNERS = [(sx, sy, sz) for sx in (-1.0, 1.0) for sy in (-1.0, 1.0) for sz in (-1.0, 1.0)]
# scene -> {dtype: plan}; beside the scene, not in it: a plan holds native libraries, which neither
# deepcopy nor torch.save can copy
_PLANS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# Up to this many balls x environments per call. The kernel places every ball and forms its rows in one
# thread; the torch step forms the rows of the kept candidates only, in batched operations on all
# threads. Measured (2 cores, Ant steps per second, this route / the torch step, without and with
# gradients): 8 Ants 1.6x / 2.0x, 32 Ants 1.05x / 1.38x, 64 Ants 0.81x / 1.15x, 1024 Ants 0.66x / 0.76x
# (25 balls, a few on the ground); the quadruped (4 balls, all on the ground) 1.7x with gradients at
# 1024 robots. The limit keeps the route where neither is slower.
MAX_BALL_STATES = 1024


class GroundPlan:
    """What the native stage needs of a scene, built once per scene and dtype."""

    def __init__(self, name: str, call: kernels.NativeCall, links: tuple[int, ...], shapes: list, keys: list,
                 n_drives: int):
        self.name, self.call, self.links, self.shapes, self.keys = name, call, links, shapes, keys
        self.index = {k: b for b, k in enumerate(keys)}  # a candidate's key -> its ball
        self.n_drives = n_drives
        self.balls: Tensor | None = None  # (1, 4 nb) constant where no size is a tensor
        self.coef: list = []  # per ball (friction, restitution) as the scene gave them last
        self.coef_const: Tensor | None = None  # (2, nb) where all of them are floats
        self.coef_sel: dict = {}  # tuple of balls -> (2, k) of coef_const
        self.sel: dict = {}  # tuple of balls -> their index tensor
        self.advance: kernels.NativeCall | None = None  # a floating base's position update
        self.dt_col: dict = {}  # (B, dt) -> a (B, 1) column of dt
        self.mt: tuple = (None, False)  # the robot's model tensors last seen, and whether one requires grad
        self.limits: tuple = (None, True)  # the limit tensors (and versions) last seen, and whether one is finite


def _ineligible(scene: Scene) -> str | None:
    """Why the native step does not serve ``scene`` (``None``: it does)."""
    if len(scene.names) != 1:
        return f"{len(scene.names)} models in the scene"
    if not scene.ground:
        return "no ground"
    if scene.solver != "pgs":
        return f"solver {scene.solver!r}"
    if scene.self_collision:
        return "self-collision"
    n = scene.names[0]
    m = scene.models[n]
    shapes = scene.shapes[n]
    if not shapes:
        return "no collision shape"
    if m.tree.coords is not None:
        return "mimic joints"
    if m.tree.n_ball:
        return "ball joints"
    kinds = sorted({sh.kind for shs in shapes.values() for sh in shs} - set(_KINDS))
    return f"{', '.join(kinds)} shapes" if kinds else None


def _plan(scene: Scene, dtype: torch.dtype) -> GroundPlan | None:
    if _ineligible(scene) is not None:
        return None
    n = scene.names[0]
    m = scene.models[n]
    items = [(link, k, sh) for link, shs in scene.shapes[n].items() for k, sh in enumerate(shs)]
    # the torch step's candidate order (contact_step._ground_candidates): the kinds as they first appear,
    # items in order, each shape's candidates in plane_candidates' order. The torch step orders the kinds
    # of the shapes near the ground only: where kinds interleave in the items (sphere, box, sphere) and a
    # kind's first shape is far from the ground, its sweeps visit the contacts in another order (the same
    # solution to the solver's tolerance, not to rounding)
    kinds = list(dict.fromkeys(sh.kind for _, _, sh in items))
    links, shapes, keys = [], [], []
    for kind in kinds:
        for i, (link, k, sh) in enumerate(items):
            if sh.kind != kind:
                continue
            for j in range(_COUNT[kind]):
                links.append(m.link_names.index(link))
                shapes.append((link, k, sh, j))
                keys.append((i, -1, j))
    nd = scene.drives[n][0].shape[0] if n in scene.drives else 0
    call = kernels.NativeCall(m.tree, kernels.ground_step_algorithm(nd, tuple(links)), True, False, build=False)
    plan = GroundPlan(n, call, tuple(links), shapes, keys, nd)
    if m.floating_base:
        plan.advance = kernels.NativeCall(m.tree, "advance", True, False, build=False)
    if not scene.shape_sizes:
        plan.balls = _balls(scene, plan, dtype).detach()
    return plan


def _shape_balls(kind: str, size: Tensor, xyz: Tensor, R: Tensor) -> Tensor:
    """``(k, 4)``: the balls of one shape (dimensions ``size``, placed at ``xyz (3,)`` and rotated by
    ``R (3, 3)`` in its link's frame), each its centre in the link's frame and its radius, in
    :func:`~diffmech.contact.geometry.plane_candidates`' order: a sphere itself; a capsule's end
    balls at ``-+length / 2`` along its axis; a box's corners ``xyz + R (+-sx, +-sy, +-sz) / 2``; a
    cylinder's two end rims (the ``-z`` end first), 8 points each at angles ``0, pi/4, ...``, radius 0."""
    if kind == "sphere":
        return torch.cat([xyz, size[:1]])[None]
    if kind == "capsule":
        half = (0.5 * size[1]) * R[:, 2]
        return torch.stack([torch.cat([xyz - half, size[:1]]), torch.cat([xyz + half, size[:1]])])
    if kind == "box":
        local = torch.tensor(_CORNERS, dtype=size.dtype) * (0.5 * size)  # (8, 3)
    else:  # cylinder: the angles computed as geometry.plane_candidates computes them
        ang = torch.arange(8, dtype=size.dtype) * (torch.pi / 4)
        ring = torch.stack([size[0] * torch.cos(ang), size[0] * torch.sin(ang)], 1)  # (8, 2)
        half = (0.5 * size[1]).expand(8, 1)
        local = torch.cat([torch.cat([ring, -half], 1), torch.cat([ring, half], 1)])  # (16, 3)
    centres = xyz + local @ R.t()
    return torch.cat([centres, centres.new_zeros(centres.shape[0], 1)], 1)


def _balls(scene: Scene, plan: GroundPlan, dtype: torch.dtype) -> Tensor:
    """``(1, 4 nb)``: each ball's centre in its link's frame and its radius (:func:`_shape_balls`),
    differentiable w.r.t. the scene's size tensors."""
    out = []
    for link, k, sh, j in plan.shapes:
        if j:  # the shape's balls come with its first
            continue
        size = scene.shape_size(plan.name, link, k)
        size = size.to(dtype) if isinstance(size, Tensor) else torch.tensor(size, dtype=dtype)
        R = rpy_to_matrix(torch.tensor(sh.rpy, dtype=dtype))
        out.append(_shape_balls(sh.kind, size, torch.tensor(sh.xyz, dtype=dtype), R).reshape(-1))
    return torch.cat(out)[None]


def ground_plan(scene: Scene, x: Tensor, max_states: int | None = MAX_BALL_STATES,
                why: list | None = None) -> GroundPlan | None:
    """The scene's plan where the native stage applies to states like ``x (B, nq)`` (CPU, float32/64,
    native kernels not turned off, no ``torch.func`` transform, ``B`` times the balls at most
    ``max_states``: ``None`` for no limit), else ``None``, with the reason appended to ``why``."""
    reason = kernels.native_refusal(x)
    if reason is None:
        plans = _PLANS.get(scene)
        if plans is None:
            plans = _PLANS[scene] = {}
        if x.dtype not in plans:
            plans[x.dtype] = _plan(scene, x.dtype)
        plan = plans[x.dtype]
        if plan is None:
            reason = _ineligible(scene) or "scene"
        elif max_states is not None and x.shape[0] * len(plan.links) > max_states:
            reason = f"batch ({x.shape[0]} x {len(plan.links)} balls > {max_states})"
        else:
            plan.call.build = kernels.building()
            try:  # the value's kernel and its reverse mode's: a step and its replay run the same code
                plan.call.kernel(x.dtype)
                plan.call.kernel(x.dtype, True, ())
            except NativeUnavailable as err:
                reason = kernels.unavailable_reason(err)
            else:
                return plan
    if why is not None:
        why.append(reason)
    return None


class Stage(NamedTuple):
    """The first stage of a step (:func:`ground_stage`)."""

    v_free: Tensor  # (B, nv)
    L: Tensor  # (B, nv, nv)
    phi: Tensor  # (B, nb)
    rows: Tensor  # (B, nb, 3, nv)
    state: list  # the kernel's inputs (q, v, tau[, drives], balls, dt)
    C: Tensor  # the robot's constants
    by_hand: bool  # no graph here: the step's velocity update differentiates the kernel (ground_velocity_update)


def _split(out: Tensor, nv: int, nb: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    B = out.shape[0]
    return (out[:, :nv], out[:, nv:nv + nv * nv].view(B, nv, nv), out[:, nv + nv * nv:nv + nv * nv + nb],
            out[:, nv + nv * nv + nb:].view(B, nb, 3, nv))


def ground_advance(scene: Scene, plan: GroundPlan, q: Tensor, v: Tensor, dt: float) -> tuple[Tensor, Tensor] | None:
    """:func:`~diffmech.dynamics.kinematics.advance_floating_base` of the robot by its native kernel, called
    directly (the public function's checks and dispatch cost ten times the kernel); ``None`` where that
    function must run instead (a fixed base, no kernel, a rotation of a radian or more in the step)."""
    from ..dynamics.lanes import SERIES_BELOW

    if plan.advance is None:
        return None
    w = v.detach()[:, 3:6].numpy()
    if not w.shape[0] or float((w * w).sum(-1).max()) * dt * dt >= SERIES_BELOW:
        return None
    m = scene.models[plan.name]
    mt, C = m.model_tensors_flat(q.dtype)
    plan.advance.build = plan.call.build
    state = [q, v, _dt_column(plan, q, dt)]
    try:
        if torch.is_grad_enabled() and (q.requires_grad or v.requires_grad or _requires_grad(plan, mt)):
            out = kernels.call_native_with(plan.advance, state, mt, C)
        else:
            out = plan.advance.value(state, C)
    except NativeUnavailable:
        return None
    return out[:, :m.nq], out[:, m.nq:]


def _dt_column(plan: GroundPlan, q: Tensor, dt: float) -> Tensor:
    key = (q.shape[0], dt, q.dtype)
    col = plan.dt_col.get(key)
    if col is None:
        if len(plan.dt_col) > 16:
            plan.dt_col.clear()
        col = plan.dt_col[key] = q.new_full((q.shape[0], 1), dt)
    return col


def _requires_grad(plan: GroundPlan, mt) -> bool:
    """Whether one of the robot's model tensors requires grad (remembered while they are the same
    tensors: the robot derives new ones when its parameters change)."""
    if plan.mt[0] is not mt:
        plan.mt = (mt, any(t.requires_grad for t in mt))
    return plan.mt[1]


def has_limits(plan: GroundPlan, lo: Tensor, hi: Tensor) -> bool:
    """Whether a joint of the robot has a finite position limit (remembered per limit tensors and versions)."""
    seen = plan.limits[0]
    if seen is None or seen[0] is not lo or seen[1] != lo._version or seen[2] is not hi or seen[3] != hi._version:
        plan.limits = ((lo, lo._version, hi, hi._version), bool(torch.isfinite(lo).any() or torch.isfinite(hi).any()))
    return plan.limits[1]


def ground_stage(scene: Scene, plan: GroundPlan, q: Tensor, v: Tensor, tau: Tensor, dt: float) -> Stage | None:
    """``(v_free (B, nv), L (B, nv, nv), phi (B, nb), rows (B, nb, 3, nv))`` of the robot at ``q, v, tau
    (B, .)`` (see :func:`~diffmech.dynamics.lanes.ground_step_lanes`), differentiable w.r.t. the
    state, the drives, the sizes and the robot's learnable parameters; ``None`` where a kernel it
    needs is not built (the torch code then runs).

    Where no model tensor requires grad the values come without a graph (``by_hand``): the step's
    :func:`ground_velocity_update` then differentiates this stage and the contact problem together in
    one node, by the kernel's reverse mode and :func:`~diffmech.contact.impulses.update_vjp`."""
    m = scene.models[plan.name]
    B, dtype = q.shape[0], q.dtype
    state = [q, v, tau]
    if plan.n_drives:
        state.append(torch.cat(scene.drives[plan.name]).to(dtype).expand(B, -1))
    balls = plan.balls if plan.balls is not None and not scene.shape_sizes else _balls(scene, plan, dtype)
    state += [balls.expand(B, -1), _dt_column(plan, q, dt)]
    mt, C = m.model_tensors_flat(dtype)
    nv, nb = m.nv, len(plan.links)
    if not _requires_grad(plan, mt):
        state = [kernels._prep(x, dtype) if not x.requires_grad else x for x in state]
        return Stage(*_split(plan.call.value(state, C), nv, nb), state, C, True)
    try:
        out = kernels.call_native_with(plan.call, state, mt, C)
    except NativeUnavailable:
        return None
    return Stage(*_split(out, nv, nb), state, C, False)


def with_graph(scene: Scene, plan: GroundPlan, stage: Stage) -> Stage:
    """A ``by_hand`` stage again, its outputs differentiable (the kernel's node): for a step that keeps no
    ball, whose velocity update is not :func:`ground_velocity_update`'s. The same kernel call: the same
    values, bit for bit."""
    if not stage.by_hand or not torch.is_grad_enabled() or not any(x.requires_grad for x in stage.state):
        return stage
    m = scene.models[plan.name]
    mt, C = m.model_tensors_flat(stage.C.dtype)
    out = kernels.call_native_with(plan.call, stage.state, mt, C)
    return Stage(*_split(out, m.nv, len(plan.links)), stage.state, C, False)


def _apply(solve, consts: tuple, J: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, mu: Tensor, e: Tensor, L: Tensor):
    """``(v+, solver result, (c, W, vn, bounce, scale), u)`` of the contact problem with one block ``L (B, nv,
    nv)``, no graph: assembled in C where it can be (:mod:`diffmech.contact.update_native`), else by the
    torch code. A step and its replay take the same route: the same values, bit for bit."""
    dt, baumgarte, bounce_speed, _ = consts
    if update_native.available(J):
        A, c, W, vn, bounce, scale = update_native.assemble_native(J, L, v, v_free, phi, e, dt, baumgarte,
                                                                   bounce_speed)
        res = solve(A, c, mu)
        u, v1 = update_native.apply_native(W, res.lam, v_free)
        return v1, res, (c, W, vn, bounce, scale), u
    v1, res, p, u = solve_and_apply(solve, consts, J, v, v_free, phi, mu, e, [L[:, None]])
    return v1, res, (p.c, p.W, p.vn, p.bounce, p.scale), u


class _GroundVelocity(torch.autograd.Function):
    """:func:`~diffmech.contact.impulses.velocity_update` of a :class:`Stage` computed without a graph,
    differentiated back to the kernel's inputs: the update's reverse pass gives the cotangents of the
    stage's outputs, one call of the kernel's reverse mode those of its inputs."""

    @staticmethod
    def forward(ctx, plan, C, sel, consts, solve, out, J, L, v_free, phi, mu, e, *state):
        v = state[1]
        v1, res, (c, W, vn, bounce, scale), u = _apply(solve, consts, J, v, v_free, phi, mu, e, L)
        out["result"] = res
        ctx.plan, ctx.C, ctx.sel, ctx.consts = plan, C, sel, consts
        ctx.save_for_backward(J, v_free, phi, mu, e, res.lam, u, c, W, vn, bounce, scale, L, *state)
        return v1

    @staticmethod
    @once_differentiable
    def backward(ctx, g):
        J, v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, L, *state = ctx.saved_tensors
        need = ctx.needs_input_grad
        if update_native.available(J):
            g_J, g_v, g_vf, g_phi, g_mu, g_e, g_L = update_native.backward_native(
                g, J, state[1], v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, L, ctx.consts[0], implicit_vjp)
            g_mu = (torch.zeros_like(mu) if g_mu is None else g_mu) if need[10] else None
            g_e = g_e if need[11] else None
        else:
            g_J, g_v, g_vf, g_phi, g_mu, g_e, g_L = update_vjp(
                ctx.consts, (J, state[1], v_free, phi, mu, e, lam, u, c, W, vn, bounce, scale, L[:, None]), g,
                (True, True, True, True, need[10], need[11], True))
            g_L = g_L[:, 0]
        B, nv = v_free.shape
        nb, k = len(ctx.plan.links), len(ctx.sel)
        g_rows = g_J.new_zeros(B, nb, 3, nv)
        g_rows[:, ctx.sel] = g_J.view(B, -1, 3, nv)[:, :k]
        g_gap = g_J.new_zeros(B, nb)
        g_gap[:, ctx.sel] = g_phi[:, :k]
        g_out = torch.cat([g_vf, g_L.reshape(B, -1), g_gap, g_rows.reshape(B, -1)], 1)
        grads, _ = ctx.plan.call.pullback(state, ctx.C, g_out, (), [])
        grads[1] = grads[1] + g_v
        # phi: its first k entries are the kernel's gaps (reached through g_out), the rest the joint
        # limits' (their graph, if any, is the caller's)
        g_phi_in = torch.cat([torch.zeros_like(g_phi[:, :k]), g_phi[:, k:]], 1) if need[9] else None
        return (None, None, None, None, None, None, None, None, None, g_phi_in, g_mu, g_e,
                *[gi.to(x.dtype) if nd else None for gi, x, nd in zip(grads, state, need[12:])])


def ground_velocity_update(stage: Stage, plan: GroundPlan, sel: Tensor):
    """The ``velocity_update`` of :func:`diffmech.sim.contact_step._finish` for a :class:`Stage` without a
    graph (``by_hand``): the same computation, one autograd node for the stage and the update."""
    def update(J, v, v_free, phi, mu, e, blocks, solve, *, dt, baumgarte, bounce_speed):
        consts = (dt, baumgarte, bounce_speed, tuple(blocks.starts))
        if not torch.is_grad_enabled() or not any(x.requires_grad for x in (phi, mu, e, *stage.state)):
            with torch.no_grad():
                v1, res, _, _ = _apply(solve, consts, J, v, v_free, phi, mu, e, stage.L)
            return v1, res
        out: dict = {}
        v1 = _GroundVelocity.apply(plan, stage.C, sel, consts, solve, out, J, stage.L, v_free, phi, mu, e,
                                   *stage.state)
        return v1, out["result"]
    return update


def coefficients(scene: Scene, plan: GroundPlan, sel: Tensor, balls: list[int], B: int, like: Tensor
                 ) -> tuple[Tensor, Tensor]:
    """Friction and restitution ``(B, k)`` of the balls ``balls`` (``sel`` their index tensor), as the
    scene gives them now (a user may set ``scene.friction`` between rollouts)."""
    if not scene.pairs and not scene.link_coefficients.get(plan.name):  # the scene's two values for every ball
        coef = [(scene.friction, scene.restitution)] * len(plan.shapes)
    else:
        coef = [scene.coefficients(plan.name, GROUND, link, None) for link, _, _, _ in plan.shapes]
    if len(coef) != len(plan.coef) or any(x is not y for c, d in zip(coef, plan.coef) for x, y in zip(c, d)):
        plan.coef = coef
        plan.coef_const = None
        plan.coef_sel = {}
        if not any(isinstance(x, Tensor) for c in coef for x in c):
            plan.coef_const = torch.tensor(coef, dtype=like.dtype).t().contiguous()
    if plan.coef_const is not None:
        key = tuple(balls)
        c = plan.coef_sel.get(key)
        if c is None:
            if len(plan.coef_sel) >= 1024:  # as GroundPlan.sel
                plan.coef_sel.clear()
            c = plan.coef_sel[key] = plan.coef_const[:, sel]
        return c[0].expand(B, -1), c[1].expand(B, -1)
    out = []
    for j in (0, 1):
        vals = [coef[b][j] for b in balls]
        out.append(torch.stack([torch.as_tensor(x, dtype=like.dtype) for x in vals]).expand(B, -1))
    return out[0], out[1]


def prepare_ground_kernels(scene: Scene, dtypes=(torch.float64,), parameters: bool = False) -> bool:
    """Build (or find stored) the native kernels of the scene's contact step (this stage's, with its
    reverse mode, and the robot's position update), so that :func:`~diffmech.sim.rollout` of the scene
    runs them; ``parameters``: also the reverse mode for the robot's inertial parameters. Returns
    whether the scene is one this stage serves (one robot, spheres, capsules, boxes and cylinders on the
    ground, the PGS solver). Raises :class:`~diffmech.dynamics.kernels.NativeUnavailable` without a C compiler."""
    served = False
    for dtype in dtypes:
        plan = _plan(scene, dtype)
        if plan is None:
            continue
        served = True
        plan.call.build = True
        plan.call.kernel(dtype)
        plan.call.kernel(dtype, True, ())
        if parameters:
            wanted = [f in ("body_mass", "body_h", "body_I") for f in kernels.FIELDS]
            plan.call.kernel(dtype, True, plan.call.fields_read(wanted))
    if served:
        m = scene.models[scene.names[0]]
        kernels.prepare(m, algorithms=("advance",), dtypes=tuple(dtypes))
    return served
