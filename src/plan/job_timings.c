/* The planner's timings at a job's own shapes, on this machine, each kept for the process (a search prices many
 * layouts) and in the machine's cache (the next plan of the same shapes answers at once: 124M's first plan on the
 * 2-core VM took 40 s of them): a Linear as the model runs it, ranks sharing cores, ranks meeting at each
 * collective, the 16-bit head's loss. step_time.c prices a step with them; this_machine.c holds what is measured
 * once per CPU instead. */
#include "plan_internal.h"

#include "dtrain/base.h"
#include "dtrain/kernels.h"
#include "dtrain/obs.h"

#include <cblas.h>
#include <lapacke.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

/* A timing's value from the machine's cache under key (false: not measured here yet, which is then said on a terminal:
 * a plan of a large model can take a minute of timings, and a silent minute looks like a hang). */
typedef struct { double busy, cpu, t; } stamp; /* when a timing began: the machine's busy time, ours, the clock */

/* The timings this process asked for (a hash of their keys, in order), whether any was measured here and whether any
 * was read; fresh: the cache is passed by (each timing measured here again). */
static uint64_t asked = DT_HASH_INIT;
static bool measured_here, read_here, fresh;

uint64_t dt_plan_timings_asked(bool *measured, bool *read) {
    *measured = measured_here;
    *read = read_here;
    return asked;
}

static bool kept(const char *key, const char *what, double *v, stamp *at) {
    if (!fresh)
        for (const char *c = key; *c; c++) asked = (asked ^ (unsigned char)*c) * 1099511628211ull;
    if (!fresh && dt_peak_lookup(key, v)) return read_here = true;
    measured_here = true;
    if (isatty(STDERR_FILENO)) fprintf(stderr, "plan: timing %s on this machine (once: kept for the next plan)\n", what);
    *at = (stamp){ dt_machine_busy(), dt_time_cpu_all(), dt_time_now() };
    return false;
}

/* Kept only when nothing else used the machine meanwhile: a timing from a busy minute would skew every later plan. */
static void keep(const char *key, double v, const stamp *at) {
    if (dt_others_busy(at->busy, at->cpu, dt_time_now() - at->t)) return;
    if (dt_peak_save_rate(key, v)) dt_log(DT_LOG_WARN, "plan: %s not kept (%s)", key, dt_last_error());
}

static int nseen, neseen, nsseen, nyseen, nhseen, naseen; /* the process's own copies of timings (below), by kind */

void dt_plan_timings_fresh(bool on) {
    fresh = on;
    if (on) nseen = neseen = nsseen = nyseen = nhseen = naseen = 0;
}

/* Measured Linear rates of (M, N, K, threads, precision) on this machine, kept for the process (a search prices many layouts). */
typedef struct { int m, n, k, threads; dt_dtype prec; double rate; } linear_seen;
static linear_seen seen[64];

/* A Linear's operands (lp: DT_BF16 or DT_F16, else f32) and what one forward and backward of it runs. */
typedef struct {
    int M, N, K;
    dt_dtype lp;
    size_t work_floats;
    float *A, *B, *C, *dA, *dB, *work;
    uint16_t *Bl;
} linear_bufs;

static void linear_free(linear_bufs *x) {
    dt_free_zeroed(x->A), dt_free_zeroed(x->B), dt_free_zeroed(x->C), dt_free_zeroed(x->dA), dt_free_zeroed(x->dB);
    dt_free_zeroed(x->Bl), dt_free_zeroed(x->work);
}

