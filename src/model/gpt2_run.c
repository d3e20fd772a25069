/* Running GPT-2 (gpt2.c holds its shape): forward and backward over a range
 * of the units the model holds, with the activations in and out at the
 * range's edges: the embedding only on a range that starts at unit 0, the
 * head and the loss only on one that ends with unit L+1. Hooks run before
 * each unit's forward and backward and after each unit's backward. The
 * whole model's forward and backward are the range of all its units. */
#include "gpt2_internal.h"
#include "dtrain/kernels.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Whether context parallelism splits this part's sequences. */
static bool cp(const dt_gpt2 *m) { return m->part.cp_size > 1; }

/* Context parallelism always keeps the log-sum-exp (its blocks merge by it). */
static bool use_blockwise(const dt_gpt2 *m, int T) {
    return cp(m) || m->attn == DT_ATTN_BLOCKWISE || (m->attn == DT_ATTN_AUTO && T >= 256);
}

/* A rank's widths (struct dt_gpt2's): the residual stream's C, attention's
 * Cl channels in NH heads, the MLP's F hidden units, the head's V rows. */
typedef struct { size_t C, Cl, NH, F, V, S; } widths; /* S: sequence parallelism's split of the rows (1: none) */

static widths whole_widths(const dt_gpt2_config *c) {
    return (widths){ (size_t)c->channels, (size_t)c->channels, (size_t)c->num_heads, 4 * (size_t)c->channels,
                     (size_t)c->padded_vocab_size, 1 };
}

static widths part_widths(const dt_gpt2 *m) {
    size_t S = m->part.sp && m->part.tp_size > 1 ? (size_t)m->part.tp_size : 1;
    return (widths){ (size_t)m->cfg.channels, (size_t)m->Cl, (size_t)m->NHl, (size_t)m->Fl, (size_t)m->Vl, S };
}

/* A split backward's per block: the output gradients of fcproj and
 * attproj (all rows, C wide), fc's (F) and qkv's (3 Cl), kept from B to W. */
static size_t wgrad_floats(widths w, size_t BT) { return BT * (2 * w.C + w.F + 3 * w.Cl); }

/* Each activation's floats for nl held blocks (head: whether the head is
 * held); the total with 64-byte aligned starts. With lp (mixed precision,
 * not recomputing) the blocks' 16-bit activations have one block's f32 slot
 * to compute in and *lp_total 16-bit values (lp_per_layer a block) to keep. */
static size_t activation_sizes(widths w, size_t nl, size_t nr, bool head, bool recompute, bool lp, bool blockwise, bool split,
                               int B, int T, size_t s[A_COUNT], size_t *lp_per_layer, size_t *lp_total) {
    size_t BT = (size_t)B * T, C = w.C, Cl = w.Cl, NH = w.NH, F = w.F, Vp = w.V, R = BT / w.S, sp = w.S > 1;
    /* Per-layer activations: every held block's, or one when recomputing; the
     * residual stream between blocks (A_RES3) is always kept; the head's only
     * where the head is held. Lw: the slots of the 16-bit ones. */
    bool pack = lp && !recompute;
    size_t L = recompute ? 1 : nl, Lres = pack ? (nl < 2 ? nl : 2) : nl, H = head, Lw = recompute || lp ? 1 : nl;
    const size_t v[A_COUNT] = {
        [A_ENCODED] = nr * R * C /* each range's input */, [A_LN1] = Lw * R * C, [A_LN1_MEAN] = L * R, [A_LN1_RSTD] = L * R,
        [A_QKV] = Lw * BT * 3 * Cl, [A_ATTY] = Lw * BT * Cl, [A_ATT] = L * NH * BT * (blockwise ? 1 : (size_t)T),
        [A_RES2] = Lw * R * C,
        [A_LN2] = Lw * R * C, [A_LN2_MEAN] = L * R, [A_LN2_RSTD] = L * R, [A_FCH] = Lw * BT * F,
        [A_FCH_GELU] = Lw * BT * F, [A_RES3] = Lres * R * C, [A_RES1] = pack * R * C, [A_LNF] = H * R * C, [A_LNF_MEAN] = H * R,
        [A_LNF_RSTD] = H * R, [A_LOGITS] = H * (lp ? (BT * Vp + 1) / 2 : BT * Vp), /* 16-bit under mixed precision */ [A_LOSSES] = H * BT, [A_CE_STATS] = H * 2 * BT, [A_TMP] = BT * C, [A_DRES] = R * C, [A_DLN] = BT * C,
        [A_DQKV] = BT * 3 * Cl, [A_DATTY] = BT * Cl, [A_DFCH] = BT * F, [A_DFCH_GELU] = BT * F,
        [A_GATHER] = sp * BT * C, [A_RS] = sp * R * C, [A_LNGRAD] = sp * 2 * C,
        [A_WGRAD] = split * nl * wgrad_floats(w, BT),
    };
    size_t total = 0;
    for (int i = 0; i < A_COUNT; i++) {
        s[i] = v[i];
        total += (v[i] + 15) & ~(size_t)15;
    }
    *lp_per_layer = pack ? 4 * R * C + BT * (4 * Cl + 2 * F) : 0; /* ln1, ln2, the input, res2; qkv, atty, fch, fch_gelu */
    *lp_total = *lp_per_layer * nl;
    return total;
}

size_t dt_gpt2_activation_bytes(const dt_gpt2_config *c, int B, int T, int recompute, int attention, dt_dtype precision) {
    return dt_gpt2_part_activation_bytes(c, 1, 0, B, T, recompute, attention, precision);
}

size_t dt_gpt2_part_activation_bytes(const dt_gpt2_config *c, int tp, int sp, int B, int T, int recompute, int attention,
                                     dt_dtype precision) {
    int a = 0, b = c->num_layers + 2;
    return dt_gpt2_chunks_activation_bytes(c, 1, &a, &b, tp, sp, B, T, recompute, attention, precision, 0) +
           (precision != DT_F32 ? dt_gpt2_lp_work_floats(c, true) * sizeof(float) : 0);
}

