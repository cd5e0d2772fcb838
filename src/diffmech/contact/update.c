/* The contact problem's assembly, impulse update and reverse pass (see diffmech/contact/update_native.py).
   A template: REAL and SUFFIX are replaced per floating-point type. */

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
