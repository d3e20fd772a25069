/* Causal attention without the T x T probabilities (FlashAttention-2's scheme, as the CPU's log-sum-exp kernels
 * compute it: attention_block.c): forward keeps each row's log-sum-exp; backward computes the probabilities again
 * from it, with D = dout . out a row. The products run on the tensor cores in TF32 (WMMA, f32 sums) from tiles in
 * shared memory: a block takes 64 rows (queries, or keys) of one head, a warp 16 of them.
 *   forward: a block's queries against each block of keys up to its diagonal, the softmax kept online (its running
 *            maximum and sum a row; the output rescaled in shared memory as the maximum grows);
 *   backward: one kernel a block of keys (dK and dV in the warps' accumulators over the queries that see them), one a
 *            block of queries (dQ), so that no gradient is summed by atomics: each is written once, added to dqkv.
 * Heads of 32, 64 or 128 channels (gpu.h: dt_gpu_flash_supported). */
#include "gpu_internal.h"

#include <math.h>
#include <mma.h>

using namespace nvcuda;

#define TILE 64                /* rows of a block: queries, or keys */
#define WARPS 4                /* each its 16 rows */
#define LDS (TILE + 8)         /* a score tile's row stride (floats; rows stay 32-byte aligned) */

typedef wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_a;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> frag_b_row;
typedef wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::col_major> frag_b_col;
typedef wmma::fragment<wmma::accumulator, 16, 16, 8, float> frag_acc;

template <typename F> static __device__ __forceinline__ void to_tf32(F &f) {
    for (int i = 0; i < f.num_elements; i++) f.x[i] = wmma::__float_to_tf32(f.x[i]);
}

/* acc += A[16 x K] B[K x 16]: A row-major at a (lda); B at b, row-major (ldb: B[k][n] = b[k * ldb + n]) or, with
 * transposed, B[k][n] = b[n * ldb + k] (the rows of a tile read as its transpose's columns). */
template <int K, bool transposed>
static __device__ __forceinline__ void mma_tile(frag_acc &acc, const float *a, int lda, const float *b, int ldb) {
    for (int k = 0; k < K; k += 8) {
        frag_a fa;
        wmma::load_matrix_sync(fa, a + k, lda);
        to_tf32(fa);
        if (transposed) {
            frag_b_col fb;
            wmma::load_matrix_sync(fb, b + k, ldb);
            to_tf32(fb);
            wmma::mma_sync(acc, fa, fb, acc);
        } else {
            frag_b_row fb;
            wmma::load_matrix_sync(fb, b + (size_t)k * ldb, ldb);
            to_tf32(fb);
            wmma::mma_sync(acc, fa, fb, acc);
        }
    }
}

/* out[16 x TILE] (ldo) = A[16 x HD] (the warp's rows of a tile) times the transpose of all TILE rows of another */
template <int HD> static __device__ __forceinline__ void scores(float *out, const float *a, const float *rows) {
    const int ld = HD + 8;
    for (int n = 0; n < TILE; n += 16) {
        frag_acc acc;
        wmma::fill_fragment(acc, 0.0f);
        mma_tile<HD, true>(acc, a, ld, rows + (size_t)n * ld, ld);
        wmma::store_matrix_sync(out + n, acc, LDS, wmma::mem_row_major);
    }
}

/* rows [r0, r0 + TILE) of one head's HD channels (ld apart in src) into a tile, 0 past T */
template <int HD> static __device__ __forceinline__ void load_tile(float *tile, const float *src, size_t ld, int r0, int T) {
    for (int i = threadIdx.x; i < TILE * HD; i += WARPS * 32) {
        int r = i / HD, c = i % HD;
        tile[r * (HD + 8) + c] = r0 + r < T ? src[(size_t)(r0 + r) * ld + c] : 0.0f;
    }
}

/* ---- forward: grid (query blocks, B * NH), the costliest (last) query blocks first ---- */

