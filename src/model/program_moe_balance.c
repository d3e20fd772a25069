/* A mixture's balancing losses, as a micro-batch's forward counts them and its backward takes their gradients:
 * Switch's load-balancing loss over all layers (Hugging Face's load_balancing_loss_func: E sum_e f_e P_e, f_e the
 * share of all layers' choices that went to e, P_e its mean probability over all layers' tokens), the router z-loss
 * (ST-MoE's), the sequence-wise loss (DeepSeek-V2's and V3's, Megatron's seq_aux_loss: each layer's, each
 * sequence's f_e P_e, with the token's K most probable experts counted whatever the routing chose) and the
 * global-batch loss (Megatron's global_aux_loss: each layer's, f_e counted over the data-parallel ranks' micro-batches
 * of the same index and the step's micro-batches so far, over part.global_sums); and their values for the metrics.
 *
 * Each takes the whole micro-batch: where ranks hold parts of it (pipeline stages its layers, context-parallel ranks
 * its rows) the sums are added over them, posted when a rank's last range has run forward (every rank of the group
 * posts its micro-batches in order) and waited for by the head's loss and the first backward that needs them; the
 * stages' forwards all come before the last stage's head, so no wait is a cycle. The sequence-wise statistics are
 * [L][2][B][E] by the whole model's layer index, a stage's other layers zero, so one sum fills every layer. */
#include "program_internal.h"

#include <stdlib.h>
#include <string.h>

static bool biased(const dt_program *p) { return p->cfg.router == DT_ROUTER_SIGMOID_BIAS; }

dt_status dt_program_set_z_loss(dt_program *p, float coef) {
    if (!(coef >= 0)) return dt_error(DT_ERR_ARG, "model: a router z-loss coefficient of %g", (double)coef);
    if (coef > 0 && (!p->cfg.experts || biased(p)))
        return dt_error(DT_ERR_ARG, "the router z-loss (--moe-z-loss) is a softmax router's: %s", p->cfg.experts ? "this one is the sigmoid router" : "the model has no experts");
    p->z_coef = coef;
    return DT_OK;
}

dt_status dt_program_set_global_aux_loss(dt_program *p, float coef) {
    if (!(coef >= 0)) return dt_error(DT_ERR_ARG, "model: a global-batch balancing loss coefficient of %g", (double)coef);
    if (coef > 0 && !p->cfg.experts) return dt_error(DT_ERR_ARG, "the global-batch balancing loss (--moe-global-aux-loss) is a mixture's: the model has no experts");
    if (coef > 0 && !p->glob_run && !(p->glob_run = calloc((size_t)p->cfg.num_layers * (p->cfg.experts + 1), sizeof(double))))
        return dt_error(DT_ERR_NOMEM, "model: out of memory");
    p->glob_coef = coef;
    return DT_OK;
}

void dt_program_moe_new_step(dt_program *p) {
    if (p->glob_run) memset(p->glob_run, 0, (size_t)p->cfg.num_layers * (p->cfg.experts + 1) * sizeof(double));
}

dt_status dt_program_set_seq_aux_loss(dt_program *p, float coef) {
    if (!(coef >= 0)) return dt_error(DT_ERR_ARG, "model: a sequence-wise balancing loss coefficient of %g", (double)coef);
    if (coef > 0 && !p->cfg.experts) return dt_error(DT_ERR_ARG, "the sequence-wise balancing loss (--moe-seq-aux-loss) is a mixture's: the model has no experts");
    p->seq_coef = coef;
    return DT_OK;
}

/* The statistics' doubles for B sequences (none without the loss). */
static size_t seq_doubles(const dt_program *p, int B) { return p->seq_coef > 0 ? (size_t)p->cfg.num_layers * 2 * (size_t)B * p->cfg.experts : 0; }

