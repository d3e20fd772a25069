/* Element-wise reductions for every dtype and op. Plain loops that the
 * compiler vectorises; bf16 and f16 are widened to f32, and dt_reduce_many
 * keeps the running value in f32 across all sources before rounding once. */
#include "comm_internal.h"

#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

#define BLOCK 512 /* f32 staging block for half types: stays in L1 */

/* The loops below are compiled twice, for AVX2 and for the baseline, and
 * the loader picks one per machine. */
#if defined(__x86_64__) && !defined(__SANITIZE_THREAD__) && !defined(__SANITIZE_ADDRESS__)
#define MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define MULTIVERSION
#endif

#define DEFINE_PAIR(NAME, T)                                                                  \
    MULTIVERSION static void NAME(T *restrict dst, const T *a, const T *b, size_t n, dt_op op) {           \
        switch (op) {                                                                         \
        case DT_MAX: for (size_t i = 0; i < n; i++) dst[i] = a[i] > b[i] ? a[i] : b[i]; break; \
        case DT_MIN: for (size_t i = 0; i < n; i++) dst[i] = a[i] < b[i] ? a[i] : b[i]; break; \
        case DT_PROD: for (size_t i = 0; i < n; i++) dst[i] = a[i] * b[i]; break;             \
        default: for (size_t i = 0; i < n; i++) dst[i] = a[i] + b[i]; break;                  \
        }                                                                                     \
    }
/* dst may equal a (in place); restrict on dst alone would then be a lie, so
 * the in-place case goes through the _into variants below. */
DEFINE_PAIR(pair_f32, float)
DEFINE_PAIR(pair_f64, double)
DEFINE_PAIR(pair_i32, int32_t)
DEFINE_PAIR(pair_i64, int64_t)

#define DEFINE_INTO(NAME, T)                                                                  \
    MULTIVERSION static void NAME(T *restrict dst, const T *restrict src, size_t n, dt_op op) {            \
        switch (op) {                                                                         \
        case DT_MAX: for (size_t i = 0; i < n; i++) dst[i] = dst[i] > src[i] ? dst[i] : src[i]; break; \
        case DT_MIN: for (size_t i = 0; i < n; i++) dst[i] = dst[i] < src[i] ? dst[i] : src[i]; break; \
        case DT_PROD: for (size_t i = 0; i < n; i++) dst[i] *= src[i]; break;                 \
        default: for (size_t i = 0; i < n; i++) dst[i] += src[i]; break;                      \
        }                                                                                     \
    }
DEFINE_INTO(into_f32, float)
DEFINE_INTO(into_f64, double)
DEFINE_INTO(into_i32, int32_t)
DEFINE_INTO(into_i64, int64_t)

/* Two ranks' push: both outputs from one pass over both inputs. The average
 * is the sum halved, as dt_reduce_finish would give it. */
#define DEFINE_PAIR2(NAME, T)                                                                 \
    MULTIVERSION static void NAME(T *d0, T *d1, const T *a, const T *b, size_t n, dt_op op) { \
        switch (op) {                                                                         \
        case DT_MAX: for (size_t i = 0; i < n; i++) { T v = a[i] > b[i] ? a[i] : b[i]; d0[i] = v; d1[i] = v; } break; \
        case DT_MIN: for (size_t i = 0; i < n; i++) { T v = a[i] < b[i] ? a[i] : b[i]; d0[i] = v; d1[i] = v; } break; \
        case DT_PROD: for (size_t i = 0; i < n; i++) { T v = a[i] * b[i]; d0[i] = v; d1[i] = v; } break; \
        case DT_AVG: for (size_t i = 0; i < n; i++) { T v = (T)((a[i] + b[i]) / 2); d0[i] = v; d1[i] = v; } break; \
        default: for (size_t i = 0; i < n; i++) { T v = a[i] + b[i]; d0[i] = v; d1[i] = v; } break; \
        }                                                                                     \
    }
DEFINE_PAIR2(pair2_f32, float)
DEFINE_PAIR2(pair2_f64, double)
DEFINE_PAIR2(pair2_i32, int32_t)
DEFINE_PAIR2(pair2_i64, int64_t)

/* bf16 sum or average of two ranks in f32, rounded once (the halving of the
 * average commutes with the rounding). */
MULTIVERSION static void pair2_bf16(uint16_t *d0, uint16_t *d1, const uint16_t *a, const uint16_t *b, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) {
        uint16_t h = dt_f32_to_bf16((dt_bf16_to_f32(a[i]) + dt_bf16_to_f32(b[i])) * scale);
        d0[i] = h;
        d1[i] = h;
    }
}

bool dt_reduce_pair_to2(void *d0, void *d1, const void *a, const void *b, size_t n, dt_dtype t, dt_op op) {
    if (t == DT_BF16 && (op == DT_SUM || op == DT_AVG)) {
        pair2_bf16(d0, d1, a, b, n, op == DT_AVG ? 0.5f : 1.0f);
        return true;
    }
    switch (t) {
    case DT_F32: pair2_f32(d0, d1, a, b, n, op); return true;
    case DT_F64: pair2_f64(d0, d1, a, b, n, op); return true;
    case DT_I32: pair2_i32(d0, d1, a, b, n, op); return true;
    case DT_I64: pair2_i64(d0, d1, a, b, n, op); return true;
    default: return false;
    }
}

