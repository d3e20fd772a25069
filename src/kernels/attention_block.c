/* Causal attention of a block of queries over a block of keys, each at its
 * own positions in the sequence, and the merge of such partial results by
 * their log-sum-exp: what ring attention computes on the block in hand
 * while the next one travels (context parallelism: the ring itself is in
 * the parallel layer). A query at position i sees a key at position j when
 * j <= i. The softmax over all blocks is recovered exactly: a block gives
 * out_b = sum_j p_j v_j / sum_j p_j and lse_b = log sum_j exp(s_j); two
 * blocks merge as lse = log(e^lse_a + e^lse_b), out = out_a e^(lse_a - lse)
 * + out_b e^(lse_b - lse). Backward needs only the final out and lse: each
 * block adds p = exp(s - lse) times the usual softmax gradient, with D =
 * dout . out (as dt_attention_backward_lse). Rows are addressed with
 * strides, so q, k, v can sit in a packed qkv [B, T, 3C] or in a received
 * [B, Tk, 2C] of keys and values. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <math.h>
#include <string.h>

#define KBLOCK 64 /* keys a row takes at a time (the online softmax's step) */
#define QTILE 32  /* forward: query rows that share each block of keys while it is in cache */
#define KTILE 256 /* backward: keys (and their gradients) every row visits while they are in cache */

/* The keys row t of q sees among k's: positions k->pos .. q->pos + t. */
static int seen(const dt_attn_rows *q, const dt_attn_rows *k, int t) {
    int n = q->pos + t - k->pos + 1;
    return n < 0 ? 0 : n > k->T ? k->T : n;
}

void dt_attention_block_forward(float *out, float *lse, const dt_attn_rows *q, const dt_attn_rows *k, const dt_attn_rows *v,
                                int B, int C, int NH) {
    dt_attention_block_forward_docs(out, lse, q, k, v, NULL, B, C, NH);
}

/* first: a packed row's documents (each query row's first key, by index in k; NULL: 0). */
void dt_attention_block_forward_docs(float *out, float *lse, const dt_attn_rows *q, const dt_attn_rows *k, const dt_attn_rows *v,
                                     const int32_t *first, int B, int C, int NH) {
    int hs = C / NH, Tq = q->T, Tk = k->T, tiles = (Tq + QTILE - 1) / QTILE;
    float scale = 1.0f / sqrtf((float)hs);
    /* a tile of query rows goes through the keys a block at a time, so each
     * block is read once a tile, not once a row (a long sequence's keys do
     * not fit in cache); every row's arithmetic is the one a row alone
     * makes. Dynamic: a causal row's work grows with its position. */
    #pragma omp parallel for collapse(3) schedule(dynamic, 1)
    for (int b = 0; b < B; b++)
        for (int qt = 0; qt < tiles; qt++)
            for (int h = 0; h < NH; h++) {
                int t0 = qt * QTILE, t1 = t0 + QTILE < Tq ? t0 + QTILE : Tq;
                float mx[QTILE], sum[QTILE], s[KBLOCK];
                for (int t = t0; t < t1; t++) {
                    mx[t - t0] = -INFINITY, sum[t - t0] = 0;
                    memset(out + ((size_t)b * Tq + t) * C + (size_t)h * hs, 0, sizeof(float) * (size_t)hs);
                }
                for (int k0 = 0; k0 < seen(q, k, t1 - 1); k0 += KBLOCK)
                    for (int t = t0; t < t1; t++) {
                        int n = seen(q, k, t), k1 = k0 + KBLOCK < n ? k0 + KBLOCK : n, f = first ? first[(size_t)b * Tq + t] : 0;
                        int ka = k0 > f ? k0 : f; /* the row's keys in this block: [ka, k1) */
                        if (k1 <= ka) continue;
                        const float *qr = q->p + ((size_t)b * Tq + t) * q->stride + (size_t)h * hs;
                        float *o = out + ((size_t)b * Tq + t) * C + (size_t)h * hs, bmx = -INFINITY;
                        for (int j = ka; j < k1; j++) {
                            const float *kr = k->p + ((size_t)b * Tk + j) * k->stride + (size_t)h * hs;
                            float d = 0;
                            #pragma omp simd reduction(+ : d)
                            for (int i = 0; i < hs; i++) d += qr[i] * kr[i];
                            s[j - k0] = d * scale;
                            if (s[j - k0] > bmx) bmx = s[j - k0];
                        }
                        float m0 = mx[t - t0], nmx = bmx > m0 ? bmx : m0, corr = expf(m0 - nmx), sm = sum[t - t0] * corr;
                        #pragma omp simd
                        for (int i = 0; i < hs; i++) o[i] *= corr;
                        #pragma omp simd
                        for (int j = ka; j < k1; j++) s[j - k0] = dt_vexpf(s[j - k0] - nmx); /* then summed in order */
                        for (int j = ka; j < k1; j++) {
                            float p = s[j - k0];
                            sm += p;
                            const float *vr = v->p + ((size_t)b * Tk + j) * v->stride + (size_t)h * hs;
                            #pragma omp simd
                            for (int i = 0; i < hs; i++) o[i] += p * vr[i];
                        }
                        mx[t - t0] = nmx, sum[t - t0] = sm;
                    }
                for (int t = t0; t < t1; t++) {
                    float *o = out + ((size_t)b * Tq + t) * C + (size_t)h * hs, sm = sum[t - t0];
                    float inv = sm > 0 ? 1.0f / sm : 0;
                    #pragma omp simd
                    for (int i = 0; i < hs; i++) o[i] *= inv;
                    lse[((size_t)b * NH + h) * Tq + t] = sm > 0 ? mx[t - t0] + logf(sm) : -INFINITY;
                }
            }
}

