/* A GRPO run's rollouts (grpo_run.c) and the tool turns in them (grpo_turns.c): what both read. Internal to src/train. */
#ifndef DTRAIN_TRAIN_GRPO_ROLLOUT_H
#define DTRAIN_TRAIN_GRPO_ROLLOUT_H

#include "run.h"
#include "grpo_prompts.h"

#include <cjson/cJSON.h>

/* A rollout's figures (dt_grpo_run.stats), summed over the ranks for the step's metrics. */
enum { S_ROWS, S_REWARD, S_REWARD_SQ, S_TOKENS, S_FLAT_GROUPS, S_DECODE_S, S_KL, S_CLIPPED, S_CLIP_UNITS, S_LOSS_TOKENS, S_TOOL_CALLS, S_TOOL_FAILS, S_GENERATED, S_ENTROPY, S_BONUS_ENTROPY, S_BONUS_TOKENS,
       S_PROMPT, S_CACHED, /* prompt tokens the rollout's passes were given, and those a cache slot gave */
      
       S_EACH, S_N = S_EACH + DT_GRPO_MAX_REWARDS }; /* (S_EACH + k: reward function k's sum) */

typedef struct {
    int32_t *toks;
    unsigned char *mask;    /* [T + 1]: 1 the model's token, 0 a tool's result (not scored) */
    int n;
    const dt_token_ends *ends; /* what ends it (the run's) */
    int prompt;             /* which of the file's prompts it completes */
    uint64_t place;         /* that prompt's place in the stream (its draws') */
    int seg;                /* where the answer being generated began (after the last results) */
    bool dropped;           /* --grpo-mask-truncated and it did not end: out of the loss (its targets ignored) */
    cJSON *turns;           /* one that called tools: its answers and the results, as the reward reads them (else NULL) */
} dt_grpo_completion;

struct dt_grpo_run {
    dt_grpo *g;
    dt_reward *reward[DT_GRPO_MAX_REWARDS]; /* --reward's functions */
    float *each[DT_GRPO_MAX_REWARDS]; /* [rows]: each one's rewards */
    double weight[DT_GRPO_MAX_REWARDS];
    int nrewards;
    dt_gpt2 *ref;           /* the reference (beta > 0): the starting model */
    dt_bpe *tok;            /* NULL: bytes */
    dt_chat_kind chat;      /* conversational prompts' template (--chat-template, or the tokenizer_config.json's) */
    dt_token_ends ends;     /* the ids that end a completion: the end of text and generation_config.json's (none: its length) */
    dt_grpo_prompts prompts;
    int rows, per_rank, T;  /* this rank's rows a step, prompts a step, positions a row */
    int32_t *in, *tg;       /* [rows * T] */
    int32_t *ctx;           /* [rows * (T + 1)]: a row's prompt and completion so far, which a pass after tools completes */
    int form;               /* the template's tool calls (dt_chat_template.tools; 0: no --grpo-tools) */
    struct dt_grpo_tools *tools; /* --grpo-tools' program (NULL: none) */
    bool thinking;          /* --chat-template-kwargs' enable_thinking: the head after tools' results */
    dt_grpo_completion *done; /* [rows] */
    float *rewards, *adv;
    int next;               /* the next micro-batch's first row */
    int *perm;              /* --shuffle: the prompts' order in pass perm_pass */
    int64_t perm_pass;
    int step;               /* steps done */
    double stats[S_N];      /* this rollout's (and the step's loss's) figures */
    char *sample;           /* rank 0: the first prompt's first completion, as text */
};

/* The text of c's tokens [from, to) that the model wrote (the end-of-text token left out, as TRL decodes with
 * skip_special_tokens; a tool's results left out), *len its bytes; NULL: out of memory. */
char *dt_grpo_completion_text(const dt_grpo_run *gr, const dt_grpo_completion *c, int from, int to, size_t *len);
/* A round of tool calls (--grpo-tools): of rows[0..*n), those whose answer ended (its end-of-text token) calling tools
 * have them run by gc's program, the results appended to the completion (unscored) with the assistant's head after,
 * and the answer and results kept in its turns; rows[0..*n) then holds those that go on (a completion whose results
 * its row or --completion-tokens cannot hold ends without them, as TRL drops them). */
dt_status dt_grpo_tool_round(dt_grpo_run *gr, const dt_grpo_config *gc, int *rows, int *n);
/* A completion that called tools: its last answer added to its turns (one that called none: nothing). */
dt_status dt_grpo_last_answer(dt_grpo_run *gr, dt_grpo_completion *c);

#endif
