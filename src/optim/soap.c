/* SOAP: Adam in the eigenbases of Shampoo's statistics (optim.h; pytorch_optimizer's SOAP is the oracle,
 * scripts/make_soap_fixture.py). A matrix G [r, c] keeps L = E[G G^T] and R = E[G^T G] and their bases QL, QR;
 * Adam's first moment lives in the weights' own coordinates, its second in the rotated ones (QL^T G QR). */
#include "optim_internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t off, count;
    int rows, cols;
    float *L, *R, *QL, *QR; /* NULL: that side unrotated */
} soap_tensor;

struct dt_soap {
    soap_tensor *t;
    int n;
    float *work[3];         /* three matrices of the largest tensor, and its bases' scratch */
    size_t bytes;
    bool started;           /* its first call measured (a resumed run's: the checkpoint's) */
};

void dt_soap_destroy(dt_soap *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) free(s->t[i].L), free(s->t[i].R), free(s->t[i].QL), free(s->t[i].QR);
    for (int k = 0; k < 3; k++) free(s->work[k]);
    free(s->t);
    free(s);
}

dt_status dt_soap_create(const dt_optim_config *c, const dt_tensor_span *spans, int nspans, dt_soap **out) {
    *out = NULL;
    if (c->precond_every < 1 || c->precond_max_dim < 1)
        return dt_error(DT_ERR_ARG, "SOAP: --precondition-every %d and --precondition-max-dim %d must be 1 or more", c->precond_every,
                        c->precond_max_dim);
    dt_soap *s = calloc(1, sizeof *s);
    if (!s || !(s->t = calloc((size_t)nspans + 1, sizeof *s->t))) {
        free(s);
        return dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
    }
    size_t big = 1;
    bool ok = true;
    for (int i = 0; i < nspans && ok; i++) {
        const dt_tensor_span *sp = &spans[i];
        if (!sp->count) continue;
        bool matrix = sp->rows > 0 && sp->cols > 0;
        if (matrix && (size_t)sp->rows * sp->cols != sp->count) {
            dt_soap_destroy(s);
            return dt_error(DT_ERR_ARG, "SOAP rotates whole matrices: tensor %d is cut (%zu of %d x %d here: a sharded strategy)", sp->tensor,
                            sp->count, sp->rows, sp->cols);
        }
        soap_tensor *t = &s->t[s->n++];
        *t = (soap_tensor){ .off = sp->offset, .count = sp->count, .rows = matrix ? sp->rows : 0, .cols = matrix ? sp->cols : 0 };
        if (!matrix) continue;
        int side[2] = { sp->rows, sp->cols };
        for (int k = 0; k < 2 && ok; k++) {
            int d = side[k];
            if (d > c->precond_max_dim) continue;
            size_t b = (size_t)d * d * sizeof(float);
            float **st = k ? &t->R : &t->L, **q = k ? &t->QR : &t->QL;
            ok = (*st = calloc(1, b)) && (*q = calloc(1, b));
            s->bytes += 2 * b;
            big = (size_t)d * d > big ? (size_t)d * d : big;
        }
        big = sp->count > big ? sp->count : big;
    }
    /* the eigenvalues after a basis's matrix: big + its side */
    for (int k = 0; k < 3 && ok; k++) ok = (s->work[k] = malloc((big + (size_t)c->precond_max_dim + 1) * sizeof(float))) != NULL;
    if (!ok) {
        dt_soap_destroy(s);
        return dt_error(DT_ERR_NOMEM, "SOAP: out of memory for its statistics");
    }
    *out = s;
    return DT_OK;
}

size_t dt_soap_state_bytes(const dt_soap *s) { return s ? s->bytes : 0; }

/* Q = the eigenvectors of S [d, d], by descending eigenvalue (as the oracle flips eigh's ascending order). */
static dt_status eigenbasis(const float *S, int d, float *Q, float *scratch) {
    memcpy(scratch, S, (size_t)d * d * sizeof(float));
    float *w = scratch + (size_t)d * d;
    int info = LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'U', d, scratch, d, w);
    if (info) return dt_error(DT_ERR_ARG, "SOAP: the eigen-decomposition of a %d x %d statistic failed (LAPACK's info %d)", d, d, info);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) Q[(size_t)i * d + j] = scratch[(size_t)i * d + (d - 1 - j)];
    return DT_OK;
}

