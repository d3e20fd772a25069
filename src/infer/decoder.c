/* The decoder: GPT-2's forward for inference over rows that each belong to
 * a sequence at its own position, with the keys and values of every
 * position kept per sequence. A cache slot is [layer][k, v][block of 16
 * positions][head], a head's keys in a block [head dim][position] and its
 * values [position][head dim], so a row's attention reads its layer's
 * keys, then its values, once, in order and as one run each; in f32, or in
 * bf16 beside int8 weights (the attention kernels widen it exactly). Every
 * operation works row by row with a fixed order of sums (the Linears through dt_panels_apply), so a row's
 * results do not depend on the other rows of its step. The Linears' weights
 * are packed (dt_panels, f32 or int8): copies, so nothing of the model is
 * read after dt_decoder_create, or in f32 the model's own memory packed in
 * place when the decoder takes the model (dt_decoder_create_taking). */
#include "dtrain/infer.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A Linear's weights [O, K], packed: f32, or int8 with a scale per output. */
typedef struct {
    dt_panels *p;
    int O, K;
} linear;

typedef struct {
    const float *ln1w, *ln1b, *qkvb, *projb, *ln2w, *ln2b, *fcb, *fcprojb;
    linear qkv, proj, fc, fcproj;
} layer;

struct dt_decoder {
    dt_gpt2_config cfg;
    dt_quant quant;
    /* tensor parallelism (a part's): this rank's Cl channels of attention in NHl heads, Fl hidden units of the MLP,
     * vocabulary rows [v0, v0 + Vv) of the real ones; the row-parallel sums over tp (NULL: one rank, all of it) */
    const dt_tp_ops *tp;
    int Cl, NHl, Fl, v0, Vv;
    const float *wpe, *lnfw, *lnfb;
    linear head; /* wte's real vocabulary rows this rank holds (the embeddings read its rows) */
    float *small; /* the copied LayerNorms, biases and position table */
    size_t small_used, small_cap;
    layer *layers;
    int nslots, max_rows;
    void *cache; /* f32, or bf16 for int8 weights (kv16) */
    bool kv16;
    size_t slot_elems;
    int *filled; /* per slot: positions the cache holds */
    float *x, *xn, *qkv, *att, *fch, *fcg, *mean, *rstd, *scores, *local_logits;
    int leader;              /* over a part: this rank sends each step's rows to the others, who follow */
    size_t weight_bytes;
    dt_gpt2 *owned; /* the model, when the decoder took it (dt_decoder_create_taking): its f32 Linears are packed in it */
};

static dt_status linear_apply(float *out, const float *x, const linear *l, const float *bias, int n) {
    dt_status st = dt_panels_apply(out, x, l->p, bias, n);
    return st ? dt_error(st, "decoder: %s", dt_last_error()) : DT_OK;
}

/* in_place: the decoder owns the model, and an f32 Linear is packed in the model's own memory (no second copy) */
static dt_status linear_make(linear *l, const float *w, int O, int K, dt_quant q, bool in_place, size_t *bytes) {
    *l = (linear){ NULL, O, K };
    if (O == 0) return DT_OK; /* a tensor-parallel rank past the real vocabulary holds no head rows */
    dt_status st = in_place && q == DT_QUANT_NONE ? dt_panels_pack_in_place((float *)w, O, K, &l->p)
                                                  : dt_panels_create(w, O, K, q == DT_QUANT_INT8, &l->p);
    if (st) return dt_error(st, "decoder: %s", dt_last_error());
    *bytes += dt_panels_bytes(l->p);
    return DT_OK;
}

static void linear_free(linear *l) { dt_panels_destroy(l->p); }

static const float *tensor(const dt_model *md, const char *name) {
    const dt_tensor_info *t = dt_model_find(md, name);
    return t ? md->params(md->self) + t->offset : NULL;
}

