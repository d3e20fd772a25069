/* This machine, measured for the planner: its cores and memory, the GEMM
 * peaks (obs/peak.c's cache), the streams' bandwidth, attention's rate, the
 * optimizer's, the 16-bit copy into fresh pages, ZeRO's pages lent by its pool, a GEMM's slowdown beside
 * busy neighbours (each measured once per CPU and cached beside the peaks),
 * and the links from the communication calibration. */
#include "plan_internal.h"

#include "dtrain/base.h"
#include "dtrain/codec.h"
#include "dtrain/comm.h"
#include "dtrain/kernels.h"
#include "dtrain/obs.h"
#include "dtrain/optim.h"

#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A streaming measurement's passes: at least 5, and more until `secs` have gone (at most RATES). Their median, not their
 * best: a VM's bandwidth comes and goes by the tens of milliseconds, and the best of a few passes read bursts a run never
 * keeps (on the 2-core Zen 5, 5 plans' fresh measurements gave the residual add 41-47 GB/s and once 84, the update on both
 * cores 73-83 and once 140; within one half second the update's passes read 57-77). */
enum { RATES = 64 };

static bool another_pass(int k, double start, double secs) { return k < RATES && (k < 5 || dt_time_now() - start < secs); }

/* The residual add (a = b + c, a streaming kernel) over arrays far larger than the caches, on `threads` threads: GB a second (3 arrays moved). */
static double measure_bandwidth(int threads) {
    size_t n = (size_t)32 << 20;
    float *a = dt_alloc_aligned(n * 4), *b = dt_alloc_aligned(n * 4), *c = dt_alloc_aligned(n * 4);
    double r[RATES];
    int k = 0;
    if (a && b && c) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < n; i++) b[i] = 1, c[i] = 2, a[i] = 0;
        for (double start = dt_time_now(); another_pass(k, start, 0.3);) {
            double t0 = dt_time_now();
            dt_residual_forward(a, b, c, n);
            r[k++] = 12.0 * (double)n / (dt_time_now() - t0) / 1e9;
        }
    }
    dt_free_aligned(a);
    dt_free_aligned(b);
    dt_free_aligned(c);
    return dt_median(r, (size_t)k);
}

/* Causal attention forward and backward at T 1024, 4 heads of 64, on one thread (job_timings.c): the machine's rate, which
 * a job's plan replaces by the rate at its own sequences and heads. */
static double measure_attention(int unused) {
    (void)unused;
    return dt_plan_time_attention(1024, 64) / 1e9;
}

/* AdamW's update (dt_optim_step: it reads a parameter, its gradient and two moments, writes three back and zeroes the
 * gradient) over 16M parameters on `threads` threads: GB a second at those 32 bytes a parameter. A streaming kernel of
 * its own: one core ran it 1.5-2.3x faster here than the residual add a = b + c, per byte. */
static double measure_optimizer(int threads) {
    size_t n = (size_t)16 << 20;
    dt_optim_config cfg;
    dt_optim_defaults(DT_OPT_ADAMW, &cfg);
    dt_tensor_span span = { 0, n, 0, 0, 0, 0 };
    dt_optim *o = NULL;
    float *p = dt_alloc_aligned(n * 4), *g = dt_alloc_aligned(n * 4);
    double r[RATES];
    int k = 0;
    if (p && g && !dt_optim_create(&cfg, n, &span, 1, &o)) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < n; i++) p[i] = 1e-2f * (float)(i % 11), g[i] = 0;
        dt_optim_step(o, p, g, 1e-4f, 1); /* the first touches the moments' pages */
        /* over half a second: 4 steps back to back read 44-64 GB/s on one Zen 5 core from one measurement to the next */
        for (double start = dt_time_now(); another_pass(k, start, 0.5);) {
            double t0 = dt_time_now();
            dt_optim_step(o, p, g, 1e-4f, 1);
            r[k++] = 32.0 * (double)n / (dt_time_now() - t0) / 1e9;
        }
    }
    dt_optim_destroy(o);
    dt_free_aligned(p);
    dt_free_aligned(g);
    return dt_median(r, (size_t)k);
}

/* A 16-bit copy of 16M parameters made into pages given back just before (as a mixed-precision model made unit by unit makes
 * each unit's, lp_cast and lp_drop), on one thread: GB of f32 read a second. Each 4 KiB page comes zeroed by the kernel
 * (4.6 GB/s of f32 on a Zen 5 core, where the streams run at 40-70): a 124M ZeRO-3 bf16 rank spent ~300 ms a step there. */
