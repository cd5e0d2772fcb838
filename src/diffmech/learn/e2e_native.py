"""E2E-SyMo's training objective with the network's jets, Newton and the implicit backward pass in C.

:meth:`E2ESyMo.objective <diffmech.learn.models.E2ESyMo.objective>` in torch is a few hundred small
tensor operations per step: on the seed's batch sizes the per-operation cost rules at B = 32 and the
elementwise work on the jet stacks (values with first and second derivatives, ``(K, B, w)``) costs
more than the matrix products at B = 512. Here a solve is one C call (``del_solve``) and the gradient
another (``del_gradient``); the products with the hidden layer go to the BLAS that ``torch.mm`` uses
(``sgemm_``/``dgemm_`` exported by ``libtorch_cpu`` in MKL builds; else SciPy's, through
``scipy.linalg.cython_blas``) and everything between them is C:

- ``layer1``: the angle embedding of the midpoints, the first layer and ``tanh`` with their jets, for
  the rows still iterating; ``tanh_heads``: the same for the second layer after its product, and the
  heads' product of each row while it is in cache (a BLAS product with ``o <= 22`` columns mostly copies);
- ``known``: the residual's part that does not depend on ``q_next`` (``D2 L_d(q_prev, q) + f``) and
  the per-sample tolerance, from the first midpoint's first-order jets;
- per Newton evaluation and sample: the residual and its Jacobian, the convergence test, the Newton
  step (Gaussian elimination); at convergence the adjoint ``mu = -J^-T dloss/dq_next`` and what the
  gradient needs: the layers' (value, derivative along ``mu``) rows at both midpoints and the
  cotangents of the heads. For one degree of freedom (``newton``) from second-order jets; for ``n >= 2``
  (``rev_a``, ``rev_b``, ``rev_c``) from first-order jets plus one reverse pass: the network's second
  derivatives enter the Jacobian only through the Hessian of one weighted sum of the heads, one
  product with the hidden layer instead of ``n (n + 1) / 2``;
- ``back_tanh_sum``: the reverse of ``tanh`` on (value, direction) rows and the bias's gradient, one pass.

The loss is a fixed function of the roots, so the parameter gradient is computed in the forward call
(two products per layer on 4 B rows: two midpoints, value and direction; the computation of the torch
path's :meth:`~diffmech.learn.models._DELModel.weighted_del_residual` through
:meth:`~diffmech.learn.networks.LagrangianNet.directional_heads`) and the backward pass scales it.
Samples iterate until each converges or fails; only the rows still iterating are evaluated, so the
batch needs no straggler rule. With ``n >= 2``, from the seed's guess, a sample's first Newton step
leaves out the network's second derivatives (``QUASI_NEWTON_STEPS``): that far from the root the step's
error is Newton's quadratic term; the Jacobian of every later step and the one at the root, which the
adjoint uses, are exact.

:func:`native_solve` is the same solve without gradients, for ``solve`` (``predict``, rollouts, the
training loop's test objective). Used by ``E2ESyMo.objective`` and ``SyMo``/``E2ESyMo.solve`` on the
CPU (float32, float64) when the model has no dissipation and no line search; built once per machine
(one small C file); where it cannot be (no C compiler, no BLAS found), or under ``native_mode("never")``
of :mod:`diffmech.dynamics.kernels`, the torch code runs. ``tanh`` is
evaluated through a vectorisable ``expm1`` (Taylor polynomial after range reduction).
"""

from __future__ import annotations

import ctypes
import glob
import hashlib
import os

import torch
from torch import Tensor

from ..dynamics import kernels
from ..dynamics.kernel_store import NativeUnavailable, load_kernel

__all__ = ["library", "native_objective", "native_solve", "NMAX", "QUASI_NEWTON_STEPS"]

NMAX = 6  # degrees of freedom the C code holds on its stack; more: the torch code
# n >= 2, the training objective from the seed's guess: the first Newton steps of a sample that use the Jacobian
# without the network's second derivatives (see _Plan.solve; the Jacobian at the root is always exact); 0: every
# step exact. Not for warm starts (near the root that Jacobian's error dominates the step's; measured: 1.02 ->
# 1.2-1.3 iterations per solve in cart-pole training), nor for solves without gradients (rollouts at the seed's
# tolerance 1e-4 accept its less accurate step: 500-step integration errors 0.19 instead of 0.107)
QUASI_NEWTON_STEPS = 1

_TANH = r"""
#include <math.h>
#include <stdint.h>
#include <string.h>

/* GCC in ISO C modes (-std=c11) does not contract a * b + c into fused multiply-adds: allow it, in the
   polynomials, dot products and chain rules made of them (measured: the step 0.97x as long). Clang contracts
   within expressions by default. Here, not in kernel_store.FLAGS: there it also changes the contact kernels'
   rounding, and the contact rollout's finite-difference gradient test moved past its tolerance (1.3e-4). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("fp-contract=fast")
#endif

#define NMAX 6
#define KMAX (1 + NMAX + NMAX * (NMAX + 1) / 2)

/* tanh(x) = e / (e + 2), e = expm1(2x): range reduction 2x = k ln2 + r, |r| <= ln2/2 (k rounded by adding
   1.5 2^23 / 2^52, which leaves it in the low bits), a Taylor polynomial for expm1(r), 2^k from those bits. No
   calls (floor does not vectorise without -fno-trapping-math) and no branches but selects, so that loops over
   it vectorise;
   clamping at |x| = 10 (float) / 20 (double) where tanh rounds to +-1; NaN passes through. */
static inline float tanh_f32(float x) {
    float xc = x < -10.0f ? -10.0f : (x > 10.0f ? 10.0f : x);
    float y = 2.0f * xc;
    float t = y * 1.44269504088896341f + 12582912.0f;  /* 1.5 2^23: k = round(y / ln2) in the low bits */
    float k = t - 12582912.0f;
    float r = (y - k * 0.693359375f) + k * 2.12194440e-4f;
    float q = r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720
              + r * (1.0f / 5040)))))));
    uint32_t bits;
    memcpy(&bits, &t, 4);
    bits = (bits + 127u) << 23;
    float s;
    memcpy(&s, &bits, 4);
    float e = (s - 1.0f) + s * q;
    return e / (e + 2.0f);
}

static inline double tanh_f64(double x) {
    double xc = x < -20.0 ? -20.0 : (x > 20.0 ? 20.0 : x);
    double y = 2.0 * xc;
    double t = y * 1.4426950408889634 + 6755399441055744.0;  /* 1.5 2^52 */
    double k = t - 6755399441055744.0;
    double r = (y - k * 6.93147180369123816490e-01) - k * 1.90821492927058770002e-10;
    double q = r * (1.0 + r * (1.0 / 2 + r * (1.0 / 6 + r * (1.0 / 24 + r * (1.0 / 120 + r * (1.0 / 720
               + r * (1.0 / 5040 + r * (1.0 / 40320 + r * (1.0 / 362880 + r * (1.0 / 3628800
               + r * (1.0 / 39916800 + r * (1.0 / 479001600 + r * (1.0 / 6227020800.0)))))))))))));
    uint64_t bits;
    memcpy(&bits, &t, 8);
    bits = (bits + 1023u) << 52;
    double s;
    memcpy(&s, &bits, 8);
    double e = (s - 1.0) + s * q;
    return e / (e + 2.0);
}

/* A solve's configuration and buffers (all fields 64 bits wide: the same layout for both precisions). */
struct del_cfg {
    int64_t B, n, o, m, w, paper, K1, K2, grad;
    double h, epsl;
    const int64_t *pj, *pk;
    const void *bh, *q_prev, *q, *q_next;
    void *c, *tolb, *x;
    int64_t *status, *iters;
    double *acc;
    void *S0, *H10, *H20, *O0;            /* the first midpoint's first-order jets (K1, B, .) */
    void *S, *H1, *H2, *O;                /* this iteration's jets (K2, Ba, .) */
    void *Sv, *H1v, *H2v, *G;             /* the backward pass's rows (2, 2B, .) */
    void *rn;                             /* each sample's final max |residual| (B) */
    int64_t max_iter, quasi, reverse;     /* quasi: the quasi-Newton steps of each sample (see _Plan.solve) */
    double tol, eps_mach;
    void *gemm;                           /* the Fortran-interface BLAS ?gemm of this precision */
    const void *W1t, *b1, *W2, *b2, *Wh, *ft;
    const int64_t *col, *scol;
    int64_t *idx, *idx2, *sel;
    void *Pr, *coef, *E2, *E1, *tmp, *GH, *GH1, *wacc;
    void *gW1, *gb1, *gW2, *gb2, *gWh, *gbh;  /* the parameter gradient (del_gradient) */
};
"""

