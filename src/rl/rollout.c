/* A rollout of a pool under a policy (see rollout.h). */
#include "rollout.h"
#include "env_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* The k-th uniform for (env in the job, step): the same sample whoever steps the environment. */
static double uniform_at(uint64_t seed, int env, int64_t step, int k) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)env * 0xd1b54a32d192ed03ull ^ (uint64_t)step * 0x8cb92ba72f3d8dd7ull ^
                 (uint64_t)k * 0xa0761d6478bd642full;
    return dt_rng_double(&s);
}

/* The wrappers over the pool's output (continuous PPO's recipe): each environment's observation normalised, its
 * reward scaled; a reset step's reward is not a transition's and stays out of the statistics. */
static void normalise(dt_rollout *r, int stepped) {
    for (int j = 0; j < r->n; j++) {
        if (r->obs_norm) dt_running_norm_obs(&r->obs_norm[j], r->next_obs + (size_t)j * r->od, 1);
        if (r->ret_norm && stepped && !r->reset[j])
            r->rew[j] = dt_running_norm_reward(&r->ret_norm[j], &r->ret_acc[j], r->rew[j], r->term[j], r->gamma);
    }
}

static dt_status setup_norms(dt_rollout *r, const dt_rl_config *c) {
    dt_status st = DT_OK;
    if (c->norm_obs && !(r->obs_norm = calloc((size_t)r->n, sizeof *r->obs_norm))) return dt_error(DT_ERR_NOMEM, "rl: out of memory");
    if (c->norm_reward && (!(r->ret_norm = calloc((size_t)r->n, sizeof *r->ret_norm)) ||
                           !(r->ret_acc = calloc((size_t)r->n, sizeof(double)))))
        return dt_error(DT_ERR_NOMEM, "rl: out of memory");
    for (int j = 0; j < r->n && !st; j++) {
        if (r->obs_norm) st = dt_running_norm_init(&r->obs_norm[j], r->od);
        if (r->ret_norm && !st) st = dt_running_norm_init(&r->ret_norm[j], 1);
    }
    return st;
}

dt_status dt_rollout_init(dt_rollout *r, const dt_rl_config *c, dt_env_pool *pool, dt_policy *pol, int first, int T) {
    const dt_env_info *in = dt_env_pool_info(pool);
    *r = (dt_rollout){ .pool = pool, .pol = pol, .n = dt_env_pool_size(pool), .T = T, .od = in->obs_dim, .ad = in->act_dim,
                       .K = dt_policy_outputs(pol), .first = first, .seed = c->seed, .gamma = c->gamma,
                       .trunc_as_term = c->trunc_as_term };
    size_t n = (size_t)r->n;
    r->next_obs = malloc(sizeof(float) * n * r->od);
    r->act_env = malloc(sizeof(float) * n * r->ad);
    r->rew = malloc(sizeof(float) * n);
    r->term = calloc(n, 1);
    r->trunc = calloc(n, 1);
    r->ended = calloc(n, 1);
    r->reset = calloc(n, 1);
    if (!r->next_obs || !r->act_env || !r->rew || !r->term || !r->trunc || !r->ended || !r->reset)
        return dt_error(DT_ERR_NOMEM, "rl: out of memory for %d environments", r->n);
    dt_status st = setup_norms(r, c);
    if (!st) st = dt_env_pool_reset(pool, r->next_obs);
    if (!st) normalise(r, 0);
    return st;
}

