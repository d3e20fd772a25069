/* What an environment kind gives env.c: its spaces and limits, and its
 * dynamics over a state: state_dim doubles (Gymnasium's env.unwrapped.state)
 * for the classic-control kinds, or a world of the kind's own (a physics
 * engine's) that it creates and destroys. */
#ifndef DTRAIN_RL_ENV_INTERNAL_H
#define DTRAIN_RL_ENV_INTERNAL_H

#include "dtrain/rl.h"

#define DT_ENV_STATE_MAX 8

/* A picture of a state, for films of episodes (film.c): shapes in the kind's own units over the view
 * (x0, y0)-(x1, y1), y up; a shape is a filled polygon (width 0) or a line of that width. A kind draws the same
 * shapes in the same order every frame; those that never move are drawn once. */
enum { DT_SKETCH_SHAPES = 16, DT_SKETCH_POINTS = 64 };
typedef struct {
    int n;
    float width;
    uint32_t rgb;
    float xy[2 * DT_SKETCH_POINTS];
} dt_sketch_shape;
typedef struct {
    float x0, y0, x1, y1;
    int n;
    dt_sketch_shape shape[DT_SKETCH_SHAPES];
} dt_env_sketch;
/* The next shape of the sketch, empty, or NULL when it has DT_SKETCH_SHAPES already. */
dt_sketch_shape *dt_sketch_add(dt_env_sketch *sk, uint32_t rgb, float width);
/* A point; ignored past DT_SKETCH_POINTS. */
void dt_sketch_point(dt_sketch_shape *sh, double x, double y);
/* A w x h rectangle centred at (cx, cy), turned by angle, as a polygon. */
void dt_sketch_box(dt_env_sketch *sk, uint32_t rgb, double cx, double cy, double w, double h, double angle);

/* What an environment of a pool does in a round (env_pool.c; the bridge's workers read the same numbers). */
enum { DT_ROUND_STEP = 0, DT_ROUND_RESET_SEEDED = 1, DT_ROUND_RESET = 2, DT_ROUND_IDLE = 3 };

typedef struct {
    dt_env_info info;
    /* a kind with a world of its own makes it with the environment (NULL: the state is state_dim doubles) */
    dt_status (*create)(void **state);
    void (*destroy)(void *state);
    /* a new episode's state, from the environment's stream (dt_env_uniform) */
    void (*reset)(void *state, uint64_t *rng);
    /* one step of the dynamics (drawing from the stream where it is random); *terminated: the task ended */
    void (*step)(void *state, uint64_t *rng, const float *action, double *reward, int *terminated);
    void (*observe)(const void *state, float *obs);
    /* a picture of the state (NULL: the kind has none), and the rate its films play at (Gymnasium's render_fps) */
    void (*draw)(const void *state, dt_env_sketch *sk);
    int fps;
} dt_env_kind;

/* The environment's kind and state (NULL before its first reset), for film.c. */
const dt_env_kind *dt_env_kind_of(const dt_env *e);
const void *dt_env_state(const dt_env *e);

extern const dt_env_kind dt_env_cartpole, dt_env_acrobot, dt_env_mountain_car, dt_env_pendulum, dt_env_lunar_lander,
    dt_env_lunar_lander_continuous;

/* An environment's whole state as DT_ENV_RECORD doubles (a checkpoint's): its physical state, its stream's bits, its
 * step in the episode and its flags; restore checks what it reads (DT_ERR_IO). A kind whose state is a physics world
 * (LunarLander's Box2D world, which has no state to copy) restarts instead (dt_env_restarts): its record holds the
 * stream and flags alone, and restored it has ended its episode, so that its next step is a reset from that stream. */
enum { DT_ENV_RECORD = DT_ENV_STATE_MAX + 4 };
dt_status dt_env_record(const dt_env *e, double *rec);
dt_status dt_env_restore(dt_env *e, const double *rec);
bool dt_env_restarts(const dt_env *e);
/* Environment i of a pool as DT_ENV_POOL_RECORD doubles: its record, then the pool's running episode (ended, return,
 * length); and the pool's step count. A bridged pool's environments cannot be saved (DT_ERR_UNSUPPORTED). One that
 * restarts (dt_env_pool_restarts) is restored with its episode ended and not counted: the next step resets it. */
enum { DT_ENV_POOL_RECORD = DT_ENV_RECORD + 3 };
/* A pool record's running episode (both pools'), checked: environment e (number in the job) had ended it, its return
 * and length so far; a kind that restarts has it ended and uncounted. */
dt_status dt_env_running_episode(const double *rec, const dt_env *e, int number, bool *ended, double *ret, int *len);
dt_status dt_env_pool_record(const dt_env_pool *p, int i, double *rec);
dt_status dt_env_pool_restore(dt_env_pool *p, int i, const double *rec);
int64_t dt_env_pool_steps(const dt_env_pool *p);
/* Why the pool's environments cannot be saved, or NULL where they can. */
const char *dt_env_pool_unsaveable(const dt_env_pool *p);
bool dt_env_pool_restarts(const dt_env_pool *p);
void dt_env_pool_set_steps(dt_env_pool *p, int64_t steps);
/* The same for an asynchronous pool's environment i (every environment with the caller: between rollouts); its steps
 * are each environment's (the same for all there). */
dt_status dt_env_pool_async_record(const dt_env_pool_async *p, int i, double *rec);
dt_status dt_env_pool_async_restore(dt_env_pool_async *p, int i, const double *rec);
bool dt_env_pool_async_restarts(const dt_env_pool_async *p);
int64_t dt_env_pool_async_steps(const dt_env_pool_async *p);
void dt_env_pool_async_set_steps(dt_env_pool_async *p, int64_t steps);

/* The finished episodes a pool holds between its caller's takes: the newest DT_EPISODES_KEPT when nobody takes them
 * (env_pool.c; the synchronous and the asynchronous pool's). */
#define DT_EPISODES_KEPT 4096
typedef struct {
    dt_episode e[DT_EPISODES_KEPT];
    int n;
} dt_episode_list;
void dt_episode_list_add(dt_episode_list *l, dt_episode e);
/* Up to cap of them, the oldest first, into out and off the list; the count. */
int dt_episode_list_take(dt_episode_list *l, dt_episode *out, int cap);

/* DT_OK when action (in->act_dim floats) is in the space, else an error naming it. */
dt_status dt_env_check_action(const dt_env_info *in, const float *action);
/* Uniform in [low, high) as numpy's Generator.uniform computes it, from a double's 53 random bits. */
double dt_env_uniform(uint64_t *rng, double low, double high);

/* x**2 of a numpy scalar: libm's pow(x, 2), which can differ from x * x in the last bit (glibc's pow is within
 * 0.52 ulp, not correctly rounded); a constant exponent would let the compiler fold it into x * x. */
double dt_env_pow2(double x);
float dt_env_powf2(float x);

#endif
