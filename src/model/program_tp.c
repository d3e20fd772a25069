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

static bool sp(const dt_program *p) { return p->part.sp && p->part.tp_size > 1; }

size_t dt_program_rows(const dt_program *p, int v) {
    size_t BT = (size_t)p->s->B * p->s->T;
    return sp(p) && (v < 0 || p->vsplit[v]) ? BT / (size_t)p->part.tp_size : BT;
}

const float *dt_program_tp_gather_to(dt_program *p, const float *local, float *all, size_t n) {
    if (!sp(p)) return local;
    if (p->comm_err) return all;
    double t0 = dt_time_now();
    p->comm_err = p->part.tp->allgather(p->part.tp->ctx, local, all, n);
    p->tp_seconds += dt_time_now() - t0;
    return all;
}

const float *dt_program_tp_gather(dt_program *p, const float *local, size_t n) { return dt_program_tp_gather_to(p, local, p->s->gather, n); }

const float *dt_program_tp_combine(dt_program *p, float *partial, float *mine, size_t n) {
    if (!sp(p)) {
        dt_program_tp_sum(p, partial, n);
        return partial;
    }
    if (p->comm_err) return mine;
    double t0 = dt_time_now();
    p->comm_err = p->part.tp->reduce_scatter(p->part.tp->ctx, partial, mine, n);
    p->tp_seconds += dt_time_now() - t0;
    return mine;
}

void dt_program_norm_backward(dt_program *p, float *din, float *dw, float *db, const float *dout, const float *in, const float *w,
                              const float *stats, int C) {
    int rows = (int)dt_program_rows(p, -1);
    /* under SP this micro-batch's part alone is summed over the group (dw and db may hold earlier ones') */
    float *gw = sp(p) ? p->s->normgrad : dw, *gb = sp(p) ? p->s->normgrad + C : db;
    if (sp(p)) memset(p->s->normgrad, 0, 2 * (size_t)C * sizeof(float));
    if (p->f->rms) dt_rmsnorm_backward(din, gw, dout, in, w, stats + rows, rows, C);
    else dt_layernorm_backward(din, gw, gb, dout, in, w, stats, stats + rows, rows, C);
    if (!sp(p)) return;
    dt_program_tp_sum(p, p->s->normgrad, 2 * (size_t)C);
    for (int i = 0; i < C; i++) dw[i] += gw[i];
    for (int i = 0; db && i < C; i++) db[i] += gb[i];
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
    float *rows = sp(p) ? p->s->partial : out; /* every row's partial lookup */
    dt_embedding_rows_forward(rows, tokens, wte, p->v0, p->Vl, B * T, C);
    size_t R = dt_program_rows(p, -1), r0 = sp(p) ? R * (size_t)p->part.tp_rank : 0;
    const float *sum = dt_program_tp_combine(p, rows, out, R * (size_t)C);
    if (p->i_wpe < 0) return;
    const float *wpe = p->params + p->tab[p->i_wpe].offset;
    for (size_t i = 0; i < R; i++) dt_residual_forward(out + i * C, sum + i * C, wpe + (size_t)p->s->pos[r0 + i] * C, (size_t)C);
}

void dt_program_tp_embedding_backward(dt_program *p, const float *dout, bool skip_rows) {
    int B = p->s->B, T = p->s->T, C = p->cfg.channels;
    float *dwte = skip_rows ? NULL : p->grads + p->tab[p->i_wte].offset;
    if (p->part.tp_size == 1 && p->i_wpe >= 0) {
        const int32_t *pos = p->part.cp_size > 1 ? p->s->pos : NULL;
        dt_embedding_backward_at(dwte, p->grads + p->tab[p->i_wpe].offset, dout, p->s->inputs, pos, B, T, C);
        return;
    }
    const float *all = dt_program_tp_gather(p, dout, dt_program_rows(p, -1) * (size_t)C); /* every row's gradient */
    if (dwte) dt_embedding_rows_backward(dwte, all, p->s->inputs, p->v0, p->Vl, B * T, C);
    if (p->i_wpe >= 0) dt_embedding_backward_at(NULL, p->grads + p->tab[p->i_wpe].offset, all, p->s->inputs, p->s->pos, B, T, C);
}

