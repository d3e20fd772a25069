/* Tokens back to text for serving (text to tokens is dt_bpe_prompt's): a
 * byte-level model's tokens are the bytes; with GPT-2's BPE files, the
 * BPE's. */
#include "serve_internal.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
