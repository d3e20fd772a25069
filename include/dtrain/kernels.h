/* dtrain kernels: CPU compute for one process, forward and backward. No
 * knowledge of ranks. Outputs first, then inputs, then sizes; kernels cannot
 * fail (shapes are validated once, where they are decided). Backward kernels
 * accumulate (+=) into their gradient outputs. B batch, T time, C channels,
 * OC output channels, NH heads, V vocabulary, Vp padded vocabulary. */
#ifndef DTRAIN_KERNELS_H
#define DTRAIN_KERNELS_H

#include "dtrain/base.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* out[BT, OC] = inp[BT, C] @ w[OC, C]^T + bias[OC] (bias may be NULL). */
void dt_matmul_forward(float *out, const float *inp, const float *w, const float *bias, int BT, int C, int OC);
/* dinp += dout @ w; dw += dout^T @ inp; dbias += column sums of dout (each of the three may be NULL: a
 * backward split into input and weight gradients runs the two halves apart). */
void dt_matmul_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        int BT, int C, int OC);

/* LoRA's low-rank path beside a Linear (Hu et al. 2021), a: [r, C], b: [OC, r], in its two halves (tensor
 * parallelism sums between them). Down: u[BT, r] = inp @ a^T. Up: out[BT, OC] (rows ldo floats apart: a part of a
 * wider output) += scale * u @ b^T. Up's backward from dout (rows ldo apart): db += scale * dout^T @ u, du[BT, r] =
 * scale * dout @ b. Down's: da += du^T @ inp, dinp += du @ a (either NULL: not made). */
void dt_lora_down(float *u, const float *inp, const float *a, int BT, int C, int r);
void dt_lora_up(float *out, int ldo, const float *u, const float *b, float scale, int BT, int r, int OC);
void dt_lora_up_backward(float *db, float *du, const float *dout, int ldo, const float *u, const float *b, float scale, int BT, int r,
                         int OC);
void dt_lora_down_backward(float *dinp, float *da, const float *du, const float *inp, const float *a, int BT, int C, int r);

/* Dropout by position (dropout.c): out[i, f] = x[i, f] / (1 - p) where draw f + col0 of row i's stream is kept (p of
 * them are not: 0), or out += that (add); rows ldo and ldx floats apart. A row's key names the value's place in the
 * data (dt_dropout_row_key: a key and two coordinates mixed); the same keys and columns, the same mask, on any rank. */
uint64_t dt_dropout_row_key(uint64_t key, uint32_t a, uint32_t b);
void dt_dropout(float *out, int ldo, const float *x, int ldx, int rows, int cols, const uint64_t *row_key, uint64_t col0, float p, bool add);

/* A mixture of experts (moe.c). BT tokens each choose K of E experts (K at most DT_MOE_MAX_K): pair q = i*K + j is
 * token i's j-th choice. softmax: probs[BT, E] from the router's logits, in place. topk: each token's K most probable
 * experts (largest first; a tie the lower), w their probabilities, renormalised to sum to 1 with norm. sort: the
 * pairs by expert (within one, in pair order): order[r] the pair at sorted row r, start[e] expert e's first row
 * (start[E]: every pair), row_of[q] pair q's row. gather: rows[r] = x[order[r] / K]. combine: out[i] (= or +=,
 * add) the sum of w[q] y[row_of[q]] over token i's pairs in the experts' order (w NULL: 1), so a token's sum is in
 * one order whatever the layout. experts_forward: each expert's rows xs [n, C] through its SwiGLU MLP (gate wg, up
 * wu [E, F, C], down wd [E, C, F]): hu [pairs, 2F] the gate|up products, act [pairs, F], y [pairs, C] (NULL: not
 * made). experts_backward from the output rows' gradients dys (unweighted; scaled by w in place): dw[q] the
 * gradients of the pairs' weights, the weights' gradients added to, dxs (may be dys) d(xs); g [pairs, F] and dhu
 * [pairs, 2F] scratch. router_backward: d(logits) from d(w) (and daux[BT / T, E], a gradient added to the probabilities
 * of each token of a sequence of T rows (T = BT: one for all), or NULL). */
#define DT_MOE_MAX_K 32
#define DT_MOE_MAX_EXPERTS 4096 /* the experts a mixture may have (the router's per-row scratch) */
/* softmax's rows in place; lse (NULL: not wanted) each row's log-sum-exp of its logits. z_backward: the router z-loss's
 * gradient (ST-MoE's: the mean of lse^2) added to d(logits): scale 2 lse_i p_ie. */
