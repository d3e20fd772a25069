/* The tool turns of GRPO's rollouts (--grpo-tools), as TRL's GRPOTrainer(tools=...) makes them: an answer that ends
 * (an end token: the template's end of turn, or Llama 3.1's <|eom_id|>) calling tools, in the template's form (data/chat_calls.c), has
 * every call run by the user's program (grpo_tools.c), one round over all the rank's rows at once (a call of a tool
 * its prompt's line does not offer answered {"error": "Tool NAME not found."} instead, as TRL's); the results, as
 * the template writes them after an answer, and the assistant's head (dt_chat_tool_suffix) are appended to the
 * completion as tokens the loss does not score (TRL's tool_mask), and the decoder goes on from there. A completion
 * whose results would not fit its row or --completion-tokens ends as it was. The reward reads such a completion as
 * its messages: each answer (its text before the calls, and the calls) and each result. */
#include "grpo_rollout.h"
#include "grpo_tools.h"
#include "dtrain/io.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

char *dt_grpo_completion_text(const dt_grpo_run *gr, const dt_grpo_completion *c, int from, int to, size_t *len) {
    size_t cap = 16, n = 0;
    char *s = malloc(cap);
    for (int t = from; s && t < to; t++) {
        if (dt_token_ends_has(&gr->ends, c->toks[t]) || !c->mask[t]) continue;
        size_t k;
        char scratch[16];
        const char *b = dt_token_text(gr->tok, c->toks[t], scratch, &k);
        if (n + k + 1 > cap) {
            char *g = realloc(s, cap = 2 * (n + k + 1));
            if (!g) { free(s); return NULL; }
            s = g;
        }
        memcpy(s + n, b, k), n += k;
    }
    if (s) s[n] = 0;
    *len = n;
    return s;
}

/* The answer c is generating ([c->seg, c->n)) as a message: its text before any calls, and the calls (OpenAI's
 * {"type": "function", "function": {"name", "arguments"}}); *calls (the caller's, NULL where none) the calls read. */
static cJSON *answer_message(const dt_grpo_run *gr, const dt_grpo_completion *c, cJSON **calls) {
    size_t len = 0, content = 0;
    char *text = dt_grpo_completion_text(gr, c, c->seg, c->n, &len);
    *calls = text ? dt_chat_calls_read(gr->form, text, len, &content) : NULL;
    cJSON *m = text ? cJSON_CreateObject() : NULL, *list = *calls ? cJSON_CreateArray() : NULL, *call;
    if (m) {
        text[content] = 0;
        cJSON_AddStringToObject(m, "role", "assistant");
        cJSON_AddStringToObject(m, "content", text);
    }
    cJSON_ArrayForEach(call, *calls) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "type", "function");
        cJSON_AddItemToObject(o, "function", cJSON_Duplicate(call, true));
        cJSON_AddItemToArray(list, o);
    }
    if (m && list) cJSON_AddItemToObject(m, "tool_calls", list);
    free(text);
    return m;
}

/* Row c's results (texts[0..k), of calls) appended, with the head after, when its row and budget hold them: *fits. */
static dt_status append_results(dt_grpo_run *gr, const dt_grpo_config *gc, dt_grpo_completion *c, cJSON *answer, const cJSON *calls,
                                char **texts, bool *fits) {
    cJSON *results = cJSON_CreateArray(), *call;
    char *suffix = NULL;
    uint32_t *ids = NULL;
    size_t n = 0, cap = 0;
    int k = 0;
    cJSON_ArrayForEach(call, calls) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "tool");
        cJSON_AddStringToObject(m, "name", cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring);
        cJSON_AddStringToObject(m, "content", texts[k++]);
        cJSON_AddItemToArray(results, m);
    }
    dt_chat_kwargs kw = { .thinking = gr->thinking };
    dt_status st = dt_chat_tool_suffix(dt_chat_template_of(gr->chat), results, &kw, &suffix);
    if (!st) st = dt_bpe_encode(gr->tok, suffix, strlen(suffix), &ids, &n, &cap);
    int P = gr->prompts.len[c->prompt], total = c->n + (int)n;
    /* room for the results and at least one more token of the answer after them */
    *fits = !st && P + total + 1 <= gr->T + 1 && total + 1 <= gc->completion;
    for (size_t i = 0; *fits && i < n; i++) c->toks[c->n] = (int32_t)ids[i], c->mask[c->n++] = 0;
    if (*fits && !c->turns) c->turns = cJSON_CreateArray();
    if (*fits) {
        cJSON_AddItemToArray(c->turns, answer);
        while (results->child) cJSON_AddItemToArray(c->turns, cJSON_DetachItemViaPointer(results, results->child));
    } else {
        cJSON_Delete(answer);
    }
    cJSON_Delete(results);
    free(suffix), free(ids);
    return st;
}

/* Whether call names one of tools (a prompt's line's list; NULL: the line lists none, so any call goes to the program). */
static bool offered(const cJSON *tools, const cJSON *call) {
    if (!tools) return true;
    const char *name = cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring;
    const cJSON *tool;
    cJSON_ArrayForEach(tool, tools) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tool, "function"), *n = cJSON_GetObjectItemCaseSensitive(cJSON_IsObject(f) ? f : tool, "name");
        if (cJSON_IsString(n) && !strcmp(n->valuestring, name)) return true;
    }
    return false;
}