_TEMPLATE = r"""
static inline REAL softplus_SUFFIX(REAL z) { return z > 20 ? z : LOG1P(EXP(z)); }
static inline REAL sigmoid_SUFFIX(REAL z) { return 1 / (1 + EXP(-z)); }

typedef void (*gemm_SUFFIX_t)(const char *, const char *, const int *, const int *, const int *, const REAL *,
                              const REAL *, const int *, const REAL *, const int *, const REAL *, REAL *,
                              const int *);

/* Row-major C (M, w) = A (M, w) W2^T (bt) or A W2, W2 (w, w): the column-major BLAS computes C^T = op(W2)^T A^T
   on the same memory. */
static void mm_SUFFIX(const struct del_cfg *d, int64_t M, const REAL *A, int bt, REAL *C) {
    if (M <= 0) return;
    int w = (int)d->w, nn = (int)M;
    REAL one = 1, zero = 0;
    ((gemm_SUFFIX_t)d->gemm)(bt ? "T" : "N", "N", &w, &nn, &w, &one, (const REAL *)d->W2, &w, A, &w, &zero, C, &w);
}

/* out (w) = sum_k c[k] Wh[k] for Wh (o, w): a row of coefficients on the heads times their weights. */
static void heads_back_SUFFIX(int64_t o, int64_t w, const REAL *c, const REAL *Wh, REAL *restrict out) {
    for (int64_t u = 0; u < w; u++) out[u] = 0;
    for (int64_t k = 0; k < o; k++) {
        const REAL *wk = Wh + k * w;
        REAL ck = c[k];
        for (int64_t u = 0; u < w; u++) out[u] += ck * wk[u];
    }
}

/* Row-major C (M, N) = A^T B for A (R, M), B (R, N). */
static void mm_tn_SUFFIX(const struct del_cfg *d, int64_t M, int64_t N, int64_t R, const REAL *A, const REAL *Bm,
                         REAL *C) {
    int mm = (int)N, nn = (int)M, kk = (int)R, lda = (int)N, ldb = (int)M, ldc = (int)N;
    REAL one = 1, zero = 0;
    ((gemm_SUFFIX_t)d->gemm)("N", "T", &mm, &nn, &kk, &one, Bm, &lda, A, &ldb, &zero, C, &ldc);
}

/* One row of a layer's pre-activation jets (comps M apart, K = 1 + n (+ pairs pj, pk)), in place: the bias
   added to the value, then tanh with the first- and second-order chain rule. tmp: 2 w scratch. */
static void tanh_row_SUFFIX(int64_t K, int64_t n, int64_t M, int64_t w, REAL *Z, const REAL *bias,
                            const int64_t *pj, const int64_t *pk, REAL *tmp) {
    REAL *restrict h = tmp, *restrict t = tmp + w, *restrict z0 = Z;
    for (int64_t u = 0; u < w; u++) {
        REAL y = TANH(z0[u] + bias[u]);
        h[u] = y;
        t[u] = 1 - y * y;
        z0[u] = y;
    }
    for (int64_t p = 0; p + 1 + n < K; p++) {
        REAL *restrict zp = Z + (1 + n + p) * M;
        const REAL *zj = Z + (1 + pj[p]) * M, *zk = Z + (1 + pk[p]) * M;
        for (int64_t u = 0; u < w; u++) zp[u] = t[u] * zp[u] - 2 * h[u] * t[u] * zj[u] * zk[u];
    }
    for (int64_t j = 0; j < n && 1 + j < K; j++) {
        REAL *restrict zj = Z + (1 + j) * M;
        for (int64_t u = 0; u < w; u++) zj[u] *= t[u];
    }
}

/* tanh_row on every row of Z (K, rows, w), then the heads of each row while it is in cache: O (K, rows, o) =
   Z Wh^T (Wh (o, w); the heads' bias is added where they are read). A product with o <= 22 columns is mostly the
   BLAS copying Z. */
static void tanh_heads_SUFFIX(int64_t K, int64_t n, int64_t rows, int64_t w, int64_t o, REAL *Z, const REAL *bias,
                              const REAL *Wh, REAL *O, const int64_t *pj, const int64_t *pk, REAL *tmp) {
    int64_t M = rows * w, Mo = rows * o;
    for (int64_t b = 0; b < rows; b++) {
        tanh_row_SUFFIX(K, n, M, w, Z + b * w, bias, pj, pk, tmp);
        for (int64_t c = 0; c < K; c++) {
            const REAL *z = Z + c * M + b * w;
            REAL *oc = O + c * Mo + b * o;
            int64_t k = 0;
            for (; k + 4 <= o; k += 4) {  /* four heads at a time: four independent sums hide the FMA latency */
                const REAL *w0 = Wh + k * w, *w1 = w0 + w, *w2 = w1 + w, *w3 = w2 + w;
                REAL s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+:s0, s1, s2, s3)
                for (int64_t u = 0; u < w; u++) {
                    REAL zu = z[u];
                    s0 += zu * w0[u];
                    s1 += zu * w1[u];
                    s2 += zu * w2[u];
                    s3 += zu * w3[u];
                }
                oc[k] = s0;
                oc[k + 1] = s1;
                oc[k + 2] = s2;
                oc[k + 3] = s3;
            }
            for (; k < o; k++) {
                const REAL *wk = Wh + k * w;
                REAL s0 = 0;
#pragma omp simd reduction(+:s0)
                for (int64_t u = 0; u < w; u++) s0 += z[u] * wk[u];
                oc[k] = s0;
            }
        }
    }
}

/* The first layer on the midpoints (A + Bq)/2 of rows idx (all if idx is NULL): the embedding's jets S
   (K, Ba, m) (translations at col[j]; angles: cos at col[j], sin at scol[j] >= 0), then Z (K, Ba, w) =
   tanh jets of S W1^T + b1 (W1t = W1^T, (m, w)). */
static void layer1_SUFFIX(int64_t Ba, int64_t n, int64_t K, int64_t m, int64_t w, const int64_t *col,
                          const int64_t *scol, const int64_t *idx, const REAL *A, const REAL *Bq, const REAL *W1t,
                          const REAL *b1, const int64_t *pj, const int64_t *pk, REAL *S, REAL *Z, REAL *tmp) {
    int64_t Ms = Ba * m, M = Ba * w;
    for (int64_t b = 0; b < Ba; b++) {
        int64_t i = idx ? idx[b] : b;
        for (int64_t c = 0; c < K; c++) memset(S + c * Ms + b * m, 0, (size_t)m * sizeof(REAL));
        REAL *s0 = S + b * m;
        for (int64_t j = 0; j < n; j++) {
            REAL qb = (REAL)0.5 * (A[i * n + j] + Bq[i * n + j]);
            if (scol[j] < 0) {
                s0[col[j]] = qb;
                if (K > 1) S[(1 + j) * Ms + b * m + col[j]] = 1;
            } else {
                REAL cs = COS(qb), sn = SIN(qb);
                s0[col[j]] = cs;
                s0[scol[j]] = sn;
                if (K > 1) {
                    S[(1 + j) * Ms + b * m + col[j]] = -sn;
                    S[(1 + j) * Ms + b * m + scol[j]] = cs;
                }
                if (K > 1 + n) {  /* the pair (j, j) */
                    int64_t p = j * n - j * (j - 1) / 2;
                    S[(1 + n + p) * Ms + b * m + col[j]] = -cs;
                    S[(1 + n + p) * Ms + b * m + scol[j]] = -sn;
                }
            }
        }
        for (int64_t c = 0; c < K; c++) {
            REAL *restrict z = Z + c * M + b * w;
            const REAL *sc = S + c * Ms + b * m;
            for (int64_t u = 0; u < w; u++) z[u] = 0;
            for (int64_t k = 0; k < m; k++) {
                REAL sv = sc[k];
                if (sv == 0) continue;  /* most derivative entries of the embedding */
                const REAL *wk = W1t + k * w;
                for (int64_t u = 0; u < w; u++) z[u] += sv * wk[u];
            }
        }
        tanh_row_SUFFIX(K, n, M, w, Z + b * w, b1, pj, pk, tmp);
    }
}

/* The factor's jets of one row: L[c] (c < K) from the heads' outputs O + c * cs (bias bh on c = 0):
   V (K), the diagonal pre-activations zd[c][i], sigma and sigma' of their values. */
static void factor_SUFFIX(int64_t n, int64_t K, const REAL *O, int64_t cs, const REAL *bh, const int64_t *pj,
                          const int64_t *pk, REAL L[KMAX][NMAX][NMAX], REAL *V, REAL zd[KMAX][NMAX], REAL *sg,
                          REAL *sg1) {
    for (int64_t c = 0; c < K; c++) {
        const REAL *oc = O + c * cs;
        V[c] = oc[0] + (c == 0 ? bh[0] : 0);
        for (int64_t i = 0; i < n; i++) zd[c][i] = oc[1 + i] + (c == 0 ? bh[1 + i] : 0);
        int64_t l = 0;
        for (int64_t r = 0; r < n; r++)
            for (int64_t k = 0; k < n; k++) {
                if (k < r) {
                    L[c][r][k] = oc[1 + n + l] + (c == 0 ? bh[1 + n + l] : 0);
                    l++;
                } else {
                    L[c][r][k] = 0;
                }
            }
    }
    for (int64_t i = 0; i < n; i++) {
        REAL z = zd[0][i], s = sigmoid_SUFFIX(z), s1 = s * (1 - s);
        sg[i] = s;
        sg1[i] = s1;
        L[0][i][i] = softplus_SUFFIX(z);
        for (int64_t j = 0; j < n && 1 + j < K; j++) L[1 + j][i][i] = s * zd[1 + j][i];
        for (int64_t p = 0; p + 1 + n < K; p++)
            L[1 + n + p][i][i] = s1 * zd[1 + pj[p]][i] * zd[1 + pk[p]][i] + s * zd[1 + n + p][i];
    }
}

/* One midpoint of one row from its heads' jets O (K comps cs apart): phi = d(v^T H v / 2 - V)/dq, p = H v and
   a norm bound Hs of H; with psi: also dHv[k][i] = ((dH/dq_k) v)_i, H and psi = d phi / dq, from the second-order
   jets when K has the pairs, else (coef != NULL) the part of psi from first derivatives and the weights coef (o)
   of the heads' second derivatives in the rest: psi_jk += sum_o coef_o d2 out_o / dq_j dq_k. */
static void terms_SUFFIX(const struct del_cfg *d, int64_t K, const REAL *O, int64_t cs, const REAL *v, REAL *phi,
                         REAL *p, REAL *Hs, REAL psi[NMAX][NMAX], REAL dHv[NMAX][NMAX], REAL H[NMAX][NMAX],
                         REAL *coef) {
    int64_t n = d->n;
    const REAL *bh = (const REAL *)d->bh;
    int second = K > 1 + n;
    if (d->paper) {  /* n = 1: H = softplus(z); always with second-order jets */
        REAL z = O[1] + bh[1], s = sigmoid_SUFFIX(z), Hv = softplus_SUFFIX(z);
        REAL dH = s * O[cs + 1], dV = O[cs];
        phi[0] = (REAL)0.5 * dH * v[0] * v[0] - dV;
        p[0] = Hv * v[0];
        *Hs = Hv;
        if (second) {
            REAL d2H = s * (1 - s) * O[cs + 1] * O[cs + 1] + s * O[2 * cs + 1];
            psi[0][0] = (REAL)0.5 * d2H * v[0] * v[0] - O[2 * cs];
            dHv[0][0] = dH * v[0];
            H[0][0] = Hv;
        }
        return;
    }
    REAL L[KMAX][NMAX][NMAX], V[KMAX], zd[KMAX][NMAX], sg[NMAX], sg1[NMAX];
    factor_SUFFIX(n, K, O, cs, bh, d->pj, d->pk, L, V, zd, sg, sg1);
    REAL y[KMAX][NMAX];  /* y[c] = L[c]^T v: w = y[0], a_k = y[1 + k] */
    for (int64_t c = 0; c < K; c++)
        for (int64_t k = 0; k < n; k++) {
            REAL s = 0;
            for (int64_t r = 0; r < n; r++) s += L[c][r][k] * v[r];
            y[c][k] = s;
        }
    REAL hs = 0;
    for (int64_t i = 0; i < n; i++) {
        REAL s = 0, pi = 0;
        for (int64_t k = 0; k < n; k++) {
            s += y[1 + i][k] * y[0][k];
            pi += L[0][i][k] * y[0][k];
            hs += L[0][i][k] * L[0][i][k];
        }
        phi[i] = s - V[1 + i];
        p[i] = pi + (REAL)d->epsl * v[i];
    }
    *Hs = hs + (REAL)d->epsl;
    if (!psi) return;
    if (second) {
        for (int64_t q = 0; q + 1 + n < K; q++) {
            int64_t j = d->pj[q], k = d->pk[q];
            REAL s = -V[1 + n + q];
            for (int64_t r = 0; r < n; r++) s += y[1 + n + q][r] * y[0][r] + y[1 + j][r] * y[1 + k][r];
            psi[j][k] = s;
            psi[k][j] = s;
        }
    } else {
        for (int64_t j = 0; j < n; j++)
            for (int64_t k = j; k < n; k++) {
                REAL s = 0;
                for (int64_t r = 0; r < n; r++)
                    s += y[1 + j][r] * y[1 + k][r] + v[r] * y[0][r] * sg1[r] * zd[1 + j][r] * zd[1 + k][r];
                psi[j][k] = s;
                psi[k][j] = s;
            }
        coef[0] = -1;
        int64_t l = 0;
        for (int64_t r = 0; r < n; r++) {
            coef[1 + r] = v[r] * y[0][r] * sg[r];
            for (int64_t c = 0; c < r; c++) coef[1 + n + l++] = v[r] * y[0][c];
        }
    }
    for (int64_t k = 0; k < n; k++)
        for (int64_t i = 0; i < n; i++) {
            REAL s = 0;
            for (int64_t r = 0; r < n; r++) s += L[1 + k][i][r] * y[0][r] + L[0][i][r] * y[1 + k][r];
            dHv[k][i] = s;
        }
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < n; k++) {
            REAL s = i == k ? (REAL)d->epsl : 0;
            for (int64_t r = 0; r < n; r++) s += L[0][i][r] * L[0][k][r];
            H[i][k] = s;
        }
}

/* Solve A x = b (trans: A^T x = b) in place in b by Gaussian elimination with partial pivoting;
   0 if A is singular or the solution is not finite. */
static int solve_SUFFIX(int64_t n, REAL A0[NMAX][NMAX], REAL *b, int trans) {
    REAL A[NMAX][NMAX];
    for (int64_t i = 0; i < n; i++)
        for (int64_t k = 0; k < n; k++) A[i][k] = trans ? A0[k][i] : A0[i][k];
    for (int64_t c = 0; c < n; c++) {
        int64_t piv = c;
        for (int64_t r = c + 1; r < n; r++)
            if (FABS(A[r][c]) > FABS(A[piv][c])) piv = r;
        if (!(A[piv][c] != 0)) return 0;
        if (piv != c) {
            for (int64_t k = 0; k < n; k++) {
                REAL t = A[c][k];
                A[c][k] = A[piv][k];
                A[piv][k] = t;
            }
            REAL t = b[c];
            b[c] = b[piv];
            b[piv] = t;
        }
        for (int64_t r = c + 1; r < n; r++) {
            REAL f = A[r][c] / A[c][c];
            for (int64_t k = c; k < n; k++) A[r][k] -= f * A[c][k];
            b[r] -= f * b[c];
        }
    }
    for (int64_t c = n - 1; c >= 0; c--) {
        REAL s = b[c];
        for (int64_t k = c + 1; k < n; k++) s -= A[c][k] * b[k];
        b[c] = s / A[c][c];
        if (!isfinite(b[c])) return 0;
    }
    return 1;
}

/* The known part: c = D2 L_d(q_prev, q) + ft and the per-sample tolerance
   max(tol, 2 eps_mach ||H|| (max |q| + 1) / h) from the first midpoint's heads O0 (K1, B, o). */
static void known_SUFFIX(const struct del_cfg *d) {
    int64_t n = d->n, B = d->B, o = d->o;
    const REAL *ft = (const REAL *)d->ft;
    REAL *c = (REAL *)d->c, *tolb = (REAL *)d->tolb;
    double tol = d->tol;
    const REAL *qp = (const REAL *)d->q_prev, *q = (const REAL *)d->q, *O = (const REAL *)d->O0;
    REAL h = (REAL)d->h;
    for (int64_t i = 0; i < B; i++) {
        REAL v[NMAX], phi[NMAX], p[NMAX], Hs, qmax = 0;
        for (int64_t j = 0; j < n; j++) {
            v[j] = (q[i * n + j] - qp[i * n + j]) / h;
            if (FABS(q[i * n + j]) > qmax) qmax = FABS(q[i * n + j]);
        }
        terms_SUFFIX(d, d->K1, O + i * o, B * o, v, phi, p, &Hs, NULL, NULL, NULL, NULL);
        for (int64_t j = 0; j < n; j++) c[i * n + j] = (REAL)0.5 * h * phi[j] + p[j] + ft[i * n + j];
        double fl = 2 * d->eps_mach / d->h * (double)Hs * ((double)qmax + 1);
        tolb[i] = (REAL)(fl > tol ? fl : tol);
    }
}

/* Rows r of the backward stacks X (2, 2B, width): (value, sum_k mu_k derivative_k) of jets J (K, rows, width)
   at row b (comp stride Mj); zero rows when mu is NULL. */
static void put_rows_SUFFIX(int64_t n, int64_t width, int64_t B2w, const REAL *J, int64_t Mj, int64_t b,
                            const REAL *mu, REAL *X, int64_t r) {
    REAL *restrict x0 = X + r * width, *restrict x1 = X + B2w + r * width;
    if (!mu) {
        memset(x0, 0, (size_t)width * sizeof(REAL));
        memset(x1, 0, (size_t)width * sizeof(REAL));
        return;
    }
    const REAL *j0 = J + b * width, *j1 = J + Mj + b * width;
    REAL m0 = mu[0];
    for (int64_t u = 0; u < width; u++) {
        x0[u] = j0[u];
        x1[u] = m0 * j1[u];
    }
    for (int64_t k = 1; k < n; k++) {
        const REAL *jk = J + (1 + k) * Mj + b * width;
        REAL mk = mu[k];
        for (int64_t u = 0; u < width; u++) x1[u] += mk * jk[u];
    }
}

/* The cotangents of sum_mid [(h/2) mu . phi + sign mu . p] with respect to the heads' outputs (G[0] row r)
   and their derivatives along mu (G[1] row r), from one midpoint's first-order heads O (comp stride cs). */
static void head_cot_SUFFIX(const struct del_cfg *d, const REAL *O, int64_t cs, const REAL *v, const REAL *mu,
                            REAL sign, REAL *G, int64_t r) {
    int64_t n = d->n, o = d->o, B2o = 2 * d->B * o;
    const REAL *bh = (const REAL *)d->bh;
    REAL *g0 = G + r * o, *g1 = G + B2o + r * o, hh = (REAL)0.5 * (REAL)d->h;
    if (!mu) {
        for (int64_t k = 0; k < o; k++) g0[k] = g1[k] = 0;
        return;
    }
    g0[0] = 0;
    g1[0] = -hh;
    if (d->paper) {
        REAL z = O[1] + bh[1], s = sigmoid_SUFFIX(z), zm = mu[0] * O[cs + 1], vv = (REAL)0.5 * v[0] * v[0];
        g0[1] = hh * vv * s * (1 - s) * zm + sign * v[0] * mu[0] * s;
        g1[1] = hh * vv * s;
        return;
    }
    REAL L[KMAX][NMAX][NMAX], V[KMAX], zd[KMAX][NMAX], sg[NMAX], sg1[NMAX];
    factor_SUFFIX(n, 1 + n, O, cs, bh, d->pj, d->pk, L, V, zd, sg, sg1);
    REAL Lm[NMAX][NMAX], w[NMAX], am[NMAX], lt[NMAX];
    for (int64_t a = 0; a < n; a++)
        for (int64_t b = 0; b < n; b++) {
            REAL s = 0;
            for (int64_t k = 0; k < n; k++) s += mu[k] * L[1 + k][a][b];
            Lm[a][b] = s;
        }
    for (int64_t c = 0; c < n; c++) {
        REAL s = 0, t = 0, u = 0;
        for (int64_t a = 0; a < n; a++) {
            s += L[0][a][c] * v[a];
            t += Lm[a][c] * v[a];
            u += L[0][a][c] * mu[a];
        }
        w[c] = s;
        am[c] = t;
        lt[c] = u;
    }
    int64_t l = 0;
    for (int64_t a = 0; a < n; a++)
        for (int64_t c = 0; c <= a; c++) {
            REAL dLm = hh * v[a] * w[c];
            REAL dL0 = hh * am[c] * v[a] + sign * (mu[a] * w[c] + lt[c] * v[a]);
            if (c == a) {
                REAL zm = 0;
                for (int64_t k = 0; k < n; k++) zm += mu[k] * zd[1 + k][a];
                g0[1 + a] = dL0 * sg[a] + dLm * sg1[a] * zm;
                g1[1 + a] = dLm * sg[a];
            } else {
                g0[1 + n + l] = dL0;
                g1[1 + n + l] = dLm;
                l++;
            }
        }
}

/* Row b (sample i) of a Newton evaluation at iteration it, with residual g and Jacobian J at its iterate:
   converged (status 1; with grad: the adjoint mu = -J^-T 2 (x - q_next) and the row's backward rows), failed
   (status 2: non-finite residual, singular Jacobian, it = max_iter) or a Newton step (returns 1). */
static int finish_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t b, int64_t i, int64_t it, REAL *g,
                         REAL J[NMAX][NMAX], const REAL *v) {
    int64_t n = d->n, o = d->o, m = d->m, w = d->w, B = d->B;
    REAL h = (REAL)d->h;
    REAL *x = (REAL *)d->x;
    const REAL *q = (const REAL *)d->q, *qp = (const REAL *)d->q_prev, *qn = (const REAL *)d->q_next;
    const REAL *tolb = (const REAL *)d->tolb;
    REAL rn = 0;
    int finite = 1;
    for (int64_t j = 0; j < n; j++) {
        if (!isfinite(g[j])) finite = 0;
        if (FABS(g[j]) > rn) rn = FABS(g[j]);
    }
    int64_t st;
    REAL mu[NMAX];
    if (!finite) {
        st = 2;
    } else if (rn <= tolb[i]) {
        st = 1;
        if (d->grad) {
            for (int64_t j = 0; j < n; j++) mu[j] = -2 * (x[i * n + j] - qn[i * n + j]);
            if (!solve_SUFFIX(n, J, mu, 1)) st = 2;
        }
    } else if (it >= d->max_iter || !solve_SUFFIX(n, J, g, 0)) {
        st = 2;
    } else {
        for (int64_t j = 0; j < n; j++) x[i * n + j] -= g[j];
        return 1;
    }
    d->status[i] = st;
    ((REAL *)d->rn)[i] = finite ? rn : (REAL)NAN;
    d->iters[i] = it;
    if (st == 1) {
        double e = 0;
        for (int64_t j = 0; j < n; j++) {
            double t = (double)x[i * n + j] - (double)qn[i * n + j];
            e += t * t;
        }
        d->acc[0] += e;
        d->acc[1] += 1;
    }
    if (!d->grad) return 0;
    const REAL *mp = st == 1 ? mu : NULL;
    /* the root's midpoint: rows B + i, from this iteration's jets */
    put_rows_SUFFIX(n, m, 2 * B * m, (const REAL *)d->S, Ba * m, b, mp, (REAL *)d->Sv, B + i);
    put_rows_SUFFIX(n, w, 2 * B * w, (const REAL *)d->H1, Ba * w, b, mp, (REAL *)d->H1v, B + i);
    put_rows_SUFFIX(n, w, 2 * B * w, (const REAL *)d->H2, Ba * w, b, mp, (REAL *)d->H2v, B + i);
    head_cot_SUFFIX(d, (const REAL *)d->O + b * o, Ba * o, v, mp, -1, (REAL *)d->G, B + i);
    /* the first midpoint: rows i, from the known part's jets */
    REAL v0[NMAX];
    for (int64_t j = 0; j < n; j++) v0[j] = (q[i * n + j] - qp[i * n + j]) / h;
    put_rows_SUFFIX(n, m, 2 * B * m, (const REAL *)d->S0, B * m, i, mp, (REAL *)d->Sv, i);
    put_rows_SUFFIX(n, w, 2 * B * w, (const REAL *)d->H10, B * w, i, mp, (REAL *)d->H1v, i);
    put_rows_SUFFIX(n, w, 2 * B * w, (const REAL *)d->H20, B * w, i, mp, (REAL *)d->H2v, i);
    head_cot_SUFFIX(d, (const REAL *)d->O0 + i * o, B * o, v0, mp, 1, (REAL *)d->G, i);
    return 0;
}

static void residual_SUFFIX(const struct del_cfg *d, int64_t i, const REAL *phi, const REAL *p, REAL *g) {
    const REAL *c = (const REAL *)d->c;
    for (int64_t j = 0; j < d->n; j++) g[j] = (REAL)0.5 * (REAL)d->h * phi[j] - p[j] + c[i * d->n + j];
}

static void velocity_SUFFIX(const struct del_cfg *d, int64_t i, REAL *v) {
    const REAL *x = (const REAL *)d->x, *q = (const REAL *)d->q;
    for (int64_t j = 0; j < d->n; j++) v[j] = (x[i * d->n + j] - q[i * d->n + j]) / (REAL)d->h;
}

/* One Newton evaluation of the Ba rows idx at iteration it from the heads' second-order jets O (K2, Ba, o)
   (see finish); the rows that iterate on are listed in idx_out, their number returned. acc[0] += squared
   errors of converged rows, acc[1] += their count. */
static int64_t newton_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t it, const int64_t *idx, int64_t *idx_out) {
    int64_t n = d->n, o = d->o, na = 0;
    REAL h = (REAL)d->h;
    for (int64_t b = 0; b < Ba; b++) {
        int64_t i = idx[b];
        REAL v[NMAX], phi[NMAX], p[NMAX], Hs, psi[NMAX][NMAX], dHv[NMAX][NMAX], H[NMAX][NMAX], g[NMAX];
        REAL J[NMAX][NMAX];
        velocity_SUFFIX(d, i, v);
        terms_SUFFIX(d, d->K2, (const REAL *)d->O + b * o, Ba * o, v, phi, p, &Hs, psi, dHv, H, NULL);
        residual_SUFFIX(d, i, phi, p, g);
        for (int64_t j = 0; j < n; j++)
            for (int64_t k = 0; k < n; k++)
                J[j][k] = (REAL)0.25 * h * psi[j][k] + (REAL)0.5 * (dHv[j][k] - dHv[k][j]) - H[j][k] / h;
        if (finish_SUFFIX(d, Ba, b, i, it, g, J, v)) idx_out[na++] = i;
    }
    return na;
}

/* Newton with first-order jets and psi's second-derivative part by one reverse pass (n >= 2): the network's
   second derivatives enter psi only as sum_o coef_o d2 out_o, the Hessian of one weighted sum of the heads,
   which costs one product with W2 instead of n (n + 1) / 2 forward ones. Three stages around two products:
   rev_a: from the heads' first-order jets O (K1, Ba, o): the residual g and the Jacobian without those terms
   into Pr (Ba, n + n^2); the rows that take the exact Jacobian -- all (all != 0) or those that converged here
   (their adjoint needs it) -- get sel[b] = their position in coef (ns, o), the others -1; returns ns
   (E2 = coef Wh follows);
   rev_b: E2 (ns, w) -> E2 * t2 (E1 = that W2 follows), psi's layer-2 term added to Pr;
   rev_c: psi's layer-1 and embedding terms from E1 for the selected rows, then finish (returns the rows that
   iterate on; the others step with rev_a's Jacobian: a quasi-Newton step). */
static int64_t rev_a_SUFFIX(const struct del_cfg *d, int64_t Ba, const int64_t *idx, int64_t all) {
    int64_t n = d->n, o = d->o, PR = n + n * n, ns = 0, *sel = d->sel;
    REAL *Pr = (REAL *)d->Pr, *coef = (REAL *)d->coef;
    REAL h = (REAL)d->h;
    const REAL *tolb = (const REAL *)d->tolb;
    for (int64_t b = 0; b < Ba; b++) {
        int64_t i = idx[b];
        REAL v[NMAX], phi[NMAX], p[NMAX], Hs, psi[NMAX][NMAX], dHv[NMAX][NMAX], H[NMAX][NMAX], cf[NMAX * NMAX];
        velocity_SUFFIX(d, i, v);
        terms_SUFFIX(d, d->K1, (const REAL *)d->O + b * o, Ba * o, v, phi, p, &Hs, psi, dHv, H, cf);
        REAL *pr = Pr + b * PR;
        residual_SUFFIX(d, i, phi, p, pr);
        for (int64_t j = 0; j < n; j++)
            for (int64_t k = 0; k < n; k++)
                pr[n + j * n + k] = (REAL)0.25 * h * psi[j][k] + (REAL)0.5 * (dHv[j][k] - dHv[k][j]) - H[j][k] / h;
        REAL rn = 0;
        for (int64_t j = 0; j < n; j++) rn = FABS(pr[j]) > rn ? FABS(pr[j]) : rn;
        if (all || rn <= tolb[i]) {
            for (int64_t k = 0; k < o; k++) coef[ns * o + k] = cf[k];
            sel[b] = ns++;
        } else {
            sel[b] = -1;
        }
    }
    return ns;
}

/* sum_u f_u a_u b_u for the pairs of rows (A + pj M, A + pk M), added with weight s to the symmetric J in pr */
static void pair_sums_SUFFIX(int64_t n, int64_t w, int64_t M, const REAL *f, const REAL *A, const int64_t *pj,
                             const int64_t *pk, REAL s, REAL *J) {
    int64_t P = n * (n + 1) / 2;
    for (int64_t q0 = 0; q0 < P; q0 += 4) {  /* four pairs at a time (the last group padded with its first) */
        const REAL *a[4], *c[4];
        for (int64_t t = 0; t < 4; t++) {
            int64_t q = q0 + t < P ? q0 + t : q0;
            a[t] = A + (1 + pj[q]) * M;
            c[t] = A + (1 + pk[q]) * M;
        }
        const REAL *a0 = a[0], *a1 = a[1], *a2 = a[2], *a3 = a[3], *c0 = c[0], *c1 = c[1], *c2 = c[2], *c3 = c[3];
        REAL s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma omp simd reduction(+:s0, s1, s2, s3)
        for (int64_t u = 0; u < w; u++) {
            REAL fu = f[u];
            s0 += fu * a0[u] * c0[u];
            s1 += fu * a1[u] * c1[u];
            s2 += fu * a2[u] * c2[u];
            s3 += fu * a3[u] * c3[u];
        }
        REAL sv[4] = {s0, s1, s2, s3};
        for (int64_t t = 0; t < 4 && q0 + t < P; t++) {
            int64_t q = q0 + t;
            J[pj[q] * n + pk[q]] += s * sv[t];
            if (pj[q] != pk[q]) J[pk[q] * n + pj[q]] += s * sv[t];
        }
    }
}

static void rev_b_SUFFIX(const struct del_cfg *d, int64_t Ba) {
    int64_t n = d->n, w = d->w, PR = n + n * n, M = Ba * w;
    const int64_t *sel = d->sel;
    REAL *E = (REAL *)d->E2, *Pr = (REAL *)d->Pr, *tmp = (REAL *)d->tmp;
    REAL q4 = (REAL)0.25 * (REAL)d->h;
    const REAL *H2 = (const REAL *)d->H2;
    for (int64_t b = 0; b < Ba; b++) {
        if (sel[b] < 0) continue;
        const REAL *h = H2 + b * w;
        REAL *restrict e = E + sel[b] * w, *restrict f = tmp;
        for (int64_t u = 0; u < w; u++) {
            /* m2 z_j z_k = -2 h t z_j z_k = -2 h h_j h_k / t with the forward's own t (0 where tanh saturated) */
            REAL t = 1 - h[u] * h[u];
            f[u] = t > 0 ? -2 * h[u] * e[u] / t : 0;
            e[u] *= t;
        }
        pair_sums_SUFFIX(n, w, M, f, H2 + b * w, d->pj, d->pk, q4, Pr + b * PR + n);
    }
}

static int64_t rev_c_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t it, const int64_t *idx, int64_t *idx_out) {
    int64_t n = d->n, w = d->w, m = d->m, PR = n + n * n, M = Ba * w, na = 0;
    const int64_t *sel = d->sel, *col = d->col, *scol = d->scol;
    const REAL *E1 = (const REAL *)d->E1, *W1t = (const REAL *)d->W1t;
    REAL *Pr = (REAL *)d->Pr, *tmp = (REAL *)d->tmp;
    REAL q4 = (REAL)0.25 * (REAL)d->h;
    const REAL *H1 = (const REAL *)d->H1, *S = (const REAL *)d->S;
    for (int64_t b = 0; b < Ba; b++) {
        int64_t i = idx[b], exact = sel[b] >= 0;
        const REAL *h = H1 + b * w, *e = E1 + (exact ? sel[b] : 0) * w;
        REAL *restrict f = tmp, *restrict et = tmp + w;
        REAL *pr = Pr + b * PR, *Jf = pr + n;
        if (exact) {
            for (int64_t u = 0; u < w; u++) {
                REAL t = 1 - h[u] * h[u];
                f[u] = t > 0 ? -2 * h[u] * e[u] / t : 0;
                et[u] = e[u] * t;
            }
            pair_sums_SUFFIX(n, w, M, f, H1 + b * w, d->pj, d->pk, q4, Jf);
        }
        /* the embedding's second derivatives: angle j, d2 (cos, sin) / dq_j^2 = -(cos, sin) */
        for (int64_t j = 0; j < n && exact; j++) {
            if (scol[j] < 0) continue;
            REAL cs = S[b * m + col[j]], sn = S[b * m + scol[j]], ac = 0, as = 0;
#pragma omp simd reduction(+:ac, as)
            for (int64_t u = 0; u < w; u++) {
                ac += et[u] * W1t[col[j] * w + u];
                as += et[u] * W1t[scol[j] * w + u];
            }
            Jf[j * n + j] -= q4 * (cs * ac + sn * as);
        }
        REAL J[NMAX][NMAX], v[NMAX];
        for (int64_t j = 0; j < n; j++)
            for (int64_t k = 0; k < n; k++) J[j][k] = Jf[j * n + k];
        velocity_SUFFIX(d, i, v);
        if (finish_SUFFIX(d, Ba, b, i, it, pr, J, v)) idx_out[na++] = i;
    }
    return na;
}

/* The network on the jets (K components) of Ba midpoints (A + Bq)/2 (rows idx, all if NULL): S (K, Ba, m),
   Z1 -> Z2 (K, Ba, w) (the activations' jets), O (K, Ba, o). */
static void network_SUFFIX(const struct del_cfg *d, int64_t K, int64_t Ba, const int64_t *idx, const REAL *A,
                           const REAL *Bq, REAL *S, REAL *Z1, REAL *Z2, REAL *O) {
    int64_t n = d->n, m = d->m, w = d->w;
    REAL *tmp = (REAL *)d->tmp;
    layer1_SUFFIX(Ba, n, K, m, w, d->col, d->scol, idx, A, Bq, (const REAL *)d->W1t, (const REAL *)d->b1, d->pj,
                  d->pk, S, Z1, tmp);
    mm_SUFFIX(d, K * Ba, Z1, 1, Z2);
    tanh_heads_SUFFIX(K, n, Ba, w, d->o, Z2, (const REAL *)d->b2, (const REAL *)d->Wh, O, d->pj, d->pk, tmp);
}

/* Newton from x for every sample (see the module and _Plan.solve); returns the steps of the longest. */
int64_t del_solve_SUFFIX(struct del_cfg *d) {
    int64_t B = d->B, o = d->o, w = d->w;
    REAL *x = (REAL *)d->x;
    const REAL *q = (const REAL *)d->q, *Wh = (const REAL *)d->Wh;
    network_SUFFIX(d, d->K1, B, NULL, (const REAL *)d->q_prev, q, (REAL *)d->S0, (REAL *)d->H10, (REAL *)d->H20,
                   (REAL *)d->O0);
    known_SUFFIX(d);
    int64_t *idx = d->idx, *idx2 = d->idx2, Ba = B, it = 0;
    for (int64_t b = 0; b < B; b++) idx[b] = b;
    const REAL *coef = (const REAL *)d->coef;
    REAL *E2 = (REAL *)d->E2;
    for (;;) {
        network_SUFFIX(d, d->K2, Ba, idx, q, x, (REAL *)d->S, (REAL *)d->H1, (REAL *)d->H2, (REAL *)d->O);
        if (d->reverse) {
            int64_t ns = rev_a_SUFFIX(d, Ba, idx, it >= d->quasi);
            for (int64_t r = 0; r < ns; r++) heads_back_SUFFIX(o, w, coef + r * o, Wh, E2 + r * w);  /* E2 = coef Wh */
            if (ns) {
                rev_b_SUFFIX(d, Ba);
                mm_SUFFIX(d, ns, E2, 0, (REAL *)d->E1);
            }
            Ba = rev_c_SUFFIX(d, Ba, it, idx, idx2);
        } else {
            Ba = newton_SUFFIX(d, Ba, it, idx, idx2);
        }
        if (Ba == 0) return it;
        int64_t *t = idx;
        idx = idx2;
        idx2 = t;
        it++;
    }
}

/* The reverse of h = tanh(z), hd = (1 - h^2) zd on the (value, direction) rows H (2, rows, w), one pass: GH
   (2, rows, w) receives the cotangents of (z, zd) from those of (h, hd) -- GH itself, or with Gin != NULL the
   rows of Gin (2, rows, o) Wh (Wh (o, w)) -- and gb (w) the sum of the value rows'. With X (2, rows, a) also
   acc (a, w) = sum over all rows of X's row (outer) H's row (post = 0) or the new GH row (post = 1): the weight
   gradients of the layer after (post = 0) or before (post = 1) the activation, while the rows are in cache
   (as BLAS products with a <= 22 columns these run far below the hardware's rate). */
static void back_tanh_sum_SUFFIX(int64_t rows, int64_t w, int64_t o, const REAL *Gin, const REAL *Wh, REAL *GH,
                                 const REAL *H, REAL *gb, int64_t a, const REAL *X, int post, REAL *acc) {
    int64_t M = rows * w;
    for (int64_t u = 0; u < w; u++) gb[u] = 0;
    for (int64_t e = 0; e < a * w; e++) acc[e] = 0;
    for (int64_t r = 0; r < rows; r++) {
        REAL *restrict g0 = GH + r * w, *restrict g1 = GH + M + r * w, *restrict s = gb;
        const REAL *h0 = H + r * w, *h1 = H + M + r * w;
        if (Gin) {
            heads_back_SUFFIX(o, w, Gin + r * o, Wh, g0);
            heads_back_SUFFIX(o, w, Gin + (rows + r) * o, Wh, g1);
        }
        if (!post)
            for (int64_t k = 0; k < a; k++) {
                REAL *restrict ak = acc + k * w;
                REAL x0 = X[r * a + k], x1 = X[(rows + r) * a + k];
                for (int64_t u = 0; u < w; u++) ak[u] += x0 * h0[u] + x1 * h1[u];
            }
        for (int64_t u = 0; u < w; u++) {
            REAL t = 1 - h0[u] * h0[u], v = t * g0[u] - 2 * h0[u] * h1[u] * g1[u];
            g0[u] = v;
            g1[u] = t * g1[u];
            s[u] += v;
        }
        if (post)
            for (int64_t k = 0; k < a; k++) {
                REAL *restrict ak = acc + k * w;
                REAL x0 = X[r * a + k], x1 = X[(rows + r) * a + k];
                for (int64_t u = 0; u < w; u++) ak[u] += x0 * g0[u] + x1 * g1[u];
            }
    }
}

/* The parameter gradient (gW1, gb1, gW2, gb2, gWh, gbh) of scale times the weighted residual whose rows
   (Sv, H1v, H2v, G) the last solve with grad left: the reverse pass of the (value, direction) rows, R = 4 B. */
void del_gradient_SUFFIX(struct del_cfg *d, double scale) {
    int64_t R = 4 * d->B, R2 = 2 * d->B, w = d->w, m = d->m, o = d->o;
    REAL *G = (REAL *)d->G, *GH = (REAL *)d->GH, *GH1 = (REAL *)d->GH1, *gbh = (REAL *)d->gbh;
    const REAL *Wh = (const REAL *)d->Wh;
    if (scale != 1)
        for (int64_t e = 0; e < R * o; e++) G[e] *= (REAL)scale;
    for (int64_t k = 0; k < o; k++) gbh[k] = 0;
    for (int64_t r = 0; r < R2; r++)
        for (int64_t k = 0; k < o; k++) gbh[k] += G[r * o + k];
    /* GH = G Wh reversed through tanh; gWh = G^T H2v */
    back_tanh_sum_SUFFIX(R2, w, o, G, Wh, GH, (const REAL *)d->H2v, (REAL *)d->gb2, o, G, 0, (REAL *)d->gWh);
    mm_tn_SUFFIX(d, w, w, R, GH, (const REAL *)d->H1v, (REAL *)d->gW2);
    mm_SUFFIX(d, R, GH, 0, GH1);
    /* GH1 reversed through tanh; gW1^T = Sv^T GH1 (m, w), transposed into gW1 (w, m) */
    REAL *acc = (REAL *)d->wacc, *gW1 = (REAL *)d->gW1;
    back_tanh_sum_SUFFIX(R2, w, o, NULL, Wh, GH1, (const REAL *)d->H1v, (REAL *)d->gb1, m, (const REAL *)d->Sv, 1,
                         acc);
    for (int64_t u = 0; u < w; u++)
        for (int64_t k = 0; k < m; k++) gW1[u * m + k] = acc[k * w + u];
}
"""

