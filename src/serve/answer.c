/* A response as OpenAI's API writes it, made from its jobs' text as they
 * run: the whole completion object (its n choices, the usage summed), or a
 * stream of chunks, each of one choice, then the usage where asked and
 * [DONE]; a chat's message or delta with a thinking model's reasoning and
 * the tool calls read from its answer; each token's logprobs. The HTTP
 * side (http.c) sends the bytes; everything here runs under the jobs'
 * lock. */
#include "serve_internal.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *finish_reason(const serve_job *j) { return j->why == DT_FINISH_STOP ? "stop" : "length"; }

/* A choice's text: a completion's "text"; a chat's "message" (whole) or "delta" (a streamed chunk; the first also
 * names the role, the last is empty), with a thinking model's reasoning_content where it has one (NULL: none), and its
 * tool_calls where it makes them (calls, taken; a whole message's content then what came before them, null where
 * nothing did, as vLLM answers). */
static void choice_text(cJSON *ch, bool chat, bool whole, bool first, const char *text, const char *reasoning, cJSON *calls) {
    if (!chat) {
        cJSON_AddStringToObject(ch, "text", text);
        return;
    }
    cJSON *m = cJSON_AddObjectToObject(ch, whole ? "message" : "delta");
    if (whole || first) cJSON_AddStringToObject(m, "role", "assistant");
    if (reasoning) cJSON_AddStringToObject(m, "reasoning_content", reasoning);
    if (calls && !*text) cJSON_AddNullToObject(m, "content");
    else if (whole || *text || (first && !reasoning)) cJSON_AddStringToObject(m, "content", text);
    if (calls) cJSON_AddItemToObject(m, "tool_calls", calls);
}

/* A token's text, its bytes made UTF-8 (a piece of a character shows as U+FFFD; caller frees; NULL: out of memory). */
static char *token_string(const serve_vocab *v, int32_t id) {
    char one[16];
    size_t n, m;
    const char *t = dt_token_text(v->bpe, id, one, &n);
    return dt_utf8_clean(t, n, &m);
}

/* A chat's entry for a token: its text, logprob and bytes. */
static cJSON *chat_token(const serve_vocab *v, int32_t id, float lp) {
    char one[16], *s = token_string(v, id);
    size_t n;
    const char *t = dt_token_text(v->bpe, id, one, &n);
    cJSON *e = cJSON_CreateObject(), *b;
    cJSON_AddStringToObject(e, "token", s ? s : "");
    cJSON_AddNumberToObject(e, "logprob", lp);
    b = cJSON_AddArrayToObject(e, "bytes");
    for (size_t i = 0; i < n; i++) cJSON_AddItemToArray(b, cJSON_CreateNumber((unsigned char)t[i]));
    free(s);
    return e;
}

/* A chat's logprobs entry: the token and its top alternatives. */
static cJSON *chat_logprob(const serve_vocab *v, const serve_logprob *x, int top) {
    cJSON *e = chat_token(v, x->token, x->logprob), *alts = cJSON_AddArrayToObject(e, "top_logprobs");
    for (int i = 0; i < top; i++) cJSON_AddItemToArray(alts, chat_token(v, x->top[i], x->top_lp[i]));
    return e;
}

/* A completion's logprobs entry into its four arrays: the token, its logprob (null: the prompt's first), its top
 * alternatives as {text: logprob} with the token's own among them (as OpenAI's: up to N + 1), its text's offset in
 * characters. */
static void completion_logprob(const serve_vocab *v, serve_choice *c, const serve_logprob *x, cJSON *arrays[4]) {
    int top = c->job->p.top;
    bool none = isnan(x->logprob);
    char *s = token_string(v, x->token);
    cJSON_AddItemToArray(arrays[0], cJSON_CreateString(s ? s : ""));
    cJSON_AddItemToArray(arrays[1], none ? cJSON_CreateNull() : cJSON_CreateNumber(x->logprob));
    cJSON *alts = none ? cJSON_CreateNull() : cJSON_CreateObject();
    for (int i = 0; !none && i <= top; i++) { /* the top N, then the token itself where it is not among them */
        char *k = i < top ? token_string(v, x->top[i]) : s;
        if (k && !cJSON_GetObjectItemCaseSensitive(alts, k)) cJSON_AddNumberToObject(alts, k, i < top ? x->top_lp[i] : x->logprob);
        if (i < top) free(k);
    }
    cJSON_AddItemToArray(arrays[2], alts);
    const char *text = c->job->text;
    for (; c->lp_byte < x->at; c->lp_byte++) c->lp_char += ((unsigned char)text[c->lp_byte] & 0xC0) != 0x80;
    cJSON_AddItemToArray(arrays[3], cJSON_CreateNumber((double)c->lp_char));
    free(s);
}

