/* 0/1 Adam (Lu et al. 2022, "Maximizing communication efficiency for large-scale training via 0/1 Adam", as DeepSpeed's
 * ZeroOneAdam runs it), the codec's side: which steps exchange what (dt_codec_zeroone_at) and the exchanges, each by
 * codec_signs.c's two-stage sign allreduce with error feedback. The optimizer's side (the momentum-only and local
 * steps, the interval's end) is dt_optim_zeroone's.
 *
 *   steps 1..start: the variance is updated at steps 1, 2, .., kappa, then every 2nd step kappa times, every 4th, ..
 *   (var_scaler: kappa); there the gradient is averaged whole (one allreduce), elsewhere in one bit an entry, and the
 *   momentum takes it;
 *   past start: no exchange. Each rank steps from its own gradient and adds each step's lr/bc1 m to u; every interval
 *   (1 step, then 2, 4, .. up to local_clip, local_scaler steps at each) u is averaged in one bit an entry and every
 *   rank's weights and momentum are made one from it. The error buffers start from zero at the first local step
 *   (DeepSpeed's too: they held gradients' errors, now accumulations').
 *
 * Where DeepSpeed's differs: it does no bias correction (here AdamW's: bc1 from the steps, bc2 from the variance's
 * updates, so that with every step a variance step 0/1 Adam is AdamW exactly), and it undoes the interval's local
 * steps by subtracting them again, which leaves each rank's weights off by its own rounding; here the interval's start
 * is kept and the weights are made from it, the same bits on every rank. */
#include "codec_signs.h"

#include <string.h>

static dt_status check(const dt_codec_config *c) {
    if (c->start < 1)
        return dt_error(DT_ERR_ARG, "--compress zeroone --compress-start %d: 0/1 Adam's last step that updates the variance "
                        "(DeepSpeed's var_freeze_step): 1 or more", c->start);
    if (c->var_scaler < 1 || c->local_scaler < 1 || c->local_clip < 1)
        return dt_error(DT_ERR_ARG, "--compress zeroone: --compress-var-scaler %d, --compress-local-scaler %d and --compress-local-clip %d "
                        "must each be 1 or more", c->var_scaler, c->local_scaler, c->local_clip);
    return DT_OK;
}

static size_t state_floats(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s) {
    (void)c;
    return s == DT_CODEC_RESIDUAL || s == DT_CODEC_SERVER ? t->count : 0;
}

void dt_codec_zeroone_at(const dt_codec_config *c, long t, dt_zeroone_step *out) {
    *out = (dt_zeroone_step){ 0 };
    long last = t < c->start ? t : c->start, interval = 1;
    int counter = 0;
    /* the variance's steps: each the next multiple of the interval, which doubles after var_scaler of them */
    for (long v = 1; v <= last; v = (v / interval + 1) * interval) {
        out->nvar++;
        out->variance = v == t;
        if (++counter == c->var_scaler) counter = 0, interval *= 2;
    }
    if (t <= c->start) return;
    out->local = 1;
    long j = (t - c->start - 1) / c->local_scaler; /* the local interval's doublings so far */
    long every = 1;
    while (j-- > 0 && every < c->local_clip) every *= 2;
    if (every > c->local_clip) every = c->local_clip;
    out->sync = t % every == 0;
}

