/* The two-stage sign allreduce (codec_signs.h). A rank sends about n/32 + p (segments) words in the alltoall and
 * n/(32 p) in the allgather for n floats: about 32 / (1 + 1/p) times fewer than an allreduce's payload. */
#include "codec_signs.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Chunk j's first entry in the bucket (len for a chunk past the end: an empty one, the last ranks' where len < p chunks). */
static size_t chunk_at(const dt_signs_bucket *p, int j) { return (size_t)j * p->chunk < p->len ? (size_t)j * p->chunk : p->len; }

/* The segments: where a tensor or a chunk starts (merged, ascending); each chunk's first, and the most a chunk has. */
static dt_status segments(dt_signs_bucket *p, int np) {
    p->seg = malloc(sizeof *p->seg * (size_t)(p->n + np + 1));
    p->first = malloc(sizeof *p->first * (size_t)(np + 1));
    if (!p->seg || !p->first) return dt_error(DT_ERR_NOMEM, "sign allreduce: out of memory");
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

static dt_status setup(dt_codec *k, dt_comm *comm, const int *idx, int n, dt_signs_bucket *p) {
    p->n = n;
    dt_status st = dt_codec_layout(k, idx, n, &p->t, &p->at, &p->len);
    if (st) return st;
    size_t np = (size_t)dt_comm_size(comm);
    p->chunk = (p->len + np - 1) / np;
    if ((st = segments(p, (int)np))) return st;
    p->words = p->slots + (p->chunk + 31) / 32;
    if ((st = dt_comm_alloc(comm, (p->len ? p->len : 1) * sizeof *p->dense, (void **)&p->dense))) return st;
    if ((st = dt_comm_alloc(comm, 2 * np * p->words * sizeof *p->send, (void **)&p->send))) return st;
    p->recv = p->send + np * p->words;
    return dt_comm_alloc(comm, (np + 1) * p->words * sizeof *p->all, (void **)&p->all);
}

dt_status dt_signs_bucket_at(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, int first, dt_signs_bucket **out) {
    dt_signs_set *s = k->impl;
    dt_status st = first ? dt_codec_grow((void **)&s->b, &s->nb, sizeof *s->b, b) : DT_OK;
    if (!st && first) st = setup(k, comm, idx, n, &s->b[b]);
    if (st) return st;
    *out = &s->b[b];
    if ((*out)->phase) return dt_error(DT_ERR_ARG, "%s: bucket %d started again before its exchange ended", dt_codec_name(k->c.kind), b);
    return DT_OK;
}

dt_status dt_signs_next(dt_codec *k, dt_comm *comm, int b, dt_request **req, dt_signs_bucket **out) {
    dt_signs_set *s = k->impl;
    dt_signs_bucket *p = b >= 0 && b < s->nb ? &s->b[b] : NULL;
    *out = NULL;
    if (!p || !p->phase) return dt_error(DT_ERR_ARG, "%s: bucket %d has no exchange in flight", dt_codec_name(k->c.kind), b);
    if (p->phase == DT_SIGNS_ALLTOALL) {
        p->phase = DT_SIGNS_ALLGATHER;
        return dt_signs_serve(k, p, comm, req);
    }
    if (p->phase == DT_SIGNS_ALLGATHER) dt_signs_decode(p, dt_comm_size(comm));
    *out = p;
    return DT_OK;
}

int dt_signs_next_collective(const dt_codec *k, int b) {
    const dt_signs_set *s = k->impl;
    return b >= 0 && b < s->nb && s->b[b].phase == DT_SIGNS_ALLTOALL;
}

static void free_bucket(dt_codec *k, dt_signs_bucket *p) {
    free(p->t);
    free(p->at);
    free(p->seg);
    free(p->first);
    if (p->dense) dt_comm_free(k->comm, p->dense);
    if (p->send) dt_comm_free(k->comm, p->send);
    if (p->all) dt_comm_free(k->comm, p->all);
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
static void compress_chunk(const dt_signs_bucket *p, int j, const float *x, uint32_t *w, float *err) {
    memset(w, 0, p->words * sizeof *w);
    size_t base = (size_t)j * p->chunk;
    for (int s = p->first[j]; s < p->first[j + 1]; s++) compress(x, p->seg[s] - base, p->seg[s + 1] - base, w, (size_t)(s - p->first[j]), p->slots, err);
}

/* Chunk j's entries from message w into out (chunk-relative); add: out += them (else out = them). */
static void decompress_chunk(const dt_signs_bucket *p, int j, const uint32_t *w, float *out, int add) {
    size_t base = (size_t)j * p->chunk;
    for (int s = p->first[j]; s < p->first[j + 1]; s++) expand(w, (size_t)(s - p->first[j]), p->slots, p->seg[s] - base, p->seg[s + 1] - base, out, add);
}

dt_status dt_signs_dense(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, const float *g, dt_request **req) {
    for (int i = 0; i < p->n; i++) memcpy(p->dense + p->at[i], g + k->t[p->t[i]].offset, k->t[p->t[i]].count * sizeof *g);
    k->now.after += p->len;
    k->now.bytes += (double)p->len * sizeof(float);
    return dt_comm_iallreduce(comm, p->dense, p->dense, p->len, DT_F32, DT_SUM, req);
}

dt_status dt_signs_send(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, dt_request **req) {
    for (int i = 0; i < p->n; i++) {
        const float *e = dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL);
        float *x = p->dense + p->at[i];
        for (size_t j = 0; j < p->at[i + 1] - p->at[i]; j++) x[j] += e[j];
    }
    int np = dt_comm_size(comm);
    /* dense becomes e_w chunk by chunk, then goes to the tensors' residuals */
    for (int j = 0; j < np; j++) compress_chunk(p, j, p->dense + chunk_at(p, j), p->send + (size_t)j * p->words, p->dense + chunk_at(p, j));
    for (int i = 0; i < p->n; i++)
        memcpy(dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL), p->dense + p->at[i], (p->at[i + 1] - p->at[i]) * sizeof(float));
    k->now.after += (size_t)np * p->words + p->words;
    k->now.bytes += (double)((size_t)np * p->words + p->words) * sizeof(uint32_t);
    return dt_comm_ialltoall(comm, p->send, p->recv, p->words, DT_I32, req);
}

