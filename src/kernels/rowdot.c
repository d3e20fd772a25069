/* Inference's Linear, batch-invariant by construction: every output element
 * is one dot product summed in one fixed order (eight lanes of fused
 * multiply-adds over k, the lanes added in a fixed tree, then the tail), so
 * a row's result is the same bits alone, in a batch of any size, at any
 * place in it, on any thread count. BLAS cannot promise that (its blocking
 * and kernels change with the matrix's shape), which is how servers come to
 * give a prompt different tokens when other requests share its batch.
 * The AVX-512 path, the AVX2 one and the portable one do the same
 * operations in the same order (fmaf rounds as the instruction does), so
 * they agree bit for bit. This file holds the dispatch and f32's kernels;
 * int8's (bf16 activations, their own spec) are rowdot_int8.c's. */
#include "rowdot.h"
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
#define omp_get_thread_num() 0
#define omp_get_max_threads() 1
#endif

/* Output i of view v (f32) against one row x, in the spec's order. */
static float dot_portable(const float *x, const view *v, int i, int K) {
    const float *w = v->w, *t = v->t;
    float a[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        size_t at = (size_t)i * v->rs + (size_t)(k >> 3) * v->cs;
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], w[at + j], a[j]);
    }
    float s = tree8(a);
    for (int j = k; j < K; j++) s = fmaf(x[j], t[(size_t)i * v->trs + (size_t)(j - k)], s);
    return s;
}

#if HAVE_AVX2_PATH
AVX2 static inline __m256 load_w(const float *w) { return _mm256_loadu_ps(w); }

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

/* The sums' end: output o of row r is SUM(src, r, o), its lanes summed in the fixed tree, then inputs [k, K) in the
 * portable order from x's rows and t's tail rows, into res. */
#define TILE_END(R, NO, SUM, src, res, x, ldx, t, trs, k, K)                                                           \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) {                                                                                 \
            float s = SUM(src, r, o);                                                                                  \
            for (int j = (k); j < (K); j++) s = fmaf((x)[(size_t)r * (ldx) + j], (float)(t)[(size_t)o * (trs) + j - (k)], s); \
            (res)[r * RES_LD + o] = s;                                                                                 \
        }

/* R rows x NO outputs over inputs [K0, K1) (a tile of tile_f32: the whole of K; of ktile_f32: a block, the sums
 * kept in SAVE between blocks unless FIRST, finished when LAST; the rows read from XB, LDB apart, XB's first
 * element input K0), both constants in each copy so
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
#define HSUM_TILE(acc, r, o) hsum((acc)[r][o])
#define TILE_BODY(R, NO, WT, LOAD, K0, K1, SAVE, FIRST, LAST, XB, LDB, AHEAD)                                          \
    __m256 acc[R][NO];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) acc[r][o] = (FIRST) ? _mm256_setzero_ps() : (SAVE)[r * NO + o];                   \
    int k = (K0);                                                                                                      \
    const WT *wk = w + (size_t)((K0) >> 3) * cs;                                                                       \
    for (; k < (K1); k += 8, wk += cs) {                                                                               \
        __m256 wv[NO];                                                                                                 \
        if ((AHEAD) && !(k * sizeof(WT) & 63)) /* a cache line each at a time, AHEAD outputs on (0: none) */            \
            for (int o = 0; o < NO; o++) _mm_prefetch((const char *)(wk + (size_t)(o + (AHEAD)) * rs), _MM_HINT_T0);     \
        for (int o = 0; o < NO; o++) {                                                                                 \
            wv[o] = LOAD(wk + (size_t)o * rs);                                                                         \
            __asm__("" : "+x"(wv[o])); /* in a register: folded into R FMAs, an f32 weight is loaded R times */        \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m256 xv = _mm256_loadu_ps((XB) + (size_t)r * (LDB) + (k - (K0)));                                       \
            __asm__("" : "+x"(xv)); /* in a register: else each FMA loads it again, and loads set the pace */          \
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    if (LAST) {                                                                                                        \
        TILE_END(R, NO, HSUM_TILE, acc, res, XB, LDB, t, trs, k - (K0), K - (K0))                                      \
    } else { /* the next block of inputs goes on from these sums */                                                    \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int o = 0; o < NO; o++) (SAVE)[r * NO + o] = acc[r][o];                                               \
    }