static double measure_lp_fresh(int threads) {
    size_t n = (size_t)16 << 20;
    float *src = dt_alloc_aligned(n * 4);
    uint16_t *dst = dt_alloc_aligned(n * 2);
    double r[RATES];
    int k = 0;
    if (src && dst) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < n; i++) src[i] = 1e-2f * (float)(i % 11);
        for (double start = dt_time_now(); another_pass(k, start, 0);) {
            dt_mem_release(dst, n * 2);
            double t0 = dt_time_now();
            dt_lp_pack(dst, src, n, DT_BF16);
            r[k++] = 4.0 * (double)n / (dt_time_now() - t0) / 1e9;
        }
    }
    dt_free_aligned(src);
    dt_free_aligned(dst);
    return dt_median(r, (size_t)k);
}

/* ZeRO 2 and 3's gradient pages lent and zeroed, as ddp.c's lend does each step for the store's part outside a rank's shard:
 * a shared file's pages (a small pool, resident) mapped over a larger range with their page tables filled (MAP_POPULATE, as
 * dt_comm_map_pages), then zeroed; the range given its own pages back after (unmapped holes). On one thread: GB of the range
 * a second. A 124M bf16 ZeRO-2 rank of 2 spent 25 ms a step there (its trace's "borrow pages"), ZeRO-1 nothing. */
static double measure_pool_lend(int unused) {
    (void)unused;
    size_t pool = (size_t)16 << 20, range = (size_t)128 << 20, chunk = pool / 2;
    int fd = memfd_create("dtrain-plan", 0);
    char *base = fd >= 0 && ftruncate(fd, (off_t)(pool + range)) == 0
                     ? mmap(NULL, pool + range, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, fd, 0)
                     : MAP_FAILED;
    double r[RATES];
    int k = 0;
    if (base != MAP_FAILED) {
        memset(base, 1, pool); /* the pool's pages stay resident, as the runtime's after its first step */
        for (double start = dt_time_now(); another_pass(k, start, 0);) {
            double t0 = dt_time_now();
            bool ok = true;
            for (size_t at = 0; at < range && ok; at += chunk) {
                char *dst = base + pool + at;
                ok = mmap(dst, chunk, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE | MAP_POPULATE, fd,
                          (off_t)(at / chunk % 2 * chunk)) != MAP_FAILED;
                if (ok) memset(dst, 0, chunk);
            }
            ok = ok && mmap(base + pool, range, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED | MAP_NORESERVE, fd, (off_t)pool) != MAP_FAILED;
            if (!ok) break;
            r[k++] = (double)range / (dt_time_now() - t0) / 1e9;
        }
        munmap(base, pool + range);
    }
    if (fd >= 0) close(fd);
    return dt_median(r, (size_t)k);
}

/* A gradient codec's compression on one thread (codec_powersgd.c at rank 4, codec_topk.c at density 0.01, codec_onebit.c
 * after its freeze): gradient
 * elements a second (in billions: the cache keeps figures below 1e6), over one bucket of a [2048 x 1024] and a [1024 x 4096] matrix and a vector, exchanged on a lone
 * communicator (its collectives move nothing), the best of 5 steps after one. Not measured where this process is a rank
 * of a job (no lone communicator there): the planner then counts the codec's passes at the bandwidth. */
