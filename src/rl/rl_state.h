/* A PPO, REINFORCE or IMPALA run's state in one file, so that a run stopped after an update goes on as if it had not stopped: the learner
 * (the policy's parameters, Adam's moments and step count, the last episodes' returns, the counters) and every
 * environment (its physical state and stream, its running episode, the rollout's next observation and normalisers).
 * The built-in environments: those whose state is numbers (CartPole, Acrobot, MountainCar, Pendulum) go on bit for bit;
 * LunarLander's is a physics world with no state to copy, so its environments restart their episodes (said); a bridged
 * one lives in Python, and is refused by name. IMPALA's environments live in its actors: each rollout's slot carries them
 * (actors.h), and the state holds them as the learner last took them; a resumed run's actors go on from there. */
#ifndef DTRAIN_RL_STATE_H
#define DTRAIN_RL_STATE_H

#include "dtrain/optim.h"
#include "dtrain/rl.h"
#include "policy.h"
#include "progress.h"
#include "rollout.h"

/* IMPALA's learner (one process): its actors' environments as it last took them (each slot carries them) and where
 * each actor goes on, the weights the actors hold; in the file beside the learner's. */
typedef struct {
    const char *env_id;
    int actors;
    size_t env_rec;       /* doubles an environment takes */
    int64_t *rollouts, *pool_steps; /* each actor's next rollout and its pool's steps */
    double *records;      /* every environment's [num_envs][env_rec], in the job's order */
    float *published;     /* the weights the actors hold, and their update */
    int64_t version;
} dt_rl_actor_state;

typedef struct {
    const dt_rl_config *c;
    dt_comm *comm;        /* NULL: one rank */
    int rank, P;
    dt_rollout *ro;       /* this rank's environments (either pool) and their rollout (NULL with actors) */
    dt_env_pool *pool;    /* with actors: one environment of the kind, while the run starts (what can be saved) */
    dt_policy *pol;
    dt_optim *opt;
    dt_rl_progress *prog;
    dt_rl_actor_state *actors; /* IMPALA's (NULL: PPO's or REINFORCE's) */
} dt_rl_learner;

/* After `updates` updates and `steps` environment steps, into path (written whole or not at all). Collective: every
 * rank's environments are gathered to rank 0, which writes. */
dt_status dt_rl_state_save(const dt_rl_learner *l, const char *path, int updates, int64_t steps);
/* Read back (collective): rank 0 reads and checks it against this run (a setting that differs is named), every rank
 * takes the learner and its own environments. The same environments split over any number of ranks. */
dt_status dt_rl_state_load(const dt_rl_learner *l, const char *path, int *updates, int64_t *steps);

/* A run's start (collective): --resume's state taken (*u0 the updates it had done of the run's `updates`, *steps its
 * environment steps; 0 without --resume), --resume and --save-every refused where the environments cannot be saved,
 * and --save said to keep the policy alone there. */
dt_status dt_rl_resume_run(const dt_rl_learner *l, int updates, int *u0, int64_t *steps);
/* --save after `updates` (collective): the policy (rank 0: environment 0's observation statistics with it) and the
 * run's state beside it (SAVE.state) where the environments can be saved. */
dt_status dt_rl_save_run(const dt_rl_learner *l, int updates, int64_t steps);

#endif
