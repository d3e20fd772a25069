/* The element-wise and row-wise kernels (GELU, the residual add, LayerNorm, the embedding, softmax cross-entropy,
 * AdamW): the CPU kernels' arithmetic on device buffers. Row-wise ones run a warp or a block a row; sums over rows
 * (a norm's weight gradient, a bias's) go through partial sums a block of rows, then one atomic add each. */
#include "gpu_internal.h"

#include <math.h>

#define THREADS 256
#define ROWS_PER_BLOCK 64 /* rows summed by one block before its atomic add */

/* A block's sum (or max) of one value a thread, every thread given it. */
static __device__ float block_reduce(float v, bool is_max) {
    __shared__ float part[32];
    __shared__ float total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    v = is_max ? warp_max(v) : warp_sum(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        float x = lane < nw ? part[lane] : (is_max ? -INFINITY : 0.0f);
        x = is_max ? warp_max(x) : warp_sum(x);
        if (lane == 0) total = x;
    }
    __syncthreads();
    float r = total;
    __syncthreads();
    return r;
}

/* ---- GELU (tanh approximation), the residual add ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2 / pi) */

static __global__ void gelu_forward_k(float *out, uint16_t *bits, const float *inp, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i];
    store_out(out, bits, i, 0.5f * x * (1.0f + tanhf(GELU_K * (x + 0.044715f * x * x * x))));
}

static __global__ void gelu_backward_k(float *dinp, const float *inp, const float *dout, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float x = inp[i], t = tanhf(GELU_K * (x + 0.044715f * x * x * x)), sech2 = 1.0f - t * t;
    float grad = 0.5f * (1.0f + t) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
    dinp[i] += grad * dout[i];
}

static __global__ void add_k(float *out, const float *a, const float *b, size_t n) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) out[i] = a[i] + b[i];
}

void dt_gpu_gelu_forward(dt_gpu *g, float *out, const float *inp, size_t n, uint16_t *bits) {
    gelu_forward_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(out, bits, inp, n);
    dt_gpu_check_launch(g, "gelu forward");
}

void dt_gpu_gelu_backward(dt_gpu *g, float *dinp, const float *inp, const float *dout, size_t n) {
    gelu_backward_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dinp, inp, dout, n);
    dt_gpu_check_launch(g, "gelu backward");
}

void dt_gpu_residual_forward(dt_gpu *g, float *out, const float *a, const float *b, size_t n) {
    add_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(out, a, b, n);
    dt_gpu_check_launch(g, "residual add");
}

void dt_gpu_accumulate(dt_gpu *g, float *dst, const float *src, size_t n) {
    add_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dst, dst, src, n);
    dt_gpu_check_launch(g, "accumulate");
}

/* ---- column sums over rows: a bias's gradient, a LayerNorm's weight and bias gradients ---- */

/* db[c] += sum over rows of dy[r, c] (db NULL: not wanted); with rstd also dw[c] += sum of dy * (x - mean) * rstd
 * (LayerNorm's; mean NULL: RMSNorm's x * rstd). A block takes THREADS columns of ROWS_PER_BLOCK rows. */
/* x[i], or its bf16 value (in bf16, a norm's backward reads its input so, a bias's gradient its output gradient) */
static __device__ __forceinline__ float input_at(const float *x, size_t i, int round) {
    return round ? bf16_value(bf16_bits(x[i])) : x[i];
}

static __global__ void column_sums_k(float *dw, float *db, const float *dy, int round_dy, const float *x, int round, const float *mean,
                                     const float *rstd, int N, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x, r0 = blockIdx.y * ROWS_PER_BLOCK;
    if (c >= C) return;
    int r1 = min(N, r0 + ROWS_PER_BLOCK);
    float sb = 0, sw = 0;
    for (int r = r0; r < r1; r++) {
        float d = input_at(dy, (size_t)r * C + c, round_dy);
        sb += d;
        if (rstd) sw += d * (input_at(x, (size_t)r * C + c, round) - (mean ? mean[r] : 0.0f)) * rstd[r];
    }
    if (db) atomicAdd(db + c, sb);
    if (rstd && dw) atomicAdd(dw + c, sw);
}

static void column_sums(dt_gpu *g, float *dw, float *db, const float *dy, int round_dy, const float *x, int round, const float *mean,
                        const float *rstd, int N, int C, const char *what) {
    dim3 grid(dt_gpu_blocks((size_t)C, THREADS), dt_gpu_blocks((size_t)N, ROWS_PER_BLOCK));
    column_sums_k<<<grid, THREADS, 0, g->stream>>>(dw, db, dy, round_dy, x, round, mean, rstd, N, C);
    dt_gpu_check_launch(g, what);
}