static int linear_alloc(linear_bufs *x, int M, int N, int K, dt_dtype lp, size_t work_floats) {
    int lowp = lp != DT_F32;
    size_t a = (size_t)M * K, b = (size_t)N * K, c = (size_t)M * N;
    *x = (linear_bufs){ M, N, K, lp, work_floats, dt_alloc_zeroed(a * 4), dt_alloc_zeroed(b * 4), dt_alloc_zeroed(c * 4),
                        dt_alloc_zeroed(a * 4), dt_alloc_zeroed(b * 4), lowp ? dt_alloc_zeroed(work_floats * 4) : NULL,
                        lowp ? dt_alloc_zeroed(b * 2) : NULL };
    if (!x->A || !x->B || !x->C || !x->dA || !x->dB || (lowp && (!x->Bl || !x->work))) {
        linear_free(x);
        return 0;
    }
    for (size_t i = 0; i < a; i++) x->A[i] = 1e-3f * (float)(i % 7);
    for (size_t i = 0; i < b; i++) x->B[i] = 1e-3f * (float)(i % 5);
    for (size_t i = 0; i < c; i++) x->C[i] = 1e-3f * (float)(i % 3);
    if (lowp) dt_lp_pack(x->Bl, x->B, b, lp);
    return 1;
}

/* Product k of a Linear's three (f32: forward, input gradient, weight gradient; 16 bits: forward, then both gradients in
 * the model's one backward call) */
static void linear_part(const linear_bufs *x, int k) {
    int M = x->M, N = x->N, K = x->K;
    if (x->lp != DT_F32 && k == 0) dt_matmul_forward_lp(x->C, x->A, x->Bl, NULL, M, K, N, x->lp, x->work, x->work_floats, 0);
    else if (x->lp != DT_F32) dt_matmul_backward_lp(x->dA, x->dB, NULL, x->C, x->A, x->Bl, M, K, N, x->lp, x->work, x->work_floats, 0);
    else if (k == 0) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, M, N, K, 1, x->A, K, x->B, K, 0, x->C, N);
    else if (k == 1) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, K, N, 1, x->C, N, x->B, K, 0, x->dA, K);
    else cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, N, K, M, 1, x->C, N, x->A, K, 0, x->dB, K);
}

static void linear_once(const linear_bufs *x) {
    for (int k = 0; k < (x->lp != DT_F32 ? 2 : 3); k++) linear_part(x, k);
}

/* Bytes that push a product's operands out of the caches: twice the last level a core sees (sysfs's, "32768K" on a Zen 3;
 * glibc's _SC_LEVEL3_CACHE_SIZE said 256 MiB there, the whole package's), 64 MiB where the system does not say, and at
 * most 64 MiB: an Intel Xeon guest here (AMX) reads "491520K", its host's whole L3, which a step's other Linears do not
 * sweep either (a sweep of 512 MiB and its pages, a product's each, made plan_checks.sh's search outlast its 10
 * minutes). */
static size_t evict_bytes(void) {
    static size_t bytes; /* read once a process */
    if (bytes) return bytes;
    size_t l3 = 0;
    FILE *f = fopen("/sys/devices/system/cpu/cpu0/cache/index3/size", "r");
    char unit = 0;
    unsigned long v = 0;
    if (f && fscanf(f, "%lu%c", &v, &unit) >= 1) l3 = (size_t)v << (unit == 'M' ? 20 : unit == 'K' ? 10 : 0);
    if (f) fclose(f);
    size_t b = l3 ? 2 * l3 : (size_t)64 << 20;
    return bytes = b < ((size_t)16 << 20) ? (size_t)16 << 20 : b > ((size_t)64 << 20) ? (size_t)64 << 20 : b;
}

/* Reads a line of every 64 bytes of buf (n bytes), so that what a product reads next comes from memory. */
static void evict(const unsigned char *buf, size_t n) {
    volatile unsigned char sink = 0;
    unsigned char acc = 0;
    for (size_t i = 0; i < n; i += 64) acc ^= buf[i];
    sink = acc;
    (void)sink;
}

