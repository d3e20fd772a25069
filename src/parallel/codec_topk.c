/* Top-k sparsification with error feedback (Aji and Heafield 2017; Stich et al. 2018, "Sparsified SGD with Memory"):
 * per bucket, the last step's residual is added to the gradient and the sum kept; the k = ceil(D n) entries of largest
 * magnitude of the bucket's n (ties broken by place: the earlier first) go to every rank as (index, value) pairs, one
 * allgather (every rank sends k); each rank sums every rank's pairs in rank order and divides by the ranks; the
 * residual is what was kept with the sent entries zeroed, so sent + residual = gradient + old residual exactly.
 *
 * The selection reads the bucket twice, not once a partition pass: a strided sample (1/64 of the entries, read as the
 * residual is added) puts a threshold at about 2k entries; the entries at or above it are the candidates (one pass),
 * and the exact k-th magnitude and the choice are made among them. Where fewer than k pass (a sample that missed),
 * every entry is a candidate: the choice is the same, only slower. (d6's 2-rank step: +66 ms over dense with a
 * partition of every entry, +25 with the candidates.)
 *
 * DGC is this exchange with another rule for what accumulates (codec_dgc.c: clipping, momentum correction; the sent
 * entries' velocity zeroed too) and, for either, a warm-up of densities: k is the step's, the buffers the largest's. */
#include "codec_sparse.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

typedef dt_sparse_bucket tbucket;

enum { SAMPLE = 64 }; /* one entry in SAMPLE read for the threshold's guess */

typedef struct {
    tbucket *b;
    int nb;
    dt_oktopk **loaded; /* a checkpoint's Ok-TopK state per bucket, until the bucket's first exchange takes it */
    int nloaded;
    dt_sparse_groups groups; /* the hierarchical exchange's */
    int fits, asked;    /* whether the communicator's machines hold equal rank counts, and whether that was asked */
} topk;

static dt_status check(const dt_codec_config *c) {
    if (!(c->density > 0 && c->density <= 1)) return dt_error(DT_ERR_ARG, "--compress-density %g: a share of the entries in (0, 1]", c->density);
    if (c->warmup < 0) return dt_error(DT_ERR_ARG, "--compress-warmup %d: steps at each warm-up density, 0 or more", c->warmup);
    if (c->kind == DT_CODEC_DGC && !(c->momentum >= 0 && c->momentum < 1))
        return dt_error(DT_ERR_ARG, "--compress dgc: momentum %g must be in [0, 1)", c->momentum);
    if (c->kind == DT_CODEC_DGC && c->exchange == DT_SPARSE_HIER)
        return dt_error(DT_ERR_ARG, "--compress dgc --compress-exchange hier: DGC's momentum is each rank's own, not a machine's sum "
                        "(allgather or oktopk)");
    if (c->kind == DT_CODEC_DGC && !(c->clip >= 0)) return dt_error(DT_ERR_ARG, "--compress dgc: a clipping norm %g below 0", c->clip);
    return DT_OK;
}

static size_t state_floats(const dt_codec_config *c, const dt_tensor_info *t, dt_codec_state_kind s) {
    return s == DT_CODEC_RESIDUAL || (s == DT_CODEC_VELOCITY && c->kind == DT_CODEC_DGC) ? t->count : 0;
}

/* k of a bucket of len entries at density d: at least 1, at most len. */
static size_t count_at(double d, size_t len) {
    size_t k = (size_t)ceil(d * (double)len);
    return k < 1 ? 1 : k > len ? len : k;
}

