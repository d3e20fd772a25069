/* Data parallelism: every rank holds the whole model, computes gradients on
 * its part of the global batch, and the gradients are averaged by allreduce
 * before the optimizer, so every rank takes the same step.
 *
 * The gradients live in the shared arena (zero-copy allreduce). Backward
 * produces them unit by unit, last unit first, as the model's tensor table
 * says (each tensor's grad_unit); units are grouped into buckets, small
 * first so communication starts early, then up to a cap. The store is
 * unit-major, so a bucket of consecutive units is one range (a tied weight
 * final early adds a second), allreduced in place. The moment backward
 * reports a bucket's last unit, its allreduces go to the communicator's
 * progress thread and run while backward continues.
 *
 * A tied embedding (the table's input_rows tensor: GPT-2's wte, a third of
 * 124M) would be final only after the very last kernel of backward, leaving
 * its allreduce exposed. Its gradient has two parts: the LM head's (dense,
 * final at its grad_unit) and the embedding's (only the B*T rows of this
 * micro-batch's tokens). So the model leaves the rows out, the tensor is
 * averaged as soon as the head is done, the ranks exchange their tokens
 * meanwhile, and at the end their B*T rows (an allgather, ~1% of wte's
 * size); every rank adds everyone's rows / N, in rank order.
 *
 * The optimizer in backward (dt_ddp_set_optimizer; elementwise optimizers
 * only): each bucket is updated as soon as its allreduce is done, from
 * inside backward, instead of all of them after it. The update is
 * memory-bound and the ranks run in step, so updating everything at the end
 * has every core stream memory at once, each slowed by the others (on a
 * 2-core VM: 40 ms alone, 52 ms side by side, for d6). Inside backward the
 * ranks take turns, one unit boundary each, so one rank's update runs while
 * the others compute. The embedding's rows that wait for their input part
 * are updated last. */
#include "dtrain/parallel.h"
#include "dtrain/codec.h"
#include "dtrain/kernels.h"
#include "grad_pool.h"
#include "zero_shards.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

typedef dt_pool_range range;
/* A request's gradients reduced in 16 bits where its average lands: [off, +count) of the store, narrowed at g */
typedef struct { size_t off, count; float *g; } narrow;

typedef struct {
    int last_unit;       /* issue when backward reports this unit */
    int group;           /* its tensors' group (dt_tensor_info.group): DT_GROUP_EXPERT's average over the expert replicas */
    range *ranges;
    int nranges;
    int req0, nreq;      /* this step's requests, in dt_ddp.reqs */
    int t0, nt;          /* its tensors: dt_ddp.order[t0, t0 + nt) */
    /* a codec's exchange this step (coded): its request in flight, and whether the average is in place */
    bool coded, decoded;
    dt_request *creq;
} bucket;

struct dt_ddp {
    dt_comm *c;
    dt_comm *ec;         /* expert parallelism (dt_ddp_set_experts): the ranks holding this rank's experts (NULL: none other) */
    int ep;              /* the expert-parallel ranks (1: none): an expert's gradient is 1/ep of a data-parallel average */
    dt_model m;
    const dt_tensor_info *emb; /* the deferred input_rows tensor, or NULL */
    const dt_tensor_info *emb_t; /* the one the model could defer (a codec's steps do not: emb NULL then) */
    float *grads;        /* arena */
    size_t nparams;
    bucket *b;
    int nb;
    range *all;          /* every bucket's ranges, bucket after bucket */
    int nall;
    int *order;          /* the table's tensors in backward's order (the buckets' runs of it) */
    size_t bucket_first, bucket_bytes;
    dt_codec *codec;     /* gradients compressed (dt_ddp_set_codec; NULL: averaged as they are) */
    bool leave_tied;     /* the buckets leave a pipeline's tied copy out (dt_ddp_leave_out_tied_copy) */
    dt_request **reqs;   /* a waited request becomes NULL */
    narrow *narrowed;    /* per request: the gradients it reduces in 16 bits (count 0: none), widened (or copied
                          * into the 16-bit store) once done */
    int nreqs, reqcap;
    dt_dtype wire;       /* the gradients' type in the allreduce (dt_ddp_set_wire) */
    int sync;
    dt_status err;
    int issued;          /* buckets issued this step (they issue in order) */
    /* the embedding's deferred rows */
    int32_t *toks;       /* arena: every rank's tokens, then this rank's to send */
    size_t toks_cap;
    dt_request *tok_req;
    int ntok;            /* tokens per rank this step; 0: none in flight */
    float *rows;         /* arena: per rank, ntok x C row gradients; then this rank's to send */
    size_t rows_cap;     /* floats per rank */
    /* the optimizer in backward */
    dt_optim *opt;
    float *params, lr;
    const dt_store_range *win; /* the optimizer's window of the store: everything, or a ZeRO shard (win1), or its runs */
    int nwin;
    dt_store_range win1;
    size_t wn;           /* its floats */
    int stepped;         /* buckets updated this step (in order) */
    int turn;            /* unit boundaries seen this step */
    bool wait_in_backward; /* DTRAIN_DDP_WAIT_IN_BACKWARD=1 (tests): a turn waits for the issued buckets,
                            * so how much is updated inside backward no longer depends on timing */
    uint8_t *touched;    /* per embedding row: some rank's token, so updated after the rows are in */
    double sumsq;        /* of the gradients updated this step */
    double waited_in_backward; /* seconds this step's turns inside backward waited */
    size_t done_n;       /* elements updated this step */
    size_t early_n;      /* of which inside backward */
    double last_early;   /* early_n / nparams of the last step */
    bool hooked;         /* the model's gradients and hook are ours */
    /* ZeRO-2/3 (shards given to dt_ddp_create): each rank keeps only its shard */
    const size_t *shard_off, *shard_cnt; /* every rank's shard; NULL: allreduce, every rank keeps everything */
    size_t s0, s1;       /* what the store keeps in its own pages: this rank's shard (nothing with a 16-bit store) */
    /* ZeRO with experts spread over ranks (dt_ddp_set_region_shards): the shards of each region of the store, a bucket
     * reduced to the owners in its own region's order (no pool); NULL: shard_off's */
    const dt_zero_shards *sh;
    dt_store_range *keep; /* what the store keeps in its own pages, in store order: [s0, s1), or this rank's runs */
    int nkeep;
    int retired;         /* buckets whose other shards' parts went back (to the pool, or the system) this step */
    /* With the store in the shared arena, a step's buckets borrow the pages of a small pool for their parts outside
     * the shard (grad_pool.h); with a pool, the reductions are cut at page edges */
    dt_grad_pool *pool;  /* NULL: none (the ranks' stores at different page phases, or no shards) */
    bool pooled;         /* this step pools: it synchronises and nothing was accumulated */
    bool accumulated;    /* a backward of this step added into the store's own pages without synchronising */
    /* The 16-bit gradient store (dt_ddp_set_grad_store): the averages of the
     * optimizer's window [g0, g1), copied out of the f32 buckets as their
     * reductions end; the f32 store holds only the buckets in flight */
    uint16_t *g16;
    size_t g0, g1;
    int32_t *slot;       /* per embedding row: its place in acc, or -1 (the rows' add in 16 bits) */
    float *acc;
    size_t acc_cap;
};

