/* The device's two ceilings, measured as the method says: a large product (random values: zeros run faster) and a
 * large device-to-device copy, each timed with events after warm-ups, the median of ten. */
#include "gpu_internal.h"

#include <cuda_bf16.h>
#include <stdlib.h>

#define WARMUPS 3
#define REPEATS 10

static __global__ void fill_k(float *x, size_t n, uint32_t seed) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    x[i] = (float)(h & 0xffff) / 65536.0f - 0.5f;
}

static __global__ void to_bf16_k(__nv_bfloat16 *y, const float *x, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = __float2bfloat16(x[i]);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median milliseconds of REPEATS runs of fn after WARMUPS. */
typedef void (*run_fn)(dt_gpu *g, void *ctx);
static dt_status median_ms(dt_gpu *g, run_fn fn, void *ctx, double *ms) {
    double t[REPEATS];
    for (int i = 0; i < WARMUPS; i++) fn(g, ctx);
    for (int i = 0; i < REPEATS; i++) {
        dt_gpu_mark(g, 0);
        fn(g, ctx);
        dt_gpu_mark(g, 1);
        dt_status st = dt_gpu_sync(g);
        if (st) return st;
        t[i] = dt_gpu_elapsed_ms(g, 0, 1);
    }
    qsort(t, REPEATS, sizeof *t, cmp_double);
    *ms = t[REPEATS / 2];
    return DT_OK;
}

typedef struct {
    int bf16, M, N, K;
    void *a, *b, *c;
} gemm_ctx;

static void run_gemm(dt_gpu *g, void *p) {
    gemm_ctx *x = (gemm_ctx *)p;
    float one = 1, zero = 0;
    cudaDataType_t t = x->bf16 ? CUDA_R_16BF : CUDA_R_32F;
    dt_gpu_check_blas(g, "gemm measure",
                      cublasGemmEx(g->blas, CUBLAS_OP_T, CUBLAS_OP_N, x->M, x->N, x->K, &one, x->a, t, x->K, x->b, t, x->K, &zero, x->c,
                                   t, x->M, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

dt_status dt_gpu_measure_gemm(dt_gpu *g, int bf16, int M, int N, int K, double *tflops) {
    size_t na = (size_t)M * K, nb = (size_t)K * N, nc = (size_t)M * N, es = bf16 ? 2 : 4;
    gemm_ctx x = { bf16, M, N, K, NULL, NULL, NULL };
    float *tmp = NULL;
    dt_status st = dt_gpu_alloc(g, (na > nb ? na : nb) * 4, (void **)&tmp);
    if (!st) st = dt_gpu_alloc(g, na * es, &x.a);
    if (!st) st = dt_gpu_alloc(g, nb * es, &x.b);
    if (!st) st = dt_gpu_alloc(g, nc * es, &x.c);
    void *dst[2] = { x.a, x.b };
    size_t cnt[2] = { na, nb };
    for (int i = 0; !st && i < 2; i++) {
        fill_k<<<dt_gpu_blocks(cnt[i], 256), 256, 0, g->stream>>>(bf16 ? tmp : (float *)dst[i], cnt[i], 17u + i);
        if (bf16) to_bf16_k<<<dt_gpu_blocks(cnt[i], 256), 256, 0, g->stream>>>((__nv_bfloat16 *)dst[i], tmp, cnt[i]);
        dt_gpu_check_launch(g, "gemm measure: filling");
    }
    double ms = 0;
    if (!st) st = median_ms(g, run_gemm, &x, &ms);
    if (!st) *tflops = 2.0 * M * N * K / (ms * 1e-3) / 1e12;
    dt_gpu_free(g, tmp);
    dt_gpu_free(g, x.a);
    dt_gpu_free(g, x.b);
    dt_gpu_free(g, x.c);
    return st;
}

typedef struct {
    void *src, *dst;
    size_t bytes;
} copy_ctx;

static void run_copy(dt_gpu *g, void *p) {
    copy_ctx *x = (copy_ctx *)p;
    cudaError_t e = cudaMemcpyAsync(x->dst, x->src, x->bytes, cudaMemcpyDeviceToDevice, g->stream);
    if (e != cudaSuccess) dt_gpu_fail(g, "copy measure", cudaGetErrorString(e));
}

dt_status dt_gpu_measure_copy(dt_gpu *g, size_t bytes, double *gbs) {
    copy_ctx x = { NULL, NULL, bytes };
    dt_status st = dt_gpu_alloc(g, bytes, &x.src);
    if (!st) st = dt_gpu_alloc(g, bytes, &x.dst);
    if (!st) {
        fill_k<<<dt_gpu_blocks(bytes / 4, 256), 256, 0, g->stream>>>((float *)x.src, bytes / 4, 5u);
        dt_gpu_check_launch(g, "copy measure: filling");
    }
    double ms = 0;
    if (!st) st = median_ms(g, run_copy, &x, &ms);
    if (!st) *gbs = 2.0 * bytes / (ms * 1e-3) / 1e9;
    dt_gpu_free(g, x.src);
    dt_gpu_free(g, x.dst);
    return st;
}