size_t dt_gpt2_chunks_activation_bytes(const dt_gpt2_config *c, int n, const int *a, const int *b, int tp, int sp, int B, int T,
                                       int recompute, int attention, dt_dtype precision, int split) {
    size_t s[A_COUNT], per, lp, t = tp > 1 ? (size_t)tp : 1, nl = 0;
    bool blockwise = attention == DT_ATTN_BLOCKWISE || (attention == DT_ATTN_AUTO && T >= 256), low = precision != DT_F32, head = false;
    for (int k = 0; k < n; k++) {
        int first = a[k] > 1 ? a[k] : 1, last = b[k] - 1 < c->num_layers ? b[k] - 1 : c->num_layers; /* blocks: units [first, last] */
        nl += last >= first ? (size_t)(last - first + 1) : 0;
        head = head || b[k] == c->num_layers + 2;
    }
    widths w = whole_widths(c);
    w.Cl /= t, w.NH /= t, w.F /= t, w.V = (w.V + t - 1) / t, w.S = sp ? t : 1;
    return activation_sizes(w, nl, (size_t)n, head, recompute, low, blockwise, split, B, T, s, &per, &lp) * sizeof(float) +
           lp * sizeof(uint16_t) + 2 * (size_t)B * T * sizeof(int32_t);
}

size_t dt_gpt2_activation_kept(const dt_gpt2 *m) {
    if (!m->acts) return 0;
    /* the residual stream and the head's; each block's statistics and attention rows unless recomputing; each block's
     * activations themselves where they are neither recomputed nor packed */
    static const int stream[] = { A_ENCODED, A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES, A_CE_STATS };
    static const int stats[] = { A_LN1_MEAN, A_LN1_RSTD, A_ATT, A_LN2_MEAN, A_LN2_RSTD };
    static const int wide[] = { A_LN1, A_QKV, A_ATTY, A_RES2, A_LN2, A_FCH, A_FCH_GELU };
    size_t f = 0;
    for (size_t i = 0; i < sizeof stream / sizeof *stream; i++) f += m->act_sizes[stream[i]];
    for (size_t i = 0; !m->recompute && i < sizeof stats / sizeof *stats; i++) f += m->act_sizes[stats[i]];
    for (size_t i = 0; !m->recompute && !m->lp_layer && i < sizeof wide / sizeof *wide; i++) f += m->act_sizes[wide[i]];
    return f * sizeof(float) + m->lp_capacity * sizeof(uint16_t);
}

static dt_status size_activations(dt_gpt2 *m, int B, int T) {
    size_t BT = (size_t)B * T;
    size_t att_per_layer = (size_t)m->NHl * BT * (use_blockwise(m, T) ? 1 : (size_t)T);
    size_t att_need = att_per_layer * (m->recompute ? 1 : (size_t)m->nl);
    if (m->acts && BT <= m->bt_capacity && att_need <= m->att_capacity) return DT_OK;
    size_t s[A_COUNT], per, lp;
    size_t total = activation_sizes(part_widths(m), (size_t)m->nl, (size_t)m->nr, m->ub == m->cfg.num_layers + 2, m->recompute, m->prec != DT_F32,
                                    use_blockwise(m, T), m->split_bwd, B, T, s, &per, &lp);
    size_t at = 0;
    for (int i = 0; i < A_COUNT; i++) {
        m->act_sizes[i] = s[i];
        m->act_off[i] = at;
        at += (s[i] + 15) & ~(size_t)15; /* 64-byte aligned starts */
    }
    float *a = dt_alloc_aligned(total * sizeof(float));
    uint16_t *alp = lp ? dt_alloc_aligned(lp * sizeof(uint16_t)) : NULL;
    int32_t *in = malloc(BT * sizeof(int32_t)), *tg = malloc(BT * sizeof(int32_t));
    if (!a || !in || !tg || (lp && !alp)) {
        dt_free_aligned(a);
        dt_free_aligned(alp);
        free(in);
        free(tg);
        char sz[32];
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of activations for B=%d T=%d",
                        dt_format_size(total * sizeof(float), sz, sizeof sz), B, T);
    }
    memset(a, 0, total * sizeof(float));
    dt_free_aligned(m->acts);
    dt_free_aligned(m->acts_lp);
    m->acts_lp = alp;
    m->lp_layer = per;
    m->lp_capacity = lp;
    free(m->inputs);
    free(m->targets);
    m->acts = a;
    m->inputs = in;
    m->targets = tg;
    m->nacts = total;
    m->bt_capacity = BT;
    m->att_capacity = s[A_ATT];
    return DT_OK;
}

dt_status dt_gpt2_reserve(dt_gpt2 *m, int B, int T) {
    if (B < 1 || T < 1 || T > m->cfg.max_seq_len)
        return dt_error(DT_ERR_ARG, "reserve: B=%d T=%d (T must be 1..%d)", B, T, m->cfg.max_seq_len);
    return size_activations(m, B, T);
}

/* Block l's output: its own slot, or one of two that alternate when the
 * blocks' activations are packed (each block keeps its input in the pack). */
static float *res_out(dt_gpt2 *m, int l) {
    size_t RC = dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels, k = (size_t)m->bk[l];
    return act(m, A_RES3) + (m->lp_layer ? k % 2 : k) * RC;
}

/* The held range of unit u (-1: not held). */
static int range_of(const dt_gpt2 *m, int u) {
    for (int r = 0; r < m->nr; r++)
        if (u >= m->ra[r] && u < m->rb[r]) return r;
    return -1;
}

/* The residual stream entering block l (l = L: the head), a held unit: the
 * previous block's output where that block is in the same range, else the
 * range's input (the embedding's output in range 0). */
