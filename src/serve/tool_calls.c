/* An answer's tool calls, as Qwen's templates ask a model to write them (Hermes's form: each
 * "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>"), read as vLLM's hermes parser reads them: every
 * block, the last one also where the answer ends before its "</tool_call>"; the text before the first block is the
 * message's content. A block that is not such an object leaves the whole answer text, as there. A stream sends the
 * text before the first block as it comes and the calls once the answer is whole. */
#include "serve_internal.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"

/* One block's call, OpenAI's {"id", "type": "function", "function": {"name", "arguments": its JSON text}}, or NULL. */
static cJSON *one_call(const char *a, size_t n, long id, int k) {
    char *text = malloc(n + 1), *args = NULL;
    size_t len = 0, cap = 0;
    if (!text) return NULL;
    memcpy(text, a, n), text[n] = 0;
    cJSON *j = dt_json_parse_whole(text), *call = NULL;
    free(text);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *arguments = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    /* the arguments' text as vLLM writes it (Python's json.dumps, text beyond ASCII as it is) */
    if (cJSON_IsObject(j) && cJSON_IsString(name) && arguments && !dt_chat_tojson(arguments, &args, &len, &cap)) {
        char cid[48];
        snprintf(cid, sizeof cid, "call_%ld_%d", id, k);
        call = cJSON_CreateObject();
        cJSON *f = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", cid);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(f, "name", name->valuestring);
        cJSON_AddStringToObject(f, "arguments", args);
        cJSON_AddItemToObject(call, "function", f);
    }
    free(args);
    cJSON_Delete(j);
    return call;
}

size_t serve_tool_calls_text(const char *text, size_t n) {
    const char *p = n ? memmem(text, n, OPEN, strlen(OPEN)) : NULL;
    if (p) return (size_t)(p - text);
    for (size_t k = n < strlen(OPEN) - 1 ? n : strlen(OPEN) - 1; k > 0; k--)
        if (!memcmp(text + n - k, OPEN, k)) return n - k;
    return n;
}

cJSON *serve_tool_calls(const char *text, size_t n, long id, size_t *content) {
    const char *end = text + n, *p = memmem(text, n, OPEN, strlen(OPEN));
    *content = n;
    if (!p) return NULL;
    *content = (size_t)(p - text);
    cJSON *calls = cJSON_CreateArray();
    for (int k = 0; calls && p; k++) {
        const char *a = p + strlen(OPEN), *b = memmem(a, (size_t)(end - a), CLOSE, strlen(CLOSE));
        cJSON *call = one_call(a, (size_t)((b ? b : end) - a), id, k);
        if (!call) {
            cJSON_Delete(calls);
            *content = n;
            return NULL;
        }
        cJSON_AddItemToArray(calls, call);
        p = b ? memmem(b, (size_t)(end - b), OPEN, strlen(OPEN)) : NULL;
    }
    return calls;
}
