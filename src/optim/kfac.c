/* K-FAC over the model program's Linears, distributed as KAISA (kfac.h). */
#include "dtrain/kfac.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_PARTS DT_LINEAR_PARTS
#define IN_FLIGHT DT_KFAC_IN_FLIGHT

typedef struct {
    int out, col0;  /* the weight's rows; where they start among the Linear's output columns */
    size_t w, b;    /* store offsets of the weight [out, in] and its bias (SIZE_MAX: none) */
    float *G;       /* out x out, upper triangle (the Linear's worker only) */
} kfac_part;

/* One Linear op of one block: its parts share A. inv holds the decompositions (the ranks of its worker's column):
 * eigen: QA [n, n], dA [n], then each part's QG [out, out], dG [out]; inverse: A^-1, then each part's G^-1. */
typedef struct {
    int nparts, in, n, worker;
    bool holds_inv;
    float *A;            /* n x n, upper triangle (the worker only) */
    bool started;        /* A and the Gs have had their first update (they start at the identity) */
    int a_seen, g_seen;  /* micro-batches observed this step */
    float *inv;
    size_t inv_floats;
    kfac_part part[MAX_PARTS];
    const char *name;    /* its first weight's (messages) */
} kfac_op;

/* A micro-batch's factor on its way to its worker: added to F there once it lands (init: F starts at the identity). */
typedef struct {
    dt_request *req;
    const kfac_op *o;
    float *F, *pack;
    int n;
    bool first, init;
} kfac_flight;

struct dt_kfac {
    dt_kfac_config c;
    dt_model m;                 /* whose observer it is (m.self NULL: none, the planner's) */
    dt_comm *world, *col, *row; /* its own communicators (NULL: one process) */
    dt_comm *stages;            /* the pipeline's stages (the caller's; NULL: none): KL clipping and a skip span them */
    int rank, ranks, P;         /* P: the grid's columns (ranks / gradient workers) */
    kfac_op *ops;
    int nops, nblock, nkeys, *map; /* map[layer * nblock + op]: the kfac_op, or -1 */
    long steps;
    bool collect;               /* inside a step whose factors are updated */
    int accum;
    float g_unscale;            /* 1 / the step's loss scale^2: its output gradients carry the scale (fp16's) */
    bool scaled;                /* the step has a loss scale: a share that is not finite is its overflow's */
    float *cov, *t1, *t2;
    kfac_flight fly[IN_FLIGHT]; /* a ring of the reductions under way, the oldest at head (one process: fly[0]'s buffer packs) */
    int head, nfly;
    int nlayers;
    size_t nparams, most;       /* the state bytes of the rank holding most */
    double in_fwd, in_bwd;      /* seconds its observer took in forward and backward since the engine last asked */
};

void dt_kfac_defaults(dt_kfac_config *c) {
    *c = (dt_kfac_config){ .damping = 0.001f, .factor_decay = 0.95f, .kl_clip = 0.001f, .factor_every = 1, .inv_every = 1,
                           .workers = 1, .method = DT_KFAC_EIGEN };
}

dt_status dt_kfac_check(const dt_kfac_config *c, int ranks) {
    if (!(c->damping > 0)) return dt_error(DT_ERR_ARG, "--kfac-damping %g: K-FAC's damping must be above 0", (double)c->damping);
    if (!(c->factor_decay >= 0 && c->factor_decay < 1))
        return dt_error(DT_ERR_ARG, "--kfac-decay %g: the factors' running average needs a decay in [0, 1)", (double)c->factor_decay);
    if (!(c->kl_clip >= 0)) return dt_error(DT_ERR_ARG, "--kfac-kl-clip %g: 0 (off) or above", (double)c->kl_clip);
    if (c->factor_every < 1 || c->inv_every < 1)
        return dt_error(DT_ERR_ARG, "--kfac-factor-every %d, --kfac-inv-every %d: intervals of 1 step or more", c->factor_every, c->inv_every);
    if (!(c->workers > 0 && c->workers <= 1))
        return dt_error(DT_ERR_ARG, "--kfac-workers %g: a fraction of the ranks in (0, 1] (1: COMM-OPT, 1/ranks: MEM-OPT)", (double)c->workers);
    double gw = c->workers * ranks;
    int g = (int)lround(gw);
    if (g < 1) g = 1;
    if ((fabs(gw - g) > 1e-6 && gw >= 1) || ranks % g)
        return dt_error(DT_ERR_ARG, "--kfac-workers %g on %d ranks: %g gradient workers a Linear; a whole number that divides the ranks is needed",
                        (double)c->workers, ranks, gw);
    return DT_OK;
}

