/* An actor-critic policy for discrete actions: CleanRL's two networks (obs ->
 * hidden -> hidden -> logits, and -> value, tanh between layers, orthogonal
 * initialisation with gains sqrt(2), sqrt(2) and 0.01 for the actor's head,
 * 1 for the critic's), two MLPs whose parameters and gradients live in one
 * flat store that the engine sees as one model. */
#ifndef DTRAIN_RL_POLICY_H
#define DTRAIN_RL_POLICY_H

#include "dtrain/model.h"

typedef struct dt_policy dt_policy;

dt_status dt_policy_create(int obs_dim, int actions, int hidden, uint64_t seed, dt_policy **out);
void dt_policy_destroy(dt_policy *p);
/* The engine's view: the table (actor.0.weight .. critic.4.bias, PyTorch's names for CleanRL's Sequential layers), the
 * store, the hooks (units: the actor's layers, then the critic's). */
void dt_policy_model(dt_policy *p, dt_model *out);
size_t dt_policy_num_params(const dt_policy *p);
float *dt_policy_params(dt_policy *p);
/* obs [B, obs_dim] (kept by pointer until backward): *logits [B, actions], *values [B]. */
dt_status dt_policy_forward(dt_policy *p, const float *obs, int B, const float **logits, const float **values);
/* Adds the gradients given d loss / d logits and d loss / d values; the critic's hooks first, then the actor's. */
dt_status dt_policy_backward(dt_policy *p, const float *dlogits, const float *dvalues);

/* The action whose cumulative probability first passes u (in [0, 1)) under softmax(logits[K]): a sample when u is
 * uniform; *logp (may be NULL) its log probability. */
int dt_policy_pick(const float *logits, int K, double u, float *logp);

#endif
