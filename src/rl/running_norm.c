/* Running observation and reward normalisation (see running_norm.h). */
#include "running_norm.h"

#include <math.h>
#include <stdlib.h>

#define EPS 1e-8 /* the wrappers' epsilon under the square root */
#define CLIP 10.0

dt_status dt_running_norm_init(dt_running_norm *r, int dim) {
    r->dim = dim;
    r->count = 1e-4;
    r->mean = calloc((size_t)dim, sizeof(double));
    r->var = malloc((size_t)dim * sizeof(double));
    r->x = malloc((size_t)dim * sizeof(double));
    if (!r->mean || !r->var || !r->x) return dt_error(DT_ERR_NOMEM, "running normalisation: out of memory for %d components", dim);
    for (int i = 0; i < dim; i++) r->var[i] = 1;
    return DT_OK;
}

void dt_running_norm_free(dt_running_norm *r) {
    free(r->mean);
    free(r->var);
    free(r->x);
    r->mean = r->var = r->x = NULL;
}

void dt_running_norm_update(dt_running_norm *r, const double *x) {
    double tot = r->count + 1;
    for (int i = 0; i < r->dim; i++) {
        double delta = x[i] - r->mean[i];
        r->mean[i] += delta / tot;
        r->var[i] = (r->var[i] * r->count + delta * delta * r->count / tot) / tot;
    }
    r->count = tot;
}

static double clip(double v) { return v < -CLIP ? -CLIP : v > CLIP ? CLIP : v; }

void dt_running_norm_obs(dt_running_norm *r, float *x, int update) {
    if (update) {
        for (int i = 0; i < r->dim; i++) r->x[i] = x[i];
        dt_running_norm_update(r, r->x);
    }
    for (int i = 0; i < r->dim; i++) x[i] = (float)clip((x[i] - r->mean[i]) / sqrt(r->var[i] + EPS));
}

float dt_running_norm_reward(dt_running_norm *r, double *ret, double reward, int terminated, double gamma) {
    *ret = *ret * gamma * (1 - terminated) + reward;
    dt_running_norm_update(r, ret);
    return (float)clip(reward / sqrt(r->var[0] + EPS));
}
