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

Explicit integrators reverse without rebuilding a graph of the dynamics when there is no
``f_ext``. With small steps (``batch x (nq + nv) x nv`` up to :data:`TIME_BATCHED_MAX_WORK`), where
a sequential step costs mostly per-operation overhead, the recursion is split: the step
Jacobians depend only on the stored states, so those of many steps come from one batched call
(:func:`~diffmech.sim._step_jacobians.step_jacobians`), and only one small matrix product per step
stays sequential. A policy ``u_k = pi(t_k, x_k)`` adds one VJP of the policy per step
(``lam_k += (d pi / d x_k)^T (d x_{k+1} / d u_k)^T lam_{k+1}``, its parameters get
``(d pi / d theta)^T (...)``); the robot's learnable parameters get one batched VJP per chunk of
steps, once the chunk's adjoints are known. Otherwise the Euler integrators reverse a step by
hand (``step_vjp_flat``, see :class:`~diffmech.sim.integrators.Integrator`) and the others
through autograd on the rebuilt step.

Failures are loud (:mod:`diffmech.sim._guards`): non-finite torques are refused up front, states
and policy outputs are checked in chunks, a divergence is caught by an energy bound before
anything overflows, and the backward pass checks its cotangents in chunks and names the step and
the input whose gradient went bad.
"""

from __future__ import annotations

import contextlib
import math
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn

from .. import _log
from .._progress import Stage
from ..dynamics import threads
from ..dynamics.aba import _lu_apply, forward_dynamics_flat
from ..dynamics.compiled import CompiledDynamics, compiled
from ..dynamics.crba import crba_flat
from ..dynamics.rnea import rnea_flat
from ..errors import OptionError, ShapeError, SimulationError
from ..robot import RobotModel
from ._guards import (
    DEFAULT_MAX_ENERGY_GROWTH,
    ForwardMonitor,
    GradCheck,
    check_initial_state,
    check_tensor_controls,
)
from ._step_jacobians import dynamics_vjp, step_jacobians
from .compiled_step import CompiledStep
from .contact_rollout import scene_rollout
from .integrators import Integrator, get_integrator
from .scene import Scene

__all__ = ["rollout", "ADJOINTS"]

log = _log.get("sim")

ADJOINTS = ("checkpoint", "autograd")

# States, controls and cotangents are checked once per this many steps (one host sync per chunk,
# not per step); the failing step is then located exactly.
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
    progress: bool | None
    stats: dict | None
    record: bool = False  # keep the forward-dynamics values for the backward pass
    dyn: CompiledDynamics | None = None  # compiled forward dynamics (``compile=True``)
    mt: tuple = ()  # the model tensors the compiled dynamics read in the forward pass
    cstep: CompiledStep | None = None  # compiled step and step VJP (compile=True, tensor controls)
    max_energy_growth: float | None = DEFAULT_MAX_ENERGY_GROWTH
    monitor: ForwardMonitor | None = None
    param_names: list[str] = field(default_factory=list)  # of the tensors passed to the autograd Function
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


def _stage(cfg: _Config, what: str, total: int) -> Stage:
    """The progress of a pass over ``total`` steps (see :mod:`diffmech._progress`)."""
    r = cfg.robot
    sizes = (f"{cfg.steps} steps x batch {cfg.B} of '{r.name}' (nq {r.nq}, nv {r.nv}), dt {cfg.dt:g} s, "
             f"{cfg.integ.name}")
    return Stage(log, what, total, sizes=sizes, progress=cfg.progress)


# ----------------------------------------------------------------------------- policies and params=
_OUTSIDE = (
    "params= expects the tensors the policy reads (leaf or not: the rollout returns their gradients to autograd, "
    "which carries them on to whatever they were computed from); an nn.Module policy's parameters and the robot's "
    "are collected automatically. The checkpointed backward re-evaluates the policy at every step, so it cannot "
    "backpropagate through a computation made once outside the policy. Fix the policy: compute that tensor inside "
    "it, or pass the tensor it reads itself in params= (e.g. U = W @ u before the rollout: params=[U], not [W])"
)


def _grad(outputs, inputs, grad_outputs) -> tuple[Tensor | None, ...]:
    """``torch.autograd.grad`` whose "graph freed" error (a policy reading a tensor computed outside
    it) becomes a :class:`SimulationError` that says what to do."""
    try:
        return torch.autograd.grad(outputs, inputs, grad_outputs, allow_unused=True)
    except RuntimeError as e:
        if "second time" in str(e) or "already been freed" in str(e):
            raise SimulationError("rollout backward: the policy reads a tensor that requires grad and was computed "
                                  f"outside it, from tensors passed in params=. {_OUTSIDE}") from e
        raise


def _policy_graph(root, stops: set, known: set[int]) -> tuple[set, list[Tensor]]:
    """The non-leaf autograd nodes of ``root``'s graph (not walking past ``stops``) and its leaves
    that require grad whose ids are not in ``known``."""
    nodes, unknown, seen = set(), [], set()
    stack = [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen or node in stops:
            continue
        seen.add(node)
        var = getattr(node, "variable", None)
        if var is not None:  # AccumulateGrad: a leaf
            if id(var) not in known:
                unknown.append(var)
            continue
        nodes.add(node)
        stack.extend(f for f, _ in node.next_functions)
    return nodes, unknown


def _closure_names(policy, nodes: set) -> list[str]:
    """Names of a plain function's captured tensors whose graph node is in ``nodes``."""
    code, cells = getattr(policy, "__code__", None), getattr(policy, "__closure__", None) or ()
    names = []
    for name, cell in zip(getattr(code, "co_freevars", ()), cells):
        try:
            t = cell.cell_contents
        except ValueError:
            continue
        if isinstance(t, Tensor) and t.grad_fn is not None and t.grad_fn in nodes:
            names.append(name)
    return names


