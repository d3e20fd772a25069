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
 * gpt2_run.c as dt_gpt2_tp_combine and dt_gpt2_tp_sum. With sequence
 * parallelism (Korthikanti et al.) the regions between the Linears hold
 * 1/tp of the rows: entering a column-parallel Linear is an allgather (its
 * backward a reduce-scatter), leaving a row-parallel one a reduce-scatter
 * (its backward an allgather), and a LayerNorm's weight gradient, from its
 * rows only, is summed over the group. On one rank every function here is
 * the plain kernel. */
#include "gpt2_internal.h"
#include "dtrain/kernels.h"

#include <math.h>
#include <stdbool.h>
#include <string.h>

/* The group's sum or max in place, timed: every one is on the critical path. */
static void tp_reduce(dt_gpt2 *m, float *x, size_t n, int max) {
    if (m->part.tp_size == 1 || m->comm_err) return;
    double t0 = dt_time_now();
    m->comm_err = m->part.tp->allreduce(m->part.tp->ctx, x, n, max);
    m->tp_seconds += dt_time_now() - t0;
}

void dt_gpt2_tp_sum(dt_gpt2 *m, float *x, size_t n) { tp_reduce(m, x, n, 0); }

static bool sp(const dt_gpt2 *m) { return m->part.sp && m->part.tp_size > 1; }

size_t dt_gpt2_tp_rows(const dt_gpt2 *m) { return (size_t)m->B * m->T / (sp(m) ? (size_t)m->part.tp_size : 1); }

const float *dt_gpt2_tp_gather(dt_gpt2 *m, const float *local, size_t n) {
    if (!sp(m)) return local;
    float *all = m->acts + m->act_off[A_GATHER];
    if (m->comm_err) return all;
    double t0 = dt_time_now();
    m->comm_err = m->part.tp->allgather(m->part.tp->ctx, local, all, n);
    m->tp_seconds += dt_time_now() - t0;
    return all;
}

const float *dt_gpt2_tp_combine(dt_gpt2 *m, float *partial, size_t n) {
    if (!sp(m)) {
        dt_gpt2_tp_sum(m, partial, n);
        return partial;
    }
    float *mine = m->acts + m->act_off[A_RS];
    if (m->comm_err) return mine;
    double t0 = dt_time_now();
    m->comm_err = m->part.tp->reduce_scatter(m->part.tp->ctx, partial, mine, n);
    m->tp_seconds += dt_time_now() - t0;
    return mine;
}

const float *dt_gpt2_tp_combine_linear(dt_gpt2 *m, float *partial, size_t n) {
    const float *whole = dt_gpt2_tp_combine(m, partial, n);
    if (m->part.tp_size > 1 && m->prec != DT_F32) dt_lp_round((float *)whole, n, m->prec);
    return whole;
}

void dt_gpt2_tp_layernorm_backward(dt_gpt2 *m, float *dinp, float *dw, float *db, const float *dout, const float *inp,
                                   const float *w, const float *mean, const float *rstd, int C) {
    int rows = (int)dt_gpt2_tp_rows(m);
    if (!sp(m)) {
        dt_layernorm_backward(dinp, dw, db, dout, inp, w, mean, rstd, rows, C);
        return;
    }
    /* this micro-batch's part alone is summed (dw, db may hold earlier micro-batches') */
    float *g = m->acts + m->act_off[A_LNGRAD];
    memset(g, 0, 2 * (size_t)C * sizeof(float));
    dt_layernorm_backward(dinp, g, g + C, dout, inp, w, mean, rstd, rows, C);
    dt_gpt2_tp_sum(m, g, 2 * (size_t)C);
    for (int i = 0; i < C; i++) dw[i] += g[i], db[i] += g[C + i];
}
static void tp_max(dt_gpt2 *m, float *x, size_t n) { tp_reduce(m, x, n, 1); }

double dt_gpt2_tp_comm_seconds(dt_gpt2 *m) {
    double s = m->tp_seconds;
    m->tp_seconds = 0;
    return s;
}

