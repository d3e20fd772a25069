/* GPT-2: token + position embeddings, L pre-LayerNorm blocks (fused qkv,
 * causal attention, projection; MLP 4C with GELU), final LayerNorm, LM head
 * tied to the token embedding. Parameters and gradients are flat arrays in
 * llm.c's order; activations one allocation sized for B*T. */
#include "dtrain/model.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

static const char *tensor_names[DT_GPT2_NTENSORS] = {
    "wte", "wpe", "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
    "ln2w", "ln2b", "fcw", "fcb", "fcprojw", "fcprojb", "lnfw", "lnfb",
};
enum { WTE, WPE, LN1W, LN1B, QKVW, QKVB, ATTPROJW, ATTPROJB, LN2W, LN2B, FCW, FCB, FCPROJW, FCPROJB, LNFW, LNFB };

/* Activations kept from forward for backward, per layer where it says L. */
enum {
    A_ENCODED, A_LN1, A_LN1_MEAN, A_LN1_RSTD, A_QKV, A_ATTY, A_ATT, A_RES2, A_LN2, A_LN2_MEAN, A_LN2_RSTD,
    A_FCH, A_FCH_GELU, A_RES3, A_LNF, A_LNF_MEAN, A_LNF_RSTD, A_LOGITS, A_LOSSES,
    /* scratch, not per layer */
    A_TMP, A_DRES, A_DLN, A_DQKV, A_DATTY, A_DFCH, A_DFCH_GELU, A_COUNT
};

struct dt_gpt2 {
    dt_gpt2_config cfg;
    size_t sizes[DT_GPT2_NTENSORS], offsets[DT_GPT2_NTENSORS], nparams;
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

/* Element counts of the 16 tensors in llm.c's order. */
static void tensor_sizes(const dt_gpt2_config *c, size_t s[DT_GPT2_NTENSORS]) {
    size_t Vp = (size_t)c->padded_vocab_size, C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t T = (size_t)c->max_seq_len;
    const size_t v[DT_GPT2_NTENSORS] = { Vp * C, T * C, L * C, L * C, L * 3 * C * C, L * 3 * C, L * C * C, L * C,
                                         L * C, L * C, L * 4 * C * C, L * 4 * C, L * C * 4 * C, L * C, C, C };
    memcpy(s, v, sizeof v);
}

size_t dt_gpt2_config_num_params(const dt_gpt2_config *c) {
    size_t s[DT_GPT2_NTENSORS], n = 0;
    tensor_sizes(c, s);
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) n += s[i];
    return n;
}

static void layout(dt_gpt2 *m) {
    tensor_sizes(&m->cfg, m->sizes);
    m->nparams = 0;
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        m->offsets[i] = m->nparams;
        m->nparams += m->sizes[i];
    }
}

dt_status dt_gpt2_create(const dt_gpt2_config *cfg, dt_gpt2 **out) {
    *out = NULL;
    dt_status st = dt_gpt2_config_check(cfg, "model");
    if (st) return st;
    dt_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    layout(m);
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
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        float *p = m->params + m->offsets[i];
        bool ln_w = i == LN1W || i == LN2W || i == LNFW;
        bool bias = i == QKVB || i == ATTPROJB || i == LN1B || i == LN2B || i == FCB || i == FCPROJB || i == LNFB;
        float std = (i == ATTPROJW || i == FCPROJW) ? proj : 0.02f;
        for (size_t j = 0; j < m->sizes[i]; j++) p[j] = ln_w ? 1.0f : bias ? 0.0f : std * dt_rng_normal(&s);
    }
    /* padded vocabulary rows stay zero */
    size_t C = (size_t)m->cfg.channels;
    memset(m->params + m->offsets[WTE] + (size_t)m->cfg.vocab_size * C, 0,
           (size_t)(m->cfg.padded_vocab_size - m->cfg.vocab_size) * C * sizeof(float));
}

const dt_gpt2_config *dt_gpt2_get_config(const dt_gpt2 *m) { return &m->cfg; }
size_t dt_gpt2_num_params(const dt_gpt2 *m) { return m->nparams; }
float *dt_gpt2_params(dt_gpt2 *m) { return m->params; }
float *dt_gpt2_grads(dt_gpt2 *m) { return m->grads; }

