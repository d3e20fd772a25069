/* The arithmetic's ceiling for inference's kernels: twelve independent
 * chains of multiply-adds in registers (more than the pipes' latency times
 * their number), no memory, at the vector width those kernels use
 * (dt_kernels_simd), and for int8's products those of vdpbf16ps where
 * they use it. A BLAS's sgemm is no measure of it: one built for 256-bit
 * vectors runs at half an AVX-512 core's rate. */
#include "simd.h"

#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#define CHAINS(V, SET, FMA)                                                                                            \
    V a0 = SET(1), a1 = SET(2), a2 = SET(3), a3 = SET(4), a4 = SET(5), a5 = SET(6), a6 = SET(7), a7 = SET(8);         \
    V a8 = SET(9), a9 = SET(10), a10 = SET(11), a11 = SET(12), m = SET(0.999999f), c = SET(1e-7f);                    \
    for (long i = 0; i < reps; i++) {                                                                                  \
        a0 = FMA(a0, m, c), a1 = FMA(a1, m, c), a2 = FMA(a2, m, c), a3 = FMA(a3, m, c), a4 = FMA(a4, m, c);           \
        a5 = FMA(a5, m, c), a6 = FMA(a6, m, c), a7 = FMA(a7, m, c), a8 = FMA(a8, m, c), a9 = FMA(a9, m, c);           \
        a10 = FMA(a10, m, c), a11 = FMA(a11, m, c);                                                                    \
    }                                                                                                                  \
    V s = a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;

#define SCALAR(x) ((float)(x))
static float chains1(long reps) {
    CHAINS(float, SCALAR, fmaf)
    return s;
}
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static float chains16(long reps) {
    CHAINS(__m512, _mm512_set1_ps, _mm512_fmadd_ps)
    return _mm512_reduce_add_ps(s);
}
/* int8 Linears' products where they are bf16 pairs (dt_kernels_dpbf16): 32 multiply-adds an instruction */
#define DP(a, m, c) _mm512_dpbf16_ps(a, (__m512bh)_mm512_castps_si512(m), (__m512bh)_mm512_castps_si512(c))
/* x's bf16 in both halves of each lane: a pair of finite bf16 values (x's own low half could be a NaN's) */
__attribute__((target("avx512f"))) static inline __m512 bf16_pair(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return _mm512_castsi512_ps(_mm512_set1_epi32((int)((u & 0xffff0000u) | u >> 16)));
}
__attribute__((target("avx512f,avx512bf16"))) static float chains_dp(long reps) {
    CHAINS(__m512, bf16_pair, DP)
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2,fma"))) static float chains8(long reps) {
    CHAINS(__m256, _mm256_set1_ps, _mm256_fmadd_ps)
    return s[0];
}
#endif

static double peak(int threads, bool dp) {
    int level = dt_kernels_simd(), lanes = level == DT_SIMD_AVX512 ? 16 : level == DT_SIMD_AVX2 ? 8 : 1;
    long reps = 20000000 / lanes / (dp ? 2 : 1) + 1; /* 20-30 ms a try on a vector core */
    double t[5];
    float sink = 0;
    if (threads < 1) threads = 1;
    for (int k = 0; k < 5; k++) {
        double t0 = dt_time_now();
        #pragma omp parallel for num_threads(threads) reduction(+ : sink)
        for (int th = 0; th < threads; th++) {
#if defined(__x86_64__) && defined(__GNUC__)
            sink += dp ? chains_dp(reps) : lanes == 16 ? chains16(reps) : lanes == 8 ? chains8(reps) : chains1(reps);
#else
            sink += chains1(reps);
#endif
        }
        t[k] = 2.0 * 12 * lanes * (dp ? 2 : 1) * (double)reps * threads / (dt_time_now() - t0) / 1e9;
    }
    return sink == sink ? dt_median(t, 5) : 0; /* the sums are used, so the chains run */
}

double dt_kernels_fma_peak(int threads) { return peak(threads, false); }

double dt_kernels_int8_peak(int threads) {
#if defined(__x86_64__) && defined(__GNUC__)
    if (dt_kernels_dpbf16()) return peak(threads, true);
#endif
    return peak(threads, false);
}
