/* The mixture-of-experts op (Mixtral's and Qwen 2 MoE's sparse MoE blocks): a softmax router picks each token's top k of E experts,
 * the (token, choice) pairs are sorted by expert, each expert's SwiGLU MLP runs over its rows (kernels/moe.c), and
 * each token's output is its choices' outputs weighted by the router (renormalised over the k, Mixtral's), summed in
 * the experts' order (then a shared expert's, scaled by a sigmoid gate of the token, where the family has one). Dropless: every choice is computed. Kept for backward: the router's probabilities and the
 * gate|up products of every pair; the choices, the sort and the SwiGLU outputs are made again from them. Forward
 * counts what the balancing losses take (program_moe_balance.c), backward adds their gradients to the router's. */
#include "program_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static int pairs_of(const dt_program *p, size_t BT) { return (int)BT * p->cfg.experts_top_k; }
/* The hidden units the slot's room for the routed pairs holds: none under expert parallelism (the experts' rank keeps
 * their gate|up and runs their SwiGLU in its own buffers, program_moe_ep.c). */
static size_t pair_ffn(const dt_program *p) { return p->part.ep_size > 1 ? 0 : (size_t)p->cfg.ffn; }
/* The routed experts' products a pair keeps: SwiGLU's gate|up (2F), GELU's up (F) */
static size_t pair_hu(const dt_program *p) { return (dt_family_moe_gated(p->f) ? 2 : 1) * pair_ffn(p); }
static bool shared(const dt_program *p) { return p->cfg.shared_ffn > 0; }
/* A shared expert's hidden units on this rank (tensor parallelism splits them as a dense MLP's). */
static size_t shared_units(const dt_program *p) { return (size_t)p->Sl; }

/* What a block keeps: the router's probabilities, every pair's gate|up (or up) products, the shared expert's and its
 * gate, each row's log-sum-exp of its router logits (the z-loss's). */
size_t dt_program_moe_kept(const dt_program *p, size_t BT) {
    return BT * (size_t)p->cfg.experts + (size_t)pairs_of(p, BT) * pair_hu(p) + (shared(p) ? BT * (2 * shared_units(p) + 1) : 0) +
           BT;
}

/* A group of n rows through experts of F hidden units (H: their products, 2F with a gate): their inputs, activations,
 * outputs (their gradients), g, d(products), the rows' weights and their gradients. The routed pairs and the shared
 * expert's rows use the same floats in turn; then the router's d(logits). */
static size_t group_floats(size_t n, size_t C, size_t F, size_t H) { return n * (2 * C + 2 * F + H + 2); }

size_t dt_program_moe_work(const dt_program *p, size_t BT) {
    size_t C = (size_t)p->cfg.channels, routed = group_floats((size_t)pairs_of(p, BT), C, pair_ffn(p), pair_hu(p));
    size_t Fs = shared_units(p), own = shared(p) ? group_floats(BT, C, Fs, 2 * Fs) + BT * C : 0;
    return (routed > own ? routed : own) + BT * (size_t)p->cfg.experts;
}

/* The pairs' choices, order, rows and the experts' first rows; the shared expert's rows in order. */
size_t dt_program_moe_ints(const dt_program *p, size_t BT) {
    return 3 * (size_t)pairs_of(p, BT) + (size_t)p->cfg.experts + 1 + (shared(p) ? BT + 2 : 0);
}

typedef struct {
    float *xs, *act, *ys, *g, *dhu, *w, *dw;
} group;

static group group_at(float *at, size_t n, size_t C, size_t F, size_t H) {
    group g = { .xs = at };
    g.act = g.xs + n * C, g.ys = g.act + n * F, g.g = g.ys + n * C, g.dhu = g.g + n * F, g.w = g.dhu + n * H, g.dw = g.w + n;
    return g;
}

typedef struct {
    float *probs, *hu, *shu, *sgate, *lse; /* kept: probabilities, the pairs' and the shared expert's gate|up, its gate, lse */
    int32_t *idx, *order, *row_of, *start, *rows, *all;
    group r;                            /* the routed pairs' scratch */
    float *dlogits, *sdx;
    const float *router, *wg, *wu, *wd, *sg, *su, *sd, *sv;
    float *grad[8];
    int BT, E, K, C, F, Fs, pairs, dropped;
} moe_run;

