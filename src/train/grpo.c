/* Group relative policy optimization (Shao et al. 2024, DeepSeekMath) as TRL's GRPOTrainer computes its loss: each
 * prompt's G completions are scored, a completion's advantage is its reward less its group's mean over the group's
 * standard deviation (+ 1e-4; or the batch's, or none: --grpo-scale-rewards), and each completion token t adds
 *     l_t = -min(c_t A, clip(r_t, 1 - eps, 1 + eps_high) A) + beta k3_t,   r_t = pi(t) / pi_old(t), c_t = min(r_t, delta),
 *     k3_t = exp(ref_t - logp_t) - (ref_t - logp_t) - 1             (Schulman's estimator of KL(pi || ref)),
 * the KL term taken times r_t (TRL's use_bias_correction_kl, its default: DeepSeek-V3.2's unbiased gradient; r_t is 1
 * on the rollout's first pass, but its gradient is not 0) unless plain_kl; delta (INTELLECT-2's two-sided clipping)
 * none unless given; with --grpo-importance-sampling sequence (GSPO) r_t is the completion's one ratio, the exp of its
 * tokens' mean log-ratio. Other kinds replace the policy term: cispo -min(r_t, eps_high) A logp_t (the capped ratio a
 * constant), sapo -sigmoid(tau (r_t - 1)) 4 / tau A (tau by the advantage's sign). The terms are summed over the
 * completion's tokens by the loss kind's weights: dapo (TRL's default) and cispo divide by the global batch's
 * completion tokens, grpo and sapo by each completion's length and the completions, bnpo by the micro-batch's tokens,
 * dr_grpo by the completions times the longest completion allowed, luspo by the completions alone.
 *
 * The seam is the program's token loss (dt_program_set_token_loss), as DPO's: log pi(t) is minus the token's
 * cross-entropy, so d(loss)/d(ce_t) = -dl/dlogp_t times the token's weight. A term's derivative has a part through the
 * ratio (dl/dlog r: -c_t A where the unclipped term is the min and c_t is not capped, 0 where the clipped one is,
 * outside the range; the KL's r_t k3_t) and a direct part (the KL's r_t (1 - exp(ref_t - logp_t)), cispo's capped ratio
 * times -A); a token's log r moves with its own logp, a completion's (sequence) with each of its tokens' by 1 / n.
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
    dt_comm *comm;      /* the ranks an entropy quantile gathers (NULL: this one) */
    double coef, last;  /* the entropy bonus's coefficient now, and (adaptive) the last step's entropy: +inf before one */
    double stats[DT_GRPO_NSTATS];
};

void dt_grpo_defaults(dt_grpo_config *c) {
    *c = (dt_grpo_config){ .group = 8, .iterations = 1, .beta = 0.04, .epsilon = 0.2, .temperature = 1.0f, .top_entropy = 1,
                           .loss = DT_GRPO_LOSS_DAPO, .ent_target = 0.2, .ent_delta = 0.005, .ent_max = 1 }; /* (TRL's) */
}

static const char *const loss_names[DT_GRPO_NLOSSES] = { "dapo", "grpo", "dr_grpo", "bnpo", "cispo", "sapo", "luspo", "vespo" };
static const char *const scale_names[] = { "group", "batch", "none" };

