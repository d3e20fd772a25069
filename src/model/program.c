/* The model program: one interpreter for every transformer family. A family
 * (spec_gpt2.c, spec_llama.c) declares its tensors and the ops of a block;
 * this file lays the tensors out in a table and flat stores (unit by unit:
 * 0 the embedding, 1..L the blocks, L+1 the final norm and the head, as
 * every strategy expects), and runs forward and backward by walking the ops:
 * forward in order, each writing its output value; backward in reverse, each
 * adding into the gradients of what it read.
 *
 * Every value a block computes is kept per layer for backward (f32, no
 * recomputation yet); the gradients of a block's values are one set that
 * each layer's backward reuses. Attention takes q, k and v side by side
 * (K/V heads may be fewer), turns q and k by their positions where the family
 * is rotary, and hands the attention kernels the q|k|v of all heads (a K/V
 * head repeated for the heads that share it), kept for backward. */
#include "program_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int width_of(const dt_lm_config *c, dt_width w) {
    int q = c->num_heads * c->head_dim, kv = c->kv_heads * c->head_dim;
    switch (w) {
    case W_NONE: return 0;
    case W_C: return c->channels;
    case W_Q: return q;
    case W_KV: return kv;
    case W_QKV: return q + 2 * kv;
    case W_FFN: return c->ffn;
    case W_FFN2: return 2 * c->ffn;
    case W_VOCAB: return c->padded_vocab_size;
    case W_POS: return c->max_seq_len;
    case W_EXPERTS: return c->experts;
    case W_SFFN: return c->shared_ffn;
    case W_ONE: return 1;
    case W_DFFN: return c->dense_ffn;
    case W_DFFN2: return 2 * c->dense_ffn;
    case W_HD: return c->head_dim;
    }
    return 0;
}

/* A spec tensor's values in the whole model (one layer's, for a block's). */
static size_t spec_count(const dt_lm_config *c, const dt_tensor_spec *s) {
    size_t cols = (size_t)width_of(c, s->cols), stack = s->stack ? (size_t)width_of(c, s->stack) : 1;
    return stack * (size_t)width_of(c, s->rows) * (cols ? cols : 1);
}

bool dt_lm_layer_moe(const dt_lm_config *c, int l) {
    return c->experts > 0 && l >= c->first_dense && (l + 1) % (c->moe_every > 0 ? c->moe_every : 1) == 0;
}

/* The mixtures among layers [0, below): l + 1 a multiple of N in (first_dense, below] (a count, not a walk: the table
 * asks it for every tensor of every layer). */
static int moe_below(const dt_lm_config *c, int below) {
    int N = c->moe_every > 0 ? c->moe_every : 1, first = c->first_dense > 0 ? c->first_dense : 0;
    return c->experts > 0 && below > first ? below / N - first / N : 0;
}

int dt_lm_moe_layers(const dt_lm_config *c) { return moe_below(c, c->num_layers); }

/* Whether layer l holds a spec's tensor; how many layers below l do. */
static bool spec_in(const dt_lm_config *c, const dt_tensor_spec *s, int l) { return dt_layers_hold(s->layers, dt_lm_layer_moe(c, l)); }
static int layers_with(const dt_lm_config *c, const dt_tensor_spec *s, int below) {
    int moe = moe_below(c, below);
    return s->layers == DT_LAYERS_ALL ? below : s->layers == DT_LAYERS_MOE ? moe : below - moe;
}

/* This rank's width: w split as tensor parallelism splits it (the whole on one rank). */
static int local_width(const dt_program *p, dt_width w) {
    switch (w) {
    case W_Q: return p->Ql;
    case W_KV: return p->KVl;
    case W_QKV: return p->Ql + 2 * p->KVl;
    case W_FFN: return p->Fl;
    case W_FFN2: return 2 * p->Fl;
    case W_DFFN: return p->Dl;
    case W_DFFN2: return 2 * p->Dl;
    case W_SFFN: return p->Sl;
    case W_VOCAB: return p->Vl;
    default: return width_of(&p->cfg, w);
    }
}

static const dt_family *const families[] = { &dt_family_gpt2, &dt_family_llama, &dt_family_qwen2, &dt_family_mixtral, &dt_family_qwen2_moe,
                                             &dt_family_deepseek_moe, &dt_family_gpt2_moe, &dt_family_qwen3,
                                             &dt_family_qwen3_moe };
enum { NFAMILIES = sizeof families / sizeof *families };

const dt_family *dt_family_find(const char *name) {
    for (int i = 0; name && i < NFAMILIES; i++)
        if (!strcmp(name, families[i]->name)) return families[i];
    return NULL;
}

int dt_family_index(const dt_family *f) {
    for (int i = 0; i < NFAMILIES; i++)
        if (families[i] == f) return i;
    return -1;
}

const char *dt_family_name(const dt_family *f) { return f ? f->name : "(none)"; }

const char *dt_family_hf_arch(const dt_family *f, const char **why) {
    if (why) *why = f && f->hf_none ? f->hf_none : "the family has no Hugging Face architecture";
    return f ? f->hf_arch : NULL;
}

const dt_family *dt_family_find_hf_arch(const char *arch) {
    for (int i = 0; arch && i < NFAMILIES; i++)
        if (families[i]->hf_arch && !strcmp(arch, families[i]->hf_arch)) return families[i];
    return NULL;
}

void dt_family_hf_archs(char *buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < NFAMILIES && at < n; i++)
        if (families[i]->hf_arch)
            at += (size_t)snprintf(buf + at, n - at, "%s%s (%s)", at ? ", " : "", families[i]->name, families[i]->hf_arch);
}
void dt_family_names(char *buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = 0;
    for (int i = 0; i < NFAMILIES && at < n; i++) at += (size_t)snprintf(buf + at, n - at, "%s%s", at ? ", " : "", families[i]->name);
}
const char *dt_family_gguf_arch(const dt_family *f) { return f ? f->gguf_arch : "gpt2"; }
int dt_family_gguf_pairs(const dt_family *f) { return f ? f->gguf_pairs : 0; }
const char *dt_family_lora_targets(const dt_family *f) { return f && f->lora_targets ? f->lora_targets : ""; }

/* The family's first op of a kind (NULL: none); its mixture of experts. */
static const dt_op_spec *op_of(const dt_family *f, dt_op_kind kind) {
    for (int k = 0; f && k < f->nops; k++)
        if (f->ops[k].kind == kind) return &f->ops[k];
    return NULL;
}
static const dt_op_spec *moe_spec(const dt_family *f) { return op_of(f, DT_OP_MOE); }
bool dt_program_has_op(const dt_program *p, dt_op_kind kind) { return op_of(p->f, kind) != NULL; }

bool dt_family_moe(const dt_family *f) { return moe_spec(f) != NULL; }

bool dt_family_moe_gated(const dt_family *f) {
    const dt_op_spec *s = moe_spec(f);
    return s && s->nw != 3; /* (router, up, down: GELU experts) */
}

