"""Differentiable rollouts whose backward pass recomputes each step from its stored state.

``q, v = rollout(robot, q0, v0, tau, dt)`` integrates ``T`` fixed steps and returns the whole
trajectory. With ``adjoint="checkpoint"`` (default) the forward pass runs without a graph and
keeps only the states; the backward pass walks the steps in reverse, rebuilds one step's graph
from its stored state, and propagates the adjoint (the cotangent of the state) through it:

    ``lam_k = (d x_{k+1} / d x_k)^T lam_{k+1} + dL/dx_k``,  ``dL/dtheta += (d x_{k+1} / d theta)^T lam_{k+1}``.

Memory therefore grows with ``steps x state size`` instead of with the graph of every step.
The forward-dynamics values of the explicit integrators (one per stage) are kept too, so a
rebuilt step does not run ABA again: its backward is one mass-matrix LU solve and one RNEA
VJP per stage (the implicit-function-theorem gradient of
:func:`diffmech.dynamics.aba.forward_dynamics`). The variational integrator restarts its Newton
solve from the stored next state and differentiates it through :mod:`diffmech.implicit`.
``adjoint="autograd"`` backpropagates through the whole loop (the baseline).

The Euler integrators reverse a step by hand when only the state, the controls and the initial
state need cotangents (no policy, no ``f_ext``, no learnable parameter): no graph is rebuilt
(``step_vjp_flat`` of the Euler integrators, see :class:`~diffmech.sim.integrators.Integrator`). With few rows per step
(``batch x (nq + nv)`` up to :data:`TIME_BATCHED_MAX_ROWS`), where a sequential step costs mostly
per-operation overhead, the recursion is split instead: the step Jacobians depend only on the
stored states, so those of many steps come from one large batched VJP call, and only one small
matrix product per step stays sequential.
"""

from __future__ import annotations

import functools
import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from ..dynamics._common import RigidInertia, TreeState, tree_state, world_inertia
from ..dynamics.aba import _lu_apply, forward_dynamics_flat
from ..dynamics.compiled import CompiledDynamics, compiled
from ..dynamics.crba import crba_flat
from ..dynamics.rnea import rnea_flat
from ..dynamics.rnea_vjp import rnea_state_vjp, rnea_vjp_bl
from ..errors import OptionError, ShapeError, SimulationError
from ..robot import RobotModel
from .compiled_step import CompiledStep
from .integrators import Integrator, get_integrator

__all__ = ["rollout", "ADJOINTS"]

ADJOINTS = ("checkpoint", "autograd")

# States are checked for non-finite values once per this many steps (one host sync per chunk, not
# per step); the failing step is then located exactly.
_CHECK_EVERY = 32


@dataclass
class _Config:
    robot: RobotModel
    integ: Integrator
    dt: float
    steps: int
    passive: bool
    batch: tuple[int, ...]
    policy: Callable | None
    checkpoint_every: int
    progress: bool
    stats: dict | None
    record: bool = False  # keep the forward-dynamics values for the backward pass
    dyn: CompiledDynamics | None = None  # compiled forward dynamics (``compile=True``)
    mt: tuple = ()  # the model tensors the compiled dynamics read in the forward pass
    cstep: CompiledStep | None = None  # compiled step and step VJP (compile=True, tensor controls)
    extras: dict = field(default_factory=dict)

    @property
    def B(self) -> int:
        return math.prod(self.batch)


def _control(cfg: _Config, tau: Tensor | None, k: int, q: Tensor, v: Tensor) -> Tensor:
    if cfg.policy is None:
        return tau[:, k]
    robot = cfg.robot
    u = cfg.policy(k * cfg.dt, q.reshape(*cfg.batch, robot.nq), v.reshape(*cfg.batch, robot.nv))
    if not isinstance(u, Tensor):
        raise ShapeError(f"rollout: the policy returned {type(u).__name__} at step {k}; expected a tensor (..., nv)")
    try:
        return u.expand(*cfg.batch, robot.nv).reshape(cfg.B, robot.nv)
    except RuntimeError:
        raise ShapeError(
            f"rollout: the policy returned shape {tuple(u.shape)} at step {k}; expected (..., {robot.nv}) "
            f"broadcastable to the batch {cfg.batch}"
        ) from None


def _steps_iter(cfg: _Config, start: int, stop: int, desc: str):
    if not cfg.progress:
        return range(start, stop)
    from tqdm.auto import tqdm

    return tqdm(range(start, stop), desc=desc, total=stop - start, leave=False)


def _check_finite(cfg: _Config, qs: Tensor, vs: Tensor, first_state: int) -> None:
    """Raise :class:`SimulationError` if states ``qs, vs (B, n_states, n)`` hold a non-finite value."""
    ok = torch.isfinite(qs).all(-1) & torch.isfinite(vs).all(-1)  # (B, n_states)
    if bool(ok.all()):
        return
    bad_state = (~ok).any(0).nonzero()[0, 0].item()
    bad_b = (~ok[:, bad_state]).nonzero()[0, 0].item()
    state = first_state + int(bad_state)
    elem = tuple(int(i) for i in torch.unravel_index(torch.tensor(bad_b), cfg.batch)) if cfg.batch else ()
    where = f"batch element {elem}" if cfg.batch else "the state"
    n_bad = int((~ok[:, bad_state]).sum())
    if state == 0:
        raise SimulationError(f"rollout: the initial state (q0, v0) is not finite in {where}")
    raise SimulationError(
        f"rollout: non-finite state at step {state - 1} (state {state}, t = {state * cfg.dt:.6g} s) in {where} "
        f"({n_bad} of {cfg.B} batch elements affected); the step is too large for the dynamics, the controls "
        "are not finite or the model is degenerate"
    )


