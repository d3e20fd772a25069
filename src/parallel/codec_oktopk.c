/* Ok-TopK's sparse allreduce (Li and Hoefler, PPoPP'22): each rank's chosen (index, value) pairs are reduced region
 * by region, then only the sums at or above a global threshold are gathered, so a rank moves O(k) pairs however many
 * ranks there are (the allgather moves k (P - 1)).
 *
 * The bucket's entries are split into P regions, region j reduced by rank j. The regions are balanced by the chosen
 * entries, not by length: each rank cuts its own ascending choice into P equal parts, and the cut points, averaged
 * over the ranks (one allreduce), are the regions' bounds. One step runs, each a collective: the bounds (on a refresh
 * step), the pair counts each rank sends each (an alltoall), the pairs themselves (point to point, rank r sending to
 * r + s while receiving from r - s at step s), each owner summing what it got in rank order; the count of the sums
 * it keeps (an allgather) and those sums, to every rank. A refresh step (the first, then every --compress-refresh)
 * keeps every sum and sets the global threshold to the k-th largest magnitude among all of them (0 where there are at
 * most k: every one is kept); the steps between keep the sums at or above it, chosen by their owner.
 *
 * The result is the kept sums over the ranks: exactly the sum of the chosen values at the kept entries, in rank order.
 * A rank's chosen entry the global selection left out goes back into its residual (and, under DGC, its velocity), so
 * sent + residual = accumulated, as for every codec.
 *
 * Not as the paper: each rank still chooses exactly its top k (the sampled candidates, codec_topk.c) where the paper
 * reuses a local threshold too; bounds and the global threshold are recomputed on the same steps (the paper: every 64
 * and every 32). */
#include "codec_sparse.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

enum { BOUNDS, COUNTS, PAIRS, SIZES, GATHER };

struct dt_oktopk {
    int phase;             /* the collective in flight */
    int p, me;
    bool have, refresh;    /* bounds and threshold set; this step recomputes them */
    float thr;             /* the global threshold */
    uint64_t *lo;          /* p + 1: region j is [lo[j], lo[j + 1]) of the bucket's entries */
    int64_t *cut;          /* p - 1: this rank's cut points, then every rank's summed */
    int64_t *sc64, *rc64;  /* p: the pairs this rank sends each rank, and gets from each */
    size_t *sc, *sd, *rc, *rd; /* the same as counts and displacements */
    size_t *gs, *gc, *zero; /* the kept sums: sent to each rank (this rank's count), got from each; zeros */
    uint64_t *recv, *block, *all; /* pairs (index | value bits << 32): received for this region; kept here; everyone's */
    size_t recv_cap, block_n, block_cap, all_n, all_cap;
    int64_t bn64, *gn64;   /* the kept count, and every rank's */
    float *sum;            /* this region's sums, and whether each was hit */
    uint8_t *hit;
    size_t region_cap, hit_cap;
    float *mags;           /* the refresh's magnitudes */
};

/* *buf (of *cap elements of size bytes) grown to hold n. */
static dt_status room(void **buf, size_t *cap, size_t n, size_t size) {
    if (n <= *cap) return DT_OK;
    size_t want = n + n / 4 + 16;
    void *b = realloc(*buf, want * size);
    if (!b) return dt_error(DT_ERR_NOMEM, "oktopk: out of memory");
    *buf = b;
    *cap = want;
    return DT_OK;
}

static dt_status make(int p, dt_oktopk **out) {
    dt_oktopk *o = calloc(1, sizeof *o);
    if (!(*out = o)) return dt_error(DT_ERR_NOMEM, "oktopk: out of memory");
    o->p = p;
    size_t n = (size_t)p + 1;
    o->lo = calloc(n, sizeof *o->lo), o->cut = calloc(n, sizeof *o->cut), o->sc64 = calloc(n, sizeof *o->sc64);
    o->rc64 = calloc(n, sizeof *o->rc64), o->gn64 = calloc(n, sizeof *o->gn64);
    o->sc = calloc(n, sizeof *o->sc), o->sd = calloc(n, sizeof *o->sd), o->rc = calloc(n, sizeof *o->rc);
    o->rd = calloc(n, sizeof *o->rd), o->gc = calloc(n, sizeof *o->gc), o->zero = calloc(n, sizeof *o->zero);
    o->gs = calloc(n, sizeof *o->gs);
    if (!o->lo || !o->cut || !o->sc64 || !o->rc64 || !o->gn64 || !o->sc || !o->sd || !o->rc || !o->rd || !o->gs || !o->gc || !o->zero)
        return dt_error(DT_ERR_NOMEM, "oktopk: out of memory");
    return DT_OK;
}

