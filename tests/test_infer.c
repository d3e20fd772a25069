/* Inference: the batch-invariant Linear against a double-precision sum and
 * against its own arithmetic spelled out (eight lanes, the fixed tree, the
 * tail: the AVX2 and portable paths must both be that); the decoder's
 * logits against the training forward's over the same tokens, prefilled at
 * once or a row at a time; and the guarantee the batcher exists for: a
 * request's tokens and logits are the same bits alone, beside seven others,
 * or joining mid-way with its prompt read in other chunks, on 1 or 2
 * threads, in f32 and int8. Bad rows and requests are refused, named.
 * Under dtrain launch -n N the decoder runs a tensor-parallel part of N
 * (logits against the whole model's, the same invariance across batches). */
#include "dtrain/infer.h"
#include "dtrain/kernels.h"
#include "dtrain/model.h"
#include "dtrain/parallel.h"
#include "dtrain/program.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int passed, failed;
#define EXPECT(cond, ...) do { if (cond) passed++; else { failed++; printf("FAIL: "); printf(__VA_ARGS__); printf("\n"); } } while (0)

/* The spec: what every path of dt_rowdot_* must compute, bit for bit. f32: eight lanes over k, a fixed tree, the
 * tail. */
static float spec_dot(const float *x, const float *w, int K) {
    float a[8] = { 0 };
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int j = 0; j < 8; j++) a[j] = fmaf(x[k + j], w[k + j], a[j]);
    float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    for (; k < K; k++) s = fmaf(x[k], w[k], s);
    return s;
}

