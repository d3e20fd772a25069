/* LunarLander-v3 and LunarLanderContinuous-v3 (Oleg Klimov's, as Gymnasium's
 * lunar_lander.py plays them): land on the pad between the flags with a main
 * engine and two side engines. The world is Box2D's (lunar_world.cc); the
 * game is here: the terrain's heights, where and how hard each engine
 * pushes (with its random dispersion), the observation, and the shaped
 * reward. Without wind, as Gymnasium's default. */
#include "env_internal.h"
#include "lunar_world.h"

#include <math.h>
#include <stdlib.h>

#define SCALE DT_LUNAR_SCALE
#define FPS DT_LUNAR_FPS
#define MAIN_ENGINE_POWER 13.0
#define SIDE_ENGINE_POWER 0.6
#define INITIAL_RANDOM 1000.0
#define SIDE_ENGINE_HEIGHT 14
#define SIDE_ENGINE_AWAY 12
#define MAIN_ENGINE_Y_LOCATION 4
#define W (DT_LUNAR_VIEW_W / SCALE)
#define H (DT_LUNAR_VIEW_H / SCALE)

typedef struct {
    dt_lunar_world *world;
    double helipad_y, prev_shaping;
    int have_prev;
    double state[8]; /* the observation before its rounding to float (the reward reads these) */
    double chunk_x[DT_LUNAR_CHUNKS], smooth_y[DT_LUNAR_CHUNKS];
} lander;

static dt_status create(void **st) {
    lander *l = calloc(1, sizeof *l);
    if (!l) return dt_error(DT_ERR_NOMEM, "LunarLander: out of memory");
    dt_status s = dt_lunar_world_create(&l->world);
    if (s) { free(l); return s; }
    *st = l;
    return DT_OK;
}

static void destroy(void *st) {
    lander *l = st;
    dt_lunar_world_destroy(l->world);
    free(l);
}

/* The engines as an action asks (m: the main engine's power, 0 or 0.5..1; s: a side engine's, 0 or 0.5..1; dir: which
 * side, -1 or +1), each pushing the lander from where its nozzle is, shaken by dispersion. */
static void engines(lander *l, uint64_t *rng, double m, double s, double dir) {
    dt_lunar_state b;
    dt_lunar_world_read(l->world, &b);
    double tip[2] = { sin(b.angle), cos(b.angle) }, side[2] = { -tip[1], tip[0] };
    double disp[2];
    for (int i = 0; i < 2; i++) disp[i] = dt_env_uniform(rng, -1.0, 1.0) / SCALE;
    if (m > 0) {
        double ox = tip[0] * (MAIN_ENGINE_Y_LOCATION / SCALE + 2 * disp[0]) + side[0] * disp[1];
        double oy = -tip[1] * (MAIN_ENGINE_Y_LOCATION / SCALE + 2 * disp[0]) - side[1] * disp[1];
        dt_lunar_world_impulse(l->world, -ox * MAIN_ENGINE_POWER * m, -oy * MAIN_ENGINE_POWER * m, b.x + ox, b.y + oy);
    }
    if (s > 0) {
        double ox = tip[0] * disp[0] + side[0] * (3 * disp[1] + dir * SIDE_ENGINE_AWAY / SCALE);
        double oy = -tip[1] * disp[0] - side[1] * (3 * disp[1] + dir * SIDE_ENGINE_AWAY / SCALE);
        double px = b.x + ox - tip[0] * 17 / SCALE, py = b.y + oy + tip[1] * SIDE_ENGINE_HEIGHT / SCALE;
        dt_lunar_world_impulse(l->world, -ox * SIDE_ENGINE_POWER * s, -oy * SIDE_ENGINE_POWER * s, px, py);
    }
}

/* After the engines: Box2D's step, the observation, and the reward (the change of the shaping, less the fuel; -100
 * for a crash or leaving the screen, +100 for coming to rest). */
static void advance(lander *l, double m_power, double s_power, double *reward, int *terminated) {
    dt_lunar_world_step(l->world);
    dt_lunar_state b;
    dt_lunar_world_read(l->world, &b);
    double *s = l->state;
    s[0] = (b.x - W / 2) / (W / 2);
    s[1] = (b.y - (l->helipad_y + DT_LUNAR_LEG_DOWN / SCALE)) / (H / 2);
    s[2] = b.vx * (W / 2) / FPS;
    s[3] = b.vy * (H / 2) / FPS;
    s[4] = b.angle;
    s[5] = 20.0 * b.omega / FPS;
    s[6] = b.leg_contact[0] ? 1.0 : 0.0;
    s[7] = b.leg_contact[1] ? 1.0 : 0.0;
    double shaping = -100 * sqrt(s[0] * s[0] + s[1] * s[1]) - 100 * sqrt(s[2] * s[2] + s[3] * s[3]) - 100 * fabs(s[4]) + 10 * s[6] +
                     10 * s[7];
    double r = l->have_prev ? shaping - l->prev_shaping : 0;
    l->prev_shaping = shaping;
    l->have_prev = 1;
    r -= m_power * 0.30;
    r -= s_power * 0.03;
    *terminated = 0;
    if (b.crashed || fabs(s[0]) >= 1.0) *terminated = 1, r = -100;
    if (!b.awake) *terminated = 1, r = +100;
    *reward = r;
}

