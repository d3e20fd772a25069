/* Queries over a model's tensor table, and the moves of its stores, whatever the model. */
#include "dtrain/model.h"

#include <string.h>

const dt_tensor_info *dt_model_find(const dt_model *m, const char *name) {
    for (int i = 0; i < m->ntensors; i++)
        if (!strcmp(m->tensors[i].name, name)) return &m->tensors[i];
    return NULL;
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
