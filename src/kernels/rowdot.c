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
#include "panels.h"
#include "simd.h"

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

#define ROW_OUTPUTS 6 /* outputs an AVX2 one-row tile takes (see TILE_BODY) */
#define WIDE_OUTPUTS 8 /* outputs an AVX-512 tile of 2-6 rows takes (see WIDE_BODY) */
#define RES_LD DT_PANEL /* a tile's results: [rows][RES_LD] */
/* How far ahead a tile prefetches the weights of rows in place. Decoding (1-4 rows): the rows 6 on, a one-row
 * tile's next tile (an int8 tile of 3 outputs that prefetched only its next tile's rows, 3 on, decoded batch 1 at
 * 140-145 tokens/s on a Zen 5, 6 on at 156-166). Prefill (5-6 rows, the same weights swept by many row groups):
 * the next tile's rows, as 6 on was 2-6% slower there. */
#define PREFETCH_AHEAD(R, NO) ((R) >= 5 ? (NO) : 6)
#define PANEL_AHEAD 8192 /* bytes a packed panel's stream is prefetched ahead (see PANEL_FN) */
#define ROW_CHUNK 60 /* rows swept against one block of weights while they are in cache (a multiple of 6) */

/* One panel's weights (panels.h), packed or in place: output i's chunk of eight inputs at k is at
 * w + i * rs + (k / 8) * cs, its tail (k >= K & ~7) at t + i * trs + k - (K & ~7); elements, not bytes. */
typedef struct {
    const void *w, *t;
    size_t rs, cs, trs;
    int pw;      /* outputs in the panel */
    bool packed; /* packed (rs = 8) or in place */
} view;

static view panel_view(const void *base, size_t esize, int p, int O, int K, bool packed) {
    int pw = O - p * DT_PANEL < DT_PANEL ? O - p * DT_PANEL : DT_PANEL, K8 = K & ~7;
    const char *b = (const char *)base + (size_t)p * DT_PANEL * K * esize;
    if (packed) return (view){ b, b + (size_t)K8 * pw * esize, 8, (size_t)pw * 8, (size_t)(K - K8), pw, true };
    return (view){ b, b + (size_t)K8 * esize, (size_t)K, 8, (size_t)K, pw, false };
}

/* The lanes' fixed tree: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static float tree8(const float *a) {
    float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    return (b0 + b2) + (b1 + b3);
}

/* Output i of view v against one row x, in the spec's order. */
static float dot_portable(const float *x, const view *v, int i, bool q8, int K) {
    const float *wf = v->w, *tf = v->t;
    const int8_t *wq = v->w, *tq = v->t;
    float a[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        size_t at = (size_t)i * v->rs + (size_t)(k >> 3) * v->cs;
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], q8 ? (float)wq[at + j] : wf[at + j], a[j]);
    }
    float s = tree8(a);
    for (int j = k; j < K; j++) {
        size_t at = (size_t)i * v->trs + (size_t)(j - k);
        s = fmaf(x[j], q8 ? (float)tq[at] : tf[at], s);
    }
    return s;
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX2 static inline float hsum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* b_j = l_j + l_{j+4} */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* b0+b2, b1+b3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

AVX2 static inline __m256 load_w(const float *w) { return _mm256_loadu_ps(w); }
AVX2 static inline __m256 load_w8(const int8_t *w) {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)w)));
}

/* The arguments of every tile: R rows of x (ldx apart) against a view's outputs from w's on (rs, cs, t, trs as
 * in view), results into res [R][RES_LD]. */
#define TILE_ARGS(WT)                                                                                                  \
    float *res, const float *x, size_t ldx, const WT *w, size_t rs, size_t cs, const WT *t, size_t trs, int K, size_t pf
#define TILE_CALL res, x, ldx, w, rs, cs, t, trs, K, pf
/* A tile that reads part of each chunk row of a packed panel first prefetches the whole of it (pf bytes)
 * PANEL_AHEAD on, so the panel comes from memory as one stream and its other tiles find it in cache; three
 * strided streams of 8 outputs each, left to the hardware's prefetchers, made batch 8 25% slower. */
#define STREAM_AHEAD(wk, pf)                                                                                           \
    for (size_t b_ = 0; b_ < (pf); b_ += 64) _mm_prefetch((const char *)(wk) + PANEL_AHEAD + b_, _MM_HINT_T0)

