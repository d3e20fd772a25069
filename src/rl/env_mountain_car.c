/* MountainCar-v0: an underpowered car that must rock itself up a hill
 * (Moore, 1990), as Gymnasium's mountain_car.py computes it. */
#include "env_internal.h"

#include <math.h>

#define MIN_POSITION -1.2
#define MAX_POSITION 0.6
#define MAX_SPEED 0.07
#define GOAL_POSITION 0.5
#define FORCE 0.001
#define GRAVITY 0.0025

static double clip(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

static void reset(double *s, uint64_t *rng) {
    s[0] = dt_env_uniform(rng, -0.6, -0.4);
    s[1] = 0;
}

static void step(double *s, const float *a, double *reward, int *terminated) {
    double position = s[0], velocity = s[1];
    velocity += ((int)a[0] - 1) * FORCE + cos(3 * position) * (-GRAVITY);
    velocity = clip(velocity, -MAX_SPEED, MAX_SPEED);
    position += velocity;
    position = clip(position, MIN_POSITION, MAX_POSITION);
    if (position == MIN_POSITION && velocity < 0) velocity = 0;
    *terminated = position >= GOAL_POSITION && velocity >= 0;
    *reward = -1.0;
    s[0] = position;
    s[1] = velocity;
}

static void observe(const double *s, float *obs) {
    obs[0] = (float)s[0];
    obs[1] = (float)s[1];
}

const dt_env_kind dt_env_mountain_car = {
    .info = { .id = "MountainCar-v0", .name = "mountaincar", .obs_dim = 2, .actions = 3, .act_dim = 1, .max_steps = 200, .state_dim = 2 },
    .reset = reset, .step = step, .observe = observe,
};
