/* alltoallv with ranks on other machines (dt_comm_alltoallv where not every rank shares this machine's segment): one
 * message from each rank to each other rank, those to other machines posted at once, those on this machine pair by
 * pair (at step k rank r sends to r + k while it receives from r - k). Each message holds the sender's row (its
 * room and its counts for every rank, so that every rank checks every receipt the same way and all refuse alike, as on
 * shared memory) and, where it is small (dt_comm_alltoallv_ride(p) bytes), its block for that rank: then one message each way is the
 * whole call, as in Open MPI's MPI_Alltoallv, whose counts are known beforehand. The receiver takes the message at
 * the length it has (dt_p2p_exchange_upto), so a block costs its own bytes on the wire and nothing is padded to an
 * agreed size. Larger blocks go in a second round of pairs once every receipt is checked. */
#include "../comm_internal.h"

#include <stdlib.h>
#include <string.h>

/* A row's first word: the room (at most ROOM elements: no real buffer holds more), whether the block rides after the
 * row, and whether the counts are 32 bits (every one fits) or 64. */
#define RIDES (1ull << 63)
#define C32 (1ull << 62)
#define ROOM (C32 - 1)

/* The most bytes of a block that ride beside the row: 16 KiB a call's receipts in all (two ranks' 32 KiB a rank ride;
 * past that a memcpy each side costs more than the round it saves), 512 at least. */
size_t dt_comm_alltoallv_ride(int p) {
    size_t b = ((size_t)16384 / (size_t)(p > 1 ? p - 1 : 1)) & ~(size_t)7;
    return b > 512 ? b : 512;
}

static uint64_t word(const uint8_t *row) {
    uint64_t w;
    memcpy(&w, row, 8);
    return w;
}

static void set_word(uint8_t *row, uint64_t w) { memcpy(row, &w, 8); }

static size_t row_bytes(int p, uint64_t w) { return 8 + (size_t)p * (w & C32 ? 4 : 8); }

static uint64_t count_at(const uint8_t *row, int q) {
    if (word(row) & C32) {
        uint32_t n;
        memcpy(&n, row + 8 + 4 * (size_t)q, 4);
        return n;
    }
    uint64_t n;
    memcpy(&n, row + 8 + 8 * (size_t)q, 8);
    return n;
}

/* This rank's row into out (its RIDES flag set per message); its length. */
static size_t write_row(const coll_args *a, int p, uint8_t *out) {
    bool c32 = true;
    for (int j = 0; j < p; j++) c32 &= a->counts[j] <= UINT32_MAX;
    uint64_t w = (a->cap < ROOM ? a->cap : ROOM) | (c32 ? C32 : 0);
    set_word(out, w);
    for (int j = 0; j < p; j++) {
        uint32_t x = (uint32_t)a->counts[j];
        uint64_t y = a->counts[j];
        if (c32) memcpy(out + 8 + 4 * (size_t)j, &x, 4);
        else memcpy(out + 8 + 8 * (size_t)j, &y, 8);
    }
    return row_bytes(p, w);
}

/* Every rank's receipt against its room, from the rows (the same check on every rank, so all fail alike). */
static dt_status receipts(dt_comm *c, uint8_t *const *rows) {
    int p = c->size;
    for (int q = 0; q < p; q++) {
        uint64_t total = 0;
        for (int j = 0; j < p; j++) total += count_at(rows[j], q);
        if (total > (word(rows[q]) & ROOM)) {
            c->refused = true; /* every rank makes this check and returns this error: none waits, the job goes on */
            return dt_error(DT_ERR_ARG, "alltoallv: rank %d would receive %llu elements into room for %llu", q, (unsigned long long)total,
                            (unsigned long long)(word(rows[q]) & ROOM));
        }
    }
    return DT_OK;
}

/* Whether peer j is on another machine (its messages go through MPI). */
static bool remote(const dt_comm *c, int j) { return !c->slots || c->local_index[j] < 0; }

/* A message's length against its sender's row (and block, where it rides). */
static dt_status check_length(int p, int from, int r, size_t es, const uint8_t *row, size_t got) {
    size_t want = got < 8 ? 8 : row_bytes(p, word(row));
    if (got >= want && word(row) & RIDES) want += count_at(row, r) * es;
    if (got == want) return DT_OK;
    return dt_error(DT_ERR_MISMATCH, "collective mismatch: alltoallv: rank %d's message to rank %d holds %zu bytes where its row says %zu "
                    "(ranks called with different element types?)", from, r, got, want);
}

/* The first round: this rank's row (and its block where it rides) to each rank, the message to rank r + k at out + k
 * slots and sent[k] bytes long, the one from rank r - k into its slot of in, got[k] bytes long. The messages to other
 * machines are posted at once (one round trip for them all, as Open MPI's alltoallv posts its pairs), those on this
 * machine go pair by pair in step order meanwhile, and the posted ones are completed last. */
