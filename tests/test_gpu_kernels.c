/* Every GPU kernel (gpu.h) against the CPU kernel it stands for (kernels.h, optim.h), on fresh random inputs at GPT-2
 * shapes, f32 both: within 1e-5 relative (sums in another order), 2e-5 where a sum runs over the vocabulary; bf16's
 * as matmul_bf16 says.
 * Needs a GPU (bench/gpu_check.sh runs it). usage: test_gpu_kernels */
#include "gpu_check.h"

#include "dtrain/kernels.h"
#include "dtrain/optim.h"

#define BT 512
#define B 2
#define T (BT / B)
#define C 384
#define NH 6
#define V 1000
#define VP 1024

static void matmul(dt_gpu *g) {
    int OC = 3 * C;
    float *x = random_floats((size_t)BT * C, 1), *w = random_floats((size_t)OC * C, 0.05f), *b = random_floats(OC, 0.1f);
    float *dy = random_floats((size_t)BT * OC, 1), *y = malloc((size_t)BT * OC * 4);
    float *dx = random_floats((size_t)BT * C, 0.1f), *dw = random_floats((size_t)OC * C, 0.1f), *db = random_floats(OC, 0.1f);
    float *gx = to_device(g, x, (size_t)BT * C * 4), *gw = to_device(g, w, (size_t)OC * C * 4), *gb = to_device(g, b, OC * 4);
    float *gdy = to_device(g, dy, (size_t)BT * OC * 4), *gdx = to_device(g, dx, (size_t)BT * C * 4);
    float *gdw = to_device(g, dw, (size_t)OC * C * 4), *gdb = to_device(g, db, OC * 4), *gy = NULL;
    dt_gpu_alloc(g, (size_t)BT * OC * 4, (void **)&gy);
    dt_matmul_forward(y, x, w, b, BT, C, OC);
    dt_gpu_matmul_forward(g, gy, gx, gw, gb, BT, C, OC);
    report_err("matmul forward [512 x 384] x [1152 x 384]^T + bias", device_err(g, gy, y, (size_t)BT * OC), 1e-5);
    dt_matmul_backward(dx, dw, db, dy, x, w, BT, C, OC);
    dt_gpu_matmul_backward(g, gdx, gdw, gdb, gdy, gx, gw, BT, C, OC);
    report_err("matmul backward: d(input), added to", device_err(g, gdx, dx, (size_t)BT * C), 1e-5);
    report_err("matmul backward: d(weight), added to", device_err(g, gdw, dw, (size_t)OC * C), 1e-5);
    report_err("matmul backward: d(bias), added to", device_err(g, gdb, db, OC), 1e-5);
    void *dev[] = { gx, gw, gb, gdy, gdx, gdw, gdb, gy }, *host[] = { x, w, b, dy, y, dx, dw, db };
    for (int i = 0; i < 8; i++) dt_gpu_free(g, dev[i]), free(host[i]);
}

/* bf16 (lowp.cu): the rounding bit for bit; the Linear against dt_matmul_*_lp on bf16 values (as the model gives it):
 * its outputs are rounded to bf16, so a sum that ends a hair the other side of a rounding boundary moves one element
 * a whole bf16 step; 2e-4 of the tensor's norm holds a few such (an output left unrounded is 1e-3). */
