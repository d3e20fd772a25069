/* A request to stop (SIGINT, SIGTERM, SIGHUP) often arrives in copies: one
 * Ctrl-C reaches both the terminal's process group and a wrapper such as
 * timeout(1), which passes its own copy on. Copies of one keypress are one
 * request; a second request is a signal from a sender that already sent one
 * (the terminal, pressed again), or any signal a second or more after the
 * first. Called from a signal handler: only async-signal-safe work here. */
#include "dtrain/base.h"

#include <signal.h>
#include <time.h>

static volatile sig_atomic_t requests, first_sender, first_ds;

static int deciseconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int)((ts.tv_sec % 100000000) * 10 + ts.tv_nsec / 100000000);
}

int dt_stop_request_classify(const siginfo_t *si) {
    /* who sent it: a process's pid, or 0 for the kernel (the terminal's Ctrl-C) */
    int sender = si && (si->si_code == SI_USER || si->si_code == SI_QUEUE) ? (int)si->si_pid : 0;
    int now = deciseconds();
    if (requests++ == 0) {
        first_sender = sender;
        first_ds = now;
        return 1;
    }
    return sender == first_sender || now - first_ds >= 10 ? 2 : 0;
}
