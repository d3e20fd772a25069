/* Sampling text from a model: the whole context goes through forward for
 * each new token (no key/value cache: simple, and fast enough for the small
 * models trained here), keeping the last max_seq_len tokens. */
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct { float logit; int token; } cand;

static int by_logit(const void *a, const void *b) {
    float x = ((const cand *)a)->logit, y = ((const cand *)b)->logit;
    return x > y ? -1 : x < y;
}

dt_status dt_generate(dt_gpt2 *m, const int32_t *prompt, int nprompt, int count, float temperature, int top_k,
                      uint64_t seed, dt_emit_fn emit, void *ctx) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    if (nprompt < 1) return dt_error(DT_ERR_ARG, "generate: the prompt is empty");
    if (!(temperature >= 0)) return dt_error(DT_ERR_ARG, "generate: temperature %g must be >= 0", temperature);
    int V = c->vocab_size, Tmax = c->max_seq_len, n = nprompt;
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(nprompt + count));
    cand *cs = malloc(sizeof(cand) * (size_t)V);
    if (!toks || !cs) { free(toks); free(cs); return dt_error(DT_ERR_NOMEM, "generate: out of memory"); }
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)nprompt);
    uint64_t s = seed;
    dt_status st = dt_gpt2_reserve(m, 1, nprompt + count < Tmax ? nprompt + count : Tmax);
    for (int k = 0; k < count && !st; k++) {
        int T = n < Tmax ? n : Tmax;
        const int32_t *win = toks + n - T;
        if ((st = dt_gpt2_forward(m, win, NULL, 1, T, NULL))) break;
        const float *l = dt_gpt2_logits(m) + (size_t)(T - 1) * c->padded_vocab_size;
        int next = 0;
        if (temperature == 0) {
            for (int v = 1; v < V; v++) if (l[v] > l[next]) next = v;
        } else {
            for (int v = 0; v < V; v++) cs[v] = (cand){ l[v] / temperature, v };
            int keep = top_k > 0 && top_k < V ? top_k : V;
            if (keep < V) qsort(cs, (size_t)V, sizeof *cs, by_logit);
            float mx = -INFINITY;
            for (int i = 0; i < keep; i++) if (cs[i].logit > mx) mx = cs[i].logit;
            double sum = 0;
            for (int i = 0; i < keep; i++) sum += exp(cs[i].logit - mx);
            double u = (dt_rng_next(&s) >> 11) / 9007199254740992.0 * sum, acc = 0;
            next = cs[keep - 1].token;
            for (int i = 0; i < keep; i++) {
                acc += exp(cs[i].logit - mx);
                if (u < acc) { next = cs[i].token; break; }
            }
        }
        toks[n++] = next;
        emit(next, ctx);
    }
    free(toks);
    free(cs);
    return st;
}
