/* REINFORCE with a baseline (Williams 1992; Sutton and Barto, section 13.4):
 * each update rolls the pool out for T steps under the policy, takes the
 * episodes that began and ended inside the rollout, and steps on
 * - (G_t - V(s_t)) log pi(a_t | s_t) with G_t the discounted return to the
 * episode's end (Monte Carlo: nothing bootstrapped, a time limit ends the
 * return as a termination does) and V a learned baseline regressed on G_t.
 * An episode cut by the rollout's end, or begun under the previous update's
 * policy, is not a whole episode of this policy: its steps are left out. */
#include "dtrain/rl.h"
#include "pg_step.h"
#include "policy.h"
#include "progress.h"
#include "rl_state.h"
#include "rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPISODES_CAP 4096

typedef struct {
    const dt_rl_config *c;
    int N, T, od, ad, K;
    size_t rl;
    dt_env_pool *pool;
    dt_policy *pol;
    dt_engine *e;
    dt_rollout ro;
    dt_rl_progress prog;
    dt_pg_step step;
    float *rec;            /* [(T+1)][N][rec] */
    const float **recs;    /* [T][N] */
    float *adv, *ret, *rew;
    uint8_t *use, *done, *valid;
    dt_episode *eps;
    double used;           /* the fraction of this update's steps in whole episodes */
} reinforce;

void dt_reinforce_defaults(dt_rl_config *c, int continuous) {
    if (continuous) dt_ppo_defaults_continuous(c);
    else dt_ppo_defaults(c);
    c->algo = DT_RL_REINFORCE;
    c->num_envs = 4;
    c->num_steps = 512;
    c->minibatches = c->epochs = 1;
    c->lr = 1e-2f;
}

static const float *at(const reinforce *p, int t, int j) { return p->rec + ((size_t)t * p->N + j) * p->rl; }
static const float *fld(const reinforce *p, const float *r) { return r + p->od + p->ad; }

void dt_mc_returns(int T, int B, float gamma, const float *rewards, const uint8_t *done, const uint8_t *valid, int first_starts,
                   float *returns, uint8_t *use) {
    for (int b = 0; b < B; b++) {
        int started = first_starts, complete = 0;
        for (int t = 0; t < T; t++) { /* use[] first says whether the step's episode began inside the rollout */
            size_t k = (size_t)t * B + b;
            use[k] = started && valid[k];
            if (!valid[k]) started = 1; /* a reset step: the next step begins an episode */
        }
        double G = 0;
        for (int t = T - 1; t >= 0; t--) {
            size_t k = (size_t)t * B + b;
            if (!valid[k]) complete = 0;
            else if (done[k]) { complete = 1; G = 0; }
            G = rewards[k] + (double)gamma * G;
            use[k] = use[k] && complete;
            returns[k] = use[k] ? (float)G : 0;
        }
    }
}

/* The rollout's rows as dt_mc_returns reads them; the advantages over the rollout's values, normalised when asked. */
static void returns(reinforce *p, int first_update) {
    size_t rows = (size_t)p->T * p->N;
    for (size_t k = 0; k < rows; k++) {
        const float *r = at(p, (int)(k / p->N), (int)(k % p->N)), *f = fld(p, r);
        p->recs[k] = r;
        p->rew[k] = f[DT_RL_REW];
        p->done[k] = f[DT_RL_DONE] != 0;
        p->valid[k] = f[DT_RL_VALID] != 0;
    }
    dt_mc_returns(p->T, p->N, p->c->gamma, p->rew, p->done, p->valid, first_update, p->ret, p->use);
    int n = 0;
    double sum = 0, sq = 0;
    for (size_t k = 0; k < rows; k++) {
        p->adv[k] = p->use[k] ? p->ret[k] - fld(p, p->recs[k])[DT_RL_VAL] : 0;
        if (p->use[k]) { n++; sum += p->adv[k]; }
    }
    p->used = (double)n / (double)rows;
    if (!p->c->norm_adv || n < 2) return;
    double mean = sum / n;
    for (size_t k = 0; k < rows; k++)
        if (p->use[k]) sq += (p->adv[k] - mean) * (p->adv[k] - mean);
    double sd = sqrt(sq / (n - 1));
    for (size_t k = 0; k < rows; k++)
        if (p->use[k]) p->adv[k] = (float)((p->adv[k] - mean) / (sd + 1e-8));
}

