/* The HTTP side of dtrain serve, on libmicrohttpd (a thread per
 * connection, so a response may wait on its job): POST /v1/completions
 * (OpenAI's legacy completions, whole or streamed as server-sent events),
 * POST /v1/chat/completions (messages by chat.c's template; the same job),
 * GET /health, GET /metrics (Prometheus' text format), GET /v1/models.
 * Every bad request gets a 4xx with OpenAI's error object saying what is
 * wrong; a client that goes away cancels its job within a quarter second. */
#include "serve_http.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

typedef struct {
    serve_http *h;
    struct MHD_Connection *conn;
    char *body;
    size_t len, cap;
    bool too_large;
    double t0;
    serve_job *job;
    long id;
    int refs;          /* the request and its callback response */
    char *out;         /* bytes ready for the client */
    size_t out_len, out_off, sent;
    size_t sent_r, sent_c; /* a thinking model's stream: the reasoning's and the content's bytes sent */
    bool finished;     /* the last bytes are in out */
    long created;
    int chunks;        /* completion objects made so far (a chat stream's first names the role) */
    int lp_sent;       /* the job's logprobs entries sent */
    size_t lp_byte, lp_char; /* a byte of the text and the characters before it (text_offset counts characters) */
} conn_state;

static void conn_release(conn_state *cs) {
    if (--cs->refs > 0) return; /* both are called from the connection's own thread */
    if (cs->job) {
        serve_job_cancel(cs->job);
        serve_job_release(cs->job);
    }
    free(cs->body);
    free(cs->out);
    free(cs);
}

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *type, const char *text) {
    struct MHD_Response *r = MHD_create_response_from_buffer(strlen(text), (void *)text, MHD_RESPMEM_MUST_COPY);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, "Content-Type", type);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* OpenAI's error object, counted (caller frees). */
static char *error_json(serve_http *h, unsigned status, const char *param, const char *message) {
    cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
    size_t n;
    char *clean = dt_utf8_clean(message, strlen(message), &n);
    cJSON_AddStringToObject(e, "message", clean ? clean : "out of memory");
    cJSON_AddStringToObject(e, "type", status >= 500 ? "server_error" : "invalid_request_error");
    if (param) cJSON_AddStringToObject(e, "param", param);
    else cJSON_AddNullToObject(e, "param");
    cJSON_AddNullToObject(e, "code");
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(clean);
    pthread_mutex_lock(&h->mu);
    if (status >= 500) h->errors_5xx++;
    else h->errors_4xx++;
    pthread_mutex_unlock(&h->mu);
    return s;
}

static enum MHD_Result send_error(serve_http *h, struct MHD_Connection *c, unsigned status, const char *param, const char *message) {
    char *s = error_json(h, status, param, message);
    enum MHD_Result ok = send_text(c, status, "application/json", s ? s : "{}");
    free(s);
    return ok;
}

/* An error while the body is still arriving: libmicrohttpd queues responses only before the body or after all
 * of it, so the answer is written to the socket here and the connection closed (MHD_NO) without reading the rest. */
static enum MHD_Result abort_upload(serve_http *h, struct MHD_Connection *c, unsigned status, const char *reason, const char *message) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char *s = error_json(h, status, NULL, message), head[256];
    if (ci && s) {
        int n = snprintf(head, sizeof head, "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\nContent-Length: %zu\r\n"
                         "Connection: close\r\n\r\n", status, reason, strlen(s));
        if (send(ci->connect_fd, head, (size_t)n, MSG_NOSIGNAL) == n) send(ci->connect_fd, s, strlen(s), MSG_NOSIGNAL);
    }
    free(s);
    return MHD_NO;
}

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
static void completion_logprob(conn_state *cs, const serve_logprob *x, cJSON *arrays[4]) {
    const serve_vocab *v = cs->h->vocab;
    int top = cs->job->p.top;
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
    const char *text = cs->job->text;
    for (; cs->lp_byte < x->at; cs->lp_byte++) cs->lp_char += ((unsigned char)text[cs->lp_byte] & 0xC0) != 0x80;
    cJSON_AddItemToArray(arrays[3], cJSON_CreateNumber((double)cs->lp_char));
    free(s);
}

