/* The ranks that share a second-order optimizer's work (optim_internal.h): all of the data-parallel group's, or
 * consecutive groups of g of them, each group holding all of the state between its ranks. */
#include "optim_internal.h"

dt_status dt_optim_work_group(dt_comm *comm, int g, const char *who, const char *flag, dt_comm **out, bool *own) {
    *out = NULL, *own = false;
    int n = comm ? dt_comm_size(comm) : 1;
    if (!g) g = n;
    if (g < 1 || n % g) return dt_error(DT_ERR_ARG, "%s: %s %d does not divide the %d data-parallel ranks", who, flag, g, n);
    if (g == 1) return DT_OK;
    if (g == n) {
        *out = comm;
        return DT_OK;
    }
    *own = true;
    return dt_comm_split(comm, dt_comm_rank(comm) / g, dt_comm_rank(comm), out);
}
