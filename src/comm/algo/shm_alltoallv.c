/* alltoallv with every rank on this machine (dt_comm_alltoallv): one round of
 * arrival cells carries each rank's counts, its room and where its send
 * buffer lies, and its blocks too where they fit the cell; every rank checks
 * every receipt against its room the same way (a rank without room fails all
 * of them with one message) and then takes its blocks from the others:
 *  - out of the sender's cell (small: one round, no barrier);
 *  - straight from the sender's buffer where it lies in the shared segment;
 *  - else by cross-memory attach (process_vm_readv: one copy, the kernel's,
 *    out of the sender's private memory, as Open MPI's shared-memory
 *    transport does), where every rank's cell says it can (cma.c);
 *  - else by point to point, pair by pair (rank r sends to r + k while it
 *    receives from r - k at step k), each block through the channels.
 * A block read in place ends the call with a barrier, so that no sender
 * reuses its buffer while a peer still reads it. */
#include "../comm_internal.h"

#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

/* A sender's cell: off[0] its send buffer's segment offset (0: private, or its blocks ride), off[1] its room (at most
 * ROOM: no real buffer holds more) with three flags (its blocks ride, its counts are 32 bits, it can read the others'
 * memory); its data the p counts (32 bits each where every one fits, else 64), then its send buffer's address (where
 * its blocks do not ride) or its blocks for the other ranks in rank order (its own block stays home). A few bytes of
 * blocks fit in the cell's first cache line beside its header: an exchange of two ranks' 4-byte blocks moves one line
 * each way. */
#define RIDES (1ull << 63)
#define C32 (1ull << 62)
#define CAN (1ull << 61) /* the rank can read the others by cross-memory attach (dt_cma_ready) */
#define ROOM (CAN - 1)

typedef struct {
    uint64_t room, soff, addr;
    bool rides, c32, can;
    const uint8_t *counts, *blocks;
} sender;

static sender sender_of(dt_comm *c, int j) {
    shm_cell *cell = dt_cell_of(c, j);
    uint64_t w = atomic_load_explicit(&cell->off[1], memory_order_relaxed);
    sender s = { .room = w & ROOM, .rides = (w & RIDES) != 0, .c32 = (w & C32) != 0, .can = (w & CAN) != 0, .counts = cell->data,
                 .soff = atomic_load_explicit(&cell->off[0], memory_order_relaxed) };
    size_t at = (size_t)c->size * (s.c32 ? 4 : 8);
    if (s.rides) {
        s.blocks = cell->data + at;
    } else {
        at = (at + 7) & ~(size_t)7;
        memcpy(&s.addr, cell->data + at, 8);
    }
    return s;
}

static uint64_t count_of(const sender *s, int q) {
    if (s->c32) {
        uint32_t n;
        memcpy(&n, s->counts + 4 * (size_t)q, 4);
        return n;
    }
    uint64_t n;
    memcpy(&n, s->counts + 8 * (size_t)q, 8);
    return n;
}

/* Every rank's receipt against its room (the same check on every rank, so all fail alike); this rank's receive
 * counts and where each block lands. */
static dt_status receipts(dt_comm *c, const sender *from, size_t *rcounts, size_t *rat) {
    int p = c->size, r = c->rank;
    for (int q = 0; q < p; q++) {
        uint64_t total = 0;
        for (int j = 0; j < p; j++) total += count_of(&from[j], q);
        if (total > from[q].room) {
            c->refused = true; /* every rank makes this check and returns this error: none waits, the job goes on */
            return dt_error(DT_ERR_ARG, "alltoallv: rank %d would receive %llu elements into room for %llu", q, (unsigned long long)total,
                            (unsigned long long)from[q].room);
        }
    }
    for (size_t j = 0, at = 0; j < (size_t)p; at += rcounts[j++]) rcounts[j] = count_of(&from[j], r), rat[j] = at;
    return DT_OK;
}

/* Rank j's block for this rank, read where it lies (its cell, the segment, its memory). A sender that neither rides
 * nor lies in the segment, without cross-memory attach, is left to pairs(). */
static dt_status take(dt_comm *c, const sender *s, int j, char *dst, size_t es, size_t n, bool cma) {
    size_t at = 0;
    for (int i = 0; i < c->rank; i++) at += i == j && s->rides ? 0 : count_of(s, i); /* (a riding sender's own block stays home) */
    if (s->rides) memcpy(dst, s->blocks + at * es, n * es);
    else if (s->soff) memcpy(dst, (const char *)dt_segment_ptr(c->seg, s->soff) + at * es, n * es);
    else if (cma) return dt_cma_read(c, j, dst, s->addr + at * es, n * es, "alltoallv");
    return DT_OK;
}

