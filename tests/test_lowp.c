/* 16-bit storage and the mixed-precision Linear: packing and rounding
 * against the scalar conversions of base (special values, ties, f16's
 * overflow and subnormals), and dt_matmul_*_lp against a double-precision
 * reference of autocast's linear: 16-bit inputs and weights, sums in f32 (or
 * better), 16-bit outputs and gradients; the weights widened in several
 * chunks of rows; the cross-entropy's 16-bit gradient. */
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static unsigned rng = 777;
static float urand(void) { rng = rng * 1664525u + 1013904223u; return (float)(rng >> 8) / (float)(1u << 24) * 2.0f - 1.0f; }

static float scalar_round(float x, dt_dtype t) { return t == DT_BF16 ? dt_bf16_to_f32(dt_f32_to_bf16(x)) : dt_f16_to_f32(dt_f32_to_f16(x)); }
static int same(float a, float b) { return (isnan(a) && isnan(b)) || memcmp(&a, &b, 4) == 0; }

/* How many steps of the 16-bit grid lie between two values already on it:
 * consecutive finite values of the same sign have consecutive bit patterns
 * (subnormals included), so the steps are the patterns' distance. */
static int grid_steps(float a, float b, dt_dtype t) {
    uint16_t ha = t == DT_BF16 ? dt_f32_to_bf16(a) : dt_f32_to_f16(a), hb = t == DT_BF16 ? dt_f32_to_bf16(b) : dt_f32_to_f16(b);
    if (scalar_round(a, t) != a || scalar_round(b, t) != b) return 1 << 20; /* off the grid: not a rounding apart */
    if ((ha ^ hb) & 0x8000) return (ha & 0x7fff) + (hb & 0x7fff);          /* across zero */
    return abs((int)(ha & 0x7fff) - (int)(hb & 0x7fff));
}

static void conversions(dt_dtype t) {
    const char *tn = t == DT_BF16 ? "bf16" : "f16";
    enum { N = 4099 }; /* not a multiple of the vector width */
    float *x = malloc(N * 4), *y = malloc(N * 4), *z = malloc(N * 4);
    uint16_t *h = malloc(N * 2);
    const float special[] = { 0.0f, -0.0f, INFINITY, -INFINITY, NAN, 65504.0f, 65520.0f, 1e6f, -1e6f, 6e-8f, 3e-8f, 1e-40f,
                              1.0f + 1.0f / 256, 1.0f + 3.0f / 512, 1.0f + 1.0f / 2048, 1.0f + 3.0f / 2048, 3.4e38f, 5.9604645e-08f };
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int i = 0; i < N; i++) x[i] = i < ns ? special[i] : urand() * powf(2.0f, (float)(i % 60 - 40));
    dt_lp_pack(h, x, N, t);
    dt_lp_unpack(y, h, N, t);
    memcpy(z, x, N * 4);
    dt_lp_round(z, N, t);
    int bad_pack = 0, bad_round = 0;
    for (int i = 0; i < N; i++) {
        uint16_t want = t == DT_BF16 ? dt_f32_to_bf16(x[i]) : dt_f32_to_f16(x[i]);
        if (!(h[i] == want || (isnan(x[i]) && isnan(y[i])))) { if (bad_pack++ < 3) printf("%s pack %g: %04x, want %04x\n", tn, x[i], h[i], want); }
        if (!same(z[i], scalar_round(x[i], t)) || !same(z[i], y[i])) { if (bad_round++ < 3) printf("%s round %g: %g\n", tn, x[i], z[i]); }
    }
    EXPECT(!bad_pack, "%s: %d of %d values packed unlike dt_f32_to_%s", tn, bad_pack, N, tn);
    EXPECT(!bad_round, "%s: %d of %d values rounded unlike pack + unpack", tn, bad_round, N);
    if (t == DT_F16) EXPECT(isinf(z[6]) && z[5] == 65504.0f && isinf(z[7]), "f16: 65504 stays, 65520 and 1e6 overflow to inf (%g %g %g)",
                            z[5], z[6], z[7]);
    /* round-and-add */
    for (int i = 0; i < N; i++) y[i] = 1.0f;
    dt_lp_round_add(y, x + ns, N - ns, t);
    int bad_add = 0;
    for (int i = 0; i < N - ns; i++) bad_add += !same(y[i], 1.0f + scalar_round(x[ns + i], t));
    EXPECT(!bad_add, "%s: round_add differs from 1 + round(x) at %d places", tn, bad_add);
    /* in place (blocks of 1024, the first overlapping itself): the packed values, then the widened ones */
    enum { NI = 5000 };
    float *ip = malloc(sizeof(float) * NI), *ref = malloc(sizeof(float) * NI);
    uint16_t *packed = malloc(2 * NI);
    for (int i = 0; i < NI; i++) ip[i] = urand() * 100.0f;
    dt_lp_pack(packed, ip, NI, t);
    dt_lp_unpack(ref, packed, NI, t);
    dt_lp_narrow_inplace(ip, NI, t);
    int bad_narrow = memcmp(ip, packed, 2 * NI) != 0;
    dt_lp_widen_inplace(ip, NI, t);
    int bad_widen = memcmp(ip, ref, sizeof(float) * NI) != 0;
    EXPECT(!bad_narrow && !bad_widen, "%s: in place, narrowing %s and widening %s", tn, bad_narrow ? "differs from pack" : "ok",
           bad_widen ? "differs from unpack" : "ok");
    free(ip), free(ref), free(packed);
    printf("%s: %d values packed, widened and rounded as the scalar conversions\n", tn, N);
    free(x), free(y), free(z), free(h);
}

