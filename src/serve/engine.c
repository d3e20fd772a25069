/* The engine thread: jobs wait in a bounded queue; whenever a batch slot is
 * free the oldest joins the batcher, and while anything runs the batcher
 * steps. Each new token goes into its job's text under the job's lock; the
 * HTTP thread that waits on the job sends it. */
#include "serve_internal.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct serve_engine {
    dt_decoder *d;
    dt_batcher *b;
    const serve_vocab *v;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    serve_job *head, *tail;
    serve_job **running;      /* the jobs in the batcher (its slots' worth) */
    bool draining, broken;
    serve_stats st;
    long new_tokens;          /* engine thread only: tokens since its last tally */
    double rate_t0;
    long rate_tok0;
};

double serve_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

serve_job *serve_job_create(serve_params *p, long id, serve_lock *lock) {
    serve_job *j = calloc(1, sizeof *j);
    if (!j) return NULL;
    if (!lock && (lock = calloc(1, sizeof *lock))) {
        pthread_mutex_init(&lock->mu, NULL);
        pthread_cond_init(&lock->cv, NULL);
    }
    if (!lock) { free(j); return NULL; }
    pthread_mutex_lock(&lock->mu);
    lock->refs++;
    pthread_mutex_unlock(&lock->mu);
    j->lock = lock;
    j->p = *p;
    memset(p, 0, sizeof *p);
    j->refs = 2;
    j->id = id;
    j->t_queued = serve_now();
    return j;
}

void serve_job_release(serve_job *j) {
    serve_lock *l = j->lock;
    pthread_mutex_lock(&l->mu);
    int left = --j->refs, lock_left = left ? 1 : --l->refs;
    pthread_mutex_unlock(&l->mu);
    if (left) return;
    serve_params_free(&j->p);
    free(j->text);
    free(j->lp);
    free(j->plp);
    free(j);
    if (lock_left) return;
    pthread_mutex_destroy(&l->mu);
    pthread_cond_destroy(&l->cv);
    free(l);
}

serve_logprob *serve_job_add_logprob(serve_job *j, int32_t token, size_t at) {
    if (j->nlp == j->caplp) {
        int cap = j->caplp ? 2 * j->caplp : 64;
        serve_logprob *lp = realloc(j->lp, sizeof *lp * (size_t)cap);
        if (!lp) return NULL;
        j->lp = lp, j->caplp = cap;
    }
    serve_logprob *x = &j->lp[j->nlp++];
    x->token = token, x->logprob = NAN, x->at = at, x->textless = false;
    return x;
}

void serve_job_cancel(serve_job *j) {
    pthread_mutex_lock(&j->lock->mu);
    j->cancelled = true;
    pthread_mutex_unlock(&j->lock->mu);
}

/* Bytes at the end of text[0, len) that cannot go out yet: the start of a multi-byte character whose rest has not come. */
static size_t partial_char(const char *t, size_t len) {
    for (size_t k = 1; k <= 3 && k <= len; k++) {
        unsigned char c = (unsigned char)t[len - k];
        if ((c & 0xC0) == 0x80) continue; /* a continuation byte: look further back */
        size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
        return need > k ? k : 0;
    }
    return 0;
}

/* After a token: a stop sequence found is cut off (true); else what can be shown is all but a possible stop's start. */
static bool find_stop(serve_job *j, size_t before, size_t base) {
    size_t hold = 0, cut = j->len;
    bool stop = false;
    for (int i = 0; i < j->p.nstop; i++) {
        const char *s = j->p.stop[i];
        size_t n = strlen(s), from = before >= base + n ? before - n + 1 : base;
        for (size_t at = from; at + n <= j->len; at++)
            if (!memcmp(j->text + at, s, n)) {
                if (at < cut) cut = at;
                stop = true;
                break;
            }
        for (size_t k = n - 1 < j->len - base ? n - 1 : j->len - base; k > hold; k--)
            if (!memcmp(j->text + j->len - k, s, k)) { hold = k; break; }
    }
    if (stop) {
        j->len = cut;
        j->text[cut] = 0;
        j->visible = cut;
        return true;
    }
    size_t pc = partial_char(j->text, j->len);
    j->visible = j->len - (hold > pc ? hold : pc);
    return false;
}

