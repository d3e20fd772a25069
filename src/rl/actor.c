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
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#define MEM_FD 3
#define SOCK_FD 4

typedef struct {
    dt_actor_shared *h;
    int index, free_slots, next;
    dt_policy *pol;
    int64_t have;  /* the version of the weights the policy holds */
    /* on another machine (rank index + 1 of an MPI job): the learner's control byte and weights posted, the slots' sends */
    dt_peers *peers;
    dt_peer_msg *ctl_in, *w_in, *out[DT_ACTOR_SLOTS];
    char ctl, host[DT_ACTOR_HOST];
    float *wbuf;          /* [version (int64)][parameters] */
    double heard;
    int asking;           /* a heartbeat sent and nothing heard since: the learner answers each (a second one would be
                           * a second write to a learner that may be dead: see actors_remote.c) */
    int ended;            /* the learner ended the run or fell silent: every later hearing says so again */
} actor;

/* The learner's weights that arrived, where refresh reads them (this process alone writes them: no one to lock out). */
static int take_weights(actor *a) {
    dt_actor_shared *h = a->h;
    int64_t v;
    memcpy(&v, a->wbuf, sizeof v);
    memcpy((char *)h + h->weights_off, a->wbuf + 2, sizeof(float) * h->nparams);
    atomic_store_explicit(&h->version, v, memory_order_release);
    return dt_peers_recv(a->peers, 0, DT_ACTOR_TAG_WEIGHTS, a->wbuf, sizeof v + sizeof(float) * h->nparams, &a->w_in) ? -1 : 1;
}

/* The learner cannot be reached (MPI says its messages failed): said, and this actor ends. */
static int unreachable(actor *a) {
    dt_log(DT_LOG_WARN, "impala actor %d: the learner (rank 0) cannot be reached (MPI says its messages failed): this actor ends",
           a->index);
    dt_peers_lost(a->peers);
    a->ended = 1;
    return -1;
}

/* hear's for an actor on another machine: the learner's messages tested, a heartbeat when it waits (the learner writes
 * only in reply), the learner's silence the end. */
static int hear_remote(actor *a, int wait) {
    static const char beat = DT_ACTOR_HEARTBEAT;
    while (!a->ended) {
        double now = dt_time_now();
        int got = 0;
        int r = a->w_in ? dt_peers_done(&a->w_in) : 0;
        if (r < 0) return unreachable(a);
        if (r) {
            a->heard = now;
            a->asking = 0;
            if ((got = take_weights(a)) < 0) { a->ended = 1; return -1; }
        }
        while (a->ctl_in && (r = dt_peers_done(&a->ctl_in))) {
            if (r < 0) return unreachable(a);
            a->heard = now;
            a->asking = 0;
            if (a->ctl == DT_ACTOR_END || a->ctl == DT_ACTOR_END_LOST) {
                if (a->ctl == DT_ACTOR_END_LOST) dt_peers_lost(a->peers);
                a->ended = 1;
                return -1;
            }
            if (a->ctl == DT_ACTOR_FREE) a->free_slots++, got = 1;
            if (dt_peers_recv(a->peers, 0, DT_ACTOR_TAG_CTL, &a->ctl, 1, &a->ctl_in)) { a->ended = 1; return -1; }
        }
        if (got) return 1;
        if (wait && !a->asking) { /* the learner writes only in reply (actors_remote.c): a wait asks, once */
            a->asking = 1;
            dt_peers_say(a->peers, 0, DT_ACTOR_TAG_CTL, &beat, 1);
        }
        if (now - a->heard > a->h->timeout) {
            dt_log(DT_LOG_WARN, "impala actor %d: the learner (rank 0) has been silent for %.0f s: this actor ends", a->index,
                   a->h->timeout);
            dt_peers_lost(a->peers);
            a->ended = 1;
            return -1;
        }
        if (!wait) return 0;
        nanosleep(&(struct timespec){ 0, 200000 }, NULL);
    }
    return -1;
}

