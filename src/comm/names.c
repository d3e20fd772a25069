/* Names of ops, collectives and algorithms, for flags, messages and JSON. */
#include "dtrain/comm.h"

#include <string.h>

static const char *op_names[DT_OP_COUNT] = { "sum", "avg", "max", "min", "prod" };
static const char *coll_names[DT_COLL_COUNT] = { "allreduce", "reduce_scatter", "allgather", "broadcast", "reduce",
                                                 "alltoall", "gather", "scatter", "barrier", "sendrecv", "alltoallv" };
static const char *algo_names[DT_ALGO_COUNT] = { "auto", "shm_direct", "ring", "tree", "rd",
                                                 "rabenseifner", "bruck", "pairwise", "hier" };

const char *dt_op_name(dt_op op) { return (unsigned)op < DT_OP_COUNT ? op_names[op] : "?"; }
const char *dt_coll_name(dt_coll c) { return (unsigned)c < DT_COLL_COUNT ? coll_names[c] : "?"; }
const char *dt_algo_name(dt_algo a) { return (unsigned)a < DT_ALGO_COUNT ? algo_names[a] : "?"; }

static int lookup(const char *s, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

dt_status dt_op_parse(const char *s, dt_op *out) {
    int i = lookup(s, op_names, DT_OP_COUNT);
    if (i < 0) return dt_error(DT_ERR_ARG, "unknown op '%s' (expected sum, avg, max, min or prod)", s);
    *out = (dt_op)i;
    return DT_OK;
}

dt_status dt_coll_parse(const char *s, dt_coll *out) {
    int i = lookup(s, coll_names, DT_COLL_COUNT);
    if (i < 0)
        return dt_error(DT_ERR_ARG, "unknown collective '%s' (expected allreduce, reduce_scatter, allgather, broadcast, "
                        "reduce, alltoall, gather, scatter or barrier)", s);
    *out = (dt_coll)i;
    return DT_OK;
}

dt_status dt_algo_parse(const char *s, dt_algo *out) {
    int i = lookup(s, algo_names, DT_ALGO_COUNT);
    if (i < 0)
        return dt_error(DT_ERR_ARG, "unknown algorithm '%s' (expected auto, shm_direct, ring, tree, rd, rabenseifner, "
                        "bruck, pairwise or hier)", s);
    *out = (dt_algo)i;
    return DT_OK;
}
