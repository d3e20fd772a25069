/* GRPO against TRL's GRPOTrainer (scripts/make_grpo_fixtures.py): the group advantages, the reference's per-token
 * log-probabilities recorded by forwards of its weights, the loss and every gradient for each loss kind (dapo, grpo,
 * dr_grpo; beta 0.04, pi_old = pi; the KL term times the ratio, TRL's default, and plain) and for a second iteration whose pi_old is another model's (the clipped ratio and
 * TRL's clip ratio), with a tool's results in the completions (TRL's tool_mask), the KL metric; two micro-batches give one batch's loss and gradients; and the reward rules and a
 * reward program, with the program's failures named. */
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/program.h"
#include "dtrain/train.h"
#include "fixture_checks.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { G = 4, R = 8, P = 6, C = 9, MAXC = 12, T = 16 };

static dt_safetensors *pol;
static dt_lm_config cfg;
static int32_t in[R * T], tg[R * T];
static float adv[R];
static int ntokens;

static dt_status load(dt_program *p, const char *dir, const char *name) {
    char path[600];
    snprintf(path, sizeof path, "%s/grpo/%s.safetensors", dir, name);
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_weights(f, p);
    dt_safetensors_close(f);
    return st;
}

/* The rows as dt_grpo_row makes them from TRL's prompts, completions and masks (tools: and its tool_mask, a tool's
 * results unscored); the advantages against TRL's. */
static dt_status rows(bool tools) {
    int32_t prompt[R * P], comp[R * C], mask[R * C], tool[R * C];
    unsigned char model[C];
    float rewards[R], want[R];
    int dims[1] = { R };
    dt_status st = dt_safetensors_read_i32(pol, "prompt", R * P, prompt);
    if (!st) st = dt_safetensors_read_i32(pol, "completion", R * C, comp);
    if (!st) st = dt_safetensors_read_i32(pol, "mask", R * C, mask);
    if (!st) st = dt_safetensors_read_i32(pol, "tool_mask", R * C, tool);
    if (!st) st = dt_safetensors_read(pol, "rewards", 1, dims, 0, rewards);
    if (!st) st = dt_safetensors_read(pol, "advantages", 1, dims, 0, want);
    if (st) return st;
    ntokens = 0;
    for (int r = 0; r < R; r++) {
        int n = 0;
        for (int t = 0; t < C; t++) n += mask[r * C + t], model[t] = !tools || tool[r * C + t];
        for (int t = 0; t < n; t++) ntokens += model[t];
        dt_grpo_row(prompt + r * P, P, comp + r * C, model, n, T, in + r * T, tg + r * T);
    }
    dt_grpo_advantages(rewards, R, G, DT_GRPO_SCALE_GROUP, 0, adv);
    static bool checked; /* (once: later calls rebuild the rows) */
    if (tools || checked) return DT_OK;
    checked = true;
    char detail[64];
    snprintf(detail, sizeof detail, "worst %.1e", rel_err(adv, want, R));
    check("the group advantages (scale_rewards \"group\": reward - mean over std + 1e-4) are TRL's", rel_err(adv, want, R) <= 1e-6, detail);
    return DT_OK;
}

/* The reference's log-probabilities of the completion tokens against TRL's. */
static void check_reference(const dt_grpo *g) {
    float want[R * C];
    int32_t mask[R * C];
    int dims[2] = { R, C };
    if (dt_safetensors_read(pol, "ref_logps", 2, dims, 0, want) || dt_safetensors_read_i32(pol, "mask", R * C, mask)) { check("ref_logps", false, dt_last_error()); return; }
    const float *got = dt_grpo_reference(g);
    double worst = 0;
    for (int r = 0; r < R; r++)
        for (int t = 0; t < C; t++)
            if (mask[r * C + t]) worst = fmax(worst, fabs(got[r * T + P - 1 + t] - want[r * C + t]));
    char detail[64];
    snprintf(detail, sizeof detail, "worst %.1e", worst);
    check("the reference's per-token log-probabilities (a forward of its weights) are TRL's within 1e-5", worst <= 1e-5, detail);
}