/* autocast's linear in double from 16-bit values: the reference */
static void linear_lp(dt_dtype t) {
    const char *tn = t == DT_BF16 ? "bf16" : "f16";
    /* 256 rows a chunk (the work given below), so OC = 600 takes three chunks */
    enum { BT = 6, C = 4096, OC = 600 };
    float *inp = malloc(sizeof(float) * BT * C), *wf = malloc(sizeof(float) * OC * C), *bf = malloc(sizeof(float) * OC);
    uint16_t *w = malloc(2 * (size_t)OC * C), *b = malloc(2 * OC);
    float *out = malloc(sizeof(float) * BT * OC), *dout = malloc(sizeof(float) * BT * OC), *dout0 = malloc(sizeof(float) * BT * OC);
    float *dinp = calloc((size_t)BT * C, 4), *dw = calloc((size_t)OC * C, 4), *db = calloc(OC, 4);
    /* room for 256 rows of weights at a time: three chunks */
    size_t nwork = 2 * 256 * (size_t)C;
    float *work = malloc(sizeof(float) * nwork);
    float s = t == DT_F16 ? 0.05f : 1.0f; /* keep f16's sums in range */
    for (size_t i = 0; i < (size_t)BT * C; i++) inp[i] = scalar_round(urand() * s, t);
    for (size_t i = 0; i < (size_t)OC * C; i++) wf[i] = urand() * s;
    for (int i = 0; i < OC; i++) bf[i] = urand();
    for (size_t i = 0; i < (size_t)BT * OC; i++) dout0[i] = dout[i] = urand() * 1e-2f;
    dt_lp_pack(w, wf, (size_t)OC * C, t);
    dt_lp_pack(b, bf, OC, t);
    dt_lp_unpack(wf, w, (size_t)OC * C, t);
    dt_lp_unpack(bf, b, OC, t);
    dt_matmul_forward_lp(out, inp, w, b, BT, C, OC, t, work, nwork, 0);
    double worst = 0;
    int not16 = 0;
    for (int i = 0; i < BT; i++)
        for (int o = 0; o < OC; o++) {
            double ref = bf[o];
            for (int k = 0; k < C; k++) ref += (double)inp[i * C + k] * wf[(size_t)o * C + k];
            float got = out[i * OC + o];
            not16 += !same(got, scalar_round(got, t));
            double e = fabs(got - ref) / (fabs(ref) + 1e-3);
            if (e > worst) worst = e;
        }
    double ulp = t == DT_BF16 ? 1.0 / 128 : 1.0 / 1024; /* one unit in the last place, relative */
    /* f16's subnormals (below 2^-14) are spaced 2^-24 apart: rounding there costs up to 2^-25 absolute */
    double floor16 = t == DT_F16 ? 0x1p-25 : 0;
    EXPECT(not16 == 0, "%s forward: %d outputs are not %s values", tn, not16, tn);
    EXPECT(worst <= ulp, "%s forward: worst relative error %.3g against the double reference (one ulp %.3g)", tn, worst, ulp);
    printf("%s linear forward (%d chunks of rows): worst relative error %.2g, one %s ulp %.2g\n", tn, (OC + 255) / 256, worst, tn, ulp);

    dt_lp_round(dout, (size_t)BT * OC, t);
    dt_matmul_backward_lp(dinp, dw, db, dout, inp, w, BT, C, OC, t, work, nwork, 0);
    int di16 = 0, dw16 = 0;
    double wi = 0, ww = 0, wb = 0;
    for (int i = 0; i < BT; i++)
        for (int k = 0; k < C; k += 7) {
            double ref = 0;
            for (int o = 0; o < OC; o++) ref += (double)dout[i * OC + o] * wf[(size_t)o * C + k];
            float got = dinp[i * C + k];
            di16 += !same(got, scalar_round(got, t));
            wi = fmax(wi, fmax(0, fabs(got - ref) - floor16) / (fabs(ref) + 1e-9));
        }
    for (int o = 0; o < OC; o += 5)
        for (int k = 0; k < C; k += 11) {
            double ref = 0;
            for (int i = 0; i < BT; i++) ref += (double)dout[i * OC + o] * inp[i * C + k];
            float got = dw[(size_t)o * C + k];
            dw16 += !same(got, scalar_round(got, t));
            ww = fmax(ww, fmax(0, fabs(got - ref) - floor16) / (fabs(ref) + 1e-9));
        }
    for (int o = 0; o < OC; o++) {
        double ref = 0;
        for (int i = 0; i < BT; i++) ref += dout[i * OC + o];
        wb = fmax(wb, fmax(0, fabs(db[o] - ref) - floor16) / (fabs(ref) + 1e-9));
    }
    EXPECT(di16 == 0 && dw16 == 0, "%s backward: %d input and %d weight gradients are not %s values", tn, di16, dw16, tn);
    EXPECT(wi <= ulp && ww <= ulp && wb <= ulp, "%s backward: worst relative errors dinp %.3g dw %.3g dbias %.3g (one ulp %.3g)", tn,
           wi, ww, wb, ulp);
    printf("%s linear backward: worst relative errors dinp %.2g, dw %.2g, dbias %.2g\n", tn, wi, ww, wb);
    free(inp), free(wf), free(bf), free(w), free(b), free(out), free(dout), free(dout0), free(dinp), free(dw), free(db), free(work);
}

