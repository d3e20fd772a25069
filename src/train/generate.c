/* Sampling text from a model. On one process the decoder's key/value cache
 * reads the prompt once and each new token is one row through the model;
 * when the context fills, the last half of it is read again (a window that
 * slides by half the context). Without the cache (and over a pipeline's
 * stages, each context through them in turn) the whole window of the last
 * max_seq_len tokens goes through forward for each new token. */
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/parallel.h"
#include "dtrain/train.h"

#include <stdlib.h>
#include <string.h>

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

/* Without the cache: every token's window through forward (and the pipeline's stages). */
static dt_status generate_windows(dt_gpt2 *m, dt_comm *pp, int32_t *toks, int nprompt, const dt_generate_options *o,
                                  dt_emit_fn emit, void *ctx) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    int V = c->vocab_size, Tmax = c->max_seq_len, n = nprompt, p = pp ? dt_comm_size(pp) : 1;
    void *scratch = malloc(dt_sample_scratch_bytes(V));
    float *x = p > 1 ? malloc(sizeof(float) * (size_t)Tmax * (size_t)c->channels) : NULL, pen = o->sampling.repetition_penalty;
    bool penalized = pen != 0 && pen != 1; /* (the logits row copied and penalized by the tokens the text holds) */
    float *row = penalized ? malloc(sizeof(float) * (size_t)V) : NULL;
    uint64_t *seen = penalized ? calloc(dt_token_set_words(V), sizeof(uint64_t)) : NULL;
    if (!scratch || (p > 1 && !x) || (penalized && (!row || !seen))) {
        free(scratch), free(x), free(row), free(seen);
        return dt_error(DT_ERR_NOMEM, "generate: out of memory");
    }
    for (int i = 0; seen && i < nprompt; i++) dt_token_set_add(seen, toks[i]);
    uint64_t s = o->seed;
    dt_status st = dt_gpt2_reserve(m, 1, nprompt + o->count < Tmax ? nprompt + o->count : Tmax);
    for (int k = 0; k < o->count && !st; k++) {
        int T = n < Tmax ? n : Tmax, last;
        if ((st = stage_forward(m, p > 1 ? pp : NULL, toks + n - T, T, x, &last))) break;
        const float *l = dt_gpt2_logits(m) + (size_t)(T - 1) * c->padded_vocab_size;
        if (last && row) memcpy(row, l, sizeof(float) * (size_t)V), dt_sample_penalize(row, V, pen, seen), l = row;
        int32_t next = last ? dt_sample_token(l, V, &o->sampling, &s, scratch) : 0;
        /* the last stage's token goes to the first stage's next window (and every stage keeps the text) */
        if (p > 1 && (st = dt_comm_broadcast(pp, &next, 1, DT_I32, p - 1))) break;
        if (o->ends && dt_token_ends_has(o->ends, next)) break; /* (every stage has the token: all stop) */
        toks[n++] = next;
        if (seen) dt_token_set_add(seen, next);
        if (last) emit(next, ctx);
    }
    free(scratch), free(x), free(row), free(seen);
    return st;
}

typedef struct {
    dt_emit_fn emit;
    void *ctx;
    int32_t *toks;
    int n;
    const dt_token_ends *ends;
    bool ended; /* an end was drawn */
} cached_run;

static int on_token(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    cached_run *r = ctx;
    if (r->ends && dt_token_ends_has(r->ends, token)) { r->ended = true; return 1; } /* (the batcher ends the request) */
    r->toks[r->n++] = token;
    r->emit(token, r->ctx);
    return 0;
}

/* With the cache: one request at a time through a one-slot batcher; when the context is full, the last half of the
 * text becomes the next request's prompt (its random state carried on). */