/* A small tensor's copy in d->small (sized by small_floats), or NULL when the model lacks it. */
static const float *keep(dt_decoder *d, const dt_model *md, const char *name) {
    const dt_tensor_info *t = dt_model_find(md, name);
    if (!t || !d->small || d->small_used + t->count > d->small_cap) return NULL;
    float *at = d->small + d->small_used;
    memcpy(at, md->params(md->self) + t->offset, t->count * sizeof(float));
    d->small_used += t->count;
    return at;
}

/* What keep copies: per layer two LayerNorms, qkv's, the projections' and fc's biases; wpe; the last LayerNorm. */
static size_t small_floats(const dt_decoder *d) {
    size_t C = (size_t)d->cfg.channels;
    return (size_t)d->cfg.num_layers * (6 * C + 3 * (size_t)d->Cl + (size_t)d->Fl) + (size_t)d->cfg.max_seq_len * C + 2 * C;
}

static dt_status load_layer(dt_decoder *d, const dt_model *md, int l) {
    const float *p[12];
    static const char *names[12] = { "ln1w", "ln1b", "qkvw", "qkvb", "attprojw", "attprojb",
                                     "ln2w", "ln2b", "fcw",  "fcb",  "fcprojw",  "fcprojb" };
    for (int i = 0; i < 12; i++) {
        char name[48];
        snprintf(name, sizeof name, "h.%d.%s", l, names[i]);
        bool weight = i == 2 || i == 4 || i == 8 || i == 10; /* the Linears' (quantized, or read in place) */
        if (!(p[i] = weight ? tensor(md, name) : keep(d, md, name)))
            return dt_error(DT_ERR_ARG, "decoder: the model has no tensor %s", name);
    }
    int C = d->cfg.channels;
    layer *y = &d->layers[l];
    *y = (layer){ .ln1w = p[0], .ln1b = p[1], .qkvb = p[3], .projb = p[5], .ln2w = p[6], .ln2b = p[7], .fcb = p[9], .fcprojb = p[11] };
    /* column-parallel qkv and fc hold this rank's outputs, row-parallel projections its inputs */
    bool own = d->owned != NULL;
    dt_status st = linear_make(&y->qkv, p[2], 3 * d->Cl, C, d->quant, own, &d->weight_bytes);
    if (!st) st = linear_make(&y->proj, p[4], C, d->Cl, d->quant, own, &d->weight_bytes);
    if (!st) st = linear_make(&y->fc, p[8], d->Fl, C, d->quant, own, &d->weight_bytes);
    if (!st) st = linear_make(&y->fcproj, p[10], C, d->Fl, d->quant, own, &d->weight_bytes);
    return st;
}

/* Positions a slot has room for: max_seq_len rounded up to whole key blocks. */
static size_t padded_positions(const dt_decoder *d) {
    return ((size_t)d->cfg.max_seq_len + DT_KEY_BLOCK - 1) / DT_KEY_BLOCK * DT_KEY_BLOCK;
}

/* A cached key or value element's bytes: int8 weights keep them in bf16 (half the bytes a step reads; llama.cpp keeps
 * f16 by default), f32 weights in f32, whose tokens match the training forward's and HF's bit for bit. */
static size_t cache_elem(const dt_decoder *d) { return d->kv16 ? sizeof(uint16_t) : sizeof(float); }

