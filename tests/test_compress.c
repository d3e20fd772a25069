/* Gradient codecs against their oracles, under `dtrain launch -n N`:
 * - PowerSGD against PyTorch's powerSGD_hook (2 ranks; tests/fixtures/compress, scripts/make_powersgd_fixture.py): the
 *   warm-started step's averaged gradients, residuals and Q within 1e-5, the compression rate within 1%;
 * - at full rank PowerSGD is the plain average (P spans the summed matrix's columns), on any number of ranks;
 * - top-k and DGC against a sequential oracle (each rank's accumulation and choice computed in the test, summed in rank
 *   order) bit for bit, at density 0.1 and 1, on 2-4 ranks, with ties and overlapping choices; DGC's velocities too,
 *   with momentum (plain and Nesterov's), local clipping and the warm-up's densities;
 * - 1-bit Adam's two-stage exchange against a sequential oracle bit for bit after its warm-up;
 * - error feedback: what was sent plus the new residual is the gradient plus the old one. */
#include "dtrain/codec.h"
#include "dtrain/io.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int failed, me;

static void check(const char *what, bool ok, const char *detail) {
    if (!ok) failed++;
    if (me == 0 || !ok) printf("%-72s %s%s%s\n", what, ok ? "ok" : "FAIL", detail ? "  " : "", detail ? detail : "");
}

static double rel_err(const float *a, const float *b, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) d += (a[i] - b[i]) * (double)(a[i] - b[i]), r += (double)b[i] * b[i];
    return sqrt(d) / (sqrt(r) + 1e-30);
}

/* A table of tensors one after another in a flat store. */
static size_t table(dt_tensor_info *t, int nt, const char *const *names, const int (*shape)[4]) {
    size_t at = 0;
    for (int i = 0; i < nt; i++) {
        memset(&t[i], 0, sizeof t[i]);
        snprintf(t[i].name, sizeof t[i].name, "%s", names[i]);
        t[i].count = 1;
        for (int d = 0; d < 4 && shape[i][d]; d++) t[i].shape[d] = shape[i][d], t[i].ndim = d + 1, t[i].count *= (size_t)shape[i][d];
        t[i].offset = at;
        at += t[i].count;
    }
    return at;
}

/* Bucket 0 (every tensor) through k's phases, waiting for each. */
static dt_status exchange(dt_codec *k, dt_comm *w, const int *idx, int n, float *g) {
    dt_request *req;
    int done = 0;
    dt_status st = dt_codec_start(k, w, 0, idx, n, g, &req);
    while (!st && !done) {
        if (req && (st = dt_wait(req))) break;
        st = dt_codec_next(k, w, 0, g, &req, &done);
    }
    return st;
}

/* The largest |a - b| over columns of a [m, r] matrix, each compared up to its sign (QR may flip one). */
static double q_err(const float *a, const float *b, int m, int r) {
    double worst = 0, norm = 0;
    for (int j = 0; j < r; j++) {
        double same = 0, flip = 0;
        for (int i = 0; i < m; i++) {
            double x = a[(size_t)i * r + j], y = b[(size_t)i * r + j];
            same += (x - y) * (x - y), flip += (x + y) * (x + y), norm += y * y;
        }
        worst += same < flip ? same : flip;
    }
    return sqrt(worst) / (sqrt(norm) + 1e-30);
}

static const char *const names[] = { "e", "l4.bias", "l4.weight", "l3.bias", "l3.weight", "l2.bias", "l2.weight", "l1.bias", "l1.weight" };
static const int shapes[][4] = { { 8, 5, 6 }, { 3 }, { 3, 32 }, { 32 }, { 32, 32 }, { 32 }, { 32, 32 }, { 32 }, { 32, 16 } };
enum { NT = sizeof names / sizeof *names };

static void against_torch(dt_comm *w, const char *dir, int R) {
    char path[512], name[128], what[128], detail[160];
    snprintf(path, sizeof path, "%s/compress/powersgd_r%d.safetensors", dir, R);
    dt_safetensors *f;
    if (dt_safetensors_open(path, &f)) { check(path, false, dt_last_error()); return; }
    dt_tensor_info t[NT];
    size_t total = table(t, NT, names, shapes);
    const char *order = dt_safetensors_metadata(f, "names"), *ratio = dt_safetensors_metadata(f, "ratio");
    check("powersgd fixture: the bucket's order is the test's table's", order && !strcmp(order, "e,l4.bias,l4.weight,l3.bias,l3.weight,l2.bias,l2.weight,l1.bias,l1.weight"), order);
    dt_codec_config c = { .kind = DT_CODEC_POWERSGD, .rank = R, .min_rate = 2.0f, .seed = 1 };
    dt_codec *k;
    if (dt_codec_create(&c, t, NT, &k)) { check("powersgd: create", false, dt_last_error()); dt_safetensors_close(f); return; }
    float *g = malloc(total * sizeof *g), *want = malloc(total * sizeof *want), *wres = malloc(total * sizeof *wres), *kept = malloc(total * sizeof *kept);
    int idx[NT], rank = dt_comm_rank(w);
    const char *wrong = NULL; /* a tensor compressed where the hook sent it whole, or the other way */
    dt_status st = DT_OK;
    for (int i = 0; i < NT && !st; i++) {
        size_t n;
        idx[i] = i;
        float *res = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &n), *q = dt_codec_state(k, i, DT_CODEC_Q, &n);
        snprintf(name, sizeof name, "r%d.grad.%s", rank, names[i]);
        st = dt_safetensors_read(f, name, t[i].ndim, t[i].shape, 0, g + t[i].offset);
        snprintf(name, sizeof name, "r%d.res.%s", rank, names[i]);
        if (!st) st = dt_safetensors_read(f, name, t[i].ndim, t[i].shape, 0, res);
        snprintf(name, sizeof name, "r%d.out.%s", rank, names[i]);
        if (!st) st = dt_safetensors_read(f, name, t[i].ndim, t[i].shape, 0, want + t[i].offset);
        snprintf(name, sizeof name, "r%d.newres.%s", rank, names[i]);
        if (!st) st = dt_safetensors_read(f, name, t[i].ndim, t[i].shape, 0, wres + t[i].offset);
        snprintf(name, sizeof name, "q.%s", names[i]);
        if ((q != NULL) != dt_safetensors_has(f, name)) wrong = names[i];
        int qd[2] = { (int)(t[i].count / (size_t)t[i].shape[0]), R };
        if (!st && q) st = dt_safetensors_read(f, name, 2, qd, 0, q);
        for (size_t j = 0; !st && j < t[i].count; j++) kept[t[i].offset + j] = g[t[i].offset + j] + res[j];
    }
    snprintf(what, sizeof what, "powersgd rank %d: the tensors compressed are the hook's", R);
    check(what, !wrong, wrong);
    if (!st) st = exchange(k, w, idx, NT, g);
    snprintf(what, sizeof what, "powersgd rank %d: the step runs against PyTorch's", R);
    check(what, !st, st ? dt_last_error() : NULL);
    double out = 0, res = 0, qe = 0, ef = 0, scale = 0;
    for (int i = 0; i < NT && !st; i++) {
        size_t n, nq;
        const float *r = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &n), *q = dt_codec_state(k, i, DT_CODEC_Q, &nq);
        double e = rel_err(g + t[i].offset, want + t[i].offset, n), er = rel_err(r, wres + t[i].offset, n);
        out = e > out ? e : out;
        res = er > res ? er : res;
        for (size_t j = 0; j < n; j++) {
            double kj = kept[t[i].offset + j], d = fabs((double)g[t[i].offset + j] + r[j] - kj);
            ef = d > ef ? d : ef;
            scale = fabs(kj) > scale ? fabs(kj) : scale;
        }
        if (!q) continue;
        float *wq = malloc(nq * sizeof *wq);
        int qd[2] = { (int)(nq / (size_t)R), R };
        snprintf(name, sizeof name, "newq.%s", names[i]);
        if (!dt_safetensors_read(f, name, 2, qd, 0, wq)) {
            double e2 = q_err(q, wq, qd[0], R);
            qe = e2 > qe ? e2 : qe;
        } else qe = INFINITY;
        free(wq);
    }
    dt_codec_stats s;
    dt_codec_end_step(k, &s);
    double rate = s.after ? (double)s.before / (double)s.after : 0, torch_rate = ratio ? atof(ratio) : -1;
    snprintf(detail, sizeof detail, "averages %.2e, residuals %.2e, Q %.2e", out, res, qe);
    snprintf(what, sizeof what, "powersgd rank %d: = powerSGD_hook's within 1e-5", R);
    check(what, !st && out <= 1e-5 && res <= 1e-5 && qe <= 1e-5, detail);
    snprintf(detail, sizeof detail, "%.6f against %.6f", rate, torch_rate);
    snprintf(what, sizeof what, "powersgd rank %d: compression rate = compression_stats()'s within 1%%", R);
    check(what, fabs(rate - torch_rate) <= 0.01 * torch_rate, detail);
    snprintf(detail, sizeof detail, "worst |sent + residual - (gradient + old residual)| %.2e of %.2e", ef, scale);
    snprintf(what, sizeof what, "powersgd rank %d: sent + new residual = gradient + old residual", R);
    check(what, ef <= scale * 0x1p-23, detail);
    free(g); free(want); free(wres); free(kept);
    dt_codec_destroy(k);
    dt_safetensors_close(f);
}