/* A token's log-probability and alternatives (the job's logprobs' count), worked out before taking the job's lock. */
static void logprob_of(const serve_job *j, const float *logits, int32_t token, serve_logprob *out) {
    out->logprob = dt_logprob_top(logits, j->engine->v->vocab, token, j->p.top, out->top, out->top_lp);
}

static bool stop_id(const serve_job *j, int32_t token) {
    for (int i = 0; i < j->p.nstop_ids; i++)
        if (j->p.stop_ids[i] == token) return true;
    return false;
}

static int on_token(void *ctx, int32_t token, const float *logits) {
    serve_job *j = ctx;
    serve_engine *e = j->engine;
    bool ends = dt_token_ends_has(&e->v->ends, token) && !j->p.ignore_eos, scored = j->p.logprobs;
    bool skipped = !ends && !j->p.keep_special && serve_vocab_special(e->v, token);
    serve_logprob one;
    if (scored) logprob_of(j, logits, token, &one);
    pthread_mutex_lock(&j->lock->mu);
    if (!j->generated++) j->t_first = serve_now();
    size_t before = j->len;
    bool stop = j->cancelled;
    serve_logprob *x = scored ? serve_job_add_logprob(j, token, before) : NULL;
    if (x) one.token = token, one.at = before, one.textless = ends || skipped, *x = one;
    if (scored && !x) {
        stop = j->failed = true;
        snprintf(j->message, sizeof j->message, "out of memory for logprobs");
    } else if (ends) {
        stop = true; /* the end of the text (or another end): a stop, not part of it */
    } else if (skipped) {
        stop = stop_id(j, token); /* its text left out (vLLM's skip_special_tokens; an end under ignore_eos too) */
    } else if (serve_vocab_append(e->v, token, &j->text, &j->len, &j->cap)) {
        stop = j->failed = true;
        snprintf(j->message, sizeof j->message, "%s", dt_last_error());
    } else if (find_stop(j, before, j->base) || stop_id(j, token)) {
        stop = true; /* (a stop sequence cut off; a stop_token_ids token kept, as vLLM's) */
    }
    pthread_mutex_unlock(&j->lock->mu);
    pthread_cond_broadcast(&j->lock->cv);
    e->new_tokens++;
    return stop;
}

/* The prompt's token pos + 1 scored by the logits after pos: the echoed prompt's entry (made when it was echoed) and
 * prompt_logprobs' (the top alternatives of both one list, most likely first; its rank among the logits). */
static void on_prompt(void *ctx, int pos, const float *logits) {
    serve_job *j = ctx;
    int V = j->engine->v->vocab, top = j->p.top > j->p.prompt_top ? j->p.top : j->p.prompt_top;
    int32_t token = j->p.prompt[pos + 1];
    serve_logprob one;
    one.logprob = dt_logprob_top(logits, V, token, top, one.top, one.top_lp);
    one.rank = 1; /* (prompt_logprobs' alone: a pass over the vocabulary a prompt token) */
    for (int v = 0; j->plp && v < V; v++) one.rank += logits[v] > logits[token];
    pthread_mutex_lock(&j->lock->mu);
    if (j->p.echo && pos + 1 < j->nlp) {
        serve_logprob *x = &j->lp[pos + 1];
        one.token = x->token, one.at = x->at, one.textless = false, *x = one;
    }
    if (j->plp) one.token = token, one.at = 0, one.textless = false, j->plp[pos + 1] = one;
    pthread_mutex_unlock(&j->lock->mu);
}

