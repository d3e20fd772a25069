/* Chat templates, a documented subset rendered here rather than by a Jinja engine (none is packaged for C): each is
 * the text before the first message, a turn's head (by role), the end of a turn (which an assistant's answer ends
 * with: what training scores and serving stops at) and what follows it.
 *   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n
 *   llama3  <|begin_of_text|>, then <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> (CONTENT trimmed)
 *   qwen3   ChatML with Qwen 3's think block in an assistant's answer: <think>\nREASONING\n</think>\n\nCONTENT, the
 *           reasoning a message's reasoning_content or its content's part before </think>. For generation (Qwen 3's
 *           own template) answers before the last user query drop their reasoning, and the generation prompt ends with
 *           an empty think block when thinking is off (enable_thinking false); for training (TRL's training form of
 *           it) every answer has its block, and the answer's scored part runs from <think> to the newline after
 *           <|im_end|>.
 *   qwen2.5 ChatML with Qwen 2.5's system turn where a chat has none; for training (TRL's training form) an answer's
 *           scored part runs from the newline after its head's role to the newline after <|im_end|>.
 * Which one a model has: its tokenizer_config.json's chat_template, recognised by its markers. */
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Qwen 2.5's system turn where a chat has none (its template writes it) */
#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
static const dt_chat_template templates[] = {
    [DT_CHAT_CHATML] = { "ChatML", "", "<|im_start|>%s\n", "<|im_end|>", "\n", NULL, NULL, 0, 0, 0 },
    [DT_CHAT_LLAMA3] = { "Llama 3", "<|begin_of_text|>", "<|start_header_id|>%s<|end_header_id|>\n\n", "<|eot_id|>", "", NULL, NULL, 1, 0, 0 },
    [DT_CHAT_QWEN3] = { "Qwen 3 (thinking; its reasoning in reasoning_content)", "", "<|im_start|>%s\n", "<|im_end|>", "\n", "<think>\n\n</think>\n\n", NULL, 0, 1, 0 },
    [DT_CHAT_QWEN25] = { "Qwen 2.5", "", "<|im_start|>%s\n", "<|im_end|>", "\n", NULL, QWEN25_SYSTEM, 0, 1, 1 },
};

const dt_chat_template *dt_chat_template_of(dt_chat_kind k) {
    return k == DT_CHAT_CHATML || k == DT_CHAT_LLAMA3 || k == DT_CHAT_QWEN3 || k == DT_CHAT_QWEN25 ? &templates[k] : NULL;
}

dt_status dt_chat_kind_parse(const char *name, dt_chat_kind *out) {
    if (!strcmp(name, "chatml")) *out = DT_CHAT_CHATML;
    else if (!strcmp(name, "llama3")) *out = DT_CHAT_LLAMA3;
    else if (!strcmp(name, "qwen3")) *out = DT_CHAT_QWEN3;
    else if (!strcmp(name, "qwen2.5")) *out = DT_CHAT_QWEN25;
    else if (!strcmp(name, "none")) *out = DT_CHAT_NONE;
    else return dt_error(DT_ERR_ARG, "chat template \"%s\": this build renders chatml, llama3, qwen3 and qwen2.5 (or none: prompt and completion only)", name);
    return DT_OK;
}

dt_status dt_chat_kind_of_template(const char *jinja, const char *where, dt_chat_kind *out) {
    if (strstr(jinja, "<|im_start|>") && strstr(jinja, "<think>")) *out = DT_CHAT_QWEN3;
    else if (strstr(jinja, "<|im_start|>") && strstr(jinja, QWEN25_SYSTEM)) *out = DT_CHAT_QWEN25;
    else if (strstr(jinja, "<|im_start|>")) *out = DT_CHAT_CHATML;
    else if (strstr(jinja, "<|start_header_id|>")) *out = DT_CHAT_LLAMA3;
    else return dt_error(DT_ERR_UNSUPPORTED, "%s: a chat_template this build cannot render (it renders chatml's, llama3's, qwen3's and qwen2.5's): "
                         "name one with --chat-template chatml|llama3|qwen3|qwen2.5", where);
    return DT_OK;
}

/* [*a, *b) with the newlines at its start (lead) and its end (tail) left out, as Python's lstrip/rstrip('\n'). */
static void strip_newlines(const char **a, const char **b, bool lead, bool tail) {
    while (lead && *a < *b && **a == '\n') (*a)++;
    while (tail && *b > *a && (*b)[-1] == '\n') (*b)--;
}

/* The last occurrence of needle in [a, b), or NULL. */
static const char *last_in(const char *a, const char *b, const char *needle) {
    const char *found = NULL;
    for (const char *p = a; (p = strstr(p, needle)) && p + strlen(needle) <= b; p++) found = p;
    return found;
}

