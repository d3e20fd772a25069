/* The GPU itself: the device, its stream and cuBLAS handle, memory, events, and the kept first failure of queued
 * work (gpu.h). */
#include "gpu_internal.h"

#include <stdlib.h>
#include <string.h>

int dt_gpu_built(void) { return 1; }

void dt_gpu_fail(dt_gpu *g, const char *what, const char *why) {
    if (g->failed) return;
    g->failed = 1;
    snprintf(g->err, sizeof g->err, "%s: %s", what, why);
}

void dt_gpu_check_launch(dt_gpu *g, const char *what) {
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) dt_gpu_fail(g, what, cudaGetErrorString(e));
}

void dt_gpu_check_blas(dt_gpu *g, const char *what, cublasStatus_t s) {
    if (s != CUBLAS_STATUS_SUCCESS) dt_gpu_fail(g, what, cublasGetStatusString(s));
}

static dt_status cuda_error(const char *what, cudaError_t e) {
    return dt_error(DT_ERR_SYS, "%s: %s (CUDA error %d)", what, cudaGetErrorString(e), (int)e);
}

int dt_gpu_count(void) {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return n;
}

dt_status dt_gpu_open(int ordinal, dt_gpu **out) {
    *out = NULL;
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e == cudaErrorInsufficientDriver || e == cudaErrorNoDevice || e == cudaErrorInitializationError)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: no usable NVIDIA GPU here (%s)", cudaGetErrorString(e));
    if (e != cudaSuccess) return cuda_error("--device cuda: counting the GPUs", e);
    if (n == 0) return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the CUDA driver sees no GPU");
    if (ordinal < 0 || ordinal >= n) return dt_error(DT_ERR_ARG, "--device cuda:%d: this machine has GPUs 0..%d", ordinal, n - 1);
    dt_gpu *g = (dt_gpu *)calloc(1, sizeof *g);
    if (!g) return dt_error(DT_ERR_NOMEM, "dt_gpu_open: out of memory");
    g->ordinal = ordinal;
    dt_status st = DT_OK;
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess || (e = cudaGetDeviceProperties(&g->prop, ordinal)) != cudaSuccess ||
        (e = cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking)) != cudaSuccess)
        st = cuda_error("--device cuda: opening the GPU", e);
    for (int i = 0; !st && i < DT_GPU_MARKS; i++)
        if ((e = cudaEventCreate(&g->marks[i])) != cudaSuccess) st = cuda_error("--device cuda: an event", e);
    cublasStatus_t b = st ? CUBLAS_STATUS_SUCCESS : cublasCreate(&g->blas);
    if (!st && b != CUBLAS_STATUS_SUCCESS) st = dt_error(DT_ERR_SYS, "--device cuda: cuBLAS: %s", cublasGetStatusString(b));
    if (!st) {
        cublasSetStream(g->blas, g->stream);
        cublasSetMathMode(g->blas, CUBLAS_DEFAULT_MATH); /* f32 stays f32 (cuBLAS's default: TF32 only when asked) */
    }
    if (st) {
        dt_gpu_close(g);
        return st;
    }
    *out = g;
    return DT_OK;
}

void dt_gpu_close(dt_gpu *g) {
    if (!g) return;
    if (g->stream) cudaStreamSynchronize(g->stream);
    dt_gpu_cudnn_close(g);
    if (g->blas) cublasDestroy(g->blas);
    for (int i = 0; i < DT_GPU_MARKS; i++)
        if (g->marks[i]) cudaEventDestroy(g->marks[i]);
    if (g->stream) cudaStreamDestroy(g->stream);
    free(g);
}

void dt_gpu_set_tf32(dt_gpu *g, int on) {
    g->tf32 = on;
    cublasSetMathMode(g->blas, on ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH);
}

int dt_gpu_tf32(const dt_gpu *g) { return g->tf32; }

const char *dt_gpu_name(const dt_gpu *g) { return g->prop.name; }

int dt_gpu_ordinal(const dt_gpu *g) { return g->ordinal; }