/* One pass over rows [r0, r0 + n) of the program: forward, and backward where scale > 0. */
static dt_status pass(dt_program *p, int r0, int n, float scale, float *loss) {
    dt_status st = dt_program_forward(p, in + r0 * T, tg + r0 * T, n, T, loss);
    return !st && scale > 0 ? dt_program_backward(p, scale) : st;
}

/* kind's loss and gradients against TRL's "<prefix>.loss" and "<prefix>.grad.*"; old: pi_old's weights (NULL: pi's). */
static void check_kind(const char *dir, dt_grpo_loss kind, const char *prefix, const char *old, int plain_kl) {
    dt_grpo_config gc;
    dt_grpo_defaults(&gc);
    gc.group = G, gc.loss = kind, gc.completion = MAXC, gc.plain_kl = plain_kl;
    dt_program *p = NULL, *ref = NULL;
    dt_grpo *g = NULL;
    float loss = 0, want = 0, ignored;
    int one = 1;
    char what[160], detail[160], name[64];
    dt_status st = dt_program_create(&cfg, &p);
    if (!st) st = dt_program_create(&cfg, &ref);
    if (!st) st = dt_grpo_create(&gc, R, T, &g);
    if (!st) st = dt_grpo_attach(g, p, false);
    if (!st) st = dt_grpo_attach(g, ref, true);
    if (!st) st = load(ref, dir, "ref");
    if (!st) dt_grpo_begin(g, adv, 1.0 / ntokens), dt_grpo_restart(g, DT_GRPO_RECORD_REF), st = pass(ref, 0, R, 0, &ignored);
    if (!st && !strcmp(prefix, "dapo")) check_reference(g);
    /* pi_old: recorded by a first pass (of another model's weights for the clipped case), then pi trains against it */
    if (!st && old) st = load(p, dir, old);
    if (!st && old) dt_grpo_restart(g, DT_GRPO_RECORD_OLD), st = pass(p, 0, R, 0, &ignored);
    if (!st) st = load(p, dir, "policy");
    double s[DT_GRPO_NSTATS];
    dt_grpo_stats(g, s, true);
    dt_program_zero_grad(p);
    if (!st) dt_grpo_restart(g, old ? DT_GRPO_TRAIN : DT_GRPO_RECORD_OLD), st = pass(p, 0, R, 1.0f, &loss);
    snprintf(name, sizeof name, "%s.loss", prefix);
    if (!st) st = dt_safetensors_read(pol, name, 1, &one, 0, &want);
    if (st) { printf("FAIL grpo %s: %s\n", prefix, dt_last_error()); failed++; goto out; }
    snprintf(detail, sizeof detail, "%.7f vs %.7f (%.1e)", loss, want, fabs(loss - want) / fabs(want));
    snprintf(what, sizeof what, "%s: the loss over %d completions of %d prompts is TRL's within 1e-5", prefix, R, R / G);
    check(what, fabs(loss - want) <= 1e-5 * fabs(want), detail);
    dt_model m;
    dt_program_model(p, &m);
    double worst = 0;
    char pre[32];
    snprintf(pre, sizeof pre, "%.16s.grad.", prefix);
    const char *worst_name = "";
    st = fixture_err(pol, &m, m.grads(m.self), pre, cfg.vocab_size, &worst, &worst_name);
    snprintf(detail, sizeof detail, "worst %.1e (%s)", worst, worst_name);
    snprintf(what, sizeof what, "%s: every gradient is TRL's within 1e-5", prefix);
    check(what, !st && worst <= 1e-5, detail);
    dt_grpo_stats(g, s, true);
    snprintf(name, sizeof name, "%s.%s", prefix, old ? "ratio" : "kl");
    float stat = 0;
    if (!dt_safetensors_read(pol, name, 1, &one, 0, &stat)) {
        double mine = (old ? s[DT_GRPO_CLIPPED] : s[DT_GRPO_KL]) / s[DT_GRPO_TOKENS];
        snprintf(detail, sizeof detail, "%.6f vs %.6f over %.0f tokens", mine, stat, s[DT_GRPO_TOKENS]);
        snprintf(what, sizeof what, "%s: the %s (a mean over the completion tokens) is TRL's", prefix, old ? "clip ratio" : "KL");
        check(what, s[DT_GRPO_TOKENS] == ntokens && fabs(mine - stat) <= 1e-5 * fmax(1, fabs(stat)) && (!old || stat > 0.05), detail);
    }
    /* dapo in two micro-batches of 4 rows, each averaged by the engine (grad_scale 1/2, the token weight twice) */
    if (!strcmp(prefix, "dapo")) {
        float *g1 = malloc(m.nparams * sizeof(float)), l1 = 0, l2 = 0;
        if (!g1) goto out;
        memcpy(g1, m.grads(m.self), m.nparams * sizeof(float));
        dt_program_zero_grad(p);
        dt_grpo_begin(g, adv, 2.0 / ntokens);
        dt_grpo_restart(g, DT_GRPO_RECORD_REF);
        if (!(st = pass(ref, 0, R / 2, 0, &ignored)) && !(st = pass(ref, R / 2, R / 2, 0, &ignored))) {
            dt_grpo_restart(g, DT_GRPO_RECORD_OLD);
            if (!(st = pass(p, 0, R / 2, 0.5f, &l1))) st = pass(p, R / 2, R / 2, 0.5f, &l2);
        }
        double e = rel_err(m.grads(m.self), g1, m.nparams);
        snprintf(detail, sizeof detail, "loss %.1e, gradients %.1e", fabs((l1 + l2) / 2 - loss) / fabs(loss), e);
        check("dapo: two micro-batches of 4 completions give the batch's loss and gradients", !st && fabs((l1 + l2) / 2 - loss) <= 1e-6 * fabs(loss) && e <= 1e-6, detail);
        free(g1);
    }
out:
    dt_grpo_destroy(g);
    dt_program_destroy(p);
    dt_program_destroy(ref);
}

