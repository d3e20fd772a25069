/* Deep Gradient Compression's rules (Lin et al. 2018) on top of top-k's exchange (codec_topk.c): what a rank adds to
 * its accumulation before the choice, and the warm-up of densities.
 *
 * Momentum correction: SGD's momentum moves from the optimizer onto each rank, before sparsification, so that what
 * accumulates unsent is velocity, not raw gradient: u = m u + g, v = v + u (Nesterov: u = m (u + g), v = v + u + g),
 * g with SGD's weight decay in it (g + wd p, as the paper's implementation adds it before compensation: the decay then
 * goes through the momentum as it does in dense SGD, not once outside it),
 * the top-k of |v| is sent, and the optimizer applies the average with plain SGD. Momentum factor masking: where an
 * entry was sent, u is zeroed as v is, so a stale velocity does not push it on. Local gradient clipping: each tensor's
 * gradient is clipped on its rank before it is accumulated (the run's --grad-clip over the square root of the ranks, as the
 * paper scales it; per tensor, since a bucket is handed over before the rest of the model's gradient exists).
 * Warm-up: densities 0.25, 0.0625, 0.015625 and 0.004 (the paper's 75% to 99.6% sparsity, exponentially), each for
 * c->warmup steps from the start step, then c->density; a stage below the final density takes the final one. */
#include "codec_internal.h"

#include <math.h>

double dt_codec_density_at(const dt_codec_config *c, int step) {
    static const double stages[] = { 0.25, 0.0625, 0.015625, 0.004 };
    int s = step - c->start;
    if (c->warmup <= 0 || s < 0 || s >= 4 * c->warmup) return c->density;
    double d = stages[s / c->warmup];
    return d > c->density ? d : c->density;
}

float dt_codec_density_max(const dt_codec_config *c) { return c->warmup > 0 && c->density < 0.25f ? 0.25f : c->density; }

void dt_dgc_accumulate(const dt_codec_config *c, const float *g, const float *p, float *u, float *v, size_t n) {
    float wd = p ? c->weight_decay : 0, m = c->momentum;
    double ss = 0;
    for (size_t j = 0; c->clip > 0 && j < n; j++) {
        float x = wd > 0 ? g[j] + wd * p[j] : g[j];
        ss += (double)x * x;
    }
    /* PyTorch's clip_grad_norm_ factor: max_norm / (norm + 1e-6), applied only when below 1 */
    float f = c->clip > 0 && c->clip / (sqrt(ss) + 1e-6) < 1 ? (float)(c->clip / (sqrt(ss) + 1e-6)) : 1.0f;
    for (size_t j = 0; j < n; j++) {
        float x = f * (wd > 0 ? g[j] + wd * p[j] : g[j]);
        if (c->nesterov) {
            u[j] = m * (u[j] + x);
            v[j] = v[j] + u[j] + x;
        } else {
            u[j] = m * u[j] + x;
            v[j] = v[j] + u[j];
        }
    }
}
