/* Each kernel's backward against central finite differences of its forward.
 * The objective is J = sum(R * out) for a fixed random R, so dJ/dout = R;
 * J is accumulated in double and inputs are nudged by h = 1e-2 (f32
 * forwards), and the check is ||analytic - numeric|| / ||numeric|| < 1e-2
 * over up to 64 sampled coordinates per input. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

static int passed, failed;
static unsigned rng = 12345;
static float urand(void) { rng = rng * 1664525u + 1013904223u; return (float)(rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }
/* Every buffer of the test, freed at the end. */
static void *owned[256];
static int nowned;
static float *keep(float *p) {
    if (!p || nowned == (int)(sizeof owned / sizeof *owned)) { printf("test_kernels: out of memory or of owned slots\n"); exit(1); }
    return owned[nowned++] = p;
}
static float *rnd(size_t n, float scale) { float *p = keep(malloc(n * 4)); for (size_t i = 0; i < n; i++) p[i] = urand() * scale; return p; }
static float *zeros(size_t n) { return keep(calloc(n, 4)); }

typedef double (*objective)(void *ctx);

/* Compares analytic gradient g of x against finite differences of J. */
static void check(const char *what, objective J, void *ctx, float *x, const float *g, size_t n) {
    double num2 = 0, diff2 = 0;
    size_t stride = n > 64 ? n / 64 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = x[i], h = 1e-2f;
        x[i] = keep + h;
        double jp = J(ctx);
        x[i] = keep - h;
        double jm = J(ctx);
        x[i] = keep;
        double num = (jp - jm) / (2.0 * h);
        num2 += num * num;
        diff2 += (num - g[i]) * (num - g[i]);
    }
    double rel = sqrt(diff2) / (sqrt(num2) + 1e-12);
    if (rel < 1e-2) passed++;
    else { failed++; printf("FAIL: %s: relative error %.3g\n", what, rel); }
    printf("%-28s relative error %.2e\n", what, rel);
}

static double dot(const float *a, const float *r, size_t n) { double s = 0; for (size_t i = 0; i < n; i++) s += (double)a[i] * r[i]; return s; }

/* ---- matmul ---- */
enum { BT = 6, C = 8, OC = 5, NH = 2, B = 2, T = 3, V = 7, VP = 8 };
typedef struct { float *inp, *w, *b, *out, *r; } mm_ctx;
static double mm_J(void *p) { mm_ctx *c = p; dt_matmul_forward(c->out, c->inp, c->w, c->b, BT, C, OC); return dot(c->out, c->r, BT * OC); }

typedef struct { float *inp, *w, *b, *out, *mean, *rstd, *r; } ln_ctx;
static double ln_J(void *p) { ln_ctx *c = p; dt_layernorm_forward(c->out, c->mean, c->rstd, c->inp, c->w, c->b, BT, C); return dot(c->out, c->r, BT * C); }

typedef struct { float *inp, *out, *r; size_t n; } pw_ctx;
static double gelu_J(void *p) { pw_ctx *c = p; dt_gelu_forward(c->out, c->inp, c->n); return dot(c->out, c->r, c->n); }

typedef struct { float *qkv, *out, *att, *r; } at_ctx;
static double at_J(void *p) { at_ctx *c = p; dt_attention_forward(c->out, c->att, c->qkv, B, T, C, NH); return dot(c->out, c->r, B * T * C); }

typedef struct { float *qkv, *out, *lse, *r; } bw_ctx;
static double bw_J(void *p) { bw_ctx *c = p; dt_attention_forward_lse(c->out, c->lse, c->qkv, B, T, C, NH); return dot(c->out, c->r, B * T * C); }

typedef struct { float *logits, *losses; int32_t *tg; } ce_ctx;
static double ce_J(void *p) { ce_ctx *c = p; return dt_crossentropy_forward(c->losses, NULL, c->logits, c->tg, BT, V, VP); }

typedef struct { float *wte, *wpe, *out, *r; int32_t *tok; } em_ctx;
static double em_J(void *p) { em_ctx *c = p; dt_embedding_forward(c->out, c->tok, c->wte, c->wpe, B, T, C); return dot(c->out, c->r, B * T * C); }

