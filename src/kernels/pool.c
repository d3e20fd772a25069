/* Pooling over NCHW planes: max pooling with a square window (padding never
 * wins; ties keep the first maximum, as PyTorch does) and the global
 * average pooling before a ResNet's head (AdaptiveAvgPool2d((1, 1))). */
#include "dtrain/kernels.h"

#include <math.h>

void dt_maxpool2d_forward(float *out, int32_t *idx, const float *inp, int NC, int H, int W, int K, int stride, int pad) {
    int OH = (H + 2 * pad - K) / stride + 1, OW = (W + 2 * pad - K) / stride + 1;
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < NC; p++) {
        const float *x = inp + (size_t)p * H * W;
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                float best = -INFINITY;
                int at = -1;
                for (int kh = 0; kh < K; kh++) {
                    int ih = oh * stride - pad + kh;
                    if (ih < 0 || ih >= H) continue;
                    for (int kw = 0; kw < K; kw++) {
                        int iw = ow * stride - pad + kw;
                        if (iw < 0 || iw >= W) continue;
                        float v = x[ih * W + iw];
                        if (at < 0 || v > best || isnan(v)) { best = v; at = ih * W + iw; }
                        if (isnan(v)) goto done; /* a NaN propagates, as in PyTorch */
                    }
                }
            done:
                out[((size_t)p * OH + oh) * OW + ow] = best;
                idx[((size_t)p * OH + oh) * OW + ow] = at;
            }
    }
}

void dt_maxpool2d_backward(float *dinp, const float *dout, const int32_t *idx, int NC, int H, int W, int OH, int OW) {
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < NC; p++)
        for (int i = 0; i < OH * OW; i++) dinp[(size_t)p * H * W + idx[(size_t)p * OH * OW + i]] += dout[(size_t)p * OH * OW + i];
}

void dt_avgpool_global_forward(float *out, const float *inp, int NC, int HW) {
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < NC; p++) {
        float s = 0;
        for (int i = 0; i < HW; i++) s += inp[(size_t)p * HW + i];
        out[p] = s / (float)HW;
    }
}

void dt_avgpool_global_backward(float *dinp, const float *dout, int NC, int HW) {
    #pragma omp parallel for schedule(static)
    for (int p = 0; p < NC; p++) {
        float g = dout[p] / (float)HW;
        for (int i = 0; i < HW; i++) dinp[(size_t)p * HW + i] += g;
    }
}
