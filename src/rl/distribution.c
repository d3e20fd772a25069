/* The categorical and the diagonal Gaussian (see distribution.h). */
#include "distribution.h"

#include <math.h>

double dt_rl_categorical(const float *z, int K, int a, double *H) {
    double mx = z[0], sum = 0;
    for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
    double lse = mx + log(sum);
    if (H) {
        *H = 0;
        for (int k = 0; k < K; k++) *H -= exp(z[k] - lse) * (z[k] - lse);
    }
    return z[a] - lse;
}

void dt_rl_categorical_grad(const float *z, int K, int a, double logp, double H, double w, double dlogp, double ent, float *g) {
    double lse = z[a] - logp;
    for (int k = 0; k < K; k++) {
        double pk = exp(z[k] - lse), lpk = z[k] - lse;
        double d = dlogp * ((k == a) - pk); /* d logp_a / d z_k = [k = a] - p_k */
        d += ent * pk * (lpk + H);          /* d (-ent H) / d z_k: dH/dz_k = -p_k (log p_k + H) */
        g[k] = (float)(w * d);
    }
}

/* The entropy, sum of ls + log(2 pi e) / 2, does not depend on the means. */
double dt_rl_gaussian(const float *mu, const float *ls, int K, const float *a, double *H) {
    double logp = 0, h = 0;
    for (int k = 0; k < K; k++) {
        double d = ((double)a[k] - mu[k]) * exp(-(double)ls[k]);
        logp += -0.5 * d * d - ls[k] - 0.5 * log(2 * M_PI);
        h += ls[k] + 0.5 + 0.5 * log(2 * M_PI);
    }
    if (H) *H = h;
    return logp;
}

void dt_rl_gaussian_grad(const float *mu, const float *ls, int K, const float *a, double w, double dlogp, double ent, float *g,
                         float *gls) {
    for (int k = 0; k < K; k++) {
        double is = exp(-(double)ls[k]), d = ((double)a[k] - mu[k]) * is;
        g[k] = (float)(w * dlogp * d * is);                 /* d logp / d mu = (a - mu) / sigma^2 */
        gls[k] += (float)(w * (dlogp * (d * d - 1) - ent)); /* d logp / d ls = ((a - mu) / sigma)^2 - 1; dH / d ls = 1 */
    }
}