static dt_status alloc_buffers(dt_decoder *d) {
    const dt_gpt2_config *c = &d->cfg;
    size_t R = (size_t)d->max_rows, C = (size_t)c->channels, T = (size_t)c->max_seq_len;
    d->slot_elems = (size_t)c->num_layers * 2 * (size_t)d->Cl * padded_positions(d);
    /* calloc: a slot's pages are touched only as its positions fill */
    d->cache = calloc((size_t)d->nslots * d->slot_elems, cache_elem(d));
    d->filled = calloc((size_t)d->nslots, sizeof(int));
    d->x = malloc(sizeof(float) * R * C);
    d->xn = malloc(sizeof(float) * R * C);
    d->qkv = malloc(sizeof(float) * R * 3 * (size_t)d->Cl);
    d->att = malloc(sizeof(float) * R * (size_t)d->Cl);
    d->fch = malloc(sizeof(float) * R * (size_t)d->Fl);
    d->fcg = malloc(sizeof(float) * R * (size_t)d->Fl);
    d->local_logits = d->tp ? malloc(sizeof(float) * R * (size_t)(d->Vv ? d->Vv : 1)) : NULL;
    d->mean = malloc(sizeof(float) * R);
    d->rstd = malloc(sizeof(float) * R);
    d->scores = calloc(R * (size_t)c->num_heads * (T + 1), sizeof(float)); /* a head's scores and their sum */
    if (!d->cache || !d->filled || !d->x || !d->xn || !d->qkv || !d->att || !d->fch || !d->fcg || !d->mean || !d->rstd || !d->scores ||
        (d->tp && !d->local_logits))
        return dt_error(DT_ERR_NOMEM, "decoder: out of memory for %d cache slots of %d positions (%.1f MB) and %d rows", d->nslots,
                        c->max_seq_len, (double)dt_decoder_cache_bytes(d) / 1e6, d->max_rows);
    return DT_OK;
}

/* What this rank holds: every unit, whole or as a tensor-parallel part (not a pipeline stage, nor a sequence's share). */
static dt_status take_part(dt_decoder *d, const dt_gpt2 *m, const dt_model *md) {
    const dt_gpt2_part *p = dt_gpt2_get_part(m);
    const dt_gpt2_config *c = &d->cfg;
    int a, b;
    dt_gpt2_units(m, &a, &b);
    if (a != 0 || b != c->num_layers + 2 || p->nchunks > 0 || p->sp || p->cp_size > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "decoder: it runs whole models or their tensor-parallel parts (not pipeline stages, "
                        "sequence or context parallelism)");
    int tp = p->tp_size > 1 ? p->tp_size : 1;
    d->tp = tp > 1 ? p->tp : NULL;
    if (tp > 1 && !d->tp) return dt_error(DT_ERR_ARG, "decoder: a tensor-parallel part without its collectives");
    d->Cl = c->channels / tp;
    d->NHl = c->num_heads / tp;
    d->Fl = 4 * c->channels / tp;
    const dt_tensor_info *wte = dt_model_find(md, "wte");
    if (!wte) return dt_error(DT_ERR_ARG, "decoder: the model has no wte");
    d->v0 = tp > 1 ? wte->slice.offset : 0;
    int real = c->vocab_size - d->v0;
    d->Vv = real < 0 ? 0 : real < wte->shape[0] ? real : wte->shape[0];
    return DT_OK;
}

/* take: m becomes the decoder's (destroyed with it, or at once for int8, whose copies need nothing of it; on a
 * failure too), and its f32 Linears are packed where they lie. */
