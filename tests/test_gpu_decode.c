/* Decoding on the GPU against the CPU decoder: one model (a preset, dtrain's seeded initialisation), three slots
 * filled by prompts of 5, 9 and 1 tokens over two steps (a slot's prompt split across them, rows of several slots in
 * one step, logits wanted for some rows only), then STEPS steps of one row a slot, each slot's next token the CPU's
 * greedy choice. Every step's logits within tol of the CPU's (the largest difference over the largest logit), and
 * the GPU's greedy choice the CPU's. Both behind dt_decoder, so the rows are checked alike: a row beyond what its slot
 * holds is refused before the GPU sees it. With the host's kernels (test_gpu_decode_host, make test) the GPU
 * decoder's orchestration (its buffers, op order, cache layout, positions) runs on a machine without a GPU.
 * usage: test_gpu_decode PRESET STEPS [tol=X] */
#include "gpu_check.h"

#include "dtrain/gpu_lm.h"
#include "dtrain/infer.h"

#include <math.h>

#define SLOTS 3
#define ROWS 16

static int argmax(const float *x, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* One step on both; the wanted rows' logits compared. */
static int step(dt_decoder *cpu, dt_decoder *gpu, const dt_infer_row *rows, int n, int V, float *lc, float *lg, double *worst,
                int *next) {
    int m = 0;
    for (int r = 0; r < n; r++) m += rows[r].logits != 0;
    if (dt_decoder_step(cpu, rows, n, lc) || dt_decoder_step(gpu, rows, n, lg)) {
        fprintf(stderr, "test_gpu_decode: %s\n", dt_last_error());
        return 1;
    }
    for (int i = 0, r = 0; r < n; r++) {
        if (!rows[r].logits) continue;
        const float *a = lc + (size_t)i * V, *b = lg + (size_t)i * V;
        double mx = 0, d = 0;
        for (int v = 0; v < V; v++) mx = fmax(mx, fabs(a[v])), d = fmax(d, fabs((double)a[v] - b[v]));
        *worst = fmax(*worst, d / mx);
        int ta = argmax(a, V), tb = argmax(b, V);
        if (ta != tb) {
            fprintf(stderr, "FAIL slot %d position %d: greedy token %d on the CPU, %d on the GPU\n", rows[r].slot, rows[r].pos, ta, tb);
            return 1;
        }
        next[rows[r].slot] = ta;
        i++;
    }
    return 0;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: test_gpu_decode PRESET STEPS [tol=X]\n");
        return 2;
    }
    int steps = atoi(argv[2]);
    double tol = argc > 3 && !strncmp(argv[3], "tol=", 4) ? atof(argv[3] + 4) : 1e-5;
    dt_gpt2_config cfg;
    dt_gpt2 *m = NULL;
    dt_gpu *g = NULL;
    dt_gpu_decoder *gd = NULL;
    dt_decoder *cpu = NULL, *gpu = NULL;
    dt_status st = dt_lm_preset(argv[1], &cfg);
    if (!st) st = dt_gpt2_create(&cfg, &m);
    if (!st) dt_gpt2_init_random(m, 1337);
    if (!st) st = dt_gpu_open(0, &g);
    if (!st) st = dt_decoder_create(m, DT_QUANT_NONE, SLOTS, ROWS, 0, &cpu);
    if (!st) st = dt_gpu_decoder_create(g, dt_gpt2_program(m), SLOTS, ROWS, 0, &gd);
    if (!st) st = dt_decoder_create_on(m, SLOTS, ROWS, 0, dt_gpu_decoder_device(gd), &gpu);
    if (st) {
        fprintf(stderr, "test_gpu_decode: %s\n", dt_last_error());
        return 1;
    }
    int V = cfg.vocab_size, len[SLOTS] = { 5, 9, 1 }, next[SLOTS], fails = 0;
    float *lc = malloc(sizeof(float) * ROWS * V), *lg = malloc(sizeof(float) * ROWS * V);
    double worst = 0;
    /* the prompts: slot 0's 5 and slot 1's first 4, then slot 1's other 5 and slot 2's one */
    dt_infer_row rows[ROWS];
    int n = 0;
    uint64_t s = 7;
    for (int half = 0; half < 2 && !fails; half++) {
        n = 0;
        for (int sl = 0; sl < SLOTS; sl++)
            for (int p = 0; p < len[sl]; p++) {
                if ((sl == 0 || (sl == 1 && p < 4)) != (half == 0)) continue;
                s = s * 6364136223846793005ull + 1442695040888963407ull;
                rows[n++] = (dt_infer_row){ sl, p, (int32_t)((s >> 33) % (uint64_t)V), p == len[sl] - 1 };
            }
        fails += step(cpu, gpu, rows, n, V, lc, lg, &worst, next);
    }
    for (int k = 0; k < steps && !fails; k++) {
        for (int sl = 0; sl < SLOTS; sl++) rows[sl] = (dt_infer_row){ sl, len[sl] + k, next[sl], 1 };
        fails += step(cpu, gpu, rows, SLOTS, V, lc, lg, &worst, next);
    }
    printf("%s: %d steps over %d slots: logits within %.2e of the CPU decoder's (tolerance %.0e), greedy tokens equal\n", argv[1],
           steps + 2, SLOTS, worst, tol);
    if (worst > tol) printf("FAIL logits %.2e > %.0e\n", worst, tol), fails++;
    /* a row past what its slot holds: refused by dt_decoder before the GPU runs it */
    dt_infer_row bad = { 0, len[0] + steps + 1, 1, 1 };
    if (!dt_decoder_step(gpu, &bad, 1, lg)) printf("FAIL a row beyond its slot's cache was taken\n"), fails++;
    else printf("refused: %s\n", dt_last_error());
    dt_decoder_destroy(gpu);
    dt_decoder_destroy(cpu);
    dt_gpu_close(g);
    dt_gpt2_destroy(m);
    free(lc);
    free(lg);
    return fails ? 1 : 0;
}
