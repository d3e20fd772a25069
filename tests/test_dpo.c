/* Direct preference optimization against TRL's DPOTrainer (scripts/make_dpo_fixtures.py): the pairs' rows (tokens and
 * completion masks; text pairs, conversational ones rendered by ChatML, pairs whose prompt is implicit) are TRL's; the reference's log-probabilities, recorded by forwards of the reference's weights, are
 * TRL's; the policy's loss over one batch of every pair and every weight's gradient are TRL's; the same pairs in two
 * micro-batches (each the mean over its pairs, grad_scale 1/2) give the same loss and gradients; TRL's other loss kinds,
 * their mixes and f-divergences (losses.safetensors) give its loss and two tensors' gradients; bad pair files are
 * refused naming the file and line. */
#include "dtrain/data.h"
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/program.h"
#include "fixture_checks.h"
#include "dtrain/train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { T = 64, MAXROWS = 8 };

/* Row k (of tl inputs) against TRL's ids.k and mask.k (the mask marks completion tokens: the target of input t is
 * token t + 1). */
static bool rows_match(const dt_sft *d, dt_safetensors *f, size_t rows, int tl) {
    bool ok = dt_sft_rows(d) == rows && dt_sft_pairs(d);
    int32_t *ids = malloc((size_t)(tl + 1) * sizeof *ids), *mask = malloc((size_t)(tl + 1) * sizeof *mask);
    int32_t *in = malloc((size_t)tl * sizeof *in), *tg = malloc((size_t)tl * sizeof *tg);
    ok = ok && ids && mask && in && tg;
    for (size_t k = 0; ok && k < rows; k++) {
        char name[32];
        snprintf(name, sizeof name, "ids.%zu", k);
        size_t n = 0;
        for (n = (size_t)tl + 1; n > 0 && dt_safetensors_read_i32(f, name, n, ids); n--) {} /* the row's length: the size that reads */
        snprintf(name, sizeof name, "mask.%zu", k);
        ok = n > 0 && !dt_safetensors_read_i32(f, name, n, mask);
        dt_sft_row(d, k, in, tg);
        for (int t = 0; ok && t < tl; t++) {
            int32_t want_tg = (size_t)t + 1 < n && mask[t + 1] ? ids[t + 1] : DT_IGNORE_INDEX;
            if (((size_t)t < n && in[t] != ids[t]) || tg[t] != want_tg) ok = false;
            if (!ok) printf("   row %zu position %d: input %d target %d, TRL's %d %d\n", k, t, in[t], tg[t], (size_t)t < n ? ids[t] : -1, want_tg);
        }
    }
    free(ids), free(mask), free(in), free(tg);
    return ok;
}

static dt_status load_pairs(const char *dir, const char *file, dt_sft **out) {
    char path[600];
    dt_bpe *tok = NULL;
    snprintf(path, sizeof path, "%s/dpo/tokenizer.json", dir);
    dt_status st = dt_bpe_load_json(path, &tok);
    int eos = -1;
    dt_chat_kind chat = DT_CHAT_NONE; /* the folder's template: ChatML */
    if (!st) st = dt_tokenizer_config_read(path, tok, &chat, &eos, NULL);
    snprintf(path, sizeof path, "%s/dpo/%s", dir, file);
    if (!st) st = dt_sft_load(path, tok, chat, eos, T, out);
    dt_bpe_destroy(tok);
    return st;
}

/* tools_<name>.jsonl's pairs with tools (rendered by the template of sft/<name>_prompts.json, kind, with its
 * tokenizer; rows of 1024) against TRL's rows of them. */
