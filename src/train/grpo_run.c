/* GRPO in a training run (--grpo PROMPTS): each rollout, every data-parallel rank takes its share of the next prompts,
 * decodes --grpo-group completions of each with the decoder made from the trainer's weights as they are now (packed in
 * memory after the last update: no file, no reload), scores them by --reward, records the reference's log-probabilities
 * (a copy of the starting model, forward only) and hands the rows to the engine's micro-batches, whose loss is the
 * program's token loss (train/grpo.c). Everything a rank draws comes from (--seed, the prompt's place in the stream,
 * the completion's place in its group) and the decoder's rows are batch-invariant, so the same global batch on any
 * number of ranks rolls out the same completions. Data parallelism only: the decoder runs a whole model on each rank.
 * With --grpo-tools, an answer that ends calling tools has them run, their results appended (unscored) and goes on,
 * as TRL's GRPOTrainer(tools=...) rolls out: a round of calls over every row at once, then a pass of the decoder over
 * the rows that called. */
#include "run.h"
#include "run_checks.h"
#include "grpo_rollout.h"
#include "grpo_tools.h"
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    bool empty = !c->grpo.nrewards;
    for (int k = 0; k < c->grpo.nrewards; k++) empty |= !*c->grpo.reward[k];
    if (empty)
        return dt_error(DT_ERR_ARG, "--grpo %s: --reward SPEC is required (contains:WORD, count:WORD or cmd:COMMAND)", c->grpo.prompts);
    if (c->grpo.decoupled && c->grpo.scale != DT_GRPO_SCALE_GROUP)
        return dt_error(DT_ERR_ARG, "--grpo-scale-rewards %s with --grpo-multi-objective normalize_then_sum: its sum is scaled over the "
                        "whole batch already (TRL ignores scale_rewards there)", c->grpo.scale == DT_GRPO_SCALE_BATCH ? "batch" : "none");
    if (c->grpo.nweights && c->grpo.nweights != c->grpo.nrewards)
        return dt_error(DT_ERR_ARG, "--reward-weights: %d weights for %d --reward functions (one each, in their order)", c->grpo.nweights,
                        c->grpo.nrewards);
    dt_status st = c->grpo.tools ? dt_grpo_tools_check(c->grpo.tools) : DT_OK;
    for (int k = 0; !st && k < c->grpo.nrewards; k++) { /* each spec's form, said before any work */
        dt_reward *probe = NULL;
        st = dt_reward_create(c->grpo.reward[k], &probe);
        dt_reward_destroy(probe);
    }
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
    if (!st) st = dt_grpo_attach(gr->g, dt_gpt2_program(gr->ref), true);
    return st ? dt_error(st, "GRPO's reference: %s", dt_last_error()) : DT_OK;
}

static dt_status open_tokenizer(run *r, dt_grpo_run *gr) {
    const dt_train_config *c = &r->c;
    gr->chat = DT_CHAT_NONE;
    int eos = -1;
    dt_status st = c->chat_template ? dt_chat_kind_parse(c->chat_template, &gr->chat) : DT_OK;
    if (!st) st = dt_bpe_for_model(c->tokenizer, NULL, dt_gpt2_get_config(r->m)->vocab_size, 256, c->model, "--grpo", false, &gr->tok);
    if (st || !gr->tok) return st;
    char found[4200];
    snprintf(found, sizeof found, "%s/tokenizer.json", c->model);
    const char *tj = c->tokenizer ? c->tokenizer : found;
    /* no end-of-text: completions run to their length; a template this build cannot render: plain prompts need none, a
     * conversational one is refused naming it */
    st = dt_tokenizer_config_read(tj, gr->tok, &gr->chat, &eos, NULL);
    if (st == DT_ERR_UNSUPPORTED) {
        if (r->rank == 0) dt_log(DT_LOG_WARN, "--grpo: %s", dt_last_error());
        st = DT_OK, gr->chat = DT_CHAT_NONE;
    }
    /* every end the model declares ends a completion, as TRL's GRPOTrainer stops (Llama 3.1's <|eom_id|> after a call) */
    return st ? st : dt_token_ends_read(c->model, dt_gpt2_get_config(r->m)->vocab_size, eos, &gr->ends);
}

