"""The contact problem of a step with one mass-matrix block -- its assembly and its reverse pass
(:mod:`diffmech.contact.impulses`) -- as small C kernels.

Per environment, with ``R = 3K`` rows and ``nv`` velocities, the forward kernel forms ``W = M^-1 J^T``
(forward and back substitution with the Cholesky factor), ``A = J W``, the normal velocity before the
step and ``c = J v_free - (b, 0, 0)`` with the normal targets of
:func:`~diffmech.contact.impulses.assemble`; the backward kernels form the cotangents of
:func:`~diffmech.contact.impulses.update_vjp` (the solution's implicit pull-back between them is
:func:`~diffmech.contact.pgs.implicit_vjp`'s). In torch each is a few dozen operations on a few hundred
numbers: with one robot, their dispatch was a third of a step's gradient. Built once per machine
(one C file, about a second); where it cannot run (native kernels off, no compiler, not a CPU
float32/float64 tensor) the callers use the torch code.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable, load_kernel

__all__ = ["available", "assemble_native", "apply_native", "backward_native"]

_TEMPLATE = r"""
#include <stdint.h>
#include <stdlib.h>

/* x <- (L L^T)^-1 x, L lower (n x n, row-major) */
static void chol_solve_SUFFIX(int64_t n, const REAL *L, REAL *x) {
    for (int64_t i = 0; i < n; ++i) {
        REAL s = x[i];
        for (int64_t k = 0; k < i; ++k) s -= L[i * n + k] * x[k];
        x[i] = s / L[i * n + i];
    }
    for (int64_t i = n - 1; i >= 0; --i) {
        REAL s = x[i];
        for (int64_t k = i + 1; k < n; ++k) s -= L[k * n + i] * x[k];
        x[i] = s / L[i * n + i];
    }
}

void assemble_SUFFIX(int64_t B, int64_t nv, int64_t K, const REAL *J, const REAL *L, const REAL *v,
                     const REAL *vf, const REAL *phi, const REAL *e, double dt, double baumgarte,
                     double bounce_speed, REAL *A, REAL *c, REAL *W, REAL *vn, REAL *bounce, REAL *scale) {
    const int64_t R = 3 * K;
    REAL *x = (REAL *)malloc(sizeof(REAL) * (size_t)(nv > 0 ? nv : 1));
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Jb = J + b * R * nv, *Lb = L + b * nv * nv, *vb = v + b * nv, *vfb = vf + b * nv;
        REAL *Wb = W + b * nv * R, *Ab = A + b * R * R, *cb = c + b * R;
        for (int64_t r = 0; r < R; ++r) {
            for (int64_t i = 0; i < nv; ++i) x[i] = Jb[r * nv + i];
            chol_solve_SUFFIX(nv, Lb, x);
            for (int64_t i = 0; i < nv; ++i) Wb[i * R + r] = x[i];
        }
        for (int64_t r = 0; r < R; ++r)
            for (int64_t s = 0; s < R; ++s) {
                REAL acc = 0;
                for (int64_t i = 0; i < nv; ++i) acc += Jb[r * nv + i] * Wb[i * R + s];
                Ab[r * R + s] = acc;
            }
        for (int64_t k = 0; k < K; ++k) {
            const int64_t r = 3 * k, bk = b * K + k;
            REAL n0 = 0, f0 = 0, f1 = 0, f2 = 0;
            for (int64_t i = 0; i < nv; ++i) {
                n0 += Jb[r * nv + i] * vb[i];
                f0 += Jb[r * nv + i] * vfb[i];
                f1 += Jb[(r + 1) * nv + i] * vfb[i];
                f2 += Jb[(r + 2) * nv + i] * vfb[i];
            }
            REAL p = phi[bk], ek = e[bk];
            REAL sc = p >= 0 ? (REAL)1 : (REAL)baumgarte;
            REAL t = -p / (REAL)dt * sc;
            int bo = (n0 < -(REAL)bounce_speed) && (f0 * (REAL)dt < -p) && (ek > 0);
            if (bo) {
                REAL x_ = -ek * n0;
                t = x_ > t ? x_ : t;
            }
            vn[bk] = n0;
            bounce[bk] = (REAL)bo;
            scale[bk] = sc;
            cb[r] = f0 - t;
            cb[r + 1] = f1;
            cb[r + 2] = f2;
        }
    }
    free(x);
}