static void matmul_bf16(dt_gpu *g) {
    int OC = 3 * C;
    size_t nx = (size_t)BT * C, nw = (size_t)OC * C, ny = (size_t)BT * OC;
    float *x = random_floats(nx, 1), *w = random_floats(nw, 0.05f), *b = random_floats(OC, 0.1f), *dy = random_floats(ny, 1);
    float *y = malloc(ny * 4), *dx = random_floats(nx, 0.1f), *dw = random_floats(nw, 0.1f), *db = random_floats(OC, 0.1f);
    uint16_t *w16 = malloc(nw * 2), *b16 = malloc((size_t)OC * 2), *x16 = malloc(nx * 2);
    float *r = random_floats(ny, 3), *gr = to_device(g, r, ny * 4), *gr2 = NULL;
    dt_gpu_alloc(g, ny * 4, (void **)&gr2);
    dt_gpu_round_bf16(g, gr2, gr, ny, NULL);
    dt_gpu_round_bf16(g, gr, gr, ny, NULL);
    dt_lp_round(r, ny, DT_BF16);
    report_err("round to bf16 (into another buffer): dt_lp_round's bits", device_err(g, gr2, r, ny), 0);
    report_err("round to bf16 in place", device_err(g, gr, r, ny), 0);
    dt_lp_round(x, nx, DT_BF16);
    dt_lp_pack(w16, w, nw, DT_BF16), dt_lp_pack(b16, b, OC, DT_BF16), dt_lp_pack(x16, x, nx, DT_BF16);
    float *gx = to_device(g, x, nx * 4), *gdy = to_device(g, dy, ny * 4), *gdx = to_device(g, dx, nx * 4), *gdw = to_device(g, dw, nw * 4);
    float *gdb = to_device(g, db, OC * 4), *gy = NULL, *work = NULL;
    uint16_t *gw16 = to_device(g, w16, nw * 2), *gb16 = to_device(g, b16, (size_t)OC * 2), *w16d = NULL, *gx16 = NULL;
    dt_gpu_alloc(g, ny * 4, (void **)&gy), dt_gpu_alloc(g, (size_t)BT * (C + OC) * 2, (void **)&w16d);
    dt_gpu_alloc(g, (nw + OC) * 4, (void **)&work), dt_gpu_alloc(g, nx * 2, (void **)&gx16);
    dt_gpu_pack_bf16(g, gx16, gx, nx);
    uint16_t *back = malloc(nx * 2);
    bool same = !dt_gpu_sync(g) && !dt_gpu_download(g, back, gx16, nx * 2) && !memcmp(back, x16, nx * 2);
    check("pack to bf16: dt_lp_pack's bits", same, same ? "equal" : "differ");
    dt_gpu_widen_bf16(g, gr2, gx16, nx, 0); /* x is bf16 values already: widened back, the same floats */
    report_err("widen from bf16", device_err(g, gr2, x, nx), 0);
    dt_gpu_widen_bf16(g, gr2, gx16, nx, 1);
    for (size_t i = 0; i < nx; i++) r[i] = 2 * x[i];
    report_err("widen from bf16, added to", device_err(g, gr2, r, nx), 0);
    size_t wf = (size_t)1 << 22;
    float *cwork = malloc(wf * 4);
    dt_matmul_forward_lp(y, x, w16, b16, BT, C, OC, DT_BF16, cwork, wf, 0);
    dt_gpu_matmul_forward_bf16(g, gy, gx, NULL, gw16, gb16, BT, C, OC, w16d);
    report_err("bf16 matmul forward [512 x 384] x [1152 x 384]^T + bias, rounded", device_err(g, gy, y, ny), 2e-4);
    float *dy0 = malloc(ny * 4); /* dout as given: backward reads it rounded and leaves it */
    memcpy(dy0, dy, ny * 4);
    dt_lp_round(dy, ny, DT_BF16);
    dt_matmul_backward_lp(dx, dw, db, dy, x, w16, BT, C, OC, DT_BF16, cwork, wf, 0);
    dt_gpu_matmul_backward_bf16(g, gdx, gdw, gdb, gdy, gx, NULL, gw16, BT, C, OC, w16d, work);
    report_err("bf16 matmul backward: d(output) left as it was", device_err(g, gdy, dy0, ny), 0);
    report_err("bf16 matmul backward: d(input), added to, rounded", device_err(g, gdx, dx, nx), 2e-4);
    report_err("bf16 matmul backward: d(weight), this use's rounded, added", device_err(g, gdw, dw, nw), 2e-4);
    report_err("bf16 matmul backward: d(bias), this use's rounded, added", device_err(g, gdb, db, OC), 2e-4);
    void *dev[] = { gr, gr2, gx, gdy, gdx, gdw, gdb, gy, work, gw16, gb16, w16d, gx16 };
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) dt_gpu_free(g, dev[i]);
    void *host[] = { x, w, b, dy, y, dx, dw, db, w16, b16, x16, r, back, cwork, dy0 };
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) free(host[i]);
}

/* A forward kernel run with bits: its output must be the same kernel's output without bits (unrounded, downloaded
 * before) rounded to bf16, exactly, and the bits those rounded floats' own. */
static void check_bits(dt_gpu *g, const char *what, const float *gy, const uint16_t *gbits, const float *unrounded, size_t n) {
    float *y = malloc(n * 4), *r = malloc(n * 4);
    uint16_t *bits = malloc(n * 2), *want = malloc(n * 2);
    bool ok = !dt_gpu_sync(g) && !dt_gpu_download(g, y, gy, n * 4) && !dt_gpu_download(g, bits, gbits, n * 2);
    memcpy(r, unrounded, n * 4);
    dt_lp_round(r, n, DT_BF16);
    dt_lp_pack(want, y, n, DT_BF16);
    ok = ok && !memcmp(y, r, n * 4) && !memcmp(bits, want, n * 2);
    check(what, ok, ok ? "its output rounded, the bits its own" : "differ");
    free(y), free(r), free(bits), free(want);
}

