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
    }
    return 0;
}

/* This rank's width: w split as tensor parallelism splits it (the whole on one rank). */
static int local_width(const dt_program *p, dt_width w) {
    switch (w) {
    case W_Q: return p->Ql;
    case W_KV: return p->KVl;
    case W_QKV: return p->Ql + 2 * p->KVl;
    case W_FFN: return p->Fl;
    case W_FFN2: return 2 * p->Fl;
    case W_VOCAB: return p->Vl;
    default: return width_of(&p->cfg, w);
    }
}

const dt_family *dt_family_find(const char *name) {
    static const dt_family *all[] = { &dt_family_gpt2, &dt_family_llama, &dt_family_qwen2 };
    for (size_t i = 0; name && i < sizeof all / sizeof *all; i++)
        if (!strcmp(name, all[i]->name)) return all[i];
    return NULL;
}

const char *dt_family_name(const dt_family *f) { return f ? f->name : "(none)"; }

dt_status dt_lm_config_check(const dt_lm_config *c, const char *where) {
    if (!c->family) return dt_error(DT_ERR_ARG, "%s: no model family", where);
    if (c->vocab_size < 1 || c->max_seq_len < 1 || c->num_layers < 1 || c->num_heads < 1 || c->kv_heads < 1 || c->head_dim < 1 ||
        c->channels < 1 || c->ffn < 1)
        return dt_error(DT_ERR_ARG, "%s: sizes must be positive (V %d, T %d, L %d, heads %d, K/V heads %d, head %d, C %d, MLP %d)", where,
                        c->vocab_size, c->max_seq_len, c->num_layers, c->num_heads, c->kv_heads, c->head_dim, c->channels, c->ffn);
    if (c->num_heads % c->kv_heads)
        return dt_error(DT_ERR_ARG, "%s: %d K/V heads do not divide the %d attention heads", where, c->kv_heads, c->num_heads);
    if (c->padded_vocab_size < c->vocab_size)
        return dt_error(DT_ERR_ARG, "%s: padded vocabulary %d is smaller than the vocabulary %d", where, c->padded_vocab_size, c->vocab_size);
    if (c->family->rotary && (c->head_dim % 2 || c->head_dim > 512 || !(c->rope.theta > 1)))
        return dt_error(DT_ERR_ARG, "%s: rotary positions need an even head of at most 512 channels (%d) and a base above 1 (%g)", where,
                        c->head_dim, (double)c->rope.theta);
    if (!c->family->rotary && c->num_heads * c->head_dim != c->channels)
        return dt_error(DT_ERR_ARG, "%s: %d heads of %d channels are not the %d channels", where, c->num_heads, c->head_dim, c->channels);
    if (!(c->norm_eps > 0)) return dt_error(DT_ERR_ARG, "%s: the norms' epsilon %g must be positive", where, (double)c->norm_eps);
    if ((double)c->padded_vocab_size * c->channels > 1e10 || (double)c->num_layers * c->channels * (c->channels + 3.0 * c->ffn) > 1e11)
        return dt_error(DT_ERR_ARG, "%s: model too large (over 10^11 parameters)", where);
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
    case DT_SPLIT_NONE: break;
    }
}

static void add_tensor(dt_program *p, const dt_tensor_spec *s, int layer, int unit) {
    p->spec[p->ntab] = s;
    dt_tensor_info *t = &p->tab[p->ntab++];
    memset(t, 0, sizeof *t);
    if (layer >= 0) snprintf(t->name, sizeof t->name, "h.%d.%s", layer, s->name);
    else snprintf(t->name, sizeof t->name, "%s", s->name);
    snprintf(t->hf, sizeof t->hf, s->hf, layer); /* a name without "%d" ignores the layer */
    t->layer = layer >= 0 ? layer : 0;
    t->unit = t->grad_unit = unit;
    t->shape[0] = width_of(&p->cfg, s->rows);
    t->shape[1] = width_of(&p->cfg, s->cols);
    t->ndim = t->shape[1] ? 2 : 1;
    t->count = (size_t)t->shape[0] * (size_t)(t->shape[1] ? t->shape[1] : 1);
    t->offset = p->nparams;
    t->split = s->split;
    t->f32_read = s->f32_read;
    t->llmc_index = -1;
    t->hf_transposed = s->hf_t;
    dt_tensor_set_whole(t);
    t->goffset = p->global_params;
    p->global_params += t->count;
    if (p->part.tp_size > 1) {
        slice(p, s, t);
        t->count = (size_t)t->shape[0] * (size_t)(t->shape[1] ? t->shape[1] : 1);
    }
    p->nparams += t->count;
}

