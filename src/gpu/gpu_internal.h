/* What the GPU layer's files share: the device's state and how a failure is kept. */
#ifndef DTRAIN_GPU_INTERNAL_H
#define DTRAIN_GPU_INTERNAL_H

#include "dtrain/gpu.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <stdio.h>

struct dt_gpu {
    int ordinal;
    cudaDeviceProp prop;
    cudaStream_t stream;
    cublasHandle_t blas;
    int tf32;      /* dt_gpu_set_tf32's */
    cudaEvent_t marks[DT_GPU_MARKS];
    int failed;    /* the first failure of queued work since the last dt_gpu_sync */
    char err[256];
    void *cudnn;   /* attention_cudnn.cpp's handle, graphs and workspace, made at its first call */
};

/* attention_cudnn.cpp's state freed (dt_gpu_close). */
void dt_gpu_cudnn_close(dt_gpu *g);

/* Keeps the first failure (what: the call; why: the runtime's words). */
void dt_gpu_fail(dt_gpu *g, const char *what, const char *why);
/* After a kernel's launch: its error, if any, kept. */
void dt_gpu_check_launch(dt_gpu *g, const char *what);
void dt_gpu_check_blas(dt_gpu *g, const char *what, cublasStatus_t s);

/* dbias[OC] += the column sums of dout[BT, OC] (kernels.cu); _lp: of dout's bf16 values. */
void dt_gpu_bias_backward(dt_gpu *g, float *dbias, const float *dout, int BT, int OC);
void dt_gpu_bias_backward_lp(dt_gpu *g, float *dbias, const float *dout, int BT, int OC);

#ifdef __CUDACC__
/* A warp's sum and maximum of one value a lane, every lane given it. */
static __device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

static __device__ __forceinline__ float warp_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* f32 to bf16's bits as dt_f32_to_bf16 rounds (to nearest even, a NaN kept quiet), and back. */
static __device__ __forceinline__ unsigned short bf16_bits(float f) {
    unsigned u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static __device__ __forceinline__ float bf16_value(unsigned short h) { return __uint_as_float((unsigned)h << 16); }

/* out[i] = y; with bits (bf16's outputs, for the Linear that reads them), y rounded first and its bits at bits[i] */
static __device__ __forceinline__ void store_out(float *out, uint16_t *bits, size_t i, float y) {
    if (bits) {
        unsigned short h = bf16_bits(y);
        bits[i] = h;
        y = bf16_value(h);
    }
    out[i] = y;
}

#endif

/* Blocks for n items at `threads` a block. */
static inline unsigned dt_gpu_blocks(size_t n, int threads) { return (unsigned)((n + threads - 1) / threads); }

#endif
