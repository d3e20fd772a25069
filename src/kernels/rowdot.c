/* Inference's Linear, batch-invariant by construction: every output element
 * is one dot product summed in one fixed order (eight lanes of fused
 * multiply-adds over k, the lanes added in a fixed tree, then the tail), so
 * a row's result is the same bits alone, in a batch of any size, at any
 * place in it, on any thread count. BLAS cannot promise that (its blocking
 * and kernels change with the matrix's shape), which is how servers come to
 * give a prompt different tokens when other requests share its batch.
 * The AVX2 path and the portable one do the same operations in the same
 * order (fmaf rounds as the instruction does), so they agree bit for bit. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_in_parallel() 0
#endif

#define OUT_CHUNK 24 /* outputs a thread takes at a time (a multiple of the blocks' 6) */
#define ROW_OUTPUTS_F32 6 /* outputs a one-row tile takes (see TILE_BODY) */
#define ROW_OUTPUTS_Q8 3
/* How far ahead a tile prefetches the weights. Decoding (1-4 rows): the rows 6 on, a one-row f32 tile's next
 * tile; an int8 tile of 3 outputs that prefetched only its next tile's rows (3 on) decoded batch 1 at 140-145
 * tokens/s on a Zen 5, 6 on at 156-166, further no faster. Prefill (5-6 rows, the same weights swept by many
 * row groups): the next tile's rows, as 6 on was 2-6% slower there. */
#define PREFETCH_AHEAD(R, NO) ((R) >= 5 ? (NO) : 6)
#define ROW_CHUNK 60 /* rows swept against one block of weights while they are in cache (a multiple of 6) */

/* The lanes' fixed tree: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static float tree8(const float *a) {
    float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    return (b0 + b2) + (b1 + b3);
}

static float dot_portable(const float *x, const float *w, int K) {
    float a[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], w[k + j], a[j]);
    float s = tree8(a);
    for (; k < K; k++) s = fmaf(x[k], w[k], s);
    return s;
}

static float dot_q8_portable(const float *x, const int8_t *w, int K) {
    float a[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], (float)w[k + j], a[j]);
    float s = tree8(a);
    for (; k < K; k++) s = fmaf(x[k], (float)w[k], s);
    return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2 __attribute__((target("avx2,fma")))

AVX2 static inline float hsum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* b_j = l_j + l_{j+4} */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* b0+b2, b1+b3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

AVX2 static inline __m256 load_w(const float *w) { return _mm256_loadu_ps(w); }
AVX2 static inline __m256 load_w8(const int8_t *w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
}

/* R rows x NO outputs over the whole of K, both constants in each copy so
 * that the R * NO accumulators, NO weight vectors and one input vector stay
 * in AVX2's sixteen registers: one row x NO1 outputs, 2-4 rows x 3
 * (12 + 3 + 1), or 5-6 rows x 2 (12 + 2 + 1), which converts fewer int8
 * weights per product. One f32 row takes 6 outputs (six chains of FMAs hide
 * their latency: three left batch 1 at ~84% of the memory's pace, six reach
 * it); one int8 row keeps 3, as 6 measured no faster from memory. The tails
 * go in the portable order, which is the same. res is [R][6]. */
#define TILE_BODY(R, NO, WT, LOAD)                                                                                     \
    __m256 acc[R][NO];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();                                                 \
    int k = 0;                                                                                                         \
    for (; k + 8 <= K; k += 8) {                                                                                       \
        __m256 wv[NO];                                                                                                 \
        if (!(k * sizeof(WT) & 63)) /* rows ahead, a cache line each at a time: short rows defeat the prefetcher */      \
            for (int o = 0; o < NO; o++) _mm_prefetch((const char *)(w + (size_t)(o + PREFETCH_AHEAD(R, NO)) * ldw + k), _MM_HINT_T0); \
        for (int o = 0; o < NO; o++) {                                                                                 \
            wv[o] = LOAD(w + (size_t)o * ldw + k);                                                                     \
            __asm__("" : "+x"(wv[o])); /* in a register: folded into R FMAs, an f32 weight is loaded R times */        \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + k);                                                      \
            __asm__("" : "+x"(xv)); /* in a register: else each FMA loads it again, and loads set the pace */            \
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) {                                                                                 \
            float s = hsum(acc[r][o]);                                                                                 \
            for (int j = k; j < K; j++) s = fmaf(x[(size_t)r * ldx + j], (float)w[(size_t)o * ldw + j], s);           \
            res[r * 6 + o] = s;                                                                                        \
        }
#define TILE_FN(NAME, R, NO, WT, LOAD)                                                                                 \
    AVX2 static void NAME##_##R(float *res, const float *x, size_t ldx, const WT *w, size_t ldw, int K) {            \
        TILE_BODY(R, NO, WT, LOAD)                                                                                     \
    }
#define TILE(NAME, WT, LOAD, NO1)                                                                                      \
    TILE_FN(NAME, 1, NO1, WT, LOAD) TILE_FN(NAME, 2, 3, WT, LOAD) TILE_FN(NAME, 3, 3, WT, LOAD)                        \
    TILE_FN(NAME, 4, 3, WT, LOAD) TILE_FN(NAME, 5, 2, WT, LOAD) TILE_FN(NAME, 6, 2, WT, LOAD)                          \
    static void NAME(float *res, const float *x, size_t ldx, const WT *w, size_t ldw, int R, int K) {                \
        switch (R) {                                                                                                   \
        case 6: NAME##_6(res, x, ldx, w, ldw, K); break;                                                               \
        case 5: NAME##_5(res, x, ldx, w, ldw, K); break;                                                               \
        case 4: NAME##_4(res, x, ldx, w, ldw, K); break;                                                               \
        case 3: NAME##_3(res, x, ldx, w, ldw, K); break;                                                               \
        case 2: NAME##_2(res, x, ldx, w, ldw, K); break;                                                               \
        default: NAME##_1(res, x, ldx, w, ldw, K);                                                                     \
        }                                                                                                              \
    }
