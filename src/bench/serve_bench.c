/* dtrain bench serve: offered load on dtrain serve. N client threads (libcurl)
 * each send streamed completions back to back for the given seconds; every
 * event's arrival is timed. Printed: requests done and failed (a status
 * other than 200, a stream without its end, a transfer error), tokens/s,
 * time to first token and inter-token latency percentiles, and the
 * server's peak resident memory. Without --url the bench starts the server
 * itself (dtrain serve MODEL --port 0) and stops it with SIGTERM at the end. */
#include "dtrain/bench.h"
#include "measure.h"

#include <curl/curl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef struct {
    double *v;
    size_t n, cap;
} samples;

static void add(samples *s, double x) {
    if (s->n == s->cap) {
        size_t c = s->cap ? s->cap * 2 : 1024;
        double *v = realloc(s->v, c * sizeof *v);
        if (!v) return;
        s->v = v;
        s->cap = c;
    }
    s->v[s->n++] = x;
}

typedef struct {
    const dt_bench_serve_opts *o;
    const char *url;
    const char *prefix; /* every prompt's start (--shared-prefix), or "" */
    int index;
    double until;
    long done, failed, tokens;
    samples ttft, itl;
    char why[256]; /* the first failure */
    /* the request in flight */
    double t0, last;
    int events;
    bool ended;
    char line[8192];
    size_t len;
} client;

/* Server-sent events as they arrive: each "data: {...}" line is a token (or a few), "data: [DONE]" the end. */
static size_t on_data(char *p, size_t size, size_t n, void *arg) {
    client *c = arg;
    size_t bytes = size * n;
    for (size_t i = 0; i < bytes; i++) {
        if (p[i] != '\n') {
            if (c->len + 1 < sizeof c->line) c->line[c->len++] = p[i];
            continue;
        }
        c->line[c->len] = 0;
        c->len = 0;
        if (strncmp(c->line, "data: ", 6)) continue;
        if (!strcmp(c->line + 6, "[DONE]")) { c->ended = true; continue; }
        if (!strstr(c->line, "\"text\":\"\"")) { /* the last event carries only the finish reason */
            double now = dt_time_now();
            if (c->events++ == 0) add(&c->ttft, now - c->t0);
            else add(&c->itl, now - c->last);
            c->last = now;
            c->tokens++;
        }
    }
    return bytes;
}

static void *run_client(void *arg) {
    client *c = arg;
    static const char *prompts[] = { "The ", "In the beginning", "And it came to pass", "Thou shalt", "For God so loved",
                                     "Blessed are", "Now the serpent", "Let there be" };
    CURL *h = curl_easy_init();
    struct curl_slist *hd = curl_slist_append(NULL, "Content-Type: application/json");
    size_t cap = strlen(c->prefix) + 512;
    char *body = malloc(cap);
    for (int k = 0; h && body && dt_time_now() < c->until; k++) {
        snprintf(body, cap, "{\"prompt\":\"%s%s\",\"max_tokens\":%d,\"temperature\":0.8,\"seed\":%d,\"stream\":true}", c->prefix,
                 prompts[(c->index + k) % 8], c->o->max_tokens, c->index * 100000 + k);
        curl_easy_setopt(h, CURLOPT_URL, c->url);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hd);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
        curl_easy_setopt(h, CURLOPT_TIMEOUT, 300L);
        c->t0 = dt_time_now();
        c->events = 0;
        c->ended = false;
        c->len = 0;
        CURLcode rc = curl_easy_perform(h);
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        if (rc == CURLE_OK && status == 200 && c->ended) { c->done++; continue; }
        if (!c->failed++)
            snprintf(c->why, sizeof c->why, "%s, status %ld%s", curl_easy_strerror(rc), status, c->ended ? "" : ", no end of stream");
    }
    free(body);
    curl_slist_free_all(hd);
    curl_easy_cleanup(h);
    return NULL;
}

/* A system prompt of about n bytes: a passage's sentences in turn (JSON-safe: letters, spaces, commas and periods). */
static char *shared_prefix(int n) {
    static const char *const said[] = { "You are a careful assistant who answers in plain words. ",
                                        "Read the question, think about what is asked, and say only what you know. ",
                                        "When a passage is quoted, keep its words, its order and its meaning. ",
                                        "Prefer short sentences, and name the source of every figure you give. " };
    char *p = malloc((size_t)n + 128);
    size_t len = 0;
    for (int k = 0; p && (int)len < n; k++) len += (size_t)sprintf(p + len, "%s", said[k % 4]);
    if (p) p[len] = 0;
    return p;
}

typedef struct { char b[8192]; size_t n; } text_buf;

