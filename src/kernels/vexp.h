/* exp for f32 that the compiler can vectorise (libm's expf is a call per
 * element): 2^k * p(r) with k = round(x / ln 2), r = x - k ln 2 in two
 * parts, p a degree-6 polynomial; within ~2 ulp of expf over the range a
 * softmax or GELU uses. Inputs below -87 give e^-87, above 88 give e^88;
 * NaN gives NaN, so a diverging run's loss shows it. */
#ifndef DT_VEXP_H
#define DT_VEXP_H

#include <stdint.h>
#include <string.h>

static inline float dt_vexpf(float x0) {
    /* clamped so that NaN lands inside the range too (k then stays a small
     * integer, whose conversion and shift are defined); NaN is returned as is */
    float x = x0 > -87.0f ? x0 : -87.0f;
    x = x < 88.0f ? x : 88.0f;
    float k = __builtin_rintf(x * 1.44269504088896341f); /* rint: one instruction, unlike round */
    float r = x - k * 0.693145751953125f;  /* ln 2, high part */
    r = r - k * 1.428606765330187e-06f;    /* ln 2, low part */
    float p = 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    uint32_t bits = (uint32_t)((int32_t)k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return x0 != x0 ? x0 : p * scale;
}

/* tanh(u) = 1 - 2 / (exp(2u) + 1), exact enough for GELU. */
static inline float dt_vtanhf(float u) { return 1.0f - 2.0f / (dt_vexpf(2.0f * u) + 1.0f); }

/* tanh within a few ulp of tanhf everywhere, small inputs included (dt_vtanhf's form loses relative precision near 0:
 * harmless inside GELU, not in a layer's activation): below 0.625 in magnitude the odd minimax polynomial Cephes'
 * tanhf uses, above it the exp form on |u| with u's sign. Both are computed and one picked, so a loop of it vectorises
 * (libm's tanhf is a call per element: half of a small policy network's time). */
static inline float dt_vtanhf_accurate(float u) {
    float a = __builtin_fabsf(u), z = u * u;
    float poly = ((((-5.70498872745e-3f * z + 2.06390887954e-2f) * z - 5.37397155531e-2f) * z + 1.33314422036e-1f) * z -
                  3.33332819422e-1f) * z * u + u;
    float big = __builtin_copysignf(1.0f - 2.0f / (dt_vexpf(2.0f * a) + 1.0f), u);
    return a < 0.625f ? poly : big;
}

#endif
