/* A second-order optimizer in the plan (K-FAC, Shampoo, SOAP). Its state comes from the optimizers' own geometry
 * (dt_kfac_plan, dt_shampoo_plan: each Linear's and block's sides and owner as a run assigns them, nothing allocated),
 * so the rank holding most is the run's; its time from the FLOPs of the factors and the preconditioning at the job's
 * GEMM rate, the decompositions timed here (dt_plan_time_eigen; elsewhere 9 n^3 FLOPs at a quarter of the GEMM rate,
 * LAPACK's syevd being half matrix-vector work) and spread over their interval, and the collectives by their
 * alpha-beta cost. The elementwise passes (Adam's grafting, SOAP's moments) are left to the optimizer's own term. */
#include "plan_internal.h"

#include "dtrain/kfac.h"
#include "dtrain/shampoo.h"
#include "dtrain/soap.h"

#include <math.h>
#include <stdlib.h>

/* Seconds of an n x n eigen-decomposition on a rank. */
static double eigen(const dt_plan_hardware *h, int n, double rate, int threads, double slow) {
    double here = h->attention_rate ? dt_plan_time_eigen(n, threads) : 0;
    return here > 0 ? here * slow : 9.0 * pow(n, 3) / (0.25 * rate);
}

typedef struct {
    double bytes, scratch;  /* state on the rank holding most; the transient buffers beside it */
    double compute, comm;   /* a step's seconds on the busiest rank */
} second_cost;

static double tri(double n) { return n * (n + 1) / 2; }

/* K-FAC: every rank's factors a micro-batch (syrk: rows n^2 a factor) reduced (upper triangles) to each Linear's
 * worker, while forward and backward go on (overlap: their seconds; only what exceeds them is exposed); the workers' decompositions every inv_every steps, broadcast along their columns; the holders' four GEMMs a
 * part (eigen; inverse two) and the rows' broadcasts of the results. The busiest rank's. */
static void kfac_cost(const dt_plan_job *j, const dt_plan_hardware *h, double rate, int threads, double slow, double a, double b,
                      double overlap, second_cost *out) {
    dt_model m;
    dt_program *p = dt_plan_model_table(j, &m);
    dt_kfac_linear *l = NULL;
    dt_linear_layer *layers = NULL;
    int nl = 0, P = 1, R = j->dp > 1 ? j->dp : 1, nlayers = 0;
    dt_status st = p ? dt_program_linears(p, &layers, &nlayers) : DT_ERR_ARG;
    if (!st) st = dt_kfac_plan(&j->kfac, layers, nlayers, R, &l, &nl, &P);
    free(layers);
    if (st) {
        dt_program_destroy(p);
        return;
    }
    double rows = (double)j->batch * j->seq, micro = j->micro > 0 ? j->micro : 1, factors = 0, reduced = 0, big = 1, wide = 1;
    double *state = calloc((size_t)R, sizeof *state), *work = calloc((size_t)R, sizeof *work), *comm = calloc((size_t)R, sizeof *comm);
    int eig_k = j->kfac.method == DT_KFAC_EIGEN;
    for (int i = 0; i < nl && state && work && comm; i++) {
        double n = l[i].n, f = n * n, dec = eigen(h, l[i].n, rate, threads, slow), pre = 0, rowb = 0;
        factors += rows * n * n, reduced += tri(n), big = fmax(big, n * n);
        for (int k = 0; k < l[i].nparts; k++) {
            double o = l[i].out[k];
            f += o * o, factors += rows * o * o, reduced += tri(o), big = fmax(big, o * o), wide = fmax(wide, o * n);
            dec += eigen(h, l[i].out[k], rate, threads, slow);
            pre += (eig_k ? 2 : 1) * 2 * (o * n * n + o * o * n), rowb += o * n * 4;
        }
        int col = R / P; /* a column's ranks hold the decompositions */
        state[l[i].worker] += f * 4;
        work[l[i].worker] += dec / j->kfac.inv_every;
        comm[l[i].worker] += (col > 1 ? (col - 1) * a + l[i].inv_floats * 4 * b : 0) / j->kfac.inv_every;
        for (int r = 0; r < R; r++) {
            if (r % P != l[i].worker % P) continue;
            state[r] += (double)l[i].inv_floats * 4;
            work[r] += pre / rate;
            comm[r] += P > 1 ? (P - 1) * a + rowb * b : 0;
        }
    }
    double fac = micro * factors / rate / j->kfac.factor_every, red = micro * dt_plan_allreduce(reduced * 4, R, a, b, 0) / j->kfac.factor_every;
    for (int r = 0; r < R && state && work && comm; r++) {
        out->bytes = fmax(out->bytes, state[r]);
        if (work[r] + fac > out->compute) out->compute = work[r] + fac, out->comm = comm[r] + fmax(0, red - overlap);
    }
    out->scratch = 4 * (2 * big + 2 * wide + (R > 1 ? DT_KFAC_IN_FLIGHT * big : 0)); /* and the reductions under way */
    free(state), free(work), free(comm), free(l);
    dt_program_destroy(p);
}

