/* SOAP (soap.h): Adam in the eigenbases of Shampoo's statistics, as a preconditioner with SGD under it. With several
 * data-parallel ranks each rotated matrix is kept by one of them (as distributed Shampoo's blocks, chosen by cost),
 * which alone holds its statistics, bases and moments and computes its direction; the directions are then
 * allgathered. A mixture's stacked experts are each their own matrix; under expert parallelism a rank's own experts
 * (its and its replicas' alone) are stepped and rotated where they are, never shared out. */
#include "optim_internal.h"

#include "dtrain/kfac.h"
#include "dtrain/soap.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    size_t off, count;
    int tensor;             /* its number in the table (for the warnings' names) */
    int rows, cols;
    int owner;              /* the rank of the group that keeps and rotates it (-1: every rank steps it) */
    bool own;               /* an expert only this rank (and its replicas) holds: stepped and rotated here, owner -1 */
    size_t at;              /* its place among the directions exchanged (by owner, then in order) */
    float *L, *R, *QL, *QR; /* NULL: that side unrotated, or kept by another rank */
    float *m, *v;           /* Adam's moments (NULL: kept by another rank) */
} soap_tensor;

/* A unit of its checkpointed state: the span this rank holds (-1: none), one of the same size, and for an expert-parallel
 * rank's own expert the expert-parallel rank holding it (-1: not one) */
typedef struct { int span, like, holder; } soap_unit;

struct dt_soap {
    dt_optim_config c;
    const dt_tensor_info *tensors; /* the model's table, which outlives it */
    soap_tensor *t;
    int n, rank, ranks;
    dt_comm *comm;          /* the ranks sharing the matrices (NULL: this one all) */
    bool own_comm;          /* split from the caller's */
    size_t *counts, share;  /* floats of the directions each rank computes; a rank's share of the gathered ones (the
                             * largest count: one allgather of equal blocks) */
    float *send, *recv;     /* this rank's directions; every rank's */
    float *work[4];         /* matrices of the largest tensor (the fourth its direction), and its bases' scratch */
    size_t bytes, most;     /* this rank's statistics, bases and moments; the group's fullest rank's */
    int rotated;            /* matrices it rotates (of the whole group; an expert-parallel rank's own ones counted once) */
    soap_unit *units;       /* the checkpoint's (make_units) */
    int nunits;
    long steps;             /* its steps (the first only measures) */
};

void dt_soap_destroy(dt_soap *s) {
    if (!s) return;
    for (int i = 0; i < s->n; i++) {
        soap_tensor *t = &s->t[i];
        free(t->L), free(t->R), free(t->QL), free(t->QR), free(t->m), free(t->v);
    }
    for (int k = 0; k < 4; k++) free(s->work[k]);
    if (s->comm) dt_comm_free(s->comm, s->send), dt_comm_free(s->comm, s->recv);
    if (s->own_comm) dt_comm_destroy(s->comm);
    free(s->counts), free(s->t), free(s->units);
    free(s);
}

static bool rotates(const dt_optim_config *c, const dt_tensor_span *sp) {
    return sp->count && sp->rows > 0 && sp->cols > 0 && (sp->rows <= c->precond_max_dim || sp->cols <= c->precond_max_dim);
}

void dt_soap_assign(const dt_optim_config *c, const dt_tensor_span *spans, int n, int ranks, int *owner, double *cost, size_t *floats) {
    double *w = calloc((size_t)n + 1, sizeof *w);
    int *idx = calloc((size_t)n + 1, sizeof *idx), *who = calloc((size_t)n + 1, sizeof *who), k = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor_span *sp = &spans[i];
        double r = sp->rows, cl = sp->cols, d[2] = { r, cl }, f = 0, flops = 0;
        for (int j = 0; j < 2 && rotates(c, sp); j++) {
            if (d[j] > c->precond_max_dim) continue;
            f += 2 * d[j] * d[j];
            /* the statistic's GEMM, three rotations of a GEMM a side; the power iteration and QR at their interval */
            flops += 8 * d[j] * r * cl + (2 + 8.0 / 3) * d[j] * d[j] * d[j] / (c->precond_every > 0 ? c->precond_every : 1);
        }
        if (cost) cost[i] = flops;
        if (floats) floats[i] = (size_t)f + 2 * sp->count;
        if (owner) owner[i] = -1;
        if (rotates(c, sp) && !sp->own && w && idx) w[k] = flops, idx[k++] = i;
    }
    if (w && idx && who) dt_kfac_assign(w, k, ranks, 1, who); /* KAISA's greedy, each rank its own column */
    for (int j = 0; j < k && owner; j++) owner[idx[j]] = who ? who[j] : j % ranks;
    free(w), free(idx), free(who);
}

