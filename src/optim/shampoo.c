/* Shampoo (shampoo.h): each rank's blocks' factors, inverse roots and moments, their search directions, and the
 * allgather that gives every rank all of them. */
#include "shampoo_blocks.h"

#include "dtrain/shampoo.h"
#include "optim_internal.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    float *F[4], *R[4]; /* a dimension's factor and its inverse root, dim x dim */
    float *m, *v;       /* the filtered gradient (NULL at beta1 0), grafting's second moment */
} sh_state;

/* A unit of its checkpointed state: the block this rank holds (-1: none), one of the same shape, and for an
 * expert-parallel rank's own expert's block the expert-parallel rank holding it (-1: not one) */
typedef struct { int block, like, holder; } sh_unit;

struct dt_shampoo {
    dt_shampoo_config c;
    const dt_tensor_info *tensors; /* for the names in warnings: the model's table, which outlives it */
    sh_block *b;
    sh_state *q; /* a block's state: empty where another rank owns it */
    int nb, rank, ranks;
    dt_comm *comm;                   /* the group's ranks (NULL: this one alone) */
    bool own_comm;                   /* split from the caller's */
    size_t *counts, share, mine;     /* floats of directions a rank computes; a rank's share of the gathered ones
                                      * (the largest count); where this rank's starts */
    size_t own;                      /* floats of this rank's own experts' directions (made here, never sent) */
    float *ownbuf;                   /* their slots */
    sh_unit *units;                  /* the checkpoint's (make_units) */
    int nunits;
    float *send, *recv;              /* this rank's directions; everyone's (one process: the same) */
    uint16_t *send16, *recv16;       /* the bf16 wire's */
    float *work[3], *eig;            /* blocks' scratch; a factor's and its eigenvalues' */
    double *eig64;                   /* the f64 retry's */
    size_t bytes, most;
    long t;
};

void dt_shampoo_defaults(dt_shampoo_config *c) {
    *c = (dt_shampoo_config){ .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-12f, .graft_eps = 1e-8f, .block = 1024, .every = 10,
                              .start = 0, .wire = DT_F32 };
}

dt_status dt_shampoo_check(const dt_shampoo_config *c) {
    if (!(c->beta1 >= 0 && c->beta1 < 1) || !(c->beta2 > 0 && c->beta2 < 1))
        return dt_error(DT_ERR_ARG, "Shampoo: --betas %g,%g: beta1 in [0, 1), beta2 in (0, 1)", c->beta1, c->beta2);
    if (!(c->eps > 0)) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-eps %g must be above 0", c->eps);
    if (!(c->graft_eps > 0)) return dt_error(DT_ERR_ARG, "Shampoo: --eps %g (grafting's) must be above 0", c->graft_eps);
    if (c->block < 1) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-block %d must be 1 or more", c->block);
    if (c->every < 1) return dt_error(DT_ERR_ARG, "Shampoo: --precondition-every %d must be 1 or more", c->every);
    if (c->start < 0) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-start %d must be 1 or more (0: --precondition-every)", c->start);
    if (c->wire != DT_F32 && c->wire != DT_BF16) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-wire: fp32 or bf16");
    if (c->group < 0) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-group %d must be 1 or more (0: every rank)", c->group);
    return DT_OK;
}

void dt_shampoo_destroy(dt_shampoo *s) {
    if (!s) return;
    for (int i = 0; s->q && i < s->nb; i++) {
        for (int k = 0; k < 4; k++) free(s->q[i].F[k]), free(s->q[i].R[k]);
        free(s->q[i].m), free(s->q[i].v);
    }
    for (int k = 0; k < 3; k++) free(s->work[k]);
    if (s->comm) dt_comm_free(s->comm, s->send), dt_comm_free(s->comm, s->recv), dt_comm_free(s->comm, s->send16), dt_comm_free(s->comm, s->recv16);
    else free(s->send);
    if (s->own_comm) dt_comm_destroy(s->comm);
    free(s->eig), free(s->eig64);
    free(s->q), free(s->b), free(s->counts), free(s->ownbuf), free(s->units);
    free(s);
}

