/* Softmax cross-entropy over the first V of Vp logits per position, fused
 * with its gradient: the probabilities are recomputed in place of the
 * logits instead of being stored beside them. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <math.h>
#include <stdbool.h>
#ifdef _OPENMP
#include <omp.h>
#endif

/* A slice's row: its max, or its sum of exp(l - m) and the target's logit
 * (t, a column of the slice or not) into part[0], part[1]. */
static float slice_max(const float *l, int V) {
    float m = -INFINITY;
    #pragma omp simd reduction(max : m)
    for (int v = 0; v < V; v++) m = l[v] > m ? l[v] : m;
    return m;
}

static void slice_sum(float *part, const float *l, float m, int t, int V) {
    float sum = 0;
    #pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += dt_vexpf(l[v] - m);
    part[0] = sum;
    part[1] = t >= 0 && t < V ? l[t] : 0.0f;
}

static float row_loss(const float *l, int target, int V, float *mx_out, float *sum_out) {
    if (target < 0) { /* not scored (DT_IGNORE_INDEX): no loss, and backward's row is zeros */
        *mx_out = 0, *sum_out = 1;
        return 0;
    }
    float part[2], mx = slice_max(l, V);
    slice_sum(part, l, mx, target, V);
    *mx_out = mx;
    *sum_out = part[0];
    return logf(part[0]) + mx - part[1];
}

float dt_crossentropy_forward(float *losses, float *stats, const float *logits, const int32_t *targets, int BT, int V, int Vp) {
    double total = 0;
    #pragma omp parallel for reduction(+ : total) schedule(static)
    for (int i = 0; i < BT; i++) {
        float mx, sum;
        losses[i] = row_loss(logits + (size_t)i * Vp, targets[i], V, &mx, &sum);
        if (stats) stats[2 * i] = mx, stats[2 * i + 1] = sum;
        total += losses[i];
    }
    return (float)(total / BT);
}

/* Row i's gradient in place of its logits (mx, sum from row_loss); a
 * target outside [0, V) is another rank's column; a row not scored
 * (ignored: its target, before any shift to a rank's columns, below 0)
 * gets zeros. */
static void row_grad(float *l, int target, int V, int Vp, float mx, float sum, float dscale, bool ignored) {
    if (ignored) {
        for (int v = 0; v < Vp; v++) l[v] = 0.0f;
        return;
    }
    float inv = 1.0f / sum;
    #pragma omp simd
    for (int v = 0; v < V; v++) l[v] = dt_vexpf(l[v] - mx) * inv * dscale;
    if (target >= 0 && target < V) l[target] -= dscale;
    for (int v = V; v < Vp; v++) l[v] = 0.0f;
}

void dt_crossentropy_rows_max(float *mx, const float *logits, int BT, int V, int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) mx[i] = slice_max(logits + (size_t)i * Vp, V);
}

void dt_crossentropy_rows_sum(float *part, const float *logits, const float *mx, const int32_t *targets, int v0, int BT, int V,
                              int Vp) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) slice_sum(part + 2 * i, logits + (size_t)i * Vp, mx[i], targets[i] - v0, V);
}

void dt_crossentropy_rows_backward(float *logits, const float *stats, const int32_t *targets, int v0, int BT, int V, int Vp,
                                   float dscale) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++)
        row_grad(logits + (size_t)i * Vp, targets[i] - v0, V, Vp, stats[2 * i], stats[2 * i + 1], dscale, targets[i] < 0);
}

float dt_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale, dt_dtype t) {
    double total = 0;
    #pragma omp parallel for reduction(+ : total) schedule(static)
    for (int i = 0; i < BT; i++) {
        float *l = logits + (size_t)i * Vp, mx, sum;
        losses[i] = row_loss(l, targets[i], V, &mx, &sum);
        total += losses[i];
        row_grad(l, targets[i], V, Vp, mx, sum, dscale, targets[i] < 0);
        dt_lp_round(l, (size_t)V, t); /* while the row is in cache */
    }
    return (float)(total / BT);
}

