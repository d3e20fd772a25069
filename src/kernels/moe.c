/* A mixture of experts' kernels: the softmax router's top-k choice and its backward, the (token, choice) pairs
 * sorted by expert, and the experts' MLPs (SwiGLU's gate|up, or GELU's up alone) over their rows of the sorted pairs,
 * one GEMM per expert and projection (a grouped GEMM as a loop: each expert's rows are contiguous). */
#include "dtrain/kernels.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row i's top k of E probabilities, largest first (a tie: the lower expert, as the first found). */
static void topk_row(int32_t *idx, const float *p, int E, int K) {
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = false;
            for (int q = 0; q < j && !taken; q++) taken = idx[q] == e;
            if (!taken && (best < 0 || p[e] > p[best])) best = e;
        }
        idx[j] = best;
    }
}

void dt_moe_topk(float *w, int32_t *idx, const float *probs, int BT, int E, int K, bool norm) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *p = probs + (size_t)i * E;
        int32_t *ix = idx + (size_t)i * K;
        float *wi = w + (size_t)i * K, sum = 0;
        topk_row(ix, p, E, K);
        for (int j = 0; j < K; j++) sum += wi[j] = p[ix[j]];
        for (int j = 0; norm && j < K; j++) wi[j] /= sum;
    }
}

void dt_moe_softmax(float *probs, float *lse, int BT, int E) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        float *p = probs + (size_t)i * E, max = p[0], sum = 0;
        for (int e = 1; e < E; e++) max = p[e] > max ? p[e] : max;
        for (int e = 0; e < E; e++) sum += p[e] = expf(p[e] - max);
        for (int e = 0; e < E; e++) p[e] /= sum;
        if (lse) lse[i] = max + logf(sum);
    }
}

void dt_moe_z_backward(float *dlogits, const float *probs, const float *lse, int BT, int E, float scale) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++)
        for (int e = 0; e < E; e++) dlogits[(size_t)i * E + e] += scale * 2 * lse[i] * probs[(size_t)i * E + e];
}

void dt_moe_sort(int32_t *order, int32_t *start, int32_t *row_of, const int32_t *idx, int pairs, int E) {
    memset(start, 0, (size_t)(E + 1) * sizeof *start);
    for (int q = 0; q < pairs; q++)
        if (idx[q] >= 0) start[idx[q] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    for (int q = 0; q < pairs; q++) row_of[q] = idx[q] >= 0 ? start[idx[q]]++ : -1; /* stable: pairs in order within an expert */
    for (int e = E; e > 0; e--) start[e] = start[e - 1];
    start[0] = 0;
    for (int q = 0; q < pairs; q++)
        if (row_of[q] >= 0) order[row_of[q]] = q;
}

void dt_moe_gather(float *rows, const float *x, const int32_t *order, int pairs, int K, int C) {
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < pairs; r++) memcpy(rows + (size_t)r * C, x + (size_t)(order[r] / K) * C, (size_t)C * sizeof(float));
}

/* Token i's choices in the experts' order (K small: insertion). */
static void by_expert(int *q, const int32_t *idx, int K) {
    for (int j = 0; j < K; j++) {
        int a = j;
        while (a > 0 && idx[q[a - 1]] > idx[j]) q[a] = q[a - 1], a--;
        q[a] = j;
    }
}

void dt_moe_combine(float *out, const float *y, const float *w, const int32_t *idx, const int32_t *row_of, int BT, int K, int C, bool add) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        int q[DT_MOE_MAX_K];
        by_expert(q, idx + (size_t)i * K, K);
        float *o = out + (size_t)i * C;
        if (!add) memset(o, 0, (size_t)C * sizeof(float));
        for (int j = 0; j < K; j++) {
            size_t pair = (size_t)i * K + (size_t)q[j];
            if (row_of[pair] < 0) continue; /* dropped: its expert was full */
            const float *yr = y + (size_t)row_of[pair] * C;
            float wj = w ? w[pair] : 1.0f;
            for (int c = 0; c < C; c++) o[c] += wj * yr[c];
        }
    }
}

