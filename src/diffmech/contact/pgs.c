/* The contact problem of one time step, per environment (see diffmech/contact/pgs.py):
       w = A lam + c,   0 <= lam_n _|_ w_n >= 0,   |lam_t| <= mu lam_n, lam_t opposing w_t (Coulomb, disc).
   pgs_SUFFIX: projected Gauss-Seidel sweeps, then, where they leave the contact conditions unmet, a
   semismooth Newton method on the natural map of those conditions. vjp_SUFFIX: the implicit pull-back
   of a solution. A template: REAL, SUFFIX, SQRT, FABS, EPS are replaced per floating-point type. */

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* The step sizes of the sweeps and of the natural map, and w = A lam + c: inv_n = 1 / A_nn, and one size for
   both tangent rows of a block, 2 / (A_t1t1 + A_t2t2) -- not 1 / A_tt per row: with different sizes the
   projection's fixed point has friction opposing D_t w_t instead of the slip w_t, which is not Coulomb's law;
   with one size it is, and the solution does not depend on the size. 0 where the diagonal is at most 1e-12
   of its largest (a row that moves nothing: a joint limit's tangent rows). */
static void prepare_SUFFIX(int64_t R, const REAL *Ab, const REAL *cb, const REAL *lb, REAL *inv, REAL *w) {
    REAL dmax = 0;
    for (int64_t i = 0; i < R; ++i) dmax = Ab[i * R + i] > dmax ? Ab[i * R + i] : dmax;
    REAL floor_ = (REAL)1e-12 * (dmax > (REAL)1e-300 ? dmax : (REAL)1e-300);
    for (int64_t r = 0; r < R; r += 3) {
        REAL d = Ab[r * R + r], t = Ab[(r + 1) * R + r + 1] + Ab[(r + 2) * R + r + 2];
        inv[r] = d > floor_ ? (REAL)1 / d : (REAL)0;
        inv[r + 1] = inv[r + 2] = t > 2 * floor_ ? (REAL)2 / t : (REAL)0;
    }
    for (int64_t i = 0; i < R; ++i) {
        REAL s = cb[i];
        for (int64_t j = 0; j < R; ++j) s += Ab[i * R + j] * lb[j];
        w[i] = s;
    }
}


/* The natural map of the contact conditions at lam (w = A lam + c), block by block with D = diag(inv):
       G_n = l_n - max(0, l_n - inv_n w_n),
       G_t = l_t - proj(l_t - D_t w_t) onto the disc of radius mu max(0, l_n - inv_n w_n).
   G = 0 exactly at a solution (it is the fixed-point map of the sweeps), and |G_i| / inv_i is row i's
   velocity error (m/s): a loaded contact's normal velocity, the speed an unloaded one's impulse would
   cause, a slip against sticking friction. Returns max |G_i| (NaN if any is); *viol = max |G_i| / inv_i. */
static REAL natural_SUFFIX(int64_t K, const REAL *inv, const REAL *mu, const REAL *l, const REAL *w, REAL *G,
                           REAL *viol) {
    REAL gmax = 0, vmax = 0;
    for (int64_t k = 0; k < K; ++k) {
        const int64_t r = 3 * k;
        REAL sn = l[r] - inv[r] * w[r];
        REAL pn = sn > 0 ? sn : 0;
        REAL rad = mu[k] * pn;
        REAL y1 = l[r + 1] - inv[r + 1] * w[r + 1], y2 = l[r + 2] - inv[r + 2] * w[r + 2];
        REAL yn = SQRT(y1 * y1 + y2 * y2);
        if (yn > rad) {
            REAL s = rad / yn;
            y1 *= s;
            y2 *= s;
        }
        G[r] = l[r] - pn;
        G[r + 1] = l[r + 1] - y1;
        G[r + 2] = l[r + 2] - y2;
        for (int64_t t = 0; t < 3; ++t) {
            REAL a = FABS(G[r + t]);
            if (!(a <= gmax)) gmax = a;
            if (inv[r + t] > 0) {
                REAL v = a / inv[r + t];
                if (!(v <= vmax)) vmax = v;
            }
        }
    }
    *viol = vmax;
    return gmax;
}

/* An element of the generalized Jacobian of natural_SUFFIX at lam, row-major R x R. */
static void jacobian_SUFFIX(int64_t K, const REAL *A, const REAL *inv, const REAL *mu, const REAL *l, const REAL *w,
                            REAL *Jm) {
    const int64_t R = 3 * K;
    for (int64_t k = 0; k < K; ++k) {
        const int64_t r = 3 * k;
        REAL sn = l[r] - inv[r] * w[r];
        int act = sn > 0;
        REAL rad = act ? mu[k] * sn : 0;
        REAL y1 = l[r + 1] - inv[r + 1] * w[r + 1], y2 = l[r + 2] - inv[r + 2] * w[r + 2];
        REAL yn = SQRT(y1 * y1 + y2 * y2);
        REAL *Jn = Jm + r * R, *J1 = Jn + R, *J2 = J1 + R;
        const REAL *An = A + r * R, *A1 = An + R, *A2 = A1 + R;
        for (int64_t j = 0; j < R; ++j) Jn[j] = act ? inv[r] * An[j] : (REAL)(j == r);
        if (yn <= rad) { /* inside the disc: G_t = D_t w_t */
            for (int64_t j = 0; j < R; ++j) {
                J1[j] = inv[r + 1] * A1[j];
                J2[j] = inv[r + 2] * A2[j];
            }
        } else { /* on its edge: G_t = l_t - rad y / |y| */
            REAL h1 = y1 / yn, h2 = y2 / yn;
            REAL p11 = (1 - h1 * h1) / yn, p12 = -h1 * h2 / yn, p22 = (1 - h2 * h2) / yn;
            for (int64_t j = 0; j < R; ++j) {
                REAL dy1 = (REAL)(j == r + 1) - inv[r + 1] * A1[j];
                REAL dy2 = (REAL)(j == r + 2) - inv[r + 2] * A2[j];
                REAL drad = act ? mu[k] * ((REAL)(j == r) - inv[r] * An[j]) : 0;
                J1[j] = (REAL)(j == r + 1) - h1 * drad - rad * (p11 * dy1 + p12 * dy2);
                J2[j] = (REAL)(j == r + 2) - h2 * drad - rad * (p12 * dy1 + p22 * dy2);
            }
        }
    }
}

/* x solving M x = b (M R x R, row-major, overwritten by its LU factors; b overwritten by x), partial
   pivoting. Returns 0 where a pivot is at most `rel` times the largest (x then not computed). */
static int lu_solve_SUFFIX(int64_t R, REAL *M, REAL *b, int64_t *piv, REAL rel) {
    REAL pmax = 0, pmin = INFINITY;
    for (int64_t col = 0; col < R; ++col) {
        int64_t p = col;
        REAL best = FABS(M[col * R + col]);
        for (int64_t i = col + 1; i < R; ++i) {
            REAL x = FABS(M[i * R + col]);
            if (x > best) { best = x; p = i; }
        }
        piv[col] = p;
        if (p != col)
            for (int64_t j = 0; j < R; ++j) { REAL t = M[col * R + j]; M[col * R + j] = M[p * R + j]; M[p * R + j] = t; }
        pmax = best > pmax ? best : pmax;
        pmin = best < pmin ? best : pmin;
        if (!(best > 0)) return 0;
        REAL pinv = 1 / M[col * R + col];
        for (int64_t i = col + 1; i < R; ++i) {
            REAL f = M[i * R + col] * pinv;
            M[i * R + col] = f;
            if (f != 0)
                for (int64_t j = col + 1; j < R; ++j) M[i * R + j] -= f * M[col * R + j];
        }
    }
    if (!(pmin > rel * pmax)) return 0;
    for (int64_t i = 0; i < R; ++i) { REAL t = b[i]; b[i] = b[piv[i]]; b[piv[i]] = t; }
    for (int64_t i = 0; i < R; ++i) for (int64_t j = 0; j < i; ++j) b[i] -= M[i * R + j] * b[j];
    for (int64_t i = R - 1; i >= 0; --i) {
        for (int64_t j = i + 1; j < R; ++j) b[i] -= M[i * R + j] * b[j];
        b[i] /= M[i * R + i];
    }
    return 1;
}

/* The Levenberg-Marquardt step d = -(J^T J + s I)^-1 J^T G (for a singular J: a statically indeterminate
   contact set, e.g. four corners of a box), by Cholesky. N: R x R workspace. Returns 0 if that fails too. */
static int lm_step_SUFFIX(int64_t R, const REAL *Jm, const REAL *G, REAL s, REAL *N, REAL *d) {
    for (int64_t i = 0; i < R; ++i) {
        REAL g = 0;
        for (int64_t k = 0; k < R; ++k) g += Jm[k * R + i] * G[k];
        d[i] = -g;
        for (int64_t j = 0; j <= i; ++j) {
            REAL x = 0;
            for (int64_t k = 0; k < R; ++k) x += Jm[k * R + i] * Jm[k * R + j];
            N[i * R + j] = x;
        }
    }
    REAL tr = 0;
    for (int64_t i = 0; i < R; ++i) tr += N[i * R + i];
    s = s > (REAL)1e-10 * tr / (REAL)R ? s : (REAL)1e-10 * tr / (REAL)R;
    for (int64_t i = 0; i < R; ++i) N[i * R + i] += s;
    for (int64_t j = 0; j < R; ++j) { /* lower Cholesky factor in place */
        REAL x = N[j * R + j];
        for (int64_t k = 0; k < j; ++k) x -= N[j * R + k] * N[j * R + k];
        if (!(x > 0)) return 0;
        x = SQRT(x);
        N[j * R + j] = x;
        for (int64_t i = j + 1; i < R; ++i) {
            REAL y = N[i * R + j];
            for (int64_t k = 0; k < j; ++k) y -= N[i * R + k] * N[j * R + k];
            N[i * R + j] = y / x;
        }
    }
    for (int64_t i = 0; i < R; ++i) {
        for (int64_t k = 0; k < i; ++k) d[i] -= N[i * R + k] * d[k];
        d[i] /= N[i * R + i];
    }
    for (int64_t i = R - 1; i >= 0; --i) {
        for (int64_t k = i + 1; k < R; ++k) d[i] -= N[k * R + i] * d[k];
        d[i] /= N[i * R + i];
    }
    return 1;
}

/* Semismooth Newton on natural_SUFFIX from lb (w = A lb + c on entry), with a backtracking line search on
   |G|^2, until max |G| <= tol_abs or newton iterations; lb, w: the best iterate. Returns the iterations. */
static int64_t newton_SUFFIX(int64_t K, const REAL *Ab, const REAL *cb, const REAL *mub, const REAL *inv, REAL *lb,
                             REAL *w, int64_t newton, REAL tol_abs, REAL scale, REAL *work, int64_t *piv) {
    const int64_t R = 3 * K;
    REAL *Jm = work, *N = Jm + R * R, *G = N + R * R, *d = G + R, *Ad = d + R, *lt = Ad + R, *wt = lt + R, *Gt = wt + R;
    REAL viol;
    REAL g = natural_SUFFIX(K, inv, mub, lb, w, G, &viol);
    REAL f = 0;
    for (int64_t i = 0; i < R; ++i) f += G[i] * G[i];
    int64_t it = 0;
    for (it = 0; it < newton && !(g <= tol_abs); ++it) {
        jacobian_SUFFIX(K, Ab, inv, mub, lb, w, Jm);
        for (int64_t i = 0; i < R; ++i) d[i] = -G[i];
        memcpy(N, Jm, sizeof(REAL) * (size_t)(R * R));
        if (!lu_solve_SUFFIX(R, N, d, piv, (REAL)1e-12)) {
            jacobian_SUFFIX(K, Ab, inv, mub, lb, w, Jm);
            REAL s = g / (scale > 0 ? scale : (REAL)1);
            s = s < (REAL)1e-2 ? s : (REAL)1e-2;
            if (!lm_step_SUFFIX(R, Jm, G, s, N, d)) break;
        }
        for (int64_t i = 0; i < R; ++i) {
            REAL x = 0;
            for (int64_t j = 0; j < R; ++j) x += Ab[i * R + j] * d[j];
            Ad[i] = x;
        }
        REAL step = 1, ft = 0, gt = 0;
        int accepted = 0;
        for (int ls = 0; ls < 30; ++ls, step *= (REAL)0.5) {
            for (int64_t i = 0; i < R; ++i) { lt[i] = lb[i] + step * d[i]; wt[i] = w[i] + step * Ad[i]; }
            gt = natural_SUFFIX(K, inv, mub, lt, wt, Gt, &viol);
            ft = 0;
            for (int64_t i = 0; i < R; ++i) ft += Gt[i] * Gt[i];
            if (ft <= (1 - (REAL)1e-4 * step) * f) { accepted = 1; break; }
        }
        if (!accepted) break; /* no descent along the direction: stalled (the caller reports the residual) */
        memcpy(lb, lt, sizeof(REAL) * (size_t)R);
        /* w afresh every few steps: the updates w += step A d drift by rounding */
        if (it % 8 == 7) {
            for (int64_t i = 0; i < R; ++i) {
                REAL x = cb[i];
                for (int64_t j = 0; j < R; ++j) x += Ab[i * R + j] * lb[j];
                w[i] = x;
            }
            g = natural_SUFFIX(K, inv, mub, lb, w, G, &viol);
            f = 0;
            for (int64_t i = 0; i < R; ++i) f += G[i] * G[i];
        } else {
            memcpy(w, wt, sizeof(REAL) * (size_t)R);
            memcpy(G, Gt, sizeof(REAL) * (size_t)R);
            g = gt;
            f = ft;
        }
    }
    return it;
}

/* Per environment: sweeps from lam (its warm start), at most `iterations`, stopping where no impulse changed
   by more than tol (relative to the largest impulse, plus 1 N s) in a sweep (checked every check_every); then,
   where the contact conditions are still unmet -- max |G| of natural_SUFFIX above max(tol, 64 eps) times the
   problem's impulse scale (the largest of |lam| and inv_i |c_i|) -- at most `newton` semismooth Newton
   iterations. Sweeps can cycle on problems with sliding friction and strong normal-tangential coupling
   (a standing quadruped's feet) and never meet the conditions; Newton's method converges there in a few
   iterations. iters_out[2] = (most sweeps, most Newton iterations); res_out[3] = (largest relative residual
   max |G| / scale, largest velocity error max |G_i| / inv_i in m/s, number of environments not converged). */
void pgs_SUFFIX(int64_t B, int64_t K, const REAL *A, const REAL *c, const REAL *mu, REAL *lam,
                int64_t iterations, double tol, int64_t check_every, int64_t newton, int64_t *iters_out,
                double *res_out) {
    const int64_t R = 3 * K;
    REAL *w = (REAL *)malloc(sizeof(REAL) * (size_t)(2 * R + 2 * R * R + 10 * R));
    REAL *inv = w + R, *work = inv + R, *G = work + 2 * R * R;
    int64_t *piv = (int64_t *)malloc(sizeof(int64_t) * (size_t)(R > 0 ? R : 1));
    int64_t most = 0, most_newton = 0, failed = 0;
    double worst = 0.0, worst_v = 0.0;
    const double tol_rel = tol > 64 * (double)EPS ? tol : 64 * (double)EPS;
    for (int64_t b = 0; b < B; ++b) {
        const REAL *Ab = A + b * R * R, *cb = c + b * R, *mub = mu + b * K;
        REAL *lb = lam + b * R;
        prepare_SUFFIX(R, Ab, cb, lb, inv, w);
        int64_t it = 0;
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
                if ((double)change / ((double)size + 1.0) <= tol) break;
            }
        }
        if (it > iterations) it = iterations;
        most = it > most ? it : most;
        /* the sweeps' w drifts by rounding over many updates: afresh for the natural map */
        for (int64_t i = 0; i < R; ++i) {
            REAL x = cb[i];
            for (int64_t j = 0; j < R; ++j) x += Ab[i * R + j] * lb[j];
            w[i] = x;
        }
        REAL scale = 0;
        for (int64_t i = 0; i < R; ++i) {
            REAL x = FABS(lb[i]), y = inv[i] * FABS(cb[i]);
            scale = x > scale ? x : scale;
            scale = y > scale ? y : scale;
        }
        const REAL tol_abs = (REAL)(tol_rel * (double)scale);
        REAL viol;
        REAL g = natural_SUFFIX(K, inv, mub, lb, w, G, &viol);
        if (!(g <= tol_abs) && newton > 0) {
            /* Newton's result is kept only where it converges: where it stalls (a rank-deficient problem
               whose contact targets no motion meets, or one without a solution) its iterates may have
               wandered along near-null directions, and the sweeps' impulses are the better answer */
            REAL *keep = work + 2 * R * R + 6 * R; /* past newton_SUFFIX's workspace */
            memcpy(keep, lb, sizeof(REAL) * (size_t)R);
            REAL g0 = g, v0 = viol;
            int64_t nit = newton_SUFFIX(K, Ab, cb, mub, inv, lb, w, newton, tol_abs, scale, work, piv);
            most_newton = nit > most_newton ? nit : most_newton;
            for (int64_t i = 0; i < R; ++i) {
                REAL x = cb[i];
                for (int64_t j = 0; j < R; ++j) x += Ab[i * R + j] * lb[j];
                w[i] = x;
            }
            g = natural_SUFFIX(K, inv, mub, lb, w, G, &viol);
            if (!(g <= tol_abs)) {
                memcpy(lb, keep, sizeof(REAL) * (size_t)R);
                g = g0;
                viol = v0;
            }
        }
        double rel = scale > 0 ? (double)g / (double)scale : (double)g;
        if (!(rel <= tol_rel)) ++failed;
        if (!(rel <= worst)) worst = rel;
        if (!((double)viol <= worst_v)) worst_v = (double)viol;
    }
    free(w);
    free(piv);
    iters_out[0] = most;
    iters_out[1] = most_newton;
    res_out[0] = worst;
    res_out[1] = worst_v;
    res_out[2] = (double)failed;
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
        /* F'^T u = grad by LU with partial pivoting (F'^T overwritten) */
        for (int64_t i = 0; i < R; ++i) u[i] = grad[b * R + i];
        ok[b] = R == 0 || lu_solve_SUFFIX(R, F, u, piv, (REAL)1e-10);
        if (!ok[b]) continue;
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
            /* through the tangent step size rho = 2 / (A_t1t1 + A_t2t2): d rho / d A_tt = -rho^2 / 2 (zero at an
               exact solution, where the slip is along z) */
            REAL dr = -mln[k] * (pv1 * w[r + 1] + pv2 * w[r + 2]) * inv[r + 1] * inv[r + 1] / 2;
            db[r + 1] = dr;
            db[r + 2] = dr;
        }
    }
    free(F);
    free(piv);
    return sliding_blocks;
}
