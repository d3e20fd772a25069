/* dtrain reinforcement learning: environments with Gymnasium's semantics,
 * pools of them stepped as one batch, and the algorithms that learn from
 * their rollouts (PPO; its learner under the engine's data parallelism). */
#ifndef DTRAIN_RL_H
#define DTRAIN_RL_H

#include "dtrain/base.h"
#include "dtrain/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- One environment ----
 * Gymnasium's contract: reset gives the first observation (a seed restarts
 * the environment's own random stream; without one it goes on); step takes
 * an action from the action space and gives the next observation, the
 * reward, terminated (the task's end: the pole fell, the goal was reached)
 * and truncated (the time limit, Gymnasium's TimeLimit wrapper, reached
 * first). Dynamics follow Gymnasium's code operation for operation in
 * double precision, the observation rounded to float as Gymnasium's is. */
typedef struct dt_env dt_env;

typedef struct {
    const char *id;       /* Gymnasium's id: "CartPole-v1" */
    const char *name;     /* dtrain's: "cartpole" */
    int obs_dim;
    int actions;          /* discrete: how many (0: continuous) */
    int act_dim;          /* floats an action takes (1 for a discrete one: its index) */
    float act_low, act_high; /* a continuous action's bounds, every component (unless low, high say otherwise) */
    const float *low, *high; /* a bridged environment's bounds component by component (NULL: act_low, act_high) */
    int max_steps;        /* the time limit */
    int state_dim;        /* doubles of physical state (dt_env_set_state) */
} dt_env_info;

/* name: dtrain's short name or Gymnasium's id (dt_env_list names them). */
dt_status dt_env_create(const char *name, dt_env **out);
void dt_env_destroy(dt_env *e);
const dt_env_info *dt_env_get_info(const dt_env *e);
/* A name's Gymnasium id ("cartpole": "CartPole-v1"; a "gym:ID" name itself), or NULL for none dtrain has. */
const char *dt_env_id(const char *name);
/* The id Gymnasium makes when name is a bridged one ("gym:ID": "ID"), else NULL. */
const char *dt_env_bridged(const char *name);
/* The environments built in, ", "-separated, for messages and --help. */
const char *dt_env_list(void);
/* reset(seed=seed) when seed >= 0, reset() (the stream goes on) when -1. */
void dt_env_reset(dt_env *e, int64_t seed, float *obs);
/* action: act_dim floats (a discrete action's index as a float). An action
 * outside the space, or a step after the episode ended without a reset,
 * is refused naming it. */
dt_status dt_env_step(dt_env *e, const float *action, float *obs, double *reward, int *terminated, int *truncated);
/* Component i's bounds of a continuous action. */
float dt_env_act_low(const dt_env_info *in, int i);
float dt_env_act_high(const dt_env_info *in, int i);
/* A continuous action clipped into the space in place (Gymnasium's ClipAction); a discrete one left as it is. */
void dt_env_clip_action(const dt_env_info *in, float *action);
/* For checks against Gymnasium: start an episode from its physical state
 * (env.unwrapped.state, state_dim doubles) and give its observation. */
dt_status dt_env_set_state(dt_env *e, const double *state, float *obs);

/* ---- Films of episodes ----
 * Frames of an environment's states, written as one animated SVG (SMIL:
 * it plays in a browser, looping, at the environment's rate; shapes that
 * never move are drawn once). Kinds with a picture: all built in. */
typedef struct dt_env_film dt_env_film;
/* Refused (DT_ERR_UNSUPPORTED) for a kind with no picture. max_frames: the frames it keeps (later ones are dropped). */
dt_status dt_env_film_create(const dt_env *e, int max_frames, dt_env_film **out);
void dt_env_film_destroy(dt_env_film *f);
/* The environment's state now, as the next frame (none past max_frames); refused before its first reset. */
dt_status dt_env_film_add(dt_env_film *f, const dt_env *e);
int dt_env_film_frames(const dt_env_film *f);
/* The SVG (*svg malloc'd, the caller frees it; title escaped, may be NULL), or written to path atomically. */
dt_status dt_env_film_svg(const dt_env_film *f, const char *title, char **svg, size_t *len);
dt_status dt_env_film_write(const dt_env_film *f, const char *title, const char *path);

/* ---- A pool of environments, stepped as one batch ----
 * n environments of one kind, numbered first .. first + n - 1 in the job
 * (a rank's share of the global pool): environment i is seeded with seed +
 * i, as Gymnasium's vector environments seed theirs, so a pool split over
 * ranks runs the same episodes as one pool. Gymnasium's next-step
 * autoreset: an environment whose episode ended at one step resets at the
 * next, ignoring that step's action, and gives the first observation with
 * reward 0 and neither flag set. */
typedef struct dt_env_pool dt_env_pool;

/* The bridge to Gymnasium: a pool named "gym:ID" (any id gymnasium.make takes, "module:ID" included) runs its
 * environments in Python worker processes, each holding a share of them, that exchange actions, observations and
 * rewards with dtrain through shared memory (src/rl/gym_bridge.c, src/rl/gym_worker.py). A Box observation is
 * flattened to floats, a Discrete one becomes one-hot; actions are a Discrete or a Box space. */
typedef struct {
    const char *python;   /* the interpreter that has gymnasium (NULL: python3) */
    int workers;          /* processes (0: one a core, at most one an environment) */
} dt_env_bridge_config;
/* name: dt_env_create's, or "gym:ID"; bridge (NULL: the defaults) for a bridged one. */
dt_status dt_env_pool_create(const char *name, int n, int first, uint64_t seed, const dt_env_bridge_config *bridge,
                             dt_env_pool **out);
void dt_env_pool_destroy(dt_env_pool *p);
const dt_env_info *dt_env_pool_info(const dt_env_pool *p);
int dt_env_pool_size(const dt_env_pool *p);
/* Every environment's first observation, obs [n, obs_dim] (a bridged pool's can fail: its worker gone). */
dt_status dt_env_pool_reset(dt_env_pool *p, float *obs);
/* Environment i as a dt_env (for films), or NULL in a bridged pool. */
dt_env *dt_env_pool_env(dt_env_pool *p, int i);
/* actions [n, act_dim]; obs [n, obs_dim], rewards, terminated and truncated [n]; reset[i] (NULL: not wanted) says
 * that environment i reset at this step (the step is not a transition). A step that gives a non-finite observation
 * or reward (a bridged environment's) is said, its episode dropped (not counted) and the environment reset at once:
 * the step reads as a reset. */
dt_status dt_env_pool_step(dt_env_pool *p, const float *actions, float *obs, float *rewards, uint8_t *terminated,
                           uint8_t *truncated, uint8_t *reset);
/* A finished episode: its return and length, its environment (numbered in the job) and the pool's step it ended at
 * (0-based, counted from the reset: the same in every rank's pool). */
typedef struct {
    double ret;
    int len, env;
    int64_t step;
} dt_episode;
/* The episodes finished since the last call, in order of (step, env): up to cap of them; the count. */
int dt_env_pool_episodes(dt_env_pool *p, dt_episode *out, int cap);

/* An asynchronous pool (EnvPool's send and receive): `threads` worker threads step the environments whose actions
 * were sent, and a receive hands back the first `batch` of them to finish, so a policy acts on one batch while the
 * others step. Each environment keeps the synchronous pool's semantics (its seed, next-step autoreset, the reset row
 * flagged), so under the same actions its trajectory is the synchronous pool's, whatever batches it came back in.
 * dtrain's own environments only (a bridged pool's workers are processes already). */
typedef struct dt_env_pool_async dt_env_pool_async;
dt_status dt_env_pool_async_create(const char *name, int n, int first, uint64_t seed, int threads, int batch,
                                   dt_env_pool_async **out);
void dt_env_pool_async_destroy(dt_env_pool_async *p);
const dt_env_info *dt_env_pool_async_info(const dt_env_pool_async *p);
int dt_env_pool_async_size(const dt_env_pool_async *p);
/* Every environment reset (their first observations come back by receives, flagged reset); none may be stepping. */
dt_status dt_env_pool_async_reset(dt_env_pool_async *p);
/* Actions [k, act_dim] for environments ids[0..k) (pool numbers 0..n-1), each handed out by a receive and not sent
 * since; every action checked before any is taken. */
dt_status dt_env_pool_async_send(dt_env_pool_async *p, const float *actions, const int *ids, int k);
/* The next `batch` environments to finish, in the order they did: ids [batch], obs [batch, obs_dim], rewards,
 * terminated, truncated and reset [batch] (NULL: not wanted). Waits for them; refused when fewer are stepping. */
dt_status dt_env_pool_async_recv(dt_env_pool_async *p, int *ids, float *obs, float *rewards, uint8_t *terminated, uint8_t *truncated,
                                 uint8_t *reset);
/* The same for the next k (1 up to the environments stepping): a rollout's last receives, fewer than a batch. */
dt_status dt_env_pool_async_recv_n(dt_env_pool_async *p, int k, int *ids, float *obs, float *rewards, uint8_t *terminated,
                                   uint8_t *truncated, uint8_t *reset);
/* The episodes finished among the environments received since the last call, in the order received (step: the
 * environment's own, from the reset); up to cap; the count. */
int dt_env_pool_async_episodes(dt_env_pool_async *p, dt_episode *out, int cap);

/* ---- Learning: PPO, IMPALA and REINFORCE ----
 * PPO: the clipped-objective PPO of CleanRL's ppo.py (GAE, value clipping,
 * entropy bonus, advantage normalisation per minibatch, minibatch epochs,
 * the learning rate annealed to 0) for discrete actions, and of its
 * ppo_continuous_action.py for continuous ones (a diagonal Gaussian policy,
 * observations and rewards normalised by running statistics an
 * environment, actions clipped to the space as the environment takes
 * them): an actor and a critic, each an MLP with tanh between its layers,
 * in one parameter store that the engine updates (Adam, the gradient's
 * global norm clipped). Over several ranks each steps its share of the environments
 * with the same policy, the rollouts are gathered so that every rank
 * holds the whole batch, and each minibatch's gradient is the average of
 * the ranks' slices (the engine's data parallelism): the same global batch
 * as one process. A step where an environment reset (next-step autoreset)
 * is not a transition: it is left out of the losses; a truncated episode's
 * return is bootstrapped with the value of its last observation.
 *
 * IMPALA (Espeholt et al. 2018): actor processes, each stepping its share
 * of the environments with its own copy of the policy, hand rollouts to
 * the learner through shared memory; the learner corrects for the actors'
 * policy lag with V-trace (importance weights truncated at rho_bar and
 * c_bar), takes a step on each batch and publishes its weights to the
 * actors every `refresh` updates, which they pick up at their next rollout
 * without a reload. Asynchronous by default (an update takes the first
 * rollouts ready, as many as there are actors); with sync, an update takes
 * each actor's next rollout in order and an actor's rollout r acts with the
 * weights of update floor(r / refresh) * refresh, so the run does not
 * depend on how many actors produced it or how fast. An actor that dies
 * is named and the learner goes on with the others; the actors end when
 * the learner does.
 *
 * REINFORCE with a baseline (Williams 1992; Sutton and Barto 13.4): each
 * update rolls the pool out for num_steps and learns from the episodes that
 * began and ended inside the rollout, - (G_t - V(s_t)) log pi(a_t) with G_t
 * the Monte Carlo return (a time limit ends it as a termination does), V
 * regressed on G_t; steps of an episode the rollout cut are left out. One
 * process. */
typedef enum { DT_RL_PPO, DT_RL_IMPALA, DT_RL_REINFORCE } dt_rl_algo;
typedef struct {
    dt_rl_algo algo;
    const char *env;      /* dt_env_pool_create's name */
    int num_envs;         /* in the job, all ranks together */
    int num_steps;        /* per environment per rollout */
    int64_t total_steps;  /* environment steps in the job */
    float lr;
    int anneal_lr;
    float gamma, gae_lambda;
    int minibatches, epochs;
    int norm_adv, clip_vloss;
    float clip_coef, ent_coef, vf_coef, max_grad_norm;
    int hidden;           /* width of both networks' two hidden layers */
    int norm_obs, norm_reward; /* Gymnasium's NormalizeObservation and NormalizeReward (with their clips to +-10) */
    int trunc_as_term;    /* a truncated episode not bootstrapped (ppo.py under Gymnasium 0.29's same-step autoreset) */
    uint64_t seed;
    int print_every;      /* updates between progress lines (0: none) */
    const char *metrics;  /* a JSON-lines file of a row per update (rank 0), or NULL */
    const char *save;     /* the policy's parameters at the end (a safetensors file), or NULL; the run's state beside it
                           * (SAVE.state: dt_rl_state_save), then and every save_every updates */
    int save_every;       /* updates between saves (0: at the end only) */
    const char *resume;   /* a run state (SAVE.state) to go on from, or NULL */
    /* PPO's rollouts through an asynchronous pool (dt_env_pool_async, 0: the synchronous one): async_threads threads
     * step a rank's environments, the policy acts on the first async_batch of them to finish while the others step */
    int async_threads, async_batch;
    const dt_env_bridge_config *bridge; /* a "gym:" environment's workers (NULL: the defaults) */
    /* IMPALA's (num_envs split over the actors; num_steps: an actor's unroll; minibatches x epochs over each batch) */
    int actors;           /* actor processes */
    dt_peers *peers; /* the actors are the other ranks of this MPI job (mpi_peers: NULL, processes it starts) */
    double actor_timeout; /* seconds an actor on another machine (peers) may be silent before it is counted gone */
    int refresh;          /* learner updates between weight publications */
    int sync;             /* deterministic batches (above) */
    float rho_bar, c_bar; /* V-trace's truncations */
} dt_rl_config;

/* The seconds an actor on another machine may be silent: --actor-timeout, or 10 s where it was not given. */
double dt_rl_actor_timeout(const dt_rl_config *c);

/* ppo.py's settings; ppo_continuous_action.py's (1 environment, 2048 steps, 32 minibatches, 10 epochs, lr 3e-4, no
 * entropy bonus, 10^6 steps, observations and rewards normalised) with continuous set. */
void dt_ppo_defaults(dt_rl_config *c);
void dt_ppo_defaults_continuous(dt_rl_config *c);
/* IMPALA's on top of the PPO recipe's for the same kind of actions: 2 actors of 8 environments each, unrolls of 32
 * steps, a batch in 4 minibatches of one epoch, lr 1e-3 annealed, refresh 1, rho_bar = c_bar = 1, asynchronous. */
void dt_impala_defaults(dt_rl_config *c, int continuous);
/* REINFORCE's on top of the PPO recipe's: 4 environments x 512 steps a rollout (longer than CartPole's episodes can
 * be), one step an update, lr 1e-2 annealed, advantages normalised over the update's whole episodes. */
void dt_reinforce_defaults(dt_rl_config *c, int continuous);

/* PPO's loss over B rows of a minibatch and its gradient, each row weighted
 * by w[i] (1 / the minibatch's transitions; 0 leaves a row out): head [B, K]
 * (a categorical's logits, or with logstd [K] a Gaussian's means) and
 * values [B] from the policy now; actions ([B] indices, or [B, K]), the
 * rollout's log probabilities and values, the advantages (normalised
 * already) and the returns. loss = pg - ent_coef * entropy + vf_coef * v,
 * with pg the clipped surrogate and v half the (clipped) squared error,
 * each summed with the weights. Gives d loss / d head and d loss / d
 * values, adds d loss / d logstd to dlogstd (Gaussian), and adds to the sums
 * in t (also approx_kl, (ratio - 1) - log ratio, and the fraction clipped,
 * both weighted). */
typedef struct {
    double loss, pg, v, entropy, approx_kl, clipfrac;
} dt_rl_terms;
void dt_ppo_loss(const dt_rl_config *c, int B, int K, const float *logstd, const float *head, const float *values,
                 const float *actions, const float *old_logp, const float *old_values, const float *adv, const float *returns,
                 const float *w, float *dhead, float *dlogstd, float *dvalues, dt_rl_terms *t);
typedef struct {
    int64_t env_steps;
    int updates, episodes;
    double mean_return;   /* over the last 100 episodes */
    double loss;          /* the last update's, the mean of its minibatches' */
    dt_rl_terms terms;   /* the same of each term */
    double steps_per_s;
} dt_rl_result;
/* Collective over comm (NULL: this process alone). after_update (may be NULL): called on every rank after each
 * update with the run so far and the policy's parameters, for checks. */
typedef void (*dt_rl_observer)(const dt_rl_result *sofar, const float *params, size_t n, void *ctx);
/* c->algo's run: dt_ppo_run, dt_impala_run or dt_reinforce_run. */
dt_status dt_rl_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *r);
dt_status dt_ppo_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *r);
/* The learner (this process, which starts c->actors actors: comm must be NULL or of one rank) and its actors. The
 * actors are this program run again (/proc/self/exe) as `rl actor I` with the shared memory on fd 3 and a socket
 * on fd 4: a program that runs IMPALA hands those arguments to dt_rl_actor_main. */
