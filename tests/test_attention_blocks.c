/* Attention by blocks of the sequence (ring attention's kernels) against
 * the whole sequence's blockwise attention (dt_attention_forward_lse and
 * its backward): at an odd length cut into uneven chunks, each query
 * chunk's attention merged over every key chunk (in a ring's order: its
 * own first, then the others, the ones wholly after it included) gives the
 * whole attention's output and log-sum-exp, and the chunks' backward
 * shares sum to its gradients, within 1e-5; a chunk whose queries see no
 * key of a block gets nothing from it (its backward share included). The
 * whole-sequence form is itself one block over one block: it is checked
 * against the T x T form (dt_attention_forward) in test_kernels. */
#include "dtrain/base.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double max_rel(const float *a, const float *b, size_t n) {
    double d = 0, m = 0;
    for (size_t i = 0; i < n; i++) {
        d = fmax(d, fabs((double)a[i] - b[i]));
        m = fmax(m, fabs((double)b[i]));
    }
    return m > 0 ? d / m : d;
}

/* The chunks [cut[i], cut[i+1]) of a [B, T, 3C] qkv; order[]: which chunks a rank holds (the rest are its ring's). */
static void check(int B, int T, int C, int NH, const int *cut, int nc, const char *what) {
    size_t C3 = 3 * (size_t)C, n = (size_t)B * T * C3;
    float *qkv = malloc(n * sizeof(float)), *dout = malloc((size_t)B * T * C * sizeof(float));
    float *out = malloc((size_t)B * T * C * sizeof(float)), *lse = malloc((size_t)B * NH * T * sizeof(float));
    float *dqkv = calloc(n, sizeof(float)), *dqkv2 = calloc(n, sizeof(float));
    uint64_t r = 5;
    for (size_t i = 0; i < n; i++) qkv[i] = (float)((dt_rng_next(&r) >> 11) / 9007199254740992.0 * 2 - 1);
    for (size_t i = 0; i < (size_t)B * T * C; i++) dout[i] = (float)((dt_rng_next(&r) >> 11) / 9007199254740992.0 * 2 - 1);
    dt_attention_forward_lse(out, lse, qkv, B, T, C, NH);
    dt_attention_backward_lse(dqkv, dout, out, qkv, lse, B, T, C, NH);
    double worst_o = 0, worst_l = 0, worst_g = 0;
    int empty = 1;
    for (int a = 0; a < nc; a++) {
        int q0 = cut[a], Tq = cut[a + 1] - cut[a];
        /* this chunk's rows as their own [B, Tq, 3C] (a rank's slice), and its part of the whole results */
        float *mine = malloc((size_t)B * Tq * C3 * sizeof(float)), *o = calloc((size_t)B * Tq * C, sizeof(float));
        float *l = malloc((size_t)B * NH * Tq * sizeof(float)), *bo = malloc((size_t)B * Tq * C * sizeof(float));
        float *bl = malloc((size_t)B * NH * Tq * sizeof(float)), *dy = malloc((size_t)B * Tq * C * sizeof(float));
        float *dmine = calloc((size_t)B * Tq * C3, sizeof(float));
        for (int b = 0; b < B; b++) {
            memcpy(mine + (size_t)b * Tq * C3, qkv + ((size_t)b * T + q0) * C3, (size_t)Tq * C3 * sizeof(float));
            memcpy(dy + (size_t)b * Tq * C, dout + ((size_t)b * T + q0) * C, (size_t)Tq * C * sizeof(float));
        }
        for (size_t i = 0; i < (size_t)B * NH * Tq; i++) l[i] = -INFINITY;
        dt_attn_rows q = { mine, C3, q0, Tq };
        float **kv = calloc((size_t)nc, sizeof *kv), **dkv = calloc((size_t)nc, sizeof *dkv);
        for (int s = 0; s < nc; s++) {
            int c = (a + s) % nc, k0 = cut[c], Tk = cut[c + 1] - cut[c]; /* the ring's order: own chunk first */
            /* the block as a ring passes it: keys and values [B, Tk, 2C] */
            kv[c] = malloc((size_t)B * Tk * 2 * C * sizeof(float));
            dkv[c] = calloc((size_t)B * Tk * 2 * C, sizeof(float));
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tk; t++)
                    memcpy(kv[c] + ((size_t)b * Tk + t) * 2 * C, qkv + ((size_t)b * T + k0 + t) * C3 + C, 2 * (size_t)C * sizeof(float));
            dt_attn_rows k = { kv[c], 2 * (size_t)C, k0, Tk }, v = { kv[c] + C, 2 * (size_t)C, k0, Tk };
            dt_attention_block_forward(bo, bl, &q, &k, &v, B, C, NH);
            if (k0 > q0 + Tq - 1) { /* every key after every query: nothing */
                for (size_t i = 0; i < (size_t)B * NH * Tq; i++) empty &= bl[i] == -INFINITY;
                for (size_t i = 0; i < (size_t)B * Tq * C; i++) empty &= bo[i] == 0;
            }
            dt_attention_merge(o, l, bo, bl, B, Tq, C, NH);
        }
        for (int b = 0; b < B; b++) {
            worst_o = fmax(worst_o, max_rel(o + (size_t)b * Tq * C, out + ((size_t)b * T + q0) * C, (size_t)Tq * C));
            for (int h = 0; h < NH; h++)
                worst_l = fmax(worst_l, max_rel(l + ((size_t)b * NH + h) * Tq, lse + ((size_t)b * NH + h) * T + q0, (size_t)Tq));
        }
        /* backward: each block's share, from the merged out and lse, into this chunk's dq and the block's dk, dv */
        for (int s = 0; s < nc; s++) {
            int c = (a + s) % nc, k0 = cut[c], Tk = cut[c + 1] - cut[c];
            dt_attn_rows k = { kv[c], 2 * (size_t)C, k0, Tk }, v = { kv[c] + C, 2 * (size_t)C, k0, Tk };
            dt_attn_grads g = { dmine, dkv[c], dkv[c] + C, C3, 2 * (size_t)C };
            dt_attention_block_backward(&g, dy, o, l, &q, &k, &v, B, C, NH);
            for (int b = 0; b < B; b++)
                for (int t = 0; t < Tk; t++)
                    for (int i = 0; i < 2 * C; i++) dqkv2[((size_t)b * T + k0 + t) * C3 + C + i] += dkv[c][((size_t)b * Tk + t) * 2 * C + i];
            free(kv[c]);
            free(dkv[c]);
        }
        for (int b = 0; b < B; b++)
            for (int t = 0; t < Tq; t++)
                for (int i = 0; i < C; i++) dqkv2[((size_t)b * T + q0 + t) * C3 + i] += dmine[((size_t)b * Tq + t) * C3 + i];
        free(kv); free(dkv); free(mine); free(o); free(l); free(bo); free(bl); free(dy); free(dmine);
    }
    worst_g = max_rel(dqkv2, dqkv, n);
    EXPECT(worst_o <= 1e-5 && worst_l <= 1e-5 && worst_g <= 1e-5 && empty,
           "%s: output %.2g, log-sum-exp %.2g, gradients %.2g (1e-5); blocks wholly after the queries gave nothing: %s", what,
           worst_o, worst_l, worst_g, empty ? "yes" : "no");
    printf("%s: output %.2g, lse %.2g, dq/dk/dv %.2g relative to the whole sequence's\n", what, worst_o, worst_l, worst_g);
    free(qkv); free(dout); free(out); free(lse); free(dqkv); free(dqkv2);
}