_VARIANTS = (("double", "f64", "tanh_f64", "exp", "log1p", "fabs", "cos", "sin"),
             ("float", "f32", "tanh_f32", "expf", "log1pf", "fabsf", "cosf", "sinf"))


def _source() -> str:
    out = [_TANH]
    for real, suffix, tanh, exp, log1p, fabs, cos, sin in _VARIANTS:
        out.append(_TEMPLATE.replace("REAL", real).replace("SUFFIX", suffix).replace("TANH", tanh)
                   .replace("EXP", exp).replace("LOG1P", log1p).replace("FABS", fabs).replace("COS", cos)
                   .replace("SIN", sin))
    return "".join(out)


class _Cfg(ctypes.Structure):
    """The C ``struct del_cfg``."""

    _fields_ = ([(f, ctypes.c_int64) for f in ("B", "n", "o", "m", "w", "paper", "K1", "K2", "grad")]
                + [(f, ctypes.c_double) for f in ("h", "epsl")]
                + [(f, ctypes.c_void_p) for f in ("pj", "pk", "bh", "q_prev", "q", "q_next", "c", "tolb", "x",
                                                   "status", "iters", "acc", "S0", "H10", "H20", "O0", "S", "H1",
                                                   "H2", "O", "Sv", "H1v", "H2v", "G", "rn")]
                + [(f, ctypes.c_int64) for f in ("max_iter", "quasi", "reverse")]
                + [(f, ctypes.c_double) for f in ("tol", "eps_mach")]
                + [(f, ctypes.c_void_p) for f in ("gemm", "W1t", "b1", "W2", "b2", "Wh", "ft", "col", "scol", "idx",
                                                   "idx2", "sel", "Pr", "coef", "E2", "E1", "tmp", "GH", "GH1", "wacc",
                                                   "gW1", "gb1", "gW2", "gb2", "gWh", "gbh")])


