/* Element types: sizes, names, and IEEE half-precision conversion (bf16 is a
 * truncated f32 and lives inline in base.h). */
#include "dtrain/base.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const struct { const char *name; size_t size; } dtypes[DT_DTYPE_COUNT] = {
    [DT_F32] = { "f32", 4 }, [DT_F64] = { "f64", 8 }, [DT_BF16] = { "bf16", 2 },
    [DT_F16] = { "f16", 2 }, [DT_I32] = { "i32", 4 }, [DT_I64] = { "i64", 8 },
};

const char *dt_dtype_name(dt_dtype t) { return (unsigned)t < DT_DTYPE_COUNT ? dtypes[t].name : "?"; }

dt_status dt_dtype_parse(const char *s, dt_dtype *out) {
    for (int i = 0; i < DT_DTYPE_COUNT; i++)
        if (strcmp(s, dtypes[i].name) == 0) { *out = (dt_dtype)i; return DT_OK; }
    return dt_error(DT_ERR_ARG, "unknown dtype '%s' (expected f32, f64, bf16, f16, i32 or i64)", s);
}

float dt_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) bits = sign;
        else { /* subnormal: normalise */
            int e = -1;
            do { man <<= 1; e++; } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(112 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    union { uint32_t u; float f; } v = { bits };
    return v.f;
}

uint16_t dt_f32_to_f16(float f) {
    union { float f; uint32_t u; } v = { f };
    uint32_t sign = (v.u >> 16) & 0x8000u;
    uint32_t a = v.u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);       /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);      /* overflow -> inf */
    if (a < 0x38800000u) {                                        /* subnormal or zero */
        if (a < 0x33000000u) return (uint16_t)sign;
        uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e;                                 /* 14..24 */
        uint32_t half = m >> shift, rem = m & ((1u << shift) - 1), mid = 1u << (shift - 1);
        if (rem > mid || (rem == mid && (half & 1u))) half++;
        return (uint16_t)(sign | half);
    }
    uint32_t r = a - 0x38000000u;                                 /* rebias 127 -> 15 */
    uint32_t half = r >> 13, rem = r & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (half & 1u))) half++;
    return (uint16_t)(sign | half);
}

const char *dt_precision_name(dt_dtype t) { return t == DT_BF16 ? "bf16" : t == DT_F16 ? "fp16" : "fp32"; }

dt_status dt_precision_parse(const char *s, dt_dtype *out) {
    static const dt_dtype types[3] = { DT_F32, DT_BF16, DT_F16 };
    for (int i = 0; s && i < 3; i++)
        if (!strcmp(s, dt_precision_name(types[i]))) { *out = types[i]; return DT_OK; }
    return dt_error(DT_ERR_ARG, "precision '%s': expected fp32, bf16 or fp16", s ? s : "");
}

double dt_f32_decimal(float v) {
    char s[32];
    for (int digits = 6; digits < 9; digits++) {
        snprintf(s, sizeof s, "%.*g", digits, (double)v);
        if (strtof(s, NULL) == v) return strtod(s, NULL);
    }
    return (double)v;
}
