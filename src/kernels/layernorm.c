/* LayerNorm over the last dimension, eps 1e-5 as in GPT-2. */
#include "dtrain/kernels.h"

#include <math.h>

void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C;
        float m = 0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        float v = 0;
        for (int c = 0; c < C; c++) { float d = x[c] - m; v += d * d; }
        v /= C;
        float s = 1.0f / sqrtf(v + 1e-5f);
        float *o = out + (size_t)i * C;
        for (int c = 0; c < C; c++) o[c] = (x[c] - m) * s * w[c] + b[c];
        mean[i] = m;
        rstd[i] = s;
    }
}

void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C) {
    /* dw and db are sums over rows: rows in parallel would race, so this
     * parallelises over nothing but stays one cache-friendly pass. */
    for (int i = 0; i < N; i++) {
        const float *x = inp + (size_t)i * C, *dy = dout + (size_t)i * C;
        float *dx = dinp + (size_t)i * C;
        float m = mean[i], s = rstd[i];
        float dnorm_mean = 0, dnorm_norm_mean = 0;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s, dnorm = w[c] * dy[c];
            dnorm_mean += dnorm;
            dnorm_norm_mean += dnorm * norm;
        }
        dnorm_mean /= C;
        dnorm_norm_mean /= C;
        for (int c = 0; c < C; c++) {
            float norm = (x[c] - m) * s, dnorm = w[c] * dy[c];
            db[c] += dy[c];
            dw[c] += norm * dy[c];
            dx[c] += (dnorm - dnorm_mean - norm * dnorm_norm_mean) * s;
        }
    }
}