/* The k-th largest of x[0..n) (1 <= k <= n), x reordered: quickselect on a copy. */
float dt_sparse_kth_largest(float *x, size_t n, size_t k) {
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

/* Auto's pick by the cost model for a bucket of len entries and kmax pairs a rank on P ranks over nodes machines of
 * local ranks each (hier: the hierarchical exchange may run there). The run's and the planner's. */
static dt_sparse_exchange auto_pick(double P, int nodes, int local, size_t len, size_t kmax, bool hier) {
    double ia, ib, gamma, xa, xb, tg, tok, th = INFINITY;
    dt_comm_link_costs(&ia, &ib, &gamma, &xa, &xb);
    bool across = nodes > 1; /* the group's link between machines, else shared memory's */
    dt_codec_sparse_times(P, (double)kmax, across ? xa : ia, across ? xb : ib, &tg, &tok);
    if (hier) th = dt_codec_hier_time(local, nodes, (double)len, (double)kmax, ia, ib, xa, xb);
    return th < tg && th < tok ? DT_SPARSE_HIER : tok < tg ? DT_SPARSE_OKTOPK : DT_SPARSE_ALLGATHER;
}

/* The pairs' room, in 64-bit words: a rank's own kmax, and for the allgather every one of np ranks' too. */
static size_t pairs_room(dt_sparse_exchange x, size_t kmax, size_t np) { return kmax * (x != DT_SPARSE_ALLGATHER ? 1 : np + 1); }

/* How bucket p's pairs travel: as named, or auto's pick by the cost model (the hierarchical exchange among them where
 * the communicator spans machines of equal rank counts: asked once, a collective every rank makes at the same point). */
static dt_status pick_exchange(dt_codec *k, topk *s, dt_comm *comm, tbucket *p, int b) {
    dt_status st = DT_OK;
    p->exchange = k->c.exchange;
    if (p->exchange == DT_SPARSE_AUTO) {
        if (!s->asked) s->asked = 1, st = dt_comm_nodes(comm) > 1 && k->c.kind != DT_CODEC_DGC ? dt_sparse_hier_fits(comm, &s->fits) : DT_OK;
        if (st) return st;
        double P = dt_comm_size(comm);
        p->exchange = auto_pick(P, dt_comm_nodes(comm), dt_comm_local_size(comm), p->len, p->kmax, s->fits);
        if (P > 2 && dt_comm_rank(comm) == 0)
            dt_log(DT_LOG_INFO, "%s: bucket %d's %zu pairs a rank travel by %s (--compress-exchange auto: the cost model's pick on %d ranks)",
                   dt_codec_name(k->c.kind), b, p->kmax, dt_codec_exchange_name(p->exchange), (int)P);
    }
    return p->exchange == DT_SPARSE_HIER ? dt_sparse_groups_make(comm, &s->groups) : DT_OK;
}

/* Bucket b's sizes and buffers, made at its first exchange. */
static dt_status setup(dt_codec *k, topk *s, dt_comm *comm, int b, const int *idx, int n, tbucket **out) {
    dt_status st = dt_codec_grow((void **)&s->b, &s->nb, sizeof *s->b, b);
    if (st) return st;
    tbucket *p = &s->b[b];
    *out = p;
    p->n = n;
    if ((st = dt_codec_layout(k, idx, n, &p->t, &p->at, &p->len))) return st;
    p->kmax = count_at(dt_codec_density_max(&k->c), p->len);
    if (p->len > UINT32_MAX) return dt_error(DT_ERR_ARG, "topk: a bucket of %zu entries: at most 2^32 (smaller --bucket-mb)", p->len);
    if (!(p->sample = malloc(sizeof *p->sample * (p->len / SAMPLE + 1)))) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    if (k->c.kind == DT_CODEC_DGC && !(p->uval = malloc(sizeof *p->uval * p->kmax))) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    if ((st = pick_exchange(k, s, comm, p, b))) return st;
    /* the allgather's room: this rank's pairs, then every rank's */
    size_t words = pairs_room(p->exchange, p->kmax, (size_t)dt_comm_size(comm));
    if (b < s->nloaded && s->loaded[b]) { /* a resumed run's regions and threshold, where they fit this bucket */
        if (p->exchange == DT_SPARSE_OKTOPK && dt_oktopk_entries(s->loaded[b]) == p->len) p->ok = s->loaded[b];
        else {
            dt_log(DT_LOG_WARN, "oktopk: the checkpoint's regions for bucket %d do not fit it (another --bucket-mb or exchange?): "
                   "recomputed at its first step, so this run parts from the uninterrupted one", b);
            dt_oktopk_destroy(s->loaded[b]);
        }
        s->loaded[b] = NULL;
    }
    return dt_comm_alloc(comm, words * sizeof *p->pairs, (void **)&p->pairs);
}

/* A magnitude's bits: non-negative floats order as their bits do. */
static uint32_t bits_of(float a) {
    uint32_t u;
    memcpy(&u, &a, sizeof u);
    return u;
}

/* The candidates' room: the planner's 4 kmax + 64 (the sample's threshold passes about 2 k), or need where more. */
static dt_status room(tbucket *p, size_t need) {
    size_t cap = need > 4 * p->kmax + 64 ? need : 4 * p->kmax + 64;
    if (cap <= p->cap) return DT_OK;
    size_t *nc = realloc(p->cand, sizeof *nc * cap);
    if (nc) p->cand = nc;
    float *nm = nc ? realloc(p->mag, sizeof *nm * cap) : NULL;
    if (nm) p->mag = nm;
    float *nw = nm ? realloc(p->work, sizeof *nw * cap) : NULL;
    if (!nw) return dt_error(DT_ERR_NOMEM, "topk: out of memory");
    p->work = nw;
    p->cap = cap;
    return DT_OK;
}

/* One pass over [lo, hi): the entries whose magnitude's bits are above t, and of those equal to t the first `ties`
 * (SIZE_MAX: all); stored ascending while the room lasts where store. Their count (stored or not). */
static size_t gather(dt_codec *k, tbucket *p, size_t lo, size_t hi, uint32_t t, size_t ties, bool store) {
    size_t c = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->at[i + 1] <= lo || p->at[i] >= hi) continue;
        const float *res = dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL);
        size_t j0 = lo > p->at[i] ? lo - p->at[i] : 0, j1 = (hi < p->at[i + 1] ? hi : p->at[i + 1]) - p->at[i];
        for (size_t j = j0; j < j1; j++) {
            float a = fabsf(res[j]);
            uint32_t u = bits_of(a);
            if (u < t || (u == t && !ties) || a != a) continue; /* a NaN is never a candidate */
            if (u == t && ties != SIZE_MAX) ties--;
            if (store && c < p->cap) p->mag[c] = a, p->cand[c] = p->at[i] + j;
            c++;
        }
    }
    return c;
}

