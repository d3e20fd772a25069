/* Acrobot-v1: two links hanging from a pivot, a torque on the joint between
 * them, the task to swing the tip above a line (Sutton, 1996; the book's
 * dynamics), as Gymnasium's acrobot.py computes it: one fourth-order
 * Runge-Kutta step of 0.2 s, each sum and product in its order. */
#include "env_internal.h"

#include <math.h>

#define M1 1.0
#define M2 1.0
#define L1 1.0
#define LC1 0.5
#define LC2 0.5
#define I1 1.0
#define I2 1.0
#define G 9.8
#define MAX_VEL_1 (4 * M_PI)
#define MAX_VEL_2 (9 * M_PI)
#define DT 0.2

static void reset(void *st, uint64_t *rng) {
    double *s = st;
    for (int i = 0; i < 4; i++) s[i] = (float)dt_env_uniform(rng, -0.1, 0.1); /* Gymnasium keeps it as float32 */
}

/* _dsdt: the state's derivative under torque a */
static void dsdt(const double *s, double a, double *d) {
    double theta1 = s[0], theta2 = s[1], dtheta1 = s[2], dtheta2 = s[3];
    double d1 = M1 * (LC1 * LC1) + M2 * (L1 * L1 + LC2 * LC2 + 2 * L1 * LC2 * cos(theta2)) + I1 + I2;
    double d2 = M2 * (LC2 * LC2 + L1 * LC2 * cos(theta2)) + I2;
    double phi2 = M2 * LC2 * G * cos(theta1 + theta2 - M_PI / 2.0);
    double phi1 = -M2 * L1 * LC2 * dt_env_pow2(dtheta2) * sin(theta2) - 2 * M2 * L1 * LC2 * dtheta2 * dtheta1 * sin(theta2) +
                  (M1 * LC1 + M2 * L1) * G * cos(theta1 - M_PI / 2) + phi2;
    double ddtheta2 = (a + d2 / d1 * phi1 - M2 * L1 * LC2 * dt_env_pow2(dtheta1) * sin(theta2) - phi2) /
                      (M2 * (LC2 * LC2) + I2 - dt_env_pow2(d2) / d1);
    double ddtheta1 = -(d2 * ddtheta2 + phi1) / d1;
    d[0] = dtheta1;
    d[1] = dtheta2;
    d[2] = ddtheta1;
    d[3] = ddtheta2;
}

static double wrap(double x, double m, double M) {
    double diff = M - m;
    while (x > M) x = x - diff;
    while (x < m) x = x + diff;
    return x;
}

static double bound(double x, double m, double M) { return fmin(fmax(x, m), M); }

static void step(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    double *s = st;
    static const double torques[3] = { -1.0, 0.0, 1.0 };
    double torque = torques[(int)a[0]], k1[4], k2[4], k3[4], k4[4], y[4];
    const double dt = DT, dt2 = dt / 2.0;
    dsdt(s, torque, k1);
    for (int i = 0; i < 4; i++) y[i] = s[i] + dt2 * k1[i];
    dsdt(y, torque, k2);
    for (int i = 0; i < 4; i++) y[i] = s[i] + dt2 * k2[i];
    dsdt(y, torque, k3);
    for (int i = 0; i < 4; i++) y[i] = s[i] + dt * k3[i];
    dsdt(y, torque, k4);
    for (int i = 0; i < 4; i++) s[i] = s[i] + dt / 6.0 * (k1[i] + 2 * k2[i] + 2 * k3[i] + k4[i]);
    s[0] = wrap(s[0], -M_PI, M_PI);
    s[1] = wrap(s[1], -M_PI, M_PI);
    s[2] = bound(s[2], -MAX_VEL_1, MAX_VEL_1);
    s[3] = bound(s[3], -MAX_VEL_2, MAX_VEL_2);
    *terminated = -cos(s[0]) - cos(s[1] + s[0]) > 1.0;
    *reward = *terminated ? 0.0 : -1.0;
}

static void observe(const void *st, float *obs) {
    const double *s = st;
    obs[0] = (float)cos(s[0]);
    obs[1] = (float)sin(s[0]);
    obs[2] = (float)cos(s[1]);
    obs[3] = (float)sin(s[1]);
    obs[4] = (float)s[2];
    obs[5] = (float)s[3];
}

/* Gymnasium's picture: two links hanging from the pivot, the line the tip must reach. */
static void draw(const void *st, dt_env_sketch *sk) {
    const double *s = st, x1 = L1 * sin(s[0]), y1 = -L1 * cos(s[0]);
    sk->x0 = -2.2f, sk->y0 = -2.2f, sk->x1 = 2.2f, sk->y1 = 2.2f;
    dt_sketch_box(sk, 0xffffff, 0, 0, 4.4, 4.4, 0);
    dt_sketch_shape *goal = dt_sketch_add(sk, 0x000000, 0.02f);
    dt_sketch_point(goal, -2.2, 1);
    dt_sketch_point(goal, 2.2, 1);
    dt_sketch_shape *links = dt_sketch_add(sk, 0x00cccc, 0.2f);
    dt_sketch_point(links, 0, 0);
    dt_sketch_point(links, x1, y1);
    dt_sketch_point(links, x1 + L1 * sin(s[0] + s[1]), y1 - L1 * cos(s[0] + s[1])); /* the second link is as long */
}

const dt_env_kind dt_env_acrobot = {
    .info = { .id = "Acrobot-v1", .name = "acrobot", .obs_dim = 6, .actions = 3, .act_dim = 1, .max_steps = 500, .state_dim = 4 },
    .reset = reset, .step = step, .observe = observe, .draw = draw, .fps = 15,
};
