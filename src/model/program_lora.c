/* LoRA (Hu et al. 2021) in the model program's Linear op: low-rank adapters beside the targeted weights, which
 * freeze. The adapters are a model of their own as the engine sees one (their table, stores, units), so data
 * parallelism, ZeRO and a pipeline's stages carry them and nothing else. Names and the target rule are PEFT's, so
 * that its adapter folders and ours are one format (io/peft.c). */
#include "program_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

dt_status dt_lora_config_check(const dt_lora_config *c, const char *where) {
    if (c->rank < 1) return dt_error(DT_ERR_ARG, "%s: the LoRA rank %d must be at least 1", where, c->rank);
    if (!(c->alpha > 0)) return dt_error(DT_ERR_ARG, "%s: the LoRA alpha %g must be positive", where, (double)c->alpha);
    if (!(c->dropout >= 0 && c->dropout < 1)) return dt_error(DT_ERR_ARG, "%s: the LoRA dropout %g is not in [0, 1)", where, (double)c->dropout);
    if (!c->targets || !c->targets[0]) return dt_error(DT_ERR_ARG, "%s: LoRA needs its target modules (--lora-targets c_attn,c_proj)", where);
    return DT_OK;
}

/* Block tensor i's Hugging Face module at layer l: its name without ".weight", after the CausalLM's prefix. */
static void module_name(const dt_program *p, int i, int l, char *out, size_t n) {
    char hf[96];
    snprintf(hf, sizeof hf, p->f->block[i].hf, l);
    size_t len = strlen(hf);
    if (len > 7 && !strcmp(hf + len - 7, ".weight")) hf[len - 7] = 0;
    snprintf(out, n, "%s%s", p->f->hf_module_prefix ? p->f->hf_module_prefix : "", hf);
}

/* PEFT's rule for a list of names: the module is the name, or ends with "." and the name. */
static bool targeted(const char *module, const char *targets) {
    size_t m = strlen(module);
    for (const char *t = targets; *t;) {
        size_t k = strcspn(t, ",");
        if (k && k <= m && !strncmp(module + m - k, t, k) && (k == m || module[m - k - 1] == '.')) return true;
        t += k + (t[k] == ',');
    }
    return false;
}

/* How many of the model's layers run op k. */
static int layers_running(const dt_program *p, int k) {
    int L = p->cfg.num_layers, moe = dt_lm_moe_layers(&p->cfg);
    dt_layers on = p->f->ops[k].layers;
    return on == DT_LAYERS_ALL ? L : on == DT_LAYERS_MOE ? moe : L - moe;
}

/* Spec entry i's tensor in the first held block that has it (NULL: none). */
static const dt_tensor_info *first_held(const dt_program *p, int i) {
    for (int l = 0; l < p->cfg.num_layers; l++)
        if (p->bk[l] >= 0 && tensor_at(p, l, i) >= 0) return &p->tab[tensor_at(p, l, i)];
    return NULL;
}