/* The head's gradient comes out of the cross-entropy rounded to 16 bits, as the f32 one rounded. */
static void crossentropy_lp(dt_dtype t) {
    enum { BT = 5, V = 1000, Vp = 1024 };
    float *a = malloc(sizeof(float) * BT * Vp), *b = malloc(sizeof(float) * BT * Vp), *c = malloc(sizeof(float) * BT * Vp);
    float la[BT], lb[BT], lc[BT], stats[2 * BT];
    int32_t tg[BT];
    for (int i = 0; i < BT * Vp; i++) a[i] = b[i] = c[i] = scalar_round(urand() * 4, t);
    for (int i = 0; i < BT; i++) tg[i] = (i * 37) % V;
    float ma = dt_crossentropy_fused(a, la, tg, BT, V, Vp, 0.125f, DT_F32), mb = dt_crossentropy_fused(b, lb, tg, BT, V, Vp, 0.125f, t);
    int bad = ma != mb;
    for (int i = 0; i < BT * Vp; i++) bad += !same(b[i], scalar_round(a[i], t));
    EXPECT(!bad, "%s cross-entropy: %d gradients are not the f32 ones rounded", t == DT_BF16 ? "bf16" : "f16", bad);
    /* forward's statistics, then backward: the fused one's losses and gradients, bit for bit */
    float mc = dt_crossentropy_forward(lc, stats, c, tg, BT, V, Vp);
    dt_crossentropy_backward(c, stats, tg, BT, V, Vp, 0.125f);
    bad = ma != mc;
    for (int i = 0; i < BT; i++) bad += la[i] != lc[i];
    for (int i = 0; i < BT * Vp; i++) bad += !same(c[i], a[i]);
    EXPECT(!bad, "cross-entropy backward from forward's statistics: %d losses or gradients differ from the fused one's", bad);
    free(a), free(b), free(c);
}

/* The LM head with 16-bit logits (dt_matmul_*_lp16, chunks of weight rows
 * and of tokens) against the f32-output linear above, and the cross-entropy
 * on 16-bit logits against the f32 one's rounded gradient. */
