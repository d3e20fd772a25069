/* Tool calls in Llama 3.1's and 3.2's templates (and Llama 3.1's built-in tools: builtin_tools named after
 * "Environment: ipython" in its system turn, code_interpreter's name left out, each call of one written
 * <|python_tag|>NAME.call(ARG="VALUE", ...), and with them given every calling answer ends <|eom_id|>, the template's
 * "ipython mode"): with tools the system turn opens
 * with "Environment: ipython", and the tools, each as tojson(indent=4) writes it and a blank line, go before the first
 * user message's text in its turn (or, with tools_in_user_message false, in the system turn before the chat's system
 * message), after a text asking for a JSON call; an answer that calls a tool is that call alone, {"name": NAME,
 * "parameters": ARGS} (one call an answer, its content left out); a tool's result is an ipython turn holding its
 * content as tojson writes it (a text quoted). */
#include "chat_tools_internal.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define ASK_FORMAT "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.Do not use variables.\n\n"
#define ASK_USER "Given the following functions, please respond with a JSON for a function call with its proper arguments that best answers the given prompt.\n\n"
#define ASK_SYSTEM "You have access to the following functions. To call a function, please respond with JSON for a function call."

static dt_status put(char **buf, size_t *len, size_t *cap, const char *s) { return dt_chat_append(buf, len, cap, s, strlen(s)); }

/* The asking text and each tool, tojson(indent=4) and a blank line after it. */
static dt_status put_tools(const cJSON *tools, const char *ask, char **buf, size_t *len, size_t *cap) {
    dt_status st = put(buf, len, cap, ask);
    if (!st) st = put(buf, len, cap, ASK_FORMAT);
    int k = 0;
    for (const cJSON *tool = tools->child; !st && tool; tool = tool->next, k++) {
        if (!cJSON_IsObject(tool)) st = dt_error(DT_ERR_ARG, "'tools' [%d]: a tool is an object ({\"type\": \"function\", \"function\": {...}})", k);
        else if (!(st = dt_chat_tojson_indent(tool, 4, buf, len, cap))) st = put(buf, len, cap, "\n\n");
    }
    return st;
}

/* A text trimmed as the template's |trim does, appended. */
static dt_status put_trimmed(const dt_chat_template *t, const char *text, char **buf, size_t *len, size_t *cap) {
    const char *c;
    size_t n;
    dt_chat_content(t, text, &c, &n);
    return dt_chat_append(buf, len, cap, c, n);
}

dt_status dt_chat_json_tools_turn(const dt_chat_template *t, const cJSON *tools, const char *system, const cJSON *user, int i,
                                  const dt_chat_kwargs *kw, char **out, bool *with_user) {
    char head[96], pre[160], *buf = NULL, *text = NULL;
    size_t len = 0, cap = 0, tl = 0, tc = 0;
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(user, "role");
    *with_user = !kw->tools_in_system;
    if (*with_user && !(cJSON_IsString(r) && !strcmp(r->valuestring, "user")))
        return dt_error(DT_ERR_ARG, "'messages' [%d]: the %s template writes the tools into the first user message, and this is %s "
                        "(chat_template_kwargs {\"tools_in_user_message\": false} puts them in the system turn)", i, t->name,
                        user ? "not one" : "the end of the chat");
    snprintf(head, sizeof head, t->head, "system");
    snprintf(pre, sizeof pre, t->preamble, kw->date ? kw->date : t->date);
    dt_status st = put(&buf, &len, &cap, head);
    if (!st) st = kw->builtin ? dt_chat_builtin_line(kw->builtin, &buf, &len, &cap) : put(&buf, &len, &cap, "Environment: ipython\n");
    if (!st) st = put(&buf, &len, &cap, pre);
    if (!st && kw->tools_in_system) st = put_tools(tools, ASK_SYSTEM, &buf, &len, &cap);
    if (!st && system) st = put_trimmed(t, system, &buf, &len, &cap);
    if (!st) st = put(&buf, &len, &cap, t->end);
    if (!st && *with_user) {
        snprintf(head, sizeof head, t->head, "user");
        if (!(st = put(&buf, &len, &cap, head)) && !(st = put_tools(tools, ASK_USER, &buf, &len, &cap)))
            st = dt_chat_message_text(cJSON_GetObjectItemCaseSensitive(user, "content"), i, &text, &tl, &tc);
        if (!st && !(st = put_trimmed(t, text ? text : "", &buf, &len, &cap))) st = put(&buf, &len, &cap, t->end);
    }
    free(text);
    if (st) free(buf), buf = NULL;
    *out = buf;
    return st;
}