/* A case of losses.safetensors' metadata (GRPOConfig's fields) as dtrain's settings into gc. */
static void case_config(const cJSON *o, dt_grpo_config *gc, bool *tools) {
    const cJSON *loss = cJSON_GetObjectItemCaseSensitive(o, "loss_type"), *level = cJSON_GetObjectItemCaseSensitive(o, "importance_sampling_level");
    const cJSON *bias = cJSON_GetObjectItemCaseSensitive(o, "use_bias_correction_kl");
    double eps = fixture_number(o, "epsilon"), hi = fixture_number(o, "epsilon_high"), delta = fixture_number(o, "delta");
    dt_grpo_defaults(gc);
    gc->group = G, gc->completion = MAXC;
    if (cJSON_IsString(loss)) (void)dt_grpo_loss_parse(loss->valuestring, &gc->loss);
    gc->sequence = cJSON_IsString(level) && !strcmp(level->valuestring, "sequence");
    gc->plain_kl = cJSON_IsFalse(bias);
    if (!isnan(eps)) gc->epsilon = eps;
    if (!isnan(hi)) gc->epsilon_high = hi;
    if (!isnan(delta)) gc->delta = delta;
    double temp = fixture_number(o, "temperature"), q = fixture_number(o, "top_entropy_quantile");
    if (!isnan(temp)) gc->temperature = (float)temp;
    if (!isnan(q)) gc->top_entropy = q;
    double coef = fixture_number(o, "entropy_coef"), opm = fixture_number(o, "off_policy_mask_threshold");
    if (!isnan(coef)) gc->entropy_coef = coef;
    if (!isnan(opm)) gc->off_policy = opm;
    const char *vk[4] = { "vespo_k_pos", "vespo_lambda_pos", "vespo_k_neg", "vespo_lambda_neg" };
    for (int k = 0; k < 4; k++) gc->vespo[k] = isnan(fixture_number(o, vk[k])) ? 0 : fixture_number(o, vk[k]);
    *tools = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "tools"));
}