/* The pairs for each region: counts and displacements into p->pairs (ascending: each region a run), then the counts
 * to their owners. */
static dt_status send_counts(dt_oktopk *o, dt_comm *comm, const dt_sparse_bucket *p, dt_request **req) {
    size_t at = 0;
    for (int j = 0; j < o->p; j++) {
        o->sd[j] = at;
        while (at < p->k && (uint32_t)p->pairs[at] < o->lo[j + 1]) at++;
        o->sc[j] = at - o->sd[j];
        o->sc64[j] = (int64_t)o->sc[j];
    }
    o->phase = COUNTS;
    return dt_comm_ialltoall(comm, o->sc64, o->rc64, 1, DT_I64, req);
}

dt_status dt_oktopk_start(dt_codec *k, dt_comm *comm, dt_sparse_bucket *p, dt_request **req) {
    dt_status st = p->ok ? DT_OK : make(dt_comm_size(comm), &p->ok);
    if (st) return st;
    dt_oktopk *o = p->ok;
    if (o->p != dt_comm_size(comm)) return dt_error(DT_ERR_ARG, "oktopk: regions for %d ranks on %d", o->p, dt_comm_size(comm));
    o->me = dt_comm_rank(comm);
    int refresh = k->c.refresh > 0 ? k->c.refresh : 32;
    o->refresh = !o->have || k->steps % refresh == 0;
    const uint64_t *mine = p->pairs;
    if (!o->refresh) return send_counts(o, comm, p, req);
    for (int i = 1; i < o->p; i++) /* this rank's cut points: its choice in P equal parts */
        o->cut[i - 1] = (int64_t)(p->k ? (uint32_t)mine[p->k * (size_t)i / (size_t)o->p] : p->len * (size_t)i / (size_t)o->p);
    o->phase = BOUNDS;
    return dt_comm_iallreduce(comm, o->cut, o->cut, (size_t)(o->p - 1), DT_I64, DT_SUM, req);
}

/* The regions' bounds from every rank's cut points, summed: their average. */
static void set_bounds(dt_oktopk *o, const dt_sparse_bucket *p) {
    o->lo[0] = 0, o->lo[o->p] = p->len;
    for (int i = 1; i < o->p; i++) o->lo[i] = (uint64_t)o->cut[i - 1] / (uint64_t)o->p;
}

/* The counts are in: room for the pairs this region gets, then the pairs. */
static dt_status send_pairs(dt_oktopk *o, dt_comm *comm, const dt_sparse_bucket *p, dt_request **req) {
    size_t total = 0;
    for (int j = 0; j < o->p; j++) o->rc[j] = (size_t)o->rc64[j], o->rd[j] = total, total += o->rc[j];
    dt_status st = room((void **)&o->recv, &o->recv_cap, total, sizeof *o->recv);
    if (st) return st;
    o->phase = PAIRS;
    return dt_comm_ialltoallv(comm, p->pairs, o->sc, o->sd, o->recv, o->rc, o->rd, DT_I64, req);
}

/* Whether this region's entry e goes to every rank: hit, and on a refresh step whatever its size, else at or above the
 * threshold. */
static bool keeps(const dt_oktopk *o, size_t e) { return o->hit[e] && (o->refresh || fabsf(o->sum[e]) >= o->thr); }

/* This region's sums, each rank's pairs added in rank order (the first value taken as it is), then the sums it keeps:
 * every one on a refresh step, else those at or above the threshold; their count to every rank. */
