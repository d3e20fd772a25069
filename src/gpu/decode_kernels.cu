/* The decoder's own kernels (gpu.h's decoding section): a step's rows each at their own slot and position, so the
 * embedding and the rotary turn read positions from the rows, and attention reads the keys and values of the cache.
 * The CPU's are in src/infer/decoder_step.c. */
#include "gpu_internal.h"

#include <math.h>

#define THREADS 256
#define ATT_THREADS 128

static __global__ void embed_rows_k(float *out, const int32_t *rows, const float *wte, const float *wpe, int n, int C) {
    size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= (size_t)n * C) return;
    size_t r = k / C, c = k % C;
    float x = wte[(size_t)rows[4 * r + 2] * C + c];
    out[k] = wpe ? x + wpe[(size_t)rows[4 * r + 1] * C + c] : x;
}

void dt_gpu_embed_rows(dt_gpu *g, float *out, const int32_t *rows, const float *wte, const float *wpe, int n, int C) {
    size_t cnt = (size_t)n * C;
    embed_rows_k<<<dt_gpu_blocks(cnt, THREADS), THREADS, 0, g->stream>>>(out, rows, wte, wpe, n, C);
    dt_gpu_check_launch(g, "decoder embedding");
}

/* One thread a (row, head, pair), as rotary.cu's rope_k with the row's position. */
static __global__ void rope_rows_k(float *x, const float *inv_freq, const int32_t *rows, int n, int heads, int d, size_t stride) {
    size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    int h2 = d / 2;
    if (k >= (size_t)n * heads * h2) return;
    int i = (int)(k % h2), h = (int)(k / h2 % heads);
    size_t r = k / ((size_t)h2 * heads);
    float a = (float)rows[4 * r + 1] * inv_freq[i], c = cosf(a), s = sinf(a);
    float *v = x + r * stride + (size_t)h * d;
    float x0 = v[i], x1 = v[i + h2];
    v[i] = x0 * c - x1 * s;
    v[i + h2] = x1 * c + x0 * s;
}

void dt_gpu_rope_rows(dt_gpu *g, float *x, const float *inv_freq, const int32_t *rows, int n, int heads, int d, size_t row_stride) {
    size_t cnt = (size_t)n * heads * (d / 2);
    rope_rows_k<<<dt_gpu_blocks(cnt, THREADS), THREADS, 0, g->stream>>>(x, inv_freq, rows, n, heads, d, row_stride);
    dt_gpu_check_launch(g, "decoder rope");
}

/* Where slot s's layer l keys (kv 0) or values (1) begin. */
static __device__ float *kv_base(dt_gpu_kv kv, int s, int l, int part) {
    return kv.cache + (size_t)s * kv.slot_elems + ((size_t)l * 2 + part) * kv.P * (size_t)kv.KVH * kv.hd;
}

/* One thread an element of a row's k or v: stored at its slot and position. */
static __global__ void cache_put_k(dt_gpu_kv kv, const float *in, const int32_t *rows, int n, int l, int Q, int win) {
    size_t KV = (size_t)kv.KVH * kv.hd, k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= (size_t)n * 2 * KV) return;
    size_t r = k / (2 * KV), c = k % (2 * KV);
    int part = (int)(c / KV);
    kv_base(kv, rows[4 * r], l, part)[(size_t)rows[4 * r + 1] * KV + c % KV] = in[r * win + Q + c];
}

/* The block's sum or max (every thread gets it); red: 32 floats of shared memory. */
static __device__ float block_all(float v, bool is_max, float *red) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    __syncthreads(); /* red may still be read from the last call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float x = lane < nw ? red[lane] : (is_max ? -INFINITY : 0.0f);
    return is_max ? warp_max(x) : warp_sum(x);
}

#define CHUNK 2048 /* positions scored at a time by default: 8 KB of shared memory */
#define ACC ((DT_GPU_DECODE_HEAD_MAX + ATT_THREADS - 1) / ATT_THREADS) /* a thread's sums, at most */

/* One block a (row, head), over the slot's positions 0..pos a chunk at a time: the chunk's scores (a warp a position,
 * its lanes over the head's channels), then the softmax's running maximum m and sum l brought up to the chunk (what
 * was summed before scaled by exp(m_old - m)), and each channel's weighted sum of values in `parts` interleaved runs,
 * kept by the thread that owns it; at the end the runs are added in order and divided by l. Shared memory: a chunk's
 * scores, the runs' sums, the reduction's 32. */
