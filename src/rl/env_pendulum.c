/* Pendulum-v1: swing a pendulum up and hold it there with a bounded torque,
 * as Gymnasium's pendulum.py computes it. Its torque is a float32, and
 * numpy keeps the terms that mix it with Python numbers in float32 (3.0 *
 * u, 0.001 * u**2): so do these. */
#include "env_internal.h"

#include <math.h>

#define MAX_SPEED 8.0
#define MAX_TORQUE 2.0f
#define DT 0.05
#define G 10.0
#define M 1.0
#define L 1.0

static double clip(double v, double lo, double hi) { return v < lo ? lo : v > hi ? hi : v; }

/* numpy's float remainder: the result takes the divisor's sign */
static double angle_normalize(double x) {
    double b = 2 * M_PI, r = fmod(x + M_PI, b);
    if (r != 0 && (r < 0) != (b < 0)) r += b;
    return r - M_PI;
}

static void reset(void *st, uint64_t *rng) {
    double *s = st;
    s[0] = dt_env_uniform(rng, -M_PI, M_PI);
    s[1] = dt_env_uniform(rng, -1.0, 1.0);
}

static void step(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    double *s = st;
    double th = s[0], thdot = s[1];
    float u = a[0] < -MAX_TORQUE ? -MAX_TORQUE : a[0] > MAX_TORQUE ? MAX_TORQUE : a[0];
    float u_cost = 0.001f * dt_env_powf2(u), u_acc = 3.0f * u; /* float32, as numpy computes them */
    double an = angle_normalize(th);
    double costs = dt_env_pow2(an) + 0.1 * dt_env_pow2(thdot) + (double)u_cost;
    double newthdot = thdot + (3 * G / (2 * L) * sin(th) + (double)u_acc) * DT;
    newthdot = clip(newthdot, -MAX_SPEED, MAX_SPEED);
    s[0] = th + newthdot * DT;
    s[1] = newthdot;
    *reward = -costs;
    *terminated = 0;
}

static void observe(const void *st, float *obs) {
    const double *s = st;
    obs[0] = (float)cos(s[0]);
    obs[1] = (float)sin(s[0]);
    obs[2] = (float)s[1];
}

/* Gymnasium's picture: the rod turned by theta from upright about its pivot. */
static void draw(const void *st, dt_env_sketch *sk) {
    const double *s = st;
    sk->x0 = -2.2f, sk->y0 = -2.2f, sk->x1 = 2.2f, sk->y1 = 2.2f;
    dt_sketch_box(sk, 0xffffff, 0, 0, 4.4, 4.4, 0);
    dt_sketch_box(sk, 0xcc4d4d, -sin(s[0]) / 2, cos(s[0]) / 2, 0.2, 1.0, s[0]);
    dt_sketch_box(sk, 0x000000, 0, 0, 0.1, 0.1, 0);
}

const dt_env_kind dt_env_pendulum = {
    .info = { .id = "Pendulum-v1", .name = "pendulum", .obs_dim = 3, .actions = 0, .act_dim = 1, .act_low = -2.0f, .act_high = 2.0f,
              .max_steps = 200, .state_dim = 2 },
    .reset = reset, .step = step, .observe = observe, .draw = draw, .fps = 30,
};
