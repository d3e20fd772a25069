/* Running the model program (program.c holds its shape): forward and backward over a range of the units it
 * holds, walking each block's ops (forward in order, each writing its output value; backward in reverse, each
 * adding into the gradients of what it read), with the residual stream in and out at the range's edges: the
 * embedding only on a range that starts at unit 0, the head and the loss only on one that ends with unit L+1.
 * Hooks run before each unit's forward and backward and after each unit's backward.
 *
 * Every value a block computes is kept for backward (f32, no recomputation yet); the gradients of a block's
 * values are one set that each block's backward reuses. Attention takes q, k and v side by side (K/V heads may
 * be fewer), turns q and k by their positions where the family is rotary, and hands the attention kernels the
 * q|k|v of all heads (a K/V head repeated for the heads that share it), kept for backward. */
#include "program_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a batch's memory ---- */

static size_t round16(size_t n) { return (n + 15) & ~(size_t)15; }

/* Where a slot's pieces go: base (NULL: only counting) and the floats so far, of which kept are kept from forward
 * for backward (what is not: one block's working set, the gradients in flight, scratch). With ranges, a range's kept
 * pieces go to its area instead (rbase[r]: NULL while it holds none, its pieces then NULL), rat[r] floats so far. */
typedef struct {
    float *base;
    size_t at, kept;
    bool ranges;
    float *rbase[DT_GPT2_MAX_CHUNKS];
    size_t rat[DT_GPT2_MAX_CHUNKS];
} arena;

/* LoRA with dropout: a slot has room for an adapter's dropped input, and the rows' keys. */
static bool dropping(const dt_program *p) { return p->lora && p->lora->c.dropout > 0; }

/* n floats (64-byte aligned starts) for range r's piece (-1: a piece of the slot's own, kept or not); kept: from
 * forward for backward. */
static float *carve_for(arena *a, int r, size_t n, bool kept) {
    if (kept) a->kept += round16(n);
    if (a->ranges && kept && r >= 0) {
        float *x = a->rbase[r] ? a->rbase[r] + a->rat[r] : NULL;
        a->rat[r] += round16(n);
        return x;
    }
    float *x = a->base ? a->base + a->at : NULL;
    a->at += round16(n);
    return x;
}

static float *carve(arena *a, size_t n, bool kept) { return carve_for(a, -1, n, kept); }

/* Whether a program lays each range's kept pieces in an area of its own (several ranges: an interleaved stage). */
static bool by_range(const dt_program *p) { return p->nr > 1; }

/* The residual stream entering block l (l = L: the head), a held unit: the previous block's output where that
 * block is in the same range, else the range's input. */
static float *stream_in(const dt_program *p, int l) {
    int r = dt_program_range_of(p, l + 1);
    if (l >= 1 && l >= p->ra[r]) return value(p, l - 1, DT_V_OUT);
    return p->s->range_in[r];
}

/* Each held block's values and statistics, and a split backward's Linear output gradients. Recomputing: each
 * block's output alone, the rest one block's, shared; keeping blocks in 16 bits (mixed precision): one block's f32
 * values to work in, the outputs alternating between two (the slot's, whatever the range: every range's blocks use
 * them), each block's values packed in 16 bits; a value no backward reads is one block's in any case. A block has
 * only what its kind of layer's ops use (a dense layer no mixture's statistics, a mixture no dense MLP's values); one
 * block's shared value or statistics are the first block's that has them. */
static void lay_blocks(dt_program *p, program_slot *s, arena *m, size_t BT, size_t R, size_t att) {
    int nv = p->f->nvalues, no = p->f->nops, L = p->cfg.num_layers, first_v[DT_BLOCK_MAX], first_k[DT_BLOCK_MAX];
    bool packs = dt_program_packs(p);
    for (int i = 0; i < DT_BLOCK_MAX; i++) first_v[i] = first_k[i] = -1;
    for (int l = 0; l < L; l++) {
        int b = p->bk[l], r = dt_program_range_of(p, l + 1);
        if (b < 0) continue;
        const bool *used = p->vused + (p->moe_layer[l] ? nv : 0);
        for (int v = 1; v < nv; v++) {
            if (!used[v]) {
                if (m->base) s->val[b * nv + v] = NULL;
                continue;
            }
            /* a value no backward reads (a row-parallel Linear's output, which the add consumes): one block's, shared */
            bool transient = v != DT_V_OUT && !p->vkeep[v], before = first_v[v] >= 0;
            bool reuse = v == DT_V_OUT ? packs && b > 1 : ((p->recompute || packs) && before) || (transient && before);
            bool kept = v == DT_V_OUT ? !packs || b < 2 : !p->recompute && !packs && !transient;
            float *x = reuse ? NULL : carve_for(m, packs ? -1 : r, (p->vsplit[v] ? R : BT) * (size_t)p->vw[v], kept);
            if (m->base) s->val[b * nv + v] = reuse ? s->val[(v == DT_V_OUT ? b % 2 : first_v[v]) * nv + v] : x;
            if (!before) first_v[v] = b;
        }
        for (int k = 0; k < no; k++) {
            dt_op_kind kind = p->ops[k].s.kind;
            bool runs = op_runs(p, l, k), shared = p->recompute && first_k[k] >= 0;
            size_t n = !runs ? 0 : kind == DT_OP_NORM ? 2 * R : kind == DT_OP_ATTENTION ? att : kind == DT_OP_MOE ? dt_program_moe_kept(p, BT) : 0;
            if (runs && kind == DT_OP_HEADNORM) n = BT * (size_t)(p->NHl + p->KVl / p->cfg.head_dim); /* a head's rstd a row */
            float *x = shared || !n ? NULL : carve_for(m, r, n, !p->recompute);
            if (m->base) s->stats[b * no + k] = shared && n ? s->stats[first_k[k] * no + k] : x;
            if (n && first_k[k] < 0) first_k[k] = b;
            float *w = runs && p->split_bwd && kind == DT_OP_LINEAR ? carve(m, BT * (size_t)p->ops[k].width_out, false) : NULL;
            if (m->base) s->wgrad[b * no + k] = w;
        }
        bool shared = (p->recompute || packs) && b > 0;
        float *pk = p->repack && !shared ? carve_for(m, r, BT * 3 * (size_t)p->Ql, !p->recompute && !packs) : NULL;
        if (m->base) s->packed[b] = shared ? s->packed[0] : pk;
        /* 16-bit blocks: this one's kept values packed */
        float *lp = packs ? carve_for(m, r, (dt_program_lp_block(p, BT, p->moe_layer[l]) + 1) / 2, true) : NULL;
        if (m->base) s->lp_keep[b] = (uint16_t *)lp;
    }
}