/* Whether each rank keeps only its shard of the averaged gradients (ZeRO 2, 3). */
static bool sharded(const dt_ddp *d) { return d->shard_off || d->sh; }

/* The table's tensors as gradient ranges in the order backward finalises
 * them: by grad_unit, last first, and within a unit from the end of the
 * store down, so that neighbours merge into one range. */
static int by_backward_order(const void *a, const void *b) {
    const dt_tensor_info *x = a, *y = b;
    if (x->grad_unit != y->grad_unit) return x->grad_unit > y->grad_unit ? -1 : 1;
    if (x->group != y->group) return x->group < y->group ? -1 : 1; /* a unit's groups in buckets of their own */
    return x->offset > y->offset ? -1 : x->offset < y->offset;
}

static dt_request **next_request(dt_ddp *d) {
    if (d->nreqs == d->reqcap) {
        int cap = d->reqcap ? d->reqcap * 2 : 256;
        dt_request **r = realloc(d->reqs, sizeof *r * (size_t)cap);
        if (r) d->reqs = r;
        narrow *w = r ? realloc(d->narrowed, sizeof *w * (size_t)cap) : NULL;
        if (!w) return NULL;
        d->narrowed = w;
        d->reqcap = cap;
    }
    d->narrowed[d->nreqs] = (narrow){ 0, 0, NULL };
    return &d->reqs[d->nreqs];
}

/* An arena buffer of at least need elements of size sz (kept between steps). */
static dt_status arena_reserve(dt_ddp *d, void **buf, size_t *cap, size_t need, size_t sz) {
    if (need <= *cap) return DT_OK;
    dt_comm_free(d->c, *buf);
    *buf = NULL;
    *cap = 0;
    dt_status st = dt_comm_alloc(d->c, need * sz, buf);
    if (!st) *cap = need;
    return st;
}

/* The embedding's grad_unit (its head part is final): this rank's tokens go
 * to every rank; they say which rows wait for the input's part. */
static dt_status send_tokens(dt_ddp *d) {
    const int32_t *tok;
    int n, p = dt_comm_size(d->c);
    d->m.input_grad(d->m.self, &tok, &n);
    dt_status st = arena_reserve(d, (void **)&d->toks, &d->toks_cap, (size_t)n * (size_t)(p + 1), sizeof(int32_t));
    if (st) return st;
    int32_t *mine = d->toks + (size_t)n * p;
    memcpy(mine, tok, (size_t)n * sizeof *tok);
    d->ntok = n;
    return dt_comm_iallgather(d->c, mine, d->toks, (size_t)n, DT_I32, &d->tok_req);
}

/* The embedding's unit: this rank's rows, already divided by N, go to every rank. */
static dt_status send_rows(dt_ddp *d) {
    int n, C = d->emb->shape[1], p = dt_comm_size(d->c);
    const float *dx = d->m.input_grad(d->m.self, NULL, &n);
    size_t per = (size_t)n * C;
    dt_status st = arena_reserve(d, (void **)&d->rows, &d->rows_cap, per * (size_t)(p + 1), sizeof(float));
    if (st) return st;
    float *mine = d->rows + (size_t)p * per, inv = 1.0f / (float)p;
    for (size_t i = 0; i < per; i++) mine[i] = dx[i] * inv;
    dt_request **r = next_request(d);
    if (!r) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    st = dt_comm_iallgather(d->c, mine, d->rows, per, DT_F32, r);
    if (!st) d->nreqs++;
    return st;
}

/* After every request: the embedding (averaged) += every rank's rows, in rank order. */
static void add_rows(dt_ddp *d) {
    int C = d->emb->shape[1], p = dt_comm_size(d->c), n = d->ntok;
    for (int r = 0; r < p; r++)
        dt_embedding_backward(d->grads + d->emb->offset, NULL, d->rows + (size_t)r * n * C, d->toks + (size_t)r * n, 1, n, C);
}

/* With a 16-bit store: the same add, in f32, on the rows some rank's tokens
 * touch, widened from the store (the part in its window) and rounded back
 * once. */
static dt_status add_rows_lp(dt_ddp *d) {
    int C = d->emb->shape[1], V = d->emb->shape[0], p = dt_comm_size(d->c), n = d->ntok;
    size_t all = (size_t)n * (size_t)p, need = all * ((size_t)C + 2), e0 = d->emb->offset;
    if (!d->slot && (d->slot = malloc(sizeof *d->slot * (size_t)V))) memset(d->slot, 0xff, sizeof *d->slot * (size_t)V);
    if (d->slot && need > d->acc_cap) {
        free(d->acc);
        d->acc_cap = (d->acc = malloc(need * sizeof *d->acc)) ? need : 0;
    }
    if (!d->slot || !d->acc) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    int32_t *remap = (int32_t *)(d->acc + all * (size_t)C), *uniq = remap + all;
    size_t rows = 0;
    for (size_t i = 0; i < all; i++) {
        int32_t t = d->toks[i];
        if (d->slot[t] < 0) { d->slot[t] = (int32_t)rows; uniq[rows++] = t; }
        remap[i] = d->slot[t];
    }
    for (size_t j = 0; j < rows; j++) {
        size_t s = e0 + (size_t)uniq[j] * C, a = s > d->g0 ? s : d->g0, b = s + C < d->g1 ? s + C : d->g1;
        float *x = d->acc + j * C;
        memset(x, 0, (size_t)C * sizeof *x);
        if (a < b) dt_lp_unpack(x + (a - s), d->g16 + (a - d->g0), b - a, d->wire);
    }
    for (int r = 0; r < p; r++)
        dt_embedding_backward(d->acc, NULL, d->rows + (size_t)r * n * C, remap + (size_t)r * n, 1, n, C);
    for (size_t j = 0; j < rows; j++) {
        size_t s = e0 + (size_t)uniq[j] * C, a = s > d->g0 ? s : d->g0, b = s + C < d->g1 ? s + C : d->g1;
        if (a < b) dt_lp_pack(d->g16 + (a - d->g0), d->acc + j * C + (a - s), b - a, d->wire);
        d->slot[uniq[j]] = -1;
    }
    return DT_OK;
}

/* Waits for *r unless already waited for, adding the time to *waited. */
static dt_status wait_req(dt_request **r, double *waited) {
    if (!*r) return DT_OK;
    double t = dt_time_now();
    dt_status st = dt_wait(*r);
    *waited += dt_time_now() - t;
    *r = NULL;
    return st;
}

/* Done (or, with wait, waited for): the request is released. */
static dt_status ready(dt_request **r, bool wait, double *waited, bool *done) {
    *done = true;
    if (!*r) return DT_OK;
    if (!wait) {
        int ok = 0;
        dt_status st = dt_test(*r, &ok);
        if (st) return st;
        if (!ok) { *done = false; return DT_OK; }
    }
    return wait_req(r, waited);
}

/* Request i done (or waited for, with wait): its gradients back in f32 if
 * they travelled in 16 bits, or with a 16-bit store, copied there. */