void dt_gpu_bias_backward(dt_gpu *g, float *dbias, const float *dout, int BT, int OC) {
    column_sums(g, NULL, dbias, dout, 0, NULL, 0, NULL, NULL, BT, OC, "bias backward");
}

void dt_gpu_bias_backward_lp(dt_gpu *g, float *dbias, const float *dout, int BT, int OC) {
    column_sums(g, NULL, dbias, dout, 1, NULL, 0, NULL, NULL, BT, OC, "bf16 bias backward");
}

/* ---- LayerNorm: a warp a row ---- */

static __global__ void layernorm_forward_k(float *out, uint16_t *bits, float *mean, float *rstd, const float *inp, const float *w,
                                           const float *b, int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float s = 0;
    for (int c = lane; c < C; c += 32) s += x[c];
    float m = warp_sum(s) / C;
    float v = 0;
    for (int c = lane; c < C; c += 32) v += (x[c] - m) * (x[c] - m);
    float r = 1.0f / sqrtf(warp_sum(v) / C + 1e-5f);
    size_t o = (size_t)row * C;
    for (int c = lane; c < C; c += 32) store_out(out, bits, o + c, (x[c] - m) * r * w[c] + b[c]);
    if (lane == 0) mean[row] = m, rstd[row] = r;
}

static __global__ void layernorm_backward_k(float *dinp, const float *dout, const float *inp, int round, const float *w, const float *mean,
                                            const float *rstd, int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float m = mean[row], r = rstd[row], a = 0, b = 0;
    for (int c = lane; c < C; c += 32) {
        float norm = (input_at(x, c, round) - m) * r, dn = w[c] * dy[c];
        a += dn;
        b += dn * norm;
    }
    a = warp_sum(a) / C;
    b = warp_sum(b) / C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
        float norm = (input_at(x, c, round) - m) * r;
        dx[c] += (w[c] * dy[c] - a - norm * b) * r;
    }
}

void dt_gpu_layernorm_forward(dt_gpu *g, float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N,
                              int C, uint16_t *bits) {
    layernorm_forward_k<<<dt_gpu_blocks((size_t)N, THREADS / 32), THREADS, 0, g->stream>>>(out, bits, mean, rstd, inp, w, b, N, C);
    dt_gpu_check_launch(g, "layernorm forward");
}

void dt_gpu_layernorm_backward(dt_gpu *g, float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                               const float *mean, const float *rstd, int N, int C, int round_in) {
    layernorm_backward_k<<<dt_gpu_blocks((size_t)N, THREADS / 32), THREADS, 0, g->stream>>>(dinp, dout, inp, round_in, w, mean, rstd, N, C);
    dt_gpu_check_launch(g, "layernorm backward");
    column_sums(g, dw, db, dout, 0, inp, round_in, mean, rstd, N, C, "layernorm weight gradients");
}

/* ---- RMSNorm: a warp a row ---- */

static __global__ void rmsnorm_forward_k(float *out, uint16_t *bits, float *rstd, const float *inp, const float *w, int N, int C,
                                         float eps) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C;
    float ss = 0;
    for (int c = lane; c < C; c += 32) ss += x[c] * x[c];
    float s = 1.0f / sqrtf(warp_sum(ss) / C + eps);
    size_t o = (size_t)row * C;
    for (int c = lane; c < C; c += 32) store_out(out, bits, o + c, x[c] * s * w[c]);
    if (lane == 0) rstd[row] = s;
}

static __global__ void rmsnorm_backward_k(float *dinp, const float *dout, const float *inp, int round, const float *w, const float *rstd,
                                          int N, int C) {
    int row = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const float *x = inp + (size_t)row * C, *dy = dout + (size_t)row * C;
    float s = rstd[row], dot = 0;
    for (int c = lane; c < C; c += 32) dot += w[c] * dy[c] * input_at(x, c, round) * s;
    dot = warp_sum(dot) / C;
    float *dx = dinp + (size_t)row * C;
    for (int c = lane; c < C; c += 32) dx[c] += (w[c] * dy[c] - input_at(x, c, round) * s * dot) * s;
}

void dt_gpu_rmsnorm_forward(dt_gpu *g, float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps, uint16_t *bits) {
    rmsnorm_forward_k<<<dt_gpu_blocks((size_t)N, THREADS / 32), THREADS, 0, g->stream>>>(out, bits, rstd, inp, w, N, C, eps);
    dt_gpu_check_launch(g, "rmsnorm forward");
}

