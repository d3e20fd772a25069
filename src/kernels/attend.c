/* Inference attention's two sums over a sequence's cached positions, each in
 * one fixed order whatever the path or width:
 * - the scores, q against every key, each the Linear's dot product (rowdot.c's
 *   spec: eight lanes over k, their fixed tree, the tail), read from keys laid
 *   out in blocks of DT_KEY_BLOCK positions, [block][k][position]: lanes run
 *   along positions, so one load serves 16 keys (against 2-8 keys' worth of
 *   loads, inserts and sums when each key's row was read alone);
 * - the weighted sum of values, y[j] += sum over t of w[t] v[t][j], each y[j]
 *   one chain of fused multiply-adds in t order from y[j] (so a sum taken in
 *   pieces, y zeroed first, has the bits of one taken whole), lanes along j, the
 *   accumulators in registers across t (the compiler's loop kept y in memory,
 *   a store and a reload a position: a fifth of a decoding step at 512
 *   positions). */
#include "simd.h"

#include "dtrain/kernels.h"

#include <math.h>

/* Key t's element k in the blocked layout. */
static float key_at(const float *kb, int d, int t, int k) {
    return kb[(size_t)(t / DT_KEY_BLOCK) * d * DT_KEY_BLOCK + (size_t)k * DT_KEY_BLOCK + t % DT_KEY_BLOCK];
}

static void scores_portable(float *s, const float *q, const float *kb, int d, int t, int n) {
    for (; t < n; t++) {
        float a[8] = { 0 };
        int k = 0;
        for (; k + 8 <= d; k += 8)
            for (int j = 0; j < 8; j++) a[j] = fmaf(q[k + j], key_at(kb, d, t, k + j), a[j]);
        float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7], r = (b0 + b2) + (b1 + b3);
        for (; k < d; k++) r = fmaf(q[k], key_at(kb, d, t, k), r);
        s[t] = r;
    }
}

static void wsum_portable(float *y, const float *w, const float *v, int n, int d, int j) {
    for (; j < d; j++) {
        float a = y[j];
        for (int t = 0; t < n; t++) a = fmaf(w[t], v[(size_t)t * d + j], a);
        y[j] = a;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CHUNK(V, SET1, LOAD, FMA, STORE, L, NV)                                                                        \
    for (; j + (L) * (NV) <= d; j += (L) * (NV)) {                                                                     \
        V acc[NV];                                                                                                     \
        for (int i = 0; i < (NV); i++) acc[i] = LOAD(y + j + (L) * i);                                                 \
        for (int t = 0; t < n; t++) {                                                                                  \
            V wt = SET1(w[t]);                                                                                         \
            const float *vt = v + (size_t)t * d + j;                                                                   \
            for (int i = 0; i < (NV); i++) acc[i] = FMA(wt, LOAD(vt + (L) * i), acc[i]);                               \
        }                                                                                                              \
        for (int i = 0; i < (NV); i++) STORE(y + j + (L) * i, acc[i]);                                                 \
    }
/* Whole blocks of 16 positions: lane i of acc[j] is key t0 + i's lane j; the tree and the tail as the spec's. */
#define SCORES(V, SET1, LOAD, FMA, ADD, STORE, ZERO, L)                                                                \
    for (; t + DT_KEY_BLOCK <= n; t += DT_KEY_BLOCK)                                                                   \
        for (int h = 0; h < DT_KEY_BLOCK; h += (L)) {                                                                  \
            const float *blk = kb + (size_t)(t / DT_KEY_BLOCK) * d * DT_KEY_BLOCK + h;                                 \
            V acc[8];                                                                                                  \
            for (int j = 0; j < 8; j++) acc[j] = ZERO();                                                               \
            int k = 0;                                                                                                 \
            for (; k + 8 <= d; k += 8)                                                                                 \
                for (int j = 0; j < 8; j++) acc[j] = FMA(SET1(q[k + j]), LOAD(blk + (size_t)(k + j) * DT_KEY_BLOCK), acc[j]); \
            V r = ADD(ADD(ADD(acc[0], acc[4]), ADD(acc[2], acc[6])), ADD(ADD(acc[1], acc[5]), ADD(acc[3], acc[7])));   \
            for (; k < d; k++) r = FMA(SET1(q[k]), LOAD(blk + (size_t)k * DT_KEY_BLOCK), r);                           \
            STORE(s + t + h, r);                                                                                       \
        }
__attribute__((target("avx512f"))) static int scores_avx512(float *s, const float *q, const float *kb, int d, int n) {
    int t = 0;
    SCORES(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, _mm512_setzero_ps, 16)
    return t;
}
__attribute__((target("avx2,fma"))) static int scores_avx2(float *s, const float *q, const float *kb, int d, int n) {
    int t = 0;
    SCORES(__m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, _mm256_setzero_ps, 8)
    return t;
}
__attribute__((target("avx512f"))) static int wsum_avx512(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
    CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps, 16, 4)
    CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, _mm512_fmadd_ps, _mm512_storeu_ps, 16, 1)
    return j;
}
__attribute__((target("avx2,fma"))) static int wsum_avx2(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
    CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_storeu_ps, 8, 8)
    CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, _mm256_fmadd_ps, _mm256_storeu_ps, 8, 1)
    return j;
}
#endif

void dt_attend_scores(float *s, const float *q, const float *kb, int d, int n) {
    int t = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt_kernels_simd() == DT_SIMD_AVX512) t = scores_avx512(s, q, kb, d, n);
    else if (dt_kernels_simd() == DT_SIMD_AVX2) t = scores_avx2(s, q, kb, d, n);
#endif
    scores_portable(s, q, kb, d, t, n);
}

void dt_weighted_sum(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt_kernels_simd() == DT_SIMD_AVX512) j = wsum_avx512(y, w, v, n, d);
    else if (dt_kernels_simd() == DT_SIMD_AVX2) j = wsum_avx2(y, w, v, n, d);
#endif
    wsum_portable(y, w, v, n, d, j);
}
