/* int8 Linears' kernels (rowdot.c dispatches): weights int8 per output
 * channel, activations rounded to bf16, so that where the CPU has
 * AVX512-BF16 one vdpbf16ps does 32 multiply-adds, twice an f32 FMA's (a
 * bf16 times an integer in [-127, 127] is exact in f32: 8 bits by 7). The
 * spec, which every path computes bit for bit:
 * - x rounded to bf16, to nearest even, |x| < 2^-100 to zero: then every
 *   partial sum is a multiple of 2^-107, never subnormal (the instruction
 *   flushes those, fmaf does not);
 * - per output, eight lanes over chunks of 16 inputs, lane j adding input
 *   2j + 1's product, then 2j's, each a fused multiply-add (the instruction's
 *   order and rounding: on a Zen 4, 3.2 million random sums matched it with
 *   no exception, and the other order missed 9% of them);
 * - the lanes in rowdot's fixed tree, then the inputs past K & ~15 one by
 *   one; rowdot.c scales and biases.
 * Without AVX512-BF16, two FMAs a lane (AVX2) or fmaf (portable). */
#include "rowdot.h"
#include "simd.h"

#include <math.h>
#include <string.h>

static inline uint16_t act_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t a = u & 0x7fffffffu, r = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    r = a > 0x7f800000u ? (u >> 16) | 0x40u : r; /* a NaN stays one, quiet */
    return (uint16_t)(a < 0x0d800000u ? 0 : r);
}

static inline float bf16_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

void dt_rowdot_q8_round(uint16_t *xb, const float *x, size_t n) {
    for (size_t i = 0; i < n; i++) xb[i] = act_bf16(x[i]);
}

void dt_rowdot_q8_widen_row(float *xf, const uint16_t *xb, int K) {
    int Kc = K & ~15;
    for (int k = 0; k < Kc; k += 16)
        for (int j = 0; j < 8; j++) {
            xf[k + j] = bf16_f32(xb[k + 2 * j + 1]);
            xf[k + 8 + j] = bf16_f32(xb[k + 2 * j]);
        }
    for (int j = Kc; j < K; j++) xf[j] = bf16_f32(xb[j]);
}

float dt_rowdot_q8_dot(const uint16_t *x, const view *v, int i, int K) {
    const int8_t *w = v->w, *t = v->t;
    float a[8] = { 0 };
    int k = 0;
    for (; k + 16 <= K; k += 16) {
        const int8_t *c = w + (size_t)i * v->rs + (size_t)(k >> 4) * v->cs;
        for (int j = 0; j < 8; j++) {
            a[j] = fmaf(bf16_f32(x[k + 2 * j + 1]), (float)c[2 * j + 1], a[j]);
            a[j] = fmaf(bf16_f32(x[k + 2 * j]), (float)c[2 * j], a[j]);
        }
    }
    float s = tree8(a);
    for (int j = k; j < K; j++) s = fmaf(bf16_f32(x[j]), (float)t[(size_t)i * v->trs + (size_t)(j - k)], s);
    return s;
}

#if HAVE_AVX2_PATH
#define DPBF16 __attribute__((target("avx512f,avx512bf16,avx2,fma")))

/* The sums' end: each accumulator's lanes in the fixed tree, then the tail in the spec's order. */
#define Q8_END(R, NO, SUM, src, res, x, ldx, t, trs, k, K)                                                             \
    for (int r = 0; r < R; r++)                                                                                        \
        for (int o = 0; o < NO; o++) {                                                                                 \
            float s = SUM(src, r, o);                                                                                  \
            for (int j = k; j < K; j++) s = fmaf(bf16_f32(x[(size_t)r * ldx + j]), (float)t[(size_t)o * trs + j - k], s); \
            res[r * RES_LD + o] = s;                                                                                   \
        }

/* A chunk's 16 int8 weights as lanes of inputs 2j + 1 (odd) or 2j (even), and the same of 16 bf16 inputs: a pair
 * is one 32-bit lane, the odd input its high half. Widened to 16 bits once, a pair's high half is its lane shifted
 * down, its low half the lane's multiply-add by (1, 0) (vpmaddwd, sign-extending): five operations for the chunk's
 * 16 weights where widening each half on its own took seven. */