static void layernorm_gelu_add(dt_gpu *g) {
    size_t n = (size_t)BT * C;
    float *x = random_floats(n, 2), *w = random_floats(C, 1), *b = random_floats(C, 0.5f), *dy = random_floats(n, 1);
    float *y = malloc(n * 4), *st = malloc(2 * BT * 4), *dx = random_floats(n, 0.1f), *dw = random_floats(C, 0.1f), *db = random_floats(C, 0.1f);
    float *gx = to_device(g, x, n * 4), *gw = to_device(g, w, C * 4), *gb = to_device(g, b, C * 4), *gdy = to_device(g, dy, n * 4);
    float *gdx = to_device(g, dx, n * 4), *gdw = to_device(g, dw, C * 4), *gdb = to_device(g, db, C * 4), *gy = to_device(g, y, n * 4);
    float *gst = to_device(g, st, 2 * BT * 4);
    dt_layernorm_forward(y, st, st + BT, x, w, b, BT, C);
    dt_gpu_layernorm_forward(g, gy, gst, gst + BT, gx, gw, gb, BT, C, NULL);
    report_err("layernorm forward", device_err(g, gy, y, n), 1e-5);
    report_err("layernorm forward: mean and rstd kept", device_err(g, gst, st, 2 * BT), 1e-5);
    dt_layernorm_backward(dx, dw, db, dy, x, w, st, st + BT, BT, C);
    dt_gpu_layernorm_backward(g, gdx, gdw, gdb, gdy, gx, gw, gst, gst + BT, BT, C, 0);
    report_err("layernorm backward: d(input), added to", device_err(g, gdx, dx, n), 1e-5);
    report_err("layernorm backward: d(weight), d(bias), added to",
               fmax(device_err(g, gdw, dw, C), device_err(g, gdb, db, C)), 1e-5);
    /* bf16: the output with its bits; backward reading its input rounded */
    uint16_t *gbits = NULL;
    float *unrounded = malloc(n * 4), *xr = malloc(n * 4);
    dt_gpu_alloc(g, n * 2, (void **)&gbits);
    dt_gpu_sync(g), dt_gpu_download(g, unrounded, gy, n * 4);
    dt_gpu_layernorm_forward(g, gy, gst, gst + BT, gx, gw, gb, BT, C, gbits);
    check_bits(g, "layernorm forward with bits", gy, gbits, unrounded, n);
    memcpy(xr, x, n * 4);
    dt_lp_round(xr, n, DT_BF16);
    dt_layernorm_backward(dx, dw, db, dy, xr, w, st, st + BT, BT, C);
    dt_gpu_layernorm_backward(g, gdx, gdw, gdb, gdy, gx, gw, gst, gst + BT, BT, C, 1);
    report_err("layernorm backward, its input read as bf16: d(input), added to", device_err(g, gdx, dx, n), 1e-5);
    report_err("layernorm backward, its input read as bf16: d(weight), d(bias)", fmax(device_err(g, gdw, dw, C), device_err(g, gdb, db, C)),
               1e-5);
    dt_gelu_forward(y, x, n);
    dt_gpu_gelu_forward(g, gy, gx, n, NULL);
    report_err("gelu forward (tanh)", device_err(g, gy, y, n), 1e-5);
    dt_gpu_sync(g), dt_gpu_download(g, unrounded, gy, n * 4);
    dt_gpu_gelu_forward(g, gy, gx, n, gbits);
    check_bits(g, "gelu forward with bits", gy, gbits, unrounded, n);
    dt_gpu_free(g, gbits), free(unrounded), free(xr);
    dt_gelu_backward(dx, x, dy, n);
    dt_gpu_gelu_backward(g, gdx, gx, gdy, n);
    report_err("gelu backward, added to", device_err(g, gdx, dx, n), 1e-5);
    dt_residual_forward(y, x, dy, n);
    dt_gpu_residual_forward(g, gy, gx, gdy, n);
    report_err("residual add", device_err(g, gy, y, n), 0);
    void *dev[] = { gx, gw, gb, gdy, gdx, gdw, gdb, gy, gst }, *host[] = { x, w, b, dy, y, st, dx, dw, db };
    for (int i = 0; i < 9; i++) dt_gpu_free(g, dev[i]), free(host[i]);
}

/* The Llama family's RMSNorm and SwiGLU. */
static void rmsnorm_swiglu(dt_gpu *g) {
    size_t n = (size_t)BT * C;
    float *x = random_floats(n, 2), *w = random_floats(C, 1), *dy = random_floats(n, 1), *y = malloc(n * 4), *rs = malloc(BT * 4);
    float *dx = random_floats(n, 0.1f), *dw = random_floats(C, 0.1f);
    float *gx = to_device(g, x, n * 4), *gw = to_device(g, w, C * 4), *gdy = to_device(g, dy, n * 4), *gy = to_device(g, y, n * 4);
    float *grs = to_device(g, rs, BT * 4), *gdx = to_device(g, dx, n * 4), *gdw = to_device(g, dw, C * 4);
    dt_rmsnorm_forward(y, rs, x, w, BT, C, 1e-6f);
    dt_gpu_rmsnorm_forward(g, gy, grs, gx, gw, BT, C, 1e-6f, NULL);
    report_err("rmsnorm forward", device_err(g, gy, y, n), 1e-5);
    report_err("rmsnorm forward: rstd kept", device_err(g, grs, rs, BT), 1e-5);
    dt_rmsnorm_backward(dx, dw, dy, x, w, rs, BT, C);
    dt_gpu_rmsnorm_backward(g, gdx, gdw, gdy, gx, gw, grs, BT, C, 0);
    report_err("rmsnorm backward: d(input), added to", device_err(g, gdx, dx, n), 1e-5);
    report_err("rmsnorm backward: d(weight), added to", device_err(g, gdw, dw, C), 1e-5);
    int F = C / 2; /* x as [BT, 2F] gate | up */
    dt_swiglu_forward(y, x, BT, F);
    dt_gpu_swiglu_forward(g, gy, gx, BT, F, NULL);
    report_err("swiglu forward", device_err(g, gy, y, (size_t)BT * F), 1e-5);
    dt_swiglu_backward(dx, x, dy, BT, F);
    dt_gpu_swiglu_backward(g, gdx, gx, gdy, BT, F);
    report_err("swiglu backward, added to", device_err(g, gdx, dx, n), 1e-5);
    void *dev[] = { gx, gw, gdy, gy, grs, gdx, gdw }, *host[] = { x, w, dy, y, rs, dx, dw };
    for (int i = 0; i < 7; i++) dt_gpu_free(g, dev[i]), free(host[i]);
}

