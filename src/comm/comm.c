/* The communicator: where it comes from (launcher, MPI, alone), how it
 * splits, its shared arena, and the checked entry of every collective. */
#include "comm_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static bool env_int(const char *name, long *out) {
    const char *e = getenv(name);
    if (!e || !*e) return false;
    char *end;
    long v = strtol(e, &end, 10);
    if (*end) return false;
    *out = v;
    return true;
}

void dt_comm_set_stall_timeout(dt_comm *c, double seconds) {
    if (!c) return;
    c->stall_timeout = seconds > 0 ? seconds : 0;
    /* the hierarchical algorithms' communicators, made at start-up, wait on its behalf */
    dt_comm_set_stall_timeout(c->node_comm, seconds);
    dt_comm_set_stall_timeout(c->cross_comm, seconds);
}

dt_status dt_comm_alloc_tables(dt_comm *c) {
    c->stall_timeout = DT_STALL_TIMEOUT_DEFAULT;
    c->node_of = calloc((size_t)c->size, sizeof(int));
    c->local_index = calloc((size_t)c->size, sizeof(int));
    c->local_members = calloc((size_t)c->local_size, sizeof(int));
    c->proc_of = calloc((size_t)c->local_size, sizeof(int));
    c->peer_seen = calloc((size_t)c->local_size, sizeof(uint32_t));
    c->peer_stopped = calloc((size_t)c->local_size, sizeof(double));
    if (!c->node_of || !c->local_index || !c->local_members || !c->proc_of || !c->peer_seen || !c->peer_stopped)
        return dt_error(DT_ERR_NOMEM, "communicator: out of memory for %d ranks", c->size);
    return DT_OK;
}

static void comm_free(dt_comm *c) {
    if (!c) return;
    free(c->node_of);
    free(c->local_index);
    free(c->local_members);
    free(c->proc_of);
    free(c->peer_seen);
    free(c->peer_stopped);
    for (int k = 0; k < 2; k++) dt_free_aligned(c->work[k]);
    free(c);
}

static void apply_env_algos(dt_comm *c) {
    const char *all = getenv("DTRAIN_ALGO");
    for (int k = 0; k < DT_COLL_COUNT; k++) {
        char name[64];
        snprintf(name, sizeof name, "DTRAIN_ALGO_%s", dt_coll_name((dt_coll)k));
        for (char *q = name; *q; q++) if (*q >= 'a' && *q <= 'z') *q = (char)(*q - 32);
        const char *e = getenv(name);
        if (!e) e = all;
        dt_algo a;
        if (e && (dt_algo_parse(e, &a) || dt_comm_set_algo(c, (dt_coll)k, a)) && getenv(name))
            dt_log(DT_LOG_WARN, "%s=%s: %s; using auto", name, e, dt_last_error());
    }
}

static dt_comm *comm_new(int rank, int size, int local_rank, int local_size) {
    dt_comm *c = calloc(1, sizeof *c);
    if (!c) return NULL;
    c->rank = rank;
    c->world_rank = rank;
    c->size = size;
    c->local_rank = local_rank;
    c->local_size = local_size;
    c->nodes = 1;
    c->oversubscribed = local_size > dt_cpu_allowed(); /* `dtrain launch`'s ranks share its mask and quota */
    return c;
}

/* A child of `dtrain launch`: the segment fd and the world's control block
 * offset come in the environment. */
static dt_status init_launched(long fd, dt_comm **out) {
    long rank, size, off;
    if (!env_int("DTRAIN_RANK", &rank) || !env_int("DTRAIN_WORLD_SIZE", &size) || !env_int("DTRAIN_GROUP_OFF", &off) ||
        size < 1 || size > DT_MAX_LOCAL || rank < 0 || rank >= size)
        return dt_error(DT_ERR_ARG, "DTRAIN_SHM_FD is set but DTRAIN_RANK/DTRAIN_WORLD_SIZE/DTRAIN_GROUP_OFF are missing or "
                        "out of range: was this process started by `dtrain launch`?");
    dt_comm *c = comm_new((int)rank, (int)size, (int)rank, (int)size);
    if (!c) return dt_error(DT_ERR_NOMEM, "communicator: out of memory");
    dt_status st = dt_comm_alloc_tables(c);
    if (!st) st = dt_segment_attach((int)fd, &c->seg);
    if (st) { comm_free(c); return st; }
    if (c->seg->hdr->nprocs != size) {
        st = dt_error(DT_ERR_ARG, "segment was made for %d ranks but DTRAIN_WORLD_SIZE is %ld", c->seg->hdr->nprocs, size);
        dt_segment_release(c->seg);
        comm_free(c);
        return st;
    }
    for (int i = 0; i < c->size; i++) {
        c->local_index[i] = i;
        c->local_members[i] = i;
        c->proc_of[i] = i;
    }
    seg_proc *me = &c->seg->hdr->proc[rank];
    atomic_store(&me->world_rank, (int32_t)rank);
    atomic_store(&me->pid, (int32_t)getpid());
    dt_cma_register(me);
    atomic_store(&me->state, PROC_ALIVE);
    if ((st = dt_group_attach(c, (uint64_t)off))) {
        dt_segment_release(c->seg);
        comm_free(c);
        return st;
    }
    c->transport = "shm";
    *out = c;
    return DT_OK;
}

