/* ZeRO's shards of the flat store, region by region (zero_shards.h). */
#include "zero_shards.h"

#include <stdlib.h>
#include <string.h>

int dt_zero_region_size(const dt_zero_region *g) { return g->comm ? dt_comm_size(g->comm) : 1; }
int dt_zero_region_rank(const dt_zero_region *g) { return g->comm ? dt_comm_rank(g->comm) : 0; }

/* Shard r of n elements over p ranks: the first n % p shards one longer. */
static void shard(size_t n, int p, int r, size_t *off, size_t *count) {
    size_t base = n / (size_t)p, extra = n % (size_t)p, k = (size_t)r;
    *count = base + (k < extra);
    *off = k * base + (k < extra ? k : extra);
}

/* Region g's runs: the tensors of group `group` (every tensor when group < 0), neighbours joined; the store's first
 * `held` floats (the rest is the tail no region holds). */
static dt_status region_runs(const dt_model *m, int group, size_t held, dt_zero_region *g) {
    if (!(g->segs = malloc(sizeof *g->segs * (size_t)(m->ntensors + 1)))) return dt_error(DT_ERR_NOMEM, "zero: out of memory");
    if (group < 0) {
        g->segs[g->nsegs++] = (dt_zero_seg){ 0, held, 0 };
        g->total = held;
        return DT_OK;
    }
    for (int t = 0; t < m->ntensors; t++) {
        const dt_tensor_info *x = &m->tensors[t];
        if (x->group != group || !x->count || x->offset >= held) continue;
        dt_zero_seg *last = g->nsegs ? &g->segs[g->nsegs - 1] : NULL;
        if (last && last->off + last->n == x->offset) last->n += x->count;
        else g->segs[g->nsegs++] = (dt_zero_seg){ x->offset, x->count, g->total };
        g->total += x->count;
    }
    return DT_OK;
}

static dt_status region_cut(dt_zero_region *g) {
    int p = dt_zero_region_size(g);
    g->offs = malloc(sizeof *g->offs * (size_t)p);
    g->counts = malloc(sizeof *g->counts * (size_t)p);
    if (!g->offs || !g->counts) return dt_error(DT_ERR_NOMEM, "zero: out of memory");
    for (int r = 0; r < p; r++) shard(g->total, p, r, &g->offs[r], &g->counts[r]);
    g->off = g->offs[dt_zero_region_rank(g)];
    g->n = g->counts[dt_zero_region_rank(g)];
    return DT_OK;
}

/* This rank's shard of region g appended to s->runs as runs of the store. */
static void add_runs(dt_zero_shards *s, const dt_zero_region *g) {
    size_t v0 = g->off, v1 = g->off + g->n;
    for (int k = 0; k < g->nsegs; k++) {
        const dt_zero_seg *x = &g->segs[k];
        size_t a = v0 > x->v ? v0 : x->v, b = v1 < x->v + x->n ? v1 : x->v + x->n;
        if (a >= b) continue;
        dt_store_range *last = s->nruns ? &s->runs[s->nruns - 1] : NULL;
        size_t off = x->off + (a - x->v);
        if (last && last->off + last->n == off) last->n += b - a;
        else s->runs[s->nruns++] = (dt_store_range){ off, b - a };
    }
}

dt_status dt_zero_shards_create(const dt_engine_config *c, bool leave_copy, dt_zero_shards *s) {
    const dt_model *m = &c->model;
    memset(s, 0, sizeof *s);
    const dt_tensor_info *copy = leave_copy ? dt_model_tied_tail(m) : NULL;
    s->tail_off = copy ? copy->offset : m->nparams;
    s->tail_n = m->nparams - s->tail_off;
    s->nr = c->ep > 1 ? 2 : 1;
    s->r[0].comm = c->comm;
    s->r[1].comm = c->expert_comm;
    s->region = calloc((size_t)m->ntensors + 1, sizeof *s->region);
    s->tv = calloc((size_t)m->ntensors + 1, sizeof *s->tv);
    s->runs = malloc(sizeof *s->runs * (size_t)(2 * m->ntensors + 2));
    dt_status st = s->region && s->tv && s->runs ? DT_OK : dt_error(DT_ERR_NOMEM, "zero: out of memory");
    for (int k = 0; k < s->nr && !st; k++) st = region_runs(m, s->nr == 1 ? -1 : k == 0 ? DT_GROUP_DATA : DT_GROUP_EXPERT, s->tail_off, &s->r[k]);
    /* every float of the store but the tail in one region: the optimizer's slices then cover it */
    if (!st && s->nr == 2 && s->r[0].total + s->r[1].total != s->tail_off)
        st = dt_error(DT_ERR_ARG, "zero: the model's tensors hold %zu of its %zu parameters", s->r[0].total + s->r[1].total, s->tail_off);
    for (int k = 0; k < s->nr && !st; k++) st = region_cut(&s->r[k]);
    if (st) return st;
    size_t at[2] = { 0, 0 };
    for (int t = 0; t < m->ntensors; t++) {
        int k = s->nr == 2 && m->tensors[t].group == DT_GROUP_EXPERT;
        s->region[t] = k;
        s->tv[t] = s->nr == 1 ? m->tensors[t].offset : at[k];
        at[k] += m->tensors[t].count;
    }
    for (int k = 0; k < s->nr; k++) add_runs(s, &s->r[k]);
    return DT_OK;
}

void dt_zero_shards_destroy(dt_zero_shards *s) {
    for (int k = 0; k < 2; k++) {
        free(s->r[k].segs);
        free(s->r[k].offs);
        free(s->r[k].counts);
    }
    free(s->region);
    free(s->tv);
    free(s->runs);
    memset(s, 0, sizeof *s);
}

void dt_zero_region_copy(const dt_zero_region *g, char *store, char *buf, size_t v, size_t n, size_t size, int out) {
    size_t v1 = v + n;
    for (int k = 0; k < g->nsegs; k++) {
        const dt_zero_seg *x = &g->segs[k];
        size_t a = v > x->v ? v : x->v, b = v1 < x->v + x->n ? v1 : x->v + x->n;
        if (a >= b) continue;
        char *s = store + (x->off + (a - x->v)) * size, *d = buf + (a - v) * size;
        if (out) memcpy(d, s, (b - a) * size);
        else memcpy(s, d, (b - a) * size);
    }
}

size_t dt_zero_region_at(const dt_zero_region *g, size_t off) {
    int lo = 0, hi = g->nsegs - 1; /* the last run starting at or before off */
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (g->segs[mid].off <= off) lo = mid;
        else hi = mid - 1;
    }
    return g->segs[lo].v + (off - g->segs[lo].off);
}

void dt_zero_piece(const dt_zero_shards *s, const dt_tensor_info *tensors, int t, int r, size_t *a, size_t *b) {
    const dt_zero_region *g = &s->r[s->region[t]];
    size_t v0 = s->tv[t], v1 = v0 + tensors[t].count, s0 = g->offs[r], s1 = s0 + g->counts[r];
    size_t x0 = v0 > s0 ? v0 : s0, x1 = v1 < s1 ? v1 : s1;
    if (x0 > x1) x0 = x1;
    *a = tensors[t].offset + (x0 - v0);
    *b = tensors[t].offset + (x1 - v0);
}