/* TRL's other loss settings (losses.safetensors: each case's loss, two tensors' gradients and clip ratio), pi_old
 * old.safetensors' and the reference's KL, as check_kind's clipped case; and the advantages by scale_rewards "batch"
 * and "none". */
/* losses.safetensors, its metadata's list key, and a policy and a reference program (the reference's weights loaded). */
static dt_status cases_open(const char *dir, const char *key, dt_safetensors **f, cJSON **cases, dt_program **p, dt_program **ref) {
    char path[600];
    snprintf(path, sizeof path, "%s/grpo/losses.safetensors", dir);
    dt_status st = dt_safetensors_open(path, f);
    if (!st) st = fixture_settings(*f, path, key, cases);
    if (!st) st = dt_program_create(&cfg, p);
    if (!st) st = dt_program_create(&cfg, ref);
    return st ? st : load(*ref, dir, "ref");
}

/* A case's loss made over p and ref, the reference's and pi_old's (old.safetensors') log-probabilities recorded, p
 * left with the policy's weights; the recording passes' statistics cleared. */
static dt_status case_start(const dt_grpo_config *gc, const char *dir, dt_program *p, dt_program *ref, dt_grpo **g) {
    float ignored;
    double s[DT_GRPO_NSTATS];
    dt_status st = dt_grpo_create(gc, R, T, g);
    if (!st) st = dt_grpo_attach(*g, p, false);
    if (!st) st = dt_grpo_attach(*g, ref, true);
    if (!st) dt_grpo_begin(*g, adv, 1.0 / ntokens), dt_grpo_restart(*g, DT_GRPO_RECORD_REF), st = pass(ref, 0, R, 0, &ignored);
    if (!st && !(st = load(p, dir, "old"))) dt_grpo_restart(*g, DT_GRPO_RECORD_OLD), st = pass(p, 0, R, 0, &ignored);
    if (!st) st = load(p, dir, "policy");
    if (*g) dt_grpo_stats(*g, s, true);
    return st;
}

/* Case k (c) of losses.safetensors: its rows made, one training pass over p (pi_old's and the reference's records
 * first), TRL's loss read and the named gradients' error; *g kept for its statistics (the caller destroys it). */
static dt_status case_train(dt_safetensors *f, int k, const cJSON *c, const char *dir, dt_program *p, dt_program *ref, const cJSON *names,
                            dt_grpo **g, float *loss, float *want, double *eg) {
    dt_grpo_config gc;
    bool tools;
    int one = 1;
    char key[48];
    dt_model m;
    case_config(c, &gc, &tools);
    dt_status st = rows(tools);
    if (!st) st = case_start(&gc, dir, p, ref, g);
    dt_program_zero_grad(p);
    if (!st) dt_grpo_restart(*g, DT_GRPO_TRAIN), st = pass(p, 0, R, 1.0f, loss);
    snprintf(key, sizeof key, "%d.loss", k);
    if (!st) st = dt_safetensors_read(f, key, 1, &one, 0, want);
    dt_program_model(p, &m);
    snprintf(key, sizeof key, "%d.grad.", k);
    return st ? st : fixture_named_grads_err(f, &m, key, names, eg);
}