dt_lm_config dt_lm_config_resolve(const dt_lm_config *in) {
    dt_lm_config c = *in;
    if (!c.family) c.family = &dt_family_gpt2;
    if (!c.kv_heads) c.kv_heads = c.num_heads;
    if (!c.head_dim && c.num_heads > 0) c.head_dim = c.channels / c.num_heads;
    if (!c.ffn) c.ffn = 4 * c.channels;
    if (!(c.norm_eps > 0)) c.norm_eps = 1e-5f;
    if (!(c.rope_theta > 0)) c.rope_theta = 10000;
    if (c.experts && !c.experts_top_k) c.experts_top_k = 2;
    if (c.experts && !c.moe_every) c.moe_every = 1;
    /* a dense layer's MLP: as wide as an expert's unless given; no dense layer, none */
    if (c.experts && c.moe_every > 0 && c.first_dense >= 0 && dt_lm_moe_layers(&c) == c.num_layers) c.dense_ffn = 0;
    else if (c.experts && !c.dense_ffn) c.dense_ffn = c.ffn;
    if (c.router == DT_ROUTER_SIGMOID_BIAS) {
        if (!c.expert_groups) c.expert_groups = 1;
        if (!c.group_top_k) c.group_top_k = c.expert_groups;
        if (!(c.routed_scale > 0)) c.routed_scale = 1;
    }
    return c;
}

bool dt_lm_config_same(const dt_lm_config *x, const dt_lm_config *y) {
    dt_lm_config a = dt_lm_config_resolve(x), b = dt_lm_config_resolve(y);
    return a.max_seq_len == b.max_seq_len && a.vocab_size == b.vocab_size && a.padded_vocab_size == b.padded_vocab_size &&
           a.num_layers == b.num_layers && a.num_heads == b.num_heads && a.channels == b.channels && a.family == b.family &&
           a.kv_heads == b.kv_heads && a.head_dim == b.head_dim && a.ffn == b.ffn && a.untied == b.untied && a.norm_eps == b.norm_eps &&
           a.rope_theta == b.rope_theta && a.rope_factor == b.rope_factor && a.rope_low_freq_factor == b.rope_low_freq_factor &&
           a.rope_high_freq_factor == b.rope_high_freq_factor && a.rope_original_max == b.rope_original_max && a.experts == b.experts &&
           a.experts_top_k == b.experts_top_k && a.norm_topk == b.norm_topk && a.aux_coef == b.aux_coef && a.shared_ffn == b.shared_ffn &&
           a.router == b.router && a.expert_groups == b.expert_groups && a.group_top_k == b.group_top_k && a.routed_scale == b.routed_scale &&
           a.capacity_factor == b.capacity_factor && a.drop_policy == b.drop_policy && a.moe_every == b.moe_every &&
           a.first_dense == b.first_dense && a.dense_ffn == b.dense_ffn;
}

dt_status dt_lm_config_check(const dt_lm_config *given, const char *where) {
    dt_lm_config r = dt_lm_config_resolve(given), *c = &r;
    if (c->vocab_size < 1 || c->max_seq_len < 1 || c->num_layers < 1 || c->num_heads < 1 || c->kv_heads < 1 || c->head_dim < 1 ||
        c->channels < 1 || c->ffn < 1)
        return dt_error(DT_ERR_ARG, "%s: sizes must be positive (V %d, T %d, L %d, heads %d, K/V heads %d, head %d, C %d, MLP %d)", where,
                        c->vocab_size, c->max_seq_len, c->num_layers, c->num_heads, c->kv_heads, c->head_dim, c->channels, c->ffn);
    if (c->num_heads % c->kv_heads)
        return dt_error(DT_ERR_ARG, "%s: %d K/V heads do not divide the %d attention heads", where, c->kv_heads, c->num_heads);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded vocabulary %d is smaller than the vocabulary %d", where, c->padded_vocab_size, c->vocab_size);
    if (c->family->rotary && (c->head_dim % 2 || c->head_dim > 512 || !(c->rope_theta > 1)))
        return dt_error(DT_ERR_ARG, "%s: rotary positions need an even head of at most 512 channels (%d) and a base above 1 (%g)", where,
                        c->head_dim, (double)c->rope_theta);
    if (!c->family->rotary && c->num_heads * c->head_dim != c->channels)
        return dt_error(DT_ERR_ARG, "%s: %d heads of %d channels are not the %d channels", where, c->num_heads, c->head_dim, c->channels);
    if (!(c->norm_eps > 0)) return dt_error(DT_ERR_ARG, "%s: the norms' epsilon %g must be positive", where, (double)c->norm_eps);
    if (dt_family_moe(c->family) != (c->experts > 0))
        return dt_error(DT_ERR_ARG, "%s: %d experts for the %s family (%s)", where, c->experts, c->family->name,
                        dt_family_moe(c->family) ? "a mixture of experts needs at least one: --experts E" : "its MLP is dense");
    bool with_shared = false;
    for (int k = 0; k < c->family->nops; k++) with_shared |= c->family->ops[k].kind == DT_OP_MOE && c->family->ops[k].nw > 4;
    if (c->experts && with_shared != (c->shared_ffn > 0))
        return dt_error(DT_ERR_ARG, "%s: a shared expert of %d hidden units for the %s family (%s)", where, c->shared_ffn, c->family->name,
                        with_shared ? "it has one: its width must be at least 1" : "it has none");
    if (c->experts && (c->experts_top_k < 1 || c->experts_top_k > c->experts || c->experts_top_k > DT_MOE_MAX_K || c->experts > DT_MOE_MAX_EXPERTS))
        return dt_error(DT_ERR_ARG, "%s: top-%d routing among %d experts: k must be from 1 to the experts' count and 32 (experts: at most 4096)", where,
                        c->experts_top_k, c->experts);
    if (!(c->aux_coef >= 0)) return dt_error(DT_ERR_ARG, "%s: the load-balancing loss's coefficient %g is negative", where, (double)c->aux_coef);
    if (c->router == DT_ROUTER_SIGMOID_BIAS) {
        int G = c->expert_groups, TG = c->group_top_k;
        if (G < 1 || c->experts % G || TG < 1 || TG > G || (G > 1 && c->experts / G < 2) || c->experts_top_k > TG * (c->experts / G))
            return dt_error(DT_ERR_ARG, "%s: %d experts in %d groups, the best %d of them, top-%d: the groups must divide the experts (two "
                            "each at least) and hold the k chosen", where, c->experts, G, TG, c->experts_top_k);
        if (!(c->routed_scale > 0) || !(c->bias_rate >= 0) || c->aux_coef > 0)
            return dt_error(DT_ERR_ARG, "%s: the sigmoid router needs a positive scale (%g), a bias rate of 0 or more (%g) and no "
                            "auxiliary loss (%g): its bias balances the load", where, (double)c->routed_scale, (double)c->bias_rate,
                            (double)c->aux_coef);
    } else if (c->router != DT_ROUTER_SOFTMAX) {
        return dt_error(DT_ERR_ARG, "%s: router %d is neither softmax (0) nor sigmoid-bias (1)", where, c->router);
    }
    if (!c->experts && (c->moe_every > 1 || c->first_dense || c->dense_ffn))
        return dt_error(DT_ERR_ARG, "%s: dense layers among mixtures (every %d, the first %d dense, %d hidden units) without experts "
                        "(--experts E)", where, c->moe_every, c->first_dense, c->dense_ffn);
    if (c->experts && (c->moe_every < 1 || c->first_dense < 0 || c->dense_ffn < 0 || !dt_lm_moe_layers(c)))
        return dt_error(DT_ERR_ARG, "%s: a mixture every %d layers after the first %d dense (of %d layers, dense MLPs of %d hidden "
                        "units): no layer would be a mixture, or a value is below 0", where, c->moe_every, c->first_dense,
                        c->num_layers, c->dense_ffn);
    if (!(c->capacity_factor >= 0) || c->drop_policy < 0 || c->drop_policy > 1) {
        return dt_error(DT_ERR_ARG, "%s: a capacity factor of %g (0: dropless) or drop policy %d (0 by weight, 1 by position)", where,
                        (double)c->capacity_factor, c->drop_policy);
    }
    if ((double)c->padded_vocab_size * c->channels > 1e10 ||
        (double)c->num_layers * c->channels * (c->channels + 3.0 * c->ffn * (c->experts ? c->experts : 1) + 3.0 * c->dense_ffn) > 2e12)
        return dt_error(DT_ERR_ARG, "%s: model too large (over 2 x 10^12 parameters)", where);
    return DT_OK;
}

