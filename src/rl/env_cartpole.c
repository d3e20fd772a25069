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

static void reset(void *st, uint64_t *rng) {
    double *s = st;
    for (int i = 0; i < 4; i++) s[i] = dt_env_uniform(rng, -0.05, 0.05);
}

static void step(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    double *s = st;
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

static void observe(const void *st, float *obs) {
    const double *s = st;
    for (int i = 0; i < 4; i++) obs[i] = (float)s[i];
}

/* Gymnasium's picture, in its pixels: the track, the cart, the pole from its axle. */
static void draw(const void *st, dt_env_sketch *sk) {
    const double *s = st, scale = 600 / 4.8, cart_y = 100, pole_len = scale * 2 * LENGTH;
    sk->x0 = 0, sk->y0 = 0, sk->x1 = 600, sk->y1 = 400;
    dt_sketch_box(sk, 0xffffff, 300, 200, 600, 400, 0);
    dt_sketch_shape *track = dt_sketch_add(sk, 0x000000, 1);
    dt_sketch_point(track, 0, cart_y);
    dt_sketch_point(track, 600, cart_y);
    double cx = s[0] * scale + 300;
    dt_sketch_box(sk, 0x000000, cx, cart_y, 50, 30, 0);
    double ax = cx, ay = cart_y + 30 / 4.0;
    dt_sketch_box(sk, 0xca9865, ax + sin(s[2]) * pole_len / 2, ay + cos(s[2]) * pole_len / 2, 10, pole_len, -s[2]);
    dt_sketch_box(sk, 0x8184cb, ax, ay, 10, 10, 0);
}

const dt_env_kind dt_env_cartpole = {
    .info = { .id = "CartPole-v1", .name = "cartpole", .obs_dim = 4, .actions = 2, .act_dim = 1, .max_steps = 500, .state_dim = 4 },
    .reset = reset, .step = step, .observe = observe, .draw = draw, .fps = 50,
};
