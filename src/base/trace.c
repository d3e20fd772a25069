/* The trace recorder: begin/end events in one process-wide buffer. Off, the
 * call sites cost a relaxed load (DT_TRACE_BEGIN/END); on, an event is a
 * clock read and a copy under a mutex, which is far below the microseconds
 * a traced kernel or collective takes. obs/trace_file.c turns the buffer
 * into Chrome trace-event JSON. */
#include "dtrain/base.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int dt_trace_active;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static dt_trace_event *events;
static size_t count, cap, dropped;
static int depth[DT_TRACK_COUNT];   /* open begins per track: an end without its begin is not kept */
static _Thread_local int thread_track = DT_TRACK_COMPUTE;

enum { MAX_EVENTS = 1 << 20 };

void dt_trace_enable(int on) { __atomic_store_n(&dt_trace_active, on ? 1 : 0, __ATOMIC_RELAXED); }
void dt_trace_set_thread_track(int track) { thread_track = track; }

static dt_trace_event *slot(void) {
    if (count == cap) {
        size_t n = cap ? cap * 2 : 4096;
        dt_trace_event *e = n <= MAX_EVENTS ? realloc(events, n * sizeof *e) : NULL;
        if (!e) return NULL;
        events = e;
        cap = n;
    }
    return &events[count++];
}

void dt_trace_begin(int track, const char *name, const char *fmt, ...) {
    double ts = dt_time_now();
    if (track < 0 || track >= DT_TRACK_COUNT) track = thread_track;
    pthread_mutex_lock(&mu);
    dt_trace_event *e = slot();
    if (!e) dropped++;
    else {
        e->ts = ts;
        e->ph = 'B';
        e->track = (signed char)track;
        snprintf(e->name, sizeof e->name, "%s", name);
        e->args[0] = 0;
        if (fmt) {
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(e->args, sizeof e->args, fmt, ap);
            va_end(ap);
        }
        depth[track]++;
    }
    pthread_mutex_unlock(&mu);
}

void dt_trace_end(int track) {
    double ts = dt_time_now();
    if (track < 0 || track >= DT_TRACK_COUNT) track = thread_track;
    pthread_mutex_lock(&mu);
    if (depth[track] > 0) {
        dt_trace_event *e = slot();
        if (!e) dropped++;
        else {
            *e = (dt_trace_event){ .ts = ts, .ph = 'E', .track = (signed char)track };
            depth[track]--;
        }
    }
    pthread_mutex_unlock(&mu);
}

void dt_trace_span(int track, const char *name, double t0, double t1) {
    if (track < 0 || track >= DT_TRACK_COUNT) track = thread_track;
    pthread_mutex_lock(&mu);
    dt_trace_event *b = slot(), *e = b ? slot() : NULL;
    if (!e) {
        if (b) count--; /* both or neither */
        dropped += 2;
    } else {
        *b = (dt_trace_event){ .ts = t0, .ph = 'B', .track = (signed char)track };
        snprintf(b->name, sizeof b->name, "%s", name);
        *e = (dt_trace_event){ .ts = t1 > t0 ? t1 : t0, .ph = 'E', .track = (signed char)track };
    }
    pthread_mutex_unlock(&mu);
}

const dt_trace_event *dt_trace_events(size_t *n, size_t *lost) {
    pthread_mutex_lock(&mu);
    *n = count;
    *lost = dropped;
    pthread_mutex_unlock(&mu);
    return events;
}

void dt_trace_clear(void) {
    pthread_mutex_lock(&mu);
    free(events);
    events = NULL;
    count = cap = dropped = 0;
    memset(depth, 0, sizeof depth);
    pthread_mutex_unlock(&mu);
}
