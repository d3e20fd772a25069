/* A chat's generation prompt by a model's template (chat_template.c's pieces): what the server answers and what GRPO's
 * conversational prompts are completed from, as transformers' apply_chat_template(add_generation_prompt=True) renders
 * them. */
#include "dtrain/data.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_chat_append(char **buf, size_t *len, size_t *cap, const char *a, size_t n) {
    if (*len + n + 1 > *cap) {
        size_t c = (*len + n + 1) * 2;
        char *b = realloc(*buf, c);
        if (!b) return dt_error(DT_ERR_NOMEM, "out of memory for the chat prompt");
        *buf = b;
        *cap = c;
    }
    memcpy(*buf + *len, a, n);
    *len += n;
    (*buf)[*len] = 0;
    return DT_OK;
}

dt_status dt_chat_message_text(const cJSON *c, int i, char **buf, size_t *len, size_t *cap) {
    if (cJSON_IsString(c)) return dt_chat_append(buf, len, cap, c->valuestring, strlen(c->valuestring));
    const cJSON *part;
    if (!cJSON_IsArray(c))
        return dt_error(DT_ERR_ARG, "'messages' [%d]: 'content' must be a string or an array of text parts", i);
    cJSON_ArrayForEach(part, c) {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type"), *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsString(t) || strcmp(t->valuestring, "text") || !cJSON_IsString(x))
            return dt_error(DT_ERR_ARG, "'messages' [%d]: a content part of type '%s': text parts only are read", i,
                            cJSON_IsString(t) ? t->valuestring : "?");
        dt_status st = dt_chat_append(buf, len, cap, x->valuestring, strlen(x->valuestring));
        if (st) return st;
    }
    return DT_OK;
}

/* The template's own system turn (Qwen 2.5's where the chat has none, Llama 3.1's always: its date kw's, else the
 * template's own; with tools the turns that hold them); *skip: the chat's first messages written in it. */
static dt_status system_turn(const dt_chat_template *t, const cJSON *messages, const dt_chat_kwargs *kw, char **buf, size_t *len,
                             size_t *cap, int *skip) {
    char *sys0 = NULL, *sys = NULL;
    size_t n0 = 0, c0 = 0;
    *skip = 0;
    if (dt_chat_has_tools(kw->tools)) {
        dt_status st = dt_chat_tools_turn(t, messages, kw, &sys, skip);
        if (!st) st = dt_chat_append(buf, len, cap, sys, strlen(sys));
        free(sys);
        return st;
    }
    const cJSON *m0 = cJSON_GetArrayItem(messages, 0), *r0 = cJSON_GetObjectItemCaseSensitive(m0, "role");
    bool system0 = cJSON_IsString(r0) && (!strcmp(r0->valuestring, "system") || !strcmp(r0->valuestring, "developer"));
    /* (its text matters only to a template that writes it into its own turn; the others write it as any message) */
    dt_status st = system0 && t->preamble ? dt_chat_message_text(cJSON_GetObjectItemCaseSensitive(m0, "content"), 0, &sys0, &n0, &c0) : DT_OK;
    if (!st) st = dt_chat_system_turn(t, system0 ? (sys0 ? sys0 : "") : NULL, kw, &sys);
    if (!st && sys) st = dt_chat_append(buf, len, cap, sys, strlen(sys));
    *skip = system0 && sys && t->preamble;
    free(sys0), free(sys);
    return st;
}

/* Message i (m, of n) by the template: its head, content (an answer's as dt_chat_answer writes it, with its tool
 * calls; training: with its think block whatever its place, as the training form writes it), end and what follows;
 * a tool's result as dt_chat_tool_result. */
