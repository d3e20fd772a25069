/* dtrain comm layer: communicators, transports (self, shm, mpi), collective
 * algorithms, algorithm selection, nonblocking requests.
 *
 * One API whatever the transport. Ranks on one machine talk through one
 * shared-memory segment; ranks on different machines through MPI. Buffers
 * from dt_comm_alloc live in that segment, so collectives on them are
 * zero-copy: peers read and write them directly. */
#ifndef DTRAIN_COMM_H
#define DTRAIN_COMM_H

#include "dtrain/base.h"

#include <stdbool.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dt_comm dt_comm;
typedef struct dt_request dt_request;

typedef enum { DT_SUM = 0, DT_AVG, DT_MAX, DT_MIN, DT_PROD, DT_OP_COUNT } dt_op;

typedef enum {
    DT_COLL_ALLREDUCE = 0, DT_COLL_REDUCE_SCATTER, DT_COLL_ALLGATHER, DT_COLL_BROADCAST,
    DT_COLL_REDUCE, DT_COLL_ALLTOALL, DT_COLL_GATHER, DT_COLL_SCATTER, DT_COLL_BARRIER,
    DT_COLL_SENDRECV, DT_COLL_ALLTOALLV, DT_COLL_COUNT
} dt_coll;

typedef enum {
    DT_ALGO_AUTO = 0,
    DT_ALGO_SHM_DIRECT,   /* each rank works straight on its peers' mapped buffers */
    DT_ALGO_RING,         /* reduce-scatter + allgather around a ring */
    DT_ALGO_TREE,         /* binomial tree */
    DT_ALGO_RD,           /* recursive doubling */
    DT_ALGO_RABENSEIFNER, /* recursive halving reduce-scatter + doubling allgather */
    DT_ALGO_BRUCK,        /* Bruck allgather / alltoall */
    DT_ALGO_PAIRWISE,     /* pairwise exchange (alltoall), linear (gather/scatter) */
    DT_ALGO_HIER,         /* intra-node shm, inter-node MPI, intra-node shm */
    DT_ALGO_COUNT
} dt_algo;

const char *dt_op_name(dt_op op);
const char *dt_coll_name(dt_coll c);
const char *dt_algo_name(dt_algo a);
dt_status dt_op_parse(const char *s, dt_op *out);
dt_status dt_coll_parse(const char *s, dt_coll *out);
dt_status dt_algo_parse(const char *s, dt_algo *out);

/* How this process was started, from its environment: the one answer that
 * dt_comm_init, `dtrain train --nproc` and the benchmarks all go by. Fails,
 * saying what to change, for a job whose ranks could never find each other:
 * srun with several tasks but no PMI (each task would train alone), or an
 * MPI launch of a build without MPI. */
typedef enum { DT_LAUNCH_NONE = 0, DT_LAUNCH_LOCAL, DT_LAUNCH_MPI } dt_launch_kind;
dt_status dt_comm_detect_launch(dt_launch_kind *kind);
/* Whether this process speaks for the job about what every rank would say
 * alike (warnings on the command line and config), from the environment
 * before dt_comm_init: not a rank of `dtrain launch`/--nproc (the launcher
 * has said it), and rank 0 of an mpirun/srun job. */
int dt_comm_first_voice(void);

/* The world communicator from the environment: a `dtrain launch` child, an
 * mpirun/srun rank, or a lone process (size 1). */
dt_status dt_comm_init(dt_comm **world);
dt_status dt_comm_destroy(dt_comm *comm);
/* Collective over comm: ranks with the same color form a new communicator,
 * ordered by (key, old rank). color < 0 gives *out = NULL. */
dt_status dt_comm_split(dt_comm *comm, int color, int key, dt_comm **out);