/* Rotary positions, and attention's q|k|v made from K/V heads. */
static void rotary_and_packing(dt_gpu *g) {
    /* rotary positions on rows of NH heads of 64 channels, 3 C apart (q in a packed q|k|v), row r at r % T */
    int hd = C / NH, KVH = 2;
    size_t nq = (size_t)BT * 3 * C;
    float inv[32], *qkv = random_floats(nq, 1), *gqkv = to_device(g, qkv, nq * 4), *ginv;
    dt_rope_config rc = { .theta = 10000 };
    dt_rope_frequencies(inv, hd, &rc);
    ginv = to_device(g, inv, sizeof inv);
    int32_t pos[BT];
    for (int r = 0; r < BT; r++) pos[r] = r % T;
    for (int dir = 0; dir < 2; dir++) {
        (dir ? dt_rope_backward : dt_rope_forward)(qkv, inv, pos, BT, NH, hd, 3 * C);
        dt_gpu_rope(g, gqkv, ginv, BT, T, NH, hd, 3 * C, dir);
        report_err(dir ? "rope backward (the opposite turn)" : "rope forward (theta 10000, positions to 255)", device_err(g, gqkv, qkv, nq), 1e-6);
    }
    /* pack: q of NH heads, then each head's K/V head (NH / KVH heads share one); unpack sums them back */
    size_t win = (size_t)C + 2 * KVH * hd;
    int kv_of[NH];
    for (int h = 0; h < NH; h++) kv_of[h] = h / (NH / KVH);
    float *in = random_floats((size_t)BT * win, 1), *pk = malloc(nq * 4), *din = random_floats((size_t)BT * win, 0.1f);
    float *gin = to_device(g, in, (size_t)BT * win * 4), *gpk = to_device(g, pk, nq * 4), *gdin = to_device(g, din, (size_t)BT * win * 4);
    dt_attention_pack(pk, in, BT, NH, KVH, hd, kv_of);
    dt_gpu_attention_pack(g, gpk, gin, BT, NH, KVH, hd);
    report_err("attention pack: q|k|v of 6 heads from 2 K/V heads", device_err(g, gpk, pk, nq), 0);
    dt_attention_unpack(din, qkv, BT, NH, KVH, hd, kv_of);
    dt_gpu_attention_unpack(g, gdin, gqkv, BT, NH, KVH, hd);
    report_err("attention unpack: each K/V head the sum of its heads', added to", device_err(g, gdin, din, (size_t)BT * win), 1e-6);
    void *dev[] = { gqkv, ginv, gin, gpk, gdin }, *host[] = { qkv, in, pk, din };
    for (int i = 0; i < 5; i++) dt_gpu_free(g, dev[i]);
    for (int i = 0; i < 4; i++) free(host[i]);
}

static void attention(dt_gpu *g) {
    size_t nq = (size_t)BT * 3 * C, no = (size_t)BT * C, na = (size_t)B * NH * T * T;
    float *qkv = random_floats(nq, 1), *dy = random_floats(no, 1), *y = malloc(no * 4), *att = malloc(na * 4);
    float *dqkv = random_floats(nq, 0.1f);
    float *gq = to_device(g, qkv, nq * 4), *gdy = to_device(g, dy, no * 4), *gdq = to_device(g, dqkv, nq * 4), *gy, *gatt, *gs;
    dt_gpu_alloc(g, no * 4, (void **)&gy);
    dt_gpu_alloc(g, na * 4, (void **)&gatt);
    dt_gpu_alloc(g, (size_t)NH * T * T * 4, (void **)&gs);
    dt_attention_forward(y, att, qkv, B, T, C, NH);
    dt_gpu_attention_forward(g, gy, gatt, gq, B, T, C, NH);
    report_err("attention forward (causal, 6 heads, T 256)", device_err(g, gy, y, no), 1e-5);
    dt_attention_backward(dqkv, dy, qkv, att, B, T, C, NH);
    dt_gpu_attention_backward(g, gdq, gs, gdy, gq, gatt, B, T, C, NH);
    report_err("attention backward: d(q|k|v), added to", device_err(g, gdq, dqkv, nq), 1e-5);
    void *dev[] = { gq, gdy, gdq, gy, gatt, gs }, *host[] = { qkv, dy, y, att, dqkv };
    for (int i = 0; i < 6; i++) dt_gpu_free(g, dev[i]);
    for (int i = 0; i < 5; i++) free(host[i]);
}

