/* What rowdot.c (the Linear's dispatch and its f32 kernels) and
 * rowdot_int8.c (int8's kernels) share: a panel's view, the lanes' fixed
 * tree, the tiles' sizes, and how decoding passes prefetch. Internal to
 * src/kernels. */
#ifndef DT_KERNELS_ROWDOT_H
#define DT_KERNELS_ROWDOT_H

#include "panels.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

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
#define DECODE_ROWS 8
/* inputs: 24 KB of a panel in f32, which L1 holds (f32 batch 4-8 3-6% faster than whole panels a pass; int8 runs
 * its passes over all of K, dt_rowdot_q8_decode) */
#define DECODE_KBLOCK 256
/* AVX2 prefill's block of inputs (rowdot.c's sweep_avx2; a multiple of 16, int8's chunk): 6 rows' 9 KB, in L1
 * while a panel streams by (Zen 3, 124M's Linears at 128 rows: 192 and 256 slower, 512 no faster), where K is
 * longer than PREFILL_KWHOLE; to that, the whole of K at once, no sums saved between blocks (a later Zen 3, one
 * thread, 128 rows, rowdot_bench: K 576 and 768 3-7% faster than in blocks of 384; blocks of 768 at K 1536 and
 * 3072 8-9% slower). SWEEP_CHUNK: prefill's rows a chunk (ROW_CHUNK elsewhere): its rows are read block by block
 * from L2 or L3 whatever their number, and each chunk reads a panel from memory again and int8 widens it again
 * (at 128 rows, chunks of 60 and of 132: int8 3-7% faster, f32 0-3%). */
#define PREFILL_KBLOCK 384
#define PREFILL_KWHOLE 768
#define SWEEP_CHUNK 132

/* One panel's weights (panels.h), packed or in place: output i's chunk of c inputs at k (c: dt_panel_chunk) is
 * at w + i * rs + (k / c) * cs, its tail (k >= K & ~(c - 1)) at t + i * trs + k - (K & ~(c - 1)); elements, not
 * bytes. */
typedef struct {
    const void *w, *t;
    size_t rs, cs, trs;
    int pw;      /* outputs in the panel */
    bool packed; /* packed (rs = c) or in place */
} view;

static inline view panel_view(const void *base, size_t esize, int p, int O, int K, bool packed) {
    int c = dt_panel_chunk(esize == 1), pw = O - p * DT_PANEL < DT_PANEL ? O - p * DT_PANEL : DT_PANEL, Kc = K & ~(c - 1);
    const char *b = (const char *)base + (size_t)p * DT_PANEL * K * esize;
    if (packed) return (view){ b, b + (size_t)Kc * pw * esize, (size_t)c, (size_t)pw * c, (size_t)(K - Kc), pw, true };
    return (view){ b, b + (size_t)Kc * esize, (size_t)K, (size_t)c, (size_t)K, pw, false };
}

/* The lanes' fixed tree: ((l0+l4)+(l2+l6)) + ((l1+l5)+(l3+l7)). */
static inline float tree8(const float *a) {
    float b0 = a[0] + a[4], b1 = a[1] + a[5], b2 = a[2] + a[6], b3 = a[3] + a[7];
    return (b0 + b2) + (b1 + b3);
}

/* What a pass prefetches of each chunk row it reads: bytes [lo, hi) of the one ahead bytes on, into L1 or only L2. */
typedef struct {
    size_t ahead, lo, hi;
    bool l2;
} pf_slice;

/* What pass i of a block's passes prefetches (row: bytes of a chunk row, block: of a block). The first streams the
 * block in, PANEL_AHEAD on, unless hw: on AMD's CPUs (dt_kernels_hw_stream), one f32 row, or int8's one pass (one
 * or two rows), leave that to the hardware's prefetchers, which keep pace with a single stream of full
 * cache lines there (its own prefetches cost f32 3%: Zen 5, 124M, one thread: 71.0 -> 73.5 tokens/s, four
 * alternating pairs; 0.89-0.93 -> 0.93-0.96 of a plain read of the same bytes; int8 one row on a Zen 4, 139-140 ->
 * 150-151 tokens/s, two rows 214-220 -> 222-224). With more than two passes, the others
 * share the block after next between them (above), and the first, finding its block in L2, streams only 4 KB on (Zen
 * 4, 124M, batch 8, one thread, builds alternating: the next block and 8 KB, f32 202-211 tokens/s, int8 237-255;
 * these, 228-237 and 270-273; one block on with 4 KB or two with 8 KB were between; batch 6 no change). */