/* Which parts of which Linears the targets name (the same in every block), and the adapters' count a block. */
static dt_status choose_parts(dt_program *p, program_lora *a) {
    const dt_family *f = p->f;
    char module[128], list[512] = "";
    size_t at = 0;
    for (int k = 0; k < f->nops; k++) {
        const dt_op_spec *s = &p->ops[k].s;
        int running = layers_running(p, k);
        for (int j = 0; j < DT_LORA_MAX_PARTS; j++) a->op_part[k * DT_LORA_MAX_PARTS + j] = -1;
        for (int j = 0; s->kind == DT_OP_LINEAR && running && j < s->nw; j++) {
            module_name(p, s->w + j, 0, module, sizeof module);
            const char *last = strrchr(module, '.');
            at += (size_t)snprintf(list + at, at < sizeof list ? sizeof list - at : 0, "%s%s", at ? ", " : "", last ? last + 1 : module);
            if (!targeted(module, a->c.targets)) continue;
            if (running < p->cfg.num_layers)
                return dt_error(DT_ERR_UNSUPPORTED, "LoRA: %s is in %d of the %d layers (the %s ones): this build adapts Linears every "
                                "layer has", module, running, p->cfg.num_layers, s->layers == DT_LAYERS_MOE ? "mixture" : "dense");
            const dt_tensor_info *w = first_held(p, s->w + j);
            if (!w) return dt_error(DT_ERR_ARG, "LoRA: this rank holds no block");
            int in = w->gshape[1], out = w->gshape[0];
            if (a->c.rank > in || a->c.rank > out)
                return dt_error(DT_ERR_ARG, "LoRA: rank %d is larger than %s [%d, %d]", a->c.rank, module, out, in);
            if (w->replicas > 1 && w->split != DT_SPLIT_NONE) /* its gradient would be summed over the ranks keeping it */
                return dt_error(DT_ERR_UNSUPPORTED, "LoRA: %s's K/V heads are kept by %d tensor-parallel ranks each (fewer K/V heads "
                                "than ranks): this build adapts a K/V Linear only where each rank has its own", module, w->replicas);
            a->op_part[k * DT_LORA_MAX_PARTS + j] = a->per_block++;
            if (p->ops[k].width_in > a->max_in) a->max_in = p->ops[k].width_in;
        }
    }
    if (!a->per_block)
        return dt_error(DT_ERR_ARG, "LoRA: the targets \"%s\" match no Linear of the %s model (its Linears: %s)", a->c.targets, f->name, list);
    return DT_OK;
}

/* Adapter part j of op k's A (ab 0) or B (1), of block l (held), at the store's end. */
static void add_adapter(dt_program *p, program_lora *a, int l, int k, int j, int ab, size_t goff) {
    const dt_op_spec *s = &p->ops[k].s;
    const dt_tensor_info *w = &p->tab[tensor_at(p, l, s->w + j)];
    dt_tensor_info *t = &a->tab[a->ntab++];
    char module[128];
    module_name(p, s->w + j, l, module, sizeof module);
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%.40s.lora_%c", w->name, ab ? 'B' : 'A');
    snprintf(t->hf, sizeof t->hf, "base_model.model.%.64s.lora_%c.weight", module, ab ? 'B' : 'A');
    t->layer = l;
    t->unit = t->grad_unit = l + 1;
    t->ndim = 2;
    t->shape[0] = ab ? w->shape[0] : a->c.rank;
    t->shape[1] = ab ? a->c.rank : w->shape[1];
    t->count = (size_t)t->shape[0] * (size_t)t->shape[1];
    t->offset = a->nparams;
    t->llmc_index = -1;
    dt_tensor_set_whole(t);
    t->goffset = goff;
    /* split as its Linear (Megatron's LoRA): a column-parallel one's B by the weight's output rows, a row-parallel
     * one's A by its input columns; the other matrix whole on every rank of the group */
    bool split = ab ? w->split == DT_SPLIT_COLUMN : w->split == DT_SPLIT_ROW;
    if (split) {
        t->split = w->split;
        t->slice = w->slice;
        t->gshape[ab ? 0 : 1] = w->gshape[ab ? 0 : 1];
    } else {
        t->replicas = p->part.tp_size, t->replica = p->part.tp_rank;
    }
    a->nparams += t->count;
}

