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
static void normalise(dt_rollout *r, int j, int stepped) {
    if (r->obs_norm) dt_running_norm_obs(&r->obs_norm[j], r->next_obs + (size_t)j * r->od, 1);
    if (r->ret_norm && stepped && !r->reset[j])
        r->rew[j] = dt_running_norm_reward(&r->ret_norm[j], &r->ret_acc[j], r->rew[j], r->term[j], r->gamma);
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

/* What both kinds of pool need (r's pool, info and n set). */
static dt_status init_common(dt_rollout *r, const dt_rl_config *c, dt_policy *pol, int first, int T) {
    const dt_env_info *in = r->info;
    r->pol = pol, r->T = T, r->od = in->obs_dim, r->ad = in->act_dim, r->K = dt_policy_outputs(pol), r->first = first;
    r->seed = c->seed, r->gamma = c->gamma, r->trunc_as_term = c->trunc_as_term;
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
    return setup_norms(r, c);
}

dt_status dt_rollout_init(dt_rollout *r, const dt_rl_config *c, dt_env_pool *pool, dt_policy *pol, int first, int T) {
    *r = (dt_rollout){ .pool = pool, .info = dt_env_pool_info(pool), .n = dt_env_pool_size(pool) };
    dt_status st = init_common(r, c, pol, first, T);
    if (!st) st = dt_env_pool_reset(pool, r->next_obs);
    for (int j = 0; j < r->n && !st; j++) normalise(r, j, 0);
    return st;
}

/* The environments of a receive of k: each one's results in place (obs into next_obs), ids sorted ascending. */
static dt_status receive(dt_rollout *r, int k) {
    dt_status st = dt_env_pool_async_recv_n(r->apool, k, r->ids, r->obs_b, r->rew_b, r->term_b, r->trunc_b, r->reset_b);
    if (st) return st;
    for (int i = 0; i < k; i++) {
        int j = r->ids[i];
        memcpy(r->next_obs + (size_t)j * r->od, r->obs_b + (size_t)i * r->od, sizeof(float) * (size_t)r->od);
        r->rew[j] = r->rew_b[i], r->term[j] = r->term_b[i], r->trunc[j] = r->trunc_b[i], r->reset[j] = r->reset_b[i];
    }
    for (int i = 1; i < k; i++) /* the policy sees a batch in the environments' order */
        for (int q = i; q > 0 && r->ids[q - 1] > r->ids[q]; q--) {
            int t = r->ids[q];
            r->ids[q] = r->ids[q - 1], r->ids[q - 1] = t;
        }
    return DT_OK;
}

dt_status dt_rollout_async_batch(const dt_rl_config *c, int n, const char *who, const char *whose, int *batch) {
    *batch = c->async_batch ? c->async_batch : (n + 1) / 2;
    if (*batch > n) return dt_error(DT_ERR_ARG, "%s: --async-batch %d: a receive takes 1 to %s %d environments", who, *batch, whose, n);
    return DT_OK;
}

dt_status dt_rollout_init_async(dt_rollout *r, const dt_rl_config *c, dt_env_pool_async *pool, int batch, dt_policy *pol, int first,
                                int T) {
    const dt_env_info *in = dt_env_pool_async_info(pool);
    *r = (dt_rollout){ .apool = pool, .info = in, .n = dt_env_pool_async_size(pool), .batch = batch };
    dt_status st = init_common(r, c, pol, first, T);
    size_t n = (size_t)r->n;
    if (!st) {
        r->t_at = calloc(n, sizeof(int)), r->ids = malloc(n * sizeof(int));
        r->xb = malloc(sizeof(float) * n * r->od), r->obs_b = malloc(sizeof(float) * n * r->od);
        r->ab = malloc(sizeof(float) * n * r->ad), r->rew_b = malloc(sizeof(float) * n);
        r->term_b = malloc(n), r->trunc_b = malloc(n), r->reset_b = malloc(n);
        if (!r->t_at || !r->ids || !r->xb || !r->obs_b || !r->ab || !r->rew_b || !r->term_b || !r->trunc_b || !r->reset_b)
            st = dt_error(DT_ERR_NOMEM, "rl: out of memory for %d environments", r->n);
    }
    if (!st) st = dt_env_pool_async_reset(pool); /* every first observation comes back by a receive */
    if (!st) st = receive(r, r->n);
    for (int j = 0; j < r->n && !st; j++) normalise(r, j, 0);
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
    void *bufs[] = { r->next_obs, r->act_env, r->rew, r->term, r->trunc, r->ended, r->reset, r->t_at, r->ids, r->xb, r->ab, r->obs_b,
                     r->rew_b, r->term_b, r->trunc_b, r->reset_b };
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
    dt_env_clip_action(r->info, e);
}

/* The policy on environments ids[0..k) (NULL: all n, in order, at row t): each one's row (an asynchronous rollout's: the
 * environment's own step, t_at) gets its observation and value and, before the bootstrap row, its action. */
static dt_status act_on(dt_rollout *r, const int *ids, int k, int t, int64_t step0, float *rec) {
    const float *logits, *values, *x = r->next_obs;
    size_t len = dt_rollout_rec_len(r->od, r->ad), od = (size_t)r->od;
    for (int i = 0; ids && i < k; i++) memcpy(r->xb + i * od, r->next_obs + (size_t)ids[i] * od, sizeof(float) * od);
    dt_status st = dt_policy_forward(r->pol, ids ? r->xb : x, k, &logits, &values);
    if (st) return st;
    for (int i = 0; i < k; i++) {
        int j = ids ? ids[i] : i, tj = ids ? r->t_at[j] : t;
        float *row = rec + ((size_t)tj * r->n + j) * len, *f = row + r->od + r->ad;
        memcpy(row, r->next_obs + (size_t)j * od, sizeof(float) * od);
        memset(row + r->od, 0, sizeof(float) * (size_t)(r->ad + DT_RL_NFIELDS));
        f[DT_RL_VAL] = values[i];
        if (tj == r->T) continue; /* the bootstrap row: the value of the observation after the rollout */
        act(r, logits + (size_t)i * r->K, j, step0 + tj, row + r->od, &f[DT_RL_LOGP]);
        f[DT_RL_VALID] = !r->ended[j];
    }
    return DT_OK;
}

/* Environment j's step (its results in next_obs, rew, term, trunc and reset) into its row t. */
static void took_step(dt_rollout *r, int j, int t, float *rec) {
    normalise(r, j, 1);
    float *f = rec + ((size_t)t * r->n + j) * dt_rollout_rec_len(r->od, r->ad) + r->od + r->ad;
    f[DT_RL_REW] = r->rew[j];
    f[DT_RL_TERM] = r->term[j] || (r->trunc_as_term && r->trunc[j]);
    f[DT_RL_DONE] = r->term[j] || r->trunc[j];
    r->ended[j] = r->term[j] || r->trunc[j];
    if (r->reset[j]) f[DT_RL_VALID] = 0; /* an autoreset (invalid already) or an episode the pool dropped */
}

/* Each environment's actions in `ids`' order, sent (k of them). */
static dt_status send_actions(dt_rollout *r, int k) {
    for (int i = 0; i < k; i++) memcpy(r->ab + (size_t)i * r->ad, r->act_env + (size_t)r->ids[i] * r->ad, sizeof(float) * (size_t)r->ad);
    return dt_env_pool_async_send(r->apool, r->ab, r->ids, k);
}

/* Every environment acts at row 0 and steps; then each batch received is written, acted on and sent on, until every
 * environment has its T steps and its bootstrap row. */
static dt_status run_async(dt_rollout *r, int64_t step0, float *rec) {
    for (int j = 0; j < r->n; j++) r->t_at[j] = 0, r->ids[j] = j;
    dt_status st = act_on(r, NULL, r->n, 0, step0, rec);
    if (!st) st = send_actions(r, r->n);
    for (int stepping = r->n; !st && stepping > 0;) {
        int k = stepping < r->batch ? stepping : r->batch;
        if ((st = receive(r, k))) break;
        stepping -= k;
        for (int i = 0; i < k; i++) took_step(r, r->ids[i], r->t_at[r->ids[i]]++, rec);
        if ((st = act_on(r, r->ids, k, 0, step0, rec))) break;
        int m = 0;
        for (int i = 0; i < k; i++)
            if (r->t_at[r->ids[i]] < r->T) r->ids[m++] = r->ids[i];
        stepping += m;
        st = send_actions(r, m);
    }
    return st;
}

dt_status dt_rollout_run(dt_rollout *r, int64_t step0, float *rec) {
    if (r->apool) return run_async(r, step0, rec);
    dt_status st = DT_OK;
    for (int t = 0; t <= r->T && !st; t++) {
        if ((st = act_on(r, NULL, r->n, t, step0, rec)) || t == r->T) break;
        st = dt_env_pool_step(r->pool, r->act_env, r->next_obs, r->rew, r->term, r->trunc, r->reset);
        for (int j = 0; j < r->n && !st; j++) took_step(r, j, t, rec);
    }
    return st;
}

int dt_rollout_episodes(dt_rollout *r, dt_episode *out, int cap) {
    return r->apool ? dt_env_pool_async_episodes(r->apool, out, cap) : dt_env_pool_episodes(r->pool, out, cap);
}

/* dt_rollout_record's doubles for od observations, normalised or not, rewards scaled or not */
static size_t state_len(int od, int norm_obs, int norm_reward) {
    return (size_t)od + 1 + (norm_obs ? 1 + 2 * (size_t)od : 0) + (norm_reward ? 4 : 0);
}

size_t dt_rollout_record_len(const dt_rollout *r) {
    return state_len(r->od, r->obs_norm != NULL, r->ret_norm != NULL);
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

size_t dt_rollout_env_len_of(int od, int norm_obs, int norm_reward) { return DT_ENV_POOL_RECORD + state_len(od, norm_obs, norm_reward); }
size_t dt_rollout_env_len(const dt_rollout *r) { return dt_rollout_env_len_of(r->od, r->obs_norm != NULL, r->ret_norm != NULL); }

dt_status dt_rollout_env_record(const dt_rollout *r, int j, double *rec) {
    dt_status st = r->apool ? dt_env_pool_async_record(r->apool, j, rec) : dt_env_pool_record(r->pool, j, rec);
    dt_rollout_record(r, j, rec + DT_ENV_POOL_RECORD);
    return st;
}

dt_status dt_rollout_env_restore(dt_rollout *r, int j, const double *rec) {
    dt_status st = r->apool ? dt_env_pool_async_restore(r->apool, j, rec) : dt_env_pool_restore(r->pool, j, rec);
    return st ? st : dt_rollout_restore(r, j, rec + DT_ENV_POOL_RECORD);
}

int64_t dt_rollout_pool_steps(const dt_rollout *r) { return r->apool ? dt_env_pool_async_steps(r->apool) : dt_env_pool_steps(r->pool); }
void dt_rollout_set_pool_steps(dt_rollout *r, int64_t steps) {
    if (r->apool) dt_env_pool_async_set_steps(r->apool, steps);
    else dt_env_pool_set_steps(r->pool, steps);
}
const char *dt_rollout_unsaveable(const dt_rollout *r) { return r->apool ? NULL : dt_env_pool_unsaveable(r->pool); }
bool dt_rollout_restarts(const dt_rollout *r) { return r->apool ? dt_env_pool_async_restarts(r->apool) : dt_env_pool_restarts(r->pool); }
