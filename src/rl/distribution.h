/* The policy's two distributions, as the losses and the sampler read them:
 * a categorical over logits (ppo.py) and a diagonal Gaussian of means and
 * log standard deviations (ppo_continuous_action.py); log probabilities,
 * entropies and their gradients by hand, as PyTorch's autograd gives them. */
#ifndef DTRAIN_RL_DISTRIBUTION_H
#define DTRAIN_RL_DISTRIBUTION_H

/* log pi(a) of a categorical over z[K]; its entropy into *H (may be NULL). */
double dt_rl_categorical(const float *z, int K, int a, double *H);
/* A row's d loss / d z into g[K] given its weight w, d loss / d log pi(a) and the entropy's coefficient ent (the loss
 * holds - ent * H); logp and H as dt_rl_categorical gave them. */
void dt_rl_categorical_grad(const float *z, int K, int a, double logp, double H, double w, double dlogp, double ent, float *g);
/* log pi(a) of a diagonal Gaussian of means mu[K] and log stds ls[K] at a[K]; its entropy into *H (may be NULL). */
double dt_rl_gaussian(const float *mu, const float *ls, int K, const float *a, double *H);
/* Its gradients: the means' into g[K], the log stds' added to gls[K]. */
void dt_rl_gaussian_grad(const float *mu, const float *ls, int K, const float *a, double w, double dlogp, double ent, float *g,
                         float *gls);

#endif
