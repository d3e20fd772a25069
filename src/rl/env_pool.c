/* A pool of environments stepped as one batch, with Gymnasium's next-step
 * autoreset, keeping each episode's return and length as it ends. Its
 * environments are the built-in kind's, or Gymnasium's through the bridge
 * (gym_bridge.c): a round is the same either way. */
#include "env_internal.h"
#include "gym_bridge.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct dt_env_pool {
    dt_env **envs;          /* the built-in kind's environments, or NULL */
    dt_gym_bridge *bridge;  /* a bridged pool's workers (envs NULL) */
    int n, first;
    uint64_t seed;
    int8_t *cmd;            /* a round's: each environment's DT_BRIDGE_* */
    int64_t *seeds;
    double *rew;
    uint8_t *te, *tr;       /* a reset round's flags (thrown away) */
    uint8_t *bad;           /* a step's environments whose observation or reward was not finite */
    uint8_t *ended;     /* the environment's episode ended at the last step */
    double *ret;        /* the running episode's return */
    int *len;
    int64_t steps;      /* since the reset */
    int64_t dropped;    /* episodes dropped for a non-finite observation or reward */
    dt_episode_list done;
};

dt_status dt_env_pool_create(const char *name, int n, int first, uint64_t seed, const dt_env_bridge_config *bridge,
                             dt_env_pool **out) {
    *out = NULL;
    if (n < 1 || first < 0) return dt_error(DT_ERR_ARG, "env pool: %d environments from number %d", n, first);
    dt_env_pool *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "env pool: out of memory");
    p->n = n;
    p->first = first;
    p->seed = seed;
    p->ended = calloc((size_t)n, 1);
    p->ret = calloc((size_t)n, sizeof *p->ret);
    p->len = calloc((size_t)n, sizeof *p->len);
    p->cmd = calloc((size_t)n, sizeof *p->cmd);
    p->seeds = calloc((size_t)n, sizeof *p->seeds);
    p->rew = calloc((size_t)n, sizeof *p->rew);
    p->te = calloc((size_t)n, 1);
    p->tr = calloc((size_t)n, 1);
    p->bad = calloc((size_t)n, 1);
    dt_status st = p->ended && p->ret && p->len && p->cmd && p->seeds && p->rew && p->te && p->tr && p->bad ? DT_OK
                                                                                                  : dt_error(DT_ERR_NOMEM, "env pool: out of memory");
    if (!st && dt_env_bridged(name)) st = dt_gym_bridge_create(dt_env_bridged(name), n, bridge, &p->bridge);
    else if (!st && !(p->envs = calloc((size_t)n, sizeof *p->envs))) st = dt_error(DT_ERR_NOMEM, "env pool: out of memory");
    for (int i = 0; !st && p->envs && i < n; i++) st = dt_env_create(name, &p->envs[i]);
    if (st) { dt_env_pool_destroy(p); return st; }
    *out = p;
    return DT_OK;
}

void dt_env_pool_destroy(dt_env_pool *p) {
    if (!p) return;
    for (int i = 0; p->envs && i < p->n; i++) dt_env_destroy(p->envs[i]);
    free(p->envs);
    dt_gym_bridge_destroy(p->bridge);
    free(p->ended);
    free(p->ret);
    free(p->len);
    free(p->cmd);
    free(p->seeds);
    free(p->rew);
    free(p->te);
    free(p->tr);
    free(p->bad);
    free(p);
}

const dt_env_info *dt_env_pool_info(const dt_env_pool *p) { return p->bridge ? dt_gym_bridge_info(p->bridge) : dt_env_get_info(p->envs[0]); }
int dt_env_pool_size(const dt_env_pool *p) { return p->n; }
dt_env *dt_env_pool_env(dt_env_pool *p, int i) { return p->envs && i >= 0 && i < p->n ? p->envs[i] : NULL; }

/* One round: each environment does its cmd (a reset, seeded or not, or a step with its action, or nothing); a
 * reset's reward and flags are 0. */