static dt_status make(dt_gpt2 *m, bool take, dt_quant q, int nslots, int max_rows, dt_decoder **out) {
    *out = NULL;
    dt_status st;
    const dt_family *family = dt_gpt2_get_config(m)->family;
    st = nslots < 1 || max_rows < 1 ? dt_error(DT_ERR_ARG, "decoder: %d slots and %d rows a step (each must be >= 1)", nslots, max_rows)
         : family && family != dt_family_find("gpt2")
             ? dt_error(DT_ERR_UNSUPPORTED, "decoder: decoding a %s model (KV cache of its K/V heads, rotary positions) is not built yet; "
                        "it decodes GPT-2", dt_family_name(family))
             : DT_OK;
    dt_decoder *d = st ? NULL : calloc(1, sizeof *d);
    if (!d) {
        if (take) dt_gpt2_destroy(m);
        return st ? st : dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    }
    d->owned = take ? m : NULL;
    d->cfg = *dt_gpt2_get_config(m);
    d->quant = q;
    /* int8 weights keep the cache in bf16; DTRAIN_KV_CACHE=f32 keeps f32 (a debugging switch: the test of the
     * rounding compares the two) */
    const char *kv = getenv("DTRAIN_KV_CACHE");
    d->kv16 = q == DT_QUANT_INT8 && !(kv && !strcmp(kv, "f32"));
    d->nslots = nslots;
    d->max_rows = max_rows;
    d->layers = calloc((size_t)d->cfg.num_layers, sizeof(layer));
    dt_model md;
    dt_gpt2_model((dt_gpt2 *)m, &md);
    if ((st = take_part(d, m, &md))) { dt_decoder_destroy(d); return st; }
    d->small_cap = small_floats(d);
    d->small = malloc(d->small_cap * sizeof(float));
    const float *wte = tensor(&md, "wte");
    d->wpe = keep(d, &md, "wpe");
    d->lnfw = keep(d, &md, "lnfw");
    d->lnfb = keep(d, &md, "lnfb");
    st = d->layers && d->small ? DT_OK : dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    if (!st && (!wte || !d->wpe || !d->lnfw || !d->lnfb)) st = dt_error(DT_ERR_ARG, "decoder: the model lacks wte, wpe or lnf");
    for (int l = 0; !st && l < d->cfg.num_layers; l++) st = load_layer(d, &md, l);
    if (!st) st = linear_make(&d->head, wte, d->Vv, d->cfg.channels, q, take, &d->weight_bytes);
    if (!st) st = alloc_buffers(d);
    if (st) { dt_decoder_destroy(d); return st; }
    if (take && q != DT_QUANT_NONE) { dt_gpt2_destroy(m); d->owned = NULL; }
    *out = d;
    return DT_OK;
}

dt_status dt_decoder_create(const dt_gpt2 *m, dt_quant q, int nslots, int max_rows, dt_decoder **out) {
    return make((dt_gpt2 *)m, false, q, nslots, max_rows, out); /* copies only: m is read, never written */
}

dt_status dt_decoder_create_taking(dt_gpt2 *m, dt_quant q, int nslots, int max_rows, dt_decoder **out) {
    return make(m, true, q, nslots, max_rows, out);
}

void dt_decoder_destroy(dt_decoder *d) {
    if (!d) return;
    for (int l = 0; d->layers && l < d->cfg.num_layers; l++) {
        linear_free(&d->layers[l].qkv);
        linear_free(&d->layers[l].proj);
        linear_free(&d->layers[l].fc);
        linear_free(&d->layers[l].fcproj);
    }
    linear_free(&d->head);
    free(d->small);
    free(d->layers);
    free(d->cache);
    free(d->filled);
    free(d->x); free(d->xn); free(d->qkv); free(d->att); free(d->fch); free(d->fcg);
    free(d->mean); free(d->rstd); free(d->scores); free(d->local_logits);
    dt_gpt2_destroy(d->owned); /* after the panels that may borrow its memory */
    free(d);
}

const dt_gpt2_config *dt_decoder_config(const dt_decoder *d) { return &d->cfg; }
int dt_decoder_slots(const dt_decoder *d) { return d->nslots; }
int dt_decoder_max_rows(const dt_decoder *d) { return d->max_rows; }
size_t dt_decoder_weight_bytes(const dt_decoder *d) { return d->weight_bytes; }
size_t dt_decoder_cache_bytes(const dt_decoder *d) { return (size_t)d->nslots * d->slot_elems * cache_elem(d); }

/* Block b of head h's keys (kv 0: [head dim][position], dt_attend_scores's) or values (1: [position][head dim]) in
 * layer l of slot s. A layer's keys are [block][head], then its values the same: one row's heads, read block by
 * block, are one run of memory (each head's run alone was 37 KB at 144 positions, heads 256 KB apart, and read
 * 25-32 GB/s against 44 for one stream). */
