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

static int passed, failed;
static unsigned rng = 12345;
static float urand(void) { rng = rng * 1664525u + 1013904223u; return (float)(rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }
/* Every buffer of the test, freed at the end. */
static void *owned[64];
static int nowned;
static float *keep(float *p) { owned[nowned++] = p; return p; }
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
static double ce_J(void *p) { ce_ctx *c = p; return dt_crossentropy_forward(c->losses, c->logits, c->tg, BT, V, VP); }

typedef struct { float *wte, *wpe, *out, *r; int32_t *tok; } em_ctx;
static double em_J(void *p) { em_ctx *c = p; dt_embedding_forward(c->out, c->tok, c->wte, c->wpe, B, T, C); return dot(c->out, c->r, B * T * C); }

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
        dt_crossentropy_fused(g, c.losses, tg, BT, V, VP, 1.0f / BT);
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
    for (int i = 0; i < nowned; i++) free(owned[i]);
    printf("kernels: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
