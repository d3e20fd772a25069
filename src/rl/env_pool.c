/* A pool of environments stepped as one batch, with Gymnasium's next-step
 * autoreset, keeping each episode's return and length as it ends. */
#include "env_internal.h"

#include <stdlib.h>
#include <string.h>

#define EPISODES_KEPT 4096 /* finished episodes held between dt_env_pool_episodes calls */

struct dt_env_pool {
    dt_env **envs;
    int n, first;
    uint64_t seed;
    uint8_t *ended;     /* the environment's episode ended at the last step */
    double *ret;        /* the running episode's return */
    int *len;
    int64_t steps;      /* since the reset */
    dt_episode done[EPISODES_KEPT];
    int ndone;
};

dt_status dt_env_pool_create(const char *name, int n, int first, uint64_t seed, dt_env_pool **out) {
    *out = NULL;
    if (n < 1 || first < 0) return dt_error(DT_ERR_ARG, "env pool: %d environments from number %d", n, first);
    dt_env_pool *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "env pool: out of memory");
    p->n = n;
    p->first = first;
    p->seed = seed;
    p->envs = calloc((size_t)n, sizeof *p->envs);
    p->ended = calloc((size_t)n, 1);
    p->ret = calloc((size_t)n, sizeof *p->ret);
    p->len = calloc((size_t)n, sizeof *p->len);
    dt_status st = p->envs && p->ended && p->ret && p->len ? DT_OK : dt_error(DT_ERR_NOMEM, "env pool: out of memory");
    for (int i = 0; !st && i < n; i++) st = dt_env_create(name, &p->envs[i]);
    if (st) { dt_env_pool_destroy(p); return st; }
    *out = p;
    return DT_OK;
}

void dt_env_pool_destroy(dt_env_pool *p) {
    if (!p) return;
    for (int i = 0; p->envs && i < p->n; i++) dt_env_destroy(p->envs[i]);
    free(p->envs);
    free(p->ended);
    free(p->ret);
    free(p->len);
    free(p);
}

const dt_env_info *dt_env_pool_info(const dt_env_pool *p) { return dt_env_get_info(p->envs[0]); }
int dt_env_pool_size(const dt_env_pool *p) { return p->n; }

void dt_env_pool_reset(dt_env_pool *p, float *obs) {
    int od = dt_env_pool_info(p)->obs_dim;
    for (int i = 0; i < p->n; i++) {
        dt_env_reset(p->envs[i], (int64_t)((p->seed + (uint64_t)(p->first + i)) & INT64_MAX), obs + (size_t)i * od);
        p->ended[i] = 0;
        p->ret[i] = 0;
        p->len[i] = 0;
    }
    p->steps = 0;
    p->ndone = 0;
}

static void episode_done(dt_env_pool *p, int i) {
    if (p->ndone == EPISODES_KEPT) { /* nobody asked: keep the newest */
        memmove(p->done, p->done + 1, sizeof p->done[0] * (EPISODES_KEPT - 1));
        p->ndone--;
    }
    p->done[p->ndone++] = (dt_episode){ .ret = p->ret[i], .len = p->len[i], .env = p->first + i, .step = p->steps };
    p->ret[i] = 0;
    p->len[i] = 0;
}

dt_status dt_env_pool_step(dt_env_pool *p, const float *actions, float *obs, float *rewards, uint8_t *terminated,
                           uint8_t *truncated, uint8_t *reset) {
    const dt_env_info *in = dt_env_pool_info(p);
    for (int i = 0; i < p->n; i++) { /* every action checked first: a refused batch steps no environment */
        dt_status st = p->ended[i] ? DT_OK : dt_env_check_action(in, actions + (size_t)i * in->act_dim);
        if (st) return dt_error(st, "environment %d of the pool: %s", p->first + i, dt_last_error());
    }
    for (int i = 0; i < p->n; i++) {
        float *o = obs + (size_t)i * in->obs_dim;
        if (reset) reset[i] = p->ended[i];
        if (p->ended[i]) { /* next-step autoreset: this step's action is not taken */
            dt_env_reset(p->envs[i], -1, o);
            p->ended[i] = 0;
            rewards[i] = 0;
            terminated[i] = truncated[i] = 0;
            continue;
        }
        double r;
        int te, tr;
        dt_status st = dt_env_step(p->envs[i], actions + (size_t)i * in->act_dim, o, &r, &te, &tr);
        if (st) return dt_error(st, "environment %d of the pool: %s", p->first + i, dt_last_error());
        rewards[i] = (float)r;
        terminated[i] = (uint8_t)te;
        truncated[i] = (uint8_t)tr;
        p->ret[i] += r;
        p->len[i]++;
        p->ended[i] = te || tr;
        if (p->ended[i]) episode_done(p, i);
    }
    p->steps++;
    return DT_OK;
}

int dt_env_pool_episodes(dt_env_pool *p, dt_episode *out, int cap) {
    int n = p->ndone < cap ? p->ndone : cap;
    memcpy(out, p->done, sizeof p->done[0] * (size_t)n);
    memmove(p->done, p->done + n, sizeof p->done[0] * (size_t)(p->ndone - n));
    p->ndone -= n;
    return n;
}