/* S += w (G G^T - S) (side 0) or w (G^T G - S) (side 1). */
static void accumulate(float *S, const float *G, int r, int c, int side, float w, float *outer) {
    int d = side ? c : r;
    if (side) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, c, c, r, 1.0f, G, c, G, c, 0.0f, outer, c);
    else cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, r, r, c, 1.0f, G, c, G, c, 0.0f, outer, r);
    for (size_t i = 0; i < (size_t)d * d; i++) S[i] += w * (outer[i] - S[i]);
}

/* X [r, c] into out: QL^T X QR (forward) or QL X QR^T (back), a missing side as it is. tmp: r x c. */
static void rotate(const soap_tensor *t, const float *X, float *out, float *tmp, bool back) {
    int r = t->rows, c = t->cols;
    const float *a = X;
    if (t->QL) {
        cblas_sgemm(CblasRowMajor, back ? CblasNoTrans : CblasTrans, CblasNoTrans, r, c, r, 1.0f, t->QL, r, X, c, 0.0f, tmp, c);
        a = tmp;
    }
    if (t->QR) cblas_sgemm(CblasRowMajor, CblasNoTrans, back ? CblasTrans : CblasNoTrans, r, c, c, 1.0f, a, c, t->QR, c, 0.0f, out, c);
    else if (a != out) memcpy(out, a, (size_t)r * c * sizeof(float));
}

/* One refresh of side k's basis: the power iteration S Q, its columns sorted by the estimated eigenvalues (the second
 * moments v reordered alike along that side), then QR (LAPACK's geqrf and orgqr). */
static dt_status refresh(soap_tensor *t, int side, float *v, float *mp, float *scratch) {
    int d = side ? t->cols : t->rows, r = t->rows, c = t->cols;
    float *S = side ? t->R : t->L, *Q = side ? t->QR : t->QL;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0f, S, d, Q, d, 0.0f, mp, d);
    int *order = malloc(sizeof *order * (size_t)d);
    float *est = malloc(sizeof *est * (size_t)d), *tau = malloc(sizeof *tau * (size_t)d);
    if (!order || !est || !tau) {
        free(order), free(est), free(tau);
        return dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
    }
    for (int j = 0; j < d; j++) {
        double e = 0;
        for (int i = 0; i < d; i++) e += (double)Q[(size_t)i * d + j] * mp[(size_t)i * d + j];
        est[j] = (float)e, order[j] = j;
    }
    for (int i = 1; i < d; i++) /* descending; insertion keeps equals in order */
        for (int j = i; j > 0 && est[order[j]] > est[order[j - 1]]; j--) {
            int x = order[j];
            order[j] = order[j - 1], order[j - 1] = x;
        }
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) scratch[(size_t)i * d + j] = mp[(size_t)i * d + order[j]];
    memcpy(mp, v, (size_t)r * c * sizeof(float)); /* v reordered along the side */
    for (int i = 0; i < r; i++)
        for (int j = 0; j < c; j++) v[(size_t)i * c + j] = side ? mp[(size_t)i * c + order[j]] : mp[(size_t)order[i] * c + j];
    int info = LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, d, d, scratch, d, tau);
    if (!info) info = LAPACKE_sorgqr(LAPACK_ROW_MAJOR, d, d, d, scratch, d, tau);
    if (!info) memcpy(Q, scratch, (size_t)d * d * sizeof(float));
    free(order), free(est), free(tau);
    return info ? dt_error(DT_ERR_ARG, "SOAP: the QR of a %d x %d basis failed (LAPACK's info %d)", d, d, info) : DT_OK;
}

/* The statistics take G; on the first call the bases come from them, then every precond_every steps are refreshed. */
static dt_status measure(dt_soap *s, soap_tensor *t, const dt_optim_config *c, const float *G, float *v, long step, bool first) {
    float sb = c->shampoo_beta >= 0 ? c->shampoo_beta : c->beta2;
    dt_status st = DT_OK;
    for (int k = 0; k < 2 && !st; k++) {
        float *S = k ? t->R : t->L, *Q = k ? t->QR : t->QL;
        if (!S) continue;
        accumulate(S, G, t->rows, t->cols, k, 1.0f - sb, s->work[0]);
        if (first) st = eigenbasis(S, k ? t->cols : t->rows, Q, s->work[1]);
    }
    for (int k = 0; k < 2 && !st && !first && step % c->precond_every == 0; k++)
        if (k ? t->R : t->L) st = refresh(t, k, v, s->work[0], s->work[1]);
    return st;
}

