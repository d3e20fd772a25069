/* IMPALA's learner (see rl.h): batches of the actors' rollouts, V-trace
 * targets and advantages from the learner's policy at the batch, minibatch
 * steps through the engine, the weights published every `refresh` updates. */
#include "dtrain/engine.h"
#include "dtrain/rl.h"
#include "actors.h"
#include "distribution.h"
#include "env_internal.h"
#include "pg_step.h"
#include "policy.h"
#include "progress.h"
#include "rl_state.h"
#include "rollout.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const dt_rl_config *c;
    int A, n, T, od, ad, K, continuous, nb, B; /* nb: rollouts in this batch; B = nb * n columns */
    size_t rl;
    dt_policy *pol;
    dt_engine *e;
    dt_rl_actors *act;
    dt_rl_progress prog;
    float *all;            /* the batch: [A][(T+1)][n][rec], blocks 0 .. nb - 1 */
    int64_t *versions;     /* each block's weights */
    float *obs, *log_rho, *values, *rewards, *discount, *vs, *adv; /* [(T+1) x B] rows, [t][b] */
    uint8_t *valid;
    const float **recs;    /* row k = t B + b's record */
    dt_pg_step step;
    dt_rl_terms terms, batch_terms; /* batch_terms: the pre-pass's kl and clip fraction */
    dt_episode *eps;
    int neps;
    double *obs_mean, *obs_var;
    int have_stats;
    /* the run's state (rl_state.h): kept from each slot taken when --save writes one (keep_state), read by --resume */
    int keep_state, u0;
    int64_t steps0;
    char env_id[256];
    dt_rl_actor_state as;
    dt_rl_learner l;
    int met_actors; /* dt_rl_actors_create was called */
} impala;

void dt_impala_defaults(dt_rl_config *c, int continuous) {
    if (continuous) dt_ppo_defaults_continuous(c);
    else dt_ppo_defaults(c);
    c->algo = DT_RL_IMPALA;
    c->actors = 2;
    c->num_envs = 16;
    c->num_steps = 32;
    c->minibatches = 4;
    c->epochs = 1;
    c->lr = 1e-3f;
    c->refresh = 1;
    c->rho_bar = c->c_bar = 1;
}

/* column b's record of step t */
static const float *rec(const impala *p, int t, int b) {
    int blk = b / p->n, j = b % p->n;
    return p->all + (((size_t)blk * (p->T + 1) + t) * p->n + j) * p->rl;
}
static const float *fld(const impala *p, const float *r) { return r + p->od + p->ad; }

static dt_status alloc_buffers(impala *p) {
    size_t Bm = (size_t)p->A * p->n, rows = (size_t)(p->T + 1) * Bm;
    p->all = malloc(sizeof(float) * rows * p->rl);
    p->versions = malloc(sizeof(int64_t) * (size_t)p->A);
    p->obs = malloc(sizeof(float) * rows * p->od);
    float **f[] = { &p->log_rho, &p->values, &p->rewards, &p->discount, &p->vs, &p->adv };
    int ok = 1;
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) ok &= (*f[i] = malloc(sizeof(float) * rows)) != NULL;
    p->valid = malloc(rows);
    p->recs = malloc(sizeof(float *) * rows);
    p->eps = malloc(sizeof(dt_episode) * (size_t)p->A * DT_ACTOR_EPISODES);
    p->obs_mean = calloc((size_t)p->od, sizeof(double));
    p->obs_var = calloc((size_t)p->od, sizeof(double));
    size_t erec = dt_rollout_env_len_of(p->od, p->c->norm_obs, p->c->norm_reward);
    p->as = (dt_rl_actor_state){ .env_id = p->env_id, .actors = p->A, .env_rec = erec, .rollouts = calloc((size_t)p->A, sizeof(int64_t)),
                                 .pool_steps = calloc((size_t)p->A, sizeof(int64_t)),
                                 .records = calloc(Bm * erec + 1, sizeof(double)),
                                 .published = malloc(sizeof(float) * dt_policy_num_params(p->pol)) };
    ok &= p->as.rollouts && p->as.pool_steps && p->as.records && p->as.published;
    if (!ok || !p->all || !p->versions || !p->obs || !p->valid || !p->recs || !p->eps || !p->obs_mean || !p->obs_var)
        return dt_error(DT_ERR_NOMEM, "impala: out of memory for batches of %d x %zu", p->T, Bm);
    return dt_pg_step_init(&p->step, p->c, p->pol, p->e, p->od, p->ad, p->T * (int)Bm);
}

