/* What the GPU checks share (they run where a GPU is, by bench/gpu_check.sh; make test runs test_gpu_open only):
 * random host arrays, device copies of them, and a device array compared with a host one. Header-only. */
#ifndef DTRAIN_TESTS_GPU_CHECK_H
#define DTRAIN_TESTS_GPU_CHECK_H

#include "dtrain/gpu.h"
#include "fixture_checks.h"

#include <string.h>

static uint64_t gpu_check_rng = 0x9e3779b97f4a7c15ull;

/* n floats uniform in [-scale, scale], fresh for every call. */
static inline float *random_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        gpu_check_rng = gpu_check_rng * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = scale * (2.0f * (float)((gpu_check_rng >> 40) / 16777216.0) - 1.0f);
    }
    return x;
}

/* A device copy of host[0..bytes) (the process stops on failure: a check cannot go on without it). */
static inline void *to_device(dt_gpu *g, const void *host, size_t bytes) {
    void *d = NULL;
    if (dt_gpu_alloc(g, bytes, &d) || dt_gpu_upload(g, d, host, bytes)) {
        fprintf(stderr, "gpu check: %s\n", dt_last_error());
        exit(1);
    }
    return d;
}

/* The relative error of device array d against host reference ref (n floats), after the queued work; a failure of
 * that work is a failed check. */
static inline double device_err(dt_gpu *g, const float *d, const float *ref, size_t n) {
    float *h = malloc(n * sizeof *h);
    dt_status st = dt_gpu_sync(g);
    if (!st) st = dt_gpu_download(g, h, d, n * sizeof *h);
    double e = st ? INFINITY : rel_err(h, ref, n);
    if (st) fprintf(stderr, "gpu check: %s\n", dt_last_error());
    free(h);
    return e;
}

static inline void report_err(const char *what, double err, double tol) {
    char detail[96];
    snprintf(detail, sizeof detail, "relative error %.2e (at most %.0e)", err, tol);
    check(what, err <= tol, detail);
}

#endif
