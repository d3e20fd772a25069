/* The device mesh: the world's ranks as a grid of named axes, outermost first, and a communicator for any set of
 * them, derived from the grid alone: the ranks that differ only along those axes, ranked by their coordinates there
 * (mixed radix, in the mesh's order). dtrain's training mesh is PP x DP x CP x TP, TP innermost (consecutive world
 * ranks), so that tensor parallelism, the chattiest, stays inside one machine under mpirun; then CP, whose ring passes
 * keys and values every block; then DP; PP outermost, as in Megatron-LM:
 *   world rank = ((pp * DP + dp) * CP + cp) * TP + tp
 * The replicas (the ranks holding the same part of the model) are the group over dp and cp. A new axis (experts'
 * "ep") is one more name in the list. */
#include "dtrain/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct dt_mesh {
    int n;
    dt_mesh_axis axis[DT_MESH_MAX_AXES];
    int coord[DT_MESH_MAX_AXES];
    dt_comm *comm[DT_MESH_MAX_AXES]; /* along each axis alone */
    dt_comm *replicas;               /* the training mesh's dp and cp (the dp communicator itself when cp is 1) */
};

/* The standard axes' names, by dt_mesh_dim. */
static const char *const dim_name[DT_MESH_DIMS] = { [DT_MESH_DP] = "dp", [DT_MESH_TP] = "tp", [DT_MESH_PP] = "pp", [DT_MESH_CP] = "cp" };

int dt_mesh_axis_index(const dt_mesh *m, const char *name) {
    for (int k = 0; k < m->n; k++)
        if (!strcmp(m->axis[k].name, name)) return k;
    return -1;
}

/* The group over the axes in mask (a bit per axis index): the ranks whose other coordinates are this rank's (the
 * color: those coordinates' mixed radix), ranked by their coordinates along the mask's axes. Collective over world. */
static dt_status group(const dt_mesh *m, dt_comm *world, unsigned mask, dt_comm **out) {
    int color = 0, key = 0;
    for (int k = 0; k < m->n; k++) {
        if (mask & 1u << k) key = key * m->axis[k].size + m->coord[k];
        else color = color * m->axis[k].size + m->coord[k];
    }
    return dt_comm_split(world, color, key, out);
}

dt_status dt_mesh_create_axes(dt_comm *world, const dt_mesh_axis *axes, int n, dt_mesh **out) {
    *out = NULL;
    int p = dt_comm_size(world), r = dt_comm_rank(world);
    long all = 1;
    if (n < 1 || n > DT_MESH_MAX_AXES) return dt_error(DT_ERR_ARG, "mesh: %d axes (1 to %d)", n, DT_MESH_MAX_AXES);
    for (int k = 0; k < n; k++) {
        if (!axes[k].name || axes[k].size < 1) return dt_error(DT_ERR_ARG, "mesh: axis %d needs a name and a size of at least 1", k);
        for (int j = 0; j < k; j++)
            if (!strcmp(axes[j].name, axes[k].name)) return dt_error(DT_ERR_ARG, "mesh: axis \"%s\" named twice", axes[k].name);
        all *= axes[k].size;
    }
    if (all != p) {
        char what[160] = "";
        for (int k = 0; k < n; k++)
            snprintf(what + strlen(what), sizeof what - strlen(what), "%s--%s %d", k ? " x " : "", axes[k].name, axes[k].size);
        return dt_error(DT_ERR_ARG, "mesh: %s = %ld, but the job has %d rank%s", what, all, p, p == 1 ? "" : "s");
    }
    dt_mesh *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "mesh: out of memory");
    m->n = n;
    memcpy(m->axis, axes, sizeof *axes * (size_t)n);
    for (int k = n - 1, rest = r; k >= 0; k--) { /* the rank's mixed-radix digits, the innermost axis last */
        m->coord[k] = rest % axes[k].size;
        rest /= axes[k].size;
    }
    /* every split is collective over the world: all ranks make all of them, in this order */
    dt_status st = DT_OK;
    for (int k = 0; k < n && !st; k++) st = group(m, world, 1u << k, &m->comm[k]);
    int dp = dt_mesh_axis_index(m, "dp"), cp = dt_mesh_axis_index(m, "cp");
    if (!st && dp >= 0 && (cp < 0 || axes[cp].size == 1)) m->replicas = m->comm[dp];
    else if (!st && dp >= 0) st = group(m, world, 1u << dp | 1u << cp, &m->replicas);
    if (st) { dt_mesh_destroy(m); return st; }
    *out = m;
    return DT_OK;
}

dt_status dt_mesh_create(dt_comm *world, int dp, int tp, int pp, int cp, dt_mesh **out) {
    const dt_mesh_axis axes[] = { { "pp", pp }, { "dp", dp }, { "cp", cp }, { "tp", tp } };
    return dt_mesh_create_axes(world, axes, 4, out);
}

dt_status dt_mesh_group(const dt_mesh *m, dt_comm *world, const char *const *names, int n, dt_comm **out) {
    unsigned mask = 0;
    for (int i = 0; i < n; i++) {
        int k = dt_mesh_axis_index(m, names[i]);
        if (k < 0) return dt_error(DT_ERR_ARG, "mesh: no axis \"%s\"", names[i]);
        mask |= 1u << k;
    }
    return group(m, world, mask, out);
}

void dt_mesh_destroy(dt_mesh *m) {
    if (!m) return;
    int dp = dt_mesh_axis_index(m, "dp");
    if (dp < 0 || m->replicas != m->comm[dp]) dt_comm_destroy(m->replicas);
    for (int k = m->n - 1; k >= 0; k--) dt_comm_destroy(m->comm[k]);
    free(m);
}

int dt_mesh_axes(const dt_mesh *m) { return m->n; }
const dt_mesh_axis *dt_mesh_axis_at(const dt_mesh *m, int k) { return &m->axis[k]; }
int dt_mesh_axis_coord(const dt_mesh *m, int k) { return m->coord[k]; }
dt_comm *dt_mesh_axis_comm(const dt_mesh *m, int k) { return m->comm[k]; }

/* The training mesh's axes by their standard names (an axis the mesh lacks: size 1, coordinate 0, no communicator). */
int dt_mesh_size(const dt_mesh *m, dt_mesh_dim d) {
    int k = dt_mesh_axis_index(m, dim_name[d]);
    return k < 0 ? 1 : m->axis[k].size;
}
int dt_mesh_coord(const dt_mesh *m, dt_mesh_dim d) {
    int k = dt_mesh_axis_index(m, dim_name[d]);
    return k < 0 ? 0 : m->coord[k];
}
dt_comm *dt_mesh_comm(const dt_mesh *m, dt_mesh_dim d) {
    int k = dt_mesh_axis_index(m, dim_name[d]);
    return k < 0 ? NULL : m->comm[k];
}
dt_comm *dt_mesh_replicas(const dt_mesh *m) { return m->replicas; }