/* A token loss's objective over each row's cross-entropy and entropy: J = sum_i rs_i ce_i + es_i H_i (in double). */
typedef struct { float *logits, *rs, *es; int32_t *tg; } ent_ctx;
static double row_entropy(const float *l, double *logz) {
    double m = -INFINITY, s = 0, h = 0;
    for (int v = 0; v < V; v++) m = fmax(m, l[v]);
    for (int v = 0; v < V; v++) s += exp(l[v] - m);
    *logz = m + log(s);
    for (int v = 0; v < V; v++) h -= exp(l[v] - *logz) * (l[v] - *logz);
    return h;
}
static double ent_J(void *p) {
    ent_ctx *c = p;
    double J = 0, logz;
    for (int i = 0; i < BT; i++) {
        const float *l = c->logits + i * VP;
        double h = row_entropy(l, &logz);
        J += c->rs[i] * (logz - l[c->tg[i]]) + c->es[i] * h;
    }
    return J;
}

/* The cross-entropy's statistics' moments give each row's entropy and log sum p^2 (the head's token statistics); the
 * gradient with an entropy term (an entropy bonus, GRPO's) against finite differences, and on 16-bit logits the same
 * bits once rounded. */
static void entropy_term(void) {
    int32_t tg[BT];
    for (int i = 0; i < BT; i++) tg[i] = (i * 5) % V;
    ent_ctx c = { rnd(BT * VP, 3), rnd(BT, 1), rnd(BT, 1), tg };
    float *stats = zeros(2 * BT), *losses = zeros(BT), *mom = zeros(2 * BT), *H = zeros(BT), *g = zeros(BT * VP);
    dt_crossentropy_forward(losses, stats, c.logits, tg, BT, V, VP);
    dt_crossentropy_rows_moments(mom, stats, c.logits, tg, BT, V, VP, DT_F32, NULL, 0);
    double worst = 0;
    for (int i = 0; i < BT; i++) {
        double logz, h = row_entropy(c.logits + i * VP, &logz), sq = 0, S = stats[2 * i + 1];
        for (int v = 0; v < V; v++) sq += exp(2 * (c.logits[i * VP + v] - logz));
        H[i] = (float)(log(S) - mom[2 * i + 1] / S);
        worst = fmax(worst, fmax(fabs(H[i] - h) / h, fabs(log(mom[2 * i]) - 2 * log(S) - log(sq)) / fabs(log(sq))));
    }
    if (worst < 1e-5) passed++; else { failed++; printf("FAIL: the moments' entropy and log sum p^2: relative error %g\n", worst); }
    printf("%-28s relative error %.2e\n", "entropy, log sum p^2", worst);
    memcpy(g, c.logits, BT * VP * 4);
    dt_ce_grad ce = { .stats = stats, .targets = tg, .V = V, .dscale = 1, .row_scale = c.rs, .ent_scale = c.es, .ent = H };
    dt_crossentropy_grad_entropy(g, BT, VP, &ce);
    check("ce + entropy d/dlogits", ent_J, &c, c.logits, g, BT * VP);
    uint16_t *l16 = (uint16_t *)keep(malloc(BT * VP * 2));
    float *w16 = zeros(BT * VP), *d16 = zeros(BT * VP);
    dt_lp_pack(l16, c.logits, BT * VP, DT_BF16);
    dt_lp_unpack(w16, l16, BT * VP, DT_BF16);
    dt_crossentropy_forward(losses, stats, w16, tg, BT, V, VP);
    dt_crossentropy_grad_entropy(w16, BT, VP, &ce);
    dt_lp_round(w16, BT * VP, DT_BF16);
    dt_crossentropy_grad_lp(d16, l16, 0, BT, VP, 0, VP, &ce, DT_BF16);
    int differ = 0;
    for (int i = 0; i < BT * VP; i++) differ += memcmp(&w16[i], &d16[i], 4) != 0;
    if (!differ) passed++; else { failed++; printf("FAIL: ce + entropy on bf16 logits: %d gradients differ from the f32 kernel's, rounded\n", differ); }
    printf("%-28s %d of %d differ\n", "ce + entropy, bf16 blocks", differ, BT * VP);
}