/* The tensors as one expert-parallel rank holds them: a stacked tensor's E/ep experts of E (each rank the same count);
 * malloc'd, NULL on no memory. */
static dt_tensor_info *ep_rank_table(const dt_model *m, int ep) {
    dt_tensor_info *t = malloc(((size_t)m->ntensors + 1) * sizeof *t);
    for (int i = 0; t && i < m->ntensors; i++) {
        t[i] = m->tensors[i];
        if (ep <= 1 || !t[i].stacked) continue;
        t[i].shape[0] /= ep, t[i].count /= (size_t)ep;
        t[i].slice = (dt_tensor_slice){ 0, 0, t[i].shape[0], 1, t[i].shape[0] };
    }
    return t;
}

/* Shampoo: a block's factors (syrk: numel d a dimension) and its contractions with the roots (2 numel d) every step,
 * its roots every `every` steps (an eigen-decomposition and a d^3 GEMM each), on its owner; the group's allgather of
 * the directions. The busiest owner's. */
static void shampoo_cost(const dt_plan_job *j, const dt_plan_hardware *h, double rate, int threads, double slow, double a, double b,
                         second_cost *out) {
    dt_model m;
    dt_program *p = dt_plan_model_table(j, &m);
    dt_shampoo_block *bl = NULL;
    int nb = 0, R = j->dp > 1 ? j->dp : 1, g = j->shampoo.group ? j->shampoo.group : R, every = j->shampoo.every;
    dt_tensor_info *rank_table = p ? ep_rank_table(&m, j->ep) : NULL;
    if (!rank_table || dt_shampoo_plan(&j->shampoo, rank_table, m.ntensors, R, &bl, &nb)) {
        free(rank_table);
        dt_program_destroy(p);
        return;
    }
    double *state = calloc((size_t)g, sizeof *state), *work = calloc((size_t)g, sizeof *work), *floats = calloc((size_t)g, sizeof *floats);
    double total = 0, big = 1, side = 1;
    for (int i = 0; i < nb && state && work && floats; i++) {
        int o = bl[i].owner;
        double n = (double)bl[i].numel, f = 0, roots = 0;
        for (int k = 0; k < bl[i].ndim; k++) {
            double d = bl[i].dim[k];
            f += 3 * n * d, side = fmax(side, d);
            roots += eigen(h, bl[i].dim[k], rate, threads, slow) + 2 * d * d * d / rate;
        }
        for (int r = o < 0 ? 0 : o; r < (o < 0 ? g : o + 1); r++) /* a rank's own expert's block: on every rank, never sent */
            state[r] += (double)bl[i].state_floats * 4, work[r] += f / rate + roots / every, floats[r] += n;
        total += o < 0 ? 0 : n, big = fmax(big, n);
    }
    double wire = j->shampoo.wire == DT_BF16 ? 2 : 4;
    for (int r = 0; r < g && state && work && floats; r++) {
        out->bytes = fmax(out->bytes, state[r]);
        out->compute = fmax(out->compute, work[r]);
        out->scratch = fmax(out->scratch, floats[r] * (4 + (g > 1 && wire == 2 ? 2 : 0)));
    }
    out->comm = dt_plan_gather(total * wire, g, a, b);
    /* the scratch: four blocks' worth, a factor's eigen-decomposition in f32 and f64, every direction received */
    out->scratch += 4 * 4 * fmax(big, side * side) + 12 * (side * side + side) + (g > 1 ? total * (4 + (wire == 2 ? 2 : 0)) : 0);
    free(state), free(work), free(floats), free(bl), free(rank_table);
    dt_program_destroy(p);
}