static size_t cache_at(const dt_decoder *d, int s, int l, int kv, int b, int h) {
    size_t hd = (size_t)(d->cfg.channels / d->cfg.num_heads), blocks = padded_positions(d) / DT_KEY_BLOCK;
    return (size_t)s * d->slot_elems + ((((size_t)l * 2 + kv) * blocks + b) * d->NHl + h) * DT_KEY_BLOCK * hd;
}

/* Element i of the cache set to x (rounded to nearest even in bf16); a head's scores against, and sum of, cached
 * keys and values at element at, in the cache's element type. */
static void cache_put(dt_decoder *d, size_t i, float x) {
    if (d->kv16) ((uint16_t *)d->cache)[i] = dt_f32_to_bf16(x);
    else ((float *)d->cache)[i] = x;
}

dt_status dt_decoder_cached(const dt_decoder *d, int slot, int layer, int pos, float *k, float *v, int *n) {
    int hd = d->cfg.channels / d->cfg.num_heads;
    *n = d->NHl * hd;
    if (slot < 0 || slot >= d->nslots || layer < 0 || layer >= d->cfg.num_layers || pos < 0 || (size_t)pos >= padded_positions(d))
        return dt_error(DT_ERR_ARG, "decoder: no slot %d, layer %d, position %d", slot, layer, pos);
    int b = pos / DT_KEY_BLOCK, i = pos % DT_KEY_BLOCK;
    for (int h = 0; h < d->NHl; h++)
        for (int j = 0; j < hd; j++) {
            size_t kat = cache_at(d, slot, layer, 0, b, h) + i + (size_t)j * DT_KEY_BLOCK;
            size_t vat = cache_at(d, slot, layer, 1, b, h) + (size_t)i * hd + j;
            k[h * hd + j] = d->kv16 ? dt_bf16_to_f32(((const uint16_t *)d->cache)[kat]) : ((const float *)d->cache)[kat];
            v[h * hd + j] = d->kv16 ? dt_bf16_to_f32(((const uint16_t *)d->cache)[vat]) : ((const float *)d->cache)[vat];
        }
    return DT_OK;
}

static void cache_scores(const dt_decoder *d, float *s, const float *q, size_t at, int hd, int n) {
    if (d->kv16) dt_attend_scores_bf16(s, q, (const uint16_t *)d->cache + at, hd, n);
    else dt_attend_scores(s, q, (const float *)d->cache + at, hd, n);
}

static void cache_sum(const dt_decoder *d, float *y, const float *w, size_t at, int n, int hd) {
    if (d->kv16) dt_weighted_sum_bf16(y, w, (const uint16_t *)d->cache + at, n, hd);
    else dt_weighted_sum(y, w, (const float *)d->cache + at, n, hd);
}

/* Row r's attention over heads [h0, h1): the scores, then the sums of values, each block by block over those
 * heads, so the cache is read as it lies. Every score is its own dot product and every sum one chain in position
 * order (dt_weighted_sum carries it from block to block through y), so the bits are those of one head at a time. */
static void attend_heads(dt_decoder *d, int l, const dt_infer_row *row, int r, int h0, int h1) {
    /* ld: a head's scores, then their sum */
    int C = d->Cl, NH = d->NHl, hd = d->cfg.channels / d->cfg.num_heads, ld = d->cfg.max_seq_len + 1, npos = row->pos + 1;
    const float *q = d->qkv + (size_t)r * 3 * C;
    float *s = d->scores + (size_t)r * NH * ld, *y = d->att + (size_t)r * C, scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < npos; t += DT_KEY_BLOCK)
        for (int h = h0; h < h1; h++)
            cache_scores(d, s + (size_t)h * ld + t, q + h * hd, cache_at(d, row->slot, l, 0, t / DT_KEY_BLOCK, h), hd,
                         npos - t < DT_KEY_BLOCK ? npos - t : DT_KEY_BLOCK);
    for (int h = h0; h < h1; h++) {
        float *sh = s + (size_t)h * ld, mx = -INFINITY, sum = 0;
        for (int t = 0; t < npos; t++) {
            sh[t] *= scale;
            if (sh[t] > mx) mx = sh[t];
        }
        for (int t = 0; t < npos; t++) { sh[t] = expf(sh[t] - mx); sum += sh[t]; }
        sh[ld - 1] = sum;
    }
    memset(y + h0 * hd, 0, sizeof(float) * (size_t)(h1 - h0) * hd);
    for (int t = 0; t < npos; t += DT_KEY_BLOCK)
        for (int h = h0; h < h1; h++)
            cache_sum(d, y + h * hd, s + (size_t)h * ld + t, cache_at(d, row->slot, l, 1, t / DT_KEY_BLOCK, h),
                      npos - t < DT_KEY_BLOCK ? npos - t : DT_KEY_BLOCK, hd);
    for (int h = h0; h < h1; h++) {
        float inv = 1.0f / s[(size_t)h * ld + ld - 1];
        for (int j = 0; j < hd; j++) y[h * hd + j] *= inv;
    }
}

