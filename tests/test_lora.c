/* LoRA against its oracle: each fixture (scripts/make_lora_fixtures.py: PEFT's LoRA on a tiny random GPT-2 and a
 * tiny Llama, and the Llama with dropout drawing dtrain's masks from the fixture's row keys; transformers' models)
 * gives the logits, the loss, every adapter's gradient and ten AdamW steps of the adapters alone (with dropout: the
 * logits in evaluation, where nothing drops). Then: the base weights stay as they were; recomputation and a split backward give the same bits;
 * bad targets and ranks are refused naming what. */
#include "adamw_steps.h"
#include "dtrain/io.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { B = 2, T = 16, STEPS = 10 };
static int failed;

static double rel_err(const float *a, size_t astride, const float *b, size_t rows, size_t use) {
    double d = 0, r = 0;
    for (size_t i = 0; i < rows; i++)
        for (size_t j = 0; j < use; j++) {
            double x = a[i * astride + j], y = b[i * use + j];
            d += (x - y) * (x - y);
            r += y * y;
        }
    return sqrt(d) / (sqrt(r) + 1e-30);
}

static void expect(const char *fixture, const char *what, double err, double tol) {
    bool ok = err <= tol;
    if (!ok) failed++;
    printf("%-6s %-50s relative error %.2e%s\n", fixture, what, err, ok ? "" : "   FAIL");
}

static void check(const char *fixture, const char *what, bool ok) {
    if (!ok) failed++;
    printf("%-6s %-50s %s\n", fixture, what, ok ? "ok" : "FAIL");
}

/* The fixture's base model and its adapters (rank, alpha and targets from its metadata). */
static dt_status load(const char *path, dt_program **p, dt_safetensors **f) {
    dt_lm_config cfg;
    dt_status st = dt_safetensors_open(path, f);
    const char *json = st ? NULL : dt_safetensors_metadata(*f, "config"), *lora = st ? NULL : dt_safetensors_metadata(*f, "lora");
    if (!st && (!json || !lora)) st = dt_error(DT_ERR_IO, "%s: no \"config\" or \"lora\" in its metadata", path);
    if (!st) st = dt_lm_config_from_hf(json, path, &cfg);
    if (!st) st = dt_program_create(&cfg, p);
    dt_model m;
    if (!st) dt_program_model(*p, &m), st = dt_safetensors_read_model(*f, &m, cfg.vocab_size, NULL);
    char targets[128] = "";
    int rank = 0;
    float alpha = 0, dropout = 0;
    const char *t = st ? NULL : strstr(lora, "\"targets\": \""), *d = st ? NULL : strstr(lora, "\"dropout\": ");
    if (d) dropout = strtof(d + 11, NULL);
    if (!st && (!t || sscanf(t, "\"targets\": \"%127[^\"]", targets) != 1 || !strstr(lora, "\"rank\": ") ||
                sscanf(strstr(lora, "\"rank\": ") + 8, "%d", &rank) != 1 || !strstr(lora, "\"alpha\": ") ||
                sscanf(strstr(lora, "\"alpha\": ") + 9, "%f", &alpha) != 1))
        st = dt_error(DT_ERR_IO, "%s: its \"lora\" metadata is not rank, alpha, targets", path);
    dt_lora_config lc = { .rank = rank, .alpha = alpha, .dropout = dropout, .targets = targets };
    if (!st) st = dt_program_set_lora(*p, &lc, 1);
    if (!st) dt_program_model(*p, &m), st = dt_safetensors_read_model(*f, &m, cfg.vocab_size, NULL);
    return st;
}

/* The adapters' gradients against PEFT's, the worst tensor named. */
static dt_status check_grads(const char *name, const dt_model *m, dt_safetensors *f) {
    double worst = 0;
    const char *worst_name = "";
    dt_status st = DT_OK;
    for (int i = 0; !st && i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        char gname[112];
        snprintf(gname, sizeof gname, "grad.%s", t->hf);
        float *g = malloc(sizeof(float) * t->count);
        if (!(st = dt_safetensors_read(f, gname, 2, t->shape, 0, g))) {
            double e = rel_err(m->grads(m->self) + t->offset, (size_t)t->shape[1], g, (size_t)t->shape[0], (size_t)t->shape[1]);
            if (e > worst) worst = e, worst_name = t->name;
        }
        free(g);
    }
    char what[96];
    snprintf(what, sizeof what, "adapters' gradients (%d; worst %.16s)", m->ntensors, worst_name);
    if (!st) expect(name, what, worst, 1e-5);
    return st;
}