static size_t state_floats(const sh_block *b, const dt_shampoo_config *c) {
    size_t f = b->numel * (c->beta1 > 0 ? 2 : 1);
    for (int k = 0; k < b->ndim; k++) f += 2 * (size_t)b->dim[k] * b->dim[k];
    return f;
}

/* This rank's blocks' state (a root starts as the identity, as the oracle's), the scratch, the wire's buffers. */
static int allocate(dt_shampoo *s) {
    size_t big = 1, side = 1;
    for (int i = 0; i < s->nb; i++) {
        sh_block *b = &s->b[i];
        big = b->numel > big ? b->numel : big;
        for (int k = 0; k < b->ndim; k++) side = (size_t)b->dim[k] > side ? (size_t)b->dim[k] : side;
        if (b->owner != s->rank && !b->own) continue;
        sh_state *q = &s->q[i];
        if (!(q->v = calloc(b->numel, sizeof(float))) || (s->c.beta1 > 0 && !(q->m = calloc(b->numel, sizeof(float))))) return -1;
        for (int k = 0; k < b->ndim; k++) {
            size_t d = (size_t)b->dim[k];
            if (!(q->F[k] = calloc(d * d, sizeof(float))) || !(q->R[k] = calloc(d * d, sizeof(float)))) return -1;
            for (size_t j = 0; j < d; j++) q->R[k][j * d + j] = 1;
        }
    }
    for (int k = 0; k < 3; k++)
        if (!(s->work[k] = malloc((big > side * side ? big : side * side) * sizeof(float)))) return -1;
    if (!(s->eig = malloc((side * side + side) * sizeof(float))) || !(s->eig64 = malloc((side * side + side) * sizeof(double)))) return -1;
    if (!(s->ownbuf = malloc((s->own + 1) * sizeof(float)))) return -1;
    size_t all = s->share * (size_t)s->ranks; /* a share's tail past a rank's count stays 0 */
    if (!s->comm) return (s->recv = s->send = calloc(s->share + 1, sizeof(float))) ? 0 : -1;
    /* in the shared arena (zeroed): the peers on this machine read a share where it lies, one copy instead of two */
    if (dt_comm_alloc(s->comm, (s->share + 1) * sizeof(float), (void **)&s->send) ||
        dt_comm_alloc(s->comm, (all + 1) * sizeof(float), (void **)&s->recv))
        return -1;
    if (s->c.wire == DT_BF16)
        if (dt_comm_alloc(s->comm, (s->share + 1) * 2, (void **)&s->send16) || dt_comm_alloc(s->comm, (all + 1) * 2, (void **)&s->recv16))
            return -1;
    return 0;
}

/* The checkpoint's units: a block's own, but an expert-parallel rank's experts' blocks one a global expert's block
 * (expert by expert, each expert's k blocks in order), so that another expert-parallel layout (or one process) finds
 * each where it holds it. */
static int make_units(dt_shampoo *s) {
    int nu = 0;
    for (int i = 0; i < s->nb; i++)
        nu += !s->b[i].own ? 1 : i == 0 || s->b[i - 1].tensor != s->b[i].tensor ? s->b[i].of / s->tensors[s->b[i].tensor].shape[0] *
                                                                                   s->tensors[s->b[i].tensor].gshape[0] : 0;
    if (!(s->units = calloc((size_t)nu + 1, sizeof *s->units))) return -1;
    for (int i = 0; i < s->nb; i++) {
        if (!s->b[i].own) s->units[s->nunits++] = (sh_unit){ i, i, -1 };
        if (!s->b[i].own || (i > 0 && s->b[i - 1].tensor == s->b[i].tensor)) continue;
        const dt_tensor_info *x = &s->tensors[s->b[i].tensor];
        int El = x->shape[0], e0 = x->slice.offset, k = s->b[i].of / El; /* this rank's experts [e0, e0 + El), k blocks each */
        for (int g = 0; g < x->gshape[0]; g++)
            for (int j = 0; j < k; j++)
                s->units[s->nunits++] = (sh_unit){ g >= e0 && g < e0 + El ? i + (g - e0) * k + j : -1, i + j, g / El };
    }
    return 0;
}