void dt_gpu_rmsnorm_backward(dt_gpu *g, float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd,
                             int N, int C, int round_in) {
    rmsnorm_backward_k<<<dt_gpu_blocks((size_t)N, THREADS / 32), THREADS, 0, g->stream>>>(dinp, dout, inp, round_in, w, rstd, N, C);
    dt_gpu_check_launch(g, "rmsnorm backward");
    column_sums(g, dw, NULL, dout, 0, inp, round_in, NULL, rstd, N, C, "rmsnorm weight gradient");
}

/* ---- SwiGLU ---- */

static __global__ void swiglu_forward_k(float *out, uint16_t *bits, const float *gu, int N, int F) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    size_t r = i / F, j = i % F;
    float gv = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j];
    store_out(out, bits, i, gv / (1.0f + expf(-gv)) * u);
}

static __global__ void swiglu_backward_k(float *dgu, const float *gu, const float *dout, int N, int F) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)N * F) return;
    size_t r = i / F, j = i % F;
    float gv = gu[r * 2 * F + j], u = gu[r * 2 * F + F + j], dy = dout[i], sg = 1.0f / (1.0f + expf(-gv));
    dgu[r * 2 * F + j] += dy * u * sg * (1.0f + gv * (1.0f - sg));
    dgu[r * 2 * F + F + j] += dy * gv * sg;
}

void dt_gpu_swiglu_forward(dt_gpu *g, float *out, const float *gu, int N, int F, uint16_t *bits) {
    swiglu_forward_k<<<dt_gpu_blocks((size_t)N * F, THREADS), THREADS, 0, g->stream>>>(out, bits, gu, N, F);
    dt_gpu_check_launch(g, "swiglu forward");
}

void dt_gpu_swiglu_backward(dt_gpu *g, float *dgu, const float *gu, const float *dout, int N, int F) {
    swiglu_backward_k<<<dt_gpu_blocks((size_t)N * F, THREADS), THREADS, 0, g->stream>>>(dgu, gu, dout, N, F);
    dt_gpu_check_launch(g, "swiglu backward");
}

/* ---- the embedding ---- */

static __global__ void embedding_forward_k(float *out, const int32_t *tok, const float *wte, const float *wpe, int BT, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    out[i] = wte[(size_t)tok[r] * C + c] + (wpe ? wpe[(size_t)(r % T) * C + c] : 0.0f);
}

static __global__ void embedding_backward_k(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int BT, int T, int C) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= (size_t)BT * C) return;
    int r = (int)(i / C), c = (int)(i % C);
    float d = dout[i];
    if (dwte) atomicAdd(dwte + (size_t)tok[r] * C + c, d);
    if (dwpe) atomicAdd(dwpe + (size_t)(r % T) * C + c, d);
}

void dt_gpu_embedding_forward(dt_gpu *g, float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    embedding_forward_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(out, tok, wte, wpe, B * T, T, C);
    dt_gpu_check_launch(g, "embedding forward");
}

void dt_gpu_embedding_backward(dt_gpu *g, float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    embedding_backward_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(dwte, dwpe, dout, tok, B * T, T, C);
    dt_gpu_check_launch(g, "embedding backward");
}

/* ---- softmax cross-entropy, fused with its gradient: a block a row ---- */

static __global__ void crossentropy_k(float *logits, float *losses, const int32_t *targets, int V, int Vp, float dscale) {
    int row = blockIdx.x;
    float *x = logits + (size_t)row * Vp;
    int t = targets[row];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, x[j]);
    mx = block_reduce(mx, true);
    float s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(x[j] - mx);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) losses[row] = t >= 0 ? logf(s) + mx - x[t] : 0.0f;
    __syncthreads(); /* x[t] read before it is overwritten */
    float inv = 1.0f / s;
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float d = 0;
        if (t >= 0 && j < V) d = (expf(x[j] - mx) * inv - (j == t ? 1.0f : 0.0f)) * dscale;
        x[j] = d;
    }
}

void dt_gpu_crossentropy_fused(dt_gpu *g, float *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale) {
    crossentropy_k<<<BT, 1024, 0, g->stream>>>(logits, losses, targets, V, Vp, dscale);
    dt_gpu_check_launch(g, "cross-entropy");
}

/* bf16: the logits as their bf16 values; forward keeps a row's maximum and sum, backward makes the gradient's bits
 * from them, as the CPU's 16-bit head does (dt_crossentropy_forward_lp, dt_crossentropy_grad_lp) */
