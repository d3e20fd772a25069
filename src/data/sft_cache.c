/* Tokenized fine-tuning data kept for the next run: ${XDG_CACHE_HOME:-~/.cache}/dtrain/sft/
 * KEY.rows, KEY a hash of everything the rows depend on (dt_sft_cache_key), as TRL keeps a tokenized dataset in the
 * datasets cache. A file that does not read whole, or holds rows that do not fit its header, is ignored: the data is
 * tokenized again. */
#include "sft_internal.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAGIC 0x31574f5254465344ull /* "DSFTROW1" */
/* What a line makes (sft.c's rendering, tokenizing, cutting): a change to it changes this, so no older rows are read. */
#define ROWS_VERSION 7 /* 2: a line with a NUL or text after its value is refused; 3: a line not UTF-8 is; 4: a chat's
                          * "tools" rendered (Qwen's templates; refused by the others); 5: Llama 3.1's tools too, and
                          * a conversational pair's earlier answers without Qwen 3's think block, as its template; 6: a
                          * line's chat_template_kwargs; 7: a number written as a float (1.0) rendered so by tojson */

/* FNV-1a over bytes: whole words, then the tail in one zero-padded word. */
static uint64_t hash_bytes(uint64_t h, const void *p, size_t n) {
    uint32_t tail = 0;
    h = dt_hash_words(h, p, n / 4);
    memcpy(&tail, (const char *)p + n / 4 * 4, n % 4);
    return dt_hash_words(h, &tail, 1) ^ n;
}

uint64_t dt_sft_cache_key(const char *text, size_t len, const dt_bpe *tok, dt_chat_kind chat, int eos, int T) {
    int32_t head[5] = { ROWS_VERSION, (int32_t)chat, eos, T, tok ? dt_bpe_bos(tok) : -1 };
    uint64_t h = hash_bytes(dt_hash_words(DT_HASH_INIT, head, 5), text, len);
    for (int i = 0; tok && i < dt_bpe_vocab_size(tok); i++) {
        size_t n = 0;
        const char *b = dt_bpe_token_bytes(tok, (uint32_t)i, &n);
        h = hash_bytes(h, b ? b : "", b ? n : 0);
    }
    for (int r = 0; tok && r < dt_bpe_merge_count(tok); r++) h = hash_bytes(h, dt_bpe_merge(tok, r), strlen(dt_bpe_merge(tok, r)));
    const char *pat = tok ? dt_bpe_pattern(tok) : NULL;
    return pat ? hash_bytes(h, pat, strlen(pat)) : h;
}

static bool path_of(uint64_t key, char *out, size_t cap, bool make) {
    char dir[4096];
    return !dt_cache_dir("sft", dir, sizeof dir, make) && snprintf(out, cap, "%s/%016llx.rows", dir, (unsigned long long)key) < (int)cap;
}

bool dt_sft_cache_read(uint64_t key, dt_sft *d) {
    char path[4200];
    if (!path_of(key, path, sizeof path, false)) return false;
    FILE *f = fopen(path, "rb");
    if (!f) return false;
    uint64_t h[6]; /* magic, T, pairs, rows, truncated, key */
    size_t n = fread(h, sizeof h, 1, f) == 1 && h[0] == MAGIC && h[1] == (uint64_t)d->T && h[5] == key && h[3] > 0 && h[3] < (1ull << 40)
                   ? (size_t)h[3] : 0, T = (size_t)d->T;
    bool ok = n > 0;
    if (ok) {
        d->inputs = malloc(n * T * sizeof *d->inputs), d->targets = malloc(n * T * sizeof *d->targets);
        d->scored = malloc(n * sizeof *d->scored), d->len = malloc(n * sizeof *d->len);
        ok = d->inputs && d->targets && d->scored && d->len && fread(d->inputs, sizeof *d->inputs, n * T, f) == n * T &&
             fread(d->targets, sizeof *d->targets, n * T, f) == n * T && fread(d->scored, sizeof *d->scored, n, f) == n &&
             fread(d->len, sizeof *d->len, n, f) == n && fgetc(f) == EOF;
    }
    for (size_t i = 0; ok && i < n * T; i++) ok = d->inputs[i] >= 0 && (d->targets[i] >= 0 || d->targets[i] == DT_IGNORE_INDEX);
    for (size_t r = 0; ok && r < n; r++) ok = d->len[r] >= 0 && d->len[r] <= d->T + 1;
    fclose(f);
    if (!ok) { /* not ours, or cut short: tokenized again */
        free(d->inputs), free(d->targets), free(d->scored), free(d->len);
        d->inputs = d->targets = NULL, d->scored = NULL, d->len = NULL;
        return false;
    }
    d->nrows = d->cap = n, d->pairs = h[2] == 1 ? 1 : 0, d->truncated = (size_t)h[4], d->cached = true;
    return true;
}

void dt_sft_cache_write(uint64_t key, const dt_sft *d) {
    char path[4200];
    if (!path_of(key, path, sizeof path, true)) return;
    size_t n = d->nrows, T = (size_t)d->T;
    uint64_t h[6] = { MAGIC, T, d->pairs == 1, n, d->truncated, key };
    const void *parts[5] = { h, d->inputs, d->targets, d->scored, d->len };
    size_t sizes[5] = { sizeof h, n * T * sizeof *d->inputs, n * T * sizeof *d->targets, n * sizeof *d->scored, n * sizeof *d->len };
    if (dt_file_write_atomic(path, parts, sizes, 5)) dt_log(DT_LOG_DEBUG, "%s: not cached: %s", path, dt_last_error());
}