/* Ten AdamW steps of the adapters (PEFT's base frozen): the losses, and the base's weights untouched. */
static dt_status check_steps(const char *name, dt_program *p, const dt_model *m, dt_safetensors *f, const int32_t *in, const int32_t *tg) {
    float losses[STEPS];
    size_t nb = dt_program_num_params(p);
    float *base = malloc(nb * sizeof(float));
    if (!base) return dt_error(DT_ERR_NOMEM, "out of memory");
    memcpy(base, dt_program_params(p), nb * sizeof(float));
    double e;
    dt_status st = adamw_steps_err(p, m, f, in, tg, B, T, STEPS, &e, losses);
    if (!st) {
        expect(name, "10 AdamW steps' losses (worst step)", e, 1e-5);
        check(name, "the base weights unchanged, bit for bit", !memcmp(base, dt_program_params(p), nb * sizeof(float)));
        check(name, "the loss fell", losses[STEPS - 1] < losses[0]);
    }
    free(base);
    return st;
}

/* The adapters' gradients after one forward and backward, copied (NULL on failure). */
static float *grads_after(dt_program *p, const int32_t *in, const int32_t *tg) {
    dt_model m;
    dt_program_model(p, &m);
    dt_program_zero_grad(p);
    float loss, *g = malloc(m.nparams * sizeof(float));
    if (!g || dt_program_forward(p, in, tg, B, T, &loss) || dt_program_backward(p, 1.0f)) {
        free(g);
        return NULL;
    }
    memcpy(g, m.grads(m.self), m.nparams * sizeof(float));
    return g;
}

/* Recomputation and a split backward (B then W) give one backward's bits. */
static void check_modes(const char *name, dt_program *p, const int32_t *in, const int32_t *tg) {
    dt_model m;
    dt_program_model(p, &m);
    float *plain = grads_after(p, in, tg), *g = NULL;
    bool ok = plain && !dt_program_set_recompute(p, 1) && (g = grads_after(p, in, tg)) && !memcmp(plain, g, m.nparams * sizeof(float));
    check(name, "recomputation: the same adapter gradients, bit for bit", ok);
    free(g), g = NULL;
    dt_program_set_recompute(p, 0);
    ok = plain && !dt_program_set_split_backward(p, 1);
    float loss;
    dt_program_zero_grad(p);
    ok = ok && !dt_program_forward(p, in, tg, B, T, &loss) && !dt_program_backward(p, 1.0f) && !dt_program_backward_weights(p) &&
         !memcmp(plain, m.grads(m.self), m.nparams * sizeof(float));
    check(name, "a split backward (B, W): the same bits", ok);
    dt_program_set_split_backward(p, 0);
    free(plain);
}

/* Without keys (evaluation) nothing drops: the logits of PEFT's model in eval mode, after the steps (the fixture's
 * are from before them: the adapters read again). */
static dt_status check_eval(const char *name, dt_program *p, dt_safetensors *f, const int32_t *in, const int32_t *tg) {
    const dt_lm_config *c = dt_program_config(p);
    int dims[3] = { B, T, c->vocab_size };
    float loss, *ref = malloc(sizeof(float) * (size_t)B * T * c->vocab_size);
    dt_model m;
    dt_program_model(p, &m);
    dt_program_set_row_keys(p, NULL);
    dt_status st = ref ? dt_safetensors_read_model(f, &m, c->vocab_size, NULL) : dt_error(DT_ERR_NOMEM, "out of memory");
    if (!st) st = dt_program_forward(p, in, tg, B, T, &loss);
    if (!st) st = dt_safetensors_read(f, "logits_eval", 3, dims, 0, ref);
    if (!st)
        expect(name, "evaluation (no keys): PEFT's logits in eval mode",
               rel_err(dt_program_logits(p), (size_t)c->padded_vocab_size, ref, (size_t)B * T, (size_t)c->vocab_size), 1e-5);
    free(ref);
    return st;
}

