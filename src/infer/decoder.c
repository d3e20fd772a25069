/* The decoder's making: a model program's block ops and weights as the decoder runs them (decoder_step.c). The
 * ops and each value's width come from the program (dt_program_get_view), so any family the trainer runs decodes
 * from the same spec. The Linears' weights are packed (dt_panels, f32 or int8): copies, so nothing of the model is
 * read after dt_decoder_create, or in f32 the model's own memory packed in place when the decoder takes the model
 * (dt_decoder_create_taking). A cache slot holds each layer's keys and values of this rank's K/V heads only. */
#include "decoder_internal.h"
#include "dtrain/kernels.h"

#include <stdlib.h>
#include <string.h>

/* in_place: the decoder owns the model, and an f32 Linear is packed in the model's own memory (no second copy) */
static dt_status linear_make(linear *l, const float *w, int O, int K, dt_quant q, bool in_place, size_t *bytes) {
    *l = (linear){ NULL, O, K };
    if (O == 0) return DT_OK; /* a tensor-parallel rank past the real vocabulary holds no head rows */
    dt_status st = in_place && q == DT_QUANT_NONE ? dt_panels_pack_in_place((float *)w, O, K, &l->p)
                                                  : dt_panels_create(w, O, K, q == DT_QUANT_INT8, &l->p);
    if (st) return dt_error(st, "decoder: %s", dt_last_error());
    if (bytes) *bytes += dt_panels_bytes(l->p);
    return DT_OK;
}

static void linear_free(linear *l) { dt_panels_destroy(l->p); }

/* n floats of the model from t's first element copied into d->small (sized by small_floats); NULL without t. */
static const float *keep(dt_decoder *d, const float *params, const dt_tensor_info *t, size_t n) {
    if (!t || d->small_used + n > d->small_cap) return NULL;
    float *at = d->small + d->small_used;
    memcpy(at, params + t->offset, n * sizeof(float));
    d->small_used += n;
    return at;
}

/* What keep copies: each layer's norms and Linear biases, the position table, the last norm. */
static size_t small_floats(const dt_decoder *d, const dt_program *p, const dt_program_view *v) {
    size_t n = (v->positions ? v->positions->count : 0) + v->norm_w->count + (v->norm_b ? v->norm_b->count : 0);
    for (int l = 0; l < d->cfg.num_layers; l++)
        for (int k = 0; k < d->nops; k++) {
            const dt_op_spec *s = &d->ops[k].s;
            if (!dt_decoder_runs(d, l, k)) continue;
            if (s->kind == DT_OP_NORM) n += dt_program_block_tensor(p, l, s->w)->count * (s->b >= 0 ? 2 : 1);
            else if (s->kind == DT_OP_LINEAR && s->b >= 0) n += (size_t)d->ops[k].width_out;
            else if (s->kind == DT_OP_HEADNORM) n += 2 * (size_t)d->hd;
        }
    return n;
}

/* Layer l's norms (copied), Linears (packed, biases copied) from the program p (its parameters params). */
static dt_status load_layer(dt_decoder *d, dt_program *p, const float *params, int l) {
    bool own = d->owned != NULL;
    for (int k = 0; k < d->nops; k++) {
        const dt_program_op *o = &d->ops[k];
        op_weights *w = &d->w[(size_t)l * d->nops + k];
        if (!dt_decoder_runs(d, l, k)) continue;
        const dt_tensor_info *wt = o->s.w >= 0 ? dt_program_block_tensor(p, l, o->s.w) : NULL;
        const dt_tensor_info *bt = o->s.b >= 0 ? dt_program_block_tensor(p, l, o->s.b) : NULL;
        if (o->s.kind == DT_OP_NORM) {
            w->w = keep(d, params, wt, wt ? wt->count : 0);
            w->b = bt ? keep(d, params, bt, bt->count) : NULL;
            if (!w->w || (bt && !w->b)) return dt_error(DT_ERR_ARG, "decoder: layer %d's norm is not in the model", l);
        } else if (o->s.kind == DT_OP_LINEAR) {
            if (!wt) return dt_error(DT_ERR_ARG, "decoder: layer %d's Linear is not in the model", l);
            w->row = d->tp && wt->split == DT_SPLIT_ROW;
            w->b = bt ? keep(d, params, bt, (size_t)o->width_out) : NULL;
            /* the parts sit side by side (the program checks): one panel of all their rows */
            dt_status st = linear_make(&w->lin, params + wt->offset, o->width_out, o->width_in, d->quant, own, &d->weight_bytes);
            if (st) return st;
        } else if (o->s.kind == DT_OP_HEADNORM) { /* the queries' scale in w, the keys' in b */
            const dt_tensor_info *kt = dt_program_block_tensor(p, l, o->s.w + 1);
            w->w = keep(d, params, wt, (size_t)d->hd);
            w->b = keep(d, params, kt, (size_t)d->hd);
            if (!w->w || !w->b) return dt_error(DT_ERR_ARG, "decoder: layer %d's head norm is not in the model", l);
        } else if (o->s.kind == DT_OP_MOE) {
            dt_status st = dt_decoder_moe_load(d, p, params, l, k, &w->moe);
            if (st) return st;
        }
    }
    return DT_OK;
}

