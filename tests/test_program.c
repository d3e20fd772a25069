/* The model program against its oracles: each Llama fixture (scripts/make_llama_fixtures.py: Hugging Face
 * transformers' LlamaForCausalLM and Qwen2ForCausalLM on tiny random configs) gives the logits, the loss,
 * every gradient and ten AdamW steps; a sharded HF folder loads, and broken ones are refused; recomputation, a
 * split backward and stages chained give the whole model's bits. (GPT-2 runs on the program too: its oracle is
 * PyTorch in tests/test_gpt2.c.) */
#include "dtrain/data.h"
#include "dtrain/infer.h"
#include "dtrain/io.h"
#include "dtrain/optim.h"
#include "dtrain/program.h"
#include "dtrain/train.h"

#include <cjson/cJSON.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { B = 2, T = 16, STEPS = 10 };
static int failed;

/* ||a - b|| / ||b|| over n values, a and b rows of `cols` of which the first `use` count (a's rows may be wider). */
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
    printf("%-12s %-44s relative error %.2e%s\n", fixture, what, err, ok ? "" : "   FAIL");
}

static dt_status load(const char *path, dt_program **p, dt_safetensors **f) {
    dt_lm_config cfg;
    dt_status st = dt_safetensors_open(path, f);
    const char *json = st ? NULL : dt_safetensors_metadata(*f, "config");
    if (!st && !json) st = dt_error(DT_ERR_IO, "%s: no \"config\" in its metadata", path);
    if (!st) st = dt_lm_config_from_hf(json, path, &cfg);
    if (!st) st = dt_program_create(&cfg, p);
    dt_model m;
    if (!st) dt_program_model(*p, &m), st = dt_safetensors_read_model(*f, &m, cfg.vocab_size, NULL);
    return st;
}

static void check_fixture(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/llama/%s.safetensors", dir, name);
    dt_program *p = NULL;
    dt_safetensors *f = NULL;
    int32_t in[B * T], tg[B * T];
    dt_status st = load(path, &p, &f);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_safetensors_read_i32(f, "targets", B * T, tg);
    if (st) {
        printf("FAIL: %s: %s\n", name, dt_last_error());
        failed++;
        dt_program_destroy(p);
        dt_safetensors_close(f);
        return;
    }
    const dt_lm_config *c = dt_program_config(p);
    int V = c->vocab_size, Vp = c->padded_vocab_size;
    dt_model m;
    dt_program_model(p, &m);
    float loss = 0, ref_loss = 0, *ref = malloc(sizeof(float) * (size_t)B * T * V);
    int one = 1, dims[3] = { B, T, V };
    st = dt_program_forward(p, in, tg, B, T, &loss);
    if (!st) st = dt_safetensors_read(f, "logits", 3, dims, 0, ref);
    if (!st) st = dt_safetensors_read(f, "loss", 1, &one, 0, &ref_loss);
    if (!st) {
        expect(name, "logits", rel_err(dt_program_logits(p), (size_t)Vp, ref, (size_t)B * T, (size_t)V), 1e-5);
        expect(name, "loss", fabs(loss - ref_loss) / ref_loss, 1e-6);
        dt_program_zero_grad(p);
        st = dt_program_backward(p, 1.0f);
    }
    /* every tensor's gradient, and the worst of them */
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; !st && i < m.ntensors; i++) {
        const dt_tensor_info *t = &m.tensors[i];
        char gname[112];
        snprintf(gname, sizeof gname, "grad.%s", t->hf);
        int gd[2] = { t->split == DT_SPLIT_VOCAB ? V : t->shape[0], t->shape[1] };
        size_t rows = t->ndim == 2 ? (size_t)gd[0] : 1, cols = t->ndim == 2 ? (size_t)gd[1] : (size_t)gd[0];
        float *g = malloc(sizeof(float) * rows * cols);
        if (!(st = dt_safetensors_read(f, gname, t->ndim, gd, 0, g))) {
            double e = rel_err(m.grads(m.self) + t->offset, cols, g, rows, cols);
            if (e > worst) worst = e, worst_name = t->hf;
        }
        free(g);
    }
    if (!st) {
        char what[96];
        snprintf(what, sizeof what, "gradients (%d tensors; worst %.24s)", m.ntensors, worst_name);
        expect(name, what, worst, 1e-5);
    }
    /* ten AdamW steps from the same weights */
    float ref_losses[STEPS], losses[STEPS];
    int steps = STEPS;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.01f;
    dt_optim *o = NULL;
    if (!st) st = dt_safetensors_read(f, "adamw_losses", 1, &steps, 0, ref_losses);
    if (!st) st = dt_optim_create(&oc, m.nparams, NULL, 0, &o);
    for (int s = 0; !st && s < STEPS; s++) {
        dt_program_zero_grad(p);
        if (!(st = dt_program_forward(p, in, tg, B, T, &losses[s]))) st = dt_program_backward(p, 1.0f);
        if (!st) dt_optim_step(o, m.params(m.self), m.grads(m.self), 1e-3f, 0);
    }
    if (!st) {
        double e = 0;
        for (int s = 0; s < STEPS; s++) e = fmax(e, fabs(losses[s] - ref_losses[s]) / ref_losses[s]);
        expect(name, "10 AdamW steps' losses (worst step)", e, 1e-5);
    }
    if (st) {
        printf("FAIL: %s: %s\n", name, dt_last_error());
        failed++;
    }
    dt_optim_destroy(o);
    free(ref);
    dt_program_destroy(p);
    dt_safetensors_close(f);
}

