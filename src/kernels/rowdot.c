/* Inference's Linear, batch-invariant by construction: every output element
 * is one dot product summed in one fixed order (eight lanes of fused
 * multiply-adds over k, the lanes added in a fixed tree, then the tail), so
 * a row's result is the same bits alone, in a batch of any size, at any
 * place in it, on any thread count. BLAS cannot promise that (its blocking
 * and kernels change with the matrix's shape), which is how servers come to
 * give a prompt different tokens when other requests share its batch.
 * The AVX-512 path, the AVX2 one and the portable one do the same
 * operations in the same order (fmaf rounds as the instruction does), so
 * they agree bit for bit. */
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#else
#define omp_in_parallel() 0
#endif

#define OUT_CHUNK 24 /* outputs a thread takes at a time (a multiple of the blocks' 6 and 8) */
#define ROW_OUTPUTS_F32 6 /* outputs a one-row tile takes (see TILE_BODY) */
#define ROW_OUTPUTS_Q8 3
#define WIDE_OUTPUTS 8 /* outputs an AVX-512 tile of 2-6 rows takes (see WIDE_BODY) */
#define RES_LD 8 /* a tile's results: [rows][RES_LD] */
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
 * go in the portable order, which is the same. res is [R][RES_LD]. */
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
            res[r * RES_LD + o] = s;                                                                                   \
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

/* AVX-512, 2-6 rows x 8 outputs: the same eight lanes per output as TILE_BODY, two outputs to a 512-bit register
 * (output o in the low half, o + 1 in the high one, the row's eight inputs broadcast to both), so the sums are
 * the same bits; each instruction does twice the work, which prefill, bound by arithmetic, gains from. R x 4
 * accumulators, 4 weight pairs and one input stay in AVX-512's 32 registers. */
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
AVX512 static inline __m512 pair_w(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
AVX512 static inline __m512 pair_w8(const int8_t *a, const int8_t *b) {
    __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}
AVX512 static inline __m512 both_halves(const float *x) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}
#define WIDE_BODY(R, WT, PAIR)                                                                                         \
    enum { NP = WIDE_OUTPUTS / 2 };                                                                                    \
    __m512 acc[R][NP];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();                                                 \
    int k = 0;                                                                                                         \
    for (; k + 8 <= K; k += 8) {                                                                                       \
        __m512 wv[NP];                                                                                                 \
        if (!(k * sizeof(WT) & 63)) /* the next tile's rows (6 on, as TILE_BODY's: f32 batch 8 20% slower) */    \
            for (int o = 0; o < WIDE_OUTPUTS; o++)                                                                     \
                _mm_prefetch((const char *)(w + (size_t)(o + WIDE_OUTPUTS) * ldw + k), _MM_HINT_T0);           \
        for (int p = 0; p < NP; p++) {                                                                                 \
            wv[p] = PAIR(w + (size_t)(2 * p) * ldw + k, w + (size_t)(2 * p + 1) * ldw + k);                            \
            __asm__("" : "+v"(wv[p]));                                                                                 \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m512 xv = both_halves(x + (size_t)r * ldx + k);                                                          \
            __asm__("" : "+v"(xv));                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < WIDE_OUTPUTS; o++) {                                                                       \
            __m512d a = _mm512_castps_pd(acc[r][o / 2]);                                                               \
            float s = hsum(_mm256_castpd_ps(o % 2 ? _mm512_extractf64x4_pd(a, 1) : _mm512_castpd512_pd256(a)));        \
            for (int j = k; j < K; j++) s = fmaf(x[(size_t)r * ldx + j], (float)w[(size_t)o * ldw + j], s);           \
            res[r * RES_LD + o] = s;                                                                                   \
        }
#define WIDE_FN(NAME, R, WT, PAIR)                                                                                     \
    AVX512 static void NAME##_##R(float *res, const float *x, size_t ldx, const WT *w, size_t ldw, int K) {          \
        WIDE_BODY(R, WT, PAIR)                                                                                         \
    }
#define WIDE(NAME, WT, PAIR)                                                                                           \
    WIDE_FN(NAME, 2, WT, PAIR) WIDE_FN(NAME, 3, WT, PAIR) WIDE_FN(NAME, 4, WT, PAIR)                                   \
    WIDE_FN(NAME, 5, WT, PAIR) WIDE_FN(NAME, 6, WT, PAIR)                                                              \
    static void NAME(float *res, const float *x, size_t ldx, const WT *w, size_t ldw, int R, int K) {                \
        switch (R) {                                                                                                   \
        case 6: NAME##_6(res, x, ldx, w, ldw, K); break;                                                               \
        case 5: NAME##_5(res, x, ldx, w, ldw, K); break;                                                               \
        case 4: NAME##_4(res, x, ldx, w, ldw, K); break;                                                               \
        case 3: NAME##_3(res, x, ldx, w, ldw, K); break;                                                               \
        default: NAME##_2(res, x, ldx, w, ldw, K);                                                                     \
        }                                                                                                              \
    }
WIDE(wide_f32, float, pair_w)
WIDE(wide_q8, int8_t, pair_w8)