size_t dt_decoder_padded_positions(const dt_decoder *d) {
    return ((size_t)d->cfg.max_seq_len + DT_KEY_BLOCK - 1) / DT_KEY_BLOCK * DT_KEY_BLOCK;
}

/* int8 weights keep the cache in bf16 (half the bytes a step reads; llama.cpp keeps f16 by default), f32 weights in
 * f32, whose tokens match the training forward's and HF's bit for bit. */
size_t dt_decoder_cache_elem(const dt_decoder *d) { return d->kv16 ? sizeof(uint16_t) : sizeof(float); }

/* The block's values share buffers where their lives do not meet (a value lives from the op that writes it to the
 * last that reads it; an op's input and output never share): fewer rows pass through the cache between ops. GPT-2's
 * prefill in int8 ran 6% slower with a buffer a value (11 of them, against the hand-written decoder's 6). The stream
 * in and out keep their own (swapped between blocks). */
static dt_status share_values(dt_decoder *d, size_t R) {
    int nv = d->nvalues, *last = malloc(sizeof(int) * (size_t)nv), *owner = malloc(sizeof(int) * (size_t)nv);
    int *until = malloc(sizeof(int) * (size_t)(nv + 2)), *width = calloc((size_t)nv + 2, sizeof(int));
    d->val = calloc((size_t)nv, sizeof *d->val);
    d->bufs = calloc((size_t)nv + 2, sizeof *d->bufs);
    bool ok = last && owner && until && width && d->val && d->bufs;
    for (int v = 0; ok && v < nv; v++) last[v] = -1, owner[v] = v == DT_V_IN || v == DT_V_OUT ? v : -1;
    for (int k = 0; ok && k < d->nops; k++) {
        const dt_op_spec *s = &d->ops[k].s;
        last[s->in] = k;
        if (s->kind == DT_OP_ADD) last[s->in2] = k;
    }
    d->nbufs = 2;
    width[DT_V_IN] = width[DT_V_OUT] = d->vw[DT_V_IN];
    for (int k = 0; ok && k < d->nops; k++) {
        int v = d->ops[k].s.out, b = 2;
        if (owner[v] >= 0) continue; /* (written by another kind of layer's op too: its first writer's buffer) */
        while (b < d->nbufs && until[b] >= k) b++;
        if (b == d->nbufs) d->nbufs++;
        owner[v] = b;
        until[b] = last[v];
        if (d->vw[v] > width[b]) width[b] = d->vw[v];
    }
    for (int b = 0; ok && b < d->nbufs; b++) ok = (d->bufs[b] = malloc(sizeof(float) * R * (size_t)(width[b] ? width[b] : 1))) != NULL;
    for (int v = 0; ok && v < nv; v++) ok = owner[v] >= 0 && (d->val[v] = d->bufs[owner[v]]) != NULL;
    free(last); free(owner); free(until); free(width);
    return ok ? DT_OK : dt_error(DT_ERR_NOMEM, "decoder: out of memory for a block's values of %zu rows", R);
}

static dt_status alloc_buffers(dt_decoder *d) {
    const dt_lm_config *c = &d->cfg;
    size_t R = (size_t)d->max_rows, T = (size_t)c->max_seq_len;
    d->slot_elems = (size_t)c->num_layers * 2 * (size_t)d->NKVl * d->hd * dt_decoder_padded_positions(d);
    /* calloc: a slot's pages are touched only as its positions fill */
    d->cache = calloc((size_t)d->nslots * d->slot_elems, dt_decoder_cache_elem(d));
    d->filled = calloc((size_t)d->nslots, sizeof(int));
    bool ok = d->cache && d->filled && !share_values(d, R);
    d->local_logits = d->tp ? malloc(sizeof(float) * R * (size_t)(d->Vv ? d->Vv : 1)) : NULL;
    d->stats = malloc(sizeof(float) * R * (size_t)(d->NHl + d->NKVl > 2 ? d->NHl + d->NKVl : 2)); /* a norm's, or a head norm's a head */
    d->pos = malloc(sizeof(int32_t) * R);
    d->scores = calloc(R * (size_t)d->NHl * (T + 1), sizeof(float)); /* a head's scores and their sum */
    if (!ok || !d->stats || !d->pos || !d->scores || (d->tp && !d->local_logits))
        return dt_error(DT_ERR_NOMEM, "decoder: out of memory for %d cache slots of %d positions (%.1f MB) and %d rows", d->nslots,
                        c->max_seq_len, (double)dt_decoder_cache_bytes(d) / 1e6, d->max_rows);
    return c->experts ? dt_decoder_moe_alloc(d) : DT_OK;
}

