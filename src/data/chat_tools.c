/* Tool calls in Qwen 2.5's and Qwen 3's templates (and TRL's training forms of them): the tools in the system turn
 * (after the chat's system message, or Qwen 2.5's default text, and a blank line; each tool a line of JSON as tojson
 * writes it), an answer's calls as "<tool_call>\n{"name": NAME, "arguments": JSON}\n</tool_call>" after its content,
 * and the tools' results as "<tool_response>" blocks, consecutive ones in one user turn. The server's prompts,
 * supervised fine-tuning's rows and DPO's pairs are rendered by these, which hand Llama 3.1's form to
 * chat_tools_json.c. */
#include "chat_tools_internal.h"
#include "io/json_text.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TOOLS_HEAD                                                                                                          \
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "      \
    "signatures within <tools></tools> XML tags:\n<tools>"
#define TOOLS_TAIL                                                                                                          \
    "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "                 \
    "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"  \
    "</tool_call>"

static dt_status put(char **buf, size_t *len, size_t *cap, const char *s) { return dt_chat_append(buf, len, cap, s, strlen(s)); }

bool dt_chat_has_tools(const cJSON *tools) { return cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0; }

const cJSON *dt_chat_line_tools(const cJSON *line, cJSON **parsed, bool *bad) {
    const cJSON *tools = cJSON_GetObjectItemCaseSensitive(line, "tools");
    *parsed = cJSON_IsString(tools) ? dt_json_parse_whole(tools->valuestring) : NULL;
    if (*parsed) tools = *parsed;
    *bad = tools && !cJSON_IsNull(tools) && !cJSON_IsArray(tools);
    return cJSON_IsArray(tools) ? tools : NULL;
}

dt_status dt_chat_tools_check(const dt_chat_template *t, const char *what) {
    if (t->tools) return DT_OK;
    return dt_error(DT_ERR_ARG, "%s: the %s template renders no tool calls in this build (Qwen 2.5's, Qwen 3's, Llama 3.1's and "
                    "3.2's do)", what, t->name);
}

/* Qwen's system turn with the tools (system: the chat's system message, NULL: none). */
static dt_status hermes_turn(const dt_chat_template *t, const cJSON *tools, const char *system, char **out) {
    char head[96], *buf = NULL;
    size_t len = 0, cap = 0;
    snprintf(head, sizeof head, t->head, "system");
    const char *before = system ? system : t->default_system;
    dt_status st = put(&buf, &len, &cap, head);
    if (!st && before && !(st = put(&buf, &len, &cap, before))) st = put(&buf, &len, &cap, "\n\n");
    if (!st) st = put(&buf, &len, &cap, TOOLS_HEAD);
    int k = 0;
    for (const cJSON *tool = tools->child; !st && tool; tool = tool->next, k++) {
        if (!cJSON_IsObject(tool)) st = dt_error(DT_ERR_ARG, "'tools' [%d]: a tool is an object ({\"type\": \"function\", \"function\": {...}})", k);
        else if (!(st = put(&buf, &len, &cap, "\n"))) st = dt_chat_tojson(tool, &buf, &len, &cap);
    }
    if (!st && !(st = put(&buf, &len, &cap, TOOLS_TAIL)) && !(st = put(&buf, &len, &cap, t->end))) st = put(&buf, &len, &cap, t->after);
    if (st) free(buf), buf = NULL;
    *out = buf;
    return st;
}

dt_status dt_chat_tools_turn(const dt_chat_template *t, const cJSON *messages, const dt_chat_kwargs *kw, char **out, int *used) {
    const cJSON *m = messages->child, *r = cJSON_GetObjectItemCaseSensitive(m, "role");
    bool system0 = cJSON_IsString(r) && (!strcmp(r->valuestring, "system") || !strcmp(r->valuestring, "developer"));
    char *system = NULL;
    size_t n = 0, cap = 0;
    bool with_user = false;
    *out = NULL, *used = 0;
    dt_status st = dt_chat_tools_check(t, "'tools'");
    if (!st && system0 && !(st = dt_chat_message_text(cJSON_GetObjectItemCaseSensitive(m, "content"), 0, &system, &n, &cap)) && !system)
        st = dt_chat_append(&system, &n, &cap, "", 0);
    if (!st && t->tools == DT_CHAT_TOOLS_JSON)
        st = dt_chat_json_tools_turn(t, kw->tools, system, system0 ? m->next : m, system0, kw, out, &with_user);
    else if (!st) st = hermes_turn(t, kw->tools, system, out);
    if (!st) *used = system0 + with_user;
    free(system);
    return st;
}

dt_status dt_chat_call_parts(const cJSON *call, int i, int k, const char **name, const cJSON **args, cJSON **parsed) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(call, "function");
    f = f ? f : call;
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f, "name"), *a = cJSON_GetObjectItemCaseSensitive(f, "arguments");
    /* the arguments' JSON text parsed, as vLLM passes them to the template */
    *parsed = cJSON_IsString(a) ? dt_json_parse_whole(a->valuestring) : NULL;
    if (!cJSON_IsString(nm) || !(cJSON_IsObject(a) || cJSON_IsObject(*parsed))) {
        cJSON_Delete(*parsed), *parsed = NULL;
        return dt_error(DT_ERR_ARG, "'messages' [%d]: tool call %d needs a function's \"name\" and its \"arguments\" (an object, or "
                        "its JSON text)", i, k);
    }
    *name = nm->valuestring, *args = *parsed ? *parsed : a;
    return DT_OK;
}