/* Candidates for the top kk of [lo, hi), ascending, within the room: those at or above the sample's guess where at
 * least kk and at most the room pass it (one pass); else the threshold whose count lies between, found by halving
 * the interval of the magnitudes' bits on the counts; where equal magnitudes leave no such threshold (a is the
 * highest that at least kk reach), those above a and the first of those equal to a, kk in all. Every way the top kk
 * are among them, so the choice is the same; the room stays the planner's (grown only where the range has fewer
 * entries than kk, all taken). */
static dt_status candidates(dt_codec *k, tbucket *p, float guess, size_t lo, size_t hi, size_t kk, size_t *count) {
    dt_status st = room(p, 0);
    if (st) return st;
    uint32_t t = bits_of(guess);
    size_t n = gather(k, p, lo, hi, t, SIZE_MAX, true);
    if (n >= kk && n <= p->cap) { *count = n; return DT_OK; }
    if (hi - lo <= kk) { /* every entry */
        if ((st = room(p, hi - lo))) return st;
        *count = gather(k, p, lo, hi, 0, SIZE_MAX, true);
        return DT_OK;
    }
    /* count(a) >= kk > count(b) (b past every float's bits); fewer than kk above zero (a sparse gradient's zeros): a is 0 */
    uint64_t a = n >= kk ? t : 0, b = n >= kk ? (uint64_t)1 << 32 : t;
    size_t ca = n >= kk ? n : hi - lo;
    if (a == 0 && b > 1 && gather(k, p, lo, hi, 1, SIZE_MAX, false) < kk) b = 1;
    while (ca > p->cap && b - a > 1) {
        uint64_t m = a + (b - a) / 2;
        size_t c = gather(k, p, lo, hi, (uint32_t)m, SIZE_MAX, false);
        if (c >= kk) a = m, ca = c;
        else b = m;
    }
    if (ca <= p->cap) { *count = gather(k, p, lo, hi, (uint32_t)a, SIZE_MAX, true); return DT_OK; }
    size_t above = gather(k, p, lo, hi, (uint32_t)a + 1, SIZE_MAX, false);
    *count = gather(k, p, lo, hi, (uint32_t)a, kk - above, true);
    return DT_OK;
}