dt_status dt_chat_answer(const dt_chat_template *t, const char *content, const char *reasoning, int block, char **out) {
    const char *c = content, *ce = content + strlen(content), *r = "", *re = r;
    if (!t->no_think) {
        size_t n;
        dt_chat_content(t, content, &c, &n);
        ce = c + n;
    } else if (reasoning) {
        r = reasoning, re = reasoning + strlen(reasoning);
    } else if (strstr(content, "</think>")) {
        /* the reasoning: before the first </think>, after the last <think> there; the content: after the last </think> */
        const char *end = strstr(content, "</think>"), *open;
        r = content, re = end;
        strip_newlines(&r, &re, false, true);
        if ((open = last_in(r, re, "<think>"))) r = open + strlen("<think>");
        strip_newlines(&r, &re, true, false);
        c = last_in(content, ce, "</think>") + strlen("</think>");
        strip_newlines(&c, &ce, true, false);
    }
    bool with = t->no_think && (block == DT_CHAT_BLOCK || (block == DT_CHAT_BLOCK_IF_REASONING && re > r));
    if (with) strip_newlines(&r, &re, true, true), strip_newlines(&c, &ce, true, false);
    size_t n = (size_t)(ce - c) + (with ? (size_t)(re - r) + strlen("<think>\n\n</think>\n\n") : 0);
    char *o = malloc(n + 1);
    if (!o) return dt_error(DT_ERR_NOMEM, "out of memory for a chat answer");
    if (with) snprintf(o, n + 1, "<think>\n%.*s\n</think>\n\n%.*s", (int)(re - r), r, (int)(ce - c), c);
    else memcpy(o, c, (size_t)(ce - c)), o[ce - c] = 0;
    *out = o;
    return DT_OK;
}

int dt_chat_prompt_block(int i, int n, int last_query) {
    return i <= last_query ? DT_CHAT_NO_BLOCK : i == n - 1 ? DT_CHAT_BLOCK : DT_CHAT_BLOCK_IF_REASONING;
}

int dt_chat_last_query(const cJSON *messages) {
    int n = cJSON_GetArraySize(messages);
    for (int i = n - 1; i >= 0; i--) {
        const cJSON *m = cJSON_GetArrayItem(messages, i), *role = cJSON_GetObjectItemCaseSensitive(m, "role"),
                    *c = cJSON_GetObjectItemCaseSensitive(m, "content");
        if (!cJSON_IsString(role) || strcmp(role->valuestring, "user")) continue;
        if (!cJSON_IsString(c)) return i; /* (text parts: a query, as a server joins them into the text the template reads) */
        size_t len = strlen(c->valuestring);
        bool tool = !strncmp(c->valuestring, "<tool_response>", 15) && len >= 16 && !strcmp(c->valuestring + len - 16, "</tool_response>");
        if (!tool) return i;
    }
    return n - 1;
}

void dt_chat_content(const dt_chat_template *t, const char *c, const char **start, size_t *n) {
    size_t len = strlen(c), i = 0;
    while (t->trim && i < len && isspace((unsigned char)c[i])) i++;
    while (t->trim && len > i && isspace((unsigned char)c[len - 1])) len--;
    *start = c + i, *n = len - i;
}

dt_status dt_tokenizer_config_read(const char *tokenizer_json, dt_bpe *tok, dt_chat_kind *chat, int *eos) {
    char path[4200], *text = NULL;
    const char *slash = strrchr(tokenizer_json, '/');
    snprintf(path, sizeof path, "%.*stokenizer_config.json", slash ? (int)(slash - tokenizer_json + 1) : 0, tokenizer_json);
    if (dt_file_read_text(path, 1 << 24, &text, NULL)) return DT_OK; /* none: no template, no end-of-text */
    cJSON *j = cJSON_Parse(text);
    free(text);
    if (!j) return dt_error(DT_ERR_IO, "%s: not JSON", path);
    const cJSON *tmpl = cJSON_GetObjectItemCaseSensitive(j, "chat_template"), *e = cJSON_GetObjectItemCaseSensitive(j, "eos_token");
    if (cJSON_IsObject(e)) e = cJSON_GetObjectItemCaseSensitive(e, "content");
    dt_status st = DT_OK;
    char where[4300];
    snprintf(where, sizeof where, "%s: \"chat_template\"", path);
    if (chat && *chat == DT_CHAT_NONE && cJSON_IsString(tmpl)) st = dt_chat_kind_of_template(tmpl->valuestring, where, chat);
    if (!st && eos && cJSON_IsString(e) && tok) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        st = dt_bpe_encode(tok, e->valuestring, strlen(e->valuestring), &ids, &n, &cap);
        if (!st && n != 1) st = dt_error(DT_ERR_IO, "%s: \"eos_token\" \"%s\" is not one token", path, e->valuestring);
        if (!st) *eos = (int)ids[0];
        free(ids);
    }
    cJSON_Delete(j);
    return st;
}