static dt_status reduce_region(dt_oktopk *o, dt_comm *comm, dt_request **req) {
    uint64_t lo = o->lo[o->me];
    size_t L = (size_t)(o->lo[o->me + 1] - lo), kept = 0;
    dt_status st = room((void **)&o->sum, &o->region_cap, L, sizeof *o->sum);
    if (!st) st = room((void **)&o->hit, &o->hit_cap, L, sizeof *o->hit);
    if (st) return st;
    if (L) memset(o->hit, 0, L);
    for (int r = 0; r < o->p; r++)
        for (size_t m = 0; m < o->rc[r]; m++) {
            uint64_t x = o->recv[o->rd[r] + m];
            size_t e = (uint32_t)x - lo;
            float v = dt_sparse_value(x);
            o->sum[e] = o->hit[e] ? o->sum[e] + v : v;
            o->hit[e] = 1;
        }
    for (size_t e = 0; e < L; e++) kept += keeps(o, e);
    if ((st = room((void **)&o->block, &o->block_cap, kept, sizeof *o->block))) return st;
    o->block_n = 0;
    for (size_t e = 0; e < L; e++)
        if (keeps(o, e)) o->block[o->block_n++] = dt_sparse_pack((uint32_t)(lo + e), o->sum[e]);
    o->bn64 = (int64_t)o->block_n;
    o->phase = SIZES;
    return dt_comm_iallgather(comm, &o->bn64, o->gn64, 1, DT_I64, req);
}

/* Every rank's kept sums, the same block to each. */
static dt_status gather(dt_oktopk *o, dt_comm *comm, dt_request **req) {
    o->all_n = 0;
    for (int j = 0; j < o->p; j++) o->gc[j] = (size_t)o->gn64[j], o->all_n += o->gc[j], o->gs[j] = o->block_n;
    dt_status st = room((void **)&o->all, &o->all_cap, o->all_n, sizeof *o->all);
    if (st) return st;
    o->phase = GATHER;
    return dt_comm_ialltoallv(comm, o->block, o->gs, o->zero, o->all, o->gc, NULL, DT_I64, req);
}

/* A refresh step's global threshold: the k-th largest magnitude of every sum (0 where there are at most k). */
static dt_status set_threshold(dt_oktopk *o, size_t k) {
    o->have = true;
    if (o->all_n <= k) { o->thr = 0; return DT_OK; }
    float *m = realloc(o->mags, sizeof *m * o->all_n);
    if (!m) return dt_error(DT_ERR_NOMEM, "oktopk: out of memory");
    o->mags = m;
    for (size_t i = 0; i < o->all_n; i++) m[i] = fabsf(dt_sparse_value(o->all[i]));
    o->thr = dt_sparse_kth_largest(m, o->all_n, k);
    return DT_OK;
}

/* This rank's m-th chosen entry, not kept, back into its residual (and DGC's velocity); *ti: where the search for its
 * tensor starts (they ascend). */
static void put_back(dt_codec *k, const dt_sparse_bucket *p, size_t m, int *ti) {
    size_t j;
    dt_sparse_locate(p, (uint32_t)p->pairs[m], ti, &j);
    dt_codec_state_held(k, p->t[*ti], DT_CODEC_RESIDUAL)[j] = dt_sparse_value(p->pairs[m]);
    if (p->uval) dt_codec_state_held(k, p->t[*ti], DT_CODEC_VELOCITY)[j] = p->uval[m];
}

/* The kept sums, divided by the ranks, into g (the bucket zeroed first); this rank's chosen entries that were not kept
 * back (put_back). Both lists ascend by index. */
static void finish(dt_codec *k, dt_oktopk *o, dt_sparse_bucket *p, float *g) {
    for (int i = 0; i < p->n; i++) memset(g + k->t[p->t[i]].offset, 0, k->t[p->t[i]].count * sizeof *g);
    int ti = 0, mi = 0;
    size_t m = 0;
    for (size_t a = 0; a < o->all_n; a++) {
        uint64_t x = o->all[a];
        float v = dt_sparse_value(x);
        if (o->refresh && !(fabsf(v) >= o->thr)) continue;
        uint32_t e = (uint32_t)x;
        size_t j;
        dt_sparse_locate(p, e, &ti, &j);
        g[k->t[p->t[ti]].offset + j] = v / (float)o->p;
        for (; m < p->k && (uint32_t)p->pairs[m] < e; m++) put_back(k, p, m, &mi);
        if (m < p->k && (uint32_t)p->pairs[m] == e) m++;
    }
    for (; m < p->k; m++) put_back(k, p, m, &mi);
    /* what this rank put on the wire: its pairs for other regions and its kept sums (once); what it received */
    size_t sent = p->k - o->sc[o->me] + o->block_n, got = o->all_n - o->block_n;
    for (int r = 0; r < o->p; r++) got += r == o->me ? 0 : o->rc[r];
    k->now.after += 2 * sent;
    k->now.bytes += (double)sent * sizeof(uint64_t);
    k->now.received += (double)got * sizeof(uint64_t);
}