static void check_cases(const char *dir) {
    char what[200], detail[800], worst_l[200] = "", worst_g[200] = "", worst_r[200] = "";
    dt_safetensors *f = NULL;
    cJSON *cases = NULL, *names = cJSON_CreateStringArray((const char *const[]){ "model.norm.weight", "model.layers.1.mlp.down_proj.weight" }, 2);
    dt_program *p = NULL, *ref = NULL;
    dt_status st = cases_open(dir, "cases", &f, &cases, &p, &ref);
    double wl = 0, wg = 0, wr = 0;
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        dt_grpo *g = NULL;
        float loss = 0, want = 0, ratio = 0;
        int one = 1;
        char key[48];
        double s[DT_GRPO_NSTATS] = { 0 }, eg = 0;
        if (!st) st = case_train(f, k, c, dir, p, ref, names, &g, &loss, &want, &eg);
        if (g) dt_grpo_stats(g, s, true);
        snprintf(key, sizeof key, "%d.ratio", k);
        /* (a loss near 0 is a difference of terms near 0.1-1, the advantages being centred: relative to 0.1 at least) */
        double el = fabs(loss - want) / fmax(fabs(want), 0.1), er = 0, mine = s[DT_GRPO_CLIP_UNITS] > 0 ? s[DT_GRPO_CLIPPED] / s[DT_GRPO_CLIP_UNITS] : 0;
        if (!st && !dt_safetensors_read(f, key, 1, &one, 0, &ratio)) er = fabs(mine - ratio);
        char *desc = cJSON_PrintUnformatted(c);
        if (!st && el > wl) wl = el, snprintf(worst_l, sizeof worst_l, "%.120s %.1e", desc, el);
        if (!st && eg > wg) wg = eg, snprintf(worst_g, sizeof worst_g, "%.120s %.1e", desc, eg);
        if (!st && er > wr) wr = er, snprintf(worst_r, sizeof worst_r, "%.120s %.4f vs %.4f", desc, mine, ratio);
        if (!st && (el > 1e-5 || eg > 1e-5 || er > 1e-6)) printf("   %s: loss %.7f against TRL's %.7f (%.1e), gradients %.1e, clip ratio %.4f against %.4f\n", desc, loss, want, el, eg, mine, ratio);
        free(desc);
        dt_grpo_destroy(g);
        k++;
    }
    snprintf(what, sizeof what, "%d more settings (epsilon_high, delta, sequence ratios, bnpo, cispo, sapo, luspo, temperature, entropy quantile and bonus, vespo, off-policy mask): TRL's loss, gradients, clip ratio", k);
    snprintf(detail, sizeof detail, "worst loss %.1e (%s), gradients %.1e (%s), clip ratio %.1e (%s)", wl, worst_l, wg, worst_g, wr, worst_r);
    if (!st) check(what, k >= 19 && wl <= 1e-5 && wg <= 1e-5 && wr <= 1e-6, detail);
    else printf("FAIL grpo cases: %s\n", dt_last_error()), failed++;
    /* scale_rewards "batch" (the whole batch's standard deviation) and "none" */
    float rewards[R], want[R], got[R];
    int dims[1] = { R };
    for (int b = 0; !st && b < 2; b++) {
        double sum = 0, sq = 0;
        st = dt_safetensors_read(pol, "rewards", 1, dims, 0, rewards);
        for (int i = 0; i < R; i++) sum += rewards[i], sq += rewards[i] * (double)rewards[i];
        if (!st) st = dt_safetensors_read(f, b ? "adv_none" : "adv_batch", 1, dims, 0, want);
        dt_grpo_advantages(rewards, R, G, b ? DT_GRPO_SCALE_NONE : DT_GRPO_SCALE_BATCH, dt_grpo_batch_sd(sum, sq, R), got);
        snprintf(detail, sizeof detail, "worst %.1e", rel_err(got, want, R));
        snprintf(what, sizeof what, "the advantages by scale_rewards \"%s\" are TRL's", b ? "none" : "batch");
        if (!st) check(what, rel_err(got, want, R) <= 1e-6, detail);
    }
    /* GDPO's normalize_then_sum: a second function's rewards at weight 0.5, each normalized in its group first */
    float r2[R], sum[R];
    float *each[2] = { rewards, r2 };
    if (!st) st = dt_safetensors_read(pol, "rewards", 1, dims, 0, rewards);
    if (!st) st = dt_safetensors_read(f, "rewards2", 1, dims, 0, r2);
    if (!st) st = dt_safetensors_read(f, "adv_gdpo", 1, dims, 0, want);
    if (!st) {
        double s1 = 0, s2 = 0;
        dt_grpo_decoupled_rewards(each, (const double[]){ 1.0, 0.5 }, 2, R, G, sum);
        for (int i = 0; i < R; i++) s1 += sum[i], s2 += sum[i] * (double)sum[i];
        dt_grpo_batch_advantages(sum, R, s1 / R, dt_grpo_batch_sd(s1, s2, R), got);
        snprintf(detail, sizeof detail, "worst %.1e", rel_err(got, want, R));
        check("the advantages by multi_objective_aggregation \"normalize_then_sum\" (GDPO, 2 functions) are TRL's", rel_err(got, want, R) <= 1e-6, detail);
    }
    if (!st) st = rows(false);
    cJSON_Delete(cases), cJSON_Delete(names);
    dt_program_destroy(p), dt_program_destroy(ref);
    dt_safetensors_close(f);
}