dt_status dt_soap_spans(const dt_tensor_info *tensors, int n, dt_tensor_span **out, int *count) {
    *count = 0;
    if (!(*out = calloc((size_t)n + 1, sizeof **out))) return dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &tensors[i];
        if (!t->count || t->tied_copy) continue;
        if (t->stacked && t->ndim == 3) { /* a mixture's experts: each its own matrix (Hugging Face's Linears) */
            int E = t->shape[0], r = t->shape[1], c = t->shape[2];
            dt_tensor_span *more = realloc(*out, ((size_t)*count + (size_t)(n - i) + (size_t)E) * sizeof **out);
            if (!more) return free(*out), *out = NULL, *count = 0, dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
            *out = more;
            for (int e = 0; e < E; e++)
                (*out)[(*count)++] = (dt_tensor_span){ t->offset + (size_t)e * r * c, (size_t)r * c, i, r, c, E != t->gshape[0] };
            continue;
        }
        bool mat = t->ndim == 2;
        (*out)[(*count)++] = (dt_tensor_span){ t->offset, t->count, i, mat ? t->shape[0] : 0, mat ? t->shape[1] : 0, 0 };
    }
    return DT_OK;
}

static bool take(float **p, size_t floats, size_t *bytes) {
    *bytes += floats * sizeof(float);
    return (*p = calloc(floats ? floats : 1, sizeof(float))) != NULL;
}

/* A tensor this rank steps: its moments, and its statistics and bases a side it rotates. *big: the largest matrix. */
static bool hold(dt_soap *s, soap_tensor *t, size_t *big) {
    bool ok = take(&t->m, t->count, &s->bytes) && take(&t->v, t->count, &s->bytes);
    *big = t->count > *big ? t->count : *big;
    int side[2] = { t->rows, t->cols };
    for (int k = 0; k < 2 && ok && (t->owner >= 0 || t->own); k++) {
        int d = side[k];
        if (d > s->c.precond_max_dim) continue;
        ok = take(k ? &t->R : &t->L, (size_t)d * d, &s->bytes) && take(k ? &t->QR : &t->QL, (size_t)d * d, &s->bytes);
        *big = (size_t)d * d > *big ? (size_t)d * d : *big;
    }
    return ok;
}

/* The checkpoint's units: a span's own, but an expert-parallel rank's experts one a global expert, so that another
 * expert-parallel layout (or one process) finds each where it holds it. */
static bool make_units(dt_soap *s) {
    int nu = 0;
    for (int i = 0; i < s->n; i++)
        nu += !s->t[i].own ? 1 : i == 0 || s->t[i - 1].tensor != s->t[i].tensor ? s->tensors[s->t[i].tensor].gshape[0] : 0;
    if (!(s->units = calloc((size_t)nu + 1, sizeof *s->units))) return false;
    for (int i = 0; i < s->n; i++) {
        const dt_tensor_info *x = &s->tensors[s->t[i].tensor];
        if (!s->t[i].own) s->units[s->nunits++] = (soap_unit){ i, i, -1 };
        else if (i == 0 || s->t[i - 1].tensor != s->t[i].tensor)
            for (int g = 0, El = x->shape[0], first = x->slice.offset; g < x->gshape[0]; g++) /* this rank's: [first, first + El) */
                s->units[s->nunits++] = (soap_unit){ g >= first && g < first + El ? i + g - first : -1, i, g / El };
    }
    return true;
}