/* u = W lam, v1 = v_free + u */
void apply_SUFFIX(int64_t B, int64_t nv, int64_t R, const REAL *W, const REAL *lam, const REAL *vf, REAL *u,
                  REAL *v1) {
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < nv; ++i) {
            REAL s = 0;
            for (int64_t r = 0; r < R; ++r) s += W[(b * nv + i) * R + r] * lam[b * R + r];
            u[b * nv + i] = s;
            v1[b * nv + i] = vf[b * nv + i] + s;
        }
}

/* y = M^-1 g, g_lam = J y, A = J W */
void backward1_SUFFIX(int64_t B, int64_t nv, int64_t R, const REAL *g, const REAL *J, const REAL *W,
                      const REAL *L, REAL *y, REAL *g_lam, REAL *A) {
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Jb = J + b * R * nv, *Wb = W + b * nv * R;
        REAL *yb = y + b * nv;
        for (int64_t i = 0; i < nv; ++i) yb[i] = g[b * nv + i];
        chol_solve_SUFFIX(nv, L + b * nv * nv, yb);
        for (int64_t r = 0; r < R; ++r) {
            REAL s = 0;
            for (int64_t i = 0; i < nv; ++i) s += Jb[r * nv + i] * yb[i];
            g_lam[b * R + r] = s;
            for (int64_t q = 0; q < R; ++q) {
                REAL acc = 0;
                for (int64_t i = 0; i < nv; ++i) acc += Jb[r * nv + i] * Wb[i * R + q];
                A[b * R * R + r * R + q] = acc;
            }
        }
    }
}