AVX2 static inline __m256i pairs_w(const int8_t *w) {
    return _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)w));
}
AVX2 static inline __m256 odd_of(__m256i pairs) {
    return _mm256_cvtepi32_ps(_mm256_srai_epi32(pairs, 16));
}
AVX2 static inline __m256 even_of(__m256i pairs) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(pairs, _mm256_set1_epi32(1)));
}
/* A chunk's 16 weights for the tiles that widen each weight once (HOLD_X: decoding's one or two rows): its bytes
 * in both halves of a register, and one byte shuffle puts weight 2j + 1 (odd) or 2j (even) at the top of lane j
 * with zeros under it, so the conversion gives w * 2^24 exactly. Against x * 2^-24 (exact: a bf16 input is 0 or
 * at least 2^-100, so never below 2^-124) every product is x * w, the spec's bits. Five operations for both halves,
 * as pairs_w's widening takes, but no sign extension or vpmaddwd: on the 2-core EPYC (Zen 1 class) one row ran
 * 7-10% faster (rowdot_bench); test_infer's range checks hold the scaling to the spec. */
#define TOP_BYTE(b) (char)0x80, (char)0x80, (char)0x80, (char)(b)
#define LANES_OF(s) TOP_BYTE(s), TOP_BYTE((s) + 2), TOP_BYTE((s) + 4), TOP_BYTE((s) + 6)
AVX2 static inline __m256i chunk_both(const int8_t *w) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)w));
}
AVX2 static inline __m256 top_odd(__m256i both) {
    return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(both, _mm256_setr_epi8(LANES_OF(1), LANES_OF(9))));
}
AVX2 static inline __m256 top_even(__m256i both) {
    return _mm256_cvtepi32_ps(_mm256_shuffle_epi8(both, _mm256_setr_epi8(LANES_OF(0), LANES_OF(8))));
}
AVX2 static inline __m256 odd_x(const uint16_t *x) {
    return _mm256_castsi256_ps(_mm256_and_si256(_mm256_loadu_si256((const __m256i *)x), _mm256_set1_epi32((int)0xffff0000u)));
}
AVX2 static inline __m256 even_x(const uint16_t *x) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_loadu_si256((const __m256i *)x), 16));
}

/* AVX2, R rows x NO outputs, each lane's order as the spec's (a chunk's odd product, then its even one). Where R x
 * NO accumulators and the rows' odd and even inputs fit sixteen registers with a chunk's weights (HOLD_X: one row of
 * six outputs, two of three), each output's pairs are widened once and both its products follow; else every odd
 * product of a chunk, then every even one, NO weight vectors widened at a time (each pair widened twice), an input
 * made once for NO outputs. The weights, in place, are prefetched a cache line each at a time, a few rows ahead. */
#define HOLD_X(R, NO) ((R) * (NO) + 2 * (R) + 4 <= 16)
#define HSUM_TILE(acc, r, o) hsum((acc)[r][o])
#define Q8_TILE_FN(NAME, R, NO, AHEAD)                                                                                 \
    AVX2 static void NAME(float *res, const uint16_t *x, size_t ldx, const int8_t *w, size_t rs, size_t cs,    \
                                 const int8_t *t, size_t trs, int K) {                                                 \
        __m256 acc[R][NO];                                                                                             \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int o = 0; o < NO; o++) acc[r][o] = _mm256_setzero_ps();                                              \
        int k = 0;                                                                                                     \
        const int8_t *wk = w;                                                                                          \
        for (; k + 16 <= K; k += 16, wk += cs) {                                                                       \
            if ((AHEAD) && !(k & 63)) /* AHEAD outputs on (0: none) */                                                 \
                for (int o = 0; o < NO; o++)                                                                           \
                    _mm_prefetch((const char *)(wk + (size_t)(o + (AHEAD)) * rs), _MM_HINT_T0);                        \
            if (HOLD_X(R, NO)) {                                                                                       \
                __m256 xo[R], xe[R];                                                                                   \
                const __m256 down = _mm256_set1_ps(0x1p-24f);                                                          \
                for (int r = 0; r < R; r++)                                                                            \
                    xo[r] = _mm256_mul_ps(odd_x(x + (size_t)r * ldx + k), down),                                       \
                    xe[r] = _mm256_mul_ps(even_x(x + (size_t)r * ldx + k), down);                                      \
                for (int o = 0; o < NO; o++) {                                                                         \
                    __m256i b = chunk_both(wk + (size_t)o * rs);                                                       \
                    __m256 wo = top_odd(b), we = top_even(b);                                                          \
                    for (int r = 0; r < R; r++) acc[r][o] = _mm256_fmadd_ps(xe[r], we, _mm256_fmadd_ps(xo[r], wo, acc[r][o])); \
                }                                                                                                      \
            } else {                                                                                                   \
                __m256 wv[NO];                                                                                         \
                for (int o = 0; o < NO; o++) wv[o] = odd_of(pairs_w(wk + (size_t)o * rs));                             \
                for (int r = 0; r < R; r++) {                                                                          \
                    __m256 xv = odd_x(x + (size_t)r * ldx + k);                                                        \
                    for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                    \
                }                                                                                                      \
                for (int o = 0; o < NO; o++) wv[o] = even_of(pairs_w(wk + (size_t)o * rs));                            \
                for (int r = 0; r < R; r++) {                                                                          \
                    __m256 xv = even_x(x + (size_t)r * ldx + k);                                                       \
                    for (int o = 0; o < NO; o++) acc[r][o] = _mm256_fmadd_ps(xv, wv[o], acc[r][o]);                    \
                }                                                                                                      \
            }                                                                                                          \
        }                                                                                                              \
        Q8_END(R, NO, HSUM_TILE, acc, res, x, ldx, t, trs, k, K)                                                       \
    }
