/* The MPI transport: world creation under mpirun/srun, point-to-point with
 * ranks on other machines, and failure notices between machines.
 *
 * Ranks on one machine (MPI_COMM_TYPE_SHARED, or DTRAIN_FAKE_NODES=k to cut
 * one machine into k pseudo-nodes for testing) share a memfd segment: the
 * first creates it, the others open /proc/<pid>/fd/<n>, so it never has a
 * name. Between machines messages go through MPI, tagged with the
 * collective and its sequence number, so a mismatch is caught on receipt.
 * A rank that fails sends its message to every rank on a separate
 * communicator; every MPI wait polls for such a notice, so no rank hangs.
 * mpirun ends the whole job at the first rank's exit, so a rank that sent
 * notices waits at exit (up to NOTICE_LINGER) for each receiver to
 * acknowledge, which a receiver does at its own exit, after its message is
 * out: otherwise the other machines are killed before they can say why. */
#include "comm_internal.h"

#include <fcntl.h>
#include <mpi.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ABORT_TAG 1
#define ACK_TAG 3 /* heartbeats use 2 */
#define NOTICE_LINGER 1.0
#define MSG_CHUNK (1u << 30) /* MPI counts are int */
_Static_assert(sizeof(MPI_Request) <= sizeof(uint64_t), "dt_mpi_xfer stores MPI_Request in 8 bytes");

typedef struct {
    MPI_Comm comm;       /* collectives and p2p of this dt_comm */
    MPI_Comm notice;     /* failure notices (world only; sub-comms share the world's) */
    MPI_Request notice_req;
    char notice_buf[1024];
    bool own_notice;
    int notice_from;     /* who sent the notice received, or -1 */
    int notified;        /* notices this rank sent, each to be acknowledged */
} mpi_part;

static bool mpi_started_here;
static int thread_level;
static mpi_part *world_part;

/* Open MPI as Debian builds it speaks PMIx only: srun --mpi=pmi2 would abort
 * inside MPI_Init with a message about PMI support, so say what to change. */
dt_status dt_mpi_launch_check(bool pmix) {
#ifdef OMPI_MAJOR_VERSION
    if (!pmix && getenv("SLURM_PROCID"))
        return dt_error(DT_ERR_ARG, "srun gave this task PMI-1/PMI-2 (--mpi=pmi2), which this Open MPI cannot use: "
                        "run srun --mpi=pmix");
#else
    (void)pmix;
#endif
    return DT_OK;
}

static dt_status mpi_err(int rc, const char *what) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return dt_error(DT_ERR_SYS, "MPI: %s failed: %s", what, msg);
}

/* Has another rank told us the job failed? */
static const char *notice_check(void) {
    if (!world_part) return NULL;
    int flag = 0;
    MPI_Status s;
    MPI_Test(&world_part->notice_req, &flag, &s);
    if (!flag) return NULL;
    world_part->notice_buf[sizeof world_part->notice_buf - 1] = 0;
    world_part->notice_from = s.MPI_SOURCE;
    /* Keep it readable by later checks. */
    world_part->notice_req = MPI_REQUEST_NULL;
    return world_part->notice_buf;
}

static void notice_send(const char *msg) {
    if (!world_part) return;
    int p;
    MPI_Comm_size(world_part->notice, &p);
    int me;
    MPI_Comm_rank(world_part->notice, &me);
    for (int j = 0; j < p; j++) {
        if (j == me) continue;
        MPI_Request r;
        MPI_Isend(msg, (int)strlen(msg) + 1, MPI_CHAR, j, ABORT_TAG, world_part->notice, &r);
        MPI_Request_free(&r);
        world_part->notified++;
    }
}

/* At exit (atexit): acknowledge the notice this rank received, then wait for
 * the acknowledgements of the notices it sent. A receiver that is dead, or
 * busy elsewhere, costs NOTICE_LINGER at most. A normal end has freed
 * world_part, so this does nothing then. */
