/* Tensor parallelism against one process: every rank of the job is one
 * tensor-parallel rank of N (N = the job's size) and also builds the whole
 * model from the same seed, the oracle. Checked, for vocabularies that do
 * and do not divide by N (one so small that a rank holds only padding rows
 * is not needed: GPT-2's 50257 and an odd byte-level 257 padded to 260):
 * - each rank's slices hold the whole model's values at their places, and
 *   its runs into the whole model's store (the checkpoints' layout) too;
 * - over 20 SGD steps on the same batches, the loss within 1e-6 relative
 *   of the whole model's, and each tensor's gradient (this rank's slice
 *   against the same elements of the whole's) within 1e-5 of the tensor's
 *   largest gradient, with recomputation on and off;
 * - the padded vocabulary rows never get a gradient;
 * - the same with sequence parallelism (T = 24: 2 and 3 divide it);
 * - mixed precision (bf16, fp16, with and without sequence parallelism):
 *   the part starts each step from the whole model's weights (so what is
 *   compared is one step's arithmetic, not two trajectories), and its loss
 *   and gradients are within a few 16-bit roundings of the whole's: a sum
 *   over the group and one over the whole row differ in f32's last bits,
 *   and where that straddles a 16-bit rounding boundary the value moves by
 *   one 16-bit step (the same happens between data-parallel ranks);
 * - heads that do not divide by N are refused, naming the numbers.
 * Runs under dtrain launch -n N. */
#include "dtrain/parallel.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed, me;
#define CHECK(cond, ...) do { if (cond) passed++; else { failed++; printf("rank %d: FAIL ", me); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* The whole model's tensor with the same name as t. */
static const dt_tensor_info *same(const dt_gpt2 *whole, const dt_tensor_info *t) {
    int n;
    const dt_tensor_info *tab = dt_gpt2_tensors(whole, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(tab[i].name, t->name)) return &tab[i];
    return NULL;
}

/* Largest |part - whole| over t's elements, relative to the whole tensor's largest |value|. */
static double slice_error(const float *part, const float *whole, const dt_tensor_info *t, const dt_tensor_info *w) {
    double worst = 0, big = 0;
    for (size_t j = 0; j < w->count; j++) big = fmax(big, fabs(whole[w->offset + j]));
    for (size_t j = 0; j < t->count; j++) {
        double d = fabs((double)part[t->offset + j] - whole[w->offset + dt_tensor_global_index(t, j)]);
        worst = fmax(worst, d);
    }
    return big > 0 ? worst / big : worst;
}

typedef struct { const float *part, *whole; size_t bad, covered; } runs_check;

static void check_run(size_t lo, size_t go, size_t n, void *ctx) {
    runs_check *rc = ctx;
    rc->bad += memcmp(rc->part + lo, rc->whole + go, n * sizeof(float)) != 0;
    rc->covered += n;
}

static void sgd(float *p, const float *g, size_t n, float lr) {
    for (size_t i = 0; i < n; i++) p[i] -= lr * g[i];
}

