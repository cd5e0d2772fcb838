"""Rollouts of a :class:`~diffmech.sim.Scene` (contact), with a checkpointed backward pass.

``adjoint="checkpoint"`` stores the states ``(q_k, v_k)`` only; the backward pass walks the steps in
reverse, recomputes step ``k`` under autograd from the stored state and back-propagates the
adjoint through it (the contact impulses differentiated implicitly at the solver's solution), so
memory is ``steps x state`` (plus each step's warm-start impulses, ``steps x contacts x 3``) and
one step's graph. The solver of each step starts from the previous step's impulses.
With ``checkpoint_every=k > 1`` only every ``k``-th state and its warm start are kept; the backward
pass first recomputes the ``k`` states of a segment without a graph (one extra forward step per
step) from its checkpoint, then walks them in reverse: memory ``(steps / k + k) x state``, so with
``k`` about ``sqrt(steps)``, or ``steps / c`` for a fixed number ``c`` of checkpoints, it grows
sublinearly (or not at all) with the horizon. The recomputed states are the forward pass's bit for
bit (same warm starts, same operations), so the gradient does not depend on ``k``.
``adjoint="autograd"`` keeps the graph of the whole loop.

A scene of one robot whose shapes are spheres, capsules, boxes and cylinders on the ground, rolled out under a torque
sequence with the checkpointed adjoint once its native kernels are built, takes each step and each
step's reverse without autograd (:mod:`diffmech.sim._ground_rollout`: one C call each): the same
trajectory and gradient as the steps below, several times faster for one robot.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .. import _log
from .._progress import Stage
from ..dynamics import threads
from ..dynamics._jacobian import JACOBIAN_MAX_BATCH, one_thread
from ..errors import ShapeError, SimulationError
from ._guards import check_initial_state, check_tensor_controls
from .contact_step import contact_step
from .route import rollout_route, warn_unconverged
from .scene import Scene, warn_initial_penetration

# The checkpointed adjoint's default memory: the warm starts kept for the backward pass (the states
# are the returned trajectory) stay under this many bytes; beyond it every other checkpoint is dropped
# (the spacing doubles), so the memory is flat in the horizon and the backward pass recomputes at most
# one forward step per step.
CHECKPOINT_BUDGET = 8 << 20

__all__ = ["scene_rollout"]

log = _log.get("sim")


def _stage(what: str, scene: Scene, T: int, B: int, dt: float, route: str, progress: bool | None) -> Stage:
    """The progress of a pass over ``T`` steps (see :mod:`diffmech._progress`)."""
    sizes = f"{T} steps x batch {B} of a scene (nq {scene.nq}, nv {scene.nv}), dt {dt:g} s, route {route}"
    return Stage(log, what, T, sizes=sizes, progress=progress)


def _trainable(scene: Scene, policy, params: Sequence[Tensor]) -> list[Tensor]:
    out, seen = [], set()
    mods = [scene] + ([policy] if isinstance(policy, torch.nn.Module) else [])
    cands = [p for m in mods for p in m.parameters()] + scene.coefficient_tensors() + list(params)
    for p in cands:
        if isinstance(p, Tensor) and p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def _at_step(err: SimulationError, k: int, dt: float) -> SimulationError:
    """``err`` of a step, with the rollout's step and time in front."""
    msg = str(err).removeprefix("contact_step: ")
    if getattr(err, "argument", None) in ("q", "v") and k > 0:  # the previous step produced it
        return SimulationError(f"rollout: the state after step {k - 1} (t = {k * dt:.6g} s) is not finite "
                               f"({msg}); check that step's controls, or try a smaller dt")
    return SimulationError(f"rollout: at step {k} (t = {k * dt:.6g} s): {msg}")


def _check(k: int, q: Tensor, v: Tensor) -> None:
    if not (torch.isfinite(q).all() and torch.isfinite(v).all()):
        bad = (~(torch.isfinite(q).all(-1) & torch.isfinite(v).all(-1))).nonzero()[0, 0]
        raise SimulationError(f"scene rollout: the state became non-finite at step {k} (batch element {int(bad)}); "
                              "try a smaller dt")


