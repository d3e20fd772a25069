/* IMPALA's actors, the learner's side (see actors.h): each actor is this
 * program run again as `rl actor I`, with the shared memory on fd 3 and its
 * socket on fd 4. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "actors_internal.h"
#include "rollout.h"

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define READY_MS 120000 /* an actor's start: a bridged environment imports gymnasium first */

double dt_rl_actor_timeout(const dt_rl_config *c) { return c->actor_timeout > 0 ? c->actor_timeout : 10; }
int dt_rl_actors_count(const dt_rl_actors *a) { return a->na; }
int dt_rl_actors_alive(const dt_rl_actors *a, int i) { return a->a[i].alive; }
int dt_rl_actors_live(const dt_rl_actors *a) { return a->live; }
dt_actor_shared *dt_rl_actors_shared(dt_rl_actors *a) { return a->h; }

/* Actor i is gone: said, reaped (a local one), left out. why: a remote one's (silent: for the timeout). */
static void lost(dt_rl_actors *a, int i, const char *why) {
    actor *x = &a->a[i];
    char how[128], who[128];
    if (a->peers) {
        snprintf(who, sizeof who, "rank %d on %s", i + 1, x->host[0] ? x->host : "its machine");
        if (!strcmp(why, "silent")) snprintf(how, sizeof how, "has been silent for %.0f s", a->timeout);
        else snprintf(how, sizeof how, "%s", why);
        dt_actors_remote_forget(a, i);
    } else {
        snprintf(who, sizeof who, "pid %d", x->pid);
        if (dt_child_reap(x->pid, 1.0, how, sizeof how)) x->pid = 0; /* reaped: nothing for destroy to wait for */
        close(x->fd);
        x->fd = -1;
    }
    x->alive = 0;
    a->live--;
    dt_log(DT_LOG_WARN, "impala: actor %d (%s, environments %d-%d) %s; the learner goes on with %d of %d actors", i, who,
           i * a->h->n, (i + 1) * a->h->n - 1, how, a->live, a->na);
}

static dt_status start(dt_rl_actors *a, int i, int mfd, const char *exe) {
    char idx[16];
    snprintf(idx, sizeof idx, "%d", i);
    char *argv[] = { (char *)exe, "rl", "actor", idx, NULL };
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return dt_error(DT_ERR_SYS, "impala: socketpair: %s", strerror(errno));
    int pid = 0;
    dt_status st = dt_child_start(exe, argv, mfd, sv[1], &pid);
    close(sv[1]);
    if (st) {
        close(sv[0]);
        return dt_error(DT_ERR_SYS, "impala: %s", dt_last_error());
    }
    a->a[i] = (actor){ .alive = 1, .pid = pid, .fd = sv[0] };
    a->live++;
    return DT_OK;
}

/* Each actor's 'R' (or its end, which is the error: it said why on stderr). */
static dt_status await_ready(dt_rl_actors *a) {
    for (int i = 0; i < a->na; i++) {
        struct pollfd p = { a->a[i].fd, POLLIN, 0 };
        char c = 0;
        int r;
        while ((r = poll(&p, 1, READY_MS)) < 0 && errno == EINTR) {}
        if (r == 0) return dt_error(DT_ERR_PEER, "impala: actor %d did not start within %d s", i, READY_MS / 1000);
        if (read(a->a[i].fd, &c, 1) != 1 || c != DT_ACTOR_READY) {
            char how[96];
            if (dt_child_reap(a->a[i].pid, 1.0, how, sizeof how)) a->a[i].pid = 0;
            return dt_error(DT_ERR_PEER, "impala: actor %d could not start: it %s (its error is above)", i, how);
        }
    }
    return DT_OK;
}

static size_t round64(size_t n) { return (n + 63) / 64 * 64; }

