/* Causal multi-head self-attention: softmax(q k^T / sqrt(hs)) v per head,
 * position t attending to positions 0..t. The softmax rows are kept in
 * att[B,NH,T,T] for backward. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    dt_attention_forward_docs(out, att, qkv, NULL, B, T, C, NH);
}

/* Row t of a head's scores [T] to its probabilities over [f, t], zero elsewhere (the softmax's exponentials in a
 * vector loop, their sum in order: a row's values the same whatever rows come with it). */
static void softmax_row(float *a, int f, int t, int T) {
    float mx = -INFINITY;
    for (int t2 = f; t2 <= t; t2++) mx = a[t2] > mx ? a[t2] : mx;
    #pragma omp simd
    for (int t2 = f; t2 <= t; t2++) a[t2] = dt_vexpf(a[t2] - mx);
    float sum = 0;
    for (int t2 = f; t2 <= t; t2++) sum += a[t2];
    float inv = 1.0f / sum;
    for (int t2 = 0; t2 < T; t2++) a[t2] = t2 <= t && t2 >= f ? a[t2] * inv : 0.0f;
}

/* A head of a sequence at a time (b, h), its products by BLAS (one thread each: the heads are the threads' work):
 * scores = q k^T / sqrt(hs) [T, T], the rows' softmax, out = att v. The upper triangle's products are made and
 * thrown away: BLAS's rate on the whole square beats a loop's on the half. */
void dt_attention_forward_docs(float *out, float *att, const float *qkv, const int32_t *first, int B, int T, int C, int NH) {
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, (int)C3, k, (int)C3, 0.0f, a, T);
            for (int t = 0; t < T; t++) softmax_row(a + (size_t)t * T, first ? first[(size_t)b * T + t] : 0, t, T);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, (int)C3, 0.0f, out + (size_t)b * T * C + (size_t)h * hs, C);
        }
}

void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C, int NH) {
    dt_attention_backward_docs(dqkv, dout, qkv, att, NULL, B, T, C, NH);
}

/* A head at a time, as forward: dv += att^T dout; d(att) = dout v^T; through the softmax, row by row (d(pre) = att
 * (d(att) - att . d(att)) / sqrt(hs), zero where att is); dq += d(pre) k; dk += d(pre)^T q. */
void dt_attention_backward_docs(float *dqkv, const float *dout, const float *qkv, const float *att, const int32_t *first, int B, int T,
                                int C, int NH) {
    (void)first; /* att is zero outside each row's document: d(pre) follows it */
    int hs = C / NH;
    float scale = 1.0f / sqrtf((float)hs);
    size_t C3 = (size_t)C * 3;
    #pragma omp parallel
    {
        float *da = malloc(sizeof(float) * (size_t)T * T);
        #pragma omp for collapse(2) schedule(static)
        for (int b = 0; b < B; b++)
            for (int h = 0; h < NH; h++) {
                const float *q = qkv + (size_t)b * T * C3 + (size_t)h * hs, *k = q + C, *v = q + 2 * (size_t)C;
                const float *dy = dout + (size_t)b * T * C + (size_t)h * hs, *a = att + ((size_t)b * NH + h) * T * T;
                float *dq = dqkv + (size_t)b * T * C3 + (size_t)h * hs, *dk = dq + C, *dv = dq + 2 * (size_t)C;
                if (!da) { /* no room for the head's T x T: its gradients NaN, which stops the step loudly */
                    for (int t = 0; t < T; t++)
                        for (int i = 0; i < hs; i++) dq[(size_t)t * C3 + i] = dk[(size_t)t * C3 + i] = dv[(size_t)t * C3 + i] = NAN;
                    continue;
                }
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, dy, C, 1.0f, dv, (int)C3);
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, dy, C, v, (int)C3, 0.0f, da, T);
                for (int t = 0; t < T; t++) {
                    const float *ar = a + (size_t)t * T;
                    float *d = da + (size_t)t * T, dot = 0;
                    for (int t2 = 0; t2 <= t; t2++) dot += ar[t2] * d[t2];
                    #pragma omp simd
                    for (int t2 = 0; t2 < T; t2++) d[t2] = ar[t2] * (d[t2] - dot) * scale;
                }
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, k, (int)C3, 1.0f, dq, (int)C3);
                cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, da, T, q, (int)C3, 1.0f, dk, (int)C3);
            }
        free(da);
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
