"""Symbolic tracing of lane programs, their reverse mode, and their translation to C statements.

A lane program (:mod:`.lanes`) is straight-line scalar code: it indexes rows of its state inputs
and elements of the model constants and combines them with ``+ - * /``, ``sin``, ``cos``,
``sqrt``/``rsqrt``. Run on :class:`Sym` values instead of tensors, it records that code as a
graph of scalar operations (constant operands are folded, exact zeros simplified, repeated
expressions shared), at a few microseconds per operation.

The reverse mode is a second sweep over the recorded graph, written into the same graph: the
adjoint of every node is accumulated from its consumers (``mul``: ``a y`` and ``a x``, ``sin``:
``a cos x``, ...), seeded by the output cotangents, a state input of the reverse program. Adjoints
of model constants (learnable parameters) are lanes too -- one value per state -- that the kernel
sums over the batch.

:func:`emit` turns the recorded outputs into the statement list that :func:`.native.assemble`
wraps in the vectorised loop: nodes that depend on no state input are hoisted out of the loop.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .kernel_store import NativeUnavailable

__all__ = ["Graph", "Sym", "StateRows", "ConstField", "trace", "vjp_outputs", "emit"]

_FOLD = {
    "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / y,
    "neg": lambda x: -x, "sin": math.sin, "cos": math.cos, "sqrt": math.sqrt, "rsqrt": lambda x: 1.0 / math.sqrt(x),
}


class Graph:
    """The recorded scalar operations. Node ``k`` is ``ops[k] = (op, args)``: ``("in", (i, row))``
    a row of state input ``i``; ``("c", (offset,))`` an element of the flat constants;
    ``("lit", (value,))`` a number; otherwise an operation of ``_FOLD`` on node indices."""

    def __init__(self):
        self.ops: list[tuple[str, tuple]] = []
        self.lane: list[bool] = []  # depends on a state input
        self._memo: dict[tuple, int] = {}

    def add(self, op: str, args: tuple) -> int:
        key = (op, args)
        k = self._memo.get(key)
        if k is None:
            k = len(self.ops)
            self.ops.append(key)
            self.lane.append(op == "in" or (op not in ("c", "lit") and any(self.lane[a] for a in args)))
            self._memo[key] = k
        return k

    def lit(self, x: float) -> Sym:
        return Sym(self, self.add("lit", (float(x),)))

    def value(self, k: int) -> float | None:
        op, args = self.ops[k]
        return args[0] if op == "lit" else None

    def op(self, name: str, *xs) -> Sym:
        """``name(*xs)`` with constant folding and the exact simplifications of zero and one."""
        ids = [self._id(x) for x in xs]
        vals = [self.value(k) for k in ids]
        if all(v is not None for v in vals):
            return self.lit(_FOLD[name](*vals))
        if name == "mul":
            if 0.0 in vals:  # finite operands assumed: x * 0 = 0
                return self.lit(0.0)
            if vals[0] == 1.0:
                return Sym(self, ids[1])
            if vals[1] == 1.0:
                return Sym(self, ids[0])
            if vals[0] == -1.0:
                return self.op("neg", Sym(self, ids[1]))
            if vals[1] == -1.0:
                return self.op("neg", Sym(self, ids[0]))
        elif name == "add":
            if vals[0] == 0.0:
                return Sym(self, ids[1])
            if vals[1] == 0.0:
                return Sym(self, ids[0])
        elif name == "sub":
            if vals[1] == 0.0:
                return Sym(self, ids[0])
            if vals[0] == 0.0:
                return self.op("neg", Sym(self, ids[1]))
        elif name == "div":
            if vals[0] == 0.0:
                return self.lit(0.0)
            if vals[1] == 1.0:
                return Sym(self, ids[0])
        elif name == "neg" and self.ops[ids[0]][0] == "neg":
            return Sym(self, self.ops[ids[0]][1][0])
        if name in ("add", "mul") and ids[0] > ids[1]:
            ids = [ids[1], ids[0]]  # commutative: one key for both orders
        return Sym(self, self.add(name, tuple(ids)))

    def _id(self, x) -> int:
        if isinstance(x, Sym):
            if x.g is not self:
                raise NativeUnavailable("lane program: values of two traces mixed")
            return x.k
        if isinstance(x, (int, float)) and not isinstance(x, bool):
            return self.add("lit", (float(x),))
        if isinstance(x, torch.Tensor) and x.dim() == 0:
            raise NativeUnavailable("lane program: a tensor constant inside the program (pass it as a constant)")
        raise NativeUnavailable(f"lane program: unsupported operand {type(x).__name__}")


class Sym:
    """One scalar of a lane program (a node of a :class:`Graph`); behaves as a ``(B,)`` lane."""

    __slots__ = ("g", "k")

    def __init__(self, g: Graph, k: int):
        self.g, self.k = g, k

    def __add__(self, o):
        return self.g.op("add", self, o)

    def __radd__(self, o):
        return self.g.op("add", o, self)

    def __sub__(self, o):
        return self.g.op("sub", self, o)

    def __rsub__(self, o):
        return self.g.op("sub", o, self)

    def __mul__(self, o):
        return self.g.op("mul", self, o)

    def __rmul__(self, o):
        return self.g.op("mul", o, self)

    def __truediv__(self, o):
        return self.g.op("div", self, o)

    def __rtruediv__(self, o):
        return self.g.op("div", o, self)

    def __neg__(self):
        return self.g.op("neg", self)

    def __pow__(self, p):
        if p == 2:
            return self * self
        if p == 3:
            return self * self * self
        raise NativeUnavailable(f"lane program: power {p}")

    def dim(self) -> int:
        return 1

    def expand_as(self, other) -> Sym:
        return self

    def __bool__(self):
        raise NativeUnavailable("lane program: a branch on a traced value (lane programs are straight-line code)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        g = next(a.g for a in _leaves(args) if isinstance(a, Sym))
        name = getattr(func, "__name__", str(func))
        if name in ("sin", "cos", "sqrt", "rsqrt", "neg") and len(args) == 1 and not kwargs:
            return g.op(name, args[0])
        if name == "reciprocal" and len(args) == 1:
            return g.op("div", 1.0, args[0])
        if name == "zeros_like":
            return g.lit(0.0)
        if name == "stack":
            if kwargs.get("dim", args[1] if len(args) > 1 else 0) != 0:
                raise NativeUnavailable("lane program: stack along a dimension other than 0")
            return Stacked([x if isinstance(x, (Sym, Stacked)) else Sym(g, g._id(x)) for x in args[0]])
        raise NativeUnavailable(f"lane program: unsupported operation {name}")


def _leaves(args):
    for a in args:
        if isinstance(a, (list, tuple)):
            yield from _leaves(a)
        else:
            yield a


class Stacked:
    """``torch.stack`` of lanes (or of stacks): the output of a lane program."""

    def __init__(self, parts: list):
        self.parts = parts

    def flatten(self) -> tuple[list[int], list[Sym]]:
        shapes_leaves = [p.flatten() if isinstance(p, Stacked) else ([], [p]) for p in self.parts]
        inner = shapes_leaves[0][0]
        if any(s != inner for s, _ in shapes_leaves):
            raise NativeUnavailable("lane program: ragged output")
        return [len(self.parts), *inner], [x for _, leaves in shapes_leaves for x in leaves]

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", "") == "stack":
            return Stacked(list(args[0]))
        raise NativeUnavailable(f"lane program: {getattr(func, '__name__', func)} of a stacked output")


class StateRows:
    """A state input ``(rows, B)``: ``x[r]`` is the lane of row ``r``."""

    def __init__(self, g: Graph, index: int, rows: int):
        self.g, self.index, self.rows = g, index, rows
        self.shape = torch.Size([rows, 1])

    def __getitem__(self, r):
        if not isinstance(r, int) or not -self.rows <= r < self.rows:
            raise NativeUnavailable(f"lane program: state input {self.index} read at {r!r} (rows: {self.rows})")
        return Sym(self.g, self.g.add("in", (self.index, r % self.rows)))

    def dim(self) -> int:
        return 2


class ConstField:
    """A model constant of any shape at ``offset`` in the flat constants; indexing it (integers,
    slices) down to one element gives that element as a :class:`Sym`."""

    def __init__(self, g: Graph, offset: int, shape: Sequence[int], index: np.ndarray | None = None):
        self.g, self.offset = g, offset
        self.index = np.arange(math.prod(shape)).reshape(tuple(shape)) if index is None else index
        self.shape = torch.Size(self.index.shape)

    def __getitem__(self, key):
        sub = self.index[key]
        if np.ndim(sub) == 0:
            return Sym(self.g, self.g.add("c", (self.offset + int(sub),)))
        return ConstField(self.g, self.offset, sub.shape, sub)

    def dim(self) -> int:
        return self.index.ndim


def trace(fn: Callable, state_rows: Sequence[int], const_shapes: Sequence[Sequence[int]]
          ) -> tuple[Graph, list[int], list[Sym], list[int]]:
    """Run ``fn(*state, *consts)`` on symbols. Returns the graph, the output shape, the output
    leaves (row-major) and the offset of each constant in the flat constants."""
    g = Graph()
    state = [StateRows(g, i, r) for i, r in enumerate(state_rows)]
    offsets, off = [], 0
    for shape in const_shapes:
        offsets.append(off)
        off += math.prod(shape)
    consts = [ConstField(g, o, s) for o, s in zip(offsets, const_shapes)]
    with torch.no_grad():
        out = fn(*state, *consts)
    if isinstance(out, Sym):
        return g, [], [out], offsets
    if not isinstance(out, Stacked):
        raise NativeUnavailable(f"lane program: the output must be a stack of lanes, not {type(out).__name__}")
    shape, leaves = out.flatten()
    return g, shape, leaves, offsets


def vjp_outputs(g: Graph, outputs: Sequence[Sym], cotangent_input: int, state_rows: Sequence[int],
                const_elements: Sequence[int]) -> tuple[list[Sym], list[Sym]]:
    """The reverse mode of ``outputs``, written into ``g``: with the output cotangents as rows of
    state input ``cotangent_input``, the adjoints of every row of the state inputs
    ``0 .. len(state_rows) - 1`` and of the flat-constant elements ``const_elements``."""
    wrt_in = {g.add("in", (i, r)) for i, n in enumerate(state_rows) for r in range(n)}
    wrt_c = {g.add("c", (c,)) for c in const_elements}
    n0 = len(g.ops)
    active = [False] * n0
    for k in range(n0):
        op, args = g.ops[k]
        active[k] = k in wrt_in or k in wrt_c or (op not in ("in", "c", "lit") and any(active[a] for a in args))
    adj: dict[int, Sym] = {}

    def acc(k: int, v: Sym) -> None:
        if active[k]:
            adj[k] = v if k not in adj else adj[k] + v

    for j, y in enumerate(outputs):
        acc(y.k, Sym(g, g.add("in", (cotangent_input, j))))
    for k in range(n0 - 1, -1, -1):
        a = adj.get(k)
        if a is None:
            continue
        op, args = g.ops[k]
        if op in ("in", "c", "lit"):
            continue
        x = Sym(g, args[0])
        if op == "add":
            acc(args[0], a)
            acc(args[1], a)
        elif op == "sub":
            acc(args[0], a)
            acc(args[1], -a)
        elif op == "mul":
            y = Sym(g, args[1])
            acc(args[0], a * y)
            acc(args[1], a * x)
        elif op == "div":
            y = Sym(g, args[1])
            q = Sym(g, k)
            acc(args[0], a / y)
            acc(args[1], -(a * q) / y)
        elif op == "neg":
            acc(args[0], -a)
        elif op == "sin":
            acc(args[0], a * g.op("cos", x))
        elif op == "cos":
            acc(args[0], -(a * g.op("sin", x)))
        elif op == "sqrt":
            acc(args[0], (0.5 * a) / Sym(g, k))
        elif op == "rsqrt":
            r = Sym(g, k)
            acc(args[0], (-0.5 * a) * (r * r * r))
        else:  # pragma: no cover - every op of _FOLD is handled above
            raise NativeUnavailable(f"lane program: no reverse mode for {op}")
    zero = g.lit(0.0)
    state_adj = [adj.get(g.add("in", (i, r)), zero) for i, n in enumerate(state_rows) for r in range(n)]
    const_adj = [adj.get(g.add("c", (c,)), zero) for c in const_elements]
    return state_adj, const_adj


_CALLS = {"sin": "sin{f}({0})", "cos": "cos{f}({0})", "sqrt": "sqrt{f}({0})", "rsqrt": "(({t})1) / sqrt{f}({0})"}
_INFIX = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "{0} / {1}", "neg": "-{0}"}


def emit(g: Graph, outputs: Sequence[Sym], ctype: str) -> tuple[list[str], list[tuple[str, str, list[str]]],
                                                                 list[tuple[str, str]]]:
    """C statements computing ``outputs``: ``(hoisted, body, out)`` -- hoisted declarations that
    read only constants (``C[k]``), loop-body statements ``(name, expression, temporaries read)``
    (a state row reads its tile array ``xs<i>[<row>][i]``), and each output as ``("lane" |
    "scalar", expression)``."""
    need = set()
    stack = [y.k for y in outputs]
    while stack:
        k = stack.pop()
        if k in need:
            continue
        need.add(k)
        op, args = g.ops[k]
        if op not in ("in", "c", "lit"):
            stack.extend(args)
    f = "f" if ctype == "float" else ""
    names: dict[int, str] = {}
    hoisted: list[str] = []
    body: list[tuple[str, str, list[str]]] = []
    for k in sorted(need):
        op, args = g.ops[k]
        if op == "in":
            names[k] = f"xs{args[0]}[{args[1]}][i]"
            continue
        if op == "c":
            names[k] = f"C[{args[0]}]"
            continue
        if op == "lit":
            names[k] = f"(({ctype}){args[0]!r})"
            continue
        ins = [names[a] for a in args]
        expr = (_CALLS[op].format(*ins, t=ctype, f=f) if op in _CALLS else _INFIX[op].format(*ins))
        name = f"t{k}"
        names[k] = name
        if g.lane[k]:
            body.append((name, expr, [names[a] for a in args if g.lane[a] and names[a].startswith("t")]))
        else:
            hoisted.append(f"const {ctype} {name} = {expr};")
    out = [("lane" if g.lane[y.k] else "scalar", names[y.k]) for y in outputs]
    return hoisted, body, out