/* What this rank holds: every unit, whole or as a tensor-parallel part (not a pipeline stage, nor a sequence's
 * share); the program's ops, widths, heads and frequencies copied. */
static dt_status take_shape(dt_decoder *d, dt_program *p, const dt_program_view *v) {
    dt_model mv;
    dt_program_model(p, &mv); /* its part: how the rank's model is split */
    const dt_model_part *part = mv.part;
    const dt_lm_config *c = &d->cfg;
    if (part->ua != 0 || part->ub != c->num_layers + 2 || part->nchunks > 0 || part->sp || part->cp_size > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "decoder: it runs whole models or their tensor-parallel parts (not pipeline stages, "
                        "sequence or context parallelism)");
    int tp = part->tp_size > 1 ? part->tp_size : 1;
    d->tp = tp > 1 ? part->tp : NULL;
    if (tp > 1 && !d->tp) return dt_error(DT_ERR_ARG, "decoder: a tensor-parallel part without its collectives");
    if (!v->embed || !v->norm_w) return dt_error(DT_ERR_ARG, "decoder: the model lacks its token table or its last norm");
    d->nops = v->nops;
    d->nvalues = v->nvalues;
    d->rms = v->rms;
    d->rotary = v->rotary;
    d->NHl = v->heads;
    d->NKVl = v->kv_heads;
    d->hd = v->head_dim;
    d->ops = malloc(sizeof *d->ops * (size_t)d->nops);
    d->vw = malloc(sizeof *d->vw * (size_t)d->nvalues);
    d->kv_of = malloc(sizeof *d->kv_of * (size_t)d->NHl);
    d->inv_freq = v->rotary ? malloc(sizeof(float) * (size_t)(d->hd / 2)) : NULL;
    d->w = calloc((size_t)c->num_layers * (size_t)d->nops, sizeof *d->w);
    if (!d->ops || !d->vw || !d->kv_of || (v->rotary && !d->inv_freq) || !d->w) return dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    memcpy(d->ops, v->ops, sizeof *d->ops * (size_t)d->nops);
    memcpy(d->vw, v->value_width, sizeof *d->vw * (size_t)d->nvalues);
    for (int h = 0; h < d->NHl; h++) d->kv_of[h] = dt_program_kv_head(p, h);
    if (v->rotary) memcpy(d->inv_freq, v->inv_freq, sizeof(float) * (size_t)(d->hd / 2));
    d->v0 = tp > 1 ? v->embed->slice.offset : 0;
    int real = c->vocab_size - d->v0;
    d->Vv = real < 0 ? 0 : real < v->embed->shape[0] ? real : v->embed->shape[0];
    return DT_OK;
}

/* The weights: each layer's, the positions and the last norm copied, the head (and an untied token table) packed. */
static dt_status load(dt_decoder *d, dt_program *p, const float *params, const dt_program_view *v, bool take) {
    int C = d->cfg.channels;
    d->small_cap = small_floats(d, p, v);
    if (!(d->small = malloc(d->small_cap * sizeof(float)))) return dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    d->wpe = v->positions ? keep(d, params, v->positions, v->positions->count) : NULL;
    d->normw = keep(d, params, v->norm_w, v->norm_w->count);
    d->normb = v->norm_b ? keep(d, params, v->norm_b, v->norm_b->count) : NULL;
    dt_status st = DT_OK;
    for (int l = 0; !st && l < d->cfg.num_layers; l++) st = load_layer(d, p, params, l);
    const dt_tensor_info *head = v->head ? v->head : v->embed;
    if (!st) st = linear_make(&d->head, params + head->offset, d->Vv, C, d->quant, take, &d->weight_bytes);
    /* an untied token table: read a row per token, not counted in the bytes a step reads */
    if (!st && v->head) st = linear_make(&d->embed, params + v->embed->offset, d->Vv, C, d->quant, take, NULL);
    return st;
}

/* take: m becomes the decoder's (destroyed with it, or at once for int8, whose copies need nothing of it; on a
 * failure too), and its f32 Linears are packed where they lie. */