static void notice_linger(void) {
    int up = 0, down = 0;
    MPI_Initialized(&up);
    MPI_Finalized(&down);
    mpi_part *m = world_part;
    if (!up || down || !m) return;
    char b = 'a';
    double t0 = dt_time_now();
    for (int acks = 0, acked = 0;;) {
        if (m->notice_req != MPI_REQUEST_NULL) notice_check(); /* a notice that crossed ours */
        if (!acked && m->notice_from >= 0) {
            MPI_Request r;
            MPI_Isend(&b, 1, MPI_CHAR, m->notice_from, ACK_TAG, m->notice, &r);
            MPI_Request_free(&r);
            acked = 1;
        }
        for (int got = 1; got;) {
            MPI_Iprobe(MPI_ANY_SOURCE, ACK_TAG, m->notice, &got, MPI_STATUS_IGNORE);
            if (got) { MPI_Recv(&b, 1, MPI_CHAR, MPI_ANY_SOURCE, ACK_TAG, m->notice, MPI_STATUS_IGNORE); acks++; }
        }
        /* The ack's send is eager; a little time lets it leave before the process does. */
        double waited = dt_time_now() - t0;
        if ((acks >= m->notified && waited > 0.01) || waited > NOTICE_LINGER) return;
        usleep(1000);
    }
}

static const char *notice_text(void) {
    static bool seen;
    if (!world_part) return NULL;
    if (seen) return world_part->notice_buf;
    if (world_part->notice_req == MPI_REQUEST_NULL || notice_check()) { seen = true; return world_part->notice_buf; }
    return NULL;
}

/* Heartbeats between machines, for a rank that stops without dying (SIGSTOP,
 * a debugger, a frozen machine): nothing on its machine may be left to see
 * it, and its peers would wait in MPI forever. Each rank's watchdog sends a
 * byte to its successor in the world every HB_PERIOD and expects one from its
 * predecessor; HB_SILENT seconds of silence fail the job naming the
 * predecessor. A rank that ends normally says goodbye ('b') first. Only the
 * watchdog thread touches this state (dt_mpi_watch_end runs after it is
 * joined). */
#define HB_TAG 2
#define HB_PERIOD 0.5
#define HB_SILENT 4.0
static struct {
    MPI_Request send, recv;
    char out, in;
    double last_in, last_out;
    bool started, pred_left, ended;
} hb;

bool dt_mpi_heartbeat(dt_comm *c, char *msg, size_t cap) {
    /* the watchdog is a thread of its own: MPI must allow calls from any thread */
    if (!world_part || c->mpi != world_part || c->nodes < 2 || hb.ended || thread_level < MPI_THREAD_MULTIPLE) return false;
    MPI_Comm nc = world_part->notice;
    int p, me;
    MPI_Comm_size(nc, &p);
    MPI_Comm_rank(nc, &me);
    int pred = (me + p - 1) % p, succ = (me + 1) % p;
    double now = dt_time_now();
    if (!hb.started) {
        hb.started = true;
        hb.last_in = now;
        hb.send = MPI_REQUEST_NULL;
        MPI_Irecv(&hb.in, 1, MPI_CHAR, pred, HB_TAG, nc, &hb.recv);
    }
    if (now - hb.last_out >= HB_PERIOD) {
        int sent = 1;
        if (hb.send != MPI_REQUEST_NULL) MPI_Test(&hb.send, &sent, MPI_STATUS_IGNORE);
        if (sent) {
            hb.out = 'h';
            MPI_Isend(&hb.out, 1, MPI_CHAR, succ, HB_TAG, nc, &hb.send);
            hb.last_out = now;
        }
    }
    for (int got = 1; got && !hb.pred_left;) {
        MPI_Test(&hb.recv, &got, MPI_STATUS_IGNORE);
        if (!got) break;
        hb.last_in = now;
        if (hb.in == 'b') hb.pred_left = true;
        else MPI_Irecv(&hb.in, 1, MPI_CHAR, pred, HB_TAG, nc, &hb.recv);
    }
    if (hb.pred_left || now - hb.last_in <= HB_SILENT) return false;
    snprintf(msg, cap, "rank %d has sent no heartbeat for %.1f s (stopped by SIGSTOP or a debugger, or its machine is "
             "unreachable); rank %d stops the job", pred, now - hb.last_in, me);
    notice_send(msg);
    return true;
}

void dt_mpi_watch_end(dt_comm *c) {
    if (!hb.started || hb.ended || !world_part || c->mpi != world_part) return;
    hb.ended = true;
    int p, me;
    MPI_Comm_size(world_part->notice, &p);
    MPI_Comm_rank(world_part->notice, &me);
    if (hb.send != MPI_REQUEST_NULL) MPI_Wait(&hb.send, MPI_STATUS_IGNORE);
    hb.out = 'b';
    MPI_Send(&hb.out, 1, MPI_CHAR, (me + 1) % p, HB_TAG, world_part->notice);
    if (!hb.pred_left) {
        MPI_Cancel(&hb.recv);
        MPI_Request_free(&hb.recv);
    }
}

