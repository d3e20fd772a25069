/* Mixed precision in the model program, as torch.autocast does it on top of f32 parameters and gradients: the
 * Linears (the head too) multiply 16-bit copies of their inputs and weights with f32 sums and give 16-bit
 * outputs; the norms', attention's and the activations' outputs are rounded to 16 bits for the next Linear; the
 * residual stream, the norms' statistics, the embeddings and the loss stay f32. Between a block's forward and its
 * backward its values are kept in 16 bits (one block's f32 working set is widened again when its backward runs);
 * the block's input is kept so too, and its norm's backward reads it rounded. */
#include "program_internal.h"

#include <stdlib.h>
#include <string.h>

bool dt_program_packs(const dt_program *p) { return p->prec != DT_F32 && !p->recompute; }

/* The 16-bit copy of what unit u reads, just before it runs (after the strategy's hook, which may have just
 * gathered it). As a whole copy: each unit's own tensors at its forward, kept for backward. With unit hooks
 * (ZeRO-3 gathers each unit's parameters as it runs) the copy is made as each unit's forward or backward starts,
 * of what that reads, and dt_program_lp_drop gives it back after, so no rank holds the whole 16-bit model. */
void dt_program_lp_cast(dt_program *p, int u, bool backward) {
    bool per_run = p->unit_hooks.n > 0;
    if (p->prec == DT_F32 || p->lp_external || (backward && !per_run) || (per_run && u == 0)) return;
    for (int i = 0; i < p->ntab; i++) {
        const dt_tensor_info *t = &p->tab[i];
        if (per_run ? t->grad_unit != u && (backward || t->unit != u) : t->unit != u) continue;
        if (!per_run && p->lp_told && p->lp_current[i]) continue; /* a step's later micro-batches find it current */
        dt_lp_pack(p->params_lp + t->offset, p->params + t->offset, t->count, p->prec);
        if (!per_run) p->lp_current[i] = 1;
        if (per_run && !p->lp_cast[i]) {
            p->lp_cast[i] = 1;
            p->lp_held += t->count;
        }
    }
    if (p->lp_held > p->lp_held_max) p->lp_held_max = p->lp_held;
}

void dt_program_lp_drop(dt_program *p) {
    for (int i = 0; p->lp_held && i < p->ntab; i++)
        if (p->lp_cast[i]) {
            dt_mem_release(p->params_lp + p->tab[i].offset, p->tab[i].count * sizeof(uint16_t));
            p->lp_cast[i] = 0;
        }
    p->lp_held = 0;
}

size_t dt_program_lp_block(const dt_program *p, size_t BT, bool moe) {
    size_t R = p->part.sp && p->part.tp_size > 1 ? BT / (size_t)p->part.tp_size : BT, n = 0;
    for (int v = 0; v < p->f->nvalues; v++)
        if (p->vkeep[v] && p->vused[moe * p->f->nvalues + v]) n += (p->vsplit[v] ? R : BT) * (size_t)p->vw[v];
    for (int k = 0; k < p->f->nops; k++) /* attention's q|k|v of all heads, where it makes one */
        if (p->ops[k].s.kind == DT_OP_ATTENTION && p->repack) n += BT * 3 * (size_t)p->Ql;
    return n;
}

void dt_program_pack_block(dt_program *p, int l, bool pack) {
    program_slot *s = p->s;
    if (!dt_program_packs(p)) return;
    size_t BT = (size_t)s->B * s->T;
    uint16_t *at = s->lp_keep[p->bk[l]];
    for (int v = 0; v < p->f->nvalues; v++) {
        if (!p->vkeep[v] || !p->vused[p->moe_layer[l] * p->f->nvalues + v]) continue;
        size_t n = dt_program_rows(p, v) * (size_t)p->vw[v];
        float *x = v == DT_V_IN && !pack ? s->res1 : value(p, l, v);
        if (pack) dt_lp_pack(at, x, n, p->prec);
        else dt_lp_unpack(x, at, n, p->prec);
        at += n;
    }
    float *qkv = s->packed[p->bk[l]];
    if (qkv) {
        if (pack) dt_lp_pack(at, qkv, BT * 3 * (size_t)p->Ql, p->prec);
        else dt_lp_unpack(qkv, at, BT * 3 * (size_t)p->Ql, p->prec);
    }
}