static __global__ void attend_k(float *out, dt_gpu_kv kv, const float *in, const int32_t *rows, int l, int NH, int win, float scale,
                                int chunk) {
    extern __shared__ float sm[];
    int r = blockIdx.x / NH, h = blockIdx.x % NH, hd = kv.hd, group = NH / kv.KVH;
    int slot = rows[4 * r], npos = rows[4 * r + 1] + 1, lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int parts = hd <= (int)blockDim.x ? blockDim.x / hd : 1, owned = parts * hd;
    float *s = sm, *part = sm + chunk, *red = part + owned;
    size_t KV = (size_t)kv.KVH * hd;
    const float *q = in + (size_t)r * win + (size_t)h * hd, *K = kv_base(kv, slot, l, 0) + (size_t)(h / group) * hd;
    const float *V = kv_base(kv, slot, l, 1) + (size_t)(h / group) * hd;
    float m = -INFINITY, lsum = 0, acc[ACC];
    for (int a = 0; a < ACC; a++) acc[a] = 0;
    for (int c0 = 0; c0 < npos; c0 += chunk) {
        int cn = npos - c0 < chunk ? npos - c0 : chunk;
        for (int t = warp; t < cn; t += nw) {
            float d = 0;
            for (int j = lane; j < hd; j += 32) d += q[j] * K[(size_t)(c0 + t) * KV + j];
            d = warp_sum(d);
            if (lane == 0) s[t] = d * scale;
        }
        __syncthreads();
        float mx = -INFINITY;
        for (int t = threadIdx.x; t < cn; t += blockDim.x) mx = fmaxf(mx, s[t]);
        float mn = fmaxf(m, block_all(mx, true, red)), f = expf(m - mn); /* f 0 at the first chunk (m -inf) */
        float sum = 0;
        for (int t = threadIdx.x; t < cn; t += blockDim.x) sum += (s[t] = expf(s[t] - mn));
        lsum = lsum * f + block_all(sum, false, red); /* its __syncthreads also orders the exponentials before they are read */
        for (int a = 0; a < ACC; a++) {
            int i = threadIdx.x + a * blockDim.x;
            if (i >= owned) break;
            float y = acc[a] * f;
            for (int t = i / hd; t < cn; t += parts) y += s[t] * V[(size_t)(c0 + t) * KV + i % hd];
            acc[a] = y;
        }
        m = mn;
        __syncthreads(); /* the chunk's scores read by all before the next chunk writes them */
    }
    for (int a = 0; a < ACC; a++)
        if (threadIdx.x + a * blockDim.x < owned) part[threadIdx.x + a * blockDim.x] = acc[a];
    __syncthreads();
    for (int j = threadIdx.x; j < hd; j += blockDim.x) {
        float y = 0;
        for (int p = 0; p < parts; p++) y += part[p * hd + j];
        out[(size_t)r * NH * hd + (size_t)h * hd + j] = y / lsum;
    }
}

void dt_gpu_attention_cached(dt_gpu *g, float *out, const dt_gpu_kv *kv, const float *in, const int32_t *rows, int n, int l, int NH,
                             int win) {
    size_t cnt = (size_t)n * 2 * kv->KVH * kv->hd;
    cache_put_k<<<dt_gpu_blocks(cnt, THREADS), THREADS, 0, g->stream>>>(*kv, in, rows, n, l, NH * kv->hd, win);
    dt_gpu_check_launch(g, "decoder cache");
    int chunk = kv->chunk > 0 ? kv->chunk : CHUNK, parts = kv->hd <= ATT_THREADS ? ATT_THREADS / kv->hd : 1;
    size_t smem = sizeof(float) * ((size_t)chunk + (size_t)parts * kv->hd + 32);
    attend_k<<<(unsigned)n * NH, ATT_THREADS, smem, g->stream>>>(out, *kv, in, rows, l, NH, win, 1.0f / sqrtf((float)kv->hd), chunk);
    dt_gpu_check_launch(g, "decoder attention");
}

static __global__ void gather_k(float *out, const float *in, const int32_t *idx, int m, int C) {
    size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (k >= (size_t)m * C) return;
    out[k] = in[(size_t)idx[k / C] * C + k % C];
}

void dt_gpu_gather_rows(dt_gpu *g, float *out, const float *in, const int32_t *idx, int m, int C) {
    size_t cnt = (size_t)m * C;
    gather_k<<<dt_gpu_blocks(cnt, THREADS), THREADS, 0, g->stream>>>(out, in, idx, m, C);
    dt_gpu_check_launch(g, "decoder gather");
}