/* ---- the table ---- */

/* This rank's slice of t (whole so far): a column-parallel tensor by output rows (its heads' q, its K/V heads, its
 * hidden units; GPT-2's fused q/k/v: the same heads' rows of each), a row-parallel one by input columns, the
 * vocabulary's by rows. */
static void slice(const dt_program *p, const dt_tensor_spec *s, dt_tensor_info *t) {
    int r = p->part.tp_rank;
    switch (t->split) {
    case DT_SPLIT_COLUMN:
        if (s->rows == W_QKV) t->slice = (dt_tensor_slice){ 0, r * p->Ql, p->Ql, 3, width_of(&p->cfg, W_Q) };
        else if (s->rows == W_KV) t->slice = (dt_tensor_slice){ 0, p->kv0 * p->cfg.head_dim, p->KVl, 1, p->KVl };
        else {
            int n = local_width(p, s->rows);
            t->slice = (dt_tensor_slice){ 0, r * n, n, 1, n };
        }
        t->shape[0] = t->slice.count * t->slice.pieces;
        break;
    case DT_SPLIT_ROW: {
        int n = local_width(p, s->cols);
        t->slice = (dt_tensor_slice){ 1, r * n, n, 1, n };
        t->shape[1] = n;
        break;
    }
    case DT_SPLIT_VOCAB:
        t->slice = (dt_tensor_slice){ 0, p->v0, p->Vl, 1, p->Vl };
        t->shape[0] = p->Vl;
        break;
    case DT_SPLIT_NONE: t->replicas = p->part.tp_size, t->replica = r; break;
    }
    /* fewer K/V heads than ranks: the ranks that read one K/V head (consecutive) each keep it */
    int keep = p->cfg.kv_heads < p->part.tp_size ? p->part.tp_size / p->cfg.kv_heads : 1;
    if (s->rows == W_KV && keep > 1) t->replicas = keep, t->replica = r % keep;
}

/* Expert parallelism: a stacked tensor holds this rank's experts (a slice of its first dimension), averaged over the
 * ranks holding the same ones; the rest is the same on every rank of the group, counted once (its first) in the norm. */
static void expert_slice(const dt_program *p, const dt_tensor_spec *s, dt_tensor_info *t) {
    int n = p->part.ep_size, r = p->part.ep_rank;
    if (s->stack) {
        int El = t->gshape[0] / n;
        t->slice = (dt_tensor_slice){ 0, r * El, El, 1, El };
        t->shape[0] = El;
        t->group = DT_GROUP_EXPERT;
        return;
    }
    int tp = t->replicas > 1 ? t->replicas : 1;
    t->replica += tp * r, t->replicas = tp * n;
}

/* The whole model's tensors in store order: the embedding's, each block's, the final ones (a tied head left
 * out). Section 0, 1, 2; i within the section's spec list. */
static int nfinal_of(const dt_program *p) {
    const dt_family *f = p->f;
    return f->nfinal - (!p->cfg.untied && f->final[f->nfinal - 1].rows == W_VOCAB);
}


/* Where a tensor starts in the whole model's store (the checkpoints' layout): unit by unit (a layer holding its own
 * tensors). */
static size_t global_offset(const dt_program *p, int section, int i, int layer) {
    const dt_family *f = p->f;
    size_t at = 0;
    for (int j = 0; j < (section == 0 ? i : f->nembed); j++) at += spec_count(&p->cfg, &f->embed[j]);
    if (section == 0) return at;
    for (int j = 0; j < f->nblock; j++)
        at += (size_t)layers_with(&p->cfg, &f->block[j], section == 1 ? layer : p->cfg.num_layers) * spec_count(&p->cfg, &f->block[j]);
    const dt_tensor_spec *list = section == 1 ? f->block : f->final;
    for (int j = 0; j < i; j++)
        if (section == 2 || spec_in(&p->cfg, &list[j], layer)) at += spec_count(&p->cfg, &list[j]);
    return at;
}

/* Where a tensor's values are in a seed's stream: llm.c's order (tensor by tensor, a block tensor's layers
 * together), counting only what is drawn, so that a seed gives GPT-2 the weights dt_gpt2 gives it, whatever
 * part of the model a rank holds. */
static uint64_t draw_offset(const dt_program *p, int section, int i, int layer) {
    const dt_family *f = p->f;
    uint64_t at = 0, L = (uint64_t)p->cfg.num_layers;
    for (int j = 0; j < (section == 0 ? i : f->nembed); j++) at += f->embed[j].init == INIT_NORMAL ? spec_count(&p->cfg, &f->embed[j]) : 0;
    if (section == 0) return at;
    for (int j = 0; j < (section == 1 ? i : f->nblock); j++)
        at += f->block[j].init == INIT_NORMAL ? (uint64_t)layers_with(&p->cfg, &f->block[j], (int)L) * spec_count(&p->cfg, &f->block[j]) : 0;
    if (section == 1) return at + (uint64_t)layers_with(&p->cfg, &f->block[i], layer) * spec_count(&p->cfg, &f->block[i]);
    for (int j = 0; j < i; j++) at += f->final[j].init == INIT_NORMAL ? spec_count(&p->cfg, &f->final[j]) : 0;
    return at;
}

static void add_tensor(dt_program *p, int section, int i, int layer, int unit) {
    const dt_family *f = p->f;
    const dt_tensor_spec *s = section == 0 ? &f->embed[i] : section == 1 ? &f->block[i] : &f->final[i];
    p->spec[p->ntab] = s;
    p->draw[p->ntab] = draw_offset(p, section, i, layer);
    dt_tensor_info *t = &p->tab[p->ntab++];
    memset(t, 0, sizeof *t);
    if (layer >= 0) snprintf(t->name, sizeof t->name, "h.%d.%s", layer, s->name);
    else snprintf(t->name, sizeof t->name, "%s", s->name);
    snprintf(t->hf, sizeof t->hf, s->hf, layer); /* a name without "%d" ignores the layer */
    if (s->gguf) snprintf(t->gguf, sizeof t->gguf, s->gguf, layer);
    t->layer = layer >= 0 ? layer : 0;
    t->unit = t->grad_unit = unit;
    t->shape[0] = width_of(&p->cfg, s->rows);
    t->shape[1] = width_of(&p->cfg, s->cols);
    t->ndim = t->shape[1] ? 2 : 1;
    if (s->stack) { /* [experts, rows, cols] */
        t->shape[2] = t->shape[1], t->shape[1] = t->shape[0], t->shape[0] = width_of(&p->cfg, s->stack);
        t->ndim = 3, t->stacked = 1;
    }
    t->count = spec_count(&p->cfg, s);
    t->offset = p->nparams;
    t->split = s->split;
    t->f32_read = s->f32_read;
    t->llmc_index = -1;
    t->hf_transposed = s->hf_t;
    dt_tensor_set_whole(t);
    t->goffset = global_offset(p, section, i, layer);
    if (p->part.tp_size > 1) slice(p, s, t);
    if (p->part.ep_size > 1) expert_slice(p, s, t);
    t->count = 1;
    for (int d = 0; d < t->ndim; d++) t->count *= (size_t)t->shape[d];
    p->nparams += t->count;
}

