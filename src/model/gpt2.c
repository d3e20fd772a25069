/* GPT-2: token + position embeddings, L pre-LayerNorm blocks (fused qkv,
 * causal attention, projection; MLP 4C with GELU), final LayerNorm, LM head
 * tied to the token embedding. This file holds its shape: the tensor table,
 * the flat stores (unit by unit, as the table lays them out; llm.c's
 * tensor-major order exists only in src/io/), creation of the whole model or
 * of a range of its units (a pipeline stage), initialisation. Running it is
 * gpt2_run.c. */
#include "gpt2_internal.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

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

size_t dt_gpt2_part_num_params(const dt_gpt2_config *c, int tp) {
    size_t t = tp > 1 ? (size_t)tp : 1, C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t split = L * (12 * C * C + 7 * C); /* qkv (w, b), attproj w, fc (w, b), fcproj w */
    size_t vocab = ((size_t)c->padded_vocab_size + t - 1) / t * C;
    return dt_gpt2_config_num_params(c) - split - (size_t)c->padded_vocab_size * C + split / t + vocab;
}

size_t dt_gpt2_units_num_params(const dt_gpt2_config *c, int a, int b, int tp) {
    size_t t = tp > 1 ? (size_t)tp : 1, C = (size_t)c->channels, L = (size_t)c->num_layers;
    size_t wte = ((size_t)c->padded_vocab_size + t - 1) / t * C, n = 0;
    /* a block: qkv (w, b), attproj w, fc (w, b), fcproj w split by tp; two LayerNorms and two biases (6 C) whole */
    size_t block = (12 * C * C + 7 * C) / t + 6 * C;
    int first = a > 1 ? a : 1, last = b - 1 < (int)L ? b - 1 : (int)L; /* blocks: units [first, last] */
    if (a == 0) n += wte + (size_t)c->max_seq_len * C;
    if (last >= first) n += (size_t)(last - first + 1) * block;
    if (b == (int)L + 2) n += 2 * C + (a > 0 ? wte : 0);
    return n;
}

double dt_gpt2_flops_per_token(const dt_gpt2_config *c, int T) {
    double n_mm = (double)dt_gpt2_config_num_params(c) - (double)c->max_seq_len * c->channels;
    return 6.0 * n_mm + 12.0 * c->num_layers * (double)T * c->channels;
}


/* Where llm.c's tensor i of layer l starts in the whole model's unit-major
 * store: wte, wpe, the blocks' twelve each, lnfw, lnfb. */
static size_t global_offset(const dt_gpt2_config *c, int i, int l) {
    size_t at = 0, block = 0;
    int s[2];
    for (int k = LN1W; k <= FCPROJB; k++) tensor_shape(c, k, s), block += (size_t)s[0] * (size_t)(s[1] ? s[1] : 1);
    if (i == WTE) return 0;
    tensor_shape(c, WTE, s);
    at += (size_t)s[0] * (size_t)s[1];
    if (i == WPE) return at;
    tensor_shape(c, WPE, s);
    at += (size_t)s[0] * (size_t)s[1];
    if (i >= LNFW) return at + block * (size_t)c->num_layers + (i == LNFB ? (size_t)c->channels : 0);
    at += block * (size_t)l;
    for (int k = LN1W; k < i; k++) tensor_shape(c, k, s), at += (size_t)s[0] * (size_t)(s[1] ? s[1] : 1);
    return at;
}

/* This rank's slice of a split tensor (t whole so far), from the part:
 * column-parallel by output rows (qkv: the same heads' rows of each of Q, K
 * and V), row-parallel by input columns, the embedding by vocabulary rows. */
static void slice(const dt_gpt2 *m, dt_tensor_info *t) {
    int r = m->part.tp_rank, C = m->cfg.channels;
    switch (t->split) {
    case DT_SPLIT_COLUMN:
        if (t->llmc_index == QKVW || t->llmc_index == QKVB) t->slice = (dt_tensor_slice){ 0, r * m->Cl, m->Cl, 3, C };
        else t->slice = (dt_tensor_slice){ 0, r * m->Fl, m->Fl, 1, m->Fl };
        t->shape[0] = t->slice.count * t->slice.pieces;
        break;
    case DT_SPLIT_ROW: {
        int in = t->gshape[1] / m->part.tp_size;
        t->slice = (dt_tensor_slice){ 1, r * in, in, 1, in };
        t->shape[1] = in;
        break;
    }
    case DT_SPLIT_VOCAB:
        t->slice = (dt_tensor_slice){ 0, m->v0, m->Vl, 1, m->Vl };
        t->shape[0] = m->Vl;
        break;
    case DT_SPLIT_NONE: break;
    }
}