static __global__ void crossentropy_forward_bf16_k(const float *logits, float *losses, float *stats, const int32_t *targets, int V,
                                                   int Vp) {
    int row = blockIdx.x;
    const float *x = logits + (size_t)row * Vp;
    int t = targets[row];
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = fmaxf(mx, bf16_value(bf16_bits(x[j])));
    mx = block_reduce(mx, true);
    float s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += expf(bf16_value(bf16_bits(x[j])) - mx);
    s = block_reduce(s, false);
    if (threadIdx.x == 0) { /* an unscored row: no loss, and stats that backward does not read */
        losses[row] = t >= 0 ? logf(s) + mx - bf16_value(bf16_bits(x[t])) : 0.0f;
        stats[2 * row] = mx, stats[2 * row + 1] = s;
    }
}

/* as the CPU's dt_crossentropy_grad_lp: p dscale, less dscale at the target, rounded */
static __global__ void crossentropy_backward_bf16_k(uint16_t *d, const float *logits, const float *stats, const int32_t *targets, int V,
                                                    int Vp, float dscale) {
    int row = blockIdx.x;
    const float *x = logits + (size_t)row * Vp;
    uint16_t *dr = d + (size_t)row * Vp;
    int t = targets[row];
    float mx = stats[2 * row], inv = 1.0f / stats[2 * row + 1];
    for (int j = threadIdx.x; j < Vp; j += blockDim.x) {
        float v = 0;
        if (t >= 0 && j < V) v = expf(bf16_value(bf16_bits(x[j])) - mx) * inv * dscale - (j == t ? dscale : 0.0f);
        dr[j] = bf16_bits(v);
    }
}

void dt_gpu_crossentropy_forward_bf16(dt_gpu *g, const float *logits, float *losses, float *stats, const int32_t *targets, int BT, int V,
                                      int Vp) {
    crossentropy_forward_bf16_k<<<BT, 1024, 0, g->stream>>>(logits, losses, stats, targets, V, Vp);
    dt_gpu_check_launch(g, "cross-entropy (bf16)");
}

void dt_gpu_crossentropy_backward_bf16(dt_gpu *g, uint16_t *dlogits, const float *logits, const float *stats, const int32_t *targets,
                                       int BT, int V, int Vp, float dscale) {
    crossentropy_backward_bf16_k<<<BT, 1024, 0, g->stream>>>(dlogits, logits, stats, targets, V, Vp, dscale);
    dt_gpu_check_launch(g, "cross-entropy backward (bf16)");
}

/* ---- AdamW, a sum of squares, a scale ---- */

static __global__ void adamw_k(float *p, const float *grad, float gscale, float *m, float *v, size_t n, float b1, float b2, float eps,
                               float decay, float step, float sbc2) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i >= n) return;
    float gi = grad[i] * gscale;
    float mi = b1 * m[i] + (1.0f - b1) * gi, vi = b2 * v[i] + (1.0f - b2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step * mi / (sqrtf(vi) / sbc2 + eps);
}

void dt_gpu_adamw(dt_gpu *g, float *p, const float *grad, float gscale, float *m, float *v, size_t n, float b1, float b2, float eps,
                  float decay, float step, float sbc2) {
    adamw_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(p, grad, gscale, m, v, n, b1, b2, eps, decay, step, sbc2);
    dt_gpu_check_launch(g, "adamw");
}

/* A grid of at most SUMSQ_BLOCKS blocks striding over x, each adding its share in double. */
#define SUMSQ_BLOCKS 1024
static __global__ void sumsq_k(const float *x, size_t n, double *ss) {
    double s = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) s += (double)x[i] * x[i];
    __shared__ double part[THREADS];
    part[threadIdx.x] = s;
    __syncthreads();
    for (int o = THREADS / 2; o > 0; o >>= 1) {
        if ((int)threadIdx.x < o) part[threadIdx.x] += part[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) atomicAdd(ss, part[0]);
}

void dt_gpu_sumsq(dt_gpu *g, const float *x, size_t n, double *ss) {
    unsigned b = dt_gpu_blocks(n, THREADS);
    sumsq_k<<<b < SUMSQ_BLOCKS ? b : SUMSQ_BLOCKS, THREADS, 0, g->stream>>>(x, n, ss);
    dt_gpu_check_launch(g, "sum of squares");
}

static __global__ void scale_k(float *x, size_t n, float f) {
    size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    if (i < n) x[i] *= f;
}

void dt_gpu_scale(dt_gpu *g, float *x, size_t n, float f) {
    scale_k<<<dt_gpu_blocks(n, THREADS), THREADS, 0, g->stream>>>(x, n, f);
    dt_gpu_check_launch(g, "scale");
}