def _torch_gemm() -> dict | None:
    """Addresses of the Fortran-interface ``sgemm``/``dgemm`` that ``libtorch_cpu`` exports in MKL builds (the
    kernels ``torch.mm`` runs), or ``None``."""
    for path in sorted(glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "*torch_cpu.*"))):
        try:
            lib = ctypes.CDLL(path)
            return {torch.float32: ctypes.cast(lib.sgemm_, ctypes.c_void_p).value,
                    torch.float64: ctypes.cast(lib.dgemm_, ctypes.c_void_p).value}
        except (OSError, AttributeError):
            continue
    return None


def _scipy_gemm() -> dict | None:
    """The same from SciPy's BLAS (``scipy.linalg.cython_blas``, the same signature), or ``None``."""
    try:
        from scipy.linalg import cython_blas
    except ImportError:
        return None
    api = ctypes.pythonapi
    api.PyCapsule_GetName.restype, api.PyCapsule_GetName.argtypes = ctypes.c_char_p, [ctypes.py_object]
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    caps = cython_blas.__pyx_capi__
    return {dt: api.PyCapsule_GetPointer(caps[k], api.PyCapsule_GetName(caps[k]))
            for dt, k in ((torch.float32, "sgemm"), (torch.float64, "dgemm"))}


_LIB: list = []
_GEMM: dict = {}
_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}


