/* The GPU's ceilings (an 8192^3 product in f32 and in bf16, a 4 GiB device copy), then the model program's training
 * step on it: a preset at B x T, forward, backward and AdamW, timed over steps after two warm-up steps (the device
 * synchronised at the ends): tokens/s, and model FLOPs (dt_program_flops_per_token) per second against the measured
 * f32 ceiling and against the bf16 one (MFU as it is usually quoted). Then where a step's time goes: its forward,
 * backward and update as the step ran them, and, timed alone at the step's shapes, the Linears (the block's and the
 * head, forward and backward) and attention (forward and backward): the rest is the element-wise kernels.
 * MODE, a comma list: tf32 (the f32 matmuls on the tensor cores in TF32, the ceilings too), bf16 (autocast's mixed
 * precision: the Linears in bf16; attention's products f32, or TF32 with tf32), flash (attention without the T x T probabilities,
 * flash.cu, in bf16 or TF32; else they are kept), cudnn (with bf16: cuDNN's fused attention). Default f32.
 * usage: gpu_lm_bench PRESET B T STEPS [MODE] */
#include "dtrain/base.h"
#include "dtrain/gpu_lm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Milliseconds of fn(ctx) on g: the median of five runs after one. */
static double timed(dt_gpu *g, void (*fn)(dt_gpu *, void *), void *ctx) {
    double t[5];
    fn(g, ctx);
    for (int i = 0; i < 5; i++) {
        dt_gpu_sync(g);
        double a = dt_time_now();
        fn(g, ctx);
        dt_gpu_sync(g);
        t[i] = (dt_time_now() - a) * 1e3;
    }
    for (int i = 0; i < 5; i++) /* a sort of five */
        for (int j = i + 1; j < 5; j++)
            if (t[j] < t[i]) { double x = t[i]; t[i] = t[j]; t[j] = x; }
    return t[2];
}

typedef struct {
    const dt_program_view *v;
    int L, BT, B, T, C, Vp, lp, lse, cudnn;
    float *x, *y, *dx, *dy, *w, *dw, *work, *att;
    uint16_t *w16, *work16;
} parts;

/* Each layer's Linears (the view's) and the head, forward and backward, as the model runs them */
static void linears(dt_gpu *g, void *ctx) {
    parts *q = ctx;
    for (int l = 0; l <= q->L; l++)
        for (int k = 0; k < (l < q->L ? q->v->nops : 1); k++) {
            const dt_program_op *o = &q->v->ops[k];
            if (l < q->L && o->s.kind != DT_OP_LINEAR) continue;
            int in = l < q->L ? o->width_in : q->C, out = l < q->L ? o->width_out : q->Vp;
            if (q->lp) {
                dt_gpu_matmul_forward_bf16(g, q->y, q->x, NULL, q->w16, NULL, q->BT, in, out, q->work16);
                dt_gpu_matmul_backward_bf16(g, q->dx, q->dw, NULL, q->dy, q->x, NULL, q->w16, q->BT, in, out, q->work16, q->work);
            } else {
                dt_gpu_matmul_forward(g, q->y, q->x, q->w, NULL, q->BT, in, out);
                dt_gpu_matmul_backward(g, q->dx, q->dw, NULL, q->dy, q->x, q->w, q->BT, in, out);
            }
        }
}

static void attention(dt_gpu *g, void *ctx) {
    parts *q = ctx;
    int Q = q->v->heads * q->v->head_dim;
    for (int l = 0; l < q->L; l++)
        if (q->cudnn) {
            dt_gpu_attention_forward_cudnn(g, q->y, q->att, q->x, q->B, q->T, Q, q->v->heads, q->work16, NULL);
            dt_gpu_attention_backward_cudnn(g, q->dx, q->dy, q->y, q->x, q->att, q->B, q->T, Q, q->v->heads, q->work16);
        } else if (q->lse) {
            dt_gpu_attention_forward_lse(g, q->y, q->att, q->x, q->B, q->T, Q, q->v->heads);
            dt_gpu_attention_backward_lse(g, q->dx, q->work, q->dy, q->y, q->x, q->att, q->B, q->T, Q, q->v->heads);
        } else {
            dt_gpu_attention_forward(g, q->y, q->att, q->x, q->B, q->T, Q, q->v->heads);
            dt_gpu_attention_backward(g, q->dx, q->work, q->dy, q->x, q->att, q->B, q->T, Q, q->v->heads);
        }
}

