/* A Linear and causal attention through cuBLAS. cuBLAS is column-major: a row-major [R, K] matrix with rows ld
 * apart is, to it, a column-major [K, R] one with leading dimension ld, so each row-major product below is written
 * as its transpose (Y^T = W X^T for Y = X W^T). */
#include "gpu_internal.h"

#include <math.h>

static const float one = 1.0f, zero = 0.0f;

static __global__ void bias_rows_k(float *out, const float *bias, size_t n, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] += bias[i % OC];
}

void dt_gpu_matmul_forward(dt_gpu *g, float *out, const float *inp, const float *w, const float *bias, int BT, int C, int OC) {
    /* out^T [OC, BT] = (w as [C, OC])^T inp^T [C, BT] */
    dt_gpu_check_blas(g, "matmul forward",
                      cublasSgemm(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, &one, w, C, inp, C, &zero, out, OC));
    if (!bias) return;
    size_t n = (size_t)BT * OC;
    bias_rows_k<<<dt_gpu_blocks(n, 256), 256, 0, g->stream>>>(out, bias, n, OC);
    dt_gpu_check_launch(g, "matmul bias");
}

void dt_gpu_matmul_backward(dt_gpu *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                            int BT, int C, int OC) {
    /* dinp^T [C, BT] += (w as [C, OC]) dout^T [OC, BT] */
    if (dinp)
        dt_gpu_check_blas(g, "matmul backward (input)",
                          cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, &one, w, C, dout, OC, &one, dinp, C));
    /* dw as [C, OC] += inp^T [C, BT] (dout^T [OC, BT])^T */
    if (dw)
        dt_gpu_check_blas(g, "matmul backward (weight)",
                          cublasSgemm(g->blas, CUBLAS_OP_N, CUBLAS_OP_T, C, OC, BT, &one, inp, C, dout, OC, &one, dw, C));
    if (dbias) dt_gpu_bias_backward(g, dbias, dout, BT, OC);
}

/* ---- attention: per sequence, every head at once (strided batches over the heads) ---- */

/* Row i of a [T, T] score matrix (scaled already): the causal softmax in place, 0 above the diagonal. A warp a row. */
static __global__ void causal_softmax_k(float *s, int rows, int T) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    int i = r % T;
    float *x = s + (size_t)r * T;
    float mx = -INFINITY;
    for (int j = lane; j <= i; j += 32) mx = fmaxf(mx, x[j]);
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    float sum = 0;
    for (int j = lane; j <= i; j += 32) sum += expf(x[j] - mx);
    for (int o = 16; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
    float inv = 1.0f / sum;
    for (int j = lane; j < T; j += 32) x[j] = j <= i ? expf(x[j] - mx) * inv : 0.0f;
}

/* dS = P (dP - rowsum(P dP)) in place of dP, times scale. */
static __global__ void softmax_backward_k(float *dp, const float *p, int rows, int T, float scale) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= rows) return;
    int i = r % T;
    float *d = dp + (size_t)r * T;
    const float *a = p + (size_t)r * T;
    float dot = 0;
    for (int j = lane; j <= i; j += 32) dot += a[j] * d[j];
    for (int o = 16; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
    for (int j = lane; j < T; j += 32) d[j] = j <= i ? a[j] * (d[j] - dot) * scale : 0.0f;
}

static void batched(dt_gpu *g, const char *what, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, float alpha,
                    const float *a, int lda, long long sa, const float *b, int ldb, long long sb, float beta, float *c, int ldc,
                    long long sc, int count) {
    dt_gpu_check_blas(g, what,
                      cublasSgemmStridedBatched(g->blas, ta, tb, m, n, k, &alpha, a, lda, sa, b, ldb, sb, &beta, c, ldc, sc, count));
}

void dt_gpu_attention_forward(dt_gpu *g, float *out, float *att, const float *qkv, int B, int T, int C, int NH) {
    int hd = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    long long tt = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * ld, *k = q + C, *v = q + 2 * C;
        float *p = att + (size_t)b * NH * tt, *o = out + (size_t)b * T * C;
        /* S [T, T] = q k^T: as column-major S^T = (k^T)^T q^T */
        batched(g, "attention scores", CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, scale, k, ld, hd, q, ld, hd, 0.0f, p, T, tt, NH);
        int rows = NH * T;
        causal_softmax_k<<<dt_gpu_blocks((size_t)rows, 8), 256, 0, g->stream>>>(p, rows, T);
        dt_gpu_check_launch(g, "attention softmax");
        /* o [T, hd] = P v: o^T = v^T P^T */
        batched(g, "attention values", CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, v, ld, hd, p, T, tt, 0.0f, o, C, hd, NH);
    }
}

void dt_gpu_attention_backward(dt_gpu *g, float *dqkv, float *scratch, const float *dout, const float *qkv, const float *att, int B,
                               int T, int C, int NH) {
    int hd = C / NH, ld = 3 * C;
    float scale = 1.0f / sqrtf((float)hd);
    long long tt = (long long)T * T;
    for (int b = 0; b < B; b++) {
        const float *q = qkv + (size_t)b * T * ld, *k = q + C, *v = q + 2 * C;
        float *dq = dqkv + (size_t)b * T * ld, *dk = dq + C, *dv = dq + 2 * C;
        const float *p = att + (size_t)b * NH * tt, *dy = dout + (size_t)b * T * C;
        /* dP [T, T] = dy v^T: dP^T = (v^T)^T dy^T */
        batched(g, "attention dP", CUBLAS_OP_T, CUBLAS_OP_N, T, T, hd, 1.0f, v, ld, hd, dy, C, hd, 0.0f, scratch, T, tt, NH);
        /* dv [T, hd] += P^T dy: dv^T += dy^T P */
        batched(g, "attention dv", CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, dy, C, hd, p, T, tt, 1.0f, dv, ld, hd, NH);
        int rows = NH * T;
        softmax_backward_k<<<dt_gpu_blocks((size_t)rows, 8), 256, 0, g->stream>>>(scratch, p, rows, T, scale);
        dt_gpu_check_launch(g, "attention softmax backward");
        /* dq [T, hd] += dS k: dq^T += k^T dS^T */
        batched(g, "attention dq", CUBLAS_OP_N, CUBLAS_OP_N, hd, T, T, 1.0f, k, ld, hd, scratch, T, tt, 1.0f, dq, ld, hd, NH);
        /* dk [T, hd] += dS^T q: dk^T += q^T dS */
        batched(g, "attention dk", CUBLAS_OP_N, CUBLAS_OP_T, hd, T, T, 1.0f, q, ld, hd, scratch, T, tt, 1.0f, dk, ld, hd, NH);
    }
}
