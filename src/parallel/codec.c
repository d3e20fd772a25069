/* The gradient codecs' shell: which one, its per-tensor state across steps, its step count and what a step sent.
 * The codecs themselves: codec_powersgd.c, codec_topk.c (and DGC's rules on it, codec_dgc.c), codec_onebit.c and
 * codec_zeroone.c (both over codec_signs.c's exchange). */
#include "codec_internal.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name; dt_codec_kind kind; const dt_codec_ops *ops; } codecs[] = {
    { "none", DT_CODEC_NONE, NULL },
    { "powersgd", DT_CODEC_POWERSGD, &dt_codec_powersgd },
    { "topk", DT_CODEC_TOPK, &dt_codec_topk },
    { "dgc", DT_CODEC_DGC, &dt_codec_topk },
    { "onebit", DT_CODEC_ONEBIT, &dt_codec_onebit },
    { "zeroone", DT_CODEC_ZEROONE, &dt_codec_zeroone },
};
enum { NCODECS = sizeof codecs / sizeof *codecs };

dt_status dt_codec_parse(const char *s, dt_codec_kind *out) {
    for (int i = 0; i < NCODECS; i++)
        if (!strcmp(s, codecs[i].name)) { *out = codecs[i].kind; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--compress %s: the codecs are none, powersgd, topk, dgc, onebit and zeroone", s);
}

static const char *const exchanges[] = { "auto", "allgather", "oktopk", "hier" };

dt_status dt_codec_parse_exchange(const char *s, dt_sparse_exchange *out) {
    for (int i = 0; i < 4; i++)
        if (!strcmp(s, exchanges[i])) { *out = (dt_sparse_exchange)i; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--compress-exchange %s: the sparse exchanges are auto, allgather, oktopk and hier", s);
}

void dt_codec_sparse_times(double P, double k, double alpha, double beta, double *gather, double *oktopk) {
    double pair = 8;
    *gather = alpha * ceil(log2(P)) + beta * pair * k * (P - 1);
    *oktopk = alpha * (2 + 2 * (P - 1)) + beta * pair * 2 * k * (P - 1) / P;
}

const char *dt_codec_exchange_name(dt_sparse_exchange e) { return (unsigned)e < 4 ? exchanges[e] : "?"; }

double dt_codec_hier_time(double l, double q, double n, double k, double ia, double ib, double xa, double xb) {
    return 2 * (l - 1) * ia + 2 * n * 4 * (l - 1) / l * ib + xa * ceil(log2(q)) + xb * 8 * (k / l) * (q - 1);
}

const char *dt_codec_name(dt_codec_kind k) {
    for (int i = 0; i < NCODECS; i++)
        if (codecs[i].kind == k) return codecs[i].name;
    return "?";
}

dt_status dt_codec_create(const dt_codec_config *c, const dt_tensor_info *t, int nt, dt_codec **out) {
    *out = NULL;
    const dt_codec_ops *ops = NULL;
    for (int i = 0; i < NCODECS; i++)
        if (codecs[i].kind == c->kind) ops = codecs[i].ops;
    if (!ops) return dt_error(DT_ERR_ARG, "codec: %s compresses nothing", dt_codec_name(c->kind));
    if (c->start < 0) return dt_error(DT_ERR_ARG, "--compress-start %d: a step count is 0 or more", c->start);
    dt_status st = ops->check(c);
    if (st) return st;
    /* a PowerSGD rank at which no matrix gains would send everything whole: said, not run as if compressed */
    size_t approx = 0;
    for (int i = 0; i < nt && c->kind == DT_CODEC_POWERSGD; i++) approx += ops->state_floats(c, &t[i], DT_CODEC_Q);
    if (c->kind == DT_CODEC_POWERSGD && nt > 0 && !approx)
        return dt_error(DT_ERR_ARG, "--compress-rank %d: no matrix of the model gains at that rank ((n + m) x %d x %g is not below n x m for "
                        "any): every gradient would travel whole; a smaller rank", c->rank, c->rank, c->min_rate);
    dt_codec *k = calloc(1, sizeof *k);
    if (!k) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
    k->c = *c;
    k->ops = ops;
    k->t = t;
    k->nt = nt;
    bool ok = (k->impl = calloc(1, ops->impl_size)) != NULL;
    for (int s = 0; s < DT_CODEC_NSTATES && ok; s++) ok = (k->state[s] = calloc((size_t)(nt ? nt : 1), sizeof *k->state[s])) != NULL;
    if (!ok) { dt_codec_destroy(k); return dt_error(DT_ERR_NOMEM, "codec: out of memory"); }
    *out = k;
    return DT_OK;
}

void dt_codec_destroy(dt_codec *k) {
    if (!k) return;
    if (k->ops && k->ops->destroy) k->ops->destroy(k);
    free(k->impl);
    for (int s = 0; s < DT_CODEC_NSTATES; s++) {
        for (int i = 0; k->state[s] && i < k->nt; i++) free(k->state[s][i]);
        free(k->state[s]);
    }
    for (int b = 0; b < k->nbuckets; b++) free(k->buckets[b].idx);
    free(k->buckets);
    free(k);
}

int dt_codec_active(const dt_codec *k) { return k->ops->own_warmup || k->steps >= k->c.start; }

dt_status dt_codec_grow(void **arr, int *n, size_t size, int b) {
    if (b < *n) return DT_OK;
    char *a = realloc(*arr, size * (size_t)(b + 1));
    if (!a) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
    memset(a + size * (size_t)*n, 0, size * (size_t)(b + 1 - *n));
    *arr = a;
    *n = b + 1;
    return DT_OK;
}

dt_status dt_codec_layout(const dt_codec *k, const int *idx, int n, int **t, size_t **at, size_t *len) {
    *t = malloc(sizeof **t * (size_t)(n ? n : 1));
    *at = malloc(sizeof **at * (size_t)(n + 1));
    if (!*t || !*at) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
    memcpy(*t, idx, sizeof *idx * (size_t)n);
    *len = 0;
    for (int i = 0; i < n; i++) (*at)[i] = *len, *len += k->t[idx[i]].count;
    (*at)[n] = *len;
    return DT_OK;
}

/* Bucket b's tensors: kept at its first exchange (*first), the same ones at every other. */
static dt_status same_bucket(dt_codec *k, int b, const int *idx, int n, int *first) {
    dt_status st = b < 0 ? dt_error(DT_ERR_ARG, "codec: bucket %d", b) : dt_codec_grow((void **)&k->buckets, &k->nbuckets, sizeof *k->buckets, b);
    if (st) return st;
    *first = !k->buckets[b].idx;
    if (*first) {
        if (!(k->buckets[b].idx = malloc(sizeof *idx * (size_t)(n ? n : 1)))) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
        memcpy(k->buckets[b].idx, idx, sizeof *idx * (size_t)n);
        k->buckets[b].n = n;
        return DT_OK;
    }
    if (k->buckets[b].n != n || memcmp(k->buckets[b].idx, idx, sizeof *idx * (size_t)n))
        return dt_error(DT_ERR_ARG, "codec: bucket %d holds other tensors than at its first step", b);
    return DT_OK;
}

dt_status dt_codec_start(dt_codec *k, dt_comm *comm, int b, const int *idx, int n, float *g, dt_request **req) {
    *req = NULL;
    if (k->comm && comm != k->comm) return dt_error(DT_ERR_ARG, "codec: one communicator for every bucket");
    k->comm = comm;
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= k->nt) return dt_error(DT_ERR_ARG, "codec: tensor %d outside the table's %d", idx[i], k->nt);
    int first;
    dt_status st = same_bucket(k, b, idx, n, &first);
    return st ? st : k->ops->start(k, comm, b, idx, n, g, first, req);
}

dt_status dt_codec_next(dt_codec *k, dt_comm *comm, int b, float *g, dt_request **req, int *done) {
    *req = NULL;
    *done = 0;
    return k->ops->next(k, comm, b, g, req, done);
}

int dt_codec_next_collective(const dt_codec *k, int b) { return k->ops->next_collective(k, b); }

void dt_codec_end_step(dt_codec *k, dt_codec_stats *s) {
    if (s) *s = k->now;
    k->now = (dt_codec_stats){ 0, 0, 0, 0 };
    k->steps++;
}

float *dt_codec_state(dt_codec *k, int i, dt_codec_state_kind s, size_t *n) {
    *n = 0;
    if (i < 0 || i >= k->nt || s < 0 || s >= DT_CODEC_NSTATES) return NULL;
    size_t want = k->ops->state_floats(&k->c, &k->t[i], s);
    if (!want) return NULL;
    if (!k->state[s][i] && !(k->state[s][i] = calloc(want, sizeof(float)))) return NULL;
    *n = want;
    return k->state[s][i];
}

int dt_codec_has_state(const dt_codec *k) { return k->steps > (k->ops->own_warmup ? 0 : k->c.start); }

size_t dt_codec_state_size(const dt_codec *k, dt_codec_state_kind s) {
    size_t n = 0;
    for (int i = 0; i < k->nt; i++) n += k->ops->state_floats(&k->c, &k->t[i], s);
    return n;
}

size_t dt_codec_state_bytes(const dt_codec *k) {
    size_t n = 0;
    for (int s = 0; k && dt_codec_has_state(k) && s < DT_CODEC_NSTATES; s++) n += dt_codec_state_size(k, (dt_codec_state_kind)s);
    return n * sizeof(float);
}

dt_status dt_codec_check_optimizer(const dt_codec_config *c, int opt, float grad_clip, int loss_scaled) {
    const char *name = dt_optim_kind_name((dt_optim_kind)opt);
    if (c->kind == DT_CODEC_ONEBIT) {
        if (opt != DT_OPT_ADAMW)
            return dt_error(DT_ERR_ARG, "--compress onebit is 1-bit Adam: --optimizer adamw (Adam with --weight-decay 0), not %s", name);
        if (grad_clip > 0)
            return dt_error(DT_ERR_ARG, "--compress onebit with --grad-clip: after its warm-up the momentum travels, not the "
                            "gradient: nothing whole to clip");
        if (loss_scaled) return dt_error(DT_ERR_ARG, "--compress onebit with a loss scale: its momentum needs unscaled gradients");
    }
    if (c->kind == DT_CODEC_ZEROONE) {
        if (opt != DT_OPT_ADAMW) return dt_error(DT_ERR_ARG, "--compress zeroone is 0/1 Adam: --optimizer adamw, not %s", name);
        if (grad_clip > 0)
            return dt_error(DT_ERR_ARG, "--compress zeroone with --grad-clip: most steps average the gradient in one bit an entry, "
                            "or not at all (the local steps): no whole gradient to clip");
        if (loss_scaled) return dt_error(DT_ERR_ARG, "--compress zeroone with a loss scale: its signs and local steps need unscaled gradients");
    }
    if (c->kind != DT_CODEC_DGC) return DT_OK;
    if (opt != DT_OPT_SGD)
        return dt_error(DT_ERR_ARG, "--compress dgc corrects SGD's momentum on each rank: --optimizer sgd, not %s (top-k sends "
                        "what %s would take: --compress topk)", name, name);
    if (c->start > 0)
        return dt_error(DT_ERR_ARG, "--compress dgc --compress-start %d: DGC compresses from the first step (its momentum lives on each "
                        "rank, not in the optimizer); its gentle start is --compress-warmup", c->start);
    if (loss_scaled) return dt_error(DT_ERR_ARG, "--compress dgc with a loss scale: its accumulation needs unscaled gradients");
    return DT_OK;
}

dt_status dt_codec_check_strategy(const dt_codec_config *c, const char *strategy) {
    if (c->kind == DT_CODEC_ZEROONE && strategy && !strncmp(strategy, "zero", 4))
        return dt_error(DT_ERR_ARG, "--compress zeroone with %s: 0/1 Adam's local steps move every parameter on every rank from that "
                        "rank's whole optimizer state, which ZeRO shards; data parallelism alone (no --zero)", strategy);
    return DT_OK;
}

size_t dt_codec_work_bytes(const dt_codec *k) { return k && k->ops->work ? k->ops->work(k) : 0; }

size_t dt_codec_work_bytes_for(const dt_codec_config *c, const dt_tensor_info *t, int nt, const dt_codec_place *at) {
    for (int i = 0; i < NCODECS; i++)
        if (codecs[i].kind == c->kind && codecs[i].ops->work_for) return codecs[i].ops->work_for(c, t, nt, at);
    return 0;
}

dt_status dt_codec_state_io(dt_codec *k, dt_codec_state_kind s, float *buf, int load) {
    if (!load && !dt_codec_has_state(k)) return dt_error(DT_ERR_ARG, "codec: no step compressed yet: no state to keep");
    size_t at = 0;
    for (int i = 0; i < k->nt; i++) {
        size_t n;
        if (!k->ops->state_floats(&k->c, &k->t[i], s)) continue;
        float *x = dt_codec_state(k, i, s, &n);
        if (!x) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
        memcpy(load ? x : buf + at, load ? buf + at : x, n * sizeof *x);
        at += n;
    }
    return DT_OK;
}

size_t dt_codec_shared_size(const dt_codec *k) { return k->ops->shared_words ? k->ops->shared_words(k) : 0; }

dt_status dt_codec_shared_io(dt_codec *k, float *buf, size_t n, int load) {
    if (!k->ops->shared_io) return n ? dt_error(DT_ERR_IO, "codec: %s keeps no per-bucket state, but %zu words were given", dt_codec_name(k->c.kind), n) : DT_OK;
    /* the words travel in the float file as bits */
    uint32_t *w = malloc(sizeof *w * (n ? n : 1));
    if (!w) return dt_error(DT_ERR_NOMEM, "codec: out of memory");
    if (load) memcpy(w, buf, n * sizeof *w);
    dt_status st = k->ops->shared_io(k, w, n, load);
    if (!st && !load) memcpy(buf, w, n * sizeof *w);
    free(w);
    return st;
}

const dt_codec_config *dt_codec_get_config(const dt_codec *k) { return &k->c; }

void dt_codec_set_model(dt_codec *k, const dt_model *m) { k->model = m; }

int dt_codec_steps(const dt_codec *k) { return k->steps; }

void dt_codec_set_steps(dt_codec *k, int steps) { k->steps = steps; }