static moe_run run_of(dt_program *p, int l, int k) {
    program_slot *s = p->s;
    const dt_lm_config *c = &p->cfg;
    moe_run m = { .BT = s->B * s->T, .E = c->experts, .K = c->experts_top_k, .C = c->channels, .F = c->ffn, .Fs = (int)shared_units(p) };
    m.pairs = m.BT * m.K;
    size_t n = (size_t)m.pairs, BT = (size_t)m.BT;
    m.probs = op_stats(p, l, k);
    m.hu = m.probs + BT * (size_t)m.E;
    m.shu = m.hu + n * pair_hu(p);
    m.sgate = m.shu + BT * 2 * (size_t)m.Fs;
    m.lse = m.sgate + (m.Fs > 0 ? BT : 0);
    m.idx = s->moe_int, m.order = m.idx + n, m.row_of = m.order + n, m.start = m.row_of + n;
    m.rows = m.start + m.E + 1, m.all = m.rows + BT; /* the shared expert: every row, in order; its one group */
    m.r = group_at(s->moe_work, n, (size_t)m.C, pair_ffn(p), pair_hu(p));
    m.dlogits = s->moe_work + (dt_program_moe_work(p, BT) - BT * (size_t)m.E);
    const float **wt[8] = { &m.router, &m.wg, &m.wu, &m.wd, &m.sg, &m.su, &m.sd, &m.sv };
    /* each weight's role: GELU experts (nw 3) have no gate (wg and its gradient NULL) */
    static const int gated[8] = { 0, 1, 2, 3, 4, 5, 6, 7 }, gelu[3] = { 0, 2, 3 };
    const int *role = dt_family_moe_gated(p->f) ? gated : gelu;
    float *wide = p->moe_wide; /* 16 bits: the weights' 16-bit values, widened (the products then are 16-bit ones) */
    for (int j = 0; j < p->ops[k].s.nw; j++) {
        const dt_tensor_info *t = &p->tab[tensor_at(p, l, p->ops[k].s.w + j)];
        *wt[role[j]] = p->params + t->offset, m.grad[role[j]] = p->grads + t->offset;
        if (p->prec == DT_F32) continue;
        dt_lp_unpack(wide, p->params_lp + t->offset, t->count, p->prec);
        *wt[role[j]] = wide, wide += t->count;
    }
    return m;
}

float *dt_program_moe_use(const dt_program *p) { return p->moe_wide ? p->moe_wide + dt_program_moe_layer_floats(p) : NULL; }

/* One layer's mixture-of-experts weights (this rank's), in floats. */
size_t dt_program_moe_layer_floats(const dt_program *p) {
    size_t n = 0;
    for (int k = 0; k < p->f->nops; k++) {
        if (p->ops[k].s.kind != DT_OP_MOE) continue;
        for (int l = 0; l < p->cfg.num_layers && !n; l++) {
            if (p->bk[l] < 0 || !op_runs(p, l, k)) continue;
            for (int j = 0; j < p->ops[k].s.nw; j++) n += p->tab[tensor_at(p, l, p->ops[k].s.w + j)].count;
        }
    }
    return n;
}

size_t dt_program_moe_weight_floats(const dt_program *p) {
    size_t layer = dt_program_moe_layer_floats(p), F = (size_t)(p->cfg.ffn > p->cfg.shared_ffn ? p->cfg.ffn : p->cfg.shared_ffn);
    return layer ? layer + F * (size_t)p->cfg.channels : 0;
}

static bool biased(const dt_program *p) { return p->cfg.router == DT_ROUTER_SIGMOID_BIAS; }

/* The sorted rows as expert parallelism sends them (program_moe_ep.c). */
static moe_ep_block ep_block(const moe_run *m, int l) {
    return (moe_ep_block){ .l = l, .E = m->E, .C = m->C, .F = m->F, .rows = m->start[m->E], .start = m->start, .order = m->order,
                           .wg = m->wg, .wu = m->wu, .wd = m->wd, .grads = { m->grad[1], m->grad[2], m->grad[3] } };
}

/* The choices from the kept probabilities (or sigmoid scores, with the layer's bias), sorted by expert. */
static void route(const dt_program *p, int l, moe_run *m) {
    const dt_lm_config *c = &p->cfg;
    if (biased(p))
        dt_moe_topk_biased(m->r.w, m->idx, m->probs, p->moe_bias + (size_t)l * m->E, m->BT, m->E, m->K, c->expert_groups, c->group_top_k,
                           c->norm_topk, c->routed_scale);
    else dt_moe_topk(m->r.w, m->idx, m->probs, m->BT, m->E, m->K, c->norm_topk);
    m->dropped = 0;
    if (c->capacity_factor > 0) { /* an expert past its capacity drops the rest (the pairs' inputs' room, not yet used, sorts them) */
        int cap = (int)ceil((double)c->capacity_factor * m->pairs / m->E);
        m->dropped = dt_moe_capacity(m->idx, m->r.w, m->pairs, m->E, cap, c->drop_policy, m->r.xs);
    }
    dt_moe_sort(m->order, m->start, m->row_of, m->idx, m->pairs, m->E);
}