static float *res_in(dt_gpt2 *m, int l) {
    int r = range_of(m, l + 1);
    if (l >= 1 && l >= m->ra[r]) return res_out(m, l - 1);
    return act(m, A_ENCODED) + (size_t)r * dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels;
}

/* Block l's activations: the slots of the f32 ones (k: l's, or 0 when
 * recomputing) and of the 16-bit ones (w: also 0 when they are packed). */
typedef struct { float *ln1, *qkv, *atty, *att, *res2, *ln2, *fch, *fchg, *ln1m, *ln1r, *ln2m, *ln2r; } block_acts;

/* The strides follow the current B and T, so a smaller batch fits in what a larger one allocated as long as B*T
 * and B*T*T (attention) fit. */
static block_acts acts_of(dt_gpt2 *m, int l) {
    /* the residual stream's regions hold R rows (all of them without sequence parallelism), the rest all rows */
    size_t BT = (size_t)m->B * m->T, R = dt_gpt2_tp_rows(m), RC = R * (size_t)m->cfg.channels, NH = (size_t)m->NHl,
           BTL = BT * (size_t)m->Cl, BTF = BT * (size_t)m->Fl;
    size_t k = m->recompute ? 0 : (size_t)m->bk[l], w = m->lp_layer ? 0 : k;
    return (block_acts){ .ln1 = act(m, A_LN1) + w * RC, .qkv = act(m, A_QKV) + w * BTL * 3, .atty = act(m, A_ATTY) + w * BTL,
                         .att = act(m, A_ATT) + k * NH * BT * (m->blockwise ? 1 : (size_t)m->T), .res2 = act(m, A_RES2) + w * RC,
                         .ln2 = act(m, A_LN2) + w * RC, .fch = act(m, A_FCH) + w * BTF, .fchg = act(m, A_FCH_GELU) + w * BTF,
                         .ln1m = act(m, A_LN1_MEAN) + k * R, .ln1r = act(m, A_LN1_RSTD) + k * R,
                         .ln2m = act(m, A_LN2_MEAN) + k * R, .ln2r = act(m, A_LN2_RSTD) + k * R };
}

/* Mixed precision keeps block l's activations packed in 16 bits between
 * its forward and its backward; pack (after forward) or unpack (before
 * backward). The block's input and res2 are rounded on the way (the
 * LayerNorms' backward reads them; their forward had them whole), and the
 * input comes back in A_RES1. */
static void pack_block(dt_gpt2 *m, int l, bool pack) {
    if (!m->lp_layer) return;
    block_acts a = acts_of(m, l);
    size_t BT = (size_t)m->B * m->T, RC = dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels, BTL = BT * (size_t)m->Cl,
           BTF = BT * (size_t)m->Fl; /* the residual stream's regions hold R rows (all of them without sequence parallelism) */
    float *part[8] = { a.ln1, a.qkv, a.atty, a.ln2, a.fch, a.fchg, pack ? res_in(m, l) : act(m, A_RES1), a.res2 };
    size_t len[8] = { RC, 3 * BTL, BTL, RC, BTF, BTF, RC, RC };
    uint16_t *at = m->acts_lp + (size_t)m->bk[l] * m->lp_layer;
    for (int i = 0; i < 8; at += len[i], i++) {
        if (pack) dt_lp_pack(at, part[i], len[i], m->prec);
        else dt_lp_unpack(part[i], at, len[i], m->prec);
    }
}

/* Where a Linear's weight and bias are in the stores: wi, bi its tensors in
 * block l, or l < 0 for the head's tied wte (no bias: *bo is SIZE_MAX). */
static void linear_at(const dt_gpt2 *m, int l, int wi, int bi, size_t *wo, size_t *bo) {
    *wo = l < 0 ? top_off(m, WTE) : block_off(m, l, wi);
    *bo = l < 0 ? SIZE_MAX : block_off(m, l, bi);
}

/* Whether block l's Linear wi is split by its input columns over more than one
 * rank (the table says; the head's tied wte is split by vocabulary: column-like). */
static bool row_parallel(const dt_gpt2 *m, int l, int wi) {
    return m->part.tp_size > 1 && l >= 0 && m->tab[m->i_blk + m->bk[l] * PER_BLOCK + wi - LN1W].split == DT_SPLIT_ROW;
}

/* out = inp @ w^T + b for a Linear of the model: f32, or autocast's 16-bit
 * form from the parameters' 16-bit copy. A row-parallel Linear's outputs
 * are partial sums (the caller combines them: dt_gpt2_tp_combine_linear,
 * which rounds them to 16 bits once whole), the bias in tensor-parallel
 * rank 0's alone. */
static void linear_forward(dt_gpt2 *m, float *out, const float *inp, int l, int wi, int bi, int BT, int C, int OC) {
    size_t wo, bo;
    linear_at(m, l, wi, bi, &wo, &bo);
    bool rows = row_parallel(m, l, wi), bias = bo != SIZE_MAX && (!rows || m->part.tp_rank == 0);
    if (m->prec == DT_F32)
        dt_matmul_forward(out, inp, m->params + wo, bias ? m->params + bo : NULL, BT, C, OC);
    else
        dt_matmul_forward_lp(out, inp, m->params_lp + wo, bias ? m->params_lp + bo : NULL, BT, C, OC, m->prec, m->lp_work,
                             m->lp_work_floats, rows);
}

/* Its backward; under mixed precision a block's dout is rounded to 16 bits
 * in place (the head's, by the cross-entropy that wrote it). A split
 * backward's B leaves the weight and bias for linear_weight_grad. */