dt_status dt_impala_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *r);
dt_status dt_reinforce_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *r);
/* REINFORCE's returns over B columns of T steps, each array [T][B]: use[k] says that step k is in an episode that
 * began inside the rollout (after a reset step (valid 0), or at row 0 when first_starts) and ended inside it (done
 * at a later or the same step); returns[k] its discounted return to that end (0 where not used). */
void dt_mc_returns(int T, int B, float gamma, const float *rewards, const uint8_t *done, const uint8_t *valid, int first_starts,
                   float *returns, uint8_t *use);
/* Actor index's life (what `dtrain rl actor I` runs, fds 3 and 4 from the learner): 0 when the learner closed its
 * end, 1 after an error (said on stderr). */
int dt_rl_actor_main(int index);
/* An actor on another machine: rank r > 0 of an MPI job whose rank 0 runs dt_impala_run with c->peers, acting as actor
 * r - 1 (the learner sends the settings). 0 once the learner ended the run or went silent, 1 after an error. */
int dt_rl_actor_remote_main(dt_peers *peers);
/* The learner's (rank 0's) setup failed before it greeted its actors on the job's other ranks: each told, and none
 * finalizes MPI (dt_impala_run calls it; once greeted, the actors are told their end as the run ends). */
void dt_rl_actors_abandon(dt_peers *peers);