dt_status dt_program_moe_begin(dt_program *p, int B) {
    program_slot *s = p->s;
    size_t E = (size_t)p->cfg.experts, n = seq_doubles(p, B);
    if (n > s->moe_seq_cap) { /* (nothing is under way: the caller waited) */
        double *acc = realloc(s->moe_acc, (2 * E + n) * sizeof(double)), *sum = acc ? realloc(s->moe_sum, (2 * E + 2 + n) * sizeof(double)) : NULL;
        if (acc) s->moe_acc = acc;
        if (sum) s->moe_sum = sum;
        if (!sum) return dt_error(DT_ERR_NOMEM, "model: no room for %d sequences' balance over %zu experts", B, E);
        s->moe_seq_cap = n;
    }
    if (B > s->moe_daux_B) {
        float *daux = realloc(s->moe_daux, (size_t)B * E * sizeof(float));
        if (!daux) return dt_error(DT_ERR_NOMEM, "model: no room for %d sequences' balancing gradients over %zu experts", B, E);
        s->moe_daux = daux, s->moe_daux_B = B;
    }
    size_t g = (size_t)p->cfg.num_layers * (2 * E + 1);
    if (p->glob_coef > 0 && !s->moe_glob) {
        s->moe_glob = calloc(g, sizeof(double)), s->moe_glob_f = calloc((size_t)p->cfg.num_layers * E, sizeof(double));
        if (!s->moe_glob || !s->moe_glob_f) return dt_error(DT_ERR_NOMEM, "model: no room for the global-batch balance's counts");
    }
    if (s->moe_glob) memset(s->moe_glob, 0, g * sizeof(double));
    s->moe_glob_ready = false;
    s->moe_seq = n;
    memset(s->moe_acc, 0, (2 * E + n) * sizeof(double));
    s->moe_rows = 0, s->moe_z = 0;
    return DT_OK;
}

void dt_program_moe_count(dt_program *p, int l, const float *probs, int BT) {
    program_slot *s = p->s;
    size_t E = (size_t)p->cfg.experts, BE = (size_t)s->B * E;
    if (p->seq_coef > 0) {
        double *count = s->moe_acc + 2 * E + (size_t)l * 2 * BE;
        dt_moe_seq_stats(count, count + BE, probs, BT, BT / s->B, (int)E, p->cfg.experts_top_k, biased(p));
    }
    if (p->glob_coef > 0) { /* one "sequence" of every row */
        double *count = s->moe_glob + (size_t)l * (2 * E + 1);
        dt_moe_seq_stats(count, count + E, probs, BT, BT, (int)E, p->cfg.experts_top_k, biased(p));
        count[2 * E] += BT;
    }
}

dt_status dt_program_moe_sums_post(dt_program *p) {
    program_slot *s = p->s;
    size_t E = (size_t)p->cfg.experts;
    if (p->recomputing) return DT_OK;
    memcpy(s->moe_sum, s->moe_acc, 2 * E * sizeof(double));
    s->moe_sum[2 * E] = s->moe_rows, s->moe_sum[2 * E + 1] = s->moe_z;
    memcpy(s->moe_sum + 2 * E + 2, s->moe_acc + 2 * E, s->moe_seq * sizeof(double));
    dt_status st = DT_OK;
    if (p->part.sums) {
        s->moe_ops = p->part.sums;
        st = p->part.sums->post(p->part.sums->ctx, s->moe_sum, 2 * E + 2 + s->moe_seq, &s->moe_req);
    }
    if (!st && s->moe_glob && p->part.global_sums) {
        s->moe_glob_ops = p->part.global_sums;
        st = p->part.global_sums->post(p->part.global_sums->ctx, s->moe_glob, (size_t)p->cfg.num_layers * (2 * E + 1), &s->moe_glob_req);
    }
    return st;
}

dt_status dt_program_moe_sums_wait(program_slot *s) {
    dt_status st = DT_OK, st2 = DT_OK;
    if (s->moe_req) st = s->moe_ops->wait(s->moe_ops->ctx, s->moe_req);
    if (s->moe_glob_req) st2 = s->moe_glob_ops->wait(s->moe_glob_ops->ctx, s->moe_glob_req);
    s->moe_req = s->moe_glob_req = NULL;
    return st ? st : st2;
}

/* The global counts landed: added to the step's so far, each layer's shares of them f_e = counts_e / (rows K), the
 * step's micro-batches so far together (Megatron's running average over a step's accumulation), taken once. */
static void take_global(dt_program *p) {
    program_slot *s = p->s;
    int E = p->cfg.experts, K = p->cfg.experts_top_k;
    if (!s->moe_glob || s->moe_glob_ready) return;
    for (int l = 0; l < p->cfg.num_layers; l++) {
        const double *c = s->moe_glob + (size_t)l * (2 * E + 1);
        double *run = p->glob_run + (size_t)l * (E + 1);
        for (int e = 0; e <= E; e++) run[e] += c[e == E ? 2 * E : e];
        for (int e = 0; e < E; e++) s->moe_glob_f[(size_t)l * E + e] = run[E] > 0 ? run[e] / (run[E] * K) : 0;
    }
    s->moe_glob_ready = true;
}

dt_status dt_program_moe_sums_land(dt_program *p) {
    dt_status st = dt_program_moe_sums_wait(p->s);
    if (!st) take_global(p);
    return st;
}