/* At full rank (the minimum rate lowered so that every matrix compresses) the codec's average is the plain one. */
static void full_rank(dt_comm *w) {
    static const char *const nm[] = { "a", "b", "c" };
    static const int sh[][4] = { { 12, 7 }, { 5, 9 }, { 4, 3, 2 } };
    dt_tensor_info t[3];
    size_t total = table(t, 3, nm, sh);
    int N = dt_comm_size(w), rank = dt_comm_rank(w), idx[3] = { 0, 1, 2 };
    dt_codec_config c = { .kind = DT_CODEC_POWERSGD, .rank = 16, .min_rate = 1e-6f, .seed = 7 };
    dt_codec *k;
    if (dt_codec_create(&c, t, 3, &k)) { check("powersgd full rank: create", false, dt_last_error()); return; }
    float *g = malloc(total * sizeof *g), *mean = calloc(total, sizeof *mean);
    double worst = 0;
    dt_status st = DT_OK;
    for (int step = 0; step < 3 && !st; step++) {
        memset(mean, 0, total * sizeof *mean);
        for (int r = 0; r < N; r++)
            for (size_t j = 0; j < total; j++) {
                uint64_t s = (uint64_t)(step * 1000 + r) * 7919 + j;
                float v = dt_rng_normal(&s);
                mean[j] += v / (float)N;
                if (r == rank) g[j] = v;
            }
        /* the residual from the last step is added in; at full rank it is rounding only, cleared here to compare */
        for (int i = 0; i < 3; i++) {
            size_t n;
            float *res = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &n);
            if (res) memset(res, 0, n * sizeof *res);
        }
        st = exchange(k, w, idx, 3, g);
        dt_codec_end_step(k, NULL);
        double e = rel_err(g, mean, total);
        worst = e > worst ? e : worst;
    }
    char what[96], detail[96];
    snprintf(detail, sizeof detail, "worst relative difference %.2e over 3 steps", worst);
    snprintf(what, sizeof what, "powersgd at full rank on %d ranks = the plain average (1e-5)", N);
    check(what, !st && worst <= 1e-5, st ? dt_last_error() : detail);
    free(g); free(mean);
    dt_codec_destroy(k);
}

/* Every rank's top-k of |gradient + residual| (ties: the earlier place first), summed in rank order over the ranks:
 * the sparse exchange's oracle, every rank's gradients known to each (drawn from the step and rank). */
typedef struct { float a; size_t i; } mag;
static int by_mag(const void *x, const void *y) {
    const mag *p = x, *q = y;
    return p->a != q->a ? (p->a < q->a ? 1 : -1) : (p->i > q->i) - (p->i < q->i);
}

static int by_float_desc(const void *x, const void *y) {
    float a = *(const float *)x, b = *(const float *)y;
    return (a < b) - (a > b);
}

/* pattern 1: large values only where the selection's strided sample reads (every 64th entry), so its guess passes
 * fewer than k candidates and the selection lowers its threshold (in the room the planner counts); pattern 2: zeros
 * but for every 13th entry, fewer than k, so the k-th is a zero and more zeros tie than the room holds */
static float draw(int step, int r, size_t j, int pattern) {
    uint64_t s = (uint64_t)step * 1000003u + j, t = s * 31 + (uint64_t)r + 1;
    float shared = dt_rng_normal(&s), own = dt_rng_normal(&t);
    if (pattern == 1) return j % 64 == 0 ? 10.0f + own : 1e-3f * own;
    if (pattern == 2) return j % 13 == 3 ? own : 0; /* a sparse gradient: fewer nonzeros than k, the rest ties at zero */
    /* equal magnitudes on every rank, more of them than a rank sends: the k-th is a tie, broken by place */
    if (j % 5 == 0) return 2.0f * (r % 2 ? -1.0f : 1.0f);
    return shared + 0.3f * own; /* a common part: the ranks' choices overlap */
}

/* The warm-up's density at step (counted from 0; the test's own copy of DGC's schedule). */
static double density_at(const dt_codec_config *c, int step) {
    static const double stages[] = { 0.25, 0.0625, 0.015625, 0.004 };
    if (c->warmup <= 0 || step >= 4 * c->warmup) return c->density;
    double d = stages[step / c->warmup];
    return d > c->density ? d : c->density;
}

/* What rank r adds to its accumulation rr (and velocity u) from gradient v of one tensor (ne entries): top-k adds v;
 * DGC adds c->weight_decay times the parameters p to v, clips that to c->clip, then u = m u + v, rr += u (Nesterov:
 * u = m (u + v), rr += u + v). */
static void oracle_accumulate(const dt_codec_config *c, const float *v, const float *p, float *u, float *rr, size_t ne) {
    if (c->kind != DT_CODEC_DGC) {
        for (size_t j = 0; j < ne; j++) rr[j] += v[j];
        return;
    }
    double ss = 0;
    for (size_t j = 0; j < ne; j++) {
        float d = c->weight_decay > 0 ? v[j] + c->weight_decay * p[j] : v[j];
        ss += (double)d * d;
    }
    float f = 1;
    if (c->clip > 0 && c->clip / (sqrt(ss) + 1e-6) < 1) f = (float)(c->clip / (sqrt(ss) + 1e-6));
    for (size_t j = 0; j < ne; j++) {
        float x = f * (c->weight_decay > 0 ? v[j] + c->weight_decay * p[j] : v[j]);
        if (c->nesterov) u[j] = c->momentum * (u[j] + x), rr[j] = rr[j] + u[j] + x;
        else u[j] = c->momentum * u[j] + x, rr[j] = rr[j] + u[j];
    }
}

