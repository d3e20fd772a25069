/* RMSNorm (Llama's): out = x / sqrt(mean(x^2) + eps) * w, no mean removed and no bias. The reciprocal
 * root is kept for backward, as LayerNorm keeps its statistics. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* One row of C: its reciprocal root, and out = x * s * w. */
static float rms_row(float *o, const float *x, const float *w, int C, float eps) {
    float ss = 0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    float s = 1.0f / sqrtf(ss / C + eps);
    for (int c = 0; c < C; c++) o[c] = x[c] * s * w[c];
    return s;
}

void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) rstd[i] = rms_row(out + (size_t)i * C, inp + (size_t)i * C, w, C, eps);
}

/* One row's backward, with n = x * s and dn = w * dy: dx += s * (dn - n * mean(dn * n)), dw += n * dy. */
static void rms_row_backward(float *dx, float *dw, const float *dy, const float *x, const float *w, float s, int C) {
    float dot = 0;
    for (int c = 0; c < C; c++) dot += w[c] * dy[c] * x[c] * s;
    dot /= C;
    for (int c = 0; c < C; c++) {
        float n = x[c] * s;
        dw[c] += n * dy[c];
        dx[c] += (w[c] * dy[c] - n * dot) * s;
    }
}

void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N,
                         int C) {
    /* dw sums over rows: rows in parallel would race on it (as in LayerNorm's backward) */
    for (int i = 0; i < N; i++) rms_row_backward(dinp + (size_t)i * C, dw, dout + (size_t)i * C, inp + (size_t)i * C, w, rstd[i], C);
}

/* Each head's queries and keys normed on their own (Qwen 3's q_norm and k_norm): a row is [q of NH heads | k of NKV
 * heads | v of NKV heads], each of hd channels; q's heads share wq, k's wk; v passes as it is. */
void dt_headnorm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int NH, int NKV, int hd,
                         float eps) {
    size_t W = (size_t)(NH + 2 * NKV) * hd, H = (size_t)(NH + NKV);
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + i * W;
        float *o = out + i * W;
        for (size_t h = 0; h < H; h++) rstd[i * H + h] = rms_row(o + h * hd, x + h * hd, h < (size_t)NH ? wq : wk, hd, eps);
        memcpy(o + H * hd, x + H * hd, sizeof(float) * (size_t)NKV * hd);
    }
}

void dt_headnorm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq, const float *wk,
                          const float *rstd, int N, int NH, int NKV, int hd) {
    size_t W = (size_t)(NH + 2 * NKV) * hd, H = (size_t)(NH + NKV);
    for (int i = 0; i < N; i++) {
        const float *x = inp + i * W, *dy = dout + i * W;
        float *dx = dinp + i * W;
        for (size_t h = 0; h < H; h++) {
            bool q = h < (size_t)NH;
            rms_row_backward(dx + h * hd, q ? dwq : dwk, dy + h * hd, x + h * hd, q ? wq : wk, rstd[i * H + h], hd);
        }
        for (size_t c = H * hd; c < W; c++) dx[c] += dy[c];
    }
}
