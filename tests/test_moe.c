/* A mixture of experts against its oracles: transformers' MixtralForCausalLM and Qwen2MoeForCausalLM (a shared
 * expert beside the routed ones, weights not renormalised) on tiny random configs (scripts/make_moe_fixtures.py),
 * each read from the Hugging Face folder it saved (one tensor an expert into the stacked gate, up and down). The router's probabilities and its choices (exactly), the last layer's
 * sparse-MoE block output, the logits, the loss with the load-balancing term and that term alone, every gradient
 * and ten AdamW steps; recomputation gives the same bits; bad configs and folders are refused naming what. GELU experts
 * (gpt2_moe's) against a plain computation and central differences, in the kernels and through the program. */
#include "adamw_steps.h"
#include "fixture_checks.h"

#include "dtrain/optim.h"
#include "dtrain/program.h"

#include <string.h>
#include <unistd.h>

enum { B = 2, T = 16, STEPS = 10 };

static const char *model = ""; /* the fixture under test, before each line */

static void expect(const char *what, double err, double tol) {
    char d[48], w[128];
    snprintf(d, sizeof d, "relative error %.2e", err);
    snprintf(w, sizeof w, "%-9s %s", model, what);
    check(w, err <= tol, d);
}

static void verdict(const char *what, bool ok, const char *detail) {
    char w[128];
    snprintf(w, sizeof w, "%-9s %s", model, what);
    check(w, ok, detail);
}

/* Each mixture layer's probabilities against the softmax of the fixture's router logits, and the choices: the same
 * experts in the same order for every token (a dense layer has no router: none given). */
static dt_status check_router(const dt_program *p, dt_safetensors *f) {
    const dt_lm_config *c = dt_program_config(p);
    int E = c->experts, K = c->experts_top_k, n = B * T, dims[2] = { n, E }, kd = n * K;
    float *ref = malloc(sizeof(float) * (size_t)n * E);
    int32_t *top = malloc(sizeof(int32_t) * (size_t)kd);
    dt_status st = ref && top ? DT_OK : dt_error(DT_ERR_NOMEM, "out of memory");
    double worst = 0;
    int same = 0, sparse = 0;
    for (int l = 0; !st && l < c->num_layers; l++) {
        char name[32];
        if (!dt_lm_layer_moe(c, l)) {
            if (dt_program_moe_probs(p, l)) verdict("a dense layer gives no router probabilities", false, NULL);
            continue;
        }
        sparse++;
        snprintf(name, sizeof name, "router_logits.%d", l);
        if ((st = dt_safetensors_read(f, name, 2, dims, 0, ref))) break;
        dt_moe_softmax(ref, NULL, n, E);
        worst = fmax(worst, rel_err(dt_program_moe_probs(p, l), ref, (size_t)n * E));
        snprintf(name, sizeof name, "router_top.%d", l);
        if ((st = dt_safetensors_read_i32(f, name, (size_t)kd, top))) break;
        float w[DT_MOE_MAX_K];
        int32_t mine[DT_MOE_MAX_K];
        for (int i = 0; i < n; i++) {
            dt_moe_topk(w, mine, dt_program_moe_probs(p, l) + (size_t)i * E, 1, E, K, c->norm_topk);
            same += !memcmp(mine, top + (size_t)i * K, sizeof(int32_t) * (size_t)K);
        }
    }
    if (!st) {
        expect("router probabilities (softmax of HF's router logits), every layer", worst, 1e-5);
        char d[64];
        snprintf(d, sizeof d, "%d of %d tokens x %d mixture layers", same, n * sparse, sparse);
        verdict("router choices: HF's experts, in its order", same == n * sparse && sparse > 0, d);
    }
    free(ref), free(top);
    return st;
}

static dt_status check_steps(dt_program *p, const dt_model *m, dt_safetensors *f, const int32_t *in, const int32_t *tg) {
    double e;
    dt_status st = adamw_steps_err(p, m, f, in, tg, B, T, STEPS, &e, NULL);
    if (!st) expect("10 AdamW steps' losses (worst step)", e, 1e-5);
    return st;
}

/* Recomputation (each block's forward again in backward, the routing with it) gives the same gradients, bit for bit. */
static void check_recompute(dt_program *p, const dt_model *m, const int32_t *in, const int32_t *tg) {
    float loss, *a = malloc(m->nparams * sizeof(float));
    bool ok = a != NULL;
    dt_program_zero_grad(p);
    ok = ok && !dt_program_forward(p, in, tg, B, T, &loss) && !dt_program_backward(p, 1.0f);
    if (ok) memcpy(a, m->grads(m->self), m->nparams * sizeof(float));
    dt_program_zero_grad(p);
    ok = ok && !dt_program_set_recompute(p, 1) && !dt_program_forward(p, in, tg, B, T, &loss) && !dt_program_backward(p, 1.0f) &&
         !memcmp(a, m->grads(m->self), m->nparams * sizeof(float));
    dt_program_set_recompute(p, 0);
    verdict("recomputation: the same gradients, bit for bit", ok, NULL);
    free(a);
}

