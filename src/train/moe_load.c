/* A mixture of experts' balance over a step: each layer's choices of each expert, summed over every rank (data- and
 * context-parallel ranks saw other tokens, pipeline stages hold other layers), and the most loaded expert against
 * the mean, the worst layer's and the layers' average (1: perfectly balanced); with expert parallelism, the bytes
 * its exchanges sent between ranks, all ranks'. And the same ratios over an evaluation's batches: the load over the
 * held-out text (the auxiliary-loss-free paper's MaxVio_global, plus one), which one step's batch only samples. */
#include "run.h"

#include <stdlib.h>
#include <string.h>

/* Expert parallelism: at each layer the rows the busiest rank of an expert-parallel group ran over the group's mean
 * (the experts held contiguously, E/P a rank: the group's exchange of that layer waits for that rank), averaged over
 * the layers this rank holds; the worst group's (1: even). From this rank's choices (mine, L x E), summed over its
 * group. A load summed over the layers first would hide a rank busiest at one layer and idle at the next, which the
 * step waits for at both; summed so it is what a rank keeps of its layers' routed rows for backward, the busiest
 * rank's over the mean (moe_rank_rows: at most the first where every layer routes as many rows). */
static dt_status rank_load(run *r, const double *mine, int L, int E) {
    int P = dt_comm_size(r->ep), El = E / P;
    double *group = calloc((size_t)L * E + (size_t)P, sizeof(double)), *kept = group + (size_t)L * E, sum = 0, ratio[2] = { 0 };
    int layers = 0;
    dt_status st = group ? dt_comm_allreduce(r->ep, mine, group, (size_t)L * E, DT_F64, DT_SUM) : dt_error(DT_ERR_NOMEM, "out of memory");
    for (int l = 0; !st && l < L; l++) {
        double total = 0, most = 0;
        for (int d = 0; d < P; d++) {
            double rows = 0;
            for (int e = d * El; e < (d + 1) * El; e++) rows += group[(size_t)l * E + e];
            total += rows, most = rows > most ? rows : most, kept[d] += rows;
        }
        if (total > 0) sum += most / (total / P), layers++;
    }
    double all = 0, most = 0;
    for (int d = 0; !st && d < P; d++) all += kept[d], most = kept[d] > most ? kept[d] : most;
    double m[2] = { layers ? sum / layers : 0, all > 0 ? most / (all / P) : 0 };
    if (!st) st = dt_comm_allreduce(r->w, m, ratio, 2, DT_F64, DT_MAX);
    r->moe_rank_load = st ? 0 : ratio[0];
    r->moe_rank_rows = st ? 0 : ratio[1];
    free(group);
    return st;
}

/* After each layer's choices of each expert (L x E) in the counts: a capacity's dropped choices, all choices, the bytes
 * expert parallelism sent, the balancing losses' sums and the micro-batches they are over. */
enum { DROPPED, CHOICES, BYTES, TERMS, EXTRA = TERMS + DT_MOE_TERMS + 1 };

/* This rank's counts since they were last read (the layers this rank does not hold left 0). Reading resets them. */
static void read_counts(dt_program *p, int L, int E, double *mine, double *local) {
    double *x = mine + (size_t)L * E;
    dt_program_moe_load(p, local);
    for (int l = 0, k = 0; l < L; l++) /* held layers in order, at their places in the whole model */
        if (dt_program_holds_block(p, l)) memcpy(mine + (size_t)l * E, local + (size_t)k++ * E, (size_t)E * sizeof(double));
    dt_program_moe_drops(p, &x[DROPPED], &x[CHOICES]);
    dt_program_moe_ep_traffic(p, &x[BYTES]);
    dt_program_moe_terms(p, &x[TERMS]);
}