/* Appends llm.c's tensor i (layer l) to the table as part of unit `unit`; its index. */
static int add(dt_gpt2 *m, int i, int l, int unit) {
    int L = m->cfg.num_layers;
    bool per_layer = i >= LN1W && i <= FCPROJB;
    dt_tensor_info *t = &m->tab[m->ntab];
    t->llmc = tensor_kinds[i].llmc;
    t->llmc_index = i;
    t->layer = l;
    t->unit = unit;
    /* wte's gradient is final once the head is done when this model also runs the
     * head and the embedding's rows can be deferred (input_rows; not for a
     * vocabulary slice: dt_gpt2_model offers no deferral then), else once the
     * embedding's backward has added them */
    t->grad_unit = i == WTE && m->ub == L + 2 && m->part.tp_size == 1 ? L + 1 : unit;
    t->input_rows = i == WTE && unit == 0;
    t->split = tensor_kinds[i].split;
    /* what mixed precision reads in f32: the embedding tables in forward, the LayerNorms in both passes */
    t->f32_read = i == WTE || i == WPE ? 1 : i == LN1W || i == LN1B || i == LN2W || i == LN2B || i == LNFW || i == LNFB ? 2 : 0;
    tensor_shape(&m->cfg, i, t->shape);
    t->ndim = t->shape[1] ? 2 : 1;
    dt_tensor_set_whole(t);
    if (m->part.tp_size > 1) slice(m, t);
    t->count = (size_t)t->shape[0] * (size_t)(t->shape[1] ? t->shape[1] : 1);
    t->offset = m->nparams;
    t->goffset = global_offset(&m->cfg, i, l);
    m->nparams += t->count;
    if (per_layer) {
        snprintf(t->name, sizeof t->name, "h.%d.%s", l, t->llmc);
        snprintf(t->hf, sizeof t->hf, "h.%d.%s", l, tensor_kinds[i].hf);
    } else {
        snprintf(t->name, sizeof t->name, "%s", t->llmc);
        snprintf(t->hf, sizeof t->hf, "%s", tensor_kinds[i].hf);
    }
    return m->ntab++;
}

/* The table in store order: unit 0 (wte, wpe), the blocks, unit L+1 (lnfw,
 * lnfb, and wte's copy when unit 0 is not held), of the units held. */
static dt_status layout(dt_gpt2 *m) {
    int L = m->cfg.num_layers;
    m->tab = calloc((size_t)(PER_BLOCK * L + 5), sizeof *m->tab);
    if (!m->tab) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->bk = malloc(sizeof *m->bk * (size_t)(L > 0 ? L : 1));
    if (!m->bk) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    for (int l = 0; l < L; l++) m->bk[l] = -1;
    m->i_wte = m->i_wpe = m->i_lnf = m->i_blk = -1;
    if (m->ua == 0) {
        m->i_wte = add(m, WTE, 0, 0);
        m->i_wpe = add(m, WPE, 0, 0);
    }
    /* each range's blocks, numbered in store order */
    m->nl = 0;
    m->l0 = m->ua > 0 ? m->ua - 1 : 0;
    for (int r = 0; r < m->nr; r++) {
        int end = m->rb[r] - 1 < L ? m->rb[r] - 1 : L;
        for (int l = m->ra[r] > 0 ? m->ra[r] - 1 : 0; l < end; l++, m->nl++) {
            m->bk[l] = m->nl;
            for (int i = LN1W; i <= FCPROJB; i++) {
                int k = add(m, i, l, l + 1);
                if (m->i_blk < 0) m->i_blk = k;
            }
        }
    }
    if (m->ub == L + 2) {
        m->i_lnf = add(m, LNFW, 0, L + 1);
        add(m, LNFB, 0, L + 1);
        if (m->ua > 0) {
            m->i_wte = add(m, WTE, 0, L + 1); /* the head's copy of the tied embedding */
            m->tab[m->i_wte].tied_copy = 1;
        }
    }
    return DT_OK;
}

