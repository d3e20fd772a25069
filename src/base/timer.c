/* Clocks: monotonic wall time for timing, CPU time for measuring how much of
 * the machine a run used. */
#include "dtrain/base.h"

#include <time.h>

double dt_time_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double dt_time_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}
