/* The engine: one optimizer step, whatever the model and the parallel
 * strategy.
 *
 *   for each micro-batch:  strategy.begin -> micro (forward, backward: the
 *                          model calls the strategy's hook per unit)
 *   strategy.finish        gradients averaged (maybe already applied)
 *   allreduce {loss, stop} every rank learns the global loss and any stop
 *   norm, clip, update     on this rank's slice; strategy.after_update
 *                          (with loss scaling: an overflow skips the update)
 *
 * The single-process strategy is the trivial one: it owns everything and
 * has nothing to synchronise. */
#include "dtrain/engine.h"
#include "dtrain/parallel.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

const dt_strategy dt_strategy_single = { .name = "single" };

/* The registry: a new strategy is one line here (and its extern in engine.h). */
static const dt_strategy *const strategies[] = { &dt_strategy_single, &dt_strategy_ddp, &dt_strategy_zero1, &dt_strategy_zero2,
                                                  &dt_strategy_zero3 };

const dt_strategy *dt_strategy_find(const char *name) {
    for (size_t i = 0; i < sizeof strategies / sizeof strategies[0]; i++)
        if (!strcmp(strategies[i]->name, name)) return strategies[i];
    return NULL;
}

struct dt_engine {
    dt_engine_config cfg;
    const dt_strategy *s;
    void *state;
    dt_optim *opt;
    size_t off, n;   /* this rank's slice */
    /* its runs of the store (one: [off, off + n)); with more (dt_strategy.ranges) the update goes run by run, the
     * optimizer's state holding them side by side in this order */
    const dt_store_range *rg;
    int nrg;
    dt_store_range one;
    double *sums;    /* LAMB/LARS's per-tensor sums, added over the ranks */
    dt_loss_scale_config lsc;
    dt_loss_scale ls;
    int scaling;
    int unscaled;    /* this step's gradients were divided by the scale before its preconditioner (norm_first) */
    float lr;        /* this step's (dt_engine_begin_micro passes it on) */
    dt_codec_config codec; /* the strategy's (cfg.codec points here), completed from the optimizer's settings (take_codec) */
    int zo_sync;     /* 0/1 Adam: this step ends a local interval */
};

static dt_status choose(const dt_engine_config *c, const dt_strategy **out) {
    int ranks = c->comm ? dt_comm_size(c->comm) : 1;
    if (c->strategy_impl) { /* one outside the registry: it says what it cannot run */
        *out = c->strategy_impl;
        return DT_OK;
    }
    const char *name = c->strategy ? c->strategy : ranks > 1 ? "ddp" : "single";
    *out = dt_strategy_find(name);
    if (!*out) return dt_error(DT_ERR_ARG, "no parallel strategy called '%s' (single, ddp, zero1, zero2, zero3)", name);
    if (!strcmp(name, "single") && ranks > 1)
        return dt_error(DT_ERR_ARG, "strategy single runs one process, but the job has %d ranks", ranks);
    return DT_OK;
}

/* LAMB and LARS take per-tensor trust ratios: the table's tensors inside the slice. */
static dt_status make_optimizer(dt_engine *e) {
    const dt_model *m = &e->cfg.model;
    dt_tensor_span *spans = malloc(sizeof *spans * (size_t)(m->ntensors + 1));
    if (!spans) return dt_error(DT_ERR_NOMEM, "engine: out of memory");
    int k = 0;
    for (int i = 0; i < m->ntensors; i++) {
        /* the part of each tensor inside the slice (a shard may cut one; its pieces share the number i), at its place in
         * the optimizer's order; every tensor, even one with no piece here (count 0): the ranks then agree on the number
         * of sums. A tensor lies in one run of a slice. */
        const dt_tensor_info *t = &m->tensors[i];
        spans[k] = (dt_tensor_span){ 0, 0, i, 0, 0, 0 };
        size_t v = 0; /* where run j starts in that order */
        for (int j = 0; j < e->nrg; v += e->rg[j++].n) {
            size_t o = e->rg[j].off, n = e->rg[j].n;
            size_t a = t->offset > o ? t->offset : o, b = t->offset + t->count < o + n ? t->offset + t->count : o + n;
            if (a < b) spans[k] = (dt_tensor_span){ a - o + v, b - a, i, 0, 0, 0 };
        }
        k++;
    }
    dt_status st = dt_optim_create(&e->cfg.opt, e->n, spans, k, &e->opt);
    free(spans);
    size_t ns = st ? 0 : dt_optim_nsums(e->opt);
    if (ns && !(e->sums = malloc(ns * sizeof *e->sums))) st = dt_error(DT_ERR_NOMEM, "engine: out of memory");
    return st;
}

