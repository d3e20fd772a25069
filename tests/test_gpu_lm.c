/* The model program on the GPU against the same program on the CPU, in the same precision (f32, or bf16: autocast's
 * mixed precision on both, the GPU's Linears on its tensor cores): one model (a preset, dtrain's seeded
 * initialisation), the same batches (seeded tokens), the same AdamW; each step's loss within tol relative, and the
 * first step's gradients and the last step's parameters within 1e-4 relative (the sums run in another order, and
 * AdamW divides by the gradients' square roots, which grows small differences in small gradients). Needs a GPU
 * (bench/gpu_check.sh runs it). In bf16 the gradients, their norm and the parameters are held to gtol (default
 * 1e-4): each rounding to bf16 turns a difference in the last bits of an f32 sum into a whole bf16 step (2^-8) now and
 * then, and layer by layer these grow towards that step. With the host's kernels (test_gpu_lm_host) the sums run in
 * the CPU's order and bf16 is exact too where the head's product is one piece: VOCAB, a vocabulary of that many
 * scored tokens (the CPU's 16-bit head sums the vocabulary in chunks; a cuBLAS or oneDNN product in one piece).
 * With floor, a second CPU run from weights one f32 step apart (each nudged up by its last bit: the size of what a
 * sum in another order changes) says how far the arithmetic alone carries two runs apart in these steps: the spread
 * any two implementations of it share.
 * With flash, attention keeps each row's log-sum-exp on both (the CPU's blockwise kernels, the GPU's flash.cu); with
 * cudnn, the GPU's is cuDNN's fused attention (bf16 only) against the CPU's blockwise kernels.
 * usage: test_gpu_lm PRESET[:VOCAB] B T STEPS [tol=X] [bf16] [gtol=X] [lr=X] [floor] [flash|cudnn] */
#include "gpu_check.h"

#include "dtrain/gpu_lm.h"
#include "dtrain/optim.h"

