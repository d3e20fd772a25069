/* dtrain bench comm: latency and bandwidth of one collective over a sweep of
 * sizes, in the manner of OSU and nccl-tests, optionally against the MPI
 * library's own collective measured in the same invocation.
 *
 * "size" is nccl-tests' size: the whole buffer (allreduce, broadcast, reduce)
 * or the gathered total (allgather, reduce_scatter, alltoall, gather,
 * scatter). busbw = algbw x 2(p-1)/p for allreduce, (p-1)/p for the
 * gather/scatter family, 1 for broadcast and reduce. Every size is checked
 * against the expected result before it is timed. */
#include "dtrain/bench.h"
#include "measure.h"
#include "../comm/comm_internal.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/utsname.h>
#include <unistd.h>

void dt_bench_comm_defaults(dt_bench_comm_opts *o) {
    memset(o, 0, sizeof *o);
    o->coll = DT_COLL_ALLREDUCE;
    o->algo = DT_ALGO_AUTO;
    o->dtype = DT_F32;
    o->op = DT_SUM;
    o->nproc = 2;
    /* 8 B, then 16 B x 4^k: lands on 1 KiB, 1 MiB, 64 MiB and 256 MiB */
    o->sizes[o->nsizes++] = 8;
    for (size_t s = 16; s <= (256u << 20); s *= 4) o->sizes[o->nsizes++] = s;
    o->arena = 1;
    o->reps = 7;
    o->warmup = 2;
    o->rep_seconds = 0.05;
    o->rounds = 1;
}

static double bus_factor(dt_coll c, int p) {
    switch (c) {
    case DT_COLL_ALLREDUCE: return 2.0 * (p - 1) / p;
    case DT_COLL_BROADCAST: case DT_COLL_REDUCE: return 1.0;
    case DT_COLL_BARRIER: return 0.0;
    default: return (double)(p - 1) / p;
    }
}

/* Elements per rank-block for a nccl-tests size. */
static size_t count_for(dt_coll c, size_t bytes, size_t es, int p) {
    size_t n = bytes / es;
    switch (c) {
    case DT_COLL_ALLREDUCE: case DT_COLL_BROADCAST: case DT_COLL_REDUCE: return n;
    case DT_COLL_BARRIER: return 0;
    default: return n / (size_t)p;
    }
}

/* ---- deterministic inputs and the results they must give ---- */

/* Small integers: sums, products, max and min are exact in every dtype. */
static double input_value(int rank, size_t i) { return (double)((rank + 1) + (int)(i % 5)); }

static void store(void *buf, size_t i, dt_dtype t, double v) {
    switch (t) {
    case DT_F32: ((float *)buf)[i] = (float)v; break;
    case DT_F64: ((double *)buf)[i] = v; break;
    case DT_BF16: ((uint16_t *)buf)[i] = dt_f32_to_bf16((float)v); break;
    case DT_F16: ((uint16_t *)buf)[i] = dt_f32_to_f16((float)v); break;
    case DT_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case DT_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    default: break;
    }
}

static double load(const void *buf, size_t i, dt_dtype t) {
    switch (t) {
    case DT_F32: return ((const float *)buf)[i];
    case DT_F64: return ((const double *)buf)[i];
    case DT_BF16: return dt_bf16_to_f32(((const uint16_t *)buf)[i]);
    case DT_F16: return dt_f16_to_f32(((const uint16_t *)buf)[i]);
    case DT_I32: return ((const int32_t *)buf)[i];
    case DT_I64: return (double)((const int64_t *)buf)[i];
    default: return 0;
    }
}

static double reduced(int p, size_t i, dt_op op) {
    double acc = input_value(0, i);
    for (int r = 1; r < p; r++) {
        double v = input_value(r, i);
        acc = op == DT_MAX ? fmax(acc, v) : op == DT_MIN ? fmin(acc, v) : op == DT_PROD ? acc * v : acc + v;
    }
    return op == DT_AVG ? acc / p : acc;
}

typedef struct {
    dt_coll coll;
    dt_dtype t;
    dt_op op;
    int p, rank, root;
    size_t count, send_n, recv_n;
    void *send, *recv;
} bench_case;

static void fill(bench_case *b) {
    for (size_t i = 0; i < b->send_n; i++) store(b->send, i, b->t, input_value(b->rank, i));
    if (b->coll == DT_COLL_BROADCAST)
        for (size_t i = 0; i < b->recv_n; i++) store(b->recv, i, b->t, b->rank == b->root ? input_value(b->root, i) : -1);
}

