/* Sampling text from a model: the whole context goes through forward for
 * each new token (no key/value cache: simple, and fast enough for the small
 * models trained here), keeping the last max_seq_len tokens; over a
 * pipeline's stages, each context through them in turn. */
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float logit; int token; } cand;

static int by_logit(const void *a, const void *b) {
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x > y ? -1 : x < y;
}

/* The next token from the last position's logits l: the most likely at temperature 0, else drawn from the top_k. */
static int draw(const float *l, int V, float temperature, int top_k, uint64_t *s, cand *cs) {
    int next = 0;
    if (temperature == 0) {
        for (int v = 1; v < V; v++) if (l[v] > l[next]) next = v;
        return next;
    }
    for (int v = 0; v < V; v++) cs[v] = (cand){ l[v] / temperature, v };
    int keep = top_k > 0 && top_k < V ? top_k : V;
    if (keep < V) qsort(cs, (size_t)V, sizeof *cs, by_logit);
    float mx = -INFINITY;
    for (int i = 0; i < keep; i++) if (cs[i].logit > mx) mx = cs[i].logit;
    double sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(cs[i].logit - mx);
    double u = (dt_rng_next(s) >> 11) / 9007199254740992.0 * sum, acc = 0;
    next = cs[keep - 1].token;
    for (int i = 0; i < keep; i++) {
        acc += exp(cs[i].logit - mx);
        if (u < acc) return cs[i].token;
    }
    return next;
}

/* The window's forward on this stage: from the previous stage's output (x) unless first, on to the next unless last
 * (*last set: the logits are here). */
static dt_status stage_forward(dt_gpt2 *m, dt_comm *pp, const int32_t *win, int T, float *x, int *last) {
    int s = pp ? dt_comm_rank(pp) : 0, p = pp ? dt_comm_size(pp) : 1, ua, ub;
    size_t n = (size_t)T * (size_t)dt_gpt2_get_config(m)->channels;
    dt_gpt2_units(m, &ua, &ub);
    *last = s == p - 1;
    dt_status st = s > 0 ? dt_comm_recv(pp, x, n, DT_F32, s - 1) : DT_OK;
    if (!st) st = dt_gpt2_forward_units(m, ua, ub, win, s > 0 ? x : NULL, NULL, 1, T, NULL);
    if (!st && !*last) st = dt_comm_send(pp, dt_gpt2_output(m), n, DT_F32, s + 1);
    if (st && p > 1) return dt_error(st, "generate, pipeline stage %d: %s", s, dt_last_error());
    return st;
}

dt_status dt_generate(dt_gpt2 *m, dt_comm *pp, const int32_t *prompt, int nprompt, int count, float temperature, int top_k,
                      uint64_t seed, dt_emit_fn emit, void *ctx) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    if (nprompt < 1) return dt_error(DT_ERR_ARG, "generate: the prompt is empty");
    if (!(temperature >= 0)) return dt_error(DT_ERR_ARG, "generate: temperature %g must be >= 0", temperature);
    int V = c->vocab_size, Tmax = c->max_seq_len, n = nprompt, p = pp ? dt_comm_size(pp) : 1;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(nprompt + count));
    cand *cs = malloc(sizeof(cand) * (size_t)V);
    float *x = p > 1 ? malloc(sizeof(float) * (size_t)Tmax * (size_t)c->channels) : NULL;
    if (!toks || !cs || (p > 1 && !x)) { free(toks); free(cs); free(x); return dt_error(DT_ERR_NOMEM, "generate: out of memory"); }
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)nprompt);
    uint64_t s = seed;
    dt_status st = dt_gpt2_reserve(m, 1, nprompt + count < Tmax ? nprompt + count : Tmax);
    for (int k = 0; k < count && !st; k++) {
        int T = n < Tmax ? n : Tmax, last;
        if ((st = stage_forward(m, p > 1 ? pp : NULL, toks + n - T, T, x, &last))) break;
        int32_t next = last ? draw(dt_gpt2_logits(m) + (size_t)(T - 1) * c->padded_vocab_size, V, temperature, top_k, &s, cs) : 0;
        /* the last stage's token goes to the first stage's next window (and every stage keeps the text) */
        if (p > 1 && (st = dt_comm_broadcast(pp, &next, 1, DT_I32, p - 1))) break;
        toks[n++] = next;
        if (last) emit(next, ctx);
    }
    free(toks);
    free(cs);
    free(x);
    return st;
}
