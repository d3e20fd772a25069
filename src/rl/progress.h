/* A run's progress as dtrain rl shows it, whichever algorithm learns: the
 * mean return over the last 100 episodes, a metrics row an update (JSON
 * lines) and the progress line every print_every updates. */
#ifndef DTRAIN_RL_PROGRESS_H
#define DTRAIN_RL_PROGRESS_H

#include "dtrain/rl.h"

#include <stdio.h>

#define DT_RL_WINDOW 100

typedef struct {
    double returns[DT_RL_WINDOW];
    int64_t episodes;
    FILE *metrics;        /* NULL: none, or not the lead */
    const char *path;     /* the metrics file's, for its errors */
    int print;            /* the lead prints */
    int print_every;
} dt_rl_progress;

/* The updates of `per` env steps that --total-steps holds: whole ones (CleanRL's rule); where a part is left over the
 * lead rank says how many steps the run takes instead (algo: whose). */
int dt_rl_whole_updates(const char *algo, int64_t total, int64_t per, int lead);
/* lead: the rank that writes and prints. */
dt_status dt_rl_progress_open(dt_rl_progress *g, const dt_rl_config *c, int lead);
void dt_rl_progress_close(dt_rl_progress *g);
/* Episodes that ended, in any order: counted in order of (step, env), as one pool lists them. */
void dt_rl_progress_add(dt_rl_progress *g, dt_episode *ep, int n);
double dt_rl_progress_mean(const dt_rl_progress *g);
/* The update's row and (every print_every, and the last) its line; lag: the mean policy lag in updates (IMPALA's
 * actors), or NAN where there is none. */
void dt_rl_progress_update(dt_rl_progress *g, int u, int updates, int64_t steps, double loss, const dt_rl_terms *t, float lr,
                           double sps, double lag);

#endif
