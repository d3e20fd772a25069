/* Data parallelism: every rank holds the whole model, computes gradients on
 * its part of the global batch, and the gradients are averaged by allreduce
 * before the optimizer, so every rank takes the same step.
 *
 * The gradients live in the shared arena (zero-copy allreduce). Backward
 * produces them unit by unit (wte's LM-head part, final LayerNorm, blocks
 * L-1..0, wpe); units are grouped into buckets, small first so communication
 * starts early, then up to a cap. In llm.c's flat order a block's gradients are spread over
 * 12 tensors, so a bucket is a list of ranges, each allreduced in place. The
 * moment backward reports a bucket's last unit, its allreduces go to the
 * communicator's progress thread and run while backward continues.
 *
 * wte is the largest tensor (a third of GPT-2 124M) and would be final only
 * after the very last kernel of backward, leaving its allreduce exposed.
 * Its gradient has two parts: the LM head's (dense, known first) and the
 * embedding's (only the B*T rows of this micro-batch's tokens). So the model
 * leaves the rows out, wte is averaged as soon as the LM head is done, and at
 * the end the ranks exchange their B*T rows and tokens (an allgather, ~1% of
 * wte's size) and add everyone's rows / N, in rank order, on every rank. */
#include "dtrain/parallel.h"
#include "dtrain/kernels.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef struct { size_t off, count; } range;

typedef struct {
    int last_unit;       /* issue when backward reports this unit */
    range *ranges;
    int nranges;
} bucket;

struct dt_ddp {
    dt_comm *c;
    dt_gpt2 *m;          /* NULL for models that bring their own ranges */
    float *grads;        /* arena */
    bucket *b;
    int nb;
    range *all;          /* every bucket's ranges, bucket after bucket */
    int nall;
    dt_request **reqs;
    int nreqs, reqcap;
    int sync;
    dt_status err;
    float *rows;         /* arena: per rank, ntok x C row gradients then ntok tokens; then this rank's to send */
    size_t rows_cap;     /* floats per rank */
    int ntok;            /* tokens of the micro-batch whose rows are in flight */
};

/* Ranges of gradient unit u (L+1: wte; L: final LayerNorm; 0..L-1: block; -1: wpe). */
static int unit_ranges(const dt_gpt2 *m, int u, dt_grad_range *out) {
    int L = dt_gpt2_get_config(m)->num_layers, n = 0;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        size_t off, cnt;
        dt_gpt2_tensor(m, i, NULL, &off, &cnt);
        bool per_layer = i >= 2 && i < 14;
        if (u == L + 1 && i == 0) out[n++] = (dt_grad_range){ u, off, cnt };
        else if (u == L && (i == 14 || i == 15)) out[n++] = (dt_grad_range){ u, off, cnt };
        else if (u == -1 && i == 1) out[n++] = (dt_grad_range){ u, off, cnt };
        else if (u >= 0 && u < L && per_layer) out[n++] = (dt_grad_range){ u, off + (size_t)u * (cnt / L), cnt / L };
    }
    return n;
}

static dt_request **next_request(dt_ddp *d) {
    if (d->nreqs == d->reqcap) {
        int cap = d->reqcap ? d->reqcap * 2 : 256;
        dt_request **r = realloc(d->reqs, sizeof *r * (size_t)cap);
        if (!r) return NULL;
        d->reqs = r;
        d->reqcap = cap;
    }
    return &d->reqs[d->nreqs];
}

/* Unit -1: this rank's embedding rows, already divided by N, and its tokens
 * go to every rank. */
static dt_status send_rows(dt_ddp *d) {
    const int32_t *tok;
    int n;
    const float *dx = dt_gpt2_input_grad(d->m, &tok, &n);
    int C = dt_gpt2_get_config(d->m)->channels, p = dt_comm_size(d->c);
    size_t per = (size_t)n * C + (size_t)n;
    if (per > d->rows_cap) {
        dt_comm_free(d->c, d->rows);
        d->rows = NULL;
        d->rows_cap = 0;
        dt_status st = dt_comm_alloc(d->c, per * (size_t)(p + 1) * sizeof(float), (void **)&d->rows);
        if (st) return st;
        d->rows_cap = per;
    }
    float *mine = d->rows + (size_t)p * per, inv = 1.0f / (float)p;
    for (size_t i = 0; i < (size_t)n * C; i++) mine[i] = dx[i] * inv;
    memcpy(mine + (size_t)n * C, tok, (size_t)n * sizeof(int32_t));
    d->ntok = n;
    dt_request **r = next_request(d);
    if (!r) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    dt_status st = dt_comm_iallgather(d->c, mine, d->rows, per, DT_F32, r);
    if (!st) d->nreqs++;
    return st;
}

/* After every request: wte (averaged) += every rank's rows, in rank order
 * (wte is tensor 0, at offset 0 of the store). */
static void add_rows(dt_ddp *d) {
    int C = dt_gpt2_get_config(d->m)->channels, p = dt_comm_size(d->c), n = d->ntok;
    size_t per = (size_t)n * C + (size_t)n;
    for (int r = 0; r < p; r++) {
        const float *dx = d->rows + (size_t)r * per;
        dt_embedding_backward(d->grads, NULL, dx, (const int32_t *)(dx + (size_t)n * C), 1, n, C);
    }
    d->ntok = 0;
}