/* In bf16 (the programs' 16-bit logits divided by the temperature and rounded again; the entropy term's gradient made in
 * the head's 16-bit blocks): cases `temperature 0.7` and `entropy_coef 0.1` near TRL's f32 loss (within 1% of the larger
 * of it and 0.6, the policy term's size here: 0.42 and 0.40 of that measured) and gradients (1e-1 at the temperature, which divides the logits after
 * their rounding and rounds them again: 5.8e-2 measured; 5e-2 for the bonus: 2.2e-2 measured, as a case without either;
 * its gradient left out gives 1e-1). */
static void check_bf16(const char *dir) {
    dt_safetensors *f = NULL;
    cJSON *cases = NULL, *names = cJSON_CreateStringArray((const char *const[]){ "model.norm.weight", "model.layers.1.mlp.down_proj.weight" }, 2);
    dt_program *p = NULL, *ref = NULL;
    dt_status st = cases_open(dir, "cases", &f, &cases, &p, &ref);
    if (!st) st = dt_program_set_precision(p, DT_BF16);
    if (!st) st = dt_program_set_precision(ref, DT_BF16);
    double wl = 0, wg = 0;
    const int pick[2] = { 9, 13 };
    const double tol_g[2] = { 1e-1, 5e-2 };
    for (int i = 0; !st && i < 2; i++) {
        dt_grpo *g = NULL;
        float loss = 0, want = 0;
        double eg = 0;
        st = case_train(f, pick[i], cJSON_GetArrayItem(cases, pick[i]), dir, p, ref, names, &g, &loss, &want, &eg);
        wl = fmax(wl, fabs(loss - want) / (1e-2 * fmax(fabs(want), 0.6))), wg = fmax(wg, eg / tol_g[i]);
        dt_grpo_destroy(g);
    }
    char detail[96];
    snprintf(detail, sizeof detail, "the worst of their tolerance: loss %.2f, gradients %.2f", wl, wg);
    if (!st) check("bf16: a temperature and an entropy bonus near TRL's f32 loss and gradients", wl <= 1 && wg <= 1, detail);
    else printf("FAIL grpo bf16: %s\n", dt_last_error()), failed++;
    cJSON_Delete(cases), cJSON_Delete(names);
    dt_program_destroy(p), dt_program_destroy(ref);
    dt_safetensors_close(f);
}

/* The adaptive entropy coefficient (losses.safetensors' "adaptive" settings): three steps of the same rows, each step's
 * loss and the coefficient after it TRL's. */
