/* GRPO in a training run (--grpo PROMPTS): each rollout, every data-parallel rank takes its share of the next prompts,
 * decodes --grpo-group completions of each with the decoder made from the trainer's weights as they are now (packed in
 * memory after the last update: no file, no reload), scores them by --reward, records the reference's log-probabilities
 * (a copy of the starting model, forward only) and hands the rows to the engine's micro-batches, whose loss is the
 * program's token loss (train/grpo.c). Everything a rank draws comes from (--seed, the prompt's place in the stream,
 * the completion's place in its group) and the decoder's rows are batch-invariant, so the same global batch on any
 * number of ranks rolls out the same completions. Data parallelism only: the decoder runs a whole model on each rank. */
#include "run.h"
#include "run_checks.h"
#include "grpo_prompts.h"
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { S_ROWS, S_REWARD, S_REWARD_SQ, S_TOKENS, S_FLAT_GROUPS, S_DECODE_S, S_KL, S_CLIPPED, S_LOSS_TOKENS, S_N };

typedef struct {
    int32_t *toks;
    int n, eos;
    int prompt;             /* which of the file's prompts it completes */
} completion;

struct dt_grpo_run {
    dt_grpo *g;
    dt_reward *reward;
    dt_gpt2 *ref;           /* the reference (beta > 0): the starting model */
    dt_bpe *tok;            /* NULL: bytes */
    dt_chat_kind chat;      /* conversational prompts' template (--chat-template, or the tokenizer_config.json's) */
    int eos;                /* the end-of-text id that ends a completion (-1: none) */
    dt_grpo_prompts prompts;
    int rows, per_rank, T;  /* this rank's rows a step, prompts a step, positions a row */
    int32_t *in, *tg;       /* [rows * T] */
    completion *done;       /* [rows] */
    float *rewards, *adv;
    int next;               /* the next micro-batch's first row */
    int *perm;              /* --shuffle: the prompts' order in pass perm_pass */
    int64_t perm_pass;
    int step;               /* steps done */
    double stats[S_N];      /* this rollout's (and the step's loss's) figures */
    char *sample;           /* rank 0: the first prompt's first completion, as text */
};


/* --chat-template-kwargs read into *kw (*json, the caller's to delete, holds its date's text). */
static dt_status chat_kwargs(const dt_train_config *c, cJSON **json, dt_chat_kwargs *kw) {
    const char *text = c->grpo.chat_kwargs;
    *json = text ? cJSON_Parse(text) : NULL;
    if (text && !*json) return dt_error(DT_ERR_ARG, "--chat-template-kwargs %s: not JSON", text);
    dt_status st = dt_chat_kwargs_read(*json, kw);
    return st ? dt_error(st, "--chat-template-kwargs %s: %s", text, dt_last_error()) : DT_OK;
}

dt_status dt_train_check_grpo(const dt_train_config *c) {
    const char *why = c->data ? "--data (GRPO's rows are its own completions of the --grpo prompts)"
                    : c->val_data ? "--val-data"
                    : c->tp > 1 || c->pp > 1 || c->cp > 1 ? "tensor, pipeline or context parallelism (the decoder rolls out on each data-parallel rank's whole model)"
                    : c->strategy && !strcmp(c->strategy, "zero3") ? "zero3 (its ranks hold a shard of the weights; the decoder needs them whole)"
                    : c->lora.rank || c->lora_from ? "LoRA (the decoder reads merged weights; not yet)"
                    : c->ep > 1 ? "expert parallelism"
                    : c->resume ? "--resume (the reference is the model the run started from)"
                    : c->pack ? "--pack"
                    : c->steps == 0 ? "--steps 0 (evaluation)" : NULL;
    if (why) return dt_error(DT_ERR_UNSUPPORTED, "--grpo %s: not with %s", c->grpo.prompts, why);
    if (!c->grpo.reward || !*c->grpo.reward)
        return dt_error(DT_ERR_ARG, "--grpo %s: --reward SPEC is required (contains:WORD, count:WORD or cmd:COMMAND)", c->grpo.prompts);
    dt_reward *probe = NULL;
    dt_status st = dt_reward_create(c->grpo.reward, &probe); /* the spec's form, said before any work */
    dt_reward_destroy(probe);
    cJSON *kwj = NULL;
    if (!st) st = chat_kwargs(c, &kwj, &(dt_chat_kwargs){ 0 });
    cJSON_Delete(kwj);
    if (st) return st;
    int rows = c->batch * c->grad_accum;
    if (rows % c->grpo.group)
        return dt_error(DT_ERR_ARG, "--grpo-group %d: each rank's rows a step (--batch %d x --grad-accum %d = %d) must be whole groups",
                        c->grpo.group, c->batch, c->grad_accum, rows);
    return DT_OK;
}

