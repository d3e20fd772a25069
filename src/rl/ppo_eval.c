/* A saved PPO policy played on its environment: dtrain rl eval. */
#include "dtrain/rl.h"
#include "policy.h"
#include "running_norm.h"

#include <stdio.h>
#include <stdlib.h>

#define MAX_DIM 64

/* norm: the training's observation statistics, fixed (NULL: none); film (NULL: none) takes each state */
static dt_status episode(dt_env *e, dt_policy *pol, dt_running_norm *norm, int k, uint64_t seed, int greedy, dt_env_film *film,
                         double *ret, int *len) {
    const dt_env_info *in = dt_env_get_info(e);
    float obs[MAX_DIM], a[MAX_DIM];
    dt_env_reset(e, (int64_t)((seed + (uint64_t)k) & INT64_MAX), obs);
    dt_status st = film ? dt_env_film_add(film, e) : DT_OK;
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
    int te = 0, tr = 0;
    *ret = 0;
    *len = 0;
    while (!st && !te && !tr) {
        if (norm) dt_running_norm_obs(norm, obs, 0); /* the next step writes obs afresh */
        const float *z, *val;
        if ((st = dt_policy_forward(pol, obs, 1, &z, &val))) break;
        double u[MAX_DIM];
        for (int i = 0; i < dt_policy_uniforms(pol); i++) u[i] = dt_rng_double(&s);
        dt_policy_draw(pol, z, greedy ? NULL : u, a, NULL);
        dt_env_clip_action(in, a);
        double r;
        st = dt_env_step(e, a, obs, &r, &te, &tr);
        if (film && !st) st = dt_env_film_add(film, e);
        *ret += r;
        (*len)++;
    }
    return st;
}

dt_status dt_ppo_eval(const dt_ppo_eval_config *c, double *returns, int *lengths) {
    dt_env *e = NULL;
    dt_policy *pol = NULL;
    dt_env_film *film = NULL;
    float mean[MAX_DIM], var[MAX_DIM];
    int has_norm = 0;
    dt_status st = dt_env_create(c->env, &e);
    const dt_env_info *in = st ? NULL : dt_env_get_info(e);
    if (!st && (in->obs_dim > MAX_DIM || 2 * in->act_dim > MAX_DIM))
        st = dt_error(DT_ERR_UNSUPPORTED, "rl eval: %s's observations of %d or actions of %d", in->id, in->obs_dim, in->act_dim);
    if (!st && c->film && (st = dt_env_film_create(e, in->max_steps + 1, &film))) st = dt_error(st, "rl eval --film: %s", dt_last_error());
    if (!st) st = dt_policy_create(in->obs_dim, in->actions ? in->actions : in->act_dim, !in->actions, c->hidden, 1, &pol);
    if (!st && (st = dt_policy_load(pol, c->policy, in->obs_dim, mean, var, &has_norm)))
        st = dt_error(st, "rl eval: %s as a policy for %s with --hidden %d: %s", c->policy, in->id, c->hidden, dt_last_error());
    double m[MAX_DIM], v[MAX_DIM];
    dt_running_norm norm = { .dim = in ? in->obs_dim : 0, .mean = m, .var = v };
    for (int i = 0; has_norm && i < norm.dim; i++) {
        m[i] = mean[i];
        v[i] = var[i];
    }
    for (int k = 0; !st && k < c->episodes; k++)
        st = episode(e, pol, has_norm ? &norm : NULL, k, c->seed, c->greedy, k ? NULL : film, &returns[k], &lengths[k]);
    if (!st && film) {
        char title[160];
        snprintf(title, sizeof title, "%s, episode 1 (seed %llu): return %.1f in %d steps", in->id, (unsigned long long)c->seed, returns[0],
                 lengths[0]);
        st = dt_env_film_write(film, title, c->film);
    }
    dt_env_film_destroy(film);
    dt_policy_destroy(pol);
    dt_env_destroy(e);
    return st;
}