static dt_status round_of(dt_env_pool *p, const float *actions, float *obs, uint8_t *te, uint8_t *tr) {
    if (p->bridge) return dt_gym_bridge_round(p->bridge, p->cmd, p->seeds, actions, obs, p->rew, te, tr);
    const dt_env_info *in = dt_env_pool_info(p);
    for (int i = 0; i < p->n; i++) {
        float *o = obs + (size_t)i * in->obs_dim;
        int a = 0, b = 0;
        if (p->cmd[i] == DT_ROUND_IDLE) continue;
        if (p->cmd[i] == DT_ROUND_STEP) {
            dt_status st = dt_env_step(p->envs[i], actions + (size_t)i * in->act_dim, o, &p->rew[i], &a, &b);
            if (st) return dt_error(st, "environment %d of the pool: %s", p->first + i, dt_last_error());
        } else {
            dt_env_reset(p->envs[i], p->cmd[i] == DT_ROUND_RESET_SEEDED ? p->seeds[i] : -1, o);
            p->rew[i] = 0;
        }
        te[i] = (uint8_t)a;
        tr[i] = (uint8_t)b;
    }
    return DT_OK;
}

dt_status dt_env_pool_reset(dt_env_pool *p, float *obs) {
    for (int i = 0; i < p->n; i++) {
        p->cmd[i] = DT_ROUND_RESET_SEEDED;
        p->seeds[i] = (int64_t)((p->seed + (uint64_t)(p->first + i)) & INT64_MAX);
        p->ended[i] = 0;
        p->ret[i] = 0;
        p->len[i] = 0;
    }
    p->steps = 0;
    p->done.n = 0;
    return round_of(p, NULL, obs, p->te, p->tr);
}

void dt_episode_list_add(dt_episode_list *l, dt_episode e) {
    if (l->n == DT_EPISODES_KEPT) { /* nobody asked: keep the newest */
        memmove(l->e, l->e + 1, sizeof l->e[0] * (DT_EPISODES_KEPT - 1));
        l->n--;
    }
    l->e[l->n++] = e;
}

int dt_episode_list_take(dt_episode_list *l, dt_episode *out, int cap) {
    int n = l->n < cap ? l->n : cap;
    memcpy(out, l->e, sizeof l->e[0] * (size_t)n);
    memmove(l->e, l->e + n, sizeof l->e[0] * (size_t)(l->n - n));
    l->n -= n;
    return n;
}

static void episode_done(dt_env_pool *p, int i) {
    dt_episode_list_add(&p->done, (dt_episode){ .ret = p->ret[i], .len = p->len[i], .env = p->first + i, .step = p->steps });
    p->ret[i] = 0;
    p->len[i] = 0;
}

static bool finite_row(const float *x, int n, double r) {
    for (int i = 0; i < n; i++)
        if (!isfinite(x[i])) return false;
    return isfinite(r);
}

/* Environments whose step gave a non-finite observation or reward (bad[i]): said, their episodes dropped (not
 * counted) and reset now, so that the step reads as a reset (not a transition) and the run goes on. */
static dt_status drop(dt_env_pool *p, const uint8_t *bad, float *obs, float *rewards, uint8_t *terminated, uint8_t *truncated,
                      uint8_t *reset) {
    for (int i = 0; i < p->n; i++) {
        p->cmd[i] = bad[i] ? DT_ROUND_RESET : DT_ROUND_IDLE;
        if (!bad[i]) continue;
        dt_log(DT_LOG_WARN, "%s: environment %d gave a non-finite observation or reward at step %d of its episode: the episode is "
               "dropped, the environment reset", dt_env_pool_info(p)->id, p->first + i, p->len[i] + 1);
        p->dropped++;
        p->ret[i] = 0;
        p->len[i] = 0;
    }
    dt_status st = round_of(p, NULL, obs, p->te, p->tr);
    for (int i = 0; i < p->n && !st; i++) {
        if (!bad[i]) continue;
        rewards[i] = 0;
        terminated[i] = truncated[i] = 0;
        if (reset) reset[i] = 1;
    }
    return st;
}

