/* Element-wise layers: GELU (tanh approximation, as GPT-2) and the residual add. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <math.h>

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

void dt_gelu_forward(float *out, const float *inp, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + dt_vtanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

/* Row by row, each row the same code over the same width, so a row's values do not depend on how many came with it
 * (one loop over everything would give a row's end to a scalar tail in one batch and to vectors in another). */
void dt_gelu_rows(float *out, const float *inp, int rows, int width) {
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; r++) {
        const float *x = inp + (size_t)r * width;
        float *y = out + (size_t)r * width;
        #pragma omp simd
        for (int i = 0; i < width; i++) y[i] = 0.5f * x[i] * (1.0f + dt_vtanhf(GELU_K * (x[i] + 0.044715f * x[i] * x[i] * x[i])));
    }
}

/* tanh row by row, as dt_gelu_rows and for the same reason. */
void dt_tanh_rows(float *out, const float *inp, int rows, int width) {
    for (int r = 0; r < rows; r++) {
        const float *x = inp + (size_t)r * width;
        float *y = out + (size_t)r * width;
        #pragma omp simd
        for (int i = 0; i < width; i++) y[i] = dt_vtanhf_accurate(x[i]);
    }
}

void dt_relu_forward(float *out, const float *inp, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = inp[i] > 0 ? inp[i] : 0;
}

void dt_relu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) dinp[i] += inp[i] > 0 ? dout[i] : 0;
}

void dt_relu_backward_inplace(float *d, const float *out, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) d[i] = out[i] > 0 ? d[i] : 0;
}

void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n) {
    #pragma omp parallel for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i], u = GELU_K * (x + 0.044715f * x * x * x);
        float t = dt_vtanhf(u), sech2 = 1.0f - t * t;
        float grad = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] += grad * dout[i];
    }
}

void dt_residual_forward(float *out, const float *a, const float *b, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

void dt_residual_backward(float *da, float *db, const float *dout, size_t n) {
    #pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) { da[i] += dout[i]; db[i] += dout[i]; }
}

/* SwiGLU over rows of [gate | up] (2F wide, the gated MLP's fused first Linear): out = silu(gate) * up. */
void dt_swiglu_forward(float *out, const float *gu, int N, int F) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F;
        float *o = out + (size_t)i * F;
        #pragma omp simd
        for (int j = 0; j < F; j++) o[j] = g[j] / (1.0f + dt_vexpf(-g[j])) * u[j];
    }
}

/* d gate += dout * up * sigmoid(g) (1 + g (1 - sigmoid(g))); d up += dout * silu(g). */
void dt_swiglu_backward(float *dgu, const float *gu, const float *dout, int N, int F) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < N; i++) {
        const float *g = gu + (size_t)i * 2 * F, *u = g + F, *dy = dout + (size_t)i * F;
        float *dg = dgu + (size_t)i * 2 * F, *du = dg + F;
        #pragma omp simd
        for (int j = 0; j < F; j++) {
            float sg = 1.0f / (1.0f + dt_vexpf(-g[j]));
            dg[j] += dy[j] * u[j] * sg * (1.0f + g[j] * (1.0f - sg));
            du[j] += dy[j] * g[j] * sg;
        }
    }
}