#define TILE_FN(NAME, R, NO, WT, LOAD)                                                                                 \
    AVX2 static void NAME##_##R(TILE_ARGS(WT)) {                                                                       \
        (void)pf;                                                                                                      \
        TILE_BODY(R, NO, WT, LOAD, 0, K & ~7, (__m256 *)NULL, true, true, x, ldx, PREFETCH_AHEAD(R, NO))                \
    }
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
/* One row against ROW_OUTPUTS outputs rs apart, far apart in one_row: no prefetching, which those strides would send
 * past the weights (each of the tile's outputs is one long stream there, which the hardware's prefetchers follow). */
AVX2 static void tile_f32_far(TILE_ARGS(float)) {
    (void)pf;
    TILE_BODY(1, ROW_OUTPUTS, float, load_w, 0, K & ~7, (__m256 *)NULL, true, true, x, ldx, 0)
}

/* AVX2 prefill: a row of tiles of a panel (tile j: outputs [j NO, j NO + NO) from wp's and tp's on, its results
 * at res's column j NO, its sums at save + j R NO) over inputs [k0, k1) (multiples of 8; k1 = K & ~7 last), the
 * accumulators kept in save between blocks: the same lanes, so the same bits as tile_f32's. x: the rows' inputs from
 * k0 on (ldx apart), to K in the last block. One call a row of tiles (a call a tile: 50 thousand calls for one
 * 2304 x 768 Linear at 128 rows). No prefetches: a panel's rows are read whole block by block, streams the
 * hardware's prefetchers follow (without them, one thread of a Zen 3 at 128 rows, rowdot_bench: 0-5% faster). */
#define KTILE_FN(R, NO)                                                                                                \
    AVX2 PREFILL_TILE void ktile_f32_##R(float *res_row, const float *x, size_t ldx, const float *wp, size_t rs,       \
                                         size_t cs, const float *tp, size_t trs, int K, int k0, int k1, __m256 *save,  \
                                         bool first, bool last, int tiles) {                                           \
        for (int j = 0; j < tiles; j++) {                                                                              \
            const float *w = wp + (size_t)j * NO * rs, *t = tp + (size_t)j * NO * trs;                                 \
            float *res = res_row + j * NO;                                                                             \
            __m256 *sv = save + j * R * NO;                                                                            \
            TILE_BODY(R, NO, float, load_w, k0, k1, sv, first, last, x, ldx, 0)                                        \
        }                                                                                                              \
    }
KTILE_FN(2, 3) KTILE_FN(3, 3) KTILE_FN(4, 3) KTILE_FN(5, 2) KTILE_FN(6, 2)
typedef void (*ktile_fn)(float *, const float *, size_t, const float *, size_t, size_t, const float *, size_t, int, int, int,
                         __m256 *, bool, bool, int);
static const ktile_fn ktiles[5] = { ktile_f32_2, ktile_f32_3, ktile_f32_4, ktile_f32_5, ktile_f32_6 };

/* AVX-512, 2-6 rows x 8 outputs: the same eight lanes per output as TILE_BODY, two outputs to a 512-bit register
 * (output o in the low half, o + 1 in the high one, the row's eight inputs broadcast to both), so the sums are
 * the same bits; each instruction does twice the work, which prefill, bound by arithmetic, gains from. R x 4
 * accumulators, 4 weight pairs and one input stay in AVX-512's 32 registers. */
AVX512 static inline __m512 pair_w(const float *a, const float *b) {
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(_mm256_loadu_ps(a))),
                                               _mm256_castps_pd(_mm256_loadu_ps(b)), 1));
}
/* A packed panel's pair of outputs (rs = 8) is 16 elements side by side: one load, no insert (int8 prefill on Zen 4,
 * one thread: 485-488 -> 503-509 tokens/s; f32 no change). */
AVX512 static inline __m512 load16(const float *w) { return _mm512_loadu_ps(w); }
AVX512 static inline __m512 both_halves(const float *x) {
    return _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(_mm256_loadu_ps(x))));
}
#define WIDE_BODY(R, WT, PAIR, LOAD16)                                                                                 \
    enum { NP = WIDE_OUTPUTS / 2 };                                                                                    \
    __m512 acc[R][NP];                                                                                                 \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();                                                  \
    int k = 0;                                                                                                         \
    const WT *wk = w;                                                                                                  \
    for (; k + 8 <= K; k += 8, wk += cs) {                                                                             \
        __m512 wv[NP];                                                                                                 \
        STREAM_AHEAD(wk, pf);                                                                                          \
        if (rs != 8 && !(k * sizeof(WT) & 63)) /* the next tile's rows (6 on, as TILE_BODY's: f32 batch 8 20% slower) */ \
            for (int o = 0; o < WIDE_OUTPUTS; o++)                                                                     \
                _mm_prefetch((const char *)(wk + (size_t)(o + WIDE_OUTPUTS) * rs), _MM_HINT_T0);                       \
        for (int p = 0; p < NP; p++) {                                                                                 \
            wv[p] = rs == 8 ? LOAD16(wk + 16 * p) : PAIR(wk + (size_t)(2 * p) * rs, wk + (size_t)(2 * p + 1) * rs);    \
            __asm__("" : "+v"(wv[p]));                                                                                 \
        }                                                                                                              \
        for (int r = 0; r < R; r++) {                                                                                  \
            __m512 xv = both_halves(x + (size_t)r * ldx + k);                                                          \
            __asm__("" : "+v"(xv));                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_fmadd_ps(xv, wv[p], acc[r][p]);                            \
        }                                                                                                              \
    }                                                                                                                  \
    TILE_END(R, WIDE_OUTPUTS, HSUM_HALF, acc, res, x, ldx, t, trs, k, K)
