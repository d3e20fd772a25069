/* DPO's loss kinds as TRL's DPOTrainer computes them (DPOConfig's loss_type, loss_weights, label_smoothing,
 * discopop_tau, f_divergence_type): a pair's loss from its chosen and rejected log-ratios c and r, and its derivatives
 * by them, which dpo.c turns into its scored tokens' weights. The kinds built on the reward difference score each
 * log-ratio by the f-divergence's derivative first (f-DPO: reverse KL's is the log-ratio itself) and read
 * delta = score(c) - score(r); the others read c and r themselves. In double: TRL's f32 agrees to its own rounding. */
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const kinds[DT_DPO_NKINDS] = {
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "apo_zero", "apo_down", "discopop", "sft",
    "sigmoid_norm", "aot", "aot_unpaired",
};
static const char *const divergences[] = { "reverse_kl", "forward_kl", "js_divergence", "alpha_divergence" };

const char *dt_dpo_kind_name(dt_dpo_kind k) { return k >= 0 && k < DT_DPO_NKINDS ? kinds[k] : "?"; }
const char *dt_dpo_divergence_name(dt_dpo_divergence d) { return d >= 0 && d <= DT_DPO_ALPHA_DIVERGENCE ? divergences[d] : "?"; }

dt_status dt_dpo_losses_parse(const char *list, dt_dpo_config *c) {
    c->nloss = 0;
    for (const char *s = list; *s;) {
        size_t n = strcspn(s, ",");
        int k = 0;
        while (k < DT_DPO_NKINDS && !(strlen(kinds[k]) == n && !strncmp(kinds[k], s, n))) k++;
        if (k == DT_DPO_NKINDS)
            return dt_error(DT_ERR_ARG, "--dpo-loss %s: '%.*s' is not a loss: sigmoid, hinge, ipo, exo_pair, nca_pair, robust, bco_pair, "
                            "sppo_hard, apo_zero, apo_down, discopop, sft, sigmoid_norm, aot, aot_unpaired (TRL's loss_type), "
                            "comma-separated to sum them", list, (int)n, s);
        for (int j = 0; j < c->nloss; j++)
            if (c->loss[j] == (dt_dpo_kind)k) return dt_error(DT_ERR_ARG, "--dpo-loss %s: %s twice", list, kinds[k]);
        if (c->nloss == DT_DPO_MAX_LOSSES) return dt_error(DT_ERR_ARG, "--dpo-loss %s: more than %d losses", list, DT_DPO_MAX_LOSSES);
        c->loss[c->nloss++] = (dt_dpo_kind)k;
        s += n;
        if (*s == ',' && *++s == 0) return dt_error(DT_ERR_ARG, "--dpo-loss %s: ends with a comma", list);
    }
    return c->nloss ? DT_OK : dt_error(DT_ERR_ARG, "--dpo-loss: names no loss");
}

dt_status dt_dpo_divergence_parse(const char *name, dt_dpo_config *c) {
    for (int d = 0; d <= DT_DPO_ALPHA_DIVERGENCE; d++)
        if (!strcmp(name, divergences[d])) { c->divergence = (dt_dpo_divergence)d; return DT_OK; }
    return dt_error(DT_ERR_ARG, "--dpo-f-divergence %s: reverse_kl (DPO's), forward_kl, js_divergence or alpha_divergence", name);
}

/* Whether kind k reads the reward difference (and so takes an f-divergence's scores). */
static bool on_difference(dt_dpo_kind k) {
    return k == DT_DPO_SIGMOID || k == DT_DPO_SIGMOID_NORM || k == DT_DPO_HINGE || k == DT_DPO_IPO || k == DT_DPO_EXO_PAIR ||
           k == DT_DPO_ROBUST || k == DT_DPO_DISCOPOP || k == DT_DPO_SFT;
}

