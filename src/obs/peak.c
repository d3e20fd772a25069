/* The machine's matmul peak, the denominator of MFU: sgemm through the BLAS
 * dtrain uses (and for bf16 runs on a CPU with a bf16 GEMM, that GEMM's
 * rate), measured once per machine and kept in
 * ${XDG_CACHE_HOME:-~/.cache}/dtrain/peak.json with the CPU's model name,
 * the BLAS's kernel set and whether the bf16 GEMM runs (a cache from another
 * CPU, from OpenBLAS running other kernels, as $OPENBLAS_CORETYPE makes it, or
 * from a run with the bf16 GEMM on where this one has it off, is measured again). Per thread, since a run's peak
 * is the threads it uses times this (ranks x threads; the usual convention,
 * although two cores sharing memory give a little less than twice one). */
#include "dtrain/obs.h"
#include "dtrain/kernels.h"
#include "dtrain/io.h"
#include "io/json_file.h"

#include <cblas.h>
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

double dt_peak_measure(int threads) {
    dt_kernels_set_threads(threads);
    int n = 2048;
    float *a = dt_alloc_aligned((size_t)n * n * 4), *b = dt_alloc_aligned((size_t)n * n * 4), *c = dt_alloc_aligned((size_t)n * n * 4);
    if (!a || !b || !c) { dt_free_aligned(a); dt_free_aligned(b); dt_free_aligned(c); return 0; }
    for (size_t i = 0; i < (size_t)n * n; i++) { a[i] = 1e-3f * (float)(i % 7); b[i] = 1e-3f * (float)(i % 5); c[i] = 0; }
    double t[5];
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n); /* warm-up: pages, threads */
    for (int k = 0; k < 5; k++) {
        double t0 = dt_time_now();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1, a, n, b, n, 0, c, n);
        t[k] = 2.0 * n * n * (double)n / (dt_time_now() - t0) / 1e9;
    }
    dt_free_aligned(a);
    dt_free_aligned(b);
    dt_free_aligned(c);
    return dt_median(t, 5);
}

double dt_peak_measure_bf16(int threads) {
    if (!dt_gemm_bf16_ready()) return 0;
    dt_kernels_set_threads(threads);
    int n = 2048;
    uint16_t *a = dt_alloc_aligned((size_t)n * n * 2), *b = dt_alloc_aligned((size_t)n * n * 2);
    float *c = dt_alloc_aligned((size_t)n * n * 4);
    double t[5] = { 0 };
    if (a && b && c) {
        for (size_t i = 0; i < (size_t)n * n; i++) { a[i] = dt_f32_to_bf16(1e-3f * (float)(i % 7)); b[i] = dt_f32_to_bf16(1e-3f * (float)(i % 5)); }
        dt_gemm_bf16(0, 1, n, n, n, a, n, b, n, 0, c, n); /* warm-up, and the primitive made */
        for (int k = 0; k < 5; k++) {
            double t0 = dt_time_now();
            t[k] = dt_gemm_bf16(0, 1, n, n, n, a, n, b, n, 0, c, n) ? 2.0 * n * n * (double)n / (dt_time_now() - t0) / 1e9 : 0;
        }
    }
    dt_free_aligned(a);
    dt_free_aligned(b);
    dt_free_aligned(c);
    return dt_median(t, 5);
}

/* The release build's cache is peak.json; another build's (a sanitizer's, an unoptimised one) measures other rates and
 * leaves other memory resident, so it keeps its own (peak-address.json): a sanitized plan once left its sizes where the
 * release planner read them. */
#ifdef DT_CACHE_FLAVOR
#define CACHE_FILE "peak-" DT_CACHE_FLAVOR ".json"
#else
#define CACHE_FILE "peak.json"
#endif

static int cache_path(char *out, size_t cap, int make_dir) {
    char dir[4096];
    if (dt_cache_dir(NULL, dir, sizeof dir, make_dir != 0)) return -1;
    return snprintf(out, cap, "%s/" CACHE_FILE, dir) >= (int)cap ? -1 : 0;
}

#define SGEMM "sgemm_gflops_per_thread"
#define BF16 "bf16_gemm_gflops_per_thread"

/* The revision of the kernels whose rates the cache holds (attention's, the GEMMs' around them): raised when one of
 * them gets faster or slower, so that a cache measured before is measured again (2: attention's exponentials in vector
 * loops, whole attention through BLAS). */
