/* A rollout: T steps of n environments of one pool acted on by one policy,
 * recorded row by row, as PPO's ranks and IMPALA's actors collect them.
 * The record of (step t, environment j) holds its observation (normalised
 * when the run normalises), its action, then the fields below; row T is
 * the bootstrap row (the observation after the last step and its value).
 * An action is drawn from uniforms that depend on (seed, the environment's
 * number in the job, the step) only, so the same environments stepped by
 * any split of ranks or actors draw the same samples. */
#ifndef DTRAIN_RL_ROLLOUT_H
#define DTRAIN_RL_ROLLOUT_H

#include "dtrain/rl.h"
#include "policy.h"
#include "running_norm.h"

enum { DT_RL_LOGP, DT_RL_VAL, DT_RL_REW, DT_RL_DONE, DT_RL_TERM, DT_RL_VALID, DT_RL_NFIELDS };

typedef struct {
    dt_env_pool *pool;  /* borrowed (NULL: apool's) */
    dt_env_pool_async *apool; /* borrowed: an asynchronous pool (NULL: pool's) */
    const dt_env_info *info;
    dt_policy *pol;     /* borrowed */
    int n, T, od, ad, K, first; /* first: environment 0's number in the job */
    uint64_t seed;
    float gamma;
    int trunc_as_term;
    float *next_obs;    /* [n, od] */
    float *act_env, *rew; /* act_env: the actions clipped to the space (ClipAction) */
    uint8_t *term, *trunc, *ended, *reset;
    dt_running_norm *obs_norm, *ret_norm; /* an environment's each (NULL: off) */
    double *ret_acc;
    /* the asynchronous pool's: each environment's step in the rollout, a batch's environments (ascending), their
     * observations for the policy and actions to send, and what a receive gives [batch] */
    int *t_at, *ids, batch;
    float *xb, *ab, *obs_b, *rew_b;
    uint8_t *term_b, *trunc_b, *reset_b;
} dt_rollout;

/* Floats in one record. */
static inline size_t dt_rollout_rec_len(int od, int ad) { return (size_t)od + ad + DT_RL_NFIELDS; }
/* The pool's environments are first .. first + n - 1 of the job; resets the pool. T: steps a rollout. */
dt_status dt_rollout_init(dt_rollout *r, const dt_rl_config *c, dt_env_pool *pool, dt_policy *pol, int first, int T);
/* The same over an asynchronous pool whose receives give `batch` environments: an environment steps on as soon as the
 * policy has acted on the batch it came back in. Each environment's rows are the synchronous rollout's (the policy
 * is fixed during a rollout and the actions' uniforms are the environment's and step's), in any batches. */
dt_status dt_rollout_init_async(dt_rollout *r, const dt_rl_config *c, dt_env_pool_async *pool, int batch, dt_policy *pol, int first,
                                int T);
/* That batch for a pool of n environments: --async-batch, or half of them; one above n refused (who: "ppo", "impala";
 * whose: "a rank's", "an actor's"). */
dt_status dt_rollout_async_batch(const dt_rl_config *c, int n, const char *who, const char *whose, int *batch);
/* The episodes the pool finished since the last call (dt_env_pool_episodes', dt_env_pool_async_episodes'): up to cap;
 * the count. */
int dt_rollout_episodes(dt_rollout *r, dt_episode *out, int cap);
void dt_rollout_free(dt_rollout *r);
/* What a rollout keeps of environment j between rollouts, as doubles (a checkpoint's): the next observation, whether its
 * episode ended, and its normalisers' statistics (count, mean, variance; the discounted return). */
size_t dt_rollout_record_len(const dt_rollout *r);
void dt_rollout_record(const dt_rollout *r, int j, double *rec);
dt_status dt_rollout_restore(dt_rollout *r, int j, const double *rec);
/* Environment j as a run state holds it, whichever pool: the pool's record (DT_ENV_POOL_RECORD doubles: the environment
 * and its running episode), then the rollout's; dt_rollout_env_len doubles. The pool's steps since its reset, and
 * set; why its environments cannot be saved (NULL: they can); whether their episodes restart when restored. */
size_t dt_rollout_env_len(const dt_rollout *r);
size_t dt_rollout_env_len_of(int od, int norm_obs, int norm_reward); /* the same before a rollout exists */
dt_status dt_rollout_env_record(const dt_rollout *r, int j, double *rec);
dt_status dt_rollout_env_restore(dt_rollout *r, int j, const double *rec);
int64_t dt_rollout_pool_steps(const dt_rollout *r);
void dt_rollout_set_pool_steps(dt_rollout *r, int64_t steps);
const char *dt_rollout_unsaveable(const dt_rollout *r);
bool dt_rollout_restarts(const dt_rollout *r);
/* T steps from the pool's step step0 (counted from its reset) into rec [(T+1)][n][rec_len]. An asynchronous pool's
 * environments are all with the rollout before and after. */
dt_status dt_rollout_run(dt_rollout *r, int64_t step0, float *rec);

#endif
