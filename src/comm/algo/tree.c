/* Binomial tree rooted at the root (rank 0 for allreduce and barrier), in
 * ranks relative to the root (vr = rank - root mod p).
 *
 * broadcast / reduce cost ⌈log2 p⌉(α + nβ) (+ nγ per level for reduce);
 * allreduce is reduce then broadcast, 2⌈log2 p⌉(α + nβ). Latency-optimal
 * for few bytes across machines; auto picks it for small n off-node.
 * gather/scatter move subtrees: ⌈log2 p⌉α + n(p-1)/p β. */
#include "../comm_internal.h"

#include <string.h>

static int real(int vr, int root, int p) { return (vr + root) % p; }
static int lowbit(int v) { return v & -v; }

static dt_status tree_bcast(dt_comm *c, void *buf, size_t bytes, int root) {
    int p = c->size, vr = (c->rank - root + p) % p;
    int top = 1;
    while (top < p) top <<= 1;
    int span = vr ? lowbit(vr) : top;
    if (vr) {
        dt_status st = dt_p2p_exchange(c, -1, NULL, 0, real(vr - span, root, p), buf, bytes, DT_F32, -1);
        if (st) return st;
    }
    for (int m = span >> 1; m >= 1; m >>= 1) {
        if (vr + m >= p) continue;
        dt_status st = dt_p2p_exchange(c, real(vr + m, root, p), buf, bytes, -1, NULL, 0, DT_F32, -1);
        if (st) return st;
    }
    return DT_OK;
}

/* Reduces into acc (holding this rank's contribution) toward the root; the
 * root ends with the full reduction, children fold in from the nearest up. */
static dt_status tree_reduce(dt_comm *c, uint8_t *acc, size_t count, dt_dtype t, dt_op op, int root) {
    int p = c->size, vr = (c->rank - root + p) % p;
    size_t bytes = count * dt_dtype_size(t);
    for (int m = 1; m < p; m <<= 1) {
        if (vr & m) return dt_p2p_exchange(c, real(vr - m, root, p), acc, bytes, -1, NULL, 0, t, -1);
        if (vr + m < p) {
            dt_status st = dt_p2p_exchange(c, -1, NULL, 0, real(vr + m, root, p), acc, bytes, t, op);
            if (st) return st;
        }
    }
    return DT_OK;
}

static dt_status tree_gather(dt_comm *c, const coll_args *a) {
    int p = c->size, vr = (c->rank - a->root + p) % p;
    size_t B = a->count * dt_dtype_size(a->dtype);
    /* work holds blocks in relative order; this rank's subtree is vr..vr+span-1. */
    uint8_t *work = dt_comm_work(c, 0, B * (size_t)p);
    if (!work) return dt_error(DT_ERR_NOMEM, "tree gather: no memory");
    memcpy(work + (size_t)vr * B, a->sendbuf, B);
    for (int m = 1; m < p; m <<= 1) {
        if (vr & m) {
            int n = m < p - vr ? m : p - vr;
            return dt_p2p_exchange(c, real(vr - m, a->root, p), work + (size_t)vr * B, (size_t)n * B, -1, NULL, 0, DT_F32, -1);
        }
        if (vr + m < p) {
            int n = m < p - vr - m ? m : p - vr - m;
            dt_status st = dt_p2p_exchange(c, -1, NULL, 0, real(vr + m, a->root, p), work + (size_t)(vr + m) * B, (size_t)n * B, DT_F32, -1);
            if (st) return st;
        }
    }
    for (int j = 0; j < p; j++) memcpy((uint8_t *)a->recvbuf + (size_t)j * B, work + (size_t)((j - a->root + p) % p) * B, B);
    return DT_OK;
}

static dt_status tree_scatter(dt_comm *c, const coll_args *a) {
    int p = c->size, vr = (c->rank - a->root + p) % p;
    size_t B = a->count * dt_dtype_size(a->dtype);
    int top = 1;
    while (top < p) top <<= 1;
    int span = vr ? lowbit(vr) : top;
    int mine = span < p - vr ? span : p - vr; /* blocks of this subtree */
    uint8_t *work = dt_comm_work(c, 0, B * (size_t)mine);
    if (!work) return dt_error(DT_ERR_NOMEM, "tree scatter: no memory");
    if (vr == 0) {
        for (int j = 0; j < p; j++) memcpy(work + (size_t)((j - a->root + p) % p) * B, (const uint8_t *)a->sendbuf + (size_t)j * B, B);
    } else {
        dt_status st = dt_p2p_exchange(c, -1, NULL, 0, real(vr - span, a->root, p), work, (size_t)mine * B, DT_F32, -1);
        if (st) return st;
    }
    for (int m = span >> 1; m >= 1; m >>= 1) {
        if (vr + m >= p) continue;
        int n = m < p - vr - m ? m : p - vr - m;
        dt_status st = dt_p2p_exchange(c, real(vr + m, a->root, p), work + (size_t)m * B, (size_t)n * B, -1, NULL, 0, DT_F32, -1);
        if (st) return st;
    }
    memcpy(a->recvbuf, work, B);
    return DT_OK;
}

dt_status dt_tree_run(dt_comm *c, const coll_args *a) {
    size_t es = dt_dtype_size(a->dtype), bytes = a->count * es;
    switch (a->coll) {
    case DT_COLL_BROADCAST:
        return tree_bcast(c, a->recvbuf, bytes, a->root);
    case DT_COLL_REDUCE:
    case DT_COLL_ALLREDUCE: {
        int root = a->coll == DT_COLL_REDUCE ? a->root : 0;
        uint8_t *acc = c->rank == root ? a->recvbuf : dt_comm_work(c, 0, bytes);
        if (!acc) return dt_error(DT_ERR_NOMEM, "tree reduce: no memory");
        if (acc != a->sendbuf) memcpy(acc, a->sendbuf, bytes);
        dt_status st = tree_reduce(c, acc, a->count, a->dtype, a->op, root);
        if (st) return st;
        if (c->rank == root) dt_reduce_finish(acc, a->count, a->dtype, a->op, c->size);
        return a->coll == DT_COLL_ALLREDUCE ? tree_bcast(c, a->recvbuf, bytes, 0) : DT_OK;
    }
    case DT_COLL_GATHER: return tree_gather(c, a);
    case DT_COLL_SCATTER: return tree_scatter(c, a);
    case DT_COLL_BARRIER: {
        /* Tokens up to rank 0 and back down: nobody leaves before all arrived. */
        int32_t token = 0;
        dt_status st = tree_reduce(c, (uint8_t *)&token, 1, DT_I32, DT_MAX, 0);
        return st ? st : tree_bcast(c, &token, sizeof token, 0);
    }
    default:
        return dt_error(DT_ERR_UNSUPPORTED, "tree does not implement %s", dt_coll_name(a->coll));
    }
}