/* The parameters DGC's weight decay reads (the test's model: a fixed draw). */
static float *test_params;
static float *params_of(void *self) { (void)self; return test_params; }

/* Ok-TopK's result from the chosen entries (chosen, cval: rank r's kk at r * kmax) and their sums in rank order (sum,
 * hit): a refresh step (the first, then every c->refresh) keeps every sum and sets the threshold to the kk-th largest
 * magnitude (0 where at most kk were hit); the others keep the sums at or above it. ref becomes the kept sums (to be
 * divided by the ranks); a chosen entry not kept goes back to its rank's residual res (and velocity vel). */
static void ok_oracle(const dt_codec_config *c, int step, size_t kk, int N, size_t n, size_t kmax, const size_t *chosen, const float *cval,
                      const float *cu, const float *sum, const unsigned char *hit, float *thr, float *ref, float *res, float *vel) {
    bool refresh = step == 0 || step % c->refresh == 0;
    if (refresh) {
        float *mg = malloc(n * sizeof *mg);
        size_t nh = 0;
        for (size_t j = 0; j < n; j++)
            if (hit[j]) mg[nh++] = fabsf(sum[j]);
        qsort(mg, nh, sizeof *mg, by_float_desc);
        *thr = nh <= kk ? 0 : mg[kk - 1];
        free(mg);
    }
    for (size_t j = 0; j < n; j++) ref[j] = hit[j] && fabsf(sum[j]) >= *thr ? sum[j] : 0;
    for (int r = 0; r < N; r++)
        for (size_t q = 0; q < kk; q++) {
            size_t at = (size_t)r * kmax + q, e = chosen[at];
            if (fabsf(sum[e]) >= *thr) continue;
            res[(size_t)r * n + e] = cval[at];
            if (c->kind == DT_CODEC_DGC) vel[(size_t)r * n + e] = cu[at];
        }
}

/* c: top-k or DGC, on a bucket of three tensors, 4 steps (6 with a warm-up) against the oracle. */
static void sparse_against_sequential(dt_comm *w, const dt_codec_config *cfg, int big, int pattern) {
    /* the exchange named: auto's pick depends on the link's costs */
    dt_codec_config named = *cfg;
    const dt_codec_config *c = &named;
    if (named.exchange == DT_SPARSE_AUTO) named.exchange = DT_SPARSE_ALLGATHER;
    static const char *const nm[] = { "a", "b", "c" };
    static const int small[][4] = { { 12, 7 }, { 40 }, { 4, 3, 5 } }, large[][4] = { { 300, 70 }, { 4000 }, { 40, 30, 5 } };
    const int (*sh)[4] = big ? large : small;
    dt_tensor_info t[3];
    size_t n = table(t, 3, nm, sh);
    int N = dt_comm_size(w), me_ = dt_comm_rank(w), idx[3] = { 0, 1, 2 }, steps = c->warmup ? 4 * c->warmup + 2 : 4;
    bool dgc = c->kind == DT_CODEC_DGC;
    dt_codec *k;
    if (dt_codec_create(c, t, 3, &k)) { check("topk: create", false, dt_last_error()); return; }
    test_params = malloc(n * sizeof *test_params);
    uint64_t ps = 11;
    for (size_t j = 0; j < n; j++) test_params[j] = 3 * dt_rng_normal(&ps);
    dt_model model = { .params = params_of, .tensors = t, .ntensors = 3, .nparams = n };
    dt_codec_set_model(k, &model);
    float *g = malloc(n * sizeof *g), *ref = malloc(n * sizeof *ref), *res = calloc((size_t)N * n, sizeof *res), *kept = malloc(n * sizeof *kept);
    float *vel = calloc((size_t)N * n, sizeof *vel), *v = malloc(n * sizeof *v);
    mag *m = malloc(n * sizeof *m);
    bool same = true, identity = true, ok = c->exchange == DT_SPARSE_OKTOPK;
    dt_status st = DT_OK;
    size_t kk = 0, ks = 0, kmax = (size_t)ceil(density_at(c, 0) * (double)n);
    /* Ok-TopK's oracle: each rank's chosen entries and what they held, the sums of the chosen values in rank order and
     * which entries were chosen anywhere, the global threshold */
    size_t *chosen = malloc((size_t)N * kmax * sizeof *chosen);
    float *cval = malloc((size_t)N * kmax * sizeof *cval), *cu = malloc((size_t)N * kmax * sizeof *cu), *sum = malloc(n * sizeof *sum), thr = 0;
    unsigned char *hit = malloc(n);
    dt_codec_stats stats = { 0 };
    double recv_ok = 0, recv_gather = 0;
    for (int step = 0; step < steps && !st; step++) {
        kk = (size_t)ceil(density_at(c, step) * (double)n), ks += kk;
        memset(ref, 0, n * sizeof *ref);
        memset(hit, 0, n);
        for (int r = 0; r < N; r++) {
            float *rr = res + (size_t)r * n, *u = vel + (size_t)r * n;
            for (size_t j = 0; j < n; j++) v[j] = draw(step, r, j, pattern);
            for (int i = 0; i < 3; i++) oracle_accumulate(c, v + t[i].offset, test_params + t[i].offset, u + t[i].offset, rr + t[i].offset, t[i].count);
            if (r == me_) memcpy(g, v, n * sizeof *g), memcpy(kept, rr, n * sizeof *kept);
            for (size_t j = 0; j < n; j++) m[j] = (mag){ fabsf(rr[j]), j };
            qsort(m, n, sizeof *m, by_mag);
            for (size_t q = 0; q < kk; q++) {
                size_t e = m[q].i, at = (size_t)r * kmax + q;
                chosen[at] = e, cval[at] = rr[e], cu[at] = u[e];
                ref[e] += rr[e], rr[e] = 0, u[e] = 0;
                sum[e] = hit[e] ? sum[e] + cval[at] : cval[at], hit[e] = 1;
            }
        }
        if (ok) ok_oracle(c, step, kk, N, n, kmax, chosen, cval, cu, sum, hit, &thr, ref, res, vel);
        for (size_t j = 0; j < n; j++) ref[j] /= (float)N;
        st = exchange(k, w, idx, 3, g);
        dt_codec_end_step(k, &stats);
        recv_ok += stats.received, recv_gather += (double)kk * 8 * (N - 1);
        same = same && !st && !memcmp(g, ref, n * sizeof *g);
        for (int i = 0; i < 3 && !st; i++) {
            size_t ne, nu;
            const float *r = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &ne), *mine = res + (size_t)me_ * n + t[i].offset;
            const float *u = dt_codec_state(k, i, DT_CODEC_VELOCITY, &nu);
            same = same && !memcmp(r, mine, ne * sizeof *r);
            if (dgc) same = same && nu == ne && !memcmp(u, vel + (size_t)me_ * n + t[i].offset, nu * sizeof *u);
            else same = same && !u;
            /* sent + residual = what accumulated, exactly: each entry is one or the other */
            for (size_t j = 0; j < ne; j++) identity = identity && (r[j] == 0 || r[j] == kept[t[i].offset + j]);
        }
    }
    free(chosen); free(cval); free(cu); free(sum); free(hit);
    char what[520], detail[120], name[240];
    if (dgc) snprintf(name, sizeof name, "dgc density %g, momentum %g%s%s%s%s", c->density, c->momentum, c->nesterov ? " Nesterov" : "",
                      c->clip > 0 ? ", clipped" : "", c->warmup ? ", warm-up" : "", c->weight_decay > 0 ? ", weight decay" : "");
    else snprintf(name, sizeof name, "topk density %g", c->density);
    if (c->exchange == DT_SPARSE_OKTOPK) {
        size_t at = strlen(name);
        snprintf(name + at, sizeof name - at, " (oktopk, refresh %d: this rank received %.0f bytes over %d steps, the allgather's %.0f)", c->refresh,
                 recv_ok, steps, recv_gather);
    }
    snprintf(detail, sizeof detail, "%zu of %zu entries a rank at the end (%zu in %d steps), %s", kk, n, ks, steps,
             pattern == 1 ? "the sample misleading: the threshold found by counts" : pattern ? "ties at zero in the top k" : "ties and overlapping choices");
    snprintf(what, sizeof what, "%s, %s bucket on %d ranks: averages, residuals%s = the oracle's bit for bit", name, big ? "a large" : "a small", N,
             dgc ? ", velocities" : "");
    check(what, same, st ? dt_last_error() : detail);
    snprintf(what, sizeof what, "%s, %s bucket on %d ranks: sent + new residual = accumulated (old residual + update)", name, big ? "a large" : "a small", N);
    check(what, identity, NULL);
    /* the candidates stayed in the room the planner counts (4 kmax + 64), whatever the sample guessed */
    size_t made = dt_codec_work_bytes(k), planned = dt_codec_work_bytes_for(c, t, 3, &(dt_codec_place){ N, 1, NULL, 0 });
    snprintf(what, sizeof what, "%s, %s bucket on %d ranks%s: its buffers the planner's (%zu bytes, planned %zu)", name, big ? "a large" : "a small",
             N, pattern == 1 ? ", the sample misleading" : pattern ? ", zeros among the top k" : "", made, planned);
    check(what, made == planned, NULL);
    free(g); free(ref); free(res); free(kept); free(m); free(vel); free(v); free(test_params);
    dt_codec_destroy(k);
}

