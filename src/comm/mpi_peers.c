/* Peers (see comm.h): MPI's point to point on a communicator of its own,
 * errors returned rather than fatal, nothing that waits on a peer. Every
 * call into MPI is timed for the guard (dt_peers_guard): a call that does
 * not return is the one wait that no caller's timeout can see. */
#include "dtrain/comm.h"
#include "dtrain/base.h"

#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dt_peers {
    MPI_Comm comm;
    int rank, size;
    bool started_here, lost, guarded;
    double bound;
    _Atomic double inside_since; /* when the call into MPI now running began; 0 outside */
    _Atomic int inside_peer, stop;
    pthread_t guard;
};

struct dt_peer_msg {
    MPI_Request req;
    dt_peers *p;
    int peer;
};

static void enter(dt_peers *p, int peer) {
    atomic_store(&p->inside_peer, peer);
    atomic_store(&p->inside_since, dt_time_now());
}

static void leave(dt_peers *p) { atomic_store(&p->inside_since, 0.0); }

static void *guard(void *arg) {
    dt_peers *p = arg;
    while (!atomic_load(&p->stop)) {
        usleep(50000);
        double since = atomic_load(&p->inside_since), now = dt_time_now();
        if (since <= 0 || now - since <= p->bound) continue;
        dt_log(DT_LOG_ERROR, "peers: rank %d has been inside one MPI call (a message with rank %d) for more than %g s; Open MPI "
               "4.1's TCP transport can spin there after a write to a rank that died: this rank ends rather than hang",
               p->rank, atomic_load(&p->inside_peer), p->bound);
        fflush(stdout);
        _exit(1);
    }
    return NULL;
}

dt_status dt_peers_guard(dt_peers *p, double seconds) {
    if (p->guarded || seconds <= 0) return dt_error(DT_ERR_ARG, "peers: a guard of %g s (one, longer than 0 s)", seconds);
    p->bound = seconds;
    if (pthread_create(&p->guard, NULL, guard, p)) return dt_error(DT_ERR_SYS, "peers: cannot start the guard thread");
    p->guarded = true;
    return DT_OK;
}

dt_status dt_peers_create(dt_peers **out) {
    *out = NULL;
    int inited = 0, level;
    MPI_Initialized(&inited);
    dt_peers *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "peers: out of memory");
    if (!inited) {
        MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &level);
        p->started_here = true;
    }
    /* a write to a dead rank's socket raises SIGPIPE inside MPI, whose default ends this rank without a word (measured:
     * the learner vanished when an actor on another machine was killed): ignored, the write fails and the peer falls
     * silent as it should */
    signal(SIGPIPE, SIG_IGN);
    MPI_Comm_dup(MPI_COMM_WORLD, &p->comm);
    MPI_Comm_set_errhandler(p->comm, MPI_ERRORS_RETURN); /* a rank that is gone is the caller's to name */
    MPI_Comm_rank(p->comm, &p->rank);
    MPI_Comm_size(p->comm, &p->size);
    *out = p;
    return DT_OK;
}

void dt_peers_lost(dt_peers *p) { p->lost = true; }

void dt_peers_destroy(dt_peers *p) {
    if (!p) return;
    if (p->guarded) { /* before MPI's own end: a finalize may wait as long as the job's launcher lets it */
        atomic_store(&p->stop, 1);
        pthread_join(p->guard, NULL);
    }
    if (!p->lost) {
        MPI_Comm_free(&p->comm);
        if (p->started_here) MPI_Finalize();
    }
    free(p);
}

int dt_peers_rank(const dt_peers *p) { return p->rank; }
int dt_peers_size(const dt_peers *p) { return p->size; }

static dt_status post(dt_peers *p, int peer, int tag, void *buf, size_t bytes, int send, dt_peer_msg **out) {
    *out = NULL;
    if (bytes > (size_t)1 << 30) return dt_error(DT_ERR_ARG, "peers: a message of %zu bytes (at most 1 GiB)", bytes);
    dt_peer_msg *m = malloc(sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "peers: out of memory");
    m->p = p;
    m->peer = peer;
    enter(p, peer);
    int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &m->req)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &m->req);
    leave(p);
    if (rc != MPI_SUCCESS) {
        free(m);
        return dt_error(DT_ERR_PEER, "peers: %s rank %d failed (MPI error %d)", send ? "a send to" : "a receive from", peer, rc);
    }
    *out = m;
    return DT_OK;
}

dt_status dt_peers_send(dt_peers *p, int peer, int tag, const void *buf, size_t bytes, dt_peer_msg **out) {
    return post(p, peer, tag, (void *)buf, bytes, 1, out);
}

dt_status dt_peers_recv(dt_peers *p, int peer, int tag, void *buf, size_t bytes, dt_peer_msg **out) {
    return post(p, peer, tag, buf, bytes, 0, out);
}

void dt_peers_say(dt_peers *p, int peer, int tag, const void *buf, size_t bytes) {
    MPI_Request r;
    if (bytes > (size_t)1 << 30) return;
    enter(p, peer);
    if (MPI_Isend((void *)buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &r) == MPI_SUCCESS) MPI_Request_free(&r);
    leave(p);
}

int dt_peers_done(dt_peer_msg **m) {
    if (!*m) return 1;
    enter((*m)->p, (*m)->peer);
    int flag = 0, rc = MPI_Test(&(*m)->req, &flag, MPI_STATUS_IGNORE);
    leave((*m)->p);
    if (rc == MPI_SUCCESS && !flag) return 0;
    free(*m);
    *m = NULL;
    return rc == MPI_SUCCESS ? 1 : -1;
}

void dt_peers_drop(dt_peer_msg **m) {
    if (!*m) return;
    int flag = 0;
    enter((*m)->p, (*m)->peer);
    MPI_Test(&(*m)->req, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
        MPI_Cancel(&(*m)->req); /* a receive's; a send's cancel may not take, and then it is forgotten */
        MPI_Request_free(&(*m)->req);
    }
    leave((*m)->p);
    free(*m);
    *m = NULL;
}