void dt_moe_softmax(float *probs, float *lse, int BT, int E);
void dt_moe_z_backward(float *dlogits, const float *probs, const float *lse, int BT, int E, float scale);
void dt_moe_topk(float *w, int32_t *idx, const float *probs, int BT, int E, int K, bool norm);
void dt_moe_sort(int32_t *order, int32_t *start, int32_t *row_of, const int32_t *idx, int pairs, int E);
void dt_moe_gather(float *rows, const float *x, const int32_t *order, int pairs, int K, int C);
void dt_moe_combine(float *out, const float *y, const float *w, const int32_t *idx, const int32_t *row_of, int BT, int K, int C, bool add);
/* The experts' SwiGLU MLPs over their sorted rows (start[e]..start[e+1]: expert e's); wg NULL (and dwg): GELU MLPs, up
 * then down, hu (and dhu) F wide a row where SwiGLU's gate|up is 2F. t DT_BF16 or DT_F16: mixed
 * precision, on weights holding 16-bit values: the gate|up products, SwiGLU's output and the down products rounded to
 * t; in backward the output gradient dys (in place), g (d(act)), both again once weighted by the rows' routing
 * weights, d(gate|up), d(input) and each use's weight gradient too (use: F x C floats to round it in; NULL in f32).
 * Backward makes act again from hu as forward made it. */
void dt_moe_experts_forward(float *hu, float *act, float *y, const float *xs, const int32_t *start, const float *wg, const float *wu,
                            const float *wd, int E, int C, int F, dt_dtype t);
void dt_moe_experts_backward(float *dxs, float *dwg, float *dwu, float *dwd, float *dw, float *dys, float *g, float *dhu, const float *xs,
                             const float *hu, float *act, const float *w, const int32_t *order, const int32_t *start, const float *wg,
                             const float *wu, const float *wd, int E, int C, int F, dt_dtype t, float *use);
void dt_moe_router_backward(float *dlogits, const float *probs, const float *w, const int32_t *idx, const float *dw, const float *daux, int T,
                            int BT, int E, int K, bool norm);
/* DeepSeek-V3's router: scores = sigmoid(logits) in place; each token's choice by scores + bias[E] (the bias only
 * chooses) within its group_k best of `groups` groups of consecutive experts (a group scored by its two best; groups
 * 1: none), its weights the chosen scores (renormalised with norm, +1e-20 as DeepSeek's), times scale; the
 * backward from d(w) to d(logits) through the scores alone, and (daux[BT / T, E] as router_backward's, or NULL) from a
 * gradient of each token's scores normalised to sum to 1 over all experts. */
/* A capacity of cap pairs an expert: the pairs past it dropped (idx -1, which sort, combine and the rest skip), by
 * weight (policy 0: the lightest first; ties the later pair) or by position (1: the latest first); returns how many.
 * scratch: room for pairs (float, int32) pairs. */
int dt_moe_capacity(int32_t *idx, const float *w, int pairs, int E, int cap, int policy, void *scratch);
void dt_moe_sigmoid(float *scores, int BT, int E);
void dt_moe_topk_biased(float *w, int32_t *idx, const float *scores, const float *bias, int BT, int E, int K, int groups, int group_k,
                        bool norm, float scale);
void dt_moe_sigmoid_backward(float *dlogits, const float *scores, const float *w, const int32_t *idx, const float *dw, const float *daux, int T,
                             int BT, int E, int K, bool norm, float scale);
/* The sequence-wise balancing loss's statistics (DeepSeek-V2's and V3's, Megatron's seq_aux_loss), rows of T a sequence:
 * each token's K most probable experts (the top-k of its probabilities alone, whatever the routing chose) counted into
 * count[BT / T, E], and its probabilities (a sigmoid router's scores normalised to sum to 1) added into psum[BT / T, E]. */
void dt_moe_seq_stats(double *count, double *psum, const float *probs, int BT, int T, int E, int K, bool sigmoid);

/* Mixed precision (torch.autocast's linear): w and bias hold 16-bit values
 * of type t (DT_BF16 or DT_F16), inp f32 values that t can hold; out =
 * round_t(inp @ w^T + bias), the products summed in f32. work: scratch of
 * work_floats >= 2 * max(C, OC) floats (the weights are widened a chunk of
 * rows at a time, half of it each; 2 * OC * C: all at once). partial: out
 * is left in f32, a partial sum over part of C (a row-parallel Linear's)
 * that the caller completes and then rounds, as the whole sum would be. */
void dt_matmul_forward_lp(float *out, const float *inp, const uint16_t *w, const uint16_t *bias, int BT, int C, int OC,
                          dt_dtype t, float *work, size_t work_floats, int partial);