#ifdef DT_HAVE_MPI
dt_status dt_mpi_init_world(dt_comm **out);   /* mpi_transport.c */
dt_status dt_mpi_launch_check(bool pmix);
#endif

int dt_comm_first_voice(void) {
    long v;
    if (getenv("DTRAIN_SHM_FD")) return 0;
    static const char *const ranks[] = { "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID" };
    for (size_t i = 0; i < sizeof ranks / sizeof ranks[0]; i++)
        if (env_int(ranks[i], &v)) return v == 0;
    return 1;
}

dt_status dt_comm_detect_launch(dt_launch_kind *kind) {
    long v;
    *kind = DT_LAUNCH_NONE;
    if (env_int("DTRAIN_SHM_FD", &v)) { *kind = DT_LAUNCH_LOCAL; return DT_OK; }
    bool pmix = getenv("PMIX_RANK"), pmi = getenv("PMI_SIZE") || getenv("PMI_RANK"), ompi = getenv("OMPI_COMM_WORLD_SIZE");
    if (pmix || pmi || ompi || getenv("DTRAIN_USE_MPI")) {
#ifdef DT_HAVE_MPI
        *kind = DT_LAUNCH_MPI;
        return dt_mpi_launch_check(pmix || ompi);
#else
        (void)pmix; (void)pmi; (void)ompi;
        return dt_error(DT_ERR_ARG, "started by mpirun/srun, but this dtrain was built without MPI: install libopenmpi-dev and "
                        "rebuild (or run one machine with dtrain train --nproc N)");
#endif
    }
    /* srun without --mpi (a site without MpiDefault): every task would be a
     * world of one, writing the same files */
    if (env_int("SLURM_NTASKS", &v) && v > 1 && getenv("SLURM_PROCID"))
        return dt_error(DT_ERR_ARG, "srun started %ld tasks but gave them no PMI, so each would train alone: add --mpi=pmix "
                        "to srun (or MpiDefault=pmix in slurm.conf), or run one task with --nproc N", v);
    return DT_OK;
}

dt_status dt_comm_init(dt_comm **world) {
    if (!world) return dt_error(DT_ERR_ARG, "dt_comm_init: world is NULL");
    *world = NULL;
    long fd;
    dt_launch_kind kind;
    dt_status st = dt_comm_detect_launch(&kind);
    if (st) return st;
    /* the rank the launcher gave, in every line from here: a peer that dies while the world is still being joined makes
     * this rank say so before the world exists (without it, a rank killed early left its peers' errors unattributed) */
    static const char *const rank_vars[] = { "DTRAIN_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK" };
    long given;
    for (size_t i = 0; i < sizeof rank_vars / sizeof *rank_vars; i++)
        if (kind != DT_LAUNCH_NONE && env_int(rank_vars[i], &given)) { dt_log_set_rank((int)given); break; }
    if (kind == DT_LAUNCH_LOCAL && env_int("DTRAIN_SHM_FD", &fd)) {
        st = init_launched(fd, world);
    }
#ifdef DT_HAVE_MPI
    else if (kind == DT_LAUNCH_MPI) {
        st = dt_mpi_init_world(world);
    }
#endif
    else {
        dt_comm *c = comm_new(0, 1, 0, 1);
        if (!c || dt_comm_alloc_tables(c)) { comm_free(c); return dt_error(DT_ERR_NOMEM, "communicator: out of memory"); }
        c->transport = "self";
        *world = c;
        st = DT_OK;
    }
    if (st) return st;
    apply_env_algos(*world);
    dt_log_set_rank((*world)->size > 1 ? (*world)->rank : -1);
    return DT_OK;
}

void dt_mpi_comm_free(dt_comm *c);

dt_status dt_comm_destroy(dt_comm *c) {
    if (!c) return DT_OK;
    dt_progress_destroy(c);
    if (c->seg && !c->parent_world) {
        /* The world: tell peers we left on purpose, so a wait on us fails fast. */
        atomic_store(&c->seg->hdr->proc[c->proc_of[c->local_rank]].state, PROC_FINALIZED);
    }
#ifdef DT_HAVE_MPI
    dt_mpi_comm_free(c);
#endif
    if (c->seg) dt_segment_release(c->seg);
    comm_free(c);
    return DT_OK;
}

int dt_comm_rank(const dt_comm *c) { return c ? c->rank : -1; }
int dt_comm_size(const dt_comm *c) { return c ? c->size : 0; }
int dt_comm_local_rank(const dt_comm *c) { return c ? c->local_rank : -1; }
int dt_comm_local_size(const dt_comm *c) { return c ? c->local_size : 0; }
int dt_comm_node(const dt_comm *c) { return c ? c->node : -1; }
int dt_comm_nodes(const dt_comm *c) { return c ? c->nodes : 0; }
const char *dt_comm_transport(const dt_comm *c) { return c ? c->transport : "none"; }

int dt_comm_threads_asked(void) {
    const char *s = getenv("OMP_NUM_THREADS");
    if (!s || !*s) return 0;
    char *end;
    long n = strtol(s, &end, 10);
    return (*end == '\0' || *end == ',') && n > 0 && n <= 4096 ? (int)n : 0;
}