static void check_tool_rows(const char *dir, const char *name, const char *tokenizer, dt_chat_kind kind) {
    enum { TL = 1024 };
    char file[96], fixture[96], what[160];
    dt_bpe *tok = NULL;
    dt_sft *d = NULL;
    dt_safetensors *f = NULL;
    snprintf(file, sizeof file, "dpo/tools_%s.jsonl", name);
    snprintf(fixture, sizeof fixture, "dpo/tools_%s.safetensors", name);
    dt_status st = fixture_sft_open(dir, tokenizer, kind, TL, file, fixture, &tok, &d, &f);
    snprintf(what, sizeof what, "tools_%s: %zu pairs, their rows (the tools' turns, the calls, a line's kwargs) are TRL's", name,
             d ? dt_sft_rows(d) / 2 : 0);
    if (!st) check(what, dt_sft_rows(d) == 4 && rows_match(d, f, 4, TL), NULL);
    else printf("FAIL tools_%s: %s\n", name, dt_last_error()), failed++;
    dt_safetensors_close(f);
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
}

static dt_status load_weights(dt_program *p, const char *dir, const char *name, dt_safetensors **keep) {
    char path[600];
    snprintf(path, sizeof path, "%s/dpo/%s.safetensors", dir, name);
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = fixture_weights(f, p);
    if (keep && !st) *keep = f;
    else dt_safetensors_close(f);
    return st;
}

/* Forward (and backward) of rows [r0, r0 + n) as one micro-batch, its rows queued first. */
static dt_status pass(dt_program *p, dt_dpo *d, const int32_t *in, const int32_t *tg, int r0, int n, float scale, float *loss) {
    dt_status st = dt_dpo_queue(d, (size_t)r0);
    if (!st) st = dt_program_forward(p, in + (size_t)r0 * T, tg + (size_t)r0 * T, n, T, loss);
    if (!st && scale > 0) st = dt_program_backward(p, scale);
    return st;
}

/* name.jsonl's pairs (pairs: texts, with the reference's log-probabilities and statistics checked too; chat:
 * conversational) against name's fixture, the policy's weights being policy.safetensors'. */