static dt_lm_config small(const char *family, int KV, bool tied) {
    return (dt_lm_config){ .family = dt_family_find(family), .vocab_size = 101, .padded_vocab_size = 128, .max_seq_len = 32, .num_layers = 3,
                           .num_heads = 4, .kv_heads = KV, .head_dim = 8, .channels = 32, .ffn = 48, .norm_eps = 1e-5f,
                           .rope_theta = 10000, .untied = !tied };
}

/* Stages as a pipeline runs them: [0,2), [2,3), [3,5) of a 3-block model, and one stage holding the chunks [0,2)
 * and [3,5) around another's [2,3) (an interleaved stage), chained forward (the stream out of one into the next)
 * and backward (d output in, d input out), give the whole model's loss and every gradient bit for bit; a tied
 * token table's gradient is the sum of the first stage's and the last stage's copy's. */
static void stages_chain(const char *family, int KV, bool tied) {
    dt_lm_config c = small(family, KV, tied);
    char what[64];
    snprintf(what, sizeof what, "%s, %d K/V heads%s", family, KV, tied ? ", tied" : "");
    const int cut[2][4] = { { 0, 2, 3, 5 }, { 0, 2, 3, 5 } };
    dt_program *whole = NULL, *st3[3] = { NULL }, *outer = NULL, *mid = NULL;
    dt_status st = dt_program_create(&c, &whole);
    for (int k = 0; !st && k < 3; k++) {
        dt_model_part part = { .ua = cut[0][k], .ub = cut[0][k + 1], .tp_size = 1 };
        st = dt_program_create_part(&c, &part, &st3[k]);
    }
    dt_model_part po = { .nchunks = 2, .chunk_a = { 0, 3 }, .chunk_b = { 2, 5 }, .tp_size = 1 }, pm = { .ua = 2, .ub = 3, .tp_size = 1 };
    if (!st) st = dt_program_create_part(&c, &po, &outer);
    if (!st) st = dt_program_create_part(&c, &pm, &mid);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % 101, tg[i] = (i * 5 + 1) % 101;
    float lw = 0, l3 = 0, li = 0;
    if (!st) {
        dt_program *all[] = { whole, st3[0], st3[1], st3[2], outer, mid };
        for (int k = 0; k < 6; k++) dt_program_init_random(all[k], 5); /* a seed gives every part the whole's values at their places */
        st = dt_program_forward(whole, in, tg, B, T, &lw);
    }
    if (!st) st = dt_program_backward(whole, 1.0f);
    /* three stages */
    if (!st) st = dt_program_forward_units(st3[0], 0, 2, in, NULL, NULL, B, T, NULL);
    if (!st) st = dt_program_forward_units(st3[1], 2, 3, NULL, dt_program_output(st3[0]), NULL, B, T, NULL);
    if (!st) st = dt_program_forward_units(st3[2], 3, 5, NULL, dt_program_output(st3[1]), tg, B, T, &l3);
    if (!st) st = dt_program_backward_units(st3[2], NULL, 1.0f);
    if (!st) st = dt_program_backward_units(st3[1], dt_program_input_grad(st3[2], NULL, NULL), 1.0f);
    if (!st) st = dt_program_backward_units(st3[0], dt_program_input_grad(st3[1], NULL, NULL), 1.0f);
    /* an interleaved stage: chunk 0, the middle stage, chunk 1, and back */
    if (!st) st = dt_program_forward_units(outer, 0, 2, in, NULL, NULL, B, T, NULL);
    if (!st) st = dt_program_forward_units(mid, 2, 3, NULL, dt_program_output(outer), NULL, B, T, NULL);
    if (!st) st = dt_program_forward_units(outer, 3, 5, NULL, dt_program_output(mid), tg, B, T, &li);
    if (!st) st = dt_program_backward_units(outer, NULL, 1.0f);
    if (!st) st = dt_program_backward_units(mid, dt_program_input_grad(outer, NULL, NULL), 1.0f);
    if (!st && !(st = dt_program_use_chunk(outer, 0))) st = dt_program_backward_units(outer, dt_program_input_grad(mid, NULL, NULL), 1.0f);
    if (st) {
        printf("FAIL: stages %s: %s\n", what, dt_last_error());
        failed++;
    } else {
        expect("stages", what, fabs(l3 - lw) + fabs(li - lw), 0);
        /* every tensor of every part against the whole's: bit for bit but the tied table (two partial sums) */
        dt_model wm;
        dt_program_model(whole, &wm);
        double worst = 0, tied_err = 0;
        dt_program *parts[] = { st3[0], st3[1], st3[2], outer, mid };
        for (int k = 0; k < 5; k++) {
            dt_model pm2;
            dt_program_model(parts[k], &pm2);
            for (int i = 0; i < pm2.ntensors; i++) {
                const dt_tensor_info *t = &pm2.tensors[i], *u = dt_model_find(&wm, t->name);
                if (!strcmp(t->name, "wte") && tied) continue;
                worst = fmax(worst, rel_err(pm2.grads(pm2.self) + t->offset, t->count, wm.grads(wm.self) + u->offset, 1, t->count));
            }
        }
        if (tied) { /* the first stage's rows plus the last stage's copy */
            dt_model a, z;
            dt_program_model(st3[0], &a);
            dt_program_model(st3[2], &z);
            const dt_tensor_info *ta = dt_model_find(&a, "wte"), *tz = dt_model_find(&z, "wte"), *tw = dt_model_find(&wm, "wte");
            float *sum = malloc(ta->count * sizeof(float));
            for (size_t j = 0; j < ta->count; j++) sum[j] = a.grads(a.self)[ta->offset + j] + z.grads(z.self)[tz->offset + j];
            tied_err = rel_err(sum, ta->count, wm.grads(wm.self) + tw->offset, 1, ta->count);
            free(sum);
            expect("stages", "tied table: first stage + last stage's copy", tied_err, 1e-6);
        }
        expect("stages", "every other gradient, bit for bit", worst, 0);
    }
    dt_program_destroy(whole);
    for (int k = 0; k < 3; k++) dt_program_destroy(st3[k]);
    dt_program_destroy(outer);
    dt_program_destroy(mid);
}

