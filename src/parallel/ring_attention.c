/* Ring attention over a context-parallel group (see context.h): N steps,
 * at each a rank attends with its two query chunks to the key/value block
 * in hand (its own first, then its neighbours' as they arrive) while the
 * next block travels; the kernels (attention_block.c) take the chunks'
 * positions, so causality holds whichever block is in hand, and merge the
 * partial results by log-sum-exp. */
#include "dtrain/context.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

int dt_ring_chunk_rows(const dt_cp_config *c) {
    int n = 2 * dt_comm_size(c->cp);
    if (c->T % n) {
        dt_error(DT_ERR_ARG, "context parallelism: %d positions do not split into 2 x %d chunks", c->T, n / 2);
        return 0;
    }
    return c->T / n;
}

/* The split is the model's (dt_gpt2_cp_position): chunk i starts at row i Tc of the rank's 2 Tc. */
int dt_ring_chunk_pos(const dt_cp_config *c, int rank, int i) {
    int n = dt_comm_size(c->cp), tc = c->T / (2 * n);
    return dt_gpt2_cp_position(rank, n, 2 * tc, i * tc);
}

size_t dt_ring_work_floats(const dt_cp_config *c) {
    size_t tc = (size_t)c->T / (2 * (size_t)dt_comm_size(c->cp)), kv = (size_t)c->B * 2 * tc * 2 * (size_t)c->C;
    return 5 * kv + tc * (size_t)c->C + (size_t)c->NH * tc;
}

/* This rank's keys and values, [B, 2Tc, 2C], out of its qkv rows. */
static void pack_kv(float *kv, const float *qkv, size_t rows, int C) {
    for (size_t i = 0; i < rows; i++) memcpy(kv + i * 2 * (size_t)C, qkv + i * 3 * (size_t)C + C, 2 * (size_t)C * sizeof(float));
}

/* Chunk i of sequence b in a [B, 2Tc, w] tensor, as the kernels address rows (one sequence at a time). */
static dt_attn_rows rows_of(const float *base, size_t w, int b, int i, int tc, int pos) {
    return (dt_attn_rows){ base + ((size_t)b * 2 * tc + (size_t)i * tc) * w, w, pos, tc };
}

/* The next block while this one is in use: to rank r+1, from r-1 (NULL req: one rank, nothing moves). */
static dt_status pass(const dt_cp_config *c, const float *send, float *recv, size_t n, dt_request **req) {
    int N = dt_comm_size(c->cp), r = dt_comm_rank(c->cp);
    *req = NULL;
    if (N == 1) return DT_OK;
    return dt_comm_isendrecv(c->cp, send, n, (r + 1) % N, recv, n, (r + N - 1) % N, DT_F32, req);
}

/* The pass's wait, after the block's compute: what the trace and c->waited call exposed. */
static dt_status done(const dt_cp_config *c, dt_request **req, const char *what) {
    if (!*req) return DT_OK;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_SELF, "ring wait", "\"what\":\"%s\"", what);
    dt_status st = dt_wait(*req);
    DT_TRACE_END(DT_TRACK_SELF);
    if (c->waited) *c->waited += dt_time_now() - t0;
    *req = NULL;
    return st ? dt_error(st, "ring attention, %s: %s", what, dt_last_error()) : DT_OK;
}

dt_status dt_ring_attention_forward(const dt_cp_config *c, float *out, float *lse, const float *qkv, float *work) {
    int N = dt_comm_size(c->cp), r = dt_comm_rank(c->cp), tc = dt_ring_chunk_rows(c), C = c->C, NH = c->NH;
    if (!tc) return dt_error(DT_ERR_ARG, "%s", dt_last_error());
    size_t rows = (size_t)c->B * 2 * tc, kvn = rows * 2 * (size_t)C;
    float *kv[2] = { work, work + kvn }, *bout = work + 4 * kvn, *blse = bout + (size_t)tc * C;
    pack_kv(kv[0], qkv, rows, C);
    memset(out, 0, rows * (size_t)C * sizeof(float));
    for (size_t i = 0; i < (size_t)c->B * 2 * NH * tc; i++) lse[i] = -INFINITY;
    dt_status st = DT_OK;
    for (int s = 0; s < N && !st; s++) {
        int owner = (r - s + N) % N;
        dt_request *req = NULL;
        if (s + 1 < N) st = pass(c, kv[s % 2], kv[(s + 1) % 2], kvn, &req);
        for (int b = 0; b < c->B && !st; b++)
            for (int qi = 0; qi < 2; qi++) {
                dt_attn_rows q = rows_of(qkv, 3 * (size_t)C, b, qi, tc, dt_ring_chunk_pos(c, r, qi));
                float *o = out + ((size_t)b * 2 * tc + (size_t)qi * tc) * C, *l = lse + ((size_t)b * 2 + qi) * NH * tc;
                for (int ki = 0; ki < 2; ki++) {
                    dt_attn_rows k = rows_of(kv[s % 2], 2 * (size_t)C, b, ki, tc, dt_ring_chunk_pos(c, owner, ki)), v = k;
                    v.p += C;
                    dt_attention_block_forward(bout, blse, &q, &k, &v, 1, C, NH);
                    dt_attention_merge(o, l, bout, blse, 1, tc, C, NH);
                }
            }
        dt_status s2 = done(c, &req, "passing keys and values on");
        if (!st) st = s2;
    }
    return st;
}

