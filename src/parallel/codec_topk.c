/* Top-k sparsification with error feedback (Aji and Heafield 2017; Stich et al. 2018, "Sparsified SGD with Memory"):
 * per bucket, the last step's residual is added to the gradient and the sum kept; the k = ceil(D n) entries of largest
 * magnitude of the bucket's n (ties broken by place: the earlier first) go to every rank as (index, value) pairs, one
 * allgather (every rank sends k); each rank sums every rank's pairs in rank order and divides by the ranks; the
 * residual is what was kept with the sent entries zeroed, so sent + residual = gradient + old residual exactly. */
#include "codec_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    int *t;              /* the table's tensors, in the bucket's order */
    int n;
    size_t len, k;       /* the bucket's entries, and how many a rank sends */
    float *mag;          /* scratch: magnitudes for the selection */
    uint32_t *pairs;     /* [this rank's k pairs | every rank's]: index, value bits */
    int busy;
} tbucket;

typedef struct {
    tbucket *b;
    int nb;
} topk;

static dt_status check(const dt_codec_config *c) {
    if (!(c->density > 0 && c->density <= 1)) return dt_error(DT_ERR_ARG, "--compress-density %g: a share of the entries in (0, 1]", c->density);
    return DT_OK;
}

static size_t state_floats(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s) {
    (void)c;
    return s == DT_CODEC_RESIDUAL ? t->count : 0;
}

/* The k-th largest of x[0..n) (1 <= k <= n), x reordered: quickselect on a copy. */
static float kth_largest(float *x, size_t n, size_t k) {
    size_t lo = 0, hi = n - 1, want = k - 1;
    while (lo < hi) {
        float pivot = x[lo + (hi - lo) / 2];
        size_t i = lo, j = hi;
        while (i <= j) {
            while (x[i] > pivot) i++;
            while (x[j] < pivot) j--;
            if (i <= j) {
                float t = x[i];
                x[i] = x[j], x[j] = t;
                i++;
                if (j == 0) break;
                j--;
            }
        }
        if (want <= j) hi = j;
        else if (want >= i) lo = i;
        else break;
    }
    return x[want];
}

/* Bucket b's sizes and buffers, made at its first exchange. */
static dt_status setup(dt_codec *k, topk *s, dt_comm *comm, int b, const int *idx, int n, tbucket **out) {
    dt_status st = dt_codec_grow((void **)&s->b, &s->nb, sizeof *s->b, b);
    if (st) return st;
    tbucket *p = &s->b[b];
    *out = p;
    if (!(p->t = malloc(sizeof *p->t * (size_t)(n ? n : 1)))) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    memcpy(p->t, idx, sizeof *idx * (size_t)n);
    p->n = n;
    for (int i = 0; i < n; i++) p->len += k->t[idx[i]].count;
    p->k = (size_t)ceil(k->c.density * (double)p->len);
    if (p->k < 1) p->k = 1;
    if (p->k > p->len) p->k = p->len;
    if (p->len > UINT32_MAX) return dt_error(DT_ERR_ARG, "topk: a bucket of %zu entries: at most 2^32 (smaller --bucket-mb)", p->len);
    if (!(p->mag = malloc(sizeof *p->mag * (p->len ? p->len : 1)))) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    return dt_comm_alloc(comm, 2 * p->k * (size_t)(dt_comm_size(comm) + 1) * sizeof *p->pairs, (void **)&p->pairs);
}