TILE(tile_f32, float, load_w, ROW_OUTPUTS_F32)
TILE(tile_q8, int8_t, load_w8, ROW_OUTPUTS_Q8)

AVX2 static float dot_avx2(const float *x, const float *w, int K) {
    __m256 a = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a);
    float s = hsum(a);
    for (; k < K; k++) s = fmaf(x[k], w[k], s);
    return s;
}

static bool have_avx2(void) {
    static int known = -1;
    /* $DTRAIN_ROWDOT_PORTABLE=1: the portable path on any CPU (the tests run both and expect the same bits) */
    if (known < 0) {
        const char *e = getenv("DTRAIN_ROWDOT_PORTABLE");
        known = !(e && *e == '1') && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    }
    return known;
}
#else
#define HAVE_AVX2_PATH 0
#endif

float dt_dot_f32(const float *x, const float *w, int K) {
#if HAVE_AVX2_PATH
    if (have_avx2()) return dot_avx2(x, w, K);
#endif
    return dot_portable(x, w, K);
}

/* Rows [r, r + nr) x outputs [o, o + no), no <= 6: tiles where they fit (one row: 6 outputs a tile in f32, 3 in int8; 2-4: 3; 5 or 6: 2),
 * single dots elsewhere; the same sums either way. */
static void block(float *out, const float *x, const float *wf, const int8_t *wq, const float *scale, const float *bias, int K, int O,
                  int r, int nr, int o, int no) {
    float res[36];
    const float *xr = x + (size_t)r * K;
    int tw = nr == 1 ? (wq ? ROW_OUTPUTS_Q8 : ROW_OUTPUTS_F32) : nr <= 4 ? 3 : 2; /* outputs a tile */
    for (int t = 0; t < no; t += tw) {
        int m = no - t < tw ? no - t : tw;
#if HAVE_AVX2_PATH
        if (m == tw && have_avx2()) {
            if (wq) tile_q8(res, xr, (size_t)K, wq + (size_t)(o + t) * K, (size_t)K, nr, K);
            else tile_f32(res, xr, (size_t)K, wf + (size_t)(o + t) * K, (size_t)K, nr, K);
        } else
#endif
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < m; j++)
                res[i * 6 + j] = wq ? dot_q8_portable(xr + (size_t)i * K, wq + (size_t)(o + t + j) * K, K)
                                    : dot_portable(xr + (size_t)i * K, wf + (size_t)(o + t + j) * K, K);
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < m; j++) {
                float s = res[i * 6 + j], b = bias ? bias[o + t + j] : 0.0f;
                out[(size_t)(r + i) * O + o + t + j] = scale ? fmaf(s, scale[o + t + j], b) : s + b;
            }
    }
}

/* Outputs [o0, o1) of rows [0, n): blocks of 6 outputs by up to 6 rows, swept while a chunk of rows is in cache. */
static void rows_range(float *out, const float *x, const void *wv, const float *scale, const float *bias, int n, int K, int O,
                       int o0, int o1) {
    const float *wf = scale ? NULL : wv;
    const int8_t *wq = scale ? wv : NULL;
    for (int r0 = 0; r0 < n; r0 += ROW_CHUNK) {
        int r1 = r0 + ROW_CHUNK < n ? r0 + ROW_CHUNK : n;
        /* rows in groups of at most 6, as even as they go (8: 4 + 4, not 6 + 2: a small group converts as many
         * int8 weights as a large one for fewer products) */
        int g = (r1 - r0 + 5) / 6, base = (r1 - r0) / g, extra = (r1 - r0) % g;
        for (int o = o0; o < o1; o += 6)
            for (int i = 0, r = r0; i < g; r += base + (i < extra), i++)
                block(out, x, wf, wq, scale, bias, K, O, r, base + (i < extra), o, o1 - o < 6 ? o1 - o : 6);
    }
}

static void rowdot(float *out, const float *x, const void *w, const float *scale, const float *bias, int n, int K, int O) {
    int chunks = (O + OUT_CHUNK - 1) / OUT_CHUNK;
    /* threads only where there is work for them and none are at work already (the results do not depend on it) */
    if ((double)n * K * O < 65536 || omp_in_parallel()) {
        rows_range(out, x, w, scale, bias, n, K, O, 0, O);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int c = 0; c < chunks; c++) {
        int o0 = c * OUT_CHUNK, o1 = o0 + OUT_CHUNK < O ? o0 + OUT_CHUNK : O;
        rows_range(out, x, w, scale, bias, n, K, O, o0, o1);
    }
}

void dt_rowdot_f32(float *out, const float *x, const float *w, const float *bias, int n, int K, int O) {
    rowdot(out, x, w, NULL, bias, n, K, O);
}

void dt_rowdot_q8(float *out, const float *x, const int8_t *w, const float *scale, const float *bias, int n, int K, int O) {
    rowdot(out, x, w, scale, bias, n, K, O);
}

void dt_quantize_rows_q8(int8_t *q, float *scale, const float *w, int O, int K) {
    #pragma omp parallel for schedule(static)
    for (int o = 0; o < O; o++) {
        const float *row = w + (size_t)o * K;
        float amax = 0;
        for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(row[k]));
        float s = amax > 0 ? amax / 127.0f : 1.0f, inv = 1.0f / s;
        for (int k = 0; k < K; k++) q[(size_t)o * K + k] = (int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, row[k] * inv)));
        scale[o] = s;
    }
}
