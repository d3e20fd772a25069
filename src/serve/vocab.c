/* Tokens back to text for serving (text to tokens is dt_bpe_prompt's): a
 * byte-level model's tokens are the bytes; with GPT-2's BPE files, the
 * BPE's. And the tokens that end a completion: the end of text, and the
 * model folder's generation_config.json's others. */
#include "serve_internal.h"
#include "dtrain/io.h"
#include "io/json_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* Id x (generation_config.json's at path) among v->ends unless it is the end of text. */
static dt_status add_end(serve_vocab *v, const cJSON *x, const char *path) {
    if (!cJSON_IsNumber(x) || x->valuedouble != (double)x->valueint || x->valueint < 0 || x->valueint >= v->vocab)
        return dt_error(DT_ERR_IO, "%s: eos_token_id holds %s, not a token id of the model's %d", path, cJSON_IsNumber(x) ? "a number" : "a value",
                        v->vocab);
    if (x->valueint == v->eot) return DT_OK;
    if (v->nends == SERVE_MAX_ENDS) return dt_error(DT_ERR_IO, "%s: more than %d eos_token_id", path, SERVE_MAX_ENDS);
    v->ends[v->nends++] = x->valueint;
    return DT_OK;
}

dt_status serve_vocab_ends(serve_vocab *v, const char *model) {
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/generation_config.json", model);
    v->nends = 0;
    if (access(path, F_OK) != 0) return DT_OK;
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    cJSON *j = st ? NULL : dt_json_parse_whole(text), *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *x;
    if (!st && !j) st = dt_error(DT_ERR_IO, "%s: not JSON", path);
    if (!st && cJSON_IsNumber(e)) st = add_end(v, e, path);
    else if (!st && cJSON_IsArray(e)) {
        cJSON_ArrayForEach(x, e) if (!st) st = add_end(v, x, path);
    } else if (!st && e && !cJSON_IsNull(e)) st = dt_error(DT_ERR_IO, "%s: eos_token_id is a token id or a list of them", path);
    cJSON_Delete(j);
    free(text);
    return st;
}

bool serve_vocab_ends_with(const serve_vocab *v, int32_t token) {
    if (token == v->eot) return true;
    for (int i = 0; i < v->nends; i++)
        if (token == v->ends[i]) return true;
    return false;
}
