/* Ring: allreduce as reduce-scatter then allgather around a ring of p ranks;
 * reduce_scatter and allgather are its two halves.
 *
 * allreduce cost 2(p-1)α + 2n(p-1)/p β + n(p-1)/p γ: bandwidth-optimal, so
 * auto picks it for large n when ranks do not share one machine. Each block
 * is reduced once, along the ring, and then copied: all ranks agree bit for
 * bit. */
#include "../comm_internal.h"

#include <string.h>

static int mod(int a, int p) { return ((a % p) + p) % p; }

/* Reduce-scatter over the p blocks of buf, in place: at step k rank r passes
 * on block r-k-1 and folds in block r-k-2, so it ends holding block r. */
static dt_status ring_reduce_scatter(dt_comm *c, uint8_t *buf, size_t count, dt_dtype t, dt_op op) {
    int p = c->size, r = c->rank, right = mod(r + 1, p), left = mod(r - 1, p);
    size_t es = dt_dtype_size(t);
    for (int k = 0; k < p - 1; k++) {
        int sb = mod(r - k - 1, p), rb = mod(r - k - 2, p);
        dt_status st = dt_p2p_exchange(c, right, buf + dt_block_start(count, p, sb) * es, dt_block_count(count, p, sb) * es,
                                       left, buf + dt_block_start(count, p, rb) * es, dt_block_count(count, p, rb) * es, t, op);
        if (st) return st;
    }
    return DT_OK;
}

/* Allgather of the p blocks of buf in place, rank r starting with block r. */
static dt_status ring_allgather_blocks(dt_comm *c, uint8_t *buf, size_t count, size_t es) {
    int p = c->size, r = c->rank, right = mod(r + 1, p), left = mod(r - 1, p);
    for (int k = 0; k < p - 1; k++) {
        int sb = mod(r - k, p), rb = mod(r - k - 1, p);
        dt_status st = dt_p2p_exchange(c, right, buf + dt_block_start(count, p, sb) * es, dt_block_count(count, p, sb) * es,
                                       left, buf + dt_block_start(count, p, rb) * es, dt_block_count(count, p, rb) * es, DT_F32, -1);
        if (st) return st;
    }
    return DT_OK;
}

dt_status dt_ring_run(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype);
    switch (a->coll) {
    case DT_COLL_ALLREDUCE: {
        uint8_t *buf = a->recvbuf;
        if (a->sendbuf != a->recvbuf) memcpy(buf, a->sendbuf, a->count * es);
        dt_status st = ring_reduce_scatter(c, buf, a->count, a->dtype, a->op);
        if (st) return st;
        dt_reduce_finish(buf + dt_block_start(a->count, p, r) * es, dt_block_count(a->count, p, r), a->dtype, a->op, p);
        return ring_allgather_blocks(c, buf, a->count, es);
    }
    case DT_COLL_REDUCE_SCATTER: {
        size_t n = a->count * (size_t)p;
        uint8_t *work = dt_comm_work(c, 0, n * es);
        if (!work) return dt_error(DT_ERR_NOMEM, "ring reduce_scatter: no memory for %zu bytes", n * es);
        memcpy(work, a->sendbuf, n * es);
        dt_status st = ring_reduce_scatter(c, work, n, a->dtype, a->op);
        if (st) return st;
        memcpy(a->recvbuf, work + (size_t)r * a->count * es, a->count * es);
        dt_reduce_finish(a->recvbuf, a->count, a->dtype, a->op, p);
        return DT_OK;
    }
    case DT_COLL_ALLGATHER: {
        uint8_t *buf = a->recvbuf;
        size_t n = a->count * (size_t)p;
        memmove(buf + (size_t)r * a->count * es, a->sendbuf, a->count * es);
        return ring_allgather_blocks(c, buf, n, es);
    }
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "ring does not implement %s", dt_coll_name(a->coll));
    }
}