/* The shared expert (Qwen 2 MoE's): every row through one SwiGLU MLP, scaled by sigmoid(x . v), added to out. Its
 * rows are a group of one expert over all of them, in order, whose weights are the gate's values. Under tensor
 * parallelism each rank holds its hidden units (Megatron's dense MLP: gate and up by rows, down by columns): its
 * output and, backward, d(input) and each row's d(weight) are partial sums, summed over the group. */
static group shared_rows(dt_program *p, moe_run *m) {
    for (int i = 0; i < m->BT; i++) m->rows[i] = i;
    m->all[0] = 0, m->all[1] = m->BT;
    return group_at(p->s->moe_work, (size_t)m->BT, (size_t)m->C, (size_t)m->Fs, 2 * (size_t)m->Fs);
}

/* (DeepSeek's shared experts have no gate: every row's weight is 1) */
static void shared_forward(dt_program *p, moe_run *m, const float *x, float *out) {
    group g = shared_rows(p, m);
    if (m->sv) dt_matmul_forward(m->sgate, x, m->sv, NULL, m->BT, m->C, 1);
    if (m->sv) dt_lp_round(m->sgate, (size_t)m->BT, p->prec); /* a Linear's output */
    for (int i = 0; i < m->BT; i++) g.w[i] = m->sgate[i] = m->sv ? 1.0f / (1.0f + expf(-m->sgate[i])) : 1.0f;
    dt_moe_experts_forward(m->shu, g.act, g.ys, x, m->all, m->sg, m->su, m->sd, 1, m->C, m->Fs, p->prec);
    dt_program_tp_sum(p, g.ys, (size_t)m->BT * m->C);
    dt_moe_combine(out, g.ys, g.w, m->rows, m->rows, m->BT, 1, m->C, true);
}

static void shared_backward(dt_program *p, moe_run *m, const float *x, const float *dout, float *dx) {
    group g = shared_rows(p, m);
    float *dxs = g.dw + m->BT; /* the work's floats past the group's */
    memcpy(g.w, m->sgate, (size_t)m->BT * sizeof(float));
    memcpy(g.ys, dout, (size_t)m->BT * m->C * sizeof(float));
    dt_moe_experts_backward(dxs, m->grad[4], m->grad[5], m->grad[6], g.dw, g.ys, g.g, g.dhu, x, m->shu, g.act, g.w, m->rows, m->all, m->sg,
                            m->su, m->sd, 1, m->C, m->Fs, p->prec, dt_program_moe_use(p));
    dt_program_tp_sum(p, g.dw, (size_t)m->BT * (m->C + 1)); /* each row's d(weight), then d(input): side by side */
    dt_residual_forward(dx, dx, dxs, (size_t)m->BT * m->C);
    if (!m->sv) return;
    for (int i = 0; i < m->BT; i++) g.dw[i] *= g.w[i] * (1.0f - g.w[i]); /* through the sigmoid: d(x . v) */
    dt_lp_round(g.dw, (size_t)m->BT, p->prec);
    dt_matmul_backward(dx, m->grad[7], NULL, g.dw, x, m->sv, m->BT, m->C, 1);
}

static void moe_forward(dt_program *p, int l, int k, const float *x, float *out) {
    moe_run m = run_of(p, l, k);
    dt_matmul_forward(m.probs, x, m.router, NULL, m.BT, m.C, m.E);
    dt_lp_round(m.probs, (size_t)m.BT * m.E, p->prec); /* the router's logits: a Linear's output (softmax then in f32) */
    if (biased(p)) dt_moe_sigmoid(m.probs, m.BT, m.E);
    else dt_moe_softmax(m.probs, m.lse, m.BT, m.E);
    route(p, l, &m);
    dt_moe_gather(m.r.xs, x, m.order, m.start[m.E], m.K, m.C);
    if (p->part.ep_size > 1) {
        moe_ep_block b = ep_block(&m, l);
        dt_program_moe_ep_forward(p, &b, m.r.xs, m.r.w, m.r.ys);
    } else {
        dt_moe_experts_forward(m.hu, m.r.act, m.r.ys, m.r.xs, m.start, m.wg, m.wu, m.wd, m.E, m.C, m.F, p->prec);
    }
    dt_moe_combine(out, m.r.ys, m.r.w, m.idx, m.row_of, m.BT, m.K, m.C, false);
    if (shared(p)) shared_forward(p, &m, x, out);
    if (p->recomputing) return;
    /* each expert's load, and what the balancing loss reads: the choices and probabilities of every layer */
    double *load = p->s->moe_acc, *psum = load + m.E, *seen = p->moe_load + (size_t)p->bk[l] * m.E;
    for (int e = 0; e < m.E; e++) load[e] += m.start[e + 1] - m.start[e], seen[e] += m.start[e + 1] - m.start[e];
    for (int i = 0; i < m.BT; i++)
        for (int e = 0; e < m.E; e++) psum[e] += m.probs[(size_t)i * m.E + e];
    p->s->moe_rows += m.BT;
    if (p->seq_coef > 0 || p->glob_coef > 0) dt_program_moe_count(p, l, m.probs, m.BT);
    for (int i = 0; p->z_coef > 0 && i < m.BT; i++) p->s->moe_z += (double)m.lse[i] * m.lse[i];
    p->moe_drops[0] += m.dropped, p->moe_drops[1] += m.pairs;
}

