/* Continuous batching (Orca's iteration-level scheduling): each step is one
 * pass of the decoder over a row for every request that is decoding and,
 * with the rest of the token budget, chunks of the prompts that are still
 * being read, oldest first. Requests join at any step and leave as they
 * end, their slot free for the next. A request's rows go through the same
 * per-row arithmetic whatever shares the step, so its tokens are too.
 *
 * Prefix reuse (vLLM's automatic prefix caching, by whole slots): a slot keeps what its cache holds after its request
 * ends, and a new prompt reads only what no slot holds of it. It takes the free slot holding the longest start of it
 * (a chat's next turn, its own last one; else the least recently used), and copies a longer start from another slot
 * (n choices of one prompt, a GRPO group; a slot still reading that prompt is waited for). The cached keys and values
 * are the bits its own rows would write, so nothing drawn changes. */
#include "dtrain/infer.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    bool busy;
    dt_infer_request r;
    int32_t *seq;  /* [context + 1]: the prompt, then the tokens drawn; the cache holds positions 0..cached-1 of it */
    int cached;    /* (kept when the request ends: a later prompt may start with it) */
    int fed;       /* prompt tokens in the cache */
    int generated; /* tokens drawn so far */
    int32_t last;  /* the last token drawn (the next decode row's input) */
    int from, share; /* share > 0: waiting for slot from to hold that many positions of this prompt, to copy them */
    uint64_t *seen; /* with a repetition penalty: the tokens the sequence holds (dt_token_set_add) */
    int32_t *counts; /* with a presence or frequency penalty: the times each token was drawn */
    long order;    /* when it joined: prompts are read oldest first, and the least recently used free slot taken */
    uint64_t rng;
} slot;

struct dt_batcher {
    dt_decoder *d;
    int budget, nslots;
    bool reuse;
    slot *slots;
    dt_infer_row *rows;
    int *row_slot; /* the slot of each row that wants logits, in row order */
    int *row_pos;  /* and its position where it is a prompt's row that only scores (on_prompt), else -1 */
    float *logits;
    float *drawn;  /* a row's logits as penalized for the draw (on_token gets the model's own) */
    void *scratch;
    long joined;
    dt_batcher_stats stats;
};

dt_status dt_batcher_create(dt_decoder *d, int token_budget, dt_batcher **out) {
    *out = NULL;
    /* at least a row per slot: every decoding request advances at every step */
    if (token_budget < dt_decoder_slots(d) || token_budget > dt_decoder_max_rows(d))
        return dt_error(DT_ERR_ARG, "batcher: a token budget of %d (from the %d slots to the decoder's %d rows)", token_budget,
                        dt_decoder_slots(d), dt_decoder_max_rows(d));
    dt_batcher *b = calloc(1, sizeof *b);
    int n = dt_decoder_slots(d), V = dt_decoder_config(d)->vocab_size, T = dt_decoder_config(d)->max_seq_len;
    bool ok = b != NULL;
    if (b) {
        b->d = d;
        b->budget = token_budget;
        b->nslots = n;
        /* DTRAIN_PREFIX_REUSE=off: every prompt read whole (a debugging switch: the checks compare the two) */
        const char *env = getenv("DTRAIN_PREFIX_REUSE");
        b->reuse = dt_decoder_copies(d) && !(env && !strcmp(env, "off"));
        b->slots = calloc((size_t)n, sizeof(slot));
        b->rows = malloc(sizeof(dt_infer_row) * (size_t)token_budget);
        b->row_slot = malloc(sizeof(int) * (size_t)token_budget);
        b->row_pos = malloc(sizeof(int) * (size_t)token_budget);
        b->logits = malloc(sizeof(float) * (size_t)token_budget * (size_t)V);
        b->drawn = malloc(sizeof(float) * (size_t)V);
        b->scratch = malloc(dt_sample_scratch_bytes(V));
        ok = b->slots && b->rows && b->row_slot && b->row_pos && b->logits && b->drawn && b->scratch;
        for (int k = 0; ok && k < n; k++) ok = (b->slots[k].seq = malloc(sizeof(int32_t) * ((size_t)T + 1))) != NULL;
    }
    if (!ok) {
        dt_batcher_destroy(b);
        return dt_error(DT_ERR_NOMEM, "batcher: out of memory for %d rows of %d logits", token_budget, V);
    }
    *out = b;
    return DT_OK;
}

