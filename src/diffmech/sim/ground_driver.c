/* A contact step of one robot on the ground, and its reverse, as one C call each (see
   diffmech/sim/_ground_driver.py). A template: REAL, SUFFIX, SQRT, FABS are replaced per floating-point type. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef void (*lane_SUFFIX)(void *const *state, const REAL *C, REAL *out, double *red, int64_t start, int64_t stop);
typedef void (*assemble_SUFFIX_t)(int64_t B, int64_t nv, int64_t K, const REAL *J, const REAL *L, const REAL *v,
                                  const REAL *vf, const REAL *phi, const REAL *e, double dt, double baumgarte,
                                  double bounce_speed, REAL *A, REAL *c, REAL *W, REAL *vn, REAL *bounce,
                                  REAL *scale);
typedef void (*apply_SUFFIX_t)(int64_t B, int64_t nv, int64_t R, const REAL *W, const REAL *lam, const REAL *vf,
                               REAL *u, REAL *v1);
typedef void (*pgs_SUFFIX_t)(int64_t B, int64_t K, const REAL *A, const REAL *c, const REAL *mu, REAL *lam,
                             int64_t iterations, double tol, int64_t check_every, int64_t newton, int64_t *iters,
                             double *res);
typedef void (*back1_SUFFIX_t)(int64_t B, int64_t nv, int64_t R, const REAL *g, const REAL *J, const REAL *W,
                               const REAL *L, REAL *y, REAL *g_lam, REAL *A);
typedef int64_t (*vjp_SUFFIX_t)(int64_t B, int64_t K, const REAL *A, const REAL *c, const REAL *mu,
                                const REAL *lam, const REAL *grad, REAL *a, REAL *d, REAL *gmu, int64_t *ok);
typedef void (*back2_SUFFIX_t)(int64_t B, int64_t nv, int64_t K, const REAL *g, const REAL *J, const REAL *v,
                               const REAL *vf, const REAL *phi, const REAL *e, const REAL *lam, const REAL *u,
                               const REAL *W, const REAL *vn, const REAL *bounce, const REAL *scale,
                               const REAL *L, const REAL *y, const REAL *a, const REAL *d, double dt, REAL *g_J,
                               REAL *g_v, REAL *g_vf, REAL *g_phi, REAL *g_e, REAL *g_L);

/* what a rollout's steps share: sizes, constants, the kernels' addresses (see Ground in Python) */
struct ground_SUFFIX {
    int64_t B, nq, nv, nb, nl, off, col, nd, limits, iterations, check_every, advance, newton, n_red;
    double dt, baumgarte, bounce_speed, tol, series;
    void *stage, *stage_vjp, *adv, *adv_vjp, *assemble, *apply, *pgs, *back1, *vjp, *back2;
    const REAL *C, *drives, *balls, *dtcol, *coef, *lo, *hi;
    double *g_red; /* n_red: the model-tensor elements' cotangents, summed over the batch and the steps */
};

static int64_t n_out_SUFFIX(const struct ground_SUFFIX *g) {
    return g->nv + g->nv * g->nv + g->nb + 3 * g->nb * g->nv;
}

/* the stage kernel's inputs: q, v, tau[, drives], balls, dt[, cotangent] */
static int64_t inputs_SUFFIX(const struct ground_SUFFIX *g, const REAL *q, const REAL *v, const REAL *tau,
                             void **state) {
    int64_t n = 0;
    state[n++] = (void *)q;
    state[n++] = (void *)v;
    state[n++] = (void *)tau;
    if (g->nd) state[n++] = (void *)g->drives;
    state[n++] = (void *)g->balls;
    state[n++] = (void *)g->dtcol;
    return n;
}

