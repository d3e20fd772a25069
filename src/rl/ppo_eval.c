/* A saved PPO policy played on its environment: dtrain rl eval. */
#include "dtrain/rl.h"
#include "policy.h"
#include "running_norm.h"

#include <stdlib.h>

#define MAX_DIM 64

/* norm: the training's observation statistics, fixed (NULL: none) */
static dt_status episode(dt_env *e, dt_policy *pol, dt_running_norm *norm, int k, uint64_t seed, int greedy, double *ret, int *len) {
    const dt_env_info *in = dt_env_get_info(e);
    float obs[MAX_DIM], a[MAX_DIM];
    dt_env_reset(e, (int64_t)((seed + (uint64_t)k) & INT64_MAX), obs);
    uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
    int te = 0, tr = 0;
    dt_status st = DT_OK;
    *ret = 0;
    *len = 0;
    while (!st && !te && !tr) {
        if (norm) dt_running_norm_obs(norm, obs, 0); /* the next step writes obs afresh */
        const float *z, *val;
        if ((st = dt_policy_forward(pol, obs, 1, &z, &val))) break;
        double u[MAX_DIM];
        for (int i = 0; i < dt_policy_uniforms(pol); i++) u[i] = (double)(dt_rng_next(&s) >> 11) * (1.0 / 9007199254740992.0);
        dt_policy_draw(pol, z, greedy ? NULL : u, a, NULL);
        dt_env_clip_action(in, a);
        double r;
        st = dt_env_step(e, a, obs, &r, &te, &tr);
        *ret += r;
        (*len)++;
    }
    return st;
}

dt_status dt_ppo_eval(const char *path, const char *env, int hidden, int episodes, uint64_t seed, int greedy, double *returns,
                      int *lengths) {
    dt_env *e = NULL;
    dt_policy *pol = NULL;
    float mean[MAX_DIM], var[MAX_DIM];
    int has_norm = 0;
    dt_status st = dt_env_create(env, &e);
    const dt_env_info *in = st ? NULL : dt_env_get_info(e);
    if (!st && (in->obs_dim > MAX_DIM || 2 * in->act_dim > MAX_DIM))
        st = dt_error(DT_ERR_UNSUPPORTED, "rl eval: %s's observations of %d or actions of %d", in->id, in->obs_dim, in->act_dim);
    if (!st) st = dt_policy_create(in->obs_dim, in->actions ? in->actions : in->act_dim, !in->actions, hidden, 1, &pol);
    if (!st && (st = dt_policy_load(pol, path, in->obs_dim, mean, var, &has_norm)))
        st = dt_error(st, "rl eval: %s as a policy for %s with --hidden %d: %s", path, in->id, hidden, dt_last_error());
    double m[MAX_DIM], v[MAX_DIM];
    dt_running_norm norm = { .dim = in ? in->obs_dim : 0, .mean = m, .var = v };
    for (int i = 0; has_norm && i < norm.dim; i++) {
        m[i] = mean[i];
        v[i] = var[i];
    }
    for (int k = 0; !st && k < episodes; k++)
        st = episode(e, pol, has_norm ? &norm : NULL, k, seed, greedy, &returns[k], &lengths[k]);
    dt_policy_destroy(pol);
    dt_env_destroy(e);
    return st;
}
