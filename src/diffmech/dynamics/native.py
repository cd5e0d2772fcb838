"""Native CPU kernels from lane programs: trace once, emit C, compile, call.

A lane program (:mod:`.lanes`) is a straight-line sequence of scalar operations, each on one
``(B,)`` lane per state. Traced symbolically (:mod:`.lanetrace`, with its reverse mode when
gradients are wanted), it becomes C statements on scalars; emitted inside one loop over the batch,
the C compiler vectorises them (``omp simd``) and keeps every intermediate in registers.
Statements that do not depend on the state (products of model constants) are hoisted out of the
loop. The model's tensors are an argument of every call, not constants of the code, so one kernel
serves a robot whatever its parameter values; it is specialised to the kinematic tree, the joint
types and the dtype.

Why not ``torch.compile``: Inductor does fuse a lane program into one loop (with its fusion cap
lifted), but it spends ~30 ms per node doing so: 3 minutes for the iiwa's ABA (6.6k nodes), cold,
per batch shape. The symbolic trace takes milliseconds, the C compiler seconds, and the kernel
takes any batch size.

Kernels are stored on disk per user (``$DIFFMECH_CACHE_DIR``, default ``~/.cache/diffmech``; see
:mod:`.kernel_store`). Threads: the batch is split into one contiguous range per thread
(``torch.get_num_threads()``, from ``MIN_STATES_PER_THREAD`` states per thread); the call releases
the GIL.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch
from torch import Tensor

from . import lanetrace
from .kernel_store import FLAGS as _FLAGS  # noqa: F401  (kept importable from here)
from .kernel_store import MVEC_FLAGS as _MVEC  # noqa: F401
from .kernel_store import NativeUnavailable, available, compiler_command, load_kernel

__all__ = ["LaneKernel", "NativeUnavailable", "compiler", "available", "lane_kernel", "trace_and_emit",
           "flat_constants", "kernel_of"]

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


# ---------------------------------------------------------------- code generation
def _assemble(T: str, hoisted: list[str], body: list[tuple[str, str, list[str]]], state_rows: Sequence[int],
              flat: list[tuple[str, str]], n_reduced: int = 0) -> str:
    """The kernel's C source: a loop over tiles of ``TILE`` states; per tile, gather the inputs
    into batch-last tile arrays, run the statements in ``omp simd`` loops over the tile (segments
    of at most ``SEGMENT`` statements, values live across segments passed through a scratch array),
    and scatter the outputs back to batch-first order.

    ``hoisted``: declarations before the loop (they read only the constants ``C``); ``body``: the
    loop's statements ``(name, expression, temporaries read)``; ``flat``: the outputs
    ``("lane" | "scalar", expression)``. The last ``n_reduced`` outputs are summed over the states
    ``start..stop`` (in double precision) into ``red`` instead of written per state (the cotangents
    of model constants)."""
    n_out = len(flat)
    n_plain = n_out - n_reduced
    segments = [body[i:i + SEGMENT] for i in range(0, len(body), SEGMENT)] or [[]]
    where = {name: k for k, seg in enumerate(segments) for name, _, _ in seg}
    outputs: dict[int, list[tuple[int, str]]] = {}
    for k, v in enumerate(flat):
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
             "            double* __restrict red, int64_t start, int64_t stop)", "{"]
    for i in range(len(state_rows)):
        lines.append(f"    const {T}* __restrict in{i} = (const {T}*)state[{i}];")
    lines += [f"    {stmt}" for stmt in hoisted]
    tiles = [(f"xs{i}", f"in{i}", r) for i, r in enumerate(state_rows)]
    for name, _, rows in tiles:
        lines.append(f"    {T} {name}[{rows}][TILE] = {{{{0}}}};")
    lines.append(f"    {T} o[{n_out}][TILE];")
    if n_reduced:
        lines.append(f"    double acc[{n_reduced}] = {{0}};")
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
    if n_plain:
        lines.append(f"        for (int64_t i = 0; i < n; ++i) for (int k = 0; k < {n_plain}; ++k) "
                     f"out[(b0 + i) * {n_plain} + k] = o[k][i];")
    if n_reduced:
        lines.append(f"        for (int k = 0; k < {n_reduced}; ++k) for (int64_t i = 0; i < n; ++i) "
                     f"acc[k] += (double)o[{n_plain} + k][i];")
    lines.append("    }")
    if n_reduced:
        lines.append(f"    for (int k = 0; k < {n_reduced}; ++k) red[k] = acc[k];")
    if slots:
        lines.append("    free(sc);")
    lines.append("}")
    return "\n".join(lines) + "\n"


def trace_and_emit(fn: Callable, state_rows: Sequence[int], const_shapes: Sequence[Sequence[int]],
                   dtype: torch.dtype, vjp_fields: Sequence[int] | None = None) -> tuple[str, dict]:
    """Trace the lane program ``fn`` (see :class:`LaneKernel`) symbolically and emit its C source;
    returns ``(source, meta)`` with what :class:`LaneKernel` needs to call it.

    ``vjp_fields``: emit the reverse mode instead: one more state input, the output cotangent
    ``g`` (the output's elements as rows); outputs the cotangents of every state row, then, summed
    over the batch, of every element of the constants ``vjp_fields`` (indices into the constants).
    """
    if dtype not in _CTYPES:
        raise NativeUnavailable(f"native kernel: dtype {dtype} (float64 and float32 only)")
    g, out_shape, outputs, offsets = lanetrace.trace(fn, state_rows, const_shapes)
    rows = list(state_rows)
    n_reduced = 0
    if vjp_fields is not None:
        elements = [offsets[k] + e for k in vjp_fields for e in range(math.prod(const_shapes[k]))]
        state_adj, const_adj = lanetrace.vjp_outputs(g, outputs, len(rows), rows, elements)
        rows.append(len(outputs))
        outputs = state_adj + const_adj
        out_shape = [len(state_adj)]
        n_reduced = len(const_adj)
    hoisted, body, flat = lanetrace.emit(g, outputs, _CTYPES[dtype])
    source = _assemble(_CTYPES[dtype], hoisted, body, rows, flat, n_reduced)
    meta = {"state_rows": rows, "out_shape": [int(x) for x in out_shape], "n_reduced": n_reduced,
            "dtype": str(dtype).removeprefix("torch.")}
    return source, meta


class LaneKernel:
    """A lane program compiled to a native CPU kernel. Called batch-first:
    ``kernel([x_1 (B, rows_1), ...], C) -> (B, *shape)`` (and the reduced sums, if any).

    A lane program ``fn(*state, *consts) -> Tensor`` reads the state tensors batch-last,
    ``(rows_i, B)``, by integer row indices, and the constants (any shape) by integer indices;
    every operation is elementwise on ``(B,)`` lanes (see ``_BINARY``/``_UNARY``); the result is a
    (nested) ``torch.stack`` of lanes, ``(*shape, B)``.

    Build one with :func:`lane_kernel`; ``C`` is the constants flattened and concatenated in order.
    """

    def __init__(self, lib: ctypes.CDLL, meta: dict):
        self.dtype = getattr(torch, meta["dtype"])
        self.state_rows = list(meta["state_rows"])
        self.out_shape = tuple(meta["out_shape"])
        self.n_reduced = int(meta["n_reduced"])
        self._fn = lib.kernel
        self._fn.restype = None
        self._fn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int64, ctypes.c_int64]
        self._ptrs = ctypes.c_void_p * max(len(self.state_rows), 1)
        self._out_rows = math.prod(self.out_shape)

    def __call__(self, state: Sequence[Tensor], C: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """Evaluate on ``state`` tensors ``(B, rows_i)`` -- contiguous, in the kernel's dtype, on the
        CPU -- and the flat constants ``C``.

        Returns ``(B, *out_shape)``, and with reduced outputs also their sum over the batch
        ``(n_reduced,)`` (float64)."""
        B = state[0].shape[0]
        out = torch.empty((B, self._out_rows), dtype=self.dtype)
        if B < 2 * MIN_STATES_PER_THREAD and not self.n_reduced:  # the common small call, with little Python
            self._fn(self._ptrs(*[x.data_ptr() for x in state]), C.data_ptr(), out.data_ptr(), None, 0, B)
            return out if len(self.out_shape) == 1 else out.view(B, *self.out_shape)
        threads = 1 if B < 2 * MIN_STATES_PER_THREAD else min(torch.get_num_threads(), B // MIN_STATES_PER_THREAD)
        red = torch.zeros(threads, self.n_reduced, dtype=torch.float64) if self.n_reduced else None
        state_p = self._ptrs(*[x.data_ptr() for x in state])
        cp, op = C.data_ptr(), out.data_ptr()
        if threads == 1:
            self._fn(state_p, cp, op, red.data_ptr() if red is not None else None, 0, B)
        else:
            bounds = [B * k // threads for k in range(threads + 1)]
            step = self.n_reduced * 8
            rp = red.data_ptr() if red is not None else 0
            rest = [_pool(threads - 1).submit(self._fn, state_p, cp, op, rp + k * step if red is not None else None,
                                              bounds[k], bounds[k + 1]) for k in range(1, threads)]
            self._fn(state_p, cp, op, rp if red is not None else None, bounds[0], bounds[1])
            for f in rest:
                f.result()
        if len(self.out_shape) != 1:
            out = out.view(B, *self.out_shape)
        if red is not None:
            return out, red.sum(0)
        return out


def lane_kernel(key: str, name: str, build: Callable[[], tuple[str, dict]] | None) -> LaneKernel:
    """The :class:`LaneKernel` stored under ``key`` (this process's memo, the disk store, or built
    by ``build() -> (source, meta)``, e.g. a :func:`trace_and_emit` call; ``None``: do not build).

    Raises:
        NativeUnavailable: no C compiler, an unsupported dtype or operation, a failed build, or
            (``build=None``) nothing stored.
    """
    lib, meta = load_kernel(key, build, name=name)
    return LaneKernel(lib, meta)


def kernel_of(fn: Callable[..., Tensor], state_rows: Sequence[int], consts: Sequence[Tensor],
              dtype: torch.dtype) -> LaneKernel:
    """A kernel of a lane program keyed by its C source (for programs without a structural key)."""
    source, meta = trace_and_emit(fn, state_rows, [c.shape for c in consts], dtype)
    return lane_kernel(hashlib.sha256(source.encode()).hexdigest(), "lane kernel", lambda: (source, meta))


def flat_constants(consts: Sequence[Tensor], dtype: torch.dtype) -> Tensor:
    """The constants flattened and concatenated (on the CPU, in ``dtype``), as kernels take them."""
    if not consts:
        return torch.empty(0, dtype=dtype)
    return torch.cat([c.detach().to("cpu", dtype).reshape(-1) for c in consts])


@functools.cache
def _pool(threads: int) -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="diffmech-native")