static inline pf_slice pass_prefetch(int i, int passes, size_t row, size_t block, bool hw) {
    size_t lines = row / 64;
    if (i == 0) return (pf_slice){ passes > 2 ? PANEL_AHEAD / 2 : PANEL_AHEAD, 0, hw ? 0 : row, false };
    if (passes <= 2) return (pf_slice){ 0, 0, 0, false };
    size_t others = (size_t)passes - 1;
    return (pf_slice){ 2 * block, lines * (size_t)(i - 1) / others * 64, lines * (size_t)i / others * 64, true };
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_AVX2_PATH 1
#define AVX2 __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))
/* A prefill tile: never inlined (into rows_range, f32 prefill on a Zen 4, one thread: 484-487 tokens/s noinline,
 * 467-468 inlined; the decoding panels, left to the compiler, inline into their caller and are no slower) */
#define PREFILL_TILE static __attribute__((noinline))

AVX2 static inline float hsum(__m256 v) {
    __m128 b = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)); /* b_j = l_j + l_{j+4} */
    __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));                                 /* b0+b2, b1+b3 */
    return _mm_cvtss_f32(_mm_add_ss(c, _mm_shuffle_ps(c, c, 1)));
}

/* One accumulator's half: output 2p in the low half, 2p + 1 in the high one. */
#define HALF(v, hi)                                                                                                    \
    _mm256_castpd_ps((hi) ? _mm512_extractf64x4_pd(_mm512_castps_pd(v), 1) : _mm512_castpd512_pd256(_mm512_castps_pd(v)))
/* Output o of row r from accumulators acc[R][o / 2] that hold two outputs each (o in the low half when even) */
#define HSUM_HALF(acc, r, o) hsum(HALF((acc)[r][(o) / 2], (o) % 2))
/* A decoding panel's pieces (rowdot.c's PANEL_FN; int8's Q8_PANEL_FN, one block, only prefetches): its R x NP
 * accumulators acc taken from save (zeros when first); what the pass prefetches of the chunk row at wk (pf_slice);
 * the accumulators kept in save for the next block */
#define PANEL_LOAD(acc, R, NP, first, save)                                                                            \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int p = 0; p < NP; p++) (acc)[r][p] = (first) ? _mm512_setzero_ps() : (save)[r * NP + p]
#define PANEL_PREFETCH(wk, pf)                                                                                         \
    for (size_t b_ = (pf).lo; b_ < (pf).hi; b_ += 64) /* the hint is an immediate */                                   \
        if ((pf).l2) _mm_prefetch((const char *)(wk) + (pf).ahead + b_, _MM_HINT_T1);                                  \
        else _mm_prefetch((const char *)(wk) + (pf).ahead + b_, _MM_HINT_T0)
#define PANEL_SAVE(save, acc, R, NP)                                                                                   \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int p = 0; p < NP; p++) (save)[r * NP + p] = (acc)[r][p]
#else
#define HAVE_AVX2_PATH 0
#endif

/* int8 (rowdot_int8.c, whose head gives the spec): x rounded to bf16 per row, then each path's products. Results of
 * tiles and panels go to res [rows][RES_LD], before the scale and bias. */
void dt_rowdot_q8_round(uint16_t *xb, const float *x, size_t n);
float dt_rowdot_q8_dot(const uint16_t *x, const view *v, int i, int K);
/* AVX2: R (1-6) rows (ldx apart) x NO outputs from w's on (NO: ROW_OUTPUTS for one row, 3 for 2-4, 2 for 5-6) */
void dt_rowdot_q8_tile(int R, float *res, const uint16_t *x, size_t ldx, const int8_t *w, size_t rs, size_t cs, const int8_t *t,
                       size_t trs, int K);
/* AVX2: one row x ROW_OUTPUTS outputs rs apart (rows in place, chunks 16 apart), without prefetching (rowdot.c's
 * one_row_q8, whose outputs are far apart) */
void dt_rowdot_q8_row_far(float *res, const uint16_t *x, const int8_t *w, size_t rs, const int8_t *t, size_t trs, int K);
/* AVX2 prefill, whose int8 runs f32's tiles (rowdot.c's sweep_avx2) on both operands widened to f32, exactly: a
 * panel's weights once (wf [pw][K & ~15]: each chunk's 8 odd inputs' weights, then its 8 even ones', in the spec's
 * order; then the tails, [pw][16], in order), and a row in bf16, xb [K], the same way into xf [K] (each chunk's 8
 * odd inputs, then its 8 even ones; the inputs past K & ~15 in order). */
void dt_rowdot_q8_widen_f32(float *wf, const view *v, int K);
void dt_rowdot_q8_widen_row(float *xf, const uint16_t *xb, int K);
/* AVX512-BF16 (dt_kernels_dpbf16): a packed panel's chunks widened to bf16 ([K / 16][pw][16] int8 -> wb), then
 * R (1-6) rows x WIDE_OUTPUTS outputs of them from wb's on (cs: a chunk row's elements) */
void dt_rowdot_q8_widen(uint16_t *wb, const view *v, int K);
void dt_rowdot_q8_wide(int R, float *res, const uint16_t *x, size_t ldx, const uint16_t *wb, size_t cs, const int8_t *t, size_t trs,
                       int K);
/* AVX512-BF16: rows [0, n) (n <= DECODE_ROWS) against one whole packed panel, each weight widened in registers */
void dt_rowdot_q8_decode(float *res, const uint16_t *x, size_t ldx, const view *v, int n, int K);

#endif
