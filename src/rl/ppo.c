/* PPO (see rl.h): rollouts from this rank's share of the environments,
 * gathered so that every rank holds the whole batch; GAE; minibatch epochs
 * whose gradients the engine averages over the ranks and applies. */
#include "dtrain/engine.h"
#include "dtrain/io.h"
#include "dtrain/rl.h"
#include "policy.h"
#include "progress.h"
#include "rl_state.h"
#include "rollout.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EPISODES_SENT 1024 /* a rank's finished episodes an update (more: the oldest are dropped, said) */

typedef struct {
    const dt_rl_config *c;
    dt_comm *comm;
    int rank, P, N, n, T, od, ad, K, mb; /* K: the policy's outputs (actions, or the action's dimensions) */
    int continuous;
    dt_env_pool *pool;         /* this rank's environments: a synchronous pool, */
    dt_env_pool_async *apool;  /* or (--async) an asynchronous one */
    dt_policy *pol;
    dt_engine *e;
    dt_rollout ro;
    float *rec, *all;          /* this rank's rollout [(T+1)][n][rec], every rank's [P][(T+1)][n][rec] */
    float *adv, *ret;          /* [T][N] */
    int *perm;
    float *mb_obs, *mb_w, *mb_adv, *mb_act, *mb_logp, *mb_oldv, *mb_ret, *mb_scaled, *dlogits, *dvalues, *dlogstd;
    int mb_rows;               /* this rank's rows of the minibatch */
    dt_rl_terms terms;
    dt_rl_progress prog;
    double *ep_send, *ep_all;
} ppo;

void dt_ppo_defaults(dt_rl_config *c) {
    *c = (dt_rl_config){ .env = "cartpole", .num_envs = 4, .num_steps = 128, .total_steps = 500000, .lr = 2.5e-4f,
                          .anneal_lr = 1, .gamma = 0.99f, .gae_lambda = 0.95f, .minibatches = 4, .epochs = 4, .norm_adv = 1,
                          .clip_vloss = 1, .clip_coef = 0.2f, .ent_coef = 0.01f, .vf_coef = 0.5f, .max_grad_norm = 0.5f,
                          .hidden = 64, .seed = 1, .print_every = 10 };
}

void dt_ppo_defaults_continuous(dt_rl_config *c) {
    dt_ppo_defaults(c);
    c->env = "pendulum";
    c->num_envs = 1;
    c->num_steps = 2048;
    c->total_steps = 1000000;
    c->lr = 3e-4f;
    c->minibatches = 32;
    c->epochs = 10;
    c->ent_coef = 0;
    c->norm_obs = c->norm_reward = 1;
}

static size_t rec_len(const ppo *p) { return dt_rollout_rec_len(p->od, p->ad); }
static const float *cfields(const ppo *p, const float *r) { return r + p->od + p->ad; }
/* global env i's row of step t in the gathered rollout */
static const float *row(const ppo *p, int t, int i) {
    int r = i / p->n, j = i % p->n;
    return p->all + (((size_t)r * (p->T + 1) + t) * p->n + j) * rec_len(p);
}

static dt_status rollout(ppo *p, int64_t step0) {
    dt_status st = dt_rollout_run(&p->ro, step0, p->rec);
    size_t len = (size_t)(p->T + 1) * p->n * rec_len(p);
    if (st || p->P == 1) { if (!st) memcpy(p->all, p->rec, len * sizeof(float)); return st; }
    return dt_comm_allgather(p->comm, p->rec, p->all, len, DT_F32);
}

/* GAE (Schulman et al. 2016), per environment backwards in time. A step
 * after an episode's end (a reset, not a transition) gets no advantage; a
 * truncated episode is bootstrapped from its last observation's value,
 * which is the next row's (that reset step's observation). */
