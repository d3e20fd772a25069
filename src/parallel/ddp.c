/* Data parallelism: every rank holds the whole model, computes gradients on
 * its part of the global batch, and the gradients are averaged by allreduce
 * before the optimizer, so every rank takes the same step.
 *
 * The gradients live in the shared arena (zero-copy allreduce). Backward
 * produces them unit by unit (final LayerNorm, blocks L-1..0, embeddings);
 * units are grouped into buckets, small first so communication starts early,
 * then up to a cap. In llm.c's flat order a block's gradients are spread over
 * 12 tensors, so a bucket is a list of ranges, each allreduced in place. The
 * moment backward reports a bucket's last unit, its allreduces go to the
 * communicator's progress thread and run while backward continues. */
#include "dtrain/parallel.h"

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
    dt_gpt2 *m;
    float *grads;        /* arena */
    bucket *b;
    int nb;
    dt_request **reqs;
    int nreqs, reqcap;
    int sync;
    dt_status err;
};

/* Ranges of gradient unit u (L: final LayerNorm; 0..L-1: block; -1: embeddings). */
static int unit_ranges(const dt_gpt2 *m, int u, range *out) {
    int L = dt_gpt2_get_config(m)->num_layers, n = 0;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        size_t off, cnt;
        dt_gpt2_tensor(m, i, NULL, &off, &cnt);
        bool per_layer = i >= 2 && i < 14;
        if (u == L && (i == 14 || i == 15)) out[n++] = (range){ off, cnt };
        else if (u == -1 && (i == 0 || i == 1)) out[n++] = (range){ off, cnt };
        else if (u >= 0 && u < L && per_layer) out[n++] = (range){ off + (size_t)u * (cnt / L), cnt / L };
    }
    return n;
}

static void on_grads(int unit, void *ctx) {
    dt_ddp *d = ctx;
    if (!d->sync || d->err) return;
    for (int k = 0; k < d->nb; k++) {
        if (d->b[k].last_unit != unit) continue;
        for (int r = 0; r < d->b[k].nranges; r++) {
            if (d->nreqs == d->reqcap) {
                d->reqcap = d->reqcap ? d->reqcap * 2 : 256;
                d->reqs = realloc(d->reqs, sizeof *d->reqs * (size_t)d->reqcap);
            }
            float *p = d->grads + d->b[k].ranges[r].off;
            dt_status st = dt_comm_iallreduce(d->c, p, p, d->b[k].ranges[r].count, DT_F32, DT_AVG, &d->reqs[d->nreqs]);
            if (st) { d->err = st; return; }
            d->nreqs++;
        }
    }
}

dt_status dt_ddp_create(dt_comm *c, dt_gpt2 *m, size_t bucket_first, size_t bucket_bytes, dt_ddp **out) {
    *out = NULL;
    dt_ddp *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    d->c = c;
    d->m = m;
    size_t n = dt_gpt2_num_params(m);
    dt_status st = dt_comm_alloc(c, n * sizeof(float), (void **)&d->grads);
    if (st) { free(d); return st; }
    dt_gpt2_set_grad_storage(m, d->grads);
    int L = dt_gpt2_get_config(m)->num_layers;
    d->b = calloc((size_t)L + 2, sizeof *d->b);
    /* units in backward order: L, L-1, ..., 0, -1 */
    range tmp[DT_GPT2_NTENSORS];
    size_t have = 0, cap = bucket_first;
    bucket *cur = NULL;
    for (int u = L; u >= -1; u--) {
        int nr = unit_ranges(m, u, tmp);
        if (!cur) { cur = &d->b[d->nb++]; have = 0; }
        cur->ranges = realloc(cur->ranges, sizeof(range) * (size_t)(cur->nranges + nr));
        for (int r = 0; r < nr; r++) { cur->ranges[cur->nranges++] = tmp[r]; have += tmp[r].count * sizeof(float); }
        cur->last_unit = u;
        if (have >= cap) { cur = NULL; cap = bucket_bytes; }
    }
    dt_gpt2_set_grad_hook(m, on_grads, d);
    d->sync = 1;
    *out = d;
    return DT_OK;
}

void dt_ddp_destroy(dt_ddp *d) {
    if (!d) return;
    dt_gpt2_set_grad_hook(d->m, NULL, NULL);
    dt_gpt2_set_grad_storage(d->m, NULL);
    for (int k = 0; k < d->nb; k++) free(d->b[k].ranges);
    free(d->b);
    free(d->reqs);
    dt_comm_free(d->c, d->grads);
    free(d);
}

void dt_ddp_begin(dt_ddp *d, int sync) { d->sync = sync; }

dt_status dt_ddp_finish(dt_ddp *d, double *exposed_ms) {
    double t0 = dt_time_now();
    dt_status st = d->err;
    for (int i = 0; i < d->nreqs; i++) {
        dt_status s = dt_wait(d->reqs[i]);
        if (!st) st = s;
    }
    d->nreqs = 0;
    d->err = DT_OK;
    if (exposed_ms) *exposed_ms = (dt_time_now() - t0) * 1e3;
    return st;
}

int dt_ddp_buckets(const dt_ddp *d) { return d->nb; }