dt_gpt2_part dt_gpt2_whole(const dt_gpt2_config *cfg) { return (dt_gpt2_part){ .ua = 0, .ub = cfg->num_layers + 2, .tp_size = 1 }; }

static dt_status check_part(const dt_gpt2_config *cfg, const dt_gpt2_part *p) {
    int a = p->ua, b = p->ub, t = p->tp_size;
    if (p->nchunks < 0 || p->nchunks > DT_GPT2_MAX_CHUNKS)
        return dt_error(DT_ERR_ARG, "model: %d chunks (at most %d)", p->nchunks, DT_GPT2_MAX_CHUNKS);
    for (int r = 0; r < p->nchunks; r++)
        if (p->chunk_a[r] < (r ? p->chunk_b[r - 1] + 1 : 0) || p->chunk_b[r] > cfg->num_layers + 2 || p->chunk_a[r] >= p->chunk_b[r])
            return dt_error(DT_ERR_ARG, "model: chunk %d, units [%d, %d), is not a range of 0..%d after the last one and apart from it", r,
                            p->chunk_a[r], p->chunk_b[r], cfg->num_layers + 1);
    if (p->nchunks) a = p->chunk_a[0], b = p->chunk_b[p->nchunks - 1];
    if (a < 0 || b > cfg->num_layers + 2 || a >= b)
        return dt_error(DT_ERR_ARG, "model: units [%d, %d) are not a range of 0..%d", a, b, cfg->num_layers + 1);
    if (t < 1 || p->tp_rank < 0 || p->tp_rank >= t)
        return dt_error(DT_ERR_ARG, "model: tensor-parallel rank %d of %d", p->tp_rank, t);
    if (t > 1 && cfg->num_heads % t)
        return dt_error(DT_ERR_ARG, "model: --tp %d does not divide the %d attention heads", t, cfg->num_heads);
    if (t > 1 && !p->tp) return dt_error(DT_ERR_ARG, "model: a tensor-parallel part needs its collectives (dt_tp_ops)");
    if (t > cfg->padded_vocab_size)
        return dt_error(DT_ERR_ARG, "model: --tp %d is more than the %d vocabulary rows", t, cfg->padded_vocab_size);
    int n = p->cp_size ? p->cp_size : 1;
    if (n < 1 || p->cp_rank < 0 || p->cp_rank >= n)
        return dt_error(DT_ERR_ARG, "model: context-parallel rank %d of %d", p->cp_rank, n);
    if (n > 1 && !p->cp) return dt_error(DT_ERR_ARG, "model: a context-parallel part needs its attention (dt_cp_ops)");
    return DT_OK;
}

int dt_gpt2_cp_position(int r, int n, int Tl, int i) {
    int tc = Tl / 2;
    if (n <= 1) return i;
    return i < tc ? r * tc + i : (2 * n - 1 - r) * tc + i - tc;
}

void dt_gpt2_cp_rows(int32_t *x, int B, int T, int r, int n) {
    int Tl = T / n;
    /* every row's source is at or after it: in place, in order */
    for (int b = 0; b < B; b++)
        for (int i = 0; i < Tl; i++) x[(size_t)b * Tl + i] = x[(size_t)b * T + dt_gpt2_cp_position(r, n, Tl, i)];
}

/* The part's widths (struct dt_gpt2's Cl .. Vv). */
static void part_widths(dt_gpt2 *m) {
    const dt_gpt2_config *c = &m->cfg;
    int t = m->part.tp_size, r = m->part.tp_rank, rows = (c->padded_vocab_size + t - 1) / t;
    m->Cl = c->channels / t;
    m->NHl = c->num_heads / t;
    m->Fl = 4 * c->channels / t;
    m->v0 = r * rows < c->padded_vocab_size ? r * rows : c->padded_vocab_size;
    m->Vl = c->padded_vocab_size - m->v0 < rows ? c->padded_vocab_size - m->v0 : rows;
    int real = c->vocab_size - m->v0;
    m->Vv = real < 0 ? 0 : real < m->Vl ? real : m->Vl;
}