static void check_fixture(const char *dir, const char *name) {
    char folder[512], path[512];
    model = name;
    snprintf(folder, sizeof folder, "%s/moe/%s", dir, name);
    snprintf(path, sizeof path, "%s/moe/%s.safetensors", dir, name);
    dt_program *p = NULL;
    dt_safetensors *f = NULL;
    int32_t in[B * T], tg[B * T];
    float loss = 0, ref_loss, ref_aux, *ref = NULL;
    dt_status st = dt_program_load_hf(folder, &p);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
    const dt_lm_config *c = st ? NULL : dt_program_config(p);
    dt_model m;
    if (!st) {
        int one = 1, V = c->vocab_size, dims[3] = { B, T, V }, od[2] = { B * T, c->channels };
        dt_program_model(p, &m);
        ref = malloc(sizeof(float) * (size_t)B * T * (V > c->channels ? V : c->channels));
        if (!(st = dt_program_forward(p, in, tg, B, T, &loss)) && !(st = dt_safetensors_read(f, "logits", 3, dims, 0, ref))) {
            double e = 0;
            for (int i = 0; i < B * T; i++) e = fmax(e, rel_err(dt_program_logits(p) + (size_t)i * c->padded_vocab_size, ref + (size_t)i * V, (size_t)V));
            expect("logits (worst row)", e, 1e-5);
        }
        if (!st && !(st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref_loss)) && !(st = dt_safetensors_read(f, "aux", 1, &one, 0, &ref_aux))) {
            expect("loss: cross-entropy + 0.02 x the balancing loss", fabs(loss - ref_loss) / ref_loss, 1e-6);
            expect("the balancing loss (load_balancing_loss_func)", fabs(dt_program_moe_balance_loss(p) - ref_aux) / ref_aux, 1e-6);
        }
        if (!st) st = check_router(p, f);
        char last[32];
        snprintf(last, sizeof last, "moe_out.%d", c->num_layers - 1);
        if (!st && !(st = dt_safetensors_read(f, last, 2, od, 0, ref)))
            expect("the last layer's sparse-MoE block output", rel_err(dt_program_moe_output(p), ref, (size_t)B * T * c->channels), 1e-5);
        double worst = 0;
        dt_program_zero_grad(p);
        if (!st) st = dt_program_backward(p, 1.0f);
        if (!st && !(st = grads_err(f, &m, c->vocab_size, &worst))) expect("every gradient (worst tensor)", worst, 1e-5);
    }
    if (!st) check_recompute(p, &m, in, tg);
    if (!st) st = check_steps(p, &m, f, in, tg);
    if (st) verdict("the fixture", false, dt_last_error());
    free(ref);
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* One stage's run of parts of cfg holding units [2, L + 2) (from a mixture, then dense layers between mixtures: its
 * first block lacks the dense MLP's values the later ones share), from the stream x: f32 (recompute: each block's values made again from its
 * input, one block's shared) or bf16 (each block's kept values packed, one block's f32 values shared); its gradients
 * into g. */
static dt_status stage_grads(const dt_lm_config *cfg, dt_dtype prec, int recompute, const float *x, const int32_t *tg, float *g, size_t *n) {
    dt_model_part part = { .ua = 2, .ub = cfg->num_layers + 2, .tp_size = 1 };
    dt_program *p = NULL;
    float loss;
    dt_status st = dt_program_create_part(cfg, &part, &p);
    if (!st) dt_program_init_random(p, 11);
    if (!st) st = dt_program_set_precision(p, prec);
    if (!st) st = dt_program_set_recompute(p, recompute);
    if (!st) st = dt_program_forward_units(p, 2, cfg->num_layers + 2, NULL, x, tg, B, T, &loss);
    if (!st) st = dt_program_backward_units(p, NULL, 1.0f);
    if (!st) *n = dt_program_num_params(p), memcpy(g, dt_program_grads(p), *n * sizeof(float));
    dt_program_destroy(p);
    return st;
}

/* The dense fixture's shape with 6 layers (dense, mixture, ...), layers 1-5 as a pipeline stage: recomputing gives the
 * gradients of keeping, bit for bit, and bf16's packed blocks those within bf16's rounding. */
static void check_stage_from_mixture(const char *dir) {
    char folder[512], path[512];
    model = "stage";
    snprintf(folder, sizeof folder, "%s/moe/qwen2_moe_dense", dir);
    snprintf(path, sizeof path, "%s/moe/qwen2_moe_dense.safetensors", dir);
    dt_program *whole = NULL;
    dt_safetensors *f = NULL;
    int32_t tg[B * T];
    dt_status st = dt_program_load_hf(folder, &whole);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
    dt_lm_config cfg = st ? (dt_lm_config){ 0 } : *dt_program_config(whole);
    cfg.num_layers = 6;
    size_t C = (size_t)cfg.channels, n[3] = { 0 }, most = whole ? 2 * dt_program_num_params(whole) : 1; /* (5 layers and the head: less than twice the 4-layer whole) */
    float *x = malloc(sizeof(float) * B * T * (C ? C : 1)), *g[3];
    for (int i = 0; i < 3; i++) g[i] = malloc(sizeof(float) * most);
    uint64_t r = 5;
    for (size_t i = 0; x && i < (size_t)B * T * C; i++) x[i] = (float)(dt_rng_next(&r) % 2001) / 1000.0f - 1.0f;
    if (!st && !(dt_lm_layer_moe(&cfg, 1) && !dt_lm_layer_moe(&cfg, 2) && !dt_lm_layer_moe(&cfg, 4)))
        st = dt_error(DT_ERR_ARG, "the fixture's layer 1 is not a mixture before dense layers 2 and 4");
    if (!st) st = stage_grads(&cfg, DT_F32, 0, x, tg, g[0], &n[0]);
    if (!st) st = stage_grads(&cfg, DT_F32, 1, x, tg, g[1], &n[1]);
    if (!st) st = stage_grads(&cfg, DT_BF16, 0, x, tg, g[2], &n[2]);
    if (!st) {
        verdict("layers 1-5 (a mixture first, dense layers 2 and 4) recomputing: the gradients of keeping, bit for bit",
                n[0] == n[1] && !memcmp(g[0], g[1], n[0] * sizeof(float)), NULL);
        expect("layers 1-5 in bf16, each block packed: the f32 gradients within bf16's rounding", rel_err(g[2], g[0], n[0]), 5e-2);
    } else {
        verdict("a stage from a mixture", false, dt_last_error());
    }
    for (int i = 0; i < 3; i++) free(g[i]);
    free(x);
    dt_program_destroy(whole);
    dt_safetensors_close(f);
}

