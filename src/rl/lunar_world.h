/* LunarLander's world on the Box2D library (Debian's libbox2d, 2.4): the
 * moon's surface, the lander and its two legs on sprung joints, and what a
 * step reads back. Built as Gymnasium's lunar_lander.py builds it with
 * pybox2d (Box2D 2.3); the game around it (the terrain's heights, the
 * engines, the reward) is env_lunar_lander.c's. C++ inside, C outside. */
#ifndef DTRAIN_RL_LUNAR_WORLD_H
#define DTRAIN_RL_LUNAR_WORLD_H

#include "dtrain/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Gymnasium's constants (its pixels become metres through SCALE) */
#define DT_LUNAR_FPS 50
#define DT_LUNAR_SCALE 30.0
#define DT_LUNAR_VIEW_W 600
#define DT_LUNAR_VIEW_H 400
#define DT_LUNAR_LEG_DOWN 18
#define DT_LUNAR_CHUNKS 11

typedef struct dt_lunar_world dt_lunar_world;

/* What a step reads: the lander's state as Box2D holds it (floats), whether it sleeps, which legs touch the
 * ground and whether the lander's body touched anything since the episode began (the crash). */
typedef struct {
    float x, y, vx, vy, angle, omega;
    int awake, leg_contact[2], crashed;
} dt_lunar_state;

dt_status dt_lunar_world_create(dt_lunar_world **out);
void dt_lunar_world_destroy(dt_lunar_world *w);
/* A new world (as Gymnasium's reset makes one): the surface through (chunk_x[i], smooth_y[i]) for the
 * DT_LUNAR_CHUNKS points, the lander at the top centre pushed by the force (fx, fy), its legs. Box2D's own
 * allocations are not checked (it calls malloc and uses the result). */
void dt_lunar_world_reset(dt_lunar_world *w, const double *chunk_x, const double *smooth_y, double fx, double fy);
/* An engine's push: the impulse (ix, iy) at the world point (px, py) of the lander. */
void dt_lunar_world_impulse(dt_lunar_world *w, double ix, double iy, double px, double py);
/* One step of 1/FPS s (Box2D's solver at 180 velocity and 60 position iterations, as Gymnasium's). */
void dt_lunar_world_step(dt_lunar_world *w);
void dt_lunar_world_read(const dt_lunar_world *w, dt_lunar_state *s);
/* For a picture: the lander's and the legs' polygons in world metres, lander first (6 points), then each leg (4);
 * xy holds 2 * 14 floats. */
void dt_lunar_world_outline(const dt_lunar_world *w, float *xy);

#ifdef __cplusplus
}
#endif
#endif
