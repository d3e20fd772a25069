/* What an environment kind gives env.c: its spaces and limits, and its
 * dynamics over a state of doubles (Gymnasium's env.unwrapped.state). */
#ifndef DTRAIN_RL_ENV_INTERNAL_H
#define DTRAIN_RL_ENV_INTERNAL_H

#include "dtrain/rl.h"

#define DT_ENV_STATE_MAX 8

typedef struct {
    dt_env_info info;
    /* a new episode's state, from the environment's stream (dt_env_uniform) */
    void (*reset)(double *s, uint64_t *rng);
    /* one step of the dynamics; *terminated: the task ended */
    void (*step)(double *s, const float *action, double *reward, int *terminated);
    void (*observe)(const double *s, float *obs);
} dt_env_kind;

extern const dt_env_kind dt_env_cartpole, dt_env_acrobot, dt_env_mountain_car, dt_env_pendulum;

/* DT_OK when action (in->act_dim floats) is in the space, else an error naming it. */
dt_status dt_env_check_action(const dt_env_info *in, const float *action);
/* Uniform in [low, high) as numpy's Generator.uniform computes it, from a double's 53 random bits. */
double dt_env_uniform(uint64_t *rng, double low, double high);

/* x**2 of a numpy scalar: libm's pow(x, 2), which can differ from x * x in the last bit (glibc's pow is within
 * 0.52 ulp, not correctly rounded); a constant exponent would let the compiler fold it into x * x. */
double dt_env_pow2(double x);
float dt_env_powf2(float x);

#endif
