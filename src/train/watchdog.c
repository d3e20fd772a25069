/* A rank's watchdog: a thread that looks at the job's shared state every
 * 20 ms and, once another rank has died or the job has been aborted, says so
 * and ends this rank. Without it a rank in the middle of a long backward
 * would notice only at its next collective, seconds later. A checkpoint
 * being written is finished first (dt_watchdog_hold), so the file on disk
 * is always a whole one. */
#include "dtrain/train.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

struct dt_watchdog {
    dt_comm *w;
    pthread_t thread;
    _Atomic int stop, hold;
};

static void *watch(void *arg) {
    dt_watchdog *wd = arg;
    char msg[1024], act[320];
    while (!atomic_load(&wd->stop)) {
        usleep(20000);
        if (atomic_load(&wd->stop) || !dt_comm_failed(wd->w, msg, sizeof msg)) continue;
        while (atomic_load(&wd->hold)) usleep(1000);
        dt_comm_activity(act, sizeof act);
        dt_log(DT_LOG_ERROR, "rank %d: stopping %s: %s", dt_comm_rank(wd->w), act, msg);
        fflush(stdout);
        _exit(1);
    }
    return NULL;
}

dt_status dt_watchdog_start(dt_comm *w, dt_watchdog **out) {
    *out = NULL;
    if (!w || dt_comm_size(w) < 2) return DT_OK;
    dt_watchdog *wd = calloc(1, sizeof *wd);
    if (!wd) return dt_error(DT_ERR_NOMEM, "watchdog: out of memory");
    wd->w = w;
    if (pthread_create(&wd->thread, NULL, watch, wd) != 0) { free(wd); return dt_error(DT_ERR_SYS, "cannot start the watchdog thread"); }
    *out = wd;
    return DT_OK;
}

void dt_watchdog_hold(dt_watchdog *wd, int on) {
    if (wd) atomic_store(&wd->hold, on);
}

void dt_watchdog_stop(dt_watchdog *wd) {
    if (!wd) return;
    atomic_store(&wd->stop, 1);
    pthread_join(wd->thread, NULL);
    dt_comm_watch_end(wd->w);
    free(wd);
}