static void step_discrete(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    lander *l = st;
    int k = (int)a[0]; /* 0 nothing, 1 left engine, 2 main, 3 right */
    double m = k == 2 ? 1.0 : 0.0, s = k == 1 || k == 3 ? 1.0 : 0.0;
    engines(l, rng, m, s, k - 2);
    advance(l, m, s, reward, terminated);
}

static double clip(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

/* a[0] > 0 fires the main engine at 50-100%; |a[1]| > 0.5 a side engine at 50-100%, its sign saying which. */
static void step_continuous(void *st, uint64_t *rng, const float *a, double *reward, int *terminated) {
    lander *l = st;
    double a0 = clip(a[0], -1, 1), a1 = clip(a[1], -1, 1);
    double m = a0 > 0 ? (clip(a0, 0, 1) + 1) * 0.5 : 0, s = fabs(a1) > 0.5 ? clip(fabs(a1), 0.5, 1.0) : 0;
    engines(l, rng, m, s, a1 > 0 ? 1 : -1);
    advance(l, m, s, reward, terminated);
}

/* A new terrain (the pad flat at H/4 over the middle chunks, heights smoothed over neighbours with Python's index -1
 * wrapping to the last), the lander pushed by a random force, and one step with the engines off, as Gymnasium's reset
 * ends. */
static void reset(void *st, uint64_t *rng) {
    lander *l = st;
    double height[DT_LUNAR_CHUNKS + 1];
    for (int i = 0; i <= DT_LUNAR_CHUNKS; i++) height[i] = dt_env_uniform(rng, 0, H / 2);
    for (int i = 0; i < DT_LUNAR_CHUNKS; i++) l->chunk_x[i] = W / (DT_LUNAR_CHUNKS - 1) * i;
    l->helipad_y = H / 4;
    for (int i = DT_LUNAR_CHUNKS / 2 - 2; i <= DT_LUNAR_CHUNKS / 2 + 2; i++) height[i] = l->helipad_y;
    for (int i = 0; i < DT_LUNAR_CHUNKS; i++)
        l->smooth_y[i] = 0.33 * (height[i ? i - 1 : DT_LUNAR_CHUNKS] + height[i] + height[i + 1]);
    double fx = dt_env_uniform(rng, -INITIAL_RANDOM, INITIAL_RANDOM);
    double fy = dt_env_uniform(rng, -INITIAL_RANDOM, INITIAL_RANDOM);
    dt_lunar_world_reset(l->world, l->chunk_x, l->smooth_y, fx, fy);
    l->have_prev = 0;
    double r;
    int term;
    engines(l, rng, 0, 0, 0);
    advance(l, 0, 0, &r, &term);
}

static void observe(const void *st, float *obs) {
    const lander *l = st;
    for (int i = 0; i < 8; i++) obs[i] = (float)l->state[i];
}

/* Gymnasium's picture: a black sky over a white moon, the pad's two yellow flags, the purple craft on its legs. */
static void draw(const void *st, dt_env_sketch *sk) {
    const lander *l = st;
    sk->x0 = 0, sk->y0 = 0, sk->x1 = (float)W, sk->y1 = (float)H;
    dt_sketch_box(sk, 0x000000, W / 2, H / 2, W, H, 0);
    dt_sketch_shape *moon = dt_sketch_add(sk, 0xffffff, 0);
    dt_sketch_point(moon, 0, 0);
    for (int i = 0; i < DT_LUNAR_CHUNKS; i++) dt_sketch_point(moon, l->chunk_x[i], l->smooth_y[i]);
    dt_sketch_point(moon, W, 0);
    for (int side = 0; side < 2; side++) {
        double x = l->chunk_x[DT_LUNAR_CHUNKS / 2 - 1 + 2 * side], top = l->helipad_y + 50 / SCALE;
        dt_sketch_shape *pole = dt_sketch_add(sk, 0xffffff, (float)(1 / SCALE));
        dt_sketch_point(pole, x, l->helipad_y);
        dt_sketch_point(pole, x, top);
        dt_sketch_shape *flag = dt_sketch_add(sk, 0xcccc00, 0);
        dt_sketch_point(flag, x, top);
        dt_sketch_point(flag, x, top - 10 / SCALE);
        dt_sketch_point(flag, x + 25 / SCALE, top - 5 / SCALE);
    }
    float xy[28];
    dt_lunar_world_outline(l->world, xy);
    for (int b = 0, k = 0; b < 3; b++) {
        dt_sketch_shape *body = dt_sketch_add(sk, 0x8066e6, 0);
        for (int j = 0; j < (b ? 4 : 6); j++, k++) dt_sketch_point(body, xy[2 * k], xy[2 * k + 1]);
    }
}

const dt_env_kind dt_env_lunar_lander = {
    .info = { .id = "LunarLander-v3", .name = "lunarlander", .obs_dim = 8, .actions = 4, .act_dim = 1, .max_steps = 1000 },
    .create = create, .destroy = destroy, .reset = reset, .step = step_discrete, .observe = observe, .draw = draw, .fps = FPS,
};

const dt_env_kind dt_env_lunar_lander_continuous = {
    .info = { .id = "LunarLanderContinuous-v3", .name = "lunarlander-continuous", .obs_dim = 8, .act_dim = 2, .act_low = -1,
              .act_high = 1, .max_steps = 1000 },
    .create = create, .destroy = destroy, .reset = reset, .step = step_continuous, .observe = observe, .draw = draw,
    .fps = FPS,
};