static dt_status setup(reinforce *p, const dt_rl_config *c, dt_comm *comm) {
    p->c = c;
    if (comm && dt_comm_size(comm) > 1) return dt_error(DT_ERR_ARG, "reinforce: one process (--nproc is PPO's)");
    if (c->num_envs < 1 || c->num_steps < 1 || c->minibatches < 1 || c->epochs < 1 || c->hidden < 1 || c->total_steps < 1)
        return dt_error(DT_ERR_ARG, "reinforce: envs %d, steps %d, minibatches %d, epochs %d, hidden %d, total steps %lld: each must "
                        "be at least 1", c->num_envs, c->num_steps, c->minibatches, c->epochs, c->hidden, (long long)c->total_steps);
    p->N = c->num_envs;
    p->T = c->num_steps;
    dt_status st = dt_env_pool_create(c->env, p->N, 0, c->seed, c->bridge, &p->pool);
    if (st) return st;
    const dt_env_info *in = dt_env_pool_info(p->pool);
    p->od = in->obs_dim;
    p->ad = in->act_dim;
    p->K = in->actions ? in->actions : in->act_dim;
    p->rl = dt_rollout_rec_len(p->od, p->ad);
    if (!in->actions && p->ad > 32) return dt_error(DT_ERR_UNSUPPORTED, "reinforce: %s's actions of %d dimensions (at most 32)", in->id, p->ad);
    if (p->T <= in->max_steps)
        dt_log(DT_LOG_WARN, "reinforce: rollouts of %d steps are not longer than %s's episodes can be (%d): a long episode is "
               "never whole inside one and never learned from (--rollout-steps)", p->T, in->id, in->max_steps);
    size_t rows = (size_t)p->T * p->N;
    p->rec = malloc(sizeof(float) * (rows + (size_t)p->N) * p->rl);
    p->recs = malloc(sizeof(float *) * rows);
    p->adv = malloc(sizeof(float) * rows);
    p->ret = malloc(sizeof(float) * rows);
    p->rew = malloc(sizeof(float) * rows);
    p->use = malloc(rows);
    p->done = malloc(rows);
    p->valid = malloc(rows);
    p->eps = malloc(sizeof(dt_episode) * EPISODES_CAP);
    if (!p->rec || !p->recs || !p->adv || !p->ret || !p->rew || !p->use || !p->done || !p->valid || !p->eps)
        return dt_error(DT_ERR_NOMEM, "reinforce: out of memory for a rollout of %d x %d", p->T, p->N);
    if ((st = dt_policy_create(p->od, p->K, !in->actions, c->hidden, c->seed, &p->pol))) return st;
    if ((st = dt_policy_engine_create(p->pol, c, NULL, &p->e))) return st;
    if ((st = dt_pg_step_init(&p->step, c, p->pol, p->e, p->od, p->ad, (int)rows))) return st;
    if ((st = dt_rl_progress_open(&p->prog, c, 1))) return st;
    if (c->print_every) {
        printf("reinforce on %s: %d envs x %d steps a rollout, whole episodes only, %d epochs x %d minibatches an update, "
               "policy %d-%d-%d-%d%s and baseline %d-%d-%d-1 (%zu parameters), lr %g%s\n", in->id, p->N, p->T, c->epochs,
               c->minibatches, p->od, c->hidden, c->hidden, p->K, in->actions ? "" : " (Gaussian)", p->od, c->hidden, c->hidden,
               dt_policy_num_params(p->pol), (double)c->lr, c->anneal_lr ? " annealed to 0" : "");
        fflush(stdout);
    }
    return dt_rollout_init(&p->ro, c, p->pool, p->pol, 0, p->T);
}

