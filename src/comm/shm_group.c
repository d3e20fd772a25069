/* A communicator's control block in the shared segment, and the protocol
 * every shared-memory collective starts with.
 *
 * Each member owns a slot with two cells, used by alternate collectives
 * (seq parity). A rank publishes what it is calling (the descriptor), the
 * segment offsets of its buffers and, for small messages, the data itself,
 * then waits for every peer's cell of the same seq. Peers compare
 * descriptors, so mismatched calls are caught before any data moves. A cell
 * is rewritten two collectives later, only once every peer has published
 * the collective in between, i.e. has finished reading it. */
#include "comm_internal.h"

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#define GROUP_MAGIC 0x67727075ull

static size_t group_bytes(int n, uint64_t *slot_off, uint64_t *chan_off, uint64_t *scratch_off) {
    size_t o = (sizeof(shm_group_hdr) + 63) & ~(size_t)63;
    *slot_off = o;
    o += (size_t)n * sizeof(shm_slot);
    o = (o + 4095) & ~(size_t)4095;
    *chan_off = o;
    o += (size_t)n * (size_t)n * sizeof(shm_chan);
    o = (o + 4095) & ~(size_t)4095;
    *scratch_off = o;
    o += (size_t)n * DT_SCRATCH_BYTES;
    return o;
}

static void group_bind(dt_comm *c, uint64_t off) {
    c->grp = dt_segment_ptr(c->seg, off);
    c->slots = dt_segment_ptr(c->seg, off + c->grp->slot_off);
    c->chan_base = off + c->grp->chan_off;
    c->scratch = dt_segment_ptr(c->seg, off + c->grp->scratch_off);
}

dt_status dt_group_create(dt_comm *c, uint64_t *off_out) {
    uint64_t so, co, sco;
    size_t bytes = group_bytes(c->local_size, &so, &co, &sco);
    uint64_t off;
    dt_status st = dt_segment_alloc(c->seg, bytes, &off);
    if (st) return st;
    shm_group_hdr *g = dt_segment_ptr(c->seg, off);
    g->n = c->local_size;
    g->slot_off = so;
    g->chan_off = co;
    g->scratch_off = sco;
    g->magic = GROUP_MAGIC;
    group_bind(c, off);
    *off_out = off;
    return DT_OK;
}

dt_status dt_group_attach(dt_comm *c, uint64_t off) {
    if (off < sizeof(seg_header) || off >= c->seg->size)
        return dt_error(DT_ERR_ARG, "communicator control block offset %llu is outside the segment", (unsigned long long)off);
    shm_group_hdr *g = dt_segment_ptr(c->seg, off);
    if (g->magic != GROUP_MAGIC || g->n != c->local_size)
        return dt_error(DT_ERR_ARG, "communicator control block at %llu: bad magic or size (%d, expected %d)",
                        (unsigned long long)off, g->n, c->local_size);
    group_bind(c, off);
    return DT_OK;
}

static inline uint32_t published(uint64_t seq) { return (uint32_t)(2 * seq + 2); }

static void desc_pack(const call_desc *d, uint64_t w[3]) {
    w[0] = (uint64_t)d->coll | (uint64_t)d->dtype << 8 | (uint64_t)d->op << 16 | (uint64_t)d->algo << 24 |
           (uint64_t)(uint32_t)d->root << 32;
    w[1] = d->count;
    w[2] = d->seq;
}

static void desc_unpack(const uint64_t w[3], call_desc *d) {
    d->coll = w[0] & 0xff;
    d->dtype = (w[0] >> 8) & 0xff;
    d->op = (w[0] >> 16) & 0xff;
    d->algo = (w[0] >> 24) & 0xff;
    d->root = (int32_t)(uint32_t)(w[0] >> 32);
    d->pad = 0;
    d->count = w[1];
    d->seq = w[2];
}

void dt_desc_format(const call_desc *d, char *buf, size_t cap) {
    char sz[32];
    dt_coll coll = (dt_coll)d->coll;
    dt_format_size(d->count * dt_dtype_size((dt_dtype)d->dtype), sz, sizeof sz);
    int n = snprintf(buf, cap, "%s #%llu (%llu x %s = %s", dt_coll_name(coll), (unsigned long long)d->seq,
                     (unsigned long long)d->count, dt_dtype_name((dt_dtype)d->dtype), sz);
    if (n < 0 || (size_t)n >= cap) return;
    bool reduces = coll == DT_COLL_ALLREDUCE || coll == DT_COLL_REDUCE || coll == DT_COLL_REDUCE_SCATTER;
    bool rooted = coll == DT_COLL_BROADCAST || coll == DT_COLL_REDUCE || coll == DT_COLL_GATHER ||
                  coll == DT_COLL_SCATTER;
    if (reduces) n += snprintf(buf + n, cap - (size_t)n, ", %s", dt_op_name((dt_op)d->op));
    if (rooted && (size_t)n < cap) n += snprintf(buf + n, cap - (size_t)n, ", root %d", d->root);
    if ((size_t)n < cap) snprintf(buf + n, cap - (size_t)n, ", algo %s)", dt_algo_name((dt_algo)d->algo));
}