/* Causal attention of each row over its slot's positions 0..pos (the rows' own keys and values stored first). */
static void attention(dt_decoder *d, int l, const dt_infer_row *rows, int n) {
    int C = d->Cl, NH = d->NHl, hd = d->cfg.channels / d->cfg.num_heads;
    for (int r = 0; r < n; r++)
        for (int h = 0; h < NH; h++) {
            const float *q = d->qkv + (size_t)r * 3 * C + h * hd;
            int b = rows[r].pos / DT_KEY_BLOCK, i = rows[r].pos % DT_KEY_BLOCK;
            size_t kb = cache_at(d, rows[r].slot, l, 0, b, h) + i, vb = cache_at(d, rows[r].slot, l, 1, b, h) + (size_t)i * hd;
            for (int j = 0; j < hd; j++) {
                cache_put(d, kb + (size_t)j * DT_KEY_BLOCK, q[C + j]);
                cache_put(d, vb + j, q[2 * C + j]);
            }
        }
    /* each row's heads in as few groups as keep every thread busy: a group is one run of the cache */
    int threads = dt_kernels_threads(), groups = n >= threads ? 1 : (threads + n - 1) / n;
    if (groups > NH) groups = NH;
    int per = (NH + groups - 1) / groups;
    #pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n * groups; i++) {
        int r = i / groups, h0 = i % groups * per, h1 = h0 + per < NH ? h0 + per : NH;
        if (h0 < h1) attend_heads(d, l, &rows[r], r, h0, h1);
    }
}

static void add_rows(float *x, const float *y, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] += y[i];
}

/* A row-parallel Linear: each rank's partial products summed over the group, then the (whole) bias added once. */
static dt_status row_parallel(dt_decoder *d, float *out, const float *x, const linear *w, const float *bias, int n) {
    if (!d->tp) return linear_apply(out, x, w, bias, n);
    dt_status st = linear_apply(out, x, w, NULL, n);
    if (!st) st = d->tp->allreduce(d->tp->ctx, out, (size_t)n * w->O, 0);
    for (int r = 0; !st && r < n; r++)
        for (int o = 0; o < w->O; o++) out[(size_t)r * w->O + o] += bias[o];
    return st;
}

static dt_status block(dt_decoder *d, int l, const dt_infer_row *rows, int n) {
    const layer *y = &d->layers[l];
    int C = d->cfg.channels;
    size_t nC = (size_t)n * C;
    dt_layernorm_forward(d->xn, d->mean, d->rstd, d->x, y->ln1w, y->ln1b, n, C);
    dt_status st = linear_apply(d->qkv, d->xn, &y->qkv, y->qkvb, n);
    if (st) return st;
    attention(d, l, rows, n);
    if ((st = row_parallel(d, d->xn, d->att, &y->proj, y->projb, n))) return st;
    add_rows(d->x, d->xn, nC);
    dt_layernorm_forward(d->xn, d->mean, d->rstd, d->x, y->ln2w, y->ln2b, n, C);
    if ((st = linear_apply(d->fch, d->xn, &y->fc, y->fcb, n))) return st;
    dt_gelu_rows(d->fcg, d->fch, n, d->Fl);
    if ((st = row_parallel(d, d->xn, d->fcg, &y->fcproj, y->fcprojb, n))) return st;
    add_rows(d->x, d->xn, nC);
    return DT_OK;
}

