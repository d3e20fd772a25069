/* Mixed precision on the device, as the CPU's (kernels/lowp.c, matmul.c's _lp kernels) and torch.autocast do it: f32
 * values rounded to bf16 (dt_f32_to_bf16's bits: to nearest even, a NaN kept quiet), packed into bf16 for the
 * tensor cores, and a Linear whose products are bf16 with f32 sums and whose outputs, input gradient and each use's
 * weight gradient are rounded to bf16 (cuBLAS's GemmEx: bf16 A and B, f32 C and compute). Activations stay in f32
 * buffers holding bf16 values, so every other kernel is the f32 one; a Linear's input may come with its bits, kept by
 * the kernel that made it, and is then not packed here. */
#include "gpu_internal.h"

#define THREADS 256

/* y = x rounded (y == x: in place); with bits, its bf16 bits there too */
static __global__ void round_k(float *y, const float *x, uint16_t *bits, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    unsigned short h = bf16_bits(x[i]);
    y[i] = bf16_value(h);
    if (bits) bits[i] = h;
}

static __global__ void pack_k(uint16_t *dst, const float *src, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = bf16_bits(src[i]);
}

/* dst += round(src): a use's 16-bit weight gradient summed into the f32 store */
static __global__ void round_add_k(float *dst, const float *src, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] += bf16_value(bf16_bits(src[i]));
}

/* out = round(out + bias) (bias in bf16; NULL: none), rows of OC */
static __global__ void bias_round_k(float *out, const uint16_t *bias, size_t n, int OC) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = bf16_value(bf16_bits(bias ? out[i] + bf16_value(bias[i % OC]) : out[i]));
}

void dt_gpu_round_bf16(dt_gpu *g, float *dst, const float *src, size_t n, uint16_t *bits) {
    round_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dst, src, bits, n);
    dt_gpu_check_launch(g, "round to bf16");
}

void dt_gpu_pack_bf16(dt_gpu *g, uint16_t *dst, const float *src, size_t n) {
    pack_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dst, src, n);
    dt_gpu_check_launch(g, "pack to bf16");
}

static __global__ void widen_k(float *dst, const uint16_t *src, size_t n, int add) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) dst[i] = add ? dst[i] + bf16_value(src[i]) : bf16_value(src[i]);
}

void dt_gpu_widen_bf16(dt_gpu *g, float *dst, const uint16_t *src, size_t n, int add) {
    widen_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dst, src, n, add);
    dt_gpu_check_launch(g, "widen from bf16");
}

static void round_add(dt_gpu *g, float *dst, const float *src, size_t n) {
    round_add_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dst, src, n);
    dt_gpu_check_launch(g, "bf16 gradient sum");
}

/* C (f32, column-major [m, n], ldc) = alpha op(A) op(B) + beta C, A and B bf16 */
static void gemm_bf16(dt_gpu *g, const char *what, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k, const uint16_t *a,
                      int lda, const uint16_t *b, int ldb, float beta, float *c, int ldc) {
    float one = 1.0f;
    dt_gpu_check_blas(g, what,
                      cublasGemmEx(g->blas, ta, tb, m, n, k, &one, a, CUDA_R_16BF, lda, b, CUDA_R_16BF, ldb, &beta, c, CUDA_R_32F, ldc,
                                   CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

/* The row-major products as matmul.cu writes them (each as its transpose to column-major cuBLAS). */
void dt_gpu_matmul_sums_bf16(dt_gpu *g, float *out, const float *inp, const uint16_t *inp16, const uint16_t *w, int BT, int C, int OC,
                             uint16_t *work) {
    if (!inp16) dt_gpu_pack_bf16(g, work, inp, (size_t)BT * C), inp16 = work;
    gemm_bf16(g, "bf16 matmul forward", CUBLAS_OP_T, CUBLAS_OP_N, OC, BT, C, w, C, inp16, C, 0.0f, out, OC);
}

void dt_gpu_matmul_forward_bf16(dt_gpu *g, float *out, const float *inp, const uint16_t *inp16, const uint16_t *w, const uint16_t *bias,
                                int BT, int C, int OC, uint16_t *work) {
    dt_gpu_matmul_sums_bf16(g, out, inp, inp16, w, BT, C, OC, work);
    size_t n = (size_t)BT * OC;
    bias_round_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(out, bias, n, OC);
    dt_gpu_check_launch(g, "bf16 matmul output");
}

void dt_gpu_matmul_backward_bf16(dt_gpu *g, float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const uint16_t *inp16,
                                 const uint16_t *w, int BT, int C, int OC, uint16_t *work16, float *work) {
    dt_gpu_pack_bf16(g, work16, dout, (size_t)BT * OC); /* the rounded dout, as bits: the products read them */
    dt_gpu_matmul_backward_bf16_from(g, dinp, dw, work16, inp, inp16, w, BT, C, OC, work16, work);
    if (dbias) { /* the rounded dout's column sums, rounded as a use's gradient */
        float *sum = work + (size_t)OC * C;
        dt_gpu_zero(g, sum, (size_t)OC * sizeof(float));
        dt_gpu_bias_backward_lp(g, sum, dout, BT, OC);
        round_add(g, dbias, sum, (size_t)OC);
    }
}

void dt_gpu_matmul_backward_bf16_from(dt_gpu *g, float *dinp, float *dw, const uint16_t *d16, const float *inp, const uint16_t *inp16,
                                      const uint16_t *w, int BT, int C, int OC, uint16_t *work16, float *work) {
    if (dinp) {
        gemm_bf16(g, "bf16 matmul backward (input)", CUBLAS_OP_N, CUBLAS_OP_N, C, BT, OC, w, C, d16, OC, 1.0f, dinp, C);
        dt_gpu_round_bf16(g, dinp, dinp, (size_t)BT * C, NULL);
    }
    if (dw) {
        const uint16_t *a16 = inp16;
        if (!a16) { /* packed after d16's room (work16's first BT x OC) */
            uint16_t *p = work16 + (size_t)BT * OC;
            dt_gpu_pack_bf16(g, p, inp, (size_t)BT * C);
            a16 = p;
        }
        gemm_bf16(g, "bf16 matmul backward (weight)", CUBLAS_OP_N, CUBLAS_OP_T, C, OC, BT, a16, C, d16, OC, 0.0f, work, C);
        round_add(g, dw, work, (size_t)OC * C);
    }
}
