/* PPO's loss and its gradient by hand (CleanRL's ppo.py, as PyTorch's
 * autograd differentiates it: a clamp passes the gradient inside its range,
 * bounds included, and 0 outside; where torch.max's two arguments tie the
 * clamp is inside its range and both have the same gradient). The policy's
 * distribution is a categorical over logits (ppo.py) or a diagonal Gaussian
 * (ppo_continuous_action.py); the rest does not depend on which. */
#include "dtrain/rl.h"

#include <math.h>

/* log pi(a) and the entropy of a categorical over z[K]. */
static void categorical(const float *z, int K, int a, double *logp, double *H) {
    double mx = z[0], sum = 0;
    for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
    for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
    double lse = mx + log(sum);
    *H = 0;
    for (int k = 0; k < K; k++) *H -= exp(z[k] - lse) * (z[k] - lse);
    *logp = z[a] - lse;
}

/* The row's d loss / d z into g[K], given its weight w, d loss / d logp and the entropy's coefficient. */
static void categorical_grad(const float *z, int K, int a, double logp, double H, double w, double dlogp, double ent, float *g) {
    double lse = z[a] - logp;
    for (int k = 0; k < K; k++) {
        double pk = exp(z[k] - lse), lpk = z[k] - lse;
        double d = dlogp * ((k == a) - pk); /* d logp_a / d z_k = [k = a] - p_k */
        d += ent * pk * (lpk + H);          /* d (-ent H) / d z_k: dH/dz_k = -p_k (log p_k + H) */
        g[k] = (float)(w * d);
    }
}

/* The same for a diagonal Gaussian of means mu[K] and log stds ls[K] at a[K]. The entropy, sum of ls + log(2 pi e) / 2,
 * does not depend on the means. */
static void gaussian(const float *mu, const float *ls, int K, const float *a, double *logp, double *H) {
    *logp = 0;
    *H = 0;
    for (int k = 0; k < K; k++) {
        double d = ((double)a[k] - mu[k]) * exp(-(double)ls[k]);
        *logp += -0.5 * d * d - ls[k] - 0.5 * log(2 * M_PI);
        *H += ls[k] + 0.5 + 0.5 * log(2 * M_PI);
    }
}

/* Its gradients: the means' into g[K], the log stds' added to gls[K]. */
static void gaussian_grad(const float *mu, const float *ls, int K, const float *a, double w, double dlogp, double ent, float *g,
                          float *gls) {
    for (int k = 0; k < K; k++) {
        double is = exp(-(double)ls[k]), d = ((double)a[k] - mu[k]) * is;
        g[k] = (float)(w * dlogp * d * is);                 /* d logp / d mu = (a - mu) / sigma^2 */
        gls[k] += (float)(w * (dlogp * (d * d - 1) - ent)); /* d logp / d ls = ((a - mu) / sigma)^2 - 1; dH / d ls = 1 */
    }
}

void dt_ppo_loss(const dt_ppo_config *c, int B, int K, const float *logstd, const float *head, const float *values,
                 const float *actions, const float *old_logp, const float *old_values, const float *adv, const float *returns,
                 const float *w, float *dhead, float *dlogstd, float *dvalues, dt_ppo_terms *t) {
    const double eps = c->clip_coef;
    int ad = logstd ? K : 1;
    for (int i = 0; i < B; i++) {
        const float *z = head + (size_t)i * K, *a = actions + (size_t)i * ad;
        float *dz = dhead + (size_t)i * K;
        double wi = w[i], logp, H;
        if (wi == 0) {
            for (int k = 0; k < K; k++) dz[k] = 0;
            dvalues[i] = 0;
            continue;
        }
        if (logstd) gaussian(z, logstd, K, a, &logp, &H);
        else categorical(z, K, (int)a[0], &logp, &H);
        double logratio = logp - old_logp[i], ratio = exp(logratio), A = adv[i];
        double l1 = -A * ratio, clipped = ratio < 1 - eps ? 1 - eps : ratio > 1 + eps ? 1 + eps : ratio, l2 = -A * clipped;
        double pg = l1 >= l2 ? l1 : l2;
        /* d pg / d logp = d pg / d ratio * ratio */
        double dratio = l1 >= l2 ? -A : (ratio >= 1 - eps && ratio <= 1 + eps ? -A : 0);
        double dlogp = dratio * ratio;
        if (logstd) gaussian_grad(z, logstd, K, a, wi, dlogp, c->ent_coef, dz, dlogstd);
        else categorical_grad(z, K, (int)a[0], logp, H, wi, dlogp, c->ent_coef, dz);
        /* the value loss, clipped around the rollout's value */
        double v = values[i], ov = old_values[i], R = returns[i], vl, dv;
        if (c->clip_vloss) {
            double d = v - ov, dc = d < -eps ? -eps : d > eps ? eps : d, vc = ov + dc;
            double u1 = (v - R) * (v - R), u2 = (vc - R) * (vc - R);
            vl = 0.5 * (u1 >= u2 ? u1 : u2);
            dv = u1 >= u2 ? (v - R) : (d >= -eps && d <= eps ? vc - R : 0);
        } else {
            vl = 0.5 * (v - R) * (v - R);
            dv = v - R;
        }
        dvalues[i] = (float)(wi * c->vf_coef * dv);
        t->pg += wi * pg;
        t->v += wi * vl;
        t->entropy += wi * H;
        t->loss += wi * (pg - c->ent_coef * H + c->vf_coef * vl);
        t->approx_kl += wi * ((ratio - 1) - logratio);
        t->clipfrac += wi * (fabs(ratio - 1) > eps);
    }
}
