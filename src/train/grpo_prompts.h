/* The prompts of a --grpo file, as written and as the model reads them. */
#ifndef DTRAIN_TRAIN_GRPO_PROMPTS_H
#define DTRAIN_TRAIN_GRPO_PROMPTS_H

#include "dtrain/data.h"

typedef struct {
    char **text;     /* as written */
    int32_t **toks;  /* as the model reads them */
    int *len, n;
} dt_grpo_prompts;

/* A .jsonl of {"prompt": text} (TRL's standard prompt-only form; other keys ignored), or any other file's lines: each
 * tokenized by tok (NULL: bytes) and refused, naming its line, when empty or not shorter than T tokens. */
dt_status dt_grpo_prompts_read(dt_grpo_prompts *p, const char *path, dt_bpe *tok, int T);
void dt_grpo_prompts_free(dt_grpo_prompts *p);

#endif