static void advantages(ppo *p) {
    const double g = p->c->gamma, lam = p->c->gae_lambda;
    for (int i = 0; i < p->N; i++) {
        double last = 0;
        for (int t = p->T - 1; t >= 0; t--) {
            const float *f = cfields(p, row(p, t, i)), *nf = cfields(p, row(p, t + 1, i));
            double boot = 1 - f[DT_RL_TERM], carry = 1 - f[DT_RL_DONE];
            double delta = f[DT_RL_REW] + g * nf[DT_RL_VAL] * boot - f[DT_RL_VAL];
            last = delta + g * lam * carry * last;
            size_t k = (size_t)t * p->N + i;
            p->adv[k] = f[DT_RL_VALID] ? (float)last : 0;
            if (!f[DT_RL_VALID]) last = 0; /* nothing flows back from a row that is not a transition */
            p->ret[k] = p->adv[k] + f[DT_RL_VAL];
        }
    }
}

/* Minibatch idx[0..mb): this rank's rows (its P-th of them), what the loss reads of them, their weights and
 * normalised advantages. */
static void prepare_minibatch(ppo *p, const int *idx) {
    double sum = 0, sq = 0;
    int valid = 0;
    for (int i = 0; i < p->mb; i++) {
        int k = idx[i];
        if (!cfields(p, row(p, k / p->N, k % p->N))[DT_RL_VALID]) continue;
        sum += p->adv[k];
        valid++;
    }
    double mean = valid ? sum / valid : 0;
    for (int i = 0; i < p->mb; i++) {
        int k = idx[i];
        if (cfields(p, row(p, k / p->N, k % p->N))[DT_RL_VALID]) sq += (p->adv[k] - mean) * (p->adv[k] - mean);
    }
    double sd = valid > 1 ? sqrt(sq / (valid - 1)) : 0; /* torch's std: unbiased */
    int first = p->rank * p->mb_rows;
    for (int i = 0; i < p->mb_rows; i++) {
        int k = idx[first + i], t = k / p->N, e = k % p->N;
        const float *r = row(p, t, e), *f = cfields(p, r);
        memcpy(p->mb_obs + (size_t)i * p->od, r, sizeof(float) * (size_t)p->od);
        memcpy(p->mb_act + (size_t)i * p->ad, r + p->od, sizeof(float) * (size_t)p->ad);
        p->mb_logp[i] = f[DT_RL_LOGP];
        p->mb_oldv[i] = f[DT_RL_VAL];
        p->mb_ret[i] = p->ret[k];
        int v = f[DT_RL_VALID] != 0;
        p->mb_w[i] = v ? (float)p->P / (float)valid : 0; /* the engine averages the ranks' gradients */
        p->mb_adv[i] = p->c->norm_adv ? (float)((p->adv[k] - mean) / (sd + 1e-8)) : p->adv[k];
    }
}

static dt_status micro(void *ctx, int m, float grad_scale, float *loss) {
    (void)m;
    ppo *p = ctx;
    const float *logits, *values;
    dt_status st = dt_policy_forward(p->pol, p->mb_obs, p->mb_rows, &logits, &values);
    if (st) return st;
    int B = p->mb_rows;
    for (int i = 0; i < B; i++) p->mb_scaled[i] = p->mb_w[i] * grad_scale;
    dt_rl_terms t = { 0 };
    memset(p->dlogstd, 0, sizeof(float) * (size_t)p->K);
    dt_ppo_loss(p->c, B, p->K, dt_policy_logstd(p->pol), logits, values, p->mb_act, p->mb_logp, p->mb_oldv, p->mb_adv, p->mb_ret,
                p->mb_scaled, p->dlogits, p->dlogstd, p->dvalues, &t);
    p->terms.pg += t.pg;
    p->terms.v += t.v;
    p->terms.entropy += t.entropy;
    p->terms.approx_kl += t.approx_kl;
    p->terms.clipfrac += t.clipfrac;
    *loss = (float)t.loss;
    return dt_policy_backward(p->pol, p->dlogits, p->dvalues, p->dlogstd);
}

static dt_status update(ppo *p, int u, float lr, double *loss) {
    int B = p->T * p->N;
    memset(&p->terms, 0, sizeof p->terms);
    *loss = 0;
    for (int ep = 0; ep < p->c->epochs; ep++) {
        dt_rng_shuffle(p->perm, B, p->c->seed * 0x9e3779b97f4a7c15ull ^ ((uint64_t)u * 64 + (uint64_t)ep + 1) * 0x632be59bd9b4e019ull);
        for (int s = 0; s < p->c->minibatches; s++) {
            prepare_minibatch(p, p->perm + (size_t)s * p->mb);
            dt_step_result r;
            dt_status st = dt_engine_step(p->e, 1, lr, micro, p, 0, &r);
            if (st) return st;
            *loss += r.loss;
        }
    }
    *loss /= p->c->epochs * p->c->minibatches;
    return DT_OK;
}