/* Every layer's most chosen expert over the mean from all ranks' counts: the worst layer's and the layers' average. */
static void ratios(const double *all, int L, int E, double *worst_out, double *mean_out) {
    double worst = 0, sum = 0;
    int layers = 0;
    for (int l = 0; l < L; l++) {
        double max = 0, total = 0;
        for (int e = 0; e < E; e++) total += all[(size_t)l * E + e], max = all[(size_t)l * E + e] > max ? all[(size_t)l * E + e] : max;
        if (total <= 0) continue;
        double ratio = max / (total / E);
        worst = ratio > worst ? ratio : worst, sum += ratio, layers++;
    }
    *worst_out = layers ? worst : 0;
    *mean_out = layers ? sum / layers : 0;
}

/* The counts since last read, summed over every rank (collective): *all (L x E + EXTRA, as read_counts; the caller
 * frees it), NULL without experts; with expert parallelism and load set, the ranks' load (rank_load) too. */
static dt_status gather(run *r, double **all, bool load) {
    dt_program *p = dt_gpt2_program(r->m);
    const dt_lm_config *c = dt_program_config(p);
    int L = c->num_layers, E = c->experts;
    size_t n = (size_t)L * E + EXTRA;
    *all = NULL;
    if (!E) return DT_OK;
    double *mine = calloc(n, sizeof(double)), *local = calloc((size_t)(L + 1) * E, sizeof(double));
    *all = calloc(n, sizeof(double));
    dt_status st = mine && local && *all ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) read_counts(p, L, E, mine, local);
    dt_program_moe_new_step(p); /* the global-batch loss's counts: a step's (or an evaluation's) own */
    /* a tensor-parallel group's ranks route the same rows (gathered under SP): each counts them, every expert's load times
     * the group's size (the ratios and the bias's moves unchanged); each sent its own bytes */
    if (!st) st = r->nranks > 1 ? dt_comm_allreduce(r->w, mine, *all, n, DT_F64, DT_SUM) : DT_OK;
    if (!st && r->nranks == 1) memcpy(*all, mine, n * sizeof(double));
    if (!st && load && r->ep) st = rank_load(r, mine, L, E);
    free(mine), free(local);
    return st;
}

/* Each balancing loss's mean over the step's micro-batches and ranks (every rank that made a loss counted it alike), or
 * -1 where its coefficient is 0. */
static void terms(run *r, const dt_lm_config *c, const double *x) {
    const float coef[DT_MOE_TERMS] = { c->aux_coef, r->c.moe_z_loss, r->c.moe_seq_aux_loss, r->c.moe_global_aux_loss };
    for (int i = 0; i < DT_MOE_TERMS; i++) r->moe_term[i] = coef[i] > 0 && x[TERMS + DT_MOE_TERMS] > 0 ? x[TERMS + i] / x[TERMS + DT_MOE_TERMS] : -1;
}

dt_status dt_train_moe_load(run *r) {
    dt_program *p = dt_gpt2_program(r->m);
    const dt_lm_config *c = dt_program_config(p);
    int L = c->num_layers, E = c->experts;
    double *all;
    dt_status st = gather(r, &all, true);
    if (st || !all) {
        free(all);
        return st;
    }
    const double *x = all + (size_t)L * E;
    r->moe_dropped = x[CHOICES] > 0 && c->capacity_factor > 0 ? x[DROPPED] / x[CHOICES] : -1;
    r->moe_ep_bytes = x[BYTES];
    terms(r, c, x);
    if (!st && c->bias_rate > 0) dt_program_moe_update_bias(p, all); /* DeepSeek-V3's router: the step's load moves each bias alike */
    if (!st) ratios(all, L, E, &r->moe_worst, &r->moe_mean);
    free(all);
    return st;
}

dt_status dt_train_moe_val_load(run *r) {
    const dt_lm_config *c = dt_program_config(dt_gpt2_program(r->m));
    double *all;
    dt_status st = gather(r, &all, false);
    if (!st && all) ratios(all, c->num_layers, c->experts, &r->moe_val_worst, &r->moe_val_mean);
    free(all);
    return st;
}