static dt_status map_shared(dt_rl_actors *a, const dt_rl_config *c, const dt_env_info *in, int K, size_t nparams, int keep_state,
                            bool starts, int *mfd) {
    size_t rl = (size_t)in->obs_dim + in->act_dim + DT_RL_NFIELDS, n = (size_t)(c->num_envs / c->actors);
    size_t erec = dt_rollout_env_len_of(in->obs_dim, c->norm_obs, c->norm_reward);
    size_t slot = round64(sizeof(dt_actor_slot) + (c->norm_obs ? 2 * sizeof(double) * (size_t)in->obs_dim : 0) +
                          (keep_state ? sizeof(double) * n * erec : 0) + sizeof(float) * (size_t)(c->num_steps + 1) * n * rl);
    size_t woff = round64(sizeof(dt_actor_shared)), soff = round64(woff + sizeof(float) * nparams);
    size_t start_off = starts ? soff + slot * DT_ACTOR_SLOTS * (size_t)c->actors : 0;
    size_t total = starts ? start_off + (2 * sizeof(int64_t) + n * erec * sizeof(double)) * (size_t)c->actors
                          : soff + slot * DT_ACTOR_SLOTS * (size_t)c->actors;
    *mfd = memfd_create("dtrain-impala", MFD_CLOEXEC);
    if (*mfd < 0 || ftruncate(*mfd, (off_t)total))
        return dt_error(DT_ERR_SYS, "impala: shared memory of %zu bytes: %s", total, strerror(errno));
    void *m = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, *mfd, 0);
    if (m == MAP_FAILED) return dt_error(DT_ERR_SYS, "impala: mmap of %zu bytes: %s", total, strerror(errno));
    dt_actor_shared *h = a->h = m;
    *h = (dt_actor_shared){ .magic = DT_ACTOR_MAGIC, .workers = c->bridge ? c->bridge->workers : 0, .actors = c->actors,
                            .n = c->num_envs / c->actors, .T = c->num_steps, .od = in->obs_dim, .ad = in->act_dim, .K = K,
                            .hidden = c->hidden, .continuous = !in->actions, .norm_obs = c->norm_obs,
                            .norm_reward = c->norm_reward, .trunc_as_term = c->trunc_as_term, .sync = c->sync,
                            .refresh = c->refresh, .timeout = dt_rl_actor_timeout(c),
                            .keep_state = keep_state, .async_threads = c->async_threads,
                            .gamma = c->gamma, .seed = c->seed,
                            .env_rec = erec, .nparams = nparams, .slot_bytes = slot, .weights_off = woff, .slots_off = soff,
                            .start_off = start_off, .total = total };
    if (c->async_threads) (void)dt_rollout_async_batch(c, h->n, "impala", "an actor's", &h->async_batch); /* checked by the learner */
    snprintf(h->env, sizeof h->env, "%s", c->env);
    snprintf(h->python, sizeof h->python, "%s", c->bridge && c->bridge->python ? c->bridge->python : "");
    atomic_store(&h->version, -1);
    return DT_OK;
}

/* Each actor's start, where the actors read it when they begin. */
static void put_starts(dt_actor_shared *h, const dt_actors_start *s) {
    for (int i = 0; i < h->actors; i++) {
        int64_t *at = dt_actor_start_at(h, i);
        at[0] = s->rollouts[i], at[1] = s->pool_steps[i];
        memcpy(at + 2, s->records + (size_t)i * h->n * h->env_rec, sizeof(double) * (size_t)h->n * h->env_rec);
    }
}

dt_status dt_rl_actors_create(const dt_rl_config *c, const dt_env_info *in, int K, size_t nparams, int keep_state,
                              const dt_actors_start *start_at, dt_rl_actors **out) {
    *out = NULL;
    if (strlen(c->env) >= sizeof(((dt_actor_shared *)0)->env))
        return dt_error(DT_ERR_ARG, "impala: the environment's name is longer than %zu bytes",
                        sizeof(((dt_actor_shared *)0)->env) - 1);
    char exe[4096]; /* found before fork: the child only execs */
    ssize_t k = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (k <= 0) return dt_error(DT_ERR_SYS, "impala: cannot find this program (/proc/self/exe): %s", strerror(errno));
    exe[k] = 0;
    dt_rl_actors *a = calloc(1, sizeof *a);
    if (!a || !(a->a = calloc((size_t)c->actors, sizeof *a->a)) || !(a->p = calloc((size_t)c->actors, sizeof *a->p))) {
        if (a) free(a->a);
        free(a);
        return dt_error(DT_ERR_NOMEM, "impala: out of memory");
    }
    a->na = c->actors;
    a->last = -1;
    a->peers = c->peers;
    a->timeout = dt_rl_actor_timeout(c);
    for (int i = 0; i < a->na; i++) a->a[i].fd = -1;
    int mfd = -1;
    dt_status st = map_shared(a, c, in, K, nparams, keep_state, start_at != NULL, &mfd);
    if (!st && start_at) put_starts(a->h, start_at);
    if (!st && a->peers) st = dt_actors_remote_start(a);
    for (int i = 0; !st && !a->peers && i < a->na; i++) st = start(a, i, mfd, exe);
    if (mfd >= 0) close(mfd);
    if (!st && !a->peers) st = await_ready(a);
    if (st) dt_rl_actors_destroy(a);
    else *out = a;
    return st;
}