dt_status dt_gpt2_create_units(const dt_gpt2_config *cfg, int a, int b, dt_gpt2 **out) {
    dt_gpt2_part p = dt_gpt2_whole(cfg);
    p.ua = a;
    p.ub = b;
    return dt_gpt2_create_part(cfg, &p, out);
}

const dt_gpt2_part *dt_gpt2_get_part(const dt_gpt2 *m) { return &m->part; }

typedef struct { float *to; const float *from; } slice_copy;
static void copy_run(size_t lo, size_t go, size_t n, void *ctx) {
    slice_copy *x = ctx;
    memcpy(x->to + lo, x->from + go, n * sizeof(float));
}

dt_status dt_gpt2_copy_slices(const dt_gpt2 *whole, dt_gpt2 *part) {
    if (memcmp(&whole->cfg, &part->cfg, sizeof whole->cfg) || whole->ua != 0 || whole->ub != whole->cfg.num_layers + 2 || whole->nr != 1)
        return dt_error(DT_ERR_ARG, "model: slices come from a whole model of the same shape");
    dt_model view;
    dt_gpt2_model(part, &view);
    slice_copy x = { part->params, whole->params };
    dt_model_global_runs(&view, 0, view.nparams, copy_run, &x);
    return DT_OK;
}

dt_status dt_gpt2_create_part(const dt_gpt2_config *cfg, const dt_gpt2_part *part, dt_gpt2 **out) {
    *out = NULL;
    dt_status st = dt_gpt2_config_check(cfg, "model");
    if (!st) st = check_part(cfg, part);
    if (st) return st;
    dt_gpt2 *m = calloc(1, sizeof *m);
    if (!m) return dt_error(DT_ERR_NOMEM, "model: out of memory");
    m->cfg = *cfg;
    m->part = *part;
    m->nr = part->nchunks ? part->nchunks : 1;
    for (int r = 0; r < m->nr; r++) {
        m->ra[r] = part->nchunks ? part->chunk_a[r] : part->ua;
        m->rb[r] = part->nchunks ? part->chunk_b[r] : part->ub;
    }
    m->ua = m->ra[0];
    m->ub = m->rb[m->nr - 1];
    part_widths(m);
    if ((st = layout(m))) { free(m->tab); free(m->bk); free(m); return st; }
    m->params = m->own_params = dt_alloc_aligned(m->nparams * sizeof(float));
    m->grads = m->own_grads = dt_alloc_zeroed(m->nparams * sizeof(float));
    if (m->part.cp_size > 1 && !(m->pos = malloc((size_t)cfg->max_seq_len * sizeof(int32_t)))) m->params = NULL;
    if (!m->params || !m->grads) {
        char sz[32];
        dt_format_size(2 * m->nparams * sizeof(float), sz, sizeof sz);
        dt_gpt2_destroy(m);
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of parameters and gradients", sz);
    }
    memset(m->params, 0, m->nparams * sizeof(float));
    *out = m;
    return DT_OK;
}

dt_status dt_gpt2_create(const dt_gpt2_config *cfg, dt_gpt2 **out) {
    return dt_gpt2_create_units(cfg, 0, cfg->num_layers + 2, out);
}

void dt_gpt2_destroy(dt_gpt2 *m) {
    if (!m) return;
    free(m->tab);
    free(m->bk);
    dt_free_aligned(m->own_params);
    dt_free_zeroed(m->own_grads);
    dt_free_aligned(m->acts);
    dt_free_aligned(m->acts_lp);
    dt_free_aligned(m->params_lp);
    dt_free_aligned(m->lp_work);
    free(m->lp_cast);
    free(m->lp_current);
    free(m->inputs);
    free(m->targets);
    free(m->pos);
    dt_gpt2_free_slots(m);
    free(m);
}

