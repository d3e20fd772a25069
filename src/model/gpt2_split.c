/* Where a GPT-2's units go on p pipeline stages (the model layer: the
 * memory plan splits as the runtime does): contiguous runs (the
 * embedding on the first stage, the head on the last), balanced by cost:
 * the split whose costliest stage is the cheapest, found by dynamic
 * programming over (units, stages). A unit's cost is its forward's FLOPs
 * per token (backward is about twice each unit's, so the ratios hold):
 * a block twice its Linears' parameters (GPT-2: 24 C^2) plus 2 T C in causal attention, the head
 * 2 C Vp, the embedding C (a lookup: small, not nothing). */
#include "dtrain/model.h"
#include "dtrain/program.h"

#include <float.h>
#include <stdlib.h>

static double unit_cost(const dt_gpt2_config *c, int T, int u) {
    double C = c->channels;
    if (u == 0) return C;
    if (u <= c->num_layers) {
        dt_lm_config r = dt_lm_config_resolve(c);
        return 2 * dt_program_block_matmul_params(c, u - 1) + 2.0 * T * r.num_heads * r.head_dim;
    }
    return 2 * C * c->padded_vocab_size;
}

dt_status dt_gpt2_split_stages(const dt_gpt2_config *c, int T, int p, int *first) {
    int n = c->num_layers + 2;
    if (p < 1 || p > n)
        return dt_error(DT_ERR_ARG, "--pp %d: more stages than the model's %d units (the embedding, %d blocks, the head)", p, n,
                        c->num_layers);
    double *pre = malloc(sizeof *pre * (size_t)(n + 1)), *best = malloc(sizeof *best * (size_t)(n + 1) * (size_t)(p + 1));
    int *cut = malloc(sizeof *cut * (size_t)(n + 1) * (size_t)(p + 1));
    if (!pre || !best || !cut) { free(pre); free(best); free(cut); return dt_error(DT_ERR_NOMEM, "pipeline split: out of memory"); }
    pre[0] = 0;
    for (int u = 0; u < n; u++) pre[u + 1] = pre[u] + unit_cost(c, T, u);
#define BEST(i, k) best[(size_t)(i) * (size_t)(p + 1) + (size_t)(k)]
#define CUT(i, k) cut[(size_t)(i) * (size_t)(p + 1) + (size_t)(k)]
    /* BEST(i, k): the least largest stage cost of units [0, i) on k stages; CUT: where the last of them starts */
    for (int i = 0; i <= n; i++)
        for (int k = 0; k <= p; k++) BEST(i, k) = DBL_MAX;
    BEST(0, 0) = 0;
    for (int k = 1; k <= p; k++)
        for (int i = k; i <= n; i++)
            for (int j = k - 1; j < i; j++) {
                if (BEST(j, k - 1) == DBL_MAX) continue;
                double last = pre[i] - pre[j], worst = BEST(j, k - 1) > last ? BEST(j, k - 1) : last;
                if (worst < BEST(i, k)) { BEST(i, k) = worst; CUT(i, k) = j; }
            }
    first[p] = n;
    for (int k = p, i = n; k > 0; k--) { first[k - 1] = CUT(i, k); i = CUT(i, k); }
#undef BEST
#undef CUT
    free(pre);
    free(best);
    free(cut);
    return DT_OK;
}

dt_status dt_gpt2_stage_part(const dt_gpt2_config *c, int T, int p, int v, int s, dt_model_part *part) {
    if (v < 1 || v > DT_GPT2_MAX_CHUNKS) return dt_error(DT_ERR_ARG, "pipeline split: %d chunks a stage (1 to %d)", v, DT_GPT2_MAX_CHUNKS);
    int *first = malloc(sizeof *first * (size_t)(p * v + 1));
    if (!first) return dt_error(DT_ERR_NOMEM, "pipeline split: out of memory");
    dt_status st = dt_gpt2_split_stages(c, T, p * v, first);
    if (!st) {
        part->ua = first[s];
        part->ub = first[(v - 1) * p + s + 1];
        part->nchunks = v > 1 ? v : 0;
        for (int j = 0; j < v && v > 1; j++) part->chunk_a[j] = first[j * p + s], part->chunk_b[j] = first[j * p + s + 1];
    }
    free(first);
    return st;
}

double dt_gpt2_units_cost(const dt_gpt2_config *c, int T, int a, int b) {
    double s = 0;
    for (int u = a; u < b; u++) s += unit_cost(c, T, u);
    return s;
}