/* the cotangents of J, v, v_free, phi, e and L (see diffmech.contact.impulses.update_vjp) */
void backward2_SUFFIX(int64_t B, int64_t nv, int64_t K, const REAL *g, const REAL *J, const REAL *v,
                      const REAL *vf, const REAL *phi, const REAL *e, const REAL *lam, const REAL *u,
                      const REAL *W, const REAL *vn, const REAL *bounce, const REAL *scale, const REAL *L,
                      const REAL *y, const REAL *a, const REAL *d, double dt, REAL *g_J, REAL *g_v, REAL *g_vf,
                      REAL *g_phi, REAL *g_e, REAL *g_L) {
    const int64_t R = 3 * K;
    REAL *y2 = (REAL *)malloc(sizeof(REAL) * (size_t)(3 * nv * (nv > 0 ? nv : 1) + 3 * nv + R + 1));
    REAL *v1 = y2 + nv, *gvn = v1 + nv, *S = gvn + R;
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Jb = J + b * R * nv, *Wb = W + b * nv * R, *ab = a + b * R, *db = d ? d + b * R : 0;
        const REAL *lb = lam + b * R, *ub = u + b * nv, *Lb = L + b * nv * nv;
        for (int64_t i = 0; i < nv; ++i) {
            REAL s = y[b * nv + i], t = 0;
            for (int64_t r = 0; r < R; ++r) {
                s += Wb[i * R + r] * ab[r];
                t += Jb[r * nv + i] * ab[r];
            }
            y2[i] = s;
            g_vf[b * nv + i] = g[b * nv + i] + t;
            v1[i] = vf[b * nv + i] + ub[i];
            g_v[b * nv + i] = 0;
        }
        for (int64_t k = 0; k < K; ++k) {
            const int64_t bk = b * K + k;
            REAL gb = -ab[3 * k];
            REAL t = -phi[bk] / (REAL)dt * scale[bk];
            REAL x = -e[bk] * vn[bk];
            int tox = bounce[bk] != 0 && x > t;
            REAL gt = tox ? (REAL)0 : gb, gx = tox ? gb : (REAL)0;
            g_phi[bk] = gt * (-scale[bk] / (REAL)dt);
            g_e[bk] = gx * -vn[bk];
            gvn[k] = gx * -e[bk];
        }
        for (int64_t r = 0; r < R; ++r) {
            REAL dr = db ? db[r] : (REAL)0;
            REAL extra = (r % 3 == 0) ? gvn[r / 3] : (REAL)0;
            REAL *gJ = g_J + b * R * nv + r * nv;
            for (int64_t i = 0; i < nv; ++i) {
                gJ[i] = ab[r] * v1[i] + lb[r] * y2[i] + 2 * dr * Wb[i * R + r] + extra * v[b * nv + i];
                if (r % 3 == 0) g_v[b * nv + i] += Jb[r * nv + i] * gvn[r / 3];
            }
        }
        /* S = gM + gM^T, gM = y2 u^T + W diag(d) W^T; g_L = -S L */
        for (int64_t i = 0; i < nv; ++i)
            for (int64_t j = 0; j <= i; ++j) {
                REAL s = y2[i] * ub[j] + y2[j] * ub[i];
                if (db) {
                    REAL w = 0;
                    for (int64_t r = 0; r < R; ++r) w += Wb[i * R + r] * db[r] * Wb[j * R + r];
                    s += 2 * w;
                }
                S[i * nv + j] = s;
                S[j * nv + i] = s;
            }
        for (int64_t i = 0; i < nv; ++i)
            for (int64_t j = 0; j < nv; ++j) {
                REAL s = 0;
                for (int64_t k = j; k < nv; ++k) s += S[i * nv + k] * Lb[k * nv + j];
                g_L[b * nv * nv + i * nv + j] = -s;
            }
    }
    free(y2);
}
"""


def _source() -> str:
    parts = [_TEMPLATE.replace("REAL", real).replace("SUFFIX", suffix)
             for real, suffix in (("double", "f64"), ("float", "f32"))]
    return parts[0] + parts[1].split("#include <stdlib.h>", 1)[1]


_LIB: list = []


def _library():
    if not _LIB:
        try:
            lib, _ = load_kernel("diffmech-contact-update-v2", lambda: (_source(), {"kernel": "contact update"}),
                                 name="contact update",
                                 symbols=tuple(f"{n}_{s}" for n in ("assemble", "apply", "backward1", "backward2")
                                               for s in ("f64", "f32")))
        except NativeUnavailable:
            lib = None
        else:
            i64, ptr, dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
            for s in ("f64", "f32"):
                f = getattr(lib, f"assemble_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 6 + [dbl] * 3 + [ptr] * 6
                f = getattr(lib, f"apply_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 5
                f = getattr(lib, f"backward1_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 7
                f = getattr(lib, f"backward2_{s}")
                f.restype, f.argtypes = None, [i64] * 3 + [ptr] * 16 + [dbl] + [ptr] * 6
        _LIB.append(lib)
    return _LIB[0]


def available(x: Tensor) -> bool:
    """Whether the kernels can run on tensors like ``x``."""
    return (x.device.type == "cpu" and x.dtype in (torch.float32, torch.float64) and kernels._MODE[0] != "never"
            and _library() is not None)


def _c(x: Tensor, dtype) -> Tensor:
    if x.dtype is dtype and not x.requires_grad and x.is_contiguous():
        return x  # the common case, checked first: a call at one robot is tens of microseconds
    return x.detach().to(dtype).contiguous()


def assemble_native(J: Tensor, L: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, e: Tensor, dt: float,
                    baumgarte: float, bounce_speed: float) -> tuple[Tensor, ...]:
    """:func:`~diffmech.contact.impulses.assemble` for one block: ``J (B, 3K, nv)``, ``L (B, nv, nv)``,
    ``v, v_free (B, nv)``, ``phi, e (B, K)`` -> ``(A, c, W, vn, bounce (bool), scale)`` (no graph)."""
    B, R, nv = J.shape
    K = R // 3
    dtype = J.dtype
    ins = [_c(x, dtype) for x in (J, L, v, v_free, phi, e)]
    A, c, W = J.new_empty(B, R, R), J.new_empty(B, R), J.new_empty(B, nv, R)
    vn, bounce, scale = J.new_empty(B, K), J.new_empty(B, K), J.new_empty(B, K)
    fn = getattr(_library(), "assemble_f64" if dtype == torch.float64 else "assemble_f32")
    fn(B, nv, K, *[x.data_ptr() for x in ins], float(dt), float(baumgarte), float(bounce_speed),
       *[x.data_ptr() for x in (A, c, W, vn, bounce, scale)])
    return A, c, W, vn, bounce.bool(), scale


def apply_native(W: Tensor, lam: Tensor, v_free: Tensor) -> tuple[Tensor, Tensor]:
    """``u = W lam`` and ``v+ = v_free + u`` (``W (B, nv, 3K)``, ``lam (B, K, 3)``, ``v_free (B, nv)``), no graph:
    the impulses' velocity change, computed by every route of a step the same way (bit for bit)."""
    B, nv, R = W.shape
    dtype = W.dtype
    W_, lam_, vf_ = _c(W, dtype), _c(lam, dtype), _c(v_free, dtype)
    u, v1 = W.new_empty(B, nv), W.new_empty(B, nv)
    getattr(_library(), "apply_f64" if dtype == torch.float64 else "apply_f32")(
        B, nv, R, W_.data_ptr(), lam_.data_ptr(), vf_.data_ptr(), u.data_ptr(), v1.data_ptr())
    return u, v1


