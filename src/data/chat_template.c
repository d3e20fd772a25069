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
 *   qwen2, smollm2  ChatML with Qwen 2's (Qwen2-Instruct's) or SmolLM2-Instruct's system turn where a chat has none
 *           (TRL has no training form of either: an answer is scored as ChatML's).
 *   llama3.1, llama3.2  Llama 3 with a system turn always, opening with the knowledge cut-off and the date, then the
 *           chat's system message (trimmed) if any. The date: Llama 3.1's template's own (26 Jul 2024); Llama 3.2's
 *           writes today's where it can (transformers' strftime_now), which the server does (a request's
 *           chat_template_kwargs.date_string instead), while training writes the template's own fallback, the same
 *           date, so that a data set tokenizes alike every day (TRL has no training form of either: scored as Llama 3).
 *           With tools (chat_tools_json.c) their JSON calls; Qwen 2.5's and 3's Hermes calls (chat_tools.c).
 * Which one a model has: its tokenizer_config.json's chat_template, recognised by its markers. */
#include "chat_tools_internal.h"
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* the system turns written where a chat has none, as each template writes them */
#define QWEN25_SYSTEM "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
#define QWEN2_SYSTEM "You are a helpful assistant."
#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
/* Llama 3.1's and 3.2's system turn opens so; the date where the template names none (3.1's own, 3.2's fallback) */
#define LLAMA31_PREAMBLE "Cutting Knowledge Date: December 2023\nToday Date: %s\n\n"
#define LLAMA31_DATE "26 Jul 2024"
#define CHATML_PIECES .begin = "", .head = "<|im_start|>%s\n", .end = "<|im_end|>", .after = "\n"
#define LLAMA3_PIECES .begin = "<|begin_of_text|>", .head = "<|start_header_id|>%s<|end_header_id|>\n\n", .end = "<|eot_id|>", .after = "", .trim = 1
static const dt_chat_template templates[] = {
    [DT_CHAT_CHATML] = { .kind = "chatml", .name = "ChatML", CHATML_PIECES },
    [DT_CHAT_LLAMA3] = { .kind = "llama3", .name = "Llama 3", LLAMA3_PIECES },
    [DT_CHAT_QWEN3] = { .kind = "qwen3", .name = "Qwen 3 (thinking; its reasoning in reasoning_content)", CHATML_PIECES,
                        .no_think = "<think>\n\n</think>\n\n", .after_scored = 1, .tools = DT_CHAT_TOOLS_HERMES },
    [DT_CHAT_QWEN25] = { .kind = "qwen2.5", .name = "Qwen 2.5", CHATML_PIECES, .default_system = QWEN25_SYSTEM, .after_scored = 1,
                         .head_nl_scored = 1, .tools = DT_CHAT_TOOLS_HERMES },
    [DT_CHAT_LLAMA31] = { .kind = "llama3.1", .name = "Llama 3.1", LLAMA3_PIECES, .preamble = LLAMA31_PREAMBLE, .date = LLAMA31_DATE, .tools = DT_CHAT_TOOLS_JSON,
                          .builtin = 1 },
    [DT_CHAT_LLAMA32] = { .kind = "llama3.2", .name = "Llama 3.2", LLAMA3_PIECES, .preamble = LLAMA31_PREAMBLE, .date = LLAMA31_DATE, .today = 1, .tools = DT_CHAT_TOOLS_JSON },
    [DT_CHAT_QWEN2] = { .kind = "qwen2", .name = "Qwen 2", CHATML_PIECES, .default_system = QWEN2_SYSTEM },
    [DT_CHAT_SMOLLM2] = { .kind = "smollm2", .name = "SmolLM2", CHATML_PIECES, .default_system = SMOLLM2_SYSTEM },
};
#define KINDS (sizeof templates / sizeof *templates)
#define KIND_NAMES "chatml, llama3, llama3.1, llama3.2, qwen3, qwen2.5, qwen2 and smollm2"

/* How a template is recognised: the first row whose markers are all in it (a more particular row before the one it
 * extends; a default system turn with what ends it, so that a mention elsewhere does not count). */