/* Each tensor's owner and place, this rank's state, the scratch, the exchange's buffers. */
static bool allocate(dt_soap *s, const dt_tensor_span *sp, int n) {
    int *owner = calloc((size_t)n + 1, sizeof *owner);
    size_t *floats = calloc((size_t)n + 1, sizeof *floats), *per = calloc((size_t)s->ranks, sizeof *per), big = 1;
    bool ok = owner && floats && per && (s->counts = calloc((size_t)s->ranks, sizeof *s->counts));
    if (ok) dt_soap_assign(&s->c, sp, n, s->ranks, owner, NULL, floats);
    for (int i = 0; i < n && ok; i++) {
        soap_tensor *t = &s->t[i];
        *t = (soap_tensor){ .off = sp[i].offset, .count = sp[i].count, .tensor = sp[i].tensor, .rows = sp[i].rows, .cols = sp[i].cols,
                            .owner = owner[i], .own = sp[i].own };
        if (t->owner >= 0) s->counts[t->owner] += t->count, per[t->owner] += floats[i] * sizeof(float), s->rotated++;
        else {
            s->rotated += t->own && rotates(&s->c, &sp[i]);
            for (int r = 0; r < s->ranks; r++) per[r] += floats[i] * sizeof(float); /* an expert: each rank its own */
        }
        if (t->owner < 0 || t->owner == s->rank) ok = hold(s, t, &big);
    }
    for (int r = 0; r < s->ranks && ok; r++) {
        s->most = per[r] > s->most ? per[r] : s->most;
        s->share = s->counts[r] > s->share ? s->counts[r] : s->share;
    }
    for (int r = 0; r < s->ranks && ok; r++) /* by owner (its share), then in order */
        for (size_t i = 0, at = (size_t)r * s->share; i < (size_t)n; i++)
            if (s->t[i].owner == r) s->t[i].at = at, at += s->t[i].count;
    /* the eigenvalues after a basis's matrix: big + its side */
    for (int k = 0; k < 4 && ok; k++) ok = (s->work[k] = malloc((big + (size_t)s->c.precond_max_dim + 1) * sizeof(float))) != NULL;
    if (ok && s->ranks > 1) /* in the shared arena (zeroed): the peers on this machine read a share where it lies */
        ok = !dt_comm_alloc(s->comm, (s->share + 1) * sizeof(float), (void **)&s->send) &&
             !dt_comm_alloc(s->comm, (s->share * (size_t)s->ranks + 1) * sizeof(float), (void **)&s->recv);
    free(owner), free(floats), free(per);
    return ok;
}

dt_status dt_soap_create(const dt_optim_config *c, const dt_tensor_info *tensors, int n, dt_comm *comm, dt_soap **out) {
    *out = NULL;
    if (c->precond_every < 1 || c->precond_max_dim < 1)
        return dt_error(DT_ERR_ARG, "SOAP: --precondition-every %d and --precondition-max-dim %d must be 1 or more", c->precond_every,
                        c->precond_max_dim);
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 > 0 && c->beta2 < 1))
        return dt_error(DT_ERR_ARG, "SOAP: --betas %g,%g: beta1 in [0, 1), beta2 in (0, 1)", c->beta1, c->beta2);
    if (!(c->eps > 0)) return dt_error(DT_ERR_ARG, "SOAP: --eps %g must be above 0", c->eps);
    dt_soap *s = calloc(1, sizeof *s);
    dt_tensor_span *spans = NULL;
    dt_status st = s ? dt_soap_spans(tensors, n, &spans, &s->n) : dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
    if (st) return free(s), st;
    s->c = *c, s->tensors = tensors;
    if (!(s->t = calloc((size_t)s->n + 1, sizeof *s->t))) st = dt_error(DT_ERR_NOMEM, "SOAP: out of memory");
    if (!st) st = dt_optim_work_group(comm, c->soap_group, "SOAP", "--soap-group", &s->comm, &s->own_comm);
    s->rank = s->comm ? dt_comm_rank(s->comm) : 0;
    s->ranks = s->comm ? dt_comm_size(s->comm) : 1;
    if (!st && (!allocate(s, spans, s->n) || !make_units(s))) st = dt_error(DT_ERR_NOMEM, "SOAP: out of memory for its statistics");
    free(spans);
    if (st) {
        dt_soap_destroy(s);
        return st;
    }
    *out = s;
    return DT_OK;
}