void dt_gpt2_tensor(const dt_gpt2 *m, int i, const char **name, size_t *offset, size_t *count) {
    if (name) *name = tensor_names[i];
    if (offset) *offset = m->offsets[i];
    if (count) *count = m->sizes[i];
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

#define P(i) (m->params + m->offsets[i])
#define G(i) (m->grads + m->offsets[i])
#define ACT(i) (m->acts + m->act_off[i])

/* Block l on residual (its input): writes the layer's activations into slot
 * l (slot 0 when recomputing) and its output into A_RES3[l]. */
static void layer_forward(dt_gpt2 *m, int l, const float *residual) {
    const dt_gpt2_config *c = &m->cfg;
    int B = m->B, T = m->T, C = c->channels, NH = c->num_heads;
    size_t BT = (size_t)B * T, BTC = BT * (size_t)C, cc = (size_t)C * C, k = m->recompute ? 0 : (size_t)l;
    float *ln1 = ACT(A_LN1) + k * BTC, *qkv = ACT(A_QKV) + k * BTC * 3, *atty = ACT(A_ATTY) + k * BTC;
    float *att = ACT(A_ATT) + k * NH * BT * (m->blockwise ? 1 : (size_t)T), *res2 = ACT(A_RES2) + k * BTC, *ln2 = ACT(A_LN2) + k * BTC;
    float *fch = ACT(A_FCH) + k * BTC * 4, *fchg = ACT(A_FCH_GELU) + k * BTC * 4, *res3 = ACT(A_RES3) + (size_t)l * BTC;
    dt_layernorm_forward(ln1, ACT(A_LN1_MEAN) + k * BT, ACT(A_LN1_RSTD) + k * BT, residual, P(LN1W) + l * C,
                         P(LN1B) + l * C, (int)BT, C);
    dt_matmul_forward(qkv, ln1, P(QKVW) + l * 3 * cc, P(QKVB) + l * 3 * C, (int)BT, C, 3 * C);
    if (m->blockwise) dt_attention_forward_lse(atty, att, qkv, B, T, C, NH);
    else dt_attention_forward(atty, att, qkv, B, T, C, NH);
    dt_matmul_forward(ACT(A_TMP), atty, P(ATTPROJW) + l * cc, P(ATTPROJB) + l * C, (int)BT, C, C);
    dt_residual_forward(res2, residual, ACT(A_TMP), BTC);
    dt_layernorm_forward(ln2, ACT(A_LN2_MEAN) + k * BT, ACT(A_LN2_RSTD) + k * BT, res2, P(LN2W) + l * C,
                         P(LN2B) + l * C, (int)BT, C);
    dt_matmul_forward(fch, ln2, P(FCW) + l * 4 * cc, P(FCB) + l * 4 * C, (int)BT, C, 4 * C);
    dt_gelu_forward(fchg, fch, BTC * 4);
    dt_matmul_forward(ACT(A_TMP), fchg, P(FCPROJW) + l * 4 * cc, P(FCPROJB) + l * C, (int)BT, 4 * C, C);
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
    size_t BT = (size_t)B * T, BTC = BT * (size_t)C, cc = (size_t)C * C;
    float *dlogits = ACT(A_LOGITS);
    dt_crossentropy_fused(dlogits, ACT(A_LOSSES), m->targets, (int)BT, c->vocab_size, Vp, grad_scale / (float)BT);
    float *dres = ACT(A_DRES), *dln = ACT(A_DLN);
    memset(dln, 0, BTC * sizeof(float));
    dt_matmul_backward(dln, G(WTE), NULL, dlogits, ACT(A_LNF), P(WTE), (int)BT, C, Vp);
    if (m->hook) m->hook(L + 1, m->hook_ctx);
    memset(dres, 0, BTC * sizeof(float));
    const float *res_last = L > 0 ? ACT(A_RES3) + (size_t)(L - 1) * BTC : ACT(A_ENCODED);
    dt_layernorm_backward(dres, G(LNFW), G(LNFB), dln, res_last, P(LNFW), ACT(A_LNF_MEAN), ACT(A_LNF_RSTD), (int)BT, C);
    if (m->hook) m->hook(L, m->hook_ctx);
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
        dt_matmul_backward(dfchg, G(FCPROJW) + l * 4 * cc, G(FCPROJB) + l * C, dres, fchg, P(FCPROJW) + l * 4 * cc, (int)BT, 4 * C, C);
        memset(dfch, 0, BTC * 4 * sizeof(float));
        dt_gelu_backward(dfch, fch, dfchg, BTC * 4);
        memset(dln, 0, BTC * sizeof(float));
        dt_matmul_backward(dln, G(FCW) + l * 4 * cc, G(FCB) + l * 4 * C, dfch, ln2, P(FCW) + l * 4 * cc, (int)BT, C, 4 * C);
        dt_layernorm_backward(dres, G(LN2W) + l * C, G(LN2B) + l * C, dln, res2, P(LN2W) + l * C,
                              ACT(A_LN2_MEAN) + k * BT, ACT(A_LN2_RSTD) + k * BT, (int)BT, C);
        /* attention: res2 = res_in + attproj(attn(qkv(ln1(res_in)))) */
        memset(datty, 0, BTC * sizeof(float));
        dt_matmul_backward(datty, G(ATTPROJW) + l * cc, G(ATTPROJB) + l * C, dres, atty, P(ATTPROJW) + l * cc, (int)BT, C, C);
        memset(dqkv, 0, BTC * 3 * sizeof(float));
        if (m->blockwise) dt_attention_backward_lse(dqkv, datty, atty, qkv, att, B, T, C, NH);
        else dt_attention_backward(dqkv, datty, qkv, att, B, T, C, NH);
        memset(dln, 0, BTC * sizeof(float));
        dt_matmul_backward(dln, G(QKVW) + l * 3 * cc, G(QKVB) + l * 3 * C, dqkv, ln1, P(QKVW) + l * 3 * cc, (int)BT, C, 3 * C);
        dt_layernorm_backward(dres, G(LN1W) + l * C, G(LN1B) + l * C, dln, res_in, P(LN1W) + l * C,
                              ACT(A_LN1_MEAN) + k * BT, ACT(A_LN1_RSTD) + k * BT, (int)BT, C);
        if (m->hook) m->hook(l, m->hook_ctx);
    }
    dt_embedding_backward(m->defer_wte_rows ? NULL : G(WTE), G(WPE), dres, m->inputs, B, T, C);
    if (m->hook) m->hook(-1, m->hook_ctx);
    return DT_OK;
}

void dt_gpt2_zero_grad(dt_gpt2 *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

size_t dt_gpt2_memory(const dt_gpt2 *m) { return (2 * m->nparams + m->nacts) * sizeof(float); }
