/* A saved PPO policy played on its environment: dtrain rl eval. */
#include "dtrain/io.h"
#include "dtrain/rl.h"
#include "policy.h"

#include <stdlib.h>

dt_status dt_ppo_eval(const char *path, const char *env, int hidden, int episodes, uint64_t seed, int greedy, double *returns,
                      int *lengths) {
    dt_env *e = NULL;
    dt_policy *pol = NULL;
    dt_safetensors *f = NULL;
    dt_status st = dt_env_create(env, &e);
    const dt_env_info *in = st ? NULL : dt_env_get_info(e);
    if (!st && !in->actions) st = dt_error(DT_ERR_UNSUPPORTED, "rl eval: %s has continuous actions (PPO here is discrete)", in->id);
    if (!st && in->obs_dim > 64) st = dt_error(DT_ERR_UNSUPPORTED, "rl eval: %s's observations of %d", in->id, in->obs_dim);
    if (!st) st = dt_policy_create(in->obs_dim, in->actions, hidden, 1, &pol);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) {
        dt_model m;
        dt_policy_model(pol, &m);
        st = dt_safetensors_read_model(f, &m, 0, NULL);
        if (st) st = dt_error(st, "rl eval: %s as a policy for %s with --hidden %d: %s", path, in->id, hidden, dt_last_error());
    }
    float obs[64];
    for (int k = 0; !st && k < episodes; k++) {
        dt_env_reset(e, (int64_t)((seed + (uint64_t)k) & INT64_MAX), obs);
        uint64_t s = seed * 0x9e3779b97f4a7c15ull + (uint64_t)k;
        int te = 0, tr = 0;
        returns[k] = 0;
        lengths[k] = 0;
        while (!st && !te && !tr) {
            const float *z, *v;
            if ((st = dt_policy_forward(pol, obs, 1, &z, &v))) break;
            int a = 0;
            if (greedy)
                for (int j = 1; j < in->actions; j++) a = z[j] > z[a] ? j : a;
            else a = dt_policy_pick(z, in->actions, (double)(dt_rng_next(&s) >> 11) * (1.0 / 9007199254740992.0), NULL);
            float act = (float)a;
            double r;
            st = dt_env_step(e, &act, obs, &r, &te, &tr);
            returns[k] += r;
            lengths[k]++;
        }
    }
    dt_safetensors_close(f);
    dt_policy_destroy(pol);
    dt_env_destroy(e);
    return st;
}
