/* The page pool of sharded gradients (grad_pool.h). */
#include "grad_pool.h"

#include "dtrain/base.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Whole pages of a bucket outside the shard: while lent, they show the pool's pages at the bucket's span + skip. */
typedef struct { char *at; size_t bytes, skip; } borrow;

typedef struct {
    borrow *runs;
    int nruns;
    size_t need, span; /* the runs' bytes; where in the pool they are this step */
} bucket;

struct dt_grad_pool {
    dt_comm *c;
    float *store;
    size_t n, s0, s1;
    bucket *b;
    int nb;
    borrow *all;              /* every bucket's runs */
    char *pool, *raw;         /* page-aligned; NULL where no bucket has a whole page outside the shard */
    size_t bytes, head;       /* the ring; its next free byte */
    int lent;                 /* buckets lent since the last give-back, in order */
};

static size_t page_bytes(void) { return (size_t)sysconf(_SC_PAGESIZE); }

size_t dt_grad_pool_edge_up(const dt_grad_pool *p, size_t i) {
    size_t pg = page_bytes(), a = (uintptr_t)(p->store + i) % pg;
    return i + (a ? (pg - a) / sizeof(float) : 0);
}

size_t dt_grad_pool_edge_down(const dt_grad_pool *p, size_t i) {
    size_t back = ((uintptr_t)(p->store + i) % page_bytes()) / sizeof(float);
    return back <= i ? i - back : 0; /* none in the store: 0, below any edge_up */
}

/* The whole pages of [a, b) as a run of bucket k. */
static void add_run(dt_grad_pool *p, bucket *k, size_t a, size_t b) {
    if (a >= b) return;
    a = dt_grad_pool_edge_up(p, a);
    b = dt_grad_pool_edge_down(p, b);
    if (a >= b) return;
    k->runs[k->nruns++] = (borrow){ (char *)(p->store + a), (b - a) * sizeof(float), k->need };
    k->need += (b - a) * sizeof(float);
}

/* Whether the ranks' stores are all in the arena at one page phase. */
static dt_status same_phase(dt_comm *c, const float *store, size_t n, bool *same) {
    int np = dt_comm_size(c);
    int64_t mine = dt_comm_in_arena(c, store, n * sizeof(float)) ? (int64_t)((uintptr_t)store % page_bytes()) : -1;
    int64_t *all = malloc(sizeof *all * (size_t)np);
    if (!all) return dt_error(DT_ERR_NOMEM, "ddp: out of memory");
    dt_status st = dt_comm_allgather(c, &mine, all, 1, DT_I64);
    *same = !st;
    for (int r = 0; *same && r < np; r++) *same = all[r] >= 0 && all[r] == all[0];
    free(all);
    return st;
}

static void make_runs(dt_grad_pool *p, const dt_pool_range *ranges, const int *nranges) {
    borrow *next = p->all;
    for (int j = 0, first = 0; j < p->nb; first += nranges[j++]) {
        bucket *k = &p->b[j];
        k->runs = next;
        for (int r = first; r < first + nranges[j]; r++) {
            size_t a = ranges[r].off, b = a + ranges[r].count;
            add_run(p, k, a, b < p->s0 ? b : p->s0);
            add_run(p, k, a > p->s1 ? a : p->s1, b);
        }
        next += k->nruns;
    }
}

