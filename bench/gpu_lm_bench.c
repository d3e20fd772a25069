/* The GPU's ceilings (an 8192^3 product in f32 and in bf16, a 4 GiB device copy), then the model program's training
 * step on it: a preset at B x T, forward, backward and AdamW, timed over steps after two warm-up steps (the device
 * synchronised at the ends): tokens/s, and model FLOPs (dt_program_flops_per_token) per second against the measured
 * f32 ceiling and against the bf16 one (MFU as it is usually quoted).
 * With tf32, the f32 matmuls run on the tensor cores in TF32 (the ceilings too).
 * usage: gpu_lm_bench PRESET B T STEPS [tf32] */
#include "dtrain/base.h"
#include "dtrain/gpu_lm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: gpu_lm_bench PRESET B T STEPS [tf32]\n");
        return 2;
    }
    int B = atoi(argv[2]), T = atoi(argv[3]), steps = atoi(argv[4]), tf32 = argc > 5 && !strcmp(argv[5], "tf32");
    const char *mode = tf32 ? "tf32" : "f32";
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
    printf("ceilings: %s GEMM %.1f TFLOP/s, bf16 GEMM %.1f TFLOP/s (8192^3, random values), copy %.0f GB/s (read + written)\n", mode, f32, bf16,
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
    if (!st) st = dt_gpu_lm_create(g, p, B, T, &m);
    if (st) {
        fprintf(stderr, "gpu_lm_bench: %s\n", dt_last_error());
        return 1;
    }
    size_t BT = (size_t)B * T;
    int32_t *x = malloc(BT * 4), *y = malloc(BT * 4);
    for (size_t i = 0; i < BT; i++) x[i] = (int32_t)((i * 7919) % (size_t)cfg.vocab_size), y[i] = (int32_t)((i * 104729 + 1) % (size_t)cfg.vocab_size);
    float loss = 0;
    double t0 = 0;
    for (int s = 0; s < steps + 2 && !st; s++) {
        if (s == 2) t0 = dt_time_now();
        st = dt_gpu_lm_forward(m, x, y, 0, &loss);
        if (!st) st = dt_gpu_lm_backward(m, 1.0f);
        double norm = 0;
        int skipped = 0;
        if (!st) st = dt_gpu_lm_step(m, &oc, 1e-4f, 1.0f, 0, &norm, &skipped);
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
           argv[1], mode, B, T, sec * 1e3, tps, flops, 100 * flops / f32, mode, 100 * flops / bf16, loss, (tot - fr) / 1073741824.0);
    dt_gpu_lm_destroy(m);
    dt_program_destroy(p);
    dt_gpu_close(g);
    free(x), free(y);
    return 0;
}