/* Called when a collective fails on this rank: tell the other machines. */
void dt_mpi_fail(dt_comm *c, const char *msg) {
    if (c->mpi && !notice_text()) notice_send(msg);
}

dt_status dt_mpi_check_abort(dt_comm *c) {
    const char *m = notice_text();
    if (!m) return DT_OK;
    char d[256];
    dt_desc_format(&c->cur, d, sizeof d);
    return dt_error(DT_ERR_PEER, "%s [rank %d was in %s]", m, c->world_rank, d);
}

static int tag_of(const dt_comm *c) { return 2 + (int)(((c->seq & 0x3ff) << 4) | (c->cur.coll & 0xf)); }

/* Waits for MPI requests, also progressing nothing else; fails on a notice
 * or a local abort. */
/* A peer on another machine that has not sent its part for the stall
 * timeout: warned once, and at three times that the job stops naming it. Its
 * heartbeat still comes (or the watchdog would have stopped the job), so it
 * is alive: stuck in a loop, deadlocked, or in a call the others never make.
 * The peer may itself be waiting for a stuck rank on its own machine; that
 * machine names the real culprit at 2x (with its state), so this wait gives
 * it the first word and speaks only at 3x. */
static dt_status mpi_stall(dt_comm *c, int peer, double waited, bool *warned) {
    if (c->stall_timeout <= 0 || peer < 0 || waited < c->stall_timeout) return DT_OK;
    char d[256], msg[640];
    dt_desc_format(&c->cur, d, sizeof d);
    snprintf(msg, sizeof msg, "rank %d (on another machine, alive: its heartbeat comes) has sent nothing for %.3g s while rank "
             "%d waited for it in %s (stuck in a loop, deadlocked, or in a call the others never make?)", peer, waited,
             c->world_rank, d);
    if (waited < 3 * c->stall_timeout) {
        if (!*warned) dt_log(DT_LOG_WARN, "%s; the job stops at %.3g s (--stall-timeout)", msg, 3 * c->stall_timeout);
        *warned = true;
        return DT_OK;
    }
    dt_mpi_fail(c, msg);
    if (c->seg) dt_segment_abort(c->seg, "%s", msg);
    return dt_error(DT_ERR_PEER, "%s", msg);
}

/* While it waits on another machine, a rank also looks after its own machine's peers every 5 ms, as a wait on shared
 * memory does: a peer here that died is named here (and the news sent on) even when every rank that would wait for it
 * on shared memory waits through MPI instead (a pairwise exchange whose ranks each wait on another machine). */
#define PEERS_EVERY 5e-3

static dt_status mpi_wait_all(dt_comm *c, int n, MPI_Request *reqs, MPI_Status *sts, int peer) {
    double t0 = 0, peers_at = 0;
    bool warned = false;
    for (unsigned spins = 0;; spins++) {
        int flag = 0;
        int rc = MPI_Testall(n, reqs, &flag, sts);
        if (rc != MPI_SUCCESS) return mpi_err(rc, "message completion");
        if (flag) return DT_OK;
        if ((spins & 255) == 255) {
            dt_status st = dt_mpi_check_abort(c);
            if (!st && c->seg) st = dt_shm_check_abort(c);
            double now = dt_time_now();
            if (t0 == 0) t0 = peers_at = now;
            if (!st && c->seg && c->slots && now - peers_at >= PEERS_EVERY) {
                st = dt_group_check_peers(c, -1, NULL, NULL);
                peers_at = now;
            }
            if (!st) st = mpi_stall(c, peer, now - t0, &warned);
            if (st) return st;
            sched_yield();
        }
    }
}

/* Posts the remote halves of an exchange; dt_mpi_finish completes them
 * after the caller has done the shared-memory halves. */