/* ---- the factors, as the observer shows each Linear's input and output gradient ---- */

static size_t tri(int n) { return (size_t)n * (size_t)(n + 1) / 2; }

/* cov's upper triangle [n, n] into packed, row by row. */
static void pack_upper(const float *cov, int n, float *packed) {
    size_t q = 0;
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) packed[q++] = cov[(size_t)i * n + j];
}

/* The worker's running average F [n, n] (upper) takes the micro-batch's share of the new factor, packed: on its first
 * share of a step F = decay F (init: the identity before, the factors' first step), then F += (1 - decay) /
 * (micro-batches x ranks) x the ranks' sum. Under a loss scale a share that is not finite (its overflow, whose step is
 * skipped) is left out: F keeps its average. */
static void add_share(const dt_kfac *k, float *F, int n, const float *packed, bool first, bool init) {
    float decay = k->c.factor_decay, c = (1.0f - decay) / (float)(k->accum * k->ranks);
    if (init)
        for (int i = 0; i < n; i++) F[(size_t)i * n + i] = 1.0f;
    for (size_t q = 0; q < tri(n) && k->scaled; q++)
        if (!isfinite(packed[q])) return;
    size_t q = 0;
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++, q++) {
            float *f = &F[(size_t)i * n + j];
            if (first) *f *= decay;
            *f += c * packed[q];
        }
}

/* The oldest reduction under way lands; its worker adds it to its factor. */
static dt_status land(dt_kfac *k) {
    kfac_flight *x = &k->fly[k->head];
    dt_status st = dt_wait(x->req);
    x->req = NULL;
    k->head = (k->head + 1) % IN_FLIGHT, k->nfly--;
    if (!st && k->rank == x->o->worker) add_share(k, x->F, x->n, x->pack, x->first, x->init);
    return st;
}

/* Every reduction under way landed (before the decompositions read the factors); the first failure. */
static dt_status land_all(dt_kfac *k) {
    dt_status st = DT_OK, one;
    while (k->nfly)
        if ((one = land(k)) && !st) st = one;
    return st;
}

/* The micro-batch's factor (cov, upper) summed over the ranks onto the worker, which adds it to F: a reduction that
 * runs on K-FAC's communicator while backward goes on (the oldest of IN_FLIGHT waited for when all are under way). */
static dt_status share(dt_kfac *k, const kfac_op *o, float *F, int n, bool first) {
    bool init = first && !o->started;
    if (!k->world) {
        pack_upper(k->cov, n, k->fly[0].pack); /* one process: the first flight's buffer, nothing under way */
        add_share(k, F, n, k->fly[0].pack, first, init);
        return DT_OK;
    }
    dt_status st = k->nfly == IN_FLIGHT ? land(k) : DT_OK;
    if (st) return st;
    kfac_flight *x = &k->fly[(k->head + k->nfly) % IN_FLIGHT];
    *x = (kfac_flight){ NULL, o, F, x->pack, n, first, init };
    pack_upper(k->cov, n, x->pack);
    if ((st = dt_comm_ireduce(k->world, x->pack, x->pack, tri(n), DT_F32, DT_SUM, o->worker, &x->req))) return st;
    k->nfly++;
    return DT_OK;
}

/* x's rows x width values (by_column: width x rows) added into cov [n, n] (upper) at alpha; beta 0 starts it. */
static void add_cov(const dt_linear_event *e, const float *x, int width, float alpha, float beta, float *cov, int n) {
    int rows = (int)e->rows;
    if (e->by_column) cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, width, rows, alpha, x, rows, beta, cov, n);
    else cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, width, rows, alpha, x, e->width, beta, cov, n);
}

/* A convolution's A: kfac-pytorch's patches divided by the positions (spatial) before their mean over every position of
 * every sample, 1 / spatial^2; the Fisher's, 1 / spatial (kfac.h's dt_kfac_scale). */
static float a_scale(const dt_kfac *k, const dt_linear_event *e) {
    float s = e->spatial > 1 ? (float)e->spatial : 1.0f;
    return k->c.scale == DT_KFAC_SCALE_FISHER ? 1.0f / s : 1.0f / (s * s);
}

static void scale_upper(float *cov, int n, float s) {
    for (int i = 0; i < n; i++)
        for (int j = i; j < n; j++) cov[(size_t)i * n + j] *= s;
}