/* The log-sum-exp attention against the CPU's, heads of 64, 128 and 32 channels, T a whole number of flash.cu's
 * 64-row tiles and not, on bf16 values (as the model gives them: q . k is exact in TF32). flash.cu: the probabilities
 * and dS rounded to TF32 for their products (2^-11 an element), so 1e-3 of the tensors' norms; backward from the CPU's
 * output and lse (as the model: its own forward's), so that it alone is checked. cuDNN's fused attention (--attention
 * cudnn): its probabilities and dS rounded to bf16 for their products (2^-9), its output and each d(q|k|v) rounded to
 * bf16, so 1e-2; its statistics, each row's log-sum-exp in f32, held to 1e-4; backward from its own forward (its
 * statistics are its own) against the CPU's from the CPU's output rounded to bf16 (the model's is a bf16 value). */
static void attention_lse(dt_gpu *g, bool cudnn) {
    static const int shapes[][2] = { { 256, 6 }, { 200, 6 }, { 200, 3 }, { 136, 12 } }; /* T, heads (of C 384) */
    const char *name = cudnn ? "cuDNN attention" : "flash attention";
    double tol = cudnn ? 1e-2 : 1e-3, lse_tol = cudnn ? 1e-4 : 1e-5;
    if (cudnn && !dt_gpu_cudnn_supported(64)) {
        check("cuDNN attention: built (scripts/get-cudnn-frontend.sh before scripts/gpu-carry.sh)", false, "this build has none");
        return;
    }
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int t = shapes[s][0], nh = shapes[s][1];
        size_t rows = (size_t)B * t, nq = rows * 3 * C, no = rows * C, nl = (size_t)B * nh * t;
        float *qkv = random_floats(nq, 2), *dy = random_floats(no, 1), *y = malloc(no * 4), *lse = malloc(nl * 4);
        float *dqkv = random_floats(nq, 0.1f);
        dt_lp_round(qkv, nq, DT_BF16);
        dt_lp_round(dy, no, DT_BF16);
        float *gq = to_device(g, qkv, nq * 4), *gdy = to_device(g, dy, no * 4), *gdq = to_device(g, dqkv, nq * 4), *gy, *gl, *gs;
        uint16_t *w16;
        dt_gpu_alloc(g, no * 4, (void **)&gy), dt_gpu_alloc(g, nl * 4, (void **)&gl), dt_gpu_alloc(g, nl * 4, (void **)&gs);
        dt_gpu_alloc(g, rows * 8 * C * 2, (void **)&w16);
        dt_attention_forward_lse(y, lse, qkv, B, t, C, nh);
        if (cudnn) dt_gpu_attention_forward_cudnn(g, gy, gl, gq, B, t, C, nh, w16, NULL);
        else dt_gpu_attention_forward_lse(g, gy, gl, gq, B, t, C, nh);
        char what[96];
        snprintf(what, sizeof what, "%s forward (T %d, heads of %d): output", name, t, C / nh);
        report_err(what, device_err(g, gy, y, no), tol);
        snprintf(what, sizeof what, "%s forward (T %d, heads of %d): log-sum-exp", name, t, C / nh);
        report_err(what, device_err(g, gl, lse, nl), lse_tol);
        if (cudnn) dt_lp_round(y, no, DT_BF16);
        else dt_gpu_upload(g, gy, y, no * 4), dt_gpu_upload(g, gl, lse, nl * 4);
        dt_attention_backward_lse(dqkv, dy, y, qkv, lse, B, t, C, nh);
        if (cudnn) dt_gpu_attention_backward_cudnn(g, gdq, gdy, gy, gq, gl, B, t, C, nh, w16);
        else dt_gpu_attention_backward_lse(g, gdq, gs, gdy, gy, gq, gl, B, t, C, nh);
        snprintf(what, sizeof what, "%s backward (T %d, heads of %d): d(q|k|v), added to", name, t, C / nh);
        report_err(what, device_err(g, gdq, dqkv, nq), tol);
        void *dev[] = { gq, gdy, gdq, gy, gl, gs, w16 }, *host[] = { qkv, dy, y, lse, dqkv };
        for (int i = 0; i < 7; i++) dt_gpu_free(g, dev[i]);
        for (int i = 0; i < 5; i++) free(host[i]);
    }
}