/* The Linears' and attention's milliseconds a step, each alone at the step's shapes (buffers of the largest). */
static dt_status time_parts(dt_gpu *g, dt_program *p, int B, int T, int lp, int lse, int cudnn, double *lin, double *att) {
    dt_program_view v;
    dt_program_get_view(p, &v);
    const dt_lm_config *c = dt_program_config(p);
    parts q = { .v = &v, .L = c->num_layers, .BT = B * T, .B = B, .T = T, .C = c->channels, .Vp = v.embed->shape[0], .lp = lp, .lse = lse, .cudnn = cudnn };
    size_t BT = (size_t)B * T, wide = 3 * (size_t)v.heads * v.head_dim, wmax = (size_t)q.Vp * q.C;
    for (int k = 0; k < v.nops; k++) {
        size_t io = (size_t)(v.ops[k].width_in > v.ops[k].width_out ? v.ops[k].width_in : v.ops[k].width_out);
        wide = io > wide ? io : wide;
    }
    wide = (size_t)q.Vp > wide ? (size_t)q.Vp : wide;
    size_t tt = (size_t)v.heads * T * T;
    float **f[] = { &q.x, &q.y, &q.dx, &q.dy, &q.w, &q.dw, &q.work, &q.att };
    size_t nf[] = { BT * wide, BT * wide, BT * wide, BT * wide, wmax, wmax, (wmax + q.Vp) > tt ? wmax + q.Vp : tt, B * tt };
    dt_status st = DT_OK;
    for (int i = 0; i < 8 && !st; i++) st = dt_gpu_alloc(g, nf[i] * sizeof(float), (void **)f[i]);
    if (!st) st = dt_gpu_alloc(g, wmax * 2, (void **)&q.w16);
    size_t w16 = 2 * wide > 8 * (size_t)v.heads * v.head_dim ? 2 * wide : 8 * (size_t)v.heads * v.head_dim; /* cuDNN's backward: 8 C */
    if (!st) st = dt_gpu_alloc(g, BT * w16 * 2, (void **)&q.work16);
    for (int i = 0; i < 8 && !st; i++) dt_gpu_zero(g, *f[i], nf[i] * sizeof(float));
    if (!st) dt_gpu_zero(g, q.w16, wmax * 2);
    if (!st) *lin = timed(g, linears, &q), *att = timed(g, attention, &q), st = dt_gpu_sync(g);
    for (int i = 0; i < 8; i++) dt_gpu_free(g, *f[i]);
    dt_gpu_free(g, q.w16), dt_gpu_free(g, q.work16);
    return st;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: gpu_lm_bench PRESET B T STEPS [MODE: tf32, bf16, flash, a comma list]\n");
        return 2;
    }
    const char *mode = argc > 5 ? argv[5] : "f32";
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]), tf32 = strstr(mode, "tf32") != NULL, lp = strstr(mode, "bf16") != NULL;
    dt_gpu *g = NULL;
    dt_status st = dt_gpu_open(0, &g);
    if (!st) dt_gpu_set_tf32(g, tf32);
    double f32 = 0, bf16 = 0, copy = 0;
    if (!st) st = dt_gpu_measure_gemm(g, 0, 8192, 8192, 8192, &f32);
    if (!st) st = dt_gpu_measure_gemm(g, 1, 8192, 8192, 8192, &bf16);
    if (!st) st = dt_gpu_measure_copy(g, (size_t)4 << 30, &copy);
    if (st) {
        fprintf(stderr, "gpu_lm_bench: %s\n", dt_last_error());
        return 1;
    }
    int sms = 0, cap = 0;
    size_t mem = 0;
    dt_gpu_props(g, &sms, &mem, &cap);
    printf("GPU %s: %d SMs, %.1f GiB, sm_%d\n", dt_gpu_name(g), sms, mem / 1073741824.0, cap);
    printf("ceilings: %s GEMM %.1f TFLOP/s, bf16 GEMM %.1f TFLOP/s (8192^3, random values), copy %.0f GB/s (read + written)\n", tf32 ? "tf32" : "f32", f32, bf16,
           copy);
    dt_lm_config cfg;
    dt_program *p = NULL;
    dt_gpu_lm *m = NULL;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.1f;
    st = dt_lm_preset(argv[1], &cfg);
    if (!st) st = dt_program_create(&cfg, &p);
    if (!st) dt_program_init_random(p, 1);
    if (!st && lp) st = dt_program_set_precision(p, DT_BF16);
    bool cudnn = strstr(mode, "cudnn") != NULL;
    if (!st && strstr(mode, "flash")) dt_program_set_attention(p, DT_ATTN_BLOCKWISE);
    if (!st && cudnn) dt_program_set_attention(p, DT_ATTN_CUDNN);
    if (!st) st = dt_gpu_lm_create(g, p, B, T, &m);
    if (st) {
        fprintf(stderr, "gpu_lm_bench: %s\n", dt_last_error());
        return 1;
    }
    size_t BT = (size_t)B * T;
    int32_t *x = malloc(BT * 4), *y = malloc(BT * 4);
    for (size_t i = 0; i < BT; i++) x[i] = (int32_t)((i * 7919) % (size_t)cfg.vocab_size), y[i] = (int32_t)((i * 104729 + 1) % (size_t)cfg.vocab_size);
    float loss = 0;
    double t0 = 0, part[3] = { 0 };
    for (int s = 0; s < steps + 2 && !st; s++) {
        if (s == 2) t0 = dt_time_now(), part[0] = part[1] = part[2] = 0;
        double a = dt_time_now(); /* each phase ends synchronised with the device */
        st = dt_gpu_lm_forward(m, x, y, 0, &loss);
        double b = dt_time_now();
        if (!st) st = dt_gpu_lm_backward(m, 1.0f);
        double c = dt_time_now(), norm = 0;
        int skipped = 0;
        if (!st) st = dt_gpu_lm_step(m, &oc, 1e-4f, 1.0f, 0, &norm, &skipped);
        part[0] += b - a, part[1] += c - b, part[2] += dt_time_now() - c;
    }
    if (st) {
        fprintf(stderr, "gpu_lm_bench: %s\n", dt_last_error());
        return 1;
    }
    double sec = (dt_time_now() - t0) / steps, tps = BT / sec, flops = dt_program_flops_per_token(&cfg, T) * tps / 1e12;
    size_t fr = 0, tot = 0;
    dt_gpu_mem_info(g, &fr, &tot);
    printf("%s %s B %d T %d: %.1f ms a step, %.0f tokens/s, %.1f TFLOP/s of model FLOPs = %.0f%% of the %s ceiling, %.1f%% of the bf16 "
           "one; loss %.4f; %.1f GiB of the GPU in use\n",
           argv[1], mode, B, T, sec * 1e3, tps, flops, 100 * flops / f32, tf32 ? "tf32" : "f32", 100 * flops / bf16, loss, (tot - fr) / 1073741824.0);
    double lin = 0, att = 0;
    if (!st) st = time_parts(g, p, B, T, lp, dt_gpu_lm_flash(m), cudnn, &lin, &att);
    if (st) fprintf(stderr, "gpu_lm_bench: the parts: %s\n", dt_last_error());
    else
        printf("%s %s: a step %.1f ms = forward %.1f + backward %.1f + update %.1f; alone at its shapes: the Linears %.1f ms (%s), "
               "attention %.1f ms (%s), the rest (norms, activations, adds, embedding, loss, update, copies) %.1f ms\n",
               argv[1], mode, sec * 1e3, part[0] / steps * 1e3, part[1] / steps * 1e3, part[2] / steps * 1e3, lin, lp ? "bf16" : tf32 ? "tf32" : "f32",
               att, cudnn ? "cuDNN's, bf16" : dt_gpu_lm_flash(m) ? "flash, TF32" : tf32 ? "T x T, TF32" : "T x T, f32", sec * 1e3 - lin - att);
    dt_gpu_lm_destroy(m);
    dt_program_destroy(p);
    dt_gpu_close(g);
    free(x), free(y);
    return 0;
}