dt_status dt_sparse_choose(dt_codec *k, dt_sparse_bucket *p, size_t lo, size_t hi, size_t kk) {
    if (!kk) return DT_OK;
    bool dgc = k->c.kind == DT_CODEC_DGC;
    /* the sample: every SAMPLE-th entry of the bucket in [lo, hi) */
    size_t ns = 0;
    for (int i = 0; i < p->n; i++) {
        if (p->at[i + 1] <= lo || p->at[i] >= hi) continue;
        const float *res = dt_codec_state_held(k, p->t[i], DT_CODEC_RESIDUAL);
        size_t j0 = lo > p->at[i] ? lo - p->at[i] : 0, j1 = (hi < p->at[i + 1] ? hi : p->at[i + 1]) - p->at[i];
        for (size_t j = j0 + (SAMPLE - (p->at[i] + j0) % SAMPLE) % SAMPLE; j < j1; j += SAMPLE) p->sample[ns++] = fabsf(res[j]);
    }
    /* the sample's magnitude at about 2k of the range's entries: the candidates at or above it, or (fewer than k) all */
    size_t want = (size_t)ceil(2.0 * (double)kk * (double)ns / (double)(hi - lo)) + 1, nc;
    float guess = ns && want <= ns ? dt_sparse_kth_largest(p->sample, ns, want) : 0;
    dt_status st = candidates(k, p, guess, lo, hi, kk, &nc);
    if (st) return st;
    /* the k-th magnitude among them; the entries above it, then those equal to it in order, up to k */
    size_t above = 0, m = 0;
    memcpy(p->work, p->mag, sizeof *p->work * nc);
    float thr = dt_sparse_kth_largest(p->work, nc, kk);
    for (size_t c = 0; c < nc; c++) above += p->mag[c] > thr;
    size_t ties = kk - above;
    int ti = 0;
    for (size_t c = 0; c < nc && m < kk; c++) {
        float a = p->mag[c];
        if (a < thr || (a == thr && !ties)) continue;
        if (a == thr) ties--;
        size_t j;
        dt_sparse_locate(p, p->cand[c], &ti, &j);
        float *res = dt_codec_state_held(k, p->t[ti], DT_CODEC_RESIDUAL);
        p->pairs[m] = dt_sparse_pack((uint32_t)p->cand[c], res[j]);
        res[j] = 0; /* sent: what stays is the residual */
        if (dgc) { /* momentum factor masking */
            float *u = dt_codec_state_held(k, p->t[ti], DT_CODEC_VELOCITY);
            p->uval[m] = u[j];
            u[j] = 0;
        }
        m++;
    }
    return DT_OK;
}

/* Each tensor's residual made (and DGC's velocity), the bucket's entries counted. */
static dt_status states(dt_codec *k, const int *idx, int n) {
    bool dgc = k->c.kind == DT_CODEC_DGC;
    for (int i = 0; i < n; i++) {
        size_t ne;
        if (!dt_codec_state(k, idx[i], DT_CODEC_RESIDUAL, &ne) || (dgc && !dt_codec_state(k, idx[i], DT_CODEC_VELOCITY, &ne)))
            return dt_error(DT_ERR_NOMEM, "topk: out of memory");
        k->now.before += k->t[idx[i]].count;
    }
    return DT_OK;
}

