/* The pipeline's wire codes (pp_wire.c): bf16 gives each value rounded to nearest even (dt_lp_round's), int8 each row's
 * absmax scale and every value within half a step of it, exactly where a value sits on the grid; a message's words
 * hold the coding (the scales first, then the values); fp32 passes values through; names parse and a bad one is refused. */
#include "dtrain/pipeline.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
static void expect(int ok, const char *what, double fig) {
    if (ok) passed++; else failed++;
    printf("%-72s %s  %.3g\n", what, ok ? "ok" : "FAIL", fig);
}

int main(void) {
    enum { ROW = 48, ROWS = 37 };
    size_t n = (size_t)ROW * ROWS;
    float *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y), *r = malloc(n * sizeof *r);
    uint32_t *msg = malloc(n * sizeof *msg);
    uint64_t s = 5;
    for (size_t i = 0; i < n; i++) x[i] = dt_rng_normal(&s) * (float)(1 + i / ROW); /* rows of growing size */
    for (int i = 0; i < ROW; i++) x[5 * ROW + i] = 0;                               /* a row of zeros */
    for (int i = 0; i < ROW; i++) x[6 * ROW + i] = (float)(i - 24) * 0.25f;          /* a row on its own grid: -6 .. 5.75 */
    x[6 * ROW + 47] = 127 * 0.25f / 4;                                                /* its absmax: 7.9375, step 1/16 */

    memset(msg, 0xff, n * sizeof *msg);
    dt_pp_wire_encode(DT_PP_WIRE_F32, x, n, ROW, msg);
    dt_pp_wire_decode(DT_PP_WIRE_F32, msg, n, ROW, y);
    expect(!memcmp(x, y, n * sizeof *x) && dt_pp_wire_words(DT_PP_WIRE_F32, n, ROW) == n, "fp32: the values as they are, n words", 0);

    dt_pp_wire_encode(DT_PP_WIRE_BF16, x, n, ROW, msg);
    dt_pp_wire_decode(DT_PP_WIRE_BF16, msg, n, ROW, y);
    memcpy(r, x, n * sizeof *x);
    dt_lp_round(r, n, DT_BF16);
    expect(!memcmp(r, y, n * sizeof *x) && dt_pp_wire_words(DT_PP_WIRE_BF16, n, ROW) == n / 2, "bf16: each value rounded to nearest even, n/2 words", 0);

    memset(msg, 0, n * sizeof *msg);
    dt_pp_wire_encode(DT_PP_WIRE_INT8, x, n, ROW, msg);
    dt_pp_wire_decode(DT_PP_WIRE_INT8, msg, n, ROW, y);
    double worst = 0;
    int inside = 1;
    for (size_t row = 0; row < ROWS; row++) {
        float amax = 0;
        for (int i = 0; i < ROW; i++) amax = fmaxf(amax, fabsf(x[row * ROW + i]));
        float scale = amax > 0 ? amax / 127 : 1, got;
        memcpy(&got, &msg[row], sizeof got);
        inside = inside && got == scale;
        for (int i = 0; i < ROW; i++) {
            double e = fabs((double)y[row * ROW + i] - x[row * ROW + i]) / scale;
            inside = inside && e <= 0.5 + 1e-5;
            worst = e > worst ? e : worst;
        }
    }
    expect(inside, "int8: each row's scale absmax/127 first, every value within half a step (worst, steps)", worst);
    expect(!memcmp(x + 5 * ROW, y + 5 * ROW, 2 * ROW * sizeof *x), "int8: a row of zeros, and a row on its own grid, exactly", 0);
    expect(dt_pp_wire_words(DT_PP_WIRE_INT8, n, ROW) == (n + ROWS * 4 + 3) / 4, "int8: a byte a value and a float a row, in words", 0);

    dt_pp_wire w;
    expect(!dt_pp_wire_parse("bf16", &w) && w == DT_PP_WIRE_BF16 && !strcmp(dt_pp_wire_name(DT_PP_WIRE_INT8), "int8"), "names: bf16 parses, int8 named", 0);
    expect(dt_pp_wire_parse("int4", &w) && strstr(dt_last_error(), "fp32, bf16 or int8"), "names: int4 refused, naming the wires", 0);
    printf("pp wire: %d passed, %d failed\n", passed, failed);
    free(x); free(y); free(r); free(msg);
    return failed != 0;
}
