/* Tokens back to text for serving (text to tokens is dt_bpe_prompt's): a
 * byte-level model's tokens are the bytes; with GPT-2's BPE files, the
 * BPE's; and which tokens are special (their text left out unless asked). */
#include "serve_internal.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status serve_vocab_mark_special(serve_vocab *v) {
    int n = v->bpe ? dt_bpe_vocab_size(v->bpe) : 0, added;
    for (int id = 0; id < n && id < v->vocab; id++) {
        if (!dt_bpe_token_text(v->bpe, (uint32_t)id, &added) || added != 2) continue;
        if (!v->special && !(v->special = calloc(dt_token_set_words(v->vocab), sizeof(uint64_t))))
            return dt_error(DT_ERR_NOMEM, "serve: out of memory");
        dt_token_set_add(v->special, id);
    }
    return DT_OK;
}

void serve_vocab_free(serve_vocab *v) {
    dt_bpe_destroy(v->bpe);
    free(v->special);
    v->bpe = NULL, v->special = NULL;
}

bool serve_vocab_special(const serve_vocab *v, int32_t id) {
    return dt_token_ends_has(&v->ends, id) || (v->special && id >= 0 && id < v->vocab && (v->special[id / 64] >> (id % 64) & 1));
}

dt_status serve_vocab_append(const serve_vocab *v, int32_t id, char **buf, size_t *len, size_t *cap) {
    char one[16];
    size_t n;
    const char *s = dt_token_text(v->bpe, id, one, &n);
    if (*len + n + 1 > *cap) {
        size_t c = (*cap ? *cap * 2 : 256) + n;
        char *b = realloc(*buf, c);
        if (!b) return dt_error(DT_ERR_NOMEM, "out of memory for a completion of %zu bytes", *len);
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, s, n);
    *len += n;
    (*buf)[*len] = 0;
    return DT_OK;
}
