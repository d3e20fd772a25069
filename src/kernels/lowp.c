/* Low-precision storage (bf16, f16) for mixed-precision training: packing
 * f32 values into 16 bits and back, and rounding f32 values in place to what
 * 16 bits can hold; and int8 with an absmax scale (int8 weights, the
 * pipeline's int8 wire). Compute stays in f32: a value that went through a
 * 16-bit tensor is an f32 holding a 16-bit value, so f32 arithmetic on it is
 * exactly what a 16-bit kernel with f32 accumulation does. */
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

#if defined(__F16C__) || defined(__AVX2__)
#include <immintrin.h>
#endif

/* bf16 values rounded in f32 (dt_f32_to_bf16 rounds to nearest even). Up to
 * ONE_THREAD values a call run on the calling thread without entering a
 * parallel region (see pack_bf16). */
enum { ONE_THREAD = 65536 };
static inline float bf16_round(float x) { return dt_bf16_to_f32(dt_f32_to_bf16(x)); }

/* One thread's bf16 loops: a parallel region, even one that an if clause keeps to this thread, costs about 200 ns a
 * call, as much as packing a thousand values (the in-place loops below call these a block at a time) */
static void pack_bf16(uint16_t *restrict dst, const float *restrict src, size_t n) {
    #pragma omp simd
    for (size_t j = 0; j < n; j++) dst[j] = dt_f32_to_bf16(src[j]);
}

static void unpack_bf16(float *restrict dst, const uint16_t *restrict src, size_t n) {
    #pragma omp simd
    for (size_t j = 0; j < n; j++) dst[j] = dt_bf16_to_f32(src[j]);
}

void dt_lp_pack(uint16_t *dst, const float *src, size_t n, dt_dtype t) {
    size_t i = 0;
    if (t == DT_BF16 && n <= ONE_THREAD) { pack_bf16(dst, src, n); return; }
    if (t == DT_BF16) {
        #pragma omp parallel for simd schedule(static)
        for (size_t j = 0; j < n; j++) dst[j] = dt_f32_to_bf16(src[j]);
        return;
    }
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(dst + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) dst[i] = dt_f32_to_f16(src[i]);
}

void dt_lp_unpack(float *dst, const uint16_t *src, size_t n, dt_dtype t) {
    size_t i = 0;
    if (t == DT_BF16 && n <= ONE_THREAD) { unpack_bf16(dst, src, n); return; }
    if (t == DT_BF16) {
        #pragma omp parallel for simd schedule(static)
        for (size_t j = 0; j < n; j++) dst[j] = dt_bf16_to_f32(src[j]);
        return;
    }
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + i))));
#endif
    for (; i < n; i++) dst[i] = dt_f16_to_f32(src[i]);
}

void dt_lp_round(float *x, size_t n, dt_dtype t) {
    if (t == DT_BF16 && n <= ONE_THREAD) {
        #pragma omp simd
        for (size_t j = 0; j < n; j++) x[j] = bf16_round(x[j]);
        return;
    }
    if (t == DT_BF16) {
        #pragma omp parallel for simd schedule(static)
        for (size_t j = 0; j < n; j++) x[j] = bf16_round(x[j]);
        return;
    }
    if (t != DT_F16) return;
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(x + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
#endif
    for (; i < n; i++) x[i] = dt_f16_to_f32(dt_f32_to_f16(x[i]));
}

void dt_lp_round_add(float *dst, const float *src, size_t n, dt_dtype t) {
    if (t == DT_BF16 && n <= ONE_THREAD) {
        #pragma omp simd
        for (size_t j = 0; j < n; j++) dst[j] += bf16_round(src[j]);
        return;
    }
    if (t == DT_BF16) {
        #pragma omp parallel for simd schedule(static)
        for (size_t j = 0; j < n; j++) dst[j] += bf16_round(src[j]);
        return;
    }
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) {
        __m256 r = _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
        _mm256_storeu_ps(dst + i, _mm256_add_ps(_mm256_loadu_ps(dst + i), r));
    }
#endif
    for (; i < n; i++) dst[i] += t == DT_F16 ? dt_f16_to_f32(dt_f32_to_f16(src[i])) : src[i];
}

/* In place, so a buffer that others address (the shared arena) keeps its
 * place: element i goes to bytes [2i, 2i+2). A block of IP at a time through
 * a small buffer (vectorised): a block's 16-bit values land below where the
 * next block's f32 values start (2(i+k) <= 4i bytes once i >= k), so only
 * the first block overlaps itself, and it is read whole before it is
 * written. Widening walks down the same way. One thread: blocks in order. */
enum { IP = 1024 };

void dt_lp_narrow_inplace(float *x, size_t n, dt_dtype t) {
    unsigned char *b = (unsigned char *)x; /* byte copies: the two views of x alias */
    uint16_t h[IP];
    for (size_t i = 0; i < n; i += IP) {
        size_t k = n - i < IP ? n - i : IP;
        dt_lp_pack(h, x + i, k, t);
        memcpy(b + 2 * i, h, 2 * k);
    }
}

void dt_lp_widen_inplace(float *x, size_t n, dt_dtype t) {
    unsigned char *b = (unsigned char *)x;
    uint16_t h[IP];
    for (size_t end = n; end > 0;) {
        size_t i = end > IP ? end - IP : 0, k = end - i;
        memcpy(h, b + 2 * i, 2 * k);
        dt_lp_unpack(x + i, h, k, t);
        end = i;
    }
}

float dt_int8_quantize(int8_t *q, const float *x, size_t n) {
    float amax = 0;
    for (size_t k = 0; k < n; k++) amax = fmaxf(amax, fabsf(x[k]));
    float s = amax > 0 ? amax / 127.0f : 1.0f, inv = 1.0f / s;
    for (size_t k = 0; k < n; k++) q[k] = (int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, x[k] * inv)));
    return s;
}