static dt_status layout(dt_program *p) {
    const dt_family *f = p->f;
    int L = p->cfg.num_layers, nfinal = f->nfinal - (p->cfg.tied && f->final[f->nfinal - 1].rows == W_VOCAB);
    size_t n = (size_t)(f->nembed + L * f->nblock + f->nfinal);
    p->tab = calloc(n, sizeof *p->tab);
    p->spec = calloc(n, sizeof *p->spec);
    p->block_tab = malloc(sizeof *p->block_tab * (size_t)L);
    if (!p->tab || !p->spec || !p->block_tab) return dt_error(DT_ERR_NOMEM, "model: out of memory for the table");
    for (int i = 0; i < f->nembed; i++) add_tensor(p, &f->embed[i], -1, 0);
    p->i_wte = 0;
    p->i_wpe = f->rotary ? -1 : 1;
    for (int l = 0; l < L; l++) {
        p->block_tab[l] = p->ntab;
        for (int i = 0; i < f->nblock; i++) add_tensor(p, &f->block[i], l, l + 1);
    }
    p->i_lnf = p->ntab;
    for (int i = 0; i < nfinal; i++) add_tensor(p, &f->final[i], -1, L + 1);
    p->i_head = p->cfg.tied ? p->i_wte : p->ntab - 1;
    /* a tied token table's gradient is whole once the embedding's backward has added its rows */
    p->tab[p->i_wte].input_rows = 1;
    return DT_OK;
}

/* A Linear's parts must sit side by side in the store: one matmul runs them all. */
static dt_status shape_ops(dt_program *p) {
    const dt_family *f = p->f;
    p->ops = calloc((size_t)f->nops, sizeof *p->ops);
    p->vw = calloc((size_t)f->nvalues, sizeof *p->vw);
    if (!p->ops || !p->vw) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    for (int v = 0; v < f->nvalues; v++) p->vw[v] = local_width(p, f->values[v]);
    for (int k = 0; k < f->nops; k++) {
        op_shape *o = &p->ops[k];
        o->s = f->ops[k];
        o->width_in = p->vw[o->s.in];
        o->width_out = p->vw[o->s.out];
        if (o->s.kind != OP_LINEAR) continue;
        const dt_tensor_info *t = p->tab + p->block_tab[0];
        int rows = 0;
        for (int j = 0; j < o->s.nw; j++) {
            rows += t[o->s.w + j].shape[0];
            if (j && t[o->s.w + j].offset != t[o->s.w + j - 1].offset + t[o->s.w + j - 1].count)
                return dt_error(DT_ERR_ARG, "model %s: the parts of Linear %s are not side by side", f->name, t[o->s.w].name);
            if (j && o->s.b >= 0 && t[o->s.b + j].offset != t[o->s.b + j - 1].offset + t[o->s.b + j - 1].count)
                return dt_error(DT_ERR_ARG, "model %s: the biases of Linear %s are not side by side", f->name, t[o->s.w].name);
        }
        int readers = 0;
        for (int j = 0; j < f->nops; j++) readers += f->ops[j].in == o->s.in || f->ops[j].in2 == o->s.in;
        /* its backward sums d(input) over the group in place: nothing else may have added to it */
        if (t[o->s.w].split == DT_SPLIT_COLUMN && (readers != 1 || o->s.in < 2))
            return dt_error(DT_ERR_ARG, "model %s: column-parallel Linear %s must be the only reader of its input", f->name, t[o->s.w].name);
        if (rows != o->width_out || t[o->s.w].shape[1] != o->width_in)
            return dt_error(DT_ERR_ARG, "model %s: Linear %s is [%d, %d] between values of %d and %d", f->name, t[o->s.w].name, rows,
                            t[o->s.w].shape[1], o->width_in, o->width_out);
    }
    return DT_OK;
}