#define WIDE_FN(NAME, R, WT, PAIR, LOAD16)                                                                             \
    AVX512 PREFILL_TILE void NAME##_##R(TILE_ARGS(WT)) { WIDE_BODY(R, WT, PAIR, LOAD16) }
#define WIDE(NAME, WT, PAIR, L16)                                                                                      \
    WIDE_FN(NAME, 2, WT, PAIR, L16) WIDE_FN(NAME, 3, WT, PAIR, L16) WIDE_FN(NAME, 4, WT, PAIR, L16)                    \
    WIDE_FN(NAME, 5, WT, PAIR, L16) WIDE_FN(NAME, 6, WT, PAIR, L16) WIDE_FN(NAME, 1, WT, PAIR, L16) TILE_SWITCH(NAME, WT)
WIDE(wide_f32, float, pair_w, load16)

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
#define PANEL_FN(NAME, R, NPAIRS, WT, LOAD16)                                                                          \
    AVX512 static void NAME##_##R(float *res, const float *x, size_t ldx, const WT *w, size_t cs, const WT *t, size_t trs, \
                                  int K, int k0, int k1, __m512 *save, bool first, bool last, pf_slice pf) {           \
        enum { NP = NPAIRS };                                                                                          \
        __m512 acc[R][NP];                                                                                             \
        PANEL_LOAD(acc, R, NP, first, save);                                                                           \
        int k = k0;                                                                                                    \
        const WT *wk = w + (size_t)(k0 >> 3) * cs;                                                                     \
        for (; k < k1; k += 8, wk += cs) {                                                                             \
            __m512 xv[R];                                                                                              \
            for (int r = 0; r < R; r++) xv[r] = both_halves(x + (size_t)r * ldx + k);                                  \
            PANEL_PREFETCH(wk, pf);                                                                                    \
            for (int p = 0; p < NP; p++) {                                                                             \
                __m512 wv = LOAD16(wk + 16 * p);                                                                       \
                __asm__("" : "+v"(wv)); /* one load for both rows: two of 64 bytes a product set the pace */           \
                for (int r = 0; r < R; r++) acc[r][p] = _mm512_fmadd_ps(xv[r], wv, acc[r][p]);                         \
            }                                                                                                          \
        }                                                                                                              \
        if (!last) { /* the next block goes on from these sums */                                                      \
            PANEL_SAVE(save, acc, R, NP);                                                                              \
            return;                                                                                                    \
        }                                                                                                              \
        TILE_END(R, 2 * NP, HSUM_HALF, acc, res, x, ldx, t, trs, k, K)                                                 \
    }
PANEL_FN(panel_f32, 1, DT_PANEL / 2, float, load16)
PANEL_FN(panel_f32, 2, DT_PANEL / 2, float, load16)

/* Rows [0, n) (n <= DECODE_ROWS) against one whole packed panel: in blocks of DECODE_KBLOCK inputs when more than
 * one pass is needed, each block by every pair of rows. res [n][RES_LD]. */
static void decode_panel(float *res, const float *x, size_t ldx, const view *v, int n, int K) {
    __m512 save[4 * DT_PANEL]; /* at most 4 passes of 24 accumulators */
    const float *w = v->w, *t = v->t;
    int K8 = K & ~7, kb = n <= 2 || K8 == 0 ? (K8 ? K8 : 8) : DECODE_KBLOCK;
    size_t row = v->cs * sizeof(float); /* bytes of a chunk row */
    size_t block = (size_t)kb / 8 * row;
    int passes = (n + 1) / 2;
    for (int k0 = 0; k0 < K8 || k0 == 0; k0 += kb) {
        int k1 = k0 + kb < K8 ? k0 + kb : K8, pass = 0;
        bool first = k0 == 0, last = k1 == K8;
        __m512 *sv = save;
        for (int r = 0; r < n; r += 2, sv += DT_PANEL, pass++) {
            float *rr = res + (size_t)r * RES_LD;
            const float *xr = x + (size_t)r * ldx;
            pf_slice pf = pass_prefetch(pass, passes, row, block, n == 1 && dt_kernels_hw_stream());
            if (n - r >= 2) panel_f32_2(rr, xr, ldx, w, v->cs, t, v->trs, K, k0, k1, sv, first, last, pf);
            else panel_f32_1(rr, xr, ldx, w, v->cs, t, v->trs, K, k0, k1, sv, first, last, pf);
        }
        if (last) break;
    }
}
#endif