/* SOAP: each matrix it rotates kept by one rank of the group (dt_soap_assign, as a run assigns them; every rank all
 * with --soap-group 1): L and R with their bases (a side up to precond_max_dim) and Adam's moments, each step the
 * statistics' GEMM and three rotations of a GEMM a side, every precond_every steps a power iteration and a QR a side;
 * the directions allgathered; the other tensors' moments on every rank. The busiest owner's. */
static void soap_cost(const dt_plan_job *j, double rate, double a, double b, second_cost *out) {
    dt_model m;
    dt_program *p = dt_plan_model_table(j, &m);
    int R = j->dp > 1 ? j->dp : 1, g = j->opt.soap_group && R > 1 ? j->opt.soap_group : R, n = 0;
    dt_tensor_span *sp = NULL; /* the tensors a run's SOAP steps (soap.c's own list) */
    dt_tensor_info *rank_table = p ? ep_rank_table(&m, j->ep) : NULL;
    if (!rank_table || dt_soap_spans(rank_table, m.ntensors, &sp, &n)) sp = NULL;
    int *owner = sp ? calloc((size_t)n + 1, sizeof *owner) : NULL;
    double *flops = owner ? calloc((size_t)n + 1, sizeof *flops) : NULL, *state = calloc((size_t)g, sizeof *state),
           *work = calloc((size_t)g, sizeof *work), *mine = calloc((size_t)g, sizeof *mine);
    size_t *floats = flops ? calloc((size_t)n + 1, sizeof *floats) : NULL;
    double big = 1, total = 0;
    if (floats && state && work && mine) {
        dt_soap_assign(&j->opt, sp, n, g, owner, flops, floats);
        for (int i = 0; i < n; i++) {
            big = fmax(big, (double)sp[i].count);
            /* Adam's moments on every rank; a rank's own experts rotated there too */
            for (int r = 0; r < g && owner[i] < 0; r++) state[r] += 4.0 * (double)floats[i], work[r] += sp[i].own ? flops[i] / rate : 0;
            for (int k = 0; k < 2 && (owner[i] >= 0 || sp[i].own); k++) {
                double d = k ? sp[i].cols : sp[i].rows;
                if (d <= j->opt.precond_max_dim) big = fmax(big, d * d);
            }
            if (owner[i] < 0) continue;
            int o = owner[i];
            state[o] += 4.0 * (double)floats[i], work[o] += flops[i] / rate, mine[o] += (double)sp[i].count, total += (double)sp[i].count;
        }
        for (int r = 0; r < g; r++) {
            out->bytes = fmax(out->bytes, state[r]), out->compute = fmax(out->compute, work[r]);
            out->scratch = fmax(out->scratch, g > 1 ? 4 * (mine[r] + total) : 0); /* the exchange's: its own, every rank's */
        }
        out->comm = g > 1 ? dt_plan_gather(total * 4, g, a, b) : 0;
    }
    out->scratch += 4 * 4 * (big + j->opt.precond_max_dim); /* its four work matrices */
    free(sp), free(owner), free(flops), free(floats), free(state), free(work), free(mine), free(rank_table);
    dt_program_destroy(p);
}

