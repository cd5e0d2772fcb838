"""E2E-SyMo's training objective with the network's jets, Newton and the implicit backward pass in C.

:meth:`E2ESyMo.objective <diffmech.learn.models.E2ESyMo.objective>` in torch is a few hundred small
tensor operations per step: on the seed's batch sizes the per-operation cost rules at B = 32 and the
elementwise work on the jet stacks (values with first and second derivatives, ``(K, B, w)``) costs
more than the matrix products at B = 512. Here the products with the hidden layer stay with torch (its
BLAS) and everything between them is one C call each:

- ``layer1``: the angle embedding of the midpoints, the first layer and ``tanh`` with their jets, for
  the rows still iterating; ``tanh_jet``: the same for the second layer after its product;
- ``known``: the residual's part that does not depend on ``q_next`` (``D2 L_d(q_prev, q) + f``) and
  the per-sample tolerance, from the first midpoint's first-order jets;
- per Newton evaluation and sample: the residual and its Jacobian, the convergence test, the Newton
  step (Gaussian elimination); at convergence the adjoint ``mu = -J^-T dloss/dq_next`` and what the
  gradient needs: the layers' (value, derivative along ``mu``) rows at both midpoints and the
  cotangents of the heads. For one degree of freedom (``newton``) from second-order jets; for ``n >= 2``
  (``rev_a``, ``rev_b``, ``rev_c``) from first-order jets plus one reverse pass: the network's second
  derivatives enter the Jacobian only through the Hessian of one weighted sum of the heads, one
  product with the hidden layer instead of ``n (n + 1) / 2``;
- ``back_tanh``: the reverse of ``tanh`` on (value, direction) rows.

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
CPU (float32, float64) when the model has no dissipation and no
line search; built once per machine (one small C file); where it cannot be, or under
``native_mode("never")`` of :mod:`diffmech.dynamics.kernels`, the torch code runs. ``tanh`` is
evaluated through a vectorisable ``expm1`` (Taylor polynomial after range reduction).
"""

from __future__ import annotations

import ctypes
import hashlib

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
    const void *bh, *q_prev, *q, *q_next, *c, *tolb;
    void *x;
    int64_t *status, *iters;
    double *acc;
    const void *S0, *H10, *H20, *O0;      /* the first midpoint's first-order jets (K1, B, .) */
    const void *S, *H1, *H2, *O;          /* this iteration's second-order jets (K2, Ba, .) */
    void *Sv, *H1v, *H2v, *G;             /* the backward pass's rows (2, 2B, .) */
    void *rn;                             /* each sample's final max |residual| (B) */
};
"""

_TEMPLATE = r"""
static inline REAL softplus_SUFFIX(REAL z) { return z > 20 ? z : LOG1P(EXP(z)); }
static inline REAL sigmoid_SUFFIX(REAL z) { return 1 / (1 + EXP(-z)); }

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

/* tanh_row on every row of Z (K, rows, w). */
void tanh_jet_SUFFIX(int64_t K, int64_t n, int64_t rows, int64_t w, REAL *Z, const REAL *bias,
                     const int64_t *pj, const int64_t *pk, REAL *tmp) {
    for (int64_t b = 0; b < rows; b++) tanh_row_SUFFIX(K, n, rows * w, w, Z + b * w, bias, pj, pk, tmp);
}

/* The first layer on the midpoints (A + Bq)/2 of rows idx (all if idx is NULL): the embedding's jets S
   (K, Ba, m) (translations at col[j]; angles: cos at col[j], sin at scol[j] >= 0), then Z (K, Ba, w) =
   tanh jets of S W1^T + b1 (W1t = W1^T, (m, w)). */
