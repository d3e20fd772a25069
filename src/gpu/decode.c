/* Decoding on the GPU: the program's block ops over a step's rows (each a sequence's token at its own position) run
 * by the device kernels, as the CPU decoder runs them (src/infer/decoder_step.c), with the model's parameters on the
 * device in the host store's layout and every slot's keys and values in a device cache (gpu.h's dt_gpu_kv). f32
 * products (plain, or TF32 when the GPU is set so). */
#include "dtrain/gpu_lm.h"

#include <stdlib.h>
#include <string.h>

struct dt_gpu_decoder {
    dt_gpu *g;
    dt_program_view v;        /* its ops and widths copied (the program may go once the decoder is made) */
    dt_lm_config cfg;
    size_t o_embed, o_pos, o_norm_w, o_norm_b, o_head; /* offsets in the store */
    bool has_pos, has_norm_b; /* a learned position table; a LayerNorm's bias on the last norm */
    int L, C, NH, hd, Vp, win, nslots, max_rows, nblock;
    size_t *off;              /* [L * nblock]: block l's tensor k's offset in the store */
    float *params, *inv_freq; /* device */
    dt_gpu_kv kv;
    float **val;              /* [v]: a value's max_rows rows (IN and OUT swapped after each block) */
    float *stats, *last, *lastn, *logits; /* device: a norm's statistics; the rows that want logits, normed; their logits */
    int32_t *rows, *h_rows;   /* device and host: the step's rows, then the indices of those that want logits */
    int counting;             /* lay_out counts bytes (into need) instead of taking them */
    size_t need;
    float *h_logits;          /* host: m x Vp */
    int pinned[2];            /* h_rows and h_logits page-locked (the logits of 32 rows are 6 MB a step for GPT-2) */
};

static dt_status check(const dt_program *p, const dt_program_view *v) {
    const dt_lm_config *c = dt_program_config(p);
    if (v->heads != c->num_heads) return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the GPU decoder runs whole models (no tensor parallelism)");
    if (c->experts) return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the GPU decoder has no mixture of experts yet");
    if (!v->embed || !v->norm_w) return dt_error(DT_ERR_ARG, "--device cuda: the model lacks its token table or its last norm");
    for (int h = 0; h < v->heads; h++)
        if (dt_program_kv_head(p, h) != h / (v->heads / v->kv_heads))
            return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: query head %d reads K/V head %d, not %d", h, dt_program_kv_head(p, h),
                            h / (v->heads / v->kv_heads));
    for (int k = 0; k < v->nops; k++) {
        const dt_program_op *o = &v->ops[k];
        if (o->s.kind == DT_OP_HEADNORM)
            return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: the GPU decoder has no norm of each head's queries and keys (Qwen 3) yet");
        if (o->s.kind == DT_OP_ATTENTION && o->width_in != o->width_out + 2 * v->kv_heads * v->head_dim)
            return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: attention (op %d) reads %d channels, not q, k and v of its heads", k,
                            o->width_in);
    }
    if (v->head_dim > DT_GPU_DECODE_HEAD_MAX)
        return dt_error(DT_ERR_UNSUPPORTED, "--device cuda: heads of %d channels; the GPU decoder's attention takes %d at most", v->head_dim,
                        DT_GPU_DECODE_HEAD_MAX);
    return DT_OK;
}

/* What the steps read of the view, the decoder's own: the ops and widths copied, the tensors' offsets (the
 * frequencies are uploaded at create). */
static dt_status keep_view(dt_gpu_decoder *d) {
    dt_program_view *v = &d->v;
    dt_program_op *ops = malloc(sizeof *ops * (size_t)v->nops);
    int *w = malloc(sizeof *w * (size_t)v->nvalues);
    if (ops) memcpy(ops, v->ops, sizeof *ops * (size_t)v->nops);
    if (w) memcpy(w, v->value_width, sizeof *w * (size_t)v->nvalues);
    d->o_embed = v->embed->offset, d->o_pos = v->positions ? v->positions->offset : 0, d->o_norm_w = v->norm_w->offset;
    d->o_norm_b = v->norm_b ? v->norm_b->offset : 0, d->o_head = v->head ? v->head->offset : v->embed->offset;
    d->has_pos = v->positions != NULL, d->has_norm_b = v->norm_b != NULL;
    v->ops = ops, v->value_width = w;
    v->embed = v->positions = v->norm_w = v->norm_b = v->head = NULL;
    return ops && w ? DT_OK : dt_error(DT_ERR_NOMEM, "GPU decoder: out of memory");
}