/* dout holds values of t (autocast hands a 16-bit linear a 16-bit output
 * gradient: round it first); dinp = round_t(dinp + dout @ w) (start it at
 * zero); dw += round_t(dout^T @ inp); dbias += round_t(column sums of dout).
 * partial: dinp is left in f32 (a column-parallel Linear's share of it,
 * summed over the group by the caller and rounded then). dinp (then w is
 * not read) or dw may be NULL: a split backward's two halves. */
void dt_matmul_backward_lp(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const uint16_t *w, int BT,
                           int C, int OC, dt_dtype t, float *work, size_t work_floats, int partial);

/* The LM head with 16-bit output (no bias): out[BT, OC] holds values of t.
 * work_floats >= 3 * C (a third each for a chunk of widened weight rows, of
 * the chunk's weight gradient and of a block of f32 outputs or output
 * gradients), so nothing of BT x OC is ever f32. Backward reads the
 * 16-bit dout the same way; dinp = round_t(dinp + dout @ w), dw +=
 * round_t(dout^T @ inp). With ce, dout holds the logits and each block's
 * output gradient is the loss's, computed as it is read
 * (dt_crossentropy_grad_lp); ce->v0 is the first column's vocabulary id
 * (a vocabulary-parallel head's slice: 0 for the whole head), ce->V the
 * slice's columns below the vocabulary size. partial: as
 * dt_matmul_backward_lp's (the head is column-parallel by vocabulary), and so are NULL dinp or dw. */
typedef struct {
    const float *stats; const int32_t *targets; int V, v0; float dscale;
    const float *row_scale; /* each row's gradient times this too (a token loss's d(loss)/d(ce)); NULL: 1 */
    /* an entropy term: each row's d(loss)/d(its distribution's entropy H) and H (the whole row's, as stats are), whose
     * gradient -dscale ent_scale p_v (log p_v + H) is added; NULL: none */
    const float *ent_scale, *ent;
} dt_ce_grad;
void dt_matmul_forward_lp16(uint16_t *out, const float *inp, const uint16_t *w, int BT, int C, int OC, dt_dtype t, float *work,
                            size_t work_floats);
void dt_matmul_backward_lp16(float *dinp, float *dw, const uint16_t *dout, const dt_ce_grad *ce, const float *inp,
                             const uint16_t *w, int BT, int C, int OC, dt_dtype t, float *work, size_t work_floats, int partial);
/* The weight rows dt_matmul_backward_lp16 takes a chunk at a time (at most OC), its tokens in blocks of the chunk's
 * size: its bits depend on them, so they come from the shape, not the work (work_floats >= 3 * rows * C keeps them). */
int dt_matmul_lp16_rows(int C, int OC);

/* bf16 GEMM with f32 sums on CPUs that multiply bf16 (avx512_bf16; oneDNN's
 * matmul, src/kernels/gemm_bf16.c): C[M,N] (= or, acc, +=) op(A)[M,K] @
 * op(B)[K,N], A and B bf16 and row-major with leading dimensions lda, ldb
 * (op: transposed when ta, tb). Returns 1 when done, 0 when this machine or
 * build has none (dt_gemm_bf16_ready; DTRAIN_BF16_GEMM=0 turns it off): the
 * caller then uses sgemm on widened values. dt_gemm_bf16_enable(0) turns it
 * off, 1 back on where there is one (tests compare the two paths).
 * dt_gemm_bf16_pack: x[0..n) in bf16 in scratch slot 0..2, kept until the
 * slot's next pack (NULL: out of memory). */
int dt_gemm_bf16(int ta, int tb, int M, int N, int K, const uint16_t *A, int lda, const uint16_t *B, int ldb, int acc, float *C,
                 int ldc);
int dt_gemm_bf16_ready(void);
int dt_gemm_bf16_built(void); /* compiled with oneDNN */
/* Whether this process takes the bf16 GEMM (built, the CPU has avx512_bf16, no DTRAIN_BF16_GEMM=0), asked without
 * making oneDNN's engine: what a measured rate or resident size of this machine depends on besides the CPU. */
int dt_gemm_bf16_wanted(void);
void dt_gemm_bf16_enable(int on);
uint16_t *dt_gemm_bf16_pack(int slot, const float *x, size_t n);

/* 16-bit storage (t: DT_BF16 or DT_F16, round to nearest even; f16 overflows
 * to inf): pack f32 into 16 bits, widen back, or round f32 values in place
 * to what t holds (DT_F32: unchanged). */
