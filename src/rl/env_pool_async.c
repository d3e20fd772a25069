/* An asynchronous pool (EnvPool's send and receive): worker threads step the environments whose actions were sent,
 * and a receive hands back the first `batch` of them to finish, so that a policy acts on a batch while the other
 * environments still step. Each environment keeps Gymnasium's next-step autoreset and its own stream, so its
 * trajectory under the same actions is the synchronous pool's whatever the batches it travelled in. One lock guards
 * the two queues (environments to step, environments stepped); an environment is touched by one thread at a time,
 * handed over through them. */
#include "env_internal.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { OUT, QUEUED, READY }; /* an environment: with the caller (its last result received), to step, stepped */

typedef struct {
    dt_env *env;
    int state;
    bool fresh;        /* the pool's reset is its next step */
    bool reset_next;   /* its episode ended: its next step is a reset */
    float *act, *obs;  /* the action sent, the observation its step gave */
    double rew, ret;   /* the step's reward; the running episode's return */
    int term, trunc, was_reset, len;
    int64_t steps;     /* steps since the pool's reset (an autoreset one too, as the synchronous pool counts them) */
    dt_status err;     /* its step refused (said once received) */
    char why[160];
} slot;

struct dt_env_pool_async {
    slot *s;
    int n, first, batch, nthreads;
    int want;                      /* the environments the waiting receive asks for */
    uint64_t seed;
    const dt_env_info *in;
    int *todo, *ready;             /* rings of environment numbers: to step, stepped (n each) */
    int todo0, ntodo, ready0, nready;
    bool stop, started;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    pthread_t *threads;
    dt_episode_list finished; /* the episodes ended among the environments received */
};

static void step_one(dt_env_pool_async *p, slot *e, int i) {
    e->term = e->trunc = 0;
    e->rew = 0;
    e->was_reset = e->fresh || e->reset_next;
    if (e->fresh) { /* the pool's reset, from the pool's seed: not a step */
        dt_env_reset(e->env, (int64_t)((p->seed + (uint64_t)(p->first + i)) & INT64_MAX), e->obs);
        e->fresh = e->reset_next = false;
        return;
    }
    e->steps++;
    if (e->reset_next) { /* next-step autoreset from the environment's own stream: this step's action is not taken */
        dt_env_reset(e->env, -1, e->obs);
        e->reset_next = false;
        return;
    }
    e->err = dt_env_step(e->env, e->act, e->obs, &e->rew, &e->term, &e->trunc);
    if (e->err) snprintf(e->why, sizeof e->why, "%s", dt_last_error());
    e->reset_next = e->term || e->trunc;
}

static void *worker(void *arg) {
    dt_env_pool_async *p = arg;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->ntodo && !p->stop) pthread_cond_wait(&p->work, &p->mu);
        if (p->stop) break;
        int i = p->todo[p->todo0];
        p->todo0 = (p->todo0 + 1) % p->n, p->ntodo--;
        pthread_mutex_unlock(&p->mu);
        step_one(p, &p->s[i], i);
        pthread_mutex_lock(&p->mu);
        p->s[i].state = READY;
        p->ready[(p->ready0 + p->nready++) % p->n] = i;
        if (p->nready >= p->want) pthread_cond_signal(&p->done); /* a receive waits for all it asks: no earlier wake-up */
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

dt_status dt_env_pool_async_create(const char *name, int n, int first, uint64_t seed, int threads, int batch,
                                   dt_env_pool_async **out) {
    *out = NULL;
    if (dt_env_bridged(name))
        return dt_error(DT_ERR_UNSUPPORTED, "async env pool: %s is bridged to Python, whose worker processes already step apart: "
                        "an asynchronous pool runs dtrain's own environments", name);
    if (n < 1 || first < 0 || threads < 1 || threads > 256 || batch < 1 || batch > n)
        return dt_error(DT_ERR_ARG, "async env pool: %d environments from number %d, %d threads, batches of %d (1 to the "
                        "environments)", n, first, threads, batch);
    dt_env_pool_async *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "async env pool: out of memory");
    *p = (dt_env_pool_async){ .n = n, .first = first, .batch = batch, .want = batch, .seed = seed };
    p->s = calloc((size_t)n, sizeof *p->s);
    p->todo = malloc(sizeof *p->todo * (size_t)n);
    p->ready = malloc(sizeof *p->ready * (size_t)n);
    p->threads = calloc((size_t)threads, sizeof *p->threads);
    dt_status st = p->s && p->todo && p->ready && p->threads ? DT_OK : dt_error(DT_ERR_NOMEM, "async env pool: out of memory");
    for (int i = 0; i < n && !st; i++) {
        if ((st = dt_env_create(name, &p->s[i].env))) break;
        if (!i) p->in = dt_env_get_info(p->s[0].env);
        p->s[i].act = calloc((size_t)p->in->act_dim, sizeof(float));
        p->s[i].obs = calloc((size_t)p->in->obs_dim, sizeof(float));
        if (!p->s[i].act || !p->s[i].obs) st = dt_error(DT_ERR_NOMEM, "async env pool: out of memory");
    }
    if (!st) {
        pthread_mutex_init(&p->mu, NULL);
        pthread_cond_init(&p->work, NULL);
        pthread_cond_init(&p->done, NULL);
        p->started = true;
    }
    for (int t = 0; t < threads && !st; t++) {
        if (pthread_create(&p->threads[t], NULL, worker, p)) st = dt_error(DT_ERR_NOMEM, "async env pool: cannot start thread %d", t);
        else p->nthreads++;
    }
    if (st) { dt_env_pool_async_destroy(p); return st; }
    *out = p;
    return DT_OK;
}

