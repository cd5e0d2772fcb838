"""How many CPU threads a diffmech call uses: decided here, beside the route (see ``BENCHMARKS.md``,
"Threads").

torch's intra-op threads help on an idle machine and hurt on a busy one: after a parallel region its
OpenMP workers spin for a while, and when other processes keep the cores busy they take the core the
calling thread needs. Measured on 2 cores with other processes running, inverse dynamics of a 7-DoF arm
at a batch of 64 took 0.9 ms at one thread and 91 ms at two; at a batch of 16384, 46 ms against
633 ms. Policy ``"auto"`` (the default) therefore runs a call on one thread when the machine has no
core to spare (the one-minute load average, which counts this process's own running thread, less
than :data:`SPARE_CORES` below the CPU count) or when its work is too small for a parallel region to
pay (:data:`SMALL_WORK`); otherwise torch's own setting stands.

``DIFFMECH_THREADS`` (or :func:`set_threads`): ``"auto"``, ``"torch"`` (never touch torch's setting),
or a number of threads for every call. The decision is made per call of a public function (the
dynamics functions, ``rollout``, ``contact_step``) and by the backward passes diffmech implements;
torch's thread count is restored on return. It is process-wide state, so threads of the user's that
call diffmech concurrently see each other's setting while a call runs.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading
import time
from collections.abc import Callable

import torch

from ..errors import OptionError

__all__ = ["SMALL_WORK", "SPARE_CORES", "set_threads", "threads_for", "using", "hold", "one_thread", "decided",
           "decided_backward", "policy"]

# Work (batch x nv^2) below which a call runs on one thread whatever the load: a parallel region
# cannot pay for itself there, and its workers' spinning can only cost.
SMALL_WORK = 1 << 12
# CPUs minus the load average from which another core counts as free: a process running alone on an
# otherwise idle machine puts the load near 1, plus the background's fraction of a core.
SPARE_CORES = 0.5


def _from_environment() -> str | int:
    raw = (os.environ.get("DIFFMECH_THREADS") or "auto").strip()
    if raw in ("auto", "torch"):
        return raw
    try:
        n = int(raw)
    except ValueError:
        n = 0
    if n < 1:
        import warnings

        warnings.warn(f"DIFFMECH_THREADS={raw!r} is not 'auto', 'torch' or a positive integer; using 'auto'",
                      stacklevel=2)
        return "auto"
    return n


_POLICY: list[str | int] = [_from_environment()]
_LOAD: list[float] = [0.0, -1.0]  # (time read, spare cores) of the last load reading
_CPUS = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def policy() -> str | int:
    """The current policy: ``"auto"``, ``"torch"`` or a thread count."""
    return _POLICY[0]


def set_threads(value: str | int) -> str | int:
    """Set the thread policy (see the module docstring); returns the previous one."""
    if not (value in ("auto", "torch") or (isinstance(value, int) and not isinstance(value, bool) and value >= 1)):
        raise OptionError(f"set_threads: {value!r} is not 'auto', 'torch' or a positive integer")
    old, _POLICY[0] = _POLICY[0], value
    return old


def _spare_cores() -> float:
    """CPUs minus the one-minute load average (this process's running thread included in both),
    read at most once a second."""
    now = time.monotonic()
    if now - _LOAD[0] > 1.0:
        try:
            load = os.getloadavg()[0]
        except (OSError, AttributeError):  # no load average (not POSIX): assume busy, one thread
            load = float(_CPUS)
        _LOAD[0], _LOAD[1] = now, _CPUS - load
    return _LOAD[1]


def threads_for(work: int) -> int | None:
    """The thread count for a call of ``work`` floating-point operations' scale, ``None``: leave
    torch's setting."""
    p = _POLICY[0]
    if p == "torch":
        return None
    if isinstance(p, int):
        return p
    if work >= SMALL_WORK and _spare_cores() >= SPARE_CORES:
        return None
    return 1


_LOCK = threading.Lock()
_HELD = [0, 1, 1]  # holds active, the count they set, torch's count to give back when the last leaves


class hold:
    """Context: torch runs on ``n`` threads inside. Re-entrant and shared between Python threads: the
    first hold to enter sets the count (later ones, nested or concurrent, keep it) and the last to
    leave gives torch's own count back, since the setting is process-wide."""

    __slots__ = ("n",)

    def __init__(self, n: int):
        self.n = n

    def __enter__(self) -> None:
        with _LOCK:
            if _HELD[0] == 0:
                _HELD[1], _HELD[2] = self.n, torch.get_num_threads()
                if _HELD[2] != self.n:
                    torch.set_num_threads(self.n)
            _HELD[0] += 1

    def __exit__(self, *exc) -> None:
        with _LOCK:
            _HELD[0] -= 1
            if _HELD[0] == 0 and _HELD[2] != _HELD[1]:
                torch.set_num_threads(_HELD[2])


def one_thread() -> hold:
    """Context: one thread whatever the policy, for the operations that need it (MKL's small products
    and batched LU, see :mod:`~diffmech.dynamics._jacobian` and :mod:`~diffmech.dynamics.aba`)."""
    return hold(1)


def using(work: int) -> contextlib.AbstractContextManager:
    """Context: the thread count :func:`threads_for` decides for ``work``."""
    n = threads_for(work)
    if n is None or (_HELD[0] == 0 and n == torch.get_num_threads()):
        return contextlib.nullcontext()
    return hold(n)


def work_of(x, nv: int) -> int:
    """The work scale ``batch x nv^2`` of a call on the state tensor ``x`` (``(..., n)``)."""
    if not isinstance(x, torch.Tensor) or x.dim() == 0:
        return nv * nv
    return (x.numel() // max(x.shape[-1], 1)) * nv * nv


def decided(fn: Callable) -> Callable:
    """Decorate a public ``fn(robot_or_scene, q, ...)`` to run under the thread count decided for its
    batch (the first two parameters, by position or by name)."""
    names = list(inspect.signature(fn).parameters)[:2]

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _POLICY[0] == "torch":
            return fn(*args, **kwargs)
        model = args[0] if args else kwargs.get(names[0])
        q = args[1] if len(args) > 1 else kwargs.get(names[1])
        nv = getattr(model, "nv", 1)
        with using(work_of(q, nv if isinstance(nv, int) else 1)):
            return fn(*args, **kwargs)

    return wrapper


def decided_backward(fn: Callable) -> Callable:
    """Decorate an autograd ``Function.backward(ctx, ...)`` to run under the thread count decided for
    ``ctx.thread_work`` (set it in ``forward``; absent: the smallest work)."""

    @functools.wraps(fn)
    def wrapper(ctx, *grads):
        if _POLICY[0] == "torch":
            return fn(ctx, *grads)
        with using(getattr(ctx, "thread_work", 0)):
            return fn(ctx, *grads)

    return wrapper
