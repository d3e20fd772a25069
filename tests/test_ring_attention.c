/* Ring attention and all-to-all (Ulysses) attention over the ranks (context parallelism) against one
 * process's attention over the whole sequence: every rank makes the same
 * random q, k, v and output gradient for the whole sequence, runs the
 * whole-sequence blockwise attention as the oracle, then the ring on its
 * two load-balanced chunks (r and 2N-1-r), and compares its rows' output,
 * log-sum-exp and q/k/v gradients within 1e-5: chunks of odd length, and
 * chunks longer than the kernel's block of 64 keys. A length that does not
 * split into 2N chunks is refused, and all-to-all attention with heads
 * that do not split over the ranks. Runs under dtrain launch -n N. */
#include "dtrain/base.h"
#include "dtrain/context.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed, r;
#define CHECK(cond, ...) do { if (cond) passed++; else { failed++; printf("rank %d: FAIL ", r); printf(__VA_ARGS__); printf("\n"); } } while (0)

static double rel(double d, double m) { return m > 0 ? d / m : d; }

/* bound: where the ring's blocks travel coded (wire), what they may part from one process by (else 1e-5) */
static void check_wire(dt_comm *w, int ulysses, dt_pp_wire wire, double bound, int B, int T, int C, int NH) {
    int N = dt_comm_size(w);
    dt_cp_config c = { w, B, T, C, NH, NULL, wire, 0 };
    int tc = dt_ring_chunk_rows(&c);
    double eo = 0, mo_ = 0, el = 0, ml_ = 0, eg = 0, mg = 0;
    size_t C3 = 3 * (size_t)C, n = (size_t)B * T * C3, rows = (size_t)B * 2 * tc;
    float *qkv = malloc(n * sizeof(float)), *dy = malloc((size_t)B * T * C * sizeof(float)), *out = malloc((size_t)B * T * C * sizeof(float));
    float *lse = malloc((size_t)B * NH * T * sizeof(float)), *dqkv = calloc(n, sizeof(float));
    float *mq = malloc(rows * C3 * sizeof(float)), *mdy = malloc(rows * C * sizeof(float)), *mo = malloc(rows * C * sizeof(float));
    float *ml = malloc((size_t)B * 2 * NH * tc * sizeof(float)), *md = calloc(rows * C3, sizeof(float));
    float *work = malloc((ulysses ? dt_ulysses_work_floats(&c) : dt_ring_work_floats(&c)) * sizeof(float));
    uint64_t s = 17;
    for (size_t i = 0; i < n; i++) qkv[i] = (float)((dt_rng_next(&s) >> 11) / 9007199254740992.0 * 2 - 1);
    for (size_t i = 0; i < (size_t)B * T * C; i++) dy[i] = (float)((dt_rng_next(&s) >> 11) / 9007199254740992.0 * 2 - 1);
    dt_attention_forward_lse(out, lse, qkv, B, T, C, NH);
    dt_attention_backward_lse(dqkv, dy, out, qkv, lse, B, T, C, NH);
    /* this rank's rows: its chunks r and 2N-1-r of each sequence */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < 2; i++) {
            size_t from = (size_t)b * T + (size_t)dt_ring_chunk_pos(&c, r, i), to = (size_t)b * 2 * tc + (size_t)i * tc;
            memcpy(mq + to * C3, qkv + from * C3, (size_t)tc * C3 * sizeof(float));
            memcpy(mdy + to * C, dy + from * C, (size_t)tc * C * sizeof(float));
        }
    char name[64];
    snprintf(name, sizeof name, "%s%s%s", ulysses ? "all-to-all attention" : "ring attention", wire ? ", --cp-wire " : "",
             wire ? dt_pp_wire_name(wire) : "");
    dt_status st = ulysses ? dt_ulysses_attention_forward(&c, mo, ml, mq, work) : dt_ring_attention_forward(&c, mo, ml, mq, work);
    if (!st) st = ulysses ? dt_ulysses_attention_backward(&c, md, mdy, mo, mq, ml, work) : dt_ring_attention_backward(&c, md, mdy, mo, mq, ml, work);
    CHECK(!st, "%s: %s", name, st ? dt_last_error() : "");
    /* all-to-all attention keeps the lse of its heads over the whole sequence: the oracle's rows for those heads */
    float *want_lse = lse;
    int H = NH / N;
    if (ulysses && !st) {
        want_lse = malloc((size_t)B * NH * T * sizeof(float));
        for (int b = 0; b < B; b++)
            for (int h = 0; h < H; h++)
                memcpy(want_lse + ((size_t)b * H + h) * T, lse + ((size_t)b * NH + r * H + h) * T, (size_t)T * sizeof(float));
        for (size_t i = 0; i < (size_t)B * H * T; i++) {
            el = fmax(el, fabs((double)ml[i] - want_lse[i]));
            ml_ = fmax(ml_, fabs((double)want_lse[i]));
        }
        free(want_lse);
    }
    for (int b = 0; b < B && !st; b++)
        for (int i = 0; i < 2; i++) {
            size_t from = (size_t)b * T + (size_t)dt_ring_chunk_pos(&c, r, i), to = (size_t)b * 2 * tc + (size_t)i * tc;
            for (size_t j = 0; j < (size_t)tc * C; j++) {
                eo = fmax(eo, fabs((double)mo[to * C + j] - out[from * C + j]));
                mo_ = fmax(mo_, fabs((double)out[from * C + j]));
            }
            for (size_t j = 0; j < (size_t)tc * C3; j++) {
                eg = fmax(eg, fabs((double)md[to * C3 + j] - dqkv[from * C3 + j]));
                mg = fmax(mg, fabs((double)dqkv[from * C3 + j]));
            }
            for (int h = 0; h < NH && !ulysses; h++)
                for (int t = 0; t < tc; t++) {
                    double a = ml[(((size_t)b * 2 + i) * NH + h) * tc + t], e = lse[((size_t)b * NH + h) * T + from - (size_t)b * T + t];
                    el = fmax(el, fabs(a - e));
                    ml_ = fmax(ml_, fabs(e));
                }
        }
    double tol = wire ? bound : 1e-5, worst = fmax(rel(eo, mo_), fmax(rel(el, ml_), rel(eg, mg)));
    /* a coded wire must have coded something (with more than one rank a block travels) */
    CHECK(!st && worst <= tol && (!wire || N == 1 || worst > 0), "%s, N=%d T=%d: output %.2g, lse %.2g, dq/dk/dv %.2g (%g)", name, N, T,
          rel(eo, mo_), rel(el, ml_), rel(eg, mg), tol);
    if (r == 0) printf("%s, %d ranks, T %d (chunks of %d): output %.2g, lse %.2g, dq/dk/dv %.2g relative to one process\n", name, N, T, tc,
                       rel(eo, mo_), rel(el, ml_), rel(eg, mg));
    free(qkv); free(dy); free(out); free(lse); free(dqkv); free(mq); free(mdy); free(mo); free(ml); free(md); free(work);
}

