/* An IMPALA actor (see actors.h): its share of the environments, a copy of
 * the policy that it refreshes from the learner's weights at the start of
 * a rollout, and rollouts into its slots, one after another, at most
 * DT_ACTOR_SLOTS ahead of the learner. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "dtrain/kernels.h"
#include "actors.h"
#include "policy.h"
#include "rollout.h"

#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define MEM_FD 3
#define SOCK_FD 4

typedef struct {
    dt_actor_shared *h;
    int index, free_slots, next;
    dt_policy *pol;
    int64_t have;  /* the version of the weights the policy holds */
} actor;

/* One message from the learner (waiting for it when wait): 1 read, 0 none (not waiting), -1 the learner is gone. */
static int hear(actor *a, int wait) {
    char c;
    ssize_t k;
    while ((k = recv(SOCK_FD, &c, 1, wait ? 0 : MSG_DONTWAIT)) < 0 && errno == EINTR) {}
    if (k == 1) {
        if (c == DT_ACTOR_FREE) a->free_slots++;
        return 1;
    }
    if (k < 0 && !wait && (errno == EAGAIN || errno == EWOULDBLOCK)) return 0;
    return -1;
}

/* The learner's weights as they are now (a consistent copy: the sequence lock), if newer than the policy's. */
static void refresh(actor *a) {
    dt_actor_shared *h = a->h;
    for (;;) {
        uint64_t s1 = atomic_load_explicit(&h->seq, memory_order_acquire);
        if (s1 & 1) { sched_yield(); continue; }
        int64_t v = atomic_load_explicit(&h->version, memory_order_relaxed);
        if (v == a->have) return;
        memcpy(dt_policy_params(a->pol), (char *)h + h->weights_off, sizeof(float) * h->nparams);
        /* the copy stays before the second read: a read-modify-write of release order does it (Boehm, "Can seqlocks get
         * along with programming language memory models?", 2012) where an acquire fence would too, but TSan has no fences */
        if (atomic_fetch_add_explicit(&h->seq, 0, memory_order_acq_rel) == s1) { a->have = v; return; }
    }
}

/* A resumed run's: the environments as the learner last took them from this actor, and its next rollout (*r). */
static dt_status start_from(actor *a, dt_rollout *ro, int64_t *r) {
    dt_actor_shared *h = a->h;
    const int64_t *at = dt_actor_start_at(h, a->index);
    const double *recs = (const double *)(at + 2);
    dt_status st = DT_OK;
    if (at[0] == 0) return DT_OK; /* the learner took nothing of this actor's: it starts afresh */
    for (int j = 0; j < h->n && !st; j++) st = dt_rollout_env_restore(ro, j, recs + (size_t)j * h->env_rec);
    dt_rollout_set_pool_steps(ro, at[1]);
    *r = at[0];
    return st;
}

/* Waits for a free slot and (sync) for the weights rollout r must act with; -1: the learner is gone. */
static int ready_for(actor *a, int64_t r) {
    while (hear(a, 0) > 0) {}
    while (a->free_slots == 0)
        if (hear(a, 1) < 0) return -1;
    int64_t need = a->h->sync ? r / a->h->refresh * a->h->refresh : 0;
    while (atomic_load_explicit(&a->h->version, memory_order_acquire) < need)
        if (hear(a, 1) < 0) return -1;
    refresh(a);
    return 0;
}

static dt_status fill(actor *a, dt_rollout *ro, int64_t r) {
    dt_actor_shared *h = a->h;
    dt_actor_slot *s = dt_actor_slot_at(h, a->index, a->next);
    dt_status st = dt_rollout_run(ro, r * h->T, dt_actor_slot_records(h, s));
    if (st) return st;
    s->rollout = r;
    s->version = a->have;
    s->pool_steps = dt_rollout_pool_steps(ro);
    for (int j = 0; h->keep_state && j < h->n && !st; j++) /* what a run state needs to go on from here */
        st = dt_rollout_env_record(ro, j, dt_actor_slot_envs(h, s) + (size_t)j * h->env_rec);
    if (st) return st;
    s->episodes = dt_rollout_episodes(ro, s->ep, DT_ACTOR_EPISODES);
    dt_episode extra;
    for (s->dropped = 0; dt_rollout_episodes(ro, &extra, 1);) s->dropped++;
    if (h->norm_obs) {
        memcpy(dt_actor_slot_stats(s), ro->obs_norm[0].mean, sizeof(double) * (size_t)h->od);
        memcpy(dt_actor_slot_stats(s) + h->od, ro->obs_norm[0].var, sizeof(double) * (size_t)h->od);
    }
    return DT_OK;
}

