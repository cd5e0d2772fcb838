"""Batch evaluation of the rigid-body algorithms by native kernels (or torch.compile), differentiable.

On the CPU every call runs native kernels (:mod:`.kernels`): the algorithm's lane program
(:mod:`.lanes`: the per-state algorithm on ``(B,)`` lanes, body-local frames) compiled to C by
:mod:`.native` -- one vectorised loop over the batch with every intermediate in registers, any
batch size, built once per tree structure, algorithm and dtype and stored on disk. Gradients w.r.t.
the state and the learnable parameters come from the kernel of the algorithm's reverse mode
(:func:`.native.vjp_program`), which recomputes the forward pass per state in registers (only the
inputs are saved) and sums the parameter cotangents over the batch.

Elsewhere (other devices, ``native=False``, or a kernel that cannot be built) torch.compile: it
fuses the batch-last elementwise code of :mod:`.aba` and :mod:`.rnea` into a few loops, and cutting
a large batch into cache-sized chunks keeps the working set in cache. Each chunk has the same shape
(the last one is padded), so one compiled graph serves every batch size at or above the chunk size.
For forward dynamics with no learnable model parameter, the compiled forward also returns ABA's
articulated-body factors and kinematics, and the compiled backward is ``M^{-1}`` from the factors
plus the hand-written RNEA VJP (:mod:`.rnea_vjp`). Otherwise a differentiable call runs the compiled
function with autograd on, so torch.compile traces the joint forward-backward graph once per
pattern of inputs that need a gradient; when the value is already known (a rollout replaying a
recorded step), the backward is a separate compiled ``torch.func.vjp`` of the algorithm. Without
any C compiler (torch.compile's CPU code needs one too) the torch code runs eagerly, after one
warning.

The model's parameters enter as the :class:`~diffmech.model.parameters.ModelTensors` fields,
computed eagerly outside the kernels (so learnable parameters and their parametrizations keep their
ordinary autograd graph), and the backward returns the cotangents of those fields.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from .._warnings import warn
from ..errors import DiffmechError, OptionError, ShapeError
from ..model.parameters import ModelTensors, RobotParameters
from ..model.tree import KinematicTree
from ._common import RigidInertia, TreeState, world_inertia
from .aba import _aba, aba_flat, apply_inverse_mass, factor_tensors, factors_from
from .crba import crba_flat
from .kernel_store import NativeUnavailable, available
from .kernels import NativeCall, call_native, call_native_with, native_constants
from .rnea import rnea_flat
from .rnea_vjp import rnea_vjp_bl

__all__ = ["compiled", "CompiledDynamics", "DEFAULT_CHUNK"]

# Rows per compiled call. Measured on the iiwa at batch 16384 (float64, 2 threads, separate processes
# with diffmech.perf.tune_allocator): forward dynamics 1024 rows 544k-634k states/s, 2048 rows
# 743k-839k, 4096 rows 573k; inverse dynamics 807k (1024) vs 878k (2048).
DEFAULT_CHUNK = 2048


def _link_forces(f: Tensor | None) -> Tensor | None:
    """External forces flattened to ``(B, n_links * 6)`` rows (as kernels take them) -> ``(B, n_links, 6)``."""
    return None if f is None else f.reshape(f.shape[0], -1, 6)


def _fd(tree, mt, passive, q, v, u, f=None):
    return aba_flat(tree, mt, q, v, u, _link_forces(f), passive)


def _id(tree, mt, passive, q, v, a, f=None):
    return rnea_flat(tree, mt, q, v, a, _link_forces(f), passive)


def _mm(tree, mt, passive, q):
    return crba_flat(tree, mt, q)


def _fd_saving(tree: KinematicTree, mt, passive, q, v, u):
    """ABA's value and what its hand-written backward needs (see :func:`_fd_backward`): the
    world-frame columns ``S``, the world inertias ``(h, I)``, the base orientation (floating base)
    and the articulated-body factors."""
    qdd, factors = _aba(tree, mt, q, v, u, None, passive, small=False)
    ts, _ = factors.kinematics
    inertia = world_inertia(ts)  # what the RNEA VJP reads
    base = [ts.R[0]] if tree.nfree else []
    return (qdd, ts.S, inertia.h, inertia.I, *base, *factor_tensors(factors))


def _fd_backward(tree: KinematicTree, mt, passive, q, v, qdd, g, S, h, I, *rest):
    """Cotangents ``(qbar, vbar, taubar)`` of ABA at a known ``qdd``: ``taubar = M^{-1} g`` from the
    saved articulated-body factors, then the hand-written RNEA VJP with ``-taubar``."""
    base, factors = (rest[:1], rest[1:]) if tree.nfree else ((), rest)
    ts = TreeState(R=base[0][None] if base else None, p=None, S=S, mt=mt)  # what the backward reads
    inertia = RigidInertia(m=mt.body_mass[:, None], h=h, I=I)
    lam = apply_inverse_mass(tree, factors_from(tree, ts, list(factors)), g)
    got = rnea_vjp_bl(tree, ts, q.transpose(0, 1), v.transpose(0, 1), qdd.transpose(0, 1),
                      -lam.transpose(0, 1), passive, inertia)
    return got.q.transpose(0, 1), got.v.transpose(0, 1), lam


_ALGORITHMS: dict[str, tuple[int, Callable]] = {
    "forward_dynamics": (3, _fd),
    "inverse_dynamics": (3, _id),
    "mass_matrix": (1, _mm),
}


def _from_torch_compile(err: BaseException) -> bool:
    """Whether ``err`` was raised by torch.compile's machinery (Dynamo, Inductor, their backends)."""
    mod = type(err).__module__ or ""
    return mod.startswith(("torch._dynamo", "torch._inductor", "torch._functorch")) or \
        type(err).__name__ in ("InductorError", "BackendCompilerFailed", "CppCompileError")