/* What the program runs today: a whole model, split by tensor parallelism or not. */
static dt_status check_part(const dt_lm_config *c, const dt_gpt2_part *part) {
    int t = part->tp_size;
    if (part->ua != 0 || part->ub != c->num_layers + 2 || part->nchunks || part->sp || part->cp_size > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "model %s: pipeline stages, sequence and context parallelism are not on the model program yet",
                        c->family->name);
    if (t < 1 || part->tp_rank < 0 || part->tp_rank >= t) return dt_error(DT_ERR_ARG, "model: tensor-parallel rank %d of %d", part->tp_rank, t);
    if (t > 1 && !part->tp) return dt_error(DT_ERR_ARG, "model: a tensor-parallel part needs its collectives (dt_tp_ops)");
    if (c->num_heads % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the %d attention heads", t, c->num_heads);
    if (c->kv_heads % t && t % c->kv_heads)
        return dt_error(DT_ERR_ARG, "model: --tp %d and the %d K/V heads: one must divide the other", t, c->kv_heads);
    if (c->ffn % t) return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the MLP's %d hidden units", t, c->ffn);
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
    p->v0 = r * rows < c->padded_vocab_size ? r * rows : c->padded_vocab_size;
    p->Vl = c->padded_vocab_size - p->v0 < rows ? c->padded_vocab_size - p->v0 : rows;
    int real = c->vocab_size - p->v0;
    p->Vv = real < 0 ? 0 : real < p->Vl ? real : p->Vl;
}

dt_status dt_program_create(const dt_lm_config *cfg, dt_program **out) {
    dt_gpt2_part whole = { .ua = 0, .ub = cfg->num_layers + 2, .tp_size = 1 };
    return dt_program_create_part(cfg, &whole, out);
}

dt_status dt_program_create_part(const dt_lm_config *cfg, const dt_gpt2_part *part, dt_program **out) {
    *out = NULL;
    dt_status st = dt_lm_config_check(cfg, "model");
    if (!st) st = check_part(cfg, part);
    if (st) return st;
    dt_program *p = calloc(1, sizeof *p);
    if (!p) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    p->cfg = *cfg;
    p->f = cfg->family;
    p->part = *part;
    part_widths(p);
    if (!(st = layout(p))) st = shape_ops(p);
    if (!st && p->f->rotary) {
        if ((p->inv_freq = malloc(sizeof(float) * (size_t)(cfg->head_dim / 2)))) dt_rope_frequencies(p->inv_freq, cfg->head_dim, &cfg->rope);
        else st = dt_error(DT_ERR_NOMEM, "model: out of memory");
    }
    if (!st) {
        p->params = p->own_params = dt_alloc_aligned(p->nparams * sizeof(float));
        if (p->params) memset(p->params, 0, p->nparams * sizeof(float));
        p->grads = p->own_grads = dt_alloc_zeroed(p->nparams * sizeof(float));
        if (!p->params || !p->grads) {
            char sz[32];
            st = dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of parameters and gradients",
                          dt_format_size(2 * p->nparams * sizeof(float), sz, sizeof sz));
        }
    }
    if (st) {
        dt_program_destroy(p);
        return st;
    }
    *out = p;
    return DT_OK;
}

static void free_batch(dt_program *p) {
    dt_free_aligned(p->mem);
    free(p->val);
    free(p->stats);
    free(p->packed);
    free(p->dval);
    free(p->inputs);
    free(p->targets);
    free(p->pos);
    p->mem = NULL;
    p->val = p->stats = p->packed = p->dval = NULL;
    p->inputs = p->targets = p->pos = NULL;
    p->cap_BT = p->cap_T = 0;
}

void dt_program_destroy(dt_program *p) {
    if (!p) return;
    free_batch(p);
    free(p->tab);
    free(p->spec);
    free(p->block_tab);
    free(p->ops);
    free(p->vw);
    free(p->inv_freq);
    dt_free_aligned(p->own_params);
    dt_free_zeroed(p->own_grads);
    free(p);
}

const dt_lm_config *dt_program_config(const dt_program *p) { return &p->cfg; }
const float *dt_program_logits(const dt_program *p) { return p->logits; }
void dt_program_zero_grad(dt_program *p) { memset(p->grads, 0, p->nparams * sizeof(float)); }