static dt_status run(actor *a) {
    dt_actor_shared *h = a->h;
    dt_env_bridge_config bridge = { .python = h->python[0] ? h->python : NULL, .workers = h->workers };
    dt_rl_config c = { .env = h->env, .seed = h->seed, .gamma = h->gamma, .norm_obs = h->norm_obs, .norm_reward = h->norm_reward,
                       .trunc_as_term = h->trunc_as_term, .bridge = &bridge };
    dt_env_pool *pool = NULL;
    dt_env_pool_async *apool = NULL;
    dt_rollout ro = { 0 };
    dt_status st = h->async_threads ? dt_env_pool_async_create(h->env, h->n, a->index * h->n, h->seed, h->async_threads, h->async_batch, &apool)
                                    : dt_env_pool_create(h->env, h->n, a->index * h->n, h->seed, &bridge, &pool);
    if (!st) st = dt_policy_create(h->od, h->K, h->continuous, h->hidden, h->seed, &a->pol);
    if (!st && dt_policy_num_params(a->pol) != h->nparams)
        st = dt_error(DT_ERR_MISMATCH, "impala actor %d: a policy of %zu parameters, the learner's has %zu", a->index,
                      dt_policy_num_params(a->pol), h->nparams);
    if (!st) st = apool ? dt_rollout_init_async(&ro, &c, apool, h->async_batch, a->pol, a->index * h->n, h->T)
                        : dt_rollout_init(&ro, &c, pool, a->pol, a->index * h->n, h->T);
    int64_t r0 = 0;
    if (!st && h->start_off) st = start_from(a, &ro, &r0);
    char ok = DT_ACTOR_READY;
    if (!st && send(SOCK_FD, &ok, 1, MSG_NOSIGNAL) != 1) st = DT_ERR_PEER; /* the learner is gone: nothing to say */
    for (int64_t r = r0; !st; r++) {
        if (ready_for(a, r)) break;
        if ((st = fill(a, &ro, r))) break;
        char s = (char)a->next;
        if (send(SOCK_FD, &s, 1, MSG_NOSIGNAL) != 1) break;
        a->free_slots--;
        a->next = (a->next + 1) % DT_ACTOR_SLOTS;
    }
    dt_rollout_free(&ro);
    dt_policy_destroy(a->pol);
    dt_env_pool_destroy(pool);
    dt_env_pool_async_destroy(apool);
    return st == DT_ERR_PEER ? DT_OK : st;
}

int dt_rl_actor_main(int index) {
    struct stat m, s;
    if (fstat(MEM_FD, &m) || fstat(SOCK_FD, &s) || !S_ISREG(m.st_mode) || !S_ISSOCK(s.st_mode) || m.st_size < (off_t)sizeof(dt_actor_shared)) {
        dt_log(DT_LOG_ERROR, "rl actor: the learner starts its actors (dtrain rl --algo impala); this one has no learner");
        return 1;
    }
    void *p = mmap(NULL, (size_t)m.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, MEM_FD, 0);
    dt_actor_shared *h = p;
    if (p == MAP_FAILED || h->magic != DT_ACTOR_MAGIC || h->total != (size_t)m.st_size || index < 0 || index >= h->actors) {
        dt_log(DT_LOG_ERROR, "rl actor %d: the learner's shared memory is not what this build lays out", index);
        return 1;
    }
    dt_kernels_set_threads(1); /* the batches are small, and the learner and the other actors want the cores */
    actor a = { .h = h, .index = index, .free_slots = DT_ACTOR_SLOTS, .have = -1 };
    dt_status st = run(&a);
    if (st) dt_log(DT_LOG_ERROR, "impala actor %d: %s", index, dt_last_error());
    munmap(p, h->total);
    return st ? 1 : 0;
}