void dt_batcher_destroy(dt_batcher *b) {
    if (!b) return;
    for (int i = 0; b->slots && i < b->nslots; i++) free(b->slots[i].seq), free(b->slots[i].seen), free(b->slots[i].counts);
    free(b->slots);
    free(b->rows);
    free(b->row_slot);
    free(b->row_pos);
    free(b->logits);
    free(b->drawn);
    free(b->scratch);
    free(b);
}

void dt_batcher_set_prefix_reuse(dt_batcher *b, bool on) { b->reuse = on && dt_decoder_copies(b->d); }

int dt_batcher_free_slots(const dt_batcher *b) {
    int n = 0;
    for (int i = 0; i < b->nslots; i++) n += !b->slots[i].busy;
    return n;
}

dt_batcher_stats dt_batcher_get_stats(const dt_batcher *b) { return b->stats; }

static dt_status check_request(const dt_batcher *b, const dt_infer_request *r) {
    const dt_gpt2_config *c = dt_decoder_config(b->d);
    if (r->nprompt < 1) return dt_error(DT_ERR_ARG, "the prompt is empty");
    if (r->nprompt > c->max_seq_len)
        return dt_error(DT_ERR_ARG, "the prompt has %d tokens; the context holds %d", r->nprompt, c->max_seq_len);
    if (r->max_tokens < 0) return dt_error(DT_ERR_ARG, "max_tokens %d: expected >= 0", r->max_tokens);
    for (int i = 0; i < r->nprompt; i++)
        if (r->prompt[i] < 0 || r->prompt[i] >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "prompt token %d is %d, outside the vocabulary of %d", i, (int)r->prompt[i], c->vocab_size);
    dt_status st = dt_sampling_check(&r->sampling);
    if (st) return st;
    for (int i = 0; i < r->sampling.nlogit_bias; i++)
        if (r->sampling.logit_bias[i].token < 0 || r->sampling.logit_bias[i].token >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "logit_bias names token %d, outside the vocabulary of %d", (int)r->sampling.logit_bias[i].token, c->vocab_size);
    for (int i = 0; i < r->sampling.nsuppress; i++)
        if (r->sampling.suppress[i] < 0 || r->sampling.suppress[i] >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "min_tokens suppresses token %d, outside the vocabulary of %d", (int)r->sampling.suppress[i], c->vocab_size);
    return DT_OK;
}

/* How many of the first n - 1 tokens of p (the last is read for its logits) slot s holds, or will once it has read
 * its prompt (a running request's prompt and fed draws, what an ended one left), where its request had p's salt. */
static int usable(const slot *s, const int32_t *p, int n, uint64_t salt) {
    if (s->r.salt != salt) return 0;
    int held = s->busy ? s->r.nprompt + (s->generated > 0 ? s->generated - 1 : 0) : s->cached, i = 0;
    if (held > n - 1) held = n - 1;
    while (i < held && s->seq[i] == p[i]) i++;
    return i;
}

/* Slot k, waiting to copy from a slot that holds what it waits for, copies it. */
static dt_status settle(dt_batcher *b, int k) {
    slot *s = &b->slots[k];
    if (!s->share || b->slots[s->from].cached < s->share) return DT_OK;
    dt_status st = dt_decoder_copy(b->d, s->from, k, s->share);
    if (st) return st;
    s->fed = s->cached = s->share;
    s->share = 0;
    return DT_OK;
}

