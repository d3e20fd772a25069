/* Softmax cross-entropy over the first V of Vp logits per position, fused
 * with its gradient: the probabilities are recomputed in place of the
 * logits instead of being stored beside them. */
#include "dtrain/kernels.h"
#include "vexp.h"

#include <math.h>

static float row_loss(const float *l, int target, int V, float *mx_out, float *sum_out) {
    float mx = -INFINITY;
    #pragma omp simd reduction(max : mx)
    for (int v = 0; v < V; v++) mx = l[v] > mx ? l[v] : mx;
    float sum = 0;
    #pragma omp simd reduction(+ : sum)
    for (int v = 0; v < V; v++) sum += dt_vexpf(l[v] - mx);
    *mx_out = mx;
    *sum_out = sum;
    return logf(sum) + mx - l[target];
}

float dt_crossentropy_forward(float *losses, const float *logits, const int32_t *targets, int BT, int V, int Vp) {
    double total = 0;
    #pragma omp parallel for reduction(+ : total) schedule(static)
    for (int i = 0; i < BT; i++) {
        float mx, sum;
        losses[i] = row_loss(logits + (size_t)i * Vp, targets[i], V, &mx, &sum);
        total += losses[i];
    }
    return (float)(total / BT);
}

float dt_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale, dt_dtype t) {
    double total = 0;
    #pragma omp parallel for reduction(+ : total) schedule(static)
    for (int i = 0; i < BT; i++) {
        float *l = logits + (size_t)i * Vp, mx, sum;
        losses[i] = row_loss(l, targets[i], V, &mx, &sum);
        total += losses[i];
        float inv = 1.0f / sum;
        #pragma omp simd
        for (int v = 0; v < V; v++) l[v] = dt_vexpf(l[v] - mx) * inv * dscale;
        l[targets[i]] -= dscale;
        for (int v = V; v < Vp; v++) l[v] = 0.0f;
        dt_lp_round(l, (size_t)V, t); /* while the row is in cache */
    }
    return (float)(total / BT);
}
