/* ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training
 * Trillion Parameter Models", 2020) as strategies of the engine.
 *
 * Stage 1, built here: the optimizer state is sharded. The flat store is cut
 * into one contiguous shard per rank (sizes differ by at most one element,
 * so any number of ranks works). The gradients are averaged as DDP averages
 * them, bucket by bucket with allreduces overlapped with backward
 * (dt_ddp); each rank updates only its shard, with only its shard of the
 * optimizer state (Adam: 8 bytes per parameter / N instead of 8): like DDP,
 * inside backward bucket by bucket where it can (SGD, AdamW, no clipping),
 * else after it. Then the ranks allgather the updated parameters, so every
 * rank again holds the whole model for the next forward. The global gradient norm (clipping) is
 * the sum of the shards' squares, allreduced; so are LAMB's and LARS's
 * per-tensor sums of squares, since a shard boundary may cut a tensor and
 * its trust ratio must come from the whole tensor's norms.
 *
 * Model states per rank for fp32 Adam: 4 (parameters) + 4 (gradients) +
 * 8/N (optimizer) bytes per parameter; DDP holds 16.
 *
 * Not yet: stages 2 and 3. */
#include "dtrain/parallel.h"
#include "dtrain/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CHUNK = 1 << 22 }; /* floats per rank per allgather of the parameters (16 MiB) */

typedef struct {
    const dt_engine_config *c;
    dt_ddp *d;           /* the gradients' averaging */
    size_t *counts, *offs; /* each rank's shard */
    size_t off, n;       /* this rank's */
    float *mine, *all;   /* a piece of the updated shard, and every rank's piece, for the allgather */
    size_t piece;        /* floats per rank per allgather: CHUNK, or the largest shard if smaller */
    int in_backward;     /* the shard updated bucket by bucket inside backward */
} zero;

/* Shard r of n elements over p ranks: the first n % p shards one longer. */
static void shard(size_t n, int p, int r, size_t *off, size_t *count) {
    size_t base = n / (size_t)p, extra = n % (size_t)p, k = (size_t)r;
    *count = base + (k < extra);
    *off = k * base + (k < extra ? k : extra);
}

static void z_destroy(void *state) {
    zero *z = state;
    if (!z) return;
    dt_ddp_destroy(z->d);
    free(z->counts);
    free(z->offs);
    free(z->mine);
    free(z->all);
    free(z);
}

static dt_status z1_create(dt_engine *e, void **state, size_t *off, size_t *n) {
    const dt_engine_config *c = dt_engine_get_config(e);
    if (!c->comm) return DT_OK; /* one process: its shard is everything (state NULL) */
    int p = dt_comm_size(c->comm), rank = dt_comm_rank(c->comm);
    zero *z = calloc(1, sizeof *z);
    if (!z || !(z->counts = malloc(sizeof *z->counts * (size_t)p)) || !(z->offs = malloc(sizeof *z->offs * (size_t)p))) {
        if (z) free(z->counts);
        free(z);
        return dt_error(DT_ERR_NOMEM, "zero1: out of memory");
    }
    z->c = c;
    for (int r = 0; r < p; r++) shard(c->model.nparams, p, r, &z->offs[r], &z->counts[r]);
    shard(c->model.nparams, p, rank, &z->off, &z->n);
    for (int r = 0; r < p; r++) z->piece = z->counts[r] > z->piece ? z->counts[r] : z->piece;
    if (z->piece > CHUNK) z->piece = CHUNK;
    z->mine = malloc(sizeof *z->mine * (z->piece + 1));
    z->all = malloc(sizeof *z->all * (z->piece + 1) * (size_t)p);
    dt_status st = z->mine && z->all ? DT_OK : dt_error(DT_ERR_NOMEM, "zero1: out of memory");
    if (!st) st = dt_ddp_create(c->comm, &c->model, c->bucket_first, c->bucket_bytes, &z->d);
    if (st) { z_destroy(z); return st; }
    *off = z->off;
    *n = z->n;
    *state = z;
    return DT_OK;
}

/* As DDP: with an elementwise optimizer and nothing that needs the global
 * norm first, each bucket's part of this rank's shard is updated inside
 * backward as soon as its allreduce is done (half the update on 2 ranks,
 * and overlapped); otherwise the engine updates the shard after backward. */