/* Recomputation, and a backward split in B and W, give the plain backward's loss and gradients bit for bit; the
 * blockwise attention within float rounding. */
static void modes_equal(const char *family, int KV, bool tied) {
    dt_lm_config c = small(family, KV, tied);
    char what[64];
    snprintf(what, sizeof what, "%s, %d K/V heads%s", family, KV, tied ? ", tied" : "");
    dt_program *m[4] = { NULL };
    dt_status st = DT_OK;
    for (int k = 0; k < 4 && !st; k++)
        if (!(st = dt_program_create(&c, &m[k]))) dt_program_init_random(m[k], 9);
    if (!st) st = dt_program_set_recompute(m[1], 1);
    if (!st) st = dt_program_set_split_backward(m[2], 1);
    if (!st) dt_program_set_attention(m[3], DT_ATTN_BLOCKWISE);
    int32_t in[B * T], tg[B * T];
    float loss[4] = { 0 };
    for (int step = 0; step < 2 && !st; step++) /* twice: the second forward reuses the first's memory */
        for (int k = 0; k < 4 && !st; k++) {
            for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3 + step) % 101, tg[i] = (i * 5 + 1 + step) % 101;
            dt_program_zero_grad(m[k]);
            if (!(st = dt_program_forward(m[k], in, tg, B, T, &loss[k]))) st = dt_program_backward(m[k], 1.0f);
            if (!st && k == 2) st = dt_program_backward_weights(m[k]);
        }
    if (st) {
        printf("FAIL: modes %s: %s\n", what, dt_last_error());
        failed++;
    } else {
        const char *names[4] = { "", "recompute", "split backward (B, then W)", "blockwise attention" };
        for (int k = 1; k < 4; k++) {
            double e = fabs(loss[k] - loss[0]) / loss[0];
            float *g0 = dt_program_grads(m[0]), *gk = dt_program_grads(m[k]);
            e = fmax(e, rel_err(gk, dt_program_num_params(m[k]), g0, 1, dt_program_num_params(m[0])));
            char line[96];
            snprintf(line, sizeof line, "%s: %s", what, names[k]);
            expect("modes", line, e, k == 3 ? 1e-6 : 0);
        }
    }
    for (int k = 0; k < 4; k++) dt_program_destroy(m[k]);
}

/* The gqa model as save_pretrained wrote it (two shards and their index) gives the gqa fixture's logits. */
static void hf_folder_loads(const char *dir) {
    char path[512];
    snprintf(path, sizeof path, "%s/llama/gqa_folder", dir);
    dt_program *p = NULL;
    dt_safetensors *f = NULL;
    int32_t in[B * T];
    float *ref = NULL;
    dt_status st = dt_program_load_hf(path, &p);
    snprintf(path, sizeof path, "%s/llama/gqa.safetensors", dir);
    if (!st) st = dt_safetensors_open(path, &f);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_program_forward(p, in, NULL, B, T, NULL);
    if (!st) {
        const dt_lm_config *c = dt_program_config(p);
        int dims[3] = { B, T, c->vocab_size };
        ref = malloc(sizeof(float) * (size_t)B * T * c->vocab_size);
        if (!(st = dt_safetensors_read(f, "logits", 3, dims, 0, ref)))
            expect("gqa folder", "logits of the sharded HF folder", rel_err(dt_program_logits(p), (size_t)c->padded_vocab_size, ref,
                                                                            (size_t)B * T, (size_t)c->vocab_size), 1e-5);
    }
    /* and through dt_model_load, as train --model DIR and eval read a folder */
    dt_gpt2 *g = NULL;
    snprintf(path, sizeof path, "%s/llama/gqa_folder", dir);
    if (!st) st = dt_model_load(path, 0, &g);
    if (!st) st = dt_gpt2_forward(g, in, NULL, B, T, NULL);
    if (!st) {
        const dt_lm_config *c = dt_program_config(p);
        expect("gqa folder", "logits through dt_model_load", rel_err(dt_gpt2_logits(g), (size_t)c->padded_vocab_size, ref, (size_t)B * T,
                                                                     (size_t)c->vocab_size), 1e-5);
    }
    if (st) {
        printf("FAIL: gqa folder: %s\n", dt_last_error());
        failed++;
    }
    dt_gpt2_destroy(g);
    free(ref);
    dt_safetensors_close(f);
    dt_program_destroy(p);
}

static void write_text(const char *dir, const char *name, const char *text) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    if (fp) fputs(text, fp), fclose(fp);
}

