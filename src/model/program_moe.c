/* The mixture-of-experts op (Mixtral's sparse MoE block): a softmax router picks each token's top k of E experts,
 * the (token, choice) pairs are sorted by expert, each expert's SwiGLU MLP runs over its rows (kernels/moe.c), and
 * each token's output is its choices' outputs weighted by the router (renormalised over the k, Mixtral's), summed in
 * the experts' order. Dropless: every choice is computed. Kept for backward: the router's probabilities and the
 * gate|up products of every pair; the choices, the sort and the SwiGLU outputs are made again from them. With a
 * load-balancing coefficient the loss adds Hugging Face's load_balancing_loss_func: E sum_e f_e P_e, f_e the share
 * of all layers' choices that went to e and P_e its mean probability over all layers' tokens. */
#include "program_internal.h"

#include <stdlib.h>
#include <string.h>

static int pairs_of(const dt_program *p, size_t BT) { return (int)BT * p->cfg.experts_top_k; }

size_t dt_program_moe_kept(const dt_program *p, size_t BT) {
    return BT * (size_t)p->cfg.experts + (size_t)pairs_of(p, BT) * 2 * (size_t)p->cfg.ffn;
}

/* Forward: the pairs' inputs, SwiGLU outputs and expert outputs, their weights; backward: the inputs and SwiGLU
 * outputs again, the output gradients (then the inputs'), g, d(gate|up), the weights' gradients, d(logits). */
size_t dt_program_moe_work(const dt_program *p, size_t BT) {
    size_t n = (size_t)pairs_of(p, BT), C = (size_t)p->cfg.channels, F = (size_t)p->cfg.ffn;
    return n * (2 * C + 4 * F + 2) + BT * (size_t)p->cfg.experts;
}

size_t dt_program_moe_ints(const dt_program *p, size_t BT) { return 3 * (size_t)pairs_of(p, BT) + (size_t)p->cfg.experts + 1; }

typedef struct {
    float *probs, *hu;                  /* kept */
    int32_t *idx, *order, *row_of, *start;
    float *xs, *act, *ys, *w, *dw, *g, *dhu, *dlogits;
    const float *router, *wg, *wu, *wd;
    int BT, E, K, C, F, pairs;
} moe_run;

static moe_run run_of(dt_program *p, int l, int k) {
    program_slot *s = p->s;
    const dt_lm_config *c = &p->cfg;
    moe_run m = { .BT = s->B * s->T, .E = c->experts, .K = c->experts_top_k, .C = c->channels, .F = c->ffn };
    m.pairs = m.BT * m.K;
    size_t n = (size_t)m.pairs, C = (size_t)m.C, F = (size_t)m.F;
    m.probs = op_stats(p, l, k);
    m.hu = m.probs + (size_t)m.BT * m.E;
    m.idx = s->moe_int, m.order = m.idx + n, m.row_of = m.order + n, m.start = m.row_of + n;
    m.xs = s->moe_work, m.act = m.xs + n * C, m.ys = m.act + n * F, m.g = m.ys + n * C, m.dhu = m.g + n * F;
    m.w = m.dhu + n * 2 * F, m.dw = m.w + n, m.dlogits = m.dw + n;
    int w = p->ops[k].s.w;
    m.router = p->params + p->tab[first_tensor(p, l) + w].offset;
    m.wg = p->params + p->tab[first_tensor(p, l) + w + 1].offset;
    m.wu = p->params + p->tab[first_tensor(p, l) + w + 2].offset;
    m.wd = p->params + p->tab[first_tensor(p, l) + w + 3].offset;
    return m;
}

/* The choices from the kept probabilities, sorted by expert. */
static void route(const dt_program *p, moe_run *m) {
    dt_moe_topk(m->w, m->idx, m->probs, m->BT, m->E, m->K, p->cfg.norm_topk);
    dt_moe_sort(m->order, m->start, m->row_of, m->idx, m->pairs, m->E);
}

