/* The device mesh: the world's ranks as a DP x TP x PP grid, and one
 * communicator along each axis. TP is innermost (consecutive world ranks),
 * so that tensor parallelism, the chattiest, stays inside one machine under
 * mpirun; then DP; PP is outermost, as in Megatron-LM:
 *   world rank = (pp * DP + dp) * TP + tp
 * The communicator along an axis holds the ranks that differ only in that
 * coordinate, ranked by it. */
#include "dtrain/parallel.h"

#include <stdlib.h>

struct dt_mesh {
    int size[DT_MESH_DIMS], coord[DT_MESH_DIMS];
    dt_comm *comm[DT_MESH_DIMS];
};

dt_status dt_mesh_create(dt_comm *world, int dp, int tp, int pp, dt_mesh **out) {
    *out = NULL;
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    if (dp < 1 || tp < 1 || pp < 1 || (long)dp * tp * pp != p)
        return dt_error(DT_ERR_ARG, "mesh: --dp %d x --tp %d x --pp %d = %ld, but the job has %d rank%s", dp, tp, pp,
                        (long)dp * tp * pp, p, p == 1 ? "" : "s");
    dt_mesh *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "mesh: out of memory");
    m->size[DT_MESH_DP] = dp;
    m->size[DT_MESH_TP] = tp;
    m->size[DT_MESH_PP] = pp;
    m->coord[DT_MESH_TP] = r % tp;
    m->coord[DT_MESH_DP] = r / tp % dp;
    m->coord[DT_MESH_PP] = r / (tp * dp);
    int t = m->coord[DT_MESH_TP], d = m->coord[DT_MESH_DP], q = m->coord[DT_MESH_PP];
    /* every split is collective over the world: all ranks make all three, in this order */
    const int color[DT_MESH_DIMS] = { [DT_MESH_DP] = q * tp + t, [DT_MESH_TP] = q * dp + d, [DT_MESH_PP] = d * tp + t };
    dt_status st = DT_OK;
    for (int k = 0; k < DT_MESH_DIMS && !st; k++) st = dt_comm_split(world, color[k], m->coord[k], &m->comm[k]);
    if (st) { dt_mesh_destroy(m); return st; }
    *out = m;
    return DT_OK;
}

void dt_mesh_destroy(dt_mesh *m) {
    if (!m) return;
    for (int k = DT_MESH_DIMS - 1; k >= 0; k--) dt_comm_destroy(m->comm[k]);
    free(m);
}

int dt_mesh_size(const dt_mesh *m, dt_mesh_dim d) { return m->size[d]; }
int dt_mesh_coord(const dt_mesh *m, dt_mesh_dim d) { return m->coord[d]; }
dt_comm *dt_mesh_comm(const dt_mesh *m, dt_mesh_dim d) { return m->comm[d]; }