/* The free slot a prompt of n tokens takes (the one holding the longest start of it, the least recently used among
 * equals) and how much of it that slot holds (*own); the other slot holding more of it (-1: none) and how much (*more). */
static int choose(const dt_batcher *b, const int32_t *p, int n, uint64_t salt, bool reuse, int *own, int *from, int *more) {
    int k = -1;
    *own = 0, *from = -1;
    for (int j = 0; j < b->nslots; j++) {
        const slot *s = &b->slots[j];
        int l = reuse ? usable(s, p, n, salt) : 0;
        if (!s->busy && (k < 0 || l > *own || (l == *own && s->order < b->slots[k].order))) k = j, *own = l;
    }
    *more = *own;
    for (int j = 0; reuse && k >= 0 && j < b->nslots; j++) {
        int l = j == k ? 0 : usable(&b->slots[j], p, n, salt);
        if (l > *more) *from = j, *more = l;
    }
    return k;
}

dt_status dt_batcher_add(dt_batcher *b, const dt_infer_request *r) {
    const dt_gpt2_config *c = dt_decoder_config(b->d);
    dt_status st = check_request(b, r);
    if (st) return st;
    /* a prompt whose every row is scored reads them all */
    int own, from, more, k = choose(b, r->prompt, r->nprompt, r->salt, b->reuse && !r->on_prompt, &own, &from, &more);
    if (k < 0) return dt_error(DT_ERR_UNSUPPORTED, "all %d slots are busy", b->nslots);
    float pen = r->sampling.repetition_penalty;
    bool counted = r->sampling.presence_penalty != 0 || r->sampling.frequency_penalty != 0;
    uint64_t *seen = pen != 0 && pen != 1 ? calloc(dt_token_set_words(c->vocab_size), sizeof(uint64_t)) : NULL;
    int32_t *counts = counted ? calloc((size_t)c->vocab_size, sizeof(int32_t)) : NULL;
    if ((pen != 0 && pen != 1 && !seen) || (counted && !counts)) {
        free(seen), free(counts);
        return dt_error(DT_ERR_NOMEM, "out of memory for a prompt of %d tokens", r->nprompt);
    }
    /* those waiting to copy from slot k do it now, before it changes (it ended: it holds what they wait for) */
    for (int j = 0; j < b->nslots; j++)
        if (b->slots[j].busy && b->slots[j].share && b->slots[j].from == k && (st = settle(b, j))) break;
    slot *s = &b->slots[k];
    if (st) { free(seen), free(counts); return st; }
    for (int i = 0; seen && i < r->nprompt; i++) dt_token_set_add(seen, r->prompt[i]);
    memcpy(s->seq, r->prompt, sizeof(int32_t) * (size_t)r->nprompt);
    free(s->seen), free(s->counts);
    *s = (slot){ .busy = true, .r = *r, .seq = s->seq, .cached = own, .fed = own, .from = from, .share = from >= 0 ? more : 0,
                 .seen = seen, .counts = counts, .order = ++b->joined, .rng = r->seed };
    s->r.prompt = s->seq;
    if (r->cached) *r->cached = more;
    b->stats.reused_rows += more;
    b->stats.running++;
    st = settle(b, k); /* (at once where the other slot holds it already) */
    if (st) s->busy = false, s->cached = 0, b->stats.running--, b->stats.reused_rows -= more; /* (nothing of it runs) */
    return st;
}

