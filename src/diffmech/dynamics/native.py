"""Native CPU kernels from lane programs: trace once, emit C, compile, call.

A lane program (:mod:`.lanes`) is a straight-line sequence of elementwise operations on ``(B,)``
tensors. Traced with ``make_fx``, it is a graph whose nodes map one-to-one onto C expressions on
scalars; emitted inside one loop over the batch, the C compiler vectorises it (``omp simd``) and
keeps every intermediate in registers. Nodes that do not depend on the state (products of model
constants) are hoisted out of the loop. The model's tensors are an argument of every call, not
constants of the code, so one kernel serves a robot whatever its parameter values; it is
specialised to the kinematic tree, the joint types and the dtype.

Why not ``torch.compile``: Inductor does fuse a lane program into one loop (with its fusion cap
lifted), but it spends ~30 ms per node doing so: 3 minutes for the iiwa's ABA (6.6k nodes), cold,
per batch shape. The C compiler takes 2-7 s for the same code, and the kernel takes any batch size.

Kernels are stored on disk per user (``$DIFFMECH_CACHE_DIR``, default ``~/.cache/diffmech``; see
:mod:`.kernel_store`) under a hash of their source, the compiler and the CPU. Threads: the batch is
split into one contiguous range per thread (``torch.get_num_threads()``); the call releases the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import operator
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from .kernel_store import FLAGS as _FLAGS  # noqa: F401  (kept importable from here)
from .kernel_store import MVEC_FLAGS as _MVEC  # noqa: F401
from .kernel_store import NativeUnavailable, available, compiler_command, load_kernel

__all__ = ["LaneKernel", "NativeUnavailable", "compiler", "available"]

# Below this many states per thread the call runs on one thread: measured on the iiwa (2 cores), handing
# half of 1024 states to a pool thread made the call slower (555 us vs 247 us on one thread).
MIN_STATES_PER_THREAD = 4096
# States per tile: the inputs of a tile are gathered into batch-last arrays, so each statement is one
# vector operation over the tile.
TILE = 16
# Statements per vectorised loop. One loop over a whole ABA (13.6k statements on a 21-DoF humanoid)
# takes gcc over a minute (register allocation on one huge block); values live across loops go
# through a scratch array in cache.
SEGMENT = int(os.environ.get("DIFFMECH_SEGMENT", 1500))
_CTYPES = {torch.float64: "double", torch.float32: "float"}


def compiler() -> str | None:
    """The C compiler used for native kernels (the first word of :func:`.kernel_store.compiler_command`),
    or ``None``."""
    cmd = compiler_command()
    return cmd[0] if cmd else None


def _build(source: str) -> ctypes.CDLL:
    """Compile ``source`` into a shared library (or load the stored one, see :mod:`.kernel_store`)."""
    if compiler() is None:  # looked up here, so that a test can stand in for the compiler
        raise NativeUnavailable("native kernels need a C compiler (set $CC, or install gcc)")
    key = hashlib.sha256(source.encode()).hexdigest()
    lib, _ = load_kernel(key, lambda: (source, {}), name="lane kernel")
    return lib


# ---------------------------------------------------------------- code generation
class _Emitter:
    """Walks the traced graph and writes one C statement per arithmetic node."""

    def __init__(self, const_shapes: Sequence[torch.Size], ctype: str):
        self.ctype = ctype
        self.const_offsets, off = [], 0
        self.const_strides = []
        for shape in const_shapes:
            self.const_offsets.append(off)
            self.const_strides.append(list(torch.empty(shape, device="meta").stride()))
            off += int(torch.Size(shape).numel())
        self.hoisted: list[str] = []
        self.body: list[str] = []
        self.count = 0

    def literal(self, x) -> str:
        return f"(({self.ctype}){float(x)!r})"

    def new(self, expr: str, lane: bool, deps: list[str]) -> tuple:
        self.count += 1
        name = f"t{self.count}"
        if lane:
            self.body.append((name, expr, deps))
        else:
            self.hoisted.append(f"const {self.ctype} {name} = {expr};")
        return ("lane" if lane else "scalar", name)


_BINARY = {
    "mul": "{0} * {1}", "add": "{0} + {1}", "sub": "{0} - {1}", "div": "{0} / {1}", "rsub": "{1} - {0}",
}
_UNARY = {
    "neg": "-{0}", "reciprocal": "(({t})1) / {0}", "sqrt": "sqrt{f}({0})", "rsqrt": "(({t})1) / sqrt{f}({0})",
    "sin": "sin{f}({0})", "cos": "cos{f}({0})",
}


def _as_lane(k: tuple) -> tuple:
    """A state row as the lane read from its tile array (see :func:`_assemble`); other infos unchanged."""
    return ("lane", f"xs{k[1]}[{k[2]}][i]") if k[0] == "row" else k


def _deps(args: list[tuple]) -> list[str]:
    """The temporaries an expression reads (tile inputs are arrays, readable anywhere)."""
    return [a[1] for a in args if a[0] == "lane" and a[1].startswith("t")]


def _fold_zero(name: str, args: list[tuple], zero: str) -> tuple | None:
    """Simplify an operation with an exact-zero operand (``zeros_like`` or a literal 0): the lane
    programs multiply by the structural zeros of inertias and joint axes. Returns the result's
    info, ``("neg", arg)`` for a negation to emit, or ``None``. Assumes finite operands (``x * 0``
    is taken to be 0 even for a NaN ``x``; outputs still depend on every input through other terms)."""
    z = [a[0] == "scalar" and a[1] == zero for a in args]
    if not any(z):
        return None
    if name == "mul" or (name in ("div", "neg") and z[0]):
        return ("scalar", zero)
    if name == "add":
        return args[1] if z[0] else args[0]
    if name == "sub":
        return args[0] if z[1] else ("neg", args[1])
    if name == "rsub":  # rsub(x, y) = y - x
        return args[1] if z[0] else ("neg", args[0])
    return None


def _emit(graph: torch.fx.Graph, state_rows: Sequence[int], const_shapes, ctype: str) -> tuple[str, list[int]]:
    """C source of ``kernel(state, consts, out, start, stop)`` for ``graph``, and the shape of
    its output per state."""
    n_state = len(state_rows)
    em = _Emitter(const_shapes, ctype)
    aten = torch.ops.aten
    info: dict = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(placeholders):
        if i < n_state:
            info[n] = ("state", i)
        else:
            k = i - n_state
            info[n] = ("const", em.const_offsets[k], em.const_strides[k])
    output = None
    for n in graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            output = n.args[0]
            break
        if n.op != "call_function":
            raise NativeUnavailable(f"native kernel: unsupported graph node {n.op} {n.target}")
        t = n.target
        name = getattr(t, "__name__", str(t)).split(".")[0]
        if t is aten.select.int:
            src, dim, idx = n.args
            k = info[src]
            if k[0] == "state" and dim == 0:
                info[n] = ("row", k[1], idx)
            elif k[0] == "rows" and dim == 0:
                info[n] = k[2].get(idx, ("scalar", em.literal(0)))
            elif k[0] == "const":
                off, strides = k[1], k[2]
                rest = strides[:dim] + strides[dim + 1:]
                off = off + idx * strides[dim]
                info[n] = ("scalar", f"C[{off}]") if not rest else ("const", off, rest)
            else:
                raise NativeUnavailable(f"native kernel: select on {k[0]}")
            continue
        if t in (aten.expand.default, aten.alias.default, aten.clone.default, aten.lift_fresh_copy.default,
                 aten.detach.default):
            info[n] = info[n.args[0]]
            continue
        if t is aten.unbind.int:
            k = info[n.args[0]]
            if k[0] != "state" or (len(n.args) > 1 and n.args[1] != 0):
                raise NativeUnavailable(f"native kernel: unbind of {k[0]}")
            info[n] = ("unbound", k[1])
            continue
        if t is operator.getitem and info[n.args[0]][0] == "unbound":
            info[n] = ("row", info[n.args[0]][1], n.args[1])
            continue
        if t in (aten.zeros_like.default, aten.zeros.default, aten.new_zeros.default):
            val = n.meta.get("val")
            # A zero (rows, B) tensor is a row tensor with no rows; anything smaller is a scalar zero.
            info[n] = ("rows", val.shape[0], {}) if val is not None and val.dim() == 2 else ("scalar", em.literal(0))
            continue
        if t is aten.select_backward.default:  # the cotangent of one row of a (rows, B) input
            grad, sizes, dim, idx = n.args
            if dim != 0 or len(sizes) != 2:
                raise NativeUnavailable("native kernel: select_backward other than of a row")
            info[n] = ("rows", sizes[0], {idx: _as_lane(info[grad])})
            continue
        if t is aten.add.Tensor and all(isinstance(a, torch.fx.Node) and info[a][0] == "rows" for a in n.args):
            (_, nr, x), (_, _, y) = info[n.args[0]], info[n.args[1]]
            merged = dict(x)
            for r, b in y.items():
                merged[r] = b if r not in merged else em.new(f"{merged[r][1]} + {b[1]}", True,
                                                             _deps([merged[r], b]))
            info[n] = ("rows", nr, merged)
            continue
        if t is aten.pow.Tensor_Scalar and n.args[1] in (2, 3):
            k = _as_lane(info[n.args[0]])
            sq = em.new(f"{k[1]} * {k[1]}", k[0] == "lane", _deps([k]))
            info[n] = sq if n.args[1] == 2 else em.new(f"{sq[1]} * {k[1]}", k[0] == "lane", _deps([sq, k]))
            continue
        if t is aten.stack.default:
            if n.kwargs.get("dim", n.args[1] if len(n.args) > 1 else 0) != 0:
                raise NativeUnavailable("native kernel: stack along a dimension other than 0")
            info[n] = ("stack", [info[a] for a in n.args[0]])
            continue
        args = []
        for a in n.args:
            if isinstance(a, torch.fx.Node):
                k = _as_lane(info[a])
                if k[0] in ("lane", "scalar"):
                    args.append(k)
                else:
                    raise NativeUnavailable(f"native kernel: {name} of a non-scalar ({k[0]})")
            elif isinstance(a, (int, float)) and not isinstance(a, bool):
                args.append(("scalar", em.literal(a)))
            else:
                raise NativeUnavailable(f"native kernel: {name} with argument {a!r}")
        if n.kwargs.get("alpha", 1) != 1:
            raise NativeUnavailable(f"native kernel: {name} with alpha")
        folded = _fold_zero(name, args, em.literal(0))
        if folded is not None:
            if folded[0] != "neg":
                info[n] = folded
                continue
            name, args = folded[0], [folded[1]]
        lane = any(a[0] == "lane" for a in args)
        if name in _BINARY and len(args) == 2:
            expr = _BINARY[name].format(args[0][1], args[1][1])
        elif name in _UNARY and len(args) == 1:
            expr = _UNARY[name].format(args[0][1], t=ctype, f="f" if ctype == "float" else "")
        else:
            raise NativeUnavailable(f"native kernel: unsupported operation {t}")
        info[n] = em.new(expr, lane, _deps(args))

    if isinstance(output, (list, tuple)):  # several results: their rows one after the other
        parts = [_flatten(info[o], em.literal(0)) for o in output]
        shape, flat = [sum(p[0][0] if p[0] else 1 for p in parts)], [x for p in parts for x in p[1]]
    else:
        shape, flat = _flatten(info[output], em.literal(0))
    return _assemble(em, state_rows, flat), shape


def _assemble(em: _Emitter, state_rows: Sequence[int], flat: list) -> str:
    """The kernel's C source: a loop over tiles of ``TILE`` states; per tile, gather the inputs
    into batch-last tile arrays, run the statements in ``omp simd`` loops over the tile (segments
    of at most ``SEGMENT`` statements, values live across segments passed through a scratch array),
    and scatter the outputs back to batch-first order."""
    T, n_out = em.ctype, len(flat)
    body = em.body  # (name, expr, deps)
    segments = [body[i:i + SEGMENT] for i in range(0, len(body), SEGMENT)] or [[]]
    where = {name: k for k, seg in enumerate(segments) for name, _, _ in seg}
    outputs: dict[int, list[tuple[int, str]]] = {}
    for k, v in enumerate(flat):
        v = _as_lane(v)
        if v[0] not in ("lane", "scalar"):
            raise NativeUnavailable(f"native kernel: output of kind {v[0]}")
        seg = where.get(v[1], len(segments) - 1)
        outputs.setdefault(seg, []).append((k, v[1]))
    # Values used in a later segment than their own get a scratch slot.
    slots: dict[str, int] = {}
    reads: list[list[str]] = [[] for _ in segments]
    for k, seg in enumerate(segments):
        seen: set[str] = set()
        uses = [d for _, _, deps in seg for d in deps] + [v for _, v in outputs.get(k, [])]
        for d in uses:
            if d in where and where[d] < k and d not in seen:
                seen.add(d)
                slots.setdefault(d, len(slots))
                reads[k].append(d)
    suffix = "f" if T == "float" else ""
    lines = ["#include <math.h>", "#include <stdint.h>", "#include <stdlib.h>", "",
             "#ifdef DIFFMECH_MVEC  /* vector sin/cos from glibc's libmvec, so the loops vectorise */",
             *[f"#pragma omp declare simd notinbranch\n{T} {f}{suffix}({T});" for f in ("sin", "cos")],
             "#endif",
             f"#define TILE {TILE}",
             f"void kernel(void* const* state, const {T}* __restrict C, {T}* __restrict out,",
             "            int64_t start, int64_t stop)", "{"]
    for i in range(len(state_rows)):
        lines.append(f"    const {T}* __restrict in{i} = (const {T}*)state[{i}];")
    lines += [f"    {stmt}" for stmt in em.hoisted]
    tiles = [(f"xs{i}", f"in{i}", r) for i, r in enumerate(state_rows)]
    for name, _, rows in tiles:
        lines.append(f"    {T} {name}[{rows}][TILE] = {{{{0}}}};")
    lines.append(f"    {T} o[{n_out}][TILE];")
    if slots:
        lines.append(f"    {T}* sc = ({T}*)malloc(sizeof({T}) * TILE * {len(slots)});")
    lines += ["    for (int64_t b0 = start; b0 < stop; b0 += TILE) {",
              "        const int64_t n = stop - b0 < TILE ? stop - b0 : TILE;"]
    for name, src, rows in tiles:
        lines.append(f"        for (int64_t i = 0; i < n; ++i) for (int r = 0; r < {rows}; ++r) "
                     f"{name}[r][i] = {src}[(b0 + i) * {rows} + r];")
    for k, seg in enumerate(segments):
        lines += ["        #pragma omp simd", "        for (int i = 0; i < TILE; ++i) {"]
        lines += [f"            const {T} {d} = sc[{slots[d]} * TILE + i];" for d in reads[k]]
        for name, expr, _ in seg:
            lines.append(f"            const {T} {name} = {expr};")
            if name in slots:
                lines.append(f"            sc[{slots[name]} * TILE + i] = {name};")
        lines += [f"            o[{j}][i] = {v};" for j, v in outputs.get(k, [])]
        lines.append("        }")
    lines += [f"        for (int64_t i = 0; i < n; ++i) for (int k = 0; k < {n_out}; ++k) "
              f"out[(b0 + i) * {n_out} + k] = o[k][i];", "    }"]
    if slots:
        lines.append("    free(sc);")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _flatten(node, zero: str) -> tuple[list[int], list]:
    """Shape and row-major leaves of a (nested) stack of lanes, or of a row tensor."""
    if node[0] == "rows":
        return [node[1]], [node[2].get(r, ("scalar", zero)) for r in range(node[1])]
    if node[0] != "stack":
        return [], [node]
    parts = [_flatten(x, zero) for x in node[1]]
    inner = parts[0][0]
    if any(p[0] != inner for p in parts):
        raise NativeUnavailable("native kernel: ragged output")
    return [len(parts), *inner], [leaf for p in parts for leaf in p[1]]


def vjp_program(fn: Callable[..., Tensor], n_state: int) -> Callable[..., tuple[Tensor, ...]]:
    """The reverse-mode program of a lane program: ``(*state, g, *consts) -> (cotangent of each
    state tensor)`` for the output cotangent ``g`` (the output's shape, batch-last). Traced, the
    autograd graph is elementwise on lanes too (row cotangents are collected row by row), so the
    native kernel recomputes the forward pass in registers and saves nothing but the inputs."""

    def program(*args: Tensor) -> tuple[Tensor, ...]:
        state, g, consts = args[:n_state], args[n_state], args[n_state + 1:]
        with torch.enable_grad():
            state = [x.detach().requires_grad_(True) for x in state]
            out = fn(*state, *consts)
            return torch.autograd.grad(out, state, g)

    return program


class LaneKernel:
    """A lane program compiled to a native CPU kernel. Called batch-first:
    ``kernel([x_1 (B, rows_1), ...], consts) -> (B, *shape)``.

    Args:
        fn: ``fn(*state, *consts) -> Tensor``, traced once: the state tensors batch-last,
            ``(rows_i, B)``, read by integer row indices; the constants any shape, read by integer
            indices; every operation elementwise on ``(B,)`` lanes (see ``_BINARY``/``_UNARY``); the
            result a (nested) ``torch.stack`` of lanes, ``(*shape, B)``.
        state_rows: ``rows_i`` of each state tensor.
        consts: example constants (shapes and dtype; their values are passed at each call).
        dtype: ``torch.float64`` or ``torch.float32``.

    Raises:
        NativeUnavailable: no C compiler, an unsupported dtype or operation, or a failed build.
    """

    def __init__(self, fn: Callable[..., Tensor], state_rows: Sequence[int], consts: Sequence[Tensor],
                 dtype: torch.dtype):
        if dtype not in _CTYPES:
            raise NativeUnavailable(f"native kernel: dtype {dtype} (float64 and float32 only)")
        from torch.fx.experimental.proxy_tensor import make_fx

        self.dtype, self.state_rows = dtype, list(state_rows)
        self._consts: tuple | None = None
        self.const_shapes = [c.shape for c in consts]
        examples = [torch.zeros(r, 2, dtype=dtype) for r in state_rows]
        const_examples = [torch.zeros(c.shape, dtype=dtype) for c in consts]
        with torch.no_grad():
            gm = make_fx(fn, tracing_mode="fake")(*examples, *const_examples)
        self.source, self.out_shape = _emit(gm.graph, self.state_rows, self.const_shapes, _CTYPES[dtype])
        self._fn = _build(self.source).kernel
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]

    def _flat_constants(self, consts: Sequence[Tensor]) -> Tensor:
        """The constants in one flat array, reused while the same tensors are passed unchanged
        (the cache holds them, so their identities cannot be recycled)."""
        key = tuple((id(c), c._version) for c in consts)
        if self._consts is not None and self._consts[0] == key:
            return self._consts[2]
        flat = torch.cat([c.detach().to("cpu", self.dtype).reshape(-1) for c in consts]) if consts else \
            torch.empty(0, dtype=self.dtype)
        self._consts = (key, tuple(consts), flat)
        return flat

    def __call__(self, state: Sequence[Tensor], consts: Sequence[Tensor]) -> Tensor:
        """Evaluate on ``state`` tensors ``(B, rows_i)`` and the model constants; ``(B, *out_shape)``."""
        B = state[0].shape[0]
        dev = torch.device("cpu")
        xs = [s.detach().to(dev, self.dtype).contiguous() for s in state]
        C = self._flat_constants(consts)
        out = torch.empty(B, *self.out_shape, dtype=self.dtype)
        keep = (xs, C, out)  # the pointers below are only valid while these live
        state_p = (ctypes.c_void_p * max(len(xs), 1))(*[x.data_ptr() for x in xs])
        threads = max(1, min(torch.get_num_threads(), B // MIN_STATES_PER_THREAD))
        args = (state_p, C.data_ptr(), out.data_ptr())
        if threads == 1:
            self._fn(*args, 0, B)
        else:
            bounds = [B * k // threads for k in range(threads + 1)]
            rest = [_pool(threads - 1).submit(self._fn, *args, bounds[k], bounds[k + 1]) for k in range(1, threads)]
            self._fn(*args, bounds[0], bounds[1])
            for f in rest:
                f.result()
        del keep
        return out


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="diffmech-native")
