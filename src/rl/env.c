/* One environment: the registry of kinds, and what Gymnasium's wrappers add
 * around a kind's dynamics (the time limit, the seeded stream, the checks
 * that an action is in the space and that a finished episode was reset). */
#include "env_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct dt_env {
    const dt_env_kind *k;
    double s[DT_ENV_STATE_MAX];
    void *st;   /* the kind's world, or s */
    uint64_t rng;
    int t;      /* steps into the episode */
    int ended;  /* the episode ended (terminated or truncated) and wants a reset */
    int begun;  /* reset at least once */
};

static const dt_env_kind *const kinds[] = { &dt_env_cartpole, &dt_env_acrobot, &dt_env_mountain_car, &dt_env_pendulum,
                                            &dt_env_lunar_lander, &dt_env_lunar_lander_continuous };
#define NKINDS ((int)(sizeof kinds / sizeof kinds[0]))

const char *dt_env_list(void) {
    return "cartpole (CartPole-v1), acrobot (Acrobot-v1), mountaincar (MountainCar-v0), pendulum (Pendulum-v1), lunarlander "
           "(LunarLander-v3), lunarlander-continuous (LunarLanderContinuous-v3)";
}

double dt_env_uniform(uint64_t *rng, double low, double high) {
    return low + (high - low) * dt_rng_double(rng);
}

double dt_env_pow2(double x) {
    volatile double two = 2;
    return pow(x, two);
}

float dt_env_powf2(float x) {
    volatile float two = 2;
    return powf(x, two);
}

static const dt_env_kind *find(const char *name) {
    for (int i = 0; name && i < NKINDS; i++)
        if (!strcasecmp(name, kinds[i]->info.name) || !strcmp(name, kinds[i]->info.id)) return kinds[i];
    return NULL;
}

const char *dt_env_bridged(const char *name) { return name && !strncmp(name, "gym:", 4) ? name + 4 : NULL; }

const char *dt_env_id(const char *name) {
    if (dt_env_bridged(name)) return name;
    const dt_env_kind *k = find(name);
    return k ? k->info.id : NULL;
}

dt_status dt_env_create(const char *name, dt_env **out) {
    *out = NULL;
    const dt_env_kind *k = find(name);
    if (!k) return dt_error(DT_ERR_ARG, "environment '%s' is not one dtrain has: %s", name ? name : "(none)", dt_env_list());
    dt_env *e = calloc(1, sizeof *e);
    if (!e) return dt_error(DT_ERR_NOMEM, "environment %s: out of memory", k->info.id);
    e->k = k;
    e->st = e->s;
    dt_status st = k->create ? k->create(&e->st) : DT_OK;
    if (st) { free(e); return st; }
    *out = e;
    return DT_OK;
}

void dt_env_destroy(dt_env *e) {
    if (e && e->k->destroy) e->k->destroy(e->st);
    free(e);
}

const dt_env_info *dt_env_get_info(const dt_env *e) { return &e->k->info; }
const dt_env_kind *dt_env_kind_of(const dt_env *e) { return e->k; }
const void *dt_env_state(const dt_env *e) { return e->begun ? e->st : NULL; }

void dt_env_reset(dt_env *e, int64_t seed, float *obs) {
    if (seed >= 0) e->rng = (uint64_t)seed * 0x9e3779b97f4a7c15ull ^ 0x5d1ce0f5eed5ull; /* a seed's stream, not seed itself */
    e->k->reset(e->st, &e->rng);
    e->t = 0;
    e->ended = 0;
    e->begun = 1;
    e->k->observe(e->st, obs);
}

dt_status dt_env_set_state(dt_env *e, const double *state, float *obs) {
    if (!e->k->info.state_dim) return dt_error(DT_ERR_ARG, "%s: its state is a physics world, not numbers to set", e->k->info.id);
    for (int i = 0; i < e->k->info.state_dim; i++)
        if (!isfinite(state[i])) return dt_error(DT_ERR_ARG, "%s: state component %d is not finite", e->k->info.id, i);
    memcpy(e->s, state, sizeof(double) * (size_t)e->k->info.state_dim);
    e->t = 0;
    e->ended = 0;
    e->begun = 1;
    e->k->observe(e->st, obs);
    return DT_OK;
}