/* Lays out (m->base NULL: counts) everything slot s needs for B x T. */
static void lay_slot(dt_program *p, program_slot *s, arena *m, int B, int T) {
    int nv = p->f->nvalues, L = p->cfg.num_layers, last = p->nr - 1;
    size_t BT = (size_t)B * T, C = (size_t)p->cfg.channels, Q = (size_t)p->Ql;
    size_t att = (size_t)p->NHl * BT * (s->blockwise ? 1 : (size_t)T);
    /* the residual stream's rows: all, or this rank's share under sequence parallelism */
    size_t R = p->part.sp && p->part.tp_size > 1 ? BT / (size_t)p->part.tp_size : BT, sp = R < BT;
    bool head = p->ub == L + 2, packs = dt_program_packs(p);
    for (int r = 0; r < p->nr; r++) s->range_in[r] = carve_for(m, r, R * C, true);
    lay_blocks(p, s, m, BT, R, att);
    /* the gradients of a block's values: shared buffers (share_grads), each as wide as its widest value */
    for (int b = 0; b < p->nvbuf; b++) {
        size_t n = 0;
        for (int v = 2; v < nv; v++)
            if (p->vbuf[v] == b && (p->vsplit[v] ? R : BT) * (size_t)p->vw[v] > n) n = (p->vsplit[v] ? R : BT) * (size_t)p->vw[v];
        float *d = carve(m, n, false);
        for (int v = 2; m->base && v < nv; v++)
            if (p->vbuf[v] == b) s->dval[v] = d;
    }
    s->dstream[0] = carve(m, R * C, false);
    s->dstream[1] = carve(m, R * C, false);
    s->dpacked = p->repack ? carve(m, BT * 3 * Q, false) : NULL;
    s->gather = carve(m, sp * BT * C, false);
    s->partial = carve(m, sp * BT * C, false);
    s->normgrad = carve(m, sp * 2 * C, false);
    s->headgrad = carve(m, (p->part.tp_size > 1 && dt_program_has_op(p, DT_OP_HEADNORM)) * 2 * (size_t)p->cfg.head_dim, false);
    s->moe_dx = carve(m, (sp && p->cfg.experts) * BT * C, false);
    /* the head's: in the last range (which holds it) */
    s->lnf = carve_for(m, last, head * R * C, true);
    s->lnf_stats = carve_for(m, last, head * 2 * R, true);
    /* the logits: f32, or 16-bit under mixed precision */
    s->logits = carve_for(m, last, head * (p->prec == DT_F32 ? BT * (size_t)p->Vl : (BT * (size_t)p->Vl + 1) / 2), true);
    s->losses = carve_for(m, last, head * BT, true);
    s->ce_stats = carve_for(m, last, head * 2 * BT, true);
    s->dlnf = carve(m, head * R * C, false);
    s->scratch = carve(m, head * 2 * BT, false);
    s->res1 = carve(m, packs * R * C, false);
    size_t lr = p->lora ? (size_t)p->lora->c.rank : 0;
    /* LoRA's x A^T of every held block: the slot's (one piece, indexed by block) */
    s->lora_u = carve(m, (size_t)p->nl * (p->lora ? (size_t)p->lora->per_block : 0) * BT * lr, true);
    s->lora_du = carve(m, BT * lr, false);
    s->lora_x = carve(m, dropping(p) ? BT * (size_t)p->lora->max_in : 0, false);
    s->moe_work = carve(m, p->cfg.experts ? dt_program_moe_work(p, BT) : 0, false);
    s->dce = carve_for(m, last, p->token_loss ? head * BT : 0, true);
    s->tok_stats = carve_for(m, last, p->token_loss && p->token_stats ? head * 3 * BT : 0, true);
}

/* the log-sum-exp kernels (context parallelism merges blocks by it): no T x T scores kept */
bool dt_program_attention_lse(const dt_program *p, int T) {
    return p->part.cp_size > 1 || p->attn == DT_ATTN_BLOCKWISE || p->attn == DT_ATTN_CUDNN || (p->attn == DT_ATTN_AUTO && T >= 256);
}

/* What a slot holds besides its floats: the tokens, targets and positions, dropout's keys, a mixture's ints. */
static size_t slot_other_bytes(const dt_program *p, size_t BT) {
    size_t moe = p->cfg.experts ? dt_program_moe_ints(p, BT) * sizeof(int32_t) + 2 * (size_t)p->cfg.experts * sizeof(double) : 0;
    return 3 * BT * sizeof(int32_t) + (dropping(p) ? 2 * BT * sizeof(uint64_t) : 0) + moe;
}

size_t dt_program_slot_bytes(const dt_program *p, int B, int T, size_t *kept) {
    program_slot s = { .blockwise = dt_program_attention_lse(p, T) };
    arena m = { 0 };
    lay_slot((dt_program *)p, &s, &m, B, T);
    if (kept) *kept = m.kept * sizeof(float);
    return m.at * sizeof(float) + slot_other_bytes(p, (size_t)B * T);
}

size_t dt_program_slot_split_bytes(const dt_program *p, int B, int T, size_t *area) {
    program_slot s = { .blockwise = dt_program_attention_lse(p, T) };
    arena m = { .ranges = by_range(p) };
    lay_slot((dt_program *)p, &s, &m, B, T);
    for (int r = 0; r < p->nr; r++) area[r] = m.rat[r] * sizeof(float);
    return m.at * sizeof(float) + slot_other_bytes(p, (size_t)B * T);
}

/* Lays slot s out again in its memory and its ranges' areas (a range without one: its pieces NULL). */
static void lay_again(dt_program *p, program_slot *s) {
    arena m = { .base = s->mem, .ranges = by_range(p) };
    for (int r = 0; r < p->nr; r++) m.rbase[r] = s->area[r];
    lay_slot(p, s, &m, s->lay_B, s->lay_T);
    for (int l = 0; l < p->cfg.num_layers; l++) /* each held block reads the stream that enters it */
        if (p->bk[l] >= 0) s->val[p->bk[l] * p->f->nvalues + DT_V_IN] = stream_in(p, l);
}

/* Range r's area for the current slot: a free one of that range's, or a new one (the pool grows to the most the
 * schedule holds at once); zeroed when new, as a slot's memory is. */
static dt_status hold_area(dt_program *p, int r) {
    program_slot *s = p->s;
    if (!by_range(p) || s->area[r]) return DT_OK;
    program_area *a = NULL;
    for (int i = 0; i < p->nareas && !a; i++)
        if (!p->areas[i].busy && p->areas[i].range == r) a = &p->areas[i];
    if (!a) {
        program_area *x = realloc(p->areas, (size_t)(p->nareas + 1) * sizeof *x);
        if (!x) return dt_error(DT_ERR_NOMEM, "model: out of memory for chunk %d's activations", r);
        p->areas = x;
        a = &p->areas[p->nareas++];
        *a = (program_area){ .range = r };
    }
    if (a->floats != s->area_floats[r]) { /* new, or laid for another shape */
        dt_free_aligned(a->mem);
        a->floats = s->area_floats[r];
        char sz[32];
        if (!(a->mem = dt_alloc_aligned(a->floats * sizeof(float)))) {
            a->floats = 0;
            return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of chunk %d's activations", dt_format_size(s->area_floats[r] * sizeof(float), sz, sizeof sz), r);
        }
        memset(a->mem, 0, a->floats * sizeof(float));
    }
    a->busy = true;
    s->area[r] = a->mem;
    lay_again(p, s);
    return DT_OK;
}

/* Slot s gives range r's area back (the range's backward is through); r -1: every range's. */
static void release_areas(dt_program *p, program_slot *s, int r) {
    bool any = false;
    for (int q = 0; q < p->nr; q++) {
        if ((r >= 0 && q != r) || !s->area[q]) continue;
        for (int i = 0; i < p->nareas; i++)
            if (p->areas[i].mem == s->area[q]) p->areas[i].busy = false;
        s->area[q] = NULL;
        any = true;
    }
    if (any && s->mem) lay_again(p, s); /* its pieces NULL: a stale read faults, it does not read another's */
}

void dt_program_release_activations(dt_program *p) { release_areas(p, p->s, -1); }

void dt_program_free_slot(program_slot *s) {
    dt_free_aligned(s->mem);
    free(s->val);
    free(s->stats);
    free(s->packed);
    free(s->dval);
    free(s->wgrad);
    free(s->inputs);
    free(s->targets);
    free(s->pos);
    free(s->first);
    free(s->row_key);
    free(s->lora_rk);
    free(s->moe_int);
    free(s->moe_acc);
    dt_program_moe_sums_wait(s); /* (its buffer is the slot's) */
    free(s->moe_sum);
    free(s->moe_daux);
    free(s->moe_glob);
    free(s->moe_glob_f);
    free(s->lp_keep);
    dt_program_moe_ep_free_keep(s);
    memset(s, 0, sizeof *s);
}

void dt_program_free_slots(dt_program *p) {
    for (int k = 0; p->slots && k < p->nslots; k++) dt_program_free_slot(&p->slots[k]);
    for (int i = 0; i < p->nareas; i++) dt_free_aligned(p->areas[i].mem);
    free(p->areas);
    p->areas = NULL;
    p->nareas = 0;
}

static bool cp(const dt_program *p) { return p->part.cp_size > 1; }