void dt_program_init_random(dt_program *p, uint64_t seed) {
    float proj = 0.02f / sqrtf(2.0f * (float)p->cfg.num_layers);
    uint64_t drawn = 0;
    for (int i = 0; i < p->ntab; i++) {
        const dt_tensor_info *t = &p->tab[i];
        float *w = p->params + t->offset;
        int init = p->spec[i]->init;
        /* the Linears that write into the residual stream (row-parallel ones) start smaller, as GPT-2's */
        float std = t->split == DT_SPLIT_ROW ? proj : 0.02f;
        /* a slice draws the whole tensor's values at its places: every layout starts from the same weights */
        bool sliced = dt_tensor_is_sliced(t);
        for (size_t j = 0; j < t->count; j++)
            w[j] = init == INIT_ONES ? 1.0f : init == INIT_ZEROS ? 0.0f
                 : std * dt_rng_normal_at(seed, drawn + (sliced ? dt_tensor_global_index(t, j) : j));
        if (init == INIT_NORMAL) drawn += (size_t)t->gshape[0] * (size_t)(t->gshape[1] ? t->gshape[1] : 1);
    }
    /* padded vocabulary rows (this rank's Vv .. Vl) stay zero */
    size_t C = (size_t)p->cfg.channels;
    for (int i = p->i_wte; i >= 0; i = i == p->i_head ? -1 : p->i_head)
        memset(p->params + p->tab[i].offset + (size_t)p->Vv * C, 0, (size_t)(p->Vl - p->Vv) * C * sizeof(float));
}

/* K/V heads kept by several ranks (fewer K/V heads than ranks): each rank's gradient holds its own query heads'
 * part; the group sums them, one K/V head's slot a rank in a buffer of all of them. */
dt_status dt_program_finalize_grads(dt_program *p) {
    const dt_lm_config *c = &p->cfg;
    int t = p->part.tp_size;
    if (t == 1 || c->kv_heads >= t) return DT_OK;
    p->comm_err = DT_OK;
    for (int l = 0; l < c->num_layers; l++)
        for (int i = 0; i < p->f->nblock; i++) {
            const dt_tensor_info *x = &p->tab[p->block_tab[l] + i];
            if (p->f->block[i].rows != W_KV) continue;
            size_t n = x->count, all = n * (size_t)c->kv_heads;
            float *buf = calloc(all, sizeof(float));
            if (!buf) return dt_error(DT_ERR_NOMEM, "model: out of memory summing K/V gradients");
            memcpy(buf + (size_t)p->kv0 * n, p->grads + x->offset, n * sizeof(float));
            dt_program_tp_sum(p, buf, all);
            memcpy(p->grads + x->offset, buf + (size_t)p->kv0 * n, n * sizeof(float));
            free(buf);
        }
    return p->comm_err;
}

/* ---- a batch's memory ---- */

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Carves n floats from *at (64-byte aligned starts); with base NULL only counts. */
static float *carve(float *base, size_t *at, size_t n) {
    float *p = base ? base + *at : NULL;
    *at += round16(n);
    return p;
}

/* Lays out (base NULL: sizes) everything a batch of B x T needs; returns its floats. */
static size_t lay_batch(dt_program *p, float *base, int B, int T) {
    const dt_lm_config *c = &p->cfg;
    int L = c->num_layers, nv = p->f->nvalues, no = p->f->nops;
    size_t BT = (size_t)B * T, C = (size_t)c->channels, Q = (size_t)p->Ql, at = 0;
    size_t att = (size_t)p->NHl * BT * (p->blockwise ? 1 : (size_t)T);
    p->stream = carve(base, &at, (size_t)(L + 1) * BT * C);
    for (int l = 0; l < L; l++) {
        for (int v = 2; v < nv; v++) {
            float *x = carve(base, &at, BT * (size_t)p->vw[v]);
            if (base) p->val[l * nv + v] = x;
        }
        if (base) p->val[l * nv + V_IN] = p->stream + (size_t)l * BT * C, p->val[l * nv + V_OUT] = p->stream + (size_t)(l + 1) * BT * C;
        for (int k = 0; k < no; k++) {
            dt_op_kind kind = p->ops[k].s.kind;
            float *s = kind == OP_NORM ? carve(base, &at, 2 * BT) : kind == OP_ATTENTION ? carve(base, &at, att) : NULL;
            if (base) p->stats[l * no + k] = s;
        }
        float *pk = p->repack ? carve(base, &at, BT * 3 * Q) : NULL;
        if (base) p->packed[l] = pk;
    }
    for (int v = 0; v < nv; v++) {
        float *d = v >= 2 ? carve(base, &at, BT * (size_t)p->vw[v]) : NULL;
        if (base) p->dval[v] = d;
    }
    p->dstream[0] = carve(base, &at, BT * C);
    p->dstream[1] = carve(base, &at, BT * C);
    p->dpacked = p->repack ? carve(base, &at, BT * 3 * Q) : NULL;
    p->lnf = carve(base, &at, BT * C);
    p->lnf_stats = carve(base, &at, 2 * BT);
    p->logits = carve(base, &at, BT * (size_t)p->Vl);
    p->scratch = carve(base, &at, 2 * BT);
    p->losses = carve(base, &at, BT);
    p->ce_stats = carve(base, &at, 2 * BT);
    p->dlnf = carve(base, &at, BT * C);
    return at;
}