static dt_status settle(dt_ddp *d, int i, bool wait, double *waited, bool *done) {
    dt_status st = ready(&d->reqs[i], wait, waited, done);
    narrow *w = &d->narrowed[i];
    if (st || !*done || !w->count) return st;
    if (d->g16) {
        /* into the 16-bit store: the part in the optimizer's window, as it is */
        size_t a = w->off > d->g0 ? w->off : d->g0, b = w->off + w->count < d->g1 ? w->off + w->count : d->g1;
        if (a < b) memcpy(d->g16 + (a - d->g0), (uint16_t *)w->g + (a - w->off), (b - a) * sizeof(uint16_t));
    } else {
        dt_lp_widen_inplace(w->g, w->count, d->wire);
    }
    w->count = 0;
    return st;
}

/* ---- a codec's exchanges (dt_ddp_set_codec) ----
 * A codec's phase that issues a collective runs only where every rank runs it in the same order among its
 * collectives: before the next bucket's exchange starts (earlier buckets first) and in finish, bucket by bucket. */

static dt_status codec_start(dt_ddp *d, int k) {
    bucket *b = &d->b[k];
    b->coded = true;
    b->decoded = false;
    return dt_codec_start(d->codec, d->c, k, d->order + b->t0, b->nt, d->grads, &b->creq);
}

/* Bucket k's phases that issue a collective, each once its request is done (waiting). */
static dt_status codec_issue(dt_ddp *d, int k, double *waited) {
    bucket *b = &d->b[k];
    while (b->coded && !b->decoded && dt_codec_next_collective(d->codec, k)) {
        int fin;
        dt_status st = wait_req(&b->creq, waited);
        if (!st) st = dt_codec_next(d->codec, d->c, k, d->grads, &b->creq, &fin);
        if (st) return st;
        b->decoded = fin;
    }
    return DT_OK;
}

/* Bucket k's average in place, as far as its requests are done (with wait: waiting) and no collective is next. */
static dt_status codec_settle(dt_ddp *d, int k, bool wait, double *waited, bool *done) {
    bucket *b = &d->b[k];
    while (b->coded && !b->decoded && !dt_codec_next_collective(d->codec, k)) {
        int fin;
        dt_status st = ready(&b->creq, wait, waited, done);
        if (st || !*done) return st;
        if ((st = dt_codec_next(d->codec, d->c, k, d->grads, &b->creq, &fin))) return st;
        b->decoded = fin;
    }
    *done = !b->coded || b->decoded;
    return DT_OK;
}

/* The part of [off, off+n) in the optimizer's window (a ZeRO rank updates its shard only). */
static void update(dt_ddp *d, size_t off, size_t n) {
    size_t v = 0; /* where run j's state starts */
    for (int j = 0; j < d->nwin; v += d->win[j++].n) {
        size_t w0 = d->win[j].off, w1 = w0 + d->win[j].n, a = off > w0 ? off : w0, b = off + n < w1 ? off + n : w1;
        if (a >= b) continue;
        d->sumsq += dt_optim_update_at(d->opt, d->params + a, d->grads + a, d->lr, v + (a - w0), b - a, 1);
        d->done_n += b - a;
    }
}

/* Updates [off, off+n), leaving out the embedding rows that some rank's tokens touch. */
static void update_range(dt_ddp *d, size_t off, size_t n) {
    size_t end = off + n;
    size_t e0 = d->touched ? d->emb_t->offset : 0, e1 = d->touched ? e0 + d->emb_t->count : 0, C = d->touched ? (size_t)d->emb_t->shape[1] : 1;
    if (off < e0) {
        size_t stop = end < e0 ? end : e0;
        update(d, off, stop - off);
        off = stop;
    }
    while (off < end && off < e1) {
        size_t row = (off - e0) / C, stop = end < e1 ? end : e1, next = e0 + (row + 1) * C;
        if (d->touched[row]) { off = next < stop ? next : stop; continue; }
        size_t e = off;
        while (e < stop && !d->touched[(e - e0) / C]) e = e0 + ((e - e0) / C + 1) * C < stop ? e0 + ((e - e0) / C + 1) * C : stop;
        update(d, off, e - off);
        off = e;
    }
    if (off < end) update(d, off, end - off);
}

/* Updates the issued buckets in order, as far as their allreduces are done
 * (with wait: all of them, waiting). */
static dt_status step_buckets(dt_ddp *d, bool wait, double *waited) {
    while (d->stepped < d->issued) {
        bucket *k = &d->b[d->stepped];
        bool done = true;
        for (int i = 0; i < k->nreq && done; i++) {
            dt_status st = settle(d, k->req0 + i, wait, waited, &done);
            if (st) return st;
        }
        if (done && k->coded) {
            dt_status st = codec_settle(d, d->stepped, wait, waited, &done);
            if (st) return st;
        }
        if (done && d->tok_req && d->touched) {
            dt_status st = ready(&d->tok_req, wait, waited, &done);
            if (st) return st;
            for (int i = 0; done && i < d->ntok * dt_comm_size(d->c); i++) d->touched[d->toks[i]] = 1;
        }
        if (!done) return DT_OK;
        DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "optimizer", "\"bucket\":%d", d->stepped);
        for (int r = 0; r < k->nranges; r++) update_range(d, k->ranges[r].off, k->ranges[r].count);
        DT_TRACE_END(DT_TRACK_COMPUTE);
        d->stepped++;
    }
    return DT_OK;
}

/* Where element i of bucket k is this step: the pool's page it borrows, or its own. */
static float *where(dt_ddp *d, int k, size_t i) { return d->pooled ? dt_grad_pool_where(d->pool, k, i) : d->grads + i; }

/* [a, b) of bucket k averaged: allreduced, or (root >= 0) reduced to root. */
static dt_status reduce_piece(dt_ddp *d, int k, size_t a, size_t b, int root) {
    if (a >= b) return DT_OK;
    dt_request **req = next_request(d);
    if (!req) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    float *g = where(d, k, a);
    dt_comm *c = d->b[k].group == DT_GROUP_EXPERT ? d->ec : d->c;
    if (d->b[k].group == DT_GROUP_EXPERT) {
        /* each expert's gradient holds the tokens of the ep ranks that route to it: the average over its replicas
         * (or none: one rank holds it) taken as a share 1/ep, the data-parallel average's divisor in all */
        dt_grad_scale(g, b - a, 1.0f / (float)d->ep);
        if (!c) return DT_OK;
    }
    if (d->wire != DT_F32) {
        /* in 16 bits, in place: the first half of the piece's bytes (contiguous, in the pool too); widened back
         * once done where the average lands here (a reduction to another rank leaves nothing to keep) */
        dt_lp_narrow_inplace(g, b - a, d->wire);
        if (root < 0 || root == dt_comm_rank(c)) d->narrowed[d->nreqs] = (narrow){ a, b - a, g };
    }
    dt_status st = root >= 0 ? dt_comm_ireduce(c, g, g, b - a, d->wire, DT_AVG, root, req)
                             : dt_comm_iallreduce(c, g, g, b - a, d->wire, DT_AVG, req);
    if (!st) d->nreqs++;
    return st;
}

/* A bucket's range with shards by region: reduced to each owner of a piece of it in its region's order, over the
 * region's ranks (a bucket holds one group's tensors, neighbours in that order too); a region this rank alone holds
 * only takes its share. */
