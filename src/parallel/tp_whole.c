/* A tensor-parallel group's tensors made whole on each of its ranks (parallel.h's dt_tp_whole): what a
 * preconditioner of whole matrices (K-FAC, Shampoo) sees in place of a rank's slices. Each rank learns every rank's
 * slice of every tensor once (an allgather of their descriptions); a step's gradients are then allgathered tensor by
 * tensor and each rank's runs put where the whole tensor has them, and the preconditioned whole store hands each rank
 * its slices back. A Linear's observed values are made whole the same way: a row-parallel Linear's inputs (a rank
 * sees its columns) and a column-parallel one's output gradients (its parts' columns), summed where several ranks
 * keep the same K/V head (each holds its own query heads' part of that head's gradient, as one process sums them). */
#include "dtrain/parallel.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    int layer, op, split; /* split: DT_SPLIT_ROW (its inputs are made whole), COLUMN (its output gradients), NONE */
    int width;            /* that side's width whole */
    int *local, *at;      /* [ranks]: rank r's width of it, and where its places start in place */
    int *place;           /* where each rank's value c lands among the whole side's, rank after rank */
} tp_linear;

struct dt_tp_whole {
    dt_model m;                 /* the rank's model (its slices) */
    dt_comm *tp;                /* its own communicator over the group (its collectives run inside forward and backward) */
    int ranks, rank, n;
    dt_tensor_info *whole;      /* [n]: each tensor whole, at its place in the whole store */
    dt_tensor_info *slices;     /* [ranks][n]: each rank's slice of each, offset 0 (for placing its piece) */
    size_t floats, most;        /* the whole store's floats; the largest tensor's slices together */
    size_t base;                /* where the whole store starts in the whole model's (a pipeline stage's first tensor) */
    size_t *counts;             /* [ranks]: an allgather's counts (slices need not be even: a vocabulary 3 ranks split) */
    float *store, *recv;        /* the whole gradients; an allgather's pieces */
    size_t recv_floats;
    dt_linear_layer *layers;    /* the whole Linears (their tensors the whole ones) */
    tp_linear *lin;
    int nlin;
    float *values;              /* an event's whole values */
    size_t values_floats;
    dt_linear_observer fn;      /* the observer of the whole Linears */
    void *fn_ctx;
    dt_preconditioner inner;    /* the preconditioner of the whole tensors */
};

/* ---- the tensors ---- */

/* What a rank says of each tensor: its slice and its shape. */
enum { DESC = 9 };
static void describe(const dt_tensor_info *t, int32_t *d) {
    const dt_tensor_slice *s = &t->slice;
    int32_t x[DESC] = { s->dim, s->offset, s->count, s->pieces, s->stride, t->shape[0], t->shape[1], t->shape[2], t->shape[3] };
    memcpy(d, x, sizeof x);
}

static dt_status learn_slices(dt_tp_whole *w) {
    int32_t *mine = malloc(sizeof(int32_t) * DESC * (size_t)w->n + 1), *all = malloc(sizeof(int32_t) * DESC * (size_t)w->n * w->ranks + 1);
    w->whole = calloc((size_t)w->n + 1, sizeof *w->whole);
    w->slices = calloc((size_t)w->n * w->ranks + 1, sizeof *w->slices);
    dt_status st = mine && all && w->whole && w->slices ? DT_OK : dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    for (int i = 0; i < w->n && !st; i++) describe(&w->m.tensors[i], mine + DESC * i);
    if (!st) st = dt_comm_allgather(w->tp, mine, all, DESC * (size_t)w->n, DT_I32);
    for (int r = 0; r < w->ranks && !st; r++)
        for (int i = 0; i < w->n && !st; i++) {
            const int32_t *d = all + DESC * ((size_t)r * w->n + i);
            dt_tensor_info *t = &w->slices[(size_t)r * w->n + i];
            *t = w->m.tensors[i];
            t->slice = (dt_tensor_slice){ d[0], d[1], d[2], d[3], d[4] };
            t->count = 1;
            for (int k = 0; k < t->ndim; k++) t->count *= (size_t)(t->shape[k] = d[5 + k]);
            t->offset = 0;
        }
    /* a pipeline stage's tensors from its first on (its copy of the tied table aside: the first stage's, not made whole) */
    w->base = SIZE_MAX;
    for (int i = 0; i < w->n; i++)
        if (!w->m.tensors[i].tied_copy && w->m.tensors[i].count && w->m.tensors[i].goffset < w->base) w->base = w->m.tensors[i].goffset;
    if (w->base == SIZE_MAX) w->base = 0;
    for (int i = 0; i < w->n && !st; i++) {
        dt_tensor_info *t = &w->whole[i];
        *t = w->m.tensors[i];
        t->count = t->ndim ? 1 : 0;
        for (int k = 0; k < t->ndim; k++) t->count *= (size_t)(t->shape[k] = t->gshape[k]);
        if (t->tied_copy) t->count = 0;
        t->offset = t->count ? t->goffset - w->base : 0;
        if (t->group == DT_GROUP_EXPERT && t->count) { /* expert parallelism's own experts: the same on every rank of the
                                                        * group, kept as this rank holds them, where they sit in the whole */
            *t = w->m.tensors[i];
            t->offset = t->goffset - w->base + (size_t)t->slice.offset * (t->count / (size_t)t->shape[0]);
        } else {
            dt_tensor_set_whole(t);
        }
        t->split = DT_SPLIT_NONE, t->replicas = 0, t->replica = 0;
        if (t->offset + t->count > w->floats) w->floats = t->offset + t->count;
        size_t all = 0;
        for (int r = 0; r < w->ranks; r++) all += w->slices[(size_t)r * w->n + i].count;
        if (all > w->most) w->most = all;
    }
    free(mine), free(all);
    return st;
}