/* the rows kept, as contact_step keeps them: balls (ascending), lower limits, upper limits */
static int64_t select_SUFFIX(const struct ground_SUFFIX *g, const REAL *out, const REAL *q, const REAL *v,
                             int64_t *slots) {
    const int64_t B = g->B, nv = g->nv, nb = g->nb, no = n_out_SUFFIX(g);
    const int64_t o_phi = nv + nv * nv, o_rows = o_phi + nb;
    int64_t K = 0;
    for (int64_t k = 0; k < nb; ++k) {
        int keep = 0;
        for (int64_t b = 0; b < B && !keep; ++b) {
            const REAL *ob = out + b * no;
            REAL s2 = 0;
            for (int64_t j = 0; j < 3; ++j) {
                REAL s = 0;
                const REAL *row = ob + o_rows + (k * 3 + j) * nv;
                for (int64_t i = 0; i < nv; ++i) s += row[i] * ob[i];
                s2 += s * s;
            }
            keep = ob[o_phi + k] < (REAL)2e-3 + (REAL)(2.0 * g->dt) * (REAL)SQRT(s2);
        }
        if (keep) slots[K++] = k;
    }
    if (g->limits) {
        for (int side = 0; side < 2; ++side)
            for (int64_t j = 0; j < g->nl; ++j) {
                int keep = 0;
                for (int64_t b = 0; b < B && !keep; ++b) {
                    const REAL qj = q[b * g->nq + g->off + j];
                    const REAL gap = side == 0 ? qj - g->lo[j] : g->hi[j] - qj;
                    keep = isfinite(gap) && gap < (REAL)2e-3 + (REAL)(2.0 * g->dt) * FABS(v[b * nv + g->col + j]);
                }
                if (keep) slots[K++] = nb + side * g->nl + j;
            }
    }
    return K;
}

/* J (B, 3K, nv), phi, mu, e (B, K) of the rows in slots */
static void problem_SUFFIX(const struct ground_SUFFIX *g, const REAL *out, const REAL *q, int64_t K,
                           const int64_t *slots, REAL *J, REAL *phi, REAL *mu, REAL *e) {
    const int64_t B = g->B, nv = g->nv, nb = g->nb, no = n_out_SUFFIX(g);
    const int64_t o_phi = nv + nv * nv, o_rows = o_phi + nb;
    memset(J, 0, sizeof(REAL) * (size_t)(B * 3 * K * nv));
    for (int64_t b = 0; b < B; ++b)
        for (int64_t k = 0; k < K; ++k) {
            const int64_t s = slots[k], bk = b * K + k;
            REAL *Jk = J + (b * 3 * K + 3 * k) * nv;
            if (s < nb) {
                memcpy(Jk, out + b * no + o_rows + s * 3 * nv, sizeof(REAL) * (size_t)(3 * nv));
                phi[bk] = out[b * no + o_phi + s];
                mu[bk] = g->coef[s];
                e[bk] = g->coef[nb + s];
            } else {
                const int lower = s < nb + g->nl;
                const int64_t j = lower ? s - nb : s - nb - g->nl;
                const REAL qj = q[b * g->nq + g->off + j];
                Jk[g->col + j] = lower ? (REAL)1 : (REAL)-1;
                phi[bk] = lower ? qj - g->lo[j] : g->hi[j] - qj;
                mu[bk] = 0;
                e[bk] = 0;
            }
        }
}

/* whether the position update's kernel applies: a base turning less than series (rad^2) in the step */
static int small_turn_SUFFIX(const struct ground_SUFFIX *g, const REAL *v1) {
    if (!g->advance || g->B == 0) return 0;
    REAL m = -INFINITY;
    for (int64_t b = 0; b < g->B; ++b) {
        const REAL *w = v1 + b * g->nv + 3;
        REAL s = w[0] * w[0] + w[1] * w[1] + w[2] * w[2];
        if (s > m || s != s) m = s;
    }
    return (double)m * g->dt * g->dt < g->series;
}

/* One step. out_qv (B, nq + nv): the next state; v1 (B, nv): the velocity before the position update
   (all the caller needs when TORCH_ADVANCE is returned); slots (nb + 2 nl,), lam (B, K, 3): the rows kept
   and their impulses; info_i = (K, sweeps, Newton iterations, environments not converged), info_d = (residual,
   deepest penetration, violation in m/s). */