void dt_lp_pack(uint16_t *dst, const float *src, size_t n, dt_dtype t);
void dt_lp_unpack(float *dst, const uint16_t *src, size_t n, dt_dtype t);
void dt_lp_round(float *x, size_t n, dt_dtype t);
/* x[0..n) in int8 (q), one absmax scale (returned: x[k] ~ q[k] x scale; 1 for all zeros), rounded to nearest. */
float dt_int8_quantize(int8_t *q, const float *x, size_t n);
/* x[0..n) in 16 bits in the first 2n bytes of x, and back. */
void dt_lp_narrow_inplace(float *x, size_t n, dt_dtype t);
void dt_lp_widen_inplace(float *x, size_t n, dt_dtype t);
/* dst += src rounded to t. */
void dt_lp_round_add(float *dst, const float *src, size_t n, dt_dtype t);

/* Token + position embedding: out[b,t,:] = wte[tok[b,t],:] + wpe[t,:]. */
void dt_embedding_forward(float *out, const int32_t *tok, const float *wte, const float *wpe, int B, int T, int C);
void dt_embedding_backward(float *dwte, float *dwpe, const float *dout, const int32_t *tok, int B, int T, int C);
/* The same with row t of each sequence at position pos[t] (NULL: t): a
 * context-parallel rank's rows are two chunks from apart in the sequence. */
void dt_embedding_forward_at(float *out, const int32_t *tok, const float *wte, const float *wpe, const int32_t *pos, int B, int T,
                             int C);
void dt_embedding_backward_at(float *dwte, float *dwpe, const float *dout, const int32_t *tok, const int32_t *pos, int B, int T,
                              int C);
/* The vocabulary-parallel embedding's share: out[i,:] = wte[tok[i] - v0,:]
 * for the tokens in [v0, v0 + rows) this rank holds, 0 for the rest (the
 * group's sum is the whole lookup); and dwte's rows of those tokens += dout. */
void dt_embedding_rows_forward(float *out, const int32_t *tok, const float *wte, int v0, int rows, int BT, int C);
void dt_embedding_rows_backward(float *dwte, const float *dout, const int32_t *tok, int v0, int rows, int BT, int C);

/* LayerNorm over C with eps 1e-5; mean and rstd are kept for backward. */
void dt_layernorm_forward(float *out, float *mean, float *rstd, const float *inp, const float *w, const float *b, int N, int C);
void dt_layernorm_backward(float *dinp, float *dw, float *db, const float *dout, const float *inp, const float *w,
                           const float *mean, const float *rstd, int N, int C);

/* RMSNorm over C (Llama's): out = x / sqrt(mean(x^2) + eps) * w; rstd kept for backward, which adds into dinp and dw. */
void dt_rmsnorm_forward(float *out, float *rstd, const float *inp, const float *w, int N, int C, float eps);
void dt_rmsnorm_backward(float *dinp, float *dw, const float *dout, const float *inp, const float *w, const float *rstd, int N,
                         int C);
/* RMSNorm of each attention head's queries and keys on its own (Qwen 3's q_norm and k_norm), rows [q of NH heads | k of
 * NKV heads | v of NKV heads] of hd channels each: q's heads share wq [hd], k's wk [hd], v passes unchanged; rstd
 * [N][NH + NKV]. Backward adds into dinp (v's d(out) passes through), dwq and dwk. */
void dt_headnorm_forward(float *out, float *rstd, const float *inp, const float *wq, const float *wk, int N, int NH, int NKV, int hd,
                         float eps);
void dt_headnorm_backward(float *dinp, float *dwq, float *dwk, const float *dout, const float *inp, const float *wq, const float *wk,
                          const float *rstd, int N, int NH, int NKV, int hd);

/* Rotary positions: theta (the base), and Llama 3.1's scaling of long wavelengths (factor 0: none). */
typedef struct {
    float theta, factor, low_freq_factor, high_freq_factor;
    int original_max; /* the context length the scaling keeps (original_max_position_embeddings) */
} dt_rope_config;
/* The d/2 frequencies of a head of d channels. */
void dt_rope_frequencies(float *inv_freq, int d, const dt_rope_config *c);
/* In place, rows of `heads` heads of d channels (d even, at most 512), rows row_stride floats apart, row r at
 * position pos[r]: forward turns each pair (i, i + d/2) by pos * inv_freq[i], backward turns a gradient back. */
void dt_rope_forward(float *x, const float *inv_freq, const int32_t *pos, int rows, int heads, int d, size_t row_stride);
void dt_rope_backward(float *dx, const float *inv_freq, const int32_t *pos, int rows, int heads, int d, size_t row_stride);

/* SwiGLU on rows of [gate | up] (2F wide): out[N, F] = silu(gate) * up; backward adds into dgu [N, 2F]. */
void dt_swiglu_forward(float *out, const float *gu, int N, int F);
void dt_swiglu_backward(float *dgu, const float *gu, const float *dout, int N, int F);

