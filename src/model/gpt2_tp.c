/* Tensor parallelism inside GPT-2 (Megatron-LM, Shoeybi et al. 2019): the
 * whole scheme's communication, as the model calls it. The kernels never
 * communicate; the model's passes call these where a split ends:
 *
 *   forward                             backward
 *   column-parallel Linear (qkv, fc):   identity          sum of d(input)
 *   row-parallel Linear (projections):  sum of outputs    identity
 *   embedding (vocabulary rows):        sum of lookups    each rank its rows
 *   cross-entropy (vocabulary columns): max, then the sums of exp and the
 *                                       target's logit    local softmax - onehot
 *
 * Megatron's f and g operators are the first two rows; they appear in
 * gpt2_run.c as dt_gpt2_tp_sum. On one rank every function here is the
 * plain kernel. */
#include "gpt2_internal.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <string.h>

/* The group's sum or max in place, timed: every one is on the critical path. */
static void tp_reduce(dt_gpt2 *m, float *x, size_t n, int max) {
    if (m->part.tp_size == 1 || m->tp_err) return;
    double t0 = dt_time_now();
    m->tp_err = m->part.tp->allreduce(m->part.tp->ctx, x, n, max);
    m->tp_seconds += dt_time_now() - t0;
}

void dt_gpt2_tp_sum(dt_gpt2 *m, float *x, size_t n) { tp_reduce(m, x, n, 0); }
static void tp_max(dt_gpt2 *m, float *x, size_t n) { tp_reduce(m, x, n, 1); }

double dt_gpt2_tp_comm_seconds(dt_gpt2 *m) {
    double s = m->tp_seconds;
    m->tp_seconds = 0;
    return s;
}

/* The position table is added after the sum, so each value is the one sum
 * wte[token] + wpe[t] that one process computes (the other ranks add zeros). */
void dt_gpt2_tp_embedding_forward(dt_gpt2 *m, float *out, const int32_t *tokens, int B, int T) {
    int C = m->cfg.channels;
    const float *wte = m->params + m->tab[m->i_wte].offset, *wpe = m->params + m->tab[m->i_wpe].offset;
    if (m->part.tp_size == 1) {
        dt_embedding_forward(out, tokens, wte, wpe, B, T, C);
        return;
    }
    dt_embedding_rows_forward(out, tokens, wte, m->v0, m->Vl, B * T, C);
    dt_gpt2_tp_sum(m, out, (size_t)B * T * C);
    for (int b = 0; b < B; b++) dt_residual_forward(out + (size_t)b * T * C, out + (size_t)b * T * C, wpe, (size_t)T * C);
}

void dt_gpt2_tp_embedding_backward(dt_gpt2 *m, float *dwte, float *dwpe, const float *dout, int B, int T) {
    int C = m->cfg.channels;
    if (m->part.tp_size == 1) {
        dt_embedding_backward(dwte, dwpe, dout, m->inputs, B, T, C);
        return;
    }
    if (dwte) dt_embedding_rows_backward(dwte, dout, m->inputs, m->v0, m->Vl, B * T, C);
    dt_embedding_backward(NULL, dwpe, dout, m->inputs, B, T, C);
}

/* Never gathers the logits: two collectives of B*T and 2*B*T floats. The
 * statistics (the row's max and sum) are the whole row's on every rank. */
float dt_gpt2_tp_crossentropy_forward(dt_gpt2 *m, float *losses, float *stats, const float *logits, const int32_t *targets, int BT) {
    if (m->part.tp_size == 1) return dt_crossentropy_forward(losses, stats, logits, targets, BT, m->Vv, m->Vl);
    float *mx = losses, *part = m->acts + m->act_off[A_TMP]; /* scratch: B*T and 2*B*T floats */
    dt_crossentropy_rows_max(mx, logits, BT, m->Vv, m->Vl);
    tp_max(m, mx, (size_t)BT);
    dt_crossentropy_rows_sum(part, logits, mx, targets, m->v0, BT, m->Vv, m->Vl);
    dt_gpt2_tp_sum(m, part, 2 * (size_t)BT);
    double total = 0;
    for (int i = 0; i < BT; i++) {
        stats[2 * i] = mx[i];
        stats[2 * i + 1] = part[2 * i];
        losses[i] = logf(part[2 * i]) + mx[i] - part[2 * i + 1];
        total += losses[i];
    }
    return (float)(total / BT);
}

void dt_gpt2_tp_crossentropy_backward(dt_gpt2 *m, float *dlogits, const float *stats, const int32_t *targets, int BT, float dscale) {
    dt_crossentropy_rows_backward(dlogits, stats, targets, m->v0, BT, m->Vv, m->Vl, dscale);
}