void dt_rl_actors_destroy(dt_rl_actors *a) {
    if (!a) return;
    if (a->peers && a->h) dt_actors_remote_end(a, lost);
    for (int i = 0; i < a->na; i++)
        if (a->a[i].fd >= 0) close(a->a[i].fd);
    double end = dt_time_now() + 1.0;
    for (int i = 0; i < a->na; i++) {
        if (a->a[i].pid <= 0) continue;
        while (waitpid(a->a[i].pid, NULL, WNOHANG) == 0) {
            if (dt_time_now() > end) { kill(a->a[i].pid, SIGKILL); waitpid(a->a[i].pid, NULL, 0); break; }
            nanosleep(&(struct timespec){ 0, 5000000 }, NULL);
        }
    }
    if (a->h) munmap(a->h, a->h->total);
    free(a->a);
    free(a->p);
    free(a);
}

/* A message to every live actor (one that is gone is found by take). */
static void tell(dt_rl_actors *a, int i, char c) {
    if (a->peers) dt_actors_remote_tell(a, i, c);
    else if (a->a[i].alive) (void)!send(a->a[i].fd, &c, 1, MSG_NOSIGNAL);
}

void dt_rl_actors_publish(dt_rl_actors *a, const float *params, int64_t version) {
    dt_actor_shared *h = a->h;
    uint64_t s = atomic_load_explicit(&h->seq, memory_order_relaxed);
    atomic_store_explicit(&h->seq, s + 1, memory_order_relaxed);
    atomic_thread_fence(memory_order_release);
    memcpy((char *)h + h->weights_off, params, sizeof(float) * h->nparams);
    atomic_store_explicit(&h->version, version, memory_order_relaxed);
    atomic_store_explicit(&h->seq, s + 2, memory_order_release);
    if (a->peers) dt_actors_remote_publish(a);
    else
        for (int i = 0; i < a->na; i++) tell(a, i, DT_ACTOR_WEIGHTS);
}

/* What actor i said since the last read (slot messages), without waiting; 0, or -1 once it is gone. */
static int hear(dt_rl_actors *a, int i) {
    char buf[64];
    ssize_t k;
    while ((k = recv(a->a[i].fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) a->a[i].full += (int)k;
    if (k == 0 || (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
    return 0;
}

static dt_actor_slot *give(dt_rl_actors *a, int i, int *who) {
    actor *x = &a->a[i];
    int s = x->next;
    x->next = (x->next + 1) % DT_ACTOR_SLOTS;
    x->full--;
    *who = i;
    a->last = i;
    return dt_actor_slot_at(a->h, i, s);
}

dt_status dt_rl_actors_take(dt_rl_actors *a, int want, int *who, dt_actor_slot **slot) {
    *slot = NULL;
    struct pollfd *p = a->p;
    dt_status st = DT_OK;
    for (;;) {
        if (!a->live) { st = dt_error(DT_ERR_PEER, "impala: every actor is gone (said above)"); break; }
        if (want >= 0 && !a->a[want].alive) break;
        int pick = -1;
        for (int k = 0; k < a->na && pick < 0; k++) {
            int i = want >= 0 ? want : (a->last + 1 + k) % a->na;
            if (a->a[i].alive && a->a[i].full > 0) pick = i;
            if (want >= 0) break;
        }
        if (pick >= 0) { *slot = give(a, pick, who); break; }
        if (a->peers) { dt_actors_remote_wait(a, lost); continue; }
        for (int i = 0; i < a->na; i++) p[i] = (struct pollfd){ (want < 0 || i == want) ? a->a[i].fd : -1, POLLIN, 0 };
        if (poll(p, (nfds_t)a->na, 1000) < 0 && errno != EINTR) { st = dt_error(DT_ERR_SYS, "impala: poll: %s", strerror(errno)); break; }
        for (int i = 0; i < a->na; i++)
            if (p[i].fd >= 0 && p[i].revents && hear(a, i) < 0) lost(a, i, NULL);
    }
    return st;
}

void dt_rl_actors_release(dt_rl_actors *a, int i) {
    if (a->peers) dt_actors_remote_release(a, i);
    else tell(a, i, DT_ACTOR_FREE);
}
