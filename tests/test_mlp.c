/* The MLP against PyTorch (fixture from scripts/make_fixtures.py): logits,
 * loss (1e-5 relative), every gradient (1e-4 of its tensor's largest value),
 * a 10-step AdamW loss curve (1e-4 relative); and the IDX reader on good and
 * bad files (each error names the file and what is wrong).
 * usage: test_mlp FIXTURE_DIR */
#include "dtrain/data.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"
#include "dtrain/optim.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static void write_file(const char *path, const void *p, size_t n) {
    FILE *f = fopen(path, "wb");
    fwrite(p, 1, n, f);
    fclose(f);
}

static void idx_tests(void) {
    char dir[] = "/tmp/dtrain-test-idx-XXXXXX", ip[256], lp[256];
    if (!mkdtemp(dir)) { failed++; return; }
    snprintf(ip, sizeof ip, "%s/train-images-idx3-ubyte.gz", dir);
    snprintf(lp, sizeof lp, "%s/train-labels-idx1-ubyte.gz", dir);
    /* 3 images of 2 x 2 and 3 labels, uncompressed (zlib reads plain files too) */
    uint8_t im[16 + 12] = { 0, 0, 8, 3, 0, 0, 0, 3, 0, 0, 0, 2, 0, 0, 0, 2, 0, 255, 51, 102, 1, 2, 3, 4, 5, 6, 7, 8 };
    uint8_t lb[8 + 3] = { 0, 0, 8, 1, 0, 0, 0, 3, 2, 0, 9 };
    write_file(ip, im, sizeof im);
    write_file(lp, lb, sizeof lb);
    dt_images s;
    dt_status st = dt_images_load(dir, "train", &s);
    EXPECT(!st && s.n == 3 && s.dim == 4 && s.classes == 10 && s.y[0] == 2 && s.y[2] == 9 && s.x[1] == 1.0f && fabsf(s.x[2] - 0.2f) < 1e-7f,
           "a small IDX pair reads back (%s)", st ? dt_last_error() : "values");
    if (!st) dt_images_free(&s);
    lb[7] = 4; /* 4 labels declared, 3 present */
    write_file(lp, lb, sizeof lb);
    st = dt_images_load(dir, "train", &s);
    EXPECT(st && strstr(dt_last_error(), lp) && strstr(dt_last_error(), "3 of 4"), "truncated labels: %s", dt_last_error());
    lb[7] = 2; /* 2 labels for 3 images */
    write_file(lp, lb, sizeof lb - 1);
    st = dt_images_load(dir, "train", &s);
    EXPECT(st && strstr(dt_last_error(), "3 images") && strstr(dt_last_error(), "2 labels"), "count mismatch: %s", dt_last_error());
    im[2] = 9; /* not unsigned bytes */
    write_file(ip, im, sizeof im);
    st = dt_images_load(dir, "train", &s);
    EXPECT(st && strstr(dt_last_error(), ip) && strstr(dt_last_error(), "not an IDX"), "bad magic: %s", dt_last_error());
    st = dt_images_load(dir, "t10k", &s);
    EXPECT(st && strstr(dt_last_error(), "t10k-images") && strstr(dt_last_error(), "cannot open"), "missing file: %s", dt_last_error());
    unlink(ip);
    unlink(lp);
    rmdir(dir);
}