dt_status dt_mpi_start(dt_comm *c, int speer, const void *sbuf, size_t sbytes, int rpeer, void *rbuf, size_t rbytes,
                       dt_dtype dtype, int op, dt_mpi_xfer *x) {
    mpi_part *m = c->mpi;
    memset(x, 0, sizeof *x);
    if (!m) return dt_error(DT_ERR_UNSUPPORTED, "a peer is on another machine but this communicator has no MPI part");
    x->rbuf = rbuf;
    x->rbytes = rbytes;
    x->rpeer = rpeer;
    x->dtype = dtype;
    x->op = op;
    x->tag = tag_of(c);
    if (rbytes && op >= 0) {
        x->tmp = dt_comm_work(c, 1, rbytes);
        if (!x->tmp) return dt_error(DT_ERR_NOMEM, "MPI receive: no memory for %zu bytes", rbytes);
    }
    uint8_t *dst = x->tmp ? x->tmp : rbuf;
    MPI_Request *reqs = (MPI_Request *)x->reqs;
    for (size_t o = 0; o < rbytes && x->n < DT_MPI_MAXREQ / 2; o += MSG_CHUNK) {
        size_t len = rbytes - o < MSG_CHUNK ? rbytes - o : MSG_CHUNK;
        /* Any tag: a message of another collective is received and reported, not left waiting. */
        MPI_Irecv(dst + o, (int)len, MPI_BYTE, rpeer, MPI_ANY_TAG, m->comm, &reqs[x->n++]);
    }
    x->nrecv = x->n;
    for (size_t o = 0; o < sbytes && x->n < DT_MPI_MAXREQ; o += MSG_CHUNK) {
        size_t len = sbytes - o < MSG_CHUNK ? sbytes - o : MSG_CHUNK;
        MPI_Isend((const uint8_t *)sbuf + o, (int)len, MPI_BYTE, speer, x->tag, m->comm, &reqs[x->n++]);
    }
    return DT_OK;
}

dt_status dt_mpi_finish(dt_comm *c, dt_mpi_xfer *x) {
    if (!x->n) return DT_OK;
    MPI_Status sts[DT_MPI_MAXREQ];
    dt_status st = mpi_wait_all(c, x->n, (MPI_Request *)x->reqs, sts, x->nrecv ? x->rpeer : -1);
    char mine[200];
    if (st == DT_ERR_SYS && strstr(dt_last_error(), "truncat")) {
        dt_desc_format(&c->cur, mine, sizeof mine);
        return dt_error(DT_ERR_MISMATCH, "collective mismatch: rank %d in %s received more than the %zu bytes it expected from rank %d",
                        c->world_rank, mine, x->rbytes, x->rpeer);
    }
    if (st) return st;
    for (int k = 0; k < x->nrecv; k++) {
        int cnt = 0;
        MPI_Get_count(&sts[k], MPI_BYTE, &cnt);
        size_t rest = x->rbytes - (size_t)k * MSG_CHUNK, want = rest < MSG_CHUNK ? rest : MSG_CHUNK;
        if (sts[k].MPI_TAG != x->tag || (x->upto ? cnt < 1 || (size_t)cnt > want : (size_t)cnt != want)) {
            dt_desc_format(&c->cur, mine, sizeof mine);
            int their = sts[k].MPI_TAG - 2;
            return dt_error(DT_ERR_MISMATCH, "collective mismatch: rank %d in %s expected %s%zu bytes from rank %d, which sent %d bytes for %s #%d (mod 1024)",
                            c->world_rank, mine, x->upto ? "1 to " : "", want, x->rpeer, cnt, dt_coll_name((dt_coll)(their & 0xf)), their >> 4);
        }
        if (x->upto) x->rbytes = (size_t)cnt; /* one message (at most 1 GiB: dt_p2p_exchange_upto) */
    }
    if (x->tmp) dt_reduce_into(x->rbuf, x->tmp, x->rbytes / dt_dtype_size(x->dtype), x->dtype, (dt_op)x->op);
    return DT_OK;
}

static dt_status open_peer_fd(int pid, int fd, int *out) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", pid, fd);
    int f = open(path, O_RDWR | O_CLOEXEC);
    if (f < 0) return dt_error(DT_ERR_SYS, "cannot open the shared segment of local rank 0 (%s)", path);
    *out = f;
    return DT_OK;
}

/* Open MPI moves a large message over TCP by an emulated RDMA put whose
 * handshake rides the same connection as the bulk data going the other way,
 * and waits behind it: two ranks exchanging in both directions at once (every
 * ring step, every bucket) then often take 1.5-2x the link's time. Its
 * send/receive pipeline has no such wait (measured on tests/cluster's rig at
 * 1 Gbit/s: 14 MiB each way in two halves 167-242 ms with put, 121-126 ms
 * without; a d6 DDP step 769 -> 491 ms). So dtrain asks for it, unless the
 * user has set the flags (mpirun --mca btl_tcp_flags ... reaches us as this
 * variable). */