static void check_trl(const char *dir, const char *name) {
    dt_sft *d = NULL;
    dt_safetensors *ref = NULL, *pol = NULL;
    dt_program *p = NULL;
    dt_dpo *dpo = NULL;
    dt_lm_config cfg;
    char path[600], detail[96], what[160], file[64];
    bool texts = !strcmp(name, "pairs");
    snprintf(path, sizeof path, "%s/dpo/ref.safetensors", dir);
    snprintf(file, sizeof file, "%s.jsonl", name);
    dt_status st = load_pairs(dir, file, &d);
    if (!st) st = dt_safetensors_open(path, &ref);
    if (!st) st = fixture_config(ref, path, &cfg);
    if (!st) st = dt_program_create(&cfg, &p);
    size_t rows = d ? dt_sft_rows(d) : 0;
    if (!st) st = dt_dpo_create(&(dt_dpo_config){ .beta = 0.1 }, rows, &dpo);
    if (!st) st = dt_program_set_token_loss(p, dt_dpo_token_loss, dpo, false);
    if (!st) st = load_weights(p, dir, "policy", NULL);
    snprintf(path, sizeof path, "%s/dpo/%s.safetensors", dir, texts ? "policy" : name);
    if (!st) st = dt_safetensors_open(path, &pol);
    if (st) {
        printf("FAIL dpo: %s\n", dt_last_error());
        failed++;
        goto out;
    }
    snprintf(what, sizeof what, "%s: the %zu pairs' rows (tokens, scored completions) are TRL's", name, rows / 2);
    check(what, rows_match(d, pol, rows, T), NULL);
    int32_t in[MAXROWS * T], tg[MAXROWS * T];
    for (size_t k = 0; k < rows; k++) dt_sft_row(d, k, in + k * T, tg + k * T);
    float want[MAXROWS], loss = 0, want_loss = 0, l1, l2;
    int n = (int)rows, one = 1;
    /* the reference's log-probabilities, by a forward of the reference's weights */
    dt_dpo_set_reference(dpo, true);
    if (!(st = load_weights(p, dir, "ref", NULL)) && !(st = pass(p, dpo, in, tg, 0, n, 0, &loss)))
        st = load_weights(p, dir, "policy", NULL);
    dt_dpo_set_reference(dpo, false);
    if (!st && texts) st = dt_safetensors_read(pol, "ref_logps", 1, &n, 0, want);
    double worst = 0;
    for (int k = 0; !st && texts && k < n; k++) worst = fmax(worst, fabs(dt_dpo_reference(dpo, (size_t)k) - want[k]) / fabs(want[k]));
    snprintf(detail, sizeof detail, "worst %.1e (%d rows)", worst, n);
    if (!st && texts) check("pairs: the reference's log-probabilities (a forward of its weights) are TRL's within 1e-6", worst <= 1e-6, detail);
    dt_program_zero_grad(p);
    dt_dpo_restart(dpo);
    float *g = NULL;
    dt_model m;
    dt_program_model(p, &m);
    if (!st && !(st = pass(p, dpo, in, tg, 0, n, 1.0f, &loss)) && !(st = dt_safetensors_read(pol, "loss", 1, &one, 0, &want_loss))) {
        snprintf(detail, sizeof detail, "%.7f vs %.7f (%.1e)", loss, want_loss, fabs(loss - want_loss) / want_loss);
        snprintf(what, sizeof what, "%s: the policy's loss over %d pairs is TRL's within 1e-6 (beta 0.1)", name, n / 2);
        check(what, fabs(loss - want_loss) / want_loss <= 1e-6, detail);
        double gw = 0;
        st = grads_err(pol, &m, cfg.vocab_size, &gw);
        snprintf(detail, sizeof detail, "worst %.1e", gw);
        snprintf(what, sizeof what, "%s: every gradient is TRL's within 1e-5", name);
        if (!st) check(what, gw <= 1e-5, detail);
        double s[DT_DPO_NSTATS];
        dt_dpo_stats(dpo, s, true);
        snprintf(detail, sizeof detail, "%g pairs, %g accurate, loss %.7f", s[DT_DPO_PAIRS], s[DT_DPO_ACCURATE], s[DT_DPO_LOSS] / s[DT_DPO_PAIRS]);
        if (texts)
            check("pairs: the statistics count the pairs (one of 4 has chosen above rejected)", s[DT_DPO_PAIRS] == 4 && s[DT_DPO_ACCURATE] == 1 &&
                  fabs(s[DT_DPO_LOSS] / 4 - want_loss) <= 1e-6 * want_loss, detail);
        /* TRL's logps/chosen and logps/rejected: the means of the policy's log-probabilities, its "logps" */
        float lp[MAXROWS];
        double mc = 0, mr = 0;
        if (texts && !(st = dt_safetensors_read(pol, "logps", 1, &n, 0, lp))) {
            for (int k = 0; k < n; k++) *(k % 2 ? &mr : &mc) += lp[k] / (n / 2);
            double ec = fabs(s[DT_DPO_LOGPS_CHOSEN] / 4 - mc) / fabs(mc), er = fabs(s[DT_DPO_LOGPS_REJECTED] / 4 - mr) / fabs(mr);
            snprintf(detail, sizeof detail, "%.6f / %.6f against %.6f / %.6f (%.1e, %.1e)", s[DT_DPO_LOGPS_CHOSEN] / 4,
                     s[DT_DPO_LOGPS_REJECTED] / 4, mc, mr, ec, er);
            check("pairs: the statistics' mean chosen and rejected log-probabilities are TRL's logps/chosen, logps/rejected within 1e-6",
                  ec <= 1e-6 && er <= 1e-6, detail);
        }
    }
    /* two micro-batches of two pairs each, grad_scale 1/2 each: the same loss and gradients */
    if (!st && texts && (g = malloc(m.nparams * sizeof(float)))) {
        memcpy(g, m.grads(m.self), m.nparams * sizeof(float));
        dt_program_zero_grad(p);
        dt_dpo_restart(dpo);
        if (!(st = pass(p, dpo, in, tg, 0, n / 2, 0.5f, &l1)) && !(st = pass(p, dpo, in, tg, n / 2, n / 2, 0.5f, &l2))) {
            snprintf(detail, sizeof detail, "loss %.1e, gradients %.1e", fabs((l1 + l2) / 2 - loss) / loss, rel_err(m.grads(m.self), g, m.nparams));
            check("two micro-batches of 2 pairs give the batch's loss and gradients", fabs((l1 + l2) / 2 - loss) <= 1e-6 * loss &&
                  rel_err(m.grads(m.self), g, m.nparams) <= 1e-6, detail);
        }
    }
    /* the reference recorded: at the reference's own weights every pair's log-ratio is 0, the loss log 2 */
    if (!st) st = load_weights(p, dir, "ref", NULL);
    dt_dpo_restart(dpo);
    if (!st && texts && !(st = pass(p, dpo, in, tg, 0, n, 0, &loss))) {
        snprintf(detail, sizeof detail, "%.7f vs log 2 %.7f", loss, log(2.0));
        check("the reference's log-probabilities are recorded (its own loss is log 2)", fabs(loss - log(2.0)) <= 1e-6, detail);
    }
    if (st) {
        printf("FAIL dpo: %s\n", dt_last_error());
        failed++;
    }
    free(g);
out:
    dt_dpo_destroy(dpo);
    dt_program_destroy(p);
    dt_safetensors_close(ref);
    dt_safetensors_close(pol);
    dt_sft_destroy(d);
}