/* FLOP/s of a Linear of M tokens, N outputs and K inputs on `threads` threads here, as the model runs it: in f32 its three
 * products (forward y = x W^T, backward dx = dy W and dW = dy^T x); in 16 bits (lp: DT_BF16 or DT_F16) the model's own
 * dt_matmul_forward_lp and dt_matmul_backward_lp with `work_floats` of scratch, which also narrow their inputs, round their
 * outputs and (fp16, or bf16 without a bf16 GEMM) widen the weights for sgemm. Each the median of three after a warm-up,
 * each product's operands first pushed out of the caches, as a step finds them: between a Linear's two uses the rest of
 * the model has passed through (on the Zen 3, a 256 x 384 x 384 Linear ran at 65.5 GFLOP/s on operands left warm by its
 * last run and 37.7 on cold ones, 256 x 1536 x 384 at 61.0 and 52.5, 1024 x 1536 x 384 alike either way; timed warm, d6's
 * steps at 64 positions were planned 12-23% short). The
 * backward's run too, since their shapes pack differently: OpenBLAS's weight-gradient product keeps a panel as large as min(M,
 * 256) x N floats resident (docs/planner.md), which the planner's process then holds as a rank's will. The operands are mapped
 * and unmapped whole (dt_alloc_zeroed): from the heap, their freed pages stayed in the process the plan counts as a rank's, 38
 * MB of d6's bf16 plan once each of a block's four shapes was timed (+5.5% over the run's peak; now +1.0%). */
double dt_plan_time_linear(int M, int N, int K, int threads, dt_dtype lp, size_t work_floats) {
    for (int i = 0; i < nseen; i++)
        if (seen[i].m == M && seen[i].n == N && seen[i].k == K && seen[i].threads == threads && seen[i].prec == lp) return seen[i].rate;
    char key[96], what[160];
    snprintf(key, sizeof key, "plan_linear_cold_%dx%dx%d_t%d_%s", M, N, K, threads, dt_precision_name(lp));
    snprintf(what, sizeof what, "a Linear of %d x %d x %d (%s, %d thread%s)", M, N, K, dt_precision_name(lp), threads, threads == 1 ? "" : "s");
    double gflops;
    stamp at;
    if (kept(key, what, &gflops, &at)) {
        if (nseen < 64) seen[nseen++] = (linear_seen){ M, N, K, threads, lp, gflops * 1e9 };
        return gflops * 1e9;
    }
    linear_bufs x;
    double t[3][3] = { { 0 } }, rate = 0;
    int threads_before = dt_kernels_threads();
    size_t nb = evict_bytes();
    unsigned char *flush = dt_alloc_zeroed(nb); /* mapped and unmapped whole: the plan's process holds none of it after */
    if (flush) memset(flush, 1, nb);            /* written, so that its pages are its own (untouched ones read the zero page) */
    if (flush && linear_alloc(&x, M, N, K, lp, work_floats)) {
        dt_kernels_set_threads(threads);
        for (int r = -1; r < 3; r++)
            for (int k = 0; k < (lp != DT_F32 ? 2 : 3); k++) {
                evict(flush, nb);
                double t0 = dt_time_now();
                linear_part(&x, k);
                if (r >= 0) t[k][r] = dt_time_now() - t0;
            }
        double sum = 0;
        for (int k = 0; k < 3; k++) sum += dt_median(t[k], 3);
        rate = 3 * 2.0 * M * (double)N * K / sum;
        linear_free(&x);
        keep(key, rate / 1e9, &at);
    }
    dt_free_zeroed(flush);
    dt_kernels_set_threads(threads_before);
    if (nseen < 64) seen[nseen++] = (linear_seen){ M, N, K, threads, lp, rate };
    return rate;
}

/* LAPACK's symmetric eigen-decomposition (ssyevd, vectors too: what K-FAC's and Shampoo's roots run) of an n x n
 * matrix here: seconds, the median of 3 (0 if it could not run). Beyond 2048 the time at 2048 scaled by n^3 (a plan of
 * a large model would time minutes). */
typedef struct { int n, threads; double secs; } eigen_seen; /* kept for the process: a search prices many layouts */
static eigen_seen eseen[64];