static const struct { dt_chat_kind kind; const char *marks[3]; } recognised[] = {
    { DT_CHAT_QWEN3, { "<|im_start|>", "<think>" } },
    { DT_CHAT_QWEN25, { "<|im_start|>", QWEN25_SYSTEM } },
    { DT_CHAT_SMOLLM2, { "<|im_start|>", SMOLLM2_SYSTEM "<|im_end|>" } },
    { DT_CHAT_QWEN2, { "<|im_start|>", QWEN2_SYSTEM "<|im_end|>" } },
    { DT_CHAT_CHATML, { "<|im_start|>" } },
    { DT_CHAT_LLAMA32, { "<|start_header_id|>", "Cutting Knowledge Date", "strftime_now" } },
    { DT_CHAT_LLAMA31, { "<|start_header_id|>", "Cutting Knowledge Date" } },
    { DT_CHAT_LLAMA3, { "<|start_header_id|>" } },
};

const dt_chat_template *dt_chat_template_of(dt_chat_kind k) {
    return k > DT_CHAT_NONE && (size_t)k < KINDS ? &templates[k] : NULL;
}

dt_status dt_chat_kind_parse(const char *name, dt_chat_kind *out) {
    if (!strcmp(name, "none")) return *out = DT_CHAT_NONE, DT_OK;
    for (size_t k = 1; k < KINDS; k++)
        if (!strcmp(name, templates[k].kind)) return *out = (dt_chat_kind)k, DT_OK;
    return dt_error(DT_ERR_ARG, "chat template \"%s\": this build renders " KIND_NAMES " (or none: prompt and completion only)", name);
}

/* The text of a ChatML system turn a template writes from a literal of its own ('<|im_start|>system\nTEXT<|im_end|>',
 * its newline escaped or not), as templates write a default where a chat has none; false where it writes none. */
static bool chatml_own_system(const char *jinja, const char **text, int *n) {
    static const char open[] = "<|im_start|>system";
    for (const char *p = jinja; (p = strstr(p, open)); p++) {
        char quote = p > jinja ? p[-1] : 0;
        const char *s = p + strlen(open);
        s += !strncmp(s, "\\n", 2) ? 2 : *s == '\n';
        const char *end = strstr(s, "<|im_end|>"), *q = quote == '\'' || quote == '"' ? strchr(s, quote) : NULL;
        if (q && end && end < q && end > s) return *text = s, *n = (int)(end - s), true; /* one literal up to the turn's end */
    }
    return false;
}