/* Returns the first index whose value is wrong, or SIZE_MAX. */
static size_t verify(const bench_case *b, double *got, double *want) {
    size_t n = b->count;
    for (size_t i = 0; i < b->recv_n; i++) {
        double w;
        switch (b->coll) {
        case DT_COLL_ALLREDUCE: w = reduced(b->p, i, b->op); break;
        case DT_COLL_REDUCE: if (b->rank != b->root) return SIZE_MAX; w = reduced(b->p, i, b->op); break;
        case DT_COLL_REDUCE_SCATTER: w = reduced(b->p, (size_t)b->rank * n + i, b->op); break;
        case DT_COLL_BROADCAST: w = input_value(b->root, i); break;
        case DT_COLL_ALLGATHER: w = input_value((int)(i / n), i % n); break;
        case DT_COLL_GATHER: if (b->rank != b->root) return SIZE_MAX; w = input_value((int)(i / n), i % n); break;
        case DT_COLL_ALLTOALL: w = input_value((int)(i / n), (size_t)b->rank * n + i % n); break;
        case DT_COLL_SCATTER: w = input_value(b->root, (size_t)b->rank * n + i); break;
        default: return SIZE_MAX;
        }
        if (b->t == DT_I32 || b->t == DT_I64) w = trunc(w);
        else if (b->t == DT_BF16) w = dt_bf16_to_f32(dt_f32_to_bf16((float)w));
        else if (b->t == DT_F16) w = dt_f16_to_f32(dt_f32_to_f16((float)w));
        else if (b->t == DT_F32) w = (float)w;
        double g = load(b->recv, i, b->t);
        if (g != w) { *got = g; *want = w; return i; }
    }
    return SIZE_MAX;
}

static dt_status run_once(dt_comm *w, bench_case *b) {
    switch (b->coll) {
    case DT_COLL_ALLREDUCE: return dt_comm_allreduce(w, b->send, b->recv, b->count, b->t, b->op);
    case DT_COLL_REDUCE_SCATTER: return dt_comm_reduce_scatter(w, b->send, b->recv, b->count, b->t, b->op);
    case DT_COLL_ALLGATHER: return dt_comm_allgather(w, b->send, b->recv, b->count, b->t);
    case DT_COLL_BROADCAST: return dt_comm_broadcast(w, b->recv, b->count, b->t, b->root);
    case DT_COLL_REDUCE: return dt_comm_reduce(w, b->send, b->recv, b->count, b->t, b->op, b->root);
    case DT_COLL_ALLTOALL: return dt_comm_alltoall(w, b->send, b->recv, b->count, b->t);
    case DT_COLL_GATHER: return dt_comm_gather(w, b->send, b->recv, b->count, b->t, b->root);
    case DT_COLL_SCATTER: return dt_comm_scatter(w, b->send, b->recv, b->count, b->t, b->root);
    case DT_COLL_BARRIER: return dt_comm_barrier(w);
    default: return dt_error(DT_ERR_ARG, "cannot benchmark %s", dt_coll_name(b->coll));
    }
}

static void *buf_alloc(dt_comm *w, size_t bytes, int arena) {
    void *p = NULL;
    if (arena) {
        if (dt_comm_alloc(w, bytes, &p)) return NULL;
    } else {
        p = dt_alloc_aligned(bytes);
        if (p) memset(p, 0, bytes);
    }
    return p;
}

static void buf_free(dt_comm *w, void *p, int arena) {
    if (arena) dt_comm_free(w, p);
    else dt_free_aligned(p);
}


/* Seconds per call (max over ranks) of `iters` calls, and whether others
 * used more than a tenth of a core meanwhile (then the figure is suspect). */
static dt_status timed(dt_comm *w, bench_case *b, long iters, double *sec, bool *disturbed) {
    dt_status st = dt_comm_barrier(w);
    double busy0 = dt_machine_busy(), cpu0 = dt_time_cpu(), t0 = dt_time_now();
    for (long k = 0; k < iters && !st; k++) st = run_once(w, b);
    double el = dt_time_now() - t0, t = el / (double)iters, cpu = dt_time_cpu() - cpu0, ours = 0;
    if (!st) st = dt_comm_allreduce(w, &t, sec, 1, DT_F64, DT_MAX);
    if (!st) st = dt_comm_allreduce(w, &cpu, &ours, 1, DT_F64, DT_SUM);
    double others = dt_machine_busy() - busy0 - ours;
    int32_t d = others > 0.1 * el + 0.02 /* /proc/stat ticks are 10 ms */, any = d;
    if (!st) st = dt_comm_allreduce(w, &d, &any, 1, DT_I32, DT_MAX);
    if (disturbed) *disturbed = any;
    return st;
}