/* A pipeline's last stage ends its store with its copy of the tied wte,
 * whose values the first stage sends after each update: an optimizer that
 * owns the whole store leaves it out (no state, no update for it). ZeRO
 * cuts its shards without it (zero_shards.h); a sharded f32 master keeps
 * it in its own (it gathers its 16-bit copy: updated, then overwritten). */
static void trim_tied_copy(dt_engine *e) {
    const dt_model *m = &e->cfg.model;
    const dt_tensor_info *t = dt_model_tied_tail(m);
    if (t && e->off == 0 && e->n == m->nparams) e->n = t->offset;
}

/* The slice's runs of the store (dt_strategy.ranges); where there are more than one, the update goes run by run:
 * elementwise optimizers (SGD, AdamW), the global norm's sum over the strategy's ranks (clipping, a loss scale's overflow
 * check). */
static dt_status take_ranges(dt_engine *e) {
    int k = e->s->ranges && e->state ? e->s->ranges(e->state, &e->rg) : 0;
    if (k <= 0) {
        e->one = (dt_store_range){ e->off, e->n };
        e->rg = &e->one;
        e->nrg = 1;
        return DT_OK;
    }
    e->nrg = k;
    dt_optim_kind ok = e->cfg.opt.kind;
    /* (LAMB's and LARS's per-tensor sums would add different ranks' experts; a preconditioner reads the whole store) */
    if ((ok != DT_OPT_SGD && ok != DT_OPT_ADAMW) || e->cfg.precond || e->cfg.grad_store != DT_F32)
        return dt_error(DT_ERR_UNSUPPORTED, "strategy %s with experts spread over ranks: SGD or AdamW on f32 gradients without a preconditioner "
                        "(its slice is runs of the store between the experts': %s is not in this build)", e->s->name,
                        e->cfg.precond ? e->cfg.precond->name : e->cfg.grad_store != DT_F32 ? "--grad-store" : dt_optim_kind_name(ok));
    return DT_OK;
}

/* The codec's copy of its settings, completed from the optimizer's. 1-bit Adam takes AdamW's beta1. DGC's momentum
 * correction: SGD's momentum (and Nesterov's form) runs on each rank before sparsification, so the optimizer runs
 * without it (and without the weight decay, which goes into the gradient there); the run's clipping becomes DGC's local
 * clipping, per tensor at --grad-clip / sqrt(ranks). DGC compresses from the first step: a dense step would need the
 * momentum back in the optimizer. */
static dt_status take_codec(dt_engine *e) {
    e->codec = *e->cfg.codec;
    e->cfg.codec = &e->codec;
    dt_optim_config *o = &e->cfg.opt;
    dt_status st = dt_codec_check_optimizer(&e->codec, o->kind, e->cfg.grad_clip, e->cfg.loss_scale != NULL);
    if (st) return st;
    if (e->codec.kind == DT_CODEC_ONEBIT) {
        e->codec.beta1 = o->beta1; /* the momentum travels: Adam's, from its beta1 */
        return DT_OK;
    }
    if ((st = dt_codec_check_strategy(&e->codec, e->s->name))) return st;
    if (e->codec.kind != DT_CODEC_DGC) return DT_OK;
    int ranks = e->cfg.comm ? dt_comm_size(e->cfg.comm) : 1;
    e->codec.momentum = o->momentum, e->codec.nesterov = o->nesterov;
    e->codec.clip = e->cfg.grad_clip > 0 ? e->cfg.grad_clip / sqrtf((float)ranks) : 0;
    e->codec.weight_decay = o->weight_decay;
    o->momentum = 0, o->nesterov = 0, o->weight_decay = 0;
    e->cfg.grad_clip = 0;
    return DT_OK;
}

/* A preconditioner rewrites whole gradients, every one on every rank, before the update (strategy.h). ZeRO-1
 * allreduces them as DDP does (its shard's update then reads the preconditioned ones); ZeRO 2 and 3 keep a shard. A
 * pipeline stage holds its tensors whole (its own layers: the tied copy's gradient goes to the first stage, which
 * owns wte); tensor parallelism holds slices (a preconditioner that takes them makes them whole itself), expert
 * parallelism each rank's own experts (which SOAP and Shampoo step where they are and K-FAC leaves as they are:
 * dt_preconditioner.experts). */