shm_cell *dt_cell_of(dt_comm *c, int local_peer) { return &c->slots[local_peer].cell[c->seq & 1]; }

/* Has local peer j published at least collective s? */
static bool peer_reached(dt_comm *c, int j, uint64_t s) {
    uint32_t want = published(s);
    for (int k = 0; k < 2; k++) {
        uint32_t a = atomic_load_explicit(&c->slots[j].cell[k].arrive, memory_order_acquire);
        if (a != 0 && (int32_t)(a - want) >= 0) return true;
    }
    return false;
}

typedef struct { dt_comm *c; int j; uint64_t s; } reach_arg;
static bool reach_cond(void *p) { reach_arg *a = p; return peer_reached(a->c, a->j, a->s); }

void dt_cell_publish(dt_comm *c, const void *data, size_t bytes, uint64_t soff, uint64_t roff) {
    dt_cell_publish_parts(c, data, bytes, NULL, 0, soff, roff);
}

void dt_cell_publish_parts(dt_comm *c, const void *data, size_t bytes, const void *more, size_t nmore, uint64_t soff, uint64_t roff) {
    int me = c->local_rank;
    shm_cell *cell = &c->slots[me].cell[c->seq & 1];
    if (bytes + nmore && c->seq >= 2) {
        /* Peers may still be reading this cell's data from seq-2 until they
         * publish seq-1; usually we have already seen that happen. */
        for (int j = 0; j < c->local_size; j++) {
            if (j == me || (int32_t)(c->peer_seen[j] - (uint32_t)(c->seq - 1)) >= 0) continue;
            reach_arg ra = { c, j, c->seq - 1 };
            if (dt_shm_wait(c, reach_cond, &ra, j) != DT_OK) break; /* the error surfaces in wait_all */
            c->peer_seen[j] = (uint32_t)(c->seq - 1);
        }
    }
    uint64_t w[3];
    desc_pack(&c->cur, w);
    /* Seqlock writer: the odd marker first; release on each descriptor word
     * keeps it from being seen before the marker. */
    atomic_store_explicit(&cell->arrive, published(c->seq) - 1, memory_order_relaxed);
    for (int k = 0; k < 3; k++) atomic_store_explicit(&cell->desc[k], w[k], memory_order_release);
    atomic_store_explicit(&cell->off[0], soff, memory_order_relaxed);
    atomic_store_explicit(&cell->off[1], roff, memory_order_relaxed);
    if (bytes) memcpy(cell->data, data, bytes);
    if (nmore) memcpy(cell->data + bytes, more, nmore);
    atomic_store(&cell->arrive, published(c->seq)); /* seq_cst: pairs with a sleeper (dt_shm_notify) */
    for (int j = 0; j < c->local_size; j++)
        if (j != me) dt_shm_notify(c, j);
}

static dt_status report_mismatch(dt_comm *c, int j, const call_desc *theirs) {
    char a[200], b[200];
    call_desc mine = c->cur;
    dt_desc_format(&mine, a, sizeof a);
    dt_desc_format(theirs, b, sizeof b);
    int wr = atomic_load(&c->seg->hdr->proc[c->proc_of[j]].world_rank);
    dt_segment_abort(c->seg, "collective mismatch: rank %d called %s but rank %d called %s",
                     atomic_load(&c->seg->hdr->proc[c->proc_of[c->local_rank]].world_rank), a, wr, b);
    return dt_error(DT_ERR_MISMATCH, "%s", dt_segment_abort_message(c->seg));
}

/* Reads peer j's descriptor for the current seq if it is stable. */
static bool read_desc(dt_comm *c, int j, call_desc *d) {
    shm_cell *cell = &c->slots[j].cell[c->seq & 1];
    uint32_t a1 = atomic_load_explicit(&cell->arrive, memory_order_acquire);
    if (a1 != published(c->seq)) return false;
    uint64_t w[3];
    /* acquire on each word keeps the re-read of arrive after them */
    for (int k = 0; k < 3; k++) w[k] = atomic_load_explicit(&cell->desc[k], memory_order_acquire);
    if (atomic_load_explicit(&cell->arrive, memory_order_relaxed) != a1) return false;
    desc_unpack(w, d);
    return true;
}