static void embedding_crossentropy(dt_gpu *g) {
    int32_t tok[BT], tgt[BT];
    for (int i = 0; i < BT; i++) tok[i] = (i * 7919) % V, tgt[i] = i % 17 == 0 ? DT_IGNORE_INDEX : (i * 104729) % V;
    size_t ne = (size_t)VP * C, np = (size_t)T * C, n = (size_t)BT * C, nl = (size_t)BT * VP;
    float *wte = random_floats(ne, 0.1f), *wpe = random_floats(np, 0.1f), *y = malloc(n * 4), *dy = random_floats(n, 1);
    float *dwte = random_floats(ne, 0.1f), *dwpe = random_floats(np, 0.1f), *logits = random_floats(nl, 4), *loss = malloc(BT * 4);
    int32_t *gt = to_device(g, tok, sizeof tok), *gtg = to_device(g, tgt, sizeof tgt);
    float *gwte = to_device(g, wte, ne * 4), *gwpe = to_device(g, wpe, np * 4), *gdy = to_device(g, dy, n * 4);
    float *gdwte = to_device(g, dwte, ne * 4), *gdwpe = to_device(g, dwpe, np * 4), *gl = to_device(g, logits, nl * 4), *gy, *gloss;
    dt_gpu_alloc(g, n * 4, (void **)&gy);
    dt_gpu_alloc(g, BT * 4, (void **)&gloss);
    dt_embedding_forward(y, tok, wte, wpe, B, T, C);
    dt_gpu_embedding_forward(g, gy, gt, gwte, gwpe, B, T, C);
    report_err("embedding forward (tokens + positions)", device_err(g, gy, y, n), 0);
    dt_embedding_backward(dwte, dwpe, dy, tok, B, T, C);
    dt_gpu_embedding_backward(g, gdwte, gdwpe, gdy, gt, B, T, C);
    report_err("embedding backward, added to", fmax(device_err(g, gdwte, dwte, ne), device_err(g, gdwpe, dwpe, np)), 1e-5);
    float scale = 1.0f / BT;
    dt_crossentropy_fused(logits, loss, tgt, BT, V, VP, scale, DT_F32);
    dt_gpu_crossentropy_fused(g, gl, gloss, gtg, BT, V, VP, scale);
    report_err("cross-entropy: each row's loss (ignored rows 0)", device_err(g, gloss, loss, BT), 2e-5);
    report_err("cross-entropy: d(logits), 0 in padded columns", device_err(g, gl, logits, nl), 2e-5);
    void *dev[] = { gt, gtg, gwte, gwpe, gdy, gdwte, gdwpe, gl, gy, gloss }, *host[] = { wte, wpe, y, dy, dwte, dwpe, logits, loss };
    for (int i = 0; i < 10; i++) dt_gpu_free(g, dev[i]);
    for (int i = 0; i < 8; i++) free(host[i]);
}

/* The head's 16-bit cross-entropy (bf16 runs): the logits read as their bf16 values (unrounded sums given), the losses
 * and each row's maximum and sum as dt_crossentropy_forward_lp's, the gradient's bits as dt_crossentropy_grad_lp
 * rounds them (their exponentials differ in the last bits, which moves an element a bf16 step now and then) */
static void crossentropy_bf16(dt_gpu *g) {
    int32_t tgt[BT];
    for (int i = 0; i < BT; i++) tgt[i] = i % 17 == 0 ? DT_IGNORE_INDEX : (i * 104729) % V;
    size_t nl = (size_t)BT * VP, wf = (size_t)1 << 20;
    float *logits = random_floats(nl, 4), *loss = malloc(BT * 4), *stats = malloc(2 * BT * 4);
    float *grad = malloc(nl * 4), *dev_grad = malloc(nl * 4), *work = malloc(wf * 4);
    uint16_t *l16 = malloc(nl * 2), *d16 = malloc(nl * 2);
    dt_lp_pack(l16, logits, nl, DT_BF16);
    float *gl = to_device(g, logits, nl * 4), *gloss, *gstats;
    int32_t *gtg = to_device(g, tgt, sizeof tgt);
    uint16_t *gd16;
    dt_gpu_alloc(g, BT * 4, (void **)&gloss), dt_gpu_alloc(g, 2 * BT * 4, (void **)&gstats), dt_gpu_alloc(g, nl * 2, (void **)&gd16);
    dt_crossentropy_forward_lp(loss, stats, l16, tgt, BT, V, VP, DT_BF16, work, wf);
    dt_gpu_crossentropy_forward_bf16(g, gl, gloss, gstats, gtg, BT, V, VP);
    report_err("bf16 cross-entropy: each row's loss (ignored rows 0)", device_err(g, gloss, loss, BT), 2e-5);
    for (int i = 0; i < BT; i++)
        if (tgt[i] < 0) stats[2 * i] = stats[2 * i + 1] = 0; /* backward does not read them: compare the scored rows' */
    float *hs = malloc(2 * BT * 4);
    dt_gpu_sync(g), dt_gpu_download(g, hs, gstats, 2 * BT * 4);
    for (int i = 0; i < BT; i++)
        if (tgt[i] < 0) hs[2 * i] = hs[2 * i + 1] = 0;
    report_err("bf16 cross-entropy: each row's maximum and sum", rel_err(hs, stats, 2 * BT), 2e-5);
    float scale = 0.5f / BT; /* a gradient scale in it too */
    dt_ce_grad ce = { stats, tgt, V, 0, scale, NULL, NULL, NULL }; /* (positional: V is this file's vocabulary) */
    dt_crossentropy_grad_lp(grad, l16, 0, BT, VP, 0, VP, &ce, DT_BF16);
    dt_gpu_crossentropy_backward_bf16(g, gd16, gl, gstats, gtg, BT, V, VP, scale);
    dt_gpu_sync(g), dt_gpu_download(g, d16, gd16, nl * 2);
    dt_lp_unpack(dev_grad, d16, nl, DT_BF16);
    report_err("bf16 cross-entropy backward: d(logits)'s bf16 bits, 0 in padded columns", rel_err(dev_grad, grad, nl), 1e-4);
    void *dev[] = { gl, gloss, gstats, gtg, gd16 }, *host[] = { logits, loss, stats, grad, dev_grad, work, l16, d16, hs };
    for (int i = 0; i < 5; i++) dt_gpu_free(g, dev[i]);
    for (int i = 0; i < 9; i++) free(host[i]);
}