static dt_status check_precond(dt_engine *e) {
    const dt_engine_config *c = &e->cfg;
    bool sliced = false, experts = c->ep > 1 && c->precond->experts; /* a rank's own experts stepped where they are */
    for (int i = 0; i < c->model.ntensors; i++)
        for (int d = 0; d < c->model.tensors[i].ndim && !(experts && c->model.tensors[i].group == DT_GROUP_EXPERT); d++)
            sliced |= c->model.tensors[i].shape[d] != c->model.tensors[i].gshape[d];
    const char *why = strcmp(e->s->name, "single") && strcmp(e->s->name, "ddp") && strcmp(e->s->name, "zero1") ? "a strategy that shards the gradients"
                      : c->ep > 1 && !experts                               ? "expert parallelism (a rank holds its own experts)"
                      : (sliced || (c->mp_comm && !c->schedule && !experts)) && !c->precond->slices ? "tensor parallelism (a rank holds slices)"
                      : c->grad_store != DT_F32                             ? "16-bit gradients (--grad-store)"
                      /* PowerSGD's and top-k's averages are whole gradients; these take over the optimizer's moments */
                      : c->codec && c->codec->kind >= DT_CODEC_DGC          ? "--compress dgc, onebit or zeroone (they take the optimizer's momentum)"
                                                                            : NULL;
    if (why) return dt_error(DT_ERR_ARG, "%s preconditions whole f32 gradients on every rank: not with %s (strategy %s)", c->precond->name, why, e->s->name);
    return DT_OK;
}

int dt_engine_updates_in_backward(const dt_update_facts *f) {
    bool whole_norm = (f->grad_clip > 0 && f->codec != DT_CODEC_DGC) || f->skip_nonfinite;
    /* the norm counts a model-parallel group's slices before any update (a pipeline's tied embedding summed first); the
     * overflow check needs every gradient; a 16-bit store is read after backward; a preconditioner rewrites them all */
    return (f->opt == DT_OPT_SGD || f->opt == DT_OPT_ADAMW) && !whole_norm && !f->step_at_end && !f->model_parallel &&
           !f->loss_scaled && !f->lp_store && !f->precond;
}

dt_status dt_engine_create(const dt_engine_config *c, dt_engine **out) {
    *out = NULL;
    dt_engine *e = calloc(1, sizeof *e);
    if (!e) return dt_error(DT_ERR_NOMEM, "engine: out of memory");
    e->cfg = *c;
    e->off = 0;
    e->n = c->model.nparams;
    dt_status st = choose(c, &e->s);
    if (!st && c->loss_scale) {
        e->scaling = 1;
        e->lsc = *c->loss_scale;
        e->cfg.loss_scale = &e->lsc;
        st = dt_loss_scale_check(&e->lsc, "engine");
        dt_loss_scale_init(&e->ls, &e->lsc);
    }
    if (!st && c->grad_store != DT_F32) {
        /* read after backward, by an optimizer that takes them a chunk at a time */
        if (!e->s->grads_lp) st = dt_error(DT_ERR_ARG, "gradients kept in %s need data parallelism (ddp, zero1, zero2 or zero3): "
                                          "strategy %s keeps them in f32", dt_dtype_name(c->grad_store), e->s->name);
        else if (c->opt.kind != DT_OPT_SGD && c->opt.kind != DT_OPT_ADAMW)
            st = dt_error(DT_ERR_ARG, "gradients kept in %s take SGD or AdamW: %s needs whole f32 tensors for its trust ratios",
                          dt_dtype_name(c->grad_store), dt_optim_kind_name(c->opt.kind));
        else if (c->grad_comm != DT_F32 && c->grad_comm != c->grad_store)
            st = dt_error(DT_ERR_ARG, "gradients kept in %s travel in %s, not %s", dt_dtype_name(c->grad_store),
                          dt_dtype_name(c->grad_store), dt_dtype_name(c->grad_comm));
    }
    if (!st && c->codec && e->s->codec) st = take_codec(e);
    if (!st && c->precond) st = check_precond(e);
    e->cfg.step_at_end = !dt_engine_updates_in_backward(&(dt_update_facts){
        .opt = e->cfg.opt.kind, .codec = c->codec ? c->codec->kind : DT_CODEC_NONE, .grad_clip = c->grad_clip,
        .skip_nonfinite = c->skip_nonfinite, .step_at_end = c->step_at_end, .model_parallel = c->mp_comm || c->schedule,
        .loss_scaled = c->loss_scale != NULL, .lp_store = c->grad_store != DT_F32, .precond = c->precond != NULL });
    if (!st && e->s->create) st = e->s->create(&e->cfg, &e->state, &e->off, &e->n);
    if (!st) trim_tied_copy(e);
    if (!st) st = take_ranges(e);
    if (!st) st = make_optimizer(e);
    if (!st && e->s->attach) st = e->s->attach(e->state, e->opt);
    if (st) { dt_engine_destroy(e); return st; }
    *out = e;
    return DT_OK;
}

void dt_engine_destroy(dt_engine *e) {
    if (!e) return;
    if (e->s && e->s->destroy && e->state) e->s->destroy(e->state);
    dt_optim_destroy(e->opt);
    free(e->sums);
    free(e);
}

/* The norm of n gradients at g, kept in f32 (t DT_F32) or in 16 bits. */
static double norm_of(const void *g, size_t i, size_t n, dt_dtype t) {
    return t == DT_F32 ? dt_grad_norm((const float *)g + i, n) : dt_grad_norm_lp((const uint16_t *)g + i, n, t);
}

