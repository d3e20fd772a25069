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
    serve_answer a;    /* the response: its choices' jobs, the bytes ready (a.out) */
    size_t out_off;    /* of those, sent */
    int refs;          /* the request and its callback response */
} conn_state;

static void conn_release(conn_state *cs) {
    if (--cs->refs > 0) return; /* both are called from the connection's own thread */
    for (int i = 0; i < cs->a.n; i++) {
        serve_job_cancel(cs->a.ch[i].job);
        serve_job_release(cs->a.ch[i].job);
    }
    serve_answer_free(&cs->a);
    free(cs->body);
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

/* OpenAI's error object as text, counted (caller frees). */
static char *error_json(serve_http *h, unsigned status, const char *param, const char *message) {
    cJSON *o = serve_error_object(status, param, message);
    char *s = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
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

static bool peer_closed(struct MHD_Connection *c) {
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    char b;
    if (!ci) return false;
    ssize_t n = recv(ci->connect_fd, &b, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
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
    serve_answer *a = &cs->a;
    serve_lock *l = a->ch[0].job->lock; /* (every choice's) */
    while (cs->out_off == a->out_len) {
        if (a->finished) return MHD_CONTENT_READER_END_OF_STREAM;
        a->out_len = cs->out_off = 0;
        idle_timeout(cs, false);
        pthread_mutex_lock(&l->mu);
        while (!serve_answer_ready(a)) {
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_nsec += 250000000;
            if (t.tv_nsec >= 1000000000) { t.tv_sec++; t.tv_nsec -= 1000000000; }
            if (pthread_cond_timedwait(&l->cv, &l->mu, &t) == ETIMEDOUT && peer_closed(cs->conn)) {
                for (int i = 0; i < a->n; i++) a->ch[i].job->cancelled = true; /* the client left: the slots free at the next token */
                pthread_mutex_unlock(&l->mu);
                return MHD_CONTENT_READER_END_WITH_ERROR;
            }
        }
        serve_answer_produce(a);
        pthread_mutex_unlock(&l->mu);
        idle_timeout(cs, true);
    }
    size_t n = a->out_len - cs->out_off < max ? a->out_len - cs->out_off : max;
    memcpy(buf, a->out + cs->out_off, n);
    cs->out_off += n;
    return (ssize_t)n;
}

static void reader_done(void *cls) { conn_release(cls); }

/* Choice i's job (the caller's lock, NULL: the first's own) from p (taken; copied for every choice but the last), its
 * seed p's plus i, an echo's prompt text first. NULL: out of memory. */
static serve_job *choice_job(serve_http *h, serve_params *p, int i, long id, serve_lock *lock) {
    serve_params mine;
    if (i + 1 < p->n && serve_params_copy(p, &mine)) return NULL;
    serve_job *j = serve_job_create(i + 1 < p->n ? &mine : p, id, lock);
    if (!j) return NULL;
    j->p.seed += (uint64_t)i;
    bool scores = j->p.echo && j->p.logprobs;
    if (j->p.echo) /* the prompt's text first (with logprobs, an entry a token, scored as the prompt is read) */
        for (int k = 0; k < j->p.nprompt; k++)
            if ((scores && !serve_job_add_logprob(j, j->p.prompt[k], j->len)) || serve_vocab_append(h->vocab, j->p.prompt[k], &j->text, &j->len, &j->cap)) {
                serve_job_release(j), serve_job_release(j);
                return NULL;
            }
    if (j->p.prompt_lps && !(j->plp = calloc((size_t)j->p.nprompt, sizeof *j->plp))) {
        serve_job_release(j), serve_job_release(j);
        return NULL;
    }
    for (int k = 0; j->plp && k < j->p.nprompt; k++) j->plp[k].token = j->p.prompt[k], j->plp[k].logprob = NAN;
    j->base = j->len;
    j->visible = scores ? 0 : j->len; /* (the prompt's scores come with the first token, or the end) */
    return j;
}

static enum MHD_Result completions(serve_http *h, conn_state *cs, bool chat) {
    serve_params p;
    const char *param;
    if (serve_params_parse(cs->body ? cs->body : "", cs->len, h->vocab, h->context, chat, &p, &param))
        return send_error(h, cs->conn, 400, param, dt_last_error());
    serve_answer *a = &cs->a;
    *a = (serve_answer){ .vocab = h->vocab, .model_name = h->model_name, .created = (long)time(NULL), .chat = chat, .stream = p.stream };
    pthread_mutex_lock(&h->mu);
    a->id = h->next_id + 1; /* (the first choice's; the others' ids follow, their tool calls named by them) */
    h->next_id += p.n;
    pthread_mutex_unlock(&h->mu);
    int n = p.n;
    if (!(a->ch = calloc((size_t)n, sizeof *a->ch))) { serve_params_free(&p); return send_error(h, cs->conn, 500, NULL, "out of memory"); }
    for (int i = 0; i < n; i++, a->n++)
        if (!(a->ch[i].job = choice_job(h, &p, i, a->id + i, i ? a->ch[0].job->lock : NULL))) break;
    if (a->n < n) serve_params_free(&p);
    dt_status st = a->n < n ? dt_error(DT_ERR_NOMEM, "out of memory for the request's %d choices", n) : DT_OK;
    int in = 0;
    while (!st && in < n && !(st = serve_engine_submit(h->engine, a->ch[in].job))) in++;
    if (st) { /* the choices that went in are cancelled (each ends at once); the others' engine references never taken */
        for (int i = 0; i < a->n; i++) {
            serve_job_cancel(a->ch[i].job);
            if (i >= in) serve_job_release(a->ch[i].job);
            serve_job_release(a->ch[i].job);
        }
        a->n = 0;
        return send_error(h, cs->conn, st == DT_ERR_NOMEM ? 500 : 503, NULL, dt_last_error());
    }
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, reader, cs, reader_done);
    if (!r) return MHD_NO;
    cs->refs++;
    MHD_add_response_header(r, "Content-Type", a->stream ? "text/event-stream" : "application/json");
    if (a->stream) MHD_add_response_header(r, "Cache-Control", "no-cache");
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
             "# HELP dtrain_requests_total completions (a request of n choices: n) that reached the queue or were turned away by it\n"
             "dtrain_requests_total %ld\n"
             "dtrain_requests_rejected_total %ld\n"
             "dtrain_requests_completed_total %ld\n"
             "dtrain_requests_cancelled_total %ld\n"
             "# HELP dtrain_http_errors_total responses with an error status, by class\n"
             "dtrain_http_errors_total{class=\"4xx\"} %ld\n"
             "dtrain_http_errors_total{class=\"5xx\"} %ld\n"
             "dtrain_prompt_tokens_total %ld\n"
             "# HELP dtrain_prompt_tokens_cached_total prompt tokens whose keys and values a cache slot gave (prefix reuse)\n"
             "dtrain_prompt_tokens_cached_total %ld\n"
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
             s.requests, s.rejected, s.completed, s.cancelled, e4, e5, s.prompt_tokens, s.cached_tokens, s.tokens, s.tokens_per_s, s.running, s.slots,
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