#define KERNELS_REVISION 2

/* This machine's name in the cache: the CPU's model, the BLAS's kernel set and whether the bf16 GEMM runs (a run
 * with DTRAIN_BF16_GEMM=0, a Zen 3's paths on a newer CPU, measures other rates and leaves other memory resident:
 * under one name its plans failed the bf16 GEMM's rows by 4.8 MB), and the kernels' revision. */
typedef struct {
    char cpu[256], blas[128], kernels[64];
} machine;

static machine machine_here(void) {
    machine m;
    dt_cpu_model(m.cpu, sizeof m.cpu);
    dt_kernels_blas_name(m.blas, sizeof m.blas);
    snprintf(m.kernels, sizeof m.kernels, "%s, revision %d", dt_gemm_bf16_wanted() ? "bf16 GEMM" : "no bf16 GEMM", KERNELS_REVISION);
    return m;
}

static bool same(const cJSON *j, const char *key, const char *want) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    return cJSON_IsString(v) && !strcmp(v->valuestring, want);
}

/* A cache (parsed, or NULL) measured on this CPU with these kernel sets: its rates hold here. */
static bool ours(const cJSON *j, const machine *m) {
    return same(j, "cpu", m->cpu) && same(j, "blas", m->blas) && same(j, "kernels", m->kernels);
}

#define CACHE_MAX (1 << 20) /* bytes: the rates and the plan's timings at each shape it priced */

/* key's value in this machine's cache when it is there and in [0, 1e6). */
static bool lookup(const char *key, double *v) {
    char path[4200];
    if (cache_path(path, sizeof path, 0)) return false;
    char *buf;
    if (dt_file_read_text(path, CACHE_MAX, &buf, NULL)) return false; /* none yet */
    cJSON *j = cJSON_Parse(buf), *g = cJSON_GetObjectItemCaseSensitive(j, key);
    free(buf);
    machine m = machine_here();
    bool found = ours(j, &m) && cJSON_IsNumber(g) && g->valuedouble >= 0 && g->valuedouble < 1e6;
    if (found) *v = g->valuedouble;
    cJSON_Delete(j);
    return found;
}

static double cached(const char *key) {
    double v = 0;
    return lookup(key, &v) && v > 0 ? v : 0;
}

/* The plan's timings at each shape it priced ("plan_..." keys) kept, the most recently written first: without a bound
 * the cache grew with every shape ever planned (660 keys here after a month); the machine's own rates are always
 * kept. A shape pushed out is timed again when next planned. */
#define CACHE_PLAN_KEYS 1024

/* The cache with key set; the other rates kept where they are this CPU's (the plan's, the newest CACHE_PLAN_KEYS). */
static dt_status save(const char *key, double value) {
    char path[4200], *buf = NULL;
    if (cache_path(path, sizeof path, 1)) return dt_error(DT_ERR_IO, "peak cache: no HOME or XDG_CACHE_HOME to keep it in");
    cJSON *old = dt_file_read_text(path, CACHE_MAX, &buf, NULL) ? NULL : cJSON_Parse(buf), *j = cJSON_CreateObject(), *it;
    free(buf);
    machine m = machine_here();
    cJSON_AddStringToObject(j, "cpu", m.cpu);
    cJSON_AddStringToObject(j, "blas", m.blas);
    cJSON_AddStringToObject(j, "kernels", m.kernels);
    cJSON_AddNumberToObject(j, key, value);
    int plan = !strncmp(key, "plan_", 5);
    if (ours(old, &m))
        cJSON_ArrayForEach(it, old) {
            if (!cJSON_IsNumber(it) || !strcmp(it->string, key)) continue;
            bool is_plan = !strncmp(it->string, "plan_", 5);
            if (is_plan && plan >= CACHE_PLAN_KEYS) continue;
            plan += is_plan;
            cJSON_AddNumberToObject(j, it->string, it->valuedouble);
        }
    cJSON_Delete(old);
    return dt_json_write_file(j, 0, path);
}

dt_status dt_peak_save(double gflops) {
    dt_status st = save(SGEMM, gflops);
    return st ? st : save(SGEMM "_disturbed", 0); /* measured by hand: no longer marked */
}

bool dt_peak_lookup(const char *key, double *value) { return lookup(key, value); }

dt_status dt_peak_save_rate(const char *key, double value) { return save(key, value); }