typedef struct { float *to; const float *from; size_t base; int back; } placing;
static void place_run(size_t lo, size_t go, size_t n, void *ctx) {
    placing *x = ctx;
    if (x->back) memcpy(x->to + lo, x->from + go - x->base, n * sizeof(float));
    else memcpy(x->to + go - x->base, x->from + lo, n * sizeof(float));
}

/* Rank r's piece (from) of tensor i into its whole tensor's place in to. */
static void put_piece(const dt_tp_whole *w, int r, int i, const float *from, float *to) {
    dt_tensor_info t = w->slices[(size_t)r * w->n + i];
    t.goffset = w->whole[i].offset;
    dt_model one = { .tensors = &t, .ntensors = 1, .nparams = t.count };
    dt_model_global_runs(&one, 0, t.count, place_run, &(placing){ to, from, 0, 0 });
}

dt_status dt_tp_whole_gather(dt_tp_whole *w, const float *local, float *whole) {
    for (int i = 0; i < w->n; i++) {
        const dt_tensor_info *t = &w->m.tensors[i];
        if (!t->count || t->tied_copy) continue;
        if (!dt_tensor_is_sliced(t) || t->group == DT_GROUP_EXPERT) { /* whole here, or a rank's own experts */
            memcpy(whole + w->whole[i].offset, local + t->offset, t->count * sizeof(float));
            continue;
        }
        for (int r = 0; r < w->ranks; r++) w->counts[r] = w->slices[(size_t)r * w->n + i].count;
        dt_status st = dt_comm_allgatherv(w->tp, local + t->offset, w->recv, w->counts, DT_F32);
        const float *piece = w->recv;
        for (int r = 0; r < w->ranks && !st; piece += w->counts[r], r++) put_piece(w, r, i, piece, whole);
        if (st) return st;
    }
    return DT_OK;
}

void dt_tp_whole_scatter(const dt_tp_whole *w, const float *whole, float *local) {
    for (int i = 0; i < w->n; i++) {
        const dt_tensor_info *t = &w->m.tensors[i];
        if (t->count && !t->tied_copy) dt_model_global_runs(&w->m, t->offset, t->count, place_run, &(placing){ local, whole, w->base, 1 });
    }
}

/* ---- the Linears ---- */

static int tensor_index(const dt_tp_whole *w, const dt_tensor_info *t) { return t ? (int)(t - w->m.tensors) : -1; }