/* The input's piece: A's share of the micro-batch, over its pieces (a bias's 1 appended: the inputs' means, and 1). */
static dt_status observe_input(dt_kfac *k, kfac_op *o, const dt_linear_event *e) {
    int n = o->n, in = o->in, rows = (int)e->rows;
    float all = (float)rows * (float)e->pieces;
    add_cov(e, e->values, in, 1.0f / all, e->piece ? 1.0f : 0.0f, k->cov, n);
    if (n > in) {
        if (!e->piece)
            for (int i = 0; i < in; i++) k->cov[(size_t)i * n + in] = 0;
        for (int i = 0; i < in; i++) {
            float *c = &k->cov[(size_t)i * n + in];
            for (int r = 0; r < rows; r++) *c += e->by_column ? e->values[(size_t)i * rows + r] : e->values[(size_t)r * in + i];
        }
    }
    if (e->piece + 1 < e->pieces) return DT_OK;
    if (n > in) {
        for (int i = 0; i < in; i++) k->cov[(size_t)i * n + in] /= all;
        k->cov[(size_t)in * n + in] = 1.0f;
    }
    if (e->spatial > 1) scale_upper(k->cov, n, a_scale(k, e));
    dt_status st = share(k, o, o->A, n, o->a_seen == 0);
    o->a_seen++;
    return st;
}

/* G's weight on this rank's rows (positions x samples). A rank's output gradients are the ranks' average's times the
 * ranks (each rank's loss is its share's mean): kfac-pytorch's G is the global batch's mean with 1 / ranks^2 (and a
 * convolution's 1 / spatial^2). The Fisher's takes each example's own gradient, the rank's times its samples
 * (rows x pieces / spatial) and the micro-batches (each's loss carries 1 / accum), and a convolution's times spatial:
 * (rows x pieces x accum)^2 over the mean's rows x pieces. Either way without the step's loss scale (squared). */
static float g_alpha(const dt_kfac *k, const dt_linear_event *e) {
    float rows = (float)e->rows * (float)e->pieces;
    if (k->c.scale == DT_KFAC_SCALE_FISHER) return rows * (float)k->accum * (float)k->accum * k->g_unscale;
    float s = e->spatial > 1 ? (float)e->spatial : 1.0f;
    return k->g_unscale / (s * s * rows * (float)k->ranks * (float)k->ranks);
}

/* A layer of several parts shows them in one piece (they share k->cov in turn). */
static dt_status observe_grad(dt_kfac *k, kfac_op *o, const dt_linear_event *e) {
    float alpha = g_alpha(k, e);
    dt_status st = DT_OK;
    for (int j = 0; j < o->nparts && !st; j++) {
        kfac_part *q = &o->part[j];
        const float *x = e->values + (e->by_column ? (size_t)q->col0 * e->rows : (size_t)q->col0);
        add_cov(e, x, q->out, alpha, e->piece ? 1.0f : 0.0f, k->cov, q->out);
        if (e->piece + 1 == e->pieces) st = share(k, o, q->G, q->out, o->g_seen == 0);
    }
    if (e->piece + 1 < e->pieces) return st;
    o->g_seen++;
    if (o->a_seen && o->g_seen) o->started = true;
    return st;
}

static void observer(void *ctx, const dt_linear_event *e) {
    dt_kfac *k = ctx;
    int i = e->layer * k->nblock + e->op;
    if (!k->collect || e->layer < 0 || i < 0 || i >= k->nkeys || k->map[i] < 0) return;
    kfac_op *o = &k->ops[k->map[i]];
    /* a collective failing here (a dead rank) is the step's: the strategy's own collectives name it */
    double t0 = dt_time_now();
    dt_status st = e->pieces > 1 && o->nparts > 1 ? dt_error(DT_ERR_ARG, "a layer of %d parts shown in %d pieces", o->nparts, e->pieces)
                   : e->backward ? observe_grad(k, o, e) : observe_input(k, o, e);
    *(e->backward ? &k->in_bwd : &k->in_fwd) += dt_time_now() - t0;
    if (st) dt_log(DT_LOG_ERROR, "K-FAC: %s's factors: %s", o->name, dt_last_error());
}

/* ---- the decompositions, on each Linear's worker ---- */

/* F [n, n] (upper) into out: eigen, out = Q [n, n] then the eigenvalues [n] (at least 0, as kfac-pytorch clamps them);
 * inverse, out = (F + damping I)^-1, whole. 0, or LAPACK's info. */