/* One Linear's call: its rows, weights and what goes with them. */
typedef struct {
    const float *x;     /* rows [n][K] */
    const uint16_t *xb; /* int8: the rows rounded to bf16 (rowdot_int8.c) */
    const float *xs;    /* where AVX2 sweeps: the rows (int8's widened to f32 in the spec's order,
                         * dt_rowdot_q8_widen_row), each 64-byte aligned, lds apart */
    size_t lds;
    const void *w;
    const float *scale, *bias; /* scale: int8's per output (NULL in f32) */
    bool packed;
    int n, K, O;
    int level; /* the tiles' path (simd.h): int8 takes AVX2's where it does not multiply bf16 */
} call;

/* Tiles, widest first: [0] the one a block of nr rows is swept in, [1] a narrower one for what is left of a
 * panel; outputs past both go one at a time (T_NONE). AVX-512: more than one row 8 outputs (one row, and a
 * decoding step's rows against whole packed panels, go to decode_panel instead); AVX2: one row 6 outputs (batch 1
 * waits on memory), 2-4 rows 3, 5-6 rows 2. */
typedef enum { T_NONE, T_WIDE, T_AVX2 } tile_kind;
typedef struct { tile_kind kind; int width; } tile_choice;
static void tile_widths(int nr, int level, tile_choice c[2]) {
    tile_choice avx2 = { T_AVX2, nr == 1 ? ROW_OUTPUTS : nr <= 4 ? 3 : 2 }, none = { T_NONE, 1 };
    c[0] = c[1] = none;
    if (level == DT_SIMD_PORTABLE) return;
    c[0] = avx2;
    if (level < DT_SIMD_AVX512) return;
    if (nr > 1) c[0] = (tile_choice){ T_WIDE, WIDE_OUTPUTS };
    if (c[0].kind != T_AVX2) c[1] = avx2;
}

/* A tile of rows [r, r + nr) x outputs [i, i + width) of view v; wb: int8's panel widened to bf16 (T_WIDE). */
static void run_tile(const call *c, tile_kind kind, float *res, int r, const view *v, int i, int nr, bool stream, const void *wb) {
#if HAVE_AVX2_PATH
    size_t K = (size_t)c->K, rs = v->rs, cs = v->cs, trs = v->trs;
    if (c->scale) {
        const int8_t *w = (const int8_t *)v->w + i * rs, *t = (const int8_t *)v->t + i * trs;
        const uint16_t *x = c->xb + (size_t)r * K;
        if (kind == T_WIDE) dt_rowdot_q8_wide(nr, res, x, K, (const uint16_t *)wb + i * rs, cs, t, trs, c->K);
        else dt_rowdot_q8_tile(nr, res, x, K, w, rs, cs, t, trs, c->K);
        return;
    }
    size_t pf = stream && v->packed ? cs * sizeof(float) : 0;
    const float *w = (const float *)v->w + i * rs, *t = (const float *)v->t + i * trs;
    const float *x = c->x + (size_t)r * K;
    if (kind == T_WIDE) wide_f32(nr, res, x, K, w, rs, cs, t, trs, c->K, pf);
    else tile_f32(nr, res, x, K, w, rs, cs, t, trs, c->K, pf);
#else
    (void)c, (void)kind, (void)res, (void)r, (void)v, (void)i, (void)nr, (void)stream, (void)wb;
#endif
}

/* Results res [nr][RES_LD] of rows [r, r + nr) x outputs [o, o + m) into out, scaled (int8) and biased (a missing
 * bias is 0). A loop for each case: in one, the compiler read scale through a masked load when it was NULL, which
 * cost f32 prefill 15% on a Zen 4 (a faulting address, even masked off, takes the slow path). */