static void linear_backward(dt_gpt2 *m, float *dinp, float *dout, const float *inp, int l, int wi, int bi, int BT, int C, int OC) {
    size_t wo, bo;
    linear_at(m, l, wi, bi, &wo, &bo);
    float *db = bo != SIZE_MAX && !m->split_bwd ? m->grads + bo : NULL;
    if (m->prec == DT_F32) {
        dt_matmul_backward(dinp, m->split_bwd ? NULL : m->grads + wo, db, dout, inp, m->params + wo, BT, C, OC);
        return;
    }
    if (l >= 0) dt_lp_round(dout, (size_t)BT * OC, m->prec);
    /* a column-parallel Linear's input gradient is this rank's share, summed and rounded by the caller */
    bool share = m->part.tp_size > 1 && !row_parallel(m, l, wi);
    dt_matmul_backward_lp(dinp, m->split_bwd ? NULL : m->grads + wo, db, dout, inp, m->params_lp + wo, BT, C, OC, m->prec, m->lp_work,
                          m->lp_work_floats, share);
}

/* W of a split backward: the same sums the whole backward makes. */
static void linear_weight_grad(dt_gpt2 *m, const float *dout, const float *inp, int l, int wi, int bi, int BT, int C, int OC) {
    size_t wo, bo;
    linear_at(m, l, wi, bi, &wo, &bo);
    float *db = bo != SIZE_MAX ? m->grads + bo : NULL;
    if (m->prec == DT_F32) dt_matmul_backward(NULL, m->grads + wo, db, dout, inp, NULL, BT, C, OC);
    else dt_matmul_backward_lp(NULL, m->grads + wo, db, dout, inp, NULL, BT, C, OC, m->prec, m->lp_work, m->lp_work_floats, 0);
}

/* Mixed precision keeps the logits (and then their gradient) in 16 bits. */
#define LOGITS16(m) ((uint16_t *)act(m, A_LOGITS))

/* A context-parallel attention's status: the first failure is kept, as a
 * tensor-parallel collective's (the pass runs on, its caller is told). */
static void cp_status(dt_gpt2 *m, dt_status st) {
    if (st && !m->comm_err) m->comm_err = st;
}

/* Block l on residual (its input): writes the block's activations into its
 * slots and its output into A_RES3. Under mixed precision the LayerNorms'
 * outputs, attention's and GELU's are rounded to 16 bits (autocast casts
 * them for the next Linear, or computes them in 16 bits). */
static void layer_forward(dt_gpt2 *m, int l, const float *residual) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, Cl = m->Cl, NH = m->NHl, F = m->Fl;
    size_t BT = (size_t)B * T, R = dt_gpt2_tp_rows(m), RC = R * (size_t)C;
    block_acts a = acts_of(m, l);
    float *res3 = res_out(m, l);
    dt_layernorm_forward(a.ln1, a.ln1m, a.ln1r, residual, layer_param(m, l, LN1W), layer_param(m, l, LN1B), (int)R, C);
    dt_lp_round(a.ln1, RC, m->prec);
    linear_forward(m, a.qkv, dt_gpt2_tp_gather(m, a.ln1, RC), l, QKVW, QKVB, (int)BT, C, 3 * Cl);
    if (cp(m)) cp_status(m, m->part.cp->forward(m->part.cp->ctx, a.atty, a.att, a.qkv, B, T, Cl, NH));
    else if (m->blockwise) dt_attention_forward_lse(a.atty, a.att, a.qkv, B, T, Cl, NH);
    else dt_attention_forward(a.atty, a.att, a.qkv, B, T, Cl, NH);
    dt_lp_round(a.atty, BT * (size_t)Cl, m->prec);
    linear_forward(m, act(m, A_TMP), a.atty, l, ATTPROJW, ATTPROJB, (int)BT, Cl, C);
    dt_residual_forward(a.res2, residual, dt_gpt2_tp_combine_linear(m, act(m, A_TMP), RC), RC);
    dt_layernorm_forward(a.ln2, a.ln2m, a.ln2r, a.res2, layer_param(m, l, LN2W), layer_param(m, l, LN2B), (int)R, C);
    dt_lp_round(a.ln2, RC, m->prec);
    linear_forward(m, a.fch, dt_gpt2_tp_gather(m, a.ln2, RC), l, FCW, FCB, (int)BT, C, F);
    dt_gelu_forward(a.fchg, a.fch, BT * (size_t)F);
    dt_lp_round(a.fchg, BT * (size_t)F, m->prec);
    linear_forward(m, act(m, A_TMP), a.fchg, l, FCPROJW, FCPROJB, (int)BT, F, C);
    dt_residual_forward(res3, a.res2, dt_gpt2_tp_combine_linear(m, act(m, A_TMP), RC), RC);
}

/* Mixed precision: the 16-bit copy of what unit u reads, just before it
 * runs (after the strategy's hook, which may have just gathered it). As a
 * whole copy: each unit's own tensors at its forward, kept for backward.
 * With unit hooks (ZeRO-3 gathers each unit's parameters as it runs), the
 * copy is made as each unit's forward or backward starts, of what that reads
 * (the head reads the tied wte; the embedding reads f32), and lp_drop gives
 * it back after, so no rank holds the whole 16-bit model. */
static void lp_cast(dt_gpt2 *m, int u, bool backward) {
    bool per_run = m->unit_hooks.n > 0;
    if (m->prec == DT_F32 || m->lp_external || (backward && !per_run) || (per_run && u == 0)) return;
    for (int i = 0; i < m->ntab; i++) {
        const dt_tensor_info *t = &m->tab[i];
        if (per_run ? t->grad_unit != u && (backward || t->unit != u) : t->unit != u) continue;
        /* the kept copy: a step's later micro-batches find it current (124M bf16 TP 2, 4 micro-batches: 3.6-4.8 ms a
         * micro-batch on the embedding's table alone) */
        if (!per_run && m->lp_told && m->lp_current[i]) continue;
        dt_lp_pack(m->params_lp + t->offset, m->params + t->offset, t->count, m->prec);
        if (!per_run) m->lp_current[i] = 1;
        if (per_run && !m->lp_cast[i]) {
            m->lp_cast[i] = 1;
            m->lp_held += t->count;
        }
    }
    if (m->lp_held > m->lp_held_max) m->lp_held_max = m->lp_held;
}