static void head_lp16(dt_dtype t) {
    const char *tn = t == DT_BF16 ? "bf16" : "f16";
    /* 64 rows a chunk, 16 tokens a block: 10 chunks of rows, 3 blocks of tokens */
    enum { BT = 40, C = 16, OC = 600, V = 590 };
    size_t nwork = 3 * 64 * (size_t)C, big = 2 * (size_t)OC * C;
    float *inp = malloc(sizeof(float) * BT * C), *wf = malloc(sizeof(float) * OC * C), *ref = malloc(sizeof(float) * BT * OC);
    float *got = malloc(sizeof(float) * BT * OC), *work = malloc(sizeof(float) * (big > nwork ? big : nwork));
    float *di = calloc((size_t)BT * C, 4), *dw = calloc((size_t)OC * C, 4), *di16 = calloc((size_t)BT * C, 4), *dw16 = calloc((size_t)OC * C, 4);
    uint16_t *w = malloc(2 * (size_t)OC * C), *out = malloc(2 * (size_t)BT * OC);
    float la[BT], lb[BT], lc[BT], stats[2 * BT];
    float *di_ce = calloc((size_t)BT * C, 4), *dw_ce = calloc((size_t)OC * C, 4);
    uint16_t *logits = malloc(2 * (size_t)BT * OC);
    int32_t tg[BT];
    for (size_t i = 0; i < (size_t)BT * C; i++) inp[i] = scalar_round(urand(), t);
    for (size_t i = 0; i < (size_t)OC * C; i++) wf[i] = urand();
    for (int i = 0; i < BT; i++) tg[i] = (i * 37) % V;
    dt_lp_pack(w, wf, (size_t)OC * C, t);
    dt_matmul_forward_lp(ref, inp, w, NULL, BT, C, OC, t, work, big, 0);
    dt_matmul_forward_lp16(out, inp, w, BT, C, OC, t, work, nwork);
    dt_lp_unpack(got, out, (size_t)BT * OC, t);
    /* the same products summed in f32 by sgemm calls of other shapes: an f32 ulp may tip a 16-bit rounding */
    int differ = 0;
    double wf16 = 0, ulp = t == DT_BF16 ? 1.0 / 128 : 1.0 / 1024;
    for (int i = 0; i < BT * OC; i++) {
        differ += !same(got[i], ref[i]);
        wf16 = fmax(wf16, fabs(got[i] - ref[i]) / (fabs(ref[i]) + 1e-6));
    }
    EXPECT(wf16 <= ulp, "%s head forward: 16-bit logits %.3g from the f32-output linear's (one ulp %.3g)", tn, wf16, ulp);
    dt_lp_pack(out, ref, (size_t)BT * OC, t); /* the cross-entropy's input: the same logits for both */
    memcpy(logits, out, 2 * (size_t)BT * OC);
    float mc = dt_crossentropy_forward_lp(lc, stats, logits, tg, BT, V, OC, t, work, nwork);
    float ma = dt_crossentropy_fused(ref, la, tg, BT, V, OC, 0.5f, t);
    float mb = dt_crossentropy_fused_lp(out, lb, tg, BT, V, OC, 0.5f, t, work, nwork);
    dt_lp_unpack(got, out, (size_t)BT * OC, t);
    differ = ma != mb;
    for (int i = 0; i < BT; i++) differ += la[i] != lb[i];
    for (int i = 0; i < BT * OC; i++) differ += !same(got[i], ref[i]);
    EXPECT(!differ, "%s cross-entropy on 16-bit logits: %d losses or gradients differ from the f32 one's", tn, differ);
    dt_matmul_backward_lp(di, dw, NULL, ref, inp, w, BT, C, OC, t, work, big, 0);
    dt_matmul_backward_lp16(di16, dw16, out, NULL, inp, w, BT, C, OC, t, work, nwork, 0);
    /* the loss's gradient computed block by block as backward reads the logits: the same bits as the fused pass */
    dt_ce_grad ce = { .stats = stats, .targets = tg, .V = V, .dscale = 0.5f };
    dt_matmul_backward_lp16(di_ce, dw_ce, logits, &ce, inp, w, BT, C, OC, t, work, nwork, 0);
    int ce_differ = mc != mb;
    for (int i = 0; i < BT; i++) ce_differ += lc[i] != lb[i];
    for (int i = 0; i < BT * C; i++) ce_differ += !same(di_ce[i], di16[i]);
    for (int i = 0; i < OC * C; i++) ce_differ += !same(dw_ce[i], dw16[i]);
    EXPECT(!ce_differ, "%s head backward with the loss's gradient taken as read: %d losses or gradients differ from the fused pass's",
           tn, ce_differ);
    /* the weight gradient is summed over 3 blocks of tokens, not at once: another f32 order (it depends on the
     * BLAS kernels, so on the CPU), then the same rounding. An f32 difference can tip that rounding by one step
     * of the 16-bit grid at the value, never more. The step is measured on the grid itself: f16's small
     * gradients here are subnormal, where a relative ulp understates the step (Zen 3's sgemm order showed it). */
    int wi = 0, ww = 0, tipped = 0;
    for (int i = 0; i < BT * C; i++) { int d = grid_steps(di16[i], di[i], t); wi = d > wi ? d : wi; tipped += d > 0; }
    for (int i = 0; i < OC * C; i++) { int d = grid_steps(dw16[i], dw[i], t); ww = d > ww ? d : ww; tipped += d > 0; }
    EXPECT(wi <= 1 && ww <= 1, "%s head backward from 16-bit logits: dinp %d, dw %d steps of the 16-bit grid from the f32 path's (at most 1)",
           tn, wi, ww);
    printf("%s head with 16-bit logits: %d of %d logits one ulp from the f32-output path's; loss and its gradient identical; "
           "backward: %d of %d gradients one grid step apart, none more\n", tn, differ, BT * OC, tipped, BT * C + OC * C);
    free(inp), free(wf), free(ref), free(got), free(work), free(di), free(dw), free(di16), free(dw16), free(w), free(out);
    free(di_ce), free(dw_ce), free(logits);
}

