/* The device mesh: the world's ranks as a DP x PP x CP x TP grid, and one
 * communicator along each axis. TP is innermost (consecutive world ranks),
 * so that tensor parallelism, the chattiest, stays inside one machine under
 * mpirun; then CP, whose ring passes keys and values every block; then DP;
 * PP is outermost, as in Megatron-LM:
 *   world rank = ((pp * DP + dp) * CP + cp) * TP + tp
 * The communicator along an axis holds the ranks that differ only in that
 * coordinate, ranked by it; the replicas' (DP x CP) those that differ in dp
 * or cp, ranked by dp * CP + cp. */
#include "dtrain/parallel.h"

#include <stdlib.h>

struct dt_mesh {
    int size[DT_MESH_DIMS], coord[DT_MESH_DIMS];
    dt_comm *comm[DT_MESH_DIMS];
    dt_comm *replicas; /* DP x CP (the DP communicator itself when CP is 1) */
};

/* The axes from outermost to innermost, for the rank's mixed-radix digits. */
static const dt_mesh_dim order[DT_MESH_DIMS] = { DT_MESH_PP, DT_MESH_DP, DT_MESH_CP, DT_MESH_TP };

/* The rank's digits with the axes in skip left out: the color of its group along them. */
static int color_without(const dt_mesh *m, unsigned skip) {
    int color = 0;
    for (int k = 0; k < DT_MESH_DIMS; k++)
        if (!(skip & 1u << order[k])) color = color * m->size[order[k]] + m->coord[order[k]];
    return color;
}

dt_status dt_mesh_create(dt_comm *world, int dp, int tp, int pp, int cp, dt_mesh **out) {
    *out = NULL;
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    if (dp < 1 || tp < 1 || pp < 1 || cp < 1 || (long)dp * tp * pp * cp != p)
        return dt_error(DT_ERR_ARG, "mesh: --dp %d x --tp %d x --pp %d x --cp %d = %ld, but the job has %d rank%s", dp, tp, pp, cp,
                        (long)dp * tp * pp * cp, p, p == 1 ? "" : "s");
    dt_mesh *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "mesh: out of memory");
    m->size[DT_MESH_DP] = dp;
    m->size[DT_MESH_TP] = tp;
    m->size[DT_MESH_PP] = pp;
    m->size[DT_MESH_CP] = cp;
    for (int k = DT_MESH_DIMS - 1, rest = r; k >= 0; k--) {
        m->coord[order[k]] = rest % m->size[order[k]];
        rest /= m->size[order[k]];
    }
    /* every split is collective over the world: all ranks make all of them, in this order */
    dt_status st = DT_OK;
    for (int k = 0; k < DT_MESH_DIMS && !st; k++) st = dt_comm_split(world, color_without(m, 1u << k), m->coord[k], &m->comm[k]);
    if (!st && cp == 1) m->replicas = m->comm[DT_MESH_DP];
    else if (!st)
        st = dt_comm_split(world, color_without(m, 1u << DT_MESH_DP | 1u << DT_MESH_CP), m->coord[DT_MESH_DP] * cp + m->coord[DT_MESH_CP],
                           &m->replicas);
    if (st) { dt_mesh_destroy(m); return st; }
    *out = m;
    return DT_OK;
}

void dt_mesh_destroy(dt_mesh *m) {
    if (!m) return;
    if (m->replicas != m->comm[DT_MESH_DP]) dt_comm_destroy(m->replicas);
    for (int k = DT_MESH_DIMS - 1; k >= 0; k--) dt_comm_destroy(m->comm[k]);
    free(m);
}

int dt_mesh_size(const dt_mesh *m, dt_mesh_dim d) { return m->size[d]; }
int dt_mesh_coord(const dt_mesh *m, dt_mesh_dim d) { return m->coord[d]; }
dt_comm *dt_mesh_comm(const dt_mesh *m, dt_mesh_dim d) { return m->comm[d]; }
dt_comm *dt_mesh_replicas(const dt_mesh *m) { return m->replicas; }