/* Without cross-memory attach: the blocks of senders that did not ride and lie outside the segment, pair by pair. */
static dt_status pairs(dt_comm *c, const coll_args *a, const sender *s, const size_t *sat, const size_t *rat, size_t es) {
    int p = c->size, r = c->rank;
    bool me_too = !s[r].rides && !s[r].soff;
    dt_status st = DT_OK;
    for (int k = 1; !st && k < p; k++) {
        int to = (r + k) % p, from = (r - k + p) % p;
        bool theirs = !s[from].rides && !s[from].soff;
        if (!me_too && !theirs) continue;
        st = dt_comm_sendrecv(c, (const char *)a->sendbuf + sat[to] * es, me_too ? a->counts[to] : 0, me_too ? to : -1,
                              (char *)a->recvbuf + rat[from] * es, theirs ? a->rcounts[from] : 0, theirs ? from : -1, a->dtype);
    }
    return st;
}

/* This rank's cell: its counts, then its address or its blocks for the others. */
static void publish(dt_comm *c, const coll_args *a, const size_t *sat, size_t so, size_t es, uint8_t *head) {
    int p = c->size, r = c->rank;
    bool c32 = true;
    for (int j = 0; j < p; j++) c32 &= a->counts[j] <= UINT32_MAX;
    size_t n = (size_t)p * (c32 ? 4 : 8), others = (so - a->counts[r]) * es;
    bool rides = n + others <= DT_CELL_INLINE;
    for (int j = 0; j < p; j++) {
        uint32_t x = (uint32_t)a->counts[j];
        uint64_t y = a->counts[j];
        if (c32) memcpy(head + 4 * (size_t)j, &x, 4);
        else memcpy(head + 8 * (size_t)j, &y, 8);
    }
    uint64_t flags = (rides ? RIDES : 0) | (c32 ? C32 : 0) | (dt_cma_ready(c) ? CAN : 0), soff = 0;
    if (!rides) { /* the address, aligned */
        uint64_t addr = (uintptr_t)a->sendbuf;
        n = (n + 7) & ~(size_t)7;
        memcpy(head + n, &addr, 8);
        n += 8;
        if (so && dt_segment_contains(c->seg, a->sendbuf, so * es)) soff = (uint64_t)((const char *)a->sendbuf - c->seg->base);
    }
    /* the blocks for the ranks before this one beside the header, those after it the second piece */
    const char *sb = a->sendbuf;
    size_t before = sat[r] * es, after = rides ? others - before : 0;
    if (rides && before) memcpy(head + n, sb, before), n += before;
    dt_cell_publish_parts(c, head, n, after ? sb + (sat[r] + a->counts[r]) * es : NULL, after, soff, (a->cap < ROOM ? a->cap : ROOM) | flags);
}

dt_status dt_shm_alltoallv_run(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    if (c->local_size != p || p > DT_MAX_LOCAL)
        return dt_error(DT_ERR_UNSUPPORTED, "alltoallv on shared memory needs every rank on one machine (%d of %d are here)", c->local_size, p);
    size_t es = dt_dtype_size(a->dtype), so = 0;
    /* up to 16 ranks on the stack (a dispatch of a few hundred bytes must not pay for allocations) */
    size_t sat_local[2 * 16];
    sender from_local[16];
    _Alignas(8) uint8_t head[DT_CELL_INLINE];
    bool heap = p > 16;
    size_t *sat = heap ? malloc(sizeof *sat * 2 * (size_t)p) : sat_local, *rat = sat ? sat + p : NULL;
    sender *from = heap ? malloc(sizeof *from * (size_t)p) : from_local;
    if (!sat || !from) {
        if (heap) free(sat), free(from);
        return dt_error(DT_ERR_NOMEM, "alltoallv: out of memory");
    }
    for (int j = 0; j < p; j++) sat[j] = so, so += a->counts[j];
    publish(c, a, sat, so, es, head);
    dt_status st = dt_cell_wait_all(c);
    for (int j = 0; !st && j < p; j++) from[j] = sender_of(c, j);
    if (!st) st = receipts(c, from, a->rcounts, rat);
    /* its own block: streamed where it is too large for the cache (and fenced: another thread may read it next) */
    uint8_t *own = st ? NULL : (uint8_t *)a->recvbuf + rat[r] * es;
    size_t nown = st ? 0 : a->rcounts[r] * es;
    if (nown >= DT_STREAM_BYTES) {
        dt_copy_out(own, (const uint8_t *)a->sendbuf + sat[r] * es, nown, true);
#if defined(__x86_64__)
        _mm_sfence();
#endif
    } else if (nown) {
        memmove(own, (const char *)a->sendbuf + sat[r] * es, nown);
    }
    /* private blocks by cross-memory attach where every rank can read the others (every rank sees the same cells) */
    bool cma = !st;
    for (int j = 0; !st && j < p; j++) cma &= from[j].can;
    for (int k = 1; !st && k < p; k++) { /* from the next rank on, so that the ranks do not all read one sender at once */
        int j = (r + k) % p;
        if (a->rcounts[j]) st = take(c, &from[j], j, (char *)a->recvbuf + rat[j] * es, es, a->rcounts[j], cma);
    }
    if (!st && !cma) st = pairs(c, a, from, sat, rat, es);
    /* the senders whose buffers were read in place wait for their readers */
    bool any = false;
    for (int j = 0; !st && j < p; j++) any |= !from[j].rides && (cma || from[j].soff);
    if (!st && any) st = dt_group_step(c);
    if (heap) free(sat), free(from);
    return st;
}