static dt_status alloc_rows(dt_grpo_run *gr) {
    size_t n = (size_t)gr->rows * (size_t)gr->T;
    gr->in = malloc(n * sizeof(int32_t)), gr->tg = malloc(n * sizeof(int32_t));
    gr->done = calloc((size_t)gr->rows, sizeof *gr->done);
    gr->rewards = malloc((size_t)gr->rows * sizeof(float)), gr->adv = malloc((size_t)gr->rows * sizeof(float));
    gr->perm = malloc((size_t)gr->prompts.n * sizeof(int)), gr->perm_pass = -1;
    gr->ctx = malloc((size_t)gr->rows * (size_t)(gr->T + 1) * sizeof(int32_t));
    bool ok = gr->in && gr->tg && gr->done && gr->rewards && gr->adv && gr->perm && gr->ctx;
    for (int i = 0; ok && i < gr->rows; i++)
        ok = (gr->done[i].toks = malloc((size_t)(gr->T + 1) * sizeof(int32_t))) && (gr->done[i].mask = malloc((size_t)gr->T + 1));
    return ok ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory for %d rows of %d", gr->rows, gr->T);
}

/* The settings beyond the defaults, for the start line. */
static void settings_text(const dt_grpo_config *g, char *more, size_t cap) {
    size_t n = 0;
    more[0] = 0;
    if (g->epsilon_high > 0) n += (size_t)snprintf(more + n, cap - n, ", epsilon_high %g", g->epsilon_high);
    if (n < cap && g->delta > 0) n += (size_t)snprintf(more + n, cap - n, ", delta %g", g->delta);
    if (n < cap && g->sequence) n += (size_t)snprintf(more + n, cap - n, ", a ratio a completion (GSPO)");
    if (n < cap && g->decoupled) n += (size_t)snprintf(more + n, cap - n, ", each reward normalized in its group, then their sum over the batch (GDPO)");
    if (n < cap && g->scale != DT_GRPO_SCALE_GROUP)
        n += (size_t)snprintf(more + n, cap - n, ", rewards scaled by %s", g->scale == DT_GRPO_SCALE_BATCH ? "the batch" : "nothing");
    if (n < cap && g->mask_truncated) n += (size_t)snprintf(more + n, cap - n, ", truncated completions left out");
    if (n < cap && g->top_entropy < 1) n += (size_t)snprintf(more + n, cap - n, ", the policy term of the top %g of tokens by entropy", g->top_entropy);
    if (n < cap && (g->entropy_coef != 0 || g->adaptive)) n += (size_t)snprintf(more + n, cap - n, ", an entropy bonus of %g", g->entropy_coef);
    if (n < cap && g->adaptive)
        n += (size_t)snprintf(more + n, cap - n, " (adaptive: while the entropy is at most %g, moved by %g within [%g, %g])", g->ent_target, g->ent_delta,
                              g->ent_min, g->ent_max);
    if (n < cap && g->off_policy > 0) snprintf(more + n, cap - n, ", off-policy completions masked above %g", g->off_policy);
}

/* The run's start lines: what trains, and with tools how they run. */
static void say_setup(const run *r, const dt_grpo_run *gr) {
    const dt_grpo_config *g = &r->c.grpo;
    char more[400], rewards[600] = "";
    settings_text(g, more, sizeof more);
    for (size_t k = 0, m = 0; k < (size_t)g->nrewards && m < sizeof rewards; k++) {
        m += (size_t)snprintf(rewards + m, sizeof rewards - m, "%s%.200s", k ? " + --reward " : "", g->reward[k]);
        if (g->nweights && m < sizeof rewards) m += (size_t)snprintf(rewards + m, sizeof rewards - m, " x %g", g->reward_weight[k]);
    }
    char nucleus[64] = "";
    if (g->top_p > 0 && g->top_p < 1) snprintf(nucleus, sizeof nucleus, ", top-p %g", g->top_p);
    if (g->min_p > 0) snprintf(nucleus + strlen(nucleus), sizeof nucleus - strlen(nucleus), ", min-p %g", g->min_p);
    if (g->repetition_penalty > 0 && g->repetition_penalty != 1)
        snprintf(nucleus + strlen(nucleus), sizeof nucleus - strlen(nucleus), ", repetition penalty %g", g->repetition_penalty);
    printf("GRPO: %d prompts from %s, %d completions each (of at most %d tokens, temperature %g%s%s), %d prompts a step over %d "
           "rank%s, --reward %s; TRL's %s loss, beta %g (the reference: %s), epsilon %g%s, %d iteration%s a rollout\n",
           gr->prompts.n, g->prompts, g->group, g->completion, g->temperature, g->top_k ? ", top-k" : "", nucleus,
           gr->per_rank * r->dp_size, r->dp_size, r->dp_size == 1 ? "" : "s", rewards, dt_grpo_loss_name(g->loss), g->beta,
           g->beta > 0 ? "the starting model" : "none", g->epsilon, more, g->iterations, g->iterations == 1 ? "" : "s");
    if (!gr->form) return;
    char turns[48] = "as many rounds as a row holds";
    if (g->tool_turns) snprintf(turns, sizeof turns, "at most %d round%s", g->tool_turns, g->tool_turns == 1 ? "" : "s");
    printf("GRPO: a completion's tool calls (%s's form) run by --grpo-tools %s, %s a completion, their results unscored\n",
           dt_chat_template_of(gr->chat)->name, g->tools, turns);
}