double dt_program_moe_z_loss(const dt_program *p) {
    int E = p->cfg.experts;
    return p->s && p->s->moe_sum && p->s->moe_sum[2 * E] ? p->s->moe_sum[2 * E + 1] / p->s->moe_sum[2 * E] : 0;
}

double dt_program_moe_balance_loss(const dt_program *p) {
    const program_slot *s = p->s;
    int E = p->cfg.experts;
    if (!E || !s->moe_sum || !s->moe_sum[2 * E]) return 0;
    double sum = 0, N = s->moe_sum[2 * E];
    for (int e = 0; e < E; e++) sum += s->moe_sum[e] / N * (s->moe_sum[E + e] / N);
    return E * sum;
}

/* Layer l's counts of sequence b (its probabilities' sums E further), after the sums; its tokens (0: a dense layer). */
static const double *seq_counts(const dt_program *p, int l, int b, double *tokens) {
    const program_slot *s = p->s;
    size_t E = (size_t)p->cfg.experts, BE = (size_t)s->B * E;
    const double *n = s->moe_sum + 2 * E + 2 + (size_t)l * 2 * BE + (size_t)b * E;
    double t = 0;
    for (size_t e = 0; e < E; e++) t += n[e];
    *tokens = t / p->cfg.experts_top_k; /* each token counts K choices */
    return n;
}

double dt_program_moe_seq_loss(const dt_program *p) {
    const program_slot *s = p->s;
    int E = p->cfg.experts, K = p->cfg.experts_top_k;
    if (!E || !s || !s->moe_seq) return 0;
    size_t BE = (size_t)s->B * E;
    double loss = 0;
    for (int l = 0; l < p->cfg.num_layers; l++)
        for (int b = 0; b < s->B; b++) {
            double T, sum = 0;
            const double *n = seq_counts(p, l, b, &T);
            for (int e = 0; T > 0 && e < E; e++) sum += n[e] * E / (K * T) * (n[BE + e] / T);
            loss += sum / s->B;
        }
    return loss;
}

double dt_program_moe_global_loss(const dt_program *p) {
    const program_slot *s = p->s;
    int E = p->cfg.experts;
    if (!E || !s || !s->moe_glob || !s->moe_glob_ready) return 0;
    double loss = 0; /* each layer's E sum_e f_e P_e, P_e over the global micro-batch (the ranks' losses' mean) */
    for (int l = 0; l < p->cfg.num_layers; l++) {
        const double *c = s->moe_glob + (size_t)l * (2 * E + 1);
        for (int e = 0; c[2 * E] > 0 && e < E; e++) loss += E * s->moe_glob_f[(size_t)l * E + e] * (c[E + e] / c[2 * E]);
    }
    return loss;
}

void dt_program_moe_terms(dt_program *p, double *out) {
    memcpy(out, p->moe_terms, sizeof p->moe_terms);
    memset(p->moe_terms, 0, sizeof p->moe_terms);
}

/* The context-parallel ranks a rank's balancing gradients are averaged over (each holds its share of the rows). */
static int cp_share(const dt_program *p) { return p->part.sums && p->part.cp_size > 1 ? p->part.cp_size : 1; }

double dt_program_moe_grad_rows(const dt_program *p) {
    int E = p->cfg.experts;
    return p->s->moe_sum[2 * E] / cp_share(p);
}

const float *dt_program_moe_daux(dt_program *p, int l, int rows) {
    program_slot *s = p->s;
    int E = p->cfg.experts, K = p->cfg.experts_top_k;
    bool sw = p->cfg.aux_coef > 0 && !biased(p), seq = s->moe_seq > 0, glob = s->moe_glob_ready;
    if (!sw && !seq && !glob) return NULL;
    /* Switch's: d/dp_te = coef E f_e / N, f_e the whole micro-batch's share; the sequence-wise: coef f_be / (B T_b) */
    const double *load = s->moe_sum;
    double N = dt_program_moe_grad_rows(p), parts = cp_share(p);
    for (int b = 0; b < s->B; b++) {
        double T = 0;
        const double *n = seq ? seq_counts(p, l, b, &T) : NULL;
        for (int e = 0; e < E; e++) {
            double d = sw ? p->cfg.aux_coef * E * (load[e] / load[2 * E]) / N : 0;
            if (seq && T > 0) d += p->seq_coef * (n[e] * E / (K * T)) * parts / (s->B * T);
            /* the global-batch one: coef E f_e / (this rank's rows), the ranks' gradients averaged */
            if (glob) d += p->glob_coef * E * s->moe_glob_f[(size_t)l * E + e] / rows;
            s->moe_daux[(size_t)b * E + e] = (float)(s->moe_gscale * d);
        }
    }
    return s->moe_daux;
}
