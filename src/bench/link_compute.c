/* Compute beside a link between machines: how much longer a core's GEMMs take while a thread of the same rank keeps an
 * exchange with another machine going. A training step's buckets cross the link during backward; the link's processing
 * (the MPI library's progress, the kernel's TCP copies and interrupts) runs on the ranks' cores and slows the backward it
 * overlaps. Across the two-machine rig a d6 DDP step's compute took 53-67 ms longer than one process's (0.6-0.8 ms for
 * each MB moved), which the link's alpha and beta alone do not price. */
#include "measure.h"
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <cblas.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdatomic.h>
#include <stdlib.h>

enum { GM = 256, GN = 1536, GK = 384, ROUNDS = 5 }; /* a d6 MLP's Linear at 256 tokens: what backward runs */

typedef struct {
    dt_comm *w;
    float *buf; /* 2 x n floats: sent, received; the first of each also carries a rank's "stop" */
    size_t n;
    int peer;
    atomic_int stop; /* 1: this round is over; 2: no more rounds (this rank could not start its thread) */
    bool abort;      /* either rank sent 2: both leave the rounds together */
    dt_status st;
} exchange;

/* Exchanges until either rank has asked to stop: each message carries its sender's wish, so both ranks see both wishes
 * after the same exchange and leave together (a count agreed in advance would leave one rank's compute unshadowed). */
static void *keep_exchanging(void *arg) {
    exchange *x = arg;
    for (;;) {
        x->buf[0] = (float)atomic_load(&x->stop);
        x->st = dt_comm_sendrecv(x->w, x->buf, x->n, x->peer, x->buf + x->n, x->n, x->peer, DT_F32);
        if (x->st) break;
        float mine = x->buf[0], theirs = x->buf[x->n];
        x->abort = mine == 2 || theirs == 2;
        if (mine != 0 || theirs != 0) break;
    }
    return NULL;
}

static double gemms(const float *a, const float *b, float *c, int iters) {
    double t0 = dt_time_now();
    for (int i = 0; i < iters; i++) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, GM, GN, GK, 1, a, GK, b, GK, 0, c, GN);
    return dt_time_now() - t0;
}

double dt_bench_link_slowdown(dt_comm *w, int peer, float *buf, size_t n) {
    float *a = calloc((size_t)GM * GK, sizeof *a), *b = calloc((size_t)GN * GK, sizeof *b), *c = calloc((size_t)GM * GN, sizeof *c);
    double s = 0;
    int threads = dt_kernels_threads();
    if (a && b && c) {
        dt_kernels_set_threads(1); /* one core's compute (a rank of one thread), the link's thread beside it */
        gemms(a, b, c, 8);
        int iters = (int)(0.2 / (gemms(a, b, c, 8) / 8)) + 1; /* ~a fifth of a second alone */
        double alone[ROUNDS], beside[ROUNDS];
        int k = 0;
        for (; k < ROUNDS; k++) { /* each round's pair back to back: the machine's own swings touch both alike */
            alone[k] = gemms(a, b, c, iters);
            exchange x = { .w = w, .buf = buf, .n = n, .peer = peer };
            pthread_t t;
            if (pthread_create(&t, NULL, keep_exchanging, &x)) { /* one exchange here that tells the peer: no rounds more */
                atomic_store(&x.stop, 2);
                keep_exchanging(&x);
                break;
            }
            beside[k] = gemms(a, b, c, iters);
            atomic_store(&x.stop, 1);
            pthread_join(t, NULL);
            if (x.st || x.abort) break;
        }
        if (k == ROUNDS) s = dt_median(beside, ROUNDS) / dt_median(alone, ROUNDS) - 1;
    }
    dt_kernels_set_threads(threads);
    free(a), free(b), free(c);
    return s > 0 ? s : 0;
}
