/* dtrain infer layer: a trained GPT-2 run for text, fast. A decoder keeps
 * each sequence's keys and values (a cache slot per sequence), so a prompt
 * is read once (prefill) and each new token costs one row through the
 * model; many sequences decode together, each at its own position, and a
 * batcher lets requests join and leave the running batch at every step
 * (Orca's iteration-level scheduling), prefill and decode mixed under a
 * token budget. Every row goes through batch-invariant kernels
 * (dt_rowdot_*), so a request's tokens are the same bits alone, beside
 * others, or joining mid-way. Weights in f32 or int8. */
#ifndef DTRAIN_INFER_H
#define DTRAIN_INFER_H

#include "dtrain/model.h"

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DT_QUANT_NONE = 0, DT_QUANT_INT8 } dt_quant;
/* "none"/"f32" or "int8"; anything else DT_ERR_ARG. */
dt_status dt_quant_parse(const char *s, dt_quant *out);
const char *dt_quant_name(dt_quant q);

/* One row of a step: token at position pos of the sequence held in cache
 * slot slot; logits != 0: this row's next-token logits are wanted. A step's
 * rows of one slot come in position order, the first right after what the
 * cache holds (the positions before it, the cache keeps). */
typedef struct {
    int slot, pos;
    int32_t token;
    int logits;
} dt_infer_row;

typedef struct dt_decoder dt_decoder;
/* A decoder over m, a whole model or a tensor-parallel part of one (every
 * Linear and the head copied into dt_panels, f32 or int8 per output
 * channel, token embeddings read from the head's rows; the LayerNorms,
 * biases and position table copied: the decoder keeps nothing of m's, and
 * m may be destroyed once it is made), with nslots sequences' caches of
 * context positions each (0, or more than the model's max_seq_len: the
 * model's; a part's: its heads) and room for max_rows rows a step; the
 * decoder's config says max_seq_len = that context. Over a part, every rank of its group steps with the same
 * rows together (the row-parallel sums and the vocabulary's logits go
 * through the part's dt_tp_ops) and gets the whole logits, the same bits
 * on every rank. */
dt_status dt_decoder_create(const dt_gpt2 *m, dt_quant q, int nslots, int max_rows, int context, dt_decoder **out);
/* The same, taking m (the decoder's after, whether it succeeds or not): f32
 * Linears packed in m's own memory instead of copied, so the weights are
 * held once (int8: m destroyed once quantized). */
dt_status dt_decoder_create_taking(dt_gpt2 *m, dt_quant q, int nslots, int max_rows, int context, dt_decoder **out);
void dt_decoder_destroy(dt_decoder *d);
/* A decoder whose steps run elsewhere: each step's rows checked as always, then run(ctx, the rows as four int32
 * words each, n, logits) (logits [m, V] for the m rows that want them); destroy(ctx) with the decoder, or at once
 * when making it fails. */
typedef struct {
    void *ctx;
    dt_status (*run)(void *ctx, const int32_t *rows, int n, float *logits);
    void (*destroy)(void *ctx);
} dt_decoder_device;
dt_status dt_decoder_create_on(const dt_gpt2 *m, int nslots, int max_rows, int context, dt_decoder_device dev, dt_decoder **out);
/* The decoder on GPU `ordinal` through the GPU plugin (gpu_lm.h's dt_gpu_decoder: the weights and an f32 cache on
 * the device; m may be destroyed once it is made): a clear error where this build has no CUDA, the machine no GPU,
 * or the model is what it does not run (a mixture of experts, a model split over ranks). context: a slot's positions as
 * dt_decoder_create's. */
dt_status dt_decoder_create_gpu(const dt_gpt2 *m, int ordinal, int nslots, int max_rows, int context, dt_decoder **out);
const dt_gpt2_config *dt_decoder_config(const dt_decoder *d);
int dt_decoder_slots(const dt_decoder *d);
int dt_decoder_max_rows(const dt_decoder *d);
/* Bytes of weights a step reads (the model as the decoder holds it) and of the caches. */
size_t dt_decoder_weight_bytes(const dt_decoder *d);
size_t dt_decoder_cache_bytes(const dt_decoder *d);
/* What the cache holds of position pos in layer l of slot s: this rank's heads' key and value (*n floats each, the
 * channels over the TP ranks; widened from bf16 where the cache keeps bf16). */