def _probe_policy(cfg: _Config, q0: Tensor, v0: Tensor, params: Sequence[Tensor]) -> None:
    """Evaluate the policy twice at the initial state with a graph and raise if its output depends on
    tensors the checkpointed backward cannot differentiate: a graph built outside the policy
    (nodes that both evaluations share) or a tensor that requires grad but is not in ``params``."""
    stops = {p.grad_fn for p in params if p.grad_fn is not None}
    known = {id(p) for p in params if p.grad_fn is None}
    graphs, keep = [], []
    with torch.enable_grad():
        for _ in range(2):
            q, v = q0.detach().requires_grad_(True), v0.detach().requires_grad_(True)
            u = _control(cfg, None, 0, q, v)
            keep.append((q, v, u))  # alive until both graphs are walked: node identity stays meaningful
            graphs.append(_policy_graph(u.grad_fn, stops, known | {id(q), id(v)}))
    shared = graphs[0][0] & graphs[1][0]
    if shared:
        names = _closure_names(cfg.policy, shared)
        what = f"'{names[0]}'" if names else "a tensor"
        raise SimulationError(
            f"rollout: the policy reads {what} that requires grad and was computed outside it (autograd node "
            f"{sorted(n.name() for n in shared)[0]}). {_OUTSIDE}")
    unknown = graphs[0][1]
    if unknown:
        shapes = sorted({tuple(t.shape) for t in unknown})
        raise SimulationError(
            f"rollout: the policy's output depends on {len(unknown)} tensor(s) that require grad but are not in "
            f"params= (shapes {shapes}); their gradients would be lost. Pass them in params= (or compute them "
            "inside an nn.Module policy as parameters), detach them if they are constants, or use "
            "adjoint='autograd'")


def _policy_vjp(cfg: _Config, k: int, q: Tensor, v: Tensor, gu: Tensor, p_need: Sequence[Tensor]
                ) -> tuple[Tensor, Tensor, Sequence[Tensor | None]]:
    """``(qbar, vbar, [pbar])`` of the policy's output at step ``k`` from state ``(q, v)`` for its
    cotangent ``gu (B, nv)``."""
    with torch.enable_grad():
        qk, vk = q.detach().requires_grad_(True), v.detach().requires_grad_(True)
        u = _control(cfg, None, k, qk, vk)
        if not u.requires_grad:
            return torch.zeros_like(q), torch.zeros_like(v), [None] * len(p_need)
        got = _grad(u, [qk, vk, *p_need], gu)
    return _or_zero(got[0], q), _or_zero(got[1], v), got[2:]


def _param_names(robot: RobotModel, policy, extra: Sequence[Tensor]) -> dict[int, str]:
    names: dict[int, str] = {}
    for i, p in enumerate(extra):
        names.setdefault(id(p), f"params[{i}]")
    if isinstance(policy, nn.Module):
        for n, p in policy.named_parameters():
            names.setdefault(id(p), f"policy parameter '{n}'")
    for n, p in robot.named_parameters():
        names[id(p)] = f"robot parameter '{n}'"
    return names


# ----------------------------------------------------------------------------- forward
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
        ctx.thread_work = threads.work_of(q, robot.nv)
        ctx.save_for_backward(q, v, qdd, f_ext)
        return qdd.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    @threads.decided_backward
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
            gq, gv, lam = dynamics_vjp(robot, ctx.passive, q, v, qdd, g)
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
            a = self.dyn._evaluate(_dyn_args(self.dyn, q, v, tau, f_ext), self.mt)
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
            return self.dyn._apply(_dyn_args(self.dyn, q, v, tau, f_ext), self.mt, value=a)
        return _ReplayedDynamics.apply(self.robot, self.passive, q, v, tau, f_ext, a, *self.params)


def _simulate(cfg: _Config, q0, v0, tau, f_ext, Q, V, start: int, stop: int, check: bool,
              tape: _Tape | None = None, offset: int = 0, show: bool = True, U: Tensor | None = None) -> None:
    """Integrate steps ``start..stop-1`` without recording a graph, writing state ``k`` into
    ``Q, V[:, k - offset]`` and a policy's controls of step ``k`` into ``U[:, k - offset]``; with a
    ``tape``, keep each step's forward-dynamics values at ``tape.A[k - offset]``. With ``check``,
    ``cfg.monitor`` checks every chunk of steps."""
    robot, integ, dt, passive = cfg.robot, cfg.integ, cfg.dt, cfg.passive
    q, v = q0, v0
    last = start
    implicit = integ.implicit
    accel = tape.record if tape is not None else _plain_accel(cfg)
    stage = _stage(cfg, "rollout", stop - start) if show and cfg.progress is not False else None
    with stage if stage is not None else contextlib.nullcontext():
        for k in range(start, stop):
            u = _control(cfg, tau, k, q, v)
            if U is not None:
                U[:, k - offset] = u
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
                us = U[:, last - offset:k + 1 - offset] if cfg.policy is not None else tau[:, last:k + 1]
                cfg.monitor.check(Q[:, last - offset:k + 2 - offset], V[:, last - offset:k + 2 - offset], us,
                                  None if f_ext is None else f_ext[:, last:k + 1], last + 1, cfg.policy is not None)
                last = k + 1
            if stage is not None:
                stage.update()


def _plain_accel(cfg: _Config) -> Callable | None:
    """The forward dynamics of a rollout without a tape: the compiled function, or the default."""
    if cfg.dyn is None:
        return None
    dyn, mt = cfg.dyn, cfg.mt
    return lambda q, v, tau, f_ext: dyn._apply(_dyn_args(dyn, q, v, tau, f_ext), mt)