/* GELU, tanh approximation (GPT-2's). */
void dt_gelu_forward(float *out, const float *inp, size_t n);
void dt_gelu_backward(float *dinp, const float *inp, const float *dout, size_t n);

/* tanh, within a few ulp of libm's, vectorised; a row's values do not depend on the rows beside it. */
void dt_tanh_rows(float *out, const float *inp, int rows, int width);

/* ReLU: out = max(x, 0); dinp += dout where inp > 0. */
void dt_relu_forward(float *out, const float *inp, size_t n);
void dt_relu_backward(float *dinp, const float *inp, const float *dout, size_t n);
/* After an in-place ReLU (out written over its input): d = 0 where out is 0. */
void dt_relu_backward_inplace(float *d, const float *out, size_t n);

/* out = a + b. */
void dt_residual_forward(float *out, const float *a, const float *b, size_t n);
/* da += dout, db += dout. */
void dt_residual_backward(float *da, float *db, const float *dout, size_t n);

/* What attention reads when heads share K/V heads (or q and k are turned by position after): q|k|v of all NH heads
 * [BT, 3 Q] (Q = NH d) from a Linear's q, KVH K/V heads and v side by side (in: [BT, Q + 2 KVH d]), head h reading
 * K/V head kv_of[h]. Unpack adds d(packed) back into d(in): a K/V head's, the sum of its heads'. */
void dt_attention_pack(float *packed, const float *in, int BT, int NH, int KVH, int d, const int *kv_of);
void dt_attention_unpack(float *din, const float *dpacked, int BT, int NH, int KVH, int d, const int *kv_of);

/* Causal multi-head attention on qkv[B,T,3C] (q, k, v concatenated along
 * channels) into out[B,T,C]; att[B,NH,T,T] keeps the softmax for backward. */
void dt_attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv += gradient. */
void dt_attention_backward(float *dqkv, const float *dout, const float *qkv, const float *att, int B, int T, int C, int NH);

/* The same attention without the T x T rows: forward keeps only each row's
 * log-sum-exp lse[B,NH,T]; backward recomputes the probabilities from it. */
void dt_attention_forward_lse(float *out, float *lse, const float *qkv, int B, int T, int C, int NH);
void dt_attention_backward_lse(float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse,
                               int B, int T, int C, int NH);
/* Each of the four where a row packs several documents (supervised fine-tuning's packing): first[b*T + t] is the row
 * its document starts at, so t attends to rows first..t only (NULL: 0, as the plain ones). */
void dt_attention_forward_docs(float *out, float *att, const float *qkv, const int32_t *first, int B, int T, int C, int NH);
void dt_attention_backward_docs(float *dqkv, const float *dout, const float *qkv, const float *att, const int32_t *first, int B, int T,
                                int C, int NH);
void dt_attention_forward_lse_docs(float *out, float *lse, const float *qkv, const int32_t *first, int B, int T, int C, int NH);
void dt_attention_backward_lse_docs(float *dqkv, const float *dout, const float *out, const float *qkv, const float *lse,
                                    const int32_t *first, int B, int T, int C, int NH);

/* Attention by blocks of the sequence (attention_block.c; ring attention's
 * step): rows of one tensor of a block, T per sequence (B sequences), row
 * r of sequence b at p + (b*T + r) * stride, at positions pos .. pos+T-1
 * of the whole sequence; q, k, v each C wide (NH heads). */
typedef struct { const float *p; size_t stride; int pos, T; } dt_attn_rows;
/* The queries' causal attention over this block of keys alone (a query at
 * position i sees keys at positions <= i): out[B, q.T, C] and its
 * log-sum-exp lse[B, NH, q.T] (a row that sees none of the keys: 0, -inf). */
void dt_attention_block_forward(float *out, float *lse, const dt_attn_rows *q, const dt_attn_rows *k, const dt_attn_rows *v,
                                int B, int C, int NH);
/* The same where a row packs several documents: first[b * q.T + t] is the index among k's rows of the first key query
 * row t may see (its document's start; NULL: 0); the backward likewise. */
void dt_attention_block_forward_docs(float *out, float *lse, const dt_attn_rows *q, const dt_attn_rows *k, const dt_attn_rows *v,
                                     const int32_t *first, int B, int C, int NH);
/* (out, lse) becomes the attention over its keys and the block's (bout,
 * blse): both [B, T, C] and [B, NH, T]; start from out 0, lse -inf. */
void dt_attention_merge(float *out, float *lse, const float *bout, const float *blse, int B, int T, int C, int NH);
/* Where a block's gradients go: dq rows of stride sq (the queries' rows),
 * dk and dv rows of stride skv (the keys'). */