/* The logprobs of a choice's tokens not yet sent whose text starts before byte upto, and once final an end-of-text
 * token's (null without logprobs). */
static cJSON *logprobs_json(const serve_answer *a, serve_choice *c, size_t upto, bool final) {
    serve_job *j = c->job;
    if (!j->p.logprobs) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject(), *arrays[4] = { 0 }, *content = NULL;
    static const char *names[4] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
    if (a->chat) content = cJSON_AddArrayToObject(o, "content"), cJSON_AddNullToObject(o, "refusal");
    else for (int i = 0; i < 4; i++) arrays[i] = cJSON_AddArrayToObject(o, names[i]);
    for (; c->lp_sent < j->nlp && (j->lp[c->lp_sent].at < upto || (final && j->lp[c->lp_sent].textless)); c->lp_sent++) {
        if (a->chat) cJSON_AddItemToArray(content, chat_logprob(a->vocab, &j->lp[c->lp_sent], j->p.top));
        else completion_logprob(a->vocab, c, &j->lp[c->lp_sent], arrays);
    }
    return o;
}

/* vLLM's prompt_logprobs of a whole answer: null for the first token, then an object a token, {"<id>": {"logprob",
 * "rank", "decoded_token"}} for it and its N most likely alternatives (ranked 1 to N). */
static cJSON *prompt_logprobs_json(const serve_answer *a, const serve_job *j) {
    cJSON *list = cJSON_CreateArray();
    for (int i = 0; i < j->p.nprompt; i++) {
        const serve_logprob *x = &j->plp[i];
        if (isnan(x->logprob)) { cJSON_AddItemToArray(list, cJSON_CreateNull()); continue; }
        cJSON *o = cJSON_CreateObject();
        for (int k = -1; k < j->p.prompt_top; k++) { /* the token, then its alternatives */
            int32_t id = k < 0 ? x->token : x->top[k];
            char key[16], *s = token_string(a->vocab, id);
            snprintf(key, sizeof key, "%d", (int)id);
            if (cJSON_GetObjectItemCaseSensitive(o, key)) { free(s); continue; }
            cJSON *e = cJSON_AddObjectToObject(o, key);
            cJSON_AddNumberToObject(e, "logprob", k < 0 ? x->logprob : x->top_lp[k]);
            cJSON_AddNumberToObject(e, "rank", k < 0 ? x->rank : k + 1);
            cJSON_AddStringToObject(e, "decoded_token", s ? s : "");
            free(s);
        }
        cJSON_AddItemToArray(list, o);
    }
    return list;
}

/* The object around the choices (a chat's chat.completion, streamed as chat.completion.chunk): its choices array. */
static cJSON *envelope(const serve_answer *a, cJSON **choices) {
    char id[40];
    snprintf(id, sizeof id, "%s-%ld", a->chat ? "chatcmpl" : "cmpl", a->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", !a->chat ? "text_completion" : a->stream ? "chat.completion.chunk" : "chat.completion");
    cJSON_AddNumberToObject(o, "created", (double)a->created);
    cJSON_AddStringToObject(o, "model", a->model_name);
    *choices = cJSON_AddArrayToObject(o, "choices");
    return o;
}

/* The usage of every choice: the prompt once, the tokens drawn summed (as OpenAI counts n choices); of the prompt's,
 * those a cache gave the first choice (OpenAI's prompt_tokens_details.cached_tokens; the others' copy it too). */
static void add_usage(cJSON *o, const serve_answer *a) {
    long drawn = 0;
    for (int i = 0; i < a->n; i++) drawn += a->ch[i].job->generated;
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", a->ch[0].job->p.nprompt);
    cJSON_AddNumberToObject(u, "completion_tokens", (double)drawn);
    cJSON_AddNumberToObject(u, "total_tokens", (double)(a->ch[0].job->p.nprompt + drawn));
    cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "prompt_tokens_details"), "cached_tokens", a->ch[0].job->cached);
}

/* Choice c's object: text n bytes (and a thinking model's reasoning rn bytes, NULL: none; tool calls, taken, NULL:
 * none), its logprobs, its finish reason (NULL: not yet). */
