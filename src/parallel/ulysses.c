/* All-to-all attention over a context-parallel group (DeepSpeed-Ulysses;
 * see context.h). Each rank holds its rows of every head; attention needs
 * every row of a head. One all-to-all makes the trade: rank j gets heads
 * [j h, (j+1) h) of everyone's rows, puts them in sequence order, attends
 * over the whole sequence with the one-process kernel, and a second
 * all-to-all sends each row home. Four all-to-alls carry backward: the
 * queries, keys, values and output are traded again rather than kept,
 * which would double attention's memory on every rank. On a coded wire
 * (--cp-wire bf16, int8) every trade travels coded, forward and back. */
#include "dtrain/context.h"
#include "dtrain/kernels.h"

#include <stdint.h>
#include <string.h>

typedef struct {
    dt_comm *comm;
    double *waited;
    int N, B, Tl, T, C, cc; /* ranks, sequences, rows here, positions, channels, channels a rank's heads hold */
    dt_pp_wire wire;        /* what travels: f32, or each block coded (bf16; int8 with a scale a row of cc) */
    uint32_t *coded;        /* a coded wire's blocks out, then in (NULL on f32) */
} trade;

/* One rank's [B, Tl, C] in floats. */
static size_t per_rank(const dt_cp_config *c) { return (size_t)c->B * (size_t)(c->T / dt_cp_ranks(c)) * (size_t)c->C; }

/* Words of a coded wire's blocks, out and in, for the largest trade (q, k and v: 3 C of a row, cc a block's row). */
static size_t coded_words(const dt_cp_config *c) {
    int N = dt_cp_ranks(c);
    return c->wire == DT_PP_WIRE_F32 ? 0 : 2 * (size_t)N * dt_pp_wire_words(c->wire, 3 * per_rank(c) / (size_t)N, (size_t)(c->C / N));
}

static trade trade_of(const dt_cp_config *c, float *work) {
    int N = dt_comm_size(c->cp);
    uint32_t *coded = c->wire == DT_PP_WIRE_F32 ? NULL : (uint32_t *)(work + 14 * per_rank(c));
    return (trade){ c->cp, c->waited, N, c->B, c->T / N, c->T, c->C, c->C / N, c->wire, coded };
}

static dt_status check(const dt_cp_config *c) {
    int N = dt_comm_size(c->cp);
    if (c->NH % N || c->C % N || c->T % (2 * N))
        return dt_error(DT_ERR_ARG, "all-to-all attention over %d ranks: %d heads, %d channels, %d positions (each must split %d ways, "
                        "the positions into %d chunks)", N, c->NH, c->C, c->T, N, 2 * N);
    return DT_OK;
}

size_t dt_ulysses_work_floats(const dt_cp_config *c) {
    /* two trade buffers and the gathered q, k, v (3 each), its output and output gradient, their gradient (3); a coded
     * wire's blocks past them */
    return 14 * per_rank(c) + coded_words(c);
}

/* An all-to-all of n floats a rank (rows of cc values): nothing computes meanwhile, so all of it is exposed. On a coded
 * wire each rank's block is coded on its own (a row's scale with its row) and decoded where it lands. */
static dt_status exchange(const trade *x, const float *s, float *r, size_t n) {
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_SELF, "all-to-all attention", "\"floats\":%zu", n * (size_t)x->N);
    dt_status st;
    if (x->wire == DT_PP_WIRE_F32) {
        st = dt_comm_alltoall(x->comm, s, r, n, DT_F32);
    } else {
        size_t w = dt_pp_wire_words(x->wire, n, (size_t)x->cc);
        uint32_t *out = x->coded, *in = x->coded + (size_t)x->N * w;
        for (int j = 0; j < x->N; j++) dt_pp_wire_encode(x->wire, s + (size_t)j * n, n, (size_t)x->cc, out + (size_t)j * w);
        st = dt_comm_alltoall(x->comm, out, in, w, DT_I32);
        for (int j = 0; j < x->N && !st; j++) dt_pp_wire_decode(x->wire, in + (size_t)j * w, n, (size_t)x->cc, r + (size_t)j * n);
    }
    DT_TRACE_END(DT_TRACK_SELF);
    if (x->waited) *x->waited += dt_time_now() - t0;
    return st;
}