dt_status dt_grad_pool_create(dt_comm *c, float *store, size_t n, size_t s0, size_t s1, const dt_pool_range *ranges,
                              const int *nranges, int nb, dt_grad_pool **out) {
    *out = NULL;
    bool same = false;
    dt_status st = same_phase(c, store, n, &same);
    if (st || !same || getenv("DTRAIN_ZERO_NO_POOL")) return st;
    int nall = 0;
    for (int j = 0; j < nb; j++) nall += nranges[j];
    dt_grad_pool *p = calloc(1, sizeof *p);
    if (p) p->b = calloc((size_t)nb + 1, sizeof *p->b);
    if (p) p->all = calloc((size_t)nall * 2 + 1, sizeof *p->all); /* two runs a range at most */
    if (!p || !p->b || !p->all) { dt_grad_pool_destroy(p); return dt_error(DT_ERR_NOMEM, "ddp: out of memory"); }
    p->c = c;
    p->store = store;
    p->n = n;
    p->s0 = s0;
    p->s1 = s1;
    p->nb = nb;
    make_runs(p, ranges, nranges);
    for (int j = 0; j < nb; j++) {
        size_t pair = p->b[j].need + (j + 1 < nb ? p->b[j + 1].need : 0);
        if (pair > p->bytes) p->bytes = pair;
    }
    /* never pre-faulted: a page comes when first lent, and stays */
    if (p->bytes && (st = dt_comm_alloc_sparse(c, p->bytes + page_bytes(), (void **)&p->raw))) { dt_grad_pool_destroy(p); return st; }
    if (p->raw) p->pool = (char *)(((uintptr_t)p->raw + page_bytes() - 1) & ~(uintptr_t)(page_bytes() - 1));
    *out = p;
    return DT_OK;
}

void dt_grad_pool_destroy(dt_grad_pool *p) {
    if (!p) return;
    dt_grad_pool_give_back(p); /* before the store goes: its addresses must not show the pool */
    dt_comm_free(p->c, p->raw);
    free(p->all);
    free(p->b);
    free(p);
}

float *dt_grad_pool_where(const dt_grad_pool *p, int k, size_t i) {
    char *a = (char *)(p->store + i);
    const bucket *b = &p->b[k];
    for (int r = 0; r < b->nruns; r++)
        if (a >= b->runs[r].at && a < b->runs[r].at + b->runs[r].bytes)
            return (float *)(p->pool + b->span + b->runs[r].skip + (a - b->runs[r].at));
    return p->store + i;
}

/* Where in the ring bucket k goes: after the last lent, or at the start if it does not fit there. */
static size_t place(const dt_grad_pool *p, int k) { return p->head + p->b[k].need <= p->bytes ? p->head : 0; }

int dt_grad_pool_blocker(const dt_grad_pool *p, int k, int from) {
    size_t at = place(p, k), need = p->b[k].need;
    int last = -1;
    for (int j = from; j < k; j++) {
        const bucket *o = &p->b[j];
        if (o->need && o->span < at + need && at < o->span + o->need) last = j;
    }
    return last;
}

dt_status dt_grad_pool_lend(dt_grad_pool *p, int k) {
    bucket *b = &p->b[k];
    size_t at = place(p, k);
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "borrow pages", "\"bucket\":%d,\"bytes\":%zu", k, b->need);
    for (int r = 0; r < b->nruns; r++) {
        dt_status st = dt_comm_map_pages(p->c, b->runs[r].at, p->pool + at + b->runs[r].skip, b->runs[r].bytes);
        if (st) { DT_TRACE_END(DT_TRACK_COMPUTE); return st; }
        memset(b->runs[r].at, 0, b->runs[r].bytes); /* backward adds to them */
    }
    DT_TRACE_END(DT_TRACK_COMPUTE);
    b->span = at;
    p->head = at + b->need;
    p->lent = k + 1;
    return DT_OK;
}

int dt_grad_pool_lent(const dt_grad_pool *p) { return p ? p->lent : 0; }

dt_status dt_grad_pool_give_back(dt_grad_pool *p) {
    if (!p || !p->lent) return DT_OK;
    size_t a = dt_grad_pool_edge_up(p, 0), b = dt_grad_pool_edge_down(p, p->s0), c = dt_grad_pool_edge_up(p, p->s1),
           e = dt_grad_pool_edge_down(p, p->n);
    dt_status st = a < b ? dt_comm_map_pages(p->c, p->store + a, p->store + a, (b - a) * sizeof(float)) : DT_OK;
    if (!st && c < e) st = dt_comm_map_pages(p->c, p->store + c, p->store + c, (e - c) * sizeof(float));
    p->lent = 0;
    p->head = 0;
    return st;
}

size_t dt_grad_pool_resident(const dt_grad_pool *p) { return p && p->pool ? dt_mem_resident(p->pool, p->bytes) : 0; }
