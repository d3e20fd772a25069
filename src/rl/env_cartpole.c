/* CartPole-v1: a pole on a cart pushed left or right (Barto, Sutton and
 * Anderson, 1983), as Gymnasium's cartpole.py computes it: Euler steps of
 * 0.02 s in double precision, the observation the state rounded to float. */
#include "env_internal.h"

#include <math.h>

#define GRAVITY 9.8
#define MASSCART 1.0
#define MASSPOLE 0.1
#define LENGTH 0.5 /* half the pole's length */
#define FORCE_MAG 10.0
#define TAU 0.02

static void reset(double *s, uint64_t *rng) {
    for (int i = 0; i < 4; i++) s[i] = dt_env_uniform(rng, -0.05, 0.05);
}

static void step(double *s, const float *a, double *reward, int *terminated) {
    const double total_mass = MASSPOLE + MASSCART, polemass_length = MASSPOLE * LENGTH;
    const double theta_threshold = 12 * 2 * M_PI / 360, x_threshold = 2.4;
    double x = s[0], x_dot = s[1], theta = s[2], theta_dot = s[3];
    double force = a[0] == 1 ? FORCE_MAG : -FORCE_MAG;
    double costheta = cos(theta), sintheta = sin(theta);
    double temp = (force + polemass_length * (theta_dot * theta_dot) * sintheta) / total_mass;
    double thetaacc = (GRAVITY * sintheta - costheta * temp) / (LENGTH * (4.0 / 3.0 - MASSPOLE * (costheta * costheta) / total_mass));
    double xacc = temp - polemass_length * thetaacc * costheta / total_mass;
    s[0] = x + TAU * x_dot;
    s[1] = x_dot + TAU * xacc;
    s[2] = theta + TAU * theta_dot;
    s[3] = theta_dot + TAU * thetaacc;
    *terminated = s[0] < -x_threshold || s[0] > x_threshold || s[2] < -theta_threshold || s[2] > theta_threshold;
    *reward = 1.0;
}

static void observe(const double *s, float *obs) {
    for (int i = 0; i < 4; i++) obs[i] = (float)s[i];
}

const dt_env_kind dt_env_cartpole = {
    .info = { .id = "CartPole-v1", .name = "cartpole", .obs_dim = 4, .actions = 2, .act_dim = 1, .max_steps = 500, .state_dim = 4 },
    .reset = reset, .step = step, .observe = observe,
};