/* Every rank's episodes that ended in this rollout, in order of (step, env) as one pool would list them. */
static dt_status gather_episodes(ppo *p, int *dropped) {
    dt_episode ep[EPISODES_SENT];
    int n = dt_rollout_episodes(&p->ro, ep, EPISODES_SENT);
    *dropped = 0;
    dt_episode extra;
    while (dt_rollout_episodes(&p->ro, &extra, 1)) (*dropped)++;
    size_t len = 1 + 4 * (size_t)EPISODES_SENT;
    p->ep_send[0] = n;
    for (int i = 0; i < n; i++) {
        double *d = p->ep_send + 1 + 4 * i;
        d[0] = ep[i].ret;
        d[1] = ep[i].len;
        d[2] = ep[i].env;
        d[3] = (double)ep[i].step;
    }
    if (p->P > 1) {
        dt_status st = dt_comm_allgather(p->comm, p->ep_send, p->ep_all, len, DT_F64);
        if (st) return st;
    } else memcpy(p->ep_all, p->ep_send, len * sizeof(double));
    int total = 0;
    double *list = p->ep_send; /* reused: this rank's copy is in ep_all now */
    for (int r = 0; r < p->P; r++) {
        const double *b = p->ep_all + (size_t)r * len;
        memmove(list + 4 * (size_t)total, b + 1, sizeof(double) * 4 * (size_t)b[0]);
        total += (int)b[0];
    }
    dt_episode *eps = (dt_episode *)p->ep_all; /* in place: an episode takes no more room than its 4 doubles */
    for (int i = 0; i < total; i++)
        eps[i] = (dt_episode){ .ret = list[4 * i], .len = (int)list[4 * i + 1], .env = (int)list[4 * i + 2],
                               .step = (int64_t)list[4 * i + 3] };
    dt_rl_progress_add(&p->prog, eps, total);
    return DT_OK;
}

/* The rollout's, the minibatch's and the episodes' buffers (teardown frees them). */
static dt_status alloc_buffers(ppo *p) {
    int B = p->T * p->N;
    size_t rl = rec_len(p), roll = (size_t)(p->T + 1) * p->n * rl;
    p->rec = malloc(roll * sizeof(float));
    p->all = malloc(roll * p->P * sizeof(float));
    p->mb_act = malloc(sizeof(float) * (size_t)p->mb_rows * p->ad);
    p->dlogstd = malloc(sizeof(float) * (size_t)p->K);
    p->adv = malloc(sizeof(float) * (size_t)B);
    p->ret = malloc(sizeof(float) * (size_t)B);
    p->perm = malloc(sizeof(int) * (size_t)B);
    p->mb_obs = malloc(sizeof(float) * (size_t)p->mb_rows * p->od);
    p->dlogits = malloc(sizeof(float) * (size_t)p->mb_rows * p->K);
    float **v[] = { &p->mb_w, &p->mb_adv, &p->mb_logp, &p->mb_oldv, &p->mb_ret, &p->mb_scaled, &p->dvalues };
    int ok = 1;
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) ok &= (*v[i] = malloc(sizeof(float) * (size_t)p->mb_rows)) != NULL;
    p->ep_send = malloc(sizeof(double) * (1 + 4 * (size_t)EPISODES_SENT) * (size_t)p->P);
    p->ep_all = malloc(sizeof(double) * (1 + 4 * (size_t)EPISODES_SENT) * (size_t)p->P);
    if (!ok || !p->rec || !p->all || !p->adv || !p->ret || !p->perm || !p->mb_obs || !p->mb_act || !p->dlogits || !p->dlogstd || !p->ep_send || !p->ep_all)
        return dt_error(DT_ERR_NOMEM, "ppo: out of memory for a rollout of %d x %d", p->T, p->N);
    return DT_OK;
}