void dt_crossentropy_backward(float *logits, const float *stats, const int32_t *targets, int BT, int V, int Vp, float dscale) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) row_grad(logits + (size_t)i * Vp, targets[i], V, Vp, stats[2 * i], stats[2 * i + 1], dscale, targets[i] < 0);
}

/* 16-bit logits: each thread widens a row into its Vp floats of work (as
 * many threads as work has rows for), computes in f32 and, for the
 * gradient, narrows the row back in place. */
static int lp_threads(int Vp, size_t work_floats) {
    int nt = dt_kernels_threads();
    if ((size_t)nt * Vp > work_floats) nt = (int)(work_floats / (size_t)Vp);
    return nt < 1 ? 1 : nt; /* the caller gives at least one row */
}

static float lp_rows_loss(uint16_t *logits, float *losses, float *stats, const int32_t *targets, int BT, int V, int Vp,
                          float dscale, dt_dtype t, float *work, size_t work_floats, bool grad) {
    int nt = lp_threads(Vp, work_floats);
    double total = 0;
    #pragma omp parallel num_threads(nt) reduction(+ : total)
    {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        float *row = work + (size_t)me * Vp, mx, sum;
        #pragma omp for schedule(static)
        for (int i = 0; i < BT; i++) {
            uint16_t *l = logits + (size_t)i * Vp;
            dt_lp_unpack(row, l, (size_t)Vp, t);
            losses[i] = row_loss(row, targets[i], V, &mx, &sum);
            if (stats) stats[2 * i] = mx, stats[2 * i + 1] = sum;
            total += losses[i];
            if (!grad) continue;
            row_grad(row, targets[i], V, Vp, mx, sum, dscale, targets[i] < 0);
            dt_lp_pack(l, row, (size_t)Vp, t);
        }
    }
    return (float)(total / BT);
}

float dt_crossentropy_forward_lp(float *losses, float *stats, const uint16_t *logits, const int32_t *targets, int BT, int V,
                                 int Vp, dt_dtype t, float *work, size_t work_floats) {
    return lp_rows_loss((uint16_t *)logits, losses, stats, targets, BT, V, Vp, 0, t, work, work_floats, false);
}

float dt_crossentropy_fused_lp(uint16_t *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale,
                               dt_dtype t, float *work, size_t work_floats) {
    return lp_rows_loss(logits, losses, NULL, targets, BT, V, Vp, dscale, t, work, work_floats, true);
}

void dt_crossentropy_rows_lp(float *out, const float *mx, const uint16_t *logits, const int32_t *targets, int v0, int BT, int V,
                             int Vp, dt_dtype t, float *work, size_t work_floats) {
    int nt = lp_threads(Vp, work_floats);
    #pragma omp parallel num_threads(nt)
    {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        float *row = work + (size_t)me * Vp;
        #pragma omp for schedule(static)
        for (int i = 0; i < BT; i++) {
            dt_lp_unpack(row, logits + (size_t)i * Vp, (size_t)V, t);
            if (!mx) out[i] = slice_max(row, V);
            else slice_sum(out + 2 * i, row, mx[i], targets[i] - v0, V);
        }
    }
}

/* A slice's row's moments about its row's maximum m: the sums of exp(2 (l - m)) and of exp(l - m) (l - m). */
static void slice_moments(float *out, const float *l, float m, int V) {
    float sq = 0, xe = 0;
    #pragma omp simd reduction(+ : sq, xe)
    for (int v = 0; v < V; v++) {
        float d = l[v] - m, e = dt_vexpf(d);
        sq += e * e, xe += e * d;
    }
    out[0] = sq, out[1] = xe;
}