/* The sum of squares of the store's [off, off + n) (g its first value)
 * that this rank counts in a model-parallel norm: each tensor's piece on the
 * first rank of its replica group (a split tensor's slice on every rank, a
 * whole one on the first tensor-parallel rank, a K/V head on the first of the
 * ranks that keep it), never a tied copy's (its gradient is summed into the
 * owner's). ep: the expert-parallel ranks whose copies of the shared tensors
 * a strategy's shards part (1: none), so that their replicas count. */
static double counted_sumsq_run(const dt_model *m, const void *g, dt_dtype t, size_t off, size_t n, int ep) {
    double ss = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *ti = &m->tensors[i];
        size_t a = ti->offset > off ? ti->offset : off, b = ti->offset + ti->count < off + n ? ti->offset + ti->count : off + n;
        /* (an expert-parallel rank's copy: replica tp + tp_size x its rank in the group) */
        int replica = ep > 1 && ti->group != DT_GROUP_EXPERT && ti->replicas >= ep ? ti->replica % (ti->replicas / ep) : ti->replica;
        if (a >= b || ti->tied_copy || replica > 0) continue;
        double x = norm_of(g, a - off, b - a, t);
        ss += x * x;
    }
    return ss;
}

/* The expert-parallel ranks whose copies of the shared tensors the strategy's shards part (ZeRO: its sum goes over every
 * data-parallel rank), so that each copy counts its pieces; 1: none. */
static int ep_sharded(const dt_engine *e) { return e->s->reduce_sum && e->cfg.ep > 1 ? e->cfg.ep : 1; }

/* The squares this rank counts of a slice of several runs, in the store (G its gradients). */
static double runs_sumsq(const dt_engine *e, const float *G) {
    double ss = 0;
    for (int j = 0; j < e->nrg; j++) {
        const dt_store_range *x = &e->rg[j];
        double y = e->cfg.mp_comm ? 0 : dt_grad_norm(G + x->off, x->n);
        ss += e->cfg.mp_comm ? counted_sumsq_run(&e->cfg.model, G + x->off, DT_F32, x->off, x->n, ep_sharded(e)) : y * y;
    }
    return ss;
}

/* The norm from this rank's squares ss: summed over the strategy's shards and the model-parallel group. */
static dt_status summed_norm(dt_engine *e, double ss, double *norm) {
    dt_status st = e->s->reduce_sum ? e->s->reduce_sum(e->state, &ss, 1) : DT_OK;
    if (!st && e->cfg.mp_comm) st = dt_comm_allreduce(e->cfg.mp_comm, &ss, &ss, 1, DT_F64, DT_SUM);
    *norm = sqrt(ss);
    return st;
}

/* The global norm of the gradient (this rank's slice at g, of type t): its
 * squares summed over the data-parallel shards when the strategy shards it,
 * and with model parallelism each rank's counted squares over the
 * model-parallel group too (tensor-parallel ranks and pipeline stages). */
static dt_status global_norm(dt_engine *e, const void *g, dt_dtype t, double *norm) {
    if (!e->cfg.mp_comm && !e->s->reduce_sum) { *norm = norm_of(g, 0, e->n, t); return DT_OK; }
    double ss;
    if (e->cfg.mp_comm) ss = counted_sumsq_run(&e->cfg.model, g, t, e->off, e->n, ep_sharded(e));
    else ss = norm_of(g, 0, e->n, t), ss *= ss;
    return summed_norm(e, ss, norm);
}

/* Loss scaling after the global norm of the scaled gradients: an overflow
 * (inf or NaN anywhere: every rank sees the same norm) skips the step, which
 * the scaler may answer by halving the scale (or, at its floor, by ending
 * the run); else the gradients are divided by the scale and clipped in one
 * pass. *skip: the step changes nothing. */
static dt_status unscale(dt_engine *e, dt_step_result *r, int *skip, double *factor) {
    double S = e->ls.scale;
    int overflow = !isfinite(r->norm);
    char msg[200];
    dt_status st = dt_loss_scale_update(&e->ls, &e->lsc, overflow, msg, sizeof msg);
    if (st) return st;
    /* DeepSpeed's words, with the rank ("OVERFLOW! Rank 0 Skipping step. ...") */
    if (msg[0]) dt_log(DT_LOG_WARN, "OVERFLOW! Rank %d %s", e->cfg.comm ? dt_comm_rank(e->cfg.comm) : 0, msg + strlen("OVERFLOW! "));
    *skip = overflow;
    if (overflow) return DT_OK;
    r->norm /= S;
    double f = 1.0 / S;
    if (e->cfg.grad_clip > 0 && e->cfg.grad_clip / (r->norm + 1e-6) < 1) f *= e->cfg.grad_clip / (r->norm + 1e-6);
    *factor = f;
    return DT_OK;
}

