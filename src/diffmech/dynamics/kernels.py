"""Native kernels of the rigid-body algorithms, found by the structure of the tree.

A kernel (:mod:`.native`) is the C translation of a lane program (:mod:`.lanes`). It depends only on
the tree's structure (:attr:`~diffmech.model.tree.KinematicTree.structure_hash`), the algorithm and
its options, the dtype, and the code that generates it -- not on the robot's names or parameter
values, which are an argument of every call. So kernels are keyed by exactly that: this process
keeps each one it loaded, and the disk store (:mod:`.kernel_store`) keeps them across processes,
so a kernel built once on a machine serves every later process and every robot with the same tree
without tracing or compiling again.

Gradients: the reverse mode of a lane program is written by :mod:`.lanetrace` into the same scalar
code; its kernel recomputes the forward pass per state and returns the cotangents of the state
inputs and, summed over the batch, of the model constants that need one (learnable parameters).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import hashlib
import itertools
import math
import os
import threading
import weakref
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from ..errors import OptionError
from ..model.parameters import ModelTensors
from ..model.tree import KinematicTree
from .kernel_store import NativeUnavailable, NotBuilt
from .lanes import aba_lanes, advance_lanes, crba_lanes, ground_step_lanes, kinematics_lanes, rnea_lanes
from .native import LaneKernel, lane_kernel, trace_and_emit

__all__ = ["KernelSpec", "get_kernel", "const_shapes", "code_version", "NativeUnavailable", "ALGORITHMS", "prepare",
           "set_native", "native_mode"]

ALGORITHMS = ("forward_dynamics", "inverse_dynamics", "mass_matrix", "kinematics", "advance")
# algorithms without passive terms or external forces (one variant)
_PLAIN = ("mass_matrix", "kinematics", "advance")
FIELDS = ModelTensors._fields
# The model tensors each lane program reads (:mod:`.lanes`); external forces add ``link_p``.
_KINEMATIC = {"A0", "A1", "A2", "p_tree", "lin_dir", "rot_axis", "lin_axis"}
_INERTIAL = {"body_mass", "body_h", "body_I"}
_FIELDS_READ = {
    "forward_dynamics": _KINEMATIC | _INERTIAL | {"damping", "stiffness", "rest", "gravity"},
    "inverse_dynamics": _KINEMATIC | _INERTIAL | {"damping", "stiffness", "rest", "gravity"},
    "mass_matrix": _KINEMATIC | _INERTIAL,
    "kinematics": _KINEMATIC | {"link_R", "link_p"},
    "advance": set(),
    "ground_step": _KINEMATIC | _INERTIAL | {"damping", "stiffness", "rest", "gravity", "link_R", "link_p"},
}
_DTYPES = (torch.float64, torch.float32)


class KernelSpec(NamedTuple):
    """What a kernel computes besides the tree: the algorithm and its options.

    ``vjp``: the reverse mode (inputs: the state, the output cotangent ``g``; outputs: the state
    cotangents, then the batch sums of the cotangents of the model-tensor ``fields``, indices into
    :data:`FIELDS`).
    """

    algorithm: str
    passive: bool
    f_ext: bool
    vjp: bool
    fields: tuple[int, ...]
    dtype: torch.dtype


def const_shapes(tree: KinematicTree) -> list[tuple[int, ...]]:
    """The shape of every :class:`~diffmech.model.parameters.ModelTensors` field of ``tree``."""
    nj, nb, nl = tree.nj, tree.nb, tree.n_links
    shapes = dict(A0=(nj, 3, 3, 1), A1=(nj, 3, 3, 1), A2=(nj, 3, 3, 1), p_tree=(nj, 3, 1), lin_dir=(nj, 3, 1),
                  rot_axis=(nj, 3, 1), lin_axis=(nj, 3, 1), body_mass=(nb,), body_h=(nb, 3), body_I=(nb, 3, 3),
                  link_R=(nl, 3, 3), link_p=(nl, 3), link_mass=(nl,), link_com=(nl, 3), damping=(nj,),
                  stiffness=(nj,), rest=(nj,), gravity=(3,))
    return [shapes[f] for f in FIELDS]


def ground_step_algorithm(n_drives: int, links: tuple[int, ...]) -> str:
    """The algorithm name of :func:`~diffmech.dynamics.lanes.ground_step_lanes` for ``n_drives`` driven
    joints and balls on ``links`` (a kernel per layout)."""
    return f"ground_step:{n_drives}:{','.join(str(int(k)) for k in links)}"


def _ground_layout(algorithm: str) -> tuple[int, tuple[int, ...]] | None:
    """``(n_drives, links)`` of a ground-step algorithm name, ``None`` for another algorithm."""
    if not algorithm.startswith("ground_step:"):
        return None
    _, nd, links = algorithm.split(":")
    return int(nd), tuple(int(k) for k in links.split(",") if k)


def _family(algorithm: str) -> str:
    return algorithm.split(":", 1)[0]


@functools.cache
def code_version() -> str:
    """A digest of the code that turns a tree into C: a kernel stored by another version is not reused."""
    here = Path(__file__).parent
    h = hashlib.sha256(torch.__version__.encode())
    for name in ("lanes.py", "lanetrace.py", "native.py", "kernels.py"):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def state_rows(tree: KinematicTree, spec: KernelSpec) -> list[int]:
    """Rows of the state inputs: ``(q, v, u[, f_ext])`` or ``(q,)`` for the mass matrix and the kinematics."""
    if spec.algorithm in ("mass_matrix", "kinematics"):
        return [tree.nq]
    if spec.algorithm == "advance":  # (q, v, dt)
        return [tree.nq, tree.nv, 1]
    ground = _ground_layout(spec.algorithm)
    if ground is not None:  # (q, v, tau[, drives], balls, dt)
        nd, links = ground
        return [tree.nq, tree.nv, tree.nv] + ([4 * nd] if nd else []) + [4 * len(links), 1]
    return [tree.nq, tree.nv, tree.nv] + ([6 * tree.n_links] if spec.f_ext else [])


def out_rows(tree: KinematicTree, spec: KernelSpec) -> int:
    if spec.algorithm == "kinematics":
        return 16 * tree.n_links + 6 * tree.nv
    if spec.algorithm == "advance":
        return tree.nq + tree.nv
    ground = _ground_layout(spec.algorithm)
    if ground is not None:
        nb = len(ground[1])
        return tree.nv + tree.nv * tree.nv + nb + 3 * nb * tree.nv
    return tree.nv * tree.nv if spec.algorithm == "mass_matrix" else tree.nv


def _lane_program(tree: KinematicTree, spec: KernelSpec):
    n = len(state_rows(tree, spec))
    ground = _ground_layout(spec.algorithm)
    if ground is not None:
        nd, links = ground

        def fn(*args):
            drive = args[3] if nd else None
            return ground_step_lanes(tree, ModelTensors(*args[n:]), args[0], args[1], args[2], drive, args[n - 2],
                                     args[n - 1], links)
        return fn
    if spec.algorithm == "forward_dynamics":
        def fn(*args):
            f = args[3] if spec.f_ext else None
            return aba_lanes(tree, ModelTensors(*args[n:]), args[0], args[1], args[2], spec.passive, f)
    elif spec.algorithm == "inverse_dynamics":
        def fn(*args):
            f = args[3] if spec.f_ext else None
            return rnea_lanes(tree, ModelTensors(*args[n:]), args[0], args[1], args[2], spec.passive, f)
    elif spec.algorithm == "kinematics":
        def fn(*args):
            return kinematics_lanes(tree, ModelTensors(*args[1:]), args[0])
    elif spec.algorithm == "advance":
        def fn(*args):
            return advance_lanes(tree, ModelTensors(*args[3:]), args[0], args[1], args[2])
    else:
        def fn(*args):
            return crba_lanes(tree, ModelTensors(*args[1:]), args[0])
    return fn


def _build(tree: KinematicTree, spec: KernelSpec):
    """``build()`` for the store: trace the lane program (or its reverse mode) and emit C."""
    fn = _lane_program(tree, spec)
    return lambda: trace_and_emit(fn, state_rows(tree, spec), const_shapes(tree), spec.dtype,
                                  vjp_fields=spec.fields if spec.vjp else None)


_MEMO: dict[str, LaneKernel | NativeUnavailable] = {}
_LOCK = threading.Lock()
_BUILT = [0]  # kernels loaded so far: a call that found one missing looks again after a new one


def get_kernel(tree: KinematicTree, spec: KernelSpec, build: bool = True) -> LaneKernel:
    """The kernel of ``spec`` for ``tree``: from this process, from the disk store, or (``build``)
    traced and compiled now.

    Raises:
        NativeUnavailable: no C compiler, an unsupported dtype, a failed build; ``NotBuilt`` when
            ``build`` is false and none is stored.
    """
    key = hashlib.sha256(f"{code_version()}|{tree.structure_hash}|{spec}".encode()).hexdigest()
    hit = _MEMO.get(key)
    if isinstance(hit, LaneKernel):
        return hit
    if hit is not None and not (isinstance(hit, NotBuilt) and build):
        # a fresh copy: re-raising the memoised instance would chain every call's traceback onto it,
        # and with them the frames and tensors of every call (memory growing with each step)
        raise copy.copy(hit)
    if spec.dtype not in _DTYPES:
        err = NativeUnavailable(f"native kernels: dtype {spec.dtype} (float64 and float32 only)")
        _MEMO[key] = copy.copy(err)
        raise err
    name = f"{tree.name} {spec.algorithm}{' vjp' if spec.vjp else ''} {str(spec.dtype).removeprefix('torch.')}"
    with _LOCK:
        try:
            k = lane_kernel(key, name, _build(tree, spec) if build else None)
        except NativeUnavailable as err:
            _MEMO[key] = copy.copy(err)  # without the traceback (and its frames)
            raise
        _MEMO[key] = k
        _BUILT[0] += 1
    return k


def forget_unbuilt() -> None:
    """Forget which kernels were found missing, so that the next call looks in the store again
    (another process may have built them)."""
    for key in [k for k, v in _MEMO.items() if isinstance(v, NotBuilt)]:
        del _MEMO[key]


# ---------------------------------------------------------------- calling kernels from torch
def _prep(x: Tensor, dtype: torch.dtype) -> Tensor:
    """A kernel input: CPU, ``dtype``, batch-first contiguous rows (kernels read the memory only;
    the graph, if any, is the caller's business)."""
    if x.dtype is dtype and x.is_cpu and x.dim() == 2 and x.is_contiguous():
        return x  # the common case, checked first: a call at batch 1 is a few microseconds
    x = x.detach().to("cpu", dtype)
    if x.dim() != 2:
        x = x.reshape(x.shape[0], -1)
    return x.contiguous()


class NativeCall:
    """One algorithm with its options on one tree, evaluated and differentiated by native kernels.

    ``build``: build missing kernels (``compiled(...)``) or use only what is stored (the default
    path of the public functions, which falls back to the torch code instead).
    """

    def __init__(self, tree: KinematicTree, algorithm: str, passive: bool, f_ext: bool, build: bool):
        self.tree, self.algorithm, self.passive, self.f_ext, self.build = tree, algorithm, passive, f_ext, build
        self.offsets = field_offsets(tree)
        self._kernels: dict[tuple, LaneKernel] = {}
        self._missing: dict[tuple, tuple[int, NativeUnavailable]] = {}

    def fields_read(self, wanted) -> tuple[int, ...]:
        """Indices of the model-tensor fields flagged in ``wanted`` that this algorithm reads (the
        others have zero cotangents)."""
        read = _FIELDS_READ[_family(self.algorithm)]
        extra = {"link_p"} if self.f_ext else set()
        return tuple(i for i, w in enumerate(wanted) if w and (FIELDS[i] in read or FIELDS[i] in extra))

    def spec(self, dtype: torch.dtype, vjp: bool = False, fields: tuple[int, ...] = ()) -> KernelSpec:
        return KernelSpec(self.algorithm, self.passive, self.f_ext, vjp, fields, dtype)

    def kernel(self, dtype: torch.dtype, vjp: bool = False, fields: tuple[int, ...] = ()) -> LaneKernel:
        key = (dtype, vjp, fields)
        k = self._kernels.get(key)
        if k is not None:
            return k
        miss = self._missing.get(key)
        if miss is not None and miss[0] == _BUILT[0]:  # nothing was built since it was found missing
            raise copy.copy(miss[1])  # a fresh instance: see get_kernel
        if self.tree.n_ball:
            # the generated kernels place every joint body by one angle (lanes.py); a ball's quaternion
            # has no lane code yet
            raise NativeUnavailable(f"'{self.tree.name}' has ball joints, which native kernels do not support")
        try:
            k = get_kernel(self.tree, self.spec(dtype, vjp, fields), self.build)
        except NativeUnavailable as err:
            self._missing[key] = (_BUILT[0], copy.copy(err))
            raise
        self._kernels[key] = k
        return k

    def value(self, state: list[Tensor], C: Tensor) -> Tensor:
        """The output ``(B, nv)`` (``(B, nv, nv)`` for the mass matrix) without a graph."""
        out = self.kernel(C.dtype)([_prep(x, C.dtype) for x in state], C)
        if self.algorithm == "mass_matrix":
            out = out.view(-1, self.tree.nv, self.tree.nv)
        return out

    def pullback(self, state: list[Tensor], C: Tensor, g: Tensor, fields: tuple[int, ...], field_offsets: list[int]
                 ) -> tuple[list[Tensor], list[Tensor]]:
        """Cotangents of the state inputs (batch-first, each input's shape) and, summed over the
        batch, of the model-tensor ``fields`` (flat, float64)."""
        dtype = C.dtype
        k = self.kernel(dtype, True, fields)
        ins = [_prep(x, dtype) for x in state] + [_prep(g, dtype)]
        got = k(ins, C)
        out, red = got if fields else (got, None)
        sizes = [x.shape[1] if x.dim() == 2 else math.prod(x.shape[1:]) for x in state]
        parts = out.split(sizes, dim=1)
        grads = [p.view(x.shape) for p, x in zip(parts, state)]
        reds = list(red.split([n for _, n in field_offsets])) if red is not None else []
        return grads, reds


def field_offsets(tree: KinematicTree) -> list[tuple[int, int]]:
    """``(offset, size)`` of each model-tensor field in the flat constants."""
    out, off = [], 0
    for shape in const_shapes(tree):
        n = math.prod(shape)
        out.append((off, n))
        off += n
    return out


class _Native(torch.autograd.Function):
    """An algorithm by native kernels: the value by the forward kernel, the cotangents of the state
    and of the model tensors (learnable parameters) by the kernel of its reverse mode, which
    recomputes the forward pass per state (only the inputs are saved). A backward that asks for a
    graph (``create_graph=True``) differentiates the torch implementation instead, so higher
    derivatives stay exact."""

    @staticmethod
    def forward(ctx, call: NativeCall, C: Tensor, n_state: int, mt: tuple, *inputs: Tensor) -> Tensor:
        # inputs: the state, then the model tensors when one of them requires grad (else none: fewer
        # arguments for autograd to track in the common case); ``mt`` all of them, for create_graph
        ctx.call, ctx.C, ctx.n_state, ctx.mt = call, C, n_state, mt
        ctx.save_for_backward(*inputs)
        return call.value(list(inputs[:n_state]), C)

    @staticmethod
    def backward(ctx, g: Tensor):
        inputs = ctx.saved_tensors
        n, call = ctx.n_state, ctx.call
        needs = ctx.needs_input_grad[4:]
        if torch.is_grad_enabled():
            got = _torch_vjp(call, inputs[:n], inputs[n:] or ctx.mt, g, list(needs) + [False] * len(ctx.mt))
            return (None, None, None, None, *got[:len(inputs)])
        fields = call.fields_read([nd for nd in needs[n:]])
        grads, reds = call.pullback(list(inputs[:n]), ctx.C, g, fields,
                                    [call.offsets[i] for i in fields])
        out: list[Tensor | None] = [gi.to(x.dtype) if nd else None for gi, x, nd in zip(grads, inputs[:n], needs[:n])]
        # a model tensor the algorithm does not read (the links' masses in RNEA read per body) gets zero
        field_grads: list[Tensor | None] = [torch.zeros_like(t) if nd else None for t, nd in zip(inputs[n:], needs[n:])]
        for i, r in zip(fields, reds):
            t = inputs[n + i]
            field_grads[i] = r.view(t.shape).to(t.dtype)
        return (None, None, None, None, *out, *field_grads)


def _torch_vjp(call: NativeCall, state, mt, g, needs) -> list[Tensor | None]:
    """The VJP of the torch implementation, with a graph (for higher derivatives)."""
    from .aba import aba_flat
    from .crba import crba_flat
    from .rnea import rnea_flat

    mtt = ModelTensors(*mt)
    tree = call.tree
    if _ground_layout(call.algorithm) is not None:  # no batch-first torch code: the lane program, eagerly
        fn = _lane_program(tree, call.spec(state[0].dtype))
        out = fn(*[x.t() for x in state], *mtt).t()
    elif call.algorithm == "kinematics":
        from .kinematics import kinematics_flat

        out = kinematics_flat(tree, mtt, state[0])
    elif call.algorithm == "advance":
        from .kinematics import advance_flat

        out = advance_flat(state[0], state[1], state[2])
    elif call.algorithm == "mass_matrix":
        out = crba_flat(tree, mtt, state[0])
    else:
        f = state[3].reshape(state[3].shape[0], tree.n_links, 6) if call.f_ext else None
        fn = aba_flat if call.algorithm == "forward_dynamics" else rnea_flat
        out = fn(tree, mtt, state[0], state[1], state[2], f, call.passive)
    inputs = [*state, *mt]
    wanted = [i for i, nd in enumerate(needs) if nd]
    got = torch.autograd.grad(out, [inputs[i] for i in wanted], g, create_graph=True, allow_unused=True)
    res: list[Tensor | None] = [None] * len(inputs)
    for i, gi in zip(wanted, got):
        res[i] = gi
    return res


def native_constants(mt, dtype: torch.dtype) -> Tensor:
    """Model tensors flattened and concatenated in field order on the CPU: a kernel's constants."""
    return torch.cat([t.detach().to("cpu", dtype).reshape(-1) for t in mt])


def call_native(call: NativeCall, state: list[Tensor], robot) -> Tensor:
    """``call`` on flat batch-first ``state`` tensors of one CPU dtype; differentiable w.r.t. the
    state and the robot's learnable parameters. Raises :class:`NativeUnavailable` (``NotBuilt``)
    when a kernel it needs is missing and ``call.build`` is false."""
    mt, C = robot.model_tensors_flat(state[0].dtype)
    return call_native_with(call, state, mt, C)


def call_native_with(call: NativeCall, state: list[Tensor], mt, C: Tensor | None = None) -> Tensor:
    """:func:`call_native` with the model tensors ``mt`` given (``C``: their flat values, if known)."""
    dtype = state[0].dtype
    if C is None:
        C = native_constants(mt, dtype)
    if not torch.is_grad_enabled() or not (any(x.requires_grad for x in state)
                                           or any(t.requires_grad for t in mt)):
        return call.value(state, C)
    wanted = [t.requires_grad for t in mt]
    fields = call.fields_read(wanted)
    call.kernel(dtype, True, fields)  # raise now, not in backward, if it is missing
    return _Native.apply(call, C, len(state), tuple(mt), *state, *(mt if any(wanted) else ()))


# ---------------------------------------------------------------- the default path of the public functions
MODES = ("auto", "build", "never", "require")


def _mode_from_environment() -> str:
    mode = os.environ.get("DIFFMECH_NATIVE", "auto") or "auto"
    if mode not in MODES:
        import warnings

        warnings.warn(f"DIFFMECH_NATIVE={mode!r} is not one of {MODES}; using 'auto'", stacklevel=2)
        mode = "auto"
    return mode


_MODE = [_mode_from_environment()]
_CALLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # tree -> {(algorithm, passive, f_ext): call}


def set_native(mode: str) -> str:
    """Choose how the public algorithm functions (``robot.forward_dynamics``, ``diffmech.rnea``, ...)
    use native kernels on the CPU; returns the previous mode.

    * ``"auto"`` (default, or ``$DIFFMECH_NATIVE``): a kernel already built -- in this process or
      stored on disk by an earlier one (:func:`prepare`, :func:`~diffmech.dynamics.compiled`) -- is
      used; otherwise the torch code runs, and nothing is built behind the user's back.
    * ``"build"``: the first call for a tree, algorithm and dtype builds its kernels (seconds to a
      minute, once per machine), later calls use them.
    * ``"never"``: always the torch code.
    * ``"require"``: as ``"build"``, and a call that would leave the native route (another device,
      a ``torch.func`` transform, ``create_graph``, a scene or feature the native code does not serve)
      raises :class:`~diffmech.errors.NativeRouteError` saying why, instead of running the torch code.
    """
    if mode not in MODES:
        raise OptionError(f"set_native: unknown mode {mode!r}; choose from {MODES}")
    old, _MODE[0] = _MODE[0], mode
    for calls in _CALLS.values():
        for call in calls.values():
            call.build = building()
    return old


def native_allowed() -> bool:
    """Whether native code may run at all (every mode but ``"never"``): the one reading of the mode for
    the modules that hold C code of their own (the contact solve, the E2E-SyMo objective)."""
    return _MODE[0] != "never"


def building() -> bool:
    """Whether a missing kernel is built on first use (modes ``"build"`` and ``"require"``)."""
    return _MODE[0] in ("build", "require")


def native_refusal(x: Tensor) -> str | None:
    """Why a call on tensors like ``x`` cannot run native code (``None``: it can): the mode, the
    device, the dtype, an active ``torch.func`` transform or ``torch.compile`` trace."""
    if _MODE[0] == "never":
        return "native kernels off (DIFFMECH_NATIVE=never)"
    if not x.is_cpu:
        return x.device.type
    if x.dtype not in _DTYPES:
        return str(x.dtype).replace("torch.", "")
    if torch._C._are_functorch_transforms_active():
        return "torch.func transform"
    if torch.compiler.is_compiling():
        return "torch.compile"
    return None


def unavailable_reason(err: NativeUnavailable) -> str:
    """A route's reason for a missing kernel."""
    if isinstance(err, NotBuilt):
        return "kernels not built (set_native('build') or `diffmech kernels build`)"
    return "no native kernel: " + str(err).splitlines()[0][:120]


def leave_native(what: str, why: str) -> None:
    """Say that ``what`` leaves the native route because of ``why``: raises
    :class:`~diffmech.errors.NativeRouteError` in mode ``"require"``, else nothing."""
    if _MODE[0] == "require":
        from ..errors import NativeRouteError

        raise NativeRouteError(f"{what}: the native route cannot run ({why}), and DIFFMECH_NATIVE=require "
                               "forbids the torch route")


@contextlib.contextmanager
def native_mode(mode: str):
    """:func:`set_native` for the duration of a ``with`` block."""
    old = set_native(mode)
    try:
        yield
    finally:
        set_native(old)


def default_native(robot, algorithm: str, state: list[Tensor], passive: bool, f_ext: bool) -> Tensor | None:
    """``algorithm`` by native kernels for a public function, or ``None`` where the torch code must
    run: another device or dtype, mimic or ball joints, inside ``torch.func`` transforms or
    ``torch.compile``, mode ``"never"``, or a kernel that is not built (mode ``"auto"``)."""
    x = state[0]
    why = native_refusal(x)
    tree = robot.tree
    if why is None and tree.coords is not None:
        why = "mimic joints"
    if why is None and tree.n_ball:
        why = "ball joints"
    if why is None and tree.nb == 0:
        why = "a static model (no moving joint)"
    if why is not None:
        if _MODE[0] == "require":
            leave_native(f"{robot.name}: {algorithm}", why)
        return None
    calls = _CALLS.get(tree)
    if calls is None:
        calls = _CALLS[tree] = {}
    key = (algorithm, passive, f_ext)
    call = calls.get(key)
    if call is None:
        call = calls[key] = NativeCall(tree, algorithm, passive, f_ext, build=building())
    try:
        return call_native(call, state, robot)
    except NativeUnavailable as err:
        leave_native(f"{robot.name}: {algorithm}", unavailable_reason(err))
        return None


def prepare(robot, algorithms=ALGORITHMS, dtypes=(torch.float64,), *, passive=(True,), f_ext=(False,),
            gradients: bool = True, parameters: bool = False) -> None:
    """Build (or find stored) the native kernels that the default path of the public functions
    uses for ``robot``'s tree, so that later calls -- in this process and in later ones on this
    machine -- run natively (see :func:`set_native`).

    Args:
        algorithms: among ``"forward_dynamics"``, ``"inverse_dynamics"``, ``"mass_matrix"``,
            ``"kinematics"`` (every link's pose and the world motion subspaces:
            :func:`~diffmech.dynamics.kinematics.forward_kinematics` and the contact step's Jacobians) and
            ``"advance"`` (a floating base's position update in the contact step; skipped for a fixed base).
        dtypes: float64 and/or float32.
        passive, f_ext: the variants (joint damping and springs included or not; external forces).
        gradients: also the reverse-mode kernels for gradients w.r.t. the state.
        parameters: also those for the gradients w.r.t. the inertial parameters (masses, centres
            of mass, inertias) -- the kernels system identification uses.

    Raises:
        NativeUnavailable: no C compiler, or a build that failed.
    """
    tree = robot.tree
    if tree.coords is not None:
        raise NativeUnavailable(f"'{robot.name}' has mimic joints, which native kernels do not support")
    if tree.n_ball:
        raise NativeUnavailable(f"'{robot.name}' has ball joints, which native kernels do not support")
    inertial = tuple(FIELDS.index(f) for f in ("body_mass", "body_h", "body_I"))
    for algorithm in algorithms:
        if algorithm not in ALGORITHMS:
            raise OptionError(f"prepare: unknown algorithm {algorithm!r}; choose from {ALGORITHMS}")
        for dtype, p, f in itertools.product(dtypes, passive, f_ext):
            if algorithm in _PLAIN and (f or not p):
                continue  # no external forces and no passive terms in these
            if algorithm == "advance" and not tree.nfree:
                continue  # a floating base's update: nothing to build for a fixed base
            call = NativeCall(tree, algorithm, bool(p), bool(f), build=True)
            call.kernel(dtype)
            if gradients:
                call.kernel(dtype, True, ())
            if parameters:
                call.kernel(dtype, True, inertial)