static dt_status check_rows(dt_decoder *d, const dt_infer_row *rows, int n) {
    const dt_gpt2_config *c = &d->cfg;
    if (n < 0 || n > d->max_rows) return dt_error(DT_ERR_ARG, "decoder: %d rows in a step, at most %d", n, d->max_rows);
    for (int r = 0; r < n; r++) {
        const dt_infer_row *w = &rows[r];
        if (w->slot < 0 || w->slot >= d->nslots) return dt_error(DT_ERR_ARG, "decoder: row %d: slot %d of %d", r, w->slot, d->nslots);
        if (w->pos < 0 || w->pos >= c->max_seq_len)
            return dt_error(DT_ERR_ARG, "decoder: row %d: position %d beyond the context of %d", r, w->pos, c->max_seq_len);
        if (w->token < 0 || w->token >= c->vocab_size)
            return dt_error(DT_ERR_ARG, "decoder: row %d: token %d outside the vocabulary of %d", r, (int)w->token, c->vocab_size);
        /* a slot's rows in order, each at most one past what the cache holds (earlier rows of the step count) */
        int held = d->filled[w->slot];
        for (int e = r - 1; e >= 0; e--)
            if (rows[e].slot == w->slot) { held = rows[e].pos + 1; break; }
        if (w->pos > held)
            return dt_error(DT_ERR_ARG, "decoder: row %d: position %d of slot %d, whose cache holds only %d", r, w->pos, w->slot, held);
    }
    for (int r = 0; r < n; r++) d->filled[rows[r].slot] = rows[r].pos + 1;
    return DT_OK;
}

/* The rows' token embeddings (a tensor-parallel rank holds some vocabulary rows: the group's sum has each token's) plus
 * their positions'. */
static dt_status embed(dt_decoder *d, const dt_infer_row *rows, int n) {
    int C = d->cfg.channels;
    for (int r = 0; r < n; r++) {
        int v = rows[r].token - d->v0;
        float *x = d->x + (size_t)r * C;
        bool mine = v >= 0 && v < d->Vv;
        if (mine) dt_panels_row(d->head.p, v, x); /* the row as the head's dot products read it (int8 dequantized) */
        else memset(x, 0, sizeof(float) * (size_t)C);
    }
    dt_status st = d->tp ? d->tp->allreduce(d->tp->ctx, d->x, (size_t)n * C, 0) : DT_OK;
    for (int r = 0; !st && r < n; r++) {
        const float *pe = d->wpe + (size_t)rows[r].pos * C;
        for (int c = 0; c < C; c++) d->x[(size_t)r * C + c] += pe[c];
    }
    return st;
}

/* The head for m rows: logits [m, V]; a tensor-parallel rank's vocabulary columns, the rest from the others (zeros
 * summed: every rank ends with the same bits). */
static dt_status head(dt_decoder *d, int m, float *logits) {
    int V = d->cfg.vocab_size;
    if (!d->tp) return linear_apply(logits, d->xn, &d->head, NULL, m);
    dt_status st = d->Vv ? linear_apply(d->local_logits, d->xn, &d->head, NULL, m) : DT_OK;
    if (st) return st;
    memset(logits, 0, sizeof(float) * (size_t)m * V);
    for (int r = 0; r < m; r++)
        memcpy(logits + (size_t)r * V + d->v0, d->local_logits + (size_t)r * d->Vv, sizeof(float) * (size_t)d->Vv);
    return d->tp->allreduce(d->tp->ctx, logits, (size_t)m * V, 0);
}