/* Every tensor's kept 16-bit copy out of date: cast again at the next forward. */
static void lp_forget(dt_program *p) {
    if (p->lp_current) memset(p->lp_current, 0, (size_t)p->ntab);
}

void dt_program_params_changed(dt_program *p) {
    p->lp_told = 1;
    lp_forget(p);
}

uint16_t *dt_program_lp_copy(dt_program *p, int caller_keeps, dt_dtype *t) {
    *t = p->prec;
    if (p->params_lp) p->lp_external = caller_keeps;
    lp_forget(p); /* whoever kept it, it is cast again when the model keeps it */
    return p->params_lp;
}

size_t dt_program_lp_params_bytes(const dt_program *p) {
    if (!p->params_lp) return 0;
    return (p->unit_hooks.n && !p->lp_external ? p->lp_held_max : p->nparams) * sizeof(uint16_t);
}

/* A block's largest Linear weight whole, twice; the head's weight rows a chunk at a time (dt_matmul_lp16_rows),
 * three times (dt_matmul_*_lp16: widened rows, their gradient, a block of outputs). */
size_t dt_program_lp_work_floats(const dt_program *p) {
    size_t C = (size_t)p->cfg.channels, rows = (size_t)dt_matmul_lp16_rows(p->cfg.channels, p->cfg.padded_vocab_size), big = 0;
    for (int k = 0; k < p->f->nops; k++)
        if (p->ops[k].s.kind == DT_OP_LINEAR) {
            size_t w = (size_t)p->ops[k].width_in * (size_t)p->ops[k].width_out;
            if (w > big) big = w;
        }
    if (p->ub != p->cfg.num_layers + 2) rows = 0;
    return 3 * rows * C > 2 * big ? 3 * rows * C : 2 * big;
}

dt_status dt_program_set_precision(dt_program *p, dt_dtype t) {
    if (t != DT_F32 && t != DT_BF16 && t != DT_F16) return dt_error(DT_ERR_ARG, "model: precision %s is not one of f32, bf16, f16", dt_dtype_name(t));
    for (int k = 0; k < p->nslots; k++)
        if (p->slots[k].mem) return dt_error(DT_ERR_ARG, "model: the precision is set before the first forward");
    if (p->lora && t != DT_F32) return dt_error(DT_ERR_UNSUPPORTED, "LoRA: this build runs adapters in f32 only, not %s", dt_dtype_name(t));
    dt_free_aligned(p->params_lp);
    dt_free_aligned(p->lp_work);
    dt_free_aligned(p->moe_wide);
    p->moe_wide = NULL;
    free(p->lp_cast);
    free(p->lp_current);
    p->params_lp = NULL;
    p->lp_work = NULL;
    p->lp_cast = p->lp_current = NULL;
    p->prec = t;
    if (t == DT_F32) return DT_OK;
    p->params_lp = dt_alloc_aligned(p->nparams * sizeof(uint16_t));
    p->lp_cast = calloc((size_t)p->ntab, 1);
    p->lp_current = calloc((size_t)p->ntab, 1);
    p->lp_work_floats = dt_program_lp_work_floats(p);
    p->lp_work = dt_alloc_aligned(p->lp_work_floats * sizeof(float));
    size_t wide = dt_program_moe_weight_floats(p);
    if (wide) p->moe_wide = dt_alloc_aligned(wide * sizeof(float));
    if (!p->params_lp || !p->lp_work || !p->lp_cast || !p->lp_current || (wide && !p->moe_wide)) {
        dt_program_set_precision(p, DT_F32);
        return dt_error(DT_ERR_NOMEM, "model: cannot allocate the %s copy of %zu parameters", dt_dtype_name(t), p->nparams);
    }
    return DT_OK;
}

dt_dtype dt_program_precision(const dt_program *p) { return p->prec; }