int64_t forward_SUFFIX(const struct ground_SUFFIX *g, const REAL *q, const REAL *v, const REAL *tau,
                       int64_t prev_K, const int64_t *prev_slots, const REAL *prev_lam, REAL *out_qv, REAL *v1,
                       int64_t *slots, REAL *lam, int64_t *info_i, double *info_d) {
    const int64_t B = g->B, nv = g->nv, no = n_out_SUFFIX(g);
    void *state[8];
    inputs_SUFFIX(g, q, v, tau, state);
    REAL *out = (REAL *)malloc(sizeof(REAL) * (size_t)(B * no));
    ((lane_SUFFIX)g->stage)(state, g->C, out, 0, 0, B);
    const int64_t K = select_SUFFIX(g, out, q, v, slots), R = 3 * K;
    info_i[0] = K;
    info_i[1] = info_i[2] = info_i[3] = 0;
    info_d[0] = info_d[1] = info_d[2] = 0;
    if (K == 0) {
        for (int64_t b = 0; b < B; ++b) memcpy(v1 + b * nv, out + b * no, sizeof(REAL) * (size_t)nv);
    } else {
        const size_t n = (size_t)(B * (R * nv + 4 * K + nv * nv + R * R + R + nv * R + 3 * K + nv + nv));
        REAL *J = (REAL *)malloc(sizeof(REAL) * n);
        REAL *phi = J + B * R * nv, *mu = phi + B * K, *e = mu + B * K, *L = e + B * K, *A = L + B * nv * nv;
        REAL *c = A + B * R * R, *W = c + B * R, *vn = W + B * nv * R, *bo = vn + B * K, *sc = bo + B * K;
        REAL *vf = sc + B * K, *u = vf + B * nv;
        problem_SUFFIX(g, out, q, K, slots, J, phi, mu, e);
        for (int64_t b = 0; b < B; ++b) {
            memcpy(L + b * nv * nv, out + b * no + nv, sizeof(REAL) * (size_t)(nv * nv));
            memcpy(vf + b * nv, out + b * no, sizeof(REAL) * (size_t)nv);
        }
        ((assemble_SUFFIX_t)g->assemble)(B, nv, K, J, L, v, vf, phi, e, g->dt, g->baumgarte, g->bounce_speed, A, c,
                                         W, vn, bo, sc);
        /* the warm start: the previous step's impulse of each row kept, where it had one */
        memset(lam, 0, sizeof(REAL) * (size_t)(B * R));
        for (int64_t k = 0; k < K; ++k)
            for (int64_t j = 0; j < prev_K; ++j)
                if (prev_slots[j] == slots[k]) {
                    for (int64_t b = 0; b < B; ++b)
                        for (int64_t x = 0; x < 3; ++x) lam[b * R + 3 * k + x] = prev_lam[(b * prev_K + j) * 3 + x];
                    break;
                }
        int64_t it[2] = {0, 0};
        double res[3] = {0, 0, 0};
        ((pgs_SUFFIX_t)g->pgs)(B, K, A, c, mu, lam, g->iterations, g->tol, g->check_every, g->newton, it, res);
        ((apply_SUFFIX_t)g->apply)(B, nv, R, W, lam, vf, u, v1);
        double deepest = 0;
        for (int64_t i = 0; i < B * K; ++i) deepest = -(double)phi[i] > deepest ? -(double)phi[i] : deepest;
        info_i[1] = it[0];
        info_i[2] = it[1];
        info_i[3] = (int64_t)res[2];
        info_d[0] = res[0];
        info_d[1] = deepest;
        info_d[2] = res[1];
        free(J);
    }
    free(out);
    if (!small_turn_SUFFIX(g, v1)) return 1;
    void *adv[3] = {(void *)q, (void *)v1, (void *)g->dtcol};
    ((lane_SUFFIX)g->adv)(adv, g->C, out_qv, 0, 0, B);
    return 0;
}

/* The reverse of the step from (q, v) under tau that kept the rows slots (K) with impulses lam, for the
   cotangents aq, av of its next state: g_q, g_v, g_tau (B, .); the cotangents of the constant inputs
   (drives, balls, dt) summed over the batch are added to g_consts, those of each ball's friction and
   restitution to g_mu, g_e (nb,), those of the model tensors' elements the stage's reverse mode reduces (the
   learnable parameters) to g->g_red. Nothing is written to them unless 0 is returned. */
