/* Decoding on the GPU as Hugging Face's generate is measured beside it (bench/torch_gpt2_gpu.py --decode): a
 * random-initialised model, B prompts of 16 random tokens read in one step, then 128 new tokens each by greedy
 * choice (the logits to the host, the choice there), timed whole after one untimed run; new tokens a second and
 * milliseconds a step, and at each batch the bytes of weights a step reads over the time (against the device's copy
 * rate: decoding at batch 1 is a pass over the weights).
 * usage: gpu_decode_bench [PRESET] [BATCH...]      (defaults: 124M, batches 1 and 32) */
#include "dtrain/base.h"
#include "dtrain/gpu_lm.h"
#include "dtrain/infer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROMPT 16
#define NEW 128

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* B sequences: the prompts in one step, then NEW - 1 steps of one row each (the first new token comes from the
 * prompt's step). */
static dt_status generate(dt_decoder *d, int B, int V, dt_infer_row *rows, float *logits, int32_t *next) {
    uint64_t s = 11;
    int n = 0;
    for (int b = 0; b < B; b++)
        for (int p = 0; p < PROMPT; p++) {
            s = s * 6364136223846793005ull + 1442695040888963407ull;
            rows[n++] = (dt_infer_row){ b, p, (int32_t)((s >> 33) % (uint64_t)V), p == PROMPT - 1 };
        }
    dt_status st = dt_decoder_step(d, rows, n, logits);
    for (int k = 0; !st && k < NEW; k++) {
        for (int b = 0; b < B; b++) next[b] = argmax(logits + (size_t)b * V, V);
        if (k == NEW - 1) break;
        for (int b = 0; b < B; b++) rows[b] = (dt_infer_row){ b, PROMPT + k, next[b], 1 };
        st = dt_decoder_step(d, rows, B, logits);
    }
    return st;
}

int main(int argc, char **argv) {
    const char *preset = argc > 1 ? argv[1] : "124M";
    int batches[8] = { 1, 32 }, nb = 2;
    if (argc > 2) nb = 0;
    for (int i = 2; i < argc && nb < 8; i++) batches[nb++] = atoi(argv[i]);
    dt_gpt2_config cfg;
    dt_gpt2 *m = NULL;
    dt_gpu *g = NULL;
    dt_status st = dt_lm_preset(preset, &cfg);
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) dt_gpt2_init_random(m, 1337);
    if (!st) st = dt_gpu_open(0, &g);
    double copy = 0;
    if (!st) st = dt_gpu_measure_copy(g, (size_t)1 << 30, &copy);
    if (st) {
        fprintf(stderr, "gpu_decode_bench: %s\n", dt_last_error());
        return 1;
    }
    int V = cfg.vocab_size;
    double wbytes = (double)dt_program_num_params(dt_gpt2_program(m)) * sizeof(float);
    printf("%s on %s: %.0f MB of f32 weights; the device copies %.0f GB/s\n", preset, dt_gpu_name(g), wbytes / 1e6, copy);
    for (int i = 0; i < nb; i++) {
        int B = batches[i], R = B * PROMPT;
        dt_gpu_decoder *gd = NULL;
        dt_decoder *d = NULL;
        dt_infer_row *rows = malloc(sizeof *rows * (size_t)R);
        float *logits = malloc(sizeof(float) * (size_t)B * V);
        int32_t *next = malloc(sizeof(int32_t) * (size_t)B);
        st = dt_gpu_decoder_create(g, dt_gpt2_program(m), B, R, 0, &gd);
        if (!st) st = dt_decoder_create_on(m, B, R, 0, dt_gpu_decoder_device(gd), &d);
        if (!st) st = generate(d, B, V, rows, logits, next); /* untimed: the first run */
        double t0 = dt_time_now();
        if (!st) st = generate(d, B, V, rows, logits, next);
        double sec = dt_time_now() - t0;
        if (st) {
            fprintf(stderr, "gpu_decode_bench: batch %d: %s\n", B, dt_last_error());
            return 1;
        }
        printf("dtrain GPU decoder f32 batch %d: %.0f new tokens/s (%.2f ms a step; weights read at %.0f GB/s, %.1f%% of the copy rate)\n",
               B, B * NEW / sec, sec * 1e3 / NEW, wbytes * NEW / sec / 1e9, 100 * wbytes * NEW / sec / 1e9 / copy);
        dt_decoder_destroy(d);
        free(rows), free(logits), free(next);
    }
    dt_gpu_close(g);
    dt_gpt2_destroy(m);
    return 0;
}
