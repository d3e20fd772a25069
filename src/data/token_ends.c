/* The tokens that end a completion: the end of text, and a model folder's generation_config.json's eos_token_id
 * (an id or a list), as transformers' generate, vLLM and TRL's GRPOTrainer stop. Llama 3.1's Instruct lists
 * <|eom_id|> (which ends an answer that calls a built-in tool) and <|end_of_text|> beside <|eot_id|>; Qwen 2.5's
 * lists <|endoftext|> beside <|im_end|>. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "io/json_text.h"

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

/* Id x (the file at path's) among e->ids unless there already. */
static dt_status add_end(dt_token_ends *e, const cJSON *x, int vocab, const char *path) {
    if (!cJSON_IsNumber(x) || x->valuedouble != (double)x->valueint || x->valueint < 0 || x->valueint >= vocab)
        return dt_error(DT_ERR_IO, "%s: eos_token_id holds %s, not a token id of the model's %d", path, cJSON_IsNumber(x) ? "a number" : "a value",
                        vocab);
    if (dt_token_ends_has(e, x->valueint)) return DT_OK;
    if (e->n == DT_MAX_ENDS) return dt_error(DT_ERR_IO, "%s: more than %d tokens end a completion", path, DT_MAX_ENDS);
    e->ids[e->n++] = x->valueint;
    return DT_OK;
}

dt_status dt_token_ends_read(const char *model, int vocab, int eot, dt_token_ends *e) {
    e->n = 0;
    if (eot >= 0) e->ids[e->n++] = eot;
    char path[4200], *text = NULL;
    snprintf(path, sizeof path, "%s/generation_config.json", model ? model : "");
    if (!model || access(path, F_OK) != 0) return DT_OK; /* (a model file has no folder's file beside it) */
    dt_status st = dt_file_read_text(path, 1 << 20, &text, NULL);
    cJSON *j = st ? NULL : dt_json_parse_whole(text), *ids = cJSON_GetObjectItemCaseSensitive(j, "eos_token_id"), *x;
    if (!st && !j) st = dt_error(DT_ERR_IO, "%s: not JSON", path);
    if (!st && cJSON_IsNumber(ids)) st = add_end(e, ids, vocab, path);
    else if (!st && cJSON_IsArray(ids)) {
        cJSON_ArrayForEach(x, ids) if (!st) st = add_end(e, x, vocab, path);
    } else if (!st && ids && !cJSON_IsNull(ids)) st = dt_error(DT_ERR_IO, "%s: eos_token_id is a token id or a list of them", path);
    cJSON_Delete(j);
    free(text);
    return st;
}

bool dt_token_ends_has(const dt_token_ends *e, int32_t token) {
    for (int i = 0; i < e->n; i++)
        if (token == e->ids[i]) return true;
    return false;
}