static double measure_codec(int kind) {
    dt_comm *self = NULL;
    if (dt_comm_init(&self)) return 0;
    static const int shapes[3][2] = { { 2048, 1024 }, { 1024, 4096 }, { 4096, 1 } };
    dt_tensor_info t[3];
    size_t n = 0;
    for (int i = 0; i < 3; i++) {
        memset(&t[i], 0, sizeof t[i]);
        t[i].ndim = shapes[i][1] > 1 ? 2 : 1, t[i].shape[0] = shapes[i][0], t[i].shape[1] = shapes[i][1];
        t[i].count = (size_t)shapes[i][0] * (size_t)shapes[i][1], t[i].offset = n;
        n += t[i].count;
    }
    /* 1-bit Adam frozen after its first step: the steps timed are its coding's */
    static const dt_codec_kind kinds[] = { DT_CODEC_POWERSGD, DT_CODEC_TOPK, DT_CODEC_ONEBIT };
    dt_codec_config c = { .kind = kinds[kind], .rank = 4, .min_rate = 2, .density = 0.01f, .seed = 1, .start = kind == 2, .beta1 = 0.9f };
    dt_codec *k = NULL;
    float *g = malloc(n * sizeof *g);
    int idx[3] = { 0, 1, 2 };
    double best = 0;
    uint64_t rng = 7;
    float *g0 = malloc(n * sizeof *g0);
    for (size_t i = 0; g0 && i < n; i++) g0[i] = dt_rng_normal(&rng) * 1e-3f;
    for (int step = 0; g && g0 && (k || !dt_codec_create(&c, t, 3, &k)) && step < 6; step++) {
        memcpy(g, g0, n * sizeof *g); /* the same gradient each step: the residual makes each step's selection its own */
        double t0 = dt_time_now();
        dt_request *req = NULL;
        int done = 0;
        dt_status st = dt_codec_start(k, self, 0, idx, 3, g, &req);
        while (!st && !done) {
            if (req && (st = dt_wait(req))) break;
            st = dt_codec_next(k, self, 0, g, &req, &done);
        }
        dt_codec_end_step(k, NULL);
        double rate = (double)n / (dt_time_now() - t0) / 1e9;
        if (!st && step > 0 && rate > best) best = rate;
        if (st) break;
    }
    dt_codec_destroy(k);
    free(g);
    free(g0);
    dt_comm_destroy(self);
    return best;
}

/* A GEMM's rate when every other core runs one too, against alone: ranks that fill a machine slow each other's compute
 * (the shared L3 and memory, the clock a busy package holds), which a kernel timed alone does not see. On the 2-core Zen 5
 * a 512 x 3072 x 768 Linear ran 0.3-3% slower beside a twin process, in f32 and in bf16 alike (and bf16 beside f32), and
 * a 124M bf16 step's blocks and head 3-4% slower beside a twin run; a neighbour spinning on integer work (yes) slowed
 * them by nothing. This measurement: 1.6-2.9% in four runs. */
enum { BUSY_M = 512, BUSY_N = 3072, BUSY_K = 768 };

static void busy_gemm(const float *a, const float *b, float *c) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BUSY_M, BUSY_N, BUSY_K, 1, a, BUSY_K, b, BUSY_K, 0, c, BUSY_N);
}

/* GEMMs a second on this thread over `seconds` */
static double busy_rate(const float *a, const float *b, float *c, double seconds) {
    double t0 = dt_time_now(), t = t0;
    int n = 0;
    for (; t - t0 < seconds; n++, t = dt_time_now()) busy_gemm(a, b, c);
    return n / (t - t0);
}

/* (cores - 1) neighbour processes, as ranks are, each running the GEMM until killed (or for 30 s, should this process
 * die first); each says on the pipe once it runs. Processes, not threads: two threads of one process calling the BLAS
 * at once ran 37% slower here (the BLAS's own contention), two processes 2-3%. The children call nothing but the BLAS on
 * one thread, no OpenMP region, which a child forked from a threaded process may. Returns how many started. */
static int busy_neighbours(int nb, const float *a, const float *b, float *c, const int fd[2], pid_t *pid) {
    int made = 0;
    for (; made < nb; made++) {
        fflush(NULL);
        if ((pid[made] = fork()) < 0) break;
        if (pid[made] == 0) {
            double t0 = dt_time_now();
            busy_gemm(a, b, c);
            if (write(fd[1], "x", 1) != 1) _exit(1);
            while (dt_time_now() - t0 < 30) busy_gemm(a, b, c);
            _exit(0);
        }
    }
    char x;
    struct pollfd p = { fd[0], POLLIN, 0 };
    for (int i = 0; i < made; i++) /* a child that died before saying so must not hang this one */
        if (poll(&p, 1, 10000) != 1 || read(fd[0], &x, 1) != 1) return i;
    return made;
}

/* alone / beside (cores - 1) neighbours: five pairs of 0.3 s timings, each pair's ratio (a pair close in time, as this VM
 * drifts), their median; at least 1 (below is the machine's noise), and 1 on one core. A pair whose lone timing shared
 * the machine with other work is not counted (another process beside it makes "alone" a neighbour's rate: one busy
 * loop read 1.59-1.98 where the quiet machine reads 1.03, and cached, every plan of several ranks ran 50-64% long);
 * 0 where five clean pairs were not had in fifteen. */