/* The bf16 GEMM (oneDNN, where the CPU has avx512_bf16): there exactly when
 * it should be, and every transpose and accumulate case against a double
 * reference (the products of bf16 values are exact in f32; only the order
 * of the f32 sums differs). */
static void gemm_bf16_cases(void) {
    const char *e = getenv("DTRAIN_BF16_GEMM");
    int cpu = dt_cpu_has("avx512_bf16"), built = dt_gemm_bf16_built(), off = e && !strcmp(e, "0");
    EXPECT(dt_gemm_bf16_ready() == (cpu && built && !off), "bf16 GEMM ready %d: CPU avx512_bf16 %d, built with oneDNN %d, turned off %d",
           dt_gemm_bf16_ready(), cpu, built, off);
    if (!dt_gemm_bf16_ready()) {
        printf("bf16 GEMM: none here (%s); the 16-bit matmuls widen into sgemm (checked above)\n",
               !cpu ? "this CPU has no avx512_bf16" : !built ? "built without oneDNN" : "DTRAIN_BF16_GEMM=0");
        return;
    }
    enum { M = 37, N = 53, K = 129 };
    uint16_t *a = malloc(2 * M * K), *b = malloc(2 * K * N);
    float *c = malloc(sizeof(float) * M * N), *c0 = malloc(sizeof(float) * M * N), *x = malloc(sizeof(float) * K * (M + N));
    for (int i = 0; i < K * (M + N); i++) x[i] = urand();
    dt_lp_pack(a, x, (size_t)M * K, DT_BF16);
    dt_lp_pack(b, x + M * K, (size_t)K * N, DT_BF16);
    for (int i = 0; i < M * N; i++) c0[i] = urand();
    double worst = 0;
    int done = 0;
    for (int ta = 0; ta < 2; ta++)
        for (int tb = 0; tb < 2; tb++)
            for (int acc = 0; acc < 2; acc++) {
                memcpy(c, c0, sizeof(float) * M * N);
                /* the same arrays read as op(A) M x K and op(B) K x N */
                int lda = ta ? M : K, ldb = tb ? K : N;
                done += dt_gemm_bf16(ta, tb, M, N, K, a, lda, b, ldb, acc, c, N);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double ref = acc ? c0[i * N + j] : 0, mag = fabs(ref);
                        for (int k = 0; k < K; k++) {
                            double p = (double)dt_bf16_to_f32(a[ta ? k * M + i : i * K + k]) * dt_bf16_to_f32(b[tb ? j * K + k : k * N + j]);
                            ref += p;
                            mag += fabs(p);
                        }
                        worst = fmax(worst, fabs(c[i * N + j] - ref) / mag);
                    }
            }
    EXPECT(done == 8 && worst <= 1e-6, "bf16 GEMM: %d of 8 cases ran, worst error %.3g of the sum of |products|", done, worst);
    printf("bf16 GEMM (oneDNN): all 8 transpose and accumulate cases within %.2g of the sum of |products|\n", worst);
    free(a), free(b), free(c), free(c0), free(x);
}

int main(void) {
    dt_kernels_set_threads(1);
    conversions(DT_BF16);
    conversions(DT_F16);
    gemm_bf16_cases();
    /* bf16 through the bf16 GEMM where there is one, then through sgemm on widened weights */
    for (int g = dt_gemm_bf16_ready(); g >= 0; g--) {
        dt_gemm_bf16_enable(g);
        printf("-- bf16 matmuls through %s\n", g ? "the bf16 GEMM" : "sgemm");
        linear_lp(DT_BF16);
        head_lp16(DT_BF16);
    }
    dt_gemm_bf16_enable(1);
    linear_lp(DT_F16);
    crossentropy_lp(DT_BF16);
    crossentropy_lp(DT_F16);
    head_lp16(DT_F16);
    printf("lowp: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