static void topk_against_sequential(dt_comm *w, float density, int big, int pattern) {
    dt_codec_config c = { .kind = DT_CODEC_TOPK, .density = density };
    sparse_against_sequential(w, &c, big, pattern);
}

/* The hierarchical exchange on q machines of l ranks (under mpirun's pseudo-nodes: consecutive ranks a machine, as
 * DTRAIN_FAKE_NODES cuts them), against the oracle: each machine's sum of its ranks' gradients (in rank order); local
 * rank j's slice j of it (the bucket cut in l slices of ceil(n / l)) plus j's residual; its top k (k = the density's
 * share of the slice; ties: the earlier entry) sent, the rest the residual; each slice's average the machines' sent
 * values summed in machine order, over all the ranks. Every rank's result and residual bit for bit, 4 steps. */
static void hier_against_sequential(dt_comm *w, float density) {
    static const char *const nm[] = { "a", "b", "c" };
    static const int sh[][4] = { { 300, 70 }, { 4001 }, { 40, 30, 5 } };
    dt_tensor_info t[3];
    size_t n = table(t, 3, nm, sh);
    int N = dt_comm_size(w), me_ = dt_comm_rank(w), l = dt_comm_local_size(w), q = dt_comm_nodes(w), idx[3] = { 0, 1, 2 };
    dt_codec_config c = { .kind = DT_CODEC_TOPK, .density = density, .exchange = DT_SPARSE_HIER };
    dt_codec *k;
    if (dt_codec_create(&c, t, 3, &k)) { check("hier: create", false, dt_last_error()); return; }
    size_t blk = (n + (size_t)l - 1) / (size_t)l;
    float *g = malloc(n * sizeof *g), *ref = malloc(n * sizeof *ref), *res = calloc((size_t)N * n, sizeof *res), *sum = malloc(n * sizeof *sum);
    float *sent = calloc((size_t)q * n, sizeof *sent);
    mag *m = malloc(n * sizeof *m);
    bool same = true, identity = true;
    dt_status st = DT_OK;
    dt_codec_stats stats = { 0 };
    for (int step = 0; step < 4 && !st; step++) {
        memset(sent, 0, (size_t)q * n * sizeof *sent);
        for (int node = 0; node < q; node++) {
            for (size_t e = 0; e < n; e++) sum[e] = 0;
            for (int j = 0; j < l; j++)
                for (size_t e = 0; e < n; e++) sum[e] += draw(step, node * l + j, e, 0);
            for (int j = 0; j < l; j++) { /* local rank j: its slice of the machine's sum and its residual */
                size_t lo = (size_t)j * blk < n ? (size_t)j * blk : n, hi = lo + blk < n ? lo + blk : n, kk = (size_t)ceil(density * (double)(hi - lo)), nm_ = 0;
                float *rr = res + (size_t)(node * l + j) * n;
                for (size_t e = lo; e < hi; e++) rr[e] = sum[e] + rr[e], m[nm_++] = (mag){ fabsf(rr[e]), e };
                qsort(m, nm_, sizeof *m, by_mag);
                for (size_t r = 0; r < kk && r < nm_; r++) sent[(size_t)node * n + m[r].i] = rr[m[r].i], rr[m[r].i] = 0;
            }
        }
        for (size_t e = 0; e < n; e++) {
            ref[e] = 0;
            for (int node = 0; node < q; node++) ref[e] += sent[(size_t)node * n + e];
            ref[e] /= (float)N;
        }
        for (size_t e = 0; e < n; e++) g[e] = draw(step, me_, e, 0);
        st = exchange(k, w, idx, 3, g);
        dt_codec_end_step(k, &stats);
        same = same && !st && !memcmp(g, ref, n * sizeof *g);
        for (int i = 0; i < 3 && !st; i++) {
            size_t ne;
            const float *r = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &ne);
            same = same && !memcmp(r, res + (size_t)me_ * n + t[i].offset, ne * sizeof *r);
            for (size_t j = 0; j < ne; j++) identity = identity && (r[j] == 0 || sent[(size_t)(me_ / l) * n + t[i].offset + j] == 0);
        }
    }
    char what[300];
    snprintf(what, sizeof what, "topk density %g (hier: %d machines of %d ranks; this rank sent %.0f bytes between machines a step, the "
             "allgather %.0f): averages, residuals = the oracle's bit for bit", density, q, l, stats.bytes, 8 * ceil(density * (double)n));
    check(what, same, st ? dt_last_error() : NULL);
    check("hier: an entry is sent or kept in the residual, never both", identity, NULL);
    free(g); free(ref); free(res); free(sum); free(sent); free(m);
    dt_codec_destroy(k);
}

/* The sign allreduce's sequential oracle (codec_signs.c): every rank's x (N rows of n, each with its e_w added) sent as
 * signs times its (chunk, tensor) piece's RMS (piece: entry -> chunk x 3 + tensor), e_w what that loses; each chunk's
 * owner averages the ranks' pieces in rank order, adds its e_s and sends the result the same way, into out. Returns the
 * worst |sent + e_w - x| (one subtraction's rounding). */
