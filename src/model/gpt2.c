/* GPT-2: token + position embeddings, L pre-LayerNorm blocks (fused qkv,
 * causal attention, projection; MLP 4C with GELU), final LayerNorm, LM head
 * tied to the token embedding. Parameters and gradients are flat arrays,
 * unit by unit (embeddings, block 0 .. L-1, final LayerNorm) as the tensor
 * table lays them out; llm.c's tensor-major order exists only in src/io/.
 * Activations are one allocation sized for B*T. */
#include "dtrain/model.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* llm.c's 16 tensors (its names and order), with HF's names and how tensor
 * parallelism splits each (Megatron: qkv and fc column-parallel, the two
 * projections row-parallel, the embedding by vocabulary). */
static const struct { const char *llmc, *hf; dt_tp_split split; } tensor_kinds[DT_GPT2_NTENSORS] = {
    { "wte", "wte.weight", DT_SPLIT_VOCAB }, { "wpe", "wpe.weight", DT_SPLIT_NONE },
    { "ln1w", "ln_1.weight", DT_SPLIT_NONE }, { "ln1b", "ln_1.bias", DT_SPLIT_NONE },
    { "qkvw", "attn.c_attn.weight", DT_SPLIT_COLUMN }, { "qkvb", "attn.c_attn.bias", DT_SPLIT_COLUMN },
    { "attprojw", "attn.c_proj.weight", DT_SPLIT_ROW }, { "attprojb", "attn.c_proj.bias", DT_SPLIT_NONE },
    { "ln2w", "ln_2.weight", DT_SPLIT_NONE }, { "ln2b", "ln_2.bias", DT_SPLIT_NONE },
    { "fcw", "mlp.c_fc.weight", DT_SPLIT_COLUMN }, { "fcb", "mlp.c_fc.bias", DT_SPLIT_COLUMN },
    { "fcprojw", "mlp.c_proj.weight", DT_SPLIT_ROW }, { "fcprojb", "mlp.c_proj.bias", DT_SPLIT_NONE },
    { "lnfw", "ln_f.weight", DT_SPLIT_NONE }, { "lnfb", "ln_f.bias", DT_SPLIT_NONE },
};
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };
#define PER_BLOCK 12 /* ln1w .. fcprojb */

/* Activations kept from forward for backward, per layer where it says L. */
enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_ATT, A_RES2, A_LN2, A_LN2_MEAN, A_LN2_RSTD,
    A_FCH, A_FCH_GELU, A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES,
    /* scratch, not per layer */
    A_TMP, A_DRES, A_DLN, A_DQKV, A_DATTY, A_DFCH, A_DFCH_GELU, A_COUNT
};

struct dt_gpt2 {
    dt_gpt2_config cfg;
    dt_tensor_info *tab;      /* 2 + 12 L + 2 entries, in store order */
    int ntab;
    size_t nparams;
    float *params, *grads, *own_grads;
    dt_grad_hook hook;
    void *hook_ctx;
    int defer_wte_rows;
    float *acts;
    size_t act_sizes[A_COUNT], act_off[A_COUNT], nacts;
    int B, T;                 /* of the last forward */
    size_t bt_capacity;       /* B*T the activations are sized for */
    int32_t *inputs, *targets;
    bool have_targets;
    bool recompute;           /* keep one layer of activations; redo each layer's forward in backward */
    dt_attn_mode attn;
    bool blockwise;           /* of the last forward */
    size_t att_capacity;      /* floats in A_ATT */
    float loss;
};

dt_status dt_gpt2_preset(const char *name, dt_gpt2_config *out) {
    static const struct { const char *name; int L, NH, C, T; } p[] = {
        { "d6", 6, 6, 384, 256 }, { "124M", 12, 12, 768, 1024 }, { "350M", 24, 16, 1024, 1024 },
        { "774M", 36, 20, 1280, 1024 }, { "1558M", 48, 25, 1600, 1024 },
    };
    for (size_t i = 0; i < sizeof p / sizeof p[0]; i++)
        if (!strcmp(name, p[i].name)) {
            *out = (dt_gpt2_config){ p[i].T, 50257, 50304, p[i].L, p[i].NH, p[i].C };
            return DT_OK;
        }
    return dt_error(DT_ERR_ARG, "unknown model preset '%s' (expected d6, 124M, 350M, 774M or 1558M)", name);
}