dt_status dt_train_setup_grpo(run *r) {
    dt_train_config *c = &r->c;
    dt_status st = DT_OK;
    dt_grpo_run *gr = r->grpo = calloc(1, sizeof *gr);
    if (!gr) return dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    gr->rows = c->batch * c->grad_accum, gr->T = c->seq, gr->per_rank = gr->rows / c->grpo.group;
    if (!c->grpo.completion) c->grpo.completion = c->seq; /* dr_grpo's constant: the longest completion a row may hold */
    cJSON *kwj = NULL;
    dt_chat_kwargs kw = { .thinking = true }; /* (read below unless the tokenizer fails first) */
    if (!(st = open_tokenizer(r, gr)) && !(st = chat_kwargs(c, &kwj, &kw))) {
        kw.training = c->grpo.tools != NULL; /* (with tools, TRL's GRPO renders by the training form: it keeps a prefix) */
        st = dt_grpo_prompts_read(&gr->prompts, c->grpo.prompts, gr->tok, gr->chat, &kw, gr->T);
    }
    cJSON_Delete(kwj);
    const dt_chat_template *t = dt_chat_template_of(gr->chat);
    if (!st && c->grpo.tools && (!gr->tok || !t || !t->tools))
        st = dt_error(DT_ERR_ARG, "--grpo-tools %s: a completion's calls are read and their results written by a chat template that "
                      "renders tool calls (Qwen 2.5's, Qwen 3's, Llama 3.1's and 3.2's; this run's: %s)", c->grpo.tools, t ? t->name : "none");
    gr->form = c->grpo.tools && t ? t->tools : 0, gr->thinking = kw.thinking;
    if (!st && c->grpo.tools) st = dt_grpo_tools_create(c->grpo.tools, &gr->tools); /* (proc: its program started) */
    gr->nrewards = c->grpo.nrewards;
    for (int k = 0; !st && k < gr->nrewards; k++) {
        gr->weight[k] = c->grpo.nweights ? c->grpo.reward_weight[k] : 1;
        if (!(gr->each[k] = malloc((size_t)gr->rows * sizeof(float)))) st = dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
        if (!st) st = dt_reward_create(c->grpo.reward[k], &gr->reward[k]);
    }
    if (!st && !(st = dt_grpo_create(&c->grpo, gr->rows, gr->T, &gr->g)) &&
        !(st = alloc_rows(gr)))
        st = dt_grpo_attach(gr->g, dt_gpt2_program(r->m), false);
    if (!st) dt_grpo_set_comm(gr->g, r->nranks > 1 ? r->w : NULL); /* (data parallelism alone: the world's ranks) */
    if (!st && c->grpo.beta > 0) st = make_reference(r, gr);
    if (!st && r->rank == 0 && !c->quiet) say_setup(r, gr);
    return st;
}

void dt_train_grpo_destroy(run *r) {
    dt_grpo_run *gr = r->grpo;
    if (!gr) return;
    dt_grpo_prompts_free(&gr->prompts);
    for (int i = 0; gr->done && i < gr->rows; i++) free(gr->done[i].toks), free(gr->done[i].mask), cJSON_Delete(gr->done[i].turns);
    free(gr->in), free(gr->tg), free(gr->done), free(gr->rewards), free(gr->adv), free(gr->sample), free(gr->perm), free(gr->ctx);
    dt_grpo_destroy(gr->g);
    for (int k = 0; k < gr->nrewards; k++) dt_reward_destroy(gr->reward[k]), free(gr->each[k]);
    dt_grpo_tools_destroy(gr->tools);
    dt_gpt2_destroy(gr->ref);
    dt_bpe_destroy(gr->tok);
    free(gr);
    r->grpo = NULL;
}

