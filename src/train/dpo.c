/* Direct preference optimization (Rafailov et al. 2023) as TRL's DPOTrainer computes it: a pair's completions'
 * log-probabilities under the policy (pi_c, pi_r: the sums over their scored tokens) and under the reference (r_c,
 * r_r, computed once before training), the log-ratios c = pi_c - r_c and r = pi_r - r_r, the pair's loss from them by
 * the configured kinds (dpo_loss.c: sigmoid's -log sigmoid(beta (c - r)), DPO's own, by default), the mean over a
 * micro-batch's pairs; the sft kind adds the chosen completions' mean cross-entropy over the micro-batch's tokens.
 *
 * The program's token loss (dt_program_set_token_loss) is the seam: a row's log-probability is minus the sum of its
 * cross-entropies, so d(loss)/d(a scored token's cross-entropy) is -d(loss)/dc / pairs for the chosen row and
 * -d(loss)/dr / pairs for the rejected (sigmoid's beta sigmoid(-h) / pairs and its negative); backward weighs the rows'
 * gradients by it, and every layout that runs the head (data, tensor, sequence and pipeline parallelism) trains DPO
 * without a line of its own. The rows a forward reads are queued by whoever loads them, in order (a pipeline's last
 * stage runs its micro-batches' heads in the order it read them); the queue starts again each step. */
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>

struct dt_dpo {
    dt_dpo_config cfg;   /* (resolved) */
    size_t nrows;
    double *ref;         /* [nrows]: each row's log-probability under the reference (as summed: a log-ratio at the
                          * reference's own weights is 0, not a rounding) */
    bool *have;          /* [nrows]: computed */
    size_t *queue, nq, cap, head;
    bool reference;      /* forwards record the reference's log-probabilities */
    double stats[DT_DPO_NSTATS];
};

dt_status dt_dpo_create(const dt_dpo_config *c, size_t nrows, dt_dpo **out) {
    *out = NULL;
    dt_dpo_config cfg = *c;
    dt_status st = dt_dpo_config_resolve(&cfg);
    if (st) return st;
    dt_dpo *d = calloc(1, sizeof *d);
    if (d) d->ref = calloc(nrows ? nrows : 1, sizeof *d->ref), d->have = calloc(nrows ? nrows : 1, sizeof *d->have);
    if (!d || !d->ref || !d->have) { dt_dpo_destroy(d); return dt_error(DT_ERR_NOMEM, "dpo: out of memory for %zu rows", nrows); }
    d->cfg = cfg, d->nrows = nrows;
    *out = d;
    return DT_OK;
}

void dt_dpo_destroy(dt_dpo *d) {
    if (!d) return;
    free(d->ref), free(d->have), free(d->queue);
    free(d);
}

dt_status dt_dpo_queue(dt_dpo *d, size_t row) {
    if (d->nq == d->cap) {
        size_t c = d->cap ? 2 * d->cap : 16, *q = realloc(d->queue, c * sizeof *q);
        if (!q) return dt_error(DT_ERR_NOMEM, "dpo: out of memory");
        d->queue = q, d->cap = c;
    }
    d->queue[d->nq++] = row;
    return DT_OK;
}

void dt_dpo_restart(dt_dpo *d) { d->nq = d->head = 0; }
void dt_dpo_set_reference(dt_dpo *d, bool on) { d->reference = on; }
double dt_dpo_beta(const dt_dpo *d) { return d->cfg.beta; }
const dt_dpo_config *dt_dpo_config_of(const dt_dpo *d) { return &d->cfg; }

double dt_dpo_reference(const dt_dpo *d, size_t row) { return row < d->nrows && d->have[row] ? d->ref[row] : NAN; }

void dt_dpo_stats(dt_dpo *d, double out[DT_DPO_NSTATS], bool clear) {
    for (int i = 0; i < DT_DPO_NSTATS; i++) out[i] = d->stats[i], d->stats[i] = clear ? 0 : d->stats[i];
}

/* Row b's log-probability (minus the sum of its cross-entropies) and its scored tokens; its weights zeroed. */
static double row_logp(int b, int T, const float *ce, const int32_t *targets, float *dce, int *scored) {
    double logp = 0;
    *scored = 0;
    for (int t = 0; t < T; t++) logp -= ce[(size_t)b * T + t], dce[(size_t)b * T + t] = 0, *scored += targets[(size_t)b * T + t] >= 0;
    return logp;
}

