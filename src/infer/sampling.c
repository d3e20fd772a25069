/* Drawing the next token from a distribution: greedy, temperature, top-k,
 * nucleus (top-p) and min-p after the biases and penalties, with the caller's random state (a request's
 * seed gives its text, whatever else runs). */
#include "dtrain/infer.h"

#include <math.h>
#include <stdlib.h>

typedef struct { float logit; int token; } cand;

static int by_logit(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->token - y->token; /* a total order: qsort's result is the same on every platform */
}

size_t dt_sample_scratch_bytes(int V) { return sizeof(cand) * (size_t)(V > 0 ? V : 1); }

size_t dt_token_set_words(int V) { return ((size_t)(V > 0 ? V : 1) + 63) / 64; }
void dt_token_set_add(uint64_t *set, int32_t token) { set[token >> 6] |= 1ull << (token & 63); }

void dt_sample_penalize(float *l, int V, float p, const uint64_t *seen) {
    if (p == 0 || p == 1 || !seen) return;
    for (int v = 0; v < V; v++)
        if (seen[v >> 6] >> (v & 63) & 1) l[v] = l[v] > 0 ? l[v] / p : l[v] * p;
}

void dt_sample_bias(float *l, int V, const dt_sampling *s) {
    for (int i = 0; i < s->nlogit_bias; i++)
        if (s->logit_bias[i].token >= 0 && s->logit_bias[i].token < V) l[s->logit_bias[i].token] += s->logit_bias[i].bias;
}

void dt_sample_suppress(float *l, int V, const dt_sampling *s, int drawn) {
    for (int i = 0; drawn < s->min_tokens && i < s->nsuppress; i++)
        if (s->suppress[i] >= 0 && s->suppress[i] < V) l[s->suppress[i]] = -INFINITY;
}

void dt_sample_penalize_counts(float *l, int V, float presence, float frequency, const int32_t *counts) {
    if ((presence == 0 && frequency == 0) || !counts) return;
    for (int v = 0; v < V; v++)
        if (counts[v] > 0) { /* two roundings, as vLLM's two subtractions */
            l[v] -= frequency * (float)counts[v];
            l[v] -= presence;
        }
}

dt_status dt_sampling_check(const dt_sampling *s) {
    if (!(s->temperature >= 0) || !isfinite(s->temperature))
        return dt_error(DT_ERR_ARG, "temperature %g: expected a finite number >= 0", s->temperature);
    if (s->top_k < 0) return dt_error(DT_ERR_ARG, "top_k %d: expected >= 0 (0: all tokens)", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1)) return dt_error(DT_ERR_ARG, "top_p %g: expected a number in (0, 1]", s->top_p);
    if (!(s->min_p >= 0 && s->min_p <= 1)) return dt_error(DT_ERR_ARG, "min_p %g: expected a number in [0, 1]", s->min_p);
    if (!(s->repetition_penalty >= 0) || !isfinite(s->repetition_penalty))
        return dt_error(DT_ERR_ARG, "repetition_penalty %g: expected a finite number above 0 (1: none)", s->repetition_penalty);
    if (!isfinite(s->presence_penalty)) return dt_error(DT_ERR_ARG, "presence_penalty %g: expected a finite number", s->presence_penalty);
    if (!isfinite(s->frequency_penalty)) return dt_error(DT_ERR_ARG, "frequency_penalty %g: expected a finite number", s->frequency_penalty);
    if (s->nlogit_bias < 0 || (s->nlogit_bias && !s->logit_bias)) return dt_error(DT_ERR_ARG, "logit_bias: %d entries", s->nlogit_bias);
    if (s->min_tokens < 0 || s->nsuppress < 0 || (s->nsuppress && !s->suppress))
        return dt_error(DT_ERR_ARG, "min_tokens %d (%d tokens suppressed): expected >= 0", s->min_tokens, s->nsuppress);
    for (int i = 0; i < s->nlogit_bias; i++)
        if (!isfinite(s->logit_bias[i].bias))
            return dt_error(DT_ERR_ARG, "logit_bias of token %d: %g, expected a finite number", (int)s->logit_bias[i].token, s->logit_bias[i].bias);
    return DT_OK;
}

/* The candidates softmax draws from, sorted most likely first where a filter needs the order, into cs: their count;
 * *mx their largest scaled logit, *sum their sum of exp(logit - mx). */
static int candidates(const float *l, int V, const dt_sampling *s, cand *cs, float *mx, double *sum) {
    for (int v = 0; v < V; v++) cs[v] = (cand){ l[v] / s->temperature, v };
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (keep < V || s->top_p < 1 || s->min_p > 0) qsort(cs, (size_t)V, sizeof *cs, by_logit);
    *mx = -INFINITY;
    for (int i = 0; i < keep; i++) if (cs[i].logit > *mx) *mx = cs[i].logit;
    *sum = 0;
    for (int i = 0; i < keep; i++) *sum += exp(cs[i].logit - *mx);
    if (s->top_p < 1) { /* the fewest most likely whose probability reaches top_p */
        double acc = 0;
        int k = 0;
        while (k < keep && acc < s->top_p * *sum) acc += exp(cs[k++].logit - *mx);
        keep = k > 0 ? k : 1;
        *sum = acc > 0 ? acc : exp(cs[0].logit - *mx);
    }
    if (s->min_p > 0) { /* those at least min_p times as likely as the first (p / p_max = exp(l - mx)) */
        int k = 1;
        double acc = exp(cs[0].logit - *mx);
        while (k < keep && exp(cs[k].logit - *mx) >= s->min_p) acc += exp(cs[k++].logit - *mx);
        keep = k, *sum = acc;
    }
    return keep;
}

int dt_sample_candidates(const float *logits, int V, const dt_sampling *s, void *scratch, int32_t *tokens) {
    cand *cs = scratch;
    float mx;
    double sum;
    int keep = candidates(logits, V, s, cs, &mx, &sum);
    for (int i = 0; i < keep; i++) tokens[i] = cs[i].token;
    return keep;
}

int32_t dt_sample_token(const float *l, int V, const dt_sampling *s, uint64_t *rng, void *scratch) {
    if (s->temperature == 0) {
        int next = 0;
        for (int v = 1; v < V; v++) if (l[v] > l[next]) next = v;
        return next;
    }
    cand *cs = scratch;
    float mx;
    double sum;
    int keep = candidates(l, V, s, cs, &mx, &sum);
    double u = (dt_rng_next(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += exp(cs[i].logit - mx);
        if (u < acc) return cs[i].token;
    }
    return cs[keep - 1].token;
}