dt_status dt_gpt2_config_check(const dt_gpt2_config *c, const char *where) {
    if (c->max_seq_len < 1 || c->vocab_size < 1 || c->num_layers < 1 || c->num_heads < 1 || c->channels < 1)
        return dt_error(DT_ERR_ARG, "%s: sizes must be positive (T %d, V %d, L %d, NH %d, C %d)", where, c->max_seq_len,
                        c->vocab_size, c->num_layers, c->num_heads, c->channels);
    if (c->channels % c->num_heads)
        return dt_error(DT_ERR_ARG, "%s: %d channels do not split into %d heads", where, c->channels, c->num_heads);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded vocabulary %d is smaller than the vocabulary %d", where, c->padded_vocab_size,
                        c->vocab_size);
    /* bounds that keep every size computation far from overflowing */
    if ((double)c->padded_vocab_size * c->channels > 1e10 || (double)c->max_seq_len * c->channels > 1e10 ||
        (double)c->num_layers * c->channels * c->channels > 1e11)
        return dt_error(DT_ERR_ARG, "%s: model too large (L %d, C %d, Vp %d, T %d: over 10^11 parameters)", where,
                        c->num_layers, c->channels, c->padded_vocab_size, c->max_seq_len);
    return DT_OK;
}

/* Shape [rows, cols] (cols 0: a vector) of llm.c's tensor i, for one layer. */
static void tensor_shape(const dt_gpt2_config *c, int i, int shape[2]) {
    int C = c->channels;
    static const int mult[DT_GPT2_NTENSORS][2] = { { 0, 1 }, { 0, 1 }, { 1, 0 }, { 1, 0 }, { 3, 1 }, { 3, 0 }, { 1, 1 }, { 1, 0 },
                                                   { 1, 0 }, { 1, 0 }, { 4, 1 }, { 4, 0 }, { 1, 4 }, { 1, 0 }, { 1, 0 }, { 1, 0 } };
    shape[0] = i == WTE ? c->padded_vocab_size : i == WPE ? c->max_seq_len : mult[i][0] * C;
    shape[1] = mult[i][1] * C;
}

size_t dt_gpt2_config_num_params(const dt_gpt2_config *c) {
    size_t n = 0;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        int s[2];
        tensor_shape(c, i, s);
        bool per_layer = i >= LN1W && i <= FCPROJB;
        n += (size_t)s[0] * (size_t)(s[1] ? s[1] : 1) * (per_layer ? (size_t)c->num_layers : 1);
    }
    return n;
}

/* The table in store order: unit 0 (wte, wpe), block units 1..L, unit L+1 (lnfw, lnfb). */
static dt_status layout(dt_gpt2 *m) {
    int L = m->cfg.num_layers;
    m->ntab = 2 + PER_BLOCK * L + 2;
    m->tab = calloc((size_t)m->ntab, sizeof *m->tab);
    if (!m->tab) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->nparams = 0;
    for (int k = 0; k < m->ntab; k++) {
        int i = k < 2 ? k : k >= m->ntab - 2 ? LNFW + (k - (m->ntab - 2)) : LN1W + (k - 2) % PER_BLOCK;
        int l = k < 2 || k >= m->ntab - 2 ? 0 : (k - 2) / PER_BLOCK;
        bool per_layer = i >= LN1W && i <= FCPROJB;
        dt_tensor_info *t = &m->tab[k];
        t->llmc = tensor_kinds[i].llmc;
        t->llmc_index = i;
        t->layer = l;
        t->unit = per_layer ? l + 1 : i <= WPE ? 0 : L + 1;
        t->grad_unit = i == WTE ? L + 1 : t->unit; /* the head's part of wte is final first */
        t->input_rows = i == WTE;
        t->split = tensor_kinds[i].split;
        tensor_shape(&m->cfg, i, t->shape);
        t->ndim = t->shape[1] ? 2 : 1;
        t->count = (size_t)t->shape[0] * (size_t)(t->shape[1] ? t->shape[1] : 1);
        t->offset = m->nparams;
        m->nparams += t->count;
        if (per_layer) {
            snprintf(t->name, sizeof t->name, "h.%d.%s", l, t->llmc);
            snprintf(t->hf, sizeof t->hf, "h.%d.%s", l, tensor_kinds[i].hf);
        } else {
            snprintf(t->name, sizeof t->name, "%s", t->llmc);
            snprintf(t->hf, sizeof t->hf, "%s", tensor_kinds[i].hf);
        }
    }
    return DT_OK;
}