int dt_comm_default_threads(const dt_comm *c) {
    int asked = dt_comm_threads_asked();
    if (asked) return asked;
    int mine = dt_cpu_allowed(), all = dt_cpu_cores();
    const char *slurm = getenv("SLURM_CPUS_PER_TASK");
    if (slurm && atoi(slurm) > 0 && atoi(slurm) < mine) return atoi(slurm);
    int sharing = c && mine >= all ? c->local_size : 1;
    return mine / sharing > 0 ? mine / sharing : 1;
}

void *dt_comm_work(dt_comm *c, int k, size_t bytes) {
    if (bytes == 0) bytes = 64; /* callers treat NULL as out of memory */
    if (bytes <= c->work_bytes[k]) return c->work[k];
    size_t want = bytes + bytes / 4;
    void *p = dt_alloc_aligned(want);
    if (!p) return NULL;
    memset(p, 0, want); /* pre-fault now, not inside a timed collective later */
    dt_free_aligned(c->work[k]);
    c->work[k] = p;
    c->work_bytes[k] = want;
    return p;
}

/* ---- shared arena ---- */

#define ARENA_HDR 64 /* size of the block, kept in front of it */

static dt_status arena_alloc(dt_comm *c, size_t bytes, void **out, bool prefault) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_alloc: NULL argument");
    *out = NULL;
    if (bytes > SIZE_MAX - 2 * ARENA_HDR) return dt_error(DT_ERR_ARG, "dt_comm_alloc: %zu bytes overflows", bytes);
    uint8_t *p;
    if (c->seg) {
        uint64_t off;
        dt_status st = dt_segment_alloc(c->seg, bytes + ARENA_HDR, &off);
        if (st) return st;
        p = dt_segment_ptr(c->seg, off);
    } else {
        p = dt_alloc_aligned(bytes + ARENA_HDR);
        if (!p) return dt_error(DT_ERR_NOMEM, "dt_comm_alloc: out of memory for %zu bytes", bytes);
        prefault = true; /* private memory is not zeroed */
    }
    /* pre-fault: collectives never touch fresh pages (the segment's fresh range reads as zeros either way) */
    if (prefault) memset(p, 0, bytes + ARENA_HDR);
    *(size_t *)p = bytes;
    *out = p + ARENA_HDR;
    return DT_OK;
}

dt_status dt_comm_alloc(dt_comm *c, size_t bytes, void **out) { return arena_alloc(c, bytes, out, true); }

dt_status dt_comm_alloc_sparse(dt_comm *c, size_t bytes, void **out) { return arena_alloc(c, bytes, out, false); }

void dt_comm_free(dt_comm *c, void *ptr) {
    if (!c || !ptr) return;
    uint8_t *p = (uint8_t *)ptr - ARENA_HDR;
    if (c->seg && dt_segment_contains(c->seg, p, ARENA_HDR))
        dt_segment_free(c->seg, (uint64_t)(p - (uint8_t *)c->seg->base), *(size_t *)p + ARENA_HDR);
    else
        dt_free_aligned(p);
}

dt_status dt_comm_alloc_shared(dt_comm *c, size_t bytes, void **out) {
    if (!c || !out) return dt_error(DT_ERR_ARG, "dt_comm_alloc_shared: NULL argument");
    *out = NULL;
    if (!c->seg || c->local_size != c->size)
        return dt_error(DT_ERR_ARG, "dt_comm_alloc_shared: needs every rank of the communicator on this machine's shared memory");
    int64_t v[2] = { 0, 0 }; /* failed, offset: rank 0's allocation, for everyone */
    if (c->rank == 0) {
        uint64_t off = 0;
        v[0] = dt_segment_alloc(c->seg, bytes, &off) != DT_OK;
        v[1] = (int64_t)off;
    }
    dt_status st = dt_comm_broadcast(c, v, 2, DT_I64, 0);
    if (!st && v[0]) st = dt_error(DT_ERR_NOMEM, "shared arena: no room for %zu bytes shared by the ranks (set DTRAIN_SHM_SIZE larger)", bytes);
    if (!st) *out = dt_segment_ptr(c->seg, (uint64_t)v[1]);
    return st;
}

void dt_comm_release(dt_comm *c, void *ptr, size_t bytes) {
    if (!bytes) return;
    if (!c || !c->seg || !dt_segment_contains(c->seg, ptr, bytes)) { dt_mem_release(ptr, bytes); return; }
    /* shared pages stay in the segment's file unless punched out of it */
    size_t whole;
    char *a = dt_mem_zero_edges(ptr, bytes, &whole);
    if (whole) dt_segment_free(c->seg, (uint64_t)(a - c->seg->base), whole);
}

dt_status dt_comm_map_pages(dt_comm *c, void *at, const void *from, size_t bytes) {
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    if (!bytes) return DT_OK;
    if (!c || !c->seg || !dt_segment_contains(c->seg, at, bytes) || !dt_segment_contains(c->seg, from, bytes))
        return dt_error(DT_ERR_ARG, "dt_comm_map_pages: the ranges are not in the shared arena");
    if (((uintptr_t)at | (uintptr_t)from | bytes) & (page - 1))
        return dt_error(DT_ERR_ARG, "dt_comm_map_pages: %p, %p, %zu bytes are not whole pages", at, from, bytes);
    int flags = MAP_SHARED | MAP_FIXED | MAP_NORESERVE | (at != from ? MAP_POPULATE : 0);
    off_t off = (off_t)((const char *)from - c->seg->base);
    if (mmap(at, bytes, PROT_READ | PROT_WRITE, flags, c->seg->fd, off) == MAP_FAILED)
        return dt_error(DT_ERR_SYS, "dt_comm_map_pages: mapping %zu bytes failed: %s", bytes, strerror(errno));
    return DT_OK;
}

