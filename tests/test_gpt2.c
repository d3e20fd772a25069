/* GPT-2 against PyTorch (fixtures from scripts/make_fixtures.py): logits,
 * loss, every parameter gradient, 10-step loss curves of AdamW, SGD, LAMB and
 * LARS, SGD and AdamW updated in pieces as DDP does (bit for bit); and llm.c
 * checkpoint round trips, bit for bit.
 *
 * Tolerances sit about 10x above what float32 gives here (observed on Zen 3:
 * loss 1e-7 relative, logits 2.2e-7 and gradients 3.9e-7 of their largest
 * value, blockwise 4.7e-7, curves 1.3e-7) so that a different CPU's kernels
 * pass, and below what a real bug does: a dropped AdamW weight decay
 * (0.01) moves the 10-step curve by 9.7e-6.
 * usage: test_gpt2 FIXTURE_DIR */
#include "dtrain/io.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* The fixture keeps gradients in llm.c's (tensor-major) order; the model's
 * store is unit-major: the reference is put into the store's order once. */
static void llmc_to_store(const dt_gpt2 *m, const float *in, float *out) {
    size_t pos = 0;
    int L = dt_gpt2_get_config(m)->num_layers;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++)
        for (int l = 0; l < (i >= 2 && i < 14 ? L : 1); l++) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            memcpy(out + t->offset, in + pos, t->count * sizeof(float));
            pos += t->count;
        }
}

/* How far got is from want over llm.c's tensor i (all its layers), relative to want's largest value. */
static double tensor_rel(const dt_gpt2 *m, int i, const float *got, const float *want, double *rmax_out) {
    double dmax = 0, rmax = 0;
    int L = dt_gpt2_get_config(m)->num_layers;
    for (int l = 0; l < (i >= 2 && i < 14 ? L : 1); l++) {
        const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
        for (size_t j = t->offset; j < t->offset + t->count; j++) {
            dmax = fmax(dmax, fabs(got[j] - want[j]));
            rmax = fmax(rmax, fabs(want[j]));
        }
    }
    if (rmax_out) *rmax_out = rmax;
    return rmax > 0 ? dmax / rmax : dmax;
}

/* The hyperparameters of scripts/make_fixtures.py. */
static void optimizer_for(int k, dt_optim_config *c, float *lr) {
    static const dt_optim_kind kinds[4] = { DT_OPT_ADAMW, DT_OPT_SGD, DT_OPT_LAMB, DT_OPT_LARS };
    dt_optim_defaults(kinds[k], c);
    c->weight_decay = 0.01f;
    switch (k) {
    case 0: *lr = 1e-3f; break;
    case 1: *lr = 0.05f; c->momentum = 0.9f; c->nesterov = 1; break;
    case 2: *lr = 0.01f; c->eps = 1e-6f; break;
    default: *lr = 0.1f; c->momentum = 0.9f; c->trust_coef = 0.02f; break;
    }
}

/* The elementwise optimizers updated in pieces (as DDP does inside
 * backward: uneven ranges, last first) take exactly dt_optim_step's steps,
 * and the sums of squares they return make the gradient norm. */
static void check_pieces(dt_gpt2 *m, const char *path, const dt_optim_config *oc, float lr, const int32_t *in,
                         const int32_t *tg, int B, int T) {
    size_t np = dt_gpt2_num_params(m);
    float *whole = malloc(np * sizeof(float));
    double worst_norm = 0;
    for (int pass = 0; pass < 2 && whole; pass++) {
        dt_optim *o = NULL;
        float loss;
        if (dt_llmc_load_into(path, m) || dt_optim_create(oc, np, NULL, 0, &o)) { EXPECT(0, "%s", dt_last_error()); break; }
        dt_gpt2_zero_grad(m);
        for (int s = 0; s < 3; s++) {
            dt_gpt2_forward(m, in, tg, B, T, &loss);
            dt_gpt2_backward(m, 1.0f);
            double want = dt_grad_norm(dt_gpt2_grads(m), np), got;
            if (pass == 0) {
                got = dt_optim_step(o, dt_gpt2_params(m), dt_gpt2_grads(m), lr, 1);
            } else {
                dt_optim_begin(o);
                double ss = 0;
                for (size_t end = np, n = 1; end > 0; n = n * 7 + 3) {
                    size_t len = n < end ? n : end;
                    ss += dt_optim_update(o, dt_gpt2_params(m), dt_gpt2_grads(m), lr, end - len, len, 1);
                    end -= len;
                }
                got = sqrt(ss);
            }
            worst_norm = fmax(worst_norm, fabs(got - want) / want);
        }
        if (pass == 0) memcpy(whole, dt_gpt2_params(m), np * sizeof(float));
        else EXPECT(!memcmp(whole, dt_gpt2_params(m), np * sizeof(float)), "%s in pieces differs from one step",
                    dt_optim_kind_name(oc->kind));
        int zeroed = 1;
        for (size_t i = 0; i < np; i++) zeroed &= dt_gpt2_grads(m)[i] == 0;
        EXPECT(zeroed, "%s: gradients not zeroed (pass %d)", dt_optim_kind_name(oc->kind), pass);
        dt_optim_destroy(o);
    }
    EXPECT(worst_norm < 1e-6, "%s: the norm from the update differs from dt_grad_norm by %.3g", dt_optim_kind_name(oc->kind),
           worst_norm);
    printf("%s in pieces: the same parameters as one step; norm from the pass within %.2g\n", dt_optim_kind_name(oc->kind),
           worst_norm);
    free(whole);
}