/* A case of losses.safetensors' metadata as DPOConfig's settings into c (beta 0.1, as the fixtures'). */
static dt_status case_config(const cJSON *o, dt_dpo_config *c) {
    *c = (dt_dpo_config){ .beta = 0.1 };
    const cJSON *kinds = cJSON_GetObjectItemCaseSensitive(o, "loss_type"), *w = cJSON_GetObjectItemCaseSensitive(o, "loss_weights"), *x;
    const cJSON *div = cJSON_GetObjectItemCaseSensitive(o, "f_divergence_type");
    char list[200] = "";
    cJSON_ArrayForEach(x, kinds) snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", *list ? "," : "", x->valuestring);
    dt_status st = dt_dpo_losses_parse(list, c);
    cJSON_ArrayForEach(x, w) c->weight[c->nweights++] = x->valuedouble;
    if (!st && cJSON_IsString(div)) st = dt_dpo_divergence_parse(div->valuestring, c);
    double e = fixture_number(o, "label_smoothing"), tau = fixture_number(o, "discopop_tau"), a = fixture_number(o, "f_alpha_divergence_coef");
    if (!isnan(e)) c->label_smoothing = e;
    if (!isnan(tau)) c->discopop_tau = tau;
    if (!isnan(a)) c->f_alpha = a;
    double ld = fixture_number(o, "ld_alpha");
    if (!isnan(ld)) c->ld = true, c->ld_alpha = ld;
    c->wpo = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(o, "use_weighting"));
    return st;
}

/* TRL's other loss kinds (losses.safetensors: each case's loss and two gradients) on the text pairs, from the policy and
 * reference of policy.safetensors, one batch of every pair. */
