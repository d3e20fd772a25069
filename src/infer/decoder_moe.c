/* The decoder's mixture of experts: training's op (program_moe.c) row by row, as a serving step needs it. Each row
 * routes alone (the router a packed Linear; softmax, or DeepSeek-V3's sigmoid with the trained bias choosing; its top
 * k), the step's (row, choice) pairs are sorted by expert, each expert's packed gate|up and down Linears run over its
 * rows, and a row's output is its choices' outputs weighted and summed in the experts' order (then a shared expert's,
 * scaled by its sigmoid gate). Every Linear is dt_panels_apply's fixed-order dot products and every sum a row's own, so
 * a row's bits do not depend on the other rows of its step, nor on which experts they chose. Dropless: a capacity is
 * training's (Hugging Face's models route without one at inference too). */
#include "decoder_internal.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct moe_weights {
    linear router, *gate_up, *down; /* [E, C]; per expert [2F, C] (gate's rows, then up's; GELU experts: up's [F, C]) and [C, F] */
    linear shared_gate_up, shared_down, shared_gate; /* a shared expert's ([2Fs, C], [C, Fs]) and its gate [1, C] */
    int Fs;                         /* the shared expert's hidden units on this rank (a tensor-parallel rank's share) */
    float *bias;                    /* the sigmoid router's [E] (NULL: softmax) */
    int E;
    bool gelu;                      /* GELU experts (up, down: gpt2_moe's), not SwiGLU ones */
};

struct moe_scratch {
    float *probs, *w, *xs, *hu, *act, *ys, *sgate;
    int32_t *idx, *order, *start, *row_of;
};

/* Rows a and b of two stacked [E, rows, C] tensors side by side as one [2 rows, C] Linear, packed. */
static dt_status pack_pair(linear *l, const float *a, const float *b, int rows, int C, bool int8, size_t *bytes) {
    size_t n = (size_t)rows * C;
    float *both = malloc(2 * n * sizeof(float));
    if (!both) return dt_error(DT_ERR_NOMEM, "decoder: out of memory packing an expert");
    memcpy(both, a, n * sizeof(float));
    memcpy(both + n, b, n * sizeof(float));
    *l = (linear){ NULL, 2 * rows, C };
    dt_status st = dt_panels_create(both, 2 * rows, C, int8, &l->p);
    free(both);
    if (!st) *bytes += dt_panels_bytes(l->p);
    return st ? dt_error(st, "decoder: %s", dt_last_error()) : DT_OK;
}

static dt_status pack(linear *l, const float *w, int O, int K, bool int8, size_t *bytes) {
    *l = (linear){ NULL, O, K };
    dt_status st = dt_panels_create(w, O, K, int8, &l->p);
    if (!st) *bytes += dt_panels_bytes(l->p);
    return st ? dt_error(st, "decoder: %s", dt_last_error()) : DT_OK;
}

dt_status dt_decoder_moe_load(dt_decoder *d, dt_program *p, const float *params, int l, int k, moe_weights **out) {
    const dt_lm_config *c = &d->cfg;
    const dt_program_op *o = &d->ops[k];
    int E = c->experts, C = c->channels, F = c->ffn, Fs = c->shared_ffn;
    bool q8 = d->quant == DT_QUANT_INT8;
    moe_weights *w = calloc(1, sizeof *w);
    if (w) w->gate_up = calloc((size_t)E, sizeof *w->gate_up), w->down = calloc((size_t)E, sizeof *w->down);
    *out = w;
    if (!w || !w->gate_up || !w->down) return dt_error(DT_ERR_NOMEM, "decoder: out of memory for layer %d's experts", l);
    w->E = E;
    w->gelu = !dt_family_moe_gated(c->family);
    const float *t[8];
    for (int j = 0; j < o->s.nw && j < 8; j++) t[j] = params + dt_program_block_tensor(p, l, o->s.w + j)->offset;
    dt_status st = pack(&w->router, t[0], E, C, q8, &d->weight_bytes);
    for (int e = 0; !st && e < E; e++) {
        size_t fc = (size_t)F * C;
        if (w->gelu) st = pack(&w->gate_up[e], t[1] + e * fc, F, C, q8, &d->weight_bytes);
        else st = pack_pair(&w->gate_up[e], t[1] + e * fc, t[2] + e * fc, F, C, q8, &d->weight_bytes);
        if (!st) st = pack(&w->down[e], t[w->gelu ? 2 : 3] + e * fc, C, F, q8, &d->weight_bytes);
    }
    if (!st && Fs > 0) {
        w->Fs = Fs = dt_program_block_tensor(p, l, o->s.w + 4)->shape[0]; /* (split by tensor parallelism) */
        st = pack_pair(&w->shared_gate_up, t[4], t[5], Fs, C, q8, &d->weight_bytes);
        if (!st) st = pack(&w->shared_down, t[6], C, Fs, q8, &d->weight_bytes);
        if (!st && o->s.nw > 7) st = pack(&w->shared_gate, t[7], 1, C, q8, &d->weight_bytes); /* (DeepSeek's: none) */
    }
    size_t nb = 0;
    const float *bias = dt_program_moe_bias(p, &nb);
    if (!st && c->router == DT_ROUTER_SIGMOID_BIAS) {
        if (!bias || nb < (size_t)(l + 1) * E) return dt_error(DT_ERR_ARG, "decoder: layer %d's router bias is not in the model", l);
        if (!(w->bias = malloc(sizeof(float) * (size_t)E))) return dt_error(DT_ERR_NOMEM, "decoder: out of memory");
        memcpy(w->bias, bias + (size_t)l * E, sizeof(float) * (size_t)E);
    }
    return st;
}