static void teardown(reinforce *p) {
    dt_rl_progress_close(&p->prog);
    dt_pg_step_free(&p->step);
    dt_rollout_free(&p->ro);
    dt_engine_destroy(p->e);
    dt_policy_destroy(p->pol);
    dt_env_pool_destroy(p->pool);
    void *b[] = { p->rec, (void *)p->recs, p->adv, p->ret, p->rew, p->use, p->done, p->valid, p->eps };
    for (size_t i = 0; i < sizeof b / sizeof b[0]; i++) free(b[i]);
}

static dt_rl_learner learner_of(reinforce *p) {
    return (dt_rl_learner){ .c = p->c, .P = 1, .ro = &p->ro, .pol = p->pol, .opt = dt_engine_optim(p->e), .prog = &p->prog };
}

static dt_rl_result so_far(const reinforce *p, int updates, int64_t steps, double loss, double t0) {
    return (dt_rl_result){ .env_steps = steps, .updates = updates, .episodes = (int)p->prog.episodes,
                           .mean_return = dt_rl_progress_mean(&p->prog), .loss = loss, .terms = p->step.terms,
                           .steps_per_s = steps / (dt_time_now() - t0) };
}

dt_status dt_reinforce_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *res) {
    reinforce p = { 0 };
    dt_status st = setup(&p, c, comm);
    int64_t per_update = (int64_t)c->num_envs * c->num_steps, steps = 0;
    int updates = st ? 0 : dt_rl_whole_updates("reinforce", c->total_steps, per_update, 1), u = 0;
    if (!st && updates < 1)
        st = dt_error(DT_ERR_ARG, "reinforce: --total-steps %lld is less than one rollout (%d envs x %d steps)",
                      (long long)c->total_steps, p.N, p.T);
    double t0 = dt_time_now(), loss = 0;
    int u0 = 0;
    dt_rl_learner l = st ? (dt_rl_learner){ 0 } : learner_of(&p);
    if (!st) st = dt_rl_resume_run(&l, updates, &u0, &steps);
    int64_t steps0 = steps;
    for (u = u0 + 1; !st && u <= updates; u++) {
        float lr = c->anneal_lr ? (float)(1.0 - (double)(u - 1) / updates) * c->lr : c->lr;
        if ((st = dt_rollout_run(&p.ro, (int64_t)(u - 1) * p.T, p.rec))) break;
        int n = dt_env_pool_episodes(p.pool, p.eps, EPISODES_CAP);
        dt_rl_progress_add(&p.prog, p.eps, n);
        returns(&p, u == 1);
        if ((st = dt_pg_step_run(&p.step, p.T * p.N, p.recs, p.adv, p.ret, p.use, u, lr, &loss))) break;
        steps += per_update;
        dt_rl_terms t = p.step.terms;
        t.clipfrac = 1 - p.used; /* reported as the fraction of steps left out (not in a whole episode) */
        dt_rl_progress_update(&p.prog, u, updates, steps, loss, &t, lr, (double)(steps - steps0) / (dt_time_now() - t0), NAN);
        if (after_update) {
            dt_rl_result r = so_far(&p, u, steps, loss, t0);
            after_update(&r, dt_policy_params(p.pol), dt_policy_num_params(p.pol), ctx);
        }
        if (c->save && c->save_every && u % c->save_every == 0 && u < updates) st = dt_rl_save_run(&l, u, steps);
    }
    if (!st && c->save) st = dt_rl_save_run(&l, u - 1, steps);
    if (res) *res = so_far(&p, u - 1, steps, loss, t0);
    teardown(&p);
    return st;
}
