/* Causal multi-head self-attention: softmax(q k^T / sqrt(hs)) v per head,
 * position t attending to positions 0..t. The softmax rows are kept in
 * att[B,NH,T,T] for backward. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    dt_attention_forward_docs(out, att, qkv, NULL, B, T, C, NH);
}

void dt_attention_forward_docs(float *out, float *att, const float *qkv, const int32_t *first, int B, int T, int C, int NH) {
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
                int f = first ? first[(size_t)b * T + t] : 0; /* the row's document starts there */
                for (int t2 = f; t2 <= t; t2++) {
                    const float *k = qkv + ((size_t)b * T + t2) * C3 + C + (size_t)h * hs;
                    float s = 0;
                    #pragma omp simd reduction(+ : s)
                    for (int i = 0; i < hs; i++) s += q[i] * k[i];
                    s *= scale;
                    a[t2] = s;
                    if (s > mx) mx = s;
                }
                #pragma omp simd
                for (int t2 = f; t2 <= t; t2++) a[t2] = dt_vexpf(a[t2] - mx);
                float sum = 0; /* in order: a row's sum the same whatever the rows beside it */
                for (int t2 = f; t2 <= t; t2++) sum += a[t2];
                float inv = 1.0f / sum;
                for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t && t2 >= f ? a[t2] * inv : 0.0f;
                float *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                memset(o, 0, sizeof(float) * (size_t)hs);
                for (int t2 = f; t2 <= t; t2++) {
                    const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                    #pragma omp simd
                    for (int i = 0; i < hs; i++) o[i] += a[t2] * v[i];
                }
            }
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C, int NH) {
    dt_attention_backward_docs(dqkv, dout, qkv, att, NULL, B, T, C, NH);
}

void dt_attention_backward_docs(float *dqkv, const float *dout, const float *qkv, const float *att, const int32_t *first, int B, int T,
                                int C, int NH) {
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
                    int f = first ? first[(size_t)b * T + t] : 0;
                    for (int t2 = f; t2 <= t; t2++) {
                        const float *v = qkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                        float *dv = dqkv + ((size_t)b * T + t2) * C3 + 2 * (size_t)C + (size_t)h * hs;
                        float d = 0;
                        #pragma omp simd reduction(+ : d)
                        for (int i = 0; i < hs; i++) { d += dy[i] * v[i]; dv[i] += a[t2] * dy[i]; }
                        datt[t2] = d;
                        dot += a[t2] * d;
                    }
                    /* through the softmax, then the scaled dot products */
                    for (int t2 = f; t2 <= t; t2++) {
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

/* Blockwise form: for each query row, keys are visited in blocks with a
 * running maximum and sum (online softmax), so no row of T scores is ever
 * kept; forward stores the row's log-sum-exp. Backward recomputes each
 * probability p = exp(s - lse) and uses D = dout . out for the softmax's
 * gradient (sum over the row of p * dp equals dout . out). The whole
 * sequence is one block of queries over one block of keys
 * (attention_block.c). */
void dt_attention_forward_lse(float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    dt_attention_forward_lse_docs(out, lse, qkv, NULL, B, T, C, NH);
}

void dt_attention_forward_lse_docs(float *out, float *lse, const float *qkv, const int32_t *first, int B, int T, int C, int NH) {
    size_t C3 = (size_t)C * 3;
    dt_attn_rows q = { qkv, C3, 0, T }, k = { qkv + C, C3, 0, T }, v = { qkv + 2 * (size_t)C, C3, 0, T };
    dt_attention_block_forward_docs(out, lse, &q, &k, &v, first, B, C, NH);
}

void dt_attention_backward_lse(float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse,
                               int B, int T, int C, int NH) {
    dt_attention_backward_lse_docs(dqkv, dout, out, qkv, lse, NULL, B, T, C, NH);
}

void dt_attention_backward_lse_docs(float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse,
                                    const int32_t *first, int B, int T, int C, int NH) {
    size_t C3 = (size_t)C * 3;
    dt_attn_rows q = { qkv, C3, 0, T }, k = { qkv + C, C3, 0, T }, v = { qkv + 2 * (size_t)C, C3, 0, T };
    dt_attn_grads g = { dqkv, dqkv + C, dqkv + 2 * (size_t)C, C3, C3 };
    dt_attention_block_backward_docs(&g, dout, out, lse, &q, &k, &v, first, B, C, NH);
}

void dt_attention_pack(float *packed, const float *in, int BT, int NH, int KVH, int d, const int *kv_of) {
    size_t Q = (size_t)NH * d, KV = (size_t)KVH * d, win = Q + 2 * KV;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *x = in + (size_t)r * win;
        float *o = packed + (size_t)r * 3 * Q;
        memcpy(o, x, Q * sizeof(float));
        for (int h = 0; h < NH; h++) {
            memcpy(o + Q + (size_t)h * d, x + Q + (size_t)kv_of[h] * d, (size_t)d * sizeof(float));
            memcpy(o + 2 * Q + (size_t)h * d, x + Q + KV + (size_t)kv_of[h] * d, (size_t)d * sizeof(float));
        }
    }
}

void dt_attention_unpack(float *din, const float *dpacked, int BT, int NH, int KVH, int d, const int *kv_of) {
    size_t Q = (size_t)NH * d, KV = (size_t)KVH * d, win = Q + 2 * KV;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *g = dpacked + (size_t)r * 3 * Q;
        float *o = din + (size_t)r * win;
        for (size_t j = 0; j < Q; j++) o[j] += g[j];
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < d; j++) {
                o[Q + (size_t)kv_of[h] * d + j] += g[Q + (size_t)h * d + j];
                o[Q + KV + (size_t)kv_of[h] * d + j] += g[2 * Q + (size_t)h * d + j];
            }
    }
}