size_t dt_soap_state_bytes(const dt_soap *s) { return s ? s->bytes : 0; }
size_t dt_soap_state_bytes_most(const dt_soap *s) { return s ? s->most : 0; }

void dt_soap_describe(const dt_soap *s, char *out, size_t n) {
    snprintf(out, n, "SOAP: %d matrices rotated, %s, SGD under it: its statistics, bases and moments %.3f MiB on the rank holding "
             "most", s->rotated, s->ranks > 1 ? "each kept by one of the group's ranks, its directions allgathered" : "every rank all",
             s->most / 1048576.0);
    if (s->ranks > 1) snprintf(out + strlen(out), n - strlen(out), " (%d ranks a group)", s->ranks);
    int own = 0;
    for (int i = 0; i < s->n; i++) own += s->t[i].own && (s->t[i].L || s->t[i].R);
    if (own) snprintf(out + strlen(out), n - strlen(out), "; %d of them this rank's own experts, rotated where they are", own);
}

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
    int info = LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, d, d, scratch, d, tau);
    if (!info) info = LAPACKE_sorgqr(LAPACK_ROW_MAJOR, d, d, d, scratch, d, tau);
    if (!info) { /* the new basis, and v reordered along the side to match it (a failed one keeps both) */
        memcpy(Q, scratch, (size_t)d * d * sizeof(float));
        memcpy(mp, v, (size_t)r * c * sizeof(float));
        for (int i = 0; i < r; i++)
            for (int j = 0; j < c; j++) v[(size_t)i * c + j] = side ? mp[(size_t)i * c + order[j]] : mp[(size_t)order[i] * c + j];
    }
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

/* Every rank's directions to every rank: each packs its own, then takes the others'. */
static dt_status exchange(dt_soap *s, float *g) {
    size_t mine = (size_t)s->rank * s->share;
    for (int i = 0; i < s->n; i++)
        if (s->t[i].owner == s->rank) memcpy(s->send + (s->t[i].at - mine), g + s->t[i].off, s->t[i].count * sizeof(float));
    dt_status st = dt_comm_allgather(s->comm, s->send, s->recv, s->share, DT_F32);
    for (int i = 0; i < s->n && !st; i++)
        if (s->t[i].owner >= 0 && s->t[i].owner != s->rank) memcpy(g + s->t[i].off, s->recv + s->t[i].at, s->t[i].count * sizeof(float));
    return st;
}

/* A basis that failed stays as it was; one never made (the first step's) is the identity: Adam in the weights'
 * coordinates on that side. */
static void failed(dt_soap *s, const soap_tensor *x, long step) {
    dt_log(DT_LOG_WARN, "SOAP: step %ld: %s's basis (%d x %d) on rank %d: %s; it stays as it was", step + 1, s->tensors[x->tensor].name,
           x->rows, x->cols, s->rank, dt_last_error());
    for (int k = 0; k < 2; k++) {
        float *Q = k ? x->QR : x->QL;
        size_t d = (size_t)(k ? x->cols : x->rows), zeros = 0;
        while (Q && zeros < d * d && Q[zeros] == 0) zeros++;
        for (size_t i = 0; Q && zeros == d * d && i < d; i++) Q[i * d + i] = 1;
    }
}