/* A device buffer; while counting (the pre-flight), only its bytes, added up (weights: the parameters'). */
static dt_status take(dt_gpu_decoder *d, size_t bytes, void *out) {
    if (!d->counting) return dt_gpu_alloc(d->g, bytes ? bytes : 16, (void **)out);
    d->need += bytes;
    return DT_OK;
}

static dt_status lay_out(dt_gpu_decoder *d, size_t n) {
    size_t R = (size_t)d->max_rows, C = (size_t)d->C;
    d->kv.P = d->cfg.max_seq_len, d->kv.KVH = d->v.kv_heads, d->kv.hd = d->hd;
    d->kv.slot_elems = (size_t)d->L * 2 * d->kv.P * d->kv.KVH * d->hd;
    dt_status st = take(d, n * sizeof(float), &d->params);
    if (!st) st = take(d, (size_t)d->nslots * d->kv.slot_elems * sizeof(float), &d->kv.cache);
    for (int x = 0; !st && x < d->v.nvalues; x++) st = take(d, R * (size_t)d->v.value_width[x] * sizeof(float), &d->val[x]);
    if (!st) st = take(d, 2 * R * sizeof(float), &d->stats);
    if (!st) st = take(d, R * C * sizeof(float), &d->last);
    if (!st) st = take(d, R * C * sizeof(float), &d->lastn);
    if (!st) st = take(d, R * (size_t)d->Vp * sizeof(float), &d->logits);
    if (!st) st = take(d, R * 5 * sizeof(int32_t), &d->rows);
    if (!st && d->v.rotary) st = take(d, (size_t)d->hd / 2 * sizeof(float), &d->inv_freq);
    return st;
}

/* Everything the decoder takes of the GPU counted before any of it is asked for, and refused, naming the sizes, when
 * it is more than the GPU has free. */
static dt_status preflight(dt_gpu_decoder *d, size_t n) {
    d->counting = 1, d->need = 0;
    (void)lay_out(d, n); /* counting takes nothing, so fails at nothing */
    d->counting = 0;
    size_t weights = n * sizeof(float), cache = (size_t)d->nslots * d->kv.slot_elems * sizeof(float);
    size_t fr = 0, tot = 0;
    dt_status st = dt_gpu_mem_info(d->g, &fr, &tot);
    if (st || d->need <= fr) return st;
    return dt_error(DT_ERR_NOMEM, "--device cuda: decoding this model needs %.2f GiB of the GPU (the f32 weights %.2f GiB; the cache of %d "
                    "slots of %d positions %.2f GiB: fewer slots take less; a step's rows %.2f GiB), and %s has %.2f GiB free",
                    d->need / 1073741824.0, weights / 1073741824.0, d->nslots, d->cfg.max_seq_len, cache / 1073741824.0,
                    (d->need - weights - cache) / 1073741824.0, dt_gpu_name(d->g), fr / 1073741824.0);
}