static dt_status message(const dt_chat_template *t, const cJSON *messages, const cJSON *m, int i, int n, int last_query,
                         const dt_chat_kwargs *kw, char **buf, size_t *len, size_t *cap) {
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(m, "role"), *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    const char *role = cJSON_IsString(r) ? r->valuestring : "";
    const cJSON *calls = cJSON_GetObjectItemCaseSensitive(m, "tool_calls"), *reasoning = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    bool answer = !strcmp(role, "assistant"), calling = answer && dt_chat_has_tools(calls);
    char *text = NULL, *answered = NULL, head[96];
    size_t tl = 0, tc = 0, an;
    if (!strcmp(role, "developer")) role = "system"; /* OpenAI's newer name */
    if (!strcmp(role, "tool")) {
        dt_status st = dt_chat_tool_result(t, messages, m, i, &text);
        if (!st) st = dt_chat_append(buf, len, cap, text, strlen(text));
        free(text);
        return st;
    }
    if (strcmp(role, "system") && strcmp(role, "user") && !answer)
        return dt_error(DT_ERR_ARG, "'messages' [%d]: role '%s': a chat's roles are system, developer, user, assistant and tool", i, role);
    const char *a;
    snprintf(head, sizeof head, t->head, role);
    /* (an answer that calls tools may have no content: OpenAI's null) */
    dt_status st = calling && (!c || cJSON_IsNull(c)) ? dt_chat_append(&text, &tl, &tc, "", 0) : dt_chat_message_text(c, i, &text, &tl, &tc);
    if (!st && answer)
        st = dt_chat_answer(t, text ? text : "", cJSON_IsString(reasoning) ? reasoning->valuestring : NULL, calling ? calls : NULL,
                            kw->builtin, i, kw->training ? DT_CHAT_BLOCK : dt_chat_prompt_block(i, n, last_query), &answered);
    if (!st && answered) a = answered, an = strlen(answered);
    else if (!st) dt_chat_content(t, text ? text : "", &a, &an);
    if (!st) st = dt_chat_append(buf, len, cap, head, strlen(head));
    if (!st) st = dt_chat_append(buf, len, cap, a, an);
    const char *end = dt_chat_answer_end(t, kw, calling);
    if (!st) st = dt_chat_append(buf, len, cap, end, strlen(end));
    if (!st) st = dt_chat_append(buf, len, cap, t->after, strlen(t->after));
    free(text), free(answered);
    return st;
}

/* By the template t: its beginning, its own system turn, each message, the assistant's head last (Qwen 3's: an
 * answer's think block only after the last user query, and with thinking off an empty one to start). */
static dt_status render(const dt_chat_template *t, const cJSON *messages, const dt_chat_kwargs *kw, char **buf, size_t *len, size_t *cap) {
    dt_status st = dt_chat_append(buf, len, cap, t->begin, strlen(t->begin));
    int i = 0, n = cJSON_GetArraySize(messages), last_query = dt_chat_last_query(messages);
    const cJSON *m;
    int skip = 0;
    if (!st) st = system_turn(t, messages, kw, buf, len, cap, &skip);
    cJSON_ArrayForEach(m, messages) {
        if (!st && i >= skip) st = message(t, messages, m, i, n, last_query, kw, buf, len, cap);
        i++;
    }
    char head[96];
    snprintf(head, sizeof head, t->head, "assistant");
    if (!st) st = dt_chat_append(buf, len, cap, head, strlen(head));
    if (!st && t->no_think && !kw->thinking) st = dt_chat_append(buf, len, cap, t->no_think, strlen(t->no_think));
    return st;
}

/* Whether a is a list of texts (built-in tools' names). */
static bool names(const cJSON *a) {
    const cJSON *x;
    if (!cJSON_IsArray(a)) return false;
    cJSON_ArrayForEach(x, a) if (!cJSON_IsString(x)) return false;
    return true;
}

dt_status dt_chat_kwargs_read(const cJSON *o, dt_chat_kwargs *kw) {
    *kw = (dt_chat_kwargs){ .thinking = true };
    if (!o || cJSON_IsNull(o)) return DT_OK;
    if (!cJSON_IsObject(o)) return dt_error(DT_ERR_ARG, "must be an object");
    for (const cJSON *f = o->child; f; f = f->next) {
        if (!strcmp(f->string, "enable_thinking") && cJSON_IsBool(f)) kw->thinking = cJSON_IsTrue(f);
        else if (!strcmp(f->string, "date_string") && cJSON_IsString(f) && strlen(f->valuestring) < 64) kw->date = f->valuestring;
        else if (!strcmp(f->string, "tools_in_user_message") && cJSON_IsBool(f)) kw->tools_in_system = cJSON_IsFalse(f);
        else if (!strcmp(f->string, "builtin_tools") && names(f)) kw->builtin = f;
        else
            return dt_error(DT_ERR_ARG, "holds '%s': enable_thinking (true or false), date_string (a text of at most 63 bytes), "
                            "tools_in_user_message (true or false) and builtin_tools (a list of names) are read, nothing else", f->string);
    }
    return DT_OK;
}

dt_status dt_chat_prompt(const dt_chat_template *t, const cJSON *messages, const dt_chat_kwargs *kw, char **out, size_t *len) {
    *out = NULL;
    *len = 0;
    if (!cJSON_IsArray(messages) || cJSON_GetArraySize(messages) == 0)
        return dt_error(DT_ERR_ARG, "'messages' must be a non-empty array of {\"role\", \"content\"} objects");
    char *buf = NULL;
    size_t n = 0, cap = 0;
    dt_status st = dt_chat_builtin_check(t, kw);
    if (!st) st = render(t, messages, kw, &buf, &n, &cap);
    if (st) free(buf);
    else *out = buf, *len = n;
    return st;
}
