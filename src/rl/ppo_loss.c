/* PPO's loss and its gradient by hand (CleanRL's ppo.py, as PyTorch's
 * autograd differentiates it: a clamp passes the gradient inside its range,
 * bounds included, and 0 outside; where torch.max's two arguments tie the
 * clamp is inside its range and both have the same gradient). */
#include "dtrain/rl.h"

#include <math.h>

void dt_ppo_loss(const dt_ppo_config *c, int B, int K, const float *logits, const float *values, const float *actions,
                 const float *old_logp, const float *old_values, const float *adv, const float *returns, const float *w,
                 float *dlogits, float *dvalues, dt_ppo_terms *t) {
    const double eps = c->clip_coef;
    for (int i = 0; i < B; i++) {
        const float *z = logits + (size_t)i * K;
        float *dz = dlogits + (size_t)i * K;
        double wi = w[i];
        if (wi == 0) {
            for (int k = 0; k < K; k++) dz[k] = 0;
            dvalues[i] = 0;
            continue;
        }
        /* log-softmax, entropy */
        double mx = z[0], sum = 0, H = 0;
        for (int k = 1; k < K; k++) mx = z[k] > mx ? z[k] : mx;
        for (int k = 0; k < K; k++) sum += exp(z[k] - mx);
        double lse = mx + log(sum);
        for (int k = 0; k < K; k++) {
            double lp = z[k] - lse;
            H -= exp(lp) * lp;
        }
        int a = (int)actions[i];
        double logp = z[a] - lse, logratio = logp - old_logp[i], ratio = exp(logratio), A = adv[i];
        double l1 = -A * ratio, clipped = ratio < 1 - eps ? 1 - eps : ratio > 1 + eps ? 1 + eps : ratio, l2 = -A * clipped;
        double pg = l1 >= l2 ? l1 : l2;
        /* d pg / d logp = d pg / d ratio * ratio */
        double dratio = l1 >= l2 ? -A : (ratio >= 1 - eps && ratio <= 1 + eps ? -A : 0);
        double dlogp = dratio * ratio;
        for (int k = 0; k < K; k++) {
            double pk = exp(z[k] - lse), lpk = z[k] - lse;
            double g = dlogp * ((k == a) - pk);  /* d logp_a / d z_k = [k = a] - p_k */
            g += c->ent_coef * pk * (lpk + H);   /* d (-ent_coef H) / d z_k: dH/dz_k = -p_k (log p_k + H) */
            dz[k] = (float)(wi * g);
        }
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