static dt_status reserve(dt_program *p, int B, int T) {
    program_slot *s = p->s;
    bool blockwise = dt_program_attention_lse(p, T);
    if (s->mem && (size_t)B * T <= (size_t)s->cap_BT && T <= s->cap_T && blockwise == s->blockwise) return DT_OK;
    release_areas(p, s, -1);
    dt_program_free_slot(s);
    s->blockwise = blockwise;
    int nv = p->f->nvalues, no = p->f->nops, nb = p->nl > 0 ? p->nl : 1;
    arena m = { .ranges = by_range(p) };
    lay_slot(p, s, &m, B, T);
    size_t BT = (size_t)B * T, n = m.at;
    s->floats = n;
    s->kept = m.kept;
    for (int r = 0; r < p->nr; r++) s->area_floats[r] = m.rat[r];
    s->val = calloc((size_t)(nb * nv), sizeof *s->val);
    s->stats = calloc((size_t)(nb * no), sizeof *s->stats);
    s->packed = calloc((size_t)nb, sizeof *s->packed);
    s->lp_keep = calloc((size_t)nb, sizeof *s->lp_keep);
    s->dval = calloc((size_t)nv, sizeof *s->dval);
    s->wgrad = calloc((size_t)(nb * no), sizeof *s->wgrad);
    s->inputs = malloc(BT * sizeof(int32_t));
    s->targets = malloc(BT * sizeof(int32_t));
    s->pos = malloc(BT * sizeof(int32_t));
    s->first = malloc(BT * sizeof(int32_t));
    s->row_key = dropping(p) ? malloc(BT * sizeof(uint64_t)) : NULL;
    s->lora_rk = dropping(p) ? malloc(BT * sizeof(uint64_t)) : NULL;
    s->moe_int = p->cfg.experts ? malloc(dt_program_moe_ints(p, BT) * sizeof(int32_t)) : NULL;
    s->moe_acc = p->cfg.experts ? calloc(2 * (size_t)p->cfg.experts, sizeof(double)) : NULL;
    s->moe_sum = p->cfg.experts ? calloc(2 * (size_t)p->cfg.experts + 2, sizeof(double)) : NULL;
    s->mem = dt_alloc_aligned(n * sizeof(float));
    if (!s->val || !s->stats || !s->packed || !s->lp_keep || !s->dval || !s->wgrad || !s->inputs || !s->targets || !s->pos || !s->first || !s->mem ||
        (dropping(p) && (!s->row_key || !s->lora_rk)) || (p->cfg.experts && (!s->moe_int || !s->moe_acc || !s->moe_sum))) {
        dt_program_free_slot(s);
        char sz[32];
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate %s of activations for B=%d T=%d", dt_format_size(n * sizeof(float), sz, sizeof sz),
                        B, T);
    }
    memset(s->mem, 0, n * sizeof(float));
    s->lay_B = B, s->lay_T = T;
    lay_again(p, s);
    s->cap_BT = B * T;
    s->cap_T = T;
    return DT_OK;
}

dt_status dt_program_set_slots(dt_program *p, int n) {
    if (n < 1 || n > 1024) return dt_error(DT_ERR_ARG, "model: %d activation slots (1..1024)", n);
    program_slot *x = calloc((size_t)n, sizeof *x);
    if (!x) return dt_error(DT_ERR_NOMEM, "model: out of memory for %d slots", n);
    dt_program_free_slots(p);
    free(p->slots);
    p->slots = p->s = x;
    p->nslots = n;
    return DT_OK;
}

void dt_program_use_slot(dt_program *p, int k) {
    if (k >= 0 && k < p->nslots) p->s = &p->slots[k];
}

int dt_program_num_slots(const dt_program *p) { return p->nslots; }

dt_status dt_program_reserve(dt_program *p, int B, int T) {
    if (B < 1 || T < 1 || T > p->cfg.max_seq_len) return dt_error(DT_ERR_ARG, "reserve: B=%d T=%d (T must be 1..%d)", B, T, p->cfg.max_seq_len);
    return reserve(p, B, T);
}

size_t dt_program_activation_memory(const dt_program *p) {
    size_t n = p->lp_work ? p->lp_work_floats * sizeof(float) : 0;
    if (p->moe_wide) n += dt_program_moe_weight_floats(p) * sizeof(float);
    n += dt_program_moe_ep_bytes(p);
    for (int k = 0; k < p->nslots; k++) {
        const program_slot *s = &p->slots[k];
        if (s->mem) n += s->floats * sizeof(float) + 3 * (size_t)s->cap_BT * sizeof(int32_t);
    }
    for (int i = 0; i < p->nareas; i++) n += p->areas[i].floats * sizeof(float);
    return n;
}

size_t dt_program_activation_kept(const dt_program *p) {
    const program_slot *s = p->s;
    return s->mem ? s->kept * sizeof(float) : 0;
}

size_t dt_program_memory(const dt_program *p) {
    /* LoRA's frozen base: its gradients' pages are never touched but for the norms' few; the adapters train */
    size_t grads = p->lora ? 2 * p->lora->nparams : p->nparams;
    return (p->nparams + grads) * sizeof(float) + dt_program_lp_params_bytes(p) + dt_program_activation_memory(p);
}

/* ---- forward ---- */

static float *weight(const dt_program *p, int l, int i) { return p->params + p->tab[tensor_at(p, l, i)].offset; }
static float *weight_grad(const dt_program *p, int l, int i) { return p->grads + p->tab[tensor_at(p, l, i)].offset; }


/* q|k|v of all heads from q, K/V heads and v side by side (in: [BT, Q + 2 KV]), q and k turned by position. */
static void attention_pack(const dt_program *p, float *packed, const float *in, int BT) {
    int hd = p->cfg.head_dim, NH = p->NHl;
    size_t Q = (size_t)p->Ql;
    dt_attention_pack(packed, in, BT, NH, p->KVl / hd, hd, p->kv_of);
    if (p->f->rotary) {
        dt_rope_forward(packed, p->inv_freq, p->s->pos, BT, NH, hd, 3 * Q);
        dt_rope_forward(packed + Q, p->inv_freq, p->s->pos, BT, NH, hd, 3 * Q);
    }
}

/* Its backward: dpacked (turned back in place) summed into d(q, K/V heads, v). */
static void attention_unpack(const dt_program *p, float *din, float *dpacked, int BT) {
    int hd = p->cfg.head_dim, NH = p->NHl;
    size_t Q = (size_t)p->Ql;
    if (p->f->rotary) {
        dt_rope_backward(dpacked, p->inv_freq, p->s->pos, BT, NH, hd, 3 * Q);
        dt_rope_backward(dpacked + Q, p->inv_freq, p->s->pos, BT, NH, hd, 3 * Q);
    }
    dt_attention_unpack(din, dpacked, BT, NH, p->KVl / hd, hd, p->kv_of);
}

/* A context-parallel attention's status: the first failure is kept, as a collective's (the pass runs on). */
static void cp_status(dt_program *p, dt_status st) {
    if (st && !p->comm_err) p->comm_err = st;
}

/* Whether a block's Linear with first weight w is split by tensor parallelism, and how. */
static dt_tp_split split_of(const dt_program *p, int w) { return p->part.tp_size > 1 ? p->f->block[w].split : DT_SPLIT_NONE; }

void dt_program_set_linear_observer(dt_program *p, dt_linear_observer fn, void *ctx) {
    p->observer = fn;
    p->observer_ctx = ctx;
}

/* The observer shown rows x width values of layer l's Linear k (its input in forward, its output's gradient in backward). */
static void observe(const dt_program *p, int l, int k, int backward, const float *x, int width) {
    if (!p->observer || (p->recomputing && !backward)) return;
    dt_linear_event e = { .layer = l, .op = k, .backward = backward, .weight = &p->tab[tensor_at(p, l, p->ops[k].s.w)],
                          .rows = (size_t)p->s->B * p->s->T, .width = width, .values = x, .pieces = 1, .spatial = 1 };
    p->observer(p->observer_ctx, &e);
}

/* A Linear: out = in @ w^T + b, f32 or autocast's 16-bit form from the parameters' 16-bit copy. A column-parallel
 * one reads all rows (gathered under sequence parallelism); a row-parallel one's outputs are partial sums, whole once
 * summed (or reduce-scattered) over the group (and then rounded to 16 bits), its bias on one rank. */