dt_status dt_decoder_cached(const dt_decoder *d, int slot, int layer, int pos, float *k, float *v, int *n);
/* Slot from's cached positions [0, npos) copied into slot to, which then holds those (a prompt that starts as another
 * sequence does reads the rest only: the copy is the same bits its rows would write, the rows being batch-invariant);
 * over a leading part, the followers copy theirs. DT_ERR_ARG: a slot out of range, the same slot, or more positions
 * than from holds; DT_ERR_UNSUPPORTED: a device's decoder (dt_decoder_copies false). */
dt_status dt_decoder_copy(dt_decoder *d, int from, int to, int npos);
bool dt_decoder_copies(const dt_decoder *d);
/* One step over n rows: each row's key and value written to its slot's
 * cache at its position, its attention over positions 0..pos of its slot;
 * logits [rows with logits set, V] in row order. Fails (DT_ERR_ARG, naming
 * the row) on a slot, position or token out of range or more than max_rows;
 * over a part, with the collectives' error when one fails (a rank died). */
dt_status dt_decoder_step(dt_decoder *d, const dt_infer_row *rows, int n, float *logits);

/* Over a tensor-parallel part, one rank (the group's rank 0) may lead:
 * each dt_decoder_step of the leader first sends its rows to the others,
 * which run them in dt_decoder_follow until the leader's dt_decoder_release
 * (a server takes requests on one rank). A leader's step of 0 rows only
 * tells the followers it is alive (an idle server's heartbeat). follow
 * returns the error of a collective that failed (a rank died), naming it. */
dt_status dt_decoder_lead(dt_decoder *d);
dt_status dt_decoder_follow(dt_decoder *d);
dt_status dt_decoder_release(dt_decoder *d);

/* OpenAI's logit_bias: bias added to token's logit before the draw. */
typedef struct {
    int32_t token;
    float bias;
} dt_logit_bias;

/* How the next token is drawn: temperature 0 takes the most likely (the
 * lowest id among equals); else softmax(logits / temperature) over the
 * top_k most likely (0: all), of those the fewest whose probability
 * reaches top_p (1: all), and of those the ones at least min_p times as
 * likely as the most likely (0: all; Hugging Face's order and min_p).
 * Before them, in vLLM's order: logit_bias (nlogit_bias entries, the
 * caller's while a request runs) added; repetition_penalty (0 or 1: none;
 * Hugging Face's and vLLM's) dividing the positive logits of the tokens the
 * sequence holds (prompt and drawn) and multiplying the negative ones
 * (dt_sample_penalize); then OpenAI's frequency_penalty times the times a
 * token was drawn and its presence_penalty once subtracted (the prompt not
 * counted, as vLLM's; dt_sample_penalize_counts). The batcher applies all
 * of them. */
typedef struct {
    float temperature;
    int top_k;
    float top_p;
    float min_p;
    float repetition_penalty;
    float presence_penalty, frequency_penalty;
    const dt_logit_bias *logit_bias;
    int nlogit_bias;
    /* vLLM's min_tokens: while fewer are drawn, the nsuppress tokens at suppress (the caller's: its ends) cannot be */
    int min_tokens;
    const int32_t *suppress;
    int nsuppress;
} dt_sampling;
/* Checks the ranges (temperature >= 0 and finite, top_k >= 0, 0 < top_p <= 1, 0 <= min_p <= 1, repetition_penalty 0
 * or above 0 and finite, the presence and frequency penalties and biases finite, min_tokens >= 0), naming the bad one. */
dt_status dt_sampling_check(const dt_sampling *s);
/* logits[V] with s's logit_bias added (tokens outside [0, V) skipped: dt_batcher_add refuses them). */
void dt_sample_bias(float *logits, int V, const dt_sampling *s);
/* With fewer than s->min_tokens drawn, s's suppressed tokens at -inf in logits[V]. */
void dt_sample_suppress(float *logits, int V, const dt_sampling *s, int drawn);
/* logits[V] less frequency times counts[v] and presence where counts[v] > 0 (OpenAI's and vLLM's, in vLLM's order). */
void dt_sample_penalize_counts(float *logits, int V, float presence, float frequency, const int32_t *counts);
/* The next token from logits[V]; rng advanced (only when drawing); scratch
 * of dt_sample_scratch_bytes(V). */