static void adamw(dt_gpu *g) {
    size_t n = 100003; /* not a multiple of a block */
    dt_optim_config c;
    dt_optim_defaults(DT_OPT_ADAMW, &c);
    c.weight_decay = 0.1f;
    dt_optim *o = NULL;
    if (dt_optim_create(&c, n, NULL, 0, &o)) {
        check("adamw: the CPU optimizer", false, dt_last_error());
        return;
    }
    float *p = random_floats(n, 1), *zero = calloc(n, 4), *gp = to_device(g, p, n * 4), *gm = to_device(g, zero, n * 4);
    float *gv = to_device(g, zero, n * 4), *gg = NULL;
    double *gss = NULL, ss = 0, norm = 0;
    dt_gpu_alloc(g, n * 4, (void **)&gg);
    dt_gpu_alloc(g, sizeof(double), (void **)&gss);
    for (int t = 1; t <= 3; t++) {
        /* the third step clipped, as dt_optim_step_clipped does it: the gradients scaled on the host, by gscale here */
        float *grad = random_floats(n, 0.01f), lr = 1e-3f, clip = t == 3 ? 0.5f : 0;
        dt_gpu_upload(g, gg, grad, n * 4);
        dt_gpu_zero(g, gss, sizeof(double));
        dt_gpu_sumsq(g, gg, n, gss);
        dt_gpu_download(g, &ss, gss, sizeof ss);
        norm = dt_optim_step_clipped(o, p, grad, lr, clip);
        float f = clip > 0 && clip / (norm + 1e-6) < 1 ? (float)(clip / (norm + 1e-6)) : 1.0f;
        float bc1 = 1.0f - powf(c.beta1, (float)t), bc2 = 1.0f - powf(c.beta2, (float)t);
        dt_gpu_adamw(g, gp, gg, f, gm, gv, n, c.beta1, c.beta2, c.eps, 1.0f - lr * c.weight_decay, lr / bc1, sqrtf(bc2));
        free(grad);
    }
    report_err("adamw: parameters after 3 steps, the last clipped (dt_optim's)", device_err(g, gp, p, n), 1e-6);
    report_err("sum of squares: the gradients' norm", fabs(sqrt(ss) - norm) / norm, 1e-6);
    /* the scale against the device's own values, halved here (exact in binary) */
    dt_gpu_download(g, p, gp, n * 4);
    dt_gpu_scale(g, gp, n, 0.5f);
    for (size_t i = 0; i < n; i++) p[i] *= 0.5f;
    report_err("scale", device_err(g, gp, p, n), 0);
    dt_optim_destroy(o);
    dt_gpu_free(g, gp), dt_gpu_free(g, gm), dt_gpu_free(g, gv), dt_gpu_free(g, gg), dt_gpu_free(g, gss);
    free(p), free(zero);
}

/* The decoder's kernels: a prefill of B sequences of T rows (slots 0 and 1, each row at its position) through the
 * cache's attention against the training kernel's causal attention on the same q|k|v (made from 2 K/V heads by the
 * CPU's pack); the rows' embedding and rotary turn at random positions; the gather. */
