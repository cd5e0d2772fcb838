"""The solve of :mod:`diffmech.contact.pgs` (projected Gauss-Seidel sweeps, then semismooth Newton
iterations where the sweeps leave the contact conditions unmet), and the implicit pull-back of its
solution, as small C kernels (``pgs.c``).

The solve runs without a graph (the gradient comes from the implicit function theorem at their
solution), so nothing stops them from leaving torch: in Python each block update is a dozen tensor
operations of a few microseconds each, and a quadruped's four toes at 50 sweeps spend 20 ms a step
there. The kernel does the same arithmetic, in the same order, per environment (each stops on its
own when converged), for float32 and float64 CPU tensors. Built once per machine by
:func:`diffmech.dynamics.kernel_store.load_kernel` (one C file, well under a second); used unless
native kernels are switched off (``diffmech.dynamics.set_native("never")`` or
``$DIFFMECH_NATIVE=never``) or no C compiler is found, where the torch sweeps run instead.
"""

from __future__ import annotations

import ctypes
import hashlib
from pathlib import Path
from typing import NamedTuple

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable, load_kernel


def _template() -> str:
    """The C template (``pgs.c`` beside this module, shipped as package data)."""
    return (Path(__file__).with_name("pgs.c")).read_text()


def _source() -> str:
    template = _template()
    parts = []
    for real, suffix, sqrt, fabs, eps in (("double", "f64", "sqrt", "fabs", "DBL_EPSILON"),
                                          ("float", "f32", "sqrtf", "fabsf", "FLT_EPSILON")):
        parts.append(template.replace("REAL", real).replace("SUFFIX", suffix).replace("SQRT", sqrt)
                     .replace("FABS", fabs).replace("EPS", eps))
    return "#include <float.h>\n" + parts[0] + parts[1].split("#include <string.h>", 1)[1]


_LIB: list = []  # [CDLL] once loaded, [None] once found unavailable


def _library():
    if not _LIB:
        try:
            source = _source()
            key = "diffmech-pgs-" + hashlib.sha256(source.encode()).hexdigest()
            lib, _ = load_kernel(key, lambda: (source, {"kernel": "pgs"}), name="pgs",
                                 symbols=("pgs_f64", "pgs_f32", "vjp_f64", "vjp_f32"))
        except NativeUnavailable:
            lib = None
        else:
            for fn in (lib.pgs_f64, lib.pgs_f32):
                fn.restype = None
                fn.argtypes = ([ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
                               + [ctypes.c_int64, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p,
                                  ctypes.c_void_p])
            for fn in (lib.vjp_f64, lib.vjp_f32):
                fn.restype = ctypes.c_int64
                fn.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 9
        _LIB.append(lib)
    return _LIB[0]


def enabled() -> bool:
    """Whether the sweeps may run in C: native kernels not switched off (see the module's doc)."""
    return kernels.native_allowed()


class Solve(NamedTuple):
    """What a solve of the contact problem did (the worst environment of the batch)."""

    sweeps: int  # projected Gauss-Seidel sweeps
    newton: int  # semismooth Newton iterations after them (0 where the sweeps met the conditions)
    residual: float  # max |G| / the problem's impulse scale, G the natural map of the contact conditions
    violation: float  # m/s: the largest velocity error of a contact condition, max |G_i| A_ii
    unconverged: int  # environments whose residual is above the tolerance


def native_sweeps(A: Tensor, c: Tensor, mu: Tensor, iterations: int, tol: float, check_every: int,
                  lam0: Tensor | None, newton: int) -> tuple[Tensor, Solve] | None:
    """:func:`diffmech.contact.pgs.pgs`'s solve in C (sweeps, then at most ``newton`` semismooth Newton
    iterations where they leave the contact conditions unmet): the impulses ``(B, K, 3)`` and what the
    solve did; or ``None`` where it cannot run there (not a CPU float32/float64 tensor, native kernels
    off, no compiler)."""
    if A.device.type != "cpu" or A.dtype not in (torch.float32, torch.float64) or not enabled():
        return None
    lib = _library()
    if lib is None:
        return None
    B, R = c.shape
    dtype = A.dtype
    A_ = A.detach().contiguous()
    c_ = c.detach().to(dtype).contiguous()
    mu_ = mu.detach().to(dtype).contiguous()
    lam = (torch.zeros(B, R, dtype=dtype) if lam0 is None else lam0.detach().to(dtype).reshape(B, R).clone())
    its = (ctypes.c_int64 * 2)()
    res = (ctypes.c_double * 3)()
    fn = lib.pgs_f64 if dtype == torch.float64 else lib.pgs_f32
    fn(B, R // 3, A_.data_ptr(), c_.data_ptr(), mu_.data_ptr(), lam.data_ptr(), int(iterations), float(tol),
       int(check_every), int(newton), ctypes.addressof(its), ctypes.addressof(res))
    return lam.reshape(B, R // 3, 3), Solve(int(its[0]), int(its[1]), float(res[0]), float(res[1]), int(res[2]))


def native_vjp(lam: Tensor, A: Tensor, c: Tensor, mu: Tensor, grad: Tensor
               ) -> tuple[Tensor, Tensor, Tensor, Tensor, int] | None:
    """:func:`diffmech.contact.pgs.implicit_vjp` in C: ``(a (B, 3K), d (B, 3K), g_mu (B, K), ok (B,) bool,
    number of sliding blocks)``, where ``ok`` is false for the environments whose residual Jacobian
    is rank-deficient (their rows are not computed: the caller's least-norm solve takes them); or
    ``None`` where the kernel cannot run (as :func:`native_sweeps`)."""
    if A.device.type != "cpu" or A.dtype not in (torch.float32, torch.float64) or not enabled():
        return None
    lib = _library()
    if lib is None:
        return None
    B, K, _ = lam.shape
    dtype = A.dtype
    ins = [x.detach().to(dtype).contiguous() for x in (A, c, mu, lam, grad)]
    a = torch.empty(B, 3 * K, dtype=dtype)
    d = torch.empty(B, 3 * K, dtype=dtype)
    g_mu = torch.empty(B, K, dtype=dtype)
    ok = torch.empty(B, dtype=torch.int64)
    fn = lib.vjp_f64 if dtype == torch.float64 else lib.vjp_f32
    slides = fn(B, K, *[x.data_ptr() for x in ins], a.data_ptr(), d.data_ptr(), g_mu.data_ptr(), ok.data_ptr())
    return a, d, g_mu, ok.bool(), int(slides)