static void lp_drop(dt_gpt2 *m) {
    for (int i = 0; m->lp_held && i < m->ntab; i++)
        if (m->lp_cast[i]) {
            dt_mem_release(m->params_lp + m->tab[i].offset, m->tab[i].count * sizeof(uint16_t));
            m->lp_cast[i] = 0;
        }
    m->lp_held = 0;
}

const float *dt_gpt2_input_grad(const dt_gpt2 *m, const int32_t **tokens, int *ntokens) {
    if (tokens) *tokens = m->inputs;
    if (ntokens) *ntokens = m->B * m->T;
    return m->acts ? m->acts + m->act_off[A_DRES] : NULL;
}

#define BEFORE_FWD(u) do { dt_hook_list_call(&m->unit_hooks, DT_HOOK_BEFORE_FORWARD, u); lp_cast(m, u, false); } while (0)
#define BEFORE_BWD(u) do { dt_hook_list_call(&m->unit_hooks, DT_HOOK_BEFORE_BACKWARD, u); lp_cast(m, u, true); } while (0)
#define AFTER_FWD(u) lp_drop(m)
/* a split backward's gradients are whole after W: its hooks run there */
#define AFTER_BWD(u) do { lp_drop(m); if (!m->split_bwd && !m->hold_hooks) dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, u); } while (0)

/* The trace shows each unit's forward and backward on the compute track. */
static void trace_unit(const dt_gpt2 *m, const char *pass, int u) {
    if (!dt_trace_on()) return;
    char name[32];
    if (u == 0) snprintf(name, sizeof name, "%s embedding", pass);
    else if (u <= m->cfg.num_layers) snprintf(name, sizeof name, "%s block %d", pass, u - 1);
    else snprintf(name, sizeof name, "%s head", pass);
    dt_trace_begin(DT_TRACK_SELF, name, "\"unit\":%d", u);
}
#define UNIT_END() DT_TRACE_END(DT_TRACK_SELF)

/* Range r's run state into the model's fields (the current range's back into its own). */
static void use_range(dt_gpt2 *m, int r) {
    if (r == m->cur) return;
    m->rs[m->cur] = (gpt2_run_state){ m->run_a, m->run_b, m->have_targets, m->w_pending };
    const gpt2_run_state *x = &m->rs[r];
    m->run_a = x->run_a, m->run_b = x->run_b, m->have_targets = x->have_targets, m->w_pending = x->w_pending;
    m->cur = r;
}

dt_status dt_gpt2_use_chunk(dt_gpt2 *m, int chunk) {
    if (chunk < 0 || chunk >= m->nr) return dt_error(DT_ERR_ARG, "model: chunk %d of %d", chunk, m->nr);
    use_range(m, chunk);
    return DT_OK;
}

static dt_status check_range(const dt_gpt2 *m, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets,
                             int B, int T) {
    const dt_gpt2_config *c = &m->cfg;
    int r = a < b ? range_of(m, a) : -1;
    if (r < 0 || b > m->rb[r]) {
        if (m->nr > 1) return dt_error(DT_ERR_ARG, "forward: units [%d, %d) are not within one of the model's %d chunks", a, b, m->nr);
        return dt_error(DT_ERR_ARG, "forward: units [%d, %d) are not a range of the model's [%d, %d)", a, b, m->ua, m->ub);
    }
    if (B < 1 || T < 1 || T > c->max_seq_len)
        return dt_error(DT_ERR_ARG, "forward: B=%d T=%d (T must be 1..%d)", B, T, c->max_seq_len);
    if (m->part.sp && m->part.tp_size > 1 && T % m->part.tp_size)
        return dt_error(DT_ERR_ARG, "forward: --sp splits the sequence of %d tokens into --tp %d parts: it does not divide", T,
                        m->part.tp_size);
    int n = m->part.cp_size;
    if (n > 1 && (T % 2 || (long)T * n > c->max_seq_len))
        return dt_error(DT_ERR_ARG, "forward: a context-parallel rank's %d rows a sequence %s", T,
                        T % 2 ? "are not two equal chunks" : "make a sequence longer than the model's positions");
    if (a == 0 && !tokens) return dt_error(DT_ERR_ARG, "forward: a range from unit 0 needs the tokens");
    if (a > 0 && !x) return dt_error(DT_ERR_ARG, "forward: a range from unit %d needs its input activations", a);
    size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++) {
        if (a == 0 && (tokens[i] < 0 || tokens[i] >= c->vocab_size))
            return dt_error(DT_ERR_ARG, "forward: input token %d at position %zu is outside the vocabulary (0..%d)",
                            tokens[i], i, c->vocab_size - 1);
        if (targets && (targets[i] < 0 || targets[i] >= c->vocab_size))
            return dt_error(DT_ERR_ARG, "forward: target token %d at position %zu is outside the vocabulary (0..%d)",
                            targets[i], i, c->vocab_size - 1);
    }
    return DT_OK;
}