/* The table: each held block's adapters in op order, A then B; their places in the whole model's adapter store. */
static dt_status lay_adapters(dt_program *p, program_lora *a) {
    int L = p->cfg.num_layers, no = p->f->nops;
    size_t block = 0;
    for (int k = 0; k < no; k++)
        for (int j = 0; j < DT_LORA_MAX_PARTS; j++)
            if (a->op_part[k * DT_LORA_MAX_PARTS + j] >= 0) {
                const dt_tensor_info *w = first_held(p, p->ops[k].s.w + j);
                block += (size_t)a->c.rank * (size_t)(w->gshape[0] + w->gshape[1]);
            }
    a->global_params = block * (size_t)L;
    if (!(a->tab = calloc((size_t)(2 * a->per_block * (p->nl > 0 ? p->nl : 1)), sizeof *a->tab)))
        return dt_error(DT_ERR_NOMEM, "LoRA: out of memory");
    for (int l = 0; l < L; l++) {
        if (p->bk[l] < 0) continue;
        size_t goff = block * (size_t)l;
        for (int k = 0; k < no; k++)
            for (int j = 0; j < DT_LORA_MAX_PARTS; j++) {
                if (a->op_part[k * DT_LORA_MAX_PARTS + j] < 0) continue;
                for (int ab = 0; ab < 2; ab++) {
                    add_adapter(p, a, l, k, j, ab, goff);
                    goff += (size_t)a->tab[a->ntab - 1].gshape[0] * (size_t)a->tab[a->ntab - 1].gshape[1];
                }
            }
    }
    return DT_OK;
}

/* PEFT's start: A Kaiming-uniform (a = sqrt 5: +-1/sqrt(in)), B zero; each value drawn from its place in the whole
 * model's adapters, so that every layout starts alike. */
static void init_adapters(program_lora *a, uint64_t seed) {
    for (int i = 0; i < a->ntab; i++) {
        const dt_tensor_info *t = &a->tab[i];
        float bound = 1.0f / sqrtf((float)t->gshape[1]), *w = a->params + t->offset;
        bool is_b = t->name[strlen(t->name) - 1] == 'B';
        for (size_t e = 0; e < t->count; e++) {
            uint64_t st = seed ^ ((t->goffset + dt_tensor_global_index(t, e) + 1) * 0x9E3779B97F4A7C15ull);
            w[e] = is_b ? 0.0f : bound * (2.0f * dt_rng_uniform(&st) - 1.0f);
        }
    }
}

static dt_status refuse(const dt_program *p, const dt_lora_config *c) {
    dt_status st = dt_lora_config_check(c, "LoRA");
    if (st) return st;
    if (p->lora) return dt_error(DT_ERR_ARG, "LoRA: the model has its adapters already");
    if (p->prec != DT_F32) return dt_error(DT_ERR_UNSUPPORTED, "LoRA: this build runs adapters in f32 only, not %s", dt_dtype_name(p->prec));
    if (p->nl < 1) return dt_error(DT_ERR_ARG, "LoRA: this part of the model holds no block to adapt");
    return DT_OK;
}

dt_status dt_program_set_lora(dt_program *p, const dt_lora_config *c, uint64_t seed) {
    dt_status st = refuse(p, c);
    if (st) return st;
    program_lora *a = calloc(1, sizeof *a);
    if (!a || !(a->op_part = malloc(sizeof *a->op_part * (size_t)p->f->nops * DT_LORA_MAX_PARTS))) {
        free(a);
        return dt_error(DT_ERR_NOMEM, "LoRA: out of memory");
    }
    a->c = *c;
    if (snprintf(a->targets, sizeof a->targets, "%s", c->targets) >= (int)sizeof a->targets) {
        dt_program_lora_free(a);
        return dt_error(DT_ERR_ARG, "LoRA: the target list is longer than %zu characters", sizeof a->targets - 1);
    }
    a->scale = c->alpha / (float)c->rank;
    if (!(st = choose_parts(p, a)) && !(st = lay_adapters(p, a))) {
        a->params = a->own_params = dt_alloc_aligned(a->nparams * sizeof(float));
        a->grads = a->own_grads = dt_alloc_zeroed(a->nparams * sizeof(float));
        if (!a->params || !a->grads) st = dt_error(DT_ERR_NOMEM, "LoRA: out of memory for %zu adapter values", a->nparams);
    }
    if (st) {
        dt_program_lora_free(a);
        return st;
    }
    a->c.targets = a->targets; /* a copy: the caller's string need not outlive the model */
    init_adapters(a, seed);
    p->lora = a;
    dt_program_mark_kept(p); /* the frozen Linears without adapters keep no input */
    dt_program_free_slots(p); /* the slots keep x A^T from now */
    return DT_OK;
}