static void check(dt_comm *w, int ulysses, int B, int T, int C, int NH) { check_wire(w, ulysses, DT_PP_WIRE_F32, 0, B, T, C, NH); }

int main(void) {
    dt_comm *w;
    if (dt_comm_init(&w)) { fprintf(stderr, "init: %s\n", dt_last_error()); return 1; }
    r = dt_comm_rank(w);
    int N = dt_comm_size(w);
    dt_kernels_set_threads(1);
    check(w, 0, 2, 2 * N * 7, 24, 3);   /* chunks of 7 */
    check(w, 0, 1, 2 * N * 70, 16, 2);  /* chunks longer than a block of 64 keys */
    check(w, 1, 2, 2 * N * 7, 24, 12);  /* 12 heads split over 1..4 ranks */
    check(w, 1, 1, 2 * N * 70, 24, 12);
    /* the ring's blocks and their gradients in bf16 and int8 (--cp-wire): near one process, and not equal to it */
    check_wire(w, 0, DT_PP_WIRE_BF16, 1e-2, 2, 2 * N * 7, 24, 3);
    check_wire(w, 0, DT_PP_WIRE_INT8, 3e-2, 1, 2 * N * 70, 16, 2);
    if (N > 1) {
        dt_cp_config odd = { w, 1, 2 * N * 7, 16, N + 1, NULL, DT_PP_WIRE_F32, 0 };
        float x = 0;
        CHECK(dt_ulysses_attention_forward(&odd, &x, &x, &x, &x) && strstr(dt_last_error(), "heads"), "%d heads over %d ranks accepted", N + 1, N);
    }
    dt_cp_config bad = { w, 1, 2 * N * 7 + 1, 16, 2, NULL, DT_PP_WIRE_F32, 0 };
    CHECK(dt_ring_chunk_rows(&bad) == 0 && strstr(dt_last_error(), "do not split"), "T = %d accepted", bad.T);
    /* the loader's cut (dt_gpt2_cp_rows, in place) is the ring's chunks r and 2N-1-r of every sequence */
    {
        int B = 3, T = 2 * N * 5;
        int32_t x[3 * 40];
        for (int i = 0; i < B * T; i++) x[i] = i;
        dt_gpt2_cp_rows(x, B, T, r, N);
        dt_cp_config c = { w, B, T, 8, 1, NULL, DT_PP_WIRE_F32, 0 };
        int bad = 0;
        for (int b = 0; b < B; b++)
            for (int i = 0; i < 2; i++)
                for (int t = 0; t < 5; t++) bad += x[b * 10 + i * 5 + t] != b * T + dt_ring_chunk_pos(&c, r, i) + t;
        CHECK(!bad, "the loader's rows for rank %d of %d: %d wrong", r, N, bad);
    }
    /* auto: on a CPU (20 GFLOP/s, 10 GB/s link and memory) all-to-all where the heads split (measured ahead or level),
     * else the ring; at a GPU's rate (400 TFLOP/s, 450 GB/s link, 3 TB/s memory), all-to-all for 256 positions a rank
     * (the passes do not hide), the ring for 64k (they do, and all-to-all's traffic grows with them) */
    CHECK(dt_cp_choose(2, 12, 1024, 20e9, 10e9, 10e9) == DT_CP_ULYSSES && dt_cp_choose(2, 12, 4096, 20e9, 10e9, 10e9) == DT_CP_ULYSSES &&
          dt_cp_choose(4, 6, 1024, 20e9, 10e9, 10e9) == DT_CP_RING && dt_cp_choose(8, 16, 256, 4e14, 4.5e11, 3e12) == DT_CP_ULYSSES &&
          dt_cp_choose(8, 16, 65536, 4e14, 4.5e11, 3e12) == DT_CP_RING, "dt_cp_choose");
    printf("rank %d: ring attention: %d passed, %d failed\n", r, passed, failed);
    dt_comm_destroy(w);
    return failed != 0;
}
