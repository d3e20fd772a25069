/* Misbehaving ranks, one mode per run; tests/faults.sh checks what the
 * others and the launcher say. Every surviving rank prints one line:
 *   "rank R: error after T s: MESSAGE"
 * where T is measured from the moment the misbehaviour happened (agreed
 * in advance through a broadcast). */
#include "dtrain/comm.h"
#include "dtrain/train.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv) {
    const char *mode = argc > 1 ? argv[1] : "";
    dt_comm *w;
    if (dt_comm_init(&w)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    int r = dt_comm_rank(w), p = dt_comm_size(w);
    size_t n = 1 << 18; /* 1 MiB of f32 */
    float *buf = malloc(2 * n * sizeof *buf);
    for (size_t i = 0; i < 2 * n; i++) buf[i] = 1;
    double t_act = 0;
    for (int k = 0; k < 5; k++) dt_comm_allreduce(w, buf, buf, n, DT_F32, DT_SUM);
    dt_status st;
    int bad = p - 1;
    bool a2a = !strcmp(mode, "kill-alltoallv"); /* the survivors wait in an alltoallv (an expert dispatch) */
    if (!strcmp(mode, "kill") || !strcmp(mode, "exit") || a2a) {
        /* As a training rank does: mpirun answers the death with SIGTERM to the rest (SIGKILL 1 s later), which
         * asks to stop after the step, so the collective in hand still names who died (without this the
         * report raced mpirun's SIGTERM and sometimes lost) */
        dt_train_catch_signals();
        /* Tell everyone the moment (a little ahead) and act then. */
        double t = dt_time_now() + 0.2;
        dt_comm_broadcast(w, &t, 1, DT_F64, 0);
        t_act = t;
        if (r == bad) {
            while (dt_time_now() < t) usleep(1000);
            if (strcmp(mode, "exit")) raise(SIGKILL);
            _exit(0);
        }
        size_t sc[64], rc[64];
        for (int q = 0; q < p && q < 64; q++) sc[q] = 1000 * (size_t)(q + 1);
        st = !a2a ? dt_comm_allreduce(w, buf, buf, n, DT_F32, DT_SUM)
             : p > 64 ? DT_ERR_ARG : dt_comm_alltoallv(w, buf, sc, buf + n, n, rc, DT_F32);
    } else if (!strcmp(mode, "mismatch-op")) {
        t_act = dt_time_now();
        st = r == bad ? dt_comm_broadcast(w, buf, n, DT_F32, 0) : dt_comm_allreduce(w, buf, buf, n, DT_F32, DT_SUM);
    } else if (!strcmp(mode, "mismatch-size")) {
        t_act = dt_time_now();
        st = dt_comm_allreduce(w, buf, buf, r == bad ? 2 * n : n, DT_F32, DT_SUM);
    } else if (!strcmp(mode, "mismatch-ring")) {
        dt_comm_set_algo(w, DT_COLL_ALLREDUCE, DT_ALGO_RING);
        t_act = dt_time_now();
        st = dt_comm_allreduce(w, buf, buf, r == bad ? n / 2 : n, DT_F32, DT_SUM);
    } else if (!strcmp(mode, "mismatch-alltoallv")) {
        /* the last rank's blocks are f64 where the others' are f32: the same counts, other lengths */
        size_t sc[64], rc[64];
        for (int q = 0; q < p && q < 64; q++) sc[q] = 16;
        t_act = dt_time_now();
        st = p > 64 ? DT_ERR_ARG : dt_comm_alltoallv(w, buf, sc, buf + n, n, rc, r == bad ? DT_F64 : DT_F32);
    } else if (!strcmp(mode, "stall")) {
        /* The last rank computes (a busy loop) for 5 s before it joins; with a stall timeout of 0.3 s the
         * others warn at 0.3 s and stop the job at 0.6 s, naming it as running. */
        dt_comm_set_stall_timeout(w, 0.3);
        t_act = dt_time_now();
        if (r == bad) { volatile double x = 0; while (dt_time_now() < t_act + 5) x += 1; (void)x; }
        st = dt_comm_allreduce(w, buf, buf, n, DT_F32, DT_SUM);
    } else if (!strcmp(mode, "hang")) {
        /* For the launcher-kill test: wait in a collective that rank 0 never joins. */
        if (r != 0) st = dt_comm_allreduce(w, buf, buf, n, DT_F32, DT_SUM);
        else { sleep(60); st = DT_OK; }
    } else {
        fprintf(stderr, "unknown mode '%s'\n", mode);
        return 2;
    }
    if (st) {
        printf("rank %d: error after %.3f s: %s\n", r, dt_time_now() - t_act, dt_last_error());
        fflush(stdout);
        return 3;
    }
    printf("rank %d: no error\n", r);
    dt_comm_destroy(w);
    return 0;
}