static void check_losses(const char *dir) {
    enum { PAIRS = 4 };
    dt_sft *d = NULL;
    dt_safetensors *ref = NULL, *f = NULL;
    dt_program *p = NULL;
    dt_lm_config cfg;
    cJSON *cases = NULL, *names = cJSON_CreateStringArray((const char *const[]){ "model.norm.weight", "model.layers.1.mlp.down_proj.weight" }, 2);
    char path[600], lpath[600];
    snprintf(path, sizeof path, "%s/dpo/ref.safetensors", dir);
    snprintf(lpath, sizeof lpath, "%s/dpo/losses.safetensors", dir);
    dt_status st = load_pairs(dir, "pairs.jsonl", &d);
    if (!st) st = dt_safetensors_open(path, &ref);
    if (!st) st = fixture_config(ref, path, &cfg);
    if (!st) st = dt_program_create(&cfg, &p);
    if (!st) st = dt_safetensors_open(lpath, &f);
    if (!st) st = fixture_settings(f, lpath, "cases", &cases);
    int32_t in[2 * PAIRS * T], tg[2 * PAIRS * T];
    for (size_t k = 0; !st && k < 2 * PAIRS; k++) dt_sft_row(d, k, in + k * T, tg + k * T);
    double worst_loss = 0, worst_grad = 0;
    char worst_l[224] = "", worst_g[224] = "";
    int k = 0;
    const cJSON *c;
    dt_model m;
    if (!st) dt_program_model(p, &m);
    cJSON_ArrayForEach(c, cases) {
        dt_dpo_config dc;
        dt_dpo *dpo = NULL;
        float loss = 0, want = 0;
        char key[64], desc[160];
        int n1 = 1;
        if (!st) st = case_config(c, &dc);
        if (!st) st = dt_dpo_create(&dc, 2 * PAIRS, &dpo);
        if (!st) st = dt_program_set_token_loss(p, dt_dpo_token_loss, dpo, dc.wpo);
        dt_dpo_set_reference(dpo, true);
        if (!st && !(st = load_weights(p, dir, "ref", NULL)) && !(st = pass(p, dpo, in, tg, 0, 2 * PAIRS, 0, &loss)))
            st = load_weights(p, dir, "policy", NULL);
        dt_dpo_set_reference(dpo, false);
        dt_dpo_restart(dpo);
        dt_program_zero_grad(p);
        snprintf(key, sizeof key, "%d.loss", k);
        if (!st && !(st = pass(p, dpo, in, tg, 0, 2 * PAIRS, 1.0f, &loss)) && !(st = dt_safetensors_read(f, key, 1, &n1, 0, &want))) {
            double el = fabs(loss - want) / fabs(want), eg;
            /* forward KL's exp(-c), the alpha divergence's exp((alpha - 1) c) and discopop's exp(-beta delta) amplify the log-probabilities' f32 rounding (TRL's sums
             * and dtrain's part by ~1e-6; a log-ratio here reaches -3.6: 37x): a tenfold tolerance for those */
            bool amplified = dc.divergence == DT_DPO_FORWARD_KL || dc.divergence == DT_DPO_ALPHA_DIVERGENCE;
            for (int i = 0; i < dc.nloss; i++) amplified |= dc.loss[i] == DT_DPO_DISCOPOP;
            double tl = amplified ? 2e-5 : 2e-6, tg = amplified ? 1e-4 : 1e-5; /* (squares: ipo, sppo_hard double it) */
            snprintf(key, sizeof key, "%d.grad.", k);
            st = fixture_named_grads_err(f, &m, key, names, &eg);
            dt_dpo_config_resolve(&dc);
            dt_dpo_config_describe(&dc, desc, sizeof desc);
            if (!st && el / tl > worst_loss) snprintf(worst_l, sizeof worst_l, "%s %.1e", desc, el);
            if (!st && eg / tg > worst_grad) snprintf(worst_g, sizeof worst_g, "%s %.1e", desc, eg);
            worst_loss = fmax(worst_loss, el / tl), worst_grad = fmax(worst_grad, eg / tg);
            if (!st && (el > tl || eg > tg)) printf("   %s: loss %.7f against TRL's %.7f (%.1e), gradients %.1e\n", desc, loss, want, el, eg);
        }
        dt_dpo_destroy(dpo);
        k++;
    }
    char what[160], detail[560];
    snprintf(what, sizeof what, "%d loss kinds and mixes more (loss_type, weights, smoothing, f-divergences, ld_alpha, WPO): TRL's loss, gradients", k);
    snprintf(detail, sizeof detail, "the worst of their tolerance: loss %.2f (%s), gradients %.2f (%s)", worst_loss, worst_l, worst_grad, worst_g);
    if (!st) check(what, k >= 25 && worst_loss <= 1 && worst_grad <= 1, detail);
    else printf("FAIL dpo losses: %s\n", dt_last_error()), failed++;
    cJSON_Delete(cases), cJSON_Delete(names);
    dt_program_destroy(p);
    dt_safetensors_close(ref);
    dt_safetensors_close(f);
    dt_sft_destroy(d);
}

