"""The projected Gauss-Seidel sweeps of :mod:`diffmech.contact.pgs`, and the implicit pull-back of
their solution, as small C kernels.

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

/* inv = 1 / diag(A) where the diagonal is above 1e-12 of its largest (else 0); w = A lam + c */
static void prepare_SUFFIX(int64_t R, const REAL *Ab, const REAL *cb, const REAL *lb, REAL *inv, REAL *w) {
    REAL dmax = 0;
    for (int64_t i = 0; i < R; ++i) dmax = Ab[i * R + i] > dmax ? Ab[i * R + i] : dmax;
    REAL floor_ = (REAL)1e-12 * (dmax > (REAL)1e-300 ? dmax : (REAL)1e-300);
    for (int64_t i = 0; i < R; ++i) {
        REAL d = Ab[i * R + i];
        inv[i] = d > floor_ ? (REAL)1 / d : (REAL)0;
        REAL s = cb[i];
        for (int64_t j = 0; j < R; ++j) s += Ab[i * R + j] * lb[j];
        w[i] = s;
    }
}

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
        prepare_SUFFIX(R, Ab, cb, lb, inv, w);
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

/* The implicit pull-back of a solution lam (see diffmech.contact.pgs.implicit_vjp): the contact
   modes, the residual's Jacobian F' (R x R), u solving F'^T u = grad by LU with partial pivoting,
   then (a, d, g_mu). ok[b] = 0 where a pivot is below 1e-10 of the largest (a rank-deficient F':
   the caller's least-norm solve takes that environment). Returns the number of sliding blocks. */
int64_t vjp_SUFFIX(int64_t B, int64_t K, const REAL *A, const REAL *c, const REAL *mu, const REAL *lam,
                   const REAL *grad, REAL *a_out, REAL *d_out, REAL *gmu_out, int64_t *ok) {
    const int64_t R = 3 * K;
    REAL *F = (REAL *)malloc(sizeof(REAL) * (size_t)(R * R + 8 * R + 8 * K));
    REAL *inv = F + R * R, *w = inv + R, *u = w + R, *wrow = u + R;
    REAL *zh = wrow + R, *P = zh + 2 * K, *mln = P + 4 * K, *slide = mln + K;
    int64_t *piv = (int64_t *)malloc(sizeof(int64_t) * (size_t)(R > 0 ? R : 1));
    int64_t sliding_blocks = 0;
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Ab = A + b * R * R, *cb = c + b * R, *mub = mu + b * K, *lb = lam + b * R;
        REAL *ab = a_out + b * R, *db = d_out + b * R, *gb = gmu_out + b * K;
        prepare_SUFFIX(R, Ab, cb, lb, inv, w);
        /* F'^T, stored row-major as M[j][i] = F'[i][j] */
        for (int64_t i = 0; i < R * R; ++i) F[i] = 0;
        for (int64_t k = 0; k < K; ++k) {
            const int64_t r = 3 * k;
            REAL ln = lb[r], l1 = lb[r + 1], l2 = lb[r + 2];
            REAL z1 = l1 - w[r + 1] * inv[r + 1], z2 = l2 - w[r + 2] * inv[r + 2];
            int active = ln > 0;
            REAL bound = mub[k] * ln;
            int free_t = bound <= 0 || (inv[r + 1] == 0 && inv[r + 2] == 0);
            REAL zn = SQRT(z1 * z1 + z2 * z2), ltn = SQRT(l1 * l1 + l2 * l2);
            int sl = active && !free_t && zn > bound * (REAL)(1 + 1e-9) && ltn >= bound * (REAL)(1 - 1e-7);
            int stick = active && !free_t && !sl;
            wrow[r] = active;
            wrow[r + 1] = wrow[r + 2] = stick;
            slide[k] = sl;
            for (int64_t t = 0; t < 3; ++t) {
                if (wrow[r + t]) {
                    for (int64_t j = 0; j < R; ++j) F[j * R + r + t] = Ab[(r + t) * R + j];
                } else {
                    F[(r + t) * R + r + t] = 1;
                }
            }
            if (sl) {
                ++sliding_blocks;
                REAL zc = zn > (REAL)1e-300 ? zn : (REAL)1e-300;
                REAL h1 = z1 / zc, h2 = z2 / zc;
                REAL *Pk = P + 4 * k;
                Pk[0] = (1 - h1 * h1) / zc; Pk[1] = -h1 * h2 / zc; Pk[2] = Pk[1]; Pk[3] = (1 - h2 * h2) / zc;
                zh[2 * k] = h1; zh[2 * k + 1] = h2;
                mln[k] = mub[k] * ln;
                /* rows r+1+t: E_t - mu zhat_t e_n - mln sum_s P[t][s] (E_s - inv_s A_s) */
                for (int64_t t = 0; t < 2; ++t) {
                    const int64_t row = r + 1 + t;
                    const REAL ht = t == 0 ? h1 : h2;
                    for (int64_t j = 0; j < R; ++j) {
                        REAL s = 0;
                        for (int64_t q = 0; q < 2; ++q) {
                            REAL e = (j == r + 1 + q) ? (REAL)1 : (REAL)0;
                            s += Pk[2 * t + q] * (e - inv[r + 1 + q] * Ab[(r + 1 + q) * R + j]);
                        }
                        REAL e = (j == row) ? (REAL)1 : (REAL)0, en = (j == r) ? mub[k] * ht : (REAL)0;
                        F[j * R + row] = e - en - mln[k] * s;
                    }
                }
            }
        }
        /* LU with partial pivoting of F'^T (in place), then F'^T u = grad */
        REAL pmax = 0, pmin = INFINITY;
        for (int64_t col = 0; col < R; ++col) {
            int64_t p = col;
            REAL best = FABS(F[col * R + col]);
            for (int64_t i = col + 1; i < R; ++i) {
                REAL x = FABS(F[i * R + col]);
                if (x > best) { best = x; p = i; }
            }
            piv[col] = p;
            if (p != col)
                for (int64_t j = 0; j < R; ++j) {
                    REAL t = F[col * R + j];
                    F[col * R + j] = F[p * R + j];
                    F[p * R + j] = t;
                }
            pmax = best > pmax ? best : pmax;
            pmin = best < pmin ? best : pmin;
            if (best == 0) continue;
            REAL pinv = 1 / F[col * R + col];
            for (int64_t i = col + 1; i < R; ++i) {
                REAL f = F[i * R + col] * pinv;
                F[i * R + col] = f;
                if (f != 0)
                    for (int64_t j = col + 1; j < R; ++j) F[i * R + j] -= f * F[col * R + j];
            }
        }
        ok[b] = R == 0 || (pmin > 0 && pmin > (REAL)1e-10 * pmax);
        if (!ok[b]) continue;
        for (int64_t i = 0; i < R; ++i) u[i] = grad[b * R + i];
        for (int64_t i = 0; i < R; ++i) { REAL t = u[i]; u[i] = u[piv[i]]; u[piv[i]] = t; }
        for (int64_t i = 0; i < R; ++i) for (int64_t j = 0; j < i; ++j) u[i] -= F[i * R + j] * u[j];
        for (int64_t i = R - 1; i >= 0; --i) {
            for (int64_t j = i + 1; j < R; ++j) u[i] -= F[i * R + j] * u[j];
            u[i] /= F[i * R + i];
        }
        /* v = -u; a = v on the rows that read w; a sliding block's tangent rows mln inv_t P v_t */
        for (int64_t i = 0; i < R; ++i) { ab[i] = wrow[i] ? -u[i] : 0; db[i] = 0; }
        for (int64_t k = 0; k < K; ++k) {
            gb[k] = 0;
            if (!slide[k]) continue;
            const int64_t r = 3 * k;
            const REAL *Pk = P + 4 * k;
            REAL v1 = -u[r + 1], v2 = -u[r + 2];
            REAL pv1 = Pk[0] * v1 + Pk[1] * v2, pv2 = Pk[2] * v1 + Pk[3] * v2;
            ab[r + 1] = mln[k] * inv[r + 1] * pv1;
            ab[r + 2] = mln[k] * inv[r + 2] * pv2;
            gb[k] = -lb[r] * (v1 * zh[2 * k] + v2 * zh[2 * k + 1]);
            db[r + 1] = -mln[k] * pv1 * w[r + 1] * inv[r + 1] * inv[r + 1];
            db[r + 2] = -mln[k] * pv2 * w[r + 2] * inv[r + 2] * inv[r + 2];
        }
    }
    free(F);
    free(piv);
    return sliding_blocks;
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
            lib, _ = load_kernel("diffmech-pgs-v3", lambda: (_source(), {"kernel": "pgs"}), name="pgs",
                                 symbols=("pgs_f64", "pgs_f32", "vjp_f64", "vjp_f32"))
        except NativeUnavailable:
            lib = None
        else:
            for fn in (lib.pgs_f64, lib.pgs_f32):
                fn.restype = None
                fn.argtypes = ([ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 4
                               + [ctypes.c_int64, ctypes.c_double, ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p])
            for fn in (lib.vjp_f64, lib.vjp_f32):
                fn.restype = ctypes.c_int64
                fn.argtypes = [ctypes.c_int64, ctypes.c_int64] + [ctypes.c_void_p] * 9
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