static dt_status setup(ppo *p, const dt_rl_config *c, dt_comm *comm) {
    p->c = c;
    p->comm = comm;
    p->rank = comm ? dt_comm_rank(comm) : 0;
    p->P = comm ? dt_comm_size(comm) : 1;
    p->N = c->num_envs;
    p->T = c->num_steps;
    if (c->num_envs < 1 || c->num_steps < 1 || c->minibatches < 1 || c->epochs < 1 || c->hidden < 1 || c->total_steps < 1)
        return dt_error(DT_ERR_ARG, "ppo: envs %d, steps %d, minibatches %d, epochs %d, hidden %d, total steps %lld: each must be "
                        "at least 1", c->num_envs, c->num_steps, c->minibatches, c->epochs, c->hidden, (long long)c->total_steps);
    if (p->N % p->P)
        return dt_error(DT_ERR_ARG, "ppo: %d environments do not split evenly over %d ranks (give --envs a multiple of %d)", p->N,
                        p->P, p->P);
    int B = p->T * p->N;
    if (B % c->minibatches || (B / c->minibatches) % p->P)
        return dt_error(DT_ERR_ARG, "ppo: a rollout of %d envs x %d steps = %d transitions does not split into %d minibatches of a "
                        "multiple of %d ranks", p->N, p->T, B, c->minibatches, p->P);
    p->n = p->N / p->P;
    p->mb = B / c->minibatches;
    p->mb_rows = p->mb / p->P;
    int batch = 0;
    dt_status st = c->async_threads ? dt_rollout_async_batch(c, p->n, "ppo", "a rank's", &batch) : DT_OK;
    if (st) return st;
    st = c->async_threads ? dt_env_pool_async_create(c->env, p->n, p->rank * p->n, c->seed, c->async_threads, batch, &p->apool)
                                    : dt_env_pool_create(c->env, p->n, p->rank * p->n, c->seed, c->bridge, &p->pool);
    if (st) return st;
    const dt_env_info *in = p->apool ? dt_env_pool_async_info(p->apool) : dt_env_pool_info(p->pool);
    p->continuous = !in->actions;
    p->od = in->obs_dim;
    p->ad = in->act_dim;
    p->K = p->continuous ? in->act_dim : in->actions;
    if (p->continuous && p->ad > 32)
        return dt_error(DT_ERR_UNSUPPORTED, "ppo: %s's actions of %d dimensions (at most 32)", in->id, p->ad);
    if ((st = dt_policy_create(p->od, p->K, p->continuous, c->hidden, c->seed, &p->pol))) return st;
    if ((st = dt_policy_engine_create(p->pol, c, p->P > 1 ? comm : NULL, &p->e))) return st;
    if ((st = alloc_buffers(p))) return st;
    if ((st = dt_rl_progress_open(&p->prog, c, p->rank == 0))) return st;
    if (p->apool) return dt_rollout_init_async(&p->ro, c, p->apool, batch, p->pol, p->rank * p->n, p->T);
    return dt_rollout_init(&p->ro, c, p->pool, p->pol, p->rank * p->n, p->T);
}

static void teardown(ppo *p) {
    dt_rl_progress_close(&p->prog);
    dt_rollout_free(&p->ro);
    dt_engine_destroy(p->e);
    dt_policy_destroy(p->pol);
    dt_env_pool_destroy(p->pool);
    dt_env_pool_async_destroy(p->apool);
    void *bufs[] = { p->rec, p->all, p->adv, p->ret,
                     p->perm, p->mb_obs, p->dlogits, p->dlogstd, p->mb_w, p->mb_adv, p->mb_act, p->mb_logp, p->mb_oldv,
                     p->mb_ret, p->mb_scaled, p->dvalues, p->ep_send, p->ep_all };
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
}

static dt_status sum_terms(ppo *p) {
    double v[5] = { p->terms.pg, p->terms.v, p->terms.entropy, p->terms.approx_kl, p->terms.clipfrac };
    if (p->P > 1) {
        dt_status st = dt_comm_allreduce(p->comm, v, v, 5, DT_F64, DT_SUM);
        if (st) return st;
    }
    double k = (double)p->c->epochs * p->c->minibatches * p->P; /* each rank's weights carry P */
    p->terms = (dt_rl_terms){ .pg = v[0] / k, .v = v[1] / k, .entropy = v[2] / k, .approx_kl = v[3] / k, .clipfrac = v[4] / k };
    return DT_OK;
}