/* One message from the learner (waiting for it when wait): 1 read, 0 none (not waiting), -1 the learner is gone. */
static int hear(actor *a, int wait) {
    if (a->peers) return hear_remote(a, wait);
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
    while (a->peers && !dt_peers_done(&a->out[a->next])) { /* the learner freed it, so it has it: the send ends now */
        if (hear(a, 0) < 0) return -1;
        nanosleep(&(struct timespec){ 0, 100000 }, NULL);
    }
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

/* 'R' to the learner (on another machine: its host's name); DT_ERR_PEER: the learner is gone, nothing to say. */
static dt_status say_ready(actor *a) {
    if (a->peers) {
        gethostname(a->host, sizeof a->host - 1);
        dt_peers_say(a->peers, 0, DT_ACTOR_TAG_READY, a->host, sizeof a->host);
        return DT_OK;
    }
    char ok = DT_ACTOR_READY;
    return send(SOCK_FD, &ok, 1, MSG_NOSIGNAL) == 1 ? DT_OK : DT_ERR_PEER;
}

/* The slot just filled, told (on another machine: sent whole); -1: the learner is gone. */
static int say_full(actor *a) {
    if (!a->peers) {
        char s = (char)a->next;
        return send(SOCK_FD, &s, 1, MSG_NOSIGNAL) == 1 ? 0 : -1;
    }
    dt_actor_shared *h = a->h;
    return dt_peers_send(a->peers, 0, DT_ACTOR_TAG_SLOT + a->next, dt_actor_slot_at(h, a->index, a->next), h->slot_bytes,
                         &a->out[a->next]) ? -1 : 0;
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
    if (!st) st = say_ready(a);
    for (int64_t r = r0; !st; r++) {
        if (ready_for(a, r)) break;
        if ((st = fill(a, &ro, r))) break;
        if (say_full(a)) break;
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

/* The learner's message of `bytes` on tag, waited for up to limit seconds while its control bytes are heard (its end
 * before the run began is the error). */
static dt_status await_learner(actor *a, int tag, void *buf, size_t bytes, double limit, const char *what) {
    dt_peer_msg *m = NULL;
    dt_status st = dt_peers_recv(a->peers, 0, tag, buf, bytes, &m);
    int r = 0;
    for (double t0 = dt_time_now(); !st && !(r = dt_peers_done(&m));) {
        for (int c; !st && a->ctl_in && (c = dt_peers_done(&a->ctl_in));) {
            if (c < 0 || a->ctl == DT_ACTOR_END || a->ctl == DT_ACTOR_END_LOST)
                st = dt_error(DT_ERR_PEER, "impala actor %d: the learner (rank 0) ended before the run began (its error is there)",
                              a->index);
            else st = dt_peers_recv(a->peers, 0, DT_ACTOR_TAG_CTL, &a->ctl, 1, &a->ctl_in);
        }
        if (!st && dt_time_now() - t0 > limit)
            st = dt_error(DT_ERR_PEER, "impala actor %d: no %s from the learner (rank 0) within %.0f s", a->index, what, limit);
        if (!st) nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
    }
    if (!st && r < 0) st = dt_error(DT_ERR_PEER, "impala actor %d: the learner (rank 0) cannot be reached (MPI says so)", a->index);
    if (st) {
        dt_peers_drop(&m);
        dt_peers_lost(a->peers);
    }
    return st;
}

/* The settings the learner sends, in memory laid out as the local actors' shared memory is. */
static dt_status remote_settings(actor *a) {
    dt_actor_shared hd;
    dt_status st = dt_peers_recv(a->peers, 0, DT_ACTOR_TAG_CTL, &a->ctl, 1, &a->ctl_in);
    if (!st) st = await_learner(a, DT_ACTOR_TAG_HEADER, &hd, sizeof hd, 120, "settings");
    if (st) return st;
    if (hd.magic != DT_ACTOR_MAGIC || hd.total < sizeof hd || a->index >= hd.actors)
        return dt_error(DT_ERR_MISMATCH, "impala actor %d (rank %d): the learner's settings are not what this build lays out, or it "
                        "has fewer actors", a->index, a->index + 1);
    if (!(a->h = calloc(1, hd.total)) || !(a->wbuf = malloc(sizeof(int64_t) + sizeof(float) * hd.nparams)))
        return dt_error(DT_ERR_NOMEM, "impala actor %d: %zu bytes for the settings and slots", a->index, (size_t)hd.total);
    memcpy(a->h, &hd, sizeof hd);
    atomic_store(&a->h->version, -1);
    if (hd.start_off)
        st = await_learner(a, DT_ACTOR_TAG_START, dt_actor_start_at(a->h, a->index),
                           2 * sizeof(int64_t) + (size_t)hd.n * hd.env_rec * sizeof(double), 120, "starting point");
    if (!st) st = dt_peers_recv(a->peers, 0, DT_ACTOR_TAG_WEIGHTS, a->wbuf, sizeof(int64_t) + sizeof(float) * hd.nparams, &a->w_in);
    return st;
}

int dt_rl_actor_remote_main(dt_peers *peers) {
    static const char failed = DT_ACTOR_FAILED;
    actor a = { .index = dt_peers_rank(peers) - 1, .free_slots = DT_ACTOR_SLOTS, .have = -1, .peers = peers };
    dt_kernels_set_threads(1); /* as a local actor: the batches are small */
    dt_status st = remote_settings(&a);
    a.heard = dt_time_now();
    if (!st) st = run(&a);
    if (st) {
        dt_log(DT_LOG_ERROR, "rl: %s", dt_last_error());
        dt_peers_say(peers, 0, DT_ACTOR_TAG_CTL, &failed, 1);
        dt_peers_lost(peers); /* the learner may end before this rank's goodbye lands */
    }
    dt_peers_drop(&a.ctl_in);
    dt_peers_drop(&a.w_in);
    free(a.wbuf);
    int sent = 1; /* a slot still in flight keeps its memory (the send may still read it) */
    for (int s = 0; s < DT_ACTOR_SLOTS; s++) {
        for (double t0 = dt_time_now(); !dt_peers_done(&a.out[s]) && dt_time_now() - t0 < 1.0;)
            nanosleep(&(struct timespec){ 0, 1000000 }, NULL);
        if (a.out[s]) sent = 0, dt_peers_drop(&a.out[s]);
    }
    if (sent) free(a.h);
    return st ? 1 : 0;
}