def _dynamics_vjp(robot: RobotModel, passive: bool, q: Tensor, v: Tensor, qdd: Tensor, g: Tensor
                  ) -> tuple[Tensor, Tensor, Tensor]:
    """VJP of forward dynamics at a known ``qdd``, by hand (no graph; no ``f_ext``, no parameter):
    ``lam = M^{-1} g`` is the cotangent of ``tau``, and ``q``, ``v`` get the RNEA VJP with ``-lam``.
    One kinematic pass serves the mass matrix and the VJP. Returns ``(qbar (B, nq), vbar, lam)``."""
    tree, mt = robot.tree, robot.model_tensors(q.dtype, q.device)
    ts = tree_state(tree, mt, q)
    inertia = world_inertia(ts)
    # LU without error checks (as forward dynamics): a mass matrix is never singular.
    LU, piv, _ = torch.linalg.lu_factor_ex(crba_flat(tree, mt, q, ts, inertia))
    lam = _lu_apply(LU, piv, g)
    gq, gv, _ = rnea_state_vjp(tree, q, v, qdd, -lam, passive, ts, inertia)
    return gq, gv, lam


class _ReplayedDynamics(torch.autograd.Function):
    """Forward dynamics whose value was recorded in the forward pass.

    Forward returns the recorded ``qdd``; backward is that of
    :func:`diffmech.dynamics.aba.forward_dynamics` (``lam = M^{-1} g`` is the cotangent of ``tau``;
    ``q``, ``v``, ``f_ext`` and the model parameters get the RNEA VJP with ``-lam`` at ``qdd``).
    A recomputed step thus costs no ABA, only the mass matrix, its LU factors and one RNEA VJP.
    """

    @staticmethod
    def forward(ctx, robot, passive, q, v, tau, f_ext, qdd, *params):
        ctx.robot, ctx.passive, ctx.params = robot, passive, params
        ctx.save_for_backward(q, v, qdd, f_ext)
        return qdd.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        q, v, qdd, f_ext = ctx.saved_tensors
        needs = ctx.needs_input_grad
        robot, params = ctx.robot, ctx.params
        q, v, qdd = q.detach(), v.detach(), qdd.detach()
        flags = [needs[2], needs[3], f_ext is not None and needs[5]]
        p_idx = [i for i in range(len(params)) if needs[7 + i]]
        hand = not p_idx and not flags[2] and f_ext is None and (flags[0] or flags[1])
        out: list[Tensor | None] = [None, None, None]
        g_p: list[Tensor | None] = [None] * len(params)
        if hand:
            # Cotangents of the state only: the hand-written RNEA VJP (no graph to record and replay).
            gq, gv, lam = _dynamics_vjp(robot, ctx.passive, q, v, qdd, g)
            return (None, None, gq if flags[0] else None, gv if flags[1] else None, lam if needs[4] else None,
                    None, None, *g_p)
        # LU without error checks (as forward dynamics): a mass matrix is never singular.
        tree = robot.tree
        LU, piv, _ = torch.linalg.lu_factor_ex(crba_flat(tree, robot.model_tensors(q.dtype, q.device), q))
        lam = _lu_apply(LU, piv, g)
        if any(flags) or p_idx:
            with torch.enable_grad():
                leaves = [t.detach().requires_grad_(f) if t is not None else None for t, f in zip((q, v, f_ext), flags)]
                tau_id = rnea_flat(tree, robot.model_tensors(q.dtype, q.device), leaves[0], leaves[1], qdd, leaves[2],
                                   ctx.passive)
                wanted = [leaves[i] for i in range(3) if flags[i]] + [params[i] for i in p_idx]
                got = torch.autograd.grad(tau_id, wanted, grad_outputs=-lam, allow_unused=True)
            j = 0
            for i in range(3):
                if flags[i]:
                    out[i] = got[j]
                    j += 1
            for i in p_idx:
                g_p[i] = got[j]
                j += 1
        return (None, None, out[0], out[1], lam if needs[4] else None, out[2], None, *g_p)


class _Tape:
    """Forward-dynamics values of consecutive steps: recorded going forward, replayed backward.

    ``A (n_steps, accel_calls, B, nv)``; :meth:`seek` selects a step, then each call serves the
    next evaluation of that step.
    """

    def __init__(self, cfg: _Config, A: Tensor, params: Sequence[Tensor] = (), mt: Sequence[Tensor] | None = None):
        self.robot, self.passive, self.A, self.params = cfg.robot, cfg.passive, A, tuple(params)
        self.dyn = cfg.dyn
        # Compiled dynamics read the model tensors (leaves of the backward pass), not the parameters.
        self.mt = tuple(mt) if mt is not None else cfg.mt
        self.k = 0
        self.s = 0

    def seek(self, k: int) -> _Tape:
        self.k, self.s = k, 0
        return self

    def record(self, q, v, tau, f_ext):
        if self.dyn is not None:
            a = self.dyn._evaluate((q, v, tau), self.mt)
        else:
            a = forward_dynamics_flat(self.robot.tree, self.robot.model_tensors(q.dtype, q.device), q, v, tau, f_ext,
                                      self.passive, "auto", True)
        self.A[self.k, self.s] = a
        self.s += 1
        return a

    def replay(self, q, v, tau, f_ext):
        a = self.A[self.k, self.s]
        self.s += 1
        if self.dyn is not None:
            return self.dyn._apply((q, v, tau), self.mt, value=a)
        return _ReplayedDynamics.apply(self.robot, self.passive, q, v, tau, f_ext, a, *self.params)