static dt_status reduce_by_region(dt_ddp *d, int k, size_t off, size_t n) {
    const dt_zero_region *g = &d->sh->r[d->sh->nr == 2 && d->b[k].group == DT_GROUP_EXPERT];
    if (!g->comm) return reduce_piece(d, k, off, off + n, -1);
    size_t v = dt_zero_region_at(g, off);
    for (int r = 0; r < dt_comm_size(g->comm); r++) {
        size_t x0 = v > g->offs[r] ? v : g->offs[r], x1 = v + n < g->offs[r] + g->counts[r] ? v + n : g->offs[r] + g->counts[r];
        dt_status st = x0 < x1 ? reduce_piece(d, k, off + (x0 - v), off + (x1 - v), r) : DT_OK;
        if (st) return st;
    }
    return DT_OK;
}

/* A bucket's range, averaged: allreduced (every rank gets it all), or with
 * shards reduced to each owner, a piece per shard it crosses. */
static dt_status reduce_range(dt_ddp *d, int k, size_t off, size_t n) {
    int p = dt_comm_size(d->c);
    if (d->sh) return reduce_by_region(d, k, off, n);
    if (!d->shard_off && !d->pooled) return reduce_piece(d, k, off, off + n, -1);
    for (int r = 0; r < p; r++) {
        /* without shards (a 16-bit store, pooled): the whole range, allreduced */
        size_t s0 = d->shard_off ? d->shard_off[r] : 0, s1 = d->shard_off ? s0 + d->shard_cnt[r] : d->nparams;
        size_t a = off > s0 ? off : s0, b = off + n < s1 ? off + n : s1;
        if (a >= b) continue;
        /* pooled: cut where a page may change hands (the same edges on every rank) */
        size_t pa = d->pooled ? dt_grad_pool_edge_up(d->pool, a) : b, pb = d->pooled ? dt_grad_pool_edge_down(d->pool, b) : b;
        if (pa > b) pa = b;
        if (pb < pa) pb = pa;
        int root = d->shard_off ? r : -1;
        dt_status st = reduce_piece(d, k, a, pa, root);
        if (!st) st = reduce_piece(d, k, pa, pb, root);
        if (!st) st = reduce_piece(d, k, pb, b, root);
        if (st || !d->shard_off) return st;
    }
    return DT_OK;
}

/* [off, off + n) outside this rank's shard goes back to the system (reads as zeros). */
static void outside_keep(dt_ddp *d, size_t off, size_t n, bool zero) {
    size_t at = off, end = off + n;
    for (int j = 0; j <= d->nkeep && at < end; j++) {
        size_t k0 = j < d->nkeep ? d->keep[j].off : end, k1 = j < d->nkeep ? k0 + d->keep[j].n : end;
        size_t b = k0 < end ? k0 : end;
        if (b > at && zero) memset(d->grads + at, 0, (b - at) * sizeof(float));
        else if (b > at) dt_comm_release(d->c, d->grads + at, (b - at) * sizeof(float));
        if (k1 > at) at = k1;
    }
}

static void release_others(dt_ddp *d, size_t off, size_t n) { outside_keep(d, off, n, false); }

/* Where this step accumulated micro-steps into the store's own pages, the part outside the shard (a 16-bit store: the
 * whole f32 store) is zeroed in place once the step's reductions are done, not given back: those pages fill again in the
 * next step's first micro-step whatever is done, so giving them back lowered no peak and made every step fault them in
 * anew (124M bf16 ZeRO-2 at micro-batch 2 x 2: 1584-1798 ms a step against ZeRO-1's 1411-1470; ZeRO-1 with a 16-bit
 * store: 2006-2015 ms against its f32 store's 1399-1408). */
static bool zero_in_place(const dt_ddp *d) { return d->accumulated; }

static void zero_others(dt_ddp *d) { outside_keep(d, 0, d->nparams, true); }

/* With shards: each bucket whose reductions are done (with wait: up to
 * bucket upto, waiting) gives back the other shards' parts, so that a rank
 * holds its shard and the buckets in flight. A pooled bucket's pages go back
 * to the pool. */
static dt_status retire(dt_ddp *d, int upto, bool wait) {
    while ((sharded(d) || d->g16) && d->retired < upto) {
        bucket *k = &d->b[d->retired];
        bool done = true;
        for (int i = 0; i < k->nreq && done; i++) {
            /* settled: a 16-bit store has its copy before the pages go */
            dt_status st = settle(d, k->req0 + i, wait, &d->waited_in_backward, &done);
            if (st) return st;
        }
        if (done && k->coded) {
            /* a codec's bucket: decoded first (its average written over the whole bucket, the other shards' pages too) */
            dt_status st = codec_settle(d, d->retired, wait, &d->waited_in_backward, &done);
            if (st) return st;
        }
        if (!done) return DT_OK;
        for (int r = 0; r < k->nranges && !d->pooled && !zero_in_place(d); r++) release_others(d, k->ranges[r].off, k->ranges[r].count);
        d->retired++;
    }
    return DT_OK;
}

/* ---- the bucket pool (ZeRO-2/3, a 16-bit store) ---- */

/* A pool lending the pages outside [s0, s1), where every rank's store allows it. A lent bucket's pages are zeroed, so it
 * lends none of a tied table's that a codec's steps do not defer (emb_t, emb NULL): the head's backward writes its part
 * there first, buckets before its own is lent; those pages stay the store's own (a range cut around it, in two at most). */
static dt_status make_pool(dt_ddp *d) {
    int *nranges = malloc(sizeof *nranges * (size_t)(d->nb + 1));
    range *r = malloc(sizeof *r * (size_t)(2 * d->nall + 1));
    if (!nranges || !r) { free(nranges); free(r); return dt_error(DT_ERR_NOMEM, "ddp: out of memory"); }
    size_t e0 = d->emb_t && !d->emb ? d->emb_t->offset : 0, e1 = d->emb_t && !d->emb ? e0 + d->emb_t->count : 0;
    int n = 0;
    for (int k = 0; k < d->nb; k++) {
        nranges[k] = 0;
        for (int i = 0; i < d->b[k].nranges; i++) {
            size_t a = d->b[k].ranges[i].off, b = a + d->b[k].ranges[i].count;
            size_t cut0 = e0 > a ? e0 : a, cut1 = e1 < b ? e1 : b;
            if (cut0 >= cut1) { r[n++] = d->b[k].ranges[i]; nranges[k]++; continue; }
            if (a < cut0) r[n++] = (range){ a, cut0 - a }, nranges[k]++;
            if (cut1 < b) r[n++] = (range){ cut1, b - cut1 }, nranges[k]++;
        }
    }
    dt_status st = dt_grad_pool_create(d->c, d->grads, d->nparams, d->s0, d->s1, r, nranges, d->nb, &d->pool);
    free(nranges);
    free(r);
    return st;
}

/* Bucket k borrows the pool's pages, once older buckets whose pages it would take are done (waiting for them). */
static dt_status lend(dt_ddp *d, int k) {
    int j = dt_grad_pool_blocker(d->pool, k, d->retired);
    dt_status st = j >= 0 ? retire(d, j + 1, true) : DT_OK;
    return st ? st : dt_grad_pool_lend(d->pool, k);
}

static void begin(dt_ddp *d, int sync, float lr, bool may_pool);