/* The logprobs of the job's tokens not yet sent whose text starts before byte upto, and once final an end-of-text
 * token's (null without logprobs). */
static cJSON *logprobs_json(conn_state *cs, size_t upto, bool final) {
    serve_job *j = cs->job;
    if (!j->p.logprobs) return cJSON_CreateNull();
    cJSON *o = cJSON_CreateObject(), *arrays[4] = { 0 }, *content = NULL;
    static const char *names[4] = { "tokens", "token_logprobs", "top_logprobs", "text_offset" };
    if (j->p.chat) content = cJSON_AddArrayToObject(o, "content"), cJSON_AddNullToObject(o, "refusal");
    else for (int i = 0; i < 4; i++) arrays[i] = cJSON_AddArrayToObject(o, names[i]);
    for (; cs->lp_sent < j->nlp && (j->lp[cs->lp_sent].at < upto || (final && j->lp[cs->lp_sent].ends)); cs->lp_sent++) {
        if (j->p.chat) cJSON_AddItemToArray(content, chat_logprob(cs->h->vocab, &j->lp[cs->lp_sent], j->p.top));
        else completion_logprob(cs, &j->lp[cs->lp_sent], arrays);
    }
    return o;
}

static void add_usage(cJSON *o, const serve_job *j) {
    cJSON *u = cJSON_AddObjectToObject(o, "usage");
    cJSON_AddNumberToObject(u, "prompt_tokens", j->p.nprompt);
    cJSON_AddNumberToObject(u, "completion_tokens", j->generated);
    cJSON_AddNumberToObject(u, "total_tokens", j->p.nprompt + j->generated);
}

/* A stream's usage chunk (stream_options.include_usage): the completion object with no choices. */
static char *usage_json(conn_state *cs) {
    bool chat = cs->job->p.chat;
    char id[40];
    snprintf(id, sizeof id, "%s-%ld", chat ? "chatcmpl" : "cmpl", cs->id);
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", chat ? "chat.completion.chunk" : "text_completion");
    cJSON_AddNumberToObject(o, "created", (double)cs->created);
    cJSON_AddStringToObject(o, "model", cs->h->model_name);
    cJSON_AddArrayToObject(o, "choices");
    add_usage(o, cs->job);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    return s;
}

/* A completion object (a chat's: chat.completion, streamed as chat.completion.chunk): the whole one (usage
 * included) or a streamed chunk of text (and of reasoning: rn bytes at reasoning, NULL: none; and tool calls: calls,
 * taken, NULL: none). */
static char *completion_json(conn_state *cs, const char *text, size_t n, const char *reasoning, size_t rn, const char *reason, bool usage,
                             cJSON *calls) {
    size_t m;
    bool chat = cs->job->p.chat, whole = !cs->job->p.stream;
    char *clean = dt_utf8_clean(text, n, &m), *rclean = reasoning ? dt_utf8_clean(reasoning, rn, &m) : NULL;
    cJSON *o = cJSON_CreateObject(), *choices, *ch;
    char id[40];
    snprintf(id, sizeof id, "%s-%ld", chat ? "chatcmpl" : "cmpl", cs->id);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddStringToObject(o, "object", !chat ? "text_completion" : whole ? "chat.completion" : "chat.completion.chunk");
    cJSON_AddNumberToObject(o, "created", (double)cs->created);
    cJSON_AddStringToObject(o, "model", cs->h->model_name);
    choices = cJSON_AddArrayToObject(o, "choices");
    ch = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, ch);
    cJSON_AddNumberToObject(ch, "index", 0);
    choice_text(ch, chat, whole, cs->chunks++ == 0, clean ? clean : "", reasoning ? rclean ? rclean : "" : NULL, calls);
    cJSON_AddItemToObject(ch, "logprobs", logprobs_json(cs, reason ? cs->job->len : cs->job->visible, reason != NULL));
    if (reason) cJSON_AddStringToObject(ch, "finish_reason", reason);
    else cJSON_AddNullToObject(ch, "finish_reason");
    if (usage) add_usage(o, cs->job);
    else if (cs->job->p.stream_usage) cJSON_AddNullToObject(o, "usage"); /* (OpenAI's: null on every chunk but the last) */
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
    free(clean), free(rclean);
    return s;
}