int dt_comm_rank(const dt_comm *comm);
int dt_comm_size(const dt_comm *comm);
int dt_comm_local_rank(const dt_comm *comm);
int dt_comm_local_size(const dt_comm *comm);
/* A rank's threads where --threads is not given: OMP_NUM_THREADS where the environment names a count (as OpenMP
 * programs and PyTorch take it; `dtrain launch` sets it to this share for its ranks); otherwise its share of the cores
 * it may use (dt_cpu_allowed: its affinity mask and its control group's CPU quota, or Slurm's cpus-per-task), divided
 * among the ranks on its machine where that is all the machine gives the job (a launcher that binds gives each rank
 * its own), so that ranks x threads never oversubscribe by default. comm NULL: one process. */
int dt_comm_default_threads(const dt_comm *comm);
/* OMP_NUM_THREADS's count ("4", or the first of libgomp's nested "4,2"); 0 where it names none. */
int dt_comm_threads_asked(void);
int dt_comm_node(const dt_comm *comm);
int dt_comm_nodes(const dt_comm *comm);
/* True (with the reason in msg) once the job is failing: a rank on this
 * machine died or exited without dt_comm_destroy, or the job was aborted.
 * Reads shared state only, so a watchdog thread may call it while the
 * owner runs collectives (dtrain train stops within a second this way even
 * in the middle of a long backward). */
bool dt_comm_failed(dt_comm *comm, char *msg, size_t cap);
/* The collective this process is in, or ran last ("in broadcast #12 (...)"),
 * for a message about a failed job; safe from any thread. */
void dt_comm_activity(char *buf, size_t cap);
/* What this rank is doing (a training step), shown by peers that report it
 * as stopped: a rank on this machine stopped for 3 s (SIGSTOP, Ctrl-Z, a
 * debugger) also makes dt_comm_failed true, and aborts the job naming it. */
void dt_comm_set_progress(dt_comm *comm, int64_t step);
/* Across machines, dt_comm_failed also exchanges heartbeats (each rank with
 * the next): a rank silent for 4 s (stopped, or its machine gone) fails the
 * job naming it. A rank whose watcher stops calls this first, so that its
 * silence is not taken for a failure. */
void dt_comm_watch_end(dt_comm *comm);
/* A rank on this machine that waits this long for one peer that is alive
 * but does not join (stuck in a loop, deadlocked, in a call another rank
 * never makes) logs a warning naming the peer, its state and its step; at
 * twice this the job stops with that message; a wait on a peer on another
 * machine warns the same way and stops the job at three times this (the
 * peer's own machine names a stuck rank first, with its state). 0 turns it
 * off. Communicators split later inherit it. */
#define DT_STALL_TIMEOUT_DEFAULT 300.0
void dt_comm_set_stall_timeout(dt_comm *comm, double seconds);
/* "self", "shm", "mpi" or "shm+mpi". */
const char *dt_comm_transport(const dt_comm *comm);

/* Shared arena: memory that peers on this machine can read and write. It is
 * pre-faulted. Collectives on arena buffers skip the copy into shared memory. */
dt_status dt_comm_alloc(dt_comm *comm, size_t bytes, void **out);
void dt_comm_free(dt_comm *comm, void *p);
/* The same, zeroed but not pre-faulted: its pages come as they are first
 * written (a ZeRO rank's gradient store, of which it keeps only a shard). */
dt_status dt_comm_alloc_sparse(dt_comm *comm, size_t bytes, void **out);
/* Collective: one buffer that every rank of comm maps (all of them on one
 * machine), untouched (its pages come as they are written; never pre-faulted),
 * alive as long as the shared segment. ZeRO's ranks keep one copy of the
 * parameters in it, each rank writing its shard. */
dt_status dt_comm_alloc_shared(dt_comm *comm, size_t bytes, void **out);
/* [p, p + bytes) of an arena buffer (or any private memory) reads as zeros
 * and its whole pages go back to the system until touched again (ZeRO
 * keeps only its shard of a gradient resident). */
void dt_comm_release(dt_comm *comm, void *p, size_t bytes);
/* The whole pages [at, at + bytes) of an arena buffer show the arena's pages
 * at `from` instead of their own: writes through `at` land there (a ZeRO
 * rank's gradient buckets borrow a small pool's pages instead of faulting in
 * fresh ones every step). The pages are mapped now. `from` == `at` gives the
 * range its own pages back, unmapped (they may be holes). Other ranks, and
 * collectives, see only the arena's own layout: pass them `from`'s address.
 * Both page-aligned; DT_ERR_ARG where either is not in the shared arena. */
