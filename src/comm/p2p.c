/* Point-to-point exchange, the one primitive the generic algorithms (ring,
 * tree, recursive doubling, Rabenseifner, Bruck, pairwise) are written on.
 *
 * Between ranks of one machine a message travels through a channel per
 * ordered pair in the communicator's control block: DT_CHAN_SLOTS chunks of
 * DT_CHAN_CHUNK bytes, filled by the sender and drained by the receiver.
 * Sending and receiving progress together, so a ring step never deadlocks
 * on a full channel. Every chunk carries the sequence number and collective
 * of its sender, so a receiver that expected something else says so. */
#include "comm_internal.h"

#include <string.h>

static shm_chan *chan(dt_comm *c, int from, int to) {
    size_t idx = (size_t)from * (size_t)c->local_size + (size_t)to;
    return dt_segment_ptr(c->seg, c->chan_base + idx * sizeof(shm_chan));
}

typedef struct {
    dt_comm *c;
    shm_chan *out, *in;
    bool sending, receiving;
} xfer_state;

static bool can_progress(void *p) {
    xfer_state *x = p;
    if (x->sending &&
        atomic_load_explicit(&x->out->head, memory_order_relaxed) -
                atomic_load_explicit(&x->out->tail, memory_order_acquire) < DT_CHAN_SLOTS)
        return true;
    if (x->receiving &&
        atomic_load_explicit(&x->in->head, memory_order_acquire) != atomic_load_explicit(&x->in->tail, memory_order_relaxed))
        return true;
    return false;
}

static dt_status chunk_mismatch(dt_comm *c, int from, uint64_t seq, uint32_t coll, uint64_t total, size_t expect, bool most) {
    char mine[200];
    dt_desc_format(&c->cur, mine, sizeof mine);
    int wr = atomic_load(&c->seg->hdr->proc[c->proc_of[from]].world_rank);
    dt_segment_abort(c->seg,
                     "collective mismatch: rank %d in %s expected a message of %s%zu bytes from rank %d, which sent %llu bytes for %s #%llu",
                     c->world_rank, mine, most ? "1 to " : "", expect, wr, (unsigned long long)total, dt_coll_name((dt_coll)coll),
                     (unsigned long long)seq);
    return dt_error(DT_ERR_MISMATCH, "%s", dt_segment_abort_message(c->seg));
}

/* The exchange; got non-NULL: rbytes is the most the message from rpeer may hold (it holds at least one byte), its
 * length there once it is in. */
