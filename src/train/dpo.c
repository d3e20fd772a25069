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

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

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

/* Row b's log-probability, minus the sum of its cross-entropies, each scored token after its first `shared` weighted by
 * alpha (LD-DPO's; INT_MAX: none). */
static double row_logp(int b, int T, const float *ce, const int32_t *targets, int shared, double alpha) {
    double logp = 0;
    for (int t = 0, n = 0; t < T; t++)
        if (targets[(size_t)b * T + t] >= 0) logp -= (n++ < shared ? 1 : alpha) * ce[(size_t)b * T + t];
    return logp;
}

/* Each scored token of row b weighted w more (alpha w after its first `shared`, as row_logp counts them). */
static void weigh_row(int b, int T, const int32_t *targets, float *dce, double w, int shared, double alpha) {
    for (int t = 0, n = 0; t < T; t++)
        if (targets[(size_t)b * T + t] >= 0) dce[(size_t)b * T + t] += (float)(n++ < shared ? w : alpha * w);
}

/* WPO's weight of row b: exp(the mean of log p_t - log sum_v p_v^2 over its scored tokens) (1 for a row of none). */
static double wpo_weight(int b, int T, const dt_token_rows *r, int scored) {
    double sum = 0;
    for (size_t k = (size_t)b * T; k < (size_t)(b + 1) * T; k++)
        if (r->targets[k] >= 0) sum -= (double)r->ce[k] + r->lsq[k];
    return exp(sum / (scored > 0 ? scored : 1));
}

/* What a micro-batch's pairs are made of: each row's scored tokens and plain log-probability (sft's), each pair's
 * shared length (LD-DPO's), chosen and rejected log-ratios, reference's chosen less rejected, weight (WPO's, or 1),
 * and chosen's and rejected's log-probabilities as the log-ratios weigh them. */
typedef struct {
    int pairs, *scored, *shared;
    double *logp, *cr, *rr, *refd, *w, *lc, *lr;
} pair_rows;

/* The micro-batch's pairs' losses (their weights on the rows' tokens into dce), once every pair's log-ratios are known:
 * each pair's own kinds (times its weight), then those that sort the pairs together, then sft's mean over the chosen
 * tokens (times the pairs' mean weight); the statistics counted. */
static double pairs_loss(dt_dpo *d, const pair_rows *pr, int T, const int32_t *targets, float *dce) {
    const dt_dpo_config *c = &d->cfg;
    int pairs = pr->pairs, sft_n = 0;
    double *gc = calloc(2 * (size_t)pairs, sizeof(double)), *gr = gc ? gc + pairs : NULL, loss = 0, sft_ce = 0, sft_w = dt_dpo_sft_weight(c);
    double alpha = c->ld ? c->ld_alpha : 1, wmean = 0;
    if (!gc) return NAN;
    for (int i = 0; i < pairs; i++) {
        double cr = pr->cr[i], rr = pr->rr[i], w = pr->w[i];
        double L = w * dt_dpo_pair_loss(c, cr, rr, pr->scored[2 * i], pr->scored[2 * i + 1], &gc[i], &gr[i]);
        double s[DT_DPO_NSTATS] = { 1, cr > rr, c->beta * cr, c->beta * rr, L, pr->lc[i], pr->lr[i] };
        for (int k = 0; k < DT_DPO_NSTATS; k++) d->stats[k] += s[k];
        gc[i] *= w, gr[i] *= w;
        loss += L, sft_ce -= pr->logp[2 * i], sft_n += pr->scored[2 * i], wmean += w / pairs;
    }
    double batch = dt_dpo_batch_loss(c, pairs, pr->cr, pr->rr, pr->refd, gc, gr); /* (aot's: the pairs sorted) */
    loss += batch, d->stats[DT_DPO_LOSS] += batch;
    for (int i = 0; i < pairs; i++) {
        weigh_row(2 * i, T, targets, dce, -gc[i] / pairs, pr->shared[i], alpha);
        weigh_row(2 * i + 1, T, targets, dce, -gr[i] / pairs, pr->shared[i], alpha);
    }
    free(gc);
    loss /= pairs;
    if (sft_w != 0 && sft_n > 0) { /* the chosen completions' mean cross-entropy over the micro-batch's scored tokens */
        double sw = sft_w * wmean;
        for (int i = 0; i < pairs; i++) weigh_row(2 * i, T, targets, dce, sw / sft_n, INT_MAX, 1);
        loss += sw * sft_ce / sft_n;
        d->stats[DT_DPO_LOSS] += sw * sft_ce / sft_n * pairs;
    }
    return loss;
}

