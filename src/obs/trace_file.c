/* Trace files: what base's recorder holds, as Chrome trace-event JSON that
 * Perfetto and chrome://tracing open. Each rank is a process ("pid" = rank),
 * each track a thread (compute, communication, data, checkpoint I/O); the
 * events are begin/end pairs, their times in microseconds since rank 0
 * started the trace. Ranks on one machine share CLOCK_MONOTONIC; across
 * machines each rank's offset to rank 0 is measured at the start (the
 * median of a few barrier-aligned readings: within a barrier's skew). */
#include "dtrain/obs.h"
#include "dtrain/io.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dt_trace_file {
    char *path;
    dt_comm *w;
    int first, last;
    double origin;   /* rank 0's clock at the start, in this rank's clock */
};

static const char *const track_names[DT_TRACK_COUNT] = { "compute", "communication", "data", "checkpoint I/O", "GPU" };

dt_status dt_trace_parse_steps(const char *s, int *first, int *last) {
    char *end;
    long a = strtol(s, &end, 10), b;
    if (end == s || *end != ':') goto bad;
    const char *q = end + 1;
    b = strtol(q, &end, 10);
    if (end == q || *end || a < 1 || b < a || b > 1000000000L) goto bad;
    *first = (int)a;
    *last = (int)b;
    return DT_OK;
bad:
    return dt_error(DT_ERR_ARG, "--trace-steps %s: expected A:B, the first and last step to trace (1 <= A <= B)", s);
}

/* rank 0's clock minus ours, at the same moment */
static dt_status clock_offset(dt_comm *w, double *offset) {
    *offset = 0;
    if (!w || dt_comm_size(w) == 1 || dt_comm_nodes(w) == 1) return DT_OK;
    enum { K = 7 };
    double d[K];
    int p = dt_comm_size(w);
    double *all = malloc(sizeof *all * (size_t)p);
    if (!all) return dt_error(DT_ERR_NOMEM, "trace: out of memory");
    dt_status st = DT_OK;
    for (int k = 0; k < K && !st; k++) {
        st = dt_comm_barrier(w);
        double now = dt_time_now();
        if (!st) st = dt_comm_allgather(w, &now, all, 1, DT_F64);
        d[k] = all[0] - now;
    }
    free(all);
    *offset = dt_median(d, K);
    return st;
}

dt_status dt_trace_file_create(const char *path, dt_comm *w, int first, int last, dt_trace_file **out) {
    *out = NULL;
    int rank = w ? dt_comm_rank(w) : 0;
    dt_status st = rank == 0 ? dt_file_check_writable(path) : DT_OK;
    if (st) dt_error(st, "--trace: %s", dt_last_error());
    /* every rank learns whether rank 0 can write it before any waits on the others */
    if (w && dt_comm_size(w) > 1) {
        int32_t bad = st != DT_OK;
        dt_status s2 = dt_comm_broadcast(w, &bad, 1, DT_I32, 0);
        if (s2) return s2;
        if (bad && rank != 0) return dt_error(DT_ERR_IO, "--trace %s: rank 0 cannot write it", path);
    }
    if (st) return st;
    dt_trace_file *t = calloc(1, sizeof *t);
    if (!t || !(t->path = strdup(path))) { free(t); return dt_error(DT_ERR_NOMEM, "trace: out of memory"); }
    t->w = w;
    t->first = first;
    t->last = last;
    double offset = 0;
    if ((st = clock_offset(w, &offset))) { dt_trace_file_destroy(t); return st; }
    double zero = dt_time_now() + offset;
    if (w && dt_comm_size(w) > 1 && (st = dt_comm_broadcast(w, &zero, 1, DT_F64, 0))) { dt_trace_file_destroy(t); return st; }
    t->origin = zero - offset;
    dt_trace_clear();
    *out = t;
    return DT_OK;
}

void dt_trace_file_step(dt_trace_file *t, int step) {
    if (t) dt_trace_enable(step >= t->first && step <= t->last);
}

void dt_trace_file_destroy(dt_trace_file *t) {
    if (!t) return;
    dt_trace_enable(0);
    dt_trace_clear();
    free(t->path);
    free(t);
}

/* A growing string. */
typedef struct { char *p; size_t n, cap; int failed; } text;

static void put(text *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(text *s, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int k = vsnprintf(s->p ? s->p + s->n : NULL, s->p ? s->cap - s->n : 0, fmt, ap);
        va_end(ap);
        if (k < 0) { s->failed = 1; return; }
        if (s->p && s->n + (size_t)k < s->cap) { s->n += (size_t)k; return; }
        size_t cap = (s->cap ? s->cap * 2 : 65536) + (size_t)k;
        char *q = realloc(s->p, cap);
        if (!q) { s->failed = 1; return; }
        s->p = q;
        s->cap = cap;
    }
}

typedef struct { double ts; size_t i; } order;
static int by_time(const void *a, const void *b) {
    const order *x = a, *y = b;
    if (x->ts != y->ts) return (x->ts > y->ts) - (x->ts < y->ts);
    return (x->i > y->i) - (x->i < y->i);
}