/* The update's gradients still carry the loss scale. */
static int scaled(const dt_engine *e) { return e->scaling && !e->unscaled; }

/* The update from 16-bit gradients (the strategy's): the global norm first
 * (the loss scale's overflow check, clipping, skipping), then one pass that
 * widens a chunk, unscales and clips it (one factor) and updates. */
static dt_status update_lp(dt_engine *e, float lr, dt_step_result *r, uint16_t *g, dt_dtype t) {
    const dt_engine_config *c = &e->cfg;
    float *p = c->model.params(c->model.self) + e->off;
    double f = 1;
    dt_status st = global_norm(e, g, t, &r->norm);
    if (st) return st;
    int skip = 0;
    if (scaled(e) && (st = unscale(e, r, &skip, &f))) return st;
    if (skip || (c->skip_nonfinite && !(isfinite(r->loss) && isfinite(r->norm)))) {
        memset(g, 0, e->n * sizeof *g); /* the f32 store holds nothing between steps */
        r->skipped = 1;
        return DT_OK;
    }
    if (!scaled(e) && c->grad_clip > 0 && c->grad_clip / (r->norm + 1e-6) < 1) f = c->grad_clip / (r->norm + 1e-6);
    dt_optim_step_lp(e->opt, p, g, t, (float)f, lr);
    return e->s->after_update ? e->s->after_update(e->state) : DT_OK;
}

/* A slice of several runs (take_ranges): the global norm first, then each run scaled (the loss scale, clipping) and
 * updated where it lies, its state at the run's place in the optimizer's order. */
static dt_status update_runs(dt_engine *e, float lr, float clip, dt_step_result *r) {
    const dt_engine_config *c = &e->cfg;
    float *P = c->model.params(c->model.self), *G = c->model.grads(c->model.self);
    dt_status st = summed_norm(e, runs_sumsq(e, G), &r->norm);
    int skip = 0;
    double f = 1;
    if (!st && scaled(e)) st = unscale(e, r, &skip, &f);
    if (st) return st;
    if (skip || (c->skip_nonfinite && !(isfinite(r->loss) && isfinite(r->norm)))) {
        memset(G, 0, c->model.nparams * sizeof *G); /* the other shards' too */
        r->skipped = 1;
        return DT_OK;
    }
    if (!scaled(e) && clip > 0 && clip / (r->norm + 1e-6) < 1) f = clip / (r->norm + 1e-6); /* (dt_grad_clip's factor) */
    dt_optim_begin(e->opt);
    size_t v = 0;
    for (int j = 0; j < e->nrg; v += e->rg[j++].n) {
        float *g = G + e->rg[j].off;
        if (f != 1.0) dt_grad_scale(g, e->rg[j].n, (float)f);
        dt_optim_update_at(e->opt, P + e->rg[j].off, g, lr, v, e->rg[j].n, 1);
    }
    return e->s->after_update ? e->s->after_update(e->state) : DT_OK;
}

/* The update on this rank's slice, after clipping; a non-finite step is
 * skipped (its gradients zeroed) when the run asks for it, or when the loss
 * scale overflowed. */
static dt_status update(dt_engine *e, float lr, float clip, dt_step_result *r) {
    const dt_engine_config *c = &e->cfg;
    if (e->s->update) return e->s->update(e->state, lr, r); /* the parameters live on a device: it updates them there */
    dt_dtype t;
    uint16_t *g16 = e->s->grads_lp ? e->s->grads_lp(e->state, &t) : NULL;
    if (g16) return update_lp(e, lr, r, g16, t);
    if (e->nrg > 1) return update_runs(e, lr, clip, r);
    float *p = c->model.params(c->model.self) + e->off, *g = c->model.grads(c->model.self) + e->off;
    dt_status st = DT_OK;
    if (c->skip_nonfinite || e->s->reduce_sum || scaled(e) || c->mp_comm) {
        /* the global norm first: it may stop the update, and a sharded slice's own pass could not give it */
        if ((st = global_norm(e, g, DT_F32, &r->norm))) return st;
        int skip = 0;
        double f = 1;
        if (scaled(e) && (st = unscale(e, r, &skip, &f))) return st;
        if (f != 1.0) dt_grad_scale(g, e->n, (float)f);
        if (skip || (c->skip_nonfinite && !(isfinite(r->loss) && isfinite(r->norm)))) {
            /* the whole gradient: a sharded strategy's other shards too */
            memset(c->model.grads(c->model.self), 0, c->model.nparams * sizeof *g);
            r->skipped = 1;
            return DT_OK;
        }
        if (!scaled(e)) dt_grad_clip(g, e->n, r->norm, clip);
        if (e->s->reduce_sum && e->sums) {
            /* LAMB/LARS over a shard: the trust ratios from whole tensors' norms */
            dt_optim_norms(e->opt, p, g, e->sums);
            if ((st = e->s->reduce_sum(e->state, e->sums, dt_optim_nsums(e->opt)))) return st;
            dt_optim_apply(e->opt, p, g, lr, e->sums, 1);
        } else {
            dt_optim_step(e->opt, p, g, lr, 1);
        }
    } else {
        r->norm = dt_optim_step_clipped(e->opt, p, g, lr, clip);
    }
    if (!st && e->s->after_update) st = e->s->after_update(e->state);
    return st;
}

