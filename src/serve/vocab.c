/* Tokens back to text for serving (text to tokens is dt_bpe_prompt's): a
 * byte-level model's tokens are the bytes; with GPT-2's BPE files, the
 * BPE's. */
#include "serve_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status serve_vocab_append(const serve_vocab *v, int32_t id, char **buf, size_t *len, size_t *cap) {
    char one[16];
    const char *s = one;
    size_t n = 1;
    if (v->bpe) {
        s = dt_bpe_token_bytes(v->bpe, (uint32_t)id, &n);
        if (!s) { n = (size_t)snprintf(one, sizeof one, "<%d>", (int)id); s = one; }
    } else if (id < 256) {
        one[0] = (char)id;
    } else {
        n = (size_t)snprintf(one, sizeof one, "<%d>", (int)id);
    }
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

char *serve_utf8_clean(const char *s, size_t n, size_t *out_len) {
    char *o = malloc(n * 3 + 1); /* each bad byte becomes U+FFFD's three */
    size_t k = 0;
    if (!o) return NULL;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        size_t need = c < 0x80 ? 1 : (c & 0xE0) == 0xC0 && c >= 0xC2 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 && c <= 0xF4 ? 4 : 0;
        bool good = need > 0 && i + need <= n;
        for (size_t j = 1; good && j < need; j++) good = ((unsigned char)s[i + j] & 0xC0) == 0x80;
        /* overlong three-byte forms and UTF-16 surrogates are not UTF-8 either */
        if (good && need == 3) {
            unsigned char d = (unsigned char)s[i + 1];
            good = !(c == 0xE0 && d < 0xA0) && !(c == 0xED && d >= 0xA0);
        }
        if (good && need == 4) {
            unsigned char d = (unsigned char)s[i + 1];
            good = !(c == 0xF0 && d < 0x90) && !(c == 0xF4 && d >= 0x90);
        }
        if (good && c == 0) good = false; /* JSON strings may hold it escaped, but C strings cannot */
        if (!good) { memcpy(o + k, "\xEF\xBF\xBD", 3); k += 3; i++; continue; }
        memcpy(o + k, s + i, need);
        k += need;
        i += need;
    }
    o[k] = 0;
    if (out_len) *out_len = k;
    return o;
}