void dt_decoder_moe_free(moe_weights *w) {
    if (!w) return;
    dt_panels_destroy(w->router.p);
    for (int e = 0; e < w->E && w->gate_up; e++) dt_panels_destroy(w->gate_up[e].p), dt_panels_destroy(w->down[e].p);
    dt_panels_destroy(w->shared_gate_up.p), dt_panels_destroy(w->shared_down.p), dt_panels_destroy(w->shared_gate.p);
    free(w->gate_up), free(w->down), free(w->bias), free(w);
}

dt_status dt_decoder_moe_alloc(dt_decoder *d) {
    const dt_lm_config *c = &d->cfg;
    size_t R = (size_t)d->max_rows, K = (size_t)c->experts_top_k, E = (size_t)c->experts, C = (size_t)c->channels;
    size_t F = (size_t)(c->ffn > c->shared_ffn ? c->ffn : c->shared_ffn), P = R * (K > 1 ? K : 1);
    moe_scratch *s = d->moe = calloc(1, sizeof *s);
    if (!s) return dt_error(DT_ERR_NOMEM, "decoder: out of memory");
    s->probs = malloc(sizeof(float) * R * E), s->w = malloc(sizeof(float) * P), s->xs = malloc(sizeof(float) * P * C);
    s->hu = malloc(sizeof(float) * P * 2 * F), s->act = malloc(sizeof(float) * P * F), s->ys = malloc(sizeof(float) * P * C);
    s->sgate = malloc(sizeof(float) * R);
    s->idx = malloc(sizeof(int32_t) * P), s->order = malloc(sizeof(int32_t) * P), s->row_of = malloc(sizeof(int32_t) * P);
    s->start = malloc(sizeof(int32_t) * (E + 1));
    bool ok = s->probs && s->w && s->xs && s->hu && s->act && s->ys && s->sgate && s->idx && s->order && s->row_of && s->start;
    return ok ? DT_OK : dt_error(DT_ERR_NOMEM, "decoder: out of memory for the experts' rows of %zu rows a step", R);
}

void dt_decoder_moe_release(dt_decoder *d) {
    moe_scratch *s = d->moe;
    if (!s) return;
    free(s->probs), free(s->w), free(s->xs), free(s->hu), free(s->act), free(s->ys), free(s->sgate);
    free(s->idx), free(s->order), free(s->row_of), free(s->start), free(s);
    d->moe = NULL;
}

static dt_status apply(float *out, const float *x, const linear *l, int n) {
    dt_status st = n ? dt_panels_apply(out, x, l->p, NULL, n) : DT_OK;
    return st ? dt_error(st, "decoder: %s", dt_last_error()) : DT_OK;
}

/* The rows [start, start + n) of one SwiGLU MLP: gate|up, the product, down (gelu: up, GELU, down). */
static dt_status mlp(moe_scratch *s, const linear *gate_up, const linear *down, const float *x, float *y, int n, int F, bool gelu) {
    dt_status st = apply(s->hu, x, gate_up, n);
    if (!st && gelu) dt_gelu_forward(s->act, s->hu, (size_t)n * F);
    else if (!st) dt_swiglu_forward(s->act, s->hu, n, F);
    return st ? st : apply(y, s->act, down, n);
}

dt_status dt_decoder_moe_run(dt_decoder *d, const moe_weights *w, const float *x, float *out, int n) {
    const dt_lm_config *c = &d->cfg;
    moe_scratch *s = d->moe;
    int E = c->experts, K = c->experts_top_k, C = c->channels, F = c->ffn, pairs = n * K;
    dt_status st = apply(s->probs, x, &w->router, n);
    if (st) return st;
    if (w->bias) {
        dt_moe_sigmoid(s->probs, n, E);
        dt_moe_topk_biased(s->w, s->idx, s->probs, w->bias, n, E, K, c->expert_groups, c->group_top_k, c->norm_topk, c->routed_scale);
    } else {
        dt_moe_softmax(s->probs, NULL, n, E);
        dt_moe_topk(s->w, s->idx, s->probs, n, E, K, c->norm_topk);
    }
    dt_moe_sort(s->order, s->start, s->row_of, s->idx, pairs, E);
    dt_moe_gather(s->xs, x, s->order, pairs, K, C);
    for (int e = 0; !st && e < E; e++) {
        size_t r = (size_t)s->start[e];
        st = mlp(s, &w->gate_up[e], &w->down[e], s->xs + r * C, s->ys + r * C, s->start[e + 1] - s->start[e], F, w->gelu);
    }
    if (st) return st;
    dt_moe_combine(out, s->ys, s->w, s->idx, s->row_of, n, K, C, false);
    if (c->shared_ffn <= 0) return DT_OK;
    /* the shared expert over every row, scaled by sigmoid(x . v), added after the routed ones (training's order); a
     * tensor-parallel rank's share of its hidden units makes a partial sum */
    if ((w->shared_gate.p && (st = apply(s->sgate, x, &w->shared_gate, n))) ||
        (st = mlp(s, &w->shared_gate_up, &w->shared_down, x, s->ys, n, w->Fs, false)) ||
        (d->tp && (st = d->tp->allreduce(d->tp->ctx, s->ys, (size_t)n * C, 0))))
        return st;
    for (int i = 0; i < n; i++) {
        float g = w->shared_gate.p ? 1.0f / (1.0f + expf(-s->sgate[i])) : 1.0f;
        for (int j = 0; j < C; j++) out[(size_t)i * C + j] += g * s->ys[(size_t)i * C + j];
    }
    return DT_OK;
}