/* The sums' end: each accumulator's lanes in the fixed tree, then the tail in the portable order. */
#define TILE_END(R, NO, HSUM)                                                                                          \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) {                                                                                 \
            float s = HSUM(r, o);                                                                                      \
            for (int j = k; j < K; j++) s = fmaf(x[(size_t)r * ldx + j], (float)t[(size_t)o * trs + j - k], s);      \
            res[r * RES_LD + o] = s;                                                                                   \
        }

/* R rows x NO outputs over the whole of K, both constants in each copy so
 * that the R * NO accumulators, NO weight vectors and one input vector stay
 * in AVX2's sixteen registers: one row x NO1 outputs, 2-4 rows x 3
 * (12 + 3 + 1), or 5-6 rows x 2 (12 + 2 + 1), which converts fewer int8
 * weights per product. One row takes 6 outputs (six chains of FMAs hide
 * their latency: three left f32 batch 1 at ~84% of the memory's pace, six
 * reach it; int8 on the AVX2 path, Zen 5: 144-147 -> 206-209 tokens/s, once
 * the prefetch went 6 rows on; an earlier 6 had measured no faster). Weights
 * are prefetched a few rows ahead (short rows defeat the hardware's
 * prefetchers). These tiles read rows in place (panels.c: only the
 * AVX-512 path packs), and packed only in a last panel's few outputs. */
#define HSUM_TILE(r, o) hsum(acc[r][o])
#define TILE_BODY(R, NO, WT, LOAD)                                                                                     \
    __m256 acc[R][NO];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();                                                 \
    (void)pf;                                                                                                          \
    int k = 0;                                                                                                         \
    const WT *wk = w;                                                                                                  \
    for (; k + 8 <= K; k += 8, wk += cs) {                                                                             \
        __m256 wv[NO];                                                                                                 \
        if (!(k * sizeof(WT) & 63)) /* a cache line each at a time */                                                  \
            for (int o = 0; o < NO; o++) _mm_prefetch((const char *)(wk + (size_t)(o + PREFETCH_AHEAD(R, NO)) * rs), _MM_HINT_T0); \
        for (int o = 0; o < NO; o++) {                                                                                 \
            wv[o] = LOAD(wk + (size_t)o * rs);                                                                         \
            __asm__("" : "+x"(wv[o])); /* in a register: folded into R FMAs, an f32 weight is loaded R times */        \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m256 xv = _mm256_loadu_ps(x + (size_t)r * ldx + k);                                                      \
            __asm__("" : "+x"(xv)); /* in a register: else each FMA loads it again, and loads set the pace */            \
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    TILE_END(R, NO, HSUM_TILE)
#define TILE_FN(NAME, R, NO, WT, LOAD)                                                                                 \
    AVX2 static void NAME##_##R(TILE_ARGS(WT)) { TILE_BODY(R, NO, WT, LOAD) }
#define TILE_SWITCH(NAME, WT)                                                                                          \
    static void NAME(int R, TILE_ARGS(WT)) {                                                                           \
        switch (R) {                                                                                                   \
        case 6: NAME##_6(TILE_CALL); break;                                                                            \
        case 5: NAME##_5(TILE_CALL); break;                                                                            \
        case 4: NAME##_4(TILE_CALL); break;                                                                            \
        case 3: NAME##_3(TILE_CALL); break;                                                                            \
        case 2: NAME##_2(TILE_CALL); break;                                                                            \
        default: NAME##_1(TILE_CALL);                                                                                  \
        }                                                                                                              \
    }
#define TILE(NAME, WT, LOAD, NO1)                                                                                      \
    TILE_FN(NAME, 1, NO1, WT, LOAD) TILE_FN(NAME, 2, 3, WT, LOAD) TILE_FN(NAME, 3, 3, WT, LOAD)                        \
    TILE_FN(NAME, 4, 3, WT, LOAD) TILE_FN(NAME, 5, 2, WT, LOAD) TILE_FN(NAME, 6, 2, WT, LOAD) TILE_SWITCH(NAME, WT)
TILE(tile_f32, float, load_w, ROW_OUTPUTS)
TILE(tile_q8, int8_t, load_w8, ROW_OUTPUTS)

/* AVX-512, 2-6 rows x 8 outputs: the same eight lanes per output as TILE_BODY, two outputs to a 512-bit register
 * (output o in the low half, o + 1 in the high one, the row's eight inputs broadcast to both), so the sums are
 * the same bits; each instruction does twice the work, which prefill, bound by arithmetic, gains from. R x 4
 * accumulators, 4 weight pairs and one input stay in AVX-512's 32 registers. */
AVX512 static inline __m512 pair_w(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
AVX512 static inline __m512 pair_w8(const int8_t *a, const int8_t *b) {
    __m128i v = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)a), _mm_loadl_epi64((const __m128i *)b));
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v));
}
/* A packed panel's pair of outputs (rs = 8) is 16 elements side by side: one load, no insert (int8 prefill on Zen 4,
 * one thread: 485-488 -> 503-509 tokens/s; f32 no change). */