/* The experts' activation on their rows' products hu (gate|up with a gate, else up alone): act. */
static void activate(float *act, const float *hu, const float *wg, int pairs, int F) {
    if (wg) dt_swiglu_forward(act, hu, pairs, F);
    else dt_gelu_forward(act, hu, (size_t)pairs * F);
}

void dt_moe_experts_forward(float *hu, float *act, float *y, const float *xs, const int32_t *start, const float *wg, const float *wu,
                            const float *wd, int E, int C, int F, dt_dtype t) {
    size_t pairs = (size_t)start[E], hw = wg ? 2 * (size_t)F : (size_t)F;
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        if (!n) continue;
        size_t r = (size_t)start[e], fc = (size_t)F * C;
        float *h = hu + r * hw;
        if (wg) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, F, C, 1.0f, xs + r * C, C, wg + e * fc, C, 0.0f, h, (int)hw);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, F, C, 1.0f, xs + r * C, C, wu + e * fc, C, 0.0f, h + hw - F, (int)hw);
    }
    dt_lp_round(hu, pairs * hw, t);
    activate(act, hu, wg, start[E], F);
    dt_lp_round(act, pairs * F, t);
    for (int e = 0; y && e < E; e++) {
        int n = start[e + 1] - start[e];
        size_t r = (size_t)start[e];
        if (n) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, C, F, 1.0f, act + r * F, F, wd + (size_t)e * C * F, F, 0.0f, y + r * C, C);
    }
    if (y) dt_lp_round(y, pairs * C, t);
}

/* dst[M x N] += A^T B (A: K x M rows lda apart, B: K x N): in f32 added by the GEMM; with use (M x N floats), the
 * product rounded to t there first, then added. */
static void weight_grad(float *dst, int M, int N, int K, const float *a, int lda, const float *b, int ldb, float *use, dt_dtype t) {
    if (!use) {
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, a, lda, b, ldb, 1.0f, dst, N);
        return;
    }
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, M, N, K, 1.0f, a, lda, b, ldb, 0.0f, use, N);
    dt_lp_round_add(dst, use, (size_t)M * N, t);
}

void dt_moe_experts_backward(float *dxs, float *dwg, float *dwu, float *dwd, float *dw, float *dys, float *g, float *dhu, const float *xs,
                             const float *hu, float *act, const float *w, const int32_t *order, const int32_t *start, const float *wg,
                             const float *wu, const float *wd, int E, int C, int F, dt_dtype t, float *use) {
    int pairs = start[E];
    size_t hw = wg ? 2 * (size_t)F : (size_t)F;
    activate(act, hu, wg, pairs, F);
    dt_lp_round(act, (size_t)pairs * F, t);
    dt_lp_round(dys, (size_t)pairs * C, t);
    /* g = dy Wd (an expert's row, unweighted): d(weight) = act . g, d(act) = w g; Wd's gradient from the weighted dy */
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        size_t r = (size_t)start[e];
        if (n) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, F, C, 1.0f, dys + r * C, C, wd + (size_t)e * C * F, F, 0.0f, g + r * F, F);
    }
    dt_lp_round(g, (size_t)pairs * F, t);
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < pairs; r++) {
        const float *a = act + (size_t)r * F;
        float *gr = g + (size_t)r * F, *d = dys + (size_t)r * C, wr = w[order[r]], dot = 0;
        for (int f = 0; f < F; f++) dot += a[f] * gr[f];
        dw[order[r]] = dot;
        for (int f = 0; f < F; f++) gr[f] *= wr;
        for (int c = 0; c < C; c++) d[c] *= wr;
    }
    dt_lp_round(g, (size_t)pairs * F, t); /* 16 bits: the weighted gradients too (a product of 16-bit values) */
    dt_lp_round(dys, (size_t)pairs * C, t);
    memset(dhu, 0, (size_t)pairs * hw * sizeof(float));
    if (wg) dt_swiglu_backward(dhu, hu, g, pairs, F);
    else dt_gelu_backward(dhu, hu, g, (size_t)pairs * F);
    dt_lp_round(dhu, (size_t)pairs * hw, t);
    /* 16 bits: each use's weight gradient rounded (in use) before the f32 store sums it, as a Linear's */
    size_t fc = (size_t)F * C;
    if (t == DT_F32) use = NULL;
    for (int e = 0; e < E; e++) {
        int n = start[e + 1] - start[e];
        if (!n) continue;
        size_t r = (size_t)start[e];
        const float *dh = dhu + r * hw, *du = dh + hw - F;
        weight_grad(dwd + e * fc, C, F, n, dys + r * C, C, act + r * F, F, use, t);
        if (wg) weight_grad(dwg + e * fc, F, C, n, dh, (int)hw, xs + r * C, C, use, t);
        weight_grad(dwu + e * fc, F, C, n, du, (int)hw, xs + r * C, C, use, t);
        if (wg) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, F, 1.0f, dh, (int)hw, wg + e * fc, C, 0.0f, dxs + r * C, C);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, C, F, 1.0f, du, (int)hw, wu + e * fc, C, wg ? 1.0f : 0.0f, dxs + r * C, C);
    }
    dt_lp_round(dxs, (size_t)pairs * C, t);
}