typedef struct { size_t bytes; double med, lo, hi; long iters; char algo[32]; int nproc, disturbed; } bench_row;

/* The case for a collective of `bytes`: each rank's send and receive counts, its buffers filled. */
static dt_status make_case(dt_comm *w, const dt_bench_comm_opts *o, size_t bytes, bench_case *b) {
    int p = dt_comm_size(w), r = dt_comm_rank(w);
    size_t es = dt_dtype_size(o->dtype);
    *b = (bench_case){ o->coll, o->dtype, o->op, p, r, 0, count_for(o->coll, bytes, es, p), 0, 0, NULL, NULL };
    switch (o->coll) {
    case DT_COLL_ALLREDUCE: case DT_COLL_REDUCE: b->send_n = b->recv_n = b->count; break;
    case DT_COLL_BROADCAST: b->send_n = 0; b->recv_n = b->count; break;
    case DT_COLL_REDUCE_SCATTER: case DT_COLL_SCATTER: b->send_n = b->count * (size_t)p; b->recv_n = b->count; break;
    case DT_COLL_ALLGATHER: case DT_COLL_GATHER: b->send_n = b->count; b->recv_n = b->count * (size_t)p; break;
    case DT_COLL_ALLTOALL: b->send_n = b->recv_n = b->count * (size_t)p; break;
    default: break;
    }
    b->send = buf_alloc(w, b->send_n * es + 64, o->arena);
    b->recv = buf_alloc(w, b->recv_n * es + 64, o->arena);
    if (!b->send || !b->recv) return dt_error(DT_ERR_NOMEM, "bench: cannot allocate %zu bytes", bytes);
    fill(b);
    return DT_OK;
}

/* One call, its result checked on every rank: a wrong one anywhere fails every rank, naming where. */
static dt_status run_checked(dt_comm *w, const dt_bench_comm_opts *o, bench_case *b, size_t bytes) {
    dt_status st = run_once(w, b);
    double got = 0, want = 0;
    size_t bad = st ? SIZE_MAX : verify(b, &got, &want);
    int32_t badflag = bad != SIZE_MAX, anybad = 0;
    if (!st) st = dt_comm_allreduce(w, &badflag, &anybad, 1, DT_I32, DT_MAX);
    if (st || !anybad) return st;
    if (badflag)
        return dt_error(DT_ERR_ARG, "bench: %s of %zu bytes gave a wrong result on rank %d at element %zu: got %g, expected %g",
                        dt_coll_name(o->coll), bytes, b->rank, bad, got, want);
    return dt_error(DT_ERR_ARG, "bench: %s of %zu bytes gave a wrong result on another rank", dt_coll_name(o->coll), bytes);
}

/* The repetitions' times (sorted) into row: the length calibrated on a warmed-up call, the same on every rank; a
 * repetition during which others used the machine is discarded and retried, up to reps more times (counted). */
static dt_status repeat(dt_comm *w, const dt_bench_comm_opts *o, bench_case *b, bench_row *row) {
    double t1 = 0;
    dt_status st = timed(w, b, 1, &t1, NULL);
    long iters = t1 > 0 ? (long)(o->rep_seconds / t1) : 1000;
    if (iters < 1) iters = 1;
    if (iters > 100000) iters = 100000;
    int64_t it = iters;
    if (!st) st = dt_comm_broadcast(w, &it, 1, DT_I64, 0);
    double times[64];
    int reps = o->reps < 64 ? o->reps : 64, discarded = 0;
    for (int k = 0; k < o->warmup && !st; k++) st = timed(w, b, it, &times[0], NULL);
    for (int k = 0; k < reps && !st;) {
        bool dist = false;
        st = timed(w, b, it, &times[k], &dist);
        if (dist && discarded < reps) { discarded++; usleep(20000); continue; }
        k++;
    }
    row->disturbed = discarded;
    if (st) return st;
    row->med = dt_bench_median(times, reps); /* sorts */
    row->lo = times[0];
    row->hi = times[reps - 1];
    row->iters = it;
    return DT_OK;
}