static void run(dt_comm *tpc, int V, int Vp, int recompute, int sp, dt_dtype prec) {
    int N = dt_comm_size(tpc), B = 2, T = 24, BT = B * T;
    dt_gpt2_config cfg = { .max_seq_len = 32, .vocab_size = V, .padded_vocab_size = Vp, .num_layers = 2, .num_heads = 6, .channels = 48 };
    dt_tp_ops ops = dt_tp_ops_over(tpc);
    dt_model_part part = dt_gpt2_whole(&cfg);
    part.tp_rank = dt_comm_rank(tpc);
    part.tp_size = N;
    part.tp = &ops;
    part.sp = sp;
    dt_gpt2 *whole, *m;
    if (dt_gpt2_create(&cfg, &whole) || dt_gpt2_create_part(&cfg, &part, &m)) { CHECK(0, "create: %s", dt_last_error()); return; }
    dt_gpt2_set_recompute(whole, recompute);
    dt_gpt2_set_recompute(m, recompute);
    if (dt_gpt2_set_precision(whole, prec) || dt_gpt2_set_precision(m, prec)) { CHECK(0, "precision: %s", dt_last_error()); return; }
    dt_gpt2_init_random(whole, 7);
    dt_gpt2_init_random(m, 7);
    int nt;
    const dt_tensor_info *tab = dt_gpt2_tensors(m, &nt);
    double init = 0;
    for (int i = 0; i < nt; i++) init = fmax(init, slice_error(dt_gpt2_params(m), dt_gpt2_params(whole), &tab[i], same(whole, &tab[i])));
    CHECK(init == 0, "V %d: a slice's initial values differ from the whole model's by %g", V, init);
    /* the runs into the whole model's store (the checkpoints' layout) hold the same values and cover the part once */
    dt_model view;
    dt_gpt2_model(m, &view);
    runs_check rc = { dt_gpt2_params(m), dt_gpt2_params(whole), 0, 0 };
    dt_model_global_runs(&view, 0, view.nparams, check_run, &rc);
    CHECK(rc.bad == 0 && rc.covered == view.nparams && dt_model_global_params(&view) == dt_gpt2_num_params(whole),
          "V %d: global runs: %zu floats differ, %zu of %zu covered", V, rc.bad, rc.covered, view.nparams);
    CHECK(dt_gpt2_num_params(m) < dt_gpt2_num_params(whole), "V %d: the part holds %zu of %zu parameters", V,
          dt_gpt2_num_params(m), dt_gpt2_num_params(whole));

    int32_t *in = malloc(BT * sizeof *in), *tg = malloc(BT * sizeof *tg);
    double worst_loss = 0, worst_grad = 0;
    const char *worst_name = "";
    int padded_touched = 0;
    for (int step = 0; step < 20; step++) {
        for (int i = 0; i < BT; i++) { /* a new batch each step, the same on every rank */
            in[i] = (int)((uint32_t)(i * 2654435761u + (uint32_t)step * 40503u) % (uint32_t)V);
            tg[i] = (int)((uint32_t)(i * 97u + (uint32_t)step * 31u + 5u) % (uint32_t)V);
        }
        float lw = 0, lp = 0;
        dt_gpt2_zero_grad(whole);
        dt_gpt2_zero_grad(m);
        dt_status st = prec == DT_F32 ? DT_OK : dt_gpt2_copy_slices(whole, m); /* 16 bits: one step's arithmetic */
        if (!st) st = dt_gpt2_forward(whole, in, tg, B, T, &lw);
        if (!st) st = dt_gpt2_backward(whole, 1.0f);
        if (!st) st = dt_gpt2_forward(m, in, tg, B, T, &lp);
        if (!st) st = dt_gpt2_backward(m, 1.0f);
        if (st) { CHECK(0, "step %d: %s", step, dt_last_error()); break; }
        worst_loss = fmax(worst_loss, fabs((double)lp - lw) / fabs((double)lw));
        for (int i = 0; i < nt; i++) {
            double e = slice_error(dt_gpt2_grads(m), dt_gpt2_grads(whole), &tab[i], same(whole, &tab[i]));
            if (e > worst_grad) worst_grad = e, worst_name = tab[i].name;
        }
        const dt_tensor_info *wte = dt_model_find(&(dt_model){ .tensors = tab, .ntensors = nt }, "wte");
        for (size_t j = 0; j < wte->count; j++)
            if (dt_tensor_global_index(wte, j) >= (size_t)V * cfg.channels && dt_gpt2_grads(m)[wte->offset + j] != 0) padded_touched++;
        sgd(dt_gpt2_params(whole), dt_gpt2_grads(whole), dt_gpt2_num_params(whole), 0.05f);
        sgd(dt_gpt2_params(m), dt_gpt2_grads(m), dt_gpt2_num_params(m), 0.05f);
    }
    char how[96];
    snprintf(how, sizeof how, "%s%s%s%s", prec == DT_F32 ? "" : ", ", prec == DT_F32 ? "" : dt_precision_name(prec),
             sp ? ", sequence parallel" : "", recompute ? ", recomputing" : "");
    /* f32: the sums' order only; 16 bits: a value that rounds the other way moves by 2^-8 (bf16) or 2^-11 (fp16) of itself */
    double tol_loss = prec == DT_F32 ? 1e-6 : 1e-5, tol_grad = prec == DT_F32 ? 1e-5 : prec == DT_BF16 ? 2e-2 : 4e-3;
    CHECK(worst_loss <= tol_loss, "TP %d, V %d%s: loss differs from one process by %.3g relative", N, V, how, worst_loss);
    CHECK(worst_grad <= tol_grad, "TP %d, V %d%s: %s's gradient differs by %.3g of its largest", N, V, how, worst_name, worst_grad);
    CHECK(padded_touched == 0, "TP %d, V %d: %d padded vocabulary entries got a gradient", N, V, padded_touched);
    if (me == 0)
        printf("TP %d, V %d (Vp %d)%s: 20 steps, worst loss difference %.3g relative, worst gradient %.3g (%s)\n", N, V, Vp, how,
               worst_loss, worst_grad, worst_name);
    free(in);
    free(tg);
    dt_gpt2_destroy(m);
    dt_gpt2_destroy(whole);
}

int main(void) {
    dt_comm *w;
    if (dt_comm_init(&w)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    me = dt_comm_rank(w);
    dt_kernels_set_threads(1);
    run(w, 257, 260, 0, 0, DT_F32);
    run(w, 257, 260, 1, 0, DT_F32);
    run(w, 50257, 50304, 0, 0, DT_F32);
    run(w, 257, 260, 0, 1, DT_F32);
    run(w, 257, 260, 1, 1, DT_F32);
    run(w, 50257, 50304, 0, 1, DT_F32);
    run(w, 257, 260, 0, 0, DT_BF16);
    run(w, 257, 260, 0, 1, DT_BF16);
    run(w, 50257, 50304, 1, 1, DT_BF16);
    run(w, 257, 260, 0, 0, DT_F16);
    run(w, 257, 260, 0, 1, DT_F16);
    /* heads that do not divide: refused before anything is built */
    dt_gpt2_config cfg = { .max_seq_len = 32, .vocab_size = 257, .padded_vocab_size = 260, .num_layers = 2, .num_heads = 6, .channels = 48 };
    dt_tp_ops ops = dt_tp_ops_over(w);
    dt_model_part part = { .ua = 0, .ub = 4, .tp_rank = 0, .tp_size = 4, .tp = &ops };
    dt_gpt2 *bad = NULL;
    dt_status st = dt_gpt2_create_part(&cfg, &part, &bad);
    CHECK(st && !bad && strstr(dt_last_error(), "--tp 4 does not divide the 6 attention heads"), "tp 4 over 6 heads: %s",
          st ? dt_last_error() : "accepted");
    int all[2] = { passed, failed }, sum[2];
    dt_comm_allreduce(w, all, sum, 2, DT_I32, DT_SUM);
    if (me == 0) printf("tensor parallelism on %d ranks: %d passed, %d failed\n", dt_comm_size(w), sum[0], sum[1]);
    dt_comm_destroy(w);
    return sum[1] != 0;
}