int main(int argc, char **argv) {
    if (argc < 2) { printf("usage: test_mlp FIXTURE_DIR\n"); return 2; }
    dt_kernels_set_threads(1);
    char ref[4096];
    snprintf(ref, sizeof ref, "%s/mlp_tiny_ref.bin", argv[1]);
    FILE *f = fopen(ref, "rb");
    int32_t h[8];
    if (!f || fread(h, 4, 8, f) != 8 || h[0] != 20261123 || h[1] != 4) { printf("FAIL: cannot read %s\n", ref); return 1; }
    int sizes[4] = { h[2], h[3], h[4], h[5] }, B = h[6], K = sizes[3];
    dt_mlp *m;
    if (dt_mlp_create(sizes, 4, &m)) { printf("FAIL: %s\n", dt_last_error()); return 1; }
    size_t np = dt_mlp_num_params(m), nx = (size_t)B * sizes[0];
    float *p0 = malloc(np * 4), *x = malloc(nx * 4), *logits = malloc((size_t)B * K * 4), *grads = malloc(np * 4), curve[10], loss_ref;
    int32_t *y = malloc((size_t)B * 4);
    size_t ok = fread(p0, 4, np, f) + fread(x, 4, nx, f) + fread(y, 4, (size_t)B, f) + fread(logits, 4, (size_t)B * K, f) +
                fread(&loss_ref, 4, 1, f) + fread(grads, 4, np, f) + fread(curve, 4, 10, f);
    fclose(f);
    if (ok != np + nx + (size_t)B + (size_t)B * K + 1 + np + 10) { printf("FAIL: %s is truncated\n", ref); return 1; }
    memcpy(dt_mlp_params(m), p0, np * 4);

    float loss = 0;
    int correct = -1;
    EXPECT(!dt_mlp_forward(m, x, y, B, &loss, &correct), "forward");
    double lmax = 0;
    for (int i = 0; i < B * K; i++) lmax = fmax(lmax, fabs(dt_mlp_logits(m)[i] - logits[i]));
    EXPECT(lmax < 1e-5, "logits differ by %g", lmax);
    EXPECT(fabs(loss - loss_ref) / fabs(loss_ref) < 1e-5, "loss %.7f vs PyTorch %.7f", loss, loss_ref);
    printf("mlp loss %.7f vs PyTorch %.7f (relative %.2g), logits max difference %.2g\n", loss, loss_ref,
           fabs(loss - loss_ref) / fabs(loss_ref), lmax);
    dt_mlp_zero_grad(m);
    EXPECT(!dt_mlp_backward(m, 1.0f), "backward");
    for (int l = 0; l < 3; l++) {
        size_t wo, bo;
        int in, out;
        dt_mlp_layer(m, l, &wo, &bo, &in, &out);
        size_t offs[2] = { wo, bo }, cnts[2] = { (size_t)in * out, (size_t)out };
        for (int t = 0; t < 2; t++) {
            double err = 0, mx = 0;
            for (size_t i = 0; i < cnts[t]; i++) {
                err = fmax(err, fabs(dt_mlp_grads(m)[offs[t] + i] - grads[offs[t] + i]));
                mx = fmax(mx, fabs(grads[offs[t] + i]));
            }
            EXPECT(err <= 1e-4 * mx, "layer %d %s gradient: error %g of max %g", l, t ? "bias" : "weight", err, mx);
            printf("layer %d %-6s gradient: worst error %.2g of its largest value %.2g\n", l, t ? "bias" : "weight", err, mx);
        }
    }
    /* 10 AdamW steps from the same start, as the script takes them */
    memcpy(dt_mlp_params(m), p0, np * 4);
    dt_mlp_zero_grad(m);
    dt_optim_config oc;
    dt_optim_defaults(DT_OPT_ADAMW, &oc);
    oc.weight_decay = 0.01f;
    dt_optim *opt;
    EXPECT(!dt_optim_create(&oc, np, NULL, 0, &opt), "optimizer");
    double worst = 0;
    for (int s = 0; s < 10; s++) {
        dt_mlp_forward(m, x, y, B, &loss, NULL);
        worst = fmax(worst, fabs(loss - curve[s]) / fabs(curve[s]));
        dt_mlp_backward(m, 1.0f);
        dt_optim_step(opt, dt_mlp_params(m), dt_mlp_grads(m), 1e-2f, 1);
    }
    EXPECT(worst < 1e-4, "AdamW loss curve: worst relative difference %g", worst);
    printf("AdamW 10 steps: worst relative loss difference %.2g\n", worst);
    dt_optim_destroy(opt);

    int bad[2] = { 4, 0 };
    dt_mlp *m2;
    EXPECT(dt_mlp_create(bad, 2, &m2) && strstr(dt_last_error(), "size 0"), "bad size rejected: %s", dt_last_error());
    int32_t yb[8] = { 0, 0, 0, 0, 0, 0, 0, 7 };
    EXPECT(dt_mlp_forward(m, x, yb, B, &loss, NULL) && strstr(dt_last_error(), "label 7 of sample 7"), "bad label: %s", dt_last_error());
    idx_tests();

    dt_mlp_destroy(m);
    free(p0); free(x); free(logits); free(grads); free(y);
    printf("mlp: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
