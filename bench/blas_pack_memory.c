/* The resident memory the BLAS itself takes for GPT-2's head, outside any
 * buffer dtrain allocates: logits = x W^T, dW += dlogits^T x, dx = dlogits W
 * on (B*T) x C activations and a V x C table, every operand touched first, the
 * resident size read before and after each call. OpenBLAS packs a panel of
 * one operand into its own buffer, which stays mapped; for the weight
 * gradient that panel grows with V (docs/planner.md, the memory gap).
 * usage: build/bench/blas_pack_memory V C BT   (OMP_NUM_THREADS: the threads) */
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static long status_mb(const char *key) {
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    long kb = 0;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, key, strlen(key))) sscanf(line + strlen(key), "%ld", &kb);
    if (f) fclose(f);
    return kb / 1024;
}

static float *filled(size_t n) {
    float *p = malloc(n * sizeof *p);
    for (size_t i = 0; p && i < n; i++) p[i] = 1e-3f * (float)(i % 7);
    return p;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s V C BT\n", argv[0]); return 2; }
    int V = atoi(argv[1]), C = atoi(argv[2]), BT = atoi(argv[3]);
    if (V < 1 || C < 1 || BT < 1) { fprintf(stderr, "V, C and BT must be positive\n"); return 2; }
    float *x = filled((size_t)BT * C), *w = filled((size_t)V * C), *y = filled((size_t)BT * V), *dw = filled((size_t)V * C),
          *dx = filled((size_t)BT * C);
    if (!x || !w || !y || !dw || !dx) { fprintf(stderr, "out of memory\n"); return 1; }
    long r0 = status_mb("VmRSS:");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, BT, V, C, 1, x, C, w, C, 0, y, V);
    long r1 = status_mb("VmRSS:");
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, V, C, BT, 1, y, V, x, C, 1, dw, C);
    long r2 = status_mb("VmRSS:");
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, BT, C, V, 1, y, V, w, C, 0, dx, C);
    long r3 = status_mb("VmRSS:");
    printf("V %d C %d BT %d: operands %ld MB; the BLAS added %ld MB in logits, %ld MB in dW, %ld MB in dx\n", V, C, BT, r0,
           r1 - r0, r2 - r1, r3 - r2);
    free(x), free(w), free(y), free(dw), free(dx);
    return 0;
}