/* int8's activations: x to bf16, nearest even, |x| < 2^-100 to zero (values kept as floats) */
static float spec_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) < 0x0d800000u) return 0.0f;
    u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* int8: eight lanes over chunks of 16 inputs, lane j adding input 2j + 1's product, then 2j's (vdpbf16ps's order),
 * the same tree, the tail; x in bf16 (xb, spec_bf16's). */
static float spec_dot_q8(const float *xb, const int8_t *q, int K) {
    float a[8] = { 0 };
    int k = 0;
    for (; k + 16 <= K; k += 16)
        for (int j = 0; j < 8; j++) {
            a[j] = fmaf(xb[k + 2 * j + 1], (float)q[k + 2 * j + 1], a[j]);
            a[j] = fmaf(xb[k + 2 * j], (float)q[k + 2 * j], a[j]);
        }
    float s = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
    for (; k < K; k++) s = fmaf(xb[k], (float)q[k], s);
    return s;
}

static void fill(float *x, size_t n, uint64_t seed) {
    for (size_t i = 0; i < n; i++) x[i] = dt_rng_normal(&seed);
}

static int max_threads = 2; /* argv[1]: 1 under TSan (libgomp's hand-offs are invisible to it) */

/* The spec's int8 weights of one output: absmax / 127 (its return), rounded to nearest. */
static float spec_q8_weights(int8_t *q, const float *w, int K) {
    float amax = 0;
    for (int k = 0; k < K; k++) amax = fmaxf(amax, fabsf(w[k]));
    float scale = amax > 0 ? amax / 127.0f : 1.0f;
    for (int k = 0; k < K; k++) q[k] = (int8_t)lrintf(fmaxf(-127.0f, fminf(127.0f, w[k] * (1.0f / scale))));
    return scale;
}

/* The Linear through panels, or through f32 rows in place (p NULL). */
static dt_status linear(float *out, const float *x, const float *w, const float *b, const dt_panels *p, int n, int K, int O) {
    return p ? dt_panels_apply(out, x, p, b, n) : dt_rowdot_f32(out, x, w, b, n, K, O);
}

/* One layout's products against the spec: its bits, a row alone against the same row in the batch, and the error
 * against double (f32) or against the dequantized weights and the f32 ones (int8). */
static void check_linear(const char *what, const float *x, const float *w, const float *b, const dt_panels *p, bool q8, int n, int K,
                         int O, int t) {
    float *out = malloc(sizeof(float) * (size_t)n * O), *one = malloc(sizeof(float) * (size_t)O);
    float *row = malloc(sizeof(float) * (size_t)K), *xb = malloc(sizeof(float) * (size_t)K);
    EXPECT(linear(out, x, w, b, p, n, K, O) == DT_OK, "%s: %s", what, dt_last_error());
    int spec = 1, alone = 1, held = 1;
    double err = 0, qerr = 0;
    for (int r = 0; r < n; r++) {
        const float *xr = x + (size_t)r * K;
        for (int k = 0; k < K; k++) xb[k] = q8 ? spec_bf16(xr[k]) : xr[k];
        EXPECT(linear(one, xr, w, b, p, 1, K, O) == DT_OK, "%s, one row: %s", what, dt_last_error());
        for (int o = 0; o < O; o++) {
            const float *wo = w + (size_t)o * K;
            int8_t q[1029];
            float scale = 1;
            if (p) dt_panels_row(p, o, row);
            if (q8) {
                scale = spec_q8_weights(q, wo, K);
                for (int k = 0; k < K; k++) held &= row[k] == (float)q[k] * scale;
            } else if (p) {
                held &= memcmp(row, wo, sizeof(float) * (size_t)K) == 0;
            }
            double ref = b[o], deq = b[o];
            for (int k = 0; k < K; k++) { /* deq: what the products take, int8 in bf16 */
                ref += (double)xr[k] * wo[k];
                deq += (double)xb[k] * (p ? row[k] : wo[k]);
            }
            float f = out[(size_t)r * O + o];
            err = fmax(err, fabs(f - deq) / (1 + fabs(deq)));
            qerr = fmax(qerr, fabs(f - ref) / sqrt((double)K));
            float want = q8 ? fmaf(spec_dot_q8(xb, q, K), scale, b[o]) : spec_dot(xr, p ? row : wo, K) + b[o];
            spec &= f == want && one[o] == want; /* rows in a batch and alone take different tiles */
            alone &= memcmp(&f, &one[o], sizeof f) == 0;
        }
    }
    /* f32 sums' rounding grows as sqrt(K): 1.1e-5 at K = 1029 (int8's larger weights), 1e-5 allowed at 768 */
    EXPECT(err < 5e-7 * sqrt((double)K) + 1e-6, "%s K=%d, %d threads: relative error %.2g against double", what, K, t, err);
    /* int8, per-channel absmax: each weight off by at most scale/2 ~ 4 sigma / 254 */
    if (q8) EXPECT(qerr < 0.05, "%s K=%d: error %.3g per sqrt(K) against the f32 weights", what, K, qerr);
    EXPECT(spec, "%s K=%d, %d threads: not the fixed order's bits", what, K, t);
    EXPECT(held, "%s K=%d: dt_panels_row is not the weights the products read", what, K);
    EXPECT(alone, "%s K=%d, %d threads: a row alone differs from the same row in a batch of %d", what, K, t, n);
    /* a decoding step's few rows (2-6: one group of them; 7: int8's four, a pair and one alone; 8: int8's eight; over
     * blocks of inputs when K is long) */
    float *few = malloc(sizeof(float) * 8 * (size_t)O);
    for (int m = 2; m <= 8; m++) {
        EXPECT(linear(few, x, w, b, p, m, K, O) == DT_OK, "%s, %d rows: %s", what, m, dt_last_error());
        EXPECT(!memcmp(few, out, sizeof(float) * (size_t)m * O), "%s K=%d, %d threads: rows in a batch of %d differ from a batch of %d",
               what, K, t, m, n);
    }
    free(few);
    free(out); free(one); free(row); free(xb);
}

static uint32_t float_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* Values as a bf16 cache holds them: rounded (to nearest even) in place, and their bits in h. */
static void to_bf16(float *x, uint16_t *h, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = dt_bf16_to_f32(h[i] = dt_f32_to_bf16(x[i]));
}

/* Attention's scores from blocked keys, kept in f32 or bf16: every score the spec's dot product (on the rounded
 * keys), positions past whole blocks included. */
static void attend_score_checks(void) {
    static const int ds[] = { 5, 37, 64, 100 }, ns[] = { 1, 15, 16, 17, 40 };
    for (int b16 = 0; b16 < 2; b16++)
        for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
            for (size_t ni = 0; ni < sizeof ns / sizeof *ns; ni++) {
                int d = ds[di], n = ns[ni], same = 1, blocks = (n + DT_KEY_BLOCK - 1) / DT_KEY_BLOCK;
                size_t cells = (size_t)blocks * d * DT_KEY_BLOCK;
                float *keys = malloc(sizeof(float) * (size_t)n * d), *kb = calloc(cells, sizeof(float));
                uint16_t *kh = calloc(cells, sizeof(uint16_t));
                float q[100], s[40];
                fill(q, (size_t)d, 7 + (uint64_t)d);
                fill(keys, (size_t)n * d, 8 + (uint64_t)n);
                for (int t = 0; t < n; t++)
                    for (int k = 0; k < d; k++) {
                        size_t at = (size_t)(t / DT_KEY_BLOCK) * d * DT_KEY_BLOCK + (size_t)k * DT_KEY_BLOCK + t % DT_KEY_BLOCK;
                        if (b16) to_bf16(&keys[(size_t)t * d + k], &kh[at], 1);
                        kb[at] = keys[(size_t)t * d + k];
                    }
                if (b16) dt_attend_scores_bf16(s, q, kh, d, n);
                else dt_attend_scores(s, q, kb, d, n);
                for (int t = 0; t < n; t++) {
                    float want = spec_dot(q, keys + (size_t)t * d, d);
                    same &= memcmp(&want, &s[t], sizeof want) == 0;
                }
                EXPECT(same, "attention scores, keys in %s, d=%d n=%d: not the spec's bits", b16 ? "bf16" : "f32", d, n);
                free(keys); free(kb); free(kh);
            }
}

/* Attention's sum of values, kept in f32 or bf16: every y[j] the scalar chain's bits (on the rounded values), at
 * widths that leave every path a tail. */
static void weighted_sum_checks(void) {
    static const int ds[] = { 5, 16, 64, 72, 100 };
    for (int b16 = 0; b16 < 2; b16++)
        for (size_t di = 0; di < sizeof ds / sizeof *ds; di++)
            for (int n = 1; n <= 37; n += 9) {
                int d = ds[di], same = 1, pieces = 1;
                float w[37], *v = malloc(sizeof(float) * (size_t)n * d), y[100] = { 0 }, yp[100] = { 0 };
                uint16_t *vh = malloc(sizeof(uint16_t) * (size_t)n * d);
                fill(w, (size_t)n, 5 + (uint64_t)n);
                fill(v, (size_t)n * d, 6 + (uint64_t)d);
                if (b16) to_bf16(v, vh, (size_t)n * d);
                /* whole, then in pieces of 16 positions and a tail, as the decoder takes it block by block */
                if (b16) dt_weighted_sum_bf16(y, w, vh, n, d);
                else dt_weighted_sum(y, w, v, n, d);
                for (int t = 0; t < n; t += 16) {
                    int m = n - t < 16 ? n - t : 16;
                    if (b16) dt_weighted_sum_bf16(yp, w + t, vh + (size_t)t * d, m, d);
                    else dt_weighted_sum(yp, w + t, v + (size_t)t * d, m, d);
                }
                for (int j = 0; j < d; j++) {
                    float a = 0;
                    for (int t = 0; t < n; t++) a = fmaf(w[t], v[(size_t)t * d + j], a);
                    same &= memcmp(&a, &y[j], sizeof a) == 0;
                    pieces &= memcmp(&a, &yp[j], sizeof a) == 0;
                }
                const char *kind = b16 ? "bf16" : "f32";
                EXPECT(same, "weighted sum, values in %s, d=%d n=%d: not the scalar chain's bits", kind, d, n);
                EXPECT(pieces, "weighted sum, values in %s, d=%d n=%d in pieces of 16: not the whole chain's bits", kind, d, n);
                free(v); free(vh);
            }
}

/* int8 rows at the ends of bf16's range, alone, in twos and threes (each a tile of its own on AVX2): inputs about
 * 2^-100 (some under it, so zero), sums near 2^100, and both in one row. The AVX2 decoding tiles multiply x * 2^-24
 * by w * 2^24: the products, so the bits, must still be the spec's. */
static void q8_range_checks(void) {
    enum { K = 100, O = 53, N = 3 };
    static float x[N * K], w[O * K], out[N * O], xb[N * K], b[O];
    uint64_t seed = 11;
    fill(w, (size_t)O * K, 12);
    for (int k = 0; k < K; k++) {
        float g = dt_rng_normal(&seed);
        x[k] = ldexpf(g, -99 - k % 4);
        x[K + k] = ldexpf(g, 90 + k % 8);
        x[2 * K + k] = k % 3 ? x[k] : x[K + k];
    }
    for (int i = 0; i < N * K; i++) xb[i] = spec_bf16(x[i]);
    dt_panels *p = NULL;
    EXPECT(dt_panels_create(w, O, K, true, &p) == DT_OK, "panels for the range checks: %s", dt_last_error());
    if (!p) return;
    for (int n = 1; n <= N; n++) {
        int same = 1;
        for (int r0 = 0; r0 + n <= N; r0++) {
            EXPECT(dt_panels_apply(out, x + (size_t)r0 * K, p, b, n) == DT_OK, "range checks: %s", dt_last_error());
            for (int r = 0; r < n; r++)
                for (int o = 0; o < O; o++) {
                    int8_t q[K];
                    float scale = spec_q8_weights(q, w + (size_t)o * K, K);
                    float want = fmaf(spec_dot_q8(xb + (size_t)(r0 + r) * K, q, K), scale, 0.0f);
                    same &= memcmp(&want, &out[(size_t)r * O + o], sizeof want) == 0;
                }
        }
        EXPECT(same, "int8, %d row(s) at a time, inputs near 2^-100 and 2^100: not the spec's bits", n);
    }
    dt_panels_destroy(p);
}

static void rowdot_checks(void) {
    /* 1029: blocks of 256 inputs and a tail; 45: int8's chunks of 16 end 8 inputs before f32's of 8 */
    static const int Ks[] = { 5, 37, 64, 100, 768, 1029, 45, 768, 1029 };
    for (int t = 1; t <= max_threads; t++) {
        dt_kernels_set_threads(t);
        for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
            /* two whole panels of 24 outputs and a part; rows in groups of 5, 4, 4 (13), 6, 6 (12), or a chunk of 60
             * rows in groups of 6 and then 3 (63) or 2 (62); AVX2's prefill's chunks of 132 and then one row (133) or
             * three (135) */
            static const int ns[] = { 13, 12, 13, 12, 63, 62, 13, 133, 135 };
            int K = Ks[ki], O = 53, n = ns[ki];
            float *x = malloc(sizeof(float) * (size_t)n * K), *w = malloc(sizeof(float) * (size_t)O * K), b[53];
            fill(x, (size_t)n * K, 1 + (uint64_t)K);
            fill(w, (size_t)O * K, 2 + (uint64_t)K);
            fill(b, 53, 3);
            check_linear("rowdot f32", x, w, b, NULL, false, n, K, O, t);
            for (int q8 = 0; q8 < 2; q8++) {
                dt_panels *p = NULL;
                EXPECT(dt_panels_create(w, O, K, q8, &p) == DT_OK, "panels K=%d: %s", K, dt_last_error());
                if (p) check_linear(q8 ? "panels int8" : "panels f32", x, w, b, p, q8, n, K, O, t);
                dt_panels_destroy(p);
            }
            free(x); free(w);
        }
        /* one row long enough to share among the threads (an unpacked f32 Linear at batch 1: the AVX2 path's decoding),
         * its outputs not a whole number of tiles */
        int K = 768, O = 131, n = 13;
        float *x = malloc(sizeof(float) * (size_t)n * K), *w = malloc(sizeof(float) * (size_t)O * K), b[131];
        fill(x, (size_t)n * K, 7);
        fill(w, (size_t)O * K, 8);
        fill(b, 131, 9);
        check_linear("rowdot f32, a long row", x, w, b, NULL, false, n, K, O, t);
        free(x); free(w);
    }
}

/* family 0: GPT-2; 1: a Llama (rotary positions, RMSNorm, SwiGLU, an untied head) with kv_heads K/V heads; 2: a Qwen 3
 * (a Llama whose heads' q and k are RMS-normed), its heads of 16 channels over the model's 12 a head. */
static dt_gpt2 *small_model(int family, int heads, int kv_heads) {
    /* 12 channels a head: the lanes' tails run everywhere */
    dt_gpt2_config c = { .max_seq_len = 40, .vocab_size = 67, .padded_vocab_size = 72, .num_layers = 2, .num_heads = heads,
                         .channels = 12 * heads };
    if (family) {
        c.family = dt_family_find(family == 2 ? "qwen3" : "llama");
        c.kv_heads = kv_heads;
        c.ffn = 20 * heads;
        c.untied = 1;
        c.head_dim = family == 2 ? 16 : 0;
    }
    dt_gpt2 *m = NULL;
    if (dt_gpt2_create(&c, &m)) return NULL;
    dt_gpt2_init_random(m, 5);
    return m;
}

/* A mixture of experts on the Llama above (3 heads, 1 K/V head): Mixtral's (kind 0: softmax, top-2 of 4 renormalised),
 * Qwen 2 MoE's (1: weights not renormalised, a shared expert with its gate), DeepSeek-V3's router (2: sigmoid scores,
 * 2 groups of which the best 1, scaled by 2, with a trained bias that moves the choice), and with DeepSeek's ungated
 * shared experts (3); with dense layers among the mixtures: Qwen 2 MoE's (4: 4 layers, the first dense, then every
 * second a mixture) and GPT-2's GELU experts (5: 3 layers, the middle one a mixture, the others GPT-2's MLP with its
 * biases), and Qwen 3 MoE's (6: each head's queries and keys normed, heads of 16 wider than 12, layer 0 dense). heads
 * and K/V heads as small_model's (12 channels a head: a tensor-parallel part splits them); top-k
 * (every expert, 4, where a tensor-parallel part's sums, rounded apart from one process's, could flip a choice). */
static dt_gpt2 *moe_model(int kind, int heads, int kv_heads, int top_k) {
    dt_gpt2_config c = { .max_seq_len = 40, .vocab_size = 67, .padded_vocab_size = 72, .num_layers = 2, .num_heads = heads,
                         .channels = 12 * heads, .kv_heads = kv_heads, .ffn = 24, .untied = 1, .experts = 4, .experts_top_k = top_k,
                         .norm_topk = kind != 1 && kind != 4 };
    c.family = dt_family_find(kind == 1 || kind == 4 ? "qwen2_moe" : kind == 3 ? "deepseek_moe" : kind == 5 ? "gpt2_moe" : kind == 6 ? "qwen3_moe" : "mixtral");
    if (kind == 1 || kind == 3 || kind == 4) c.shared_ffn = 24;
    if (kind == 4) c.num_layers = 4, c.first_dense = 1, c.moe_every = 2, c.dense_ffn = 36;
    if (kind == 5) c.num_layers = 3, c.moe_every = 2, c.dense_ffn = 48, c.kv_heads = heads, c.untied = 0;
    if (kind == 6) c.num_layers = 3, c.first_dense = 1, c.dense_ffn = 36, c.head_dim = 16;
    if (kind >= 2) c.router = DT_ROUTER_SIGMOID_BIAS, c.expert_groups = 2, c.group_top_k = top_k > 2 ? 2 : 1, c.routed_scale = 2, c.bias_rate = 0.001f;
    dt_gpt2 *m = NULL;
    if (dt_gpt2_create(&c, &m)) return NULL;
    dt_gpt2_init_random(m, 5);
    size_t nb = 0;
    float *bias = dt_program_moe_bias(dt_gpt2_program(m), &nb);
    for (size_t i = 0; bias && i < nb; i++) bias[i] = 0.05f * (float)((i * 5) % 7) - 0.15f;
    return m;
}

/* The sigmoid router's bias (a buffer, not a tensor: a tensor-parallel part's copy of the whole's slices leaves it). */
static void copy_bias(dt_gpt2 *from, dt_gpt2 *to) {
    size_t n = 0, m = 0;
    const float *b = dt_program_moe_bias(dt_gpt2_program(from), &n);
    float *t = dt_program_moe_bias(dt_gpt2_program(to), &m);
    if (t && n == m) memcpy(t, b, n * sizeof(float));
}

/* A decoder that takes its model (f32 packed in the model's memory, int8 the model gone) gives the bits of one
 * that copies from an identical model, prefill and rows after. */
static void taking_checks(void) {
    for (int q8 = 0; q8 < 2; q8++) {
        dt_quant q = q8 ? DT_QUANT_INT8 : DT_QUANT_NONE;
        dt_gpt2 *a = small_model(0, 2, 0), *b = small_model(0, 2, 0);
        dt_decoder *copying = NULL, *taking = NULL;
        int T = 9, V = 67;
        float *la = malloc(sizeof(float) * (size_t)T * V), *lb = malloc(sizeof(float) * (size_t)T * V);
        dt_status sa = a ? dt_decoder_create(a, q, 1, T, 0, &copying) : DT_ERR_NOMEM;
        dt_status sb = b ? dt_decoder_create_taking(b, q, 1, T, 0, &taking) : DT_ERR_NOMEM; /* b is the decoder's now */
        EXPECT(!sa && !sb, "taking decoder: %s", dt_last_error());
        if (copying && taking) {
            dt_infer_row rows[9];
            for (int i = 0; i < T; i++) rows[i] = (dt_infer_row){ 0, i, (int32_t)(i * 7 % V), 1 };
            EXPECT(!dt_decoder_step(copying, rows, 5, la) && !dt_decoder_step(taking, rows, 5, lb), "prefill: %s", dt_last_error());
            for (int i = 5; i < T; i++)
                EXPECT(!dt_decoder_step(copying, &rows[i], 1, la + (size_t)i * V) && !dt_decoder_step(taking, &rows[i], 1, lb + (size_t)i * V),
                       "row %d: %s", i, dt_last_error());
            EXPECT(!memcmp(la, lb, sizeof(float) * (size_t)T * V), "%s: the taking decoder's logits differ from the copying one's",
                   q8 ? "int8" : "f32");
        }
        dt_decoder_destroy(copying);
        dt_decoder_destroy(taking);
        dt_gpt2_destroy(a);
        free(la); free(lb);
    }
}

/* The decoder's logits (on m: the whole model, or a tensor-parallel part of it) against the whole model's training
 * forward, for a sequence of T tokens read at once and a row at a time. */
static void decoder_against_forward(dt_gpt2 *whole, dt_gpt2 *m) {
    const dt_gpt2_config *c = dt_gpt2_get_config(m);
    int T = 29, V = c->vocab_size;
    int32_t tok[29];
    uint64_t r = 9;
    for (int i = 0; i < T; i++) tok[i] = (int32_t)(dt_rng_next(&r) % (uint64_t)V);
    EXPECT(!dt_gpt2_forward(whole, tok, NULL, 1, T, NULL), "forward: %s", dt_last_error());
    const float *ref = dt_gpt2_logits(whole);
    dt_decoder *d = NULL;
    EXPECT(!dt_decoder_create(m, DT_QUANT_NONE, 2, T, 0, &d), "decoder: %s", dt_last_error());
    if (!d) return;
    dt_infer_row rows[29];
    float *all = malloc(sizeof(float) * (size_t)T * V), *inc = malloc(sizeof(float) * (size_t)T * V);
    for (int i = 0; i < T; i++) rows[i] = (dt_infer_row){ 0, i, tok[i], 1 };
    EXPECT(!dt_decoder_step(d, rows, T, all), "prefill: %s", dt_last_error());
    for (int i = 0; i < T; i++) {
        dt_infer_row one = { 1, i, tok[i], 1 };
        EXPECT(!dt_decoder_step(d, &one, 1, inc + (size_t)i * V), "row %d: %s", i, dt_last_error());
    }
    double err = 0;
    for (int i = 0; i < T; i++)
        for (int v = 0; v < V; v++) err = fmax(err, fabs(all[(size_t)i * V + v] - ref[(size_t)i * c->padded_vocab_size + v]));
    EXPECT(err < 1e-5, "decoder logits against the training forward's: max difference %.2g", err);
    EXPECT(!memcmp(all, inc, sizeof(float) * (size_t)T * V), "a sequence read at once and a row at a time: different bits");
    /* bad rows: named, nothing run */
    dt_infer_row bad[] = { { 2, 0, 1, 1 }, { 0, 40, 1, 1 }, { 0, 0, 67, 1 }, { 0, 31, 1, 1 } };
    const char *words[] = { "slot 2 of 2", "position 40 beyond the context of 40", "token 67 outside the vocabulary", "holds only 29" };
    for (int i = 0; i < 4; i++)
        EXPECT(dt_decoder_step(d, &bad[i], 1, all) == DT_ERR_ARG && strstr(dt_last_error(), words[i]), "bad row %d: '%s'", i,
               dt_last_error());
    free(all);
    free(inc);
    dt_decoder_destroy(d);
}

/* One request's record: its tokens and a hash of the bits of every distribution it drew from. */
typedef struct {
    int32_t tok[64];
    int n, ended, why;
    uint64_t hash;
} record;

static int on_token(void *ctx, int32_t t, const float *logits) {
    record *rc = ctx;
    if (rc->n < 64) rc->tok[rc->n++] = t;
    const unsigned char *p = (const unsigned char *)logits;
    for (size_t i = 0; i < 67 * sizeof(float); i++) rc->hash = (rc->hash ^ p[i]) * 1099511628211ull;
    return 0;
}
static void on_end(void *ctx, dt_finish why, int generated) {
    record *rc = ctx;
    rc->ended = 1 + generated;
    rc->why = (int)why;
}

#define NREQ 8
#define NEVER (1 << 30)
static int32_t prompts[NREQ][24];
static const int plen[NREQ] = { 3, 17, 1, 9, 24, 5, 12, 2 };

static dt_infer_request request(int i, record *rc) {
    dt_sampling s = { .temperature = i % 2 ? 0.9f : 0.0f, .top_k = i % 3 ? 0 : 20, .top_p = i == 5 ? 0.8f : 1.0f };
    return (dt_infer_request){ prompts[i], plen[i], 12, s, 100 + (uint64_t)i, on_token, on_end, rc, NULL, NULL, 0 };
}

/* A decoder of nslots slots over m and its batcher of budget rows (false, said as what's failure: neither made). */
static bool open_batcher(dt_gpt2 *m, dt_quant q, int nslots, int budget, const char *what, dt_decoder **d, dt_batcher **b) {
    *d = NULL, *b = NULL;
    if (!dt_decoder_create(m, q, nslots, budget, 0, d) && !dt_batcher_create(*d, budget, b)) return true;
    EXPECT(0, "%s: %s", what, dt_last_error());
    dt_decoder_destroy(*d);
    *d = NULL;
    return false;
}

/* The requests in `order`, each added at step join[k] (or when a slot frees), over nslots slots and a token budget. */
static void serve(dt_gpt2 *m, dt_quant q, int nslots, int budget, const int *join, record *rc) {
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    memset(rc, 0, sizeof(record) * NREQ);
    if (!open_batcher(m, q, nslots, budget, "batcher", &d, &b)) return;
    int added[NREQ] = { 0 }, step = 0, left = 1;
    while (left > 0 && step < 10000) {
        for (int i = 0; i < NREQ; i++) /* in request order, as slots free */
            if (!added[i] && join[i] <= step && dt_batcher_free_slots(b) > 0) {
                dt_infer_request r = request(i, &rc[i]);
                EXPECT(!dt_batcher_add(b, &r), "add %d: %s", i, dt_last_error());
                added[i] = 1;
            }
        EXPECT(!dt_batcher_step(b), "step: %s", dt_last_error());
        step++;
        left = 0;
        for (int i = 0; i < NREQ; i++) left += join[i] < NEVER && !rc[i].ended;
    }
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
}

static void invariance(dt_gpt2 *m, dt_quant q) {
    for (int i = 0; i < NREQ; i++)
        for (int k = 0; k < plen[i]; k++) prompts[i][k] = (int32_t)((i * 31 + k * 7) % 67);
    record alone[NREQ], together[NREQ], staggered[NREQ], one_thread[NREQ];
    int at0[NREQ] = { 0 }, late[NREQ] = { 0, 0, 3, 5, 6, 9, 14, 20 };
    dt_kernels_set_threads(max_threads);
    for (int i = 0; i < NREQ; i++) { /* each alone: one slot, its own run */
        record rc[NREQ];
        int join[NREQ];
        for (int k = 0; k < NREQ; k++) join[k] = k == i ? 0 : NEVER;
        serve(m, q, 1, 32, join, rc); /* the others never join: they stay unended */
        alone[i] = rc[i];
    }
    serve(m, q, 8, 256, at0, together);      /* all eight at once, every prompt in the first step */
    serve(m, q, 4, 7, late, staggered);      /* four slots, joining mid-way, prompts read 7 rows a step at most */
    dt_kernels_set_threads(1);
    serve(m, q, 8, 64, at0, one_thread);
    dt_kernels_set_threads(max_threads);
    for (int i = 0; i < NREQ; i++) {
        const char *qn = dt_quant_name(q);
        EXPECT(alone[i].n == 12 && alone[i].ended == 13 && alone[i].why == DT_FINISH_LENGTH, "%s request %d alone: %d tokens, ended %d",
               qn, i, alone[i].n, alone[i].ended);
        record *others[3] = { together, staggered, one_thread };
        const char *how[3] = { "beside 7 others", "joining mid-way", "on 1 thread" };
        for (int w = 0; w < 3; w++)
            EXPECT(others[w][i].n == alone[i].n && !memcmp(others[w][i].tok, alone[i].tok, sizeof(int32_t) * 12) &&
                   others[w][i].hash == alone[i].hash,
                   "%s request %d %s: not the same tokens and logits' bits as alone", qn, i, how[w]);
    }
}

/* Prefix reuse: requests whose prompts start alike, with reuse on and off (every prompt read whole). Four at once over
 * a budget that reads a prompt in two steps (three wait for the first to hold what they share: 19, 19 and 12 tokens
 * of it), then a chat's next turn (the first's prompt, its 12 tokens, 3 more: the 31 positions its ended slot holds
 * kept) and the same prompt again beside it (34 copied from the turn still reading). */
static void prefix_run(dt_gpt2 *m, dt_quant q, bool reuse, record *rc, int *cached, long *reused) {
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    static int32_t p[6][40];
    static const int len[6] = { 20, 20, 20, 20, 35, 35 };
    memset(rc, 0, sizeof(record) * 6);
    for (int k = 0; k < 20; k++) p[0][k] = p[1][k] = p[2][k] = p[3][k] = (int32_t)((k * 13 + 5) % 67);
    for (int k = 12; k < 20; k++) p[3][k] = (int32_t)((k * 29 + 1) % 67);
    if (!open_batcher(m, q, 4, 16, "prefix reuse", &d, &b)) return;
    dt_batcher_set_prefix_reuse(b, reuse);
    for (int phase = 0; phase < 2; phase++) {
        int first = phase ? 4 : 0, last = phase ? 6 : 4;
        for (int i = first; phase && i < last; i++) {
            memcpy(p[i], p[0], sizeof(int32_t) * 20), memcpy(p[i] + 20, rc[0].tok, sizeof(int32_t) * 12);
            for (int k = 32; k < 35; k++) p[i][k] = (int32_t)(k % 67);
        }
        for (int i = first; i < last; i++) {
            dt_sampling s = { .temperature = i == 0 || i == 4 ? 0.0f : 0.9f, .top_p = 1 };
            dt_infer_request r = { p[i], len[i], 12, s, 7 + (uint64_t)i, on_token, on_end, &rc[i], NULL, &cached[i], 0 };
            EXPECT(!dt_batcher_add(b, &r), "prefix reuse: add %d: %s", i, dt_last_error());
        }
        for (int step = 0; step < 100 && dt_batcher_get_stats(b).running > 0; step++)
            EXPECT(!dt_batcher_step(b), "prefix reuse: step: %s", dt_last_error());
    }
    *reused = dt_batcher_get_stats(b).reused_rows;
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
}

static void prefix_reuse(dt_gpt2 *m, dt_quant q) {
    record on[6], off[6];
    int con[6], coff[6];
    long ron = 0, roff = 0;
    static const int want[6] = { 0, 19, 19, 12, 31, 34 };
    prefix_run(m, q, true, on, con, &ron);
    prefix_run(m, q, false, off, coff, &roff);
    for (int i = 0; i < 6; i++) {
        int n = i < 4 ? 12 : 6; /* (35 + 6 tokens fill the context of 40) */
        EXPECT(on[i].n == n && off[i].n == n && !memcmp(on[i].tok, off[i].tok, sizeof(int32_t) * (size_t)n) && on[i].hash == off[i].hash,
               "%s prefix reuse: request %d's tokens and logits' bits not those of its prompt read whole", dt_quant_name(q), i);
        EXPECT(con[i] == want[i] && coff[i] == 0, "%s prefix reuse: request %d took %d cached tokens (%d without reuse), not %d",
               dt_quant_name(q), i, con[i], coff[i], want[i]);
    }
    EXPECT(ron == 115 && roff == 0, "%s prefix reuse: %ld rows reused (%ld without), not 115", dt_quant_name(q), ron, roff);
}

static void on_scored(void *ctx, int pos, const float *logits) {
    record *rc = ctx;
    const unsigned char *p = (const unsigned char *)logits;
    rc->hash = (rc->hash ^ (uint64_t)pos) * 1099511628211ull;
    for (size_t i = 0; i < 67 * sizeof(float); i++) rc->hash = (rc->hash ^ p[i]) * 1099511628211ull;
}

/* Prefix reuse under a random schedule: 40 requests whose prompts are cuts of three sequences with random tails (some
 * a start of another, some the same), random lengths, two salts and some scored prompts, joining over 3 slots and a
 * budget of 8 rows as slots free (sources that end and are taken while others wait on them); each request's tokens
 * and logits' bits with reuse on are those with it off. */
#define NSTRESS 40
static void prefix_stress(dt_gpt2 *m) {
    static int32_t p[NSTRESS][36];
    int len[NSTRESS], maxt[NSTRESS];
    uint64_t rng = 12345;
    for (int i = 0; i < NSTRESS; i++) {
        int base = (int)(dt_rng_next(&rng) % 3), cut = 1 + (int)(dt_rng_next(&rng) % 30), tail = (int)(dt_rng_next(&rng) % 6);
        for (int k = 0; k < cut; k++) p[i][k] = (int32_t)((k * (7 + 4 * base) + base) % 67);
        for (int k = 0; k < tail; k++) p[i][cut + k] = (int32_t)(dt_rng_next(&rng) % 67);
        len[i] = cut + tail, maxt[i] = 1 + (int)(dt_rng_next(&rng) % 5);
    }
    record rc[2][NSTRESS];
    long reused[2] = { 0, 0 };
    for (int pass = 0; pass < 2; pass++) {
        dt_decoder *d = NULL;
        dt_batcher *b = NULL;
        memset(rc[pass], 0, sizeof rc[pass]);
        if (!open_batcher(m, DT_QUANT_NONE, 3, 8, "prefix stress", &d, &b)) return;
        dt_batcher_set_prefix_reuse(b, pass == 0);
        uint64_t order = 99;
        int next = 0;
        for (int step = 0; step < 2000 && (next < NSTRESS || dt_batcher_get_stats(b).running > 0); step++) {
            while (next < NSTRESS && dt_batcher_free_slots(b) > 0 && dt_rng_next(&order) % 3) { /* (some steps add none) */
                int i = next++;
                dt_sampling sm = { .temperature = i % 4 ? 0.9f : 0.0f, .top_p = 1 };
                dt_infer_request r = { p[i], len[i], maxt[i], sm, 3 + (uint64_t)i, on_token, on_end, &rc[pass][i], i % 7 == 3 ? on_scored : NULL,
                                       NULL, i % 5 == 4 ? 2u : 0u };
                EXPECT(!dt_batcher_add(b, &r), "prefix stress: add %d: %s", i, dt_last_error());
            }
            EXPECT(!dt_batcher_step(b), "prefix stress: step: %s", dt_last_error());
        }
        reused[pass] = dt_batcher_get_stats(b).reused_rows;
        dt_batcher_destroy(b);
        dt_decoder_destroy(d);
    }
    int same = 0;
    for (int i = 0; i < NSTRESS; i++)
        same += rc[0][i].ended && rc[0][i].n == rc[1][i].n && rc[0][i].n == maxt[i] && rc[0][i].hash == rc[1][i].hash &&
                !memcmp(rc[0][i].tok, rc[1][i].tok, sizeof(int32_t) * (size_t)rc[0][i].n);
    EXPECT(same == NSTRESS && reused[0] > 100 && reused[1] == 0, "prefix stress: %d of %d requests the same bits with reuse and "
           "without (%ld rows reused, %ld without)", same, NSTRESS, reused[0], reused[1]);
}

/* A waiting prompt's source ends and its slot is taken before the wait is settled: A (12 tokens, one drawn) and B (the
 * same, waiting on A for 11) over 3 slots and a budget of 8; A ends in the second step, then C takes the unused slot and
 * D A's, which first settles B's copy. B, C and D draw what they draw with reuse off; B takes 11 tokens, A's own. */
static void reassigned(dt_gpt2 *m) {
    int32_t p[4][12];
    static const int len[4] = { 12, 12, 5, 7 }, maxt[4] = { 1, 6, 6, 6 };
    record rc[2][4];
    int cached[2][4];
    for (int k = 0; k < 12; k++) p[0][k] = p[1][k] = (int32_t)((k * 11 + 2) % 67), p[2][k] = (int32_t)((k * 5 + 40) % 67), p[3][k] = (int32_t)((k * 3 + 60) % 67);
    for (int pass = 0; pass < 2; pass++) {
        dt_decoder *d = NULL;
        dt_batcher *b = NULL;
        memset(rc[pass], 0, sizeof rc[pass]);
        if (!open_batcher(m, DT_QUANT_NONE, 3, 8, "reassigned", &d, &b)) return;
        dt_batcher_set_prefix_reuse(b, pass == 0);
        for (int i = 0; i < 4; i++) {
            if (i == 2) /* A reads its prompt and ends; B still waits */
                for (int step = 0; step < 2; step++) EXPECT(!dt_batcher_step(b), "reassigned: step: %s", dt_last_error());
            dt_infer_request r = { p[i], len[i], maxt[i], { .temperature = 0.9f, .top_p = 1 }, 21, on_token, on_end, &rc[pass][i], NULL,
                                   &cached[pass][i], 0 };
            EXPECT(!dt_batcher_add(b, &r), "reassigned: add %d: %s", i, dt_last_error());
        }
        EXPECT(rc[pass][0].ended && !rc[pass][1].ended, "reassigned: A %s ended and B %s when C and D joined", rc[pass][0].ended ? "had" : "had not",
               rc[pass][1].ended ? "too" : "not");
        for (int step = 0; step < 100 && dt_batcher_get_stats(b).running > 0; step++) EXPECT(!dt_batcher_step(b), "reassigned: step: %s", dt_last_error());
        dt_batcher_destroy(b);
        dt_decoder_destroy(d);
    }
    for (int i = 0; i < 4; i++)
        EXPECT(rc[0][i].n == maxt[i] && rc[1][i].n == maxt[i] && rc[0][i].hash == rc[1][i].hash && !memcmp(rc[0][i].tok, rc[1][i].tok, sizeof(int32_t) * (size_t)maxt[i]),
               "reassigned: request %d's tokens and logits' bits not those with reuse off", i);
    EXPECT(cached[0][1] == 11 && rc[0][1].tok[0] == rc[0][0].tok[0], "reassigned: B took %d cached tokens (not 11), its first token %d (A's %d)",
           cached[0][1], (int)rc[0][1].tok[0], (int)rc[0][0].tok[0]);
}

/* cache_salt: a prompt reuses only what requests of its salt left. A (salt 1) runs alone; then B (salt 2) and C
 * (salt 1), the same prompt and seed: B reads it whole, C takes 19 of its 20 tokens from A's slot; all three draw the
 * same tokens and logits' bits. */
static void salted(dt_gpt2 *m) {
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    int32_t p[20];
    record rc[3];
    int cached[3] = { -1, -1, -1 };
    static const uint64_t salt[3] = { 1, 2, 1 };
    memset(rc, 0, sizeof rc);
    for (int k = 0; k < 20; k++) p[k] = (int32_t)((k * 17 + 3) % 67);
    if (!open_batcher(m, DT_QUANT_NONE, 3, 16, "salted", &d, &b)) return;
    for (int i = 0; i < 3; i++) {
        dt_infer_request r = { p, 20, 8, { .temperature = 0.9f, .top_p = 1 }, 5, on_token, on_end, &rc[i], NULL, &cached[i], salt[i] };
        EXPECT(!dt_batcher_add(b, &r), "salted: add %d: %s", i, dt_last_error());
        for (int step = 0; step < 100 && i != 1 && dt_batcher_get_stats(b).running > 0; step++)
            EXPECT(!dt_batcher_step(b), "salted: step: %s", dt_last_error());
    }
    for (int i = 1; i < 3; i++)
        EXPECT(rc[i].n == 8 && !memcmp(rc[i].tok, rc[0].tok, sizeof(int32_t) * 8) && rc[i].hash == rc[0].hash,
               "salted: request %d's tokens not the first's", i);
    EXPECT(cached[0] == 0 && cached[1] == 0 && cached[2] == 19, "cache_salt: cached tokens %d, %d, %d (not 0, 0, 19)", cached[0], cached[1], cached[2]);
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
}

static void refusals(dt_gpt2 *m) {
    dt_decoder *d = NULL;
    dt_batcher *b = NULL;
    EXPECT(!dt_decoder_create(m, DT_QUANT_NONE, 2, 8, 0, &d), "decoder: %s", dt_last_error());
    if (!d) return;
    EXPECT(dt_batcher_create(d, 1, &b) == DT_ERR_ARG && strstr(dt_last_error(), "2 slots"), "budget below the slots: '%s'",
           dt_last_error());
    EXPECT(dt_decoder_copy(d, 0, 1, 5) == DT_ERR_ARG && strstr(dt_last_error(), "slot 0 holds 0"), "copying what a slot does not hold: '%s'",
           dt_last_error());
    EXPECT(dt_decoder_copy(d, 1, 1, 0) == DT_ERR_ARG && dt_decoder_copy(d, 0, 2, 0) == DT_ERR_ARG && strstr(dt_last_error(), "of 2 slots"),
           "copying a slot onto itself or out of range: '%s'", dt_last_error());
    EXPECT(!dt_batcher_create(d, 8, &b), "batcher: %s", dt_last_error());
    int32_t p[41] = { 0 };
    record rc;
    dt_infer_request r = { p, 41, 5, { .top_p = 1 }, 1, on_token, on_end, &rc, NULL, NULL, 0 };
    EXPECT(dt_batcher_add(b, &r) == DT_ERR_ARG && strstr(dt_last_error(), "41 tokens"), "prompt too long: '%s'", dt_last_error());
    r.nprompt = 3;
    r.sampling.temperature = -1;
    EXPECT(dt_batcher_add(b, &r) == DT_ERR_ARG && strstr(dt_last_error(), "temperature"), "negative temperature: '%s'", dt_last_error());
    r.sampling = (dt_sampling){ .temperature = 1 };
    EXPECT(dt_batcher_add(b, &r) == DT_ERR_ARG && strstr(dt_last_error(), "top_p"), "top_p 0: '%s'", dt_last_error());
    r.sampling = (dt_sampling){ .temperature = 1, .top_p = 1 };
    p[1] = 99;
    EXPECT(dt_batcher_add(b, &r) == DT_ERR_ARG && strstr(dt_last_error(), "token 1 is 99"), "bad token: '%s'", dt_last_error());
    p[1] = 1;
    EXPECT(!dt_batcher_add(b, &r) && !dt_batcher_add(b, &r), "two requests: %s", dt_last_error());
    EXPECT(dt_batcher_add(b, &r) == DT_ERR_UNSUPPORTED && strstr(dt_last_error(), "busy"), "a third in two slots: '%s'", dt_last_error());
    /* a request that runs into the context: 38 + 3 tokens fill the 40 positions and the last draws one more */
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
    d = NULL;
    b = NULL;
    EXPECT(!dt_decoder_create(m, DT_QUANT_NONE, 1, 40, 0, &d) && !dt_batcher_create(d, 40, &b), "%s", dt_last_error());
    memset(&rc, 0, sizeof rc);
    r.nprompt = 38;
    r.max_tokens = 10;
    EXPECT(!dt_batcher_add(b, &r), "38-token prompt: %s", dt_last_error());
    for (int i = 0; i < 20 && !rc.ended; i++) dt_batcher_step(b);
    EXPECT(rc.why == DT_FINISH_CONTEXT && rc.n == 3, "the context fills: %d tokens, reason %d (expected 3, context)", rc.n, rc.why);
    dt_batcher_destroy(b);
    dt_decoder_destroy(d);
}

/* Under dtrain launch -n N: rank r's tensor-parallel part of the whole model (4 or 6 heads; the vocabulary's 72 padded
 * rows split N ways, so a rank's real rows vary), its collectives over the job. */
static dt_gpt2 *tp_part(dt_gpt2 *whole, dt_comm *w, dt_tp_ops *ops) {
    dt_gpt2_config c = *dt_gpt2_get_config(whole);
    dt_model_part part = dt_gpt2_whole(&c);
    *ops = dt_tp_ops_over(w);
    part.tp_rank = dt_comm_rank(w);
    part.tp_size = dt_comm_size(w);
    part.tp = ops;
    dt_gpt2 *m = NULL;
    if (dt_gpt2_create_part(&c, &part, &m) || dt_gpt2_copy_slices(whole, m)) {
        EXPECT(0, "tensor-parallel part: %s", dt_last_error());
        dt_gpt2_destroy(m);
        return NULL;
    }
    return m;
}

/* An int8 decoder keeps nothing of its model's: one made from `copy` (m's twin), whose weights are then overwritten
 * with NaN and which is destroyed before the decoder runs, gives the bits of one whose model lives. */
static void int8_without_model(dt_gpt2 *m, dt_gpt2 *copy) {
    dt_decoder *live = NULL, *alone = NULL;
    int T = 29, V = dt_gpt2_get_config(m)->vocab_size;
    EXPECT(!dt_decoder_create(m, DT_QUANT_INT8, 1, T, 0, &live) && !dt_decoder_create(copy, DT_QUANT_INT8, 1, T, 0, &alone),
           "int8 decoders: %s", dt_last_error());
    float *p = dt_gpt2_params(copy);
    for (size_t i = 0; i < dt_gpt2_num_params(copy); i++) p[i] = NAN;
    dt_gpt2_destroy(copy);
    dt_infer_row rows[29];
    for (int i = 0; i < T; i++) rows[i] = (dt_infer_row){ 0, i, (int32_t)((i * 37 + 11) % V), 1 };
    float *a = malloc(sizeof(float) * (size_t)T * V), *b = malloc(sizeof(float) * (size_t)T * V);
    if (live && alone) {
        EXPECT(!dt_decoder_step(live, rows, T, a) && !dt_decoder_step(alone, rows, T, b), "int8 step: %s", dt_last_error());
        EXPECT(!memcmp(a, b, sizeof(float) * (size_t)T * V), "an int8 decoder whose model was destroyed: different logits");
        /* int8's cache holds bf16: half an f32 decoder's bytes for the same slots */
        dt_decoder *f = NULL;
        EXPECT(!dt_decoder_create(m, DT_QUANT_NONE, 1, T, 0, &f), "f32 decoder: %s", dt_last_error());
        if (f)
            EXPECT(2 * dt_decoder_cache_bytes(live) == dt_decoder_cache_bytes(f), "int8's cache: %zu bytes, f32's %zu (not half)",
                   dt_decoder_cache_bytes(live), dt_decoder_cache_bytes(f));
        dt_decoder_destroy(f);
        /* the bf16 cache rounds to nearest even: layer 0's keys and values (which no earlier rounding touched) are
         * those an int8 decoder keeping an f32 cache (DTRAIN_KV_CACHE=f32) holds, so rounded */
        setenv("DTRAIN_KV_CACHE", "f32", 1);
        EXPECT(!dt_decoder_create(m, DT_QUANT_INT8, 1, T, 0, &f), "int8 decoder, f32 cache: %s", dt_last_error());
        unsetenv("DTRAIN_KV_CACHE");
        int C = dt_gpt2_get_config(m)->channels, diff = 0, ties = 0;
        float *kw = malloc(sizeof(float) * 4 * (size_t)C), *vw = kw + C, *k16 = kw + 2 * C, *v16 = kw + 3 * C;
        if (f && !dt_decoder_step(f, rows, T, b)) {
            EXPECT(2 * dt_decoder_cache_bytes(live) == dt_decoder_cache_bytes(f), "the switch kept a bf16 cache");
            for (int t = 0; t < T; t++) {
                int n = 0;
                dt_decoder_cached(f, 0, 0, t, kw, vw, &n);
                dt_decoder_cached(live, 0, 0, t, k16, v16, &n);
                for (int j = 0; j < n; j++) {
                    const float full[2] = { kw[j], vw[j] }, half[2] = { k16[j], v16[j] };
                    for (int q = 0; q < 2; q++) {
                        diff += dt_bf16_to_f32(dt_f32_to_bf16(full[q])) != half[q];
                        ties += half[q] != dt_bf16_to_f32((uint16_t)(float_bits(full[q]) >> 16)); /* where truncation differs */
                    }
                }
            }
        }
        EXPECT(f && diff == 0 && ties > 0, "int8's bf16 cache: %d layer-0 values not the f32 ones rounded to nearest even "
               "(%d where truncation would differ)", diff, ties);
        free(kw);
        dt_decoder_destroy(f);
    }
    free(a);
    free(b);
    dt_decoder_destroy(live);
    dt_decoder_destroy(alone);
}

int main(int argc, char **argv) {
    if (argc > 1) max_threads = atoi(argv[1]);
    dt_launch_kind kind;
    dt_comm *w = NULL;
    if (!dt_comm_detect_launch(&kind) && kind != DT_LAUNCH_NONE && dt_comm_init(&w)) {
        printf("FAIL: %s\n", dt_last_error());
        return 1;
    }
    int ranks = w ? dt_comm_size(w) : 1;
    rowdot_checks();
    q8_range_checks();
    weighted_sum_checks();
    attend_score_checks();
    taking_checks();
    /* heads that split over the ranks: 4 over 2 and 4, 6 over 3; a Llama's K/V heads split too (2 over 2, 3 over 3),
     * or are fewer than the ranks (2 over 4: each kept by two), or one (multi-query) */
    int heads = ranks == 1 ? 3 : ranks % 3 == 0 ? 6 : 4;
    int kv_heads = ranks == 1 ? 1 : ranks % 3 == 0 ? 3 : 2;
    for (int family = 0; family < 3; family++) {
        static const char *const names[] = { "gpt2", "llama", "qwen3 (q and k normed, heads of 16 over 12 a head)" };
        printf("-- %s\n", names[family]);
        dt_gpt2 *whole = small_model(family, heads, kv_heads), *m = whole;
        dt_tp_ops ops;
        EXPECT(whole != NULL, "model: %s", dt_last_error());
        if (whole && ranks > 1) m = tp_part(whole, w, &ops);
        if (m) {
            decoder_against_forward(whole, m);
            invariance(m, DT_QUANT_NONE);
            invariance(m, DT_QUANT_INT8);
            prefix_reuse(m, DT_QUANT_NONE);
            prefix_reuse(m, DT_QUANT_INT8);
            if (ranks == 1 && !family) refusals(m), salted(m), reassigned(m);
            prefix_stress(m);
            dt_tp_ops ops2;
            dt_gpt2 *whole2 = small_model(family, heads, kv_heads), *m2 = whole2 && ranks > 1 ? tp_part(whole2, w, &ops2) : whole2;
            if (m2 != whole2) dt_gpt2_destroy(whole2);
            EXPECT(m2 != NULL, "second model: %s", dt_last_error());
            if (m2) int8_without_model(m, m2);
        }
        if (m != whole) dt_gpt2_destroy(m);
        dt_gpt2_destroy(whole);
    }
    /* a mixture of experts: the training forward's logits, a row's bits whatever else its step routes, in f32 and int8;
     * on several ranks the tensor-parallel part's logits (attention, a shared expert and a dense layer's MLP split; the
     * routed experts whole on each rank) of those with a shared expert, dense layers or head norms */
    for (int kind = 0; kind < 7; kind++) {
        if (ranks > 1 && kind != 3 && kind != 4 && kind != 6) continue;
        static const char *const names[] = { "mixtral", "qwen2_moe (a shared expert)", "mixtral, sigmoid router with its bias",
                                             "deepseek_moe (the sigmoid router, ungated shared experts)",
                                             "qwen2_moe, layers 0 and 2 dense", "gpt2_moe, layers 0 and 2 GPT-2's MLP",
                                             "qwen3_moe (head norms), layer 0 dense" };
        printf("-- %s\n", names[kind]);
        int k = ranks > 1 ? 4 : 2;
        dt_gpt2 *whole = moe_model(kind, heads, kv_heads, k), *whole2 = moe_model(kind, heads, kv_heads, k), *m = whole, *m2 = whole2;
        dt_tp_ops ops, ops2;
        EXPECT(whole && whole2, "model: %s", dt_last_error());
        if (whole && whole2 && ranks > 1) m = tp_part(whole, w, &ops), m2 = tp_part(whole2, w, &ops2);
        if (m && m2 && m != whole) copy_bias(whole, m), copy_bias(whole2, m2);
        if (m) decoder_against_forward(whole, m);
        if (m && ranks == 1) invariance(m, DT_QUANT_NONE);
        if (m && ranks == 1) invariance(m, DT_QUANT_INT8);
        if (m) prefix_reuse(m, DT_QUANT_NONE);
        if (m && m2 && ranks == 1) int8_without_model(m, m2); /* (destroys m2) */
        else if (m2 != whole2) dt_gpt2_destroy(m2);
        if (m != whole) dt_gpt2_destroy(m);
        if (whole2 != m2) dt_gpt2_destroy(whole2);
        dt_gpt2_destroy(whole);
    }
    dt_comm_destroy(w);
    printf("%d passed, %d failed\n", passed, failed);
    return failed != 0;
}