def _dyn_args(dyn: CompiledDynamics, q: Tensor, v: Tensor, tau: Tensor, f_ext: Tensor | None) -> tuple[Tensor, ...]:
    """The flat arguments of compiled forward dynamics: ``f_ext (B, n_links, 6)`` as ``(B, 6 n_links)``."""
    if not dyn.f_ext:
        return q, v, tau
    if f_ext is None:
        f_ext = q.new_zeros(q.shape[0], dyn.model.n_links, 6)
    return q, v, tau, f_ext.reshape(f_ext.shape[0], -1)


# ----------------------------------------------------------------------------- backward
@dataclass
class _Grads:
    """What a reverse pass accumulates besides the adjoint: per-step cotangents of the controls and
    external forces, and the parameters' (``p``, aligned with the needed parameters) and compiled
    model tensors' (``mt``) sums. Sums are rebound, never updated in place (so a list copy is a
    snapshot)."""

    tau: Tensor | None
    f: Tensor | None
    p: list
    mt: list

    def add(self, which: list, j: int, g: Tensor | None) -> None:
        if g is not None:
            which[j] = g if which[j] is None else which[j] + g

    def snapshot(self) -> tuple[list, list]:
        return list(self.p), list(self.mt)

    def restore(self, snap) -> None:
        self.p[:], self.mt[:] = snap[0], snap[1]


