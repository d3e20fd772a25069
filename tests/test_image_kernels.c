/* The image layers against PyTorch (tests/fixtures/image_kernels_ref.bin,
 * from scripts/make_image_kernels_fixture.py): Conv2d forward and backward
 * in five shapes, on one thread and on two (3x3, the 7x7 stride-2 stem, 1x1 with and without
 * stride, 3x3 stride 2), BatchNorm2d in training (output, the three
 * gradients, the running averages) and evaluation, max pooling with ties,
 * global average pooling. Each result within 1e-5 of the largest value of
 * PyTorch's, relative. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fixture_arrays.h"

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

#define get fx_get

/* max |got - ref| over max |ref| */
static double rel(const float *got, const float *ref, size_t n) {
    double e = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)got[i] - ref[i]));
        m = fmax(m, fabs((double)ref[i]));
    }
    return m > 0 ? e / m : e;
}

static void check(const char *what, const char *name, const float *got, const char *ref_name) {
    size_t n;
    const float *ref = get(ref_name, &n);
    double r = rel(got, ref, n);
    EXPECT(r <= 1e-5, "%s %s: %.3g from PyTorch's (relative to its largest)", what, name, r);
    printf("  %-6s %-10s %.2g\n", what, name, r);
}

static void conv_case(const char *c) {
    char k[64];
    snprintf(k, sizeof k, "%s.shape", c);
    const float *sh = get(k, NULL);
    dt_conv_shape s = dt_conv_make((int)sh[0], (int)sh[1], (int)sh[2], (int)sh[3], (int)sh[4], (int)sh[5], (int)sh[6], (int)sh[7]);
    int bias = (int)sh[8];
    size_t nx = (size_t)s.N * s.C * s.H * s.W, ny = (size_t)s.N * s.OC * s.OH * s.OW, nw = (size_t)s.OC * s.C * s.KH * s.KW;
    float *y = malloc(ny * 4), *dx = calloc(nx, 4), *dw = calloc(nw, 4), *db = calloc((size_t)s.OC, 4);
    float *work = malloc((dt_conv2d_work_floats(&s) + 1) * 4);
    size_t n;
    snprintf(k, sizeof k, "%s.y", c);
    get(k, &n);
    EXPECT(n == ny, "%s: %zu outputs, PyTorch has %zu (the output size differs)", c, ny, n);
    if (n != ny) return;
    const float *x, *w, *b = NULL, *dy;
    snprintf(k, sizeof k, "%s.x", c), x = get(k, NULL);
    snprintf(k, sizeof k, "%s.w", c), w = get(k, NULL);
    snprintf(k, sizeof k, "%s.dy", c), dy = get(k, NULL);
    if (bias) snprintf(k, sizeof k, "%s.b", c), b = get(k, NULL);
    dt_conv2d_forward(y, x, w, b, &s, work);
    dt_conv2d_backward(dx, dw, bias ? db : NULL, dy, x, w, &s, work);
    snprintf(k, sizeof k, "%s.y", c), check("conv", c, y, k);
    snprintf(k, sizeof k, "%s.dx", c), check("dx", c, dx, k);
    snprintf(k, sizeof k, "%s.dw", c), check("dw", c, dw, k);
    if (bias) snprintf(k, sizeof k, "%s.db", c), check("db", c, db, k);
    free(y), free(dx), free(dw), free(db), free(work);
}