static double signs_oracle(int N, size_t n, const int *piece, const float *x, float *ew, float *es, float *out) {
    float *sent = malloc((size_t)N * n * sizeof *sent), *y = malloc(n * sizeof *y);
    double *ss = calloc(3 * (size_t)N, sizeof *ss), lost = 0;
    size_t *cnt = calloc(3 * (size_t)N, sizeof *cnt);
    for (size_t j = 0; j < n; j++) cnt[piece[j]]++;
    for (int r = 0; r < N; r++) {
        const float *xr = x + (size_t)r * n;
        float *er = ew + (size_t)r * n, *cr = sent + (size_t)r * n;
        memset(ss, 0, 3 * (size_t)N * sizeof *ss);
        for (size_t j = 0; j < n; j++) ss[piece[j]] += (double)xr[j] * xr[j];
        for (size_t j = 0; j < n; j++) {
            float scale = (float)(sqrt(ss[piece[j]]) / sqrt((double)cnt[piece[j]]));
            cr[j] = xr[j] >= 0 ? scale : -scale;
            er[j] = xr[j] - cr[j];
            double d = fabs((double)cr[j] + er[j] - xr[j]);
            lost = d > lost ? d : lost;
        }
    }
    memset(ss, 0, 3 * (size_t)N * sizeof *ss);
    for (size_t j = 0; j < n; j++) {
        float sum = sent[j];
        for (int r = 1; r < N; r++) sum += sent[(size_t)r * n + j];
        y[j] = sum / (float)N + es[j];
        ss[piece[j]] += (double)y[j] * y[j];
    }
    for (size_t j = 0; j < n; j++) {
        float scale = (float)(sqrt(ss[piece[j]]) / sqrt((double)cnt[piece[j]]));
        out[j] = y[j] >= 0 ? scale : -scale;
        es[j] = y[j] - out[j];
    }
    free(sent); free(y); free(ss); free(cnt);
    return lost;
}

/* Whether codec k's worker and server errors are the oracle's: this rank's e_w row, e_s on the chunk it reduces. */
static bool errors_match(dt_codec *k, const dt_tensor_info *t, int nt, const float *ew, const float *es, size_t chunk) {
    bool same = true;
    for (int i = 0; i < nt; i++) {
        size_t ne;
        const float *er = dt_codec_state(k, i, DT_CODEC_RESIDUAL, &ne), *sv = dt_codec_state(k, i, DT_CODEC_SERVER, &ne);
        same = same && er && sv && !memcmp(er, ew + t[i].offset, ne * sizeof *er);
        for (size_t j = 0; j < ne && same; j++)
            if ((t[i].offset + j) / chunk == (size_t)me) same = sv[j] == es[t[i].offset + j];
    }
    return same;
}

/* Each entry's (chunk, tensor) piece on N ranks. */
static int *pieces(const dt_tensor_info *t, size_t n, int N) {
    size_t chunk = (n + (size_t)N - 1) / (size_t)N;
    int *piece = malloc(n * sizeof *piece);
    for (int i = 0; i < 3; i++)
        for (size_t j = 0; j < t[i].count; j++) piece[t[i].offset + j] = (int)((t[i].offset + j) / chunk) * 3 + i;
    return piece;
}

/* 1-bit Adam's sequential oracle: every rank's x = b1 m + (1 - b1) g + e_w through the sign allreduce's oracle. The
 * warm-up's average comes from an allreduce (its own order of sums): the oracle takes the codec's m there (held to the
 * sequential average's within 1e-6), and from the freeze on every value must be its own bit for bit. */
static void onebit_against_sequential(dt_comm *w, int big) {
    static const char *const nm[] = { "a", "b", "c" };
    /* tiny: 4 entries, so that on 3 ranks the last chunk is empty */
    static const int small[][4] = { { 12, 7 }, { 40 }, { 4, 3, 5 } }, large[][4] = { { 300, 70 }, { 4000 }, { 40, 30, 5 } },
                     tiny[][4] = { { 2 }, { 1 }, { 1 } };
    dt_tensor_info t[3];
    size_t n = table(t, 3, nm, big == 2 ? tiny : big ? large : small);
    int N = dt_comm_size(w), idx[3] = { 0, 1, 2 }, start = 2, steps = 6;
    dt_codec_config c = { .kind = DT_CODEC_ONEBIT, .start = start, .beta1 = 0.9f };
    dt_codec *k;
    if (dt_codec_create(&c, t, 3, &k)) { check("onebit: create", false, dt_last_error()); return; }
    size_t chunk = (n + (size_t)N - 1) / (size_t)N;
    float *g = malloc(n * sizeof *g), *m = calloc(n, sizeof *m), *ew = calloc((size_t)N * n, sizeof *ew), *es = calloc(n, sizeof *es);
    float *x = malloc((size_t)N * n * sizeof *x);
    double warm = 0, lost = 0;
    int *piece = pieces(t, n, N);
    bool same = true;
    dt_status st = DT_OK;
    for (int step = 0; step < steps && !st; step++) {
        for (size_t j = 0; j < n; j++) g[j] = draw(step, me, j, 0);
        st = exchange(k, w, idx, 3, g);
        dt_codec_end_step(k, NULL);
        size_t nv;
        if (step < start) {
            /* the warm-up: the average, and m of it; the oracle goes on from the codec's m */
            for (size_t j = 0; j < n && !st; j++) {
                float avg = 0;
                for (int r = 0; r < N; r++) avg += draw(step, r, j, 0);
                avg /= (float)N;
                m[j] = 0.9f * m[j] + (1.0f - 0.9f) * avg;
                double d = fabs((double)m[j] - dt_codec_state(k, piece[j] % 3, DT_CODEC_VELOCITY, &nv)[j - t[piece[j] % 3].offset]);
                warm = d > warm ? d : warm;
            }
            for (int i = 0; i < 3 && !st; i++) memcpy(m + t[i].offset, dt_codec_state(k, i, DT_CODEC_VELOCITY, &nv), t[i].count * sizeof *m);
            continue;
        }
        for (int r = 0; r < N; r++)
            for (size_t j = 0; j < n; j++) x[(size_t)r * n + j] = (0.9f * m[j] + (1.0f - 0.9f) * draw(step, r, j, 0)) + ew[(size_t)r * n + j];
        double l = signs_oracle(N, n, piece, x, ew, es, m);
        lost = l > lost ? l : lost;
        same = same && !st && !memcmp(g, m, n * sizeof *g) && errors_match(k, t, 3, ew + (size_t)me * n, es, chunk);
        for (int i = 0; i < 3 && !st; i++) {
            size_t ne;
            const float *mv = dt_codec_state(k, i, DT_CODEC_VELOCITY, &ne);
            same = same && !memcmp(mv, m + t[i].offset, ne * sizeof *mv);
        }
    }
    char what[200], detail[160];
    snprintf(detail, sizeof detail, "%zu entries, %d chunks, %d steps (2 warm-up: m within %.1e of the sequential average's)", n, N, steps, warm);
    const char *size = big == 2 ? "a tiny" : big ? "a large" : "a small";
    snprintf(what, sizeof what, "onebit, %s bucket on %d ranks: averaged momentum, m, e_w, e_s = the oracle's bit for bit", size, N);
    check(what, same && warm <= 1e-6, st ? dt_last_error() : detail);
    snprintf(detail, sizeof detail, "worst |sent + e_w - x| %.2e (one subtraction's rounding)", lost);
    snprintf(what, sizeof what, "onebit, %s bucket on %d ranks: sent + new worker error = momentum + old error", size, N);
    check(what, lost <= 1e-6, detail);
    free(g); free(m); free(ew); free(es); free(x); free(piece);
    dt_codec_destroy(k);
}