static void linear_forward(dt_program *p, int l, int k) {
    const dt_program_op *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    int BT = p->s->B * p->s->T, R = (int)dt_program_rows(p, s->out);
    float *in = value(p, l, s->in), *out = value(p, l, s->out);
    dt_tp_split split = split_of(p, s->w);
    bool rows = split == DT_SPLIT_ROW, bias = s->b >= 0 && (!rows || p->part.tp_rank == 0);
    const float *x = split == DT_SPLIT_COLUMN ? dt_program_tp_gather(p, in, dt_program_rows(p, s->in) * o->width_in) : in;
    float *y = rows && R < BT ? p->s->partial : out;
    size_t wo = p->tab[tensor_at(p, l, s->w)].offset, bo = s->b >= 0 ? p->tab[tensor_at(p, l, s->b)].offset : 0;
    observe(p, l, k, 0, x, o->width_in);
    if (p->prec == DT_F32) dt_matmul_forward(y, x, p->params + wo, bias ? p->params + bo : NULL, BT, o->width_in, o->width_out);
    else dt_matmul_forward_lp(y, x, p->params_lp + wo, bias ? p->params_lp + bo : NULL, BT, o->width_in, o->width_out, p->prec, p->lp_work,
                              p->lp_work_floats, rows);
    if (p->lora && !p->lora_off) dt_program_lora_forward(p, l, k, x, y);
    if (!rows) return;
    dt_program_tp_combine(p, y, out, (size_t)R * o->width_out);
    if (p->prec != DT_F32) dt_lp_round(out, (size_t)R * o->width_out, p->prec);
}

static void op_forward(dt_program *p, int l, int k) {
    const dt_program_op *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    program_slot *x = p->s;
    int BT = x->B * x->T, NH = p->NHl, Q = p->Ql;
    float *in = value(p, l, s->in), *out = value(p, l, s->out), *st = op_stats(p, l, k);
    int R = (int)dt_program_rows(p, s->out); /* a norm's and an add's rows: the stream's */
    /* under mixed precision a norm's, attention's and an activation's outputs are rounded to 16 bits (autocast casts
     * them for the next Linear, or computes them in 16 bits) */
    switch (s->kind) {
    case DT_OP_NORM:
        if (p->f->rms) dt_rmsnorm_forward(out, st + R, in, weight(p, l, s->w), R, o->width_in, p->cfg.norm_eps);
        else dt_layernorm_forward(out, st, st + R, in, weight(p, l, s->w), weight(p, l, s->b), R, o->width_in);
        dt_lp_round(out, (size_t)R * o->width_out, p->prec);
        break;
    case DT_OP_LINEAR: linear_forward(p, l, k); break;
    case DT_OP_ATTENTION: {
        float *qkv = in;
        if (p->repack) {
            attention_pack(p, qkv = x->packed[p->bk[l]], in, BT);
            dt_lp_round(qkv, (size_t)BT * 3 * Q, p->prec); /* turned q and k are 16-bit values too (and keep losslessly) */
        }
        if (cp(p)) cp_status(p, p->part.cp->forward(p->part.cp->ctx, out, st, qkv, x->B, x->T, Q, NH));
        else if (x->blockwise) dt_attention_forward_lse_docs(out, st, qkv, x->docs ? x->first : NULL, x->B, x->T, Q, NH);
        else dt_attention_forward_docs(out, st, qkv, x->docs ? x->first : NULL, x->B, x->T, Q, NH);
        dt_lp_round(out, (size_t)BT * Q, p->prec);
        break;
    }
    case DT_OP_GELU:
        dt_gelu_forward(out, in, (size_t)BT * o->width_in);
        dt_lp_round(out, (size_t)BT * o->width_out, p->prec);
        break;
    case DT_OP_SWIGLU:
        dt_swiglu_forward(out, in, BT, o->width_out);
        dt_lp_round(out, (size_t)BT * o->width_out, p->prec);
        break;
    case DT_OP_ADD: dt_residual_forward(out, in, value(p, l, s->in2), (size_t)R * o->width_out); break;
    case DT_OP_MOE:
        dt_program_moe_forward(p, l, k, in, out);
        dt_lp_round(out, (size_t)R * o->width_out, p->prec);
        break;
    case DT_OP_HEADNORM:
        dt_headnorm_forward(out, st, in, weight(p, l, s->w), weight(p, l, s->w + 1), BT, NH, p->KVl / p->cfg.head_dim, p->cfg.head_dim,
                            p->cfg.norm_eps);
        dt_lp_round(out, (size_t)BT * o->width_out, p->prec);
        break;
    }
}

/* The trace shows each unit's forward and backward on the compute track. */
void dt_program_unit_name(int layers, const char *pass, int u, char *out, size_t cap) {
    if (u == 0) snprintf(out, cap, "%s embedding", pass);
    else if (u <= layers) snprintf(out, cap, "%s block %d", pass, u - 1);
    else snprintf(out, cap, "%s head", pass);
}

static void trace_unit(const dt_program *p, const char *pass, int u) {
    if (!dt_trace_on()) return;
    char name[32];
    dt_program_unit_name(p->cfg.num_layers, pass, u, name, sizeof name);
    dt_trace_begin(DT_TRACK_SELF, name, "\"unit\":%d", u);
}

static void unit_end(void) { DT_TRACE_END(DT_TRACK_SELF); }

/* The logits times x (a temperature's 1 / t), a row at a time where they are 16-bit (rounded again). */
static void scale_logits(dt_program *p, int BT, float x) {
    size_t n = (size_t)p->Vl;
    for (int i = 0; i < BT; i++) {
        float *row = p->prec == DT_F32 ? p->s->logits + i * n : p->lp_work;
        if (p->prec != DT_F32) dt_lp_unpack(row, (const uint16_t *)p->s->logits + i * n, n, p->prec);
        for (size_t v = 0; v < n; v++) row[v] *= x;
        if (p->prec != DT_F32) dt_lp_pack((uint16_t *)p->s->logits + i * n, row, n, p->prec);
    }
}

static void head_forward(dt_program *p, const int32_t *targets, float *loss) {
    program_slot *s = p->s;
    int L = p->cfg.num_layers, BT = s->B * s->T, C = p->cfg.channels, R = (int)dt_program_rows(p, -1);
    const float *x = stream_in(p, L), *w = p->params + p->tab[p->i_lnf].offset;
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, L + 1);
    dt_program_lp_cast(p, L + 1, false);
    trace_unit(p, "forward", L + 1);
    if (p->f->rms) dt_rmsnorm_forward(s->lnf, s->lnf_stats + R, x, w, R, C, p->cfg.norm_eps);
    else dt_layernorm_forward(s->lnf, s->lnf_stats, s->lnf_stats + R, x, w, w + C, R, C);
    dt_lp_round(s->lnf, (size_t)R * C, p->prec);
    const float *lnf = dt_program_tp_gather(p, s->lnf, (size_t)R * C); /* the head is column-parallel: all rows */
    size_t ho = p->tab[p->i_head].offset;
    if (p->prec == DT_F32) dt_matmul_forward(s->logits, lnf, p->params + ho, NULL, BT, C, p->Vl);
    else dt_matmul_forward_lp16((uint16_t *)s->logits, lnf, p->params_lp + ho, BT, C, p->Vl, p->prec, p->lp_work, p->lp_work_floats);
    if (p->logit_inv_temp > 0) scale_logits(p, BT, p->logit_inv_temp);
    if (targets) {
        memcpy(s->targets, targets, (size_t)BT * sizeof(int32_t));
        /* the mean over the scored tokens: this micro-batch's, or the count the caller gives (the global batch's share) */
        size_t scored = 0;
        for (int i = 0; i < BT; i++) scored += targets[i] >= 0;
        s->loss_tokens = p->loss_tokens > 0 ? p->loss_tokens : scored > 0 ? (double)scored : 1;
        s->loss = (float)(dt_program_tp_crossentropy_forward(p, targets) / s->loss_tokens);
        if (p->token_loss) { /* the caller's loss over the rows' cross-entropies; backward weighs each row by its d(loss) */
            float *st = p->token_stats ? s->tok_stats : NULL;
            if (st) dt_program_tp_token_stats(p, targets), memset(st + 2 * (size_t)BT, 0, sizeof(float) * (size_t)BT);
            dt_token_rows r = { .B = s->B, .T = s->T, .ce = s->losses, .targets = targets, .entropy = st, .lsq = st ? st + BT : NULL,
                                .dentropy = st ? st + 2 * (size_t)BT : NULL };
            s->loss = p->token_loss(p->token_loss_ctx, &r, s->dce), s->loss_tokens = 1;
            s->ent_grad = false;
            for (int i = 0; st && i < BT; i++) s->ent_grad |= r.dentropy[i] != 0;
        }
        double t[DT_MOE_TERMS] = { dt_program_moe_balance_loss(p), dt_program_moe_z_loss(p), dt_program_moe_seq_loss(p),
                                   dt_program_moe_global_loss(p) };
        s->loss += (float)(p->cfg.aux_coef * t[0] + p->z_coef * t[1] + p->seq_coef * t[2] + p->glob_coef * t[3]); /* a mixture of experts' */
        for (int i = 0; p->cfg.experts && !p->recomputing && i <= DT_MOE_TERMS; i++) p->moe_terms[i] += i < DT_MOE_TERMS ? t[i] : 1;
        if (loss) *loss = s->loss;
    }
    unit_end();
    dt_program_lp_drop(p);
}