static dt_status reserve(dt_program *p, int B, int T) {
    bool blockwise = T >= 256; /* the log-sum-exp kernels: no T x T scores kept */
    if (p->mem && (size_t)B * T <= (size_t)p->cap_BT && T <= p->cap_T && blockwise == p->blockwise) return DT_OK;
    free_batch(p);
    p->blockwise = blockwise;
    int L = p->cfg.num_layers, nv = p->f->nvalues, no = p->f->nops;
    size_t BT = (size_t)B * T, n = lay_batch(p, NULL, B, T);
    p->val = calloc((size_t)(L * nv), sizeof *p->val);
    p->stats = calloc((size_t)(L * no), sizeof *p->stats);
    p->packed = calloc((size_t)L, sizeof *p->packed);
    p->dval = calloc((size_t)nv, sizeof *p->dval);
    p->inputs = malloc(BT * sizeof(int32_t));
    p->targets = malloc(BT * sizeof(int32_t));
    p->pos = malloc(BT * sizeof(int32_t));
    p->mem = dt_alloc_aligned(n * sizeof(float));
    if (!p->val || !p->stats || !p->packed || !p->dval || !p->inputs || !p->targets || !p->pos || !p->mem) {
        free_batch(p);
        char sz[32];
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of activations for B=%d T=%d", dt_format_size(n * sizeof(float), sz, sizeof sz),
                        B, T);
    }
    lay_batch(p, p->mem, B, T);
    p->cap_BT = B * T;
    p->cap_T = T;
    return DT_OK;
}

/* ---- forward ---- */

static float *weight(const dt_program *p, int l, int i) { return p->params + p->tab[p->block_tab[l] + i].offset; }
static float *weight_grad(const dt_program *p, int l, int i) { return p->grads + p->tab[p->block_tab[l] + i].offset; }

/* q|k|v of all heads from q, K/V heads and v side by side (in: [BT, Q + 2 KV]), q and k turned by position. */
/* Which of this rank's K/V heads its query head h reads. */
static int kv_of(const dt_program *p, int h) {
    return (p->part.tp_rank * p->NHl + h) / (p->cfg.num_heads / p->cfg.kv_heads) - p->kv0;
}

static void attention_pack(const dt_program *p, float *packed, const float *in, int BT) {
    int hd = p->cfg.head_dim, NH = p->NHl;
    size_t Q = (size_t)p->Ql, KV = (size_t)p->KVl, win = Q + 2 * KV;
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *x = in + (size_t)r * win;
        float *o = packed + (size_t)r * 3 * Q;
        memcpy(o, x, Q * sizeof(float));
        for (int h = 0; h < NH; h++) {
            memcpy(o + Q + (size_t)h * hd, x + Q + (size_t)kv_of(p, h) * hd, (size_t)hd * sizeof(float));
            memcpy(o + 2 * Q + (size_t)h * hd, x + Q + KV + (size_t)kv_of(p, h) * hd, (size_t)hd * sizeof(float));
        }
    }
    if (p->f->rotary) {
        dt_rope_forward(packed, p->inv_freq, p->pos, BT, NH, hd, 3 * Q);
        dt_rope_forward(packed + Q, p->inv_freq, p->pos, BT, NH, hd, 3 * Q);
    }
}