static dt_status make(dt_gpt2 *m, bool take, dt_quant q, int nslots, int max_rows, int context, const dt_decoder_device *dev,
                      dt_decoder **out) {
    *out = NULL;
    dt_status st = nslots < 1 || max_rows < 1
                       ? dt_error(DT_ERR_ARG, "decoder: %d slots and %d rows a step (each must be >= 1)", nslots, max_rows)
                       : DT_OK;
    dt_decoder *d = st ? NULL : calloc(1, sizeof *d);
    if (!d) {
        if (take) dt_gpt2_destroy(m);
        if (dev && dev->destroy) dev->destroy(dev->ctx);
        return st ? st : dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    }
    d->owned = take ? m : NULL;
    if (dev) d->dev = *dev;
    dt_program *p = dt_gpt2_program(m);
    d->cfg = *dt_program_config(p); /* its defaults resolved (a norm's epsilon, the rotary base) */
    if (context > 0 && context < d->cfg.max_seq_len) d->cfg.max_seq_len = context; /* the caches' positions, and the rows' limit */
    d->quant = q;
    /* int8 weights keep the cache in bf16; DTRAIN_KV_CACHE=f32 keeps f32 (a debugging switch: the test of the
     * rounding compares the two) */
    const char *kv = getenv("DTRAIN_KV_CACHE");
    d->kv16 = q == DT_QUANT_INT8 && !(kv && !strcmp(kv, "f32"));
    d->nslots = nslots;
    d->max_rows = max_rows;
    dt_program_view v;
    dt_program_get_view(p, &v);
    st = take_shape(d, p, &v);
    if (!st && !dev) st = load(d, p, dt_program_params(p), &v, take);
    if (!st && !dev) st = alloc_buffers(d);
    if (!st && dev && !(d->filled = calloc((size_t)nslots, sizeof(int)))) st = dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    if (st) { dt_decoder_destroy(d); return st; }
    if (take && q != DT_QUANT_NONE) { dt_gpt2_destroy(m); d->owned = NULL; }
    *out = d;
    return DT_OK;
}

dt_status dt_decoder_create(const dt_gpt2 *m, dt_quant q, int nslots, int max_rows, int context, dt_decoder **out) {
    return make((dt_gpt2 *)m, false, q, nslots, max_rows, context, NULL, out); /* copies only: m is read, never written */
}

dt_status dt_decoder_create_on(const dt_gpt2 *m, int nslots, int max_rows, int context, dt_decoder_device dev, dt_decoder **out) {
    return make((dt_gpt2 *)m, false, DT_QUANT_NONE, nslots, max_rows, context, &dev, out); /* its shape only is read */
}

dt_status dt_decoder_create_taking(dt_gpt2 *m, dt_quant q, int nslots, int max_rows, int context, dt_decoder **out) {
    return make(m, true, q, nslots, max_rows, context, NULL, out);
}

void dt_decoder_destroy(dt_decoder *d) {
    if (!d) return;
    for (size_t i = 0; d->w && i < (size_t)d->cfg.num_layers * (size_t)d->nops; i++) linear_free(&d->w[i].lin), dt_decoder_moe_free(d->w[i].moe);
    dt_decoder_moe_release(d);
    linear_free(&d->head);
    linear_free(&d->embed);
    for (int b = 0; d->bufs && b < d->nbufs; b++) free(d->bufs[b]);
    free(d->bufs);
    free(d->val);
    free(d->w); free(d->ops); free(d->vw); free(d->kv_of); free(d->inv_freq);
    free(d->small);
    free(d->cache);
    free(d->filled);
    free(d->stats); free(d->pos); free(d->scores); free(d->local_logits);
    dt_gpt2_destroy(d->owned); /* after the panels that may borrow its memory */
    if (d->dev.destroy) d->dev.destroy(d->dev.ctx);
    free(d);
}

const dt_gpt2_config *dt_decoder_config(const dt_decoder *d) { return &d->cfg; }
int dt_decoder_slots(const dt_decoder *d) { return d->nslots; }
int dt_decoder_max_rows(const dt_decoder *d) { return d->max_rows; }
size_t dt_decoder_weight_bytes(const dt_decoder *d) { return d->weight_bytes; }
size_t dt_decoder_cache_bytes(const dt_decoder *d) { return (size_t)d->nslots * d->slot_elems * dt_decoder_cache_elem(d); }

dt_status dt_quant_parse(const char *s, dt_quant *out) {
    if (!strcmp(s, "none") || !strcmp(s, "f32")) *out = DT_QUANT_NONE;
    else if (!strcmp(s, "int8")) *out = DT_QUANT_INT8;
    else return dt_error(DT_ERR_ARG, "--quantize %s: expected int8 (or none)", s);
    return DT_OK;
}

const char *dt_quant_name(dt_quant q) { return q == DT_QUANT_INT8 ? "int8" : "f32"; }
