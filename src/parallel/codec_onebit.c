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
 * stayed near it. A rank sends about n/32 + p (segments) words in the alltoall and n/(32 p) in the allgather for n
 * floats: about 32 / (1 + 1/p) times fewer than an allreduce's payload. Each rank's m, e_w and e_s are per-tensor
 * state (e_s full size, used on the rank's chunks only), so checkpoints keep them and resume bit for bit. */
#include "codec_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int *t;              /* the table's tensors, in the bucket's order */
    size_t *at;          /* each one's first entry in the bucket's numbering (n + 1) */
    int n;
    size_t len, chunk;   /* the bucket's entries; a chunk's (the last ones shorter, maybe empty) */
    size_t *seg;         /* the segments' first entries, ascending, then len: every tensor's and chunk's start */
    int *first;          /* chunk j's segments: seg[first[j]] .. seg[first[j + 1]] */
    size_t slots, words; /* a message: a scale a segment (slots), then a chunk's signs, 32 a word */
    float *dense;        /* the bucket packed: the warm-up's allreduce; x, then e_w; the server's chunk; m decoded */
    uint32_t *send, *recv, *all; /* the alltoall's blocks out and in; the allgather's (own block first) */
    int phase;           /* 0: idle; 1: warm-up's allreduce in flight; 2: the alltoall; 3: the allgather */
} obucket;

typedef struct {
    obucket *b;
    int nb;
} onebit;

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

/* Chunk j's first entry in the bucket (len for a chunk past the end: an empty one, the last ranks' where len < p chunks). */
static size_t chunk_at(const obucket *p, int j) { return (size_t)j * p->chunk < p->len ? (size_t)j * p->chunk : p->len; }

/* The segments: where a tensor or a chunk starts (merged, ascending); each chunk's first, and the most a chunk has. */
static dt_status segments(obucket *p, int np) {
    p->seg = malloc(sizeof *p->seg * (size_t)(p->n + np + 1));
    p->first = malloc(sizeof *p->first * (size_t)(np + 1));
    if (!p->seg || !p->first) return dt_error(DT_ERR_NOMEM, "onebit: out of memory");
    int ns = 0, i = 0;
    for (int j = 0; j <= np; j++) {
        size_t a = chunk_at(p, j), b = chunk_at(p, j + 1);
        p->first[j] = ns;
        if (j == np || a == b) continue;
        p->seg[ns++] = a;
        while (i < p->n && p->at[i] <= a) i++;
        for (; i < p->n && p->at[i] < b; i++) p->seg[ns++] = p->at[i];
    }
    p->seg[ns] = p->len;
    for (int j = 0; j < np; j++)
        if ((size_t)(p->first[j + 1] - p->first[j]) > p->slots) p->slots = (size_t)(p->first[j + 1] - p->first[j]);
    return DT_OK;
}

static dt_status setup(dt_codec *k, onebit *s, dt_comm *comm, int b, const int *idx, int n, obucket **out) {
    dt_status st = dt_codec_grow((void **)&s->b, &s->nb, sizeof *s->b, b);
    if (st) return st;
    obucket *p = &s->b[b];
    *out = p;
    p->n = n;
    if ((st = dt_codec_layout(k, idx, n, &p->t, &p->at, &p->len))) return st;
    size_t np = (size_t)dt_comm_size(comm);
    p->chunk = (p->len + np - 1) / np;
    if ((st = segments(p, (int)np))) return st;
    p->words = p->slots + (p->chunk + 31) / 32;
    if ((st = dt_comm_alloc(comm, (p->len ? p->len : 1) * sizeof *p->dense, (void **)&p->dense))) return st;
    if ((st = dt_comm_alloc(comm, 2 * np * p->words * sizeof *p->send, (void **)&p->send))) return st;
    p->recv = p->send + np * p->words;
    return dt_comm_alloc(comm, (np + 1) * p->words * sizeof *p->all, (void **)&p->all);
}

/* Chunk j's entries [a, b) (chunk-relative; one segment, slot k of its message w): their scale |x| / sqrt(b - a), their
 * signs (0 counts as +), and what that loses into err (x itself may be err: each entry is read before it is written). */
static void compress(const float *x, size_t a, size_t b, uint32_t *w, size_t k, size_t slots, float *err) {
    double ss = 0;
    for (size_t c = a; c < b; c++) ss += (double)x[c] * x[c];
    float scale = b > a ? (float)(sqrt(ss) / sqrt((double)(b - a))) : 0;
    memcpy(&w[k], &scale, sizeof scale);
    /* a word of signs at a time, made in a register (a segment may start and end inside a word) */
    for (size_t c = a; c < b;) {
        size_t wi = c / 32, end = (wi + 1) * 32 < b ? (wi + 1) * 32 : b;
        uint32_t word = 0;
        for (; c < end; c++) {
            int up = x[c] >= 0;
            word |= (uint32_t)up << (c % 32);
            err[c] = x[c] - (up ? scale : -scale);
        }
        w[slots + wi] |= word;
    }
}