/* V-trace (Espeholt et al. 2018, eq. 1, and the policy gradient's advantage of its section 4.2) over B columns of T
 * steps, each array [T][B] (values [T+1][B]: row T is the bootstrap, the value of the observation after the last
 * step): log_rho = log pi(a) - log mu(a) (the learner's policy against the actor's), the rewards, and the discount
 * gamma (0 where the step terminated; a truncated step keeps it and bootstraps from the next row's value). A row
 * with valid 0 is not a transition (next-step autoreset's reset step: what follows an episode's end): it gets
 * vs = V and advantage 0, and no correction flows back through it. Gives vs [T][B] and the advantages
 * rho_t (r_t + discount_t vs_{t+1} - V(x_t)) [T][B]; rho_t = min(rho_bar, pi/mu), c_t = min(c_bar, pi/mu). */
void dt_vtrace(int T, int B, float rho_bar, float c_bar, const float *log_rho, const float *values, const float *rewards,
               const float *discount, const uint8_t *valid, float *vs, float *pg_adv);

/* A policy --save wrote (of hidden width hidden) on episodes of env, each from reset(seed + k): the most likely
 * action at each step with greedy (a Gaussian's means), else one sampled; a continuous action clipped to the space;
 * observations normalised by the statistics saved with the policy (environment 0's at the end of training) when it
 * was trained with them. film (NULL: none): the first episode as an animated SVG (dt_env_film). */
typedef struct {
    const char *policy, *env;
    int hidden, episodes;
    uint64_t seed;
    int greedy;
    const char *film;
    const dt_env_bridge_config *bridge; /* a "gym:" environment's workers (NULL: the defaults) */
} dt_rl_eval_config;
/* returns and lengths: c->episodes each */
dt_status dt_rl_eval(const dt_rl_eval_config *c, double *returns, int *lengths);

/* dtrain rl --report DIR. Before the run (rank 0): makes DIR and points the metrics and the saved policy into it
 * (DIR/metrics.jsonl, DIR/policy.safetensors; metrics and policy hold cap bytes) unless the config names them. After
 * it: DIR/run.json (kind "rl": the command, the settings, the machine, the outcome), DIR/film.svg (the saved policy's
 * greedy episode from reset(seed)) and DIR/report.html (dt_report_write: the return curve, the losses, the film). */
dt_status dt_rl_report_prepare(const char *dir, dt_rl_config *c, char *metrics, char *policy, size_t cap);
dt_status dt_rl_report_write(const char *dir, const dt_rl_config *c, const dt_rl_result *r, int ranks, int argc, char **argv,
                             double wall_s);

#ifdef __cplusplus
}
#endif
#endif
