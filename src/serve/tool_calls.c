/* An answer's tool calls as OpenAI's API answers them: read in the template's form (data/chat_calls.c), each
 * {"id": "call_<request>_<k>", "type": "function", "function": {"name", "arguments": their JSON text as vLLM writes it
 * (Python's json.dumps, text beyond ASCII as it is)}}. A stream sends the text before the first call as it comes
 * (dt_chat_calls_text) and the calls once the answer is whole. */
#include "serve_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>

cJSON *serve_tool_calls(int form, const char *text, size_t n, long id, size_t *content) {
    cJSON *read = dt_chat_calls_read(form, text, n, content), *calls = read ? cJSON_CreateArray() : NULL, *c;
    int k = 0;
    cJSON_ArrayForEach(c, read) {
        char cid[48], *args = NULL;
        size_t len = 0, cap = 0;
        if (dt_chat_tojson(cJSON_GetObjectItemCaseSensitive(c, "arguments"), &args, &len, &cap)) {
            cJSON_Delete(calls), calls = NULL, *content = n; /* (out of memory: the answer as text) */
            break;
        }
        snprintf(cid, sizeof cid, "call_%ld_%d", id, k++);
        cJSON *call = cJSON_CreateObject(), *f = cJSON_CreateObject();
        cJSON_AddStringToObject(call, "id", cid);
        cJSON_AddStringToObject(call, "type", "function");
        cJSON_AddStringToObject(f, "name", cJSON_GetObjectItemCaseSensitive(c, "name")->valuestring);
        cJSON_AddStringToObject(f, "arguments", args);
        cJSON_AddItemToObject(call, "function", f);
        cJSON_AddItemToArray(calls, call);
        free(args);
    }
    cJSON_Delete(read);
    return calls;
}
