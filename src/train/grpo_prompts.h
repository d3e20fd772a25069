/* The prompts of a --grpo file, as written and as the model reads them. */
#ifndef DTRAIN_TRAIN_GRPO_PROMPTS_H
#define DTRAIN_TRAIN_GRPO_PROMPTS_H

#include "dtrain/data.h"

typedef struct {
    char **text;     /* as written, or a conversational prompt's as its template renders it */
    char **messages; /* a conversational prompt's messages as a JSON array (what its rewards see), or NULL */
    struct cJSON **tools; /* a conversational prompt's line's "tools" (the calls its rollouts may make), or NULL */
    int32_t **toks;  /* as the model reads them */
    int *len, n;
} dt_grpo_prompts;

/* A .jsonl of {"prompt": text} or {"prompt": [messages]} (TRL's prompt-only forms, standard and conversational; a
 * conversational prompt's "tools", a list or its JSON text, rendered into it as the template writes them; other keys
 * ignored), or any other file's lines: each tokenized by tok (NULL: bytes; a text after the tokenizer's
 * begin-of-text, as TRL's GRPOTrainer tokenizes it; messages rendered by the chat template with the assistant's head
 * last (as kw asks) and tokenized as they are, as its apply_chat_template) and refused, naming its
 * line, when empty or not shorter than T tokens, or messages without a template. */
dt_status dt_grpo_prompts_read(dt_grpo_prompts *p, const char *path, dt_bpe *tok, dt_chat_kind chat, const dt_chat_kwargs *kw, int T);
void dt_grpo_prompts_free(dt_grpo_prompts *p);

#endif