int dt_comm_in_arena(const dt_comm *c, const void *p, size_t bytes) { return c && dt_segment_contains(c->seg, p, bytes); }

/* ---- algorithm choice ---- */

dt_status dt_comm_set_algo(dt_comm *c, dt_coll coll, dt_algo algo) {
    if (!c || (unsigned)coll >= DT_COLL_COUNT || (unsigned)algo >= DT_ALGO_COUNT)
        return dt_error(DT_ERR_ARG, "dt_comm_set_algo: bad collective %d or algorithm %d", (int)coll, (int)algo);
    if (algo != DT_ALGO_AUTO && !dt_algo_lookup(algo, coll))
        return dt_error(DT_ERR_ARG, "algorithm %s does not implement %s", dt_algo_name(algo), dt_coll_name(coll));
    if (algo == DT_ALGO_SHM_DIRECT && c->size > 1 && (c->local_size != c->size || !c->slots))
        return dt_error(DT_ERR_ARG, "algorithm shm_direct needs every rank on one machine (%d of %d are)", c->local_size, c->size);
    if (algo == DT_ALGO_HIER && (!c->node_comm || !c->cross_comm))
        return dt_error(DT_ERR_ARG, "algorithm hier needs a communicator over several machines with equal ranks on each");
    c->forced[coll] = algo;
    return DT_OK;
}

dt_algo dt_comm_choose_algo(dt_comm *c, dt_coll coll, size_t bytes) {
    if (c->forced[coll] != DT_ALGO_AUTO) return c->forced[coll];
    /* The cost model is evaluated once per power-of-two size class: every
     * rank gets the same answer, and small calls do not pay for it. */
    int bucket = bytes ? 64 - __builtin_clzll((unsigned long long)bytes) : 0;
    uint8_t *slot = &c->choice[coll][bucket];
    if (!*slot) *slot = (uint8_t)dt_select_algo(c, coll, bytes ? (size_t)1 << (bucket - 1) : 0);
    return (dt_algo)*slot;
}

algo_fn dt_algo_lookup(dt_algo algo, dt_coll coll) {
    switch (algo) {
    case DT_ALGO_SHM_DIRECT: return coll == DT_COLL_SENDRECV ? NULL : coll == DT_COLL_ALLTOALLV ? dt_shm_alltoallv_run : dt_shm_direct_run;
    case DT_ALGO_RING:
        return coll == DT_COLL_ALLREDUCE || coll == DT_COLL_REDUCE_SCATTER || coll == DT_COLL_ALLGATHER ? dt_ring_run : NULL;
    case DT_ALGO_TREE:
        return coll == DT_COLL_ALLREDUCE || coll == DT_COLL_BROADCAST || coll == DT_COLL_REDUCE || coll == DT_COLL_GATHER ||
               coll == DT_COLL_SCATTER || coll == DT_COLL_BARRIER ? dt_tree_run : NULL;
    case DT_ALGO_RD:
        return coll == DT_COLL_ALLREDUCE || coll == DT_COLL_ALLGATHER || coll == DT_COLL_BARRIER ? dt_rd_run : NULL;
    case DT_ALGO_RABENSEIFNER: return coll == DT_COLL_ALLREDUCE ? dt_rabenseifner_run : NULL;
    case DT_ALGO_BRUCK: return coll == DT_COLL_ALLGATHER ? dt_bruck_run : NULL;
    case DT_ALGO_PAIRWISE:
        return coll == DT_COLL_ALLTOALLV ? dt_pairwise_alltoallv_run
               : coll == DT_COLL_ALLTOALL || coll == DT_COLL_GATHER || coll == DT_COLL_SCATTER || coll == DT_COLL_REDUCE_SCATTER
               ? dt_pairwise_run
               : NULL;
    case DT_ALGO_HIER: return coll == DT_COLL_ALLREDUCE ? dt_hier_run : NULL;
    default: return NULL;
    }
}

/* ---- execution ---- */

static void run_alone(const coll_args *a) {
    size_t es = dt_dtype_size(a->dtype), b = a->count * es;
    switch (a->coll) {
    case DT_COLL_BROADCAST: case DT_COLL_BARRIER: break;
    default:
        if (a->recvbuf != a->sendbuf && b) memmove(a->recvbuf, a->sendbuf, b);
        break;
    }
}

static dt_status coll_run(dt_comm *c, const coll_args *a, dt_algo algo);

/* The collective this process is in, for a watchdog that names it when the
 * job fails: packed words, so a reader on another thread sees whole values. */
static _Atomic uint64_t act_word, act_count; /* coll 8 | dtype 4 | op 4 | algo 4 | root 20 | inside 1 | seq 23 bits */