/* Largest |a - b| over n, relative to the largest |b|. */
typedef struct { float *inp, *w, *out, *rstd, *r; } rms_ctx;
static double rms_J(void *p) { rms_ctx *c = p; dt_rmsnorm_forward(c->out, c->rstd, c->inp, c->w, BT, C, 1e-6f); return dot(c->out, c->r, BT * C); }
typedef struct { float *x, *out, *r, *freq; const int32_t *pos; } rope_ctx;
static double rope_J(void *p) {
    rope_ctx *c = p;
    memcpy(c->out, c->x, BT * C * 4);
    dt_rope_forward(c->out, c->freq, c->pos, BT, NH, C / NH, C);
    return dot(c->out, c->r, BT * C);
}
typedef struct { float *gu, *out, *r; } swiglu_ctx;
static double swiglu_J(void *p) { swiglu_ctx *c = p; dt_swiglu_forward(c->out, c->gu, BT, C); return dot(c->out, c->r, BT * C); }

/* Llama's kernels: RMSNorm, rotary positions (with Llama 3.1's scaling) and SwiGLU against finite differences. */
static void llama_kernels(void) {
    rms_ctx rc = { rnd(BT * C, 2), rnd(C, 1), zeros(BT * C), zeros(BT), rnd(BT * C, 1) };
    rms_J(&rc);
    float *di = zeros(BT * C), *dw = zeros(C);
    dt_rmsnorm_backward(di, dw, rc.r, rc.inp, rc.w, rc.rstd, BT, C);
    check("rmsnorm d/dinp", rms_J, &rc, rc.inp, di, BT * C);
    check("rmsnorm d/dw", rms_J, &rc, rc.w, dw, C);
    int32_t pos[BT] = { 0, 1, 2, 7, 30, 1000 };
    dt_rope_config cfg = { .theta = 500000, .factor = 8, .low_freq_factor = 1, .high_freq_factor = 4, .original_max = 64 };
    float *freq = zeros(C / NH / 2);
    dt_rope_frequencies(freq, C / NH, &cfg);
    rope_ctx pc = { rnd(BT * C, 1), zeros(BT * C), rnd(BT * C, 1), freq, pos };
    float *dx = keep(malloc(BT * C * 4));
    memcpy(dx, pc.r, BT * C * 4);
    dt_rope_backward(dx, freq, pos, BT, NH, C / NH, C);
    check("rope d/dx", rope_J, &pc, pc.x, dx, BT * C);
    swiglu_ctx sc = { rnd(BT * 2 * C, 3), zeros(BT * C), rnd(BT * C, 1) };
    float *dgu = zeros(BT * 2 * C);
    dt_swiglu_backward(dgu, sc.gu, sc.r, BT, C);
    check("swiglu d/dgate,up", swiglu_J, &sc, sc.gu, dgu, BT * 2 * C);
}

static double rel_diff(const float *a, const float *b, size_t n) {
    double d = 0, m = 1e-30;
    for (size_t i = 0; i < n; i++) { d = fmax(d, fabs((double)a[i] - b[i])); m = fmax(m, fabs((double)b[i])); }
    return d / m;
}

static void expect_close(const char *what, double rel, double tol) {
    if (rel <= tol) passed++;
    else { failed++; printf("FAIL: %s: relative difference %.3g (tolerance %.1g)\n", what, rel, tol); }
    printf("%-44s relative difference %.2e\n", what, rel);
}

/* Blockwise attention against the full form at T = 150: two whole blocks of
 * 64 keys and a partial third, where the online softmax's rescaling between
 * blocks and the last block's bounds both matter (T = 3 is one block); and at
 * T = 600: 19 tiles of 32 query rows (forward) and 3 tiles of 256 keys
 * (backward), each with a partial last one. */
static void blockwise_over_several_blocks(void) {
    enum { BB = 1, CC = 8, HH = 2 };
    const int Ts[2] = { 150, 600 };
    for (int k = 0; k < 2; k++) {
        int TT = Ts[k];
        float *qkv = rnd(BB * TT * 3 * CC, 2), *r = rnd(BB * TT * CC, 1);
        float *full = zeros(BB * TT * CC), *att = zeros(BB * HH * TT * TT), *blk = zeros(BB * TT * CC), *lse = zeros(BB * HH * TT);
        float *dfull = zeros(BB * TT * 3 * CC), *dblk = zeros(BB * TT * 3 * CC);
        dt_attention_forward(full, att, qkv, BB, TT, CC, HH);
        dt_attention_forward_lse(blk, lse, qkv, BB, TT, CC, HH);
        dt_attention_backward(dfull, r, qkv, att, BB, TT, CC, HH);
        dt_attention_backward_lse(dblk, r, blk, qkv, lse, BB, TT, CC, HH);
        /* float32 noise here is ~1e-7; a dropped rescale moves outputs by ~1e-1 */
        char what[64];
        snprintf(what, sizeof what, "blockwise vs full attention, T=%d forward", TT);
        expect_close(what, rel_diff(blk, full, BB * TT * CC), 1e-5);
        snprintf(what, sizeof what, "blockwise vs full attention, T=%d backward", TT);
        expect_close(what, rel_diff(dblk, dfull, BB * TT * 3 * CC), 1e-5);
    }
}

