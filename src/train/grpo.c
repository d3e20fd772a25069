/* Group relative policy optimization (Shao et al. 2024, DeepSeekMath) as TRL's GRPOTrainer computes its loss: each
 * prompt's G completions are scored, a completion's advantage is its reward less its group's mean over the group's
 * standard deviation (+ 1e-4), and each completion token t adds
 *     l_t = -min(r_t A, clip(r_t, 1 - eps, 1 + eps) A) + beta k3_t,   r_t = pi(t) / pi_old(t),
 *     k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1             (Schulman's estimator of KL(pi || ref)),
 * the KL term taken times r_t (TRL's use_bias_correction_kl, its default: DeepSeek-V3.2's unbiased gradient; r_t is 1
 * on the rollout's first pass, but its gradient is not 0) unless plain_kl,
 * summed over the completion's tokens by the loss kind's weights: dapo (TRL's default) divides by the global batch's
 * completion tokens, grpo by each completion's length and the completions, dr_grpo by the completions times the
 * longest completion allowed.
 *
 * The seam is the program's token loss (dt_program_set_token_loss), as DPO's: log pi(t) is minus the token's
 * cross-entropy, so d(loss)/d(ce_t) = -dl_t/dlogp_t times the token's weight, where
 *     dl_t/dlogp_t = -r_t A (when the unclipped term is the min; 0 when the clipped one is, outside the range)
 *                    + beta r_t (k3_t + 1 - exp(ref_t - logp_t))    (plain_kl: + beta (1 - exp(ref_t - logp_t))).
 * A step's rows are this rank's completions in order; forwards read them a micro-batch at a time from row 0 (a cursor,
 * restarted each step). The first pass over a rollout records pi_old (= pi: r_t is exactly 1, as TRL's detached
 * copy); later iterations over the same rollout (--grpo-iterations) read it. In reference mode forwards record the
 * reference's log-probabilities instead. */
#include "dtrain/kernels.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct dt_grpo {
    dt_grpo_config c;
    int rows, T;
    float *adv;         /* [rows] */
    float *ref, *old;   /* [rows * T]: log-probabilities of each target (0 where none) */
    int cursor;
    int mode;           /* DT_GRPO_TRAIN, DT_GRPO_RECORD_OLD or DT_GRPO_RECORD_REF */
    double token_scale; /* dapo's weight of every token */
    double stats[DT_GRPO_NSTATS];
};

void dt_grpo_defaults(dt_grpo_config *c) {
    *c = (dt_grpo_config){ .group = 8, .iterations = 1, .beta = 0.04, .epsilon = 0.2, .temperature = 1.0f, .loss = DT_GRPO_LOSS_DAPO };
}

static const char *const loss_names[] = { "dapo", "grpo", "dr_grpo" };