static void check_fixture(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/lora/%s.safetensors", dir, name);
    dt_program *p = NULL;
    dt_safetensors *f = NULL;
    int32_t in[B * T], tg[B * T];
    dt_status st = load(path, &p, &f);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
    dt_model m;
    float loss = 0, ref_loss = 0, *ref = NULL;
    int32_t key32[B];
    uint64_t keys[B];
    bool dropout = !st && dt_safetensors_has(f, "row_keys");
    if (dropout && !(st = dt_safetensors_read_i32(f, "row_keys", B, key32))) {
        for (int b = 0; b < B; b++) keys[b] = (uint64_t)key32[b];
        dt_program_set_row_keys(p, keys);
    }
    if (!st) {
        const dt_lm_config *c = dt_program_config(p);
        int V = c->vocab_size, one = 1, dims[3] = { B, T, V };
        dt_program_model(p, &m);
        ref = malloc(sizeof(float) * (size_t)B * T * V);
        st = dt_program_forward(p, in, tg, B, T, &loss);
        if (!st) st = dt_safetensors_read(f, "logits", 3, dims, 0, ref);
        if (!st) st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref_loss);
        if (!st) {
            expect(name, "logits", rel_err(dt_program_logits(p), (size_t)c->padded_vocab_size, ref, (size_t)B * T, (size_t)V), 1e-5);
            expect(name, "loss", fabs(loss - ref_loss) / ref_loss, 1e-6);
            dt_program_zero_grad(p);
            st = dt_program_backward(p, 1.0f);
        }
    }
    if (!st) st = check_grads(name, &m, f);
    if (!st) check_modes(name, p, in, tg);
    if (!st) st = check_steps(name, p, &m, f, in, tg);
    if (!st && dropout) st = check_eval(name, p, f, in, tg);
    if (st) {
        printf("FAIL: %s: %s\n", name, dt_last_error());
        failed++;
    }
    free(ref);
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* The fixture's base alone (no adapters), from its file. */
static dt_status load_base(const char *path, dt_program **p, dt_safetensors **f) {
    dt_lm_config cfg;
    dt_status st = dt_safetensors_open(path, f);
    const char *json = st ? NULL : dt_safetensors_metadata(*f, "config");
    if (!st && !json) st = dt_error(DT_ERR_IO, "%s: no \"config\" in its metadata", path);
    if (!st) st = dt_lm_config_from_hf(json, path, &cfg);
    if (!st) st = dt_program_create(&cfg, p);
    dt_model m;
    if (!st) dt_program_base_model(*p, &m), st = dt_safetensors_read_model(*f, &m, cfg.vocab_size, NULL);
    return st;
}

/* PEFT's folder (save_pretrained's) loads and gives PEFT's logits; dtrain's folder of the same adapters reads back
 * bit for bit; the merge is PEFT's merge_and_unload, and gives the adapted model's logits. */
static void check_folders(const char *dir, const char *name) {
    char path[512], folder[512], tmp[] = "/tmp/dtrain_peft_XXXXXX";
    snprintf(path, sizeof path, "%s/lora/%s.safetensors", dir, name);
    snprintf(folder, sizeof folder, "%s/lora/%s_adapter", dir, name);
    dt_program *p = NULL, *q = NULL;
    dt_safetensors *f = NULL, *g = NULL;
    int32_t in[B * T], tg[B * T];
    float loss, *ref = NULL, *adapted = NULL;
    dt_status st = load_base(path, &p, &f);
    if (!st) st = load_base(path, &q, &g);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
    if (!st) st = dt_peft_load(folder, p);
    const dt_lm_config *c = st ? NULL : dt_program_config(p);
    size_t nl = st ? 0 : (size_t)B * T * c->padded_vocab_size;
    if (!st) {
        int dims[3] = { B, T, c->vocab_size };
        ref = malloc(sizeof(float) * (size_t)B * T * c->vocab_size);
        adapted = malloc(sizeof(float) * nl);
        if (!(st = dt_program_forward(p, in, tg, B, T, &loss)) && !(st = dt_safetensors_read(f, "logits", 3, dims, 0, ref))) {
            expect(name, "PEFT's adapter folder read: logits", rel_err(dt_program_logits(p), (size_t)c->padded_vocab_size, ref, (size_t)B * T,
                                                                      (size_t)c->vocab_size), 1e-5);
            memcpy(adapted, dt_program_logits(p), sizeof(float) * nl);
        }
    }
    /* dtrain's folder, read into a second model */
    if (!st && !mkdtemp(tmp)) st = dt_error(DT_ERR_IO, "mkdtemp failed");
    if (!st) st = dt_peft_save(tmp, p);
    if (!st) st = dt_peft_load(tmp, q);
    if (!st) {
        dt_model a, b;
        dt_program_model(p, &a), dt_program_model(q, &b);
        check(name, "dtrain's adapter folder reads back bit for bit", a.nparams == b.nparams &&
              !memcmp(a.params(a.self), b.params(b.self), a.nparams * sizeof(float)));
    }
    /* merged: each adapted weight equals PEFT's merge_and_unload bits; the merged model's logits are the adapted one's
     * to f32's rounding through the layers (W + BA rounded once against Wx + B(Ax): 1.01e-6 on an Intel Xeon's AVX-512
     * GEMM kernels, 5e-7 on Zen's), as every logits check here */
    if (!st) {
        dt_program_lora_merge(p);
        dt_model m;
        dt_program_base_model(p, &m);
        int merged = 0, equal = 0;
        double worst = 0;
        for (int i = 0; !st && i < m.ntensors; i++) {
            const dt_tensor_info *t = &m.tensors[i];
            char mname[128];
            snprintf(mname, sizeof mname, "merged.%s%s", strcmp(name, "gpt2") ? "" : "transformer.", t->hf);
            if (!dt_safetensors_has(f, mname)) continue;
            float *w = malloc(sizeof(float) * t->count);
            if (!(st = dt_safetensors_read(f, mname, 2, t->shape, t->hf_transposed, w))) {
                merged++;
                equal += !memcmp(w, m.params(m.self) + t->offset, sizeof(float) * t->count);
                worst = fmax(worst, rel_err(m.params(m.self) + t->offset, (size_t)t->shape[1], w, (size_t)t->shape[0], (size_t)t->shape[1]));
            }
            free(w);
        }
        char what[96];
        snprintf(what, sizeof what, "merged weights = PEFT's merge (%d of %d bit for bit)", equal, merged);
        if (!st) expect(name, what, worst, merged == equal ? 0 : 1e-6);
        if (!st && !(st = dt_program_forward(p, in, tg, B, T, &loss)))
            expect(name, "the merged model's logits = the adapted model's", rel_err(dt_program_logits(p), (size_t)c->padded_vocab_size, adapted,
                                                                                     (size_t)B * T, (size_t)c->padded_vocab_size), 1e-5);
    }
    if (st) {
        printf("FAIL: %s folders: %s\n", name, dt_last_error());
        failed++;
    }
    char rm[600];
    snprintf(rm, sizeof rm, "%s/adapter_config.json", tmp), remove(rm);
    snprintf(rm, sizeof rm, "%s/adapter_model.safetensors", tmp), remove(rm);
    rmdir(tmp);
    free(ref), free(adapted);
    dt_program_destroy(p), dt_program_destroy(q);
    dt_safetensors_close(f), dt_safetensors_close(g);
}

