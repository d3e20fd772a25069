/* The vector path of inference's fixed-order kernels (simd.h). */
#include "simd.h"

#include "dtrain/base.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

int dt_kernels_simd(void) {
    static _Atomic int known = -1; /* atomic: the first calls may come from several threads at once */
    if (known < 0) {
        const char *e = getenv("DTRAIN_ROWDOT");
        int cap = DT_SIMD_AVX512, has = DT_SIMD_PORTABLE;
        if (e && *e) {
            cap = !strcmp(e, "portable") ? DT_SIMD_PORTABLE : !strcmp(e, "avx2") ? DT_SIMD_AVX2 : DT_SIMD_AVX512;
            if (cap == DT_SIMD_AVX512 && strcmp(e, "avx512") && strcmp(e, "avx512bf16"))
                dt_log(DT_LOG_WARN, "DTRAIN_ROWDOT=%s is not portable, avx2, avx512 or avx512bf16: the widest path this CPU has", e);
        }
#if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
            has = __builtin_cpu_supports("avx512f") ? DT_SIMD_AVX512 : DT_SIMD_AVX2;
#endif
        known = has < cap ? has : cap;
    }
    return known;
}

bool dt_kernels_dpbf16(void) {
    static _Atomic int known = -1;
    if (known < 0) {
        const char *r = getenv("DTRAIN_ROWDOT"), *g = getenv("DTRAIN_BF16_GEMM");
        known = dt_kernels_simd() == DT_SIMD_AVX512 && dt_cpu_has("avx512_bf16") && !(r && !strcmp(r, "avx512")) &&
                !(g && !strcmp(g, "0"));
    }
    return known;
}

bool dt_kernels_vbmi(void) {
    static _Atomic int known = -1;
    if (known < 0) {
        const char *r = getenv("DTRAIN_ROWDOT");
        bool cpu = false;
#if defined(__x86_64__) && defined(__GNUC__)
        cpu = __builtin_cpu_supports("avx512vbmi");
#endif
        known = dt_kernels_dpbf16() && cpu && !(r && !strcmp(r, "avx512bf16"));
    }
    return known;
}

bool dt_kernels_hw_stream(void) {
    static _Atomic int known = -1;
    if (known < 0) {
        bool amd = false;
#if defined(__x86_64__) && defined(__GNUC__)
        amd = __builtin_cpu_is("amd");
#endif
        known = amd;
    }
    return known;
}