dt_status dt_dpo_config_resolve(dt_dpo_config *c) {
    if (c->beta == 0) c->beta = 0.1;
    if (!(c->beta > 0) || !isfinite(c->beta)) return dt_error(DT_ERR_ARG, "--dpo-beta %g: a positive number (TRL's default 0.1)", c->beta);
    if (c->nloss == 0) c->nloss = 1, c->loss[0] = DT_DPO_SIGMOID;
    if (c->nweights && c->nweights != c->nloss)
        return dt_error(DT_ERR_ARG, "--dpo-loss-weights: %d weights for %d losses (one a loss, in --dpo-loss's order)", c->nweights, c->nloss);
    for (int i = 0; !c->nweights && i < c->nloss; i++) c->weight[i] = 1;
    c->nweights = c->nloss;
    if (c->discopop_tau == 0) c->discopop_tau = 0.05;
    if (!(c->discopop_tau > 0)) return dt_error(DT_ERR_ARG, "--dpo-discopop-tau %g: a positive number (TRL's 0.05)", c->discopop_tau);
    if (c->f_alpha == 0) c->f_alpha = 0.5;
    if (c->ld && !(c->ld_alpha >= 0 && c->ld_alpha <= 1))
        return dt_error(DT_ERR_ARG, "--dpo-ld-alpha %g: LD-DPO's alpha lies in [0, 1] (1: plain DPO; 0: the tokens beyond the shorter "
                        "completion left out)", c->ld_alpha);
    double e = c->label_smoothing;
    for (int i = 0; i < c->nloss; i++) {
        dt_dpo_kind k = c->loss[i];
        if (k == DT_DPO_ROBUST && !(e >= 0 && e < 0.5))
            return dt_error(DT_ERR_ARG, "--dpo-label-smoothing %g: robust's flip probability lies in [0, 0.5)", e);
        if (k == DT_DPO_EXO_PAIR && !(e > 0 && e < 1))
            return dt_error(DT_ERR_ARG, "--dpo-label-smoothing %g: exo_pair's epsilon lies in (0, 1) (the EXO paper's 1e-3)", e);
        if (c->wpo && (k == DT_DPO_AOT || k == DT_DPO_AOT_UNPAIRED))
            return dt_error(DT_ERR_ARG, "--dpo-wpo with --dpo-loss %s: its pairs are sorted across the micro-batch, so no loss is a pair's "
                            "to weigh (as TRL refuses)", kinds[k]);
        if (c->divergence != DT_DPO_REVERSE_KL && !on_difference(k))
            return dt_error(DT_ERR_ARG, "--dpo-f-divergence %s: %s has no form under it (sigmoid, sigmoid_norm, hinge, ipo, exo_pair, "
                            "robust, discopop and sft have)", divergences[c->divergence], kinds[k]);
    }
    return DT_OK;
}

void dt_dpo_config_describe(const dt_dpo_config *c, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < c->nloss && n < cap; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? " + " : "", kinds[c->loss[i]]);
        if (n < cap && c->nloss > 1 && c->weight[i] != 1) n += (size_t)snprintf(buf + n, cap - n, " x %g", c->weight[i]);
    }
    if (n < cap && c->divergence != DT_DPO_REVERSE_KL)
        n += (size_t)snprintf(buf + n, cap - n, ", %s", divergences[c->divergence]);
    if (n < cap && c->divergence == DT_DPO_ALPHA_DIVERGENCE) n += (size_t)snprintf(buf + n, cap - n, " (alpha %g)", c->f_alpha);
    for (int i = 0; i < c->nloss && n < cap; i++)
        if (c->loss[i] == DT_DPO_ROBUST || c->loss[i] == DT_DPO_EXO_PAIR) {
            n += (size_t)snprintf(buf + n, cap - n, ", label smoothing %g", c->label_smoothing);
            break;
        }
    for (int i = 0; i < c->nloss && n < cap; i++)
        if (c->loss[i] == DT_DPO_DISCOPOP) n += (size_t)snprintf(buf + n, cap - n, ", tau %g", c->discopop_tau);
    if (n < cap && c->ld) n += (size_t)snprintf(buf + n, cap - n, ", ld_alpha %g", c->ld_alpha);
    if (n < cap && c->wpo) n += (size_t)snprintf(buf + n, cap - n, ", WPO's weights");
}