static double measure_busy_slowdown(int cores) {
    enum { PAIRS = 5, TRIES = 15 };
    int nb = cores > 1 ? cores - 1 : 0, fds[2] = { -1, -1 }, done = 0;
    size_t sa = (size_t)BUSY_M * BUSY_K, sb = (size_t)BUSY_N * BUSY_K, sc = (size_t)BUSY_M * BUSY_N;
    float *a = dt_alloc_aligned(sa * 4), *b = dt_alloc_aligned(sb * 4), *c = dt_alloc_aligned(sc * 4);
    pid_t pid[nb > 0 ? nb : 1];
    double ratio[PAIRS];
    if (a && b && c && nb > 0 && pipe(fds) == 0) {
        dt_kernels_set_threads(1);
        for (size_t i = 0; i < sa; i++) a[i] = 1e-3f * (float)(i % 7);
        for (size_t i = 0; i < sb; i++) b[i] = 1e-3f * (float)(i % 5);
        busy_gemm(a, b, c);
        for (int tries = 0; done < PAIRS && tries < TRIES; tries++) {
            double busy0 = dt_machine_busy(), cpu0 = dt_time_cpu_all(), t0 = dt_time_now();
            double alone = busy_rate(a, b, c, 0.3);
            bool clean = !dt_others_busy(busy0, cpu0, dt_time_now() - t0);
            int made = busy_neighbours(nb, a, b, c, fds, pid);
            if (made == nb && clean) ratio[done++] = alone / busy_rate(a, b, c, 0.3);
            for (int i = 0; i < made; i++) kill(pid[i], SIGKILL);
            for (int i = 0; i < made; i++) while (waitpid(pid[i], NULL, 0) < 0 && errno == EINTR) {}
            if (made < nb) break;
        }
    }
    if (fds[0] >= 0) close(fds[0]), close(fds[1]);
    dt_free_aligned(a);
    dt_free_aligned(b);
    dt_free_aligned(c);
    return nb == 0 ? 1 : done == PAIRS ? fmax(1, dt_median(ratio, PAIRS)) : 0;
}

/* The cache's key of a figure measured with every core: how many it was is in it (memory_gbs_2_cores), since the cache is
 * the CPU's and a container's quota gives a process fewer cores than the same CPU has outside it. */
static const char *cores_key(char out[64], const char *what, int cores, const char *tail) {
    snprintf(out, 64, "%s_%d_cores%s", what, cores, tail);
    return out;
}

/* The slowdown of a core's GEMM beside the other cores' (measure_busy_slowdown), cached; measured only where this
 * process may run on every core (under a narrower mask, taskset or a Slurm step, the neighbours would share its own core
 * and the figure, cached for the CPU, would say the machine twice as slow beside them): there the cache's figure, if
 * any. Where other work kept it from a clean measurement, none is kept and this plan takes none (1), said. */
static dt_status busy_slowdown(dt_plan_hardware *h, int allowed) {
    char k[64];
    int n = (int)h->devices_per_node;
    cores_key(k, "gemm_slowdown", n, "_busy");
    dt_status st = dt_peak_cached_rate(k, NULL, n, &h->busy_slowdown);
    if (st || h->busy_slowdown > 0 || allowed < n) return st;
    if ((h->busy_slowdown = measure_busy_slowdown(n)) > 0) {
        if (dt_peak_save_rate(k, h->busy_slowdown)) dt_log(DT_LOG_WARN, "%s: not cached (%s)", k, dt_last_error());
        return DT_OK;
    }
    dt_log(DT_LOG_WARN, "plan: other work kept this machine busy while a GEMM's slowdown beside the ranks' was measured: none is "
           "kept, and this plan takes none (the next plan measures it again)");
    h->busy_slowdown = 1;
    return DT_OK;
}

/* The memory streams' rates: $DTRAIN_MEMORY_BANDWIDTH (bytes a second) for all of them instead of measuring, as
 * $DTRAIN_PEAK_GFLOPS does for the peak; else each measured once on this CPU and kept beside the GEMM peak
 * (~/.cache/dtrain/peak.json; a sanitized build's own file, src/obs/peak.c): the bandwidth with all the cores, the
 * optimizer's own rate on one core and on all, fresh pages' 16-bit copies and the pool's lending on one. */