dt_status dt_gpu_decoder_create(dt_gpu *g, dt_program *p, int nslots, int max_rows, int context, dt_gpu_decoder **out) {
    *out = NULL;
    if (nslots < 1 || max_rows < 1) return dt_error(DT_ERR_ARG, "GPU decoder: %d slots and %d rows a step (each must be >= 1)", nslots, max_rows);
    dt_gpu_decoder *d = calloc(1, sizeof *d);
    if (!d) return dt_error(DT_ERR_NOMEM, "GPU decoder: out of memory");
    d->g = g, d->nslots = nslots, d->max_rows = max_rows, d->cfg = *dt_program_config(p);
    if (context > 0 && context < d->cfg.max_seq_len) d->cfg.max_seq_len = context; /* the cache's positions (the CPU decoder's rule) */
    dt_program_get_view(p, &d->v);
    dt_status st = check(p, &d->v);
    if (st) {
        free(d);
        return st;
    }
    d->L = d->cfg.num_layers, d->C = d->cfg.channels, d->NH = d->v.heads, d->hd = d->v.head_dim, d->Vp = d->v.embed->shape[0];
    st = keep_view(d);
    for (d->nblock = 0; dt_program_block_tensor(p, 0, d->nblock); d->nblock++) {}
    d->off = calloc((size_t)d->L * (d->nblock ? d->nblock : 1), sizeof *d->off);
    d->val = calloc((size_t)d->v.nvalues, sizeof *d->val);
    if (!st && (!d->off || !d->val)) st = dt_error(DT_ERR_NOMEM, "GPU decoder: out of memory");
    if (!st) st = dt_gpu_host_alloc(g, sizeof(int32_t) * 5 * (size_t)max_rows, (void **)&d->h_rows, &d->pinned[0]);
    if (!st) st = dt_gpu_host_alloc(g, sizeof(float) * (size_t)max_rows * d->Vp, (void **)&d->h_logits, &d->pinned[1]);
    for (int l = 0; !st && l < d->L; l++)
        for (int k = 0; k < d->nblock; k++) d->off[l * d->nblock + k] = dt_program_block_tensor(p, l, k)->offset;
    for (int k = 0; !st && k < d->v.nops; k++)
        if (d->v.ops[k].s.kind == DT_OP_ATTENTION) d->win = d->v.ops[k].width_in;
    size_t n = dt_program_num_params(p);
    if (!st) st = preflight(d, n);
    if (!st) st = lay_out(d, n);
    if (!st) st = dt_gpu_upload(g, d->params, dt_program_params(p), n * sizeof(float));
    if (!st && d->v.rotary) st = dt_gpu_upload(g, d->inv_freq, d->v.inv_freq, (size_t)d->hd / 2 * sizeof(float));
    if (!st) {
        dt_gpu_zero(g, d->kv.cache, (size_t)nslots * d->kv.slot_elems * sizeof(float));
        st = dt_gpu_sync(g);
    }
    if (st) {
        dt_gpu_decoder_destroy(d);
        return st;
    }
    *out = d;
    return DT_OK;
}

void dt_gpu_decoder_destroy(dt_gpu_decoder *d) {
    if (!d) return;
    float *bufs[] = { d->params, d->inv_freq, d->kv.cache, d->stats, d->last, d->lastn, d->logits };
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) dt_gpu_free(d->g, bufs[i]);
    dt_gpu_free(d->g, d->rows);
    for (int x = 0; d->val && x < d->v.nvalues; x++) dt_gpu_free(d->g, d->val[x]);
    free((void *)d->v.ops);
    free((void *)d->v.value_width);
    free(d->val);
    free(d->off);
    if (d->h_rows) dt_gpu_host_free(d->g, d->h_rows, d->pinned[0]);
    if (d->h_logits) dt_gpu_host_free(d->g, d->h_logits, d->pinned[1]);
    free(d);
}

static const float *W(const dt_gpu_decoder *d, int l, int k) { return k >= 0 ? d->params + d->off[l * d->nblock + k] : NULL; }

static void norm(dt_gpu_decoder *d, float *out, const float *in, const float *w, const float *b, int n) {
    if (d->v.rms) dt_gpu_rmsnorm_forward(d->g, out, d->stats, in, w, n, d->C, d->cfg.norm_eps, NULL);
    else dt_gpu_layernorm_forward(d->g, out, d->stats, d->stats + n, in, w, b, n, d->C, NULL);
}

/* Attention on in [n, q | k | v of the K/V heads]: q and k turned by position first (rotary). */
static void attention(dt_gpu_decoder *d, int l, float *in, float *out, int n) {
    int Q = d->NH * d->hd;
    if (d->v.rotary) {
        dt_gpu_rope_rows(d->g, in, d->inv_freq, d->rows, n, d->NH, d->hd, (size_t)d->win);
        dt_gpu_rope_rows(d->g, in + Q, d->inv_freq, d->rows, n, d->v.kv_heads, d->hd, (size_t)d->win);
    }
    dt_gpu_attention_cached(d->g, out, &d->kv, in, d->rows, n, l, d->NH, d->win);
}