double dt_dpo_sft_weight(const dt_dpo_config *c) {
    for (int i = 0; i < c->nloss; i++)
        if (c->loss[i] == DT_DPO_SFT) return c->weight[i];
    return 0;
}

static double sig(double x) { return x >= 0 ? 1 / (1 + exp(-x)) : exp(x) / (1 + exp(x)); }
/* -log sigmoid(x), without overflow either way. */
static double nls(double x) { return x > 0 ? log1p(exp(-x)) : -x + log1p(exp(x)); }

/* A log-ratio u scored by the f-divergence's derivative f'(e^u), and the score's derivative by u. */
static double score(const dt_dpo_config *c, double u, double *du) {
    switch (c->divergence) {
    case DT_DPO_FORWARD_KL: *du = exp(-u); return 1 - exp(-u);
    case DT_DPO_JS_DIVERGENCE: *du = sig(-u); return log(2.0) - nls(u);
    case DT_DPO_ALPHA_DIVERGENCE: {
        double a1 = c->f_alpha - 1;
        if (fabs(a1) < 1e-6) break; /* (the limit: reverse KL) */
        double t = a1 * u;
        if (t > 80) { *du = 0; return (exp(80.0) - 1) / a1; } /* TRL's clamp, which keeps exp in f32 */
        *du = exp(t);
        return (exp(t) - 1) / a1;
    }
    default: break;
    }
    *du = 1;
    return u;
}

/* Kind k on the reward difference: its loss from the scores sc, sr, its derivatives by them (*gc, *gr). */
static double on_scores(const dt_dpo_config *c, dt_dpo_kind k, double sc, double sr, int nc, int nr, double *gc, double *gr) {
    double b = c->beta, e = c->label_smoothing, x = b * (sc - sr), g, L;
    double lc = nc > 1 ? nc : 1, lr = nr > 1 ? nr : 1; /* (TRL's lengths clamped at 1) */
    switch (k) {
    case DT_DPO_HINGE: L = fmax(0, 1 - x), g = 1 - x > 0 ? -b : 0; break;
    case DT_DPO_IPO: { /* TRL's: each score over its completion's tokens */
        double d = sc / lc - sr / lr - 1 / (2 * b);
        *gc = 2 * d / lc, *gr = -2 * d / lr;
        return d * d;
    }
    case DT_DPO_SIGMOID_NORM: {
        double y = b * (sc / lc - sr / lr);
        *gc = -b * sig(-y) / lc, *gr = b * sig(-y) / lr;
        return nls(y);
    }
    case DT_DPO_EXO_PAIR: {
        double qw = sig(x), ql = sig(-x);
        L = qw * (-nls(x) - log1p(-e)) + ql * (-nls(-x) - log(e));
        g = b * qw * ql * (x - log((1 - e) / e));
        break;
    }
    case DT_DPO_ROBUST:
        L = ((1 - e) * nls(x) - e * nls(-x)) / (1 - 2 * e);
        g = b * (-(1 - e) * sig(-x) - e * sig(x)) / (1 - 2 * e);
        break;
    case DT_DPO_DISCOPOP: {
        double t = c->discopop_tau, m = sig(x / t), dm = m * (1 - m) / t, ex = exp(-x);
        L = nls(x) * (1 - m) + ex * m;
        g = b * (-sig(-x) * (1 - m) - nls(x) * dm - ex * m + ex * dm);
        break;
    }
    default: L = nls(x), g = -b * sig(-x); break; /* sigmoid */
    }
    *gc = g, *gr = -g;
    return L;
}