void dt_env_pool_async_destroy(dt_env_pool_async *p) {
    if (!p) return;
    if (p->started) {
        pthread_mutex_lock(&p->mu);
        p->stop = true;
        pthread_cond_broadcast(&p->work);
        pthread_mutex_unlock(&p->mu);
        for (int t = 0; t < p->nthreads; t++) pthread_join(p->threads[t], NULL);
        pthread_mutex_destroy(&p->mu);
        pthread_cond_destroy(&p->work);
        pthread_cond_destroy(&p->done);
    }
    for (int i = 0; p->s && i < p->n; i++) {
        dt_env_destroy(p->s[i].env);
        free(p->s[i].act);
        free(p->s[i].obs);
    }
    free(p->s);
    free(p->todo);
    free(p->ready);
    free(p->threads);
    free(p);
}

const dt_env_info *dt_env_pool_async_info(const dt_env_pool_async *p) { return p->in; }
int dt_env_pool_async_size(const dt_env_pool_async *p) { return p->n; }

/* Environments ids[0..k) queued (the lock held): each must be the caller's. */
static void queue(dt_env_pool_async *p, const int *ids, int k) {
    for (int j = 0; j < k; j++) {
        p->s[ids[j]].state = QUEUED;
        p->todo[(p->todo0 + p->ntodo++) % p->n] = ids[j];
    }
    pthread_cond_broadcast(&p->work);
}

dt_status dt_env_pool_async_reset(dt_env_pool_async *p) {
    int *ids = malloc(sizeof *ids * (size_t)p->n);
    if (!ids) return dt_error(DT_ERR_NOMEM, "async env pool: out of memory");
    pthread_mutex_lock(&p->mu);
    int busy = 0;
    for (int i = 0; i < p->n; i++) busy += p->s[i].state != OUT;
    for (int i = 0; i < p->n && !busy; i++) {
        slot *e = &p->s[i];
        e->fresh = true, e->reset_next = false, e->steps = 0, e->ret = 0, e->len = 0, e->err = DT_OK;
        ids[i] = i;
    }
    if (!busy) p->finished.n = 0, queue(p, ids, p->n);
    pthread_mutex_unlock(&p->mu);
    free(ids);
    if (busy) return dt_error(DT_ERR_ARG, "async env pool: reset with %d environments not yet received", busy);
    return DT_OK;
}

dt_status dt_env_pool_async_send(dt_env_pool_async *p, const float *actions, const int *ids, int k) {
    const dt_env_info *in = p->in;
    pthread_mutex_lock(&p->mu);
    dt_status st = DT_OK;
    for (int j = 0; j < k && !st; j++) { /* every one checked first: a refused send steps nothing */
        int i = ids[j];
        if (i < 0 || i >= p->n || p->s[i].state != OUT)
            st = dt_error(DT_ERR_ARG, "async env pool: an action for environment %d, which %s", i < 0 || i >= p->n ? i : p->first + i,
                          i < 0 || i >= p->n ? "is not in the pool" : "was not handed out by a receive (or was sent already)");
        else if (!p->s[i].fresh && !p->s[i].reset_next && (st = dt_env_check_action(in, actions + (size_t)j * in->act_dim)))
            st = dt_error(st, "environment %d of the pool: %s", p->first + i, dt_last_error());
        for (int q = 0; q < j && !st; q++)
            if (ids[q] == i) st = dt_error(DT_ERR_ARG, "async env pool: two actions for environment %d in one send", p->first + i);
    }
    for (int j = 0; j < k && !st; j++) memcpy(p->s[ids[j]].act, actions + (size_t)j * in->act_dim, sizeof(float) * (size_t)in->act_dim);
    if (!st) queue(p, ids, k);
    pthread_mutex_unlock(&p->mu);
    return st;
}