double dt_plan_time_eigen(int n, int threads) {
    if (n < 1) return 0;
    int m = n > 2048 ? 2048 : n;
    double scale = pow((double)n / m, 3);
    for (int i = 0; i < neseen; i++)
        if (eseen[i].n == m && eseen[i].threads == threads) return eseen[i].secs * scale;
    char key[96], what[160];
    snprintf(key, sizeof key, "plan_eigen_%d_t%d", m, threads);
    snprintf(what, sizeof what, "an eigen-decomposition of %d x %d (%d thread%s)", m, m, threads, threads == 1 ? "" : "s");
    double secs;
    stamp at;
    if (kept(key, what, &secs, &at)) {
        if (neseen < 64) eseen[neseen++] = (eigen_seen){ m, threads, secs };
        return secs * scale;
    }
    size_t mm = (size_t)m * m;
    float *a = malloc(mm * sizeof *a), *w = malloc((size_t)m * sizeof *w);
    double t[3] = { 0 };
    int threads_before = dt_kernels_threads(), ok = a && w;
    dt_kernels_set_threads(threads);
    for (int r = -1; r < 3 && ok; r++) {
        /* a well-conditioned symmetric matrix: the identity and a smooth symmetric pattern */
        for (int i = 0; i < m; i++)
            for (int j = 0; j < m; j++) a[(size_t)i * m + j] = (i == j) + 0.5f * cosf(0.37f * (float)(i + 1) * (float)(j + 1) / (float)m);
        double t0 = dt_time_now();
        ok = !LAPACKE_ssyevd(LAPACK_ROW_MAJOR, 'V', 'U', m, a, m, w);
        if (r >= 0) t[r] = dt_time_now() - t0;
    }
    dt_kernels_set_threads(threads_before);
    free(a), free(w);
    if (!ok) return 0;
    secs = dt_median(t, 3);
    keep(key, secs, &at);
    if (neseen < 64) eseen[neseen++] = (eigen_seen){ m, threads, secs };
    return secs * scale;
}

/* Causal attention as the model runs it (the blockwise kernel with its log-sum-exp, forward then backward) over
 * sequences of T positions and heads of d channels, on one thread: FLOP/s counted as the planner counts them (2 T^2 C
 * forward, the causal half of two T x T x C products, twice that backward), 0 if it could not run. Its rate moves with T
 * (each row's own work and the diagonal blocks weigh more in a short sequence: on the Zen 3, heads of 64 ran at 6.5
 * GFLOP/s at T 64, 8.5 at T 256, 8.2 at T 1024) and with the heads' width; the machine's one figure, kept from an
 * earlier day on the same VM, read 14.4 there (a Llama of 512 channels at T 256 planned 15.8% short with it). Four
 * heads, as many sequences as make 1024 positions; beyond T 1024 the rate at 1024 (timing longer ones would take
 * seconds a plan). */
typedef struct { int T, d; double rate; } attention_seen;
static attention_seen aseen[16];

