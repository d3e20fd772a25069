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
    size_t tc = (size_t)c->T / (2 * (size_t)dt_cp_ranks(c)), kv = (size_t)c->B * 2 * tc * 2 * (size_t)c->C;
    size_t wire = c->wire == DT_PP_WIRE_F32 ? 0 : 4 * dt_pp_wire_words(c->wire, kv, (size_t)c->C);
    return 5 * kv + tc * (size_t)c->C + (size_t)c->NH * tc + wire;
}

/* Where stream k's coded messages (out, then in) live on a coded wire: past the float buffers (dt_ring_work_floats);
 * the blocks are stream 0, backward's gradients (in flight beside them) stream 1. */
static uint32_t *wire_of(const dt_cp_config *c, float *work, int k) {
    size_t tc = (size_t)c->T / (2 * (size_t)dt_comm_size(c->cp)), kv = (size_t)c->B * 2 * tc * 2 * (size_t)c->C;
    return (uint32_t *)(work + 5 * kv + tc * (size_t)c->C + (size_t)c->NH * tc) + 2 * (size_t)k * dt_pp_wire_words(c->wire, kv, (size_t)c->C);
}

/* This rank's keys and values, [B, 2Tc, 2C], out of its qkv rows. */
static void pack_kv(float *kv, const float *qkv, size_t rows, int C) {
    for (size_t i = 0; i < rows; i++) memcpy(kv + i * 2 * (size_t)C, qkv + i * 3 * (size_t)C + C, 2 * (size_t)C * sizeof(float));
}

/* Chunk i of sequence b in a [B, 2Tc, w] tensor, as the kernels address rows (one sequence at a time). */
static dt_attn_rows rows_of(const float *base, size_t w, int b, int i, int tc, int pos) {
    return (dt_attn_rows){ base + ((size_t)b * 2 * tc + (size_t)i * tc) * w, w, pos, tc };
}

/* A block on its way: its request, and on a coded wire where it arrives coded (in) and is decoded to (recv). */
typedef struct {
    dt_request *req;
    uint32_t *in;
    float *recv;
    size_t n;
} hop;

/* The next block while this one is in use: to rank r+1, from r-1 (no request: one rank, nothing moves). On a coded
 * wire it goes out coded from wire (its first half; the second receives), rows of C values each a scale for int8. */
static dt_status pass(const dt_cp_config *c, const float *send, float *recv, size_t n, uint32_t *wire, hop *h) {
    int N = dt_comm_size(c->cp), r = dt_comm_rank(c->cp);
    *h = (hop){ NULL, NULL, recv, n };
    if (N == 1) return DT_OK;
    if (c->wire == DT_PP_WIRE_F32) return dt_comm_isendrecv(c->cp, send, n, (r + 1) % N, recv, n, (r + N - 1) % N, DT_F32, &h->req);
    size_t w = dt_pp_wire_words(c->wire, n, (size_t)c->C);
    dt_pp_wire_encode(c->wire, send, n, (size_t)c->C, wire);
    h->in = wire + w;
    return dt_comm_isendrecv(c->cp, wire, w, (r + 1) % N, h->in, w, (r + N - 1) % N, DT_I32, &h->req);
}

/* The pass's wait, after the block's compute: what the trace and c->waited call exposed; a coded block decoded. */
static dt_status done(const dt_cp_config *c, hop *h, const char *what) {
    if (!h->req) return DT_OK;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_SELF, "ring wait", "\"what\":\"%s\"", what);
    dt_status st = dt_wait(h->req);
    DT_TRACE_END(DT_TRACK_SELF);
    if (c->waited) *c->waited += dt_time_now() - t0;
    h->req = NULL;
    if (!st && h->in) dt_pp_wire_decode(c->wire, h->in, h->n, (size_t)c->C, h->recv);
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
        hop req = { 0 };
        if (s + 1 < N) st = pass(c, kv[s % 2], kv[(s + 1) % 2], kvn, wire_of(c, work, 0), &req);
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
    hop grad = { 0 }; /* the last step's gradient exchange: out to r+1, in from r-1 */
    dt_status st = DT_OK;
    for (int s = 0; s < N && !st; s++) {
        int owner = (r - s + N) % N, cur = s % 2;
        hop req = { 0 };
        if (s + 1 < N) st = pass(c, kv[cur], kv[!cur], kvn, wire_of(c, work, 0), &req);
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
            st = pass(c, sending, in, kvn, wire_of(c, work, 1), &grad);
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