template <int HD> __global__ void flash_forward_k(float *out, float *lse, const float *qkv, int T, int C, int NH, float scale) {
    const int ld = HD + 8, w = threadIdx.x >> 5, lane = threadIdx.x & 31, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    extern __shared__ __align__(128) float sm[];
    float *sQ = sm, *sK = sQ + TILE * ld, *sV = sK + TILE * ld, *sO = sV + TILE * ld, *sS = sO + TILE * ld;
    float *sM = sS + TILE * LDS, *sL = sM + TILE, *sA = sL + TILE;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HD;
    load_tile<HD>(sQ, base, C3, q0, T);
    for (int i = threadIdx.x; i < TILE * ld; i += WARPS * 32) sO[i] = 0.0f;
    for (int i = threadIdx.x; i < TILE; i += WARPS * 32) sM[i] = -INFINITY, sL[i] = 0.0f;
    int last = min(q0 + TILE, T); /* keys up to the block's last query */
    for (int k0 = 0; k0 < last; k0 += TILE) {
        __syncthreads();
        load_tile<HD>(sK, base + C, C3, k0, T);
        load_tile<HD>(sV, base + 2 * (size_t)C, C3, k0, T);
        __syncthreads();
        float *S = sS + w * 16 * LDS;
        scores<HD>(S, sQ + w * 16 * ld, sK);
        __syncwarp();
        for (int r = 0; r < 16; r++) { /* the online softmax, a row at a time, two keys a lane */
            int row = q0 + w * 16 + r, c0 = k0 + lane, c1 = c0 + 32;
            float x0 = c0 <= row && c0 < T ? S[r * LDS + lane] * scale : -INFINITY;
            float x1 = c1 <= row && c1 < T ? S[r * LDS + lane + 32] * scale : -INFINITY;
            float mo = sM[w * 16 + r], mn = fmaxf(mo, warp_max(fmaxf(x0, x1)));
            float p0 = mn == -INFINITY ? 0.0f : expf(x0 - mn), p1 = mn == -INFINITY ? 0.0f : expf(x1 - mn);
            float sum = warp_sum(p0 + p1), alpha = mo == -INFINITY ? 0.0f : expf(mo - mn);
            S[r * LDS + lane] = p0, S[r * LDS + lane + 32] = p1;
            __syncwarp();
            if (lane == 0) sM[w * 16 + r] = mn, sL[w * 16 + r] = sL[w * 16 + r] * alpha + sum, sA[w * 16 + r] = alpha;
        }
        __syncwarp();
        float *O = sO + w * 16 * ld;
        for (int i = lane; i < 16 * HD; i += 32) O[(i / HD) * ld + i % HD] *= sA[w * 16 + i / HD];
        __syncwarp();
        #pragma unroll
        for (int n = 0; n < HD; n += 16) { /* O += P V */
            frag_acc acc;
            wmma::load_matrix_sync(acc, O + n, ld, wmma::mem_row_major);
            mma_tile<TILE, false>(acc, S, LDS, sV + n, ld);
            wmma::store_matrix_sync(O + n, acc, ld, wmma::mem_row_major);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < TILE * HD; i += WARPS * 32) {
        int r = i / HD, c = i % HD;
        if (q0 + r < T) out[((size_t)b * T + q0 + r) * C + (size_t)h * HD + c] = sO[r * ld + c] / sL[r];
    }
    for (int r = threadIdx.x; r < TILE; r += WARPS * 32)
        if (q0 + r < T) lse[(size_t)bh * T + q0 + r] = sM[r] + logf(sL[r]);
}

/* ---- backward ---- */

/* D[b, h, t] = dout . out over the head's channels: a warp a row */
static __global__ void row_dots_k(float *D, const float *dout, const float *out, int BT, int T, int C, int NH, int HD) {
    int r = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (r >= BT * NH) return;
    int row = r / NH, h = r % NH;
    const float *a = dout + (size_t)row * C + (size_t)h * HD, *o = out + (size_t)row * C + (size_t)h * HD;
    float s = 0;
    for (int c = lane; c < HD; c += 32) s += a[c] * o[c];
    s = warp_sum(s);
    if (lane == 0) D[((size_t)(row / T) * NH + h) * T + row % T] = s;
}

/* P and dS in place of the scores S and dP of 16 rows x TILE columns (query q's row qi, key k's column kj, or the
 * transpose): p = exp(s scale - lse_q) where key <= query < T, ds = p (dp - D_q) scale. */
static __device__ __forceinline__ void probs_and_grads(float *S, float *dP, const float *lse, const float *D, int r0, int c0, int T,
                                                       float scale, bool rows_are_keys) {
    int lane = threadIdx.x & 31;
    for (int r = 0; r < 16; r++)
        for (int c = lane; c < TILE; c += 32) {
            int key = rows_are_keys ? r0 + r : c0 + c, query = rows_are_keys ? c0 + c : r0 + r, qi = rows_are_keys ? c : r;
            bool seen = key <= query && query < T;
            float p = seen ? expf(S[r * LDS + c] * scale - lse[qi]) : 0.0f;
            S[r * LDS + c] = p;
            dP[r * LDS + c] = p * (dP[r * LDS + c] - D[qi]) * scale;
        }
    __syncwarp();
}

/* dst rows (0 past T) += a warp's accumulators, staged in its 16 rows of a score tile */
template <int HD> static __device__ __forceinline__ void add_rows(float *dst, size_t ld, int r0, int T, frag_acc *acc, float *stage) {
    int lane = threadIdx.x & 31;
    #pragma unroll
    for (int n = 0; n < HD; n += 16) {
        wmma::store_matrix_sync(stage, acc[n / 16], LDS, wmma::mem_row_major);
        __syncwarp();
        for (int i = lane; i < 16 * 16; i += 32) {
            int r = i / 16, c = i % 16;
            if (r0 + r < T) dst[(size_t)(r0 + r) * ld + n + c] += stage[r * LDS + c];
        }
        __syncwarp();
    }
}

/* dK and dV of a block of keys: over the query blocks that see them */
template <int HD>
__global__ void flash_backward_kv_k(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
                                    float scale) {
    const int ld = HD + 8, w = threadIdx.x >> 5, bh = blockIdx.y, b = bh / NH, h = bh % NH, k0 = blockIdx.x * TILE;
    extern __shared__ __align__(128) float sm[];
    float *sK = sm, *sV = sK + TILE * ld, *sQ = sV + TILE * ld, *sG = sQ + TILE * ld, *sS = sG + TILE * ld, *sP = sS + TILE * LDS;
    float *sLse = sP + TILE * LDS, *sD = sLse + TILE;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HD, *gbase = dout + (size_t)b * T * C + (size_t)h * HD;
    load_tile<HD>(sK, base + C, C3, k0, T);
    load_tile<HD>(sV, base + 2 * (size_t)C, C3, k0, T);
    frag_acc dk[HD / 16], dv[HD / 16];
    #pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dk[n], 0.0f), wmma::fill_fragment(dv[n], 0.0f);
    float *S = sS + w * 16 * LDS, *P = sP + w * 16 * LDS;
    for (int q0 = k0; q0 < T; q0 += TILE) { /* (q0 - k0: a whole number of tiles, so the first is the diagonal's) */
        __syncthreads();
        load_tile<HD>(sQ, base, C3, q0, T);
        load_tile<HD>(sG, gbase, C, q0, T);
        for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
            sLse[i] = q0 + i < T ? lse[(size_t)bh * T + q0 + i] : 0.0f;
            sD[i] = q0 + i < T ? D[(size_t)bh * T + q0 + i] : 0.0f;
        }
        __syncthreads();
        scores<HD>(S, sK + w * 16 * ld, sQ);  /* S^T: the warp's keys by the block's queries */
        scores<HD>(P, sV + w * 16 * ld, sG);  /* dP^T = V dout^T */
        __syncwarp();
        probs_and_grads(S, P, sLse, sD, k0 + w * 16, q0, T, scale, true);
        #pragma unroll
        for (int n = 0; n < HD; n += 16) {
            mma_tile<TILE, false>(dv[n / 16], S, LDS, sG + n, ld); /* dV += P^T dout */
            mma_tile<TILE, false>(dk[n / 16], P, LDS, sQ + n, ld); /* dK += dS^T Q */
        }
    }
    __syncthreads();
    float *dbase = dqkv + (size_t)b * T * C3 + (size_t)h * HD;
    add_rows<HD>(dbase + C, C3, k0 + w * 16, T, dk, S);
    add_rows<HD>(dbase + 2 * (size_t)C, C3, k0 + w * 16, T, dv, S);
}