dt_status dt_gpt2_create(const dt_gpt2_config *cfg, dt_gpt2 **out) {
    *out = NULL;
    dt_status st = dt_gpt2_config_check(cfg, "model");
    if (st) return st;
    dt_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    if ((st = layout(m))) { free(m); return st; }
    m->params = dt_alloc_aligned(m->nparams * sizeof(float));
    m->grads = m->own_grads = dt_alloc_aligned(m->nparams * sizeof(float));
    if (!m->params || !m->grads) {
        char sz[32];
        dt_format_size(2 * m->nparams * sizeof(float), sz, sizeof sz);
        dt_gpt2_destroy(m);
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of parameters and gradients", sz);
    }
    memset(m->params, 0, m->nparams * sizeof(float));
    memset(m->grads, 0, m->nparams * sizeof(float));
    *out = m;
    return DT_OK;
}

void dt_gpt2_destroy(dt_gpt2 *m) {
    if (!m) return;
    free(m->tab);
    dt_free_aligned(m->params);
    dt_free_aligned(m->own_grads);
    dt_free_aligned(m->acts);
    free(m->inputs);
    free(m->targets);
    free(m);
}

void dt_gpt2_init_random(dt_gpt2 *m, uint64_t seed) {
    uint64_t s = seed;
    float proj = 0.02f / sqrtf(2.0f * m->cfg.num_layers);
    /* in llm.c's order, so that a seed gives the same weights whatever the store's layout */
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        bool ln_w = i == LN1W || i == LN2W || i == LNFW;
        bool bias = i == QKVB || i == ATTPROJB || i == LN1B || i == LN2B || i == FCB || i == FCPROJB || i == LNFB;
        float std = (i == ATTPROJW || i == FCPROJW) ? proj : 0.02f;
        for (int l = 0; l < (i >= LN1W && i <= FCPROJB ? m->cfg.num_layers : 1); l++) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            float *p = m->params + t->offset;
            for (size_t j = 0; j < t->count; j++) p[j] = ln_w ? 1.0f : bias ? 0.0f : std * dt_rng_normal(&s);
        }
    }
    /* padded vocabulary rows stay zero */
    size_t C = (size_t)m->cfg.channels;
    memset(m->params + m->tab[0].offset + (size_t)m->cfg.vocab_size * C, 0,
           (size_t)(m->cfg.padded_vocab_size - m->cfg.vocab_size) * C * sizeof(float));
}

const dt_gpt2_config *dt_gpt2_get_config(const dt_gpt2 *m) { return &m->cfg; }
size_t dt_gpt2_num_params(const dt_gpt2 *m) { return m->nparams; }
float *dt_gpt2_params(dt_gpt2 *m) { return m->params; }
float *dt_gpt2_grads(dt_gpt2 *m) { return m->grads; }

const dt_tensor_info *dt_gpt2_tensors(const dt_gpt2 *m, int *n) {
    if (n) *n = m->ntab;
    return m->tab;
}

const dt_tensor_info *dt_gpt2_llmc_tensor(const dt_gpt2 *m, int i, int l) {
    if (i <= WPE) return &m->tab[i];
    if (i >= LNFW) return &m->tab[m->ntab - 2 + (i - LNFW)];
    return &m->tab[2 + l * PER_BLOCK + (i - LN1W)];
}

/* Per-layer strides follow the current B and T, so a smaller batch fits in
 * what a larger one allocated as long as B*T and B*T*T (attention) fit. */