dt_status dt_comm_map_pages(dt_comm *comm, void *at, const void *from, size_t bytes);
/* Whether [p, p + bytes) is in the shared arena (dt_comm_map_pages can remap it). */
int dt_comm_in_arena(const dt_comm *comm, const void *p, size_t bytes);

/* The cost model's link parameters (seconds, seconds a byte): inside a machine (shared memory's), the reduction's, and
 * between machines (MPI's); the calibration file's (dtrain bench comm --calibrate) or the defaults. */
void dt_comm_link_costs(double *intra_alpha, double *intra_beta, double *gamma, double *inter_alpha, double *inter_beta);
/* How much longer a core's compute takes beside an exchange between machines, over alone, less 1: the link's processing
 * on the ranks' cores, as the calibration measured it (0 where it did not). */
double dt_comm_link_slowdown(void);
/* Force an algorithm for one collective (DT_ALGO_AUTO restores the cost
 * model). The environment variable DTRAIN_ALGO=<algo> forces all of them,
 * DTRAIN_ALGO_<COLL>=<algo> (e.g. DTRAIN_ALGO_ALLREDUCE=ring) one. */
dt_status dt_comm_set_algo(dt_comm *comm, dt_coll coll, dt_algo algo);
/* The algorithm auto would run for this collective and size in bytes. */
dt_algo dt_comm_choose_algo(dt_comm *comm, dt_coll coll, size_t bytes);

/* Blocking collectives. Counts are in elements. sendbuf == recvbuf is allowed
 * where the shapes agree (allreduce; reduce at the root). Results are
 * bit-identical on every rank and every run for a given algorithm. */
dt_status dt_comm_allreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                            dt_dtype dtype, dt_op op);
/* sendbuf holds size*recvcount elements; rank r gets block r, reduced. */
dt_status dt_comm_reduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t recvcount,
                                 dt_dtype dtype, dt_op op);
/* recvbuf holds size*sendcount elements, block r from rank r. */
dt_status dt_comm_allgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                            dt_dtype dtype);
dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root);
/* Per-rank counts (shards that do not divide evenly): rank r contributes
 * counts[r] elements (allgatherv) or gets block r of counts[r] elements, the
 * blocks laid out one after another in rank order (reduce_scatterv). */
dt_status dt_comm_allgatherv(dt_comm *c, const void *sendbuf, void *recvbuf, const size_t *counts, dt_dtype dtype);
/* Whether ok holds on every rank of c (*all; c NULL: this process's ok), so that ranks that must act alike (fail
 * together, fall back together) decide alike. Collective. */
dt_status dt_comm_every(dt_comm *c, bool ok, bool *all);
/* Every rank's n elements (n its own) gathered in rank order into *all, allocated here (room for *total and one
 * more; the caller frees it): the counts first, then the blocks. c NULL: one process, a copy. A rank that cannot hold
 * the result says so to the others before the blocks move, and all fail alike. */
dt_status dt_comm_allgatherv_alloc(dt_comm *c, const void *mine, size_t n, dt_dtype dtype, void **all, size_t *total);
dt_status dt_comm_reduce_scatterv(dt_comm *c, const void *sendbuf, void *recvbuf, const size_t *counts, dt_dtype dtype,
                                  dt_op op);
dt_status dt_comm_reduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                         dt_dtype dtype, dt_op op, int root);
/* An all-to-all of uneven blocks (a mixture of experts' dispatch): sendbuf holds a block for every rank, sendcounts[j]
 * elements for rank j, one after another; recvbuf receives this rank's block from every rank, recvcounts[j] from
 * rank j (filled in), one after another in rank order. The counts travel with the blocks (small ones) or before them,
 * every rank's to every rank, so no rank waits on a shape another did not send (DeepSpeed #6809's hang); a rank whose
 * blocks would not fit its recvcap elements fails every rank with one message naming it, before any block lands. */