/* dQ of a block of queries: over the key blocks they see */
template <int HD>
__global__ void flash_backward_q_k(float *dqkv, const float *dout, const float *qkv, const float *lse, const float *D, int T, int C, int NH,
                                   float scale) {
    const int ld = HD + 8, w = threadIdx.x >> 5, bh = blockIdx.y, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.x - 1 - blockIdx.x) * TILE;
    extern __shared__ __align__(128) float sm[];
    float *sQ = sm, *sG = sQ + TILE * ld, *sK = sG + TILE * ld, *sV = sK + TILE * ld, *sS = sV + TILE * ld, *sP = sS + TILE * LDS;
    float *sLse = sP + TILE * LDS, *sD = sLse + TILE;
    const size_t C3 = 3 * (size_t)C;
    const float *base = qkv + (size_t)b * T * C3 + (size_t)h * HD, *gbase = dout + (size_t)b * T * C + (size_t)h * HD;
    load_tile<HD>(sQ, base, C3, q0, T);
    load_tile<HD>(sG, gbase, C, q0, T);
    for (int i = threadIdx.x; i < TILE; i += WARPS * 32) {
        sLse[i] = q0 + i < T ? lse[(size_t)bh * T + q0 + i] : 0.0f;
        sD[i] = q0 + i < T ? D[(size_t)bh * T + q0 + i] : 0.0f;
    }
    frag_acc dq[HD / 16];
    #pragma unroll
    for (int n = 0; n < HD / 16; n++) wmma::fill_fragment(dq[n], 0.0f);
    float *S = sS + w * 16 * LDS, *P = sP + w * 16 * LDS;
    int last = min(q0 + TILE, T);
    for (int k0 = 0; k0 < last; k0 += TILE) {
        __syncthreads();
        load_tile<HD>(sK, base + C, C3, k0, T);
        load_tile<HD>(sV, base + 2 * (size_t)C, C3, k0, T);
        __syncthreads();
        scores<HD>(S, sQ + w * 16 * ld, sK); /* S: the warp's queries by the block's keys */
        scores<HD>(P, sG + w * 16 * ld, sV); /* dP = dout V^T */
        __syncwarp();
        probs_and_grads(S, P, sLse + w * 16, sD + w * 16, q0 + w * 16, k0, T, scale, false);
        #pragma unroll
        for (int n = 0; n < HD; n += 16) mma_tile<TILE, false>(dq[n / 16], P, LDS, sK + n, ld); /* dQ += dS K */
    }
    __syncthreads();
    add_rows<HD>(dqkv + (size_t)b * T * C3 + (size_t)h * HD, C3, q0 + w * 16, T, dq, S);
}