dt_status dt_gpt2_forward_units(dt_gpt2 *m, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets,
                                int B, int T, float *loss) {
    const dt_gpt2_config *c = &m->cfg;
    int L = c->num_layers, C = c->channels, Vp = m->Vl; /* this rank's vocabulary rows */
    m->comm_err = DT_OK;
    if (b < L + 2) targets = NULL; /* no loss before the head */
    dt_status st = check_range(m, a, b, tokens, x, targets, B, T);
    if (!st) use_range(m, range_of(m, a));
    if (!st && m->w_pending)
        st = dt_error(DT_ERR_ARG, "forward: the activations' last backward waits for its weight gradients (dt_gpt2_backward_weights)");
    if (!st && m->split_bwd && m->recompute)
        st = dt_error(DT_ERR_UNSUPPORTED, "forward: a split backward runs without recomputation (W reads what forward kept)");
    if (!st) st = size_activations(m, B, T);
    if (st) return st;
    size_t BT = (size_t)B * T;
    m->B = B;
    m->T = T;
    size_t R = dt_gpt2_tp_rows(m), RC = R * (size_t)C; /* the residual stream's rows here */
    m->run_a = a;
    m->run_b = b;
    m->blockwise = use_blockwise(m, T);
    m->have_targets = targets != NULL || b < L + 2; /* what backward needs */
    if (a == 0) memcpy(m->inputs, tokens, BT * sizeof(int32_t));
    if (targets) memcpy(m->targets, targets, BT * sizeof(int32_t));
    if (a == 0) {
        BEFORE_FWD(0);
        trace_unit(m, "forward", 0);
        dt_gpt2_tp_embedding_forward(m, act(m, A_ENCODED), tokens, B, T);
        UNIT_END();
    } else if (x != res_in(m, a - 1)) {
        memcpy(res_in(m, a - 1), x, RC * sizeof(float));
    }
    int last = b - 1 < L ? b - 1 : L; /* blocks [first, last) */
    for (int l = a > 0 ? a - 1 : 0; l < last; l++) {
        BEFORE_FWD(l + 1);
        trace_unit(m, "forward", l + 1);
        layer_forward(m, l, res_in(m, l));
        pack_block(m, l, true);
        UNIT_END();
        AFTER_FWD(l + 1);
    }
    if (b < L + 2) return m->comm_err;
    BEFORE_FWD(L + 1);
    trace_unit(m, "forward", L + 1);
    dt_layernorm_forward(act(m, A_LNF), act(m, A_LNF_MEAN), act(m, A_LNF_RSTD), res_in(m, L), top_param(m, LNFW), top_param(m, LNFB), (int)R, C);
    dt_lp_round(act(m, A_LNF), RC, m->prec);
    const float *lnf = dt_gpt2_tp_gather(m, act(m, A_LNF), RC);
    if (m->prec == DT_F32) linear_forward(m, act(m, A_LOGITS), lnf, -1, WTE, 0, (int)BT, C, Vp);
    else dt_matmul_forward_lp16(LOGITS16(m), lnf, m->params_lp + top_off(m, WTE), (int)BT, C, Vp, m->prec, m->lp_work, m->lp_work_floats);
    if (targets) {
        m->loss = dt_gpt2_tp_crossentropy_forward(m, act(m, A_LOSSES), act(m, A_CE_STATS), act(m, A_LOGITS), targets, (int)BT);
        if (loss) *loss = m->loss;
    }
    UNIT_END();
    AFTER_FWD(L + 1);
    return m->comm_err;
}

dt_status dt_gpt2_forward(dt_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    if (m->ua != 0 || m->ub != m->cfg.num_layers + 2 || m->nr > 1)
        return dt_error(DT_ERR_ARG, "forward: the model holds units [%d, %d) only (dt_gpt2_forward_units runs a range)", m->ua, m->ub);
    return dt_gpt2_forward_units(m, 0, m->ub, inputs, NULL, targets, B, T, loss);
}

const float *dt_gpt2_logits(const dt_gpt2 *m) { return m->acts && m->prec == DT_F32 ? m->acts + m->act_off[A_LOGITS] : NULL; }

const float *dt_gpt2_output(const dt_gpt2 *m) {
    if (!m->acts || m->run_b > m->cfg.num_layers + 1) return NULL;
    if (m->run_b >= 2) return res_out((dt_gpt2 *)m, m->run_b - 2); /* the range's last block's output */
    return m->acts + m->act_off[A_ENCODED] + (size_t)m->cur * dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels; /* the embedding's */
}

/* The head's backward (loss, LM head, final LayerNorm) into A_DRES. */
static void head_backward(dt_gpt2 *m, float grad_scale) {
    const dt_gpt2_config *c = &m->cfg;
    int C = c->channels, L = c->num_layers, Vp = m->Vl;
    size_t BT = (size_t)m->B * m->T, BTC = BT * (size_t)C, RC = dt_gpt2_tp_rows(m) * (size_t)C;
    float *dlogits = act(m, A_LOGITS), *dres = act(m, A_DRES), *dln = act(m, A_DLN);
    BEFORE_BWD(L + 1);
    trace_unit(m, "backward", L + 1);
    float dscale = grad_scale / (float)BT;
    memset(dln, 0, BTC * sizeof(float));
    /* the loss's gradient from forward's statistics, without a second pass for them; in 16 bits it is
     * computed a block at a time as the head's backward reads it */
    const float *lnf = dt_gpt2_tp_gather(m, act(m, A_LNF), RC);
    if (m->prec == DT_F32) {
        dt_gpt2_tp_crossentropy_backward(m, dlogits, act(m, A_CE_STATS), m->targets, (int)BT, dscale);
        linear_backward(m, dln, dlogits, lnf, -1, WTE, 0, (int)BT, C, Vp);
    } else {
        dt_ce_grad ce = { .stats = act(m, A_CE_STATS), .targets = m->targets, .V = m->Vv, .v0 = m->v0, .dscale = dscale };
        dt_matmul_backward_lp16(dln, m->split_bwd ? NULL : m->grads + top_off(m, WTE), LOGITS16(m), &ce, lnf, m->params_lp + top_off(m, WTE),
                                (int)BT, C, Vp, m->prec, m->lp_work, m->lp_work_floats, m->part.tp_size > 1);
        m->w_dscale = dscale;
    }
    const float *dlnf = dt_gpt2_tp_combine_linear(m, dln, RC); /* the head is column-parallel (by vocabulary) */
    memset(dres, 0, RC * sizeof(float));
    dt_gpt2_tp_layernorm_backward(m, dres, top_grad(m, LNFW), top_grad(m, LNFB), dlnf, res_in(m, L), top_param(m, LNFW), act(m, A_LNF_MEAN), act(m, A_LNF_RSTD), C);
    UNIT_END();
    AFTER_BWD(L + 1);
}