typedef struct { float *dq, *dk, *dv; size_t sq, skv; } dt_attn_grads;
/* One block's share of the backward, from the final (merged) out and lse:
 * adds to dq, dk, dv; the shares of all blocks sum to the whole
 * attention's gradient. */
void dt_attention_block_backward(const dt_attn_grads *g, const float *dout, const float *out, const float *lse, const dt_attn_rows *q,
                                 const dt_attn_rows *k, const dt_attn_rows *v, int B, int C, int NH);
void dt_attention_block_backward_docs(const dt_attn_grads *g, const float *dout, const float *out, const float *lse, const dt_attn_rows *q,
                                      const dt_attn_rows *k, const dt_attn_rows *v, const int32_t *first, int B, int C, int NH);

/* A target that is not scored (PyTorch's ignore_index): its row has no loss (0 in losses[], still counted in the
 * mean the functions below return: a caller that ignores rows divides their sum by its own count) and a zero
 * gradient. Every cross-entropy function here takes it (any target below 0). */
#define DT_IGNORE_INDEX (-100)

/* Softmax cross-entropy on logits[BT, Vp] over the first V columns.
 * Writes losses[BT] and returns their mean; then overwrites logits with
 * d(mean loss)/d(logits) (zero in the padded columns) scaled by dscale, so the
 * B x T x V probabilities are never stored beside the logits; rounded to t
 * (DT_BF16, DT_F16: the 16-bit gradient a mixed-precision head takes; DT_F32: as is). */
float dt_crossentropy_fused(float *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale, dt_dtype t);
/* Forward only: losses and their mean; logits unchanged. stats (2 floats a
 * row, or NULL): each row's maximum and sum of exponentials, from which
 * backward computes the gradient without a second pass over the row. */
float dt_crossentropy_forward(float *losses, float *stats, const float *logits, const int32_t *targets, int BT, int V, int Vp);
/* The gradient in place of the logits from forward's stats: the same values
 * dt_crossentropy_fused writes (f32). */
void dt_crossentropy_backward(float *logits, const float *stats, const int32_t *targets, int BT, int V, int Vp, float dscale);
/* The vocabulary-parallel cross-entropy's pieces (Megatron's), on this
 * rank's columns [v0, v0 + Vp) of which the first V are real: each row's
 * maximum (-inf when V is 0); each row's sum of exp(logit - mx[i]) into
 * part[2i] and its target's logit into part[2i+1] (0 when another rank
 * holds the target); summed over the group these are the whole row's. The
 * gradient in place of the logits from the group's stats (max, sum). */
void dt_crossentropy_rows_max(float *mx, const float *logits, int BT, int V, int Vp);
void dt_crossentropy_rows_sum(float *part, const float *logits, const float *mx, const int32_t *targets, int v0, int BT, int V,
                              int Vp);
void dt_crossentropy_rows_backward(float *logits, const float *stats, const int32_t *targets, int v0, int BT, int V, int Vp,
                                   float dscale);

/* The same on 16-bit logits (values of t, DT_BF16 or DT_F16), computed in
 * f32; the fused one leaves the gradient rounded to t in place. work: Vp
 * floats per thread (at least Vp). */
float dt_crossentropy_fused_lp(uint16_t *logits, float *losses, const int32_t *targets, int BT, int V, int Vp, float dscale,
                               dt_dtype t, float *work, size_t work_floats);
float dt_crossentropy_forward_lp(float *losses, float *stats, const uint16_t *logits, const int32_t *targets, int BT, int V,
                                 int Vp, dt_dtype t, float *work, size_t work_floats);
/* dt_crossentropy_rows_max (mx NULL: out[BT]) and dt_crossentropy_rows_sum
 * (out[2 BT]) on 16-bit logits, each row widened into work (Vp floats per
 * thread, at least Vp). */
void dt_crossentropy_rows_lp(float *out, const float *mx, const uint16_t *logits, const int32_t *targets, int v0, int BT, int V,
                             int Vp, dt_dtype t, float *work, size_t work_floats);
/* Each scored row's moments about its maximum m = stats[2i] (forward's stats: the whole vocabulary's) over its first V
 * of Vp logits (t: DT_F32, or the 16-bit type, widened into work as dt_crossentropy_rows_lp's): out[2i] =
 * sum exp(2 (l - m)), out[2i + 1] = sum exp(l - m) (l - m); 0 for a row not scored (targets[i] < 0). Summed over a
 * vocabulary-parallel group they are the row's: with S = stats[2i + 1], its entropy is log S - out[2i + 1] / S and
 * log sum p^2 is log out[2i] - 2 log S. */