static void block(dt_gpu_decoder *d, int l, int n) {
    for (int k = 0; k < d->v.nops; k++) {
        const dt_program_op *o = &d->v.ops[k];
        const dt_op_spec *s = &o->s;
        if (!dt_layers_hold(s->layers, false)) continue;
        float *in = d->val[s->in], *out = d->val[s->out];
        switch (s->kind) {
        case DT_OP_NORM: norm(d, out, in, W(d, l, s->w), W(d, l, s->b), n); break;
        case DT_OP_LINEAR: dt_gpu_matmul_forward(d->g, out, in, W(d, l, s->w), W(d, l, s->b), n, o->width_in, o->width_out); break;
        case DT_OP_ATTENTION: attention(d, l, in, out, n); break;
        case DT_OP_GELU: dt_gpu_gelu_forward(d->g, out, in, (size_t)n * o->width_out, NULL); break;
        case DT_OP_SWIGLU: dt_gpu_swiglu_forward(d->g, out, in, n, o->width_out, NULL); break;
        case DT_OP_ADD: dt_gpu_residual_forward(d->g, out, in, d->val[s->in2], (size_t)n * o->width_out); break;
        case DT_OP_MOE: /* refused at create */
        case DT_OP_HEADNORM: break;
        }
    }
    float *t = d->val[DT_V_IN];
    d->val[DT_V_IN] = d->val[DT_V_OUT];
    d->val[DT_V_OUT] = t;
}

dt_status dt_gpu_decoder_run(dt_gpu_decoder *d, const int32_t *rows, int n, float *logits) {
    if (n < 1) return DT_OK;
    if (n > d->max_rows) return dt_error(DT_ERR_ARG, "GPU decoder: %d rows in a step, at most %d", n, d->max_rows);
    int m = 0, C = d->C, V = d->cfg.vocab_size;
    int32_t *idx = d->h_rows + 4 * (size_t)n; /* one copy to the device a step: the rows, then these */
    memcpy(d->h_rows, rows, sizeof(int32_t) * 4 * (size_t)n);
    for (int r = 0; r < n; r++)
        if (rows[4 * r + 3]) idx[m++] = r;
    dt_status st = dt_gpu_upload(d->g, d->rows, d->h_rows, sizeof(int32_t) * (4 * (size_t)n + m));
    if (st) return st;
    const float *wte = d->params + d->o_embed;
    dt_gpu_embed_rows(d->g, d->val[DT_V_IN], d->rows, wte, d->has_pos ? d->params + d->o_pos : NULL, n, C);
    for (int l = 0; l < d->L; l++) block(d, l, n);
    if (m) {
        dt_gpu_gather_rows(d->g, d->last, d->val[DT_V_IN], d->rows + 4 * (size_t)n, m, C);
        norm(d, d->lastn, d->last, d->params + d->o_norm_w, d->has_norm_b ? d->params + d->o_norm_b : NULL, m);
        dt_gpu_matmul_forward(d->g, d->logits, d->lastn, d->params + d->o_head, NULL, m, C, d->Vp);
        st = dt_gpu_download(d->g, d->h_logits, d->logits, sizeof(float) * (size_t)m * d->Vp);
    }
    if (!st) st = dt_gpu_sync(d->g);
    for (int r = 0; !st && r < m; r++) memcpy(logits + (size_t)r * V, d->h_logits + (size_t)r * d->Vp, sizeof(float) * (size_t)V);
    return st;
}

static dt_status device_run(void *ctx, const int32_t *rows, int n, float *logits) { return dt_gpu_decoder_run(ctx, rows, n, logits); }
static void device_destroy(void *ctx) { dt_gpu_decoder_destroy(ctx); }

dt_decoder_device dt_gpu_decoder_device(dt_gpu_decoder *d) { return (dt_decoder_device){ d, device_run, device_destroy }; }