def library():
    """The compiled library, or ``None`` where it cannot be built (no C compiler) or no BLAS is found."""
    if not _LIB:
        gemm = _torch_gemm() or _scipy_gemm()
        try:
            if not gemm:
                raise NativeUnavailable("no Fortran-interface BLAS found")
            source = _source()
            key = "diffmech-e2e-symo-" + hashlib.sha256(source.encode()).hexdigest()
            lib, _ = load_kernel(key, lambda: (source, {"kernel": "E2E-SyMo objective"}), name="E2E-SyMo objective",
                                 symbols=tuple(f"{f}_{s}" for f in ("del_solve", "del_gradient")
                                               for s in ("f64", "f32")))
        except NativeUnavailable:
            lib = None
        else:
            _GEMM.update(gemm)
            for s in ("f64", "f32"):
                f = getattr(lib, f"del_solve_{s}")
                f.restype, f.argtypes = ctypes.c_int64, [ctypes.POINTER(_Cfg)]
                f = getattr(lib, f"del_gradient_{s}")
                f.restype, f.argtypes = None, [ctypes.POINTER(_Cfg), ctypes.c_double]
        _LIB.append(lib)
    return _LIB[0]


# ------------------------------------------------------------------------------------------ the solve
class _Plan:
    """What the solves of one network shape, batch size and precision reuse: the kernels, index arrays, the C
    configuration and the scratch buffers (allocated once: fresh megabytes every step cost page faults)."""

    def __init__(self, net, B: int, dtype):
        lib = library()
        sfx = _SUFFIX[dtype]
        n, w, m = net.n, net.width, net.embed.n_out
        o = 1 + n + n * (n - 1) // 2
        self.n, self.m, self.w, self.o, self.B, self.dtype = n, m, w, o, B, dtype
        self.solve_fn, self.gradient_fn = getattr(lib, f"del_solve_{sfx}"), getattr(lib, f"del_gradient_{sfx}")
        i64 = dict(dtype=torch.int64)
        self.pj, self.pk = torch.tensor(net._pj, **i64), torch.tensor(net._pk, **i64)
        lin = [j for j in range(n) if not net.embed.angle_mask[j]]
        ang = [j for j in range(n) if net.embed.angle_mask[j]]
        col, scol = [0] * n, [-1] * n
        for c, j in enumerate(lin):
            col[j] = c
        for a, j in enumerate(ang):
            col[j], scol[j] = len(lin) + a, len(lin) + len(ang) + a
        self.col, self.scol = torch.tensor(col, **i64), torch.tensor(scol, **i64)
        K1 = 1 + n
        # n >= 2: psi's network part by a reverse pass, 2 + n products with W2 per Newton evaluation instead of
        # the 1 + n + n(n+1)/2 of second-order jets (the same for n = 1, where the jets take fewer calls)
        reverse = n >= 2
        K2 = K1 if reverse else 1 + n + n * (n + 1) // 2
        f = dict(dtype=dtype)
        self.S0, self.Z10, self.Z20, self.O0 = (torch.empty(K1 * B * k, **f) for k in (m, w, w, o))
        self.S, self.Z1, self.Z2, self.O = (torch.empty(K2 * B * k, **f) for k in (m, w, w, o))
        self.c, self.tolb = torch.empty(B, n, **f), torch.empty(B, **f)
        self.idx, self.idx2, self.sel = (torch.empty(B, **i64) for _ in range(3))
        self.iters = torch.zeros(B, **i64)  # each sample's Newton steps
        self.tmp = torch.empty(2 * w, **f)
        self.Pr, self.coef = torch.empty(B * (n + n * n), **f), torch.empty(B * o, **f)
        self.E2, self.E1 = torch.empty(B, w, **f), torch.empty(B, w, **f)
        self.W1t = torch.empty(m, w, **f)
        self._grad_buffers: tuple | None = None
        ptr = {k: getattr(self, k).data_ptr() for k in ("pj", "pk", "c", "tolb", "S0", "S", "O0", "O", "iters",
                                                        "col", "scol", "idx", "idx2", "sel", "Pr", "coef", "E2",
                                                        "E1", "tmp", "W1t")}
        self.cfg = _Cfg(B=B, n=n, o=o, m=m, w=w, paper=int(n == 1 and net.inertia_kind == "paper"), K1=K1, K2=K2,
                        h=0.0, epsl=float(net.eps), H10=self.Z10.data_ptr(), H20=self.Z20.data_ptr(),
                        H1=self.Z1.data_ptr(), H2=self.Z2.data_ptr(), reverse=int(reverse),
                        eps_mach=float(torch.finfo(dtype).eps), gemm=_GEMM[dtype], **ptr)
        self.ref = ctypes.byref(self.cfg)
        self.busy = False

    def _grad_rows(self) -> None:
        """The gradient's buffers, made on first use (solves without gradients do not need them): the backward
        rows ``(Sv, H1v, H2v, G)`` (2, 2B, .) -- (value, derivative along the adjoint) at both midpoints -- and
        the reverse pass's ``(GH, GH1)`` (4B, w) and ``wacc`` (max(m, o), w)."""
        if self._grad_buffers is None:
            B, m, w, o, f = self.B, self.m, self.w, self.o, dict(dtype=self.dtype)
            self._grad_buffers = (torch.empty(2, 2 * B, m, **f), torch.empty(2, 2 * B, w, **f),
                                  torch.empty(2, 2 * B, w, **f), torch.empty(2, 2 * B, o, **f),
                                  torch.empty(4 * B, w, **f), torch.empty(4 * B, w, **f),
                                  torch.empty(max(m, o), w, **f))
            cfg = self.cfg
            cfg.Sv, cfg.H1v, cfg.H2v, cfg.G, cfg.GH, cfg.GH1, cfg.wacc = (t.data_ptr() for t in self._grad_buffers)

    def gradient(self, scale: float) -> tuple[Tensor, ...]:
        """The parameter gradient ``(W1, b1, W2, b2, Wh, bh)`` of ``scale`` times the weighted residual whose
        rows the last solve with ``grad`` left: the reverse pass of the (value, direction) rows."""
        w, m, o, f = self.w, self.m, self.o, dict(dtype=self.dtype)
        # fresh tensors: autograd may keep them as the parameters' .grad
        grads = (torch.empty(w, m, **f), torch.empty(w, **f), torch.empty(w, w, **f), torch.empty(w, **f),
                 torch.empty(o, w, **f), torch.empty(o, **f))
        cfg = self.cfg
        cfg.gW1, cfg.gb1, cfg.gW2, cfg.gb2, cfg.gWh, cfg.gbh = (g.data_ptr() for g in grads)
        self.gradient_fn(self.ref, float(scale))
        return grads

    def solve(self, model, q_prev, q, q_next, ft, x, params, grad: bool, tol: float, max_iter: int, quasi: bool):
        """Newton from ``x (B, n)`` (updated in place); with ``grad`` also the backward pass's rows (in
        :meth:`_grad_rows`); ``quasi``: the first ``QUASI_NEWTON_STEPS`` steps of each sample without the network's
        second derivatives, that far from the root the step's error is Newton's quadratic term (the network's
        second derivatives weigh h^2/4 against the inertia); rows that converge there take the exact Jacobian
        (their adjoint needs it). Returns ``(status, iterations, acc, rn)``: per sample 1 converged / 2 failed,
        the steps of the longest, the converged samples' squared errors against ``q_next`` and their number,
        each sample's final ``max |residual|``."""
        W1, b1, W2, b2, Wh, bh = params
        B = self.B
        self.W1t.copy_(W1.t())
        status = torch.zeros(B, dtype=torch.int64)
        acc = torch.zeros(2, dtype=torch.float64)
        rn = torch.empty(B, dtype=self.dtype)
        cfg = self.cfg
        if grad:
            self._grad_rows()
        cfg.grad, cfg.h, cfg.tol, cfg.max_iter = int(grad), float(model.h), float(tol), int(max_iter)
        cfg.quasi = QUASI_NEWTON_STEPS if quasi else 0
        (cfg.bh, cfg.q_prev, cfg.q, cfg.q_next, cfg.x, cfg.ft, cfg.b1, cfg.W2, cfg.b2, cfg.Wh, cfg.status, cfg.acc,
         cfg.rn) = (t.data_ptr() for t in (bh, q_prev, q, q_next, x, ft, b1, W2, b2, Wh, status, acc, rn))
        it = self.solve_fn(self.ref)
        return status, it, acc, rn


