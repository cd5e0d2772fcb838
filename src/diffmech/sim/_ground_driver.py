"""A step of one robot on the ground, and its reverse, as one C call each.

:class:`~diffmech.sim._ground_rollout.GroundStepper` writes the step on the kernels' buffers in
Python: a few dozen NumPy and torch operations of glue around seven kernel calls, each of a few
microseconds, which with one robot still cost more than the arithmetic. This driver does the glue in
C and calls the same compiled kernels through their addresses -- the robot's stage kernel and its
reverse mode, its position update and reverse mode (:mod:`diffmech.dynamics.native`), the contact
problem's assembly, impulse update and reverse pass (:mod:`diffmech.contact.update_native`), the PGS
sweeps and their implicit pull-back (:mod:`diffmech.contact.pgs_native`) -- so a step computes the
same numbers as the stepper's Python, which stands in for the cases the driver hands back (a base
turning a radian or more in a step; a rank-deficient contact problem in the reverse pass).

Built once per machine (one small C file); where it cannot be, the stepper's Python runs.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path

from ..dynamics.kernel_store import NativeUnavailable, load_kernel

__all__ = ["Ground", "library", "address", "OK", "TORCH_ADVANCE", "RANK_DEFICIENT", "NOT_FINITE"]

OK, TORCH_ADVANCE, RANK_DEFICIENT, NOT_FINITE = 0, 1, 2, 3

def _template() -> str:
    """The C template (``ground_driver.c`` beside this module, shipped as package data)."""
    return Path(__file__).with_name("ground_driver.c").read_text()


def _source() -> str:
    template = _template()
    parts = []
    for real, suffix, sqrt, fabs in (("double", "f64", "sqrt", "fabs"), ("float", "f32", "sqrtf", "fabsf")):
        parts.append(template.replace("REAL", real).replace("SUFFIX", suffix).replace("SQRT", sqrt)
                     .replace("FABS", fabs))
    return parts[0] + parts[1].split("#include <string.h>", 1)[1]


class Ground(ctypes.Structure):
    """The C ``struct ground_f64`` / ``ground_f32`` (the same layout: 64-bit numbers and pointers): a
    rollout's sizes, solver settings, the kernels' addresses and pointers to its constant inputs -- the
    model's constants ``C``, drives and balls ``(B, .)``, the ``(B, 1)`` column of ``dt``, the balls'
    friction and restitution ``(2, nb)``, the joint limits ``(nl,)``."""

    _fields_ = ([(n, ctypes.c_int64) for n in ("B", "nq", "nv", "nb", "nl", "off", "col", "nd", "limits",
                                                "iterations", "check_every", "advance", "newton", "n_red")]
                + [(n, ctypes.c_double) for n in ("dt", "baumgarte", "bounce_speed", "tol", "series")]
                + [(n, ctypes.c_void_p) for n in ("stage", "stage_vjp", "adv", "adv_vjp", "assemble", "apply", "pgs",
                                                  "back1", "vjp", "back2", "C", "drives", "balls", "dtcol", "coef",
                                                  "lo", "hi", "g_red")])

_LIB: list = []


def library():
    """The driver's library (``forward_f64``, ``backward_f64``, ``forward_f32``, ``backward_f32``), or
    ``None`` where it cannot be built."""
    if not _LIB:
        try:
            source = _source()
            key = "diffmech-ground-driver-" + hashlib.sha256(source.encode()).hexdigest()
            lib, _ = load_kernel(key, lambda: (source, {"kernel": "ground driver"}),
                                 name="ground driver",
                                 symbols=tuple(f"{n}_{s}" for n in ("forward", "backward") for s in ("f64", "f32")))
        except NativeUnavailable:
            lib = None
        else:
            i64, ptr = ctypes.c_int64, ctypes.c_void_p
            for s in ("f64", "f32"):
                f = getattr(lib, f"forward_{s}")
                f.restype, f.argtypes = i64, [ctypes.POINTER(Ground)] + [ptr] * 3 + [i64] + [ptr] * 8
                f = getattr(lib, f"backward_{s}")
                f.restype, f.argtypes = i64, [ctypes.POINTER(Ground)] + [ptr] * 3 + [i64] + [ptr] * 10
        _LIB.append(lib)
    return _LIB[0]


def address(fn) -> int:
    """The address of a ctypes function (a library's exported symbol)."""
    return ctypes.cast(fn, ctypes.c_void_p).value
