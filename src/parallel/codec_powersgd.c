/* PowerSGD (Vogels, Karimireddy and Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for Distributed
 * Optimization", 2019), as PyTorch's powerSGD_hook runs it, bucket by bucket:
 *
 *   the residual of the last step is added to the gradient (error feedback) and the sum kept;
 *   each matrix M [n, m] (a tensor seen as its first dimension by the rest) that gains is approximated at rank
 *   r = min(n, m, R): Q [m, r] (last step's: warm start; at first drawn from a normal) orthogonalised, P = M Q;
 *   one allreduce (sum) of the tensors sent whole and every P; those tensors take the average; each P orthogonalised,
 *   Q = M^T P; one allreduce (sum) of every Q, divided by the ranks; M = P Q^T;
 *   the residual: what was kept minus what the tensor now holds (the tensors sent whole too, as the hook does).
 *
 * A matrix gains when (n + m) r x min_rate < n m (the hook's min_compression_rate); vectors and small matrices are sent
 * whole. Orthogonalisation is Gram-Schmidt at every rank (the hook's at rank 2 or less; above, its QR may flip a
 * column's sign, which flips the column of P and of Q alike: P Q^T is the same). */
#include "codec_internal.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int t;               /* the table's tensor */
    int n, m, r;         /* its matrix and rank; r 0: sent whole */
    size_t at;           /* sent whole: where in buf; else where its P is in buf (after the whole ones) */
    size_t qat;          /* its Q in qbuf */
} entry;

typedef struct {
    entry *e;
    int n;
    size_t whole, np, nq;
    float *buf;          /* [the tensors sent whole | every P]: the first allreduce */
    float *qbuf;         /* every Q: the second */
    int phase;           /* 0: idle; 1: the first allreduce in flight; 2: the second */
} pbucket;

typedef struct {
    pbucket *b;
    int nb;
} psgd;

static int rank_of(const dt_codec_config *c, const dt_tensor_info *t, int *n, int *m) {
    *n = t->ndim ? t->shape[0] : 1;
    *m = *n ? (int)(t->count / (size_t)*n) : 0;
    int r = c->rank < *n ? c->rank : *n;
    r = r < *m ? r : *m;
    return (double)(*n + *m) * r * c->min_rate < (double)*n * *m ? r : 0;
}

static dt_status check(const dt_codec_config *c) {
    if (c->rank < 1) return dt_error(DT_ERR_ARG, "--compress-rank %d: PowerSGD's rank is 1 or more", c->rank);
    if (!(c->min_rate > 0)) return dt_error(DT_ERR_ARG, "powersgd: a minimum compression rate of %g: it is above 0", c->min_rate);
    return DT_OK;
}

static size_t state_floats(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s) {
    int n, m, r = rank_of(c, t, &n, &m);
    return s == DT_CODEC_RESIDUAL ? t->count : s == DT_CODEC_Q ? (size_t)m * (size_t)r : 0; /* (no velocity, no server's) */
}

/* The columns of a [rows, cols] row-major matrix made orthonormal, left to right (a zero column stays zero). */
static void orthogonalize(float *a, int rows, int cols) {
    for (int i = 0; i < cols; i++) {
        double s = 0;
        for (int r = 0; r < rows; r++) s += (double)a[(size_t)r * cols + i] * a[(size_t)r * cols + i];
        float norm = (float)sqrt(s);
        for (int r = 0; r < rows; r++) a[(size_t)r * cols + i] = norm > 0 ? a[(size_t)r * cols + i] / norm : 0.0f;
        for (int j = i + 1; j < cols; j++) {
            double d = 0;
            for (int r = 0; r < rows; r++) d += (double)a[(size_t)r * cols + i] * a[(size_t)r * cols + j];
            for (int r = 0; r < rows; r++) a[(size_t)r * cols + j] -= (float)d * a[(size_t)r * cols + i];
        }
    }
}