/* This rank's events: only matched begin/end pairs (tracing switched off
 * inside an event leaves halves), in time order. */
static dt_status rank_events(const dt_trace_file *t, int rank, text *s) {
    size_t n, lost;
    const dt_trace_event *ev = dt_trace_events(&n, &lost);
    if (lost) dt_log(DT_LOG_WARN, "trace: %zu events did not fit and were dropped (--trace-steps fewer steps)", lost);
    unsigned char *keep = calloc(n + 1, 1);
    size_t *stack = malloc(sizeof *stack * (n + 1) * DT_TRACK_COUNT);
    order *ord = malloc(sizeof *ord * (n + 1));
    if (!keep || !stack || !ord) { free(keep); free(stack); free(ord); return dt_error(DT_ERR_NOMEM, "trace: out of memory"); }
    size_t top[DT_TRACK_COUNT] = { 0 };
    for (size_t i = 0; i < n; i++) {
        size_t *st = stack + (size_t)ev[i].track * (n + 1), *tp = &top[ev[i].track];
        if (ev[i].ph == 'B') st[(*tp)++] = i;
        else if (*tp) { keep[st[--*tp]] = 1; keep[i] = 1; }
    }
    size_t m = 0;
    for (size_t i = 0; i < n; i++) if (keep[i]) ord[m++] = (order){ ev[i].ts, i };
    qsort(ord, m, sizeof *ord, by_time);
    for (size_t k = 0; k < m; k++) {
        const dt_trace_event *e = &ev[ord[k].i];
        put(s, ",\n{\"ph\":\"%c\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f", e->ph, rank, e->track + 1, (e->ts - t->origin) * 1e6);
        if (e->ph == 'B') {
            put(s, ",\"name\":\"%s\",\"cat\":\"%s\"", e->name, track_names[(int)e->track]);
            if (e->args[0]) put(s, ",\"args\":{%s}", e->args);
        }
        put(s, "}");
    }
    free(keep);
    free(stack);
    free(ord);
    return s->failed ? dt_error(DT_ERR_NOMEM, "trace: out of memory") : DT_OK;
}

/* Rank 0 gets every rank's text (padded to 4-byte words for allgatherv). */
static dt_status gather(dt_comm *w, text *mine, char **all, size_t *total) {
    int p = w ? dt_comm_size(w) : 1;
    while (mine->n % 4) put(mine, " ");
    if (mine->failed) return dt_error(DT_ERR_NOMEM, "trace: out of memory");
    if (p == 1) { *all = mine->p; *total = mine->n; mine->p = NULL; return DT_OK; }
    size_t words = 0;
    void *buf = NULL;
    dt_status st = dt_comm_allgatherv_alloc(w, mine->p, mine->n / 4, DT_I32, &buf, &words);
    *all = buf, *total = words * 4;
    return st ? dt_error(st, "trace: %s", dt_last_error()) : DT_OK;
}

dt_status dt_trace_file_write(dt_trace_file *t) {
    dt_trace_enable(0);
    int rank = t->w ? dt_comm_rank(t->w) : 0, p = t->w ? dt_comm_size(t->w) : 1;
    text s = { 0 };
    dt_status st = rank_events(t, rank, &s);
    char *all = NULL;
    size_t total = 0;
    /* a rank that failed still joins the gather, with nothing */
    if (st) s.n = 0;
    dt_status g = gather(t->w, &s, &all, &total);
    if (!st) st = g;
    free(s.p);
    if (st || rank != 0) { free(all); return st; }
    text head = { 0 };
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    put(&head, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"ranks\":%d,\"steps\":\"%d:%d\",\"clock\":\"%s\"},\n\"traceEvents\":[\n"
        "{\"ph\":\"M\",\"pid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank 0\"}}", p, t->first, t->last,
        t->w && dt_comm_nodes(t->w) > 1 ? "aligned to rank 0 at the start" : "one machine's monotonic clock");
    for (int r = 0; r < p; r++) {
        if (r) put(&head, ",\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_name\",\"args\":{\"name\":\"rank %d\"}}", r, r);
        put(&head, ",\n{\"ph\":\"M\",\"pid\":%d,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":%d}}", r, r);
        for (int k = 0; k < DT_TRACK_COUNT; k++)
            put(&head, ",\n{\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"name\":\"thread_name\",\"args\":{\"name\":\"%s\"}}", r, k + 1,
                track_names[k]);
    }
    const char *tail = "\n]}\n";
    const void *parts[3] = { head.p, all, tail };
    size_t sizes[3] = { head.n, total, strlen(tail) };
    st = head.failed ? dt_error(DT_ERR_NOMEM, "trace: out of memory") : dt_file_write_atomic(t->path, parts, sizes, 3);
    if (st) dt_error(st, "--trace %s: %s", t->path, dt_last_error());
    free(head.p);
    free(all);
    return st;
}
