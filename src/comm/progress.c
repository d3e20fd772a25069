/* Nonblocking collectives: a background thread per communicator runs queued
 * requests in the order they were issued, so the caller computes while
 * communication proceeds (DDP starts a bucket's allreduce the moment backward
 * has written it). Only one thread ever runs collectives on a communicator
 * at a time: blocking calls first drain the queue. */
#include "comm_internal.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

struct dt_request {
    dt_comm *c;
    coll_args a;
    dt_algo algo;
    _Atomic bool done;
    dt_status st;
    char err[1024];
    coll_args *more;  /* what runs after a, in order (an ialltoallv's exchanges); NULL: a alone */
    int nmore;
    dt_request *next;
};

struct dt_progress {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, finished;
    dt_request *head, *tail;
    int pending; /* queued or running */
    bool stop;
    _Atomic int blocked; /* owner threads inside dt_wait */
};

static dt_status run_one(dt_comm *c, const coll_args *a, dt_algo algo) {
    return a->coll == DT_COLL_SENDRECV ? dt_p2p_run(c, a) : dt_coll_execute(c, a, algo);
}

static void *progress_main(void *arg) {
    dt_comm *c = arg;
    dt_progress *pg = c->progress;
    dt_wait_owner_blocked = &pg->blocked;
    dt_trace_set_thread_track(DT_TRACK_COMM);
    pthread_mutex_lock(&pg->mu);
    for (;;) {
        while (!pg->head && !pg->stop) pthread_cond_wait(&pg->work, &pg->mu);
        if (!pg->head) break;
        dt_request *r = pg->head;
        pg->head = r->next;
        if (!pg->head) pg->tail = NULL;
        pthread_mutex_unlock(&pg->mu);
        dt_status st = run_one(c, &r->a, r->algo);
        for (int i = 0; !st && i < r->nmore; i++) st = run_one(c, &r->more[i], r->algo);
        pthread_mutex_lock(&pg->mu);
        r->st = st;
        if (st) strncpy(r->err, dt_last_error(), sizeof r->err - 1);
        r->done = true;
        pg->pending--;
        pthread_cond_broadcast(&pg->finished);
    }
    pthread_mutex_unlock(&pg->mu);
    return NULL;
}

static dt_status progress_start(dt_comm *c) {
    if (c->progress) return DT_OK;
    dt_progress *pg = calloc(1, sizeof *pg);
    if (!pg) return dt_error(DT_ERR_NOMEM, "progress thread: out of memory");
    pthread_mutex_init(&pg->mu, NULL);
    pthread_cond_init(&pg->work, NULL);
    pthread_cond_init(&pg->finished, NULL);
    c->progress = pg;
    if (pthread_create(&pg->thread, NULL, progress_main, c) != 0) {
        c->progress = NULL;
        free(pg);
        return dt_error(DT_ERR_SYS, "cannot start the progress thread");
    }
    return DT_OK;
}

dt_status dt_progress_drain(dt_comm *c) {
    dt_progress *pg = c->progress;
    if (!pg) return DT_OK;
    pthread_mutex_lock(&pg->mu);
    while (pg->pending) pthread_cond_wait(&pg->finished, &pg->mu);
    pthread_mutex_unlock(&pg->mu);
    return DT_OK;
}

void dt_progress_destroy(dt_comm *c) {
    dt_progress *pg = c->progress;
    if (!pg) return;
    pthread_mutex_lock(&pg->mu);
    pg->stop = true;
    pthread_cond_broadcast(&pg->work);
    pthread_mutex_unlock(&pg->mu);
    pthread_join(pg->thread, NULL);
    pthread_mutex_destroy(&pg->mu);
    pthread_cond_destroy(&pg->work);
    pthread_cond_destroy(&pg->finished);
    free(pg);
    c->progress = NULL;
}

/* a, then more[0..nmore) (taken: freed with the request), run as one request. */
static dt_status submit_all(dt_comm *c, const coll_args *a, coll_args *more, int nmore, size_t bytes, dt_request **out) {
    *out = NULL;
    dt_status st = progress_start(c);
    dt_request *r = st ? NULL : calloc(1, sizeof *r);
    if (!r) {
        free(more);
        return st ? st : dt_error(DT_ERR_NOMEM, "%s: out of memory for the request", dt_coll_name(a->coll));
    }
    r->c = c;
    r->a = *a;
    r->more = more;
    r->nmore = nmore;
    r->algo = dt_comm_choose_algo(c, a->coll, bytes);
    dt_progress *pg = c->progress;
    pthread_mutex_lock(&pg->mu);
    if (pg->tail) pg->tail->next = r;
    else pg->head = r;
    pg->tail = r;
    pg->pending++;
    pthread_cond_signal(&pg->work);
    pthread_mutex_unlock(&pg->mu);
    *out = r;
    return DT_OK;
}