void dt_gpu_props(const dt_gpu *g, int *sms, size_t *memory, int *capability) {
    if (sms) *sms = g->prop.multiProcessorCount;
    if (memory) *memory = g->prop.totalGlobalMem;
    if (capability) *capability = g->prop.major * 10 + g->prop.minor;
}

dt_status dt_gpu_mem_info(dt_gpu *g, size_t *free_bytes, size_t *total) {
    (void)g;
    cudaError_t e = cudaMemGetInfo(free_bytes, total);
    return e == cudaSuccess ? DT_OK : cuda_error("the GPU's free memory", e);
}

dt_status dt_gpu_alloc(dt_gpu *g, size_t bytes, void **out) {
    *out = NULL;
    if (bytes == 0) bytes = 16;
    cudaError_t e = cudaMalloc(out, bytes);
    if (e == cudaSuccess) return DT_OK;
    cudaGetLastError(); /* an out-of-memory is not sticky: clear it */
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    return dt_error(DT_ERR_NOMEM, "the GPU (%s) has no room for %.2f GiB: %.2f GiB of %.2f GiB free (%s)", g->prop.name,
                    bytes / 1073741824.0, fr / 1073741824.0, tot / 1073741824.0, cudaGetErrorString(e));
}

dt_status dt_gpu_host_alloc(dt_gpu *g, size_t bytes, void **out, int *pinned) {
    (void)g;
    *pinned = cudaHostAlloc(out, bytes ? bytes : 16, cudaHostAllocDefault) == cudaSuccess;
    if (!*pinned) cudaGetLastError(), *out = malloc(bytes ? bytes : 16); /* slower copies, the same results */
    return *out ? DT_OK : dt_error(DT_ERR_NOMEM, "no host memory for %zu bytes", bytes);
}

void dt_gpu_host_free(dt_gpu *g, void *p, int pinned) {
    (void)g;
    if (pinned) cudaFreeHost(p);
    else free(p);
}

int dt_gpu_host_pin(dt_gpu *g, void *p, size_t bytes, int on) {
    (void)g;
    cudaError_t e = on ? cudaHostRegister(p, bytes, cudaHostRegisterDefault) : cudaHostUnregister(p);
    if (e != cudaSuccess) cudaGetLastError(); /* not sticky: the copies go on from pageable memory */
    return e == cudaSuccess;
}

void dt_gpu_free(dt_gpu *g, void *p) {
    (void)g;
    if (p) cudaFree(p);
}

dt_status dt_gpu_upload(dt_gpu *g, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? DT_OK : cuda_error("copying to the GPU", e);
}

dt_status dt_gpu_download(dt_gpu *g, void *dst, const void *src, size_t bytes) {
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g->stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    return e == cudaSuccess ? DT_OK : cuda_error("copying from the GPU", e);
}

void dt_gpu_zero(dt_gpu *g, void *p, size_t bytes) {
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, g->stream);
    if (e != cudaSuccess) dt_gpu_fail(g, "zeroing", cudaGetErrorString(e));
}

dt_status dt_gpu_sync(dt_gpu *g) {
    cudaError_t e = cudaStreamSynchronize(g->stream);
    if (e != cudaSuccess) dt_gpu_fail(g, "the queued GPU work", cudaGetErrorString(e));
    if (!g->failed) return DT_OK;
    g->failed = 0;
    return dt_error(DT_ERR_SYS, "GPU: %s", g->err);
}

dt_status dt_gpu_mark(dt_gpu *g, int slot) {
    if (slot < 0 || slot >= DT_GPU_MARKS) return dt_error(DT_ERR_ARG, "dt_gpu_mark: slot %d", slot);
    cudaError_t e = cudaEventRecord(g->marks[slot], g->stream);
    return e == cudaSuccess ? DT_OK : cuda_error("an event", e);
}

double dt_gpu_elapsed_ms(dt_gpu *g, int from, int to) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, g->marks[from], g->marks[to]) != cudaSuccess) return -1;
    return ms;
}
