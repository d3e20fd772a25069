/* SIGINT and SIGTERM (Ctrl-C, and what Slurm sends before it kills a job)
 * ask the training loop to stop: it finishes the step it is in, saves if
 * --save was given, says so and exits 128 + the signal. A second request
 * ends the process at once, as a user pressing Ctrl-C twice expects; copies
 * of the first (the terminal's and a wrapper's such as timeout's) are not a
 * second request (dt_stop_request_classify). */
#include "dtrain/train.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t caught;

static void on_signal(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    int kind = dt_stop_request_classify(si);
    if (kind == 1 && !caught) caught = sig;
    if (kind == 2) {
        signal(sig, SIG_DFL);
        raise(sig);
    }
}

void dt_train_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_signal;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int dt_train_interrupted(void) { return caught; }