dt_status dt_shampoo_create(const dt_shampoo_config *c, const dt_tensor_info *tensors, int n, dt_comm *comm, dt_shampoo **out) {
    *out = NULL;
    dt_status st = dt_shampoo_check(c);
    if (st) return st;
    dt_shampoo *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "Shampoo: out of memory");
    s->c = *c;
    if (!s->c.start) s->c.start = c->every;
    s->tensors = tensors;
    if ((st = dt_optim_work_group(comm, c->group, "Shampoo", "--shampoo-group", &s->comm, &s->own_comm))) {
        free(s);
        return st;
    }
    s->rank = s->comm ? dt_comm_rank(s->comm) : 0;
    s->ranks = s->comm ? dt_comm_size(s->comm) : 1;
    bool ok = !sh_blocks_make(tensors, n, c->block, &s->b, &s->nb) && (s->counts = calloc((size_t)s->ranks, sizeof *s->counts)) &&
              (s->q = calloc((size_t)s->nb + 1, sizeof *s->q));
    if (ok) {
        s->share = sh_blocks_assign(s->b, s->nb, s->ranks, s->counts, &s->own);
        s->mine = (size_t)s->rank * s->share;
        ok = !allocate(s) && !make_units(s);
    }
    if (!ok) {
        dt_shampoo_destroy(s);
        return dt_error(DT_ERR_NOMEM, "Shampoo: out of memory for its blocks' state");
    }
    size_t *per = calloc((size_t)s->ranks, sizeof *per);
    for (int i = 0; i < s->nb && per; i++) /* an own expert's block on every rank (each its own) */
        for (int r = 0; r < s->ranks; r++) per[r] += s->b[i].owner == r || s->b[i].own ? state_floats(&s->b[i], c) * sizeof(float) : 0;
    for (int r = 0; r < s->ranks && per; r++) s->most = per[r] > s->most ? per[r] : s->most;
    s->bytes = per ? per[s->rank] : 0;
    free(per);
    *out = s;
    return DT_OK;
}

dt_status dt_shampoo_plan(const dt_shampoo_config *c, const dt_tensor_info *tensors, int n, int ranks, dt_shampoo_block **out, int *nb) {
    *out = NULL, *nb = 0;
    dt_status st = dt_shampoo_check(c);
    if (st) return st;
    int g = c->group ? c->group : ranks;
    if (g < 1 || ranks % g) return dt_error(DT_ERR_ARG, "Shampoo: --shampoo-group %d does not divide the %d data-parallel ranks", g, ranks);
    sh_block *b = NULL;
    size_t *counts = calloc((size_t)g, sizeof *counts);
    int k = 0;
    if (!counts || sh_blocks_make(tensors, n, c->block, &b, &k) || !(*out = calloc((size_t)k + 1, sizeof **out))) {
        free(counts), free(b);
        return dt_error(DT_ERR_NOMEM, "Shampoo: out of memory");
    }
    size_t own;
    sh_blocks_assign(b, k, g, counts, &own);
    for (int i = 0; i < k; i++) {
        dt_shampoo_block *o = &(*out)[i];
        *o = (dt_shampoo_block){ .ndim = b[i].ndim, .numel = b[i].numel, .owner = b[i].owner, .state_floats = state_floats(&b[i], c) };
        memcpy(o->dim, b[i].dim, sizeof o->dim);
    }
    *nb = k;
    free(counts), free(b);
    return DT_OK;
}

/* x [d, rest] (contiguous) into y [rest, d]. */
static void transpose(const float *x, int d, size_t rest, float *y) {
    for (int i = 0; i < d; i++)
        for (size_t j = 0; j < rest; j++) y[j * d + i] = x[(size_t)i * rest + j];
}

/* F_k = beta2 F_k + (1 - beta2) g_(k) g_(k)^T for each dimension k, the upper triangle only (syrk: half a GEMM's
 * work; the eigen-decomposition reads no more): g's mode-k unfolding is g with its dimensions turned k times to the
 * left (a transpose each), whose contraction over the rest does not depend on their order. */