/* A row packing documents [cut[i], cut[i+1]) (first[t]: its document's start) gives each document's attention alone,
 * in the T x T form and the blockwise one, forward and backward, within 1e-6; T 150 puts a document past a key block. */
static void check_docs(int T, int C, int NH, const int *cut, int nc) {
    size_t C3 = 3 * (size_t)C, n = (size_t)T * C3;
    float *qkv = malloc(n * sizeof(float)), *dout = malloc((size_t)T * C * sizeof(float)), *att = malloc((size_t)NH * T * T * sizeof(float));
    float *out[2], *dq[2], *lse = malloc((size_t)NH * T * sizeof(float));
    float *ro = malloc((size_t)T * C * sizeof(float)), *rd = calloc(n, sizeof(float));
    int32_t *first = malloc((size_t)T * sizeof(int32_t));
    uint64_t r = 9;
    for (size_t i = 0; i < n; i++) qkv[i] = (float)((dt_rng_next(&r) >> 11) / 9007199254740992.0 * 2 - 1);
    for (size_t i = 0; i < (size_t)T * C; i++) dout[i] = (float)((dt_rng_next(&r) >> 11) / 9007199254740992.0 * 2 - 1);
    for (int d = 0; d < nc; d++)
        for (int t = cut[d]; t < cut[d + 1]; t++) first[t] = cut[d];
    for (int k = 0; k < 2; k++) out[k] = malloc((size_t)T * C * sizeof(float)), dq[k] = calloc(n, sizeof(float));
    dt_attention_forward_docs(out[0], att, qkv, first, 1, T, C, NH);
    dt_attention_backward_docs(dq[0], dout, qkv, att, first, 1, T, C, NH);
    dt_attention_forward_lse_docs(out[1], lse, qkv, first, 1, T, C, NH);
    dt_attention_backward_lse_docs(dq[1], dout, out[1], qkv, lse, first, 1, T, C, NH);
    for (int d = 0; d < nc; d++) { /* each document alone: the reference */
        int a = cut[d], len = cut[d + 1] - a;
        dt_attention_forward(ro + (size_t)a * C, att, qkv + (size_t)a * C3, 1, len, C, NH);
        dt_attention_backward(rd + (size_t)a * C3, dout + (size_t)a * C, qkv + (size_t)a * C3, att, 1, len, C, NH);
    }
    for (int k = 0; k < 2; k++) {
        double eo = max_rel(out[k], ro, (size_t)T * C), ed = max_rel(dq[k], rd, n);
        EXPECT(eo <= 1e-6 && ed <= 1e-6, "T %d, %d documents packed (%s): output %.1e, dqkv %.1e against each alone", T, nc,
               k ? "blockwise" : "T x T", eo, ed);
        if (eo <= 1e-6 && ed <= 1e-6) printf("T %d, %d documents packed (%s): output %.1e, dqkv %.1e against each document alone\n", T, nc,
                                             k ? "blockwise" : "T x T", eo, ed);
        free(out[k]), free(dq[k]);
    }
    free(qkv), free(dout), free(att), free(lse), free(ro), free(rd), free(first);
}

int main(void) {
    dt_kernels_set_threads(1);
    const int odd[] = { 0, 9, 23, 28, 45 };       /* T = 45 in uneven chunks of 9, 14, 5, 17 */
    check(2, 45, 24, 3, odd, 4, "T 45, 4 uneven chunks");
    const int one[] = { 0, 1, 2, 3 };             /* single-token chunks */
    check(1, 3, 8, 2, one, 3, "T 3, chunks of one token");
    const int bal[] = { 0, 50, 100, 150, 200 };   /* CP 2's load-balanced chunks; keys past a row's block of 64 */
    check(1, 200, 32, 2, bal, 4, "T 200, 4 chunks of 50 (CP 2's load-balanced chunks; rows past a block of 64 keys)");
    const int docs[] = { 0, 1, 30, 100, 150 };    /* a one-token document, one across a key block's end */
    check_docs(150, 24, 3, docs, 4);
    printf("attention blocks: %d passed, %d failed\n", passed, failed);
    return failed != 0;
}
