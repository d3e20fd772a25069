/* The model program under tensor and context parallelism against one process. Tensor parallelism: every rank of the job is one
 * tensor-parallel rank of N (the job's size) and also runs the whole model, the oracle, from the same
 * weights. For Llama with grouped-query attention (K/V heads split, and K/V heads fewer than the ranks, kept
 * by several), multi-query attention, tied and untied heads, Qwen 2's q/k/v biases, Qwen 3's head norms (their
 * weights' gradients summed over the ranks' heads), and the GPT-2 spec (a
 * row-parallel bias on one rank), all with a vocabulary of 101 that no N divides, over 20 SGD steps:
 * the loss within 1e-6 relative of the whole model's at every step, and each tensor's gradient (this rank's
 * slice against the same elements of the whole's) within 1e-5 of the tensor's largest at the first step (the
 * same weights) and 1e-4 over the 20 (two trajectories that drift apart in f32's last bits). A layout the split
 * cannot serve is refused, naming the numbers. The same with sequence parallelism. Context parallelism (ring and all-to-all): each rank holds 24/N
 * rows of each sequence in the load-balanced split (rotary positions by their place in the whole sequence),
 * and the mean of the ranks' losses and of their gradients (what data and context parallelism reduce) equals
 * the whole model's within the same bounds. Runs under dtrain launch -n N. */
#include "dtrain/context.h"
#include "dtrain/parallel.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed, me;

static void check(bool ok, const char *fmt, const char *what, double x) {
    if (ok) passed++;
    else {
        failed++;
        printf("rank %d: FAIL ", me);
        printf(fmt, what, x);
        printf("\n");
    }
}

typedef struct { float *part; const float *whole; } copy_ctx;
static void copy_run(size_t lo, size_t go, size_t n, void *ctx) {
    copy_ctx *c = ctx;
    memcpy(c->part + lo, c->whole + go, n * sizeof(float));
}

/* Largest |part - whole| over t's elements, relative to the whole tensor's largest |value|. */
static double slice_error(const float *part, const float *whole, const dt_tensor_info *t, const dt_tensor_info *w) {
    double worst = 0, big = 0;
    for (size_t j = 0; j < w->count; j++) big = fmax(big, fabs(whole[w->offset + j]));
    for (size_t j = 0; j < t->count; j++) worst = fmax(worst, fabs((double)part[t->offset + j] - whole[w->offset + dt_tensor_global_index(t, j)]));
    return big > 0 ? worst / big : worst;
}

