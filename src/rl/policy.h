/* An actor-critic policy: CleanRL's two networks (obs -> hidden -> hidden ->
 * the actor's head, and -> value, tanh between layers, orthogonal
 * initialisation with gains sqrt(2), sqrt(2) and 0.01 for the actor's head,
 * 1 for the critic's), two MLPs whose parameters and gradients live in one
 * flat store that the engine sees as one model. For discrete actions the
 * head gives a categorical distribution's logits (ppo.py); for continuous
 * ones a diagonal Gaussian's means, with a log standard deviation a
 * dimension that depends on nothing (actor_logstd, zeros at the start:
 * ppo_continuous_action.py). */
#ifndef DTRAIN_RL_POLICY_H
#define DTRAIN_RL_POLICY_H

#include "dtrain/engine.h"
#include "dtrain/model.h"
#include "dtrain/rl.h"

typedef struct dt_policy dt_policy;

/* outputs: the actions (discrete) or the action's dimensions (gaussian). */
dt_status dt_policy_create(int obs_dim, int outputs, int gaussian, int hidden, uint64_t seed, dt_policy **out);
void dt_policy_destroy(dt_policy *p);
/* The engine's view: the table (actor.0.weight .. critic.4.bias, or actor_mean.0.weight .. critic.4.bias and
 * actor_logstd: PyTorch's names for CleanRL's modules), the store, the hooks (units: the actor's layers, the
 * critic's, then the log std). */
void dt_policy_model(dt_policy *p, dt_model *out);
size_t dt_policy_num_params(const dt_policy *p);
/* The engine that updates it as the recipes do: Adam (eps 1e-5, no weight decay), the gradient's global norm
 * clipped to c->max_grad_norm, data-parallel over comm (NULL: this process alone). */
dt_status dt_policy_engine_create(dt_policy *p, const dt_rl_config *c, dt_comm *comm, dt_engine **out);
float *dt_policy_params(dt_policy *p);
int dt_policy_outputs(const dt_policy *p);
/* The log standard deviations [outputs] (NULL: a discrete policy). */
const float *dt_policy_logstd(const dt_policy *p);
/* obs [B, obs_dim] (kept by pointer until backward): *head [B, outputs] (logits or means), *values [B]. */
dt_status dt_policy_forward(dt_policy *p, const float *obs, int B, const float **head, const float **values);
/* Adds the gradients given d loss / d head, d loss / d values and (gaussian) d loss / d logstd [outputs]; the
 * hooks of the log std first, then the critic's, then the actor's. */
dt_status dt_policy_backward(dt_policy *p, const float *dhead, const float *dvalues, const float *dlogstd);

/* Uniforms an action is drawn from: 1 (discrete), 2 a dimension (gaussian, Box-Muller). */
int dt_policy_uniforms(const dt_policy *p);
/* An action from a head's row: with u (dt_policy_uniforms of them, in [0, 1)) a sample (the action whose cumulative
 * probability first passes u[0]; the means plus the standard deviations times normals), with u NULL the most
 * likely one; action [1] (the index as a float) or [outputs]; *logp (may be NULL) its log probability. */
void dt_policy_draw(const dt_policy *p, const float *head, const double *u, float *action, float *logp);

/* --save's file (policy_file.c): the table's tensors and, with obs_mean (NULL: none), the observation statistics
 * the policy was trained under, obs_rms.mean and obs_rms.var [obs_dim] (Gymnasium's names), as f32. */
dt_status dt_policy_save(dt_policy *p, const char *path, int obs_dim, const double *obs_mean, const double *obs_var);
/* The policy's tensors from such a file (a tensor missing or of another shape is an error naming it), and its
 * statistics into obs_mean and obs_var [obs_dim] if it has them (*has_norm says). */
dt_status dt_policy_load(dt_policy *p, const char *path, int obs_dim, float *obs_mean, float *obs_var, int *has_norm);

#endif
