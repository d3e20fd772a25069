/* Private to src/comm: the communicator object, the shared segment, the
 * per-communicator control block in it, waiting, and the interface that
 * every collective algorithm is written against. */
#ifndef DT_COMM_INTERNAL_H
#define DT_COMM_INTERNAL_H

#include "dtrain/comm.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define DT_MAX_LOCAL 256       /* ranks sharing one segment (one machine) */
#define DT_CELL_INLINE 4048    /* bytes carried inside a cell: small messages never leave it */
#define DT_CHAN_SLOTS 4        /* p2p channel: chunks in flight per ordered pair */
#define DT_CHAN_CHUNK (64 << 10)
#define DT_SCRATCH_BYTES (256u << 10) /* per-rank staging for private buffers: a chunk fits L2 on both sides */

/* ---- shared segment (one per machine, memfd-backed, never named in /dev/shm) ---- */

enum { PROC_UNUSED = 0, PROC_ALIVE, PROC_FINALIZED };

typedef struct {
    _Atomic int32_t pid;
    _Atomic int32_t state;
    _Atomic int32_t world_rank;
    int32_t pad1;
    _Atomic int64_t progress;    /* what the rank last reported doing (dtrain train: its step) */
    _Atomic uint64_t cma_word;   /* where a word of the rank's memory lies that a peer reads to try cross-memory attach */
    int32_t pad[8];
} seg_proc;

typedef struct {
    uint64_t magic;
    uint64_t size;
    _Atomic uint64_t heap_top;
    _Atomic int32_t abort_state; /* 0 none, 1 being written, 2 message ready */
    int32_t nprocs;
    int32_t launcher_pid;        /* dtrain launch, which reports how a rank died; 0 under MPI */
    char abort_msg[1024];
    seg_proc proc[DT_MAX_LOCAL];
} seg_header;

typedef struct dt_segment {
    seg_header *hdr;
    char *base;
    size_t size;
    int fd;
    int refs;
} dt_segment;

