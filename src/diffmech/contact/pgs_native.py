"""The projected Gauss-Seidel sweeps of :mod:`diffmech.contact.pgs` as one small C kernel.

The sweeps run without a graph (the gradient comes from the implicit function theorem at their
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

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable, load_kernel

_TEMPLATE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

void pgs_SUFFIX(int64_t B, int64_t K, const REAL *A, const REAL *c, const REAL *mu, REAL *lam,
                int64_t iterations, double tol, int64_t check_every, int64_t *iters_out, double *res_out) {
    const int64_t R = 3 * K;
    REAL *w = (REAL *)malloc(sizeof(REAL) * (size_t)(2 * R));
    REAL *inv = w + R;
    int64_t most = 0;
    double worst = 0.0;
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Ab = A + b * R * R, *cb = c + b * R, *mub = mu + b * K;
        REAL *lb = lam + b * R;
        REAL dmax = 0;
        for (int64_t i = 0; i < R; ++i) dmax = Ab[i * R + i] > dmax ? Ab[i * R + i] : dmax;
        REAL floor_ = (REAL)1e-12 * (dmax > (REAL)1e-300 ? dmax : (REAL)1e-300);
        for (int64_t i = 0; i < R; ++i) {
            REAL d = Ab[i * R + i];
            inv[i] = d > floor_ ? (REAL)1 / d : (REAL)0;
        }
        for (int64_t i = 0; i < R; ++i) {
            REAL s = cb[i];
            for (int64_t j = 0; j < R; ++j) s += Ab[i * R + j] * lb[j];
            w[i] = s;
        }
        int64_t it = 0;
        double residual = INFINITY;
        for (it = 1; it <= iterations; ++it) {
            int check = (it % check_every == 0) || it == iterations;
            REAL change = 0;
            for (int64_t k = 0; k < K; ++k) {
                const int64_t r = 3 * k;
                REAL l0 = lb[r], l1 = lb[r + 1], l2 = lb[r + 2];
                REAL ln = l0 - w[r] * inv[r];
                ln = ln > 0 ? ln : 0;
                REAL dn = ln - l0;
                REAL wt1 = w[r + 1] + Ab[(r + 1) * R + r] * dn;
                REAL wt2 = w[r + 2] + Ab[(r + 2) * R + r] * dn;
                REAL lt1 = l1 - wt1 * inv[r + 1];
                REAL lt2 = l2 - wt2 * inv[r + 2];
                REAL bound = mub[k] * ln;
                REAL norm = SQRT(lt1 * lt1 + lt2 * lt2);
                if (norm > bound) {
                    REAL s = bound / (norm > (REAL)1e-300 ? norm : (REAL)1e-300);
                    lt1 *= s;
                    lt2 *= s;
                }
                REAL d0 = ln - l0, d1 = lt1 - l1, d2 = lt2 - l2;
                if (d0 != 0 || d1 != 0 || d2 != 0) {
                    for (int64_t i = 0; i < R; ++i)
                        w[i] += Ab[i * R + r] * d0 + Ab[i * R + r + 1] * d1 + Ab[i * R + r + 2] * d2;
                }
                lb[r] = ln;
                lb[r + 1] = lt1;
                lb[r + 2] = lt2;
                if (check) {
                    REAL a = FABS(d0);
                    a = FABS(d1) > a ? FABS(d1) : a;
                    a = FABS(d2) > a ? FABS(d2) : a;
                    change = a > change ? a : change;
                }
            }
            if (check) {
                REAL size = 0;
                for (int64_t i = 0; i < R; ++i) size = FABS(lb[i]) > size ? FABS(lb[i]) : size;
                residual = (double)change / ((double)size + 1.0);
                if (residual <= tol) break;
            }
        }
        if (it > iterations) it = iterations;
        most = it > most ? it : most;
        worst = residual > worst ? residual : worst;
    }
    free(w);
    *iters_out = most;
    *res_out = worst;
}
"""


def _source() -> str:
    parts = []
    for real, suffix, sqrt, fabs in (("double", "f64", "sqrt", "fabs"), ("float", "f32", "sqrtf", "fabsf")):
        parts.append(_TEMPLATE.replace("REAL", real).replace("SUFFIX", suffix).replace("SQRT", sqrt)
                     .replace("FABS", fabs))
    return parts[0] + parts[1].split("#include <stdlib.h>", 1)[1]


_LIB: list = []  # [CDLL] once loaded, [None] once found unavailable


def _library():
    if not _LIB:
        try:
            lib, _ = load_kernel("diffmech-pgs-v1", lambda: (_source(), {"kernel": "pgs"}), name="pgs",
                                 symbols=("pgs_f64", "pgs_f32"))
        except NativeUnavailable:
            lib = None
        else:
            for fn in (lib.pgs_f64, lib.pgs_f32):
                fn.restype = None
                fn.argtypes = ([ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
                               + [ctypes.c_int64, ctypes.c_double, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p])
        _LIB.append(lib)
    return _LIB[0]


def enabled() -> bool:
    """Whether the sweeps may run in C: native kernels not switched off (see the module's doc)."""
    return kernels._MODE[0] != "never"


def native_sweeps(A: Tensor, c: Tensor, mu: Tensor, iterations: int, tol: float, check_every: int,
                  lam0: Tensor | None) -> tuple[Tensor, int, float] | None:
    """The sweeps of :func:`diffmech.contact.pgs.pgs` in C, or ``None`` where they cannot run
    there (not a CPU float32/float64 tensor, native kernels off, no compiler)."""
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
    it = ctypes.c_int64(0)
    res = ctypes.c_double(0.0)
    fn = lib.pgs_f64 if dtype == torch.float64 else lib.pgs_f32
    fn(B, R // 3, A_.data_ptr(), c_.data_ptr(), mu_.data_ptr(), lam.data_ptr(), int(iterations), float(tol),
       int(check_every), ctypes.addressof(it), ctypes.addressof(res))
    return lam.reshape(B, R // 3, 3), int(it.value), float(res.value)