static void put(float *out, const float *res, int r, int nr, int o, int m, const float *scale, const float *bias, int O) {
    for (int a = 0; a < nr; a++) {
        const float *s = res + a * RES_LD;
        float *y = out + (size_t)(r + a) * O + o;
        if (scale && bias) for (int j = 0; j < m; j++) y[j] = fmaf(s[j], scale[o + j], bias[o + j]);
        else if (scale) for (int j = 0; j < m; j++) y[j] = fmaf(s[j], scale[o + j], 0.0f);
        else if (bias) for (int j = 0; j < m; j++) y[j] = s[j] + bias[o + j];
        else for (int j = 0; j < m; j++) y[j] = s[j] + 0.0f;
    }
}

/* Rows [r, r + nr) x a view's outputs [i, i + no) (output o0 + i of the whole): tiles where they fit, single dots
 * elsewhere; the same sums either way. first: the panel's first block, whose first tile streams it in. wb: int8's
 * panel widened to bf16 for T_WIDE. */
static void block(const call *c, float *out, const view *v, int r, int nr, int o0, int i, int no, bool first, const void *wb) {
    float res[6 * RES_LD];
    size_t K = (size_t)c->K;
    tile_choice ch[2];
    tile_widths(nr, c->level, ch);
    for (int t = 0, m; t < no; t += m) {
        tile_kind kind = ch[0].width <= no - t ? ch[0].kind : ch[1].width <= no - t ? ch[1].kind : T_NONE;
        m = kind == T_NONE ? 1 : kind == ch[0].kind ? ch[0].width : ch[1].width;
        if (kind != T_NONE) run_tile(c, kind, res, r, v, i + t, nr, first && t == 0, wb);
        else
            for (int a = 0; a < nr; a++)
                res[a * RES_LD] = c->scale ? dt_rowdot_q8_dot(c->xb + (r + a) * K, v, i + t, c->K)
                                           : dot_portable(c->x + (r + a) * K, v, i + t, c->K);
        put(out, res, r, nr, o0 + i + t, m, c->scale, c->bias, c->O);
    }
}

/* int8's panel v widened to f32 at wf (dt_rowdot_q8_widen_f32): a view of it that f32's tiles read in int8's
 * spec's order, against the rows widened the same way (xs): chunks of 8, a chunk of 16's odd inputs then its even
 * ones, so each lane takes the odd product, then the even one; the tail's 16 a row after the panel's K & ~15.
 * f32's tiles end their chunks at K & ~7; sweep_avx2 ends them at int8's K & ~15 itself. */
static inline view widened_view(const float *wf, const view *v, int K) {
    size_t kend = (size_t)(K & ~15);
    return (view){ wf, wf + (size_t)v->pw * kend, kend, 8, 16, v->pw, false };
}

/* Whether a call's groups of rows go through sweep_avx2: AVX2's prefill (int8 without AVX512-BF16 takes AVX2's
 * level), and int8's decoding steps of 7-8 rows, two groups that the panel widened once serves (it was widened 3
 * outputs at a time for f32's 4 x 3 tiles, before sweep_avx2 went over whole rows: Zen 3, SmolLM-135M, batch 8,
 * 130-131 -> 156-163 tokens/s on one thread, 234-251 -> 282-299 on two). f32's 7-8 rows keep block()'s order,
 * which reads each weight from memory once for both groups (through sweep_avx2, the same runs: 135-142 -> 104-110
 * on one thread). */
static bool sweeps(const call *c) { return c->level == DT_SIMD_AVX2 && (c->n > DECODE_ROWS || (c->scale && c->n > 6)); }

#if HAVE_AVX2_PATH
/* AVX2, rows [r, r + nr) (2-6) against a panel's outputs: the rows' inputs a block of PREFILL_KBLOCK at a time,
 * each block against every tile of the panel before the next, so that the rows' block stays in L1 while the panel's
 * weights stream in from L2. The old order (every group of rows by 6 outputs' whole rows: 18 KB of inputs and 18 of
 * weights at K 768, more than L1's 32) read the rows from L2 at its pace (Zen 3, one thread, 124M's four Linears at
 * 128 rows, bench/rowdot_bench, the best of each build, alternating: f32 52-58 -> 62-67 GFLOP/s, int8 41 -> 55-61).
 * The rows come from c->xs, laid out once a call (K floats apart, they fell in the same few sets of L1 at K 3072;
 * lds apart, they do not), where a copy of each block a panel had cost 3-10% (a later Zen 3, the same bench, f32 /
 * int8: 124M's four 70-71 / 65 -> 73-75 / 67, SmolLM-135M's [1536, 576] 68-69 / 62-64 -> 72-74 / 69-70). int8 runs
 * the same tiles on both operands widened exactly to f32 in its spec's order (wf: dt_rowdot_q8_widen_f32, once a
 * panel; the rows in xs, once a call), so its sums are its spec's. Outputs past the last whole tile: block()'s
 * single dots. */