static void free_buffers(impala *p) {
    dt_pg_step_free(&p->step);
    void *b[] = { p->all, p->versions, p->obs, p->log_rho, p->values, p->rewards, p->discount, p->vs, p->adv, p->valid,
                  (void *)p->recs, p->eps, p->obs_mean, p->obs_var, p->as.rollouts, p->as.pool_steps, p->as.records, p->as.published };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
}

/* A rollout an actor handed over, into block nb of the batch (the slot is free again at once). */
static void keep(impala *p, int actor, dt_actor_slot *s) {
    dt_actor_shared *h = dt_rl_actors_shared(p->act);
    size_t len = (size_t)(p->T + 1) * p->n * p->rl;
    memcpy(p->all + (size_t)p->nb * len, dt_actor_slot_records(h, s), sizeof(float) * len);
    p->versions[p->nb++] = s->version;
    if (p->keep_state) { /* where this actor would go on from */
        size_t n = (size_t)p->n * p->as.env_rec;
        memcpy(p->as.records + (size_t)actor * n, dt_actor_slot_envs(h, s), sizeof(double) * n);
        p->as.rollouts[actor] = s->rollout + 1;
        p->as.pool_steps[actor] = s->pool_steps;
    }
    memcpy(p->eps + p->neps, s->ep, sizeof(dt_episode) * (size_t)s->episodes);
    p->neps += s->episodes;
    if (s->dropped) dt_log(DT_LOG_WARN, "impala: %d episodes of actor %d not counted (more than %d ended in a rollout)", s->dropped,
                           actor, DT_ACTOR_EPISODES);
    if (actor == 0 && h->norm_obs) { /* environment 0's statistics, for --save */
        memcpy(p->obs_mean, dt_actor_slot_stats(s), sizeof(double) * (size_t)p->od);
        memcpy(p->obs_var, dt_actor_slot_stats(s) + p->od, sizeof(double) * (size_t)p->od);
        p->have_stats = 1;
    }
    dt_rl_actors_release(p->act, actor);
}

/* sync: each live actor's next rollout, in order; else the first ready, as many as there are live actors. */
static dt_status take_batch(impala *p) {
    p->nb = p->neps = 0;
    int want = dt_rl_actors_live(p->act);
    for (int k = 0; k < (p->c->sync ? p->A : want); k++) {
        int actor;
        dt_actor_slot *s;
        if (p->c->sync && !dt_rl_actors_alive(p->act, k)) continue;
        dt_status st = dt_rl_actors_take(p->act, p->c->sync ? k : -1, &actor, &s);
        if (st) return st;
        if (s) keep(p, actor, s);
    }
    p->B = p->nb * p->n;
    if (!p->nb) return dt_error(DT_ERR_PEER, "impala: every actor is gone (said above)");
    dt_rl_progress_add(&p->prog, p->eps, p->neps);
    return DT_OK;
}

/* The learner's policy over the whole batch: V-trace's inputs, then its targets and advantages; the importance
 * weights' KL estimate and the fraction truncated at rho_bar. */