/* The preconditioner on the averaged gradients; a step it skips changes nothing (its gradients zeroed; *skip: a
 * failure's 1, which the step reports, or SOAP's measuring first step's 2). */
static dt_status precondition(dt_engine *e, float lr, dt_step_result *r, int32_t *skip) {
    const dt_engine_config *c = &e->cfg;
    float *g = c->model.grads(c->model.self);
    int32_t any = 0;
    *skip = 0;
    dt_status st = c->precond->apply(c->precond->ctx, g, lr, skip);
    /* a pipeline's stages each precondition their own tensors: one skipping skips them all */
    if (!st && c->schedule && c->mp_comm && !(st = dt_comm_allreduce(c->mp_comm, skip, &any, 1, DT_I32, DT_MAX))) *skip = any;
    if (!st && *skip) {
        memset(g, 0, c->model.nparams * sizeof *g);
        r->skipped = *skip == 1;
    }
    return st;
}

/* Before a preconditioner, over the whole store (each rank's preconditioner reads all of it): the loss scale's
 * overflow check and its division (the gradients' global norm first), and where it takes the gradients as an
 * optimizer does (raw: raw_norm) their finiteness check and clipping too. A step the overflow skips is dropped by the
 * preconditioner (K-FAC's factors keep their finite shares). */
static dt_status norm_first(dt_engine *e, const dt_preconditioner *pc, dt_step_result *r) {
    const dt_engine_config *c = &e->cfg;
    float *g = c->model.grads(c->model.self);
    double S = e->scaling ? e->ls.scale : 1, f = 1; /* (the scale before unscale's update of it) */
    int overflow = 0;
    dt_status st = global_norm(e, g + e->off, DT_F32, &r->norm);
    if (!st && e->scaling) st = unscale(e, r, &overflow, &f); /* (f: 1 / S, times clipping's factor) */
    if (!st && overflow && pc->drop) st = pc->drop(pc->ctx);
    if (st) return st;
    if (overflow || (pc->raw_norm && c->skip_nonfinite && !(isfinite(r->loss) && isfinite(r->norm)))) {
        memset(g, 0, c->model.nparams * sizeof *g);
        r->skipped = 1;
        return DT_OK;
    }
    /* (K-FAC's directions are clipped after it, by the update) */
    if (e->scaling) dt_grad_scale(g, c->model.nparams, (float)(pc->raw_norm ? f : 1 / S));
    else if (pc->raw_norm) dt_grad_clip(g, c->model.nparams, r->norm, c->grad_clip);
    e->unscaled = e->scaling;
    return DT_OK;
}

static void params_changed(dt_engine *e) {
    if (e->cfg.model.params_changed) e->cfg.model.params_changed(e->cfg.model.self);
}

/* What a schedule may ask of the step (strategy.h's dt_step_control): the engine's own functions. */
static void control_begin(void *e, int sync) { dt_engine_begin_micro(e, sync); }
static int control_sharded(void *e) { return dt_engine_params_sharded(e); }
static dt_status control_materialize(void *e, int on) { return dt_engine_materialize(e, on); }

/* The step's start: the weights as the step finds them (a resume, an update: the model's 16-bit copy is made at the
 * step's first forward and kept for its other micro-batches); 1-bit Adam past its warm-up takes the averaged momentum
 * with the variance frozen; the preconditioner told the step's micro-batches. */
static void step_begin(dt_engine *e, int accum, float lr) {
    e->lr = lr;
    params_changed(e);
    dt_codec *onebit = e->codec.kind == DT_CODEC_ONEBIT ? dt_engine_codec(e) : NULL;
    if (onebit) dt_optim_freeze_variance(e->opt, dt_codec_steps(onebit) >= e->codec.start);
    e->unscaled = 0;
    if (e->cfg.precond) e->cfg.precond->begin(e->cfg.precond->ctx, accum, e->scaling ? e->ls.scale : 0);
}

/* The run's 0/1 Adam codec (NULL: another or none). */
static dt_codec *zeroone_codec(dt_engine *e) { return e->codec.kind == DT_CODEC_ZEROONE ? dt_engine_codec(e) : NULL; }