static void moe_backward(dt_program *p, int l, int k, const float *x, const float *dout, float *dx) {
    moe_run m = run_of(p, l, k);
    if (shared(p)) shared_backward(p, &m, x, dout, dx);
    route(p, l, &m);
    int kept = m.start[m.E];
    dt_moe_gather(m.r.ys, dout, m.order, kept, m.K, m.C);
    memset(m.r.dw, 0, (size_t)m.pairs * sizeof(float)); /* a dropped pair's weight had no output to answer for */
    if (p->part.ep_size > 1) {
        moe_ep_block b = ep_block(&m, l);
        dt_program_moe_ep_backward(p, &b, m.r.ys, m.r.dw);
    } else {
        dt_moe_gather(m.r.xs, x, m.order, kept, m.K, m.C);
        dt_moe_experts_backward(m.r.ys, m.grad[1], m.grad[2], m.grad[3], m.r.dw, m.r.ys, m.r.g, m.r.dhu, m.r.xs, m.hu, m.r.act, m.r.w,
                                m.order, m.start, m.wg, m.wu, m.wd, m.E, m.C, m.F, p->prec, dt_program_moe_use(p));
    }
    dt_moe_combine(dx, m.r.ys, NULL, m.idx, m.row_of, m.BT, m.K, m.C, true);
    dt_status st = dt_program_moe_sums_land(p);
    if (st && !p->comm_err) p->comm_err = st;
    int T = m.BT / p->s->B;
    const float *daux = dt_program_moe_daux(p, l, m.BT); /* the balancing losses' gradients of the probabilities */
    if (biased(p))
        dt_moe_sigmoid_backward(m.dlogits, m.probs, m.r.w, m.idx, m.r.dw, daux, T, m.BT, m.E, m.K, p->cfg.norm_topk, p->cfg.routed_scale);
    else dt_moe_router_backward(m.dlogits, m.probs, m.r.w, m.idx, m.r.dw, daux, T, m.BT, m.E, m.K, p->cfg.norm_topk);
    if (p->z_coef > 0 && !biased(p)) /* the z-loss: the mean of lse^2 over the micro-batch's layers and rows */
        dt_moe_z_backward(m.dlogits, m.probs, m.lse, m.BT, m.E, (float)(p->s->moe_gscale * p->z_coef / dt_program_moe_grad_rows(p)));
    dt_lp_round(m.dlogits, (size_t)m.BT * m.E, p->prec); /* the router's output gradient */
    dt_matmul_backward(dx, m.grad[0], NULL, m.dlogits, x, m.router, m.BT, m.C, m.E);
    dt_lp_round(dx, (size_t)m.BT * m.C, p->prec);
}

/* Sequence parallelism (as Megatron runs a mixture under it): each rank of the tensor-parallel group gathers the
 * micro-batch's rows, runs the mixture on all of them, as it does without SP, and keeps its own rows' outputs; backward
 * gathers d(output) likewise and keeps its rows of d(input). The experts' gradients, the balancing statistics and the
 * loads are then every rank's alike (replicated tensors, no sum), and the routing is one process's. */
static size_t own_row(const dt_program *p, size_t R) { return (size_t)p->part.tp_rank * R; }

void dt_program_moe_forward(dt_program *p, int l, int k, const float *x, float *out) {
    size_t R = dt_program_rows(p, -1), BT = (size_t)p->s->B * p->s->T, C = (size_t)p->cfg.channels;
    if (R == BT) {
        moe_forward(p, l, k, x, out);
        return;
    }
    moe_forward(p, l, k, dt_program_tp_gather(p, x, R * C), p->s->partial);
    memcpy(out, p->s->partial + own_row(p, R) * C, R * C * sizeof(float));
}

