/* The inference Linear alone (dt_panels_apply, the kernels prefill and decoding run), GPT-2 124M's four
 * shapes at n rows: GFLOP/s of the best of many repetitions, f32 and int8, so that a kernel's change can be told
 * from the machine's drift, which a whole `bench infer` run cannot at a few percent. Threads: OMP_NUM_THREADS;
 * the path: DTRAIN_ROWDOT.
 *   build/bench/rowdot_bench [n] [reps] [O K]   (O K: that one shape instead) */
#include "dtrain/kernels.h"

#include "dtrain/base.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 128, reps = argc > 2 ? atoi(argv[2]) : 20;
    int shapes[4][2] = { { 2304, 768 }, { 768, 768 }, { 3072, 768 }, { 768, 3072 } }; /* O, K */
    size_t nshapes = 4;
    if (argc > 4) shapes[0][0] = atoi(argv[3]), shapes[0][1] = atoi(argv[4]), nshapes = 1;
    if (n < 1 || reps < 1 || shapes[0][0] < 1 || shapes[0][1] < 1) {
        fprintf(stderr, "rowdot_bench: n and reps must be positive (got %d, %d, %d, %d)\n", n, reps, shapes[0][0], shapes[0][1]);
        return 2;
    }
    for (int q = 0; q < 2; q++) {
        double flops = 0, best_total = 0;
        for (size_t s = 0; s < nshapes; s++) {
            int O = shapes[s][0], K = shapes[s][1];
            float *w = aligned_alloc(64, sizeof(float) * (size_t)O * K), *x = aligned_alloc(64, sizeof(float) * (size_t)n * K);
            float *y = malloc(sizeof(float) * (size_t)n * O);
            dt_panels *p = NULL;
            if (!w || !x || !y) {
                fprintf(stderr, "rowdot_bench: out of memory for [%d, %d] at %d rows\n", O, K, n);
                return 1;
            }
            srand(7);
            for (size_t i = 0; i < (size_t)O * K; i++) w[i] = (float)((double)rand() / RAND_MAX - 0.5);
            for (size_t i = 0; i < (size_t)n * K; i++) x[i] = (float)((double)rand() / RAND_MAX - 0.5);
            if (dt_panels_create(w, O, K, q == 1, &p) != DT_OK) {
                fprintf(stderr, "rowdot_bench: %s\n", dt_last_error());
                return 1;
            }
            double best = 1e30;
            for (int r = 0; r < reps; r++) {
                double t0 = dt_time_now();
                if (dt_panels_apply(y, x, p, NULL, n) != DT_OK) {
                    fprintf(stderr, "rowdot_bench: %s\n", dt_last_error());
                    return 1;
                }
                double t = dt_time_now() - t0;
                if (t < best) best = t;
            }
            double f = 2.0 * n * (double)O * K;
            printf("%s n %d [%d, %d]: %.2f ms, %.1f GFLOP/s\n", q ? "int8" : "f32 ", n, O, K, 1e3 * best, f / best * 1e-9);
            flops += f, best_total += best;
            dt_panels_destroy(p);
            free(w), free(x), free(y);
        }
        printf("%s n %d all four: %.1f GFLOP/s\n", q ? "int8" : "f32 ", n, flops / best_total * 1e-9);
    }
    return 0;
}