/* The held range of unit u (-1: not held). */
int dt_program_range_of(const dt_program *p, int u) {
    for (int r = 0; r < p->nr; r++)
        if (u >= p->ra[r] && u < p->rb[r]) return r;
    return -1;
}

/* The table in store order: unit 0's tensors, the held blocks', unit L+1's (and a tied head's copy of the token
 * table where unit 0 is not held). */
static dt_status layout(dt_program *p) {
    const dt_family *f = p->f;
    int L = p->cfg.num_layers, nfinal = nfinal_of(p);
    size_t n = (size_t)(f->nembed + L * f->nblock + f->nfinal + 1);
    p->tab = calloc(n, sizeof *p->tab);
    p->spec = calloc(n, sizeof *p->spec);
    p->draw = calloc(n, sizeof *p->draw);
    p->block_tab = malloc(sizeof *p->block_tab * (size_t)L * (size_t)f->nblock);
    p->bk = malloc(sizeof *p->bk * (size_t)L);
    p->moe_layer = malloc(sizeof *p->moe_layer * (size_t)L);
    if (!p->tab || !p->spec || !p->draw || !p->block_tab || !p->bk || !p->moe_layer)
        return dt_error(DT_ERR_NOMEM, "model: out of memory for the table");
    for (int l = 0; l < L; l++) p->moe_layer[l] = dt_lm_layer_moe(&p->cfg, l);
    p->i_wte = p->i_wpe = p->i_lnf = p->i_head = -1;
    if (p->ua == 0) {
        for (int i = 0; i < f->nembed; i++) add_tensor(p, 0, i, -1, 0);
        p->i_wte = 0;
        p->i_wpe = f->rotary ? -1 : 1;
        p->tab[0].input_rows = 1; /* the token table's gradient: only the rows of the batch's tokens */
    }
    for (int l = 0; l < L; l++) p->bk[l] = -1;
    p->nl = 0;
    for (int r = 0; r < p->nr; r++)
        for (int l = p->ra[r] > 0 ? p->ra[r] - 1 : 0; l < L && l + 1 < p->rb[r]; l++) {
            p->bk[l] = p->nl;
            for (int i = 0; i < f->nblock; i++) {
                bool in = spec_in(&p->cfg, &f->block[i], l);
                p->block_tab[p->nl * f->nblock + i] = in ? p->ntab : -1;
                if (in) add_tensor(p, 1, i, l, l + 1);
            }
            p->nl++;
        }
    if (p->ub == L + 2) {
        p->i_lnf = p->ntab;
        for (int i = 0; i < nfinal; i++) add_tensor(p, 2, i, -1, L + 1);
        p->i_head = !p->cfg.untied ? p->i_wte : p->ntab - 1;
        /* a tied table held with the head: whole once the head is through, but for the input rows (deferrable) */
        if (!p->cfg.untied && p->i_wte >= 0 && p->part.tp_size == 1) p->tab[p->i_wte].grad_unit = L + 1;
        if (!p->cfg.untied && p->ua > 0) { /* the last stage's copy of the tied token table (the first stage owns it) */
            add_tensor(p, 0, 0, -1, L + 1);
            p->i_head = p->ntab - 1;
            p->tab[p->i_head].tied_copy = 1;
        }
    }
    for (int i = 0; i < f->nembed; i++) p->global_params += spec_count(&p->cfg, &f->embed[i]);
    for (int i = 0; i < f->nblock; i++) p->global_params += (size_t)layers_with(&p->cfg, &f->block[i], L) * spec_count(&p->cfg, &f->block[i]);
    for (int i = 0; i < nfinal; i++) p->global_params += spec_count(&p->cfg, &f->final[i]);
    return DT_OK;
}

/* The gradients of a block's values share buffers where their lives do not meet. In backward (ops in reverse) d(v)
 * lives from the backward of v's last reader (born) down to that of its producer (dies); values are given, in the
 * order they are born, the first buffer whose last value died before, sized to the widest. A family with dense and
 * mixture layers: a value is born, in each kind of layer, at its last reader there; buffers are shared by the lives
 * of both kinds together (born at the later reader of either, dying at the first producer). */
static dt_status share_grads(dt_program *p) {
    const dt_family *f = p->f;
    int nv = f->nvalues, *dies = calloc((size_t)nv, sizeof *dies), *free_at = calloc((size_t)nv, sizeof *free_at);
    int *born = calloc((size_t)nv, sizeof *born);
    p->vborn = calloc(2 * (size_t)nv, sizeof *p->vborn);
    p->vbuf = calloc((size_t)nv, sizeof *p->vbuf);
    if (!dies || !free_at || !born || !p->vborn || !p->vbuf) {
        free(dies), free(free_at), free(born);
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    }
    for (int v = 0; v < nv; v++) p->vborn[v] = p->vborn[nv + v] = born[v] = dies[v] = -1, p->vbuf[v] = -1;
    for (int k = 0; k < f->nops; k++) {
        const dt_op_spec *o = &f->ops[k];
        if (dies[o->out] < 0) dies[o->out] = k;
        for (int moe = 0; moe < 2; moe++) {
            if (!dt_layers_hold(o->layers, moe)) continue;
            p->vborn[moe * nv + o->in] = k;
            if (o->in2 >= 0) p->vborn[moe * nv + o->in2] = k;
        }
        born[o->in] = k;
        if (o->in2 >= 0) born[o->in2] = k;
    }
    p->nvbuf = 0;
    for (int k = f->nops - 1; k >= 0; k--) /* backward's order: a value is born at its last reader's op */
        for (int v = 2; v < nv; v++) {
            if (born[v] != k || p->vbuf[v] >= 0) continue;
            int b = 0;
            while (b < p->nvbuf && !(free_at[b] > k)) b++; /* free_at: where its last value died (a higher op) */
            if (b == p->nvbuf) p->nvbuf++;
            p->vbuf[v] = b;
            free_at[b] = dies[v];
        }
    free(dies);
    free(free_at);
    free(born);
    return DT_OK;
}

void dt_program_mark_kept(dt_program *p) {
    const dt_family *f = p->f;
    /* what a block's backward reads: a norm's, a Linear's, an activation's input, attention's output and its input
     * (unless attention makes its own q|k|v of all heads, which is kept instead); a frozen Linear (LoRA's base) reads
     * its input only for its adapters (as autograd keeps no input for a weight that takes no gradient) */
    for (int v = 0; v < f->nvalues; v++) p->vkeep[v] = false;
    for (int k = 0; k < f->nops; k++) {
        const dt_op_spec *o = &f->ops[k];
        bool frozen = o->kind == DT_OP_LINEAR && p->lora && !dt_program_lora_adapts(p, k);
        if (o->kind == DT_OP_ATTENTION) p->vkeep[o->out] = true;
        if (o->kind != DT_OP_ADD && !(o->kind == DT_OP_ATTENTION && p->repack) && !frozen) p->vkeep[o->in] = true;
    }
}

/* An add's inputs whose gradients nothing later in forward (earlier in backward) reads: the add writes them first. */
static void mark_copied(dt_program *p) {
    const dt_family *f = p->f;
    for (int k = 0; k < f->nops; k++) {
        const dt_op_spec *o = &f->ops[k];
        if (o->kind != DT_OP_ADD) continue;
        for (int side = 0; side < 2; side++) {
            int v = side ? o->in2 : o->in;
            bool later = false;
            for (int j = k + 1; j < f->nops; j++) later = later || f->ops[j].in == v || f->ops[j].in2 == v;
            p->vcopy[v] = !later && v != DT_V_OUT && o->in != o->in2;
        }
    }
}