static int decompose(const dt_kfac *k, const float *F, int n, float *out) {
    for (int i = 0; i < n; i++)
        for (int j = 0; j < n; j++) out[(size_t)i * n + j] = j >= i ? F[(size_t)i * n + j] : F[(size_t)j * n + i];
    int info;
    if (k->c.method == DT_KFAC_EIGEN) {
        float *d = out + (size_t)n * n;
        info = LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'U', n, out, n, d);
        for (int i = 0; i < n && !info; i++) {
            if (!isfinite(d[i])) return -1;
            if (d[i] < 0) d[i] = 0;
        }
        return info;
    }
    for (int i = 0; i < n; i++) out[(size_t)i * n + i] += k->c.damping;
    if ((info = LAPACKE_spotrf(LAPACK_ROW_MAJOR, 'U', n, out, n)) || (info = LAPACKE_spotri(LAPACK_ROW_MAJOR, 'U', n, out, n))) return info;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < i; j++) out[(size_t)i * n + j] = out[(size_t)j * n + i];
    for (size_t i = 0; i < (size_t)n * n; i++)
        if (!isfinite(out[i])) return -1;
    return 0;
}

static size_t inv_block(const dt_kfac *k, int n) { return (size_t)n * n + (k->c.method == DT_KFAC_EIGEN ? (size_t)n : 0); }

/* This rank's Linears' decompositions; the first that failed (its index + 1), or 0. */
static int decompose_mine(dt_kfac *k, int *info) {
    for (int i = 0; i < k->nops; i++) {
        kfac_op *o = &k->ops[i];
        if (o->worker != k->rank) continue;
        float *at = o->inv;
        if ((*info = decompose(k, o->A, o->n, at))) return i + 1;
        at += inv_block(k, o->n);
        for (int j = 0; j < o->nparts; j++) {
            if ((*info = decompose(k, o->part[j].G, o->part[j].out, at))) return i + 1;
            at += inv_block(k, o->part[j].out);
        }
    }
    return 0;
}

/* Every rank learns whether a decomposition failed (then names it and the step) and gets the decompositions its
 * column's workers made. */
static dt_status decompositions(dt_kfac *k, int *skip) {
    int info = 0;
    float failed = (float)decompose_mine(k, &info), elsewhere = 0;
    dt_status st = k->world ? dt_comm_allreduce(k->world, &failed, &failed, 1, DT_F32, DT_MAX) : DT_OK;
    /* another stage's failure skips this stage's step too (its Linears' indices are its own: only whether) */
    if (!st && k->stages) st = dt_comm_allreduce(k->stages, &failed, &elsewhere, 1, DT_F32, DT_MAX);
    if (st) return st;
    if (failed > 0) {
        const kfac_op *o = &k->ops[(int)failed - 1];
        char why[48] = "";
        if (o->worker == k->rank) snprintf(why, sizeof why, info < 0 ? " (not finite)" : " (LAPACK's info %d)", info);
        dt_log(DT_LOG_WARN, "K-FAC: step %ld: the decomposition of %s's factors failed on rank %d%s: the step is skipped on every rank",
               k->steps + 1, o->name, o->worker, why);
    }
    if (failed > 0 || elsewhere > 0) {
        *skip = 1;
        return DT_OK;
    }
    for (int i = 0; i < k->nops && k->col && !st; i++) {
        kfac_op *o = &k->ops[i];
        if (o->holds_inv) st = dt_comm_broadcast(k->col, o->inv, o->inv_floats, DT_F32, o->worker / k->P);
    }
    return st;
}

/* ---- preconditioning ---- */

/* Part j's gradient [out, n] (its bias as the last column) into g. */
static void gather_grad(const kfac_op *o, const kfac_part *q, const float *grads, float *g) {
    for (int i = 0; i < q->out; i++) {
        memcpy(g + (size_t)i * o->n, grads + q->w + (size_t)i * o->in, (size_t)o->in * sizeof *g);
        if (o->n > o->in) g[(size_t)i * o->n + o->in] = grads[q->b + i];
    }
}

/* Part j's preconditioned gradient into k->t1: eigen, QG ((QG^T g QA) / (dG dA^T + damping)) QA^T; inverse,
 * G^-1 g A^-1. */