def backward_native(g: Tensor, J: Tensor, v: Tensor, v_free: Tensor, phi: Tensor, mu: Tensor, e: Tensor,
                    lam: Tensor, u: Tensor, c: Tensor, W: Tensor, vn: Tensor, bounce: Tensor, scale: Tensor,
                    L: Tensor, dt: float, implicit_vjp) -> tuple[Tensor, ...]:
    """:func:`~diffmech.contact.impulses.update_vjp` for one block (``L (B, nv, nv)``): ``(g_J, g_v,
    g_vf, g_phi, g_mu, g_e, g_L)``, ``g_mu`` ``None`` where no block slides; ``implicit_vjp`` the
    solution's pull-back (:func:`~diffmech.contact.pgs.implicit_vjp`)."""
    B, R, nv = J.shape
    K = R // 3
    dtype = J.dtype
    lib = _library()
    s = "f64" if dtype == torch.float64 else "f32"
    J_, W_, L_, g_ = _c(J, dtype), _c(W, dtype), _c(L, dtype), _c(g, dtype)
    y, g_lam, A = J.new_empty(B, nv), J.new_empty(B, R), J.new_empty(B, R, R)
    getattr(lib, f"backward1_{s}")(B, nv, R, g_.data_ptr(), J_.data_ptr(), W_.data_ptr(), L_.data_ptr(),
                                   y.data_ptr(), g_lam.data_ptr(), A.data_ptr())
    a, d, g_mu = implicit_vjp(lam, A, c, mu, g_lam.reshape(B, K, 3))
    ins = [g_, J_] + [_c(x, dtype) for x in (v, v_free, phi, e, lam.reshape(B, R), u, W_)]
    ins += [_c(x, dtype) for x in (vn, bounce.to(dtype), scale)] + [L_, y, _c(a, dtype)]
    d_ = None if d is None else _c(d, dtype)
    g_J, g_v, g_vf = J.new_empty(B, R, nv), J.new_empty(B, nv), J.new_empty(B, nv)
    g_phi, g_e, g_L = J.new_empty(B, K), J.new_empty(B, K), J.new_empty(B, nv, nv)
    getattr(lib, f"backward2_{s}")(B, nv, K, *[x.data_ptr() for x in ins], 0 if d_ is None else d_.data_ptr(),
                                   float(dt), *[x.data_ptr() for x in (g_J, g_v, g_vf, g_phi, g_e, g_L)])
    return g_J, g_v, g_vf, g_phi, g_mu, g_e, g_L