/* text with the first `from` replaced by `to` (the caller frees it). */
static char *replaced(const char *text, const char *from, const char *to) {
    const char *at = strstr(text, from);
    size_t n = strlen(text) + strlen(to) + 1;
    char *out = malloc(n);
    if (!at) { snprintf(out, n, "%s", text); return out; }
    snprintf(out, n, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

/* A broken copy of the folder (the shards linked, config.json and the index possibly edited) is refused with an
 * error that names the file and the field or tensor. */
static void hf_folder_refused(const char *dir, const char *what, const char *config_from, const char *config_to, const char *index_from,
                              const char *index_to, bool drop_shard2, const char *expect_text) {
    char src[512], tmp[] = "/tmp/dtrain_hf_XXXXXX", path[700], *config = NULL, *index = NULL;
    snprintf(src, sizeof src, "%s/llama/gqa_folder", dir);
    if (!mkdtemp(tmp)) { failed++; return; }
    snprintf(path, sizeof path, "%s/config.json", src);
    dt_file_read_text(path, 1 << 20, &config, NULL);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", src);
    dt_file_read_text(path, 1 << 20, &index, NULL);
    char *c2 = replaced(config ? config : "", config_from ? config_from : "", config_to ? config_to : "");
    char *i2 = replaced(index ? index : "", index_from ? index_from : "", index_to ? index_to : "");
    write_text(tmp, "config.json", c2);
    write_text(tmp, "model.safetensors.index.json", i2);
    for (int k = 1; k <= (drop_shard2 ? 1 : 2); k++) {
        char from[700], to[700];
        snprintf(from, sizeof from, "%s/model-0000%d-of-00002.safetensors", src, k);
        snprintf(to, sizeof to, "%s/model-0000%d-of-00002.safetensors", tmp, k);
        char *abs = realpath(from, NULL);
        if (abs && symlink(abs, to)) failed++;
        free(abs);
    }
    dt_program *p = NULL;
    dt_status st = dt_program_load_hf(tmp, &p);
    const char *msg = st ? dt_last_error() : "(loaded)";
    bool ok = st && strstr(msg, expect_text) && p == NULL;
    if (!ok) failed++;
    printf("%-12s %-44s %s%s\n", "bad folder", what, msg, ok ? "" : "   FAIL");
    dt_program_destroy(p);
    const char *names[] = { "config.json", "model.safetensors.index.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors" };
    for (int k = 0; k < 4; k++) {
        snprintf(path, sizeof path, "%s/%s", tmp, names[k]);
        unlink(path);
    }
    rmdir(tmp);
    free(config), free(index), free(c2), free(i2);
}

enum { PROMPT = 6, NEW = 24 };

/* The fixture's weights in a decoder (f32, or int8), both rows of the batch decoding side by side from their first
 * PROMPT tokens; greedy tokens into out [B, PROMPT + NEW]. */
static dt_status decode_greedy(const char *path, dt_quant q, int32_t *out) {
    dt_safetensors *f = NULL;
    dt_gpt2 *m = NULL;
    dt_decoder *d = NULL;
    dt_lm_config cfg;
    dt_model md;
    int32_t in[B * T];
    dt_status st = dt_safetensors_open(path, &f);
    const char *json = st ? NULL : dt_safetensors_metadata(f, "config");
    if (!st && !json) st = dt_error(DT_ERR_IO, "%s: no \"config\" in its metadata", path);
    if (!st) st = dt_lm_config_from_hf(json, path, &cfg);
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) dt_gpt2_model(m, &md), st = dt_safetensors_read_model(f, &md, cfg.vocab_size, NULL);
    if (!st) st = dt_safetensors_read_i32(f, "inputs", B * T, in);
    if (!st) st = dt_decoder_create_taking(m, q, B, B * PROMPT, 0, &d);
    m = NULL;
    int V = cfg.vocab_size;
    float *logits = st ? NULL : malloc(sizeof(float) * B * (size_t)V);
    dt_infer_row rows[B * PROMPT];
    for (int b = 0; !st && b < B; b++)
        for (int t = 0; t < PROMPT; t++) {
            out[b * (PROMPT + NEW) + t] = in[b * T + t];
            rows[b * PROMPT + t] = (dt_infer_row){ b, t, in[b * T + t], t == PROMPT - 1 };
        }
    int n = B * PROMPT;
    for (int i = 0; !st && i < NEW; i++) {
        if ((st = dt_decoder_step(d, rows, n, logits))) break;
        for (int b = 0; b < B; b++) {
            int32_t best = 0;
            for (int v = 1; v < V; v++) best = logits[(size_t)b * V + v] > logits[(size_t)b * V + best] ? v : best;
            out[b * (PROMPT + NEW) + PROMPT + i] = best;
            rows[b] = (dt_infer_row){ b, PROMPT + i, best, 1 };
        }
        n = B;
    }
    free(logits);
    dt_decoder_destroy(d);
    dt_safetensors_close(f);
    return st;
}

/* What an observer saw: each Linear's input (forward) and output gradient (backward), copied, by layer and op. */
typedef struct {
    float *seen[2][3][16];
    int width[2][3][16], events[2];
    size_t rows;
} seen_linears;

static void record_linear(void *ctx, const dt_linear_event *e) {
    seen_linears *s = ctx;
    s->events[e->backward]++;
    if (e->layer >= 3 || e->op >= 16) return;
    float **at = &s->seen[e->backward][e->layer][e->op];
    free(*at);
    *at = malloc(sizeof(float) * e->rows * (size_t)e->width);
    if (*at) memcpy(*at, e->values, sizeof(float) * e->rows * (size_t)e->width);
    s->width[e->backward][e->layer][e->op] = e->width;
    s->rows = e->rows;
}

/* The Linear observer: once a Linear each way (recomputing too), and each Linear's weight gradient is the sum over rows
 * of what it saw, gradient x input (the program's gradients are HF's: check_fixture). */
static void observer_checks(void) {
    dt_lm_config c = small("llama", 2, false);
    int32_t in[B * T], tg[B * T];
    for (int i = 0; i < B * T; i++) in[i] = (i * 7 + 3) % 101, tg[i] = (i * 5 + 1) % 101;
    for (int rc = 0; rc < 2; rc++) {
        dt_program *p = NULL;
        seen_linears s = { 0 };
        float loss;
        dt_status st = dt_program_create(&c, &p);
        if (!st) st = dt_program_set_recompute(p, rc);
        if (!st) {
            dt_program_init_random(p, 4);
            dt_program_set_linear_observer(p, record_linear, &s);
            dt_program_zero_grad(p);
            if (!(st = dt_program_forward(p, in, tg, B, T, &loss))) st = dt_program_backward(p, 1.0f);
        }
        double worst = 0;
        int linears = 0, nops = 0;
        const dt_program_op *ops = NULL;
        dt_program_view v;
        if (!st) dt_program_get_view(p, &v), ops = v.ops, nops = v.nops;
        for (int l = 0; !st && l < 3; l++)
            for (int k = 0; k < nops; k++) {
                if (ops[k].s.kind != DT_OP_LINEAR) continue;
                linears += l == 0;
                const float *a = s.seen[0][l][k], *g = s.seen[1][l][k];
                const dt_tensor_info *w = dt_program_block_tensor(p, l, ops[k].s.w);
                int O = ops[k].width_out, K = ops[k].width_in;
                if (!a || !g || s.width[0][l][k] != K || s.width[1][l][k] != O) { worst = 1; continue; }
                const float *dw = dt_program_grads(p) + w->offset;
                double d = 0, r = 0;
                for (int o = 0; o < O; o++)
                    for (int i = 0; i < K; i++) {
                        double x = 0;
                        for (size_t t = 0; t < s.rows; t++) x += (double)g[t * O + o] * a[t * K + i];
                        d += (x - dw[(size_t)o * K + i]) * (x - dw[(size_t)o * K + i]), r += x * x;
                    }
                worst = fmax(worst, sqrt(d / (r + 1e-30)));
            }
        bool counts = s.events[0] == 3 * linears && s.events[1] == 3 * linears;
        if (st || !counts) {
            printf("FAIL: linear observer%s: %s (events %d and %d, expected %d each)\n", rc ? ", recomputing" : "", st ? dt_last_error() : "counts",
                   s.events[0], s.events[1], 3 * linears);
            failed++;
        } else
            expect("observer", rc ? "Linear weight grads = sum g x a (recompute)" : "Linear weight grads = sum g x a", worst, 1e-5);
        for (int b = 0; b < 2; b++)
            for (int l = 0; l < 3; l++)
                for (int k = 0; k < 16; k++) free(s.seen[b][l][k]);
        dt_program_destroy(p);
    }
}

/* A GGUF's header as gguf_checks reads it: the architecture, K/V heads, and each tensor's name, dims and data. */
typedef struct {
    char arch[16], pre[16], token[64], chat_template[256];
    uint64_t ntokens, nmerges;
    unsigned kv_heads, eos;
    int n;
    char name[64][48];
    uint64_t dims[64][3], offset[64];
    unsigned experts, experts_used, expert_ffn;
    const uint8_t *data;
} gguf_view;

static uint64_t rd64(const uint8_t **p) { uint64_t v; memcpy(&v, *p, 8); *p += 8; return v; }
static uint32_t rd32(const uint8_t **p) { uint32_t v; memcpy(&v, *p, 4); *p += 4; return v; }

/* Skips (or, for the two keys wanted, reads) one value of GGUF type t. */
static void gguf_value(const uint8_t **p, uint32_t t, const char *key, gguf_view *g) {
    static const int size[] = { 1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8 };
    if (t == 8) { /* a string */
        uint64_t n = rd64(p);
        if (!strcmp(key, "general.architecture")) snprintf(g->arch, sizeof g->arch, "%.*s", (int)n, (const char *)*p);
        if (!strcmp(key, "tokenizer.ggml.pre")) snprintf(g->pre, sizeof g->pre, "%.*s", (int)n, (const char *)*p);
        if (!strcmp(key, "last token")) snprintf(g->token, sizeof g->token, "%.*s", (int)n, (const char *)*p);
        if (!strcmp(key, "tokenizer.chat_template")) snprintf(g->chat_template, sizeof g->chat_template, "%.*s", (int)n, (const char *)*p);
        *p += n;
    } else if (t == 9) { /* an array */
        uint32_t et = rd32(p);
        uint64_t n = rd64(p);
        if (!strcmp(key, "tokenizer.ggml.tokens")) g->ntokens = n;
        if (!strcmp(key, "tokenizer.ggml.merges")) g->nmerges = n;
        for (uint64_t i = 0; i < n; i++) gguf_value(p, et, !strcmp(key, "tokenizer.ggml.tokens") && i + 1 == n ? "last token" : "", g);
    } else {
        if (!strcmp(key, "llama.attention.head_count_kv")) memcpy(&g->kv_heads, *p, 4);
        if (!strcmp(key, "tokenizer.ggml.eos_token_id")) memcpy(&g->eos, *p, 4);
        const char *dot = strchr(key, '.');
        if (dot && !strcmp(dot, ".expert_count")) memcpy(&g->experts, *p, 4);
        if (dot && !strcmp(dot, ".expert_used_count")) memcpy(&g->experts_used, *p, 4);
        if (dot && !strcmp(dot, ".expert_feed_forward_length")) memcpy(&g->expert_ffn, *p, 4);
        *p += size[t];
    }
}

static bool gguf_read(const uint8_t *file, gguf_view *g) {
    const uint8_t *p = file + 4;
    memset(g, 0, sizeof *g);
    if (memcmp(file, "GGUF", 4) || rd32(&p) != 3) return false;
    uint64_t nt = rd64(&p), nkv = rd64(&p);
    for (uint64_t i = 0; i < nkv; i++) {
        char key[96];
        uint64_t n = rd64(&p);
        snprintf(key, sizeof key, "%.*s", (int)n, (const char *)p);
        p += n;
        gguf_value(&p, rd32(&p), key, g);
    }
    for (g->n = 0; g->n < (int)nt && g->n < 64; g->n++) {
        uint64_t n = rd64(&p);
        snprintf(g->name[g->n], sizeof g->name[0], "%.*s", (int)n, (const char *)p);
        p += n;
        uint32_t nd = rd32(&p);
        if (nd > 3) return false;
        for (uint32_t d = 0; d < nd; d++) g->dims[g->n][d] = rd64(&p);
        if (rd32(&p) != 0) return false; /* f32 */
        g->offset[g->n] = rd64(&p);
    }
    g->data = file + (p - file + 31) / 32 * 32;
    return true;
}

/* The gqa fixture as GGUF: llama's architecture and K/V heads, every tensor under llama.cpp's name and shape (the
 * token table's real rows), q's and k's rows in llama.cpp's pair order (row 2i + j of a head is HF's row j hd/2 + i),
 * the rest as stored. (llama.cpp itself reads these files in scripts/check_decode_parity.py.) */
static void gguf_checks(const char *dir) {
    char path[512], out[] = "/tmp/dtrain-test-gguf-XXXXXX";
    snprintf(path, sizeof path, "%s/llama/gqa.safetensors", dir);
    dt_safetensors *f = NULL;
    dt_gpt2 *m = NULL;
    dt_lm_config cfg;
    dt_model md;
    int fd = mkstemp(out);
    if (fd >= 0) close(fd);
    dt_status st = fd < 0 ? dt_error(DT_ERR_IO, "no temporary file") : dt_safetensors_open(path, &f);
    if (!st) st = dt_lm_config_from_hf(dt_safetensors_metadata(f, "config"), path, &cfg);
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) dt_gpt2_model(m, &md), st = dt_safetensors_read_model(f, &md, cfg.vocab_size, NULL);
    if (!st) st = dt_gguf_save(out, m, NULL);
    char *file = NULL;
    size_t len = 0;
    if (!st) st = dt_file_read_text(out, 1 << 24, &file, &len);
    gguf_view g;
    bool ok = !st && gguf_read((const uint8_t *)file, &g) && !strcmp(g.arch, "llama") && g.kv_heads == 2 && g.n == md.ntensors;
    const dt_lm_config *c = dt_program_config(dt_gpt2_program(m));
    int hd = c ? c->head_dim : 0;
    for (int i = 0; ok && i < md.ntensors; i++) {
        const dt_tensor_info *t = &md.tensors[i];
        int rows = t->split == DT_SPLIT_VOCAB ? c->vocab_size : t->shape[0], cols = t->ndim == 2 ? t->shape[1] : 0;
        ok = !strcmp(g.name[i], t->gguf) && g.dims[i][0] == (uint64_t)(cols ? cols : rows) && (!cols || g.dims[i][1] == (uint64_t)rows);
        bool pairs = strstr(t->gguf, "attn_q.") || strstr(t->gguf, "attn_k.");
        const float *mine = md.params(md.self) + t->offset, *theirs = (const float *)(g.data + g.offset[i]);
        for (int r = 0; ok && r < rows; r++) {
            int h = r / hd, k = r % hd, from = pairs ? h * hd + (k % 2) * (hd / 2) + k / 2 : r;
            ok = !memcmp(theirs + (size_t)r * (cols ? cols : 1), mine + (size_t)from * (cols ? cols : 1), sizeof(float) * (cols ? cols : 1));
        }
        if (!ok) printf("gguf: tensor %s (%s) differs\n", t->name, t->gguf);
    }
    if (!ok) failed++;
    printf("%-12s GGUF export: llama, 2 K/V heads, %d tensors under llama.cpp's names, q/k in pair order%s%s\n", "gqa", md.ntensors,
           ok ? "" : "   FAIL ", st ? dt_last_error() : "");
    free(file);
    unlink(out);
    dt_gpt2_destroy(m);
    dt_safetensors_close(f);
}