void dt_program_moe_forward(dt_program *p, int l, int k, const float *x, float *out) {
    moe_run m = run_of(p, l, k);
    dt_matmul_forward(m.probs, x, m.router, NULL, m.BT, m.C, m.E);
    dt_moe_softmax(m.probs, m.BT, m.E);
    route(p, &m);
    dt_moe_gather(m.xs, x, m.order, m.pairs, m.K, m.C);
    dt_moe_experts_forward(m.hu, m.act, m.ys, m.xs, m.start, m.wg, m.wu, m.wd, m.E, m.C, m.F);
    dt_moe_combine(out, m.ys, m.w, m.idx, m.row_of, m.BT, m.K, m.C, false);
    if (p->recomputing) return;
    /* each expert's load, and what the balancing loss reads: the choices and probabilities of every layer */
    double *load = p->s->moe_acc, *psum = load + m.E, *seen = p->moe_load + (size_t)p->bk[l] * m.E;
    for (int e = 0; e < m.E; e++) load[e] += m.start[e + 1] - m.start[e], seen[e] += m.start[e + 1] - m.start[e];
    for (int i = 0; i < m.BT; i++)
        for (int e = 0; e < m.E; e++) psum[e] += m.probs[(size_t)i * m.E + e];
    p->s->moe_rows += m.BT;
}

void dt_program_moe_backward(dt_program *p, int l, int k, const float *x, const float *dout, float *dx) {
    moe_run m = run_of(p, l, k);
    int w = p->ops[k].s.w;
    float *grad[4];
    for (int j = 0; j < 4; j++) grad[j] = p->grads + p->tab[first_tensor(p, l) + w + j].offset;
    route(p, &m);
    dt_moe_gather(m.xs, x, m.order, m.pairs, m.K, m.C);
    dt_swiglu_forward(m.act, m.hu, m.pairs, m.F);
    dt_moe_gather(m.ys, dout, m.order, m.pairs, m.K, m.C);
    dt_moe_experts_backward(m.ys, grad[1], grad[2], grad[3], m.dw, m.ys, m.g, m.dhu, m.xs, m.hu, m.act, m.w, m.order, m.start, m.wg, m.wu,
                            m.wd, m.E, m.C, m.F);
    dt_moe_combine(dx, m.ys, NULL, m.idx, m.row_of, m.BT, m.K, m.C, true);
    /* the balancing loss's gradient reaches every probability: d/dp_te = coef E f_e / N */
    double *load = p->s->moe_acc, N = p->s->moe_rows;
    float daux[4096];
    for (int e = 0; p->cfg.aux_coef > 0 && e < m.E; e++)
        daux[e] = (float)(p->s->moe_gscale * p->cfg.aux_coef * m.E * (load[e] / N) / N);
    dt_moe_router_backward(m.dlogits, m.probs, m.w, m.idx, m.dw, p->cfg.aux_coef > 0 ? daux : NULL, m.BT, m.E, m.K, p->cfg.norm_topk);
    dt_matmul_backward(dx, grad[0], NULL, m.dlogits, x, m.router, m.BT, m.C, m.E);
}

static int moe_op(const dt_program *p) {
    for (int k = 0; k < p->f->nops; k++)
        if (p->ops[k].s.kind == DT_OP_MOE) return k;
    return -1;
}

const float *dt_program_moe_probs(const dt_program *p, int l) {
    int k = moe_op(p);
    return k < 0 || l < 0 || l >= p->cfg.num_layers || p->bk[l] < 0 || !p->s->mem ? NULL : op_stats(p, l, k);
}

const float *dt_program_moe_output(const dt_program *p) {
    int L = p->cfg.num_layers, k = moe_op(p), l = p->ub - 2 < L - 1 ? p->ub - 2 : L - 1; /* the last block run (the value is one
                                                                                                  * block's, rewritten by each) */
    return k < 0 || l < 0 || l >= p->cfg.num_layers || p->bk[l] < 0 || !p->s->mem ? NULL : value(p, l, p->ops[k].s.out);
}

double dt_program_moe_balance_loss(const dt_program *p) { return dt_program_moe_aux(p); }

bool dt_program_holds_block(const dt_program *p, int l) { return l >= 0 && l < p->cfg.num_layers && p->bk[l] >= 0; }

double dt_program_moe_aux(const dt_program *p) {
    const program_slot *s = p->s;
    int E = p->cfg.experts;
    if (!E || !s->moe_acc || !s->moe_rows) return 0;
    double sum = 0, N = s->moe_rows;
    for (int e = 0; e < E; e++) sum += s->moe_acc[e] / N * (s->moe_acc[E + e] / N);
    return E * sum;
}

void dt_program_moe_load(dt_program *p, double *load) {
    size_t n = (size_t)p->nl * (size_t)p->cfg.experts;
    if (load) memcpy(load, p->moe_load, n * sizeof(double));
    memset(p->moe_load, 0, n * sizeof(double));
}