void dt_codec_zeroone_mix(const dt_codec_config *c, long steps, long *whole, long *signs) {
    long last = steps < c->start ? steps : c->start;
    dt_zeroone_step z;
    dt_codec_zeroone_at(c, last, &z); /* its nvar: the variance's steps up to the last before the local phase */
    *whole = last > 0 ? z.nvar : 0, *signs = last > 0 ? last - z.nvar : 0;
    /* local steps by stretches of local_scaler, the interval doubling at each up to the clip (then one stretch to the
     * end): the multiples of the interval in each */
    long every = 1, clip = c->local_clip > 1 ? c->local_clip : 1;
    for (long a = c->start + 1; a <= steps; every = every * 2 < clip ? every * 2 : clip) {
        long b = every >= clip || steps - a < c->local_scaler ? steps : a + c->local_scaler - 1;
        *signs += b / every - (a - 1) / every;
        a = b + 1;
    }
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    dt_signs_bucket *p;
    dt_status st = dt_signs_bucket_at(k, comm, b, idx, n, first, &p);
    if (st) return st;
    dt_zeroone_step z;
    dt_codec_zeroone_at(&k->c, (long)k->steps + 1, &z);
    for (int i = 0; i < n; i++) {
        size_t ne;
        float *ew = dt_codec_state(k, idx[i], DT_CODEC_RESIDUAL, &ne), *es = dt_codec_state(k, idx[i], DT_CODEC_SERVER, &ne);
        if (!ew || !es) return dt_error(DT_ERR_NOMEM, "zeroone: out of memory");
        if (z.local && k->steps == k->c.start) memset(ew, 0, ne * sizeof *ew), memset(es, 0, ne * sizeof *es);
        k->now.before += k->t[idx[i]].count;
    }
    if (z.local) {
        p->phase = DT_SIGNS_NONE;
        return DT_OK;
    }
    if (z.variance) {
        p->phase = DT_SIGNS_WHOLE;
        return dt_signs_dense(k, p, comm, g, req);
    }
    for (int i = 0; i < p->n; i++) memcpy(p->dense + p->at[i], g + k->t[p->t[i]].offset, k->t[p->t[i]].count * sizeof *g);
    p->phase = DT_SIGNS_ALLTOALL;
    return dt_signs_send(k, p, comm, req);
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    dt_signs_bucket *p;
    dt_status st = dt_signs_next(k, comm, b, req, &p);
    if (st || !p) return st;
    int np = dt_comm_size(comm);
    for (int i = 0; i < p->n && p->phase != DT_SIGNS_NONE; i++) {
        float *x = g + k->t[p->t[i]].offset;
        const float *d = p->dense + p->at[i];
        size_t ne = p->at[i + 1] - p->at[i];
        if (p->phase == DT_SIGNS_WHOLE)
            for (size_t j = 0; j < ne; j++) x[j] = d[j] / (float)np;
        else
            memcpy(x, d, ne * sizeof *x);
    }
    p->phase = DT_SIGNS_IDLE;
    *done = 1;
    return DT_OK;
}

/* One bucket's piece of u through the sign allreduce, waiting at each stage. */
static dt_status sync_bucket(dt_codec *k, dt_signs_bucket *p, float *u) {
    for (int i = 0; i < p->n; i++) memcpy(p->dense + p->at[i], u + k->t[p->t[i]].offset, k->t[p->t[i]].count * sizeof *u);
    dt_request *r = NULL;
    dt_status st = dt_signs_send(k, p, k->comm, &r);
    if (!st) st = dt_wait(r);
    if (!st) st = dt_signs_serve(k, p, k->comm, &r);
    if (!st) st = dt_wait(r);
    if (st) return st;
    dt_signs_decode(p, dt_comm_size(k->comm));
    for (int i = 0; i < p->n; i++) memcpy(u + k->t[p->t[i]].offset, p->dense + p->at[i], k->t[p->t[i]].count * sizeof *u);
    return DT_OK;
}

dt_status dt_codec_zeroone_sync(dt_codec *k, float *u, dt_codec_stats *s) {
    dt_signs_set *z = k->impl;
    if (k->c.kind != DT_CODEC_ZEROONE || !k->comm) return dt_error(DT_ERR_ARG, "zeroone: no step exchanged yet, nothing to average");
    dt_codec_stats was = k->now; /* the step's figures were taken: the sync's own go to *s */
    k->now = (dt_codec_stats){ 0, 0, 0, 0 };
    dt_status st = DT_OK;
    for (int b = 0; b < z->nb && !st; b++)
        if (z->b[b].dense) {
            k->now.before += z->b[b].len;
            st = sync_bucket(k, &z->b[b], u);
        }
    s->before += k->now.before, s->after += k->now.after, s->bytes += k->now.bytes;
    k->now = was;
    return st;
}

const dt_codec_ops dt_codec_zeroone = {
    .impl_size = sizeof(dt_signs_set), .own_warmup = 1, .check = check, .state_floats = state_floats, .start = start, .next = next,
    .next_collective = dt_signs_next_collective, .destroy = dt_signs_destroy, .work = dt_signs_work, .work_for = dt_signs_work_for,
};