dt_status dt_chat_builtin_line(const cJSON *builtin, char **buf, size_t *len, size_t *cap) {
    dt_status st = put(buf, len, cap, "Environment: ipython\nTools: ");
    int k = 0;
    for (const cJSON *b = builtin->child; !st && b; b = b->next)
        if (strcmp(b->valuestring, "code_interpreter") && !(st = put(buf, len, cap, k++ ? ", " : ""))) st = put(buf, len, cap, b->valuestring);
    return st ? st : put(buf, len, cap, "\n\n");
}

/* Whether name is one of builtin's. */
static bool is_builtin(const cJSON *builtin, const char *name) {
    const cJSON *b;
    cJSON_ArrayForEach(b, builtin) if (!strcmp(b->valuestring, name)) return true;
    return false;
}

/* A built-in tool's call, NAME.call(ARG="VALUE", ...) after <|python_tag|> (the template joins text, so each value is
 * one). */
static dt_status builtin_call(const char *name, const cJSON *args, int i, char **buf, size_t *len, size_t *cap) {
    dt_status st = put(buf, len, cap, "<|python_tag|>");
    if (!st && !(st = put(buf, len, cap, name))) st = put(buf, len, cap, ".call(");
    for (const cJSON *a = args->child; !st && a; a = a->next) {
        if (!cJSON_IsString(a))
            return dt_error(DT_ERR_ARG, "'messages' [%d]: the built-in tool %s's argument '%s' is not a text: Llama 3.1's template "
                            "writes each as ARG=\"VALUE\"", i, name, a->string);
        if (!(st = put(buf, len, cap, a != args->child ? ", " : "")) && !(st = put(buf, len, cap, a->string)) &&
            !(st = put(buf, len, cap, "=\"")) && !(st = put(buf, len, cap, a->valuestring)))
            st = put(buf, len, cap, "\"");
    }
    return st ? st : put(buf, len, cap, ")");
}

dt_status dt_chat_json_tool_call(const cJSON *calls, const cJSON *builtin, int i, char **buf, size_t *len, size_t *cap) {
    if (cJSON_GetArraySize(calls) != 1)
        return dt_error(DT_ERR_ARG, "'messages' [%d]: %d tool calls in one answer: Llama 3.1's template writes one", i, cJSON_GetArraySize(calls));
    const char *name;
    const cJSON *args;
    cJSON *parsed;
    dt_status st = dt_chat_call_parts(calls->child, i, 0, &name, &args, &parsed);
    if (st) return st;
    (*buf)[*len = 0] = 0; /* (the call alone: the answer's content is not written) */
    if (builtin && is_builtin(builtin, name)) st = builtin_call(name, args, i, buf, len, cap);
    else if (!(st = put(buf, len, cap, "{\"name\": \"")) && !(st = put(buf, len, cap, name)) &&
             !(st = put(buf, len, cap, "\", \"parameters\": ")) && !(st = dt_chat_tojson(args, buf, len, cap)))
        st = put(buf, len, cap, "}");
    cJSON_Delete(parsed);
    return st;
}

dt_status dt_chat_json_tool_result(const dt_chat_template *t, const cJSON *m, int i, char **out) {
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    char head[96], *buf = NULL;
    size_t len = 0, cap = 0;
    *out = NULL;
    if (!cJSON_IsString(c) && !cJSON_IsArray(c) && !cJSON_IsObject(c))
        return dt_error(DT_ERR_ARG, "'messages' [%d]: a tool's result needs a 'content' (a text, or JSON)", i);
    snprintf(head, sizeof head, t->head, "ipython");
    dt_status st = put(&buf, &len, &cap, head);
    if (!st && !(st = dt_chat_tojson(c, &buf, &len, &cap))) st = put(&buf, &len, &cap, t->end);
    if (st) free(buf), buf = NULL;
    *out = buf;
    return st;
}