/* The reference: a copy of the model as it starts, whose forwards record the rows' log-probabilities. */
static dt_status make_reference(run *r, dt_grpo_run *gr) {
    dt_gpt2_config cfg = *dt_gpt2_get_config(r->m);
    dt_model_part whole = dt_gpt2_whole(&cfg);
    dt_status st = dt_gpt2_create_part(&cfg, &whole, &gr->ref);
    if (!st) st = dt_gpt2_copy_slices(r->m, gr->ref);
    if (!st) st = dt_gpt2_set_precision(gr->ref, r->c.precision); /* the policy's arithmetic: the KL starts at 0 in 16 bits too */
    if (!st) st = dt_program_set_token_loss(dt_gpt2_program(gr->ref), dt_grpo_token_loss, gr->g);
    return st ? dt_error(st, "GRPO's reference: %s", dt_last_error()) : DT_OK;
}

static dt_status open_tokenizer(run *r, dt_grpo_run *gr) {
    const dt_train_config *c = &r->c;
    gr->eos = -1, gr->chat = DT_CHAT_NONE;
    dt_status st = c->chat_template ? dt_chat_kind_parse(c->chat_template, &gr->chat) : DT_OK;
    if (!st) st = dt_bpe_for_model(c->tokenizer, NULL, dt_gpt2_get_config(r->m)->vocab_size, c->model, "--grpo", false, &gr->tok);
    if (st || !gr->tok) return st;
    char found[4200];
    snprintf(found, sizeof found, "%s/tokenizer.json", c->model);
    const char *tj = c->tokenizer ? c->tokenizer : found;
    /* no end-of-text: completions run to their length; a template this build cannot render: plain prompts need none, a
     * conversational one is refused naming it */
    st = dt_tokenizer_config_read(tj, gr->tok, &gr->chat, &gr->eos, NULL);
    if (st == DT_ERR_UNSUPPORTED) {
        if (r->rank == 0) dt_log(DT_LOG_WARN, "--grpo: %s", dt_last_error());
        st = DT_OK, gr->chat = DT_CHAT_NONE;
    }
    return st;
}

static dt_status alloc_rows(dt_grpo_run *gr) {
    size_t n = (size_t)gr->rows * (size_t)gr->T;
    gr->in = malloc(n * sizeof(int32_t)), gr->tg = malloc(n * sizeof(int32_t));
    gr->done = calloc((size_t)gr->rows, sizeof *gr->done);
    gr->rewards = malloc((size_t)gr->rows * sizeof(float)), gr->adv = malloc((size_t)gr->rows * sizeof(float));
    gr->perm = malloc((size_t)gr->prompts.n * sizeof(int)), gr->perm_pass = -1;
    bool ok = gr->in && gr->tg && gr->done && gr->rewards && gr->adv && gr->perm;
    for (int i = 0; ok && i < gr->rows; i++) ok = (gr->done[i].toks = malloc((size_t)(gr->T + 1) * sizeof(int32_t))) != NULL;
    return ok ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory for %d rows of %d", gr->rows, gr->T);
}