static dt_status exchange(dt_comm *c, int speer, const void *sbuf, size_t sbytes, int rpeer, void *rbuf, size_t rbytes,
                          size_t *got, dt_dtype dtype, int op) {
    if (speer < 0) sbytes = 0;
    if (rpeer < 0) rbytes = 0;
    if (speer == c->rank && rpeer == c->rank && sbytes == rbytes) {
        if (op >= 0) dt_reduce_into(rbuf, sbuf, rbytes / dt_dtype_size(dtype), dtype, (dt_op)op);
        else if (rbuf != sbuf) memmove(rbuf, sbuf, rbytes);
        return DT_OK;
    }
    int me = c->local_rank;
    int sl = sbytes && c->slots ? c->local_index[speer] : -1, rl = rbytes && c->slots ? c->local_index[rpeer] : -1;
    /* Halves with a peer on another machine go through MPI, posted first and
     * completed after the shared-memory halves, which never wait on MPI. */
    bool remote_s = sbytes && sl < 0, remote_r = rbytes && rl < 0;
#ifdef DT_HAVE_MPI
    dt_mpi_xfer mx = { .n = 0 };
    if (remote_s || remote_r) {
        dt_status st = dt_mpi_start(c, remote_s ? speer : -1, sbuf, remote_s ? sbytes : 0, remote_r ? rpeer : -1, rbuf,
                                    remote_r ? rbytes : 0, dtype, op, &mx);
        if (st) return st;
        mx.upto = got != NULL;
        if (remote_s) sbytes = 0;
        if (remote_r) rbytes = 0;
    }
#else
    if (remote_s || remote_r)
        return dt_error(DT_ERR_UNSUPPORTED, "point-to-point with a rank on another machine needs the MPI transport");
#endif
    xfer_state x = { c, sbytes ? chan(c, me, sl) : NULL, rbytes ? chan(c, rl, me) : NULL, false, false };
    size_t es = dt_dtype_size(dtype), sent = 0, recvd = 0, most = rbytes;
    bool known = !got; /* rbytes is the message's length (else at most that, until its first chunk says) */
    while (sent < sbytes || recvd < rbytes) {
        bool moved = false;
        if (sent < sbytes) {
            uint32_t h = atomic_load_explicit(&x.out->head, memory_order_relaxed);
            if (h - atomic_load_explicit(&x.out->tail, memory_order_acquire) < DT_CHAN_SLOTS) {
                size_t len = sbytes - sent < DT_CHAN_CHUNK ? sbytes - sent : DT_CHAN_CHUNK;
                unsigned s = h % DT_CHAN_SLOTS;
                memcpy(x.out->data[s], (const char *)sbuf + sent, len);
                x.out->hdr[s].seq = c->seq;
                x.out->hdr[s].coll = c->cur.coll;
                x.out->hdr[s].bytes = (uint32_t)len;
                x.out->hdr[s].total = sbytes;
                atomic_store(&x.out->head, h + 1);
                dt_shm_notify(c, sl);
                sent += len;
                moved = true;
            }
        }
        if (recvd < rbytes) {
            uint32_t t = atomic_load_explicit(&x.in->tail, memory_order_relaxed);
            if (atomic_load_explicit(&x.in->head, memory_order_acquire) != t) {
                unsigned s = t % DT_CHAN_SLOTS;
                uint64_t total = x.in->hdr[s].total;
                if (!known && total >= 1 && total <= most) rbytes = (size_t)total, known = true;
                size_t len = rbytes - recvd < DT_CHAN_CHUNK ? rbytes - recvd : DT_CHAN_CHUNK;
                if (!known || x.in->hdr[s].seq != c->seq || x.in->hdr[s].coll != c->cur.coll || x.in->hdr[s].bytes != len ||
                    total != rbytes)
                    return chunk_mismatch(c, rl, x.in->hdr[s].seq, x.in->hdr[s].coll, total, most, got != NULL);
                if (op >= 0) dt_reduce_into((char *)rbuf + recvd, x.in->data[s], len / es, dtype, (dt_op)op);
                else memcpy((char *)rbuf + recvd, x.in->data[s], len);
                atomic_store(&x.in->tail, t + 1);
                dt_shm_notify(c, rl);
                recvd += len;
                moved = true;
            }
        }
        if (!moved) {
            x.sending = sent < sbytes;
            x.receiving = recvd < rbytes;
            dt_status st = dt_shm_wait(c, can_progress, &x, x.receiving ? rl : sl);
            if (st) return st;
        }
    }
    if (got) *got = rbytes;
#ifdef DT_HAVE_MPI
    dt_status st = dt_mpi_finish(c, &mx);
    if (!st && got && remote_r) *got = mx.rbytes;
    return st;
#else
    return DT_OK;
#endif
}

dt_status dt_p2p_exchange(dt_comm *c, int speer, const void *sbuf, size_t sbytes,
                          int rpeer, void *rbuf, size_t rbytes, dt_dtype dtype, int op) {
    return exchange(c, speer, sbuf, sbytes, rpeer, rbuf, rbytes, NULL, dtype, op);
}

dt_status dt_p2p_exchange_upto(dt_comm *c, int speer, const void *sbuf, size_t sbytes, int rpeer, void *rbuf, size_t most,
                               size_t *got) {
    *got = 0;
    if (speer >= 0 && !sbytes) return dt_error(DT_ERR_ARG, "p2p: a message of unknown length holds at least one byte");
    if (rpeer >= 0 && (most < 1 || most > ((size_t)1 << 30)))
        return dt_error(DT_ERR_ARG, "p2p: a message of unknown length is received into 1 byte to 1 GiB, not %zu", most);
    return exchange(c, speer, sbuf, sbytes, rpeer, rbuf, most, got, DT_F32, -1);
}