static void update_factors(dt_shampoo *s, const sh_block *b, sh_state *q, const float *g) {
    const float *x = g;
    float *turned[2] = { s->work[1], s->work[2] };
    for (int k = 0; k < b->ndim; k++) {
        int d = b->dim[k];
        size_t rest = b->numel / (size_t)d;
        if (k > 0 && k == b->ndim - 1) /* the last dimension's unfolding is g's own transpose: no turn */
            cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, d, (int)rest, 1.0f - s->c.beta2, g, d, s->c.beta2, q->F[k], d);
        else
            cblas_ssyrk(CblasRowMajor, CblasUpper, CblasNoTrans, d, (int)rest, 1.0f - s->c.beta2, x, (int)rest, s->c.beta2, q->F[k], d);
        if (k + 2 < b->ndim) transpose(x, d, rest, turned[k & 1]), x = turned[k & 1];
    }
}

static bool finite_all(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return true;
}

/* R = (F / bc2 + eps I)^(-1/root) by the eigen-decomposition (f32, retried in f64), the eigenvalues lifted to eps where
 * below it. 0, LAPACK's info, or -1 (not finite). R is left as it was unless it succeeds. */
static int inverse_root(dt_shampoo *s, const float *F, int d, float bc2, int root, float *R) {
    float *a = s->eig, *w = a + (size_t)d * d, *scaled = s->work[1], *out = s->work[2];
    size_t dd = (size_t)d * d;
    for (int i = 0; i < d; i++) /* the upper triangle, mirrored */
        for (int j = i; j < d; j++) a[(size_t)i * d + j] = a[(size_t)j * d + i] = F[(size_t)i * d + j] / bc2;
    for (int i = 0; i < d; i++) a[(size_t)i * d + i] += s->c.eps;
    if (!finite_all(a, dd)) return -1;
    memcpy(out, a, dd * sizeof *a);
    int info = LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'U', d, a, d, w);
    if (info) {
        double *a64 = s->eig64, *w64 = a64 + dd;
        for (size_t i = 0; i < dd; i++) a64[i] = out[i];
        if ((info = LAPACKE_dsyevd(LAPACK_ROW_MAJOR, 'V', 'U', d, a64, d, w64))) return info;
        for (size_t i = 0; i < dd; i++) a[i] = (float)a64[i];
        for (int i = 0; i < d; i++) w[i] = (float)w64[i];
    }
    float lo = w[0];
    for (int i = 1; i < d; i++) lo = w[i] < lo ? w[i] : lo;
    for (int i = 0; i < d && lo < s->c.eps; i++) w[i] = (w[i] - lo) + s->c.eps;
    for (int i = 0; i < d; i++) w[i] = powf(w[i], -1.0f / (float)root);
    for (int i = 0; i < d; i++)
        for (int j = 0; j < d; j++) scaled[(size_t)i * d + j] = a[(size_t)i * d + j] * w[j];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, d, 1.0f, scaled, d, a, d, 0.0f, out, d);
    if (!finite_all(out, dd)) return -1;
    memcpy(R, out, dd * sizeof *R);
    return 0;
}

/* Block i's place in this rank's buffer of directions: its gradient until its direction replaces it. */
static float *slot(dt_shampoo *s, int i) { return s->b[i].own ? s->ownbuf + s->b[i].at : s->send + (s->b[i].at - s->mine); }

/* Whether this rank computes block i's direction: its owner's, or one of its own experts'. */
static bool here(const dt_shampoo *s, int i) { return s->b[i].owner == s->rank || s->b[i].own; }

/* The first pass over this rank's blocks: each gradient gathered into its slot, the factors and grafting's moment take
 * it; on a root step, the roots. The first failure: its block + 1 (0: none), its factor and LAPACK's info. */
static int statistics(dt_shampoo *s, const float *grads, bool roots, float bc2, int *factor, int *info) {
    int failed = 0;
    for (int i = 0; i < s->nb; i++) {
        const sh_block *b = &s->b[i];
        if (!here(s, i)) continue;
        sh_state *q = &s->q[i];
        float *g = slot(s, i);
        sh_block_gather(b, grads, g);
        update_factors(s, b, q, g);
        for (size_t j = 0; j < b->numel; j++) q->v[j] = s->c.beta2 * q->v[j] + (1.0f - s->c.beta2) * g[j] * g[j];
        for (int k = 0; k < b->ndim && roots; k++) {
            int r = inverse_root(s, q->F[k], b->dim[k], bc2, 2 * b->ndim, q->R[k]);
            if (r && !failed) failed = i + 1, *factor = k, *info = r;
        }
    }
    return failed;
}

