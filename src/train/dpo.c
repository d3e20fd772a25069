/* Direct preference optimization (Rafailov et al. 2023) as TRL's DPOTrainer computes it (loss_type "sigmoid"): a
 * pair's completions' log-probabilities under the policy (pi_c, pi_r: the sums over their scored tokens) and under
 * the reference (r_c, r_r, computed once before training), h = beta ((pi_c - r_c) - (pi_r - r_r)), the loss
 * -log sigmoid(h), the mean over a micro-batch's pairs.
 *
 * The program's token loss (dt_program_set_token_loss) is the seam: a row's log-probability is minus the sum of its
 * cross-entropies, so d(loss)/d(a scored token's cross-entropy) is beta sigmoid(-h) / pairs for the chosen row and
 * its negative for the rejected; backward weighs the rows' gradients by it, and every layout that runs the head
 * (data, tensor, sequence and pipeline parallelism) trains DPO without a line of its own. The rows a forward reads
 * are queued by whoever loads them, in order (a pipeline's last stage runs its micro-batches' heads in the order it
 * read them); the queue starts again each step. */
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>

struct dt_dpo {
    double beta;
    size_t nrows;
    double *ref;         /* [nrows]: each row's log-probability under the reference (as summed: a log-ratio at the
                          * reference's own weights is 0, not a rounding) */
    bool *have;          /* [nrows]: computed */
    size_t *queue, nq, cap, head;
    bool reference;      /* forwards record the reference's log-probabilities */
    double stats[DT_DPO_NSTATS];
};

dt_status dt_dpo_create(double beta, size_t nrows, dt_dpo **out) {
    *out = NULL;
    if (!(beta > 0) || !isfinite(beta)) return dt_error(DT_ERR_ARG, "--dpo-beta %g: a positive number (TRL's default 0.1)", beta);
    dt_dpo *d = calloc(1, sizeof *d);
    if (d) d->ref = calloc(nrows ? nrows : 1, sizeof *d->ref), d->have = calloc(nrows ? nrows : 1, sizeof *d->have);
    if (!d || !d->ref || !d->have) { dt_dpo_destroy(d); return dt_error(DT_ERR_NOMEM, "dpo: out of memory for %zu rows", nrows); }
    d->beta = beta, d->nrows = nrows;
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
double dt_dpo_beta(const dt_dpo *d) { return d->beta; }

double dt_dpo_reference(const dt_dpo *d, size_t row) { return row < d->nrows && d->have[row] ? d->ref[row] : NAN; }

void dt_dpo_stats(dt_dpo *d, double out[DT_DPO_NSTATS], bool clear) {
    for (int i = 0; i < DT_DPO_NSTATS; i++) out[i] = d->stats[i], d->stats[i] = clear ? 0 : d->stats[i];
}

/* -log sigmoid(h), without overflow either way. */
static double softplus_neg(double h) { return h > 0 ? log1p(exp(-h)) : -h + log1p(exp(h)); }

float dt_dpo_token_loss(void *ctx, int B, int T, const float *ce, const int32_t *targets, float *dce) {
    dt_dpo *d = ctx;
    size_t row = d->head < d->nq ? d->queue[d->head++] : (size_t)-1;
    double logp[2], loss = 0;
    int pairs = B / 2;
    for (int b = 0; b < B; b++) { /* a row's gradient is its pair's weight on its scored tokens, 0 elsewhere */
        logp[b % 2] = 0;
        for (int t = 0; t < T; t++) logp[b % 2] -= ce[(size_t)b * T + t], dce[(size_t)b * T + t] = 0;
        if (row == (size_t)-1 || row + (size_t)b >= d->nrows) continue;
        if (d->reference) { d->ref[row + b] = logp[b % 2], d->have[row + b] = true; continue; }
        if (b % 2 == 0) continue;
        const double *ref = d->ref + row + b - 1;
        if (!d->have[row + b - 1] || !d->have[row + b]) { loss = NAN; continue; } /* never recorded: said by the NaN */
        double rc = d->beta * (logp[0] - ref[0]), rr = d->beta * (logp[1] - ref[1]), h = rc - rr;
        double w = d->beta / (1 + exp(h)) / pairs; /* beta sigmoid(-h) / pairs */
        loss += softplus_neg(h) / pairs;
        for (int t = 0; t < T; t++) {
            size_t c = (size_t)(b - 1) * T + t, r = (size_t)b * T + t;
            if (targets[c] >= 0) dce[c] = (float)w;
            if (targets[r] >= 0) dce[r] = (float)-w;
        }
        double s[DT_DPO_NSTATS] = { 1, h > 0, rc, rr, softplus_neg(h) };
        for (int i = 0; i < DT_DPO_NSTATS; i++) d->stats[i] += s[i];
    }
    if (row == (size_t)-1 || row + (size_t)B > d->nrows) return NAN; /* no rows queued: a caller's mistake, made visible */
    return d->reference ? 0 : (float)loss;
}