/* mode: 0 plain, 1 recomputing, 2 backward split in B and W */
static void run(dt_comm *w, const char *what, const char *family, int NH, int KV, bool tied, int sp, int mode) {
    int N = dt_comm_size(w), B = 2, T = 12, BT = B * T;
    dt_lm_config c = { .family = dt_family_find(family), .vocab_size = 101, .padded_vocab_size = 128, .max_seq_len = 32, .num_layers = 2,
                       .num_heads = NH, .kv_heads = KV, .head_dim = 8, .channels = NH * 8, .ffn = !strcmp(family, "gpt2") ? NH * 32 : 120,
                       .norm_eps = 1e-5f, .rope_theta = 10000, .untied = !tied };
    dt_tp_ops ops = dt_tp_ops_over(w);
    dt_model_part part = { .ua = 0, .ub = c.num_layers + 2, .tp_rank = dt_comm_rank(w), .tp_size = N, .tp = &ops, .sp = sp };
    dt_program *whole = NULL, *m = NULL;
    if (dt_program_create(&c, &whole) || dt_program_create_part(&c, &part, &m)) {
        check(0, "%s: create: %g", what, 0);
        if (me == 0) printf("%s: %s\n", what, dt_last_error());
        dt_program_destroy(whole);
        return;
    }
    if (mode == 1) dt_program_set_recompute(m, 1);
    if (mode == 2) dt_program_set_split_backward(m, 1);
    dt_model vw, vm;
    dt_program_model(whole, &vw);
    dt_program_model(m, &vm);
    /* weights from a seed, then every value moved by its index, so that norms and biases are not 1s and 0s */
    dt_program_init_random(whole, 11);
    float *pw = vw.params(vw.self);
    for (size_t j = 0; j < vw.nparams; j++) pw[j] += 0.05f * sinf((float)j * 0.37f);
    for (int i = 0; i < vw.ntensors; i++) /* but the padded vocabulary rows stay zero */
        if (vw.tensors[i].split == DT_SPLIT_VOCAB)
            memset(pw + vw.tensors[i].offset + (size_t)c.vocab_size * c.channels, 0,
                   (size_t)(c.padded_vocab_size - c.vocab_size) * c.channels * sizeof(float));
    copy_ctx cc = { vm.params(vm.self), pw };
    dt_model_global_runs(&vm, 0, vm.nparams, copy_run, &cc);
    /* Qwen 3's steps at a fifth of the others' rate: at 0.05 its trajectory is chaotic (one process against itself
     * with every weight moved by 1e-7 of itself drifted to 1e-4 of a gradient in 20 steps; Llama's 9e-6) */
    float lr = !strcmp(family, "qwen3") ? 0.01f : 0.05f;
    int32_t *in = malloc(BT * sizeof *in), *tg = malloc(BT * sizeof *tg);
    double worst_loss = 0, worst_grad = 0, first_grad = 0;
    const char *worst_name = "";
    for (int step = 0; step < 20; step++) {
        for (int i = 0; i < BT; i++) {
            in[i] = (int)((uint32_t)(i * 2654435761u + (uint32_t)step * 40503u) % 101u);
            tg[i] = (int)((uint32_t)(i * 97u + (uint32_t)step * 31u + 5u) % 101u);
        }
        float lw = 0, lp = 0;
        dt_program_zero_grad(whole);
        dt_program_zero_grad(m);
        dt_status st = dt_program_forward(whole, in, tg, B, T, &lw);
        if (!st) st = dt_program_backward(whole, 1.0f);
        if (!st) st = dt_program_forward(m, in, tg, B, T, &lp);
        if (!st) st = dt_program_backward(m, 1.0f);
        if (!st && mode == 2) st = dt_program_backward_weights(m);
        if (st) {
            check(0, "%s: step failed %g", what, step);
            printf("%s\n", dt_last_error());
            break;
        }
        worst_loss = fmax(worst_loss, fabs((double)lp - lw) / fabs((double)lw));
        for (int i = 0; i < vm.ntensors; i++) {
            const dt_tensor_info *t = &vm.tensors[i];
            double e = slice_error(vm.grads(vm.self), vw.grads(vw.self), t, dt_model_find(&vw, t->name));
            if (e > worst_grad) worst_grad = e, worst_name = t->name;
            if (step == 0) first_grad = fmax(first_grad, e);
        }
        float *p1 = vw.params(vw.self), *g1 = vw.grads(vw.self), *p2 = vm.params(vm.self), *g2 = vm.grads(vm.self);
        for (size_t j = 0; j < vw.nparams; j++) p1[j] -= lr * g1[j];
        for (size_t j = 0; j < vm.nparams; j++) p2[j] -= lr * g2[j];
    }
    check(worst_loss <= 1e-6, "%s: loss differs from one process by %.3g relative", what, worst_loss);
    /* the first step compares one step's arithmetic on the same weights; later steps compare two trajectories whose
     * weights drift apart in f32's last bits (a norm's weight gradient, a sum over every row, shows it most) */
    check(first_grad <= 1e-5, "%s: a first step's gradient differs by %.3g of its largest", what, first_grad);
    check(worst_grad <= 1e-4, "%s: a gradient differs by %.3g of its largest", what, worst_grad);
    if (me == 0)
        printf("TP %d%s%s, %-40s 20 steps: worst loss difference %.2e relative, worst gradient %.2e (%s; %.2e at step 1)\n", N, sp ? " SP" : "", mode == 1 ? " recompute" : mode == 2 ? " B/W" : "", what,
               worst_loss, worst_grad, worst_name, first_grad);
    free(in);
    free(tg);
    dt_program_destroy(m);
    dt_program_destroy(whole);
}

