/* IMPALA's actors as the learner sees them, and the memory both share.
 * One memfd holds the header (the run's settings, written before the
 * actors start), the learner's weights (a sequence lock: odd while it
 * writes) and each actor's slots, each a rollout: its header, environment
 * 0's observation statistics and the records (rollout.h). A socket pair a
 * actor carries one byte a message: the actor's "slot s is full" (and 'R'
 * once it is ready), the learner's "slot s is free again" and 'W' (new
 * weights). An actor's death closes its socket: the learner names it and
 * goes on with the others; the learner's closes theirs, and the actors end
 * (and die with it: PR_SET_PDEATHSIG). */
#ifndef DTRAIN_RL_ACTORS_H
#define DTRAIN_RL_ACTORS_H

#include "dtrain/rl.h"

#include <stdatomic.h>

#define DT_ACTOR_SLOTS 2        /* rollouts an actor may have ahead of the learner */
#define DT_ACTOR_EPISODES 1024  /* episodes a slot lists (more: counted as dropped) */
#define DT_ACTOR_MAGIC 0x64744143u
#define DT_ACTOR_READY 'R'
#define DT_ACTOR_WEIGHTS 'W'
#define DT_ACTOR_FREE 'F'
/* Actors on other machines (the other ranks of an MPI job, dt_peers) have no shared memory: the learner sends each its
 * copy of the header (and a resumed run's start), then weights as [version (int64)][parameters]; an actor sends a
 * ready message (its host's name), then each full slot's bytes, tag DT_ACTOR_TAG_SLOT + s. Control bytes (tag CTL):
 * the learner's F as above, a heartbeat H (an actor's when it starts to wait; the learner's answer, and it writes only
 * in reply: actors_remote.c), the end (Q; q: a rank was lost, so nobody finalizes MPI) and an actor's E (it failed,
 * its error said on its own stderr). */
#define DT_ACTOR_HEARTBEAT 'H'
#define DT_ACTOR_END 'Q'
#define DT_ACTOR_END_LOST 'q'
#define DT_ACTOR_FAILED 'E'
enum { DT_ACTOR_TAG_CTL = 1, DT_ACTOR_TAG_HEADER, DT_ACTOR_TAG_START, DT_ACTOR_TAG_WEIGHTS, DT_ACTOR_TAG_READY,
       DT_ACTOR_TAG_SLOT = 8 };
#define DT_ACTOR_HOST 64 /* a ready message: the actor's host name */

typedef struct {
    uint32_t magic;
    char env[256], python[4096];
    int workers, actors, n, T, od, ad, K, hidden, continuous;
    int norm_obs, norm_reward, trunc_as_term, sync, refresh;
    int keep_state;            /* each slot carries the actor's environments after its rollout (a run state's: rl_state.h) */
    int async_threads, async_batch; /* an actor's asynchronous pool (0: a synchronous one) */
    float gamma;
    double timeout;            /* actors on other machines: seconds either side may be silent before it counts as gone */
    uint64_t seed;
    size_t env_rec;            /* doubles an environment's state takes (DT_ENV_POOL_RECORD and its rollout's) */
    size_t nparams, slot_bytes, weights_off, slots_off, start_off, total; /* start_off: where actors start (0: at zero) */
    _Atomic uint64_t seq;      /* the weights' sequence lock */
    _Atomic int64_t version;   /* the learner's update the weights are of */
} dt_actor_shared;

typedef struct {
    int64_t rollout, version;  /* the actor's rollout index; the weights it acted with */
    int64_t pool_steps;        /* its pool's steps after the rollout */
    int episodes, dropped;
    dt_episode ep[DT_ACTOR_EPISODES];
    /* then obs_mean [od], obs_var [od] (doubles, with norm_obs), the environments' state after the rollout [n][env_rec]
     * (doubles, with keep_state) and the records [(T+1)][n][rec] */
} dt_actor_slot;

static inline dt_actor_slot *dt_actor_slot_at(dt_actor_shared *h, int actor, int s) {
    return (dt_actor_slot *)((char *)h + h->slots_off + ((size_t)actor * DT_ACTOR_SLOTS + s) * h->slot_bytes);
}
static inline double *dt_actor_slot_stats(dt_actor_slot *s) { return (double *)(s + 1); }
static inline double *dt_actor_slot_envs(const dt_actor_shared *h, dt_actor_slot *s) {
    return dt_actor_slot_stats(s) + (h->norm_obs ? 2 * (size_t)h->od : 0);
}
static inline float *dt_actor_slot_records(const dt_actor_shared *h, dt_actor_slot *s) {
    return (float *)(dt_actor_slot_envs(h, s) + (h->keep_state ? (size_t)h->n * h->env_rec : 0));
}

/* Where the actors start (a resumed run's, rl_state.h): each actor's next rollout and its pool's steps, and every
 * environment's state (env_rec doubles each, in the job's order). In the shared memory at start_off: an actor's two
 * counts, then its environments'. */
typedef struct {
    const int64_t *rollouts, *pool_steps;
    const double *records;
} dt_actors_start;
static inline int64_t *dt_actor_start_at(dt_actor_shared *h, int actor) {
    return (int64_t *)((char *)h + h->start_off + (size_t)actor * (2 * sizeof(int64_t) + (size_t)h->n * h->env_rec * sizeof(double)));
}

typedef struct dt_rl_actors dt_rl_actors;
/* Starts c->actors actors (this program, /proc/self/exe, as `rl actor I`) for environments of the info's kind, n a
 * actor, and waits for each to say it is ready (an actor that cannot start is named: the error). keep_state: each
 * rollout's slot carries the environments after it; start: where the actors begin (NULL: at zero). */
dt_status dt_rl_actors_create(const dt_rl_config *c, const dt_env_info *in, int K, size_t nparams, int keep_state,
                              const dt_actors_start *start, dt_rl_actors **out);
/* Closes the actors' sockets (they end), waits up to a second each, then kills what is left. */
void dt_rl_actors_destroy(dt_rl_actors *a);
/* The weights of update version, for the actors' next rollouts. */
void dt_rl_actors_publish(dt_rl_actors *a, const float *params, int64_t version);
/* The next full slot of actor want (its rollouts in order), or with want -1 of whichever actor has one first. An
 * actor found dead is said (a warning) and left out; want's death gives DT_OK with *slot NULL; with no actor left,
 * DT_ERR_PEER. */
dt_status dt_rl_actors_take(dt_rl_actors *a, int want, int *who, dt_actor_slot **slot);
/* The slot take gave, free for the actor again. */
void dt_rl_actors_release(dt_rl_actors *a, int actor);
int dt_rl_actors_count(const dt_rl_actors *a);
int dt_rl_actors_alive(const dt_rl_actors *a, int actor);
int dt_rl_actors_live(const dt_rl_actors *a);
dt_actor_shared *dt_rl_actors_shared(dt_rl_actors *a);

#endif