/* y = g preconditioned: contracted with each dimension's root in turn (each turn moves that dimension last). */
static const float *precondition(dt_shampoo *s, const sh_block *b, const sh_state *q, const float *g) {
    const float *x = g;
    float *turned[2] = { s->work[1], s->work[2] };
    for (int k = 0; k < b->ndim; k++) {
        int d = b->dim[k];
        int rest = (int)(b->numel / (size_t)d);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, rest, d, d, 1.0f, x, rest, q->R[k], d, 0.0f, turned[k & 1], d);
        x = turned[k & 1];
    }
    return x;
}

/* Block i's direction in place of its gradient in its slot: Adam's (grafting) before start, else Shampoo's at the norm
 * of Adam's. */
static void direction(dt_shampoo *s, int i, float bc1, float bc2) {
    const sh_block *b = &s->b[i];
    sh_state *q = &s->q[i];
    float *g = s->work[0], *out = slot(s, i), *m = q->m, keep = 1.0f - s->c.beta1, eps = s->c.graft_eps;
    const float *v = q->v;
    size_t n = b->numel;
    bool adam_only = s->t < s->c.start;
    if (m)
        for (size_t j = 0; j < n; j++) m[j] += keep * (out[j] - m[j]), g[j] = m[j] / bc1;
    else
        memcpy(g, out, n * sizeof *g);
    if (adam_only) {
        for (size_t j = 0; j < n; j++) out[j] = g[j] / (sqrtf(v[j] / bc2) + eps);
        return;
    }
    double ss = 0; /* Adam's direction's squared norm, the graft's: summed here, never stored */
    #pragma omp simd reduction(+ : ss)
    for (size_t j = 0; j < n; j++) {
        float a = g[j] / (sqrtf(v[j] / bc2) + eps);
        ss += (double)a * a;
    }
    const float *y = precondition(s, b, q, g);
    float scale = (float)sqrt(ss) / ((float)dt_grad_norm(y, n) + 1e-16f);
    for (size_t j = 0; j < n; j++) out[j] = y[j] * scale;
}

/* Every rank's directions to every rank, then into the store. */
static dt_status exchange(dt_shampoo *s, float *grads) {
    dt_status st = DT_OK;
    if (s->comm && s->c.wire == DT_BF16) {
        for (size_t j = 0; j < s->counts[s->rank]; j++) s->send16[j] = dt_f32_to_bf16(s->send[j]);
        if (!(st = dt_comm_allgather(s->comm, s->send16, s->recv16, s->share, DT_BF16)))
            for (size_t j = 0; j < s->share * (size_t)s->ranks; j++) s->recv[j] = dt_bf16_to_f32(s->recv16[j]);
    } else if (s->comm) {
        st = dt_comm_allgather(s->comm, s->send, s->recv, s->share, DT_F32);
    }
    for (int i = 0; i < s->nb && !st; i++) sh_block_scatter(&s->b[i], s->b[i].own ? s->ownbuf + s->b[i].at : s->recv + s->b[i].at, grads);
    return st;
}