AVX2 static float dot_avx2(const float *x, const float *w, int K) {
    __m256 a = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) a = _mm256_fmadd_ps(_mm256_loadu_ps(x + k), _mm256_loadu_ps(w + k), a);
    float s = hsum(a);
    for (; k < K; k++) s = fmaf(x[k], w[k], s);
    return s;
}

/* The widest path this CPU has: 2 AVX-512, 1 AVX2, 0 portable. $DTRAIN_ROWDOT=portable|avx2 asks for a
 * narrower one on any CPU (the tests run each and expect the same bits). */
static int simd_level(void) {
    static int known = -1;
    if (known < 0) {
        const char *e = getenv("DTRAIN_ROWDOT");
        int cap = 2;
        if (e && *e) {
            cap = !strcmp(e, "portable") ? 0 : !strcmp(e, "avx2") ? 1 : 2;
            if (cap == 2) dt_log(DT_LOG_WARN, "DTRAIN_ROWDOT=%s is not portable or avx2: the widest path this CPU has", e);
        }
        int has = !(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) ? 0 : __builtin_cpu_supports("avx512f") ? 2 : 1;
        known = has < cap ? has : cap;
    }
    return known;
}
static bool have_avx2(void) { return simd_level() >= 1; }
#else
#define HAVE_AVX2_PATH 0
#endif

float dt_dot_f32(const float *x, const float *w, int K) {
#if HAVE_AVX2_PATH
    if (have_avx2()) return dot_avx2(x, w, K);
#endif
    return dot_portable(x, w, K);
}

/* Outputs a tile of nr rows takes: one row 6 in f32 and 3 in int8 (AVX2: batch 1 waits on memory, and AVX-512
 * measured no faster there); more, 8 on AVX-512, else 3 for 2-4 rows and 2 for 5 or 6. */
static int tile_width(int nr, bool q8) {
    if (nr == 1) return q8 ? ROW_OUTPUTS_Q8 : ROW_OUTPUTS_F32;
#if HAVE_AVX2_PATH
    if (simd_level() == 2) return WIDE_OUTPUTS;
#endif
    return nr <= 4 ? 3 : 2;
}

/* Rows [r, r + nr) x outputs [o, o + no), no <= 8: tiles where they fit, single dots elsewhere; the same sums either way. */
static void block(float *out, const float *x, const float *wf, const int8_t *wq, const float *scale, const float *bias, int K, int O,
                  int r, int nr, int o, int no) {
    float res[6 * RES_LD];
    const float *xr = x + (size_t)r * K;
    int tw = tile_width(nr, wq != NULL);
    for (int t = 0; t < no; t += tw) {
        int m = no - t < tw ? no - t : tw;
#if HAVE_AVX2_PATH
        if (m == tw && tw == WIDE_OUTPUTS) {
            if (wq) wide_q8(res, xr, (size_t)K, wq + (size_t)(o + t) * K, (size_t)K, nr, K);
            else wide_f32(res, xr, (size_t)K, wf + (size_t)(o + t) * K, (size_t)K, nr, K);
        } else if (m == tw && have_avx2()) {
            if (wq) tile_q8(res, xr, (size_t)K, wq + (size_t)(o + t) * K, (size_t)K, nr, K);
            else tile_f32(res, xr, (size_t)K, wf + (size_t)(o + t) * K, (size_t)K, nr, K);
        } else
#endif
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < m; j++)
                res[i * RES_LD + j] = wq ? dot_q8_portable(xr + (size_t)i * K, wq + (size_t)(o + t + j) * K, K)
                                         : dot_portable(xr + (size_t)i * K, wf + (size_t)(o + t + j) * K, K);
        for (int i = 0; i < nr; i++)
            for (int j = 0; j < m; j++) {
                float s = res[i * RES_LD + j], b = bias ? bias[o + t + j] : 0.0f;
                out[(size_t)(r + i) * O + o + t + j] = scale ? fmaf(s, scale[o + t + j], b) : s + b;
            }
    }
}

/* Outputs [o0, o1) of rows [0, n): blocks of 6 or 8 outputs (whole tiles) by up to 6 rows, swept while a chunk
 * of rows is in cache. */
static void rows_range(float *out, const float *x, const void *wv, const float *scale, const float *bias, int n, int K, int O,
                       int o0, int o1) {
    const float *wf = scale ? NULL : wv;
    const int8_t *wq = scale ? wv : NULL;
    for (int r0 = 0; r0 < n; r0 += ROW_CHUNK) {
        int r1 = r0 + ROW_CHUNK < n ? r0 + ROW_CHUNK : n;
        /* rows in groups of at most 6, as even as they go (8: 4 + 4, not 6 + 2: a small group converts as many
         * int8 weights as a large one for fewer products); only a chunk of one row has groups of one */
        int g = (r1 - r0 + 5) / 6, base = (r1 - r0) / g, extra = (r1 - r0) % g;
        int step = tile_width(r1 - r0 > 1 ? 2 : 1, false) == WIDE_OUTPUTS ? WIDE_OUTPUTS : 6;
        for (int o = o0; o < o1; o += step)
            for (int i = 0, r = r0; i < g; r += base + (i < extra), i++)
                block(out, x, wf, wq, scale, bias, K, O, r, base + (i < extra), o, o1 - o < step ? o1 - o : step);
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