_PLANS: dict = {}


_KEEP_ROWS = 8192  # plans of larger batches are not kept (their buffers hold tens of megabytes)


def _plan(net, B: int, dtype) -> _Plan:
    key = (net.n, net.embed.angle_mask, net.width, net.inertia_kind, float(net.eps), B, dtype)
    plan = _PLANS.get(key)
    if plan is None or plan.busy:
        plan = _Plan(net, B, dtype)
        if B <= _KEEP_ROWS:
            if len(_PLANS) >= 16:
                _PLANS.clear()
            _PLANS[key] = plan
    return plan


class _Objective(torch.autograd.Function):
    """The loss of converged samples as a function of the network's six parameter tensors.

    The loss is a fixed function of the roots, so its cotangent at the roots is known in the forward pass:
    the parameter gradient is computed there (two products per layer on the backward rows, kept in the plan's
    buffers) and the backward pass only scales it by the incoming gradient."""

    @staticmethod
    def forward(ctx, info, plan, model, q_prev, q, q_next, ft, x, quasi, W1, b1, W2, b2, Wh, bh):
        status, info["iterations"], acc, _ = plan.solve(model, q_prev, q, q_next, ft, x, (W1, b1, W2, b2, Wh, bh),
                                                        True, model.tol, model.max_iter, quasi)
        n_ok = int(acc[1])
        scale = 1.0 / (n_ok * x.shape[1]) if n_ok else 0.0
        # saved, not kept on ctx: the engine frees saved tensors after backward (unless retain_graph), so
        # AccumulateGrad takes them as .grad without copying
        ctx.save_for_backward(*plan.gradient(scale))
        converged = status == 1
        ctx.mark_non_differentiable(converged)
        return torch.tensor(float(acc[0]) * scale, dtype=W1.dtype), converged

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gl, _gc):
        grads = ctx.saved_tensors
        if not bool(gl == 1):
            grads = tuple(g * gl for g in grads)
        return (None,) * 9 + grads