/* Context parallelism: rank r of N holds T/N rows a sequence; the ranks' mean loss and mean gradient against the whole's. */
static void run_cp(dt_comm *w, const char *what, const char *family, int KV, bool tied, dt_cp_impl impl) {
    int N = dt_comm_size(w), B = 2, T = 24, BT = B * T, Tl = T / N;
    dt_lm_config c = { .family = dt_family_find(family), .vocab_size = 101, .padded_vocab_size = 128, .max_seq_len = 32, .num_layers = 2,
                       .num_heads = 12, .kv_heads = KV, .head_dim = 8, .channels = 96, .ffn = !strcmp(family, "gpt2") ? 384 : 120,
                       .norm_eps = 1e-5f, .rope_theta = 10000, .untied = !tied };
    dt_cp *cpx = NULL;
    dt_program *whole = NULL, *m = NULL;
    dt_status st = dt_cp_create(w, impl, DT_PP_WIRE_F32, &cpx);
    dt_model_part part = { .ua = 0, .ub = c.num_layers + 2, .tp_size = 1, .cp_rank = dt_comm_rank(w), .cp_size = N,
                          .cp = cpx ? dt_cp_model_ops(cpx) : NULL };
    if (!st) st = dt_program_create(&c, &whole);
    if (!st) st = dt_program_create_part(&c, &part, &m);
    if (st) {
        check(0, "%s: create: %g", what, 0);
        if (me == 0) printf("%s: %s\n", what, dt_last_error());
        dt_program_destroy(whole);
        dt_cp_destroy(cpx);
        return;
    }
    dt_program_init_random(whole, 3);
    dt_program_init_random(m, 3);
    dt_model vw, vm;
    dt_program_model(whole, &vw);
    dt_program_model(m, &vm);
    int32_t *in = malloc(BT * sizeof *in), *tg = malloc(BT * sizeof *tg), *inl = malloc(BT * sizeof *inl), *tgl = malloc(BT * sizeof *tgl);
    float *g = malloc(vm.nparams * sizeof(float));
    double worst_loss = 0, worst_grad = 0;
    for (int step = 0; step < 5 && !st; step++) {
        for (int i = 0; i < BT; i++) {
            in[i] = (int)((uint32_t)(i * 2654435761u + (uint32_t)step * 40503u) % 101u);
            tg[i] = (int)((uint32_t)(i * 97u + (uint32_t)step * 31u + 5u) % 101u);
        }
        memcpy(inl, in, BT * sizeof *in);
        memcpy(tgl, tg, BT * sizeof *tg);
        dt_gpt2_cp_rows(inl, B, T, dt_comm_rank(w), N);
        dt_gpt2_cp_rows(tgl, B, T, dt_comm_rank(w), N);
        float lw = 0, lp = 0, lsum = 0;
        dt_program_zero_grad(whole);
        dt_program_zero_grad(m);
        st = dt_program_forward(whole, in, tg, B, T, &lw);
        if (!st) st = dt_program_backward(whole, 1.0f);
        if (!st) st = dt_program_forward(m, inl, tgl, B, Tl, &lp);
        if (!st) st = dt_program_backward(m, 1.0f);
        if (!st) st = dt_comm_allreduce(w, &lp, &lsum, 1, DT_F32, DT_SUM);
        if (!st) st = dt_comm_allreduce(w, vm.grads(vm.self), g, vm.nparams, DT_F32, DT_SUM);
        if (st) break;
        worst_loss = fmax(worst_loss, fabs((double)lsum / N - lw) / fabs((double)lw));
        for (size_t j = 0; j < vm.nparams; j++) g[j] /= (float)N;
        for (int i = 0; i < vm.ntensors; i++) {
            const dt_tensor_info *t = &vm.tensors[i];
            worst_grad = fmax(worst_grad, slice_error(g, vw.grads(vw.self), t, dt_model_find(&vw, t->name)));
        }
    }
    if (st) {
        check(0, "%s: a step failed %g", what, 0);
        printf("%s\n", dt_last_error());
    }
    check(worst_loss <= 1e-6, "%s: loss differs from one process by %.3g relative", what, worst_loss);
    check(worst_grad <= 1e-5, "%s: a gradient differs by %.3g of its largest", what, worst_grad);
    if (me == 0) printf("CP %d, %-40s 5 steps: worst loss difference %.2e relative, worst gradient %.2e\n", N, what, worst_loss, worst_grad);
    free(in), free(tg), free(inl), free(tgl), free(g);
    dt_program_destroy(m);
    dt_program_destroy(whole);
    dt_cp_destroy(cpx);
}