/* PEFT's folder with lora_dropout 0.25 gives its adapters that dropout (a run from --lora DIR trains with it). */
static void check_dropout_folder(const char *dir) {
    char path[512], folder[512];
    snprintf(path, sizeof path, "%s/lora/llama_dropout.safetensors", dir);
    snprintf(folder, sizeof folder, "%s/lora/llama_dropout_adapter", dir);
    dt_program *p = NULL;
    dt_safetensors *f = NULL;
    dt_status st = load_base(path, &p, &f);
    if (!st) st = dt_peft_load(folder, p);
    const dt_lora_config *c = st ? NULL : dt_program_lora_config(p);
    check("llama_dropout", "PEFT's folder read: its lora_dropout 0.25 kept", c && c->dropout == 0.25f);
    if (st) printf("   %s\n", dt_last_error());
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

/* A refusal whose message names what it must. */
static void refused(const char *what, dt_program *p, dt_lora_config c, const char *needle) {
    dt_status st = dt_program_set_lora(p, &c, 1);
    bool ok = st && strstr(dt_last_error(), needle);
    check("bad", what, ok);
    if (!ok) printf("   got: %s\n", st ? dt_last_error() : "accepted");
}

static void bad_input(void) {
    dt_lm_config c;
    dt_program *p = NULL;
    if (dt_lm_preset("llama-tiny", &c) || dt_program_create(&c, &p)) {
        printf("FAIL: llama-tiny: %s\n", dt_last_error());
        failed++;
        return;
    }
    refused("targets that match no Linear (its Linears listed)", p, (dt_lora_config){ 4, 8, 0, "c_attn" }, "q_proj, k_proj");
    refused("a rank larger than the matrix (named, with its shape)", p, (dt_lora_config){ 100000, 8, 0, "q_proj" }, "q_proj [");
    refused("a rank of 0", p, (dt_lora_config){ 0, 8, 0, "q_proj" }, "rank 0");
    refused("a dropout of 1 (not in [0, 1))", p, (dt_lora_config){ 4, 8, 1.0f, "q_proj" }, "dropout 1 is not in [0, 1)");
    refused("a name's tail that is not a whole module name", p, (dt_lora_config){ 4, 8, 0, "proj" }, "match no Linear");
    dt_program_destroy(p);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    check_fixture(dir, "gpt2");
    check_fixture(dir, "llama");
    check_fixture(dir, "llama_dropout");
    check_folders(dir, "gpt2");
    check_folders(dir, "llama");
    check_dropout_folder(dir);
    bad_input();
    printf("%s\n", failed ? "test_lora: FAILED" : "test_lora: all passed");
    return failed != 0;
}