class _CheckpointRollout(torch.autograd.Function):
    """Rollout whose backward recomputes each step from the stored states (see module docstring)."""

    @staticmethod
    def forward(ctx, cfg: _Config, q0, v0, tau, f_ext, *params):
        t0 = time.perf_counter()
        robot, T, B = cfg.robot, cfg.steps, q0.shape[0]
        ctx.thread_work = threads.work_of(q0, robot.nv)
        Q = q0.new_empty(B, T + 1, robot.nq)
        V = v0.new_empty(B, T + 1, robot.nv)
        Q[:, 0] = q0
        V[:, 0] = v0
        K = cfg.checkpoint_every
        S = cfg.integ.accel_calls
        tape = None
        if cfg.record and K == 1 and S and cfg.cstep is None:
            tape = _Tape(cfg, q0.new_empty(T, S, B, robot.nv))
        U = q0.new_empty(B, T, robot.nv) if cfg.policy is not None else None
        _simulate(cfg, q0, v0, tau, f_ext, Q, V, 0, T, check=True, tape=tape, U=U)
        ctx.accels = tape.A if tape is not None else None
        ctx.U = U
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
            if U is not None and cfg.record:
                saved += U.numel() * U.element_size()
            cfg.stats.update(forward_time=time.perf_counter() - t0, steps=T, checkpoint_every=K,
                             saved_state_bytes=saved)
            if cfg.monitor.max_ratio is not None:
                cfg.stats["max_energy_ratio"] = float(cfg.monitor.max_ratio)
        return Q, V

    @staticmethod
    @torch.autograd.function.once_differentiable
    @threads.decided_backward
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
        nq, nv = robot.nq, robot.nv
        m = nq + nv  # rows of a step's Jacobian
        B = Qs.shape[0]
        guard = GradCheck(robot, cfg.batch, dt, [cfg.param_names[i] for i in p_idx])
        guard.incoming(gQ, gV)
        aq = gQ[:, T].clone()
        av = gV[:, T].clone()
        grads = _Grads(tau=torch.zeros_like(tau) if need_tau else None, f=torch.zeros_like(f_ext) if need_f else None,
                       p=[None] * len(p_need), mt=[])
        implicit = integ.implicit
        recomputed = 0
        S = integ.accel_calls
        robot_ids = {id(r) for r in robot.parameters()}
        model_params = [p for p in params if id(p) in robot_ids]
        robot_p = [j for j, p in enumerate(p_need) if id(p) in robot_ids]  # needed robot parameters (in p_need)
        mt_leaves, mt_graph, mt_idx = None, None, []
        if cfg.dyn is not None:
            # Compiled steps differentiate the model tensors; one VJP at the end maps their summed
            # cotangents to the parameters (the tensors do not depend on the state).
            with torch.enable_grad():
                mt_graph = tuple(robot.model_tensors(Qs.dtype, Qs.device))
            mt_idx = [i for i, t in enumerate(mt_graph) if t.requires_grad]
            mt_leaves = tuple(t.detach().requires_grad_(i in mt_idx) for i, t in enumerate(mt_graph))
            grads.mt = [None] * len(mt_idx)
        bar = _stage(cfg, "rollout backward", T) if cfg.progress is not False else None
        tape = _Tape(cfg, ctx.accels, model_params, mt_leaves) if ctx.accels is not None else None
        # Explicit steps without f_ext reverse from step Jacobians batched over time (with a policy:
        # plus one policy VJP per step; robot parameters: one batched VJP per chunk). Compiled
        # dynamics differentiate model tensors instead of parameters: not with robot parameters.
        batched_ok = (cfg.record and S > 0 and not implicit and f_ext is None
                      and not (robot_p and cfg.dyn is not None))
        time_batched = batched_ok and B * m * nv <= TIME_BATCHED_MAX_WORK
        # Otherwise the Euler steps reverse by hand when no robot parameter needs a gradient.
        hand_step = (integ.hand_vjp and cfg.record and f_ext is None and not robot_p and cfg.cstep is None
                     and cfg.dyn is None)

        def dyn_vjp(q, v, qdd, g):
            return dynamics_vjp(robot, passive, q, v, qdd, g)

        def reverse_step(k: int, aq: Tensor, av: Tensor, seg, check: bool) -> tuple[Tensor, Tensor]:
            """Reverse step ``k`` (sequential paths): accumulate into ``grads``, return state ``k``'s adjoint."""
            Qseg, Vseg, Useg, off, tape_ = seg
            after = (aq, av)
            qk_, vk_ = Qseg[:, k - off], Vseg[:, k - off]
            gu = gf = None
            step_p: list = []
            if cfg.cstep is not None:
                # One compiled call per reverse step: the VJP of the whole step.
                got = cfg.cstep.vjp(qk_, vk_, tau[:, k], mt_leaves, aq, av,
                                    (True, True, need_tau, *[i in mt_idx for i in range(len(mt_leaves))]))
                gq, gv, gu = got[0], got[1], got[2]
                for j, i in enumerate(mt_idx):
                    grads.add(grads.mt, j, got[3 + i])
                step_p = [("compiled model tensors", got[3 + i]) for i in mt_idx]
            elif hand_step:
                gq, gv, gu = integ.step_vjp_flat(robot, qk_, vk_, tape_.A[k - off], dt, aq, av, dyn_vjp)
                if cfg.policy is not None:
                    pq, pv, pg = _policy_vjp(cfg, k, qk_, vk_, gu, p_need)
                    gq, gv = gq + pq, gv + pv
                    for j, g in enumerate(pg):
                        grads.add(grads.p, j, g)
                    step_p = list(zip(guard.param_names, pg))
            else:
                with torch.enable_grad():
                    qk = qk_.detach().requires_grad_(True)
                    vk = vk_.detach().requires_grad_(True)
                    if cfg.policy is None:
                        u = tau[:, k].detach().requires_grad_(need_tau)
                    else:
                        u = _control(cfg, None, k, qk, vk)
                    fe = None if f_ext is None else f_ext[:, k].detach().requires_grad_(need_f)
                    hint = Qseg[:, k + 1 - off] if implicit else None
                    accel = tape_.seek(k - off).replay if tape_ is not None else None
                    q1, v1 = integ.step_flat(robot, qk, vk, u, dt, fe, passive,
                                             context=f"step {k} (backward)" if implicit else "", hint=hint, accel=accel)
                    inputs = [qk, vk]
                    if need_tau:
                        inputs.append(u)
                    if need_f:
                        inputs.append(fe)
                    inputs.extend(p_need)
                    inputs.extend(mt_leaves[i] for i in mt_idx)
                    got = _grad((q1, v1), inputs, (aq, av))
                if mt_idx:
                    for j, gi in enumerate(got[len(got) - len(mt_idx):]):
                        grads.add(grads.mt, j, gi)
                    step_p = [("compiled model tensors", gi) for gi in got[len(got) - len(mt_idx):]]
                    got = got[: len(got) - len(mt_idx)]
                gq, gv = _or_zero(got[0], qk), _or_zero(got[1], vk)
                j = 2
                if need_tau:
                    gu = got[j]
                    j += 1
                if need_f:
                    gf = got[j]
                    if gf is not None:
                        grads.f[:, k] = gf
                    j += 1
                for i, gi in enumerate(got[j:]):
                    grads.add(grads.p, i, gi)
                step_p += list(zip(guard.param_names, got[j:]))
            if need_tau and gu is not None and cfg.policy is None:
                grads.tau[:, k] = gu
            aq = gq + gQ[:, k]
            av = gv + gV[:, k]
            if check:
                u_name = "tau" if cfg.policy is None else "the policy's output"
                guard.step(k, [("q", aq), ("v", av), (u_name, gu), ("f_ext", gf), *step_p], torch.cat(after, -1))
            return aq, av

        # Without checkpoint interval every state is stored: one segment (the time-batched reverse's
        # chunks are then as long as they like); otherwise one segment per checkpoint.
        seg = max(T, 1) if time_batched and K == 1 else K
        for s in reversed(range(0, T, seg)):
            e = min(s + seg, T)
            if K == 1:
                Qseg, Vseg, Useg, off = Qs, Vs, ctx.U, 0
            else:
                # Rebuild the states of this segment from its checkpoint (no graph), keeping the
                # forward-dynamics values (and a policy's controls) for the reverse steps.
                Qseg = Qs.new_empty(B, e - s + 1, nq)
                Vseg = Vs.new_empty(B, e - s + 1, nv)
                Useg = Qs.new_empty(B, e - s, nv) if cfg.policy is not None else None
                Qseg[:, 0] = Qs[:, s // K]
                Vseg[:, 0] = Vs[:, s // K]
                tape = _Tape(cfg, Qs.new_empty(e - s, S, B, nv), model_params, mt_leaves) if S else None
                with torch.no_grad():
                    _simulate(cfg, Qseg[:, 0], Vseg[:, 0], tau, f_ext, Qseg, Vseg, s, e, check=False, tape=tape,
                              offset=s, show=False, U=Useg)
                recomputed += e - s
                off = s
            if time_batched:
                # Compiled steps record no accelerations: the reverse recomputes them in batches.
                A = tape.A if tape is not None and cfg.cstep is None else None
                aq, av = _reverse_time_batched(cfg, integ, Qseg, Vseg, A, Useg, tau, off, s, e, aq, av, gQ, gV, grads,
                                               guard, bar, p_need, robot_p, model_params)
                continue
            seg_data = (Qseg, Vseg, Useg, off, tape)
            for c1 in range(e, s, -_CHECK_EVERY):
                c0 = max(c1 - _CHECK_EVERY, s)
                start, snap = (aq, av), grads.snapshot()
                for k in range(c1 - 1, c0 - 1, -1):
                    aq, av = reverse_step(k, aq, av, seg_data, False)
                    if bar is not None:
                        bar.update(1)
                if not guard.finite(aq, av, None if grads.tau is None else grads.tau[:, c0:c1],
                                    None if grads.f is None else grads.f[:, c0:c1], *grads.p, *grads.mt):
                    grads.restore(snap)
                    aq, av = start
                    for k in range(c1 - 1, c0 - 1, -1):
                        aq, av = reverse_step(k, aq, av, seg_data, True)
                    raise guard.chunk_failed(c0, c1)
        if bar is not None:
            bar.close()
        g_p = grads.p
        used = [(mt_graph[i], gi) for i, gi in zip(mt_idx, grads.mt) if gi is not None]
        if used and p_need:
            with torch.enable_grad():
                extra = torch.autograd.grad([t for t, _ in used], p_need, [gi for _, gi in used], allow_unused=True)
            for i, gi in enumerate(extra):
                grads.add(g_p, i, gi)
        out_p: list[Tensor | None] = [None] * len(params)
        for i, gi in zip(p_idx, g_p):
            out_p[i] = gi if gi is not None else torch.zeros_like(params[i])
        if not guard.finite(*g_p):
            bad = [name for name, g in zip(guard.param_names, g_p) if g is not None and not guard.finite(g)]
            raise SimulationError(f"rollout backward: the gradient w.r.t. {', '.join(bad)} is not finite (mapped from "
                                  "the compiled model tensors' finite gradients)")
        if cfg.stats is not None:
            cfg.stats.update(backward_time=time.perf_counter() - t0, recomputed_steps=recomputed)
        return (None, aq if needs[1] else None, av if needs[2] else None, grads.tau, grads.f, *out_p)


# The time-batched reverse (below) pays while a step's sequential VJP is dominated by per-operation
# overhead; its own cost per step grows with batch x (nq + nv) rows times the nv unit cotangents of
# the dynamics Jacobians. Measured backward time, sequential -> time-batched (semi-implicit Euler,
# float64; 2 threads for the torque rows, 1 thread for the rest; the value of the criterion in
# brackets): ms per step, torques: iiwa x1 (98) 1.34 -> 0.17, x10 (980) 1.69 -> 1.22, x32 (3136) 2.12 ->
# 4.37; laikago x1 (666) 2.39 -> 0.85, x2 (1332) 5.8 -> 3.5, x4 (2664) 2.79 -> 3.45 (2 threads), 6.0 ->
# 6.6 (1 thread); s per 100 steps with an MLP policy: iiwa x10 0.85 -> 0.50 (rk4 1.89 -> 1.35), iiwa x32
# 0.89 -> 1.62.
TIME_BATCHED_MAX_WORK = 2000  # batch x (nq + nv) x nv
# States per chunk of the time-batched reverse: its workspace (the RNEA VJP of nv unit cotangents
# per state) is about nv x n_bodies x 2 KiB per state; this bounds it to a few MiB.
_TIME_BATCHED_CHUNK_BYTES = 4 << 20


def _robot_param_vjp(cfg: _Config, integ: Integrator, q: Tensor, v: Tensor, u: Tensor, acc: Tensor | None,
                     lam: Tensor, wanted: Sequence[Tensor], model_params: Sequence[Tensor]) -> Sequence[Tensor | None]:
    """Cotangents of the robot parameters ``wanted`` through the dynamics of steps at ``N`` states
    ``q (N, nq), v, u (N, nv)`` for the adjoints ``lam (N, nq + nv)`` of their next states, in one
    batched VJP (the recorded accelerations ``acc (accel_calls, N, nv)`` replayed, or recomputed)."""
    robot, passive, nq = cfg.robot, cfg.passive, cfg.robot.nq
    stage = [0]

    def accel(qs, vs, taus, fe):
        i = stage[0]
        stage[0] += 1
        if acc is not None:
            a = acc[i]
        else:
            with torch.no_grad():
                a = forward_dynamics_flat(robot.tree, robot.model_tensors(q.dtype, q.device), qs.detach(), vs.detach(),
                                          taus.detach(), None, passive, "auto", False)
        return _ReplayedDynamics.apply(robot, passive, qs, vs, taus, None, a, *model_params)

    with torch.enable_grad():
        q1, v1 = integ.step_flat(robot, q, v, u, cfg.dt, None, passive, accel=accel)
        outs = [(o, g) for o, g in ((q1, lam[:, :nq]), (v1, lam[:, nq:])) if o.requires_grad]
        if not outs:
            return [None] * len(wanted)
        return torch.autograd.grad([o for o, _ in outs], list(wanted), [g for _, g in outs], allow_unused=True)


def _reverse_time_batched(cfg: _Config, integ: Integrator, Qseg: Tensor, Vseg: Tensor, A: Tensor | None,
                          Useg: Tensor | None, tau: Tensor | None, off: int, s: int, e: int, aq: Tensor, av: Tensor,
                          gQ: Tensor, gV: Tensor, grads: _Grads, guard: GradCheck, bar, p_need: Sequence[Tensor] = (),
                          robot_p: Sequence[int] = (), model_params: Sequence[Tensor] = ()) -> tuple[Tensor, Tensor]:
    """Reverse steps ``e-1 .. s`` of an explicit integrator without ``f_ext``, parallel in time.

    The adjoint recursion ``(qbar, vbar, ubar)_k = J_k^T (qbar, vbar)_{k+1}`` is linear, and the
    step Jacobians ``J_k`` depend only on the stored states. For a chunk of steps they come from one
    batched call (:func:`~diffmech.sim._step_jacobians.step_jacobians`); per step only one small
    matrix product stays sequential, plus, with a policy, one VJP of the policy at the step's state
    (its output's cotangent ``ubar`` goes to the state and the policy's parameters). Once a chunk's
    adjoints are known, the robot parameters among ``p_need`` (indices ``robot_p``) get one batched
    VJP of the chunk's dynamics. ``A`` holds the recorded accelerations (``None``: recompute them,
    in batches). Every chunk is checked for non-finite cotangents (and replayed step by step to
    name the culprit). Returns the cotangents of state ``s``.
    """
    robot, dt, passive = cfg.robot, cfg.dt, cfg.passive
    nq, nv = robot.nq, robot.nv
    m = nq + nv
    B = Qseg.shape[0]
    policy = cfg.policy is not None
    per_state = (2048 * nv * robot.nb + 8 * m * (m + nv)) * (1 if integ.hand_vjp else 2)
    chunk = max(1, _TIME_BATCHED_CHUNK_BYTES // (per_state * B))
    wanted = [p_need[j] for j in robot_p]

    def flat(t: Tensor, c0: int, c1: int, o: int) -> Tensor:
        return t[:, c0 - o:c1 - o].transpose(0, 1).reshape((c1 - c0) * B, t.shape[-1])

    for c0 in reversed(range(s, e, chunk)):
        c1 = min(c0 + chunk, e)
        N = (c1 - c0) * B
        q, v = flat(Qseg, c0, c1, off), flat(Vseg, c0, c1, off)
        u = flat(Useg, c0, c1, off) if policy else flat(tau, c0, c1, 0)
        acc = A[c0 - off:c1 - off].transpose(0, 1).reshape(A.shape[1], N, nv) if A is not None else None
        Jt = step_jacobians(robot, integ, passive, dt, q, v, u, acc).reshape(c1 - c0, B, m, -1)

        chunk_data = (c0, c1, off, Jt, Qseg, Vseg, q, v, u, acc)
        start, snap = (aq, av), grads.snapshot()
        aq, av, lams = _reverse_chunk(cfg, integ, chunk_data, aq, av, gQ, gV, grads, guard, p_need, robot_p,
                                      model_params, False)
        if wanted:
            # lams[i] is the adjoint of the state after step c1 - 1 - i: reorder to the rows of q.
            lam = torch.stack(lams[::-1]).reshape(N, m)
            for j, g in zip(robot_p, _robot_param_vjp(cfg, integ, q, v, u, acc, lam, wanted, model_params)):
                grads.add(grads.p, j, g)
        if not guard.finite(aq, av, None if grads.tau is None else grads.tau[:, c0:c1], *grads.p):
            grads.restore(snap)
            _reverse_chunk(cfg, integ, chunk_data, *start, gQ, gV, grads, guard, p_need, robot_p, model_params, True)
            raise guard.chunk_failed(c0, c1)
        if bar is not None:
            bar.update(c1 - c0)
    return aq, av


def _reverse_chunk(cfg: _Config, integ: Integrator, chunk_data: tuple, aq: Tensor, av: Tensor, gQ: Tensor, gV: Tensor,
                   grads: _Grads, guard: GradCheck, p_need: Sequence[Tensor], robot_p: Sequence[int],
                   model_params: Sequence[Tensor], check: bool) -> tuple[Tensor, Tensor, list[Tensor]]:
    """The sequential part of :func:`_reverse_time_batched` for one chunk of steps ``c1-1 .. c0``
    with their transposed step Jacobians ``Jt (c1 - c0, B, m, m + nv)``. Returns the adjoint of state
    ``c0`` and the adjoints ``lam (B, m)`` of the states after each step, last step first. With
    ``check``, every step's cotangents are checked (and the robot parameters' share is computed
    per step for that)."""
    c0, c1, off, Jt, Qseg, Vseg, q, v, u, acc = chunk_data
    nq = cfg.robot.nq
    m = nq + cfg.robot.nv
    B = Qseg.shape[0]
    policy = cfg.policy is not None
    wanted = [p_need[j] for j in robot_p]
    lams = []
    for k in range(c1 - 1, c0 - 1, -1):
        lam = torch.cat([aq, av], dim=-1)
        lams.append(lam)
        out = (lam[:, None] @ Jt[k - c0])[:, 0]
        gq, gv, gu = out[:, :nq], out[:, nq:m], out[:, m:]
        step_p: list = []
        if policy:
            pq, pv, pg = _policy_vjp(cfg, k, Qseg[:, k - off], Vseg[:, k - off], gu, p_need)
            gq, gv = gq + pq, gv + pv
            for j, g in enumerate(pg):
                grads.add(grads.p, j, g)
            step_p = list(zip(guard.param_names, pg))
        elif grads.tau is not None:
            grads.tau[:, k] = gu
        aq = gq + gQ[:, k]
        av = gv + gV[:, k]
        if check:
            if wanted:  # the robot parameters' share of this single step
                i = slice((k - c0) * B, (k - c0 + 1) * B)
                got = _robot_param_vjp(cfg, integ, q[i], v[i], u[i], None if acc is None else acc[:, i], lam, wanted,
                                       model_params)
                step_p += [(guard.param_names[j], g) for j, g in zip(robot_p, got)]
            guard.step(k, [("q", aq), ("v", av), ("the policy's output" if policy else "tau", gu), *step_p], lam)
    return aq, av, lams


def _or_zero(g: Tensor | None, like: Tensor) -> Tensor:
    return g if g is not None else torch.zeros_like(like)


def _autograd_rollout(cfg: _Config, q0, v0, tau, f_ext) -> tuple[Tensor, Tensor]:
    t0 = time.perf_counter()
    robot, integ, dt, passive = cfg.robot, cfg.integ, cfg.dt, cfg.passive
    qs, vs, us = [q0], [v0], []
    q, v = q0, v0
    last = 0
    implicit = integ.implicit
    accel = _plain_accel(cfg)
    with _stage(cfg, "rollout (autograd)", cfg.steps) as stage:
        for k in range(cfg.steps):
            u = _control(cfg, tau, k, q, v)
            us.append(u.detach())
            fe = None if f_ext is None else f_ext[:, k]
            q, v = integ.step_flat(robot, q, v, u, dt, fe, passive, context=f"step {k}" if implicit else "",
                                   accel=accel)
            qs.append(q)
            vs.append(v)
            if k + 1 - last >= _CHECK_EVERY or k + 1 == cfg.steps:
                with torch.no_grad():
                    cfg.monitor.check(torch.stack(qs[last:], 1).detach(), torch.stack(vs[last:], 1).detach(),
                                      torch.stack(us[last:], 1),
                                      None if f_ext is None else f_ext[:, last:k + 1].detach(),
                                      last + 1, cfg.policy is not None)
                last = k + 1
            stage.update()
    Q, V = torch.stack(qs, 1), torch.stack(vs, 1)
    if cfg.stats is not None:
        cfg.stats.update(forward_time=time.perf_counter() - t0, steps=cfg.steps, checkpoint_every=None)
        if cfg.monitor.max_ratio is not None:
            cfg.stats["max_energy_ratio"] = float(cfg.monitor.max_ratio)
    return Q, V


def _unique_trainable(tensors) -> list[Tensor]:
    seen: set[int] = set()
    out = []
    for t in tensors:
        if isinstance(t, Tensor) and t.requires_grad and id(t) not in seen:
            seen.add(id(t))
            out.append(t)
    return out


@threads.decided
def rollout(
    robot: RobotModel,
    q0: Tensor,
    v0: Tensor,
    tau: Tensor | Callable[[float, Tensor, Tensor], Tensor],
    dt: float,
    *,
    integrator: str | Integrator = "semi_implicit_euler",
    adjoint: str = "checkpoint",
    checkpoint_every: int | None = None,
    f_ext: Tensor | None = None,
    passive: bool = True,
    params: Sequence[Tensor] | None = None,
    steps: int | None = None,
    max_energy_growth: float | None = DEFAULT_MAX_ENERGY_GROWTH,
    progress: bool | None = None,
    stats: dict | None = None,
    compile: bool | CompiledDynamics = False,
    contact: bool = False,
) -> tuple[Tensor, Tensor]:
    """Simulate ``T`` fixed steps and return the trajectory, differentiably.

    Args:
        robot: the model (its trainable parameters receive gradients), or a
            :class:`~diffmech.sim.Scene` (several models, ground, frictional contact; stepped by
            :mod:`~diffmech.sim.contact_step` with semi-implicit Euler; ``integrator``,
            ``f_ext``, ``passive`` and ``compile`` do not apply).
        q0: (..., nq) initial configuration.
        v0: (..., nv) initial velocity.
        tau: either joint forces ``(..., T, nv)`` held constant over each step (time after the
            batch dims), or a policy ``tau = f(t, q, v)`` called once per step with the time
            ``t = k dt`` (float, s), ``q (..., nq)`` and ``v (..., nv)`` (the rollout's batch
            shape) and returning ``(..., nv)``; an ``nn.Module`` policy's trainable parameters
            receive gradients (pass those of a plain function's closure in ``params``). The
            checkpointed backward evaluates the policy again at every stored state, so it must
            be deterministic and compute from its inputs, its parameters and ``params``.
        dt: step, s. :func:`diffmech.sim.stable_dt` suggests one.
        integrator: a name of :data:`diffmech.sim.INTEGRATORS` (``"semi_implicit_euler"``,
            ``"euler"``, ``"midpoint"``, ``"rk4"``, ``"variational_midpoint"``) or an
            :class:`~diffmech.sim.Integrator` instance.
        adjoint: ``"checkpoint"`` (store states only; each reverse step recomputes one step) or
            ``"autograd"`` (backpropagate through the graph of the whole loop).
        checkpoint_every: with ``adjoint="checkpoint"``, keep every ``k``-th state for the
            backward pass and recompute the states in between (one extra forward step per step);
            ``None`` (default): 1 for a robot, picked from a memory budget for a scene (see
            :func:`~diffmech.sim.contact_rollout.scene_rollout`):
            the saved states shrink ``k``-fold once the returned trajectory is released (with
            ``k = 1`` the saved states are the returned trajectory itself, plus the recorded
            accelerations and a policy's controls). With a :class:`~diffmech.sim.Scene` the
            same, plus the contact solver's warm start of each kept step; the gradient is the same
            for every ``k`` (the recomputed steps repeat the forward pass bit for bit).
        f_ext: optional (..., T, n_links, 6) link forces; torques per step (world-aligned axes,
            torque about the link origin).
        passive: include joint damping and springs.
        params: extra tensors that the policy (or anything the steps read) uses without being
            an ``nn.Module`` parameter visible here; they receive gradients. The robot's
            trainable parameters and an ``nn.Module`` policy's are collected automatically.
            List the tensors the policy reads, leaf or not (their gradients flow on to what they
            were computed from): a policy that reads ``U = W @ u`` computed before the rollout
            needs ``params=[U]``. With ``adjoint="checkpoint"`` the policy is probed once at the
            initial state, and a dependence that the backward pass could not differentiate (a
            tensor that requires grad but is missing from ``params``, or a graph built outside
            the policy) raises :class:`~diffmech.errors.SimulationError` before any step runs.
        steps: number of steps ``T``; required with a policy, checked against ``tau`` otherwise.
        max_energy_growth: divergence check. Without damping the kinetic energy cannot exceed the
            initial kinetic energy plus the work done on the system; the rollout raises
            :class:`~diffmech.errors.SimulationError` (naming the step, the batch element, the
            energy and the fastest joint, and suggesting a ``dt``) when it exceeds that by this
            factor (see :mod:`diffmech.sim._guards`; checked in chunks of 32 steps, two batched
            kinematic passes per chunk). A sane integration stays near 1 (``stats`` records the
            largest ratio); ``None`` turns the check off.
        progress: ``None`` (default): silent while the pass (forward, and backward when it runs)
            is short; once it has run 2 s, a tqdm bar on stderr if stderr is a terminal, else one
            INFO line of the ``diffmech.sim`` logger then (the sizes) and one at its end (elapsed
            seconds); ``True``: a bar from the first step; ``False``: nothing. See
            :mod:`diffmech._progress` and the docs page "Progress and logging".
        compile: evaluate the forward dynamics and their VJP with
            :func:`diffmech.dynamics.compiled` (explicit integrators; with ``f_ext`` too): on the
            CPU native kernels (built once per tree and stored on disk, seconds), elsewhere
            ``torch.compile`` (compiled once per batch size). Steps then cost a fraction of the
            eager ones at large batches; at batch 1 the eager hand-written steps are as fast.
            The compiled function is kept per robot; pass a :class:`~diffmech.dynamics.CompiledDynamics`
            to choose its options.
        stats: optional dict filled with ``forward_time`` (s), ``steps``, ``checkpoint_every``,
            ``saved_state_bytes``, ``max_energy_ratio`` (the largest ratio of the divergence
            check, with the check on) and, after ``backward()``, ``backward_time`` (s) and
            ``recomputed_steps`` (checkpoint mode) -- for benchmarks. For a scene:
            ``route`` (the implementation that ran: ``"native"`` or ``"torch: <why>"``),
            ``contact_iterations_max``, ``contact_newton_max``, ``contact_residual_max``,
            ``contact_violation_max``, ``contact_unconverged``, ``contact_penetration_max``,
            ``contact_candidates_max``, ``contact_fallbacks`` (see
            :func:`~diffmech.sim.contact_rollout.scene_rollout`).
        contact: with a :class:`RobotModel` that has collision shapes, simulate it as a one-model
            scene (ground, friction 0.5, joint limits).

    Returns:
        ``q (..., T + 1, nq)`` and ``v (..., T + 1, nv)``, the states at ``t = 0, dt, ..., T dt``;
        the batch shape broadcasts those of ``q0``, ``v0``, ``tau`` and ``f_ext``.

    Raises:
        SimulationError: a non-finite initial state, torque, external force or policy output, a
            state that became non-finite or diverged (each names the step and the batch element);
            a policy the checkpointed backward cannot differentiate; in the backward pass, a
            non-finite gradient (names the step and the input: ``q``, ``v``, ``tau``, a parameter).
        ConvergenceError: an implicit step did not converge (names the step and its residual).
        ShapeError: inconsistent shapes, dtypes or options.
        OptionError: an unknown adjoint or integrator, or a bad ``max_energy_growth``.
    """
    if contact or isinstance(robot, Scene):
        if f_ext is not None:
            raise OptionError("rollout: f_ext is not supported with contact (a Scene)")
        scene = robot if isinstance(robot, Scene) else Scene({robot.name: robot})
        return scene_rollout(scene, q0, v0, tau, dt, adjoint=adjoint, checkpoint_every=checkpoint_every,
                             steps=steps, params=params, progress=progress, stats=stats)
    integ = get_integrator(integrator)
    integ.check_robot(robot)
    if adjoint not in ADJOINTS:
        raise OptionError(f"rollout: unknown adjoint {adjoint!r}; choose from {ADJOINTS}")
    if checkpoint_every is None:
        checkpoint_every = 1
    if not isinstance(checkpoint_every, int) or isinstance(checkpoint_every, bool) or checkpoint_every < 1:
        raise ShapeError(f"rollout: checkpoint_every must be an integer >= 1, got {checkpoint_every!r}")
    if max_energy_growth is not None and not (isinstance(max_energy_growth, (int, float))
                                              and math.isfinite(max_energy_growth) and max_energy_growth > 0):
        raise OptionError(f"rollout: max_energy_growth must be a positive number or None, got {max_energy_growth!r}")
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
    with torch.no_grad():
        check_initial_state(batch, q0f, v0f, robot=robot)
        check_tensor_controls(robot, batch, dt, tauf, fef)

    cfg = _Config(robot=robot, integ=integ, dt=dt, steps=T, passive=bool(passive), batch=batch, policy=policy,
                  checkpoint_every=checkpoint_every, progress=progress, stats=stats,
                  max_energy_growth=None if max_energy_growth is None else float(max_energy_growth))
    cfg.monitor = ForwardMonitor(robot, integ, dt, bool(passive), batch, q0f.detach(), v0f.detach(),
                                 cfg.max_energy_growth)
    if compile is not False:
        cfg.dyn = _compiled_dynamics(robot, integ, compile, bool(passive), f_ext)
        if adjoint == "checkpoint" and policy is None and f_ext is None:
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
        if policy is not None and T > 0 and torch.is_grad_enabled():
            _probe_policy(cfg, q0f, v0f, all_params)
        differentiable = torch.is_grad_enabled() and (
            bool(all_params) or any(t is not None and t.requires_grad for t in (q0f, v0f, tauf, fef))
        )
        if differentiable:
            names = _param_names(robot, policy, extra)
            cfg.param_names = [names.get(id(p), f"a parameter of shape {tuple(p.shape)}") for p in all_params]
            # Recorded accelerations feed the hand-written reverse steps, which work in joint space:
            # with mimic or ball joints the steps are replayed under autograd instead.
            cfg.record = robot.tree.coords is None and not robot.tree.n_ball
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
    forces = f_ext is not None
    if isinstance(compile, CompiledDynamics):
        if (compile.model is not robot or compile.algorithm != "forward_dynamics" or compile.passive != passive
                or compile.f_ext != forces):
            raise OptionError(
                f"rollout: compile={compile!r} must be forward dynamics of '{robot.name}' with passive={passive}"
                f" and f_ext={forces} (this rollout {'has' if forces else 'has no'} external forces)")
        return compile
    if compile is not True:
        raise OptionError(f"rollout: compile must be a bool or a CompiledDynamics, got {compile!r}")
    per_robot = _COMPILED.setdefault(robot, {})
    if (passive, forces) not in per_robot:
        per_robot[passive, forces] = compiled(robot, "forward_dynamics", passive=passive, f_ext=forces)
    return per_robot[passive, forces]


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