/* Linear y's whole form, and where each rank's values of its split side land. */
static dt_status whole_linear(dt_tp_whole *w, const dt_linear_layer *y, dt_linear_layer *out, tp_linear *l) {
    *out = *y;
    int w0 = tensor_index(w, y->w[0]);
    dt_tp_split split = y->w[0]->split;
    *l = (tp_linear){ y->layer, y->op, split == DT_SPLIT_ROW || split == DT_SPLIT_COLUMN ? (int)split : DT_SPLIT_NONE, 0, NULL, NULL, NULL };
    if (split == DT_SPLIT_ROW) out->in = w->whole[w0].shape[1];
    for (int j = 0; j < y->nparts; j++) {
        out->w[j] = &w->whole[tensor_index(w, y->w[j])];
        out->b[j] = y->b[j] ? &w->whole[tensor_index(w, y->b[j])] : NULL;
        if (l->split == DT_SPLIT_COLUMN) l->width += out->w[j]->shape[0];
    }
    if (l->split == DT_SPLIT_ROW) l->width = out->in;
    if (l->split == DT_SPLIT_NONE) return DT_OK;
    int parts = l->split == DT_SPLIT_COLUMN ? y->nparts : 1, all = 0;
    if (!(l->local = calloc((size_t)w->ranks, sizeof *l->local)) || !(l->at = calloc((size_t)w->ranks, sizeof *l->at)))
        return dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    for (int r = 0; r < w->ranks; r++)
        for (int j = 0; j < parts; j++) {
            const dt_tensor_info *t = &w->slices[(size_t)r * w->n + tensor_index(w, y->w[j])];
            l->local[r] += t->shape[l->split == DT_SPLIT_ROW ? 1 : 0];
        }
    for (int r = 0; r < w->ranks; r++) l->at[r] = all, all += l->local[r];
    if (!(l->place = malloc(sizeof(int) * ((size_t)all + 1)))) return dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    for (int r = 0; r < w->ranks; r++) {
        int *p = l->place + l->at[r], at = 0, col0 = 0;
        for (int j = 0; j < parts; j++) {
            const dt_tensor_info *t = &w->slices[(size_t)r * w->n + tensor_index(w, y->w[j])];
            size_t in = (size_t)t->gshape[1];
            if (l->split == DT_SPLIT_ROW)
                for (int c = 0; c < t->shape[1]; c++) p[at++] = (int)dt_tensor_global_index(t, (size_t)c);
            else
                for (int c = 0; c < t->shape[0]; c++) p[at++] = col0 + (int)(dt_tensor_global_index(t, (size_t)c * t->shape[1]) / in);
            col0 += t->gshape[0];
        }
    }
    return DT_OK;
}

static dt_status take_linears(dt_tp_whole *w) {
    if (!w->m.linears) return DT_OK;
    dt_linear_layer *y = NULL;
    int n = 0;
    dt_status st = w->m.linears(w->m.self, &y, &n);
    if (!st && (!(w->layers = calloc((size_t)n + 1, sizeof *w->layers)) || !(w->lin = calloc((size_t)n + 1, sizeof *w->lin))))
        st = dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    for (int i = 0; i < n && !st; i++, w->nlin++) st = whole_linear(w, &y[i], &w->layers[i], &w->lin[i]);
    free(y);
    return st;
}

/* An event's values made whole: every rank's rows x its width gathered, placed (summed: a K/V head several ranks keep
 * has its gradient in parts) into rows x width. NULL: a collective failed (said). */
static const float *whole_values(dt_tp_whole *w, const tp_linear *l, const dt_linear_event *e) {
    size_t got = 0, need = e->rows * (size_t)l->width;
    for (int r = 0; r < w->ranks; r++) got += w->counts[r] = e->rows * (size_t)l->local[r];
    float *pieces = got > w->recv_floats ? realloc(w->recv, got * sizeof(float)) : w->recv;
    if (pieces) w->recv = pieces, w->recv_floats = got > w->recv_floats ? got : w->recv_floats;
    float *vals = pieces && need > w->values_floats ? realloc(w->values, need * sizeof(float)) : w->values;
    if (vals) w->values = vals, w->values_floats = need > w->values_floats ? need : w->values_floats;
    if (!pieces || !vals) {
        dt_log(DT_LOG_ERROR, "tensor parallelism: no memory for a Linear's whole values (%zu floats)", got + need);
        return NULL;
    }
    dt_status st = dt_comm_allgatherv(w->tp, e->values, w->recv, w->counts, DT_F32);
    if (st) {
        dt_log(DT_LOG_ERROR, "tensor parallelism: a Linear's values made whole: %s", dt_last_error());
        return NULL;
    }
    memset(w->values, 0, need * sizeof(float));
    const float *from = w->recv;
    for (int r = 0; r < w->ranks; from += w->counts[r], r++) {
        const int *p = l->place + l->at[r];
        int lw = l->local[r];
        for (size_t i = 0; i < e->rows; i++)
            for (int c = 0; c < lw; c++) w->values[i * l->width + (size_t)p[c]] += from[i * (size_t)lw + c];
    }
    return w->values;
}

static void observer(void *ctx, const dt_linear_event *e) {
    dt_tp_whole *w = ctx;
    const tp_linear *l = NULL;
    for (int i = 0; i < w->nlin && !l; i++)
        if (w->lin[i].layer == e->layer && w->lin[i].op == e->op) l = &w->lin[i];
    dt_linear_event x = *e;
    if (l && ((l->split == DT_SPLIT_ROW && !e->backward) || (l->split == DT_SPLIT_COLUMN && e->backward))) {
        if (!(x.values = whole_values(w, l, e))) return;
        x.width = l->width;
    }
    if (w->fn) w->fn(w->fn_ctx, &x);
}