void dt_crossentropy_rows_moments(float *out, const float *stats, const void *logits, const int32_t *targets, int BT, int V, int Vp,
                                  dt_dtype t, float *work, size_t work_floats);
/* The loss's gradient taken where it is used: from 16-bit logits and
 * forward's stats, rows [row0, row0 + n) and columns [o0, o0 + r) into
 * dst (n x r f32, rounded to t), the values dt_crossentropy_fused_lp would
 * have left there; dt_matmul_backward_lp16 calls it block by block, so the
 * head's gradient is never a pass of its own. */
void dt_crossentropy_grad_lp(float *dst, const uint16_t *logits, int row0, int n, int Vp, int o0, int r, const dt_ce_grad *g,
                             dt_dtype t);
/* The same arithmetic in place of f32 logits (BT rows of Vp, this rank's columns), for a gradient with an entropy term
 * (g->ent_scale; dt_crossentropy_backward's otherwise). */
void dt_crossentropy_grad_entropy(float *logits, int BT, int Vp, const dt_ce_grad *g);

/* Image layers, NCHW. A 2-D convolution (torch.nn.Conv2d, groups 1):
 * weights [OC, C, KH, KW], OH = (H + 2 pad - KH) / stride + 1. */
typedef struct { int N, C, H, W, OC, KH, KW, stride, pad, OH, OW; } dt_conv_shape;
dt_conv_shape dt_conv_make(int N, int C, int H, int W, int OC, int K, int stride, int pad);
/* Scratch for the kernels' threads (dt_kernels_threads: keep it until the
 * call): each thread's columns of an image (C KH KW x OH OW floats; none
 * for a 1x1 convolution with stride 1 and no padding) and, but the first,
 * its own weight and bias gradients. */
size_t dt_conv2d_work_floats(const dt_conv_shape *s);
void dt_conv2d_forward(float *out, const float *inp, const float *w, const float *bias, const dt_conv_shape *s, float *work);
/* One image's receptive fields as columns [C KH KW, OH OW] (what the convolution multiplies its weight [OC, C KH KW]
 * by): in cols (C KH KW OH OW floats), or the image itself for a 1x1 stride-1 convolution without padding. */
const float *dt_conv2d_columns(const float *image, const dt_conv_shape *s, float *cols);
/* dinp (may be NULL), dw, dbias (may be NULL) += gradients. */
void dt_conv2d_backward(float *dinp, float *dw, float *dbias, const float *dout, const float *inp, const float *w,
                        const dt_conv_shape *s, float *work);

/* BatchNorm2d over [N, C, HW] in steps, so synchronised BatchNorm can sum
 * across ranks between them: per-channel sums of x and x^2 (written);
 * mean and rstd from sums over count values (biased variance, eps), and
 * the running averages updated with momentum (unbiased variance; run_mean
 * NULL: not updated); or mean and rstd from the running ones (evaluation);
 * out = (x - mean) rstd w + b. */
void dt_batchnorm_sums(double *sum, double *sumsq, const float *inp, int N, int C, int HW);
void dt_batchnorm_stats(float *mean, float *rstd, float *run_mean, float *run_var, const double *sum, const double *sumsq,
                        double count, int C, float momentum, float eps);
void dt_batchnorm_eval_stats(float *mean, float *rstd, const float *run_mean, const float *run_var, int C, float eps);
void dt_batchnorm_forward(float *out, const float *inp, const float *mean, const float *rstd, const float *w, const float *b,
                          int N, int C, int HW);
/* Backward: per-channel sdy = sum of dout and sdyx = sum of dout * xhat
 * (written; they are also d bias and d weight); then dinp += its gradient
 * from the sums over all count values. */
void dt_batchnorm_backward_sums(double *sdy, double *sdyx, const float *dout, const float *inp, const float *mean,
                                const float *rstd, int N, int C, int HW);
void dt_batchnorm_backward(float *dinp, const float *dout, const float *inp, const float *mean, const float *rstd, const float *w,
                           const double *sdy, const double *sdyx, double count, int N, int C, int HW);

/* Max pooling of NC planes with a K x K window (pad <= K / 2, so every
 * window holds a pixel); idx keeps each output's pixel for backward.
 * Global average pooling: one value per plane. Backwards accumulate. */
void dt_maxpool2d_forward(float *out, int32_t *idx, const float *inp, int NC, int H, int W, int K, int stride, int pad);
void dt_maxpool2d_backward(float *dinp, const float *dout, const int32_t *idx, int NC, int H, int W, int OH, int OW);
void dt_avgpool_global_forward(float *out, const float *inp, int NC, int HW);
void dt_avgpool_global_backward(float *dinp, const float *dout, int NC, int HW);