dt_status dt_comm_alltoallv(dt_comm *c, const void *sendbuf, const size_t *sendcounts, void *recvbuf, size_t recvcap,
                            size_t *recvcounts, dt_dtype dtype);
/* Across machines, the largest block (bytes) that travels in one message with its sender's counts over p ranks; a
 * larger one takes a second round of pairs after them (the planner prices the rounds by it). */
size_t dt_comm_alltoallv_ride(int p);
/* sendbuf and recvbuf hold size*count elements; block j goes to rank j. */
dt_status dt_comm_alltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                           dt_dtype dtype);
dt_status dt_comm_gather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                         dt_dtype dtype, int root);
dt_status dt_comm_scatter(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                          dt_dtype dtype, int root);
dt_status dt_comm_barrier(dt_comm *c);
/* Point to point. Messages between a pair arrive in order. A send may block
 * until the receiver takes it, as MPI_Send may. */
dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer);
dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer);
dt_status dt_comm_sendrecv(dt_comm *c, const void *sendbuf, size_t sendcount, int dest,
                           void *recvbuf, size_t recvcount, int source, dt_dtype dtype);

/* Nonblocking collectives, run by a background progress thread in the order
 * they were issued; buffers must stay untouched until the request completes.
 * A blocking collective issued while requests are pending runs after them. */
dt_status dt_comm_iallreduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count,
                             dt_dtype dtype, dt_op op, dt_request **req);
dt_status dt_comm_ireduce_scatter(dt_comm *c, const void *sendbuf, void *recvbuf,
                                  size_t recvcount, dt_dtype dtype, dt_op op, dt_request **req);
dt_status dt_comm_iallgather(dt_comm *c, const void *sendbuf, void *recvbuf, size_t sendcount,
                             dt_dtype dtype, dt_request **req);
/* dt_comm_alltoall's blocks (count elements each, block j to rank j), without blocking. */
dt_status dt_comm_ialltoall(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype dtype,
                            dt_request **req);
/* Uneven blocks without blocking, the counts known on both sides (exchanged before, e.g. by dt_comm_ialltoall): block
 * j, scounts[j] elements at sendbuf + sdispls[j], goes to rank j; rank j's rcounts[j] arrive at recvbuf + rdispls[j]
 * (displacements in elements; NULL: the blocks one after another in rank order). Blocks may overlap (sdispls all 0:
 * one block to every rank, an allgatherv). The exchange runs as point-to-point pairs, rank r sending to r + s while
 * receiving from r - s at step s. *req is NULL where nothing travels (one rank, or counts of 0 both ways). */
dt_status dt_comm_ialltoallv(dt_comm *c, const void *sendbuf, const size_t *scounts, const size_t *sdispls, void *recvbuf,
                             const size_t *rcounts, const size_t *rdispls, dt_dtype dtype, dt_request **req);
/* recvbuf matters at the root only (it may be sendbuf there). */
dt_status dt_comm_ireduce(dt_comm *c, const void *sendbuf, void *recvbuf, size_t count, dt_dtype dtype, dt_op op,
                          int root, dt_request **req);
dt_status dt_comm_ibroadcast(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int root,
                             dt_request **req);
/* Point to point without blocking (pipeline stages): the send half and the
 * receive half of one isendrecv progress together, so two ranks exchanging
 * with each other (or a ring of them) never deadlock however large the
 * messages; requests issued separately run one after another, in order,
 * like every nonblocking call on a communicator. dest or source < 0: that
 * half is absent (isend, irecv). */
dt_status dt_comm_isendrecv(dt_comm *c, const void *sendbuf, size_t sendcount, int dest, void *recvbuf, size_t recvcount,
                            int source, dt_dtype dtype, dt_request **req);