/* An environment's stepped result to the caller (the lock held): its episode counted where it ended. */
static dt_status hand_out(dt_env_pool_async *p, int i, int j, float *obs, float *rew, uint8_t *term, uint8_t *trunc, uint8_t *reset) {
    slot *e = &p->s[i];
    e->state = OUT;
    if (e->err) {
        dt_status st = e->err;
        e->err = DT_OK;
        return dt_error(st, "environment %d of the pool: %s", p->first + i, e->why);
    }
    memcpy(obs + (size_t)j * p->in->obs_dim, e->obs, sizeof(float) * (size_t)p->in->obs_dim);
    rew[j] = (float)e->rew, term[j] = (uint8_t)e->term, trunc[j] = (uint8_t)e->trunc;
    if (reset) reset[j] = (uint8_t)e->was_reset;
    if (e->was_reset) return DT_OK;
    e->ret += e->rew, e->len++;
    if (!e->term && !e->trunc) return DT_OK;
    dt_episode_list_add(&p->finished, (dt_episode){ .ret = e->ret, .len = e->len, .env = p->first + i, .step = e->steps - 1 });
    e->ret = 0, e->len = 0;
    return DT_OK;
}

dt_status dt_env_pool_async_recv(dt_env_pool_async *p, int *ids, float *obs, float *rew, uint8_t *term, uint8_t *trunc, uint8_t *reset) {
    return dt_env_pool_async_recv_n(p, p->batch, ids, obs, rew, term, trunc, reset);
}

dt_status dt_env_pool_async_recv_n(dt_env_pool_async *p, int k, int *ids, float *obs, float *rew, uint8_t *term, uint8_t *trunc,
                                   uint8_t *reset) {
    pthread_mutex_lock(&p->mu);
    int out = 0;
    for (int i = 0; i < p->n; i++) out += p->s[i].state == OUT;
    if (k < 1 || p->n - out < k) {
        pthread_mutex_unlock(&p->mu);
        return dt_error(DT_ERR_ARG, "async env pool: a receive of %d with %d environments stepping (send their actions first)", k,
                        p->n - out);
    }
    p->want = k;
    while (p->nready < k) pthread_cond_wait(&p->done, &p->mu);
    dt_status st = DT_OK;
    for (int j = 0; j < k; j++) {
        int i = p->ready[p->ready0];
        p->ready0 = (p->ready0 + 1) % p->n, p->nready--;
        ids[j] = i;
        dt_status s2 = hand_out(p, i, j, obs, rew, term, trunc, reset);
        if (!st) st = s2;
    }
    pthread_mutex_unlock(&p->mu);
    return st;
}

int dt_env_pool_async_episodes(dt_env_pool_async *p, dt_episode *out, int cap) {
    pthread_mutex_lock(&p->mu);
    int n = dt_episode_list_take(&p->finished, out, cap);
    pthread_mutex_unlock(&p->mu);
    return n;
}

/* A run state's (env_internal.h): as the synchronous pool's record, between rollouts, when every environment is the
 * caller's. */
dt_status dt_env_pool_async_record(const dt_env_pool_async *p, int i, double *rec) {
    const slot *e = &p->s[i];
    dt_status st = dt_env_record(e->env, rec);
    rec[DT_ENV_RECORD] = e->reset_next, rec[DT_ENV_RECORD + 1] = e->ret, rec[DT_ENV_RECORD + 2] = e->len;
    return st;
}

dt_status dt_env_pool_async_restore(dt_env_pool_async *p, int i, const double *rec) {
    slot *e = &p->s[i];
    dt_status st = dt_env_running_episode(rec, e->env, p->first + i, &e->reset_next, &e->ret, &e->len);
    if (st) return st;
    e->fresh = false;
    return dt_env_restore(e->env, rec);
}

bool dt_env_pool_async_restarts(const dt_env_pool_async *p) { return dt_env_restarts(p->s[0].env); }
int64_t dt_env_pool_async_steps(const dt_env_pool_async *p) { return p->s[0].steps; }
void dt_env_pool_async_set_steps(dt_env_pool_async *p, int64_t steps) {
    for (int i = 0; i < p->n; i++) p->s[i].steps = steps;
}