static void prefer_tcp_send_pipeline(void) {
#ifdef OPEN_MPI
    setenv("OMPI_MCA_btl_tcp_flags", "send,inplace,need-ack,need-csum,hetero-rdma", 0);
#endif
}

/* MPI started (or joined), and the world's own communicators: one for collectives, one for abort notices (a receive
 * posted for them now). */
static dt_status start_world(mpi_part **out) {
    int inited = 0;
    MPI_Initialized(&inited);
    if (!inited) {
        prefer_tcp_send_pipeline();
        MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, &thread_level);
        mpi_started_here = true;
    } else MPI_Query_thread(&thread_level);
    mpi_part *m = calloc(1, sizeof *m);
    if (!(*out = m)) return dt_error(DT_ERR_NOMEM, "MPI world: out of memory");
    MPI_Comm_dup(MPI_COMM_WORLD, &m->comm);
    MPI_Comm_dup(MPI_COMM_WORLD, &m->notice);
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_set_errhandler(m->notice, MPI_ERRORS_RETURN); /* a notice or heartbeat to a rank that is gone is no reason to abort */
    m->own_notice = true;
    m->notice_from = -1;
    atexit(notice_linger);
    MPI_Irecv(m->notice_buf, sizeof m->notice_buf, MPI_CHAR, MPI_ANY_SOURCE, ABORT_TAG, m->notice, &m->notice_req);
    world_part = m;
    return DT_OK;
}

/* This rank's machine: its communicator (MPI's shared-memory split, or DTRAIN_FAKE_NODES=k consecutive blocks), its
 * local rank and size, the machine's number and how many there are. */
static void machine_of(MPI_Comm world, int rank, int size, MPI_Comm *node, int *lr, int *ls, int *node_id, int *nodes) {
    const char *fake = getenv("DTRAIN_FAKE_NODES");
    int k = fake ? atoi(fake) : 0;
    if (k > 1 && k <= size) MPI_Comm_split(world, (int)((long)rank * k / size), rank, node);
    else MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, node);
    MPI_Comm_rank(*node, lr);
    MPI_Comm_size(*node, ls);
    MPI_Comm leaders;
    MPI_Comm_split(world, *lr == 0 ? 0 : MPI_UNDEFINED, rank, &leaders);
    *node_id = *nodes = 0;
    if (*lr == 0) {
        MPI_Comm_rank(leaders, node_id);
        MPI_Comm_size(leaders, nodes);
        MPI_Comm_free(&leaders);
    }
    MPI_Bcast(node_id, 1, MPI_INT, 0, *node);
    MPI_Bcast(nodes, 1, MPI_INT, 0, *node);
}

/* The machine's shared segment: its first rank makes it (and the world's control block), the others map it; every
 * rank of the world learns whether all could. */
static dt_status machine_segment(dt_comm *c, MPI_Comm node, MPI_Comm world) {
    int lr = c->local_rank, ls = c->local_size;
    dt_status st = DT_OK;
    long long info[3] = { 0, 0, 0 }; /* pid, fd, group offset */
    if (lr == 0) {
        st = dt_segment_create(0, ls, &c->seg);
        uint64_t off = 0;
        if (!st) st = dt_group_create(c, &off);
        if (!st) { info[0] = getpid(); info[1] = c->seg->fd; info[2] = (long long)off; }
    }
    MPI_Bcast(info, 3, MPI_LONG_LONG, 0, node);
    if (lr != 0 && info[0] == 0) st = dt_error(DT_ERR_SYS, "local rank 0 could not create the shared segment");
    if (!st && lr != 0) {
        int fd = -1;
        st = open_peer_fd((int)info[0], (int)info[1], &fd);
        if (!st) st = dt_segment_attach(fd, &c->seg);
        if (!st) st = dt_group_attach(c, (uint64_t)info[2]);
    }
    if (!st) {
        seg_proc *me = &c->seg->hdr->proc[lr];
        atomic_store(&me->world_rank, c->rank);
        atomic_store(&me->pid, (int32_t)getpid());
        dt_cma_register(me);
        atomic_store(&me->state, PROC_ALIVE);
    }
    int ok = st == DT_OK, all_ok = 0;
    MPI_Allreduce(&ok, &all_ok, 1, MPI_INT, MPI_MIN, world);
    if (!st && !all_ok) st = dt_error(DT_ERR_SYS, "another rank could not map its node's shared segment");
    return st;
}