dt_status dt_train_setup_grpo(run *r) {
    dt_train_config *c = &r->c;
    dt_status st = DT_OK;
    dt_grpo_run *gr = r->grpo = calloc(1, sizeof *gr);
    if (!gr) return dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    gr->rows = c->batch * c->grad_accum, gr->T = c->seq, gr->per_rank = gr->rows / c->grpo.group;
    if (!c->grpo.completion) c->grpo.completion = c->seq; /* dr_grpo's constant: the longest completion a row may hold */
    cJSON *kwj = NULL;
    dt_chat_kwargs kw;
    if (!(st = open_tokenizer(r, gr)) && !(st = chat_kwargs(c, &kwj, &kw)))
        st = dt_grpo_prompts_read(&gr->prompts, c->grpo.prompts, gr->tok, gr->chat, &kw, gr->T);
    cJSON_Delete(kwj);
    if (!st && !(st = dt_reward_create(c->grpo.reward, &gr->reward)) && !(st = dt_grpo_create(&c->grpo, gr->rows, gr->T, &gr->g)) &&
        !(st = alloc_rows(gr)))
        st = dt_program_set_token_loss(dt_gpt2_program(r->m), dt_grpo_token_loss, gr->g);
    if (!st && c->grpo.beta > 0) st = make_reference(r, gr);
    if (!st && r->rank == 0 && !c->quiet)
        printf("GRPO: %d prompts from %s, %d completions each (of at most %d tokens, temperature %g%s), %d prompts a step over %d "
               "rank%s, --reward %s; TRL's %s loss, beta %g (the reference: %s), epsilon %g, %d iteration%s a rollout\n",
               gr->prompts.n, c->grpo.prompts, c->grpo.group, c->grpo.completion, c->grpo.temperature,
               c->grpo.top_k ? ", top-k" : "", gr->per_rank * r->dp_size, r->dp_size, r->dp_size == 1 ? "" : "s", c->grpo.reward,
               dt_grpo_loss_name(c->grpo.loss), c->grpo.beta, c->grpo.beta > 0 ? "the starting model" : "none", c->grpo.epsilon,
               c->grpo.iterations, c->grpo.iterations == 1 ? "" : "s");
    return st;
}

void dt_train_grpo_destroy(run *r) {
    dt_grpo_run *gr = r->grpo;
    if (!gr) return;
    dt_grpo_prompts_free(&gr->prompts);
    for (int i = 0; gr->done && i < gr->rows; i++) free(gr->done[i].toks);
    free(gr->in), free(gr->tg), free(gr->done), free(gr->rewards), free(gr->adv), free(gr->sample), free(gr->perm);
    dt_grpo_destroy(gr->g);
    dt_reward_destroy(gr->reward);
    dt_gpt2_destroy(gr->ref);
    dt_bpe_destroy(gr->tok);
    free(gr);
    r->grpo = NULL;
}

static int on_token(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    completion *c = ctx;
    c->toks[c->n++] = token;
    return token == c->eos; /* the end-of-text token ends it, kept (TRL's completion mask holds it) */
}

/* Row i's prompt in rollout gen: the stream of prompts runs through the file (in a fresh order each pass with
 * --shuffle), each rollout taking the next prompts of every rank in rank order; *place: the prompt's place in it. */
static int prompt_of(const run *r, dt_grpo_run *gr, int gen, int i, uint64_t *place) {
    uint64_t q = ((uint64_t)gen * (uint64_t)r->dp_size + (uint64_t)r->dp_rank) * (uint64_t)gr->per_rank + (uint64_t)(i / r->c.grpo.group);
    int64_t pass = (int64_t)(q / (uint64_t)gr->prompts.n);
    *place = q;
    if (!r->c.shuffle_seed) return (int)(q % (uint64_t)gr->prompts.n);
    if (pass != gr->perm_pass) {
        uint32_t w[3] = { (uint32_t)r->c.shuffle_seed, (uint32_t)(r->c.shuffle_seed >> 32), (uint32_t)pass };
        dt_rng_shuffle(gr->perm, gr->prompts.n, dt_hash_words(DT_HASH_INIT, w, 3));
        gr->perm_pass = pass;
    }
    return gr->perm[q % (uint64_t)gr->prompts.n];
}

/* Every row's completion, all rows in one continuously batched decoder over the weights as they are now. */
static dt_status decode(run *r, dt_grpo_run *gr, int gen) {
    const dt_grpo_config *gc = &r->c.grpo;
    int budget = gr->rows > 256 ? gr->rows : 256;
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    double t0 = dt_time_now();
    dt_status st = dt_decoder_create(r->m, DT_QUANT_NONE, gr->rows, budget, gr->T + 1, &d); /* (a row's positions: prompt and completion) */
    if (!st) st = dt_batcher_create(d, budget, &b);
    for (int i = 0; !st && i < gr->rows; i++) {
        uint64_t q;
        int p = prompt_of(r, gr, gen, i, &q), room = gr->T + 1 - gr->prompts.len[p];
        uint32_t w[5] = { (uint32_t)r->c.seed, (uint32_t)(r->c.seed >> 32), (uint32_t)q, (uint32_t)(q >> 32), (uint32_t)(i % gc->group) };
        completion *c = &gr->done[i];
        c->n = 0, c->eos = gr->eos, c->prompt = p;
        dt_infer_request req = { gr->prompts.toks[p], gr->prompts.len[p], gc->completion < room ? gc->completion : room,
                                 { gc->temperature, gc->top_k, 1.0f }, dt_hash_words(DT_HASH_INIT, w, 5), on_token, NULL, c };
        st = dt_batcher_add(b, &req);
    }
    while (!st && dt_batcher_get_stats(b).finished < gr->rows) st = dt_batcher_step(b);
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
    gr->stats[S_DECODE_S] = dt_time_now() - t0;
    return st ? dt_error(st, "GRPO's rollout: %s", dt_last_error()) : DT_OK;
}