static void check_adaptive(const char *dir) {
    char what[160], detail[300] = "";
    dt_safetensors *f = NULL;
    cJSON *cases = NULL;
    dt_program *p = NULL, *ref = NULL;
    dt_status st = cases_open(dir, "adaptive", &f, &cases, &p, &ref);
    if (!st) st = rows(false);
    double worst_l = 0, worst_c = 0;
    int k = 0;
    const cJSON *c;
    cJSON_ArrayForEach(c, cases) {
        dt_grpo_config gc;
        bool tools;
        dt_grpo *g = NULL;
        float losses[3], coefs[3];
        int three = 3;
        char key[48];
        case_config(c, &gc, &tools);
        gc.adaptive = 1, gc.ent_target = fixture_number(c, "entropy_target"), gc.ent_delta = fixture_number(c, "entropy_coef_delta");
        if (!isnan(fixture_number(c, "entropy_coef_max"))) gc.ent_max = fixture_number(c, "entropy_coef_max");
        if (!isnan(fixture_number(c, "entropy_coef_min"))) gc.ent_min = fixture_number(c, "entropy_coef_min");
        if (!st) st = case_start(&gc, dir, p, ref, &g);
        snprintf(key, sizeof key, "adaptive%d.loss", k);
        if (!st) st = dt_safetensors_read(f, key, 1, &three, 0, losses);
        snprintf(key, sizeof key, "adaptive%d.coef", k);
        if (!st) st = dt_safetensors_read(f, key, 1, &three, 0, coefs);
        double s[DT_GRPO_NSTATS];
        for (int step = 0; !st && step < 3; step++) {
            float loss = 0;
            dt_grpo_restart(g, DT_GRPO_TRAIN);
            st = pass(p, 0, R, 0, &loss);
            dt_grpo_stats(g, s, true);
            dt_grpo_adapt(g, s[DT_GRPO_BONUS_ENTROPY], s[DT_GRPO_BONUS_TOKENS]);
            double el = fabs(loss - losses[step]) / fmax(fabs(losses[step]), 0.1), ec = fabs(dt_grpo_entropy_coef(g) - coefs[step]);
            if (el > 1e-5 || ec > 1e-6)
                printf("   case %d step %d: loss %.7f against TRL's %.7f, coefficient %.4f against %.4f\n", k, step + 1, loss, losses[step],
                       dt_grpo_entropy_coef(g), coefs[step]);
            worst_l = fmax(worst_l, el), worst_c = fmax(worst_c, ec);
        }
        dt_grpo_destroy(g);
        k++;
    }
    snprintf(what, sizeof what, "--grpo-adaptive-entropy: %d runs of 3 steps, each step's loss and coefficient TRL's", k);
    snprintf(detail, sizeof detail, "worst loss %.1e, coefficient %.1e", worst_l, worst_c);
    if (!st) check(what, k >= 2 && worst_l <= 1e-5 && worst_c <= 1e-6, detail);
    else printf("FAIL grpo adaptive: %s\n", dt_last_error()), failed++;
    cJSON_Delete(cases);
    dt_program_destroy(p), dt_program_destroy(ref);
    dt_safetensors_close(f);
}