void dt_program_lora_free(program_lora *a) {
    if (!a) return;
    free(a->op_part);
    free(a->tab);
    dt_free_aligned(a->own_params);
    dt_free_zeroed(a->own_grads);
    free(a);
}

const dt_lora_config *dt_program_lora_config(const dt_program *p) { return p->lora ? &p->lora->c : NULL; }

const dt_tensor_info *dt_program_lora_tensors(const dt_program *p, int *n) {
    if (n) *n = p->lora ? p->lora->ntab : 0;
    return p->lora ? p->lora->tab : NULL;
}

/* Block l's adapter index q: its A (B next), and its kept x A^T in the current slot. */
static int adapter_of(const dt_program *p, int l, int q) { return p->bk[l] * p->lora->per_block * 2 + 2 * q; }
static float *kept_u(const dt_program *p, int l, int q) {
    size_t BT = (size_t)p->s->B * p->s->T;
    return p->s->lora_u + ((size_t)p->bk[l] * p->lora->per_block + q) * BT * p->lora->c.rank;
}

/* Dropout on adapter q of block l (PEFT's: the adapter's input, the Linear's own input untouched), while the
 * micro-batch trains (keys given): each row's key from its sequence's, the adapter and the row's place in the whole
 * sequence; the columns the input's own in the whole Linear (a row-parallel rank's slice from A's first). Out: x
 * dropped (add 0) or out += dropout's backward of x (add 1: the same mask). NULL when nothing drops. */
static const uint64_t *row_keys(const dt_program *p, int l, int q) {
    const program_slot *s = p->s;
    if (!s->keyed) return NULL;
    uint32_t id = (uint32_t)(l * p->lora->per_block + q);
    for (int i = 0, BT = s->B * s->T; i < BT; i++)
        s->lora_rk[i] = dt_dropout_row_key(s->row_key[i / s->T], id, (uint32_t)(s->docs ? i % s->T : s->pos[i]));
    return s->lora_rk;
}

static void drop(const dt_program *p, const dt_tensor_info *A, const uint64_t *keys, float *out, const float *x, int width, bool add) {
    dt_dropout(out, width, x, width, p->s->B * p->s->T, width, keys, dt_tensor_global_index(A, 0), p->lora->c.dropout, add);
}

/* Tensor parallelism (Megatron's LoRA): a column-parallel Linear reads all its input (gathered), so x A^T is whole on
 * every rank and each adds its output rows' (x A^T) B^T; backward's d(x A^T) = dy B is a partial sum over the group
 * (each rank its rows of dy): summed for A's gradient, while each rank's partial goes into d(x) with the Linear's
 * (summed with it). A row-parallel Linear's x A^T is a partial sum (each rank its input columns): summed, then its
 * product with B (whole) added once (rank 0's) to the partial sums the group adds up; backward's dy is whole, and so
 * d(x A^T), from which each rank takes its columns of A's gradient and of d(x). */
void dt_program_lora_forward(dt_program *p, int l, int k, const float *x, float *y) {
    program_lora *a = p->lora;
    const dt_program_op *o = &p->ops[k];
    int BT = p->s->B * p->s->T, rows = 0, r = a->c.rank;
    for (int j = 0; j < o->s.nw; rows += p->tab[tensor_at(p, l, o->s.w + j)].shape[0], j++) {
        int q = a->op_part[k * DT_LORA_MAX_PARTS + j];
        if (q < 0) continue;
        const dt_tensor_info *A = &a->tab[adapter_of(p, l, q)], *Bt = A + 1;
        float *u = kept_u(p, l, q);
        bool row = A->split == DT_SPLIT_ROW;
        const uint64_t *keys = row_keys(p, l, q);
        if (keys) drop(p, A, keys, p->s->lora_x, x, o->width_in, false);
        dt_lora_down(u, keys ? p->s->lora_x : x, a->params + A->offset, BT, o->width_in, r);
        if (row) dt_program_tp_sum(p, u, (size_t)BT * r);
        if (!row || p->part.tp_rank == 0) dt_lora_up(y + rows, o->width_out, u, a->params + Bt->offset, a->scale, BT, r, Bt->shape[0]);
    }
}