static dt_status bench_size(dt_comm *w, const dt_bench_comm_opts *o, size_t bytes, bench_row *row) {
    bench_case b;
    dt_status st = make_case(w, o, bytes, &b);
    if (!st) st = run_checked(w, o, &b, bytes);
    if (!st) st = repeat(w, o, &b, row);
    if (!st) {
        row->bytes = bytes;
        row->nproc = b.p;
        size_t es = dt_dtype_size(o->dtype);
        size_t total = b.count * es * (o->coll == DT_COLL_ALLREDUCE || o->coll == DT_COLL_BROADCAST || o->coll == DT_COLL_REDUCE ? 1 : (size_t)b.p);
        snprintf(row->algo, sizeof row->algo, "%s", dt_algo_name(dt_comm_choose_algo(w, o->coll, total)));
    }
    buf_free(w, b.send, o->arena);
    buf_free(w, b.recv, o->arena);
    return st;
}

static void print_json_row(FILE *f, const dt_bench_comm_opts *o, const bench_row *row, const char *buffers) {
    double algbw = row->bytes / row->med / 1e9;
    fprintf(f, "{\"op\":\"%s\",\"algo\":\"%s\",\"nproc\":%d,\"bytes\":%zu,\"avg_us\":%.3f,\"algbw_gbs\":%.3f,"
               "\"busbw_gbs\":%.3f,\"buffers\":\"%s\",\"min_us\":%.3f,\"max_us\":%.3f,\"iters\":%ld,\"dtype\":\"%s\","
               "\"disturbed_reps\":%d}\n",
            dt_coll_name(o->coll), row->algo, row->nproc, row->bytes, row->med * 1e6, algbw,
            algbw * bus_factor(o->coll, row->nproc), buffers, row->lo * 1e6, row->hi * 1e6, row->iters, dt_dtype_name(o->dtype),
            row->disturbed);
    fflush(f);
}

/* ---- calibration: the cost model's parameters, measured here ---- */

/* Median seconds of one call of fn, over reps repetitions of iters calls. */
typedef dt_status (*timed_fn)(dt_comm *w, void *arg);
static double median_time(dt_comm *w, timed_fn fn, void *arg, int iters, int reps) {
    double t[15];
    if (reps > 15) reps = 15;
    for (int k = -1; k < reps; k++) {
        dt_comm_barrier(w);
        double t0 = dt_time_now();
        for (int i = 0; i < iters; i++) fn(w, arg);
        double dt = (dt_time_now() - t0) / iters, mx = dt;
        dt_comm_allreduce(w, &dt, &mx, 1, DT_F64, DT_MAX);
        if (k >= 0) t[k] = mx;
    }
    return dt_bench_median(t, reps);
}

typedef struct { void *buf; size_t n; int a, b; } vec_arg;
static dt_status do_allreduce(dt_comm *w, void *a) {
    vec_arg *v = a;
    return dt_comm_allreduce(w, v->buf, v->buf, v->n, DT_F32, DT_SUM);
}
/* Ranks a and b exchange n floats at once; the others wait at the barrier. */
static dt_status do_pingpong(dt_comm *w, void *arg) {
    vec_arg *v = arg;
    int r = dt_comm_rank(w);
    if (r != v->a && r != v->b) return DT_OK;
    int peer = r == v->a ? v->b : v->a;
    return dt_comm_sendrecv(w, v->buf, v->n, peer, (float *)v->buf + v->n, v->n, peer, DT_F32);
}

/* Ranks v->a and v->b exchange at once (a ring step), so one call costs
 * α + bytes·β: α from 8 bytes, β from `large` floats. */
static void measure_exchange(dt_comm *w, vec_arg *v, size_t large, int small_iters, double *alpha, double *beta) {
    v->n = 2;
    double small = median_time(w, do_pingpong, v, small_iters, 7);
    v->n = large;
    double big = median_time(w, do_pingpong, v, 5, 5);
    *alpha = small;
    *beta = (big - small) / (double)(large * 4);
    if (*beta <= 0) *beta = big / (double)(large * 4);
}

/* Across machines only MPI's alpha and beta can be seen: rank 0 and the first rank of another machine exchange; shm
 * values stay as they are (calibrate those with one rank per core on one machine). */