/* The rows of a step: decode rows first, then prompt chunks oldest first, within the budget. */
static int plan_rows(dt_batcher *b, int *nlogits) {
    int n = 0, m = 0;
    for (int k = 0; k < b->nslots && n < b->budget; k++) {
        slot *s = &b->slots[k];
        if (!s->busy || s->fed < s->r.nprompt) continue;
        b->rows[n++] = (dt_infer_row){ k, s->r.nprompt + s->generated - 1, s->last, 1 };
        s->cached = s->r.nprompt + s->generated;
        b->row_pos[m] = -1, b->row_slot[m++] = k;
        b->stats.decode_rows++;
    }
    while (n < b->budget) {
        int k = -1;
        for (int j = 0; j < b->nslots; j++) {
            slot *s = &b->slots[j];
            if (s->busy && !s->share && s->fed < s->r.nprompt && (k < 0 || s->order < b->slots[k].order)) k = j;
        }
        if (k < 0) break;
        slot *s = &b->slots[k];
        for (; s->fed < s->r.nprompt && n < b->budget; s->fed++) {
            int end = s->fed == s->r.nprompt - 1, scores = !end && s->r.on_prompt;
            b->rows[n++] = (dt_infer_row){ k, s->fed, s->seq[s->fed], end || scores };
            s->cached = s->fed + 1;
            if (end || scores) b->row_pos[m] = scores ? s->fed : -1, b->row_slot[m++] = k;
            b->stats.prefill_rows++;
        }
    }
    *nlogits = m;
    return n;
}

static void end(dt_batcher *b, slot *s, dt_finish why) {
    s->busy = false;
    b->stats.running--;
    b->stats.finished++;
    if (s->r.on_end) s->r.on_end(s->r.ctx, why, s->generated);
}

/* The logits a slot's token is drawn from: l itself, or a copy with the biases and penalties applied (l stays the
 * model's). */
static const float *penalized(dt_batcher *b, const slot *s, const float *l) {
    const dt_sampling *o = &s->r.sampling;
    if (!s->seen && !s->counts && !o->nlogit_bias && s->generated >= o->min_tokens) return l;
    int V = dt_decoder_config(b->d)->vocab_size;
    memcpy(b->drawn, l, sizeof(float) * (size_t)V);
    dt_sample_bias(b->drawn, V, o);
    dt_sample_suppress(b->drawn, V, o, s->generated);
    dt_sample_penalize(b->drawn, V, o->repetition_penalty, s->seen);
    dt_sample_penalize_counts(b->drawn, V, o->presence_penalty, o->frequency_penalty, s->counts);
    return b->drawn;
}

dt_status dt_batcher_step(dt_batcher *b) {
    dt_status st = DT_OK;
    for (int k = 0; k < b->nslots && !st; k++)
        if (b->slots[k].busy) st = settle(b, k);
    int m, n = st ? 0 : plan_rows(b, &m);
    if (!n) return st;
    st = dt_decoder_step(b->d, b->rows, n, b->logits);
    if (st) { /* what the caches hold is unknown: none is reused */
        for (int k = 0; k < b->nslots; k++) b->slots[k].cached = 0;
        return st;
    }
    b->stats.steps++;
    b->stats.rows += n;
    const dt_gpt2_config *c = dt_decoder_config(b->d);
    for (int i = 0; i < m; i++) {
        slot *s = &b->slots[b->row_slot[i]];
        float *l = b->logits + (size_t)i * c->vocab_size;
        if (b->row_pos[i] >= 0) { s->r.on_prompt(s->r.ctx, b->row_pos[i], l); continue; }
        if (s->r.max_tokens == 0) { end(b, s, DT_FINISH_LENGTH); continue; } /* (a prompt scored, nothing drawn) */
        s->last = dt_sample_token(penalized(b, s, l), c->vocab_size, &s->r.sampling, &s->rng, b->scratch);
        s->seq[s->r.nprompt + s->generated] = s->last;
        if (s->seen) dt_token_set_add(s->seen, s->last);
        if (s->counts) s->counts[s->last]++;
        s->generated++;
        int stop = s->r.on_token ? s->r.on_token(s->r.ctx, s->last, l) : 0;
        if (stop) end(b, s, DT_FINISH_STOP);
        else if (s->generated >= s->r.max_tokens) end(b, s, DT_FINISH_LENGTH);
        /* the next token would need a position past the context */
        else if (s->r.nprompt + s->generated > c->max_seq_len) end(b, s, DT_FINISH_CONTEXT);
    }
    return DT_OK;
}