class _Checkpointed(torch.autograd.Function):
    @staticmethod
    def forward(ctx, scene, ctrl, dt, T, K, stats, stepper, route, progress, q0, v0, tau, *params):
        Q = [q0.detach()]
        V = [v0.detach()]
        q, v = Q[0], V[0]
        ctx.thread_work = threads.work_of(q0, scene.nv)
        info_all = {"iterations": 0, "newton": 0, "residual": 0.0, "violation": 0.0, "penetration": 0.0,
                    "candidates": 0}
        fallbacks = unconverged = 0
        # the solver's warm start of step k (k a checkpoint), for the bit-for-bit recomputation
        warm: dict[int, dict] = {0: {}}
        prev: dict = {}
        auto = K is None  # the spacing doubles whenever the warm starts kept outgrow CHECKPOINT_BUDGET
        K, kept = (1 if auto else K), 0
        # stepper: the steps and their reverse in C (diffmech.sim._ground_rollout); else contact_step and its replay
        step = contact_step if stepper is None else stepper.step
        with torch.no_grad(), _stage("rollout", scene, T, q0.shape[0], dt, route, progress) as stage:
            for k in range(T):
                info: dict = {}
                try:
                    q, v = step(scene, q, v, ctrl(k, q, v, tau), dt, info, warm=prev)
                except SimulationError as err:
                    raise _at_step(err, k, dt) from None
                prev = info["lam"]
                if ((k + 1) % K == 0 and k + 1 < T) or k + 1 == T:  # the last: the final step's own impulses
                    warm[k + 1] = prev
                    kept += _nbytes(prev)
                    if auto and kept > CHECKPOINT_BUDGET and K < T:
                        K *= 2
                        warm = {j: w for j, w in warm.items() if j % K == 0 or j == k + 1 == T}
                        kept = sum(_nbytes(w) for w in warm.values())
                if k % 32 == 31 or k == T - 1:
                    _check(k, q, v)
                for key in ("iterations", "newton", "residual", "violation", "penetration", "candidates"):
                    info_all[key] = max(info_all[key], info.get(key, 0))
                fallbacks += info["fallbacks"]
                if info.get("unconverged"):
                    unconverged += info["unconverged"]
                    warn_unconverged(scene, info, f"rollout step {k}")
                Q.append(q)
                V.append(v)
                stage.update()
        Qs, Vs = torch.stack(Q, 1), torch.stack(V, 1)
        # with K == 1 the outputs are the stored states (no copy); otherwise keep the checkpoints
        Qc, Vc = (Qs, Vs) if K == 1 else (Qs[:, ::K].clone(), Vs[:, ::K].clone())
        if stats is not None:
            stats.update({f"contact_{k}_max": x for k, x in info_all.items()})
            stats["contact_fallbacks"] = fallbacks
            stats["contact_unconverged"] = unconverged
            stats["route"] = route
            stats["checkpoint_every"] = K
            stats["saved_state_bytes"] = (Qc.numel() + Vc.numel()) * Qc.element_size() + sum(
                t.numel() * t.element_size() for w in warm.values() for t in w.values())
        ctx.scene, ctx.ctrl, ctx.dt, ctx.T, ctx.K, ctx.warm, ctx.stats = scene, ctrl, dt, T, K, warm, stats
        ctx.stepper, ctx.step = stepper, step
        ctx.progress, ctx.route = progress, route
        ctx.has_tau = tau is not None
        ctx.save_for_backward(Qc, Vc, tau if tau is not None else torch.empty(0), *params)
        return Qs, Vs

    @staticmethod
    @threads.decided_backward
    def backward(ctx, gQ, gV):
        Qc, Vc, tau, *params = ctx.saved_tensors
        T, K = ctx.T, ctx.K
        aq, av = gQ[:, T].clone(), gV[:, T].clone()
        gtau = torch.zeros_like(tau) if ctx.has_tau and ctx.needs_input_grad[11] else None
        gp = [torch.zeros_like(p) for p in params]
        seg_bytes = 0
        if ctx.stepper is not None:
            ctx.stepper.reset()
        stage = _stage("rollout backward", ctx.scene, T, Qc.shape[0], ctx.dt, ctx.route, ctx.progress)
        with stage, one_thread() if Qc.shape[0] <= JACOBIAN_MAX_BATCH else contextlib.nullcontext():
            for s in range((T - 1) // K * K, -1, -K):
                e = min(s + K, T)
                seg = _segment(ctx, Qc[:, s // K], Vc[:, s // K], tau, s, e)
                if K > 1:
                    seg_bytes = max(seg_bytes, sum(x.numel() * x.element_size() for _, q, v, w in seg[1:]
                                                   for x in (q, v, *w.values())))
                # each step's own impulses: the next step's warm start, the last one's kept at the checkpoint
                seg = [(k, q, v, w, nxt) for (k, q, v, w), nxt in zip(seg, [x[3] for x in seg[1:]] + [ctx.warm[e]])]
                aq, av = _reverse(ctx, gQ, gV, seg, tau, params, aq, av, gtau, gp)
                stage.update(e - s)
        if ctx.stepper is not None:  # the scene's tensors: their cotangents summed over the steps, pulled back once
            for i, g in enumerate(ctx.stepper.parameter_grads(params)):
                if g is not None:
                    gp[i] = gp[i] + g
        if ctx.stats is not None:
            ctx.stats["backward_segment_bytes"] = seg_bytes
        return (None, None, None, None, None, None, None, None, None, aq, av, gtau, *gp)


class _ThreadsHeld:
    """The thread count of an autograd-adjoint rollout's backward pass: entered when the pass reaches
    the rollout's outputs, left when it reaches its inputs or, failing that, when the pass ends."""

    def __init__(self, work: int, batch: int):
        self.work, self.batch, self.stack, self.task = work, batch, None, -1
        _leave_stale()

    def enter(self) -> None:
        if self.stack is not None:
            return
        _leave_stale()
        self.stack = contextlib.ExitStack()
        if threads.policy() != "torch":
            self.stack.enter_context(threads.using(self.work))
        if self.batch <= JACOBIAN_MAX_BATCH:
            self.stack.enter_context(one_thread())
        self.task = torch._C._current_graph_task_id()
        _ENTERED.append(self)
        # the pass may never reach an input that leaves (none requires grad): leave when it ends
        torch.autograd.Variable._execution_engine.queue_callback(self.leave)

    def leave(self) -> None:
        if self.stack is not None:
            stack, self.stack = self.stack, None
            stack.close()
            if self in _ENTERED:
                _ENTERED.remove(self)


# the two engine hooks the hold needs (private torch API, present in torch 2.x): without them no hold
_CAN_HOLD = (hasattr(torch._C, "_current_graph_task_id")
             and hasattr(getattr(torch.autograd.Variable, "_execution_engine", None), "queue_callback"))

# entered and not yet left; a pass that raised runs no callback, and torch keeps its graph: such a hold
# is left by the next autograd-adjoint rollout or backward pass through one
_ENTERED: list[_ThreadsHeld] = []


def _leave_stale() -> None:
    now = torch._C._current_graph_task_id()
    for held in [h for h in _ENTERED if h.task != now]:
        held.leave()


class _EnterThreads(torch.autograd.Function):
    """Identity on the rollout's outputs; its backward sets the thread count of the rest of the pass."""

    @staticmethod
    def forward(ctx, held, Q, V):
        ctx.held = held
        return Q.clone(), V.clone()  # not views: the caller may write into the trajectory

    @staticmethod
    def backward(ctx, gQ, gV):
        ctx.held.enter()
        return None, gQ, gV


class _LeaveThreads(torch.autograd.Function):
    """Identity on a rollout input; its backward gives torch's thread count back (the graph above the
    rollout, a policy network's say, runs under the caller's setting)."""

    @staticmethod
    def forward(ctx, held, x):
        ctx.held = held
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        ctx.held.leave()
        return None, g


def _nbytes(warm) -> int:
    """Bytes of the tensors of a step's warm start (a dict of impulses or the stepper's ``Contacts``)."""
    return sum(t.numel() * t.element_size() for t in warm.values())


def _segment(ctx, q: Tensor, v: Tensor, tau: Tensor, s: int, e: int) -> list[tuple[int, Tensor, Tensor, dict]]:
    """Steps ``s .. e-1`` as ``(k, q_k, v_k, warm start of step k)``, recomputed without a graph
    from the checkpoint ``(q_s, v_s)`` exactly as the forward pass computed them."""
    out = [(s, q, v, ctx.warm[s])]
    tau = tau if ctx.has_tau else None
    with torch.no_grad():
        for k in range(s, e - 1):
            info: dict = {}
            q, v = ctx.step(ctx.scene, q, v, ctx.ctrl(k, q, v, tau), ctx.dt, info, warm=out[-1][3])
            out.append((k + 1, q, v, info["lam"]))
    return out


def _reverse(ctx, gQ, gV, seg, tau, params, aq, av, gtau, gp):
    """Walk a segment's steps backwards: recompute each under autograd, pull the adjoint through it;
    returns the adjoint at the segment's first state and accumulates into ``gtau`` and ``gp``."""
    scene, ctrl, dt = ctx.scene, ctx.ctrl, ctx.dt
    for k, qk, vk, warm, lam in reversed(seg):
        if ctx.stepper is not None:
            if ctx.has_tau:
                gq, gv, gt, finite = ctx.stepper.vjp(qk, vk, tau[:, k], lam, aq, av)
            else:  # a policy: the step's reverse in C, then the policy's graph by autograd
                with torch.enable_grad():
                    q = qk.detach().requires_grad_()
                    v = vk.detach().requires_grad_()
                    u = ctrl(k, q, v, None)
                gq, gv, gt, finite = ctx.stepper.vjp(qk, vk, u.detach(), lam, aq, av)
                if finite and u.requires_grad:
                    gs = torch.autograd.grad(u, [q, v, *params], gt.to(u.dtype), allow_unused=True)
                    gq = gq + gs[0] if gs[0] is not None else gq
                    gv = gv + gs[1] if gs[1] is not None else gv
                    for i, g in enumerate(gs[2:]):
                        if g is not None:
                            gp[i] = gp[i] + g
            if not finite:
                raise SimulationError(f"scene rollout backward: non-finite gradient at step {k}")
            aq, av = gQ[:, k] + gq, gV[:, k] + gv
            if gtau is not None:
                gtau[:, k] = gt
            continue
        with torch.enable_grad():
            q = qk.detach().requires_grad_()
            v = vk.detach().requires_grad_()
            tk = tau[:, k].detach().requires_grad_() if ctx.has_tau else None
            u = tk if tk is not None else ctrl(k, q, v, None)
            # the forward step's contact set and impulses (or, for the smooth solver, its warm start): the
            # recomputed step is the forward step, bit for bit
            q1, v1 = contact_step(scene, q, v, u, dt, warm=warm, replay=lam)
            ins = [q, v] + ([tk] if tk is not None else []) + list(params)
            gs = torch.autograd.grad((q1, v1), ins, (aq, av), allow_unused=True)
        present = [g for g in gs if g is not None]
        if present and not bool(torch.stack([torch.isfinite(g).all() for g in present]).all()):  # one sync
            raise SimulationError(f"scene rollout backward: non-finite gradient at step {k}")
        aq = gQ[:, k] + (gs[0] if gs[0] is not None else 0)
        av = gV[:, k] + (gs[1] if gs[1] is not None else 0)
        off = 2
        if tk is not None:
            if gtau is not None and gs[2] is not None:
                gtau[:, k] = gs[2]
            off = 3
        for i, g in enumerate(gs[off:]):
            if g is not None:
                gp[i] = gp[i] + g
    return aq, av


def _probe(policy, q0: Tensor, v0: Tensor, batch, scene: Scene, ps: list[Tensor]) -> None:
    """Refuse a policy whose output depends on tensors the checkpointed backward cannot see."""
    with torch.enable_grad():
        u = policy(0.0, q0.detach().reshape(*batch, scene.nq), v0.detach().reshape(*batch, scene.nv))
    if not isinstance(u, Tensor) or u.shape[-1] != scene.nv:
        raise ShapeError(f"rollout: the policy must return (..., {scene.nv}) joint forces, got "
                         f"{getattr(u, 'shape', type(u))}")
    if u.requires_grad and ps:
        used = torch.autograd.grad(u.sum(), ps, allow_unused=True)
        if all(g is None for g in used):
            ps = []
    if u.requires_grad and not ps:
        raise SimulationError("rollout: the policy's output depends on tensors that require grad but are neither "
                              "an nn.Module policy's parameters nor listed in params=: pass them in params=")


def _batch_of(*named, tau_shape=None) -> torch.Size:
    try:
        return torch.broadcast_shapes(*(shape for _, shape in named))
    except RuntimeError:
        desc = ", ".join(f"{n} {tuple(shape)}" for n, shape in named)
        hint = f" (tau is (..., T, nv) with the batch dims first; got {tau_shape})" if tau_shape else ""
        raise ShapeError(f"rollout: the batch dims do not broadcast: {desc}{hint}") from None


def scene_rollout(
    scene: Scene,
    q0: Tensor,
    v0: Tensor,
    tau: Tensor | Callable,
    dt: float,
    *,
    adjoint: str = "checkpoint",
    checkpoint_every: int | None = None,
    steps: int | None = None,
    params: Sequence[Tensor] | None = None,
    progress: bool | None = None,
    stats: dict | None = None,
) -> tuple[Tensor, Tensor]:
    """Simulate a scene; shapes and meaning as :func:`diffmech.sim.rollout` (``q0 (..., nq)``,
    ``v0 (..., nv)``, ``tau (..., T, nv)`` or a policy ``f(t, q, v)``; returns ``(..., T+1, nq)``
    and ``(..., T+1, nv)``).

    ``checkpoint_every``: ``None`` (default) picks the spacing: every state's warm start is kept
    while they take at most :data:`CHECKPOINT_BUDGET` bytes, then the spacing doubles as often as
    needed, so the memory the backward pass keeps is flat in the horizon; an integer fixes it.

    ``stats`` receives ``route`` (the implementation that ran, see :mod:`diffmech.sim.route`:
    ``"native"`` or ``"torch: <why>"``), ``contact_iterations_max`` (sweeps),
    ``contact_newton_max`` (Newton iterations after them), ``contact_residual_max`` (the contact
    conditions' residual relative to the impulses, largest over the steps),
    ``contact_violation_max`` (m/s: the largest velocity error of a contact condition),
    ``contact_unconverged`` (steps x environments whose solve stopped short of the tolerance; warned
    once per scene), ``contact_penetration_max`` (m), ``contact_candidates_max``,
    ``contact_fallbacks`` (steps x environments where the smooth solver's relaxed problem had no root
    found and the hard solution stood in, see :func:`~diffmech.sim.contact_step`) and, with the
    checkpointed adjoint, ``checkpoint_every`` (the spacing used) and ``saved_state_bytes`` (states
    and warm-start impulses kept for the backward pass: every ``checkpoint_every``-th; with 1 the
    returned trajectory itself); after the backward pass, ``backward_segment_bytes``: the largest
    segment of states recomputed at once (0 with 1)."""
    if adjoint not in ("checkpoint", "autograd"):
        from ..errors import OptionError

        raise OptionError(f"rollout: unknown adjoint {adjoint!r}; choose from ('checkpoint', 'autograd')")
    if checkpoint_every is not None and (not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool)
                                         or checkpoint_every < 1):
        raise ShapeError(f"rollout: checkpoint_every must be None or an integer >= 1, got {checkpoint_every!r}")
    if not isinstance(dt, (int, float)) or isinstance(dt, bool) or not (math.isfinite(dt) and dt > 0):
        raise ShapeError(f"rollout: dt must be a positive finite number of seconds, got {dt!r}")
    dt = float(dt)
    if q0.shape[-1] != scene.nq or v0.shape[-1] != scene.nv:
        raise ShapeError(f"rollout: the scene has nq={scene.nq}, nv={scene.nv}; got q0 {tuple(q0.shape)}, "
                         f"v0 {tuple(v0.shape)}")
    batch = _batch_of(("q0", q0.shape[:-1]), ("v0", v0.shape[:-1]))
    policy = tau if callable(tau) and not isinstance(tau, Tensor) else None
    if policy is None:
        if tau.dim() < 2 or tau.shape[-1] != scene.nv:
            raise ShapeError(f"rollout: tau must be (..., T, {scene.nv}), got {tuple(tau.shape)}")
        if steps is not None and steps != tau.shape[-2]:
            raise ShapeError(f"rollout: steps={steps} but tau has {tau.shape[-2]} steps")
        T = tau.shape[-2]
        batch = _batch_of(("q0 and v0", batch), ("tau", tau.shape[:-2]), tau_shape=tuple(tau.shape))
    else:
        if steps is None:
            raise ShapeError("rollout: a policy needs steps=")
        T = int(steps)
    B = int(torch.Size(batch).numel())
    q0f = q0.expand(*batch, scene.nq).reshape(B, scene.nq)
    v0f = v0.expand(*batch, scene.nv).reshape(B, scene.nv)
    tauf = None
    parts = [(n, scene.models[n], scene.slices[n].start, scene.vslices[n].start) for n in scene.names]
    if policy is None:
        tauf = tau.expand(*batch, T, scene.nv).reshape(B, T, scene.nv)
    with torch.no_grad():
        check_initial_state(batch, q0f, v0f, parts)
        check_tensor_controls(None, batch, dt, tauf, None, parts)
    if not scene.__dict__.get("_checked_start"):  # once per scene: a robot placed by guessing its height
        scene.__dict__["_checked_start"] = True
        warn_initial_penetration(scene, q0f)

    def ctrl(k, q, v, tau_all):
        if policy is None:
            return tau_all[:, k]
        u = policy(k * dt, q.reshape(*batch, scene.nq), v.reshape(*batch, scene.nv))
        return u.reshape(B, scene.nv)

    if adjoint == "autograd":
        _, route = rollout_route(scene, q0f, dt, adjoint)
        if stats is not None:
            stats["route"] = route
        # torch's engine runs this graph's backward pass, outside the thread decision every diffmech call and
        # the checkpointed backward make: on a busy machine its two-thread index_add (the index_select
        # backward of the kinematics, 2 ms a call against 8 us on one thread) made the pass ten times slower
        held = _ThreadsHeld(threads.work_of(q0f, scene.nv), B) if torch.is_grad_enabled() and _CAN_HOLD else None
        if held is not None:
            q0f, v0f = (_LeaveThreads.apply(held, x) if x.requires_grad else x for x in (q0f, v0f))
            if tauf is not None and tauf.requires_grad:
                tauf = _LeaveThreads.apply(held, tauf)
        q, v = q0f, v0f
        Q, V = [q], [v]
        warm: dict = {}
        stage = _stage("rollout (autograd)", scene, T, B, dt, route, progress)
        for k in range(T):
            info: dict = {}
            try:
                q, v = contact_step(scene, q, v, ctrl(k, q, v, tauf), dt, info, warm=warm)
            except SimulationError as err:
                raise _at_step(err, k, dt) from None
            warm = info["lam"]
            if k % 32 == 31 or k == T - 1:
                _check(k, q, v)
            Q.append(q)
            V.append(v)
            stage.update()
        stage.close()
        Qs, Vs = torch.stack(Q, 1), torch.stack(V, 1)
        if held is not None and (Qs.requires_grad or Vs.requires_grad):
            Qs, Vs = _EnterThreads.apply(held, Qs, Vs)
    else:
        ps = _trainable(scene, policy, params or [])
        if policy is not None and torch.is_grad_enabled():  # no backward pass without grad mode: nothing to refuse
            _probe(policy, q0f, v0f, batch, scene, ps)
        stepper, route = rollout_route(scene, q0f, dt, adjoint)
        K = None if checkpoint_every is None else min(checkpoint_every, max(T, 1))
        Qs, Vs = _Checkpointed.apply(scene, ctrl, dt, T, K, stats, stepper, route, progress, q0f, v0f, tauf, *ps)
    return Qs.reshape(*batch, T + 1, scene.nq), Vs.reshape(*batch, T + 1, scene.nv)