static dt_status start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, int first, dt_request **req) {
    topk *s = k->impl;
    tbucket *p = first ? NULL : &s->b[b];
    dt_status st = first ? setup(k, s, comm, b, idx, n, &p) : DT_OK;
    if (!st && p->busy) st = dt_error(DT_ERR_ARG, "topk: bucket %d started again before its exchange ended", b);
    if (!st) st = states(k, idx, n);
    if (st) return st;
    p->k = count_at(dt_codec_density_at(&k->c, k->steps), p->len);
    p->busy = 1;
    if (p->exchange == DT_SPARSE_HIER) return dt_sparse_hier_start(k, &s->groups, p, g, req);
    bool dgc = k->c.kind == DT_CODEC_DGC;
    const float *params = dgc && k->model ? k->model->params(k->model->self) : NULL;
    for (int i = 0; i < n; i++) { /* kept; the sent entries leave it below */
        const dt_tensor_info *t = &k->t[idx[i]];
        float *res = dt_codec_state_held(k, idx[i], DT_CODEC_RESIDUAL), *x = g + t->offset;
        if (dgc) dt_dgc_accumulate(&k->c, x, params ? params + t->offset : NULL, dt_codec_state_held(k, idx[i], DT_CODEC_VELOCITY), res, t->count);
        else
            for (size_t j = 0; j < t->count; j++) res[j] = x[j] + res[j];
    }
    if ((st = dt_sparse_choose(k, p, 0, p->len, p->k))) return st;
    if (p->exchange == DT_SPARSE_OKTOPK) return dt_oktopk_start(k, comm, p, req);
    k->now.after += 2 * p->k;
    k->now.bytes += (double)p->k * sizeof *p->pairs;
    k->now.received += (double)p->k * sizeof *p->pairs * (double)(dt_comm_size(comm) - 1);
    return dt_comm_iallgather(comm, p->pairs, p->pairs + p->k, p->k, DT_I64, req);
}

static dt_status next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    (void)req;
    topk *s = k->impl;
    tbucket *p = b >= 0 && b < s->nb ? &s->b[b] : NULL;
    if (!p || !p->busy) return dt_error(DT_ERR_ARG, "topk: bucket %d has no exchange in flight", b);
    if (p->exchange != DT_SPARSE_ALLGATHER) {
        dt_status st = p->exchange == DT_SPARSE_OKTOPK ? dt_oktopk_next(k, comm, p, g, req, done) : dt_sparse_hier_next(k, &s->groups, p, g, req, done);
        if (*done || st) p->busy = 0;
        return st;
    }
    for (int i = 0; i < p->n; i++) memset(g + k->t[p->t[i]].offset, 0, k->t[p->t[i]].count * sizeof *g);
    int np = dt_comm_size(comm);
    const uint64_t *all = p->pairs + p->k;
    for (int r = 0; r < np; r++) {
        int ti = 0; /* each rank's pairs come in ascending order */
        for (size_t m = 0; m < p->k; m++) {
            size_t j;
            uint64_t x = all[(size_t)r * p->k + m];
            dt_sparse_locate(p, (uint32_t)x, &ti, &j);
            g[k->t[p->t[ti]].offset + j] += dt_sparse_value(x);
        }
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
    const topk *s = k->impl;
    if (b < 0 || b >= s->nb || !s->b[b].busy) return 0;
    const tbucket *p = &s->b[b];
    return p->exchange == DT_SPARSE_OKTOPK ? dt_oktopk_next_collective(p) : p->exchange == DT_SPARSE_HIER && dt_sparse_hier_next_collective(p);
}

/* Ok-TopK's state across steps, the same on every rank, as words: [buckets, each bucket's]; none where no bucket runs
 * Ok-TopK. */
static size_t shared_words(const dt_codec *k) {
    const topk *s = k->impl;
    size_t n = 1;
    bool any = false;
    for (int b = 0; b < s->nb; b++) n += dt_oktopk_state_words(s->b[b].ok), any |= s->b[b].ok != NULL;
    return any ? n : 0;
}

static dt_status shared_io(dt_codec *k, uint32_t *w, size_t n, int load) {
    topk *s = k->impl;
    if (!load) {
        if (n != shared_words(k)) return dt_error(DT_ERR_ARG, "topk: %zu words for a state of %zu", n, shared_words(k));
        if (!n) return DT_OK;
        w[0] = (uint32_t)s->nb;
        size_t at = 1;
        for (int b = 0; b < s->nb; b++) {
            dt_oktopk_state_out(s->b[b].ok, w + at);
            at += dt_oktopk_state_words(s->b[b].ok);
        }
        return DT_OK;
    }
    if (!n) return DT_OK;
    if (w[0] > n - 1) return dt_error(DT_ERR_IO, "oktopk: the state names %u buckets in %zu words", w[0], n);
    dt_status st = dt_codec_grow((void **)&s->loaded, &s->nloaded, sizeof *s->loaded, (int)w[0] - 1);
    size_t at = 1, used;
    for (int b = 0; !st && b < (int)w[0]; b++, at += used) st = dt_oktopk_state_in(w + at, n - at, &s->loaded[b], &used);
    if (!st && at != n) st = dt_error(DT_ERR_IO, "oktopk: the state has %zu words past its buckets'", n - at);
    return st;
}