/* shared memory: four tiles of HD channels, two of scores, two rows of TILE (three in forward) */
static size_t smem_bytes(int HD) { return (4 * (size_t)TILE * (HD + 8) + 2 * (size_t)TILE * LDS + 3 * TILE) * sizeof(float); }

int dt_gpu_flash_supported(int head_dim) { return head_dim == 32 || head_dim == 64 || head_dim == 128; }

/* what a pass reads and writes (forward: out and lse; backward: dqkv, from lse and D) */
typedef struct {
    float *out, *lse_out, *dqkv;
    const float *qkv, *dout, *lse, *D;
    int B, T, C, NH;
} flash_args;

template <int HD> static void launch(dt_gpu *g, int pass, const flash_args *a) {
    size_t sm = smem_bytes(HD);
    dim3 grid((a->T + TILE - 1) / TILE, a->B * a->NH);
    float scale = 1.0f / sqrtf((float)HD);
    /* above 48 KiB of shared memory a kernel must ask (once; asking again is harmless) */
    if (pass == 0) {
        cudaFuncSetAttribute(flash_forward_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        flash_forward_k<HD><<<grid, WARPS * 32, sm, g->stream>>>(a->out, a->lse_out, a->qkv, a->T, a->C, a->NH, scale);
    } else if (pass == 1) {
        cudaFuncSetAttribute(flash_backward_kv_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        flash_backward_kv_k<HD><<<grid, WARPS * 32, sm, g->stream>>>(a->dqkv, a->dout, a->qkv, a->lse, a->D, a->T, a->C, a->NH, scale);
    } else {
        cudaFuncSetAttribute(flash_backward_q_k<HD>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)sm);
        flash_backward_q_k<HD><<<grid, WARPS * 32, sm, g->stream>>>(a->dqkv, a->dout, a->qkv, a->lse, a->D, a->T, a->C, a->NH, scale);
    }
}

static void run(dt_gpu *g, int pass, const flash_args *a) {
    int HD = a->C / a->NH;
    if (HD == 32) launch<32>(g, pass, a);
    else if (HD == 64) launch<64>(g, pass, a);
    else if (HD == 128) launch<128>(g, pass, a);
    else dt_gpu_fail(g, "flash attention", "a head of other than 32, 64 or 128 channels");
}

void dt_gpu_attention_forward_lse(dt_gpu *g, float *out, float *lse, const float *qkv, int B, int T, int C, int NH) {
    flash_args a = { out, lse, NULL, qkv, NULL, NULL, NULL, B, T, C, NH };
    run(g, 0, &a);
    dt_gpu_check_launch(g, "flash attention forward");
}

void dt_gpu_attention_backward_lse(dt_gpu *g, float *dqkv, float *scratch, const float *dout, const float *out, const float *qkv,
                                   const float *lse, int B, int T, int C, int NH) {
    int rows = B * T * NH;
    row_dots_k<<<dt_gpu_blocks((size_t)rows, 8), 256, 0, g->stream>>>(scratch, dout, out, B * T, T, C, NH, C / NH);
    dt_gpu_check_launch(g, "flash attention backward (dout . out)");
    flash_args a = { NULL, NULL, dqkv, qkv, dout, lse, scratch, B, T, C, NH };
    run(g, 1, &a);
    dt_gpu_check_launch(g, "flash attention backward (dk, dv)");
    run(g, 2, &a);
    dt_gpu_check_launch(g, "flash attention backward (dq)");
}