#define Q8_TILE(R, NO) Q8_TILE_FN(q8_tile_##R, R, NO, PREFETCH_AHEAD(R, NO))
Q8_TILE(1, ROW_OUTPUTS) Q8_TILE(2, 3) Q8_TILE(3, 3) Q8_TILE(4, 3) Q8_TILE(5, 2) Q8_TILE(6, 2)
/* one row against outputs far apart (rowdot.c's one_row_q8): the hardware's prefetchers follow their long streams */
Q8_TILE_FN(q8_tile_far, 1, ROW_OUTPUTS, 0)

typedef void (*q8_tile_fn)(float *, const uint16_t *, size_t, const int8_t *, size_t, size_t, const int8_t *, size_t, int);
static const q8_tile_fn q8_tiles[6] = { q8_tile_1, q8_tile_2, q8_tile_3, q8_tile_4, q8_tile_5, q8_tile_6 };

void dt_rowdot_q8_tile(int R, float *res, const uint16_t *x, size_t ldx, const int8_t *w, size_t rs, size_t cs, const int8_t *t,
                       size_t trs, int K) {
    q8_tiles[R >= 1 && R <= 6 ? R - 1 : 0](res, x, ldx, w, rs, cs, t, trs, K);
}

void dt_rowdot_q8_row_far(float *res, const uint16_t *x, const int8_t *w, size_t rs, const int8_t *t, size_t trs, int K) {
    q8_tile_far(res, x, (size_t)K, w, rs, 16, t, trs, K);
}

AVX2 void dt_rowdot_q8_widen_f32(float *wf, const view *v, int K) {
    size_t Kc = (size_t)(K & ~15);
    for (int o = 0; o < v->pw; o++) {
        for (size_t k = 0; k < Kc; k += 16) {
            const int8_t *w = (const int8_t *)v->w + (size_t)o * v->rs + k / 16 * v->cs;
            __m256i p = pairs_w(w);
            _mm256_storeu_ps(wf + (size_t)o * Kc + k, odd_of(p));
            _mm256_storeu_ps(wf + (size_t)o * Kc + k + 8, even_of(p));
        }
        const int8_t *t = (const int8_t *)v->t + (size_t)o * v->trs;
        for (size_t j = 0; j < (size_t)K - Kc; j++) wf[(size_t)v->pw * Kc + (size_t)o * 16 + j] = (float)t[j];
    }
}

/* 16 bf16 inputs in both halves of a register: against a pair of outputs' chunks, output 2p in the low half. */
AVX512 static inline __m512i both_halves16(const uint16_t *x) {
    return _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)x));
}

DPBF16 void dt_rowdot_q8_widen(uint16_t *wb, const view *v, int K) {
    const int8_t *w = v->w;
    size_t n = (size_t)(K & ~15) * (size_t)v->pw; /* a multiple of 16 */
    for (size_t i = 0; i < n; i += 16) {
        __m512 f = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + i))));
        _mm256_storeu_si256((__m256i *)(wb + i), (__m256i)_mm512_cvtneps_pbh(f)); /* integers: exact */
    }
}