void dt_program_lora_backward(dt_program *p, int l, int k, const float *x, const float *dy, float *dx) {
    program_lora *a = p->lora;
    const dt_program_op *o = &p->ops[k];
    int BT = p->s->B * p->s->T, rows = 0, r = a->c.rank;
    float *du = p->s->lora_du;
    for (int j = 0; j < o->s.nw; rows += p->tab[tensor_at(p, l, o->s.w + j)].shape[0], j++) {
        int q = a->op_part[k * DT_LORA_MAX_PARTS + j];
        if (q < 0) continue;
        const dt_tensor_info *A = &a->tab[adapter_of(p, l, q)], *Bt = A + 1;
        const float *pa = a->params + A->offset;
        dt_lora_up_backward(a->grads + Bt->offset, du, dy + rows, o->width_out, kept_u(p, l, q), a->params + Bt->offset, a->scale, BT, r,
                            Bt->shape[0]);
        bool column = Bt->split == DT_SPLIT_COLUMN;
        const uint64_t *keys = row_keys(p, l, q);
        float *xd = p->s->lora_x; /* d(the dropped x), then the dropped x again */
        if (keys) memset(xd, 0, (size_t)BT * o->width_in * sizeof(float));
        dt_lora_down_backward(keys ? xd : dx, NULL, du, x, pa, BT, o->width_in, r); /* column-parallel: this rank's share */
        if (keys) drop(p, A, keys, dx, xd, o->width_in, true), drop(p, A, keys, xd, x, o->width_in, false);
        if (column) dt_program_tp_sum(p, du, (size_t)BT * r);
        dt_lora_down_backward(NULL, a->grads + A->offset, du, keys ? xd : x, pa, BT, o->width_in, r);
    }
}

dt_status dt_program_lora_sizes(const dt_lm_config *cfg, const dt_model_part *part, const dt_lora_config *c, int recompute, size_t *params,
                                double *floats_per_token) {
    dt_program *p;
    dt_status st = dt_program_create_table(cfg, part, &p);
    size_t before = 0;
    if (!st) p->recompute = recompute != 0, before = dt_program_slot_bytes(p, 1, 1, NULL); /* a token's slot, as laid out */
    if (!st) st = dt_program_set_lora(p, c, 0);
    if (!st) {
        *params = p->lora->nparams;
        *floats_per_token = ((double)dt_program_slot_bytes(p, 1, 1, NULL) - (double)before) / sizeof(float);
    }
    dt_program_destroy(p);
    return st;
}

double dt_program_step_flops_per_token(const dt_program *p, int T) {
    const dt_lm_config *c = &p->cfg;
    double full = dt_program_flops_per_token(c, T), att = 12.0 * c->num_layers * (double)T * c->num_heads * c->head_dim;
    if (!p->lora) return full;
    /* 6 N: forward 2 N, d(input) 2 N, d(weight) 2 N; the frozen base makes no d(weight); the adapters all three */
    return full - 2 * (full - att) / 6 + 6.0 * (double)p->lora->global_params;
}

/* W + (alpha / rank) B A, as PEFT's merge computes it (bit for bit on the fixtures): the product's sum over the rank
 * by fused multiply-adds in order (torch's matmul here), then scaled, then added. fmaf is exact on every CPU. */