/* The rules, a program's answers, the lines it reads, and its failures. */
static void check_rewards(void) {
    const char *prompts[3] = { "Say \"hi\"", "p", "q" }, *texts[3] = { "the LORD and the LORD", "no\nlord here \xff", "LORD" };
    size_t lens[3] = { strlen(texts[0]), strlen(texts[1]), 4 };
    float out[3];
    dt_reward *rw = NULL;
    bool ok = !dt_reward_create("contains:LORD", &rw) && !dt_reward_score(rw, 3, prompts, NULL, texts, lens, NULL, out) && out[0] == 1 && out[1] == 0 && out[2] == 1;
    dt_reward_destroy(rw);
    ok = ok && !dt_reward_create("count:LORD", &rw) && !dt_reward_score(rw, 3, prompts, NULL, texts, lens, NULL, out) && out[0] == 2 && out[1] == 0 && out[2] == 1;
    dt_reward_destroy(rw);
    check("contains:WORD and count:WORD score the completions", ok, NULL);
    char log[64], cmd[200];
    snprintf(log, sizeof log, "/tmp/dtrain_reward_%d.jsonl", (int)getpid());
    snprintf(cmd, sizeof cmd, "cmd:tee %s | awk '{print NR / 10}'", log);
    ok = !dt_reward_create(cmd, &rw) && !dt_reward_score(rw, 3, prompts, NULL, texts, lens, NULL, out);
    dt_reward_destroy(rw);
    char *seen = NULL;
    size_t n = 0;
    const char *want = "{\"prompt\": \"Say \\\"hi\\\"\", \"completion\": \"the LORD and the LORD\"}\n"
                       "{\"prompt\": \"p\", \"completion\": \"no\\u000alord here \xef\xbf\xbd\"}\n"
                       "{\"prompt\": \"q\", \"completion\": \"LORD\"}\n";
    ok = ok && !dt_file_read_text(log, 1 << 20, &seen, &n) && !strcmp(seen, want) && out[0] == 0.1f && out[2] == 0.3f;
    if (!ok) printf("   the program read:\n%s   and answered %g %g %g\n", seen ? seen : "(nothing)", out[0], out[1], out[2]);
    check("cmd: a program reads a JSON line a completion (escaped, made UTF-8) and answers a number a line", ok, NULL);
    free(seen);
    seen = NULL;
    /* a conversational prompt's line: its messages and the answer as messages, as TRL's reward functions get them */
    const char *msgs[3] = { "[{\"role\":\"user\",\"content\":\"Say \\\"hi\\\"\"}]", NULL, "[]" };
    snprintf(cmd, sizeof cmd, "cmd:cat > %s; echo 1; echo 2; echo 3", log);
    ok = !dt_reward_create(cmd, &rw) && !dt_reward_score(rw, 3, prompts, msgs, texts, lens, NULL, out);
    dt_reward_destroy(rw);
    want = "{\"prompt\": [{\"role\":\"user\",\"content\":\"Say \\\"hi\\\"\"}], \"completion\": [{\"role\": \"assistant\", \"content\": "
           "\"the LORD and the LORD\"}]}\n"
           "{\"prompt\": \"p\", \"completion\": \"no\\u000alord here \xef\xbf\xbd\"}\n"
           "{\"prompt\": [], \"completion\": [{\"role\": \"assistant\", \"content\": \"LORD\"}]}\n";
    ok = ok && !dt_file_read_text(log, 1 << 20, &seen, &n) && !strcmp(seen, want) && out[1] == 2;
    if (!ok) printf("   the program read:\n%s", seen ? seen : "(nothing)");
    check("cmd: a conversational prompt's line holds its messages and the completion as an assistant message (TRL's form)", ok, NULL);
    free(seen);
    unlink(log);
    static const char *const bad[][2] = {
        { "cmd:exit 3", "exited with status 3" }, { "cmd:echo 1", "1 answer line for 3" }, { "cmd:sed s/.*/x/", "answer line 1 is \"x\"" },
        { "cmd:yes 1 | head -5", "more than 3 lines" }, { "cmd:kill -9 $$", "killed by signal 9" }, { "words", "--reward words:" },
        { "cmd:", "--reward cmd::" },
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        dt_status st = dt_reward_create(bad[k][0], &rw);
        if (!st) st = dt_reward_score(rw, 3, prompts, NULL, texts, lens, NULL, out);
        dt_reward_destroy(rw);
        rw = NULL;
        snprintf(cmd, sizeof cmd, "--reward %s: refused (%s)", bad[k][0], bad[k][1]);
        check(cmd, st && strstr(dt_last_error(), bad[k][1]), st ? dt_last_error() : "accepted");
    }
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    char path[600];
    dt_kernels_set_threads(1);
    snprintf(path, sizeof path, "%s/grpo/policy.safetensors", dir);
    dt_status st = dt_safetensors_open(path, &pol);
    if (!st) st = fixture_config(pol, path, &cfg);
    if (!st) st = rows(false);
    if (st) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    check_kind(dir, DT_GRPO_LOSS_DAPO, "dapo", NULL, 0);
    check_kind(dir, DT_GRPO_LOSS_GRPO, "grpo", NULL, 0);
    check_kind(dir, DT_GRPO_LOSS_DR_GRPO, "dr_grpo", NULL, 0);
    check_kind(dir, DT_GRPO_LOSS_GRPO, "plain", NULL, 1);
    check_kind(dir, DT_GRPO_LOSS_GRPO, "clip", "old", 0);
    check_cases(dir);
    check_adaptive(dir);
    check_bf16(dir);
    /* a tool's results in the completions (--grpo-tools' rows): out of the loss and of dapo's token count */
    if ((st = rows(true))) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    check_kind(dir, DT_GRPO_LOSS_DAPO, "tools", NULL, 0);
    check_rewards();
    dt_safetensors_close(pol);
    printf(failed ? "%d FAILED\n" : "all passed\n", failed);
    return failed ? 1 : 0;
}