bool dt_env_restarts(const dt_env *e) { return e->k->create != NULL; }

dt_status dt_env_record(const dt_env *e, double *rec) {
    if (dt_env_restarts(e)) memset(rec, 0, sizeof e->s); /* a physics world: not held (its episode restarts on resume) */
    else memcpy(rec, e->s, sizeof e->s);
    memcpy(&rec[DT_ENV_STATE_MAX], &e->rng, sizeof e->rng); /* the stream's bits in a double's place */
    rec[DT_ENV_STATE_MAX + 1] = e->t, rec[DT_ENV_STATE_MAX + 2] = e->ended, rec[DT_ENV_STATE_MAX + 3] = e->begun;
    return DT_OK;
}

dt_status dt_env_restore(dt_env *e, const double *rec) {
    double t = rec[DT_ENV_STATE_MAX + 1], ended = rec[DT_ENV_STATE_MAX + 2], begun = rec[DT_ENV_STATE_MAX + 3];
    if (!(t >= 0 && t <= 1e9 && t == (int)t) || (ended != 0 && ended != 1) || (begun != 0 && begun != 1))
        return dt_error(DT_ERR_IO, "%s: a saved state with step %g and flags %g, %g", e->k->info.id, t, ended, begun);
    for (int i = 0; i < e->k->info.state_dim; i++)
        if (!isfinite(rec[i])) return dt_error(DT_ERR_IO, "%s: saved state component %d is not finite", e->k->info.id, i);
    if (!dt_env_restarts(e)) memcpy(e->s, rec, sizeof e->s);
    memcpy(&e->rng, &rec[DT_ENV_STATE_MAX], sizeof e->rng);
    e->t = (int)t, e->ended = (int)ended, e->begun = (int)begun;
    if (dt_env_restarts(e)) e->ended = e->begun = 1; /* the world is gone: its next step is a reset, from the saved stream */
    return DT_OK;
}

float dt_env_act_low(const dt_env_info *in, int i) { return in->low ? in->low[i] : in->act_low; }
float dt_env_act_high(const dt_env_info *in, int i) { return in->high ? in->high[i] : in->act_high; }

void dt_env_clip_action(const dt_env_info *in, float *a) {
    for (int i = 0; !in->actions && i < in->act_dim; i++) {
        float lo = dt_env_act_low(in, i), hi = dt_env_act_high(in, i);
        a[i] = a[i] < lo ? lo : a[i] > hi ? hi : a[i];
    }
}

dt_status dt_env_check_action(const dt_env_info *in, const float *a) {
    if (in->actions) {
        float v = a[0];
        if (!(v >= 0 && v < (float)in->actions) || v != floorf(v))
            return dt_error(DT_ERR_ARG, "%s: action %g is not in its space Discrete(%d) (0..%d)", in->id, (double)v, in->actions,
                            in->actions - 1);
        return DT_OK;
    }
    for (int i = 0; i < in->act_dim; i++)
        if (!(a[i] >= dt_env_act_low(in, i) && a[i] <= dt_env_act_high(in, i)))
            return dt_error(DT_ERR_ARG, "%s: action component %d is %g, outside its space Box(%g, %g)", in->id, i, (double)a[i],
                            (double)dt_env_act_low(in, i), (double)dt_env_act_high(in, i));
    return DT_OK;
}

dt_status dt_env_step(dt_env *e, const float *action, float *obs, double *reward, int *terminated, int *truncated) {
    const dt_env_info *in = &e->k->info;
    if (!e->begun || e->ended)
        return dt_error(DT_ERR_ARG, "%s: step %s: reset it first", in->id, e->begun ? "after the episode ended" : "before any reset");
    dt_status st = dt_env_check_action(in, action);
    if (st) return st;
    int term = 0;
    e->k->step(e->st, &e->rng, action, reward, &term);
    e->t++;
    *terminated = term;
    *truncated = e->t >= in->max_steps; /* TimeLimit's, set whether or not the task ended too */
    e->ended = *terminated || *truncated;
    e->k->observe(e->st, obs);
    return DT_OK;
}
