/* Expert parallelism's exchanges as the mixture-of-experts op calls them (dt_ep_ops): the routed rows' counts by
 * expert, allgathered, so every rank knows every block's shape before any row moves; then the rows themselves by
 * dt_comm_alltoallv (whose own counts exchange checks the room). */
#include "dtrain/parallel.h"

#include <stdlib.h>

static dt_status ep_counts(void *ctx, const int32_t *mine, int32_t *all, size_t n) { return dt_comm_allgather(ctx, mine, all, n, DT_I32); }

static dt_status ep_exchange(void *ctx, const float *send, const size_t *rows, float *recv, size_t cap, size_t *got, size_t row) {
    int n = dt_comm_size(ctx);
    size_t *counts = malloc(sizeof *counts * (size_t)n);
    if (!counts) return dt_error(DT_ERR_NOMEM, "expert parallelism: out of memory");
    for (int j = 0; j < n; j++) counts[j] = rows[j] * row;
    dt_status st = dt_comm_alltoallv(ctx, send, counts, recv, cap * row, got, DT_F32);
    for (int j = 0; !st && j < n; j++) got[j] /= row;
    free(counts);
    return st;
}

dt_ep_ops dt_ep_ops_over(dt_comm *ep) { return (dt_ep_ops){ ep, ep_counts, ep_exchange }; }
