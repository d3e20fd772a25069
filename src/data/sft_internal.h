/* Supervised fine-tuning's rows (sft.c), their packing (sft_pack.c) and their cache (sft_cache.c). Internal to src/data. */
#ifndef DT_DATA_SFT_INTERNAL_H
#define DT_DATA_SFT_INTERNAL_H

#include "dtrain/data.h"

struct dt_sft {
    int T, pairs;               /* pairs: -1 unknown yet, 1 preference pairs (rows 2i chosen, 2i + 1 rejected), 0 examples */
    size_t nrows, cap, truncated;
    int32_t *inputs, *targets;  /* [nrows * T] */
    size_t *scored;             /* per row */
    int *len;                   /* per row: the example's tokens (at most T + 1) */
    int32_t *pos;               /* packed rows (dt_sft_pack): each row's position in its example; NULL: not packed */
    bool cached;                /* the rows came from the cache */
    char path[512];
};

/* What a file's rows depend on: its bytes, the tokenizer (every token, merge and its pattern; NULL: bytes), the chat
 * template, the end-of-text id and T. */
uint64_t dt_sft_cache_key(const char *text, size_t len, const dt_bpe *tok, dt_chat_kind chat, int eos, int T);
/* The rows cached under key into d (whose T is set): true when there were whole ones. */
bool dt_sft_cache_read(uint64_t key, dt_sft *d);
/* d's rows kept under key (nothing said if they cannot be: the cache is an aid). */
void dt_sft_cache_write(uint64_t key, const dt_sft *d);

#endif