static dt_status check_range(const dt_program *p, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets, int B,
                             int T) {
    const dt_lm_config *c = &p->cfg;
    int r = a < b ? dt_program_range_of(p, a) : -1;
    if (r < 0 || b > p->rb[r]) {
        if (p->nr > 1) return dt_error(DT_ERR_ARG, "forward: units [%d, %d) are not within one of the model's %d chunks", a, b, p->nr);
        return dt_error(DT_ERR_ARG, "forward: units [%d, %d) are not a range of the model's [%d, %d)", a, b, p->ua, p->ub);
    }
    if (B < 1 || T < 1 || T > c->max_seq_len) return dt_error(DT_ERR_ARG, "forward: B=%d T=%d (T must be 1..%d)", B, T, c->max_seq_len);
    if (a == 0 && !tokens) return dt_error(DT_ERR_ARG, "forward: a range from unit 0 needs the tokens");
    if (a > 0 && !x) return dt_error(DT_ERR_ARG, "forward: a range from unit %d needs its input activations", a);
    if (p->part.sp && p->part.tp_size > 1 && T % p->part.tp_size)
        return dt_error(DT_ERR_ARG, "forward: --sp splits the sequence of %d tokens into --tp %d parts: it does not divide", T, p->part.tp_size);
    int n = p->part.cp_size;
    if (n > 1 && (T % 2 || (long)T * n > c->max_seq_len))
        return dt_error(DT_ERR_ARG, "forward: a context-parallel rank's %d rows a sequence %s", T,
                        T % 2 ? "are not two equal chunks" : "make a sequence longer than the model's positions");
    for (size_t i = 0; i < (size_t)B * T; i++) {
        if (a == 0 && (tokens[i] < 0 || tokens[i] >= c->vocab_size))
            return dt_error(DT_ERR_ARG, "forward: input token %d at position %zu is outside the vocabulary (0..%d)", tokens[i], i, c->vocab_size - 1);
        if (targets && (targets[i] < 0 || targets[i] >= c->vocab_size) && targets[i] != DT_IGNORE_INDEX)
            return dt_error(DT_ERR_ARG, "forward: target token %d at position %zu is outside the vocabulary (0..%d; %d: not scored)",
                            targets[i], i, c->vocab_size - 1, DT_IGNORE_INDEX);
    }
    return DT_OK;
}

/* What a micro-batch's first range sets in its slot: the positions, dt_program_set_positions' (checked: each row's
 * document starts at a position 0 and counts up from it), each document's first row for attention, else t (or CP's
 * place); each sequence's key, where dropout draws from them; a mixture of experts' balance, from nothing. */
static dt_status begin_micro_batch(dt_program *p, int BT, int T) {
    program_slot *s = p->s;
    s->docs = p->pos_src != NULL;
    for (int i = 0; i < BT; i++) {
        int t = i % T, q = s->docs ? p->pos_src[i] : cp(p) ? dt_gpt2_cp_position(p->part.cp_rank, p->part.cp_size, T, t) : t;
        if (s->docs && (q < 0 || q > t || (q > 0 && q != p->pos_src[i - 1] + 1)))
            return dt_error(DT_ERR_ARG, "forward: position %d at row %d of sequence %d: a document's positions count from 0 at its first row", q, t,
                            i / T);
        s->pos[i] = q, s->first[i] = t - q;
    }
    s->keyed = p->key_src && dropping(p);
    dt_status st = dt_program_moe_sums_wait(s); /* an evaluation's, which no backward waited for */
    if (!st && s->moe_acc) st = dt_program_moe_begin(p, BT / T);
    if (st) return st;
    if (s->keyed) memcpy(s->row_key, p->key_src, (size_t)(BT / T) * sizeof(uint64_t));
    return DT_OK;
}

dt_status dt_program_forward_units(dt_program *p, int a, int b, const int32_t *tokens, const float *x, const int32_t *targets, int B, int T,
                                   float *loss) {
    int L = p->cfg.num_layers, BT = B * T;
    if (b < L + 2) targets = NULL; /* no loss before the head */
    dt_status st = check_range(p, a, b, tokens, x, targets, B, T);
    if (!st && p->s->rs[dt_program_range_of(p, a)].w_pending)
        st = dt_error(DT_ERR_ARG, "forward: the activations' last backward waits for its weight gradients (dt_program_backward_weights)");
    if (!st) st = reserve(p, B, T);
    if (st) return st;
    program_slot *s = p->s;
    p->comm_err = DT_OK;
    p->cur = dt_program_range_of(p, a);
    if ((st = hold_area(p, p->cur))) return st;
    s->B = B, s->T = T;
    s->rs[p->cur] = (run_state){ a, b, targets != NULL || b < L + 2, false, NULL };
    /* each row's position: t, or under context parallelism its place in the whole sequence (rotary and learned alike),
     * or the caller's (packed documents: attention stays in each); a micro-batch's first range sets them */
    if (p->cur == 0 && (st = begin_micro_batch(p, BT, T))) return st;
    if (a == 0) {
        memcpy(s->inputs, tokens, (size_t)BT * sizeof(int32_t));
        dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, 0);
        dt_program_lp_cast(p, 0, false);
        trace_unit(p, "forward", 0);
        dt_program_tp_embedding_forward(p, s->range_in[p->cur], tokens);
        unit_end();
        dt_program_lp_drop(p);
    } else if (x != stream_in(p, a - 1)) {
        memcpy(stream_in(p, a - 1), x, dt_program_rows(p, -1) * p->cfg.channels * sizeof(float));
    }
    int last = b - 1 < L ? b - 1 : L; /* blocks [first, last) */
    for (int l = a > 0 ? a - 1 : 0; l < last; l++) {
        dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_FORWARD, l + 1);
        dt_program_lp_cast(p, l + 1, false);
        trace_unit(p, "forward", l + 1);
        for (int k = 0; k < p->f->nops; k++)
            if (op_runs(p, l, k)) op_forward(p, l, k);
        dt_program_pack_block(p, l, true);
        unit_end();
        dt_program_lp_drop(p);
    }
    /* the micro-batch's balance once this rank's last range has run (the head's loss and every backward take it) */
    if (p->cfg.experts && p->cur == p->nr - 1 && (st = dt_program_moe_sums_post(p))) return st;
    if (b == L + 2 && p->cfg.experts && (st = dt_program_moe_sums_land(p))) return st;
    if (b == L + 2) head_forward(p, targets, loss);
    return p->comm_err;
}

dt_status dt_program_forward(dt_program *p, const int32_t *inputs, const int32_t *targets, int B, int T, float *loss) {
    if (p->device.forward) return p->device.forward(p->device.ctx, inputs, targets, B, T, p->loss_tokens, loss);
    if (p->ua != 0 || p->ub != p->cfg.num_layers + 2 || p->nr > 1)
        return dt_error(DT_ERR_ARG, "forward: the model holds units [%d, %d) only (dt_program_forward_units runs a range)", p->ua, p->ub);
    return dt_program_forward_units(p, 0, p->ub, inputs, NULL, targets, B, T, loss);
}

const float *dt_program_logits(const dt_program *p) { return p->ub == p->cfg.num_layers + 2 && p->prec == DT_F32 ? p->s->logits : NULL; }