/* 16-bit values to f32 and back (nearest even), one loop per type so that
 * each vectorises: bf16 is a shift and a rounding add; f16 goes through
 * F16C where the build targets it (the same results as dt_f16_to_f32 and
 * dt_f32_to_f16, which are scalar). */
MULTIVERSION static void widen_bf16(float *restrict out, const uint16_t *restrict in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = dt_bf16_to_f32(in[i]);
}
MULTIVERSION static void narrow_bf16(uint16_t *restrict out, const float *restrict in, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = dt_f32_to_bf16(in[i]);
}
static void widen(float *out, const uint16_t *in, size_t n, dt_dtype t) {
    if (t == DT_BF16) { widen_bf16(out, in, n); return; }
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(in + i))));
#endif
    for (; i < n; i++) out[i] = dt_f16_to_f32(in[i]);
}
static void narrow(uint16_t *out, const float *in, size_t n, dt_dtype t) {
    if (t == DT_BF16) { narrow_bf16(out, in, n); return; }
    size_t i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(out + i), _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) out[i] = dt_f32_to_f16(in[i]);
}

void dt_reduce_into(void *dst, const void *src, size_t n, dt_dtype t, dt_op op) {
    switch (t) {
    case DT_F32: into_f32(dst, src, n, op); break;
    case DT_F64: into_f64(dst, src, n, op); break;
    case DT_I32: into_i32(dst, src, n, op); break;
    case DT_I64: into_i64(dst, src, n, op); break;
    case DT_BF16: case DT_F16: {
        float a[BLOCK], b[BLOCK];
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t m = n - i < BLOCK ? n - i : BLOCK;
            widen(a, (uint16_t *)dst + i, m, t);
            widen(b, (const uint16_t *)src + i, m, t);
            into_f32(a, b, m, op);
            narrow((uint16_t *)dst + i, a, m, t);
        }
        break;
    }
    default: break;
    }
}

void dt_reduce_pair(void *dst, const void *a, const void *b, size_t n, dt_dtype t, dt_op op) {
    /* Every op here is commutative bit for bit, so aliasing either input is fine. */
    if (dst == a) { dt_reduce_into(dst, b, n, t, op); return; }
    if (dst == b) { dt_reduce_into(dst, a, n, t, op); return; }
    switch (t) {
    case DT_F32: pair_f32(dst, a, b, n, op); break;
    case DT_F64: pair_f64(dst, a, b, n, op); break;
    case DT_I32: pair_i32(dst, a, b, n, op); break;
    case DT_I64: pair_i64(dst, a, b, n, op); break;
    default: {
        const void *srcs[2] = { a, b };
        dt_reduce_many(dst, srcs, 2, n, t, op);
        break;
    }
    }
}

/* dst may alias srcs[0] or srcs[1], not a later source. */
void dt_reduce_many(void *dst, const void *const *srcs, int nsrc, size_t n, dt_dtype t, dt_op op) {
    size_t es = dt_dtype_size(t);
    if (nsrc == 1) { if (dst != srcs[0]) memmove(dst, srcs[0], n * es); return; }
    if (t != DT_BF16 && t != DT_F16) {
        /* Block-wise so the partial result stays in cache across sources. */
        size_t blk = 16384 / es;
        for (size_t i = 0; i < n; i += blk) {
            size_t m = n - i < blk ? n - i : blk;
            char *d = (char *)dst + i * es;
            dt_reduce_pair(d, (const char *)srcs[0] + i * es, (const char *)srcs[1] + i * es, m, t, op);
            for (int k = 2; k < nsrc; k++) dt_reduce_into(d, (const char *)srcs[k] + i * es, m, t, op);
        }
        return;
    }
    float acc[BLOCK], tmp[BLOCK];
    for (size_t i = 0; i < n; i += BLOCK) {
        size_t m = n - i < BLOCK ? n - i : BLOCK;
        widen(acc, (const uint16_t *)srcs[0] + i, m, t);
        for (int k = 1; k < nsrc; k++) {
            widen(tmp, (const uint16_t *)srcs[k] + i, m, t);
            into_f32(acc, tmp, m, op);
        }
        narrow((uint16_t *)dst + i, acc, m, t);
    }
}

void dt_reduce_finish(void *buf, size_t n, dt_dtype t, dt_op op, int nranks) {
    if (op != DT_AVG || nranks == 1) return;
    switch (t) {
    case DT_F32: { float *p = buf; for (size_t i = 0; i < n; i++) p[i] /= (float)nranks; break; }
    case DT_F64: { double *p = buf; for (size_t i = 0; i < n; i++) p[i] /= (double)nranks; break; }
    case DT_I32: { int32_t *p = buf; for (size_t i = 0; i < n; i++) p[i] /= nranks; break; }
    case DT_I64: { int64_t *p = buf; for (size_t i = 0; i < n; i++) p[i] /= nranks; break; }
    case DT_BF16: case DT_F16: {
        float tmp[BLOCK];
        for (size_t i = 0; i < n; i += BLOCK) {
            size_t m = n - i < BLOCK ? n - i : BLOCK;
            widen(tmp, (uint16_t *)buf + i, m, t);
            for (size_t k = 0; k < m; k++) tmp[k] /= (float)nranks;
            narrow((uint16_t *)buf + i, tmp, m, t);
        }
        break;
    }
    default: break;
    }
}