static void sweep_avx2(const call *c, float *out, const view *v, int p, int r, int nr, const float *wf) {
    bool q8 = c->scale != NULL;
    int no = nr <= 4 ? 3 : 2, tiles = v->pw / no, K = c->K, kend = q8 ? K & ~15 : K & ~7;
    __m256 save[DT_PANEL / 2 * 12]; /* a tile's R x NO <= 12 accumulators, for at most DT_PANEL / 2 tiles */
    float res[6 * RES_LD];
    view f = q8 ? widened_view(wf, v, K) : *v;
    const float *x = c->xs + (size_t)r * c->lds, *w = f.w, *t = f.t;
    size_t rs = f.rs, cs = f.cs, trs = f.trs;
    int kb = K <= PREFILL_KWHOLE ? kend : PREFILL_KBLOCK;
    for (int k0 = 0;; k0 += kb) {
        int k1 = k0 + kb < kend ? k0 + kb : kend;
        bool first = k0 == 0, last = k1 == kend;
        ktiles[nr - 2](res, x + k0, c->lds, w, rs, cs, t, trs, K, k0, k1, save, first, last, tiles);
        if (last) {
            put(out, res, r, nr, p * DT_PANEL, tiles * no, c->scale, c->bias, c->O);
            break;
        }
    }
    if (tiles * no < v->pw) block(c, out, v, r, nr, p * DT_PANEL, tiles * no, v->pw - tiles * no, false, NULL);
}
#endif

/* Panels [p0, p1) against rows [0, n): each panel in blocks of its rows' widest tile, by up to 6 rows, swept
 * while a chunk of rows is in cache. wb: room for a panel widened (int8 with more than one row: to bf16 on
 * AVX512-BF16; to f32 and its tails where AVX2 sweeps, where a chunk's groups of rows would each convert it again);
 * else NULL). */
static void rows_range(const call *c, float *out, int p0, int p1, void *wb) {
    bool q8 = c->scale != NULL;
    size_t K = (size_t)c->K;
    int chunk = sweeps(c) ? SWEEP_CHUNK : ROW_CHUNK;
    for (int r0 = 0; r0 < c->n; r0 += chunk) {
        int r1 = r0 + chunk < c->n ? r0 + chunk : c->n;
        /* rows in groups of at most 6, as even as they go (8: 4 + 4, not 6 + 2: a small group converts as many
         * int8 weights as a large one for fewer products); only a chunk of one row has groups of one */
        int g = (r1 - r0 + 5) / 6, base = (r1 - r0) / g, extra = (r1 - r0) % g;
        for (int p = p0; p < p1; p++) {
            view v = panel_view(c->w, q8 ? 1 : sizeof(float), p, c->O, c->K, c->packed);
#if HAVE_AVX2_PATH
            if (c->packed && v.pw == DT_PANEL && r1 - r0 <= DECODE_ROWS && c->level == DT_SIMD_AVX512) {
                float res[DECODE_ROWS * RES_LD];
                if (q8) dt_rowdot_q8_decode(res, c->xb + r0 * K, K, &v, r1 - r0, c->K);
                else decode_panel(res, c->x + r0 * K, K, &v, r1 - r0, c->K);
                put(out, res, r0, r1 - r0, p * DT_PANEL, DT_PANEL, c->scale, c->bias, c->O);
                continue;
            }
            /* AVX2's prefill and int8's 7-8 rows (sweeps; int8: wb has room for the panel in f32 then) */
            if (sweeps(c) && base > 1) {
                if (q8) dt_rowdot_q8_widen_f32(wb, &v, c->K);
                for (int a = 0, r = r0; a < g; r += base + (a < extra), a++) sweep_avx2(c, out, &v, p, r, base + (a < extra), wb);
                continue;
            }
#endif
            tile_choice ch[2];
            tile_widths(base, c->level, ch);
            void *wide = q8 && ch[0].kind == T_WIDE ? wb : NULL; /* once for every group of rows */
#if HAVE_AVX2_PATH
            if (wide) dt_rowdot_q8_widen(wide, &v, c->K);
#endif
            /* AVX2's 2 and 3 both fit in 6, whose weights stay in L1 while every group of rows goes by (int8's
             * decoding steps); one row (no groups to go by), the whole panel at once, in fewer calls */
            int step = ch[0].kind == T_WIDE ? WIDE_OUTPUTS : base == 1 ? DT_PANEL : 6;
            for (int i = 0; i < v.pw; i += step)
                for (int a = 0, r = r0; a < g; r += base + (a < extra), a++)
                    block(c, out, &v, r, base + (a < extra), p * DT_PANEL, i, v.pw - i < step ? v.pw - i : step, i == 0 && a == 0, wide);
        }
    }
}