/* Entries [a, b) of a message whose segment takes slot k, each its sign times the scale, into out (add: onto it). */
static void expand(const uint32_t *w, size_t k, size_t slots, size_t a, size_t b, float *out, int add) {
    float scale;
    memcpy(&scale, &w[k], sizeof scale);
    for (size_t c = a; c < b;) {
        size_t wi = c / 32, end = (wi + 1) * 32 < b ? (wi + 1) * 32 : b;
        uint32_t word = w[slots + wi];
        if (add)
            for (; c < end; c++) out[c] += (word >> (c % 32)) & 1 ? scale : -scale;
        else
            for (; c < end; c++) out[c] = (word >> (c % 32)) & 1 ? scale : -scale;
    }
}

/* Chunk j of x (chunk-relative) into message w segment by segment; err as compress's. */
static void compress_chunk(const obucket *p, int j, const float *x, uint32_t *w, float *err) {
    memset(w, 0, p->words * sizeof *w);
    size_t base = (size_t)j * p->chunk;
    for (int s = p->first[j]; s < p->first[j + 1]; s++) compress(x, p->seg[s] - base, p->seg[s + 1] - base, w, (size_t)(s - p->first[j]), p->slots, err);
}

/* Chunk j's entries from message w into out (chunk-relative); add: out += them (else out = them). */
static void decompress_chunk(const obucket *p, int j, const uint32_t *w, float *out, int add) {
    size_t base = (size_t)j * p->chunk;
    for (int s = p->first[j]; s < p->first[j + 1]; s++) expand(w, (size_t)(s - p->first[j]), p->slots, p->seg[s] - base, p->seg[s + 1] - base, out, add);
}

static dt_status warmup_start(dt_codec *k, obucket *p, dt_comm *comm, const float *g, dt_request **req) {
    for (int i = 0; i < p->n; i++) memcpy(p->dense + p->at[i], g + k->t[p->t[i]].offset, k->t[p->t[i]].count * sizeof *g);
    k->now.after += p->len;
    k->now.bytes += (double)p->len * sizeof(float);
    p->phase = 1;
    return dt_comm_iallreduce(comm, p->dense, p->dense, p->len, DT_F32, DT_SUM, req);
}

/* x = b1 m + (1 - b1) g + e_w into dense; its signs to each chunk's rank. */
static dt_status worker(dt_codec *k, obucket *p, dt_comm *comm, const float *g, dt_request **req) {
    float b1 = k->c.beta1;
    for (int i = 0; i < p->n; i++) {
        const dt_tensor_info *t = &k->t[p->t[i]];
        const float *m = dt_codec_state_held(k, p->t[i], DT_CODEC_VELOCITY), *e = dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL);
        float *x = p->dense + p->at[i];
        for (size_t j = 0; j < t->count; j++) x[j] = (b1 * m[j] + (1.0f - b1) * g[t->offset + j]) + e[j];
    }
    int np = dt_comm_size(comm);
    /* dense becomes e_w chunk by chunk, then goes to the tensors' residuals */
    for (int j = 0; j < np; j++) compress_chunk(p, j, p->dense + chunk_at(p, j), p->send + (size_t)j * p->words, p->dense + chunk_at(p, j));
    for (int i = 0; i < p->n; i++)
        memcpy(dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL), p->dense + p->at[i], (p->at[i + 1] - p->at[i]) * sizeof(float));
    k->now.after += (size_t)np * p->words + p->words;
    k->now.bytes += (double)((size_t)np * p->words + p->words) * sizeof(uint32_t);
    p->phase = 2;
    return dt_comm_ialltoall(comm, p->send, p->recv, p->words, DT_I32, req);
}

/* Tensor i's piece [*lo, *hi) of the bucket's entries [a, b) (empty: *lo >= *hi). */
static void piece(const obucket *p, int i, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = p->at[i] > a ? p->at[i] : a;
    *hi = p->at[i + 1] < b ? p->at[i + 1] : b;
}