/* A mixture's GGUF (the MoE fixtures' folders): Mixtral's as llama.cpp's llama and Qwen 2 MoE's as its qwen2moe, with
 * their expert counts, each layer's experts stacked in one tensor of dims {C, F, E} (or {F, C, E}) holding the experts
 * one after another as stored, the rest as a dense model's; Qwen 3 MoE's fixture, whose layer 0 is dense, refused
 * naming it (llama.cpp's qwen3moe makes every layer a mixture), and nothing written. */
static void gguf_moe_checks(const char *dir) {
    static const struct { const char *name, *arch; } cases[] = { { "mixtral", "llama" }, { "qwen2_moe", "qwen2moe" }, { "qwen3_moe", NULL } };
    for (int k = 0; k < 3; k++) {
        char path[512], out[] = "/tmp/dtrain-test-gguf-moe-XXXXXX", *file = NULL;
        snprintf(path, sizeof path, "%s/moe/%s", dir, cases[k].name);
        int fd = mkstemp(out);
        if (fd >= 0) close(fd), unlink(out);
        dt_gpt2 *m = NULL;
        dt_model md;
        size_t len = 0;
        gguf_view g;
        dt_status st = fd < 0 ? dt_error(DT_ERR_IO, "no temporary file") : dt_checkpoint_load_weights(path, 0, &m, NULL);
        dt_status saved = st ? st : dt_gguf_save(out, m, NULL);
        if (!cases[k].arch) {
            bool ok = !st && saved && strstr(dt_last_error(), "1 of the 3 layers are dense") && access(out, F_OK) != 0;
            failed += !ok;
            printf("%-12s GGUF export refused: %s%s\n", cases[k].name, dt_last_error(), ok ? "" : "   FAIL");
            dt_gpt2_destroy(m);
            continue;
        }
        if (!saved) saved = dt_file_read_text(out, 1 << 24, &file, &len);
        const dt_lm_config *c = saved ? NULL : dt_program_config(dt_gpt2_program(m));
        if (c) dt_gpt2_model(m, &md);
        bool ok = c && gguf_read((const uint8_t *)file, &g) && !strcmp(g.arch, cases[k].arch) && g.experts == (unsigned)c->experts &&
                  g.experts_used == (unsigned)c->experts_top_k && g.expert_ffn == (unsigned)c->ffn;
        int stacked = 0;
        for (int i = 0, j = 0; ok && i < md.ntensors; i++) {
            const dt_tensor_info *t = &md.tensors[i];
            if (!t->gguf[0]) continue;
            ok = j < g.n && !strcmp(g.name[j], t->gguf);
            if (ok && t->stacked) { /* {cols, rows, experts}, the experts one after another */
                stacked++;
                ok = g.dims[j][0] == (uint64_t)t->shape[2] && g.dims[j][1] == (uint64_t)t->shape[1] && g.dims[j][2] == (uint64_t)t->shape[0] &&
                     !memcmp(g.data + g.offset[j], md.params(md.self) + t->offset, sizeof(float) * t->count);
            }
            if (!ok) printf("gguf: tensor %s (%s) differs\n", t->name, t->gguf);
            j++;
        }
        ok = ok && stacked == 3 * c->num_layers;
        failed += !ok;
        printf("%-12s GGUF export: %s, %d experts (%d a token), %d stacked expert tensors%s%s\n", cases[k].name, cases[k].arch,
               c ? c->experts : 0, c ? c->experts_top_k : 0, stacked, ok ? "" : "   FAIL ", saved ? dt_last_error() : "");
        free(file);
        unlink(out);
        dt_gpt2_destroy(m);
    }
}