/* Backward's block gradients travel one step behind their blocks: a rank
 * adds its share of block X's key/value gradient into a fresh buffer while
 * the sum of the ranks before it is on its way, adds that in when its
 * compute is done, and sends the total on (to r+1, which holds X next) under
 * its next block's compute. Buffers: kv[2] (the block in hand, the next),
 * then the gradient being computed (mine), being sent (out), arriving (in). */
dt_status dt_ring_attention_backward(const dt_cp_config *c, float *dqkv, const float *dout, const float *out, const float *qkv,
                                     const float *lse, float *work) {
    int N = dt_comm_size(c->cp), r = dt_comm_rank(c->cp), tc = dt_ring_chunk_rows(c), C = c->C, NH = c->NH;
    if (!tc) return dt_error(DT_ERR_ARG, "%s", dt_last_error());
    size_t rows = (size_t)c->B * 2 * tc, kvn = rows * 2 * (size_t)C;
    float *kv[2] = { work, work + kvn }, *mine = work + 2 * kvn, *sending = work + 3 * kvn, *in = work + 4 * kvn;
    pack_kv(kv[0], qkv, rows, C);
    dt_request *grad = NULL; /* the last step's gradient exchange: out to r+1, in from r-1 */
    dt_status st = DT_OK;
    for (int s = 0; s < N && !st; s++) {
        int owner = (r - s + N) % N, cur = s % 2;
        dt_request *req = NULL;
        if (s + 1 < N) st = pass(c, kv[cur], kv[!cur], kvn, &req);
        memset(mine, 0, kvn * sizeof(float));
        for (int b = 0; b < c->B && !st; b++)
            for (int qi = 0; qi < 2; qi++) {
                dt_attn_rows q = rows_of(qkv, 3 * (size_t)C, b, qi, tc, dt_ring_chunk_pos(c, r, qi));
                size_t at = (size_t)b * 2 * tc + (size_t)qi * tc;
                const float *dy = dout + at * C, *y = out + at * C, *l = lse + ((size_t)b * 2 + qi) * NH * tc;
                for (int ki = 0; ki < 2; ki++) {
                    dt_attn_rows k = rows_of(kv[cur], 2 * (size_t)C, b, ki, tc, dt_ring_chunk_pos(c, owner, ki)), v = k;
                    v.p += C;
                    float *dk = mine + ((size_t)b * 2 * tc + (size_t)ki * tc) * 2 * C;
                    dt_attn_grads g = { dqkv + at * 3 * C, dk, dk + C, 3 * (size_t)C, 2 * (size_t)C };
                    dt_attention_block_backward(&g, dy, y, l, &q, &k, &v, 1, C, NH);
                }
            }
        dt_status s2 = done(c, &req, "passing keys and values on");
        if (!st) st = s2;
        /* the ranks before this one's sum for the block (none at the first step: the block is this rank's own) */
        if (!st && s > 0 && !(st = done(c, &grad, "receiving a block's gradient")))
            for (size_t i = 0; i < kvn; i++) mine[i] += in[i];
        if (!st && N > 1) {
            float *t = sending;
            sending = mine, mine = t; /* the sum travels; the old send is complete, its buffer computes next */
            st = pass(c, sending, in, kvn, &grad);
        }
    }
    /* the last exchange brings this rank's own block's gradient home: every rank's share of it */
    dt_status s2 = done(c, &grad, "receiving its keys' and values' gradient");
    if (!st) st = s2;
    const float *own = N > 1 ? in : mine; /* one rank: nothing moved, its share is in mine */
    for (size_t i = 0; !st && i < rows; i++)
        for (int j = 0; j < 2 * C; j++) dqkv[i * 3 * (size_t)C + C + j] += own[i * 2 * (size_t)C + j];
    return st;
}