static dt_status step(dt_decoder *d, const dt_infer_row *rows, int n, float *logits) {
    dt_status st = check_rows(d, rows, n);
    int C = d->cfg.channels;
    if (st) return st;
    st = embed(d, rows, n);
    for (int l = 0; !st && l < d->cfg.num_layers; l++) st = block(d, l, rows, n);
    if (st) return dt_error(st, "decoder, tensor-parallel sum: %s", dt_last_error());
    /* the head only for the rows that want logits: the rest are gathered out */
    int m = 0;
    for (int r = 0; r < n; r++)
        if (rows[r].logits) memmove(d->x + (size_t)m++ * C, d->x + (size_t)r * C, sizeof(float) * (size_t)C);
    if (!m) return DT_OK;
    dt_layernorm_forward(d->xn, d->mean, d->rstd, d->x, d->lnfw, d->lnfb, m, C);
    if ((st = head(d, m, logits))) return dt_error(st, "decoder, tensor-parallel logits: %s", dt_last_error());
    return DT_OK;
}

/* A step's rows as int32 words (dt_infer_row is four ints) for the group's broadcast. */
_Static_assert(sizeof(dt_infer_row) == 4 * sizeof(int32_t), "dt_infer_row is four int32 words");

dt_status dt_decoder_step(dt_decoder *d, const dt_infer_row *rows, int n, float *logits) {
    if (d->leader) {
        int32_t head = n;
        dt_status st = d->tp->broadcast(d->tp->ctx, &head, 1);
        if (!st && n > 0) st = d->tp->broadcast(d->tp->ctx, (int32_t *)rows, (size_t)n * 4);
        if (st) return dt_error(st, "decoder, sending a step's rows to the other tensor-parallel ranks: %s", dt_last_error());
    }
    return n > 0 ? step(d, rows, n, logits) : DT_OK;
}

dt_status dt_decoder_lead(dt_decoder *d) {
    if (!d->tp) return dt_error(DT_ERR_ARG, "decoder: only a tensor-parallel part has others to lead");
    d->leader = 1;
    return DT_OK;
}

dt_status dt_decoder_release(dt_decoder *d) {
    int32_t head = -1;
    if (!d->leader) return DT_OK;
    d->leader = 0;
    return d->tp->broadcast(d->tp->ctx, &head, 1);
}

dt_status dt_decoder_follow(dt_decoder *d) {
    if (!d->tp) return dt_error(DT_ERR_ARG, "decoder: only a tensor-parallel part follows a leader");
    dt_infer_row *rows = malloc(sizeof *rows * (size_t)d->max_rows);
    float *logits = malloc(sizeof(float) * (size_t)d->max_rows * (size_t)d->cfg.vocab_size);
    dt_status st = rows && logits ? DT_OK : dt_error(DT_ERR_NOMEM, "decoder: out of memory to follow");
    for (;;) {
        int32_t head = 0;
        if (!st) st = d->tp->broadcast(d->tp->ctx, &head, 1);
        if (st || head < 0) break;
        if (head > d->max_rows) { st = dt_error(DT_ERR_MISMATCH, "decoder: the leader sent %d rows, more than %d", (int)head, d->max_rows); break; }
        if (head > 0 && !(st = d->tp->broadcast(d->tp->ctx, (int32_t *)rows, (size_t)head * 4))) st = step(d, rows, head, logits);
    }
    free(rows);
    free(logits);
    if (st) return dt_error(st, "decoder, following the leading tensor-parallel rank: %s", dt_last_error());
    return DT_OK;
}

dt_status dt_quant_parse(const char *s, dt_quant *out) {
    if (!strcmp(s, "none") || !strcmp(s, "f32")) *out = DT_QUANT_NONE;
    else if (!strcmp(s, "int8")) *out = DT_QUANT_INT8;
    else return dt_error(DT_ERR_ARG, "--quantize %s: expected int8 (or none)", s);
    return DT_OK;
}

const char *dt_quant_name(dt_quant q) { return q == DT_QUANT_INT8 ? "int8" : "f32"; }