/* Its backward: dpacked (turned back in place) summed into d(q, K/V heads, v). */
static void attention_unpack(const dt_program *p, float *din, float *dpacked, int BT) {
    int hd = p->cfg.head_dim, NH = p->NHl;
    size_t Q = (size_t)p->Ql, KV = (size_t)p->KVl, win = Q + 2 * KV;
    if (p->f->rotary) {
        dt_rope_backward(dpacked, p->inv_freq, p->pos, BT, NH, hd, 3 * Q);
        dt_rope_backward(dpacked + Q, p->inv_freq, p->pos, BT, NH, hd, 3 * Q);
    }
    #pragma omp parallel for schedule(static)
    for (int r = 0; r < BT; r++) {
        const float *d = dpacked + (size_t)r * 3 * Q;
        float *o = din + (size_t)r * win;
        for (size_t j = 0; j < Q; j++) o[j] += d[j];
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < hd; j++) {
                o[Q + (size_t)kv_of(p, h) * hd + j] += d[Q + (size_t)h * hd + j];
                o[Q + KV + (size_t)kv_of(p, h) * hd + j] += d[2 * Q + (size_t)h * hd + j];
            }
    }
}

/* Whether block l's Linear with first weight w is split by tensor parallelism, and how. */
static dt_tp_split split_of(const dt_program *p, int w) { return p->part.tp_size > 1 ? p->tab[p->block_tab[0] + w].split : DT_SPLIT_NONE; }

static void op_forward(dt_program *p, int l, int k) {
    const op_shape *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    int nv = p->f->nvalues, BT = p->B * p->T, NH = p->NHl, Q = p->Ql;
    float *in = p->val[l * nv + s->in], *out = p->val[l * nv + s->out], *st = p->stats[l * p->f->nops + k];
    switch (s->kind) {
    case OP_NORM:
        if (p->f->rms) dt_rmsnorm_forward(out, st + BT, in, weight(p, l, s->w), BT, o->width_in, p->cfg.norm_eps);
        else dt_layernorm_forward(out, st, st + BT, in, weight(p, l, s->w), weight(p, l, s->b), BT, o->width_in);
        break;
    case OP_LINEAR: {
        /* a row-parallel Linear's outputs are partial sums, whole once summed over the group; its bias on one rank */
        bool rows = split_of(p, s->w) == DT_SPLIT_ROW, bias = s->b >= 0 && (!rows || p->part.tp_rank == 0);
        dt_matmul_forward(out, in, weight(p, l, s->w), bias ? weight(p, l, s->b) : NULL, BT, o->width_in, o->width_out);
        if (rows) dt_program_tp_sum(p, out, (size_t)BT * o->width_out);
        break;
    }
    case OP_ATTENTION: {
        float *qkv = in;
        if (p->repack) attention_pack(p, qkv = p->packed[l], in, BT);
        if (p->blockwise) dt_attention_forward_lse(out, st, qkv, p->B, p->T, Q, NH);
        else dt_attention_forward(out, st, qkv, p->B, p->T, Q, NH);
        break;
    }
    case OP_GELU: dt_gelu_forward(out, in, (size_t)BT * o->width_in); break;
    case OP_SWIGLU: dt_swiglu_forward(out, in, BT, o->width_out); break;
    case OP_ADD: dt_residual_forward(out, in, p->val[l * nv + s->in2], (size_t)BT * o->width_out); break;
    }
}

static void final_norm_forward(dt_program *p) {
    int BT = p->B * p->T, C = p->cfg.channels;
    const float *x = p->stream + (size_t)p->cfg.num_layers * BT * C, *w = p->params + p->tab[p->i_lnf].offset;
    if (p->f->rms) dt_rmsnorm_forward(p->lnf, p->lnf_stats + BT, x, w, BT, C, p->cfg.norm_eps);
    else dt_layernorm_forward(p->lnf, p->lnf_stats, p->lnf_stats + BT, x, w, w + C, BT, C);
}

