/* Tensor parallelism's mappings in the model program (Megatron-LM, Shoeybi et al. 2019), the collectives
 * that the ops call where a split begins or ends:
 *
 *   forward                               backward
 *   column-parallel Linear:  identity     sum of d(input)
 *   row-parallel Linear:     sum of out   identity
 *   embedding (vocab rows):  sum          each rank its rows
 *   cross-entropy (columns): max, sums    local softmax - onehot
 *
 * The Linear op calls dt_program_tp_sum itself (program.c); the embedding and the loss are here. */
#include "program_internal.h"

#include <math.h>
#include <string.h>

void dt_program_tp_sum(dt_program *p, float *x, size_t n) {
    if (p->part.tp_size == 1 || p->comm_err) return;
    double t0 = dt_time_now();
    p->comm_err = p->part.tp->allreduce(p->part.tp->ctx, x, n, 0);
    p->tp_seconds += dt_time_now() - t0;
}

static void tp_max(dt_program *p, float *x, size_t n) {
    if (p->part.tp_size == 1 || p->comm_err) return;
    double t0 = dt_time_now();
    p->comm_err = p->part.tp->allreduce(p->part.tp->ctx, x, n, 1);
    p->tp_seconds += dt_time_now() - t0;
}

/* The positions' table is added after the sum, so each value is the one sum wte[token] + wpe[t] that one process
 * computes. */
void dt_program_tp_embedding_forward(dt_program *p, float *out, const int32_t *tokens) {
    int B = p->s->B, T = p->s->T, C = p->cfg.channels;
    const float *wte = p->params + p->tab[p->i_wte].offset;
    const int32_t *pos = p->part.cp_size > 1 ? p->s->pos : NULL; /* the first T rows' positions: each t's */
    if (p->part.tp_size == 1) {
        if (p->i_wpe >= 0) dt_embedding_forward_at(out, tokens, wte, p->params + p->tab[p->i_wpe].offset, pos, B, T, C);
        else dt_embedding_rows_forward(out, tokens, wte, 0, p->Vl, B * T, C);
        return;
    }
    dt_embedding_rows_forward(out, tokens, wte, p->v0, p->Vl, B * T, C);
    dt_program_tp_sum(p, out, (size_t)B * T * C);
    if (p->i_wpe < 0) return;
    const float *wpe = p->params + p->tab[p->i_wpe].offset;
    for (size_t i = 0; i < (size_t)B * T; i++) dt_residual_forward(out + i * C, out + i * C, wpe + (size_t)p->s->pos[i] * C, (size_t)C);
}

void dt_program_tp_embedding_backward(dt_program *p, const float *dout) {
    int B = p->s->B, T = p->s->T, C = p->cfg.channels;
    float *dwte = p->grads + p->tab[p->i_wte].offset;
    if (p->part.tp_size == 1 && p->i_wpe >= 0) {
        const int32_t *pos = p->part.cp_size > 1 ? p->s->pos : NULL;
        dt_embedding_backward_at(dwte, p->grads + p->tab[p->i_wpe].offset, dout, p->s->inputs, pos, B, T, C);
        return;
    }
    dt_embedding_rows_backward(dwte, dout, p->s->inputs, p->v0, p->Vl, B * T, C);
    if (p->i_wpe >= 0) dt_embedding_backward_at(NULL, p->grads + p->tab[p->i_wpe].offset, dout, p->s->inputs, p->s->pos, B, T, C);
}

/* Never gathers the logits: two collectives of B*T and 2 B*T floats; the statistics (a row's max and sum) are
 * the whole row's on every rank. */
float dt_program_tp_crossentropy_forward(dt_program *p, const int32_t *targets) {
    int BT = p->s->B * p->s->T;
    if (p->part.tp_size == 1) return dt_crossentropy_forward(p->s->losses, p->s->ce_stats, p->s->logits, targets, BT, p->Vv, p->Vl);
    float *mx = p->s->losses, *part = p->s->scratch;
    dt_crossentropy_rows_max(mx, p->s->logits, BT, p->Vv, p->Vl);
    tp_max(p, mx, (size_t)BT);
    dt_crossentropy_rows_sum(part, p->s->logits, mx, targets, p->v0, BT, p->Vv, p->Vl);
    dt_program_tp_sum(p, part, 2 * (size_t)BT);
    double total = 0;
    for (int i = 0; i < BT; i++) {
        p->s->ce_stats[2 * i] = mx[i];
        p->s->ce_stats[2 * i + 1] = part[2 * i];
        p->s->losses[i] = logf(part[2 * i]) + mx[i] - part[2 * i + 1];
        total += p->s->losses[i];
    }
    return (float)(total / BT);
}

void dt_program_tp_crossentropy_backward(dt_program *p, float dscale) {
    int BT = p->s->B * p->s->T;
    if (p->part.tp_size == 1) dt_crossentropy_backward(p->s->logits, p->s->ce_stats, p->s->targets, BT, p->Vv, p->Vl, dscale);
    else dt_crossentropy_rows_backward(p->s->logits, p->s->ce_stats, p->s->targets, p->v0, BT, p->Vv, p->Vl, dscale);
}