static void out_append(conn_state *cs, const char *a, const char *b, const char *c) {
    const char *parts[3] = { a, b, c };
    for (int i = 0; i < 3; i++) {
        size_t n = parts[i] ? strlen(parts[i]) : 0;
        char *o = realloc(cs->out, cs->out_len + n + 1);
        if (!o) return;
        cs->out = o;
        memcpy(cs->out + cs->out_len, parts[i] ? parts[i] : "", n);
        cs->out_len += n;
        cs->out[cs->out_len] = 0;
    }
}

static bool peer_closed(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    if (!ci) return false;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* A stream's last chunk (its finish reason) and the end. */
static void stream_end(conn_state *cs, const char *reason) {
    char *s = completion_json(cs, "", 0, NULL, 0, reason, false, NULL), *u = cs->job->p.stream_usage ? usage_json(cs) : NULL;
    out_append(cs, "data: ", s, "\n\n");
    if (u) out_append(cs, "data: ", u, "\n\n");
    out_append(cs, "data: [DONE]\n\n", NULL, NULL);
    free(s), free(u);
    cs->finished = true;
}

static void stream_chunk(conn_state *cs, const char *text, size_t n, const char *reasoning, size_t rn, cJSON *calls) {
    char *s = completion_json(cs, text, n, reasoning, rn, NULL, false, calls);
    out_append(cs, "data: ", s, "\n\n");
    free(s);
}

/* The form of tool calls the model's template writes (dt_chat_template.tools). */
static int tool_form(const conn_state *cs) {
    const dt_chat_template *t = dt_chat_template_of(cs->h->vocab->chat);
    return t ? t->tools : 0;
}

/* The whole answer, its content n bytes at text (and its reasoning): with tools, its calls read from the content. */
static void whole_answer(conn_state *cs, const char *text, size_t n, const char *reasoning, size_t rn) {
    cJSON *calls = cs->job->p.chat && cs->job->p.tools ? serve_tool_calls(tool_form(cs), text, n, cs->id, &n) : NULL;
    char *s = completion_json(cs, text, n, reasoning, rn, calls ? "tool_calls" : finish_reason(cs->job), true, calls);
    out_append(cs, s, "\n", NULL);
    free(s);
    cs->finished = true;
}

/* A stream with tools: the content (from text + c0, its settled bytes to end) sent up to where a call may start (the
 * blocks held back); once done, the calls read from it in one chunk (OpenAI's deltas, each with its index), or the
 * held text where it makes none. */
static void stream_with_tools(conn_state *cs, const char *text, size_t c0, size_t end, bool done) {
    size_t upto = c0 + dt_chat_calls_text(tool_form(cs), text + c0, end - c0), n = end - c0;
    cJSON *calls = done ? serve_tool_calls(tool_form(cs), text + c0, end - c0, cs->id, &n) : NULL, *c;
    if (done) upto = c0 + n;
    if (upto > c0 + cs->sent_c) stream_chunk(cs, text + c0 + cs->sent_c, upto - c0 - cs->sent_c, NULL, 0, NULL);
    cs->sent_c = upto - c0;
    int k = 0;
    cJSON_ArrayForEach(c, calls) cJSON_AddNumberToObject(c, "index", k++);
    if (calls) stream_chunk(cs, "", 0, NULL, 0, calls);
    if (done) stream_end(cs, calls ? "tool_calls" : finish_reason(cs->job));
}

/* Under the job's lock, a thinking model's chat answer: a stream's newly settled reasoning and content, and the last
 * chunk; or the whole message with its reasoning_content. */
static void produce_thinking(conn_state *cs, bool done) {
    serve_job *j = cs->job;
    const char *text = j->text ? j->text : ""; /* (none before the first token) */
    serve_split sp;
    serve_reasoning_split(text, done ? j->len : j->visible, done, &sp);
    if (!j->p.stream) {
        if (done) whole_answer(cs, text + sp.c0, j->len - sp.c0, sp.thinks ? text + sp.r0 : NULL, sp.r1 - sp.r0);
        return;
    }
    size_t r_at, r_new, c_at, c_new;
    serve_reasoning_next(&sp, cs->sent_r, cs->sent_c, &r_at, &r_new, &c_at, &c_new);
    if (j->p.tools) c_new = 0; /* (the content's own way, below) */
    if (r_new || c_new) stream_chunk(cs, text + c_at, c_new, r_new ? text + r_at : NULL, r_new, NULL);
    cs->sent_r += r_new, cs->sent_c += c_new;
    cs->sent = j->visible;
    if (j->p.tools && (sp.settled > sp.c0 || done)) stream_with_tools(cs, text, sp.c0, sp.settled > sp.c0 ? sp.settled : sp.c0, done);
    else if (done) stream_end(cs, finish_reason(j));
}

/* Under the job's lock: what the client gets next (a stream's new text; the whole completion once done). */
static void produce(conn_state *cs) {
    serve_job *j = cs->job;
    bool done = j->state == JOB_DONE;
    if (j->failed) {
        char *s = NULL;
        cJSON *o = cJSON_CreateObject(), *e = cJSON_AddObjectToObject(o, "error");
        cJSON_AddStringToObject(e, "message", j->message);
        cJSON_AddStringToObject(e, "type", "server_error");
        s = cJSON_PrintUnformatted(o);
        cJSON_Delete(o);
        out_append(cs, j->p.stream ? "data: " : "", s, j->p.stream ? "\n\ndata: [DONE]\n\n" : "");
        free(s);
        cs->finished = true;
        return;
    }
    const dt_chat_template *t = dt_chat_template_of(cs->h->vocab->chat);
    if (j->p.chat && t && t->no_think) { /* (a thinking model's reasoning in reasoning_content) */
        produce_thinking(cs, done);
        return;
    }
    if (j->p.stream && j->p.tools) { /* (a chat's text from its start: no echo) */
        stream_with_tools(cs, j->text ? j->text : "", 0, done ? j->len : j->visible, done);
        cs->sent = j->visible;
        return;
    }
    if (j->p.stream && j->visible > cs->sent) {
        stream_chunk(cs, j->text + cs->sent, j->visible - cs->sent, NULL, 0, NULL);
        cs->sent = j->visible;
    }
    if (!done) return;
    if (j->p.stream) {
        stream_end(cs, finish_reason(j));
        return;
    }
    whole_answer(cs, j->text, j->len, NULL, 0);
}

/* libmicrohttpd closes a connection idle for its timeout (serve_http_idle_seconds), and a connection waiting here on its
 * job (queued, or generating a long completion) sends nothing: it would be cut mid-response. So no timeout while the
 * job is waited on (a client that leaves is seen within a quarter second, below), and the timeout again, its clock
 * restarted, while the bytes go out (a client that stops reading). */
static void idle_timeout(conn_state *cs, bool on) {
    MHD_set_connection_option(cs->conn, MHD_CONNECTION_OPTION_TIMEOUT, on ? serve_http_idle_seconds(cs->h->upload_seconds) : 0u);
}

static ssize_t reader(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    conn_state *cs = cls;
    serve_job *j = cs->job;
    while (cs->out_off == cs->out_len) {
        if (cs->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        cs->out_len = cs->out_off = 0;
        idle_timeout(cs, false);
        pthread_mutex_lock(&j->mu);
        while (!(j->state == JOB_DONE || (j->p.stream && j->visible > cs->sent))) {
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 250000000;
            if (t.tv_nsec >= 1000000000) { t.tv_sec++; t.tv_nsec -= 1000000000; }
            if (pthread_cond_timedwait(&j->cv, &j->mu, &t) == ETIMEDOUT && peer_closed(cs->conn)) {
                j->cancelled = true; /* the client left: its slot frees at the next token */
                pthread_mutex_unlock(&j->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        produce(cs);
        pthread_mutex_unlock(&j->mu);
        idle_timeout(cs, true);
    }
    size_t n = cs->out_len - cs->out_off < max ? cs->out_len - cs->out_off : max;
    memcpy(buf, cs->out + cs->out_off, n);
    cs->out_off += n;
    return (ssize_t)n;
}

static void reader_done(void *cls) { conn_release(cls); }

static enum MHD_Result completions(serve_http *h, conn_state *cs, bool chat) {
    serve_params p;
    const char *param;
    if (serve_params_parse(cs->body ? cs->body : "", cs->len, h->vocab, h->context, chat, &p, &param))
        return send_error(h, cs->conn, 400, param, dt_last_error());
    pthread_mutex_lock(&h->mu);
    cs->id = ++h->next_id;
    pthread_mutex_unlock(&h->mu);
    cs->created = (long)time(NULL);
    serve_job *j = serve_job_create(&p, cs->id);
    if (!j) { serve_params_free(&p); return send_error(h, cs->conn, 500, NULL, "out of memory"); }
    bool scores = j->p.echo && j->p.logprobs;
    if (j->p.echo) /* the prompt's text first (with logprobs, an entry a token, scored as the prompt is read) */
        for (int i = 0; i < j->p.nprompt; i++)
            if ((scores && !serve_job_add_logprob(j, j->p.prompt[i], j->len)) || serve_vocab_append(h->vocab, j->p.prompt[i], &j->text, &j->len, &j->cap)) {
                serve_job_release(j), serve_job_release(j);
                return send_error(h, cs->conn, 500, NULL, "out of memory for the echoed prompt");
            }
    j->base = j->len;
    j->visible = scores ? 0 : j->len; /* (the prompt's scores come with the first token, or the end) */
    if (serve_engine_submit(h->engine, j)) {
        serve_job_release(j); /* the engine's reference, never taken */
        serve_job_release(j);
        return send_error(h, cs->conn, 503, NULL, dt_last_error());
    }
    cs->job = j;
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, cs, reader_done);
    if (!r) return MHD_NO;
    cs->refs++;
    MHD_add_response_header(r, "Content-Type", j->p.stream ? "text/event-stream" : "application/json");
    if (j->p.stream) MHD_add_response_header(r, "Cache-Control", "no-cache");
    enum MHD_Result ok = MHD_queue_response(cs->conn, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result metrics(serve_http *h, struct MHD_Connection *c) {
    serve_stats s = serve_engine_stats(h->engine);
    pthread_mutex_lock(&h->mu);
    long e4 = h->errors_4xx, e5 = h->errors_5xx;
    pthread_mutex_unlock(&h->mu);
    char t[2048];
    snprintf(t, sizeof t,
             "# HELP dtrain_requests_total completion requests that reached the queue or were turned away by it\n"
             "dtrain_requests_total %ld\n"
             "dtrain_requests_rejected_total %ld\n"
             "dtrain_requests_completed_total %ld\n"
             "dtrain_requests_cancelled_total %ld\n"
             "# HELP dtrain_http_errors_total responses with an error status, by class\n"
             "dtrain_http_errors_total{class=\"4xx\"} %ld\n"
             "dtrain_http_errors_total{class=\"5xx\"} %ld\n"
             "dtrain_prompt_tokens_total %ld\n"
             "dtrain_generated_tokens_total %ld\n"
             "# HELP dtrain_tokens_per_second tokens generated per second over the last second or more of work\n"
             "dtrain_tokens_per_second %.2f\n"
             "dtrain_batch_running %d\n"
             "dtrain_batch_slots %d\n"
             "# HELP dtrain_batch_occupancy requests running over the batch's slots\n"
             "dtrain_batch_occupancy %.3f\n"
             "dtrain_queue_length %d\n"
             "dtrain_queue_capacity %d\n"
             "dtrain_steps_total %ld\n"
             "# HELP dtrain_step_rows_total rows (prompt and decode tokens) through the model\n"
             "dtrain_step_rows_total %ld\n"
             "dtrain_busy_seconds_total %.3f\n",
             s.requests, s.rejected, s.completed, s.cancelled, e4, e5, s.prompt_tokens, s.tokens, s.tokens_per_s, s.running, s.slots,
             s.slots ? (double)s.running / s.slots : 0.0, s.queued, s.queue_cap, s.steps, s.rows, s.busy_s);
    return send_text(c, 200, "text/plain; version=0.0.4", t);
}

static enum MHD_Result route(serve_http *h, conn_state *cs, const char *url, const char *method) {
    bool get = !strcmp(method, "GET"), post = !strcmp(method, "POST");
    if (!strcmp(url, "/v1/completions"))
        return post ? completions(h, cs, false) : send_error(h, cs->conn, 405, NULL, "/v1/completions takes POST");
    if (!strcmp(url, "/v1/chat/completions"))
        return post ? completions(h, cs, true) : send_error(h, cs->conn, 405, NULL, "/v1/chat/completions takes POST");
    if (!strcmp(url, "/health"))
        return get ? send_text(cs->conn, 200, "application/json", h->draining ? "{\"status\":\"draining\"}" : "{\"status\":\"ok\"}")
                   : send_error(h, cs->conn, 405, NULL, "/health takes GET");
    if (!strcmp(url, "/metrics")) return get ? metrics(h, cs->conn) : send_error(h, cs->conn, 405, NULL, "/metrics takes GET");
    if (!strcmp(url, "/v1/models") && get) {
        char t[512];
        snprintf(t, sizeof t, "{\"object\":\"list\",\"data\":[{\"id\":\"%s\",\"object\":\"model\",\"owned_by\":\"dtrain\"}]}", h->model_name);
        return send_text(cs->conn, 200, "application/json", t);
    }
    char m[400];
    snprintf(m, sizeof m, "no such endpoint: %.200s (this server has POST /v1/completions, /v1/chat/completions, GET /health, /metrics, /v1/models)", url);
    return send_error(h, cs->conn, 404, NULL, m);
}

enum MHD_Result serve_http_handle(void *cls, struct MHD_Connection *c, const char *url, const char *method, const char *version,
                                  const char *data, size_t *size, void **con_cls) {
    (void)version;
    serve_http *h = cls;
    conn_state *cs = *con_cls;
    if (!cs) {
        if (!(cs = calloc(1, sizeof *cs))) return MHD_NO;
        *cs = (conn_state){ .h = h, .conn = c, .t0 = serve_now(), .refs = 1 };
        *con_cls = cs;
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Content-Length");
        if (cl && strtod(cl, NULL) > (double)h->max_body) cs->too_large = true;
        if (!cs->too_large) return MHD_YES;
    }
    char m[160];
    if (cs->too_large || cs->len + *size > h->max_body) {
        snprintf(m, sizeof m, "the body is larger than this server takes (%zu bytes)", h->max_body);
        if (!*size && !cs->len) return send_error(h, c, 413, NULL, m); /* said by its Content-Length, before any of it */
        return abort_upload(h, c, 413, "Content Too Large", m);
    }
    if (*size) {
        if (serve_now() - cs->t0 > h->upload_seconds) {
            snprintf(m, sizeof m, "the request took longer than %.0f s to arrive", h->upload_seconds);
            return abort_upload(h, c, 408, "Request Timeout", m);
        }
        if (cs->len + *size + 1 > cs->cap) {
            size_t cap = (cs->len + *size + 1) * 2;
            char *b = realloc(cs->body, cap < h->max_body + 1 ? cap : h->max_body + 1);
            if (!b) return MHD_NO;
            cs->body = b;
            cs->cap = cap < h->max_body + 1 ? cap : h->max_body + 1;
        }
        memcpy(cs->body + cs->len, data, *size);
        cs->len += *size;
        cs->body[cs->len] = 0;
        *size = 0;
        return MHD_YES;
    }
    return route(h, cs, url, method);
}

void serve_http_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode why) {
    (void)cls;
    (void)c;
    (void)why;
    if (*con_cls) conn_release(*con_cls);
    *con_cls = NULL;
}
