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
 *   positions).
 * Each also reads keys and values kept in bf16 (int8 decoding's cache, half the
 * bytes): every element widened to f32 exactly, then the f32 path's arithmetic,
 * so the bits are those of dt_attend_scores and dt_weighted_sum on the rounded
 * values. */
#include "simd.h"

#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdint.h>

/* Element i of f32 (bf16 false) or bf16 storage, as f32: called with a constant, each caller is one loop. */
static inline float elem(const void *p, size_t i, bool bf16) {
    return bf16 ? dt_bf16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

/* Key t's element k in the blocked layout. */
static inline float key_at(const void *kb, bool bf16, int d, int t, int k) {
    return elem(kb, (size_t)(t / DT_KEY_BLOCK) * d * DT_KEY_BLOCK + (size_t)k * DT_KEY_BLOCK + t % DT_KEY_BLOCK, bf16);
}

static inline void scores_portable(float *s, const float *q, const void *kb, bool bf16, int d, int t, int n) {
    for (; t < n; t++) {
        float a[8] = { 0 };
        int k = 0;
        for (; k + 8 <= d; k += 8)
            for (int j = 0; j < 8; j++) a[j] = fmaf(q[k + j], key_at(kb, bf16, d, t, k + j), a[j]);
        float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7], r = (b0 + b2) + (b1 + b3);
        for (; k < d; k++) r = fmaf(q[k], key_at(kb, bf16, d, t, k), r);
        s[t] = r;
    }
}

static inline void wsum_portable(float *y, const float *w, const void *v, bool bf16, int n, int d, int j) {
    for (; j < d; j++) {
        float a = y[j];
        for (int t = 0; t < n; t++) a = fmaf(w[t], elem(v, (size_t)t * d + j, bf16), a);
        y[j] = a;
    }
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define CHUNK(V, SET1, LOAD, LOADV, FMA, STORE, L, NV)                                                                 \
    for (; j + (L) * (NV) <= d; j += (L) * (NV)) {                                                                     \
        V acc[NV];                                                                                                     \
        for (int i = 0; i < (NV); i++) acc[i] = LOAD(y + j + (L) * i);                                                 \
        for (int t = 0; t < n; t++) {                                                                                  \
            V wt = SET1(w[t]);                                                                                         \
            const __typeof__(*v) *vt = v + (size_t)t * d + j;                                                          \
            for (int i = 0; i < (NV); i++) acc[i] = FMA(wt, LOADV(vt + (L) * i), acc[i]);                              \
        }                                                                                                              \
        for (int i = 0; i < (NV); i++) STORE(y + j + (L) * i, acc[i]);                                                 \
    }
/* Whole blocks of 16 positions: lane i of acc[j] is key t0 + i's lane j; the tree and the tail as the spec's. */
#define SCORES(V, SET1, LOAD, FMA, ADD, STORE, ZERO, L)                                                                \
    for (; t + DT_KEY_BLOCK <= n; t += DT_KEY_BLOCK)                                                                   \
        for (int h = 0; h < DT_KEY_BLOCK; h += (L)) {                                                                  \
            const __typeof__(*kb) *blk = kb + (size_t)(t / DT_KEY_BLOCK) * d * DT_KEY_BLOCK + h;                       \
            V acc[8];                                                                                                  \
            for (int j = 0; j < 8; j++) acc[j] = ZERO();                                                               \
            int k = 0;                                                                                                 \
            for (; k + 8 <= d; k += 8)                                                                                 \
                for (int j = 0; j < 8; j++) acc[j] = FMA(SET1(q[k + j]), LOAD(blk + (size_t)(k + j) * DT_KEY_BLOCK), acc[j]); \
            V r = ADD(ADD(ADD(acc[0], acc[4]), ADD(acc[2], acc[6])), ADD(ADD(acc[1], acc[5]), ADD(acc[3], acc[7])));   \
            for (; k < d; k++) r = FMA(SET1(q[k]), LOAD(blk + (size_t)k * DT_KEY_BLOCK), r);                           \
            STORE(s + t + h, r);                                                                                       \
        }
/* bf16 elements widened to f32 (exact: the bits moved up a half) */
#define AVX512 __attribute__((target("avx512f")))
#define AVX2 __attribute__((target("avx2,fma")))
AVX512 static inline __m512 widen16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const __m256i *)p)), 16));
}
AVX2 static inline __m256 widen8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16));
}
/* Each kernel for f32 (NAME) and bf16 (NAME_bf16) storage: T the element, LOAD512 / LOAD256 its loads. */
#define KERNELS(SUFFIX, T, LOAD512, LOAD256)                                                                           \
    AVX512 static int scores_avx512##SUFFIX(float *s, const float *q, const T *kb, int d, int n) {                     \
        int t = 0;                                                                                                     \
        SCORES(__m512, _mm512_set1_ps, LOAD512, _mm512_fmadd_ps, _mm512_add_ps, _mm512_storeu_ps, _mm512_setzero_ps, 16) \
        return t;                                                                                                      \
    }                                                                                                                  \
    AVX2 static int scores_avx2##SUFFIX(float *s, const float *q, const T *kb, int d, int n) {                         \
        int t = 0;                                                                                                     \
        SCORES(__m256, _mm256_set1_ps, LOAD256, _mm256_fmadd_ps, _mm256_add_ps, _mm256_storeu_ps, _mm256_setzero_ps, 8) \
        return t;                                                                                                      \
    }                                                                                                                  \
    AVX512 static int wsum_avx512##SUFFIX(float *y, const float *w, const T *v, int n, int d) {                        \
        int j = 0;                                                                                                     \
        CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, LOAD512, _mm512_fmadd_ps, _mm512_storeu_ps, 16, 4)              \
        CHUNK(__m512, _mm512_set1_ps, _mm512_loadu_ps, LOAD512, _mm512_fmadd_ps, _mm512_storeu_ps, 16, 1)              \
        return j;                                                                                                      \
    }                                                                                                                  \
    AVX2 static int wsum_avx2##SUFFIX(float *y, const float *w, const T *v, int n, int d) {                            \
        int j = 0;                                                                                                     \
        CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, LOAD256, _mm256_fmadd_ps, _mm256_storeu_ps, 8, 8)               \
        CHUNK(__m256, _mm256_set1_ps, _mm256_loadu_ps, LOAD256, _mm256_fmadd_ps, _mm256_storeu_ps, 8, 1)               \
        return j;                                                                                                      \
    }