static dt_status targets(impala *p) {
    int rows = (p->T + 1) * p->B;
    for (int t = 0; t <= p->T; t++)
        for (int b = 0; b < p->B; b++) memcpy(p->obs + ((size_t)t * p->B + b) * p->od, rec(p, t, b), sizeof(float) * (size_t)p->od);
    const float *z, *v;
    dt_status st = dt_policy_forward(p->pol, p->obs, rows, &z, &v);
    if (st) return st;
    const float *ls = dt_policy_logstd(p->pol);
    double kl = 0, clipped = 0;
    int nvalid = 0;
    for (int t = 0; t <= p->T; t++)
        for (int b = 0; b < p->B; b++) {
            size_t k = (size_t)t * p->B + b;
            p->values[k] = v[k];
            if (t == p->T) continue;
            p->recs[k] = rec(p, t, b);
            const float *r = rec(p, t, b), *f = fld(p, r), *a = r + p->od, *zk = z + k * p->K;
            double logp = p->continuous ? dt_rl_gaussian(zk, ls, p->K, a, NULL) : dt_rl_categorical(zk, p->K, (int)a[0], NULL);
            p->valid[k] = f[DT_RL_VALID] != 0;
            p->log_rho[k] = p->valid[k] ? (float)(logp - f[DT_RL_LOGP]) : 0;
            p->rewards[k] = f[DT_RL_REW];
            p->discount[k] = p->c->gamma * (1 - f[DT_RL_TERM]);
            if (!p->valid[k]) continue;
            double lr = p->log_rho[k];
            kl += (exp(lr) - 1) - lr;
            clipped += exp(lr) > p->c->rho_bar * (1 + 1e-5); /* not the float rounding of two equal log probabilities */
            nvalid++;
        }
    dt_vtrace(p->T, p->B, p->c->rho_bar, p->c->c_bar, p->log_rho, p->values, p->rewards, p->discount, p->valid, p->vs, p->adv);
    p->batch_terms = (dt_rl_terms){ .approx_kl = nvalid ? kl / nvalid : 0, .clipfrac = nvalid ? clipped / nvalid : 0 };
    return DT_OK;
}

static dt_status update(impala *p, int u, float lr, double *loss) {
    dt_status st = dt_pg_step_run(&p->step, p->T * p->B, p->recs, p->adv, p->vs, p->valid, u, lr, loss);
    p->terms = p->step.terms;
    p->terms.approx_kl = p->batch_terms.approx_kl;
    p->terms.clipfrac = p->batch_terms.clipfrac;
    return st;
}

static dt_status check(const dt_rl_config *c, dt_comm *comm) {
    if (comm && dt_comm_size(comm) > 1)
        return dt_error(DT_ERR_ARG, "impala: the learner is one process that starts its actors (--actors N); --nproc is PPO's");
    if (c->actors < 1 || c->num_envs < 1 || c->num_steps < 1 || c->minibatches < 1 || c->epochs < 1 || c->hidden < 1 ||
        c->refresh < 1 || c->total_steps < 1)
        return dt_error(DT_ERR_ARG, "impala: actors %d, envs %d, steps %d, minibatches %d, epochs %d, hidden %d, refresh %d, total "
                        "steps %lld: each must be at least 1", c->actors, c->num_envs, c->num_steps, c->minibatches, c->epochs,
                        c->hidden, c->refresh, (long long)c->total_steps);
    if (c->num_envs % c->actors)
        return dt_error(DT_ERR_ARG, "impala: %d environments do not split evenly over %d actors (give --envs a multiple of %d)",
                        c->num_envs, c->actors, c->actors);
    int batch;
    dt_status st = c->async_threads ? dt_rollout_async_batch(c, c->num_envs / c->actors, "impala", "an actor's", &batch) : DT_OK;
    if (st) return st;
    if (!(c->rho_bar > 0) || !(c->c_bar > 0))
        return dt_error(DT_ERR_ARG, "impala: rho_bar %g and c_bar %g must be above 0", (double)c->rho_bar, (double)c->c_bar);
    if (c->num_steps * c->num_envs < c->minibatches)
        return dt_error(DT_ERR_ARG, "impala: %d minibatches of a batch of %d transitions", c->minibatches, c->num_steps * c->num_envs);
    return DT_OK;
}