static dt_status check_batch(const dt_program *p, const int32_t *inputs, const int32_t *targets, int B, int T) {
    const dt_lm_config *c = &p->cfg;
    if (B < 1 || T < 1 || T > c->max_seq_len) return dt_error(DT_ERR_ARG, "forward: B=%d T=%d (T must be 1..%d)", B, T, c->max_seq_len);
    for (size_t i = 0; i < (size_t)B * T; i++) {
        if (inputs[i] < 0 || inputs[i] >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "forward: input token %d at position %zu is outside the vocabulary (0..%d)", inputs[i], i, c->vocab_size - 1);
        if (targets && (targets[i] < 0 || targets[i] >= c->vocab_size))
            return dt_error(DT_ERR_ARG, "forward: target token %d at position %zu is outside the vocabulary (0..%d)", targets[i], i,
                            c->vocab_size - 1);
    }
    return DT_OK;
}

dt_status dt_program_forward(dt_program *p, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    const dt_lm_config *c = &p->cfg;
    p->repack = c->family->rotary || c->kv_heads != c->num_heads;
    dt_status st = check_batch(p, inputs, targets, B, T);
    if (!st) st = reserve(p, B, T);
    if (st) return st;
    int L = c->num_layers, C = c->channels, BT = B * T;
    p->B = B, p->T = T;
    p->comm_err = DT_OK;
    memcpy(p->inputs, inputs, (size_t)BT * sizeof(int32_t));
    for (int i = 0; i < BT; i++) p->pos[i] = i % T;
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, 0);
    dt_program_tp_embedding_forward(p, p->stream, inputs);
    for (int l = 0; l < L; l++) {
        dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, l + 1);
        for (int k = 0; k < p->f->nops; k++) op_forward(p, l, k);
    }
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, L + 1);
    final_norm_forward(p);
    dt_matmul_forward(p->logits, p->lnf, p->params + p->tab[p->i_head].offset, NULL, BT, C, p->Vl);
    p->have_targets = targets != NULL;
    if (targets) {
        memcpy(p->targets, targets, (size_t)BT * sizeof(int32_t));
        p->loss = dt_program_tp_crossentropy_forward(p, targets);
        if (loss) *loss = p->loss;
    }
    return p->comm_err;
}

/* ---- backward ---- */

static void op_backward(dt_program *p, int l, int k, float *din_stream, float *dout_stream) {
    const op_shape *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    int nv = p->f->nvalues, BT = p->B * p->T, NH = p->NHl, Q = p->Ql;
    float *in = p->val[l * nv + s->in], *out = p->val[l * nv + s->out], *st = p->stats[l * p->f->nops + k];
    float *din = s->in == V_IN ? din_stream : p->dval[s->in], *dout = s->out == V_OUT ? dout_stream : p->dval[s->out];
    switch (s->kind) {
    case OP_NORM:
        if (p->f->rms) dt_rmsnorm_backward(din, weight_grad(p, l, s->w), dout, in, weight(p, l, s->w), st + BT, BT, o->width_in);
        else dt_layernorm_backward(din, weight_grad(p, l, s->w), weight_grad(p, l, s->b), dout, in, weight(p, l, s->w), st, st + BT, BT,
                                   o->width_in);
        break;
    case OP_LINEAR:
        dt_matmul_backward(din, weight_grad(p, l, s->w), s->b >= 0 ? weight_grad(p, l, s->b) : NULL, dout, in, weight(p, l, s->w), BT,
                           o->width_in, o->width_out);
        /* a column-parallel Linear's input gradient is this rank's share (it is its input's only reader: shape_ops) */
        if (split_of(p, s->w) == DT_SPLIT_COLUMN) dt_program_tp_sum(p, din, (size_t)BT * o->width_in);
        break;
    case OP_ATTENTION: {
        float *qkv = p->repack ? p->packed[l] : in, *dqkv = p->repack ? p->dpacked : din;
        if (p->repack) memset(dqkv, 0, (size_t)BT * 3 * Q * sizeof(float));
        if (p->blockwise) dt_attention_backward_lse(dqkv, dout, out, qkv, st, p->B, p->T, Q, NH);
        else dt_attention_backward(dqkv, dout, qkv, st, p->B, p->T, Q, NH);
        if (p->repack) attention_unpack(p, din, dqkv, BT);
        break;
    }
    case OP_GELU: dt_gelu_backward(din, in, dout, (size_t)BT * o->width_in); break;
    case OP_SWIGLU: dt_swiglu_backward(din, in, dout, BT, o->width_out); break;
    case OP_ADD: {
        float *din2 = s->in2 == V_IN ? din_stream : p->dval[s->in2];
        dt_residual_backward(din, din2, dout, (size_t)BT * o->width_out);
        break;
    }
    }
}