static void activity(const call_desc *d, int inside) {
    atomic_store(&act_count, d->count);
    atomic_store(&act_word, (uint64_t)(d->coll & 0xff) | (uint64_t)(d->dtype & 0xf) << 8 | (uint64_t)(d->op & 0xf) << 12 |
                            (uint64_t)(d->algo & 0xf) << 16 | (uint64_t)((uint32_t)d->root & 0xfffff) << 20 |
                            (uint64_t)(inside != 0) << 40 | (d->seq & 0x7fffff) << 41);
}

/* A send and/or receive (point to point): its peers as the user knows them (world ranks where they share this
 * machine's segment, else the communicator's), +1 so that 0 is none. */
static _Atomic uint64_t act_peers;

static int peer_name(const dt_comm *c, int peer) {
    if (peer < 0) return -1;
    int j = c->local_index ? c->local_index[peer] : -1;
    return j >= 0 && c->seg ? atomic_load(&c->seg->hdr->proc[c->proc_of[j]].world_rank) : peer;
}

void dt_activity_p2p(const dt_comm *c, const coll_args *a, int inside) {
    if (inside) atomic_store(&act_peers, (uint64_t)(uint32_t)(peer_name(c, a->root) + 1) | (uint64_t)(uint32_t)(peer_name(c, a->source) + 1) << 32);
    activity(&c->cur, inside);
}

static void format_p2p(uint64_t w, char *buf, size_t cap) {
    uint64_t peers = atomic_load(&act_peers);
    int to = (int)(uint32_t)peers - 1, from = (int)(uint32_t)(peers >> 32) - 1;
    char sz[32], half[2][48] = { "", "" };
    dt_format_size(atomic_load(&act_count) * dt_dtype_size((dt_dtype)(w >> 8 & 0xf)), sz, sizeof sz);
    if (to >= 0) snprintf(half[0], sizeof half[0], "a send to rank %d", to);
    if (from >= 0) snprintf(half[1], sizeof half[1], "a receive from rank %d", from);
    snprintf(buf, cap, "%s %s%s%s (%s)", w >> 40 & 1 ? "in" : "after", half[0], to >= 0 && from >= 0 ? " and " : "", half[1], sz);
}

void dt_comm_activity(char *buf, size_t cap) {
    uint64_t w = atomic_load(&act_word);
    if (!w) { snprintf(buf, cap, "before any collective"); return; }
    if ((w & 0xff) == DT_COLL_SENDRECV) { format_p2p(w, buf, cap); return; }
    call_desc d = { .coll = (uint32_t)(w & 0xff), .dtype = (uint32_t)(w >> 8 & 0xf), .op = (uint32_t)(w >> 12 & 0xf),
                    .algo = (uint32_t)(w >> 16 & 0xf), .root = (int32_t)(w >> 20 & 0xfffff), .count = atomic_load(&act_count),
                    .seq = w >> 41 };
    char desc[256];
    dt_desc_format(&d, desc, sizeof desc);
    snprintf(buf, cap, "%s %s", w >> 40 & 1 ? "in" : "after", desc);
}

/* Every collective, blocking or from the progress thread, runs here (and
 * shows in the trace on the communication track). */
dt_status dt_coll_execute(dt_comm *c, const coll_args *a, dt_algo algo) {
    c->seq++;
    c->cur = (call_desc){ .coll = a->coll, .dtype = a->dtype, .op = a->op, .algo = algo,
                          .root = a->root, .count = a->count, .seq = c->seq };
    if (c->size == 1) { run_alone(a); return DT_OK; }
    if (dt_trace_on()) {
        size_t bytes = a->count * dt_dtype_size(a->dtype);
        if (a->coll == DT_COLL_ALLGATHER || a->coll == DT_COLL_ALLTOALL || a->coll == DT_COLL_REDUCE_SCATTER) bytes *= (size_t)c->size;
        for (int j = 0; a->coll == DT_COLL_ALLTOALLV && j < c->size; j++) bytes += a->counts[j] * dt_dtype_size(a->dtype);
        dt_trace_begin(DT_TRACK_COMM, dt_coll_name(a->coll), "\"algo\":\"%s\",\"bytes\":%zu,\"ranks\":%d,\"seq\":%llu",
                       dt_algo_name(algo), bytes, c->size, (unsigned long long)c->seq);
    }
    activity(&c->cur, 1);
    dt_status st = coll_run(c, a, algo);
    activity(&c->cur, 0);
    DT_TRACE_END(DT_TRACK_COMM);
    return st;
}

static dt_status coll_run(dt_comm *c, const coll_args *a, dt_algo algo) {
    /* No abort check here: every wait checks on its slow path, and the fast
     * path must stay a handful of loads and stores. */
    dt_status st;
    algo_fn fn = dt_algo_lookup(algo, a->coll);
    if (!fn) return dt_error(DT_ERR_ARG, "algorithm %s does not implement %s", dt_algo_name(algo), dt_coll_name(a->coll));
    /* Generic algorithms still publish what they run, so a mismatch is caught
     * by whichever rank waits. */
    if (algo != DT_ALGO_SHM_DIRECT && c->slots) dt_cell_publish(c, NULL, 0, 0, 0);
    c->refused = false;
    st = fn(c, a);
    if (st && !c->refused) {
        /* A rank that fails inside a collective takes the job down with it:
         * its peers are somewhere in the same collective and must not hang. */
        char d[256], msg[1024];
        dt_desc_format(&c->cur, d, sizeof d);
        snprintf(msg, sizeof msg, "rank %d failed in %s: %s", c->world_rank, d, dt_last_error());
        if (c->seg && !dt_segment_abort_message(c->seg)) dt_segment_abort(c->seg, "%s", msg);
#ifdef DT_HAVE_MPI
        /* Other machines get the first cause, without this rank's context. */
        dt_mpi_fail(c, c->seg ? dt_segment_abort_message(c->seg) : msg);
#endif
    }
    return st;
}