/* One row against f32 rows in place: tiles, none of the panels' bookkeeping, which cost more than the products at
 * short rows (attention's 64-input keys, before they had their own layout and kernel in attend.c: decoding batch 8
 * after a 512-token prompt went 181-189 -> 201-202 tokens/s in f32 on a Zen 5). AVX-512: tiles of 8 outputs straight
 * along them. AVX2: tile j takes outputs j, j + S, ..., j + 5S (S = O / 6), so that each of its six outputs' rows
 * continues where the last tile's left off and the weights are read as six long streams; six adjacent rows, each a
 * short stream of its own, read at 17-18 GB/s where a plain read runs at 27-28 (a Zen 4 on the AVX2 path, one thread,
 * 124M's rows; stand-alone, the six far apart 28-32 GB/s). The tiles shared among the threads where the row is long
 * enough (an unpacked f32 Linear at batch 1, the AVX2 path's whole decoding, ran on one thread: Zen 3, 124M, 21.5
 * tokens/s on one, 21.0 on two); each output is the same tile's whatever thread runs it and whichever outputs share
 * its tile, so the same sums as every path. */
static void one_row(float *out, const float *x, const float *w, const float *bias, int K, int O) {
    view v = panel_view(w, sizeof(float), 0, O, K, false); /* output o at o * K, as in panel 0 */
    int o = 0;
#if HAVE_AVX2_PATH
    int level = dt_kernels_simd(), tw = level == DT_SIMD_AVX512 ? WIDE_OUTPUTS : level == DT_SIMD_AVX2 ? ROW_OUTPUTS : O + 1;
    int tiles = O / tw;
    size_t far = (size_t)tiles * K; /* AVX2: between a tile's outputs */
    bool threads = (double)K * O >= 65536 && !omp_in_parallel();
    #pragma omp parallel for schedule(static) if (threads)
    for (int j = 0; j < tiles; j++) {
        float res[RES_LD];
        if (level == DT_SIMD_AVX512) {
            const float *wo = w + (size_t)j * tw * K, *to = wo + (K & ~7);
            wide_f32_1(res, x, (size_t)K, wo, (size_t)K, 8, to, (size_t)K, K, 0);
            put(out, res, 0, 1, j * tw, tw, NULL, bias, O);
            continue;
        }
        const float *wo = w + (size_t)j * K, *to = wo + (K & ~7);
        tile_f32_far(res, x, (size_t)K, wo, far, 8, to, far, K, 0);
        for (int q = 0; q < tw; q++) put(out, res + q, 0, 1, j + q * tiles, 1, NULL, bias, O);
    }
    o = tiles * tw;
#endif
    for (; o < O; o++) {
        float s = dot_portable(x, &v, o, K);
        put(out, &s, 0, 1, o, 1, NULL, bias, O);
    }
}

/* One row against int8 rows in place (the AVX2 path's decoding: int8 packs only where AVX512-BF16 multiplies), its
 * outputs far apart as one_row's, for the same reason (124M's head alone, a Zen 4 on the AVX2 path, one thread:
 * rowdot_bench 49152 x 768 at 24 GFLOP/s from memory against 34-47 with the weights in cache). The input rounded to
 * bf16 first (the spec's); the outputs past the last whole tile one at a time. */
static dt_status one_row_q8(float *out, const float *x, const int8_t *w, const float *scale, const float *bias, int K, int O) {
    uint16_t *xb = malloc(sizeof *xb * (size_t)K);
    if (!xb) return dt_error(DT_ERR_NOMEM, "rowdot: out of memory for an int8 [%d, %d] Linear's row in bf16", O, K);
    dt_rowdot_q8_round(xb, x, (size_t)K);
    view v = panel_view(w, 1, 0, O, K, false); /* output o at o * K, as in panel 0 */
    int tiles = O / ROW_OUTPUTS, o = 0;
#if HAVE_AVX2_PATH
    size_t far = (size_t)tiles * K;
    bool threads = (double)K * O >= 65536 && !omp_in_parallel();
    #pragma omp parallel for schedule(static) if (threads)
    for (int j = 0; j < tiles; j++) {
        float res[RES_LD];
        const int8_t *wo = w + (size_t)j * K;
        dt_rowdot_q8_row_far(res, xb, wo, far, wo + (K & ~15), far, K);
        for (int q = 0; q < ROW_OUTPUTS; q++) put(out, res + q, 0, 1, j + q * tiles, 1, scale, bias, O);
    }
    o = tiles * ROW_OUTPUTS;
#endif
    for (; o < O; o++) {
        float s = dt_rowdot_q8_dot(xb, &v, o, K);
        put(out, &s, 0, 1, o, 1, scale, bias, O);
    }
    free(xb);
    return DT_OK;
}