/* Block l's output gradients kept for W: fcproj's, fc's, attproj's, qkv's. */
static void wgrad_of(dt_gpt2 *m, int l, float *wg[4]) {
    size_t BT = (size_t)m->B * m->T, BTC = BT * (size_t)m->cfg.channels;
    wg[0] = act(m, A_WGRAD) + (size_t)m->bk[l] * wgrad_floats(part_widths(m), BT);
    wg[1] = wg[0] + BTC;
    wg[2] = wg[1] + BT * (size_t)m->Fl;
    wg[3] = wg[2] + BTC;
}

/* Block l's backward: A_DRES holds d(its output) and gets d(its input). */
static void layer_backward(dt_gpt2 *m, int l) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, Cl = m->Cl, NH = m->NHl, F = m->Fl;
    size_t BT = (size_t)B * T, BTC = BT * (size_t)C, BTF = BT * (size_t)F, BTL = BT * (size_t)Cl;
    size_t RC = dt_gpt2_tp_rows(m) * (size_t)C; /* the residual stream's floats here */
    const float *res_in_l = m->lp_layer ? act(m, A_RES1) : res_in(m, l);
    BEFORE_BWD(l + 1);
    trace_unit(m, "backward", l + 1);
    /* Recompute: this layer's activations again, from its kept input
     * (its output is rewritten with the same values); else widen its packed
     * 16-bit ones (mixed precision) */
    if (m->recompute) layer_forward(m, l, res_in_l);
    else pack_block(m, l, false);
    block_acts a = acts_of(m, l);
    float *dres = act(m, A_DRES), *dln = act(m, A_DLN), *tmp = act(m, A_TMP);
    float *dfchg = act(m, A_DFCH_GELU), *dfch = act(m, A_DFCH), *datty = act(m, A_DATTY), *dqkv = act(m, A_DQKV);
    /* a split backward keeps the four Linears' output gradients for W (dres is about to change: a copy) */
    float *wg[4] = { NULL };
    if (m->split_bwd) {
        wgrad_of(m, l, wg);
        dfch = wg[1], dqkv = wg[3];
    }
    /* mixed precision rounds a Linear's output gradient, and dres goes on down the residual stream whole */
    /* a row-parallel Linear's output gradient: all rows (gathered under sequence parallelism) */
    const float *dproj = dt_gpt2_tp_gather(m, dres, RC);
    if (m->prec != DT_F32) { memcpy(tmp, dproj, BTC * sizeof(float)); dproj = tmp; }
    if (wg[0]) { memcpy(wg[0], dproj, BTC * sizeof(float)); dproj = wg[0]; }
    /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))); dres carries d res3 = d res2 (pass-through) */
    memset(dfchg, 0, BTF * sizeof(float));
    linear_backward(m, dfchg, (float *)dproj, a.fchg, l, FCPROJW, FCPROJB, (int)BT, F, C);
    memset(dfch, 0, BTF * sizeof(float));
    dt_gelu_backward(dfch, a.fch, dfchg, BTF);
    memset(dln, 0, BTC * sizeof(float));
    linear_backward(m, dln, dfch, dt_gpt2_tp_gather(m, a.ln2, RC), l, FCW, FCB, (int)BT, C, F);
    /* fc is column-parallel: each rank's share of d(ln2), summed (or reduce-scattered to this rank's rows) */
    dt_gpt2_tp_layernorm_backward(m, dres, layer_grad(m, l, LN2W), layer_grad(m, l, LN2B), dt_gpt2_tp_combine_linear(m, dln, RC), a.res2, layer_param(m, l, LN2W), a.ln2m,
                                  a.ln2r, C);
    /* attention: res2 = res_in + attproj(attn(qkv(ln1(res_in)))) */
    dproj = dt_gpt2_tp_gather(m, dres, RC);
    if (m->prec != DT_F32) { memcpy(tmp, dproj, BTC * sizeof(float)); dproj = tmp; }
    if (wg[2]) { memcpy(wg[2], dproj, BTC * sizeof(float)); dproj = wg[2]; }
    memset(datty, 0, BTL * sizeof(float));
    linear_backward(m, datty, (float *)dproj, a.atty, l, ATTPROJW, ATTPROJB, (int)BT, Cl, C);
    memset(dqkv, 0, BTL * 3 * sizeof(float));
    if (cp(m)) cp_status(m, m->part.cp->backward(m->part.cp->ctx, dqkv, datty, a.atty, a.qkv, a.att, B, T, Cl, NH));
    else if (m->blockwise) dt_attention_backward_lse(dqkv, datty, a.atty, a.qkv, a.att, B, T, Cl, NH);
    else dt_attention_backward(dqkv, datty, a.qkv, a.att, B, T, Cl, NH);
    memset(dln, 0, BTC * sizeof(float));
    linear_backward(m, dln, dqkv, dt_gpt2_tp_gather(m, a.ln1, RC), l, QKVW, QKVB, (int)BT, C, 3 * Cl);
    dt_gpt2_tp_layernorm_backward(m, dres, layer_grad(m, l, LN1W), layer_grad(m, l, LN1B), dt_gpt2_tp_combine_linear(m, dln, RC), res_in_l, layer_param(m, l, LN1W), a.ln1m,
                                  a.ln1r, C); /* qkv is column-parallel */
    UNIT_END();
    AFTER_BWD(l + 1);
}

