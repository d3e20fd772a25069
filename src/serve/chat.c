/* OpenAI's chat messages as one prompt: by the model's own chat template
 * where its tokenizer_config.json names one dtrain renders (ChatML's,
 * Llama 3's, Qwen's, SmolLM2's: data/chat_prompt.c renders it, Llama 3.2's
 * date today's unless the request names one), the assistant's head last and the
 * answer ending at its end of turn; else (a GPT-2 has no template of its
 * own) by a plain, documented one (docs/serving.md) that a base model
 * continues naturally:
 *
 *   <system text>\n\n          (each system or developer message)
 *   User: <text>\n             (each user message)
 *   Assistant: <text>\n        (each earlier answer)
 *   Assistant:                 (the model writes from here)
 *
 * and the answer ends where the model starts the next turn ("\nUser:", a
 * stop sequence the request gets beside its own). */
#include "serve_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status serve_chat_prompt(const cJSON *messages, dt_chat_kind chat, const dt_chat_kwargs *kw, char **out, size_t *out_len) {
    const dt_chat_template *t = dt_chat_template_of(chat);
    dt_chat_kwargs k = *kw;
    char today[32];
    if (t && !k.date && t->today) dt_chat_today(today), k.date = today; /* (Llama 3.2's: its template's strftime_now) */
    if (t) return dt_chat_prompt(t, messages, &k, out, out_len);
    *out = NULL;
    *out_len = 0;
    if (dt_chat_has_tools(kw->tools)) return dt_error(DT_ERR_ARG, "'tools': dtrain's plain chat template renders no tool calls");
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return dt_error(DT_ERR_ARG, "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    char *buf = NULL;
    size_t len = 0, cap = 0;
    dt_status st = DT_OK;
    int i = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, messages) {
        const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        const char *role = cJSON_IsString(r) ? r->valuestring : "";
        bool system = !strcmp(role, "system") || !strcmp(role, "developer");
        const char *head = system ? "" : !strcmp(role, "user") ? "User: " : !strcmp(role, "assistant") ? "Assistant: " : NULL;
        if (!head) {
            st = dt_error(DT_ERR_ARG, "'messages' [%d]: role '%s': this server takes system, developer, user and assistant", i, role);
            break;
        }
        if ((st = dt_chat_append(&buf, &len, &cap, head, strlen(head))) || (st = dt_chat_message_text(c, i, &buf, &len, &cap))) break;
        if ((st = dt_chat_append(&buf, &len, &cap, system ? "\n\n" : "\n", system ? 2 : 1))) break;
        i++;
    }
    if (!st) st = dt_chat_append(&buf, &len, &cap, "Assistant:", 10);
    if (st) {
        free(buf);
        return st;
    }
    *out = buf;
    *out_len = len;
    return DT_OK;
}