double dt_plan_time_attention(int T, int d) {
    if (T < 1 || d < 1) return 0;
    T = T > 1024 ? 1024 : T;
    for (int i = 0; i < naseen; i++)
        if (aseen[i].T == T && aseen[i].d == d) return aseen[i].rate;
    char key[96], what[160];
    snprintf(key, sizeof key, "plan_attention_T%d_d%d_t1", T, d);
    snprintf(what, sizeof what, "causal attention over %d positions, heads of %d (1 thread)", T, d);
    double gflops = 0;
    stamp at;
    if (kept(key, what, &gflops, &at)) {
        if (naseen < 16) aseen[naseen++] = (attention_seen){ T, d, gflops * 1e9 };
        return gflops * 1e9;
    }
    int NH = 4, C = NH * d, B = 1024 / T > 1 ? 1024 / T : 1;
    size_t btc = (size_t)B * T * C;
    float *qkv = dt_alloc_zeroed(3 * btc * 4), *out = dt_alloc_zeroed(btc * 4), *lse = dt_alloc_zeroed((size_t)B * NH * T * 4),
          *dqkv = dt_alloc_zeroed(3 * btc * 4), *dout = dt_alloc_zeroed(btc * 4);
    double t[3] = { 0 }, rate = 0;
    int threads_before = dt_kernels_threads();
    if (qkv && out && lse && dqkv && dout) {
        dt_kernels_set_threads(1);
        for (size_t i = 0; i < 3 * btc; i++) qkv[i] = 0.01f * (float)(i % 17) - 0.08f;
        for (size_t i = 0; i < btc; i++) dout[i] = 0.001f * (float)(i % 13);
        for (int r = -1; r < 3; r++) {
            double t0 = dt_time_now();
            dt_attention_forward_lse(out, lse, qkv, B, T, C, NH);
            memset(dqkv, 0, 3 * btc * 4);
            dt_attention_backward_lse(dqkv, dout, out, qkv, lse, B, T, C, NH);
            if (r >= 0) t[r] = dt_time_now() - t0;
        }
        rate = 3 * 2.0 * T * (double)T * C * B / dt_median(t, 3);
        keep(key, rate / 1e9, &at);
    }
    dt_kernels_set_threads(threads_before);
    dt_free_zeroed(qkv), dt_free_zeroed(out), dt_free_zeroed(lse), dt_free_zeroed(dqkv), dt_free_zeroed(dout);
    if (naseen < 16) aseen[naseen++] = (attention_seen){ T, d, rate };
    return rate;
}

/* Where ranks meet: a barrier in shared memory that waits as dtrain's own collectives do (comm/wait.c: spinning, then
 * yielding the core; a futex barrier's wake-ups cost more than that), and each child's seconds waiting at it. */
typedef struct { _Atomic int arrived, generation; double waited[16], busy[16]; } meeting_place;

static void meet_at(meeting_place *p, int n) {
    int gen = atomic_load(&p->generation);
    if (atomic_fetch_add(&p->arrived, 1) == n - 1) {
        atomic_store(&p->arrived, 0);
        atomic_fetch_add(&p->generation, 1);
        return;
    }
    for (double t0 = dt_time_now(); atomic_load(&p->generation) == gen;)
        if (dt_time_now() - t0 > 50e-6) sched_yield();
}

/* Seconds until n forked children have each run the Linear k times (0: one failed, or ran past 60 s and was killed); with
 * `meet`, they meet at its barrier after every `every` times (as tensor parallelism's ranks at each allreduce), each
 * adding up how long it waited there and how long it worked before. */
static double time_children(const linear_bufs *x, int n, int k, meeting_place *meet, int every) {
    pid_t pid[n];
    int made = 0, ok = 1;
    double t0 = dt_time_now();
    for (; made < n; made++) {
        fflush(NULL);
        if ((pid[made] = fork()) < 0) break;
        if (pid[made] == 0) {
            if (meet) meet_at(meet, n); /* all started: forking them one by one is no wait of theirs */
            double b = dt_time_now();
            for (int i = 0; i < k; i++) {
                linear_once(x);
                if (!meet || (i + 1) % every) continue;
                double w = dt_time_now();
                meet_at(meet, n);
                meet->busy[made] += w - b, meet->waited[made] += (b = dt_time_now()) - w;
            }
            _exit(0);
        }
    }
    for (int i = 0; i < made; i++) {
        int ws = 0;
        pid_t r;
        while ((r = waitpid(pid[i], &ws, WNOHANG)) == 0 && dt_time_now() - t0 < 60) usleep(1000);
        if (r == 0) kill(pid[i], SIGKILL), waitpid(pid[i], &ws, 0); /* a child that hangs must not hang the plan */
        ok = ok && r > 0 && WIFEXITED(ws) && WEXITSTATUS(ws) == 0;
    }
    return ok && made == n ? dt_time_now() - t0 : 0;
}