/* Tensor parallelism: each rank of a group preconditions the whole tensors (the same work on each, as counted above):
 * a step's gradients allgathered whole, and K-FAC's Linears' split sides (a row-parallel one's inputs, a column-parallel
 * one's output gradients) a micro-batch each at its factor interval; the whole store, the pieces and a side's values
 * beside. */
static void tp_cost(const dt_plan_job *j, double a, double b, second_cost *out) {
    dt_model m;
    dt_program *p = dt_plan_model_table(j, &m);
    dt_linear_layer *layers = NULL;
    int nlayers = 0;
    if (!p) return;
    double big = 1, wide = 1, rows = (double)j->batch * j->seq, micro = j->micro > 0 ? j->micro : 1, sides = 0;
    for (int i = 0; i < m.ntensors; i++) big = fmax(big, (double)m.tensors[i].count);
    if (j->kfac_on && !dt_program_linears(p, &layers, &nlayers))
        for (int i = 0; i < nlayers; i++) {
            double side = layers[i].w[0]->split == DT_SPLIT_ROW ? layers[i].in : 0;
            for (int k = 0; k < layers[i].nparts && layers[i].w[0]->split == DT_SPLIT_COLUMN; k++) side += layers[i].w[k]->shape[0];
            wide = fmax(wide, side);
            sides += side > 0 ? dt_plan_gather(rows * side * 4, j->tp, a, b) : 0;
        }
    free(layers);
    /* a pipeline stage's store holds its own tensors: the model's over the stages (the comm is divided by the caller) */
    double store = (double)m.nparams / (j->pp > 1 ? j->pp : 1);
    out->comm += dt_plan_gather((double)m.nparams * 4, j->tp, a, b) + (j->kfac_on ? micro * sides / j->kfac.factor_every : 0);
    out->scratch += 4 * (store + big + (j->kfac_on ? 2 * rows * wide : 0));
    dt_program_destroy(p);
}

/* Whether the job has a second-order optimizer (a preconditioner of the engine's: K-FAC, Shampoo or SOAP). */
static bool second_order(const dt_plan_job *j) { return j->kfac_on || j->shampoo_on || j->opt.kind == DT_OPT_SOAP; }

/* A pipeline's stages each hold their own layers' share: taken as the whole model's over the stages (the blocks
 * dominate; a stage of the embeddings or the head alone holds less). */
static void cost(const dt_plan_job *j, const dt_plan_hardware *h, double rate, int threads, double slow, double overlap, second_cost *out) {
    *out = (second_cost){ 0 };
    double a = h ? (j->nodes > 1 ? h->inter_alpha : h->intra_alpha) : 0, b = h ? (j->nodes > 1 ? h->inter_beta : h->intra_beta) : 0;
    if (!(rate > 0)) rate = 1e10;
    if (j->kfac_on) kfac_cost(j, h, rate, threads, slow, a, b, overlap, out);
    else if (j->shampoo_on) shampoo_cost(j, h, rate, threads, slow, a, b, out);
    else if (j->opt.kind == DT_OPT_SOAP) soap_cost(j, rate, a, b, out);
    if (second_order(j) && j->tp > 1) tp_cost(j, a, b, out);
    double pp = j->pp > 1 ? j->pp : 1;
    out->bytes /= pp, out->compute /= pp, out->comm /= pp;
}

double dt_plan_second_order_bytes(const dt_plan_job *j, double *scratch) {
    second_cost c;
    static const dt_plan_hardware none = { .attention_rate = 0 };
    if (!second_order(j)) return *scratch = 0, 0;
    cost(j, &none, 1e10, 1, 1, 0, &c); /* the state alone: no timings asked for */
    *scratch = c.scratch;
    return c.bytes;
}

void dt_plan_second_order_time(const dt_plan_job *j, const dt_plan_hardware *h, double rate, int threads, double slow, double overlap,
                               double *compute, double *comm) {
    second_cost c;
    cost(j, h, rate, threads, slow, overlap, &c);
    *compute = c.compute, *comm = c.comm;
}