/* The first held layer op k runs in (-1: none). */
static int held_layer_of(const dt_program *p, int k) {
    for (int l = 0; l < p->cfg.num_layers; l++)
        if (p->bk[l] >= 0 && op_runs(p, l, k)) return l;
    return -1;
}

/* Linear op k's parts (and biases) side by side in the store, one matmul for them all, and its shape the values'. */
static dt_status check_linear(const dt_program *p, const dt_program_op *o, int l) {
    const dt_family *f = p->f;
    const dt_tensor_info *t = p->tab;
    int rows = 0, w = tensor_at(p, l, o->s.w), b = o->s.b >= 0 ? tensor_at(p, l, o->s.b) : -1;
    for (int j = 0; j < o->s.nw; j++) {
        rows += t[w + j].shape[0];
        if (j && t[w + j].offset != t[w + j - 1].offset + t[w + j - 1].count)
            return dt_error(DT_ERR_ARG, "model %s: the parts of Linear %s are not side by side", f->name, t[w].name);
        if (j && b >= 0 && t[b + j].offset != t[b + j - 1].offset + t[b + j - 1].count)
            return dt_error(DT_ERR_ARG, "model %s: the biases of Linear %s are not side by side", f->name, t[w].name);
    }
    int readers = 0; /* of the ops that run beside it */
    for (int j = 0; j < f->nops; j++)
        if (f->ops[j].layers == DT_LAYERS_ALL || o->s.layers == DT_LAYERS_ALL || f->ops[j].layers == o->s.layers)
            readers += f->ops[j].in == o->s.in || f->ops[j].in2 == o->s.in;
    /* its backward sums d(input) over the group in place: nothing else may have added to it */
    if (t[w].split == DT_SPLIT_COLUMN && (readers != 1 || o->s.in < 2))
        return dt_error(DT_ERR_ARG, "model %s: column-parallel Linear %s must be the only reader of its input", f->name, t[w].name);
    if (rows != o->width_out || t[w].shape[1] != o->width_in)
        return dt_error(DT_ERR_ARG, "model %s: Linear %s is [%d, %d] between values of %d and %d", f->name, t[w].name, rows,
                        t[w].shape[1], o->width_in, o->width_out);
    return DT_OK;
}

/* The block's ops with their widths; which values a backward reads, which gradients an add writes first, which share
 * a buffer, which are the residual stream's rows. */
static dt_status shape_ops(dt_program *p) {
    const dt_family *f = p->f;
    if (f->nvalues > DT_BLOCK_MAX || f->nops > DT_BLOCK_MAX)
        return dt_error(DT_ERR_ARG, "model %s: %d values and %d ops a block (at most %d each)", f->name, f->nvalues, f->nops, DT_BLOCK_MAX);
    p->ops = calloc((size_t)f->nops, sizeof *p->ops);
    p->vw = calloc((size_t)f->nvalues, sizeof *p->vw);
    p->vsplit = calloc((size_t)f->nvalues, sizeof *p->vsplit);
    p->vkeep = calloc((size_t)f->nvalues, sizeof *p->vkeep);
    p->vused = calloc(2 * (size_t)f->nvalues, sizeof *p->vused);
    p->vcopy = calloc((size_t)f->nvalues, sizeof *p->vcopy);
    if (!p->ops || !p->vw || !p->vsplit || !p->vkeep || !p->vused || !p->vcopy) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    for (int moe = 0; moe < 2; moe++) {
        bool *used = p->vused + moe * f->nvalues;
        used[DT_V_IN] = used[DT_V_OUT] = true;
        for (int k = 0; k < f->nops; k++) {
            const dt_op_spec *o = &f->ops[k];
            if (!dt_layers_hold(o->layers, moe)) continue;
            used[o->in] = used[o->out] = true;
            if (o->in2 >= 0) used[o->in2] = true;
        }
    }
    for (int v = 0; v < f->nvalues; v++) p->vw[v] = local_width(p, f->values[v]);
    p->repack = f->rotary || p->cfg.kv_heads != p->cfg.num_heads;
    dt_program_mark_kept(p);
    mark_copied(p);
    dt_status st = share_grads(p);
    if (st) return st;
    /* the residual stream's rows: the stream itself, what a norm or an add writes, a row-parallel Linear's output, a
     * mixture's (each rank keeps its rows of it) */
    p->vsplit[DT_V_IN] = p->vsplit[DT_V_OUT] = true;
    for (int k = 0; k < f->nops; k++) {
        const dt_op_spec *o = &f->ops[k];
        if (o->kind == DT_OP_NORM || o->kind == DT_OP_ADD || o->kind == DT_OP_MOE || (o->kind == DT_OP_LINEAR && f->block[o->w].split == DT_SPLIT_ROW))
            p->vsplit[o->out] = true;
    }
    for (int k = 0; k < f->nops; k++) {
        dt_program_op *o = &p->ops[k];
        o->s = f->ops[k];
        o->width_in = p->vw[o->s.in];
        o->width_out = p->vw[o->s.out];
        int l = held_layer_of(p, k);
        if (o->s.kind == DT_OP_LINEAR && l >= 0 && (st = check_linear(p, o, l))) return st;
    }
    return DT_OK;
}

/* What a rank can hold: units [ua, ub) or chunks of them, split by tensor parallelism (with sequence parallelism or
 * not) or not, and context parallelism. */