static dt_status rows_round(dt_comm *c, const coll_args *a, const size_t *sat, size_t es, uint8_t *out, uint8_t *in, size_t slot,
                            uint8_t **rows, size_t *sent, size_t *got, void *xfers) {
    int p = c->size, r = c->rank;
    size_t head = write_row(a, p, out), most = dt_comm_alltoallv_ride(p);
    dt_status st = DT_OK;
    rows[r] = out;
    for (int k = 1; k < p; k++) { /* the messages */
        int to = (r + k) % p;
        uint8_t *msg = out + (size_t)k * slot;
        size_t block = a->counts[to] * es;
        memcpy(msg, out, head);
        set_word(msg, block <= most ? word(out) | RIDES : word(out));
        if (block <= most && block) memcpy(msg + head, (const char *)a->sendbuf + sat[to] * es, block);
        sent[k] = head + (block <= most ? block : 0);
        rows[(r - k + p) % p] = in + (size_t)(k - 1) * slot;
    }
#ifdef DT_HAVE_MPI
    dt_mpi_xfer *x = xfers;
    for (int k = 1; !st && k < p; k++) {
        int to = (r + k) % p, from = (r - k + p) % p;
        bool rs = remote(c, to), rr = remote(c, from);
        x[k].n = 0;
        if (rs || rr) st = dt_mpi_start(c, rs ? to : -1, out + (size_t)k * slot, rs ? sent[k] : 0, rr ? from : -1, rows[from], rr ? slot : 0, DT_F32, -1, &x[k]);
        x[k].upto = true;
    }
#else
    (void)xfers;
#endif
    for (int k = 1; !st && k < p; k++) {
        int to = (r + k) % p, from = (r - k + p) % p, speer = remote(c, to) ? -1 : to, rpeer = remote(c, from) ? -1 : from;
        if (speer >= 0 || rpeer >= 0) st = dt_p2p_exchange_upto(c, speer, out + (size_t)k * slot, sent[k], rpeer, rows[from], slot, &got[k]);
    }
#ifdef DT_HAVE_MPI
    for (int k = 1; !st && k < p; k++) {
        int from = (r - k + p) % p;
        st = dt_mpi_finish(c, &x[k]);
        if (!st && remote(c, from)) got[k] = x[k].rbytes;
    }
#endif
    for (int k = 1; !st && k < p; k++) st = check_length(p, (r - k + p) % p, r, es, rows[(r - k + p) % p], got[k]);
    return st;
}

/* The blocks that did not ride, pair by pair. */
static dt_status blocks_round(dt_comm *c, const coll_args *a, uint8_t *const *rows, const size_t *sat, const size_t *rat, size_t es) {
    int p = c->size, r = c->rank;
    size_t most = dt_comm_alltoallv_ride(p);
    dt_status st = DT_OK;
    for (int k = 1; !st && k < p; k++) {
        int to = (r + k) % p, from = (r - k + p) % p;
        size_t sb = a->counts[to] * es > most ? a->counts[to] * es : 0, rb = word(rows[from]) & RIDES ? 0 : a->rcounts[from] * es;
        if (sb || rb)
            st = dt_p2p_exchange(c, sb ? to : -1, (const char *)a->sendbuf + sat[to] * es, sb, rb ? from : -1,
                                 (char *)a->recvbuf + rat[from] * es, rb, a->dtype, -1);
    }
    return st;
}

dt_status dt_pairwise_alltoallv_run(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype), slot = (row_bytes(p, 0) + dt_comm_alltoallv_ride(p) + 7) & ~(size_t)7, so = 0, ro = 0;
    /* up to 16 ranks on the stack (a dispatch of a few hundred bytes must not pay for allocations) */
    size_t sat_local[4 * 16];
    uint8_t *rows_local[16];
#ifdef DT_HAVE_MPI
    dt_mpi_xfer x_local[16], *x = p > 16 ? malloc(sizeof *x * (size_t)p) : x_local;
#else
    void *x = rows_local;
#endif
    bool heap = p > 16;
    size_t *sat = heap ? malloc(sizeof *sat * 4 * (size_t)p) : sat_local, *rat = sat ? sat + p : NULL, *sent = sat ? sat + 2 * p : NULL,
           *got = sat ? sat + 3 * p : NULL;
    uint8_t **rows = heap ? malloc(sizeof *rows * (size_t)p) : rows_local;
    /* this rank's row, then its message to each rank; the others' messages */
    uint8_t *out = dt_comm_work(c, 0, slot * (size_t)p), *in = dt_comm_work(c, 1, slot * (size_t)(p - 1));
    dt_status st = sat && rows && x && out && in ? DT_OK : dt_error(DT_ERR_NOMEM, "alltoallv: out of memory");
    for (int j = 0; !st && j < p; j++) sat[j] = so, so += a->counts[j];
    if (!st) st = rows_round(c, a, sat, es, out, in, slot, rows, sent, got, x);
    if (!st) st = receipts(c, rows);
    for (int j = 0; !st && j < p; j++) a->rcounts[j] = count_at(rows[j], r), rat[j] = ro, ro += a->rcounts[j];
    char *rb = a->recvbuf;
    if (!st && a->rcounts[r]) memmove(rb + rat[r] * es, (const char *)a->sendbuf + sat[r] * es, a->rcounts[r] * es);
    for (int j = 0; !st && j < p; j++) /* the blocks that rode, from their messages */
        if (j != r && word(rows[j]) & RIDES && a->rcounts[j]) memcpy(rb + rat[j] * es, rows[j] + row_bytes(p, word(rows[j])), a->rcounts[j] * es);
    if (!st) st = blocks_round(c, a, rows, sat, rat, es);
    if (heap) free(sat), free(rows);
#ifdef DT_HAVE_MPI
    if (heap) free(x);
#endif
    return st;
}