dt_status dt_soap_step(dt_soap *s, float *grads, float lr, int *skip) {
    const dt_optim_config *c = &s->c;
    long step = s->steps++; /* the oracle's count; its first call only measures */
    bool first = step == 0;
    *skip = first ? 2 : 0;
    /* Adam's bias-corrected step, and the decay SGD's update then makes decoupled (soap.h) */
    float size = first ? 0 : sqrtf(1.0f - powf(c->beta2, (float)step)) / (1.0f - powf(c->beta1, (float)step)) * (1.0f - lr * c->weight_decay);
    for (int i = 0; i < s->n; i++) {
        soap_tensor *x = &s->t[i];
        if (x->owner >= 0 && x->owner != s->rank) continue; /* another rank's */
        float *G = grads + x->off, *D = s->work[3];
        if (!first) memcpy(D, direction(s, x, c, G, x->m, x->v), x->count * sizeof *D);
        if ((x->owner >= 0 || x->own) && measure(s, x, c, G, x->v, step, first)) failed(s, x, step);
        for (size_t k = 0; k < x->count && !first; k++) G[k] = size * D[k];
    }
    return s->ranks > 1 && !first ? exchange(s, grads) : DT_OK;
}

static void precond_begin(void *ctx, int accum, double loss_scale) { (void)ctx, (void)accum, (void)loss_scale; }
static dt_status precond_apply(void *ctx, float *grads, float lr, int *skip) { return dt_soap_step(ctx, grads, lr, skip); }

/* ---- its state in checkpoints: a unit a tensor (a rotated matrix's L, QL, then R, QR, of the sides it rotates, then
 * Adam's m and v; a vector's m and v), saved by its owner in the first group (a vector's by rank 0), loaded by its owner
 * in every group (a vector's by every rank); an expert-parallel rank's own expert a unit a global expert, saved by the
 * first data-parallel rank holding it (the expert-parallel group's are the first ranks), loaded by every rank holding
 * it; its count of steps beside ---- */

static size_t unit_floats(void *ctx, int u) {
    const dt_soap *s = ctx;
    const soap_tensor *t = &s->t[s->units[u].like];
    size_t f = 2 * t->count;
    if (t->owner < 0 && !t->own) return f;
    return f + (t->rows <= s->c.precond_max_dim ? 2 * (size_t)t->rows * t->rows : 0) +
           (t->cols <= s->c.precond_max_dim ? 2 * (size_t)t->cols * t->cols : 0);
}

static int unit_saver(void *ctx, int u) {
    const dt_soap *s = ctx;
    const soap_tensor *t = &s->t[s->units[u].like];
    return t->own ? s->units[u].holder : t->owner > 0 ? t->owner : 0;
}

static int unit_loads(void *ctx, int u, int rank) {
    const dt_soap *s = ctx;
    const soap_tensor *t = &s->t[s->units[u].like];
    if (t->own) return rank % (s->tensors[t->tensor].gshape[0] / s->tensors[t->tensor].shape[0]) == s->units[u].holder;
    return t->owner < 0 || rank % s->ranks == t->owner;
}

static void unit_io(void *ctx, int u, float *buf, int load) {
    dt_soap *s = ctx;
    if (s->units[u].span < 0) return; /* another rank's expert (never asked of this one) */
    soap_tensor *t = &s->t[s->units[u].span];
    float *part[6] = { t->L, t->QL, t->R, t->QR, t->m, t->v };
    size_t len[6] = { (size_t)t->rows * t->rows, (size_t)t->rows * t->rows, (size_t)t->cols * t->cols, (size_t)t->cols * t->cols, t->count,
                      t->count };
    for (int i = 0; i < 6; i++) {
        if (!part[i]) continue;
        memcpy(load ? part[i] : buf, load ? buf : part[i], len[i] * sizeof(float));
        buf += len[i];
    }
}

static long unit_steps(void *ctx) { return ((dt_soap *)ctx)->steps; }
static void unit_set_steps(void *ctx, long t) { ((dt_soap *)ctx)->steps = t; }

void dt_soap_preconditioner(dt_soap *s, dt_preconditioner *out) {
    *out = (dt_preconditioner){ "SOAP", precond_begin, precond_apply, s,
                                { "soap", s->nunits, unit_floats, unit_saver, unit_loads, unit_io, unit_steps, unit_set_steps, s, 0 }, NULL, 0, 1, 1, NULL };
}
