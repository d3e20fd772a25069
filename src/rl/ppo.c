/* PPO (see rl.h): rollouts from this rank's share of the environments,
 * gathered so that every rank holds the whole batch; GAE; minibatch epochs
 * whose gradients the engine averages over the ranks and applies. */
#include "dtrain/engine.h"
#include "dtrain/io.h"
#include "dtrain/rl.h"
#include "policy.h"
#include "running_norm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW 100         /* episodes in the mean return */
#define EPISODES_SENT 1024 /* a rank's finished episodes an update (more: the oldest are dropped, said) */

/* a transition as the ranks exchange it: the observation, the action (ad floats), then these */
enum { F_LOGP, F_VAL, F_REW, F_DONE, F_TERM, F_VALID, NFIELDS };

typedef struct {
    const dt_ppo_config *c;
    dt_comm *comm;
    int rank, P, N, n, T, od, ad, K, mb; /* K: the policy's outputs (actions, or the action's dimensions) */
    int continuous;
    dt_env_pool *pool;
    dt_policy *pol;
    dt_engine *e;
    float *rec, *all;          /* this rank's rollout [(T+1)][n][rec], every rank's [P][(T+1)][n][rec] */
    float *next_obs;           /* [n, od] */
    float *act_env, *rew; /* act_env: the actions clipped to the space (ClipAction) */
    uint8_t *term, *trunc, *ended, *reset;
    dt_running_norm *obs_norm, *ret_norm; /* an environment's each (NULL: off) */
    double *ret_acc;
    float *adv, *ret;          /* [T][N] */
    int *perm;
    float *mb_obs, *mb_w, *mb_adv, *mb_act, *mb_logp, *mb_oldv, *mb_ret, *mb_scaled, *dlogits, *dvalues, *dlogstd;
    int mb_rows;               /* this rank's rows of the minibatch */
    dt_ppo_terms terms;
    double returns[WINDOW];
    int64_t episodes;
    double *ep_send, *ep_all;
    FILE *metrics;
} ppo;

void dt_ppo_defaults(dt_ppo_config *c) {
    *c = (dt_ppo_config){ .env = "cartpole", .num_envs = 4, .num_steps = 128, .total_steps = 500000, .lr = 2.5e-4f,
                          .anneal_lr = 1, .gamma = 0.99f, .gae_lambda = 0.95f, .minibatches = 4, .epochs = 4, .norm_adv = 1,
                          .clip_vloss = 1, .clip_coef = 0.2f, .ent_coef = 0.01f, .vf_coef = 0.5f, .max_grad_norm = 0.5f,
                          .hidden = 64, .seed = 1, .print_every = 10 };
}