/* Every kernel on 1 thread and on 3, at sizes that no thread count divides:
 * the same results (a split that drops the remainder rows or columns leaves
 * them zero). Tolerance: BLAS may add in another order on more threads. */
/* The policy networks' tanh against tanh in double: relative error under 4 float ulps from 1e-30 to 20 in magnitude
 * (both signs, widths 64 and 7 for a loop's tail), and a row's values the same whether it comes alone or with others. */
static void tanh_within_ulps_of_libm(void) {
    enum { ROWS = 4096, W = 64, W7 = 7 };
    float *x = keep(malloc(ROWS * W * 4)), *y = keep(malloc(ROWS * W * 4)), *one = keep(malloc(W * 4));
    for (int i = 0; i < ROWS * W; i++) {
        double f = (double)i / (ROWS * W);
        float mag = i % 2 ? (float)(20.0 * f) : (float)pow(10.0, -30.0 + 30.0 * f);
        x[i] = i % 4 < 2 ? mag : -mag;
    }
    double worst = 0;
    for (int pass = 0; pass < 2; pass++) {
        int w = pass ? W7 : W, rows = ROWS * W / w;
        dt_tanh_rows(y, x, rows, w);
        for (int i = 0; i < rows * w; i++) {
            double t = tanh((double)x[i]), e = fabs((double)y[i] - t) / fmax(fabs(t), 1e-38);
            if (e > worst) worst = e;
        }
    }
    dt_tanh_rows(y, x, ROWS, W);
    int same = 1;
    for (int r = 0; r < ROWS; r += 97) {
        dt_tanh_rows(one, x + (size_t)r * W, 1, W);
        same &= !memcmp(one, y + (size_t)r * W, W * 4);
    }
    int ok = worst < 4 * 1.1920929e-7 && same;
    if (ok) passed++;
    else { failed++; printf("FAIL: tanh: worst relative error %.3g, rows alone %s\n", worst, same ? "same" : "differ"); }
    printf("%-28s worst relative error %.2e (%.2f ulp), rows alone the same: %s\n", "tanh against libm", worst,
           worst / 1.1920929e-7, same ? "yes" : "no");
}