static void precondition(dt_kfac *k, const kfac_op *o, int j, const float *grads) {
    const kfac_part *q = &o->part[j];
    int n = o->n, m = q->out;
    const float *A = o->inv, *G = o->inv + inv_block(k, n);
    for (int i = 0; i < j; i++) G += inv_block(k, o->part[i].out);
    float *t1 = k->t1, *t2 = k->t2;
    gather_grad(o, q, grads, t1);
    CBLAS_TRANSPOSE first = k->c.method == DT_KFAC_EIGEN ? CblasTrans : CblasNoTrans;
    cblas_sgemm(CblasRowMajor, first, CblasNoTrans, m, n, m, 1.0f, G, m, t1, n, 0.0f, t2, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, n, 1.0f, t2, n, A, n, 0.0f, t1, n);
    if (k->c.method != DT_KFAC_EIGEN) return;
    const float *dA = A + (size_t)n * n, *dG = G + (size_t)m * m;
    for (int a = 0; a < m; a++)
        for (int b = 0; b < n; b++) t1[(size_t)a * n + b] *= 1.0f / (dG[a] * dA[b] + k->c.damping);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, n, m, 1.0f, G, m, t1, n, 0.0f, t2, n);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, n, 1.0f, t2, n, A, n, 0.0f, t1, n);
}

/* Part j's preconditioned gradient (k->t1) in place of its gradient; returns sum(v . g) over it. */
static double put_back(const kfac_op *o, const kfac_part *q, const float *v, float *grads) {
    double vg = 0;
    for (int i = 0; i < q->out; i++) {
        float *w = grads + q->w + (size_t)i * o->in;
        const float *vi = v + (size_t)i * o->n;
        for (int c = 0; c < o->in; c++) vg += (double)vi[c] * w[c], w[c] = vi[c];
        if (o->n > o->in) vg += (double)vi[o->in] * grads[q->b + i], grads[q->b + i] = vi[o->in];
    }
    return vg;
}

static void scale_all(dt_kfac *k, float *grads, float nu) {
    for (int i = 0; i < k->nops; i++) {
        const kfac_op *o = &k->ops[i];
        for (int j = 0; j < o->nparts; j++) {
            const kfac_part *q = &o->part[j];
            dt_grad_scale(grads + q->w, (size_t)q->out * o->in, nu);
            if (o->n > o->in) dt_grad_scale(grads + q->b, (size_t)q->out, nu);
        }
    }
}

static void end_step(dt_kfac *k, bool counted) {
    for (int i = 0; i < k->nops; i++) k->ops[i].a_seen = k->ops[i].g_seen = 0;
    k->steps += counted;
    k->collect = false;
}

dt_status dt_kfac_step(dt_kfac *k, float *grads, float lr, int *skip) {
    *skip = 0;
    dt_status st = land_all(k);
    if (!st && k->steps % k->c.inv_every == 0) st = decompositions(k, skip);
    if (st) return st;
    if (*skip) {
        end_step(k, true);
        return DT_OK;
    }
    double vg = 0;
    for (int i = 0; i < k->nops && !st; i++) {
        const kfac_op *o = &k->ops[i];
        for (int j = 0; j < o->nparts && !st; j++) {
            if (o->holds_inv) precondition(k, o, j, grads);
            /* from the worker of this row's column */
            if (k->row) st = dt_comm_broadcast(k->row, k->t1, (size_t)o->part[j].out * o->n, DT_F32, o->worker % k->P);
            if (!st) vg += put_back(o, &o->part[j], k->t1, grads) * (double)lr * (double)lr;
        }
    }
    /* KL clipping's sum is over every preconditioned Linear: the other stages' too */
    if (!st && k->stages && k->c.kl_clip > 0) st = dt_comm_allreduce(k->stages, &vg, &vg, 1, DT_F64, DT_SUM);
    if (!st && k->c.kl_clip > 0 && vg != 0) {
        double nu = sqrt(k->c.kl_clip / fabs(vg));
        if (nu < 1) scale_all(k, grads, (float)nu);
    }
    end_step(k, true);
    return st;
}

void dt_kfac_begin(dt_kfac *k, int accum, double loss_scale) {
    k->accum = accum > 0 ? accum : 1;
    k->scaled = loss_scale > 0;
    k->g_unscale = k->scaled ? (float)(1.0 / (loss_scale * loss_scale)) : 1.0f;
    k->collect = k->steps % k->c.factor_every == 0;
}

/* The factors' finite shares stay (a batch's true curvature: the overflow was the scale's), the rest were left out. */
dt_status dt_kfac_drop(dt_kfac *k) {
    dt_status st = land_all(k);
    end_step(k, false);
    return st;
}

/* ---- making it ---- */