static dt_status check_common(dt_comm *c, const char *what, size_t count, dt_dtype t, size_t mult) {
    if (!c) return dt_error(DT_ERR_ARG, "%s: communicator is NULL", what);
    if ((unsigned)t >= DT_DTYPE_COUNT) return dt_error(DT_ERR_ARG, "%s: unknown dtype %d", what, (int)t);
    size_t es = dt_dtype_size(t), total;
    if (__builtin_mul_overflow(count, es * mult, &total) || total > (SIZE_MAX >> 2))
        return dt_error(DT_ERR_ARG, "%s: count %zu x %zu elements of %s overflows", what, count, mult, dt_dtype_name(t));
    return DT_OK;
}

#define CHECK(expr) do { dt_status st_ = (expr); if (st_) return st_; } while (0)

static dt_status run(dt_comm *c, coll_args *a) {
    CHECK(dt_progress_drain(c));
    size_t es = dt_dtype_size(a->dtype);
    size_t bytes = a->count * es;
    if (a->coll == DT_COLL_ALLGATHER || a->coll == DT_COLL_ALLTOALL || a->coll == DT_COLL_REDUCE_SCATTER)
        bytes *= (size_t)c->size;
    return dt_coll_execute(c, a, dt_comm_choose_algo(c, a->coll, bytes));
}

static dt_status check_op(const char *what, dt_op op) {
    if ((unsigned)op >= DT_OP_COUNT) return dt_error(DT_ERR_ARG, "%s: unknown op %d", what, (int)op);
    return DT_OK;
}

static dt_status check_root(dt_comm *c, const char *what, int root) {
    if (root < 0 || root >= c->size) return dt_error(DT_ERR_ARG, "%s: root %d is not a rank of this communicator (size %d)", what, root, c->size);
    return DT_OK;
}

static dt_status check_buf(const char *what, const char *name, const void *p, size_t count) {
    if (count && !p) return dt_error(DT_ERR_ARG, "%s: %s is NULL with count %zu", what, name, count);
    return DT_OK;
}