/* A GGUF with a tokenizer's vocabulary (the Llama 3-style fixture's) on a model of as many tokens: its tokens, merges
 * and llama.cpp's name for its pattern, and from a tokenizer_config.json beside it the chat template and the
 * end-of-text it names (<|eot_id|>, not the vocabulary's <|end_of_text|>); a model with fewer tokens than the tokenizer
 * is refused, nothing written. An HF folder gets the tokenizer's files, byte for byte. (llama.cpp reading such a file
 * and printing HF's text: scripts/check_decode_parity.py.) */
static void gguf_tokenizer_checks(const char *dir) {
    char tpath[512], out[] = "/tmp/dtrain-test-gguf-tok-XXXXXX", folder[] = "/tmp/dtrain-test-tokdir-XXXXXX", copy[] = "/tmp/dtrain-test-hfdir-XXXXXX";
    char path[600], *jinja = NULL, *a = NULL, *b = NULL;
    static const char tmpl[] = "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}<|eot_id|>{% endfor %}";
    int fd = mkstemp(out), eos = -1;
    if (fd >= 0) close(fd);
    unlink(out);
    dt_bpe *tok = NULL;
    dt_gpt2 *m = NULL, *small_m = NULL;
    dt_lm_config c = small("llama", 2, false);
    c.vocab_size = 2004, c.padded_vocab_size = 2048;
    dt_status st = fd < 0 || !mkdtemp(folder) || !mkdtemp(copy) ? DT_ERR_IO : DT_OK;
    snprintf(tpath, sizeof tpath, "%s/tokenizer/llama3.json", dir);
    if (!st) st = dt_file_read_text(tpath, 1 << 24, &a, NULL);
    snprintf(tpath, sizeof tpath, "%s/tokenizer.json", folder);
    if (!st) st = dt_file_write_atomic(tpath, (const void *[]){ a }, (size_t[]){ strlen(a) }, 1);
    cJSON *cfg = cJSON_CreateObject();
    cJSON_AddStringToObject(cfg, "chat_template", tmpl);
    cJSON_AddStringToObject(cfg, "eos_token", "<|eot_id|>");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", folder);
    char *cfg_text = cJSON_PrintUnformatted(cfg);
    if (!st) st = cfg_text ? dt_file_write_atomic(path, (const void *[]){ cfg_text }, (size_t[]){ strlen(cfg_text) }, 1) : DT_ERR_NOMEM;
    free(cfg_text);
    if (!st) st = dt_bpe_load_json(tpath, &tok);
    if (!st) st = dt_tokenizer_config_read(tpath, tok, NULL, &eos, &jinja);
    if (!st) st = dt_gpt2_create(&c, &m);
    if (!st) dt_gpt2_init_random(m, 3), st = dt_gguf_save(out, m, &(dt_gguf_vocab){ tok, jinja, eos });
    char *file = NULL;
    size_t len = 0;
    if (!st) st = dt_file_read_text(out, 1 << 24, &file, &len);
    gguf_view g;
    bool ok = !st && gguf_read((const uint8_t *)file, &g) && !strcmp(g.pre, "llama-bpe") && g.ntokens == 2004 &&
              g.nmerges == (uint64_t)dt_bpe_merge_count(tok) && !strcmp(g.token, "\xc4\xa0Moskva");
    int added;
    const char *eos_text = ok ? dt_bpe_token_text(tok, g.eos, &added) : NULL;
    bool templated = ok && !strcmp(g.chat_template, tmpl) && eos >= 0 && g.eos == (unsigned)eos && eos_text && !strcmp(eos_text, "<|eot_id|>");
    free(file);
    unlink(out);
    /* the folder's files, copied */
    if (!st) st = dt_hf_tokenizer_copy(tpath, copy);
    bool copied = !st;
    for (int i = 0; copied && i < 2; i++) {
        static const char *names[] = { "tokenizer.json", "tokenizer_config.json" };
        size_t na = 0, nb = 0;
        free(a), free(b), a = b = NULL;
        snprintf(path, sizeof path, "%s/%s", folder, names[i]);
        copied = !dt_file_read_text(path, 1 << 24, &a, &na);
        snprintf(path, sizeof path, "%s/%s", copy, names[i]);
        copied = copied && !dt_file_read_text(path, 1 << 24, &b, &nb) && na == nb && !memcmp(a, b, na);
    }
    snprintf(path, sizeof path, "%s/special_tokens_map.json", copy);
    copied = copied && access(path, F_OK) != 0; /* (the folder has none: none is written) */
    dt_lm_config c2 = small("llama", 2, false); /* 101 tokens: fewer than the tokenizer's */
    dt_status refused = st ? DT_OK : dt_gpt2_create(&c2, &small_m);
    if (!refused) refused = dt_gguf_save(out, small_m, &(dt_gguf_vocab){ tok, NULL, -1 });
    bool named = refused && strstr(dt_last_error(), "the tokenizer has 2004 tokens, the model only 101") && access(out, F_OK) != 0;
    if (!ok || !templated || !copied || !named) failed++;
    printf("%-12s GGUF with a tokenizer: llama-bpe, %llu tokens, %llu merges%s; its chat template and end-of-text %u%s; the folder's "
           "tokenizer files copied%s; a smaller model refused%s%s\n", "llama3", (unsigned long long)g.ntokens, (unsigned long long)g.nmerges,
           ok ? "" : "   FAIL", g.eos, templated ? "" : "   FAIL", copied ? "" : "   FAIL", named ? "" : "   FAIL ", st ? dt_last_error() : "");
    char rm[200];
    snprintf(rm, sizeof rm, "rm -rf %s %s", folder, copy);
    if (system(rm) != 0) printf("   (could not remove %s, %s)\n", folder, copy);
    cJSON_Delete(cfg);
    free(jinja), free(a), free(b);
    dt_gpt2_destroy(m);
    dt_gpt2_destroy(small_m);
    dt_bpe_destroy(tok);
}