static dt_status submit(dt_comm *c, const coll_args *a, size_t bytes, dt_request **out) {
    if (!out) return dt_error(DT_ERR_ARG, "%s: request pointer is NULL", dt_coll_name(a->coll));
    return submit_all(c, a, NULL, 0, bytes, out);
}

dt_status dt_test(dt_request *r, int *done) {
    if (!r || !done) return dt_error(DT_ERR_ARG, "dt_test: NULL argument");
    dt_progress *pg = r->c->progress;
    pthread_mutex_lock(&pg->mu);
    *done = r->done;
    pthread_mutex_unlock(&pg->mu);
    return DT_OK;
}

dt_status dt_wait(dt_request *r) {
    if (!r) return dt_error(DT_ERR_ARG, "dt_wait: request is NULL");
    dt_progress *pg = r->c->progress;
    atomic_fetch_add(&pg->blocked, 1);
    /* what the caller waits for is communication it could not hide: the trace's exposed time */
    DT_TRACE_BEGIN(DT_TRACK_SELF, "wait", "\"for\":\"%s\"", dt_coll_name(r->a.coll));
    /* A request about to finish is common (the last bucket): look for a
     * while before paying for a sleep and a wake-up. */
    double t0 = dt_time_now();
    while (!atomic_load(&r->done) && dt_time_now() - t0 < 50e-6) {}
    pthread_mutex_lock(&pg->mu);
    while (!r->done) pthread_cond_wait(&pg->finished, &pg->mu);
    pthread_mutex_unlock(&pg->mu);
    atomic_fetch_sub(&pg->blocked, 1);
    DT_TRACE_END(DT_TRACK_SELF);
    dt_status st = r->st;
    if (st) dt_error(st, "%s", r->err);
    free(r->more);
    free(r);
    return st;
}

dt_status dt_waitall(dt_request **reqs, int n) {
    dt_status first = DT_OK;
    for (int i = 0; i < n; i++) {
        if (!reqs[i]) continue;
        dt_status st = dt_wait(reqs[i]);
        reqs[i] = NULL;
        if (st && !first) first = st;
    }
    return first;
}

/* Checked when issued, so a bad argument fails at the call, not at dt_wait. */
static dt_status check(dt_comm *c, const char *what, const void *s, const void *r, size_t count, dt_dtype t, int op) {
    if (!c) return dt_error(DT_ERR_ARG, "%s: communicator is NULL", what);
    if ((unsigned)t >= DT_DTYPE_COUNT) return dt_error(DT_ERR_ARG, "%s: unknown dtype %d", what, (int)t);
    if (op >= 0 && (unsigned)op >= DT_OP_COUNT) return dt_error(DT_ERR_ARG, "%s: unknown op %d", what, op);
    if (count > SIZE_MAX / dt_dtype_size(t) / (size_t)c->size) return dt_error(DT_ERR_ARG, "%s: count %zu overflows", what, count);
    if (count && (!s || !r)) return dt_error(DT_ERR_ARG, "%s: NULL buffer with count %zu", what, count);
    return DT_OK;
}

dt_status dt_comm_iallreduce(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op, dt_request **req) {
    dt_status st = check(c, "iallreduce", s, r, count, t, (int)op);
    if (st) return st;
    coll_args a = { .coll = DT_COLL_ALLREDUCE, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t), req);
}

dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op, dt_request **req) {
    dt_status st = check(c, "ireduce_scatter", s, r, count, t, (int)op);
    if (st) return st;
    coll_args a = { .coll = DT_COLL_REDUCE_SCATTER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t) * (size_t)c->size, req);
}

dt_status dt_comm_ireduce(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op, int root, dt_request **req) {
    dt_status st = check(c, "ireduce", s, r ? r : s, count, t, (int)op);
    if (st) return st;
    if (root < 0 || root >= c->size) return dt_error(DT_ERR_ARG, "ireduce: root %d is not a rank (size %d)", root, c->size);
    if (count && c->rank == root && !r) return dt_error(DT_ERR_ARG, "ireduce: NULL recvbuf at the root");
    coll_args a = { .coll = DT_COLL_REDUCE, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .root = root, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t), req);
}

dt_status dt_comm_iallgather(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_request **req) {
    dt_status st = check(c, "iallgather", s, r, count, t, -1);
    if (st) return st;
    coll_args a = { .coll = DT_COLL_ALLGATHER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t) * (size_t)c->size, req);
}

dt_status dt_comm_ialltoall(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_request **req) {
    dt_status st = check(c, "ialltoall", s, r, count, t, -1);
    if (st) return st;
    coll_args a = { .coll = DT_COLL_ALLTOALL, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t) * (size_t)c->size, req);
}

dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root, dt_request **req) {
    dt_status st = check(c, "ibroadcast", buf, buf, count, t, -1);
    if (st) return st;
    if (root < 0 || root >= c->size) return dt_error(DT_ERR_ARG, "ibroadcast: root %d is not a rank (size %d)", root, c->size);
    coll_args a = { .coll = DT_COLL_BROADCAST, .sendbuf = buf, .recvbuf = buf, .count = count, .dtype = t, .op = DT_SUM, .root = root, .source = -1 };
    return submit(c, &a, count * dt_dtype_size(t), req);
}

dt_status dt_comm_isendrecv(dt_comm *c, const void *s, size_t scount, int dest, void *r, size_t rcount, int source, dt_dtype t,
                            dt_request **req) {
    dt_status st = check(c, "isendrecv", s ? s : r, r ? r : s, 0, t, -1);
    if (st) return st;
    if (dest >= c->size || source >= c->size || (dest < 0 && source < 0))
        return dt_error(DT_ERR_ARG, "isendrecv: peers %d and %d are not ranks of this communicator (size %d)", dest, source, c->size);
    if (dest < 0) scount = 0;
    if (source < 0) rcount = 0;
    if ((scount && !s) || (rcount && !r)) return dt_error(DT_ERR_ARG, "isendrecv: NULL buffer with a count");
    coll_args a = { .coll = DT_COLL_SENDRECV, .sendbuf = s, .recvbuf = r, .count = scount, .dtype = t, .op = DT_SUM, .root = dest,
                    .rcount = rcount, .source = source };
    return submit(c, &a, (scount > rcount ? scount : rcount) * dt_dtype_size(t), req);
}

dt_status dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer, dt_request **req) {
    return dt_comm_isendrecv(c, buf, count, peer, NULL, 0, -1, t, req);
}

dt_status dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer, dt_request **req) {
    return dt_comm_isendrecv(c, NULL, 0, -1, buf, count, peer, t, req);
}

/* Rank r sends to r + s while it receives from r - s at step s (s = 1 .. p - 1): every rank's step s pairs with its
 * peers' step s, so the exchanges, run in order by the progress thread, never wait on one another. A pair with nothing
 * either way is skipped by both (each knows both counts). Its own block is copied now. */
dt_status dt_comm_ialltoallv(dt_comm *c, const void *s, const size_t *scounts, const size_t *sdispls, void *r, const size_t *rcounts,
                             const size_t *rdispls, dt_dtype t, dt_request **req) {
    dt_status st = check(c, "ialltoallv", s, r, 0, t, -1);
    if (st) return st;
    if (!req || !scounts || !rcounts) return dt_error(DT_ERR_ARG, "ialltoallv: needs the counts both ways and a request pointer");
    *req = NULL;
    int p = c->size, me = c->rank;
    size_t es = dt_dtype_size(t), so = 0, ro = 0, bytes = 0;
    coll_args *steps = malloc(sizeof *steps * (size_t)p);
    size_t *sat = malloc(sizeof *sat * (size_t)p), *rat = malloc(sizeof *rat * (size_t)p);
    if (!steps || !sat || !rat) st = dt_error(DT_ERR_NOMEM, "ialltoallv: out of memory");
    for (int j = 0; !st && j < p; j++) {
        sat[j] = sdispls ? sdispls[j] : so, rat[j] = rdispls ? rdispls[j] : ro;
        so += scounts[j], ro += rcounts[j];
        if ((scounts[j] && !s) || (rcounts[j] && !r)) st = dt_error(DT_ERR_ARG, "ialltoallv: NULL buffer with a count");
    }
    if (!st && scounts[me] != rcounts[me])
        st = dt_error(DT_ERR_ARG, "ialltoallv: rank %d sends itself %zu elements and expects %zu", me, scounts[me], rcounts[me]);
    int n = 0;
    for (int k = 1; !st && k < p; k++) {
        int to = (me + k) % p, from = (me - k + p) % p;
        if (!scounts[to] && !rcounts[from]) continue;
        steps[n++] = (coll_args){ .coll = DT_COLL_SENDRECV, .sendbuf = scounts[to] ? (const char *)s + sat[to] * es : NULL,
                                  .recvbuf = rcounts[from] ? (char *)r + rat[from] * es : NULL, .count = scounts[to], .dtype = t,
                                  .op = DT_SUM, .root = scounts[to] ? to : -1, .rcount = rcounts[from], .source = rcounts[from] ? from : -1 };
        bytes += (scounts[to] > rcounts[from] ? scounts[to] : rcounts[from]) * es;
    }
    if (!st && scounts[me]) memmove((char *)r + rat[me] * es, (const char *)s + sat[me] * es, scounts[me] * es);
    free(sat);
    free(rat);
    if (st || !n) {
        free(steps);
        return st;
    }
    coll_args first = steps[0];
    memmove(steps, steps + 1, sizeof *steps * (size_t)(n - 1));
    return submit_all(c, &first, steps, n - 1, bytes, req);
}