/* The BLAS the matmuls go through and, for OpenBLAS, the kernel set it
 * runs (its pick for this CPU, or $OPENBLAS_CORETYPE's): "OpenBLAS Haswell". */
void dt_kernels_blas_name(char *out, size_t n);
/* The OpenBLAS kernel set this CPU runs best ("Cooperlake", "SkylakeX", "Haswell") where OpenBLAS's own pick is of a
 * lower vector level, else NULL: OpenBLAS 0.3.21 takes a CPU its table lacks for an old one (Intel's Emerald Rapids, family
 * 6 model 207: Prescott's SSE3 kernels, sgemm 20 GFLOP/s a core against 118 with Cooperlake's). */
const char *dt_kernels_blas_core_wanted(void);
/* Multiply-adds in registers on `threads` threads at the vector width
 * inference's kernels use (fma_peak.c): their arithmetic's ceiling in
 * GFLOP/s, median of 5 tries. */
double dt_kernels_fma_peak(int threads);
/* The same for int8 Linears' products: bf16 pairs' (vdpbf16ps, twice the
 * multiply-adds) where the CPU has AVX512-BF16, else the FMAs'. */
double dt_kernels_int8_peak(int threads);
/* Inference's Linear (rowdot.c): out[n, O] = x[n, K] @ w[O, K]^T + bias
 * (bias may be NULL), each element one dot product summed in a fixed order
 * whatever n, the row's place or the threads: a row gives the same bits
 * alone or in any batch. */
dt_status dt_rowdot_f32(float *out, const float *x, const float *w, const float *bias, int n, int K, int O);
/* The same Linear on weights packed once (panels.c) for reading as one
 * stream, in f32 or in int8 (per-output-channel absmax: output o worth
 * scale[o] * q[o], out = scale[o] * (bf16(x) . q[o]) + bias[o], the
 * activations rounded to bf16 so that CPUs with avx512_bf16 multiply them
 * two at a time; rowdot_int8.c gives that order of sums). f32 panels give
 * dt_rowdot_f32's bits. Both fail only for want of memory (int8's rows in
 * bf16, AVX2's prefill's rows laid out once a call). dt_panels_row: weight row o as the products read
 * it (int8 dequantized). */
typedef struct dt_panels dt_panels;
dt_status dt_panels_create(const float *w, int O, int K, bool int8, dt_panels **out);
/* f32 panels made of w's own memory, packed where it lies (w is not [O, K]
 * rows after, and must outlive the panels): no second copy of the weights. */
dt_status dt_panels_pack_in_place(float *w, int O, int K, dt_panels **out);
void dt_panels_destroy(dt_panels *p);
dt_status dt_panels_apply(float *out, const float *x, const dt_panels *p, const float *bias, int n);
void dt_panels_row(const dt_panels *p, int o, float *dst);
size_t dt_panels_bytes(const dt_panels *p);
/* Inference attention (attend.c), the same bits on every path and width.
 * dt_attend_scores: s[t] = q . key t for t < n, each the spec's dot product
 * (dt_rowdot_f32's order), keys of d elements in blocks of DT_KEY_BLOCK
 * positions: element k of key t at kb[(t / B) * d * B + k * B + t % B].
 * dt_weighted_sum: y[j] += sum over t < n of w[t] * v[t * d + j], each a
 * chain of fused multiply-adds in t order from y[j]: zero y for a new sum; a
 * sum taken in pieces of t has the bits of one taken whole. The _bf16 forms
 * read keys and values kept in bf16, with the bits of the f32 forms on the
 * values widened. */
#define DT_KEY_BLOCK 16
void dt_attend_scores(float *s, const float *q, const float *kb, int d, int n);
void dt_attend_scores_bf16(float *s, const float *q, const uint16_t *kb, int d, int n);
void dt_weighted_sum(float *y, const float *w, const float *v, int n, int d);
void dt_weighted_sum_bf16(float *y, const float *w, const uint16_t *v, int n, int d);
/* GELU of rows [rows, width], each row's values the same whatever rows is (inference's batch invariance). */
void dt_gelu_rows(float *out, const float *inp, int rows, int width);

/* Threads for OpenMP loops and BLAS together; 0 = all cores. */
void dt_kernels_set_threads(int n);
int dt_kernels_threads(void);
/* Subnormal floats flushed to zero (FTZ and DAZ on x86, FZ on Arm) in this thread and the threads and processes it
 * starts after: a multiply-add on one is a slow microcode assist. DTRAIN_DENORMALS=keep leaves IEEE's behaviour;
 * false: left as it was. The command line calls it first thing. */
bool dt_kernels_flush_denormals(void);

#ifdef __cplusplus
}
#endif
#endif