void dt_attention_merge(float *out, float *lse, const float *bout, const float *blse, int B, int T, int C, int NH) {
    int hs = C / NH;
    #pragma omp parallel for collapse(3) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int t = 0; t < T; t++) {
                size_t li = ((size_t)b * NH + h) * T + t, oi = ((size_t)b * T + t) * C + (size_t)h * hs;
                float la = lse[li], lb = blse[li];
                if (lb == -INFINITY) continue; /* the block had no key for this row */
                if (la == -INFINITY) {
                    memcpy(out + oi, bout + oi, sizeof(float) * (size_t)hs);
                    lse[li] = lb;
                    continue;
                }
                float m = la > lb ? la : lb, l = m + logf(expf(la - m) + expf(lb - m)), wa = expf(la - l), wb = expf(lb - l);
                #pragma omp simd
                for (int i = 0; i < hs; i++) out[oi + i] = out[oi + i] * wa + bout[oi + i] * wb;
                lse[li] = l;
            }
}

void dt_attention_block_backward(const dt_attn_grads *g, const float *dout, const float *out, const float *lse, const dt_attn_rows *q,
                                 const dt_attn_rows *k, const dt_attn_rows *v, int B, int C, int NH) {
    dt_attention_block_backward_docs(g, dout, out, lse, q, k, v, NULL, B, C, NH);
}

void dt_attention_block_backward_docs(const dt_attn_grads *g, const float *dout, const float *out, const float *lse, const dt_attn_rows *q,
                                      const dt_attn_rows *k, const dt_attn_rows *v, const int32_t *first, int B, int C, int NH) {
    int hs = C / NH, Tq = q->T, Tk = k->T;
    float scale = 1.0f / sqrtf((float)hs);
    /* a thread per (b, h): the keys' gradients of one head are one thread's.
     * Every row visits the keys a tile at a time (the tile and its
     * gradients stay in cache across the rows); each sum is still made in
     * the order of a row-by-row pass (dq over keys, dk and dv over rows,
     * ascending). */
    #pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++)
            for (int j0 = 0; j0 < Tk; j0 += KTILE)
                for (int t = 0; t < Tq; t++) {
                    int n = seen(q, k, t), j1 = j0 + KTILE < n ? j0 + KTILE : n, f = first ? first[(size_t)b * Tq + t] : 0;
                    int ja = j0 > f ? j0 : f;
                    if (j1 <= ja) continue;
                    const float *dy = dout + ((size_t)b * Tq + t) * C + (size_t)h * hs, *y = out + ((size_t)b * Tq + t) * C + (size_t)h * hs;
                    const float *qr = q->p + ((size_t)b * Tq + t) * q->stride + (size_t)h * hs;
                    float *dq = g->dq + ((size_t)b * Tq + t) * g->sq + (size_t)h * hs;
                    float D = 0, l = lse[((size_t)b * NH + h) * Tq + t]; /* dout . out, again each tile: one dot in KTILE */
                    #pragma omp simd reduction(+ : D)
                    for (int i = 0; i < hs; i++) D += dy[i] * y[i];
                    float ps[KTILE], dps[KTILE]; /* the tile's probabilities (their exponentials in a vector loop) and dout . v */
                    for (int j = ja; j < j1; j++) {
                        const float *kr = k->p + ((size_t)b * Tk + j) * k->stride + (size_t)h * hs;
                        const float *vr = v->p + ((size_t)b * Tk + j) * v->stride + (size_t)h * hs;
                        float sdot = 0, dp = 0;
                        #pragma omp simd reduction(+ : sdot, dp)
                        for (int i = 0; i < hs; i++) { sdot += qr[i] * kr[i]; dp += dy[i] * vr[i]; }
                        ps[j - j0] = sdot * scale - l, dps[j - j0] = dp;
                    }
                    #pragma omp simd
                    for (int j = ja; j < j1; j++) ps[j - j0] = dt_vexpf(ps[j - j0]);
                    for (int j = ja; j < j1; j++) {
                        const float *kr = k->p + ((size_t)b * Tk + j) * k->stride + (size_t)h * hs;
                        float *dk = g->dk + ((size_t)b * Tk + j) * g->skv + (size_t)h * hs;
                        float *dv = g->dv + ((size_t)b * Tk + j) * g->skv + (size_t)h * hs;
                        float p = ps[j - j0], ds = p * (dps[j - j0] - D) * scale;
                        #pragma omp simd
                        for (int i = 0; i < hs; i++) { dv[i] += p * dy[i]; dq[i] += ds * kr[i]; dk[i] += ds * qr[i]; }
                    }
                }
}