static void grad_hook(int unit, void *ctx) {
    dt_ddp *d = ctx;
    if (!d->sync || d->err) return;
    for (int k = 0; k < d->nb; k++) {
        if (d->b[k].last_unit != unit) continue;
        d->b[k].req0 = d->nreqs;
        if (d->codec && dt_codec_active(d->codec)) {
            for (int j = 0; j < k && !d->err; j++) d->err = codec_issue(d, j, &d->waited_in_backward);
            if (!d->err) d->err = codec_start(d, k);
        }
        for (int r = 0; r < d->b[k].nranges && !d->err && !d->b[k].coded; r++) d->err = reduce_range(d, k, d->b[k].ranges[r].off, d->b[k].ranges[r].count);
        if (d->err) return;
        d->b[k].nreq = d->nreqs - d->b[k].req0;
        d->issued = k + 1;
    }
    if (d->emb && unit == d->emb->grad_unit) d->err = send_tokens(d);
    if (d->emb && unit == d->emb->unit && !d->err) d->err = send_rows(d);
    if (!d->err) d->err = retire(d, d->issued, false);
    /* the next bucket's pages, before backward writes them */
    if (d->pooled && !d->err && dt_grad_pool_lent(d->pool) == d->issued && d->issued < d->nb) d->err = lend(d, d->issued);
    /* one rank's turn per unit boundary */
    if (d->opt && !d->err && d->turn++ % dt_comm_size(d->c) == dt_comm_rank(d->c)) {
        /* a wait here (DTRAIN_DDP_WAIT_IN_BACKWARD) is exposed communication too */
        d->err = step_buckets(d, d->wait_in_backward, &d->waited_in_backward);
        d->early_n = d->done_n;
    }
}

/* Buckets close at a unit boundary once they hold their cap. Each bucket's
 * ranges are a run of `all`; a range that ends where the bucket's previous
 * one begins merges with it (the store is walked downwards). */
static void make_buckets(dt_ddp *d, const dt_tensor_info *r, int nr, size_t bucket_first, size_t bucket_bytes) {
    size_t have = 0, cap = bucket_first < bucket_bytes ? bucket_first : bucket_bytes;
    bucket *cur = NULL;
    for (int i = 0; i < nr; i++) {
        if (cur && r[i].group != cur->group) cur = NULL;
        if (!cur) { cur = &d->b[d->nb++]; cur->ranges = d->all + d->nall; cur->group = r[i].group; cur->t0 = i; have = 0; }
        have += r[i].count * sizeof(float);
        cur->nt++;
        int j = 0;
        while (j < cur->nranges && r[i].offset + r[i].count != cur->ranges[j].off) j++;
        if (j < cur->nranges) { cur->ranges[j].off = r[i].offset; cur->ranges[j].count += r[i].count; }
        else { cur->ranges[cur->nranges++] = (range){ r[i].offset, r[i].count }; d->nall++; }
        cur->last_unit = r[i].grad_unit;
        bool unit_ends = i + 1 == nr || r[i + 1].grad_unit != r[i].grad_unit;
        if (unit_ends && have >= cap) { cur = NULL; cap = bucket_bytes; }
    }
}

/* The buckets over the table (again where a codec turned the embedding's deferred rows off: its gradient is then
 * final at its own unit). */
static dt_status plan_buckets(dt_ddp *d) {
    int nr = d->m.ntensors;
    dt_tensor_info *r = malloc(sizeof *r * (size_t)(nr + 1));
    if (!r) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    memcpy(r, d->m.tensors, sizeof *r * (size_t)nr);
    for (int i = 0; i < nr; i++)
        if (r[i].input_rows && !d->emb && d->m.defer_input_rows && r[i].unit < r[i].grad_unit) r[i].grad_unit = r[i].unit;
    qsort(r, (size_t)nr, sizeof *r, by_backward_order);
    int kept = 0;
    for (int i = 0; i < nr; i++)
        if (!(d->leave_tied && r[i].tied_copy)) r[kept++] = r[i];
    nr = kept;
    for (int i = 0; i < nr; i++)
        for (int j = 0; j < d->m.ntensors; j++)
            if (d->m.tensors[j].offset == r[i].offset && !strcmp(d->m.tensors[j].name, r[i].name)) d->order[i] = j;
    memset(d->b, 0, sizeof *d->b * (size_t)(nr + 1));
    memset(d->all, 0, sizeof *d->all * (size_t)(nr + 1));
    d->nb = d->nall = 0;
    make_buckets(d, r, nr, d->bucket_first, d->bucket_bytes);
    free(r);
    return DT_OK;
}

/* The buckets a step needs: with a codec from its start step on, the tied embedding's gradient whole in the store at
 * its own unit (the codec sees the matrix as it is); else its rows deferred (before the start: dense DDP's steps). */
static dt_status use_plan(dt_ddp *d) {
    const dt_tensor_info *want = d->codec && dt_codec_active(d->codec) ? NULL : d->emb_t;
    if (want == d->emb) return DT_OK;
    d->emb = want;
    if (!want) d->m.defer_input_rows(d->m.self, 0);
    dt_status st = plan_buckets(d);
    if (st || !d->pool) return st;
    /* the pool lends by the buckets' runs: made again for the new ones (every rank here at the same step) */
    st = dt_grad_pool_give_back(d->pool);
    dt_grad_pool_destroy(d->pool);
    d->pool = NULL;
    return st ? st : make_pool(d);
}

static dt_status set_shards(dt_ddp *d, const size_t *offs, const size_t *counts) {
    int p = dt_comm_size(d->c), me = dt_comm_rank(d->c);
    size_t next = 0;
    for (int r = 0; r < p; r++) {
        if (offs[r] != next) return dt_error(DT_ERR_ARG, "ddp: shard %d starts at %zu, not %zu: shards must tile the store in rank order", r, offs[r], next);
        next += counts[r];
    }
    /* (all of it, or all but a last stage's tied copy at its end, which no rank keeps: zero_shards.h) */
    const dt_tensor_info *copy = dt_model_tied_tail(&d->m);
    if (next != d->nparams && !(copy && next == copy->offset))
        return dt_error(DT_ERR_ARG, "ddp: the shards cover %zu of %zu parameters", next, d->nparams);
    if (!(d->keep = malloc(sizeof *d->keep))) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    d->shard_off = offs;
    d->shard_cnt = counts;
    d->s0 = offs[me];
    d->s1 = offs[me] + counts[me];
    d->keep[0] = (dt_store_range){ d->s0, d->s1 - d->s0 };
    d->nkeep = 1;
    release_others(d, 0, d->nparams); /* pre-faulted anyway where the arena is private memory */
    return make_pool(d);
}