static dt_status check_part(const dt_lm_config *c, const dt_model_part *part) {
    int t = part->tp_size, L = c->num_layers, a = part->ua, b = part->ub;
    int n = part->cp_size ? part->cp_size : 1;
    if (n < 1 || part->cp_rank < 0 || part->cp_rank >= n) return dt_error(DT_ERR_ARG, "model: context-parallel rank %d of %d", part->cp_rank, n);
    if (n > 1 && !part->cp) return dt_error(DT_ERR_ARG, "model: a context-parallel part needs its attention (dt_cp_ops)");
    if (part->nchunks < 0 || part->nchunks > DT_GPT2_MAX_CHUNKS)
        return dt_error(DT_ERR_ARG, "model: %d chunks (at most %d)", part->nchunks, DT_GPT2_MAX_CHUNKS);
    for (int r = 0; r < part->nchunks; r++)
        if (part->chunk_a[r] < (r ? part->chunk_b[r - 1] + 1 : 0) || part->chunk_b[r] > L + 2 || part->chunk_a[r] >= part->chunk_b[r])
            return dt_error(DT_ERR_ARG, "model: chunk %d, units [%d, %d), is not a range of 0..%d after the last one and apart from it", r,
                            part->chunk_a[r], part->chunk_b[r], L + 1);
    if (part->nchunks) a = part->chunk_a[0], b = part->chunk_b[part->nchunks - 1];
    if (a < 0 || b > L + 2 || a >= b) return dt_error(DT_ERR_ARG, "model: units [%d, %d) are not a range of 0..%d", a, b, L + 1);
    if (t < 1 || part->tp_rank < 0 || part->tp_rank >= t) return dt_error(DT_ERR_ARG, "model: tensor-parallel rank %d of %d", part->tp_rank, t);
    if (t > 1 && !part->tp) return dt_error(DT_ERR_ARG, "model: a tensor-parallel part needs its collectives (dt_tp_ops)");
    /* under TP a mixture runs whole on every rank of the group (its input is the whole stream there, or gathered under
     * SP; its gradients the same on each), but for its shared expert, split as a dense MLP (program_moe.c) */
    if (c->num_heads % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the %d attention heads", t, c->num_heads);
    if (c->kv_heads % t && t % c->kv_heads)
        return dt_error(DT_ERR_ARG, "model: --tp %d and the %d K/V heads: one must divide the other", t, c->kv_heads);
    if (c->ffn % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the MLP's %d hidden units", t, c->ffn);
    if (c->dense_ffn % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the dense layers' %d hidden units", t, c->dense_ffn);
    if (c->shared_ffn % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the shared expert's %d hidden units", t, c->shared_ffn);
    int e = part->ep_size ? part->ep_size : 1;
    if (e < 1 || part->ep_rank < 0 || part->ep_rank >= e) return dt_error(DT_ERR_ARG, "model: expert-parallel rank %d of %d", part->ep_rank, e);
    if (e > 1 && !c->experts) return dt_error(DT_ERR_ARG, "model: --ep %d spreads a mixture's experts: this model has none (--experts E)", e);
    if (e > 1 && c->experts % e) return dt_error(DT_ERR_ARG, "model: --ep %d does not divide the %d experts", e, c->experts);
    if (e > 1 && !part->ep) return dt_error(DT_ERR_ARG, "model: an expert-parallel part needs its exchanges (dt_ep_ops)");
    if (t > c->padded_vocab_size) return dt_error(DT_ERR_ARG, "model: --tp %d is more than the %d vocabulary rows", t, c->padded_vocab_size);
    return DT_OK;
}

/* The part's widths (struct dt_program's NHl .. Vv). */
static void part_widths(dt_program *p) {
    const dt_lm_config *c = &p->cfg;
    int t = p->part.tp_size, r = p->part.tp_rank, rows = (c->padded_vocab_size + t - 1) / t, hd = c->head_dim;
    p->NHl = c->num_heads / t;
    p->Ql = p->NHl * hd;
    /* K/V heads: each rank its share, or, fewer than the ranks, the one its query heads read (kept by several ranks) */
    int kvl = c->kv_heads >= t ? c->kv_heads / t : 1;
    p->kv0 = c->kv_heads >= t ? r * kvl : r * p->NHl / (c->num_heads / c->kv_heads);
    p->KVl = kvl * hd;
    p->Fl = c->ffn / t;
    p->Dl = c->dense_ffn / t;
    p->Sl = c->shared_ffn / t;
    p->v0 = r * rows < c->padded_vocab_size ? r * rows : c->padded_vocab_size;
    p->Vl = c->padded_vocab_size - p->v0 < rows ? c->padded_vocab_size - p->v0 : rows;
    int real = c->vocab_size - p->v0;
    p->Vv = real < 0 ? 0 : real < p->Vl ? real : p->Vl;
}

dt_status dt_program_create(const dt_lm_config *cfg, dt_program **out) {
    dt_model_part whole = { .ua = 0, .ub = cfg->num_layers + 2, .tp_size = 1 };
    return dt_program_create_part(cfg, &whole, out);
}

static dt_status allocate(dt_program *p) {
    const dt_lm_config *c = &p->cfg;
    if (!(p->kv_of = malloc(sizeof(int) * (size_t)(p->NHl > 0 ? p->NHl : 1)))) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    for (int h = 0; h < p->NHl; h++) p->kv_of[h] = dt_program_kv_head(p, h);
    if (p->f->rotary) {
        if (!(p->inv_freq = malloc(sizeof(float) * (size_t)(c->head_dim / 2)))) return dt_error(DT_ERR_NOMEM, "model: out of memory");
        dt_rope_config r = { .theta = c->rope_theta, .factor = c->rope_factor, .low_freq_factor = c->rope_low_freq_factor,
                             .high_freq_factor = c->rope_high_freq_factor, .original_max = c->rope_original_max };
        dt_rope_frequencies(p->inv_freq, c->head_dim, &r);
    }
    p->slots = p->s = calloc(1, sizeof *p->slots);
    p->nslots = 1;
    if (c->experts && !(p->moe_load = calloc((size_t)(p->nl > 0 ? p->nl : 1) * (size_t)c->experts, sizeof(double))))
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    if (c->router == DT_ROUTER_SIGMOID_BIAS && !(p->moe_bias = calloc((size_t)c->num_layers * (size_t)c->experts, sizeof(float))))
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    if (c->kv_heads < p->part.tp_size) { /* K/V heads kept by several ranks: a K/V Linear's rows set aside and summed */
        size_t kv = (size_t)p->KVl * ((size_t)c->channels + 1);
        p->kv_keep = malloc(2 * kv * sizeof(float));
        p->kv_sum = malloc(kv * (size_t)c->kv_heads * sizeof(float));
        if (!p->kv_keep || !p->kv_sum) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    }
    p->params = p->own_params = dt_alloc_aligned(p->nparams * sizeof(float));
    if (p->params) memset(p->params, 0, p->nparams * sizeof(float));
    p->grads = p->own_grads = dt_alloc_zeroed(p->nparams * sizeof(float));
    if (!p->params || !p->grads || !p->slots) {
        char sz[32];
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of parameters and gradients", dt_format_size(2 * p->nparams * sizeof(float), sz, sizeof sz));
    }
    return DT_OK;
}

/* A program's shape (its table, its ops' widths) without its stores: what creation and the memory estimates share. */
static dt_status shape_part(const dt_lm_config *given, const dt_model_part *part, dt_program **out) {
    *out = NULL;
    dt_lm_config c = dt_lm_config_resolve(given), *cfg = &c;
    dt_status st = dt_lm_config_check(cfg, "model");
    if (!st) st = check_part(cfg, part);
    if (st) return st;
    dt_program *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    p->cfg = *cfg;
    p->f = cfg->family;
    p->part = *part;
    p->nr = part->nchunks ? part->nchunks : 1;
    for (int r = 0; r < p->nr; r++) {
        p->ra[r] = part->nchunks ? part->chunk_a[r] : part->ua;
        p->rb[r] = part->nchunks ? part->chunk_b[r] : part->ub;
    }
    p->ua = p->ra[0];
    p->ub = p->rb[p->nr - 1];
    part_widths(p);
    if (!(st = layout(p))) st = shape_ops(p);
    if (st) {
        dt_program_destroy(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

dt_status dt_program_create_table(const dt_lm_config *cfg, const dt_model_part *part, dt_program **out) {
    dt_model_part whole = { .ua = 0, .ub = 0, .tp_size = 1 };
    whole.ub = cfg->num_layers + 2;
    return shape_part(cfg, part ? part : &whole, out);
}

dt_status dt_program_create_part(const dt_lm_config *cfg, const dt_model_part *part, dt_program **out) {
    dt_status st = shape_part(cfg, part, out);
    if (!st && (st = allocate(*out))) {
        dt_program_destroy(*out);
        *out = NULL;
    }
    return st;
}

size_t dt_program_activation_split_bytes(const dt_lm_config *cfg, const dt_model_part *part, int B, int T, int recompute, dt_attn_mode attn,
                                         dt_dtype prec, int split, size_t *area) {
    dt_program *p;
    if (area) memset(area, 0, DT_GPT2_MAX_CHUNKS * sizeof *area);
    if (shape_part(cfg, part, &p)) return 0;
    p->recompute = recompute != 0;
    p->split_bwd = split != 0;
    p->attn = attn;
    p->prec = prec;
    size_t n = area ? dt_program_slot_split_bytes(p, B, T, area) : dt_program_slot_bytes(p, B, T, NULL);
    dt_program_destroy(p);
    return n;
}

size_t dt_program_activation_bytes(const dt_lm_config *cfg, const dt_model_part *part, int B, int T, int recompute, dt_attn_mode attn,
                                   dt_dtype prec, int split) {
    return dt_program_activation_split_bytes(cfg, part, B, T, recompute, attn, prec, split, NULL);
}

/* The whole model's parameters from the spec alone (no table: a hostile file's shape costs nothing to count). */
static size_t whole_params(const dt_lm_config *c) {
    const dt_family *f = c->family;
    size_t n = 0, block = 0;
    for (int i = 0; i < f->nembed; i++) n += spec_count(c, &f->embed[i]);
    for (int i = 0; i < f->nblock; i++) block += (size_t)layers_with(c, &f->block[i], c->num_layers) * spec_count(c, &f->block[i]);
    for (int i = 0; i < f->nfinal; i++)
        if (!(i == f->nfinal - 1 && !c->untied && f->final[i].rows == W_VOCAB)) n += spec_count(c, &f->final[i]);
    return n + block;
}

dt_status dt_program_shape_params(const dt_lm_config *cfg, const dt_model_part *part, size_t *local, size_t *global) {
    dt_lm_config c = dt_lm_config_resolve(cfg);
    dt_status st = dt_lm_config_check(&c, "model");
    if (st) return st;
    *global = whole_params(&c);
    bool whole = part->ua == 0 && part->ub == c.num_layers + 2 && !part->nchunks && part->tp_size <= 1 && part->ep_size <= 1;
    if (whole) {
        *local = *global;
        return DT_OK;
    }
    dt_program *p;
    if ((st = shape_part(&c, part, &p))) return st;
    *local = p->nparams;
    dt_program_destroy(p);
    return DT_OK;
}

/* 6 N + 12 L T Q: N the parameters that take part in matmuls (all but the embedding's lookup tables; a tied token
 * table is the head and counts), 12 L T Q attention's QK^T and AV over the full T x T (PaLM, appendix B). */
double dt_program_flops_per_token(const dt_lm_config *cfg, int T) {
    dt_lm_config c = dt_lm_config_resolve(cfg);
    if (dt_lm_config_check(&c, "model")) return 0;
    double n = (double)whole_params(&c);
    for (int i = 0; i < c.family->nembed; i++)
        if (i > 0 || c.untied) n -= (double)spec_count(&c, &c.family->embed[i]);
    for (int i = 0; i < c.family->nblock; i++) /* an expert's weights work for the tokens routed to it: K of E */
        if (c.family->block[i].stack)
            n -= (double)layers_with(&c, &c.family->block[i], c.num_layers) * spec_count(&c, &c.family->block[i]) *
                 (1.0 - (double)c.experts_top_k / c.experts);
    return 6 * n + 12.0 * c.num_layers * (double)T * c.num_heads * c.head_dim;
}

/* Block l's parameters in matmuls (the pipeline split's cost of a block: twice these FLOPs a token); l -1: the most
 * any block has. */
double dt_program_block_matmul_params(const dt_lm_config *cfg, int l) {
    dt_lm_config c = dt_lm_config_resolve(cfg);
    double most = 0;
    for (int at = l < 0 ? 0 : l; at < (l < 0 ? c.num_layers : l + 1); at++) {
        double n = 0;
        for (int i = 0; c.family && i < c.family->nblock; i++)
            if (c.family->block[i].cols != W_NONE && spec_in(&c, &c.family->block[i], at))
                n += (double)width_of(&c, c.family->block[i].rows) * width_of(&c, c.family->block[i].cols) *
                     (c.family->block[i].stack ? c.experts_top_k : 1); /* a token's experts */
        if (n > most) most = n;
    }
    return most;
}

int dt_program_linear_shapes(const dt_lm_config *cfg, const dt_model_part *part, int l, int (*shape)[2], int max) {
    dt_program *p;
    if (shape_part(cfg, part, &p)) return 0;
    int n = 0;
    for (int k = 0; k < p->f->nops; k++) /* (l -1: those some layer runs, a mixture's dense MLP where there are dense layers) */
        if (p->ops[k].s.kind == DT_OP_LINEAR && (l < 0 || (l < p->cfg.num_layers && op_runs(p, l, k))) && p->ops[k].width_out > 0 && n < max)
            shape[n][0] = p->ops[k].width_out, shape[n++][1] = p->ops[k].width_in;
    dt_program_destroy(p);
    return n;
}

size_t dt_program_lp_work_bytes(const dt_lm_config *cfg, const dt_model_part *part) {
    dt_program *p;
    if (shape_part(cfg, part, &p)) return 0;
    size_t n = (dt_program_lp_work_floats(p) + dt_program_moe_weight_floats(p)) * sizeof(float); /* (an MoE layer's weights widened) */
    dt_program_destroy(p);
    return n;
}

void dt_program_destroy(dt_program *p) {
    if (!p) return;
    dt_program_free_slots(p);
    free(p->slots);
    free(p->tab);
    free(p->spec);
    free(p->draw);
    free(p->block_tab);
    free(p->bk);
    free(p->moe_layer);
    free(p->ops);
    free(p->vw);
    free(p->vsplit);
    free(p->vkeep);
    free(p->vused);
    free(p->vcopy);
    free(p->vborn);
    free(p->vbuf);
    free(p->inv_freq);
    free(p->kv_of);
    free(p->kv_keep);
    free(p->kv_sum);
    free(p->moe_load);
    free(p->moe_bias);
    free(p->glob_run);
    dt_program_moe_ep_free_work(p);
    dt_free_aligned(p->params_lp);
    dt_free_aligned(p->lp_work);
    dt_free_aligned(p->moe_wide);
    free(p->lp_cast);
    free(p->lp_current);
    dt_free_aligned(p->own_params);
    dt_free_zeroed(p->own_grads);
    dt_program_lora_free(p->lora);
    free(p);
}

const dt_lm_config *dt_program_config(const dt_program *p) { return &p->cfg; }
void dt_program_zero_grad(dt_program *p) {
    memset(p->grads, 0, p->nparams * sizeof(float));
    if (p->lora) memset(p->lora->grads, 0, p->lora->nparams * sizeof(float));
}
size_t dt_program_num_params(const dt_program *p) { return p->nparams; }
float *dt_program_params(dt_program *p) { return p->params; }
float *dt_program_grads(dt_program *p) { return p->grads; }

void dt_program_init_random_range(dt_program *p, uint64_t seed, size_t lo, size_t hi) {
    float proj = 0.02f / sqrtf(2.0f * (float)p->cfg.num_layers);
    size_t C = (size_t)p->cfg.channels;
    for (int i = 0; i < p->ntab; i++) {
        const dt_tensor_info *t = &p->tab[i];
        if (t->offset >= hi || t->offset + t->count <= lo) continue;
        float *w = p->params + t->offset;
        int init = p->spec[i]->init;
        /* the Linears that write into the residual stream (row-parallel ones) start smaller, as GPT-2's (a shared expert's
         * down projection, split so under TP, as its mixture's routed ones) */
        float std = t->split == DT_SPLIT_ROW && p->spec[i]->layers != DT_LAYERS_MOE ? proj : 0.02f;
        /* a slice draws the whole tensor's values at its places: every layout starts from the same weights */
        bool sliced = dt_tensor_is_sliced(t);
        /* padded vocabulary rows (this rank's Vv .. Vl) stay zero */
        size_t j0 = lo > t->offset ? lo - t->offset : 0, j1 = hi - t->offset < t->count ? hi - t->offset : t->count;
        size_t real = t->split == DT_SPLIT_VOCAB ? (size_t)p->Vv * C : t->count;
        #pragma omp parallel for schedule(static)
        for (size_t j = j0; j < j1; j++)
            w[j] = j >= real || init == INIT_ZEROS ? 0.0f : init == INIT_ONES ? 1.0f
                 : std * dt_rng_normal_at(seed, p->draw[i] + (sliced ? dt_tensor_global_index(t, j) : j));
    }
}

void dt_program_init_random(dt_program *p, uint64_t seed) { dt_program_init_random_range(p, seed, 0, p->nparams); }


/* ---- the model as the engine sees it ---- */

void dt_program_set_grad_hook(dt_program *p, dt_unit_hook hook, void *ctx) {
    if (dt_hook_list_set(&p->grad_hooks, hook, NULL, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
}

void dt_program_set_unit_hooks(dt_program *p, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    if (dt_hook_list_set(&p->unit_hooks, before_forward, before_backward, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    p->lp_held_max = 0; /* the 16-bit copy is made unit by unit from now (or whole again) */
}

void dt_program_set_grad_storage(dt_program *p, float *to) {
    p->grads = dt_model_grad_storage(p->own_grads, p->grads, to, p->nparams);
    /* the model's own gradients, unused while elsewhere: their memory goes back */
    if (p->grads != p->own_grads) dt_mem_release(p->own_grads, p->nparams * sizeof(float));
}

void dt_program_set_param_storage(dt_program *p, float *to) {
    p->params = dt_model_param_storage(p->own_params, p->params, to, p->nparams);
    if (p->lp_current) memset(p->lp_current, 0, (size_t)p->ntab); /* the 16-bit copy is made again */
}


const dt_tensor_info *dt_program_tensors(const dt_program *p, int *n) {
    if (n) *n = p->ntab;
    return p->tab;
}

static float *params_of(void *self) { return ((dt_program *)self)->params; }
static float *grads_of(void *self) { return ((dt_program *)self)->grads; }
static void set_grad_hook(void *self, dt_unit_hook hook, void *ctx) { dt_program_set_grad_hook(self, hook, ctx); }
static void set_unit_hooks(void *self, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    dt_program_set_unit_hooks(self, before_forward, before_backward, ctx);
}
static void set_grad_storage(void *self, float *to) { dt_program_set_grad_storage(self, to); }
static void set_param_storage(void *self, float *to) { dt_program_set_param_storage(self, to); }
static uint16_t *lp_copy(void *self, int caller_keeps, dt_dtype *t) { return dt_program_lp_copy(self, caller_keeps, t); }
static void params_changed(void *self) { dt_program_params_changed(self); }
static void defer_rows(void *self, int on) { dt_program_set_defer_rows(self, on); }
static const float *input_grad(const void *self, const int32_t **tokens, int *n) { return dt_program_input_grad(self, tokens, n); }

static dt_status linears_of(void *p, dt_linear_layer **out, int *n) { return dt_program_linears(p, out, n); }
static void observer_of(void *p, dt_linear_observer fn, void *ctx) { dt_program_set_linear_observer(p, fn, ctx); }

void dt_program_model(dt_program *p, dt_model *out) {
    if (p->lora) { /* the adapters are what trains */
        dt_program_lora_model(p, out);
        return;
    }
    dt_program_base_model(p, out);
}

void dt_program_base_model(dt_program *p, dt_model *out) {    /* deferring the token table's rows: a whole table (not a vocabulary slice) with its input rows here */
    bool rows = p->i_wte >= 0 && p->tab[p->i_wte].input_rows && p->part.tp_size == 1;
    *out = (dt_model){ .self = p, .kind = p->f->name, .tensors = p->tab, .ntensors = p->ntab, .nunits = p->cfg.num_layers + 2,
                       .nparams = p->nparams, .global_params = p->global_params, .params = params_of, .grads = grads_of,
                       .set_grad_storage = set_grad_storage, .set_grad_hook = set_grad_hook, .set_unit_hooks = set_unit_hooks,
                       .set_param_storage = set_param_storage, .defer_input_rows = rows ? defer_rows : NULL, .input_grad = input_grad,
                       .lp_copy = lp_copy, .params_changed = params_changed, .part = &p->part, .linears = linears_of,
                       .set_linear_observer = observer_of };
}

int dt_program_kv_head(const dt_program *p, int h) { return (p->part.tp_rank * p->NHl + h) / (p->cfg.num_heads / p->cfg.kv_heads) - p->kv0; }

const dt_tensor_info *dt_program_block_tensor(const dt_program *p, int l, int k) {
    if (l < 0 || l >= p->cfg.num_layers || p->bk[l] < 0 || k < 0 || k >= p->f->nblock || tensor_at(p, l, k) < 0) return NULL;
    return &p->tab[tensor_at(p, l, k)];
}

dt_status dt_program_linears(const dt_program *p, dt_linear_layer **out, int *n) {
    int L = p->cfg.num_layers, nb = p->f->nops;
    *n = 0;
    if (!(*out = calloc((size_t)L * nb + 1, sizeof **out))) return dt_error(DT_ERR_NOMEM, "the Linears' list: out of memory");
    for (int l = 0; l < L; l++)
        for (int i = 0; i < nb; i++) {
            const dt_program_op *o = &p->ops[i];
            const dt_op_spec *s = &o->s;
            if (s->kind != DT_OP_LINEAR || !dt_program_block_tensor(p, l, s->w)) continue; /* another stage's layer (or kind) */
            if (s->nw > DT_LINEAR_PARTS) return dt_error(DT_ERR_ARG, "a Linear of %d parts (at most %d)", s->nw, DT_LINEAR_PARTS);
            dt_linear_layer *y = &(*out)[(*n)++];
            *y = (dt_linear_layer){ .layer = l, .op = i, .in = o->width_in, .nparts = s->nw };
            int col = 0;
            for (int j = 0; j < s->nw; j++) {
                y->w[j] = dt_program_block_tensor(p, l, s->w + j);
                y->b[j] = s->b >= 0 ? dt_program_block_tensor(p, l, s->b + j) : NULL;
                if (y->w[j]->ndim != 2 || y->w[j]->shape[1] != o->width_in || (s->b >= 0 && !y->b[j]))
                    return dt_error(DT_ERR_ARG, "layer %d's Linear %d (%s) is not held whole on this rank", l, i, y->w[0]->name);
                col += y->w[j]->shape[0];
            }
            if (col != o->width_out) return dt_error(DT_ERR_ARG, "%s's parts make %d outputs of %d", y->w[0]->name, col, o->width_out);
        }
    return DT_OK;
}

static const dt_tensor_info *entry(const dt_program *p, int i) { return i >= 0 ? &p->tab[i] : NULL; }

void dt_program_get_view(const dt_program *p, dt_program_view *out) {
    int hd = p->cfg.head_dim;
    *out = (dt_program_view){ .ops = p->ops, .nops = p->f->nops, .value_width = p->vw, .nvalues = p->f->nvalues, .rms = p->f->rms,
                              .rotary = p->f->rotary, .inv_freq = p->inv_freq, .heads = p->NHl, .kv_heads = p->KVl / hd, .head_dim = hd,
                              .embed = entry(p, p->i_wte), .positions = entry(p, p->i_wpe), .norm_w = entry(p, p->i_lnf),
                              .norm_b = p->f->rms || p->i_lnf < 0 ? NULL : entry(p, p->i_lnf + 1),
                              .head = p->cfg.untied ? entry(p, p->i_head) : NULL, .moe_layer = p->moe_layer };
}
