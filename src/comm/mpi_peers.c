/* Peers (see comm.h): MPI's point to point on a communicator of its own,
 * errors returned rather than fatal, nothing that waits on a peer. */
#include "dtrain/comm.h"
#include "dtrain/base.h"

#include <mpi.h>
#include <signal.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

struct dt_peers {
    MPI_Comm comm;
    int rank, size;
    bool started_here, lost;
};

struct dt_peer_msg {
    MPI_Request req;
};

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
    int rc = send ? MPI_Isend(buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &m->req)
                  : MPI_Irecv(buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &m->req);
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
    if (bytes <= (size_t)1 << 30 && MPI_Isend((void *)buf, (int)bytes, MPI_BYTE, peer, tag, p->comm, &r) == MPI_SUCCESS)
        MPI_Request_free(&r);
}

int dt_peers_done(dt_peer_msg **m) {
    if (!*m) return 1;
    int flag = 0, rc = MPI_Test(&(*m)->req, &flag, MPI_STATUS_IGNORE);
    if (rc == MPI_SUCCESS && !flag) return 0;
    free(*m);
    *m = NULL;
    return rc == MPI_SUCCESS ? 1 : -1;
}

void dt_peers_drop(dt_peer_msg **m) {
    if (!*m) return;
    int flag = 0;
    MPI_Test(&(*m)->req, &flag, MPI_STATUS_IGNORE);
    if (!flag) {
        MPI_Cancel(&(*m)->req); /* a receive's; a send's cancel may not take, and then it is forgotten */
        MPI_Request_free(&(*m)->req);
    }
    free(*m);
    *m = NULL;
}