static int by_offset(const void *a, const void *b) {
    const dt_store_range *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

dt_status dt_ddp_set_region_shards(dt_ddp *d, const dt_zero_shards *sh) {
    if (d->shard_off || d->sh || d->g16 || d->codec || d->opt)
        return dt_error(DT_ERR_UNSUPPORTED, "ddp: shards by region are set once, before any optimizer, without a codec or a 16-bit store");
    if (!(d->keep = malloc(sizeof *d->keep * (size_t)(sh->nruns + 1)))) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    memcpy(d->keep, sh->runs, sizeof *d->keep * (size_t)sh->nruns);
    qsort(d->keep, (size_t)sh->nruns, sizeof *d->keep, by_offset);
    d->nkeep = sh->nruns;
    d->sh = sh;
    release_others(d, 0, d->nparams);
    return DT_OK;
}

int dt_ddp_bucket_lens(const dt_model *m, size_t bucket_first, size_t bucket_bytes, bool defer_rows, size_t *lens, int *last_unit,
                       int cap) {
    int nr = m->ntensors, n = -1;
    dt_ddp d = { .m = *m, .bucket_first = bucket_first, .bucket_bytes = bucket_bytes };
    /* dense DDP's layout: the table's deferrable rows as dt_ddp_create finds them */
    for (int i = 0; i < nr && defer_rows; i++)
        if (m->tensors[i].input_rows && m->defer_input_rows && m->input_grad) d.emb = &m->tensors[i];
    d.b = calloc((size_t)nr + 1, sizeof *d.b), d.all = calloc((size_t)nr + 1, sizeof *d.all), d.order = calloc((size_t)nr + 1, sizeof *d.order);
    if (d.b && d.all && d.order && !plan_buckets(&d)) {
        n = d.nb;
        for (int k = 0; k < d.nb && k < cap; k++) {
            lens[k] = 0;
            for (int r = 0; r < d.b[k].nranges; r++) lens[k] += d.b[k].ranges[r].count;
            if (last_unit) last_unit[k] = d.b[k].last_unit;
        }
    }
    free(d.b), free(d.all), free(d.order);
    return n;
}

dt_status dt_ddp_create(dt_comm *c, const dt_model *m, size_t bucket_first, size_t bucket_bytes, const size_t *shard_offs,
                        const size_t *shard_counts, dt_ddp **out) {
    *out = NULL;
    int nr = m->ntensors;
    dt_ddp *d = calloc(1, sizeof *d);
    if (d) d->wait_in_backward = getenv("DTRAIN_DDP_WAIT_IN_BACKWARD") && atoi(getenv("DTRAIN_DDP_WAIT_IN_BACKWARD")) > 0;
    bucket *b = calloc((size_t)nr + 1, sizeof *b);
    range *all = calloc((size_t)nr + 1, sizeof *all);
    int *order = calloc((size_t)nr + 1, sizeof *order);
    if (!d || !b || !all || !order) { free(d); free(b); free(all); free(order); return dt_error(DT_ERR_NOMEM, "ddp: out of memory"); }
    d->c = c;
    d->order = order;
    d->bucket_first = bucket_first;
    d->bucket_bytes = bucket_bytes;
    d->ep = 1;
    d->m = *m;
    d->nparams = m->nparams;
    d->b = b;
    d->all = all;
    d->sync = 1;
    for (int i = 0; i < nr; i++)
        if (m->tensors[i].input_rows && m->defer_input_rows && m->input_grad) d->emb = d->emb_t = &m->tensors[i];
    /* never pre-faulted: backward writes each page before any reduction reads it, and with shards or a 16-bit
     * store (dt_ddp_set_grad_store) only some of them are ever resident */
    dt_status st = plan_buckets(d);
    if (!st) st = dt_comm_alloc_sparse(c, d->nparams * sizeof(float), (void **)&d->grads);
    if (!st && shard_offs) st = set_shards(d, shard_offs, shard_counts);
    if (st) { dt_ddp_destroy(d); return st; }
    m->set_grad_storage(m->self, d->grads);
    m->set_grad_hook(m->self, grad_hook, d);
    d->hooked = true;
    begin(d, 1, 0, false);
    *out = d;
    return DT_OK;
}

dt_status dt_ddp_set_experts(dt_ddp *d, dt_comm *ec, int ep) {
    if (ep < 1 || dt_comm_size(d->c) % ep) return dt_error(DT_ERR_ARG, "ddp: %d expert-parallel ranks do not divide %d data-parallel ones", ep, dt_comm_size(d->c));
    if (ep > 1 && (d->shard_off || d->g16 || d->pool))
        return dt_error(DT_ERR_UNSUPPORTED, "ddp: experts spread over ranks (--ep) with sharded or 16-bit-kept gradients: not in this build");
    if ((ec ? dt_comm_size(ec) : 1) * ep != dt_comm_size(d->c))
        return dt_error(DT_ERR_ARG, "ddp: %d expert replicas x %d expert-parallel ranks is not the %d data-parallel ranks", ec ? dt_comm_size(ec) : 1, ep,
                        dt_comm_size(d->c));
    d->ec = ec;
    d->ep = ep;
    return DT_OK;
}

dt_status dt_ddp_set_codec(dt_ddp *d, dt_codec *k) {
    if (d->g16 || d->ep > 1 || d->wire != DT_F32 || d->opt)
        return dt_error(DT_ERR_UNSUPPORTED, "ddp: a codec compresses f32 gradients, set before the optimizer: not with experts spread "
                        "over ranks, or gradients kept or sent in 16 bits, in this build");
    d->codec = k;
    dt_codec_set_model(k, &d->m); /* the parameters DGC's weight decay reads */
    return use_plan(d);
}

dt_status dt_ddp_set_wire(dt_ddp *d, dt_dtype t) {
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "ddp: gradients travel as fp32, bf16 or fp16, not %s", dt_dtype_name(t));
    if (d->g16 && t != d->wire)
        return dt_error(DT_ERR_ARG, "ddp: gradients kept in %s travel in %s, not %s", dt_dtype_name(d->wire), dt_dtype_name(d->wire),
                        dt_dtype_name(t));
    d->wire = t;
    return DT_OK;
}

dt_status dt_ddp_set_grad_store(dt_ddp *d, dt_dtype t, size_t off, size_t n) {
    if (t != DT_BF16 && t != DT_F16) return dt_error(DT_ERR_ARG, "ddp: a 16-bit gradient store is bf16 or fp16, not %s", dt_dtype_name(t));
    if (off + n > d->nparams) return dt_error(DT_ERR_ARG, "ddp: gradient window [%zu, +%zu) outside %zu parameters", off, n, d->nparams);
    if (d->opt || d->g16) return dt_error(DT_ERR_ARG, "ddp: a 16-bit gradient store is set once, before any optimizer in backward");
    if (!(d->g16 = calloc(n ? n : 1, sizeof *d->g16))) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    d->g0 = off;
    d->g1 = off + n;
    d->wire = t;
    /* the store keeps nothing in its own pages between steps: the pool lends
     * every bucket its pages (the whole model's, not only the other shards') */
    dt_status st = dt_grad_pool_give_back(d->pool);
    dt_grad_pool_destroy(d->pool);
    d->pool = NULL;
    d->s0 = d->s1 = 0;
    d->nkeep = 0;
    dt_comm_release(d->c, d->grads, d->nparams * sizeof(float));
    if (!st) st = make_pool(d);
    if (!st) begin(d, 1, 0, false);
    return st ? st : d->err;
}

dt_status dt_ddp_leave_out_tied_copy(dt_ddp *d) {
    if (sharded(d) || d->g16 || d->codec || d->leave_tied) return DT_OK; /* their pools lend the buckets' pages: the copy's stay in one */
    d->leave_tied = true;
    return plan_buckets(d);
}

uint16_t *dt_ddp_grad_store(dt_ddp *d, dt_dtype *t) {
    *t = d->wire;
    return d->g16;
}