/* A completion's text (the end-of-text token left out, as TRL decodes with skip_special_tokens). */
static char *completion_text(const dt_grpo_run *gr, const completion *c, size_t *len) {
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    for (int t = 0; s && t < c->n; t++) {
        if (c->toks[t] == gr->eos) continue;
        size_t k;
        char scratch[16];
        const char *b = dt_token_text(gr->tok, c->toks[t], scratch, &k);
        if (n + k + 1 > cap) {
            char *g = realloc(s, cap = 2 * (n + k + 1));
            if (!g) { free(s); return NULL; }
            s = g;
        }
        memcpy(s + n, b, k), n += k;
    }
    if (s) s[n] = 0;
    *len = n;
    return s;
}

/* The rows' rewards (--reward) and advantages; rank 0 keeps its first completion's text to show. */
static dt_status score(run *r, dt_grpo_run *gr) {
    const char **prompts = malloc(sizeof(char *) * (size_t)gr->rows), **messages = malloc(sizeof(char *) * (size_t)gr->rows);
    char **texts = calloc((size_t)gr->rows, sizeof(char *));
    size_t *lens = malloc(sizeof(size_t) * (size_t)gr->rows);
    dt_status st = prompts && messages && texts && lens ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    for (int i = 0; !st && i < gr->rows; i++) {
        int p = gr->done[i].prompt;
        prompts[i] = gr->prompts.text[p], messages[i] = gr->prompts.messages[p];
        dt_grpo_row(gr->prompts.toks[p], gr->prompts.len[p], gr->done[i].toks, gr->done[i].n, gr->T, gr->in + (size_t)i * gr->T, gr->tg + (size_t)i * gr->T);
        if (!(texts[i] = completion_text(gr, &gr->done[i], &lens[i]))) st = dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    }
    if (!st) st = dt_reward_score(gr->reward, gr->rows, prompts, (const char *const *)messages, (const char *const *)texts, lens, gr->rewards);
    if (!st) dt_grpo_advantages(gr->rewards, gr->rows, r->c.grpo.group, gr->adv);
    if (!st && r->rank == 0) {
        free(gr->sample);
        gr->sample = dt_utf8_clean(texts[0], lens[0], NULL);
    }
    for (int i = 0; texts && i < gr->rows; i++) free(texts[i]);
    free(prompts), free(messages), free(texts), free(lens);
    return st;
}

/* The rollout's statistics, and dapo's weight: one over the global batch's completion tokens, times the passes the
 * engine (accumulation) and data parallelism (the ranks) average over. */
static dt_status count(run *r, dt_grpo_run *gr, double *token_scale) {
    int G = r->c.grpo.group;
    double *s = gr->stats;
    s[S_ROWS] = gr->rows, s[S_REWARD] = s[S_REWARD_SQ] = s[S_TOKENS] = s[S_FLAT_GROUPS] = 0;
    for (int i = 0; i < gr->rows; i++) s[S_REWARD] += gr->rewards[i], s[S_REWARD_SQ] += gr->rewards[i] * (double)gr->rewards[i], s[S_TOKENS] += gr->done[i].n;
    for (int g0 = 0; g0 < gr->rows; g0 += G) {
        bool flat = true;
        for (int k = 1; k < G; k++) flat = flat && gr->rewards[g0 + k] == gr->rewards[g0];
        s[S_FLAT_GROUPS] += flat;
    }
    float tokens = (float)s[S_TOKENS];
    dt_status st = r->nranks > 1 ? dt_comm_allreduce(r->w, &tokens, &tokens, 1, DT_F32, DT_SUM) : DT_OK;
    *token_scale = tokens > 0 ? (double)r->c.grad_accum * r->dp_size / tokens : 0;
    return st;
}

