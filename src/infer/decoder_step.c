/* The decoder's step: the program's block ops over rows that each belong to a sequence at its own position, with
 * the keys and values of every position kept per sequence. A cache slot is [layer][k, v][block of 16
 * positions][K/V head], a head's keys in a block [head dim][position] and its values [position][head dim], so a
 * row's attention reads its layer's keys, then its values, once, in order and as one run each; in f32, or in bf16
 * beside int8 weights (the attention kernels widen it exactly). Query heads that share a K/V head read it in turn.
 * Every operation works row by row with a fixed order of sums (the Linears through dt_panels_apply), so a row's
 * results do not depend on the other rows of its step. */
#include "decoder_internal.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static dt_status linear_apply(float *out, const float *x, const linear *l, const float *bias, int n) {
    dt_status st = dt_panels_apply(out, x, l->p, bias, n);
    return st ? dt_error(st, "decoder: %s", dt_last_error()) : DT_OK;
}

/* Block b of K/V head h's keys (kv 0: [head dim][position], dt_attend_scores's) or values (1: [position][head dim]) in
 * layer l of slot s. A layer's keys are [block][head], then its values the same: one row's heads, read block by
 * block, are one run of memory (each head's run alone was 37 KB at 144 positions, heads 256 KB apart, and read
 * 25-32 GB/s against 44 for one stream). */
static size_t cache_at(const dt_decoder *d, int s, int l, int kv, int b, int h) {
    size_t hd = (size_t)d->hd, blocks = dt_decoder_padded_positions(d) / DT_KEY_BLOCK;
    return (size_t)s * d->slot_elems + ((((size_t)l * 2 + kv) * blocks + b) * d->NKVl + h) * DT_KEY_BLOCK * hd;
}

/* Element i of the cache set to x (rounded to nearest even in bf16); a head's scores against, and sum of, cached
 * keys and values at element at, in the cache's element type. */
static void cache_put(dt_decoder *d, size_t i, float x) {
    if (d->kv16) ((uint16_t *)d->cache)[i] = dt_f32_to_bf16(x);
    else ((float *)d->cache)[i] = x;
}

static float cache_get(const dt_decoder *d, size_t i) {
    return d->kv16 ? dt_bf16_to_f32(((const uint16_t *)d->cache)[i]) : ((const float *)d->cache)[i];
}