/* A result that reports a failed call: a JSON object with an "error" member (TRL's result where a tool raises). */
static bool failed(const char *result) {
    cJSON *j = *result == '{' ? cJSON_Parse(result) : NULL;
    bool bad = cJSON_IsObject(j) && cJSON_GetObjectItemCaseSensitive(j, "error");
    cJSON_Delete(j);
    return bad;
}

/* Row c's calls' results, in order: the program's next (*k) for each call its prompt offers, else TRL's "not found"
 * error (texts[i] and what it points at the caller's; an own[i] freed by the caller). */
static dt_status call_results(const cJSON *tools, const cJSON *calls, char **program, int *k, char **texts, char **own) {
    int i = 0;
    const cJSON *call;
    cJSON_ArrayForEach(call, calls) {
        own[i] = NULL;
        if (offered(tools, call)) { texts[i++] = program[(*k)++]; continue; }
        const char *name = cJSON_GetObjectItemCaseSensitive(call, "name")->valuestring;
        size_t n = strlen(name) + 20, len = 0, cap = 0;
        char *what = malloc(n);
        cJSON *e = what ? cJSON_CreateObject() : NULL;
        if (what) snprintf(what, n, "Tool %s not found.", name);
        /* (as json.dumps writes it: TRL writes the dict's str(), single quotes) */
        if (e && cJSON_AddStringToObject(e, "error", what) && dt_chat_tojson(e, &own[i], &len, &cap)) free(own[i]), own[i] = NULL;
        cJSON_Delete(e), free(what);
        if (!own[i]) return dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
        texts[i] = own[i], i++;
    }
    return DT_OK;
}

dt_status dt_grpo_tool_round(dt_grpo_run *gr, const dt_grpo_config *gc, int *rows, int *n) {
    int m = *n, go = 0, k = 0, ncalls = 0;
    cJSON *all = cJSON_CreateArray(), **calls = calloc((size_t)m, sizeof *calls), **answers = calloc((size_t)m, sizeof *answers);
    char **results = NULL;
    dt_status st = all && calls && answers ? DT_OK : dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    for (int j = 0; !st && j < m; j++) {
        dt_grpo_completion *c = &gr->done[rows[j]];
        if (c->n == c->seg || !dt_token_ends_has(&gr->ends, c->toks[c->n - 1])) continue; /* cut short, or no end: no calls */
        answers[j] = answer_message(gr, c, &calls[j]);
        cJSON *call;
        /* the completion's number in the run, the same on every layout: a program keeps a rollout's state by it */
        double number = (double)c->place * gc->group + rows[j] % gc->group;
        cJSON_ArrayForEach(call, calls[j]) {
            ncalls++;
            cJSON *line = offered(gr->prompts.tools[c->prompt], call) ? cJSON_Duplicate(call, true) : NULL;
            if (line) cJSON_AddNumberToObject(line, "completion", number), cJSON_AddItemToArray(all, line);
        }
    }
    if (!st && cJSON_GetArraySize(all) > 0) st = dt_grpo_tools_run(gr->tools, all, &results);
    gr->stats[S_TOOL_CALLS] += ncalls;
    for (int j = 0; !st && j < m; j++) {
        int nc = cJSON_GetArraySize(calls[j]);
        if (!nc) continue;
        char **texts = calloc(2 * (size_t)nc, sizeof *texts), **own = texts ? texts + nc : NULL;
        st = texts ? call_results(gr->prompts.tools[gr->done[rows[j]].prompt], calls[j], results, &k, texts, own)
                   : dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
        for (int i = 0; !st && i < nc; i++) gr->stats[S_TOOL_FAILS] += failed(texts[i]);
        bool fits = false;
        if (!st) {
            st = append_results(gr, gc, &gr->done[rows[j]], answers[j], calls[j], texts, &fits);
            answers[j] = NULL; /* (kept in the turns, or deleted) */
        }
        if (!st && fits) rows[go++] = rows[j];
        for (int i = 0; texts && i < nc; i++) free(own[i]);
        free(texts);
    }
    for (int j = 0; j < m; j++) cJSON_Delete(calls ? calls[j] : NULL), cJSON_Delete(answers ? answers[j] : NULL);
    for (int j = 0; results && j < cJSON_GetArraySize(all); j++) free(results[j]);
    free(results), free(calls), free(answers);
    cJSON_Delete(all);
    *n = st ? 0 : go;
    return st;
}

dt_status dt_grpo_last_answer(dt_grpo_run *gr, dt_grpo_completion *c) {
    if (!c->turns) return DT_OK;
    cJSON *calls = NULL, *m = answer_message(gr, c, &calls);
    cJSON_Delete(calls);
    if (!m) return dt_error(DT_ERR_NOMEM, "GRPO: out of memory");
    cJSON_AddItemToArray(c->turns, m);
    return DT_OK;
}