int64_t backward_SUFFIX(const struct ground_SUFFIX *g, const REAL *q, const REAL *v, const REAL *tau, int64_t K,
                        const int64_t *slots, const REAL *lam, const REAL *aq, const REAL *av, REAL *g_q, REAL *g_v,
                        REAL *g_tau, double *g_consts, double *g_mu, double *g_e) {
    const int64_t B = g->B, nq = g->nq, nv = g->nv, nb = g->nb, no = n_out_SUFFIX(g), R = 3 * K;
    const int64_t o_L = nv, o_phi = nv + nv * nv, o_rows = o_phi + nb;
    const int64_t nc = g->nd + 4 * nb + 1, ns = nq + 2 * nv + nc;
    void *state[8];
    const int64_t n_in = inputs_SUFFIX(g, q, v, tau, state);
    const size_t n = (size_t)(B * (2 * no + (nq + nv) + (nq + nv + 1) + nv + ns + nq)
                              + B * (R * nv + 4 * K + nv * nv + R * R + R + nv * R + 3 * K + nv + nv)
                              + B * (nv + R + R * R + 3 * R + K + R * nv + 2 * nv + 2 * K + nv * nv));
    REAL *buf = (REAL *)calloc(n ? n : 1, sizeof(REAL));
    int64_t *ok = (int64_t *)malloc(sizeof(int64_t) * (size_t)(B ? B : 1));
    double *red = (double *)calloc((size_t)(g->n_red ? g->n_red : 1), sizeof(double));
    REAL *out = buf, *g_out = out + B * no, *g_adv = g_out + B * no, *g_advin = g_adv + B * (nq + nv);
    REAL *v1 = g_advin + B * (nq + nv + 1), *gs = v1 + B * nv, *g_lim = gs + B * ns;
    REAL *J = g_lim + B * nq, *phi = J + B * R * nv, *mu = phi + B * K, *e = mu + B * K, *L = e + B * K;
    REAL *A = L + B * nv * nv, *c = A + B * R * R, *W = c + B * R, *vn = W + B * nv * R, *bo = vn + B * K;
    REAL *sc = bo + B * K, *vf = sc + B * K, *u = vf + B * nv;
    REAL *y = u + B * nv, *g_lam = y + B * nv, *A2 = g_lam + B * R, *a = A2 + B * R * R, *d = a + B * R;
    REAL *gmu = d + B * R, *g_J = gmu + B * K, *g_vv = g_J + B * R * nv, *g_vf = g_vv + B * nv;
    REAL *g_phi = g_vf + B * nv, *g_ee = g_phi + B * K, *g_L = g_ee + B * K;
    int64_t status = 0;
    ((lane_SUFFIX)g->stage)(state, g->C, out, 0, 0, B);
    for (int64_t b = 0; b < B; ++b) {
        memcpy(vf + b * nv, out + b * no, sizeof(REAL) * (size_t)nv);
        memcpy(L + b * nv * nv, out + b * no + o_L, sizeof(REAL) * (size_t)(nv * nv));
    }
    if (K) {
        problem_SUFFIX(g, out, q, K, slots, J, phi, mu, e);
        ((assemble_SUFFIX_t)g->assemble)(B, nv, K, J, L, v, vf, phi, e, g->dt, g->baumgarte, g->bounce_speed, A, c,
                                         W, vn, bo, sc);
        ((apply_SUFFIX_t)g->apply)(B, nv, R, W, lam, vf, u, v1);
    } else {
        memcpy(v1, vf, sizeof(REAL) * (size_t)(B * nv));
    }
    if (!small_turn_SUFFIX(g, v1)) { status = 1; goto done; }
    for (int64_t b = 0; b < B; ++b) {
        memcpy(g_adv + b * (nq + nv), aq + b * nq, sizeof(REAL) * (size_t)nq);
        memcpy(g_adv + b * (nq + nv) + nq, av + b * nv, sizeof(REAL) * (size_t)nv);
    }
    {
        void *adv[4] = {(void *)q, (void *)v1, (void *)g->dtcol, (void *)g_adv};
        ((lane_SUFFIX)g->adv_vjp)(adv, g->C, g_advin, 0, 0, B);  /* (g_q, g_v1, g_dt) per state */
    }
    int64_t slides = 0;
    if (K) {
        REAL *g_v1 = v1;  /* v1 is not needed any more: its cotangent goes in its place */
        for (int64_t b = 0; b < B; ++b)
            memcpy(g_v1 + b * nv, g_advin + b * (nq + nv + 1) + nq, sizeof(REAL) * (size_t)nv);
        ((back1_SUFFIX_t)g->back1)(B, nv, R, g_v1, J, W, L, y, g_lam, A2);
        slides = ((vjp_SUFFIX_t)g->vjp)(B, K, A2, c, mu, lam, g_lam, a, d, gmu, ok);
        for (int64_t b = 0; b < B; ++b)
            if (!ok[b]) { status = 2; goto done; }
        ((back2_SUFFIX_t)g->back2)(B, nv, K, g_v1, J, v, vf, phi, e, lam, u, W, vn, bo, sc, L, y, a, slides ? d : 0,
                                   g->dt, g_J, g_vv, g_vf, g_phi, g_ee, g_L);
        for (int64_t b = 0; b < B; ++b) {
            REAL *go = g_out + b * no;
            memcpy(go, g_vf + b * nv, sizeof(REAL) * (size_t)nv);
            memcpy(go + o_L, g_L + b * nv * nv, sizeof(REAL) * (size_t)(nv * nv));
            for (int64_t k = 0; k < K; ++k) {
                const int64_t s = slots[k], bk = b * K + k;
                if (s < nb) {
                    go[o_phi + s] = g_phi[bk];
                    memcpy(go + o_rows + s * 3 * nv, g_J + (b * R + 3 * k) * nv, sizeof(REAL) * (size_t)(3 * nv));
                } else {  /* phi = q_j - lower or upper - q_j */
                    const int lower = s < nb + g->nl;
                    const int64_t j = lower ? s - nb : s - nb - g->nl;
                    g_lim[b * nq + g->off + j] += lower ? g_phi[bk] : -g_phi[bk];
                }
            }
        }
    } else {
        for (int64_t b = 0; b < B; ++b)
            memcpy(g_out + b * no, g_advin + b * (nq + nv + 1) + nq, sizeof(REAL) * (size_t)nv);
    }
    state[n_in] = g_out;
    ((lane_SUFFIX)g->stage_vjp)(state, g->C, gs, g->n_red ? red : 0, 0, B);
    for (int64_t b = 0; b < B; ++b) {
        const REAL *gsb = gs + b * ns, *gab = g_advin + b * (nq + nv + 1);
        for (int64_t i = 0; i < nq; ++i) {
            const REAL x = (gsb[i] + gab[i]) + g_lim[b * nq + i];
            if (!isfinite(x)) status = 3;
            g_q[b * nq + i] = x;
        }
        for (int64_t i = 0; i < nv; ++i) {
            const REAL x = K ? gsb[nq + i] + g_vv[b * nv + i] : gsb[nq + i];
            const REAL t = gsb[nq + nv + i];
            if (!isfinite(x) || !isfinite(t)) status = 3;
            g_v[b * nv + i] = x;
            g_tau[b * nv + i] = t;
        }
    }
    if (status) goto done;
    for (int64_t b = 0; b < B; ++b)
        for (int64_t i = 0; i < nc; ++i) g_consts[i] += (double)gs[b * ns + nq + 2 * nv + i];
    for (int64_t i = 0; i < g->n_red; ++i) g->g_red[i] += red[i];
    for (int64_t k = 0; k < K; ++k) {
        if (slots[k] >= nb) continue;
        for (int64_t b = 0; b < B; ++b) {
            if (slides) g_mu[slots[k]] += (double)gmu[b * K + k];
            g_e[slots[k]] += (double)g_ee[b * K + k];
        }
    }
done:
    free(buf);
    free(ok);
    free(red);
    return status;
}