/* Whether an answer has content beside its calls (Qwen 3's: after its think block, the newlines after it left out). */
static bool has_content(const dt_chat_template *t, const char *text) {
    const char *end = t->no_think ? strstr(text, "</think>") : NULL, *c = text;
    for (const char *p = end; p && (p = strstr(p, "</think>")); p++) c = p + strlen("</think>");
    while (end && *c == '\n') c++;
    return *c != 0;
}

dt_status dt_chat_tool_calls(const dt_chat_template *t, const char *content, const cJSON *calls, const cJSON *builtin, int i, char **buf,
                             size_t *len, size_t *cap) {
    char what[40];
    snprintf(what, sizeof what, "'messages' [%d]", i);
    dt_status st = dt_chat_tools_check(t, what);
    if (!st && t->tools == DT_CHAT_TOOLS_JSON) return dt_chat_json_tool_call(calls, builtin, i, buf, len, cap);
    bool newline = has_content(t, content);
    int k = 0;
    for (const cJSON *c = calls->child; !st && c; c = c->next, k++) {
        const char *name;
        const cJSON *args;
        cJSON *parsed;
        if ((st = dt_chat_call_parts(c, i, k, &name, &args, &parsed))) return st;
        if (newline || k) st = put(buf, len, cap, "\n");
        if (!st && !(st = put(buf, len, cap, "<tool_call>\n{\"name\": \"")) && !(st = put(buf, len, cap, name)) &&
            !(st = put(buf, len, cap, "\", \"arguments\": ")) && !(st = dt_chat_tojson(args, buf, len, cap)))
            st = put(buf, len, cap, "}\n</tool_call>");
        cJSON_Delete(parsed);
    }
    return st;
}

dt_status dt_chat_tool_result(const dt_chat_template *t, const cJSON *messages, const cJSON *m, int i, char **out) {
    const cJSON *r;
    bool first = m == messages->child || !cJSON_IsString(r = cJSON_GetObjectItemCaseSensitive(m->prev, "role")) || strcmp(r->valuestring, "tool");
    bool last = !m->next || !cJSON_IsString(r = cJSON_GetObjectItemCaseSensitive(m->next, "role")) || strcmp(r->valuestring, "tool");
    char head[96], what[40], *buf = NULL;
    size_t len = 0, cap = 0;
    snprintf(head, sizeof head, t->head, "user");
    snprintf(what, sizeof what, "'messages' [%d]", i);
    dt_status st = dt_chat_tools_check(t, what);
    if (!st && t->tools == DT_CHAT_TOOLS_JSON) return dt_chat_json_tool_result(t, m, i, out);
    if (!st && first) st = dt_chat_append(&buf, &len, &cap, head, strlen(head) - 1); /* (its newline each result's) */
    if (!st) st = put(&buf, &len, &cap, "\n<tool_response>\n");
    if (!st) st = dt_chat_message_text(cJSON_GetObjectItemCaseSensitive(m, "content"), i, &buf, &len, &cap);
    if (!st) st = put(&buf, &len, &cap, "\n</tool_response>");
    if (!st && last && !(st = put(&buf, &len, &cap, t->end))) st = put(&buf, &len, &cap, t->after);
    if (st) free(buf), buf = NULL;
    *out = buf;
    return st;
}

dt_status dt_chat_tool_suffix(const dt_chat_template *t, const cJSON *results, const dt_chat_kwargs *kw, char **out) {
    cJSON *msgs = cJSON_CreateArray(), *m;
    char head[96], *buf = NULL, *turn = NULL;
    size_t len = 0, cap = 0;
    dt_status st = msgs ? dt_chat_tools_check(t, "tool results") : dt_error(DT_ERR_NOMEM, "out of memory");
    /* the answer that called them first, so that the first result opens its turn as after an answer */
    if (!st) cJSON_AddItemToArray(msgs, cJSON_CreateObject());
    cJSON_ArrayForEach(m, results) if (!st) cJSON_AddItemToArray(msgs, cJSON_Duplicate(m, true));
    if (!st) st = put(&buf, &len, &cap, t->after);
    int i = 1;
    for (const cJSON *r = msgs->child ? msgs->child->next : NULL; !st && r; r = r->next, i++) {
        if (!(st = dt_chat_tool_result(t, msgs, r, i, &turn))) st = put(&buf, &len, &cap, turn);
        free(turn), turn = NULL;
    }
    snprintf(head, sizeof head, t->head, "assistant");
    if (!st) st = put(&buf, &len, &cap, head);
    if (!st && t->no_think && !kw->thinking) st = put(&buf, &len, &cap, t->no_think);
    cJSON_Delete(msgs);
    if (st) free(buf), buf = NULL;
    *out = buf;
    return st;
}