size_t dt_ddp_grads_held(const dt_ddp *d) {
    return dt_mem_resident(d->grads, d->nparams * sizeof(float)) + (d->g16 ? dt_mem_resident(d->g16, (d->g1 - d->g0) * sizeof *d->g16) : 0);
}

dt_status dt_ddp_set_optimizer(dt_ddp *d, dt_optim *o, float *params, size_t off, size_t n) {
    d->win1 = (dt_store_range){ off, n };
    return dt_ddp_set_optimizer_runs(d, o, params, &d->win1, 1);
}

dt_status dt_ddp_set_optimizer_runs(dt_ddp *d, dt_optim *o, float *params, const dt_store_range *runs, int nruns) {
    d->wn = 0;
    for (int j = 0; j < nruns; j++) {
        if (runs[j].off + runs[j].n > d->nparams)
            return dt_error(DT_ERR_ARG, "ddp: optimizer window [%zu, +%zu) outside %zu parameters", runs[j].off, runs[j].n, d->nparams);
        d->wn += runs[j].n;
    }
    d->win = runs;
    d->nwin = nruns;
    if (o && !dt_optim_elementwise(o)) return dt_error(DT_ERR_ARG, "ddp: only SGD and AdamW can update inside backward");
    if (o && d->g16) return dt_error(DT_ERR_ARG, "ddp: with a 16-bit gradient store the update reads it after backward");
    size_t covered = 0;
    for (int i = 0; i < d->nall; i++) covered += d->all[i].count;
    if (o && covered != d->nparams)
        return dt_error(DT_ERR_ARG, "ddp: the gradient ranges cover %zu of %zu parameters", covered, d->nparams);
    if (o && d->emb_t && !d->touched) {
        d->touched = calloc((size_t)d->emb_t->shape[0], 1);
        if (!d->touched) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    }
    d->opt = o;
    d->params = params;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d) return;
    dt_grad_pool_destroy(d->pool); /* before the store goes: its addresses must not show the pool */
    if (d->hooked) {
        d->m.set_grad_hook(d->m.self, NULL, d);
        if (d->emb) d->m.defer_input_rows(d->m.self, 0);
        d->m.set_grad_storage(d->m.self, NULL);
    }
    dt_comm_free(d->c, d->rows);
    dt_comm_free(d->c, d->toks);
    free(d->touched);
    free(d->keep);
    free(d->all);
    free(d->b);
    free(d->order);
    free(d->reqs);
    free(d->narrowed);
    dt_comm_free(d->c, d->grads);
    free(d->g16);
    free(d->slot);
    free(d->acc);
    free(d);
}

/* may_pool: false where the store is set up (dt_ddp_create, dt_ddp_set_grad_store), so that the pool's pages come only
 * when a step pools: lent there, bucket 0's stayed resident through runs that accumulate and never lend (124M bf16
 * ZeRO-1, --grad-store bf16 at 2 x 2: 311 MB of the machine's peak) */
static void begin(dt_ddp *d, int sync, float lr, bool may_pool) {
    d->sync = sync;
    if (sync && d->codec && !d->err) d->err = use_plan(d);
    d->lr = lr;
    if (sync && d->opt) dt_optim_begin(d->opt);
    /* micro-steps that do not synchronise accumulate the rows as usual */
    if (d->emb) d->m.defer_input_rows(d->m.self, sync);
    /* what a micro-step accumulates stays in the store's own pages */
    if (!sync) d->accumulated = true;
    if (d->pool) {
        bool pool = may_pool && sync && !d->accumulated;
        if (!pool && !d->err) d->err = dt_grad_pool_give_back(d->pool);
        d->pooled = pool;
        if (pool && !dt_grad_pool_lent(d->pool) && d->nb && !d->err) d->err = lend(d, 0);
    }
}

void dt_ddp_begin(dt_ddp *d, int sync, float lr) {
    if (sync != DT_MICRO_FORWARD) begin(d, sync, lr, true); /* a forward's: the backward's own begin says what it does */
}

/* Every bucket's exchange settled: a codec's issued and decoded, the optimizer's remaining buckets stepped, every
 * request landed (after a failure too: what is in flight ends before its buffers may go). The first failure. */
static dt_status settle_all(dt_ddp *d, double *waited) {
    dt_status st = d->err;
    for (int k = 0; k < d->issued && !st && d->codec; k++) {
        bool done;
        st = codec_issue(d, k, waited);
        if (!st) st = codec_settle(d, k, true, waited, &done);
    }
    if (d->opt && !st) st = step_buckets(d, true, waited);
    for (int i = 0; i < d->nreqs; i++) {
        bool done;
        dt_status s = settle(d, i, true, waited, &done);
        if (!st) st = s;
    }
    for (int k = 0; k < d->nb; k++) {
        dt_status s = wait_req(&d->b[k].creq, waited);
        if (!st) st = s;
        d->b[k].coded = d->b[k].decoded = false;
    }
    return st;
}

/* The codec's step in r: bytes sent and received, the compression ratio (before its start step every element travels
 * as it is). */
static void codec_figures(dt_ddp *d, dt_sync_result *r) {
    dt_codec_stats cs;
    dt_codec_end_step(d->codec, &cs);
    r->grad_bytes = cs.before ? cs.bytes : (double)d->nparams * sizeof(float);
    r->compress_ratio = cs.after ? (double)cs.before / (double)cs.after : 1.0;
    r->grad_recv_bytes = cs.before ? cs.received : 0;
}

/* The embedding's exchanged rows landed (after a failure st too) and, the step so far good, added; with an optimizer,
 * the rows that waited for them updated, each once. The first failure. */
static dt_status embedding_rows(dt_ddp *d, dt_status st, double *waited) {
    dt_status s = wait_req(&d->tok_req, waited);
    if (!st) st = s;
    if (!st && d->ntok) {
        if (d->g16) st = add_rows_lp(d);
        else add_rows(d);
    }
    if (st || !d->opt || !d->touched) return st;
    size_t C = (size_t)d->emb_t->shape[1];
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "optimizer", "\"embedding_rows\":true");
    for (int i = 0; i < d->ntok * dt_comm_size(d->c); i++) {
        int32_t t = d->toks[i];
        if (d->touched[t]) { update(d, d->emb_t->offset + (size_t)t * C, C); d->touched[t] = 0; }
    }
    DT_TRACE_END(DT_TRACK_COMPUTE);
    return DT_OK;
}

/* The step's counters back to a new step's. */
static void reset_step(dt_ddp *d) {
    d->accumulated = d->pooled = false;
    d->nreqs = d->ntok = d->issued = d->stepped = d->turn = d->retired = 0;
    d->sumsq = 0;
    d->done_n = d->early_n = 0;
    d->err = DT_OK;
}