/* The weights of update u to the actors, kept for a run state. */
static void publish(impala *p, const float *w, int64_t u) {
    dt_rl_actors_publish(p->act, w, u);
    memcpy(p->as.published, w, sizeof(float) * dt_policy_num_params(p->pol));
    p->as.version = u;
}

/* --resume's state taken, and whether slots carry the environments for --save's (refused or said where an environment
 * cannot be saved, as PPO's: rl_state.c); one: an environment of the kind. */
static dt_status take_state(impala *p, dt_env_pool *one) {
    const dt_rl_config *c = p->c;
    snprintf(p->env_id, sizeof p->env_id, "%s", dt_env_pool_info(one)->id);
    p->keep_state = c->save && !dt_env_pool_unsaveable(one);
    p->l = (dt_rl_learner){ .c = c, .P = 1, .pool = one, .pol = p->pol, .opt = dt_engine_optim(p->e), .prog = &p->prog, .actors = &p->as };
    /* the run ends by its steps (an update's are fewer once an actor is gone): what is left is counted so */
    dt_status st = dt_rl_resume_run(&p->l, INT_MAX, &p->u0, &p->steps0);
    p->l.pool = NULL; /* it ends with setup: the actors' environments are in p->as */
    if (!st && c->resume && p->steps0 >= c->total_steps)
        st = dt_error(DT_ERR_ARG, "%s is at update %d, %lld environment steps (--total-steps %lld): nothing left to train", c->resume, p->u0,
                      (long long)p->steps0, (long long)c->total_steps);
    return st;
}

static dt_status setup(impala *p, const dt_rl_config *c, dt_comm *comm) {
    p->c = c;
    dt_status st = check(c, comm);
    if (st) return st;
    p->A = c->actors;
    p->n = c->num_envs / c->actors;
    p->T = c->num_steps;
    dt_env_pool *one = NULL; /* the spaces, from one environment of the kind */
    dt_env_bridge_config b1 = { .python = c->bridge ? c->bridge->python : NULL, .workers = 1 };
    if ((st = dt_env_pool_create(c->env, 1, 0, c->seed, &b1, &one))) return st;
    dt_env_info in = *dt_env_pool_info(one);
    p->continuous = !in.actions;
    p->od = in.obs_dim;
    p->ad = in.act_dim;
    p->K = p->continuous ? in.act_dim : in.actions;
    p->rl = dt_rollout_rec_len(p->od, p->ad);
    if (p->continuous && p->ad > 32)
        st = dt_error(DT_ERR_UNSUPPORTED, "impala: %s's actions of %d dimensions (at most 32)", in.id, p->ad);
    if (!st) st = dt_policy_create(p->od, p->K, p->continuous, c->hidden, c->seed, &p->pol);
    if (!st) st = dt_policy_engine_create(p->pol, c, NULL, &p->e);
    if (!st) st = alloc_buffers(p);
    if (!st) st = dt_rl_progress_open(&p->prog, c, 1);
    if (!st && c->print_every) {
        printf("impala on %s: %d actors x %d envs x %d steps an unroll, %s batches of %d epochs x %d minibatches, weights to the "
               "actors every %d update%s, V-trace rho_bar %g c_bar %g, policy %d-%d-%d-%d%s and value %d-%d-%d-1 (%zu parameters), "
               "lr %g%s\n", in.id, p->A, p->n, p->T, c->sync ? "synchronous" : "asynchronous", c->epochs, c->minibatches,
               c->refresh, c->refresh == 1 ? "" : "s", (double)c->rho_bar, (double)c->c_bar, p->od, c->hidden, c->hidden, p->K,
               p->continuous ? " (Gaussian)" : "", p->od, c->hidden, c->hidden, dt_policy_num_params(p->pol), (double)c->lr,
               c->anneal_lr ? " annealed to 0" : "");
        fflush(stdout);
    }
    if (!st) st = take_state(p, one);
    dt_actors_start from = { p->as.rollouts, p->as.pool_steps, p->as.records };
    p->met_actors = !st; /* from here the actors module tells actors on other ranks how the run ends */
    if (!st) st = dt_rl_actors_create(c, &in, p->K, dt_policy_num_params(p->pol), p->keep_state, p->c->resume ? &from : NULL, &p->act);
    dt_env_pool_destroy(one);
    if (!st) publish(p, c->resume ? p->as.published : dt_policy_params(p->pol), c->resume ? p->as.version : 0);
    return st;
}