def kernel_input(t: Tensor, detach: bool = True) -> Tensor:
    """``t`` detached, with row-major strides (a copy only if needed).

    The compiled graphs are specialised to their inputs' strides and ``requires_grad`` flags: a
    view such as ``Q[:, k]`` of a trajectory would otherwise make torch.compile recompile for each
    trajectory length, and silently fall back to eager mode once its recompilation limit is
    reached. The kernels are pure functions (their backward is a kernel too), so no graph is lost;
    ``detach=False`` keeps the graph (the copy, if any, is differentiable).
    """
    if detach:
        t = t.detach()
    expected, acc = [], 1
    for n in reversed(t.shape):
        expected.append(acc)
        acc *= n
    if tuple(reversed(expected)) == t.stride():
        return t
    return t.clone(memory_format=torch.contiguous_format)


class CompiledDynamics:
    """A compiled rigid-body algorithm on flat batches, differentiable through a compiled VJP.

    Call it like the algorithm (``f(q, v, tau) -> qdd`` etc.); see :func:`compiled`.
    """

    def __init__(self, model: RobotParameters, algorithm: str, chunk: int | None, compile: bool, passive: bool,
                 compile_options: dict, native: bool | None = None, f_ext: bool = False):
        if algorithm not in _ALGORITHMS:
            raise OptionError(f"compiled: unknown algorithm {algorithm!r}; choose from {sorted(_ALGORITHMS)}")
        if model.tree.coords is not None:
            raise OptionError(f"compiled: '{model.name}' has mimic joints, which compiled functions do not support; "
                              "use the eager functions (robot.forward_dynamics, ...)")
        if model.tree.n_ball:
            raise OptionError(f"compiled: '{model.name}' has ball joints, which compiled functions do not support; "
                              "use the eager functions (robot.forward_dynamics, ...)")
        if chunk is not None and (not isinstance(chunk, int) or chunk < 1):
            raise ShapeError(f"compiled: chunk must be a positive integer or None, got {chunk!r}")
        self.model, self.algorithm, self.chunk, self.passive = model, algorithm, chunk, bool(passive)
        self.compiled = bool(compile)
        # Native kernels serve every CPU call; None: when a C compiler is found.
        self.native = (self.compiled and available()) if native is None else bool(native)
        if self.compiled and not available():
            # torch.compile's CPU code needs a C compiler as much as the native kernels do
            warn(f"compiled {algorithm} of '{model.name}': no C compiler found (set $CC or install gcc); "
                 "using the eager torch code")
            self.compiled = False
        if f_ext and algorithm == "mass_matrix":
            raise OptionError("compiled: the mass matrix takes no external forces (f_ext=True)")
        self.f_ext = bool(f_ext)
        self._call = NativeCall(model.tree, algorithm, self.passive, self.f_ext, build=True) if self.native else None
        self._n_args, fn = _ALGORITHMS[algorithm]
        self._sizes = [model.nq, model.nv, model.nv][: self._n_args]
        if self.f_ext:
            self._n_args += 1
            self._sizes.append(6 * model.n_links)
        n = self._n_args
        passive = self.passive
        tree = model.tree

        def forward(*tensors: Tensor) -> Tensor:
            return fn(tree, ModelTensors(*tensors[n:]), passive, *tensors[:n])

        def vjp(*tensors: Tensor, needs: tuple[bool, ...]) -> tuple[Tensor, ...]:
            prim, g = tensors[:-1], tensors[-1]
            idx = [i for i, f in enumerate(needs) if f]

            def f(*diff: Tensor) -> Tensor:
                full = list(prim)
                for i, d in zip(idx, diff):
                    full[i] = d
                return fn(tree, ModelTensors(*full[n:]), passive, *full[:n])

            _, pull = torch.func.vjp(f, *[prim[i] for i in idx])
            return pull(g)

        def fd_saving(*tensors: Tensor) -> tuple[Tensor, ...]:
            return _fd_saving(tree, ModelTensors(*tensors[3:]), passive, *tensors[:3])

        def fd_backward(*tensors: Tensor, n_factors: int) -> tuple[Tensor, Tensor, Tensor]:
            q, v, qdd, g = tensors[:4]
            factors, mt = tensors[4:4 + n_factors], tensors[4 + n_factors:]
            return _fd_backward(tree, ModelTensors(*mt), passive, q, v, qdd, g, *factors)

        compile_options.setdefault("dynamic", False)
        self._compile_options = compile_options
        self._fns = dict(forward=forward, vjp=vjp, fd_saving=fd_saving, fd_backward=fd_backward)

    def __getattr__(self, name: str):
        # The torch functions are wrapped on first use: importing torch.compile's machinery costs
        # seconds, which a call served by native kernels should not pay.
        fns = self.__dict__.get("_fns")
        if fns is None or not name.startswith("_") or name[1:] not in fns:
            raise AttributeError(name)
        fn = fns[name[1:]]
        if self.compiled:
            fn = self._guarded(name, fn, torch.compile(fn, **self._compile_options))
        setattr(self, name, fn)
        return fn

    def _guarded(self, name: str, eager: Callable, compiled_fn: Callable) -> Callable:
        """``compiled_fn``, falling back to ``eager`` (after one warning) if torch.compile fails: a
        compiler error is the library's problem to work around, not an ``InductorError`` for the user."""

        def call(*args, **kwargs):
            try:
                return compiled_fn(*args, **kwargs)
            except DiffmechError:
                raise
            except Exception as err:
                if not _from_torch_compile(err):
                    raise
                warn(f"compiled {self.algorithm} of '{self.model.name}': torch.compile failed "
                     f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}); "
                     "using the eager torch code")
                setattr(self, name, eager)
                return eager(*args, **kwargs)

        return call

    # ------------------------------------------------------------------ evaluation
    def _pieces(self, B: int) -> list[tuple[int, int]]:
        if self.chunk is None or B <= self.chunk:
            return [(0, B)]
        return [(s, min(s + self.chunk, B)) for s in range(0, B, self.chunk)]

    def _pad(self, t: Tensor, s: int, e: int) -> Tensor:
        """Rows ``s:e`` of ``t``, padded to the chunk size with copies of the last row."""
        part = t[s:e]
        if self.chunk is not None and e - s < self.chunk and t.shape[0] > self.chunk:
            part = torch.cat([part, part[-1:].expand(self.chunk - (e - s), *part.shape[1:])])
        return part

    def _evaluate(self, args: Sequence[Tensor], mt: Sequence[Tensor]) -> Tensor:
        """The algorithm's value without a graph: the native kernel on the CPU (any batch size),
        else the compiled torch function, chunk by chunk."""
        if self._native_on(args[0]):
            try:
                return self._call.value(list(args), native_constants(mt, args[0].dtype))
            except NativeUnavailable as err:
                self._native_failed(err)
        B = args[0].shape[0]
        with torch.no_grad():
            mt = [kernel_input(t) for t in mt]
            outs = [self._forward(*[kernel_input(self._pad(a, s, e)) for a in args], *mt)[: e - s]
                    for s, e in self._pieces(B)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _pullback(self, args: Sequence[Tensor], mt: Sequence[Tensor], g: Tensor,
                  needs: Sequence[bool]) -> list[Tensor | None]:
        """Cotangents of ``(*args, *mt)`` for the output cotangent ``g`` (``None`` where not needed);
        the model-tensor cotangents are summed over the batch."""
        needs = tuple(bool(x) for x in needs)
        out: list[Tensor | None] = [None] * len(needs)
        if not any(needs):
            return out
        n = self._n_args
        if self._native_on(args[0]):
            fields = tuple(i for i, f in enumerate(needs[n:]) if f)
            try:
                grads, reds = self._call.pullback(list(args), native_constants(mt, args[0].dtype), g, fields,
                                                  [self._call.offsets[i] for i in fields])
            except NativeUnavailable as err:
                self._native_failed(err)
            else:
                for i in range(n):
                    out[i] = grads[i].to(args[i].dtype) if needs[i] else None
                for i, r in zip(fields, reds):
                    out[n + i] = r.view(mt[i].shape).to(mt[i].dtype)
                return out
        n, B = self._n_args, args[0].shape[0]
        idx = [i for i, f in enumerate(needs) if f]
        arg_parts: dict[int, list[Tensor]] = {i: [] for i in idx if i < n}
        mt = [kernel_input(t) for t in mt]
        for s, e in self._pieces(B):
            gp = g[s:e]
            if self.chunk is not None and e - s < self.chunk and B > self.chunk:
                # Padded rows get a zero cotangent: they add nothing to the parameter cotangents.
                gp = torch.cat([gp, gp.new_zeros(self.chunk - (e - s), *gp.shape[1:])])
            got = self._vjp(*[kernel_input(self._pad(a, s, e)) for a in args], *mt, kernel_input(gp),
                            needs=needs)
            for i, gi in zip(idx, got):
                if i < n:
                    arg_parts[i].append(gi[: e - s])
                else:
                    out[i] = gi if out[i] is None else out[i] + gi
        for i, parts in arg_parts.items():
            out[i] = parts[0] if len(parts) == 1 else torch.cat(parts)
        return out

    def _evaluate_differentiable(self, args: Sequence[Tensor], mt: Sequence[Tensor]) -> Tensor:
        """The algorithm's value with its graph, chunk by chunk. With autograd on, torch.compile
        traces the joint forward and backward graph (AOTAutograd): the backward is compiled as
        well and reuses the forward's intermediates instead of recomputing the algorithm."""
        B = args[0].shape[0]
        mt = [kernel_input(t, detach=False) for t in mt]
        outs = [self._forward(*[kernel_input(self._pad(a, s, e), detach=False) for a in args], *mt)[: e - s]
                for s, e in self._pieces(B)]
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    def _apply(self, args: Sequence[Tensor], mt: Sequence[Tensor], value: Tensor | None = None) -> Tensor:
        """Evaluate with autograd support; ``value``, if given, is the already known output (its
        backward is then the VJP kernel at ``args``, which recomputes the algorithm)."""
        tensors = [*args, *mt]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            if value is not None:
                return _Compiled.apply(self, value, *tensors)
            if self._native_on(args[0]):
                try:
                    return call_native_with(self._call, list(args), list(mt))
                except NativeUnavailable as err:
                    self._native_failed(err)
            if self.algorithm == "forward_dynamics" and not self.f_ext and not any(t.requires_grad for t in mt):
                return _CompiledForwardDynamics.apply(self, tuple(mt), *args)
            return self._evaluate_differentiable(args, mt)
        return value if value is not None else self._evaluate(args, mt)

    def _native_on(self, ref: Tensor) -> bool:
        return self._call is not None and ref.device.type == "cpu"

    def _native_failed(self, err: Exception) -> None:
        """A kernel could not be built or loaded: say so once and use the torch implementation."""
        self._call = None
        how = "torch.compile" if self.compiled else "the eager torch code"
        warn(f"compiled {self.algorithm} of '{self.model.name}': no native kernel ({err}); using {how}")

    def _check(self, args: Sequence[Tensor]) -> None:
        if len(args) == self._n_args:
            ref = args[0]
            try:
                B, dtype, cpu = ref.shape[0], ref.dtype, ref.is_cpu
                if all(t.dim() == 2 and t.shape[0] == B and t.shape[1] == n and t.dtype is dtype and t.is_cpu == cpu
                       for t, n in zip(args, self._sizes)) and (cpu or all(t.device == ref.device for t in args)):
                    return
            except (AttributeError, IndexError, TypeError):
                pass
        self._explain(args)

    def _explain(self, args: Sequence[Tensor]) -> None:
        """Raise the :class:`ShapeError` that says what is wrong with ``args``."""
        if len(args) != self._n_args:
            raise ShapeError(f"compiled {self.algorithm}: expected {self._n_args} tensors, got {len(args)}")
        ref = args[0]
        for name, t, n in zip(("q", "v", "u", "f_ext"), args, self._sizes):
            if not isinstance(t, Tensor):
                raise ShapeError(f"compiled {self.algorithm}: '{name}' must be a tensor, got {type(t).__name__}")
            if t.dim() != 2 or t.shape[1] != n:
                raise ShapeError(
                    f"compiled {self.algorithm}: '{name}' must have shape (B, {n}), got {tuple(t.shape)}")
            if t.shape[0] != ref.shape[0] or t.dtype != ref.dtype or t.device != ref.device:
                raise ShapeError(
                    f"compiled {self.algorithm}: '{name}' is {tuple(t.shape)} {t.dtype} on {t.device} but 'q' is "
                    f"{tuple(ref.shape)} {ref.dtype} on {ref.device}; pass one batch size, dtype and device")

    def __call__(self, *args: Tensor) -> Tensor:
        if self.f_ext and len(args) == 4 and isinstance(args[3], Tensor):
            f = args[3]
            if f.dim() != 3 or tuple(f.shape[1:]) != (self.model.n_links, 6):
                raise ShapeError(f"compiled {self.algorithm}: 'f_ext' must have shape (B, {self.model.n_links}, 6), "
                                 f"got {tuple(f.shape)}")
            args = (*args[:3], f.reshape(f.shape[0], -1))
        self._check(args)
        if self._call is not None and args[0].device.type == "cpu":
            try:
                return call_native(self._call, list(args), self.model)
            except NativeUnavailable as err:
                self._native_failed(err)
        mt = self.model.model_tensors(args[0].dtype, args[0].device)
        return self._apply(args, tuple(mt))

    def __repr__(self) -> str:
        return f"CompiledDynamics({self.model.name!r}, {self.algorithm!r}, chunk={self.chunk})"


class _CompiledForwardDynamics(torch.autograd.Function):
    """Forward dynamics whose compiled forward keeps the articulated-body factors, and whose
    compiled backward is ``M^{-1}`` from those factors plus the hand-written RNEA VJP (no
    recomputation of ABA, no autograd graph of it). Used when no model tensor needs a gradient."""

    @staticmethod
    def forward(ctx, dyn: CompiledDynamics, mt: tuple, q: Tensor, v: Tensor, tau: Tensor) -> Tensor:
        mt = [kernel_input(t) for t in mt]
        chunks, outs = [], []
        for s, e in dyn._pieces(q.shape[0]):
            ins = [kernel_input(dyn._pad(a, s, e)) for a in (q, v, tau)]
            qdd, *factors = dyn._fd_saving(*ins, *mt)
            chunks.append((s, e, ins[0], ins[1], qdd, factors))
            outs.append(qdd[: e - s])
        ctx.dyn, ctx.mt, ctx.chunks = dyn, mt, chunks
        return outs[0] if len(outs) == 1 else torch.cat(outs)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        dyn, B = ctx.dyn, g.shape[0]
        parts: list[list[Tensor]] = [[], [], []]
        for s, e, q, v, qdd, factors in ctx.chunks:
            gp = g[s:e]
            if dyn.chunk is not None and e - s < dyn.chunk and B > dyn.chunk:
                gp = torch.cat([gp, gp.new_zeros(dyn.chunk - (e - s), *gp.shape[1:])])
            got = dyn._fd_backward(q, v, qdd, kernel_input(gp), *factors, *ctx.mt, n_factors=len(factors))
            for i in range(3):
                parts[i].append(got[i][: e - s])
        grads = [p[0] if len(p) == 1 else torch.cat(p) for p in parts]
        needs = ctx.needs_input_grad
        return (None, None, *[gi if needs[2 + i] else None for i, gi in enumerate(grads)])


class _Compiled(torch.autograd.Function):
    """A known value whose backward is the compiled VJP kernel at the saved inputs."""

    @staticmethod
    def forward(ctx, dyn: CompiledDynamics, value: Tensor, *tensors: Tensor) -> Tensor:
        ctx.dyn = dyn
        ctx.save_for_backward(*tensors)
        return value.clone()

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g: Tensor):
        dyn = ctx.dyn
        tensors = ctx.saved_tensors
        grads = dyn._pullback(tensors[: dyn._n_args], tensors[dyn._n_args:], g, ctx.needs_input_grad[2:])
        return (None, None, *grads)