/* 0/1 Adam's step as its plan has it: the optimizer told which (before the step's updates, some inside backward). */
static dt_status zeroone_begin(dt_engine *e, float lr) {
    dt_codec *k = zeroone_codec(e);
    e->zo_sync = 0;
    if (!k) return DT_OK;
    dt_zeroone_step z;
    dt_codec_zeroone_at(&e->codec, (long)dt_codec_steps(k) + 1, &z);
    e->zo_sync = z.sync;
    return dt_optim_zeroone(e->opt, z.local ? DT_ZO_LOCAL : z.variance ? DT_ZO_VARIANCE : DT_ZO_MOMENTUM, lr);
}

/* The schedule's hook once the weights changed (a pipeline's tied copy made the owner's again). */
static dt_status schedule_after_update(dt_engine *e) {
    const dt_step_control control = { control_begin, control_sharded, control_materialize, e };
    return e->cfg.schedule && e->cfg.schedule->after_update ? e->cfg.schedule->after_update(e->cfg.schedule->ctx, &control) : DT_OK;
}

/* A local interval's end: the ranks' accumulations averaged, every rank's weights and momentum made one (under a
 * pipeline the last stage's tied copy too, after the owner's). What it sent in *s (nothing where no local step is
 * pending); *synced whether it ran. */
static dt_status zeroone_end(dt_engine *e, dt_codec_stats *s, bool *synced) {
    dt_codec *k = zeroone_codec(e);
    float *u = k ? dt_optim_zeroone_accum(e->opt) : NULL;
    *synced = u != NULL;
    if (!u) return DT_OK;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "0/1 Adam sync", "\"parameters\":%zu", e->n);
    dt_status st = dt_codec_zeroone_sync(k, u, s);
    if (!st) dt_optim_zeroone_end(e->opt, e->cfg.model.params(e->cfg.model.self) + e->off);
    DT_TRACE_END(DT_TRACK_COMPUTE);
    params_changed(e);
    return st ? st : schedule_after_update(e);
}

dt_status dt_engine_sync_replicas(dt_engine *e) {
    dt_codec_stats s = { 0, 0, 0, 0 };
    bool synced;
    return zeroone_end(e, &s, &synced);
}

/* The step's forward and backward: the schedule's (a pipeline), or the micro-batches in turn, only the last
 * synchronising. The losses' sum in *loss_sum, how many micro-batches computed one in *nloss. */
static dt_status run_micro_batches(dt_engine *e, const dt_step_control *control, int accum, float scale, dt_micro_fn micro,
                                   void *ctx, double *loss_sum, int *nloss) {
    *nloss = accum;
    if (e->cfg.schedule) return e->cfg.schedule->run(e->cfg.schedule->ctx, control, accum, scale, loss_sum, nloss);
    dt_status st = DT_OK;
    for (int k = 0; k < accum && !st; k++) {
        float loss = 0;
        dt_engine_begin_micro(e, k == accum - 1);
        st = micro(ctx, k, scale, &loss);
        *loss_sum += loss;
    }
    return st;
}

/* The strategy's finish (the gradients reduced), then the loss one rank with the global batch would see (the mean
 * over the ranks that computed one) and whether any rank is stopping, in one allreduce; the finish's figures in r. */
static dt_status finish_and_agree(dt_engine *e, double loss_sum, int accum, int nloss, int stop, dt_sync_result *sr,
                                  dt_step_result *r) {
    dt_status st = DT_OK;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "finish gradients", "\"strategy\":\"%s\"", e->s->name);
    if (e->s->finish) st = e->s->finish(e->state, sr);
    DT_TRACE_END(DT_TRACK_COMPUTE);
    dt_comm *lc = e->cfg.loss_comm ? e->cfg.loss_comm : e->cfg.comm;
    float agree[3] = { nloss ? (float)(loss_sum / accum) : 0, nloss ? 1 : 0, (float)stop };
    if (!st && lc && dt_comm_size(lc) > 1) st = dt_comm_allreduce(lc, agree, agree, 3, DT_F32, DT_SUM);
    if (st) return st;
    r->loss = agree[1] > 1 ? agree[0] / agree[1] : agree[0];
    r->stop = agree[2] > 0;
    r->exposed_ms = sr->exposed_ms;
    r->exposed_in_backward_ms = sr->exposed_in_backward_ms;
    r->updated_in_backward = sr->updated_in_backward;
    r->grad_bytes = sr->grad_bytes;
    r->compress_ratio = sr->compress_ratio;
    r->grad_recv_bytes = sr->grad_recv_bytes;
    return DT_OK;
}