static void destroy(dt_codec *k) {
    topk *s = k->impl;
    if (!s) return;
    for (int b = 0; b < s->nloaded; b++) dt_oktopk_destroy(s->loaded[b]);
    dt_sparse_groups_destroy(&s->groups);
    free(s->loaded);
    for (int b = 0; b < s->nb; b++) {
        free(s->b[b].t);
        free(s->b[b].at);
        free(s->b[b].sample);
        free(s->b[b].mag);
        free(s->b[b].cand);
        free(s->b[b].work);
        free(s->b[b].uval);
        dt_oktopk_destroy(s->b[b].ok);
        dt_sparse_hier_destroy(s->b[b].hier);
        if (s->b[b].pairs) dt_comm_free(k->comm, s->b[b].pairs);
    }
    free(s->b);
}

/* A bucket's of len entries sending at most kmax pairs a rank, candidates room for cap: the threshold's sample, the
 * candidates (entry, magnitude, a copy to select in), the pairs (the allgather's: every rank's too), DGC's chosen
 * velocities. (Ok-TopK's tables beside them are a few words a rank, not counted; the hierarchical exchange's buffers,
 * a copy of the bucket among them, are: dt_sparse_hier_bytes.) */
static size_t bucket_bytes(const dt_codec_config *c, size_t len, size_t kmax, size_t cap, size_t pairs) {
    return (len / SAMPLE + 1) * sizeof(float) + cap * (sizeof(size_t) + 2 * sizeof(float)) + pairs * sizeof(uint64_t) +
           (c->kind == DT_CODEC_DGC ? kmax * sizeof(float) : 0);
}

static size_t work(const dt_codec *k) {
    const topk *s = k->impl;
    size_t b = 0, np = k->comm ? (size_t)dt_comm_size(k->comm) : 1;
    for (int i = 0; i < s->nb; i++) {
        const tbucket *p = &s->b[i];
        if (p->sample) b += bucket_bytes(&k->c, p->len, p->kmax, p->cap, pairs_room(p->exchange, p->kmax, np)) + dt_sparse_hier_held(p->hier, p->len, p->kmax);
    }
    return b;
}

/* Each bucket (none given: one of every tensor) through the exchange the run would take (named, or auto's pick: the
 * hierarchical one where the machines hold equal rank counts), its candidates' room (4 kmax + 64, which the choice
 * keeps to: candidates()). */
static size_t work_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at) {
    size_t all = 0, np = at->ranks > 1 ? (size_t)at->ranks : 1, b = 0;
    for (int i = 0; i < nt; i++) all += t[i].count;
    int q = at->nodes > 1 ? at->nodes : 1, nb = at->nbuckets > 0 ? at->nbuckets : 1;
    bool hier = q > 1 && c->kind != DT_CODEC_DGC && np % (size_t)q == 0;
    for (int i = 0; i < nb; i++) {
        size_t len = at->nbuckets > 0 ? at->lens[i] : all, kmax = count_at(dt_codec_density_max(c), len);
        dt_sparse_exchange x = c->exchange != DT_SPARSE_AUTO ? c->exchange : auto_pick((double)np, q, (int)np / q, len, kmax, hier);
        b += bucket_bytes(c, len, kmax, 4 * kmax + 64, pairs_room(x, kmax, np)) +
             (x == DT_SPARSE_HIER ? dt_sparse_hier_bytes(len, kmax, (int)np / q, q) : 0);
    }
    return b;
}

const dt_codec_ops dt_codec_topk = {
    .impl_size = sizeof(topk), .check = check, .state_floats = state_floats, .start = start, .next = next, .next_collective = next_collective, .destroy = destroy,
    .shared_words = shared_words, .shared_io = shared_io, .work = work, .work_for = work_for,
};