/* Row b's scored tokens. */
static int row_scored(int b, int T, const int32_t *targets) {
    int n = 0;
    for (size_t k = (size_t)b * T; k < (size_t)(b + 1) * T; k++) n += targets[k] >= 0;
    return n;
}

float dt_dpo_token_loss(void *ctx, const dt_token_rows *r, float *dce) {
    dt_dpo *d = ctx;
    const dt_dpo_config *c = &d->cfg;
    int B = r->B, T = r->T, pairs = B / 2;
    size_t row = d->head < d->nq ? d->queue[d->head++] : (size_t)-1;
    pair_rows pr = { .pairs = pairs, .scored = malloc(sizeof(int) * (size_t)(B + pairs + 1)),
                     .logp = malloc(sizeof(double) * (size_t)(B + 6 * pairs + 1)) };
    /* known: the rows are queued, recorded (or being recorded) and WPO's figures given where it needs them */
    bool known = pr.scored && pr.logp && row != (size_t)-1 && row + (size_t)B <= d->nrows && !(c->wpo && !d->reference && !r->lsq);
    double loss = NAN;
    memset(dce, 0, sizeof(float) * (size_t)B * (size_t)T);
    if (known) {
        pr.shared = pr.scored + B, pr.cr = pr.logp + B, pr.rr = pr.cr + pairs, pr.refd = pr.rr + pairs, pr.w = pr.refd + pairs;
        pr.lc = pr.w + pairs, pr.lr = pr.lc + pairs;
        for (int b = 0; b < B; b++) pr.scored[b] = row_scored(b, T, r->targets), pr.logp[b] = row_logp(b, T, r->ce, r->targets, INT_MAX, 1);
        for (int i = 0; known && i < pairs; i++) {
            int sc = pr.scored[2 * i], sr = pr.scored[2 * i + 1];
            pr.shared[i] = c->ld ? (sc < sr ? sc : sr) : INT_MAX;
            /* LD-DPO's log-probabilities, or the plain ones already summed */
            double lc = c->ld ? row_logp(2 * i, T, r->ce, r->targets, pr.shared[i], c->ld_alpha) : pr.logp[2 * i],
                   lr = c->ld ? row_logp(2 * i + 1, T, r->ce, r->targets, pr.shared[i], c->ld_alpha) : pr.logp[2 * i + 1];
            double *ref = d->ref + row + 2 * i;
            if (d->reference) ref[0] = lc, ref[1] = lr, d->have[row + 2 * i] = d->have[row + 2 * i + 1] = true;
            known = d->have[row + 2 * i] && d->have[row + 2 * i + 1]; /* never recorded: said by the NaN */
            pr.cr[i] = lc - ref[0], pr.rr[i] = lr - ref[1], pr.refd[i] = ref[0] - ref[1], pr.lc[i] = lc, pr.lr[i] = lr;
            pr.w[i] = c->wpo && !d->reference ? wpo_weight(2 * i, T, r, sc) * wpo_weight(2 * i + 1, T, r, sr) : 1;
        }
    }
    if (known) loss = d->reference ? 0 : pairs_loss(d, &pr, T, r->targets, dce);
    free(pr.scored), free(pr.logp);
    return (float)loss; /* (NaN: no rows queued, a row beyond them or not recorded: a caller's mistake, made visible) */
}