/* The decoder's greedy tokens (its KV cache, two sequences in one batch) are Hugging Face generate's; int8's are
 * counted against them (said, not required: rounding may turn a near tie). */
static void greedy_matches_hf(const char *dir, const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/llama/%s.safetensors", dir, name);
    int32_t ref[B * (PROMPT + NEW)], got[B * (PROMPT + NEW)], q8[B * (PROMPT + NEW)];
    dt_safetensors *f = NULL;
    dt_status st = dt_safetensors_open(path, &f);
    if (!st) st = dt_safetensors_read_i32(f, "greedy", B * (PROMPT + NEW), ref);
    dt_safetensors_close(f);
    if (!st) st = decode_greedy(path, DT_QUANT_NONE, got);
    if (!st) st = decode_greedy(path, DT_QUANT_INT8, q8);
    if (st) {
        printf("FAIL: %s greedy: %s\n", name, dt_last_error());
        failed++;
        return;
    }
    int same = 0, same8 = 0;
    for (int i = 0; i < B * (PROMPT + NEW); i++) same += got[i] == ref[i], same8 += q8[i] == ref[i];
    bool ok = same == B * (PROMPT + NEW);
    if (!ok) failed++;
    printf("%-12s greedy tokens (KV cache, 2 x %d new) = HF generate's: %d of %d%s; int8: %d\n", name, NEW, same - B * PROMPT,
           B * NEW, ok ? "" : "   FAIL", same8 - B * PROMPT);
}