static cJSON *choice_json(const serve_answer *a, serve_choice *c, const char *text, size_t n, const char *reasoning, size_t rn,
                          const char *reason, cJSON *calls) {
    size_t m;
    char *clean = dt_utf8_clean(text, n, &m), *rclean = reasoning ? dt_utf8_clean(reasoning, rn, &m) : NULL;
    cJSON *ch = cJSON_CreateObject();
    cJSON_AddNumberToObject(ch, "index", (double)(c - a->ch));
    choice_text(ch, a->chat, !a->stream, c->chunks++ == 0, clean ? clean : "", reasoning ? rclean ? rclean : "" : NULL, calls);
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(a, c, reason ? c->job->len : c->job->visible, reason != NULL));
    if (c->job->plp && !a->stream) cJSON_AddItemToObject(ch, "prompt_logprobs", prompt_logprobs_json(a, c->job));
    if (reason) cJSON_AddStringToObject(ch, "finish_reason", reason);
    else cJSON_AddNullToObject(ch, "finish_reason");
    free(clean), free(rclean);
    return ch;
}

static void out_append(serve_answer *a, const char *x, const char *y, const char *z) {
    const char *parts[3] = { x, y, z };
    for (int i = 0; i < 3; i++) {
        size_t n = parts[i] ? strlen(parts[i]) : 0;
        char *o = realloc(a->out, a->out_len + n + 1);
        if (!o) return;
        a->out = o;
        memcpy(a->out + a->out_len, parts[i] ? parts[i] : "", n);
        a->out_len += n;
        a->out[a->out_len] = 0;
    }
}

/* o printed and appended (a stream's: as an event), then deleted. */
static void emit(serve_answer *a, cJSON *o) {
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    out_append(a, a->stream ? "data: " : "", s, a->stream ? "\n\n" : "\n");
    free(s);
}

/* A stream's chunk of choice c (reason: its last, with its finish reason). */
static void stream_chunk(serve_answer *a, serve_choice *c, const char *text, size_t n, const char *reasoning, size_t rn,
                         const char *reason, cJSON *calls) {
    cJSON *choices, *o = envelope(a, &choices);
    cJSON_AddItemToArray(choices, choice_json(a, c, text, n, reasoning, rn, reason, calls));
    if (c->job->p.stream_usage) cJSON_AddNullToObject(o, "usage"); /* (OpenAI's: null on every chunk but the last) */
    emit(a, o);
    if (reason) c->ended = true;
}

/* The form of tool calls the model's template writes (dt_chat_template.tools). */
static int tool_form(const serve_answer *a) {
    const dt_chat_template *t = dt_chat_template_of(a->vocab->chat);
    return t ? t->tools : 0;
}

/* A whole response's choice c, its content n bytes at text (and its reasoning): with tools, its calls read from it. */
static void whole_choice(serve_answer *a, serve_choice *c, const char *text, size_t n, const char *reasoning, size_t rn) {
    cJSON *calls = a->chat && c->job->p.tools ? serve_tool_calls(tool_form(a), text, n, c->job->id, &n) : NULL;
    c->whole = choice_json(a, c, text, n, reasoning, rn, calls ? "tool_calls" : finish_reason(c->job), calls);
    c->ended = true;
}

/* A stream with tools: the content (from text + c0, its settled bytes to end) sent up to where a call may start (the
 * blocks held back); once done, the calls read from it in one chunk (OpenAI's deltas, each with its index), or the
 * held text where it makes none. */
static void stream_with_tools(serve_answer *a, serve_choice *c, const char *text, size_t c0, size_t end, bool done) {
    size_t upto = c0 + dt_chat_calls_text(tool_form(a), text + c0, end - c0), n = end - c0;
    cJSON *calls = done ? serve_tool_calls(tool_form(a), text + c0, end - c0, c->job->id, &n) : NULL, *k;
    if (done) upto = c0 + n;
    if (upto > c0 + c->sent_c) stream_chunk(a, c, text + c0 + c->sent_c, upto - c0 - c->sent_c, NULL, 0, NULL, NULL);
    c->sent_c = upto - c0;
    int i = 0;
    cJSON_ArrayForEach(k, calls) cJSON_AddNumberToObject(k, "index", i++);
    if (calls) stream_chunk(a, c, "", 0, NULL, 0, NULL, calls);
    if (done) stream_chunk(a, c, "", 0, NULL, 0, calls ? "tool_calls" : finish_reason(c->job), NULL);
}

/* A thinking model's chat answer: a stream's newly settled reasoning and content, and the last chunk; or the whole
 * message with its reasoning_content. */