/* Bucket b's entries and buffers, made at its first exchange. */
static dt_status setup(dt_codec *k, psgd *s, dt_comm *comm, int b, const int *idx, int n, pbucket **out) {
    dt_status st = dt_codec_grow((void **)&s->b, &s->nb, sizeof *s->b, b);
    if (st) return st;
    pbucket *p = &s->b[b];
    *out = p;
    if (!(p->e = calloc((size_t)(n ? n : 1), sizeof *p->e))) return dt_error(DT_ERR_NOMEM, "powersgd: out of memory");
    p->n = n;
    for (int i = 0; i < n; i++) {
        entry *e = &p->e[i];
        e->t = idx[i];
        e->r = rank_of(&k->c, &k->t[idx[i]], &e->n, &e->m);
        if (!e->r) { e->at = p->whole; p->whole += k->t[idx[i]].count; }
    }
    for (int i = 0; i < n; i++) {
        entry *e = &p->e[i];
        if (!e->r) continue;
        e->at = p->whole + p->np;
        e->qat = p->nq;
        p->np += (size_t)e->n * e->r;
        p->nq += (size_t)e->m * e->r;
    }
    st = dt_comm_alloc(comm, (p->whole + p->np + 1) * sizeof(float), (void **)&p->buf);
    if (!st) st = dt_comm_alloc(comm, (p->nq + 1) * sizeof(float), (void **)&p->qbuf);
    return st;
}

/* Tensor e's Q: last step's, or (none yet) drawn from the seed's normals, the same on every rank; seeded by the tensor's
 * place in the whole model (goffset), not its index in this rank's table, so that a pipeline stage's tensors draw what
 * one process's do (DP x PP = DP). */
static float *q_of(dt_codec *k, const entry *e) {
    int fresh = !dt_codec_state_held(k, e->t, DT_CODEC_Q);
    size_t nq;
    float *q = dt_codec_state(k, e->t, DT_CODEC_Q, &nq);
    uint64_t seed = k->c.seed ^ ((uint64_t)(k->t[e->t].goffset + 1) * 0x9e3779b97f4a7c15ull);
    for (size_t j = 0; q && fresh && j < nq; j++) q[j] = dt_rng_normal_at(seed, j);
    return q;
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    psgd *s = k->impl;
    pbucket *p = first ? NULL : &s->b[b];
    dt_status st = first ? setup(k, s, comm, b, idx, n, &p) : DT_OK;
    if (st) return st;
    if (p->phase) return dt_error(DT_ERR_ARG, "powersgd: bucket %d started again before its exchange ended", b);
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &k->t[p->e[i].t];
        size_t ne;
        float *res = dt_codec_state(k, p->e[i].t, DT_CODEC_RESIDUAL, &ne), *x = g + t->offset;
        if (!res) return dt_error(DT_ERR_NOMEM, "powersgd: out of memory");
        for (size_t j = 0; j < ne; j++) res[j] = x[j] += res[j]; /* kept: the residual is this minus the average */
        k->now.before += t->count;
        k->now.after += p->e[i].r ? (size_t)(p->e[i].n + p->e[i].m) * p->e[i].r : t->count;
        if (!p->e[i].r) { memcpy(p->buf + p->e[i].at, x, t->count * sizeof *x); continue; }
        const entry *e = &p->e[i];
        float *q = q_of(k, e);
        if (!q) return dt_error(DT_ERR_NOMEM, "powersgd: out of memory");
        orthogonalize(q, e->m, e->r);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, e->n, e->r, e->m, 1.0f, x, e->m, q, e->r, 0.0f, p->buf + e->at, e->r);
    }
    k->now.bytes += (double)(p->whole + p->np + p->nq) * sizeof(float);
    p->phase = 1;
    return dt_comm_iallreduce(comm, p->buf, p->buf, p->whole + p->np, DT_F32, DT_SUM, req);
}

