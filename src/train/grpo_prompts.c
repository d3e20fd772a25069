/* The prompts a GRPO run completes (--grpo PROMPTS): read, tokenized and checked against the row's length once. */
#include "grpo_prompts.h"
#include "io/json_text.h"
#include "dtrain/io.h"
#include "run.h"

#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A prompt's text (messages: its messages' JSON, taken; NULL: a text prompt). */
static dt_status add_prompt(dt_grpo_prompts *gp, const char *text, char *messages, const char *where, dt_bpe *tok, bool bos, int T) {
    size_t n = (size_t)gp->n + 1;
    char **t = realloc(gp->text, sizeof *t * n);
    if (t) gp->text = t;
    char **m = t ? realloc(gp->messages, sizeof *m * n) : NULL;
    if (m) gp->messages = m;
    cJSON **tl = m ? realloc(gp->tools, sizeof *tl * n) : NULL;
    if (tl) gp->tools = tl;
    int32_t **p = tl ? realloc(gp->toks, sizeof *p * n) : NULL;
    if (p) gp->toks = p;
    int *l = p ? realloc(gp->len, sizeof *l * n) : NULL;
    if (!l) { free(messages); return dt_error(DT_ERR_NOMEM, "%s: out of memory", where); }
    gp->len = l;
    int k = gp->n++;
    gp->messages[k] = messages, gp->tools[k] = NULL, gp->toks[k] = NULL;
    if (!(gp->text[k] = strdup(text))) return dt_error(DT_ERR_NOMEM, "%s: out of memory", where);
    if (!*text) return dt_error(DT_ERR_IO, "%s: an empty prompt", where);
    dt_status st = dt_bpe_prompt(tok, text, strlen(text), bos, &gp->toks[k], &gp->len[k]);
    if (st) return dt_error(st, "%s: %s", where, dt_last_error());
    if (gp->len[k] >= T)
        return dt_error(DT_ERR_ARG, "%s: the prompt is %d tokens; a row of --seq %d holds it and at least one completion token only "
                        "below %d", where, gp->len[k], T, T);
    return DT_OK;
}

/* A conversational prompt: its messages by the template, tokenized as they are (the template writes its own
 * begin-of-text). */
static dt_status add_messages(dt_grpo_prompts *gp, const cJSON *msgs, const char *where, dt_bpe *tok, dt_chat_kind chat,
                              const dt_chat_kwargs *kw, int T) {
    const dt_chat_template *t = dt_chat_template_of(chat);
    if (!t || !tok)
        return dt_error(DT_ERR_ARG, "%s: a conversational prompt needs a tokenizer and a chat template (its tokenizer_config.json's, "
                        "one this build renders, or --chat-template KIND)", where);
    char *text = NULL;
    size_t n = 0;
    dt_status st = dt_chat_prompt(t, msgs, kw, &text, &n);
    if (st) return dt_error(st, "%s: %s", where, dt_last_error());
    char *json = dt_json_print_compact(msgs); /* (a float stays one for the reward program, as json.dumps writes it) */
    st = json ? add_prompt(gp, text, json, where, tok, false, T) : dt_error(DT_ERR_NOMEM, "%s: out of memory", where);
    if (!st && kw->tools && !(gp->tools[gp->n - 1] = cJSON_Duplicate(kw->tools, true))) st = dt_error(DT_ERR_NOMEM, "%s: out of memory", where);
    free(text);
    return st;
}

dt_status dt_grpo_prompts_read(dt_grpo_prompts *gp, const char *path, dt_bpe *tok, dt_chat_kind chat, const dt_chat_kwargs *kw, int T) {
    char *text = NULL, where[4200];
    size_t len = 0;
    dt_status st = dt_file_read_lines(path, (size_t)1 << 30, &text, &len);
    if (st) return dt_error(st, "--grpo %s", dt_last_error());
    bool jsonl = dt_train_is_sft(path);
    size_t lineno = 0;
    for (char *s = text, *eol; !st && s < text + len; s = eol + 1) {
        eol = strchr(s, '\n');
        if (!eol) eol = text + len;
        *eol = 0;
        lineno++;
        snprintf(where, sizeof where, "%s:%zu", path, lineno);
        if (eol > s && eol[-1] == '\r') eol[-1] = 0;
        if (!*s) continue;
        if (!jsonl) { st = add_prompt(gp, s, NULL, where, tok, true, T); continue; }
        cJSON *j = NULL;
        if ((st = dt_json_parse_line(s, where, &j))) break;
        const cJSON *p = cJSON_GetObjectItemCaseSensitive(j, "prompt");
        cJSON *parsed = NULL;
        bool bad_tools;
        dt_chat_kwargs with = *kw; /* (a line's tools, rendered into its prompt as SFT's chats are) */
        with.tools = dt_chat_line_tools(j, &parsed, &bad_tools);
        st = bad_tools || (with.tools && !cJSON_IsArray(p))
               ? dt_error(DT_ERR_IO, "%s: \"tools\" is a list of the tools a conversational prompt's model may call ({\"type\": "
                          "\"function\", \"function\": {...}}, or the list's JSON text)", where)
           : cJSON_IsArray(p) ? add_messages(gp, p, where, tok, chat, &with, T)
           : !cJSON_IsString(p) ? dt_error(DT_ERR_IO, "%s: no \"prompt\" text or messages", where)
                                : add_prompt(gp, p->valuestring, NULL, where, tok, true, T);
        cJSON_Delete(j), cJSON_Delete(parsed);
    }
    free(text);
    if (!st && gp->n == 0) st = dt_error(DT_ERR_IO, "--grpo %s: no prompts", path);
    return st;
}

void dt_grpo_prompts_free(dt_grpo_prompts *gp) {
    for (int i = 0; i < gp->n; i++) free(gp->text[i]), free(gp->messages[i]), cJSON_Delete(gp->tools[i]), free(gp->toks[i]);
    free(gp->text), free(gp->messages), free(gp->tools), free(gp->toks), free(gp->len);
    *gp = (dt_grpo_prompts){ 0 };
}