static dt_status measure_streams(dt_plan_hardware *h) {
    const char *bw = getenv("DTRAIN_MEMORY_BANDWIDTH");
    if (bw && atof(bw) > 0) {
        h->mem_bw = atof(bw);
        return DT_OK;
    }
    char k[64];
    int n = (int)h->devices_per_node;
    dt_status st = dt_peak_cached_rate(cores_key(k, "memory_gbs", n, ""), measure_bandwidth, n, &h->mem_bw);
    if (!st) h->mem_bw *= 1e9;
    if (!st && !(st = dt_peak_cached_rate("optimizer_gbs_one_core", measure_optimizer, 1, &h->optim_bw_one)) &&
        !(st = dt_peak_cached_rate(cores_key(k, "optimizer_gbs", n, ""), measure_optimizer, n, &h->optim_bw_all)))
        h->optim_bw_one *= 1e9, h->optim_bw_all *= 1e9;
    if (!st && !(st = dt_peak_cached_rate("lp_fresh_gbs_one_core", measure_lp_fresh, 1, &h->lp_fresh_bw))) h->lp_fresh_bw *= 1e9;
    if (!st && !(st = dt_peak_cached_rate("pool_lend_gbs_one_core", measure_pool_lend, 1, &h->pool_lend_bw))) h->pool_lend_bw *= 1e9;
    return st;
}

/* The codecs' rates on one core; a lone communicator is had only outside a job: inside one, the cache's figures or none. */
static dt_status measure_codecs(dt_plan_hardware *h) {
    dt_launch_kind launch;
    double (*codec)(int) = !dt_comm_detect_launch(&launch) && launch == DT_LAUNCH_NONE ? measure_codec : NULL;
    dt_status st;
    if (!(st = dt_peak_cached_rate("codec_powersgd_r4_gelements_one_core", codec, 0, &h->powersgd_rate)) &&
        !(st = dt_peak_cached_rate("codec_topk_gelements_one_core", codec, 1, &h->topk_rate)) &&
        !(st = dt_peak_cached_rate("codec_onebit_gelements_one_core", codec, 2, &h->onebit_rate)))
        h->powersgd_rate *= 1e9, h->topk_rate *= 1e9, h->onebit_rate *= 1e9;
    return st;
}

/* This machine: cores, memory available (a cgroup's limit included), the GEMM peaks, bandwidth and attention (measured once per
 * CPU, about a second, and cached with the peaks), links from the communication calibration. */
dt_status dt_plan_this_machine(dt_plan_hardware *h) {
    double sg, bf = 0, ia, ib, g, xa, xb;
    const char *src;
    int keep = dt_kernels_threads();
    dt_status st = dt_peak_per_thread(&sg, &src);
    if (st) return st;
    if (dt_gemm_bf16_ready()) (void)dt_peak_bf16_per_thread(&bf, &src);
    long cores = dt_cpu_cores(); /* a container's CPU quota included */
    memset(h, 0, sizeof *h);
    snprintf(h->name, sizeof h->name, "this");
    h->memory = (double)dt_plan_available_memory();
    h->devices_per_node = (int)(cores > 0 ? cores : 1);
    h->shared_memory = 1;
    h->cores_per_device = 1;
    h->flops_f32 = sg * 1e9;
    h->flops_lowp = bf > 0 ? bf * 1e9 : sg * 1e9; /* without a bf16 GEMM, 16-bit Linears convert and run sgemm */
    const char *att = getenv("DTRAIN_ATTENTION_GFLOPS"), *lin = getenv("DTRAIN_LINEAR_GFLOPS");
    st = measure_streams(h);
    if (!st) st = measure_codecs(h);
    if (!st) st = busy_slowdown(h, dt_cpu_allowed());
    if (!st && att && atof(att) > 0) h->attention_rate = atof(att) * 1e9, h->attention_fixed = 1; /* the same for attention's rate a core */
    else if (!st && !(st = dt_peak_cached_rate("attention_gflops_per_thread", measure_attention, 1, &h->attention_rate)))
        h->attention_rate *= 1e9;
    h->linear_rate = lin && atof(lin) > 0 ? atof(lin) * 1e9 : 0; /* instead of timing the job's Linears (step_time.c) */
    dt_kernels_set_threads(keep);
    if (st) return st;
    dt_comm_link_costs(&ia, &ib, &g, &xa, &xb);
    h->intra_alpha = ia, h->intra_beta = ib, h->inter_alpha = xa, h->inter_beta = xb, h->inter_slowdown = dt_comm_link_slowdown();
    h->gemm_efficiency = 1, h->attention_efficiency = 1;
    return DT_OK;
}
