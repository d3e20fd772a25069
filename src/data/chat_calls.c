/* An answer's tool calls, as the templates ask a model to write them (what the server answers with and GRPO's rollouts
 * run). Qwen's (Hermes's form: each
 * "<tool_call>\n{"name": NAME, "arguments": {...}}\n</tool_call>"), read as vLLM's hermes parser reads them: every
 * block, the last one also where the answer ends before its "</tool_call>"; the text before the first block is the
 * message's content. Llama 3.1's (JSON: {"name": NAME, "parameters": {...}}), read as vLLM's llama3_json parser reads
 * a stream: an answer that opens with "{" (or <|python_tag|>) is calls, objects separated by ";" ("arguments" also
 * taken for "parameters"), and has no content. A call that is not such an object leaves the whole answer text, as
 * there. */
#include "dtrain/data.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define OPEN "<tool_call>"
#define CLOSE "</tool_call>"
#define PYTHON_TAG "<|python_tag|>"

/* Call j's (a {"name", "arguments" or "parameters"} object; NULL: not one) as {"name", "arguments"}, or NULL. */
static cJSON *one_call(const cJSON *j) {
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name"), *arguments = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!arguments) arguments = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    if (!cJSON_IsObject(j) || !cJSON_IsString(name) || !arguments) return NULL;
    cJSON *call = cJSON_CreateObject();
    if (call) cJSON_AddStringToObject(call, "name", name->valuestring), cJSON_AddItemToObject(call, "arguments", cJSON_Duplicate(arguments, true));
    return call;
}

/* A block's call (n bytes at a), or NULL. */
static cJSON *block_call(const char *a, size_t n) {
    char *text = malloc(n + 1);
    if (!text) return NULL;
    memcpy(text, a, n), text[n] = 0;
    cJSON *j = dt_json_parse_whole(text), *call = one_call(j);
    free(text);
    cJSON_Delete(j);
    return call;
}

/* Llama 3.1's calls: the answer (n bytes at text) after its <|python_tag|>, objects separated by ";"; NULL where it is
 * not that whole. */
static cJSON *json_calls(const char *text, size_t n) {
    size_t t = strlen(PYTHON_TAG);
    char *s = malloc(n + 1);
    if (!s) return NULL;
    memcpy(s, text, n), s[n] = 0;
    const char *p = n >= t && !memcmp(s, PYTHON_TAG, t) ? s + t : s, *end;
    cJSON *calls = cJSON_CreateArray();
    while (calls) {
        cJSON *j = cJSON_ParseWithOpts(p, &end, false), *call;
        if (j) dt_json_mark_floats(j, p, (size_t)(end - p)); /* (arguments written 2.0 go back into a prompt so) */
        call = j ? one_call(j) : NULL;
        cJSON_Delete(j);
        if (!call) {
            cJSON_Delete(calls), calls = NULL;
            break;
        }
        cJSON_AddItemToArray(calls, call);
        for (p = end; *p == ' ' || *p == '\n' || *p == '\t' || *p == '\r'; p++) {}
        if (!*p) break;
        if (*p++ != ';') cJSON_Delete(calls), calls = NULL;
    }
    free(s);
    return calls;
}

size_t dt_chat_calls_text(int form, const char *text, size_t n) {
    if (form == DT_CHAT_TOOLS_JSON) /* (nothing of an answer that opens as a call, or may yet) */
        return n && (text[0] == '{' || !memcmp(text, PYTHON_TAG, n < strlen(PYTHON_TAG) ? n : strlen(PYTHON_TAG))) ? 0 : n;
    const char *p = n ? memmem(text, n, OPEN, strlen(OPEN)) : NULL;
    if (p) return (size_t)(p - text);
    for (size_t k = n < strlen(OPEN) - 1 ? n : strlen(OPEN) - 1; k > 0; k--)
        if (!memcmp(text + n - k, OPEN, k)) return n - k;
    return n;
}

cJSON *dt_chat_calls_read(int form, const char *text, size_t n, size_t *content) {
    *content = n;
    if (!n) return NULL; /* (an empty answer: its text may be NULL, which memmem and memcpy must not be given) */
    const char *end = text + n, *p = memmem(text, n, OPEN, strlen(OPEN));
    if (form == DT_CHAT_TOOLS_JSON) {
        cJSON *calls = dt_chat_calls_text(form, text, n) ? NULL : json_calls(text, n);
        if (calls) *content = 0;
        return calls;
    }
    if (!p) return NULL;
    *content = (size_t)(p - text);
    cJSON *calls = cJSON_CreateArray();
    while (calls && p) {
        const char *a = p + strlen(OPEN), *b = memmem(a, (size_t)(end - a), CLOSE, strlen(CLOSE));
        cJSON *call = block_call(a, (size_t)((b ? b : end) - a));
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