static void produce_thinking(serve_answer *a, serve_choice *c, bool done) {
    serve_job *j = c->job;
    const char *text = j->text ? j->text : ""; /* (none before the first token) */
    serve_split sp;
    serve_reasoning_split(text, done ? j->len : j->visible, done, &sp);
    if (!a->stream) {
        if (done) whole_choice(a, c, text + sp.c0, j->len - sp.c0, sp.thinks ? text + sp.r0 : NULL, sp.r1 - sp.r0);
        return;
    }
    size_t r_at, r_new, c_at, c_new;
    serve_reasoning_next(&sp, c->sent_r, c->sent_c, &r_at, &r_new, &c_at, &c_new);
    if (j->p.tools) c_new = 0; /* (the content's own way, below) */
    if (r_new || c_new) stream_chunk(a, c, text + c_at, c_new, r_new ? text + r_at : NULL, r_new, NULL, NULL);
    c->sent_r += r_new, c->sent_c += c_new;
    c->sent = j->visible;
    if (j->p.tools && (sp.settled > sp.c0 || done)) stream_with_tools(a, c, text, sp.c0, sp.settled > sp.c0 ? sp.settled : sp.c0, done);
    else if (done) stream_chunk(a, c, "", 0, NULL, 0, finish_reason(j), NULL);
}

/* Choice c's next: a stream's new text (its last chunk once done); a whole response's choice once done. */
static void produce_choice(serve_answer *a, serve_choice *c) {
    serve_job *j = c->job;
    bool done = j->state == JOB_DONE;
    const dt_chat_template *t = dt_chat_template_of(a->vocab->chat);
    if (a->chat && t && t->no_think) { /* (a thinking model's reasoning in reasoning_content) */
        produce_thinking(a, c, done);
        return;
    }
    if (a->stream && j->p.tools) { /* (a chat's text from its start: no echo) */
        stream_with_tools(a, c, j->text ? j->text : "", 0, done ? j->len : j->visible, done);
        c->sent = j->visible;
        return;
    }
    if (a->stream && j->visible > c->sent) {
        stream_chunk(a, c, j->text + c->sent, j->visible - c->sent, NULL, 0, NULL, NULL);
        c->sent = j->visible;
    }
    if (!done) return;
    if (a->stream) stream_chunk(a, c, "", 0, NULL, 0, finish_reason(j), NULL);
    else whole_choice(a, c, j->text, j->len, NULL, 0);
}

cJSON *serve_error_object(unsigned status, const char *param, const char *message) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    size_t n;
    char *clean = dt_utf8_clean(message, strlen(message), &n);
    cJSON_AddStringToObject(e, "message", clean ? clean : "out of memory");
    cJSON_AddStringToObject(e, "type", status >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    free(clean);
    return o;
}

/* A failed job's error object (a stream's as an event, then [DONE]). */
static void failure(serve_answer *a, const serve_job *j) {
    emit(a, serve_error_object(500, NULL, j->message));
    if (a->stream) out_append(a, "data: [DONE]\n\n", NULL, NULL);
    a->finished = true;
}

bool serve_answer_ready(const serve_answer *a) {
    bool all = true;
    for (int i = 0; i < a->n; i++) {
        const serve_choice *c = &a->ch[i];
        bool done = c->job->state == JOB_DONE;
        if (c->job->failed || (a->stream && ((done && !c->ended) || c->job->visible > c->sent))) return true;
        all &= done;
    }
    return all;
}

void serve_answer_produce(serve_answer *a) {
    bool ended = true;
    for (int i = 0; i < a->n; i++)
        if (a->ch[i].job->failed) {
            failure(a, a->ch[i].job);
            return;
        }
    for (int i = 0; i < a->n; i++) {
        if (!a->ch[i].ended) produce_choice(a, &a->ch[i]);
        ended &= a->ch[i].ended;
    }
    if (!ended) return;
    cJSON *choices, *o;
    if (!a->stream) { /* every choice made: the whole response */
        o = envelope(a, &choices);
        for (int i = 0; i < a->n; i++) cJSON_AddItemToArray(choices, a->ch[i].whole), a->ch[i].whole = NULL;
        add_usage(o, a);
        emit(a, o);
    } else {
        if (a->ch[0].job->p.stream_usage) { /* a last chunk of no choices holds the usage */
            o = envelope(a, &choices);
            add_usage(o, a);
            emit(a, o);
        }
        out_append(a, "data: [DONE]\n\n", NULL, NULL);
    }
    a->finished = true;
}

void serve_answer_free(serve_answer *a) {
    for (int i = 0; a->ch && i < a->n; i++) cJSON_Delete(a->ch[i].whole);
    free(a->ch);
    free(a->out);
}