/* src [B, Tl, W C] (W parts of C channels) into g [B, T, W cc]: this rank's heads, every row in sequence order. */
static dt_status to_heads(const trade *x, const float *src, int W, float *s, float *r, float *g) {
    size_t cc = (size_t)x->cc, n = (size_t)x->B * x->Tl * W * cc;
    for (int j = 0; j < x->N; j++)
        for (int b = 0; b < x->B; b++)
            for (int t = 0; t < x->Tl; t++)
                for (int w = 0; w < W; w++)
                    memcpy(s + (((size_t)(j * x->B + b) * x->Tl + t) * W + w) * cc,
                           src + ((size_t)b * x->Tl + t) * W * x->C + (size_t)w * x->C + j * cc, cc * sizeof(float));
    dt_status st = exchange(x, s, r, n);
    if (st) return dt_error(st, "all-to-all attention, rows to heads: %s", dt_last_error());
    for (int i = 0; i < x->N; i++)
        for (int b = 0; b < x->B; b++)
            for (int t = 0; t < x->Tl; t++) {
                int p = dt_gpt2_cp_position(i, x->N, x->Tl, t);
                memcpy(g + ((size_t)b * x->T + p) * W * cc, r + ((size_t)(i * x->B + b) * x->Tl + t) * W * cc, W * cc * sizeof(float));
            }
    return DT_OK;
}

/* The way back: g [B, T, W cc] into dst [B, Tl, W C], set or (add) added to. */
static dt_status to_rows(const trade *x, const float *g, int W, float *s, float *r, float *dst, int add) {
    size_t cc = (size_t)x->cc, n = (size_t)x->B * x->Tl * W * cc;
    for (int i = 0; i < x->N; i++)
        for (int b = 0; b < x->B; b++)
            for (int t = 0; t < x->Tl; t++) {
                int p = dt_gpt2_cp_position(i, x->N, x->Tl, t);
                memcpy(s + ((size_t)(i * x->B + b) * x->Tl + t) * W * cc, g + ((size_t)b * x->T + p) * W * cc, W * cc * sizeof(float));
            }
    dt_status st = exchange(x, s, r, n);
    if (st) return dt_error(st, "all-to-all attention, heads to rows: %s", dt_last_error());
    for (int j = 0; j < x->N; j++)
        for (int b = 0; b < x->B; b++)
            for (int t = 0; t < x->Tl; t++)
                for (int w = 0; w < W; w++) {
                    float *d = dst + ((size_t)b * x->Tl + t) * W * x->C + (size_t)w * x->C + j * cc;
                    const float *v = r + (((size_t)(j * x->B + b) * x->Tl + t) * W + w) * cc;
                    if (add) for (size_t k = 0; k < cc; k++) d[k] += v[k];
                    else memcpy(d, v, cc * sizeof(float));
                }
    return DT_OK;
}

dt_status dt_ulysses_attention_forward(const dt_cp_config *c, float *out, float *lse, const float *qkv, float *work) {
    dt_status st = check(c);
    if (st) return st;
    trade x = trade_of(c, work);
    size_t per = per_rank(c);
    float *s = work, *r = s + 3 * per, *g = r + 3 * per, *og = g + 3 * per;
    int h = c->NH / x.N;
    if ((st = to_heads(&x, qkv, 3, s, r, g))) return st;
    dt_attention_forward_lse(og, lse, g, x.B, x.T, x.cc, h);
    return to_rows(&x, og, 1, s, r, out, 0);
}

dt_status dt_ulysses_attention_backward(const dt_cp_config *c, float *dqkv, const float *dout, const float *out, const float *qkv,
                                        const float *lse, float *work) {
    dt_status st = check(c);
    if (st) return st;
    trade x = trade_of(c, work);
    size_t per = per_rank(c);
    float *s = work, *r = s + 3 * per, *g = r + 3 * per, *og = g + 3 * per, *dog = og + per, *dg = dog + per;
    int h = c->NH / x.N;
    if ((st = to_heads(&x, qkv, 3, s, r, g)) || (st = to_heads(&x, out, 1, s, r, og)) || (st = to_heads(&x, dout, 1, s, r, dog)))
        return st;
    memset(dg, 0, 3 * per * sizeof(float));
    dt_attention_backward_lse(dg, dog, og, g, lse, x.B, x.T, x.cc, h);
    return to_rows(&x, dg, 3, s, r, dqkv, 1);
}