/* Each row's position: t, or under context parallelism the split's (NULL: t). */
static const int32_t *positions(dt_gpt2 *m, int T) {
    if (m->part.cp_size <= 1) return NULL;
    for (int t = 0; t < T; t++) m->pos[t] = dt_gpt2_cp_position(m->part.cp_rank, m->part.cp_size, T, t);
    return m->pos;
}

/* The position table is added after the sum, so each value is the one sum
 * wte[token] + wpe[t] that one process computes (the other ranks add zeros). */
void dt_gpt2_tp_embedding_forward(dt_gpt2 *m, float *out, const int32_t *tokens, int B, int T) {
    int C = m->cfg.channels;
    const float *wte = m->params + m->tab[m->i_wte].offset, *wpe = m->params + m->tab[m->i_wpe].offset;
    const int32_t *pos = positions(m, T);
    if (m->part.tp_size == 1) {
        dt_embedding_forward_at(out, tokens, wte, wpe, pos, B, T, C);
        return;
    }
    float *rows = sp(m) ? m->acts + m->act_off[A_TMP] : out; /* every row's partial lookup */
    dt_embedding_rows_forward(rows, tokens, wte, m->v0, m->Vl, B * T, C);
    size_t R = dt_gpt2_tp_rows(m), r0 = R * (size_t)m->part.tp_rank * sp(m);
    const float *sum = dt_gpt2_tp_combine(m, rows, R * (size_t)C);
    for (size_t i = 0; i < R; i++) { /* this rank's rows; row r0 + i is row (r0 + i) % T of its sequence */
        size_t t = (r0 + i) % (size_t)T, p = pos ? (size_t)pos[t] : t;
        dt_residual_forward(out + i * (size_t)C, sum + i * (size_t)C, wpe + p * (size_t)C, (size_t)C);
    }
}

void dt_gpt2_tp_embedding_backward(dt_gpt2 *m, float *dwte, float *dwpe, const float *dout, int B, int T) {
    int C = m->cfg.channels;
    const int32_t *pos = positions(m, T);
    if (m->part.tp_size == 1) {
        dt_embedding_backward_at(dwte, dwpe, dout, m->inputs, pos, B, T, C);
        return;
    }
    const float *all = dt_gpt2_tp_gather(m, dout, dt_gpt2_tp_rows(m) * (size_t)C); /* every row's gradient */
    if (dwte) dt_embedding_rows_backward(dwte, all, m->inputs, m->v0, m->Vl, B * T, C);
    dt_embedding_backward_at(NULL, dwpe, all, m->inputs, pos, B, T, C);
}

/* Never gathers the logits: two collectives of B*T and 2*B*T floats. The
 * statistics (the row's max and sum) are the whole row's on every rank.
 * Under mixed precision the logits are 16-bit, widened a row at a time. */
float dt_gpt2_tp_crossentropy_forward(dt_gpt2 *m, float *losses, float *stats, const void *logits, const int32_t *targets, int BT) {
    bool lp = m->prec != DT_F32;
    if (m->part.tp_size == 1)
        return lp ? dt_crossentropy_forward_lp(losses, stats, logits, targets, BT, m->Vv, m->Vl, m->prec, m->lp_work, m->lp_work_floats)
                  : dt_crossentropy_forward(losses, stats, logits, targets, BT, m->Vv, m->Vl);
    float *mx = losses, *part = m->acts + m->act_off[A_TMP]; /* scratch: B*T and 2*B*T floats */
    if (lp) dt_crossentropy_rows_lp(mx, NULL, logits, targets, m->v0, BT, m->Vv, m->Vl, m->prec, m->lp_work, m->lp_work_floats);
    else dt_crossentropy_rows_max(mx, logits, BT, m->Vv, m->Vl);
    tp_max(m, mx, (size_t)BT);
    if (lp) dt_crossentropy_rows_lp(part, mx, logits, targets, m->v0, BT, m->Vv, m->Vl, m->prec, m->lp_work, m->lp_work_floats);
    else dt_crossentropy_rows_sum(part, logits, mx, targets, m->v0, BT, m->Vv, m->Vl);
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