def _simulate(cfg: _Config, q0, v0, tau, f_ext, Q, V, start: int, stop: int, check: bool,
              tape: _Tape | None = None, offset: int = 0, show: bool = True) -> None:
    """Integrate steps ``start..stop-1`` without recording a graph, writing state ``k`` into
    ``Q, V[:, k - offset]``; with a ``tape``, keep each step's forward-dynamics values at
    ``tape.A[k - offset]``."""
    robot, integ, dt, passive = cfg.robot, cfg.integ, cfg.dt, cfg.passive
    q, v = q0, v0
    last = start
    implicit = integ.implicit
    accel = tape.record if tape is not None else _plain_accel(cfg)
    for k in _steps_iter(cfg, start, stop, "rollout") if show else range(start, stop):
        u = _control(cfg, tau, k, q, v)
        fe = None if f_ext is None else f_ext[:, k]
        if tape is not None:
            tape.seek(k - offset)
        if cfg.cstep is not None:
            q, v = cfg.cstep.step(q, v, u, cfg.mt)
        else:
            q, v = integ.step_flat(robot, q, v, u, dt, fe, passive, context=f"step {k}" if implicit else "",
                                   accel=accel)
        Q[:, k + 1 - offset] = q
        V[:, k + 1 - offset] = v
        if check and (k + 1 - last >= _CHECK_EVERY or k + 1 == stop):
            _check_finite(cfg, Q[:, last + 1 - offset:k + 2 - offset], V[:, last + 1 - offset:k + 2 - offset], last + 1)
            last = k + 1


def _plain_accel(cfg: _Config) -> Callable | None:
    """The forward dynamics of a rollout without a tape: the compiled function, or the default."""
    if cfg.dyn is None:
        return None
    dyn, mt = cfg.dyn, cfg.mt
    return lambda q, v, tau, f_ext: dyn._apply((q, v, tau), mt)