KERNELS(, float, _mm512_loadu_ps, _mm256_loadu_ps)
KERNELS(_bf16, uint16_t, widen16, widen8)
#endif

/* The public kernels: the widest path's whole blocks or chunks, then the portable loop for the rest. */
#if defined(__x86_64__) && defined(__GNUC__)
#define WIDEST(done, F, SUFFIX, ...)                                                                                   \
    if (dt_kernels_simd() == DT_SIMD_AVX512) done = F##_avx512##SUFFIX(__VA_ARGS__);                                   \
    else if (dt_kernels_simd() == DT_SIMD_AVX2) done = F##_avx2##SUFFIX(__VA_ARGS__)
#else
#define WIDEST(done, F, SUFFIX, ...) (void)0
#endif

void dt_attend_scores(float *s, const float *q, const float *kb, int d, int n) {
    int t = 0;
    WIDEST(t, scores, , s, q, kb, d, n);
    scores_portable(s, q, kb, false, d, t, n);
}

void dt_attend_scores_bf16(float *s, const float *q, const uint16_t *kb, int d, int n) {
    int t = 0;
    WIDEST(t, scores, _bf16, s, q, kb, d, n);
    scores_portable(s, q, kb, true, d, t, n);
}

void dt_weighted_sum(float *y, const float *w, const float *v, int n, int d) {
    int j = 0;
    WIDEST(j, wsum, , y, w, v, n, d);
    wsum_portable(y, w, v, false, n, d, j);
}

void dt_weighted_sum_bf16(float *y, const float *w, const uint16_t *v, int n, int d) {
    int j = 0;
    WIDEST(j, wsum, _bf16, y, w, v, n, d);
    wsum_portable(y, w, v, true, n, d, j);
}