def _prepare(model, data, x0):
    """``(plan, params, q_prev, q, ft, x)`` where the C code applies to ``model`` and the samples ``data = (q_prev,
    q, u_prev, u, u_next)``, else ``None``."""
    net = model.net
    if (not kernels.native_allowed() or model.dissipation is not None or model.line_search or not model.fast_vjp
            or net.n > NMAX or torch._C._are_functorch_transforms_active()):
        return None
    params = net._params()
    dtype = params[0].dtype
    q = data[1]
    B = q.shape[0] if q.dim() == 2 else 0
    if (dtype not in _SUFFIX or B == 0 or q.shape[1] != net.n
            or any(p.dtype != dtype or not p.is_cpu for p in params)
            or any(t.dtype != dtype or not t.is_cpu or t.dim() != 2 or t.shape[0] != B for t in data)):
        return None
    if x0 is not None and (x0.shape != q.shape or x0.dtype != dtype or not x0.is_cpu):
        return None
    if library() is None:
        return None
    q_prev, q = (t.detach().contiguous() for t in data[:2])
    with torch.no_grad():
        u_prev, u, u_next = data[2:]
        ft = model.tau(u_prev + 2 * u + u_next).mul_(0.25 * model.h).contiguous()
        x = (2 * q - q_prev) if x0 is None else x0.detach().clone(memory_format=torch.contiguous_format)
    return _plan(net, B, dtype), tuple(p.contiguous() for p in params), q_prev, q, ft, x