dt_status dt_chat_kind_of_template(const char *jinja, const char *where, dt_chat_kind *out) {
    for (size_t i = 0; i < sizeof recognised / sizeof *recognised; i++) {
        bool all = true;
        for (int m = 0; m < 3 && recognised[i].marks[m]; m++) all = all && strstr(jinja, recognised[i].marks[m]);
        if (!all) continue;
        const char *own;
        int n;
        /* plain ChatML writes no system turn of its own: one it would silently leave out is said */
        if (recognised[i].kind == DT_CHAT_CHATML && chatml_own_system(jinja, &own, &n))
            return dt_error(DT_ERR_UNSUPPORTED, "%s: a ChatML template that writes its own system turn (\"%.*s\") where a chat has "
                            "none, which this build does not render (it knows Qwen 2's, Qwen 2.5's and SmolLM2's): --chat-template "
                            "chatml renders the chats without it", where, n > 200 ? 200 : n, own);
        return *out = recognised[i].kind, DT_OK;
    }
    return dt_error(DT_ERR_UNSUPPORTED, "%s: a chat_template this build cannot render (it renders " KIND_NAMES "): name one with "
                    "--chat-template", where);
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

dt_status dt_chat_answer(const dt_chat_template *t, const char *content, const char *reasoning, const cJSON *calls, const cJSON *builtin,
                         int i, int block, char **out) {
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
    size_t len = n, cap = n + 1;
    dt_status st = dt_chat_has_tools(calls) ? dt_chat_tool_calls(t, content, calls, builtin, i, &o, &len, &cap) : DT_OK;
    if (st) free(o), o = NULL;
    *out = o;
    return st;
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

dt_status dt_chat_system_turn(const dt_chat_template *t, const char *system, const dt_chat_kwargs *kw, char **out) {
    *out = NULL;
    if (!t->preamble && (system || !t->default_system)) return DT_OK;
    const char *c = t->preamble ? "" : t->default_system;
    size_t n = strlen(c), len = 0, cap = 0;
    if (system) dt_chat_content(t, system, &c, &n);
    char head[96], pre[160] = "", *o = NULL;
    snprintf(head, sizeof head, t->head, "system");
    if (t->preamble) snprintf(pre, sizeof pre, t->preamble, kw && kw->date ? kw->date : t->date);
    dt_status st = dt_chat_append(&o, &len, &cap, head, strlen(head));
    if (!st && kw && kw->builtin) st = dt_chat_builtin_line(kw->builtin, &o, &len, &cap);
    if (!st) st = dt_chat_append(&o, &len, &cap, pre, strlen(pre));
    if (!st) st = dt_chat_append(&o, &len, &cap, c, n);
    if (!st) st = dt_chat_append(&o, &len, &cap, t->end, strlen(t->end));
    if (!st) st = dt_chat_append(&o, &len, &cap, t->after, strlen(t->after));
    if (st) free(o), o = NULL;
    *out = o;
    return st;
}

const char *dt_chat_answer_end(const dt_chat_template *t, const dt_chat_kwargs *kw, bool calling) {
    return calling && kw && kw->builtin && t->builtin ? "<|eom_id|>" : t->end;
}

dt_status dt_chat_builtin_check(const dt_chat_template *t, const dt_chat_kwargs *kw) {
    if (!kw || !kw->builtin || t->builtin) return DT_OK;
    return dt_error(DT_ERR_ARG, "chat_template_kwargs' builtin_tools: the %s template has no built-in tools (Llama 3.1's has)", t->name);
}

void dt_chat_today(char buf[32]) {
    time_t now = time(NULL);
    struct tm tm;
    if (!localtime_r(&now, &tm) || !strftime(buf, 32, "%d %b %Y", &tm)) snprintf(buf, 32, "%s", LLAMA31_DATE);
}

void dt_chat_content(const dt_chat_template *t, const char *c, const char **start, size_t *n) {
    size_t len = strlen(c), i = 0;
    while (t->trim && i < len && isspace((unsigned char)c[i])) i++;
    while (t->trim && len > i && isspace((unsigned char)c[len - 1])) len--;
    *start = c + i, *n = len - i;
}

dt_status dt_tokenizer_config_read(const char *tokenizer_json, dt_bpe *tok, dt_chat_kind *chat, int *eos, char **jinja) {
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
    if (cJSON_IsArray(tmpl)) /* (the older form: named templates, "default" the one applied) */
        for (const cJSON *t = tmpl->child; t; t = t->next) {
            const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
            if (cJSON_IsString(name) && !strcmp(name->valuestring, "default")) tmpl = cJSON_GetObjectItemCaseSensitive(t, "template");
        }
    if (jinja && cJSON_IsString(tmpl) && !(*jinja = strdup(tmpl->valuestring))) st = dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st && eos && cJSON_IsString(e) && tok) {
        uint32_t *ids = NULL;
        size_t n = 0, cap = 0;
        st = dt_bpe_encode(tok, e->valuestring, strlen(e->valuestring), &ids, &n, &cap);
        if (!st && n != 1) st = dt_error(DT_ERR_IO, "%s: \"eos_token\" \"%s\" is not one token", path, e->valuestring);
        if (!st) *eos = (int)ids[0];
        free(ids);
    }
    /* last: a template this build cannot render leaves the rest read (a caller may go on without it) */
    if (!st && chat && *chat == DT_CHAT_NONE && cJSON_IsString(tmpl)) st = dt_chat_kind_of_template(tmpl->valuestring, where, chat);
    cJSON_Delete(j);
    return st;
}
