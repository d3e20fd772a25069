/* Inference attention's weighted sum of values, y[j] = sum over t of
 * w[t] * v[t][j], each y[j] one chain of fused multiply-adds in t order from
 * zero: lanes run along j, so the vector paths give the portable loop's bits
 * whatever the width. The accumulators stay in registers across t (the
 * compiler's own loop kept y in memory, a store and a reload a position,
 * which at 512 positions was a fifth of a decoding step). */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static void wsum_portable(float *y, const float *w, const float *v, int n, int d, int j) {
    for (; j < d; j++) {
        float a = 0;
        for (int t = 0; t < n; t++) a = fmaf(w[t], v[(size_t)t * d + j], a);
        y[j] = a;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CHUNK(V, SET1, LOAD, FMA, STORE, ZERO, L, NV)                                                                  \
    for (; j + (L) * (NV) <= d; j += (L) * (NV)) {                                                                     \
        V acc[NV];                                                                                                     \
        for (int i = 0; i < (NV); i++) acc[i] = ZERO();                                                                \
        for (int t = 0; t < n; t++) {                                                                                  \
            V wt = SET1(w[t]);                                                                                         \
            const float *vt = v + (size_t)t * d + j;                                                                   \
            for (int i = 0; i < (NV); i++) acc[i] = FMA(wt, LOAD(vt + (L) * i), acc[i]);                               \
        }                                                                                                              \
        for (int i = 0; i < (NV); i++) STORE(y + j + (L) * i, acc[i]);                                                 \
    }
__attribute__((target("avx512f"))) static int wsum_avx512(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
    CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps, _mm512_setzero_ps, 16, 4)
    CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps, _mm512_setzero_ps, 16, 1)
    return j;
}
__attribute__((target("avx2,fma"))) static int wsum_avx2(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
    CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_storeu_ps, _mm256_setzero_ps, 8, 8)
    CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_storeu_ps, _mm256_setzero_ps, 8, 1)
    return j;
}
#endif

/* 2 AVX-512, 1 AVX2, 0 portable: the widest this CPU has, or narrower by $DTRAIN_ROWDOT as the Linear's, so a
 * test of one path runs both. */
static int level(void) {
    static int known = -1;
    if (known < 0) {
        const char *e = getenv("DTRAIN_ROWDOT");
        int cap = e && !strcmp(e, "portable") ? 0 : e && !strcmp(e, "avx2") ? 1 : 2, has = 0;
#if defined(__x86_64__) && defined(__GNUC__)
        has = !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 0 : __builtin_cpu_supports("avx512f") ? 2 : 1;
#endif
        known = has < cap ? has : cap;
    }
    return known;
}

void dt_weighted_sum(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (level() == 2) j = wsum_avx512(y, w, v, n, d);
    else if (level() == 1) j = wsum_avx2(y, w, v, n, d);
#endif
    wsum_portable(y, w, v, n, d, j);
}
