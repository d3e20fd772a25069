/* SIGINT and SIGTERM (Ctrl-C, and what Slurm sends before it kills a job)
 * ask the training loop to stop: it finishes the step it is in, saves if
 * --save was given, says so and exits 128 + the signal. The first signal
 * only sets a flag; the handler then steps aside, so a second one ends the
 * process at once, as a user pressing Ctrl-C twice expects. */
#include "dtrain/train.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t caught;

static void on_signal(int sig) {
    caught = sig;
    signal(sig, SIG_DFL);
}

void dt_train_catch_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
}

int dt_train_interrupted(void) { return caught; }