int main(int argc, char **argv) {
    if (argc < 2) { printf("usage: test_gpt2 FIXTURE_DIR\n"); return 2; }
    dt_kernels_set_threads(1);
    char path[4096], ref[4096];
    snprintf(path, sizeof path, "%s/gpt2_tiny.bin", argv[1]);
    snprintf(ref, sizeof ref, "%s/gpt2_tiny_ref.bin", argv[1]);
    dt_gpt2 *m;
    if (dt_llmc_load(path, &m)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    size_t np = dt_gpt2_num_params(m);

    FILE *f = fopen(ref, "rb");
    int32_t h[256];
    if (!f || fread(h, 4, 256, f) != 256 || h[0] != 20261122) { printf("FAIL: cannot read %s\n", ref); return 1; }
    int B = h[2], T = h[3], steps = h[4], nopt = h[5];
    size_t BT = (size_t)B * T, nl = BT * (size_t)c->padded_vocab_size;
    int32_t *in = malloc(BT * 4), *tg = malloc(BT * 4);
    float *logits = malloc(nl * 4), *grads = malloc(np * 4), *curves = malloc(sizeof(float) * (size_t)(steps * nopt)), loss_ref;
    size_t ok = fread(in, 4, BT, f) + fread(tg, 4, BT, f) + fread(logits, 4, nl, f) + fread(&loss_ref, 4, 1, f) +
                fread(grads, 4, np, f) + fread(curves, 4, (size_t)(steps * nopt), f);
    fclose(f);
    if (ok != 2 * BT + nl + 1 + np + (size_t)(steps * nopt)) { printf("FAIL: %s is truncated\n", ref); return 1; }
    float *llmc_order = grads;
    grads = malloc(np * 4);
    llmc_to_store(m, llmc_order, grads);
    free(llmc_order);

    float loss = 0;
    if (dt_gpt2_forward(m, in, tg, B, T, &loss)) { printf("FAIL: forward: %s\n", dt_last_error()); return 1; }
    double lmax = 0, lref = 0;
    for (size_t i = 0; i < nl; i++) {
        lmax = fmax(lmax, fabs(dt_gpt2_logits(m)[i] - logits[i]));
        lref = fmax(lref, fabs(logits[i]));
    }
    EXPECT(lmax / lref < 3e-6, "logits differ by %.3g of their largest value", lmax / lref);
    double lrel = fabs(loss - loss_ref) / fabs(loss_ref);
    EXPECT(lrel < 1e-6, "loss %.8f vs torch %.8f (relative %.3g)", loss, loss_ref, lrel);
    printf("loss %.7f (torch %.7f), relative difference %.2g; logits %.2g\n", loss, loss_ref, lrel, lmax / lref);

    dt_gpt2_zero_grad(m);
    if (dt_gpt2_backward(m, 1.0f)) { printf("FAIL: backward: %s\n", dt_last_error()); return 1; }
    double worst = 0;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        double rmax, rel = tensor_rel(m, i, dt_gpt2_grads(m), grads, &rmax);
        worst = fmax(worst, rel);
        EXPECT(rel < 5e-6, "gradient of %s differs by %.3g of its largest value (%.3g)", dt_gpt2_llmc_tensor(m, i, 0)->llmc, rel, rmax);
    }
    printf("gradients: worst tensor differs by %.2g of its largest value\n", worst);

    /* Blockwise attention (alone and with recompute): within the same tolerances of torch. */
    for (int rc = 0; rc < 2; rc++) {
        dt_gpt2_set_attention(m, DT_ATTN_BLOCKWISE);
        dt_gpt2_set_recompute(m, rc);
        float lb = 0;
        dt_gpt2_zero_grad(m);
        dt_gpt2_forward(m, in, tg, B, T, &lb);
        dt_gpt2_backward(m, 1.0f);
        double wb = 0;
        for (int i = 0; i < DT_GPT2_NTENSORS; i++) wb = fmax(wb, tensor_rel(m, i, dt_gpt2_grads(m), grads, NULL));
        double lr = fabs(lb - loss_ref) / fabs(loss_ref);
        EXPECT(lr < 1e-6 && wb < 5e-6, "blockwise attention%s: loss %.3g, gradients %.3g from torch", rc ? " + recompute" : "", lr, wb);
        printf("blockwise attention%s: loss %.2g, worst gradient %.2g from torch\n", rc ? " + recompute" : "", lr, wb);
    }
    dt_gpt2_set_attention(m, DT_ATTN_FULL);
    dt_gpt2_set_recompute(m, 0);
    dt_gpt2_zero_grad(m);
    dt_gpt2_forward(m, in, tg, B, T, &loss);
    dt_gpt2_backward(m, 1.0f);

    /* Activation checkpointing gives the same loss and gradients, bit for bit. */
    float *g0 = malloc(np * 4);
    memcpy(g0, dt_gpt2_grads(m), np * 4);
    dt_gpt2_set_recompute(m, 1);
    float loss_rc = 0;
    dt_gpt2_zero_grad(m);
    dt_gpt2_forward(m, in, tg, B, T, &loss_rc);
    dt_gpt2_backward(m, 1.0f);
    EXPECT(loss_rc == loss && !memcmp(g0, dt_gpt2_grads(m), np * 4), "recompute changes the loss or the gradients");
    dt_gpt2_set_recompute(m, 0);
    free(g0);

    /* 10 optimizer steps on the same batch, from the same weights. */
    /* LAMB's and LARS's trust ratios per tensor of the table (each layer's own, as torch's per-layer parameters) */
    int ntab;
    const dt_tensor_info *tab = dt_gpt2_tensors(m, &ntab);
    dt_tensor_span *spans = malloc(sizeof *spans * (size_t)ntab);
    for (int i = 0; i < ntab; i++) spans[i] = (dt_tensor_span){ tab[i].offset, tab[i].count, i, 0, 0, 0 };
    for (int k = 0; k < nopt; k++) {
        dt_optim_config oc;
        float lr;
        optimizer_for(k, &oc, &lr);
        if (dt_llmc_load_into(path, m)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
        dt_optim *o;
        if (dt_optim_create(&oc, np, spans, ntab, &o)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
        double cw = 0;
        dt_gpt2_zero_grad(m);
        for (int s = 0; s < steps; s++) {
            dt_gpt2_forward(m, in, tg, B, T, &loss);
            double rel = fabs(loss - curves[k * steps + s]) / fabs(curves[k * steps + s]);
            cw = fmax(cw, rel);
            dt_gpt2_backward(m, 1.0f);
            /* the optimizer zeroes the gradients for the next step, as the trainer relies on */
            dt_optim_step(o, dt_gpt2_params(m), dt_gpt2_grads(m), lr, 1);
        }
        EXPECT(cw < 2e-6, "%s: 10-step losses differ from torch by up to %.3g relative", dt_optim_kind_name(oc.kind), cw);
        printf("%s: %d-step losses %.5f -> %.5f, worst relative difference %.2g\n", dt_optim_kind_name(oc.kind), steps,
               curves[k * steps], curves[k * steps + steps - 1], cw);
        dt_optim_destroy(o);
        if (oc.kind == DT_OPT_SGD || oc.kind == DT_OPT_ADAMW) check_pieces(m, path, &oc, lr, in, tg, B, T);
    }

    /* Clipping against torch.nn.utils.clip_grad_norm_ (SGD, whose step scales with the gradient, unlike
     * Adam's; max norm 0.5, active at every step): the
     * norm before clipping and the loss curve, not only DDP against one process running the same code. */
    char cpath[4096];
    snprintf(cpath, sizeof cpath, "%s/gpt2_tiny_clip_ref.bin", argv[1]);
    FILE *cf = fopen(cpath, "rb");
    int32_t ch[2] = { 0, 0 };
    float rows[64];
    if (!cf || fread(ch, 4, 2, cf) != 2 || ch[0] > 32 || fread(rows, 8, (size_t)ch[0], cf) != (size_t)ch[0]) {
        EXPECT(0, "%s: cannot read the clipping fixture", cpath);
    } else {
        dt_optim_config oc;
        float lr;
        optimizer_for(1, &oc, &lr);
        dt_optim *o = NULL;
        double wl = 0, wn = 0;
        if (dt_llmc_load_into(path, m) || dt_optim_create(&oc, np, spans, ntab, &o)) EXPECT(0, "%s", dt_last_error());
        dt_gpt2_zero_grad(m);
        for (int s = 0; o && s < ch[0]; s++) {
            dt_gpt2_forward(m, in, tg, B, T, &loss);
            dt_gpt2_backward(m, 1.0f);
            double norm = dt_optim_step_clipped(o, dt_gpt2_params(m), dt_gpt2_grads(m), lr, 0.5f);
            wl = fmax(wl, fabs(loss - rows[2 * s]) / rows[2 * s]);
            wn = fmax(wn, fabs(norm - rows[2 * s + 1]) / rows[2 * s + 1]);
        }
        EXPECT(wl < 2e-6 && wn < 5e-6, "clipped SGD: losses differ from torch by %.3g, norms by %.3g (relative)", wl, wn);
        printf("sgd clipped at 0.5: %d-step losses %.5f -> %.5f (torch's norms %.4f -> %.4f), worst relative difference "
               "%.2g in the loss, %.2g in the norm\n", ch[0], rows[0], rows[2 * ch[0] - 2], rows[1], rows[2 * ch[0] - 1], wl, wn);
        dt_optim_destroy(o);
    }
    if (cf) fclose(cf);

    /* The same weights written by PyTorch's side in HF layout, and as llm.c bf16. */
    dt_gpt2 *hf = NULL, *b16 = NULL, *w32 = NULL;
    snprintf(path, sizeof path, "%s/gpt2_tiny.bin", argv[1]);
    dt_llmc_load(path, &w32);
    snprintf(path, sizeof path, "%s/gpt2_tiny.safetensors", argv[1]);
    EXPECT(dt_model_load(path, 0, &hf) == DT_OK, "HF safetensors: %s", dt_last_error());
    EXPECT(hf && !memcmp(dt_gpt2_get_config(hf), dt_gpt2_get_config(w32), sizeof(dt_gpt2_config)) &&
           !memcmp(dt_gpt2_params(hf), dt_gpt2_params(w32), np * 4), "HF safetensors weights differ from the llm.c file's");
    snprintf(path, sizeof path, "%s/gpt2_tiny_bf16.bin", argv[1]);
    EXPECT(dt_llmc_load(path, &b16) == DT_OK, "llm.c bf16: %s", dt_last_error());
    int bf_ok = b16 != NULL;
    for (size_t i = 0; bf_ok && i < np; i++)
        bf_ok = dt_gpt2_params(b16)[i] == dt_bf16_to_f32(dt_f32_to_bf16(dt_gpt2_params(w32)[i]));
    EXPECT(bf_ok, "llm.c version-5 (bf16) weights are not the bf16 rounding of the f32 ones");
    /* our safetensors: f32 bit-exact, bf16 and f16 the roundings */
    static const dt_dtype kinds[3] = { DT_F32, DT_BF16, DT_F16 };
    for (int k = 0; k < 3; k++) {
        dt_gpt2 *back = NULL;
        snprintf(path, sizeof path, "/tmp/dtrain-test-st-%d.safetensors", (int)getpid());
        EXPECT(dt_safetensors_save(path, w32, kinds[k]) == DT_OK, "safetensors save %s: %s", dt_dtype_name(kinds[k]), dt_last_error());
        EXPECT(dt_model_load(path, 0, &back) == DT_OK, "safetensors load %s: %s", dt_dtype_name(kinds[k]), dt_last_error());
        int same = back != NULL;
        for (size_t i = 0; same && i < np; i++) {
            float v = dt_gpt2_params(w32)[i];
            float want = kinds[k] == DT_F32 ? v : kinds[k] == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(v)) : dt_f16_to_f32(dt_f32_to_f16(v));
            same = memcmp(&dt_gpt2_params(back)[i], &want, 4) == 0;
        }
        EXPECT(same, "safetensors %s round trip is not exact", dt_dtype_name(kinds[k]));
        remove(path);
        dt_gpt2_destroy(back);
    }
    dt_gpt2_destroy(hf);
    dt_gpt2_destroy(b16);
    dt_gpt2_destroy(w32);

    /* Round trip: save, load, same bits. */
    snprintf(path, sizeof path, "/tmp/dtrain-test-gpt2-%d.bin", (int)getpid());
    dt_gpt2 *m2 = NULL;
    EXPECT(dt_llmc_save(path, m) == DT_OK, "save: %s", dt_last_error());
    EXPECT(dt_llmc_load(path, &m2) == DT_OK, "load: %s", dt_last_error());
    EXPECT(m2 && !memcmp(dt_gpt2_params(m), dt_gpt2_params(m2), np * 4), "llm.c round trip is not bit-exact");
    remove(path);
    dt_gpt2_destroy(m2);
    dt_gpt2_destroy(m);
    free(in); free(tg); free(logits); free(grads); free(curves); free(spans);
    printf("gpt2: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