dt_status dt_mpi_init_world(dt_comm **out) {
    mpi_part *m;
    dt_status st = start_world(&m);
    if (st) return st;
    int rank, size, lr, ls, node_id, nodes;
    MPI_Comm_rank(m->comm, &rank);
    MPI_Comm_size(m->comm, &size);
    MPI_Comm node;
    machine_of(m->comm, rank, size, &node, &lr, &ls, &node_id, &nodes);
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return dt_error(DT_ERR_NOMEM, "MPI world: out of memory");
    c->rank = rank;
    c->world_rank = rank;
    c->size = size;
    c->local_rank = lr;
    c->local_size = ls;
    c->node = node_id;
    c->nodes = nodes;
    c->mpi = m;
    c->oversubscribed = ls > dt_cpu_cores();
    if (dt_comm_alloc_tables(c)) { free(c); return dt_error(DT_ERR_NOMEM, "MPI world: out of memory"); }
    MPI_Allgather(&node_id, 1, MPI_INT, c->node_of, 1, MPI_INT, m->comm);
    int li = 0;
    for (int j = 0; j < size; j++) {
        if (c->node_of[j] == node_id) { c->local_members[li] = j; c->local_index[j] = li++; }
        else c->local_index[j] = -1;
    }
    for (int j = 0; j < ls; j++) c->proc_of[j] = j;
    if (ls > 1) st = machine_segment(c, node, m->comm);
    MPI_Comm_free(&node);
    c->transport = nodes > 1 ? (ls > 1 ? "shm+mpi" : "mpi") : "shm";
    if (st) return st;
    *out = c;
    /* Hierarchical algorithms need the same number of ranks on every machine. */
    int mn = ls, mx = ls;
    MPI_Allreduce(&ls, &mn, 1, MPI_INT, MPI_MIN, m->comm);
    MPI_Allreduce(&ls, &mx, 1, MPI_INT, MPI_MAX, m->comm);
    if (nodes > 1 && mn == mx && ls > 1) {
        st = dt_comm_split(c, node_id, rank, &c->node_comm);
        if (!st) st = dt_comm_split(c, lr, rank, &c->cross_comm);
    }
    return st;
}

dt_status dt_mpi_split(dt_comm *parent, int color, int key, dt_comm *child) {
    mpi_part *pm = parent->mpi;
    if (!pm) return DT_OK;
    MPI_Comm nc;
    int rc = MPI_Comm_split(pm->comm, color < 0 ? MPI_UNDEFINED : color, key, &nc);
    if (rc != MPI_SUCCESS) return mpi_err(rc, "MPI_Comm_split");
    if (!child) return DT_OK;
    mpi_part *m = calloc(1, sizeof *m);
    if (!m) { MPI_Comm_free(&nc); return dt_error(DT_ERR_NOMEM, "split: out of memory"); }
    m->comm = nc;
    MPI_Comm_set_errhandler(nc, MPI_ERRORS_RETURN);
    child->mpi = m;
    if (child->nodes > 1) child->transport = child->local_size > 1 ? "shm+mpi" : "mpi";
    return DT_OK;
}

void dt_mpi_comm_free(dt_comm *c) {
    mpi_part *m = c->mpi;
    if (!m) return;
    if (c->node_comm) { dt_comm_destroy(c->node_comm); c->node_comm = NULL; }
    if (c->cross_comm) { dt_comm_destroy(c->cross_comm); c->cross_comm = NULL; }
    if (m->own_notice) {
        /* Everyone leaves together, so no notice is in flight. */
        MPI_Barrier(m->comm);
        if (m->notice_req != MPI_REQUEST_NULL) { MPI_Cancel(&m->notice_req); MPI_Request_free(&m->notice_req); }
        MPI_Comm_free(&m->notice);
        world_part = NULL;
    }
    bool world = m->own_notice;
    MPI_Comm_free(&m->comm);
    free(m);
    c->mpi = NULL;
    if (world && mpi_started_here) { int fin = 0; MPI_Finalized(&fin); if (!fin) MPI_Finalize(); }
}