/* Ranks sharing cores do more work than their share: each switch between two ranks on a core refills the caches the other
 * emptied. The job's largest block Linear (forward and backward, as the model runs it), run by as many one-thread children
 * as the job has threads on this machine's cores, against one child alone: their time over n / cores times its time. On the
 * 2-core Zen 5: 4 ranks of d6 (1024 x 1536 x 384) 3.5-4% in f32 and 5-6% in bf16 (an sgemm of 512 x 3072 x 768, 0-3%);
 * the 4-rank d6 rows there ran 5-10% over the plan's n / cores without it. Three pairs, the median, at least 1. */
typedef struct { int procs, cores; dt_dtype prec; double s; } shared_seen;
static shared_seen sseen[16];

double dt_plan_time_shared(int M, int N, int K, dt_dtype lp, size_t work_floats, int procs, int cores) {
    /* one measurement a process for a count of ranks and a precision: a search's first layout's shape serves the others
     * (each shape of a 4-rank search of 2 layers measured in turn made plan_checks 39 -> 227 s) */
    for (int i = 0; i < nsseen; i++)
        if (sseen[i].procs == procs && sseen[i].cores == cores && sseen[i].prec == lp) return sseen[i].s;
    char key[96], what[160];
    snprintf(key, sizeof key, "plan_shared_%dx%dx%d_%s_p%d_c%d", M, N, K, dt_precision_name(lp), procs, cores);
    snprintf(what, sizeof what, "%d ranks sharing %d cores", procs, cores);
    double s = 1;
    stamp at;
    if (kept(key, what, &s, &at)) {
        if (nsseen < 16) sseen[nsseen++] = (shared_seen){ procs, cores, lp, s };
        return s;
    }
    enum { PAIRS = 3 };
    linear_bufs x;
    double ratio[PAIRS];
    int threads_before = dt_kernels_threads(), done = 0;
    if (linear_alloc(&x, M, N, K, lp, work_floats)) {
        dt_kernels_set_threads(1);
        double t0 = dt_time_now();
        linear_once(&x);
        int k = (int)fmax(2, 0.25 / fmax(dt_time_now() - t0, 1e-4)); /* about a quarter of a second alone */
        for (; done < PAIRS; done++) {
            double alone = time_children(&x, 1, k, NULL, 1), shared = alone > 0 ? time_children(&x, procs, k, NULL, 1) : 0;
            if (shared <= 0) break;
            ratio[done] = shared / (alone * procs / cores);
        }
        linear_free(&x);
        if (done == PAIRS) s = fmax(1, dt_median(ratio, PAIRS)), keep(key, s, &at);
    }
    dt_kernels_set_threads(threads_before);
    if (nsseen < 16) sseen[nsseen++] = (shared_seen){ procs, cores, lp, s };
    return s;
}

/* Ranks that meet at every collective wait each time for the slowest of them: whatever slows one rank's share of the work
 * between two meetings (the VM, the other rank's use of the memory) holds up all. n one-thread children each run the job's
 * Linear (forward and backward) and meet after every `every` times: three runs of a third of a second (12 meetings at least),
 * the medians of the mean wait a child and meeting and of the waits over the work between meetings (0 and 0: not measured). */
static void measure_meetings(int M, int N, int K, dt_dtype lp, size_t work_floats, int n, double interval, double *wait, double *share) {
    enum { RUNS = 3 };
    linear_bufs x;
    double cost[RUNS], part[RUNS];
    int threads_before = dt_kernels_threads(), done = 0;
    meeting_place *meet = n <= 16 ? mmap(NULL, sizeof *meet, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0) : MAP_FAILED;
    if (meet != MAP_FAILED && linear_alloc(&x, M, N, K, lp, work_floats)) {
        dt_kernels_set_threads(1);
        double t0 = dt_time_now();
        linear_once(&x);
        double once = fmax(dt_time_now() - t0, 1e-5);
        int every = (int)fmax(1, ceil(interval / once)), meetings = (int)fmax(12, 0.33 / (every * once));
        for (; done < RUNS; done++) {
            memset(meet, 0, sizeof *meet); /* no child is left: each run waits for all of them */
            if (time_children(&x, n, meetings * every, meet, every) <= 0) break;
            double waited = 0, busy = 0;
            for (int r = 0; r < n; r++) waited += meet->waited[r], busy += meet->busy[r];
            cost[done] = waited / n / meetings, part[done] = busy > 0 ? waited / busy : 0;
        }
        linear_free(&x);
    }
    if (meet != MAP_FAILED) munmap(meet, sizeof *meet);
    dt_kernels_set_threads(threads_before);
    *wait = done == RUNS ? dt_median(cost, RUNS) : 0, *share = done == RUNS ? dt_median(part, RUNS) : 0;
}