static bool use_blockwise(const dt_gpt2 *m, int T) {
    return m->attn == DT_ATTN_BLOCKWISE || (m->attn == DT_ATTN_AUTO && T >= 256);
}

static dt_status size_activations(dt_gpt2 *m, int B, int T) {
    size_t BT = (size_t)B * T;
    size_t att_per_layer = (size_t)m->cfg.num_heads * BT * (use_blockwise(m, T) ? 1 : (size_t)T);
    size_t att_need = att_per_layer * (m->recompute ? 1 : (size_t)m->cfg.num_layers);
    if (m->acts && BT <= m->bt_capacity && att_need <= m->att_capacity) return DT_OK;
    size_t C = (size_t)m->cfg.channels, NH = (size_t)m->cfg.num_heads;
    size_t Vp = (size_t)m->cfg.padded_vocab_size;
    /* Per-layer activations: all L layers, or one when recomputing; the
     * residual stream between layers (A_RES3) is always kept. */
    size_t L = m->recompute ? 1 : (size_t)m->cfg.num_layers, Lres = (size_t)m->cfg.num_layers;
    size_t s[A_COUNT] = {
        [A_ENCODED] = BT * C, [A_LN1] = L * BT * C, [A_LN1_MEAN] = L * BT, [A_LN1_RSTD] = L * BT,
        [A_QKV] = L * BT * 3 * C, [A_ATTY] = L * BT * C, [A_ATT] = L * NH * BT * (use_blockwise(m, T) ? 1 : (size_t)T),
        [A_RES2] = L * BT * C,
        [A_LN2] = L * BT * C, [A_LN2_MEAN] = L * BT, [A_LN2_RSTD] = L * BT, [A_FCH] = L * BT * 4 * C,
        [A_FCH_GELU] = L * BT * 4 * C, [A_RES3] = Lres * BT * C, [A_LNF] = BT * C, [A_LNF_MEAN] = BT, [A_LNF_RSTD] = BT,
        [A_LOGITS] = BT * Vp, [A_LOSSES] = BT, [A_TMP] = BT * C, [A_DRES] = BT * C, [A_DLN] = BT * C,
        [A_DQKV] = BT * 3 * C, [A_DATTY] = BT * C, [A_DFCH] = BT * 4 * C, [A_DFCH_GELU] = BT * 4 * C,
    };
    size_t total = 0;
    for (int i = 0; i < A_COUNT; i++) {
        m->act_sizes[i] = s[i];
        m->act_off[i] = total;
        total += (s[i] + 15) & ~(size_t)15; /* 64-byte aligned starts */
    }
    float *a = dt_alloc_aligned(total * sizeof(float));
    int32_t *in = malloc(BT * sizeof(int32_t)), *tg = malloc(BT * sizeof(int32_t));
    if (!a || !in || !tg) {
        dt_free_aligned(a);
        free(in);
        free(tg);
        char sz[32];
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of activations for B=%d T=%d",
                        dt_format_size(total * sizeof(float), sz, sizeof sz), B, T);
    }
    memset(a, 0, total * sizeof(float));
    dt_free_aligned(m->acts);
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

/* Tensor i (llm.c's index) of block l, in the parameters and the gradients;
 * P and G for the tensors outside the blocks. */
#define BLOCK_OFF(l, i) (m->tab[2 + (l) * PER_BLOCK + (i) - LN1W].offset)
#define PL(l, i) (m->params + BLOCK_OFF(l, i))
#define GL(l, i) (m->grads + BLOCK_OFF(l, i))
#define TAB_OFF(i) ((i) <= WPE ? m->tab[i].offset : m->tab[m->ntab - 2 + (i) - LNFW].offset)
#define P(i) (m->params + TAB_OFF(i))
#define G(i) (m->grads + TAB_OFF(i))
#define ACT(i) (m->acts + m->act_off[i])

/* Block l on residual (its input): writes the layer's activations into slot
 * l (slot 0 when recomputing) and its output into A_RES3[l]. */