/* Mixed precision under tensor (and sequence) parallelism, GPT-2 and Llama (2 K/V heads, split or kept; untied):
 * one step from the same weights is within a few 16-bit roundings of one process's (a sum over the group and one over
 * the whole row differ in f32's last bits; where that straddles a rounding boundary a value moves by one 16-bit
 * step: loss 1e-5, gradients 2e-2 of the largest in bf16). */
static void run_lp(dt_comm *w, const char *family, int sp) {
    int N = dt_comm_size(w), B = 2, T = 12, BT = B * T;
    bool llama = strcmp(family, "gpt2") != 0; /* (Llama's block, or Qwen 3's) */
    dt_tp_ops ops = dt_tp_ops_over(w);
    dt_lm_config c = { .family = dt_family_find(family), .vocab_size = 101, .padded_vocab_size = 128, .max_seq_len = 32, .num_layers = 2,
                       .num_heads = 12, .kv_heads = llama ? (N == 3 ? 6 : 2) : 12, .head_dim = 8, .channels = 96, .ffn = llama ? 120 : 384,
                       .norm_eps = 1e-5f, .rope_theta = 10000, .untied = llama };
    dt_model_part part = { .ua = 0, .ub = 4, .tp_rank = dt_comm_rank(w), .tp_size = N, .tp = &ops, .sp = sp };
    dt_program *lw = NULL, *lm = NULL;
    int32_t in[64], tg[64];
    for (int i = 0; i < BT; i++) in[i] = (i * 37 + 11) % 101, tg[i] = (i * 13 + 5) % 101;
    float l1 = 0, l2 = 0;
    dt_status st = dt_program_create(&c, &lw);
    if (!st) st = dt_program_create_part(&c, &part, &lm);
    if (!st) st = dt_program_set_precision(lw, DT_BF16);
    if (!st) st = dt_program_set_precision(lm, DT_BF16);
    double worst_loss = 0, worst_grad = 0;
    if (!st) {
        dt_program_init_random(lw, 8);
        dt_program_init_random(lm, 8);
        if (!(st = dt_program_forward(lw, in, tg, B, T, &l1))) st = dt_program_backward(lw, 1.0f);
        if (!st && !(st = dt_program_forward(lm, in, tg, B, T, &l2))) st = dt_program_backward(lm, 1.0f);
    }
    if (!st) {
        dt_model vw, vm;
        dt_program_model(lw, &vw);
        dt_program_model(lm, &vm);
        worst_loss = fabs((double)l2 - l1) / fabs((double)l1);
        for (int i = 0; i < vm.ntensors; i++) {
            const dt_tensor_info *t = &vm.tensors[i];
            worst_grad = fmax(worst_grad, slice_error(vm.grads(vm.self), vw.grads(vw.self), t, dt_model_find(&vw, t->name)));
        }
        check(worst_loss <= 1e-5, "%s: bf16 loss differs from one process by %.3g", family, worst_loss);
        check(worst_grad <= 2e-2, "%s: a bf16 gradient differs by %.3g of its largest", family, worst_grad);
        if (me == 0)
            printf("TP %d%s bf16, %s %d K/V heads: loss %.2e relative, worst gradient %.2e of its largest\n", N, sp ? " SP" : "", family,
                   c.kv_heads, worst_loss, worst_grad);
    } else {
        check(0, "%s: bf16 run failed %g", family, 0);
        printf("%s\n", dt_last_error());
    }
    dt_program_destroy(lw);
    dt_program_destroy(lm);
}