void dt_moe_router_backward(float *dlogits, const float *probs, const float *w, const int32_t *idx, const float *dw, const float *daux, int T,
                            int BT, int E, int K, bool norm) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *p = probs + (size_t)i * E, *wi = w + (size_t)i * K, *dwi = dw + (size_t)i * K, *da = daux ? daux + (size_t)(i / T) * E : NULL;
        const int32_t *ix = idx + (size_t)i * K;
        float *dl = dlogits + (size_t)i * E;
        /* d(probs): the chosen ones' through the weights (renormalised: w_j = p_j / S, so dp_j = (dw_j - sum w dw) / S) */
        float sum = 0, wdw = 0, pdp = 0;
        for (int j = 0; j < K; j++) sum += p[ix[j]], wdw += wi[j] * dwi[j];
        for (int e = 0; e < E; e++) dl[e] = da ? da[e] : 0;
        for (int j = 0; j < K; j++) dl[ix[j]] += norm ? (dwi[j] - wdw) / sum : dwi[j];
        for (int e = 0; e < E; e++) pdp += p[e] * dl[e];
        for (int e = 0; e < E; e++) dl[e] = p[e] * (dl[e] - pdp); /* the softmax's backward */
    }
}

void dt_moe_sigmoid(float *scores, int BT, int E) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT * E; i++) scores[i] = 1.0f / (1.0f + expf(-scores[i]));
}

/* Row i's choice as DeepSeek-V3's router makes it: the scores plus the bias choose, within the best groups (each group
 * scored by the sum of its two best), the k best; a tie the lower expert, as the first found. */
static void choose_biased(int32_t *ix, const float *s, const float *bias, int E, int K, int G, int TG) {
    float c[DT_MOE_MAX_EXPERTS];
    int n = E / G;
    bool keep[DT_MOE_MAX_EXPERTS];
    for (int e = 0; e < E; e++) c[e] = s[e] + bias[e], keep[e] = G <= 1;
    for (int t = 0; t < TG && G > 1; t++) { /* the t-th best group not taken yet */
        int best = -1;
        float bscore = 0;
        for (int g = 0; g < G; g++) {
            if (keep[g * n]) continue;
            float a = -INFINITY, b = -INFINITY; /* the group's two best */
            for (int e = g * n; e < (g + 1) * n; e++)
                if (c[e] > a) b = a, a = c[e];
                else if (c[e] > b) b = c[e];
            float score = a + (n > 1 ? b : 0);
            if (best < 0 || score > bscore) best = g, bscore = score;
        }
        for (int e = best * n; e < (best + 1) * n; e++) keep[e] = true;
    }
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            bool taken = !keep[e];
            for (int q = 0; q < j && !taken; q++) taken = ix[q] == e;
            if (!taken && (best < 0 || c[e] > c[best])) best = e;
        }
        ix[j] = best;
    }
}