static __attribute__((unused)) void threads_give_the_same_results(void) {
    enum { N = 37, CC = 19, OO = 23, BB = 1, TT = 37, HH = 1, VV = 29, VVP = 32 };
    float *inp = rnd(N * CC, 1), *w = rnd(OO * CC, 1), *bias = rnd(OO, 1), *dout = rnd(N * OO, 1), *lw = rnd(CC, 1);
    float *qkv = rnd(BB * TT * 3 * CC, 1), *datt = rnd(BB * TT * CC, 1), *logits = rnd(N * VVP, 2);
    int32_t tg[N];
    for (int i = 0; i < N; i++) tg[i] = (i * 7) % VV;
    float *out[2][12];
    for (int k = 0; k < 2; k++) {
        dt_kernels_set_threads(k ? 3 : 1);
        float **o = out[k];
        o[0] = zeros(N * OO); dt_matmul_forward(o[0], inp, w, bias, N, CC, OO);
        o[1] = zeros(N * CC); o[2] = zeros(OO * CC); o[3] = zeros(OO);
        dt_matmul_backward(o[1], o[2], o[3], dout, inp, w, N, CC, OO);
        o[4] = zeros(N * CC); float *mean = zeros(N), *rstd = zeros(N);
        dt_layernorm_forward(o[4], mean, rstd, inp, lw, bias, N, CC);
        o[5] = zeros(N * CC); o[6] = zeros(CC); o[7] = zeros(CC);
        dt_layernorm_backward(o[5], o[6], o[7], inp, inp, lw, mean, rstd, N, CC);
        o[8] = zeros(N * CC); dt_gelu_forward(o[8], inp, N * CC);
        o[9] = zeros(BB * TT * CC); float *att = zeros(BB * HH * TT * TT);
        dt_attention_forward(o[9], att, qkv, BB, TT, CC, HH);
        o[10] = zeros(BB * TT * 3 * CC); dt_attention_backward(o[10], datt, qkv, att, BB, TT, CC, HH);
        o[11] = keep(malloc(N * VVP * 4)); memcpy(o[11], logits, N * VVP * 4);
        float *losses = zeros(N);
        dt_crossentropy_fused(o[11], losses, tg, N, VV, VVP, 1.0f / N, DT_F32);
    }
    dt_kernels_set_threads(1);
    static const char *names[12] = { "matmul forward", "matmul d/dinp", "matmul d/dw", "matmul d/dbias", "layernorm forward",
                                     "layernorm d/dinp", "layernorm d/dw", "layernorm d/db", "gelu forward", "attention forward",
                                     "attention d/dqkv", "crossentropy d/dlogits" };
    const size_t sizes[12] = { N * OO, N * CC, OO * CC, OO, N * CC, N * CC, CC, CC, N * CC, BB * TT * CC, BB * TT * 3 * CC, N * VVP };
    for (int i = 0; i < 12; i++) {
        char what[96];
        snprintf(what, sizeof what, "%s, 3 threads vs 1", names[i]);
        expect_close(what, rel_diff(out[1][i], out[0][i], sizes[i]), 1e-5);
    }
}

/* dt_kernels_flush_denormals: a subnormal input (DAZ) and a subnormal result (FTZ) read as 0 once it ran, unless
 * DTRAIN_DENORMALS=keep; the control register restored after, so nothing else here runs with it. */
static void denormals_flush_to_zero(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned saved = _mm_getcsr();
    const bool can = true;
#elif defined(__aarch64__)
    unsigned long saved;
    __asm__ volatile("mrs %0, fpcr" : "=r"(saved));
    const bool can = true;
#else
    const bool can = false; /* no switch to set: it must say so and change nothing */
#endif
    volatile float tiny = 1e-39f, big = 1e10f, small = 1e-30f, scale = 1e-10f; /* tiny * big is normal, small * scale not */
    setenv("DTRAIN_DENORMALS", "keep", 1);
    bool set = dt_kernels_flush_denormals();
    bool kept = !set && tiny * big != 0.0f && small * scale != 0.0f;
    unsetenv("DTRAIN_DENORMALS");
    set = dt_kernels_flush_denormals();
    float in = tiny * big, out = small * scale;
#if defined(__x86_64__) || defined(__i386__)
    _mm_setcsr(saved);
#elif defined(__aarch64__)
    __asm__ volatile("msr fpcr, %0" : : "r"(saved));
#endif
    bool flushed = can ? set && in == 0.0f && out == 0.0f : !set && in != 0.0f && out != 0.0f;
    if (kept && flushed) passed++;
    else { failed++; printf("FAIL: denormals: kept %d, flushed %d (a subnormal input gave %g, a subnormal product %g)\n", kept, flushed, in, out); }
    printf("%-28s %s\n", "denormals flushed to zero", kept && flushed ? "ok" : "wrong");
}