/* Entry j of the bucket: tensor i's element e. */
static float *entry(const dt_codec *k, const tbucket *p, float *g, size_t j) {
    for (int i = 0; i < p->n; i++) {
        size_t c = k->t[p->t[i]].count;
        if (j < c) return g + k->t[p->t[i]].offset + j;
        j -= c;
    }
    return NULL;
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    topk *s = k->impl;
    if (!s && !(s = k->impl = calloc(1, sizeof *s))) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    tbucket *p = first ? NULL : &s->b[b];
    dt_status st = first ? setup(k, s, comm, b, idx, n, &p) : DT_OK;
    if (st) return st;
    if (p->busy) return dt_error(DT_ERR_ARG, "topk: bucket %d started again before its exchange ended", b);
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        const dt_tensor_info *t = &k->t[idx[i]];
        size_t ne;
        float *res = dt_codec_state(k, idx[i], DT_CODEC_RESIDUAL, &ne), *x = g + t->offset;
        if (!res) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
        for (size_t j = 0; j < ne; j++) res[j] = x[j] + res[j]; /* kept; the sent entries leave it below */
        for (size_t j = 0; j < ne; j++) p->mag[at + j] = fabsf(res[j]);
        at += ne;
        k->now.before += t->count;
    }
    float thr = kth_largest(p->mag, p->len, p->k);
    /* the entries above the threshold, then those equal to it in order, up to k */
    size_t above = 0, m = 0;
    at = 0;
    for (int i = 0; i < n; i++) {
        size_t ne = k->t[idx[i]].count;
        const float *res = dt_codec_state_held(k, idx[i], DT_CODEC_RESIDUAL);
        for (size_t j = 0; j < ne; j++) above += fabsf(res[j]) > thr;
    }
    size_t ties = p->k - above;
    for (int i = 0; i < n; i++) {
        size_t ne = k->t[idx[i]].count;
        float *res = dt_codec_state_held(k, idx[i], DT_CODEC_RESIDUAL);
        for (size_t j = 0; j < ne && m < p->k; j++) {
            float a = fabsf(res[j]);
            if (a < thr || (a == thr && !ties)) continue;
            if (a == thr) ties--;
            uint32_t bits;
            memcpy(&bits, &res[j], sizeof bits);
            p->pairs[2 * m] = (uint32_t)(at + j), p->pairs[2 * m + 1] = bits;
            res[j] = 0; /* sent: what stays is the residual */
            m++;
        }
        at += ne;
    }
    k->now.after += 2 * p->k;
    k->now.bytes += (double)p->k * 2 * sizeof(uint32_t);
    p->busy = 1;
    return dt_comm_iallgather(comm, p->pairs, p->pairs + 2 * p->k, 2 * p->k, DT_I32, req);
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    (void)req;
    topk *s = k->impl;
    tbucket *p = s && b >= 0 && b < s->nb ? &s->b[b] : NULL;
    if (!p || !p->busy) return dt_error(DT_ERR_ARG, "topk: bucket %d has no exchange in flight", b);
    for (int i = 0; i < p->n; i++) memset(g + k->t[p->t[i]].offset, 0, k->t[p->t[i]].count * sizeof *g);
    int np = dt_comm_size(comm);
    const uint32_t *all = p->pairs + 2 * p->k;
    for (int r = 0; r < np; r++)
        for (size_t m = 0; m < p->k; m++) {
            float v;
            memcpy(&v, &all[2 * ((size_t)r * p->k + m) + 1], sizeof v);
            *entry(k, p, g, all[2 * ((size_t)r * p->k + m)]) += v;
        }
    for (int i = 0; i < p->n; i++) {
        float *x = g + k->t[p->t[i]].offset;
        for (size_t j = 0; j < k->t[p->t[i]].count; j++) x[j] /= (float)np;
    }
    p->busy = 0;
    *done = 1;
    return DT_OK;
}

static int next_collective(const dt_codec *k, int b) {
    (void)k, (void)b;
    return 0;
}

static void destroy(dt_codec *k) {
    topk *s = k->impl;
    if (!s) return;
    for (int b = 0; b < s->nb; b++) {
        free(s->b[b].t);
        free(s->b[b].mag);
        if (s->b[b].pairs) dt_comm_free(k->comm, s->b[b].pairs);
    }
    free(s->b);
    free(s);
}

const dt_codec_ops dt_codec_topk = {
    .check = check, .state_floats = state_floats, .start = start, .next = next, .next_collective = next_collective, .destroy = destroy,
};