/* Before step `step`: a new rollout when the last one has trained its iterations; the forwards sent to row 0. */
dt_status dt_train_grpo_prepare(run *r, int step) {
    dt_grpo_run *gr = r->grpo;
    int it = step % r->c.grpo.iterations, gen = step / r->c.grpo.iterations;
    double scale = 0;
    dt_status st = DT_OK;
    gr->next = 0;
    double t0 = dt_time_now();
    DT_TRACE_BEGIN(DT_TRACK_DATA, "rollout", "\"rows\":%d", it == 0 ? gr->rows : 0);
    if (it == 0) {
        if (!(st = decode(r, gr, gen)) && !(st = score(r, gr)) && !(st = count(r, gr, &scale))) dt_grpo_begin(gr->g, gr->adv, scale);
        dt_grpo_restart(gr->g, DT_GRPO_RECORD_REF);
        int B = r->c.batch;
        float ignored;
        for (int k = 0; !st && gr->ref && k < r->c.grad_accum; k++)
            st = dt_gpt2_forward(gr->ref, gr->in + (size_t)k * B * gr->T, gr->tg + (size_t)k * B * gr->T, B, gr->T, &ignored);
    }
    DT_TRACE_END(DT_TRACK_DATA);
    r->data += dt_time_now() - t0; /* the step's batch is its rollout: the report's data phase */
    if (st) return dt_error(st, "GRPO's rollout %d: %s", gen + 1, dt_last_error());
    double drop[DT_GRPO_NSTATS];
    dt_grpo_stats(gr->g, drop, true);
    dt_grpo_restart(gr->g, it == 0 ? DT_GRPO_RECORD_OLD : DT_GRPO_TRAIN);
    return DT_OK;
}

void dt_train_grpo_batch(run *r) {
    dt_grpo_run *gr = r->grpo;
    size_t n = (size_t)r->c.batch * (size_t)gr->T, at = (size_t)gr->next * (size_t)gr->T;
    if (gr->next + r->c.batch > gr->rows) at = 0; /* more micro-batches than the rollout has rows: cannot be, the loss says NAN */
    memcpy(r->in, gr->in + at, n * sizeof(int32_t));
    memcpy(r->tg, gr->tg + at, n * sizeof(int32_t));
    gr->next += r->c.batch;
}

/* After the step: the rollout's and the loss's statistics over every rank (collective) into out. */
dt_status dt_train_grpo_stats(run *r, dt_grpo_step_stats *out) {
    dt_grpo_run *gr = r->grpo;
    double loss_stats[DT_GRPO_NSTATS];
    dt_grpo_stats(gr->g, loss_stats, true);
    gr->stats[S_KL] = loss_stats[DT_GRPO_KL], gr->stats[S_CLIPPED] = loss_stats[DT_GRPO_CLIPPED];
    gr->stats[S_LOSS_TOKENS] = loss_stats[DT_GRPO_TOKENS]; /* the tokens the loss saw (= the rollout's) */
    float v[S_N];
    for (int i = 0; i < S_N; i++) v[i] = (float)gr->stats[i];
    dt_status st = r->nranks > 1 ? dt_comm_allreduce(r->w, v, v, S_N, DT_F32, DT_SUM) : DT_OK;
    if (st) return st;
    double n = v[S_ROWS], mean = v[S_REWARD] / n, lt = v[S_LOSS_TOKENS];
    *out = (dt_grpo_step_stats){
        .reward = mean, .reward_std = sqrt(fmax(0, v[S_REWARD_SQ] / n - mean * mean)), .kl = lt > 0 ? v[S_KL] / lt : 0,
        .completion = lt / n, .clipped = lt > 0 ? v[S_CLIPPED] / lt : 0,
        .flat = v[S_FLAT_GROUPS] / (n / r->c.grpo.group), .decode_s = v[S_DECODE_S] / r->nranks,
        .rollout_tps = v[S_DECODE_S] > 0 ? v[S_TOKENS] / (v[S_DECODE_S] / r->nranks) : 0, .sample = gr->sample,
    };
    gr->stats[S_DECODE_S] = 0;
    /* the text before and after: rank 0's first completion of the first and the last rollouts */
    const dt_train_config *c = &r->c;
    int step = gr->step++;
    if (r->rank == 0 && !c->quiet && gr->sample && (step == 0 || step + 1 == c->steps) && step % c->grpo.iterations == 0)
        printf("  step %d, prompt %s: completion \"%s\"\n", step + 1, gr->prompts.text[gr->done[0].prompt], gr->sample);
    return DT_OK;
}