/* A fixture's "bias.<l>": each layer's sigmoid-router bias, into p. */
static dt_status read_biases(dt_safetensors *f, dt_program *p) {
    const dt_lm_config *c = dt_program_config(p);
    size_t nb = 0;
    float *bias = dt_program_moe_bias(p, &nb);
    int E = c->experts;
    dt_status st = nb == (size_t)c->num_layers * E ? DT_OK : dt_error(DT_ERR_ARG, "no bias");
    for (int l = 0; !st && l < c->num_layers; l++) {
        char name[32];
        snprintf(name, sizeof name, "bias.%d", l);
        st = dt_safetensors_read(f, name, 1, &E, 0, bias + (size_t)l * E);
    }
    return st;
}

/* A forward of the fixture's inputs: its logits (worst row) and loss against the fixture's. */
static dt_status check_forward(dt_program *p, dt_safetensors *f, const int32_t *in, const int32_t *tg) {
    const dt_lm_config *c = dt_program_config(p);
    int V = c->vocab_size, one = 1, dims[3] = { B, T, V };
    float loss, ref_loss, *ref = malloc(sizeof(float) * (size_t)B * T * V);
    dt_status st = ref ? dt_program_forward(p, in, tg, B, T, &loss) : dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st && !(st = dt_safetensors_read(f, "logits", 3, dims, 0, ref))) {
        double e = 0;
        for (int i = 0; i < B * T; i++) e = fmax(e, rel_err(dt_program_logits(p) + (size_t)i * c->padded_vocab_size, ref + (size_t)i * V, (size_t)V));
        expect("logits (worst row)", e, 1e-5);
    }
    if (!st && !(st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref_loss))) expect("loss", fabs(loss - ref_loss) / ref_loss, 1e-6);
    free(ref);
    return st;
}

/* A fixture of DeepSeek-V3's router (8 experts in 4 groups of which the best 2, renormalised, x 2.5) on the file's
 * config, as family (NULL: the file's) with shared experts of shared x its --ffn: made, its weights and biases read, its
 * forward checked; in, tg its inputs and targets. */