void dt_crossentropy_rows_moments(float *out, const float *stats, const void *logits, const int32_t *targets, int BT, int V, int Vp,
                                  dt_dtype t, float *work, size_t work_floats) {
    bool lp = t != DT_F32;
    int nt = lp ? lp_threads(Vp, work_floats) : dt_kernels_threads();
    #pragma omp parallel num_threads(nt)
    {
        int me = 0;
#ifdef _OPENMP
        me = omp_get_thread_num();
#endif
        float *row = lp ? work + (size_t)me * Vp : NULL;
        #pragma omp for schedule(static)
        for (int i = 0; i < BT; i++) {
            out[2 * i] = out[2 * i + 1] = 0;
            if (targets[i] < 0) continue; /* (a row not scored: its max is not the row's) */
            const float *l = (const float *)logits + (size_t)i * Vp;
            if (lp) dt_lp_unpack(row, (const uint16_t *)logits + (size_t)i * Vp, (size_t)V, t), l = row;
            slice_moments(out + 2 * i, l, stats[2 * i], V);
        }
    }
}

/* Row `row`'s gradient in place of its chunk d (r columns, the first vend below V; tg the target's column in it, or
 * outside) from its logits there, with an entropy term (g->ent_scale; dH/dl_v = -p_v (log p_v + H)):
 * p_v (ds - es (log p_v + H)), less ds at the target. */
static void ent_grad_row(float *d, int r, int vend, int tg, const dt_ce_grad *g, int row) {
    float mx = g->stats[2 * row], inv = 1.0f / g->stats[2 * row + 1];
    float ds = g->row_scale ? g->dscale * g->row_scale[row] : g->dscale, es = -g->dscale * g->ent_scale[row];
    float c = g->ent[row] - mx - logf(g->stats[2 * row + 1]); /* log p_v + H = l_v + c */
    #pragma omp simd
    for (int v = 0; v < vend; v++) d[v] = dt_vexpf(d[v] - mx) * inv * (ds + es * (d[v] + c));
    for (int v = vend; v < r; v++) d[v] = 0.0f;
    if (tg >= 0 && tg < r) d[tg] -= ds;
}

/* row_grad's arithmetic, a block at a time: the same bits. */
void dt_crossentropy_grad_lp(float *dst, const uint16_t *logits, int row0, int n, int Vp, int o0, int r, const dt_ce_grad *g,
                             dt_dtype t) {
    int vend = g->V - o0 < r ? (g->V - o0 > 0 ? g->V - o0 : 0) : r; /* columns of the chunk below V */
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        int row = row0 + i;
        float *d = dst + (size_t)i * r, mx = g->stats[2 * row], inv = 1.0f / g->stats[2 * row + 1];
        float ds = g->row_scale ? g->dscale * g->row_scale[row] : g->dscale;
        if (g->targets[row] < 0) { /* not scored */
            for (int v = 0; v < r; v++) d[v] = 0.0f;
            continue;
        }
        dt_lp_unpack(d, logits + (size_t)row * Vp + o0, (size_t)r, t);
        int tg = g->targets[row] - g->v0 - o0;
        if (g->ent_scale) ent_grad_row(d, r, vend, tg, g, row);
        else {
            #pragma omp simd
            for (int v = 0; v < vend; v++) d[v] = dt_vexpf(d[v] - mx) * inv * ds;
            for (int v = vend; v < r; v++) d[v] = 0.0f;
            if (tg >= 0 && tg < r) d[tg] -= ds;
        }
        dt_lp_round(d, (size_t)r, t);
    }
}

void dt_crossentropy_grad_entropy(float *logits, int BT, int Vp, const dt_ce_grad *g) {
    #pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) {
        float *d = logits + (size_t)i * Vp;
        if (g->targets[i] < 0) {
            for (int v = 0; v < Vp; v++) d[v] = 0.0f;
            continue;
        }
        ent_grad_row(d, Vp, g->V, g->targets[i] - g->v0, g, i);
    }
}