static void final_norm_backward(dt_program *p, float *dres) {
    int BT = p->B * p->T, C = p->cfg.channels;
    const float *x = p->stream + (size_t)p->cfg.num_layers * BT * C, *w = p->params + p->tab[p->i_lnf].offset;
    float *dw = p->grads + p->tab[p->i_lnf].offset;
    if (p->f->rms) dt_rmsnorm_backward(dres, dw, p->dlnf, x, w, p->lnf_stats + BT, BT, C);
    else dt_layernorm_backward(dres, dw, dw + C, p->dlnf, x, w, p->lnf_stats, p->lnf_stats + BT, BT, C);
}

dt_status dt_program_backward(dt_program *p, float grad_scale) {
    if (!p->mem || !p->have_targets) return dt_error(DT_ERR_ARG, "backward: needs a forward with targets first");
    p->have_targets = false; /* the logits become their gradient */
    const dt_lm_config *c = &p->cfg;
    int L = c->num_layers, C = c->channels, BT = p->B * p->T, nv = p->f->nvalues;
    size_t BTC = (size_t)BT * C;
    p->comm_err = DT_OK;
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, L + 1);
    dt_program_tp_crossentropy_backward(p, grad_scale / (float)BT);
    memset(p->dlnf, 0, BTC * sizeof(float));
    dt_matmul_backward(p->dlnf, p->grads + p->tab[p->i_head].offset, NULL, p->logits, p->lnf, p->params + p->tab[p->i_head].offset, BT, C,
                       p->Vl);
    dt_program_tp_sum(p, p->dlnf, BTC); /* the head is column-parallel (by vocabulary) */
    float *dres = p->dstream[0], *dnext = p->dstream[1];
    memset(dres, 0, BTC * sizeof(float));
    final_norm_backward(p, dres);
    dt_hook_list_call(&p->grad_hooks, DT_HOOK_GRADS_READY, L + 1);
    for (int l = L - 1; l >= 0; l--) {
        dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, l + 1);
        for (int v = 2; v < nv; v++) memset(p->dval[v], 0, (size_t)BT * p->vw[v] * sizeof(float));
        memset(dnext, 0, BTC * sizeof(float));
        for (int k = p->f->nops - 1; k >= 0; k--) op_backward(p, l, k, dnext, dres);
        float *t = dres;
        dres = dnext, dnext = t;
        dt_hook_list_call(&p->grad_hooks, DT_HOOK_GRADS_READY, l + 1);
    }
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, 0);
    dt_program_tp_embedding_backward(p, dres);
    dt_hook_list_call(&p->grad_hooks, DT_HOOK_GRADS_READY, 0);
    return p->comm_err;
}

/* ---- the model as the engine sees it ---- */

static float *params_of(void *self) { return ((dt_program *)self)->params; }
static float *grads_of(void *self) { return ((dt_program *)self)->grads; }
static void set_grad_hook(void *self, dt_unit_hook hook, void *ctx) { dt_hook_list_set(&((dt_program *)self)->grad_hooks, hook, NULL, ctx); }
static void set_unit_hooks(void *self, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    dt_hook_list_set(&((dt_program *)self)->unit_hooks, before_forward, before_backward, ctx);
}
static void set_grad_storage(void *self, float *to) {
    dt_program *p = self;
    p->grads = dt_model_grad_storage(p->own_grads, p->grads, to, p->nparams);
}
static void set_param_storage(void *self, float *to) {
    dt_program *p = self;
    p->params = dt_model_param_storage(p->own_params, p->params, to, p->nparams);
}

void dt_program_model(dt_program *p, dt_model *out) {
    *out = (dt_model){ .self = p, .kind = p->f->name, .tensors = p->tab, .ntensors = p->ntab, .nunits = p->cfg.num_layers + 2,
                       .nparams = p->nparams, .global_params = p->global_params, .params = params_of, .grads = grads_of, .set_grad_storage = set_grad_storage,
                       .set_grad_hook = set_grad_hook, .set_unit_hooks = set_unit_hooks, .set_param_storage = set_param_storage };
}
