"""Process-wide settings that make batched CPU evaluation faster.

Batched and compiled rigid-body kernels allocate and free intermediates of a few MiB on every
call. glibc's ``malloc`` serves blocks above its mmap threshold with fresh ``mmap`` pages and hands
freed heap tops back to the system, so every call pays page faults for memory it just released
(glibc raises its thresholds as large blocks come and go, so a long-running process recovers
most of this by itself). The native kernels allocate only their outputs, so this matters for the
torch code paths (eager and ``torch.compile``) at large batches, and mostly in the first seconds of
a process. PyTorch's own performance guide recommends
a caching allocator (jemalloc, tcmalloc) for the same reason; this is the no-install equivalent
for glibc.

The settings are global to the process, so they are never applied on import: call
:func:`tune_allocator` once at the start of a program that evaluates large batches.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["tune_allocator"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3


def tune_allocator(mmap_threshold: int = 32 << 20, trim_threshold: int = 2**31 - 1) -> bool:
    """Keep freed memory in the process heap for reuse (glibc only; elsewhere a no-op).

    Args:
        mmap_threshold: blocks at least this large (bytes) get their own ``mmap``; glibc caps it at
            32 MiB on 64-bit systems.
        trim_threshold: free memory at the top of the heap (bytes) kept before returning it to
            the system.

    Returns:
        Whether both settings were applied. Trade-off: the process keeps its peak heap size
        (resident memory does not shrink after a large batch).
    """
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    ok_mmap = mallopt(_M_MMAP_THRESHOLD, int(mmap_threshold)) == 1
    ok_trim = mallopt(_M_TRIM_THRESHOLD, int(trim_threshold)) == 1
    return ok_mmap and ok_trim