static void layer_forward(dt_gpt2 *m, int l, const float *residual) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, NH = c->num_heads;
    size_t BT = (size_t)B * T, BTC = BT * (size_t)C, k = m->recompute ? 0 : (size_t)l;
    float *ln1 = ACT(A_LN1) + k * BTC, *qkv = ACT(A_QKV) + k * BTC * 3, *atty = ACT(A_ATTY) + k * BTC;
    float *att = ACT(A_ATT) + k * NH * BT * (m->blockwise ? 1 : (size_t)T), *res2 = ACT(A_RES2) + k * BTC, *ln2 = ACT(A_LN2) + k * BTC;
    float *fch = ACT(A_FCH) + k * BTC * 4, *fchg = ACT(A_FCH_GELU) + k * BTC * 4, *res3 = ACT(A_RES3) + (size_t)l * BTC;
    dt_layernorm_forward(ln1, ACT(A_LN1_MEAN) + k * BT, ACT(A_LN1_RSTD) + k * BT, residual, PL(l, LN1W),
                         PL(l, LN1B), (int)BT, C);
    dt_matmul_forward(qkv, ln1, PL(l, QKVW), PL(l, QKVB), (int)BT, C, 3 * C);
    if (m->blockwise) dt_attention_forward_lse(atty, att, qkv, B, T, C, NH);
    else dt_attention_forward(atty, att, qkv, B, T, C, NH);
    dt_matmul_forward(ACT(A_TMP), atty, PL(l, ATTPROJW), PL(l, ATTPROJB), (int)BT, C, C);
    dt_residual_forward(res2, residual, ACT(A_TMP), BTC);
    dt_layernorm_forward(ln2, ACT(A_LN2_MEAN) + k * BT, ACT(A_LN2_RSTD) + k * BT, res2, PL(l, LN2W),
                         PL(l, LN2B), (int)BT, C);
    dt_matmul_forward(fch, ln2, PL(l, FCW), PL(l, FCB), (int)BT, C, 4 * C);
    dt_gelu_forward(fchg, fch, BTC * 4);
    dt_matmul_forward(ACT(A_TMP), fchg, PL(l, FCPROJW), PL(l, FCPROJB), (int)BT, 4 * C, C);
    dt_residual_forward(res3, res2, ACT(A_TMP), BTC);
}

void dt_gpt2_set_attention(dt_gpt2 *m, dt_attn_mode mode) { m->attn = mode; }

void dt_gpt2_set_grad_hook(dt_gpt2 *m, dt_grad_hook hook, void *ctx) {
    m->hook = hook;
    m->hook_ctx = ctx;
}

void dt_gpt2_set_defer_wte_rows(dt_gpt2 *m, int on) { m->defer_wte_rows = on; }

const float *dt_gpt2_input_grad(const dt_gpt2 *m, const int32_t **tokens, int *ntokens) {
    if (tokens) *tokens = m->inputs;
    if (ntokens) *ntokens = m->B * m->T;
    return m->acts ? m->acts + m->act_off[A_DRES] : NULL;
}

void dt_gpt2_set_grad_storage(dt_gpt2 *m, float *grads) {
    float *g = grads ? grads : m->own_grads;
    if (g != m->grads) memcpy(g, m->grads, m->nparams * sizeof(float));
    m->grads = g;
}

dt_status dt_gpt2_set_recompute(dt_gpt2 *m, int on) {
    if (m->acts && m->recompute != (on != 0)) {
        /* the activation layout changes: size it again on the next forward */
        dt_free_aligned(m->acts);
        m->acts = NULL;
        m->bt_capacity = m->att_capacity = 0;
    }
    m->recompute = on != 0;
    return DT_OK;
}