dt_status dt_ddp_finish(dt_ddp *d, dt_sync_result *r) {
    double waited = d->waited_in_backward;
    r->exposed_in_backward_ms = waited * 1e3;
    d->waited_in_backward = 0;
    dt_status st = settle_all(d, &waited);
    if (d->codec && d->sync) codec_figures(d, r);
    st = embedding_rows(d, st, &waited);
    if (sharded(d) || d->g16) {
        /* everything outside the shard (a 16-bit store: everything), the exchanged embedding rows included */
        dt_status s2 = dt_grad_pool_give_back(d->pool);
        if (!st) st = s2;
        if (zero_in_place(d)) zero_others(d);
        else release_others(d, 0, d->nparams);
    }
    if (!st && d->opt && d->done_n != d->wn)
        st = dt_error(DT_ERR_ARG, "ddp: the optimizer updated %zu of %zu parameters", d->done_n, d->wn);
    r->norm = d->opt ? sqrt(d->sumsq) : -1;
    d->last_early = d->opt && d->wn ? (double)d->early_n / (double)d->wn : 0;
    reset_step(d);
    r->exposed_ms = waited * 1e3;
    return st;
}

int dt_ddp_buckets(const dt_ddp *d) { return d->nb; }

/* the pool's pages as resident (they come when first lent: a run that never pools holds none); a codec's state (its
 * residuals, Qs, velocities: a whole model's worth on every rank, ZeRO's too) and its buckets' buffers */
size_t dt_ddp_buffer_bytes(const dt_ddp *d) {
    return d->rows_cap * sizeof(float) + d->toks_cap * sizeof(int32_t) + dt_grad_pool_resident(d->pool) + dt_codec_state_bytes(d->codec) +
           dt_codec_work_bytes(d->codec);
}

double dt_ddp_updated_in_backward(const dt_ddp *d) { return d->last_early; }

/* h the same on every rank of c (what: whose weights, in the message). */
static dt_status same_hash(dt_comm *c, uint64_t h, const char *what) {
    int np = dt_comm_size(c);
    uint64_t *all = malloc(sizeof *all * (size_t)np);
    if (!all) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    dt_status st = dt_comm_allgather(c, &h, all, 1, DT_I64);
    for (int r = 1; !st && r < np; r++)
        if (all[r] != all[0])
            st = dt_error(DT_ERR_PEER, "the ranks' %s differ after training (rank 0 hashes to %016llx, rank %d to %016llx): "
                          "data parallelism should keep them identical", what, (unsigned long long)all[0], r, (unsigned long long)all[r]);
    free(all);
    return st;
}

dt_status dt_ddp_check_replicas(dt_comm *c, const float *p, size_t n, uint64_t *hash) {
    *hash = dt_hash_words(DT_HASH_INIT, p, n);
    return same_hash(c, *hash, "weights");
}

/* With experts spread over ranks: the tensors of every data-parallel rank agree over all of them (c), each rank's
 * experts over the ranks holding the same ones (ec; *hash: of both, this rank's). p: the store's values, of size
 * bytes each (f32, or a 16-bit copy: an odd tensor's last value a word of its own). */
dt_status dt_ddp_check_groups(dt_comm *c, dt_comm *ec, const dt_model *m, const void *p, size_t size, uint64_t *hash) {
    uint64_t h[2] = { DT_HASH_INIT, DT_HASH_INIT };
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        const char *x = (const char *)p + t->offset * size;
        size_t bytes = t->count * size;
        uint32_t tail = 0;
        memcpy(&tail, x + bytes / 4 * 4, bytes % 4);
        uint64_t *g = &h[t->group == DT_GROUP_EXPERT];
        *g = dt_hash_words(*g, x, bytes / 4);
        if (bytes % 4) *g = dt_hash_words(*g, &tail, 1);
    }
    *hash = h[0] ^ h[1];
    dt_status st = same_hash(c, h[0], "weights (but the experts')");
    return st || !ec ? st : same_hash(ec, h[1], "experts");
}

/* ---- DDP as the engine's strategy ---- */

typedef struct {
    dt_ddp *d;
    const dt_engine_config *c;
    dt_codec *codec;     /* NULL: none */
} strategy;

static dt_status s_create(const dt_engine_config *c, void **state, size_t *off, size_t *n) {
    (void)off; (void)n; /* every rank updates every parameter */
    if (!c->comm) return dt_error(DT_ERR_ARG, "ddp: needs the job's ranks");
    strategy *s = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    s->c = c;
    dt_status st = dt_ddp_create(c->comm, &c->model, c->bucket_first, c->bucket_bytes, NULL, NULL, &s->d);
    if (!st) st = dt_ddp_set_wire(s->d, c->grad_comm);
    if (!st && c->grad_store != DT_F32) st = dt_ddp_set_grad_store(s->d, c->grad_store, 0, c->model.nparams);
    if (!st && c->ep > 1) st = dt_ddp_set_experts(s->d, c->expert_comm, c->ep);
    if (!st && c->grad_store == DT_F32) st = dt_ddp_leave_out_tied_copy(s->d);
    if (!st && c->codec && c->codec->kind != DT_CODEC_NONE) st = dt_codec_create(c->codec, c->model.tensors, c->model.ntensors, &s->codec);
    if (!st && s->codec) st = dt_ddp_set_codec(s->d, s->codec);
    if (st) { dt_ddp_destroy(s->d); dt_codec_destroy(s->codec); free(s); return st; }
    *state = s;
    return DT_OK;
}

static void s_destroy(void *state) {
    strategy *s = state;
    dt_ddp_destroy(s->d);
    dt_codec_destroy(s->codec);
    free(s);
}

/* The update bucket by bucket inside backward, unless the engine's rule (dt_engine_updates_in_backward) puts it after. */
static dt_status s_attach(void *state, dt_optim *o) {
    strategy *s = state;
    if (s->c->step_at_end) return DT_OK;
    return dt_ddp_set_optimizer(s->d, o, s->c->model.params(s->c->model.self), 0, s->c->model.nparams);
}

static void s_begin(void *state, int sync, float lr) { dt_ddp_begin(((strategy *)state)->d, sync, lr); }

static dt_status s_finish(void *state, dt_sync_result *r) {
    strategy *s = state;
    dt_status st = dt_ddp_finish(s->d, r);
    r->updated = s->d->opt != NULL;
    r->updated_in_backward = dt_ddp_updated_in_backward(s->d);
    return st;
}

static dt_status s_check(void *state, uint64_t *hash) {
    strategy *s = state;
    const dt_model *m = &s->c->model;
    if (s->c->ep > 1) return dt_ddp_check_groups(s->c->comm, s->c->expert_comm, m, m->params(m->self), sizeof(float), hash);
    return dt_ddp_check_replicas(s->c->comm, m->params(m->self), m->nparams, hash);
}

static dt_codec *s_codec(void *state) { return ((strategy *)state)->codec; }

static size_t s_buffers(void *state) { return dt_ddp_buffer_bytes(((strategy *)state)->d); }

static uint16_t *s_grads_lp(void *state, dt_dtype *t) { return dt_ddp_grad_store(((strategy *)state)->d, t); }

/* A 16-bit store: what the ranks hold of the gradients, measured (else the whole f32 store, the engine's default). */
static void s_held(void *state, size_t *params, size_t *grads) {
    (void)params;
    dt_dtype t;
    strategy *s = state;
    if (dt_ddp_grad_store(s->d, &t)) *grads = dt_ddp_grads_held(s->d);
}

const dt_strategy dt_strategy_ddp = {
    .name = "ddp", .create = s_create, .destroy = s_destroy, .attach = s_attach, .begin = s_begin,
    .finish = s_finish, .check_replicas = s_check, .buffer_bytes = s_buffers, .held = s_held, .grads_lp = s_grads_lp,
    .codec = s_codec,
};