dt_status dt_grpo_loss_parse(const char *s, dt_grpo_loss *out) {
    for (int k = 0; k < 3; k++)
        if (!strcmp(s, loss_names[k])) { *out = (dt_grpo_loss)k; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--grpo-loss %s: dapo (TRL's default), grpo or dr_grpo", s);
}

const char *dt_grpo_loss_name(dt_grpo_loss k) { return (unsigned)k < 3 ? loss_names[k] : "?"; }

dt_status dt_grpo_create(const dt_grpo_config *c, int rows, int T, dt_grpo **out) {
    *out = NULL;
    if (c->group < 2) return dt_error(DT_ERR_ARG, "--grpo-group %d: at least 2 completions a prompt (a group of one has no spread)", c->group);
    if (rows < 1 || rows % c->group) return dt_error(DT_ERR_ARG, "GRPO: %d rows a step on this rank are not whole groups of %d", rows, c->group);
    dt_grpo *g = calloc(1, sizeof *g);
    size_t n = (size_t)rows * (size_t)T;
    if (g) g->adv = calloc((size_t)rows, sizeof(float)), g->ref = calloc(n, sizeof(float)), g->old = calloc(n, sizeof(float));
    if (!g || !g->adv || !g->ref || !g->old) { dt_grpo_destroy(g); return dt_error(DT_ERR_NOMEM, "grpo: out of memory for %d rows", rows); }
    g->c = *c, g->rows = rows, g->T = T;
    *out = g;
    return DT_OK;
}

void dt_grpo_destroy(dt_grpo *g) {
    if (!g) return;
    free(g->adv), free(g->ref), free(g->old);
    free(g);
}

void dt_grpo_advantages(const float *rewards, int n, int group, float *adv) {
    for (int g0 = 0; g0 + group <= n; g0 += group) {
        double mean = 0, var = 0;
        for (int k = 0; k < group; k++) mean += rewards[g0 + k];
        mean /= group;
        for (int k = 0; k < group; k++) var += (rewards[g0 + k] - mean) * (rewards[g0 + k] - mean);
        double sd = sqrt(var / (group - 1)); /* torch's std: Bessel's correction */
        for (int k = 0; k < group; k++) adv[g0 + k] = (float)((rewards[g0 + k] - mean) / (sd + 1e-4));
    }
}

void dt_grpo_row(const int32_t *prompt, int P, const int32_t *completion, const unsigned char *mask, int C, int T, int32_t *in, int32_t *tg) {
    for (int t = 0; t < T; t++) {
        int k = t - (P - 1); /* the completion's token that position t predicts */
        in[t] = t < P ? prompt[t] : t - P < C ? completion[t - P] : 0;
        tg[t] = k >= 0 && k < C && (!mask || mask[k]) ? completion[k] : DT_IGNORE_INDEX;
    }
}

void dt_grpo_begin(dt_grpo *g, const float *adv, double token_scale) {
    memcpy(g->adv, adv, sizeof(float) * (size_t)g->rows);
    memset(g->ref, 0, sizeof(float) * (size_t)g->rows * (size_t)g->T);
    g->token_scale = token_scale;
}

void dt_grpo_restart(dt_grpo *g, int mode) { g->cursor = 0, g->mode = mode; }

void dt_grpo_stats(dt_grpo *g, double out[DT_GRPO_NSTATS], bool clear) {
    for (int i = 0; i < DT_GRPO_NSTATS; i++) out[i] = g->stats[i], g->stats[i] = clear ? 0 : g->stats[i];
}

const float *dt_grpo_reference(const dt_grpo *g) { return g->ref; }

/* The weight of each of a row's n scored tokens in a micro-batch of B rows. */
static double token_weight(const dt_grpo *g, int n, int B) {
    switch (g->c.loss) {
    case DT_GRPO_LOSS_GRPO: return n > 0 ? 1.0 / ((double)n * B) : 0;
    case DT_GRPO_LOSS_DR_GRPO: return 1.0 / ((double)B * g->c.completion);
    default: return g->token_scale;
    }
}

/* Token t of a row (its log-probability lp, advantage A): its loss and d(loss)/d(lp); statistics counted. */
static double token_loss(dt_grpo *g, double lp, double old, double ref, double A, double *dlp) {
    double r = exp(lp - old), lo = 1 - g->c.epsilon, hi = 1 + g->c.epsilon, clipped = r < lo ? lo : r > hi ? hi : r;
    bool unclipped = r * A <= clipped * A; /* the min's term (ties: either; their gradients agree inside the range) */
    double x = ref - lp, k3 = g->c.beta != 0 ? exp(x) - x - 1 : 0, dk3 = g->c.beta != 0 ? 1 - exp(x) : 0;
    /* TRL's use_bias_correction_kl (its default): the KL term times the ratio, whose gradient counts where r is 1 */
    double kl = g->c.plain_kl ? k3 : r * k3, dkl = g->c.plain_kl ? dk3 : r * (k3 + dk3);
    *dlp = (unclipped ? -r * A : 0) + g->c.beta * dkl;
    g->stats[DT_GRPO_TOKENS] += 1;
    g->stats[DT_GRPO_KL] += kl;
    g->stats[DT_GRPO_CLIPPED] += (r < lo && A < 0) || (r > hi && A > 0); /* TRL's clip_ratio's low and high regions */
    return -fmin(r * A, clipped * A) + g->c.beta * kl;
}

float dt_grpo_token_loss(void *ctx, int B, int T, const float *ce, const int32_t *targets, float *dce) {
    dt_grpo *g = ctx;
    int row0 = g->cursor;
    g->cursor += B;
    if (row0 + B > g->rows || T != g->T) return NAN; /* more rows than the rollout has: a caller's mistake, made visible */
    double loss = 0;
    for (int b = 0; b < B; b++) {
        size_t at = (size_t)(row0 + b) * (size_t)T, in = (size_t)b * (size_t)T;
        int n = 0;
        for (int t = 0; t < T; t++) n += targets[in + t] != DT_IGNORE_INDEX, dce[in + t] = 0;
        double w = token_weight(g, n, B), A = g->adv[row0 + b];
        for (int t = 0; t < T; t++) {
            if (targets[in + t] == DT_IGNORE_INDEX) continue;
            double lp = -(double)ce[in + t], dlp;
            if (g->mode == DT_GRPO_RECORD_REF) { g->ref[at + t] = (float)lp; continue; }
            if (g->mode == DT_GRPO_RECORD_OLD) g->old[at + t] = (float)lp;
            double old = g->mode == DT_GRPO_RECORD_OLD ? lp : g->old[at + t]; /* the first pass: r = 1 exactly */
            double l = token_loss(g, lp, old, g->ref[at + t], A, &dlp);
            loss += w * l;
            dce[in + t] = (float)(-dlp * w);
        }
    }
    return g->mode == DT_GRPO_RECORD_REF ? 0 : (float)loss;
}