void layer1_SUFFIX(int64_t Ba, int64_t n, int64_t K, int64_t m, int64_t w, const int64_t *col, const int64_t *scol,
                   const int64_t *idx, const REAL *A, const REAL *Bq, const REAL *W1t, const REAL *b1,
                   const int64_t *pj, const int64_t *pk, REAL *S, REAL *Z, REAL *tmp) {
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

/* The reverse of h = tanh(z), hd = (1 - h^2) zd on (value, direction) rows: GH (2, rows, w) holds the
   cotangents of (h, hd) and becomes those of (z, zd); H (2, rows, w) holds (h, hd). */
void back_tanh_SUFFIX(int64_t rows, int64_t w, REAL *GH, const REAL *H) {
    int64_t M = rows * w;
    REAL *restrict g0 = GH, *restrict g1 = GH + M;
    const REAL *h0 = H, *h1 = H + M;
    for (int64_t e = 0; e < M; e++) {
        REAL t = 1 - h0[e] * h0[e];
        g0[e] = t * g0[e] - 2 * h0[e] * h1[e] * g1[e];
        g1[e] = t * g1[e];
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
void known_SUFFIX(const struct del_cfg *d, const REAL *ft, REAL *c, REAL *tolb, double tol, double eps_mach) {
    int64_t n = d->n, B = d->B, o = d->o;
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
        double fl = 2 * eps_mach / d->h * (double)Hs * ((double)qmax + 1);
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
    const REAL *j0 = J + b * width;
    for (int64_t u = 0; u < width; u++) {
        x0[u] = j0[u];
        x1[u] = 0;
    }
    for (int64_t k = 0; k < n; k++) {
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
static int finish_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t b, int64_t i, int64_t it, int64_t max_iter,
                         REAL *g, REAL J[NMAX][NMAX], const REAL *v) {
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
    } else if (it >= max_iter || !solve_SUFFIX(n, J, g, 0)) {
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
int64_t newton_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t it, int64_t max_iter, const int64_t *idx,
                      int64_t *idx_out) {
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
        if (finish_SUFFIX(d, Ba, b, i, it, max_iter, g, J, v)) idx_out[na++] = i;
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
int64_t rev_a_SUFFIX(const struct del_cfg *d, int64_t Ba, const int64_t *idx, int64_t all, REAL *Pr, REAL *coef,
                     int64_t *sel) {
    int64_t n = d->n, o = d->o, PR = n + n * n, ns = 0;
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
    for (int64_t q = 0; q < n * (n + 1) / 2; q++) {
        const REAL *a = A + (1 + pj[q]) * M, *bb = A + (1 + pk[q]) * M;
        REAL acc = 0;
#pragma omp simd reduction(+:acc)
        for (int64_t u = 0; u < w; u++) acc += f[u] * a[u] * bb[u];
        J[pj[q] * n + pk[q]] += s * acc;
        if (pj[q] != pk[q]) J[pk[q] * n + pj[q]] += s * acc;
    }
}

void rev_b_SUFFIX(const struct del_cfg *d, int64_t Ba, const int64_t *sel, REAL *E, REAL *Pr, REAL *tmp) {
    int64_t n = d->n, w = d->w, PR = n + n * n, M = Ba * w;
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

int64_t rev_c_SUFFIX(const struct del_cfg *d, int64_t Ba, int64_t it, int64_t max_iter, const int64_t *sel,
                     const int64_t *idx, int64_t *idx_out, const REAL *E1, const REAL *W1, const int64_t *col,
                     const int64_t *scol, REAL *Pr, REAL *tmp) {
    int64_t n = d->n, w = d->w, m = d->m, PR = n + n * n, M = Ba * w, na = 0;
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
            for (int64_t u = 0; u < w; u++) {
                ac += et[u] * W1[u * m + col[j]];
                as += et[u] * W1[u * m + scol[j]];
            }
            Jf[j * n + j] -= q4 * (cs * ac + sn * as);
        }
        REAL J[NMAX][NMAX], v[NMAX];
        for (int64_t j = 0; j < n; j++)
            for (int64_t k = 0; k < n; k++) J[j][k] = Jf[j * n + k];
        velocity_SUFFIX(d, i, v);
        if (finish_SUFFIX(d, Ba, b, i, it, max_iter, pr, J, v)) idx_out[na++] = i;
    }
    return na;
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
                                                   "H2", "O", "Sv", "H1v", "H2v", "G", "rn")])


_LIB: list = []
_SUFFIX = {torch.float64: "f64", torch.float32: "f32"}


def library():
    """The compiled library, or ``None`` where it cannot be built (no C compiler)."""
    if not _LIB:
        try:
            source = _source()
            key = "diffmech-e2e-symo-" + hashlib.sha256(source.encode()).hexdigest()
            names = ("layer1", "tanh_jet", "back_tanh", "known", "newton", "rev_a", "rev_b", "rev_c")
            lib, _ = load_kernel(key, lambda: (source, {"kernel": "E2E-SyMo objective"}), name="E2E-SyMo objective",
                                 symbols=tuple(f"{f}_{s}" for f in names for s in ("f64", "f32")))
        except NativeUnavailable:
            lib = None
        else:
            i64, ptr, dbl = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
            cfg = ctypes.POINTER(_Cfg)
            sig = {"layer1": (None, [i64] * 5 + [ptr] * 12), "tanh_jet": (None, [i64] * 4 + [ptr] * 5),
                   "back_tanh": (None, [i64, i64, ptr, ptr]), "known": (None, [cfg, ptr, ptr, ptr, dbl, dbl]),
                   "newton": (i64, [cfg, i64, i64, i64, ptr, ptr]), "rev_a": (i64, [cfg, i64, ptr, i64, ptr, ptr, ptr]),
                   "rev_b": (None, [cfg, i64, ptr, ptr, ptr, ptr]),
                   "rev_c": (i64, [cfg, i64, i64, i64] + [ptr] * 9)}
            for s in ("f64", "f32"):
                for name, (res, args) in sig.items():
                    f = getattr(lib, f"{name}_{s}")
                    f.restype, f.argtypes = res, args
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
        self.fn = {k: getattr(lib, f"{k}_{sfx}") for k in ("layer1", "tanh_jet", "back_tanh", "known", "newton",
                                                            "rev_a", "rev_b", "rev_c")}
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
        self.K1 = 1 + n
        # n >= 2: psi's network part by a reverse pass, 2 + n products with W2 per Newton evaluation instead of
        # the 1 + n + n(n+1)/2 of second-order jets (the same for n = 1, where the jets take fewer calls)
        self.reverse = n >= 2
        self.K2 = self.K1 if self.reverse else 1 + n + n * (n + 1) // 2
        f = dict(dtype=dtype)
        K1, K2 = self.K1, self.K2
        self.S0, self.Z10, self.Z20, self.O0 = (torch.empty(K1 * B * k, **f) for k in (m, w, w, o))
        self.S, self.Z1, self.Z2, self.O = (torch.empty(K2 * B * k, **f) for k in (m, w, w, o))
        self.c, self.tolb = torch.empty(B, n, **f), torch.empty(B, **f)
        self.idx0 = torch.arange(B, **i64)
        self.idx, self.idx2 = torch.empty(B, **i64), torch.empty(B, **i64)
        self.iters = torch.zeros(B, **i64)  # each sample's Newton steps
        self.tmp = torch.empty(2 * w, **f)
        self.Pr, self.coef = torch.empty(B * (n + n * n), **f), torch.empty(B * o, **f)
        self.sel = torch.empty(B, **i64)
        self.E2, self.E1 = torch.empty(B, w, **f), torch.empty(B, w, **f)
        self._grad_buffers: tuple | None = None
        self.cfg = _Cfg(B=B, n=n, o=o, m=m, w=w, paper=int(n == 1 and net.inertia_kind == "paper"), K1=K1, K2=K2,
                        h=0.0, epsl=float(net.eps), pj=self.pj.data_ptr(), pk=self.pk.data_ptr(),
                        c=self.c.data_ptr(), tolb=self.tolb.data_ptr(), S0=self.S0.data_ptr(),
                        H10=self.Z10.data_ptr(), H20=self.Z20.data_ptr(), O0=self.O0.data_ptr(), S=self.S.data_ptr(),
                        H1=self.Z1.data_ptr(), H2=self.Z2.data_ptr(), O=self.O.data_ptr())
        self.ref = ctypes.byref(self.cfg)
        self.busy = False

    @property
    def saved(self) -> tuple[Tensor, ...]:
        """The gradient's buffers, made on first use (solves without gradients do not need them): the backward
        rows ``(Sv, H1v, H2v, G)`` (2, 2B, .) -- (value, derivative along the adjoint) at both midpoints -- and
        the reverse pass's ``(GH, GH1)`` (4B, w)."""
        if self._grad_buffers is None:
            B, m, w, o, f = self.B, self.m, self.w, self.o, dict(dtype=self.dtype)
            self._grad_buffers = (torch.empty(2, 2 * B, m, **f), torch.empty(2, 2 * B, w, **f),
                                  torch.empty(2, 2 * B, w, **f), torch.empty(2, 2 * B, o, **f),
                                  torch.empty(4 * B, w, **f), torch.empty(4 * B, w, **f))
        return self._grad_buffers[:4]

    def network(self, K, Ba, idx, A, Bq, S, Z1, Z2, O, W1t, b1, W2, b2, Wh):
        """The network on the jets (``K`` components) of ``Ba`` midpoints ``(A + Bq) / 2`` (rows ``idx``, a
        pointer or ``None``): ``S (K, Ba, m)``, ``Z1 -> Z2 (K, Ba, w)`` (activations' jets), ``O (K, Ba, o)``."""
        n, m, w, o = self.n, self.m, self.w, self.o
        rows = K * Ba
        pj, pk, tmp = self.pj.data_ptr(), self.pk.data_ptr(), self.tmp.data_ptr()
        self.fn["layer1"](Ba, n, K, m, w, self.col.data_ptr(), self.scol.data_ptr(), idx, A, Bq, W1t.data_ptr(),
                          b1.data_ptr(), pj, pk, S.data_ptr(), Z1.data_ptr(), tmp)
        z2 = Z2[:rows * w].view(rows, w)
        torch.mm(Z1[:rows * w].view(rows, w), W2.t(), out=z2)
        self.fn["tanh_jet"](K, n, Ba, w, z2.data_ptr(), b2.data_ptr(), pj, pk, tmp)
        torch.mm(z2, Wh.t(), out=O[:rows * o].view(rows, o))

    def gradient(self, scale: float, W2: Tensor, Wh: Tensor) -> tuple[Tensor, ...]:
        """The parameter gradient ``(W1, b1, W2, b2, Wh, bh)`` of ``scale`` times the weighted residual whose
        rows the last solve with ``saved`` left: the reverse pass of the (value, direction) rows."""
        Sv, H1v, H2v, G = self.saved
        R, w, m, o = 4 * self.B, self.w, self.m, self.o
        Gf = G.view(R, o)
        if scale != 1.0:
            Gf.mul_(scale)
        gWh = Gf.T @ H2v.view(R, w)
        gbh = Gf[:R // 2].sum(0)
        GH, GH1 = self._grad_buffers[4:]
        torch.mm(Gf, Wh, out=GH)
        self.fn["back_tanh"](R // 2, w, GH.data_ptr(), H2v.data_ptr())
        gW2 = GH.T @ H1v.view(R, w)
        gb2 = GH[:R // 2].sum(0)
        torch.mm(GH, W2, out=GH1)
        self.fn["back_tanh"](R // 2, w, GH1.data_ptr(), H1v.data_ptr())
        gW1 = (Sv.view(R, m).T @ GH1).T.contiguous()  # (m, R) @ (R, w): MKL is slow at (w, R) @ (R, m)
        gb1 = GH1[:R // 2].sum(0)
        return gW1, gb1, gW2, gb2, gWh, gbh

    def solve(self, model, q_prev, q, q_next, ft, x, params, saved, tol: float, max_iter: int, quasi: bool):
        """Newton from ``x (B, n)`` (updated in place); with ``saved = (Sv, H1v, H2v, G)`` also the backward
        pass's rows; ``quasi``: the first step of each sample without the network's second derivatives.
        Returns ``(status, iterations, acc, rn)``: per sample 1 converged / 2 failed, the steps of the
        longest, the converged samples' squared errors against ``q_next`` and their number, each
        sample's final ``max |residual|``."""
        W1, b1, W2, b2, Wh, bh = params
        B, o = self.B, self.o
        W1t = W1.t().contiguous()
        status = torch.zeros(B, dtype=torch.int64)
        acc = torch.zeros(2, dtype=torch.float64)
        rn = torch.empty(B, dtype=self.dtype)
        cfg, fn = self.cfg, self.fn
        cfg.grad, cfg.h = int(saved is not None), float(model.h)
        cfg.bh, cfg.q_prev, cfg.q, cfg.q_next, cfg.x = (t.data_ptr() for t in (bh, q_prev, q, q_next, x))
        cfg.status, cfg.acc, cfg.rn = status.data_ptr(), acc.data_ptr(), rn.data_ptr()
        cfg.iters = self.iters.data_ptr()
        if saved is not None:
            cfg.Sv, cfg.H1v, cfg.H2v, cfg.G = (t.data_ptr() for t in saved)
        ref, net = self.ref, (W1t, b1, W2, b2, Wh)
        self.network(self.K1, B, None, q_prev.data_ptr(), q.data_ptr(), self.S0, self.Z10, self.Z20, self.O0, *net)
        fn["known"](ref, ft.data_ptr(), self.c.data_ptr(), self.tolb.data_ptr(), float(tol),
                    float(torch.finfo(self.dtype).eps))
        idx, idx2 = self.idx, self.idx2
        idx.copy_(self.idx0)
        Ba, it = B, 0
        qp, xp = q.data_ptr(), x.data_ptr()
        while True:
            self.network(self.K2, Ba, idx.data_ptr(), qp, xp, self.S, self.Z1, self.Z2, self.O, *net)
            if self.reverse:
                # the first QUASI_NEWTON_STEPS steps (with quasi) need no exact Jacobian: that far from the root
                # the step's error is Newton's quadratic term (the network's second derivatives weigh h^2/4 against
                # the inertia). Rows that converge here take the exact one (their adjoint needs it), and after
                # those steps every row does.
                exact_all = int(it >= (QUASI_NEWTON_STEPS if quasi else 0))
                ns = fn["rev_a"](ref, Ba, idx.data_ptr(), exact_all, self.Pr.data_ptr(), self.coef.data_ptr(),
                                 self.sel.data_ptr())
                e2, e1 = self.E2[:ns], self.E1[:ns]
                if ns:
                    torch.mm(self.coef[:ns * o].view(ns, o), Wh, out=e2)
                    fn["rev_b"](ref, Ba, self.sel.data_ptr(), e2.data_ptr(), self.Pr.data_ptr(), self.tmp.data_ptr())
                    torch.mm(e2, W2, out=e1)
                Ba = fn["rev_c"](ref, Ba, it, max_iter, self.sel.data_ptr(), idx.data_ptr(), idx2.data_ptr(),
                                 self.E1.data_ptr(), W1.data_ptr(), self.col.data_ptr(), self.scol.data_ptr(),
                                 self.Pr.data_ptr(), self.tmp.data_ptr())
            else:
                Ba = fn["newton"](ref, Ba, it, max_iter, idx.data_ptr(), idx2.data_ptr())
            if Ba == 0:
                break
            idx, idx2 = idx2, idx
            it += 1
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
                                                        plan.saved, model.tol, model.max_iter, quasi)
        n_ok = int(acc[1])
        scale = 1.0 / (n_ok * x.shape[1]) if n_ok else 0.0
        ctx.grads = plan.gradient(scale, W2, Wh)
        converged = status == 1
        ctx.mark_non_differentiable(converged)
        return torch.tensor(float(acc[0]) * scale, dtype=W1.dtype), converged

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, gl, _gc):
        grads = ctx.grads
        if not bool(gl == 1):
            grads = tuple(g * gl for g in grads)
        return (None,) * 9 + grads


def _prepare(model, data, x0):
    """``(plan, params, q_prev, q, ft, x)`` where the C code applies to ``model`` and the samples ``data = (q_prev,
    q, u_prev, u, u_next)``, else ``None``."""
    net = model.net
    if (kernels._MODE[0] == "never" or model.dissipation is not None or model.line_search or not model.fast_vjp
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
                status, it, acc, _ = plan.solve(model, q_prev, q, q_next, ft, x, params, None, model.tol,
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
            status, it, _, rn = plan.solve(model, q_prev, q, q, ft, x, params, None, tol, max_iter, False)
    finally:
        plan.busy = False
    return x, status == 1, rn, it