void dt_gpt2_init_random_range(dt_gpt2 *m, uint64_t seed, size_t lo, size_t hi) {
    float proj = 0.02f / sqrtf(2.0f * m->cfg.num_layers);
    uint64_t drawn = 0; /* normals drawn before this tensor: its values are the stream's next ones */
    /* every tensor of the whole model in llm.c's order, kept where held: a seed gives
     * the same weights whatever the store's layout, whichever units are held and
     * whichever piece of the store is made */
    for (int i = 0; i < DT_GPT2_NTENSORS; i++) {
        bool ln_w = i == LN1W || i == LN2W || i == LNFW;
        bool bias = i == QKVB || i == ATTPROJB || i == LN1B || i == LN2B || i == FCB || i == FCPROJB || i == LNFB;
        float std = (i == ATTPROJW || i == FCPROJW) ? proj : 0.02f;
        int shape[2];
        tensor_shape(&m->cfg, i, shape);
        size_t gcount = (size_t)shape[0] * (size_t)(shape[1] ? shape[1] : 1); /* the global tensor's draws */
        for (int l = 0; l < dt_gpt2_llmc_layers(m, i); l++, drawn += ln_w || bias ? 0 : gcount) {
            const dt_tensor_info *t = dt_gpt2_llmc_tensor(m, i, l);
            if (!t || t->offset >= hi || t->offset + t->count <= lo) continue;
            float *p = m->params + t->offset;
            size_t j0 = lo > t->offset ? lo - t->offset : 0, j1 = hi - t->offset < t->count ? hi - t->offset : t->count;
            uint64_t first = drawn;
            bool sliced = dt_tensor_is_sliced(t); /* a slice draws the global tensor's values at its places */
            #pragma omp parallel for schedule(static)
            for (size_t j = j0; j < j1; j++)
                p[j] = ln_w ? 1.0f : bias ? 0.0f : std * dt_rng_normal_at(seed, first + (sliced ? dt_tensor_global_index(t, j) : j));
        }
    }
    /* padded vocabulary rows stay zero (this rank's rows Vv..Vl) */
    if (m->i_wte >= 0) {
        size_t C = (size_t)m->cfg.channels, a = m->tab[m->i_wte].offset + (size_t)m->Vv * C,
               b = m->tab[m->i_wte].offset + (size_t)m->Vl * C;
        if (a < lo) a = lo;
        if (b > hi) b = hi;
        if (a < b) memset(m->params + a, 0, (b - a) * sizeof(float));
    }
}

void dt_gpt2_init_random(dt_gpt2 *m, uint64_t seed) { dt_gpt2_init_random_range(m, seed, 0, m->nparams); }

const dt_gpt2_config *dt_gpt2_get_config(const dt_gpt2 *m) { return &m->cfg; }
size_t dt_gpt2_num_params(const dt_gpt2 *m) { return m->nparams; }
float *dt_gpt2_params(dt_gpt2 *m) { return m->params; }
float *dt_gpt2_grads(dt_gpt2 *m) { return m->grads; }

void dt_gpt2_units(const dt_gpt2 *m, int *a, int *b) {
    *a = m->ua;
    *b = m->ub;
}

int dt_gpt2_chunks(const dt_gpt2 *m, int *a, int *b) {
    for (int r = 0; r < m->nr; r++) a[r] = m->ra[r], b[r] = m->rb[r];
    return m->nr;
}

dt_status dt_gpt2_check_whole(const dt_gpt2 *m, const char *what) {
    if (m->ua == 0 && m->ub == m->cfg.num_layers + 2 && m->nr == 1) return DT_OK;
    return dt_error(DT_ERR_ARG, "%s: the model holds units [%d, %d) of 0..%d, not the whole model", what, m->ua, m->ub,
                    m->cfg.num_layers + 1);
}

const dt_tensor_info *dt_gpt2_tensors(const dt_gpt2 *m, int *n) {
    if (n) *n = m->ntab;
    return m->tab;
}

int dt_gpt2_llmc_layers(const dt_gpt2 *m, int i) { return i >= LN1W && i <= FCPROJB ? m->cfg.num_layers : 1; }