void dt_program_moe_backward(dt_program *p, int l, int k, const float *x, const float *dout, float *dx) {
    size_t R = dt_program_rows(p, -1), BT = (size_t)p->s->B * p->s->T, C = (size_t)p->cfg.channels;
    if (R == BT) {
        moe_backward(p, l, k, x, dout, dx);
        return;
    }
    program_slot *s = p->s;
    const float *dout_all = dt_program_tp_gather_to(p, dout, s->partial, R * C); /* beside the gathered input */
    memset(s->moe_dx, 0, BT * C * sizeof(float));
    moe_backward(p, l, k, dt_program_tp_gather(p, x, R * C), dout_all, s->moe_dx);
    dt_residual_forward(dx, dx, s->moe_dx + own_row(p, R) * C, R * C);
}

static int moe_op(const dt_program *p) {
    for (int k = 0; k < p->f->nops; k++)
        if (p->ops[k].s.kind == DT_OP_MOE) return k;
    return -1;
}

const float *dt_program_moe_probs(const dt_program *p, int l) {
    int k = moe_op(p);
    return k < 0 || l < 0 || l >= p->cfg.num_layers || p->bk[l] < 0 || !p->moe_layer[l] || !p->s->mem ? NULL : op_stats(p, l, k);
}

const float *dt_program_moe_output(const dt_program *p) {
    /* the last block run (a mixture, else NULL): the value is one block's, rewritten by each */
    int L = p->cfg.num_layers, k = moe_op(p), l = p->ub - 2 < L - 1 ? p->ub - 2 : L - 1;
    return k < 0 || l < 0 || l >= p->cfg.num_layers || p->bk[l] < 0 || !p->moe_layer[l] || !p->s->mem ? NULL : value(p, l, p->ops[k].s.out);
}

int dt_program_moe_choices(dt_program *p, int l, int32_t *idx) {
    int k = moe_op(p);
    if (!dt_program_moe_probs(p, l)) return -1;
    moe_run m = run_of(p, l, k);
    route(p, l, &m); /* made again from the kept probabilities, as backward does */
    memcpy(idx, m.idx, (size_t)m.pairs * sizeof(int32_t));
    return m.dropped;
}

dt_status dt_program_set_routing(dt_program *p, const dt_lm_config *r) {
    dt_lm_config c = p->cfg;
    c.experts_top_k = r->experts_top_k, c.aux_coef = r->aux_coef, c.capacity_factor = r->capacity_factor, c.drop_policy = r->drop_policy;
    dt_status st = dt_lm_config_check(&c, "model");
    if (st) return st;
    p->cfg = c;
    dt_program_free_slots(p); /* laid out again for k choices a token */
    return DT_OK;
}

float *dt_program_moe_bias(dt_program *p, size_t *n) {
    if (n) *n = p->moe_bias ? (size_t)p->cfg.num_layers * (size_t)p->cfg.experts : 0;
    return p->moe_bias;
}

void dt_program_moe_update_bias(dt_program *p, const double *load) {
    int L = p->cfg.num_layers, E = p->cfg.experts;
    for (int l = 0; p->moe_bias && l < L; l++) { /* DeepSeek-V3's: an expert above the layer's mean load falls by the rate, below it rises */
        double mean = 0;
        for (int e = 0; e < E; e++) mean += load[(size_t)l * E + e] / E;
        for (int e = 0; e < E; e++) {
            double d = mean - load[(size_t)l * E + e];
            p->moe_bias[(size_t)l * E + e] += d > 0 ? p->cfg.bias_rate : d < 0 ? -p->cfg.bias_rate : 0;
        }
    }
}

bool dt_program_holds_block(const dt_program *p, int l) { return l >= 0 && l < p->cfg.num_layers && p->bk[l] >= 0; }

void dt_program_moe_drops(dt_program *p, double *dropped, double *pairs) {
    *dropped = p->moe_drops[0], *pairs = p->moe_drops[1];
    p->moe_drops[0] = p->moe_drops[1] = 0;
}

void dt_program_moe_ep_traffic(dt_program *p, double *bytes) {
    *bytes = p->ep_bytes;
    p->ep_bytes = 0;
}

void dt_program_moe_load(dt_program *p, double *load) {
    size_t n = (size_t)p->nl * (size_t)p->cfg.experts;
    if (!n) return; /* no experts: no counts (moe_load NULL) */
    if (load) memcpy(load, p->moe_load, n * sizeof(double));
    memset(p->moe_load, 0, n * sizeof(double));
}