/* This rank's chunk: every rank's entries added in rank order, over the ranks, plus e_s; compressed again. */
static dt_status server(dt_codec *k, obucket *p, dt_comm *comm, dt_request **req) {
    int np = dt_comm_size(comm), me = dt_comm_rank(comm);
    size_t a = chunk_at(p, me), n = chunk_at(p, me + 1) - a;
    float *y = p->dense; /* free now: the worker's x is spent */
    for (int r = 0; r < np; r++) decompress_chunk(p, me, p->recv + (size_t)r * p->words, y, r > 0);
    size_t lo, hi;
    for (int i = 0; i < p->n; i++) { /* the tensors' pieces of the chunk: their e_s */
        piece(p, i, a, a + n, &lo, &hi);
        const float *es = dt_codec_state_held(k, p->t[i], DT_CODEC_SERVER) + (lo - p->at[i]);
        for (size_t c = lo; c < hi; c++) y[c - a] = y[c - a] / (float)np + es[c - lo];
    }
    uint32_t *mine = p->all + (size_t)np * p->words;
    compress_chunk(p, me, y, mine, y); /* y becomes what the signs lose: e_s */
    for (int i = 0; i < p->n; i++) {
        piece(p, i, a, a + n, &lo, &hi);
        if (lo < hi) memcpy(dt_codec_state_held(k, p->t[i], DT_CODEC_SERVER) + (lo - p->at[i]), y + (lo - a), (hi - lo) * sizeof *y);
    }
    p->phase = 3;
    return dt_comm_iallgather(comm, mine, p->all, p->words, DT_I32, req);
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    onebit *s = k->impl;
    obucket *p = first ? NULL : &s->b[b];
    dt_status st = first ? setup(k, s, comm, b, idx, n, &p) : DT_OK;
    if (st) return st;
    if (p->phase) return dt_error(DT_ERR_ARG, "onebit: bucket %d started again before its exchange ended", b);
    for (int i = 0; i < n; i++) {
        size_t ne;
        for (dt_codec_state_kind x = DT_CODEC_RESIDUAL; x < DT_CODEC_NSTATES; x++)
            if (x != DT_CODEC_Q && !dt_codec_state(k, idx[i], x, &ne)) return dt_error(DT_ERR_NOMEM, "onebit: out of memory");
        k->now.before += k->t[idx[i]].count;
    }
    return k->steps < k->c.start ? warmup_start(k, p, comm, g, req) : worker(k, p, comm, g, req);
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    onebit *s = k->impl;
    obucket *p = b >= 0 && b < s->nb ? &s->b[b] : NULL;
    if (!p || !p->phase) return dt_error(DT_ERR_ARG, "onebit: bucket %d has no exchange in flight", b);
    if (p->phase == 2) return server(k, p, comm, req);
    int np = dt_comm_size(comm);
    float b1 = k->c.beta1;
    if (p->phase == 3)
        for (int j = 0; j < np; j++) decompress_chunk(p, j, p->all + (size_t)j * p->words, p->dense + chunk_at(p, j), 0);
    for (int i = 0; i < p->n; i++) {
        float *m = dt_codec_state_held(k, p->t[i], DT_CODEC_VELOCITY), *x = g + k->t[p->t[i]].offset;
        const float *d = p->dense + p->at[i];
        size_t ne = p->at[i + 1] - p->at[i];
        if (p->phase == 1) /* warm-up: the average, and Adam's momentum of it */
            for (size_t j = 0; j < ne; j++) x[j] = d[j] / (float)np, m[j] = b1 * m[j] + (1.0f - b1) * x[j];
        else
            for (size_t j = 0; j < ne; j++) x[j] = m[j] = d[j];
    }
    p->phase = 0;
    *done = 1;
    return DT_OK;
}

static int next_collective(const dt_codec *k, int b) {
    const onebit *s = k->impl;
    return b >= 0 && b < s->nb && s->b[b].phase == 2;
}

static void destroy(dt_codec *k) {
    onebit *s = k->impl;
    if (!s) return;
    for (int b = 0; b < s->nb; b++) {
        free(s->b[b].t);
        free(s->b[b].at);
        free(s->b[b].seg);
        free(s->b[b].first);
        if (s->b[b].dense) dt_comm_free(k->comm, s->b[b].dense);
        if (s->b[b].send) dt_comm_free(k->comm, s->b[b].send);
        if (s->b[b].all) dt_comm_free(k->comm, s->b[b].all);
    }
    free(s->b);
}

/* A bucket's of len entries in nseg segments on np ranks: the packed bucket, the alltoall's blocks out and in and the
 * allgather's (words each: a scale a segment of the fullest chunk, then a chunk's signs), the segments' tables. */
static size_t bucket_bytes(size_t len, size_t nseg, size_t slots, size_t np) {
    size_t words = slots + ((len + np - 1) / np + 31) / 32;
    return (len ? len : 1) * sizeof(float) + (3 * np + 1) * words * sizeof(uint32_t) + (nseg + np + 1) * sizeof(size_t) + (np + 1) * sizeof(int);
}

static size_t work(const dt_codec *k) {
    const onebit *s = k->impl;
    size_t b = 0;
    for (int i = 0; i < s->nb; i++)
        if (s->b[i].dense) b += bucket_bytes(s->b[i].len, (size_t)s->b[i].n, s->b[i].slots, (size_t)dt_comm_size(k->comm));
    return b;
}

/* One bucket of every tensor: a chunk's segments about its share of the tensors and one more. */
static size_t work_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at) {
    (void)c;
    size_t len = 0, np = at->ranks > 1 ? (size_t)at->ranks : 1;
    for (int i = 0; i < nt; i++) len += t[i].count;
    return bucket_bytes(len, (size_t)nt, (size_t)nt / np + 2, np);
}

const dt_codec_ops dt_codec_onebit = {
    .impl_size = sizeof(onebit), .own_warmup = 1, .check = check, .state_floats = state_floats, .start = start, .next = next,
    .next_collective = next_collective, .destroy = destroy, .work = work, .work_for = work_for,
};