const float *dt_program_output(const dt_program *p) {
    const run_state *r = &p->s->rs[p->cur];
    if (!p->s->mem || r->b > p->cfg.num_layers + 1) return NULL;
    return r->b >= 2 ? value(p, r->b - 2, DT_V_OUT) : p->s->range_in[p->cur];
}

const float *dt_program_input_grad(const dt_program *p, const int32_t **tokens, int *n) {
    if (tokens) *tokens = p->s->inputs;
    if (n) *n = p->s->B * p->s->T;
    return p->s->rs[p->cur].dinput;
}

dt_status dt_program_use_chunk(dt_program *p, int chunk) {
    if (chunk < 0 || chunk >= p->nr) return dt_error(DT_ERR_ARG, "model: chunk %d of %d", chunk, p->nr);
    p->cur = chunk;
    return DT_OK;
}

int dt_program_chunks(const dt_program *p, int *a, int *b) {
    for (int r = 0; r < p->nr; r++) a[r] = p->ra[r], b[r] = p->rb[r];
    return p->nr;
}

/* ---- backward ---- */

/* A block's value as backward reads it: its input, where blocks are kept in 16 bits, widened again into res1 (the
 * stream slot it came in has been written since). */
static float *bwd_value(const dt_program *p, int l, int v) {
    return v == DT_V_IN && dt_program_packs(p) ? p->s->res1 : value(p, l, v);
}

/* A Linear's input as its weight gradient reads it: all rows (gathered again under sequence parallelism). */
static const float *linear_input(dt_program *p, int l, const dt_program_op *o) {
    const float *in = bwd_value(p, l, o->s.in);
    return split_of(p, o->s.w) == DT_SPLIT_COLUMN ? dt_program_tp_gather(p, in, dt_program_rows(p, o->s.in) * o->width_in) : in;
}

/* dinp += dout @ w, dw += dout^T @ inp, db += column sums of dout: f32, or autocast's 16-bit form, which rounds
 * dout to 16 bits in place first (a branch's own gradient: the stream's goes on whole) and leaves a column-parallel
 * Linear's share of dinp in f32 (summed, then rounded, by the caller). */
/* K/V heads kept by several tensor-parallel ranks (fewer K/V heads than ranks): each rank's weight gradient of them
 * holds its own query heads' part. Around a Linear's weight gradient, the K/V tensors' rows are set aside (before:
 * what earlier micro-batches left, zeroed) and, after, this micro-batch's parts summed over the group (each K/V head's
 * in its own slot of a buffer of them all) and added back: every rank that keeps a K/V head gets its whole gradient,
 * at once, so data parallelism and the optimizer see whole gradients. */
static void kv_kept(dt_program *p, int l, const dt_program_op *o, bool after) {
    size_t at = 0;
    for (int j = 0; j < o->s.nw; j++)
        for (int bias = 0; bias < 2; bias++) {
            if (bias && o->s.b < 0) continue;
            int i = (bias ? o->s.b : o->s.w) + j;
            if (p->f->block[i].rows != W_KV) continue;
            const dt_tensor_info *t = &p->tab[tensor_at(p, l, i)];
            float *g = p->grads + t->offset, *keep = p->kv_keep + at;
            size_t n = t->count, all = n * (size_t)p->cfg.kv_heads, mine = (size_t)p->kv0 * n;
            at += n;
            if (!after) {
                memcpy(keep, g, n * sizeof(float));
                memset(g, 0, n * sizeof(float));
                continue;
            }
            memset(p->kv_sum, 0, all * sizeof(float));
            memcpy(p->kv_sum + mine, g, n * sizeof(float));
            dt_program_tp_sum(p, p->kv_sum, all);
            for (size_t e = 0; e < n; e++) g[e] = p->kv_sum[mine + e] + keep[e];
        }
}

static void linear_grads(dt_program *p, const dt_program_op *o, int l, float *dinp, float *dw, float *db, float *dout, const float *inp,
                         int partial) {
    int BT = p->s->B * p->s->T;
    size_t wo = p->tab[tensor_at(p, l, o->s.w)].offset;
    bool kept = p->kv_keep && dw;
    if (kept) kv_kept(p, l, o, false);
    if (p->prec == DT_F32) dt_matmul_backward(dinp, dw, db, dout, inp, dinp ? p->params + wo : NULL, BT, o->width_in, o->width_out);
    else dt_matmul_backward_lp(dinp, dw, db, dout, inp, dinp ? p->params_lp + wo : NULL, BT, o->width_in, o->width_out, p->prec,
                               p->lp_work, p->lp_work_floats, partial);
    if (kept) kv_kept(p, l, o, true);
}

static void linear_backward(dt_program *p, int l, int k, float *din, float *dout) {
    const dt_program_op *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    program_slot *x = p->s;
    int BT = x->B * x->T;
    dt_tp_split split = split_of(p, s->w);
    /* a split backward's B leaves the weight gradients to W, keeping d(output) of all rows; frozen weights (LoRA's
     * base) get none */
    bool none = p->split_bwd || p->lora;
    float *dw = none ? NULL : weight_grad(p, l, s->w), *db = none || s->b < 0 ? NULL : weight_grad(p, l, s->b);
    float *keep = p->split_bwd ? x->wgrad[p->bk[l] * p->f->nops + k] : NULL;
    /* a row-parallel Linear's d(output) is every row's (gathered under sequence parallelism) */
    float *dy = split == DT_SPLIT_ROW ? (float *)dt_program_tp_gather(p, dout, dt_program_rows(p, s->out) * o->width_out) : dout;
    size_t ny = (size_t)BT * o->width_out;
    dt_lp_round(dy, ny, p->prec);
    observe(p, l, k, 1, dy, o->width_out);
    if (keep) memcpy(keep, dy, ny * sizeof(float));
    if (split != DT_SPLIT_COLUMN) {
        if (dt_program_lora_adapts(p, k)) dt_program_lora_backward(p, l, k, bwd_value(p, l, s->in), dy, din);
        linear_grads(p, o, l, din, dw, db, dy, dw ? bwd_value(p, l, s->in) : NULL, 0);
        return;
    }
    /* d(input) is this rank's share, summed (or reduce-scattered) over the group: the Linear is its input's only
     * reader (shape_ops), so its gradient holds nothing else yet */
    size_t n = dt_program_rows(p, s->in) * o->width_in;
    float *dx = n < (size_t)BT * o->width_in ? p->s->partial : din;
    if (dx != din) memset(dx, 0, (size_t)BT * o->width_in * sizeof(float));
    linear_grads(p, o, l, dx, dw, db, dy, dw ? linear_input(p, l, o) : NULL, 1);
    if (dt_program_lora_adapts(p, k)) dt_program_lora_backward(p, l, k, linear_input(p, l, o), dy, dx); /* (a frozen one kept no input) */
    dt_program_tp_combine(p, dx, din, n);
    if (p->prec != DT_F32) dt_lp_round(din, n, p->prec);
}

/* A head norm's: its weights' gradients are this rank's heads' part, the other tensor-parallel ranks holding the other
 * heads, so this micro-batch's part is summed over the group before it is added (as a sequence-parallel norm's). */
static void headnorm_backward(dt_program *p, int l, const dt_op_spec *s, float *din, const float *dout, const float *in, const float *st) {
    int hd = p->cfg.head_dim, BT = p->s->B * p->s->T;
    float *gq = weight_grad(p, l, s->w), *gk = weight_grad(p, l, s->w + 1), *g = p->s->headgrad;
    bool split = p->part.tp_size > 1;
    if (split) memset(g, 0, 2 * (size_t)hd * sizeof(float));
    dt_headnorm_backward(din, split ? g : gq, split ? g + hd : gk, dout, in, weight(p, l, s->w), weight(p, l, s->w + 1), st, BT, p->NHl,
                         p->KVl / hd, hd);
    if (!split) return;
    dt_program_tp_sum(p, g, 2 * (size_t)hd);
    for (int i = 0; i < hd; i++) gq[i] += g[i], gk[i] += g[hd + i];
}