static void calibrate_between_machines(dt_comm *w, vec_arg *v, size_t n, dt_cost_params *k) {
    int p = dt_comm_size(w);
    int32_t node = dt_comm_node(w), nodes[p];
    if (dt_comm_allgather(w, &node, nodes, 1, DT_I32)) memset(nodes, 0, sizeof nodes);
    v->b = 1;
    while (v->b < p && nodes[v->b] == nodes[0]) v->b++;
    measure_exchange(w, v, n / 2, 5000, &k->mpi_alpha, &k->mpi_beta);
    /* the link's processing on the two ranks' cores: their compute beside the exchange (the slower of the two) */
    int r = dt_comm_rank(w);
    double s = v->b < p && (r == 0 || r == v->b) ? dt_bench_link_slowdown(w, r == 0 ? v->b : 0, v->buf, n / 2) : 0;
    dt_comm_allreduce(w, &s, &k->mpi_slowdown, 1, DT_F64, DT_MAX);
}

/* One machine: the reduction's gamma, shm_direct's latency and memory traffic, the channels' alpha and beta. */
static void calibrate_machine(dt_comm *w, vec_arg *v, size_t big, dt_cost_params *k) {
    int p = dt_comm_size(w);
    /* gamma: one rank folding a cache-resident vector into another */
    float *x = dt_alloc_aligned(1u << 20), *y = dt_alloc_aligned(1u << 20);
    memset(x, 0, 1u << 20);
    memset(y, 0, 1u << 20);
    double t0 = dt_time_now();
    for (int i = 0; i < 200; i++) dt_reduce_into(x, y, (1u << 20) / 4, DT_F32, DT_SUM);
    k->gamma = (dt_time_now() - t0) / 200 / (1u << 20);
    dt_free_aligned(x);
    dt_free_aligned(y);
    dt_comm_allreduce(w, &k->gamma, &k->gamma, 1, DT_F64, DT_MAX);
    /* shm_direct: a barrier's worth of latency, then memory traffic per byte */
    dt_comm_set_algo(w, DT_COLL_ALLREDUCE, DT_ALGO_SHM_DIRECT);
    v->n = 2;
    k->direct_alpha = median_time(w, do_allreduce, v, 20000, 7);
    v->n = big / 4;
    double t = median_time(w, do_allreduce, v, 5, 5);
    k->direct_beta = (t - 2 * k->direct_alpha - (double)big * k->gamma / p) / (2.0 * big);
    if (k->direct_beta <= 0) k->direct_beta = t / (2.0 * big);
    measure_exchange(w, v, big / 8, 20000, &k->p2p_alpha, &k->p2p_beta);
    dt_comm_set_algo(w, DT_COLL_ALLREDUCE, DT_ALGO_AUTO);
}

/* Rank 0 writes the calibration where the cost model reads it and says what it measured: 0, or 1 if it could not. */
static int save_calibration(dt_comm *w, const dt_cost_params *k) {
    char path[4096], dir[4096];
    dt_cost_params_path(path, sizeof path);
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) { *slash = 0; char cmd[4200]; snprintf(cmd, sizeof cmd, "mkdir -p '%s'", dir); if (system(cmd)) {} }
    int rc = 0;
    if (dt_cost_params_save(path, k)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); rc = 1; }
    printf("# calibration on %d ranks, written to %s\n", dt_comm_size(w), path);
    printf("p2p (shm channels): alpha %.3f us, beta %.3f GB/s\n", k->p2p_alpha * 1e6, 1e-9 / k->p2p_beta);
    printf("shm_direct:         alpha %.3f us, beta %.3f GB/s of memory traffic\n", k->direct_alpha * 1e6, 1e-9 / k->direct_beta);
    printf("reduction:          gamma %.3f GB/s\n", 1e-9 / k->gamma);
    printf("mpi (%s):    alpha %.3f us, beta %.3f GB/s, compute beside it %.1f%% slower\n",
           dt_comm_nodes(w) > 1 ? "measured" : "kept, needs several machines", k->mpi_alpha * 1e6, 1e-9 / k->mpi_beta, k->mpi_slowdown * 100);
    if (dt_comm_nodes(w) > 1) printf("(shm and reduction values kept from the file: calibrate them on one machine)\n");
    return rc;
}