static void teardown(impala *p) {
    dt_rl_actors_destroy(p->act);
    dt_rl_progress_close(&p->prog);
    dt_engine_destroy(p->e);
    dt_policy_destroy(p->pol);
    free_buffers(p);
}

/* the run after `updates` updates and `steps` environment steps (this process's since t0 for the speed) */
static dt_rl_result so_far(const impala *p, int updates, int64_t steps, double loss, double t0) {
    return (dt_rl_result){ .env_steps = steps, .updates = updates, .episodes = (int)p->prog.episodes,
                           .mean_return = dt_rl_progress_mean(&p->prog), .loss = loss, .terms = p->terms,
                           .steps_per_s = (steps - p->steps0) / (dt_time_now() - t0) };
}

/* --save: the policy (environment 0's observation statistics with it) and, where the environments can be saved, the run's
 * state beside it (FILE.state). */
static dt_status save(impala *p, int u, int64_t steps) {
    dt_status st = dt_policy_save(p->pol, p->c->save, p->od, p->have_stats ? p->obs_mean : NULL, p->have_stats ? p->obs_var : NULL);
    if (st || !p->keep_state) return st;
    char path[4200];
    snprintf(path, sizeof path, "%s.state", p->c->save);
    return dt_rl_state_save(&p->l, path, u, steps);
}

dt_status dt_impala_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *res) {
    impala p = { 0 };
    int64_t per_update = (int64_t)c->num_envs * c->num_steps;
    int updates = (int)((c->total_steps + per_update - 1) / per_update);
    dt_status st = setup(&p, c, comm);
    if (st && c->peers && !p.met_actors) dt_rl_actors_abandon(c->peers); /* actors on other ranks wait for settings */
    int u = p.u0; /* (0 where setup failed) */
    int64_t steps = p.steps0;
    double t0 = dt_time_now(), loss = 0;
    while (!st && steps < c->total_steps) {
        float lr = c->anneal_lr ? (float)(1.0 - (double)steps / c->total_steps) * c->lr : c->lr;
        if ((st = take_batch(&p)) || (st = targets(&p)) || (st = update(&p, ++u, lr, &loss))) break;
        if (u % c->refresh == 0) publish(&p, dt_policy_params(p.pol), u);
        double lag = 0;
        for (int b = 0; b < p.nb; b++) lag += (double)(u - 1 - p.versions[b]) / p.nb;
        steps += (int64_t)p.nb * p.n * p.T;
        dt_rl_progress_update(&p.prog, u, updates, steps, loss, &p.terms, lr, (steps - p.steps0) / (dt_time_now() - t0), lag);
        if (after_update) {
            dt_rl_result r = so_far(&p, u, steps, loss, t0);
            after_update(&r, dt_policy_params(p.pol), dt_policy_num_params(p.pol), ctx);
        }
        if (c->save && c->save_every && u % c->save_every == 0 && steps < c->total_steps) st = save(&p, u, steps);
    }
    if (!st && c->save) st = save(&p, u, steps);
    if (res) *res = so_far(&p, u, steps, loss, t0);
    teardown(&p);
    return st;
}