static size_t on_text(char *p, size_t size, size_t n, void *arg) {
    text_buf *t = arg;
    size_t bytes = size * n, k = bytes < sizeof t->b - 1 - t->n ? bytes : sizeof t->b - 1 - t->n;
    memcpy(t->b + t->n, p, k);
    t->n += k;
    t->b[t->n] = 0;
    return bytes;
}

/* A counter from the server's /metrics (the URL's path replaced); -1 if unreadable. */
static double metric(const char *completions_url, const char *name) {
    char url[512];
    snprintf(url, sizeof url, "%s", completions_url);
    char *path = strstr(url, "/v1/completions");
    if (!path) return -1;
    snprintf(path, sizeof url - (size_t)(path - url), "/metrics");
    text_buf t = { .n = 0 };
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_text);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &t);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 10L);
    CURLcode rc = curl_easy_perform(h);
    curl_easy_cleanup(h);
    if (rc != CURLE_OK) return -1;
    for (char *l = t.b; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL)
        if (!strncmp(l, name, strlen(name)) && l[strlen(name)] == ' ') return atof(l + strlen(name) + 1);
    return -1;
}

static double pct(samples *s, double p) {
    if (!s->n) return 0;
    dt_bench_median(s->v, (int)s->n); /* sorts */
    size_t i = (size_t)(p * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

/* dtrain serve MODEL --port 0 as a child: its pid, and the URL it listens on. */
static pid_t start_server(const dt_bench_serve_opts *o, char *url, size_t cap) {
    char self[4096], exe[4200], slots[16], threads[16], *log = "/tmp/dtrain-bench-serve.log";
    if (dt_bench_self_dir(self, sizeof self)) return -1;
    snprintf(exe, sizeof exe, "%s/dtrain", self);
    snprintf(slots, sizeof slots, "%d", o->slots);
    snprintf(threads, sizeof threads, "%d", o->threads);
    unlink(log);
    pid_t pid = fork();
    if (pid == 0) {
        if (!freopen(log, "w", stdout)) _exit(127);
        execl(exe, exe, "serve", o->model, "--port", "0", "--slots", slots, "--threads", threads, "--quantize", o->quant,
              (char *)NULL);
        _exit(127);
    }
    for (int i = 0; i < 600; i++) { /* up to a minute for the model to load */
        FILE *f = fopen(log, "r");
        char line[1024];
        while (f && fgets(line, sizeof line, f)) {
            char *u = strstr(line, "listening on ");
            if (u) {
                u += 13;
                u[strcspn(u, "\n")] = 0;
                snprintf(url, cap, "%s/v1/completions", u);
                fclose(f);
                return pid;
            }
        }
        if (f) fclose(f);
        if (waitpid(pid, NULL, WNOHANG) == pid) return -1;
        usleep(100000);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
    return -1;
}

static long peak_kb(pid_t pid) {
    char path[64], line[256];
    long kb = -1;
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    FILE *f = fopen(path, "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6)) kb = atol(line + 6);
    if (f) fclose(f);
    return kb;
}

/* The clients' figures: requests, throughput (tokens: the server's count over the run, < 0 where it has none), the
 * latencies' percentiles. */
static void print_results(client *all, const char *why, double secs, double tokens) {
    printf("requests: %ld done, %ld failed%s%s%s\n", all->done, all->failed, why ? " (first: " : "", why ? why : "", why ? ")" : "");
    if (tokens >= 0)
        printf("throughput: %.1f tokens/s (the server's count), %.2f requests/s over %.1f s\n", tokens / secs, all->done / secs, secs);
    else printf("throughput: %.2f requests/s over %.1f s (no /metrics to count tokens)\n", all->done / secs, secs);
    printf("time to first token (ms): p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", 1e3 * pct(&all->ttft, 0.5), 1e3 * pct(&all->ttft, 0.9),
           1e3 * pct(&all->ttft, 0.99), 1e3 * pct(&all->ttft, 1));
    /* an event carries every token made since the last one was sent: gaps between events, per event */
    printf("inter-token latency, between streamed events (ms): p50 %.1f  p90 %.1f  p99 %.1f  max %.1f\n", 1e3 * pct(&all->itl, 0.5),
           1e3 * pct(&all->itl, 0.9), 1e3 * pct(&all->itl, 0.99), 1e3 * pct(&all->itl, 1));
}

/* The server it started: its peak memory (and rss_mid, when the clients had started), then SIGTERM and its exit. */
static void stop_server(pid_t server, long rss_mid) {
    long rss = peak_kb(server);
    printf("server peak resident memory: %.1f MB (%.1f MB when the clients had started)\n", rss / 1024.0, rss_mid / 1024.0);
    kill(server, SIGTERM);
    int status = 0;
    waitpid(server, &status, 0);
    printf("server stopped by SIGTERM: exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
}

/* One load on the server at url: its figures printed; *tps and *ttft (p50) for a comparison; exit code 1 if a request
 * failed. */
static int load(const dt_bench_serve_opts *o, const char *url, pid_t server, const char *prefix, double *tps, double *ttft) {
    client *cs = calloc((size_t)o->clients, sizeof *cs);
    pthread_t *th = calloc((size_t)o->clients, sizeof *th);
    if (!cs || !th) { free(cs), free(th); dt_log(DT_LOG_ERROR, "bench serve: out of memory"); return 1; }
    double tok0 = metric(url, "dtrain_generated_tokens_total"), t0 = dt_time_now(), until = t0 + o->seconds;
    double p0 = metric(url, "dtrain_prompt_tokens_total"), c0 = metric(url, "dtrain_prompt_tokens_cached_total");
    for (int i = 0; i < o->clients; i++) {
        cs[i] = (client){ .o = o, .url = url, .prefix = prefix, .index = i, .until = until };
        pthread_create(&th[i], NULL, run_client, &cs[i]);
    }
    long rss_mid = server > 0 ? peak_kb(server) : -1;
    client all = { 0 };
    const char *why = NULL;
    for (int i = 0; i < o->clients; i++) {
        pthread_join(th[i], NULL);
        all.done += cs[i].done;
        all.failed += cs[i].failed;
        all.tokens += cs[i].tokens;
        for (size_t k = 0; k < cs[i].ttft.n; k++) add(&all.ttft, cs[i].ttft.v[k]);
        for (size_t k = 0; k < cs[i].itl.n; k++) add(&all.itl, cs[i].itl.v[k]);
        if (cs[i].failed && !why) why = cs[i].why;
    }
    double secs = dt_time_now() - t0, tok1 = metric(url, "dtrain_generated_tokens_total");
    double p1 = metric(url, "dtrain_prompt_tokens_total"), c1 = metric(url, "dtrain_prompt_tokens_cached_total");
    print_results(&all, why, secs, tok0 >= 0 && tok1 >= 0 ? tok1 - tok0 : -1);
    if (p0 >= 0 && p1 > p0 && c0 >= 0 && c1 >= 0)
        printf("prompt tokens: %.0f, of them %.0f (%.1f%%) from a cache slot\n", p1 - p0, c1 - c0, 100 * (c1 - c0) / (p1 - p0));
    *tps = tok0 >= 0 && tok1 >= 0 ? (tok1 - tok0) / secs : 0;
    *ttft = pct(&all.ttft, 0.5);
    int rc = all.failed ? 1 : 0;
    if (server > 0) stop_server(server, rss_mid);
    for (int i = 0; i < o->clients; i++) { free(cs[i].ttft.v); free(cs[i].itl.v); }
    free(all.ttft.v);
    free(all.itl.v);
    free(cs);
    free(th);
    return rc;
}

int dt_bench_serve(const dt_bench_serve_opts *o) {
    char url[512], cpu[128], *prefix = o->shared_prefix > 0 ? shared_prefix(o->shared_prefix) : NULL;
    if (o->shared_prefix > 0 && !prefix) { dt_log(DT_LOG_ERROR, "bench serve: out of memory"); return 1; }
    curl_global_init(CURL_GLOBAL_DEFAULT);
    /* with a shared prefix and a server of its own: a second pass reading each prompt whole, the ratios in the same run */
    int passes = prefix && !o->url ? 2 : 1, rc = 0;
    double tps[2] = { 0 }, ttft[2] = { 0 };
    for (int pass = 0; pass < passes && !rc; pass++) {
        pid_t server = -1;
        if (pass) setenv("DTRAIN_PREFIX_REUSE", "off", 1);
        if (o->url) snprintf(url, sizeof url, "%s", o->url);
        else server = start_server(o, url, sizeof url);
        if (pass) unsetenv("DTRAIN_PREFIX_REUSE"); /* (the server has it) */
        if (!o->url && server < 0) {
            dt_log(DT_LOG_ERROR, "bench serve: dtrain serve %s did not start (see /tmp/dtrain-bench-serve.log)", o->model);
            rc = 1;
            break;
        }
        printf("# dtrain bench serve: %d clients for %.0f s, %d tokens a request (streamed)", o->clients, o->seconds, o->max_tokens);
        if (prefix) printf(", every prompt after the same %zu bytes%s", strlen(prefix), passes == 1 ? "" : pass ? ", each read whole" : ", prefixes reused");
        printf(", against %s; %s\n", url, dt_cpu_model(cpu, sizeof cpu));
        rc = load(o, url, server, prefix ? prefix : "", &tps[pass], &ttft[pass]);
    }
    if (passes == 2 && !rc && tps[1] > 0 && ttft[0] > 0)
        printf("prefix reuse against each prompt read whole: throughput %.2fx, time to first token (p50) %.2fx shorter\n", tps[0] / tps[1],
               ttft[1] / ttft[0]);
    free(prefix);
    curl_global_cleanup();
    return rc;
}