dt_status dt_segment_create(size_t size, int nprocs, dt_segment **out);
dt_status dt_segment_attach(int fd, dt_segment **out);
void dt_segment_release(dt_segment *s);
/* Bump allocation from the segment heap, 64-byte (or page, for big ones) aligned. */
dt_status dt_segment_alloc(dt_segment *s, size_t bytes, uint64_t *off);
/* Gives the pages back to the system; the address range is not reused. */
void dt_segment_free(dt_segment *s, uint64_t off, size_t bytes);
static inline void *dt_segment_ptr(dt_segment *s, uint64_t off) { return s->base + off; }
static inline bool dt_segment_contains(dt_segment *s, const void *p, size_t bytes) {
    const char *c = (const char *)p;
    return s && c >= s->base + sizeof(seg_header) && c + bytes <= s->base + s->size;
}
/* First abort wins; later ones keep the first message. */
void dt_segment_abort(dt_segment *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
const char *dt_segment_abort_message(dt_segment *s); /* NULL when not aborted */
/* Is the process behind proc slot i gone (exited, killed, zombie)? */
bool dt_segment_proc_dead(dt_segment *s, int i);
/* The process's state letter from /proc (R, S, D, T stopped, t traced, Z zombie, X gone), 0 if unknown. */
char dt_segment_proc_state(dt_segment *s, int i);
/* The process's state letter from /proc (R, S, D, T stopped, t traced, Z zombie, X gone), 0 if unknown. */
char dt_segment_proc_state(dt_segment *s, int i);

/* ---- per-communicator control block in the segment ---- */

/* What a rank is doing in collective number seq: compared between ranks to
 * catch mismatched calls. */
typedef struct {
    uint32_t coll, dtype, op, algo;
    int32_t root;
    uint32_t pad;
    uint64_t count;
    uint64_t seq;
} call_desc;

/* One per rank and per parity of seq. The arrival word holds 2*seq+2 once the
 * descriptor and data are published and 2*seq+1 while they are written, so a
 * reader can tell a stable cell from one being overwritten. */
typedef struct {
    _Atomic uint32_t arrive;
    _Atomic uint32_t pad0;
    _Atomic uint64_t desc[3];   /* call_desc packed, atomics so racy readers are defined */
    _Atomic uint64_t off[2];    /* segment offsets of the rank's send and recv buffers */
    uint8_t data[DT_CELL_INLINE];
} __attribute__((aligned(64))) shm_cell;

typedef struct {
    _Atomic uint32_t ring;      /* bumped by whoever may have unblocked this rank */
    _Atomic uint32_t sleeping;  /* set while this rank sleeps on ring */
    uint8_t pad0[56];           /* ring/sleeping change only around sleeps: keep them apart */
    _Atomic uint32_t step;      /* internal barriers passed (same count on every rank) */
    uint8_t pad1[60];
    shm_cell cell[2];
} __attribute__((aligned(64))) shm_slot;

typedef struct {
    _Atomic uint32_t head;      /* chunks written by the sender */
    uint8_t pad0[60];
    _Atomic uint32_t tail;      /* chunks consumed by the receiver */
    uint8_t pad1[60];
    /* seq and collective of the sender, this chunk's bytes and the whole
     * message's, so a receiver expecting another message notices at once */
    struct { uint64_t seq; uint64_t total; uint32_t coll; uint32_t bytes; } hdr[DT_CHAN_SLOTS];
    uint8_t data[DT_CHAN_SLOTS][DT_CHAN_CHUNK];
} __attribute__((aligned(64))) shm_chan;

typedef struct {
    uint64_t magic;
    int32_t n;
    int32_t pad;
    uint64_t slot_off, chan_off, scratch_off; /* offsets from the segment base */
} shm_group_hdr;

/* ---- communicator ---- */

typedef struct dt_progress dt_progress;

struct dt_comm {
    int rank, size;
    int world_rank;      /* for messages: ranks are named as the user knows them */
    int node, nodes;
    int local_rank, local_size;
    int *node_of;        /* [size] */
    int *local_index;    /* [size]: index among this node's members, -1 if remote */
    int *local_members;  /* [local_size]: comm ranks on this node, ascending */
    int *proc_of;        /* [local_size]: segment proc slot of each local member */

    dt_segment *seg;     /* NULL for a size-1 comm without a segment */
    shm_group_hdr *grp;
    shm_slot *slots;     /* [local_size] */
    uint64_t chan_base;  /* segment offset of channel [0][0] */
    uint8_t *scratch;    /* [local_size][DT_SCRATCH_BYTES] */
    uint32_t *peer_seen; /* [local_size] last seq (low 32 bits) at which each peer was seen arrived */
    double *peer_stopped; /* [local_size] when dt_comm_failed first saw each peer stopped (0: not stopped) */
    uint32_t step;       /* internal barriers passed by this rank */

    uint64_t seq;        /* collectives issued on this comm, this one included while running */
    call_desc cur;       /* the collective now running */
    bool oversubscribed;
    double stall_timeout; /* seconds a wait on one peer may last before it is reported (then 2x: the job stops); 0: never */

    void *work[2];       /* private scratch of the generic algorithms, kept between calls */
    size_t work_bytes[2];
    void *mpi;           /* MPI_Comm handle when the comm spans machines */
    dt_comm *node_comm;  /* this machine's members (hierarchical algorithms) */
    dt_comm *cross_comm; /* the members with my local rank on every machine */
    const char *transport;
    dt_algo forced[DT_COLL_COUNT];
    uint8_t choice[DT_COLL_COUNT][65]; /* auto's pick by bit length of the size, 0 = not yet asked */
    dt_progress *progress;
    bool refused;        /* the running collective's error is one every rank returns alike (a check they all made): the job
                          * goes on */
    int cma;             /* this rank reads the other local ranks' memory (process_vm_readv): 0 not yet tried, 1 can, -1 not */
    dt_comm *parent_world; /* the world comm owns the segment reference */
};

/* ---- waiting: spin, then yield, then futex sleep; checks for dead and mismatched peers ---- */

typedef bool (*wait_cond)(void *arg);
dt_status dt_shm_wait(dt_comm *c, wait_cond cond, void *arg, int waiting_for);
/* Set on progress threads to their owner's count of threads blocked in
 * dt_wait: while it is 0 the owner computes, and a progress thread's waits
 * sleep at once rather than spin on the core that compute needs; while the
 * owner is blocked anyway they spin first, as blocking calls do. */
extern _Thread_local _Atomic int *dt_wait_owner_blocked;
void dt_shm_notify(dt_comm *c, int local_peer);
/* The error for an aborted job, with this rank's current collective appended. */
dt_status dt_shm_check_abort(dt_comm *c);

/* ---- cell protocol (shm_group.c) ---- */

dt_status dt_group_create(dt_comm *c, uint64_t *off_out);      /* allocates and initialises */
dt_status dt_group_attach(dt_comm *c, uint64_t off);
/* Publish this rank's descriptor (and inline data, offsets) for the current seq. */
void dt_cell_publish(dt_comm *c, const void *inline_data, size_t bytes, uint64_t soff, uint64_t roff);
/* The same with the inline data in two pieces, one after the other (a header and a payload). */
void dt_cell_publish_parts(dt_comm *c, const void *a, size_t na, const void *b, size_t nb, uint64_t soff, uint64_t roff);
/* Wait until every local member has published the current seq; checks descriptors. */
dt_status dt_cell_wait_all(dt_comm *c);
shm_cell *dt_cell_of(dt_comm *c, int local_peer);
/* Barrier among the local members, inside a collective (after dt_cell_wait_all). */
dt_status dt_group_step(dt_comm *c);
/* Called by waits that take long: reports a peer whose published call differs. */
/* The per-rank tables of a communicator whose size and local_size are set. */
dt_status dt_comm_alloc_tables(dt_comm *c);
/* "rank 1 (pid 123): running (state R), at step 12" for local peer j. */
void dt_group_describe_peer(dt_comm *c, int j, char *buf, size_t cap);
/* A dead, departed or mismatched peer, as an error (and the job's abort). cond(arg), the waiter's condition, is looked
 * at again before the peer it waits for is blamed for leaving. */
dt_status dt_group_check_peers(dt_comm *c, int waiting_for, wait_cond cond, void *arg);
void dt_desc_format(const call_desc *d, char *buf, size_t cap);

/* ---- point to point (p2p.c): the interface ring, tree, RD, Rabenseifner and Bruck use ---- */

/* Sends sbytes to speer and receives rbytes from rpeer at once (either may be
 * -1 or 0 bytes). With op >= 0 the received data is reduced into rbuf
 * (rbuf = rbuf op received) instead of copied. */
dt_status dt_p2p_exchange(dt_comm *c, int speer, const void *sbuf, size_t sbytes,
                          int rpeer, void *rbuf, size_t rbytes, dt_dtype dtype, int op);
/* An exchange whose receiver does not know the message's length: it takes one of 1 to most bytes (at most 1 GiB) and
 * says its length in *got. A message of unknown length is never empty. */
dt_status dt_p2p_exchange_upto(dt_comm *c, int speer, const void *sbuf, size_t sbytes, int rpeer, void *rbuf, size_t most,
                               size_t *got);

/* Private work buffer k (0 or 1) of at least bytes, grown and pre-faulted
 * once so that no call maps fresh pages. NULL when out of memory. */
void *dt_comm_work(dt_comm *c, int k, size_t bytes);

/* ---- MPI transport (mpi_transport.c; only with DT_HAVE_MPI) ---- */
#define DT_MPI_MAXREQ 64
typedef struct {
    uint64_t reqs[DT_MPI_MAXREQ]; /* MPI_Request handles (an int or a pointer) */
    int n, nrecv, tag, rpeer, op;
    dt_dtype dtype;
    void *rbuf, *tmp;
    size_t rbytes;      /* upto: the most, then the message's length */
    bool upto;          /* the receive takes a message of any length up to rbytes (dt_p2p_exchange_upto) */
} dt_mpi_xfer;
dt_status dt_mpi_start(dt_comm *c, int speer, const void *sbuf, size_t sbytes, int rpeer, void *rbuf, size_t rbytes,
                       dt_dtype dtype, int op, dt_mpi_xfer *x);
dt_status dt_mpi_finish(dt_comm *c, dt_mpi_xfer *x);
dt_status dt_mpi_check_abort(dt_comm *c);
void dt_mpi_fail(dt_comm *c, const char *msg);
bool dt_mpi_heartbeat(dt_comm *c, char *msg, size_t cap);
void dt_mpi_watch_end(dt_comm *c);

/* ---- reductions (reduce_op.c) ---- */

/* dst[i] = dst[i] op src[i]; DT_AVG reduces as a sum (see dt_reduce_finish). */
void dt_reduce_into(void *dst, const void *src, size_t n, dt_dtype t, dt_op op);
/* dst[i] = a[i] op b[i]. */
void dt_reduce_pair(void *dst, const void *a, const void *b, size_t n, dt_dtype t, dt_op op);
/* dst[i] = reduce over k of srcs[k][i], in order k = 0..nsrc-1, accumulating bf16/f16 in f32. */
void dt_reduce_many(void *dst, const void *const *srcs, int nsrc, size_t n, dt_dtype t, dt_op op);
/* d0[i] = d1[i] = a[i] op b[i] in one pass; false when (t, op) has no such
 * kernel (half types, avg), and nothing was written. Outputs may alias inputs
 * element for element. */
bool dt_reduce_pair_to2(void *d0, void *d1, const void *a, const void *b, size_t n, dt_dtype t, dt_op op);
/* For DT_AVG divides by nranks; other ops: nothing. */
void dt_reduce_finish(void *buf, size_t n, dt_dtype t, dt_op op, int nranks);

/* ---- algorithms (one file each in algo/) ---- */

typedef struct {
    dt_coll coll;
    const void *sendbuf;
    void *recvbuf;
    size_t count;     /* per-collective meaning, as in the public API */
    dt_dtype dtype;
    dt_op op;
    int root;         /* sendrecv: the destination */
    size_t rcount;    /* sendrecv: elements to receive, */
    int source;       /* from this rank */
    const size_t *counts; /* alltoallv: the send counts, */
    size_t *rcounts;  /* the receive counts (filled in), */
    size_t cap;       /* and the room in recvbuf (elements) */
} coll_args;

typedef dt_status (*algo_fn)(dt_comm *c, const coll_args *a);
/* A send and/or receive (a->root, a->source) as what this process is in (inside) or ran last, with c->cur: what
 * dt_comm_activity reports to a rank that stops. */
void dt_activity_p2p(const dt_comm *c, const coll_args *a, int inside);
/* NULL when the algorithm does not implement that collective. */
algo_fn dt_algo_lookup(dt_algo algo, dt_coll coll);

dt_status dt_shm_direct_run(dt_comm *c, const coll_args *a);
/* Outputs at least this large do not fit in cache next to the inputs: write them with non-temporal stores, which skip
 * the read-for-ownership and so cut the DRAM traffic of a push from 3n to 2n per rank (dt_copy_out, shm_direct.c;
 * the caller fences a streamed copy before others may read it). */
#define DT_STREAM_BYTES (8u << 20)
void dt_copy_out(uint8_t *dst, const uint8_t *src, size_t bytes, bool stream);
/* alltoallv with every rank on this machine (shm_alltoallv.c). */
dt_status dt_shm_alltoallv_run(dt_comm *c, const coll_args *a);
/* alltoallv with ranks on other machines: a message from each rank to each, the counts in it (pairwise_alltoallv.c). */
dt_status dt_pairwise_alltoallv_run(dt_comm *c, const coll_args *a);

/* ---- cross-memory attach (cma.c) ---- */

/* Puts where this process's word lies in its slot (me), when it joins the segment. */
void dt_cma_register(seg_proc *me);
/* Whether this rank can read every other local rank's memory, tried once a communicator (c->cma; no collective: the
 * ranks agree where they use it, each saying in its cell whether it can). */
bool dt_cma_ready(dt_comm *c);
/* n bytes at addr in local rank j's memory into dst (what: the collective, for the error). */
dt_status dt_cma_read(dt_comm *c, int j, void *dst, uint64_t addr, size_t n, const char *what);
/* n bytes from src to addr in local rank j's memory (the same permission as a read). */
dt_status dt_cma_write(dt_comm *c, int j, uint64_t addr, const void *src, size_t n, const char *what);
dt_status dt_ring_run(dt_comm *c, const coll_args *a);
dt_status dt_tree_run(dt_comm *c, const coll_args *a);
dt_status dt_rd_run(dt_comm *c, const coll_args *a);
dt_status dt_rabenseifner_run(dt_comm *c, const coll_args *a);
dt_status dt_bruck_run(dt_comm *c, const coll_args *a);
dt_status dt_pairwise_run(dt_comm *c, const coll_args *a);
dt_status dt_hier_run(dt_comm *c, const coll_args *a);

/* Block partition of count elements over p ranks: the first count%p blocks
 * get one more element. */
static inline size_t dt_block_count(size_t count, int p, int i) {
    return count / (size_t)p + ((size_t)i < count % (size_t)p ? 1 : 0);
}
static inline size_t dt_block_start(size_t count, int p, int i) {
    size_t q = count / (size_t)p, r = count % (size_t)p;
    return q * (size_t)i + ((size_t)i < r ? (size_t)i : r);
}

/* ---- selection (select.c) ---- */
typedef struct {
    double p2p_alpha, p2p_beta;       /* shm channel message: latency, s/byte */
    double gamma;                     /* s/byte reduced */
    double direct_alpha, direct_beta; /* shm_direct: per barrier, s/byte of memory traffic */
    double mpi_alpha, mpi_beta;       /* MPI message between machines */
    double mpi_slowdown;              /* a core's compute beside an exchange between machines, over alone, less 1 (0: none
                                       * measured): the link's processing on the ranks' cores (link_compute.c) */
} dt_cost_params;
const char *dt_cost_params_path(char *buf, size_t cap);
dt_status dt_cost_params_load(const char *path, dt_cost_params *out);
dt_status dt_cost_params_save(const char *path, const dt_cost_params *p);
void dt_cost_params_set(const dt_cost_params *p);
const dt_cost_params *dt_cost_params_current(void);
double dt_cost_predict(const dt_comm *c, dt_algo algo, dt_coll coll, size_t nbytes);
dt_algo dt_select_algo(dt_comm *c, dt_coll coll, size_t bytes);

/* ---- the collective entry used by blocking calls and the progress thread ---- */
dt_status dt_coll_execute(dt_comm *c, const coll_args *a, dt_algo algo);
dt_status dt_progress_drain(dt_comm *c); /* wait until no request is pending */
/* A checked sendrecv on the calling thread (the progress thread runs isendrecv with it). */
dt_status dt_p2p_run(dt_comm *c, const coll_args *a);
void dt_progress_destroy(dt_comm *c);

#endif
