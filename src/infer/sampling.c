/* Drawing the next token from a distribution: greedy, temperature, top-k
 * and nucleus (top-p), with the caller's random state (a request's seed
 * gives its text, whatever else runs). */
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

dt_status dt_sampling_check(const dt_sampling *s) {
    if (!(s->temperature >= 0) || !isfinite(s->temperature))
        return dt_error(DT_ERR_ARG, "temperature %g: expected a finite number >= 0", s->temperature);
    if (s->top_k < 0) return dt_error(DT_ERR_ARG, "top_k %d: expected >= 0 (0: all tokens)", s->top_k);
    if (!(s->top_p > 0 && s->top_p <= 1)) return dt_error(DT_ERR_ARG, "top_p %g: expected a number in (0, 1]", s->top_p);
    return DT_OK;
}

int32_t dt_sample_token(const float *l, int V, const dt_sampling *s, uint64_t *rng, void *scratch) {
    if (s->temperature == 0) {
        int next = 0;
        for (int v = 1; v < V; v++) if (l[v] > l[next]) next = v;
        return next;
    }
    cand *cs = scratch;
    for (int v = 0; v < V; v++) cs[v] = (cand){ l[v] / s->temperature, v };
    int keep = s->top_k > 0 && s->top_k < V ? s->top_k : V;
    if (keep < V || s->top_p < 1) qsort(cs, (size_t)V, sizeof *cs, by_logit);
    float mx = -INFINITY;
    for (int i = 0; i < keep; i++) if (cs[i].logit > mx) mx = cs[i].logit;
    double sum = 0;
    for (int i = 0; i < keep; i++) sum += exp(cs[i].logit - mx);
    if (s->top_p < 1) { /* the fewest most likely whose probability reaches top_p */
        double acc = 0;
        int k = 0;
        while (k < keep && acc < s->top_p * sum) acc += exp(cs[k++].logit - mx);
        keep = k > 0 ? k : 1;
        sum = acc > 0 ? acc : exp(cs[0].logit - mx);
    }
    double u = (dt_rng_next(rng) >> 11) / 9007199254740992.0 * sum, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += exp(cs[i].logit - mx);
        if (u < acc) return cs[i].token;
    }
    return cs[keep - 1].token;
}