/* 0/1 Adam's plan against DeepSpeed's counters stepped one step at a time (zoadam.py's var_interval, var_counter,
 * local_step_interval, local_step_counter), the variance's last step at start; and its mix over every run length
 * (dt_codec_zeroone_mix, the planner's) = those steps counted. */
static void zeroone_plan(int start, int kappa, int scaler, int clip, int steps) {
    dt_codec_config c = { .kind = DT_CODEC_ZEROONE, .start = start, .var_scaler = kappa, .local_scaler = scaler, .local_clip = clip };
    long var_interval = 1, local_interval = 1, nvar = 0, whole = 0, signs = 0;
    int var_counter = 0, local_counter = 0, bad = 0, bad_mix = 0;
    for (long t = 1; t <= steps; t++) {
        dt_zeroone_step z;
        dt_codec_zeroone_at(&c, t, &z);
        int local = t > start, variance = !local && t % var_interval == 0, sync = local && t % local_interval == 0;
        nvar += variance;
        if (variance && ++var_counter == kappa) var_counter = 0, var_interval *= 2;
        if (local && ++local_counter == scaler) local_counter = 0, local_interval = local_interval * 2 < clip ? local_interval * 2 : clip;
        bad += z.local != local || z.variance != variance || z.sync != sync || z.nvar != nvar;
        whole += variance, signs += (!local && !variance) || sync;
        long mw, ms;
        dt_codec_zeroone_mix(&c, t, &mw, &ms);
        bad_mix += mw != whole || ms != signs;
    }
    char what[160], detail[160];
    snprintf(what, sizeof what, "zeroone's plan (start %d, kappa %d, local scaler %d, clip %d) = DeepSpeed's counters over %d steps", start, kappa,
             scaler, clip, steps);
    snprintf(detail, sizeof detail, "%ld variance steps, %d steps differ", nvar, bad);
    check(what, !bad, detail);
    snprintf(what, sizeof what, "zeroone's mix (start %d, kappa %d, local scaler %d, clip %d) = its steps counted, every run of 1 to %d",
             start, kappa, scaler, clip, steps);
    snprintf(detail, sizeof detail, "%ld whole, %ld signed over %d steps; %d run lengths differ", whole, signs, steps, bad_mix);
    check(what, !bad_mix, detail);
}

/* 0/1 Adam's exchanges against the oracle, on 3 tensors: the variance's steps (1, 2, 4 at kappa 1) averaged whole
 * (within 1e-6: an allreduce's order of sums), the others' gradients through the sign allreduce's oracle bit for bit;
 * past start (6) the gradient untouched, and each interval's end (local scaler 2, clip 2: steps 7, 8, 10, 12) averages
 * an accumulation u through the oracle from errors zeroed at the first local step. */
static void zeroone_against_sequential(dt_comm *w) {
    static const char *const nm[] = { "a", "b", "c" };
    static const int shape[][4] = { { 30, 7 }, { 40 }, { 4, 3, 5 } };
    dt_tensor_info t[3];
    size_t n = table(t, 3, nm, shape);
    int N = dt_comm_size(w), idx[3] = { 0, 1, 2 }, steps = 12;
    dt_codec_config c = { .kind = DT_CODEC_ZEROONE, .start = 6, .var_scaler = 1, .local_scaler = 2, .local_clip = 2 };
    dt_codec *k;
    if (dt_codec_create(&c, t, 3, &k)) { check("zeroone: create", false, dt_last_error()); return; }
    size_t chunk = (n + (size_t)N - 1) / (size_t)N;
    float *g = malloc(n * sizeof *g), *want = malloc(n * sizeof *want), *ew = calloc((size_t)N * n, sizeof *ew), *es = calloc(n, sizeof *es);
    float *x = malloc((size_t)N * n * sizeof *x);
    int *piece = pieces(t, n, N), whole = 0, signed_ = 0, local = 0, syncs = 0;
    double avg_err = 0;
    bool same = true;
    dt_status st = DT_OK;
    for (int step = 1; step <= steps && !st; step++) {
        dt_zeroone_step z;
        dt_codec_zeroone_at(&c, step, &z);
        for (size_t j = 0; j < n; j++) g[j] = draw(step, me, j, 0);
        st = exchange(k, w, idx, 3, g);
        if (!st && z.variance) {
            whole++;
            for (size_t j = 0; j < n; j++) {
                float avg = 0;
                for (int r = 0; r < N; r++) avg += draw(step, r, j, 0);
                avg /= (float)N;
                double d = fabs((double)avg - g[j]) / (fabs(avg) + 1e-6);
                avg_err = d > avg_err ? d : avg_err;
            }
        } else if (!st && !z.local) {
            signed_++;
            for (int r = 0; r < N; r++)
                for (size_t j = 0; j < n; j++) x[(size_t)r * n + j] = draw(step, r, j, 0) + ew[(size_t)r * n + j];
            signs_oracle(N, n, piece, x, ew, es, want);
            same = same && !memcmp(g, want, n * sizeof *g) && errors_match(k, t, 3, ew + (size_t)me * n, es, chunk);
        } else if (!st) {
            local++;
            for (size_t j = 0; j < n; j++) same = same && g[j] == draw(step, me, j, 0);
            if (step == c.start + 1) memset(ew, 0, (size_t)N * n * sizeof *ew), memset(es, 0, n * sizeof *es);
        }
        dt_codec_end_step(k, NULL);
        if (st || !z.sync) continue;
        syncs++;
        for (size_t j = 0; j < n; j++) g[j] = draw(step, me, j, 1);
        dt_codec_stats cs = { 0 };
        st = dt_codec_zeroone_sync(k, g, &cs);
        for (int r = 0; r < N; r++)
            for (size_t j = 0; j < n; j++) x[(size_t)r * n + j] = draw(step, r, j, 1) + ew[(size_t)r * n + j];
        signs_oracle(N, n, piece, x, ew, es, want);
        same = same && !st && cs.before == n && cs.after > 0 && !memcmp(g, want, n * sizeof *g) && errors_match(k, t, 3, ew + (size_t)me * n, es, chunk);
    }
    char what[200], detail[200];
    snprintf(detail, sizeof detail, "%zu entries on %d ranks: %d whole steps (average within %.1e), %d signed, %d local, %d syncs", n, N, whole,
             avg_err, signed_, local, syncs);
    snprintf(what, sizeof what, "zeroone on %d ranks: the signed steps' and syncs' averages, e_w, e_s = the oracle's bit for bit", N);
    check(what, !st && same && whole == 3 && signed_ == 3 && local == 6 && syncs == 4 && avg_err <= 1e-6, st ? dt_last_error() : detail);
    free(g); free(want); free(ew); free(es); free(x); free(piece);
    dt_codec_destroy(k);
}

/* 0/1 Adam's optimizer side against plain formulas: AdamW's step where every step is a variance step (bit for bit);
 * the momentum-only step (v kept, its bias correction from the variance's updates); local steps closed by an interval
 * end whose average is one rank's own accumulation: the weights the local steps reached (wd 0: within 1e-6, the
 * rounding of two ways there) and the momentum the lr/bc1-weighted mean of the steps' momenta. */