static void decoding(dt_gpu *g) {
    int KVH = 2, hd = C / NH, n = BT;
    size_t win = (size_t)C + 2 * KVH * hd, nq = (size_t)BT * 3 * C, no = (size_t)BT * C;
    int32_t *rows = malloc(sizeof(int32_t) * 4 * n), kv_of[NH];
    for (int r = 0; r < n; r++) rows[4 * r] = r / T, rows[4 * r + 1] = r % T, rows[4 * r + 2] = (r * 7919) % V, rows[4 * r + 3] = 1;
    for (int h = 0; h < NH; h++) kv_of[h] = h / (NH / KVH);
    float *in = random_floats((size_t)n * win, 1), *pk = malloc(nq * 4), *y = malloc(no * 4), *att = malloc((size_t)B * NH * T * T * 4);
    dt_attention_pack(pk, in, BT, NH, KVH, hd, kv_of);
    dt_attention_forward(y, att, pk, B, T, C, NH);
    dt_gpu_kv kv = { NULL, (size_t)2 * T * KVH * hd, T, KVH, hd, 0 };
    dt_gpu_alloc(g, 2 * kv.slot_elems * 4, (void **)&kv.cache);
    int32_t *grows = to_device(g, rows, sizeof(int32_t) * 4 * n);
    float *gin = to_device(g, in, (size_t)n * win * 4), *gy;
    dt_gpu_alloc(g, no * 4, (void **)&gy);
    dt_gpu_attention_cached(g, gy, &kv, gin, grows, n, 0, NH, (int)win);
    report_err("decoder attention over the cache (6 heads from 2 K/V heads, 2 slots of 256 positions)", device_err(g, gy, y, no), 1e-5);
    kv.chunk = 48; /* the positions in chunks (the last one short): the running maximum and sum carried across them */
    dt_gpu_attention_cached(g, gy, &kv, gin, grows, n, 0, NH, (int)win);
    report_err("decoder attention, the cache 48 positions at a time", device_err(g, gy, y, no), 1e-5);
    /* the embedding and the turn at the rows' positions, shuffled */
    for (int r = 0; r < n; r++) rows[4 * r + 1] = (r * 131) % T;
    dt_gpu_upload(g, grows, rows, sizeof(int32_t) * 4 * n);
    float *wte = random_floats((size_t)V * C, 1), *wpe = random_floats((size_t)T * C, 1), *e = malloc(no * 4), inv[C / NH / 2];
    for (int r = 0; r < n; r++)
        for (int c = 0; c < C; c++) e[(size_t)r * C + c] = wte[(size_t)rows[4 * r + 2] * C + c] + wpe[(size_t)rows[4 * r + 1] * C + c];
    float *gwte = to_device(g, wte, (size_t)V * C * 4), *gwpe = to_device(g, wpe, (size_t)T * C * 4), *ginv;
    dt_gpu_embed_rows(g, gy, grows, gwte, gwpe, n, C);
    report_err("decoder embedding at the rows' positions", device_err(g, gy, e, no), 0);
    dt_rope_config rc = { .theta = 10000 };
    dt_rope_frequencies(inv, hd, &rc);
    ginv = to_device(g, inv, sizeof inv);
    int32_t pos[BT];
    for (int r = 0; r < n; r++) pos[r] = rows[4 * r + 1];
    dt_rope_forward(in, inv, pos, n, NH, hd, win);
    dt_gpu_rope_rows(g, gin, ginv, grows, n, NH, hd, win);
    report_err("decoder rope at the rows' positions", device_err(g, gin, in, (size_t)n * win), 1e-6);
    int32_t idx[3] = { 5, 0, 511 };
    int32_t *gidx = to_device(g, idx, sizeof idx);
    for (int i = 0; i < 3; i++) memcpy(y + (size_t)i * C, e + (size_t)idx[i] * C, C * 4);
    dt_gpu_embed_rows(g, gy, grows, gwte, gwpe, n, C);
    float *gout;
    dt_gpu_alloc(g, 3 * C * 4, (void **)&gout);
    dt_gpu_gather_rows(g, gout, gy, gidx, 3, C);
    report_err("decoder gather of the rows that want logits", device_err(g, gout, y, 3 * C), 0);
    void *dev[] = { kv.cache, grows, gin, gy, gwte, gwpe, ginv, gidx, gout }, *host[] = { rows, in, pk, y, att, wte, wpe, e };
    for (int i = 0; i < 9; i++) dt_gpu_free(g, dev[i]);
    for (int i = 0; i < 8; i++) free(host[i]);
}

/* NCCL as one GPU can check it: a one-rank communicator from a fresh unique id; its sum and its mean of a device
 * buffer are that buffer, bit for bit (data parallelism over GPUs of one machine runs the mean). */
static void nccl_one_rank(dt_gpu *g) {
    size_t n = 1 << 20;
    float *x = random_floats(n, 1), *gx = to_device(g, x, n * 4);
    char id[DT_GPU_NCCL_ID_BYTES];
    dt_gpu_nccl *c = NULL;
    dt_status st = dt_gpu_nccl_id(id);
    if (!st) st = dt_gpu_nccl_open(g, id, 1, 0, &c);
    check("NCCL: a one-rank communicator", !st, st ? dt_last_error() : "made");
    if (!st) {
        dt_gpu_nccl_allreduce(g, c, gx, n, 0);
        report_err("NCCL allreduce (sum) of one rank: the buffer", device_err(g, gx, x, n), 0);
        dt_gpu_nccl_allreduce(g, c, gx, n, 1);
        report_err("NCCL allreduce (mean) of one rank: the buffer", device_err(g, gx, x, n), 0);
    }
    dt_gpu_nccl_close(c);
    dt_gpu_free(g, gx);
    free(x);
}

int main(void) {
    dt_gpu *g = NULL;
    if (dt_gpu_open(0, &g)) {
        fprintf(stderr, "test_gpu_kernels: %s\n", dt_last_error());
        return 1;
    }
    printf("GPU: %s\n", dt_gpu_name(g));
    matmul(g);
    matmul_bf16(g);
    layernorm_gelu_add(g);
    rmsnorm_swiglu(g);
    rotary_and_packing(g);
    attention(g);
    attention_lse(g, false);
    attention_lse(g, true);
    decoding(g);
    embedding_crossentropy(g);
    crossentropy_bf16(g);
    adamw(g);
    nccl_one_rank(g);
    dt_gpu_close(g);
    printf("%s\n", failed ? "FAILED" : "all GPU kernels match their CPU kernels");
    return failed != 0;
}