class _CheckpointRollout(torch.autograd.Function):
    """Rollout whose backward recomputes each step from the stored states (see module docstring)."""

    @staticmethod
    def forward(ctx, cfg: _Config, q0, v0, tau, f_ext, *params):
        t0 = time.perf_counter()
        robot, T, B = cfg.robot, cfg.steps, q0.shape[0]
        Q = q0.new_empty(B, T + 1, robot.nq)
        V = v0.new_empty(B, T + 1, robot.nv)
        Q[:, 0] = q0
        V[:, 0] = v0
        _check_finite(cfg, Q[:, :1], V[:, :1], 0)
        K = cfg.checkpoint_every
        S = cfg.integ.accel_calls
        tape = None
        if cfg.record and K == 1 and S and cfg.cstep is None:
            tape = _Tape(cfg, q0.new_empty(T, S, B, robot.nv))
        _simulate(cfg, q0, v0, tau, f_ext, Q, V, 0, T, check=True, tape=tape)
        ctx.accels = tape.A if tape is not None else None
        if K == 1:
            # The outputs are the stored states: saving them costs no copy.
            ctx.save_for_backward(Q, V, tau, f_ext)
        elif cfg.record:
            ctx.save_for_backward(Q[:, ::K].clone(), V[:, ::K].clone(), tau, f_ext)
        ctx.cfg = cfg
        ctx.params = params
        if cfg.stats is not None:
            saved = (T // K + 1) * B * (robot.nq + robot.nv) * q0.element_size()
            if tape is not None:
                saved += tape.A.numel() * tape.A.element_size()
            cfg.stats.update(forward_time=time.perf_counter() - t0, steps=T, checkpoint_every=K,
                             saved_state_bytes=saved)
        return Q, V

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gQ, gV):
        t0 = time.perf_counter()
        cfg = ctx.cfg
        Qs, Vs, tau, f_ext = ctx.saved_tensors
        params = ctx.params
        needs = ctx.needs_input_grad
        need_tau = tau is not None and needs[3]
        need_f = f_ext is not None and needs[4]
        p_idx = [i for i, p in enumerate(params) if needs[5 + i]]
        p_need = [params[i] for i in p_idx]
        robot, integ, dt, passive, T, K = cfg.robot, cfg.integ, cfg.dt, cfg.passive, cfg.steps, cfg.checkpoint_every
        B = Qs.shape[0]
        aq = gQ[:, T].clone()
        av = gV[:, T].clone()
        g_tau = torch.zeros_like(tau) if need_tau else None
        g_f = torch.zeros_like(f_ext) if need_f else None
        g_p: list[Tensor | None] = [None] * len(p_need)
        implicit = integ.implicit
        recomputed = 0
        S = integ.accel_calls
        model_params = [p for p in params if any(p is r for r in robot.parameters())]
        mt_leaves, mt_graph, mt_idx, g_mt = None, None, [], []
        if cfg.dyn is not None:
            # Compiled steps differentiate the model tensors; one VJP at the end maps their summed
            # cotangents to the parameters (the tensors do not depend on the state).
            with torch.enable_grad():
                mt_graph = tuple(robot.model_tensors(Qs.dtype, Qs.device))
            mt_idx = [i for i, t in enumerate(mt_graph) if t.requires_grad]
            mt_leaves = tuple(t.detach().requires_grad_(i in mt_idx) for i, t in enumerate(mt_graph))
            g_mt = [None] * len(mt_idx)
        bar = None
        if cfg.progress:
            from tqdm.auto import tqdm

            bar = tqdm(total=T, desc="rollout backward", leave=False)
        tape = _Tape(cfg, ctx.accels, model_params, mt_leaves) if ctx.accels is not None else None
        # Explicit Euler steps of a state-only gradient (tensor controls, no f_ext, no parameter)
        # reverse by hand: no graph is built per step (the integrators' step_vjp_flat).
        hand_ok = (integ.hand_vjp and cfg.policy is None and not p_need and not need_f
                   and f_ext is None and cfg.record)
        hand_step = hand_ok and cfg.cstep is None and cfg.dyn is None

        m = robot.nq + robot.nv  # rows of a step's Jacobian
        # Also with compile=True: few rows per step are where the compiled sequential VJP loses.
        time_batched = hand_ok and B * m <= TIME_BATCHED_MAX_ROWS

        def dynamics_vjp(q, v, qdd, g):
            return _dynamics_vjp(robot, passive, q, v, qdd, g)

        # Without checkpoint interval every state is stored: one segment (the time-batched reverse's
        # chunks are then as long as they like); otherwise one segment per checkpoint.
        seg = max(T, 1) if time_batched and K == 1 else K
        for s in reversed(range(0, T, seg)):
            e = min(s + seg, T)
            if K == 1:
                Qseg, Vseg, off = Qs, Vs, 0
            else:
                # Rebuild the states of this segment from its checkpoint (no graph), keeping the
                # forward-dynamics values for the reverse steps.
                Qseg = Qs.new_empty(B, e - s + 1, robot.nq)
                Vseg = Vs.new_empty(B, e - s + 1, robot.nv)
                Qseg[:, 0] = Qs[:, s // K]
                Vseg[:, 0] = Vs[:, s // K]
                tape = _Tape(cfg, Qs.new_empty(e - s, S, B, robot.nv), model_params, mt_leaves) if S else None
                with torch.no_grad():
                    _simulate(cfg, Qseg[:, 0], Vseg[:, 0], tau, f_ext, Qseg, Vseg, s, e, check=False, tape=tape,
                              offset=s, show=False)
                recomputed += e - s
                off = s
            if time_batched:
                # Compiled steps record no accelerations: the reverse recomputes them in batches.
                A = tape.A if tape is not None and cfg.cstep is None else None
                aq, av = _reverse_time_batched(cfg, integ, Qseg, Vseg, A, tau, off, s, e, aq, av, gQ, gV, g_tau, bar)
                continue
            for k in range(e - 1, s - 1, -1):
                if cfg.cstep is not None:
                    # One compiled call per reverse step: the VJP of the whole step.
                    got = cfg.cstep.vjp(Qseg[:, k - off], Vseg[:, k - off], tau[:, k], mt_leaves, aq, av,
                                        (True, True, need_tau, *[i in mt_idx for i in range(len(mt_leaves))]))
                    aq = got[0] + gQ[:, k]
                    av = got[1] + gV[:, k]
                    if need_tau:
                        g_tau[:, k] = got[2]
                    for j, i in enumerate(mt_idx):
                        g_mt[j] = got[3 + i] if g_mt[j] is None else g_mt[j] + got[3 + i]
                    if bar is not None:
                        bar.update(1)
                    continue
                if hand_step:
                    gq, gv, gu = integ.step_vjp_flat(robot, Qseg[:, k - off], Vseg[:, k - off], tape.A[k - off], dt,
                                                     aq, av, dynamics_vjp)
                    aq = gq + gQ[:, k]
                    av = gv + gV[:, k]
                    if need_tau:
                        g_tau[:, k] = gu
                    if bar is not None:
                        bar.update(1)
                    continue
                with torch.enable_grad():
                    qk = Qseg[:, k - off].detach().requires_grad_(True)
                    vk = Vseg[:, k - off].detach().requires_grad_(True)
                    if cfg.policy is None:
                        u = tau[:, k].detach().requires_grad_(need_tau)
                    else:
                        u = _control(cfg, None, k, qk, vk)
                    fe = None if f_ext is None else f_ext[:, k].detach().requires_grad_(need_f)
                    hint = Qseg[:, k + 1 - off] if implicit else None
                    accel = tape.seek(k - off).replay if tape is not None else None
                    q1, v1 = integ.step_flat(robot, qk, vk, u, dt, fe, passive,
                                             context=f"step {k} (backward)" if implicit else "", hint=hint, accel=accel)
                    inputs = [qk, vk]
                    if need_tau:
                        inputs.append(u)
                    if need_f:
                        inputs.append(fe)
                    inputs.extend(p_need)
                    inputs.extend(mt_leaves[i] for i in mt_idx)
                    grads = torch.autograd.grad((q1, v1), inputs, (aq, av), allow_unused=True)
                if mt_idx:
                    for i, gi in enumerate(grads[len(grads) - len(mt_idx):]):
                        if gi is not None:
                            g_mt[i] = gi if g_mt[i] is None else g_mt[i] + gi
                    grads = grads[: len(grads) - len(mt_idx)]
                aq = _or_zero(grads[0], qk) + gQ[:, k]
                av = _or_zero(grads[1], vk) + gV[:, k]
                j = 2
                if need_tau:
                    if grads[j] is not None:
                        g_tau[:, k] = grads[j]
                    j += 1
                if need_f:
                    if grads[j] is not None:
                        g_f[:, k] = grads[j]
                    j += 1
                for i, gi in enumerate(grads[j:]):
                    if gi is not None:
                        g_p[i] = gi if g_p[i] is None else g_p[i] + gi
                if bar is not None:
                    bar.update(1)
        if bar is not None:
            bar.close()
        used = [(mt_graph[i], gi) for i, gi in zip(mt_idx, g_mt) if gi is not None]
        if used and p_need:
            with torch.enable_grad():
                extra = torch.autograd.grad([t for t, _ in used], p_need, [gi for _, gi in used], allow_unused=True)
            for i, gi in enumerate(extra):
                if gi is not None:
                    g_p[i] = gi if g_p[i] is None else g_p[i] + gi
        out_p: list[Tensor | None] = [None] * len(params)
        for i, gi in zip(p_idx, g_p):
            out_p[i] = gi if gi is not None else torch.zeros_like(params[i])
        if cfg.stats is not None:
            cfg.stats.update(backward_time=time.perf_counter() - t0, recomputed_steps=recomputed)
        return (None, aq if needs[1] else None, av if needs[2] else None, g_tau, g_f, *out_p)


# The time-batched reverse (below) pays when a step's sequential VJP is dominated by per-operation
# overhead, i.e. while a step has few rows, batch x (nq + nv). Measured backward ms per step,
# sequential -> time-batched (2 threads, semi-implicit Euler, float64, 4 MiB chunks): iiwa x1 (14
# rows) 1.34 -> 0.17, x10 (140) 1.69 -> 1.22, x32 (448) 2.12 -> 4.37; laikago x1 (37) 2.39 -> 0.85,
# x4 (148) 2.79 -> 3.45.
TIME_BATCHED_MAX_ROWS = 100
# States per chunk of the time-batched reverse: its workspace (the RNEA VJP of nv unit cotangents
# per state) is about nv x n_bodies x 2 KiB per state; this bounds it to a few MiB.
_TIME_BATCHED_CHUNK_BYTES = 4 << 20


def _dynamics_jacobians(robot: RobotModel, passive: bool, q: Tensor, v: Tensor, qdd: Tensor
                        ) -> tuple[Tensor, Tensor]:
    """Per-state Jacobians of forward dynamics at known ``qdd``, for ``q (N, nq), v, qdd (N, nv)``.

    Returns ``Minv (N, nv, nv)`` (``d qdd / d tau``) and ``JR (N, nv, nq + nv)``, the Jacobian of
    RNEA w.r.t. ``(q, v)`` at fixed acceleration (``d qdd / d(q, v) = -Minv JR``), the latter from the
    hand-written RNEA VJP of the ``nv`` unit cotangents of every state in one batched call.
    """
    N, nq, nv = q.shape[0], robot.nq, robot.nv
    tree, mt = robot.tree, robot.model_tensors(q.dtype, q.device)
    ts = tree_state(tree, mt, q)
    inertia = world_inertia(ts)
    LU, piv, _ = torch.linalg.lu_factor_ex(crba_flat(tree, mt, q, ts, inertia))
    eye = torch.eye(nv, dtype=q.dtype, device=q.device)
    Minv = torch.linalg.lu_solve(LU, piv, eye.expand(N, nv, nv))
    # nv copies of every state, batch-last: row i * N + j is unit cotangent i at state j.
    rep = _repeat_last(nv)
    ts_r = TreeState(R=rep(ts.R), p=rep(ts.p), S=rep(ts.S), mt=ts.mt)
    in_r = RigidInertia(m=inertia.m, h=rep(inertia.h), I=rep(inertia.I),
                        full=None if inertia.full is None else rep(inertia.full))
    lam = eye.repeat_interleave(N, dim=1)  # (nv, nv * N)
    qbar, vbar, _, _ = rnea_vjp_bl(tree, ts_r, rep(q.T), rep(v.T), rep(qdd.T), lam, passive, in_r)
    JR = torch.cat([qbar, vbar]).reshape(nq + nv, nv, N).permute(2, 1, 0)
    return Minv, JR


def _repeat_last(k: int) -> Callable[[Tensor], Tensor]:
    return lambda t: t.repeat(*([1] * (t.dim() - 1)), k)


def _rows(t: Tensor, m: int) -> Tensor:
    """``t (N, ...)`` repeated as ``m`` consecutive blocks: ``(m * N, ...)``."""
    return t[None].expand(m, *t.shape).reshape(m * t.shape[0], *t.shape[1:])


def _vjp_from_jacobians(Minv: Tensor, JR: Tensor, q: Tensor, v: Tensor, qdd: Tensor, g: Tensor
                        ) -> tuple[Tensor, Tensor, Tensor]:
    """The forward-dynamics VJP of :func:`_dynamics_vjp` from per-state Jacobians ``Minv (N, nv, nv)``,
    ``JR (N, nv, nq + nv)``, for ``g (m * N, nv)``: block ``i`` of the rows at the ``N`` states."""
    N, nv = Minv.shape[0], Minv.shape[1]
    nq = JR.shape[-1] - nv
    lam = (Minv @ g.reshape(-1, N, nv, 1))[..., 0]
    out = -(lam[..., None, :] @ JR)[..., 0, :]
    return out[..., :nq].reshape(-1, nq), out[..., nq:].reshape(-1, nv), lam.reshape(-1, nv)


def _reverse_time_batched(cfg: _Config, integ: Integrator, Qseg: Tensor, Vseg: Tensor, A: Tensor | None,
                          tau: Tensor, off: int,
                          s: int, e: int, aq: Tensor, av: Tensor, gQ: Tensor, gV: Tensor, g_tau: Tensor | None,
                          bar) -> tuple[Tensor, Tensor]:
    """Reverse steps ``e-1 .. s`` of a hand-differentiable explicit integrator, parallel in time.

    The adjoint recursion ``(qbar, vbar, taubar)_k = J_k^T (qbar, vbar)_{k+1}`` is linear, and the
    step Jacobians ``J_k`` depend only on the stored states. For a chunk of steps, the forward
    dynamics Jacobians of all its states come from one batched call (:func:`_dynamics_jacobians`);
    the step's VJP is then applied to the ``nq + nv`` unit cotangents of every step at once with
    those matrices standing in for the dynamics, which gives ``J_k^T``; only one small matrix
    product per step remains sequential. ``A`` holds the recorded accelerations (``None``: recompute
    them, one batched call per chunk). Returns the cotangents of state ``s``.
    """
    robot, dt, passive = cfg.robot, cfg.dt, cfg.passive
    nq, nv = robot.nq, robot.nv
    m = nq + nv
    B = Qseg.shape[0]
    eye = torch.eye(m, dtype=Qseg.dtype, device=Qseg.device)
    per_state = 2048 * nv * robot.nb + 8 * m * (m + nv)
    chunk = max(1, _TIME_BATCHED_CHUNK_BYTES // (per_state * B))
    for c0 in reversed(range(s, e, chunk)):
        c1 = min(c0 + chunk, e)
        N = (c1 - c0) * B
        q = Qseg[:, c0 - off:c1 - off].transpose(0, 1).reshape(N, nq)
        v = Vseg[:, c0 - off:c1 - off].transpose(0, 1).reshape(N, nv)
        if A is not None:
            acc = A[c0 - off:c1 - off].transpose(0, 1).reshape(A.shape[1], N, nv)
        else:  # the Euler integrators evaluate the dynamics once, at the step's own state
            u = tau[:, c0:c1].transpose(0, 1).reshape(N, nv)
            with torch.no_grad():
                acc = forward_dynamics_flat(robot.tree, robot.model_tensors(q.dtype, q.device), q, v, u, None, passive,
                                            "auto", False)[None]
        dynamics_vjp = functools.partial(_vjp_from_jacobians, *_dynamics_jacobians(robot, passive, q, v, acc[0]))
        basis = eye[:, None].expand(m, N, m).reshape(-1, m)
        gq, gv, gu = integ.step_vjp_flat(robot, _rows(q, m), _rows(v, m), _rows(acc.transpose(0, 1), m).transpose(0, 1),
                                         dt, basis[:, :nq], basis[:, nq:], dynamics_vjp)
        # J^T rows: (steps, B, m outputs, nq + 2 nv inputs)
        Jt = torch.cat([gq, gv, gu], dim=-1).reshape(m, c1 - c0, B, -1).permute(1, 2, 0, 3)
        for k in range(c1 - 1, c0 - 1, -1):
            lam = torch.cat([aq, av], dim=-1)[:, None]  # (B, 1, m)
            out = (lam @ Jt[k - c0])[:, 0]
            aq = out[:, :nq] + gQ[:, k]
            av = out[:, nq:m] + gV[:, k]
            if g_tau is not None:
                g_tau[:, k] = out[:, m:]
        if bar is not None:
            bar.update(c1 - c0)
    return aq, av


def _or_zero(g: Tensor | None, like: Tensor) -> Tensor:
    return g if g is not None else torch.zeros_like(like)


def _autograd_rollout(cfg: _Config, q0, v0, tau, f_ext) -> tuple[Tensor, Tensor]:
    t0 = time.perf_counter()
    robot, integ, dt, passive = cfg.robot, cfg.integ, cfg.dt, cfg.passive
    with torch.no_grad():
        _check_finite(cfg, q0[:, None], v0[:, None], 0)
    qs, vs = [q0], [v0]
    q, v = q0, v0
    last = 0
    implicit = integ.implicit
    accel = _plain_accel(cfg)
    for k in _steps_iter(cfg, 0, cfg.steps, "rollout (autograd)"):
        u = _control(cfg, tau, k, q, v)
        fe = None if f_ext is None else f_ext[:, k]
        q, v = integ.step_flat(robot, q, v, u, dt, fe, passive, context=f"step {k}" if implicit else "", accel=accel)
        qs.append(q)
        vs.append(v)
        if k + 1 - last >= _CHECK_EVERY or k + 1 == cfg.steps:
            with torch.no_grad():
                _check_finite(cfg, torch.stack(qs[last + 1:], 1), torch.stack(vs[last + 1:], 1), last + 1)
            last = k + 1
    Q, V = torch.stack(qs, 1), torch.stack(vs, 1)
    if cfg.stats is not None:
        cfg.stats.update(forward_time=time.perf_counter() - t0, steps=cfg.steps, checkpoint_every=None)
    return Q, V


def _unique_trainable(tensors) -> list[Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if isinstance(t, Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


def rollout(
    robot: RobotModel,
    q0: Tensor,
    v0: Tensor,
    tau: Tensor | Callable[[float, Tensor, Tensor], Tensor],
    dt: float,
    *,
    integrator: str | Integrator = "semi_implicit_euler",
    adjoint: str = "checkpoint",
    checkpoint_every: int = 1,
    f_ext: Tensor | None = None,
    passive: bool = True,
    params: Sequence[Tensor] | None = None,
    steps: int | None = None,
    progress: bool = False,
    stats: dict | None = None,
    compile: bool | CompiledDynamics = False,
) -> tuple[Tensor, Tensor]:
    """Simulate ``T`` fixed steps and return the trajectory, differentiably.

    Args:
        robot: the model (its trainable parameters receive gradients).
        q0: (..., nq) initial configuration.
        v0: (..., nv) initial velocity.
        tau: either joint forces ``(..., T, nv)`` held constant over each step (time after the
            batch dims), or a policy ``tau = f(t, q, v)`` called once per step with the time
            ``t = k dt`` (float, s), ``q (..., nq)`` and ``v (..., nv)`` (the rollout's batch
            shape) and returning ``(..., nv)``; an ``nn.Module`` policy's trainable parameters
            receive gradients (pass those of a plain function's closure in ``params``).
        dt: step, s.
        integrator: a name of :data:`diffmech.sim.INTEGRATORS` (``"semi_implicit_euler"``,
            ``"euler"``, ``"midpoint"``, ``"rk4"``, ``"variational_midpoint"``) or an
            :class:`~diffmech.sim.Integrator` instance.
        adjoint: ``"checkpoint"`` (store states only; each reverse step recomputes one step) or
            ``"autograd"`` (backpropagate through the graph of the whole loop).
        checkpoint_every: with ``adjoint="checkpoint"``, keep every ``k``-th state for the
            backward pass and recompute the states in between (one extra forward step per step):
            the saved states shrink ``k``-fold once the returned trajectory is released (with
            ``k = 1`` the saved states are the returned trajectory itself, plus the recorded
            accelerations).
        f_ext: optional (..., T, n_links, 6) link forces; torques per step (world-aligned axes,
            torque about the link origin).
        passive: include joint damping and springs.
        params: extra tensors that the policy (or anything the steps read) uses without being
            an ``nn.Module`` parameter visible here; they receive gradients. The robot's
            trainable parameters and an ``nn.Module`` policy's are collected automatically.
        steps: number of steps ``T``; required with a policy, checked against ``tau`` otherwise.
        progress: show a progress bar (tqdm).
        compile: evaluate the forward dynamics and their VJP with
            :func:`diffmech.dynamics.compiled` (``torch.compile``; explicit integrators, no
            ``f_ext``). Steps then cost a fraction of the eager ones, after a one-off compilation
            per batch size (about a minute on CPU; later processes reuse torch's on-disk cache).
            The compiled function is kept per robot; pass a :class:`~diffmech.dynamics.CompiledDynamics`
            to choose its options.
        stats: optional dict filled with ``forward_time`` (s), ``steps``, ``checkpoint_every``,
            ``saved_state_bytes`` and, after ``backward()``, ``backward_time`` (s) and
            ``recomputed_steps`` (checkpoint mode) -- for benchmarks.

    Returns:
        ``q (..., T + 1, nq)`` and ``v (..., T + 1, nv)``, the states at ``t = 0, dt, ..., T dt``;
        the batch shape broadcasts those of ``q0``, ``v0``, ``tau`` and ``f_ext``.

    Raises:
        SimulationError: a state became non-finite (names the step and the batch element).
        ConvergenceError: an implicit step did not converge (names the step and its residual).
        ShapeError: inconsistent shapes, dtypes or options.
    """
    integ = get_integrator(integrator)
    integ.check_robot(robot)
    if adjoint not in ADJOINTS:
        raise OptionError(f"rollout: unknown adjoint {adjoint!r}; choose from {ADJOINTS}")
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise ShapeError(f"rollout: checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    dt = float(dt)
    if not (dt > 0 and math.isfinite(dt)):
        raise ShapeError(f"rollout: dt must be a positive finite number, got {dt}")
    for name, t, n in (("q0", q0, robot.nq), ("v0", v0, robot.nv)):
        if not isinstance(t, Tensor):
            raise ShapeError(f"rollout: '{name}' must be a tensor, got {type(t).__name__}")
        if t.dim() < 1 or t.shape[-1] != n:
            raise ShapeError(f"rollout: '{name}' must have shape (..., {n}) for '{robot.name}', got {tuple(t.shape)}")
        if not t.dtype.is_floating_point:
            raise ShapeError(f"rollout: '{name}' must be floating point, got {t.dtype}")
    dtype, device = q0.dtype, q0.device
    tensors = [("v0", v0)]
    policy = None
    batch_shapes = [q0.shape[:-1], v0.shape[:-1]]
    if isinstance(tau, Tensor):
        if tau.dim() < 2 or tau.shape[-1] != robot.nv:
            raise ShapeError(f"rollout: 'tau' must have shape (..., T, {robot.nv}), got {tuple(tau.shape)}")
        T = tau.shape[-2]
        if steps is not None and steps != T:
            raise ShapeError(f"rollout: steps={steps} but tau has {T} steps (shape {tuple(tau.shape)})")
        batch_shapes.append(tau.shape[:-2])
        tensors.append(("tau", tau))
    elif callable(tau):
        policy = tau
        if steps is None:
            raise ShapeError("rollout: 'steps' is required when tau is a policy")
        T = steps
    else:
        raise ShapeError(f"rollout: 'tau' must be a tensor (..., T, nv) or a callable policy, got {type(tau).__name__}")
    if not isinstance(T, int) or T < 0:
        raise ShapeError(f"rollout: the number of steps must be a non-negative integer, got {T!r}")
    if f_ext is not None:
        if not isinstance(f_ext, Tensor) or f_ext.dim() < 3 or tuple(f_ext.shape[-3:]) != (T, robot.n_links, 6):
            raise ShapeError(
                f"rollout: 'f_ext' must have shape (..., T={T}, n_links={robot.n_links}, 6), got "
                f"{tuple(getattr(f_ext, 'shape', ()))}"
            )
        batch_shapes.append(f_ext.shape[:-3])
        tensors.append(("f_ext", f_ext))
    for name, t in tensors:
        if t.dtype != dtype or t.device != device:
            raise ShapeError(
                f"rollout: '{name}' is {t.dtype} on {t.device} but q0 is {dtype} on {device}; pass one dtype/device"
            )
    try:
        batch = tuple(torch.broadcast_shapes(*batch_shapes))
    except RuntimeError:
        raise ShapeError(
            "rollout: the batch shapes of " + ", ".join(
                f"{n} {tuple(s)}" for n, s in zip(["q0", "v0"] + [n for n, _ in tensors[1:]], batch_shapes)
            ) + " do not broadcast"
        ) from None
    B = math.prod(batch)
    q0f = q0.expand(*batch, robot.nq).reshape(B, robot.nq)
    v0f = v0.expand(*batch, robot.nv).reshape(B, robot.nv)
    tauf = tau.expand(*batch, T, robot.nv).reshape(B, T, robot.nv) if policy is None else None
    fef = f_ext.expand(*batch, T, robot.n_links, 6).reshape(B, T, robot.n_links, 6) if f_ext is not None else None

    cfg = _Config(robot=robot, integ=integ, dt=dt, steps=T, passive=bool(passive), batch=batch, policy=policy,
                  checkpoint_every=checkpoint_every, progress=progress, stats=stats)
    if compile is not False:
        cfg.dyn = _compiled_dynamics(robot, integ, compile, bool(passive), f_ext)
        if adjoint == "checkpoint" and policy is None:
            cfg.cstep = _compiled_step(cfg.dyn, integ, dt)
        # With adjoint="autograd" the model tensors carry the graph to the parameters; the checkpoint
        # forward reads them without one (its backward rebuilds them).
        with torch.set_grad_enabled(torch.is_grad_enabled() and adjoint == "autograd"):
            cfg.mt = tuple(robot.model_tensors(dtype, device))
    if adjoint == "autograd":
        Q, V = _autograd_rollout(cfg, q0f, v0f, tauf, fef)
    else:
        extra = list(params) if params is not None else []
        for i, p in enumerate(extra):
            if not isinstance(p, Tensor):
                raise ShapeError(f"rollout: params[{i}] must be a tensor, got {type(p).__name__}")
        pol_params = list(policy.parameters()) if isinstance(policy, nn.Module) else []
        all_params = _unique_trainable([*robot.parameters(), *pol_params, *extra])
        differentiable = torch.is_grad_enabled() and (
            bool(all_params) or any(t is not None and t.requires_grad for t in (q0f, v0f, tauf, fef))
        )
        if differentiable:
            # Recorded accelerations feed the hand-written reverse steps, which work in joint space:
            # with mimic joints the steps are replayed under autograd instead.
            cfg.record = robot.tree.coords is None
            Q, V = _CheckpointRollout.apply(cfg, q0f, v0f, tauf, fef, *all_params)
        else:
            with torch.no_grad():
                Q, V = _CheckpointRollout.forward(_NoCtx(), cfg, q0f, v0f, tauf, fef)
    return Q.reshape(*batch, T + 1, robot.nq), V.reshape(*batch, T + 1, robot.nv)


_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _compiled_dynamics(robot: RobotModel, integ: Integrator, compile, passive: bool, f_ext) -> CompiledDynamics:
    """The compiled forward dynamics for ``rollout(..., compile=...)``, kept per robot and ``passive``."""
    if integ.implicit or not integ.accel_calls:
        raise ShapeError(f"rollout: compile=True needs an explicit integrator; '{integ.name}' is implicit")
    if f_ext is not None:
        raise ShapeError("rollout: compile=True does not take f_ext; pass compile=False")
    if isinstance(compile, CompiledDynamics):
        if compile.model is not robot or compile.algorithm != "forward_dynamics" or compile.passive != passive:
            raise ShapeError(
                f"rollout: compile={compile!r} must be forward dynamics of '{robot.name}' with passive={passive}")
        return compile
    if compile is not True:
        raise ShapeError(f"rollout: compile must be a bool or a CompiledDynamics, got {compile!r}")
    per_robot = _COMPILED.setdefault(robot, {})
    if passive not in per_robot:
        per_robot[passive] = compiled(robot, "forward_dynamics", passive=passive)
    return per_robot[passive]


def _compiled_step(dyn: CompiledDynamics, integ: Integrator, dt: float) -> CompiledStep:
    """The compiled step of ``integ`` at ``dt``, kept with the compiled dynamics it belongs to."""
    key = (repr(integ), dt)
    cache = dyn.__dict__.setdefault("_steps", {})
    if key not in cache:
        cache[key] = CompiledStep(dyn.model, integ, dt, dyn.passive, compile=dyn.compiled)
    return cache[key]


class _NoCtx:
    """Stand-in for the autograd context when no gradient is needed (nothing is kept)."""

    def save_for_backward(self, *tensors):
        pass