static int on_token(void *ctx, int32_t token, const float *logits) {
    (void)logits;
    dt_grpo_completion *c = ctx;
    c->mask[c->n] = 1;
    c->toks[c->n++] = token;
    return dt_token_ends_has(c->ends, token); /* an end ends it, kept (TRL's completion mask holds it) */
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

/* A pass of b's decoder (over the weights as they are now) continuing rows[0..n) together in one continuously batched
 * run, each from its prompt and what its completion holds so far (turn 0: nothing), up to --completion-tokens in all.
 * A later turn's row finds its earlier turns in the slot they left (prefix reuse): it reads the tool's result only. */
static dt_status decode_pass(run *r, dt_grpo_run *gr, dt_batcher *b, int turn, const int *rows, int n) {
    const dt_grpo_config *gc = &r->c.grpo;
    dt_batcher_stats before = dt_batcher_get_stats(b);
    dt_status st = DT_OK;
    int added = 0;
    for (int k = 0; !st && k < n; k++) {
        dt_grpo_completion *c = &gr->done[rows[k]];
        int P = gr->prompts.len[c->prompt], room = gr->T + 1 - P - c->n, left = gc->completion - c->n;
        int32_t *ctx = gr->ctx + (size_t)rows[k] * (size_t)(gr->T + 1);
        memcpy(ctx, gr->prompts.toks[c->prompt], (size_t)P * sizeof *ctx), memcpy(ctx + P, c->toks, (size_t)c->n * sizeof *ctx);
        uint32_t w[6] = { (uint32_t)r->c.seed, (uint32_t)(r->c.seed >> 32), (uint32_t)c->place, (uint32_t)(c->place >> 32),
                          (uint32_t)(rows[k] % gc->group), (uint32_t)turn };
        c->seg = c->n;
        if (room <= 0 || left <= 0) continue;
        /* (the first pass's draws as before tools were: five words) */
        dt_infer_request req = { ctx, P + c->n, left < room ? left : room, { .temperature = gc->temperature, .top_k = gc->top_k, .top_p = gc->top_p > 0 ? gc->top_p : 1.0f, .min_p = gc->min_p,
                                   .repetition_penalty = gc->repetition_penalty },
                                 dt_hash_words(DT_HASH_INIT, w, turn ? 6 : 5), on_token, NULL, c, NULL, NULL, 0 };
        if (!(st = dt_batcher_add(b, &req))) added++, gr->stats[S_PROMPT] += P + c->n;
    }
    while (!st && dt_batcher_get_stats(b).finished - before.finished < added) st = dt_batcher_step(b);
    if (!st) gr->stats[S_CACHED] += (double)(dt_batcher_get_stats(b).reused_rows - before.reused_rows); /* (a group's prompt) */
    return st;
}

/* Every row's completion: a pass over all rows, then (--grpo-tools) rounds of calls and passes over those that called. */
static dt_status decode(run *r, dt_grpo_run *gr, int gen) {
    int *rows = malloc(sizeof(int) * (size_t)gr->rows), n = gr->rows, budget = gr->rows > 256 ? gr->rows : 256;
    double t0 = dt_time_now();
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    dt_status st = rows ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    /* (a row's positions: prompt and completion; a slot a row) */
    if (!st) st = dt_decoder_create(r->m, DT_QUANT_NONE, gr->rows, budget, gr->T + 1, &d);
    if (!st) st = dt_batcher_create(d, budget, &b);
    for (int i = 0; !st && i < gr->rows; i++) {
        dt_grpo_completion *c = &gr->done[i];
        c->n = 0, c->ends = &gr->ends, c->prompt = prompt_of(r, gr, gen, i, &c->place), rows[i] = i;
        cJSON_Delete(c->turns), c->turns = NULL;
    }
    for (int turn = 0; !st && n > 0; turn++) {
        st = decode_pass(r, gr, b, turn, rows, n);
        bool more = gr->form && (!r->c.grpo.tool_turns || turn < r->c.grpo.tool_turns);
        if (!st && more) st = dt_grpo_tool_round(gr, &r->c.grpo, rows, &n);
        else n = 0;
    }
    for (int i = 0; !st && gr->form && i < gr->rows; i++) st = dt_grpo_last_answer(gr, &gr->done[i]);
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
    free(rows);
    gr->stats[S_DECODE_S] = dt_time_now() - t0;
    return st ? dt_error(st, "GRPO's rollout: %s", dt_last_error()) : DT_OK;
}

/* The rows' rewards (--reward) and advantages; rank 0 keeps its first completion's text to show. */
static dt_status score(run *r, dt_grpo_run *gr) {
    const char **prompts = malloc(sizeof(char *) * (size_t)gr->rows), **messages = malloc(sizeof(char *) * (size_t)gr->rows);
    char **texts = calloc((size_t)gr->rows, sizeof(char *)), **turns = calloc((size_t)gr->rows, sizeof(char *));
    size_t *lens = malloc(sizeof(size_t) * (size_t)gr->rows);
    dt_status st = prompts && messages && texts && turns && lens ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    for (int i = 0; !st && i < gr->rows; i++) {
        dt_grpo_completion *c = &gr->done[i];
        int p = c->prompt;
        int32_t *tg = gr->tg + (size_t)i * gr->T;
        prompts[i] = gr->prompts.text[p], messages[i] = gr->prompts.messages[p];
        dt_grpo_row(gr->prompts.toks[p], gr->prompts.len[p], c->toks, c->mask, c->n, gr->T, gr->in + (size_t)i * gr->T, tg);
        /* TRL's mask_truncated_completions: one that did not end (its last token no end) leaves the loss */
        c->dropped = r->c.grpo.mask_truncated && (c->n == 0 || !dt_token_ends_has(&gr->ends, c->toks[c->n - 1]));
        for (int t = 0; c->dropped && t < gr->T; t++) tg[t] = DT_IGNORE_INDEX;
        if (!(texts[i] = dt_grpo_completion_text(gr, c, 0, c->n, &lens[i])) || (c->turns && !(turns[i] = dt_json_print_compact(c->turns))))
            st = dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    }
    for (int k = 0; !st && k < gr->nrewards; k++) /* each function, then their weighted sum (TRL's sum_then_normalize) */
        st = dt_reward_score(gr->reward[k], gr->rows, prompts, (const char *const *)messages, (const char *const *)texts, lens,
                             (const char *const *)turns, gr->each[k]);
    for (int i = 0; !st && i < gr->rows; i++) {
        double sum = 0;
        for (int k = 0; k < gr->nrewards; k++) sum += gr->weight[k] * gr->each[k][i];
        gr->rewards[i] = (float)sum;
    }
    bool gdpo = r->c.grpo.decoupled; /* normalize_then_sum: the advantages from the functions' normalized sum */
    float *sum = gdpo ? gr->adv : gr->rewards; /* (GDPO's sum kept in adv until its advantages replace it) */
    if (!st && gdpo) dt_grpo_decoupled_rewards(gr->each, gr->weight, gr->nrewards, gr->rows, r->c.grpo.group, sum);
    double sums[2] = { 0, 0 }; /* --grpo-scale-rewards batch, GDPO: the global batch's sum and sum of squares */
    for (int i = 0; i < gr->rows; i++) sums[0] += sum[i], sums[1] += sum[i] * (double)sum[i];
    if (!st && (gdpo || r->c.grpo.scale == DT_GRPO_SCALE_BATCH) && r->nranks > 1) st = dt_comm_allreduce(r->w, sums, sums, 2, DT_F64, DT_SUM);
    double count = (double)gr->rows * r->nranks, sd = dt_grpo_batch_sd(sums[0], sums[1], count);
    if (!st && gdpo) dt_grpo_batch_advantages(sum, gr->rows, sums[0] / count, sd, gr->adv);
    else if (!st) dt_grpo_advantages(gr->rewards, gr->rows, r->c.grpo.group, r->c.grpo.scale, sd, gr->adv);
    if (!st && r->rank == 0) {
        free(gr->sample);
        gr->sample = dt_utf8_clean(texts[0], lens[0], NULL);
    }
    for (int i = 0; texts && turns && i < gr->rows; i++) free(texts[i]), free(turns[i]);
    free(prompts), free(messages), free(texts), free(turns), free(lens);
    return st;
}

/* The tokens of c the model generated (not the tools' results). */
static int generated_tokens(const dt_grpo_completion *c) {
    int n = 0;
    for (int t = 0; t < c->n; t++) n += c->mask[t];
    return n;
}

/* The rollout's statistics, and dapo's weight: one over the global batch's completion tokens, times the passes the
 * engine (accumulation) and data parallelism (the ranks) average over. */
static dt_status count(run *r, dt_grpo_run *gr, double *token_scale) {
    int G = r->c.grpo.group;
    double *s = gr->stats;
    s[S_ROWS] = gr->rows, s[S_REWARD] = s[S_REWARD_SQ] = s[S_TOKENS] = s[S_FLAT_GROUPS] = 0; /* (S_TOOL_CALLS, S_TOOL_FAILS: the rollout's) */
    s[S_GENERATED] = 0;
    for (int i = 0; i < gr->rows; i++) {
        int n = generated_tokens(&gr->done[i]);
        s[S_REWARD] += gr->rewards[i], s[S_REWARD_SQ] += gr->rewards[i] * (double)gr->rewards[i];
        s[S_GENERATED] += n, s[S_TOKENS] += gr->done[i].dropped ? 0 : n; /* (the loss's: dapo's count) */
    }
    for (int k = 0; k < gr->nrewards; k++) {
        s[S_EACH + k] = 0;
        for (int i = 0; i < gr->rows; i++) s[S_EACH + k] += gr->each[k][i];
    }
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
    gr->stats[S_CLIP_UNITS] = loss_stats[DT_GRPO_CLIP_UNITS]; /* (tokens, or completions at the sequence level) */
    gr->stats[S_LOSS_TOKENS] = loss_stats[DT_GRPO_TOKENS]; /* the tokens the loss saw (= the rollout's) */
    gr->stats[S_ENTROPY] = loss_stats[DT_GRPO_ENTROPY];
    gr->stats[S_BONUS_ENTROPY] = loss_stats[DT_GRPO_BONUS_ENTROPY], gr->stats[S_BONUS_TOKENS] = loss_stats[DT_GRPO_BONUS_TOKENS];
    float v[S_N];
    for (int i = 0; i < S_N; i++) v[i] = (float)gr->stats[i];
    dt_status st = r->nranks > 1 ? dt_comm_allreduce(r->w, v, v, S_N, DT_F32, DT_SUM) : DT_OK;
    if (st) return st;
    double n = v[S_ROWS], mean = v[S_REWARD] / n, lt = v[S_LOSS_TOKENS];
    dt_grpo_adapt(gr->g, v[S_BONUS_ENTROPY], v[S_BONUS_TOKENS]); /* (the next step's coefficient: every rank's alike) */
    *out = (dt_grpo_step_stats){
        .reward = mean, .reward_std = sqrt(fmax(0, v[S_REWARD_SQ] / n - mean * mean)), .kl = lt > 0 ? v[S_KL] / lt : 0,
        .entropy = lt > 0 ? v[S_ENTROPY] / lt : 0, .entropy_coef = dt_grpo_entropy_coef(gr->g),
        .completion = v[S_GENERATED] / n, .clipped = v[S_CLIP_UNITS] > 0 ? v[S_CLIPPED] / v[S_CLIP_UNITS] : 0,
        .flat = v[S_FLAT_GROUPS] / (n / r->c.grpo.group), .decode_s = v[S_DECODE_S] / r->nranks,
        .rollout_tps = v[S_DECODE_S] > 0 ? v[S_GENERATED] / (v[S_DECODE_S] / r->nranks) : 0, .sample = gr->sample,
        .cached = v[S_PROMPT] > 0 ? v[S_CACHED] / v[S_PROMPT] : 0,
        .tool_calls = gr->form ? v[S_TOOL_CALLS] / n : -1,
        .tool_failures = !gr->form ? -1 : v[S_TOOL_CALLS] > 0 ? v[S_TOOL_FAILS] / v[S_TOOL_CALLS] : 0,
    };
    out->nrewards = gr->nrewards;
    for (int k = 0; k < gr->nrewards; k++) out->each[k] = v[S_EACH + k] / n;
    gr->stats[S_DECODE_S] = gr->stats[S_TOOL_CALLS] = gr->stats[S_TOOL_FAILS] = gr->stats[S_PROMPT] = gr->stats[S_CACHED] = 0;
    /* the text before and after: rank 0's first completion of the first and the last rollouts */
    const dt_train_config *c = &r->c;
    int step = gr->step++;
    if (r->rank == 0 && !c->quiet && gr->sample && (step == 0 || step + 1 == c->steps) && step % c->grpo.iterations == 0)
        printf("  step %d, prompt %s: completion \"%s\"\n", step + 1, gr->prompts.text[gr->done[0].prompt], gr->sample);
    return DT_OK;
}