/* ---- the whole model as a preconditioner sees it ---- */

static dt_status view_linears(void *self, dt_linear_layer **out, int *n) {
    dt_tp_whole *w = self;
    *out = malloc(sizeof **out * ((size_t)w->nlin + 1)), *n = 0;
    if (!*out) return dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    memcpy(*out, w->layers, sizeof **out * (size_t)w->nlin);
    *n = w->nlin;
    return DT_OK;
}

static void view_observer(void *self, dt_linear_observer fn, void *ctx) {
    dt_tp_whole *w = self;
    w->fn = fn, w->fn_ctx = ctx;
    if (w->m.set_linear_observer) w->m.set_linear_observer(w->m.self, fn ? observer : NULL, fn ? w : NULL);
}

void dt_tp_whole_model(dt_tp_whole *w, dt_model *out) {
    *out = (dt_model){ .self = w, .kind = w->m.kind, .tensors = w->whole, .ntensors = w->n, .nunits = w->m.nunits, .nparams = w->floats,
                       .linears = w->m.linears ? view_linears : NULL, .set_linear_observer = w->m.set_linear_observer ? view_observer : NULL };
}

dt_status dt_tp_whole_create(const dt_model *m, dt_comm *tp, dt_tp_whole **out) {
    *out = NULL;
    dt_tp_whole *w = calloc(1, sizeof *w);
    if (!w) return dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory");
    w->m = *m, w->n = m->ntensors;
    dt_status st = dt_comm_split(tp, 0, dt_comm_rank(tp), &w->tp);
    if (!st) w->ranks = dt_comm_size(w->tp), w->rank = dt_comm_rank(w->tp), st = learn_slices(w);
    if (!st) {
        w->recv_floats = w->most;
        w->store = calloc(w->floats + 1, sizeof(float));
        w->recv = malloc((w->recv_floats + 1) * sizeof(float));
        w->counts = calloc((size_t)w->ranks, sizeof *w->counts);
        if (!w->store || !w->recv || !w->counts) st = dt_error(DT_ERR_NOMEM, "tensor parallelism's whole tensors: out of memory (%zu floats)", w->floats);
    }
    if (!st) st = take_linears(w);
    if (st) {
        dt_tp_whole_destroy(w);
        return st;
    }
    *out = w;
    return DT_OK;
}

void dt_tp_whole_destroy(dt_tp_whole *w) {
    if (!w) return;
    for (int i = 0; i < w->nlin; i++) free(w->lin[i].place), free(w->lin[i].local), free(w->lin[i].at);
    free(w->counts);
    free(w->lin), free(w->layers);
    free(w->whole), free(w->slices), free(w->store), free(w->recv), free(w->values);
    if (w->tp) dt_comm_destroy(w->tp);
    free(w);
}

/* ---- a preconditioner of whole tensors over the slices ---- */

static void wrap_begin(void *ctx, int accum, double loss_scale) {
    dt_tp_whole *w = ctx;
    w->inner.begin(w->inner.ctx, accum, loss_scale);
}

static dt_status wrap_drop(void *ctx) {
    dt_tp_whole *w = ctx;
    return w->inner.drop ? w->inner.drop(w->inner.ctx) : DT_OK;
}

static dt_status wrap_apply(void *ctx, float *grads, float lr, int *skip) {
    dt_tp_whole *w = ctx;
    dt_status st = dt_tp_whole_gather(w, grads, w->store);
    if (!st) st = w->inner.apply(w->inner.ctx, w->store, lr, skip);
    if (!st && !*skip) dt_tp_whole_scatter(w, w->store, grads);
    return st;
}

static void wrap_inside(void *ctx, double *fwd, double *bwd) {
    dt_tp_whole *w = ctx;
    *fwd = *bwd = 0;
    if (w->inner.inside) w->inner.inside(w->inner.ctx, fwd, bwd);
}

void dt_tp_whole_preconditioner(dt_tp_whole *w, const dt_preconditioner *inner, dt_preconditioner *out) {
    w->inner = *inner;
    *out = (dt_preconditioner){ inner->name, wrap_begin, wrap_apply, w, inner->state, wrap_inside, .slices = 1, .raw_norm = inner->raw_norm, .experts = inner->experts,
                                .drop = inner->drop ? wrap_drop : NULL };
    out->state.copy = w->rank != 0; /* the group's ranks hold the same state: its first saves it */
}