/* The model's Linears (and convolutions) as kfac_ops, their parts' places in the store, and the map from their keys. */
static dt_status find_linears(dt_kfac *k, const dt_linear_layer *y, int n) {
    k->nblock = 1;
    int layers = 1;
    for (int i = 0; i < n; i++) {
        if (y[i].op >= k->nblock) k->nblock = y[i].op + 1;
        if (y[i].layer >= layers) layers = y[i].layer + 1;
    }
    k->nkeys = layers * k->nblock;
    if (!(k->map = malloc(sizeof *k->map * (size_t)k->nkeys)) || !(k->ops = calloc((size_t)n + 1, sizeof *k->ops)))
        return dt_error(DT_ERR_NOMEM, "K-FAC: out of memory");
    for (int i = 0; i < k->nkeys; i++) k->map[i] = -1;
    for (int i = 0; i < n; i++) {
        if (y[i].nparts < 1 || y[i].nparts > MAX_PARTS || y[i].layer < 0 || y[i].op < 0)
            return dt_error(DT_ERR_ARG, "K-FAC: a layer of %d parts (at most %d)", y[i].nparts, MAX_PARTS);
        kfac_op *o = &k->ops[k->nops];
        *o = (kfac_op){ .nparts = y[i].nparts, .in = y[i].in, .n = y[i].in + (y[i].b[0] != NULL), .name = y[i].w[0]->name };
        int col = 0;
        for (int j = 0; j < o->nparts; j++) {
            const dt_tensor_info *w = y[i].w[j], *b = y[i].b[j];
            if (w->count != (size_t)w->shape[0] * (size_t)o->in || (b != NULL) != (o->n > o->in) || (b && b->count != (size_t)w->shape[0]))
                return dt_error(DT_ERR_ARG, "K-FAC: %s is not held whole on this rank (%zu values for %d outputs of %d inputs)", w->name,
                                w->count, w->shape[0], o->in);
            o->part[j] = (kfac_part){ .out = w->shape[0], .col0 = col, .w = w->offset, .b = b ? b->offset : SIZE_MAX };
            col += w->shape[0];
            k->nparams += w->count + (b ? b->count : 0);
        }
        k->map[y[i].layer * k->nblock + y[i].op] = k->nops++;
        k->nlayers += o->nparts;
    }
    return DT_OK;
}

/* The model's list of Linears, into k. */
static dt_status take_linears(dt_kfac *k, const dt_model *m) {
    if (!m->linears || !m->set_linear_observer) return dt_error(DT_ERR_UNSUPPORTED, "K-FAC: the %s model does not show its Linears", m->kind);
    dt_linear_layer *y = NULL;
    int n = 0;
    dt_status st = m->linears(m->self, &y, &n);
    if (!st) st = find_linears(k, y, n);
    free(y);
    return st;
}

/* KAISA's assignment by the decompositions' cost (n^3 a factor): each Linear's worker, whether this rank holds its
 * decompositions, their size. */
static dt_status assign(dt_kfac *k) {
    double *cost = malloc(sizeof *cost * (size_t)(k->nops + 1));
    int *worker = malloc(sizeof *worker * (size_t)(k->nops + 1));
    if (!cost || !worker) {
        free(cost), free(worker);
        return dt_error(DT_ERR_NOMEM, "K-FAC: out of memory");
    }
    for (int i = 0; i < k->nops; i++) {
        kfac_op *o = &k->ops[i];
        cost[i] = pow(o->n, 3);
        for (int j = 0; j < o->nparts; j++) cost[i] += pow(o->part[j].out, 3);
    }
    dt_kfac_assign(cost, k->nops, k->ranks, k->ranks / k->P, worker);
    for (int i = 0; i < k->nops; i++) {
        kfac_op *o = &k->ops[i];
        o->worker = worker[i];
        o->holds_inv = o->worker % k->P == k->rank % k->P;
        o->inv_floats = inv_block(k, o->n);
        for (int j = 0; j < o->nparts; j++) o->inv_floats += inv_block(k, o->part[j].out);
    }
    free(cost), free(worker);
    return DT_OK;
}

/* This rank's buffers: the scratch, its decompositions, its Linears' factors. */
static dt_status place(dt_kfac *k) {
    dt_status st = assign(k);
    if (st) return st;
    size_t big = 1, wide = 1;
    for (int i = 0; i < k->nops; i++) {
        const kfac_op *o = &k->ops[i];
        big = (size_t)o->n * o->n > big ? (size_t)o->n * o->n : big;
        for (int j = 0; j < o->nparts; j++) {
            size_t m = (size_t)o->part[j].out;
            big = m * m > big ? m * m : big;
            wide = m * o->n > wide ? m * o->n : wide;
        }
    }
    bool ok = (k->cov = malloc(big * sizeof(float))) && (k->t1 = malloc(wide * sizeof(float))) && (k->t2 = malloc(wide * sizeof(float)));
    for (int i = 0; i < (k->ranks > 1 ? IN_FLIGHT : 1) && ok; i++) ok = (k->fly[i].pack = malloc(big * sizeof(float))) != NULL;
    for (int i = 0; i < k->nops && ok; i++) {
        kfac_op *o = &k->ops[i];
        if (o->holds_inv) ok = (o->inv = calloc(o->inv_floats, sizeof(float))) != NULL;
        if (o->worker != k->rank) continue;
        ok = ok && (o->A = calloc((size_t)o->n * o->n, sizeof(float)));
        for (int j = 0; j < o->nparts && ok; j++) ok = (o->part[j].G = calloc((size_t)o->part[j].out * o->part[j].out, sizeof(float))) != NULL;
    }
    return ok ? DT_OK : dt_error(DT_ERR_NOMEM, "K-FAC: out of memory for the factors");
}