def compiled(
    model: RobotParameters,
    algorithm: str = "forward_dynamics",
    *,
    chunk: int | None = DEFAULT_CHUNK,
    compile: bool = True,
    passive: bool = True,
    native: bool | None = None,
    f_ext: bool = False,
    **compile_options,
) -> CompiledDynamics:
    """A fast function evaluating ``algorithm`` on flat batches, differentiable.

    On the CPU (float64 or float32) it runs native kernels (:mod:`.kernels`), built on the first
    call for the robot's tree structure (seconds; the reverse-mode kernels on the first
    differentiable call) and stored on disk per user, so later processes and robots with the same
    tree load them at once. Elsewhere, or with ``native=False``, the torch code under
    torch.compile. :func:`diffmech.dynamics.kernels.prepare` builds kernels ahead of time.

    Args:
        model: the robot (its parameters are read at every call, so learnable parameters work and
            receive gradients).
        algorithm: ``"forward_dynamics"`` (``f(q, v, tau) -> qdd``, by ABA), ``"inverse_dynamics"``
            (``f(q, v, a) -> tau``) or ``"mass_matrix"`` (``f(q) -> M``).
        chunk: torch.compile path: batch rows per compiled call; larger batches are split (the
            last piece padded), so one graph is compiled. ``None`` compiles each batch size.
        compile: ``False`` keeps the torch path's chunking and VJP backward but runs eagerly (for
            comparison and debugging), and turns native kernels off unless ``native=True``.
        passive: include the model's joint damping and springs (as the eager methods).
        native: use native kernels on the CPU. ``None`` (default): when ``compile`` is true and a C
            compiler is found. Without any C compiler the torch code runs eagerly (torch.compile's
            CPU code needs a compiler too), after one warning.
        f_ext: the function takes a fourth argument, external link forces ``(B, n_links, 6)``
            (force; torque about the link origin, world axes), as the eager functions' ``f_ext``.
        **compile_options: passed to ``torch.compile`` (default ``dynamic=False``).

    Returns:
        A :class:`CompiledDynamics`: a function of flat ``(B, n)`` tensors (one dtype, device and
        batch size) returning ``(B, nv)`` (``(B, nv, nv)`` for the mass matrix). Gradients w.r.t.
        the inputs and the model's learnable parameters come from the kernels of the reverse mode
        (a backward with ``create_graph=True`` differentiates the torch code, so higher derivatives
        are exact).
    """
    return CompiledDynamics(model, algorithm, chunk, compile, passive, dict(compile_options), native, f_ext)