/* Each scored token of row b weighted w more. */
static void weigh_row(int b, int T, const int32_t *targets, float *dce, double w) {
    for (int t = 0; t < T; t++)
        if (targets[(size_t)b * T + t] >= 0) dce[(size_t)b * T + t] += (float)w;
}

/* The micro-batch's pairs' losses (their weights on the rows' tokens into dce), once every pair's log-ratios are known
 * (cr, rr; refd the reference's chosen less rejected; scored the rows' tokens): each pair's own kinds, then those that
 * sort the pairs together, then sft's mean over the chosen tokens; the statistics counted. */
static double pairs_loss(dt_dpo *d, int pairs, int T, const int32_t *targets, const double *logp, const int *scored, double *cr, double *rr,
                         double *refd, float *dce) {
    const dt_dpo_config *c = &d->cfg;
    double *gc = calloc(2 * (size_t)pairs, sizeof(double)), *gr = gc ? gc + pairs : NULL, loss = 0, sft_ce = 0, sft_w = dt_dpo_sft_weight(c);
    int sft_n = 0;
    if (!gc) return NAN;
    for (int i = 0; i < pairs; i++) {
        double L = dt_dpo_pair_loss(c, cr[i], rr[i], scored[2 * i], scored[2 * i + 1], &gc[i], &gr[i]);
        double s[DT_DPO_NSTATS] = { 1, cr[i] > rr[i], c->beta * cr[i], c->beta * rr[i], L };
        for (int k = 0; k < DT_DPO_NSTATS; k++) d->stats[k] += s[k];
        loss += L, sft_ce -= logp[2 * i], sft_n += scored[2 * i];
    }
    double batch = dt_dpo_batch_loss(c, pairs, cr, rr, refd, gc, gr); /* (aot's: the pairs sorted) */
    loss += batch, d->stats[DT_DPO_LOSS] += batch;
    for (int i = 0; i < pairs; i++) weigh_row(2 * i, T, targets, dce, -gc[i] / pairs), weigh_row(2 * i + 1, T, targets, dce, -gr[i] / pairs);
    free(gc);
    loss /= pairs;
    if (sft_w != 0 && sft_n > 0) { /* the chosen completions' mean cross-entropy over the micro-batch's scored tokens */
        for (int i = 0; i < pairs; i++) weigh_row(2 * i, T, targets, dce, sft_w / sft_n);
        loss += sft_w * sft_ce / sft_n;
        d->stats[DT_DPO_LOSS] += sft_w * sft_ce / sft_n * pairs;
    }
    return loss;
}

float dt_dpo_token_loss(void *ctx, int B, int T, const float *ce, const int32_t *targets, float *dce) {
    dt_dpo *d = ctx;
    size_t row = d->head < d->nq ? d->queue[d->head++] : (size_t)-1;
    int pairs = B / 2, *scored = malloc(sizeof(int) * (size_t)(B > 0 ? B : 1));
    /* B rows' log-probabilities, then the pairs' chosen and rejected log-ratios and the reference's differences */
    double *logp = malloc(sizeof(double) * (size_t)(B + 3 * pairs + 1));
    bool known = scored && logp;
    for (int b = 0; known && b < B; b++) { /* a row's gradient is its pair's weight on its scored tokens, 0 elsewhere */
        logp[b] = row_logp(b, T, ce, targets, dce, &scored[b]);
        known = row != (size_t)-1 && row + (size_t)b < d->nrows;
        if (known && d->reference) d->ref[row + b] = logp[b], d->have[row + b] = true;
        known = known && (d->reference || d->have[row + b]); /* never recorded: said by the NaN */
    }
    double loss = NAN;
    if (known && d->reference) loss = 0;
    else if (known) {
        double *cr = logp + B, *rr = cr + pairs, *diff = rr + pairs;
        for (int i = 0; i < pairs; i++) {
            const double *ref = d->ref + row + 2 * i;
            cr[i] = logp[2 * i] - ref[0], rr[i] = logp[2 * i + 1] - ref[1], diff[i] = ref[0] - ref[1];
        }
        loss = pairs_loss(d, pairs, T, targets, logp, scored, cr, rr, diff, dce);
    }
    free(scored), free(logp);
    return (float)loss; /* (NaN: no rows queued, a row beyond them or not recorded: a caller's mistake, made visible) */
}