/* Its own communicators: the world (its collectives run inside forward and backward, beside the strategy's), the
 * grid's columns (the decompositions) and rows (the preconditioned gradients), each only where it has 2 ranks or more. */
static dt_status communicators(dt_kfac *k, dt_comm *comm) {
    int r = dt_comm_rank(comm);
    dt_status st = dt_comm_split(comm, 0, r, &k->world);
    dt_comm *col = NULL, *row = NULL;
    if (!st) st = dt_comm_split(k->world, r % k->P, r, &col);
    if (!st) st = dt_comm_split(k->world, r / k->P, r, &row);
    if (col && dt_comm_size(col) > 1) k->col = col;
    else if (col) dt_comm_destroy(col);
    if (row && dt_comm_size(row) > 1) k->row = row;
    else if (row) dt_comm_destroy(row);
    return st;
}

dt_status dt_kfac_create(const dt_kfac_config *c, const dt_model *m, dt_comm *comm, dt_kfac **out) {
    *out = NULL;
    int ranks = comm ? dt_comm_size(comm) : 1;
    dt_status st = dt_kfac_check(c, ranks);
    if (st) return st;
    dt_kfac *k = calloc(1, sizeof *k);
    if (!k) return dt_error(DT_ERR_NOMEM, "K-FAC: out of memory");
    int gw = (int)lround(c->workers * ranks);
    *k = (dt_kfac){ .c = *c, .ranks = ranks, .P = ranks / (gw < 1 ? 1 : gw), .rank = comm ? dt_comm_rank(comm) : 0, .accum = 1,
                    .g_unscale = 1 };
    if (ranks > 1) st = communicators(k, comm);
    if (!st) st = take_linears(k, m);
    if (!st) st = place(k);
    double most = (double)(st ? 0 : dt_kfac_state_bytes(k));
    if (!st && k->world) st = dt_comm_allreduce(k->world, &most, &most, 1, DT_F64, DT_MAX);
    if (st) {
        dt_kfac_destroy(k);
        return st;
    }
    k->most = (size_t)most;
    k->m = *m;
    m->set_linear_observer(m->self, observer, k);
    *out = k;
    return DT_OK;
}

dt_status dt_kfac_plan(const dt_kfac_config *c, const dt_linear_layer *layers, int nlayers, int ranks, dt_kfac_linear **out, int *n,
                       int *columns) {
    *out = NULL, *n = 0;
    dt_status st = dt_kfac_check(c, ranks);
    if (st) return st;
    int gw = (int)lround(c->workers * ranks);
    dt_kfac k = { .c = *c, .ranks = ranks, .P = ranks / (gw < 1 ? 1 : gw), .accum = 1 };
    if (!(st = find_linears(&k, layers, nlayers)) && !(st = assign(&k))) {
        *out = calloc((size_t)k.nops + 1, sizeof **out);
        if (!*out) st = dt_error(DT_ERR_NOMEM, "K-FAC: out of memory");
    }
    for (int i = 0; !st && i < k.nops; i++) {
        const kfac_op *o = &k.ops[i];
        dt_kfac_linear *l = &(*out)[i];
        *l = (dt_kfac_linear){ .n = o->n, .nparts = o->nparts, .worker = o->worker, .inv_floats = o->inv_floats };
        for (int j = 0; j < o->nparts; j++) l->out[j] = o->part[j].out;
    }
    if (!st) *n = k.nops, *columns = k.P;
    free(k.ops), free(k.map);
    return st;
}