/* A meeting's cost, by kind: the seconds each adds (meetings a Linear apart), or the waits over the work (20 ms or more of
 * it apart); measured once a process for a kind, rank count, shape and precision, or read from the machine's cache. */
enum { MEETING_WAIT, MEETING_SHARE };
typedef struct { int kind, n, m, o, k; dt_dtype prec; double v; } sync_seen;
static sync_seen yseen[16];

static double meeting_timing(int kind, int M, int N, int K, dt_dtype lp, size_t work_floats, int n) {
    for (int i = 0; i < nyseen; i++)
        if (yseen[i].kind == kind && yseen[i].n == n && yseen[i].m == M && yseen[i].o == N && yseen[i].k == K && yseen[i].prec == lp) return yseen[i].v;
    char key[96], what[160];
    bool share = kind == MEETING_SHARE;
    snprintf(key, sizeof key, "plan_%s_n%d_%dx%dx%d_%s", share ? "straggle" : "meeting", n, M, N, K, dt_precision_name(lp));
    snprintf(what, sizeof what, share ? "%d ranks meeting once a step" : "%d ranks meeting at each collective", n);
    double v = 0, other;
    stamp at;
    if (!kept(key, what, &v, &at)) {
        measure_meetings(M, N, K, lp, work_floats, n, share ? 0.02 : 0, share ? &other : &v, share ? &v : &other);
        if (v > 0) keep(key, v, &at);
    }
    if (nyseen < 16) yseen[nyseen++] = (sync_seen){ kind, n, M, N, K, lp, v };
    return v;
}

/* Tensor parallelism's ranks meet at each of its allreduces, about a quarter of a block's work apart: the job's MLP Linear
 * between meetings, and the mean wait a child and meeting is what a meeting adds to the step (of two ranks, the one first
 * there waits the difference, the other nothing: half of it on average, as the later one's extra over the mean). On the
 * 2-core Zen 5, 124M bf16 TP 2 traced 0.33 ms an allreduce on one rank and 0.19 on the other, where the plan's
 * alpha-beta-gamma said 0.12. */
double dt_plan_time_meeting(int M, int N, int K, dt_dtype lp, size_t work_floats, int n) { return meeting_timing(MEETING_WAIT, M, N, K, lp, work_floats, n); }

/* Data parallelism's ranks meet at a step's reductions, tens of milliseconds or more apart: the share of waiting over
 * working with at least 20 ms between meetings (closer, the barrier's own cost would weigh). On the 2-core Emerald Rapids
 * guest 4-8% at 0.02-0.3 s between meetings alike (cores whose speeds wander apart), where DDP 2's runs at T 32-64 were
 * 6-14% over a plan without it. */
double dt_plan_time_straggle(int M, int N, int K, dt_dtype lp, size_t work_floats, int n) { return meeting_timing(MEETING_SHARE, M, N, K, lp, work_floats, n); }

/* Seconds a token of the 16-bit head's work besides its three GEMMs, on `threads` threads at M tokens here: the head timed as the
 * model runs it (its logits narrowed a chunk at a time by dt_matmul_forward_lp16, the loss over them, its backward computing the
 * loss's gradient a block at a time and narrowing it for the GEMMs), less those GEMMs at rate `rhead`. It is exp-bound, not
 * bandwidth-bound: d6's bf16 head on a Zen 5 took 369 ms a step against 238 for its GEMMs, where 16 bytes a logit at the
 * memory's rate said 25. The median of three after a warm-up. */