static void zeroone_optimizer(void) {
    enum { N = 64, STEPS = 3, LOCAL = 4 };
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    dt_optim *a = NULL, *b = NULL;
    if (dt_optim_create(&oc, N, NULL, 0, &a) || dt_optim_create(&oc, N, NULL, 0, &b)) { check("zeroone: optimizers", false, dt_last_error()); return; }
    float pa[N], pb[N], g[N], m[N] = { 0 }, v[N] = { 0 }, p0[N], mw[N] = { 0 };
    for (int i = 0; i < N; i++) pa[i] = pb[i] = draw(0, 0, (size_t)i, 0);
    float lr = 1e-2f, b1 = oc.beta1, b2 = oc.beta2;
    bool same = true;
    for (int t = 1; t <= STEPS; t++) {
        for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0);
        float ga[N];
        memcpy(ga, g, sizeof g);
        dt_optim_step(a, pa, ga, lr, 1);
        dt_optim_zeroone(b, DT_ZO_VARIANCE, lr);
        dt_optim_step(b, pb, g, lr, 1);
        for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0), m[i] = b1 * m[i] + (1 - b1) * g[i], v[i] = b2 * v[i] + (1 - b2) * g[i] * g[i];
    }
    same = !memcmp(pa, pb, sizeof pa);
    check("zeroone: every step a variance step = AdamW bit for bit", same, "3 steps");
    /* a momentum-only step, then local steps on b, checked against the formulas */
    double worst = 0, lrs = 0;
    float sbc2 = sqrtf(1 - powf(b2, STEPS));
    for (int t = STEPS + 1; t <= STEPS + 1 + LOCAL; t++) {
        int mode = t == STEPS + 1 ? DT_ZO_MOMENTUM : DT_ZO_LOCAL;
        if (mode == DT_ZO_LOCAL && t == STEPS + 2) memcpy(p0, pb, sizeof pb);
        for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0);
        float want[N], step = lr / (1 - powf(b1, (float)t));
        for (int i = 0; i < N; i++) {
            m[i] = b1 * m[i] + (1 - b1) * g[i];
            want[i] = pb[i] - step * m[i] / (sqrtf(v[i]) / sbc2 + oc.eps);
            if (mode == DT_ZO_LOCAL) mw[i] += step * m[i];
        }
        if (mode == DT_ZO_LOCAL) lrs += step;
        dt_optim_zeroone(b, mode, lr);
        dt_optim_step(b, pb, g, lr, 1);
        for (int i = 0; i < N; i++) {
            double d = fabs((double)pb[i] - want[i]) / (fabs(want[i]) + 1e-6);
            worst = d > worst ? d : worst;
        }
    }
    float *u = dt_optim_zeroone_accum(b);
    char detail[160];
    snprintf(detail, sizeof detail, "worst relative weight difference %.1e over 1 momentum-only and %d local steps", worst, LOCAL);
    check("zeroone: the momentum-only and local steps = the formulas (v kept, bc2 from the variance's updates)", u && worst <= 1e-6, detail);
    if (!u) { dt_optim_destroy(a); dt_optim_destroy(b); return; }
    float reached[N];
    memcpy(reached, pb, sizeof pb);
    dt_optim_zeroone_end(b, pb); /* one rank's own accumulation: the average of one */
    double wp = 0, wm = 0;
    const float *mb = dt_optim_buffer(b, 0);
    for (int i = 0; i < N; i++) {
        double dp = fabs((double)pb[i] - reached[i]) / (fabs(reached[i]) + 1e-6), dm = fabs(mb[i] - mw[i] / lrs) / (fabs(mw[i] / lrs) + 1e-6);
        wp = dp > wp ? dp : wp;
        wm = dm > wm ? dm : wm;
    }
    snprintf(detail, sizeof detail, "weights %.1e from the local steps' (from the interval's start %s), momentum %.1e from the weighted mean",
             wp, memcmp(p0, reached, sizeof p0) ? "moved" : "unmoved?", wm);
    check("zeroone: an interval's end with one rank's accumulation = where its local steps went", wp <= 1e-6 && wm <= 1e-6 &&
          memcmp(p0, reached, sizeof p0) && !dt_optim_zeroone_accum(b), detail);
    dt_optim_destroy(a);
    dt_optim_destroy(b);
}

/* A local step the engine skips (a non-finite loss: told of by the plan, never stepped) leaves the interval as if it
 * had not been planned: an interval whose first and third planned steps are skipped ends at the weights and momentum
 * of one without them, bit for bit (it once counted the skipped steps' lr/bc1 and lost the interval's first weights). */
static void zeroone_skipped_step(void) {
    enum { N = 64 };
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.1f;
    dt_optim *o[2] = { NULL, NULL };
    if (dt_optim_create(&oc, N, NULL, 0, &o[0]) || dt_optim_create(&oc, N, NULL, 0, &o[1])) { check("zeroone skipped: optimizers", false, dt_last_error()); return; }
    float p[2][N], g[N], lr = 1e-2f;
    for (int i = 0; i < N; i++) p[0][i] = p[1][i] = draw(0, 0, (size_t)i, 0);
    for (int k = 0; k < 2; k++) {
        for (int t = 1; t <= 2; t++) { /* AdamW's steps first, alike */
            for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0);
            dt_optim_zeroone(o[k], DT_ZO_VARIANCE, lr);
            dt_optim_step(o[k], p[k], g, lr, 1);
        }
        for (int t = 3, planned = 0; t <= 5; planned++) {
            if (k == 0 && (planned == 0 || planned == 2)) { /* skipped: told of at its own rate, never stepped */
                dt_optim_zeroone(o[k], DT_ZO_LOCAL, 7 * lr);
                continue;
            }
            float rate = lr * (float)(t - 1); /* a schedule's */
            dt_optim_zeroone(o[k], DT_ZO_LOCAL, rate);
            for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0);
            dt_optim_step(o[k], p[k], g, rate, 1);
            t++;
        }
        dt_optim_zeroone_end(o[k], p[k]);
    }
    bool same = !memcmp(p[0], p[1], sizeof p[0]) && !memcmp(dt_optim_buffer(o[0], 0), dt_optim_buffer(o[1], 0), N * sizeof(float));
    check("zeroone: local steps skipped inside an interval (its first and third) = the interval without them, bit for bit", same,
          same ? "weights and momentum equal" : "weights or momentum differ");
    dt_optim_destroy(o[0]);
    dt_optim_destroy(o[1]);
}

/* A variance step the engine skips (told of by the plan, never stepped) does not count in the variance's bias
 * correction: 0/1 Adam whose second of three planned variance steps is skipped, then a momentum-only step, and 1-bit
 * Adam whose warm-up loses its second step, then a frozen step, each = the same optimizer without the skipped step,
 * bit for bit (the count once came from the plan, the skipped step in it); and the count survives a checkpoint's
 * set_steps/set_variance_steps (set_steps alone counts every step a variance step). */