dt_status dt_decoder_cached(const dt_decoder *d, int slot, int layer, int pos, float *k, float *v, int *n) {
    int hd = d->hd;
    *n = d->NKVl * hd;
    if (d->dev.run) return dt_error(DT_ERR_UNSUPPORTED, "decoder: its cache is on the device");
    if (slot < 0 || slot >= d->nslots || layer < 0 || layer >= d->cfg.num_layers || pos < 0 || (size_t)pos >= dt_decoder_padded_positions(d))
        return dt_error(DT_ERR_ARG, "decoder: no slot %d, layer %d, position %d", slot, layer, pos);
    int b = pos / DT_KEY_BLOCK, i = pos % DT_KEY_BLOCK;
    for (int h = 0; h < d->NKVl; h++)
        for (int j = 0; j < hd; j++) {
            k[h * hd + j] = cache_get(d, cache_at(d, slot, layer, 0, b, h) + i + (size_t)j * DT_KEY_BLOCK);
            v[h * hd + j] = cache_get(d, cache_at(d, slot, layer, 1, b, h) + (size_t)i * hd + j);
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

/* Row r's attention over query heads [h0, h1) (q: the row's queries, y: its output): the scores, then the sums of
 * values, each block by block over those heads, so the cache is read as it lies. Every score is its own dot
 * product and every sum one chain in position order (dt_weighted_sum carries it from block to block through y),
 * so the bits are those of one head at a time. */
static void attend_heads(dt_decoder *d, int l, const dt_infer_row *row, const float *q, float *y, int r, int h0, int h1) {
    int hd = d->hd, ld = d->cfg.max_seq_len + 1, npos = row->pos + 1; /* ld: a head's scores, then their sum */
    float *s = d->scores + (size_t)r * d->NHl * ld, scale = 1.0f / sqrtf((float)hd);
    for (int t = 0; t < npos; t += DT_KEY_BLOCK)
        for (int h = h0; h < h1; h++)
            cache_scores(d, s + (size_t)h * ld + t, q + h * hd, cache_at(d, row->slot, l, 0, t / DT_KEY_BLOCK, d->kv_of[h]), hd,
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
            cache_sum(d, y + h * hd, s + (size_t)h * ld + t, cache_at(d, row->slot, l, 1, t / DT_KEY_BLOCK, d->kv_of[h]),
                      npos - t < DT_KEY_BLOCK ? npos - t : DT_KEY_BLOCK, hd);
    for (int h = h0; h < h1; h++) {
        float inv = 1.0f / s[(size_t)h * ld + ld - 1];
        for (int j = 0; j < hd; j++) y[h * hd + j] *= inv;
    }
}

/* Causal attention of each row over its slot's positions 0..pos. in: [n, q of the heads | k, v of the K/V heads],
 * q and k turned by position first (rotary); the rows' own keys and values stored before any row attends. */
static void attention(dt_decoder *d, int l, const dt_infer_row *rows, int n, float *in, float *out) {
    int hd = d->hd, NH = d->NHl, Q = NH * hd, KV = d->NKVl * hd, win = Q + 2 * KV;
    if (d->rotary) {
        dt_rope_forward(in, d->inv_freq, d->pos, n, NH, hd, (size_t)win);
        dt_rope_forward(in + Q, d->inv_freq, d->pos, n, d->NKVl, hd, (size_t)win);
    }
    for (int r = 0; r < n; r++)
        for (int h = 0; h < d->NKVl; h++) {
            const float *k = in + (size_t)r * win + Q + h * hd, *v = k + KV;
            int b = rows[r].pos / DT_KEY_BLOCK, i = rows[r].pos % DT_KEY_BLOCK;
            size_t kb = cache_at(d, rows[r].slot, l, 0, b, h) + i, vb = cache_at(d, rows[r].slot, l, 1, b, h) + (size_t)i * hd;
            for (int j = 0; j < hd; j++) {
                cache_put(d, kb + (size_t)j * DT_KEY_BLOCK, k[j]);
                cache_put(d, vb + j, v[j]);
            }
        }
    /* each row's heads in as few groups as keep every thread busy: a group is one run of the cache */
    int threads = dt_kernels_threads(), groups = n >= threads ? 1 : (threads + n - 1) / n;
    if (groups > NH) groups = NH;
    int per = (NH + groups - 1) / groups;
    #pragma omp parallel for schedule(dynamic)
    for (int i = 0; i < n * groups; i++) {
        int r = i / groups, h0 = i % groups * per, h1 = h0 + per < NH ? h0 + per : NH;
        if (h0 < h1) attend_heads(d, l, &rows[r], in + (size_t)r * win, out + (size_t)r * Q, r, h0, h1);
    }
}

/* A Linear; a row-parallel one's partial products summed over the group, then the (whole) bias added once. */
static dt_status linear_op(dt_decoder *d, const op_weights *w, float *out, const float *x, int n) {
    if (!w->row) return linear_apply(out, x, &w->lin, w->b, n);
    dt_status st = linear_apply(out, x, &w->lin, NULL, n);
    if (!st) st = d->tp->allreduce(d->tp->ctx, out, (size_t)n * w->lin.O, 0);
    for (int r = 0; !st && w->b && r < n; r++)
        for (int o = 0; o < w->lin.O; o++) out[(size_t)r * w->lin.O + o] += w->b[o];
    return st;
}

static void norm(const dt_decoder *d, float *out, const float *in, const float *w, const float *b, int n) {
    int C = d->cfg.channels;
    if (d->rms) dt_rmsnorm_forward(out, d->stats, in, w, n, C, d->cfg.norm_eps);
    else dt_layernorm_forward(out, d->stats, d->stats + n, in, w, b, n, C);
}

/* Layer l's block over the step's n rows: the program's ops in order, the stream in val[DT_V_IN] and out in
 * val[DT_V_OUT] (swapped after, so the next block reads it). */
static dt_status block(dt_decoder *d, int l, const dt_infer_row *rows, int n) {
    for (int k = 0; k < d->nops; k++) {
        const dt_program_op *o = &d->ops[k];
        const op_weights *w = &d->w[(size_t)l * d->nops + k];
        if (!dt_decoder_runs(d, l, k)) continue;
        float *in = d->val[o->s.in], *out = d->val[o->s.out];
        dt_status st = DT_OK;
        switch (o->s.kind) {
        case DT_OP_NORM: norm(d, out, in, w->w, w->b, n); break;
        case DT_OP_LINEAR: st = linear_op(d, w, out, in, n); break;
        case DT_OP_ATTENTION: attention(d, l, rows, n, in, out); break;
        case DT_OP_GELU: dt_gelu_rows(out, in, n, o->width_out); break;
        case DT_OP_SWIGLU: dt_swiglu_forward(out, in, n, o->width_out); break;
        case DT_OP_ADD: dt_residual_forward(out, in, d->val[o->s.in2], (size_t)n * o->width_out); break;
        case DT_OP_MOE: st = dt_decoder_moe_run(d, w->moe, in, out, n); break;
        case DT_OP_HEADNORM: dt_headnorm_forward(out, d->stats, in, w->w, w->b, n, d->NHl, d->NKVl, d->hd, d->cfg.norm_eps); break;
        }
        if (st) return st;
    }
    float *t = d->val[DT_V_IN];
    d->val[DT_V_IN] = d->val[DT_V_OUT];
    d->val[DT_V_OUT] = t;
    return DT_OK;
}

static dt_status check_rows(dt_decoder *d, const dt_infer_row *rows, int n) {
    const dt_lm_config *c = &d->cfg;
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

/* The rows' token embeddings (a tensor-parallel rank holds some vocabulary rows: the group's sum has each token's),
 * plus their positions' where the family learns a table. */
static dt_status embed(dt_decoder *d, const dt_infer_row *rows, int n) {
    int C = d->cfg.channels;
    float *x = d->val[DT_V_IN];
    const dt_panels *table = d->embed.p ? d->embed.p : d->head.p;
    for (int r = 0; r < n; r++) {
        int v = rows[r].token - d->v0;
        d->pos[r] = rows[r].pos;
        /* the row as the dot products read it (int8 dequantized) */
        if (v >= 0 && v < d->Vv) dt_panels_row(table, v, x + (size_t)r * C);
        else memset(x + (size_t)r * C, 0, sizeof(float) * (size_t)C);
    }
    dt_status st = d->tp ? d->tp->allreduce(d->tp->ctx, x, (size_t)n * C, 0) : DT_OK;
    for (int r = 0; !st && d->wpe && r < n; r++) {
        const float *pe = d->wpe + (size_t)rows[r].pos * C;
        for (int c = 0; c < C; c++) x[(size_t)r * C + c] += pe[c];
    }
    return st;
}

/* The head for m rows of x: logits [m, V]; a tensor-parallel rank's vocabulary columns, the rest from the others
 * (zeros summed: every rank ends with the same bits). */
static dt_status head(dt_decoder *d, const float *x, int m, float *logits) {
    int V = d->cfg.vocab_size;
    if (!d->tp) return linear_apply(logits, x, &d->head, NULL, m);
    dt_status st = d->Vv ? linear_apply(d->local_logits, x, &d->head, NULL, m) : DT_OK;
    if (st) return st;
    memset(logits, 0, sizeof(float) * (size_t)m * V);
    for (int r = 0; r < m; r++)
        memcpy(logits + (size_t)r * V + d->v0, d->local_logits + (size_t)r * d->Vv, sizeof(float) * (size_t)d->Vv);
    return d->tp->allreduce(d->tp->ctx, logits, (size_t)m * V, 0);
}

dt_status dt_decoder_run(dt_decoder *d, const dt_infer_row *rows, int n, float *logits) {
    dt_status st = check_rows(d, rows, n);
    int C = d->cfg.channels;
    if (st) return st;
    if (d->dev.run) return d->dev.run(d->dev.ctx, (const int32_t *)rows, n, logits);
    st = embed(d, rows, n);
    for (int l = 0; !st && l < d->cfg.num_layers; l++) st = block(d, l, rows, n);
    if (st) return dt_error(st, "decoder, tensor-parallel sum: %s", dt_last_error());
    /* the head only for the rows that want logits: the rest are gathered out */
    float *x = d->val[DT_V_IN], *xn = d->val[DT_V_OUT];
    int m = 0;
    for (int r = 0; r < n; r++)
        if (rows[r].logits) memmove(x + (size_t)m++ * C, x + (size_t)r * C, sizeof(float) * (size_t)C);
    if (!m) return DT_OK;
    norm(d, xn, x, d->normw, d->normb, m);
    if ((st = head(d, xn, m, logits))) return dt_error(st, "decoder, tensor-parallel logits: %s", dt_last_error());
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
    return n > 0 ? dt_decoder_run(d, rows, n, logits) : DT_OK;
}

/* Positions [0, npos) of slot from's cache into slot to's, as whole key blocks: a layer's keys, then its values, one
 * run each (what comes along past npos lies past what slot to then holds, and is never read). */
static dt_status copy_checked(dt_decoder *d, int from, int to, int npos) {
    if (from < 0 || from >= d->nslots || to < 0 || to >= d->nslots || from == to || npos < 0 || npos > d->filled[from])
        return dt_error(DT_ERR_ARG, "decoder: copying %d positions of slot %d to slot %d (of %d slots; slot %d holds %d)", npos,
                        from, to, d->nslots, from, from >= 0 && from < d->nslots ? d->filled[from] : 0);
    size_t elem = dt_decoder_cache_elem(d), blocks = ((size_t)npos + DT_KEY_BLOCK - 1) / DT_KEY_BLOCK;
    size_t run = blocks * (size_t)d->NKVl * DT_KEY_BLOCK * (size_t)d->hd * elem;
    char *c = d->cache;
    for (int l = 0; l < d->cfg.num_layers; l++)
        for (int kv = 0; kv < 2; kv++) memcpy(c + cache_at(d, to, l, kv, 0, 0) * elem, c + cache_at(d, from, l, kv, 0, 0) * elem, run);
    d->filled[to] = npos;
    return DT_OK;
}

bool dt_decoder_copies(const dt_decoder *d) { return !d->dev.run; }

dt_status dt_decoder_copy(dt_decoder *d, int from, int to, int npos) {
    if (d->dev.run) return dt_error(DT_ERR_UNSUPPORTED, "decoder: its cache is on the device, which copies no slots");
    dt_status st = copy_checked(d, from, to, npos);
    if (st || !d->leader) return st;
    /* the followers copy theirs: head -2, then the three words (checked here first, so theirs hold) */
    int32_t head = -2, w[3] = { from, to, npos };
    st = d->tp->broadcast(d->tp->ctx, &head, 1);
    if (!st) st = d->tp->broadcast(d->tp->ctx, w, 3);
    return st ? dt_error(st, "decoder, sending a copy of a slot's cache to the other tensor-parallel ranks: %s", dt_last_error()) : DT_OK;
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
        if (st || head == -1) break;
        if (head == -2) { /* a copy of a slot's cache (dt_decoder_copy) */
            int32_t w[3];
            if (!(st = d->tp->broadcast(d->tp->ctx, w, 3))) st = copy_checked(d, w[0], w[1], w[2]);
            continue;
        }
        if (head < 0 || head > d->max_rows) {
            st = dt_error(DT_ERR_MISMATCH, "decoder: the leader sent %d rows (from 0 to %d, -1 or -2)", (int)head, d->max_rows);
            break;
        }
        if (head > 0 && !(st = d->tp->broadcast(d->tp->ctx, (int32_t *)rows, (size_t)head * 4))) st = dt_decoder_run(d, rows, head, logits);
    }
    free(rows);
    free(logits);
    if (st) return dt_error(st, "decoder, following the leading tensor-parallel rank: %s", dt_last_error());
    return DT_OK;
}