static dt_rl_result so_far(const ppo *p, int updates, int64_t steps, double loss, double sps) {
    return (dt_rl_result){ .env_steps = steps, .updates = updates, .episodes = (int)p->prog.episodes,
                           .mean_return = dt_rl_progress_mean(&p->prog), .loss = loss, .terms = p->terms, .steps_per_s = sps };
}

static dt_rl_learner learner_of(ppo *p) {
    return (dt_rl_learner){ .c = p->c, .comm = p->P > 1 ? p->comm : NULL, .rank = p->rank, .P = p->P, .ro = &p->ro,
                            .pol = p->pol, .opt = dt_engine_optim(p->e), .prog = &p->prog };
}


dt_status dt_ppo_run(const dt_rl_config *c, dt_comm *comm, dt_rl_observer after_update, void *ctx, dt_rl_result *res) {
    ppo p = { 0 };
    dt_status st = setup(&p, c, comm);
    int64_t per_update = (int64_t)p.T * p.N;
    int updates = st ? 0 : dt_rl_whole_updates("ppo", c->total_steps, per_update, p.rank == 0);
    if (!st && updates < 1)
        st = dt_error(DT_ERR_ARG, "ppo: --total-steps %lld is less than one rollout (%d envs x %d steps)", (long long)c->total_steps,
                      p.N, p.T);
    if (!st && p.rank == 0 && c->print_every) {
        printf("ppo on %s: %d envs (%d a rank, %d rank%s) x %d steps a rollout, %d updates of %d epochs x %d minibatches of %d, "
               "policy %d-%d-%d-%d%s and value %d-%d-%d-1 (%zu parameters), lr %g%s%s%s\n", p.ro.info->id, p.N, p.n,
               p.P, p.P == 1 ? "" : "s", p.T, updates, c->epochs, c->minibatches, p.mb, p.od, c->hidden, c->hidden, p.K,
               p.continuous ? " (Gaussian)" : "", p.od, c->hidden, c->hidden, dt_policy_num_params(p.pol), (double)c->lr,
               c->anneal_lr ? " annealed to 0" : "", c->norm_obs ? ", observations normalised" : "",
               c->norm_reward ? ", rewards scaled" : "");
        fflush(stdout);
    }
    double t0 = dt_time_now();
    int64_t steps = 0, steps0 = 0;
    double loss = 0;
    int u = 0, u0 = 0;
    dt_rl_learner l = st ? (dt_rl_learner){ 0 } : learner_of(&p);
    if (!st) st = dt_rl_resume_run(&l, updates, &u0, &steps);
    steps0 = steps;
    for (u = u0 + 1; !st && u <= updates; u++) {
        float lr = c->anneal_lr ? (float)(1.0 - (double)(u - 1) / updates) * c->lr : c->lr;
        int dropped = 0;
        if (!st) st = rollout(&p, (int64_t)(u - 1) * p.T);
        if (!st) st = gather_episodes(&p, &dropped);
        if (!st && dropped) dt_log(DT_LOG_WARN, "ppo: %d episodes of rank %d in update %d not counted (more than %d ended)", dropped,
                                   p.rank, u, EPISODES_SENT);
        if (!st) advantages(&p);
        if (!st) st = update(&p, u, lr, &loss);
        if (!st) st = sum_terms(&p);
        if (st) break;
        steps += per_update;
        double sps = (double)(steps - steps0) / (dt_time_now() - t0);
        dt_rl_progress_update(&p.prog, u, updates, steps, loss, &p.terms, lr, sps, NAN);
        if (after_update) {
            dt_rl_result r = so_far(&p, u, steps, loss, sps);
            after_update(&r, dt_policy_params(p.pol), dt_policy_num_params(p.pol), ctx);
        }
        if (c->save && c->save_every && u % c->save_every == 0 && u < updates) st = dt_rl_save_run(&l, u, steps);
    }
    if (!st && c->save) st = dt_rl_save_run(&l, u - 1, steps);
    if (res) *res = so_far(&p, u - 1, steps, loss, (double)(steps - steps0) / (dt_time_now() - t0));
    teardown(&p);
    return st;
}