dt_status dt_comm_isend(dt_comm *c, const void *buf, size_t count, dt_dtype dtype, int peer, dt_request **req);
dt_status dt_comm_irecv(dt_comm *c, void *buf, size_t count, dt_dtype dtype, int peer, dt_request **req);
/* Waits for the request, frees it and returns its status. */
dt_status dt_wait(dt_request *req);
/* Waits for every non-NULL request (each set to NULL); the first failure's status. */
dt_status dt_waitall(dt_request **reqs, int n);
/* *done = 1 once complete; the request must still be passed to dt_wait. */
dt_status dt_test(dt_request *req, int *done);

/* Mailbox (mailbox.c): messages of `bytes` one way between the two ranks of
 * comm, both on this machine, through `slots` slots in the shared arena.
 * Create is collective over comm (DT_ERR_ARG where comm is not two ranks
 * of one machine's shared memory; DT_ERR_NOMEM where the arena has no
 * room). put (the sender, rank `sender` of comm) copies a message into the
 * next slot and returns; it waits only while every slot holds a message not
 * yet released. get (the receiver) waits for the next message and gives
 * where it lies; the receiver reads it there, then releases it (the oldest
 * held first). Waits fail naming a dead or stalled peer, as collectives do. */
typedef struct dt_mailbox dt_mailbox;
dt_status dt_mailbox_create(dt_comm *comm, int sender, size_t bytes, int slots, dt_mailbox **out);
void dt_mailbox_destroy(dt_mailbox *m);
dt_status dt_mailbox_put(dt_mailbox *m, const void *buf);
dt_status dt_mailbox_get(dt_mailbox *m, const void **buf);
void dt_mailbox_release(dt_mailbox *m);

/* Peers (mpi_peers.c): tagged messages between the ranks of an MPI job
 * that outlive a rank's death, for an actor-learner where a lost actor is
 * named and left out rather than the job's end. No watchdog and no
 * heartbeat ring here (the world's would end every rank): the caller
 * decides when a silent peer is gone. The job needs Open MPI's `mpirun
 * --enable-recovery`, without which mpirun itself ends the job at a death.
 * A message is posted and then tested until it is done; one to or from a
 * rank that is gone is dropped (its buffer must live until the process
 * ends). Destroy finalizes MPI unless a rank was said lost: Open MPI's
 * MPI_Finalize waits for a dead rank forever. */
typedef struct dt_peers dt_peers;
typedef struct dt_peer_msg dt_peer_msg;
/* MPI started (or joined) for this process; DT_ERR_ARG where it was not launched by MPI or the build has none. */
dt_status dt_peers_create(dt_peers **out);
void dt_peers_destroy(dt_peers *p);
/* Some rank of the job is gone (or may be): destroy leaves MPI unfinalized. */
void dt_peers_lost(dt_peers *p);
/* A thread that ends this process, saying so, once one call into MPI has run for more than `seconds` (every call here
 * should return at once: one that does not would hold the caller past any timeout of its own). Once, before any
 * message; stopped by destroy. */
dt_status dt_peers_guard(dt_peers *p, double seconds);
int dt_peers_rank(const dt_peers *p);
int dt_peers_size(const dt_peers *p);
dt_status dt_peers_send(dt_peers *p, int peer, int tag, const void *buf, size_t bytes, dt_peer_msg **out);
dt_status dt_peers_recv(dt_peers *p, int peer, int tag, void *buf, size_t bytes, dt_peer_msg **out);
/* A message sent and forgotten (buf must live until the process ends: it is not copied). */
void dt_peers_say(dt_peers *p, int peer, int tag, const void *buf, size_t bytes);
/* 1: done, -1: failed (MPI says the peer cannot be reached), *m freed and set NULL either way; 0: still pending. A NULL
 * *m is done. */
int dt_peers_done(dt_peer_msg **m);
/* A pending message abandoned (a receive cancelled, a send forgotten); *m set NULL. */
void dt_peers_drop(dt_peer_msg **m);

/* Local launch: fork n copies of argv[0..] wired over shared memory, watch
 * them, and return the job's exit code (0 when every rank exited 0). A rank
 * that dies makes the others fail within a second; the launcher names it. */
int dt_comm_launch(int n, char *const argv[]);

#ifdef __cplusplus
}
#endif
#endif