static void on_end(void *ctx, dt_finish why, int generated) {
    (void)generated;
    serve_job *j = ctx;
    pthread_mutex_lock(&j->lock->mu);
    j->state = JOB_DONE;
    j->why = why;
    j->visible = j->len;
    j->t_done = serve_now();
    bool cancelled = j->cancelled;
    pthread_mutex_unlock(&j->lock->mu);
    pthread_cond_broadcast(&j->lock->cv);
    serve_engine *e = j->engine;
    pthread_mutex_lock(&e->mu);
    if (cancelled) e->st.cancelled++;
    else e->st.completed++;
    for (int i = 0; i < e->st.slots; i++)
        if (e->running[i] == j) e->running[i] = NULL;
    pthread_mutex_unlock(&e->mu);
    serve_job_release(j);
}

/* A job that never ran (cancelled while queued, or the engine broken): done, with why. */
static void finish_unrun(serve_job *j, const char *message) {
    pthread_mutex_lock(&j->lock->mu);
    j->state = JOB_DONE;
    j->why = DT_FINISH_STOP;
    if (message) { j->failed = true; snprintf(j->message, sizeof j->message, "%s", message); }
    pthread_mutex_unlock(&j->lock->mu);
    pthread_cond_broadcast(&j->lock->cv);
    serve_job_release(j);
}

/* Under e->mu: the oldest queued jobs into the free slots. */
static void admit(serve_engine *e) {
    while (e->head && dt_batcher_free_slots(e->b) > 0) {
        serve_job *j = e->head;
        e->head = j->next;
        if (!e->head) e->tail = NULL;
        e->st.queued--;
        j->next = NULL;
        pthread_mutex_lock(&j->lock->mu);
        bool gone = j->cancelled;
        if (!gone) j->state = JOB_RUNNING;
        pthread_mutex_unlock(&j->lock->mu);
        if (gone) { e->st.cancelled++; finish_unrun(j, NULL); continue; }
        dt_infer_request r = { j->p.prompt, j->p.nprompt, j->p.max_tokens, j->p.sampling, j->p.seed, on_token, on_end, j,
                               (j->p.echo && j->p.logprobs) || j->plp ? on_prompt : NULL, &j->cached, j->p.salt };
        if (dt_batcher_add(e->b, &r)) { finish_unrun(j, dt_last_error()); continue; }
        e->st.prompt_tokens += j->p.nprompt;
        e->st.cached_tokens += j->cached;
        for (int i = 0; i < e->st.slots; i++)
            if (!e->running[i]) { e->running[i] = j; break; }
    }
}

static void tally(serve_engine *e, double busy) {
    dt_batcher_stats b = dt_batcher_get_stats(e->b);
    double now = serve_now();
    e->st.tokens += e->new_tokens;
    e->new_tokens = 0;
    e->st.steps = b.steps;
    e->st.rows = b.rows;
    e->st.running = b.running;
    e->st.busy_s += busy;
    if (now - e->rate_t0 >= 1.0) {
        e->st.tokens_per_s = (double)(e->st.tokens - e->rate_tok0) / (now - e->rate_t0);
        e->rate_t0 = now;
        e->rate_tok0 = e->st.tokens;
    }
}

/* Under e->mu, after a failed step (a rank died, or a bug; not a request's fault): say it, end every job, take no more work. */
static void fail_all(serve_engine *e) {
    dt_log(DT_LOG_ERROR, "serve: a decoding step failed: %s", dt_last_error());
    e->broken = e->draining = true;
    for (int i = 0; i < e->st.slots; i++)
        if (e->running[i]) { finish_unrun(e->running[i], "a decoding step failed"); e->running[i] = NULL; }
    while (e->head) {
        serve_job *j = e->head;
        e->head = j->next;
        e->st.queued--;
        finish_unrun(j, "a decoding step failed");
    }
    e->tail = NULL;
}