void dt_moe_topk_biased(float *w, int32_t *idx, const float *scores, const float *bias, int BT, int E, int K, int groups, int group_k,
                        bool norm, float scale) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *s = scores + (size_t)i * E;
        int32_t *ix = idx + (size_t)i * K;
        float *wi = w + (size_t)i * K, sum = 0;
        choose_biased(ix, s, bias, E, K, groups, group_k);
        for (int j = 0; j < K; j++) sum += wi[j] = s[ix[j]];
        for (int j = 0; j < K; j++) wi[j] = (norm ? wi[j] / (sum + 1e-20f) : wi[j]) * scale;
    }
}

void dt_moe_sigmoid_backward(float *dlogits, const float *scores, const float *w, const int32_t *idx, const float *dw, const float *daux, int T,
                             int BT, int E, int K, bool norm, float scale) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        const float *s = scores + (size_t)i * E, *wi = w + (size_t)i * K, *dwi = dw + (size_t)i * K, *da = daux ? daux + (size_t)(i / T) * E : NULL;
        const int32_t *ix = idx + (size_t)i * K;
        float *dl = dlogits + (size_t)i * E, sum = 0, wdw = 0;
        for (int j = 0; j < K; j++) sum += s[ix[j]], wdw += wi[j] * dwi[j];
        memset(dl, 0, (size_t)E * sizeof(float));
        if (da) { /* d(s' = s / sum of all): ds_e = (da_e - sum da s') / sum */
            float all = 0, dot = 0;
            for (int e = 0; e < E; e++) all += s[e];
            for (int e = 0; e < E; e++) dot += da[e] * s[e] / (all + 1e-20f);
            for (int e = 0; e < E; e++) dl[e] = (da[e] - dot) / (all + 1e-20f);
        }
        /* w_j = scale s_j / S: ds_j = scale (dw_j - sum w dw / scale) / S */
        for (int j = 0; j < K; j++) dl[ix[j]] += norm ? scale * (dwi[j] - wdw / scale) / (sum + 1e-20f) : scale * dwi[j];
        for (int e = 0; e < E; e++) dl[e] = dl[e] * s[e] * (1.0f - s[e]); /* the sigmoid's */
    }
}

void dt_moe_seq_stats(double *count, double *psum, const float *probs, int BT, int T, int E, int K, bool sigmoid) {
    for (int i = 0; i < BT; i++) {
        const float *p = probs + (size_t)i * E;
        size_t b = (size_t)(i / T) * E;
        int32_t ix[DT_MOE_MAX_K];
        topk_row(ix, p, E, K);
        for (int j = 0; j < K; j++) count[b + ix[j]] += 1;
        float all = 0;
        for (int e = 0; sigmoid && e < E; e++) all += p[e];
        for (int e = 0; e < E; e++) psum[b + e] += sigmoid ? p[e] / (all + 1e-20f) : p[e];
    }
}

typedef struct { float w; int32_t q; } weighed;

/* The heavier first; a tie: the earlier pair. */
static int heavier(const void *a, const void *b) {
    const weighed *x = a, *y = b;
    return x->w > y->w ? -1 : x->w < y->w ? 1 : (x->q > y->q) - (x->q < y->q);
}

int dt_moe_capacity(int32_t *idx, const float *w, int pairs, int E, int cap, int policy, void *scratch) {
    weighed *p = scratch;
    int dropped = 0;
    for (int e = 0; e < E; e++) {
        int n = 0;
        for (int q = 0; q < pairs; q++) /* in position order already */
            if (idx[q] == e) p[n++] = (weighed){ w[q], q };
        if (n <= cap) continue;
        if (policy == 0) qsort(p, (size_t)n, sizeof *p, heavier);
        for (int i = cap; i < n; i++) idx[p[i].q] = -1, dropped++;
    }
    return dropped;
}
