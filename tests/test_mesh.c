/* The DP x PP x CP x TP mesh, for every factorisation of the world size: each
 * rank's coordinates follow world rank = ((pp * DP + dp) * CP + cp) * TP + tp, and the
 * communicator along each axis holds exactly the ranks that differ only in
 * that coordinate, in its order (checked by gathering their world ranks),
 * and the replicas' (DP x CP) those that differ in dp or cp; named axes
 * beside them (an experts' ep) and groups over any set of axes;
 * a layout that does not multiply to the world size is refused.
 * Runs under dtrain launch -n N (and mpirun). */
#include "dtrain/parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define CHECK(cond, ...) do { if (cond) passed++; else { failed++; printf("rank %d: FAIL ", r); printf(__VA_ARGS__); printf("\n"); } } while (0)

int main(void) {
    dt_comm *w;
    if (dt_comm_init(&w)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    int p = dt_comm_size(w), r = dt_comm_rank(w), layouts = 0;
    for (int tp = 1; tp <= p; tp++)
        for (int pp = 1; pp <= p; pp++)
        for (int cp = 1; cp <= p; cp++) {
            if (p % (tp * pp * cp)) continue;
            int dp = p / (tp * pp * cp), size[DT_MESH_DIMS] = { [DT_MESH_DP] = dp, [DT_MESH_TP] = tp, [DT_MESH_PP] = pp, [DT_MESH_CP] = cp };
            dt_mesh *m;
            if (dt_mesh_create(w, dp, tp, pp, cp, &m)) { CHECK(0, "mesh %dx%dx%dx%d: %s", dp, tp, pp, cp, dt_last_error()); continue; }
            layouts++;
            int want[DT_MESH_DIMS] = { [DT_MESH_DP] = r / (tp * cp) % dp, [DT_MESH_TP] = r % tp, [DT_MESH_PP] = r / (tp * cp * dp),
                                       [DT_MESH_CP] = r / tp % cp };
#define WORLD(co) (((co[DT_MESH_PP] * dp + co[DT_MESH_DP]) * cp + co[DT_MESH_CP]) * tp + co[DT_MESH_TP])
            for (int d = 0; d < DT_MESH_DIMS; d++) {
                dt_comm *c = dt_mesh_comm(m, (dt_mesh_dim)d);
                CHECK(dt_mesh_size(m, (dt_mesh_dim)d) == size[d] && dt_mesh_coord(m, (dt_mesh_dim)d) == want[d],
                      "mesh %dx%dx%dx%d axis %d: size %d coord %d, expected %d and %d", dp, tp, pp, cp, d, dt_mesh_size(m, (dt_mesh_dim)d),
                      dt_mesh_coord(m, (dt_mesh_dim)d), size[d], want[d]);
                CHECK(dt_comm_size(c) == size[d] && dt_comm_rank(c) == want[d], "mesh %dx%dx%dx%d axis %d: comm rank %d of %d", dp, tp,
                      pp, cp, d, dt_comm_rank(c), dt_comm_size(c));
                /* the members, in order: this rank's coordinates with axis d set to 0, 1, ... */
                int32_t me = r, got[256];
                if (dt_comm_allgather(c, &me, got, 1, DT_I32)) { CHECK(0, "allgather: %s", dt_last_error()); continue; }
                for (int k = 0; k < size[d]; k++) {
                    int co[DT_MESH_DIMS];
                    memcpy(co, want, sizeof co);
                    co[d] = k;
                    int expect = WORLD(co);
                    CHECK(got[k] == expect, "mesh %dx%dx%dx%d axis %d: member %d is world rank %d, expected %d", dp, tp, pp, cp, d, k,
                          got[k], expect);
                }
            }
            /* the replicas: dp-major, cp-minor */
            dt_comm *rep = dt_mesh_replicas(m);
            int32_t me = r, got[256];
            CHECK(dt_comm_size(rep) == dp * cp && dt_comm_rank(rep) == want[DT_MESH_DP] * cp + want[DT_MESH_CP],
                  "replicas of %dx%dx%dx%d: rank %d of %d", dp, tp, pp, cp, dt_comm_rank(rep), dt_comm_size(rep));
            if (!dt_comm_allgather(rep, &me, got, 1, DT_I32))
                for (int k = 0; k < dp * cp; k++) {
                    int co[DT_MESH_DIMS];
                    memcpy(co, want, sizeof co);
                    co[DT_MESH_DP] = k / cp, co[DT_MESH_CP] = k % cp;
                    CHECK(got[k] == WORLD(co), "replicas of %dx%dx%dx%d: member %d is world rank %d, expected %d", dp, tp, pp, cp, k,
                          got[k], WORLD(co));
                }
            dt_mesh_destroy(m);
        }
    /* named axes beside the training mesh's: an experts' axis between dp and tp, and groups over any of them */
    for (int ep = 1; ep <= p; ep++) {
        if (p % ep) continue;
        const dt_mesh_axis axes[] = { { "pp", 1 }, { "dp", p / ep }, { "ep", ep }, { "tp", 1 } };
        dt_mesh *m = NULL;
        if (dt_mesh_create_axes(w, axes, 4, &m)) { CHECK(0, "mesh dp %d x ep %d: %s", p / ep, ep, dt_last_error()); continue; }
        int k = dt_mesh_axis_index(m, "ep");
        dt_comm *e = k >= 0 ? dt_mesh_axis_comm(m, k) : NULL, *both = NULL;
        CHECK(e && dt_comm_size(e) == ep && dt_comm_rank(e) == r % ep && dt_mesh_axis_coord(m, k) == r % ep &&
                  dt_mesh_size(m, DT_MESH_DP) == p / ep && dt_mesh_coord(m, DT_MESH_DP) == r / ep,
              "mesh dp %d x ep %d: ep rank %d of %d", p / ep, ep, e ? dt_comm_rank(e) : -1, e ? dt_comm_size(e) : -1);
        const char *names[] = { "dp", "ep" }, *bad_name[] = { "xp" };
        dt_status st = dt_mesh_group(m, w, names, 2, &both);
        CHECK(!st && dt_comm_size(both) == p && dt_comm_rank(both) == r, "group dp, ep: rank %d of %d", both ? dt_comm_rank(both) : -1,
              both ? dt_comm_size(both) : -1);
        dt_comm_destroy(both);
        dt_comm *none = NULL;
        CHECK(dt_mesh_group(m, w, bad_name, 1, &none) && strstr(dt_last_error(), "no axis \"xp\"") && !none, "an unknown axis was grouped");
        dt_mesh_destroy(m);
    }
    const dt_mesh_axis twice[] = { { "dp", p }, { "dp", 1 } };
    dt_mesh *dup = NULL;
    CHECK(dt_mesh_create_axes(w, twice, 2, &dup) && strstr(dt_last_error(), "named twice") && !dup, "an axis named twice was not refused");
    dt_mesh *bad = NULL;
    dt_status st = dt_mesh_create(w, p + 1, 1, 1, 1, &bad);
    CHECK(st && strstr(dt_last_error(), "but the job has") && !bad, "a mesh of %d ranks on %d was not refused", p + 1, p);
    int all[2] = { passed, failed }, sum[2];
    dt_comm_allreduce(w, all, sum, 2, DT_I32, DT_SUM);
    if (r == 0) printf("mesh on %d ranks, %d layouts: %d passed, %d failed\n", p, layouts, sum[0], sum[1]);
    dt_comm_destroy(w);
    return failed != 0;
}