/* measure(arg), taken when nothing else used the machine meanwhile (three tries); *quiet says whether one was. A
 * rate measured beside a busy loop (half a core's sgemm, cached, read MFU 176% ever after) must not be kept. */
static double measured_quietly(double (*measure)(int), int arg, bool *quiet) {
    double best = 0;
    *quiet = false;
    for (int i = 0; i < 3 && !*quiet; i++) {
        double busy0 = dt_machine_busy(), cpu0 = dt_time_cpu_all(), t0 = dt_time_now();
        double v = measure(arg);
        *quiet = !dt_others_busy(busy0, cpu0, dt_time_now() - t0);
        if (v > best || *quiet) best = *quiet ? v : best > v ? best : v;
    }
    return best;
}

/* The cache's rate under key, else measure(1) now, cached. One measured while other work used the machine is cached
 * all the same (measuring again at every run of a busy machine cost each run seconds: a test of many short runs ran past
 * its time), marked so: MFU then says its peak was measured on a busy machine, until dtrain bench gemm measures it again. */
static dt_status cached_or_measured(const char *key, double (*measure)(int), double *gflops, const char **source) {
    char mark[96];
    snprintf(mark, sizeof mark, "%s_disturbed", key);
    double disturbed = 0;
    if ((*gflops = cached(key)) > 0) {
        *source = dt_peak_lookup(mark, &disturbed) && disturbed > 0
                      ? "cached, measured while the machine was busy: dtrain bench gemm measures it again"
                      : "cached (~/.cache/dtrain/peak.json)";
        return DT_OK;
    }
    int threads = dt_kernels_threads();
    bool quiet;
    *gflops = measured_quietly(measure, 1, &quiet);
    dt_kernels_set_threads(threads);
    bool bf16 = !strcmp(key, BF16);
    *source = bf16 ? "measured now (bf16 GEMM, 1 thread)" : "measured now (sgemm, 1 thread)";
    if (*gflops <= 0)
        return bf16 ? dt_error(DT_ERR_UNSUPPORTED, "peak: no bf16 GEMM on this machine, or out of memory for its measurement")
                    : dt_error(DT_ERR_NOMEM, "peak: out of memory for the sgemm measurement");
    if (!quiet) {
        dt_log(DT_LOG_WARN, "peak: other work used this machine during the measurement (three tries): %.1f GFLOP/s, kept and "
               "marked (dtrain bench gemm measures it again)", *gflops);
        *source = bf16 ? "measured now, disturbed (bf16 GEMM, 1 thread)" : "measured now, disturbed (sgemm, 1 thread)";
    }
    if (save(key, *gflops) || save(mark, quiet ? 0 : 1)) dt_log(DT_LOG_WARN, "peak: not cached (%s)", dt_last_error());
    return DT_OK;
}

dt_status dt_peak_per_thread(double *gflops, const char **source) {
    const char *env = getenv("DTRAIN_PEAK_GFLOPS");
    if (env && *env) {
        char *end;
        double v = strtod(env, &end);
        if (*end || !(v > 0 && v < 1e6)) return dt_error(DT_ERR_ARG, "DTRAIN_PEAK_GFLOPS=%s: expected GFLOP/s per thread (> 0)", env);
        *gflops = v;
        *source = "DTRAIN_PEAK_GFLOPS";
        return DT_OK;
    }
    return cached_or_measured(SGEMM, dt_peak_measure, gflops, source);
}

dt_status dt_peak_bf16_per_thread(double *gflops, const char **source) { return cached_or_measured(BF16, dt_peak_measure_bf16, gflops, source); }

dt_status dt_peak_cached_rate(const char *key, double (*measure)(int), int arg, double *value) {
    if ((*value = cached(key)) > 0 || !measure) return DT_OK;
    bool quiet;
    if ((*value = measured_quietly(measure, arg, &quiet)) <= 0) return dt_error(DT_ERR_NOMEM, "%s: the measurement failed (out of memory?)", key);
    /* kept all the same (a plan would otherwise measure it at every run): said, so that a figure from a busy hour
     * is known to be one */
    if (!quiet) dt_log(DT_LOG_WARN, "%s: other work used this machine during the measurement (three tries): %g cached all the "
                       "same (remove ~/.cache/dtrain/peak.json to measure again)", key, *value);
    if (save(key, *value)) dt_log(DT_LOG_WARN, "%s: not cached (%s)", key, dt_last_error());
    return DT_OK;
}