dt_status dt_grpo_loss_parse(const char *s, dt_grpo_loss *out) {
    for (int k = 0; k < DT_GRPO_NLOSSES; k++)
        if (!strcmp(s, loss_names[k])) { *out = (dt_grpo_loss)k; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--grpo-loss %s: dapo (TRL's default), grpo, dr_grpo, bnpo, cispo, sapo, luspo or vespo", s);
}

const char *dt_grpo_loss_name(dt_grpo_loss k) { return (unsigned)k < DT_GRPO_NLOSSES ? loss_names[k] : "?"; }

dt_status dt_grpo_scale_parse(const char *s, dt_grpo_scale *out) {
    for (int k = 0; k < 3; k++)
        if (!strcmp(s, scale_names[k])) { *out = (dt_grpo_scale)k; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--grpo-scale-rewards %s: group (TRL's default), batch or none", s);
}

dt_status dt_grpo_create(const dt_grpo_config *c, int rows, int T, dt_grpo **out) {
    *out = NULL;
    if (c->group < 2) return dt_error(DT_ERR_ARG, "--grpo-group %d: at least 2 completions a prompt (a group of one has no spread)", c->group);
    if (rows < 1 || rows % c->group) return dt_error(DT_ERR_ARG, "GRPO: %d rows a step on this rank are not whole groups of %d", rows, c->group);
    dt_grpo *g = calloc(1, sizeof *g);
    size_t n = (size_t)rows * (size_t)T;
    if (g) g->adv = calloc((size_t)rows, sizeof(float)), g->ref = calloc(n, sizeof(float)), g->old = calloc(n, sizeof(float));
    if (!g || !g->adv || !g->ref || !g->old) { dt_grpo_destroy(g); return dt_error(DT_ERR_NOMEM, "grpo: out of memory for %d rows", rows); }
    g->c = *c, g->rows = rows, g->T = T;
    g->coef = c->entropy_coef, g->last = INFINITY; /* (TRL's: no bonus before a step has measured the entropy) */
    if (g->c.epsilon_high == 0) g->c.epsilon_high = g->c.epsilon; /* (TRL's: epsilon_high None) */
    if (g->c.sapo_pos == 0) g->c.sapo_pos = 1.0;
    if (g->c.sapo_neg == 0) g->c.sapo_neg = 1.05;
    static const double vespo[4] = { 2, 3, 3, 2 }; /* (TRL's vespo_k_pos, vespo_lambda_pos, vespo_k_neg, vespo_lambda_neg) */
    for (int k = 0; k < 4; k++) g->c.vespo[k] = g->c.vespo[k] > 0 ? g->c.vespo[k] : vespo[k];
    *out = g;
    return DT_OK;
}

void dt_grpo_destroy(dt_grpo *g) {
    if (!g) return;
    free(g->adv), free(g->ref), free(g->old);
    free(g);
}

void dt_grpo_advantages(const float *rewards, int n, int group, dt_grpo_scale scale, double batch_sd, float *adv) {
    for (int g0 = 0; g0 + group <= n; g0 += group) {
        double mean = 0, var = 0;
        for (int k = 0; k < group; k++) mean += rewards[g0 + k];
        mean /= group;
        for (int k = 0; k < group; k++) var += (rewards[g0 + k] - mean) * (rewards[g0 + k] - mean);
        double sd = scale == DT_GRPO_SCALE_BATCH ? batch_sd : sqrt(var / (group - 1)); /* torch's std: Bessel's correction */
        for (int k = 0; k < group; k++)
            adv[g0 + k] = (float)(scale == DT_GRPO_SCALE_NONE ? rewards[g0 + k] - mean : (rewards[g0 + k] - mean) / (sd + 1e-4));
    }
}

void dt_grpo_decoupled_rewards(float *const *each, const double *weight, int nfun, int n, int group, float *out) {
    for (int i = 0; i < n; i++) out[i] = 0;
    for (int k = 0; k < nfun; k++)
        for (int g0 = 0; g0 + group <= n; g0 += group) {
            double mean = 0, var = 0;
            for (int j = 0; j < group; j++) mean += each[k][g0 + j];
            mean /= group;
            for (int j = 0; j < group; j++) var += (each[k][g0 + j] - mean) * (each[k][g0 + j] - mean);
            double sd = sqrt(var / (group - 1)); /* (Bessel's, as TRL's nanstd) */
            for (int j = 0; j < group; j++) out[g0 + j] += (float)(weight[k] * ((each[k][g0 + j] - mean) / (sd + 1e-4)));
        }
}

void dt_grpo_batch_advantages(const float *rewards, int n, double mean, double sd, float *adv) {
    for (int i = 0; i < n; i++) adv[i] = (float)((rewards[i] - mean) / (sd + 1e-4));
}

double dt_grpo_batch_sd(double sum, double sumsq, double count) {
    return count > 1 ? sqrt(fmax(0, (sumsq - sum * sum / count) / (count - 1))) : 0;
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

/* The weight of each of a row's n scored tokens in a micro-batch of B rows holding mb scored tokens. */
static double token_weight(const dt_grpo *g, int n, int B, int mb) {
    switch (g->c.loss) {
    case DT_GRPO_LOSS_GRPO: case DT_GRPO_LOSS_SAPO: return n > 0 ? 1.0 / ((double)n * B) : 0;
    case DT_GRPO_LOSS_DR_GRPO: return 1.0 / ((double)B * g->c.completion);
    case DT_GRPO_LOSS_BNPO: return 1.0 / (mb > 1 ? mb : 1);
    case DT_GRPO_LOSS_LUSPO: return 1.0 / B;
    default: return g->token_scale; /* dapo, cispo */
    }
}

/* A token's policy term at ratio r = exp(lr) (its own, or its completion's) and advantage A: its value, its derivative
 * by lr (*dr) and by the token's log-probability lp directly (*dlp); whether the clipping stopped it counted. phi:
 * vespo's weight of the token's completion. */
static double policy_term(dt_grpo *g, double lr, double lp, double A, double phi, double *dr, double *dlp, bool *clipped) {
    double r = exp(lr), lo = 1 - g->c.epsilon, hi = 1 + g->c.epsilon_high;
    *dr = *dlp = 0;
    switch (g->c.loss) {
    case DT_GRPO_LOSS_VESPO: /* -phi A logp, phi a constant (TRL's no_grad) */
        *clipped = false, *dlp = -phi * A;
        return -phi * A * lp;
    case DT_GRPO_LOSS_CISPO: { /* the capped ratio is a constant (TRL's detach) */
        double cap = fmin(r, g->c.epsilon_high);
        *clipped = r > g->c.epsilon_high && A > 0, *dlp = -cap * A;
        return -cap * A * lp;
    }
    case DT_GRPO_LOSS_SAPO: {
        double tau = A > 0 ? g->c.sapo_pos : g->c.sapo_neg, s = 1 / (1 + exp(-tau * (r - 1)));
        *clipped = false, *dr = -A * 4 * s * (1 - s) * r;
        return -s * 4 / tau * A;
    }
    default: {
        double cr = r < lo ? lo : r > hi ? hi : r, c1 = g->c.delta > 0 && r > g->c.delta ? g->c.delta : r;
        bool unclipped = c1 * A <= cr * A; /* the min's term (ties: either; their gradients agree inside the range) */
        *clipped = (r < lo && A < 0) || (r > hi && A > 0); /* TRL's clip_ratio's low and high regions */
        *dr = unclipped ? (c1 == r ? -r * A : 0) : (cr == r ? -r * A : 0);
        return -fmin(c1 * A, cr * A);
    }
    }
}

/* Token t's KL term at the ratio r = exp(lr) (times it unless plain_kl): its value, *dr and *dlp added to. */
static double kl_term(dt_grpo *g, double lp, double ref, double lr, double *dr, double *dlp) {
    if (g->c.beta == 0) return 0;
    double x = ref - lp, k3 = exp(x) - x - 1, dk3 = 1 - exp(x), r = exp(lr);
    g->stats[DT_GRPO_KL] += g->c.plain_kl ? k3 : r * k3;
    if (g->c.plain_kl) { *dlp += g->c.beta * dk3; return g->c.beta * k3; }
    *dr += g->c.beta * r * k3, *dlp += g->c.beta * r * dk3; /* TRL's use_bias_correction_kl: the ratio's gradient counts where r is 1 */
    return g->c.beta * r * k3;
}

/* Vespo's gamma weight of a completion (Fang et al. 2025, TRL's get_gamma_weights) from the sum of its tokens' log-ratios
 * (each clamped to [-20, 20]): w = exp(that, clamped to [log 1e-8, 20]), phi = exp(lambda + k log w - lambda w), k and
 * lambda by the advantage's sign (phi(1) = 1); 0 where it is not finite. */
static double vespo_weight(const dt_grpo *g, double sum, double A) {
    double lw = fmin(fmax(sum, log(1e-8)), 20.0), k = A >= 0 ? g->c.vespo[0] : g->c.vespo[2];
    double lam = fmax(A >= 0 ? g->c.vespo[1] : g->c.vespo[3], 1e-4), phi = exp(lam + k * lw - lam * exp(lw));
    return isfinite(phi) ? phi : 0;
}

/* Whether entropy e is in the quantile's top (at or above its threshold thr; -inf: every token). Within 1e-6 of it
 * counts as at it: tokens after identical contexts (a group's first completion tokens) tie in exact arithmetic, and
 * TRL takes them all, but a GEMM's blocking can part their entropies in the last bits. */
static bool in_top(float e, double thr) { return e >= thr - 1e-6 * fabs(thr); }

/* Row b of a micro-batch (its targets tg, cross-entropies ce, weights out into dce; global row i): recorded, or its
 * loss (the weights w of its n scored tokens) returned. */
static double row_loss(dt_grpo *g, int i, int T, const float *ce, const int32_t *tg, const float *ent, double thr, float *dce, double w,
                       int n) {
    size_t at = (size_t)i * (size_t)T;
    double A = g->adv[i], loss = 0, seq = 0, through = 0; /* through: the row's sum of dl/dlog r (sequence level) */
    double vsum = 0; /* vespo's: the clamped log-ratios' sum */
    for (int t = 0; t < T; t++) {
        if (tg[t] == DT_IGNORE_INDEX) continue;
        double lp = -(double)ce[t], lr = g->mode == DT_GRPO_RECORD_OLD ? 0 : lp - g->old[at + t]; /* the first pass: r = 1 exactly */
        if (g->mode == DT_GRPO_RECORD_REF) g->ref[at + t] = (float)lp;
        if (g->mode == DT_GRPO_RECORD_OLD) g->old[at + t] = (float)lp;
        seq += lr, vsum += fmin(fmax(lr, -20.0), 20.0);
    }
    if (g->mode == DT_GRPO_RECORD_REF) return 0;
    seq /= n > 1 ? n : 1;
    /* DeepSeek-V3.2's off-policy mask: a completion of negative advantage that pi has left (its mean log pi_old - log pi
     * above the threshold) keeps only its KL term */
    bool dropped = g->c.off_policy > 0 && A < 0 && -seq > g->c.off_policy, clipped = false;
    double phi = g->c.loss == DT_GRPO_LOSS_VESPO ? vespo_weight(g, vsum, A) : 0;
    for (int t = 0; t < T; t++) {
        if (tg[t] == DT_IGNORE_INDEX) continue;
        double lp = -(double)ce[t], lr = g->c.sequence ? seq : g->mode == DT_GRPO_RECORD_OLD ? 0 : lp - g->old[at + t], dr, dlp;
        double pt = policy_term(g, lr, lp, A, phi, &dr, &dlp, &clipped);
        if (dropped || !in_top(ent[t], thr)) pt = dr = dlp = 0; /* off policy, or below the entropy quantile: its KL term alone */
        loss += w * (pt + kl_term(g, lp, g->ref[at + t], lr, &dr, &dlp));
        if (!g->c.sequence) dlp += dr, g->stats[DT_GRPO_CLIPPED] += clipped, g->stats[DT_GRPO_CLIP_UNITS] += 1;
        else through += dr;
        dce[t] = (float)(-dlp * w);
        g->stats[DT_GRPO_TOKENS] += 1, g->stats[DT_GRPO_ENTROPY] += ent[t];
    }
    if (g->c.sequence && n > 0) { /* each token moves the completion's ratio by 1 / n of its log */
        for (int t = 0; t < T; t++)
            if (tg[t] != DT_IGNORE_INDEX) dce[t] -= (float)(through / n * w);
        g->stats[DT_GRPO_CLIPPED] += clipped, g->stats[DT_GRPO_CLIP_UNITS] += 1;
    }
    return loss;
}

void dt_grpo_set_comm(dt_grpo *g, dt_comm *c) { g->comm = c; }

double dt_grpo_entropy_coef(const dt_grpo *g) { return g->coef; }

void dt_grpo_adapt(dt_grpo *g, double entropy_sum, double tokens) {
    if (!g->c.adaptive) return;
    double h = entropy_sum / (tokens > 1 ? tokens : 1);
    g->coef = h <= g->c.ent_target ? fmin(g->coef + g->c.ent_delta, g->c.ent_max) : fmax(g->coef - g->c.ent_delta, g->c.ent_min);
    g->last = h;
}

dt_status dt_grpo_attach(dt_grpo *g, dt_program *p, bool reference) {
    /* the policy's entropies: the metrics', the mask's, the bonus's (the reference's forwards record log-probabilities alone) */
    dt_status st = dt_program_set_token_loss(p, dt_grpo_token_loss, g, !reference);
    return st ? st : dt_program_set_logit_temperature(p, g->c.temperature > 0 ? g->c.temperature : 1.0f); /* (greedy: at 1) */
}

/* The entropy bonus: minus its coefficient times the micro-batch's mean entropy over the tokens the policy term reads
 * (its scored tokens at or above the quantile's threshold thr), its gradient by each entropy into r->dentropy (TRL's:
 * the mean per device, not gathered; the engine averages the passes as TRL's accumulation divides them). Adaptive: the
 * coefficient applies only while the last step's entropy was at most the target, and the tokens are counted for the
 * next move. */
static double entropy_bonus(dt_grpo *g, const dt_token_rows *r, double thr) {
    size_t BT = (size_t)r->B * (size_t)r->T;
    double sum = 0, n = 0, coef = g->c.adaptive && !(g->last <= g->c.ent_target) ? 0 : g->coef;
    for (size_t k = 0; k < BT; k++)
        if (r->targets[k] != DT_IGNORE_INDEX && in_top(r->entropy[k], thr)) sum += r->entropy[k], n += 1;
    g->stats[DT_GRPO_BONUS_ENTROPY] += sum, g->stats[DT_GRPO_BONUS_TOKENS] += n;
    double w = -coef / (n > 1 ? n : 1);
    for (size_t k = 0; w != 0 && k < BT; k++)
        if (r->targets[k] != DT_IGNORE_INDEX && in_top(r->entropy[k], thr)) r->dentropy[k] = (float)w;
    return w * sum;
}

/* The (1 - top_entropy) quantile of the scored tokens' entropies of a micro-batch (every rank's of g's comm), by
 * torch.quantile's linear interpolation; +inf where there are none (no token's policy term counts); NaN: failed. */
static double entropy_threshold(dt_grpo *g, const dt_token_rows *r) {
    size_t n = 0, total = 0, BT = (size_t)r->B * (size_t)r->T;
    double *mine = malloc(sizeof(double) * (BT + 1)), *all = NULL;
    for (size_t k = 0; mine && k < BT; k++)
        if (r->targets[k] != DT_IGNORE_INDEX) mine[n++] = r->entropy[k];
    dt_status st = mine ? dt_comm_allgatherv_alloc(g->comm, mine, n, DT_F64, (void **)&all, &total) : DT_ERR_NOMEM;
    free(mine);
    double thr = st ? NAN : total ? dt_quantile(all, total, 1 - g->c.top_entropy) : INFINITY;
    free(all);
    return thr;
}

float dt_grpo_token_loss(void *ctx, const dt_token_rows *r, float *dce) {
    dt_grpo *g = ctx;
    int B = r->B, T = r->T;
    const float *ce = r->ce;
    const int32_t *targets = r->targets;
    int row0 = g->cursor, mb = 0;
    g->cursor += B;
    if (row0 + B > g->rows || T != g->T) return NAN; /* more rows than the rollout has: a caller's mistake, made visible */
    for (size_t k = 0; k < (size_t)B * (size_t)T; k++) mb += targets[k] != DT_IGNORE_INDEX, dce[k] = 0;
    bool train = g->mode != DT_GRPO_RECORD_REF; /* (the reference's pass trains nothing) */
    if (train && !r->entropy) return NAN; /* (dt_grpo_attach asks the policy's for them: a caller's mistake, made visible) */
    double loss = 0, thr = train && g->c.top_entropy < 1 ? entropy_threshold(g, r) : -INFINITY;
    if (isnan(thr)) return NAN; /* the gather failed */
    for (int b = 0; b < B; b++) {
        size_t in = (size_t)b * (size_t)T;
        int n = 0;
        for (int t = 0; t < T; t++) n += targets[in + t] != DT_IGNORE_INDEX;
        loss += row_loss(g, row0 + b, T, ce + in, targets + in, train ? r->entropy + in : NULL, thr, dce + in, token_weight(g, n, B, mb), n);
    }
    if (train && (g->c.entropy_coef != 0 || g->c.adaptive)) loss += entropy_bonus(g, r, thr);
    return g->mode == DT_GRPO_RECORD_REF ? 0 : (float)loss;
}