dt_status dt_env_pool_step(dt_env_pool *p, const float *actions, float *obs, float *rewards, uint8_t *terminated,
                           uint8_t *truncated, uint8_t *reset) {
    const dt_env_info *in = dt_env_pool_info(p);
    for (int i = 0; i < p->n; i++) { /* every action checked first: a refused batch steps no environment */
        dt_status st = p->ended[i] ? DT_OK : dt_env_check_action(in, actions + (size_t)i * in->act_dim);
        if (st) return dt_error(st, "environment %d of the pool: %s", p->first + i, dt_last_error());
        p->cmd[i] = p->ended[i] ? DT_ROUND_RESET : DT_ROUND_STEP; /* next-step autoreset: this step's action is not taken */
    }
    dt_status st = round_of(p, actions, obs, terminated, truncated);
    if (st) return st;
    uint8_t *bad = p->bad;
    int nbad = 0;
    for (int i = 0; i < p->n; i++) {
        bad[i] = 0;
        if (reset) reset[i] = p->cmd[i] == DT_ROUND_RESET;
        if (p->cmd[i] == DT_ROUND_RESET) {
            p->ended[i] = 0;
            rewards[i] = 0;
            terminated[i] = truncated[i] = 0;
            continue;
        }
        if (!finite_row(obs + (size_t)i * in->obs_dim, in->obs_dim, p->rew[i])) { bad[i] = 1, nbad++; continue; }
        rewards[i] = (float)p->rew[i];
        p->ret[i] += p->rew[i];
        p->len[i]++;
        p->ended[i] = terminated[i] || truncated[i];
        if (p->ended[i]) episode_done(p, i);
    }
    p->steps++;
    return nbad ? drop(p, bad, obs, rewards, terminated, truncated, reset) : DT_OK;
}

int dt_env_pool_episodes(dt_env_pool *p, dt_episode *out, int cap) { return dt_episode_list_take(&p->done, out, cap); }

dt_status dt_env_pool_record(const dt_env_pool *p, int i, double *rec) {
    if (!p->envs) return dt_error(DT_ERR_UNSUPPORTED, "a bridged environment's state lives in its Python process: a checkpoint cannot hold it");
    dt_status st = dt_env_record(p->envs[i], rec);
    rec[DT_ENV_RECORD] = p->ended[i], rec[DT_ENV_RECORD + 1] = p->ret[i], rec[DT_ENV_RECORD + 2] = p->len[i];
    return st;
}

dt_status dt_env_running_episode(const double *rec, const dt_env *e, int number, bool *ended, double *ret, int *len) {
    double x = rec[DT_ENV_RECORD], n = rec[DT_ENV_RECORD + 2];
    if ((x != 0 && x != 1) || !(n >= 0 && n <= 1e9 && n == (int)n) || !isfinite(rec[DT_ENV_RECORD + 1]))
        return dt_error(DT_ERR_IO, "environment %d: a saved episode with flag %g, return %g, length %g", number, x, rec[DT_ENV_RECORD + 1], n);
    *ended = x != 0, *ret = rec[DT_ENV_RECORD + 1], *len = (int)n;
    if (dt_env_restarts(e)) *ended = true, *ret = 0, *len = 0; /* the interrupted episode uncounted */
    return DT_OK;
}

dt_status dt_env_pool_restore(dt_env_pool *p, int i, const double *rec) {
    if (!p->envs) return dt_error(DT_ERR_UNSUPPORTED, "a bridged environment's state lives in its Python process: a checkpoint cannot hold it");
    bool ended;
    dt_status st = dt_env_running_episode(rec, p->envs[i], p->first + i, &ended, &p->ret[i], &p->len[i]);
    if (st) return st;
    p->ended[i] = ended;
    return dt_env_restore(p->envs[i], rec);
}

const char *dt_env_pool_unsaveable(const dt_env_pool *p) { return p->envs ? NULL : "a bridged environment's state lives in its Python process"; }

bool dt_env_pool_restarts(const dt_env_pool *p) { return p->envs && dt_env_restarts(p->envs[0]); }

int64_t dt_env_pool_steps(const dt_env_pool *p) { return p->steps; }
void dt_env_pool_set_steps(dt_env_pool *p, int64_t steps) { p->steps = steps; }