dt_status dt_oktopk_next(dt_codec *k, dt_comm *comm, dt_sparse_bucket *p, float *g, dt_request **req, int *done) {
    dt_oktopk *o = p->ok;
    dt_status st = DT_OK;
    switch (o->phase) {
    case BOUNDS: set_bounds(o, p); return send_counts(o, comm, p, req);
    case COUNTS: return send_pairs(o, comm, p, req);
    case PAIRS: return reduce_region(o, comm, req);
    case SIZES: return gather(o, comm, req);
    default:
        if (o->refresh) st = set_threshold(o, p->k);
        if (!st) finish(k, o, p, g);
        *done = 1;
        return st;
    }
}

int dt_oktopk_next_collective(const dt_sparse_bucket *p) { return p->ok->phase != GATHER; }

void dt_oktopk_destroy(dt_oktopk *o) {
    if (!o) return;
    free(o->lo), free(o->cut), free(o->sc64), free(o->rc64), free(o->gn64);
    free(o->sc), free(o->sd), free(o->rc), free(o->rd), free(o->gs), free(o->gc), free(o->zero);
    free(o->recv), free(o->block), free(o->all), free(o->sum), free(o->hit), free(o->mags);
    free(o);
}

/* The state across steps as words: [have, the threshold's bits, p, lo[0..p] as low and high words]; [0] where none. */
size_t dt_oktopk_state_words(const dt_oktopk *o) { return o && o->have ? 3 + 2 * ((size_t)o->p + 1) : 1; }

void dt_oktopk_state_out(const dt_oktopk *o, uint32_t *w) {
    w[0] = o && o->have;
    if (!w[0]) return;
    memcpy(&w[1], &o->thr, sizeof w[1]);
    w[2] = (uint32_t)o->p;
    for (int j = 0; j <= o->p; j++) w[3 + 2 * j] = (uint32_t)o->lo[j], w[4 + 2 * j] = (uint32_t)(o->lo[j] >> 32);
}

dt_status dt_oktopk_state_in(const uint32_t *w, size_t n, dt_oktopk **out, size_t *used) {
    *out = NULL;
    *used = 1;
    if (n < 1 || w[0] > 1) return dt_error(DT_ERR_IO, "oktopk: a bucket's state begins with 0 or 1, not %u", n ? w[0] : 0);
    if (!w[0]) return DT_OK;
    if (n < 3 || w[2] < 1 || w[2] > 1u << 20 || n < 3 + 2 * ((size_t)w[2] + 1))
        return dt_error(DT_ERR_IO, "oktopk: a bucket's state is cut short or names %u ranks", n >= 3 ? w[2] : 0);
    dt_status st = make((int)w[2], out);
    if (st) { dt_oktopk_destroy(*out); *out = NULL; return st; }
    dt_oktopk *o = *out;
    o->have = true;
    memcpy(&o->thr, &w[1], sizeof o->thr);
    for (int j = 0; j <= o->p; j++) {
        o->lo[j] = (uint64_t)w[3 + 2 * j] | (uint64_t)w[4 + 2 * j] << 32;
        if (j && o->lo[j] < o->lo[j - 1]) { dt_oktopk_destroy(o); *out = NULL; return dt_error(DT_ERR_IO, "oktopk: a bucket's regions do not ascend"); }
    }
    *used = 3 + 2 * ((size_t)o->p + 1);
    return DT_OK;
}

size_t dt_oktopk_entries(const dt_oktopk *o) { return (size_t)o->lo[o->p]; }
