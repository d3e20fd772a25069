/* Causal multi-head self-attention: softmax(q k^T / sqrt(hs)) v per head,
 * position t attending to positions 0..t. The softmax rows are kept in
 * att[B,NH,T,T] for backward. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    #pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *a = att + (((size_t)b * NH + h) * T + t) * T;
                float mx = -INFINITY;
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    float s = 0;
                    #pragma omp simd reduction(+ : s)
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    a[t2] = s;
                    if (s > mx) mx = s;
                }
                float sum = 0;
                for (int t2 = 0; t2 <= t; t2++) { a[t2] = expf(a[t2] - mx); sum += a[t2]; }
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t ? a[t2] * inv : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                memset(o, 0, sizeof(float) * (size_t)hs);
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    #pragma omp simd
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    /* One (b, h) per iteration: key and value gradients of a head gather
     * contributions from every later query, so heads are the unit of work. */
    #pragma omp parallel
    {
        float *datt = malloc(sizeof(float) * (size_t)T);
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < T; t++) {
                    const float *a = att + (((size_t)b * NH + h) * T + t) * T;
                    const float *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                    const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                    float *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                    /* through out = att v */
                    float dot = 0;
                    for (int t2 = 0; t2 <= t; t2++) {
                        const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                        float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                        float d = 0;
                        #pragma omp simd reduction(+ : d)
                        for (int i = 0; i < hs; i++) { d += dy[i] * v[i]; dv[i] += a[t2] * dy[i]; }
                        datt[t2] = d;
                        dot += a[t2] * d;
                    }
                    /* through the softmax, then the scaled dot products */
                    for (int t2 = 0; t2 <= t; t2++) {
                        float dpre = a[t2] * (datt[t2] - dot) * scale;
                        const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                        float *dk = dqkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                        #pragma omp simd
                        for (int i = 0; i < hs; i++) { dq[i] += dpre * k[i]; dk[i] += dpre * q[i]; }
                    }
                }
        free(datt);
    }
}

/* Blockwise form: for each query row, keys are visited in blocks of 64 with
 * a running maximum and sum (online softmax), so no row of T scores is ever
 * kept; forward stores the row's log-sum-exp. Backward recomputes each
 * probability p = exp(s - lse) and uses D = dout . out for the softmax's
 * gradient (sum over the row of p * dp equals dout . out). */
#define KBLOCK 64

void dt_attention_forward_lse(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    #pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                float s[KBLOCK], mx = -INFINITY, sum = 0;
                memset(o, 0, sizeof(float) * (size_t)hs);
                for (int k0 = 0; k0 <= t; k0 += KBLOCK) {
                    int k1 = k0 + KBLOCK <= t + 1 ? k0 + KBLOCK : t + 1;
                    float bmx = -INFINITY;
                    for (int t2 = k0; t2 < k1; t2++) {
                        const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                        float d = 0;
                        #pragma omp simd reduction(+ : d)
                        for (int i = 0; i < hs; i++) d += q[i] * k[i];
                        s[t2 - k0] = d * scale;
                        if (s[t2 - k0] > bmx) bmx = s[t2 - k0];
                    }
                    float nmx = bmx > mx ? bmx : mx, corr = expf(mx - nmx);
                    sum *= corr;
                    #pragma omp simd
                    for (int i = 0; i < hs; i++) o[i] *= corr;
                    for (int t2 = k0; t2 < k1; t2++) {
                        float p = expf(s[t2 - k0] - nmx);
                        sum += p;
                        const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                        #pragma omp simd
                        for (int i = 0; i < hs; i++) o[i] += p * v[i];
                    }
                    mx = nmx;
                }
                float inv = 1.0f / sum;
                #pragma omp simd
                for (int i = 0; i < hs; i++) o[i] *= inv;
                lse[((size_t)b * NH + h) * T + t] = mx + logf(sum);
            }
}

void dt_attention_backward_lse(float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse,
                               int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                const float *dy = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                const float *y = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                const float *q = qkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float *dq = dqkv + ((size_t)b * T + t) * C3 + (size_t)h * hs;
                float D = 0, l = lse[((size_t)b * NH + h) * T + t];
                #pragma omp simd reduction(+ : D)
                for (int i = 0; i < hs; i++) D += dy[i] * y[i];
                for (int t2 = 0; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    float *dk = dqkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    float sdot = 0, dp = 0;
                    #pragma omp simd reduction(+ : sdot, dp)
                    for (int i = 0; i < hs; i++) { sdot += q[i] * k[i]; dp += dy[i] * v[i]; }
                    float p = expf(sdot * scale - l), ds = p * (dp - D) * scale;
                    #pragma omp simd
                    for (int i = 0; i < hs; i++) { dv[i] += p * dy[i]; dq[i] += ds * k[i]; dk[i] += ds * q[i]; }
                }
            }
}