/* K/V heads and ranks where neither divides the other: refused before anything is built. */
static void refused(dt_comm *w, int NH, int KV) {
    int N = dt_comm_size(w);
    dt_lm_config c = { .family = dt_family_find("llama"), .vocab_size = 101, .padded_vocab_size = 128, .max_seq_len = 32, .num_layers = 2,
                       .num_heads = NH, .kv_heads = KV, .head_dim = 8, .channels = NH * 8, .ffn = 120, .norm_eps = 1e-5f,
                       .rope_theta = 10000 };
    dt_tp_ops ops = dt_tp_ops_over(w);
    dt_model_part part = { .ua = 0, .ub = 4, .tp_rank = dt_comm_rank(w), .tp_size = N, .tp = &ops };
    dt_program *m = NULL;
    dt_status st = dt_program_create_part(&c, &part, &m);
    char want[96];
    snprintf(want, sizeof want, "--tp %d and the %d K/V heads", N, KV);
    check(st && !m && strstr(dt_last_error(), want), "%s refused: %g", want, 0);
    if (me == 0) printf("TP %d, %d K/V heads: %s\n", N, KV, st ? dt_last_error() : "accepted");
    dt_program_destroy(m);
}

int main(void) {
    dt_comm *w;
    if (dt_comm_init(&w)) {
        fprintf(stderr, "init: %s\n", dt_last_error());
        return 1;
    }
    me = dt_comm_rank(w);
    int N = dt_comm_size(w);
    dt_kernels_set_threads(1);
    for (int sp = 0; sp < 2; sp++) {
        if (6 % N == 0) run(w, "llama, 12 heads, 6 K/V heads, untied", "llama", 12, 6, false, sp, 0);
        else if (!sp) refused(w, 12, 6);
        if (N != 3) run(w, "llama, 12 heads, 2 K/V heads, tied", "llama", 12, 2, true, sp, 0);
        else if (!sp) refused(w, 12, 2);
        run(w, "llama, multi-query (1 K/V head), untied", "llama", 12, 1, false, sp, 0);
        if (6 % N == 0) run(w, "qwen2 (q/k/v biases), 6 K/V heads, tied", "qwen2", 12, 6, true, sp, 0);
        if (N != 3) run(w, "qwen3 (head norms), 2 K/V heads, tied", "qwen3", 12, 2, true, sp, 0);
        run(w, "qwen3 (head norms), multi-query, untied", "qwen3", 12, 1, false, sp, 2);
        run(w, "the gpt2 spec, 12 heads", "gpt2", 12, 12, true, sp, 0);
        run(w, "llama, multi-query, untied", "llama", 12, 1, false, sp, 1);
        run(w, "llama, multi-query, untied", "llama", 12, 1, false, sp, 2);
        run(w, "the gpt2 spec, 12 heads", "gpt2", 12, 12, true, sp, 2);
    }
    for (int sp = 0; sp < 2; sp++) {
        run_lp(w, "gpt2", sp);
        run_lp(w, "llama", sp);
        run_lp(w, "qwen3", sp);
    }
    run_cp(w, "llama, 2 K/V heads, untied, ring", "llama", 2, false, DT_CP_RING);
    run_cp(w, "llama, 2 K/V heads, untied, all-to-all", "llama", 2, false, DT_CP_ULYSSES);
    run_cp(w, "qwen3, 2 K/V heads, untied, ring", "qwen3", 2, false, DT_CP_RING);
    run_cp(w, "the gpt2 spec, ring", "gpt2", 12, true, DT_CP_RING);
    run_cp(w, "the gpt2 spec, all-to-all", "gpt2", 12, true, DT_CP_ULYSSES);
    int all[2] = { passed, failed }, sum[2] = { 0, 1 };
    /* a rank whose count does not arrive says why (its exit status alone named no cause once: rank 3 of 4, all checks
     * passed on rank 0's count) */
    if (dt_comm_allreduce(w, all, sum, 2, DT_I32, DT_SUM)) printf("rank %d: the checks' count was not summed: %s\n", me, dt_last_error());
    if (me == 0) printf("model program, tensor and context parallelism on %d ranks: %d passed, %d failed\n", N, sum[0], sum[1]);
    if (sum[1]) printf("rank %d: %d of its own checks failed\n", me, failed);
    dt_status st = dt_comm_destroy(w);
    if (st) printf("rank %d: leaving the job: %s\n", me, dt_last_error());
    return sum[1] != 0 || st;
}
