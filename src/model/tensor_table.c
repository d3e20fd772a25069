/* Queries over a model's tensor table, and the moves of its stores, whatever the model. */
#include "dtrain/model.h"

#include <stdio.h>
#include <string.h>

size_t dt_tensor_global_index(const dt_tensor_info *t, size_t j) {
    const dt_tensor_slice *s = &t->slice;
    /* local coordinates of j, then the slice's dimension moved to the global position */
    size_t inner = 1;
    for (int d = s->dim + 1; d < t->ndim; d++) inner *= (size_t)t->shape[d];
    size_t outer = j / (inner * (size_t)t->shape[s->dim]), k = j / inner % (size_t)t->shape[s->dim], in = j % inner;
    size_t piece = k / (size_t)s->count, g = (size_t)s->offset + piece * (size_t)s->stride + k % (size_t)s->count;
    return (outer * (size_t)t->gshape[s->dim] + g) * inner + in;
}

void dt_tensor_set_whole(dt_tensor_info *t) {
    for (int d = 0; d < 4; d++) t->gshape[d] = d < t->ndim ? t->shape[d] : 0;
    t->slice = (dt_tensor_slice){ 0, 0, t->shape[0], 1, t->shape[0] };
    t->goffset = t->offset;
}

size_t dt_model_global_params(const dt_model *m) { return m->global_params ? m->global_params : m->nparams; }

void dt_model_global_runs(const dt_model *m, size_t off, size_t count, void (*fn)(size_t lo, size_t go, size_t n, void *ctx),
                          void *ctx) {
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        size_t a = t->offset > off ? t->offset : off, b = t->offset + t->count < off + count ? t->offset + t->count : off + count;
        /* runs of the slice's dimension: consecutive local elements stay consecutive globally up to a run's end */
        size_t run = (size_t)t->slice.count;
        for (int d = t->slice.dim + 1; d < t->ndim; d++) run *= (size_t)t->shape[d];
        for (size_t j = a - t->offset; a < b && j < b - t->offset;) {
            size_t left = run - j % run, n = left < b - t->offset - j ? left : b - t->offset - j;
            fn(t->offset + j, t->goffset + dt_tensor_global_index(t, j), n, ctx);
            j += n;
        }
    }
}

typedef struct { float *to; const float *from; } slice_copy;
static void copy_run(size_t lo, size_t go, size_t n, void *ctx) {
    slice_copy *x = ctx;
    memcpy(x->to + lo, x->from + go, n * sizeof(float));
}

void dt_model_copy_slices(const dt_model *m, float *to, const float *whole) {
    dt_model_global_runs(m, 0, m->nparams, copy_run, &(slice_copy){ to, whole });
}

bool dt_tensor_is_sliced(const dt_tensor_info *t) { return t->slice.count * t->slice.pieces != t->gshape[t->slice.dim]; }

int dt_tensor_hf_pieces(const dt_tensor_info *t) { return t->stacked ? t->shape[0] : 1; }

void dt_tensor_hf_piece(const dt_tensor_info *t, int k, char *name, size_t cap, int *ndim, int *dims, size_t *at) {
    int s = t->stacked != 0;
    if (s) snprintf(name, cap, t->hf, k + t->slice.offset); /* "%d": the expert's number in the whole model */
    else snprintf(name, cap, "%s", t->hf);
    *ndim = t->ndim - s;
    for (int d = 0; d < 4; d++) dims[d] = d + s < 4 ? t->shape[d + s] : 0;
    *at = s ? (size_t)k * (size_t)t->shape[1] * (size_t)t->shape[2] : 0;
}

const dt_tensor_info *dt_model_find(const dt_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
}

const dt_tensor_info *dt_model_tied_tail(const dt_model *m) {
    const dt_tensor_info *t = m->ntensors ? &m->tensors[m->ntensors - 1] : NULL;
    return t && t->tied_copy && t->count && t->offset + t->count == m->nparams ? t : NULL;
}

/* The store is unit-major, so units [a, b) are one range: from the first
 * tensor of unit a to the end of the last tensor of unit b-1. */
void dt_model_unit_range(const dt_model *m, int a, int b, size_t *off, size_t *count) {
    size_t lo = m->nparams, hi = 0;
    for (int i = 0; i < m->ntensors; i++) {
        const dt_tensor_info *t = &m->tensors[i];
        if (t->unit < a || t->unit >= b) continue;
        if (t->offset < lo) lo = t->offset;
        if (t->offset + t->count > hi) hi = t->offset + t->count;
    }
    *off = lo < hi ? lo : 0;
    *count = lo < hi ? hi - lo : 0;
}

float *dt_model_param_storage(float *own, float *now, float *to, size_t n) {
    float *p = to ? to : own;
    if (p == now) return now;
    if (!to) memcpy(p, now, n * sizeof(float));
    else dt_mem_release(own, n * sizeof(float));
    return p;
}

float *dt_model_grad_storage(float *own, float *now, float *to, size_t n) {
    /* Gradients do not move with their storage: a strategy attaches its store (zero, and kept sparse: never
     * pre-faulted) before the first backward, and detaches after the last step. Copying them would fault in
     * the whole store, and at the end the whole of own: 3 GB a rank at 774M, for values nobody reads. */
    float *g = to ? to : own;
    if (g == own && now != own) dt_mem_release(own, n * sizeof(float)); /* back to zero pages, none touched */
    return g;
}