void dt_ppo_defaults_continuous(dt_ppo_config *c) {
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

static size_t rec_len(const ppo *p) { return (size_t)p->od + p->ad + NFIELDS; }
static float *fields(const ppo *p, float *r) { return r + p->od + p->ad; }
static const float *cfields(const ppo *p, const float *r) { return r + p->od + p->ad; }
static float *rec_at(ppo *p, float *base, int t, int j) { return base + ((size_t)t * p->n + j) * rec_len(p); }
/* global env i's row of step t in the gathered rollout */
static const float *row(const ppo *p, int t, int i) {
    int r = i / p->n, j = i % p->n;
    return p->all + (((size_t)r * (p->T + 1) + t) * p->n + j) * rec_len(p);
}

/* The k-th uniform for (global env, global step): the same sample whoever steps the environment. */
static double uniform_at(uint64_t seed, int env, int64_t step, int k) {
    uint64_t s = seed * 0x9e3779b97f4a7c15ull ^ (uint64_t)env * 0xd1b54a32d192ed03ull ^ (uint64_t)step * 0x8cb92ba72f3d8dd7ull ^
                 (uint64_t)k * 0xa0761d6478bd642full;
    return dt_rng_double(&s);
}

/* The wrappers over the pool's output (continuous PPO's recipe): each environment's observation normalised, its
 * reward scaled; a reset step's reward is not a transition's and stays out of the statistics. */
static void normalise(ppo *p, int stepped) {
    for (int j = 0; j < p->n; j++) {
        if (p->obs_norm) dt_running_norm_obs(&p->obs_norm[j], p->next_obs + (size_t)j * p->od, 1);
        if (p->ret_norm && stepped && !p->reset[j])
            p->rew[j] = dt_running_norm_reward(&p->ret_norm[j], &p->ret_acc[j], p->rew[j], p->term[j], p->c->gamma);
    }
}

/* env j's action at step (drawn from the policy's head row z), into a and the env's clipped copy; its log prob */
static void act(ppo *p, const float *z, int j, int64_t step, float *a, float *logp) {
    double u[64];
    int nu = dt_policy_uniforms(p->pol);
    for (int k = 0; k < nu; k++) u[k] = uniform_at(p->c->seed, p->rank * p->n + j, step, k);
    dt_policy_draw(p->pol, z, u, a, logp);
    float *e = p->act_env + (size_t)j * p->ad;
    memcpy(e, a, sizeof(float) * (size_t)p->ad);
    dt_env_clip_action(dt_env_pool_info(p->pool), e);
}

static dt_status rollout(ppo *p, int64_t step0) {
    const float *logits, *values;
    dt_status st;
    for (int t = 0; t <= p->T; t++) {
        if ((st = dt_policy_forward(p->pol, p->next_obs, p->n, &logits, &values))) return st;
        for (int j = 0; j < p->n; j++) {
            float *r = rec_at(p, p->rec, t, j);
            memcpy(r, p->next_obs + (size_t)j * p->od, sizeof(float) * (size_t)p->od);
            float *f = fields(p, r);
            memset(r + p->od, 0, sizeof(float) * (size_t)(p->ad + NFIELDS));
            f[F_VAL] = values[j];
            if (t == p->T) continue; /* the bootstrap row: the value of the observation after the rollout */
            act(p, logits + (size_t)j * p->K, j, step0 + t, r + p->od, &f[F_LOGP]);
            f[F_VALID] = !p->ended[j];
        }
        if (t == p->T) break;
        if ((st = dt_env_pool_step(p->pool, p->act_env, p->next_obs, p->rew, p->term, p->trunc, p->reset))) return st;
        normalise(p, 1);
        for (int j = 0; j < p->n; j++) {
            float *f = fields(p, rec_at(p, p->rec, t, j));
            f[F_REW] = p->rew[j];
            f[F_TERM] = p->term[j] || (p->c->trunc_as_term && p->trunc[j]);
            f[F_DONE] = p->term[j] || p->trunc[j];
            p->ended[j] = p->term[j] || p->trunc[j];
            if (p->reset[j]) f[F_VALID] = 0; /* an autoreset (invalid already) or an episode the pool dropped */
        }
    }
    size_t len = (size_t)(p->T + 1) * p->n * rec_len(p);
    if (p->P == 1) { memcpy(p->all, p->rec, len * sizeof(float)); return DT_OK; }
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
            double boot = 1 - f[F_TERM], carry = 1 - f[F_DONE];
            double delta = f[F_REW] + g * nf[F_VAL] * boot - f[F_VAL];
            last = delta + g * lam * carry * last;
            size_t k = (size_t)t * p->N + i;
            p->adv[k] = f[F_VALID] ? (float)last : 0;
            if (!f[F_VALID]) last = 0; /* nothing flows back from a row that is not a transition */
            p->ret[k] = p->adv[k] + f[F_VAL];
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
        if (!cfields(p, row(p, k / p->N, k % p->N))[F_VALID]) continue;
        sum += p->adv[k];
        valid++;
    }
    double mean = valid ? sum / valid : 0;
    for (int i = 0; i < p->mb; i++) {
        int k = idx[i];
        if (cfields(p, row(p, k / p->N, k % p->N))[F_VALID]) sq += (p->adv[k] - mean) * (p->adv[k] - mean);
    }
    double sd = valid > 1 ? sqrt(sq / (valid - 1)) : 0; /* torch's std: unbiased */
    int first = p->rank * p->mb_rows;
    for (int i = 0; i < p->mb_rows; i++) {
        int k = idx[first + i], t = k / p->N, e = k % p->N;
        const float *r = row(p, t, e), *f = cfields(p, r);
        memcpy(p->mb_obs + (size_t)i * p->od, r, sizeof(float) * (size_t)p->od);
        memcpy(p->mb_act + (size_t)i * p->ad, r + p->od, sizeof(float) * (size_t)p->ad);
        p->mb_logp[i] = f[F_LOGP];
        p->mb_oldv[i] = f[F_VAL];
        p->mb_ret[i] = p->ret[k];
        int v = f[F_VALID] != 0;
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
    dt_ppo_terms t = { 0 };
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

static int by_step_env(const void *a, const void *b) {
    const double *x = a, *y = b;
    if (x[3] != y[3]) return x[3] < y[3] ? -1 : 1;
    return x[2] < y[2] ? -1 : x[2] > y[2];
}

/* Every rank's episodes that ended in this rollout, in order of (step, env) as one pool would list them. */
static dt_status gather_episodes(ppo *p, int *dropped) {
    dt_episode ep[EPISODES_SENT];
    int n = dt_env_pool_episodes(p->pool, ep, EPISODES_SENT);
    *dropped = 0;
    dt_episode extra;
    while (dt_env_pool_episodes(p->pool, &extra, 1)) (*dropped)++;
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
    qsort(list, (size_t)total, 4 * sizeof(double), by_step_env);
    for (int i = 0; i < total; i++) p->returns[p->episodes++ % WINDOW] = list[4 * i];
    return DT_OK;
}

static double mean_return(const ppo *p) {
    int n = p->episodes < WINDOW ? (int)p->episodes : WINDOW;
    double s = 0;
    for (int i = 0; i < n; i++) s += p->returns[i];
    return n ? s / n : NAN;
}

static dt_status setup_norms(ppo *p) {
    dt_status st = DT_OK;
    if (p->c->norm_obs && !(p->obs_norm = calloc((size_t)p->n, sizeof *p->obs_norm)))
        return dt_error(DT_ERR_NOMEM, "ppo: out of memory");
    if (p->c->norm_reward && (!(p->ret_norm = calloc((size_t)p->n, sizeof *p->ret_norm)) ||
                              !(p->ret_acc = calloc((size_t)p->n, sizeof(double)))))
        return dt_error(DT_ERR_NOMEM, "ppo: out of memory");
    for (int j = 0; j < p->n && !st; j++) {
        if (p->obs_norm) st = dt_running_norm_init(&p->obs_norm[j], p->od);
        if (p->ret_norm && !st) st = dt_running_norm_init(&p->ret_norm[j], 1);
    }
    return st;
}

static void free_norms(ppo *p) {
    for (int j = 0; j < p->n; j++) {
        if (p->obs_norm) dt_running_norm_free(&p->obs_norm[j]);
        if (p->ret_norm) dt_running_norm_free(&p->ret_norm[j]);
    }
    free(p->obs_norm);
    free(p->ret_norm);
    free(p->ret_acc);
}

/* The rollout's, the minibatch's and the episodes' buffers (teardown frees them). */
static dt_status alloc_buffers(ppo *p) {
    int B = p->T * p->N;
    size_t rl = rec_len(p), roll = (size_t)(p->T + 1) * p->n * rl;
    p->rec = malloc(roll * sizeof(float));
    p->all = malloc(roll * p->P * sizeof(float));
    p->next_obs = malloc(sizeof(float) * (size_t)p->n * p->od);
    p->act_env = malloc(sizeof(float) * (size_t)p->n * p->ad);
    p->rew = malloc(sizeof(float) * (size_t)p->n);
    p->term = calloc((size_t)p->n, 1);
    p->trunc = calloc((size_t)p->n, 1);
    p->ended = calloc((size_t)p->n, 1);
    p->reset = calloc((size_t)p->n, 1);
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
    if (!ok || !p->rec || !p->all || !p->next_obs || !p->act_env || !p->rew || !p->term || !p->trunc || !p->ended || !p->reset ||
        !p->adv || !p->ret || !p->perm || !p->mb_obs || !p->mb_act || !p->dlogits || !p->dlogstd || !p->ep_send || !p->ep_all)
        return dt_error(DT_ERR_NOMEM, "ppo: out of memory for a rollout of %d x %d", p->T, p->N);
    return DT_OK;
}

static dt_status setup(ppo *p, const dt_ppo_config *c, dt_comm *comm) {
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
    dt_status st = dt_env_pool_create(c->env, p->n, p->rank * p->n, c->seed, c->bridge, &p->pool);
    if (st) return st;
    const dt_env_info *in = dt_env_pool_info(p->pool);
    p->continuous = !in->actions;
    p->od = in->obs_dim;
    p->ad = in->act_dim;
    p->K = p->continuous ? in->act_dim : in->actions;
    if (p->continuous && p->ad > 32)
        return dt_error(DT_ERR_UNSUPPORTED, "ppo: %s's actions of %d dimensions (at most 32)", in->id, p->ad);
    if ((st = dt_policy_create(p->od, p->K, p->continuous, c->hidden, c->seed, &p->pol))) return st;
    dt_engine_config ec = { .comm = p->P > 1 ? comm : NULL, .grad_clip = c->max_grad_norm, .step_at_end = 1,
                            .bucket_first = 1u << 20, .bucket_bytes = 1u << 22 };
    dt_optim_defaults(DT_OPT_ADAMW, &ec.opt);
    ec.opt.eps = 1e-5f; /* CleanRL's Adam */
    ec.opt.weight_decay = 0;
    dt_policy_model(p->pol, &ec.model);
    if ((st = dt_engine_create(&ec, &p->e))) return st;
    if ((st = alloc_buffers(p))) return st;
    if ((st = setup_norms(p))) return st;
    if (c->metrics && p->rank == 0 && !(p->metrics = fopen(c->metrics, "w")))
        return dt_error(DT_ERR_IO, "%s: cannot write the metrics file", c->metrics);
    if ((st = dt_env_pool_reset(p->pool, p->next_obs))) return st;
    normalise(p, 0);
    return DT_OK;
}

static void teardown(ppo *p) {
    if (p->metrics) fclose(p->metrics);
    dt_engine_destroy(p->e);
    dt_policy_destroy(p->pol);
    dt_env_pool_destroy(p->pool);
    free_norms(p);
    void *bufs[] = { p->rec, p->all, p->next_obs, p->act_env, p->rew, p->term, p->trunc, p->ended, p->reset, p->adv, p->ret,
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
    p->terms = (dt_ppo_terms){ .pg = v[0] / k, .v = v[1] / k, .entropy = v[2] / k, .approx_kl = v[3] / k, .clipfrac = v[4] / k };
    return DT_OK;
}

static void report(ppo *p, int u, int updates, int64_t steps, double loss, float lr, double sps) {
    const dt_ppo_terms *t = &p->terms;
    double mr = mean_return(p);
    if (p->metrics) {
        fprintf(p->metrics, "{\"step\":%d,\"env_steps\":%lld,\"episodes\":%lld,\"mean_return\":%.6g,\"loss\":%.6g,\"pg_loss\":%.6g,"
                "\"v_loss\":%.6g,\"entropy\":%.6g,\"approx_kl\":%.6g,\"clipfrac\":%.6g,\"lr\":%.6g,\"steps_per_s\":%.1f}\n", u,
                (long long)steps, (long long)p->episodes, isfinite(mr) ? mr : 0.0, loss, t->pg, t->v, t->entropy, t->approx_kl,
                t->clipfrac, (double)lr, sps);
        fflush(p->metrics);
    }
    if (p->rank || !p->c->print_every || (u % p->c->print_every && u != updates)) return;
    printf("update %4d/%d | env steps %8lld | episodes %6lld | mean return %7.2f | pg %+.4f v %.4f ent %.3f kl %.4f | %.0f steps/s\n",
           u, updates, (long long)steps, (long long)p->episodes, mr, t->pg, t->v, t->entropy, t->approx_kl, sps);
    fflush(stdout);
}

static dt_ppo_result so_far(const ppo *p, int updates, int64_t steps, double loss, double t0) {
    return (dt_ppo_result){ .env_steps = steps, .updates = updates, .episodes = (int)p->episodes, .mean_return = mean_return(p),
                            .loss = loss, .terms = p->terms, .steps_per_s = steps / (dt_time_now() - t0) };
}

dt_status dt_ppo_run(const dt_ppo_config *c, dt_comm *comm, dt_ppo_observer after_update, void *ctx, dt_ppo_result *res) {
    ppo p = { 0 };
    dt_status st = setup(&p, c, comm);
    int64_t per_update = (int64_t)p.T * p.N;
    int updates = st ? 0 : (int)(c->total_steps / per_update);
    if (!st && updates < 1)
        st = dt_error(DT_ERR_ARG, "ppo: --total-steps %lld is less than one rollout (%d envs x %d steps)", (long long)c->total_steps,
                      p.N, p.T);
    if (!st && p.rank == 0 && c->print_every) {
        printf("ppo on %s: %d envs (%d a rank, %d rank%s) x %d steps a rollout, %d updates of %d epochs x %d minibatches of %d, "
               "policy %d-%d-%d-%d%s and value %d-%d-%d-1 (%zu parameters), lr %g%s%s%s\n", dt_env_pool_info(p.pool)->id, p.N, p.n,
               p.P, p.P == 1 ? "" : "s", p.T, updates, c->epochs, c->minibatches, p.mb, p.od, c->hidden, c->hidden, p.K,
               p.continuous ? " (Gaussian)" : "", p.od, c->hidden, c->hidden, dt_policy_num_params(p.pol), (double)c->lr,
               c->anneal_lr ? " annealed to 0" : "", c->norm_obs ? ", observations normalised" : "",
               c->norm_reward ? ", rewards scaled" : "");
        fflush(stdout);
    }
    double t0 = dt_time_now();
    int64_t steps = 0;
    double loss = 0;
    int u = 0;
    for (u = 1; !st && u <= updates; u++) {
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
        report(&p, u, updates, steps, loss, lr, steps / (dt_time_now() - t0));
        if (after_update) {
            dt_ppo_result r = so_far(&p, u, steps, loss, t0);
            after_update(&r, dt_policy_params(p.pol), dt_policy_num_params(p.pol), ctx);
        }
    }
    if (!st && c->save && p.rank == 0) /* environment 0's statistics, which rank 0 holds */
        st = dt_policy_save(p.pol, c->save, p.od, p.obs_norm ? p.obs_norm[0].mean : NULL, p.obs_norm ? p.obs_norm[0].var : NULL);
    if (res) *res = so_far(&p, u - 1, steps, loss, t0);
    teardown(&p);
    return st;
}