/* Prefill, R rows x 8 outputs of a panel widened to bf16 (each weight widened once for all its rows): one
 * instruction a row and pair of outputs per 16 inputs. R x 4 accumulators, 4 weight pairs and an input. */
#define Q8_WIDE_FN(R)                                                                                                  \
    DPBF16 PREFILL_TILE void q8_wide_##R(float *res, const uint16_t *x, size_t ldx, const uint16_t *wb, size_t cs,     \
                                   const int8_t *t, size_t trs, int K) {                                               \
        enum { NP = WIDE_OUTPUTS / 2 };                                                                                \
        __m512 acc[R][NP];                                                                                             \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();                                              \
        int k = 0;                                                                                                     \
        const uint16_t *wk = wb;                                                                                       \
        for (; k + 16 <= K; k += 16, wk += cs) {                                                                       \
            __m512i wv[NP];                                                                                            \
            for (int p = 0; p < NP; p++) {                                                                             \
                wv[p] = _mm512_loadu_si512(wk + 32 * p);                                                               \
                __asm__("" : "+v"(wv[p])); /* in a register: else each product loads it again */                       \
            }                                                                                                          \
            for (int r = 0; r < R; r++) {                                                                              \
                __m512i xv = both_halves16(x + (size_t)r * ldx + k);                                                   \
                __asm__("" : "+v"(xv));                                                                                \
                for (int p = 0; p < NP; p++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], (__m512bh)xv, (__m512bh)wv[p]);   \
            }                                                                                                          \
        }                                                                                                              \
        Q8_END(R, WIDE_OUTPUTS, HSUM_HALF, acc, res, x, ldx, t, trs, k, K)                                             \
    }
Q8_WIDE_FN(1)
Q8_WIDE_FN(2)
Q8_WIDE_FN(3)
Q8_WIDE_FN(4)
Q8_WIDE_FN(5)
Q8_WIDE_FN(6)

void dt_rowdot_q8_wide(int R, float *res, const uint16_t *x, size_t ldx, const uint16_t *wb, size_t cs, const int8_t *t, size_t trs,
                       int K) {
    switch (R) {
    case 6: q8_wide_6(res, x, ldx, wb, cs, t, trs, K); break;
    case 5: q8_wide_5(res, x, ldx, wb, cs, t, trs, K); break;
    case 4: q8_wide_4(res, x, ldx, wb, cs, t, trs, K); break;
    case 3: q8_wide_3(res, x, ldx, wb, cs, t, trs, K); break;
    case 2: q8_wide_2(res, x, ldx, wb, cs, t, trs, K); break;
    default: q8_wide_1(res, x, ldx, wb, cs, t, trs, K);
    }
}

/* Decoding, R rows against NPAIRS pairs of a packed panel's outputs, each pair's 32 weights of a chunk widened
 * to bf16 in registers once for the R rows (8 rows a quarter panel at a time: 1.5x the multiply-adds a second of
 * 4 rows a half panel twice, in a loop of the kernel alone on a Zen 4); otherwise as rowdot.c's PANEL_FN, over all
 * of K in one go; pf what the pass prefetches. */
DPBF16 static inline __m512bh widen_pair(const int8_t *w) {
    __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)w)));
    __m512 hi = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(w + 16))));
    return _mm512_cvtne2ps_pbh(hi, lo); /* lo in the low half */
}
#define Q8_PANEL_FN(R, NPAIRS)                                                                                         \
    DPBF16 static void q8_panel_##R(float *res, const uint16_t *x, size_t ldx, const int8_t *w, size_t cs, const int8_t *t, \
                                    size_t trs, int K, pf_slice pf) {                                                  \
        enum { NP = NPAIRS };                                                                                          \
        __m512 acc[R][NP];                                                                                             \
        for (int r = 0; r < R; r++)                                                                                    \
            for (int p = 0; p < NP; p++) acc[r][p] = _mm512_setzero_ps();                                              \
        int k = 0;                                                                                                     \
        const int8_t *wk = w;                                                                                          \
        for (; k + 16 <= K; k += 16, wk += cs) {                                                                       \
            __m512i xv[R];                                                                                             \
            for (int r = 0; r < R; r++) xv[r] = both_halves16(x + (size_t)r * ldx + k);                                \
            PANEL_PREFETCH(wk, pf);                                                                                    \
            for (int p = 0; p < NP; p++) {                                                                             \
                __m512bh wv = widen_pair(wk + 32 * p);                                                                 \
                for (int r = 0; r < R; r++) acc[r][p] = _mm512_dpbf16_ps(acc[r][p], (__m512bh)xv[r], wv);              \
            }                                                                                                          \
        }                                                                                                              \
        Q8_END(R, 2 * NP, HSUM_HALF, acc, res, x, ldx, t, trs, k, K)                                                   \
    }
