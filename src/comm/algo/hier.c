/* Hierarchical allreduce for communicators that span machines: reduce-
 * scatter inside each machine (shm_direct), allreduce of each slice between
 * machines (ranks with the same local rank, over MPI), allgather inside each
 * machine.
 *
 * cost 2α_shm + 2n(l-1)/l β_shm + 2⌈log2 q⌉α_mpi + 2(n/l)(q-1)/q β_mpi for q
 * machines of l ranks: the slow network carries n/l per rank instead of n.
 * auto picks it whenever a communicator spans machines with equal rank
 * counts. Counts that l does not divide are padded in a private buffer. */
#include "../comm_internal.h"

#include <string.h>

dt_status dt_hier_run(dt_comm *c, const coll_args *a) {
    if (a->coll != DT_COLL_ALLREDUCE)
        return dt_error(DT_ERR_UNSUPPORTED, "hier does not implement %s", dt_coll_name(a->coll));
    if (!c->node_comm || !c->cross_comm)
        return dt_error(DT_ERR_UNSUPPORTED, "hier needs a communicator that spans machines with the same number of ranks on each");
    int l = c->node_comm->size;
    size_t es = dt_dtype_size(a->dtype);
    size_t blk = (a->count + (size_t)l - 1) / (size_t)l, padded = blk * (size_t)l;
    const uint8_t *src = a->sendbuf;
    uint8_t *dst = a->recvbuf;
    if (padded != a->count) {
        uint8_t *w = dt_comm_work(c, 0, padded * es);
        if (!w) return dt_error(DT_ERR_NOMEM, "hier: no memory");
        memcpy(w, a->sendbuf, a->count * es);
        memset(w + a->count * es, 0, (padded - a->count) * es);
        src = dst = w;
    }
    uint8_t *slice = dt_comm_work(c, 1, blk * es);
    if (!slice && blk) return dt_error(DT_ERR_NOMEM, "hier: no memory");
    /* AVG: sum everywhere, divide once at the end. */
    dt_op op = a->op == DT_AVG ? DT_SUM : a->op;
    dt_status st = dt_comm_reduce_scatter(c->node_comm, src, slice, blk, a->dtype, op);
    if (!st) st = dt_comm_allreduce(c->cross_comm, slice, slice, blk, a->dtype, op);
    if (!st) dt_reduce_finish(slice, blk, a->dtype, a->op, c->size);
    if (!st) st = dt_comm_allgather(c->node_comm, slice, dst, blk, a->dtype);
    if (!st && dst != a->recvbuf) memcpy(a->recvbuf, dst, a->count * es);
    return st;
}