/* x's Adam step direction into dir (n floats): m and v take G (v in the rotated coordinates), then
 * rot(m) / (sqrt(v) + eps) rotated back; a vector, or a matrix with neither side rotated, as plain Adam. */
static const float *direction(dt_soap *s, const soap_tensor *x, const dt_optim_config *c, const float *G, float *M, float *V) {
    bool mat = x->QL || x->QR;
    float *rot = s->work[0], *tmp = s->work[1], *dir = s->work[2];
    const float *gr = G;
    size_t n = x->count;
    if (mat) rotate(x, G, rot, tmp, false), gr = rot;
    for (size_t k = 0; k < n; k++) {
        M[k] += (1.0f - c->beta1) * (G[k] - M[k]);
        V[k] += (1.0f - c->beta2) * (gr[k] * gr[k] - V[k]);
    }
    if (mat) rotate(x, M, dir, tmp, false);
    else memcpy(dir, M, n * sizeof *dir);
    for (size_t k = 0; k < n; k++) dir[k] /= sqrtf(V[k]) + c->eps;
    if (!mat) return dir;
    rotate(x, dir, rot, tmp, true);
    return rot;
}

dt_status dt_soap_step(dt_soap *s, const dt_optim_config *c, long t, float *p, float *g, float *m, float *v, float lr, double *sumsq) {
    dt_status st = DT_OK;
    double ss = 0;
    long step = t - 1; /* the oracle's count; its first call only measures */
    bool first = !s->started;
    s->started = true;
    float size = first ? 0 : lr * sqrtf(1.0f - powf(c->beta2, (float)step)) / (1.0f - powf(c->beta1, (float)step));
    for (int i = 0; i < s->n && !st; i++) {
        soap_tensor *x = &s->t[i];
        size_t n = x->count;
        float *P = p + x->off, *G = g + x->off, *V = v + x->off;
        for (size_t k = 0; k < n; k++) ss += (double)G[k] * G[k];
        if (!first) {
            const float *dir = direction(s, x, c, G, m + x->off, V);
            for (size_t k = 0; k < n; k++) {
                P[k] -= size * dir[k];
                P[k] *= 1.0f - lr * c->weight_decay;
            }
        }
        if (x->rows) st = measure(s, x, c, G, V, step, first);
    }
    *sumsq = ss;
    return st;
}

/* ---- its state in checkpoints: a unit a tensor (L, QL, then R, QR, of the sides it rotates; a vector none), every
 * rank holding all; its count of steps 1 once its first step has measured ---- */

static size_t unit_floats(void *ctx, int u) {
    const soap_tensor *t = &((dt_soap *)ctx)->t[u];
    return (t->L ? 2 * (size_t)t->rows * t->rows : 0) + (t->R ? 2 * (size_t)t->cols * t->cols : 0);
}

static int unit_saver(void *ctx, int u) { return (void)ctx, (void)u, 0; }
static int unit_loads(void *ctx, int u, int rank) { return (void)ctx, (void)u, (void)rank, 1; }

static void unit_io(void *ctx, int u, float *buf, int load) {
    soap_tensor *t = &((dt_soap *)ctx)->t[u];
    float *part[4] = { t->L, t->QL, t->R, t->QR };
    size_t len[4] = { (size_t)t->rows * t->rows, (size_t)t->rows * t->rows, (size_t)t->cols * t->cols, (size_t)t->cols * t->cols };
    for (int i = 0; i < 4; i++) {
        if (!part[i]) continue;
        memcpy(load ? part[i] : buf, load ? buf : part[i], len[i] * sizeof(float));
        buf += len[i];
    }
}

static long unit_steps(void *ctx) { return ((dt_soap *)ctx)->started; }
static void unit_set_steps(void *ctx, long t) { ((dt_soap *)ctx)->started = t > 0; }

void dt_soap_units(dt_soap *s, dt_state_units *out) {
    *out = (dt_state_units){ "soap", s ? s->n : 0, unit_floats, unit_saver, unit_loads, unit_io, unit_steps, unit_set_steps, s, 0 };
}