/* What auto now picks, and what each algorithm is predicted to cost. */
static void print_predictions(dt_comm *w) {
    printf("\n# predicted allreduce time (us) on this communicator (%d ranks, %s); * = auto's choice\n", dt_comm_size(w),
           dt_comm_transport(w));
    printf("%10s", "bytes");
    for (int a = DT_ALGO_SHM_DIRECT; a < DT_ALGO_COUNT; a++)
        if (dt_algo_lookup((dt_algo)a, DT_COLL_ALLREDUCE)) printf(" %13s", dt_algo_name((dt_algo)a));
    printf("\n");
    for (size_t b = 8; b <= (256u << 20); b *= 4) {
        char sz[32];
        printf("%10s", dt_format_size(b, sz, sizeof sz));
        dt_algo best = dt_select_algo(w, DT_COLL_ALLREDUCE, b);
        for (int a = DT_ALGO_SHM_DIRECT; a < DT_ALGO_COUNT; a++) {
            if (!dt_algo_lookup((dt_algo)a, DT_COLL_ALLREDUCE)) continue;
            double c = dt_cost_predict(w, (dt_algo)a, DT_COLL_ALLREDUCE, b);
            if (c == INFINITY) printf(" %13s", "-");
            else printf(" %12.2f%s", c * 1e6, a == (int)best ? "*" : " ");
        }
        printf("\n");
    }
}

static int calibrate(dt_comm *w) {
    int p = dt_comm_size(w), r = dt_comm_rank(w);
    if (p < 2) { dt_log(DT_LOG_ERROR, "calibrate: needs at least 2 ranks (--nproc)"); return 2; }
    dt_cost_params k = *dt_cost_params_current();
    size_t big = 16u << 20;
    vec_arg v = { NULL, 0, 0, 1 };
    if (dt_comm_alloc(w, 2 * big, &v.buf)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    if (dt_comm_nodes(w) > 1) calibrate_between_machines(w, &v, big / 4, &k);
    else calibrate_machine(w, &v, big, &k);
    dt_comm_free(w, v.buf);
    int rc = r == 0 ? save_calibration(w, &k) : 0;
    dt_cost_params_set(&k);
    if (r == 0) print_predictions(w);
    return rc;
}

/* The part every rank runs. */
static int bench_ranks(const dt_bench_comm_opts *o) {
    dt_comm *w;
    if (dt_comm_init(&w)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 1; }
    if (o->calibrate) {
        int rc = calibrate(w);
        dt_comm_destroy(w);
        return rc;
    }
    if (o->algo != DT_ALGO_AUTO && dt_comm_set_algo(w, o->coll, o->algo)) {
        dt_log(DT_LOG_ERROR, "%s", dt_last_error());
        dt_comm_destroy(w);
        return 2;
    }
    FILE *out = NULL;
    const char *path = getenv("DTRAIN_BENCH_OUT");
    if (dt_comm_rank(w) == 0) out = path ? fopen(path, "w") : stdout;
    int rc = 0;
    size_t es = dt_dtype_size(o->dtype);
    for (int i = 0; i < o->nsizes; i++) {
        if (o->coll != DT_COLL_BARRIER && count_for(o->coll, o->sizes[i], es, dt_comm_size(w)) == 0) continue;
        bench_row row;
        if (bench_size(w, o, o->sizes[i], &row)) {
            dt_log(DT_LOG_ERROR, "%s", dt_last_error());
            rc = 1;
            break;
        }
        if (out) print_json_row(out, o, &row, o->arena ? "arena" : "private");
        if (o->coll == DT_COLL_BARRIER) break;
    }
    if (out && out != stdout) fclose(out);
    dt_comm_destroy(w);
    return rc;
}

/* ---- the parent: launch, baseline, table ---- */

typedef struct { size_t bytes; double us, busbw, lo, hi; char algo[32]; int disturbed; } result;

static int read_results(const char *path, result *res, int max) {
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    char line[4096];
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        cJSON *j = cJSON_Parse(line);
        if (!j) continue;
        cJSON *b = cJSON_GetObjectItemCaseSensitive(j, "bytes"), *us = cJSON_GetObjectItemCaseSensitive(j, "avg_us"),
              *bw = cJSON_GetObjectItemCaseSensitive(j, "busbw_gbs"), *al = cJSON_GetObjectItemCaseSensitive(j, "algo"),
              *lo = cJSON_GetObjectItemCaseSensitive(j, "min_us"), *hi = cJSON_GetObjectItemCaseSensitive(j, "max_us");
        if (cJSON_IsNumber(b) && cJSON_IsNumber(us) && cJSON_IsNumber(bw)) {
            res[n].bytes = (size_t)b->valuedouble;
            res[n].us = us->valuedouble;
            res[n].busbw = bw->valuedouble;
            res[n].lo = cJSON_IsNumber(lo) ? lo->valuedouble : us->valuedouble;
            res[n].hi = cJSON_IsNumber(hi) ? hi->valuedouble : us->valuedouble;
            snprintf(res[n].algo, sizeof res[n].algo, "%s", cJSON_IsString(al) ? al->valuestring : "?");
            cJSON *d = cJSON_GetObjectItemCaseSensitive(j, "disturbed_reps");
            res[n].disturbed = cJSON_IsNumber(d) ? d->valueint : 0;
            n++;
        }
        cJSON_Delete(j);
    }
    fclose(f);
    return n;
}

