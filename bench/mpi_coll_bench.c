/* The MPI library's own collective, timed the way `dtrain bench comm` times
 * dtrain's: same sizes, same buffers (private, pre-faulted), same
 * repetitions, same JSON lines. Run by `dtrain bench comm --baseline mpi`
 * under mpirun; built against Open MPI and, where installed, MPICH. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cmp(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static MPI_Datatype mpi_type(const char *s, size_t *es) {
    if (!strcmp(s, "f64")) { *es = 8; return MPI_DOUBLE; }
    if (!strcmp(s, "i32")) { *es = 4; return MPI_INT32_T; }
    if (!strcmp(s, "i64")) { *es = 8; return MPI_INT64_T; }
    *es = 4;
    return MPI_FLOAT;
}

static MPI_Op mpi_op(const char *s) {
    if (!strcmp(s, "max")) return MPI_MAX;
    if (!strcmp(s, "min")) return MPI_MIN;
    if (!strcmp(s, "prod")) return MPI_PROD;
    return MPI_SUM;
}

int main(int argc, char **argv) {
    int level = 0; /* dtrain's level (its heartbeats' thread) where asked: the same locking cost on both sides */
    if (getenv("MPI_COLL_BENCH_MULTIPLE")) MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &level);
    else MPI_Init(&argc, &argv);
    int rank, p;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &p);
    const char *op = "allreduce", *dtype = "f32", *redop = "sum", *sizes = "8,1048576";
    int reps = 7, warmup = 2;
    double seconds = 0.05;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--op")) op = argv[i + 1];
        else if (!strcmp(argv[i], "--dtype")) dtype = argv[i + 1];
        else if (!strcmp(argv[i], "--redop")) redop = argv[i + 1];
        else if (!strcmp(argv[i], "--sizes")) sizes = argv[i + 1];
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--warmup")) warmup = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    }
    if (reps < 1) reps = 1;
    if (reps > 64) reps = 64;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    int len;
    MPI_Get_library_version(lib, &len);
    const char *name = strstr(lib, "Open MPI") ? "openmpi" : strstr(lib, "MPICH") ? "mpich" : "mpi";
    size_t es;
    MPI_Datatype t = mpi_type(dtype, &es);
    char *list = strdup(sizes);
    for (char *tok = strtok(list, ","); tok; tok = strtok(NULL, ",")) {
        size_t bytes = strtoull(tok, NULL, 10);
        size_t n = bytes / es, blk = n / (size_t)p;
        int rooted = !strcmp(op, "broadcast") || !strcmp(op, "reduce");
        int whole = !strcmp(op, "allreduce") || rooted;
        if ((whole && n == 0) || (!whole && blk == 0)) continue;
        int counts[1024], displs[1024]; /* alltoallv: the blocks of alltoall, each count given */
        for (int j = 0; j < p && j < 1024; j++) counts[j] = (int)blk, displs[j] = (int)(blk * (size_t)j);
        char *s = malloc(bytes + 64), *r = malloc(bytes + 64);
        memset(s, 1, bytes + 64); /* pre-fault */
        memset(r, 0, bytes + 64);
        double times[64], t1 = 0;
        long iters = 1;
        for (int phase = 0; phase < 2 + warmup + reps; phase++) {
            if (phase == 1) {
                long it = t1 > 0 ? (long)(seconds / t1) : 1000;
                iters = it < 1 ? 1 : it > 100000 ? 100000 : it;
                MPI_Bcast(&iters, 1, MPI_LONG, 0, MPI_COMM_WORLD);
            }
            long k_iters = phase == 0 ? 1 : iters;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = MPI_Wtime();
            for (long k = 0; k < k_iters; k++) {
                if (!strcmp(op, "allreduce")) MPI_Allreduce(s, r, (int)n, t, mpi_op(redop), MPI_COMM_WORLD);
                else if (!strcmp(op, "reduce_scatter")) MPI_Reduce_scatter_block(s, r, (int)blk, t, mpi_op(redop), MPI_COMM_WORLD);
                else if (!strcmp(op, "allgather")) MPI_Allgather(s, (int)blk, t, r, (int)blk, t, MPI_COMM_WORLD);
                else if (!strcmp(op, "broadcast")) MPI_Bcast(r, (int)n, t, 0, MPI_COMM_WORLD);
                else if (!strcmp(op, "reduce")) MPI_Reduce(s, r, (int)n, t, mpi_op(redop), 0, MPI_COMM_WORLD);
                else if (!strcmp(op, "alltoall")) MPI_Alltoall(s, (int)blk, t, r, (int)blk, t, MPI_COMM_WORLD);
                else if (!strcmp(op, "alltoallv")) MPI_Alltoallv(s, counts, displs, t, r, counts, displs, t, MPI_COMM_WORLD);
                else if (!strcmp(op, "gather")) MPI_Gather(s, (int)blk, t, r, (int)blk, t, 0, MPI_COMM_WORLD);
                else if (!strcmp(op, "scatter")) MPI_Scatter(s, (int)blk, t, r, (int)blk, t, 0, MPI_COMM_WORLD);
                else MPI_Barrier(MPI_COMM_WORLD);
            }
            double dt = (MPI_Wtime() - t0) / (double)k_iters, mx;
            MPI_Allreduce(&dt, &mx, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            if (phase == 0) t1 = mx;
            else if (phase >= 2 + warmup) times[phase - 2 - warmup] = mx;
        }
        qsort(times, (size_t)reps, sizeof times[0], cmp);
        double med = times[reps / 2], algbw = (double)bytes / med / 1e9;
        double f = !strcmp(op, "allreduce") ? 2.0 * (p - 1) / p : rooted ? 1.0 : (double)(p - 1) / p;
        if (rank == 0)
            printf("{\"op\":\"%s\",\"algo\":\"%s\",\"nproc\":%d,\"bytes\":%zu,\"avg_us\":%.3f,\"algbw_gbs\":%.3f,"
                   "\"busbw_gbs\":%.3f,\"buffers\":\"private\",\"min_us\":%.3f,\"max_us\":%.3f,\"iters\":%ld}\n",
                   op, name, p, bytes, med * 1e6, algbw, algbw * f, times[0] * 1e6, times[reps - 1] * 1e6, iters);
        fflush(stdout);
        free(s);
        free(r);
    }
    free(list);
    MPI_Finalize();
    return 0;
}