int32_t dt_sample_token(const float *logits, int V, const dt_sampling *s, uint64_t *rng, void *scratch);
size_t dt_sample_scratch_bytes(int V);
/* The tokens a sequence holds, as a set for the repetition penalty: a bit a token of V (dt_token_set_words(V) words). */
size_t dt_token_set_words(int V);
void dt_token_set_add(uint64_t *set, int32_t token);
/* logits[V] of the tokens in seen penalized in place (Hugging Face's RepetitionPenaltyLogitsProcessor: l / p where
 * l > 0, l p where not); p 0 or 1: nothing. */
void dt_sample_penalize(float *logits, int V, float p, const uint64_t *seen);
/* The tokens a draw at temperature above 0 chooses among (into tokens[V], most likely first where a filter sorted them):
 * their count. */
int dt_sample_candidates(const float *logits, int V, const dt_sampling *s, void *scratch, int32_t *tokens);

/* A token's log-probability under logits[V] (log softmax, summed in double) and the k most likely tokens with theirs
 * into top[k], top_lp[k] (most likely first, the lower id first among equals; k 0: none): the model's own
 * distribution, before temperature, penalties or filters (as vLLM's default, raw_logprobs). */
float dt_logprob_top(const float *logits, int V, int32_t token, int k, int32_t *top, float *top_lp);

/* Why a request ended. */
typedef enum {
    DT_FINISH_LENGTH = 0, /* max_tokens generated */
    DT_FINISH_STOP,       /* its on_token asked to stop (a stop sequence, the client gone) */
    DT_FINISH_CONTEXT     /* the context (max_seq_len) is full */
} dt_finish;

typedef struct {
    const int32_t *prompt; /* copied by dt_batcher_add */
    int nprompt, max_tokens; /* max_tokens 0: the prompt is read (its logits to on_prompt) and the request ends */
    dt_sampling sampling;
    uint64_t seed;
    /* Called from dt_batcher_step with each new token (logits: the model's
     * distribution it was drawn from, [V], before the repetition penalty);
     * nonzero ends the request (DT_FINISH_STOP). */
    int (*on_token)(void *ctx, int32_t token, const float *logits);
    /* Called once when it ends (then the request's slot is free). */
    void (*on_end)(void *ctx, dt_finish why, int generated);
    void *ctx;
    /* NULL, or called with the logits after each prompt token pos (those that predict token pos + 1), pos from 0 to
     * nprompt - 2 in order, as the prompt is read (a prompt's scores: every prompt row then asks for logits). */
    void (*on_prompt)(void *ctx, int pos, const float *logits);
    /* NULL, or set by dt_batcher_add to the prompt's tokens whose keys and values another sequence's cache gives
     * (prefix reuse: none where on_prompt scores every row) */
    int *cached;
    /* prefix reuse only between requests of the same salt (vLLM's cache_salt: what one tenant's prompts left in the
     * cache is not another's to time; 0: none) */
    uint64_t salt;
} dt_infer_request;

typedef struct {
    long steps, rows, prefill_rows, decode_rows, finished;
    long reused_rows; /* prompt tokens not read: their keys and values copied or kept (prefix reuse) */
    int running; /* requests in the batch now */
} dt_batcher_stats;

typedef struct dt_batcher dt_batcher;
/* A batcher over d's slots: at most token_budget rows a step (from the
 * slots, so that every decoding request advances each step, to the decoder's max_rows); decode rows first (one per running request), the
 * rest of the budget to prompts in the order they came. */
dt_status dt_batcher_create(dt_decoder *d, int token_budget, dt_batcher **out);
void dt_batcher_destroy(dt_batcher *b);
/* Adds a request to the batch (it joins at the next step). DT_ERR_ARG: an
 * empty prompt, a bad token or sampling, or a prompt longer than the context; DT_ERR_UNSUPPORTED: no free slot (see free_slots). */
dt_status dt_batcher_add(dt_batcher *b, const dt_infer_request *r);
int dt_batcher_free_slots(const dt_batcher *b);
/* Prefix reuse (on where the decoder copies slots, unless DTRAIN_PREFIX_REUSE=off): a prompt's start that a slot
 * holds, ended or running (n choices of one prompt; a chat's next turn), is copied or kept instead of read, the same
 * bits; free slots keep what they hold, the least recently used taken first. */
void dt_batcher_set_prefix_reuse(dt_batcher *b, bool on);
/* One iteration: every running request advances by one token or one chunk
 * of its prompt; callbacks run from here. Nothing to do: returns at once. */
dt_status dt_batcher_step(dt_batcher *b);
dt_batcher_stats dt_batcher_get_stats(const dt_batcher *b);

#ifdef __cplusplus
}
#endif
#endif
