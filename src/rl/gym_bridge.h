/* The bridge to Gymnasium (gym_bridge.c): n environments of one id in
 * Python worker processes (gym_worker.py), stepped a round at a time. */
#ifndef DTRAIN_RL_GYM_BRIDGE_H
#define DTRAIN_RL_GYM_BRIDGE_H

#include "env_internal.h"

typedef struct dt_gym_bridge dt_gym_bridge;

/* id: Gymnasium's (without "gym:"). Refused with Gymnasium's own words where it cannot make the environment. */
dt_status dt_gym_bridge_create(const char *id, int n, const dt_env_bridge_config *c, dt_gym_bridge **out);
void dt_gym_bridge_destroy(dt_gym_bridge *b);
const dt_env_info *dt_gym_bridge_info(const dt_gym_bridge *b);
/* One round: environment i does cmd[i] (with seed[i] for a seeded reset, action act[i] for a step); a step gives its
 * observation, reward and flags, a reset its observation (reward 0, flags clear); an idle one's are left as they
 * were. A worker that died or an environment that raised is named. */
dt_status dt_gym_bridge_round(dt_gym_bridge *b, const int8_t *cmd, const int64_t *seed, const float *act, float *obs,
                              double *rew, uint8_t *term, uint8_t *trunc);

#endif