static void batchnorm_case(void) {
    const float *sh = get("bn.shape", NULL);
    int N = (int)sh[0], C = (int)sh[1], HW = (int)sh[2] * (int)sh[3];
    size_t n = (size_t)N * C * HW;
    const float *x = get("bn.x", NULL), *w = get("bn.w", NULL), *b = get("bn.b", NULL), *dy = get("bn.dy", NULL);
    float *y = malloc(n * 4), *dx = calloc(n, 4), mean[16], rstd[16], rm[16], rv[16], dw[16], db[16];
    double s[16], q[16], sdy[16], sdyx[16];
    memcpy(rm, get("bn.rm0", NULL), (size_t)C * 4);
    memcpy(rv, get("bn.rv0", NULL), (size_t)C * 4);
    dt_batchnorm_sums(s, q, x, N, C, HW);
    dt_batchnorm_stats(mean, rstd, rm, rv, s, q, (double)N * HW, C, 0.1f, 1e-5f);
    dt_batchnorm_forward(y, x, mean, rstd, w, b, N, C, HW);
    dt_batchnorm_backward_sums(sdy, sdyx, dy, x, mean, rstd, N, C, HW);
    dt_batchnorm_backward(dx, dy, x, mean, rstd, w, sdy, sdyx, (double)N * HW, N, C, HW);
    for (int c = 0; c < C; c++) dw[c] = (float)sdyx[c], db[c] = (float)sdy[c];
    check("bn", "train", y, "bn.y");
    check("dx", "bn", dx, "bn.dx");
    check("dw", "bn", dw, "bn.dw");
    check("db", "bn", db, "bn.db");
    check("run", "mean", rm, "bn.rm1");
    check("run", "var", rv, "bn.rv1");
    dt_batchnorm_eval_stats(mean, rstd, rm, rv, C, 1e-5f);
    dt_batchnorm_forward(y, x, mean, rstd, w, b, N, C, HW);
    check("bn", "eval", y, "bn.yeval");
    free(y), free(dx);
}

static void pool_cases(void) {
    const float *sh = get("mp.shape", NULL);
    int N = (int)sh[0], C = (int)sh[1], H = (int)sh[2], W = (int)sh[3], K = (int)sh[4], st = (int)sh[5], p = (int)sh[6];
    int OH = (H + 2 * p - K) / st + 1, OW = (W + 2 * p - K) / st + 1;
    float *y = malloc(sizeof(float) * N * C * OH * OW), *dx = calloc((size_t)N * C * H * W, 4);
    int32_t *idx = malloc(sizeof(int32_t) * N * C * OH * OW);
    dt_maxpool2d_forward(y, idx, get("mp.x", NULL), N * C, H, W, K, st, p);
    dt_maxpool2d_backward(dx, get("mp.dy", NULL), idx, N * C, H, W, OH, OW);
    check("pool", "max", y, "mp.y");
    check("dx", "max (ties)", dx, "mp.dx");
    free(y), free(dx), free(idx);
    sh = get("ap.shape", NULL);
    N = (int)sh[0], C = (int)sh[1], H = (int)sh[2], W = (int)sh[3];
    float a[64], *dxa = calloc((size_t)N * C * H * W, 4);
    dt_avgpool_global_forward(a, get("ap.x", NULL), N * C, H * W);
    dt_avgpool_global_backward(dxa, get("ap.dy", NULL), N * C, H * W);
    check("pool", "average", a, "ap.y");
    check("dx", "average", dxa, "ap.dx");
    free(dxa);
}

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: test_image_kernels FIXTURES_DIR [MAX_THREADS]\n"); return 2; }
    char path[4096];
    snprintf(path, sizeof path, "%s/image_kernels_ref.bin", argv[1]);
    if (fx_load(path)) { printf("FAIL: cannot read %s\n", path); return 1; }
    /* one thread: images one by one; two: a thread per image (and the parallel loops over planes) */
    const char *convs[] = { "c3", "c7", "c1s2", "c1", "c3s2" };
    /* the ThreadSanitizer build passes 1: libgomp is not instrumented, so TSan takes its hand-offs between
     * threads for races */
    int maxth = argc > 2 ? atoi(argv[2]) : 2;
    for (int th = 1; th <= maxth; th++) {
        dt_kernels_set_threads(th);
        printf("%d thread%s:\n", th, th > 1 ? "s" : "");
        for (int i = 0; i < 5; i++) conv_case(convs[i]);
    }
    batchnorm_case();
    pool_cases();
    fx_free();
    printf("image kernels: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