void dt_kfac_destroy(dt_kfac *k) {
    if (!k) return;
    if (k->m.set_linear_observer) k->m.set_linear_observer(k->m.self, NULL, NULL);
    land_all(k); /* nothing may still write the buffers (a step that failed left them under way) */
    for (int i = 0; i < IN_FLIGHT; i++) free(k->fly[i].pack);
    for (int i = 0; i < k->nops; i++) {
        free(k->ops[i].A);
        free(k->ops[i].inv);
        for (int j = 0; j < k->ops[i].nparts; j++) free(k->ops[i].part[j].G);
    }
    free(k->ops);
    free(k->map);
    free(k->cov), free(k->t1), free(k->t2);
    if (k->row) dt_comm_destroy(k->row);
    if (k->col) dt_comm_destroy(k->col);
    if (k->world) dt_comm_destroy(k->world);
    free(k);
}

static void precond_begin(void *ctx, int accum, double loss_scale) { dt_kfac_begin(ctx, accum, loss_scale); }
static dt_status precond_drop(void *ctx) { return dt_kfac_drop(ctx); }
static dt_status precond_apply(void *ctx, float *grads, float lr, int *skip) { return dt_kfac_step(ctx, grads, lr, skip); }
static void precond_inside(void *ctx, double *fwd, double *bwd) {
    dt_kfac *k = ctx;
    *fwd = k->in_fwd, *bwd = k->in_bwd;
    k->in_fwd = k->in_bwd = 0;
}

/* ---- its state in checkpoints: a unit a Linear (whether its factors have started, A, each part's G, then its
 * decompositions), saved by its worker, loaded by the ranks of its worker's column (the factors by the worker alone) ---- */

static size_t unit_floats(void *ctx, int u) {
    const kfac_op *o = &((dt_kfac *)ctx)->ops[u];
    size_t f = 1 + (size_t)o->n * o->n + o->inv_floats;
    for (int j = 0; j < o->nparts; j++) f += (size_t)o->part[j].out * o->part[j].out;
    return f;
}

static int unit_saver(void *ctx, int u) { return ((dt_kfac *)ctx)->ops[u].worker; }
static int unit_loads(void *ctx, int u, int rank) {
    dt_kfac *k = ctx;
    return k->ops[u].worker % k->P == rank % k->P;
}

static void move(float *x, float *buf, size_t n, int load) { memcpy(load ? x : buf, load ? buf : x, n * sizeof(float)); }

static void unit_io(void *ctx, int u, float *buf, int load) {
    dt_kfac *k = ctx;
    kfac_op *o = &k->ops[u];
    bool factors = o->worker == k->rank;
    if (!load) buf[0] = o->started;
    else if (factors) o->started = buf[0] != 0;
    buf++;
    if (factors) move(o->A, buf, (size_t)o->n * o->n, load);
    buf += (size_t)o->n * o->n;
    for (int j = 0; j < o->nparts; buf += (size_t)o->part[j].out * o->part[j].out, j++)
        if (factors) move(o->part[j].G, buf, (size_t)o->part[j].out * o->part[j].out, load);
    if (o->holds_inv) move(o->inv, buf, o->inv_floats, load);
}

static long unit_steps(void *ctx) { return ((dt_kfac *)ctx)->steps; }
static void unit_set_steps(void *ctx, long t) { ((dt_kfac *)ctx)->steps = t; }

void dt_kfac_preconditioner(dt_kfac *k, dt_preconditioner *out) {
    *out = (dt_preconditioner){ "K-FAC", precond_begin, precond_apply, k,
                                { "kfac", k->nops, unit_floats, unit_saver, unit_loads, unit_io, unit_steps, unit_set_steps, k, 0 },
                                precond_inside, 0, 0, 1, precond_drop };
}

void dt_kfac_set_stages(dt_kfac *k, dt_comm *stages) { k->stages = stages && dt_comm_size(stages) > 1 ? stages : NULL; }

int dt_kfac_layers(const dt_kfac *k) { return k->nlayers; }
size_t dt_kfac_params(const dt_kfac *k) { return k->nparams; }
size_t dt_kfac_state_bytes_most(const dt_kfac *k) { return k->most; }
const char *dt_kfac_layout(const dt_kfac *k) { return k->P == 1 ? "COMM-OPT" : k->P == k->ranks ? "MEM-OPT" : "HYBRID"; }

size_t dt_kfac_state_bytes(const dt_kfac *k) {
    size_t b = 0;
    for (int i = 0; i < k->nops; i++) {
        const kfac_op *o = &k->ops[i];
        if (o->holds_inv) b += o->inv_floats * sizeof(float);
        if (o->worker != k->rank) continue;
        b += (size_t)o->n * o->n * sizeof(float);
        for (int j = 0; j < o->nparts; j++) b += (size_t)o->part[j].out * o->part[j].out * sizeof(float);
    }
    return b;
}