Q8_PANEL_FN(1, DT_PANEL / 2)
Q8_PANEL_FN(2, DT_PANEL / 2)
Q8_PANEL_FN(4, DT_PANEL / 4)
Q8_PANEL_FN(8, DT_PANEL / 8)

/* One row against a whole panel, a chunk's 16 weights of 4 outputs (64 bytes) widened by table at a time: bf16(|w|)'s
 * two bytes looked up (vpermi2b, |w| <= 127), w's sign put back, the bytes interleaved into words. The unpacks
 * interleave within each 128-bit lane, so register a holds inputs 0-7 of the 4 outputs (the spec's lanes 0-3 of
 * output 4g + L in 128-bit lane L) and b inputs 8-15 (lanes 4-7), against the row's inputs 0-7 and 8-15 in every
 * lane. Six instructions for 64 weights where widen_pair takes ten: batch 1 waits on the widening (from L1, on a
 * Zen 4, 9.6 ns a chunk row of 24 outputs against 15.7). Not for more rows: with 8 the table was slower (the
 * lookups cost more than the instructions they save once 16 products share them). */
#define DPBF16_VBMI __attribute__((target("avx512f,avx512bw,avx512vbmi,avx512bf16,avx2,fma")))
#define BF16_EXP(m) ((m) >= 64 ? 6 : (m) >= 32 ? 5 : (m) >= 16 ? 4 : (m) >= 8 ? 3 : (m) >= 4 ? 2 : (m) >= 2 ? 1 : 0)
#define BF16_OF(m) ((m) == 0 ? 0 : ((127 + BF16_EXP(m)) << 7) | (((m) << (7 - BF16_EXP(m))) & 0x7f)) /* m < 128: exact */
#define BF16_LO(m) (uint8_t)(BF16_OF(m) & 0xff)
#define BF16_HI(m) (uint8_t)(BF16_OF(m) >> 8)
#define T4(F, b) F(b), F((b) + 1), F((b) + 2), F((b) + 3)
#define T16(F, b) T4(F, b), T4(F, (b) + 4), T4(F, (b) + 8), T4(F, (b) + 12)
#define T128(F) T16(F, 0), T16(F, 16), T16(F, 32), T16(F, 48), T16(F, 64), T16(F, 80), T16(F, 96), T16(F, 112)
static const uint8_t bf16_lo[128] __attribute__((aligned(64))) = { T128(BF16_LO) };
static const uint8_t bf16_hi[128] __attribute__((aligned(64))) = { T128(BF16_HI) };

DPBF16_VBMI static inline void widen_quad(const int8_t *w, const __m512i tab[4], __m512bh *a, __m512bh *b) {
    __m512i v = _mm512_loadu_si512(w), m = _mm512_abs_epi8(v);
    __m512i lo = _mm512_permutex2var_epi8(tab[0], m, tab[1]), hi = _mm512_permutex2var_epi8(tab[2], m, tab[3]);
    hi = _mm512_ternarylogic_epi32(hi, v, _mm512_set1_epi8((char)0x80), 0xf8); /* hi | (v & 0x80) */
    *a = (__m512bh)_mm512_unpacklo_epi8(lo, hi);
    *b = (__m512bh)_mm512_unpackhi_epi8(lo, hi);
}

/* Output o's lanes: 0-3 in a's 128-bit lane o % 4, 4-7 in b's, summed in rowdot's tree. */
static inline float quad_sum(const float *a, const float *b, int o) {
    float l[8];
    memcpy(l, a + 4 * (o % 4), 4 * sizeof *l);
    memcpy(l + 4, b + 4 * (o % 4), 4 * sizeof *l);
    return tree8(l);
}