AVX512 static inline __m512 load16(const float *w) { return _mm512_loadu_ps(w); }
AVX512 static inline __m512 load16_q8(const int8_t *w) {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
}
AVX512 static inline __m512 both_halves(const float *x) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}
/* One accumulator's half: output 2p in the low half, 2p + 1 in the high one. */
#define HALF(v, hi)                                                                                                    \
    _mm256_castpd_ps((hi) ? _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1) : _mm512_castpd512_pd256(_mm512_castps_pd(v)))
#define HSUM_WIDE(r, o) hsum(HALF(acc[r][(o) / 2], (o) % 2))
#define WIDE_BODY(R, WT, PAIR, LOAD16)                                                                                \
    enum { NP = WIDE_OUTPUTS / 2 };                                                                                    \
    __m512 acc[R][NP];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();                                                 \
    int k = 0;                                                                                                         \
    const WT *wk = w;                                                                                                  \
    for (; k + 8 <= K; k += 8, wk += cs) {                                                                             \
        __m512 wv[NP];                                                                                                 \
        STREAM_AHEAD(wk, pf);                                                                                          \
        if (rs != 8 && !(k * sizeof(WT) & 63)) /* the next tile's rows (6 on, as TILE_BODY's: f32 batch 8 20% slower) */ \
            for (int o = 0; o < WIDE_OUTPUTS; o++)                                                                     \
                _mm_prefetch((const char *)(wk + (size_t)(o + WIDE_OUTPUTS) * rs), _MM_HINT_T0);                      \
        for (int p = 0; p < NP; p++) {                                                                                 \
            wv[p] = rs == 8 ? LOAD16(wk + 16 * p) : PAIR(wk + (size_t)(2 * p) * rs, wk + (size_t)(2 * p + 1) * rs); \
            __asm__("" : "+v"(wv[p]));                                                                                 \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m512 xv = both_halves(x + (size_t)r * ldx + k);                                                          \
            __asm__("" : "+v"(xv));                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    TILE_END(R, WIDE_OUTPUTS, HSUM_WIDE)
#define WIDE_FN(NAME, R, WT, PAIR, LOAD16)                                                                             \
    AVX512 static void NAME##_##R(TILE_ARGS(WT)) { WIDE_BODY(R, WT, PAIR, LOAD16) }
#define WIDE(NAME, WT, PAIR, L16)                                                                                      \
    WIDE_FN(NAME, 2, WT, PAIR, L16) WIDE_FN(NAME, 3, WT, PAIR, L16) WIDE_FN(NAME, 4, WT, PAIR, L16)                    \
    WIDE_FN(NAME, 5, WT, PAIR, L16) WIDE_FN(NAME, 6, WT, PAIR, L16) WIDE_FN(NAME, 1, WT, PAIR, L16) TILE_SWITCH(NAME, WT)
WIDE(wide_f32, float, pair_w, load16)
WIDE(wide_q8, int8_t, pair_w8, load16_q8)

/* AVX-512, decoding (up to DECODE_ROWS rows) against a whole packed panel of 24 outputs, two rows at a time: each
 * chunk row of the panel (24 outputs' eight weights, side by side) is 12 loads of two outputs each, so the panel is
 * read as one stream (tiles of 8 outputs read a third of each chunk row, three strided streams: batch 8 was 25%
 * slower so). The stream is prefetched PANEL_AHEAD bytes on, into the next panel at the end (Zen 5, 124M's
 * Linears, one thread): the hardware's prefetchers alone kept two f32 rows at 31-34 GB/s where one reached
 * 38-40, 2 KB on both 39-40, and f32 no faster up to 32 KB; int8, 2 KB -> 8 KB on: batch 1 4.3 -> 3.1 ms (the
 * memory's pace), batch 4 9.2 -> 6.1 ms, no faster beyond. More rows go over the panel a block of inputs at a
 * time (decode_panel), the
 * accumulators kept in save between blocks (the same lanes, so the same bits), so that each pass after the first
 * finds the block in L1; those passes wait on nothing, so with more than two of them they prefetch a block ahead
 * into L2 between them (Zen 5, f32 batch 8, 124M's Linears alone: 362-368 -> 394-413 tokens/s; with two passes batch 4
 * was 6-9% slower so, and int8, bound by its conversions, no faster; how far ahead: pass_prefetch). R x 12
 * accumulators. */
/* What a pass prefetches of each chunk row it reads: bytes [lo, hi) of the one ahead bytes on, into L1 or only L2. */
typedef struct {
    size_t ahead, lo, hi;
    bool l2;
} pf_slice;
#define HSUM_PANEL(r, o) hsum(HALF(acc[r][(o) / 2], (o) % 2))
#define PANEL_FN(NAME, R, NPAIRS, WT, LOAD16)                                                                          \
    AVX512 static void NAME##_##R(float *res, const float *x, size_t ldx, const WT *w, size_t cs, const WT *t, size_t trs, \
                                  int K, int k0, int k1, __m512 *save, bool first, bool last, pf_slice pf) {          \
        enum { NP = NPAIRS };                                                                                          \
        __m512 acc[R][NP];                                                                                             \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = first ? _mm512_setzero_ps() : save[r * NP + p];                  \
        int k = k0;                                                                                                    \
        const WT *wk = w + (size_t)(k0 >> 3) * cs;                                                                     \
        for (; k < k1; k += 8, wk += cs) {                                                                             \
            __m512 xv[R];                                                                                              \
            for (int r = 0; r < R; r++) xv[r] = both_halves(x + (size_t)r * ldx + k);                                  \
            for (size_t b_ = pf.lo; b_ < pf.hi; b_ += 64) /* the hint is an immediate */                              \
                if (pf.l2) _mm_prefetch((const char *)wk + pf.ahead + b_, _MM_HINT_T1);                              \
                else _mm_prefetch((const char *)wk + pf.ahead + b_, _MM_HINT_T0);                                    \
            for (int p = 0; p < NP; p++) {                                                                             \
                __m512 wv = LOAD16(wk + 16 * p);                                                                       \
                __asm__("" : "+v"(wv)); /* one load for both rows: two of 64 bytes a product set the pace */          \
                for (int r = 0; r < R; r++) acc[r][p] = _mm512_fmadd_ps(xv[r], wv, acc[r][p]);                        \
            }                                                                                                          \
        }                                                                                                              \
        if (!last) {                                                                                                   \
            for (int r = 0; r < R; r++)                                                                                \
                for (int p = 0; p < NP; p++) save[r * NP + p] = acc[r][p];                                             \
            return;                                                                                                    \
        }                                                                                                              \
        TILE_END(R, 2 * NP, HSUM_PANEL)                                                                                \
    }
PANEL_FN(panel_f32, 1, DT_PANEL / 2, float, load16)
PANEL_FN(panel_f32, 2, DT_PANEL / 2, float, load16)
PANEL_FN(panel_q8, 1, DT_PANEL / 2, int8_t, load16_q8)
PANEL_FN(panel_q8, 2, DT_PANEL / 2, int8_t, load16_q8)
/* int8, four rows against half a panel: each weight widened to f32 serves four rows, not two (batch 8 was 18%
 * slower than tiles of 4 rows x 8 outputs in pairs of rows, converting twice as often) */
PANEL_FN(panel_q8, 4, DT_PANEL / 4, int8_t, load16_q8)

/* Rows [0, n) (n <= DECODE_ROWS) against one whole packed panel: in blocks of DECODE_KBLOCK inputs when more than
 * one pass is needed, each block by every pair of rows (int8: every four rows, a half panel at a time, then the
 * pairs). res [n][RES_LD]. */
#define DECODE_ROWS 8
/* inputs: 24 KB of a panel in f32, which L1 holds (f32 batch 4-8 3-6% faster than whole panels a pass; int8,
 * 6 KB a block, the same with blocks of 256 to 1024 inputs or none) */
#define DECODE_KBLOCK 256
/* What pass i of a block's passes prefetches (row: bytes of a chunk row, block: of a block). The first streams the
 * block in, PANEL_AHEAD on; one f32 row leaves that to the hardware's prefetchers, which keep pace with a single
 * stream of full cache lines: its own prefetches cost 3% (Zen 5, 124M, one thread: 71.0 -> 73.5 tokens/s, four
 * alternating pairs; 0.89-0.93 -> 0.93-0.96 of a plain read of the same bytes). With more than two passes, the others
 * share the block after next between them (above), and the first, finding its block in L2, streams only 4 KB on (Zen
 * 4, 124M, batch 8, one thread, builds alternating: the next block and 8 KB, f32 202-211 tokens/s, int8 237-255;
 * these, 228-237 and 270-273; one block on with 4 KB or two with 8 KB were between; batch 6 no change). */
static pf_slice pass_prefetch(int i, int passes, size_t row, size_t block, bool one_f32_row) {
    size_t lines = row / 64;
    if (i == 0) return (pf_slice){ passes > 2 ? PANEL_AHEAD / 2 : PANEL_AHEAD, 0, one_f32_row ? 0 : row, false };
    if (passes <= 2) return (pf_slice){ 0, 0, 0, false };
    size_t others = (size_t)passes - 1;
    return (pf_slice){ 2 * block, lines * (size_t)(i - 1) / others * 64, lines * (size_t)i / others * 64, true };
}

static void decode_panel(float *res, const float *x, size_t ldx, const view *v, bool q8, int n, int K) {
    __m512 save[4 * DT_PANEL]; /* at most 4 passes of 24 accumulators */
    enum { HALF_PANEL = DT_PANEL / 2 };
    const float *wf = v->w, *tf = v->t;
    const int8_t *wq = v->w, *tq = v->t;
    int K8 = K & ~7, kb = n <= 2 || K8 == 0 ? (K8 ? K8 : 8) : DECODE_KBLOCK;
    size_t row = v->cs * (q8 ? 1 : sizeof(float)); /* bytes of a chunk row */
    size_t block = (size_t)kb / 8 * row;
    int passes = q8 ? n / 4 * 2 + (n % 4 + 1) / 2 : (n + 1) / 2; /* as the loops below make them */
    bool one_f32 = !q8 && n == 1;
    for (int k0 = 0; k0 < K8 || k0 == 0; k0 += kb) {
        int k1 = k0 + kb < K8 ? k0 + kb : K8, r = 0, pass = 0;
        bool first = k0 == 0, last = k1 == K8;
        __m512 *sv = save;
        for (; q8 && n - r >= 4; r += 4)
            for (int h = 0; h < 2; h++, sv += DT_PANEL, pass++)
                panel_q8_4(res + (size_t)r * RES_LD + h * HALF_PANEL, x + (size_t)r * ldx, ldx, wq + h * HALF_PANEL * 8, v->cs,
                           tq + (size_t)h * HALF_PANEL * v->trs, v->trs, K, k0, k1, sv, first, last,
                           pass_prefetch(pass, passes, row, block, one_f32));
        for (; r < n; r += 2, sv += DT_PANEL, pass++) {
            float *rr = res + (size_t)r * RES_LD;
            const float *xr = x + (size_t)r * ldx;
            pf_slice pf = pass_prefetch(pass, passes, row, block, one_f32);
            if (q8 && n - r >= 2) panel_q8_2(rr, xr, ldx, wq, v->cs, tq, v->trs, K, k0, k1, sv, first, last, pf);
            else if (q8) panel_q8_1(rr, xr, ldx, wq, v->cs, tq, v->trs, K, k0, k1, sv, first, last, pf);
            else if (n - r >= 2) panel_f32_2(rr, xr, ldx, wf, v->cs, tf, v->trs, K, k0, k1, sv, first, last, pf);
            else panel_f32_1(rr, xr, ldx, wf, v->cs, tf, v->trs, K, k0, k1, sv, first, last, pf);
        }
        if (last) break;
    }
}
#else
#define HAVE_AVX2_PATH 0
#endif

/* Tiles, widest first: [0] the one a block of nr rows is swept in, [1] a narrower one for what is left of a
 * panel; outputs past both go one at a time (T_NONE). AVX-512: more than one row 8 outputs (one row, and a
 * decoding step's rows against whole packed panels, go to decode_panel instead); AVX2: one row 6 outputs (batch 1
 * waits on memory), 2-4 rows 3, 5-6 rows 2. */
typedef enum { T_NONE, T_WIDE, T_AVX2 } tile_kind;
typedef struct { tile_kind kind; int width; } tile_choice;
static void tile_widths(int nr, tile_choice c[2]) {
    int level = dt_kernels_simd();
    tile_choice avx2 = { T_AVX2, nr == 1 ? ROW_OUTPUTS : nr <= 4 ? 3 : 2 }, none = { T_NONE, 1 };
    c[0] = c[1] = none;
    if (level == 0) return;
    c[0] = avx2;
    if (level < 2) return;
    if (nr > 1) c[0] = (tile_choice){ T_WIDE, WIDE_OUTPUTS };
    if (c[0].kind != T_AVX2) c[1] = avx2;
}

static void run_tile(tile_kind kind, bool q8, float *res, const float *xr, size_t K, const view *v, int i, int nr, bool stream) {
#if HAVE_AVX2_PATH
    size_t pf = stream && v->packed ? v->cs * (q8 ? 1 : sizeof(float)) : 0;
    const float *wf = (const float *)v->w + (size_t)i * v->rs, *tf = (const float *)v->t + (size_t)i * v->trs;
    const int8_t *wq = (const int8_t *)v->w + (size_t)i * v->rs, *tq = (const int8_t *)v->t + (size_t)i * v->trs;
    if (kind == T_WIDE) {
        if (q8) wide_q8(nr, res, xr, K, wq, v->rs, v->cs, tq, v->trs, (int)K, pf);
        else wide_f32(nr, res, xr, K, wf, v->rs, v->cs, tf, v->trs, (int)K, pf);
    } else {
        if (q8) tile_q8(nr, res, xr, K, wq, v->rs, v->cs, tq, v->trs, (int)K, pf);
        else tile_f32(nr, res, xr, K, wf, v->rs, v->cs, tf, v->trs, (int)K, pf);
    }
#else
    (void)kind, (void)q8, (void)res, (void)xr, (void)K, (void)v, (void)i, (void)nr, (void)stream;
#endif
}

/* Results res [nr][RES_LD] of rows [r, r + nr) x outputs [o, o + m) into out, scaled (int8) and biased. */
static void put(float *out, const float *res, int r, int nr, int o, int m, const float *scale, const float *bias, int O) {
    for (int a = 0; a < nr; a++)
        for (int j = 0; j < m; j++) {
            float s = res[a * RES_LD + j], b = bias ? bias[o + j] : 0.0f;
            out[(size_t)(r + a) * O + o + j] = scale ? fmaf(s, scale[o + j], b) : s + b;
        }
}

/* Rows [r, r + nr) x a view's outputs [i, i + no) (output o0 + i of the whole): tiles where they fit, single dots
 * elsewhere; the same sums either way. first: the panel's first block, whose first tile streams it in. */
static void block(float *out, const float *x, const view *v, bool q8, const float *scale, const float *bias, int K, int O, int r,
                  int nr, int o0, int i, int no, bool first) {
    float res[6 * RES_LD];
    const float *xr = x + (size_t)r * K;
    tile_choice c[2];
    tile_widths(nr, c);
    for (int t = 0, m; t < no; t += m) {
        tile_kind kind = c[0].width <= no - t ? c[0].kind : c[1].width <= no - t ? c[1].kind : T_NONE;
        m = kind == T_NONE ? 1 : kind == c[0].kind ? c[0].width : c[1].width;
        if (kind != T_NONE) run_tile(kind, q8, res, xr, (size_t)K, v, i + t, nr, first && t == 0);
        else
            for (int a = 0; a < nr; a++) res[a * RES_LD] = dot_portable(xr + (size_t)a * K, v, i + t, q8, K);
        put(out, res, r, nr, o0 + i + t, m, scale, bias, O);
    }
}

/* Panels [p0, p1) against rows [0, n): each panel in blocks of its rows' widest tile, by up to 6 rows, swept
 * while a chunk of rows is in cache. */
static void rows_range(float *out, const float *x, const void *w, bool packed, const float *scale, const float *bias, int n, int K,
                       int O, int p0, int p1) {
    bool q8 = scale != NULL;
    for (int r0 = 0; r0 < n; r0 += ROW_CHUNK) {
        int r1 = r0 + ROW_CHUNK < n ? r0 + ROW_CHUNK : n;
        /* rows in groups of at most 6, as even as they go (8: 4 + 4, not 6 + 2: a small group converts as many
         * int8 weights as a large one for fewer products); only a chunk of one row has groups of one */
        int g = (r1 - r0 + 5) / 6, base = (r1 - r0) / g, extra = (r1 - r0) % g;
        for (int p = p0; p < p1; p++) {
            view v = panel_view(w, q8 ? 1 : sizeof(float), p, O, K, packed);
#if HAVE_AVX2_PATH
            if (packed && v.pw == DT_PANEL && r1 - r0 <= DECODE_ROWS && dt_kernels_simd() == DT_SIMD_AVX512) {
                float res[DECODE_ROWS * RES_LD];
                decode_panel(res, x + (size_t)r0 * K, (size_t)K, &v, q8, r1 - r0, K);
                put(out, res, r0, r1 - r0, p * DT_PANEL, DT_PANEL, scale, bias, O);
                continue;
            }
#endif
            tile_choice c[2];
            tile_widths(base, c);
            /* AVX2's 2 and 3 both fit in 6, whose weights stay in L1 while every group of rows goes by; one row (no
             * groups to go by), the whole panel at once, in fewer calls */
            int step = c[0].kind == T_WIDE ? WIDE_OUTPUTS : base == 1 ? DT_PANEL : 6;
            for (int i = 0; i < v.pw; i += step)
                for (int a = 0, r = r0; a < g; r += base + (a < extra), a++)
                    block(out, x, &v, q8, scale, bias, K, O, r, base + (a < extra), p * DT_PANEL, i, v.pw - i < step ? v.pw - i : step,
                          i == 0 && a == 0);
        }
    }
}

/* One row against f32 rows in place: tiles straight along the outputs, none of the panels' bookkeeping, which
 * cost more than the products at short rows (attention's 64-input keys, before they had their own layout and
 * kernel in attend.c: decoding batch 8 after a 512-token prompt went 181-189 -> 201-202 tokens/s in f32 on a Zen
 * 5). AVX-512: 8 outputs a tile; AVX2: 6. The same sums as every path. */
static void one_row(float *out, const float *x, const float *w, const float *bias, int K, int O) {
    view v = panel_view(w, sizeof(float), 0, O, K, false); /* output o at o * K, as in panel 0 */
    int o = 0;
#if HAVE_AVX2_PATH
    float res[RES_LD];
    int level = dt_kernels_simd(), tw = level == DT_SIMD_AVX512 ? WIDE_OUTPUTS : level == DT_SIMD_AVX2 ? ROW_OUTPUTS : O + 1;
    for (; o + tw <= O; o += tw) {
        const float *wo = w + (size_t)o * K, *to = wo + (K & ~7);
        if (level == DT_SIMD_AVX512) wide_f32_1(res, x, (size_t)K, wo, (size_t)K, 8, to, (size_t)K, K, 0);
        else tile_f32_1(res, x, (size_t)K, wo, (size_t)K, 8, to, (size_t)K, K, 0);
        put(out, res, 0, 1, o, tw, NULL, bias, O);
    }
#endif
    for (; o < O; o++) {
        float s = dot_portable(x, &v, o, false, K);
        put(out, &s, 0, 1, o, 1, NULL, bias, O);
    }
}

static void rowdot(float *out, const float *x, const void *w, bool packed, const float *scale, const float *bias, int n, int K, int O) {
    int panels = (O + DT_PANEL - 1) / DT_PANEL;
    if (n == 1 && !packed && !scale) {
        one_row(out, x, w, bias, K, O);
        return;
    }
    /* threads only where there is work for them and none are at work already (the results do not depend on it) */
    if ((double)n * K * O < 65536 || omp_in_parallel()) {
        rows_range(out, x, w, packed, scale, bias, n, K, O, 0, panels);
        return;
    }
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < panels; p++) rows_range(out, x, w, packed, scale, bias, n, K, O, p, p + 1);
}

void dt_rowdot_f32(float *out, const float *x, const float *w, const float *bias, int n, int K, int O) {
    rowdot(out, x, w, false, NULL, bias, n, K, O);
}

void dt_panels_apply(float *out, const float *x, const dt_panels *p, const float *bias, int n) {
    if (p->f) rowdot(out, x, p->f, p->packed, NULL, bias, n, p->K, p->O);
    else rowdot(out, x, p->q, p->packed, p->scale, bias, n, p->K, p->O);
}
