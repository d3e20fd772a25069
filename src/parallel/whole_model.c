/* The whole GPT-2 on one rank from the parts a mesh's ranks hold (tensor-
 * parallel slices, pipeline stages): what a weights file needs.
 * One replica's model ranks (dp and cp coordinate 0; with expert parallelism the
 * first ep data-parallel ranks, each its experts) send their runs of the
 * whole model's store, a window at a time, by a reduction to rank 0 in
 * which every float has exactly one contributor: a tensor that TP
 * replicates comes from tp rank 0 alone, a last stage's copy of the tied
 * wte from nobody (the first stage owns it). The others send the smallest
 * int32; a maximum over the floats' bits then gives each contributor's
 * bits exactly, -0.0 and NaN included. */
#include "dtrain/parallel.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define WINDOW ((size_t)1 << 20) /* floats per reduction: 4 MiB on every rank, not a whole model */

typedef struct { size_t lo, go, n; } run;
typedef struct { run *r; size_t n, cap; int nomem; } runs;

static void add_run(size_t lo, size_t go, size_t n, void *ctx) {
    runs *x = ctx;
    if (x->n == x->cap) {
        size_t cap = x->cap ? 2 * x->cap : 256;
        run *r = realloc(x->r, cap * sizeof *r);
        if (!r) { x->nomem = 1; return; }
        x->r = r, x->cap = cap;
    }
    x->r[x->n++] = (run){ lo, go, n };
}

/* The runs of the store this rank contributes (with experts spread over ep data-parallel ranks: the first ep's). */
static dt_status my_runs(const dt_mesh *mesh, int ep, dt_model *view, runs *out) {
    if (dt_mesh_coord(mesh, DT_MESH_DP) >= (ep > 1 ? ep : 1) || dt_mesh_coord(mesh, DT_MESH_CP)) return DT_OK;
    for (int i = 0; i < view->ntensors && !out->nomem; i++) {
        const dt_tensor_info *t = &view->tensors[i];
        if (t->tied_copy || t->replica > 0) continue; /* each piece from the first rank of its replica group */
        dt_model_global_runs(view, t->offset, t->count, add_run, out);
    }
    return out->nomem ? dt_error(DT_ERR_NOMEM, "whole model: out of memory") : DT_OK;
}

/* Window [g0, g0 + n) of the whole store: this rank's bits where it contributes, the smallest int32 elsewhere. */
static void fill(const runs *x, const float *params, size_t g0, size_t n, int32_t *win, uint64_t *mine) {
    for (size_t i = 0; i < n; i++) win[i] = INT32_MIN;
    for (size_t k = 0; k < x->n; k++) {
        const run *r = &x->r[k];
        size_t a = r->go > g0 ? r->go : g0, b = r->go + r->n < g0 + n ? r->go + r->n : g0 + n;
        if (a >= b) continue;
        memcpy(win + (a - g0), params + r->lo + (a - r->go), (b - a) * sizeof(float));
        *mine += b - a;
    }
}

dt_status dt_mesh_gather_gpt2(const dt_mesh *mesh, dt_comm *world, dt_gpt2 *part, dt_gpt2 **whole) {
    *whole = NULL;
    dt_model view;
    dt_gpt2_model(part, &view);
    size_t G = dt_model_global_params(&view);
    int root = dt_comm_rank(world) == 0;
    runs x = { 0 };
    int32_t *win = malloc(WINDOW * sizeof *win), *got = root ? malloc(WINDOW * sizeof *got) : NULL;
    dt_status st = win && (!root || got) ? my_runs(mesh, view.part->ep_size, &view, &x) : dt_error(DT_ERR_NOMEM, "whole model: out of memory");
    if (!st && root) st = dt_gpt2_create(dt_gpt2_get_config(part), whole);
    /* every rank learns whether the others can go on: a reduction that one rank skips would hang the rest */
    int32_t bad = st != DT_OK, any = 0;
    dt_status agree = dt_comm_allreduce(world, &bad, &any, 1, DT_I32, DT_MAX);
    if (!st && (agree || any)) st = agree ? agree : dt_error(DT_ERR_NOMEM, "whole model: another rank could not take part");
    uint64_t mine = 0, total = 0;
    for (size_t g0 = 0; g0 < G && !st; g0 += WINDOW) {
        size_t n = G - g0 < WINDOW ? G - g0 : WINDOW;
        fill(&x, dt_gpt2_params(part), g0, n, win, &mine);
        st = dt_comm_reduce(world, win, got, n, DT_I32, DT_MAX, 0);
        if (!st && root) memcpy(dt_gpt2_params(*whole) + g0, got, n * sizeof(float));
    }
    /* each float came from one rank: the counts add up to the whole store (a layout that left a tensor out would not) */
    if (!st) st = dt_comm_allreduce(world, &mine, &total, 1, DT_I64, DT_SUM);
    if (!st && total != G)
        st = dt_error(DT_ERR_MISMATCH, "whole model: the ranks contributed %llu floats of the model's %zu", (unsigned long long)total, G);
    free(x.r);
    free(win);
    free(got);
    if (st) { dt_gpt2_destroy(*whole); *whole = NULL; }
    return st;
}