/* Never gathers the logits: two collectives of B*T and 2 B*T floats; the statistics (a row's max and sum) are
 * the whole row's on every rank. */
double dt_program_tp_crossentropy_forward(dt_program *p, const int32_t *targets) {
    program_slot *s = p->s;
    int BT = s->B * s->T;
    bool lp = p->prec != DT_F32; /* the logits in 16 bits, widened a row at a time */
    const uint16_t *l16 = (const uint16_t *)s->logits;
    if (p->part.tp_size == 1) /* the kernels' mean over every row, times the rows: the sum (a row not scored adds 0) */
        return (double)BT * (lp ? dt_crossentropy_forward_lp(s->losses, s->ce_stats, l16, targets, BT, p->Vv, p->Vl, p->prec, p->lp_work,
                                                             p->lp_work_floats)
                                : dt_crossentropy_forward(s->losses, s->ce_stats, s->logits, targets, BT, p->Vv, p->Vl));
    float *mx = s->losses, *part = s->scratch;
    if (lp) dt_crossentropy_rows_lp(mx, NULL, l16, targets, p->v0, BT, p->Vv, p->Vl, p->prec, p->lp_work, p->lp_work_floats);
    else dt_crossentropy_rows_max(mx, s->logits, BT, p->Vv, p->Vl);
    tp_max(p, mx, (size_t)BT);
    if (lp) dt_crossentropy_rows_lp(part, mx, l16, targets, p->v0, BT, p->Vv, p->Vl, p->prec, p->lp_work, p->lp_work_floats);
    else dt_crossentropy_rows_sum(part, s->logits, mx, targets, p->v0, BT, p->Vv, p->Vl);
    dt_program_tp_sum(p, part, 2 * (size_t)BT);
    double total = 0;
    for (int i = 0; i < BT; i++) {
        p->s->ce_stats[2 * i] = mx[i];
        p->s->ce_stats[2 * i + 1] = part[2 * i];
        p->s->losses[i] = targets[i] < 0 ? 0.0f : logf(part[2 * i]) + mx[i] - part[2 * i + 1];
        total += p->s->losses[i];
    }
    return total;
}

/* Each scored row's entropy and log sum p^2 from its moments about the whole row's maximum (summed over a
 * vocabulary-parallel group) and forward's statistics (the row's max and sum of exponentials S). */
void dt_program_tp_token_stats(dt_program *p, const int32_t *targets) {
    program_slot *s = p->s;
    int BT = s->B * s->T;
    const float *st = s->ce_stats;
    float *mom = s->scratch; /* (the vocabulary-parallel forward's, done with) */
    dt_crossentropy_rows_moments(mom, st, s->logits, targets, BT, p->Vv, p->Vl, p->prec, p->lp_work, p->lp_work_floats);
    if (p->part.tp_size > 1) dt_program_tp_sum(p, mom, 2 * (size_t)BT);
    for (int i = 0; i < BT; i++) {
        double S = st[2 * i + 1], logS = log(S);
        bool scored = targets[i] >= 0;
        s->tok_stats[i] = scored ? (float)(logS - mom[2 * i + 1] / S) : 0.0f;
        s->tok_stats[BT + i] = scored ? (float)(log(mom[2 * i]) - 2 * logS) : 0.0f;
    }
}

void dt_program_tp_crossentropy_backward(dt_program *p, float dscale) {
    int BT = p->s->B * p->s->T;
    if (p->part.tp_size == 1) dt_crossentropy_backward(p->s->logits, p->s->ce_stats, p->s->targets, BT, p->Vv, p->Vl, dscale);
    else dt_crossentropy_rows_backward(p->s->logits, p->s->ce_stats, p->s->targets, p->v0, BT, p->Vv, p->Vl, dscale);
}