/* A file that must be refused with a message holding needle and the file:line. */
static void refused(const char *dir, const char *what, const char *text, int line, const char *needle) {
    char path[] = "/tmp/dtrain_dpo_XXXXXX";
    int fd = mkstemp(path);
    FILE *fp = fd >= 0 ? fdopen(fd, "w") : NULL;
    if (fp) fprintf(fp, "%s", text), fclose(fp);
    dt_bpe *tok = NULL;
    dt_sft *d = NULL;
    char tp[600], loc[640];
    snprintf(tp, sizeof tp, "%s/dpo/tokenizer.json", dir);
    dt_status st = dt_bpe_load_json(tp, &tok);
    if (!st) st = dt_sft_load(path, tok, DT_CHAT_NONE, -1, T, &d);
    snprintf(loc, sizeof loc, "%s:%d", path, line);
    check(what, st && strstr(dt_last_error(), needle) && strstr(dt_last_error(), loc), st ? dt_last_error() : "accepted");
    dt_sft_destroy(d);
    dt_bpe_destroy(tok);
    unlink(path);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    /* a cache of this run's own: rows kept by an earlier build would hide what this one's rendering makes */
    char cache[] = "/tmp/dtrain_dpo_run_XXXXXX", rm[64];
    if (!mkdtemp(cache) || setenv("XDG_CACHE_HOME", cache, 1)) return printf("test_dpo: no temporary cache folder\n"), 1;
    check_trl(dir, "pairs");
    check_trl(dir, "chat");
    check_trl(dir, "implicit");
    check_losses(dir);
    check_tool_rows(dir, "qwen2_5", "tokenizer.json", DT_CHAT_QWEN25);
    check_tool_rows(dir, "llama3_1", "llama3_tokenizer.json", DT_CHAT_LLAMA31);
    /* each row's chat_template_kwargs: Qwen 3's thinking off, Llama 3.1's date and its tools in the system turn */
    check_tool_rows(dir, "qwen3_kwargs", "tokenizer.json", DT_CHAT_QWEN3);
    check_tool_rows(dir, "llama3_1_kwargs", "llama3_tokenizer.json", DT_CHAT_LLAMA31);
    refused(dir, "refused: a pair without its rejected completion", "{\"prompt\": \"a\", \"chosen\": \"b\"}\n", 1, "preference pair is");
    refused(dir, "refused: a conversational pair without a chat template", "{\"prompt\": [{\"role\": \"user\", \"content\": \"a\"}], \"chosen\": "
            "[{\"role\": \"assistant\", \"content\": \"b\"}], \"rejected\": [{\"role\": \"assistant\", \"content\": \"c\"}]}\n", 1,
            "needs a tokenizer and a chat template");
    refused(dir, "refused: pairs and examples in one file", "{\"prompt\": \"a\", \"chosen\": \"b\", \"rejected\": \"c\"}\n"
            "{\"prompt\": \"a\", \"completion\": \"b\"}\n", 2, "one kind");
    dt_dpo *d = NULL;
    check("refused: beta below 0", dt_dpo_create(&(dt_dpo_config){ .beta = -1 }, 2, &d) && strstr(dt_last_error(), "--dpo-beta"), dt_last_error());
    snprintf(rm, sizeof rm, "rm -rf %s", cache);
    if (system(rm) != 0) printf("   (could not remove %s)\n", cache);
    printf("%s\n", failed ? "test_dpo: FAILED" : "test_dpo: all passed");
    return failed != 0;
}
