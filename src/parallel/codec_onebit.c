/* 1-bit Adam (Tang et al. 2021, as DeepSpeed's OnebitAdam runs it): Adam for the first c->start steps, then Adam's
 * variance frozen and its momentum, not the gradient, averaged in one bit an entry by an error-compensated two-stage
 * allreduce. Per bucket (its tensors' entries in the bucket's order, n of them, split into p chunks, chunk j reduced by
 * rank j):
 *
 *   warm-up (step < start): the gradients averaged whole (one allreduce); m = b1 m + (1 - b1) g, as Adam's, kept here
 *   (the optimizer keeps its own: Adam's update);
 *   after: x = b1 m + (1 - b1) g_local + e_w (the worker error); each entry sent as its sign (0 counts as +) times
 *   its segment's scale s = |x_seg| / sqrt(n_seg), e_w = x - that; one alltoall of [the scales | the signs] of chunk j
 *   to rank j; rank j adds every rank's chunk in rank order, divides by p and adds its server error e_s: y, sent the
 *   same way (e_s = y - what is sent); one allgather of every rank's chunk: m, the same on every rank, goes to the
 *   gradient's place, where the optimizer (dt_optim_freeze_variance) takes it as Adam's momentum.
 *
 * A segment is a tensor's part of a chunk: a scale per tensor, not DeepSpeed's one over the whole buffer, since the
 * tensors' momenta differ by orders of magnitude and Adam divides each by its own variance: with one scale a bucket
 * (2 layers, 64 wide, on the KJV text, frozen after 10 steps) the loss left dense Adam's at once and diverged; a scale a tensor
 * stayed near it. Each rank's m, e_w and e_s are per-tensor state (e_s full size, used on the rank's chunks only), so
 * checkpoints keep them and resume bit for bit. The exchange itself is codec_signs.c's. */
#include "codec_signs.h"

static dt_status check(const dt_codec_config *c) {
    if (c->start < 1)
        return dt_error(DT_ERR_ARG, "--compress onebit --compress-start %d: 1-bit Adam freezes Adam's variance after a warm-up of "
                        "whole-gradient Adam steps: --compress-start N, N 1 or more (DeepSpeed's freeze_step)", c->start);
    if (!(c->beta1 >= 0 && c->beta1 < 1)) return dt_error(DT_ERR_ARG, "--compress onebit: beta1 %g must be in [0, 1)", c->beta1);
    return DT_OK;
}

static size_t state_floats(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s) {
    (void)c;
    return s == DT_CODEC_RESIDUAL || s == DT_CODEC_VELOCITY || s == DT_CODEC_SERVER ? t->count : 0;
}

/* x = b1 m + (1 - b1) g into dense, sent as signs with e_w. */
static dt_status worker(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, const float *g, dt_request **req) {
    float b1 = k->c.beta1;
    for (int i = 0; i < p->n; i++) {
        const dt_tensor_info *t = &k->t[p->t[i]];
        const float *m = dt_codec_state_held(k, p->t[i], DT_CODEC_VELOCITY);
        float *x = p->dense + p->at[i];
        for (size_t j = 0; j < t->count; j++) x[j] = b1 * m[j] + (1.0f - b1) * g[t->offset + j];
    }
    p->phase = DT_SIGNS_ALLTOALL;
    return dt_signs_send(k, p, comm, req);
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    dt_signs_bucket *p;
    dt_status st = dt_signs_bucket_at(k, comm, b, idx, n, first, &p);
    if (st) return st;
    for (int i = 0; i < n; i++) {
        size_t ne;
        for (dt_codec_state_kind x = DT_CODEC_RESIDUAL; x < DT_CODEC_NSTATES; x++)
            if (x != DT_CODEC_Q && !dt_codec_state(k, idx[i], x, &ne)) return dt_error(DT_ERR_NOMEM, "onebit: out of memory");
        k->now.before += k->t[idx[i]].count;
    }
    if (k->steps >= k->c.start) return worker(k, p, comm, g, req);
    p->phase = DT_SIGNS_WHOLE; /* the warm-up */
    return dt_signs_dense(k, p, comm, g, req);
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    dt_signs_bucket *p;
    dt_status st = dt_signs_next(k, comm, b, req, &p);
    if (st || !p) return st;
    int np = dt_comm_size(comm);
    float b1 = k->c.beta1;
    for (int i = 0; i < p->n; i++) {
        float *m = dt_codec_state_held(k, p->t[i], DT_CODEC_VELOCITY), *x = g + k->t[p->t[i]].offset;
        const float *d = p->dense + p->at[i];
        size_t ne = p->at[i + 1] - p->at[i];
        if (p->phase == DT_SIGNS_WHOLE) /* the warm-up: the average, and Adam's momentum of it */
            for (size_t j = 0; j < ne; j++) x[j] = d[j] / (float)np, m[j] = b1 * m[j] + (1.0f - b1) * x[j];
        else
            for (size_t j = 0; j < ne; j++) x[j] = m[j] = d[j];
    }
    p->phase = DT_SIGNS_IDLE;
    *done = 1;
    return DT_OK;
}

const dt_codec_ops dt_codec_onebit = {
    .impl_size = sizeof(dt_signs_set), .own_warmup = 1, .check = check, .state_floats = state_floats, .start = start, .next = next,
    .next_collective = dt_signs_next_collective, .destroy = dt_signs_destroy, .work = dt_signs_work, .work_for = dt_signs_work_for,
};