typedef struct { int m, v, c, threads; dt_dtype dt; double s; } head_seen;
static head_seen hseen[16];

double dt_plan_time_head_lp(int M, int V, int C, size_t work_floats, int threads, dt_dtype dt, double rhead) {
    for (int i = 0; i < nhseen; i++)
        if (hseen[i].m == M && hseen[i].v == V && hseen[i].c == C && hseen[i].threads == threads && hseen[i].dt == dt)
            return hseen[i].s;
    char key[96], what[160];
    snprintf(key, sizeof key, "plan_head_%dx%dx%d_t%d_%s", M, V, C, threads, dt_precision_name(dt));
    snprintf(what, sizeof what, "the %s head's loss over %d tokens", dt_precision_name(dt), M);
    double cs;
    stamp at;
    if (kept(key, what, &cs, &at)) {
        if (nhseen < 16) hseen[nhseen++] = (head_seen){ M, V, C, threads, dt, cs };
        return cs;
    }
    size_t mc = (size_t)M * C, vc = (size_t)V * C, mv = (size_t)M * V;
    float *inp = dt_alloc_zeroed(mc * 4), *dinp = dt_alloc_zeroed(mc * 4), *dw = dt_alloc_zeroed(vc * 4), *w = dt_alloc_zeroed(vc * 4),
          *work = dt_alloc_zeroed(work_floats * 4), *losses = dt_alloc_zeroed((size_t)M * 4), *stats = dt_alloc_zeroed((size_t)M * 8);
    uint16_t *w16 = dt_alloc_zeroed(vc * 2), *logits = dt_alloc_zeroed(mv * 2);
    int32_t *targets = dt_alloc_zeroed((size_t)M * 4);
    double t[3] = { 0 }, s = 0;
    int threads_before = dt_kernels_threads();
    if (inp && dinp && dw && w && work && losses && stats && w16 && logits && targets) {
        dt_kernels_set_threads(threads);
        for (size_t i = 0; i < mc; i++) inp[i] = 1e-2f * (float)(i % 13) - 0.06f;
        for (size_t i = 0; i < vc; i++) w[i] = 1e-2f * (float)(i % 11) - 0.05f, dw[i] = 0;
        for (int i = 0; i < M; i++) targets[i] = (int32_t)((i * 7919) % V);
        dt_lp_pack(w16, w, vc, dt);
        for (int r = -1; r < 3; r++) {
            double t0 = dt_time_now();
            dt_matmul_forward_lp16(logits, inp, w16, M, C, V, dt, work, work_floats);
            dt_crossentropy_forward_lp(losses, stats, logits, targets, M, V, V, dt, work, work_floats);
            dt_ce_grad ce = { .stats = stats, .targets = targets, .V = V, .v0 = 0, .dscale = 1.0f / (float)M };
            dt_matmul_backward_lp16(dinp, dw, logits, &ce, inp, w16, M, C, V, dt, work, work_floats, 0);
            if (r >= 0) t[r] = dt_time_now() - t0;
        }
        s = fmax(0, dt_median(t, 3) - 3 * 2.0 * M * (double)V * C / rhead) / M;
        keep(key, s, &at);
    }
    dt_kernels_set_threads(threads_before);
    dt_free_zeroed(inp), dt_free_zeroed(dinp), dt_free_zeroed(dw), dt_free_zeroed(w), dt_free_zeroed(work);
    dt_free_zeroed(losses), dt_free_zeroed(stats), dt_free_zeroed(w16), dt_free_zeroed(logits), dt_free_zeroed(targets);
    if (nhseen < 16) hseen[nhseen++] = (head_seen){ M, V, C, threads, dt, s };
    return s;
}