static bool desc_equal(const call_desc *a, const call_desc *b) {
    return a->coll == b->coll && a->dtype == b->dtype && a->op == b->op && a->algo == b->algo &&
           a->root == b->root && a->count == b->count;
}

typedef struct { dt_comm *c; int j; } cell_arg;
static bool arrived_cond(void *p) {
    cell_arg *a = p;
    return atomic_load_explicit(&a->c->slots[a->j].cell[a->c->seq & 1].arrive, memory_order_acquire) ==
           published(a->c->seq);
}

/* Asks for the line in exclusive state ahead of a write (a no-op where unsupported). */
static inline void prefetch_for_write(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetchw (%0)" ::"r"(p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

dt_status dt_cell_wait_all(dt_comm *c) {
    uint32_t want = published(c->seq);
    uint64_t mine[3];
    desc_pack(&c->cur, mine);
    for (int j = 0; j < c->local_size; j++) {
        if (j == c->local_rank) continue;
        shm_cell *cell = &c->slots[j].cell[c->seq & 1];
        int spins = 0, limit = c->oversubscribed ? 1 : 256;
        while (atomic_load_explicit(&cell->arrive, memory_order_acquire) != want && ++spins < limit) {}
        if (spins == limit) {
            cell_arg ca = { c, j };
            dt_status st = dt_shm_wait(c, arrived_cond, &ca, j);
            if (st) return st;
        }
        /* Stable: the peer rewrites this cell only after we publish seq+1. */
        uint64_t w[3];
        for (int k = 0; k < 3; k++) w[k] = atomic_load_explicit(&cell->desc[k], memory_order_relaxed);
        if (w[0] != mine[0] || w[1] != mine[1]) {
            call_desc d;
            desc_unpack(w, &d);
            return report_mismatch(c, j, &d);
        }
        c->peer_seen[j] = (uint32_t)c->seq;
    }
    /* Everyone is past seq-1, so nobody reads our other cell any more: take
     * its first line now, so the next publish does not stall on it. */
    prefetch_for_write(&c->slots[c->local_rank].cell[(c->seq + 1) & 1]);
    return DT_OK;
}

typedef struct { dt_comm *c; int j; uint32_t step; } step_arg;
static bool step_cond(void *p) {
    step_arg *a = p;
    return (int32_t)(atomic_load_explicit(&a->c->slots[a->j].step, memory_order_acquire) - a->step) >= 0;
}

dt_status dt_group_step(dt_comm *c) {
    c->step++;
    atomic_store(&c->slots[c->local_rank].step, c->step);
    for (int j = 0; j < c->local_size; j++)
        if (j != c->local_rank) dt_shm_notify(c, j);
    for (int j = 0; j < c->local_size; j++) {
        if (j == c->local_rank) continue;
        step_arg sa = { c, j, c->step };
        dt_status st = dt_shm_wait(c, step_cond, &sa, j);
        if (st) return st;
    }
    return DT_OK;
}

dt_status dt_group_check_peers(dt_comm *c, int waiting_for, wait_cond cond, void *arg) {
    dt_status st = dt_shm_check_abort(c);
    if (st) return st;
    for (int j = 0; j < c->local_size; j++) {
        if (j == c->local_rank) continue;
        int p = c->proc_of[j];
        seg_proc *pr = &c->seg->hdr->proc[p];
        int wr = atomic_load(&pr->world_rank);
        /* A peer that has left (and maybe exited) after doing its part of the
         * last collective is no error while we wait for another: if this
         * collective still needs it, the wait for it says so. */
        if (atomic_load(&pr->state) == PROC_FINALIZED && j != waiting_for) continue;
        bool dead = dt_segment_proc_dead(c->seg, p);
        /* Read after the death: a rank says it left before it exits, so one that left and exited since the look above
         * is seen leaving, not dying. */
        bool left = atomic_load(&pr->state) == PROC_FINALIZED;
        if (left && j != waiting_for) continue;
        /* The peer may have done its part between the waiter's last look and leaving (its writes come before it says
         * so): look once more before blaming it. */
        if ((dead || left) && j == waiting_for && cond && cond(arg)) return DT_OK;
        if (dead && !left) {
            /* The launcher knows how it died (signal, exit status): give it a
             * moment to say so before saying less ourselves. */
            int lp = c->seg->hdr->launcher_pid;
            for (int k = 0; k < 100 && lp > 0 && !dt_segment_abort_message(c->seg) && kill(lp, 0) == 0; k++) usleep(1000);
            if (dt_segment_abort_message(c->seg)) return dt_shm_check_abort(c);
            dt_segment_abort(c->seg, "rank %d (pid %d) died%s", wr, (int)atomic_load(&pr->pid),
                             j == waiting_for ? " while a peer waited for it" : "");
            return dt_shm_check_abort(c);
        }
        if (left) {
            dt_segment_abort(c->seg, "rank %d (pid %d) left (dt_comm_destroy) while other ranks still use it",
                             wr, (int)atomic_load(&pr->pid));
            return dt_shm_check_abort(c);
        }
        call_desc theirs;
        if (read_desc(c, j, &theirs) && !desc_equal(&theirs, &c->cur)) return report_mismatch(c, j, &theirs);
    }
    return DT_OK;
}

void dt_group_describe_peer(dt_comm *c, int j, char *buf, size_t cap) {
    int p = c->proc_of[j];
    seg_proc *pr = &c->seg->hdr->proc[p];
    char st = dt_segment_proc_state(c->seg, p);
    const char *what = st == 'R' ? "running" : st == 'S' ? "sleeping" : st == 'D' ? "in uninterruptible I/O"
                     : st == 'T' || st == 't' ? "stopped" : st == 'Z' || st == 'X' ? "dead" : "in an unknown state";
    long long step = (long long)atomic_load(&pr->progress);
    char at[48] = "";
    if (step > 0) snprintf(at, sizeof at, ", at step %lld", step);
    snprintf(buf, cap, "rank %d (pid %d): %s (state %c)%s", atomic_load(&pr->world_rank), (int)atomic_load(&pr->pid), what,
             st ? st : '?', at);
}

/* A peer stopped this long (SIGSTOP, Ctrl-Z, a debugger) stops the job: its
 * peers would otherwise wait for it forever at 0% CPU. */
#define STOPPED_SECONDS 3.0

bool dt_comm_failed(dt_comm *c, char *msg, size_t cap) {
#ifdef DT_HAVE_MPI
    if (c && c->mpi && dt_mpi_heartbeat(c, msg, cap)) {
        if (c->seg) dt_segment_abort(c->seg, "%s", msg);
        return true;
    }
#endif
    if (!c || !c->seg) return false;
    const char *m = dt_segment_abort_message(c->seg);
    if (m) { snprintf(msg, cap, "%s", m); return true; }
    for (int j = 0; j < c->local_size; j++) {
        int p = c->proc_of[j];
        seg_proc *pr = &c->seg->hdr->proc[p];
        if (j == c->local_rank || atomic_load(&pr->state) == PROC_FINALIZED) continue;
        if (dt_segment_proc_dead(c->seg, p)) {
            /* Read again: a rank says it left before it exits, and it may have left and exited since the look above
             * (a watchdog preempted between the two, as ranks sharing cores are, spans that). */
            if (atomic_load(&pr->state) == PROC_FINALIZED) continue;
            snprintf(msg, cap, "rank %d (pid %d) died", atomic_load(&pr->world_rank), (int)atomic_load(&pr->pid));
            return true;
        }
        char state = dt_segment_proc_state(c->seg, p);
        if (state != 'T' && state != 't') { c->peer_stopped[j] = 0; continue; }
        double now = dt_time_now();
        if (c->peer_stopped[j] == 0) c->peer_stopped[j] = now;
        else if (now - c->peer_stopped[j] >= STOPPED_SECONDS) {
            dt_segment_abort(c->seg, "rank %d (pid %d) has been stopped for %.0f s (state %c: SIGSTOP, Ctrl-Z or a debugger), "
                             "at step %lld", atomic_load(&pr->world_rank), (int)atomic_load(&pr->pid), now - c->peer_stopped[j],
                             state, (long long)atomic_load(&pr->progress));
            snprintf(msg, cap, "%s", dt_segment_abort_message(c->seg));
            return true;
        }
    }
    return false;
}

void dt_comm_watch_end(dt_comm *c) {
#ifdef DT_HAVE_MPI
    if (c && c->mpi) dt_mpi_watch_end(c);
#else
    (void)c;
#endif
}

void dt_comm_set_progress(dt_comm *c, int64_t step) {
    if (c && c->seg) atomic_store(&c->seg->hdr->proc[c->proc_of[c->local_rank]].progress, step);
}