static dt_status sigmoid_fixture(const char *path, const char *family, int shared, dt_safetensors **f, dt_lm_config *cfg, dt_program **p,
                                 int32_t *in, int32_t *tg) {
    dt_status st = dt_safetensors_open(path, f);
    if (!st) st = fixture_config(*f, path, cfg);
    if (!st) {
        if (family) cfg->family = dt_family_find(family), cfg->shared_ffn = shared * cfg->ffn, cfg->aux_coef = 0;
        cfg->router = DT_ROUTER_SIGMOID_BIAS, cfg->expert_groups = 4, cfg->group_top_k = 2, cfg->routed_scale = 2.5f, cfg->norm_topk = 1;
        st = dt_program_create(cfg, p);
    }
    if (!st) st = fixture_weights(*f, *p);
    if (!st) st = read_biases(*f, *p);
    if (!st) st = dt_safetensors_read_i32(*f, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(*f, "targets", B * T, tg);
    return st ? st : check_forward(*p, *f, in, tg);
}

/* Mixtral with DeepSeek-V3's router in each layer (transformers' DeepseekV3TopkRouter: sigmoid scores, the fixture's
 * bias choosing, 8 experts in 4 groups of which the best 2, top 3, renormalised, times 2.5): the choices exactly (as
 * sets: its topk keeps no order) and their weights, logits, loss, gradients, steps; the bias moves as DeepSeek-V3's. */
static void check_sigmoid(const char *dir) {
    char path[512];
    model = "sigmoid";
    snprintf(path, sizeof path, "%s/moe/sigmoid_router.safetensors", dir);
    dt_safetensors *f = NULL;
    dt_program *p = NULL;
    dt_lm_config cfg;
    int32_t in[B * T], tg[B * T];
    dt_status st = sigmoid_fixture(path, NULL, 0, &f, &cfg, &p, in, tg);
    dt_model m;
    size_t nb = 0;
    float *bias = st ? NULL : dt_program_moe_bias(p, &nb);
    int E = cfg.experts, K = cfg.experts_top_k, L = cfg.num_layers, V = cfg.vocab_size;
    if (!st) dt_program_model(p, &m);
    int same = 0;
    double werr = 0;
    for (int l = 0; !st && l < L; l++) {
        int32_t top[B * T * 3], mine[3];
        float rw[B * T * 3], w[3];
        int kd[2] = { B * T, K };
        char name[32];
        snprintf(name, sizeof name, "router_top.%d", l);
        if ((st = dt_safetensors_read_i32(f, name, (size_t)B * T * K, top))) break;
        snprintf(name, sizeof name, "router_weights.%d", l);
        if ((st = dt_safetensors_read(f, name, 2, kd, 0, rw))) break;
        for (int i = 0; i < B * T; i++) {
            dt_moe_topk_biased(w, mine, dt_program_moe_probs(p, l) + (size_t)i * E, bias + (size_t)l * E, 1, E, K, 4, 2, true, 2.5f);
            for (int a = 0; a < K; a++) /* by expert, as the fixture's */
                for (int b = a + 1; b < K; b++)
                    if (mine[b] < mine[a]) { int32_t t = mine[a]; mine[a] = mine[b], mine[b] = t; float u = w[a]; w[a] = w[b], w[b] = u; }
            same += !memcmp(mine, top + (size_t)i * K, sizeof mine);
            werr = fmax(werr, rel_err(w, rw + (size_t)i * K, (size_t)K));
        }
    }
    if (!st) {
        char d[64];
        snprintf(d, sizeof d, "%d of %d tokens x layers", same, B * T * L);
        verdict("choices (groups, bias, top 3): DeepSeek-V3's router's, exactly", same == B * T * L, d);
        expect("their weights (renormalised, x 2.5)", werr, 1e-6);
        double worst = 0;
        dt_program_zero_grad(p);
        if (!(st = dt_program_backward(p, 1.0f)) && !(st = grads_err(f, &m, V, &worst))) expect("every gradient (worst tensor)", worst, 1e-5);
    }
    if (!st) check_recompute(p, &m, in, tg);
    if (!st) st = check_steps(p, &m, f, in, tg);
    /* the step's load moves each bias by the rate: the loaded expert down, the idle up, one at the mean not at all */
    if (!st) {
        double load[64] = { 0 };
        float before[64];
        memcpy(before, bias, sizeof(float) * (size_t)L * E);
        load[0] = 10, load[1] = 2, load[2] = 4, load[3] = 4; /* layer 0: mean 20 / 8 = 2.5 */
        dt_lm_config rc = *dt_program_config(p);
        rc.bias_rate = 0.001f;
        dt_program_destroy(p), p = NULL;
        if (!(st = dt_program_create(&rc, &p))) {
            float *b = dt_program_moe_bias(p, NULL);
            memcpy(b, before, sizeof(float) * (size_t)L * E);
            dt_program_moe_update_bias(p, load);
            bool ok = fabsf(b[0] - (before[0] - 0.001f)) < 1e-7f && fabsf(b[1] - (before[1] + 0.001f)) < 1e-7f &&
                      fabsf(b[4] - (before[4] + 0.001f)) < 1e-7f && b[E] == before[E];
            verdict("the bias after a step: the loaded expert's -0.001, the idle ones' +0.001, another layer's at its mean unmoved", ok, NULL);
        }
    }
    if (st) verdict("the fixture", false, dt_last_error());
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* A capacity's drops as the policy says, computed here apart: expert e takes ceil(F x B*T x k / E) of its choices, by
 * position the first in token order, by weight the heaviest (a tie: the earlier). */
static int reference_drops(int32_t *idx, const float *w, int pairs, int E, int cap, int policy) {
    int dropped = 0;
    for (int e = 0; e < E; e++) {
        int taken = 0;
        for (int q = 0; q < pairs; q++) {
            if (idx[q] != e) continue;
            int ahead = 0; /* the choices of e that come before q in the policy's order */
            for (int o = 0; o < pairs; o++)
                if (idx[o] == e && o != q && (policy == DT_DROP_POSITION ? o < q : w[o] > w[q] || (w[o] == w[q] && o < q))) ahead++;
            if ((policy == DT_DROP_POSITION ? taken : ahead) >= cap) idx[q] = -1, dropped++;
            else taken++;
        }
    }
    return dropped;
}

/* The last layer's down projection's gradient (or tensor `name`'s) against the loss's central difference (its weights
 * change no routing). */
static double fd_tensor(dt_program *p, const int32_t *in, const int32_t *tg, const char *name) {
    dt_model m;
    dt_program_model(p, &m);
    const dt_tensor_info *t = dt_model_find(&m, name);
    float loss, lp, lm, *w = m.params(m.self), eps = 1e-2f;
    double worst = 0;
    dt_program_zero_grad(p);
    if (!t || dt_program_forward(p, in, tg, B, T, &loss) || dt_program_backward(p, 1.0f)) return 1;
    for (size_t j = 0; j < t->count; j += t->count / 7) {
        float g = m.grads(m.self)[t->offset + j], keep = w[t->offset + j];
        w[t->offset + j] = keep + eps;
        dt_program_forward(p, in, tg, B, T, &lp);
        w[t->offset + j] = keep - eps;
        dt_program_forward(p, in, tg, B, T, &lm);
        w[t->offset + j] = keep;
        worst = fmax(worst, fabs((lp - lm) / (2 * eps) - g) / (fabs(g) + 1e-3));
    }
    return worst;
}

static double fd_check(dt_program *p, const int32_t *in, const int32_t *tg) { return fd_tensor(p, in, tg, "h.1.edownw"); }

/* The Mixtral fixture with a capacity of 1.0 (every expert its even share): the drops each policy makes, exactly as
 * computed here; the gradient through what stays. */
static void check_capacity(const char *dir) {
    char folder[512], path[512];
    model = "capacity";
    snprintf(folder, sizeof folder, "%s/moe/mixtral", dir);
    snprintf(path, sizeof path, "%s/moe/mixtral.safetensors", dir);
    for (int policy = 0; policy < 2; policy++) {
        dt_program *p = NULL;
        dt_safetensors *f = NULL;
        int32_t in[B * T], tg[B * T];
        float loss;
        dt_status st = dt_program_load_hf(folder, &p);
        if (!st) st = dt_safetensors_open(path, &f);
        if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
        if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
        dt_lm_config r = st ? (dt_lm_config){ 0 } : *dt_program_config(p);
        r.capacity_factor = 1.0f, r.drop_policy = policy, r.aux_coef = 0;
        if (!st) st = dt_program_set_routing(p, &r);
        if (!st) st = dt_program_forward(p, in, tg, B, T, &loss);
        int E = r.experts, K = r.experts_top_k, n = B * T * K, same = 0, drops = 0, cap = (int)ceil(1.0 * n / E);
        for (int l = 0; !st && l < r.num_layers; l++) {
            int32_t mine[B * T * 4], want[B * T * 4];
            float w[B * T * 4];
            int d = dt_program_moe_choices(p, l, mine);
            dt_moe_topk(w, want, dt_program_moe_probs(p, l), B * T, E, K, true);
            int rd = reference_drops(want, w, n, E, cap, policy);
            same += d == rd && !memcmp(mine, want, sizeof(int32_t) * (size_t)n), drops += d;
        }
        char what[96], detail[64];
        snprintf(what, sizeof what, "capacity 1.0 by %s: the drops the policy makes", policy ? "position" : "weight");
        snprintf(detail, sizeof detail, "%d choices of %d dropped; layers alike: %d of %d", drops, n * r.num_layers, same, r.num_layers);
        if (!st) verdict(what, same == r.num_layers && drops > 0, detail);
        snprintf(what, sizeof what, "capacity by %s: the gradient through what stays (central differences)", policy ? "position" : "weight");
        if (!st) expect(what, fd_check(p, in, tg), 2e-2);
        if (st) verdict("the capacity's fixture", false, dt_last_error());
        dt_program_destroy(p);
        dt_safetensors_close(f);
    }
}

static void refused(const char *what, dt_status st, const char *needle) {
    bool ok = st && strstr(dt_last_error(), needle);
    check(what, ok, ok ? NULL : st ? dt_last_error() : "accepted");
}

/* A copy of the fixture's folder whose config.json says `experts` experts. */
static dt_status folder_with(const char *dir, const char *tmp, int experts) {
    char src[600], dst[600], cmd[4000];
    snprintf(src, sizeof src, "%s/moe/mixtral", dir);
    snprintf(dst, sizeof dst, "%s/m%d", tmp, experts);
    snprintf(cmd, sizeof cmd, "mkdir -p '%s' && cp '%s/model.safetensors' '%s/' && sed 's/\"num_local_experts\": 4/\"num_local_experts\": %d/' "
             "'%s/config.json' > '%s/config.json'", dst, src, dst, experts, src, dst);
    return system(cmd) ? dt_error(DT_ERR_IO, "could not copy the fixture's folder") : DT_OK;
}

static void bad_input(const char *dir) {
    dt_lm_config c = { 0 };
    c.family = dt_family_find("mixtral");
    c.vocab_size = c.padded_vocab_size = 64, c.max_seq_len = 16, c.num_layers = 1, c.num_heads = 2, c.channels = 16, c.ffn = 8;
    c.experts = 4, c.experts_top_k = 5;
    dt_program *p = NULL;
    refused("top-k above the experts' count", dt_program_create(&c, &p), "top-5 routing among 4 experts");
    c.experts_top_k = 2, c.experts = 0;
    refused("a Mixtral without experts", dt_program_create(&c, &p), "0 experts for the mixtral family");
    char tmp[] = "/tmp/dtrain_moe_XXXXXX", rm[64];
    if (!mkdtemp(tmp)) return;
    for (int e = 3; e <= 5; e += 2) {
        char folder[600], what[96];
        snprintf(folder, sizeof folder, "%s/m%d", tmp, e);
        snprintf(what, sizeof what, "a folder whose config says %d experts, its files 4", e);
        dt_status st = folder_with(dir, tmp, e);
        if (!st) st = dt_program_load_hf(folder, &p);
        dt_program_destroy(p), p = NULL;
        char needle[96];
        snprintf(needle, sizeof needle, "block_sparse_moe.gate.weight\" has shape [4, 32], the model needs [%d, 32]", e);
        refused(what, st, needle);
    }
    snprintf(rm, sizeof rm, "rm -rf '%s'", tmp);
    if (system(rm)) printf("could not remove %s\n", tmp);
}

/* DeepSeek-V3's mixture with Llama's attention (scripts/make_deepseek_moe_fixture.py: transformers' DeepseekV3MoE in a
 * Mixtral: its router with groups and bias, 8 experts, 2 ungated shared experts): logits, loss, every gradient, 10 AdamW
 * steps; its names are the family deepseek_moe's. */
static void check_deepseek(const char *dir) {
    char path[512];
    model = "deepseek";
    snprintf(path, sizeof path, "%s/moe/deepseek_moe.safetensors", dir);
    dt_safetensors *f = NULL;
    dt_program *p = NULL;
    dt_lm_config cfg;
    int32_t in[B * T], tg[B * T];
    dt_status st = sigmoid_fixture(path, "deepseek_moe", 2, &f, &cfg, &p, in, tg);
    dt_model m;
    if (!st) dt_program_model(p, &m);
    double worst = 0;
    if (!st) dt_program_zero_grad(p);
    if (!st && !(st = dt_program_backward(p, 1.0f)) && !(st = grads_err(f, &m, cfg.vocab_size, &worst)))
        expect("every gradient, the shared experts' too (worst tensor)", worst, 1e-5);
    if (!st) check_recompute(p, &m, in, tg);
    if (!st) st = check_steps(p, &m, f, in, tg);
    if (st) verdict("the fixture", false, dt_last_error());
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* Every layer's router weight gradient against the file's (hub, a name with the layer's %d), the worst relative error. */
static dt_status router_grads_err(dt_program *p, dt_safetensors *f, const char *hub, double *worst) {
    dt_model m;
    dt_program_model(p, &m);
    float *g = NULL;
    dt_status st = DT_OK;
    for (int l = 0; !st && l < dt_program_config(p)->num_layers; l++) {
        char ours[32], hf[96];
        snprintf(ours, sizeof ours, "h.%d.routerw", l);
        snprintf(hf, sizeof hf, hub, l);
        const dt_tensor_info *t = dt_model_find(&m, ours);
        if (!t) { st = dt_error(DT_ERR_ARG, "no %s", ours); break; }
        int dims[2] = { t->shape[0], t->shape[1] };
        if (!(g = realloc(g, t->count * sizeof(float)))) st = dt_error(DT_ERR_NOMEM, "out of memory");
        if (!st && !(st = dt_safetensors_read(f, hf, 2, dims, 0, g))) *worst = fmax(*worst, rel_err(m.grads(m.self) + t->offset, g, t->count));
    }
    free(g);
    return st;
}

/* The router z-loss (scripts/make_zloss_fixture.py: the Mixtral fixture's loss with 0.1 x transformers' router_z_loss_func
 * over every layer's router logits): its value, the loss with it, and every router's gradient, against transformers'. */
static void check_zloss(const char *dir) {
    char folder[512], path[512], fxp[512];
    model = "z-loss";
    snprintf(folder, sizeof folder, "%s/moe/mixtral", dir);
    snprintf(fxp, sizeof fxp, "%s/moe/mixtral.safetensors", dir);
    snprintf(path, sizeof path, "%s/moe/zloss.safetensors", dir);
    dt_program *p = NULL;
    dt_safetensors *fx = NULL, *f = NULL;
    int32_t in[B * T], tg[B * T];
    float loss = 0, want[2];
    int one = 1;
    dt_status st = dt_program_load_hf(folder, &p);
    if (!st) st = dt_safetensors_open(fxp, &fx);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = dt_safetensors_read_i32(fx, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(fx, "targets", B * T, tg);
    if (!st) st = dt_program_set_z_loss(p, 0.1f);
    if (!st) dt_program_zero_grad(p);
    if (!st) st = dt_program_forward(p, in, tg, B, T, &loss);
    if (!st) st = dt_program_backward(p, 1.0f);
    if (!st && !(st = dt_safetensors_read(f, "z", 1, &one, 0, &want[0])) && !(st = dt_safetensors_read(f, "loss", 1, &one, 0, &want[1]))) {
        expect("router_z_loss_func's value (every layer's rows)", fabs(dt_program_moe_z_loss(p) - want[0]) / want[0], 1e-5);
        expect("the loss with 0.1 x the z-loss", fabs(loss - want[1]) / want[1], 1e-6);
    }
    double worst = 0;
    if (!st) st = router_grads_err(p, f, "grad.model.layers.%d.block_sparse_moe.gate.weight", &worst);
    if (!st) expect("every router's gradient with the z-loss", worst, 1e-5);
    if (st) verdict("the z-loss fixture", false, dt_last_error());
    dt_program_destroy(p);
    dt_safetensors_close(fx);
    dt_safetensors_close(f);
}

/* The sequence-wise and global-batch balancing losses (scripts/make_seq_aux_fixture.py: Megatron's seq_aux_loss and
 * global_aux_loss written out in torch over transformers' router logits, at 0.3 and 0.2, the global one on one
 * micro-batch), each alone, on Mixtral's softmax router (beside its Switch loss at the folder's coefficient) and
 * DeepSeek-V3's sigmoid one: its value, the whole loss and every router's gradient. */
static void balance_case(const char *name, bool global, dt_program *p, dt_safetensors *f, const int32_t *in, const int32_t *tg, const char *hub) {
    char key[64], what[96], grads[128];
    float loss = 0, want[2], coef = global ? 0.2f : 0.3f;
    int one = 1;
    model = name;
    dt_status st = dt_program_set_seq_aux_loss(p, global ? 0 : coef);
    if (!st) st = dt_program_set_global_aux_loss(p, global ? coef : 0);
    if (!st) dt_program_moe_new_step(p), dt_program_zero_grad(p);
    if (!st) st = dt_program_forward(p, in, tg, B, T, &loss);
    if (!st) st = dt_program_backward(p, 1.0f);
    snprintf(key, sizeof key, "seq_%s", name);
    if (!st) st = dt_safetensors_read(f, key, 1, &one, 0, &want[0]);
    snprintf(key, sizeof key, "loss_%s", name);
    if (!st) st = dt_safetensors_read(f, key, 1, &one, 0, &want[1]);
    const char *loss_name = global ? "global-batch" : "sequence-wise";
    if (!st) {
        double v = global ? dt_program_moe_global_loss(p) : dt_program_moe_seq_loss(p);
        snprintf(what, sizeof what, "the %s loss's value (every layer's)", loss_name);
        expect(what, fabs(v - want[0]) / want[0], 1e-5);
        snprintf(what, sizeof what, "the loss with %.1f x the %s loss", (double)coef, loss_name);
        expect(what, fabs(loss - want[1]) / want[1], 1e-6);
    }
    double worst = 0;
    snprintf(grads, sizeof grads, "grad_%s.%s", name, hub);
    if (!st) st = router_grads_err(p, f, grads, &worst);
    snprintf(what, sizeof what, "every router's gradient with the %s loss", loss_name);
    if (!st) expect(what, worst, 1e-5);
    if (st) verdict("the balancing losses' fixture", false, dt_last_error());
}

/* The global-batch loss over a step's micro-batches: the second of two (each one row of the fixture) takes its shares
 * from both micro-batches' choices (Megatron's running average), its probabilities from its own rows; the choices and
 * probabilities counted here from the router's (a softmax router's top-k). */
static void check_global_running(dt_program *p, const int32_t *in, const int32_t *tg) {
    const dt_lm_config *c = dt_program_config(p);
    int L = c->num_layers, E = c->experts, K = c->experts_top_k;
    double count[8][DT_MOE_MAX_EXPERTS] = { { 0 } }, want = 0;
    float loss, w[DT_MOE_MAX_K];
    int32_t idx[DT_MOE_MAX_K];
    model = "global";
    dt_status st = L <= 8 ? dt_program_set_global_aux_loss(p, 0.2f) : dt_error(DT_ERR_ARG, "%d layers", L);
    if (!st) dt_program_moe_new_step(p);
    for (int mb = 0; !st && mb < 2; mb++) {
        st = dt_program_forward(p, in + mb * T, tg + mb * T, 1, T, &loss);
        for (int l = 0; !st && l < L; l++) {
            const float *pr = dt_program_moe_probs(p, l);
            double P[DT_MOE_MAX_EXPERTS] = { 0 };
            for (int i = 0; pr && i < T; i++) {
                dt_moe_topk(w, idx, pr + (size_t)i * E, 1, E, K, false);
                for (int j = 0; j < K; j++) count[l][idx[j]] += 1;
                for (int e = 0; e < E; e++) P[e] += pr[(size_t)i * E + e] / T;
            }
            for (int e = 0; pr && mb == 1 && e < E; e++) want += E * count[l][e] / (2.0 * T * K) * P[e];
        }
    }
    if (!st) expect("global-batch loss: a step's second micro-batch takes both micro-batches' choices", fabs(dt_program_moe_global_loss(p) - want) / want, 1e-6);
    else verdict("global-batch loss over two micro-batches", false, dt_last_error());
    dt_program_set_global_aux_loss(p, 0);
}

static void check_balance_losses(const char *dir) {
    char folder[512], path[512], fxp[512];
    snprintf(folder, sizeof folder, "%s/moe/mixtral", dir);
    snprintf(fxp, sizeof fxp, "%s/moe/mixtral.safetensors", dir);
    snprintf(path, sizeof path, "%s/moe/seq_aux.safetensors", dir);
    dt_program *p = NULL;
    dt_safetensors *fx = NULL, *f = NULL;
    dt_lm_config cfg;
    int32_t in[B * T], tg[B * T];
    const char *mixtral = "model.layers.%d.block_sparse_moe.gate.weight", *deepseek = "model.layers.%d.mlp.gate.weight";
    model = "balance";
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = dt_program_load_hf(folder, &p);
    if (!st) st = dt_safetensors_open(fxp, &fx);
    if (!st) st = dt_safetensors_read_i32(fx, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(fx, "targets", B * T, tg);
    if (!st) balance_case("softmax", false, p, f, in, tg, mixtral), balance_case("glob_softmax", true, p, f, in, tg, mixtral);
    if (!st) check_global_running(p, in, tg);
    dt_program_destroy(p);
    dt_safetensors_close(fx);
    p = NULL, fx = NULL;
    snprintf(fxp, sizeof fxp, "%s/moe/deepseek_moe.safetensors", dir);
    model = "balance";
    if (!st) st = sigmoid_fixture(fxp, "deepseek_moe", 2, &fx, &cfg, &p, in, tg);
    if (!st) balance_case("sigmoid", false, p, f, in, tg, deepseek), balance_case("glob_sigmoid", true, p, f, in, tg, deepseek);
    if (st) verdict("the balancing losses' fixtures", false, dt_last_error());
    dt_program_destroy(p);
    dt_safetensors_close(fx);
    dt_safetensors_close(f);
}

/* The experts in bf16 (dt_moe_experts_forward/_backward with DT_BF16, on weights holding bf16 values): what autocast
 * rounds holds bf16 values (gate|up, SwiGLU's output, the output; in backward the output gradient, d(act), d(gate|up),
 * d(input), and each weight gradient, one use of it) and stays near the f32 kernels' (within 1e-2 of the norms). */
static bool all_bf16(const float *x, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (dt_bf16_to_f32(dt_f32_to_bf16(x[i])) != x[i]) return false;
    return true;
}

static void check_bf16_experts(void) {
    enum { E = 2, C = 24, F = 16, N = 12 };
    int32_t start[E + 1] = { 0, 5, N }, order[N];
    size_t fc = (size_t)F * C;
    float *w[3], *x = malloc(N * C * 4), *b[2][10];
    uint64_t rng = 7;
    for (int i = 0; i < N; i++) order[i] = i;
    for (int k = 0; k < 3; k++) w[k] = malloc(E * fc * 4);
    for (int i = 0; i < N * C; i++) x[i] = (float)(dt_rng_uniform(&rng) * 2 - 1);
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < E * fc; i++) w[k][i] = (float)((dt_rng_uniform(&rng) * 2 - 1) * 0.3);
    for (int k = 0; k < 3; k++) dt_lp_round(w[k], E * fc, DT_BF16);
    dt_lp_round(x, N * C, DT_BF16);
    /* per precision: hu, act, y, dys (then dxs), g, dhu, dw, dwg, dwu, dwd */
    const size_t sz[10] = { N * 2 * F, N * F, N * C, N * C, N * F, N * 2 * F, N, E * fc, E * fc, E * fc };
    for (int t = 0; t < 2; t++) {
        for (int k = 0; k < 10; k++) b[t][k] = calloc(sz[k], 4);
        dt_moe_experts_forward(b[t][0], b[t][1], b[t][2], x, start, w[0], w[1], w[2], E, C, F, t ? DT_BF16 : DT_F32);
        if (t) verdict("bf16 experts: forward's SwiGLU output holds bf16 values", all_bf16(b[t][1], sz[1]), "(backward makes it again)");
        for (int i = 0; i < N * C; i++) b[t][3][i] = (float)sin(0.37 * i); /* d(output) */
        float wt[N];
        for (int i = 0; i < N; i++) wt[i] = 0.25f + 0.05f * i;
        float use[F * C];
        dt_moe_experts_backward(b[t][3], b[t][7], b[t][8], b[t][9], b[t][6], b[t][3], b[t][4], b[t][5], x, b[t][0], b[t][1], wt, order, start,
                                w[0], w[1], w[2], E, C, F, t ? DT_BF16 : DT_F32, use);
    }
    static const char *names[10] = { "gate|up", "SwiGLU's output", "the output", "d(input)", "d(act)", "d(gate|up)", "", "d(gate weights)",
                                     "d(up weights)", "d(down weights)" };
    bool held = true;
    char bad[160] = "";
    double worst = 0;
    for (int k = 0; k < 10; k++) {
        if (k == 6) continue; /* the routing weights' gradient: f32 (the router's backward takes it) */
        if (!all_bf16(b[1][k], sz[k]) && held) held = false, snprintf(bad, sizeof bad, "%s holds values bf16 does not", names[k]);
        worst = fmax(worst, rel_err(b[1][k], b[0][k], sz[k]));
    }
    verdict("bf16 experts: what autocast rounds holds bf16 values", held, held ? "gate|up, SwiGLU, output, d(input), d(act), d(gate|up), d(weights)" : bad);
    expect("bf16 experts: near the f32 kernels' (every tensor)", worst, 1e-2);
    for (int t = 0; t < 2; t++)
        for (int k = 0; k < 10; k++) free(b[t][k]);
    for (int k = 0; k < 3; k++) free(w[k]);
    free(x);
}

/* GELU experts (gpt2_moe's: wg NULL, up and down alone) against a plain double computation: the forward's outputs, then
 * the gradients backward gives (d(input), d(up), d(down) and each row's routing weight) against central differences of
 * L = sum_r w_r dout_r . y_r, which the kernel's backward answers for. */
static double gelu_d(double x) { return 0.5 * x * (1 + tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

/* Expert e's output c for row r, in double. */
static double gelu_y(const float *x, const float *wu, const float *wd, int e, int r, int c, int C, int F) {
    double y = 0;
    for (int f = 0; f < F; f++) {
        double h = 0;
        for (int k = 0; k < C; k++) h += (double)wu[((size_t)e * F + f) * C + k] * x[(size_t)r * C + k];
        y += (double)wd[((size_t)e * C + c) * F + f] * gelu_d(h);
    }
    return y;
}

static double gelu_loss(const float *x, const float *wu, const float *wd, const float *wt, const float *dout, const int32_t *start, int E,
                        int C, int F) {
    double L = 0;
    for (int e = 0; e < E; e++)
        for (int r = start[e]; r < start[e + 1]; r++)
            for (int c = 0; c < C; c++) L += wt[r] * dout[(size_t)r * C + c] * gelu_y(x, wu, wd, e, r, c, C, F);
    return L;
}

static void check_gelu_experts(void) {
    enum { E = 2, C = 6, F = 5, N = 5 };
    int32_t start[E + 1] = { 0, 2, N }, order[N];
    float x[N * C], wu[E * F * C], wd[E * C * F], wt[N], dout[N * C], hu[N * F], act[N * F], y[N * C];
    float dys[N * C], g[N * F], dhu[N * F], dw[N], dwu[E * F * C] = { 0 }, dwd[E * C * F] = { 0 };
    uint64_t rng = 11;
    for (int i = 0; i < N; i++) order[i] = i, wt[i] = 0.3f + 0.1f * (float)i;
    for (int i = 0; i < N * C; i++) x[i] = (float)(dt_rng_uniform(&rng) * 2 - 1), dout[i] = (float)sin(0.7 * i);
    for (int i = 0; i < E * F * C; i++) wu[i] = (float)(dt_rng_uniform(&rng) * 2 - 1), wd[i] = (float)(dt_rng_uniform(&rng) * 2 - 1);
    dt_moe_experts_forward(hu, act, y, x, start, NULL, wu, wd, E, C, F, DT_F32);
    double fwd = 0;
    for (int e = 0; e < E; e++)
        for (int r = start[e]; r < start[e + 1]; r++)
            for (int c = 0; c < C; c++) {
                double ref = gelu_y(x, wu, wd, e, r, c, C, F);
                fwd = fmax(fwd, fabs(y[r * C + c] - ref) / (fabs(ref) + 1e-3));
            }
    expect("GELU experts (no gate): the outputs against a plain computation", fwd, 1e-4);
    memcpy(dys, dout, sizeof dys);
    dt_moe_experts_backward(dys, NULL, dwu, dwd, dw, dys, g, dhu, x, hu, act, wt, order, start, NULL, wu, wd, E, C, F, DT_F32, NULL);
    /* central differences of L in each input, weight and routing weight (h 1e-3 on values near 1: f32's L to ~1e-6) */
    double worst = 0, h = 1e-3;
    float *vars[4] = { x, wu, wd, wt }, *grads[4] = { dys, dwu, dwd, dw };
    const int n[4] = { N * C, E * F * C, E * C * F, N };
    for (int v = 0; v < 4; v++)
        for (int i = 0; i < n[v]; i++) {
            float keep = vars[v][i];
            vars[v][i] = keep + (float)h;
            double lp = gelu_loss(x, wu, wd, wt, dout, start, E, C, F);
            vars[v][i] = keep - (float)h;
            double lm = gelu_loss(x, wu, wd, wt, dout, start, E, C, F);
            vars[v][i] = keep;
            double fd = (lp - lm) / (2 * h);
            worst = fmax(worst, fabs(fd - grads[v][i]) / (fabs(fd) + 1e-2));
        }
    expect("GELU experts: d(input), d(up), d(down) and the routing weights' gradient against central differences", worst, 1e-3);
}

/* GPT-2 with GELU experts (gpt2_moe) through the model program: the last layer's experts' up and down projections'
 * gradients against the loss's central differences (the weights drawn at 5x a seed's, so that the experts' share of
 * the loss is well above f32's rounding; at 20x the differences' own truncation was 8e-2). */
static void check_gpt2_moe(void) {
    model = "gpt2_moe";
    dt_lm_config c = { .max_seq_len = T, .vocab_size = 64, .padded_vocab_size = 64, .num_layers = 2, .num_heads = 4, .channels = 24,
                       .family = dt_family_find("gpt2_moe"), .ffn = 16, .experts = 4, .experts_top_k = 2, .norm_topk = 1 };
    dt_program *p = NULL;
    dt_status st = dt_program_create(&c, &p);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % 64, tg[i] = (i * 5 + 1) % 64;
    if (!st) {
        dt_program_init_random(p, 5);
        float *w = dt_program_params(p);
        for (size_t i = 0; i < dt_program_num_params(p); i++) w[i] *= 5;
        verdict("the family's experts are GELU ones (no gate)", !dt_family_moe_gated(c.family) && dt_family_moe_gated(dt_family_find("mixtral")), NULL);
        expect("GELU experts: the last layer's down projection's gradient (central differences)", fd_tensor(p, in, tg, "h.1.edownw"), 2e-2);
        expect("GELU experts: the last layer's up projection's gradient (central differences)", fd_tensor(p, in, tg, "h.1.eupw"), 2e-2);
    } else {
        verdict("a gpt2_moe program", false, dt_last_error());
    }
    dt_program_destroy(p);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    check_fixture(dir, "mixtral");
    check_fixture(dir, "qwen2_moe");
    check_fixture(dir, "qwen2_moe_dense"); /* dense layers among the mixtures (mlp_only_layers, decoder_sparse_step) */
    check_fixture(dir, "qwen3_moe"); /* each head's queries and keys normed, heads wider than C / heads, layer 0 dense */
    check_stage_from_mixture(dir);
    check_sigmoid(dir);
    check_capacity(dir);
    check_zloss(dir);
    check_deepseek(dir);
    check_balance_losses(dir);
    model = "kernels";
    check_bf16_experts();
    check_gelu_experts();
    check_gpt2_moe();
    model = "bad";
    bad_input(dir);
    printf("%s\n", failed ? "test_moe: FAILED" : "test_moe: all passed");
    return failed != 0;
}
