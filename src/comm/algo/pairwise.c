/* Pairwise exchange and linear algorithms.
 *
 * alltoall: in step k rank r sends block r+k to rank r+k and receives from
 * r-k; cost (p-1)(α + n/p β), what auto picks for alltoall off-node.
 * gather/scatter: the root talks to each rank in turn, (p-1)(α + n/p β).
 * reduce_scatter: each rank receives its block from every other rank and
 * folds them in rank order, (p-1)(α + n/p β) + n/p (p-1) γ. */
#include "../comm_internal.h"

#include <string.h>

dt_status dt_pairwise_run(dt_comm *c, const coll_args *a) {
    int p = c->size, r = c->rank;
    size_t es = dt_dtype_size(a->dtype), B = a->count * es;
    const uint8_t *sb = a->sendbuf;
    uint8_t *rb = a->recvbuf;
    dt_status st = DT_OK;
    switch (a->coll) {
    case DT_COLL_ALLTOALL:
        memmove(rb + (size_t)r * B, sb + (size_t)r * B, B);
        for (int k = 1; k < p && !st; k++) {
            int to = (r + k) % p, from = (r - k + p) % p;
            st = dt_p2p_exchange(c, to, sb + (size_t)to * B, B, from, rb + (size_t)from * B, B, DT_F32, -1);
        }
        return st;
    case DT_COLL_GATHER:
        if (r != a->root) return dt_p2p_exchange(c, a->root, sb, B, -1, NULL, 0, DT_F32, -1);
        memmove(rb + (size_t)r * B, sb, B);
        for (int j = 0; j < p && !st; j++)
            if (j != r) st = dt_p2p_exchange(c, -1, NULL, 0, j, rb + (size_t)j * B, B, DT_F32, -1);
        return st;
    case DT_COLL_SCATTER:
        if (r != a->root) return dt_p2p_exchange(c, -1, NULL, 0, a->root, rb, B, DT_F32, -1);
        memmove(rb, sb + (size_t)r * B, B);
        for (int j = 0; j < p && !st; j++)
            if (j != r) st = dt_p2p_exchange(c, j, sb + (size_t)j * B, B, -1, NULL, 0, DT_F32, -1);
        return st;
    case DT_COLL_REDUCE_SCATTER: {
        /* Gather the p copies of block r in rank order, then fold them in order. */
        uint8_t *work = dt_comm_work(c, 0, B * (size_t)p);
        if (!work && B) return dt_error(DT_ERR_NOMEM, "pairwise reduce_scatter: no memory");
        memcpy(work + (size_t)r * B, sb + (size_t)r * B, B);
        for (int k = 1; k < p && !st; k++) {
            int to = (r + k) % p, from = (r - k + p) % p;
            st = dt_p2p_exchange(c, to, sb + (size_t)to * B, B, from, work + (size_t)from * B, B, DT_F32, -1);
        }
        if (st) return st;
        const void *srcs[DT_MAX_LOCAL];
        if (p > DT_MAX_LOCAL) return dt_error(DT_ERR_UNSUPPORTED, "pairwise reduce_scatter: more than %d ranks", DT_MAX_LOCAL);
        for (int j = 0; j < p; j++) srcs[j] = work + (size_t)j * B;
        dt_reduce_many(rb, srcs, p, a->count, a->dtype, a->op);
        dt_reduce_finish(rb, a->count, a->dtype, a->op, p);
        return DT_OK;
    }
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "pairwise does not implement %s", dt_coll_name(a->coll));
    }
}