static int run_baseline(const dt_bench_comm_opts *o, const char *outpath) {
    char dir[PATH_MAX], cmd[8192], sizes[2048] = "";
    if (dt_bench_self_dir(dir, sizeof dir)) strcpy(dir, ".");
    bool mpich = strcmp(o->baseline, "mpich") == 0;
    const char *bin = mpich ? "mpi_coll_bench_mpich" : "mpi_coll_bench";
    for (int i = 0; i < o->nsizes; i++)
        snprintf(sizes + strlen(sizes), sizeof sizes - strlen(sizes), "%s%zu", i ? "," : "", o->sizes[i]);
    char binpath[PATH_MAX + 64];
    snprintf(binpath, sizeof binpath, "%s/bench/%s", dir, bin);
    if (access(binpath, X_OK) != 0) {
        dt_log(DT_LOG_ERROR, "bench: baseline program %s is missing (was dtrain built with %s installed?)", binpath,
               mpich ? "MPICH (mpicc.mpich)" : "an MPI library");
        return 1;
    }
    snprintf(cmd, sizeof cmd,
             "%s -np %d %s %s --op %s --dtype %s --redop %s --sizes %s --reps %d --warmup %d --seconds %g > %s",
             mpich ? "mpirun.mpich" : "mpirun", o->nproc,
             mpich ? "" : "--oversubscribe --allow-run-as-root",
             binpath, dt_coll_name(o->coll), dt_dtype_name(o->dtype), dt_op_name(o->op), sizes, o->reps, o->warmup,
             o->rep_seconds, outpath);
    int rc = system(cmd);
    if (rc != 0) dt_log(DT_LOG_ERROR, "bench: baseline command failed (%d): %s", rc, cmd);
    return rc != 0;
}

static void print_machine(const dt_bench_comm_opts *o) {
    struct utsname u;
    uname(&u);
    char model[256];
    dt_cpu_model(model, sizeof model);
    printf("# dtrain bench comm: %s, %s %s, %ld cores, %s\n", model, u.sysname, u.release,
           sysconf(_SC_NPROCESSORS_ONLN), o->nproc > sysconf(_SC_NPROCESSORS_ONLN) ? "OVERSUBSCRIBED" : "not oversubscribed");
    printf("# %s %s %s, %d ranks, %s buffers, algo %s, median of %d reps (after %d warm-up) of ~%.0f ms each, %d round(s)\n",
           dt_coll_name(o->coll), dt_dtype_name(o->dtype), dt_op_name(o->op), o->nproc, o->arena ? "arena" : "private",
           dt_algo_name(o->algo), o->reps, o->warmup, o->rep_seconds * 1e3, o->rounds);
}


enum { MAXR = 16, MAXS = 64 };
/* Every round's results, dtrain's and the baseline's, by size. */
typedef struct {
    result dt[MAXR][MAXS], mpi[MAXR][MAXS];
    int ndt[MAXR], nmpi[MAXR], rounds;
} rounds_run;

/* The rounds: the ranks launched again with argv (and the baseline after them), each writing its results to a file. */
static int run_rounds(const dt_bench_comm_opts *o, int argc, char **argv, rounds_run *x) {
    char path[] = "/tmp/dtrain-bench-XXXXXX", self[PATH_MAX];
    int fd = mkstemp(path);
    if (fd < 0) { dt_log(DT_LOG_ERROR, "bench: cannot create a temporary file: %s", strerror(errno)); return 1; }
    close(fd);
    char **args = calloc((size_t)argc + 1, sizeof *args);
    int rc = !args ? (dt_log(DT_LOG_ERROR, "bench: out of memory"), 1)
                   : dt_bench_self(self, sizeof self) ? (dt_log(DT_LOG_ERROR, "bench: cannot find my own executable"), 1) : 0;
    for (int i = 0; i < argc && !rc; i++) args[i] = i ? argv[i] : self;
    for (int r = 0; r < x->rounds && !rc; r++) {
        setenv("DTRAIN_BENCH_OUT", path, 1);
        rc = dt_comm_launch(o->nproc, args);
        unsetenv("DTRAIN_BENCH_OUT");
        x->ndt[r] = read_results(path, x->dt[r], MAXS);
        if (!rc && o->baseline) {
            rc = run_baseline(o, path);
            x->nmpi[r] = read_results(path, x->mpi[r], MAXS);
        }
    }
    unlink(path);
    free(args);
    return rc;
}