/* The first allreduce done: the whole tensors' averages in place; Q = M^T P from the orthogonalised sum of P. */
static dt_status second(dt_codec *k, dt_comm *comm, pbucket *p, float *g, dt_request **req) {
    float np = (float)dt_comm_size(comm);
    for (int i = 0; i < p->n; i++) {
        const entry *e = &p->e[i];
        const dt_tensor_info *t = &k->t[e->t];
        float *x = g + t->offset;
        if (!e->r) {
            for (size_t j = 0; j < t->count; j++) x[j] = p->buf[e->at + j] / np;
            continue;
        }
        orthogonalize(p->buf + e->at, e->n, e->r);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, e->m, e->r, e->n, 1.0f, x, e->m, p->buf + e->at, e->r, 0.0f, p->qbuf + e->qat, e->r);
    }
    p->phase = 2;
    return dt_comm_iallreduce(comm, p->qbuf, p->qbuf, p->nq, DT_F32, DT_SUM, req);
}

/* The second done: Q averaged (and kept for the next step), M = P Q^T, the residuals. */
static void last(dt_codec *k, dt_comm *comm, pbucket *p, float *g) {
    float np = (float)dt_comm_size(comm);
    for (size_t j = 0; j < p->nq; j++) p->qbuf[j] /= np;
    for (int i = 0; i < p->n; i++) {
        const entry *e = &p->e[i];
        const dt_tensor_info *t = &k->t[e->t];
        float *x = g + t->offset, *res = dt_codec_state_held(k, e->t, DT_CODEC_RESIDUAL);
        if (e->r) {
            float *q = dt_codec_state_held(k, e->t, DT_CODEC_Q);
            memcpy(q, p->qbuf + e->qat, (size_t)e->m * e->r * sizeof *q);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, e->n, e->m, e->r, 1.0f, p->buf + e->at, e->r, q, e->r, 0.0f, x, e->m);
        }
        for (size_t j = 0; j < t->count; j++) res[j] -= x[j];
    }
    p->phase = 0;
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    psgd *s = k->impl;
    pbucket *p = b >= 0 && b < s->nb ? &s->b[b] : NULL;
    if (!p || !p->phase) return dt_error(DT_ERR_ARG, "powersgd: bucket %d has no exchange in flight", b);
    if (p->phase == 1) return second(k, comm, p, g, req);
    last(k, comm, p, g);
    *done = 1;
    return DT_OK;
}

static int next_collective(const dt_codec *k, int b) {
    const psgd *s = k->impl;
    return b >= 0 && b < s->nb && s->b[b].phase == 1;
}

static void destroy(dt_codec *k) {
    psgd *s = k->impl;
    if (!s) return;
    for (int b = 0; b < s->nb; b++) {
        free(s->b[b].e);
        if (s->b[b].buf) dt_comm_free(k->comm, s->b[b].buf);
        if (s->b[b].qbuf) dt_comm_free(k->comm, s->b[b].qbuf);
    }
    free(s->b);
}

/* A bucket's: its entries, the first allreduce's buffer (the whole tensors and every P), the second's (every Q). */
static size_t bucket_bytes(size_t n, size_t whole, size_t np, size_t nq) { return n * sizeof(entry) + (whole + np + 1 + nq + 1) * sizeof(float); }

static size_t work(const dt_codec *k) {
    const psgd *s = k->impl;
    size_t b = 0;
    for (int i = 0; i < s->nb; i++) b += s->b[i].e ? bucket_bytes((size_t)s->b[i].n, s->b[i].whole, s->b[i].np, s->b[i].nq) : 0;
    return b;
}

static size_t work_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at) {
    (void)at;
    size_t whole = 0, np = 0, nq = 0;
    for (int i = 0; i < nt; i++) {
        int n, m, r = rank_of(c, &t[i], &n, &m);
        if (r) np += (size_t)n * r, nq += (size_t)m * r;
        else whole += t[i].count;
    }
    return bucket_bytes((size_t)nt, whole, np, nq);
}

const dt_codec_ops dt_codec_powersgd = {
    .impl_size = sizeof(psgd), .check = check, .state_floats = state_floats, .start = start, .next = next, .next_collective = next_collective, .destroy = destroy,
    .work = work, .work_for = work_for,
};