/* Kind k on the log-ratios themselves. */
static double on_ratios(const dt_dpo_config *c, dt_dpo_kind k, double cr, double rr, double *gc, double *gr) {
    double b = c->beta, xc = b * cr, xr = b * rr;
    switch (k) {
    case DT_DPO_NCA_PAIR:
        *gc = b * (-sig(-xc) + 0.5 * sig(xc)), *gr = 0.5 * b * sig(xr);
        return nls(xc) + 0.5 * nls(-xc) + 0.5 * nls(-xr);
    case DT_DPO_BCO_PAIR: *gc = -b * sig(-xc), *gr = b * sig(xr); return nls(xc) + nls(-xr);
    case DT_DPO_SPPO_HARD: {
        double w = cr - 0.5 / b, l = rr + 0.5 / b;
        *gc = 2 * w, *gr = 2 * l;
        return w * w + l * l;
    }
    case DT_DPO_APO_ZERO: *gc = -b * sig(xc) * sig(-xc), *gr = b * sig(xr) * sig(-xr); return 1 - sig(xc) + sig(xr);
    case DT_DPO_APO_DOWN: {
        double y = b * (cr - rr), sy = sig(y) * sig(-y);
        *gc = b * sig(xc) * sig(-xc) - b * sy, *gr = b * sy;
        return sig(xc) + 1 - sig(y);
    }
    default: *gc = *gr = 0; return 0;
    }
}

double dt_dpo_pair_loss(const dt_dpo_config *c, double chosen, double rejected, int nc, int nr, double *dc, double *dr) {
    double dsc, dsr, sc = score(c, chosen, &dsc), sr = score(c, rejected, &dsr), L = 0;
    *dc = *dr = 0;
    for (int i = 0; i < c->nloss; i++) {
        dt_dpo_kind k = c->loss[i];
        double gc, gr, w = c->weight[i];
        if (k == DT_DPO_SFT || k == DT_DPO_AOT || k == DT_DPO_AOT_UNPAIRED) continue; /* (a micro-batch's: dpo.c, below) */
        if (on_difference(k)) L += w * on_scores(c, k, sc, sr, nc, nr, &gc, &gr), gc *= dsc, gr *= dsr;
        else L += w * on_ratios(c, k, chosen, rejected, &gc, &gr);
        *dc += w * gc, *dr += w * gr;
    }
    return L;
}

/* Indices 0..n-1 in the ascending order of v (ties by index: a stable sort, as torch's on equal values need not be). */
static void order(const double *v, int n, int *idx) {
    for (int i = 0; i < n; i++) idx[i] = i;
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[idx[j - 1]] > v[idx[j]]; j--) {
            int t = idx[j];
            idx[j] = idx[j - 1], idx[j - 1] = t;
        }
}

/* aot's (paired: the policy's chosen-less-rejected log-ratios sorted against the reference's) or aot_unpaired's (the
 * chosen and the rejected log-ratios each sorted): the j-th smallest of one against the j-th of the other, smoothed
 * as robust's flips; its derivatives to the pairs the sorts put there. */
static double aot(const dt_dpo_config *c, bool paired, int n, const double *cr, const double *rr, const double *refd, double w, double *gc,
                  double *gr) {
    double *a = malloc(4 * sizeof(double) * (size_t)n), *b = a ? a + n : NULL, L = 0, e = c->label_smoothing, beta = c->beta;
    int *ia = malloc(2 * sizeof(int) * (size_t)n), *ib = ia ? ia + n : NULL;
    if (!a || !ia) { free(a), free(ia); return NAN; }
    for (int i = 0; i < n; i++) a[i] = paired ? cr[i] - rr[i] + refd[i] : cr[i], b[i] = paired ? refd[i] : rr[i];
    order(a, n, ia), order(b, n, ib);
    for (int j = 0; j < n; j++) {
        double x = beta * (a[ia[j]] - b[ib[j]]), g = w * beta * (-(1 - e) * sig(-x) + e * sig(x));
        L += w * ((1 - e) * nls(x) + e * nls(-x));
        gc[ia[j]] += g; /* (paired: a is chosen less rejected, the reference's sort a constant) */
        if (paired) gr[ia[j]] -= g;
        else gr[ib[j]] -= g;
    }
    free(a), free(ia);
    return L;
}

double dt_dpo_batch_loss(const dt_dpo_config *c, int n, const double *cr, const double *rr, const double *refd, double *gc, double *gr) {
    double L = 0;
    for (int i = 0; i < c->nloss; i++)
        if (c->loss[i] == DT_DPO_AOT || c->loss[i] == DT_DPO_AOT_UNPAIRED)
            L += aot(c, c->loss[i] == DT_DPO_AOT, n, cr, rr, refd, c->weight[i], gc, gr);
    return L;
}
