/* A saved PPO policy played on its environment: dtrain rl eval. The
 * episodes run side by side in one pool (episode k in environment k, reset
 * with seed + k), built in or bridged alike; each environment's first
 * episode is the one counted. */
#include "dtrain/rl.h"
#include "policy.h"
#include "running_norm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_DIM 64

typedef struct {
    dt_env_pool *pool;
    dt_policy *pol;
    dt_running_norm *norm; /* the training's observation statistics, fixed (NULL: none) */
    float *obs, *act, *rew;
    uint8_t *te, *tr, *live;
    uint64_t *rng;         /* episode k's draws */
} eval;

/* Every live environment's action from its observation, one row at a time (the bits one episode alone gets). */
static dt_status actions(eval *v, int n, int greedy) {
    const dt_env_info *in = dt_env_pool_info(v->pool);
    for (int k = 0; k < n; k++) {
        float *a = v->act + (size_t)k * in->act_dim, *o = v->obs + (size_t)k * in->obs_dim;
        if (!v->live[k]) { /* an ended episode's environment idles on an action in the space */
            for (int i = 0; i < in->act_dim; i++) a[i] = in->actions ? 0 : 0.5f * (dt_env_act_low(in, i) + dt_env_act_high(in, i));
            continue;
        }
        if (v->norm) dt_running_norm_obs(v->norm, o, 0); /* the next step writes obs afresh */
        const float *z, *val;
        dt_status st = dt_policy_forward(v->pol, o, 1, &z, &val);
        if (st) return st;
        double u[MAX_DIM];
        for (int i = 0; i < dt_policy_uniforms(v->pol); i++) u[i] = dt_rng_double(&v->rng[k]);
        dt_policy_draw(v->pol, z, greedy ? NULL : u, a, NULL);
        dt_env_clip_action(in, a);
    }
    return DT_OK;
}

static dt_status play(eval *v, const dt_rl_eval_config *c, dt_env_film *film, double *returns, int *lengths) {
    int n = c->episodes, left = n;
    dt_status st = dt_env_pool_reset(v->pool, v->obs);
    if (!st && film) st = dt_env_film_add(film, dt_env_pool_env(v->pool, 0));
    for (int k = 0; k < n; k++) {
        v->live[k] = 1;
        v->rng[k] = c->seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
    }
    while (!st && left) {
        if ((st = actions(v, n, c->greedy))) break;
        if ((st = dt_env_pool_step(v->pool, v->act, v->obs, v->rew, v->te, v->tr, NULL))) break;
        if (film && v->live[0]) st = dt_env_film_add(film, dt_env_pool_env(v->pool, 0));
        dt_episode ep[64];
        for (int got; !st && (got = dt_env_pool_episodes(v->pool, ep, 64)) > 0;)
            for (int j = 0; j < got; j++) {
                int k = ep[j].env;
                if (!v->live[k]) continue;
                returns[k] = ep[j].ret; /* the pool's sum of the rewards as the environment gave them (doubles) */
                lengths[k] = ep[j].len;
                v->live[k] = 0;
                left--;
            }
    }
    return st;
}

dt_status dt_rl_eval(const dt_rl_eval_config *c, double *returns, int *lengths) {
    eval v = { 0 };
    dt_env_film *film = NULL;
    float mean[MAX_DIM], var[MAX_DIM];
    int has_norm = 0, n = c->episodes;
    dt_status st = dt_env_pool_create(c->env, n, 0, c->seed, c->bridge, &v.pool);
    const dt_env_info *in = st ? NULL : dt_env_pool_info(v.pool);
    if (!st && (in->obs_dim > MAX_DIM || 2 * in->act_dim > MAX_DIM))
        st = dt_error(DT_ERR_UNSUPPORTED, "rl eval: %s's observations of %d or actions of %d", in->id, in->obs_dim, in->act_dim);
    if (!st && c->film && !dt_env_pool_env(v.pool, 0))
        st = dt_error(DT_ERR_UNSUPPORTED, "rl eval --film: %s has no picture in dtrain (a bridged environment)", in->id);
    if (!st && c->film && (st = dt_env_film_create(dt_env_pool_env(v.pool, 0), in->max_steps + 1, &film)))
        st = dt_error(st, "rl eval --film: %s", dt_last_error());
    if (!st) st = dt_policy_create(in->obs_dim, in->actions ? in->actions : in->act_dim, !in->actions, c->hidden, 1, &v.pol);
    if (!st && (st = dt_policy_load(v.pol, c->policy, in->obs_dim, mean, var, &has_norm)))
        st = dt_error(st, "rl eval: %s as a policy for %s with --hidden %d: %s", c->policy, in->id, c->hidden, dt_last_error());
    double m[MAX_DIM], s2[MAX_DIM];
    dt_running_norm norm = { .dim = in ? in->obs_dim : 0, .mean = m, .var = s2 };
    for (int i = 0; has_norm && i < norm.dim; i++) {
        m[i] = mean[i];
        s2[i] = var[i];
    }
    v.norm = has_norm ? &norm : NULL;
    if (!st) {
        v.obs = malloc(sizeof(float) * (size_t)n * in->obs_dim);
        v.act = malloc(sizeof(float) * (size_t)n * in->act_dim);
        v.rew = malloc(sizeof(float) * (size_t)n);
        v.te = malloc((size_t)n);
        v.tr = malloc((size_t)n);
        v.live = malloc((size_t)n);
        v.rng = malloc(sizeof(uint64_t) * (size_t)n);
        if (!v.obs || !v.act || !v.rew || !v.te || !v.tr || !v.live || !v.rng) st = dt_error(DT_ERR_NOMEM, "rl eval: out of memory");
    }
    if (!st) st = play(&v, c, film, returns, lengths);
    if (!st && film) {
        char title[160];
        snprintf(title, sizeof title, "%s, episode 1 (seed %llu): return %.1f in %d steps", in->id, (unsigned long long)c->seed, returns[0],
                 lengths[0]);
        st = dt_env_film_write(film, title, c->film);
    }
    dt_env_film_destroy(film);
    dt_policy_destroy(v.pol);
    dt_env_pool_destroy(v.pool);
    free(v.obs); free(v.act); free(v.rew); free(v.te); free(v.tr); free(v.live); free(v.rng);
    return st;
}