dt_status dt_shampoo_step(dt_shampoo *s, float *grads, int *skip) {
    *skip = 0;
    long t = ++s->t;
    bool roots = (t % s->c.every == 0 && t > s->c.start) || t == s->c.start;
    float bc2 = 1.0f - powf(s->c.beta2, (float)t), bc1 = 1.0f - powf(s->c.beta1, (float)t);
    int factor = 0, info = 0;
    float failed = (float)statistics(s, grads, roots, bc2, &factor, &info);
    dt_status st = roots && s->comm ? dt_comm_allreduce(s->comm, &failed, &failed, 1, DT_F32, DT_MAX) : DT_OK;
    if (st) return st;
    if (failed > 0) {
        const sh_block *b = &s->b[(int)failed - 1];
        char why[96] = "", lapack[48] = "not finite";
        if (info > 0) snprintf(lapack, sizeof lapack, "LAPACK's info %d, in f32 and f64", info);
        char where[48] = "on an expert-parallel rank (its own experts')";
        if (!b->own) snprintf(where, sizeof where, "on rank %d", b->owner);
        if (b->owner == s->rank) snprintf(why, sizeof why, " (its factor %d, %d x %d: %s)", factor, b->dim[factor], b->dim[factor], lapack);
        dt_log(DT_LOG_WARN, "Shampoo: step %ld: the inverse root of %s's block %d of %d failed %s%s: the step is skipped on every rank",
               t, s->tensors[b->tensor].name, b->index + 1, b->of, where, why);
        *skip = 1;
        return DT_OK;
    }
    for (int i = 0; i < s->nb; i++)
        if (here(s, i)) direction(s, i, bc1, bc2);
    return exchange(s, grads);
}

int dt_shampoo_blocks(const dt_shampoo *s) { return s->nb; }
size_t dt_shampoo_state_bytes(const dt_shampoo *s) { return s->bytes; }
size_t dt_shampoo_state_bytes_most(const dt_shampoo *s) { return s->most; }

static void precond_begin(void *ctx, int accum, double loss_scale) { (void)ctx, (void)accum, (void)loss_scale; }
static dt_status precond_apply(void *ctx, float *grads, float lr, int *skip) {
    (void)lr;
    return dt_shampoo_step(ctx, grads, skip);
}

/* ---- its state in checkpoints: a unit a block (its factors, roots, then the filtered gradient and grafting's moment),
 * saved by its owner in the first group, loaded by its owner in every group; an expert-parallel rank's own expert's
 * block a unit by its global expert, saved by the first data-parallel rank holding it (the expert-parallel group's
 * are the first ranks), loaded by every rank holding it ---- */

static size_t unit_floats(void *ctx, int u) {
    dt_shampoo *s = ctx;
    return state_floats(&s->b[s->units[u].like], &s->c);
}

static int unit_saver(void *ctx, int u) {
    const dt_shampoo *s = ctx;
    return s->b[s->units[u].like].own ? s->units[u].holder : s->b[s->units[u].like].owner;
}

static int unit_loads(void *ctx, int u, int rank) {
    const dt_shampoo *s = ctx;
    const sh_block *b = &s->b[s->units[u].like];
    if (b->own) return rank % (s->tensors[b->tensor].gshape[0] / s->tensors[b->tensor].shape[0]) == s->units[u].holder;
    return rank % s->ranks == b->owner;
}

static void unit_io(void *ctx, int u, float *buf, int load) {
    dt_shampoo *s = ctx;
    if (s->units[u].block < 0) return; /* another rank's expert (never asked of this one) */
    const sh_block *b = &s->b[s->units[u].block];
    sh_state *q = &s->q[s->units[u].block];
    float *part[10];
    size_t len[10];
    int np = 0;
    for (int k = 0; k < b->ndim; k++) part[np] = q->F[k], len[np++] = (size_t)b->dim[k] * b->dim[k];
    for (int k = 0; k < b->ndim; k++) part[np] = q->R[k], len[np++] = (size_t)b->dim[k] * b->dim[k];
    if (q->m) part[np] = q->m, len[np++] = b->numel;
    part[np] = q->v, len[np++] = b->numel;
    for (int i = 0; i < np; buf += len[i], i++)
        memcpy(load ? part[i] : buf, load ? buf : part[i], len[i] * sizeof(float));
}

static long unit_steps(void *ctx) { return ((dt_shampoo *)ctx)->t; }
static void unit_set_steps(void *ctx, long t) { ((dt_shampoo *)ctx)->t = t; }

void dt_shampoo_preconditioner(dt_shampoo *s, dt_preconditioner *out) {
    *out = (dt_preconditioner){ "Shampoo", precond_begin, precond_apply, s,
                                { "shampoo", s->nunits, unit_floats, unit_saver, unit_loads, unit_io, unit_steps, unit_set_steps, s, 0 }, NULL, 0, 1, 1, NULL };
}