static void skipped_variance_step(void) {
    enum { N = 64 };
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    float lr = 1e-2f;
    bool same[2];
    long counts[2][2];
    for (int onebit = 0; onebit < 2; onebit++) {
        dt_optim *o[2] = { NULL, NULL };
        if (dt_optim_create(&oc, N, NULL, 0, &o[0]) || dt_optim_create(&oc, N, NULL, 0, &o[1])) {
            check("skipped variance step: optimizers", false, dt_last_error());
            dt_optim_destroy(o[0]);
            return;
        }
        float p[2][N], g[N];
        for (int i = 0; i < N; i++) p[0][i] = p[1][i] = draw(0, 0, (size_t)i, 0);
        for (int k = 0; k < 2; k++) {
            for (int planned = 1, t = 1; planned <= 4; planned++) {
                int last = planned == 4; /* 0/1 Adam's momentum-only step, 1-bit Adam's frozen one */
                if (k == 1 && planned == 2) continue; /* the optimizer without it */
                if (!onebit) dt_optim_zeroone(o[k], last ? DT_ZO_MOMENTUM : DT_ZO_VARIANCE, lr);
                else dt_optim_freeze_variance(o[k], last);
                if (planned == 2) continue; /* skipped: planned, never stepped */
                for (int i = 0; i < N; i++) g[i] = draw(t, 0, (size_t)i, 0);
                dt_optim_step(o[k], p[k], g, lr, 1);
                t++;
            }
            counts[onebit][k] = dt_optim_variance_steps(o[k]);
        }
        same[onebit] = !memcmp(p[0], p[1], sizeof p[0]) && !memcmp(dt_optim_buffer(o[0], 0), dt_optim_buffer(o[1], 0), N * sizeof(float));
        if (onebit) { /* a resume sets both counts; set_steps alone takes every step for a variance step */
            dt_optim_set_steps(o[0], 9);
            counts[1][0] = dt_optim_variance_steps(o[0]) == 9 ? counts[1][0] : -1;
            dt_optim_set_variance_steps(o[0], 2);
            counts[1][0] = dt_optim_variance_steps(o[0]) == 2 && dt_optim_steps(o[0]) == 9 ? counts[1][0] : -1;
        }
        dt_optim_destroy(o[0]);
        dt_optim_destroy(o[1]);
    }
    char detail[200];
    snprintf(detail, sizeof detail, "0/1 Adam %s (variance steps %ld and %ld), 1-bit Adam %s (%ld and %ld)", same[0] ? "same" : "differs",
             counts[0][0], counts[0][1], same[1] ? "same" : "differs", counts[1][0], counts[1][1]);
    check("a skipped variance step (0/1 Adam's, 1-bit Adam's warm-up) = none planned, bit for bit; the count set and read back",
          same[0] && same[1] && counts[0][0] == 2 && counts[0][1] == 2 && counts[1][0] == 2 && counts[1][1] == 2, detail);
}

static void bad_config(void) {
    dt_tensor_info t[1];
    table(t, 1, names, shapes);
    dt_codec *k = NULL;
    dt_codec_config c = { .kind = DT_CODEC_POWERSGD, .rank = 0, .min_rate = 2.0f, .seed = 1 };
    check("powersgd: rank 0 refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "rank"), dt_last_error());
    c.rank = 1, c.start = -1;
    check("powersgd: a negative start refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "start"), dt_last_error());
    c = (dt_codec_config){ .kind = DT_CODEC_TOPK, .density = 0 };
    check("topk: density 0 refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "density"), dt_last_error());
    c.density = 1.5f;
    check("topk: density above 1 refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "density"), dt_last_error());
    dt_codec_kind kind;
    check("codec: an unknown name refused, naming the codecs", dt_codec_parse("topk9", &kind) && strstr(dt_last_error(), "onebit and zeroone"), dt_last_error());
    c = (dt_codec_config){ .kind = DT_CODEC_ONEBIT, .beta1 = 0.9f };
    check("onebit: no warm-up (start 0) refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "warm-up"), dt_last_error());
    c = (dt_codec_config){ .kind = DT_CODEC_ZEROONE, .var_scaler = 16, .local_scaler = 8, .local_clip = 4 };
    check("zeroone: no variance steps (start 0) refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "var_freeze_step"), dt_last_error());
    c.start = 5, c.local_clip = 0;
    check("zeroone: an interval of 0 refused", dt_codec_create(&c, t, 1, &k) && strstr(dt_last_error(), "--compress-local-clip 0"), dt_last_error());
    c.local_clip = 4;
    check("zeroone: under ZeRO refused", dt_codec_check_strategy(&c, "zero1") && strstr(dt_last_error(), "ZeRO shards"), dt_last_error());
    check("zeroone: with SGD refused", dt_codec_check_optimizer(&c, DT_OPT_SGD, 0, 0) && strstr(dt_last_error(), "0/1 Adam"), dt_last_error());
}

int main(int argc, char **argv) {
    dt_comm *w;
    if (dt_comm_init(&w)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    me = dt_comm_rank(w);
    if (dt_comm_nodes(w) > 1) { /* under mpirun's pseudo-nodes: the hierarchical exchange alone */
        hier_against_sequential(w, 0.01f);
        hier_against_sequential(w, 1.0f);
        dt_comm_destroy(w);
        if (me == 0) printf(failed ? "FAILED %d\n" : "all ok\n", failed);
        return failed != 0;
    }
    if (dt_comm_size(w) == 2 && argc > 1) {
        against_torch(w, argv[1], 2);
        against_torch(w, argv[1], 4);
    }
    full_rank(w);
    topk_against_sequential(w, 0.1f, 0, 0);
    topk_against_sequential(w, 1.0f, 0, 0);
    topk_against_sequential(w, 0.01f, 1, 0); /* the sampled candidates */
    topk_against_sequential(w, 0.05f, 1, 1); /* the sample misled */
    topk_against_sequential(w, 0.1f, 1, 2);  /* zeros among the top k */
    dt_codec_config dgc = { .kind = DT_CODEC_DGC, .density = 0.01f, .momentum = 0.9f };
    sparse_against_sequential(w, &dgc, 1, 0);
    dgc.nesterov = 1, dgc.clip = 90.0f, dgc.warmup = 2; /* the clip binds on "a" (norm ~187) and "c" (~100), not on "b" (~82) */
    sparse_against_sequential(w, &dgc, 1, 0);
    dgc = (dt_codec_config){ .kind = DT_CODEC_DGC, .density = 0.1f, .momentum = 0.5f, .warmup = 1, .weight_decay = 0.05f };
    sparse_against_sequential(w, &dgc, 0, 0);
    dgc = (dt_codec_config){ .kind = DT_CODEC_TOPK, .density = 0.001f, .warmup = 1 };
    sparse_against_sequential(w, &dgc, 1, 0);
    /* Ok-TopK: its threshold set on refresh steps (0 and 2, then 4) and reused between; at density 1 every sum kept */
    dt_codec_config ok = { .kind = DT_CODEC_TOPK, .density = 0.01f, .exchange = DT_SPARSE_OKTOPK, .refresh = 2 };
    sparse_against_sequential(w, &ok, 1, 0);
    ok.density = 0.05f, ok.refresh = 3;
    sparse_against_sequential(w, &ok, 1, 1);
    ok.density = 1.0f;
    sparse_against_sequential(w, &ok, 0, 0);
    ok = (dt_codec_config){ .kind = DT_CODEC_DGC, .density = 0.01f, .momentum = 0.9f, .exchange = DT_SPARSE_OKTOPK, .refresh = 2, .warmup = 1 };
    sparse_against_sequential(w, &ok, 1, 0);
    onebit_against_sequential(w, 0);
    onebit_against_sequential(w, 1);
    onebit_against_sequential(w, 2);
    zeroone_plan(6, 1, 2, 2, 40);
    zeroone_plan(40, 2, 3, 4, 100);
    zeroone_plan(100, 16, 32678, 16, 400);
    zeroone_plan(3, 3, 1, 16, 200);
    zeroone_against_sequential(w);
    zeroone_optimizer();
    zeroone_skipped_step();
    skipped_variance_step();
    bad_config();
    dt_comm_destroy(w);
    if (me == 0) printf(failed ? "FAILED %d\n" : "all ok\n", failed);
    return failed != 0;
}