DPBF16_VBMI static void q8_quad_1(float *res, const uint16_t *x, const int8_t *w, size_t cs, const int8_t *t, size_t trs, int K,
                                  pf_slice pf) {
    enum { NG = DT_PANEL / 4 };
    const __m512i tab[4] = { _mm512_load_si512(bf16_lo), _mm512_load_si512(bf16_lo + 64), _mm512_load_si512(bf16_hi),
                             _mm512_load_si512(bf16_hi + 64) };
    __m512 acc[2 * NG];
    for (int g = 0; g < 2 * NG; g++) acc[g] = _mm512_setzero_ps();
    int k = 0;
    const int8_t *wk = w;
    for (; k + 16 <= K; k += 16, wk += cs) {
        __m512i xa = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x + k)));
        __m512i xb = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)(x + k + 8)));
        PANEL_PREFETCH(wk, pf);
        for (int g = 0; g < NG; g++) {
            __m512bh a, b;
            widen_quad(wk + 64 * g, tab, &a, &b);
            acc[2 * g] = _mm512_dpbf16_ps(acc[2 * g], (__m512bh)xa, a);
            acc[2 * g + 1] = _mm512_dpbf16_ps(acc[2 * g + 1], (__m512bh)xb, b);
        }
    }
    float lanes[2 * NG][16];
    for (int g = 0; g < 2 * NG; g++) _mm512_storeu_ps(lanes[g], acc[g]);
    const size_t ldx = 0; /* one row */
    enum { R = 1 };
#define HSUM_QUAD(lanes, r, o) quad_sum((lanes)[2 * ((o) / 4)], (lanes)[2 * ((o) / 4) + 1], (o))
    Q8_END(R, DT_PANEL, HSUM_QUAD, lanes, res, x, ldx, t, trs, k, K)
#undef HSUM_QUAD
}

/* Rows in passes of 8 (four quarter panels), then 4 (two halves), then pairs and one (rowdot.c's decode_panel, in
 * int8), each pass over all of K: f32's blocks of 256 inputs, which later passes find in L1, cost int8 more in
 * saving and restoring the accumulators at every block than they gave (a Zen 4, 124M, batch 8, one thread: 382-385
 * -> 412-433 tokens/s; a Linear of 8 rows from L2 1.85-1.95 -> 2.12-2.45 vdpbf16ps a ns; blocks of 768 or 1024 the
 * same within noise). The block pass_prefetch's later passes look ahead by is then the whole panel. */
DPBF16 void dt_rowdot_q8_decode(float *res, const uint16_t *x, size_t ldx, const view *v, int n, int K) {
    const int8_t *w = v->w, *t = v->t;
    int Kc = K & ~15, r = 0, pass = 0;
    size_t row = v->cs, panel = (size_t)Kc / 16 * row, trs = v->trs;
    int passes = n / 8 * 4 + n % 8 / 4 * 2 + (n % 4 + 1) / 2;
    bool vbmi = n == 1 && dt_kernels_vbmi();
    for (; n - r >= 8; r += 8)
        for (int q = 0, o = 0; q < 4; q++, o += DT_PANEL / 4, pass++)
            q8_panel_8(res + (size_t)r * RES_LD + o, x + (size_t)r * ldx, ldx, w + (size_t)o * 16, v->cs, t + (size_t)o * trs, trs, K,
                       pass_prefetch(pass, passes, row, panel, false));
    for (; n - r >= 4; r += 4)
        for (int h = 0, o = 0; h < 2; h++, o += DT_PANEL / 2, pass++)
            q8_panel_4(res + (size_t)r * RES_LD + o, x + (size_t)r * ldx, ldx, w + (size_t)o * 16, v->cs, t + (size_t)o * trs, trs, K,
                       pass_prefetch(pass, passes, row, panel, false));
    for (; r < n; r += 2, pass++) {
        pf_slice pf = pass_prefetch(pass, passes, row, panel, n <= 2 && dt_kernels_hw_stream());
        if (n - r >= 2) q8_panel_2(res + (size_t)r * RES_LD, x + (size_t)r * ldx, ldx, w, v->cs, t, trs, K, pf);
        else if (vbmi) q8_quad_1(res, x, w, v->cs, t, trs, K, pf);
        else q8_panel_1(res + (size_t)r * RES_LD, x + (size_t)r * ldx, ldx, w, v->cs, t, trs, K, pf);
    }
}
#endif
