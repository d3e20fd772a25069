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

static void reset(void *st, uint64_t *rng) {
    double *s = st;
    s[0] = dt_env_uniform(rng, -0.6, -0.4);
    s[1] = 0;
}

static void step(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    double *s = st;
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

static void observe(const void *st, float *obs) {
    const double *s = st;
    obs[0] = (float)s[0];
    obs[1] = (float)s[1];
}

static double hill(double x) { return sin(3 * x) * 0.45 + 0.55; }

/* Gymnasium's picture: the valley, the car on it, the flag at the goal. */
static void draw(const void *st, dt_env_sketch *sk) {
    const double *s = st, px = (MAX_POSITION - MIN_POSITION) / 600; /* a pixel of Gymnasium's 600 */
    sk->x0 = (float)MIN_POSITION, sk->y0 = 0, sk->x1 = (float)MAX_POSITION, sk->y1 = (float)(400 * px);
    dt_sketch_box(sk, 0xffffff, (MIN_POSITION + MAX_POSITION) / 2, 200 * px, 600 * px, 400 * px, 0);
    dt_sketch_shape *curve = dt_sketch_add(sk, 0x000000, (float)(2 * px));
    for (int i = 0; i < DT_SKETCH_POINTS; i++) {
        double x = MIN_POSITION + (MAX_POSITION - MIN_POSITION) * i / (DT_SKETCH_POINTS - 1);
        dt_sketch_point(curve, x, hill(x));
    }
    double top = hill(GOAL_POSITION) + 50 * px;
    dt_sketch_shape *pole = dt_sketch_add(sk, 0x000000, (float)(2 * px));
    dt_sketch_point(pole, GOAL_POSITION, hill(GOAL_POSITION));
    dt_sketch_point(pole, GOAL_POSITION, top);
    dt_sketch_shape *flag = dt_sketch_add(sk, 0xcccc00, 0);
    dt_sketch_point(flag, GOAL_POSITION, top);
    dt_sketch_point(flag, GOAL_POSITION, top - 10 * px);
    dt_sketch_point(flag, GOAL_POSITION + 25 * px, top - 5 * px);
    double a = cos(3 * s[0]); /* Gymnasium turns the car by this */
    dt_sketch_box(sk, 0x000000, s[0] - sin(a) * 20 * px, hill(s[0]) + cos(a) * 20 * px, 40 * px, 20 * px, a);
}

const dt_env_kind dt_env_mountain_car = {
    .info = { .id = "MountainCar-v0", .name = "mountaincar", .obs_dim = 2, .actions = 3, .act_dim = 1, .max_steps = 200, .state_dim = 2 },
    .reset = reset, .step = step, .observe = observe, .draw = draw, .fps = 30,
};
