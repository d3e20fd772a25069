/* PPO's loss and its gradient by hand (CleanRL's ppo.py, as PyTorch's
 * autograd differentiates it: a clamp passes the gradient inside its range,
 * bounds included, and 0 outside; where torch.max's two arguments tie the
 * clamp is inside its range and both have the same gradient). The policy's
 * distribution is a categorical over logits (ppo.py) or a diagonal Gaussian
 * (ppo_continuous_action.py); the rest does not depend on which. */
#include "dtrain/rl.h"
#include "distribution.h"

#include <math.h>

void dt_ppo_loss(const dt_rl_config *c, int B, int K, const float *logstd, const float *head, const float *values,
                 const float *actions, const float *old_logp, const float *old_values, const float *adv, const float *returns,
                 const float *w, float *dhead, float *dlogstd, float *dvalues, dt_rl_terms *t) {
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
        logp = logstd ? dt_rl_gaussian(z, logstd, K, a, &H) : dt_rl_categorical(z, K, (int)a[0], &H);
        double logratio = logp - old_logp[i], ratio = exp(logratio), A = adv[i];
        double l1 = -A * ratio, clipped = ratio < 1 - eps ? 1 - eps : ratio > 1 + eps ? 1 + eps : ratio, l2 = -A * clipped;
        double pg = l1 >= l2 ? l1 : l2;
        /* d pg / d logp = d pg / d ratio * ratio */
        double dratio = l1 >= l2 ? -A : (ratio >= 1 - eps && ratio <= 1 + eps ? -A : 0);
        double dlogp = dratio * ratio;
        if (logstd) dt_rl_gaussian_grad(z, logstd, K, a, wi, dlogp, c->ent_coef, dz, dlogstd);
        else dt_rl_categorical_grad(z, K, (int)a[0], logp, H, wi, dlogp, c->ent_coef, dz);
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