def native_objective(model, b, x0: Tensor | None):
    """``E2ESyMo.objective(b, x0)`` by the C code, or ``None`` where it does not apply (see the module)."""
    prep = _prepare(model, (b.q_prev, b.q, b.u_prev, b.u, b.u_next), x0)
    if prep is None:
        return None
    plan, params, q_prev, q, ft, x = prep
    q_next = b.q_next.detach().contiguous()
    if q_next.shape != q.shape:
        return None
    B, dtype = q.shape[0], q.dtype
    plan.busy = True  # a solve inside a solve (another thread) gets its own buffers
    try:
        if torch.is_grad_enabled() and any(p.requires_grad for p in params):
            info: dict = {}
            loss, ok = _Objective.apply(info, plan, model, q_prev, q, q_next, ft, x, x0 is None, *params)
            it = info["iterations"]
        else:
            with torch.no_grad():
                status, it, acc, _ = plan.solve(model, q_prev, q, q_next, ft, x, params, False, model.tol,
                                                model.max_iter, x0 is None)
            n_ok = int(acc[1])
            ok = status == 1
            loss = torch.tensor(float(acc[0]) / (n_ok * model.n) if n_ok else 0.0, dtype=dtype)
    finally:
        plan.busy = False
    n_ok = int(ok.sum())
    return loss, {"q": x, "converged": ok, "iterations": it, "failures": B - n_ok}


def native_solve(model, q_prev, q, u_prev, u, u_next, x0: Tensor | None, tol: float, max_iter: int):
    """The DEL residual's root without gradients by the C code (SyMo and E2E-SyMo ``solve``), exact Newton steps.

    ``q_prev, q``: ``(B, n)`` positions at steps k-1 and k (rad for angles, m otherwise); ``u_prev, u, u_next``:
    ``(B, m)`` controls at k-1, k, k+1; ``x0``: ``(B, n)`` initial guess or ``None`` (the seed's ``2 q - q_prev``);
    ``tol``: step-size tolerance; ``max_iter``: Newton iterations at most. Returns ``(x, converged,
    residual_norm, iterations)`` -- ``x`` ``(B, n)`` the positions at k+1, ``converged`` ``(B,)`` bool,
    ``residual_norm`` ``(B,)`` each sample's final max |residual| -- or ``None`` where the C code does not
    apply (see the module)."""
    prep = _prepare(model, (q_prev, q, u_prev, u, u_next), x0)
    if prep is None:
        return None
    plan, params, q_prev, q, ft, x = prep
    plan.busy = True
    try:
        with torch.no_grad():
            # exact Newton steps: at a loose tolerance (the seed's rollouts: 1e-4) a quasi-Newton first step is
            # accepted where the exact one lands far below it, and 500-step rollouts inherit the difference
            status, it, _, rn = plan.solve(model, q_prev, q, q, ft, x, params, False, tol, max_iter, False)
    finally:
        plan.busy = False
    return x, status == 1, rn, it
