/* What crosses a pipeline's stage boundary (--pp-wire): the residual stream's activations and their gradients in f32,
 * in bf16 (rounded to nearest even: half the bytes), or in int8 with one absmax scale a row of channels (a token's
 * vector: a quarter of the bytes and a scale a row). The stream is rows of `row` floats; a message is whole 32-bit
 * words (the scales first, then the values, the last word padded). */
#include "dtrain/pipeline.h"
#include "dtrain/kernels.h"

#include <string.h>

static const char *const names[] = { "fp32", "bf16", "int8" };

dt_status dt_pp_wire_parse(const char *s, dt_pp_wire *out) {
    for (int i = 0; i < 3; i++)
        if (!strcmp(s, names[i])) { *out = (dt_pp_wire)i; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--pp-wire %s: fp32, bf16 or int8", s);
}

const char *dt_pp_wire_name(dt_pp_wire w) { return (unsigned)w < 3 ? names[w] : "?"; }

size_t dt_pp_wire_words(dt_pp_wire w, size_t n, size_t row) {
    size_t bytes = w == DT_PP_WIRE_BF16 ? 2 * n : w == DT_PP_WIRE_INT8 ? n + (row ? n / row : 0) * sizeof(float) : 4 * n;
    return (bytes + 3) / 4;
}

void dt_pp_wire_encode(dt_pp_wire w, const float *x, size_t n, size_t row, void *out) {
    if (w == DT_PP_WIRE_F32) { memcpy(out, x, n * sizeof *x); return; }
    if (w == DT_PP_WIRE_BF16) { dt_lp_pack(out, x, n, DT_BF16); return; }
    size_t rows = n / row;
    float *scale = out;
    int8_t *q = (int8_t *)(scale + rows);
    for (size_t r = 0; r < rows; r++) scale[r] = dt_int8_quantize(q + r * row, x + r * row, row);
}

void dt_pp_wire_decode(dt_pp_wire w, const void *in, size_t n, size_t row, float *x) {
    if (w == DT_PP_WIRE_F32) { memcpy(x, in, n * sizeof *x); return; }
    if (w == DT_PP_WIRE_BF16) { dt_lp_unpack(x, in, n, DT_BF16); return; }
    size_t rows = n / row;
    const float *scale = in;
    const int8_t *q = (const int8_t *)(scale + rows);
    for (size_t r = 0; r < rows; r++)
        for (size_t k = 0; k < row; k++) x[r * row + k] = (float)q[r * row + k] * scale[r];
}