void dt_rollout_free(dt_rollout *r) {
    for (int j = 0; j < r->n; j++) {
        if (r->obs_norm) dt_running_norm_free(&r->obs_norm[j]);
        if (r->ret_norm) dt_running_norm_free(&r->ret_norm[j]);
    }
    free(r->obs_norm);
    free(r->ret_norm);
    free(r->ret_acc);
    void *bufs[] = { r->next_obs, r->act_env, r->rew, r->term, r->trunc, r->ended, r->reset };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

/* env j's action at step (drawn from the policy's head row z), into a and the env's clipped copy; its log prob */
static void act(dt_rollout *r, const float *z, int j, int64_t step, float *a, float *logp) {
    double u[64];
    int nu = dt_policy_uniforms(r->pol);
    for (int k = 0; k < nu; k++) u[k] = uniform_at(r->seed, r->first + j, step, k);
    dt_policy_draw(r->pol, z, u, a, logp);
    float *e = r->act_env + (size_t)j * r->ad;
    memcpy(e, a, sizeof(float) * (size_t)r->ad);
    dt_env_clip_action(dt_env_pool_info(r->pool), e);
}

dt_status dt_rollout_run(dt_rollout *r, int64_t step0, float *rec) {
    const float *logits, *values;
    size_t len = dt_rollout_rec_len(r->od, r->ad);
    dt_status st;
    for (int t = 0; t <= r->T; t++) {
        if ((st = dt_policy_forward(r->pol, r->next_obs, r->n, &logits, &values))) return st;
        for (int j = 0; j < r->n; j++) {
            float *x = rec + ((size_t)t * r->n + j) * len, *f = x + r->od + r->ad;
            memcpy(x, r->next_obs + (size_t)j * r->od, sizeof(float) * (size_t)r->od);
            memset(x + r->od, 0, sizeof(float) * (size_t)(r->ad + DT_RL_NFIELDS));
            f[DT_RL_VAL] = values[j];
            if (t == r->T) continue; /* the bootstrap row: the value of the observation after the rollout */
            act(r, logits + (size_t)j * r->K, j, step0 + t, x + r->od, &f[DT_RL_LOGP]);
            f[DT_RL_VALID] = !r->ended[j];
        }
        if (t == r->T) break;
        if ((st = dt_env_pool_step(r->pool, r->act_env, r->next_obs, r->rew, r->term, r->trunc, r->reset))) return st;
        normalise(r, 1);
        for (int j = 0; j < r->n; j++) {
            float *f = rec + ((size_t)t * r->n + j) * len + r->od + r->ad;
            f[DT_RL_REW] = r->rew[j];
            f[DT_RL_TERM] = r->term[j] || (r->trunc_as_term && r->trunc[j]);
            f[DT_RL_DONE] = r->term[j] || r->trunc[j];
            r->ended[j] = r->term[j] || r->trunc[j];
            if (r->reset[j]) f[DT_RL_VALID] = 0; /* an autoreset (invalid already) or an episode the pool dropped */
        }
    }
    return DT_OK;
}

size_t dt_rollout_record_len(const dt_rollout *r) {
    return dt_rollout_state_len(r->od, r->obs_norm != NULL, r->ret_norm != NULL);
}

/* a normaliser's statistics (count, mean, variance) into rec, or from it; past them */
static double *norm_out(const dt_running_norm *n, double *rec) {
    size_t d = (size_t)n->dim;
    rec[0] = n->count, memcpy(rec + 1, n->mean, d * sizeof *rec), memcpy(rec + 1 + d, n->var, d * sizeof *rec);
    return rec + 1 + 2 * d;
}

static const double *norm_in(dt_running_norm *n, const double *rec) {
    size_t d = (size_t)n->dim;
    n->count = rec[0], memcpy(n->mean, rec + 1, d * sizeof *rec), memcpy(n->var, rec + 1 + d, d * sizeof *rec);
    return rec + 1 + 2 * d;
}

void dt_rollout_record(const dt_rollout *r, int j, double *rec) {
    for (int i = 0; i < r->od; i++) rec[i] = r->next_obs[(size_t)j * r->od + i];
    rec += r->od;
    *rec++ = r->ended[j];
    if (r->obs_norm) rec = norm_out(&r->obs_norm[j], rec);
    if (r->ret_norm) rec = norm_out(&r->ret_norm[j], rec), *rec = r->ret_acc[j];
}

dt_status dt_rollout_restore(dt_rollout *r, int j, const double *rec) {
    size_t n = dt_rollout_record_len(r);
    for (size_t i = 0; i < n; i++)
        if (!isfinite(rec[i])) return dt_error(DT_ERR_IO, "environment %d: a saved observation or statistic is not finite", r->first + j);
    if (rec[r->od] != 0 && rec[r->od] != 1) return dt_error(DT_ERR_IO, "environment %d: a saved flag of %g", r->first + j, rec[r->od]);
    for (int i = 0; i < r->od; i++) r->next_obs[(size_t)j * r->od + i] = (float)rec[i];
    /* an environment whose episode restarts (dt_env_pool_restarts) has its next step reset by the pool, which says so:
     * that row is left out as every reset row is (dt_rollout_run) */
    r->ended[j] = (uint8_t)rec[r->od];
    const double *at = rec + r->od + 1;
    if (r->obs_norm) at = norm_in(&r->obs_norm[j], at);
    if (r->ret_norm) at = norm_in(&r->ret_norm[j], at), r->ret_acc[j] = *at;
    return DT_OK;
}
