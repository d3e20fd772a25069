/* RMSNorm (Llama's): out = x / sqrt(mean(x^2) + eps) * w, no mean removed and no bias. The reciprocal
 * root is kept for backward, as LayerNorm keeps its statistics. */
#include "dtrain/kernels.h"

#include <math.h>

void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float ss = 0;
        for (int c = 0; c < C; c++) ss += x[c] * x[c];
        float s = 1.0f / sqrtf(ss / C + eps);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
        rstd[i] = s;
    }
}

/* With n = x * s and dn = w * dy: dx = s * (dn - n * mean(dn * n)), dw = sum over rows of n * dy. */
void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N,
                         int C) {
    /* dw sums over rows: rows in parallel would race on it (as in LayerNorm's backward) */
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C, s = rstd[i], dot = 0;
        for (int c = 0; c < C; c++) dot += w[c] * dy[c] * x[c] * s;
        dot /= C;
        for (int c = 0; c < C; c++) {
            float n = x[c] * s;
            dw[c] += n * dy[c];
            dx[c] += (w[c] * dy[c] - n * dot) * s;
        }
    }
}