static void op_backward(dt_program *p, int l, int k, float *din_stream, float *dout_stream) {
    const dt_program_op *o = &p->ops[k];
    const dt_op_spec *s = &o->s;
    program_slot *x = p->s;
    int BT = x->B * x->T, NH = p->NHl, Q = p->Ql;
    float *in = bwd_value(p, l, s->in), *out = value(p, l, s->out), *st = op_stats(p, l, k);
    float *din = s->in == DT_V_IN ? din_stream : x->dval[s->in], *dout = s->out == DT_V_OUT ? dout_stream : x->dval[s->out];
    int R = (int)dt_program_rows(p, s->out);
    switch (s->kind) {
    case DT_OP_NORM:
        dt_program_norm_backward(p, din, weight_grad(p, l, s->w), s->b >= 0 ? weight_grad(p, l, s->b) : NULL, dout, in, weight(p, l, s->w), st,
                                 o->width_in);
        break;
    case DT_OP_LINEAR: linear_backward(p, l, k, din, dout); break;
    case DT_OP_ATTENTION: {
        bool re = p->repack;
        float *qkv = re ? x->packed[p->bk[l]] : in, *dqkv = re ? x->dpacked : din;
        if (re) memset(dqkv, 0, (size_t)BT * 3 * Q * sizeof(float));
        if (cp(p)) cp_status(p, p->part.cp->backward(p->part.cp->ctx, dqkv, dout, out, qkv, st, x->B, x->T, Q, NH));
        else if (x->blockwise) dt_attention_backward_lse_docs(dqkv, dout, out, qkv, st, x->docs ? x->first : NULL, x->B, x->T, Q, NH);
        else dt_attention_backward_docs(dqkv, dout, qkv, st, x->docs ? x->first : NULL, x->B, x->T, Q, NH);
        if (re) attention_unpack(p, din, dqkv, BT);
        break;
    }
    case DT_OP_GELU: dt_gelu_backward(din, in, dout, (size_t)BT * o->width_in); break;
    case DT_OP_SWIGLU: dt_swiglu_backward(din, in, dout, BT, o->width_out); break;
    case DT_OP_ADD: {
        /* d(in) += dout, d(in2) += dout; copied where the add is the first to write one (p->vcopy: it was not zeroed) */
        float *din2 = s->in2 == DT_V_IN ? din_stream : x->dval[s->in2];
        size_t n = (size_t)R * o->width_out;
        if (p->vcopy[s->in] && p->vcopy[s->in2]) {
            memcpy(din, dout, n * sizeof(float));
            memcpy(din2, dout, n * sizeof(float));
        } else {
            float *sides[2] = { din, din2 };
            for (int k2 = 0; k2 < 2; k2++) {
                if (p->vcopy[k2 ? s->in2 : s->in]) memcpy(sides[k2], dout, n * sizeof(float));
                else dt_residual_forward(sides[k2], sides[k2], dout, n);
            }
        }
        break;
    }
    case DT_OP_MOE: dt_program_moe_backward(p, l, k, in, dout, din); break;
    case DT_OP_HEADNORM: headnorm_backward(p, l, s, din, dout, in, st); break;
    }
}

/* After a unit's backward: the 16-bit copy it read given back, and (unless held or split) its gradients announced. */
static void unit_done(dt_program *p, int u, bool announce) {
    dt_program_lp_drop(p);
    if (announce && !p->hold_hooks) dt_hook_list_call(&p->grad_hooks, DT_HOOK_GRADS_READY, u);
}

/* The loss's gradient under mixed precision, taken block by block where the head's backward reads it. */
static dt_ce_grad ce_grad(const dt_program *p, float dscale) {
    const program_slot *s = p->s;
    bool ent = p->token_loss && s->ent_grad;
    return (dt_ce_grad){ .stats = s->ce_stats, .targets = s->targets, .V = p->Vv, .v0 = p->v0, .dscale = dscale,
                         .row_scale = p->token_loss ? s->dce : NULL, .ent_scale = ent ? s->tok_stats + 2 * (size_t)s->B * s->T : NULL,
                         .ent = ent ? s->tok_stats : NULL };
}

/* The head's weight gradient from the logits' gradient (which backward left in place; in 16 bits computed again from
 * the logits as backward computed it) and its input lnf (all rows); with dx, d(its input) too (this rank's share). */
static void head_grads(dt_program *p, float *dx, float *dw, const float *lnf, float dscale) {
    program_slot *s = p->s;
    int C = p->cfg.channels, BT = s->B * s->T;
    size_t ho = p->tab[p->i_head].offset;
    if (p->prec == DT_F32) {
        dt_matmul_backward(dx, dw, NULL, s->logits, lnf, dx ? p->params + ho : NULL, BT, C, p->Vl);
        return;
    }
    dt_ce_grad ce = ce_grad(p, dscale);
    dt_matmul_backward_lp16(dx, dw, (const uint16_t *)s->logits, &ce, lnf, dx ? p->params_lp + ho : NULL, BT, C, p->Vl, p->prec, p->lp_work,
                            p->lp_work_floats, dx && p->part.tp_size > 1);
}

/* Recomputing: block l's forward run again from its kept input (its values marked as recomputed); else nothing. */
static void forward_again(dt_program *p, int l) {
    if (!p->recompute) return;
    p->recomputing = true;
    for (int k = 0; k < p->f->nops; k++)
        if (op_runs(p, l, k)) op_forward(p, l, k);
    p->recomputing = false;
}

/* The loss, the head and the final norm, backward: d(the stream entering the head) into dres. */
static void head_backward(dt_program *p, float *dres, float grad_scale) {
    program_slot *s = p->s;
    int L = p->cfg.num_layers, C = p->cfg.channels, BT = s->B * s->T;
    size_t BTC = (size_t)BT * C, RC = dt_program_rows(p, -1) * (size_t)C;
    float dscale = (float)(grad_scale / s->loss_tokens), *dw = p->split_bwd || p->lora ? NULL : p->grads + p->tab[p->i_head].offset;
    if (p->logit_inv_temp > 0) dscale *= p->logit_inv_temp; /* the logits were divided by a temperature */
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, L + 1);
    dt_program_lp_cast(p, L + 1, true);
    trace_unit(p, "backward", L + 1);
    /* the loss's gradient from forward's statistics (in 16 bits, as the head's backward reads it); with an entropy term
     * in one pass that takes the rows' weights */
    bool ent = p->token_loss && s->ent_grad;
    if (p->prec == DT_F32 && ent) {
        dt_ce_grad g = ce_grad(p, dscale);
        dt_crossentropy_grad_entropy(s->logits, BT, p->Vl, &g);
    } else if (p->prec == DT_F32) dt_program_tp_crossentropy_backward(p, dscale);
    /* a token loss: row i's gradient times d(loss)/d(its cross-entropy) (in 16 bits, where the head's backward makes it) */
    for (int i = 0; p->token_loss && !ent && p->prec == DT_F32 && i < BT; i++)
        for (int v = 0; v < p->Vl; v++) s->logits[(size_t)i * p->Vl + v] *= s->dce[i];
    s->w_dscale = dscale;
    /* the head is column-parallel (by vocabulary): d(its input) this rank's share of all rows, summed or reduce-scattered */
    float *dx = RC < BTC ? s->partial : s->dlnf;
    memset(dx, 0, BTC * sizeof(float));
    const float *lnf = dt_program_tp_gather(p, s->lnf, RC);
    head_grads(p, dx, dw, lnf, dscale); /* dw NULL: W of a split backward makes it */
    dt_program_tp_combine(p, dx, s->dlnf, RC);
    if (p->prec != DT_F32 && p->part.tp_size > 1) dt_lp_round(s->dlnf, RC, p->prec);
    const float *x = stream_in(p, L), *w = p->params + p->tab[p->i_lnf].offset;
    float *dn = p->grads + p->tab[p->i_lnf].offset;
    memset(dres, 0, RC * sizeof(float));
    dt_program_norm_backward(p, dres, dn, p->f->rms ? NULL : dn + C, s->dlnf, x, w, s->lnf_stats, C);
    unit_end();
    unit_done(p, L + 1, !p->split_bwd);
}

static void embedding_backward(dt_program *p, const float *dres, const char *pass) {
    dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, 0);
    dt_program_lp_cast(p, 0, true);
    trace_unit(p, pass, 0);
    if (!p->lora) dt_program_tp_embedding_backward(p, dres, p->defer_rows); /* LoRA's base is frozen */
    unit_end();
    unit_done(p, 0, true);
}