dt_status dt_gpt2_forward(dt_gpt2 *m, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    const dt_gpt2_config *c = &m->cfg;
    if (B < 1 || T < 1 || T > c->max_seq_len)
        return dt_error(DT_ERR_ARG, "forward: B=%d T=%d (T must be 1..%d)", B, T, c->max_seq_len);
    size_t BT = (size_t)B * T;
    for (size_t i = 0; i < BT; i++) {
        if (inputs[i] < 0 || inputs[i] >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "forward: input token %d at position %zu is outside the vocabulary (0..%d)",
                            inputs[i], i, c->vocab_size - 1);
        if (targets && (targets[i] < 0 || targets[i] >= c->vocab_size))
            return dt_error(DT_ERR_ARG, "forward: target token %d at position %zu is outside the vocabulary (0..%d)",
                            targets[i], i, c->vocab_size - 1);
    }
    dt_status st = size_activations(m, B, T);
    if (st) return st;
    m->B = B;
    m->T = T;
    m->blockwise = use_blockwise(m, T);
    memcpy(m->inputs, inputs, BT * sizeof(int32_t));
    m->have_targets = targets != NULL;
    if (targets) memcpy(m->targets, targets, BT * sizeof(int32_t));

    int C = c->channels, L = c->num_layers, Vp = c->padded_vocab_size;
    size_t BTC = BT * (size_t)C;
    dt_embedding_forward(ACT(A_ENCODED), inputs, P(WTE), P(WPE), B, T, C);
    const float *residual = ACT(A_ENCODED);
    for (int l = 0; l < L; l++) {
        layer_forward(m, l, residual);
        residual = ACT(A_RES3) + (size_t)l * BTC;
    }
    dt_layernorm_forward(ACT(A_LNF), ACT(A_LNF_MEAN), ACT(A_LNF_RSTD), residual, P(LNFW), P(LNFB), (int)BT, C);
    dt_matmul_forward(ACT(A_LOGITS), ACT(A_LNF), P(WTE), NULL, (int)BT, C, Vp);
    if (targets) {
        m->loss = dt_crossentropy_forward(ACT(A_LOSSES), ACT(A_LOGITS), targets, (int)BT, c->vocab_size, Vp);
        if (loss) *loss = m->loss;
    }
    return DT_OK;
}

const float *dt_gpt2_logits(const dt_gpt2 *m) { return m->acts ? m->acts + m->act_off[A_LOGITS] : NULL; }