dt_status dt_gpt2_backward_units(dt_gpt2 *m, const float *dout, float grad_scale) {
    int L = m->cfg.num_layers, a = m->run_a, b = m->run_b;
    if (!m->acts || !m->have_targets) return dt_error(DT_ERR_ARG, "backward: needs a forward (with targets, if it ran the head) first");
    if (m->w_pending) return dt_error(DT_ERR_ARG, "backward: the last backward's weight gradients (dt_gpt2_backward_weights) are still to run");
    if (b < L + 2 && !dout) return dt_error(DT_ERR_ARG, "backward: units [%d, %d) end before the head: d(output) is needed", a, b);
    m->have_targets = false; /* the logits are about to become their gradient */
    m->comm_err = DT_OK;
    size_t RC = dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels;
    if (b == L + 2) head_backward(m, grad_scale);
    else memcpy(act(m, A_DRES), dout, RC * sizeof(float));
    int last = b - 1 < L ? b - 1 : L;
    for (int l = last - 1; l >= (a > 0 ? a - 1 : 0); l--) layer_backward(m, l);
    m->w_pending = m->split_bwd;
    if (a > 0 || m->split_bwd) return m->comm_err; /* A_DRES: d(the range's input), for dt_gpt2_input_grad; the embedding's is all W */
    BEFORE_BWD(0);
    trace_unit(m, "backward", 0);
    dt_gpt2_tp_embedding_backward(m, m->defer_wte_rows ? NULL : top_grad(m, WTE), top_grad(m, WPE), act(m, A_DRES), m->B, m->T);
    UNIT_END();
    AFTER_BWD(0);
    return m->comm_err;
}

dt_status dt_gpt2_backward(dt_gpt2 *m, float grad_scale) { return dt_gpt2_backward_units(m, NULL, grad_scale); }

dt_status dt_gpt2_set_split_backward(dt_gpt2 *m, int on) {
    if (on && m->recompute)
        return dt_error(DT_ERR_UNSUPPORTED, "model: a backward split into input and weight gradients runs without recomputation "
                        "(W reads the activations forward kept)");
    if (m->split_bwd == (on != 0)) return DT_OK;
    m->split_bwd = on != 0;
    /* the activations' layout changes: sized again at the next forward */
    dt_gpt2_drop_slots(m);
    dt_free_aligned(m->acts);
    m->acts = NULL;
    m->bt_capacity = 0;
    return DT_OK;
}

/* W of the head: the tied wte's (or its copy's) gradient from the logits' gradient B left in place (in 16 bits,
 * computed again from the logits as B computed it). */
static void head_weights(dt_gpt2 *m) {
    size_t BT = (size_t)m->B * m->T, RC = dt_gpt2_tp_rows(m) * (size_t)m->cfg.channels;
    trace_unit(m, "weights", m->cfg.num_layers + 1);
    const float *lnf = dt_gpt2_tp_gather(m, act(m, A_LNF), RC);
    if (m->prec == DT_F32) {
        dt_matmul_backward(NULL, m->grads + top_off(m, WTE), NULL, act(m, A_LOGITS), lnf, NULL, (int)BT, m->cfg.channels, m->Vl);
    } else {
        dt_ce_grad ce = { .stats = act(m, A_CE_STATS), .targets = m->targets, .V = m->Vv, .v0 = m->v0, .dscale = m->w_dscale };
        dt_matmul_backward_lp16(NULL, m->grads + top_off(m, WTE), LOGITS16(m), &ce, lnf, NULL, (int)BT, m->cfg.channels, m->Vl, m->prec,
                                m->lp_work, m->lp_work_floats, 0);
    }
    UNIT_END();
}

static void layer_weights(dt_gpt2 *m, int l) {
    int BT = m->B * m->T, C = m->cfg.channels;
    size_t RC = dt_gpt2_tp_rows(m) * (size_t)C;
    pack_block(m, l, false); /* mixed precision: its 16-bit activations widened again */
    block_acts a = acts_of(m, l);
    float *wg[4];
    wgrad_of(m, l, wg);
    trace_unit(m, "weights", l + 1);
    linear_weight_grad(m, wg[0], a.fchg, l, FCPROJW, FCPROJB, BT, m->Fl, C);
    linear_weight_grad(m, wg[1], dt_gpt2_tp_gather(m, a.ln2, RC), l, FCW, FCB, BT, C, m->Fl);
    linear_weight_grad(m, wg[2], a.atty, l, ATTPROJW, ATTPROJB, BT, m->Cl, C);
    linear_weight_grad(m, wg[3], dt_gpt2_tp_gather(m, a.ln1, RC), l, QKVW, QKVB, BT, C, 3 * m->Cl);
    UNIT_END();
}

dt_status dt_gpt2_backward_weights(dt_gpt2 *m) {
    if (!m->w_pending) return dt_error(DT_ERR_ARG, "backward weights: no split backward (B) waits for its weight gradients");
    int L = m->cfg.num_layers, a = m->run_a, b = m->run_b, last = b - 1 < L ? b - 1 : L;
    m->w_pending = false;
    m->comm_err = DT_OK;
    /* unit by unit in backward's order, each unit's gradients announced when whole */
    if (b == L + 2) {
        head_weights(m);
        dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, L + 1);
    }
    for (int l = last - 1; l >= (a > 0 ? a - 1 : 0); l--) {
        layer_weights(m, l);
        dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, l + 1);
    }
    if (a > 0) return m->comm_err;
    BEFORE_BWD(0);
    trace_unit(m, "weights", 0);
    dt_gpt2_tp_embedding_backward(m, m->defer_wte_rows ? NULL : top_grad(m, WTE), top_grad(m, WPE), act(m, A_DRES), m->B, m->T);
    UNIT_END();
    lp_drop(m);
    dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, 0);
    return m->comm_err;
}

void dt_gpt2_hold_grad_hooks(dt_gpt2 *m, int on) { m->hold_hooks = on != 0; }

void dt_gpt2_announce_grads(dt_gpt2 *m) {
    for (int u = m->cfg.num_layers + 1; u >= 0; u--)
        if (range_of(m, u) >= 0) dt_hook_list_call(&m->grad_hooks, DT_HOOK_GRADS_READY, u);
}