int main(void) {
    dt_kernels_set_threads(1);
    {
        mm_ctx c = { rnd(BT * C, 1), rnd(OC * C, 1), rnd(OC, 1), zeros(BT * OC), rnd(BT * OC, 1) };
        float *di = zeros(BT * C), *dw = zeros(OC * C), *db = zeros(OC);
        dt_matmul_backward(di, dw, db, c.r, c.inp, c.w, BT, C, OC);
        check("matmul d/dinp", mm_J, &c, c.inp, di, BT * C);
        check("matmul d/dw", mm_J, &c, c.w, dw, OC * C);
        check("matmul d/dbias", mm_J, &c, c.b, db, OC);
    }
    {
        ln_ctx c = { rnd(BT * C, 2), rnd(C, 1), rnd(C, 1), zeros(BT * C), zeros(BT), zeros(BT), rnd(BT * C, 1) };
        ln_J(&c);
        float *di = zeros(BT * C), *dw = zeros(C), *db = zeros(C);
        dt_layernorm_backward(di, dw, db, c.r, c.inp, c.w, c.mean, c.rstd, BT, C);
        check("layernorm d/dinp", ln_J, &c, c.inp, di, BT * C);
        check("layernorm d/dw", ln_J, &c, c.w, dw, C);
        check("layernorm d/db", ln_J, &c, c.b, db, C);
    }
    {
        pw_ctx c = { rnd(BT * C, 3), zeros(BT * C), rnd(BT * C, 1), BT * C };
        float *di = zeros(BT * C);
        dt_gelu_backward(di, c.inp, c.r, c.n);
        check("gelu d/dinp", gelu_J, &c, c.inp, di, c.n);
    }
    {
        at_ctx c = { rnd(B * T * 3 * C, 1), zeros(B * T * C), zeros(B * NH * T * T), rnd(B * T * C, 1) };
        at_J(&c);
        float *dq = zeros(B * T * 3 * C);
        dt_attention_backward(dq, c.r, c.qkv, c.att, B, T, C, NH);
        check("attention d/dqkv", at_J, &c, c.qkv, dq, B * T * 3 * C);
    }
    {
        /* blockwise attention: same outputs as the full form, and its own backward checked */
        bw_ctx c = { rnd(B * T * 3 * C, 1), zeros(B * T * C), zeros(B * NH * T), rnd(B * T * C, 1) };
        float *full = zeros(B * T * C), *att = zeros(B * NH * T * T);
        bw_J(&c);
        dt_attention_forward(full, att, c.qkv, B, T, C, NH);
        double md = 0;
        for (int i = 0; i < B * T * C; i++) md = fmax(md, fabs(full[i] - c.out[i]));
        if (md < 1e-5) passed++; else { failed++; printf("FAIL: blockwise attention differs from full by %g\n", md); }
        printf("%-28s max difference %.2e\n", "attention blockwise vs full", md);
        float *dq = zeros(B * T * 3 * C);
        dt_attention_backward_lse(dq, c.r, c.out, c.qkv, c.lse, B, T, C, NH);
        check("attention blockwise d/dqkv", bw_J, &c, c.qkv, dq, B * T * 3 * C);
    }
    {
        int32_t tg[BT];
        for (int i = 0; i < BT; i++) tg[i] = (i * 3) % V;
        ce_ctx c = { rnd(BT * VP, 3), zeros(BT), tg };
        float *g = keep(malloc(BT * VP * 4));
        memcpy(g, c.logits, BT * VP * 4);
        dt_crossentropy_fused(g, c.losses, tg, BT, V, VP, 1.0f / BT, DT_F32);
        check("crossentropy d/dlogits", ce_J, &c, c.logits, g, BT * VP);
        int pad_zero = 1;
        for (int i = 0; i < BT; i++) for (int v = V; v < VP; v++) pad_zero &= g[i * VP + v] == 0.0f;
        if (pad_zero) passed++; else { failed++; printf("FAIL: crossentropy: padded columns got a gradient\n"); }
    }
    {
        int32_t tok[B * T] = { 1, 3, 1, 0, 2, 3 }; /* repeated tokens accumulate */
        em_ctx c = { rnd(4 * C, 1), rnd(T * C, 1), zeros(B * T * C), rnd(B * T * C, 1), tok };
        float *dwte = zeros(4 * C), *dwpe = zeros(T * C);
        dt_embedding_backward(dwte, dwpe, c.r, tok, B, T, C);
        check("embedding d/dwte", em_J, &c, c.wte, dwte, 4 * C);
        check("embedding d/dwpe", em_J, &c, c.wpe, dwpe, T * C);
    }
    blockwise_over_several_blocks();
    llama_kernels();
    entropy_term();
    tanh_within_ulps_of_libm();
#ifndef __SANITIZE_THREAD__
    threads_give_the_same_results();
#else
    /* libgomp is not built with ThreadSanitizer, so the barriers between its parallel regions are invisible
     * to it and every multi-threaded kernel reports races; the normal and ASan builds run this comparison */
    printf("kernels on 3 threads vs 1: not run under ThreadSanitizer (uninstrumented libgomp)\n");
#endif
    denormals_flush_to_zero();
    for (int i = 0; i < nowned; i++) free(owned[i]);
    printf("kernels: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