int main(int argc, char **argv) {
    const char *dir = argc > 1 ? argv[1] : "tests/fixtures";
    const char *fixtures[] = { "mha", "gqa", "mqa", "rope_scaled", "qwen2", "qwen3" };
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) check_fixture(dir, fixtures[i]);
    for (size_t i = 0; i < sizeof fixtures / sizeof *fixtures; i++) greedy_matches_hf(dir, fixtures[i]);
    gguf_checks(dir);
    gguf_tokenizer_checks(dir);
    gguf_moe_checks(dir);
    observer_checks();
    modes_equal("llama", 2, false);
    modes_equal("gpt2", 4, true);
    stages_chain("llama", 2, false);
    stages_chain("llama", 1, true);
    stages_chain("gpt2", 4, true);
    hf_folder_loads(dir);
    hf_folder_refused(dir, "a shard missing", NULL, NULL, NULL, NULL, true, "model-00002-of-00002.safetensors, which the index names");
    hf_folder_refused(dir, "a tensor missing from the index", NULL, NULL, "\"model.norm.weight\"", "\"model.norm.weight.renamed\"", false,
                      "\"weight_map\" has no shard for tensor \"model.norm.weight\"");
    hf_folder_refused(dir, "K/V heads that do not divide the heads", "\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3", NULL, NULL,
                      false, "config.json: \"num_key_value_heads\" 3 does not divide");
    hf_folder_refused(dir, "an unknown architecture", "\"model_type\": \"llama\"", "\"model_type\": \"mamba\"", NULL, NULL, false,
                      "\"model_type\" \"mamba\" (architecture LlamaForCausalLM) is not a family");
    hf_folder_refused(dir, "an unknown rope kind", "\"rope_type\": \"default\"", "\"rope_type\": \"yarn\"", NULL, NULL, false,
                      "rope_type \"yarn\" is not supported");
    printf("program: %s\n", failed ? "FAILED" : "all checks passed");
    return failed != 0;
}