/* The preconditioner's step, timed: its own time and what its observer took inside forward and backward. */
static dt_status timed_precondition(dt_engine *e, float lr, dt_step_result *r, int32_t *skip) {
    const dt_preconditioner *pc = e->cfg.precond;
    double p0 = dt_time_now(), fwd = 0, bwd = 0;
    DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "precondition", "\"parameters\":%zu", e->n);
    dt_status st = precondition(e, lr, r, skip);
    DT_TRACE_END(DT_TRACK_COMPUTE);
    if (st) return st;
    if (pc->inside) pc->inside(pc->ctx, &fwd, &bwd);
    r->precondition_in_forward_ms = fwd * 1e3, r->precondition_in_backward_ms = bwd * 1e3;
    r->precondition_ms = (dt_time_now() - p0 + fwd + bwd) * 1e3;
    return DT_OK;
}

dt_status dt_engine_step(dt_engine *e, int accum, float lr, dt_micro_fn micro, void *ctx, int stop, dt_step_result *r) {
    memset(r, 0, sizeof *r);
    r->loss_scale = e->scaling ? e->ls.scale : 1;
    step_begin(e, accum, lr);
    dt_status st = zeroone_begin(e, lr);
    if (st) return st;
    const dt_step_control control = { control_begin, control_sharded, control_materialize, e };
    double loss_sum = 0;
    int nloss;
    st = run_micro_batches(e, &control, accum, (float)(r->loss_scale / accum), micro, ctx, &loss_sum, &nloss);
    double t0 = dt_time_now();
    dt_sync_result sr = { .norm = -1 };
    if (st || (st = finish_and_agree(e, loss_sum, accum, nloss, stop, &sr, r))) return st;
    const dt_preconditioner *pc = sr.updated ? NULL : e->cfg.precond;
    bool raw = pc && pc->raw_norm;
    int32_t skip = 0;
    if ((raw || (pc && e->scaling)) && (st = norm_first(e, pc, r))) return st;
    if (pc && !r->skipped && (st = timed_precondition(e, lr, r, &skip))) return st;
    if (sr.updated) r->norm = sr.norm;
    else if (!r->skipped && !skip) {
        double norm = r->norm;
        DT_TRACE_BEGIN(DT_TRACK_COMPUTE, "optimizer", "\"parameters\":%zu", e->n);
        st = update(e, lr, raw ? 0 : e->cfg.grad_clip, r);
        DT_TRACE_END(DT_TRACK_COMPUTE);
        if (raw) r->norm = norm; /* the gradients', not the directions' */
    }
    bool synced = false;
    if (!st && e->zo_sync) { /* the step sent nothing but this, and waits for it whole */
        dt_codec_stats s = { 0, 0, 0, 0 };
        double t1 = dt_time_now();
        st = zeroone_end(e, &s, &synced);
        r->exposed_ms += (dt_time_now() - t1) * 1e3;
        r->grad_bytes = s.bytes, r->compress_ratio = s.after ? (double)s.before / (double)s.after : 0;
    }
    if (!st && !synced && !r->skipped && !skip) st = schedule_after_update(e);
    params_changed(e); /* for an evaluation before the next step */
    r->update_ms = (dt_time_now() - t0) * 1e3 - (r->exposed_ms - r->exposed_in_backward_ms);
    return st;
}

void dt_engine_begin_micro(dt_engine *e, int sync) {
    if (e->s->begin) e->s->begin(e->state, sync, e->lr);
}

const dt_engine_config *dt_engine_get_config(const dt_engine *e) { return &e->cfg; }
const char *dt_engine_strategy_name(const dt_engine *e) { return e->s->name; }
dt_optim *dt_engine_optim(dt_engine *e) { return e->opt; }

dt_codec *dt_engine_codec(dt_engine *e) { return e->s->codec ? e->s->codec(e->state) : NULL; }
dt_loss_scale *dt_engine_loss_scale(dt_engine *e) { return e->scaling ? &e->ls : NULL; }

void dt_engine_share(const dt_engine *e, size_t *off, size_t *n) {
    *off = e->off;
    *n = e->n;
}

int dt_engine_runs(const dt_engine *e, const dt_store_range **out) {
    *out = e->rg;
    return e->nrg;
}


size_t dt_engine_buffer_bytes(const dt_engine *e) { return e->s->buffer_bytes ? e->s->buffer_bytes(e->state) : 0; }

void dt_engine_held(const dt_engine *e, size_t *params, size_t *grads) {
    *params = *grads = e->cfg.model.nparams * sizeof(float);
    if (e->s->held) e->s->held(e->state, params, grads);
}

dt_status dt_engine_materialize(dt_engine *e, int on) { return e->s->materialize ? e->s->materialize(e->state, on) : DT_OK; }
int dt_engine_params_sharded(const dt_engine *e) { return e->s->params_sharded ? e->s->params_sharded(e->state) : 0; }

dt_status dt_engine_check_replicas(dt_engine *e, int *checked, uint64_t *hash) {
    *checked = e->s->check_replicas != NULL;
    *hash = 0;
    return e->s->check_replicas ? e->s->check_replicas(e->state, hash) : DT_OK;
}