static dt_status generate_cached(dt_gpt2 **m, int32_t *toks, int nprompt, const dt_generate_options *o, dt_emit_fn emit,
                                 void *ctx) {
    int Tmax = dt_gpt2_get_config(*m)->max_seq_len, half = Tmax / 2 > 0 ? Tmax / 2 : 1;
    if (nprompt > Tmax || nprompt + o->count - 1 > Tmax)
        dt_log(DT_LOG_WARN, "generate: the model reads %d tokens at most: %s%seach time the context fills, its last %d tokens are "
               "read again (--no-cache slides the window by one token instead)", Tmax,
               nprompt > Tmax ? "the prompt's last tokens are read" : "", nprompt > Tmax ? "; " : "", half);
    int rows = Tmax < 256 ? Tmax : 256;
    /* the cache holds the positions the text reaches (not a 40960-position model's whole context), or the whole context
     * where the window slides */
    int positions = (long)nprompt + o->count <= Tmax ? nprompt + o->count : 0;
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    dt_status st;
    if (o->cuda) { /* the weights on the GPU: the host's copy is let go */
        st = dt_decoder_create_gpu(*m, o->cuda - 1, 1, rows, positions, &d);
        dt_gpt2_destroy(*m);
    } else st = dt_decoder_create_taking(*m, o->quant, 1, rows, positions, &d); /* the weights held once */
    *m = NULL;
    if (!st) st = dt_batcher_create(d, rows, &b);
    cached_run run = { emit, ctx, toks, nprompt, o->ends, false };
    uint64_t seed = o->seed;
    int window = nprompt < Tmax ? nprompt : Tmax;
    while (!st && !run.ended && run.n - nprompt < o->count) {
        int done = run.n - nprompt;
        dt_infer_request r = { toks + run.n - window, window, o->count - done, o->sampling, seed, on_token, NULL, &run, NULL, NULL, 0 };
        st = dt_batcher_add(b, &r);
        while (!st && dt_batcher_free_slots(b) == 0) st = dt_batcher_step(b);
        seed = dt_rng_next(&seed); /* a fresh stream for the next window (the first window's draws are seed's) */
        window = half;
    }
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
    return st;
}

dt_status dt_generate(dt_gpt2 **m, dt_comm *pp, const int32_t *prompt, int nprompt, const dt_generate_options *o, dt_emit_fn emit,
                      void *ctx) {
    if (nprompt < 1) return dt_error(DT_ERR_ARG, "generate: the prompt is empty");
    dt_status st = dt_sampling_check(&o->sampling);
    if (st) return dt_error(st, "generate: %s", dt_last_error());
    int32_t *toks = malloc(sizeof(int32_t) * (size_t)(nprompt + o->count));
    if (!toks) return dt_error(DT_ERR_NOMEM, "generate: out of memory");
    memcpy(toks, prompt, sizeof(int32_t) * (size_t)nprompt);
    bool staged = pp && dt_comm_size(pp) > 1;
    if (o->cache && !staged) st = generate_cached(m, toks, nprompt, o, emit, ctx);
    else st = generate_windows(*m, staged ? pp : NULL, toks, nprompt, o, emit, ctx);
    free(toks);
    return st;
}

/* The model this rank runs: the whole one, or over several ranks (w) its pipeline stage (stages split by cost at the
 * model's longest context, as training splits them) or, with tp, its tensor-parallel part (collectives ops over w). */
dt_status dt_generate_load(const char *model, const char *lora, dt_comm *w, bool tp, dt_tp_ops *ops, dt_gpt2 **out) {
    dt_gpt2 *whole = NULL;
    dt_status st = dt_checkpoint_load_weights(model, 0, &whole, NULL);
    *out = NULL;
    if (!st && lora && (st = dt_peft_merge(lora, dt_gpt2_program(whole)))) { /* merged before any split: every part gets its share */
        char why[600];
        snprintf(why, sizeof why, "%s", dt_last_error());
        st = dt_error(st, "--lora %s: %s", lora, why);
    }
    if (st) {
        dt_gpt2_destroy(whole);
        return st;
    }
    return dt_generate_split(whole, w, tp, ops, out);
}

dt_status dt_generate_split(dt_gpt2 *whole, dt_comm *w, bool tp, dt_tp_ops *ops, dt_gpt2 **out) {
    dt_status st = DT_OK;
    int p = w ? dt_comm_size(w) : 1;
    *out = whole;
    if (p == 1) return DT_OK;
    dt_gpt2_config cfg = *dt_gpt2_get_config(whole);
    dt_model_part part = dt_gpt2_whole(&cfg);
    *out = NULL;
    if (tp) {
        *ops = dt_tp_ops_over(w);
        part.tp_rank = dt_comm_rank(w);
        part.tp_size = p;
        part.tp = ops;
    } else {
        st = dt_gpt2_stage_part(&cfg, cfg.max_seq_len, p, 1, dt_comm_rank(w), &part);
    }
    if (!st) st = dt_gpt2_create_part(&cfg, &part, out);
    if (!st) st = dt_gpt2_copy_slices(whole, *out);
    dt_gpt2_destroy(whole);
    if (st) { dt_gpt2_destroy(*out); *out = NULL; return dt_error(st, "--%s %d: %s", tp ? "tp" : "pp", p, dt_last_error()); }
    return DT_OK;
}