dt_status dt_gpt2_backward(dt_gpt2 *m, float grad_scale) {
    if (!m->acts || !m->have_targets) return dt_error(DT_ERR_ARG, "backward: needs a forward with targets first");
    m->have_targets = false; /* the logits are about to become their gradient */
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, L = c->num_layers, NH = c->num_heads, Vp = c->padded_vocab_size;
    size_t BT = (size_t)B * T, BTC = BT * (size_t)C;
    float *dlogits = ACT(A_LOGITS);
    dt_crossentropy_fused(dlogits, ACT(A_LOSSES), m->targets, (int)BT, c->vocab_size, Vp, grad_scale / (float)BT);
    float *dres = ACT(A_DRES), *dln = ACT(A_DLN);
    memset(dln, 0, BTC * sizeof(float));
    dt_matmul_backward(dln, G(WTE), NULL, dlogits, ACT(A_LNF), P(WTE), (int)BT, C, Vp);
    memset(dres, 0, BTC * sizeof(float));
    const float *res_last = L > 0 ? ACT(A_RES3) + (size_t)(L - 1) * BTC : ACT(A_ENCODED);
    dt_layernorm_backward(dres, G(LNFW), G(LNFB), dln, res_last, P(LNFW), ACT(A_LNF_MEAN), ACT(A_LNF_RSTD), (int)BT, C);
    if (m->hook) m->hook(L + 1, m->hook_ctx);
    for (int l = L - 1; l >= 0; l--) {
        const float *res_in = l == 0 ? ACT(A_ENCODED) : ACT(A_RES3) + (size_t)(l - 1) * BTC;
        size_t k = m->recompute ? 0 : (size_t)l;
        /* Recompute: this layer's activations again, from its kept input
         * (A_RES3[l] is rewritten with the same values). */
        if (m->recompute) layer_forward(m, l, res_in);
        float *ln1 = ACT(A_LN1) + k * BTC, *qkv = ACT(A_QKV) + k * BTC * 3, *atty = ACT(A_ATTY) + k * BTC;
        float *att = ACT(A_ATT) + k * NH * BT * (m->blockwise ? 1 : (size_t)T), *res2 = ACT(A_RES2) + k * BTC;
        float *ln2 = ACT(A_LN2) + k * BTC, *fch = ACT(A_FCH) + k * BTC * 4, *fchg = ACT(A_FCH_GELU) + k * BTC * 4;
        float *dfchg = ACT(A_DFCH_GELU), *dfch = ACT(A_DFCH), *datty = ACT(A_DATTY), *dqkv = ACT(A_DQKV);
        /* MLP: res3 = res2 + fcproj(gelu(fc(ln2(res2)))); dres carries d res3 = d res2 (pass-through) */
        memset(dfchg, 0, BTC * 4 * sizeof(float));
        dt_matmul_backward(dfchg, GL(l, FCPROJW), GL(l, FCPROJB), dres, fchg, PL(l, FCPROJW), (int)BT, 4 * C, C);
        memset(dfch, 0, BTC * 4 * sizeof(float));
        dt_gelu_backward(dfch, fch, dfchg, BTC * 4);
        memset(dln, 0, BTC * sizeof(float));
        dt_matmul_backward(dln, GL(l, FCW), GL(l, FCB), dfch, ln2, PL(l, FCW), (int)BT, C, 4 * C);
        dt_layernorm_backward(dres, GL(l, LN2W), GL(l, LN2B), dln, res2, PL(l, LN2W),
                              ACT(A_LN2_MEAN) + k * BT, ACT(A_LN2_RSTD) + k * BT, (int)BT, C);
        /* attention: res2 = res_in + attproj(attn(qkv(ln1(res_in)))) */
        memset(datty, 0, BTC * sizeof(float));
        dt_matmul_backward(datty, GL(l, ATTPROJW), GL(l, ATTPROJB), dres, atty, PL(l, ATTPROJW), (int)BT, C, C);
        memset(dqkv, 0, BTC * 3 * sizeof(float));
        if (m->blockwise) dt_attention_backward_lse(dqkv, datty, atty, qkv, att, B, T, C, NH);
        else dt_attention_backward(dqkv, datty, qkv, att, B, T, C, NH);
        memset(dln, 0, BTC * sizeof(float));
        dt_matmul_backward(dln, GL(l, QKVW), GL(l, QKVB), dqkv, ln1, PL(l, QKVW), (int)BT, C, 3 * C);
        dt_layernorm_backward(dres, GL(l, LN1W), GL(l, LN1B), dln, res_in, PL(l, LN1W),
                              ACT(A_LN1_MEAN) + k * BT, ACT(A_LN1_RSTD) + k * BT, (int)BT, C);
        if (m->hook) m->hook(l + 1, m->hook_ctx);
    }
    dt_embedding_backward(m->defer_wte_rows ? NULL : G(WTE), G(WPE), dres, m->inputs, B, T, C);
    if (m->hook) m->hook(0, m->hook_ctx);
    return DT_OK;
}

void dt_gpt2_zero_grad(dt_gpt2 *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

size_t dt_gpt2_memory(const dt_gpt2 *m) { return (2 * m->nparams + m->nacts) * sizeof(float); }

/* The generic view (dt_model) over GPT-2's own functions. */
static float *v_params(void *m) { return dt_gpt2_params(m); }
static float *v_grads(void *m) { return dt_gpt2_grads(m); }
static void v_storage(void *m, float *g) { dt_gpt2_set_grad_storage(m, g); }
static void v_hook(void *m, dt_grad_hook h, void *ctx) { dt_gpt2_set_grad_hook(m, h, ctx); }
static void v_defer(void *m, int on) { dt_gpt2_set_defer_wte_rows(m, on); }
static const float *v_input_grad(const void *m, const int32_t **tok, int *n) { return dt_gpt2_input_grad(m, tok, n); }

void dt_gpt2_model(dt_gpt2 *m, dt_model *out) {
    *out = (dt_model){ m, "gpt2", m->tab, m->ntab, m->cfg.num_layers + 2, m->nparams, v_params, v_grads, v_storage, v_hook,
                       v_defer, v_input_grad };
}