static dt_status z_attach(void *state, dt_optim *o) {
    zero *z = state;
    const dt_engine_config *c = z ? z->c : NULL;
    if (!z || c->step_at_end || c->skip_nonfinite || c->grad_clip > 0 || !dt_optim_elementwise(o)) return DT_OK;
    z->in_backward = 1;
    return dt_ddp_set_optimizer(z->d, o, c->model.params(c->model.self), z->off, z->n);
}

static void z_begin(void *state, int sync, float lr) {
    if (state) dt_ddp_begin(((zero *)state)->d, sync, lr);
}

static dt_status gather_params(zero *z);

static dt_status z_finish(void *state, dt_sync_result *r) {
    zero *z = state;
    if (!z) return DT_OK;
    double norm = 0;
    dt_status st = dt_ddp_finish(z->d, &r->exposed_ms, &norm);
    r->updated = z->in_backward; /* else the engine updates this rank's shard */
    if (st || !z->in_backward) return st;
    r->updated_in_backward = dt_ddp_updated_in_backward(z->d);
    double ss = norm * norm; /* this shard's: the global norm is the shards' sum */
    if ((st = dt_comm_allreduce(z->c->comm, &ss, &ss, 1, DT_F64, DT_SUM))) return st;
    r->norm = sqrt(ss);
    return gather_params(z);
}

static dt_status z_sum(void *state, double *v, size_t n) {
    zero *z = state;
    return z ? dt_comm_allreduce(z->c->comm, v, v, n, DT_F64, DT_SUM) : DT_OK;
}

/* Every rank gets every shard's new parameters; the gradients outside this
 * rank's shard (which its optimizer did not zero) are cleared for the next step. */
static dt_status z_after_update(void *state) { return state ? gather_params(state) : DT_OK; }

static dt_status gather_params(zero *z) {
    const dt_model *m = &z->c->model;
    float *p = m->params(m->self), *g = m->grads(m->self);
    memset(g, 0, z->off * sizeof *g);
    memset(g + z->off + z->n, 0, (m->nparams - z->off - z->n) * sizeof *g);
    /* in pieces of CHUNK floats of every shard at a time, through two small
     * buffers (a whole shard's staging would cost 4/N bytes per parameter) */
    int np = dt_comm_size(z->c->comm);
    size_t most = 0, counts[np];
    for (int r = 0; r < np; r++) most = z->counts[r] > most ? z->counts[r] : most;
    dt_status st = DT_OK;
    size_t K = z->piece;
    for (size_t at = 0; at < most && !st; at += K) {
        size_t o = 0, mine = z->n > at ? (z->n - at < K ? z->n - at : K) : 0;
        for (int r = 0; r < np; r++) counts[r] = z->counts[r] > at ? (z->counts[r] - at < K ? z->counts[r] - at : K) : 0;
        memcpy(z->mine, p + z->off + at, mine * sizeof *p);
        if ((st = dt_comm_allgatherv(z->c->comm, z->mine, z->all, counts, DT_F32))) break;
        for (int r = 0; r < np; r++) {
            memcpy(p + z->offs[r] + at, z->all + o, counts[r] * sizeof *p);
            o += counts[r];
        }
    }
    return st;
}

static dt_status z_check(void *state, uint64_t *hash) {
    zero *z = state;
    if (!z) return DT_OK;
    const dt_model *m = &z->c->model;
    return dt_ddp_check_replicas(z->c->comm, m->params(m->self), m->nparams, hash);
}

static size_t z_buffers(void *state) {
    zero *z = state;
    return z ? dt_ddp_buffer_bytes(z->d) + (z->piece + 1) * sizeof(float) * (size_t)(dt_comm_size(z->c->comm) + 1) : 0;
}

const dt_strategy dt_strategy_zero1 = {
    .name = "zero1", .create = z1_create, .destroy = z_destroy, .attach = z_attach, .begin = z_begin, .finish = z_finish,
    .reduce_sum = z_sum, .after_update = z_after_update, .check_replicas = z_check,
    .buffer_bytes = z_buffers,
};
