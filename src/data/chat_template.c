/* Chat templates, a documented subset rendered here rather than by a Jinja engine (none is packaged for C): each is
 * the text before the first message, a turn's head (by role), the end of a turn (which an assistant's answer ends
 * with: what training scores and serving stops at) and what follows it.
 *   chatml  <|im_start|>ROLE\nCONTENT<|im_end|>\n
 *   llama3  <|begin_of_text|>, then <|start_header_id|>ROLE<|end_header_id|>\n\nCONTENT<|eot_id|> (CONTENT trimmed)
 * Which one a model has: its tokenizer_config.json's chat_template, recognised by its markers. */
#include "dtrain/data.h"
#include "dtrain/io.h"

#include <cjson/cJSON.h>
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const dt_chat_template templates[] = {
    [DT_CHAT_CHATML] = { "", "<|im_start|>%s\n", "<|im_end|>", "\n", 0 },
    [DT_CHAT_LLAMA3] = { "<|begin_of_text|>", "<|start_header_id|>%s<|end_header_id|>\n\n", "<|eot_id|>", "", 1 },
};

const dt_chat_template *dt_chat_template_of(dt_chat_kind k) {
    return k == DT_CHAT_CHATML || k == DT_CHAT_LLAMA3 ? &templates[k] : NULL;
}

dt_status dt_chat_kind_parse(const char *name, dt_chat_kind *out) {
    if (!strcmp(name, "chatml")) *out = DT_CHAT_CHATML;
    else if (!strcmp(name, "llama3")) *out = DT_CHAT_LLAMA3;
    else if (!strcmp(name, "none")) *out = DT_CHAT_NONE;
    else return dt_error(DT_ERR_ARG, "chat template \"%s\": this build renders chatml and llama3 (or none: prompt and completion only)", name);
    return DT_OK;
}

dt_status dt_chat_kind_of_template(const char *jinja, const char *where, dt_chat_kind *out) {
    if (strstr(jinja, "<|im_start|>")) *out = DT_CHAT_CHATML;
    else if (strstr(jinja, "<|start_header_id|>")) *out = DT_CHAT_LLAMA3;
    else return dt_error(DT_ERR_UNSUPPORTED, "%s: a chat_template this build cannot render (it renders chatml's and llama3's): "
                         "name one with --chat-template chatml|llama3", where);
    return DT_OK;
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
