/* dt_comm_alltoallv timed as bench/mpi_coll_bench.c times MPI_Alltoallv (--op alltoallv): every rank sends
 * bytes / p to each rank (the counts of an even dispatch, travelling as alltoallv's do), iterations for about 0.05 s a
 * repetition, the median of 7 of the slowest rank's times, private pre-faulted buffers; one JSON line a size.
 * usage: dtrain launch -n P build/bench/alltoallv_bench [SIZES [arena]]   (SIZES: bytes a rank, comma-separated; arena:
 * the send buffers from dt_comm_alloc, in the shared segment, read in place) */
#include "dtrain/comm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double timed(dt_comm *w, const float *s, float *r, const size_t *counts, size_t cap, size_t *got, long iters) {
    dt_comm_barrier(w);
    double t0 = dt_time_now();
    for (long k = 0; k < iters; k++)
        if (dt_comm_alltoallv(w, s, counts, r, cap, got, DT_F32)) return -1;
    double dt = (dt_time_now() - t0) / (double)iters, mx = 0;
    dt_comm_allreduce(w, &dt, &mx, 1, DT_F64, DT_MAX);
    return mx;
}

int main(int argc, char **argv) {
    dt_comm *w;
    if (dt_comm_init(&w)) return fprintf(stderr, "%s\n", dt_last_error()), 1;
    int p = dt_comm_size(w), rank = dt_comm_rank(w), reps = 7;
    char *list = strdup(argc > 1 ? argv[1] : "8,64,512,4096,32768,262144,2097152,16777216,67108864");
    int arena = argc > 2 && !strcmp(argv[2], "arena");
    size_t *counts = malloc(sizeof *counts * (size_t)p), *got = malloc(sizeof *got * (size_t)p);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = strtoull(tok, NULL, 10), blk = bytes / 4 / (size_t)p;
        if (!blk) continue;
        for (int j = 0; j < p; j++) counts[j] = blk;
        float *s = NULL, *r = malloc(bytes + 64);
        if (arena ? dt_comm_alloc(w, bytes + 64, (void **)&s) : !(s = malloc(bytes + 64))) return fprintf(stderr, "no memory\n"), 1;
        memset(s, 1, bytes + 64), memset(r, 0, bytes + 64); /* pre-faulted */
        double t1 = timed(w, s, r, counts, blk * (size_t)p, got, 1), times[7];
        long iters = t1 > 0 ? (long)(0.05 / t1) : 1000;
        iters = iters < 1 ? 1 : iters > 100000 ? 100000 : iters;
        dt_comm_broadcast(w, &iters, 1, DT_I64, 0);
        timed(w, s, r, counts, blk * (size_t)p, got, iters); /* warm-up */
        for (int k = 0; k < reps; k++) times[k] = timed(w, s, r, counts, blk * (size_t)p, got, iters);
        qsort(times, (size_t)reps, sizeof times[0], cmp);
        if (rank == 0)
            printf("{\"op\":\"alltoallv\",\"algo\":\"%s\",\"nproc\":%d,\"bytes\":%zu,\"avg_us\":%.3f,\"min_us\":%.3f,\"max_us\":%.3f,"
                   "\"iters\":%ld}\n", arena ? "dtrain-arena" : "dtrain", p, bytes, times[reps / 2] * 1e6, times[0] * 1e6,
                   times[reps - 1] * 1e6, iters);
        fflush(stdout);
        if (arena) dt_comm_free(w, s);
        else free(s);
        free(r);
    }
    free(list), free(counts), free(got);
    dt_comm_destroy(w);
    return 0;
}