void dt_ddp_grad_hook(int unit, void *ctx) {
    dt_ddp *d = ctx;
    if (!d->sync || d->err) return;
    for (int k = 0; k < d->nb; k++) {
        if (d->b[k].last_unit != unit) continue;
        for (int r = 0; r < d->b[k].nranges; r++) {
            dt_request **req = next_request(d);
            if (!req) { d->err = dt_error(DT_ERR_NOMEM, "ddp: out of memory"); return; }
            float *p = d->grads + d->b[k].ranges[r].off;
            dt_status st = dt_comm_iallreduce(d->c, p, p, d->b[k].ranges[r].count, DT_F32, DT_AVG, req);
            if (st) { d->err = st; return; }
            d->nreqs++;
        }
    }
    if (unit == -1 && d->m) d->err = send_rows(d);
}

dt_status dt_ddp_create_ranges(dt_comm *c, size_t nparams, const dt_grad_range *r, int nr, size_t bucket_first,
                               size_t bucket_bytes, dt_ddp **out) {
    *out = NULL;
    dt_ddp *d = calloc(1, sizeof *d);
    bucket *b = calloc((size_t)nr + 1, sizeof *b);
    range *all = calloc((size_t)nr + 1, sizeof *all);
    if (!d || !b || !all) { free(d); free(b); free(all); return dt_error(DT_ERR_NOMEM, "ddp: out of memory"); }
    d->c = c;
    d->b = b;
    d->all = all;
    d->sync = 1;
    dt_status st = dt_comm_alloc(c, nparams * sizeof(float), (void **)&d->grads);
    if (st) { dt_ddp_destroy(d); return st; }
    /* Buckets close at a unit boundary once they hold their cap. Each
     * bucket's ranges are a run of `all`; block l's slice of a tensor ends
     * where block l+1's begins, so those merge into one range. */
    size_t have = 0, cap = bucket_first;
    bucket *cur = NULL;
    for (int i = 0; i < nr; i++) {
        if (!cur) { cur = &d->b[d->nb++]; cur->ranges = all + d->nall; have = 0; }
        have += r[i].count * sizeof(float);
        int j = 0;
        while (j < cur->nranges && r[i].off + r[i].count != cur->ranges[j].off) j++;
        if (j < cur->nranges) { cur->ranges[j].off = r[i].off; cur->ranges[j].count += r[i].count; }
        else { cur->ranges[cur->nranges++] = (range){ r[i].off, r[i].count }; d->nall++; }
        cur->last_unit = r[i].unit;
        bool unit_ends = i + 1 == nr || r[i + 1].unit != r[i].unit;
        if (unit_ends && have >= cap) { cur = NULL; cap = bucket_bytes; }
    }
    *out = d;
    return DT_OK;
}

float *dt_ddp_grads(dt_ddp *d) { return d->grads; }


dt_status dt_ddp_create(dt_comm *c, dt_gpt2 *m, size_t bucket_first, size_t bucket_bytes, dt_ddp **out) {
    *out = NULL;
    int L = dt_gpt2_get_config(m)->num_layers, nr = 0;
    dt_grad_range *r = calloc((size_t)(L + 3) * DT_GPT2_NTENSORS, sizeof *r);
    if (!r) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    for (int u = L + 1; u >= -1; u--) nr += unit_ranges(m, u, r + nr); /* backward's order */
    dt_status st = dt_ddp_create_ranges(c, dt_gpt2_num_params(m), r, nr, bucket_first, bucket_bytes, out);
    free(r);
    if (st) return st;
    dt_ddp *d = *out;
    d->m = m;
    dt_gpt2_set_grad_storage(m, d->grads);
    dt_gpt2_set_grad_hook(m, dt_ddp_grad_hook, d);
    dt_ddp_begin(d, 1);
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d) return;
    if (d->m) {
        dt_gpt2_set_grad_hook(d->m, NULL, NULL);
        dt_gpt2_set_defer_wte_rows(d->m, 0);
        dt_gpt2_set_grad_storage(d->m, NULL);
    }
    dt_comm_free(d->c, d->rows);
    free(d->all);
    free(d->b);
    free(d->reqs);
    dt_comm_free(d->c, d->grads);
    free(d);
}

void dt_ddp_begin(dt_ddp *d, int sync) {
    d->sync = sync;
    /* micro-steps that do not synchronise accumulate the rows as usual */
    if (d->m) dt_gpt2_set_defer_wte_rows(d->m, sync);
}

dt_status dt_ddp_finish(dt_ddp *d, double *exposed_ms) {
    double t0 = dt_time_now();
    dt_status st = d->err;
    for (int i = 0; i < d->nreqs; i++) {
        dt_status s = dt_wait(d->reqs[i]);
        if (!st) st = s;
    }
    if (!st && d->ntok) add_rows(d);
    d->nreqs = 0;
    d->ntok = 0;
    d->err = DT_OK;
    if (exposed_ms) *exposed_ms = (dt_time_now() - t0) * 1e3;
    return st;
}

int dt_ddp_buckets(const dt_ddp *d) { return d->nb; }