static void batch(int32_t *x, int32_t *y, int n, int V, int step) {
    uint64_t s = 0x51ed27a3ull + (uint64_t)step * 0x9e3779b97f4a7c15ull;
    for (int i = 0; i <= n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        int32_t t = (int32_t)((s >> 33) % (uint64_t)V);
        if (i < n) x[i] = t;
        if (i > 0) y[i - 1] = t;
    }
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: test_gpu_lm PRESET[:VOCAB] B T STEPS [tol=X] [bf16] [gtol=X] [lr=X] [floor] [flash|cudnn]\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]);
    double tol = 1e-5, gtol = 1e-4;
    float lr = 1e-3f;
    bool bf16 = false, floor_run = false, flash = false, cudnn = false;
    for (int i = 5; i < argc; i++) {
        if (!strncmp(argv[i], "tol=", 4)) tol = atof(argv[i] + 4);
        else if (!strncmp(argv[i], "gtol=", 5)) gtol = atof(argv[i] + 5);
        else if (!strncmp(argv[i], "lr=", 3)) lr = (float)atof(argv[i] + 3);
        else if (!strcmp(argv[i], "bf16")) bf16 = true;
        else if (!strcmp(argv[i], "floor")) floor_run = true;
        else if (!strcmp(argv[i], "flash")) flash = true;
        else if (!strcmp(argv[i], "cudnn")) cudnn = true;
        else {
            fprintf(stderr, "test_gpu_lm: %s: expected tol=X, bf16, gtol=X, lr=X, floor, flash or cudnn\n", argv[i]);
            return 2;
        }
    }
    dt_lm_config cfg;
    dt_program *p = NULL, *p2 = NULL; /* p2: floor's second CPU run */
    dt_gpu *g = NULL;
    dt_gpu_lm *m = NULL;
    dt_optim *o = NULL, *o2 = NULL;
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.1f;
    char preset[64];
    snprintf(preset, sizeof preset, "%s", argv[1]);
    char *vocab = strchr(preset, ':'); /* PRESET:V, the preset with a vocabulary of V */
    if (vocab) *vocab++ = 0;
    dt_status st = dt_lm_preset(preset, &cfg);
    if (!st && vocab) cfg.vocab_size = atoi(vocab);
    if (!st) st = dt_program_create(&cfg, &p);
    if (!st) dt_program_init_random(p, 1337);
    if (!st && bf16) st = dt_program_set_precision(p, DT_BF16);
    /* cudnn: the program's CPU side runs it as blockwise (dt_program_attention_lse), its GPU side through cuDNN */
    dt_attn_mode att = cudnn ? DT_ATTN_CUDNN : flash ? DT_ATTN_BLOCKWISE : DT_ATTN_FULL;
    if (!st) dt_program_set_attention(p, att);
    if (!st) st = dt_program_reserve(p, B, T);
    if (!st && floor_run) st = dt_program_create(&cfg, &p2);
    if (!st && p2) {
        dt_program_init_random(p2, 1337);
        float *w2 = dt_program_params(p2);
        for (size_t i = 0; i < dt_program_num_params(p2); i++) w2[i] = nextafterf(w2[i], INFINITY);
    }
    if (!st && p2 && bf16) st = dt_program_set_precision(p2, DT_BF16);
    if (!st && p2) dt_program_set_attention(p2, att);
    if (!st && p2) st = dt_program_reserve(p2, B, T);
    if (!st) st = dt_gpu_open(0, &g);
    if (!st) st = dt_gpu_lm_create(g, p, B, T, &m);
    size_t n = p ? dt_program_num_params(p) : 0;
    if (!st) st = dt_optim_create(&oc, n, NULL, 0, &o);
    if (!st && p2) st = dt_optim_create(&oc, n, NULL, 0, &o2);
    if (st) {
        fprintf(stderr, "test_gpu_lm: %s\n", dt_last_error());
        return 1;
    }
    printf("%s on %s: %zu parameters, B %d x T %d, %d steps of AdamW (lr %g, weight decay 0.1, clipped at 1), %s%s\n", argv[1],
           dt_gpu_name(g), n, B, T, steps, lr, bf16 ? "bf16" : "f32", cudnn ? ", cuDNN's attention" : flash ? ", flash attention" : "");
    int32_t *x = malloc((size_t)B * T * 4), *y = malloc((size_t)B * T * 4);
    float *gpu_grads = malloc(n * 4), *gpu_params = malloc(n * 4);
    double worst = 0, norm_worst = 0, spread = 0, norm_spread = 0, n2 = 0;
    for (int s = 0; s < steps && !st; s++) {
        batch(x, y, B * T, cfg.vocab_size, s);
        float lc = 0, lg = 0;
        dt_program_zero_grad(p);
        st = dt_program_forward(p, x, y, B, T, &lc);
        if (!st) st = dt_program_backward(p, 1.0f);
        if (!st) st = dt_gpu_lm_zero_grad(m);
        if (!st) st = dt_gpu_lm_forward(m, x, y, 0, &lg);
        if (!st) st = dt_gpu_lm_backward(m, 1.0f);
        if (st) break;
        if (s == 0) {
            st = dt_gpu_lm_download(m, NULL, gpu_grads);
            report_err("step 1: every gradient, GPU against CPU", rel_err(gpu_grads, dt_program_grads(p), n), gtol);
        }
        double e = fabs((double)lg - lc) / fabs((double)lc);
        worst = fmax(worst, e);
        printf("step %2d  loss cpu %.7f  gpu %.7f  relative %.2e", s + 1, lc, lg, e);
        if (p2) { /* the same step on the CPU from the nudged weights */
            float l2 = 0;
            dt_program_zero_grad(p2);
            st = dt_program_forward(p2, x, y, B, T, &l2);
            if (!st) st = dt_program_backward(p2, 1.0f);
            if (!st) n2 = dt_optim_step_clipped(o2, dt_program_params(p2), dt_program_grads(p2), lr, 1.0f);
            spread = fmax(spread, fabs((double)l2 - lc) / fabs((double)lc));
            printf("  cpu nudged %.7f (%.2e)", l2, fabs((double)l2 - lc) / fabs((double)lc));
        }
        printf("\n");
        double nc = dt_optim_step_clipped(o, dt_program_params(p), dt_program_grads(p), lr, 1.0f), ng = 0;
        int skipped = 0;
        if (!st) st = dt_gpu_lm_step(m, &oc, lr, 1.0f, 0, &ng, &skipped);
        norm_worst = fmax(norm_worst, fabs(ng - nc) / nc);
        if (p2) norm_spread = fmax(norm_spread, fabs(n2 - nc) / nc);
    }
    if (st) {
        check("the steps ran", false, dt_last_error());
    } else {
        char what[96];
        snprintf(what, sizeof what, "%d steps: each step's loss, GPU against CPU", steps);
        report_err(what, worst, tol);
        if (p2)
            printf("the floor: the CPU from weights one f32 step apart against the CPU, worst %.2e over the steps' losses, %.2e over their "
                   "gradient norms\n", spread, norm_spread);
        report_err("each step's gradient norm (clipped at 1), GPU against CPU", norm_worst, gtol);
        st = dt_gpu_lm_download(m, gpu_params, NULL);
        report_err("the parameters after the last step", st ? INFINITY : rel_err(gpu_params, dt_program_params(p), n), gtol);
    }
    dt_optim_destroy(o);
    dt_optim_destroy(o2);
    dt_program_destroy(p2);
    dt_gpu_lm_destroy(m);
    dt_gpu_close(g);
    dt_program_destroy(p);
    free(x), free(y), free(gpu_grads), free(gpu_params);
    return failed != 0;
}