/* Size i's row: the rounds' median time and bus bandwidth (their range, retries) and the baseline's beside them. */
static void print_row(const dt_bench_comm_opts *o, const rounds_run *x, int i) {
    double us[MAXR], bw[MAXR], mus[MAXR], mbw[MAXR], lo = INFINITY, hi = 0;
    int nm = 0, dist = 0;
    size_t bytes = x->dt[0][i].bytes;
    for (int r = 0; r < x->rounds; r++) {
        us[r] = x->dt[r][i].us, bw[r] = x->dt[r][i].busbw, dist += x->dt[r][i].disturbed;
        lo = fmin(lo, x->dt[r][i].lo), hi = fmax(hi, x->dt[r][i].hi);
        for (int k = 0; k < x->nmpi[r]; k++)
            if (x->mpi[r][k].bytes == bytes) mus[nm] = x->mpi[r][k].us, mbw[nm] = x->mpi[r][k].busbw, nm++;
    }
    double u = dt_bench_median(us, x->rounds), b = dt_bench_median(bw, x->rounds), mu = dt_bench_median(mus, nm), mb = dt_bench_median(mbw, nm);
    if (o->json) {
        printf("{\"op\":\"%s\",\"algo\":\"%s\",\"nproc\":%d,\"bytes\":%zu,\"avg_us\":%.3f,\"algbw_gbs\":%.3f,\"busbw_gbs\":%.3f,"
               "\"buffers\":\"%s\"", dt_coll_name(o->coll), x->dt[0][i].algo, o->nproc, bytes, u, bytes / u / 1e3, b,
               o->arena ? "arena" : "private");
        if (nm) printf(",\"baseline\":\"%s\",\"baseline_avg_us\":%.3f,\"baseline_busbw_gbs\":%.3f", o->baseline, mu, mb);
        printf("}\n");
        return;
    }
    char sz[32], range[48];
    snprintf(range, sizeof range, "%.2f-%.2f", lo, hi);
    printf("%10s %-13s %11.2f %21s %9.2f %9.2f %4d", dt_format_size(bytes, sz, sizeof sz), x->dt[0][i].algo, u, range,
           bytes / u / 1e3, b, dist);
    if (nm) printf(" | %11.2f %9.2f %8.2fx %8.2fx", mu, mb, mu / u, mb > 0 ? b / mb : 0.0);
    printf("\n");
}

int dt_bench_comm(const dt_bench_comm_opts *o, int argc, char **argv) {
    dt_launch_kind kind;
    if (dt_comm_detect_launch(&kind)) { dt_log(DT_LOG_ERROR, "%s", dt_last_error()); return 2; }
    if (kind != DT_LAUNCH_NONE || (o->nproc == 1 && !o->baseline)) return bench_ranks(o);
    if (o->calibrate) {
        char self[PATH_MAX];
        if (dt_bench_self(self, sizeof self)) return 1;
        argv[0] = self;
        return dt_comm_launch(o->nproc, argv);
    }
    static rounds_run x; /* large: not on the stack */
    memset(&x, 0, sizeof x);
    x.rounds = o->rounds < 1 ? 1 : o->rounds > MAXR ? MAXR : o->rounds;
    int rc = run_rounds(o, argc, argv, &x);
    if (rc) return rc;
    if (!o->json) {
        print_machine(o);
        printf("%10s %-13s %11s %21s %9s %9s %4s", "bytes", "algo", "avg_us", "min-max_us", "algbw", "busbw", "dist");
        if (o->baseline) printf(" | %11s %9s %9s %9s", o->baseline, "busbw", "lat_x", "bw_x");
        printf("\n");
    }
    for (int i = 0; i < x.ndt[0]; i++) print_row(o, &x, i);
    if (!o->json) {
        printf("# dist = dtrain repetitions discarded and retried because other work used > 10%% of a core meanwhile\n");
        if (o->baseline)
            printf("# lat_x = %s time / dtrain time, bw_x = dtrain busbw / %s busbw (above 1: dtrain is faster)\n",
                   o->baseline, o->baseline);
    }
    return 0;
}