dt_status dt_comm_allreduce(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op) {
    CHECK(check_common(c, "allreduce", count, t, 1));
    CHECK(check_op("allreduce", op));
    CHECK(check_buf("allreduce", "sendbuf", s, count));
    CHECK(check_buf("allreduce", "recvbuf", r, count));
    coll_args a = { .coll = DT_COLL_ALLREDUCE, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_reduce_scatter(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op) {
    CHECK(check_common(c, "reduce_scatter", count, t, (size_t)c->size));
    CHECK(check_op("reduce_scatter", op));
    CHECK(check_buf("reduce_scatter", "sendbuf", s, count));
    CHECK(check_buf("reduce_scatter", "recvbuf", r, count));
    coll_args a = { .coll = DT_COLL_REDUCE_SCATTER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_allgather(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t) {
    CHECK(check_common(c, "allgather", count, t, (size_t)c->size));
    CHECK(check_buf("allgather", "sendbuf", s, count));
    CHECK(check_buf("allgather", "recvbuf", r, count));
    coll_args a = { .coll = DT_COLL_ALLGATHER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_broadcast(dt_comm *c, void *buf, size_t count, dt_dtype t, int root) {
    CHECK(check_common(c, "broadcast", count, t, 1));
    CHECK(check_root(c, "broadcast", root));
    CHECK(check_buf("broadcast", "buf", buf, count));
    coll_args a = { .coll = DT_COLL_BROADCAST, .sendbuf = buf, .recvbuf = buf, .count = count, .dtype = t, .op = DT_SUM, .root = root, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_reduce(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, dt_op op, int root) {
    CHECK(check_common(c, "reduce", count, t, 1));
    CHECK(check_op("reduce", op));
    CHECK(check_root(c, "reduce", root));
    CHECK(check_buf("reduce", "sendbuf", s, count));
    if (c->rank == root) CHECK(check_buf("reduce", "recvbuf at the root", r, count));
    coll_args a = { .coll = DT_COLL_REDUCE, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = op, .root = root, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_alltoall(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t) {
    CHECK(check_common(c, "alltoall", count, t, (size_t)c->size));
    CHECK(check_buf("alltoall", "sendbuf", s, count));
    CHECK(check_buf("alltoall", "recvbuf", r, count));
    coll_args a = { .coll = DT_COLL_ALLTOALL, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_gather(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, int root) {
    CHECK(check_common(c, "gather", count, t, (size_t)c->size));
    CHECK(check_root(c, "gather", root));
    CHECK(check_buf("gather", "sendbuf", s, count));
    if (c->rank == root) CHECK(check_buf("gather", "recvbuf at the root", r, count));
    coll_args a = { .coll = DT_COLL_GATHER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .root = root, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_scatter(dt_comm *c, const void *s, void *r, size_t count, dt_dtype t, int root) {
    CHECK(check_common(c, "scatter", count, t, (size_t)c->size));
    CHECK(check_root(c, "scatter", root));
    if (c->rank == root) CHECK(check_buf("scatter", "sendbuf at the root", s, count));
    CHECK(check_buf("scatter", "recvbuf", r, count));
    coll_args a = { .coll = DT_COLL_SCATTER, .sendbuf = s, .recvbuf = r, .count = count, .dtype = t, .op = DT_SUM, .root = root, .source = -1 };
    return run(c, &a);
}

dt_status dt_comm_barrier(dt_comm *c) {
    CHECK(check_common(c, "barrier", 0, DT_F32, 1));
    coll_args a = { .coll = DT_COLL_BARRIER, .dtype = DT_F32, .op = DT_SUM, .source = -1 };
    return run(c, &a);
}

/* Point to point uses the sendrecv descriptor with count 0, so that both
 * sides agree whatever their sizes; sizes are checked chunk by chunk. */
dt_status dt_comm_sendrecv(dt_comm *c, const void *sbuf, size_t scount, int dest, void *rbuf, size_t rcount, int source,
                           dt_dtype t) {
    CHECK(check_common(c, "sendrecv", scount > rcount ? scount : rcount, t, 1));
    if ((dest >= c->size) || (source >= c->size) || (dest < 0 && source < 0))
        return dt_error(DT_ERR_ARG, "sendrecv: peers %d and %d are not ranks of this communicator (size %d)", dest, source, c->size);
    if (dest < 0) scount = 0;
    if (source < 0) rcount = 0;
    CHECK(check_buf("sendrecv", "sendbuf", sbuf, scount));
    CHECK(check_buf("sendrecv", "recvbuf", rbuf, rcount));
    CHECK(dt_progress_drain(c));
    coll_args a = { .coll = DT_COLL_SENDRECV, .sendbuf = sbuf, .recvbuf = rbuf, .count = scount, .dtype = t, .op = DT_SUM, .root = dest,
                    .rcount = rcount, .source = source };
    return dt_p2p_run(c, &a);
}

dt_status dt_p2p_run(dt_comm *c, const coll_args *a) {
    size_t es = dt_dtype_size(a->dtype);
    /* P2p does not advance the collective sequence: the chunks carry seq 0. */
    uint64_t saved = c->seq;
    call_desc saved_cur = c->cur;
    c->seq = 0;
    c->cur = (call_desc){ .coll = DT_COLL_SENDRECV, .dtype = a->dtype, .count = a->count > a->rcount ? a->count : a->rcount };
    dt_activity_p2p(c, a, 1);
    DT_TRACE_BEGIN(DT_TRACK_COMM, a->root >= 0 && a->source >= 0 ? "sendrecv" : a->root >= 0 ? "send" : "recv",
                   "\"to\":%d,\"from\":%d,\"bytes_sent\":%zu,\"bytes_received\":%zu", a->root, a->source, a->count * es,
                   a->rcount * es);
    dt_status st = dt_p2p_exchange(c, a->root, a->sendbuf, a->count * es, a->source, a->recvbuf, a->rcount * es, a->dtype, -1);
    DT_TRACE_END(DT_TRACK_COMM);
    dt_activity_p2p(c, a, 0);
    c->seq = saved;
    c->cur = saved_cur;
    return st;
}

/* Per-rank counts: padded to the largest block, so the fast equal-block
 * collectives carry them (the padding costs (max - count) elements per rank;
 * ZeRO's shards differ by at most one). Equal counts take no copy. */
static dt_status v_counts(dt_comm *c, const char *what, const size_t *counts, size_t *max, size_t *total, bool *equal) {
    if (!counts) return dt_error(DT_ERR_ARG, "%s: counts is NULL", what);
    *max = *total = 0;
    *equal = true;
    for (int r = 0; r < c->size; r++) {
        if (counts[r] > *max) *max = counts[r];
        if (counts[r] != counts[0]) *equal = false;
        *total += counts[r];
    }
    return DT_OK;
}

dt_status dt_comm_allgatherv(dt_comm *c, const void *sbuf, void *rbuf, const size_t *counts, dt_dtype t) {
    size_t max = 0, total = 0;
    bool equal = true;
    CHECK(check_common(c, "allgatherv", 0, t, 1));
    CHECK(v_counts(c, "allgatherv", counts, &max, &total, &equal));
    CHECK(check_common(c, "allgatherv", max, t, (size_t)c->size));
    if (equal) return dt_comm_allgather(c, sbuf, rbuf, counts[0], t);
    size_t es = dt_dtype_size(t);
    char *tmp = malloc(max * es * (size_t)c->size + es), *mine = malloc(max * es + es);
    dt_status st = tmp && mine ? DT_OK : dt_error(DT_ERR_NOMEM, "allgatherv: out of memory");
    if (!st) {
        memcpy(mine, sbuf, counts[c->rank] * es);
        st = dt_comm_allgather(c, mine, tmp, max, t);
    }
    size_t at = 0;
    for (int r = 0; !st && r < c->size; r++) {
        memcpy((char *)rbuf + at * es, tmp + (size_t)r * max * es, counts[r] * es);
        at += counts[r];
    }
    free(tmp);
    free(mine);
    return st;
}

/* Whether every rank of c could go on (ok on each): one allreduce, so that none waits in a collective another left. */
dt_status dt_comm_every(dt_comm *c, bool ok, bool *all) {
    int32_t v = ok;
    dt_status st = c ? dt_comm_allreduce(c, &v, &v, 1, DT_I32, DT_MIN) : DT_OK;
    *all = v != 0;
    return st;
}

static dt_status every_rank(dt_comm *c, bool ok, const char *what) {
    bool all;
    dt_status st = dt_comm_every(c, ok, &all);
    if (!st && !all) st = dt_error(DT_ERR_NOMEM, "%s: %s is out of memory", what, ok ? "another rank" : "this rank");
    return st;
}

dt_status dt_comm_allgatherv_alloc(dt_comm *c, const void *mine, size_t n, dt_dtype t, void **all, size_t *total) {
    size_t es = dt_dtype_size(t), sum = 0;
    int64_t own = (int64_t)n;
    const void *src = mine ? mine : (const void *)&own; /* (nothing to send: a valid address all the same) */
    *all = NULL, *total = 0;
    if (!c) { /* one process: a copy */
        void *one = malloc((n + 1) * es);
        if (!one) return dt_error(DT_ERR_NOMEM, "allgatherv: out of memory");
        memcpy(one, src, n * es);
        *all = one, *total = n;
        return DT_OK;
    }
    int64_t *each = malloc(sizeof *each * (size_t)c->size);
    size_t *counts = malloc(sizeof *counts * (size_t)c->size);
    dt_status st = every_rank(c, each && counts, "allgatherv");
    if (!st) st = dt_comm_allgather(c, &own, each, 1, DT_I64);
    for (int r = 0; !st && r < c->size; r++) sum += counts[r] = (size_t)each[r];
    void *buf = st ? NULL : malloc((sum + 1) * es);
    if (!st) st = every_rank(c, buf != NULL, "allgatherv");
    if (!st) st = dt_comm_allgatherv(c, src, buf, counts, t);
    free(each), free(counts);
    if (st) { free(buf); return st; }
    *all = buf, *total = sum;
    return DT_OK;
}

dt_status dt_comm_reduce_scatterv(dt_comm *c, const void *sbuf, void *rbuf, const size_t *counts, dt_dtype t, dt_op op) {
    size_t max = 0, total = 0;
    bool equal = true;
    CHECK(check_common(c, "reduce_scatterv", 0, t, 1));
    CHECK(check_op("reduce_scatterv", op));
    CHECK(v_counts(c, "reduce_scatterv", counts, &max, &total, &equal));
    CHECK(check_common(c, "reduce_scatterv", max, t, (size_t)c->size));
    if (equal) return dt_comm_reduce_scatter(c, sbuf, rbuf, counts[0], t, op);
    size_t es = dt_dtype_size(t);
    char *tmp = calloc(max * (size_t)c->size + 1, es), *mine = malloc(max * es + es);
    dt_status st = tmp && mine ? DT_OK : dt_error(DT_ERR_NOMEM, "reduce_scatterv: out of memory");
    size_t at = 0;
    for (int r = 0; !st && r < c->size; r++) {
        memcpy(tmp + (size_t)r * max * es, (const char *)sbuf + at * es, counts[r] * es);
        at += counts[r];
    }
    if (!st) st = dt_comm_reduce_scatter(c, tmp, mine, max, t, op);
    if (!st) memcpy(rbuf, mine, counts[c->rank] * es);
    free(tmp);
    free(mine);
    return st;
}

dt_status dt_comm_send(dt_comm *c, const void *buf, size_t count, dt_dtype t, int peer) {
    return dt_comm_sendrecv(c, buf, count, peer, NULL, 0, -1, t);
}

dt_status dt_comm_recv(dt_comm *c, void *buf, size_t count, dt_dtype t, int peer) {
    return dt_comm_sendrecv(c, NULL, 0, -1, buf, count, peer, t);
}

/* On one machine (every rank in the segment): one round of cells, then each block read where it lies
 * (algo/shm_alltoallv.c); else a message to each rank with the sender's counts, and its block where it is small
 * (algo/pairwise_alltoallv.c). One rank: the same check and copy, no collective. */
dt_status dt_comm_alltoallv(dt_comm *c, const void *sbuf, const size_t *scounts, void *rbuf, size_t recvcap, size_t *rcounts, dt_dtype t) {
    CHECK(check_common(c, "alltoallv", recvcap, t, 1));
    if (!scounts || !rcounts) return dt_error(DT_ERR_ARG, "alltoallv: needs its send counts and room for the receive counts");
    coll_args a = { .coll = DT_COLL_ALLTOALLV, .sendbuf = sbuf, .recvbuf = rbuf, .dtype = t, .op = DT_SUM, .source = -1, .counts = scounts,
                    .rcounts = rcounts, .cap = recvcap };
    if (c->size == 1) return dt_pairwise_alltoallv_run(c, &a);
    CHECK(dt_progress_drain(c));
    return dt_coll_execute(c, &a, c->local_size == c->size && c->slots ? DT_ALGO_SHM_DIRECT : DT_ALGO_PAIRWISE);
}