/* Tensor i's piece [*lo, *hi) of the bucket's entries [a, b) (empty: *lo >= *hi). */
static void piece(const dt_signs_bucket *p, int i, size_t a, size_t b, size_t *lo, size_t *hi) {
    *lo = p->at[i] > a ? p->at[i] : a;
    *hi = p->at[i + 1] < b ? p->at[i + 1] : b;
}

dt_status dt_signs_serve(dt_codec *k, dt_signs_bucket *p, dt_comm *comm, dt_request **req) {
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
    return dt_comm_iallgather(comm, mine, p->all, p->words, DT_I32, req);
}

void dt_signs_decode(dt_signs_bucket *p, int np) {
    for (int j = 0; j < np; j++) decompress_chunk(p, j, p->all + (size_t)j * p->words, p->dense + chunk_at(p, j), 0);
}

/* A bucket's of len entries in nseg segments on np ranks: the packed bucket, the alltoall's blocks out and in and the
 * allgather's (words each: a scale a segment of the fullest chunk, then a chunk's signs), the segments' tables. */
static size_t bucket_bytes(size_t len, size_t nseg, size_t slots, size_t np) {
    size_t words = slots + ((len + np - 1) / np + 31) / 32;
    return (len ? len : 1) * sizeof(float) + (3 * np + 1) * words * sizeof(uint32_t) + (nseg + np + 1) * sizeof(size_t) + (np + 1) * sizeof(int);
}

void dt_signs_destroy(dt_codec *k) {
    dt_signs_set *s = k->impl;
    if (!s) return;
    for (int b = 0; b < s->nb; b++) free_bucket(k, &s->b[b]);
    free(s->b);
}

size_t dt_signs_work(const dt_codec *k) {
    const dt_signs_set *s = k->impl;
    size_t bytes = 0, np = (size_t)(k->comm ? dt_comm_size(k->comm) : 1);
    for (int i = 0; i < s->nb; i++)
        if (s->b[i].dense) bytes += bucket_bytes(s->b[i].len, (size_t)s->b[i].n, s->b[i].slots, np);
    return bytes;
}

/* One bucket of every tensor, laid one after another: the fullest chunk's segments counted as segments() makes them
 * (its start, and each tensor that starts inside it). */
size_t dt_signs_work_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at) {
    (void)c;
    size_t len = 0, np = at->ranks > 1 ? (size_t)at->ranks : 1, slots = 0, start = 0;
    for (int i = 0; i < nt; i++) len += t[i].count;
    size_t chunk = (len + np - 1) / np;
    for (size_t j = 0, i = 0; j < np; j++) {
        size_t a = j * chunk < len ? j * chunk : len, b = (j + 1) * chunk < len ? (j + 1) * chunk : len, n = 1;
        if (a == b) continue;
        for (; i < (size_t)nt && start + t[i].count <= a; i++) start += t[i].count; /* tensor i is the one holding a */
        for (size_t q = i, s = start; q < (size_t)nt && s < b; s += t[q++].count) n += s > a;
        if (n > slots) slots = n;
    }
    return bucket_bytes(len, (size_t)nt, slots, np);
}