static dt_status rowdot(float *out, const float *x, const void *w, bool packed, const float *scale, const float *bias, int n, int K,
                        int O) {
    int panels = (O + DT_PANEL - 1) / DT_PANEL, simd = dt_kernels_simd();
    if (n == 1 && !packed && !scale) {
        one_row(out, x, w, bias, K, O);
        return DT_OK;
    }
    bool dp = scale && packed && dt_kernels_dpbf16();
    call c = { .x = x, .w = w, .scale = scale, .bias = bias, .packed = packed, .n = n, .K = K, .O = O,
               .level = scale && !dp && simd > DT_SIMD_AVX2 ? DT_SIMD_AVX2 : simd };
    if (n == 1 && !packed && scale && c.level == DT_SIMD_AVX2) return one_row_q8(out, x, w, scale, bias, K, O);
    /* threads only where there is work for them and none are at work already (the results do not depend on it) */
    bool threads = (double)n * K * O >= 65536 && !omp_in_parallel();
    int nt = threads ? omp_get_max_threads() : 1;
    /* int8: its rows in bf16, and a panel's room to widen a thread: to bf16 where tiles of AVX512-BF16 take them, to
     * f32 where AVX2 sweeps, f32's tiles on the rows widened in xs */
    bool sweep = sweeps(&c);
    size_t lds = ((size_t)K + 15) / 16 * 16 + 16; /* rows 64 bytes aligned and a line apart in L1's sets */
    size_t xbn = scale ? (size_t)n * K : 0, panel = (size_t)DT_PANEL * (K & ~15);
    size_t wbytes = dp && n > 1 && (n > DECODE_ROWS || O % DT_PANEL) ? panel * sizeof(uint16_t)
                    : scale && sweep ? (panel + DT_PANEL * 16) * sizeof(float) : 0;
    uint16_t *xb = xbn ? malloc(sizeof(uint16_t) * xbn) : NULL;
    char *wb = wbytes ? malloc(wbytes * (size_t)nt) : NULL;
    float *xs = sweep ? aligned_alloc(64, sizeof(float) * lds * (size_t)n) : NULL;
    if ((xbn && !xb) || (wbytes && !wb) || (sweep && !xs)) {
        free(xb), free(wb), free(xs);
        return dt_error(DT_ERR_NOMEM, "rowdot: out of memory for a [%d, %d] Linear's %d rows", O, K, n);
    }
    /* a row at a time, shared by the threads at prefill (each row's bits its own; rowdot_bench, int8 on two threads of
     * the Zen 3: 81-82 -> 86-87 GFLOP/s in the two pairs the VM held still) */
    #pragma omp parallel for schedule(static) if (threads && n > DECODE_ROWS)
    for (int r = 0; r < (xb || xs ? n : 0); r++) {
        size_t at = (size_t)r * (size_t)K;
        if (xb) dt_rowdot_q8_round(xb + at, x + at, (size_t)K);
        if (xs && xb) dt_rowdot_q8_widen_row(xs + (size_t)r * lds, xb + at, K);
        else if (xs) memcpy(xs + (size_t)r * lds, x + at, sizeof(float) * (size_t)K);
    }
    c.xb = xb, c.xs = xs, c.lds = lds;
    if (!threads) {
        rows_range(&c, out, 0, panels, wb);
    } else {
        #pragma omp parallel for schedule(static)
        for (int p = 0; p < panels; p++) rows_range(&c, out, p, p + 1, wb ? wb + wbytes * (size_t)omp_get_thread_num() : NULL);
    }
    free(xb), free(wb), free(xs);
    return DT_OK;
}

dt_status dt_rowdot_f32(float *out, const float *x, const float *w, const float *bias, int n, int K, int O) {
    return rowdot(out, x, w, false, NULL, bias, n, K, O);
}

dt_status dt_panels_apply(float *out, const float *x, const dt_panels *p, const float *bias, int n) {
    if (p->f) return rowdot(out, x, p->f, p->packed, NULL, bias, n, p->K, p->O);
    return rowdot(out, x, p->q, p->packed, p->scale, bias, n, p->K, p->O);
}