const dt_tensor_info *dt_gpt2_llmc_tensor(const dt_gpt2 *m, int i, int l) {
    if (i == WTE) return m->i_wte >= 0 ? &m->tab[m->i_wte] : NULL;
    if (i == WPE) return m->i_wpe >= 0 ? &m->tab[m->i_wpe] : NULL;
    if (i >= LNFW) return m->i_lnf >= 0 ? &m->tab[m->i_lnf + i - LNFW] : NULL;
    if (l < 0 || l >= m->cfg.num_layers || m->bk[l] < 0) return NULL;
    return &m->tab[m->i_blk + m->bk[l] * PER_BLOCK + (i - LN1W)];
}

void dt_gpt2_set_attention(dt_gpt2 *m, dt_attn_mode mode) { m->attn = mode; }

void dt_gpt2_set_grad_hook(dt_gpt2 *m, dt_unit_hook hook, void *ctx) {
    if (dt_hook_list_set(&m->grad_hooks, hook, NULL, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
}

void dt_gpt2_set_unit_hooks(dt_gpt2 *m, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    if (dt_hook_list_set(&m->unit_hooks, before_forward, before_backward, ctx)) dt_log(DT_LOG_ERROR, "%s", dt_last_error());
    m->lp_held_max = 0; /* the 16-bit copy is made unit by unit from now (or whole again) */
}

void dt_gpt2_set_defer_wte_rows(dt_gpt2 *m, int on) { m->defer_wte_rows = on; }

void dt_gpt2_set_grad_storage(dt_gpt2 *m, float *grads) {
    m->grads = dt_model_grad_storage(m->own_grads, m->grads, grads, m->nparams);
    /* the model's own gradients, unused while elsewhere: their memory goes back (4 bytes per parameter) */
    if (m->grads != m->own_grads) dt_mem_release(m->own_grads, m->nparams * sizeof(float));
}

/* Every tensor's kept 16-bit copy out of date: cast again at the next forward. */
static void lp_forget(dt_gpt2 *m) {
    if (m->lp_current) memset(m->lp_current, 0, (size_t)m->ntab);
}

void dt_gpt2_set_param_storage(dt_gpt2 *m, float *params) {
    m->params = dt_model_param_storage(m->own_params, m->params, params, m->nparams);
    lp_forget(m);
}

void dt_gpt2_params_changed(dt_gpt2 *m) {
    m->lp_told = 1;
    lp_forget(m);
}

dt_status dt_gpt2_set_recompute(dt_gpt2 *m, int on) {
    if (m->recompute != (on != 0)) dt_gpt2_drop_slots(m); /* the others' layout changes too */
    if (m->acts && m->recompute != (on != 0)) {
        /* the activation layout changes: size it again on the next forward */
        dt_free_aligned(m->acts);
        m->acts = NULL;
        m->bt_capacity = m->att_capacity = 0;
    }
    m->recompute = on != 0;
    return DT_OK;
}

void dt_gpt2_zero_grad(dt_gpt2 *m) { memset(m->grads, 0, m->nparams * sizeof(float)); }

size_t dt_gpt2_activation_memory(const dt_gpt2 *m) {
    return m->nacts * sizeof(float) + m->lp_capacity * sizeof(uint16_t) + (m->lp_work ? m->lp_work_floats * sizeof(float) : 0) +
           dt_gpt2_slots_bytes(m);
}

size_t dt_gpt2_memory(const dt_gpt2 *m) {
    return 2 * m->nparams * sizeof(float) + dt_gpt2_lp_params_bytes(m) + dt_gpt2_activation_memory(m);
}

size_t dt_gpt2_lp_params_bytes(const dt_gpt2 *m) {
    if (!m->params_lp) return 0;
    return (m->unit_hooks.n && !m->lp_external ? m->lp_held_max : m->nparams) * sizeof(uint16_t);
}

size_t dt_gpt2_lp_work_floats(const dt_gpt2_config *c, bool head) {
    /* a block's largest weight whole, twice; the head's weight rows a chunk
     * at a time, three times (dt_matmul_*_lp16: widened rows, their
     * gradient, a block of outputs): 1.5M floats a chunk, so the three stay
     * in a 32 MiB L3 (d6's 4096 rows ran 8% faster here than 8192, whose
     * 38 MiB did not fit), at least 1024 rows (narrower, sgemm slows) */
    size_t C = (size_t)c->channels, Vp = (size_t)c->padded_vocab_size, rows = ((size_t)1536 << 10) / C;
    if (rows < 1024) rows = 1024;
    if (rows > Vp) rows = Vp;
    if (!head) rows = 0;
    return 3 * rows * C > 8 * C * C ? 3 * rows * C : 8 * C * C;
}

dt_status dt_gpt2_set_precision(dt_gpt2 *m, dt_dtype t) {
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16)
        return dt_error(DT_ERR_ARG, "model: precision %s is not one of f32, bf16, f16", dt_dtype_name(t));
    if (m->acts) return dt_error(DT_ERR_ARG, "model: the precision is set before the first forward");
    dt_free_aligned(m->params_lp);
    dt_free_aligned(m->lp_work);
    m->params_lp = NULL;
    m->lp_work = NULL;
    m->prec = t;
    if (t == DT_F32) return DT_OK;
    m->params_lp = dt_alloc_aligned(m->nparams * sizeof(uint16_t));
    free(m->lp_cast);
    free(m->lp_current);
    m->lp_cast = calloc((size_t)m->ntab, 1);
    m->lp_current = calloc((size_t)m->ntab, 1);
    m->lp_work_floats = dt_gpt2_lp_work_floats(&m->cfg, m->ub == m->cfg.num_layers + 2);
    m->lp_work = dt_alloc_aligned(m->lp_work_floats * sizeof(float));
    if (!m->params_lp || !m->lp_work || !m->lp_cast || !m->lp_current) {
        dt_free_aligned(m->params_lp);
        dt_free_aligned(m->lp_work);
        free(m->lp_cast);
        free(m->lp_current);
        m->params_lp = NULL;
        m->lp_work = NULL;
        m->lp_cast = NULL;
        m->lp_current = NULL;
        m->prec = DT_F32;
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate the %s copy of %zu parameters", dt_dtype_name(t), m->nparams);
    }
    return DT_OK;
}

dt_dtype dt_gpt2_precision(const dt_gpt2 *m) { return m->prec; }

/* The generic view (dt_model) over GPT-2's own functions. */
static float *v_params(void *m) { return dt_gpt2_params(m); }
static float *v_grads(void *m) { return dt_gpt2_grads(m); }
static void v_storage(void *m, float *g) { dt_gpt2_set_grad_storage(m, g); }
static void v_hook(void *m, dt_unit_hook h, void *ctx) { dt_gpt2_set_grad_hook(m, h, ctx); }
static void v_unit_hooks(void *m, dt_unit_hook f, dt_unit_hook b, void *ctx) { dt_gpt2_set_unit_hooks(m, f, b, ctx); }
static void v_defer(void *m, int on) { dt_gpt2_set_defer_wte_rows(m, on); }
static void v_param_storage(void *m, float *p) { dt_gpt2_set_param_storage(m, p); }
static const float *v_input_grad(const void *m, const int32_t **tok, int *n) { return dt_gpt2_input_grad(m, tok, n); }
static void v_params_changed(void *m) { dt_gpt2_params_changed(m); }
static uint16_t *v_lp_copy(void *self, int caller_keeps, dt_dtype *t) {
    dt_gpt2 *m = self;
    *t = m->prec;
    if (m->params_lp) m->lp_external = caller_keeps;
    lp_forget(m); /* whoever kept it, it is cast again when the model keeps it */
    return m->params_lp;
}

void dt_gpt2_model(dt_gpt2 *m, dt_model *out) {
    *out = (dt_model){ .self = m, .kind = "gpt2", .tensors = m->tab, .ntensors = m->ntab, .nunits = m->cfg.num_layers + 2,
                       .nparams = m->nparams, .params = v_params, .grads = v_grads, .set_grad_storage = v_storage,
                       .set_grad_hook = v_hook, .set_unit_hooks = v_unit_hooks,
                       .defer_input_rows = m->i_wte >= 0 && m->tab[m->i_wte].input_rows && m->part.tp_size == 1 ? v_defer : NULL,
                       .input_grad = v_input_grad, .set_param_storage = v_param_storage, .lp_copy = v_lp_copy,
                       .params_changed = v_params_changed, .global_params = dt_gpt2_config_num_params(&m->cfg) };
}
