/* Gymnasium's RunningMeanStd and the normalising wrappers that use it
 * (NormalizeObservation, NormalizeReward), one environment's: a mean and a
 * variance a component, updated one sample at a time by Chan et al.'s
 * parallel formula from a count of 1e-4, a mean of 0 and a variance of 1. */
#ifndef DTRAIN_RL_RUNNING_NORM_H
#define DTRAIN_RL_RUNNING_NORM_H

#include "dtrain/base.h"

typedef struct {
    int dim;
    double count, *mean, *var;
    double *x; /* an observation in double, to update with */
} dt_running_norm;

dt_status dt_running_norm_init(dt_running_norm *r, int dim);
void dt_running_norm_free(dt_running_norm *r);
void dt_running_norm_update(dt_running_norm *r, const double *x);
/* NormalizeObservation then a clip to [-10, 10], in place: the statistics updated with x first when update is set. */
void dt_running_norm_obs(dt_running_norm *r, float *x, int update);
/* NormalizeReward: the discounted return *ret goes into the statistics and the reward is divided by their standard
 * deviation, then clipped to [-10, 10]. As Gymnasium's does, a step that terminates (a truncation does not) restarts
 * the return with its own reward. */
float dt_running_norm_reward(dt_running_norm *r, double *ret, double reward, int terminated, double gamma);

#endif
