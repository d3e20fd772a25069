/* Context parallelism as a model calls it (dt_cp_ops): attention over a
 * group by the ring (ring_attention.c) or by all-to-all (ulysses.c), with
 * the work space they need, grown to the largest call. The model passes its
 * rows a sequence; the group's size makes the whole sequence. */
#include "dtrain/context.h"
#include "dtrain/base.h"

#include <stdlib.h>

struct dt_cp {
    dt_comm *comm;
    dt_cp_impl impl;
    dt_pp_wire wire;
    dt_cp_ops ops;
    float *work;
    size_t cap;
    double seconds, waited;
};

int dt_cp_ranks(const dt_cp_config *c) { return c->cp ? dt_comm_size(c->cp) : c->ranks; }

const char *dt_cp_impl_name(dt_cp_impl i) { return i == DT_CP_ULYSSES ? "ulysses" : "ring"; }

dt_cp_impl dt_cp_choose(int n, int heads, int tl, double flops, double link, double mem) {
    if (n < 2 || heads % n) return DT_CP_RING;
    double pass = 8.0 * tl / link, fwd = 2.0 * tl * tl / flops, bwd = 5.0 * tl * tl / flops; /* seconds a channel */
    double over_f = pass > fwd ? pass - fwd : 0, over_b = pass > bwd ? pass - bwd : 0;
    double ring = (n - 1) * (over_f + 2 * over_b) + pass + 24.0 * n * tl / mem, alltoall = 48.0 * (n - 1) / n * tl / link;
    return alltoall < ring ? DT_CP_ULYSSES : DT_CP_RING;
}

static dt_status prepare(dt_cp *c, dt_cp_config *rc, int B, int T, int C, int NH) {
    *rc = (dt_cp_config){ c->comm, B, T * dt_comm_size(c->comm), C, NH, &c->waited, c->wire, 0 };
    size_t need = c->impl == DT_CP_ULYSSES ? dt_ulysses_work_floats(rc) : dt_ring_work_floats(rc);
    if (need <= c->cap) return DT_OK;
    dt_free_aligned(c->work);
    c->cap = 0;
    if (!(c->work = dt_alloc_aligned(need * sizeof(float))))
        return dt_error(DT_ERR_NOMEM, "context parallelism: no memory for %zu floats of attention work space", need);
    c->cap = need;
    return DT_OK;
}

static dt_status cp_forward(void *ctx, float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    dt_cp *c = ctx;
    dt_cp_config rc;
    double t0 = dt_time_now();
    dt_status st = prepare(c, &rc, B, T, C, NH);
    if (!st) st = c->impl == DT_CP_ULYSSES ? dt_ulysses_attention_forward(&rc, out, lse, qkv, c->work)
                                           : dt_ring_attention_forward(&rc, out, lse, qkv, c->work);
    c->seconds += dt_time_now() - t0;
    return st;
}

static dt_status cp_backward(void *ctx, float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse, int B,
                             int T, int C, int NH) {
    dt_cp *c = ctx;
    dt_cp_config rc;
    double t0 = dt_time_now();
    dt_status st = prepare(c, &rc, B, T, C, NH);
    if (!st) st = c->impl == DT_CP_ULYSSES ? dt_ulysses_attention_backward(&rc, dqkv, dout, out, qkv, lse, c->work)
                                           : dt_ring_attention_backward(&rc, dqkv, dout, out, qkv, lse, c->work);
    c->seconds += dt_time_now() - t0;
    return st;
}

dt_status dt_cp_create(dt_comm *cp, dt_cp_impl impl, dt_pp_wire wire, dt_cp **out) {
    *out = NULL;
    dt_cp *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ERR_NOMEM, "context parallelism: out of memory");
    c->comm = cp;
    c->impl = impl;
    c->wire = wire;
    c->ops = (dt_cp_ops){ c, cp_forward, cp_backward };
    *out = c;
    return DT_OK;
}

void dt_cp_destroy(dt_cp *c) {
    if (!c) return;
    dt_free_aligned(c->work);
    free(c);
}

const dt_cp_ops *dt_cp_model_ops(dt_cp *c) { return &c->ops; }

double dt_cp_attention_seconds(dt_cp *c, double *waited) {
    double s = c->seconds;
    *waited = c->waited;
    c->seconds = c->waited = 0;
    return s;
}
