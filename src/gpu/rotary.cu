/* What attention reads when the model turns q and k by position or shares K/V heads (the Llama family): q|k|v of all
 * heads made from the Linear's q, K/V heads and v, and the rotary turn in place; their backward. The CPU's are
 * dt_attention_pack/unpack (kernels/attention.c) and dt_rope_forward/backward (kernels/rope.c). */
#include "gpu_internal.h"

#include <math.h>

#define THREADS 256

/* One thread a (row, head, pair): x[i], x[i + d/2] turned by sign * pos * inv_freq[i], pos = row % T. */
static __global__ void rope_k(float *x, const float *inv_freq, int rows, int T, int heads, int d, size_t stride, float sign) {
    size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    int h2 = d / 2;
    if (k >= (size_t)rows * heads * h2) return;
    int i = (int)(k % h2), h = (int)(k / h2 % heads);
    size_t r = k / ((size_t)h2 * heads);
    float a = (float)(int)(r % T) * inv_freq[i], c = cosf(a), s = sign * sinf(a);
    float *v = x + r * stride + (size_t)h * d;
    float x0 = v[i], x1 = v[i + h2];
    v[i] = x0 * c - x1 * s;
    v[i + h2] = x1 * c + x0 * s;
}

void dt_gpu_rope(dt_gpu *g, float *x, const float *inv_freq, int rows, int T, int heads, int d, size_t row_stride, int backward) {
    size_t n = (size_t)rows * heads * (d / 2);
    rope_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(x, inv_freq, rows, T, heads, d, row_stride, backward ? -1.0f : 1.0f);
    dt_gpu_check_launch(g, backward ? "rope backward" : "rope forward");
}

/* One thread an element of packed [BT, 3 Q]. */
static __global__ void pack_k(float *packed, const float *in, int BT, int NH, int KVH, int hd) {
    size_t Q = (size_t)NH * hd, KV = (size_t)KVH * hd, k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= (size_t)BT * 3 * Q) return;
    size_t r = k / (3 * Q), c = k % (3 * Q);
    const float *x = in + r * (Q + 2 * KV);
    if (c < Q) {
        packed[k] = x[c];
        return;
    }
    size_t part = c / Q, w = c % Q, h = w / hd, j = w % hd, kvh = h / (NH / KVH); /* part 1: k, 2: v */
    packed[k] = x[Q + (part - 1) * KV + kvh * hd + j];
}

/* One thread an element of d(in) [BT, Q + 2 KV]: q's as is, a K/V head's the sum over the heads that read it. */
static __global__ void unpack_k(float *din, const float *dpacked, int BT, int NH, int KVH, int hd) {
    size_t Q = (size_t)NH * hd, KV = (size_t)KVH * hd, W = Q + 2 * KV, k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= (size_t)BT * W) return;
    size_t r = k / W, c = k % W;
    const float *d = dpacked + r * 3 * Q;
    if (c < Q) {
        din[k] += d[c];
        return;
    }
    size_t part = (c - Q) / KV, w = (c - Q) % KV, kvh = w / hd, j = w % hd, group = (size_t)(NH / KVH);
    float s = 0;
    for (size_t h = kvh * group; h < (kvh + 1) * group; h++) s += d[(1 + part) * Q + h * hd + j];
    din[k] += s;
}

void dt_gpu_attention_pack(dt_gpu *g, float *packed, const float *in, int BT, int NH, int KVH, int hd) {
    size_t n = (size_t)BT * 3 * NH * hd;
    pack_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(packed, in, BT, NH, KVH, hd);
    dt_gpu_check_launch(g, "attention pack");
}

void dt_gpu_attention_unpack(dt_gpu *g, float *din, const float *dpacked, int BT, int NH, int KVH, int hd) {
    size_t n = (size_t)BT * (NH + 2 * KVH) * hd;
    unpack_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(din, dpacked, BT, NH, KVH, hd);
    dt_gpu_check_launch(g, "attention unpack");
}
