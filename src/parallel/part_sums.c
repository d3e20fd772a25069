/* The sums a model part asks of the ranks holding a micro-batch's other parts (dt_part_sums): nonblocking
 * allreduces of doubles over their communicator, which run in the order they are posted. */
#include "dtrain/parallel.h"

static dt_status part_post(void *ctx, double *buf, size_t n, void **handle) {
    dt_request *req = NULL;
    dt_status st = dt_comm_iallreduce(ctx, buf, buf, n, DT_F64, DT_SUM, &req);
    *handle = req;
    return st;
}

static dt_status part_wait(void *ctx, void *handle) {
    (void)ctx;
    return dt_wait(handle);
}

dt_part_sums dt_part_sums_over(dt_comm *c) { return (dt_part_sums){ c, part_post, part_wait }; }