static void merge_one(float *w, const float *A, const float *B, float scale, int out, int in, int r) {
    for (int o = 0; o < out; o++)
        for (int i = 0; i < in; i++) {
            float acc = 0;
            for (int k = 0; k < r; k++) acc = fmaf(B[(size_t)o * r + k], A[(size_t)k * in + i], acc);
            w[(size_t)o * in + i] += acc * scale;
        }
}

void dt_program_set_lora_enabled(dt_program *p, bool on) { p->lora_off = !on; }

dt_status dt_program_set_lora_dropout(dt_program *p, float dropout) {
    if (!p->lora) return dt_error(DT_ERR_ARG, "LoRA: dropout %g for a model without adapters", (double)dropout);
    dt_lora_config c = p->lora->c;
    c.dropout = dropout;
    dt_status st = dt_lora_config_check(&c, "LoRA");
    if (st) return st;
    p->lora->c.dropout = dropout;
    dt_program_free_slots(p); /* laid out again, with or without its scratch */
    return DT_OK;
}

bool dt_program_lora_adapts(const dt_program *p, int k) {
    for (int j = 0; p->lora && j < DT_LORA_MAX_PARTS; j++)
        if (p->lora->op_part[k * DT_LORA_MAX_PARTS + j] >= 0) return true;
    return false;
}

void dt_program_lora_merge(dt_program *p) {
    program_lora *a = p->lora;
    if (!a) return;
    for (int l = 0; l < p->cfg.num_layers; l++) /* each held block's adapted parts, as forward finds them */
        for (int k = 0; p->bk[l] >= 0 && k < p->f->nops; k++)
            for (int j = 0; j < DT_LORA_MAX_PARTS; j++) {
                int q = a->op_part[k * DT_LORA_MAX_PARTS + j];
                if (q < 0) continue;
                const dt_tensor_info *A = &a->tab[adapter_of(p, l, q)], *Bt = A + 1, *w = &p->tab[tensor_at(p, l, p->ops[k].s.w + j)];
                merge_one(p->params + w->offset, a->params + A->offset, a->params + Bt->offset, a->scale, Bt->shape[0], A->shape[1], a->c.rank);
            }
    dt_program_lora_free(a);
    p->lora = NULL;
    dt_program_mark_kept(p);
    dt_program_free_slots(p); /* no x A^T kept from now */
    dt_program_params_changed(p);
}

/* ---- the adapters as the engine sees a model ---- */

static float *params_of(void *self) { return ((dt_program *)self)->lora->params; }
static float *grads_of(void *self) { return ((dt_program *)self)->lora->grads; }
static void set_grad_hook(void *self, dt_unit_hook hook, void *ctx) { dt_program_set_grad_hook(self, hook, ctx); }
static void set_unit_hooks(void *self, dt_unit_hook before_forward, dt_unit_hook before_backward, void *ctx) {
    dt_program_set_unit_hooks(self, before_forward, before_backward, ctx);
}
static void set_grad_storage(void *self, float *to) {
    program_lora *a = ((dt_program *)self)->lora;
    a->grads = dt_model_grad_storage(a->own_grads, a->grads, to, a->nparams);
}
static void set_param_storage(void *self, float *to) {
    program_lora *a = ((dt_program *)self)->lora;
    a->params = dt_model_param_storage(a->own_params, a->params, to, a->nparams);
}

void dt_program_lora_model(dt_program *p, dt_model *out) {
    program_lora *a = p->lora;
    *out = (dt_model){ .self = p, .kind = p->f->name, .tensors = a->tab, .ntensors = a->ntab, .nunits = p->cfg.num_layers + 2,
                       .nparams = a->nparams, .global_params = a->global_params, .params = params_of, .grads = grads_of,
                       .set_grad_storage = set_grad_storage, .set_grad_hook = set_grad_hook, .set_unit_hooks = set_unit_hooks,
                       .set_param_storage = set_param_storage, .part = &p->part };
}