dt_status dt_program_backward_units(dt_program *p, const float *dout, float grad_scale) {
    program_slot *s = p->s;
    run_state *r = &s->rs[p->cur];
    int L = p->cfg.num_layers, a = r->a, b = r->b, nv = p->f->nvalues;
    if (!s->mem || !r->have_targets) return dt_error(DT_ERR_ARG, "backward: needs a forward (with targets, if it ran the head) first");
    if (r->w_pending) return dt_error(DT_ERR_ARG, "backward: the last backward's weight gradients (dt_program_backward_weights) are still to run");
    if (b < L + 2 && !dout) return dt_error(DT_ERR_ARG, "backward: units [%d, %d) end before the head: d(output) is needed", a, b);
    r->have_targets = false; /* the logits are about to become their gradient */
    s->moe_gscale = grad_scale;
    p->comm_err = DT_OK;
    size_t RC = dt_program_rows(p, -1) * p->cfg.channels; /* the stream's floats here */
    float *dres = s->dstream[0], *dnext = s->dstream[1];
    if (b == L + 2) head_backward(p, dres, grad_scale);
    else memcpy(dres, dout, RC * sizeof(float));
    int last = b - 1 < L ? b - 1 : L;
    for (int l = last - 1; l >= (a > 0 ? a - 1 : 0); l--) {
        dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, l + 1);
        dt_program_lp_cast(p, l + 1, true);
        trace_unit(p, "backward", l + 1);
        /* the block's activations again: recomputed from its kept input, or widened from 16 bits */
        forward_again(p, l);
        dt_program_pack_block(p, l, false);
        if (!p->vcopy[DT_V_IN]) memset(dnext, 0, RC * sizeof(float));
        const int *born = p->vborn + (p->moe_layer[l] ? nv : 0);
        for (int k = p->f->nops - 1; k >= 0; k--) {
            if (!op_runs(p, l, k)) continue;
            /* the gradients born here start at zero (their buffers may hold an earlier value's), unless copied */
            for (int v = 2; v < nv; v++)
                if (born[v] == k && !p->vcopy[v]) memset(s->dval[v], 0, dt_program_rows(p, v) * p->vw[v] * sizeof(float));
            op_backward(p, l, k, dnext, dres);
        }
        float *t = dres;
        dres = dnext, dnext = t;
        unit_end();
        unit_done(p, l + 1, !p->split_bwd);
    }
    r->dinput = dres; /* d(the range's input) (the embedding's output in range 0), for dt_program_input_grad */
    r->w_pending = p->split_bwd;
    if (a == 0 && !p->split_bwd) embedding_backward(p, dres, "backward");
    if (!p->split_bwd) release_areas(p, s, p->cur); /* nothing reads the range's activations again */
    return p->comm_err;
}

dt_status dt_program_backward(dt_program *p, float grad_scale) {
    return p->device.backward ? p->device.backward(p->device.ctx, grad_scale) : dt_program_backward_units(p, NULL, grad_scale);
}

void dt_program_set_device(dt_program *p, const dt_program_device *d) { p->device = d ? *d : (dt_program_device){ 0 }; }

/* W of a split backward: the Linears', the head's and the embedding's weight gradients, the sums one backward
 * makes, unit by unit in backward's order, each unit's announced when whole. Recomputing, each block's forward runs
 * again from its kept input first (B's recomputed values were one block's, overwritten since): its weights asked for
 * again as B asked (ZeRO-3 gathers a unit's parameters for its forward and B, and has let them go since) and their
 * 16-bit copy cast again where it is made unit by unit. Without recomputing W reads no weight. */
dt_status dt_program_backward_weights(dt_program *p) {
    program_slot *s = p->s;
    run_state *r = &s->rs[p->cur];
    int L = p->cfg.num_layers, a = r->a, b = r->b, last = b - 1 < L ? b - 1 : L;
    if (!r->w_pending) return dt_error(DT_ERR_ARG, "backward weights: no split backward (B) waits for its weight gradients");
    r->w_pending = false;
    p->comm_err = DT_OK;
    if (b == L + 2) {
        trace_unit(p, "weights", L + 1);
        if (!p->lora) head_grads(p, NULL, p->grads + p->tab[p->i_head].offset, dt_program_tp_gather(p, s->lnf, dt_program_rows(p, -1) * p->cfg.channels),
                   s->w_dscale);
        unit_end();
        unit_done(p, L + 1, true);
    }
    for (int l = last - 1; l >= (a > 0 ? a - 1 : 0); l--) {
        dt_program_pack_block(p, l, false); /* 16-bit blocks: the inputs widened again */
        trace_unit(p, "weights", l + 1);
        if (p->recompute) dt_hook_list_call(&p->unit_hooks, DT_HOOK_BEFORE_BACKWARD, l + 1);
        if (p->recompute) dt_program_lp_cast(p, l + 1, true);
        forward_again(p, l);
        for (int k = p->f->nops - 1; k >= 0; k--) {
            const dt_program_op *o = &p->ops[k];
            if (o->s.kind != DT_OP_LINEAR || p->lora || !op_runs(p, l, k)) continue; /* LoRA's adapters had theirs in B */
            linear_grads(p, o, l, NULL, weight_grad(p, l, o->s.w), o->s.b >= 0 ? weight_grad(p, l, o->s.b) : NULL,
                         s->wgrad[p->bk[l] * p->f->nops + k], linear_input(p, l, o), 0);
        }
        unit_end();
        unit_done(p, l + 1, true);
    }
    if (a == 0) embedding_backward(p, r->dinput, "weights");
    release_areas(p, s, p->cur);
    return p->comm_err;
}

dt_status dt_program_set_split_backward(dt_program *p, int on) {
    p->split_bwd = on != 0;
    dt_program_free_slots(p); /* the activations' layout changed */
    return DT_OK;
}

dt_status dt_program_set_recompute(dt_program *p, int on) {
    p->recompute = on != 0;
    dt_program_free_slots(p);
    return DT_OK;
}

void dt_program_set_attention(dt_program *p, dt_attn_mode mode) { p->attn = mode; }
dt_attn_mode dt_program_attention(const dt_program *p) { return p->attn; }
void dt_program_set_loss_tokens(dt_program *p, double n) { p->loss_tokens = n > 0 ? n : 0; }

void dt_program_set_row_keys(dt_program *p, const uint64_t *keys) { p->key_src = keys; }

dt_status dt_program_set_positions(dt_program *p, const int32_t *pos) {
    if (pos && p->part.cp_size > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "packed documents are not with --cp %d: a rank holds parts of each sequence", p->part.cp_size);
    p->pos_src = pos;
    return DT_OK;
}

dt_status dt_program_set_logit_temperature(dt_program *p, float t) {
    if (!(t > 0) || !isfinite(t)) return dt_error(DT_ERR_ARG, "a temperature of %g: a positive number", (double)t);
    p->logit_inv_temp = t == 1 ? 0 : 1 / t;
    return DT_OK;
}

dt_status dt_program_set_token_loss(dt_program *p, dt_token_loss_fn fn, void *ctx, bool stats) {
    if (fn && p->part.cp_size > 1)
        return dt_error(DT_ERR_UNSUPPORTED, "a loss over whole sequences (preference tuning) is not with --cp %d: a rank holds part of each sequence", p->part.cp_size);
    p->token_loss = fn, p->token_loss_ctx = ctx, p->token_stats = fn && stats;
    dt_program_free_slots(p); /* the slots keep d(loss)/d(ce) from now */
    return DT_OK;
}
void dt_program_set_defer_rows(dt_program *p, int on) { p->defer_rows = on != 0; }

double dt_program_tp_comm_seconds(dt_program *p) {
    double t = p->tp_seconds;
    p->tp_seconds = 0;
    return t;
}

void dt_program_hold_grad_hooks(dt_program *p, int on) { p->hold_hooks = on != 0; }

void dt_program_announce_grads(dt_program *p) {
    for (int u = p->cfg.num_layers + 1; u >= 0; u--)
        if (dt_program_range_of(p, u) >= 0) dt_hook_list_call(&p->grad_hooks, DT_HOOK_GRADS_READY, u);
}