static void *engine_main(void *arg) {
    serve_engine *e = arg;
    pthread_mutex_lock(&e->mu);
    for (;;) {
        admit(e);
        if (dt_batcher_get_stats(e->b).running == 0) {
            if (e->draining && !e->head) break;
            e->st.tokens_per_s = 0;
            e->rate_t0 = serve_now();
            e->rate_tok0 = e->st.tokens;
            struct timespec t;
            clock_gettime(CLOCK_REALTIME, &t);
            t.tv_sec += 1;
            if (pthread_cond_timedwait(&e->cv, &e->mu, &t) == ETIMEDOUT) {
                /* idle: a step of no rows tells tensor-parallel followers the leader lives (their stall watch) */
                pthread_mutex_unlock(&e->mu);
                dt_status st = dt_decoder_step(e->d, NULL, 0, NULL);
                pthread_mutex_lock(&e->mu);
                if (st) { fail_all(e); break; }
            }
            continue;
        }
        pthread_mutex_unlock(&e->mu);
        double t0 = serve_now();
        dt_status st = dt_batcher_step(e->b);
        pthread_mutex_lock(&e->mu);
        tally(e, serve_now() - t0);
        if (st) { fail_all(e); break; }
    }
    pthread_mutex_unlock(&e->mu);
    return NULL;
}

dt_status serve_engine_create(dt_decoder *d, const serve_vocab *v, int budget, int queue_cap, serve_engine **out) {
    *out = NULL;
    serve_engine *e = calloc(1, sizeof *e);
    if (!e) return dt_error(DT_ERR_NOMEM, "serve: out of memory");
    e->d = d;
    e->v = v;
    e->st.slots = dt_decoder_slots(d);
    e->st.queue_cap = queue_cap;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->running = calloc((size_t)e->st.slots, sizeof(serve_job *));
    dt_status st = e->running ? dt_batcher_create(d, budget, &e->b) : dt_error(DT_ERR_NOMEM, "serve: out of memory");
    if (!st && pthread_create(&e->thread, NULL, engine_main, e)) st = dt_error(DT_ERR_SYS, "serve: cannot start the engine thread");
    e->started = !st;
    if (st) { serve_engine_destroy(e); return st; }
    *out = e;
    return DT_OK;
}

dt_status serve_engine_submit(serve_engine *e, serve_job *j) {
    pthread_mutex_lock(&e->mu);
    e->st.requests++;
    dt_status st = DT_OK;
    if (e->broken) st = dt_error(DT_ERR_UNSUPPORTED, "the server cannot decode any more (see its log)");
    else if (e->draining) st = dt_error(DT_ERR_UNSUPPORTED, "the server is shutting down");
    else if (e->st.queued >= e->st.queue_cap)
        st = dt_error(DT_ERR_UNSUPPORTED, "the server is busy: %d requests are waiting already", e->st.queued);
    if (st) {
        e->st.rejected++;
        pthread_mutex_unlock(&e->mu);
        return st;
    }
    j->engine = e;
    j->next = NULL;
    if (e->tail) e->tail->next = j;
    else e->head = j;
    e->tail = j;
    e->st.queued++;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return DT_OK;
}

serve_stats serve_engine_stats(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    serve_stats s = e->st;
    s.broken = e->broken;
    pthread_mutex_unlock(&e->mu);
    return s;
}

void serve_engine_drain(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    e->draining = true;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

bool serve_engine_idle(serve_engine *e) {
    pthread_mutex_lock(&e->mu);
    bool idle = !e->head;
    for (int i = 0; i < e->st.slots; i++) idle &= !e->running[i];
    pthread_mutex_unlock(&e->mu);
    return idle;
}

void serve_engine_destroy(serve_engine *e) {
    if (!e) return;
    if (e->started) {
        serve_engine_drain(e);
        pthread_join(e->thread, NULL);
    }
    while (e->head) { /* a broken engine's queue */
        serve_job *j = e->head;
        e->head = j->next;
        finish_unrun(j, "the server stopped before this request ran");
    }
    dt_batcher_destroy(e->b);
    free(e->running);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    free(e);
}
