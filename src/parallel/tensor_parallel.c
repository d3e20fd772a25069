/* Tensor parallelism's collectives as the model calls them (dt_tp_ops):
 * allreduces over the mesh's TP communicator. Every rank of the group gets
 * the same bits (the communicator's promise), which keeps the replicated
 * tensors (LayerNorms, the row-parallel biases, wpe) identical without a
 * broadcast. */
#include "dtrain/parallel.h"

static dt_status tp_allreduce(void *ctx, float *buf, size_t n, int max) {
    return dt_comm_allreduce(ctx, buf, buf, n, DT_F32, max ? DT_MAX : DT_SUM);
}

static dt_status tp_allgather(void *ctx, const float *mine, float *all, size_t n) {
    return dt_comm_allgather(ctx, mine, all, n, DT_F32);
}

static dt_status tp_reduce_scatter(void *ctx, const float *all, float *mine, size_t n) {
    return dt_comm_reduce_scatter(ctx, all, mine, n, DT_F32, DT_SUM);
}

static dt_status tp_broadcast(void *ctx, int32_t *buf, size_t n) { return dt_comm_broadcast(ctx, buf, n, DT_I32, 0); }

dt_tp_ops dt_tp_ops_over(dt_comm *tp) { return (dt_tp_ops){ tp, tp_allreduce, tp_allgather, tp_reduce_scatter, tp_broadcast }; }
